//! The ingress classifier: restores pod addresses on replies of masqueraded flows.
//!
//! Only packets addressed to the node can be replies; of those, only the ones whose tuple has
//! an ingress mapping are touched. Everything else (the node's own traffic, traffic routed to
//! pods directly) passes exactly as it arrived.

use aya_ebpf::programs::TcContext;
use aya_log_ebpf::debug;
use masq_common::{
    counters::Counter,
    nat::{Direction, NatKeyV4},
};

use crate::{
    counters::count,
    frag, icmp, nat,
    packet::{self, EarlyOutcomes, Transport},
    rewrite::{self, End},
    verdict::Verdict,
};

/// Entry point of `masq_ingress`.
#[inline(always)]
pub(crate) fn classify(ctx: &TcContext) -> i32 {
    let outcomes = EarlyOutcomes {
        not_ipv4: Counter::IngressNotIpv4,
        malformed: Counter::IngressMalformed,
        not_configured: Counter::IngressNotConfigured,
    };
    let Some((ip, settings)) = packet::classifiable(ctx, &outcomes) else {
        return Verdict::Pass.tc_action();
    };
    if ip.dst != settings.node_ip {
        count(Counter::IngressPassed);
        return Verdict::Pass.tc_action();
    }
    if ip.is_later_fragment() {
        return frag::ingress(ctx, &ip).tc_action();
    }
    let Ok(transport) = packet::transport(ctx, &ip) else {
        count(Counter::IngressMalformed);
        return Verdict::Pass.tc_action();
    };
    let (src_port, dst_port, tcp_opens) = match transport {
        Transport::Ports {
            src,
            dst,
            tcp_opens,
            ..
        } => (src, dst, tcp_opens),
        Transport::IcmpQuery { id, request: false } => (0, id, false),
        Transport::IcmpError => return icmp::ingress(ctx, &ip).tc_action(),
        Transport::IcmpQuery { request: true, .. } | Transport::IcmpOther => {
            count(Counter::IngressPassed);
            return Verdict::Pass.tc_action();
        }
        Transport::Other => (0, 0, false),
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
