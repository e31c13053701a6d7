//! Typed handles on the datapath maps, whether freshly loaded or adopted from pins.

use std::path::Path;

use aya::{
    Ebpf,
    maps::{Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key},
};
use masq_common::{
    counters::{ALLOC_HISTOGRAM_BUCKETS, Counter},
    layout::{
        MAP_ALLOC_RETRIES, MAP_COUNTERS, MAP_COUNTERS_V6, MAP_FRAGS_V4, MAP_META, MAP_NAT_V4,
        MAP_NAT_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6, MAP_SETTINGS, MAP_UPLINK_SLOTS, MAP_UPLINKS,
        MapMeta, UPLINK_INDEX_SLOTS, Uplink, UplinkSlot,
    },
    nat::{FragEntryV4, FragKeyV4, NatEntryV4, NatEntryV6, NatKeyV4, NatKeyV6},
    settings::Settings,
};

use super::error::DatapathError;

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
    /// The NAT table's own descriptor, for batch reads (aya's typed map does not lend its).
    nat_fd: std::os::fd::OwnedFd,
    nat_capacity: u32,
    nomasq_capacity: u32,
    /// What the last successful trie sync wrote (see `sync::TrieView`); `None` when unknown.
    pub(crate) nomasq_last_synced:
        Option<std::collections::BTreeMap<(std::net::Ipv4Addr, u8), u32>>,
}

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

    fn assemble(
        mut get: impl FnMut(&'static str) -> Result<Map, DatapathError>,
    ) -> Result<Self, DatapathError> {
        let nat = get(MAP_NAT_V4)?;
        let (nat_capacity, nat_fd) = match &nat {
            Map::LruHashMap(data) | Map::HashMap(data) => (
                data.info()
                    .map_err(DatapathError::map("inspecting", MAP_NAT_V4))?
                    .max_entries(),
                std::os::fd::AsFd::as_fd(data.fd())
                    .try_clone_to_owned()
                    .map_err(|io_error| {
                        DatapathError::map("opening", MAP_NAT_V4)(MapError::SyscallError(
                            aya::sys::SyscallError {
                                call: "dup",
                                io_error,
                            },
                        ))
                    })?,
            ),
            _ => {
                return Err(DatapathError::map("opening", MAP_NAT_V4)(
                    MapError::InvalidMapType { map_type: 0 },
                ));
            }
        };
        let nomasq = get(MAP_NOMASQ_V4)?;
        let nomasq_capacity = match &nomasq {
            Map::LpmTrie(data) => data
                .info()
                .map_err(DatapathError::map("inspecting", MAP_NOMASQ_V4))?
                .max_entries(),
            _ => 0,
        };
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
            nomasq_v6: typed(get(MAP_NOMASQ_V6)?, MAP_NOMASQ_V6)?,
            nat_v6: typed(get(MAP_NAT_V6)?, MAP_NAT_V6)?,
            counters_v6: typed(get(MAP_COUNTERS_V6)?, MAP_COUNTERS_V6)?,
            nomasq_last_synced: None,
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

    /// Every counter summed over all CPUs, in index order.
    pub fn counter_totals(&self) -> Result<Vec<(Counter, u64)>, DatapathError> {
        Counter::ALL
            .iter()
            .map(|&counter| Ok((counter, self.counter(counter)?)))
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
        use std::os::fd::AsFd as _;
        super::batch::lookup_all(self.nat_fd.as_fd())
            .map_err(DatapathError::map("reading", MAP_NAT_V4))
    }

    /// The non-masquerade trie's entries as (address, prefix length, kind).
    pub fn nomasq_entries(&self) -> Result<Vec<([u8; 4], u8, u32)>, DatapathError> {
        let mut entries = Vec::new();
        for item in self.nomasq_v4.iter() {
            let (key, kind): (Key<[u8; 4]>, u32) =
                item.map_err(DatapathError::map("walking", MAP_NOMASQ_V4))?;
            let prefix = u8::try_from(key.prefix_len()).unwrap_or(u8::MAX);
            entries.push((key.data(), prefix, kind));
        }
        Ok(entries)
    }
}
