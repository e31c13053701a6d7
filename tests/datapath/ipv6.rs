//! The IPv6 datapath through `BPF_PROG_TEST_RUN`: crafted frames in, every translated frame's
//! checksum verified from scratch. Needs root (loads the programs); fails loudly without it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use masq_common::{
    counters::Counter,
    layout::{ATTACH_TCX, NOMASQ_KIND_CIDR, NOMASQ_KIND_MASQUERADE, Uplink},
    nat::{Direction, IPV6_MAX_EXTENSION_HEADERS},
};
use masq_testbed::{
    check::Ipv4View,
    harness::{Action, Harness, node_ip},
    pktgen::{Packet, TCP_ACK, TCP_SYN},
    pktgen6::{
        DESTINATION_OPTIONS, FRAGMENT, HOP_BY_HOP, ICMPV6_DEST_UNREACH,
        ICMPV6_NEIGHBOUR_SOLICITATION, ICMPV6_PACKET_TOO_BIG, Ipv6View, Packet6, addr6,
    },
};

const POD: &str = "2001:db8:ab::5";
const REMOTE: &str = "2001:db8:ff::1";
const NODE: &str = "2001:db8:1::1";

fn node() -> Ipv6Addr {
    addr6(NODE)
}

/// A datapath translating IPv6 on the test-run device to [`NODE`], pods in 2001:db8:ab::/48
/// exempt among themselves.
fn harness() -> Harness {
    let mut harness = Harness::new();
    harness.set_uplink_v6(Some(node()));
    harness.add_nomasq_v6("2001:db8:ab::/48", NOMASQ_KIND_CIDR);
    harness.add_nomasq_v6("fe80::/10", masq_common::layout::NOMASQ_KIND_LINK_LOCAL);
    harness
}

fn egress_translated(harness: &Harness, packet: &Packet6) -> Ipv6View {
    let run = harness.egress(&packet.frame());
    assert_eq!(run.action, Action::Pass, "{:?}", harness.counters());
    let view = Ipv6View::of_frame(&run.frame);
    assert_eq!(view.src, node(), "left with the pod's address");
    view.assert_checksum("egress");
    view
}

#[test]
fn tcp_leaves_with_the_nodes_ipv6_address_and_its_replies_come_back() {
    let harness = harness();
    let syn = Packet6::tcp(POD, 40_000, REMOTE, 443, TCP_SYN);
    let out = egress_translated(&harness, &syn);
    let (port, remote_port) = out.ports();
    assert_eq!(remote_port, 443);
    assert!(
        (1024..=29_999).contains(&port),
        "port {port} outside the range"
    );
    assert_eq!(harness.counter_v6(Counter::EgressNewMapping), 1);
    // Both halves are in the IPv6 table, none in the IPv4 one.
    let halves = harness.nat_v6();
    assert_eq!(halves.len(), 2, "{halves:?}");
    assert!(harness.nat().is_empty());
    assert!(
        halves
            .iter()
            .any(|(key, _)| key.direction() == Some(Direction::Ingress))
    );

    let reply = Packet6::tcp(REMOTE, 443, NODE, port, TCP_SYN | TCP_ACK);
    let back = harness.ingress(&reply.frame());
    assert_eq!(back.action, Action::Pass);
    let back = Ipv6View::of_frame(&back.frame);
    assert_eq!(back.dst, addr6(POD));
    assert_eq!(back.ports(), (443, 40_000));
    back.assert_checksum("ingress");
    assert_eq!(harness.counter_v6(Counter::IngressReverseNat), 1);

    // Later segments of the flow keep its mapping.
    let ack = Packet6::tcp(POD, 40_000, REMOTE, 443, TCP_ACK);
    assert_eq!(egress_translated(&harness, &ack).ports(), (port, 443));
    assert_eq!(harness.counter_v6(Counter::EgressMasqueraded), 1);
    assert_eq!(harness.counter(Counter::EgressMasqueraded), 0);
}

#[test]
fn udp_and_ping6_are_masqueraded_and_restored() {
    let harness = harness();
    let datagram = Packet6::udp(POD, 5353, REMOTE, 53);
    let out = egress_translated(&harness, &datagram);
    let (port, _) = out.ports();
    let answer = Packet6::udp(REMOTE, 53, NODE, port);
    let back = Ipv6View::of_frame(&harness.ingress(&answer.frame()).frame);
    assert_eq!((back.dst, back.ports()), (addr6(POD), (53, 5353)));
    back.assert_checksum("udp ingress");

    let ping = Packet6::echo(POD, REMOTE, true, 0x4242);
    let out = egress_translated(&harness, &ping);
    let (id, _) = out.ports();
    let pong = Packet6::echo(REMOTE, NODE, false, id);
    let back = Ipv6View::of_frame(&harness.ingress(&pong.frame()).frame);
    assert_eq!((back.dst, back.ports().0), (addr6(POD), 0x4242));
    back.assert_checksum("echo reply");
}

#[test]
fn exempt_link_local_multicast_and_neighbour_discovery_pass_untouched() {
    let harness = harness();
    let frames = [
        // Pod to pod: a non-masquerade CIDR.
        Packet6::tcp(POD, 40_001, "2001:db8:ab::9", 80, TCP_SYN).frame(),
        // Link-local destination (the trie's fe80::/10).
        Packet6::udp(POD, 546, "fe80::1", 547).frame(),
        // Link-local source.
        Packet6::udp("fe80::5", 5353, REMOTE, 5353).frame(),
        // Multicast destination.
        Packet6::udp(POD, 5353, "ff02::fb", 5353).frame(),
        // Neighbour solicitation from the pod's global address.
        Packet6::icmp(
            POD,
            "ff02::1:ff00:1",
            ICMPV6_NEIGHBOUR_SOLICITATION,
            0,
            &[0; 20],
        )
        .frame(),
    ];
    for frame in &frames {
        let run = harness.egress(frame);
        assert_eq!((run.action, &run.frame), (Action::Pass, frame));
    }
    assert!(harness.nat_v6().is_empty());
    assert_eq!(harness.counter_v6(Counter::EgressExemptCidr), 1);
    // The trie's link-local destination, the link-local source, both multicast destinations.
    assert_eq!(harness.counter_v6(Counter::EgressExemptLinkLocal), 4);
}

#[test]
fn extension_headers_are_walked_to_the_transport_header() {
    let harness = harness();
    let options = [0, 0, 1, 4, 0, 0, 0, 0];
    let syn = Packet6::tcp(POD, 40_002, REMOTE, 443, TCP_SYN)
        .with_extension(HOP_BY_HOP, &options)
        .with_extension(DESTINATION_OPTIONS, &options);
    let run = harness.egress(&syn.frame());
    assert_eq!(run.action, Action::Pass);
    let view = Ipv6View::of_frame(&run.frame);
    assert_eq!(view.src, node());
    // The transport header and its checksum, after the two 8-byte extension headers.
    let transport = &view.payload[16..];
    assert_eq!(
        masq_testbed::pktgen6::checksum6(view.src, view.dst, 6, transport),
        0,
        "checksum after extension headers"
    );

    // As many extension headers as the datapath walks: translated.
    let chain = |source_port| {
        (0..IPV6_MAX_EXTENSION_HEADERS).fold(
            Packet6::tcp(POD, source_port, REMOTE, 443, TCP_SYN),
            |packet, _| packet.with_extension(DESTINATION_OPTIONS, &options),
        )
    };
    let run = harness.egress(&chain(40_005).frame());
    assert_eq!(run.action, Action::Pass);
    assert_eq!(Ipv6View::of_frame(&run.frame).src, node());

    // One more than the datapath walks: passed untouched, counted.
    let frame = chain(40_003)
        .with_extension(DESTINATION_OPTIONS, &options)
        .frame();
    let run = harness.egress(&frame);
    assert_eq!((run.action, &run.frame), (Action::Pass, &frame));
    assert_eq!(harness.counter_v6(Counter::EgressUnsupported), 1);
}

#[test]
fn an_uplink_without_an_ipv6_address_translates_no_ipv6() {
    let mut harness = harness();
    harness.set_uplink_v6(None);
    let frame = Packet6::tcp(POD, 40_004, REMOTE, 443, TCP_SYN).frame();
    let run = harness.egress(&frame);
    assert_eq!((run.action, &run.frame), (Action::Pass, &frame));
    assert_eq!(harness.counter_v6(Counter::EgressNotConfigured), 1);
    assert!(harness.nat_v6().is_empty());
}

/// The device `BPF_PROG_TEST_RUN` runs frames on (loopback), which the harness makes the uplink.
const TEST_RUN_IFINDEX: u32 = 1;

#[test]
fn an_uplink_without_ipv4_masquerades_ipv6_and_drops_ipv4_it_cannot_masquerade() {
    let mut harness = harness();
    // An IPv6-only node's uplink, as the agent records it: no IPv4 address.
    let mut uplink = Uplink::new(
        [0; 4],
        ATTACH_TCX,
        Uplink::encode_name("lo").unwrap_or_default(),
    );
    uplink.has_v6 = 1;
    uplink.snat_addr_v6 = node().octets();
    harness
        .datapath
        .maps
        .set_uplink(TEST_RUN_IFINDEX, &uplink)
        .unwrap_or_else(|error| panic!("{error}"));

    // IPv4 that MASQUERADE would translate has no address to get: dropped, counted, and no
    // mapping is made.
    for frame in [
        Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame(),
        Packet::udp("10.244.1.5:5353", "203.0.113.10:53").frame(),
        Packet::icmp_echo_request("10.244.1.5", "203.0.113.10", 7).frame(),
    ] {
        assert_eq!(harness.egress(&frame).action, Action::Drop);
    }
    assert_eq!(harness.counter(Counter::EgressDropNoAddress), 3);
    assert!(harness.nat().is_empty(), "{:?}", harness.nat());
    // A fragmented datagram: its later fragments are dropped with the first, and one whose
    // first fragment was not seen is dropped by the policy (never sent from 0.0.0.0).
    for (id, first) in [(0x4242, true), (0x4343, false)] {
        if first {
            let first = Packet::udp("10.244.1.5:5353", "203.0.113.10:53")
                .payload(&[3; 64])
                .ip_id(id)
                .first_fragment();
            assert_eq!(harness.egress(&first.frame()).action, Action::Drop);
        }
        let later = Packet::udp("10.244.1.5:0", "203.0.113.10:0")
            .ip_id(id)
            .later_fragment(9, false, &[4; 40]);
        assert_eq!(harness.egress(&later.frame()).action, Action::Drop);
    }
    assert_eq!(harness.counter(Counter::EgressDropNoAddress), 6);

    // What MASQUERADE leaves alone passes untouched: exempt destinations, and the node's own
    // packets from no address (a DHCP client's).
    for frame in [
        Packet::tcp("10.244.1.5:40001", "10.1.2.3:443", TCP_SYN).frame(),
        Packet::udp("0.0.0.0:68", "255.255.255.255:67").frame(),
    ] {
        let run = harness.egress(&frame);
        assert_eq!((run.action, &run.frame), (Action::Pass, &frame));
    }
    assert_eq!(harness.counter(Counter::EgressExemptCidr), 1);
    assert_eq!(harness.counter(Counter::EgressHostPassed), 1);
    // Arriving IPv4 is nobody's reply: it passes.
    let frame = Packet::tcp("203.0.113.10:443", "192.0.2.1:1500", TCP_SYN | TCP_ACK).frame();
    let run = harness.ingress(&frame);
    assert_eq!((run.action, &run.frame), (Action::Pass, &frame));
    assert_eq!(harness.counter(Counter::IngressPassed), 1);

    // IPv6 is masqueraded as on any uplink.
    let syn = Packet6::tcp(POD, 40_005, REMOTE, 443, TCP_SYN);
    egress_translated(&harness, &syn);
    assert_eq!(harness.counter_v6(Counter::EgressNewMapping), 1);
    assert_eq!(harness.counter_v6(Counter::EgressDropNoAddress), 0);
}

/// The IPv6 packet quoted by an ICMPv6 error (after the 4 unused/MTU bytes), as a view.
fn quoted(error: &Ipv6View) -> Ipv6View {
    Ipv6View::of_frame(&masq_testbed::pktgen::ethernet(0x86dd, &error.payload[8..]))
}

#[test]
fn packet_too_big_reaches_the_pod_with_the_quote_translated() {
    let harness = harness();
    let syn = Packet6::tcp(POD, 40_010, REMOTE, 443, TCP_SYN);
    let (port, _) = egress_translated(&harness, &syn).ports();

    // A router on the way says the node's (translated) segment was too big, quoting it.
    let sent = Packet6::tcp(NODE, port, REMOTE, 443, TCP_ACK).packet();
    let mut body = 1280u32.to_be_bytes().to_vec();
    body.extend_from_slice(&sent);
    let too_big = Packet6::icmp("2001:db8:77::1", NODE, ICMPV6_PACKET_TOO_BIG, 0, &body);
    let run = harness.ingress(&too_big.frame());
    assert_eq!(run.action, Action::Pass);
    let error = Ipv6View::of_frame(&run.frame);
    assert_eq!(error.dst, addr6(POD), "the error must reach the pod");
    error.assert_checksum("ICMPv6 error");
    let quote = quoted(&error);
    assert_eq!((quote.src, quote.ports()), (addr6(POD), (40_010, 443)));
    quote.assert_checksum("quoted segment");
    assert_eq!(harness.counter_v6(Counter::IngressIcmpErrorTranslated), 1);
}

#[test]
fn a_pods_icmpv6_error_about_a_reply_leaves_from_the_node() {
    let harness = harness();
    let datagram = Packet6::udp(POD, 5300, REMOTE, 53);
    let (port, _) = egress_translated(&harness, &datagram).ports();

    // The reply as the pod got it, and the pod's port unreachable about it.
    let reply = Packet6::udp(REMOTE, 53, POD, 5300).packet();
    let mut body = vec![0; 4];
    body.extend_from_slice(&reply);
    let unreachable = Packet6::icmp(POD, REMOTE, ICMPV6_DEST_UNREACH, 4, &body);
    let run = harness.egress(&unreachable.frame());
    assert_eq!(run.action, Action::Pass);
    let error = Ipv6View::of_frame(&run.frame);
    assert_eq!(error.src, node(), "left with the pod's address");
    error.assert_checksum("ICMPv6 error");
    let quote = quoted(&error);
    assert_eq!((quote.dst, quote.ports()), (node(), (53, port)));
    quote.assert_checksum("quoted datagram");
    assert_eq!(harness.counter_v6(Counter::EgressIcmpErrorTranslated), 1);
}

/// A UDP datagram split into two fragments (identification `id`): the first with the UDP
/// header, whose checksum covers the whole datagram, the second with the rest.
fn fragmented(src: (&str, u16), dst: (&str, u16), id: u32) -> (Vec<u8>, Vec<u8>) {
    let ((src, src_port), (dst, dst_port)) = (src, dst);
    let datagram = Packet6::udp(src, src_port, dst, dst_port).packet()[40..].to_vec();
    let (first, rest) = datagram.split_at(16);
    let fragment = |units: u16, more: bool, transport: &[u8]| {
        let offset = (units << 3) | u16::from(more);
        let mut header = vec![0, 0];
        header.extend_from_slice(&offset.to_be_bytes());
        header.extend_from_slice(&id.to_be_bytes());
        Packet6 {
            src: addr6(src),
            dst: addr6(dst),
            protocol: masq_testbed::pktgen::UDP,
            extensions: vec![(FRAGMENT, header)],
            transport: transport.to_vec(),
            checksum_at: None,
        }
        .frame()
    };
    (fragment(0, true, first), fragment(2, false, rest))
}

#[test]
fn fragments_follow_their_first_fragment_both_ways() {
    let harness = harness();
    let (first, second) = fragmented((POD, 5400), (REMOTE, 53), 0x0bad_cafe);
    let out: Vec<Ipv6View> = [first, second]
        .iter()
        .map(|frame| {
            let run = harness.egress(frame);
            assert_eq!(run.action, Action::Pass, "{:?}", harness.counters());
            Ipv6View::of_frame(&run.frame)
        })
        .collect();
    assert!(out.iter().all(|fragment| fragment.src == node()));
    // Reassembled (after each 8-byte fragment header), the datagram's checksum holds for the
    // node's address.
    let reassembled: Vec<u8> = out
        .iter()
        .flat_map(|fragment| fragment.payload[8..].to_vec())
        .collect();
    assert_eq!(
        masq_testbed::pktgen6::checksum6(node(), addr6(REMOTE), 17, &reassembled),
        0
    );
    let port = u16::from_be_bytes([reassembled[0], reassembled[1]]);
    assert_eq!(harness.counter_v6(Counter::EgressFragmentTranslated), 1);

    // The answer, fragmented too, gets the pod's address back on every fragment.
    let (first, second) = fragmented((REMOTE, 53), (NODE, port), 0x0bad_f00d);
    let back: Vec<Ipv6View> = [first, second]
        .iter()
        .map(|frame| Ipv6View::of_frame(&harness.ingress(frame).frame))
        .collect();
    assert!(
        back.iter().all(|fragment| fragment.dst == addr6(POD)),
        "{:?}",
        harness.counters()
    );
    assert_eq!(harness.counter_v6(Counter::IngressFragmentTranslated), 1);
}

/// An address and a port.
type End = (IpAddr, u16);

/// One address family's TCP frames and outcomes, for a test that runs over both.
struct FamilyFrames {
    name: &'static str,
    /// A segment without data from the pod's port `port` to the remote's 443: port, flags,
    /// sequence and acknowledgement numbers.
    from_pod: fn(u16, u8, u32, u32) -> Vec<u8>,
    /// A segment without data from the remote's 443 to the node's port `port`.
    to_node: fn(u16, u8, u32, u32) -> Vec<u8>,
    /// `((source, port), (destination, port))` of a frame, its checksums verified.
    ends: fn(&[u8]) -> (End, End),
    /// The node's address in this family.
    node: IpAddr,
    /// The pod's address in this family.
    pod: IpAddr,
    /// The family's counter.
    counter: fn(&Harness, Counter) -> u64,
    /// Entries in the family's NAT table.
    entries: fn(&Harness) -> usize,
}

const IPV4: FamilyFrames = FamilyFrames {
    name: "IPv4",
    from_pod: |port, flags, seq, ack| {
        Packet::tcp(&format!("10.244.1.5:{port}"), "203.0.113.10:443", flags)
            .seq(seq)
            .ack(ack)
            .payload(b"")
            .frame()
    },
    to_node: |port, flags, seq, ack| {
        Packet::tcp("203.0.113.10:443", &format!("{}:{port}", node_ip()), flags)
            .seq(seq)
            .ack(ack)
            .payload(b"")
            .frame()
    },
    ends: |frame| {
        let view = Ipv4View::of_frame(frame);
        view.assert_checksums("IPv4");
        (
            (view.src.into(), view.src_port()),
            (view.dst.into(), view.dst_port()),
        )
    },
    node: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
    pod: IpAddr::V4(Ipv4Addr::new(10, 244, 1, 5)),
    counter: Harness::counter,
    entries: |harness| harness.nat().len(),
};

const IPV6: FamilyFrames = FamilyFrames {
    name: "IPv6",
    from_pod: |port, flags, seq, ack| {
        Packet6::tcp(POD, port, REMOTE, 443, flags)
            .numbers(seq, ack)
            .without_payload()
            .frame()
    },
    to_node: |port, flags, seq, ack| {
        Packet6::tcp(REMOTE, 443, NODE, port, flags)
            .numbers(seq, ack)
            .without_payload()
            .frame()
    },
    ends: |frame| {
        let view = Ipv6View::of_frame(frame);
        view.assert_checksum("IPv6");
        let (src_port, dst_port) = view.ports();
        ((view.src.into(), src_port), (view.dst.into(), dst_port))
    },
    node: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1)),
    pod: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0xab, 0, 0, 0, 0, 5)),
    counter: Harness::counter_v6,
    entries: |harness| harness.nat_v6().len(),
};

/// A NAT table full of established flows refuses a new flow (dropped, counted) and evicts
/// nothing: every live flow keeps its port, both ways, as conntrack never evicts an assured
/// flow to make room.
fn a_full_nat_table_refuses_new_flows_and_keeps_live_ones(family: &FamilyFrames) {
    const CAPACITY: u32 = 16;
    const POD_ISN: u32 = 7_000;
    const REMOTE_ISN: u32 = 90_000;
    let mut harness = Harness::sized(CAPACITY, 64);
    harness.set_uplink_v6(Some(node()));
    let name = family.name;
    let mut live = Vec::new();
    for port in 40_000.. {
        let run = harness.egress(&(family.from_pod)(port, TCP_SYN, POD_ISN, 0));
        if run.action == Action::Drop {
            break;
        }
        assert_eq!(run.action, Action::Pass, "{name}");
        let ((src, translated), _) = (family.ends)(&run.frame);
        assert_eq!(src, family.node, "{name}: left with the pod's address");
        let answer = (family.to_node)(translated, TCP_SYN | TCP_ACK, REMOTE_ISN, POD_ISN + 1);
        assert_eq!(harness.ingress(&answer).action, Action::Pass, "{name}");
        let ack = (family.from_pod)(port, TCP_ACK, POD_ISN + 1, REMOTE_ISN + 1);
        assert_eq!(harness.egress(&ack).action, Action::Pass, "{name}");
        live.push((port, translated));
        assert!(
            live.len() <= CAPACITY as usize,
            "{name}: the table never filled"
        );
    }
    // Two entries a flow: the table is full, not merely busy.
    assert_eq!(live.len(), CAPACITY as usize / 2, "{name}");
    assert_eq!((family.entries)(&harness), CAPACITY as usize, "{name}");
    assert_eq!(
        (family.counter)(&harness, Counter::EgressDropTableFull),
        1,
        "{name}"
    );
    // Refused again, and again nothing is evicted for it.
    let refused = harness.egress(&(family.from_pod)(50_000, TCP_SYN, POD_ISN, 0));
    assert_eq!(refused.action, Action::Drop, "{name}");
    assert_eq!(
        (family.counter)(&harness, Counter::EgressDropTableFull),
        2,
        "{name}"
    );

    for &(port, translated) in &live {
        let run = harness.egress(&(family.from_pod)(
            port,
            TCP_ACK,
            POD_ISN + 1,
            REMOTE_ISN + 1,
        ));
        assert_eq!(run.action, Action::Pass, "{name}: live flow {port} dropped");
        let ((src, src_port), _) = (family.ends)(&run.frame);
        assert_eq!(
            (src, src_port),
            (family.node, translated),
            "{name}: flow {port} re-mapped"
        );
        let back = harness.ingress(&(family.to_node)(
            translated,
            TCP_ACK,
            REMOTE_ISN + 1,
            POD_ISN + 1,
        ));
        assert_eq!(
            back.action,
            Action::Pass,
            "{name}: reply of flow {port} dropped"
        );
        let (_, (dst, dst_port)) = (family.ends)(&back.frame);
        assert_eq!(
            (dst, dst_port),
            (family.pod, port),
            "{name}: reply of flow {port}"
        );
    }
    assert_eq!((family.entries)(&harness), CAPACITY as usize, "{name}");
}

#[test]
fn a_full_ipv6_nat_table_refuses_new_flows_and_keeps_live_ones() {
    a_full_nat_table_refuses_new_flows_and_keeps_live_ones(&IPV6);
}

#[test]
fn a_full_ipv4_nat_table_refuses_new_flows_and_keeps_live_ones() {
    a_full_nat_table_refuses_new_flows_and_keeps_live_ones(&IPV4);
}

/// Issue 24, point 5, for IPv6: a removed TCP flow's late segment gets its mapping back rather
/// than leaving with the pod's address.
#[test]
fn a_late_ipv6_segment_of_a_removed_connection_gets_its_mapping_back() {
    use masq::datapath::gc;
    use masq_common::flow::{Timeouts, tcp};

    let mut harness = harness();
    let out = egress_translated(&harness, &Packet6::tcp(POD, 40_000, REMOTE, 443, TCP_SYN));
    let (port, _) = out.ports();
    let answer = Packet6::tcp(REMOTE, 443, NODE, port, TCP_SYN | TCP_ACK);
    assert_eq!(harness.ingress(&answer.frame()).action, Action::Pass);

    let timeouts = Timeouts::LINUX_DEFAULTS;
    let late = gc::monotonic_now_ns() + timeouts.tcp[usize::from(tcp::ESTABLISHED)] + 1_000_000_000;
    let report = gc::collect(&mut harness.datapath.maps, &timeouts, late).expect("collect");
    assert_eq!(report.ipv6.expired, 1, "{report:?}");
    assert!(harness.nat_v6().is_empty());

    let late_segment = Packet6::tcp(POD, 40_000, REMOTE, 443, TCP_ACK);
    assert_eq!(
        egress_translated(&harness, &late_segment).ports(),
        (port, 443)
    );
    assert_eq!(harness.counter_v6(Counter::EgressTcpRevived), 1);
    assert_eq!(harness.nat_v6().len(), 2);
}

/// Issue 26 for IPv6: the longest matching prefix of the one destination trie decides, a
/// `masqueradeCIDRs` entry inside an exempt range masquerading and a keep entry inside that
/// keeping again.
#[test]
fn the_longest_ipv6_prefix_decides_between_masquerade_and_keep_entries() {
    let mut harness = harness();
    harness.add_nomasq_v6("2001:db8:100::/48", NOMASQ_KIND_CIDR);
    harness.add_nomasq_v6("2001:db8:100:10::/64", NOMASQ_KIND_MASQUERADE);
    harness.add_nomasq_v6("2001:db8:100:10::99/128", NOMASQ_KIND_CIDR);

    let out = egress_translated(
        &harness,
        &Packet6::tcp(POD, 40_000, "2001:db8:100:10::5", 443, TCP_SYN),
    );
    assert_eq!(out.dst, addr6("2001:db8:100:10::5"));
    assert_eq!(harness.counter_v6(Counter::EgressNewMapping), 1);
    assert_eq!(harness.nat_v6().len(), 2);

    for destination in ["2001:db8:100:11::5", "2001:db8:100:10::99"] {
        let frame = Packet6::tcp(POD, 40_001, destination, 443, TCP_SYN).frame();
        let run = harness.egress(&frame);
        assert_eq!(
            (run.action, &run.frame),
            (Action::Pass, &frame),
            "{destination} must keep the pod address"
        );
    }
    assert_eq!(harness.counter_v6(Counter::EgressExemptCidr), 2);
    assert_eq!(harness.nat_v6().len(), 2);
}

/// Issue 26 for IPv6: a pod in the IPv6 source trie keeps its address whatever the
/// destination, once the settings flag says the source tries hold entries, and not before.
#[test]
fn an_ipv6_source_in_the_source_trie_passes_once_the_settings_flag_it() {
    const EXEMPT_POD: &str = "2001:db8:ac::5";
    let mut harness = harness();
    harness.add_nomasq_v6("2001:db8:100:10::/64", NOMASQ_KIND_MASQUERADE);
    harness.add_nomasq_src_v6("2001:db8:ac::/64");

    // Entries but no flag: masqueraded.
    egress_translated(
        &harness,
        &Packet6::tcp(EXEMPT_POD, 40_000, REMOTE, 443, TCP_SYN),
    );
    assert_eq!(harness.counter_v6(Counter::EgressNewMapping), 1);

    harness.set_source_exemptions(true);
    for destination in [REMOTE, "2001:db8:100:10::5"] {
        let frame = Packet6::tcp(EXEMPT_POD, 40_001, destination, 443, TCP_SYN).frame();
        let run = harness.egress(&frame);
        assert_eq!(
            (run.action, &run.frame),
            (Action::Pass, &frame),
            "{EXEMPT_POD} to {destination} must keep its address"
        );
    }
    assert_eq!(harness.counter_v6(Counter::EgressExemptSource), 2);
    assert_eq!(harness.counter(Counter::EgressExemptSource), 0);
    assert_eq!(harness.nat_v6().len(), 2, "no mapping for them");
    // Another pod is masqueraded as before.
    egress_translated(&harness, &Packet6::tcp(POD, 40_000, REMOTE, 443, TCP_SYN));
    assert_eq!(harness.counter_v6(Counter::EgressNewMapping), 2);

    // A later fragment whose first fragment was not seen is decided alike.
    let (_, later) = fragmented((EXEMPT_POD, 5400), (REMOTE, 53), 0x00c0_ffee);
    let run = harness.egress(&later);
    assert_eq!((run.action, &run.frame), (Action::Pass, &later));
    assert_eq!(harness.counter_v6(Counter::EgressExemptSource), 3);
    let (_, later) = fragmented((POD, 5400), ("2001:db8:100:10::5", 53), 0x00c0_fff0);
    let run = harness.egress(&later);
    assert_eq!(run.action, Action::Pass);
    assert_eq!(Ipv6View::of_frame(&run.frame).src, node());
    assert_eq!(harness.counter_v6(Counter::EgressFragmentTranslated), 1);
}
