//! `masq uninstall`: undoing what an agent did to the node, each step reported as it is done.

use std::{
    fmt,
    path::{Path, PathBuf},
};

use masq_common::ports::PortRange;

use super::LifecycleError;
use crate::{
    causes::WithCauses,
    datapath::{
        attach::{AttachMode, detach_uplink},
        maps::DatapathMaps,
        pins::{PinDir, PinnedState},
    },
    node::reserved_ports,
};

/// One thing [`uninstall`] did or left alone, in words for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UninstallStep {
    /// An interrupted install's staging directory was removed.
    RemovedStagedMaps,
    /// Nothing was pinned, so nothing was changed (beyond an empty pin directory).
    NothingPinned(PathBuf),
    /// The programs were detached from an uplink.
    Detached {
        /// The interface.
        interface: String,
        /// How they were attached (`tcx`, `tc`), if known.
        mode: Option<AttachMode>,
    },
    /// These ports were taken out of `net.ipv4.ip_local_reserved_ports` again.
    ReleasedPorts(Vec<PortRange>),
    /// The record of what was reserved could not be read, so the reservation stays.
    ReservedPortsUnknown(String),
    /// An interrupted install left maps (and had not reserved ports yet).
    RemovingLeftovers,
    /// The pins come from another masq version, whose record of reserved ports is not read.
    ReservedPortsOfAnotherVersion,
    /// A pin or directory was removed.
    Removed(PathBuf),
    /// Everything is gone.
    Done,
}

impl fmt::Display for UninstallStep {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KEEPING_PORTS: &str = "leaving net.ipv4.ip_local_reserved_ports as it is";
        match self {
            Self::RemovedStagedMaps => {
                formatter.write_str("removed the staged maps of an interrupted install")
            }
            Self::NothingPinned(root) => write!(
                formatter,
                "nothing pinned under {}; nothing to uninstall",
                root.display()
            ),
            Self::Detached { interface, mode } => write!(
                formatter,
                "detached from {interface} ({})",
                mode.map_or("unknown mode", AttachMode::name)
            ),
            Self::ReleasedPorts(ranges) => write!(
                formatter,
                "released reserved ports {}",
                reserved_ports::format_port_list(ranges)
            ),
            Self::ReservedPortsUnknown(error) => write!(
                formatter,
                "could not read which ports masq reserved ({error}); {KEEPING_PORTS}"
            ),
            Self::RemovingLeftovers => formatter.write_str(
                "an interrupted install left maps behind (it never reserved ports); removing them",
            ),
            Self::ReservedPortsOfAnotherVersion => write!(
                formatter,
                "pinned maps are from another masq version; {KEEPING_PORTS}"
            ),
            Self::Removed(path) => write!(formatter, "removed {}", path.display()),
            Self::Done => formatter
                .write_str("masq is uninstalled from this node (programs detached, maps released)"),
        }
    }
}

/// Undoes what an agent did to the node: detaches the programs from every uplink (tc filters
/// live on the interfaces, not under the pin path: masq removes its own, and a clsact qdisc
/// only where it created it), releases exactly the ports it reserved, and removes its pins.
/// Each step is reported as it is done, so an error leaves a record of how far it got.
pub fn uninstall(
    pin_path: &Path,
    sysctl_dir: &Path,
    mut report: impl FnMut(UninstallStep),
) -> Result<(), LifecycleError> {
    let pins = PinDir::new(pin_path);
    if pins.remove_staging()? {
        report(UninstallStep::RemovedStagedMaps);
    }
    match pins.inspect()? {
        PinnedState::Empty if pins.links().is_empty() => {
            report(UninstallStep::NothingPinned(pins.root().to_path_buf()));
            if pins.root().exists() {
                pins.remove_all()?;
            }
            return Ok(());
        }
        PinnedState::Compatible(_) => {
            let maps = DatapathMaps::from_pins(pins.root())?;
            for (ifindex, uplink) in maps.uplinks()? {
                detach_uplink(&pins, ifindex, &uplink)?;
                report(UninstallStep::Detached {
                    interface: uplink.name().to_owned(),
                    mode: AttachMode::of(&uplink),
                });
            }
            match maps.meta() {
                Ok(meta) => {
                    reserved_ports::release(sysctl_dir, meta.reserved())?;
                    if !meta.reserved().is_empty() {
                        report(UninstallStep::ReleasedPorts(meta.reserved().to_vec()));
                    }
                }
                Err(error) => report(UninstallStep::ReservedPortsUnknown(
                    WithCauses(&error).to_string(),
                )),
            }
        }
        PinnedState::Leftovers(_) => report(UninstallStep::RemovingLeftovers),
        PinnedState::Empty | PinnedState::Incompatible(_) => {
            report(UninstallStep::ReservedPortsOfAnotherVersion);
        }
    }
    for path in pins.remove_all()? {
        report(UninstallStep::Removed(path));
    }
    report(UninstallStep::Done);
    Ok(())
}
