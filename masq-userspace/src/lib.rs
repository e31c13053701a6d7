//! The masq control plane: ip-masq-agent compatible configuration, the policy derived from it,
//! the iptables rendering, and the management of the eBPF datapath.
//!
//! The crate's interfaces to the kernel (netlink, the `bpf(2)` commands aya does not wrap,
//! ioctls, sysctls, inotify) are in `sys`, and so is every `unsafe` block: the rest of the
//! crate may not have any.

#![deny(unsafe_code)]

pub mod agent;
pub mod causes;
pub mod config;
pub mod datapath;
pub mod ipsec;
pub mod iptables;
pub mod node;
pub mod policy;
pub mod ports;
mod sys;
