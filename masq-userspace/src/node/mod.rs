//! The node the agent runs on, where masq touches it outside its own datapath and pins: the
//! interfaces traffic leaves by, the uplinks masq translates on and how they follow their
//! addresses, the ports the node's own sockets may take, the memory the NAT table is sized from,
//! and the flows netfilter translates. These modules decide; what they ask of the kernel, and
//! change in it, goes through [`crate::sys`].

pub mod conntrack;
pub mod interfaces;
pub mod kernel;
pub mod memory;
pub mod renumbering;
pub mod reserved_ports;
pub mod timeouts;
pub mod uplinks;
