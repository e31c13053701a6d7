//! What the kernel says about tcx attachments, asked without CAP_SYS_ADMIN.
//!
//! aya answers "which programs run on this hook" by opening every program by id
//! (`BPF_PROG_GET_FD_BY_ID`), which needs CAP_SYS_ADMIN even when CAP_BPF is held; the
//! DaemonSet does not grant it. Both questions the agent has can be answered from objects it
//! already holds: a link's own info (`BPF_OBJ_GET_INFO_BY_FD` on the pinned link) tells which
//! program it runs and on which interface, and `BPF_PROG_QUERY` (CAP_NET_ADMIN) lists the ids
//! of everything attached to a hook.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use super::{bpf, pins::Hook};

/// `bpf(2)` commands used here (`include/uapi/linux/bpf.h`).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_PROG_QUERY: libc::c_long = 16;
/// `enum bpf_attach_type` values of the tcx hooks.
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;

/// The tcx attach type of `hook`.
const fn attach_type(hook: Hook) -> u32 {
    match hook {
        Hook::Ingress => BPF_TCX_INGRESS,
        Hook::Egress => BPF_TCX_EGRESS,
    }
}

/// What a tcx link is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcxLinkInfo {
    /// The link's id.
    pub link_id: u32,
    /// The program the link runs.
    pub program_id: u32,
    /// The interface, or 0 when the interface is gone and the link is defunct.
    pub ifindex: u32,
    /// Which hook, when attached.
    pub hook: Option<Hook>,
}

/// `struct bpf_link_info` as far as a tcx link fills it: the common header, then the tcx
/// member of the union, which starts at offset 16 (the union holds 64-bit members).
#[repr(C)]
#[derive(Default)]
struct RawLinkInfo {
    link_type: u32,
    id: u32,
    prog_id: u32,
    padding: u32,
    ifindex: u32,
    attach_type: u32,
    /// Room for the rest of the union, which the kernel zero-fills for a tcx link.
    rest: [u64; 6],
}

/// The attribute of `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The attribute of `BPF_PROG_QUERY`, up to the fields this call uses.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_ifindex: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_count: u32,
    padding: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The attachment of the tcx link `link`.
pub fn link_info(link: BorrowedFd<'_>) -> io::Result<TcxLinkInfo> {
    let mut info = RawLinkInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(link.as_raw_fd()).map_err(io::Error::other)?,
        info_len: u32::try_from(size_of::<RawLinkInfo>()).map_err(io::Error::other)?,
        info: std::ptr::from_mut(&mut info) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let hook = match info.attach_type {
        BPF_TCX_INGRESS => Some(Hook::Ingress),
        BPF_TCX_EGRESS => Some(Hook::Egress),
        _ => None,
    };
    Ok(TcxLinkInfo {
        link_id: info.id,
        program_id: info.prog_id,
        ifindex: info.ifindex,
        hook,
    })
}

/// The ids of the programs attached to `hook` of interface `ifindex` through tcx, in the order
/// they run. Empty when the kernel has no tcx.
pub fn attached_program_ids(ifindex: u32, hook: Hook) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_ifindex: ifindex,
            attach_type: attach_type(hook),
            prog_ids: ids.as_mut_ptr() as u64,
            prog_count: u32::try_from(ids.len()).map_err(io::Error::other)?,
            ..QueryAttr::default()
        };
        match bpf(BPF_PROG_QUERY, &mut attr) {
            Ok(()) => {
                ids.truncate(attr.prog_count as usize);
                return Ok(ids);
            }
            // More programs than room: the kernel said how many there are.
            Err(error)
                if error.raw_os_error() == Some(libc::ENOSPC)
                    && attr.prog_count as usize > ids.len() =>
            {
                ids.resize(attr.prog_count as usize, 0);
            }
            // A kernel without tcx does not know the attach type.
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => return Ok(Vec::new()),
            Err(error) => return Err(error),
        }
    }
}

/// The attribute of `BPF_OBJ_GET`.
#[repr(C)]
struct ObjGetAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Opens the object pinned at `path` (`BPF_OBJ_GET`: only bpffs file permissions are checked).
pub fn open_pinned(path: &std::path::Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::{fd::FromRawFd as _, unix::ffi::OsStrExt as _};
    const BPF_OBJ_GET: libc::c_long = 7;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = ObjGetAttr {
        pathname: path.as_ptr() as u64,
        bpf_fd: 0,
        file_flags: 0,
    };
    // SAFETY: as in `bpf`; `path` outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET,
            std::ptr::from_mut(&mut attr),
            size_of::<ObjGetAttr>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(io::Error::other)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}
