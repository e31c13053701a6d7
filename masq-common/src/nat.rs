//! Entries of the NAT table.
//!
//! Every translated flow is stored twice in one LRU hash, like conntrack's original and reply
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

/// The TCP SYN flag was seen in this direction (without ACK: a connection attempt).
pub const FLOW_TCP_SYN: u8 = 1 << 0;
/// The TCP FIN flag was seen in this direction.
pub const FLOW_TCP_FIN: u8 = 1 << 1;
/// The TCP RST flag was seen in this direction.
pub const FLOW_TCP_RST: u8 = 1 << 2;
/// At least one packet matched this half after it was created (for the ingress half: a reply).
pub const FLOW_SEEN: u8 = 1 << 3;
/// Set by the egress program on every entry it finds: on an inbound flow's one entry, that the
/// pod has answered (its other packets, the remote's, are marked only [`FLOW_SEEN`]).
pub const FLOW_ANSWERED: u8 = 1 << 4;
/// Flags that mark a TCP connection as closing.
pub const FLOW_TCP_CLOSING: u8 = FLOW_TCP_FIN | FLOW_TCP_RST;

/// The flow was started by a pod (or any address other than the node's).
pub const ORIGIN_POD: u8 = 0;
/// The flow was started by the node itself with a port inside the SNAT range; it is tracked so
/// that no pod flow is given the same port towards the same remote endpoint.
pub const ORIGIN_HOST: u8 = 1;
/// A UDP flow opened from outside towards a pod (routed to the pod's address directly). Only
/// an egress entry exists, translating to the pod's own address and port: it makes the pod's
/// replies leave untouched, as conntrack would, instead of being masqueraded as new flows.
pub const ORIGIN_INBOUND: u8 = 2;

/// The `FLOW_*` bits of a half, one byte per bit (byte `i` is 1 when bit `1 << i` was seen), in
/// bytes 0 to 4; and in bytes 5 to 7, on a TCP flow's egress half, the low bits of the last
/// acknowledgement the local end (pod or node) sent ([`FlowMarks::ack_low`]), written by the
/// egress program: what a RST or FIN from the remote end is checked against (see
/// [`RST_WINDOW`]). Those three bytes were unused (zero) before, so tables pinned by an older
/// masq read as "nothing recorded".
///
/// Packets of one direction may be handled on several CPUs at once. A bit set by reading,
/// or-ing and writing back one shared byte can be lost when another CPU does the same (a FIN
/// lost holds a closed flow 5 days), and the atomic OR that would prevent it needs Linux 5.12.
/// With a byte per bit every update is a plain store of a constant to its own byte, and
/// concurrent stores to different bytes cannot undo each other. Eight bytes, not five and
/// three: LLVM zeroes an odd run of bytes with a call to `memset`, a bpf-to-bpf call in every
/// program that builds an entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowMarks(pub [u8; 8]);

/// Bytes of [`FlowMarks`] that hold one `FLOW_*` bit each.
pub const FLOW_FLAG_BYTES: usize = 5;
/// Where [`FlowMarks`] keeps the acknowledgement's low bits.
pub const FLOW_ACK_BYTES: core::ops::Range<usize> = FLOW_FLAG_BYTES..8;

impl FlowMarks {
    /// Marks with the given `FLOW_*` bits set, and no acknowledgement recorded.
    #[inline(always)]
    pub const fn from_bits(bits: u8) -> Self {
        let mut bytes = [0; 8];
        let mut index = 0;
        while index < FLOW_FLAG_BYTES {
            bytes[index] = (bits >> index) & 1;
            index += 1;
        }
        Self(bytes)
    }

    /// The `FLOW_*` bits set. Every packet of a flow asks, so it is one load, a mask and a
    /// multiply, without a branch per byte: each flag byte is 0 or 1 (only those are ever
    /// stored), and the multiplication gathers byte `i`'s value into bit `i` of the top byte.
    #[inline(always)]
    pub const fn bits(&self) -> u8 {
        const GATHER: u64 = 0x0102_0408_1020_4080;
        const FLAGS: u64 = (1 << (8 * FLOW_FLAG_BYTES)) - 1;
        ((u64::from_le_bytes(self.0) & FLAGS).wrapping_mul(GATHER) >> 56) as u8
    }

    /// The low bits of the last acknowledgement recorded ([`SeqLow::UNKNOWN`] if none).
    #[inline(always)]
    pub const fn ack_low(&self) -> SeqLow {
        SeqLow([self.0[5], self.0[6], self.0[7]])
    }
}

/// The low 24 bits of a TCP sequence or acknowledgement number, as [`FlowMarks`] stores them
/// (little-endian bytes). 24 bits are what the entry had spare; they make a spoofed segment
/// land in a tracked window 1 time in 2^24 / window, on top of guessing the node port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqLow(pub [u8; 3]);

impl SeqLow {
    /// Nothing recorded: no acknowledgement seen yet (or one whose low bits are all zero,
    /// 1 time in 2^24, which then counts as nothing recorded).
    pub const UNKNOWN: Self = Self([0; 3]);

    /// The low 24 bits of `number`.
    #[inline(always)]
    pub const fn of(number: u32) -> Self {
        let [b0, b1, b2, _] = number.to_le_bytes();
        Self([b0, b1, b2])
    }

    /// How far `number` lies after this one, modulo 2^24 (sequence space wraps).
    #[inline(always)]
    pub const fn distance_to(self, number: u32) -> u32 {
        let [b0, b1, b2] = self.0;
        number.wrapping_sub(u32::from_le_bytes([b0, b1, b2, 0])) & SEQ_LOW_MASK
    }
}

/// The bits of a sequence number [`SeqLow`] keeps.
pub const SEQ_LOW_MASK: u32 = 0x00ff_ffff;

/// A RST from the remote end of a flow ends the flow's lifetime only if its sequence number
/// is the local end's last acknowledgement or at most this far past it. conntrack accepts a
/// RST exactly at the last acknowledgement, or ending the remote's last segment (data in flight
/// the local end has not acknowledged yet); this bound covers that flight.
pub const RST_WINDOW: u32 = 1 << 16;

/// A FIN from the remote end changes the flow's lifetime only if its sequence number lies
/// within this distance of the local end's last acknowledgement, either way: ahead, a receive
/// window (Linux's default `tcp_rmem` maximum advertises about 3 MiB); behind, a retransmitted
/// FIN. conntrack checks a FIN against the window it tracks; half the 24-bit space is the
/// honest bound without the window scale.
pub const FIN_WINDOW: u32 = 1 << 22;

/// Value of a NAT table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatEntry<A: Address> {
    /// Egress half: address the flow leaves with. Ingress half: the pod address to restore.
    pub addr: A,
    /// Egress half: port the flow leaves with. Ingress half: the pod port to restore.
    pub port: u16,
    /// `ORIGIN_*` of the flow.
    pub origin: u8,
    /// Keeps the layout free of implicit padding; always zero.
    pub pad: u8,
    /// `FLOW_*` bits seen in this direction (and, on a TCP egress half, the local end's last
    /// acknowledgement).
    pub marks: FlowMarks,
    /// Keeps the layout free of implicit padding (see [`Address::EntryPad`]); always zero.
    pub align: A::EntryPad,
    /// When the flow was created (`bpf_ktime_get_coarse_ns`, CLOCK_MONOTONIC).
    pub created_ns: u64,
    /// Last packet in this direction, refreshed at most once per [`TOUCH_INTERVAL_NS`].
    pub last_seen_ns: u64,
}

/// How stale `last_seen_ns` may get before a packet refreshes it. Refreshing on every packet
/// would write to a shared cache line per packet; flow lifetimes are measured in seconds.
pub const TOUCH_INTERVAL_NS: u64 = 1_000_000_000;

impl<A: Address> NatEntry<A> {
    /// An entry translating to `addr` and `port`.
    #[inline(always)]
    pub const fn new(
        addr: A,
        port: u16,
        origin: u8,
        marks: FlowMarks,
        created_ns: u64,
        last_seen_ns: u64,
    ) -> Self {
        Self {
            addr,
            port,
            origin,
            pad: 0,
            marks,
            align: A::ENTRY_PAD,
            created_ns,
            last_seen_ns,
        }
    }
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
        NatEntry::new(
            addr,
            port,
            entry.origin,
            FlowMarks::from_bits(0),
            entry.created_ns,
            0,
        )
    }
}

crate::impl_pod!(
    NatKeyV4, NatKeyV6, NatEntryV4, NatEntryV6, FlowMarks, SeqLow
);

/// The IPv4 allocator's request.
pub type AllocRequestV4 = AllocRequest<[u8; 4]>;
/// The IPv6 allocator's request.
pub type AllocRequestV6 = AllocRequest<[u8; 16]>;

/// What the egress program hands the port allocator it tail-calls (the flow that needs a
/// mapping, decided on but not yet created), and the allocator hands the program that
/// translates the packet (the mapping). Lives in a per-CPU map for the length of the tail calls
/// (softirq context: nothing else runs on the CPU in between).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest<A: Address> {
    /// Egress key of the new flow, as the packet carries it.
    pub key: NatKey<A>,
    /// Address the flow is masqueraded to (its uplink's), network byte order.
    pub snat_addr: A,
    /// `ORIGIN_*` of the flow.
    pub origin: u8,
    /// `FLOW_*` bits of the packet.
    pub flow_flags: u8,
    /// Keeps the value free of implicit padding; always zero.
    pub pad: [u8; 2],
    /// Aligns `entry` for either family (see [`Address::EntryPad`]); always zero.
    pub align: A::EntryPad,
    /// The mapping the allocator created, for the program that translates the packet.
    pub entry: NatEntry<A>,
    /// Where the allocator's port search starts; the allocator's own scratch space.
    pub search: PortSearch,
}

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

/// Whether a flow may be evicted to admit a new one when the NAT table is full, as conntrack's
/// `early_drop` evicts what is not assured: a flow never answered, and a UDP (or other
/// protocol's) flow that is not an answered stream. An answered TCP flow, or an answered
/// stream still active two seconds after it began, is never evicted. `egress` and `ingress`
/// are the flow's halves (an inbound flow has one entry: pass it as both).
pub const fn unassured<A: Address>(
    protocol: u8,
    egress: &NatEntry<A>,
    ingress: &NatEntry<A>,
) -> bool {
    let replied = if egress.origin == ORIGIN_INBOUND {
        egress.marks.bits() & FLOW_ANSWERED != 0
    } else {
        ingress.marks.bits() & FLOW_SEEN != 0
    };
    if !replied {
        return true;
    }
    if protocol == proto::TCP {
        return false;
    }
    let began = if egress.created_ns > ingress.created_ns {
        egress.created_ns
    } else {
        ingress.created_ns
    };
    let last = if egress.last_seen_ns > ingress.last_seen_ns {
        egress.last_seen_ns
    } else {
        ingress.last_seen_ns
    };
    last.saturating_sub(began) <= crate::timeouts::UDP_STREAM_AFTER_NS
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

crate::impl_pod!(
    FragKeyV4,
    FragKeyV6,
    FragEntryV4,
    FragEntryV6,
    AllocRequestV4,
    AllocRequestV6,
    PortSearch
);

#[cfg(test)]
mod tests {
    use super::*;

    const POD: [u8; 4] = [10, 244, 1, 5];
    const REMOTE: [u8; 4] = [203, 0, 113, 10];
    const NODE: [u8; 4] = [192, 0, 2, 1];

    fn entry(addr: [u8; 4], port: u16) -> NatEntryV4 {
        NatEntry::new(addr, port, ORIGIN_POD, FlowMarks::from_bits(0), 7, 9)
    }

    #[test]
    fn marks_hold_each_bit_in_its_own_byte() {
        for bits in 0..32 {
            assert_eq!(FlowMarks::from_bits(bits).bits(), bits);
            // Whatever acknowledgement is recorded beside them.
            let mut marks = FlowMarks::from_bits(bits);
            marks.0[FLOW_ACK_BYTES].copy_from_slice(&[0xff, 0x13, 0x80]);
            assert_eq!(marks.bits(), bits);
            assert_eq!(marks.ack_low(), SeqLow([0xff, 0x13, 0x80]));
        }
        assert_eq!(
            FlowMarks::from_bits(FLOW_TCP_FIN | FLOW_SEEN).0,
            [0, 1, 0, 1, 0, 0, 0, 0]
        );
    }

    #[test]
    fn entries_keep_the_layout_pinned_tables_have() {
        // The acknowledgement's bytes took the marks' three unused bytes: tables pinned by an
        // older masq stay compatible, their zero bytes reading as nothing recorded.
        assert_eq!(size_of::<NatEntryV4>(), 32);
        assert_eq!(size_of::<NatEntryV6>(), 48);
        assert_eq!(core::mem::offset_of!(NatEntryV4, marks), 8);
        let entry = entry(NODE, 1);
        assert_eq!(entry.marks.ack_low(), SeqLow::UNKNOWN);
    }

    #[test]
    fn sequence_distances_wrap_in_24_bits() {
        let ack = SeqLow::of(0x1234_5678);
        assert_eq!(ack.0, [0x78, 0x56, 0x34]);
        assert_eq!(ack.distance_to(0x1234_5678), 0);
        assert_eq!(ack.distance_to(0xff34_5679), 1);
        assert_eq!(ack.distance_to(0x1234_5677), SEQ_LOW_MASK);
        assert_eq!(SeqLow::of(0x00ff_fff0).distance_to(0x0100_0010), 0x20);
    }

    #[test]
    fn peer_of_egress_is_the_reply_tuple() {
        let egress = NatKeyV4::new(POD, REMOTE, 40_000, 443, proto::TCP, Direction::Egress);
        let translated = entry(NODE, 2_000);
        let ingress = egress.peer(&translated);
        assert_eq!(
            ingress,
            NatKeyV4::new(REMOTE, NODE, 443, 2_000, proto::TCP, Direction::Ingress)
        );
        let restore = egress.peer_entry(&translated);
        assert_eq!((restore.addr, restore.port), (POD, 40_000));
        assert_eq!(restore.created_ns, 7);
        assert_eq!(restore.last_seen_ns, 0);
    }

    #[test]
    fn peer_is_an_involution() {
        let egress = NatKeyV4::new(POD, REMOTE, 5, 0, proto::ICMP, Direction::Egress);
        let translated = entry(NODE, 1_500);
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
        // 4 + 2 + 1 + 1, eight mark bytes, two timestamps.
        assert_eq!(size_of::<NatEntryV4>(), 32);
        assert_eq!(size_of::<NatKeyV6>(), 40);
        // 16 + 2 + 1 + 1, eight mark bytes, four of padding, two timestamps.
        assert_eq!(size_of::<NatEntryV6>(), 48);
        assert_eq!(size_of::<FragKeyV4>(), 16);
        assert_eq!(size_of::<FragEntryV4>(), 16);
        assert_eq!(size_of::<FragKeyV6>(), 40);
        assert_eq!(size_of::<FragEntryV6>(), 32);
        assert_eq!(size_of::<PortSearch>(), 16);
        assert_eq!(
            size_of::<AllocRequestV4>(),
            size_of::<NatKeyV4>() + 8 + size_of::<NatEntryV4>() + size_of::<PortSearch>()
        );
        assert_eq!(
            size_of::<AllocRequestV6>(),
            size_of::<NatKeyV6>() + 16 + 4 + 4 + size_of::<NatEntryV6>() + size_of::<PortSearch>()
        );
    }
}
