//! The headers as they lie in the frame: their layouts, the offsets of the fields the
//! datapath reads or rewrites, and what an ICMP type means. A leaf: the family trait names
//! these offsets, the parser and the rewrites read and write through them.

/// Length of the Ethernet header, before the IP header on an Ethernet uplink (on an uplink
/// without a link-layer header, the IP header comes first: see `maps::ip_offset`).
pub(crate) const ETH_HLEN: usize = 14;
/// Offset of the IPv4 header checksum within the header.
pub(crate) const IP_CHECK: usize = 10;
/// Offset of the IPv4 source address within the header.
pub(crate) const IP_SRC: usize = 12;
/// Offset of the IPv4 destination address within the header.
pub(crate) const IP_DST: usize = 16;

/// The fragment offset bits of the IPv4 flags-and-offset field.
pub(crate) const IPV4_FRAGMENT_OFFSET_MASK: u16 = 0x1fff;

/// Length of the fixed IPv6 header.
pub(crate) const IPV6_HEADER_LEN: usize = 40;
/// Offset of the IPv6 source address within the header; the destination follows it.
pub(crate) const IPV6_SRC: usize = 8;
/// Offset of the IPv6 destination address within the header.
pub(crate) const IPV6_DST: usize = 24;

/// The fixed part of an IPv4 header, as bytes so that it has no alignment requirement.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Ipv4Header {
    pub(crate) version_ihl: u8,
    pub(crate) tos: u8,
    pub(crate) total_len: [u8; 2],
    pub(crate) id: [u8; 2],
    pub(crate) frag: [u8; 2],
    pub(crate) ttl: u8,
    pub(crate) protocol: u8,
    pub(crate) check: [u8; 2],
    pub(crate) src: [u8; 4],
    pub(crate) dst: [u8; 4],
}

impl Ipv4Header {
    /// Header length in bytes, or `None` when the header is not a valid IPv4 header.
    #[inline(always)]
    pub(crate) fn header_len(&self) -> Option<usize> {
        header_len_of(self.version_ihl)
    }
}

/// The header length an IPv4 header's first byte gives, or `None` when it is not IPv4's.
#[inline(always)]
pub(crate) fn header_len_of(version_ihl: u8) -> Option<usize> {
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    (version_ihl >> 4 == 4 && ihl >= 20).then_some(ihl)
}

/// The fixed IPv6 header, as bytes so that it has no alignment requirement.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Ipv6Header {
    pub(crate) version_class_flow: [u8; 4],
    pub(crate) payload_len: [u8; 2],
    pub(crate) next_header: u8,
    pub(crate) hop_limit: u8,
    pub(crate) src: [u8; 16],
    pub(crate) dst: [u8; 16],
}

/// How the datapath treats an ICMP message type (of either family).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum IcmpKind {
    /// A query (echo, timestamp) whose identifier acts as the local port.
    Request,
    /// The answer to a [`IcmpKind::Request`].
    Reply,
    /// An error quoting the packet that caused it.
    Error,
    /// Anything else (IPv6 neighbour discovery, MLD, router advertisements...): never touched.
    Other,
}

/// The [`IcmpKind`] of an ICMPv4 type.
#[inline(always)]
pub(crate) const fn icmp_kind_v4(icmp: u8) -> IcmpKind {
    match icmp {
        icmp_type::ECHO_REQUEST | icmp_type::TIMESTAMP_REQUEST => IcmpKind::Request,
        icmp_type::ECHO_REPLY | icmp_type::TIMESTAMP_REPLY => IcmpKind::Reply,
        icmp_type::DEST_UNREACH
        | icmp_type::SOURCE_QUENCH
        | icmp_type::REDIRECT
        | icmp_type::TIME_EXCEEDED
        | icmp_type::PARAMETER_PROBLEM => IcmpKind::Error,
        _ => IcmpKind::Other,
    }
}

/// ICMPv6 types (RFC 4443) the datapath tells apart.
pub(crate) mod icmp6_type {
    pub(crate) const DEST_UNREACH: u8 = 1;
    pub(crate) const PACKET_TOO_BIG: u8 = 2;
    pub(crate) const TIME_EXCEEDED: u8 = 3;
    pub(crate) const PARAMETER_PROBLEM: u8 = 4;
    pub(crate) const ECHO_REQUEST: u8 = 128;
    pub(crate) const ECHO_REPLY: u8 = 129;
}

/// The [`IcmpKind`] of an ICMPv6 type. Neighbour discovery, MLD and router messages are
/// [`IcmpKind::Other`]: link-local machinery that must pass exactly as it is.
#[inline(always)]
pub(crate) const fn icmp_kind_v6(icmp: u8) -> IcmpKind {
    match icmp {
        icmp6_type::ECHO_REQUEST => IcmpKind::Request,
        icmp6_type::ECHO_REPLY => IcmpKind::Reply,
        icmp6_type::DEST_UNREACH
        | icmp6_type::PACKET_TOO_BIG
        | icmp6_type::TIME_EXCEEDED
        | icmp6_type::PARAMETER_PROBLEM => IcmpKind::Error,
        _ => IcmpKind::Other,
    }
}

/// ICMP types of queries whose identifier acts as a port (RFC 792, RFC 950).
pub(crate) mod icmp_type {
    pub(crate) const ECHO_REPLY: u8 = 0;
    pub(crate) const DEST_UNREACH: u8 = 3;
    pub(crate) const SOURCE_QUENCH: u8 = 4;
    pub(crate) const REDIRECT: u8 = 5;
    pub(crate) const ECHO_REQUEST: u8 = 8;
    pub(crate) const TIME_EXCEEDED: u8 = 11;
    pub(crate) const PARAMETER_PROBLEM: u8 = 12;
    pub(crate) const TIMESTAMP_REQUEST: u8 = 13;
    pub(crate) const TIMESTAMP_REPLY: u8 = 14;
}
