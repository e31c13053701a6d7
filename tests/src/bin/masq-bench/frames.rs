//! The frames the generator sends: small UDP packets from a pod, one flow per id.

use std::net::Ipv4Addr;

use masq_testbed::{check::internet_checksum, pktgen::UDP};

use crate::tx::{FRAME_LEN, Frame};

/// Where traffic that must be masqueraded goes: the node routes it out of its uplink to a
/// neighbour that does not exist, so the packets cost the node its full work and then as little
/// as possible (see `paths`). It is in no non-masquerade CIDR of any config the bench writes.
pub(crate) const SINK: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 77);
/// Where traffic that keeps its source goes: inside 10.0.0.0/8, the first CIDR of every config
/// the bench writes, so iptables leaves the chain at its second rule. It ends like [`SINK`].
pub(crate) const EXEMPT_SINK: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 77);

/// The link-layer addresses a frame needs to be taken by the node as routed traffic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Link {
    /// The pod's own interface.
    pub(crate) source: [u8; 6],
    /// The node's side of the pod's veth (the pod's gateway).
    pub(crate) gateway: [u8; 6],
    /// The pod's address.
    pub(crate) pod: Ipv4Addr,
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

/// The UDP frame of flow `id` to `destination`, checksums included.
pub(crate) fn udp(link: &Link, destination: Ipv4Addr, id: u64) -> Frame {
    let (source_port, destination_port) = ports(id);
    let mut frame = [0u8; FRAME_LEN];
    frame[0..6].copy_from_slice(&link.gateway);
    frame[6..12].copy_from_slice(&link.source);
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = FRAME_LEN - 14;
    let udp_len = ip_len - 20;
    let ip = &mut frame[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&u16::try_from(ip_len).unwrap_or(0).to_be_bytes());
    ip[8] = 64;
    ip[9] = UDP;
    ip[12..16].copy_from_slice(&link.pod.octets());
    ip[16..20].copy_from_slice(&destination.octets());
    let checksum = internet_checksum(ip);
    ip[10..12].copy_from_slice(&checksum.to_be_bytes());
    let udp = &mut frame[34..];
    udp[0..2].copy_from_slice(&source_port.to_be_bytes());
    udp[2..4].copy_from_slice(&destination_port.to_be_bytes());
    udp[4..6].copy_from_slice(&u16::try_from(udp_len).unwrap_or(0).to_be_bytes());
    udp[8..].copy_from_slice(b"masq bench payload");
    // A real checksum, so the datapath does the checksum update a pod's packet needs.
    let mut pseudo = Vec::with_capacity(12 + udp_len);
    pseudo.extend_from_slice(&link.pod.octets());
    pseudo.extend_from_slice(&destination.octets());
    pseudo.extend_from_slice(&[0, UDP]);
    pseudo.extend_from_slice(&u16::try_from(udp_len).unwrap_or(0).to_be_bytes());
    pseudo.extend_from_slice(&frame[34..]);
    let checksum = match internet_checksum(&pseudo) {
        0 => 0xffff,
        value => value,
    };
    frame[40..42].copy_from_slice(&checksum.to_be_bytes());
    frame
}

/// The frames of flows `ids` to `destination`.
pub(crate) fn udp_flows(
    link: &Link,
    destination: Ipv4Addr,
    ids: impl Iterator<Item = u64>,
) -> Vec<Frame> {
    ids.map(|id| udp(link, destination, id)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use masq_testbed::check::Ipv4View;

    #[test]
    fn frames_carry_valid_checksums() {
        let link = Link {
            source: [2, 0, 0, 0, 0, 1],
            gateway: [2, 0, 0, 0, 0, 2],
            pod: Ipv4Addr::new(10, 244, 1, 2),
        };
        let frame = udp(&link, SINK, 70_000);
        assert_eq!(internet_checksum(&frame[14..34]), 0);
        let view = Ipv4View::parse(&frame[14..]);
        assert_eq!(view.dst, SINK);
        let (source, destination) = ports(70_000);
        assert_eq!(u16::from_be_bytes([frame[34], frame[35]]), source);
        assert_eq!(u16::from_be_bytes([frame[36], frame[37]]), destination);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&view.src.octets());
        pseudo.extend_from_slice(&view.dst.octets());
        pseudo.extend_from_slice(&[0, UDP, 0, 26]);
        pseudo.extend_from_slice(&frame[34..]);
        assert_eq!(internet_checksum(&pseudo), 0);
    }

    #[test]
    fn flow_ids_are_distinct_tuples() {
        let mut seen = std::collections::HashSet::new();
        for id in 0..300_000 {
            assert!(seen.insert(ports(id)));
        }
    }
}
