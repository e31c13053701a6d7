//! The eBPF datapath: the embedded object, its maps, pinning and the pinned state's lifecycle,
//! attaching, keeping the maps in line with the policy, collecting expired flows, reading the
//! maps at once for what shows them, the clsact plumbing of the legacy attach mode, and what the
//! kernel says about tcx attachments.

pub mod attach;
mod batch;
pub mod crowded_remotes;
pub mod error;
pub mod flows;
pub mod gc;
pub mod lifecycle;
pub mod maps;
pub mod netfilter_flows;
pub mod object;
pub mod pins;
pub mod snapshot;
pub mod sync;
pub mod tcx;

pub use error::DatapathError;

/// The clsact qdisc and its filters, over rtnetlink.
pub use crate::sys::tc as tc_netlink;

/// The `bpf(2)` system call with `command` and its attribute `attr`, for the commands aya does
/// not wrap (batch and take on hash maps, tcx queries and link info).
pub(crate) fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<()> {
    // SAFETY: `attr` is a live, exclusively borrowed `#[repr(C)]` attribute of the layout the
    // command expects, and its size is passed along; pointers inside it refer to buffers that
    // outlive the call.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            std::ptr::from_mut(attr),
            size_of::<T>(),
        )
    };
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
