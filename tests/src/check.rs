//! Reading frames back and verifying every checksum from scratch, independently of the
//! datapath's incremental arithmetic.

use std::net::Ipv4Addr;

use super::pktgen::{ICMP, SCTP, TCP, UDP};

/// RFC 1071 checksum of `data`.
pub fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    for chunk in data.chunks(2) {
        let word = match chunk {
            [high, low] => u16::from_be_bytes([*high, *low]),
            [high] => u16::from_be_bytes([*high, 0]),
            _ => 0,
        };
        sum += u64::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The fields of an IPv4 packet the tests look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4View {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    pub header: Vec<u8>,
    /// Transport header and payload, as far as the total length says.
    pub transport: Vec<u8>,
}

impl Ipv4View {
    pub fn parse(packet: &[u8]) -> Self {
        assert!(packet.len() >= 20, "IPv4 packet of {} bytes", packet.len());
        assert_eq!(packet[0] >> 4, 4, "not IPv4");
        let header_len = usize::from(packet[0] & 0x0f) * 4;
        let total_len = usize::from(u16::from_be_bytes([packet[2], packet[3]])).min(packet.len());
        Self {
            src: Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]),
            dst: Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]),
            protocol: packet[9],
            header: packet[..header_len].to_vec(),
            transport: packet[header_len..total_len].to_vec(),
        }
    }

    /// Parses the IPv4 packet of an Ethernet frame.
    pub fn of_frame(frame: &[u8]) -> Self {
        assert_eq!(&frame[12..14], &[0x08, 0x00], "not an IPv4 frame");
        Self::parse(&frame[14..])
    }

    pub fn src_port(&self) -> u16 {
        u16::from_be_bytes([self.transport[0], self.transport[1]])
    }

    pub fn dst_port(&self) -> u16 {
        u16::from_be_bytes([self.transport[2], self.transport[3]])
    }

    pub fn icmp_id(&self) -> u16 {
        u16::from_be_bytes([self.transport[4], self.transport[5]])
    }

    pub fn transport_checksum_field(&self) -> u16 {
        let offset = match self.protocol {
            TCP => 16,
            UDP => 6,
            _ => 2,
        };
        u16::from_be_bytes([self.transport[offset], self.transport[offset + 1]])
    }

    fn is_later_fragment(&self) -> bool {
        u16::from_be_bytes([self.header[6], self.header[7]]) & 0x1fff != 0
    }

    fn is_fragmented(&self) -> bool {
        u16::from_be_bytes([self.header[6], self.header[7]]) & 0x3fff != 0
    }

    /// The packet quoted by an ICMP error.
    pub fn quoted(&self) -> Ipv4View {
        assert_eq!(self.protocol, ICMP);
        Self::parse(&self.transport[8..])
    }

    fn pseudo_header_sum_ok(&self) -> bool {
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&self.src.octets());
        pseudo.extend_from_slice(&self.dst.octets());
        pseudo.push(0);
        pseudo.push(self.protocol);
        pseudo.extend_from_slice(
            &u16::try_from(self.transport.len())
                .unwrap_or(u16::MAX)
                .to_be_bytes(),
        );
        pseudo.extend_from_slice(&self.transport);
        internet_checksum(&pseudo) == 0
    }

    /// Asserts that every checksum of the packet verifies: the IPv4 header, the transport
    /// checksum (UDP may carry none), and for ICMP errors the quoted IPv4 header and the quoted
    /// transport checksum when the quote is complete.
    pub fn assert_checksums(&self, context: &str) {
        assert_eq!(
            internet_checksum(&self.header),
            0,
            "{context}: IPv4 header checksum"
        );
        if self.is_fragmented() {
            // The transport checksum covers the whole datagram, not one fragment.
            return;
        }
        match self.protocol {
            TCP => assert!(self.pseudo_header_sum_ok(), "{context}: TCP checksum"),
            UDP if self.transport_checksum_field() == 0 => {}
            UDP => assert!(self.pseudo_header_sum_ok(), "{context}: UDP checksum"),
            ICMP => {
                assert_eq!(
                    internet_checksum(&self.transport),
                    0,
                    "{context}: ICMP checksum"
                );
                let icmp_type = self.transport[0];
                if matches!(icmp_type, 3 | 4 | 5 | 11 | 12) {
                    let quoted = self.quoted();
                    assert_eq!(
                        internet_checksum(&quoted.header),
                        0,
                        "{context}: quoted IPv4 checksum"
                    );
                    let declared =
                        usize::from(u16::from_be_bytes([quoted.header[2], quoted.header[3]]));
                    let complete = quoted.header.len() + quoted.transport.len() >= declared;
                    if complete && !quoted.is_later_fragment() && quoted.protocol != SCTP {
                        quoted.assert_checksums(&format!("{context}: quoted packet"));
                    }
                }
            }
            _ => {}
        }
    }
}
