//! Entries of the NAT table.
//!
//! Every translated flow is stored twice in one hash, like conntrack's original and reply
//! tuples:
//!
//! * the **egress** half is keyed by the tuple as the pod sent it (`pod:port -> remote:port`)
//!   and holds the address and port the flow leaves with;
//! * the **ingress** half is keyed by the tuple of a reply as it arrives (`remote:port ->
//!   node:nat_port`) and holds the pod address and port to restore.
//!
//! The ingress half is inserted first and only if absent, so it doubles as the lock that makes a
//! `(remote, remote port, node, nat port, protocol)` tuple belong to exactly one flow. For ICMP
//! queries the identifier plays the part of the local port: it is the source "port" of an egress
//! key and the destination "port" of an ingress key, the remote side's port being zero.
//!
//! Both halves carry the flow's state as [`crate::flow`] models it (the state, whether it is
//! assured), written by whichever program moves it, and each carries the TCP window of its own
//! direction's sender, written only by the program that sees that direction.

use crate::flow::{TcpSegment, Timeouts, Window};

/// Extension headers the datapath walks to an IPv6 packet's transport header: more than any
/// ordinary packet carries (RFC 8200 recommends at most one of each, in order). A longer chain
/// is passed untouched and counted (`EgressUnsupported`, `IngressUnsupported`).
pub const IPV6_MAX_EXTENSION_HEADERS: usize = 6;

/// IP protocol numbers the datapath knows.
pub mod proto {
    /// Internet Control Message Protocol.
    pub const ICMP: u8 = 1;
    /// Internet Control Message Protocol for IPv6.
    pub const ICMPV6: u8 = 58;
    /// Transmission Control Protocol.
    pub const TCP: u8 = 6;
    /// User Datagram Protocol.
    pub const UDP: u8 = 17;
    /// Stream Control Transmission Protocol.
    pub const SCTP: u8 = 132;
    /// Datagram Congestion Control Protocol.
    pub const DCCP: u8 = 33;
    /// Lightweight User Datagram Protocol.
    pub const UDPLITE: u8 = 136;
}

/// Which half of a flow an entry is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Keyed by the original tuple; leaves through the uplink.
    Egress = 0,
    /// Keyed by the reply tuple; arrives on the uplink.
    Ingress = 1,
}

impl Direction {
    /// Decodes the `direction` byte of a key.
    pub const fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::Egress),
            1 => Some(Self::Ingress),
            _ => None,
        }
    }
}

/// An address of one IP family as the tables store it: its bytes in network order.
pub trait Address: Copy + Eq + core::fmt::Debug + core::hash::Hash {
    /// Explicit padding between a [`NatEntry`]'s marks and its timestamps, so that the entry
    /// has no implicit padding whatever the address's size.
    type EntryPad: Copy + Eq + core::fmt::Debug;
    /// The padding's (zero) value.
    const ENTRY_PAD: Self::EntryPad;
}

impl Address for [u8; 4] {
    type EntryPad = [u8; 0];
    const ENTRY_PAD: [u8; 0] = [];
}

impl Address for [u8; 16] {
    type EntryPad = [u8; 4];
    const ENTRY_PAD: [u8; 4] = [0; 4];
}

/// Key of the IPv4 NAT table.
pub type NatKeyV4 = NatKey<[u8; 4]>;
/// Key of the IPv6 NAT table.
pub type NatKeyV6 = NatKey<[u8; 16]>;
/// Value of the IPv4 NAT table.
pub type NatEntryV4 = NatEntry<[u8; 4]>;
/// Value of the IPv6 NAT table.
pub type NatEntryV6 = NatEntry<[u8; 16]>;

/// Key of a NAT table: a packet's tuple, in one direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatKey<A> {
    /// Source address of the packet this key matches, network byte order.
    pub src_addr: A,
    /// Destination address of the packet this key matches, network byte order.
    pub dst_addr: A,
    /// Source port, host byte order (ICMP: identifier on egress, 0 on ingress).
    pub src_port: u16,
    /// Destination port, host byte order (ICMP: 0 on egress, identifier on ingress).
    pub dst_port: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// [`Direction`] as a byte.
    pub direction: u8,
    /// Keeps the key free of implicit padding; always zero.
    pub pad: [u8; 2],
}

/// The flow was started by a pod (or any address other than the node's).
pub const ORIGIN_POD: u8 = 0;
/// The flow was started by the node itself with a port inside the SNAT range; it is tracked so
/// that no pod flow is given the same port towards the same remote endpoint.
pub const ORIGIN_HOST: u8 = 1;
/// A UDP flow opened from outside towards a pod (routed to the pod's address directly). Only
/// an egress entry exists, translating to the pod's own address and port: it makes the pod's
/// replies leave untouched, as conntrack would, instead of being masqueraded as new flows.
pub const ORIGIN_INBOUND: u8 = 2;

/// Value of a NAT table: one half of a flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatEntry<A: Address> {
    /// Egress half: address the flow leaves with. Ingress half: the pod address to restore.
    pub addr: A,
    /// Egress half: port the flow leaves with. Ingress half: the pod port to restore.
    pub port: u16,
    /// `ORIGIN_*` of the flow.
    pub origin: u8,
    /// The flow's state: `flow::tcp::*` for TCP, `flow::datagram::*` for the rest. The same
    /// in both halves.
    pub state: u8,
    /// 1 once the flow is assured (see `crate::flow`), in both halves.
    pub assured: u8,
    /// 1 while the last TCP segment was an accepted RST that left the state as it was
    /// (`flow::TcpFlow::reset`), in both halves.
    pub reset: u8,
    /// Keeps the layout free of implicit padding; always zero.
    pub pad: [u8; 2],
    /// The TCP window of this half's direction, as its sender offered it (zero for other
    /// protocols).
    pub window: Window,
    /// Keeps the layout free of implicit padding (see [`Address::EntryPad`]); always zero.
    pub align: A::EntryPad,
    /// When the flow was created (`bpf_ktime_get_coarse_ns`, CLOCK_MONOTONIC).
    pub created_ns: u64,
    /// Last packet in this direction, refreshed at most once per [`TOUCH_INTERVAL_NS`]; zero
    /// until this direction carried one (an ingress half: until an answer came).
    pub last_seen_ns: u64,
}

/// How stale `last_seen_ns` may get before a packet refreshes it. Refreshing on every packet
/// would write to a shared cache line per packet; flow lifetimes are measured in seconds.
pub const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

impl<A: Address> NatEntry<A> {
    /// A half translating to `addr` and `port`, for a flow in `state`, with nothing tracked of
    /// its direction's window.
    #[inline(always)]
    pub const fn new(
        addr: A,
        port: u16,
        origin: u8,
        state: u8,
        created_ns: u64,
        last_seen_ns: u64,
    ) -> Self {
        Self {
            addr,
            port,
            origin,
            state,
            assured: 0,
            reset: 0,
            pad: [0; 2],
            window: Window::EMPTY,
            align: A::ENTRY_PAD,
            created_ns,
            last_seen_ns,
        }
    }

    /// The same half with `window` as its direction's window.
    #[inline(always)]
    #[must_use]
    pub const fn with_window(mut self, window: Window) -> Self {
        self.window = window;
        self
    }

    /// Whether the flow is assured.
    #[inline(always)]
    pub const fn is_assured(&self) -> bool {
        self.assured != 0
    }

    /// How long the flow this half belongs to may stay idle, by the state it holds.
    #[inline(always)]
    pub const fn lifetime(&self, protocol: u8, timeouts: &Timeouts) -> u64 {
        timeouts.lifetime(protocol, self.state, self.assured != 0, self.reset != 0)
    }
}

/// When the flow whose halves are `egress` and `ingress` (none: an inbound flow's one entry,
/// or a half whose other is gone) last showed activity, in monotonic nanoseconds.
#[inline(always)]
pub const fn last_activity<A: Address>(egress: &NatEntry<A>, ingress: Option<&NatEntry<A>>) -> u64 {
    let mut last = egress.created_ns;
    if egress.last_seen_ns > last {
        last = egress.last_seen_ns;
    }
    if let Some(ingress) = ingress {
        if ingress.created_ns > last {
            last = ingress.created_ns;
        }
        if ingress.last_seen_ns > last {
            last = ingress.last_seen_ns;
        }
    }
    last
}

impl<A: Address> NatKey<A> {
    /// A key of the given direction.
    #[inline(always)]
    pub const fn new(
        src_addr: A,
        dst_addr: A,
        src_port: u16,
        dst_port: u16,
        protocol: u8,
        direction: Direction,
    ) -> Self {
        Self {
            src_addr,
            dst_addr,
            src_port,
            dst_port,
            protocol,
            direction: direction as u8,
            pad: [0; 2],
        }
    }

    /// Which half this key belongs to, or `None` for a corrupt entry.
    pub const fn direction(&self) -> Option<Direction> {
        Direction::from_u8(self.direction)
    }

    /// The key of the other half of the flow whose half is `(self, entry)`.
    ///
    /// For an egress half `pod:p -> remote:r` translated to `node:n`, that is the reply tuple
    /// `remote:r -> node:n`; for an ingress half it is the original tuple. ICMP keeps the
    /// identifier on the local side of both keys.
    #[inline(always)]
    pub const fn peer(&self, entry: &NatEntry<A>) -> Self {
        match Direction::from_u8(self.direction) {
            Some(Direction::Ingress) => Self::new(
                entry.addr,
                self.src_addr,
                entry.port,
                self.src_port,
                self.protocol,
                Direction::Egress,
            ),
            _ => Self::new(
                self.dst_addr,
                entry.addr,
                self.dst_port,
                entry.port,
                self.protocol,
                Direction::Ingress,
            ),
        }
    }

    /// The value the other half of the flow holds: the translation that undoes this one.
    #[inline(always)]
    pub const fn peer_entry(&self, entry: &NatEntry<A>) -> NatEntry<A> {
        let (addr, port) = match Direction::from_u8(self.direction) {
            Some(Direction::Ingress) => (self.dst_addr, self.dst_port),
            _ => (self.src_addr, self.src_port),
        };
        let mut peer = NatEntry::new(addr, port, entry.origin, entry.state, entry.created_ns, 0);
        peer.assured = entry.assured;
        peer.reset = entry.reset;
        peer
    }
}

crate::impl_pod!(NatKeyV4, NatKeyV6, NatEntryV4, NatEntryV6);

/// The IPv4 hand-off.
pub type HandoffV4 = Handoff<[u8; 4]>;
/// The IPv6 hand-off.
pub type HandoffV6 = Handoff<[u8; 16]>;

/// What passes, per CPU, between the programs that handle one packet the fast path leaves to
/// others: the egress and ingress programs, the flow-event program, the allocator, and the
/// programs that rewrite the packet at the end. It lives for the length of their tail calls
/// (softirq context: nothing else runs on the CPU in between). Each part has one writer at a
/// time: the program that asks, the allocator while it searches, whoever made the mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handoff<A: Address> {
    /// The packet's flow and what is asked for it: written by the program that tail-calls.
    pub request: FlowRequest<A>,
    /// Where the allocator's port search stands between its runs: the allocator's alone.
    pub search: PortSearch,
    /// The translation for the packet (the half it matched, or the egress half the allocator
    /// created), for the program that rewrites it.
    pub mapping: NatEntry<A>,
    /// Where a new flow's key goes in the flow index: the slot of the flow evicted to make room
    /// for it (so that the index keeps as many live flows as before), or [`NO_INDEX_SLOT`] for
    /// the cursor's next. Reset by the program that asks; set by an eviction.
    pub index_slot: u32,
    /// Whether the new flow already took a port from a pod holding more of its remote's (see
    /// the datapath's `evict::take_from_busier`): it takes at most one. Reset by the program
    /// that asks.
    pub took_port: u32,
}

/// [`Handoff::index_slot`]: no flow made room for this one.
pub const NO_INDEX_SLOT: u32 = u32::MAX;

/// A packet the fast path hands on: its flow's key and what it needs.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowRequest<A: Address> {
    /// The packet's tuple: an egress key for a packet leaving (and for a datagram towards a
    /// pod, the key of the pod's answers), an ingress key for a reply arriving.
    pub key: NatKey<A>,
    /// The uplink's address: what the flow is masqueraded to.
    pub node_addr: A,
    /// `ORIGIN_*` of a new flow.
    pub origin: u8,
    /// `EVENT_*`: what the fast path could not do.
    pub event: u8,
    /// The counter (`counters::Counter`) the packet's translation counts under.
    pub counter: u16,
    /// The packet's TCP segment (all zero for other protocols): a new flow's state and window
    /// start from it, an existing flow's move by it.
    pub segment: TcpSegment,
    /// Aligns the hand-off's mapping for either family (see [`Address::EntryPad`]); always
    /// zero.
    pub align: A::EntryPad,
}

/// [`FlowRequest::event`]: the packet needs a new mapping (the allocator).
pub const EVENT_NEW_FLOW: u8 = 0;
/// [`FlowRequest::event`]: the packet moves its flow's state (a handshake, a close, an
/// answer): both halves are read and written.
pub const EVENT_TRACK: u8 = 1;
/// [`FlowRequest::event`]: the packet has no mapping, but its flow was buried by the agent and
/// may come back (see the datapath's `nat::revive`).
pub const EVENT_REVIVE: u8 = 2;
/// [`FlowRequest::event`]: a datagram from outside towards a pod, of a flow not tracked yet.
pub const EVENT_INBOUND: u8 = 3;

/// A port search in progress: the range it runs through and how far it has come. The search
/// runs in chunks of [`ALLOC_CHUNK`](crate::counters::ALLOC_CHUNK) ports, one allocator run
/// each, the allocator tail-calling itself between them (see `masq-ebpf`'s `nat::allocate`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortSearch {
    /// First port of the range.
    pub first: u16,
    /// Ports the current round tries ([`FIRST_ALLOC_ROUND`](crate::counters::FIRST_ALLOC_ROUND)
    /// halving down to [`MIN_ALLOC_ROUND`](crate::counters::MIN_ALLOC_ROUND)); zero when no
    /// search has begun for the request, which is how the egress program hands a new one over.
    pub round: u16,
    /// Number of ports in the range.
    pub size: u32,
    /// Position in the range of the current round's first port.
    pub start: u32,
    /// Ports of the current round already tried.
    pub step: u32,
}

/// Key of the IPv4 fragment table.
pub type FragKeyV4 = FragKey<[u8; 4]>;
/// Key of the IPv6 fragment table.
pub type FragKeyV6 = FragKey<[u8; 16]>;
/// Value of the IPv4 fragment table.
pub type FragEntryV4 = FragEntry<[u8; 4]>;
/// Value of the IPv6 fragment table.
pub type FragEntryV6 = FragEntry<[u8; 16]>;

/// Key of a fragment table: identifies one IP datagram in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragKey<A> {
    /// Source address as the fragment carries it.
    pub src_addr: A,
    /// Destination address as the fragment carries it.
    pub dst_addr: A,
    /// Identification (IPv4: 16 bits, IPv6: the fragment header's 32), host byte order.
    pub id: u32,
    /// IP protocol number.
    pub protocol: u8,
    /// [`Direction`] as a byte.
    pub direction: u8,
    /// Keeps the key free of implicit padding; always zero.
    pub pad: [u8; 2],
}

/// The datagram was translated; later fragments get `addr` as their new address.
pub const FRAG_TRANSLATED: u8 = 1;
/// The datagram was left alone; later fragments are too.
pub const FRAG_UNTOUCHED: u8 = 2;
/// The datagram was dropped (or its first fragment could not be mapped); later fragments are
/// dropped too, so no part of it leaves with the pod's address.
pub const FRAG_DROPPED: u8 = 3;

/// Value of a fragment table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragEntry<A: Address> {
    /// New source (egress) or destination (ingress) address of the datagram's fragments.
    pub addr: A,
    /// `FRAG_*` decision taken for the first fragment.
    pub decision: u8,
    /// Keeps the value free of implicit padding; always zero.
    pub pad: [u8; 3],
    /// Aligns `created_ns` for either family (see [`Address::EntryPad`]); always zero.
    pub align: A::EntryPad,
    /// When the first fragment was seen; the agent drops entries older than a reassembly timeout.
    pub created_ns: u64,
}

/// How long fragment decisions are kept (Linux's `ipfrag_time`).
pub const FRAG_LIFETIME_NS: u64 = 30_000_000_000;

/// Key of a remote-holders table: one local address (a pod's) and one remote endpoint
/// `remote:remote_port` of `protocol`, whose node ports the pod's flows use. See
/// `layout::MAP_REMOTE_HOLDERS_V4`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemoteHolder<A> {
    /// The local address holding the ports.
    pub holder: A,
    /// The remote address.
    pub remote: A,
    /// The remote port (0 for protocols without ports).
    pub remote_port: u16,
    /// IP protocol number.
    pub protocol: u8,
    /// Always zero.
    pub pad: u8,
}

impl<A: Address> RemoteHolder<A> {
    /// `holder`'s use of the remote end of `key`, an egress key.
    #[inline(always)]
    pub const fn of(holder: A, key: &NatKey<A>) -> Self {
        Self {
            holder,
            remote: key.dst_addr,
            remote_port: key.dst_port,
            protocol: key.protocol,
            pad: 0,
        }
    }
}

/// Key of the IPv4 remote-holders table.
pub type RemoteHolderV4 = RemoteHolder<[u8; 4]>;
/// Key of the IPv6 remote-holders table.
pub type RemoteHolderV6 = RemoteHolder<[u8; 16]>;

crate::impl_pod!(
    FragKeyV4,
    FragKeyV6,
    FragEntryV4,
    FragEntryV6,
    HandoffV4,
    HandoffV6,
    PortSearch,
    Holder,
    RemoteHolderV4,
    RemoteHolderV6
);

/// Value of a holders table, keyed by the local address of flows (a pod's, the node's): how
/// many unassured flows that address holds. The datapath adds and subtracts atomically as
/// flows are created, assured and evicted; the agent's garbage collector corrects the count
/// from the table on every pass (what it removed, and whatever two CPUs raced over). A
/// holder at its share of the table admits a new flow only in place of one of its own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// Unassured flows, as a two's complement count (a race can take it below zero for a
    /// moment; readers take that as zero).
    pub unassured: u64,
}

impl Holder {
    /// The count, as a number of flows.
    pub const fn flows(&self) -> u64 {
        if (self.unassured as i64) < 0 {
            0
        } else {
            self.unassured
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{datagram, tcp};

    const POD: [u8; 4] = [10, 244, 1, 5];
    const REMOTE: [u8; 4] = [203, 0, 113, 10];
    const NODE: [u8; 4] = [192, 0, 2, 1];

    fn entry(addr: [u8; 4], port: u16) -> NatEntryV4 {
        NatEntry::new(addr, port, ORIGIN_POD, tcp::ESTABLISHED, 7, 9)
    }

    #[test]
    fn peer_of_egress_is_the_reply_tuple() {
        let egress = NatKeyV4::new(POD, REMOTE, 40_000, 443, proto::TCP, Direction::Egress);
        let mut translated = entry(NODE, 2_000);
        translated.assured = 1;
        let ingress = egress.peer(&translated);
        assert_eq!(
            ingress,
            NatKeyV4::new(REMOTE, NODE, 443, 2_000, proto::TCP, Direction::Ingress)
        );
        let restore = egress.peer_entry(&translated);
        assert_eq!((restore.addr, restore.port), (POD, 40_000));
        assert_eq!(restore.created_ns, 7);
        assert_eq!(restore.last_seen_ns, 0);
        // The flow's state travels with it; the window is the other direction's own.
        assert_eq!((restore.state, restore.assured), (tcp::ESTABLISHED, 1));
        assert_eq!(restore.window, Window::EMPTY);
    }

    #[test]
    fn peer_is_an_involution() {
        let egress = NatKeyV4::new(POD, REMOTE, 5, 0, proto::ICMP, Direction::Egress);
        let translated = NatEntry::new(NODE, 1_500, ORIGIN_POD, datagram::UNREPLIED, 7, 9);
        let ingress = egress.peer(&translated);
        assert_eq!(
            ingress,
            NatKeyV4::new(REMOTE, NODE, 0, 1_500, proto::ICMP, Direction::Ingress)
        );
        let restore = egress.peer_entry(&translated);
        assert_eq!(ingress.peer(&restore), egress);
        assert_eq!(ingress.peer_entry(&restore).addr, NODE);
        assert_eq!(ingress.peer_entry(&restore).port, 1_500);
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<NatKeyV4>(), 16);
        assert_eq!(size_of::<Window>(), 20);
        // 4 + 2 + 1 + 1 + 1 + 1 + 2, the window, two timestamps.
        assert_eq!(size_of::<NatEntryV4>(), 48);
        assert_eq!(size_of::<NatKeyV6>(), 40);
        // 16 + 8, the window, four of padding, two timestamps.
        assert_eq!(size_of::<NatEntryV6>(), 64);
        assert_eq!(size_of::<FragKeyV4>(), 16);
        assert_eq!(size_of::<FragEntryV4>(), 16);
        assert_eq!(size_of::<FragKeyV6>(), 40);
        assert_eq!(size_of::<FragEntryV6>(), 32);
        assert_eq!(size_of::<PortSearch>(), 16);
        assert_eq!(size_of::<RemoteHolderV4>(), 12);
        assert_eq!(size_of::<RemoteHolderV6>(), 36);
        assert_eq!(size_of::<TcpSegment>(), 16);
        assert_eq!(
            size_of::<FlowRequest<[u8; 4]>>(),
            size_of::<NatKeyV4>() + 4 + 4 + size_of::<TcpSegment>()
        );
        assert_eq!(
            size_of::<HandoffV4>(),
            size_of::<FlowRequest<[u8; 4]>>()
                + size_of::<PortSearch>()
                + size_of::<NatEntryV4>()
                + 8
        );
        assert_eq!(
            size_of::<FlowRequest<[u8; 16]>>(),
            size_of::<NatKeyV6>() + 16 + 4 + size_of::<TcpSegment>() + 4
        );
        assert_eq!(
            size_of::<HandoffV6>(),
            size_of::<FlowRequest<[u8; 16]>>()
                + size_of::<PortSearch>()
                + size_of::<NatEntryV6>()
                + 8
        );
    }
}
