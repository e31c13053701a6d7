//! Netfilter's connection tracking table over netlink (`NETLINK_NETFILTER`, the conntrack
//! subsystem): reading its entries and deleting one.
//!
//! Messages are built and read with `netlink-packet-netfilter` and sent on the
//! [`super::netlink`] socket. What an entry says is handed on as a [`ConntrackEntry`]; which
//! entries matter to masq is `node::conntrack`'s business.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use netlink_packet_core::{DecodeError, ParseableParametrized as _};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Status, Tuple},
};
use nix::errno::Errno;

use super::netlink::{Family, NetlinkError, NetlinkSocket, errno_with_text};

/// How long to wait for the kernel's answer: it answers at once (a dump datagram by datagram,
/// as they are read), so silence means something is badly wrong, and the agent must not hang
/// on it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why conntrack could not be read or changed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The netlink socket failed.
    #[error("reading conntrack over netlink")]
    Socket(#[source] io::Error),
    /// The kernel refused the request.
    #[error("the kernel refused the conntrack dump")]
    Refused(#[source] io::Error),
    /// A reply could not be parsed.
    #[error("an unreadable conntrack reply: {0}")]
    Decode(String),
}

impl From<NetlinkError> for ConntrackError {
    fn from(error: NetlinkError) -> Self {
        match error {
            NetlinkError::Refused { errno, message } => {
                Self::Refused(errno_with_text(errno, message))
            }
            NetlinkError::Malformed(what) => Self::Decode(what),
            error @ (NetlinkError::Socket { .. } | NetlinkError::Interrupted { .. }) => {
                Self::Socket(io::Error::other(error))
            }
        }
    }
}

/// One direction of a tracked connection, as conntrack keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlowTuple {
    /// IP protocol number.
    pub(crate) protocol: u8,
    /// Where the packets come from.
    pub(crate) source: SocketAddr,
    /// Where they go.
    pub(crate) destination: SocketAddr,
}

/// What a conntrack entry says about its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConntrackEntry {
    /// The connection as its first packet went.
    pub(crate) original: FlowTuple,
    /// The connection's replies as they come back, translations applied.
    pub(crate) reply: FlowTuple,
    /// Netfilter translates its source (`IPS_SRC_NAT`).
    pub(crate) source_nat: bool,
    /// Netfilter translates its destination (`IPS_DST_NAT`).
    pub(crate) destination_nat: bool,
    /// A reply has been seen (`IPS_SEEN_REPLY`).
    pub(crate) replied: bool,
}

/// The netfilter family of IPv6 (or IPv4) connections.
const fn family(ipv6: bool) -> NetfilterProtoFamily {
    if ipv6 {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    }
}

/// A conntrack request about connections of `family`.
fn request(family: NetfilterProtoFamily, message: ConntrackMessage) -> NetfilterMessage {
    NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message)
}

/// What `keep` makes of each IPv6 (or IPv4) entry of the table. A kernel without conntrack
/// (the module not loaded: no netfilter NAT either) has none.
pub(crate) fn dump<T>(
    ipv6: bool,
    mut keep: impl FnMut(ConntrackEntry) -> Option<T>,
) -> Result<Vec<T>, ConntrackError> {
    let mut socket = NetlinkSocket::open(Family::Netfilter, REPLY_TIMEOUT)?;
    let dumped = socket.dump(
        || request(family(ipv6), ConntrackMessage::Get(Vec::new())),
        |message_type, payload| Ok(parse_entry(message_type, payload)?.and_then(&mut keep)),
    );
    match dumped {
        // No conntrack in this kernel: nothing is translated by it.
        Err(NetlinkError::Refused {
            errno: Errno::ENOENT | Errno::EOPNOTSUPP,
            ..
        }) => Ok(Vec::new()),
        dumped => Ok(dumped?),
    }
}

/// Deletes the entry whose original direction is `original`, so that netfilter neither
/// translates its packets nor reverses its replies any more. An entry that is already gone is
/// no error.
pub(crate) fn delete(original: &FlowTuple) -> Result<(), ConntrackError> {
    let tuple = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(original.source.ip()),
            IPTuple::DestinationAddress(original.destination.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(original.protocol.into()),
            ProtoTuple::SourcePort(original.source.port()),
            ProtoTuple::DestinationPort(original.destination.port()),
        ]),
    ];
    let mut socket = NetlinkSocket::open(Family::Netfilter, REPLY_TIMEOUT)?;
    let deleted = socket.acknowledged(0, || {
        request(
            family(original.source.is_ipv6()),
            ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(tuple.clone())]),
        )
    });
    match deleted {
        Err(NetlinkError::Refused {
            errno: Errno::ENOENT,
            ..
        }) => Ok(()),
        deleted => Ok(deleted?),
    }
}

/// The entry a message of the dump describes; `None` for another message, or an entry
/// without its status or either tuple.
fn parse_entry(message_type: u16, payload: &[u8]) -> Result<Option<ConntrackEntry>, DecodeError> {
    let message = NetfilterMessage::parse_with_param(payload, message_type)?;
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)) = message.inner else {
        return Ok(None);
    };
    Ok(entry(&attributes))
}

/// The entry `attributes` describe, if they hold its status and both tuples.
fn entry(attributes: &[ConntrackAttribute]) -> Option<ConntrackEntry> {
    let status = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaStatus(status) => Some(*status),
        _ => None,
    })?;
    let original = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaTupleOrig(tuple) => Some(tuple),
        _ => None,
    })?;
    let reply = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaTupleReply(tuple) => Some(tuple),
        _ => None,
    })?;
    Some(ConntrackEntry {
        original: flow_tuple(original)?,
        reply: flow_tuple(reply)?,
        source_nat: status.contains(Status::SrcNat),
        destination_nat: status.contains(Status::DstNat),
        replied: status.contains(Status::SeenReply),
    })
}

/// A tuple's protocol, addresses and ports, if it has them all.
fn flow_tuple(tuple: &[Tuple]) -> Option<FlowTuple> {
    let (source, destination) = addresses(tuple)?;
    let (protocol, source_port, destination_port) = ports(tuple)?;
    Some(FlowTuple {
        protocol,
        source: SocketAddr::new(source, source_port),
        destination: SocketAddr::new(destination, destination_port),
    })
}

/// A tuple's source and destination addresses.
fn addresses(tuple: &[Tuple]) -> Option<(IpAddr, IpAddr)> {
    let ip = tuple.iter().find_map(|part| match part {
        Tuple::Ip(ip) => Some(ip),
        _ => None,
    })?;
    let source = ip.iter().find_map(|part| match part {
        IPTuple::SourceAddress(address) => Some(*address),
        _ => None,
    })?;
    let destination = ip.iter().find_map(|part| match part {
        IPTuple::DestinationAddress(address) => Some(*address),
        _ => None,
    })?;
    Some((source, destination))
}

/// A tuple's protocol number and source and destination ports.
fn ports(tuple: &[Tuple]) -> Option<(u8, u16, u16)> {
    let proto = tuple.iter().find_map(|part| match part {
        Tuple::Proto(proto) => Some(proto),
        _ => None,
    })?;
    let protocol = proto.iter().find_map(|part| match part {
        ProtoTuple::Protocol(protocol) => Some(u8::from(*protocol)),
        _ => None,
    })?;
    let source = proto.iter().find_map(|part| match part {
        ProtoTuple::SourcePort(port) => Some(*port),
        _ => None,
    })?;
    let destination = proto.iter().find_map(|part| match part {
        ProtoTuple::DestinationPort(port) => Some(*port),
        _ => None,
    })?;
    Some((protocol, source, destination))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use netlink_packet_core::{NLM_F_MULTIPART, NLMSG_DONE, NLMSG_ERROR, NetlinkSerializable};
    use netlink_packet_netfilter::conntrack::Protocol;

    use super::*;
    use crate::sys::netlink::{
        Answer, read_datagram,
        tests::{SEQ, message},
    };

    fn tuple(src: [u8; 4], dst: [u8; 4], protocol: Protocol, ports: (u16, u16)) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(Ipv4Addr::from(src).into()),
                IPTuple::DestinationAddress(Ipv4Addr::from(dst).into()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(protocol),
                ProtoTuple::SourcePort(ports.0),
                ProtoTuple::DestinationPort(ports.1),
            ]),
        ]
    }

    fn attributes(status: Status) -> Vec<ConntrackAttribute> {
        vec![
            ConntrackAttribute::CtaTupleOrig(tuple(
                [10, 244, 1, 2],
                [198, 51, 100, 10],
                Protocol::Tcp,
                (40_000, 443),
            )),
            ConntrackAttribute::CtaTupleReply(tuple(
                [198, 51, 100, 10],
                [192, 0, 2, 1],
                Protocol::Tcp,
                (443, 12_599),
            )),
            ConntrackAttribute::CtaStatus(status),
        ]
    }

    fn address(octets: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::from(octets).into(), port)
    }

    #[test]
    fn an_entry_is_read_with_both_directions_and_its_status() {
        assert_eq!(
            entry(&attributes(
                Status::SrcNat | Status::SeenReply | Status::Confirmed
            )),
            Some(ConntrackEntry {
                original: FlowTuple {
                    protocol: 6,
                    source: address([10, 244, 1, 2], 40_000),
                    destination: address([198, 51, 100, 10], 443),
                },
                reply: FlowTuple {
                    protocol: 6,
                    source: address([198, 51, 100, 10], 443),
                    destination: address([192, 0, 2, 1], 12_599),
                },
                source_nat: true,
                destination_nat: false,
                replied: true,
            })
        );
        let translated_both_ways = entry(&attributes(Status::SrcNat | Status::DstNat));
        assert_eq!(
            translated_both_ways.map(|entry| (
                entry.source_nat,
                entry.destination_nat,
                entry.replied
            )),
            Some((true, true, false))
        );
    }

    #[test]
    fn an_entry_without_its_status_or_a_tuple_is_not_read() {
        assert_eq!(entry(&[]), None);
        let mut without_status = attributes(Status::SrcNat);
        without_status.pop();
        assert_eq!(entry(&without_status), None);
        let without_reply = [
            attributes(Status::SrcNat).swap_remove(0),
            ConntrackAttribute::CtaStatus(Status::SrcNat),
        ];
        assert_eq!(entry(&without_reply), None);
    }

    /// A dump as the kernel sends it: the entry, an entry of no interest, the end.
    #[test]
    fn a_dump_datagram_is_read_into_entries() {
        let new = request(
            NetfilterProtoFamily::IPv4,
            ConntrackMessage::New(attributes(Status::SrcNat)),
        );
        let mut payload = vec![0; NetlinkSerializable::buffer_len(&new)];
        new.serialize(&mut payload);
        let datagram = [
            message(
                NetlinkSerializable::message_type(&new),
                NLM_F_MULTIPART,
                &payload,
            ),
            message(NLMSG_DONE, NLM_F_MULTIPART, &[0; 4]),
        ]
        .concat();
        let mut entries = Vec::new();
        let mut answer = Answer::default();
        let read = read_datagram(
            &datagram,
            SEQ,
            false,
            &mut parse_entry,
            &mut entries,
            &mut answer,
        );
        assert!(read.is_ok(), "{read:?}");
        assert!(answer.done);
        assert_eq!(
            entries
                .iter()
                .map(|entry| entry.reply.destination)
                .collect::<Vec<_>>(),
            [address([192, 0, 2, 1], 12_599)]
        );
        // Cut anywhere: an answer, never a panic.
        for cut in 0..datagram.len() {
            let _ = read_datagram(
                &datagram[..cut],
                SEQ,
                false,
                &mut parse_entry,
                &mut Vec::new(),
                &mut Answer::default(),
            );
        }
        let refused = message(NLMSG_ERROR, 0, &(-libc::EPERM).to_ne_bytes());
        let mut entries = Vec::new();
        let error = read_datagram(
            &refused,
            SEQ,
            false,
            &mut parse_entry,
            &mut entries,
            &mut Answer::default(),
        )
        .map_err(ConntrackError::from);
        assert!(
            matches!(&error, Err(ConntrackError::Refused(error)) if error.raw_os_error() == Some(libc::EPERM)),
            "{error:?}"
        );
    }
}
