//! Names and layout identity of the maps that are pinned under bpffs.
//!
//! A running agent pins its maps so that a restart or an upgrade adopts the live state instead of
//! breaking flows. Adopting a map whose layout differs from what the new programs expect would
//! corrupt state silently, so every pinned map set carries [`MAP_LAYOUT_VERSION`] in its metadata
//! map and the agent refuses to adopt anything else.

use crate::ports::PortRange;

/// Version of the pinned map layout. Bump it whenever a shared struct, a map type, or the meaning
/// of a stored value changes; the agent then refuses to adopt old pins instead of misreading them.
pub const MAP_LAYOUT_VERSION: u32 = 6;

/// Longest-prefix-match trie of IPv4 destinations that keep their source address.
pub const MAP_NOMASQ_V4: &str = "masq_nomasq_v4";
/// Single-entry array holding the datapath [`crate::settings::Settings`].
pub const MAP_SETTINGS: &str = "masq_settings";
/// Hash holding both halves of every IPv4 translation.
pub const MAP_NAT_V4: &str = "masq_nat_v4";
/// LRU hash remembering how the first fragment of a datagram was translated.
pub const MAP_FRAGS_V4: &str = "masq_frags_v4";
/// Per-CPU array of packet counters, indexed by [`crate::counters::Counter`].
pub const MAP_COUNTERS: &str = "masq_counters";
/// Per-CPU array histogram of port allocation attempts.
pub const MAP_ALLOC_RETRIES: &str = "masq_retries";
/// Single-entry array describing the layout of the pinned map set.
pub const MAP_META: &str = "masq_meta";
/// Hash of the interfaces masq translates on, by interface index: see [`Uplink`].
pub const MAP_UPLINKS: &str = "masq_uplinks";
/// Array of the uplinks whose interface index is below [`UPLINK_INDEX_SLOTS`], at that index:
/// see [`UplinkSlot`].
pub const MAP_UPLINK_SLOTS: &str = "masq_uplink_slots";

/// Program array the egress program tail-calls into: see [`PROG_SLOT_ALLOCATOR`].
pub const MAP_PROGS: &str = "masq_progs";
/// Per-CPU single-entry array handing a [`crate::nat::Handoff`] from one program of a packet's
/// tail calls to the next.
pub const MAP_HANDOFF: &str = "masq_handoff";
/// Longest-prefix-match trie of IPv6 destinations that keep their source address.
pub const MAP_NOMASQ_V6: &str = "masq_nomasq_v6";
/// Hash holding both halves of every IPv6 translation.
pub const MAP_NAT_V6: &str = "masq_nat_v6";
/// Per-CPU array of IPv6 packet counters, indexed by [`crate::counters::Counter`] like
/// [`MAP_COUNTERS`], which counts IPv4 (and frames of neither family).
pub const MAP_COUNTERS_V6: &str = "masq_counters_v6";
/// LRU hash remembering how the first fragment of an IPv6 datagram was translated.
pub const MAP_FRAGS_V6: &str = "masq_frags_v6";
/// The IPv6 programs' [`MAP_HANDOFF`].
pub const MAP_HANDOFF_V6: &str = "masq_handoff_v6";

/// LRU hash of both halves of the IPv4 TCP flows the agent removed (expired, or bound to an
/// address their uplink lost), by their own keys: what lets a late segment of such a flow, from
/// either end, get its mapping back instead of leaving with the pod's address or reaching the
/// node's stack.
pub const MAP_BURIED_V4: &str = "masq_buried_v4";
/// [`MAP_BURIED_V4`] for IPv6.
pub const MAP_BURIED_V6: &str = "masq_buried_v6";
/// Capacity of each of [`MAP_BURIED_V4`] and [`MAP_BURIED_V6`], in halves: the flows removed
/// most recently are the ones whose segments may still come.
pub const BURIED_MAX_ENTRIES: u32 = 65_536;

/// LRU hash of how many unassured IPv4 flows each local address (a pod's, the node's) holds:
/// see [`crate::nat::Holder`].
pub const MAP_HOLDERS_V4: &str = "masq_holders_v4";
/// [`MAP_HOLDERS_V4`] for IPv6.
pub const MAP_HOLDERS_V6: &str = "masq_holders_v6";
/// Capacity of each holders table: far more local addresses than a node has pods.
pub const HOLDERS_MAX_ENTRIES: u32 = 16_384;

/// Array of IPv4 flows' egress keys: what eviction samples to find a victim anywhere in the
/// table, as conntrack's `early_drop` does. A new flow takes the slot of the flow it evicted,
/// or else the next slot of [`MAP_FLOW_CURSOR`]'s round; a slot whose flow is gone is only a
/// wasted sample. Sized at load time to the table's flows (half its entries).
pub const MAP_FLOW_INDEX_V4: &str = "masq_flow_index_v4";
/// [`MAP_FLOW_INDEX_V4`] for IPv6.
pub const MAP_FLOW_INDEX_V6: &str = "masq_flow_index_v6";

/// Hash of how many node ports each pod's flows use towards each remote endpoint (see
/// `nat::RemoteHolder`), for the remote endpoints more than half of whose ports are in use.
/// Written by the agent's garbage collector on every pass; the allocator reads it when a pod
/// finds no port left towards such a remote, and takes one from a pod that holds more (see
/// `evict`), adjusting the two counts.
pub const MAP_REMOTE_HOLDERS_V4: &str = "masq_remote_holders_v4";
/// [`MAP_REMOTE_HOLDERS_V4`] for IPv6.
pub const MAP_REMOTE_HOLDERS_V6: &str = "masq_remote_holders_v6";
/// Capacity of each remote-holders table: pods times busy remotes, far more than a node sees.
pub const REMOTE_HOLDERS_MAX_ENTRIES: u32 = 16_384;

/// Array of two `u64` cursors, IPv4's then IPv6's: the slot of the flow index the next new
/// flow takes when it evicted none, counted up by the programs (modulo the index's slots).
/// Slots are taken in turn, so that the index holds the table's newest flows, each once.
pub const MAP_FLOW_CURSOR: &str = "masq_flow_cursor";

/// The slots of a flow index for a NAT table of `nat_entries` entries: one per flow the table
/// holds (two entries each), and at least one.
pub const fn flow_slots(nat_entries: u32) -> u32 {
    if nat_entries < 2 { 1 } else { nat_entries / 2 }
}

/// Per-CPU array counting IPv4 evictions by cause and class (`flow::eviction_slot`).
pub const MAP_EVICTIONS: &str = "masq_evictions";
/// [`MAP_EVICTIONS`] for IPv6.
pub const MAP_EVICTIONS_V6: &str = "masq_evictions_v6";

/// Longest-prefix-match trie of IPv4 pod sources never masqueraded, whatever the destination
/// (`nonMasqueradeSrcCIDRs`), value [`NOMASQ_KIND_SOURCE`]. Written by the agent from the
/// config; read by the egress program only while the settings carry
/// [`crate::settings::SETTING_SOURCE_EXEMPTIONS`].
pub const MAP_NOMASQ_SRC_V4: &str = "masq_nomasq_src_v4";
/// [`MAP_NOMASQ_SRC_V4`] for IPv6 pod sources.
pub const MAP_NOMASQ_SRC_V6: &str = "masq_nomasq_src_v6";
/// Capacity of each of [`MAP_NOMASQ_SRC_V4`] and [`MAP_NOMASQ_SRC_V6`]. LPM tries allocate
/// per entry (no preallocation), so the room costs nothing until it is used.
pub const NOMASQ_SRC_MAX_ENTRIES: u32 = 16_384;

/// Every map the datapath defines and the agent pins, in the order the agent pins and reports
/// them.
pub const ALL_MAPS: [&str; 29] = [
    MAP_META,
    MAP_SETTINGS,
    MAP_UPLINKS,
    MAP_UPLINK_SLOTS,
    MAP_NOMASQ_V4,
    MAP_NAT_V4,
    MAP_FRAGS_V4,
    MAP_COUNTERS,
    MAP_ALLOC_RETRIES,
    MAP_PROGS,
    MAP_HANDOFF,
    MAP_NOMASQ_V6,
    MAP_NAT_V6,
    MAP_COUNTERS_V6,
    MAP_HANDOFF_V6,
    MAP_FRAGS_V6,
    MAP_NOMASQ_SRC_V4,
    MAP_NOMASQ_SRC_V6,
    MAP_BURIED_V4,
    MAP_BURIED_V6,
    MAP_HOLDERS_V4,
    MAP_HOLDERS_V6,
    MAP_FLOW_INDEX_V4,
    MAP_FLOW_INDEX_V6,
    MAP_FLOW_CURSOR,
    MAP_REMOTE_HOLDERS_V4,
    MAP_REMOTE_HOLDERS_V6,
    MAP_EVICTIONS,
    MAP_EVICTIONS_V6,
];

/// Name of the TC egress program.
pub const PROG_EGRESS: &str = "masq_egress";
/// Name of the TC ingress program.
pub const PROG_INGRESS: &str = "masq_ingress";
/// Name of the port allocator: a classifier that is never attached, only tail-called for a
/// packet that needs a new mapping.
pub const PROG_ALLOCATOR: &str = "masq_allocator";
/// Name of the classifier that rewrites a leaving packet's source with the mapping in the
/// hand-off (one the allocator just created, or one a flow event settled); tail-called, never
/// attached.
pub const PROG_SOURCE_NAT: &str = "masq_source_nat";
/// Name of the classifier that rewrites an arriving packet's destination with the mapping in
/// the hand-off; tail-called by the flow-event program.
pub const PROG_REVERSE_NAT: &str = "masq_reverse_nat";
/// Name of the classifier that handles a packet the fast path leaves to it (see
/// `nat::EVENT_*`): one that moves its flow's state, one whose flow may come back from the
/// buried, a datagram from outside opening a flow towards a pod. Tail-called by the egress and
/// ingress programs, never attached: what is rare stays out of the programs every packet runs,
/// whose stack and verification it would crowd.
pub const PROG_FLOW_EVENT: &str = "masq_flow_event";
/// Slot of [`MAP_PROGS`] holding [`PROG_ALLOCATOR`]. The port search is a program of its own,
/// and the packet rewrite after it another, so the verifier checks the search once, from one
/// entry state, instead of once per path into it, and the rewrite once instead of once per
/// port the search may stop at: that is what lets the search try as many ports as the
/// kernel's.
pub const PROG_SLOT_ALLOCATOR: u32 = 0;
/// Slot of [`MAP_PROGS`] holding [`PROG_SOURCE_NAT`].
pub const PROG_SLOT_SOURCE_NAT: u32 = 1;
/// Name of the IPv6 egress classifier, tail-called by [`PROG_EGRESS`] for IPv6 frames: one
/// program per family keeps each one's verification apart.
pub const PROG_EGRESS_V6: &str = "masq_egress6";
/// Name of the IPv6 ingress classifier, tail-called by [`PROG_INGRESS`] for IPv6 frames.
pub const PROG_INGRESS_V6: &str = "masq_ingress6";
/// Name of the IPv6 [`PROG_ALLOCATOR`].
pub const PROG_ALLOCATOR_V6: &str = "masq_allocator6";
/// Name of the IPv6 [`PROG_SOURCE_NAT`].
pub const PROG_SOURCE_NAT_V6: &str = "masq_source_nat6";
/// Name of the IPv6 [`PROG_REVERSE_NAT`].
pub const PROG_REVERSE_NAT_V6: &str = "masq_reverse_nat6";
/// Name of the IPv6 [`PROG_FLOW_EVENT`].
pub const PROG_FLOW_EVENT_V6: &str = "masq_flow_event6";
/// Slot of [`MAP_PROGS`] holding [`PROG_ALLOCATOR_V6`].
pub const PROG_SLOT_ALLOCATOR_V6: u32 = 2;
/// Slot of [`MAP_PROGS`] holding [`PROG_SOURCE_NAT_V6`].
pub const PROG_SLOT_SOURCE_NAT_V6: u32 = 3;
/// Slot of [`MAP_PROGS`] holding [`PROG_EGRESS_V6`].
pub const PROG_SLOT_EGRESS_V6: u32 = 4;
/// Slot of [`MAP_PROGS`] holding [`PROG_INGRESS_V6`].
pub const PROG_SLOT_INGRESS_V6: u32 = 5;
/// Name of the program that translates ICMPv6 errors leaving by an uplink, tail-called by
/// [`PROG_EGRESS_V6`]: the quote's translation on top of the IPv6 egress path would not fit one
/// program's stack.
pub const PROG_ICMP_ERROR_EGRESS_V6: &str = "masq_icmp6_egress";
/// Name of the program that translates ICMPv6 errors arriving on an uplink, tail-called by
/// [`PROG_INGRESS_V6`].
pub const PROG_ICMP_ERROR_INGRESS_V6: &str = "masq_icmp6_ingress";
/// Slot of [`MAP_PROGS`] holding [`PROG_ICMP_ERROR_EGRESS_V6`].
pub const PROG_SLOT_ICMP_ERROR_EGRESS_V6: u32 = 6;
/// Slot of [`MAP_PROGS`] holding [`PROG_ICMP_ERROR_INGRESS_V6`].
pub const PROG_SLOT_ICMP_ERROR_INGRESS_V6: u32 = 7;
/// Slot of [`MAP_PROGS`] holding [`PROG_FLOW_EVENT`].
pub const PROG_SLOT_FLOW_EVENT: u32 = 8;
/// Slot of [`MAP_PROGS`] holding [`PROG_FLOW_EVENT_V6`].
pub const PROG_SLOT_FLOW_EVENT_V6: u32 = 9;
/// Slot of [`MAP_PROGS`] holding [`PROG_REVERSE_NAT`].
pub const PROG_SLOT_REVERSE_NAT: u32 = 10;
/// Slot of [`MAP_PROGS`] holding [`PROG_REVERSE_NAT_V6`].
pub const PROG_SLOT_REVERSE_NAT_V6: u32 = 11;
/// Name of the classifier a pod's new flow goes to when its port search found no port: it
/// takes one from a pod holding more of the remote's ports, if one does (see the datapath's
/// `evict::take_from_busier`), and hands the flow back to the allocator. Tail-called by the
/// allocator: a program of its own for its stack, which the IPv6 allocator's would not hold.
pub const PROG_PORT_SHARE: &str = "masq_port_share";
/// Name of the IPv6 [`PROG_PORT_SHARE`].
pub const PROG_PORT_SHARE_V6: &str = "masq_port_share6";
/// Slot of [`MAP_PROGS`] holding [`PROG_PORT_SHARE`].
pub const PROG_SLOT_PORT_SHARE: u32 = 12;
/// Slot of [`MAP_PROGS`] holding [`PROG_PORT_SHARE_V6`].
pub const PROG_SLOT_PORT_SHARE_V6: u32 = 13;
/// Slots of [`MAP_PROGS`].
pub const PROG_SLOTS: u32 = 14;

/// Default capacity of the IPv4 LPM trie. Upstream limits a config to 64 CIDRs by default; the
/// trie is sized for configs that raise `cidrLimit` into the thousands.
pub const NOMASQ_V4_MAX_ENTRIES: u32 = 16_384;
/// Default capacity of the NAT table in entries; every flow uses two (one per direction).
pub const NAT_V4_DEFAULT_MAX_ENTRIES: u32 = 262_144;
/// Capacity of the IPv6 NAT table and trie when IPv6 is not translated: the maps exist (the
/// programs refer to them) but hold nothing, and cost next to no memory.
pub const IPV6_DISABLED_ENTRIES: u32 = 1;
/// Most interfaces masq translates on at once.
pub const UPLINKS_MAX_ENTRIES: u32 = 64;
/// Interface indexes below this have their uplink's address in [`MAP_UPLINK_SLOTS`] too. Network
/// devices a node boots with get small indexes; later ones (a pod's veth each) climb past any
/// bound, so larger indexes are looked up in the hash.
pub const UPLINK_INDEX_SLOTS: u32 = 4096;
/// Capacity of the fragment table. Entries live only while a fragmented datagram is in flight.
pub const FRAGS_V4_MAX_ENTRIES: u32 = 8_192;

/// Value of a non-masquerade trie entry: a CIDR from the config.
pub const NOMASQ_KIND_CIDR: u32 = 1;
/// Value of a non-masquerade trie entry: link-local, exempt because `masqLinkLocal` is false.
pub const NOMASQ_KIND_LINK_LOCAL: u32 = 2;
/// Value of a destination trie entry from `masqueradeCIDRs`: when it is the longest matching
/// prefix, the destination is masqueraded even inside a non-masquerade range. The programs
/// treat it exactly as no match at all; an agent that predates it never writes it, and programs
/// that predate it read it as exempt only while an upgrade swaps them out.
pub const NOMASQ_KIND_MASQUERADE: u32 = 3;
/// Value of a [`MAP_NOMASQ_SRC_V4`] or [`MAP_NOMASQ_SRC_V6`] entry: a `nonMasqueradeSrcCIDRs`
/// network.
pub const NOMASQ_KIND_SOURCE: u32 = 4;

/// Most port ranges the metadata can record as reserved by masq.
pub const MAX_RESERVED_RANGES: usize = 16;

/// Contents of the metadata map: which layout the pinned maps were created with, and the
/// node-level state masq changed, so that `masq uninstall` can undo exactly that.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapMeta {
    /// [`MAP_LAYOUT_VERSION`] of the agent that created the maps.
    pub layout_version: u32,
    /// Capacity the NAT table was created with, so a restart can tell a resize from a match.
    pub nat_max_entries: u32,
    /// Number of valid entries in `reserved`.
    pub reserved_count: u32,
    /// Keeps the layout free of implicit padding; always zero.
    pub pad: u32,
    /// Port ranges masq added to `net.ipv4.ip_local_reserved_ports` (not the ones that were
    /// reserved already).
    pub reserved: [PortRange; MAX_RESERVED_RANGES],
}

impl MapMeta {
    /// Metadata of a map set created by this version, with nothing reserved yet.
    pub const fn current(nat_max_entries: u32) -> Self {
        Self {
            layout_version: MAP_LAYOUT_VERSION,
            nat_max_entries,
            reserved_count: 0,
            pad: 0,
            reserved: [PortRange::EMPTY; MAX_RESERVED_RANGES],
        }
    }

    /// The ranges masq reserved.
    pub fn reserved(&self) -> &[PortRange] {
        let count = (self.reserved_count as usize).min(MAX_RESERVED_RANGES);
        self.reserved.get(..count).unwrap_or(&[])
    }
}

crate::impl_pod!(MapMeta);

/// [`Uplink::attach_mode`]: the programs hang on the interface through pinned tcx links.
pub const ATTACH_TCX: u8 = 1;
/// [`Uplink::attach_mode`]: the programs are direct-action cls_bpf filters on a clsact qdisc.
pub const ATTACH_TC: u8 = 2;

/// Longest interface name the kernel accepts, with its terminating NUL (`IFNAMSIZ`).
pub const IFNAME_SIZE: usize = 16;

/// Value of the uplinks map: one interface traffic leaves the node by, keyed by its index.
///
/// Written by the agent. The programs read only the addresses (`snat_addr`, `has_v6`,
/// `snat_addr_v6`); the rest is the agent's record of how it attached, so a restarted agent,
/// `masq status` and `masq uninstall` know exactly what masq added to the interface and nothing
/// else.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Uplink {
    /// Address masqueraded traffic leaving by this interface gets (network byte order), as
    /// MASQUERADE takes the outgoing interface's address. Zero when the interface has no IPv4
    /// address (an IPv6-only uplink): IPv4 traffic that would be masqueraded leaving by it is
    /// dropped and counted (`egress_drop_no_address`), as MASQUERADE drops it.
    pub snat_addr: [u8; 4],
    /// [`ATTACH_TCX`] or [`ATTACH_TC`].
    pub attach_mode: u8,
    /// 1 when masq created the interface's clsact qdisc (tc mode), so uninstall may remove it.
    pub created_clsact: u8,
    /// 1 when IPv6 is translated on this interface, to `snat_addr_v6`.
    pub has_v6: u8,
    /// What the interface's frames start with: [`LINK_ETHERNET`] or [`LINK_IP`]. (Padding,
    /// always zero, before masq translated on other links: old records read as Ethernet.)
    pub link: u8,
    /// The interface's name when masq attached, NUL-padded.
    pub ifname: [u8; IFNAME_SIZE],
    /// The global IPv6 address masqueraded IPv6 traffic leaving by this interface gets.
    pub snat_addr_v6: [u8; 16],
    /// The IPv4 address the interface masqueraded to before `snat_addr`, while it is still one
    /// of the interface's addresses: the flows mapped to it live on (their replies are
    /// restored, the node's own packets from it are the node's), as MASQUERADE forgets a flow
    /// only when its address is removed. Zero when there is none.
    pub former_addr: [u8; 4],
    /// As `former_addr`, for IPv6 (the unspecified address when there is none): the kernel
    /// changes its preferred IPv6 source routinely (SLAAC renumbering, temporary addresses),
    /// leaving the old one on the interface, deprecated.
    pub former_addr_v6: [u8; 16],
}

/// [`Uplink::link`] of an Ethernet device (veth, NICs, bridges, bonds, VLANs): frames start
/// with a 14-byte Ethernet header.
pub const LINK_ETHERNET: u8 = 0;
/// [`Uplink::link`] of a device without a link-layer header (tun, WireGuard, IPIP and SIT
/// tunnels, raw-IP cloud interfaces): frames start with the IP header, and the family is the
/// skb's protocol.
pub const LINK_IP: u8 = 1;

/// What the programs need of an uplink, at its interface index in an array, so that finding it
/// costs a bounds check and a load: the kernel inlines array lookups, where a hash lookup is
/// calls into the kernel, which mitigations against return-stack attacks make dear on every
/// packet. Written by the agent together with the [`Uplink`] record (slot last on attach,
/// first on detach); an empty slot means masq does not translate on that interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UplinkSlot {
    /// As [`Uplink::snat_addr`].
    pub snat_addr: [u8; 4],
    /// 1 when the slot holds an uplink.
    pub present: u8,
    /// 1 when IPv6 is translated on this uplink, to `snat_addr_v6`.
    pub has_v6: u8,
    /// As [`Uplink::link`].
    pub link: u8,
    /// Keeps the layout free of implicit padding; always zero.
    pub pad: u8,
    /// The global IPv6 address masqueraded IPv6 traffic leaving by this uplink gets.
    pub snat_addr_v6: [u8; 16],
    /// As [`Uplink::former_addr`].
    pub former_addr: [u8; 4],
    /// As [`Uplink::former_addr_v6`].
    pub former_addr_v6: [u8; 16],
}

impl UplinkSlot {
    /// The slot of `uplink`.
    pub const fn of(uplink: &Uplink) -> Self {
        Self {
            snat_addr: uplink.snat_addr,
            present: 1,
            has_v6: uplink.has_v6,
            link: uplink.link,
            pad: 0,
            snat_addr_v6: uplink.snat_addr_v6,
            former_addr: uplink.former_addr,
            former_addr_v6: uplink.former_addr_v6,
        }
    }
}

impl Uplink {
    /// Whether the interface has an IPv4 address to masquerade to (`snat_addr` is not zero).
    pub const fn has_v4(&self) -> bool {
        !matches!(self.snat_addr, [0, 0, 0, 0])
    }

    /// The record of an interface masq attached to in `attach_mode`, masquerading IPv4 to
    /// `snat_addr` and no IPv6 yet.
    pub const fn new(snat_addr: [u8; 4], attach_mode: u8, ifname: [u8; IFNAME_SIZE]) -> Self {
        Self {
            snat_addr,
            attach_mode,
            created_clsact: 0,
            has_v6: 0,
            link: LINK_ETHERNET,
            ifname,
            snat_addr_v6: [0; 16],
            former_addr: [0; 4],
            former_addr_v6: [0; 16],
        }
    }

    /// The interface name as text (empty if it was not valid UTF-8).
    pub fn name(&self) -> &str {
        let end = self
            .ifname
            .iter()
            .position(|&byte| byte == 0)
            .unwrap_or(IFNAME_SIZE);
        self.ifname
            .get(..end)
            .and_then(|bytes| core::str::from_utf8(bytes).ok())
            .unwrap_or("")
    }

    /// `name` as the NUL-padded field, or `None` when it does not fit (the kernel refuses such
    /// names too).
    pub fn encode_name(name: &str) -> Option<[u8; IFNAME_SIZE]> {
        let mut field = [0; IFNAME_SIZE];
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= IFNAME_SIZE {
            return None;
        }
        field.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(field)
    }
}

crate::impl_pod!(Uplink, UplinkSlot);
