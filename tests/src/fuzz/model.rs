//! What the fuzzer knows about the datapath's state, learnt only from the frames it sent and
//! what came back: the mappings it saw created, the UDP flows pods were sent from outside, and
//! what happened to the first fragment of each datagram. The oracle checks translations
//! against it; the generator builds replies from it.

use std::collections::HashMap;

use masq_common::{counters::Counter, nat::Direction};

use super::wire::{Ip, be16, proto};

/// A flow as masq keys it: the packet's addresses, its ports for TCP, UDP and SCTP, its ICMP
/// query identifier (the source "port" of a request, the destination "port" of a reply), and
/// zero ports for every other protocol, which is tracked by address only (docs/datapath.md, "Protocols").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tuple {
    pub protocol: u8,
    pub src: [u8; 4],
    pub src_port: u16,
    pub dst: [u8; 4],
    pub dst_port: u16,
}

impl Tuple {
    /// The tuple of a packet going the other way.
    pub const fn reversed(&self) -> Self {
        Self {
            protocol: self.protocol,
            src: self.dst,
            src_port: self.dst_port,
            dst: self.src,
            dst_port: self.src_port,
        }
    }

    /// The flow of the packet whose IPv4 header is `ip`, reading only bytes before `limit`:
    /// `None` for later fragments, truncated transport headers and ICMP other than queries.
    pub fn of_packet(frame: &[u8], ip: &Ip, limit: usize) -> Option<Self> {
        if ip.is_later_fragment() {
            return None;
        }
        let l4 = ip.l4();
        let visible = |len: usize| (l4 + len <= limit).then_some(());
        let (src_port, dst_port) = match ip.protocol {
            proto::TCP | proto::UDP | proto::SCTP => {
                visible(4)?;
                (be16(frame, l4)?, be16(frame, l4 + 2)?)
            }
            proto::ICMP => {
                visible(6)?;
                let id = be16(frame, l4 + 4)?;
                match frame.get(l4)? {
                    8 | 13 => (id, 0),
                    0 | 14 => (0, id),
                    _ => return None,
                }
            }
            // No ports, but the header must be all there, as for the others: a quote cut
            // inside its options holds no flow.
            _ => {
                visible(0)?;
                (0, 0)
            }
        };
        Some(Self {
            protocol: ip.protocol,
            src: ip.src,
            src_port,
            dst: ip.dst,
            dst_port,
        })
    }

    /// The flow of a whole frame's packet, with its transport header complete.
    pub fn of_frame(frame: &[u8]) -> Option<Self> {
        let ip = Ip::of_frame(frame)?;
        let needed = match ip.protocol {
            proto::TCP => 20,
            proto::SCTP => 12,
            proto::UDP | proto::ICMP => 8,
            _ => 0,
        };
        if ip.l4() + needed > ip.end {
            return None;
        }
        Self::of_packet(frame, &ip, ip.end)
    }
}

/// A translated flow as the fuzzer saw it leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The flow as the pod (or the node) sent it.
    pub original: Tuple,
    /// The address and port (identifier) it left with.
    pub nat: ([u8; 4], u16),
}

impl Mapping {
    /// The tuple the flow's replies arrive with.
    pub const fn reply(&self) -> Tuple {
        Tuple {
            protocol: self.original.protocol,
            src: self.original.dst,
            src_port: self.original.dst_port,
            dst: self.nat.0,
            dst_port: self.nat.1,
        }
    }
}

/// Identifies a datagram, like the datapath's fragment table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatagramKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub id: u16,
    pub protocol: u8,
}

impl DatagramKey {
    pub const fn of(ip: &Ip) -> Self {
        Self {
            src: ip.src,
            dst: ip.dst,
            id: ip.id,
            protocol: ip.protocol,
        }
    }
}

/// What became of the last first fragment of a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstFragment<A = [u8; 4]> {
    /// The address it left with (the source on egress, the destination on ingress); `None`
    /// when it was dropped, after which nothing is expected of the later fragments.
    pub left_with: Option<A>,
    /// Its outcome counter.
    pub counter: Option<Counter>,
}

#[derive(Debug, Default)]
pub struct Model {
    /// Mappings by the flow as sent, to the address and port it leaves with.
    pub by_original: HashMap<Tuple, ([u8; 4], u16)>,
    /// Mappings by the reply tuple, to the address and port replies are restored to.
    pub by_reply: HashMap<Tuple, ([u8; 4], u16)>,
    /// Every mapping seen, oldest first, for building replies.
    pub mappings: Vec<Mapping>,
    /// UDP flows opened from outside to a pod's own address, as the pod's answers carry them.
    pub inbound: Vec<Tuple>,
    pub egress_datagrams: HashMap<DatagramKey, FirstFragment>,
    pub ingress_datagrams: HashMap<DatagramKey, FirstFragment>,
    /// The IPv6 mappings, when the uplink translates IPv6.
    pub v6: super::v6::Model6,
}

impl Model {
    pub const fn datagrams(&self, direction: Direction) -> &HashMap<DatagramKey, FirstFragment> {
        match direction {
            Direction::Egress => &self.egress_datagrams,
            Direction::Ingress => &self.ingress_datagrams,
        }
    }

    /// Forgets the flow `input` (a frame of either direction) belongs to: a RST while no
    /// answer had come ended it, as conntrack ends such a connection.
    pub fn forget_refused(&mut self, direction: Direction, input: &[u8]) {
        if super::wire::is_ipv6_frame(input) {
            self.v6.forget_refused(direction, input);
            return;
        }
        let Some(tuple) = Tuple::of_frame(input) else {
            return;
        };
        let original = match direction {
            Direction::Egress => tuple,
            Direction::Ingress => match self.by_reply.get(&tuple) {
                Some(&(pod, pod_port)) => Tuple {
                    protocol: tuple.protocol,
                    src: pod,
                    src_port: pod_port,
                    dst: tuple.src,
                    dst_port: tuple.src_port,
                },
                None => return,
            },
        };
        if let Some(nat) = self.by_original.remove(&original) {
            self.by_reply.remove(&Mapping { original, nat }.reply());
        }
    }

    /// Learns from one frame's fate. `output` is `None` when the frame was dropped.
    pub fn learn(
        &mut self,
        direction: Direction,
        input: &[u8],
        output: Option<&[u8]>,
        counter: Option<Counter>,
    ) {
        if super::wire::is_ipv6_frame(input) {
            self.v6.learn(direction, input, output, counter);
            return;
        }
        let Some(ip) = Ip::of_frame(input) else {
            return;
        };
        if ip.is_first_fragment() {
            let left_with = output.map(|output| {
                let at = match direction {
                    Direction::Egress => ip.start + 12,
                    Direction::Ingress => ip.start + 16,
                };
                super::wire::addr4(output, at).unwrap_or([0; 4])
            });
            let datagrams = match direction {
                Direction::Egress => &mut self.egress_datagrams,
                Direction::Ingress => &mut self.ingress_datagrams,
            };
            datagrams.insert(DatagramKey::of(&ip), FirstFragment { left_with, counter });
        }
        let Some(output) = output else {
            return;
        };
        match counter {
            Some(
                Counter::EgressNewMapping | Counter::EgressMasqueraded | Counter::EgressHostTracked,
            ) => {
                let (Some(original), Some(left)) =
                    (Tuple::of_frame(input), Tuple::of_frame(output))
                else {
                    return;
                };
                let mapping = Mapping {
                    original,
                    nat: (left.src, left.src_port),
                };
                if self.by_original.insert(original, mapping.nat).is_none() {
                    self.mappings.push(mapping);
                }
                let reply = mapping.reply();
                let owner = (original.src, original.src_port);
                // The node's own traffic of a protocol without ports takes its tuple back from
                // a pod flow that held it (docs/datapath.md, "Protocols"): that flow is gone,
                // and errors about it are no longer translated. (Any other change of owner is a violation
                // the oracle reported already.)
                if let Some(previous) = self.by_reply.insert(reply, owner)
                    && previous != owner
                {
                    self.by_original.remove(&Tuple {
                        protocol: reply.protocol,
                        src: previous.0,
                        src_port: previous.1,
                        dst: reply.src,
                        dst_port: reply.src_port,
                    });
                }
            }
            Some(Counter::IngressInboundTracked) => {
                if let Some(tuple) = Tuple::of_frame(input) {
                    self.inbound.push(tuple.reversed());
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pktgen::Packet;

    #[test]
    fn the_nodes_port_less_traffic_ends_the_pod_flow_that_held_its_tuple() {
        let mut model = Model::default();
        let pod = Packet::raw("10.244.1.5", "203.0.113.10", proto::GRE).frame();
        let node = Packet::raw("192.0.2.1", "203.0.113.10", proto::GRE).frame();
        model.learn(
            Direction::Egress,
            &pod,
            Some(&node),
            Some(Counter::EgressNewMapping),
        );
        let pod_flow = Tuple::of_frame(&pod);
        assert!(pod_flow.is_some_and(|flow| model.by_original.contains_key(&flow)));
        model.learn(
            Direction::Egress,
            &node,
            Some(&node),
            Some(Counter::EgressHostTracked),
        );
        assert!(pod_flow.is_some_and(|flow| !model.by_original.contains_key(&flow)));
        let reply = Tuple::of_frame(&node).map(|flow| flow.reversed());
        assert_eq!(
            reply.and_then(|reply| model.by_reply.get(&reply).copied()),
            Some(([192, 0, 2, 1], 0))
        );
    }
}
