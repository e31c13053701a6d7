//! The iptables side of masq: rendering the exact rules upstream writes (so users can compare,
//! fall back and migrate), applying them the upstream way for the iptables backend, and taking
//! over from upstream's chain for the eBPF backend.

pub mod apply;
pub mod render;
pub mod take_over;
