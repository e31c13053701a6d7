//! The flows the kernel's own NAT (netfilter's MASQUERADE or SNAT) translates, read from
//! conntrack over netlink.
//!
//! When masq takes over from ip-masq-agent, netfilter keeps translating the flows upstream's
//! chain mapped until they end: their translation lives in their conntrack entries, not in the
//! chain. masq must leave their node ports alone, or a new pod flow could get the same
//! (node port, remote, protocol) and take their replies. The agent reads the table once at
//! startup, before it attaches (`bpf_skb_ct_lookup` would answer per packet, but only from
//! Linux 5.18 and through kfuncs the datapath's toolchain cannot call); flows netfilter maps
//! later pass masq's egress program already translated, which reserves their port then.

use std::{io, net::IpAddr};

use masq_common::nat::proto;
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Status, Tuple},
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

/// A flow the kernel source-NATs: where it comes from, and what its replies look like on the
/// wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelNatFlow {
    /// IP protocol number.
    pub protocol: u8,
    /// Where the flow comes from (before the kernel's NAT).
    pub source: IpAddr,
    /// Its source port.
    pub source_port: u16,
    /// Where the flow was sent (before any destination NAT).
    pub destination: IpAddr,
    /// Its destination port.
    pub destination_port: u16,
    /// Whether the kernel also translates the destination (a Service's flow, a hostPort's):
    /// one its other NAT rules keep handling.
    pub dst_nat: bool,
    /// The node address the flow leaves with.
    pub node: IpAddr,
    /// The node port the flow leaves from.
    pub node_port: u16,
    /// The remote end.
    pub remote: IpAddr,
    /// The remote port.
    pub remote_port: u16,
    /// Whether conntrack has seen a reply.
    pub replied: bool,
}

/// Why conntrack could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    /// The netlink socket failed.
    #[error("reading conntrack over netlink: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused the dump.
    #[error("the kernel refused the conntrack dump: {0}")]
    Refused(#[source] io::Error),
    /// A reply could not be parsed.
    #[error("an unreadable conntrack reply: {0}")]
    Decode(String),
}

/// Every TCP and UDP flow of `family` (IPv4 or IPv6) that the kernel source-NATs. A kernel
/// without conntrack (the module not loaded: no netfilter NAT either) has none.
pub fn source_nat_flows(ipv6: bool) -> Result<Vec<KernelNatFlow>, ConntrackError> {
    let socket = send(
        family(ipv6),
        NLM_F_REQUEST | NLM_F_DUMP,
        ConntrackMessage::Get(Vec::new()),
    )?;
    let mut flows = Vec::new();
    let mut receive = vec![0; 64 * 1024];
    loop {
        let size = socket
            .recv(&mut &mut receive[..], 0)
            .map_err(ConntrackError::Socket)?;
        let mut offset = 0;
        while offset < size {
            let bytes = receive.get(offset..size).unwrap_or_default();
            let message = NetlinkMessage::<NetfilterMessage>::deserialize(bytes)
                .map_err(|error| ConntrackError::Decode(error.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(flows),
                NetlinkPayload::Error(error) => {
                    return match error.code {
                        None => Ok(flows),
                        // No conntrack in this kernel: nothing is translated by it.
                        Some(code)
                            if -code.get() == libc::ENOENT || -code.get() == libc::EOPNOTSUPP =>
                        {
                            Ok(flows)
                        }
                        Some(code) => Err(ConntrackError::Refused(io::Error::from_raw_os_error(
                            -code.get(),
                        ))),
                    };
                }
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
                    ..
                }) => flows.extend(source_nat_flow(&attributes)),
                _ => {}
            }
            if length == 0 {
                break;
            }
            offset += length;
        }
    }
}

/// Deletes `flow`'s conntrack entry, so that netfilter neither translates its packets nor
/// reverses its replies any more: masq has taken the flow over (see the agent's take-over).
/// An entry that is already gone is no error.
pub fn forget(flow: &KernelNatFlow) -> Result<(), ConntrackError> {
    let original = vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(flow.source),
            IPTuple::DestinationAddress(flow.destination),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(flow.protocol.into()),
            ProtoTuple::SourcePort(flow.source_port),
            ProtoTuple::DestinationPort(flow.destination_port),
        ]),
    ];
    let socket = send(
        family(flow.source.is_ipv6()),
        NLM_F_REQUEST | NLM_F_ACK,
        ConntrackMessage::Delete(vec![ConntrackAttribute::CtaTupleOrig(original)]),
    )?;
    let mut receive = vec![0; 8192];
    let size = socket
        .recv(&mut &mut receive[..], 0)
        .map_err(ConntrackError::Socket)?;
    let reply =
        NetlinkMessage::<NetfilterMessage>::deserialize(receive.get(..size).unwrap_or_default())
            .map_err(|error| ConntrackError::Decode(error.to_string()))?;
    match reply.payload {
        NetlinkPayload::Error(error) => match error.code {
            None => Ok(()),
            Some(code) if -code.get() == libc::ENOENT => Ok(()),
            Some(code) => Err(ConntrackError::Refused(io::Error::from_raw_os_error(
                -code.get(),
            ))),
        },
        _ => Ok(()),
    }
}

/// The netfilter family of IPv6 (or IPv4) flows.
const fn family(ipv6: bool) -> NetfilterProtoFamily {
    if ipv6 {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    }
}

/// Sends one conntrack request, and returns the socket its answer comes on.
fn send(
    family: NetfilterProtoFamily,
    flags: u16,
    message: ConntrackMessage,
) -> Result<Socket, ConntrackError> {
    let mut socket = Socket::new(NETLINK_NETFILTER).map_err(ConntrackError::Socket)?;
    socket.bind_auto().map_err(ConntrackError::Socket)?;
    socket
        .connect(&SocketAddr::new(0, 0))
        .map_err(ConntrackError::Socket)?;
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    let mut request = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            message,
        )),
    );
    request.finalize();
    let mut buffer = vec![0; request.buffer_len()];
    request.serialize(&mut buffer);
    socket.send(&buffer, 0).map_err(ConntrackError::Socket)?;
    Ok(socket)
}

/// The flow a conntrack entry describes, if the kernel source-NATs it and it is TCP or UDP.
fn source_nat_flow(attributes: &[ConntrackAttribute]) -> Option<KernelNatFlow> {
    let status = attributes.iter().find_map(|attribute| match attribute {
        ConntrackAttribute::CtaStatus(status) => Some(*status),
        _ => None,
    })?;
    if !status.contains(Status::SrcNat) {
        return None;
    }
    let tuple =
        |wanted: fn(&ConntrackAttribute) -> Option<&Vec<Tuple>>| attributes.iter().find_map(wanted);
    let original = tuple(|attribute| match attribute {
        ConntrackAttribute::CtaTupleOrig(tuple) => Some(tuple),
        _ => None,
    })?;
    let reply = tuple(|attribute| match attribute {
        ConntrackAttribute::CtaTupleReply(tuple) => Some(tuple),
        _ => None,
    })?;
    let (source, destination) = addresses(original)?;
    let (_, source_port, destination_port) = ports(original)?;
    let (remote, node) = addresses(reply)?;
    let (protocol, remote_port, node_port) = ports(reply)?;
    matches!(protocol, proto::TCP | proto::UDP).then_some(KernelNatFlow {
        protocol,
        source,
        source_port,
        destination,
        destination_port,
        dst_nat: status.contains(Status::DstNat),
        node,
        node_port,
        remote,
        remote_port,
        replied: status.contains(Status::SeenReply),
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

    use netlink_packet_netfilter::conntrack::Protocol;

    use super::*;

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

    fn entry(status: Status, protocol: Protocol) -> Vec<ConntrackAttribute> {
        vec![
            ConntrackAttribute::CtaTupleOrig(tuple(
                [10, 244, 1, 2],
                [198, 51, 100, 10],
                protocol,
                (40_000, 443),
            )),
            ConntrackAttribute::CtaTupleReply(tuple(
                [198, 51, 100, 10],
                [192, 0, 2, 1],
                protocol,
                (443, 12_599),
            )),
            ConntrackAttribute::CtaStatus(status),
        ]
    }

    #[test]
    fn a_masqueraded_flow_is_read_from_its_reply_tuple() {
        let flow = source_nat_flow(&entry(
            Status::SrcNat | Status::SeenReply | Status::Confirmed,
            Protocol::Tcp,
        ));
        assert_eq!(
            flow,
            Some(KernelNatFlow {
                protocol: 6,
                source: Ipv4Addr::new(10, 244, 1, 2).into(),
                source_port: 40_000,
                destination: Ipv4Addr::new(198, 51, 100, 10).into(),
                destination_port: 443,
                dst_nat: false,
                node: Ipv4Addr::new(192, 0, 2, 1).into(),
                node_port: 12_599,
                remote: Ipv4Addr::new(198, 51, 100, 10).into(),
                remote_port: 443,
                replied: true,
            })
        );
        let unanswered = source_nat_flow(&entry(Status::SrcNat, Protocol::Udp));
        assert_eq!(
            unanswered.map(|flow| (flow.protocol, flow.replied)),
            Some((17, false))
        );
    }

    #[test]
    fn flows_the_kernel_does_not_source_nat_are_not_read() {
        assert_eq!(
            source_nat_flow(&entry(Status::Confirmed | Status::DstNat, Protocol::Tcp)),
            None
        );
        assert_eq!(
            source_nat_flow(&entry(Status::SrcNat, Protocol::Icmp)),
            None,
            "ICMP has no ports for masq to keep clear of"
        );
        assert_eq!(source_nat_flow(&[]), None);
    }
}
