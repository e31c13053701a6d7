//! Typed handles on the datapath maps, whether freshly loaded or adopted from pins.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    path::Path,
};

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key},
};
use masq_common::{
    counters::{ALLOC_HISTOGRAM_BUCKETS, Counter},
    flow::{EVICTION_SLOTS, EvictionCause, FlowClass, datagram, eviction_slot, tcp},
    layout::{
        MAP_ALLOC_RETRIES, MAP_BURIED_V4, MAP_BURIED_V6, MAP_COUNTERS, MAP_COUNTERS_V6,
        MAP_EVICTIONS, MAP_EVICTIONS_V6, MAP_FRAGS_V4, MAP_HOLDERS_V4, MAP_HOLDERS_V6, MAP_META,
        MAP_NAT_V4, MAP_NAT_V6, MAP_NOMASQ_SRC_V4, MAP_NOMASQ_SRC_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6,
        MAP_REMOTE_HOLDERS_V4, MAP_REMOTE_HOLDERS_V6, MAP_SETTINGS, MAP_UPLINK_SLOTS, MAP_UPLINKS,
        MapMeta, UPLINK_INDEX_SLOTS, Uplink, UplinkSlot, flow_slots,
    },
    nat::{
        Address, Direction, FragEntryV4, FragKeyV4, Holder, NatEntry, NatEntryV4, NatEntryV6,
        NatKey, NatKeyV4, NatKeyV6, ORIGIN_HOST, ORIGIN_POD, RemoteHolder, RemoteHolderV4,
        RemoteHolderV6, proto,
    },
    settings::{FAMILY_IPV4, FAMILY_IPV6, Settings},
};

use super::error::DatapathError;
use crate::policy::{NomasqEntries, TrieAddress};

/// A flow the kernel's own NAT translates, in one family's addresses (see
/// [`DatapathMaps::insert_kernel_flow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFlow<A> {
    /// IP protocol number.
    pub protocol: u8,
    /// Where the flow comes from: a pod, or the node itself.
    pub source: A,
    /// Its source port.
    pub source_port: u16,
    /// The node address the flow leaves with.
    pub node: A,
    /// The node port it leaves from.
    pub node_port: u16,
    /// The remote end.
    pub remote: A,
    /// The remote port.
    pub remote_port: u16,
    /// Whether conntrack saw a reply.
    pub replied: bool,
}

impl<A: Copy> KernelFlow<A> {
    /// The same flow as the node's own: its translated packets pass masq unchanged, and its
    /// node port is kept from pod flows.
    #[must_use]
    pub const fn reserved(self) -> Self {
        Self {
            source: self.node,
            source_port: self.node_port,
            ..self
        }
    }
}

/// Owned, typed handles on every datapath map.
pub struct DatapathMaps {
    /// Layout identity of the map set.
    pub meta: Array<MapData, MapMeta>,
    /// Datapath settings.
    pub settings: Array<MapData, Settings>,
    /// The interfaces masq translates on, by interface index.
    pub uplinks: HashMap<MapData, u32, Uplink>,
    /// The same interfaces' addresses at their index, for indexes below `UPLINK_INDEX_SLOTS`.
    pub uplink_slots: Array<MapData, UplinkSlot>,
    /// Non-masquerade IPv4 destinations.
    pub nomasq_v4: LpmTrie<MapData, [u8; 4], u32>,
    /// Both halves of every translated flow.
    pub nat_v4: HashMap<MapData, NatKeyV4, NatEntryV4>,
    /// Decisions for fragmented datagrams in flight.
    pub frags_v4: HashMap<MapData, FragKeyV4, FragEntryV4>,
    /// Per-CPU packet counters.
    pub counters: PerCpuArray<MapData, u64>,
    /// Per-CPU port allocation histogram.
    pub alloc_retries: PerCpuArray<MapData, u64>,
    /// Non-masquerade IPv6 destinations.
    pub nomasq_v6: LpmTrie<MapData, [u8; 16], u32>,
    /// Both halves of every translated IPv6 flow.
    pub nat_v6: HashMap<MapData, NatKeyV6, NatEntryV6>,
    /// Per-CPU IPv6 packet counters.
    pub counters_v6: PerCpuArray<MapData, u64>,
    /// Pod IPv4 sources never masqueraded (`nonMasqueradeSrcCIDRs`).
    pub nomasq_src_v4: LpmTrie<MapData, [u8; 4], u32>,
    /// The same for IPv6 pod sources.
    pub nomasq_src_v6: LpmTrie<MapData, [u8; 16], u32>,
    /// Both halves of the TCP flows the agent removed, which a late segment of either end may
    /// take back (see `gc::bury`).
    pub buried_v4: HashMap<MapData, NatKeyV4, NatEntryV4>,
    /// The same for IPv6.
    pub buried_v6: HashMap<MapData, NatKeyV6, NatEntryV6>,
    /// Unassured IPv4 flows by local address (see `Holder`).
    pub holders_v4: HashMap<MapData, [u8; 4], Holder>,
    /// The same for IPv6.
    pub holders_v6: HashMap<MapData, [u8; 16], Holder>,
    /// Node ports by pod and busy IPv4 remote (see `RemoteHolder`).
    pub remote_holders_v4: HashMap<MapData, RemoteHolderV4, u64>,
    /// The same for IPv6.
    pub remote_holders_v6: HashMap<MapData, RemoteHolderV6, u64>,
    /// Per-CPU IPv4 evictions by cause and class.
    pub evictions: PerCpuArray<MapData, u64>,
    /// Per-CPU IPv6 evictions by cause and class.
    pub evictions_v6: PerCpuArray<MapData, u64>,
    /// The NAT tables' own descriptors, for batch reads (aya's typed map does not lend its).
    nat_fd: OwnedFd,
    nat_v6_fd: OwnedFd,
    nat_capacity: u32,
    nat_v6_capacity: u32,
    nomasq_capacity: u32,
    nomasq_v6_capacity: u32,
    nomasq_src_capacity: u32,
    nomasq_src_v6_capacity: u32,
    /// What the last successful IPv4 trie sync wrote (see `sync::TrieView`); `None` when
    /// unknown.
    pub(crate) nomasq_last_synced: Option<NomasqEntries<Ipv4Addr>>,
    /// The same for the IPv6 trie.
    pub(crate) nomasq_v6_last_synced: Option<NomasqEntries<Ipv6Addr>>,
    /// The same for the IPv4 source trie.
    pub(crate) nomasq_src_last_synced: Option<NomasqEntries<Ipv4Addr>>,
    /// The same for the IPv6 source trie.
    pub(crate) nomasq_src_v6_last_synced: Option<NomasqEntries<Ipv6Addr>>,
}

/// A NAT table's entries, both halves of every flow.
pub type NatSnapshot<A> = Vec<(NatKey<A>, NatEntry<A>)>;

/// A non-masquerade trie's entries as ((address, prefix length), `NOMASQ_KIND_*`).
pub type TrieEntries<A> = Vec<((A, u8), u32)>;

/// Map update flag `BPF_NOEXIST`: insert only if the key is free.
pub(crate) const BPF_NOEXIST: u64 = 1;

/// An address family's NAT table, so that reading and collecting it is written once for both
/// families. Implemented for the addresses as the tables store them.
pub trait NatTable: Address + Ord + aya::Pod + Into<std::net::IpAddr>
where
    NatKey<Self>: aya::Pod,
    NatEntry<Self>: aya::Pod,
{
    /// The table's map name.
    const MAP_NAME: &'static str;
    /// The map name of the family's table of removed TCP flows.
    const BURIED_MAP_NAME: &'static str;
    /// The map name of the family's holders.
    const HOLDERS_MAP_NAME: &'static str;
    /// The map name of the family's eviction counters.
    const EVICTIONS_MAP_NAME: &'static str;
    /// The map name of the family's remote holders.
    const REMOTE_HOLDERS_MAP_NAME: &'static str;
    /// The family's table.
    fn table(maps: &DatapathMaps) -> &HashMap<MapData, NatKey<Self>, NatEntry<Self>>;
    /// The family's table, for deleting.
    fn table_mut(maps: &mut DatapathMaps) -> &mut HashMap<MapData, NatKey<Self>, NatEntry<Self>>;
    /// The table's descriptor, for batch reads.
    fn table_fd(maps: &DatapathMaps) -> BorrowedFd<'_>;
    /// The table's capacity as the kernel reports it.
    fn capacity(maps: &DatapathMaps) -> u32;
    /// The family's table of removed TCP flows.
    fn buried_mut(maps: &mut DatapathMaps) -> &mut HashMap<MapData, NatKey<Self>, NatEntry<Self>>;
    /// The family's holders.
    fn holders(maps: &DatapathMaps) -> &HashMap<MapData, Self, Holder>;
    /// The family's holders, for writing.
    fn holders_mut(maps: &mut DatapathMaps) -> &mut HashMap<MapData, Self, Holder>;
    /// The family's eviction counters.
    fn evictions(maps: &DatapathMaps) -> &PerCpuArray<MapData, u64>;
    /// Makes the family's remote-holders table hold `held`, removing whatever else it held.
    fn sync_remote_holders(
        maps: &mut DatapathMaps,
        held: &std::collections::HashMap<RemoteHolder<Self>, u64>,
    ) -> Result<(), DatapathError>;
}

/// Implements [`NatTable`] for one family's address: its table, and the table's descriptor.
macro_rules! nat_table {
    (
        $address:ty,
        ($map_name:expr, $table:ident, $fd:ident, $capacity:ident),
        ($buried_name:expr, $buried:ident),
        ($holders_name:expr, $holders:ident),
        ($remote_holders_name:expr, $remote_holders:ident),
        ($evictions_name:expr, $evictions:ident)
    ) => {
        impl NatTable for $address {
            const MAP_NAME: &'static str = $map_name;
            const BURIED_MAP_NAME: &'static str = $buried_name;
            const HOLDERS_MAP_NAME: &'static str = $holders_name;
            const EVICTIONS_MAP_NAME: &'static str = $evictions_name;
            const REMOTE_HOLDERS_MAP_NAME: &'static str = $remote_holders_name;
            fn table(maps: &DatapathMaps) -> &HashMap<MapData, NatKey<Self>, NatEntry<Self>> {
                &maps.$table
            }
            fn table_mut(
                maps: &mut DatapathMaps,
            ) -> &mut HashMap<MapData, NatKey<Self>, NatEntry<Self>> {
                &mut maps.$table
            }
            fn table_fd(maps: &DatapathMaps) -> BorrowedFd<'_> {
                maps.$fd.as_fd()
            }
            fn capacity(maps: &DatapathMaps) -> u32 {
                maps.$capacity
            }
            fn buried_mut(
                maps: &mut DatapathMaps,
            ) -> &mut HashMap<MapData, NatKey<Self>, NatEntry<Self>> {
                &mut maps.$buried
            }
            fn holders(maps: &DatapathMaps) -> &HashMap<MapData, Self, Holder> {
                &maps.$holders
            }
            fn holders_mut(maps: &mut DatapathMaps) -> &mut HashMap<MapData, Self, Holder> {
                &mut maps.$holders
            }
            fn evictions(maps: &DatapathMaps) -> &PerCpuArray<MapData, u64> {
                &maps.$evictions
            }
            fn sync_remote_holders(
                maps: &mut DatapathMaps,
                held: &std::collections::HashMap<RemoteHolder<Self>, u64>,
            ) -> Result<(), DatapathError> {
                let table = &mut maps.$remote_holders;
                let stale: Vec<RemoteHolder<Self>> = table
                    .keys()
                    .filter_map(Result::ok)
                    .filter(|key| !held.contains_key(key))
                    .collect();
                for key in stale {
                    match table.remove(&key) {
                        Ok(()) | Err(MapError::KeyNotFound) => {}
                        Err(error) => {
                            return Err(DatapathError::map("removing from", $remote_holders_name)(
                                error,
                            ));
                        }
                    }
                }
                for (key, count) in held {
                    table
                        .insert(key, count, 0)
                        .map_err(DatapathError::map("writing", $remote_holders_name))?;
                }
                Ok(())
            }
        }
    };
}

nat_table!(
    [u8; 4],
    (MAP_NAT_V4, nat_v4, nat_fd, nat_capacity),
    (MAP_BURIED_V4, buried_v4),
    (MAP_HOLDERS_V4, holders_v4),
    (MAP_REMOTE_HOLDERS_V4, remote_holders_v4),
    (MAP_EVICTIONS, evictions)
);
nat_table!(
    [u8; 16],
    (MAP_NAT_V6, nat_v6, nat_v6_fd, nat_v6_capacity),
    (MAP_BURIED_V6, buried_v6),
    (MAP_HOLDERS_V6, holders_v6),
    (MAP_REMOTE_HOLDERS_V6, remote_holders_v6),
    (MAP_EVICTIONS_V6, evictions_v6)
);

/// Which of a family's two tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trie {
    /// Destinations, by longest match: `nonMasqueradeCIDRs`, link-local, `masqueradeCIDRs`.
    Destinations,
    /// Pod sources never masqueraded: `nonMasqueradeSrcCIDRs`.
    Sources,
}

/// An address family's tries, so that syncing and reading them is written once for both
/// families.
pub trait NomasqTrie: TrieAddress + std::fmt::Display + 'static {
    /// The tries' key data: the address in network byte order.
    type Octets: aya::Pod;
    /// The destination trie's map name.
    const MAP_NAME: &'static str;
    /// The source trie's map name.
    const SOURCE_MAP_NAME: &'static str;
    /// The map name of `trie`.
    fn map_name(trie: Trie) -> &'static str {
        match trie {
            Trie::Destinations => Self::MAP_NAME,
            Trie::Sources => Self::SOURCE_MAP_NAME,
        }
    }
    /// The address as the tries store it.
    fn octets(self) -> Self::Octets;
    /// The address the tries store as `octets`.
    fn from_octets(octets: Self::Octets) -> Self;
    /// The family's `trie`.
    fn trie(maps: &DatapathMaps, trie: Trie) -> &LpmTrie<MapData, Self::Octets, u32>;
    /// The family's `trie`, for writing.
    fn trie_mut(maps: &mut DatapathMaps, trie: Trie) -> &mut LpmTrie<MapData, Self::Octets, u32>;
    /// Its capacity as the kernel reports it.
    fn capacity(maps: &DatapathMaps, trie: Trie) -> u32;
    /// What the last successful sync of `trie` wrote.
    fn last_synced(maps: &mut DatapathMaps, trie: Trie) -> &mut Option<NomasqEntries<Self>>;
}

/// Implements [`NomasqTrie`] for one family's address: its tries, capacities and last syncs,
/// (destination, source) each.
macro_rules! nomasq_trie {
    (
        $address:ty,
        $octets:ty,
        ($map_name:expr, $source_map_name:expr),
        ($trie:ident, $source_trie:ident),
        ($capacity:ident, $source_capacity:ident),
        ($last:ident, $source_last:ident)
    ) => {
        impl NomasqTrie for $address {
            type Octets = $octets;
            const MAP_NAME: &'static str = $map_name;
            const SOURCE_MAP_NAME: &'static str = $source_map_name;
            fn octets(self) -> $octets {
                Self::octets(&self)
            }
            fn from_octets(octets: $octets) -> Self {
                Self::from(octets)
            }
            fn trie(maps: &DatapathMaps, trie: Trie) -> &LpmTrie<MapData, $octets, u32> {
                match trie {
                    Trie::Destinations => &maps.$trie,
                    Trie::Sources => &maps.$source_trie,
                }
            }
            fn trie_mut(
                maps: &mut DatapathMaps,
                trie: Trie,
            ) -> &mut LpmTrie<MapData, $octets, u32> {
                match trie {
                    Trie::Destinations => &mut maps.$trie,
                    Trie::Sources => &mut maps.$source_trie,
                }
            }
            fn capacity(maps: &DatapathMaps, trie: Trie) -> u32 {
                match trie {
                    Trie::Destinations => maps.$capacity,
                    Trie::Sources => maps.$source_capacity,
                }
            }
            fn last_synced(
                maps: &mut DatapathMaps,
                trie: Trie,
            ) -> &mut Option<NomasqEntries<Self>> {
                match trie {
                    Trie::Destinations => &mut maps.$last,
                    Trie::Sources => &mut maps.$source_last,
                }
            }
        }
    };
}

nomasq_trie!(
    Ipv4Addr,
    [u8; 4],
    (MAP_NOMASQ_V4, MAP_NOMASQ_SRC_V4),
    (nomasq_v4, nomasq_src_v4),
    (nomasq_capacity, nomasq_src_capacity),
    (nomasq_last_synced, nomasq_src_last_synced)
);
nomasq_trie!(
    Ipv6Addr,
    [u8; 16],
    (MAP_NOMASQ_V6, MAP_NOMASQ_SRC_V6),
    (nomasq_v6, nomasq_src_v6),
    (nomasq_v6_capacity, nomasq_src_v6_capacity),
    (nomasq_v6_last_synced, nomasq_src_v6_last_synced)
);

impl std::fmt::Debug for DatapathMaps {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DatapathMaps")
            .finish_non_exhaustive()
    }
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, DatapathError> {
    ebpf.take_map(name)
        .ok_or(DatapathError::Missing { kind: "map", name })
}

fn typed<T>(map: Map, name: &'static str) -> Result<T, DatapathError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map).map_err(DatapathError::map("opening", name))
}

/// A NAT table's capacity as the kernel reports it, and a descriptor of its own.
fn nat_table_info(map: &Map, name: &'static str) -> Result<(u32, OwnedFd), DatapathError> {
    match map {
        Map::LruHashMap(data) | Map::HashMap(data) => Ok((
            data.info()
                .map_err(DatapathError::map("inspecting", name))?
                .max_entries(),
            data.fd().as_fd().try_clone_to_owned().map_err(|io_error| {
                DatapathError::map("opening", name)(MapError::SyscallError(
                    aya::sys::SyscallError {
                        call: "dup",
                        io_error,
                    },
                ))
            })?,
        )),
        _ => Err(DatapathError::map("opening", name)(
            MapError::InvalidMapType { map_type: 0 },
        )),
    }
}

/// The capacity of a trie as the kernel reports it (0 for a map of another type, which
/// opening it as a trie then refuses).
fn trie_capacity(map: &Map, name: &'static str) -> Result<u32, DatapathError> {
    match map {
        Map::LpmTrie(data) => Ok(data
            .info()
            .map_err(DatapathError::map("inspecting", name))?
            .max_entries()),
        _ => Ok(0),
    }
}

fn from_pin(dir: &Path, name: &'static str) -> Result<Map, DatapathError> {
    let path = dir.join(name);
    if !path.exists() {
        return Err(DatapathError::NotPinned(dir.to_path_buf()));
    }
    let data = MapData::from_pin(&path).map_err(DatapathError::map("opening pinned", name))?;
    Map::from_map_data(data).map_err(DatapathError::map("opening pinned", name))
}

impl DatapathMaps {
    /// Takes the maps out of a loaded object (the programs keep their own references).
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, DatapathError> {
        Self::assemble(|name| take(ebpf, name))
    }

    /// Opens the maps pinned under `dir` by a running or previous agent.
    pub fn from_pins(dir: &Path) -> Result<Self, DatapathError> {
        Self::assemble(|name| from_pin(dir, name))
    }

    /// The handles on the maps `get` gives.
    fn assemble(
        mut get: impl FnMut(&'static str) -> Result<Map, DatapathError>,
    ) -> Result<Self, DatapathError> {
        let nat = get(MAP_NAT_V4)?;
        let (nat_capacity, nat_fd) = nat_table_info(&nat, MAP_NAT_V4)?;
        let nat_v6 = get(MAP_NAT_V6)?;
        let (nat_v6_capacity, nat_v6_fd) = nat_table_info(&nat_v6, MAP_NAT_V6)?;
        let nomasq = get(MAP_NOMASQ_V4)?;
        let nomasq_capacity = trie_capacity(&nomasq, MAP_NOMASQ_V4)?;
        let nomasq_v6 = get(MAP_NOMASQ_V6)?;
        let nomasq_v6_capacity = trie_capacity(&nomasq_v6, MAP_NOMASQ_V6)?;
        let nomasq_src = get(MAP_NOMASQ_SRC_V4)?;
        let nomasq_src_capacity = trie_capacity(&nomasq_src, MAP_NOMASQ_SRC_V4)?;
        let nomasq_src_v6 = get(MAP_NOMASQ_SRC_V6)?;
        let nomasq_src_v6_capacity = trie_capacity(&nomasq_src_v6, MAP_NOMASQ_SRC_V6)?;
        Ok(Self {
            meta: typed(get(MAP_META)?, MAP_META)?,
            settings: typed(get(MAP_SETTINGS)?, MAP_SETTINGS)?,
            uplinks: typed(get(MAP_UPLINKS)?, MAP_UPLINKS)?,
            uplink_slots: typed(get(MAP_UPLINK_SLOTS)?, MAP_UPLINK_SLOTS)?,
            nomasq_v4: typed(nomasq, MAP_NOMASQ_V4)?,
            nomasq_capacity,
            nat_v4: typed(nat, MAP_NAT_V4)?,
            nat_fd,
            nat_capacity,
            frags_v4: typed(get(MAP_FRAGS_V4)?, MAP_FRAGS_V4)?,
            counters: typed(get(MAP_COUNTERS)?, MAP_COUNTERS)?,
            alloc_retries: typed(get(MAP_ALLOC_RETRIES)?, MAP_ALLOC_RETRIES)?,
            nomasq_v6: typed(nomasq_v6, MAP_NOMASQ_V6)?,
            nomasq_v6_capacity,
            nat_v6: typed(nat_v6, MAP_NAT_V6)?,
            nat_v6_fd,
            nat_v6_capacity,
            counters_v6: typed(get(MAP_COUNTERS_V6)?, MAP_COUNTERS_V6)?,
            nomasq_src_v4: typed(nomasq_src, MAP_NOMASQ_SRC_V4)?,
            nomasq_src_capacity,
            nomasq_src_v6: typed(nomasq_src_v6, MAP_NOMASQ_SRC_V6)?,
            nomasq_src_v6_capacity,
            buried_v4: typed(get(MAP_BURIED_V4)?, MAP_BURIED_V4)?,
            buried_v6: typed(get(MAP_BURIED_V6)?, MAP_BURIED_V6)?,
            holders_v4: typed(get(MAP_HOLDERS_V4)?, MAP_HOLDERS_V4)?,
            holders_v6: typed(get(MAP_HOLDERS_V6)?, MAP_HOLDERS_V6)?,
            remote_holders_v4: typed(get(MAP_REMOTE_HOLDERS_V4)?, MAP_REMOTE_HOLDERS_V4)?,
            remote_holders_v6: typed(get(MAP_REMOTE_HOLDERS_V6)?, MAP_REMOTE_HOLDERS_V6)?,
            evictions: typed(get(MAP_EVICTIONS)?, MAP_EVICTIONS)?,
            evictions_v6: typed(get(MAP_EVICTIONS_V6)?, MAP_EVICTIONS_V6)?,
            nomasq_last_synced: None,
            nomasq_v6_last_synced: None,
            nomasq_src_last_synced: None,
            nomasq_src_v6_last_synced: None,
        })
    }

    /// The settings the datapath runs with.
    pub fn settings(&self) -> Result<Settings, DatapathError> {
        self.settings
            .get(&0, 0)
            .map_err(DatapathError::map("reading", MAP_SETTINGS))
    }

    /// Fills the settings' values that follow from the tables' capacities: the flow indexes'
    /// slots, and each family's holder share (see [`DatapathMaps::holder_shares`]).
    pub fn size_settings(&self, settings: &mut Settings, pod_share_percent: u8) {
        settings.flow_slots[FAMILY_IPV4] = flow_slots(self.nat_capacity);
        settings.flow_slots[FAMILY_IPV6] = flow_slots(self.nat_v6_capacity);
        settings.holder_share = self.holder_shares(pod_share_percent);
    }

    /// The unassured flows each local address may hold, by family (IPv4, IPv6):
    /// `pod_share_percent` of the family's table's flows, at least one; 0 (no limit) with 0.
    pub fn holder_shares(&self, pod_share_percent: u8) -> [u32; 2] {
        [self.nat_capacity, self.nat_v6_capacity].map(|entries| match pod_share_percent {
            0 => 0,
            percent => u32::try_from(u64::from(flow_slots(entries)) * u64::from(percent) / 100)
                .unwrap_or(u32::MAX)
                .max(1),
        })
    }

    /// Replaces the datapath settings; packets see them from their next lookup on.
    pub fn set_settings(&mut self, settings: &Settings) -> Result<(), DatapathError> {
        self.settings
            .set(0, settings, 0)
            .map_err(DatapathError::map("writing", MAP_SETTINGS))
    }

    /// Every interface masq translates on, by interface index, in index order.
    pub fn uplinks(&self) -> Result<Vec<(u32, Uplink)>, DatapathError> {
        let mut uplinks = Vec::new();
        for item in self.uplinks.iter() {
            match item {
                Ok(entry) => uplinks.push(entry),
                Err(MapError::KeyNotFound) => {}
                Err(error) => return Err(DatapathError::map("walking", MAP_UPLINKS)(error)),
            }
        }
        uplinks.sort_by_key(|(ifindex, _)| *ifindex);
        Ok(uplinks)
    }

    /// Records a flow the kernel's own NAT translated (netfilter's MASQUERADE, as read from
    /// conntrack) in the NAT table, both halves: its source leaves as `node:node_port`, and
    /// replies to that go back to the source. A flow of the node's own (source = node, as
    /// [`KernelFlow::reserved`] makes it) passes masq unchanged both ways, which keeps its port
    /// from every pod flow; a pod's flow is translated by masq from then on, as upstream's
    /// flows are after a take-over. Returns false, changing nothing, if masq already maps
    /// another flow to that reply tuple.
    pub fn insert_kernel_flow<A: NatTable>(
        &mut self,
        flow: &KernelFlow<A>,
        now_ns: u64,
    ) -> Result<bool, DatapathError>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        /// `BPF_ANY`: insert whatever the key holds.
        const ANY: u64 = 0;
        let origin = if flow.source == flow.node {
            ORIGIN_HOST
        } else {
            ORIGIN_POD
        };
        // conntrack's view of the flow becomes masq's: an answered TCP connection is taken as
        // established and assured (masq did not see its handshake: its windows are liberal,
        // see `flow::WINDOW_LIBERAL`), an answered datagram flow as replied.
        let state = match (flow.protocol, flow.replied) {
            (proto::TCP, _) => tcp::ESTABLISHED,
            (_, true) => datagram::REPLIED,
            (_, false) => datagram::UNREPLIED,
        };
        let liberal = masq_common::flow::Window {
            flags: masq_common::flow::WINDOW_LIBERAL,
            ..masq_common::flow::Window::EMPTY
        };
        let half = |addr, port, last_seen_ns| {
            let mut half = NatEntry::new(addr, port, origin, state, now_ns, last_seen_ns);
            half.assured = u8::from(flow.protocol == proto::TCP && flow.replied);
            half.with_window(if flow.protocol == proto::TCP {
                liberal
            } else {
                masq_common::flow::Window::EMPTY
            })
        };
        let reply_key = NatKey::new(
            flow.remote,
            flow.node,
            flow.remote_port,
            flow.node_port,
            flow.protocol,
            Direction::Ingress,
        );
        let reply_half = half(
            flow.source,
            flow.source_port,
            if flow.replied { now_ns } else { 0 },
        );
        // A pod flow may replace the node's own record of the same tuple: the node's packets
        // were the flow's, translated by netfilter, which masq now does itself.
        let replaces_identity = origin == ORIGIN_POD
            && A::table(self).get(&reply_key, 0).is_ok_and(|existing| {
                existing.origin == ORIGIN_HOST
                    && existing.addr == flow.node
                    && existing.port == flow.node_port
            });
        let flags = if replaces_identity { ANY } else { BPF_NOEXIST };
        match A::table_mut(self).insert(reply_key, reply_half, flags) {
            Ok(()) => {}
            Err(MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                return Ok(false);
            }
            Err(error) => return Err(DatapathError::map("writing", A::MAP_NAME)(error)),
        }
        if replaces_identity {
            // The node's half of the record goes too: a node packet from that port must not
            // find it and keep the port whose replies are the pod's now (it gets another, as a
            // clashing node flow does).
            let identity = NatKey::new(
                flow.node,
                flow.remote,
                flow.node_port,
                flow.remote_port,
                flow.protocol,
                Direction::Egress,
            );
            match A::table_mut(self).remove(&identity) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(error) => return Err(DatapathError::map("removing from", A::MAP_NAME)(error)),
            }
        }
        let egress_key = reply_key.peer(&reply_half);
        match A::table_mut(self).insert(
            egress_key,
            half(flow.node, flow.node_port, now_ns),
            BPF_NOEXIST,
        ) {
            Ok(()) => Ok(true),
            // The node's packets of this flow were tracked already.
            Err(MapError::SyscallError(error))
                if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(true)
            }
            Err(error) => Err(DatapathError::map("writing", A::MAP_NAME)(error)),
        }
    }

    /// Records (or updates) interface `ifindex`; its packets are translated from the next one.
    pub fn set_uplink(&mut self, ifindex: u32, uplink: &Uplink) -> Result<(), DatapathError> {
        self.uplinks
            .insert(ifindex, uplink, 0)
            .map_err(DatapathError::map("writing", MAP_UPLINKS))?;
        self.set_uplink_slot(ifindex, UplinkSlot::of(uplink))
    }

    /// Forgets interface `ifindex`; its packets pass untouched from the next one.
    pub fn remove_uplink(&mut self, ifindex: u32) -> Result<(), DatapathError> {
        self.set_uplink_slot(ifindex, UplinkSlot::default())?;
        match self.uplinks.remove(&ifindex) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(error) => Err(DatapathError::map("deleting from", MAP_UPLINKS)(error)),
        }
    }

    /// Writes the programs' array slot of interface `ifindex`, if it has one.
    fn set_uplink_slot(&mut self, ifindex: u32, slot: UplinkSlot) -> Result<(), DatapathError> {
        if ifindex >= UPLINK_INDEX_SLOTS {
            return Ok(());
        }
        self.uplink_slots
            .set(ifindex, slot, 0)
            .map_err(DatapathError::map("writing", MAP_UPLINK_SLOTS))
    }

    /// The layout record of the map set.
    pub fn meta(&self) -> Result<MapMeta, DatapathError> {
        self.meta
            .get(&0, 0)
            .map_err(DatapathError::map("reading", MAP_META))
    }

    /// Records the layout the maps were created with.
    pub fn set_meta(&mut self, meta: &MapMeta) -> Result<(), DatapathError> {
        self.meta
            .set(0, meta, 0)
            .map_err(DatapathError::map("writing", MAP_META))
    }

    /// Capacity of the non-masquerade trie as the kernel reports it.
    pub const fn nomasq_v4_capacity(&self) -> u32 {
        self.nomasq_capacity
    }

    /// Capacity of the NAT table as the kernel reports it.
    pub const fn nat_v4_capacity(&self) -> u32 {
        self.nat_capacity
    }

    /// Capacity of the IPv6 NAT table as the kernel reports it (1 when created without
    /// IPv6).
    pub const fn nat_v6_capacity(&self) -> u32 {
        self.nat_v6_capacity
    }

    /// Every counter summed over all CPUs, in index order.
    pub fn counter_totals(&self) -> Result<Vec<(Counter, u64)>, DatapathError> {
        Counter::ALL
            .iter()
            .map(|&counter| Ok((counter, self.counter(counter)?)))
            .collect()
    }

    /// Every IPv6 counter summed over all CPUs, in index order.
    pub fn counter_totals_v6(&self) -> Result<Vec<(Counter, u64)>, DatapathError> {
        Counter::ALL
            .iter()
            .map(|&counter| Ok((counter, self.counter_v6(counter)?)))
            .collect()
    }

    /// One IPv6 counter summed over all CPUs.
    pub fn counter_v6(&self, counter: Counter) -> Result<u64, DatapathError> {
        let per_cpu = self
            .counters_v6
            .get(&(counter as u32), 0)
            .map_err(DatapathError::map("reading", MAP_COUNTERS_V6))?;
        Ok(per_cpu.iter().sum())
    }

    /// One counter summed over all CPUs.
    pub fn counter(&self, counter: Counter) -> Result<u64, DatapathError> {
        let per_cpu = self
            .counters
            .get(&(counter as u32), 0)
            .map_err(DatapathError::map("reading", MAP_COUNTERS))?;
        Ok(per_cpu.iter().sum())
    }

    /// The allocation histogram summed over all CPUs: bucket `i` counts flows that got a port at
    /// attempt `i + 1`; the last bucket counts flows that got none.
    pub fn alloc_histogram(&self) -> Result<Vec<u64>, DatapathError> {
        (0..ALLOC_HISTOGRAM_BUCKETS)
            .map(|bucket| {
                let per_cpu = self
                    .alloc_retries
                    .get(&bucket, 0)
                    .map_err(DatapathError::map("reading", MAP_ALLOC_RETRIES))?;
                Ok(per_cpu.iter().sum())
            })
            .collect()
    }

    /// A family's evictions summed over all CPUs, by cause and class, in slot order (see
    /// `flow::eviction_slot`).
    pub fn evictions_of<A: NatTable>(
        &self,
    ) -> Result<Vec<(EvictionCause, FlowClass, u64)>, DatapathError>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        let mut totals = Vec::with_capacity(EVICTION_SLOTS as usize);
        for cause in EvictionCause::ALL {
            for class in FlowClass::ALL {
                let per_cpu = A::evictions(self)
                    .get(&eviction_slot(cause, class), 0)
                    .map_err(DatapathError::map("reading", A::EVICTIONS_MAP_NAME))?;
                totals.push((cause, class, per_cpu.iter().sum()));
            }
        }
        Ok(totals)
    }

    /// A family's holders: each local address and the unassured flows the datapath counts for
    /// it.
    pub fn holders_of<A: NatTable>(&self) -> Result<Vec<(A, u64)>, DatapathError>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        let mut holders = Vec::new();
        for item in A::holders(self).iter() {
            match item {
                Ok((holder, count)) => holders.push((holder, count.flows())),
                Err(MapError::KeyNotFound) => {}
                Err(error) => {
                    return Err(DatapathError::map("walking", A::HOLDERS_MAP_NAME)(error));
                }
            }
        }
        Ok(holders)
    }

    /// A snapshot of the NAT table, read in batches. Entries created or deleted during the read
    /// may be missed.
    pub fn nat_entries(&self) -> Result<Vec<(NatKeyV4, NatEntryV4)>, DatapathError> {
        self.nat_entries_of::<[u8; 4]>()
    }

    /// A snapshot of a family's NAT table, read in batches (see [`Self::nat_entries`]).
    pub fn nat_entries_of<A: NatTable>(&self) -> Result<NatSnapshot<A>, DatapathError>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        crate::sys::bpf::lookup_all(A::table_fd(self))
            .map_err(DatapathError::map("reading", A::MAP_NAME))
    }

    /// The IPv4 non-masquerade trie's entries as (address, prefix length, kind).
    pub fn nomasq_entries(&self) -> Result<Vec<([u8; 4], u8, u32)>, DatapathError> {
        Ok(self
            .trie_entries::<Ipv4Addr>()?
            .into_iter()
            .map(|((addr, prefix), kind)| (addr.octets(), prefix, kind))
            .collect())
    }

    /// A family's non-masquerade (destination) trie entries as ((address, prefix length),
    /// kind).
    pub fn trie_entries<A: NomasqTrie>(&self) -> Result<TrieEntries<A>, DatapathError> {
        self.trie_entries_of(Trie::Destinations)
    }

    /// The entries of a family's `trie` as ((address, prefix length), kind).
    pub fn trie_entries_of<A: NomasqTrie>(
        &self,
        trie: Trie,
    ) -> Result<TrieEntries<A>, DatapathError> {
        let mut entries = Vec::new();
        for item in A::trie(self, trie).iter() {
            let (key, kind): (Key<A::Octets>, u32) =
                item.map_err(DatapathError::map("walking", A::map_name(trie)))?;
            let prefix = u8::try_from(key.prefix_len()).unwrap_or(u8::MAX);
            entries.push(((A::from_octets(key.data()), prefix), kind));
        }
        Ok(entries)
    }
}
