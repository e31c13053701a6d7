//! The oracle: what the datapath may do to a frame, checked on every frame the fuzzer sends.
//!
//! * The program returns "next" (`TC_ACT_UNSPEC`, -1: masq never short-circuits the programs
//!   after it, so `TC_ACT_OK` would be a finding too) or `TC_ACT_SHOT`.
//! * Exactly one outcome counter of the program's direction moves, by one; a drop verdict moves
//!   a `*_drop_*` counter and a pass never does. Nothing else moves: not the other direction's
//!   counters, and not the mapping repair/conflict events, which need an evicted half and the
//!   fuzzer's tables never fill. Drops are never "rewrite failed": the test skb is linear and
//!   writable, so a failed rewrite is a datapath bug even though it is counted. A flow is
//!   dropped for want of a port only when some mapping already holds a port towards its remote
//!   endpoint (an SCTP clash: its very port).
//! * The counter agrees with an independent parse: `*_not_ipv4` exactly for non-IPv4
//!   ethertypes, `*_malformed` only for inconsistent IPv4 headers or cut transport headers,
//!   `*_not_configured` exactly when the device is not an uplink.
//! * A passed frame keeps its length and is byte-identical, or a translation of it: a source
//!   NAT on egress, a destination reverse NAT of a packet addressed to the uplink on ingress,
//!   where only the translated address, port (ICMP identifier) and checksums changed, and for
//!   ICMP errors only those of the quoted packet plus the ICMP checksum — never a byte beyond the
//!   IPv4 total length, never the ports of a quoted later fragment, never an SCTP port. The
//!   outcomes that leave packets alone (exemptions, passes, malformed...) leave them
//!   byte-identical.
//! * Checksums: every checksum whose covered bytes changed must cover the same one's complement
//!   sum afterwards (modulo 0xffff, i.e. up to the ±0 ambiguity). That is exactly what an
//!   incremental update (RFC 1624) preserves, and it is stronger than "valid stays valid": a
//!   checksum that was already wrong stays wrong by the same amount, so a translation can neither
//!   break a good checksum nor turn a bad one good by accident. It holds for first fragments and
//!   cut quotes too, whose checksums cover bytes the frame does not hold. A UDP zero checksum
//!   ("none") stays zero and a computed one is never sent as zero.
//! * Egress translations leave with the uplink address and ports from the SNAT range; every
//!   translation agrees with the mappings the fuzzer saw created ([`Model`]): an established
//!   flow keeps its port, a new flow never takes a reply tuple another flow owns, replies and
//!   ICMP errors are restored to exactly the flow's original address and port. And the other
//!   way round: a complete packet of a mapped flow, a reply to it, or an ICMP error quoting one
//!   of them, is translated (the tables never fill, so no mapping may get lost).
//! * A later fragment leaves with the address its datagram's first fragment left with.

use std::{net::Ipv4Addr, ops::Range};

use masq_common::{counters::Counter, nat::Direction, ports::PortRange};

use super::{
    model::{DatagramKey, FirstFragment, Model, Tuple},
    wire::{
        Ip, addr4, be16, checksum_offset, has_pseudo_header, is_icmp_error, is_ipv4_frame,
        is_ipv6_frame, proto, word_sum,
    },
};

/// `TC_ACT_UNSPEC`: the program lets the packet continue.
pub const PASS: i32 = -1;
/// `TC_ACT_SHOT`.
pub const DROP: i32 = 2;
/// Not a return code: `BPF_PROG_TEST_RUN` refused the frame and the program did not run (see
/// [`super::wire::test_run_may_refuse`]).
pub const REFUSED: i32 = i32::MIN;

/// Outcomes after which the frame must come back exactly as it went in.
pub const UNTOUCHED: &[Counter] = &[
    Counter::EgressExemptCidr,
    Counter::EgressExemptLinkLocal,
    // A pod source in the source trie (the fuzzer's datapath has none).
    Counter::EgressExemptSource,
    Counter::EgressHostPassed,
    Counter::EgressTcpMidstreamPassed,
    // Replies of flows opened from outside "translate" to the pod's own address and port.
    Counter::EgressInboundReply,
    Counter::EgressFragmentPassed,
    Counter::EgressUnsupported,
    Counter::EgressNotIpv4,
    Counter::EgressMalformed,
    Counter::EgressNotConfigured,
    Counter::IngressFragmentUnmatched,
    Counter::IngressInboundTracked,
    Counter::IngressPassed,
    Counter::IngressNoMappingPassed,
    Counter::IngressNotIpv4,
    Counter::IngressMalformed,
    Counter::IngressNotConfigured,
];

/// Outcomes that may rewrite the frame (or leave it as it is, for identity translations).
pub const TRANSLATING: &[Counter] = &[
    Counter::EgressMasqueraded,
    Counter::EgressNewMapping,
    Counter::EgressHostTracked,
    // A removed flow's segment given its mapping back (the fuzzer never removes flows).
    Counter::EgressTcpRevived,
    // The node's own new flow given another port (the fuzzer's node flows clash with none).
    Counter::EgressHostRemapped,
    Counter::EgressIcmpErrorTranslated,
    Counter::EgressFragmentTranslated,
    Counter::IngressReverseNat,
    // A reply of a removed flow given its mapping back (the fuzzer never removes flows).
    Counter::IngressTcpRevived,
    Counter::IngressIcmpErrorTranslated,
    Counter::IngressFragmentTranslated,
];

/// Outcomes that drop the packet.
pub const DROPS: &[Counter] = &[
    Counter::EgressDropNoPort,
    Counter::EgressDropSctpPortInUse,
    // A new-flow program missing from the program array: the loader always fills it.
    Counter::EgressDropNoAllocator,
    // A new flow refused because the NAT table is full: nothing else to check in a frame.
    Counter::EgressDropTableFull,
    // A new flow refused because its pod holds its share (the fuzzer's datapath sets none).
    Counter::EgressDropHolderShare,
    Counter::IngressDropHolderShare,
    // A later fragment of a datagram whose first fragment could not be mapped.
    Counter::EgressDropFragment,
    Counter::EgressDropRewriteFailed,
    Counter::IngressDropRewriteFailed,
    // A packet to be masqueraded on an uplink without IPv4 (never in the fuzzer's uplinks).
    Counter::EgressDropNoAddress,
];

/// Counters of events that happen besides a packet's outcome (a conflicting half removed, a
/// close outside the window ignored, a refused connection ended).
pub const EVENTS: &[Counter] = &[
    Counter::MappingConflict,
    Counter::TcpCloseOutOfWindow,
    Counter::TcpRefused,
];

/// Where a byte that must not change sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// The frame is not a consistent IPv4 packet (or, on ingress, not addressed to the uplink).
    NotTranslatable,
    Ethernet,
    IpHeader,
    Transport,
    /// The packet quoted by an ICMP error.
    Quote,
    /// After the IPv4 total length: Ethernet padding or a trailer, not part of the packet.
    BeyondTotalLength,
}

/// A checksum of the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sum {
    OuterIp,
    OuterTransport,
    QuotedIp,
    QuotedTransport,
}

/// What a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A return code other than "next" or "shot".
    Action,
    /// The frame came back with another length.
    Length,
    /// The counters did not move by exactly one outcome of the direction (see the module docs).
    Counters,
    /// The outcome counter contradicts an independent parse of the frame.
    Classification,
    /// The outcome says the packet was left alone, yet it changed.
    ChangedWhenUntouched,
    /// A byte changed that no translation may touch.
    Outside(Region),
    /// A checksum no longer covers the same sum.
    Checksum(Sum),
    /// A UDP zero checksum was filled in, or a computed one sent as zero.
    UdpZero,
    /// An egress translation to an address other than the uplink's.
    Address,
    /// An egress translation to a port outside the SNAT range.
    PortRange,
    /// A translation inconsistent with the mappings the fuzzer saw created.
    Mapping,
    /// A packet of a mapped flow (or an error about one) left untranslated.
    Missed,
    /// A later fragment handled unlike its datagram's first fragment.
    Fragment,
    /// A rewrite failed on the linear, writable test skb.
    RewriteFailed,
    /// A drop for want of a port while no mapping held one towards that remote endpoint.
    Drop,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub detail: String,
}

/// One run of a program on one frame.
#[derive(Debug)]
pub struct Observation<'a> {
    pub direction: Direction,
    pub input: &'a [u8],
    pub code: i32,
    pub output: &'a [u8],
    /// Every counter that moved, with how much.
    pub moved: &'a [(Counter, u64)],
    /// The uplink's address, `None` when the test device is not an uplink.
    pub uplink: Option<[u8; 4]>,
    /// The uplink's IPv6 address, when it translates IPv6 (`has_v6`).
    pub uplink_v6: Option<[u8; 16]>,
    pub ranges: &'a [PortRange],
}

/// The outcome counter the run moved (when the counters are consistent) and everything the
/// run got wrong.
pub fn check(observation: &Observation<'_>, model: &Model) -> (Option<Counter>, Vec<Violation>) {
    let mut violations = Vec::new();
    let mut violate = |kind: Kind, detail: String| violations.push(Violation { kind, detail });
    let Observation {
        input,
        code,
        output,
        ..
    } = *observation;

    if code != PASS && code != DROP {
        violate(Kind::Action, format!("return code {code}"));
        return (None, violations);
    }
    let counter = outcome(observation, &mut violate);
    if let Some(counter) = counter {
        if (code == DROP) != DROPS.contains(&counter) {
            violate(
                Kind::Counters,
                format!("verdict {code} counted as {}", counter.name()),
            );
        }
        if matches!(
            counter,
            Counter::EgressDropRewriteFailed | Counter::IngressDropRewriteFailed
        ) {
            violate(Kind::RewriteFailed, counter.name().to_owned());
        }
        classification(observation, counter, &mut violate);
    }
    if output.len() != input.len() {
        violate(
            Kind::Length,
            format!("{} bytes in, {} out", input.len(), output.len()),
        );
        return (counter, violations);
    }
    if observation.uplink_v6.is_some() && is_ipv6_frame(input) {
        if let Some(counter) = counter {
            super::v6::check(
                observation.direction,
                input,
                (code == PASS).then_some(output),
                counter,
                observation.ranges,
                &model.v6,
                &mut violate,
            );
        }
        return (counter, violations);
    }
    if code == DROP {
        if let Some(counter) = counter {
            plausible_drop(observation, counter, model, &mut violate);
        }
        // The packet is gone: what the program left in it does not matter.
        return (counter, violations);
    }
    fragment_follows_first(observation, model, &mut violate);
    if let Some(counter) = counter {
        not_missed(observation, counter, model, &mut violate);
    }
    if output == input {
        return (counter, violations);
    }
    if let Some(counter) = counter
        && !TRANSLATING.contains(&counter)
    {
        violate(
            Kind::ChangedWhenUntouched,
            format!("counted as {} but rewritten", counter.name()),
        );
    }
    translation(observation, &mut violate);
    if let Some(counter) = counter {
        mapping(observation, counter, model, &mut violate);
    }
    (counter, violations)
}

/// The one outcome counter of the run's direction that moved, reporting anything else.
fn outcome(
    observation: &Observation<'_>,
    violate: &mut impl FnMut(Kind, String),
) -> Option<Counter> {
    let prefix = match observation.direction {
        Direction::Egress => "egress_",
        Direction::Ingress => "ingress_",
    };
    let (mine, others): (Vec<_>, Vec<_>) = observation
        .moved
        .iter()
        .partition(|(counter, _)| counter.name().starts_with(prefix));
    // The node's own traffic of a protocol without ports takes its tuple back from a pod flow
    // holding it: the one event a single frame may cause.
    let node_takes_over = mine.as_slice() == [(Counter::EgressHostTracked, 1)];
    for (counter, by) in &others {
        if node_takes_over && (*counter, *by) == (Counter::MappingConflict, 1) {
            continue;
        }
        // A RST, FIN or SYN-ACK outside the tracked window is delivered and counted beside
        // it; a RST that was its flow's only answer ends the flow beside its delivery (from
        // either end).
        if matches!(counter, Counter::TcpCloseOutOfWindow | Counter::TcpRefused) && *by == 1 {
            continue;
        }
        violate(
            Kind::Counters,
            format!(
                "{} moved by {by} (not an outcome of this run)",
                counter.name()
            ),
        );
    }
    match mine.as_slice() {
        [(counter, 1)] => Some(*counter),
        moved => {
            let moved: Vec<String> = moved
                .iter()
                .map(|(counter, by)| format!("{}+{by}", counter.name()))
                .collect();
            violate(
                Kind::Counters,
                format!(
                    "outcome counters moved: [{}], expected exactly one +1",
                    moved.join(", ")
                ),
            );
            None
        }
    }
}

/// A new flow finds no port only when mappings hold ports towards its remote endpoint: the
/// ingress halves are unique per (remote, remote port, uplink address, port, protocol).
fn plausible_drop(
    observation: &Observation<'_>,
    counter: Counter,
    model: &Model,
    violate: &mut impl FnMut(Kind, String),
) {
    let Some(flow) = Tuple::of_frame(observation.input) else {
        return;
    };
    let uplink = observation.uplink.unwrap_or_default();
    let taken = match counter {
        Counter::EgressDropNoPort => model.by_reply.keys().any(|reply| {
            reply.protocol == flow.protocol
                && reply.src == flow.dst
                && reply.src_port == flow.dst_port
                && reply.dst == uplink
        }),
        Counter::EgressDropSctpPortInUse => model.by_reply.contains_key(&Tuple {
            dst: uplink,
            ..flow.reversed()
        }),
        _ => return,
    };
    if !taken {
        violate(
            Kind::Drop,
            format!(
                "{flow:?} counted as {}, yet no mapping holds a port towards its remote end",
                counter.name()
            ),
        );
    }
}

/// Whether the transport header the datapath needs is all there (later fragments have none).
fn transport_complete(ip: &Ip) -> bool {
    let needed = match ip.protocol {
        proto::TCP => 20,
        proto::SCTP => 12,
        proto::UDP | proto::ICMP => 8,
        _ => 0,
    };
    ip.is_later_fragment() || ip.l4() + needed <= ip.end
}

fn classification(
    observation: &Observation<'_>,
    counter: Counter,
    violate: &mut impl FnMut(Kind, String),
) {
    let input = observation.input;
    let ip = Ip::of_frame(input);
    let name = counter.name();
    let wrong = match counter {
        Counter::EgressNotIpv4 | Counter::IngressNotIpv4 => {
            is_ipv4_frame(input) || is_ipv6_frame(input)
        }
        // An uplink that translates IPv6: the IPv6 checks (`v6`) classify it.
        _ if is_ipv6_frame(input) && observation.uplink_v6.is_some() => false,
        // An uplink that translates no IPv6: the IPv6 programs leave every IPv6 frame as it
        // is, as unconfigured, malformed or (too many extension headers) unsupported.
        _ if is_ipv6_frame(input) => !matches!(
            counter,
            Counter::EgressNotConfigured
                | Counter::IngressNotConfigured
                | Counter::EgressMalformed
                | Counter::IngressMalformed
                | Counter::EgressUnsupported
                | Counter::IngressPassed
        ),
        _ if !is_ipv4_frame(input) => true,
        Counter::EgressMalformed | Counter::IngressMalformed => {
            ip.is_some_and(|ip| transport_complete(&ip))
        }
        _ if ip.is_none() => true,
        Counter::EgressNotConfigured | Counter::IngressNotConfigured => {
            observation.uplink.is_some()
        }
        _ => observation.uplink.is_none(),
    };
    if wrong {
        let parsed = match ip {
            Some(ip) => format!(
                "consistent IPv4, protocol {}, transport complete: {}",
                ip.protocol,
                transport_complete(&ip)
            ),
            None if is_ipv4_frame(input) => "an inconsistent IPv4 header".to_owned(),
            None => "not IPv4".to_owned(),
        };
        violate(
            Kind::Classification,
            format!(
                "counted as {name}, but the frame is {parsed} (uplink configured: {})",
                observation.uplink.is_some()
            ),
        );
    }
}

/// The address that identifies the translated end: the source on egress, the destination on
/// ingress.
const fn translated_address_offset(direction: Direction, ip_start: usize) -> usize {
    match direction {
        Direction::Egress => ip_start + 12,
        Direction::Ingress => ip_start + 16,
    }
}

fn fragment_follows_first(
    observation: &Observation<'_>,
    model: &Model,
    violate: &mut impl FnMut(Kind, String),
) {
    let Some(ip) = Ip::of_frame(observation.input) else {
        return;
    };
    if !ip.is_later_fragment() {
        return;
    }
    let Some(first) = model
        .datagrams(observation.direction)
        .get(&DatagramKey::of(&ip))
    else {
        return;
    };
    let at = translated_address_offset(observation.direction, ip.start);
    let actual = addr4(observation.output, at).unwrap_or_default();
    follows_first(
        &FirstFragment {
            left_with: first.left_with.map(Ipv4Addr::from),
            counter: first.counter,
        },
        Ipv4Addr::from(actual),
        violate,
    );
}

/// A later fragment must leave with the address its datagram's first fragment left with
/// (nothing is expected when that was dropped). Both families.
pub fn follows_first<A: Copy + PartialEq + std::fmt::Display>(
    first: &FirstFragment<A>,
    actual: A,
    violate: &mut impl FnMut(Kind, String),
) {
    let Some(expected) = &first.left_with else {
        return;
    };
    if actual != *expected {
        violate(
            Kind::Fragment,
            format!(
                "the first fragment left with {expected} ({}), this later fragment with {actual}",
                first.counter.map_or("no outcome", Counter::name),
            ),
        );
    }
}

/// What a checksum covers in a frame.
struct Coverage {
    /// Offset of the source and destination addresses of a pseudo-header (8 bytes).
    pseudo_header: Option<usize>,
    /// The checksummed bytes, starting on a word boundary of the checksummed data.
    bytes: Range<usize>,
}

impl Coverage {
    const fn of(bytes: Range<usize>) -> Self {
        Self {
            pseudo_header: None,
            bytes,
        }
    }

    const fn with_addresses_at(addresses: usize, bytes: Range<usize>) -> Self {
        Self {
            pseudo_header: Some(addresses),
            bytes,
        }
    }

    /// The covered sum modulo 0xffff: what an Internet checksum depends on. The constant parts
    /// of a pseudo-header (protocol, length) cancel out when two frames are compared.
    fn sum(&self, frame: &[u8]) -> u64 {
        let part = |range: Range<usize>| word_sum(frame.get(range).unwrap_or(&[]));
        let addresses = self.pseudo_header.map_or(0, |at| part(at..at + 8));
        (addresses + part(self.bytes.clone())) % 0xffff
    }
}

/// The bytes a translation of one frame may change, and what it must keep.
struct Allowed {
    mask: Vec<bool>,
    /// Checksums and what each covers.
    sums: Vec<(Sum, Coverage)>,
    /// UDP checksum fields, where zero means "none".
    udp_checksums: Vec<usize>,
    /// Egress: addresses that may only change to the uplink's.
    addresses: Vec<usize>,
    /// Egress: ports (ICMP identifiers) that may only change to one in the SNAT range.
    ports: Vec<usize>,
}

impl Allowed {
    fn new(len: usize) -> Self {
        Self {
            mask: vec![false; len],
            sums: Vec::new(),
            udp_checksums: Vec::new(),
            addresses: Vec::new(),
            ports: Vec::new(),
        }
    }

    /// Allows the `len` bytes at `at` when they lie before `end`; returns whether they do.
    fn field(&mut self, at: usize, len: usize, end: usize) -> bool {
        if at + len > end {
            return false;
        }
        for byte in self.mask.iter_mut().skip(at).take(len) {
            *byte = true;
        }
        true
    }
}

/// What may change in `frame` travelling in `direction`, or `None` when nothing may.
fn allowed(direction: Direction, frame: &[u8], uplink: [u8; 4]) -> Option<Allowed> {
    let ip = Ip::of_frame(frame)?;
    if direction == Direction::Ingress && ip.dst != uplink {
        // Only packets addressed to the uplink can be replies.
        return None;
    }
    let mut allowed = Allowed::new(frame.len());
    let end = ip.end;
    let address = translated_address_offset(direction, ip.start);
    allowed.field(address, 4, end);
    allowed.field(ip.start + 10, 2, end);
    allowed
        .sums
        .push((Sum::OuterIp, Coverage::of(ip.start..ip.l4())));
    if direction == Direction::Egress {
        allowed.addresses.push(address);
    }
    if ip.is_later_fragment() {
        return Some(allowed);
    }
    let l4 = ip.l4();
    let port = match direction {
        Direction::Egress => l4,
        Direction::Ingress => l4 + 2,
    };
    match ip.protocol {
        protocol if has_pseudo_header(protocol) => {
            let check = l4 + checksum_offset(protocol).unwrap_or(0);
            // A port may change only along with a checksum that accounts for it.
            if allowed.field(check, 2, end) {
                allowed.field(port, 2, end);
                if direction == Direction::Egress {
                    allowed.ports.push(port);
                }
                if protocol == proto::UDP {
                    allowed.udp_checksums.push(check);
                }
                // A UDP checksum of zero is "none": it covers nothing.
                if protocol != proto::UDP || be16(frame, check) != Some(0) {
                    allowed.sums.push((
                        Sum::OuterTransport,
                        Coverage::with_addresses_at(ip.start + 12, l4..end),
                    ));
                }
            }
        }
        proto::ICMP if l4 + 8 <= end => {
            let icmp_type = frame[l4];
            allowed.field(l4 + 2, 2, end);
            allowed
                .sums
                .push((Sum::OuterTransport, Coverage::of(l4..end)));
            if icmp_query_translated(direction, icmp_type, false) {
                allowed.field(l4 + 4, 2, end);
                if direction == Direction::Egress {
                    allowed.ports.push(l4 + 4);
                }
            } else if is_icmp_error(icmp_type) {
                quote(&mut allowed, direction, frame, l4 + 8, end);
            }
        }
        // SCTP keeps its port (CRC32c), other protocols have none.
        _ => {}
    }
    Some(allowed)
}

/// Whether an ICMP query of `icmp_type` has its identifier translated: requests leaving and
/// replies arriving; inside an error, the other way round (the quote is the packet the error
/// answers).
const fn icmp_query_translated(direction: Direction, icmp_type: u8, quoted: bool) -> bool {
    let request = matches!(icmp_type, 8 | 13);
    let reply = matches!(icmp_type, 0 | 14);
    match (direction, quoted) {
        (Direction::Egress, false) | (Direction::Ingress, true) => request,
        (Direction::Ingress, false) | (Direction::Egress, true) => reply,
    }
}

/// The fields of the packet an ICMP error quotes at `q` that a translation may change: the
/// quoted local address (the destination of a packet that came in, for errors leaving; the
/// source of one that went out, for errors arriving), the quoted port, and their checksums,
/// all only where they lie before the outer packet's `end`.
fn quote(allowed: &mut Allowed, direction: Direction, frame: &[u8], q: usize, end: usize) {
    if q + 20 > end {
        return;
    }
    let Some(quoted) = Ip::header_at(frame, q) else {
        return;
    };
    let address = match direction {
        Direction::Egress => q + 16,
        Direction::Ingress => q + 12,
    };
    allowed.field(address, 4, end);
    allowed.field(q + 10, 2, end);
    allowed.sums.push((
        Sum::QuotedIp,
        Coverage::of(q..(q + quoted.header_len).min(end)),
    ));
    if direction == Direction::Egress {
        allowed.addresses.push(address);
    }
    if quoted.is_later_fragment() {
        // Its bytes after the header are payload, not ports.
        return;
    }
    let l4 = quoted.l4();
    match quoted.protocol {
        protocol if has_pseudo_header(protocol) => {
            let port = match direction {
                Direction::Egress => l4 + 2,
                Direction::Ingress => l4,
            };
            // Quotes are often cut after 8 bytes: the port may change with its checksum out of
            // the quote.
            if allowed.field(port, 2, end) && direction == Direction::Egress {
                allowed.ports.push(port);
            }
            let check = l4 + checksum_offset(protocol).unwrap_or(0);
            if allowed.field(check, 2, end) {
                if protocol == proto::UDP {
                    allowed.udp_checksums.push(check);
                }
                if protocol != proto::UDP || be16(frame, check) != Some(0) {
                    allowed.sums.push((
                        Sum::QuotedTransport,
                        Coverage::with_addresses_at(q + 12, l4..end),
                    ));
                }
            }
        }
        proto::ICMP if l4 < end && icmp_query_translated(direction, frame[l4], true) => {
            if allowed.field(l4 + 4, 2, end) && direction == Direction::Egress {
                allowed.ports.push(l4 + 4);
            }
            if allowed.field(l4 + 2, 2, end) {
                allowed
                    .sums
                    .push((Sum::QuotedTransport, Coverage::of(l4..end)));
            }
        }
        _ => {}
    }
}

/// Where byte `at` of `frame` sits, for reports.
fn region(frame: &[u8], at: usize) -> Region {
    let Some(ip) = Ip::of_frame(frame) else {
        return Region::NotTranslatable;
    };
    let quoted_from = (ip.protocol == proto::ICMP
        && !ip.is_later_fragment()
        && frame
            .get(ip.l4())
            .is_some_and(|icmp_type| is_icmp_error(*icmp_type)))
    .then_some(ip.l4() + 8);
    if at < ip.start {
        Region::Ethernet
    } else if at >= ip.end {
        Region::BeyondTotalLength
    } else if at < ip.l4() {
        Region::IpHeader
    } else if quoted_from.is_some_and(|from| at >= from) {
        Region::Quote
    } else {
        Region::Transport
    }
}

/// Checks the bytes that changed against what a translation may change.
fn translation(observation: &Observation<'_>, violate: &mut impl FnMut(Kind, String)) {
    let Observation {
        direction,
        input,
        output,
        ..
    } = *observation;
    let uplink = observation.uplink.unwrap_or_default();
    let allowed = observation
        .uplink
        .and_then(|uplink| allowed(direction, input, uplink));
    let not_translatable = allowed.is_none();
    let allowed = allowed.unwrap_or_else(|| Allowed::new(input.len()));
    let mut outside: Vec<(Region, usize)> = Vec::new();
    for (at, (before, after)) in input.iter().zip(output).enumerate() {
        if before != after && !allowed.mask[at] {
            let region = if not_translatable {
                Region::NotTranslatable
            } else {
                region(input, at)
            };
            outside.push((region, at));
        }
    }
    let mut reported: Vec<Region> = Vec::new();
    for (region, _) in &outside {
        if reported.contains(region) {
            continue;
        }
        reported.push(*region);
        let offsets: Vec<String> = outside
            .iter()
            .filter(|(other, _)| other == region)
            .map(|(_, at)| format!("{at}: {:02x}->{:02x}", input[*at], output[*at]))
            .collect();
        violate(
            Kind::Outside(*region),
            format!("bytes at offsets {} ({region:?})", offsets.join(", ")),
        );
    }
    for (sum, coverage) in &allowed.sums {
        let (before, after) = (coverage.sum(input), coverage.sum(output));
        if before != after {
            violate(
                Kind::Checksum(*sum),
                format!("{sum:?} covers {before:#06x} before and {after:#06x} after (mod 0xffff)"),
            );
        }
    }
    for &at in &allowed.udp_checksums {
        let (before, after) = (be16(input, at), be16(output, at));
        if (before == Some(0)) != (after == Some(0)) {
            violate(
                Kind::UdpZero,
                format!("UDP checksum at {at}: {before:04x?} -> {after:04x?}"),
            );
        }
    }
    for &at in &allowed.addresses {
        let after = addr4(output, at).unwrap_or_default();
        if addr4(input, at) != Some(after) && after != uplink {
            violate(
                Kind::Address,
                format!(
                    "address at {at} rewritten to {}, not the uplink's {}",
                    Ipv4Addr::from(after),
                    Ipv4Addr::from(uplink)
                ),
            );
        }
    }
    for &at in &allowed.ports {
        let after = be16(output, at).unwrap_or_default();
        if be16(input, at) != Some(after)
            && !observation.ranges.iter().any(|range| range.contains(after))
        {
            violate(
                Kind::PortRange,
                format!("port at {at} rewritten to {after}, outside the SNAT range"),
            );
        }
    }
}

/// The flow an ICMP error quotes, as far as the outer packet holds it.
fn quoted_flow(frame: &[u8]) -> Option<(Ip, Tuple)> {
    let ip = Ip::of_frame(frame)?;
    let q = ip.l4() + 8;
    let is_error = ip.protocol == proto::ICMP
        && !ip.is_later_fragment()
        && frame
            .get(ip.l4())
            .is_some_and(|icmp_type| is_icmp_error(*icmp_type));
    if !is_error || q + 20 > ip.end {
        return None;
    }
    let quoted = Ip::header_at(frame, q)?;
    Some((quoted, Tuple::of_packet(frame, &quoted, ip.end)?))
}

/// Reports a packet of a mapped flow, a reply to one, or an ICMP error about one, that was
/// not translated.
fn not_missed(
    observation: &Observation<'_>,
    counter: Counter,
    model: &Model,
    violate: &mut impl FnMut(Kind, String),
) {
    let Some(uplink) = observation.uplink else {
        return;
    };
    let input = observation.input;
    let Some(ip) = Ip::of_frame(input) else {
        return;
    };
    let flow = Tuple::of_frame(input);
    let quoted = quoted_flow(input).map(|(_, flow)| flow.reversed());
    let (mapped, wanted): (Option<Tuple>, &[Counter]) = match observation.direction {
        Direction::Egress => match (flow, quoted) {
            (Some(flow), _) if model.by_original.contains_key(&flow) => (
                Some(flow),
                &[Counter::EgressMasqueraded, Counter::EgressHostTracked],
            ),
            (_, Some(flow)) if model.by_original.contains_key(&flow) => {
                (Some(flow), &[Counter::EgressIcmpErrorTranslated])
            }
            _ => (None, &[]),
        },
        Direction::Ingress if ip.dst != uplink => (None, &[]),
        Direction::Ingress => match (flow, quoted) {
            (Some(flow), _) if model.by_reply.contains_key(&flow) => {
                (Some(flow), &[Counter::IngressReverseNat])
            }
            (_, Some(flow)) if model.by_reply.contains_key(&flow) => {
                (Some(flow), &[Counter::IngressIcmpErrorTranslated])
            }
            _ => (None, &[]),
        },
    };
    if let Some(flow) = mapped
        && !wanted.contains(&counter)
    {
        violate(
            Kind::Missed,
            format!(
                "{flow:?} is mapped, yet the packet was counted as {}",
                counter.name()
            ),
        );
    }
}

fn show(address: [u8; 4], port: u16) -> String {
    format!("{}:{port}", Ipv4Addr::from(address))
}

/// Checks a translation against the mappings the fuzzer saw created.
fn mapping(
    observation: &Observation<'_>,
    counter: Counter,
    model: &Model,
    violate: &mut impl FnMut(Kind, String),
) {
    let Observation { input, output, .. } = *observation;
    match counter {
        Counter::EgressNewMapping | Counter::EgressMasqueraded | Counter::EgressHostTracked => {
            let (Some(original), Some(left)) = (Tuple::of_frame(input), Tuple::of_frame(output))
            else {
                violate(
                    Kind::Mapping,
                    format!("{} on a packet without a flow", counter.name()),
                );
                return;
            };
            let nat = (left.src, left.src_port);
            match model.by_original.get(&original) {
                Some(known) if *known != nat => violate(
                    Kind::Mapping,
                    format!(
                        "established flow {original:?} left as {} instead of {}",
                        show(nat.0, nat.1),
                        show(known.0, known.1)
                    ),
                ),
                Some(_) if counter == Counter::EgressNewMapping => violate(
                    Kind::Mapping,
                    format!("a second mapping created for the live flow {original:?}"),
                ),
                Some(_) => {}
                None if counter == Counter::EgressMasqueraded => violate(
                    Kind::Mapping,
                    format!("{original:?} masqueraded by a mapping never created"),
                ),
                None => {
                    let reply = super::model::Mapping { original, nat }.reply();
                    if let Some(owner) = model.by_reply.get(&reply)
                        && *owner != (original.src, original.src_port)
                    {
                        violate(
                            Kind::Mapping,
                            format!(
                                "new flow {original:?} got the reply tuple of the live flow from {}",
                                show(owner.0, owner.1)
                            ),
                        );
                    }
                }
            }
        }
        Counter::IngressReverseNat => {
            let (Some(reply), Some(restored)) = (Tuple::of_frame(input), Tuple::of_frame(output))
            else {
                violate(
                    Kind::Mapping,
                    "reverse NAT of a packet without a flow".to_owned(),
                );
                return;
            };
            match model.by_reply.get(&reply) {
                None => violate(
                    Kind::Mapping,
                    format!("reply {reply:?} restored without a mapping"),
                ),
                Some(pod) if *pod != (restored.dst, restored.dst_port) => violate(
                    Kind::Mapping,
                    format!(
                        "reply {reply:?} restored to {} instead of {}",
                        show(restored.dst, restored.dst_port),
                        show(pod.0, pod.1)
                    ),
                ),
                Some(_) => {}
            }
        }
        Counter::EgressIcmpErrorTranslated | Counter::IngressIcmpErrorTranslated => {
            icmp_error_mapping(observation, model, violate);
        }
        _ => {}
    }
}

fn icmp_error_mapping(
    observation: &Observation<'_>,
    model: &Model,
    violate: &mut impl FnMut(Kind, String),
) {
    let Observation {
        direction,
        input,
        output,
        ..
    } = *observation;
    let Some((quoted, flow)) = quoted_flow(input) else {
        violate(
            Kind::Mapping,
            "translated an ICMP error whose quote does not hold a flow".to_owned(),
        );
        return;
    };
    let outer = Ip::of_frame(input).map_or(0, |ip| ip.start);
    let (expected, looked_up) = match direction {
        // The quote is a reply as the pod got it: remote -> pod. Its flow, reversed, is the
        // mapping's original tuple.
        Direction::Egress => (model.by_original.get(&flow.reversed()), flow.reversed()),
        // The quote is a packet as it left: node -> remote. Reversed, it is the reply tuple.
        Direction::Ingress => (model.by_reply.get(&flow.reversed()), flow.reversed()),
    };
    let Some(&(address, port)) = expected else {
        violate(
            Kind::Mapping,
            format!("translated an ICMP error about {looked_up:?}, which has no mapping"),
        );
        return;
    };
    let (outer_at, quoted_at) = match direction {
        Direction::Egress => (outer + 12, quoted.start + 16),
        Direction::Ingress => (outer + 16, quoted.start + 12),
    };
    // Protocols mapped by address alone have no port in the quote (their mappings' is 0).
    let port_at = match (direction, quoted.protocol) {
        (_, proto::ICMP) => Some(quoted.l4() + 4),
        (Direction::Egress, proto::TCP | proto::UDP | proto::SCTP) => Some(quoted.l4() + 2),
        (Direction::Ingress, proto::TCP | proto::UDP | proto::SCTP) => Some(quoted.l4()),
        _ => None,
    };
    let got = (
        addr4(output, outer_at).unwrap_or_default(),
        addr4(output, quoted_at).unwrap_or_default(),
        port_at.map_or(0, |at| be16(output, at).unwrap_or_default()),
    );
    if got != (address, address, port) {
        violate(
            Kind::Mapping,
            format!(
                "ICMP error about {looked_up:?} sent to/from {}, quoting {}, instead of {}",
                Ipv4Addr::from(got.0),
                show(got.1, got.2),
                show(address, port)
            ),
        );
    }
}

/// The oracle must catch what it claims to: hand-made outputs, each wrong in one way.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        fuzz::{
            model::Mapping,
            wire::{ETH_HLEN, fix_ip_checksum},
        },
        pktgen::{Packet, TCP_ACK, TCP_SYN},
    };

    const NODE: [u8; 4] = [192, 0, 2, 1];
    const RANGE: [PortRange; 1] = [PortRange::new(20_000, 20_000)];

    fn kinds(
        direction: Direction,
        input: &[u8],
        output: &[u8],
        moved: &[(Counter, u64)],
        model: &Model,
    ) -> Vec<Kind> {
        let code = if moved.iter().any(|(counter, _)| DROPS.contains(counter)) {
            DROP
        } else {
            PASS
        };
        let observation = Observation {
            direction,
            input,
            code,
            output,
            moved,
            uplink: Some(NODE),
            uplink_v6: None,
            ranges: &RANGE,
        };
        check(&observation, model)
            .1
            .into_iter()
            .map(|violation| violation.kind)
            .collect()
    }

    fn syn(from: &str) -> Vec<u8> {
        Packet::tcp(from, "203.0.113.10:443", TCP_SYN).frame()
    }

    fn egress(input: &[u8], output: &[u8], counter: Counter) -> Vec<Kind> {
        kinds(
            Direction::Egress,
            input,
            output,
            &[(counter, 1)],
            &Model::default(),
        )
    }

    #[test]
    fn a_correct_translation_passes() {
        // pktgen computes every checksum from scratch: the translated packet built directly.
        let input = syn("10.244.1.5:40000");
        let output = syn("192.0.2.1:20000");
        assert_eq!(egress(&input, &output, Counter::EgressNewMapping), []);
        assert_eq!(egress(&input, &input, Counter::EgressExemptCidr), []);
    }

    #[test]
    fn checksums_must_keep_their_sum() {
        let input = syn("10.244.1.5:40000");
        let mut output = syn("192.0.2.1:20000");
        output[ETH_HLEN + 20 + 17] ^= 1;
        assert_eq!(
            egress(&input, &output, Counter::EgressNewMapping),
            [Kind::Checksum(Sum::OuterTransport)]
        );
        // A wrong checksum must not come out right.
        let mut bad_input = input.clone();
        bad_input[ETH_HLEN + 20 + 17] ^= 1;
        assert_eq!(
            egress(
                &bad_input,
                &syn("192.0.2.1:20000"),
                Counter::EgressNewMapping
            ),
            [Kind::Checksum(Sum::OuterTransport)]
        );
        let mut output = syn("192.0.2.1:20000");
        output[ETH_HLEN + 11] ^= 1;
        assert_eq!(
            egress(&input, &output, Counter::EgressNewMapping),
            [Kind::Checksum(Sum::OuterIp)]
        );
    }

    #[test]
    fn only_translated_fields_may_change() {
        let input = syn("10.244.1.5:40000");
        let mut output = syn("192.0.2.1:20000");
        output[ETH_HLEN + 8] = 63; // TTL
        fix_ip_checksum(&mut output, ETH_HLEN);
        assert_eq!(
            egress(&input, &output, Counter::EgressNewMapping),
            [Kind::Outside(Region::IpHeader)]
        );
        let mut trailed = input.clone();
        trailed.extend_from_slice(&[0; 4]);
        let mut output = syn("192.0.2.1:20000");
        output.extend_from_slice(&[0, 0, 0, 1]);
        assert_eq!(
            egress(&trailed, &output, Counter::EgressNewMapping),
            [Kind::Outside(Region::BeyondTotalLength)]
        );
        // SCTP keeps its port.
        let sctp = Packet::sctp("10.244.1.5:3868", "203.0.113.10:3868").frame();
        let moved = Packet::sctp("192.0.2.1:20000", "203.0.113.10:3868").frame();
        assert_eq!(
            egress(&sctp, &moved, Counter::EgressNewMapping),
            [Kind::Outside(Region::Transport)]
        );
        // Nothing at all changes when the outcome says untouched.
        assert_eq!(
            egress(&input, &syn("192.0.2.1:20000"), Counter::EgressExemptCidr),
            [Kind::ChangedWhenUntouched]
        );
    }

    #[test]
    fn addresses_ports_and_udp_zero_checksums() {
        let input = syn("10.244.1.5:40000");
        assert_eq!(
            egress(&input, &syn("192.0.2.2:20000"), Counter::EgressNewMapping),
            [Kind::Address]
        );
        assert_eq!(
            egress(&input, &syn("192.0.2.1:20001"), Counter::EgressNewMapping),
            [Kind::PortRange]
        );
        let bare = Packet::udp_without_checksum("10.244.1.5:40000", "203.0.113.10:53").frame();
        let filled = Packet::udp("192.0.2.1:20000", "203.0.113.10:53").frame();
        assert_eq!(
            egress(&bare, &filled, Counter::EgressNewMapping),
            [Kind::UdpZero]
        );
        let kept = Packet::udp_without_checksum("192.0.2.1:20000", "203.0.113.10:53").frame();
        assert_eq!(egress(&bare, &kept, Counter::EgressNewMapping), []);
    }

    #[test]
    fn counters_and_verdicts_must_agree() {
        let input = syn("10.244.1.5:40000");
        let model = Model::default();
        let two = [
            (Counter::EgressExemptCidr, 1),
            (Counter::EgressHostPassed, 1),
        ];
        assert_eq!(
            kinds(Direction::Egress, &input, &input, &two, &model),
            [Kind::Counters]
        );
        let other_direction = [(Counter::EgressExemptCidr, 1), (Counter::IngressPassed, 1)];
        assert_eq!(
            kinds(Direction::Egress, &input, &input, &other_direction, &model),
            [Kind::Counters]
        );
        let event = [
            (Counter::EgressExemptCidr, 1),
            (Counter::MappingConflict, 1),
        ];
        assert_eq!(
            kinds(Direction::Egress, &input, &input, &event, &model),
            [Kind::Counters]
        );
        // Counted as not IPv4, but it is.
        assert_eq!(
            egress(&input, &input, Counter::EgressNotIpv4),
            [Kind::Classification]
        );
        let observation = Observation {
            direction: Direction::Egress,
            input: &input,
            code: 0,
            output: &input,
            moved: &[(Counter::EgressExemptCidr, 1)],
            uplink: Some(NODE),
            uplink_v6: None,
            ranges: &RANGE,
        };
        assert_eq!(check(&observation, &model).1[0].kind, Kind::Action);
        let shorter = &input[..input.len() - 1];
        assert_eq!(
            egress(&input, shorter, Counter::EgressExemptCidr),
            [Kind::Length]
        );
    }

    /// The model after a flow of `protocol` from 10.244.1.5:`pod_port` to
    /// 203.0.113.10:`remote_port` left as the node's `nat_port`.
    fn mapped_flow(protocol: u8, pod_port: u16, remote_port: u16, nat_port: u16) -> Model {
        let mut model = Model::default();
        let original = Tuple {
            protocol,
            src: [10, 244, 1, 5],
            src_port: pod_port,
            dst: [203, 0, 113, 10],
            dst_port: remote_port,
        };
        let mapping = Mapping {
            original,
            nat: (NODE, nat_port),
        };
        model.by_original.insert(original, mapping.nat);
        model
            .by_reply
            .insert(mapping.reply(), ([10, 244, 1, 5], pod_port));
        model.mappings.push(mapping);
        model
    }

    fn mapped() -> Model {
        mapped_flow(proto::TCP, 40_000, 443, 20_000)
    }

    #[test]
    fn translations_follow_the_mappings_seen() {
        let model = mapped();
        let ack = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK).frame();
        // The flow is mapped, yet the packet went out untranslated.
        let moved = [(Counter::EgressExemptCidr, 1)];
        assert_eq!(
            kinds(Direction::Egress, &ack, &ack, &moved, &model),
            [Kind::Missed]
        );
        // Or translated to another port.
        let elsewhere = Packet::tcp("192.0.2.1:20001", "203.0.113.10:443", TCP_ACK).frame();
        let ranges_ok = [(Counter::EgressMasqueraded, 1)];
        assert!(
            kinds(Direction::Egress, &ack, &elsewhere, &ranges_ok, &model).contains(&Kind::Mapping)
        );
        // A reply restored to the wrong pod port.
        let reply = Packet::tcp("203.0.113.10:443", "192.0.2.1:20000", TCP_ACK).frame();
        let wrong = Packet::tcp("203.0.113.10:443", "10.244.1.5:40001", TCP_ACK).frame();
        let moved = [(Counter::IngressReverseNat, 1)];
        assert_eq!(
            kinds(Direction::Ingress, &reply, &wrong, &moved, &model),
            [Kind::Mapping]
        );
        let right = Packet::tcp("203.0.113.10:443", "10.244.1.5:40000", TCP_ACK).frame();
        assert_eq!(
            kinds(Direction::Ingress, &reply, &right, &moved, &model),
            []
        );
    }

    #[test]
    fn errors_about_address_only_flows_are_checked_by_address() {
        let model = mapped_flow(proto::GRE, 0, 0, 0);
        // A GRE header with the key bit set: its first bytes are no port of the mapping's.
        let gre = [0x20, 0, 0x08, 0, 0, 0, 0, 7];
        let error_about = |from: &str, to: &str| {
            let quoted = Packet::raw(from, "203.0.113.10", proto::GRE)
                .payload(&gre)
                .ip_packet();
            Packet::icmp_error("198.51.100.1", to, 3, 4, &quoted).frame()
        };
        let error = error_about("192.0.2.1", "192.0.2.1");
        let moved = [(Counter::IngressIcmpErrorTranslated, 1)];
        let right = error_about("10.244.1.5", "10.244.1.5");
        assert_eq!(
            kinds(Direction::Ingress, &error, &right, &moved, &model),
            []
        );
        let wrong = error_about("10.244.2.7", "10.244.2.7");
        assert_eq!(
            kinds(Direction::Ingress, &error, &wrong, &moved, &model),
            [Kind::Mapping]
        );
        let passed = [(Counter::IngressPassed, 1)];
        assert_eq!(
            kinds(Direction::Ingress, &error, &error, &passed, &model),
            [Kind::Missed]
        );
    }

    #[test]
    fn drops_need_a_taken_port() {
        let syn = Packet::tcp("10.244.2.7:40000", "203.0.113.10:443", TCP_SYN).frame();
        let moved = [(Counter::EgressDropNoPort, 1)];
        assert_eq!(
            kinds(Direction::Egress, &syn, &syn, &moved, &Model::default()),
            [Kind::Drop]
        );
        assert_eq!(kinds(Direction::Egress, &syn, &syn, &moved, &mapped()), []);
    }

    #[test]
    fn later_fragments_follow_the_first_and_quoted_fragments_are_payload() {
        let mut model = Model::default();
        let later = Packet::udp("10.244.1.5:0", "203.0.113.10:0")
            .ip_id(9)
            .later_fragment(4, false, &[1; 16])
            .frame();
        let ip = Ip::of_frame(&later).unwrap_or_else(|| panic!("unparsable"));
        model.egress_datagrams.insert(
            DatagramKey::of(&ip),
            FirstFragment {
                left_with: Some([10, 244, 1, 5]),
                counter: Some(Counter::EgressTcpMidstreamPassed),
            },
        );
        let mut translated = later.clone();
        translated[ETH_HLEN + 12..ETH_HLEN + 16].copy_from_slice(&NODE);
        fix_ip_checksum(&mut translated, ETH_HLEN);
        let moved = [(Counter::EgressFragmentTranslated, 1)];
        assert_eq!(
            kinds(Direction::Egress, &later, &translated, &moved, &model),
            [Kind::Fragment]
        );
        // An error quoting a later fragment: the bytes after the quoted header are payload.
        let quoted = Packet::raw("192.0.2.1", "203.0.113.10", proto::TCP)
            .later_fragment(1, false, &[0x4e, 0x20, 0x01, 0xbb, 0, 0, 0, 0])
            .ip_packet();
        let error = Packet::icmp_error("198.51.100.1", "192.0.2.1", 11, 0, &quoted).frame();
        let mut rewritten = quoted.clone();
        rewritten[20..22].copy_from_slice(&40_000u16.to_be_bytes());
        let output = Packet::icmp_error("198.51.100.1", "192.0.2.1", 11, 0, &rewritten).frame();
        let moved = [(Counter::IngressIcmpErrorTranslated, 1)];
        assert!(
            kinds(Direction::Ingress, &error, &output, &moved, &mapped())
                .contains(&Kind::Outside(Region::Quote))
        );
    }
}
