//! Frames at the byte level: an IPv4 parser written independently of the datapath's, sums for
//! checking checksums, and builders for the protocols `pktgen` does not craft.

use std::net::Ipv4Addr;

use crate::check::internet_checksum;

pub const ETH_HLEN: usize = 14;
const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];

/// IP protocol numbers the fuzzer crafts.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const ICMPV6: u8 = 58;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const DCCP: u8 = 33;
    pub const GRE: u8 = 47;
    pub const ESP: u8 = 50;
    pub const SCTP: u8 = 132;
    pub const UDPLITE: u8 = 136;
}

/// ICMP types that quote the packet they complain about (RFC 792).
pub const fn is_icmp_error(icmp_type: u8) -> bool {
    matches!(icmp_type, 3 | 4 | 5 | 11 | 12)
}

/// Transport protocols whose checksum covers a pseudo-header holding the IPv4 addresses, so an
/// address rewrite must update it (RFC 793, 768, 4340, 3828).
pub const fn has_pseudo_header(protocol: u8) -> bool {
    matches!(
        protocol,
        proto::TCP | proto::UDP | proto::DCCP | proto::UDPLITE
    )
}

/// Offset of the transport checksum a NAT may have to update, for protocols with ports (and
/// for ICMP, whose identifier is the port).
pub const fn checksum_offset(protocol: u8) -> Option<usize> {
    match protocol {
        proto::TCP => Some(16),
        proto::UDP | proto::DCCP | proto::UDPLITE => Some(6),
        proto::ICMP => Some(2),
        _ => None,
    }
}

/// Whether the protocol's first four transport bytes are source and destination ports.
pub const fn has_ports(protocol: u8) -> bool {
    matches!(
        protocol,
        proto::TCP | proto::UDP | proto::DCCP | proto::UDPLITE | proto::SCTP
    )
}

pub fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

pub fn addr4(bytes: &[u8], at: usize) -> Option<[u8; 4]> {
    bytes.get(at..at + 4)?.try_into().ok()
}

/// An IPv4 header found in a frame (the outer packet, or the one an ICMP error quotes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ip {
    /// Offset of the header in the frame.
    pub start: usize,
    pub header_len: usize,
    /// `start` plus the total length field: where the packet ends (for a quote, where it
    /// claims to end).
    pub end: usize,
    pub protocol: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub id: u16,
    pub more_fragments: bool,
    pub fragment_offset: u16,
}

impl Ip {
    /// The IPv4 packet of an Ethernet frame, when the frame is IPv4 and its header is
    /// consistent: version 4, IHL of at least 5 words, a total length covering the header and
    /// fitting in the frame (trailing bytes after it are Ethernet padding or a trailer).
    pub fn of_frame(frame: &[u8]) -> Option<Self> {
        if !is_ipv4_frame(frame) {
            return None;
        }
        let ip = Self::header_at(frame, ETH_HLEN)?;
        (ip.end >= ip.start + ip.header_len && ip.end <= frame.len()).then_some(ip)
    }

    /// The fields of a fixed IPv4 header at `start` (version 4, IHL at least 5), whatever its
    /// lengths claim: quotes are cut short, so their total length is not checked here.
    pub fn header_at(frame: &[u8], start: usize) -> Option<Self> {
        let header = frame.get(start..start + 20)?;
        let header_len = usize::from(header[0] & 0x0f) * 4;
        if header[0] >> 4 != 4 || header_len < 20 {
            return None;
        }
        let frag = u16::from_be_bytes([header[6], header[7]]);
        Some(Self {
            start,
            header_len,
            end: start + usize::from(u16::from_be_bytes([header[2], header[3]])),
            protocol: header[9],
            src: addr4(header, 12)?,
            dst: addr4(header, 16)?,
            id: u16::from_be_bytes([header[4], header[5]]),
            more_fragments: frag & 0x2000 != 0,
            fragment_offset: frag & 0x1fff,
        })
    }

    pub const fn l4(&self) -> usize {
        self.start + self.header_len
    }

    pub const fn is_later_fragment(&self) -> bool {
        self.fragment_offset != 0
    }

    pub const fn is_first_fragment(&self) -> bool {
        self.more_fragments && self.fragment_offset == 0
    }
}

/// Whether `BPF_PROG_TEST_RUN` may refuse the frame before the program runs: shorter than an
/// Ethernet header, or than the network header its ethertype announces (kernels since 6.x
/// check that the IPv4 or IPv6 header is there; 6.18 refuses IPv4 frames under 34 bytes and
/// IPv6 under 54). Such frames cannot be tested here, whatever the datapath would do with them.
pub fn test_run_may_refuse(frame: &[u8]) -> bool {
    let minimum = match frame.get(12..14) {
        Some([0x08, 0x00]) => ETH_HLEN + 20,
        Some([0x86, 0xdd]) => ETH_HLEN + 40,
        _ => ETH_HLEN,
    };
    frame.len() < minimum
}

pub fn is_ipv4_frame(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&ETHERTYPE_IPV4[..])
}

/// Whether the frame's EtherType says IPv6: the IPv6 programs take it.
pub fn is_ipv6_frame(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x86, 0xdd][..])
}

/// Plain sum of the big-endian 16-bit words of `data` (an odd last byte is the high half of a
/// word). It is congruent modulo 0xffff to the one's complement sum, which is all an Internet
/// checksum depends on.
pub fn word_sum(data: &[u8]) -> u64 {
    data.chunks(2)
        .map(|chunk| match chunk {
            [high, low] => u64::from(u16::from_be_bytes([*high, *low])),
            [high] => u64::from(*high) << 8,
            _ => 0,
        })
        .sum()
}

/// The checksum of a transport segment whose checksum covers the IPv4 pseudo-header.
pub fn pseudo_checksum(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, transport: &[u8]) -> u16 {
    let mut data = Vec::with_capacity(12 + transport.len());
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&[0, protocol]);
    data.extend_from_slice(
        &u16::try_from(transport.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    data.extend_from_slice(transport);
    internet_checksum(&data)
}

/// Recomputes the checksum of the IPv4 header at `start`, as far as the frame holds it (a
/// mutation that changed a header field keeps the header otherwise believable).
pub fn fix_ip_checksum(frame: &mut [u8], start: usize) {
    let Some(&first) = frame.get(start) else {
        return;
    };
    let header_len = usize::from(first & 0x0f) * 4;
    let end = (start + header_len).min(frame.len());
    if header_len < 20 || end < start + 12 {
        return;
    }
    frame[start + 10..start + 12].copy_from_slice(&[0, 0]);
    let checksum = internet_checksum(&frame[start..end]);
    frame[start + 10..start + 12].copy_from_slice(&checksum.to_be_bytes());
}

/// A UDP-Lite datagram (RFC 3828) with a valid checksum over `coverage` bytes (0: all).
pub fn udplite(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ports: (u16, u16),
    coverage: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(8 + payload.len());
    bytes.extend_from_slice(&ports.0.to_be_bytes());
    bytes.extend_from_slice(&ports.1.to_be_bytes());
    bytes.extend_from_slice(&coverage.to_be_bytes());
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(payload);
    let covered = match usize::from(coverage) {
        0 => bytes.len(),
        length => length.min(bytes.len()),
    };
    // The pseudo-header carries the whole datagram's length, the sum only the covered bytes.
    let mut data = Vec::with_capacity(12 + covered);
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&[0, proto::UDPLITE]);
    data.extend_from_slice(&u16::try_from(bytes.len()).unwrap_or(0).to_be_bytes());
    data.extend_from_slice(&bytes[..covered]);
    let checksum = internet_checksum(&data);
    bytes[6..8].copy_from_slice(&checksum.to_be_bytes());
    bytes
}

/// A DCCP packet (RFC 4340): a generic header with 48-bit sequence numbers, checksum over the
/// whole packet.
pub fn dccp(src: Ipv4Addr, dst: Ipv4Addr, ports: (u16, u16), payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 + payload.len());
    bytes.extend_from_slice(&ports.0.to_be_bytes());
    bytes.extend_from_slice(&ports.1.to_be_bytes());
    // Data offset 4 words, CCVal 0 and CsCov 0 (all covered), checksum, type 0 (Request)
    // with X=1, reserved, sequence number.
    bytes.extend_from_slice(&[4, 0, 0, 0, 0x01, 0, 0, 0, 0, 0, 0x12, 0x34]);
    bytes.extend_from_slice(payload);
    let checksum = pseudo_checksum(src, dst, proto::DCCP, &bytes);
    bytes[6..8].copy_from_slice(&checksum.to_be_bytes());
    bytes
}

/// A GRE packet carrying IPv4 (RFC 2784), with the optional checksum when `checksummed`.
pub fn gre(checksummed: bool, payload: &[u8]) -> Vec<u8> {
    let mut bytes = vec![if checksummed { 0x80 } else { 0 }, 0, 0x08, 0x00];
    if checksummed {
        bytes.extend_from_slice(&[0, 0, 0, 0]);
    }
    bytes.extend_from_slice(payload);
    if checksummed {
        let checksum = internet_checksum(&bytes);
        bytes[4..6].copy_from_slice(&checksum.to_be_bytes());
    }
    bytes
}

/// An ESP packet (RFC 4303): SPI, sequence number, opaque payload.
pub fn esp(spi: u32, sequence: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = spi.to_be_bytes().to_vec();
    bytes.extend_from_slice(&sequence.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// An ICMP message with a valid checksum: type, code, the four "rest of header" bytes
/// (identifier and sequence for queries), then `body`.
pub fn icmp(icmp_type: u8, code: u8, rest: [u8; 4], body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![icmp_type, code, 0, 0];
    bytes.extend_from_slice(&rest);
    bytes.extend_from_slice(body);
    let checksum = internet_checksum(&bytes);
    bytes[2..4].copy_from_slice(&checksum.to_be_bytes());
    bytes
}

/// `frame` with an 802.1Q tag (VLAN 100) inserted after the MAC addresses.
pub fn vlan_tagged(frame: &[u8]) -> Vec<u8> {
    let mut tagged = frame.get(..12).unwrap_or(frame).to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 100]);
    tagged.extend_from_slice(frame.get(12..).unwrap_or(&[]));
    tagged
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crafted_checksums_verify() {
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        let dccp = dccp(src, dst, (1, 2), b"abc");
        assert_eq!(pseudo_checksum(src, dst, proto::DCCP, &dccp), 0);
        let lite = udplite(src, dst, (1, 2), 0, b"abcde");
        assert_eq!(pseudo_checksum(src, dst, proto::UDPLITE, &lite), 0);
        assert_eq!(internet_checksum(&gre(true, b"xyz")), 0);
        assert_eq!(internet_checksum(&icmp(13, 0, [0, 7, 0, 1], &[0; 12])), 0);
    }

    #[test]
    fn words_are_big_endian_and_odd_bytes_high() {
        assert_eq!(word_sum(&[0xff, 0xff, 0, 1]), 0x1_0000);
        assert_eq!(word_sum(&[0x12]), 0x1200);
    }
}
