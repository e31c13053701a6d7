//! The eBPF datapath: the embedded object, its maps, pinning and the pinned state's lifecycle,
//! attaching, keeping the maps in line with the policy, collecting expired flows, reading the
//! maps at once for what shows them, and the clsact plumbing of the legacy attach mode. The
//! `bpf(2)` commands aya does not wrap are in `crate::sys::bpf`.

pub mod attach;
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

pub use error::DatapathError;

/// The clsact qdisc and its filters, over rtnetlink.
pub use crate::sys::tc as tc_netlink;
