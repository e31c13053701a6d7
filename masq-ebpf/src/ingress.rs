//! The ingress classifier: restores pod addresses on replies of masqueraded flows.
//!
//! Only packets addressed to the node can be replies; of those, only the ones whose tuple has
//! an ingress mapping are touched. Everything else (the node's own traffic, traffic routed to
//! pods directly) passes exactly as it arrived.

use aya_ebpf::programs::TcContext;
use aya_log_ebpf::debug;
use masq_common::{
    counters::Counter,
    nat::{Direction, NatKeyV4, proto},
};

use crate::{
    counters::count,
    frag, icmp, maps, nat,
    packet::{self, EarlyOutcomes, Kind},
    rewrite::{self, End},
    sockets,
    verdict::Verdict,
};

/// Entry point of `masq_ingress`.
#[inline(always)]
pub(crate) fn classify(ctx: &TcContext) -> i32 {
    let outcomes = EarlyOutcomes {
        not_ipv4: Counter::IngressNotIpv4,
        malformed: Counter::IngressMalformed,
    };
    let Some(ip) = packet::classifiable(ctx, &outcomes) else {
        return Verdict::Pass.tc_action();
    };
    let (Some(settings), Some(node_ip)) = (maps::settings(), maps::snat_addr(ctx)) else {
        count(Counter::IngressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    // Replies come back to the address of the interface they arrive on, as with MASQUERADE on
    // a node whose routing is symmetric.
    if ip.dst != node_ip {
        // Routed to a pod directly. A UDP flow from a masqueraded address is remembered so the
        // pod's answers are not masqueraded as new flows (TCP needs nothing: only a SYN opens
        // a mapping).
        if ip.protocol == proto::UDP
            && !ip.is_later_fragment()
            && let Some((src, dst)) = packet::udp_ports(ctx, &ip)
            && nat::track_inbound(&NatKeyV4::new(
                ip.dst,
                ip.src,
                dst,
                src,
                proto::UDP,
                Direction::Egress,
            ))
        {
            count(Counter::IngressInboundTracked);
            return Verdict::Pass.tc_action();
        }
        count(Counter::IngressPassed);
        return Verdict::Pass.tc_action();
    }
    if ip.is_later_fragment() {
        return frag::ingress(ctx, &ip).tc_action();
    }
    // As on egress: a first fragment is left alone unless a path below translates it, and its
    // later fragments must follow it, not an older datagram's record.
    frag::remember(&ip, Direction::Ingress, None);
    let Ok(transport) = packet::transport(ctx, &ip) else {
        count(Counter::IngressMalformed);
        return Verdict::Pass.tc_action();
    };
    let tcp_opens = transport.tcp_opens;
    let (src_port, dst_port) = match transport.kind {
        Kind::Ports => (transport.src, transport.dst),
        Kind::IcmpQuery if !transport.request => (0, transport.src),
        Kind::IcmpError => return icmp::ingress(ctx, &ip).tc_action(),
        Kind::IcmpQuery | Kind::IcmpOther => {
            count(Counter::IngressPassed);
            return Verdict::Pass.tc_action();
        }
        Kind::Other => (0, 0),
    };
    let key = NatKeyV4::new(
        ip.src,
        ip.dst,
        src_port,
        dst_port,
        ip.protocol,
        Direction::Ingress,
    );
    let Some(entry) = nat::lookup(&key, transport.flow_flags(), tcp_opens) else {
        // A connection attempt is not a reply: the stack answers it as it always would.
        let maybe_reply = matches!(ip.protocol, proto::TCP | proto::UDP)
            && !tcp_opens
            && settings.port_in_range(dst_port);
        if maybe_reply && !sockets::node_owns(ctx, ip.protocol, ip.src, src_port, ip.dst, dst_port)
        {
            count(Counter::IngressDropNoMapping);
            return Verdict::Drop.tc_action();
        }
        count(Counter::IngressPassed);
        return Verdict::Pass.tc_action();
    };
    let rewritten = rewrite::address(ctx, &ip, End::Destination, entry.addr)
        .and_then(|()| rewrite::port(ctx, &ip, End::Destination, dst_port, entry.port));
    if rewritten.is_err() {
        count(Counter::IngressDropRewriteFailed);
        return Verdict::Drop.tc_action();
    }
    frag::remember(&ip, Direction::Ingress, Some(entry.addr));
    debug!(
        ctx,
        "reply from {:i}:{} restored to {:i}:{}",
        u32::from_be_bytes(ip.src),
        src_port,
        u32::from_be_bytes(entry.addr),
        entry.port
    );
    count(Counter::IngressReverseNat);
    Verdict::Pass.tc_action()
}
