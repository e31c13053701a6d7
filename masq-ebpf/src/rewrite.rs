//! Rewriting addresses and ports with incremental checksum updates.
//!
//! Each helper call is a call and a return in the kernel, which kernels that mitigate
//! return-stack attacks make expensive, so a translation makes as few as it can:
//!
//! * the IPv4 header checksum is updated here (RFC 1624) and stored with the address it covers
//!   in one `bpf_skb_store_bytes`: it sits next to the addresses, and nothing but the header
//!   itself depends on it;
//! * the TCP/UDP checksum is left to `bpf_l4_csum_replace`, with `BPF_F_PSEUDO_HDR` for an
//!   address: only the kernel knows whether the packet's checksum is `CHECKSUM_PARTIAL` (from
//!   the local stack: the field holds only the pseudo-header sum, and a port change must not
//!   touch it) or `CHECKSUM_COMPLETE` (whose sum of the packet the kernel must follow). UDP
//!   updates carry `BPF_F_MARK_MANGLED_0` so a zero ("no checksum") stays zero and a computed
//!   zero is sent as 0xffff;
//! * an ICMP identifier and its checksum (which covers no pseudo-header and is never offloaded)
//!   are updated here and stored in one call.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use masq_common::{
    checksum::{replace16, replace32},
    nat::proto,
};

use crate::packet::{IP_CHECK, IP_OFF, Ipv4, read};

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

/// Replaces the source or destination address, fixing the IPv4 checksum and, for TCP and UDP
/// packets that carry their header, the pseudo-header part of the transport checksum.
#[inline(always)]
pub(crate) fn address(ctx: &TcContext, ip: &Ipv4, end: End, new: [u8; 4]) -> Result<(), ()> {
    let old = match end {
        End::Source => ip.src,
        End::Destination => ip.dst,
    };
    if old == new {
        return Ok(());
    }
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
pub(crate) fn port(ctx: &TcContext, ip: &Ipv4, end: End, old: u16, new: u16) -> Result<(), ()> {
    if old == new {
        return Ok(());
    }
    if ip.protocol == proto::ICMP {
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
