//! The frames the generator sends: small UDP packets from a pod, one flow per id, in either
//! address family.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use masq_testbed::{
    check::internet_checksum,
    pktgen::UDP,
    sandbox::{OUTSIDE_IP, OUTSIDE_IPV6, pod_ip, pod_ipv6},
};

/// Where IPv4 traffic that must be masqueraded goes: the node routes it out of its uplink to a
/// neighbour that does not exist, so the packets cost the node its full work and then as little
/// as possible (see `paths`). It is in no non-masquerade CIDR of any config the bench writes.
pub(crate) const SINK: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 77);
/// Where IPv4 traffic that keeps its source goes: inside 10.0.0.0/8, the first CIDR of every
/// config the bench writes, so iptables leaves the chain at its second rule. It ends like
/// [`SINK`].
pub(crate) const EXEMPT_SINK: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 77);
/// [`SINK`] of the IPv6 section: in no IPv6 network of the sandbox or of any config.
pub(crate) const SINK_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x77, 0, 0, 0, 0, 0x77);
/// [`EXEMPT_SINK`] of the IPv6 section: inside 2001:db8:a::/48, the first IPv6 CIDR of every
/// config of that section.
pub(crate) const EXEMPT_SINK_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 0x77);

/// Length of an IPv4 frame: Ethernet, IPv4 and UDP headers and an 18-byte payload, the
/// smallest Ethernet frame (64 bytes on a wire with its FCS).
const FRAME_LEN_V4: usize = 60;
/// Length of an IPv6 frame: Ethernet, IPv6 and UDP headers and no payload, the smallest UDP
/// frame IPv6 allows (66 bytes on a wire).
const FRAME_LEN_V6: usize = 62;

/// The address family of a part of the bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    /// Both, in report order.
    pub(crate) const ALL: [Self; 2] = [Self::V4, Self::V6];

    /// The name in reports and on the command line.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// Where masqueraded generator traffic goes.
    pub(crate) fn sink(self) -> IpAddr {
        match self {
            Self::V4 => SINK.into(),
            Self::V6 => SINK_V6.into(),
        }
    }

    /// Where generator traffic that keeps its source goes.
    pub(crate) fn exempt_sink(self) -> IpAddr {
        match self {
            Self::V4 => EXEMPT_SINK.into(),
            Self::V6 => EXEMPT_SINK_V6.into(),
        }
    }

    /// The sandbox's outside host (the TCP tests' server).
    pub(crate) fn outside(self) -> IpAddr {
        match self {
            Self::V4 => OUTSIDE_IP.into(),
            Self::V6 => OUTSIDE_IPV6.into(),
        }
    }

    /// The sandbox's pod `index` (1-based).
    pub(crate) fn pod(self, index: usize) -> IpAddr {
        match self {
            Self::V4 => pod_ip(index).into(),
            Self::V6 => pod_ipv6(index).into(),
        }
    }
}

/// One prebuilt frame (60 bytes for IPv4, 62 for IPv6).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Frame {
    bytes: [u8; FRAME_LEN_V6],
    len: usize,
}

impl std::ops::Deref for Frame {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl AsRef<[u8]> for Frame {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// The link-layer addresses a frame needs to be taken by the node as routed traffic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    /// The pod's own interface.
    pub(crate) source: [u8; 6],
    /// The node's side of the pod's veth (the pod's gateway).
    pub(crate) gateway: [u8; 6],
    /// The pod's address, of the family of the frames sent.
    pub(crate) pod: IpAddr,
}

/// The ports of flow `id`. Destination ports vary fastest, so every remote endpoint holds few
/// flows: port allocation (masq's, and MASQUERADE's) never runs short of ports for one endpoint,
/// as on a node whose pods talk to many services.
pub(crate) fn ports(id: u64) -> (u16, u16) {
    let destination = 1 + id % 65_535;
    let source = 1024 + (id / 65_535) % 64_512;
    (
        u16::try_from(source).unwrap_or(u16::MAX),
        u16::try_from(destination).unwrap_or(u16::MAX),
    )
}

/// The bytes of `address`, 4 or 16.
fn octets(address: IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(address) => address.octets().to_vec(),
        IpAddr::V6(address) => address.octets().to_vec(),
    }
}

/// The UDP frame of flow `id` from the pod to `destination`, checksums included. The pod's
/// address in `link` must be of `destination`'s family.
pub(crate) fn udp(link: &Link, destination: IpAddr, id: u64) -> Frame {
    let (source, target) = (octets(link.pod), octets(destination));
    debug_assert_eq!(source.len(), target.len(), "a frame mixing families");
    let (len, ethertype, ip_len) = match destination {
        IpAddr::V4(_) => (FRAME_LEN_V4, 0x0800u16, 20),
        IpAddr::V6(_) => (FRAME_LEN_V6, 0x86dd, 40),
    };
    let mut frame = Frame {
        bytes: [0; FRAME_LEN_V6],
        len,
    };
    let bytes = &mut frame.bytes[..len];
    bytes[0..6].copy_from_slice(&link.gateway);
    bytes[6..12].copy_from_slice(&link.source);
    bytes[12..14].copy_from_slice(&ethertype.to_be_bytes());
    let udp_len = len - 14 - ip_len;
    let udp_len_field = u16::try_from(udp_len).unwrap_or(0).to_be_bytes();
    let ip = &mut bytes[14..14 + ip_len];
    match destination {
        IpAddr::V4(_) => {
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&u16::try_from(ip_len + udp_len).unwrap_or(0).to_be_bytes());
            ip[8] = 64;
            ip[9] = UDP;
            ip[12..16].copy_from_slice(&source);
            ip[16..20].copy_from_slice(&target);
            let checksum = internet_checksum(ip);
            ip[10..12].copy_from_slice(&checksum.to_be_bytes());
        }
        IpAddr::V6(_) => {
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&udp_len_field);
            ip[6] = UDP;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&source);
            ip[24..40].copy_from_slice(&target);
        }
    }
    let (source_port, destination_port) = ports(id);
    let udp = &mut bytes[14 + ip_len..];
    udp[0..2].copy_from_slice(&source_port.to_be_bytes());
    udp[2..4].copy_from_slice(&destination_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len_field);
    let payload = b"masq bench payload";
    let room = udp.len() - 8;
    udp[8..].copy_from_slice(&payload[..room.min(payload.len())]);
    // A real checksum, so the datapath does the checksum update a pod's packet needs. The
    // pseudo-header's words add up alike in both families (IPv6's 32-bit length and next
    // header are IPv4's protocol and 16-bit length padded with zeros).
    let mut pseudo = Vec::with_capacity(40 + udp_len);
    pseudo.extend_from_slice(&source);
    pseudo.extend_from_slice(&target);
    pseudo.extend_from_slice(&[0, UDP]);
    pseudo.extend_from_slice(&udp_len_field);
    pseudo.extend_from_slice(udp);
    let checksum = match internet_checksum(&pseudo) {
        0 => 0xffff,
        value => value,
    };
    udp[6..8].copy_from_slice(&checksum.to_be_bytes());
    frame
}

/// The frames of flows `ids` to `destination`.
pub(crate) fn udp_flows(
    link: &Link,
    destination: IpAddr,
    ids: impl Iterator<Item = u64>,
) -> Vec<Frame> {
    ids.map(|id| udp(link, destination, id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use masq_testbed::check::Ipv4View;

    fn link(family: Family) -> Link {
        Link {
            source: [2, 0, 0, 0, 0, 1],
            gateway: [2, 0, 0, 0, 0, 2],
            pod: family.pod(1),
        }
    }

    /// The UDP checksum of `frame` verified from scratch, with the pseudo-header of each
    /// family written out as its RFC has it.
    fn udp_checksum_holds(frame: &[u8], family: Family) -> bool {
        let mut pseudo = Vec::new();
        let udp = match family {
            Family::V4 => {
                pseudo.extend_from_slice(&frame[26..34]);
                pseudo.extend_from_slice(&[0, UDP]);
                pseudo.extend_from_slice(&frame[38..40]);
                &frame[34..]
            }
            Family::V6 => {
                pseudo.extend_from_slice(&frame[22..54]);
                pseudo.extend_from_slice(&[0, 0]);
                pseudo.extend_from_slice(&frame[58..60]);
                pseudo.extend_from_slice(&[0, 0, 0, UDP]);
                &frame[54..]
            }
        };
        pseudo.extend_from_slice(udp);
        internet_checksum(&pseudo) == 0
    }

    #[test]
    fn ipv4_frames_carry_valid_checksums() {
        let frame = udp(&link(Family::V4), SINK.into(), 70_000);
        assert_eq!(frame.len(), 60);
        assert_eq!(internet_checksum(&frame[14..34]), 0);
        let view = Ipv4View::parse(&frame[14..]);
        assert_eq!(view.dst, SINK);
        let (source, destination) = ports(70_000);
        assert_eq!(u16::from_be_bytes([frame[34], frame[35]]), source);
        assert_eq!(u16::from_be_bytes([frame[36], frame[37]]), destination);
        assert_eq!(&frame[38..40], &[0, 26]);
        assert!(udp_checksum_holds(&frame, Family::V4));
    }

    #[test]
    fn ipv6_frames_are_the_smallest_valid_udp() {
        let frame = udp(&link(Family::V6), SINK_V6.into(), 70_000);
        assert_eq!(frame.len(), 62);
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        assert_eq!(frame[14] >> 4, 6);
        // Payload length (just the UDP header), next header UDP.
        assert_eq!(&frame[18..21], &[0, 8, UDP]);
        assert_eq!(&frame[22..38], &pod_ipv6(1).octets());
        assert_eq!(&frame[38..54], &SINK_V6.octets());
        let (source, destination) = ports(70_000);
        assert_eq!(u16::from_be_bytes([frame[54], frame[55]]), source);
        assert_eq!(u16::from_be_bytes([frame[56], frame[57]]), destination);
        assert_eq!(&frame[58..60], &[0, 8]);
        assert!(udp_checksum_holds(&frame, Family::V6));
    }

    #[test]
    fn flow_ids_are_distinct_tuples() {
        let mut seen = std::collections::HashSet::new();
        for id in 0..300_000 {
            assert!(seen.insert(ports(id)));
        }
    }
}
