//! ICMP errors (destination unreachable, fragmentation needed, time exceeded, ...).
//!
//! An error quotes the header of the packet that caused it. For the error to reach the right
//! socket the quoted header must be translated like the flow it belongs to, or path MTU
//! discovery and connection failures break for masqueraded flows:
//!
//! * **ingress**: a router or the remote complains about a packet the node sent (`node:nat_port
//!   -> remote`); the quote is rewritten to `pod:port -> remote` and the error goes to the pod;
//! * **egress**: a pod (or the node while forwarding) complains about a reply it received
//!   (`remote -> pod:port`); the quote is rewritten to `remote -> node:nat_port` and the error
//!   leaves from the node address.
//!
//! A quote of a protocol mapped by address alone (GRE, ESP, ...) has only its address
//! translated. An error about a flow opened from outside towards a pod is left alone, as
//! conntrack leaves it: that flow is not translated, so neither is what is said about it.
//!
//! The quoted fields are payload to the kernel, so their checksums (quoted IPv4 header, quoted
//! transport header when present, and the ICMP checksum over all of it) are updated here with
//! RFC 1624 arithmetic. Each change is mirrored into the ICMP checksum, which keeps the packet's
//! total sum, and therefore a `CHECKSUM_COMPLETE` value, unchanged.

use aya_ebpf::programs::TcContext;
use masq_common::{
    checksum::{replace16, replace16_udp, replace32, replace32_udp},
    counters::Counter,
    nat::{Direction, NatEntryV4, NatKeyV4, ORIGIN_INBOUND, proto},
};

use crate::{
    counters::count,
    frag,
    maps::NAT_V4,
    packet::{IP_DST, IP_SRC, Ipv4, Ipv4Header, icmp_type},
    rewrite::{self, End},
    verdict::Verdict,
};

/// Offset of the quoted IPv4 header within the ICMP message.
const QUOTE_OFF: usize = 8;
/// The fragment offset bits of the IPv4 flags-and-offset field.
const FRAGMENT_OFFSET_MASK: u16 = 0x1fff;

/// Where the translatable fields of a quoted packet are.
struct Quote {
    /// Offset of the quoted address to rewrite (the local end of the quoted packet).
    addr_off: usize,
    addr: [u8; 4],
    /// Offset of the quoted port (or ICMP identifier) to rewrite; `None` for protocols
    /// translated by address alone.
    port_off: Option<usize>,
    port: u16,
    /// Offset of the quoted transport checksum, when the quote includes it.
    l4_check_off: Option<usize>,
    ip_check_off: usize,
}

/// What became of an error whose quote was read.
enum Quoted {
    /// The quote belongs to a translated flow: the error was translated to this address.
    Translated([u8; 4]),
    /// The quote belongs to a flow opened from outside towards a pod, which masq leaves alone
    /// (conntrack's entry for it has no NAT): so is the error about it.
    Inbound,
    /// No flow masq knows of, or nothing that can be read as one.
    Unknown,
}

/// An error leaving through the uplink.
#[inline(always)]
pub(crate) fn egress(ctx: &TcContext, node_ip: [u8; 4], ip: &Ipv4) -> Verdict {
    match translate(ctx, ip, Direction::Egress) {
        Ok(Quoted::Translated(addr)) => {
            frag::remember(ip, Direction::Egress, Some(addr));
            count(Counter::EgressIcmpErrorTranslated);
            Verdict::Pass
        }
        Ok(Quoted::Inbound) => {
            count(Counter::EgressInboundReply);
            Verdict::Pass
        }
        Ok(Quoted::Unknown) if ip.src == node_ip => {
            count(Counter::EgressHostPassed);
            Verdict::Pass
        }
        // An error about a flow masq did not translate: conntrack would leave it alone too.
        Ok(Quoted::Unknown) => {
            count(Counter::EgressUnsupported);
            Verdict::Pass
        }
        Err(()) => {
            count(Counter::EgressDropRewriteFailed);
            Verdict::Drop
        }
    }
}

/// An error arriving for the node.
#[inline(always)]
pub(crate) fn ingress(ctx: &TcContext, ip: &Ipv4) -> Verdict {
    match translate(ctx, ip, Direction::Ingress) {
        Ok(Quoted::Translated(addr)) => {
            frag::remember(ip, Direction::Ingress, Some(addr));
            count(Counter::IngressIcmpErrorTranslated);
            Verdict::Pass
        }
        // Flows opened from outside have no ingress half, so no quote finds one here.
        Ok(Quoted::Inbound | Quoted::Unknown) => {
            count(Counter::IngressPassed);
            Verdict::Pass
        }
        Err(()) => {
            count(Counter::IngressDropRewriteFailed);
            Verdict::Drop
        }
    }
}

/// Translates the error `ip` travelling in `direction` if it quotes a packet of a mapped flow.
/// `Err`: a write failed and the packet is inconsistent.
#[inline(always)]
fn translate(ctx: &TcContext, ip: &Ipv4, direction: Direction) -> Result<Quoted, ()> {
    // Everything read or rewritten must lie inside the error's own packet: bytes past its IPv4
    // total length (an Ethernet trailer, a lying length) are not part of the quote.
    let end = ip.l4_off + ip.l4_len;
    let inside = |offset: usize, len: usize| offset + len <= end;
    let quote_ip_off = ip.l4_off + QUOTE_OFF;
    let Ok(quoted) = ctx.load::<Ipv4Header>(quote_ip_off) else {
        return Ok(Quoted::Unknown);
    };
    let Some(quoted_header_len) = quoted.header_len() else {
        return Ok(Quoted::Unknown);
    };
    // A quoted later fragment has no transport header: what follows its IPv4 header is payload
    // (conntrack does not translate errors about fragments either).
    if u16::from_be_bytes(quoted.frag) & FRAGMENT_OFFSET_MASK != 0 {
        return Ok(Quoted::Unknown);
    }
    let quoted_l4 = quote_ip_off + quoted_header_len;
    if !inside(quote_ip_off, quoted_header_len) {
        return Ok(Quoted::Unknown);
    }
    let protocol = quoted.protocol;

    // The quoted packet's local end: its destination when it came in (egress errors), its
    // source when it went out (ingress errors). (local port offset, remote port offset, check)
    let (local_port_off, remote_port_off, l4_check_off) = match (protocol, direction) {
        (proto::TCP, Direction::Egress) => (Some(2), Some(0), Some(16)),
        (proto::TCP, Direction::Ingress) => (Some(0), Some(2), Some(16)),
        (proto::UDP, Direction::Egress) => (Some(2), Some(0), Some(6)),
        (proto::UDP, Direction::Ingress) => (Some(0), Some(2), Some(6)),
        (proto::SCTP, Direction::Egress) => (Some(2), Some(0), None),
        (proto::SCTP, Direction::Ingress) => (Some(0), Some(2), None),
        (proto::ICMP, _) => (Some(4), None, Some(2)),
        // Never mapped: egress passes them untouched (their checksums cover the addresses).
        (proto::DCCP | proto::UDPLITE, _) => return Ok(Quoted::Unknown),
        // Every other protocol is mapped by address alone, its ports 0 (a GRE or ESP tunnel,
        // as conntrack's generic tracking): an error about it is translated like the mapping,
        // and what follows the quoted IPv4 header is no port, nor covered by a checksum that
        // includes the addresses.
        _ => (None, None, None),
    };
    if protocol == proto::ICMP {
        // Only queries are mapped; an error about an error is never translated.
        if !inside(quoted_l4, 1) {
            return Ok(Quoted::Unknown);
        }
        let Ok(quoted_type) = ctx.load::<u8>(quoted_l4) else {
            return Ok(Quoted::Unknown);
        };
        let query = match direction {
            Direction::Egress => {
                matches!(
                    quoted_type,
                    icmp_type::ECHO_REPLY | icmp_type::TIMESTAMP_REPLY
                )
            }
            Direction::Ingress => {
                matches!(
                    quoted_type,
                    icmp_type::ECHO_REQUEST | icmp_type::TIMESTAMP_REQUEST
                )
            }
        };
        if !query {
            return Ok(Quoted::Unknown);
        }
    }
    let port_inside = |offset: Option<usize>| offset.is_none_or(|at| inside(quoted_l4 + at, 2));
    if !port_inside(local_port_off) || !port_inside(remote_port_off) {
        return Ok(Quoted::Unknown);
    }
    // A quote cut before its transport checksum (routers quote at least 8 bytes) has none to
    // keep consistent.
    let l4_check_off = l4_check_off.filter(|&offset| inside(quoted_l4 + offset, 2));
    let Ok(local_port) = load_port(ctx, quoted_l4, local_port_off) else {
        return Ok(Quoted::Unknown);
    };
    let Ok(remote_port) = load_port(ctx, quoted_l4, remote_port_off) else {
        return Ok(Quoted::Unknown);
    };

    let (key, addr_off, addr) = match direction {
        Direction::Egress => (
            NatKeyV4::new(
                quoted.dst,
                quoted.src,
                local_port,
                remote_port,
                protocol,
                direction,
            ),
            quote_ip_off + IP_DST,
            quoted.dst,
        ),
        Direction::Ingress => (
            NatKeyV4::new(
                quoted.dst,
                quoted.src,
                remote_port,
                local_port,
                protocol,
                direction,
            ),
            quote_ip_off + IP_SRC,
            quoted.src,
        ),
    };
    let quote = Quote {
        addr_off,
        addr,
        port_off: local_port_off.map(|offset| quoted_l4 + offset),
        port: local_port,
        l4_check_off: l4_check_off.map(|offset| quoted_l4 + offset),
        ip_check_off: quote_ip_off + 10,
    };
    let Some(entry) = NAT_V4.get_ptr(key) else {
        return Ok(Quoted::Unknown);
    };
    // SAFETY: the pointer comes from a successful lookup and is read once, immediately.
    let entry = unsafe { *entry };
    // The egress record of a flow opened from outside holds the pod's own address: it is there
    // to recognise the pod's answers, not to translate them. An error the node sends about such
    // a flow (time exceeded forwarding to the pod) would otherwise leave as the pod.
    if entry.origin == ORIGIN_INBOUND {
        return Ok(Quoted::Inbound);
    }

    rewrite_quote(ctx, ip, protocol, &quote, &entry)?;
    let end = match direction {
        Direction::Egress => End::Source,
        Direction::Ingress => End::Destination,
    };
    rewrite::address(ctx, ip, end, entry.addr)?;
    Ok(Quoted::Translated(entry.addr))
}

/// The quoted port at `offset` from the quoted transport header; 0 for a packet without one.
#[inline(always)]
fn load_port(ctx: &TcContext, quoted_l4: usize, offset: Option<usize>) -> Result<u16, ()> {
    match offset {
        Some(offset) => ctx
            .load::<[u8; 2]>(quoted_l4 + offset)
            .map(u16::from_be_bytes)
            .map_err(|_| ()),
        None => Ok(0),
    }
}

/// Rewrites the quoted local address and port (if it has one) to `entry`'s and fixes the
/// checksums.
#[inline(always)]
fn rewrite_quote(
    ctx: &TcContext,
    ip: &Ipv4,
    protocol: u8,
    quote: &Quote,
    entry: &NatEntryV4,
) -> Result<(), ()> {
    let icmp_check_off = ip.l4_off + 2;
    let mut icmp_check = u16::from_be_bytes(ctx.load::<[u8; 2]>(icmp_check_off).map_err(|_| ())?);
    let old_ip_check = u16::from_be_bytes(ctx.load::<[u8; 2]>(quote.ip_check_off).map_err(|_| ())?);

    let new_ip_check = replace32(old_ip_check, quote.addr, entry.addr);
    icmp_check = replace32(icmp_check, quote.addr, entry.addr);
    icmp_check = replace16(icmp_check, old_ip_check, new_ip_check);
    if quote.port_off.is_some() {
        icmp_check = replace16(icmp_check, quote.port, entry.port);
    }

    // The quote may stop before the transport checksum (only 8 bytes are guaranteed).
    if let Some(offset) = quote.l4_check_off
        && let Ok(old_l4_check) = ctx.load::<[u8; 2]>(offset)
    {
        let old_l4_check = u16::from_be_bytes(old_l4_check);
        let new_l4_check = match protocol {
            proto::TCP => replace16(
                replace32(old_l4_check, quote.addr, entry.addr),
                quote.port,
                entry.port,
            ),
            proto::UDP => replace16_udp(
                replace32_udp(old_l4_check, quote.addr, entry.addr),
                quote.port,
                entry.port,
            ),
            // ICMP checksums cover no pseudo-header: only the identifier changes.
            _ => replace16(old_l4_check, quote.port, entry.port),
        };
        icmp_check = replace16(icmp_check, old_l4_check, new_l4_check);
        ctx.store(offset, &new_l4_check.to_be_bytes(), 0)
            .map_err(|_| ())?;
    }

    ctx.store(quote.addr_off, &entry.addr, 0).map_err(|_| ())?;
    ctx.store(quote.ip_check_off, &new_ip_check.to_be_bytes(), 0)
        .map_err(|_| ())?;
    if let Some(offset) = quote.port_off {
        ctx.store(offset, &entry.port.to_be_bytes(), 0)
            .map_err(|_| ())?;
    }
    ctx.store(icmp_check_off, &icmp_check.to_be_bytes(), 0)
        .map_err(|_| ())
}
