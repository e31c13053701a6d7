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
//!   covers the pseudo-header too) as the difference of the addresses, computed here rather
//!   than by `bpf_csum_diff`. As for IPv4, TCP and UDP ports right after the header are
//!   stored with the addresses.

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    helpers::bpf_csum_update,
    programs::TcContext,
};
use masq_common::{
    checksum::{replace16, replace32},
    kernel::BPF_F_IPV6,
    nat::proto,
};

use crate::{
    address::V6,
    family::Family,
    header::{IP_CHECK, IPV6_SRC},
    packet::{Ip, Ipv4, Ipv6, read},
};

/// Which end of the packet to rewrite.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Source,
    Destination,
}

/// What rewriting does differently per family: IPv4 has a header checksum, IPv6 none, and an
/// address goes into a checksum as one word or as eight.
pub(crate) trait Rewrite: Family {
    /// Replaces the `end` address `old` of `ip` by `new`, fixing every checksum that covers it
    /// (see [`address`]).
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()>;
    /// Replaces the `end` address and port of a flow's packet, `(old, new)` each (see
    /// [`address_and_port`]).
    fn rewrite_address_and_port(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        addresses: (Self, Self),
        ports: (u16, u16),
    ) -> Result<(), ()>;
    /// Updates the internet checksum `check` for the address `old` in the data it covers
    /// becoming `new`.
    fn replace_in_checksum(check: u16, old: Self, new: Self) -> u16;
}

impl Rewrite for [u8; 4] {
    #[inline(always)]
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()> {
        address_v4(ctx, ip, end, old, new)
    }

    #[inline(always)]
    fn rewrite_address_and_port(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        addresses: (Self, Self),
        ports: (u16, u16),
    ) -> Result<(), ()> {
        address_and_port_v4(ctx, ip, end, addresses, ports)
    }

    #[inline(always)]
    fn replace_in_checksum(check: u16, old: Self, new: Self) -> u16 {
        replace32(check, old, new)
    }
}

impl Rewrite for V6 {
    #[inline(always)]
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()> {
        address_v6(ctx, ip, end, old, new)
    }

    #[inline(always)]
    fn rewrite_address_and_port(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        addresses: (Self, Self),
        ports: (u16, u16),
    ) -> Result<(), ()> {
        address_and_port_v6(ctx, ip, end, addresses, ports)
    }

    #[inline(always)]
    fn replace_in_checksum(check: u16, old: Self, new: Self) -> u16 {
        // As eight 16-bit words, not sixteen bytes: LLVM keeps each byte of an array it takes
        // apart in a stack slot of its own, eight bytes wide, and the program's stack is 512.
        // SAFETY: 16 bytes either way; every bit pattern is a valid `[u16; 8]`.
        let (old, new) = unsafe {
            (
                core::mem::transmute::<Self, [u16; 8]>(old),
                core::mem::transmute::<Self, [u16; 8]>(new),
            )
        };
        old.iter().zip(new).fold(check, |check, (old, new)| {
            replace16(check, u16::from_be(*old), u16::from_be(new))
        })
    }
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
pub(crate) fn address<A: Rewrite>(ctx: &TcContext, ip: &Ip<A>, end: End, new: A) -> Result<(), ()> {
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
fn address_v4(ctx: &TcContext, ip: &Ipv4, end: End, old: [u8; 4], new: [u8; 4]) -> Result<(), ()> {
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
    let mut fields = read::<AddressFields>(ctx, ip.l3_off + IP_CHECK).ok_or(())?;
    let check = u16::from_be_bytes(fields.check);
    fields.check = replace32(check, old, new).to_be_bytes();
    match end {
        End::Source => fields.src = new,
        End::Destination => fields.dst = new,
    }
    ctx.store(ip.l3_off + IP_CHECK, &fields, 0).map_err(|_| ())
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

/// The length of an IPv4 header without options.
const PLAIN_IPV4_HEADER: usize = 20;

/// Replaces a flow's `end` address by `new` and its port `old_port` by `new_port` (for ICMP
/// queries, the identifier): [`address`] then [`port`], in as few helper calls as the packet
/// allows (see [`address_and_port_v4`]).
#[inline(always)]
pub(crate) fn address_and_port<A: Rewrite>(
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
fn address_and_port_v4(
    ctx: &TcContext,
    ip: &Ipv4,
    end: End,
    (old, new): ([u8; 4], [u8; 4]),
    (old_port, new_port): (u16, u16),
) -> Result<(), ()> {
    let plain_l4_off = ip.l3_off + PLAIN_IPV4_HEADER;
    let one_store = if ip.l4_off == plain_l4_off && !ip.is_later_fragment() {
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
        replace_port_in_l4_checksum(ctx, checksum, flags, old_port, new_port)?;
    }
    // The fields are built whole from numbers: the header checksum and the ports read as
    // such, the addresses as parsed. A copy of the bytes changed in place would be written
    // to the stack byte by byte and read back wider, which stalls the CPU.
    let mut check = u16::from_be_bytes(read::<[u8; 2]>(ctx, ip.l3_off + IP_CHECK).ok_or(())?);
    if old != new {
        check = replace32(check, old, new);
    }
    let [src_high, src_low, dst_high, dst_low] = read::<[u8; 4]>(ctx, plain_l4_off).ok_or(())?;
    let (src_port, dst_port) = ([src_high, src_low], [dst_high, dst_low]);
    let new_port = new_port.to_be_bytes();
    let fields = match end {
        End::Source => FlowFields {
            check: check.to_be_bytes(),
            src: new,
            dst: ip.dst,
            src_port: new_port,
            dst_port,
        },
        End::Destination => FlowFields {
            check: check.to_be_bytes(),
            src: ip.src,
            dst: new,
            src_port,
            dst_port: new_port,
        },
    };
    ctx.store(ip.l3_off + IP_CHECK, &fields, 0).map_err(|_| ())
}

/// [`address`] for IPv6, which has no header checksum: the difference of the two addresses
/// goes into the transport checksum (ICMPv6's covers a pseudo-header too), then the address is
/// stored.
#[inline(always)]
fn address_v6(ctx: &TcContext, ip: &Ipv6, end: End, old: V6, new: V6) -> Result<(), ()> {
    if !ip.is_later_fragment()
        && let Some((offset, flags)) = l4_checksum_v6(ip.protocol)
    {
        replace_v6_in_l4_checksum(ctx, ip.l4_off + offset, flags, old, new)?;
    }
    let field = match end {
        End::Source => ip.l3_off + IPV6_SRC,
        End::Destination => ip.l3_off + IPV6_SRC + 16,
    };
    ctx.store(field, &new.0, 0).map_err(|_| ())
}

/// 1 when the kernel's `bpf_l4_csum_replace` takes `BPF_F_IPV6` (Linux 6.16), set by the agent
/// when it loads the object (`CSUM_L4_IPV6_GLOBAL`). A constant to the verifier, which drops the
/// branch not taken.
#[unsafe(no_mangle)]
static MASQ_L4_CSUM_IPV6: u8 = 0;

/// Puts an IPv6 address change into the transport checksum at `checksum` (a pseudo-header
/// field, so the helper knows what to do for each kind of checksum the packet carries).
///
/// On a `CHECKSUM_COMPLETE` skb (NICs such as mlx5 deliver them) the helper also moves
/// `skb->csum`, the sum of the packet's bytes, by the checksum field's change: right for IPv4,
/// whose header checksum takes the opposite change, but IPv6 has none, so there the address's
/// change and the field's cancel and `skb->csum` must stay as it was. `BPF_F_IPV6` says so;
/// before Linux 6.16 `bpf_csum_update`, which acts on `CHECKSUM_COMPLETE` skbs only, adds back
/// what the helper took off (`diff`): one more helper call per translated IPv6 packet there.
#[inline(always)]
fn replace_v6_in_l4_checksum(
    ctx: &TcContext,
    checksum: usize,
    flags: u64,
    old: V6,
    new: V6,
) -> Result<(), ()> {
    let diff = checksum_difference(old, new);
    // SAFETY: a plain read of the object's constant; volatile so the compiler keeps the read
    // that the agent's value replaces.
    let ipv6_flag = unsafe { core::ptr::read_volatile(&raw const MASQ_L4_CSUM_IPV6) } != 0;
    let flags = flags | u64::from(BPF_F_PSEUDO_HDR) | if ipv6_flag { BPF_F_IPV6 } else { 0 };
    // Size 0: `to` is a checksum difference, not a value that replaces `from`.
    ctx.l4_csum_replace(checksum, 0, u64::from(diff), flags)
        .map_err(|_| ())?;
    if !ipv6_flag {
        // The helper left `skb->csum - diff` (ones' complement); adding `diff` restores it.
        // Any other skb makes it return -ENOTSUPP and change nothing, which is right.
        // SAFETY: the context's own skb pointer.
        let _ = unsafe { bpf_csum_update(ctx.skb.skb, diff) };
    }
    Ok(())
}

/// The ones'-complement difference `new - old` of two addresses as a 32-bit partial sum, what
/// `bpf_csum_diff` returns, computed here: a helper call costs more than the four additions.
/// Sums of the same words are congruent whatever their byte order, so the words are read
/// as the CPU's own.
#[inline(always)]
fn checksum_difference(old: V6, new: V6) -> u32 {
    let (old, new) = (words(old), words(new));
    let mut sum = 0u64;
    for (old, new) in old.iter().zip(&new) {
        sum += u64::from(!old) + u64::from(*new);
    }
    // End-around carries, twice: the first fold can carry once more.
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum as u32
}

/// An IPv6 address as four 32-bit words.
#[inline(always)]
fn words(addr: V6) -> [u32; 4] {
    // SAFETY: 16 bytes either way, and `V6` is aligned for `u32`.
    unsafe { core::mem::transmute::<V6, [u32; 4]>(addr) }
}

/// Both IPv6 addresses and the ports of the transport header that follows a header without
/// extensions: what a flow's translation rewrites, in one store.
#[repr(C)]
#[derive(Clone, Copy)]
struct FlowFieldsV6 {
    src: V6,
    dst: V6,
    src_port: [u8; 2],
    dst_port: [u8; 2],
}

/// The length of an IPv6 header without extension headers.
const PLAIN_IPV6_HEADER: usize = 40;

/// [`address_and_port`] for IPv6, as [`address_and_port_v4`] does for IPv4: for TCP or UDP right
/// after the IPv6 header, the transport checksum's updates and one store of addresses and
/// ports.
#[inline(always)]
fn address_and_port_v6(
    ctx: &TcContext,
    ip: &Ipv6,
    end: End,
    (old, new): (V6, V6),
    (old_port, new_port): (u16, u16),
) -> Result<(), ()> {
    let one_store = if ip.l4_off == ip.l3_off + PLAIN_IPV6_HEADER && !ip.is_later_fragment() {
        l4_checksum(ip.protocol)
    } else {
        None
    };
    let Some((checksum, flags)) = one_store else {
        if old != new {
            address_v6(ctx, ip, end, old, new)?;
        }
        return port(ctx, ip, end, old_port, new_port);
    };
    if old == new && old_port == new_port {
        return Ok(());
    }
    let checksum = ip.l4_off + checksum;
    if old != new {
        replace_v6_in_l4_checksum(ctx, checksum, flags, old, new)?;
    }
    if old_port != new_port {
        replace_port_in_l4_checksum(ctx, checksum, flags, old_port, new_port)?;
    }
    let mut fields = read::<FlowFieldsV6>(ctx, ip.l3_off + IPV6_SRC).ok_or(())?;
    let new_port = new_port.to_be_bytes();
    match end {
        End::Source => (fields.src, fields.src_port) = (new, new_port),
        End::Destination => (fields.dst, fields.dst_port) = (new, new_port),
    }
    ctx.store(ip.l3_off + IPV6_SRC, &fields, 0).map_err(|_| ())
}

/// Puts a port change into the transport checksum at `checksum` (not a pseudo-header field:
/// a checksum the stack will compute later is left alone).
#[inline(always)]
fn replace_port_in_l4_checksum(
    ctx: &TcContext,
    checksum: usize,
    flags: u64,
    old: u16,
    new: u16,
) -> Result<(), ()> {
    ctx.l4_csum_replace(
        checksum,
        u64::from(u16::from_ne_bytes(old.to_be_bytes())),
        u64::from(u16::from_ne_bytes(new.to_be_bytes())),
        flags | 2,
    )
    .map_err(|_| ())
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
    replace_port_in_l4_checksum(ctx, ip.l4_off + checksum, flags, old, new)?;
    ctx.store(ip.l4_off + field, &new.to_be_bytes(), 0)
        .map_err(|_| ())
}
