//! The datapath through `BPF_PROG_TEST_RUN`: crafted frames in, rewritten frames and map state
//! out, every checksum verified from scratch. Needs root (loads eBPF programs).

use std::net::Ipv4Addr;

use masq_common::{
    counters::{ALLOC_FAILED_SLOT, ALLOC_HISTOGRAM_BUCKETS, Counter},
    flow::{EvictionCause, Timeouts, datagram, tcp},
    layout::{NOMASQ_KIND_CIDR, NOMASQ_KIND_MASQUERADE},
    nat::{Direction, NatEntryV4, NatKeyV4, ORIGIN_HOST, last_activity, proto},
    ports::PortRange,
};
use masq_testbed::{
    check::Ipv4View,
    harness::{Action, Harness, node_ip},
    pktgen::{
        ESP, GRE, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, ICMP_PORT_UNREACH, ICMP_TIME_EXCEEDED,
        Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, addr, arp_frame, ipv6_frame,
    },
};

const POD: &str = "10.244.1.5";
const POD_B: &str = "10.244.2.7";
const REMOTE: &str = "203.0.113.10";
const EXEMPT: &str = "10.1.2.3";
const ROUTER: &str = "198.51.100.1";

/// Sends `packet` out and returns the translated view, asserting it passed with valid checksums.
fn egress_ok(harness: &Harness, packet: &Packet) -> Ipv4View {
    let run = harness.egress(&packet.frame());
    assert_eq!(
        run.action,
        Action::Pass,
        "egress dropped {packet:?}: {:?}",
        harness.counters()
    );
    let view = Ipv4View::of_frame(&run.frame);
    view.assert_checksums("egress output");
    view
}

fn ingress_ok(harness: &Harness, frame: &[u8]) -> Ipv4View {
    let run = harness.ingress(frame);
    assert_eq!(
        run.action,
        Action::Pass,
        "ingress dropped: {:?}",
        harness.counters()
    );
    let view = Ipv4View::of_frame(&run.frame);
    view.assert_checksums("ingress output");
    view
}

/// A reply from `from` to the node's translated endpoint of `view` (an egress output).
fn tcp_reply_to(view: &Ipv4View, flags: u8) -> Packet {
    let from = format!("{}:{}", view.dst, view.dst_port());
    let to = format!("{}:{}", view.src, view.src_port());
    Packet::tcp(&from, &to, flags)
}

/// The pod's initial sequence number in [`handshake`].
const POD_ISN: u32 = 7_000;
/// The remote's initial sequence number in [`handshake`].
const REMOTE_ISN: u32 = 0x00ab_0000;

/// Opens a TCP connection from `pod` to `remote` as a real handshake does (SYN, SYN-ACK, ACK,
/// with numbers that agree, no data): returns the SYN's translation. The flow is then
/// ESTABLISHED and assured; the pod's next byte is `POD_ISN + 1`, the remote's `REMOTE_ISN + 1`.
fn handshake(harness: &Harness, pod: &str, remote: &str) -> Ipv4View {
    let out = egress_ok(
        harness,
        &Packet::tcp(pod, remote, TCP_SYN).seq(POD_ISN).payload(b""),
    );
    ingress_ok(
        harness,
        &tcp_reply_to(&out, TCP_SYN | TCP_ACK)
            .seq(REMOTE_ISN)
            .ack(POD_ISN + 1)
            .payload(b"")
            .frame(),
    );
    egress_ok(
        harness,
        &Packet::tcp(pod, remote, TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1)
            .payload(b""),
    );
    out
}

/// Both halves of the one flow in the table, failing if either is missing.
fn flow(harness: &Harness) -> (NatEntryV4, NatEntryV4) {
    match (
        half(harness, Direction::Egress),
        half(harness, Direction::Ingress),
    ) {
        (Some((_, egress)), Some((_, ingress))) => (egress, ingress),
        halves => panic!("the flow lost a half: {halves:?}"),
    }
}

/// The conntrack state name the one TCP flow in the table is in, read from both halves (which
/// must agree), with whether it is assured.
fn tcp_state(harness: &Harness) -> (&'static str, bool) {
    let (egress, ingress) = flow(harness);
    assert_eq!(
        (egress.state, egress.assured, egress.reset),
        (ingress.state, ingress.assured, ingress.reset),
        "the halves disagree"
    );
    (tcp::name(egress.state), egress.is_assured())
}

/// How long the one TCP flow in the table may stay idle, by conntrack's default timeouts.
fn tcp_lifetime(harness: &Harness) -> u64 {
    flow(harness)
        .0
        .lifetime(proto::TCP, &Timeouts::LINUX_DEFAULTS)
}

const fn seconds(count: u64) -> u64 {
    count * 1_000_000_000
}

/// The half of the one flow in the table that goes `direction`.
fn half(harness: &Harness, direction: Direction) -> Option<(NatKeyV4, NatEntryV4)> {
    harness
        .nat()
        .into_iter()
        .find(|(key, _)| key.direction() == Some(direction))
}

#[test]
fn unconfigured_datapath_leaves_everything_alone() {
    let harness = Harness::unconfigured();
    let frame = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame();
    let out = harness.egress(&frame);
    assert_eq!(
        (out.action, out.frame.as_slice()),
        (Action::Pass, frame.as_slice())
    );
    let out = harness.ingress(&frame);
    assert_eq!(
        (out.action, out.frame.as_slice()),
        (Action::Pass, frame.as_slice())
    );
    assert_eq!(harness.counter(Counter::EgressNotConfigured), 1);
    assert_eq!(harness.counter(Counter::IngressNotConfigured), 1);
    assert!(harness.nat().is_empty());
}

#[test]
fn each_uplink_masquerades_to_its_own_address_and_other_interfaces_are_left_alone() {
    let mut harness = Harness::new();
    let second_uplink = Ipv4Addr::new(203, 0, 113, 1);
    harness.set_uplink(Some(second_uplink));
    let syn = Packet::tcp("10.244.1.5:40000", "198.51.100.10:443", TCP_SYN);
    let out = egress_ok(&harness, &syn);
    assert_eq!(out.src, second_uplink);
    // The reply comes back to that address, and only that address is recognised as the node.
    let reply = tcp_reply_to(&out, TCP_SYN | TCP_ACK);
    let restored = ingress_ok(&harness, &reply.frame());
    assert_eq!(restored.dst, addr(POD));

    // An interface without an uplink entry (a pod veth, a device masq was not asked to use)
    // sees nothing translated, in either direction, even for a flow that has a mapping.
    harness.set_uplink(None);
    let frame = syn.frame();
    let untouched = harness.egress(&frame);
    assert_eq!(
        (untouched.action, untouched.frame.as_slice()),
        (Action::Pass, frame.as_slice())
    );
    let reply = reply.frame();
    let untouched = harness.ingress(&reply);
    assert_eq!(
        (untouched.action, untouched.frame.as_slice()),
        (Action::Pass, reply.as_slice())
    );
    assert_eq!(harness.counter(Counter::EgressNotConfigured), 1);
    assert_eq!(harness.counter(Counter::IngressNotConfigured), 1);
}

#[test]
fn tcp_to_masqueraded_destination_leaves_with_node_address() {
    let harness = Harness::new();
    let syn = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN);
    let out = egress_ok(&harness, &syn);
    assert_eq!(out.src, node_ip());
    assert_eq!(out.dst, addr(REMOTE));
    assert!(
        (1024..=29_999).contains(&out.src_port()),
        "port {} outside the SNAT range",
        out.src_port()
    );
    assert_eq!(out.dst_port(), 443);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 1);

    // Both halves exist and point at each other.
    let table = harness.nat();
    assert_eq!(table.len(), 2, "{table:?}");
    let (egress_key, egress_entry) = harness.egress_mappings()[0];
    assert_eq!(
        egress_key,
        NatKeyV4::new(
            addr(POD).octets(),
            addr(REMOTE).octets(),
            40_000,
            443,
            6,
            Direction::Egress
        )
    );
    assert_eq!(
        (egress_entry.addr, egress_entry.port),
        (node_ip().octets(), out.src_port())
    );
    let reverse = egress_key.peer(&egress_entry);
    let (_, restore) = table
        .iter()
        .find(|(key, _)| *key == reverse)
        .expect("reverse half");
    assert_eq!((restore.addr, restore.port), (addr(POD).octets(), 40_000));

    // Later packets reuse the mapping.
    let data =
        Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK | TCP_PSH).payload(&[7; 300]);
    let again = egress_ok(&harness, &data);
    assert_eq!((again.src, again.src_port()), (out.src, out.src_port()));
    assert_eq!(harness.counter(Counter::EgressMasqueraded), 1);
    assert_eq!(harness.nat().len(), 2);
}

#[test]
fn replies_get_the_pod_address_back() {
    let harness = Harness::new();
    let out = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN)
            .seq(POD_ISN)
            .payload(b""),
    );
    let reply = tcp_reply_to(&out, TCP_SYN | TCP_ACK)
        .seq(REMOTE_ISN)
        .ack(POD_ISN + 1)
        .payload(b"");
    let back = ingress_ok(&harness, &reply.frame());
    assert_eq!((back.src, back.src_port()), (addr(REMOTE), 443));
    assert_eq!((back.dst, back.dst_port()), (addr(POD), 40_000));
    assert_eq!(harness.counter(Counter::IngressReverseNat), 1);
    assert_eq!(
        tcp_state(&harness),
        ("SYN_RECV", false),
        "the answer moves the flow on"
    );
}

/// Issue 24, point 1: a packet to the node's address and a port in the SNAT range that
/// matches no mapping used to be dropped as a stale reply unless a node socket held the port.
/// But a hostPort's DNAT or a flow netfilter still translates has no socket: under conntrack
/// the stack gets such a packet, and so it does here, untouched and counted apart.
#[test]
fn a_packet_into_the_snat_range_without_mapping_goes_to_the_stack() {
    let harness = Harness::new();
    let unmatched_tcp = Packet::tcp("203.0.113.10:443", "192.0.2.1:2000", TCP_ACK).frame();
    let unmatched_udp = Packet::udp("203.0.113.10:53", "192.0.2.1:8125").frame();
    for frame in [&unmatched_tcp, &unmatched_udp] {
        let out = harness.ingress(frame);
        assert_eq!((out.action, &out.frame), (Action::Pass, frame));
    }
    assert_eq!(harness.counter(Counter::IngressNoMappingPassed), 2);
    // A connection attempt, and a port outside the range, are ordinary node traffic.
    let syn = Packet::tcp("203.0.113.10:443", "192.0.2.1:2000", TCP_SYN).frame();
    let outside_range = Packet::udp("203.0.113.10:53", "192.0.2.1:40000").frame();
    for frame in [&syn, &outside_range] {
        let out = harness.ingress(frame);
        assert_eq!((out.action, &out.frame), (Action::Pass, frame));
    }
    assert_eq!(harness.counter(Counter::IngressPassed), 2);
    assert_eq!(harness.counter(Counter::IngressNoMappingPassed), 2);
    assert!(harness.nat().is_empty(), "passing creates no state");
}

#[test]
fn a_port_a_node_socket_holds_is_never_given_to_a_pod_flow() {
    // A node listener inside the SNAT range (kubelet's 10250 in 1024-29999, say), in this
    // process's namespace, where BPF_PROG_TEST_RUN looks sockets up.
    let listener = (23_600..23_700)
        .find_map(|port| std::net::TcpListener::bind(("0.0.0.0", port)).ok())
        .expect("a free port");
    let port = listener.local_addr().expect("address").port();
    let harness = Harness::with_ports(&[PortRange::new(port, port)], true);
    let syn = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame();
    let refused = harness.egress(&syn);
    assert_eq!(
        refused.action,
        Action::Drop,
        "the pod flow was given the port of a node listener: its replies would reach the pod"
    );
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 1);
    assert!(harness.egress_mappings().is_empty());
    // Once the node lets go of the port, it is free for pods.
    drop(listener);
    let out = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN),
    );
    assert_eq!((out.src, out.src_port()), (node_ip(), port));
}

#[test]
fn traffic_not_belonging_to_a_mapping_is_untouched_on_ingress() {
    let harness = Harness::new();
    // To the node, outside the SNAT range, no mapping: the node's own traffic.
    let to_node = Packet::tcp("203.0.113.10:443", "192.0.2.1:40000", TCP_SYN | TCP_ACK).frame();
    let out = harness.ingress(&to_node);
    assert_eq!((out.action, out.frame), (Action::Pass, to_node));
    // Not to the node at all (routed to a pod directly): untouched, though a UDP flow from a
    // masqueraded address is remembered for the pod's answers.
    let to_pod = Packet::tcp("203.0.113.10:53", "10.244.1.5:5353", TCP_SYN).frame();
    let out = harness.ingress(&to_pod);
    assert_eq!((out.action, out.frame), (Action::Pass, to_pod));
    let udp_to_pod = Packet::udp("203.0.113.10:53", "10.244.1.5:5353").frame();
    let out = harness.ingress(&udp_to_pod);
    assert_eq!((out.action, out.frame), (Action::Pass, udp_to_pod));
    assert_eq!(harness.counter(Counter::IngressPassed), 2);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
}

#[test]
fn exempt_destinations_keep_the_pod_address() {
    let harness = Harness::new();
    for (destination, counter) in [
        ("10.1.2.3:443", Counter::EgressExemptCidr),
        ("172.20.0.1:443", Counter::EgressExemptCidr),
        ("192.168.7.7:443", Counter::EgressExemptCidr),
        ("169.254.169.254:80", Counter::EgressExemptLinkLocal),
    ] {
        let frame = Packet::tcp("10.244.1.5:40000", destination, TCP_SYN).frame();
        let out = harness.egress(&frame);
        assert_eq!(
            (out.action, &out.frame),
            (Action::Pass, &frame),
            "{destination}"
        );
        assert!(
            harness.counter(counter) > 0,
            "{destination} not counted as {}",
            counter.name()
        );
    }
    assert!(harness.nat().is_empty());
}

#[test]
fn an_existing_mapping_wins_over_a_config_change() {
    let mut harness = Harness::new();
    let first = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN),
    );
    assert_eq!(first.src, node_ip());

    // The destination becomes non-masquerade while the flow lives.
    harness.add_nomasq("203.0.113.0/24", NOMASQ_KIND_CIDR);
    let live = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK),
    );
    assert_eq!((live.src, live.src_port()), (first.src, first.src_port()));

    // A new flow to the same destination follows the new policy.
    let frame = Packet::tcp("10.244.1.5:40001", "203.0.113.10:443", TCP_SYN).frame();
    let new_flow = harness.egress(&frame);
    assert_eq!(new_flow.frame, frame);
    assert_eq!(harness.counter(Counter::EgressExemptCidr), 1);

    // And the other way round: a removed exemption applies to new flows only.
    harness.remove_nomasq("10.0.0.0/8");
    let now_masqueraded = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40002", "10.1.2.3:443", TCP_SYN),
    );
    assert_eq!(now_masqueraded.src, node_ip());
    let _ = EXEMPT;
}

#[test]
fn udp_checksums_stay_valid_and_zero_stays_zero() {
    let harness = Harness::new();
    let out = egress_ok(&harness, &Packet::udp("10.244.1.5:5353", "203.0.113.10:53"));
    assert_eq!(out.src, node_ip());
    assert_ne!(out.transport_checksum_field(), 0);

    let bare = egress_ok(
        &harness,
        &Packet::udp_without_checksum("10.244.1.5:5354", "203.0.113.10:53"),
    );
    assert_eq!(bare.src, node_ip());
    assert_eq!(
        bare.transport_checksum_field(),
        0,
        "no checksum must stay no checksum"
    );

    let reply = Packet::udp_without_checksum(
        &format!("{REMOTE}:53"),
        &format!("{}:{}", bare.src, bare.src_port()),
    );
    let back = ingress_ok(&harness, &reply.frame());
    assert_eq!((back.dst, back.dst_port()), (addr(POD), 5354));
    assert_eq!(back.transport_checksum_field(), 0);
}

#[test]
fn icmp_echo_uses_the_identifier_as_port() {
    let harness = Harness::new();
    let out = egress_ok(&harness, &Packet::icmp_echo_request(POD, REMOTE, 77));
    assert_eq!(out.src, node_ip());
    let nat_id = out.icmp_id();
    assert!((1024..=29_999).contains(&nat_id));

    let back = ingress_ok(
        &harness,
        &Packet::icmp_echo_reply(REMOTE, "192.0.2.1", nat_id).frame(),
    );
    assert_eq!((back.dst, back.icmp_id()), (addr(POD), 77));
    assert_eq!(harness.counter(Counter::IngressReverseNat), 1);

    // An echo reply leaving without a mapping answers a ping from outside: untouched.
    let answer = Packet::icmp_echo_reply(POD, REMOTE, 5).frame();
    assert_eq!(harness.egress(&answer).frame, answer);
}

#[test]
fn fragmentation_needed_reaches_the_pod_with_a_translated_quote() {
    let harness = Harness::new();
    egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN),
    );
    let out = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK).payload(&[1; 1400]),
    );
    assert_eq!(out.src, node_ip());
    // A router on the path quotes the translated packet: full header plus 8 bytes, and also a
    // generous quote that includes the TCP checksum.
    let translated = Packet::tcp(
        &format!("{}:{}", out.src, out.src_port()),
        "203.0.113.10:443",
        TCP_ACK,
    )
    .payload(&[1; 1400])
    .ip_packet();
    for quote_len in [28, 60, translated.len()] {
        let error = Packet::icmp_error(
            ROUTER,
            "192.0.2.1",
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            &translated[..quote_len],
        );
        let back = ingress_ok(&harness, &error.frame());
        assert_eq!(back.src, addr(ROUTER));
        assert_eq!(back.dst, addr(POD), "quote of {quote_len} bytes");
        let quoted = back.quoted();
        assert_eq!((quoted.src, quoted.src_port()), (addr(POD), 40_000));
        assert_eq!((quoted.dst, quoted.dst_port()), (addr(REMOTE), 443));
    }
    assert_eq!(harness.counter(Counter::IngressIcmpErrorTranslated), 3);
}

#[test]
fn errors_about_replies_leave_with_the_node_address() {
    let harness = Harness::new();
    let out = egress_ok(&harness, &Packet::udp("10.244.1.5:5353", "203.0.113.10:53"));
    // The pod got the reverse-translated reply and answers it with port unreachable.
    let reply_as_delivered = Packet::udp("203.0.113.10:53", "10.244.1.5:5353").ip_packet();
    let error = Packet::icmp_error(
        POD,
        REMOTE,
        ICMP_DEST_UNREACH,
        ICMP_PORT_UNREACH,
        &reply_as_delivered,
    );
    let sent = egress_ok(&harness, &error);
    assert_eq!((sent.src, sent.dst), (node_ip(), addr(REMOTE)));
    let quoted = sent.quoted();
    assert_eq!((quoted.dst, quoted.dst_port()), (node_ip(), out.src_port()));
    assert_eq!((quoted.src, quoted.src_port()), (addr(REMOTE), 53));

    // The node itself may report a problem forwarding the reply (e.g. TTL exceeded).
    let node_error = Packet::icmp_error("192.0.2.1", REMOTE, 11, 0, &reply_as_delivered[..28]);
    let sent = egress_ok(&harness, &node_error);
    assert_eq!(sent.src, node_ip());
    assert_eq!(sent.quoted().dst, node_ip());
    assert_eq!(harness.counter(Counter::EgressIcmpErrorTranslated), 2);
}

#[test]
fn icmp_errors_about_pings_are_translated() {
    let harness = Harness::new();
    let out = egress_ok(&harness, &Packet::icmp_echo_request(POD, REMOTE, 9));
    let quoted = Packet::icmp_echo_request("192.0.2.1", REMOTE, out.icmp_id()).ip_packet();
    let error = Packet::icmp_error(ROUTER, "192.0.2.1", 11, 0, &quoted);
    let back = ingress_ok(&harness, &error.frame());
    assert_eq!(back.dst, addr(POD));
    assert_eq!((back.quoted().src, back.quoted().icmp_id()), (addr(POD), 9));
}

/// Issue 9: errors about protocols translated by address only (GRE, ESP) were left addressed to
/// the node, so path MTU discovery of a pod's tunnel through the node broke. They are translated
/// like the mapping they quote, both ways; what follows the quoted IPv4 header (a GRE header, an
/// ESP SPI) is no port and stays as it is.
#[test]
fn icmp_errors_about_tunnels_are_translated_by_address() {
    let harness = Harness::new();
    let gre = [0, 0, 0x08, 0x00, 0x45, 0, 0, 20];
    let esp = [0x4e, 0x20, 0x01, 0xbb, 0, 0, 0, 1, 0xaa, 0xbb];
    for (protocol, body) in [(GRE, &gre[..]), (ESP, &esp[..])] {
        let out = egress_ok(&harness, &Packet::raw(POD, REMOTE, protocol).payload(body));
        assert_eq!(out.src, node_ip());
        let as_sent = Packet::raw("192.0.2.1", REMOTE, protocol)
            .payload(body)
            .ip_packet();
        for quote_len in [28, as_sent.len()] {
            let error = Packet::icmp_error(
                ROUTER,
                "192.0.2.1",
                ICMP_DEST_UNREACH,
                ICMP_FRAG_NEEDED,
                &as_sent[..quote_len],
            );
            let back = ingress_ok(&harness, &error.frame());
            assert_eq!(
                back.dst,
                addr(POD),
                "protocol {protocol}, {quote_len} bytes"
            );
            let quoted = back.quoted();
            assert_eq!((quoted.src, quoted.dst), (addr(POD), addr(REMOTE)));
            assert_eq!(quoted.transport, as_sent[20..quote_len]);
        }
        // The pod cannot take a tunnel packet it was delivered: its error leaves as the node.
        let delivered = Packet::raw(REMOTE, POD, protocol).payload(body).ip_packet();
        let error = Packet::icmp_error(POD, REMOTE, ICMP_DEST_UNREACH, 2, &delivered);
        let sent = egress_ok(&harness, &error);
        assert_eq!((sent.src, sent.dst), (node_ip(), addr(REMOTE)));
        let quoted = sent.quoted();
        assert_eq!((quoted.src, quoted.dst), (addr(REMOTE), node_ip()));
        assert_eq!(quoted.transport, delivered[20..]);
    }
    assert_eq!(harness.counter(Counter::IngressIcmpErrorTranslated), 4);
    assert_eq!(harness.counter(Counter::EgressIcmpErrorTranslated), 2);
}

/// Issue 9: an error about a UDP flow opened from outside (a remote writing to a pod's own
/// address) found that flow's record, which "translates" to the pod itself, and an error the
/// node sent about it (time exceeded forwarding to the pod: a traceroute to a pod address) left
/// claiming to come from the pod. As with conntrack, whose entry for such a flow has no NAT,
/// errors about it leave exactly as sent, whoever sends them.
#[test]
fn icmp_errors_about_flows_opened_from_outside_leave_untranslated() {
    let harness = Harness::new();
    let inbound = Packet::udp("203.0.113.10:5000", "10.244.1.5:53");
    assert_eq!(harness.ingress(&inbound.frame()).frame, inbound.frame());
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
    let quoted = inbound.ip_packet();
    for (sender, icmp_type, code) in [
        ("192.0.2.1", ICMP_TIME_EXCEEDED, 0),
        (POD, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH),
    ] {
        let error = Packet::icmp_error(sender, REMOTE, icmp_type, code, &quoted[..28]).frame();
        let run = harness.egress(&error);
        assert_eq!(
            (run.action, run.frame.as_slice()),
            (Action::Pass, error.as_slice()),
            "error from {sender}"
        );
    }
    assert_eq!(harness.counter(Counter::EgressInboundReply), 2);
    assert_eq!(harness.counter(Counter::EgressIcmpErrorTranslated), 0);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 0);
}

#[test]
fn ip_options_do_not_confuse_the_parser() {
    let harness = Harness::new();
    for options in [
        vec![1, 1, 1, 1],
        vec![7, 39, 4]
            .into_iter()
            .chain([0; 37])
            .collect::<Vec<u8>>(),
    ] {
        let packet = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).options(&options);
        let out = egress_ok(&harness, &packet);
        assert_eq!(out.header.len(), 20 + options.len().div_ceil(4) * 4);
        assert_eq!((out.src, out.dst_port()), (node_ip(), 443));
        let reply = tcp_reply_to(&out, TCP_SYN | TCP_ACK).options(&options);
        let back = ingress_ok(&harness, &reply.frame());
        assert_eq!((back.dst, back.dst_port()), (addr(POD), 40_000));
    }
}

#[test]
fn malformed_and_foreign_frames_pass_untouched_and_are_counted() {
    let harness = Harness::new();
    let good = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame();

    let mut truncated = good.clone();
    truncated.truncate(14 + 20 + 10); // the IPv4 header claims more than the frame holds
    let mut bad_version = good.clone();
    bad_version[14] = 0x65;
    let mut short_ihl = good.clone();
    short_ihl[14] = 0x44;
    let mut tcp_cut = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN)
        .payload(b"")
        .ip_packet();
    tcp_cut.truncate(30);
    tcp_cut[2..4].copy_from_slice(&30u16.to_be_bytes());
    let tcp_cut = masq_testbed::pktgen::ethernet(0x0800, &tcp_cut);
    let mut short_total = good.clone();
    short_total[16..18].copy_from_slice(&10u16.to_be_bytes()); // total length inside the header

    for frame in [&truncated, &bad_version, &short_ihl, &tcp_cut, &short_total] {
        let out = harness.egress(frame);
        assert_eq!((out.action, &out.frame), (Action::Pass, frame));
        let out = harness.ingress(frame);
        assert_eq!((out.action, &out.frame), (Action::Pass, frame));
    }
    assert_eq!(
        harness.counter(Counter::EgressMalformed),
        5,
        "{:?}",
        harness.counters()
    );
    // Ingress reads transport headers only of packets addressed to the node; the cut TCP
    // header is addressed elsewhere and simply passes.
    assert_eq!(
        harness.counter(Counter::IngressMalformed),
        4,
        "{:?}",
        harness.counters()
    );
    assert_eq!(
        harness.counter(Counter::IngressPassed),
        1,
        "{:?}",
        harness.counters()
    );

    for frame in [arp_frame(), ipv6_frame()] {
        assert_eq!(harness.egress(&frame).frame, frame);
        assert_eq!(harness.ingress(&frame).frame, frame);
    }
    assert_eq!(harness.counter(Counter::EgressNotIpv4), 1);
    assert_eq!(harness.counter(Counter::IngressNotIpv4), 1);
    // IPv6 goes to the IPv6 programs, which translate nothing on an uplink without an IPv6
    // address.
    assert_eq!(harness.counter_v6(Counter::EgressNotConfigured), 1);
    assert_eq!(harness.counter_v6(Counter::IngressNotConfigured), 1);
    assert!(harness.nat().is_empty());
}

#[test]
fn an_exhausted_port_range_drops_new_flows_and_spares_old_ones() {
    let harness = Harness::with_ports(&[PortRange::new(20_000, 20_001)], true);
    let first = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN),
    );
    let second = egress_ok(
        &harness,
        &Packet::tcp("10.244.2.7:40000", "203.0.113.10:443", TCP_SYN),
    );
    assert_ne!(
        first.src_port(),
        second.src_port(),
        "two flows to one endpoint share a port"
    );

    let third =
        harness.egress(&Packet::tcp("10.244.1.5:40001", "203.0.113.10:443", TCP_SYN).frame());
    assert_eq!(third.action, Action::Drop);
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 1);
    let histogram = harness.alloc_histogram();
    assert_eq!(histogram.len(), ALLOC_HISTOGRAM_BUCKETS as usize);
    assert_eq!(
        histogram[ALLOC_FAILED_SLOT as usize], 1,
        "one flow found no port: {histogram:?}"
    );
    assert_eq!(
        histogram[..=ALLOC_FAILED_SLOT as usize].iter().sum::<u64>(),
        3
    );

    // Existing flows keep working.
    let again = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK),
    );
    assert_eq!(again.src_port(), first.src_port());
    // Ports are unique per remote endpoint: another destination port may reuse them.
    let other = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40001", "203.0.113.10:80", TCP_SYN),
    );
    assert!((20_000..=20_001).contains(&other.src_port()));
    let _ = POD_B;
}

/// Issue 9, problem 3: allocation gave up after 32 probes, so new flows were dropped while
/// ports were still free (the first drop came at 86-100 of 100 ports in use). Like the
/// kernel's search, a range of up to 128 ports is now searched whole.
#[test]
fn every_free_port_of_a_small_range_is_found() {
    let harness = Harness::with_ports(&[PortRange::new(20_000, 20_099)], true);
    let mut ports = std::collections::BTreeSet::new();
    for flow in 0..100u16 {
        let source = format!("10.244.1.5:{}", 40_000 + flow);
        let out = egress_ok(&harness, &Packet::udp(&source, "203.0.113.10:53"));
        assert!(
            ports.insert(out.src_port()),
            "flow {flow} was given port {} twice",
            out.src_port()
        );
    }
    assert_eq!(ports.len(), 100, "all 100 ports handed out");
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 0);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 100);

    let overflow = harness.egress(&Packet::udp("10.244.1.5:39999", "203.0.113.10:53").frame());
    assert_eq!(
        overflow.action,
        Action::Drop,
        "the 101st flow has no port left"
    );
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 1);
    let histogram = harness.alloc_histogram();
    assert_eq!(histogram[ALLOC_FAILED_SLOT as usize], 1, "{histogram:?}");
    assert_eq!(
        histogram[..ALLOC_FAILED_SLOT as usize].iter().sum::<u64>(),
        100,
        "every successful search recorded once: {histogram:?}"
    );
}

/// The allocator searches 16 ports a run and tail-calls itself for the next 16 (Linux 6.1's
/// verifier refuses the whole search in one program): the first round, 128 ports, spans eight
/// runs, and a range of that size is still searched whole, to its last free port.
#[test]
fn a_search_across_every_chunk_of_the_first_round_finds_the_last_port() {
    let harness = Harness::with_ports(&[PortRange::new(20_000, 20_127)], true);
    let mut ports = std::collections::BTreeSet::new();
    for flow in 0..128u16 {
        let source = format!("10.244.1.5:{}", 40_000 + flow);
        let out = egress_ok(&harness, &Packet::udp(&source, "203.0.113.10:53"));
        assert!(
            ports.insert(out.src_port()),
            "flow {flow}: port given twice"
        );
    }
    assert_eq!(ports.len(), 128);
    let overflow = harness.egress(&Packet::udp("10.244.1.5:39999", "203.0.113.10:53").frame());
    assert_eq!(overflow.action, Action::Drop);
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 1);
    // Every run handed on to the next: none found its tail call refused.
    assert_eq!(harness.counter(Counter::EgressDropNoAllocator), 0);
    let histogram = harness.alloc_histogram();
    assert_eq!(histogram[ALLOC_FAILED_SLOT as usize], 1, "{histogram:?}");
    // The last port was found after trying more ports than one run holds.
    assert!(
        histogram[..ALLOC_FAILED_SLOT as usize]
            .iter()
            .skip(5)
            .sum::<u64>()
            > 0,
        "no search needed more than 16 tries: {histogram:?}"
    );
}

/// Issue 24, point 3: a full table refused every new flow for as long as one pod's
/// never-answered SYNs held it (120 s). conntrack admits a new flow by evicting one that was
/// never answered (`early_drop`), and never an assured one: so does masq, oldest first.
#[test]
fn a_full_table_admits_new_flows_by_evicting_only_unanswered_ones() {
    // 64 entries: 32 flows.
    let harness = Harness::sized(64, 64);
    // One established flow, then SYNs to a black hole until the table is full.
    let answered = handshake(&harness, "10.244.2.7:50000", "203.0.113.10:443");
    let mut flood = 0u16;
    while harness.counter(Counter::EgressDropTableFull) == 0
        && harness.evicted(EvictionCause::TableFull) == 0
        && flood < 100
    {
        let syn = Packet::tcp(
            &format!("10.244.1.5:{}", 40_000 + flood),
            "203.0.113.99:80",
            TCP_SYN,
        );
        flood += 1;
        let _ = harness.egress(&syn.frame());
    }
    assert!(
        harness.evicted(EvictionCause::TableFull) > 0,
        "the flood never filled the table ({flood} SYNs): {:?}",
        harness.counters()
    );
    // Every further new flow is admitted, each in place of an unassured one.
    let evicted_before = harness.evicted(EvictionCause::TableFull);
    for flow in 0..20u16 {
        let out = harness.egress(
            &Packet::udp(&format!("10.244.3.9:{}", 30_000 + flow), "198.51.100.53:53").frame(),
        );
        assert_eq!(
            out.action,
            Action::Pass,
            "flow {flow}: {:?}",
            harness.counters()
        );
    }
    assert_eq!(
        harness.counter(Counter::EgressDropTableFull),
        0,
        "{:?}",
        harness.counters()
    );
    assert_eq!(
        harness.evicted(EvictionCause::TableFull) - evicted_before,
        20,
        "{:?}",
        harness.evictions()
    );
    // The established flow was never evicted: it keeps its mapping.
    let again = egress_ok(
        &harness,
        &Packet::tcp("10.244.2.7:50000", "203.0.113.10:443", TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1),
    );
    assert_eq!(again.src_port(), answered.src_port());
}

/// The assured flows of a full table stay, and a new flow is refused then, as conntrack
/// refuses one when no entry near it is unassured.
#[test]
fn a_table_full_of_assured_flows_refuses_new_ones_and_evicts_none() {
    let harness = Harness::sized(8, 64);
    for flow in 0..4u16 {
        handshake(
            &harness,
            &format!("10.244.1.5:{}", 40_000 + flow),
            "203.0.113.10:443",
        );
    }
    let refused =
        harness.egress(&Packet::tcp("10.244.2.7:50000", "203.0.113.10:443", TCP_SYN).frame());
    assert_eq!(refused.action, Action::Drop);
    assert_eq!(harness.counter(Counter::EgressDropTableFull), 1);
    assert_eq!(
        harness
            .evictions()
            .iter()
            .map(|(_, _, count)| count)
            .sum::<u64>(),
        0
    );
    assert_eq!(
        harness.nat().len(),
        8,
        "every answered flow keeps both halves"
    );
}

#[test]
fn sctp_keeps_its_port_and_conflicts_are_dropped() {
    let harness = Harness::new();
    let packet = Packet::sctp("10.244.1.5:3868", "203.0.113.10:3868");
    let original = Ipv4View::parse(&packet.ip_packet());
    let out = egress_ok(&harness, &packet);
    assert_eq!((out.src, out.src_port()), (node_ip(), 3868));
    assert_eq!(
        out.transport, original.transport,
        "SCTP bytes (incl. CRC32c) must be untouched"
    );

    let clash = harness.egress(&Packet::sctp("10.244.2.7:3868", "203.0.113.10:3868").frame());
    assert_eq!(clash.action, Action::Drop);
    assert_eq!(harness.counter(Counter::EgressDropSctpPortInUse), 1);

    let back = ingress_ok(
        &harness,
        &Packet::sctp("203.0.113.10:3868", "192.0.2.1:3868").frame(),
    );
    assert_eq!(back.dst, addr(POD));
}

#[test]
fn other_protocols_are_translated_by_address() {
    let harness = Harness::new();
    let out = egress_ok(&harness, &Packet::raw(POD, REMOTE, GRE));
    assert_eq!(out.src, node_ip());
    let back = ingress_ok(&harness, &Packet::raw(REMOTE, "192.0.2.1", GRE).frame());
    assert_eq!(back.dst, addr(POD));
    // Only one flow per remote and protocol can exist, as with conntrack's generic tracking.
    let second = harness.egress(&Packet::raw(POD_B, REMOTE, GRE).frame());
    assert_eq!(second.action, Action::Drop);
}

/// Issue 9, problem 4: the first pod GRE or ESP flow to a remote claimed that remote's whole
/// protocol, the node's own tunnel included. The node's own port-less traffic now holds the
/// tuple, and takes it back from a pod flow that got there first.
#[test]
fn protocols_without_ports_never_capture_the_nodes_own_traffic() {
    let harness = Harness::new();
    // The node's tunnel to a remote holds (remote, GRE) before any pod flow.
    let tunnel = Packet::raw("192.0.2.1", REMOTE, GRE).frame();
    assert_eq!(
        harness.egress(&tunnel).frame,
        tunnel,
        "the node's own GRE leaves as is"
    );
    assert_eq!(harness.counter(Counter::EgressHostTracked), 1);
    let pod = harness.egress(&Packet::raw(POD, REMOTE, GRE).frame());
    assert_eq!(
        pod.action,
        Action::Drop,
        "a pod may not take the node's tuple"
    );
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 1);
    let inbound = Packet::raw(REMOTE, "192.0.2.1", GRE).frame();
    assert_eq!(
        harness.ingress(&inbound).frame,
        inbound,
        "the remote's GRE reaches the node, not a pod"
    );

    // A pod flow that got there first loses the tuple when the node speaks.
    let other_remote = "198.51.100.20";
    let out = egress_ok(&harness, &Packet::raw(POD, other_remote, ESP));
    assert_eq!(out.src, node_ip());
    let tunnel = Packet::raw("192.0.2.1", other_remote, ESP).frame();
    assert_eq!(harness.egress(&tunnel).frame, tunnel);
    assert_eq!(harness.counter(Counter::MappingConflict), 1);
    let inbound = Packet::raw(other_remote, "192.0.2.1", ESP).frame();
    assert_eq!(harness.ingress(&inbound).frame, inbound, "now the node's");
    let pod = harness.egress(&Packet::raw(POD, other_remote, ESP).frame());
    assert_eq!(pod.action, Action::Drop);
}

#[test]
fn node_traffic_is_untouched_but_reserves_ports_in_the_snat_range() {
    let harness = Harness::with_ports(&[PortRange::new(20_000, 20_000)], true);
    // Ephemeral port outside the SNAT range: nothing to do.
    let plain = Packet::tcp("192.0.2.1:45000", "203.0.113.10:443", TCP_SYN).frame();
    assert_eq!(harness.egress(&plain).frame, plain);
    assert_eq!(harness.counter(Counter::EgressHostPassed), 1);
    assert!(harness.nat().is_empty());

    // A node socket bound inside the range keeps its port and holds it.
    let bound = Packet::tcp("192.0.2.1:20000", "203.0.113.10:443", TCP_SYN).frame();
    let out = harness.egress(&bound);
    assert_eq!(out.frame, bound, "the node's own flow keeps its port");
    assert_eq!(harness.counter(Counter::EgressHostTracked), 1);
    assert!(
        harness
            .egress_mappings()
            .iter()
            .all(|(_, entry)| entry.origin == ORIGIN_HOST)
    );

    // So a pod flow to the same endpoint cannot get that port.
    let pod = harness.egress(&Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame());
    assert_eq!(pod.action, Action::Drop);
    // Replies to the node's flow come back unchanged.
    let reply = Packet::tcp("203.0.113.10:443", "192.0.2.1:20000", TCP_SYN | TCP_ACK).frame();
    assert_eq!(harness.ingress(&reply).frame, reply);
}

#[test]
fn tcp_segments_that_cannot_open_a_connection_create_no_mapping() {
    let harness = Harness::new();
    // A SYN-ACK from a pod answers a connection opened from outside: conntrack would not
    // masquerade it, and neither does masq.
    let synack = Packet::tcp("10.244.1.5:8080", "203.0.113.10:50000", TCP_SYN | TCP_ACK).frame();
    assert_eq!(harness.egress(&synack).frame, synack);
    let data = Packet::tcp("10.244.1.5:8080", "203.0.113.10:50000", TCP_ACK).frame();
    assert_eq!(harness.egress(&data).frame, data);
    assert_eq!(harness.counter(Counter::EgressTcpMidstreamPassed), 2);
    assert!(harness.nat().is_empty());
}

/// Issue 32: the flow's state is conntrack's, in both halves: the handshake assures it, a FIN
/// moves it to FIN_WAIT, an exact RST to CLOSE (conntrack's 10 s), and a SYN on the closed
/// tuple is a new connection, unassured.
#[test]
fn a_connection_moves_through_conntracks_states() {
    let harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let remote = "203.0.113.10:443";
    let out = egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_SYN).seq(POD_ISN).payload(b""),
    );
    assert_eq!(tcp_state(&harness), ("SYN_SENT", false));
    assert_eq!(tcp_lifetime(&harness), seconds(120));
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_SYN | TCP_ACK)
            .seq(REMOTE_ISN)
            .ack(POD_ISN + 1)
            .payload(b"")
            .frame(),
    );
    assert_eq!(tcp_state(&harness), ("SYN_RECV", false));
    assert_eq!(tcp_lifetime(&harness), seconds(60));
    egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1)
            .payload(b""),
    );
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert_eq!(tcp_lifetime(&harness), seconds(432_000));
    assert!(
        harness.holders().is_empty(),
        "an assured flow counts against no pod"
    );

    egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_FIN | TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1)
            .payload(b""),
    );
    assert_eq!(tcp_state(&harness), ("FIN_WAIT", true));
    assert_eq!(tcp_lifetime(&harness), seconds(120));
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_RST).seq(REMOTE_ISN + 1).frame(),
    );
    assert_eq!(tcp_state(&harness), ("CLOSE", true));
    assert_eq!(tcp_lifetime(&harness), seconds(10));

    // A new SYN on the same tuple: conntrack replaces the closed entry with a new one.
    let again = egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_SYN).seq(90_000).payload(b""),
    );
    assert_eq!(again.src_port(), out.src_port(), "the mapping stays");
    assert_eq!(tcp_state(&harness), ("SYN_SENT", false));
    assert_eq!(harness.holders(), [(addr(POD), 1)]);
}

/// Issue 24, point 5, and issue 32: a RST inside the window but not at the pod's last
/// acknowledgement may be spoofed (RFC 5961: the endpoint answers it with a challenge ACK and
/// carries on). conntrack keeps the state and gives the flow the CLOSE timeout until a segment
/// shows the connection alive; a RST at the acknowledgement closes it.
#[test]
fn a_rst_the_endpoint_may_challenge_keeps_the_state_until_the_flow_carries_on() {
    let harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let out = handshake(&harness, pod, "203.0.113.10:443");
    let acked = REMOTE_ISN + 1;
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_RST).seq(acked + 100).frame(),
    );
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert_ne!(flow(&harness).0.reset, 0);
    assert_eq!(tcp_lifetime(&harness), seconds(10));
    // The remote carries on: the RST was not its own.
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_ACK)
            .seq(acked)
            .ack(POD_ISN + 1)
            .payload(b"still here")
            .frame(),
    );
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert_eq!(tcp_lifetime(&harness), seconds(432_000));
    // The pod acknowledges the data; a RST at that acknowledgement is the real end.
    let acked = acked + 10;
    egress_ok(
        &harness,
        &Packet::tcp(pod, "203.0.113.10:443", TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(acked)
            .payload(b""),
    );
    ingress_ok(&harness, &tcp_reply_to(&out, TCP_RST).seq(acked).frame());
    assert_eq!(tcp_state(&harness), ("CLOSE", true));
    assert_eq!(harness.counter(Counter::TcpCloseOutOfWindow), 0);
}

/// Issue 24, point 5: any RST or FIN from the remote moved its flow to the short lifetimes, so
/// a spoofed RST that guessed the node port ended a connection left idle for 10 s. conntrack
/// checks RSTs, FINs and SYN-ACKs against the windows it tracks, and so does masq.
#[test]
fn a_rst_or_fin_outside_the_window_does_not_shorten_the_flow() {
    let harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let out = handshake(&harness, pod, "203.0.113.10:443");
    // The pod acknowledges the remote's SYN: what the remote's next RST must match.
    let acked = REMOTE_ISN + 1;
    assert_eq!(flow(&harness).0.window.max_ack, acked);
    assert_eq!(tcp_lifetime(&harness), seconds(432_000));

    // Spoofed: a RST far past the window, one just before the acknowledgement (conntrack's
    // "invalid rst"), a FIN half the sequence space away. Each is delivered to the pod
    // (whose stack ignores it) and counted; the flow keeps its state and lifetime.
    for spoofed in [
        tcp_reply_to(&out, TCP_RST).seq(acked + (1 << 20)),
        tcp_reply_to(&out, TCP_RST | TCP_ACK)
            .seq(acked - 1)
            .ack(POD_ISN + 1),
        tcp_reply_to(&out, TCP_FIN | TCP_ACK)
            .seq(acked + (1 << 31))
            .ack(POD_ISN + 1),
    ] {
        let delivered = ingress_ok(&harness, &spoofed.frame());
        assert_eq!(delivered.dst.to_string(), POD);
    }
    assert_eq!(harness.counter(Counter::TcpCloseOutOfWindow), 3);
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert_eq!(tcp_lifetime(&harness), seconds(432_000));

    // The remote's own FIN, a segment of data ahead of what the pod acknowledged: in the window.
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_FIN | TCP_ACK)
            .seq(acked + 1_400)
            .ack(POD_ISN + 1)
            .frame(),
    );
    assert_eq!(tcp_state(&harness), ("FIN_WAIT", true));
    assert_eq!(tcp_lifetime(&harness), seconds(120));
    // And a RST ending data still in flight towards the pod: the flow is over.
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_RST).seq(acked + 1_500).frame(),
    );
    assert_eq!(tcp_state(&harness), ("CLOSE", true));
    assert_eq!(harness.counter(Counter::TcpCloseOutOfWindow), 3);
}

/// Issue 32: a RST that is a connection's only answer (a closed port) ends the flow at once, as
/// conntrack deletes such an entry, so its port is free for the next attempt; and a SYN that
/// reopens a closed tuple is judged as a new connection, not against the old one's numbers.
#[test]
fn a_refused_connection_ends_at_once_even_on_a_reopened_tuple() {
    let harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let remote = "203.0.113.10:443";
    let refused = egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_SYN).seq(1).payload(b""),
    );
    ingress_ok(
        &harness,
        &tcp_reply_to(&refused, TCP_RST | TCP_ACK)
            .seq(0)
            .ack(2)
            .frame(),
    );
    assert!(harness.nat().is_empty(), "{:?}", harness.nat());
    assert_eq!(harness.counter(Counter::TcpRefused), 1);
    assert!(harness.holders().is_empty(), "{:?}", harness.holders());

    // A connection that lived and closed, then a new SYN on its tuple, refused.
    let out = handshake(&harness, pod, remote);
    for ack in [REMOTE_ISN + 1, REMOTE_ISN + 1_000_001] {
        egress_ok(
            &harness,
            &Packet::tcp(pod, remote, TCP_ACK)
                .seq(POD_ISN + 1)
                .ack(ack)
                .payload(b""),
        );
    }
    egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_FIN | TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1_000_001)
            .payload(b""),
    );
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_RST)
            .seq(REMOTE_ISN + 1_000_001)
            .frame(),
    );
    assert_eq!(tcp_state(&harness), ("CLOSE", true));
    egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_SYN).seq(5).payload(b""),
    );
    ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_RST | TCP_ACK).seq(0).ack(6).frame(),
    );
    assert_eq!(harness.counter(Counter::TcpCloseOutOfWindow), 0);
    assert_eq!(harness.counter(Counter::TcpRefused), 2);
    assert!(harness.nat().is_empty(), "{:?}", harness.nat());
}

#[test]
fn fragments_follow_their_first_fragment() {
    let harness = Harness::new();
    let first = Packet::udp("10.244.1.5:5353", "203.0.113.10:53")
        .payload(&[3; 64])
        .ip_id(0x4242)
        .first_fragment();
    let out = egress_ok(&harness, &first);
    assert_eq!(out.src, node_ip());
    let later = Packet::udp("10.244.1.5:0", "203.0.113.10:0")
        .ip_id(0x4242)
        .later_fragment(9, false, &[4; 40]);
    let out_later = egress_ok(&harness, &later);
    assert_eq!(out_later.src, node_ip());
    assert_eq!(
        out_later.transport,
        vec![4; 40],
        "a later fragment's bytes are payload"
    );
    assert_eq!(harness.counter(Counter::EgressFragmentTranslated), 1);

    // Fragments of an exempt datagram stay as they are.
    let exempt_first = Packet::udp("10.244.1.5:5353", "10.1.2.3:53")
        .ip_id(7)
        .first_fragment()
        .frame();
    assert_eq!(harness.egress(&exempt_first).frame, exempt_first);
    let exempt_later = Packet::udp("10.244.1.5:0", "10.1.2.3:0")
        .ip_id(7)
        .later_fragment(3, false, &[1; 16])
        .frame();
    assert_eq!(harness.egress(&exempt_later).frame, exempt_later);
    assert_eq!(harness.counter(Counter::EgressFragmentPassed), 1);

    // Ingress: the reply's first fragment finds the mapping, later ones follow it.
    let reply_first = Packet::udp(
        &format!("{REMOTE}:53"),
        &format!("{}:{}", out.src, out.src_port()),
    )
    .ip_id(0x5151)
    .first_fragment();
    let back = ingress_ok(&harness, &reply_first.frame());
    assert_eq!(back.dst, addr(POD));
    let reply_later = Packet::udp("203.0.113.10:0", "192.0.2.1:0")
        .ip_id(0x5151)
        .later_fragment(5, false, &[9; 24]);
    assert_eq!(ingress_ok(&harness, &reply_later.frame()).dst, addr(POD));
    assert_eq!(harness.counter(Counter::IngressFragmentTranslated), 1);

    // A later fragment whose first fragment was never seen cannot be translated.
    let orphan = Packet::udp("203.0.113.10:0", "192.0.2.1:0")
        .ip_id(0x6161)
        .later_fragment(5, false, &[9; 24])
        .frame();
    assert_eq!(harness.ingress(&orphan).frame, orphan);
    assert_eq!(harness.counter(Counter::IngressFragmentUnmatched), 1);
}

#[test]
fn without_random_fully_the_source_port_is_kept_when_free() {
    let harness = Harness::with_ports(&[PortRange::new(1024, 29_999)], false);
    let out = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:20000", "203.0.113.10:443", TCP_SYN),
    );
    assert_eq!(out.src_port(), 20_000);
    // Taken towards that endpoint: another pod gets a different port.
    let other = egress_ok(
        &harness,
        &Packet::tcp("10.244.2.7:20000", "203.0.113.10:443", TCP_SYN),
    );
    assert_ne!(other.src_port(), 20_000);
    // Outside the range: a port from the range.
    let outside = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:45000", "203.0.113.10:443", TCP_SYN),
    );
    assert!((1024..=29_999).contains(&outside.src_port()));
}

/// Issue 32: the collector buries a TCP flow before it removes its halves, one at a time. Had
/// it stopped between them (killed, or a packet in the instant between), the half left behind
/// and the buried record bring the flow back whole, from either end, on its old port.
#[test]
fn a_flow_the_collector_left_half_removed_comes_back_whole() {
    let mut harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let remote = "203.0.113.10:443";
    let out = handshake(&harness, pod, remote);
    let bury_and_remove = |harness: &mut Harness, direction: Direction| {
        let maps = &mut harness.datapath.maps;
        for (key, entry) in maps.nat_entries().expect("reading the table") {
            maps.buried_v4.insert(key, entry, 0).expect("burying");
        }
        let (key, _) = half(harness, direction).expect("the half");
        harness
            .datapath
            .maps
            .nat_v4
            .remove(&key)
            .expect("removing the half");
    };

    // The egress half is gone: the pod's next segment brings it back.
    bury_and_remove(&mut harness, Direction::Egress);
    let next = egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_ACK | TCP_PSH)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1),
    );
    assert_eq!((next.src, next.src_port()), (out.src, out.src_port()));
    assert_eq!(harness.counter(Counter::EgressTcpRevived), 1);
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert!(harness.buried().is_empty(), "{:?}", harness.buried());

    // The reply half is gone: the remote's next segment brings it back, to the pod.
    bury_and_remove(&mut harness, Direction::Ingress);
    let back = ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_ACK)
            .seq(REMOTE_ISN + 1)
            .ack(POD_ISN + 18)
            .frame(),
    );
    assert_eq!((back.dst, back.dst_port()), (addr(POD), 40_000));
    assert_eq!(harness.counter(Counter::IngressTcpRevived), 1);
    assert_eq!(tcp_state(&harness), ("ESTABLISHED", true));
    assert!(harness.buried().is_empty(), "{:?}", harness.buried());
}

#[test]
fn udp_flows_opened_from_outside_are_answered_untranslated() {
    let harness = Harness::new();
    // A remote in a masqueraded range sends to the pod's own address (routed to pods).
    let inbound = Packet::udp("203.0.113.10:5000", "10.244.1.5:53").frame();
    assert_eq!(harness.ingress(&inbound).frame, inbound);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
    // The pod's answer leaves with the pod's address, as with conntrack.
    let answer = Packet::udp("10.244.1.5:53", "203.0.113.10:5000").frame();
    assert_eq!(harness.egress(&answer).frame, answer);
    assert_eq!(harness.counter(Counter::EgressInboundReply), 1);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 0);
    // Other traffic of the pod to that remote is still masqueraded.
    let outbound = egress_ok(
        &harness,
        &Packet::udp("10.244.1.5:5353", "203.0.113.10:5000"),
    );
    assert_eq!(outbound.src, node_ip());

    // From a non-masquerade address nothing needs remembering.
    let cluster = Packet::udp("10.9.9.9:5000", "10.244.1.5:53").frame();
    assert_eq!(harness.ingress(&cluster).frame, cluster);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
}

/// Issue 33: without `--to-ports` masq maps over the kernel's ports, 1024-65535 but the
/// NodePorts (61,744 per remote endpoint), shared with the node as conntrack shares them:
/// 40,000 flows from pods to one remote `ip:port` get 40,000 distinct node ports (the old
/// default range held 28,976). The node's own flows pass untracked, and one from a port a
/// pod's flow holds towards the same remote gets another port, its reply restored to the node.
#[test]
fn forty_thousand_flows_to_one_remote_get_distinct_ports_shared_with_the_node() {
    let harness = Harness::shared_ports(131_072);
    let remote = "198.51.100.53:53";
    let mut ports = std::collections::BTreeSet::new();
    for flow in 0..40_000_u32 {
        let pod = format!("10.244.{}.5:{}", 1 + flow / 20_000, 20_000 + flow % 20_000);
        let out = egress_ok(&harness, &Packet::udp(&pod, remote));
        assert!(
            ports.insert(out.src_port()),
            "flow {flow}: port given twice"
        );
    }
    assert_eq!(ports.len(), 40_000);
    assert!(
        ports
            .iter()
            .all(|port| *port >= 1024 && !(30_000..=32_767).contains(port)),
        "a port below 1024 or in the NodePort range was handed out"
    );
    assert_eq!(harness.counter(Counter::EgressDropNoPort), 0);

    // The node's own flow from a port no pod holds passes as it is, untracked.
    let free = (32_768..=65_535_u16)
        .find(|port| !ports.contains(port))
        .expect("a free port");
    let entries = harness.nat().len();
    let node = Packet::udp(&format!("192.0.2.1:{free}"), remote).frame();
    assert_eq!(harness.egress(&node).frame, node);
    assert_eq!(harness.nat().len(), entries, "the node's flow was tracked");
    // One from a port a pod's flow holds towards that remote gets another.
    let held = *ports.iter().next_back().expect("a port");
    let clash = egress_ok(&harness, &Packet::udp(&format!("192.0.2.1:{held}"), remote));
    assert_ne!(clash.src_port(), held);
    assert_eq!(harness.counter(Counter::EgressHostRemapped), 1);
    let back = ingress_ok(
        &harness,
        &Packet::udp(remote, &format!("192.0.2.1:{}", clash.src_port())).frame(),
    );
    assert_eq!((back.dst, back.dst_port()), (node_ip(), held));
}

/// Issue 33, beyond conntrack: a pod that holds every port towards a remote cannot keep them
/// all from another pod. Once the collector has marked the remote busy, a new flow of another
/// pod that finds no port takes one from an unassured flow of the pod holding more, until the
/// two hold about as many; then it is refused.
#[test]
fn a_pod_holding_every_port_towards_a_remote_shares_them_with_another() {
    use masq::datapath::gc;

    let mut harness = Harness::sized(32, 64);
    harness.configure(&[PortRange::new(20_000, 20_009)], true);
    let remote = "198.51.100.53:53";
    for flow in 0..10_u16 {
        egress_ok(
            &harness,
            &Packet::udp(&format!("10.244.1.5:{}", 40_000 + flow), remote),
        );
    }
    let refused = harness.egress(&Packet::udp("10.244.2.7:49999", remote).frame());
    assert_eq!(refused.action, Action::Drop, "no port is free");
    gc::collect(
        &mut harness.datapath.maps,
        &Timeouts::LINUX_DEFAULTS,
        gc::monotonic_now_ns(),
    )
    .expect("collect");

    let mut admitted = 0;
    for flow in 0..10_u16 {
        let run =
            harness.egress(&Packet::udp(&format!("10.244.2.7:{}", 50_000 + flow), remote).frame());
        if run.action != Action::Pass {
            break;
        }
        admitted += 1;
    }
    assert_eq!(admitted, 5, "{:?}", harness.evictions());
    assert_eq!(harness.evicted(EvictionCause::RemoteShare), 5);
    let held_by = |pod: &str| {
        harness
            .egress_mappings()
            .iter()
            .filter(|(key, _)| Ipv4Addr::from(key.src_addr) == addr(pod))
            .count()
    };
    assert_eq!((held_by("10.244.1.5"), held_by("10.244.2.7")), (5, 5));
}

/// The agent reads the NAT table in batches (garbage collection, `masq nat list`, metrics):
/// every entry of a table larger than one batch comes back, once.
#[test]
fn the_nat_table_is_read_whole_past_one_batch() {
    let mut harness = Harness::sized(32_768, 64);
    let mut written = std::collections::BTreeMap::new();
    for index in 0..10_000u32 {
        let [_, _, high, low] = index.to_be_bytes();
        let key = NatKeyV4::new(
            [10, 244, high, low],
            [192, 0, 2, 9],
            u16::try_from(1024 + index % 50_000).unwrap(),
            443,
            6,
            Direction::Egress,
        );
        let entry = NatEntryV4::new(
            [192, 0, 2, 1],
            u16::try_from(index % 60_000).unwrap(),
            ORIGIN_HOST,
            tcp::ESTABLISHED,
            u64::from(index),
            u64::from(index) * 2,
        );
        harness.datapath.maps.nat_v4.insert(key, entry, 0).unwrap();
        written.insert(format!("{key:?}"), entry);
    }
    let read = harness.nat();
    assert_eq!(read.len(), written.len(), "entries read");
    let read: std::collections::BTreeMap<_, _> = read
        .into_iter()
        .map(|(key, entry)| (format!("{key:?}"), entry))
        .collect();
    assert_eq!(read, written);
}

/// A private map set with the IPv6 maps sized for translation, as `--enable-ipv6` loads it.
fn dual_stack_maps() -> masq::datapath::object::Datapath {
    masq_testbed::netns::require_root();
    masq::datapath::object::Datapath::load(&masq::datapath::object::LoadOptions {
        nat_max_entries: 64,
        nomasq_max_entries: 8,
        ipv6: true,
        ..masq::datapath::object::LoadOptions::default()
    })
    .unwrap_or_else(|error| panic!("loading the datapath: {error}"))
}

fn v6(text: &str) -> std::net::Ipv6Addr {
    text.parse()
        .unwrap_or_else(|error| panic!("{text:?} is not an IPv6 address: {error}"))
}

/// The IPv6 trie goes through the same diff sync as the IPv4 one: only changes are written,
/// a relabelled entry is a change, and a resync from the kernel's view repairs drift.
#[test]
fn the_ipv6_trie_is_diff_synced_like_the_ipv4_one() {
    use masq::datapath::sync::{TrieSync, TrieView, sync_nomasq};
    use masq_common::layout::NOMASQ_KIND_LINK_LOCAL;
    use std::collections::BTreeMap;

    let mut datapath = dual_stack_maps();
    let maps = &mut datapath.maps;
    let first: BTreeMap<(std::net::Ipv6Addr, u8), u32> = [
        ((v6("fe80::"), 10), NOMASQ_KIND_LINK_LOCAL),
        ((v6("2001:db8:10::"), 48), NOMASQ_KIND_CIDR),
        ((v6("2001:db8:20::"), 48), NOMASQ_KIND_CIDR),
    ]
    .into();
    let report =
        sync_nomasq(maps, &first.clone().into(), TrieView::LastSynced).expect("first sync");
    assert_eq!(
        report,
        TrieSync {
            added: 3,
            removed: 0,
            unchanged: 0
        }
    );

    let mut second = first.clone();
    second.remove(&(v6("2001:db8:20::"), 48));
    second.insert((v6("2001:db8:10::"), 48), NOMASQ_KIND_LINK_LOCAL);
    second.insert((v6("2001:db8:30::"), 64), NOMASQ_KIND_CIDR);
    let report =
        sync_nomasq(maps, &second.clone().into(), TrieView::LastSynced).expect("second sync");
    assert_eq!(
        report,
        TrieSync {
            added: 2,
            removed: 1,
            unchanged: 1
        }
    );
    let held: BTreeMap<_, _> = maps
        .trie_entries::<std::net::Ipv6Addr>()
        .expect("reading the trie")
        .into_iter()
        .collect();
    assert_eq!(held, second);
    // The IPv4 trie is another map: untouched.
    assert!(
        maps.nomasq_entries()
            .expect("reading the IPv4 trie")
            .is_empty()
    );

    // A hand edit is invisible to the last-synced view and repaired from the kernel's.
    maps.nomasq_v6
        .remove(&aya::maps::lpm_trie::Key::new(
            64,
            v6("2001:db8:30::").octets(),
        ))
        .expect("hand edit");
    let report = sync_nomasq(maps, &second.clone().into(), TrieView::Kernel).expect("resync");
    assert_eq!(
        report,
        TrieSync {
            added: 1,
            removed: 0,
            unchanged: 2
        }
    );
}

/// Issue 24, point 5: the collector re-read an expired flow ("still expired") and then deleted
/// it; a packet between the two refreshed the flow, which lost its mapping all the same and
/// went on mid-stream without one. Now the halves are taken out with their values at that
/// instant, and a flow a packet refreshed after the judgement (from either end) is put back.
#[test]
fn the_collector_keeps_a_flow_a_packet_refreshed_after_it_was_judged() {
    use masq::datapath::gc;

    let mut harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let out = handshake(&harness, pod, "203.0.113.10:443");
    let halves = |harness: &Harness| {
        let key = |direction| half(harness, direction).map(|(key, _)| key);
        (key(Direction::Egress), key(Direction::Ingress))
    };
    let (Some(egress_key), Some(ingress_key)) = halves(&harness) else {
        panic!("the flow has two halves: {:?}", harness.nat());
    };
    // The collector's judgement: the table as it reads it, the flow idle for longer than an
    // established flow may be by its clock.
    let judge = |harness: &Harness| {
        let lifetime = tcp_lifetime(harness);
        let late = gc::monotonic_now_ns() + lifetime + seconds(1);
        let (egress, ingress) = flow(harness);
        assert!(
            late - last_activity(&egress, Some(&ingress)) > lifetime,
            "expired by the collector's clock"
        );
        gc::Judged::new(egress_key, egress, Some((ingress_key, Some(ingress))))
    };
    let pod_packet = Packet::tcp(pod, "203.0.113.10:443", TCP_ACK)
        .seq(POD_ISN + 1)
        .ack(REMOTE_ISN + 1)
        .payload(b"more");
    let reply_packet = tcp_reply_to(&out, TCP_ACK)
        .seq(REMOTE_ISN + 1)
        .ack(POD_ISN + 1)
        .payload(b"more");

    // A packet a refresh interval after the last refresh writes to its half. Between the
    // judgement and the removal: the pod's, then (another round) the remote's.
    let from_the_pod = |harness: &Harness| drop(egress_ok(harness, &pod_packet));
    let from_the_remote = |harness: &Harness| drop(ingress_ok(harness, &reply_packet.frame()));
    let refreshes: [&dyn Fn(&Harness); 2] = [&from_the_pod, &from_the_remote];
    for refresh in refreshes {
        std::thread::sleep(std::time::Duration::from_millis(1_100));
        let judged = judge(&harness);
        refresh(&harness);
        assert!(
            !gc::retire(&mut harness.datapath.maps, &judged).expect("retiring"),
            "a refreshed flow was removed"
        );
        assert_eq!(
            halves(&harness),
            (Some(egress_key), Some(ingress_key)),
            "both halves are back"
        );
        let next = egress_ok(&harness, &pod_packet);
        assert_eq!(
            (next.src, next.src_port()),
            (out.src, out.src_port()),
            "the flow keeps its mapping"
        );
    }

    // Without a packet in between, the judgement stands.
    let judged = judge(&harness);
    assert!(gc::retire(&mut harness.datapath.maps, &judged).expect("retiring"));
    assert!(harness.nat().is_empty(), "{:?}", harness.nat());
}

/// Issue 24, point 5: a TCP segment that needs masquerading but whose mapping is gone (the flow
/// idled past its lifetime, or its address left the uplink) left with the pod's own address.
/// A flow masq removed is remembered: its next segment gets its old mapping back, or a new one
/// on a new address, as conntrack picks a lost flow up.
#[test]
fn a_late_segment_of_a_removed_connection_never_leaves_with_the_pods_address() {
    use masq::datapath::gc;

    let mut harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let remote = "203.0.113.10:443";
    let out = handshake(&harness, pod, remote);
    let segment = Packet::tcp(pod, remote, TCP_ACK | TCP_PSH)
        .seq(POD_ISN + 1)
        .ack(REMOTE_ISN + 1)
        .payload(b"after a long pause");

    // Idle past the established lifetime: collected.
    let timeouts = Timeouts::LINUX_DEFAULTS;
    let late = gc::monotonic_now_ns() + tcp_lifetime(&harness) + seconds(1);
    let report = gc::collect(&mut harness.datapath.maps, &timeouts, late).expect("collect");
    assert_eq!(report.ipv4.expired, 1, "{report:?}");
    assert!(harness.nat().is_empty());

    let back = egress_ok(&harness, &segment);
    assert_eq!(
        (back.src, back.src_port()),
        (out.src, out.src_port()),
        "the connection gets its node port back"
    );
    assert_eq!(harness.counter(Counter::EgressTcpRevived), 1);
    assert_eq!(harness.counter(Counter::EgressTcpMidstreamPassed), 0);
    let reply = ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_ACK)
            .seq(REMOTE_ISN + 1)
            .ack(POD_ISN + 19)
            .payload(b"welcome back")
            .frame(),
    );
    assert_eq!(reply.dst.to_string(), POD);
    assert_eq!(reply.dst_port(), 40_000);

    // The uplink is renumbered: the flow is flushed, and its next segment is picked up on the
    // new address.
    let renumbered: Ipv4Addr = "192.0.2.3".parse().expect("address");
    harness.set_uplink(Some(renumbered));
    let flushed =
        gc::flush_address(&mut harness.datapath.maps, node_ip().octets()).expect("flushing");
    assert_eq!(flushed, 1);
    let moved = egress_ok(&harness, &segment);
    assert_eq!(moved.src, renumbered, "picked up on the new address");
    assert_eq!(harness.counter(Counter::EgressTcpMidstreamPassed), 0);

    // A segment of a connection masq never translated (one opened from outside) still passes
    // as it is, as conntrack leaves the flows it holds untranslated.
    let inbound = Packet::tcp("10.244.1.5:8080", "203.0.113.10:50000", TCP_ACK).frame();
    assert_eq!(harness.egress(&inbound).frame, inbound);
    assert_eq!(harness.counter(Counter::EgressTcpMidstreamPassed), 1);
}

/// Issue 32, point 5: the uplink's address changes but the old one stays on the interface
/// (the kernel's preferred source moved on): the flows mapped to the old address carry on, both
/// ways, new flows take the new address, and the node's own packets from the old address stay
/// the node's, as under MASQUERADE, which forgets a flow only when its address is removed.
#[test]
fn flows_of_a_former_address_still_on_the_interface_carry_on() {
    let mut harness = Harness::new();
    let pod = "10.244.1.5:40000";
    let remote = "203.0.113.10:443";
    let out = handshake(&harness, pod, remote);
    let renumbered: Ipv4Addr = "192.0.2.3".parse().expect("address");
    harness.set_uplink_renumbered(renumbered, node_ip());

    let next = egress_ok(
        &harness,
        &Packet::tcp(pod, remote, TCP_ACK)
            .seq(POD_ISN + 1)
            .ack(REMOTE_ISN + 1)
            .payload(b"more"),
    );
    assert_eq!((next.src, next.src_port()), (out.src, out.src_port()));
    let back = ingress_ok(
        &harness,
        &tcp_reply_to(&out, TCP_ACK)
            .seq(REMOTE_ISN + 1)
            .ack(POD_ISN + 5)
            .payload(b"reply")
            .frame(),
    );
    assert_eq!((back.dst, back.dst_port()), (addr(POD), 40_000));

    let new_flow = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40001", remote, TCP_SYN).payload(b""),
    );
    assert_eq!(new_flow.src, renumbered);

    // The node's own connection on the old address is left alone, not masqueraded.
    let node_packet = Packet::tcp("192.0.2.1:45000", remote, TCP_ACK).frame();
    assert_eq!(harness.egress(&node_packet).frame, node_packet);
    assert_eq!(harness.counter(Counter::EgressHostPassed), 1);
}

/// Issue 32, point 6: a flow adopted from upstream's conntrack keeps the node port upstream
/// gave it, usually inside the node's own ephemeral range. A node connection that later picks
/// that port towards the same remote would have its replies delivered to the pod; conntrack
/// gives such a clashing connection another port (its null binding), and so does masq: the
/// node's replies reach the node, the pod's reach the pod.
#[test]
fn a_node_connection_that_clashes_with_an_adopted_flow_gets_another_port() {
    use masq::datapath::{gc, maps::KernelFlow};

    let mut harness = Harness::new();
    let adopted = KernelFlow {
        protocol: proto::TCP,
        source: addr(POD).octets(),
        source_port: 40_000,
        node: node_ip().octets(),
        node_port: 45_000,
        remote: addr(REMOTE).octets(),
        remote_port: 443,
        replied: true,
    };
    harness
        .datapath
        .maps
        .insert_kernel_flow(&adopted, gc::monotonic_now_ns())
        .expect("adopting the flow");

    let node_syn = Packet::tcp("192.0.2.1:45000", "203.0.113.10:443", TCP_SYN).payload(b"");
    let out = egress_ok(&harness, &node_syn);
    assert_eq!(out.src, node_ip());
    assert_ne!(
        out.src_port(),
        45_000,
        "the node's connection keeps the pod's port"
    );
    assert_eq!(harness.counter(Counter::EgressHostRemapped), 1);

    let to_node = ingress_ok(&harness, &tcp_reply_to(&out, TCP_SYN | TCP_ACK).frame());
    assert_eq!(
        (to_node.dst, to_node.dst_port()),
        (node_ip(), 45_000),
        "the node's reply reaches the node's socket"
    );
    let to_pod = ingress_ok(
        &harness,
        &Packet::tcp("203.0.113.10:443", "192.0.2.1:45000", TCP_ACK).frame(),
    );
    assert_eq!((to_pod.dst, to_pod.dst_port()), (addr(POD), 40_000));
}

/// Expired IPv6 flows are collected by the same collector as IPv4 ones, and live ones stay.
#[test]
fn expired_ipv6_flows_are_collected() {
    use masq::datapath::gc;
    use masq_common::nat::{NatEntryV6, NatKeyV6, ORIGIN_POD};

    let mut datapath = dual_stack_maps();
    let maps = &mut datapath.maps;
    let second = 1_000_000_000;
    let mut insert_flow = |pod_port: u16, created_ns: u64| {
        let egress_key = NatKeyV6::new(
            v6("2001:db8:244:1::5").octets(),
            v6("2001:db8:ff::1").octets(),
            pod_port,
            53,
            proto::UDP,
            Direction::Egress,
        );
        let egress = NatEntryV6::new(
            v6("2001:db8::1").octets(),
            pod_port + 10_000,
            ORIGIN_POD,
            datagram::UNREPLIED,
            created_ns,
            created_ns,
        );
        let ingress_key = egress_key.peer(&egress);
        let ingress = egress_key.peer_entry(&egress);
        maps.nat_v6
            .insert(egress_key, egress, 0)
            .expect("egress half");
        maps.nat_v6
            .insert(ingress_key, ingress, 0)
            .expect("ingress half");
    };
    insert_flow(4000, second);
    insert_flow(4001, 100 * second);
    let report = gc::collect(maps, &Timeouts::LINUX_DEFAULTS, 110 * second).expect("collect");
    assert_eq!(report.ipv6.flows, 2);
    assert_eq!(report.ipv6.entries, 4);
    assert_eq!(report.ipv6.expired, 1, "{report:?}");
    assert_eq!(report.ipv4, gc::GcReport::default());
    let left = maps
        .nat_entries_of::<[u8; 16]>()
        .expect("reading the table");
    assert_eq!(left.len(), 2);
    assert!(
        left.iter()
            .all(|(key, _)| key.src_port == 4001 || key.dst_port == 14_001)
    );
}

/// Issue 26, `masqueradeCIDRs`: one destination trie, the longest matching prefix decides. A
/// masquerade entry inside an exempt range masquerades its destinations, the rest of the range
/// stays exempt, and a keep entry inside the masquerade entry keeps again (three deep).
#[test]
fn the_longest_prefix_decides_between_masquerade_and_keep_entries() {
    let mut harness = Harness::new();
    harness.add_nomasq("10.100.10.0/24", NOMASQ_KIND_MASQUERADE);
    harness.add_nomasq("10.100.10.99/32", NOMASQ_KIND_CIDR);

    let out = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "10.100.10.5:443", TCP_SYN),
    );
    assert_eq!(out.src, node_ip(), "{:?}", harness.counters());
    assert_eq!(harness.counter(Counter::EgressNewMapping), 1);
    let mappings = harness.egress_mappings();
    assert_eq!(mappings.len(), 1, "{mappings:?}");
    assert_eq!(mappings[0].0.dst_addr, addr("10.100.10.5").octets());
    assert_eq!(mappings[0].1.addr, node_ip().octets());
    // Its replies come back to the pod.
    let back = ingress_ok(&harness, &tcp_reply_to(&out, TCP_SYN | TCP_ACK).frame());
    assert_eq!((back.dst, back.dst_port()), (addr(POD), 40_000));

    for destination in ["10.100.11.5:443", "10.100.10.99:443"] {
        let frame = Packet::tcp("10.244.1.5:40001", destination, TCP_SYN).frame();
        let out = harness.egress(&frame);
        assert_eq!(
            (out.action, &out.frame),
            (Action::Pass, &frame),
            "{destination} must keep the pod address"
        );
    }
    assert_eq!(harness.counter(Counter::EgressExemptCidr), 2);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 1);
    assert_eq!(harness.egress_mappings().len(), 1);
}

/// A masquerade entry is no exemption for inbound UDP either: a flow a masqueraded remote opens
/// towards a pod is remembered, so the pod's answer leaves untranslated as conntrack has it.
#[test]
fn udp_from_a_masqueraded_remote_inside_an_exempt_range_is_tracked() {
    let mut harness = Harness::new();
    harness.add_nomasq("10.100.10.0/24", NOMASQ_KIND_MASQUERADE);
    let inbound = Packet::udp("10.100.10.5:5000", "10.244.1.5:53").frame();
    assert_eq!(harness.ingress(&inbound).frame, inbound);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
    let answer = Packet::udp("10.244.1.5:53", "10.100.10.5:5000").frame();
    assert_eq!(harness.egress(&answer).frame, answer);
    assert_eq!(harness.counter(Counter::EgressInboundReply), 1);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 0);
}

/// An exempt pod's answers are never masqueraded, so UDP from outside to it needs no entry:
/// the ingress program asks the policy the egress program asks, source exemptions included.
#[test]
fn udp_to_an_exempt_source_is_not_tracked() {
    let mut harness = Harness::new();
    harness.add_nomasq_src("100.64.0.0/24");
    harness.set_source_exemptions(true);
    let inbound = Packet::udp("203.0.113.7:5000", "100.64.0.5:53").frame();
    assert_eq!(harness.ingress(&inbound).frame, inbound);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 0);
    assert_eq!(harness.counter(Counter::IngressPassed), 1);
    let answer = Packet::udp("100.64.0.5:53", "203.0.113.7:5000").frame();
    assert_eq!(harness.egress(&answer).frame, answer);
    assert_eq!(harness.counter(Counter::EgressExemptSource), 1);
    assert!(
        harness.egress_mappings().is_empty(),
        "no entry for the exempt pod's flow"
    );
    // Another pod's inbound flow is still tracked.
    let other = Packet::udp("203.0.113.7:5000", "10.244.1.5:53").frame();
    assert_eq!(harness.ingress(&other).frame, other);
    assert_eq!(harness.counter(Counter::IngressInboundTracked), 1);
}

/// Issue 26, `nonMasqueradeSrcCIDRs`: a pod in the source trie is never masqueraded, whatever
/// the destination, once the settings flag says the trie holds entries; until then its flows
/// are masqueraded (the flag gates the lookup), and a flow mapped before keeps its mapping.
#[test]
fn a_source_in_the_source_trie_passes_once_the_settings_flag_it() {
    let mut harness = Harness::new();
    harness.add_nomasq("10.100.10.0/24", NOMASQ_KIND_MASQUERADE);
    harness.add_nomasq_src("100.64.0.0/24");

    // Entries but no flag: not looked up.
    let before = egress_ok(
        &harness,
        &Packet::tcp("100.64.0.5:40000", "203.0.113.7:443", TCP_SYN),
    );
    assert_eq!(before.src, node_ip());
    assert_eq!(harness.counter(Counter::EgressExemptSource), 0);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 1);

    harness.set_source_exemptions(true);
    for destination in ["203.0.113.7:443", "10.100.10.5:443"] {
        let frame = Packet::tcp("100.64.0.5:40001", destination, TCP_SYN).frame();
        let out = harness.egress(&frame);
        assert_eq!(
            (out.action, &out.frame),
            (Action::Pass, &frame),
            "100.64.0.5 to {destination} must keep the pod address"
        );
    }
    assert_eq!(harness.counter(Counter::EgressExemptSource), 2);
    assert_eq!(harness.counter(Counter::EgressNewMapping), 1);
    assert_eq!(harness.egress_mappings().len(), 1, "no mapping for them");

    // The flow mapped before the flag keeps its translation, as a config change never
    // re-translates a live flow.
    let live = egress_ok(
        &harness,
        &Packet::tcp("100.64.0.5:40000", "203.0.113.7:443", TCP_ACK),
    );
    assert_eq!((live.src, live.src_port()), (before.src, before.src_port()));
    // Another pod is masqueraded as before.
    let other = egress_ok(
        &harness,
        &Packet::tcp("10.244.1.5:40000", "203.0.113.7:443", TCP_SYN),
    );
    assert_eq!(other.src, node_ip());
    assert_eq!(harness.counter(Counter::EgressNewMapping), 2);

    // Cleared again: looked up no more.
    harness.set_source_exemptions(false);
    let after = egress_ok(&harness, &Packet::udp("100.64.0.5:5353", "203.0.113.7:53"));
    assert_eq!(after.src, node_ip());
    assert_eq!(harness.counter(Counter::EgressExemptSource), 2);
}

/// A later fragment whose first fragment was not seen is decided by the policy, as its first
/// fragment would have been: an exempt source passes, a masquerade entry inside an exempt range
/// masquerades.
#[test]
fn an_unmatched_later_fragment_follows_the_source_and_masquerade_entries() {
    let mut harness = Harness::new();
    harness.add_nomasq("10.100.10.0/24", NOMASQ_KIND_MASQUERADE);
    harness.add_nomasq_src("100.64.0.0/24");
    harness.set_source_exemptions(true);

    let exempt = Packet::udp("100.64.0.5:0", "203.0.113.7:0")
        .ip_id(0x7171)
        .later_fragment(5, false, &[9; 24])
        .frame();
    let out = harness.egress(&exempt);
    assert_eq!((out.action, &out.frame), (Action::Pass, &exempt));
    assert_eq!(harness.counter(Counter::EgressExemptSource), 1);

    let masqueraded = Packet::udp("10.244.1.5:0", "10.100.10.5:0")
        .ip_id(0x7272)
        .later_fragment(5, false, &[9; 24]);
    let out = egress_ok(&harness, &masqueraded);
    assert_eq!(out.src, node_ip(), "{:?}", harness.counters());
    assert_eq!(harness.counter(Counter::EgressFragmentTranslated), 1);

    let kept = Packet::udp("10.244.1.5:0", "10.100.11.5:0")
        .ip_id(0x7373)
        .later_fragment(5, false, &[9; 24])
        .frame();
    assert_eq!(harness.egress(&kept).frame, kept);
    assert_eq!(harness.counter(Counter::EgressExemptCidr), 1);
}

/// A trie that fails after others were synced puts them back, also on the very first sync,
/// when nothing synced before says what they held: a config is applied whole or not at all.
/// (A source trie with room for one entry, where the agent expects thousands, stands in for a
/// kernel refusing a later write.)
#[test]
fn a_failed_first_sync_leaves_every_trie_as_it_was() {
    use masq::datapath::sync::{TrieView, WantedTries, sync_tries};
    use masq_common::layout::NOMASQ_KIND_SOURCE;

    let mut datapath = dual_stack_maps();
    let maps = &mut datapath.maps;
    let pin = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/masq-test-small-trie-{}",
        std::process::id()
    ));
    let created = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&pin)
        .args(["type", "lpm_trie", "key", "8", "value", "4", "entries", "1"])
        .args(["name", "masq_small_trie", "flags", "1"])
        .output()
        .expect("running bpftool");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let small = aya::maps::MapData::from_pin(&pin);
    let _ = std::fs::remove_file(&pin);
    maps.nomasq_src_v4 = aya::maps::LpmTrie::try_from(aya::maps::Map::LpmTrie(
        small.expect("opening the small trie"),
    ))
    .expect("a trie");
    let wanted = WantedTries {
        destinations_v4: [((Ipv4Addr::new(10, 0, 0, 0), 8), NOMASQ_KIND_CIDR)]
            .into_iter()
            .collect(),
        destinations_v6: [((v6("2001:db8:ab::"), 48), NOMASQ_KIND_CIDR)]
            .into_iter()
            .collect(),
        sources_v4: [
            ((Ipv4Addr::new(100, 64, 0, 0), 24), NOMASQ_KIND_SOURCE),
            ((Ipv4Addr::new(100, 65, 0, 0), 24), NOMASQ_KIND_SOURCE),
        ]
        .into_iter()
        .collect(),
        ..WantedTries::default()
    };
    let failed = sync_tries(maps, &wanted, TrieView::LastSynced);
    assert!(failed.is_err(), "the full source trie fails the sync");
    assert_eq!(maps.nomasq_entries().expect("IPv4 trie"), Vec::new());
    assert_eq!(
        maps.trie_entries::<std::net::Ipv6Addr>()
            .expect("IPv6 trie"),
        Vec::new()
    );
    // What the tries hold is then read from the kernel: a later sync still writes everything.
    let without_sources = WantedTries {
        sources_v4: std::iter::empty().collect(),
        ..wanted
    };
    sync_tries(maps, &without_sources, TrieView::LastSynced).expect("second sync");
    assert_eq!(maps.nomasq_entries().expect("IPv4 trie").len(), 1);
    assert_eq!(
        maps.trie_entries::<std::net::Ipv6Addr>()
            .expect("IPv6 trie")
            .len(),
        1
    );
}

/// The source tries go through the same diff sync as the destination tries, all four together:
/// a config too big for one source trie changes no trie at all, and a sync that empties the
/// source tries says the datapath need not look sources up any more.
#[test]
fn the_source_tries_are_synced_with_the_destination_tries_whole_or_not_at_all() {
    use masq::datapath::{
        DatapathError,
        maps::Trie,
        sync::{TrieSync, TrieView, WantedTries, sync_tries},
    };
    use masq_common::layout::{NOMASQ_KIND_SOURCE, NOMASQ_SRC_MAX_ENTRIES};
    use std::collections::BTreeMap;

    let mut datapath = dual_stack_maps();
    let maps = &mut datapath.maps;
    let v4 = |text: &str| -> Ipv4Addr { text.parse().expect("IPv4 address") };
    let wanted = WantedTries {
        destinations_v4: [
            ((v4("10.0.0.0"), 8), NOMASQ_KIND_CIDR),
            ((v4("10.100.10.0"), 24), NOMASQ_KIND_MASQUERADE),
        ]
        .into_iter()
        .collect(),
        sources_v4: [((v4("100.64.0.0"), 24), NOMASQ_KIND_SOURCE)]
            .into_iter()
            .collect(),
        sources_v6: [((v6("2001:db8:ab::"), 48), NOMASQ_KIND_SOURCE)]
            .into_iter()
            .collect(),
        ..WantedTries::default()
    };
    assert!(wanted.source_exemptions());
    let reports = sync_tries(maps, &wanted, TrieView::LastSynced).expect("first sync");
    let added: Vec<(Trie, usize)> = reports
        .iter()
        .map(|(_, trie, report)| (*trie, report.added))
        .collect();
    assert_eq!(
        added,
        [
            (Trie::Destinations, 2),
            (Trie::Destinations, 0),
            (Trie::Sources, 1),
            (Trie::Sources, 1)
        ]
    );
    let sources_v4: BTreeMap<_, _> = maps
        .trie_entries_of::<Ipv4Addr>(Trie::Sources)
        .expect("reading the IPv4 source trie")
        .into_iter()
        .collect();
    assert_eq!(
        sources_v4,
        BTreeMap::from([((v4("100.64.0.0"), 24), NOMASQ_KIND_SOURCE)])
    );
    assert_eq!(
        maps.trie_entries_of::<std::net::Ipv6Addr>(Trie::Sources)
            .expect("reading the IPv6 source trie"),
        [((v6("2001:db8:ab::"), 48), NOMASQ_KIND_SOURCE)]
    );
    assert_eq!(maps.nomasq_entries().expect("IPv4 trie").len(), 2);

    // One source trie overflowing: refused before anything changes.
    let too_many = WantedTries {
        destinations_v4: std::iter::empty().collect(),
        sources_v4: (0..=NOMASQ_SRC_MAX_ENTRIES)
            .map(|index| {
                (
                    (Ipv4Addr::from(0x6440_0000 + index), 32),
                    NOMASQ_KIND_SOURCE,
                )
            })
            .collect(),
        ..wanted.clone()
    };
    match sync_tries(maps, &too_many, TrieView::LastSynced) {
        Err(DatapathError::TrieCapacity(error)) => assert_eq!(error.trie, Trie::Sources),
        other => panic!("expected a capacity error, got {other:?}"),
    }
    assert_eq!(maps.nomasq_entries().expect("IPv4 trie").len(), 2);
    assert_eq!(
        maps.trie_entries_of::<Ipv4Addr>(Trie::Sources)
            .expect("IPv4 source trie")
            .len(),
        1
    );

    // A config without source CIDRs empties the source tries, only them.
    let emptied = WantedTries {
        sources_v4: std::iter::empty().collect(),
        sources_v6: std::iter::empty().collect(),
        ..wanted.clone()
    };
    assert!(!emptied.source_exemptions());
    let reports = sync_tries(maps, &emptied, TrieView::LastSynced).expect("emptying sync");
    assert_eq!(
        reports[2].2,
        TrieSync {
            added: 0,
            removed: 1,
            unchanged: 0
        }
    );
    assert_eq!(reports[0].2.unchanged, 2);
    assert!(
        maps.trie_entries_of::<Ipv4Addr>(Trie::Sources)
            .expect("IPv4 source trie")
            .is_empty()
    );
    assert!(
        maps.trie_entries_of::<std::net::Ipv6Addr>(Trie::Sources)
            .expect("IPv6 source trie")
            .is_empty()
    );
    assert_eq!(maps.nomasq_entries().expect("IPv4 trie").len(), 2);
}

/// Removes a test's pin directory however the test ends.
struct PinsGuard(masq::datapath::pins::PinDir);

impl Drop for PinsGuard {
    fn drop(&mut self) {
        let _ = self.0.remove_all();
    }
}

/// A pinned map of the right name but another shape is refused rather than adopted (the
/// programs would misread it), and uninstall removes every pin and the directory.
#[test]
fn a_pinned_map_of_another_shape_is_refused_and_uninstall_removes_every_pin() {
    use masq::datapath::{
        object::{Datapath, LoadOptions},
        pins::{PinDir, PinnedState},
    };
    use masq_common::layout::{MAP_NOMASQ_SRC_V6, MapMeta};

    masq_testbed::netns::require_root();
    let root = std::path::PathBuf::from(format!(
        "/sys/fs/bpf/masq-test-shape-{}",
        std::process::id()
    ));
    let pins = PinsGuard(PinDir::new(&root));
    pins.0.create().expect("creating the pin directory");
    let options = LoadOptions {
        nat_max_entries: 64,
        nomasq_max_entries: 8,
        pin_dir: Some(root.clone()),
        ..LoadOptions::default()
    };
    {
        let mut datapath = Datapath::load(&options).expect("loading with pins");
        datapath
            .maps
            .set_meta(&MapMeta::current(64))
            .expect("stamping the layout");
    }
    assert!(matches!(
        pins.0.inspect().expect("inspecting"),
        PinnedState::Compatible { .. }
    ));

    std::fs::remove_file(pins.0.map(MAP_NOMASQ_SRC_V6)).expect("unpinning");
    let created = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(pins.0.map(MAP_NOMASQ_SRC_V6))
        .args(["type", "hash", "key", "20", "value", "4", "entries", "4"])
        .args(["name", MAP_NOMASQ_SRC_V6])
        .output()
        .expect("running bpftool");
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    match pins.0.inspect().expect("inspecting") {
        PinnedState::Incompatible(detail) => {
            assert!(detail.contains(MAP_NOMASQ_SRC_V6), "{detail}");
        }
        other => panic!("a hash where the trie belongs must be refused, got {other:?}"),
    }

    pins.0.remove_all().expect("removing the pins");
    assert!(!root.exists());
}
