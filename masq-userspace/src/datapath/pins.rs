//! The pin directory: where the datapath's maps and tcx links live on bpffs so that they
//! outlive the agent, and the checks that make adopting them safe.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::maps::{MapData, MapInfo, MapType};
use masq_common::{
    counters::{ALLOC_HISTOGRAM_BUCKETS, COUNTER_COUNT},
    flow::EVICTION_SLOTS,
    layout::{
        ALL_MAPS, BURIED_MAX_ENTRIES, FRAGS_V4_MAX_ENTRIES, HOLDERS_MAX_ENTRIES, MAP_ALLOC_RETRIES,
        MAP_BURIED_V4, MAP_BURIED_V6, MAP_COUNTERS, MAP_COUNTERS_V6, MAP_EVICTIONS,
        MAP_EVICTIONS_V6, MAP_FLOW_CURSOR, MAP_FLOW_INDEX_V4, MAP_FLOW_INDEX_V6, MAP_FRAGS_V4,
        MAP_FRAGS_V6, MAP_HANDOFF, MAP_HANDOFF_V6, MAP_HOLDERS_V4, MAP_HOLDERS_V6,
        MAP_LAYOUT_VERSION, MAP_META, MAP_NAT_V4, MAP_NAT_V6, MAP_NOMASQ_SRC_V4, MAP_NOMASQ_SRC_V6,
        MAP_NOMASQ_V4, MAP_NOMASQ_V6, MAP_PROGS, MAP_REMOTE_HOLDERS_V4, MAP_REMOTE_HOLDERS_V6,
        MAP_SETTINGS, MAP_UPLINK_SLOTS, MAP_UPLINKS, MapMeta, NOMASQ_SRC_MAX_ENTRIES, PROG_SLOTS,
        REMOTE_HOLDERS_MAX_ENTRIES, UPLINK_INDEX_SLOTS, UPLINKS_MAX_ENTRIES, Uplink, UplinkSlot,
    },
    nat::{
        FragEntryV4, FragEntryV6, FragKeyV4, FragKeyV6, HandoffV4, HandoffV6, Holder, NatEntryV4,
        NatEntryV6, NatKeyV4, NatKeyV6, RemoteHolderV4, RemoteHolderV6,
    },
    settings::Settings,
};

use super::error::DatapathError;
use crate::sys::fs::{Lock, LockRefused, lock_exclusive_now, mounted_at_or_above};

/// The default pin directory.
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/masq";

/// Which way a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// TC egress.
    Egress,
    /// TC ingress.
    Ingress,
}

impl Hook {
    /// Name used in pin paths and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Egress => "egress",
            Self::Ingress => "ingress",
        }
    }
}

/// The layout of one pin directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinDir {
    root: PathBuf,
}

/// What was found pinned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinnedState {
    /// Nothing: a fresh install.
    Empty,
    /// Maps of an install that was interrupted before it completed (no layout record): nothing
    /// can be using them, so they are removed and the install starts over.
    Leftovers(Vec<&'static str>),
    /// A map set this version can adopt, and the capacities it was created with.
    Compatible(PinnedCapacities),
    /// Pins this version must not adopt, and why.
    Incompatible(String),
}

/// The capacities a pinned map set was created with, where they are chosen at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedCapacities {
    /// The NAT table's.
    pub nat: u32,
    /// The non-masquerade trie's.
    pub nomasq: u32,
    /// The IPv6 NAT table's (`IPV6_DISABLED_ENTRIES` when an agent without `--enable-ipv6`
    /// created it).
    pub nat_v6: u32,
    /// The IPv6 non-masquerade trie's.
    pub nomasq_v6: u32,
}

/// The kernel properties a pinned map must have for this version to use it.
struct ExpectedMap {
    name: &'static str,
    map_type: MapType,
    key_size: usize,
    value_size: usize,
    /// `None` where the capacity is chosen at load time.
    max_entries: Option<u32>,
}

fn expected_maps() -> [ExpectedMap; 29] {
    [
        ExpectedMap {
            name: MAP_META,
            map_type: MapType::Array,
            key_size: 4,
            value_size: size_of::<MapMeta>(),
            max_entries: Some(1),
        },
        ExpectedMap {
            name: MAP_SETTINGS,
            map_type: MapType::Array,
            key_size: 4,
            value_size: size_of::<Settings>(),
            max_entries: Some(1),
        },
        ExpectedMap {
            name: MAP_UPLINKS,
            map_type: MapType::Hash,
            key_size: 4,
            value_size: size_of::<Uplink>(),
            max_entries: Some(UPLINKS_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_UPLINK_SLOTS,
            map_type: MapType::Array,
            key_size: 4,
            value_size: size_of::<UplinkSlot>(),
            max_entries: Some(UPLINK_INDEX_SLOTS),
        },
        ExpectedMap {
            name: MAP_NOMASQ_V4,
            map_type: MapType::LpmTrie,
            key_size: 8,
            value_size: 4,
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_NAT_V4,
            map_type: MapType::Hash,
            key_size: size_of::<NatKeyV4>(),
            value_size: size_of::<NatEntryV4>(),
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_FRAGS_V4,
            map_type: MapType::LruHash,
            key_size: size_of::<FragKeyV4>(),
            value_size: size_of::<FragEntryV4>(),
            max_entries: Some(FRAGS_V4_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_COUNTERS,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: 8,
            max_entries: Some(COUNTER_COUNT),
        },
        ExpectedMap {
            name: MAP_ALLOC_RETRIES,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: 8,
            max_entries: Some(ALLOC_HISTOGRAM_BUCKETS),
        },
        ExpectedMap {
            name: MAP_PROGS,
            map_type: MapType::ProgramArray,
            key_size: 4,
            value_size: 4,
            max_entries: Some(PROG_SLOTS),
        },
        ExpectedMap {
            name: MAP_HANDOFF,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: size_of::<HandoffV4>(),
            max_entries: Some(1),
        },
        ExpectedMap {
            name: MAP_NOMASQ_V6,
            map_type: MapType::LpmTrie,
            key_size: 20,
            value_size: 4,
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_NAT_V6,
            map_type: MapType::Hash,
            key_size: size_of::<NatKeyV6>(),
            value_size: size_of::<NatEntryV6>(),
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_COUNTERS_V6,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: 8,
            max_entries: Some(COUNTER_COUNT),
        },
        ExpectedMap {
            name: MAP_HANDOFF_V6,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: size_of::<HandoffV6>(),
            max_entries: Some(1),
        },
        ExpectedMap {
            name: MAP_FRAGS_V6,
            map_type: MapType::LruHash,
            key_size: size_of::<FragKeyV6>(),
            value_size: size_of::<FragEntryV6>(),
            max_entries: Some(FRAGS_V4_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_NOMASQ_SRC_V4,
            map_type: MapType::LpmTrie,
            key_size: 8,
            value_size: 4,
            max_entries: Some(NOMASQ_SRC_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_NOMASQ_SRC_V6,
            map_type: MapType::LpmTrie,
            key_size: 20,
            value_size: 4,
            max_entries: Some(NOMASQ_SRC_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_BURIED_V4,
            map_type: MapType::LruHash,
            key_size: size_of::<NatKeyV4>(),
            value_size: size_of::<NatEntryV4>(),
            max_entries: Some(BURIED_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_BURIED_V6,
            map_type: MapType::LruHash,
            key_size: size_of::<NatKeyV6>(),
            value_size: size_of::<NatEntryV6>(),
            max_entries: Some(BURIED_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_HOLDERS_V4,
            map_type: MapType::LruHash,
            key_size: 4,
            value_size: size_of::<Holder>(),
            max_entries: Some(HOLDERS_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_HOLDERS_V6,
            map_type: MapType::LruHash,
            key_size: 16,
            value_size: size_of::<Holder>(),
            max_entries: Some(HOLDERS_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_REMOTE_HOLDERS_V4,
            map_type: MapType::Hash,
            key_size: size_of::<RemoteHolderV4>(),
            value_size: 8,
            max_entries: Some(REMOTE_HOLDERS_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_REMOTE_HOLDERS_V6,
            map_type: MapType::Hash,
            key_size: size_of::<RemoteHolderV6>(),
            value_size: 8,
            max_entries: Some(REMOTE_HOLDERS_MAX_ENTRIES),
        },
        ExpectedMap {
            name: MAP_FLOW_INDEX_V4,
            map_type: MapType::Array,
            key_size: 4,
            value_size: size_of::<NatKeyV4>(),
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_FLOW_INDEX_V6,
            map_type: MapType::Array,
            key_size: 4,
            value_size: size_of::<NatKeyV6>(),
            max_entries: None,
        },
        ExpectedMap {
            name: MAP_FLOW_CURSOR,
            map_type: MapType::Array,
            key_size: 4,
            value_size: 8,
            max_entries: Some(2),
        },
        ExpectedMap {
            name: MAP_EVICTIONS,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: 8,
            max_entries: Some(EVICTION_SLOTS),
        },
        ExpectedMap {
            name: MAP_EVICTIONS_V6,
            map_type: MapType::PerCpuArray,
            key_size: 4,
            value_size: 8,
            max_entries: Some(EVICTION_SLOTS),
        },
    ]
}

impl PinDir {
    /// The pin directory at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Where the tcx link of `hook` on `interface` is pinned.
    pub fn link(&self, hook: Hook, interface: &str) -> PathBuf {
        self.root
            .join("links")
            .join(format!("{}-{interface}", hook.name()))
    }

    /// Every pinned link: (hook, interface, path).
    pub fn links(&self) -> Vec<(Hook, String, PathBuf)> {
        let Ok(entries) = fs::read_dir(self.root.join("links")) else {
            return Vec::new();
        };
        let mut links: Vec<(Hook, String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().to_str()?.to_owned();
                let (hook, interface) = name.split_once('-')?;
                let hook = match hook {
                    "egress" => Hook::Egress,
                    "ingress" => Hook::Ingress,
                    _ => return None,
                };
                Some((hook, interface.to_owned(), entry.path()))
            })
            .collect();
        links.sort_by(|a, b| a.2.cmp(&b.2));
        links
    }

    /// Creates the directories pins go into.
    pub fn create(&self) -> Result<(), DatapathError> {
        let links = self.root.join("links");
        fs::create_dir_all(&links).map_err(|source| DatapathError::Io {
            what: "creating",
            path: links,
            source,
        })
    }

    /// Inspects what is pinned and whether this version can adopt it.
    pub fn inspect(&self) -> Result<PinnedState, DatapathError> {
        let present: Vec<&'static str> = ALL_MAPS
            .iter()
            .copied()
            .filter(|name| self.map(name).exists())
            .collect();
        if present.is_empty() {
            return Ok(PinnedState::Empty);
        }
        // The layout record is published last: without it the install never completed and no
        // program was attached to these maps.
        if !present.contains(&MAP_META) {
            return Ok(PinnedState::Leftovers(present));
        }
        let missing: Vec<&'static str> = ALL_MAPS
            .iter()
            .copied()
            .filter(|name| !present.contains(name))
            .collect();
        if !missing.is_empty() {
            return Ok(PinnedState::Incompatible(format!(
                "maps missing: {}",
                missing.join(", ")
            )));
        }
        let mut capacities = PinnedCapacities {
            nat: 0,
            nomasq: 0,
            nat_v6: 0,
            nomasq_v6: 0,
        };
        for expected in expected_maps() {
            let path = self.map(expected.name);
            let info = MapInfo::from_pin(&path)
                .map_err(DatapathError::map("inspecting pinned", expected.name))?;
            let map_type = info
                .map_type()
                .map_err(DatapathError::map("inspecting pinned", expected.name))?;
            let actual = (
                map_type,
                info.key_size() as usize,
                info.value_size() as usize,
            );
            if actual != (expected.map_type, expected.key_size, expected.value_size) {
                return Ok(PinnedState::Incompatible(format!(
                    "{} is a {:?} with {}-byte keys and {}-byte values, expected a {:?} with {}-byte keys and {}-byte values",
                    expected.name,
                    actual.0,
                    actual.1,
                    actual.2,
                    expected.map_type,
                    expected.key_size,
                    expected.value_size
                )));
            }
            if let Some(max_entries) = expected.max_entries
                && info.max_entries() != max_entries
            {
                return Ok(PinnedState::Incompatible(format!(
                    "{} holds {} entries, expected {max_entries}",
                    expected.name,
                    info.max_entries()
                )));
            }
            match expected.name {
                MAP_NAT_V4 => capacities.nat = info.max_entries(),
                MAP_NOMASQ_V4 => capacities.nomasq = info.max_entries(),
                MAP_NAT_V6 => capacities.nat_v6 = info.max_entries(),
                MAP_NOMASQ_V6 => capacities.nomasq_v6 = info.max_entries(),
                _ => {}
            }
        }
        let meta = read_meta(&self.map(MAP_META))?;
        if meta.layout_version != MAP_LAYOUT_VERSION {
            return Ok(PinnedState::Incompatible(format!(
                "map layout version {} (this masq uses {MAP_LAYOUT_VERSION})",
                meta.layout_version
            )));
        }
        Ok(PinnedState::Compatible(capacities))
    }

    /// Where the running datapath's programs are pinned: `programs/<name>`. The filters and
    /// links keep the programs alive; the pins are there so that `masq status` can read what
    /// the verifier made of them, which needs only bpffs permissions on a pin (by program id,
    /// it would need `CAP_SYS_ADMIN`).
    pub fn program(&self, name: &str) -> PathBuf {
        self.root.join("programs").join(name)
    }

    /// The pinned programs, as `(name, path)`, sorted by name.
    pub fn programs(&self) -> Vec<(String, PathBuf)> {
        let Ok(entries) = fs::read_dir(self.root.join("programs")) else {
            return Vec::new();
        };
        let mut programs: Vec<(String, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| Some((entry.file_name().to_str()?.to_owned(), entry.path())))
            .collect();
        programs.sort();
        programs
    }

    /// Removes every pin: links first (which detaches the programs), then the programs and
    /// the maps. Returns what was removed.
    pub fn remove_all(&self) -> Result<Vec<PathBuf>, DatapathError> {
        let mut removed = Vec::new();
        for (_, _, path) in self.links() {
            remove_file(&path)?;
            removed.push(path);
        }
        for (_, path) in self.programs() {
            remove_file(&path)?;
            removed.push(path);
        }
        for name in ALL_MAPS {
            let path = self.map(name);
            if fs::symlink_metadata(&path).is_ok() {
                remove_file(&path)?;
                removed.push(path);
            }
        }
        for dir in [
            self.root.join("links"),
            self.root.join("programs"),
            self.root.clone(),
        ] {
            match fs::remove_dir(&dir) {
                Ok(()) => removed.push(dir),
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(DatapathError::Io {
                        what: "removing",
                        path: dir,
                        source,
                    });
                }
            }
        }
        Ok(removed)
    }

    /// Where a fresh map set is built before it is published into the pin directory: a sibling
    /// on the same bpffs, so publishing is a rename (bpffs refuses dots in names).
    pub fn staging(&self) -> PathBuf {
        let name = self
            .root
            .file_name()
            .map_or_else(|| "masq".into(), |name| name.to_string_lossy().into_owned());
        self.root
            .parent()
            .unwrap_or_else(|| Path::new("/"))
            .join(format!("{name}-staging"))
    }

    /// Creates the staging directory and returns it.
    pub fn create_staging(&self) -> Result<PathBuf, DatapathError> {
        let staging = self.staging();
        fs::create_dir_all(&staging).map_err(|source| DatapathError::Io {
            what: "creating",
            path: staging.clone(),
            source,
        })?;
        Ok(staging)
    }

    /// Removes what an interrupted install left in the staging directory; returns whether
    /// there was anything.
    pub fn remove_staging(&self) -> Result<bool, DatapathError> {
        let staging = self.staging();
        let Ok(entries) = fs::read_dir(&staging) else {
            return Ok(false);
        };
        for entry in entries.filter_map(Result::ok) {
            remove_file(&entry.path())?;
        }
        fs::remove_dir(&staging).map_err(|source| DatapathError::Io {
            what: "removing",
            path: staging,
            source,
        })?;
        Ok(true)
    }

    /// Moves a complete map set from the staging directory into the pin directory, the layout
    /// record last: a kill at any instant leaves either no record (leftovers the next start
    /// removes) or a complete set it adopts.
    pub fn publish(&self) -> Result<(), DatapathError> {
        let order: Vec<&str> = ALL_MAPS
            .iter()
            .copied()
            .filter(|&name| name != MAP_META)
            .chain([MAP_META])
            .collect();
        self.publish_staged(&order)
    }

    /// Renames the staged maps `names`, in order, into the pin directory (each rename replaces
    /// a pin atomically), then removes the staging directory.
    pub fn publish_staged(&self, names: &[&str]) -> Result<(), DatapathError> {
        let staging = self.staging();
        for name in names {
            let from = staging.join(name);
            fs::rename(&from, self.map(name)).map_err(|source| DatapathError::Io {
                what: "publishing",
                path: from,
                source,
            })?;
        }
        fs::remove_dir(&staging).map_err(|source| DatapathError::Io {
            what: "removing",
            path: staging,
            source,
        })
    }

    /// Takes the pin directory for this process: one agent per pin path. The lock is released
    /// when the returned descriptor is closed, also when the process dies.
    pub(crate) fn lock(&self) -> Result<Lock, DatapathError> {
        let directory = fs::File::open(&self.root).map_err(|source| DatapathError::Io {
            what: "opening",
            path: self.root.clone(),
            source,
        })?;
        lock_exclusive_now(directory).map_err(|refused| match refused {
            LockRefused::Held => DatapathError::PinPathInUse(self.root.clone()),
            LockRefused::Failed(source) => DatapathError::Io {
                what: "locking",
                path: self.root.clone(),
                source,
            },
        })
    }

    /// Removes the pinned maps only, so that a fresh set can be created (links stay, and keep
    /// running the old programs until they are updated).
    pub fn remove_maps(&self) -> Result<(), DatapathError> {
        for name in ALL_MAPS {
            let path = self.map(name);
            if fs::symlink_metadata(&path).is_ok() {
                remove_file(&path)?;
            }
        }
        Ok(())
    }
}

fn remove_file(path: &Path) -> Result<(), DatapathError> {
    fs::remove_file(path).map_err(|source| DatapathError::Io {
        what: "removing",
        path: path.to_path_buf(),
        source,
    })
}

fn read_meta(path: &Path) -> Result<MapMeta, DatapathError> {
    let data = MapData::from_pin(path).map_err(DatapathError::map("opening pinned", MAP_META))?;
    let map = aya::maps::Map::from_map_data(data)
        .map_err(DatapathError::map("opening pinned", MAP_META))?;
    let array: aya::maps::Array<MapData, MapMeta> = map
        .try_into()
        .map_err(DatapathError::map("opening pinned", MAP_META))?;
    array
        .get(&0, 0)
        .map_err(DatapathError::map("reading", MAP_META))
}

/// Whether bpffs is mounted at or above `path` (pins elsewhere vanish or fail).
pub fn is_on_bpffs(path: &Path) -> bool {
    mounted_at_or_above(path, "bpf")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let pins = PinDir::new("/sys/fs/bpf/masq");
        assert_eq!(
            pins.map(MAP_NAT_V4),
            Path::new("/sys/fs/bpf/masq/masq_nat_v4")
        );
        assert_eq!(
            pins.link(Hook::Egress, "eth0"),
            Path::new("/sys/fs/bpf/masq/links/egress-eth0")
        );
    }

    #[test]
    fn an_empty_directory_is_a_fresh_install() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(
            PinDir::new(dir.path()).inspect().expect("inspect"),
            PinnedState::Empty
        );
        assert!(PinDir::new(dir.path()).links().is_empty());
    }

    #[test]
    fn maps_without_a_layout_record_are_leftovers_not_a_datapath() {
        // The record is published last: without it the install never completed.
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(MAP_NAT_V4), b"").expect("write");
        assert_eq!(
            PinDir::new(dir.path()).inspect().expect("inspect"),
            PinnedState::Leftovers(vec![MAP_NAT_V4])
        );
    }

    #[test]
    fn the_staging_directory_is_a_sibling_without_dots() {
        let pins = PinDir::new("/sys/fs/bpf/masq");
        assert_eq!(pins.staging(), Path::new("/sys/fs/bpf/masq-staging"));
    }
}
