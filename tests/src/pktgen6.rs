//! Crafting Ethernet/IPv6 frames for `BPF_PROG_TEST_RUN`, and reading them back with every
//! checksum verified from scratch (independently of the datapath's incremental arithmetic).

use std::net::Ipv6Addr;

use super::{
    check::internet_checksum,
    pktgen::{TCP, UDP, ethernet},
};

/// IPv6 next-header value of ICMPv6.
pub const ICMPV6: u8 = 58;
/// IPv6 next-header values of extension headers.
pub const HOP_BY_HOP: u8 = 0;
pub const ROUTING: u8 = 43;
pub const FRAGMENT: u8 = 44;
pub const DESTINATION_OPTIONS: u8 = 60;

pub const ICMPV6_DEST_UNREACH: u8 = 1;
pub const ICMPV6_PACKET_TOO_BIG: u8 = 2;
pub const ICMPV6_ECHO_REQUEST: u8 = 128;
pub const ICMPV6_ECHO_REPLY: u8 = 129;
pub const ICMPV6_NEIGHBOUR_SOLICITATION: u8 = 135;

pub fn addr6(text: &str) -> Ipv6Addr {
    text.parse()
        .unwrap_or_else(|error| panic!("bad IPv6 address {text}: {error}"))
}

/// An IPv6 packet to craft: its transport header and payload are given whole, and its
/// checksum (at `checksum_at` within them, if any) is computed over the IPv6 pseudo-header.
#[derive(Clone, Debug)]
pub struct Packet6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// The transport protocol (the last next-header value).
    pub protocol: u8,
    /// Extension headers in order, each as (its type, its bytes including the next-header
    /// byte, which is filled in).
    pub extensions: Vec<(u8, Vec<u8>)>,
    /// Transport header and payload.
    pub transport: Vec<u8>,
    /// Where the transport checksum sits in `transport`.
    pub checksum_at: Option<usize>,
}

impl Packet6 {
    fn new(src: &str, dst: &str, protocol: u8, transport: Vec<u8>, checksum_at: usize) -> Self {
        Self {
            src: addr6(src),
            dst: addr6(dst),
            protocol,
            extensions: Vec::new(),
            transport,
            checksum_at: Some(checksum_at),
        }
    }

    pub fn tcp(src: &str, src_port: u16, dst: &str, dst_port: u16, flags: u8) -> Self {
        let mut header = Vec::new();
        header.extend_from_slice(&src_port.to_be_bytes());
        header.extend_from_slice(&dst_port.to_be_bytes());
        header.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        header.extend_from_slice(b"masq v6 payload");
        Self::new(src, dst, TCP, header, 16)
    }

    /// TCP: the sequence and acknowledgement numbers (defaults 1 and 0).
    pub fn numbers(mut self, seq: u32, ack: u32) -> Self {
        assert_eq!(self.protocol, TCP, "sequence numbers are TCP's");
        self.transport[4..8].copy_from_slice(&seq.to_be_bytes());
        self.transport[8..12].copy_from_slice(&ack.to_be_bytes());
        self
    }

    /// TCP: the segment without payload.
    pub fn without_payload(mut self) -> Self {
        assert_eq!(self.protocol, TCP, "only TCP segments are cut here");
        self.transport.truncate(20);
        self
    }

    pub fn udp(src: &str, src_port: u16, dst: &str, dst_port: u16) -> Self {
        let payload = b"masq v6 datagram";
        let length = u16::try_from(8 + payload.len()).unwrap_or(u16::MAX);
        let mut header = Vec::new();
        header.extend_from_slice(&src_port.to_be_bytes());
        header.extend_from_slice(&dst_port.to_be_bytes());
        header.extend_from_slice(&length.to_be_bytes());
        header.extend_from_slice(&[0, 0]);
        header.extend_from_slice(payload);
        Self::new(src, dst, UDP, header, 6)
    }

    pub fn icmp(src: &str, dst: &str, icmp_type: u8, code: u8, body: &[u8]) -> Self {
        let mut message = vec![icmp_type, code, 0, 0];
        message.extend_from_slice(body);
        Self::new(src, dst, ICMPV6, message, 2)
    }

    pub fn echo(src: &str, dst: &str, request: bool, id: u16) -> Self {
        let mut body = id.to_be_bytes().to_vec();
        body.extend_from_slice(&[0, 1]);
        body.extend_from_slice(b"ping6");
        let icmp_type = if request {
            ICMPV6_ECHO_REQUEST
        } else {
            ICMPV6_ECHO_REPLY
        };
        Self::icmp(src, dst, icmp_type, 0, &body)
    }

    /// Adds an extension header of type `kind` (8 bytes, or a fragment header).
    pub fn with_extension(mut self, kind: u8, bytes: &[u8]) -> Self {
        self.extensions.push((kind, bytes.to_vec()));
        self
    }

    /// The IPv6 packet, checksum computed.
    pub fn packet(&self) -> Vec<u8> {
        let mut transport = self.transport.clone();
        if let Some(at) = self.checksum_at {
            transport[at] = 0;
            transport[at + 1] = 0;
            let sum = checksum6(self.src, self.dst, self.protocol, &transport);
            transport[at..at + 2].copy_from_slice(&sum.to_be_bytes());
        }
        let mut chain = Vec::new();
        let kinds: Vec<u8> = self
            .extensions
            .iter()
            .map(|(kind, _)| *kind)
            .chain([self.protocol])
            .collect();
        for (index, (_, bytes)) in self.extensions.iter().enumerate() {
            let mut bytes = bytes.clone();
            bytes[0] = kinds[index + 1];
            chain.extend_from_slice(&bytes);
        }
        let payload_len = u16::try_from(chain.len() + transport.len()).unwrap_or(u16::MAX);
        let mut packet = vec![0x60, 0, 0, 0];
        packet.extend_from_slice(&payload_len.to_be_bytes());
        packet.push(kinds[0]);
        packet.push(64);
        packet.extend_from_slice(&self.src.octets());
        packet.extend_from_slice(&self.dst.octets());
        packet.extend_from_slice(&chain);
        packet.extend_from_slice(&transport);
        packet
    }

    /// The Ethernet frame.
    pub fn frame(&self) -> Vec<u8> {
        ethernet(0x86dd, &self.packet())
    }
}

/// The checksum of `transport` over the IPv6 pseudo-header (RFC 8200 section 8.1).
pub fn checksum6(src: Ipv6Addr, dst: Ipv6Addr, protocol: u8, transport: &[u8]) -> u16 {
    let mut data = Vec::new();
    data.extend_from_slice(&src.octets());
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&u32::try_from(transport.len()).unwrap_or(0).to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, protocol]);
    data.extend_from_slice(transport);
    internet_checksum(&data)
}

/// The parts of an IPv6 frame the tests look at (no extension headers: the frames the tests
/// read back have none, or the test reads `transport` after them itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6View {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// The next-header value of the fixed header.
    pub next_header: u8,
    /// Everything after the fixed header.
    pub payload: Vec<u8>,
}

impl Ipv6View {
    pub fn of_frame(frame: &[u8]) -> Self {
        assert_eq!(&frame[12..14], &[0x86, 0xdd], "not an IPv6 frame");
        let packet = &frame[14..];
        assert_eq!(packet[0] >> 4, 6, "not IPv6");
        let octets = |range: std::ops::Range<usize>| {
            let mut address = [0u8; 16];
            address.copy_from_slice(&packet[range]);
            Ipv6Addr::from(address)
        };
        Self {
            src: octets(8..24),
            dst: octets(24..40),
            next_header: packet[6],
            payload: packet[40..].to_vec(),
        }
    }

    /// Source and destination ports (or the ICMPv6 identifier as the first) of a packet
    /// without extension headers.
    pub fn ports(&self) -> (u16, u16) {
        match self.next_header {
            ICMPV6 => (u16::from_be_bytes([self.payload[4], self.payload[5]]), 0),
            _ => (
                u16::from_be_bytes([self.payload[0], self.payload[1]]),
                u16::from_be_bytes([self.payload[2], self.payload[3]]),
            ),
        }
    }

    /// Asserts that the transport checksum (TCP, UDP, ICMPv6; no extension headers) is right
    /// for the addresses the packet now carries.
    pub fn assert_checksum(&self, context: &str) {
        assert_eq!(
            checksum6(self.src, self.dst, self.next_header, &self.payload),
            0,
            "{context}: transport checksum wrong after translation"
        );
    }
}
