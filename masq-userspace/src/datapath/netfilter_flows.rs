//! The flows netfilter translates to the node's addresses, taken into masq's NAT table: the
//! ones upstream's chain masqueraded become masq's once masq took over from it, and the others
//! keep their ports, which masq then never gives to a pod's flow.

use std::net::IpAddr;

use masq_common::ports::PortRange;

use super::{
    gc,
    maps::{DatapathMaps, KernelFlow},
};
use crate::{causes::WithCauses, node::conntrack};

/// What is done with the flows netfilter translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intake {
    /// Those on ports in masq's ranges are reserved (at startup).
    Reserve,
    /// Upstream's are adopted, and the others on ports in masq's ranges reserved (once
    /// upstream's chain was removed).
    AfterTakeOver,
}

/// Takes in the flows netfilter source-NATs to one of the `node_addresses` (read from
/// conntrack), before the programs are attached:
///
/// * after a take-over ([`Intake::AfterTakeOver`]), upstream's flows (pod flows netfilter
///   masqueraded, with no destination NAT) are adopted: masq maps them to the node port they
///   have, and their conntrack entries are deleted. With its chain gone, netfilter does not reliably keep
///   translating them (an iptables-nft node sent the next packet out with the pod's address),
///   so masq translates them from then on, on the same port: they keep working to their end.
/// * every other such flow with a port in masq's ranges (another MASQUERADE rule's) keeps
///   its translation in netfilter, and its tuple is reserved: no pod flow gets its port.
///
/// A conntrack that cannot be read is logged, not fatal: masq's egress program reserves the
/// port of a flow netfilter translates at its next packet anyway.
pub fn take_in(
    maps: &mut DatapathMaps,
    node_addresses: &[IpAddr],
    snat_ranges: &[PortRange],
    ipv6: bool,
    intake: Intake,
) {
    let took_over = intake == Intake::AfterTakeOver;
    let in_range = |port: u16| snat_ranges.iter().any(|range| range.contains(port));
    let is_node = |address: IpAddr| node_addresses.contains(&address);
    let now_ns = gc::monotonic_now_ns();
    let (mut adopted, mut reserved, mut taken) = (0_usize, 0_usize, 0_usize);
    let families = if ipv6 {
        &[false, true][..]
    } else {
        &[false][..]
    };
    for &ipv6 in families {
        let flows = match conntrack::source_nat_flows(ipv6) {
            Ok(flows) => flows,
            Err(error) => {
                tracing::warn!(error = %WithCauses(&error), "could not read the flows netfilter translates; their ports are reserved at their next packet instead");
                continue;
            }
        };
        for flow in flows.iter().filter(|flow| is_node(flow.node)) {
            let adopt = took_over && !flow.dst_nat && !is_node(flow.source);
            if !adopt && !in_range(flow.node_port) {
                continue;
            }
            let inserted = match (flow.source, flow.node, flow.remote) {
                (IpAddr::V4(source), IpAddr::V4(node), IpAddr::V4(remote)) => {
                    let flow = kernel_flow(flow, source.octets(), node.octets(), remote.octets());
                    maps.insert_kernel_flow(&if adopt { flow } else { flow.reserved() }, now_ns)
                }
                (IpAddr::V6(source), IpAddr::V6(node), IpAddr::V6(remote)) => {
                    let flow = kernel_flow(flow, source.octets(), node.octets(), remote.octets());
                    maps.insert_kernel_flow(&if adopt { flow } else { flow.reserved() }, now_ns)
                }
                _ => continue,
            };
            match inserted {
                Ok(true) if adopt => match conntrack::forget(flow) {
                    Ok(()) => adopted += 1,
                    Err(error) => {
                        tracing::warn!(error = %WithCauses(&error), source = %flow.source, remote = %flow.remote, "adopted a flow but could not delete its conntrack entry; netfilter may translate it too");
                    }
                },
                Ok(true) => reserved += 1,
                Ok(false) => taken += 1,
                Err(error) => {
                    tracing::warn!(error = %WithCauses(&error), "could not record a flow netfilter translates");
                }
            }
        }
    }
    if adopted + reserved + taken > 0 {
        tracing::info!(
            adopted,
            reserved,
            already_mapped_by_masq = taken,
            "took in the flows netfilter translates to the uplinks' addresses: upstream's are masq's now, on their ports; the others keep their ports"
        );
    }
}

/// `flow` in one family's addresses.
const fn kernel_flow<A: Copy>(
    flow: &conntrack::KernelNatFlow,
    source: A,
    node: A,
    remote: A,
) -> KernelFlow<A> {
    KernelFlow {
        protocol: flow.protocol,
        source,
        source_port: flow.source_port,
        node,
        node_port: flow.node_port,
        remote,
        remote_port: flow.remote_port,
        replied: flow.replied,
    }
}
