//! The iptables side of masq: rendering the exact rules upstream writes (so users can compare,
//! fall back and migrate) and applying them the upstream way for the iptables backend.

pub mod apply;
pub mod render;
