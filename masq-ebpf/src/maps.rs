//! The maps shared by both programs and the agent. All are pinned by the agent under its pin
//! path so a restarted agent adopts them; names and layouts come from `masq_common::layout`.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
    programs::TcContext,
};
use masq_common::{
    counters::{ALLOC_HISTOGRAM_BUCKETS, COUNTER_COUNT},
    layout::{
        EXPIRED_MAX_ENTRIES, FRAGS_V4_MAX_ENTRIES, LINK_ETHERNET, LINK_IP, MapMeta,
        NAT_V4_DEFAULT_MAX_ENTRIES, NOMASQ_SRC_MAX_ENTRIES, NOMASQ_V4_MAX_ENTRIES, PROG_SLOTS,
        UPLINK_INDEX_SLOTS, UPLINKS_MAX_ENTRIES, Uplink, UplinkSlot,
    },
    nat::{
        AllocRequest, AllocRequestV4, FragEntry, FragEntryV4, FragKey, FragKeyV4, NatEntry, NatKey,
    },
    settings::Settings,
};

use crate::family::{Family, V6};

/// Datapath settings (SNAT port ranges, flags) at index 0. Written by the agent when it starts
/// and whenever its flags change; read by both programs on every packet. Until the agent writes
/// it, the programs translate nothing.
#[btf_map(name = "masq_settings")]
pub(crate) static SETTINGS: Array<Settings, 1> = Array::new();

/// The interfaces masq translates on, by interface index, with the address each masquerades to.
/// Written by the agent when it attaches to an interface and whenever that interface's address
/// changes, removed when it detaches; read by both programs on every packet (the index of the
/// device the packet crosses). A packet on an interface without an entry passes untouched.
#[btf_map(name = "masq_uplinks")]
pub(crate) static UPLINKS: HashMap<u32, Uplink, { UPLINKS_MAX_ENTRIES as usize }> = HashMap::new();

/// The uplinks with an interface index below `UPLINK_INDEX_SLOTS`, at their index: what the
/// programs read instead of `UPLINKS` for those (an array lookup is inlined, a hash lookup is
/// calls). Written by the agent with each `UPLINKS` entry; read by both programs on every packet.
#[btf_map(name = "masq_uplink_slots")]
pub(crate) static UPLINK_SLOTS: Array<UplinkSlot, { UPLINK_INDEX_SLOTS as usize }> = Array::new();

/// Layout identity of the pinned map set at index 0. Written by the agent when it creates the
/// maps, read by later agents before they adopt them; the programs never touch it.
#[btf_map(name = "masq_meta")]
pub(crate) static META: Array<MapMeta, 1> = Array::new();

/// Non-masquerade IPv4 destinations, longest-prefix match, value `NOMASQ_KIND_*`: the longest
/// matching prefix decides, and `NOMASQ_KIND_MASQUERADE` (a `masqueradeCIDRs` network) says
/// masquerade after all. Written by the agent from the config (diff-synced: additions before
/// removals); read by the egress program for flows that have no mapping yet.
#[btf_map(name = "masq_nomasq_v4")]
pub(crate) static NOMASQ_V4: LpmTrie<[u8; 4], u32, { NOMASQ_V4_MAX_ENTRIES as usize }> =
    LpmTrie::new();

/// IPv4 pod sources never masqueraded, whatever the destination (`nonMasqueradeSrcCIDRs`),
/// longest-prefix match, value `NOMASQ_KIND_SOURCE`. Written by the agent from the config
/// (diff-synced like [`NOMASQ_V4`]), before it sets `SETTING_SOURCE_EXEMPTIONS`; read by the
/// egress program for a pod's flow without a mapping, only while that flag is set. Pinned, but
/// newer than the pinned layout: an agent adopting an older set creates it.
#[btf_map(name = "masq_nomasq_src_v4")]
pub(crate) static NOMASQ_SRC_V4: LpmTrie<[u8; 4], u32, { NOMASQ_SRC_MAX_ENTRIES as usize }> =
    LpmTrie::new();

/// IPv6 pod sources never masqueraded, as [`NOMASQ_SRC_V4`] for IPv4. Read by the IPv6 egress
/// program.
#[btf_map(name = "masq_nomasq_src_v6")]
pub(crate) static NOMASQ_SRC_V6: LpmTrie<[u8; 16], u32, { NOMASQ_SRC_MAX_ENTRIES as usize }> =
    LpmTrie::new();

/// The NAT tables' type: a plain, preallocated hash, so that a full table refuses new flows
/// rather than evicting live ones (see [`NAT_V4`]). The capacity is as declared; the agent sets
/// the real one at load time.
#[cfg(not(feature = "variant-lru-table"))]
pub(crate) type NatTable<A> =
    HashMap<NatKey<A>, NatEntry<A>, { NAT_V4_DEFAULT_MAX_ENTRIES as usize }>;

/// The LRU benchmark variants' NAT tables: a full table evicts to make room, and entries move
/// on the LRU lists as they are looked up.
#[cfg(feature = "variant-lru-table")]
pub(crate) type NatTable<A> =
    LruHashMap<NatKey<A>, NatEntry<A>, { NAT_V4_DEFAULT_MAX_ENTRIES as usize }, NAT_TABLE_FLAGS>;

/// The LRU variant with the kernel's shared LRU list.
#[cfg(all(
    feature = "variant-lru-table",
    not(feature = "variant-lru-table-no-common")
))]
const NAT_TABLE_FLAGS: usize = 0;

/// The LRU variant with a list per CPU: no lock shared by all CPUs, but each CPU evicts only
/// from its own share of the table.
#[cfg(feature = "variant-lru-table-no-common")]
const NAT_TABLE_FLAGS: usize = aya_ebpf::bindings::BPF_F_NO_COMMON_LRU as usize;

/// Both halves of every translated flow (see `masq_common::nat`). Written by the programs
/// (new mappings, last-seen refreshes at most once a second, TCP flags); expired flows are
/// deleted by the agent's garbage collector. A plain, preallocated hash: when it is full new
/// flows are refused and counted, and no live flow is ever evicted (conntrack never evicts an
/// assured flow either). The agent sizes it at load time (`--nat-max-entries`).
#[btf_map(name = "masq_nat_v4")]
pub(crate) static NAT_V4: NatTable<[u8; 4]> = NatTable::new();

/// Translation decided for the first fragment of each fragmented datagram, so later fragments
/// (which carry no ports) follow it. Written and read by the programs; stale entries are removed
/// by the agent and evicted by LRU.
#[btf_map(name = "masq_frags_v4")]
pub(crate) static FRAGS_V4: LruHashMap<FragKeyV4, FragEntryV4, { FRAGS_V4_MAX_ENTRIES as usize }> =
    LruHashMap::new();

/// Per-CPU packet counters indexed by `masq_common::counters::Counter`. Incremented by the
/// programs; summed by the agent for metrics and `masq status`.
#[btf_map(name = "masq_counters")]
pub(crate) static COUNTERS: PerCpuArray<u64, { COUNTER_COUNT as usize }> = PerCpuArray::new();

/// Per-CPU histogram of how many ports new flows tried before one was free; the last bucket
/// counts flows that found none. Incremented by the egress program; read by the agent.
#[btf_map(name = "masq_retries")]
pub(crate) static ALLOC_RETRIES: PerCpuArray<u64, { ALLOC_HISTOGRAM_BUCKETS as usize }> =
    PerCpuArray::new();

/// The programs the egress program tail-calls, by `PROG_SLOT_*`: the port allocator. Written by
/// the agent right after it loads the programs (before it attaches them), so a packet never
/// finds the slot empty; pinned, because the kernel empties a program array once no file
/// descriptor or pin refers to it, and the attached programs outlive the agent.
#[btf_map(name = "masq_progs")]
pub(crate) static PROGS: ProgramArray<{ PROG_SLOTS as usize }> = ProgramArray::new();

/// The new flow the egress program asks the allocator to map, per CPU. Written by the egress
/// program just before its tail call, read by the allocator right after; pinned with the
/// program array so that during an upgrade an old egress program and a new allocator share it.
#[btf_map(name = "masq_alloc_request")]
pub(crate) static ALLOC_REQUEST: PerCpuArray<AllocRequestV4, 1> = PerCpuArray::new();

/// Non-masquerade IPv6 destinations, as [`NOMASQ_V4`] for IPv4 (link-local `fe80::/10` among
/// them unless `masqLinkLocalIPv6`). Written by the agent, read by the IPv6 egress program.
#[btf_map(name = "masq_nomasq_v6")]
pub(crate) static NOMASQ_V6: LpmTrie<[u8; 16], u32, { NOMASQ_V4_MAX_ENTRIES as usize }> =
    LpmTrie::new();

/// Both halves of every translated IPv6 flow, as [`NAT_V4`] for IPv4. The agent sizes it at
/// load time: as the IPv4 table with `--enable-ipv6`, one entry without.
#[btf_map(name = "masq_nat_v6")]
pub(crate) static NAT_V6: NatTable<V6> = NatTable::new();

/// Translation decided for the first fragment of each fragmented IPv6 datagram, as
/// [`FRAGS_V4`] for IPv4.
#[btf_map(name = "masq_frags_v6")]
pub(crate) static FRAGS_V6: LruHashMap<
    FragKey<V6>,
    FragEntry<V6>,
    { FRAGS_V4_MAX_ENTRIES as usize },
> = LruHashMap::new();

/// Per-CPU counters of IPv6 packets, indexed like [`COUNTERS`]. Incremented by the IPv6
/// programs; summed by the agent for metrics (label `family="ipv6"`).
#[btf_map(name = "masq_counters_v6")]
pub(crate) static COUNTERS_V6: PerCpuArray<u64, { COUNTER_COUNT as usize }> = PerCpuArray::new();

/// The shared-counters benchmark variant's [`COUNTERS`]: one copy for all CPUs, added to
/// atomically. Only the benchmark reads it.
#[cfg(feature = "variant-shared-counters")]
#[btf_map(name = "masq_shared_counters")]
pub(crate) static SHARED_COUNTERS: Array<u64, { COUNTER_COUNT as usize }> = Array::new();

/// The shared-counters benchmark variant's [`COUNTERS_V6`].
#[cfg(feature = "variant-shared-counters")]
#[btf_map(name = "masq_shared_counters_v6")]
pub(crate) static SHARED_COUNTERS_V6: Array<u64, { COUNTER_COUNT as usize }> = Array::new();

/// The shared-counters benchmark variant's [`ALLOC_RETRIES`].
#[cfg(feature = "variant-shared-counters")]
#[btf_map(name = "masq_shared_retries")]
pub(crate) static SHARED_RETRIES: Array<u64, { ALLOC_HISTOGRAM_BUCKETS as usize }> = Array::new();

/// The IPv6 egress program's hand-over to the IPv6 allocator, as [`ALLOC_REQUEST`].
#[btf_map(name = "masq_alloc_request_v6")]
pub(crate) static ALLOC_REQUEST_V6: PerCpuArray<AllocRequest<V6>, 1> = PerCpuArray::new();

/// What the IPv6 extension-header walk found, per CPU: the walk's results pass through it
/// (see `packet::parse_ipv6`), so that the verifier meets the rest of an IPv6 program once,
/// not once for each number and kind of extension headers. Written and read back by the IPv6
/// programs within one run; not pinned, private to each load.
#[btf_map(name = "masq_walk_v6")]
pub(crate) static WALK_V6: PerCpuArray<crate::packet::Walked, 1> = PerCpuArray::new();

/// The last IPv4 flows created, the candidates for eviction when the NAT table is full (see
/// `evict`). Written by the allocator and the ingress program's inbound tracking, read by the
/// allocator; not pinned: a new program starts with an empty ring.
#[btf_map(name = "masq_young_v4")]
pub(crate) static YOUNG_V4: crate::evict::YoungFlowsMap<[u8; 4]> = Array::new();

/// [`YOUNG_V4`] for IPv6.
#[btf_map(name = "masq_young_v6")]
pub(crate) static YOUNG_V6: crate::evict::YoungFlowsMap<V6> = Array::new();

/// The type of the tables of removed TCP flows (see [`EXPIRED_V4`]).
pub(crate) type ExpiredFlows<A> =
    LruHashMap<NatKey<A>, NatEntry<A>, { EXPIRED_MAX_ENTRIES as usize }>;

/// Egress halves of TCP flows the agent removed (expired while idle, or bound to an address the
/// uplink lost), by egress key. Written by the agent's garbage collector and address follower;
/// read and removed by the egress program when a segment of such a flow comes without a
/// mapping (see `nat::revive`). An LRU: the flows removed last are kept. Not pinned.
#[btf_map(name = "masq_expired_v4")]
pub(crate) static EXPIRED_V4: ExpiredFlows<[u8; 4]> = LruHashMap::new();

/// [`EXPIRED_V4`] for IPv6.
#[btf_map(name = "masq_expired_v6")]
pub(crate) static EXPIRED_V6: ExpiredFlows<V6> = LruHashMap::new();

/// The settings in force, or `None` before the agent configured the datapath.
#[inline(always)]
pub(crate) fn settings() -> Option<&'static Settings> {
    SETTINGS.get(0).filter(|settings| settings.enabled())
}

/// Where the IP header starts in a frame on the packet's device: after the Ethernet header,
/// or at once on an uplink without a link-layer header (`LINK_IP`: tun, WireGuard, IP tunnels).
///
/// Computed rather than chosen by a branch, from a value read out of a map: the verifier then
/// knows the offset only as 0 or 14 and meets the rest of the program once, not once per kind
/// of link.
#[inline(always)]
pub(crate) fn ip_offset(ctx: &TcContext) -> usize {
    // SAFETY: as in `snat_addr`.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let link = if ifindex < UPLINK_INDEX_SLOTS {
        UPLINK_SLOTS
            .get(ifindex)
            .map_or(LINK_ETHERNET, |slot| slot.link)
    } else {
        // SAFETY: the entry is read at once; the agent replaces entries whole.
        UPLINKS
            .get_ptr(ifindex)
            .map_or(LINK_ETHERNET, |uplink| unsafe { (*uplink).link })
    };
    usize::from((link & LINK_IP) ^ LINK_IP) * crate::packet::ETH_HLEN
}

/// The address of family `A` masqueraded traffic on the packet's device gets, or `None` when
/// masq does not translate that family on that device.
#[inline(always)]
pub(crate) fn snat_addr<A: Family>(ctx: &TcContext) -> Option<A> {
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
