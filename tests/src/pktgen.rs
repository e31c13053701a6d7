//! Crafting Ethernet/IPv4 frames for `BPF_PROG_TEST_RUN`, with correct checksums computed by
//! the independent arithmetic in `check`.

use std::net::{Ipv4Addr, SocketAddrV4};

use super::check::internet_checksum;

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const SCTP: u8 = 132;
pub const GRE: u8 = 47;
/// IP protocol number of IPsec ESP.
pub const ESP: u8 = 50;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_FRAG_NEEDED: u8 = 4;
pub const ICMP_PORT_UNREACH: u8 = 3;

pub fn sock(text: &str) -> SocketAddrV4 {
    text.parse()
        .unwrap_or_else(|error| panic!("bad socket address {text}: {error}"))
}

pub fn addr(text: &str) -> Ipv4Addr {
    text.parse()
        .unwrap_or_else(|error| panic!("bad address {text}: {error}"))
}

#[derive(Clone, Debug)]
enum Transport {
    Tcp {
        flags: u8,
    },
    Udp {
        checksum: bool,
    },
    Sctp,
    IcmpEcho {
        request: bool,
        id: u16,
    },
    IcmpError {
        icmp_type: u8,
        code: u8,
        quoted: Vec<u8>,
    },
    Raw {
        protocol: u8,
    },
}

/// A packet to craft. Defaults: TTL 64, no options, not fragmented, a short payload.
#[derive(Clone, Debug)]
pub struct Packet {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    transport: Transport,
    payload: Vec<u8>,
    options: Vec<u8>,
    id: u16,
    more_fragments: bool,
    fragment_offset_units: u16,
    /// Raw bytes standing in for the transport header of a non-first fragment.
    fragment_body: Option<Vec<u8>>,
    /// TCP sequence number.
    tcp_seq: u32,
    /// TCP acknowledgement number, written only when the ACK flag is set.
    tcp_ack: u32,
}

impl Packet {
    fn new(src: SocketAddrV4, dst: SocketAddrV4, transport: Transport) -> Self {
        Self {
            src,
            dst,
            transport,
            payload: b"masq test payload".to_vec(),
            options: Vec::new(),
            id: 0x1234,
            more_fragments: false,
            fragment_offset_units: 0,
            fragment_body: None,
            tcp_seq: 1000,
            tcp_ack: 2000,
        }
    }

    pub fn tcp(src: &str, dst: &str, flags: u8) -> Self {
        Self::new(sock(src), sock(dst), Transport::Tcp { flags })
    }

    pub fn udp(src: &str, dst: &str) -> Self {
        Self::new(sock(src), sock(dst), Transport::Udp { checksum: true })
    }

    /// UDP with the checksum field zero ("no checksum").
    pub fn udp_without_checksum(src: &str, dst: &str) -> Self {
        Self::new(sock(src), sock(dst), Transport::Udp { checksum: false })
    }

    pub fn sctp(src: &str, dst: &str) -> Self {
        Self::new(sock(src), sock(dst), Transport::Sctp)
    }

    pub fn icmp_echo_request(src: &str, dst: &str, id: u16) -> Self {
        let transport = Transport::IcmpEcho { request: true, id };
        Self::new(
            SocketAddrV4::new(addr(src), 0),
            SocketAddrV4::new(addr(dst), 0),
            transport,
        )
    }

    pub fn icmp_echo_reply(src: &str, dst: &str, id: u16) -> Self {
        let transport = Transport::IcmpEcho { request: false, id };
        Self::new(
            SocketAddrV4::new(addr(src), 0),
            SocketAddrV4::new(addr(dst), 0),
            transport,
        )
    }

    /// An ICMP error quoting `quoted` (an IPv4 packet, typically truncated as routers do).
    pub fn icmp_error(src: &str, dst: &str, icmp_type: u8, code: u8, quoted: &[u8]) -> Self {
        let transport = Transport::IcmpError {
            icmp_type,
            code,
            quoted: quoted.to_vec(),
        };
        let mut packet = Self::new(
            SocketAddrV4::new(addr(src), 0),
            SocketAddrV4::new(addr(dst), 0),
            transport,
        );
        packet.payload.clear();
        packet
    }

    pub fn raw(src: &str, dst: &str, protocol: u8) -> Self {
        let transport = Transport::Raw { protocol };
        Self::new(
            SocketAddrV4::new(addr(src), 0),
            SocketAddrV4::new(addr(dst), 0),
            transport,
        )
    }

    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    /// TCP: the sequence number (default 1000).
    pub fn seq(mut self, seq: u32) -> Self {
        self.tcp_seq = seq;
        self
    }

    /// TCP: the acknowledgement number, sent when the ACK flag is set (default 2000).
    pub fn ack(mut self, ack: u32) -> Self {
        self.tcp_ack = ack;
        self
    }

    /// IPv4 options (padded to a multiple of 4 bytes with end-of-options).
    pub fn options(mut self, options: &[u8]) -> Self {
        let mut options = options.to_vec();
        while !options.len().is_multiple_of(4) {
            options.push(0);
        }
        self.options = options;
        self
    }

    pub fn ip_id(mut self, id: u16) -> Self {
        self.id = id;
        self
    }

    /// Marks this as the first fragment of a datagram (more fragments follow).
    pub fn first_fragment(mut self) -> Self {
        self.more_fragments = true;
        self.fragment_offset_units = 0;
        self
    }

    /// Turns this into a later fragment at `offset_units` * 8 bytes carrying `body`.
    pub fn later_fragment(mut self, offset_units: u16, more: bool, body: &[u8]) -> Self {
        self.more_fragments = more;
        self.fragment_offset_units = offset_units;
        self.fragment_body = Some(body.to_vec());
        self
    }

    pub fn protocol(&self) -> u8 {
        match &self.transport {
            Transport::Tcp { .. } => TCP,
            Transport::Udp { .. } => UDP,
            Transport::Sctp => SCTP,
            Transport::IcmpEcho { .. } | Transport::IcmpError { .. } => ICMP,
            Transport::Raw { protocol } => *protocol,
        }
    }

    fn transport_bytes(&self) -> Vec<u8> {
        if let Some(body) = &self.fragment_body {
            return body.clone();
        }
        let (src_port, dst_port) = (self.src.port().to_be_bytes(), self.dst.port().to_be_bytes());
        let mut bytes = match &self.transport {
            Transport::Tcp { flags } => {
                let mut header = vec![0u8; 20];
                header[0..2].copy_from_slice(&src_port);
                header[2..4].copy_from_slice(&dst_port);
                header[4..8].copy_from_slice(&self.tcp_seq.to_be_bytes());
                header[8..12].copy_from_slice(
                    &(if flags & TCP_ACK != 0 {
                        self.tcp_ack
                    } else {
                        0
                    })
                    .to_be_bytes(),
                );
                header[12] = 5 << 4;
                header[13] = *flags;
                header[14..16].copy_from_slice(&64_240u16.to_be_bytes());
                header.extend_from_slice(&self.payload);
                header
            }
            Transport::Udp { .. } => {
                let mut header = vec![0u8; 8];
                header[0..2].copy_from_slice(&src_port);
                header[2..4].copy_from_slice(&dst_port);
                let length = u16::try_from(8 + self.payload.len()).unwrap_or(u16::MAX);
                header[4..6].copy_from_slice(&length.to_be_bytes());
                header.extend_from_slice(&self.payload);
                header
            }
            Transport::Sctp => {
                let mut header = vec![0u8; 12];
                header[0..2].copy_from_slice(&src_port);
                header[2..4].copy_from_slice(&dst_port);
                header[4..8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
                // A CRC32c stand-in: masq must never touch it, which the tests check bytewise.
                header[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
                header.extend_from_slice(&self.payload);
                header
            }
            Transport::IcmpEcho { request, id } => {
                let mut header = vec![
                    if *request {
                        ICMP_ECHO_REQUEST
                    } else {
                        ICMP_ECHO_REPLY
                    },
                    0,
                    0,
                    0,
                ];
                header.extend_from_slice(&id.to_be_bytes());
                header.extend_from_slice(&7u16.to_be_bytes());
                header.extend_from_slice(&self.payload);
                header
            }
            Transport::IcmpError {
                icmp_type,
                code,
                quoted,
            } => {
                let mut header = vec![*icmp_type, *code, 0, 0, 0, 0];
                // Next-hop MTU for fragmentation-needed, zero otherwise.
                let mtu: u16 = if *icmp_type == ICMP_DEST_UNREACH && *code == ICMP_FRAG_NEEDED {
                    1280
                } else {
                    0
                };
                header.extend_from_slice(&mtu.to_be_bytes());
                header.extend_from_slice(quoted);
                header
            }
            Transport::Raw { .. } => self.payload.clone(),
        };
        let checksum = match &self.transport {
            Transport::Tcp { .. } => Some((16, pseudo_checksum(self, TCP, &bytes))),
            Transport::Udp { checksum: true } => {
                let value = pseudo_checksum(self, UDP, &bytes);
                Some((6, if value == 0 { 0xffff } else { value }))
            }
            Transport::IcmpEcho { .. } | Transport::IcmpError { .. } => {
                Some((2, internet_checksum(&bytes)))
            }
            _ => None,
        };
        if let Some((offset, value)) = checksum {
            bytes[offset..offset + 2].copy_from_slice(&value.to_be_bytes());
        }
        bytes
    }

    /// The IPv4 packet: header (with options and checksum) and transport bytes.
    pub fn ip_packet(&self) -> Vec<u8> {
        let transport = self.transport_bytes();
        let header_len = 20 + self.options.len();
        assert!(header_len <= 60, "IPv4 options too long");
        let total_len = u16::try_from(header_len + transport.len()).unwrap_or(u16::MAX);
        let mut header = vec![0u8; header_len];
        header[0] = 0x40 | u8::try_from(header_len / 4).unwrap_or(15);
        header[2..4].copy_from_slice(&total_len.to_be_bytes());
        header[4..6].copy_from_slice(&self.id.to_be_bytes());
        let mut frag = self.fragment_offset_units & 0x1fff;
        if self.more_fragments {
            frag |= 0x2000;
        }
        header[6..8].copy_from_slice(&frag.to_be_bytes());
        header[8] = 64;
        header[9] = self.protocol();
        header[12..16].copy_from_slice(&self.src.ip().octets());
        header[16..20].copy_from_slice(&self.dst.ip().octets());
        header[20..].copy_from_slice(&self.options);
        let checksum = internet_checksum(&header);
        header[10..12].copy_from_slice(&checksum.to_be_bytes());
        header.extend_from_slice(&transport);
        header
    }

    /// The Ethernet frame carrying the packet.
    pub fn frame(&self) -> Vec<u8> {
        ethernet(0x0800, &self.ip_packet())
    }
}

fn pseudo_checksum(packet: &Packet, protocol: u8, transport: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(12 + transport.len());
    pseudo.extend_from_slice(&packet.src.ip().octets());
    pseudo.extend_from_slice(&packet.dst.ip().octets());
    pseudo.push(0);
    pseudo.push(protocol);
    pseudo.extend_from_slice(
        &u16::try_from(transport.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    pseudo.extend_from_slice(transport);
    internet_checksum(&pseudo)
}

/// An Ethernet frame with the given ethertype.
pub fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An ARP request frame (not IP at all).
pub fn arp_frame() -> Vec<u8> {
    let mut body = vec![0, 1, 8, 0, 6, 4, 0, 1];
    body.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02, 10, 0, 0, 10]);
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 0, 0, 1]);
    ethernet(0x0806, &body)
}

/// A minimal IPv6 UDP frame (masq's datapath is IPv4 only and must leave it alone).
pub fn ipv6_frame() -> Vec<u8> {
    let mut packet = vec![0x60, 0, 0, 0, 0, 8, UDP, 64];
    packet.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    packet.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    packet.extend_from_slice(&[0x9c, 0x40, 0, 53, 0, 8, 0, 0]);
    ethernet(0x86dd, &packet)
}
