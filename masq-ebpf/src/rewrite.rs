//! Rewriting addresses and ports with incremental checksum updates.
//!
//! Each helper call is a call and a return in the kernel, which kernels that mitigate
//! return-stack attacks make expensive, so a translation makes as few as it can:
//!
//! * the IPv4 header checksum is updated here (RFC 1624) and stored with the address it covers
//!   in one `bpf_skb_store_bytes`: it sits next to the addresses, and nothing but the header
//!   itself depends on it. When a flow's port changes too (always, with `--random-fully`) and
//!   the transport header follows a 20-byte IPv4 header, the ports are in the same store:
//!   checksum, addresses and ports are 14 contiguous bytes;
//! * the TCP/UDP checksum is left to `bpf_l4_csum_replace`, with `BPF_F_PSEUDO_HDR` for an
//!   address: only the kernel knows whether the packet's checksum is `CHECKSUM_PARTIAL` (from
//!   the local stack: the field holds only the pseudo-header sum, and a port change must not
//!   touch it) or `CHECKSUM_COMPLETE` (whose sum of the packet the kernel must follow). UDP
//!   updates carry `BPF_F_MARK_MANGLED_0` so a zero ("no checksum") stays zero and a computed
//!   zero is sent as 0xffff;
//! * an ICMP identifier and its checksum (computed in software by the local stack) are updated
//!   here and stored in one call;
//! * IPv6 has no header checksum: an address change goes into the transport checksum (ICMPv6's
//!   covers the pseudo-header too) as one `bpf_csum_diff` of the addresses.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::generated::bpf_csum_diff,
    programs::TcContext,
};
use masq_common::{
    checksum::{replace16, replace32},
    nat::proto,
};

use crate::{
    family::{Family, V6},
    packet::{IP_CHECK, IP_OFF, Ip, Ipv4, Ipv6, read},
};

/// Which end of the packet to rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Source,
    Destination,
}

/// Offset of the transport checksum within the transport header and the extra helper flags it
/// needs, for protocols whose checksum covers the addresses or the ports.
#[inline(always)]
const fn l4_checksum(protocol: u8) -> Option<(usize, u64)> {
    match protocol {
        proto::TCP => Some((16, 0)),
        proto::UDP => Some((6, BPF_F_MARK_MANGLED_0 as u64)),
        _ => None,
    }
}

/// The IPv4 header from its checksum to the destination address: what an address change
/// rewrites, in one store.
#[repr(C)]
#[derive(Clone, Copy)]
struct AddressFields {
    check: [u8; 2],
    src: [u8; 4],
    dst: [u8; 4],
}

/// Replaces the source or destination address, fixing every checksum that covers it: the
/// IPv4 header's, and for protocols whose checksum covers a pseudo-header (TCP, UDP; ICMPv6 too)
/// that one, when the packet carries its transport header.
#[inline(always)]
pub(crate) fn address<A: Family>(ctx: &TcContext, ip: &Ip<A>, end: End, new: A) -> Result<(), ()> {
    let old = match end {
        End::Source => ip.src,
        End::Destination => ip.dst,
    };
    if old == new {
        return Ok(());
    }
    A::rewrite_address(ctx, ip, end, old, new)
}

/// [`address`] for IPv4: the transport checksum by the helper, then the IPv4 checksum computed
/// here and stored with the address in one call.
#[inline(always)]
pub(crate) fn address_v4(
    ctx: &TcContext,
    ip: &Ipv4,
    end: End,
    old: [u8; 4],
    new: [u8; 4],
) -> Result<(), ()> {
    if !ip.is_later_fragment()
        && let Some((offset, flags)) = l4_checksum(ip.protocol)
    {
        ctx.l4_csum_replace(
            ip.l4_off + offset,
            u64::from(u32::from_ne_bytes(old)),
            u64::from(u32::from_ne_bytes(new)),
            flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
        )
        .map_err(|_| ())?;
    }
    // Read afresh: an earlier rewrite of this packet (an ICMP error's quote) may have changed
    // the header since it was parsed.
    let mut fields = read::<AddressFields>(ctx, IP_OFF + IP_CHECK).ok_or(())?;
    let check = u16::from_be_bytes(fields.check);
    fields.check = replace32(check, old, new).to_be_bytes();
    match end {
        End::Source => fields.src = new,
        End::Destination => fields.dst = new,
    }
    ctx.store(IP_OFF + IP_CHECK, &fields, 0).map_err(|_| ())
}

/// The IPv4 header from its checksum to the end of a 20-byte header, and the ports of the
/// transport header that follows it: what a flow's translation rewrites, in one store.
#[repr(C)]
#[derive(Clone, Copy)]
struct FlowFields {
    check: [u8; 2],
    src: [u8; 4],
    dst: [u8; 4],
    src_port: [u8; 2],
    dst_port: [u8; 2],
}

/// The offset of a transport header after an IPv4 header without options.
const PLAIN_L4_OFF: usize = IP_OFF + 20;

/// Replaces a flow's `end` address by `new` and its port `old_port` by `new_port` (for ICMP
/// queries, the identifier): [`address`] then [`port`], in as few helper calls as the packet
/// allows (see [`address_and_port_v4`]).
#[inline(always)]
pub(crate) fn address_and_port<A: Family>(
    ctx: &TcContext,
    ip: &Ip<A>,
    end: End,
    new: A,
    old_port: u16,
    new_port: u16,
) -> Result<(), ()> {
    let old = match end {
        End::Source => ip.src,
        End::Destination => ip.dst,
    };
    A::rewrite_address_and_port(ctx, ip, end, (old, new), (old_port, new_port))
}

/// [`address_and_port`] for IPv4. A TCP or UDP packet whose transport header follows a 20-byte
/// IPv4 header (nearly all of them) takes the transport checksum's updates, then one store of
/// checksum, addresses and ports: three helper calls instead of four, each of them a return
/// that kernels mitigating return-stack attacks make cost about 30 ns. Other packets take the
/// two steps one after the other.
#[inline(always)]
pub(crate) fn address_and_port_v4(
    ctx: &TcContext,
    ip: &Ipv4,
    end: End,
    (old, new): ([u8; 4], [u8; 4]),
    (old_port, new_port): (u16, u16),
) -> Result<(), ()> {
    let one_store = if ip.l4_off == PLAIN_L4_OFF && !ip.is_later_fragment() {
        l4_checksum(ip.protocol)
    } else {
        None
    };
    let Some((checksum, flags)) = one_store else {
        if old != new {
            address_v4(ctx, ip, end, old, new)?;
        }
        return port(ctx, ip, end, old_port, new_port);
    };
    if old == new && old_port == new_port {
        return Ok(());
    }
    let checksum = ip.l4_off + checksum;
    if old != new {
        ctx.l4_csum_replace(
            checksum,
            u64::from(u32::from_ne_bytes(old)),
            u64::from(u32::from_ne_bytes(new)),
            flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
        )
        .map_err(|_| ())?;
    }
    if old_port != new_port {
        ctx.l4_csum_replace(
            checksum,
            u64::from(u16::from_ne_bytes(old_port.to_be_bytes())),
            u64::from(u16::from_ne_bytes(new_port.to_be_bytes())),
            flags | 2,
        )
        .map_err(|_| ())?;
    }
    let mut fields = read::<FlowFields>(ctx, IP_OFF + IP_CHECK).ok_or(())?;
    if old != new {
        let check = u16::from_be_bytes(fields.check);
        fields.check = replace32(check, old, new).to_be_bytes();
    }
    let new_port = new_port.to_be_bytes();
    match end {
        End::Source => (fields.src, fields.src_port) = (new, new_port),
        End::Destination => (fields.dst, fields.dst_port) = (new, new_port),
    }
    ctx.store(IP_OFF + IP_CHECK, &fields, 0).map_err(|_| ())
}

/// Offset of the IPv6 source address in the frame; the destination follows it.
const IPV6_SRC: usize = IP_OFF + 8;

/// [`address`] for IPv6, which has no header checksum: the difference of the two addresses
/// (`bpf_csum_diff`) goes into the transport checksum (ICMPv6's covers a pseudo-header too),
/// then the address is stored.
#[inline(always)]
pub(crate) fn address_v6(ctx: &TcContext, ip: &Ipv6, end: End, old: V6, new: V6) -> Result<(), ()> {
    if !ip.is_later_fragment()
        && let Some((offset, flags)) = l4_checksum_v6(ip.protocol)
    {
        let mut from = words(old);
        let mut to = words(new);
        // SAFETY: both buffers are 16 bytes of the program's stack, as the sizes say.
        let diff = unsafe { bpf_csum_diff(from.as_mut_ptr(), 16, to.as_mut_ptr(), 16, 0) };
        if diff < 0 {
            return Err(());
        }
        // Size 0: `to` is a checksum difference, not a value that replaces `from`.
        ctx.l4_csum_replace(
            ip.l4_off + offset,
            0,
            diff as u64,
            flags | u64::from(BPF_F_PSEUDO_HDR),
        )
        .map_err(|_| ())?;
    }
    let field = match end {
        End::Source => IPV6_SRC,
        End::Destination => IPV6_SRC + 16,
    };
    ctx.store(field, &new.0, 0).map_err(|_| ())
}

/// An IPv6 address as the four 32-bit words `bpf_csum_diff` sums.
#[inline(always)]
fn words(addr: V6) -> [u32; 4] {
    // SAFETY: 16 bytes either way, and `V6` is aligned for `u32`.
    unsafe { core::mem::transmute::<V6, [u32; 4]>(addr) }
}

/// As [`l4_checksum`], for IPv6, where ICMPv6's checksum covers the pseudo-header as well.
#[inline(always)]
const fn l4_checksum_v6(protocol: u8) -> Option<(usize, u64)> {
    match protocol {
        proto::ICMPV6 => Some((2, 0)),
        protocol => l4_checksum(protocol),
    }
}

/// The ICMP header from its checksum to the identifier of a query.
#[repr(C)]
#[derive(Clone, Copy)]
struct IcmpQueryFields {
    check: [u8; 2],
    id: [u8; 2],
}

/// Replaces the source or destination port (for ICMP queries: the identifier), fixing the
/// transport checksum. SCTP ports are never rewritten: its CRC32c cannot be updated
/// incrementally, so SCTP mappings keep their port.
#[inline(always)]
pub(crate) fn port<A: Family>(
    ctx: &TcContext,
    ip: &Ip<A>,
    end: End,
    old: u16,
    new: u16,
) -> Result<(), ()> {
    if old == new {
        return Ok(());
    }
    // The identifier is payload to the ICMP checksum of either family, which the local stack
    // computes in software: updated here.
    if ip.protocol == A::ICMP {
        let offset = ip.l4_off + 2;
        let mut fields = read::<IcmpQueryFields>(ctx, offset).ok_or(())?;
        let check = u16::from_be_bytes(fields.check);
        fields.check = replace16(check, old, new).to_be_bytes();
        fields.id = new.to_be_bytes();
        return ctx.store(offset, &fields, 0).map_err(|_| ());
    }
    let Some((checksum, flags)) = l4_checksum(ip.protocol) else {
        return Err(());
    };
    let field = if end == End::Source { 0 } else { 2 };
    ctx.l4_csum_replace(
        ip.l4_off + checksum,
        u64::from(u16::from_ne_bytes(old.to_be_bytes())),
        u64::from(u16::from_ne_bytes(new.to_be_bytes())),
        flags | 2,
    )
    .map_err(|_| ())?;
    ctx.store(ip.l4_off + field, &new.to_be_bytes(), 0)
        .map_err(|_| ())
}
