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
    layout::{
        ADDED_MAPS, MAP_ALLOC_RETRIES, MAP_COUNTERS, MAP_COUNTERS_V6, MAP_EXPIRED_V4,
        MAP_EXPIRED_V6, MAP_FRAGS_V4, MAP_META, MAP_NAT_V4, MAP_NAT_V6, MAP_NOMASQ_SRC_V4,
        MAP_NOMASQ_SRC_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6, MAP_SETTINGS, MAP_UPLINK_SLOTS,
        MAP_UPLINKS, MapMeta, UPLINK_INDEX_SLOTS, Uplink, UplinkSlot,
    },
    nat::{
        Address, Direction, FLOW_ANSWERED, FLOW_SEEN, FlowMarks, FragEntryV4, FragKeyV4, NatEntry,
        NatEntryV4, NatEntryV6, NatKey, NatKeyV4, NatKeyV6, ORIGIN_HOST, ORIGIN_POD,
    },
    settings::Settings,
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
    /// Pod IPv4 sources never masqueraded (`nonMasqueradeSrcCIDRs`). Always there in a loaded
    /// datapath; `None` when opened from the pins of an older masq, which had none.
    pub nomasq_src_v4: Option<LpmTrie<MapData, [u8; 4], u32>>,
    /// The same for IPv6 pod sources.
    pub nomasq_src_v6: Option<LpmTrie<MapData, [u8; 16], u32>>,
    /// Egress halves of the TCP flows the agent removed, which a late segment may take back
    /// (see `gc::bury`). Only in a freshly loaded datapath: they are not pinned.
    pub expired_v4: Option<HashMap<MapData, NatKeyV4, NatEntryV4>>,
    /// The same for IPv6.
    pub expired_v6: Option<HashMap<MapData, NatKeyV6, NatEntryV6>>,
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
pub trait NatTable: Address
where
    NatKey<Self>: aya::Pod,
    NatEntry<Self>: aya::Pod,
{
    /// The table's map name.
    const MAP_NAME: &'static str;
    /// The map name of the family's table of removed TCP flows.
    const EXPIRED_MAP_NAME: &'static str;
    /// The family's table.
    fn table(maps: &DatapathMaps) -> &HashMap<MapData, NatKey<Self>, NatEntry<Self>>;
    /// The family's table, for deleting.
    fn table_mut(maps: &mut DatapathMaps) -> &mut HashMap<MapData, NatKey<Self>, NatEntry<Self>>;
    /// The table's descriptor, for batch reads.
    fn table_fd(maps: &DatapathMaps) -> BorrowedFd<'_>;
    /// The family's table of removed TCP flows, if this handle has it.
    fn expired_mut(
        maps: &mut DatapathMaps,
    ) -> Option<&mut HashMap<MapData, NatKey<Self>, NatEntry<Self>>>;
}

/// Implements [`NatTable`] for one family's address: its table, and the table's descriptor.
macro_rules! nat_table {
    ($address:ty, $map_name:expr, $table:ident, $fd:ident, $expired_name:expr, $expired:ident) => {
        impl NatTable for $address {
            const MAP_NAME: &'static str = $map_name;
            const EXPIRED_MAP_NAME: &'static str = $expired_name;
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
            fn expired_mut(
                maps: &mut DatapathMaps,
            ) -> Option<&mut HashMap<MapData, NatKey<Self>, NatEntry<Self>>> {
                maps.$expired.as_mut()
            }
        }
    };
}

nat_table!(
    [u8; 4],
    MAP_NAT_V4,
    nat_v4,
    nat_fd,
    MAP_EXPIRED_V4,
    expired_v4
);
nat_table!(
    [u8; 16],
    MAP_NAT_V6,
    nat_v6,
    nat_v6_fd,
    MAP_EXPIRED_V6,
    expired_v6
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
    /// The family's `trie`; `None` for a source trie the pins of an older masq lack.
    fn trie(maps: &DatapathMaps, trie: Trie) -> Option<&LpmTrie<MapData, Self::Octets, u32>>;
    /// The family's `trie`, for writing.
    fn trie_mut(
        maps: &mut DatapathMaps,
        trie: Trie,
    ) -> Option<&mut LpmTrie<MapData, Self::Octets, u32>>;
    /// Its capacity as the kernel reports it (0 when it is missing).
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
            fn trie(maps: &DatapathMaps, trie: Trie) -> Option<&LpmTrie<MapData, $octets, u32>> {
                match trie {
                    Trie::Destinations => Some(&maps.$trie),
                    Trie::Sources => maps.$source_trie.as_ref(),
                }
            }
            fn trie_mut(
                maps: &mut DatapathMaps,
                trie: Trie,
            ) -> Option<&mut LpmTrie<MapData, $octets, u32>> {
                match trie {
                    Trie::Destinations => Some(&mut maps.$trie),
                    Trie::Sources => maps.$source_trie.as_mut(),
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
        let expired_v4 = typed(take(ebpf, MAP_EXPIRED_V4)?, MAP_EXPIRED_V4)?;
        let expired_v6 = typed(take(ebpf, MAP_EXPIRED_V6)?, MAP_EXPIRED_V6)?;
        // The object defines every map, the ones added later too.
        Ok(Self {
            expired_v4: Some(expired_v4),
            expired_v6: Some(expired_v6),
            ..Self::assemble(|name| take(ebpf, name).map(Some))?
        })
    }

    /// Opens the maps pinned under `dir` by a running or previous agent. The source tries are
    /// `None` in the pins of an older masq, which had none (`ADDED_MAPS`).
    pub fn from_pins(dir: &Path) -> Result<Self, DatapathError> {
        Self::assemble(|name| {
            if ADDED_MAPS.contains(&name) && !dir.join(name).exists() {
                return Ok(None);
            }
            from_pin(dir, name).map(Some)
        })
    }

    /// The handles on the maps `get` gives; it may give `None` for the maps of `ADDED_MAPS`
    /// alone.
    fn assemble(
        mut get_any: impl FnMut(&'static str) -> Result<Option<Map>, DatapathError>,
    ) -> Result<Self, DatapathError> {
        let (nomasq_src_v4, nomasq_src_capacity) = match get_any(MAP_NOMASQ_SRC_V4)? {
            Some(map) => {
                let capacity = trie_capacity(&map, MAP_NOMASQ_SRC_V4)?;
                (Some(typed(map, MAP_NOMASQ_SRC_V4)?), capacity)
            }
            None => (None, 0),
        };
        let (nomasq_src_v6, nomasq_src_v6_capacity) = match get_any(MAP_NOMASQ_SRC_V6)? {
            Some(map) => {
                let capacity = trie_capacity(&map, MAP_NOMASQ_SRC_V6)?;
                (Some(typed(map, MAP_NOMASQ_SRC_V6)?), capacity)
            }
            None => (None, 0),
        };
        let mut get = |name| get_any(name)?.ok_or(DatapathError::Missing { kind: "map", name });
        let nat = get(MAP_NAT_V4)?;
        let (nat_capacity, nat_fd) = nat_table_info(&nat, MAP_NAT_V4)?;
        let nat_v6 = get(MAP_NAT_V6)?;
        let (nat_v6_capacity, nat_v6_fd) = nat_table_info(&nat_v6, MAP_NAT_V6)?;
        let nomasq = get(MAP_NOMASQ_V4)?;
        let nomasq_capacity = trie_capacity(&nomasq, MAP_NOMASQ_V4)?;
        let nomasq_v6 = get(MAP_NOMASQ_V6)?;
        let nomasq_v6_capacity = trie_capacity(&nomasq_v6, MAP_NOMASQ_V6)?;
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
            nomasq_src_v4,
            nomasq_src_capacity,
            nomasq_src_v6,
            nomasq_src_v6_capacity,
            expired_v4: None,
            expired_v6: None,
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
        let half = |addr, port, marks| {
            NatEntry::new(
                addr,
                port,
                origin,
                FlowMarks::from_bits(marks),
                now_ns,
                now_ns,
            )
        };
        let reply_key = NatKey::new(
            flow.remote,
            flow.node,
            flow.remote_port,
            flow.node_port,
            flow.protocol,
            Direction::Ingress,
        );
        let reply_marks = if flow.replied { FLOW_SEEN } else { 0 };
        let reply_half = half(flow.source, flow.source_port, reply_marks);
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
        let egress_key = reply_key.peer(&reply_half);
        match A::table_mut(self).insert(
            egress_key,
            half(flow.node, flow.node_port, FLOW_SEEN | FLOW_ANSWERED),
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
        super::batch::lookup_all(A::table_fd(self))
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

    /// The entries of a family's `trie` as ((address, prefix length), kind); none when it is
    /// missing (a source trie the pins of an older masq lack).
    pub fn trie_entries_of<A: NomasqTrie>(
        &self,
        trie: Trie,
    ) -> Result<TrieEntries<A>, DatapathError> {
        let mut entries = Vec::new();
        let Some(map) = A::trie(self, trie) else {
            return Ok(entries);
        };
        for item in map.iter() {
            let (key, kind): (Key<A::Octets>, u32) =
                item.map_err(DatapathError::map("walking", A::map_name(trie)))?;
            let prefix = u8::try_from(key.prefix_len()).unwrap_or(u8::MAX);
            entries.push(((A::from_octets(key.data()), prefix), kind));
        }
        Ok(entries)
    }
}
