//! The compiled datapath object and how it is loaded.

use std::path::PathBuf;

use aya::{Ebpf, EbpfLoader, programs::SchedClassifier};
use masq_common::layout::{
    ALL_MAPS, MAP_NAT_V4, MAP_NOMASQ_V4, NAT_V4_DEFAULT_MAX_ENTRIES, NOMASQ_V4_MAX_ENTRIES,
    PROG_EGRESS, PROG_INGRESS,
};

use super::{error::DatapathError, maps::DatapathMaps};

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
    /// Where the trie is pinned when not with the other maps (a resized trie is built in the
    /// staging directory and then renamed over the old one).
    pub trie_pin_dir: Option<PathBuf>,
    /// Directory whose pinned maps are reused, and where new maps are pinned. `None` creates
    /// private maps that vanish with the process (tests, benchmarks).
    pub pin_dir: Option<PathBuf>,
    /// Compile in the per-packet debug records (aya-log). When false the log level is zero, the
    /// verifier sees a constant and removes the logging code: it costs nothing.
    pub debug_log: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            nat_max_entries: NAT_V4_DEFAULT_MAX_ENTRIES,
            nomasq_max_entries: NOMASQ_V4_MAX_ENTRIES,
            trie_pin_dir: None,
            pin_dir: None,
            debug_log: false,
        }
    }
}

/// aya-log's runtime level global in the eBPF object.
const LOG_LEVEL_GLOBAL: &str = "AYA_LOG_LEVEL";

/// The datapath programs loaded into the kernel (not attached) and their maps.
#[derive(Debug)]
pub struct Datapath {
    ebpf: Ebpf,
    /// Typed handles on the maps the programs use.
    pub maps: DatapathMaps,
}

impl Datapath {
    /// Creates (or, with a pin directory, adopts) the maps and loads both programs.
    pub fn load(options: &LoadOptions) -> Result<Self, DatapathError> {
        let log_level: u8 = if options.debug_log {
            aya_log::Level::Debug as u8
        } else {
            0
        };
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(MAP_NAT_V4, options.nat_max_entries);
        loader.map_max_entries(MAP_NOMASQ_V4, options.nomasq_max_entries);
        loader.override_global(LOG_LEVEL_GLOBAL, &log_level, true);
        if let Some(dir) = &options.pin_dir {
            for name in ALL_MAPS {
                let dir = match &options.trie_pin_dir {
                    Some(trie_dir) if name == MAP_NOMASQ_V4 => trie_dir,
                    _ => dir,
                };
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader.load(DATAPATH_OBJECT)?;
        for name in [PROG_EGRESS, PROG_INGRESS] {
            classifier_mut(&mut ebpf, name)?
                .load()
                .map_err(DatapathError::program("loading", name))?;
        }
        let maps = DatapathMaps::take(&mut ebpf)?;
        Ok(Self { ebpf, maps })
    }

    /// Starts forwarding the datapath's debug records to the `log` facade (and from there to
    /// tracing). Only useful when loaded with `debug_log`.
    pub fn take_logger(
        &mut self,
    ) -> Result<aya_log::EbpfLogger<&'static dyn log::Log>, DatapathError> {
        aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|error| DatapathError::Logger(error.to_string()))
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
