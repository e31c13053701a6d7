//! Parsing of Ethernet, IPv4, IPv6 and the transport headers the datapath translates, and of
//! the IP header an ICMP error quotes.
//!
//! Headers are read straight from the skb's linear part ([`read`]), where they sit in almost
//! every packet; only headers the skb holds in fragments are copied out with
//! `bpf_skb_load_bytes`. A helper call costs far more than the bytes it copies (a call and a
//! return, which kernels mitigating return-stack attacks make expensive), and every packet on
//! the uplink is parsed.

use aya_ebpf::programs::TcContext;
use masq_common::{
    counters::Counter,
    flow::{MAX_WINDOW_SCALE, NO_WINDOW_SCALE, TcpSegment, tcp_flags},
    nat::{IPV6_MAX_EXTENSION_HEADERS, proto},
};

use crate::{
    address::V6,
    counters::{count, count_in},
    family::Family,
    forget,
    header::{
        ETH_HLEN, IPV4_FRAGMENT_OFFSET_MASK, IPV6_DST, IPV6_HEADER_LEN, IPV6_SRC, IcmpKind,
        Ipv4Header, Ipv6Header, header_len_of,
    },
    maps::{self, PROGS, Walked},
};

const ETH_P_IP: [u8; 2] = [0x08, 0x00];
const IP_MF: u16 = 0x2000;
/// Bytes of a TCP header without options.
const TCP_HEADER_LEN: usize = 20;
/// Most bytes of options a TCP header holds.
const TCP_MAX_OPTIONS: usize = 40;
/// TCP option kinds the datapath reads (RFC 9293, RFC 7323).
mod tcp_option {
    pub(super) const END: u8 = 0;
    pub(super) const NO_OPERATION: u8 = 1;
    pub(super) const WINDOW_SCALE: u8 = 3;
    /// The window scale option's length.
    pub(super) const WINDOW_SCALE_LEN: u8 = 3;
}

/// The `T` at `offset` in the frame, or `None` when the frame is shorter.
///
/// Only reads: a program that writes through packet pointers makes the kernel unclone every
/// cloned skb before it runs (a copy of its head), and each TCP segment the node sends is a
/// clone. Writes go through the helpers, on the packets that are translated.
#[inline(always)]
pub(crate) fn read<T: Copy>(ctx: &TcContext, offset: usize) -> Option<T> {
    let start = ctx.data() + offset;
    if start + size_of::<T>() <= ctx.data_end() {
        // SAFETY: the bytes lie inside the linear part, as the check above proves to the
        // verifier; `read_unaligned` because headers have no alignment in the frame.
        return Some(unsafe { (start as *const T).read_unaligned() });
    }
    ctx.load::<T>(offset).ok()
}

/// The fields of an IPv4 header the datapath uses, as numbers (host order; addresses as
/// they lie in memory).
#[derive(Clone, Copy)]
struct Ipv4Fields {
    version_ihl: u8,
    total_len: u16,
    id: u16,
    frag: u16,
    protocol: u8,
    src: u32,
    dst: u32,
}

impl Ipv4Fields {
    #[inline(always)]
    fn of(header: Ipv4Header) -> Self {
        Self {
            version_ihl: header.version_ihl,
            total_len: u16::from_be_bytes(header.total_len),
            id: u16::from_be_bytes(header.id),
            frag: u16::from_be_bytes(header.frag),
            protocol: header.protocol,
            src: u32::from_ne_bytes(header.src),
            dst: u32::from_ne_bytes(header.dst),
        }
    }
}

/// A parsed IP packet of the family whose addresses are `A`.
#[derive(Clone, Copy)]
pub(crate) struct Ip<A> {
    pub(crate) src: A,
    pub(crate) dst: A,
    /// The transport protocol (for IPv6: the header after the extension headers).
    pub(crate) protocol: u8,
    /// Offset of the IP header in the frame: after the Ethernet header, or 0 on an uplink
    /// without a link-layer header.
    pub(crate) l3_off: usize,
    /// Offset of the transport header in the frame.
    pub(crate) l4_off: usize,
    /// Bytes of transport header and payload the IP header accounts for.
    pub(crate) l4_len: usize,
    /// Identification field, for matching fragments of one datagram.
    pub(crate) id: u32,
    pub(crate) more_fragments: bool,
    pub(crate) fragment_offset: u16,
}

/// A parsed IPv4 packet.
pub(crate) type Ipv4 = Ip<[u8; 4]>;
/// A parsed IPv6 packet.
pub(crate) type Ipv6 = Ip<V6>;

impl<A> Ip<A> {
    /// A fragment other than the first: it carries no transport header.
    #[inline(always)]
    pub(crate) const fn is_later_fragment(&self) -> bool {
        self.fragment_offset != 0
    }

    /// The first fragment of a fragmented datagram.
    #[inline(always)]
    pub(crate) const fn is_first_fragment(&self) -> bool {
        self.more_fragments && self.fragment_offset == 0
    }
}

/// What the Ethernet frame holds.
pub(crate) enum Frame {
    /// IPv6: for the IPv6 programs.
    Ipv6,
    NotIpv4,
    Malformed,
    Ipv4(Ipv4),
}

/// Parses the link-layer and IPv4 headers.
#[inline(always)]
pub(crate) fn parse(ctx: &TcContext) -> Frame {
    let l3_off = maps::ip_offset(ctx);
    let Some(ethertype) = network_protocol(ctx, l3_off) else {
        return Frame::Malformed;
    };
    if ethertype == ETH_P_IPV6 {
        return Frame::Ipv6;
    }
    if ethertype != ETH_P_IP {
        return Frame::NotIpv4;
    }
    // Each way of reading the header turns it into plain numbers at once: a header value that
    // both ways filled would be a copy on the stack, written byte by byte and read back wider,
    // which stalls the CPU on every packet.
    let start = ctx.data() + l3_off;
    let header = if start + size_of::<Ipv4Header>() <= ctx.data_end() {
        // SAFETY: the bytes lie inside the linear part, as the check above proves to the
        // verifier; unaligned, as headers are.
        Ipv4Fields::of(unsafe { (start as *const Ipv4Header).read_unaligned() })
    } else {
        let Ok(header) = ctx.load::<Ipv4Header>(l3_off) else {
            return Frame::Malformed;
        };
        Ipv4Fields::of(header)
    };
    let Some(header_len) = header_len_of(header.version_ihl) else {
        return Frame::Malformed;
    };
    let frame_len = ctx.len() as usize;
    let available = frame_len.saturating_sub(l3_off);
    let total_len = usize::from(header.total_len);
    // A zero total length marks a BIG TCP aggregate larger than 64 KiB: the skb length counts.
    let total_len = if total_len == 0 && available > 0xffff {
        available
    } else {
        total_len
    };
    if total_len < header_len || total_len > available {
        return Frame::Malformed;
    }
    let frag = header.frag;
    Frame::Ipv4(Ipv4 {
        src: header.src.to_ne_bytes(),
        dst: header.dst.to_ne_bytes(),
        protocol: header.protocol,
        l3_off,
        l4_off: l3_off + header_len,
        l4_len: total_len - header_len,
        id: u32::from(header.id),
        more_fragments: frag & IP_MF != 0,
        fragment_offset: frag & IPV4_FRAGMENT_OFFSET_MASK,
    })
}

/// The frame's network protocol, as the ethertype's bytes: read from the Ethernet header, or,
/// on an uplink without one (`l3_off` 0), taken from the skb, which the device set.
#[inline(always)]
fn network_protocol(ctx: &TcContext, l3_off: usize) -> Option<[u8; 2]> {
    if l3_off == 0 {
        // SAFETY: `skb` points at the context the kernel passed; `protocol` is a plain field a
        // classifier may read, the big-endian protocol in its low 16 bits as it lies in memory.
        let protocol = unsafe { (*ctx.skb.skb).protocol };
        let [low, high, _, _] = protocol.to_ne_bytes();
        return Some([low, high]);
    }
    read::<[u8; 2]>(ctx, ETH_HLEN - 2)
}

const ETH_P_IPV6: [u8; 2] = [0x86, 0xdd];
/// IPv6 next-header values of the extension headers walked.
mod next_header {
    pub(crate) const HOP_BY_HOP: u8 = 0;
    pub(crate) const ROUTING: u8 = 43;
    pub(crate) const FRAGMENT: u8 = 44;
    pub(crate) const AUTHENTICATION: u8 = 51;
    pub(crate) const DESTINATION_OPTIONS: u8 = 60;
}

/// What an IPv6 frame holds.
pub(crate) enum Frame6 {
    Malformed,
    /// More extension headers than [`IPV6_MAX_EXTENSION_HEADERS`]: passed and counted.
    TooManyExtensions,
    Ipv6(Ipv6),
}

/// Parses the IPv6 header of an IPv6 frame and walks its extension headers to the transport
/// header (or to a header it does not know, which it treats as the transport).
#[inline(always)]
pub(crate) fn parse_ipv6(ctx: &TcContext) -> Frame6 {
    let l3_off = maps::ip_offset(ctx);
    let Some(header) = read::<Ipv6Header>(ctx, l3_off) else {
        return Frame6::Malformed;
    };
    if header.version_class_flow[0] >> 4 != 6 {
        return Frame6::Malformed;
    }
    let available = (ctx.len() as usize).saturating_sub(l3_off + IPV6_HEADER_LEN);
    let payload_len = usize::from(u16::from_be_bytes(header.payload_len));
    // A zero payload length marks a BIG TCP aggregate larger than 64 KiB: the skb length counts.
    let payload_len = if payload_len == 0 && available > 0xffff {
        available
    } else {
        payload_len
    };
    if payload_len > available {
        return Frame6::Malformed;
    }
    let end = l3_off + IPV6_HEADER_LEN + payload_len;
    let mut next = header.next_header;
    let mut offset = l3_off + IPV6_HEADER_LEN;
    let mut id = 0;
    let mut more_fragments = false;
    let mut fragment_offset = 0;
    // One pass per extension header, and one more that can only meet the transport header.
    for _ in 0..=IPV6_MAX_EXTENSION_HEADERS {
        let length = match next {
            next_header::HOP_BY_HOP | next_header::ROUTING | next_header::DESTINATION_OPTIONS => {
                let Some([following, units]) = read::<[u8; 2]>(ctx, offset) else {
                    return Frame6::Malformed;
                };
                next = following;
                (usize::from(units) + 1) * 8
            }
            next_header::AUTHENTICATION => {
                let Some([following, units]) = read::<[u8; 2]>(ctx, offset) else {
                    return Frame6::Malformed;
                };
                next = following;
                (usize::from(units) + 2) * 4
            }
            next_header::FRAGMENT => {
                let Some(fragment) = read::<[u8; 8]>(ctx, offset) else {
                    return Frame6::Malformed;
                };
                next = fragment[0];
                let offset_flags = u16::from_be_bytes([fragment[2], fragment[3]]);
                fragment_offset = offset_flags >> 3;
                more_fragments = offset_flags & 1 != 0;
                id = u32::from_be_bytes([fragment[4], fragment[5], fragment[6], fragment[7]]);
                8
            }
            protocol => {
                let Some(walked) = forget_path(Walked {
                    l4_len: (end - offset) as u32,
                    id,
                    l4_off: offset as u16,
                    fragment_offset,
                    protocol,
                    more_fragments: u8::from(more_fragments),
                    pad: [0; 2],
                }) else {
                    return Frame6::Malformed;
                };
                // What the walk already knew, told the verifier again: packet access needs
                // offsets it can bound well below 64 KiB.
                if usize::from(walked.l4_off) > IPV6_MAX_L4_OFF {
                    return Frame6::Malformed;
                }
                return Frame6::Ipv6(Ipv6 {
                    src: V6(header.src),
                    dst: V6(header.dst),
                    protocol: walked.protocol,
                    l3_off,
                    l4_off: usize::from(walked.l4_off),
                    l4_len: walked.l4_len as usize,
                    id: walked.id,
                    more_fragments: walked.more_fragments != 0,
                    fragment_offset: walked.fragment_offset,
                });
            }
        };
        offset += length;
        if offset > end {
            return Frame6::Malformed;
        }
    }
    Frame6::TooManyExtensions
}

/// The furthest the transport header of an IPv6 frame can lie: after the IPv6 header and the
/// most extension headers the walk follows, each of at most 2 KiB (a length byte in 8-byte
/// units, plus one).
const IPV6_MAX_L4_OFF: usize = ETH_HLEN + IPV6_HEADER_LEN + IPV6_MAX_EXTENSION_HEADERS * 2048;

/// `walked`, stored and read back through the per-CPU [`WALK_V6`](maps::WALK_V6) slot.
///
/// The verifier knows each path through the extension-header walk by its exact offsets and
/// values, so every number and kind of extension headers would verify the rest of the program
/// anew: the IPv6 egress program then took more than half a million instructions on Linux
/// 6.18, and far more on older verifiers. A value read from a map is only known by its width,
/// so every path reaches the rest of the program in the same state (see [`Walked`]).
#[inline(always)]
fn forget_path(walked: Walked) -> Option<Walked> {
    let slot = maps::WALK_V6.get_ptr_mut(0)?;
    // SAFETY: per-CPU array slots are private to this CPU while the program runs; volatile, so
    // the compiler reads back what the verifier cannot know rather than what it wrote.
    unsafe {
        core::ptr::write_volatile(slot, walked);
        Some(core::ptr::read_volatile(slot))
    }
}

/// Counters for the ways a frame can fall out before classification.
pub(crate) struct EarlyOutcomes {
    pub(crate) not_ipv4: Counter,
    pub(crate) malformed: Counter,
    /// The `MAP_PROGS` slot IPv6 frames are handed to, if any.
    pub(crate) ipv6_program: Option<u32>,
}

/// Parses the frame, counting and returning `None` for frames the classifiers have nothing to
/// do with (not IPv4, unparsable). The settings are fetched by the callers: returning the map
/// pointer from here lets LLVM pack it with other values, which the verifier rejects.
#[inline(always)]
pub(crate) fn classifiable(ctx: &TcContext, outcomes: &EarlyOutcomes) -> Option<Ipv4> {
    match parse(ctx) {
        Frame::Ipv4(ip) => Some(ip),
        Frame::Ipv6 => {
            if let Some(slot) = outcomes.ipv6_program {
                // SAFETY: the context is the program's own; on success the call does not
                // return.
                unsafe { PROGS.tail_call(ctx, slot) };
            }
            // An older agent's program array, without the IPv6 programs: untouched, as before.
            count(outcomes.not_ipv4);
            None
        }
        Frame::NotIpv4 => {
            count(outcomes.not_ipv4);
            None
        }
        Frame::Malformed => {
            count(outcomes.malformed);
            None
        }
    }
}

/// The ports of a UDP packet that carries its header. A plain pair rather than a
/// [`Transport`]: building that enum twice in one program led LLVM to fill its padding from a
/// map pointer, which the verifier rejects.
#[inline(always)]
pub(crate) fn udp_ports<A>(ctx: &TcContext, ip: &Ip<A>) -> Option<(u16, u16)> {
    if ip.l4_len < 8 {
        return None;
    }
    let ports = read::<[u8; 4]>(ctx, ip.l4_off)?;
    Some((
        u16::from_be_bytes([ports[0], ports[1]]),
        u16::from_be_bytes([ports[2], ports[3]]),
    ))
}

/// What kind of transport a packet carries.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// TCP, UDP or SCTP: `src` and `dst` are the ports.
    Ports,
    /// ICMP echo or timestamp: `src` is the identifier, `request` tells the direction.
    IcmpQuery,
    /// ICMP error quoting another packet.
    IcmpError,
    /// ICMP of a type the datapath does not translate.
    IcmpOther,
    /// Any other IP protocol: translated by address only.
    Other,
}

/// The transport-level identity of a packet.
///
/// A struct with every field always set rather than an enum with data: LLVM fills the padding
/// of a data-carrying enum with whatever a register holds, and when that is a map pointer the
/// verifier rejects the program.
#[derive(Clone, Copy)]
pub(crate) struct Transport {
    pub(crate) kind: Kind,
    pub(crate) src: u16,
    pub(crate) dst: u16,
    /// ICMP queries: a request (echo, timestamp) rather than a reply.
    pub(crate) request: bool,
    /// TCP: the segment as the flow's tracking reads it (all zero for other protocols).
    pub(crate) tcp: TcpSegment,
}

impl Transport {
    const fn of(kind: Kind) -> Self {
        Self {
            kind,
            src: 0,
            dst: 0,
            request: false,
            tcp: TcpSegment {
                seq: 0,
                ack: 0,
                len: 0,
                window: 0,
                flags: 0,
                scale: NO_WINDOW_SCALE,
            },
        }
    }

    /// A TCP SYN without ACK or RST: the only segment that may open a connection.
    #[inline(always)]
    pub(crate) const fn tcp_opens(&self) -> bool {
        self.tcp.flags & (tcp_flags::SYN | tcp_flags::ACK | tcp_flags::RST) == tcp_flags::SYN
    }
}

/// Reads the transport header of a packet that is not a later fragment.
/// `Err` means the header is truncated.
#[inline(always)]
pub(crate) fn transport<A: Family>(ctx: &TcContext, ip: &Ip<A>) -> Result<Transport, ()> {
    if ip.protocol == A::ICMP {
        if ip.l4_len < 8 {
            return Err(());
        }
        let header = read::<[u8; 8]>(ctx, ip.l4_off).ok_or(())?;
        let id = u16::from_be_bytes([header[4], header[5]]);
        return Ok(match A::icmp_kind(header[0]) {
            IcmpKind::Request => Transport {
                src: id,
                request: true,
                ..Transport::of(Kind::IcmpQuery)
            },
            IcmpKind::Reply => Transport {
                src: id,
                ..Transport::of(Kind::IcmpQuery)
            },
            IcmpKind::Error => Transport::of(Kind::IcmpError),
            IcmpKind::Other => Transport::of(Kind::IcmpOther),
        });
    }
    match ip.protocol {
        proto::TCP | proto::UDP | proto::SCTP => {
            let needed = match ip.protocol {
                proto::TCP => 20,
                proto::UDP => 8,
                _ => 12,
            };
            if ip.l4_len < needed {
                return Err(());
            }
            if ip.protocol == proto::TCP {
                // Ports, sequence numbers, data offset, flags and window in one read.
                let header = read::<[u8; 16]>(ctx, ip.l4_off).ok_or(())?;
                let flags = header[13];
                let header_len = usize::from(header[12] >> 4) * 4;
                let scale = if flags & tcp_flags::SYN != 0 && header_len > TCP_HEADER_LEN {
                    window_scale(ctx, ip.l4_off + TCP_HEADER_LEN, header_len - TCP_HEADER_LEN)
                } else {
                    NO_WINDOW_SCALE
                };
                return Ok(Transport {
                    src: u16::from_be_bytes([header[0], header[1]]),
                    dst: u16::from_be_bytes([header[2], header[3]]),
                    tcp: TcpSegment {
                        seq: u32::from_be_bytes([header[4], header[5], header[6], header[7]]),
                        ack: u32::from_be_bytes([header[8], header[9], header[10], header[11]]),
                        len: ip.l4_len.saturating_sub(header_len) as u32,
                        window: u16::from_be_bytes([header[14], header[15]]),
                        flags,
                        scale,
                    },
                    ..Transport::of(Kind::Ports)
                });
            }
            let ports = read::<[u8; 4]>(ctx, ip.l4_off).ok_or(())?;
            Ok(Transport {
                src: u16::from_be_bytes([ports[0], ports[1]]),
                dst: u16::from_be_bytes([ports[2], ports[3]]),
                ..Transport::of(Kind::Ports)
            })
        }
        _ => Ok(Transport::of(Kind::Other)),
    }
}

/// The window scale the options of a SYN or SYN-ACK announce (`options_len` bytes of them at
/// `options_off`), capped at TCP's maximum; [`NO_WINDOW_SCALE`] when they announce none (or are
/// cut short). The walk reads an option's first bytes per option, and at most the 40 bytes a
/// header holds; only SYNs are walked.
///
/// The position in the options goes through `forget::word` at each step: the verifier would
/// otherwise follow every combination of option kinds and lengths (it did not finish within a
/// million instructions), where now each step is one state.
#[inline(always)]
fn window_scale(ctx: &TcContext, options_off: usize, options_len: usize) -> u8 {
    let options_len = options_len.min(TCP_MAX_OPTIONS);
    let mut at = 0;
    // One pass per byte at most: every option is at least one byte long.
    for _ in 0..TCP_MAX_OPTIONS {
        let Some(here) = forget::word(at) else {
            break;
        };
        let here = here as usize;
        if here >= options_len {
            break;
        }
        // Copied out by the helper: a direct read at a position the verifier knows only by
        // its range is one it cannot prove inside the packet.
        let Ok(kind) = ctx.load::<u8>(options_off + here) else {
            break;
        };
        if kind == tcp_option::END {
            break;
        }
        if kind == tcp_option::NO_OPERATION {
            at = here as u32 + 1;
            continue;
        }
        let Ok([_, len, value]) = ctx.load::<[u8; 3]>(options_off + here) else {
            break;
        };
        if kind == tcp_option::WINDOW_SCALE && len == tcp_option::WINDOW_SCALE_LEN {
            return value.min(MAX_WINDOW_SCALE);
        }
        if len < 2 {
            break;
        }
        at = here as u32 + u32::from(len);
    }
    NO_WINDOW_SCALE
}

/// The quoted packet's IP header, as far as the translation of an ICMP error needs it.
pub(crate) struct QuotedIp<A> {
    pub(crate) src: A,
    pub(crate) dst: A,
    pub(crate) protocol: u8,
    /// Offset of the quoted transport header in the frame.
    pub(crate) l4_off: usize,
}

/// What parsing does differently per family, beyond the classifiers' own entry points.
pub(crate) trait Parse: Family {
    /// Parses the frame's headers again (the rewrite programs, after the tail calls); a frame
    /// that no longer parses is counted under `malformed`.
    fn parse_again(ctx: &TcContext, malformed: Counter) -> Option<Ip<Self>>;
    /// The IP header an ICMP error quotes at `offset`, if the quote holds a whole one, of a
    /// first (or only) fragment, inside the error's packet (which ends at `end`).
    fn read_quote(ctx: &TcContext, offset: usize, end: usize) -> Option<QuotedIp<Self>>;
}

impl Parse for [u8; 4] {
    #[inline(always)]
    fn parse_again(ctx: &TcContext, malformed: Counter) -> Option<Ip<Self>> {
        let outcomes = EarlyOutcomes {
            not_ipv4: malformed,
            malformed,
            ipv6_program: None,
        };
        classifiable(ctx, &outcomes)
    }

    #[inline(always)]
    fn read_quote(ctx: &TcContext, offset: usize, end: usize) -> Option<QuotedIp<Self>> {
        let quoted = ctx.load::<Ipv4Header>(offset).ok()?;
        let header_len = quoted.header_len()?;
        // A later fragment: what follows its header is payload, not a transport header.
        if u16::from_be_bytes(quoted.frag) & IPV4_FRAGMENT_OFFSET_MASK != 0
            || offset + header_len > end
        {
            return None;
        }
        Some(QuotedIp {
            src: quoted.src,
            dst: quoted.dst,
            protocol: quoted.protocol,
            l4_off: offset + header_len,
        })
    }
}

impl Parse for V6 {
    #[inline(always)]
    fn parse_again(ctx: &TcContext, malformed: Counter) -> Option<Ip<Self>> {
        match parse_ipv6(ctx) {
            Frame6::Ipv6(ip) => Some(ip),
            Frame6::Malformed | Frame6::TooManyExtensions => {
                count_in::<Self>(malformed);
                None
            }
        }
    }

    #[inline(always)]
    fn read_quote(ctx: &TcContext, offset: usize, end: usize) -> Option<QuotedIp<Self>> {
        // Field by field: a copy of the whole header would not fit beside the rest.
        let [_, _, next_header, _] = ctx.load::<[u8; 4]>(offset + 4).ok()?;
        // Extension headers in a quote (a fragment header among them) are not walked: such an
        // error is not translated.
        let known = matches!(next_header, proto::TCP | proto::UDP | proto::SCTP)
            || next_header == proto::ICMPV6;
        if !known || offset + IPV6_HEADER_LEN > end {
            return None;
        }
        Some(QuotedIp {
            src: ctx.load::<Self>(offset + IPV6_SRC).ok()?,
            dst: ctx.load::<Self>(offset + IPV6_DST).ok()?,
            protocol: next_header,
            l4_off: offset + IPV6_HEADER_LEN,
        })
    }
}
