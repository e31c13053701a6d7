//! masq end to end: the real `masq agent` (or the image under podman) on a node in network
//! namespaces, pods behind it, a router and an outside host, and real traffic between them.
//! Needs root.
//!
//! One module an area, each runnable alone by its prefix (`cargo test -p masq-testbed --test
//! e2e -- nat::`):
//!
//! * [`datapath`]: real traffic through both attach modes, offloads on and off, path MTU, ports;
//! * [`ipv6`]: a dual-stack node;
//! * [`rules`]: masquerade exceptions and exempt sources under both backends;
//! * [`nat`]: NAT state under pressure: a full table, ports per remote;
//! * [`conntrack`]: where masq must behave as conntrack and MASQUERADE do;
//! * [`checksum_complete`]: `CHECKSUM_COMPLETE` packets keep a right sum;
//! * [`uplinks`]: more than one uplink, and uplinks that come and go;
//! * [`hooks`]: masq beside another program on its hooks;
//! * [`ipsec`]: XFRM policies that masq bypasses, reported;
//! * [`lifecycle`]: config updates, restarts, uninstall, the iptables backend;
//! * [`robustness`]: kills, clashes and bad input;
//! * [`container`]: the image as the DaemonSets run it (needs podman and the image).

mod checksum_complete;
mod conntrack;
mod container;
mod datapath;
mod hooks;
mod ipsec;
mod ipv6;
mod lifecycle;
mod nat;
mod robustness;
mod rules;
mod uplinks;
