//! What the datapath needs to know of an address family: its tables, its non-masquerade trie,
//! its socket tuple, its ICMP, how an address is rewritten, and its uplink address. Implemented
//! for the address type itself, so the type of a key, an address or a parsed packet picks the
//! family, and the classification and NAT logic exist once for both.

use aya_ebpf::{
    bindings::{
        bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2,
    },
    btf_maps::{HashMap, PerCpuArray, lpm_trie::Key},
    programs::TcContext,
};
use masq_common::{
    counters::{COUNTER_COUNT, Counter},
    layout::{
        NAT_V4_DEFAULT_MAX_ENTRIES, PROG_SLOT_ALLOCATOR, PROG_SLOT_ALLOCATOR_V6,
        PROG_SLOT_NEW_FLOW, PROG_SLOT_NEW_FLOW_V6, Uplink, UplinkSlot,
    },
    nat::{Address, AllocRequest, NatEntry, NatKey, proto},
};

use crate::{
    counters::count_in,
    frag, icmp,
    maps::{
        ALLOC_REQUEST, ALLOC_REQUEST_V6, COUNTERS, COUNTERS_V6, NAT_V4, NAT_V6, NOMASQ_V4,
        NOMASQ_V6,
    },
    packet::{self, EarlyOutcomes, Frame6, IcmpKind, Ip, icmp_kind_v4, icmp_kind_v6},
    rewrite::{self, End},
    verdict::Verdict,
};

/// The NAT tables' capacity as declared; the agent sets the real one at load time.
pub(crate) const NAT_DECLARED_ENTRIES: usize = NAT_V4_DEFAULT_MAX_ENTRIES as usize;

/// The per-CPU counter arrays' type.
pub(crate) type Counters = PerCpuArray<u64, { COUNTER_COUNT as usize }>;

/// An address family the datapath translates.
pub(crate) trait Family: Address + 'static {
    /// The IP protocol number of the family's ICMP.
    const ICMP: u8;
    /// The `MAP_PROGS` slot of the family's allocator.
    const SLOT_ALLOCATOR: u32;
    /// The `MAP_PROGS` slot of the family's new-flow translation.
    const SLOT_NEW_FLOW: u32;
    /// The family's NAT table.
    fn nat() -> &'static HashMap<NatKey<Self>, NatEntry<Self>, NAT_DECLARED_ENTRIES>;
    /// The per-CPU slot in which the egress program hands a new flow to the allocator.
    fn alloc_request() -> &'static PerCpuArray<AllocRequest<Self>, 1>;
    /// The family's packet counters.
    fn counters() -> &'static Counters;
    /// The `NOMASQ_KIND_*` of the non-masquerade entry that holds `addr`, if one does.
    fn exempt(addr: Self) -> Option<u32>;
    /// The socket lookup tuple `remote:remote_port -> local:local_port`, and how many of its
    /// bytes the lookup helpers read.
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32);
    /// The address masqueraded traffic of this family gets on the uplink of `slot`, if it is
    /// translated there.
    fn of_slot(slot: &UplinkSlot) -> Option<Self>;
    /// As [`Family::of_slot`], from the uplink's full record.
    fn of_uplink(uplink: &Uplink) -> Option<Self>;
    /// How the datapath treats ICMP type `icmp` of this family.
    fn icmp_kind(icmp: u8) -> IcmpKind;
    /// Traffic of the link's own machinery, never translated whatever the config says: for
    /// IPv6, link-local sources (neighbour discovery, router solicitations) and multicast.
    fn link_scoped(src: Self, dst: Self) -> bool;
    /// Parses the frame's headers again (the new-flow program, after the tail calls).
    fn parse_again(ctx: &TcContext) -> Option<Ip<Self>>;
    /// Replaces the `end` address `old` of `ip` by `new`, fixing every checksum that covers it.
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()>;
    /// Records how the first fragment of a datagram was treated, so later fragments follow it.
    fn remember_fragment(ip: &Ip<Self>, direction: masq_common::nat::Direction, addr: Option<Self>);
    /// Translates (or not) a later fragment on egress as its first fragment was.
    fn egress_later_fragment(ctx: &TcContext, node_ip: Self, ip: &Ip<Self>) -> Verdict;
    /// Translates (or not) a later fragment on ingress as its first fragment was.
    fn ingress_later_fragment(ctx: &TcContext, ip: &Ip<Self>) -> Verdict;
    /// Translates an ICMP error leaving by the uplink, quoted packet included.
    fn egress_icmp_error(ctx: &TcContext, node_ip: Self, ip: &Ip<Self>) -> Verdict;
    /// Translates an ICMP error arriving on the uplink, quoted packet included.
    fn ingress_icmp_error(ctx: &TcContext, ip: &Ip<Self>) -> Verdict;
}

impl Family for [u8; 4] {
    const ICMP: u8 = proto::ICMP;
    const SLOT_ALLOCATOR: u32 = PROG_SLOT_ALLOCATOR;
    const SLOT_NEW_FLOW: u32 = PROG_SLOT_NEW_FLOW;

    #[inline(always)]
    fn nat() -> &'static HashMap<NatKey<Self>, NatEntry<Self>, NAT_DECLARED_ENTRIES> {
        &NAT_V4
    }

    #[inline(always)]
    fn alloc_request() -> &'static PerCpuArray<AllocRequest<Self>, 1> {
        &ALLOC_REQUEST
    }

    #[inline(always)]
    fn counters() -> &'static Counters {
        &COUNTERS
    }

    #[inline(always)]
    fn exempt(addr: Self) -> Option<u32> {
        NOMASQ_V4.get(&Key::new(32, addr)).copied()
    }

    #[inline(always)]
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32) {
        let tuple = bpf_sock_tuple {
            __bindgen_anon_1: bpf_sock_tuple__bindgen_ty_1 {
                ipv4: bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 {
                    saddr: u32::from_ne_bytes(remote),
                    daddr: u32::from_ne_bytes(local),
                    sport: remote_port.to_be(),
                    dport: local_port.to_be(),
                },
            },
        };
        (
            tuple,
            size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>() as u32,
        )
    }

    #[inline(always)]
    fn of_slot(slot: &UplinkSlot) -> Option<Self> {
        (slot.present != 0).then_some(slot.snat_addr)
    }

    #[inline(always)]
    fn of_uplink(uplink: &Uplink) -> Option<Self> {
        Some(uplink.snat_addr)
    }

    #[inline(always)]
    fn icmp_kind(icmp: u8) -> IcmpKind {
        icmp_kind_v4(icmp)
    }

    #[inline(always)]
    fn link_scoped(_src: Self, _dst: Self) -> bool {
        // IPv4 link-local destinations are the trie's (masqLinkLocal), as upstream has it.
        false
    }

    #[inline(always)]
    fn parse_again(ctx: &TcContext) -> Option<Ip<Self>> {
        let outcomes = EarlyOutcomes {
            not_ipv4: Counter::EgressNotIpv4,
            malformed: Counter::EgressMalformed,
        };
        packet::classifiable(ctx, &outcomes)
    }

    #[inline(always)]
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()> {
        rewrite::address_v4(ctx, ip, end, old, new)
    }

    #[inline(always)]
    fn remember_fragment(
        ip: &Ip<Self>,
        direction: masq_common::nat::Direction,
        addr: Option<Self>,
    ) {
        frag::remember(ip, direction, addr);
    }

    #[inline(always)]
    fn egress_later_fragment(ctx: &TcContext, node_ip: Self, ip: &Ip<Self>) -> Verdict {
        frag::egress(ctx, node_ip, ip)
    }

    #[inline(always)]
    fn ingress_later_fragment(ctx: &TcContext, ip: &Ip<Self>) -> Verdict {
        frag::ingress(ctx, ip)
    }

    #[inline(always)]
    fn egress_icmp_error(ctx: &TcContext, node_ip: Self, ip: &Ip<Self>) -> Verdict {
        icmp::egress(ctx, node_ip, ip)
    }

    #[inline(always)]
    fn ingress_icmp_error(ctx: &TcContext, ip: &Ip<Self>) -> Verdict {
        icmp::ingress(ctx, ip)
    }
}

impl Family for [u8; 16] {
    const ICMP: u8 = proto::ICMPV6;
    const SLOT_ALLOCATOR: u32 = PROG_SLOT_ALLOCATOR_V6;
    const SLOT_NEW_FLOW: u32 = PROG_SLOT_NEW_FLOW_V6;

    #[inline(always)]
    fn nat() -> &'static HashMap<NatKey<Self>, NatEntry<Self>, NAT_DECLARED_ENTRIES> {
        &NAT_V6
    }

    #[inline(always)]
    fn alloc_request() -> &'static PerCpuArray<AllocRequest<Self>, 1> {
        &ALLOC_REQUEST_V6
    }

    #[inline(always)]
    fn counters() -> &'static Counters {
        &COUNTERS_V6
    }

    #[inline(always)]
    fn exempt(addr: Self) -> Option<u32> {
        NOMASQ_V6.get(&Key::new(128, addr)).copied()
    }

    #[inline(always)]
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32) {
        // SAFETY: 16 bytes either way; every bit pattern is a valid `[u32; 4]`.
        let words = |addr: Self| unsafe { core::mem::transmute::<Self, [u32; 4]>(addr) };
        let tuple = bpf_sock_tuple {
            __bindgen_anon_1: bpf_sock_tuple__bindgen_ty_1 {
                ipv6: bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2 {
                    saddr: words(remote),
                    daddr: words(local),
                    sport: remote_port.to_be(),
                    dport: local_port.to_be(),
                },
            },
        };
        (
            tuple,
            size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>() as u32,
        )
    }

    #[inline(always)]
    fn of_slot(slot: &UplinkSlot) -> Option<Self> {
        (slot.present != 0 && slot.has_v6 != 0).then_some(slot.snat_addr_v6)
    }

    #[inline(always)]
    fn of_uplink(uplink: &Uplink) -> Option<Self> {
        (uplink.has_v6 != 0).then_some(uplink.snat_addr_v6)
    }

    #[inline(always)]
    fn icmp_kind(icmp: u8) -> IcmpKind {
        icmp_kind_v6(icmp)
    }

    #[inline(always)]
    fn link_scoped(src: Self, dst: Self) -> bool {
        let link_local = |addr: Self| addr[0] == 0xfe && addr[1] & 0xc0 == 0x80;
        link_local(src) || dst[0] == 0xff || src == [0; 16]
    }

    #[inline(always)]
    fn parse_again(ctx: &TcContext) -> Option<Ip<Self>> {
        match packet::parse_ipv6(ctx) {
            Frame6::Ipv6(ip) => Some(ip),
            Frame6::Malformed | Frame6::TooManyExtensions => {
                count_in::<Self>(Counter::EgressMalformed);
                None
            }
        }
    }

    #[inline(always)]
    fn rewrite_address(
        ctx: &TcContext,
        ip: &Ip<Self>,
        end: End,
        old: Self,
        new: Self,
    ) -> Result<(), ()> {
        rewrite::address_v6(ctx, ip, end, old, new)
    }

    // IPv6 fragments and ICMPv6 errors are not translated yet: they pass, counted, and the
    // agent does not turn IPv6 translation on until they are.
    #[inline(always)]
    fn remember_fragment(
        _ip: &Ip<Self>,
        _direction: masq_common::nat::Direction,
        _addr: Option<Self>,
    ) {
    }

    #[inline(always)]
    fn egress_later_fragment(_ctx: &TcContext, _node_ip: Self, _ip: &Ip<Self>) -> Verdict {
        count_in::<Self>(Counter::EgressUnsupported);
        Verdict::Pass
    }

    #[inline(always)]
    fn ingress_later_fragment(_ctx: &TcContext, _ip: &Ip<Self>) -> Verdict {
        count_in::<Self>(Counter::IngressPassed);
        Verdict::Pass
    }

    #[inline(always)]
    fn egress_icmp_error(_ctx: &TcContext, _node_ip: Self, _ip: &Ip<Self>) -> Verdict {
        count_in::<Self>(Counter::EgressUnsupported);
        Verdict::Pass
    }

    #[inline(always)]
    fn ingress_icmp_error(_ctx: &TcContext, _ip: &Ip<Self>) -> Verdict {
        count_in::<Self>(Counter::IngressPassed);
        Verdict::Pass
    }
}
