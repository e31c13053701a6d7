//! The datapath on its own, without an agent: crafted frames through `BPF_PROG_TEST_RUN`, with
//! rewritten frames, map state and every checksum checked from scratch, and the programs
//! attached to a veth the way the legacy attach mode does. Needs root (loads eBPF programs).
//!
//! One module a suite, each runnable alone by its prefix (`cargo test -p masq-testbed --test
//! datapath -- ipv6::`):
//!
//! * [`ipv4`]: IPv4 translation, and what both families share (tries, the collector, pins);
//! * [`ipv6`]: IPv6 translation;
//! * [`fuzz`]: random and mutated frames against an oracle;
//! * [`tc_netlink`]: the clsact plumbing of the legacy attach mode.

mod fuzz;
mod ipv4;
mod ipv6;
mod tc_netlink;
