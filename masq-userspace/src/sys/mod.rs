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
//! * [`sysctl`], [`memory`], [`clock`]: the kernel's settings, the node's memory and the
//!   process's memlock limit, the time.
//! * [`fs`]: which filesystem a file is on, what is mounted where, and directory locks.
//! * [`inotify`]: changes in a directory; [`async_fd`]: waiting for a descriptor in tokio.
//!
//! Every `unsafe` block of the crate is in the modules marked below, each with its `SAFETY`
//! comment; the crate root denies them everywhere else.

#[expect(
    unsafe_code,
    reason = "registering a descriptor with tokio's reactor is unsafe; the trait it takes is too"
)]
pub(crate) mod async_fd;
#[expect(
    unsafe_code,
    reason = "the bpf(2) system call with attributes pointing into our buffers"
)]
pub(crate) mod bpf;
pub(crate) mod clock;
pub(crate) mod conntrack;
pub(crate) mod fs;
#[expect(
    unsafe_code,
    reason = "vouches to the reactor for the descriptor of the inotify instance"
)]
pub(crate) mod inotify;
pub(crate) mod interface_watch;
#[expect(
    unsafe_code,
    reason = "socket(2) and the interface ioctls, with C structs and unions"
)]
pub(crate) mod link;
#[expect(unsafe_code, reason = "sysinfo(2) fills a C struct")]
pub(crate) mod memory;
pub(crate) mod netlink;
pub(crate) mod route;
pub(crate) mod sysctl;
pub mod tc;
pub(crate) mod xfrm;
