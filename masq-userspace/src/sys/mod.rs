//! Where masq meets the kernel: one module for each of its interfaces, so that a reader knows
//! where to look and what to audit. The rest of the crate decides what to ask and what to
//! change; these modules know how.
//!
//! * [`netlink`]: requests and their answers, framed and read once for every family:
//!   [`tc`] (the clsact qdisc and its filters), [`route`] (routes, and the kernel's choice of
//!   a source), [`xfrm`] (IPsec policies) and [`conntrack`] (netfilter's connections);
//!   [`interface_watch`] listens to rtnetlink's announcements of changes.
//! * [`bpf`]: the `bpf(2)` commands aya does not wrap.
//! * [`link`]: the interfaces, their addresses, link types and drivers.
//! * [`sysctl`], [`memory`], [`clock`]: the kernel's settings, the node's memory, the time.
//! * [`inotify`]: changes in a directory; [`async_fd`]: waiting for a descriptor in tokio.

pub(crate) mod async_fd;
pub(crate) mod bpf;
pub(crate) mod clock;
pub(crate) mod conntrack;
pub(crate) mod inotify;
pub(crate) mod interface_watch;
pub(crate) mod link;
pub(crate) mod memory;
pub(crate) mod netlink;
pub(crate) mod route;
pub(crate) mod sysctl;
pub mod tc;
pub(crate) mod xfrm;
