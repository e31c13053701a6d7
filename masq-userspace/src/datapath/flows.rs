//! Reading the NAT table as flows: the two halves of each translation paired up.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
};

use masq_common::{
    flow::{Timeouts, datagram, tcp},
    nat::{
        Address, Direction, NatEntry, NatKey, ORIGIN_HOST, ORIGIN_INBOUND, last_activity, proto,
    },
};

/// What a flow's half records, whatever its address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Half {
    /// `ORIGIN_*` of the flow.
    pub origin: u8,
    /// The flow's state (`flow::tcp::*` or `flow::datagram::*`).
    pub state: u8,
    /// The flow is assured.
    pub assured: bool,
    /// The last TCP segment was an accepted RST that left the state.
    pub reset: bool,
    /// When the flow was created (monotonic ns).
    pub created_ns: u64,
    /// Last packet in this direction (monotonic ns; zero: none yet).
    pub last_seen_ns: u64,
}

impl<A: Address> From<&NatEntry<A>> for Half {
    fn from(entry: &NatEntry<A>) -> Self {
        Self {
            origin: entry.origin,
            state: entry.state,
            assured: entry.is_assured(),
            reset: entry.reset != 0,
            created_ns: entry.created_ns,
            last_seen_ns: entry.last_seen_ns,
        }
    }
}

impl Half {
    /// As a table entry again, for the model's functions over entries.
    fn entry(&self) -> NatEntry<[u8; 4]> {
        let mut entry = NatEntry::new(
            [0; 4],
            0,
            self.origin,
            self.state,
            self.created_ns,
            self.last_seen_ns,
        );
        entry.assured = u8::from(self.assured);
        entry.reset = u8::from(self.reset);
        entry
    }
}

/// One translated flow, of either address family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    /// IP protocol number.
    pub protocol: u8,
    /// The original source (pod, or the node for tracked node flows). ICMP: the identifier as port.
    pub source: SocketAddr,
    /// The remote endpoint.
    pub remote: SocketAddr,
    /// What the source was translated to.
    pub translated: SocketAddr,
    /// The egress half.
    pub egress: Half,
    /// The ingress half, absent for a flow opened from outside (it has one half) or one whose
    /// reply half is gone.
    pub ingress: Option<Half>,
}

impl Flow {
    /// Protocol name for display.
    pub fn protocol_name(&self) -> String {
        match self.protocol {
            proto::TCP => "tcp".to_owned(),
            proto::UDP => "udp".to_owned(),
            proto::ICMP => "icmp".to_owned(),
            proto::ICMPV6 => "icmpv6".to_owned(),
            proto::SCTP => "sctp".to_owned(),
            other => other.to_string(),
        }
    }

    /// Whether the node itself started the flow.
    pub const fn is_node_flow(&self) -> bool {
        self.egress.origin == ORIGIN_HOST
    }

    /// Whether the flow was opened from outside towards a pod (left untranslated).
    pub const fn is_inbound(&self) -> bool {
        self.egress.origin == ORIGIN_INBOUND
    }

    /// The flow's state as conntrack names it (`ESTABLISHED`, `SYN_SENT`, `UNREPLIED`, ...).
    pub const fn state(&self) -> &'static str {
        if self.protocol == proto::TCP {
            tcp::name(self.egress.state)
        } else {
            datagram::name(self.egress.state)
        }
    }

    /// Whether the flow is assured: never evicted to make room.
    pub const fn assured(&self) -> bool {
        self.egress.assured
    }

    /// How long the flow may stay idle in its state.
    pub const fn lifetime_ns(&self, timeouts: &Timeouts) -> u64 {
        timeouts.lifetime(
            self.protocol,
            self.egress.state,
            self.egress.assured,
            self.egress.reset,
        )
    }

    /// Most recent activity in either direction (monotonic ns).
    pub fn last_seen_ns(&self) -> u64 {
        let ingress = self.ingress.map(|ingress| ingress.entry());
        last_activity(&self.egress.entry(), ingress.as_ref())
    }
}

/// Pairs a table's halves into flows, sorted by source then remote.
pub fn flows<A: Address + Into<IpAddr>>(entries: &[(NatKey<A>, NatEntry<A>)]) -> Vec<Flow> {
    let table: HashMap<NatKey<A>, NatEntry<A>> = entries.iter().copied().collect();
    let endpoint = |addr: A, port| SocketAddr::new(addr.into(), port);
    let mut flows: Vec<Flow> = entries
        .iter()
        .filter(|(key, _)| key.direction() == Some(Direction::Egress))
        .map(|(key, entry)| Flow {
            protocol: key.protocol,
            source: endpoint(key.src_addr, key.src_port),
            remote: endpoint(key.dst_addr, key.dst_port),
            translated: endpoint(entry.addr, entry.port),
            egress: Half::from(entry),
            ingress: (entry.origin != ORIGIN_INBOUND)
                .then(|| table.get(&key.peer(entry)).map(Half::from))
                .flatten(),
        })
        .collect();
    flows.sort_by_key(|flow| (flow.source, flow.remote, flow.protocol));
    flows
}

#[cfg(test)]
mod tests {
    use super::*;
    use masq_common::nat::{NatEntryV4, NatEntryV6, NatKeyV4, NatKeyV6, ORIGIN_POD};

    #[test]
    fn halves_pair_into_flows() {
        let key = NatKeyV4::new(
            [10, 244, 1, 5],
            [203, 0, 113, 10],
            40_000,
            443,
            proto::TCP,
            Direction::Egress,
        );
        let mut entry = NatEntryV4::new([192, 0, 2, 1], 2_000, ORIGIN_POD, tcp::ESTABLISHED, 5, 9);
        entry.assured = 1;
        let mut reverse = key.peer_entry(&entry);
        reverse.last_seen_ns = 12;
        let table = vec![(key, entry), (key.peer(&entry), reverse)];
        let flows = flows(&table);
        assert_eq!(flows.len(), 1);
        let flow = &flows[0];
        assert_eq!(flow.source.to_string(), "10.244.1.5:40000");
        assert_eq!(flow.translated.to_string(), "192.0.2.1:2000");
        assert_eq!(flow.state(), "ESTABLISHED");
        assert!(flow.assured());
        assert_eq!(
            flow.lifetime_ns(&Timeouts::LINUX_DEFAULTS),
            Timeouts::LINUX_DEFAULTS.tcp[tcp::ESTABLISHED as usize]
        );
        assert_eq!(flow.last_seen_ns(), 12);
        let orphan = super::flows(&table[..1]);
        assert_eq!(orphan[0].ingress, None);
    }

    #[test]
    fn ipv6_halves_pair_into_flows() {
        let v6 = |text: &str| {
            text.parse::<std::net::Ipv6Addr>()
                .expect("address")
                .octets()
        };
        let key = NatKeyV6::new(
            v6("2001:db8:244:1::5"),
            v6("2001:db8:ff::1"),
            7,
            0,
            proto::ICMPV6,
            Direction::Egress,
        );
        let entry = NatEntryV6::new(
            v6("2001:db8::1"),
            3_000,
            ORIGIN_POD,
            datagram::REPLIED,
            5,
            9,
        );
        let reverse = key.peer_entry(&entry);
        let flows = flows(&[(key, entry), (key.peer(&entry), reverse)]);
        assert_eq!(flows.len(), 1);
        let flow = &flows[0];
        assert_eq!(flow.protocol_name(), "icmpv6");
        assert_eq!(flow.source.to_string(), "[2001:db8:244:1::5]:7");
        assert_eq!(flow.translated.to_string(), "[2001:db8::1]:3000");
        assert_eq!(flow.state(), "REPLIED");
        assert!(!flow.assured());
    }
}
