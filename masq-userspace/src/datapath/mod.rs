//! The eBPF datapath: the embedded object, its maps, pinning, attaching, keeping the maps in
//! line with the policy, collecting expired flows, the clsact plumbing of the legacy
//! attach mode, and what the kernel says about tcx attachments.

pub mod attach;
mod batch;
pub mod error;
pub mod flows;
pub mod gc;
pub mod maps;
pub mod object;
pub mod pins;
pub mod sync;
pub mod tc_netlink;
pub mod tcx;

pub use error::DatapathError;
