//! IPv6 through an uplink that translates it (`has_v6`): the frames (pod flows, replies to the
//! mappings they made, Packet Too Big about them, pods' Destination Unreachable about replies
//! they got, datagrams in fragments sent in any order or without their first, chains of 1 to 7
//! hop-by-hop, routing and destination options headers, exempt and link-scoped traffic,
//! unsolicited packets, all sometimes cut, lied about or corrupted) and the oracle's IPv6
//! checks. Only the translated end's address and port (the ICMPv6 echo identifier), the
//! transport checksum and an error's quote may change; a checksum that verified still
//! verifies; egress leaves with the uplink's IPv6 address and a port of the range; a flow keeps
//! its mapping, whatever extension headers it carries; replies and errors about a mapping get
//! the pod's end back, a pod's error about a reply the node's; a mapped flow is never missed; a
//! later fragment leaves with the address its first fragment left with, and is never
//! translated on ingress without one; a packet with more extension headers than the datapath
//! walks passes as it was, counted.

use std::{collections::HashMap, net::Ipv6Addr};

use masq_common::{counters::Counter, nat::Direction, ports::PortRange};

use super::{generate::Pending, model::FirstFragment};
use super::{
    oracle::{Kind, Region, Sum, TRANSLATING},
    rng::Rng,
    wire::{ETH_HLEN, be16, proto},
};
use crate::pktgen6::{
    DESTINATION_OPTIONS, FRAGMENT, HOP_BY_HOP, ICMPV6_DEST_UNREACH, ICMPV6_ECHO_REPLY,
    ICMPV6_ECHO_REQUEST, ICMPV6_PACKET_TOO_BIG, Packet6, ROUTING,
};

/// The uplink's IPv6 address in IPv6 epochs.
pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
/// Pods, in the non-masquerade 2001:db8:ab::/48 the fuzzer configures.
pub const PODS_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0x2001, 0xdb8, 0xab, 0, 0, 0, 0, 5),
    Ipv6Addr::new(0x2001, 0xdb8, 0xab, 1, 0, 0, 0, 7),
];
/// The non-masquerade IPv6 CIDR the fuzzer configures (the pods' network).
pub const EXEMPT_V6_CIDR: &str = "2001:db8:ab::/48";
const REMOTES_V6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0x2001, 0xdb8, 0xfe, 0, 0, 0, 0, 2),
];
const ROUTER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x77, 0, 0, 0, 0, 1);
const LOCAL_PORTS: [u16; 5] = [40_000, 40_001, 5353, 20_000, 25_000];
const REMOTE_PORTS: [u16; 3] = [443, 53, 80];
const TCP_FLAGS: [u8; 6] = [0x02, 0x10, 0x18, 0x12, 0x11, 0x04];
const IPV6_HLEN: usize = 40;
/// Where the extension headers (or the transport header) start.
const L4: usize = ETH_HLEN + IPV6_HLEN;
/// The IPsec authentication header, walked by the datapath though never generated here.
const AUTHENTICATION: u8 = 51;
/// Extension headers the datapath walks to the transport header; a packet with more is passed
/// untouched and counted (egress as unsupported, ingress as passed).
pub const MAX_EXTENSION_HEADERS: usize = 6;
const SRC: usize = ETH_HLEN + 8;
const DST: usize = ETH_HLEN + 24;

/// A flow as the model keys it: protocol, then the sender's end and the other (an echo's
/// identifier is the pod's end's port, the remote's is 0: the request's first, the reply's
/// second).
type Flow = (u8, Ipv6Addr, u16, Ipv6Addr, u16);

/// What the fuzzer learnt of the IPv6 mappings in an epoch.
#[derive(Debug, Default)]
pub struct Model6 {
    /// By the flow as a pod sent it, the port it leaves with.
    by_original: HashMap<Flow, u16>,
    /// By the reply's flow (remote end, then the node's), the pod's end.
    by_reply: HashMap<Flow, (Ipv6Addr, u16)>,
    /// The flows as sent, oldest first, for replies.
    originals: Vec<Flow>,
    /// What became of the first fragment of each datagram, by direction and datagram.
    datagrams: HashMap<(Direction, Datagram), FirstFragment<Ipv6Addr>>,
    /// Paths of the datapath reached, over every epoch (the fuzzer keeps them when it forgets
    /// the rest).
    pub reached: Reached6,
}

/// How often frames reached paths no counter of their own tells.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reached6 {
    /// Translated packets with extension headers before the transport header.
    pub translated_with_extensions: u64,
    /// Packets with more extension headers than the datapath walks.
    pub too_deep: u64,
    /// Later fragments translated as their first fragment was.
    pub fragments_followed: u64,
}

/// Identifies a fragmented datagram, like the datapath's fragment table: addresses,
/// identification, and the protocol after the extension headers.
type Datagram = (Ipv6Addr, Ipv6Addr, u32, u8);

/// A Fragment extension header's fields.
#[derive(Clone, Copy, Debug)]
struct Fragment {
    id: u32,
    /// In 8-byte units.
    offset: u16,
    more: bool,
}

/// The parts of an IPv6 frame the checks read, as far as the frame holds them.
#[derive(Clone, Copy, Debug)]
struct Parsed {
    src: Ipv6Addr,
    dst: Ipv6Addr,
    /// The protocol after the extension headers (the transport's, or one not walked).
    next: u8,
    /// Where that header starts.
    l4: usize,
    /// The extension headers walked to it (a fragment header among them).
    extensions: usize,
    fragment: Option<Fragment>,
    /// Where the packet ends by its payload length, if the frame holds all of it.
    end: Option<usize>,
}

impl Parsed {
    const fn is_later_fragment(&self) -> bool {
        matches!(self.fragment, Some(Fragment { offset, .. }) if offset != 0)
    }

    const fn datagram(&self) -> Option<Datagram> {
        match self.fragment {
            Some(fragment) => Some((self.src, self.dst, fragment.id, self.next)),
            None => None,
        }
    }

    /// Whether the datapath walks the extension headers to the transport header.
    const fn walked(&self) -> bool {
        self.extensions <= MAX_EXTENSION_HEADERS
    }
}

fn address(frame: &[u8], at: usize) -> Option<Ipv6Addr> {
    let octets: [u8; 16] = frame.get(at..at + 16)?.try_into().ok()?;
    Some(Ipv6Addr::from(octets))
}

fn parse(frame: &[u8]) -> Option<Parsed> {
    if frame.get(12..14) != Some(&[0x86, 0xdd]) || frame.get(ETH_HLEN)? >> 4 != 6 {
        return None;
    }
    let end = L4 + usize::from(be16(frame, ETH_HLEN + 4)?);
    let mut next = *frame.get(ETH_HLEN + 6)?;
    let mut l4 = L4;
    let mut extensions = 0;
    let mut fragment = None;
    // The chain, as the datapath walks it (and a header further, to tell a chain too long).
    while extensions <= MAX_EXTENSION_HEADERS {
        let length = match next {
            HOP_BY_HOP | ROUTING | DESTINATION_OPTIONS => {
                (usize::from(*frame.get(l4 + 1)?) + 1) * 8
            }
            AUTHENTICATION => (usize::from(*frame.get(l4 + 1)?) + 2) * 4,
            FRAGMENT => {
                let field = be16(frame, l4 + 2)?;
                let id = frame.get(l4 + 4..l4 + 8)?;
                fragment = Some(Fragment {
                    id: u32::from_be_bytes(id.try_into().ok()?),
                    offset: field >> 3,
                    more: field & 1 != 0,
                });
                8
            }
            _ => break,
        };
        next = *frame.get(l4)?;
        l4 += length;
        extensions += 1;
    }
    Some(Parsed {
        src: address(frame, SRC)?,
        dst: address(frame, DST)?,
        next,
        l4,
        extensions,
        fragment,
        end: (end <= frame.len() && l4 <= end).then_some(end),
    })
}

/// How many extension headers precede the transport header of an IPv6 frame (up to one more
/// than the datapath walks).
pub fn extension_headers(frame: &[u8]) -> Option<usize> {
    parse(frame).map(|parsed| parsed.extensions)
}

/// The transport checksum of `transport` over the IPv6 pseudo-header: 0 when it verifies.
fn verifies(src: Ipv6Addr, dst: Ipv6Addr, next: u8, transport: &[u8]) -> bool {
    crate::pktgen6::checksum6(src, dst, next, transport) == 0
}

/// Offsets, from the transport header, of the translated end's port (an echo's identifier) and
/// of the checksum, for the protocols translated with a port (none in a later fragment).
fn port_and_checksum(
    parsed: &Parsed,
    frame: &[u8],
    direction: Direction,
) -> Option<(usize, usize)> {
    let port = |egress, ingress| match direction {
        Direction::Egress => egress,
        Direction::Ingress => ingress,
    };
    if parsed.is_later_fragment() {
        return None;
    }
    match parsed.next {
        proto::TCP => Some((port(0, 2), 16)),
        proto::UDP => Some((port(0, 2), 6)),
        proto::ICMPV6 => match *frame.get(parsed.l4)? {
            ICMPV6_ECHO_REQUEST | ICMPV6_ECHO_REPLY => Some((4, 2)),
            _ => None,
        },
        _ => None,
    }
}

/// The flow of a TCP, UDP or echo packet, from the sender's point of view (none for a later
/// fragment, which has no transport header).
fn flow_of(frame: &[u8]) -> Option<Flow> {
    let parsed = parse(frame)?;
    if parsed.is_later_fragment() {
        return None;
    }
    let l4 = parsed.l4;
    match parsed.next {
        proto::TCP | proto::UDP => Some((
            parsed.next,
            parsed.src,
            be16(frame, l4)?,
            parsed.dst,
            be16(frame, l4 + 2)?,
        )),
        proto::ICMPV6 => {
            let id = be16(frame, l4 + 4)?;
            match *frame.get(l4)? {
                ICMPV6_ECHO_REQUEST => Some((parsed.next, parsed.src, id, parsed.dst, 0)),
                ICMPV6_ECHO_REPLY => Some((parsed.next, parsed.src, 0, parsed.dst, id)),
                _ => None,
            }
        }
        _ => None,
    }
}

impl Model6 {
    /// Learns the mapping an egress translation made or used, and what became of first
    /// fragments.
    /// Forgets the flow `input` (a frame of either direction) belongs to: a RST while no
    /// answer had come ended it.
    pub fn forget_refused(&mut self, direction: Direction, input: &[u8]) {
        let Some(flow) = flow_of(input) else {
            return;
        };
        let (protocol, pod, pod_port, remote, remote_port) = match direction {
            Direction::Egress => flow,
            Direction::Ingress => match self.by_reply.get(&flow) {
                Some(&(pod, pod_port)) => (flow.0, pod, pod_port, flow.1, flow.2),
                None => return,
            },
        };
        self.by_original
            .remove(&(protocol, pod, pod_port, remote, remote_port));
        self.by_reply.retain(|reply, owner| {
            !(reply.0 == protocol
                && reply.1 == remote
                && reply.2 == remote_port
                && *owner == (pod, pod_port))
        });
    }

    pub fn learn(
        &mut self,
        direction: Direction,
        input: &[u8],
        output: Option<&[u8]>,
        counter: Option<Counter>,
    ) {
        let Some(parsed) = parse(input) else {
            return;
        };
        let translated = matches!(
            counter,
            Some(
                Counter::EgressNewMapping
                    | Counter::EgressMasqueraded
                    | Counter::IngressReverseNat
                    | Counter::EgressIcmpErrorTranslated
                    | Counter::IngressIcmpErrorTranslated
            )
        );
        if translated
            && parsed.walked()
            && parsed.extensions > usize::from(parsed.fragment.is_some())
        {
            self.reached.translated_with_extensions += 1;
        }
        if !parsed.walked() {
            self.reached.too_deep += 1;
        }
        if counter.is_some_and(|counter| {
            matches!(
                counter,
                Counter::EgressFragmentTranslated | Counter::IngressFragmentTranslated
            )
        }) && self.first_fragment(direction, &parsed).is_some()
        {
            self.reached.fragments_followed += 1;
        }
        // A first fragment the datapath decided on (translated, or exempt and left alone):
        // its later fragments follow.
        let decided = translated
            || matches!(
                counter,
                Some(
                    Counter::EgressExemptCidr
                        | Counter::EgressExemptLinkLocal
                        | Counter::EgressExemptSource
                )
            );
        if let (Some(datagram), Some(fragment)) = (parsed.datagram(), parsed.fragment)
            && fragment.offset == 0
            && fragment.more
            && parsed.walked()
            && decided
        {
            let at = match direction {
                Direction::Egress => SRC,
                Direction::Ingress => DST,
            };
            let left_with = output.and_then(|output| address(output, at));
            self.datagrams
                .insert((direction, datagram), FirstFragment { left_with, counter });
        }
        if direction != Direction::Egress
            || !matches!(
                counter,
                Some(Counter::EgressNewMapping | Counter::EgressMasqueraded)
            )
        {
            return;
        }
        let (Some(original), Some(left)) = (flow_of(input), output.and_then(flow_of)) else {
            return;
        };
        let (protocol, pod, pod_port, remote, remote_port) = original;
        let port = left.2;
        if self.by_original.insert(original, port).is_none() {
            self.originals.push(original);
        }
        self.by_reply.insert(
            (protocol, remote, remote_port, NODE_V6, port),
            (pod, pod_port),
        );
    }

    /// What became of the first fragment of a later fragment's datagram.
    fn first_fragment(
        &self,
        direction: Direction,
        parsed: &Parsed,
    ) -> Option<&FirstFragment<Ipv6Addr>> {
        if !parsed.is_later_fragment() {
            return None;
        }
        self.datagrams.get(&(direction, parsed.datagram()?))
    }
}

/// Crafts IPv6 frames, mostly about the flows the model knows; keeps the later fragments of
/// a datagram to send them after, in any order.
#[derive(Debug, Default)]
pub struct Generator6 {
    pending: Pending,
}

impl Generator6 {
    /// Forgets the pending fragments (a new epoch).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// The next IPv6 frame.
    pub fn frame(&mut self, rng: &mut Rng, model: &Model6) -> (Direction, Vec<u8>) {
        if let Some(frame) = self.pending.take(rng, 50) {
            return frame;
        }
        let known = (!model.originals.is_empty()).then(|| rng.pick(&model.originals));
        let (direction, mut frame) = match (rng.weighted(&[30, 20, 25, 8, 8, 9, 10, 6]), known) {
            (1, Some(flow)) => (Direction::Egress, from(rng, flow, false)),
            (2, Some(flow)) => (Direction::Ingress, reply(rng, model, flow)),
            (5, Some(flow)) => (Direction::Ingress, too_big(rng, model, flow)),
            (6, Some(flow)) => self.fragments(rng, model, flow),
            (7, Some(flow)) => (Direction::Egress, unreachable(rng, flow)),
            (3, _) => (Direction::Egress, exempt(rng)),
            (4, _) => {
                let flow = (
                    rng.pick(&[proto::TCP, proto::UDP]),
                    rng.pick(&REMOTES_V6),
                    rng.pick(&REMOTE_PORTS),
                    NODE_V6,
                    rng.pick(&LOCAL_PORTS),
                );
                (Direction::Ingress, from(rng, flow, false))
            }
            _ => {
                let protocol = rng.pick(&[proto::TCP, proto::UDP, proto::ICMPV6]);
                let flow = (
                    protocol,
                    rng.pick(&PODS_V6),
                    rng.pick(&LOCAL_PORTS),
                    rng.pick(&REMOTES_V6),
                    if protocol == proto::ICMPV6 {
                        0
                    } else {
                        rng.pick(&REMOTE_PORTS)
                    },
                );
                (Direction::Egress, from(rng, flow, true))
            }
        };
        if rng.chance(20) {
            mutate(rng, &mut frame);
        }
        (direction, frame)
    }

    /// A datagram of `flow` (from the pod, or a reply to it) in fragments: returns the first,
    /// or sometimes a later one (before the first, or alone), and keeps the others pending.
    fn fragments(&mut self, rng: &mut Rng, model: &Model6, flow: Flow) -> (Direction, Vec<u8>) {
        let (direction, whole) = if rng.chance(60) {
            (Direction::Egress, packet(rng, flow, false))
        } else {
            let (protocol, node, port, remote, remote_port) = as_translated(rng, model, flow);
            let reply = (protocol, remote, remote_port, node, port);
            (Direction::Ingress, packet(rng, reply, false))
        };
        let id = rng.u32();
        let mut transport = whole.transport.clone();
        let more = rng.between(8, 48);
        transport.extend_from_slice(&rng.bytes(more));
        if whole.protocol == proto::UDP {
            let len = u16::try_from(transport.len()).unwrap_or(u16::MAX);
            transport[4..6].copy_from_slice(&len.to_be_bytes());
        }
        // The checksum covers the whole datagram, in the first fragment.
        if let Some(at) = whole.checksum_at {
            transport[at..at + 2].fill(0);
            let sum = crate::pktgen6::checksum6(whole.src, whole.dst, whole.protocol, &transport);
            transport[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        }
        let mut frames = Vec::new();
        let mut at = 0;
        while at < transport.len() {
            // The first fragment holds the transport header (mostly).
            let units = if at == 0 && rng.chance(90) {
                3
            } else {
                rng.between(1, 4)
            };
            let to = (at + units * 8).min(transport.len());
            let offset = u16::try_from(at / 8).unwrap_or(0);
            let field = (offset << 3) | u16::from(to < transport.len());
            let mut header = vec![0, 0];
            header.extend_from_slice(&field.to_be_bytes());
            header.extend_from_slice(&id.to_be_bytes());
            let mut extensions = whole.extensions.clone();
            extensions.push((FRAGMENT, header));
            frames.push(
                Packet6 {
                    extensions,
                    transport: transport[at..to].to_vec(),
                    checksum_at: None,
                    ..whole.clone()
                }
                .frame(),
            );
            at = to;
        }
        // Sometimes the later fragments alone: their first is never sent.
        if frames.len() > 1 && rng.chance(10) {
            frames.remove(0);
        }
        self.pending.scatter(rng, direction, frames)
    }
}

/// A packet of `flow` from its first end: TCP (a SYN when `opening`, else any flags), UDP, or an
/// echo request (an echo reply when sent to the node).
fn packet(rng: &mut Rng, flow: Flow, opening: bool) -> Packet6 {
    let (protocol, src, src_port, dst, dst_port) = flow;
    let len = rng.below(24);
    let payload = rng.bytes(len);
    let (transport, checksum_at) = match protocol {
        proto::TCP => {
            let flags = if opening && rng.chance(60) {
                0x02
            } else {
                rng.pick(&TCP_FLAGS)
            };
            let mut header = Vec::new();
            header.extend_from_slice(&src_port.to_be_bytes());
            header.extend_from_slice(&dst_port.to_be_bytes());
            header.extend_from_slice(&rng.u32().to_be_bytes());
            header.extend_from_slice(&rng.u32().to_be_bytes());
            header.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
            (header, 16)
        }
        proto::UDP => {
            let mut header = Vec::new();
            header.extend_from_slice(&src_port.to_be_bytes());
            header.extend_from_slice(&dst_port.to_be_bytes());
            let len = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
            header.extend_from_slice(&len.to_be_bytes());
            header.extend_from_slice(&[0, 0]);
            (header, 6)
        }
        _ => {
            let (kind, id) = if dst == NODE_V6 {
                (ICMPV6_ECHO_REPLY, dst_port)
            } else {
                (ICMPV6_ECHO_REQUEST, src_port)
            };
            let mut header = vec![kind, 0, 0, 0];
            header.extend_from_slice(&id.to_be_bytes());
            header.extend_from_slice(&rng.u16().to_be_bytes());
            (header, 2)
        }
    };
    let mut transport = transport;
    transport.extend_from_slice(&payload);
    Packet6 {
        src,
        dst,
        protocol,
        extensions: chain(rng),
        transport,
        checksum_at: Some(checksum_at),
    }
}

/// [`packet`]'s frame.
fn from(rng: &mut Rng, flow: Flow, opening: bool) -> Vec<u8> {
    packet(rng, flow, opening).frame()
}

/// Mostly none; else 1 to 7 hop-by-hop, routing and destination options headers of 8 or 16
/// bytes (options: PadN), up to one more than the datapath walks.
fn chain(rng: &mut Rng) -> Vec<(u8, Vec<u8>)> {
    if !rng.chance(15) {
        return Vec::new();
    }
    let count = rng.between(1, MAX_EXTENSION_HEADERS + 1);
    (0..count)
        .map(|_| {
            let kind = rng.pick(&[HOP_BY_HOP, ROUTING, DESTINATION_OPTIONS]);
            let units = rng.below(2);
            let len = (units + 1) * 8;
            let mut header = vec![0; len];
            header[1] = u8::try_from(units).unwrap_or(0);
            if kind == ROUTING {
                // An unassigned routing type, no segments left: the header is skipped.
                header[2] = 253;
            } else {
                header[2] = 1;
                header[3] = u8::try_from(len - 4).unwrap_or(0);
            }
            (kind, header)
        })
        .collect()
}

/// A pod's Destination Unreachable (port unreachable) about a reply to `flow` as the pod got
/// it (from the remote to the pod's end), quoting it whole or cut.
fn unreachable(rng: &mut Rng, flow: Flow) -> Vec<u8> {
    let (protocol, pod, pod_port, remote, remote_port) = flow;
    let got = Packet6 {
        extensions: Vec::new(),
        ..packet(rng, (protocol, remote, remote_port, pod, pod_port), false)
    }
    .packet();
    let mut transport = vec![ICMPV6_DEST_UNREACH, 4, 0, 0, 0, 0, 0, 0];
    let quoted = if rng.chance(80) {
        got.len()
    } else {
        rng.between(IPV6_HLEN, got.len())
    };
    transport.extend_from_slice(&got[..quoted]);
    Packet6 {
        src: pod,
        dst: remote,
        protocol: proto::ICMPV6,
        extensions: Vec::new(),
        transport,
        checksum_at: Some(2),
    }
    .frame()
}

/// `flow` as it left the node: from the port the model saw it mapped to (a random one when
/// the model has not seen it translated).
fn as_translated(rng: &mut Rng, model: &Model6, flow: Flow) -> Flow {
    let (protocol, _, _, remote, remote_port) = flow;
    let port = model
        .by_original
        .get(&flow)
        .copied()
        .unwrap_or_else(|| rng.u16());
    (protocol, NODE_V6, port, remote, remote_port)
}

/// A reply to `flow` as it left the node.
fn reply(rng: &mut Rng, model: &Model6, flow: Flow) -> Vec<u8> {
    let (protocol, node, port, remote, remote_port) = as_translated(rng, model, flow);
    from(rng, (protocol, remote, remote_port, node, port), false)
}

/// A router's Packet Too Big about `flow` as it left the node, quoting as much as fits.
fn too_big(rng: &mut Rng, model: &Model6, flow: Flow) -> Vec<u8> {
    let left = as_translated(rng, model, flow);
    let sent = from(rng, left, false);
    let mut body = 1280u32.to_be_bytes().to_vec();
    body.extend_from_slice(&sent[ETH_HLEN..]);
    let mut transport = vec![ICMPV6_PACKET_TOO_BIG, 0, 0, 0];
    transport.extend_from_slice(&body);
    Packet6 {
        src: ROUTER_V6,
        dst: NODE_V6,
        protocol: proto::ICMPV6,
        extensions: Vec::new(),
        transport,
        checksum_at: Some(2),
    }
    .frame()
}

/// Egress that stays as it is: to the exempt pods' network, from a link-local address, to
/// multicast.
fn exempt(rng: &mut Rng) -> Vec<u8> {
    let (src, dst) = match rng.below(3) {
        0 => (rng.pick(&PODS_V6), rng.pick(&PODS_V6)),
        1 => (
            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 5),
            rng.pick(&REMOTES_V6),
        ),
        _ => (
            rng.pick(&PODS_V6),
            Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0xfb),
        ),
    };
    let flow = (
        proto::UDP,
        src,
        rng.pick(&LOCAL_PORTS),
        dst,
        rng.pick(&REMOTE_PORTS),
    );
    from(rng, flow, true)
}

/// Cuts, lies about the payload length, corrupts the transport, or adds a trailer. The fixed
/// header's next-header byte stays, so what the packet carries is known.
fn mutate(rng: &mut Rng, frame: &mut Vec<u8>) {
    match rng.below(4) {
        0 => frame.truncate(rng.between(ETH_HLEN, frame.len())),
        1 => {
            let lie = rng.u16().to_be_bytes();
            frame[ETH_HLEN + 4..ETH_HLEN + 6].copy_from_slice(&lie);
        }
        2 => {
            let at = rng.between(L4, frame.len() - 1);
            frame[at] ^= rng.u8() | 1;
        }
        _ => {
            let len = rng.between(1, 32);
            let trailer = rng.bytes(len);
            frame.extend_from_slice(&trailer);
        }
    }
}

/// Checks an IPv6 frame's run when the uplink translates IPv6 to [`NODE_V6`].
pub fn check(
    direction: Direction,
    input: &[u8],
    output: Option<&[u8]>,
    counter: Counter,
    ranges: &[PortRange],
    model: &Model6,
    violate: &mut impl FnMut(Kind, String),
) {
    if matches!(
        counter,
        Counter::EgressNotConfigured
            | Counter::IngressNotConfigured
            | Counter::EgressNotIpv4
            | Counter::IngressNotIpv4
    ) {
        violate(
            Kind::Classification,
            format!(
                "an IPv6 frame counted as {} while the uplink translates IPv6",
                counter.name()
            ),
        );
    }
    let Some(parsed) = parse(input) else {
        return;
    };
    let l4 = parsed.l4;
    if !parsed.walked() {
        too_deep(
            direction,
            input,
            output,
            counter,
            parsed.end.is_none(),
            violate,
        );
        return;
    }
    let first = model.first_fragment(direction, &parsed);
    if parsed.is_later_fragment() {
        later_fragment(direction, input, output, first, violate);
    }
    // A consistent packet whose checksum verifies: nothing excuses leaving its flow's mapping
    // unused, or breaking its checksum.
    let intact = parsed.end.is_some_and(|end| {
        port_and_checksum(&parsed, input, direction).is_some()
            && parsed.fragment.is_none()
            && input.len() >= l4 + 8
            && verifies(parsed.src, parsed.dst, parsed.next, &input[l4..end])
    }) && (parsed.next != proto::TCP || parsed.end.is_some_and(|end| end >= l4 + 20));
    let flow = flow_of(input);
    if intact && let Some(flow) = flow {
        let mapped = match direction {
            Direction::Egress => model.by_original.contains_key(&flow),
            Direction::Ingress => model.by_reply.contains_key(&flow),
        };
        let translated = matches!(
            counter,
            Counter::EgressMasqueraded | Counter::EgressNewMapping | Counter::IngressReverseNat
        );
        if mapped && !translated {
            violate(
                Kind::Missed,
                format!("{flow:?} has a mapping, yet counted as {}", counter.name()),
            );
        }
    }
    if direction == Direction::Egress
        && let Some(flow) = pods_error_about_reply(&parsed, input, model)
        && counter != Counter::EgressIcmpErrorTranslated
    {
        violate(
            Kind::Missed,
            format!(
                "a pod's error about a reply of {flow:?}, which has a mapping, counted as {}",
                counter.name()
            ),
        );
    }
    let Some(output) = output else {
        return;
    };
    if output == input {
        return;
    }
    if !TRANSLATING.contains(&counter) {
        violate(
            Kind::ChangedWhenUntouched,
            format!("counted as {} but rewritten", counter.name()),
        );
    }
    // What may change: the translated end's address, and for the protocols translated with a
    // port, that port and the checksum, and an error's quote and checksum.
    let translated_address = match direction {
        Direction::Egress => SRC,
        Direction::Ingress => DST,
    };
    let mut allowed = vec![false; input.len()];
    for flag in &mut allowed[translated_address..translated_address + 16] {
        *flag = true;
    }
    let end = parsed.end.unwrap_or(input.len());
    let ports = port_and_checksum(&parsed, input, direction);
    if let Some((port, checksum)) = ports {
        for at in [l4 + port, l4 + port + 1, l4 + checksum, l4 + checksum + 1] {
            if let Some(flag) = allowed.get_mut(at) {
                *flag = true;
            }
        }
    }
    let error = parsed.next == proto::ICMPV6
        && !parsed.is_later_fragment()
        && input.get(l4).is_some_and(|&kind| kind < 128);
    if error {
        for flag in allowed.iter_mut().take(end).skip(l4 + 2) {
            *flag = true;
        }
    }
    let changed: Vec<usize> = (0..input.len())
        .filter(|&at| input[at] != output[at])
        .collect();
    let outside: Vec<String> = changed
        .iter()
        .filter(|&&at| !allowed[at])
        .map(|&at| format!("{at}: {:02x}->{:02x}", input[at], output[at]))
        .collect();
    if !outside.is_empty() {
        let region = if changed.iter().any(|&at| !allowed[at] && at < ETH_HLEN) {
            Region::Ethernet
        } else if changed.iter().any(|&at| !allowed[at] && at < l4) {
            Region::IpHeader
        } else if changed.iter().any(|&at| !allowed[at] && at >= end) {
            Region::BeyondTotalLength
        } else {
            Region::Transport
        };
        violate(
            Kind::Outside(region),
            format!("IPv6 bytes at offsets {}", outside.join(", ")),
        );
    }
    let Some(after) = parse(output) else {
        return;
    };
    match direction {
        Direction::Egress if after.src != parsed.src && after.src != NODE_V6 => violate(
            Kind::Address,
            format!(
                "IPv6 source rewritten to {}, not the uplink's {NODE_V6}",
                after.src
            ),
        ),
        Direction::Ingress
            if after.dst != parsed.dst
                && !model.by_reply.values().any(|(pod, _)| *pod == after.dst) =>
        {
            violate(
                Kind::Mapping,
                format!(
                    "IPv6 destination rewritten to {}, which no mapping seen restores to",
                    after.dst
                ),
            );
        }
        _ => {}
    }
    // (A fragment's checksum covers the whole datagram, not the fragment.)
    if let Some(end) = parsed.end
        && parsed.fragment.is_none()
        && input.len() >= l4 + 8
        && verifies(parsed.src, parsed.dst, parsed.next, &input[l4..end])
        && !verifies(after.src, after.dst, after.next, &output[l4..end])
    {
        violate(
            Kind::Checksum(Sum::OuterTransport),
            "an IPv6 transport checksum verified before translation, not after".to_owned(),
        );
    }
    let (Some(flow), Some(left)) = (flow, flow_of(output)) else {
        if error {
            quote(direction, l4, input, output, model, violate);
        }
        return;
    };
    match direction {
        Direction::Egress if left.2 != flow.2 || counter == Counter::EgressNewMapping => {
            if !ranges.iter().any(|range| range.contains(left.2)) {
                violate(
                    Kind::PortRange,
                    format!("IPv6 port rewritten to {}, outside the SNAT range", left.2),
                );
            }
            let known = model.by_original.get(&flow);
            // A SYN may start a closing TCP flow over, with a new port.
            let restarted = counter == Counter::EgressNewMapping;
            if let Some(&port) = known
                && port != left.2
                && !restarted
            {
                violate(
                    Kind::Mapping,
                    format!("{flow:?} mapped to port {port}, left with {}", left.2),
                );
            }
            if let Some(&(pod, pod_port)) = model
                .by_reply
                .get(&(flow.0, flow.3, flow.4, NODE_V6, left.2))
                && (pod, pod_port) != (flow.1, flow.2)
            {
                violate(
                    Kind::Mapping,
                    format!(
                        "{flow:?} given port {}, which [{pod}]:{pod_port} holds towards that remote",
                        left.2
                    ),
                );
            }
        }
        Direction::Ingress => {
            let expected = model.by_reply.get(&flow);
            if expected != Some(&(left.3, left.4)) {
                violate(
                    Kind::Mapping,
                    format!(
                        "reply {flow:?} restored to [{}]:{}, the model says {expected:?}",
                        left.3, left.4
                    ),
                );
            }
        }
        Direction::Egress => {}
    }
}

/// An ICMPv6 error translated: its quote must name the pod's end of a known mapping (ingress:
/// an error about a packet the node sent), or the node's end (egress: a pod's error about a
/// reply it got).
fn quote(
    direction: Direction,
    l4: usize,
    input: &[u8],
    output: &[u8],
    model: &Model6,
    violate: &mut impl FnMut(Kind, String),
) {
    let (Some(before), Some(after)) = (quoted(input, l4), quoted(output, l4)) else {
        return;
    };
    let (protocol, remote, remote_port, pod, pod_port) = before;
    let (expected, actual) = match direction {
        Direction::Ingress => (
            model
                .by_reply
                .get(&(protocol, pod, pod_port, remote, remote_port))
                .copied(),
            (after.1, after.2),
        ),
        Direction::Egress => (
            model
                .by_original
                .get(&(protocol, pod, pod_port, remote, remote_port))
                .map(|&port| (NODE_V6, port)),
            (after.3, after.4),
        ),
    };
    if expected != Some(actual) {
        violate(
            Kind::Mapping,
            format!("an error's quote of {before:?} became {after:?}, the model says {expected:?}"),
        );
    }
}

/// The flow of the packet an ICMPv6 error (its header at `l4`) quotes, after its 8-byte header.
fn quoted(frame: &[u8], l4: usize) -> Option<Flow> {
    let mut rebuilt = frame.get(..ETH_HLEN)?.to_vec();
    rebuilt.extend_from_slice(frame.get(l4 + 8..)?);
    flow_of(&rebuilt)
}

/// A pod's error about a reply of a mapped flow, whole and consistent (its checksum verifies,
/// it quotes all of the reply): the flow it is about, as the pod sent it.
fn pods_error_about_reply(parsed: &Parsed, input: &[u8], model: &Model6) -> Option<Flow> {
    let end = parsed.end?;
    let l4 = parsed.l4;
    let whole = parsed.next == proto::ICMPV6
        && parsed.fragment.is_none()
        && *input.get(l4)? < 128
        && verifies(parsed.src, parsed.dst, parsed.next, input.get(l4..end)?)
        && l4 + 8 + IPV6_HLEN + usize::from(be16(input, l4 + 8 + 4)?) == end;
    let (protocol, remote, remote_port, pod, pod_port) = quoted(input, l4)?;
    let flow = (protocol, pod, pod_port, remote, remote_port);
    (whole && pod == parsed.src && model.by_original.contains_key(&flow)).then_some(flow)
}

/// A packet with more extension headers than the datapath walks: passed untouched, and
/// counted (egress as unsupported, ingress as passed), unless `inconsistent` (its payload
/// length lies) and counted as malformed.
fn too_deep(
    direction: Direction,
    input: &[u8],
    output: Option<&[u8]>,
    counter: Counter,
    inconsistent: bool,
    violate: &mut impl FnMut(Kind, String),
) {
    let (expected, malformed) = match direction {
        Direction::Egress => (Counter::EgressUnsupported, Counter::EgressMalformed),
        Direction::Ingress => (Counter::IngressPassed, Counter::IngressMalformed),
    };
    // A payload length the frame does not hold is malformed before the chain is walked.
    if counter != expected && !(inconsistent && counter == malformed) {
        violate(
            Kind::Classification,
            format!(
                "more than {MAX_EXTENSION_HEADERS} extension headers counted as {}, not {}",
                counter.name(),
                expected.name()
            ),
        );
    }
    if output != Some(input) {
        violate(
            Kind::ChangedWhenUntouched,
            format!(
                "more than {MAX_EXTENSION_HEADERS} extension headers, yet not passed as it was"
            ),
        );
    }
}

/// A later fragment leaves with the address its first fragment left with, and is never
/// translated on ingress without one (on egress, the policy decides: the node's address).
fn later_fragment(
    direction: Direction,
    input: &[u8],
    output: Option<&[u8]>,
    first: Option<&FirstFragment<Ipv6Addr>>,
    violate: &mut impl FnMut(Kind, String),
) {
    let Some(output) = output else {
        return;
    };
    let at = match direction {
        Direction::Egress => SRC,
        Direction::Ingress => DST,
    };
    let Some(actual) = address(output, at) else {
        return;
    };
    match first {
        Some(first) => super::oracle::follows_first(first, actual, violate),
        None if direction == Direction::Ingress && output != input => violate(
            Kind::Fragment,
            format!("a later fragment translated to {actual} without its first fragment"),
        ),
        None => {}
    }
}
