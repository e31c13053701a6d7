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

use std::net::{IpAddr, SocketAddr};

use masq_common::nat::proto;

pub use crate::sys::conntrack::ConntrackError;
use crate::sys::conntrack::{self, ConntrackEntry, FlowTuple};

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

/// Every TCP and UDP flow of `family` (IPv4 or IPv6) that the kernel source-NATs. A kernel
/// without conntrack (the module not loaded: no netfilter NAT either) has none.
pub fn source_nat_flows(ipv6: bool) -> Result<Vec<KernelNatFlow>, ConntrackError> {
    conntrack::dump(ipv6, source_nat_flow)
}

/// Deletes `flow`'s conntrack entry, so that netfilter neither translates its packets nor
/// reverses its replies any more: masq has taken the flow over (see the agent's take-over).
/// An entry that is already gone is no error.
pub fn forget(flow: &KernelNatFlow) -> Result<(), ConntrackError> {
    conntrack::delete(&FlowTuple {
        protocol: flow.protocol,
        source: SocketAddr::new(flow.source, flow.source_port),
        destination: SocketAddr::new(flow.destination, flow.destination_port),
    })
}

/// The flow a conntrack entry describes, if the kernel source-NATs it and it is TCP or UDP.
fn source_nat_flow(entry: ConntrackEntry) -> Option<KernelNatFlow> {
    let ConntrackEntry {
        original,
        reply,
        source_nat,
        destination_nat,
        replied,
    } = entry;
    (source_nat && matches!(reply.protocol, proto::TCP | proto::UDP)).then_some(KernelNatFlow {
        protocol: reply.protocol,
        source: original.source.ip(),
        source_port: original.source.port(),
        destination: original.destination.ip(),
        destination_port: original.destination.port(),
        dst_nat: destination_nat,
        node: reply.destination.ip(),
        node_port: reply.destination.port(),
        remote: reply.source.ip(),
        remote_port: reply.source.port(),
        replied,
    })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn address(octets: [u8; 4], port: u16) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::from(octets).into(), port)
    }

    /// A pod's flow to 198.51.100.10:443 whose replies come back to the node's 192.0.2.1:12599.
    fn entry(protocol: u8, source_nat: bool) -> ConntrackEntry {
        ConntrackEntry {
            original: FlowTuple {
                protocol,
                source: address([10, 244, 1, 2], 40_000),
                destination: address([198, 51, 100, 10], 443),
            },
            reply: FlowTuple {
                protocol,
                source: address([198, 51, 100, 10], 443),
                destination: address([192, 0, 2, 1], 12_599),
            },
            source_nat,
            destination_nat: false,
            replied: false,
        }
    }

    #[test]
    fn a_masqueraded_flow_is_read_from_its_reply_tuple() {
        let flow = source_nat_flow(ConntrackEntry {
            replied: true,
            ..entry(proto::TCP, true)
        });
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
        let unanswered = source_nat_flow(entry(proto::UDP, true));
        assert_eq!(
            unanswered.map(|flow| (flow.protocol, flow.replied)),
            Some((17, false))
        );
        let service = source_nat_flow(ConntrackEntry {
            destination_nat: true,
            ..entry(proto::TCP, true)
        });
        assert_eq!(service.map(|flow| flow.dst_nat), Some(true));
    }

    #[test]
    fn flows_the_kernel_does_not_source_nat_are_not_read() {
        assert_eq!(
            source_nat_flow(ConntrackEntry {
                destination_nat: true,
                ..entry(proto::TCP, false)
            }),
            None
        );
        assert_eq!(
            source_nat_flow(entry(1, true)),
            None,
            "ICMP has no ports for masq to keep clear of"
        );
    }
}
