//! Rewriting addresses and ports with incremental checksum updates.
//!
//! The kernel helpers do the checksum work: `bpf_l3_csum_replace` for the IPv4 header, and
//! `bpf_l4_csum_replace` with `BPF_F_PSEUDO_HDR` for the TCP/UDP pseudo-header, which also keeps
//! `CHECKSUM_PARTIAL` packets from the local stack (whose checksum field holds only the
//! pseudo-header sum) and `CHECKSUM_COMPLETE` packets consistent. UDP updates carry
//! `BPF_F_MARK_MANGLED_0` so a zero ("no checksum") stays zero and a computed zero is sent as
//! 0xffff.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use masq_common::nat::proto;

use crate::packet::{IP_CHECK, IP_DST, IP_OFF, IP_SRC, Ipv4};

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

/// Replaces the source or destination address, fixing the IPv4 checksum and, for TCP and UDP
/// packets that carry their header, the pseudo-header part of the transport checksum.
#[inline(always)]
pub(crate) fn address(ctx: &TcContext, ip: &Ipv4, end: End, new: [u8; 4]) -> Result<(), ()> {
    let (old, field) = match end {
        End::Source => (ip.src, IP_SRC),
        End::Destination => (ip.dst, IP_DST),
    };
    if old == new {
        return Ok(());
    }
    let from = u64::from(u32::from_ne_bytes(old));
    let to = u64::from(u32::from_ne_bytes(new));
    if !ip.is_later_fragment()
        && let Some((offset, flags)) = l4_checksum(ip.protocol)
    {
        ctx.l4_csum_replace(
            ip.l4_off + offset,
            from,
            to,
            flags | u64::from(BPF_F_PSEUDO_HDR) | 4,
        )
        .map_err(|_| ())?;
    }
    ctx.l3_csum_replace(IP_OFF + IP_CHECK, from, to, 4)
        .map_err(|_| ())?;
    ctx.store(IP_OFF + field, &new, 0).map_err(|_| ())
}

/// Replaces the source or destination port (for ICMP queries: the identifier), fixing the
/// transport checksum. SCTP ports are never rewritten: its CRC32c cannot be updated
/// incrementally, so SCTP mappings keep their port.
#[inline(always)]
pub(crate) fn port(ctx: &TcContext, ip: &Ipv4, end: End, old: u16, new: u16) -> Result<(), ()> {
    if old == new {
        return Ok(());
    }
    let from = u64::from(u16::from_ne_bytes(old.to_be_bytes()));
    let to = u64::from(u16::from_ne_bytes(new.to_be_bytes()));
    let (field, checksum, flags) = match ip.protocol {
        proto::ICMP => (4, 2, 0),
        protocol => {
            let Some((checksum, flags)) = l4_checksum(protocol) else {
                return Err(());
            };
            let field = if end == End::Source { 0 } else { 2 };
            (field, checksum, flags)
        }
    };
    ctx.l4_csum_replace(ip.l4_off + checksum, from, to, flags | 2)
        .map_err(|_| ())?;
    ctx.store(ip.l4_off + field, &new.to_be_bytes(), 0)
        .map_err(|_| ())
}
