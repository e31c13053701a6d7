//! The node the agent runs on, where masq touches it outside its own datapath and pins: the
//! interfaces traffic leaves by (and their changes), the uplinks masq translates on and how
//! they follow their addresses, the ports the node's own sockets may take, and the memory the
//! NAT table is sized from.

pub mod conntrack;
pub mod interfaces;
pub mod kernel;
pub mod memory;
pub mod renumbering;
pub mod reserved_ports;
pub mod timeouts;
pub mod uplinks;
