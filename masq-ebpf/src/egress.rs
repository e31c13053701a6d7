//! The egress classifier: source NAT towards masqueraded destinations. Its programs:
//! `masq_egress` and `masq_egress6` (every leaving packet), `masq_icmp6_egress` (an ICMPv6
//! error), and `masq_source_nat`, where a packet the fast path handed on ends its tail calls.
//!
//! Order of decisions for a packet leaving the uplink:
//!
//! 1. an existing mapping wins, whatever the policy says now: like iptables with conntrack, a
//!    config change never re-translates a live flow;
//! 2. the node's own packets stay as they are, except, with `--to-ports`, flows that use a port
//!    inside those ranges, which are tracked (keeping their port when free) so no pod flow can
//!    take it (ports shared with the node are kept from pods by the node's sockets instead);
//! 3. pods whose source is in `nonMasqueradeSrcCIDRs` keep their address, then destinations
//!    whose longest matching prefix in the non-masquerade trie is an exemption (not a
//!    `masqueradeCIDRs` entry) keep the pod address (see `policy`);
//! 4. everything else gets a new mapping to the node address, except TCP segments that cannot
//!    open a connection: those of a flow the agent removed get their mapping back (or a new
//!    one, see `nat::revive`), the others (replies of connections opened from outside) pass.
//!    New mappings are made by the allocator program, which this one tail-calls (see
//!    `allocator`).
//!
//! The node's own flows outside the SNAT range pass as they are, unless a pod's mapping holds
//! the tuple they would be answered on: then the node's flow gets another port, as conntrack
//! gives a clashing flow one (its "null binding"), so its replies reach the node, not the pod.

use aya_ebpf::programs::TcContext;
use masq_common::{
    counters::Counter,
    layout::PROG_SLOT_EGRESS_V6,
    nat::{
        Direction, EVENT_NEW_FLOW, EVENT_REVIVE, EVENT_TRACK, NatKey, ORIGIN_HOST, ORIGIN_INBOUND,
        ORIGIN_POD, proto,
    },
    settings::Settings,
};

use crate::{
    address::V6,
    counters::{count, count_in},
    family, frag,
    handoff::{self, Request},
    icmp, maps,
    nat::{self, Mapping},
    packet::{self, EarlyOutcomes, Frame6, Ip, Kind, Parse},
    policy,
    rewrite::{self, End, Rewrite},
    verdict::Verdict,
};

/// Entry point of `masq_egress`: IPv4 here, IPv6 in `masq_egress6`, which it tail-calls.
#[inline(always)]
pub(crate) fn classify(ctx: &TcContext) -> i32 {
    let outcomes = EarlyOutcomes {
        not_ipv4: Counter::EgressNotIpv4,
        malformed: Counter::EgressMalformed,
        ipv6_program: Some(PROG_SLOT_EGRESS_V6),
    };
    let Some(ip) = packet::classifiable(ctx, &outcomes) else {
        return Verdict::Pass.tc_action();
    };
    let (Some(settings), Some(addrs)) = (maps::settings(), family::uplink_addrs(ctx)) else {
        count(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    classify_ip(ctx, settings, addrs.serving(ip.src), &ip).tc_action()
}

/// Entry point of `masq_egress6`: an IPv6 frame leaving by an uplink.
#[inline(always)]
pub(crate) fn classify_v6(ctx: &TcContext) -> i32 {
    let ip = match packet::parse_ipv6(ctx) {
        Frame6::Ipv6(ip) => ip,
        Frame6::Malformed => {
            count_in::<V6>(Counter::EgressMalformed);
            return Verdict::Pass.tc_action();
        }
        Frame6::TooManyExtensions => {
            count_in::<V6>(Counter::EgressUnsupported);
            return Verdict::Pass.tc_action();
        }
    };
    let (Some(settings), Some(addrs)) = (maps::settings(), family::uplink_addrs(ctx)) else {
        count_in::<V6>(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    classify_ip(ctx, settings, addrs.serving(ip.src), &ip).tc_action()
}

/// Entry point of `masq_icmp6_egress`: the ICMPv6 error `masq_egress6` found.
#[inline(always)]
pub(crate) fn icmp_error_v6(ctx: &TcContext) -> i32 {
    let Frame6::Ipv6(ip) = packet::parse_ipv6(ctx) else {
        count_in::<V6>(Counter::EgressMalformed);
        return Verdict::Pass.tc_action();
    };
    let Some(addrs) = family::uplink_addrs::<V6>(ctx) else {
        count_in::<V6>(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    icmp::egress(ctx, addrs.now, &ip).tc_action()
}

/// `node_ip` is the address of the interface the packet leaves by: what it is masqueraded to
/// (for a packet of the node's own from the interface's former address, that address: see
/// `family::UplinkAddrs`).
#[inline(always)]
fn classify_ip<A: Parse + Rewrite>(
    ctx: &TcContext,
    settings: &Settings,
    node_ip: A,
    ip: &Ip<A>,
) -> Verdict {
    if ip.is_later_fragment() {
        return frag::egress(ctx, settings, node_ip, ip);
    }
    // A first fragment is recorded as left alone before anything is decided; the paths that
    // translate it record that instead. Whatever else happens to it, its later fragments follow.
    frag::remember(ip, Direction::Egress, None);
    if A::link_scoped(ip.src, ip.dst) {
        count_in::<A>(Counter::EgressExemptLinkLocal);
        return Verdict::Pass;
    }
    let Ok(transport) = packet::transport(ctx, ip) else {
        count_in::<A>(Counter::EgressMalformed);
        return Verdict::Pass;
    };
    // DCCP and UDP-Lite checksums cover the addresses like TCP's and UDP's, and the datapath
    // does not update them: translating by address alone would break every packet.
    if matches!(ip.protocol, proto::DCCP | proto::UDPLITE) {
        count_in::<A>(Counter::EgressUnsupported);
        return Verdict::Pass;
    }
    let tcp_opens = transport.tcp_opens();
    let (src_port, dst_port) = match transport.kind {
        Kind::Ports => (transport.src, transport.dst),
        Kind::IcmpQuery if transport.request => (transport.src, 0),
        Kind::IcmpError => return icmp::egress_error(ctx, node_ip, ip),
        // A query reply without a mapping answers a query that came from outside.
        Kind::IcmpQuery | Kind::IcmpOther => {
            count_in::<A>(if ip.src == node_ip {
                Counter::EgressHostPassed
            } else {
                Counter::EgressUnsupported
            });
            return Verdict::Pass;
        }
        Kind::Other => (0, 0),
    };
    let key = NatKey::new(
        ip.src,
        ip.dst,
        src_port,
        dst_port,
        ip.protocol,
        Direction::Egress,
    );
    if let Some(mapping) = nat::lookup(&key, true, &transport.tcp) {
        let counter = if mapping.origin == ORIGIN_INBOUND {
            Counter::EgressInboundReply
        } else if ip.src == node_ip {
            Counter::EgressHostTracked
        } else {
            Counter::EgressMasqueraded
        };
        if mapping.quiet != 0 {
            return translate(ctx, ip, &key, &mapping, counter);
        }
        // The packet moves its flow: the flow-event program tracks it, then has it rewritten.
        let request = Request {
            key: &key,
            node_addr: node_ip,
            origin: mapping.origin,
            event: EVENT_TRACK,
            counter,
            segment: &transport.tcp,
        };
        handoff::hand_over(ctx, &request, A::SLOT_FLOW_EVENT);
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop;
    }

    let origin = if ip.src == node_ip {
        let has_port =
            matches!(ip.protocol, proto::TCP | proto::UDP | proto::SCTP) || ip.protocol == A::ICMP;
        // On an uplink without an address of the family, the node's packets from the
        // unspecified address (a DHCP client's) are left alone, as MASQUERADE leaves them.
        if A::unaddressed(node_ip) {
            count_in::<A>(Counter::EgressHostPassed);
            return Verdict::Pass;
        }
        // The node's flows outside the SNAT range, or in ranges it shares with the pods (no
        // --to-ports), pass as they are unless they clash with a mapping (one masq adopted, or
        // one a pod holds on a port the node picks later): a new flow of the node's (a SYN, a
        // datagram) whose reply tuple a mapping holds gets another port, as conntrack's null
        // binding gives one. Its flows of protocols without ports are tracked: their tuple is
        // the remote address alone, and the node's own (a tunnel endpoint) must never be
        // handed to a pod.
        if has_port && (settings.ports_shared() || !settings.port_in_range(src_port)) {
            let opens = ip.protocol != proto::TCP || tcp_opens;
            let reply = NatKey::new(
                ip.dst,
                node_ip,
                dst_port,
                src_port,
                ip.protocol,
                Direction::Ingress,
            );
            if !opens || A::nat().get_ptr(reply).is_none() {
                count_in::<A>(Counter::EgressHostPassed);
                return Verdict::Pass;
            }
        }
        ORIGIN_HOST
    } else {
        if let Some(exemption) = policy::pod_exemption(settings, ip.src, ip.dst) {
            count_in::<A>(exemption);
            return Verdict::Pass;
        }
        // Nothing to masquerade to: MASQUERADE drops such a packet too. Its later fragments
        // follow it: remembered as "translated" to the unspecified address, which
        // `frag::egress` drops.
        if A::unaddressed(node_ip) {
            frag::remember(ip, Direction::Egress, Some(node_ip));
            count_in::<A>(Counter::EgressDropNoAddress);
            return Verdict::Drop;
        }
        ORIGIN_POD
    };
    // Until a rewrite records its translation, this datagram's later fragments are dropped: an
    // allocation that fails must not let them leave with the pod's address.
    frag::remember_dropped(ip, Direction::Egress);
    let mut request = Request {
        key: &key,
        node_addr: node_ip,
        origin,
        event: EVENT_NEW_FLOW,
        counter: Counter::EgressNewMapping,
        segment: &transport.tcp,
    };
    if ip.protocol == proto::TCP && !tcp_opens && origin == ORIGIN_POD {
        // A segment that cannot open a connection: its flow's mapping comes back if the agent
        // buried it; a connection masq never translated (a reply of one opened from outside)
        // passes as it is.
        if A::buried().get_ptr(request.key).is_none() {
            frag::remember(ip, Direction::Egress, None);
            count_in::<A>(Counter::EgressTcpMidstreamPassed);
            return Verdict::Pass;
        }
        request.event = EVENT_REVIVE;
        request.counter = Counter::EgressTcpRevived;
    }
    handoff::hand_over(ctx, &request, A::SLOT_ALLOCATOR);
    // Only reached when the tail call failed: the program is not in its slot.
    count_in::<A>(Counter::EgressDropNoAllocator);
    Verdict::Drop
}

/// Entry point of `masq_source_nat`: rewrites a leaving packet's source with the translation in
/// the hand-off (a new flow's, or one a flow event settled).
#[inline(always)]
pub(crate) fn source_nat<A: Parse + Rewrite>(ctx: &TcContext) -> i32 {
    let Some((key, mapping, counter)) = handoff::settled::<A>() else {
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    let counter = Counter::of(counter).unwrap_or(Counter::EgressNewMapping);
    if counter == Counter::EgressNewMapping {
        A::log_new_mapping(ctx, &key, mapping.port);
    }
    // The egress program parsed these same headers a moment ago; parsing them again gives the
    // verifier the bounds it needs to rewrite them.
    let Some(ip) = A::parse_again(ctx, Counter::EgressMalformed) else {
        return Verdict::Pass.tc_action();
    };
    translate(ctx, &ip, &key, &mapping, counter).tc_action()
}

/// Rewrites the packet's source to the mapping's address and port.
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
        End::Source,
        mapping.addr,
        key.src_port,
        mapping.port,
    );
    if rewritten.is_err() {
        frag::remember_dropped(ip, Direction::Egress);
        count_in::<A>(Counter::EgressDropRewriteFailed);
        return Verdict::Drop;
    }
    frag::remember(ip, Direction::Egress, Some(mapping.addr));
    count_in::<A>(counter);
    Verdict::Pass
}
