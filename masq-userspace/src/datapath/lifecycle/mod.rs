//! The pinned datapath's lifecycle: a fresh install, adopting what a previous agent pinned
//! (restarts and upgrades keep every flow), replacing pins of another layout when asked to, and
//! uninstalling.
//!
//! A start takes the pin directory for itself ([`HeldPins::take`]), decides from what is
//! pinned and what is requested ([`plan()`]), then does it ([`HeldPins::load`]). Every map set
//! it builds is built in the staging directory and published by rename, so that a kill at any
//! instant leaves either leftovers the next start removes or a complete set it adopts.

mod plan;
pub mod port_reservation;
mod uninstall;

use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::Key;
use masq_common::layout::{MAP_NAT_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6, MapMeta};

pub use self::{
    plan::{Adoption, Clearing, Plan, plan},
    uninstall::{UninstallStep, uninstall},
};
use super::{
    DatapathError,
    maps::DatapathMaps,
    object::{Datapath, LoadOptions, StagedMaps},
    pins::{PinDir, is_on_bpffs},
};
use crate::{node::reserved_ports::SysctlError, sys::fs::Lock};

/// What the pinned datapath is to be: where, and how large.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleOptions {
    /// The bpffs directory for pins (`--pin-path`).
    pub pin_path: PathBuf,
    /// The NAT table's capacity for a fresh install (`--nat-max-entries`).
    pub nat_max_entries: u32,
    /// The non-masquerade trie's capacity (`--nomasq-max-entries`).
    pub nomasq_max_entries: u32,
    /// Size the IPv6 maps for translation (`--enable-ipv6`).
    pub ipv6: bool,
    /// Replace pinned state of another layout instead of refusing to start
    /// (`--replace-incompatible-state`).
    pub replace_incompatible_state: bool,
    /// Compile in the per-packet debug records (`--datapath-debug-log`).
    pub debug_log: bool,
}

/// Why the pinned datapath could not be installed, adopted or uninstalled.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The pin path is not on bpffs, so nothing pinned there would outlive the agent.
    #[error(
        "the pin path {0} is not on a bpf filesystem, so the datapath could not outlive the agent. \
         Mount bpffs on the node: `mount -t bpf bpf /sys/fs/bpf` (to keep it across reboots, add \
         `bpffs /sys/fs/bpf bpf defaults 0 0` to /etc/fstab); in a container, also mount the node's \
         /sys/fs/bpf into it (deploy/'s DaemonSet does)"
    )]
    NotBpffs(PathBuf),
    /// The pinned maps were created by an incompatible version of masq.
    #[error(
        "the maps pinned under {pin_path} have an incompatible layout ({detail}); {running}. Run \
         `masq uninstall --pin-path {pin_path}` to remove them (live flows are lost), or start \
         the agent with --replace-incompatible-state",
        running = if *attached {
            "the datapath attached from them keeps running, untouched"
        } else {
            "no program is attached from them"
        }
    )]
    IncompatiblePins {
        /// The pin directory.
        pin_path: PathBuf,
        /// What differs.
        detail: String,
        /// Whether programs are attached from the pin directory (pinned links exist).
        attached: bool,
    },
    /// The maps or programs could not be loaded, pinned or removed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// The ports masq reserved could not be released.
    #[error(transparent)]
    Sysctl(#[from] SysctlError),
}

/// The pin directory, held by this process for its life: one agent per pin path.
#[derive(Debug)]
pub struct HeldPins {
    dir: PinDir,
    /// Released when the descriptor closes, also when the process dies.
    _lock: Lock,
}

/// The datapath a start loaded.
#[derive(Debug)]
pub struct Loaded {
    /// Its programs and maps.
    pub datapath: Datapath,
    /// The maps were adopted from a previous agent: their flows, trie and uplinks are live.
    pub adopted: bool,
    /// The NAT table's capacity (the pinned one when adopted).
    pub nat_max_entries: u32,
}

impl HeldPins {
    /// Checks that `pin_path` is on bpffs, creates it, and takes it for this process.
    pub fn take(pin_path: &Path) -> Result<Self, LifecycleError> {
        let dir = PinDir::new(pin_path);
        // Checked before anything is created: pins elsewhere vanish or fail.
        if !is_on_bpffs(dir.root()) {
            return Err(LifecycleError::NotBpffs(dir.root().to_path_buf()));
        }
        dir.create()?;
        let lock = dir.lock()?;
        Ok(Self { dir, _lock: lock })
    }

    /// The pin directory.
    pub const fn dir(&self) -> &PinDir {
        &self.dir
    }

    /// Installs the datapath afresh or adopts the pinned one, as [`plan()`] decides. Programs
    /// are loaded, not attached.
    pub fn load(&self, options: &LifecycleOptions) -> Result<Loaded, LifecycleError> {
        let pins = &self.dir;
        if pins.remove_staging()? {
            tracing::warn!(staging = %pins.staging().display(), "removed the maps of an install that was interrupted");
        }
        match plan(pins.inspect()?, options) {
            Plan::Install { clearing } => {
                match clearing {
                    Some(Clearing::Leftovers(maps)) => {
                        tracing::warn!(
                            ?maps,
                            "removing the maps of an install that was interrupted before it completed; starting afresh"
                        );
                        pins.remove_maps()?;
                    }
                    Some(Clearing::Incompatible(detail)) => {
                        tracing::warn!(%detail, "replacing incompatible pinned state as requested; live flows are lost");
                        pins.remove_maps()?;
                    }
                    None => {}
                }
                Ok(Loaded {
                    datapath: create_maps(pins, options)?,
                    adopted: false,
                    nat_max_entries: options.nat_max_entries,
                })
            }
            Plan::Adopt(adoption) => {
                if let Some(requested) = adoption.ignored_nat_max_entries {
                    tracing::warn!(
                        pinned = adoption.pinned.nat,
                        requested,
                        "keeping the pinned NAT table's capacity; resizing it needs `masq uninstall` (which drops live flows)"
                    );
                }
                Ok(Loaded {
                    datapath: adopt_maps(pins, &adoption, options)?,
                    adopted: true,
                    nat_max_entries: adoption.pinned.nat,
                })
            }
            Plan::Refuse { detail } => Err(LifecycleError::IncompatiblePins {
                pin_path: pins.root().to_path_buf(),
                detail,
                attached: !pins.links().is_empty(),
            }),
        }
    }
}

/// The datapath's load options for `options`, with a NAT table of `nat_max_entries`, taking
/// its maps from the pin directory `pin_dir` (or `staged` from the staging directory).
fn load_options(
    options: &LifecycleOptions,
    nat_max_entries: u32,
    pin_dir: PathBuf,
    staged: Option<StagedMaps>,
) -> LoadOptions {
    LoadOptions {
        nat_max_entries,
        nomasq_max_entries: options.nomasq_max_entries,
        staged,
        pin_dir: Some(pin_dir),
        debug_log: options.debug_log,
        ipv6: options.ipv6,
    }
}

/// A fresh map set: created and pinned in the staging directory, stamped with the layout
/// version, then published into the pin directory (the layout record last), so that a kill at
/// any instant leaves either leftovers the next start removes or a complete set it adopts.
fn create_maps(pins: &PinDir, options: &LifecycleOptions) -> Result<Datapath, DatapathError> {
    let staging = pins.create_staging()?;
    let nat_max_entries = options.nat_max_entries;
    let built = Datapath::load(&load_options(options, nat_max_entries, staging, None)).and_then(
        |mut datapath| {
            datapath.maps.set_meta(&MapMeta::current(nat_max_entries))?;
            pins.publish()?;
            Ok(datapath)
        },
    );
    built.inspect_err(|_| remove_staging_after_failure(pins))
}

/// Adopts the pinned maps as `adoption` says, replacing those whose capacity no longer fits
/// the options: a trie of another `--nomasq-max-entries` (rebuilt with the old one's entries),
/// and IPv6 maps an agent without `--enable-ipv6` created with room for nothing. The
/// replacements are built in the staging directory, then renamed over the old pins: the
/// programs still attached keep the old maps until the new programs take over, and a kill at
/// any instant leaves one complete map of each pinned. A trie too small for what the old one
/// holds is not built; the old capacity stays.
fn adopt_maps(
    pins: &PinDir,
    adoption: &Adoption,
    options: &LifecycleOptions,
) -> Result<Datapath, DatapathError> {
    let mut trie_entries = Vec::new();
    let mut trie_fits = true;
    if let Some(capacity) = adoption.trie_capacity {
        let old = DatapathMaps::from_pins(pins.root())?.nomasq_entries()?;
        trie_fits = old.len() <= capacity as usize;
        if trie_fits {
            trie_entries = old;
        } else {
            tracing::warn!(
                pinned = adoption.pinned.nomasq,
                requested = capacity,
                entries = old.len(),
                "the trie holds more entries than --nomasq-max-entries allows; keeping its capacity"
            );
        }
    }
    let replaced = adoption.replaced_maps(trie_fits);
    let nat_max_entries = adoption.pinned.nat;
    let load = |staged| {
        Datapath::load(&load_options(
            options,
            nat_max_entries,
            pins.root().to_path_buf(),
            staged,
        ))
    };
    if replaced.is_empty() {
        return load(None);
    }
    let staging = pins.create_staging()?;
    let built = load(Some(StagedMaps {
        dir: staging,
        names: replaced.clone(),
    }))
    .and_then(|mut datapath| {
        for (addr, prefix, kind) in &trie_entries {
            datapath
                .maps
                .nomasq_v4
                .insert(&Key::new(u32::from(*prefix), *addr), kind, 0)
                .map_err(DatapathError::map("inserting into", MAP_NOMASQ_V4))?;
        }
        pins.publish_staged(&replaced)?;
        Ok(datapath)
    })
    .inspect_err(|_| remove_staging_after_failure(pins))?;
    if replaced.contains(&MAP_NOMASQ_V4) {
        tracing::info!(
            from = adoption.pinned.nomasq,
            to = options.nomasq_max_entries,
            "resized the non-masquerade trie; the new programs use it from the swap on"
        );
    }
    if replaced.contains(&MAP_NAT_V6) || replaced.contains(&MAP_NOMASQ_V6) {
        tracing::info!(
            nat_max_entries,
            nomasq_max_entries = options.nomasq_max_entries,
            "sized the pinned IPv6 maps for translation (an agent without --enable-ipv6 created them empty)"
        );
    }
    Ok(built)
}

/// Removes what a failed build left in the staging directory, or leaves it to the next start.
fn remove_staging_after_failure(pins: &PinDir) {
    if let Err(cleanup) = pins.remove_staging() {
        tracing::warn!(%cleanup, "could not remove the staged maps; the next start will");
    }
}
