//! The maps: those shared by the programs and the agent, pinned by the agent under its pin path
//! so a restarted agent adopts them (names and layouts from `masq_common::layout`), and the
//! per-CPU scratch slots private to each load. With the settings and where a frame's IP header
//! starts, read from them. The bottom floor of map access: only the address and header types
//! are below it.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray},
    macros::btf_map,
    programs::TcContext,
};
use masq_common::{
    counters::{ALLOC_HISTOGRAM_BUCKETS, COUNTER_COUNT},
    flow::EVICTION_SLOTS,
    layout::{
        BURIED_MAX_ENTRIES, FRAGS_V4_MAX_ENTRIES, HOLDERS_MAX_ENTRIES, LINK_ETHERNET, LINK_IP,
        MapMeta, NAT_V4_DEFAULT_MAX_ENTRIES, NOMASQ_SRC_MAX_ENTRIES, NOMASQ_V4_MAX_ENTRIES,
        PROG_SLOTS, REMOTE_HOLDERS_MAX_ENTRIES, UPLINK_INDEX_SLOTS, UPLINKS_MAX_ENTRIES, Uplink,
        UplinkSlot,
    },
    nat::{
        FragEntry, FragEntryV4, FragKey, FragKeyV4, Handoff, Holder, NatEntry, NatKey, RemoteHolder,
    },
    settings::Settings,
};

use crate::{address::V6, header::ETH_HLEN};

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

/// A family's packet counters, one slot per `Counter` (see [`COUNTERS`]).
pub(crate) type PacketCounters = PerCpuArray<u64, { COUNTER_COUNT as usize }>;
/// A family's eviction counters, one slot per cause and class (see [`EVICTIONS`]).
pub(crate) type EvictionCounters = PerCpuArray<u64, { EVICTION_SLOTS as usize }>;

/// The fragment tables' type (see [`FRAGS_V4`]).
pub(crate) type Frags<A> = LruHashMap<FragKey<A>, FragEntry<A>, { FRAGS_V4_MAX_ENTRIES as usize }>;

/// The NAT tables' type: a plain, preallocated hash, so that a full table refuses new flows
/// rather than evicting live ones (see [`NAT_V4`]). The capacity is as declared; the agent sets
/// the real one at load time.
pub(crate) type NatTable<A> =
    HashMap<NatKey<A>, NatEntry<A>, { NAT_V4_DEFAULT_MAX_ENTRIES as usize }>;

/// Both halves of every translated flow (see `masq_common::nat`). Written by the programs (new
/// mappings, the flow's state as its packets move it, each direction's window, last-seen
/// refreshes at most once a second); expired flows are removed by the agent's garbage
/// collector. A plain, preallocated hash: when it is full a new flow takes the place of an
/// unassured one (see `evict`), or is refused and counted; an assured flow is never evicted.
/// The agent sizes it at load time (`--nat-max-entries`).
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
pub(crate) static COUNTERS: PacketCounters = PerCpuArray::new();

/// Per-CPU histogram of how many ports new flows tried before one was free; the last bucket
/// counts flows that found none. Incremented by the egress program; read by the agent.
#[btf_map(name = "masq_retries")]
pub(crate) static ALLOC_RETRIES: PerCpuArray<u64, { ALLOC_HISTOGRAM_BUCKETS as usize }> =
    PerCpuArray::new();

/// Per-CPU counters of IPv4 evictions, by cause and class (`flow::eviction_slot`). Incremented
/// by the programs when a flow makes room for another; summed by the agent for metrics and
/// `masq status` (its own garbage collector's evictions it counts itself).
#[btf_map(name = "masq_evictions")]
pub(crate) static EVICTIONS: EvictionCounters = PerCpuArray::new();

/// [`EVICTIONS`] for IPv6.
#[btf_map(name = "masq_evictions_v6")]
pub(crate) static EVICTIONS_V6: EvictionCounters = PerCpuArray::new();

/// The programs the attached ones tail-call, by `PROG_SLOT_*`: the IPv6 programs, the flow-event
/// program, the allocator, the rewrites. Written by the agent right after it loads the programs
/// (before it attaches them), so a packet never finds a slot empty; pinned, because the kernel
/// empties a program array once no file descriptor or pin refers to it, and the attached
/// programs outlive the agent.
#[btf_map(name = "masq_progs")]
pub(crate) static PROGS: ProgramArray<{ PROG_SLOTS as usize }> = ProgramArray::new();

/// What passes, per CPU, between the programs one packet runs through when the fast path hands
/// it on (see `Handoff`): the request the egress or ingress program writes before its tail
/// call, the allocator's search, the mapping the packet is rewritten with. Pinned with the
/// program array so that during an upgrade an old program and a new one it tail-calls share it.
#[btf_map(name = "masq_handoff")]
pub(crate) static HANDOFF: PerCpuArray<Handoff<[u8; 4]>, 1> = PerCpuArray::new();

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
pub(crate) static COUNTERS_V6: PacketCounters = PerCpuArray::new();

/// The IPv6 programs' [`HANDOFF`].
#[btf_map(name = "masq_handoff_v6")]
pub(crate) static HANDOFF_V6: PerCpuArray<Handoff<V6>, 1> = PerCpuArray::new();

/// What the IPv6 extension-header walk found (see `packet::parse_ipv6`), as [`WALK_V6`] holds
/// it. The fields are narrow on purpose: the transport offset is a `u16`, which bounds it as
/// packet access needs.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Walked {
    pub(crate) l4_len: u32,
    pub(crate) id: u32,
    pub(crate) l4_off: u16,
    pub(crate) fragment_offset: u16,
    pub(crate) protocol: u8,
    pub(crate) more_fragments: u8,
    pub(crate) pad: [u8; 2],
}

/// What the IPv6 extension-header walk found, per CPU: the walk's results pass through it
/// (see `packet::parse_ipv6`), so that the verifier meets the rest of an IPv6 program once,
/// not once for each number and kind of extension headers. Written and read back by the IPv6
/// programs within one run; not pinned, private to each load.
#[btf_map(name = "masq_walk_v6")]
pub(crate) static WALK_V6: PerCpuArray<Walked, 1> = PerCpuArray::new();

/// The layout of [`FORGET`]'s slot.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Forgotten {
    pub(crate) word: u32,
}

/// Values the programs store and read back within one run so that the verifier knows them only
/// by their width (see `forget`). Per CPU, private to each load, not pinned.
#[btf_map(name = "masq_forget")]
pub(crate) static FORGET: PerCpuArray<Forgotten, 1> = PerCpuArray::new();

/// The egress keys of IPv4 flows: what eviction samples (see `evict`). Written by the programs
/// that create flows, each into the slot of the flow it evicted or else the next slot of
/// [`FLOW_CURSOR`]'s round; read by the programs that make room for a new flow. A slot whose
/// flow is gone costs a sample. Sized by the agent at load time to the table's flows.
#[btf_map(name = "masq_flow_index_v4")]
pub(crate) static FLOW_INDEX_V4: FlowIndex<[u8; 4]> = Array::new();

/// [`FLOW_INDEX_V4`] for IPv6.
#[btf_map(name = "masq_flow_index_v6")]
pub(crate) static FLOW_INDEX_V6: FlowIndex<V6> = Array::new();

/// Where each family's flow index is written next (IPv4's cursor, then IPv6's), for a new flow
/// that evicted none: counted up atomically by the programs that create flows. Pinned with
/// the index it walks.
#[btf_map(name = "masq_flow_cursor")]
pub(crate) static FLOW_CURSOR: Array<u64, 2> = Array::new();

/// The type of the flow indexes (see [`FLOW_INDEX_V4`]); the agent sets the real capacity.
pub(crate) type FlowIndex<A> = Array<NatKey<A>, { NAT_V4_DEFAULT_MAX_ENTRIES as usize / 2 }>;

/// How many unassured IPv4 flows each local address holds (see `masq_common::nat::Holder`).
/// Added to atomically by the programs as flows are created, assured and evicted; corrected by
/// the agent's garbage collector on every pass. An LRU: a node has far fewer local addresses
/// than it holds, so nothing live is pushed out.
#[btf_map(name = "masq_holders_v4")]
pub(crate) static HOLDERS_V4: Holders<[u8; 4]> = LruHashMap::new();

/// [`HOLDERS_V4`] for IPv6.
#[btf_map(name = "masq_holders_v6")]
pub(crate) static HOLDERS_V6: Holders<V6> = LruHashMap::new();

/// How many node ports each pod's flows use towards each busy remote endpoint (see
/// `masq_common::nat::RemoteHolder`): written by the agent's garbage collector for the remotes
/// more than half of whose ports are in use; read, and its counts moved atomically, by the
/// allocator when a pod finds no port towards such a remote (see `evict::take_from_busier`).
#[btf_map(name = "masq_remote_holders_v4")]
pub(crate) static REMOTE_HOLDERS_V4: RemoteHolders<[u8; 4]> = HashMap::new();

/// [`REMOTE_HOLDERS_V4`] for IPv6.
#[btf_map(name = "masq_remote_holders_v6")]
pub(crate) static REMOTE_HOLDERS_V6: RemoteHolders<V6> = HashMap::new();

/// The type of the remote-holders tables (see [`REMOTE_HOLDERS_V4`]).
pub(crate) type RemoteHolders<A> =
    HashMap<RemoteHolder<A>, u64, { REMOTE_HOLDERS_MAX_ENTRIES as usize }>;

/// The type of the holders tables (see [`HOLDERS_V4`]).
pub(crate) type Holders<A> = LruHashMap<A, Holder, { HOLDERS_MAX_ENTRIES as usize }>;

/// The type of the tables of removed TCP flows (see [`BURIED_V4`]).
pub(crate) type Buried<A> = LruHashMap<NatKey<A>, NatEntry<A>, { BURIED_MAX_ENTRIES as usize }>;

/// Both halves of the TCP flows the agent removed (expired while idle, or bound to an address
/// the uplink lost), each by its own key. Written by the agent's garbage collector and address
/// follower before they remove a flow; read and removed by the programs when a segment of
/// such a flow comes without a mapping, from either end (see `nat::revive`), and forgotten
/// when a new connection takes the tuple. An LRU: the flows removed last are kept.
#[btf_map(name = "masq_buried_v4")]
pub(crate) static BURIED_V4: Buried<[u8; 4]> = LruHashMap::new();

/// [`BURIED_V4`] for IPv6.
#[btf_map(name = "masq_buried_v6")]
pub(crate) static BURIED_V6: Buried<V6> = LruHashMap::new();

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
    // SAFETY: `skb` points at the context the kernel passed to the program; `ifindex` is a
    // plain field the verifier lets a classifier read.
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
    usize::from((link & LINK_IP) ^ LINK_IP) * ETH_HLEN
}
