//! How long an idle flow keeps its port, mirroring Linux conntrack's default timeouts.
//!
//! The datapath records when each half of a flow last saw a packet and which TCP flags it saw;
//! the agent's garbage collector uses [`FlowTimeouts::idle_limit`] to decide when a flow is over
//! and its port may be reused. The LRU eviction of the table is only a safety net.

use crate::nat::{Address, FLOW_SEEN, FLOW_TCP_FIN, FLOW_TCP_RST, NatEntry, proto};

const SECOND_NS: u64 = 1_000_000_000;

/// A UDP flow with replies becomes a stream (and gets [`FlowTimeouts::udp_stream`]) once it
/// is active this long after it began, as conntrack's `stream_ts`.
pub const UDP_STREAM_AFTER_NS: u64 = 2 * SECOND_NS;

/// Idle timeouts per protocol state, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowTimeouts {
    /// TCP connection with replies and no FIN/RST (`nf_conntrack_tcp_timeout_established`).
    pub tcp_established: u64,
    /// TCP connection attempt without any reply (`nf_conntrack_tcp_timeout_syn_sent`).
    pub tcp_syn_sent: u64,
    /// TCP connection after a FIN (`nf_conntrack_tcp_timeout_fin_wait`/`time_wait`).
    pub tcp_closing: u64,
    /// TCP connection after a RST (`nf_conntrack_tcp_timeout_close`).
    pub tcp_reset: u64,
    /// UDP flow that never got a reply, or whose exchange ended within two seconds
    /// (`nf_conntrack_udp_timeout`).
    pub udp: u64,
    /// UDP flow with replies still active more than two seconds after it began
    /// (`nf_conntrack_udp_timeout_stream`).
    pub udp_stream: u64,
    /// ICMP query (`nf_conntrack_icmp_timeout`).
    pub icmp: u64,
    /// Any other protocol (`nf_conntrack_generic_timeout`).
    pub generic: u64,
}

impl FlowTimeouts {
    /// Linux's defaults.
    pub const LINUX_DEFAULTS: Self = Self {
        tcp_established: 432_000 * SECOND_NS,
        tcp_syn_sent: 120 * SECOND_NS,
        tcp_closing: 120 * SECOND_NS,
        tcp_reset: 10 * SECOND_NS,
        udp: 30 * SECOND_NS,
        udp_stream: 120 * SECOND_NS,
        icmp: 30 * SECOND_NS,
        generic: 600 * SECOND_NS,
    };

    /// How long the flow whose halves are `egress` and `ingress` may stay idle.
    pub const fn idle_limit<A: Address>(
        &self,
        protocol: u8,
        egress: &NatEntry<A>,
        ingress: &NatEntry<A>,
    ) -> u64 {
        let flags = egress.marks.bits() | ingress.marks.bits();
        let replied = ingress.marks.bits() & FLOW_SEEN != 0;
        match protocol {
            proto::TCP => {
                if flags & FLOW_TCP_RST != 0 {
                    self.tcp_reset
                } else if flags & FLOW_TCP_FIN != 0 {
                    self.tcp_closing
                } else if !replied {
                    self.tcp_syn_sent
                } else {
                    self.tcp_established
                }
            }
            // Conntrack's "assured" UDP stream: answered, and still active more than two
            // seconds after it began. A query and its answer (DNS) stay unassured: 30 s.
            proto::UDP => {
                let began = max(egress.created_ns, ingress.created_ns);
                let last = max(egress.last_seen_ns, ingress.last_seen_ns);
                if replied && last.saturating_sub(began) > UDP_STREAM_AFTER_NS {
                    self.udp_stream
                } else {
                    self.udp
                }
            }
            // Conntrack gives ICMPv6 queries the ICMP timeout too.
            proto::ICMP | proto::ICMPV6 => self.icmp,
            _ => self.generic,
        }
    }

    /// Whether the flow is over at monotonic time `now_ns`.
    pub const fn expired<A: Address>(
        &self,
        protocol: u8,
        egress: &NatEntry<A>,
        ingress: &NatEntry<A>,
        now_ns: u64,
    ) -> bool {
        let last_activity = max(
            max(egress.created_ns, ingress.created_ns),
            max(egress.last_seen_ns, ingress.last_seen_ns),
        );
        now_ns.saturating_sub(last_activity) > self.idle_limit(protocol, egress, ingress)
    }
}

const fn max(a: u64, b: u64) -> u64 {
    if a > b { a } else { b }
}

impl Default for FlowTimeouts {
    fn default() -> Self {
        Self::LINUX_DEFAULTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nat::{NatEntryV4, ORIGIN_POD};

    fn half(flags: u8, last_seen_s: u64) -> NatEntryV4 {
        NatEntryV4::new(
            [0; 4],
            0,
            ORIGIN_POD,
            crate::nat::FlowMarks::from_bits(flags),
            0,
            last_seen_s * SECOND_NS,
        )
    }

    const T: FlowTimeouts = FlowTimeouts::LINUX_DEFAULTS;

    #[test]
    fn tcp_states_follow_conntrack() {
        let unanswered = (half(0, 0), half(0, 0));
        assert!(!T.expired(proto::TCP, &unanswered.0, &unanswered.1, 120 * SECOND_NS));
        assert!(T.expired(proto::TCP, &unanswered.0, &unanswered.1, 121 * SECOND_NS));

        let established = (half(0, 0), half(FLOW_SEEN, 0));
        assert!(!T.expired(
            proto::TCP,
            &established.0,
            &established.1,
            86_400 * SECOND_NS
        ));

        let reset = (half(FLOW_TCP_RST, 100), half(FLOW_SEEN, 50));
        assert!(!T.expired(proto::TCP, &reset.0, &reset.1, 110 * SECOND_NS));
        assert!(T.expired(proto::TCP, &reset.0, &reset.1, 111 * SECOND_NS));

        let closing = (half(FLOW_TCP_FIN, 100), half(FLOW_SEEN | FLOW_TCP_FIN, 100));
        assert!(T.expired(proto::TCP, &closing.0, &closing.1, 221 * SECOND_NS));
    }

    #[test]
    fn udp_gets_longer_only_as_an_assured_stream() {
        let one_way = (half(0, 10), half(0, 0));
        assert!(T.expired(proto::UDP, &one_way.0, &one_way.1, 41 * SECOND_NS));
        // A query answered at once (DNS): 30 s, as the kernel keeps it, not 120 s.
        let query = (half(0, 1), half(FLOW_SEEN, 1));
        assert!(!T.expired(proto::UDP, &query.0, &query.1, 31 * SECOND_NS));
        assert!(T.expired(proto::UDP, &query.0, &query.1, 32 * SECOND_NS));
        // Traffic both ways more than two seconds after the start: a stream, 120 s.
        let stream = (half(0, 10), half(FLOW_SEEN, 10));
        assert!(!T.expired(proto::UDP, &stream.0, &stream.1, 41 * SECOND_NS));
        assert!(T.expired(proto::UDP, &stream.0, &stream.1, 131 * SECOND_NS));
    }

    #[test]
    fn the_most_recent_half_counts() {
        let egress = half(0, 5);
        let ingress = half(FLOW_SEEN, 500);
        assert!(!T.expired(proto::ICMP, &egress, &ingress, 520 * SECOND_NS));
        assert!(T.expired(proto::ICMP, &egress, &ingress, 531 * SECOND_NS));
        assert!(T.expired(47, &egress, &ingress, 1_101 * SECOND_NS));
    }
}
