//! The compiled datapath object and how it is loaded.

use std::path::PathBuf;

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, ProgramArray},
    programs::SchedClassifier,
};
use masq_common::kernel::{CSUM_L4_IPV6_GLOBAL, MIN_KERNEL_L4_CSUM_IPV6};
use masq_common::layout::{
    ALL_MAPS, IPV6_DISABLED_ENTRIES, MAP_FLOW_INDEX_V4, MAP_FLOW_INDEX_V6, MAP_NAT_V4, MAP_NAT_V6,
    MAP_NOMASQ_V4, MAP_NOMASQ_V6, MAP_PROGS, NAT_V4_DEFAULT_MAX_ENTRIES, NOMASQ_V4_MAX_ENTRIES,
    PROG_ALLOCATOR, PROG_ALLOCATOR_V6, PROG_EGRESS, PROG_EGRESS_V6, PROG_FLOW_EVENT,
    PROG_FLOW_EVENT_V6, PROG_ICMP_ERROR_EGRESS_V6, PROG_ICMP_ERROR_INGRESS_V6, PROG_INGRESS,
    PROG_INGRESS_V6, PROG_PORT_SHARE, PROG_PORT_SHARE_V6, PROG_REVERSE_NAT, PROG_REVERSE_NAT_V6,
    PROG_SLOT_ALLOCATOR, PROG_SLOT_ALLOCATOR_V6, PROG_SLOT_EGRESS_V6, PROG_SLOT_FLOW_EVENT,
    PROG_SLOT_FLOW_EVENT_V6, PROG_SLOT_ICMP_ERROR_EGRESS_V6, PROG_SLOT_ICMP_ERROR_INGRESS_V6,
    PROG_SLOT_INGRESS_V6, PROG_SLOT_PORT_SHARE, PROG_SLOT_PORT_SHARE_V6, PROG_SLOT_REVERSE_NAT,
    PROG_SLOT_REVERSE_NAT_V6, PROG_SLOT_SOURCE_NAT, PROG_SLOT_SOURCE_NAT_V6, PROG_SOURCE_NAT,
    PROG_SOURCE_NAT_V6, flow_slots,
};

use super::{error::DatapathError, maps::DatapathMaps};
use crate::causes::WithCauses;

/// The eBPF object built from `masq-ebpf`, embedded at build time.
pub static DATAPATH_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/masq-ebpf"));

/// How to instantiate the datapath.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the NAT table in entries (two per flow).
    pub nat_max_entries: u32,
    /// Capacity of the non-masquerade trie in entries.
    pub nomasq_max_entries: u32,
    /// Maps pinned in another directory than the others: replacements (a resized trie, IPv6
    /// maps sized for translation) are built in the staging directory, then renamed over the
    /// old pins.
    pub staged: Option<StagedMaps>,
    /// Directory whose pinned maps are reused, and where new maps are pinned. `None` creates
    /// private maps that vanish with the process (tests, benchmarks).
    pub pin_dir: Option<PathBuf>,
    /// Compile in the per-packet debug records (aya-log). When false the log level is zero, the
    /// verifier sees a constant and removes the logging code: it costs nothing.
    pub debug_log: bool,
    /// Size the IPv6 NAT table and trie as the IPv4 ones; without it they get one entry each,
    /// so that a node that does not translate IPv6 does not pay for its table.
    pub ipv6: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            nat_max_entries: NAT_V4_DEFAULT_MAX_ENTRIES,
            nomasq_max_entries: NOMASQ_V4_MAX_ENTRIES,
            staged: None,
            pin_dir: None,
            debug_log: false,
            ipv6: false,
        }
    }
}

/// Maps created afresh in a directory of their own, to be renamed over their pinned
/// predecessors once complete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedMaps {
    /// Where they are pinned.
    pub dir: PathBuf,
    /// Which maps.
    pub names: Vec<&'static str>,
}

/// Every program of the object, in the order they are loaded.
pub const PROGRAMS: [&str; 16] = [
    PROG_EGRESS,
    PROG_INGRESS,
    PROG_ALLOCATOR,
    PROG_SOURCE_NAT,
    PROG_REVERSE_NAT,
    PROG_FLOW_EVENT,
    PROG_PORT_SHARE,
    PROG_EGRESS_V6,
    PROG_INGRESS_V6,
    PROG_ALLOCATOR_V6,
    PROG_SOURCE_NAT_V6,
    PROG_REVERSE_NAT_V6,
    PROG_FLOW_EVENT_V6,
    PROG_PORT_SHARE_V6,
    PROG_ICMP_ERROR_EGRESS_V6,
    PROG_ICMP_ERROR_INGRESS_V6,
];

/// aya-log's runtime level global in the eBPF object.
const LOG_LEVEL_GLOBAL: &str = "AYA_LOG_LEVEL";

/// Whether the running kernel's `bpf_l4_csum_replace` takes `BPF_F_IPV6` (Linux 6.16): the
/// IPv6 programs pass it where it exists and correct `skb->csum` themselves elsewhere. A kernel
/// whose release cannot be read gets the correction, which is right on every kernel.
fn kernel_takes_l4_csum_ipv6() -> bool {
    crate::node::kernel::Kernel::current()
        .is_ok_and(|kernel| kernel.version >= MIN_KERNEL_L4_CSUM_IPV6)
}

/// The datapath programs loaded into the kernel (not attached) and their maps.
pub struct Datapath {
    ebpf: Ebpf,
    /// Typed handles on the maps the programs use.
    pub maps: DatapathMaps,
    /// The program array the egress program tail-calls through, kept open (see
    /// `install_allocator`).
    _program_slots: ProgramArray<MapData>,
}

impl std::fmt::Debug for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Datapath")
            .field("ebpf", &self.ebpf)
            .field("maps", &self.maps)
            .finish_non_exhaustive()
    }
}

impl Datapath {
    /// Creates (or, with a pin directory, adopts) the maps, loads the programs and puts the
    /// tail-called programs in the slots the attached ones tail-call through. With adopted maps
    /// those slots may be serving attached programs: each replacement is one atomic update, so
    /// an in-flight packet meets the old program or the new one, never an empty slot.
    pub fn load(options: &LoadOptions) -> Result<Self, DatapathError> {
        let log_level: u8 = if options.debug_log {
            aya_log::Level::Debug as u8
        } else {
            0
        };
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(MAP_NAT_V4, options.nat_max_entries);
        loader.map_max_entries(MAP_NOMASQ_V4, options.nomasq_max_entries);
        let (nat_v6, nomasq_v6) = if options.ipv6 {
            (options.nat_max_entries, options.nomasq_max_entries)
        } else {
            (IPV6_DISABLED_ENTRIES, IPV6_DISABLED_ENTRIES)
        };
        loader.map_max_entries(MAP_NAT_V6, nat_v6);
        loader.map_max_entries(MAP_NOMASQ_V6, nomasq_v6);
        loader.map_max_entries(MAP_FLOW_INDEX_V4, flow_slots(options.nat_max_entries));
        loader.map_max_entries(MAP_FLOW_INDEX_V6, flow_slots(nat_v6));
        loader.override_global(LOG_LEVEL_GLOBAL, &log_level, true);
        let l4_csum_ipv6 = u8::from(kernel_takes_l4_csum_ipv6());
        loader.override_global(CSUM_L4_IPV6_GLOBAL, &l4_csum_ipv6, true);
        if let Some(dir) = &options.pin_dir {
            for name in ALL_MAPS {
                let dir = match &options.staged {
                    Some(staged) if staged.names.contains(&name) => &staged.dir,
                    _ => dir,
                };
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader
            .load(DATAPATH_OBJECT)
            .map_err(DatapathError::loading)?;
        for name in PROGRAMS {
            classifier_mut(&mut ebpf, name)?
                .load()
                .map_err(DatapathError::program("loading", name))?;
        }
        let program_slots = install_allocator(&mut ebpf)?;
        let maps = DatapathMaps::take(&mut ebpf)?;
        Ok(Self {
            ebpf,
            maps,
            _program_slots: program_slots,
        })
    }

    /// Starts forwarding the datapath's debug records to the `log` facade (and from there to
    /// tracing). Only useful when loaded with `debug_log`.
    pub fn take_logger(
        &mut self,
    ) -> Result<aya_log::EbpfLogger<&'static dyn log::Log>, DatapathError> {
        aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|error| DatapathError::Logger(WithCauses(&error).to_string()))
    }

    /// How many instructions the verifier processed for each program of [`PROGRAMS`], in that
    /// order: the measure of how close a program is to the verifier's limit on this kernel.
    /// `None` where the kernel does not tell (before Linux 5.16).
    pub fn verified_sizes(&self) -> Result<Vec<(&'static str, Option<u32>)>, DatapathError> {
        PROGRAMS
            .into_iter()
            .map(|name| {
                let info = classifier(&self.ebpf, name)?
                    .info()
                    .map_err(DatapathError::program("reading the info of", name))?;
                Ok((name, info.verified_instruction_count()))
            })
            .collect()
    }

    /// Pins every program at `pins.program(name)`, replacing the previous agent's pins.
    pub fn pin_programs(&mut self, pins: &super::pins::PinDir) -> Result<(), DatapathError> {
        for name in PROGRAMS {
            let path = pins.program(name);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|source| DatapathError::Io {
                    what: "creating",
                    path: dir.to_path_buf(),
                    source,
                })?;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(DatapathError::Io {
                        what: "replacing",
                        path,
                        source,
                    });
                }
            }
            classifier_mut(&mut self.ebpf, name)?
                .pin(&path)
                .map_err(|source| DatapathError::Pin {
                    what: format!("program {name}"),
                    path,
                    source,
                })?;
        }
        Ok(())
    }

    /// The egress classifier.
    pub fn egress(&self) -> Result<&SchedClassifier, DatapathError> {
        classifier(&self.ebpf, PROG_EGRESS)
    }

    /// The ingress classifier.
    pub fn ingress(&self) -> Result<&SchedClassifier, DatapathError> {
        classifier(&self.ebpf, PROG_INGRESS)
    }

    /// The egress classifier, for attaching.
    pub fn egress_mut(&mut self) -> Result<&mut SchedClassifier, DatapathError> {
        classifier_mut(&mut self.ebpf, PROG_EGRESS)
    }

    /// The ingress classifier, for attaching.
    pub fn ingress_mut(&mut self) -> Result<&mut SchedClassifier, DatapathError> {
        classifier_mut(&mut self.ebpf, PROG_INGRESS)
    }
}

/// Puts the tail-called programs in their slots of the program array and returns the array, which must stay
/// open: the kernel empties a program array when its last file descriptor closes and no pin
/// holds it (private maps in tests and benchmarks).
fn install_allocator(ebpf: &mut Ebpf) -> Result<ProgramArray<MapData>, DatapathError> {
    let map = ebpf.take_map(MAP_PROGS).ok_or(DatapathError::Missing {
        kind: "map",
        name: MAP_PROGS,
    })?;
    let mut slots =
        ProgramArray::try_from(map).map_err(DatapathError::map("opening", MAP_PROGS))?;
    for (slot, name) in [
        (PROG_SLOT_ALLOCATOR, PROG_ALLOCATOR),
        (PROG_SLOT_SOURCE_NAT, PROG_SOURCE_NAT),
        (PROG_SLOT_REVERSE_NAT, PROG_REVERSE_NAT),
        (PROG_SLOT_FLOW_EVENT, PROG_FLOW_EVENT),
        (PROG_SLOT_PORT_SHARE, PROG_PORT_SHARE),
        (PROG_SLOT_ALLOCATOR_V6, PROG_ALLOCATOR_V6),
        (PROG_SLOT_SOURCE_NAT_V6, PROG_SOURCE_NAT_V6),
        (PROG_SLOT_REVERSE_NAT_V6, PROG_REVERSE_NAT_V6),
        (PROG_SLOT_FLOW_EVENT_V6, PROG_FLOW_EVENT_V6),
        (PROG_SLOT_PORT_SHARE_V6, PROG_PORT_SHARE_V6),
        (PROG_SLOT_EGRESS_V6, PROG_EGRESS_V6),
        (PROG_SLOT_INGRESS_V6, PROG_INGRESS_V6),
        (PROG_SLOT_ICMP_ERROR_EGRESS_V6, PROG_ICMP_ERROR_EGRESS_V6),
        (PROG_SLOT_ICMP_ERROR_INGRESS_V6, PROG_ICMP_ERROR_INGRESS_V6),
    ] {
        let program = classifier(ebpf, name)?
            .fd()
            .map_err(DatapathError::program("opening", name))?;
        slots
            .set(slot, program, 0)
            .map_err(DatapathError::map("filling", MAP_PROGS))?;
    }
    Ok(slots)
}

fn classifier<'a>(
    ebpf: &'a Ebpf,
    name: &'static str,
) -> Result<&'a SchedClassifier, DatapathError> {
    let program = ebpf.program(name).ok_or(DatapathError::Missing {
        kind: "program",
        name,
    })?;
    program
        .try_into()
        .map_err(DatapathError::program("opening", name))
}

fn classifier_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, DatapathError> {
    let program = ebpf.program_mut(name).ok_or(DatapathError::Missing {
        kind: "program",
        name,
    })?;
    program
        .try_into()
        .map_err(DatapathError::program("opening", name))
}
