//! IPsec policies that MASQUERADE would have honoured and masq cannot: the rule.
//!
//! The kernel looks a forwarded packet's XFRM output policy up at routing, with the pod's
//! source address, before tc egress. iptables' MASQUERADE looks it up again after the SNAT
//! (`nf_xfrm_me_harder`), so a policy that selects the node's address protects masqueraded pod
//! traffic there. masq translates at tc egress, after the only lookup: traffic such a policy
//! would have protected leaves in clear text (or, for a block policy, is not dropped).
//!
//! A policy is reported ("bypassed") when all of these hold:
//!
//! 1. it is an output policy (`dir out`) that protects or blocks (it has templates, or its
//!    action is block: an allow policy without templates passes traffic in clear, as no
//!    policy does), and it is not bound to an XFRM interface (`if_id`: such a policy sees
//!    only traffic routed into that interface, which is not an uplink);
//! 2. **after translation it matches**: its source network holds the SNAT address of an
//!    uplink of its family (of the uplink its selector names, if it names one), and its
//!    destination network is not entirely inside the non-masquerade networks of that family
//!    (the trie's entries, link-local included): some destination it selects is masqueraded;
//! 3. **before translation it does not**: its source network does not hold every network the
//!    node routes directly to local pods (routes without a gateway on interfaces that are not
//!    uplinks or loopback: a pod bridge's subnet, a veth's /32). The pods' addresses are not
//!    known otherwise; a pod outside the source network sends traffic the first lookup
//!    misses. When the node routes no pod network of that family, only a source network of
//!    the whole family (`/0`) is sure to hold the pods.
//!
//! Protocol, ports and marks never rule a policy out: MASQUERADE translates every protocol,
//! destination ports and marks are the same before and after translation (so the selector
//! takes the same share of pod traffic either way), and the translated source port is chosen
//! per flow. Priorities are not compared either: a policy shadowed by a higher-priority one
//! is still reported, erring on the loud side.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

pub use crate::sys::xfrm::{XfrmError, XfrmPolicy};
use crate::sys::{
    route::{self, Route},
    xfrm::{self, ACTION_BLOCK, DIR_OUT},
};

/// An interface masq translates on, with the addresses its traffic is masqueraded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnatUplink {
    /// The interface.
    pub name: String,
    /// Its index (0 when unknown: a selector bound to an interface then never names it).
    pub ifindex: u32,
    /// The IPv4 SNAT address, if IPv4 is translated on it.
    pub ipv4: Option<Ipv4Addr>,
    /// The IPv6 SNAT address, if IPv6 is translated on it (`--enable-ipv6`).
    pub ipv6: Option<Ipv6Addr>,
}

/// What masq translates, as far as policies are concerned.
#[derive(Clone, Debug, Default)]
pub struct Translation {
    /// The uplinks and their SNAT addresses.
    pub uplinks: Vec<SnatUplink>,
    /// Destinations not masqueraded (the trie's entries, link-local included), both families.
    pub nomasq: Vec<IpNet>,
    /// The networks the node routes directly to local pods, both families.
    pub pod_networks: Vec<IpNet>,
}

/// A policy that selects masqueraded traffic only after translation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bypass {
    /// The policy.
    pub policy: XfrmPolicy,
    /// The uplink whose SNAT address it selects.
    pub uplink: String,
    /// That address.
    pub snat: IpAddr,
}

impl Bypass {
    /// `ipv4` or `ipv6`.
    pub const fn family(&self) -> &'static str {
        match self.snat {
            IpAddr::V4(_) => "ipv4",
            IpAddr::V6(_) => "ipv6",
        }
    }

    /// One line for logs and `masq status`.
    pub fn describe(&self) -> String {
        format!(
            "{} selects {} ({}) only after translation",
            describe_policy(&self.policy),
            self.snat,
            self.uplink
        )
    }
}

/// The policy as the operator would recognise it next to `ip xfrm policy`'s listing.
fn describe_policy(policy: &XfrmPolicy) -> String {
    let mut text = format!("src {} dst {}", policy.source, policy.destination);
    if policy.protocol != 0 {
        text.push_str(&format!(" proto {}", policy.protocol));
    }
    if policy.source_port.1 != 0 {
        text.push_str(&format!(" sport {}", policy.source_port.0));
    }
    if policy.destination_port.1 != 0 {
        text.push_str(&format!(" dport {}", policy.destination_port.0));
    }
    if let Some((value, mask)) = policy.mark {
        text.push_str(&format!(" mark {value:#x}/{mask:#x}"));
    }
    text.push_str(&format!(
        " dir out {} (index {}, priority {})",
        if policy.action == ACTION_BLOCK {
            "block"
        } else {
            "with IPsec"
        },
        policy.index,
        policy.priority
    ));
    text
}

/// The policies among `policies` that select masqueraded traffic only after translation.
pub fn bypassed(policies: &[XfrmPolicy], translation: &Translation) -> Vec<Bypass> {
    policies
        .iter()
        .filter(|policy| policy.direction == DIR_OUT && policy.protects() && policy.if_id == 0)
        .filter_map(|policy| {
            let (uplink, snat) = translation.uplinks.iter().find_map(|uplink| {
                if policy.ifindex != 0 && i64::from(policy.ifindex) != i64::from(uplink.ifindex) {
                    return None;
                }
                let snat = match policy.source {
                    IpNet::V4(_) => IpAddr::V4(uplink.ipv4?),
                    IpNet::V6(_) => IpAddr::V6(uplink.ipv6?),
                };
                policy.source.contains(&snat).then_some((uplink, snat))
            })?;
            let masqueraded = !covered(&policy.destination, &translation.nomasq);
            let pods: Vec<&IpNet> = translation
                .pod_networks
                .iter()
                .filter(|pods| same_family(pods, &policy.source))
                .collect();
            let selects_pods = if pods.is_empty() {
                policy.source.prefix_len() == 0
            } else {
                pods.iter().all(|pods| policy.source.contains(*pods))
            };
            (masqueraded && !selects_pods).then(|| Bypass {
                policy: policy.clone(),
                uplink: uplink.name.clone(),
                snat,
            })
        })
        .collect()
}

/// Reads the node's policies and pod routes and applies [`bypassed`]. Only the policies are
/// required: a route table that cannot be read counts as no pod network, the loud side.
/// `nomasq` gives the exempt networks (see [`exempt_networks`]); it is called only when the node
/// has policies, which it mostly has not, so a 10,000-CIDR config costs nothing here then.
pub fn check(
    uplinks: Vec<SnatUplink>,
    nomasq: impl FnOnce() -> Vec<IpNet>,
) -> Result<Vec<Bypass>, XfrmError> {
    let policies = xfrm::policies()?;
    if policies.is_empty() {
        return Ok(Vec::new());
    }
    let names: BTreeSet<&str> = uplinks.iter().map(|uplink| uplink.name.as_str()).collect();
    let mut pods = route::ipv4_routes()
        .map(|routes| pod_networks(routes, &names))
        .unwrap_or_default();
    pods.extend(
        route::ipv6_routes()
            .map(|routes| pod_networks(routes, &names))
            .unwrap_or_default(),
    );
    Ok(bypassed(
        &policies,
        &Translation {
            uplinks,
            nomasq: nomasq(),
            pod_networks: pods,
        },
    ))
}

/// The networks the trie keeps unmasqueraded, from its entries `(network, NOMASQ_KIND_*)`, for
/// [`check`]. A `masqueradeCIDRs` entry is a hole in the exempt range around it; rather than
/// cut the holes out, that range is left out whole, so a policy towards any part of it is
/// judged as masqueraded: the loud side.
pub fn exempt_networks<'entries>(
    v4: impl IntoIterator<Item = &'entries ((Ipv4Addr, u8), u32)>,
    v6: impl IntoIterator<Item = &'entries ((Ipv6Addr, u8), u32)>,
) -> Vec<IpNet> {
    let v4 = v4.into_iter().filter_map(|&((address, prefix), kind)| {
        Some((IpNet::V4(Ipv4Net::new(address, prefix).ok()?), kind))
    });
    let v6 = v6.into_iter().filter_map(|&((address, prefix), kind)| {
        Some((IpNet::V6(Ipv6Net::new(address, prefix).ok()?), kind))
    });
    let (masqueraded, kept): (Vec<_>, Vec<_>) = v4
        .chain(v6)
        .partition(|&(_, kind)| kind == masq_common::layout::NOMASQ_KIND_MASQUERADE);
    kept.into_iter()
        .map(|(network, _)| network)
        .filter(|network| !masqueraded.iter().any(|(hole, _)| network.contains(hole)))
        .collect()
}

fn same_family(a: &IpNet, b: &IpNet) -> bool {
    matches!(
        (a, b),
        (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
    )
}

/// Whether every address of `network` is inside one of `networks`. The union can cover it
/// without any one network holding it whole (two /9s make a /8), so the halves are tried in
/// turn; only halves that some network overlaps are split further, which bounds the walk by
/// the networks' count times the prefix length.
fn covered(network: &IpNet, networks: &[IpNet]) -> bool {
    if networks.iter().any(|outer| outer.contains(network)) {
        return true;
    }
    let inside = networks
        .iter()
        .any(|inner| same_family(inner, network) && network.contains(inner));
    if !inside {
        return false;
    }
    network
        .subnets(network.prefix_len() + 1)
        .is_ok_and(|mut halves| halves.all(|half| covered(&half, networks)))
}

/// The networks of the usable, direct routes among `routes` off the uplinks and loopback,
/// except the default route and multicast and link-local networks.
fn pod_networks(routes: Vec<Route>, uplinks: &BTreeSet<&str>) -> Vec<IpNet> {
    routes
        .into_iter()
        .filter(|route| {
            let special = match route.destination {
                IpNet::V4(network) => network.addr().is_multicast(),
                IpNet::V6(network) => {
                    network.addr().is_multicast() || network.addr().is_unicast_link_local()
                }
            };
            route.usable()
                && route.direct()
                && route.destination.prefix_len() > 0
                && !special
                && route.interface != "lo"
                && !uplinks.contains(route.interface.as_str())
        })
        .map(|route| route.destination)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pod networks of `/proc/net/route` (IPv4, main table).
    fn pod_networks_v4(table: &str, uplinks: &BTreeSet<&str>) -> Vec<IpNet> {
        pod_networks(route::parse_v4(table), uplinks)
    }

    /// The pod networks of `/proc/net/ipv6_route` (every table).
    fn pod_networks_v6(table: &str, uplinks: &BTreeSet<&str>) -> Vec<IpNet> {
        pod_networks(route::parse_v6(table), uplinks)
    }

    fn net(text: &str) -> IpNet {
        text.parse()
            .unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn policy(source: &str, destination: &str) -> XfrmPolicy {
        XfrmPolicy {
            source: net(source),
            destination: net(destination),
            protocol: 0,
            source_port: (0, 0),
            destination_port: (0, 0),
            ifindex: 0,
            direction: DIR_OUT,
            action: 0,
            priority: 0,
            index: 1,
            templates: 1,
            mark: None,
            if_id: 0,
        }
    }

    /// A node at 192.0.2.1 and 2001:db8:1::1 (uplink up0, index 2), pods in 10.244.1.0/24
    /// and 2001:db8:244:1::/64, upstream's default non-masquerade ranges.
    fn node() -> Translation {
        Translation {
            uplinks: vec![SnatUplink {
                name: "up0".to_owned(),
                ifindex: 2,
                ipv4: Some(Ipv4Addr::new(192, 0, 2, 1)),
                ipv6: Some("2001:db8:1::1".parse().unwrap_or(Ipv6Addr::UNSPECIFIED)),
            }],
            nomasq: [
                "10.0.0.0/8",
                "172.16.0.0/12",
                "192.168.0.0/16",
                "169.254.0.0/16",
                "fe80::/10",
            ]
            .into_iter()
            .map(net)
            .collect(),
            pod_networks: vec![net("10.244.1.0/24"), net("2001:db8:244:1::/64")],
        }
    }

    fn reported(policy: &XfrmPolicy, translation: &Translation) -> bool {
        !bypassed(std::slice::from_ref(policy), translation).is_empty()
    }

    #[test]
    fn a_policy_for_the_node_address_towards_a_masqueraded_network_is_reported() {
        let found = bypassed(&[policy("192.0.2.1/32", "198.51.100.0/24")], &node());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].uplink, "up0");
        assert_eq!(found[0].snat, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(found[0].family(), "ipv4");
        assert!(reported(
            &policy("2001:db8:1::1/128", "2001:db8:ff::/64"),
            &node()
        ));
        // The node's subnet, narrower than what its pods use.
        assert!(reported(&policy("192.0.2.0/24", "0.0.0.0/0"), &node()));
    }

    #[test]
    fn a_policy_that_already_selects_the_pods_is_not_reported() {
        assert!(!reported(&policy("0.0.0.0/0", "198.51.100.0/24"), &node()));
        assert!(!reported(&policy("::/0", "2001:db8:ff::/64"), &node()));
        // Holds the node and every pod network.
        let mut translation = node();
        translation.uplinks[0].ipv4 = Some(Ipv4Addr::new(10, 1, 0, 1));
        assert!(!reported(
            &policy("10.0.0.0/8", "198.51.100.0/24"),
            &translation
        ));
    }

    #[test]
    fn a_policy_that_holds_only_some_pod_networks_is_reported() {
        let mut translation = node();
        translation.uplinks[0].ipv4 = Some(Ipv4Addr::new(10, 244, 1, 200));
        translation.pod_networks.push(net("10.245.0.0/24"));
        assert!(reported(
            &policy("10.244.0.0/16", "198.51.100.0/24"),
            &translation
        ));
    }

    #[test]
    fn without_known_pod_networks_only_the_whole_family_holds_the_pods() {
        let mut translation = node();
        translation.pod_networks.clear();
        assert!(reported(
            &policy("192.0.0.0/8", "198.51.100.0/24"),
            &translation
        ));
        assert!(!reported(
            &policy("0.0.0.0/0", "198.51.100.0/24"),
            &translation
        ));
    }

    #[test]
    fn a_policy_that_misses_the_snat_address_is_not_reported() {
        assert!(!reported(
            &policy("192.0.2.2/32", "198.51.100.0/24"),
            &node()
        ));
        assert!(!reported(
            &policy("10.244.1.0/24", "198.51.100.0/24"),
            &node()
        ));
        // IPv6 not translated (no --enable-ipv6): no IPv6 SNAT address.
        let mut translation = node();
        translation.uplinks[0].ipv6 = None;
        assert!(!reported(
            &policy("2001:db8:1::1/128", "2001:db8:ff::/64"),
            &translation
        ));
    }

    #[test]
    fn a_destination_inside_the_non_masquerade_networks_is_not_reported() {
        assert!(!reported(&policy("192.0.2.1/32", "10.200.0.0/16"), &node()));
        assert!(!reported(
            &policy("192.0.2.1/32", "169.254.169.254/32"),
            &node()
        ));
        assert!(!reported(
            &policy("2001:db8:1::1/128", "fe80::/64"),
            &node()
        ));
        // Covered by two networks together, none alone.
        let mut translation = node();
        translation.nomasq = vec![net("198.51.100.0/25"), net("198.51.100.128/25")];
        assert!(!reported(
            &policy("192.0.2.1/32", "198.51.100.0/24"),
            &translation
        ));
        translation.nomasq = vec![net("198.51.100.0/25"), net("198.51.100.128/26")];
        assert!(reported(
            &policy("192.0.2.1/32", "198.51.100.0/24"),
            &translation
        ));
        // Overlapping the non-masquerade networks only in part.
        assert!(reported(&policy("192.0.2.1/32", "0.0.0.0/0"), &node()));
    }

    #[test]
    fn only_output_policies_that_protect_or_block_count() {
        let mut allow = policy("192.0.2.1/32", "198.51.100.0/24");
        allow.templates = 0;
        assert!(!reported(&allow, &node()));
        let mut block = allow.clone();
        block.action = ACTION_BLOCK;
        assert!(reported(&block, &node()));
        for direction in [0, 2, 1 + 3] {
            let mut other = policy("192.0.2.1/32", "198.51.100.0/24");
            other.direction = direction;
            assert!(!reported(&other, &node()), "direction {direction}");
        }
        let mut xfrm_interface = policy("192.0.2.1/32", "198.51.100.0/24");
        xfrm_interface.if_id = 7;
        assert!(!reported(&xfrm_interface, &node()));
    }

    #[test]
    fn protocol_ports_and_marks_do_not_rule_a_policy_out() {
        let mut narrow = policy("192.0.2.1/32", "198.51.100.10/32");
        narrow.protocol = 6;
        narrow.source_port = (443, 0xffff);
        narrow.destination_port = (8080, 0xffff);
        narrow.mark = Some((0x10, 0xff));
        assert!(reported(&narrow, &node()));
    }

    #[test]
    fn a_selector_bound_to_an_interface_counts_only_for_that_uplink() {
        let mut bound = policy("192.0.2.1/32", "198.51.100.0/24");
        bound.ifindex = 2;
        assert!(reported(&bound, &node()));
        bound.ifindex = 3;
        assert!(!reported(&bound, &node()));
    }

    #[test]
    fn pod_networks_come_from_direct_routes_off_the_uplinks() {
        // The kernel prints each network-order word as a host integer in hex.
        let word = |octets: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(octets));
        let route = |interface: &str, destination, gateway, flags: &str, mask| {
            format!(
                "{interface}\t{}\t{}\t{flags}\t0\t0\t0\t{}\t0\t0\t0\n",
                word(destination),
                word(gateway),
                word(mask)
            )
        };
        let table = [
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
                .to_owned(),
            route("up0", [0; 4], [192, 0, 2, 254], "0003", [0; 4]),
            route("up0", [192, 0, 2, 0], [0; 4], "0001", [255, 255, 255, 0]),
            route("vpod1", [10, 244, 1, 0], [0; 4], "0001", [255, 255, 255, 0]),
            route(
                "cni0",
                [10, 244, 0, 0],
                [10, 244, 1, 1],
                "0003",
                [255, 255, 0, 0],
            ),
            route("eni1", [10, 244, 0, 5], [0; 4], "0005", [255; 4]),
            route("lo", [127, 0, 0, 0], [0; 4], "0001", [255, 0, 0, 0]),
        ]
        .concat();
        let uplinks = BTreeSet::from(["up0"]);
        assert_eq!(
            pod_networks_v4(&table, &uplinks),
            vec![net("10.244.1.0/24"), net("10.244.0.5/32")]
        );

        let table6 = "\
            20010db8024400010000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001    vpod1\n\
            20010db8000100000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001      up0\n\
            fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001    vpod1\n\
            20010db8024400010000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000003 00000000 80200001    vpod1\n\
            ff000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001    vpod1\n\
            00000000000000000000000000000000 00 00000000000000000000000000000000 00 20010db80001000000000000000000fe 00000400 00000001 00000000 00000003      up0\n";
        assert_eq!(
            pod_networks_v6(table6, &uplinks),
            vec![net("2001:db8:244:1::/64")]
        );
    }
}
