//! Frames for the fuzzer: flows a node's uplink sees (new flows, established ones, replies to
//! the mappings the fuzzer created, ICMP errors about them, fragments, exempt and node traffic),
//! the protocols masq must leave alone or handle by address, and the same frames mutated
//! (truncated, lying about their lengths, with options, trailers, VLAN tags, flipped bytes).

use std::net::Ipv4Addr;

use masq_common::nat::Direction;

use super::{
    model::{Mapping, Model, Tuple},
    rng::Rng,
    wire::{self, Ip, fix_ip_checksum, proto},
};
use crate::pktgen::{self, Packet, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN};

pub const PODS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 1, 5),
    Ipv4Addr::new(10, 244, 2, 7),
    Ipv4Addr::new(10, 244, 3, 9),
];
/// Masqueraded destinations.
pub const REMOTES: [Ipv4Addr; 3] = [
    Ipv4Addr::new(203, 0, 113, 10),
    Ipv4Addr::new(198, 51, 100, 20),
    Ipv4Addr::new(8, 8, 8, 8),
];
/// Destinations the harness's non-masquerade CIDRs (and link-local) exempt.
pub const EXEMPT: [Ipv4Addr; 4] = [
    Ipv4Addr::new(10, 1, 2, 3),
    Ipv4Addr::new(172, 20, 0, 1),
    Ipv4Addr::new(192, 168, 7, 7),
    Ipv4Addr::new(169, 254, 169, 254),
];
/// A router on the path, which reports errors.
pub const ROUTER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// Ports inside and outside the small SNAT ranges the fuzzer configures (20000-20003,
/// 25000-25001), and at the edges of the default one.
const LOCAL_PORTS: [u16; 8] = [40_000, 40_001, 5353, 20_000, 20_001, 25_000, 1024, 29_999];
const REMOTE_PORTS: [u16; 4] = [443, 53, 80, 3868];
const TCP_FLAGS: [u8; 12] = [
    TCP_SYN,
    TCP_SYN,
    TCP_SYN | TCP_ACK,
    TCP_ACK,
    TCP_PSH | TCP_ACK,
    TCP_FIN | TCP_ACK,
    TCP_RST,
    TCP_RST | TCP_ACK,
    TCP_FIN,
    TCP_SYN | TCP_FIN,
    TCP_SYN | TCP_RST,
    0,
];
/// IP identifications, few so that fragments of different datagrams collide.
const IP_IDS: [u16; 4] = [0x4242, 0x1234, 7, 0xffff];

/// A transport the generator crafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    Tcp(u8),
    Udp {
        checksum: bool,
    },
    Sctp,
    /// An ICMP message of this type: for queries (echo, timestamp) the identifier is the
    /// source "port" of a request, the destination "port" of a reply.
    Icmp(u8),
    UdpLite,
    Dccp,
    Gre,
    Esp,
    Raw(u8),
}

/// The two ends of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ends {
    pub src: Ipv4Addr,
    pub src_port: u16,
    pub dst: Ipv4Addr,
    pub dst_port: u16,
}

impl Ends {
    pub const fn of(tuple: &Tuple) -> Self {
        Self {
            src: Ipv4Addr::new(tuple.src[0], tuple.src[1], tuple.src[2], tuple.src[3]),
            src_port: tuple.src_port,
            dst: Ipv4Addr::new(tuple.dst[0], tuple.dst[1], tuple.dst[2], tuple.dst[3]),
            dst_port: tuple.dst_port,
        }
    }
}

/// A transport for `protocol`, as a flow of that protocol carries it (ICMP: `request` says
/// which side of the query).
pub fn l4_for(rng: &mut Rng, protocol: u8, request: bool) -> L4 {
    match protocol {
        proto::TCP => L4::Tcp(rng.pick(&TCP_FLAGS)),
        proto::UDP => L4::Udp {
            checksum: !rng.chance(20),
        },
        proto::SCTP => L4::Sctp,
        proto::ICMP => L4::Icmp(match (request, rng.chance(80)) {
            (true, true) => 8,
            (true, false) => 13,
            (false, true) => 0,
            (false, false) => 14,
        }),
        proto::UDPLITE => L4::UdpLite,
        proto::DCCP => L4::Dccp,
        proto::GRE => L4::Gre,
        proto::ESP => L4::Esp,
        other => L4::Raw(other),
    }
}

fn random_l4(rng: &mut Rng, request: bool) -> L4 {
    let protocols = [
        proto::TCP,
        proto::UDP,
        proto::ICMP,
        proto::SCTP,
        proto::GRE,
        proto::ESP,
        proto::UDPLITE,
        proto::DCCP,
    ];
    match rng.weighted(&[30, 20, 12, 6, 4, 4, 5, 5, 3, 3, 2]) {
        index @ 0..=7 => l4_for(rng, protocols[index], request),
        // ICMP that is neither a query nor an error, or a query the other way round.
        8 => L4::Icmp(rng.pick(&[9, 10, 15, 16, 17, 18, 30, 42, 255, 0, 8, 13, 14])),
        9 => L4::Tcp(rng.u8()),
        _ => L4::Raw(rng.u8()),
    }
}

fn payload(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.weighted(&[20, 60, 15, 5]) {
        0 => 0,
        1 => rng.below(48),
        2 => rng.between(48, 400),
        _ => rng.between(400, 1400),
    };
    rng.bytes(len)
}

fn options(rng: &mut Rng) -> Vec<u8> {
    match rng.below(4) {
        0 => vec![1, 1, 1, 1],
        // Record route with room for two addresses.
        1 => vec![7, 11, 4, 0, 0, 0, 0, 0, 0, 0, 0],
        // Timestamp, one slot.
        2 => vec![68, 8, 5, 0, 0, 0, 0, 0],
        _ => {
            let len = rng.between(1, 40);
            rng.bytes(len)
        }
    }
}

/// A packet with the given ends and transport, with a random payload and, sometimes, IPv4
/// options.
pub fn packet(rng: &mut Rng, ends: Ends, l4: L4) -> Packet {
    let body = payload(rng);
    packet_with(rng, ends, l4, body)
}

/// Like [`packet`], with the given payload.
pub fn packet_with(rng: &mut Rng, ends: Ends, l4: L4, body: Vec<u8>) -> Packet {
    let (src, dst) = (ends.src.to_string(), ends.dst.to_string());
    let src_sock = format!("{src}:{}", ends.src_port);
    let dst_sock = format!("{dst}:{}", ends.dst_port);
    let ports = (ends.src_port, ends.dst_port);
    let packet = match l4 {
        L4::Tcp(flags) => Packet::tcp(&src_sock, &dst_sock, flags).payload(&body),
        L4::Udp { checksum: true } => Packet::udp(&src_sock, &dst_sock).payload(&body),
        L4::Udp { checksum: false } => {
            Packet::udp_without_checksum(&src_sock, &dst_sock).payload(&body)
        }
        L4::Sctp => Packet::sctp(&src_sock, &dst_sock).payload(&body),
        L4::Icmp(icmp_type) => {
            let id = if matches!(icmp_type, 8 | 13) {
                ends.src_port
            } else {
                ends.dst_port
            };
            let id = id.to_be_bytes();
            let body = if matches!(icmp_type, 13 | 14) {
                vec![0; 12]
            } else {
                body
            };
            Packet::raw(&src, &dst, proto::ICMP).payload(&wire::icmp(
                icmp_type,
                0,
                [id[0], id[1], 0, 1],
                &body,
            ))
        }
        L4::UdpLite => {
            let coverage = match rng.below(3) {
                0 => 0,
                1 => 8,
                _ => u16::try_from(8 + body.len()).unwrap_or(0),
            };
            Packet::raw(&src, &dst, proto::UDPLITE)
                .payload(&wire::udplite(ends.src, ends.dst, ports, coverage, &body))
        }
        L4::Dccp => Packet::raw(&src, &dst, proto::DCCP)
            .payload(&wire::dccp(ends.src, ends.dst, ports, &body)),
        L4::Gre => Packet::raw(&src, &dst, proto::GRE).payload(&wire::gre(rng.chance(50), &body)),
        L4::Esp => {
            Packet::raw(&src, &dst, proto::ESP).payload(&wire::esp(rng.u32(), rng.u32(), &body))
        }
        L4::Raw(protocol) => Packet::raw(&src, &dst, protocol).payload(&body),
    };
    let packet = packet.ip_id(if rng.chance(70) {
        rng.pick(&IP_IDS)
    } else {
        rng.u16()
    });
    if rng.chance(10) {
        packet.options(&options(rng))
    } else {
        packet
    }
}

/// `ip_packet`'s bytes `from..to` of its payload as a fragment at that offset (a multiple of 8
/// for all but garbage), with its own header, total length and header checksum.
pub fn fragment(ip_packet: &[u8], from: usize, to: usize, more: bool) -> Vec<u8> {
    let header_len = usize::from(ip_packet[0] & 0x0f) * 4;
    let body = ip_packet.get(header_len..).unwrap_or(&[]);
    let (from, to) = (from.min(body.len()), to.min(body.len()));
    let mut bytes = ip_packet[..header_len].to_vec();
    bytes.extend_from_slice(&body[from..to.max(from)]);
    let total = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
    bytes[2..4].copy_from_slice(&total.to_be_bytes());
    let units = u16::try_from(from / 8).unwrap_or(0) & 0x1fff;
    let frag = units | if more { 0x2000 } else { 0 };
    bytes[6..8].copy_from_slice(&frag.to_be_bytes());
    let mut frame = pktgen::ethernet(0x0800, &bytes);
    fix_ip_checksum(&mut frame, wire::ETH_HLEN);
    frame
}

/// The generator: the model tells it which mappings exist, so replies and ICMP errors hit them.
#[derive(Debug)]
pub struct Generator {
    uplink: Ipv4Addr,
    /// Frames decided earlier and sent later, in any order (later fragments of a datagram).
    pending: Pending,
}

impl Generator {
    pub const fn new(uplink: Ipv4Addr) -> Self {
        Self {
            uplink,
            pending: Pending(Vec::new()),
        }
    }

    /// Forgets frames still pending (at the start of an epoch, whose tables start empty).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    pub fn next(&mut self, rng: &mut Rng, model: &Model) -> (Direction, Vec<u8>) {
        if let Some(frame) = self.pending.take(rng, 35) {
            return frame;
        }
        let (direction, mut frame) = match rng.weighted(&[18, 14, 16, 10, 6, 8, 8, 4, 6]) {
            0 => (Direction::Egress, self.egress_new(rng)),
            1 => (Direction::Egress, self.egress_known(rng, model)),
            2 => (Direction::Ingress, self.ingress_reply(rng, model)),
            3 => (Direction::Ingress, self.ingress_error(rng, model)),
            4 => (Direction::Egress, self.egress_error(rng, model)),
            5 => self.fragments(rng, model),
            6 => (Direction::Ingress, self.ingress_unsolicited(rng)),
            7 => (Direction::Egress, self.egress_inbound_answer(rng, model)),
            _ => (pick_direction(rng), foreign(rng)),
        };
        if rng.chance(25) {
            mutate(rng, &mut frame);
            if rng.chance(30) {
                mutate(rng, &mut frame);
            }
        }
        (direction, frame)
    }

    fn local_source(&self, rng: &mut Rng) -> Ipv4Addr {
        match rng.weighted(&[70, 12, 10, 8]) {
            0 => rng.pick(&PODS),
            1 => self.uplink,
            2 => Ipv4Addr::new(10, 244, rng.u8(), rng.u8()),
            _ => Ipv4Addr::from(rng.u32()),
        }
    }

    fn port(rng: &mut Rng, pool: &[u16]) -> u16 {
        if rng.chance(85) {
            rng.pick(pool)
        } else {
            rng.u16()
        }
    }

    fn egress_new(&self, rng: &mut Rng) -> Vec<u8> {
        let dst = match rng.weighted(&[60, 25, 15]) {
            0 => rng.pick(&REMOTES),
            1 => rng.pick(&EXEMPT),
            _ => Ipv4Addr::from(rng.u32()),
        };
        let ends = Ends {
            src: self.local_source(rng),
            src_port: Self::port(rng, &LOCAL_PORTS),
            dst,
            dst_port: Self::port(rng, &REMOTE_PORTS),
        };
        let l4 = random_l4(rng, true);
        packet(rng, ends, l4).frame()
    }

    fn known(rng: &mut Rng, model: &Model) -> Option<Mapping> {
        let count = model.mappings.len();
        if count == 0 {
            return None;
        }
        // Mostly recent mappings, sometimes any.
        let index = if rng.chance(60) {
            count - 1 - rng.below(count.min(8))
        } else {
            rng.below(count)
        };
        Some(model.mappings[index])
    }

    fn egress_known(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let Some(mapping) = Self::known(rng, model) else {
            return self.egress_new(rng);
        };
        let l4 = l4_for(rng, mapping.original.protocol, true);
        packet(rng, Ends::of(&mapping.original), l4).frame()
    }

    fn ingress_reply(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let Some(mapping) = Self::known(rng, model) else {
            return self.ingress_unsolicited(rng);
        };
        let mut ends = Ends::of(&mapping.reply());
        if rng.chance(10) {
            // Near misses: another remote port or another translated port.
            if rng.chance(50) {
                ends.src_port = ends.src_port.wrapping_add(1);
            } else {
                ends.dst_port = ends.dst_port.wrapping_add(1);
            }
        }
        let l4 = l4_for(rng, mapping.original.protocol, false);
        packet(rng, ends, l4).frame()
    }

    fn ingress_unsolicited(&self, rng: &mut Rng) -> Vec<u8> {
        let src = match rng.weighted(&[60, 20, 20]) {
            0 => rng.pick(&REMOTES),
            1 => rng.pick(&EXEMPT),
            _ => Ipv4Addr::from(rng.u32()),
        };
        let dst = match rng.weighted(&[55, 35, 10]) {
            0 => self.uplink,
            1 => rng.pick(&PODS),
            _ => Ipv4Addr::from(rng.u32()),
        };
        let ends = Ends {
            src,
            src_port: Self::port(rng, &REMOTE_PORTS),
            dst,
            dst_port: Self::port(rng, &LOCAL_PORTS),
        };
        let l4 = random_l4(rng, false);
        packet(rng, ends, l4).frame()
    }

    fn egress_inbound_answer(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        if model.inbound.is_empty() {
            return self.egress_new(rng);
        }
        let tuple = model.inbound[rng.below(model.inbound.len())];
        let l4 = L4::Udp {
            checksum: rng.chance(80),
        };
        packet(rng, Ends::of(&tuple), l4).frame()
    }

    /// The packet an ICMP error arriving at the uplink complains about: one that left it, most
    /// often a translated packet of a known mapping.
    fn left_packet(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let known = Self::known(rng, model).filter(|_| rng.chance(75));
        let (ends, l4) = match known {
            Some(mapping) => {
                let left = mapping.reply().reversed();
                (
                    Ends::of(&left),
                    l4_for(rng, mapping.original.protocol, true),
                )
            }
            None => {
                let ends = Ends {
                    src: self.uplink,
                    src_port: Self::port(rng, &LOCAL_PORTS),
                    dst: rng.pick(&REMOTES),
                    dst_port: Self::port(rng, &REMOTE_PORTS),
                };
                (ends, random_l4(rng, true))
            }
        };
        quoted_packet(rng, ends, l4)
    }

    /// The packet an ICMP error leaving the uplink complains about: one that came in, most
    /// often a reply of a known mapping as the pod got it.
    fn arrived_packet(&self, rng: &mut Rng, model: &Model) -> (Ipv4Addr, Vec<u8>) {
        let known = Self::known(rng, model).filter(|_| rng.chance(75));
        let (ends, l4) = match known {
            Some(mapping) => (
                Ends::of(&mapping.original.reversed()),
                l4_for(rng, mapping.original.protocol, false),
            ),
            None if !model.inbound.is_empty() && rng.chance(30) => {
                let tuple = model.inbound[rng.below(model.inbound.len())];
                (Ends::of(&tuple.reversed()), L4::Udp { checksum: true })
            }
            None => {
                let ends = Ends {
                    src: rng.pick(&REMOTES),
                    src_port: Self::port(rng, &REMOTE_PORTS),
                    dst: self.local_source(rng),
                    dst_port: Self::port(rng, &LOCAL_PORTS),
                };
                (ends, random_l4(rng, false))
            }
        };
        (ends.dst, quoted_packet(rng, ends, l4))
    }

    fn ingress_error(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let inner = self.left_packet(rng, model);
        let from = match rng.below(3) {
            0 => ROUTER,
            1 => rng.pick(&REMOTES),
            _ => Ipv4Addr::from(rng.u32()),
        };
        let to = if rng.chance(90) {
            self.uplink
        } else {
            rng.pick(&PODS)
        };
        icmp_error(rng, from, to, &inner)
    }

    fn egress_error(&self, rng: &mut Rng, model: &Model) -> Vec<u8> {
        let (local, inner) = self.arrived_packet(rng, model);
        let from = if rng.chance(85) { local } else { self.uplink };
        let to = Ipv4Addr::new(inner[12], inner[13], inner[14], inner[15]);
        icmp_error(rng, from, to, &inner)
    }

    /// A datagram in fragments: returns one of them and keeps the others pending, so they
    /// go out interleaved with other frames, reordered, sometimes duplicated, overlapping or
    /// empty.
    fn fragments(&mut self, rng: &mut Rng, model: &Model) -> (Direction, Vec<u8>) {
        let direction = pick_direction(rng);
        let packet = match (direction, rng.below(3)) {
            (Direction::Egress, 0) => {
                let (_, inner) = self.arrived_packet(rng, model);
                let from = Ipv4Addr::new(inner[16], inner[17], inner[18], inner[19]);
                let to = Ipv4Addr::new(inner[12], inner[13], inner[14], inner[15]);
                icmp_error_packet(rng, from, to, &inner)
            }
            (Direction::Egress, _) => {
                let mapping = Self::known(rng, model).filter(|_| rng.chance(50));
                let ends = mapping.map_or_else(
                    || Ends {
                        src: self.local_source(rng),
                        src_port: Self::port(rng, &LOCAL_PORTS),
                        dst: if rng.chance(70) {
                            rng.pick(&REMOTES)
                        } else {
                            rng.pick(&EXEMPT)
                        },
                        dst_port: Self::port(rng, &REMOTE_PORTS),
                    },
                    |mapping| Ends::of(&mapping.original),
                );
                let l4 = match mapping {
                    Some(mapping) => l4_for(rng, mapping.original.protocol, true),
                    None => random_l4(rng, true),
                };
                let body = big_payload(rng);
                packet_with(rng, ends, l4, body).ip_packet()
            }
            (Direction::Ingress, 0) => {
                let inner = self.left_packet(rng, model);
                icmp_error_packet(rng, ROUTER, self.uplink, &inner)
            }
            (Direction::Ingress, _) => {
                let ends_l4 = Self::known(rng, model).map(|mapping| {
                    (
                        Ends::of(&mapping.reply()),
                        l4_for(rng, mapping.original.protocol, false),
                    )
                });
                let (ends, l4) = ends_l4.unwrap_or_else(|| {
                    let ends = Ends {
                        src: rng.pick(&REMOTES),
                        src_port: Self::port(rng, &REMOTE_PORTS),
                        dst: self.uplink,
                        dst_port: Self::port(rng, &LOCAL_PORTS),
                    };
                    (ends, random_l4(rng, false))
                });
                let body = big_payload(rng);
                packet_with(rng, ends, l4, body).ip_packet()
            }
        };
        let frames = split(rng, &packet);
        self.pending.scatter(rng, direction, frames)
    }
}

/// Frames decided earlier and sent later, in any order (later fragments of a datagram).
#[derive(Debug, Default)]
pub struct Pending(Vec<(Direction, Vec<u8>)>);

impl Pending {
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// One of the pending frames, `percent` of the time when there are any.
    pub fn take(&mut self, rng: &mut Rng, percent: usize) -> Option<(Direction, Vec<u8>)> {
        if self.0.is_empty() || !rng.chance(percent) {
            return None;
        }
        let index = rng.below(self.0.len());
        Some(self.0.swap_remove(index))
    }

    /// The fragments of a datagram, first first: returns the one to send now (mostly the
    /// first) and keeps the others pending.
    pub fn scatter(
        &mut self,
        rng: &mut Rng,
        direction: Direction,
        mut frames: Vec<Vec<u8>>,
    ) -> (Direction, Vec<u8>) {
        let now = if rng.chance(80) {
            frames.remove(0)
        } else {
            // A later fragment before the first.
            frames.swap_remove(rng.below(frames.len()))
        };
        self.0
            .extend(frames.into_iter().map(|frame| (direction, frame)));
        (direction, now)
    }
}

/// A payload worth fragmenting.
fn big_payload(rng: &mut Rng) -> Vec<u8> {
    let len = rng.between(16, 600);
    rng.bytes(len)
}

fn pick_direction(rng: &mut Rng) -> Direction {
    if rng.chance(50) {
        Direction::Egress
    } else {
        Direction::Ingress
    }
}

/// Splits an IPv4 packet into fragments: the usual cut into pieces of 8-byte units, and the odd
/// ones (a tiny first fragment that cuts the transport header, overlaps, an empty fragment, a
/// duplicate).
fn split(rng: &mut Rng, packet: &[u8]) -> Vec<Vec<u8>> {
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    let len = packet.len().saturating_sub(header_len);
    let unit = |bytes: usize| bytes / 8 * 8;
    let first_len = match rng.below(4) {
        0 => 8,
        1 => 16,
        _ => unit(rng.between(8, len.max(8))).max(8),
    };
    let mut frames = vec![fragment(packet, 0, first_len, true)];
    let mut at = first_len;
    while at < len {
        let piece = unit(rng.between(8, 512)).max(8);
        let end = (at + piece).min(len);
        frames.push(fragment(packet, at, end, end < len));
        at = end;
    }
    match rng.below(6) {
        // Overlapping: bytes from inside the first fragment again, at their offset.
        0 => frames.push(fragment(packet, 8, 8 + rng.between(8, 32), true)),
        // An empty fragment.
        1 => frames.push(fragment(
            packet,
            unit(len / 2).max(8),
            unit(len / 2).max(8),
            true,
        )),
        // The first fragment twice.
        2 => frames.push(frames[0].clone()),
        _ => {}
    }
    frames
}

/// A packet to quote, sometimes turned into a fragment or given IP options.
fn quoted_packet(rng: &mut Rng, ends: Ends, l4: L4) -> Vec<u8> {
    let mut bytes = packet(rng, ends, l4).ip_packet();
    match rng.below(10) {
        // A later fragment: the bytes after the header are payload, though here they are the
        // original transport header, ports and all.
        0 => {
            let units = rng.pick(&[1u16, 2, 185]);
            let frag = u16::from_be_bytes([bytes[6], bytes[7]]) & 0xe000 | units;
            bytes[6..8].copy_from_slice(&frag.to_be_bytes());
        }
        // A first fragment.
        1 => bytes[6] |= 0x20,
        _ => {}
    }
    let mut frame = pktgen::ethernet(0x0800, &bytes);
    fix_ip_checksum(&mut frame, wire::ETH_HLEN);
    frame.split_off(wire::ETH_HLEN)
}

/// An ICMP error quoting (part of) `inner`, as an IPv4 packet.
fn icmp_error_packet(rng: &mut Rng, from: Ipv4Addr, to: Ipv4Addr, inner: &[u8]) -> Vec<u8> {
    let (icmp_type, code) = rng.pick(&[(3, 3), (3, 4), (3, 1), (11, 0), (12, 0), (4, 0), (5, 1)]);
    let quote_len = match rng.below(4) {
        0 => inner.len(),
        1 => 28.min(inner.len()),
        _ => rng.below(inner.len() + 1),
    };
    Packet::icmp_error(
        &from.to_string(),
        &to.to_string(),
        icmp_type,
        code,
        &inner[..quote_len],
    )
    .ip_id(rng.pick(&IP_IDS))
    .ip_packet()
}

/// An ICMP error frame quoting `inner`: whole, cut as routers cut it (header and 8 bytes), cut
/// anywhere, or garbage; sometimes followed by bytes beyond the IPv4 total length, which may be
/// the rest of the quoted packet (the outer total length then "lies" short).
fn icmp_error(rng: &mut Rng, from: Ipv4Addr, to: Ipv4Addr, inner: &[u8]) -> Vec<u8> {
    let (icmp_type, code) = rng.pick(&[(3, 3), (3, 4), (3, 1), (11, 0), (12, 0), (4, 0), (5, 1)]);
    let mut inner = inner.to_vec();
    if rng.chance(10) {
        // Garbage in the quote.
        let at = rng.below(inner.len().max(1));
        if let Some(byte) = inner.get_mut(at) {
            *byte ^= rng.u8() | 1;
        }
    }
    if rng.chance(5) {
        let len = rng.below(64);
        inner = rng.bytes(len);
    }
    let header_len = usize::from(inner.first().copied().unwrap_or(0x45) & 0x0f) * 4;
    let quote_len = match rng.weighted(&[25, 35, 10, 20, 10]) {
        0 => inner.len(),
        1 => (header_len + 8).min(inner.len()),
        2 => header_len.min(inner.len()),
        // Cut inside the quoted transport header, before its checksum.
        3 => (header_len + rng.below(18)).min(inner.len()),
        _ => rng.below(inner.len() + 1),
    };
    let mut frame = Packet::icmp_error(
        &from.to_string(),
        &to.to_string(),
        icmp_type,
        code,
        &inner[..quote_len],
    )
    .ip_id(rng.pick(&IP_IDS))
    .frame();
    match rng.weighted(&[70, 15, 15]) {
        0 => {}
        // The rest of the quoted packet after the IPv4 total length.
        1 => frame.extend_from_slice(&inner[quote_len..]),
        _ => frame.extend_from_slice(&vec![0; rng.between(1, 32)]),
    }
    frame
}

/// Frames that are not IPv4, or not parseable as such.
fn foreign(rng: &mut Rng) -> Vec<u8> {
    match rng.below(6) {
        0 => pktgen::ipv6_frame(),
        1 => pktgen::arp_frame(),
        2 => {
            let ends = Ends {
                src: rng.pick(&PODS),
                src_port: rng.pick(&LOCAL_PORTS),
                dst: rng.pick(&REMOTES),
                dst_port: rng.pick(&REMOTE_PORTS),
            };
            wire::vlan_tagged(&packet(rng, ends, L4::Tcp(TCP_SYN)).frame())
        }
        3 => {
            let (ethertype, len) = (rng.u16(), rng.below(80));
            pktgen::ethernet(ethertype, &rng.bytes(len))
        }
        4 => {
            // IPv4 ethertype, random bytes.
            let len = rng.below(80);
            pktgen::ethernet(0x0800, &rng.bytes(len))
        }
        _ => {
            let len = rng.between(14, 60);
            rng.bytes(len)
        }
    }
}

/// Mutates a frame the ways a hostile or broken sender would.
pub fn mutate(rng: &mut Rng, frame: &mut Vec<u8>) {
    let ip = Ip::of_frame(frame);
    let start = wire::ETH_HLEN;
    match rng.below(12) {
        // Cut anywhere (the IPv4 total length then lies long).
        0 => frame.truncate(rng.between(14, frame.len().max(14))),
        // Cut the IPv4 packet consistently: a short packet, its transport header cut.
        1 => {
            if let Some(ip) = ip {
                let end = rng.between(ip.l4(), ip.end);
                frame.truncate(end);
                let total = u16::try_from(end - start).unwrap_or(0);
                frame[start + 2..start + 4].copy_from_slice(&total.to_be_bytes());
                fix_ip_checksum(frame, start);
            }
        }
        // A trailer: Ethernet padding or garbage after the IPv4 packet.
        2 => {
            let len = rng.between(1, 48);
            let trailer = if rng.chance(50) {
                vec![0; len]
            } else {
                rng.bytes(len)
            };
            frame.extend_from_slice(&trailer);
        }
        // An IHL lie.
        3 => {
            if let Some(byte) = frame.get_mut(start) {
                *byte = (*byte & 0xf0) | rng.u8() & 0x0f;
            }
            if rng.chance(50) {
                fix_ip_checksum(frame, start);
            }
        }
        // A total length lie.
        4 => {
            if frame.len() >= start + 4 {
                let total = if rng.chance(50) {
                    rng.u16()
                } else {
                    let current = u16::from_be_bytes([frame[start + 2], frame[start + 3]]);
                    current.wrapping_add(rng.pick(&[1u16, 2, 4, 8, 0xffff, 0xfffe, 0xfff8]))
                };
                frame[start + 2..start + 4].copy_from_slice(&total.to_be_bytes());
                if rng.chance(50) {
                    fix_ip_checksum(frame, start);
                }
            }
        }
        // Flipped bytes anywhere after the Ethernet header.
        5 => {
            for _ in 0..rng.between(1, 3) {
                if frame.len() > start {
                    let at = rng.between(start, frame.len() - 1);
                    frame[at] ^= rng.u8() | 1;
                }
            }
        }
        // Fragment bits.
        6 => {
            if ip.is_some() {
                let frag = match rng.below(3) {
                    0 => 0x2000,
                    1 => rng.u16() & 0x1fff,
                    _ => rng.u16() & 0x3fff,
                };
                frame[start + 6..start + 8].copy_from_slice(&frag.to_be_bytes());
                fix_ip_checksum(frame, start);
            }
        }
        // Another protocol number.
        7 => {
            if ip.is_some() {
                let random = rng.u8();
                frame[start + 9] = rng.pick(&[1, 6, 17, 33, 47, 50, 132, 136, random]);
                fix_ip_checksum(frame, start);
            }
        }
        // A wrong transport checksum.
        8 => {
            if let Some(ip) = ip
                && let Some(offset) = wire::checksum_offset(ip.protocol)
                && let Some(byte) = frame.get_mut(ip.l4() + offset)
            {
                *byte ^= rng.u8() | 1;
            }
        }
        // UDP without a checksum (and the checksum of whatever else is at that place zeroed).
        9 => {
            if let Some(ip) = ip
                && ip.l4() + 8 <= frame.len()
            {
                frame[ip.l4() + 6..ip.l4() + 8].copy_from_slice(&[0, 0]);
            }
        }
        // Another IP version.
        10 => {
            if let Some(byte) = frame.get_mut(start) {
                *byte = (*byte & 0x0f) | rng.pick(&[0x00, 0x60, 0x50, 0xf0]);
            }
        }
        // Another ethertype, or a VLAN tag in front of the IPv4 one.
        _ => {
            if rng.chance(50) {
                *frame = wire::vlan_tagged(frame);
            } else if frame.len() >= 14 {
                let random = rng.u16();
                let ethertype = rng.pick(&[0x86dd, 0x0806, 0x88a8, random]);
                frame[12..14].copy_from_slice(&u16::to_be_bytes(ethertype));
            }
        }
    }
}
