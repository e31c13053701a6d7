//! One read of the datapath's maps, for everything that shows them.
//!
//! `masq status` and `masq nat list` render a [`DatapathSnapshot`]; the agent's `/metrics`
//! renders the [`DatapathCounts`] a snapshot starts with, read again at every scrape (the NAT
//! table is the garbage collector's to walk, and its reports say what the table holds). Reading
//! in this one place keeps the three in agreement: the same sums over CPUs, the same pairing of
//! halves into flows, the same ranking of holders and remotes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use masq_common::{
    counters::Counter,
    flow::{EvictionCause, FlowClass},
    layout::{MapMeta, Uplink},
    nat::{NatEntry, NatKey},
    settings::Settings,
};

use super::{
    error::DatapathError,
    flows::{Flow, flows},
    gc::{self, RemoteUse},
    maps::{DatapathMaps, NatTable, Trie, TrieEntries},
};

/// The address families as `masq status` and the metrics name them, in the order every pair
/// below (and the agent's status) holds them.
pub const FAMILIES: [&str; 2] = ["ipv4", "ipv6"];

/// What the datapath counts per CPU, summed over the CPUs. Each pair is IPv4's then IPv6's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DatapathCounts {
    /// Packets by outcome, in `Counter::ALL` order.
    pub packets: [Vec<(Counter, u64)>; 2],
    /// The port allocation histogram (see [`DatapathMaps::alloc_histogram`]).
    pub allocation: Vec<u64>,
    /// Flows the datapath evicted to make room, by cause and class, in slot order.
    pub evictions: [Vec<(EvictionCause, FlowClass, u64)>; 2],
}

impl DatapathCounts {
    /// Reads the counts: a lookup per counter and bucket, cheap enough for every scrape.
    pub fn read(maps: &DatapathMaps) -> Result<Self, DatapathError> {
        Ok(Self {
            packets: [maps.counter_totals()?, maps.counter_totals_v6()?],
            allocation: maps.alloc_histogram()?,
            evictions: [
                maps.evictions_of::<[u8; 4]>()?,
                maps.evictions_of::<[u8; 16]>()?,
            ],
        })
    }
}

/// Everything the datapath's maps hold, as one read found it. Each pair is IPv4's then IPv6's.
#[derive(Clone, Debug)]
pub struct DatapathSnapshot {
    /// What the datapath counted.
    pub counts: DatapathCounts,
    /// The settings every uplink shares.
    pub settings: Settings,
    /// The layout record, with what masq changed on the node.
    pub meta: MapMeta,
    /// The interfaces masq translates on, in interface index order.
    pub uplinks: Vec<(u32, Uplink)>,
    /// The destination tries: `nonMasqueradeCIDRs`, link-local, `masqueradeCIDRs`.
    pub destinations: TrieContents,
    /// The source tries: `nonMasqueradeSrcCIDRs`.
    pub sources: TrieContents,
    /// Each local address and the unassured flows the datapath counts for it, both families.
    pub holders: Vec<(IpAddr, u64)>,
    /// The NAT tables.
    pub tables: [FlowTable; 2],
}

impl DatapathSnapshot {
    /// Reads every map once; the NAT tables are read last, as their walk takes longest.
    /// Entries created or deleted during the read may be missed.
    pub fn read(maps: &DatapathMaps) -> Result<Self, DatapathError> {
        let holders = maps
            .holders_of::<[u8; 4]>()?
            .into_iter()
            .map(|(holder, count)| (IpAddr::from(holder), count))
            .chain(
                maps.holders_of::<[u8; 16]>()?
                    .into_iter()
                    .map(|(holder, count)| (IpAddr::from(holder), count)),
            )
            .collect();
        Ok(Self {
            counts: DatapathCounts::read(maps)?,
            settings: maps.settings()?,
            meta: maps.meta()?,
            uplinks: maps.uplinks()?,
            destinations: TrieContents::read(maps, Trie::Destinations)?,
            sources: TrieContents::read(maps, Trie::Sources)?,
            holders,
            tables: [
                FlowTable::read::<[u8; 4]>(maps)?,
                FlowTable::read::<[u8; 16]>(maps)?,
            ],
        })
    }

    /// Every flow, IPv4's then IPv6's, each family's sorted by source then remote.
    pub fn flows(&self) -> impl Iterator<Item = &Flow> {
        self.tables.iter().flat_map(|table| &table.flows)
    }

    /// The `count` local addresses holding the most unassured flows, busiest first (ties by
    /// address); addresses holding none are left out.
    pub fn busiest_holders(&self, count: usize) -> Vec<(IpAddr, u64)> {
        let mut holders: Vec<(IpAddr, u64)> = self
            .holders
            .iter()
            .copied()
            .filter(|&(_, flows)| flows != 0)
            .collect();
        holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        holders.truncate(count);
        holders
    }

    /// The `count` remote endpoints with the most node ports in use, both families, busiest
    /// first.
    pub fn busiest_remotes(&self, count: usize) -> Vec<RemoteUse> {
        let mut remotes: Vec<RemoteUse> = self
            .tables
            .iter()
            .flat_map(|table| table.remotes.iter().copied())
            .collect();
        remotes.sort_by(|a, b| b.ports.cmp(&a.ports).then(a.cmp(b)));
        remotes.truncate(count);
        remotes
    }
}

/// One family's NAT table, its halves paired into flows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowTable {
    /// The table's capacity in entries, as the kernel reports it.
    pub capacity: u32,
    /// The entries read: both halves of every flow, halves without a partner included.
    pub entries: usize,
    /// The flows, sorted by source then remote.
    pub flows: Vec<Flow>,
    /// Node ports in use per remote endpoint, busiest first.
    pub remotes: Vec<RemoteUse>,
}

impl FlowTable {
    /// Reads the table of the family whose addresses are `A`, in batches.
    fn read<A: NatTable>(maps: &DatapathMaps) -> Result<Self, DatapathError>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        let entries = maps.nat_entries_of::<A>()?;
        Ok(Self {
            capacity: A::capacity(maps),
            entries: entries.len(),
            flows: flows(&entries),
            remotes: gc::remote_use(entries.iter().copied()),
        })
    }

    /// Flows not assured (never answered, or the handshake not completed): what a full table
    /// evicts.
    pub fn unassured(&self) -> usize {
        self.flows.iter().filter(|flow| !flow.assured()).count()
    }
}

/// One kind of trie (destinations or sources) in both families.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrieContents {
    /// The IPv4 trie's entries.
    pub ipv4: TrieEntries<Ipv4Addr>,
    /// The IPv6 trie's entries.
    pub ipv6: TrieEntries<Ipv6Addr>,
}

impl TrieContents {
    fn read(maps: &DatapathMaps, trie: Trie) -> Result<Self, DatapathError> {
        Ok(Self {
            ipv4: maps.trie_entries_of::<Ipv4Addr>(trie)?,
            ipv6: maps.trie_entries_of::<Ipv6Addr>(trie)?,
        })
    }

    /// Every entry as (address, prefix length, `NOMASQ_KIND_*`), IPv4's first.
    pub fn entries(&self) -> impl Iterator<Item = (IpAddr, u8, u32)> {
        let ipv4 = self
            .ipv4
            .iter()
            .map(|&((address, prefix), kind)| (IpAddr::from(address), prefix, kind));
        let ipv6 = self
            .ipv6
            .iter()
            .map(|&((address, prefix), kind)| (IpAddr::from(address), prefix, kind));
        ipv4.chain(ipv6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP remote endpoint `remote` (port 53) with `ports` node ports in use.
    fn remote(ports: usize, remote: &str) -> RemoteUse {
        let remote: IpAddr = remote.parse().expect("an address");
        RemoteUse {
            node: match remote {
                IpAddr::V4(_) => Ipv4Addr::new(192, 0, 2, 1).into(),
                IpAddr::V6(_) => "2001:db8::1".parse().expect("an address"),
            },
            remote: (remote, 53).into(),
            protocol: masq_common::nat::proto::UDP,
            ports,
        }
    }

    fn snapshot() -> DatapathSnapshot {
        DatapathSnapshot {
            counts: DatapathCounts::default(),
            settings: Settings::DISABLED,
            meta: MapMeta::current(0),
            uplinks: Vec::new(),
            destinations: TrieContents::default(),
            sources: TrieContents::default(),
            holders: Vec::new(),
            tables: [FlowTable::default(), FlowTable::default()],
        }
    }

    #[test]
    fn the_busiest_holders_of_both_families_come_first_and_idle_ones_not_at_all() {
        let v6: IpAddr = "2001:db8::5".parse().expect("an address");
        let snapshot = DatapathSnapshot {
            holders: vec![
                (Ipv4Addr::new(10, 244, 1, 7).into(), 3),
                (Ipv4Addr::new(10, 244, 1, 5).into(), 3),
                (Ipv4Addr::new(10, 244, 1, 6).into(), 0),
                (v6, 9),
            ],
            ..snapshot()
        };
        assert_eq!(
            snapshot.busiest_holders(2),
            [(v6, 9), (Ipv4Addr::new(10, 244, 1, 5).into(), 3)]
        );
    }

    #[test]
    fn the_busiest_remotes_are_ranked_across_families() {
        let snapshot = DatapathSnapshot {
            tables: [
                FlowTable {
                    remotes: vec![remote(7, "198.51.100.1"), remote(2, "198.51.100.2")],
                    ..FlowTable::default()
                },
                FlowTable {
                    remotes: vec![remote(4, "2001:db8:ff::3")],
                    ..FlowTable::default()
                },
            ],
            ..snapshot()
        };
        assert_eq!(
            snapshot.busiest_remotes(2),
            [remote(7, "198.51.100.1"), remote(4, "2001:db8:ff::3")]
        );
    }
}
