//! Where masq meets the kernel: one module for each of its interfaces, so that a reader knows
//! where to look and what to audit. The rest of the crate decides what to ask and what to
//! change; these modules know how.
//!
//! * [`netlink`]: requests and their answers, framed and read once for every family:
//!   [`tc`] (the clsact qdisc and its filters), [`route`] (routes, and the kernel's choice of
//!   a source), [`xfrm`] (IPsec policies) and [`conntrack`] (netfilter's connections).
//! * [`bpf`]: the `bpf(2)` commands aya does not wrap.

pub(crate) mod bpf;
pub(crate) mod conntrack;
pub(crate) mod netlink;
pub(crate) mod route;
pub mod tc;
pub(crate) mod xfrm;
