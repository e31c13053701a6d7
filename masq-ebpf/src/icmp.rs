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
//!
//! IPv6 works alike (the same code, generic over the family): the quoted IPv6 header has no checksum,
//! a quoted ICMPv6 checksum covers the quoted addresses, and an ICMPv6 Packet Too Big about a
//! masqueraded flow reaches the pod, which is what path MTU discovery needs (IPv6 routers never
//! fragment).

use aya_ebpf::programs::TcContext;
use masq_common::{
    checksum::{replace16, replace16_udp},
    counters::Counter,
    nat::{Direction, NatKey, ORIGIN_INBOUND, proto},
};

use crate::{
    counters::count_in,
    frag,
    header::IcmpKind,
    maps::PROGS,
    packet::{Ip, Parse},
    rewrite::{self, End, Rewrite},
    verdict::Verdict,
};

/// Offset of the quoted IP header within the ICMP message.
const QUOTE_OFF: usize = 8;

/// Where the translatable fields of a quoted packet are.
struct Quote {
    /// Offset of the quoted address to rewrite (the local end of the quoted packet).
    addr_off: usize,
    /// Offset of the quoted port (or ICMP identifier) to rewrite; `None` for protocols
    /// translated by address alone.
    port_off: Option<usize>,
    port: u16,
    /// Offset of the quoted transport checksum, when the quote includes it.
    l4_check_off: Option<usize>,
    /// Offset of the quoted IP header's checksum (IPv4 only).
    ip_check_off: Option<usize>,
}

/// What became of an error whose quote was read.
enum Quoted<A> {
    /// The quote belongs to a translated flow: the error was translated to this address.
    Translated(A),
    /// The quote belongs to a flow opened from outside towards a pod, which masq leaves alone
    /// (conntrack's entry for it has no NAT): so is the error about it.
    Inbound,
    /// No flow masq knows of, or nothing that can be read as one.
    Unknown,
}

/// An error the egress classifier found leaving through the uplink whose address is `node_ip`:
/// translated here, or handed to the program of its own that the family translates its
/// errors in (IPv6's: on top of the IPv6 path they would not fit one program's stack).
#[inline(always)]
pub(crate) fn egress_error<A: Parse + Rewrite>(ctx: &TcContext, node_ip: A, ip: &Ip<A>) -> Verdict {
    if let Some(program) = A::SLOT_ICMP_ERROR_EGRESS {
        // SAFETY: the context is the program's own; on success the call does not return.
        unsafe { PROGS.tail_call(ctx, program) };
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop;
    }
    egress(ctx, node_ip, ip)
}

/// An error the ingress classifier found arriving for the node: translated here, or handed on
/// as [`egress_error`] hands on.
#[inline(always)]
pub(crate) fn ingress_error<A: Parse + Rewrite>(ctx: &TcContext, ip: &Ip<A>) -> Verdict {
    if let Some(program) = A::SLOT_ICMP_ERROR_INGRESS {
        // SAFETY: as in `egress_error`.
        unsafe { PROGS.tail_call(ctx, program) };
        count_in::<A>(Counter::IngressPassed);
        return Verdict::Pass;
    }
    ingress(ctx, ip)
}

/// An error leaving through the uplink whose address is `node_ip`.
#[inline(always)]
pub(crate) fn egress<A: Parse + Rewrite>(ctx: &TcContext, node_ip: A, ip: &Ip<A>) -> Verdict {
    match translate(ctx, ip, Direction::Egress) {
        Ok(Quoted::Translated(addr)) => {
            frag::remember(ip, Direction::Egress, Some(addr));
            count_in::<A>(Counter::EgressIcmpErrorTranslated);
            Verdict::Pass
        }
        Ok(Quoted::Inbound) => {
            count_in::<A>(Counter::EgressInboundReply);
            Verdict::Pass
        }
        Ok(Quoted::Unknown) if ip.src == node_ip => {
            count_in::<A>(Counter::EgressHostPassed);
            Verdict::Pass
        }
        // An error about a flow masq did not translate: conntrack would leave it alone too.
        Ok(Quoted::Unknown) => {
            count_in::<A>(Counter::EgressUnsupported);
            Verdict::Pass
        }
        Err(()) => {
            count_in::<A>(Counter::EgressDropRewriteFailed);
            Verdict::Drop
        }
    }
}

/// An error arriving for the node.
#[inline(always)]
pub(crate) fn ingress<A: Parse + Rewrite>(ctx: &TcContext, ip: &Ip<A>) -> Verdict {
    match translate(ctx, ip, Direction::Ingress) {
        Ok(Quoted::Translated(addr)) => {
            frag::remember(ip, Direction::Ingress, Some(addr));
            count_in::<A>(Counter::IngressIcmpErrorTranslated);
            Verdict::Pass
        }
        // Flows opened from outside have no ingress half, so no quote finds one here.
        Ok(Quoted::Inbound | Quoted::Unknown) => {
            count_in::<A>(Counter::IngressPassed);
            Verdict::Pass
        }
        Err(()) => {
            count_in::<A>(Counter::IngressDropRewriteFailed);
            Verdict::Drop
        }
    }
}

/// Translates the error `ip` travelling in `direction` if it quotes a packet of a mapped flow.
/// `Err`: a write failed and the packet is inconsistent.
#[inline(always)]
fn translate<A: Parse + Rewrite>(
    ctx: &TcContext,
    ip: &Ip<A>,
    direction: Direction,
) -> Result<Quoted<A>, ()> {
    // Everything read or rewritten must lie inside the error's own packet: bytes past its IP
    // length (an Ethernet trailer, a lying length) are not part of the quote.
    let end = ip.l4_off + ip.l4_len;
    let inside = |offset: usize, len: usize| offset + len <= end;
    // A quoted later fragment has no transport header (conntrack does not translate errors
    // about fragments either); a quote without a whole IP header is no quote.
    let quote_off = ip.l4_off + QUOTE_OFF;
    let Some(quoted) = A::read_quote(ctx, quote_off, end) else {
        return Ok(Quoted::Unknown);
    };
    let quoted_l4 = quoted.l4_off;
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
        (icmp, _) if icmp == A::ICMP => (Some(4), None, Some(2)),
        // Never mapped: egress passes them untouched (their checksums cover the addresses).
        (proto::DCCP | proto::UDPLITE, _) => return Ok(Quoted::Unknown),
        // Every other protocol is mapped by address alone, its ports 0 (a GRE or ESP tunnel,
        // as conntrack's generic tracking): an error about it is translated like the mapping,
        // and what follows the quoted IPv4 header is no port, nor covered by a checksum that
        // includes the addresses.
        _ => (None, None, None),
    };
    if protocol == A::ICMP {
        // Only queries are mapped; an error about an error is never translated.
        if !inside(quoted_l4, 1) {
            return Ok(Quoted::Unknown);
        }
        let Ok(quoted_type) = ctx.load::<u8>(quoted_l4) else {
            return Ok(Quoted::Unknown);
        };
        let expected = match direction {
            Direction::Egress => IcmpKind::Reply,
            Direction::Ingress => IcmpKind::Request,
        };
        if A::icmp_kind(quoted_type) != expected {
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

    // One key for both directions (one copy of the addresses, which the IPv6 program's stack
    // needs): the quoted packet reversed, its local end first.
    let (src_port, dst_port) = match direction {
        Direction::Egress => (local_port, remote_port),
        Direction::Ingress => (remote_port, local_port),
    };
    let key = NatKey::new(
        quoted.dst, quoted.src, src_port, dst_port, protocol, direction,
    );
    let (addr_off, old_addr) = match direction {
        Direction::Egress => (quote_off + A::QUOTE_DST, key.src_addr),
        Direction::Ingress => (quote_off + A::QUOTE_SRC, key.dst_addr),
    };
    let quote = Quote {
        addr_off,
        port_off: local_port_off.map(|offset| quoted_l4 + offset),
        port: local_port,
        l4_check_off: l4_check_off.map(|offset| quoted_l4 + offset),
        ip_check_off: A::QUOTE_CHECK.map(|at| quote_off + at),
    };
    let Some(entry) = A::nat().get_ptr(key) else {
        return Ok(Quoted::Unknown);
    };
    // SAFETY: the pointer comes from a successful lookup and is read once, immediately.
    let (addr, port, origin) = unsafe { ((*entry).addr, (*entry).port, (*entry).origin) };
    // The egress record of a flow opened from outside holds the pod's own address: it is there
    // to recognise the pod's answers, not to translate them. An error the node sends about such
    // a flow (time exceeded forwarding to the pod) would otherwise leave as the pod.
    if origin == ORIGIN_INBOUND {
        return Ok(Quoted::Inbound);
    }

    rewrite_quote(ctx, ip, protocol, &quote, old_addr, addr, port)?;
    let end = match direction {
        Direction::Egress => End::Source,
        Direction::Ingress => End::Destination,
    };
    rewrite::address(ctx, ip, end, addr)?;
    Ok(Quoted::Translated(addr))
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

/// Rewrites the quoted local address and port (if it has one) to `new_addr` and `new_port` and
/// fixes the checksums.
#[inline(always)]
fn rewrite_quote<A: Rewrite>(
    ctx: &TcContext,
    ip: &Ip<A>,
    protocol: u8,
    quote: &Quote,
    old_addr: A,
    new_addr: A,
    new_port: u16,
) -> Result<(), ()> {
    let icmp_check_off = ip.l4_off + 2;
    let mut icmp_check = u16::from_be_bytes(ctx.load::<[u8; 2]>(icmp_check_off).map_err(|_| ())?);
    icmp_check = A::replace_in_checksum(icmp_check, old_addr, new_addr);
    if let Some(offset) = quote.ip_check_off {
        let old_ip_check = u16::from_be_bytes(ctx.load::<[u8; 2]>(offset).map_err(|_| ())?);
        let new_ip_check = A::replace_in_checksum(old_ip_check, old_addr, new_addr);
        icmp_check = replace16(icmp_check, old_ip_check, new_ip_check);
        ctx.store(offset, &new_ip_check.to_be_bytes(), 0)
            .map_err(|_| ())?;
    }
    if quote.port_off.is_some() {
        icmp_check = replace16(icmp_check, quote.port, new_port);
    }

    // The quote may stop before the transport checksum (only 8 bytes are guaranteed).
    if let Some(offset) = quote.l4_check_off
        && let Ok(old_l4_check) = ctx.load::<[u8; 2]>(offset)
    {
        let old_l4_check = u16::from_be_bytes(old_l4_check);
        let new_l4_check = match protocol {
            proto::TCP => replace16(
                A::replace_in_checksum(old_l4_check, old_addr, new_addr),
                quote.port,
                new_port,
            ),
            // Zero: the UDP datagram carries no checksum, and keeps carrying none.
            proto::UDP if old_l4_check == 0 => 0,
            proto::UDP => {
                let with_address = match A::replace_in_checksum(old_l4_check, old_addr, new_addr) {
                    0 => 0xffff,
                    sum => sum,
                };
                replace16_udp(with_address, quote.port, new_port)
            }
            // ICMPv6 checksums cover the pseudo-header, ICMP ones do not.
            _ if A::ICMP_CHECKSUM_COVERS_ADDRESSES => replace16(
                A::replace_in_checksum(old_l4_check, old_addr, new_addr),
                quote.port,
                new_port,
            ),
            _ => replace16(old_l4_check, quote.port, new_port),
        };
        icmp_check = replace16(icmp_check, old_l4_check, new_l4_check);
        ctx.store(offset, &new_l4_check.to_be_bytes(), 0)
            .map_err(|_| ())?;
    }

    ctx.store(quote.addr_off, &new_addr, 0).map_err(|_| ())?;
    if let Some(offset) = quote.port_off {
        ctx.store(offset, &new_port.to_be_bytes(), 0)
            .map_err(|_| ())?;
    }
    ctx.store(icmp_check_off, &icmp_check.to_be_bytes(), 0)
        .map_err(|_| ())
}
