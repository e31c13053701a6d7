//! The SNAT ports reserved from the node's own ephemeral allocation (with `--to-ports`), and
//! their record in the pinned metadata: `masq uninstall` releases exactly what masq added,
//! however many agents came and went in between.

use std::path::Path;

use masq_common::{layout::MAX_RESERVED_RANGES, ports::PortRange};

use super::LifecycleError;
use crate::{datapath::maps::DatapathMaps, node::reserved_ports, ports::SnatPorts};

/// Reserves the SNAT ports from the node's ephemeral allocation and records what was added;
/// with ports shared with the node, gives back what an earlier start reserved instead.
pub fn reserve(
    maps: &mut DatapathMaps,
    sysctl_dir: &Path,
    ports: &SnatPorts,
) -> Result<(), LifecycleError> {
    if ports.shared {
        return release_recorded(maps, sysctl_dir);
    }
    let ephemeral = reserved_ports::ephemeral_range(sysctl_dir)?;
    if ports.ranges.iter().any(|range| range.overlaps(&ephemeral)) {
        tracing::info!(
            %ephemeral,
            "the SNAT range overlaps the node's ephemeral ports; the reservation keeps node sockets out of it"
        );
    }
    let added = reserved_ports::reserve(sysctl_dir, &ports.ranges)?;
    let mut meta = maps.meta()?;
    let mut recorded: Vec<PortRange> = meta.reserved().to_vec();
    recorded.extend_from_slice(&added);
    let recorded = reserved_ports::normalize(recorded);
    if recorded.len() > MAX_RESERVED_RANGES {
        tracing::warn!(
            ranges = recorded.len(),
            "too many reserved ranges to record; `masq uninstall` will leave some in place"
        );
    }
    for (slot, range) in meta
        .reserved
        .iter_mut()
        .zip(recorded.iter().chain(std::iter::repeat(&PortRange::EMPTY)))
    {
        *slot = *range;
    }
    meta.reserved_count = u32::try_from(recorded.len().min(MAX_RESERVED_RANGES)).unwrap_or(0);
    maps.set_meta(&meta)?;
    if !added.is_empty() {
        tracing::info!(ports = %reserved_ports::format_port_list(&added), "reserved the SNAT ports from the node's ephemeral allocation");
    }
    Ok(())
}

/// Takes the ports an earlier start reserved (with `--to-ports`) out of the node's reserved
/// ports again, and forgets the record: the ports are shared with the node now.
fn release_recorded(maps: &mut DatapathMaps, sysctl_dir: &Path) -> Result<(), LifecycleError> {
    let mut meta = maps.meta()?;
    if meta.reserved().is_empty() {
        return Ok(());
    }
    reserved_ports::release(sysctl_dir, meta.reserved())?;
    tracing::info!(ports = %reserved_ports::format_port_list(meta.reserved()), "released the ports an earlier --to-ports reserved: the ports are shared with the node now");
    meta.reserved = [PortRange::EMPTY; MAX_RESERVED_RANGES];
    meta.reserved_count = 0;
    maps.set_meta(&meta)?;
    Ok(())
}
