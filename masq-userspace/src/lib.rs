//! The masq control plane: ip-masq-agent compatible configuration, the policy derived from it,
//! the iptables rendering, and the management of the eBPF datapath.

pub mod agent;
pub mod config;
pub mod datapath;
pub mod ipsec;
pub mod iptables;
pub mod node;
pub mod policy;
pub mod ports;
mod sys;
