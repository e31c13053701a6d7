//! Packet counters kept by the datapath in a per-CPU array.
//!
//! Every path through the programs ends by counting exactly one outcome, so the counters of a
//! direction add up to the packets that direction saw. Drops have their own counters.

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)+) => {
        /// One datapath outcome; the discriminant is the index in the counters map.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Counter {
            $($(#[doc = $doc])* $variant,)+
        }

        impl Counter {
            /// Every counter, in index order.
            pub const ALL: &[Counter] = &[$(Counter::$variant,)+];

            /// The counter at index `index`, if there is one.
            pub const fn of(index: u16) -> Option<Counter> {
                let index = index as usize;
                if index < Counter::ALL.len() {
                    Some(Counter::ALL[index])
                } else {
                    None
                }
            }

            /// Stable snake_case name, used in metrics and `masq status`.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Counter::$variant => $name,)+
                }
            }

            /// One-line description, used as metrics help text.
            pub const fn help(self) -> &'static str {
                match self {
                    $(Counter::$variant => concat!($($doc),+),)+
                }
            }
        }
    };
}

counters! {
    /// Egress packets rewritten to the node address by an existing mapping.
    EgressMasqueraded = "egress_masqueraded",
    /// Egress packets that created a new mapping (and were rewritten).
    EgressNewMapping = "egress_new_mapping",
    /// Egress packets left alone because the destination is in a non-masquerade CIDR.
    EgressExemptCidr = "egress_exempt_cidr",
    /// Egress packets left alone because the destination is link-local.
    EgressExemptLinkLocal = "egress_exempt_link_local",
    /// Egress packets sent by the node itself, left alone.
    EgressHostPassed = "egress_host_passed",
    /// Egress TCP packets without a mapping that do not open a connection and belong to no
    /// flow masq translated (replies of connections opened from outside, connections older
    /// than masq on this node or than a config change that masquerades their destination),
    /// left alone as conntrack leaves the flows it holds untranslated.
    EgressTcpMidstreamPassed = "egress_tcp_midstream_passed",
    /// Egress packets of the node's own flows that use a port in the SNAT range (tracked).
    EgressHostTracked = "egress_host_tracked",
    /// Egress packets of the node's own new flows given another port because a pod's mapping
    /// holds the tuple their replies would come back on (conntrack's null binding).
    EgressHostRemapped = "egress_host_remapped",
    /// Egress packets of UDP flows opened from outside, and ICMP errors about such flows, left
    /// alone as conntrack would.
    EgressInboundReply = "egress_inbound_reply",
    /// Egress ICMP errors whose embedded packet was translated.
    EgressIcmpErrorTranslated = "egress_icmp_error_translated",
    /// Egress non-first fragments translated like their datagram's first fragment.
    EgressFragmentTranslated = "egress_fragment_translated",
    /// Egress non-first fragments left alone like their datagram's first fragment.
    EgressFragmentPassed = "egress_fragment_passed",
    /// Egress non-first fragments dropped because their datagram's first fragment was (it
    /// could not be mapped, say): no part of it leaves with the pod's address.
    EgressDropFragment = "egress_drop_fragment",
    /// Egress packets dropped because no free port was found in the SNAT range.
    EgressDropNoPort = "egress_drop_no_port",
    /// Egress SCTP packets dropped because their source port is taken towards that remote.
    EgressDropSctpPortInUse = "egress_drop_sctp_port_in_use",
    /// Egress packets of new flows dropped because the NAT table is full and no unassured flow
    /// was found to make room (assured flows are never evicted; raise --nat-max-entries).
    EgressDropTableFull = "egress_drop_table_full",
    /// Egress packets of new flows dropped because their pod holds its whole share of the NAT
    /// table in unassured flows (--nat-holder-share) and none of them could make room.
    EgressDropHolderShare = "egress_drop_holder_share",
    /// Egress packets of new flows dropped because a new-flow program (the port allocator or
    /// the translation after it) is missing from the program array: the agent had not finished
    /// loading the datapath.
    EgressDropNoAllocator = "egress_drop_no_allocator",
    /// Egress packets dropped because rewriting them failed half-way.
    EgressDropRewriteFailed = "egress_drop_rewrite_failed",
    /// Egress IPv4 packets that would be masqueraded, dropped because the uplink they leave by
    /// has no IPv4 address (an IPv6-only uplink), as MASQUERADE drops them.
    EgressDropNoAddress = "egress_drop_no_address",
    /// Egress IPv4 packets of a kind that is not translated (e.g. ICMP informational types).
    EgressUnsupported = "egress_unsupported",
    /// Egress frames that are not IPv4 (IPv6, ARP, ...), left alone.
    EgressNotIpv4 = "egress_not_ipv4",
    /// Egress IPv4 packets too short or inconsistent to parse, left alone.
    EgressMalformed = "egress_malformed",
    /// Egress packets seen before the agent configured the datapath, left alone.
    EgressNotConfigured = "egress_not_configured",
    /// Ingress packets whose reply mapping restored the pod address.
    IngressReverseNat = "ingress_reverse_nat",
    /// Ingress ICMP errors whose embedded packet was translated back to the pod.
    IngressIcmpErrorTranslated = "ingress_icmp_error_translated",
    /// Ingress non-first fragments translated like their datagram's first fragment.
    IngressFragmentTranslated = "ingress_fragment_translated",
    /// Ingress non-first fragments to the node whose first fragment was not seen.
    IngressFragmentUnmatched = "ingress_fragment_unmatched",
    /// Ingress UDP flows opened from a masqueraded address towards a pod, now tracked.
    IngressInboundTracked = "ingress_inbound_tracked",
    /// Ingress UDP datagrams of new flows towards a pod dropped because that pod holds its
    /// whole share of the NAT table in unassured flows and none of them could make room.
    IngressDropHolderShare = "ingress_drop_holder_share",
    /// Ingress TCP segments of a flow whose mapping the agent had removed, given their old
    /// mapping back rather than reaching the node's stack.
    IngressTcpRevived = "ingress_tcp_revived",
    /// Ingress packets without a mapping (the node's own traffic), left alone.
    IngressPassed = "ingress_passed",
    /// Ingress packets dropped because rewriting them failed half-way.
    IngressDropRewriteFailed = "ingress_drop_rewrite_failed",
    /// Ingress TCP and UDP packets to the node's address and a port in the SNAT range that
    /// match no mapping, handed to the stack as the kernel hands them: a `hostPort` or
    /// `externalIPs` DNAT, a node socket or a flow netfilter still translates takes them there.
    IngressNoMappingPassed = "ingress_no_mapping_passed",
    /// Ingress frames that are not IPv4, left alone.
    IngressNotIpv4 = "ingress_not_ipv4",
    /// Ingress IPv4 packets too short or inconsistent to parse, left alone.
    IngressMalformed = "ingress_malformed",
    /// Ingress packets seen before the agent configured the datapath, left alone.
    IngressNotConfigured = "ingress_not_configured",
    /// Pod mappings of protocols without ports dropped because the node's own traffic took
    /// their tuple.
    MappingConflict = "mapping_conflict",
    /// TCP RSTs, FINs and SYN-ACKs from a remote end outside the window conntrack would track
    /// (spoofed, or stale): delivered, but the flow's state does not change, as conntrack
    /// ignores them.
    TcpCloseOutOfWindow = "tcp_close_out_of_window",
    /// TCP flows ended at once because a RST was their only answer (a connection refused), as
    /// conntrack ends them: their port is free for the next flow.
    TcpRefused = "tcp_refused",
    /// Egress TCP segments of a flow whose mapping the agent had removed (expired while
    /// idle), given their old mapping back; conntrack would pick the flow up on a new port.
    EgressTcpRevived = "egress_tcp_revived",
    /// Egress packets left alone because the pod source is in nonMasqueradeSrcCIDRs.
    EgressExemptSource = "egress_exempt_source",
}

/// Number of counters, the size of the counters map.
pub const COUNTER_COUNT: u32 = Counter::ALL.len() as u32;

/// Ports the first round of a port search tries, in order from a random start. Like the
/// kernel's unique-tuple search, each further round starts afresh from a new random position
/// and tries half as many, down to [`MIN_ALLOC_ROUND`]; a range no larger than the first round
/// is searched whole, so a free port in it is always found.
pub const FIRST_ALLOC_ROUND: u32 = 128;
/// Size of the last round of a port search.
pub const MIN_ALLOC_ROUND: u32 = 16;
/// Most ports tried for one new flow before it is dropped and counted: 128 + 64 + 32 + 16, as
/// many as the kernel's NAT tries.
pub const MAX_ALLOC_ATTEMPTS: u32 = 240;
/// Ports one run of the allocator program tries before it hands the search on to its next run
/// (a tail call to itself). Every round is a whole number of chunks. The verifier walks each
/// port tried in a run as a state of its own, so the chunk, not the whole search, sets the
/// program's verification cost: the search of all 240 ports in one run passes Linux 6.18's
/// verifier but exceeds 6.1's million instructions.
pub const ALLOC_CHUNK: u32 = 16;
/// Allocator runs a search that tries every port takes: the first run, then one tail call per
/// further chunk. With the egress program's tail calls before it and the new-flow program's
/// after, this stays well under the kernel's limit of 33 tail calls in a chain.
pub const MAX_ALLOC_RUNS: u32 = MAX_ALLOC_ATTEMPTS / ALLOC_CHUNK;

/// The kernel's limit on tail calls in one chain (`MAX_TAIL_CALL_CNT`: 33 from Linux 5.18, 32
/// before).
const TAIL_CALL_LIMIT: u32 = 32;
// The egress program and the IPv6 egress program before the allocator's runs, the new-flow
// program after them.
#[expect(
    clippy::int_plus_one,
    reason = "the sum names each program of the chain: egress, IPv6 egress, runs, new flow"
)]
const _: () = assert!(2 + MAX_ALLOC_RUNS + 1 <= TAIL_CALL_LIMIT);

/// Buckets of attempt counts in the allocation histogram: bucket `i` counts flows that found a
/// port within `2^i` attempts and not within `2^(i-1)` (1, 2, 3-4, 5-8, ..., 129-256).
pub const ALLOC_ATTEMPT_BUCKETS: u32 = 9;
/// Slot of the allocation histogram that counts flows that found no port.
pub const ALLOC_FAILED_SLOT: u32 = ALLOC_ATTEMPT_BUCKETS;
/// Slot of the allocation histogram that sums the attempts of successful allocations.
pub const ALLOC_SUM_SLOT: u32 = ALLOC_ATTEMPT_BUCKETS + 1;
/// Slots of the allocation histogram map: the buckets, the failures, the sum.
pub const ALLOC_HISTOGRAM_BUCKETS: u32 = ALLOC_ATTEMPT_BUCKETS + 2;

/// The bucket of a successful allocation after `attempts` tries (1 or more).
#[inline(always)]
pub const fn alloc_bucket(attempts: u32) -> u32 {
    let mut bucket = 0;
    while bucket + 1 < ALLOC_ATTEMPT_BUCKETS && (1 << bucket) < attempts {
        bucket += 1;
    }
    bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_fall_in_power_of_two_buckets() {
        let buckets = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 129, 240, 1000].map(alloc_bucket);
        assert_eq!(buckets, [0, 1, 2, 2, 3, 3, 4, 4, 5, 5, 8, 8, 8]);
        assert!(alloc_bucket(MAX_ALLOC_ATTEMPTS) < ALLOC_ATTEMPT_BUCKETS);
    }

    #[test]
    fn every_round_is_whole_chunks_and_the_chain_fits_the_tail_call_limit() {
        let mut round = FIRST_ALLOC_ROUND;
        let mut total = 0;
        while round >= MIN_ALLOC_ROUND {
            assert_eq!(round % ALLOC_CHUNK, 0, "round of {round} ports");
            total += round;
            round /= 2;
        }
        assert_eq!(total, MAX_ALLOC_ATTEMPTS);
    }

    #[test]
    fn indices_are_dense_and_names_unique() {
        for (index, counter) in Counter::ALL.iter().enumerate() {
            assert_eq!(*counter as usize, index);
            let duplicates = Counter::ALL
                .iter()
                .filter(|other| other.name() == counter.name());
            assert_eq!(duplicates.count(), 1, "{} is not unique", counter.name());
            assert!(!counter.help().is_empty());
        }
    }
}
