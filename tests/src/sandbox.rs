//! A small cluster in namespaces:
//!
//! ```text
//!  pod1 10.244.1.2 ─┐                                         outside 198.51.100.10
//!  pod2 10.244.2.2 ─┼─ node (masq on up0, 192.0.2.1) ── router ── (and 10.200.0.10, an
//!  ...              ┘          192.0.2.0/24         198.51.100.0/24  in-cluster peer)
//! ```
//!
//! The router's link to the outside can have a smaller MTU, for path MTU discovery tests. The
//! receivers (pods, outside) verify every checksum in software (`rx` offload off); with
//! [`Offload::On`] the senders hand out `CHECKSUM_PARTIAL` packets that cross masq before a
//! device without offload finalizes them, so masq's pseudo-header updates are checked too.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::netns::{Netns, unique_tag};

/// The node's uplink address: what masqueraded traffic leaves with.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The router on the node's link.
pub const ROUTER_NODE_SIDE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 254);
/// The router on the outside link.
pub const ROUTER_OUTSIDE_SIDE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 254);
/// The outside host (a masqueraded destination).
pub const OUTSIDE_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
/// A host inside a default non-masquerade range (10.0.0.0/8), e.g. another node's pod.
pub const CLUSTER_PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 10);
/// The node's uplink interface.
pub const UPLINK: &str = "up0";
/// The node's second uplink, with [`SandboxOptions::second_uplink`].
pub const SECOND_UPLINK: &str = "up1";
/// The second uplink's address: what traffic leaving by it is masqueraded to.
pub const SECOND_NODE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// The gateway behind the second uplink.
pub const SECOND_GATEWAY: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 126);
/// A host reached through the second uplink (routed via [`SECOND_GATEWAY`]).
pub const SECOND_OUTSIDE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 200);

/// The node's global IPv6 address on its uplink, with [`Sandbox::add_ipv6`]: what masqueraded
/// IPv6 traffic leaves with.
pub const NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
/// The router on the node's link, over IPv6.
pub const ROUTER_NODE_SIDE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xfe);
/// The router on the outside link, over IPv6.
pub const ROUTER_OUTSIDE_SIDE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 0xfe);
/// The outside host's IPv6 address (a masqueraded destination).
pub const OUTSIDE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1);
/// A second IPv6 address of the outside host, in 2001:db8:ee::/64: a network a config can list
/// as non-masquerade.
pub const EXEMPTABLE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xee, 0, 0, 0, 0, 0x10);
/// The pods' IPv6 networks, one /64 each, as the router routes them to the node.
pub const PODS_IPV6_NETWORK: &str = "2001:db8:244::/48";

/// The IPv6 address of pod `index` (1-based), with [`Sandbox::add_ipv6`].
pub fn pod_ipv6(index: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        0xdb8,
        0x244,
        u16::try_from(index).unwrap_or(u16::MAX),
        0,
        0,
        0,
        2,
    )
}

/// Checksum offload on the veths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// Senders offload (`CHECKSUM_PARTIAL` through masq); the hop after masq finalizes.
    On,
    /// Every checksum is computed in software at every hop.
    Off,
}

/// How the agent in the sandbox attaches its programs (`--attach-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Pinned tcx links.
    Tcx,
    /// A clsact qdisc with direct-action filters, as on kernels before 6.6.
    Tc,
}

impl AttachMode {
    /// The flag value.
    pub const fn flag(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Tc => "tc",
        }
    }
}

/// How to build the sandbox.
#[derive(Clone, Copy, Debug)]
pub struct SandboxOptions {
    /// How the agent attaches.
    pub attach_mode: AttachMode,
    /// Number of pods.
    pub pods: usize,
    /// Checksum offload mode.
    pub offload: Offload,
    /// MTU of the router's side of its link to the outside host.
    pub outside_mtu: u16,
    /// A second uplink `up1` (203.0.113.1/25) towards a second network, whose host
    /// 203.0.113.200 lies behind the gateway 203.0.113.126: a multi-NIC node.
    pub second_uplink: bool,
}

impl SandboxOptions {
    /// The defaults, with the agent attaching in `attach_mode`.
    pub fn in_mode(attach_mode: AttachMode) -> Self {
        Self {
            attach_mode,
            ..Self::default()
        }
    }
}

impl AttachMode {
    /// What `--attach-mode auto` uses on the running kernel: tcx from Linux 6.6, tc before. The
    /// sandboxes of tests that do not name a mode use it, so they also run in the kernel
    /// matrix's older guests.
    pub fn native() -> Self {
        match masq::datapath::attach::AttachMode::best_for_kernel() {
            masq::datapath::attach::AttachMode::Tcx => Self::Tcx,
            masq::datapath::attach::AttachMode::Tc => Self::Tc,
        }
    }
}

impl Default for SandboxOptions {
    fn default() -> Self {
        Self {
            attach_mode: AttachMode::native(),
            pods: 2,
            offload: Offload::On,
            outside_mtu: 1500,
            second_uplink: false,
        }
    }
}

/// The namespaces of one sandbox; all are deleted when it is dropped.
#[derive(Debug)]
pub struct Sandbox {
    /// Unique prefix of every namespace name.
    pub tag: String,
    /// How the agent attaches.
    pub attach_mode: AttachMode,
    /// The pods, pod `i` at index `i - 1`.
    pub pods: Vec<Netns>,
    /// The node running masq.
    pub node: Netns,
    /// The router between the node and the outside.
    pub router: Netns,
    /// The outside host and the in-cluster peer.
    pub outside: Netns,
    /// The gateway and host behind the second uplink, when there is one.
    pub second_outside: Option<Netns>,
}

/// The address of pod `index` (1-based).
pub fn pod_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, u8::try_from(index).unwrap_or(u8::MAX), 2)
}

fn offload(netns: &Netns, device: &str, tx: bool, rx: bool) {
    let state = |on: bool| if on { "on" } else { "off" };
    netns.exec("ethtool", &["-K", device, "tx", state(tx), "rx", state(rx)]);
}

/// The node's uplink `up0` to the router's `eth0`, both addressed, with the node's default route
/// and the router's route back to the pods.
pub fn link_node_to_router(node: &Netns, router: &Netns) {
    node.add_veth(UPLINK, router, "eth0");
    node.ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", UPLINK]);
    node.ip(&["link", "set", UPLINK, "up"]);
    node.ip(&[
        "route",
        "add",
        "default",
        "via",
        &ROUTER_NODE_SIDE.to_string(),
    ]);
    router.ip(&[
        "addr",
        "add",
        &format!("{ROUTER_NODE_SIDE}/24"),
        "dev",
        "eth0",
    ]);
    router.ip(&["link", "set", "eth0", "up"]);
    router.ip(&["route", "add", "10.244.0.0/16", "via", &NODE_IP.to_string()]);
}

/// The node's route to the host behind the second uplink's gateway (added, or put back after
/// the uplink went down or was renumbered).
pub fn route_second_network(node: &Netns) {
    node.ip(&[
        "route",
        "replace",
        "203.0.113.128/25",
        "via",
        &SECOND_GATEWAY.to_string(),
        "dev",
        SECOND_UPLINK,
    ]);
}

/// `up1` on the node, linked to a namespace that is both the gateway 203.0.113.126 and, behind
/// it, the host 203.0.113.200. The node reaches that host by a route via the gateway, as a
/// multi-NIC node reaches a second network.
///
/// Its interface index is past masq's array of uplink slots, as an interface added to a
/// long-running node can be, so the datapath finds it in the hash instead.
fn add_second_uplink(tag: &str, node: &Netns, offload_on: bool) -> Netns {
    let outside = Netns::new(&format!("{tag}-out2"));
    node.add_veth_at(
        SECOND_UPLINK,
        Some(masq_common::layout::UPLINK_INDEX_SLOTS + 904),
        &outside,
        "eth0",
    );
    node.ip(&[
        "addr",
        "add",
        &format!("{SECOND_NODE_IP}/25"),
        "dev",
        SECOND_UPLINK,
    ]);
    node.ip(&["link", "set", SECOND_UPLINK, "up"]);
    route_second_network(node);
    offload(node, SECOND_UPLINK, offload_on, offload_on);
    outside.ip(&[
        "addr",
        "add",
        &format!("{SECOND_GATEWAY}/25"),
        "dev",
        "eth0",
    ]);
    outside.ip(&[
        "addr",
        "add",
        &format!("{SECOND_OUTSIDE_IP}/32"),
        "dev",
        "lo",
    ]);
    outside.ip(&["link", "set", "eth0", "up"]);
    offload(&outside, "eth0", false, offload_on);
    outside
}

impl Sandbox {
    /// Builds the topology; `prefix` names it (keep it short).
    pub fn new(prefix: &str, options: SandboxOptions) -> Self {
        crate::netns::require_root();
        let tag = unique_tag(prefix);
        let node = Netns::new(&format!("{tag}-node"));
        let router = Netns::new(&format!("{tag}-rtr"));
        let outside = Netns::new(&format!("{tag}-out"));
        let pods: Vec<Netns> = (1..=options.pods)
            .map(|index| Netns::new(&format!("{tag}-pod{index}")))
            .collect();
        let offload_on = options.offload == Offload::On;

        for (index, pod) in pods.iter().enumerate() {
            let index = index + 1;
            let node_side = format!("vpod{index}");
            node.add_veth(&node_side, pod, "eth0");
            let subnet_gateway = format!("10.244.{index}.1");
            pod.ip(&[
                "addr",
                "add",
                &format!("{}/24", pod_ip(index)),
                "dev",
                "eth0",
            ]);
            pod.ip(&["link", "set", "eth0", "up"]);
            pod.ip(&["route", "add", "default", "via", &subnet_gateway]);
            node.ip(&[
                "addr",
                "add",
                &format!("{subnet_gateway}/24"),
                "dev",
                &node_side,
            ]);
            node.ip(&["link", "set", &node_side, "up"]);
            // Pods send with offload (or not) and verify what they receive; the node's side
            // finalizes checksums towards them.
            offload(pod, "eth0", offload_on, false);
            offload(&node, &node_side, false, offload_on);
        }

        link_node_to_router(&node, &router);
        node.sysctl("net.ipv4.ip_forward", "1");
        offload(&node, UPLINK, offload_on, offload_on);

        router.add_veth("eth1", &outside, "eth0");
        router.ip(&[
            "addr",
            "add",
            &format!("{ROUTER_OUTSIDE_SIDE}/24"),
            "dev",
            "eth1",
        ]);
        router.ip(&[
            "link",
            "set",
            "eth1",
            "mtu",
            &options.outside_mtu.to_string(),
            "up",
        ]);
        router.ip(&[
            "route",
            "add",
            &format!("{CLUSTER_PEER_IP}/32"),
            "via",
            &OUTSIDE_IP.to_string(),
        ]);
        router.sysctl("net.ipv4.ip_forward", "1");
        offload(&router, "eth0", offload_on, offload_on);
        // Towards the outside host checksums are always finalized here, after masq.
        offload(&router, "eth1", false, offload_on);

        outside.ip(&["addr", "add", &format!("{OUTSIDE_IP}/24"), "dev", "eth0"]);
        outside.ip(&[
            "addr",
            "add",
            &format!("{CLUSTER_PEER_IP}/32"),
            "dev",
            "eth0",
        ]);
        // The outside host keeps a 1500-byte MTU, so it advertises a full-size MSS and the pods
        // must learn the smaller path MTU from the router.
        outside.ip(&["link", "set", "eth0", "up"]);
        outside.ip(&[
            "route",
            "add",
            "default",
            "via",
            &ROUTER_OUTSIDE_SIDE.to_string(),
        ]);
        offload(&outside, "eth0", offload_on, false);

        let second_outside = options
            .second_uplink
            .then(|| add_second_uplink(&tag, &node, offload_on));

        Self {
            second_outside,
            tag,
            attach_mode: options.attach_mode,
            pods,
            node,
            router,
            outside,
        }
    }

    /// Makes the sandbox dual-stack: every pod, the node, the router and the outside host get
    /// IPv6 addresses (documentation ranges, 2001:db8::/32) and routes mirroring the IPv4 ones.
    /// Addresses skip duplicate address detection (`nodad`), so none is tentative, and router
    /// advertisements are ignored everywhere, so no namespace configures itself behind the
    /// test's back.
    pub fn add_ipv6(&self) {
        let quiet = |netns: &Netns| {
            for scope in ["all", "default"] {
                netns.sysctl(&format!("net.ipv6.conf.{scope}.accept_ra"), "0");
                netns.sysctl(&format!("net.ipv6.conf.{scope}.disable_ipv6"), "0");
            }
        };
        let address = |netns: &Netns, address: String, device: &str| {
            netns.ip(&["-6", "addr", "add", &address, "dev", device, "nodad"]);
        };
        for (index, pod) in self.pods.iter().enumerate() {
            let index = index + 1;
            quiet(pod);
            let gateway = Ipv6Addr::new(
                0x2001,
                0xdb8,
                0x244,
                u16::try_from(index).unwrap_or(u16::MAX),
                0,
                0,
                0,
                1,
            );
            address(pod, format!("{}/64", pod_ipv6(index)), "eth0");
            pod.ip(&["-6", "route", "add", "default", "via", &gateway.to_string()]);
            address(&self.node, format!("{gateway}/64"), &format!("vpod{index}"));
        }
        for netns in [&self.node, &self.router, &self.outside] {
            quiet(netns);
        }
        self.node.sysctl("net.ipv6.conf.all.forwarding", "1");
        self.router.sysctl("net.ipv6.conf.all.forwarding", "1");
        self.add_node_ipv6();
        address(&self.router, format!("{ROUTER_NODE_SIDE_IPV6}/64"), "eth0");
        address(
            &self.router,
            format!("{ROUTER_OUTSIDE_SIDE_IPV6}/64"),
            "eth1",
        );
        self.router.ip(&[
            "-6",
            "route",
            "add",
            PODS_IPV6_NETWORK,
            "via",
            &NODE_IPV6.to_string(),
        ]);
        self.router.ip(&[
            "-6",
            "route",
            "add",
            "2001:db8:ee::/64",
            "via",
            &OUTSIDE_IPV6.to_string(),
        ]);
        address(&self.outside, format!("{OUTSIDE_IPV6}/64"), "eth0");
        address(&self.outside, format!("{EXEMPTABLE_IPV6}/128"), "lo");
        self.outside.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &ROUTER_OUTSIDE_SIDE_IPV6.to_string(),
        ]);
    }

    /// Gives the node's uplink its global IPv6 address and the node its IPv6 default route
    /// (again, after a test took them away).
    pub fn add_node_ipv6(&self) {
        self.node.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{NODE_IPV6}/64"),
            "dev",
            UPLINK,
            "nodad",
        ]);
        self.node.ip(&[
            "-6",
            "route",
            "replace",
            "default",
            "via",
            &ROUTER_NODE_SIDE_IPV6.to_string(),
            "dev",
            UPLINK,
        ]);
    }

    /// Pod `index` (1-based).
    pub fn pod(&self, index: usize) -> &Netns {
        &self.pods[index - 1]
    }

    /// Checksum errors the pods and the outside host counted while verifying what they got.
    pub fn checksum_errors(&self) -> Vec<(String, String, u64)> {
        let mut errors = Vec::new();
        for netns in self
            .pods
            .iter()
            .chain([&self.outside])
            .chain(self.second_outside.as_ref())
        {
            for (name, value) in netns.nstat() {
                if (name.ends_with("CsumErrors") || name == "IpInHdrErrors") && value > 0 {
                    errors.push((netns.name().to_owned(), name, value));
                }
            }
        }
        errors
    }
}

impl Sandbox {
    /// Takes the node's IPv4 address off its uplink, after [`Sandbox::add_ipv6`]: the node of an
    /// IPv6-only cluster (EKS IPv6, kind with `ipFamily: ipv6`), whose uplink has only a global
    /// IPv6 address and an IPv6 default route. The IPv4 default route goes with the address.
    pub fn remove_node_ipv4(&self) {
        self.node
            .ip(&["addr", "del", &format!("{NODE_IP}/24"), "dev", UPLINK]);
    }
}

/// The second uplink's global IPv6 address, with [`Sandbox::add_second_uplink_ipv6`].
pub const SECOND_NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 1);
/// The gateway behind the second uplink, over IPv6.
pub const SECOND_GATEWAY_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x7e);
/// The host behind the second uplink's gateway, over IPv6 (routed via
/// [`SECOND_GATEWAY_IPV6`]).
pub const SECOND_OUTSIDE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0x80, 0, 0, 0, 0xc8);

impl Sandbox {
    /// After [`Sandbox::add_ipv6`], makes the second uplink dual-stack too: `up1` gets
    /// [`SECOND_NODE_IPV6`], the namespace behind it is the gateway [`SECOND_GATEWAY_IPV6`] and
    /// the host [`SECOND_OUTSIDE_IPV6`], which the node reaches by a route via that gateway, as
    /// in IPv4. Addresses skip duplicate address detection and router advertisements are
    /// ignored, as in [`Sandbox::add_ipv6`].
    pub fn add_second_uplink_ipv6(&self) {
        let Some(second) = &self.second_outside else {
            panic!("the sandbox has no second uplink (SandboxOptions::second_uplink)");
        };
        for scope in ["all", "default"] {
            second.sysctl(&format!("net.ipv6.conf.{scope}.accept_ra"), "0");
            second.sysctl(&format!("net.ipv6.conf.{scope}.disable_ipv6"), "0");
        }
        self.node.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{SECOND_NODE_IPV6}/64"),
            "dev",
            SECOND_UPLINK,
            "nodad",
        ]);
        second.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{SECOND_GATEWAY_IPV6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        second.ip(&[
            "-6",
            "addr",
            "add",
            &format!("{SECOND_OUTSIDE_IPV6}/128"),
            "dev",
            "lo",
        ]);
        self.node.ip(&[
            "-6",
            "route",
            "replace",
            "2001:db8:2:80::/64",
            "via",
            &SECOND_GATEWAY_IPV6.to_string(),
            "dev",
            SECOND_UPLINK,
        ]);
    }
}
