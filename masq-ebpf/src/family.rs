//! What differs between the address families the datapath translates, and nothing else: their
//! address types, their header layouts and protocol numbers, which of the maps and programs
//! are theirs, what of an uplink's record is theirs. Implemented for the address type itself,
//! so the type of a key, an address or a parsed packet picks the family, and the
//! classification and NAT logic exist once for both. What the parser, the rewrites and the
//! ICMP translation do differently per family lives with them (`packet::Parse`,
//! `rewrite::Rewrite`); this floor sits on the maps and imports nothing that acts on packets.

use aya_ebpf::{
    bindings::{
        bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1,
        bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2,
    },
    btf_maps::{PerCpuArray, lpm_trie::Key},
    programs::TcContext,
};
use aya_log_ebpf::debug;
use masq_common::{
    layout::{
        PROG_SLOT_ALLOCATOR, PROG_SLOT_ALLOCATOR_V6, PROG_SLOT_FLOW_EVENT, PROG_SLOT_FLOW_EVENT_V6,
        PROG_SLOT_ICMP_ERROR_EGRESS_V6, PROG_SLOT_ICMP_ERROR_INGRESS_V6, PROG_SLOT_PORT_SHARE,
        PROG_SLOT_PORT_SHARE_V6, PROG_SLOT_REVERSE_NAT, PROG_SLOT_REVERSE_NAT_V6,
        PROG_SLOT_SOURCE_NAT, PROG_SLOT_SOURCE_NAT_V6, UPLINK_INDEX_SLOTS, Uplink, UplinkSlot,
    },
    nat::{Address, Handoff, NatKey, proto},
    settings::{FAMILY_IPV4, FAMILY_IPV6},
};

use crate::{
    address::V6,
    header::{IP_CHECK, IP_DST, IP_SRC, IPV6_DST, IPV6_SRC, IcmpKind, icmp_kind_v4, icmp_kind_v6},
    maps::{
        BURIED_V4, BURIED_V6, Buried, COUNTERS, COUNTERS_V6, EVICTIONS, EVICTIONS_V6,
        EvictionCounters, FLOW_INDEX_V4, FLOW_INDEX_V6, FRAGS_V4, FRAGS_V6, FlowIndex, Frags,
        HANDOFF, HANDOFF_V6, HOLDERS_V4, HOLDERS_V6, Holders, NAT_V4, NAT_V6, NOMASQ_SRC_V4,
        NOMASQ_SRC_V6, NOMASQ_V4, NOMASQ_V6, NatTable, PacketCounters, REMOTE_HOLDERS_V4,
        REMOTE_HOLDERS_V6, RemoteHolders, UPLINK_SLOTS, UPLINKS,
    },
};

/// An address family the datapath translates.
pub(crate) trait Family: Address + 'static {
    /// The IP protocol number of the family's ICMP.
    const ICMP: u8;
    /// Whether the family's ICMP checksum covers the pseudo-header (ICMPv6's does).
    const ICMP_CHECKSUM_COVERS_ADDRESSES: bool;
    /// Offsets of the source and destination addresses, and of the header checksum if it has
    /// one, within the family's IP header.
    const QUOTE_SRC: usize;
    const QUOTE_DST: usize;
    const QUOTE_CHECK: Option<usize>;
    /// The `MAP_PROGS` slot of the family's allocator.
    const SLOT_ALLOCATOR: u32;
    /// The `MAP_PROGS` slot of the family's source rewrite (`masq_source_nat`).
    const SLOT_SOURCE_NAT: u32;
    /// The `MAP_PROGS` slot of the family's destination rewrite (`masq_reverse_nat`).
    const SLOT_REVERSE_NAT: u32;
    /// The `MAP_PROGS` slot of the family's flow-event program.
    const SLOT_FLOW_EVENT: u32;
    /// The `MAP_PROGS` slot of the family's port-share program.
    const SLOT_PORT_SHARE: u32;
    /// The `MAP_PROGS` slots of the programs that translate the family's ICMP errors leaving
    /// and arriving, if they have programs of their own (IPv6's: on top of the IPv6 path they
    /// would not fit one program's stack); `None`: the classifiers translate them.
    const SLOT_ICMP_ERROR_EGRESS: Option<u32>;
    const SLOT_ICMP_ERROR_INGRESS: Option<u32>;
    /// The family's index in the per-family values of the settings.
    const FAMILY: usize;
    /// The unspecified address (`0.0.0.0`, `::`): no address.
    const UNSPECIFIED: Self;
    /// The family's packet counters, one slot per `Counter`.
    fn counters() -> &'static PacketCounters;
    /// The family's eviction counters, one slot per cause and class.
    fn evictions() -> &'static EvictionCounters;
    /// The family's NAT table.
    fn nat() -> &'static NatTable<Self>;
    /// The family's fragment table.
    fn frags() -> &'static Frags<Self>;
    /// The per-CPU hand-off between the programs a packet runs through (see `Handoff`).
    fn handoff() -> &'static PerCpuArray<Handoff<Self>, 1>;
    /// The family's flow index, which eviction samples (see `evict`).
    fn flow_index() -> &'static FlowIndex<Self>;
    /// The family's count of unassured flows by local address (see `evict`).
    fn holders() -> &'static Holders<Self>;
    /// The family's count of node ports by pod and busy remote (see `evict`).
    fn remote_holders() -> &'static RemoteHolders<Self>;
    /// The family's removed TCP flows (see `nat::revive`).
    fn buried() -> &'static Buried<Self>;
    /// The `NOMASQ_KIND_*` of the longest destination trie entry that holds `addr`, if one does
    /// (`NOMASQ_KIND_MASQUERADE` means masquerade, as no entry does).
    fn exempt(addr: Self) -> Option<u32>;
    /// Whether the pod source `addr` is in the family's source trie (`nonMasqueradeSrcCIDRs`).
    /// Callers ask only while the settings say the tries hold entries.
    fn source_exempt(addr: Self) -> bool;
    /// The socket lookup tuple `remote:remote_port -> local:local_port`, and how many of its
    /// bytes the lookup helpers read.
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32);
    /// The addresses of this family of the uplink of `slot` (see [`UplinkAddrs`]), if it is
    /// translated there.
    fn of_slot(slot: &UplinkSlot) -> Option<UplinkAddrs<Self>>;
    /// As [`Family::of_slot`], from the uplink's full record.
    fn of_uplink(uplink: &Uplink) -> Option<UplinkAddrs<Self>>;
    /// Whether `node_ip`, what [`Family::of_slot`] gave, stands for an uplink without an
    /// address of this family (the unspecified address): nothing can be masqueraded to it.
    fn unaddressed(node_ip: Self) -> bool;
    /// How the datapath treats ICMP type `icmp` of this family.
    fn icmp_kind(icmp: u8) -> IcmpKind;
    /// Traffic of the link's own machinery, never translated whatever the config says: for
    /// IPv6, link-local sources (neighbour discovery, router solicitations) and multicast.
    fn link_scoped(src: Self, dst: Self) -> bool;
    /// The debug record of a new mapping of `key`'s flow to port `port` (off unless the agent
    /// runs with datapath debug logging): the family's addresses print differently.
    fn log_new_mapping(ctx: &TcContext, key: &NatKey<Self>, port: u16);
    /// The address at `address` (in map memory), read as 32-bit words with volatile loads.
    /// A plain copy of an IPv6 address out of a map value compiles to a call to `memmove`, a
    /// bpf-to-bpf call that arm64 kernels before 6.0 refuse next to tail calls; a volatile load
    /// of the whole address crashes LLVM's BPF backend.
    ///
    /// # Safety
    /// `address` must point at a valid address for the length of the call.
    unsafe fn load(address: *const Self) -> Self;
}

impl Family for [u8; 4] {
    #[inline(always)]
    unsafe fn load(address: *const Self) -> Self {
        // SAFETY: as the caller promises; an IPv4 address is one unaligned word.
        unsafe { core::ptr::read_volatile(address.cast::<[u8; 4]>()) }
    }

    const ICMP: u8 = proto::ICMP;
    const ICMP_CHECKSUM_COVERS_ADDRESSES: bool = false;
    const QUOTE_SRC: usize = IP_SRC;
    const QUOTE_DST: usize = IP_DST;
    const QUOTE_CHECK: Option<usize> = Some(IP_CHECK);
    const SLOT_ALLOCATOR: u32 = PROG_SLOT_ALLOCATOR;
    const SLOT_SOURCE_NAT: u32 = PROG_SLOT_SOURCE_NAT;
    const SLOT_REVERSE_NAT: u32 = PROG_SLOT_REVERSE_NAT;
    const SLOT_FLOW_EVENT: u32 = PROG_SLOT_FLOW_EVENT;
    const SLOT_PORT_SHARE: u32 = PROG_SLOT_PORT_SHARE;
    const SLOT_ICMP_ERROR_EGRESS: Option<u32> = None;
    const SLOT_ICMP_ERROR_INGRESS: Option<u32> = None;
    const UNSPECIFIED: Self = [0; 4];
    const FAMILY: usize = FAMILY_IPV4;

    #[inline(always)]
    fn counters() -> &'static PacketCounters {
        &COUNTERS
    }

    #[inline(always)]
    fn evictions() -> &'static EvictionCounters {
        &EVICTIONS
    }

    #[inline(always)]
    fn nat() -> &'static NatTable<Self> {
        &NAT_V4
    }

    #[inline(always)]
    fn frags() -> &'static Frags<Self> {
        &FRAGS_V4
    }

    #[inline(always)]
    fn handoff() -> &'static PerCpuArray<Handoff<Self>, 1> {
        &HANDOFF
    }

    #[inline(always)]
    fn flow_index() -> &'static FlowIndex<Self> {
        &FLOW_INDEX_V4
    }

    #[inline(always)]
    fn holders() -> &'static Holders<Self> {
        &HOLDERS_V4
    }

    #[inline(always)]
    fn remote_holders() -> &'static RemoteHolders<Self> {
        &REMOTE_HOLDERS_V4
    }

    #[inline(always)]
    fn buried() -> &'static Buried<Self> {
        &BURIED_V4
    }

    #[inline(always)]
    fn exempt(addr: Self) -> Option<u32> {
        NOMASQ_V4.get(&Key::new(32, addr)).copied()
    }

    #[inline(always)]
    fn source_exempt(addr: Self) -> bool {
        NOMASQ_SRC_V4.get(&Key::new(32, addr)).is_some()
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

    // An uplink without IPv4 (its address zero) is still an uplink for IPv4: its packets are
    // classified as everywhere else (exempt destinations and the node's own traffic pass), and
    // those that would be masqueraded are dropped, as MASQUERADE drops them with no address to
    // give (`unaddressed`).
    #[inline(always)]
    fn of_slot(slot: &UplinkSlot) -> Option<UplinkAddrs<Self>> {
        (slot.present != 0).then_some(UplinkAddrs {
            now: slot.snat_addr,
            former: slot.former_addr,
        })
    }

    #[inline(always)]
    fn of_uplink(uplink: &Uplink) -> Option<UplinkAddrs<Self>> {
        Some(UplinkAddrs {
            now: uplink.snat_addr,
            former: uplink.former_addr,
        })
    }

    #[inline(always)]
    fn unaddressed(node_ip: Self) -> bool {
        node_ip == [0; 4]
    }

    #[inline(always)]
    fn icmp_kind(icmp: u8) -> IcmpKind {
        icmp_kind_v4(icmp)
    }

    #[inline(always)]
    fn log_new_mapping(ctx: &TcContext, key: &NatKey<Self>, port: u16) {
        debug!(
            ctx,
            "new mapping proto {} {:i}:{} -> {:i}:{} as port {}",
            key.protocol,
            u32::from_be_bytes(key.src_addr),
            key.src_port,
            u32::from_be_bytes(key.dst_addr),
            key.dst_port,
            port
        );
    }

    #[inline(always)]
    fn link_scoped(_src: Self, _dst: Self) -> bool {
        // IPv4 link-local destinations are the trie's (masqLinkLocal), as upstream has it.
        false
    }
}

impl Family for V6 {
    #[inline(always)]
    unsafe fn load(address: *const Self) -> Self {
        let words = address.cast::<u32>();
        // SAFETY: as the caller promises; `V6` is four words, aligned to 4.
        let [a, b, c, d] = unsafe {
            [
                core::ptr::read_volatile(words),
                core::ptr::read_volatile(words.add(1)),
                core::ptr::read_volatile(words.add(2)),
                core::ptr::read_volatile(words.add(3)),
            ]
        };
        let mut bytes = [0; 16];
        for (chunk, word) in bytes.chunks_exact_mut(4).zip([a, b, c, d]) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        V6(bytes)
    }

    const ICMP: u8 = proto::ICMPV6;
    const ICMP_CHECKSUM_COVERS_ADDRESSES: bool = true;
    const QUOTE_SRC: usize = IPV6_SRC;
    const QUOTE_DST: usize = IPV6_DST;
    const QUOTE_CHECK: Option<usize> = None;
    const SLOT_ALLOCATOR: u32 = PROG_SLOT_ALLOCATOR_V6;
    const SLOT_SOURCE_NAT: u32 = PROG_SLOT_SOURCE_NAT_V6;
    const SLOT_REVERSE_NAT: u32 = PROG_SLOT_REVERSE_NAT_V6;
    const SLOT_FLOW_EVENT: u32 = PROG_SLOT_FLOW_EVENT_V6;
    const SLOT_PORT_SHARE: u32 = PROG_SLOT_PORT_SHARE_V6;
    const SLOT_ICMP_ERROR_EGRESS: Option<u32> = Some(PROG_SLOT_ICMP_ERROR_EGRESS_V6);
    const SLOT_ICMP_ERROR_INGRESS: Option<u32> = Some(PROG_SLOT_ICMP_ERROR_INGRESS_V6);
    const UNSPECIFIED: Self = Self([0; 16]);
    const FAMILY: usize = FAMILY_IPV6;

    #[inline(always)]
    fn counters() -> &'static PacketCounters {
        &COUNTERS_V6
    }

    #[inline(always)]
    fn evictions() -> &'static EvictionCounters {
        &EVICTIONS_V6
    }

    #[inline(always)]
    fn nat() -> &'static NatTable<Self> {
        &NAT_V6
    }

    #[inline(always)]
    fn frags() -> &'static Frags<Self> {
        &FRAGS_V6
    }

    #[inline(always)]
    fn handoff() -> &'static PerCpuArray<Handoff<Self>, 1> {
        &HANDOFF_V6
    }

    #[inline(always)]
    fn flow_index() -> &'static FlowIndex<Self> {
        &FLOW_INDEX_V6
    }

    #[inline(always)]
    fn holders() -> &'static Holders<Self> {
        &HOLDERS_V6
    }

    #[inline(always)]
    fn remote_holders() -> &'static RemoteHolders<Self> {
        &REMOTE_HOLDERS_V6
    }

    #[inline(always)]
    fn buried() -> &'static Buried<Self> {
        &BURIED_V6
    }

    #[inline(always)]
    fn exempt(addr: Self) -> Option<u32> {
        NOMASQ_V6.get(&Key::new(128, addr.0)).copied()
    }

    #[inline(always)]
    fn source_exempt(addr: Self) -> bool {
        NOMASQ_SRC_V6.get(&Key::new(128, addr.0)).is_some()
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
    fn of_slot(slot: &UplinkSlot) -> Option<UplinkAddrs<Self>> {
        (slot.present != 0 && slot.has_v6 != 0).then_some(UplinkAddrs {
            now: Self(slot.snat_addr_v6),
            former: Self(slot.former_addr_v6),
        })
    }

    #[inline(always)]
    fn of_uplink(uplink: &Uplink) -> Option<UplinkAddrs<Self>> {
        (uplink.has_v6 != 0).then_some(UplinkAddrs {
            now: Self(uplink.snat_addr_v6),
            former: Self(uplink.former_addr_v6),
        })
    }

    #[inline(always)]
    fn unaddressed(_node_ip: Self) -> bool {
        // An uplink without a global IPv6 address does not translate IPv6 at all (`of_slot`
        // gives `None`): its IPv6 leaves untranslated, counted, and the agent warns.
        false
    }

    #[inline(always)]
    fn icmp_kind(icmp: u8) -> IcmpKind {
        icmp_kind_v6(icmp)
    }

    #[inline(always)]
    fn log_new_mapping(ctx: &TcContext, key: &NatKey<Self>, port: u16) {
        debug!(
            ctx,
            "new mapping proto {} [{:i}]:{} -> [{:i}]:{} as port {}",
            key.protocol,
            key.src_addr.0,
            key.src_port,
            key.dst_addr.0,
            key.dst_port,
            port
        );
    }

    #[inline(always)]
    fn link_scoped(src: Self, dst: Self) -> bool {
        let link_local = |addr: Self| addr.0[0] == 0xfe && addr.0[1] & 0xc0 == 0x80;
        link_local(src) || dst.0[0] == 0xff || src.0 == [0; 16]
    }
}

/// An uplink's addresses of one family, as the programs see them.
#[derive(Clone, Copy)]
pub(crate) struct UplinkAddrs<A> {
    /// What masqueraded traffic leaving by the uplink gets now.
    pub(crate) now: A,
    /// The address it got before, still the interface's, whose flows live on (the unspecified
    /// address when there is none): replies to it are restored, and the node's packets from
    /// it are the node's (see `Uplink::former_addr`).
    pub(crate) former: A,
}

impl<A: Family> UplinkAddrs<A> {
    /// The uplink address `local` (a packet's source leaving, its destination arriving) is, of
    /// the two: the former address for a packet of its flows, else the current one.
    #[inline(always)]
    pub(crate) fn serving(&self, local: A) -> A {
        if local == self.former && self.former != A::UNSPECIFIED {
            self.former
        } else {
            self.now
        }
    }
}

/// The addresses of family `A` of the packet's device (see [`UplinkAddrs`]), or `None` when masq
/// does not translate that family on that device.
#[inline(always)]
pub(crate) fn uplink_addrs<A: Family>(ctx: &TcContext) -> Option<UplinkAddrs<A>> {
    // SAFETY: `skb` points at the context the kernel passed to the program; `ifindex` is a
    // plain field the verifier lets a classifier read.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if ifindex < UPLINK_INDEX_SLOTS {
        let slot = UPLINK_SLOTS.get(ifindex)?;
        return A::of_slot(slot);
    }
    // SAFETY: the entry is read at once; the agent replaces entries whole.
    UPLINKS
        .get_ptr(ifindex)
        .and_then(|uplink| A::of_uplink(unsafe { &*uplink }))
}
