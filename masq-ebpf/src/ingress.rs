//! The ingress classifier: restores pod addresses on replies of masqueraded flows. Its
//! programs: `masq_ingress` and `masq_ingress6` (every arriving packet), `masq_icmp6_ingress`
//! (an ICMPv6 error), and `masq_reverse_nat`, where a packet the fast path handed on ends its
//! tail calls.
//!
//! Only packets addressed to the node can be replies; of those, only the ones whose tuple has
//! an ingress mapping are touched. Everything else (the node's own traffic, traffic routed to
//! pods directly) passes exactly as it arrived.

use aya_ebpf::programs::TcContext;
use masq_common::{
    counters::Counter,
    flow::TcpSegment,
    layout::PROG_SLOT_INGRESS_V6,
    nat::{Direction, EVENT_INBOUND, EVENT_REVIVE, EVENT_TRACK, NatKey, ORIGIN_INBOUND, proto},
};

use crate::{
    address::V6,
    counters::count_in,
    family, frag,
    handoff::{self, Request},
    icmp, maps,
    nat::{self, Mapping},
    packet::{self, EarlyOutcomes, Frame6, Ip, Kind, Parse},
    policy,
    rewrite::{self, End, Rewrite},
    verdict::Verdict,
};

/// Entry point of `masq_ingress`: IPv4 here, IPv6 in `masq_ingress6`, which it tail-calls.
#[inline(always)]
pub(crate) fn classify(ctx: &TcContext) -> i32 {
    let outcomes = EarlyOutcomes {
        not_ipv4: Counter::IngressNotIpv4,
        malformed: Counter::IngressMalformed,
        ipv6_program: Some(PROG_SLOT_INGRESS_V6),
    };
    let Some(ip) = packet::classifiable(ctx, &outcomes) else {
        return Verdict::Pass.tc_action();
    };
    classify_ip(ctx, &ip).tc_action()
}

/// Entry point of `masq_ingress6`: an IPv6 frame arriving on an uplink.
#[inline(always)]
pub(crate) fn classify_v6(ctx: &TcContext) -> i32 {
    let ip = match packet::parse_ipv6(ctx) {
        Frame6::Ipv6(ip) => ip,
        Frame6::Malformed => {
            count_in::<V6>(Counter::IngressMalformed);
            return Verdict::Pass.tc_action();
        }
        Frame6::TooManyExtensions => {
            count_in::<V6>(Counter::IngressPassed);
            return Verdict::Pass.tc_action();
        }
    };
    classify_ip(ctx, &ip).tc_action()
}

/// Entry point of `masq_icmp6_ingress`: the ICMPv6 error `masq_ingress6` found.
#[inline(always)]
pub(crate) fn icmp_error_v6(ctx: &TcContext) -> i32 {
    let Frame6::Ipv6(ip) = packet::parse_ipv6(ctx) else {
        count_in::<V6>(Counter::IngressMalformed);
        return Verdict::Pass.tc_action();
    };
    icmp::ingress::<V6>(ctx, &ip).tc_action()
}

/// Restores the pod's address on a reply of family `A`.
#[inline(always)]
fn classify_ip<A: Parse + Rewrite>(ctx: &TcContext, ip: &Ip<A>) -> Verdict {
    let ip = *ip;
    let (Some(settings), Some(addrs)) = (maps::settings(), family::uplink_addrs::<A>(ctx)) else {
        count_in::<A>(Counter::IngressNotConfigured);
        return Verdict::Pass;
    };
    // Replies to the interface's former address belong to flows that live on.
    let node_ip = addrs.serving(ip.dst);
    // Replies come back to the address of the interface they arrive on, as with MASQUERADE on
    // a node whose routing is symmetric.
    if ip.dst != node_ip {
        // Routed to a pod directly. A UDP flow from a masqueraded address is remembered so the
        // pod's answers are not masqueraded as new flows (TCP needs nothing: only a SYN opens
        // a mapping).
        if ip.protocol == proto::UDP
            && !ip.is_later_fragment()
            && let Some((src, dst)) = packet::udp_ports(ctx, &ip)
            // Most traffic to pods comes from in-cluster addresses the pod's answers keep their
            // address towards: the policy answers for those without the NAT table.
            && policy::pod_exemption(settings, ip.dst, ip.src).is_none()
        {
            let key = NatKey::new(ip.dst, ip.src, dst, src, proto::UDP, Direction::Egress);
            let event = match nat::lookup(&key, false, &TcpSegment::default()) {
                Some(mapping) if mapping.quiet != 0 => None,
                Some(_) => Some(EVENT_TRACK),
                None => Some(EVENT_INBOUND),
            };
            if let Some(event) = event {
                let request = Request {
                    key: &key,
                    node_addr: node_ip,
                    origin: ORIGIN_INBOUND,
                    event,
                    counter: Counter::IngressInboundTracked,
                    segment: &TcpSegment::default(),
                };
                handoff::hand_over(ctx, &request, A::SLOT_FLOW_EVENT);
            }
        }
        count_in::<A>(Counter::IngressPassed);
        return Verdict::Pass;
    }
    if ip.is_later_fragment() {
        return frag::ingress(ctx, &ip);
    }
    // As on egress: a first fragment is left alone unless a path below translates it, and its
    // later fragments must follow it, not an older datagram's record.
    frag::remember(&ip, Direction::Ingress, None);
    let Ok(transport) = packet::transport(ctx, &ip) else {
        count_in::<A>(Counter::IngressMalformed);
        return Verdict::Pass;
    };
    let tcp_opens = transport.tcp_opens();
    let (src_port, dst_port) = match transport.kind {
        Kind::Ports => (transport.src, transport.dst),
        Kind::IcmpQuery if !transport.request => (0, transport.src),
        Kind::IcmpError => return icmp::ingress_error(ctx, &ip),
        Kind::IcmpQuery | Kind::IcmpOther => {
            count_in::<A>(Counter::IngressPassed);
            return Verdict::Pass;
        }
        Kind::Other => (0, 0),
    };
    let key = &NatKey::new(
        ip.src,
        ip.dst,
        src_port,
        dst_port,
        ip.protocol,
        Direction::Ingress,
    );
    let found = nat::lookup(key, false, &transport.tcp);
    // A packet that moves its flow, or a reply of a TCP flow the agent removed (idle, or
    // mid-removal), which would reach the node's stack and reset the connection: the
    // flow-event program tracks it, brings the flow back, and has it rewritten.
    let event = match found {
        Some(mapping) if mapping.quiet == 0 => {
            Some((EVENT_TRACK, Counter::IngressReverseNat, A::SLOT_FLOW_EVENT))
        }
        None if ip.protocol == proto::TCP
            && settings.port_in_range(dst_port)
            && A::buried().get_ptr(key).is_some() =>
        {
            Some((EVENT_REVIVE, Counter::IngressTcpRevived, A::SLOT_ALLOCATOR))
        }
        _ => None,
    };
    if let Some((event, counter, program)) = event {
        let request = Request {
            key,
            node_addr: node_ip,
            origin: 0,
            event,
            counter,
            segment: &transport.tcp,
        };
        handoff::hand_over(ctx, &request, program);
        count_in::<A>(Counter::IngressPassed);
        return Verdict::Pass;
    }
    let Some(mapping) = found else {
        // No mapping: the stack gets the packet, as it does under conntrack. "No mapping and no
        // socket" does not make a stale reply: PREROUTING may DNAT it to a pod (a hostPort, a
        // Service's externalIPs), TPROXY may take it, or netfilter may still translate its
        // flow (one ip-masq-agent mapped before masq took over). Those in the SNAT range are
        // counted apart, for the operator who wonders where replies of expired flows went.
        let unmatched_in_range = matches!(ip.protocol, proto::TCP | proto::UDP)
            && !tcp_opens
            && settings.port_in_range(dst_port);
        count_in::<A>(if unmatched_in_range {
            Counter::IngressNoMappingPassed
        } else {
            Counter::IngressPassed
        });
        return Verdict::Pass;
    };
    translate(ctx, &ip, key, &mapping, Counter::IngressReverseNat)
}

/// Entry point of `masq_reverse_nat`: rewrites an arriving packet's destination with the
/// translation in the hand-off (one a flow event settled).
#[inline(always)]
pub(crate) fn reverse_nat<A: Parse + Rewrite>(ctx: &TcContext) -> i32 {
    let Some((key, mapping, counter)) = handoff::settled::<A>() else {
        count_in::<A>(Counter::IngressPassed);
        return Verdict::Pass.tc_action();
    };
    let counter = Counter::of(counter).unwrap_or(Counter::IngressReverseNat);
    let Some(ip) = A::parse_again(ctx, Counter::IngressMalformed) else {
        return Verdict::Pass.tc_action();
    };
    translate(ctx, &ip, &key, &mapping, counter).tc_action()
}

/// Rewrites an arriving packet's destination to the mapping's address and port.
#[inline(always)]
fn translate<A: Rewrite>(
    ctx: &TcContext,
    ip: &Ip<A>,
    key: &NatKey<A>,
    mapping: &Mapping<A>,
    counter: Counter,
) -> Verdict {
    let rewritten = rewrite::address_and_port(
        ctx,
        ip,
        End::Destination,
        mapping.addr,
        key.dst_port,
        mapping.port,
    );
    if rewritten.is_err() {
        count_in::<A>(Counter::IngressDropRewriteFailed);
        return Verdict::Drop;
    }
    frag::remember(ip, Direction::Ingress, Some(mapping.addr));
    count_in::<A>(counter);
    Verdict::Pass
}
