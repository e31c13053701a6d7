//! The node the agent runs on, where masq touches it outside its own datapath and pins: the
//! interfaces traffic leaves by (and their changes), and the ports the node's own sockets may
//! take.

pub mod interfaces;
pub mod reserved_ports;
