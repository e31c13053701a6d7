//! Bringing the datapath maps in line with the policy and the agent's settings.

use std::{collections::BTreeMap, net::Ipv4Addr};

use aya::maps::lpm_trie::Key;
use masq_common::{
    layout::MAP_NOMASQ_V4,
    ports::PortRange,
    settings::{MAX_PORT_RANGES, SETTING_ENABLED, SETTING_RANDOM_FULLY, Settings},
};

use super::{error::DatapathError, maps::DatapathMaps};

/// What a trie sync changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrieSync {
    /// Entries inserted or relabelled.
    pub added: usize,
    /// Entries deleted.
    pub removed: usize,
    /// Entries already right.
    pub unchanged: usize,
}

/// Makes the non-masquerade trie hold exactly `desired`.
///
/// New and changed entries are written before stale ones are deleted, so a destination that is
/// exempt under both the old and the new config is exempt at every instant of the change: no
/// packet is masqueraded by mistake while the trie is in flux.
pub fn sync_nomasq(
    maps: &mut DatapathMaps,
    desired: &BTreeMap<(Ipv4Addr, u8), u32>,
) -> Result<TrieSync, DatapathError> {
    let current: BTreeMap<(Ipv4Addr, u8), u32> = maps
        .nomasq_entries()?
        .into_iter()
        .map(|(addr, prefix, kind)| ((Ipv4Addr::from(addr), prefix), kind))
        .collect();
    let mut report = TrieSync::default();
    for (&(addr, prefix), &kind) in desired {
        if current.get(&(addr, prefix)) == Some(&kind) {
            report.unchanged += 1;
            continue;
        }
        maps.nomasq_v4
            .insert(&Key::new(u32::from(prefix), addr.octets()), kind, 0)
            .map_err(DatapathError::map("inserting into", MAP_NOMASQ_V4))?;
        report.added += 1;
    }
    for &(addr, prefix) in current.keys() {
        if desired.contains_key(&(addr, prefix)) {
            continue;
        }
        maps.nomasq_v4
            .remove(&Key::new(u32::from(prefix), addr.octets()))
            .map_err(DatapathError::map("removing from", MAP_NOMASQ_V4))?;
        report.removed += 1;
    }
    Ok(report)
}

/// The settings value for the datapath.
pub fn settings(ranges: &[PortRange], random_fully: bool) -> Settings {
    let mut settings = Settings::DISABLED;
    settings.flags = SETTING_ENABLED
        | if random_fully {
            SETTING_RANDOM_FULLY
        } else {
            0
        };
    let ranges = &ranges[..ranges.len().min(MAX_PORT_RANGES)];
    for (slot, range) in settings.port_ranges.iter_mut().zip(ranges) {
        *slot = *range;
    }
    settings.port_range_count = u32::try_from(ranges.len()).unwrap_or(0);
    settings.total_ports = ranges.iter().map(PortRange::size).sum();
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_carry_ranges_and_flags() {
        let value = settings(
            &[PortRange::new(1024, 2047), PortRange::new(4000, 4000)],
            true,
        );
        assert!(value.enabled() && value.random_fully());
        assert_eq!(value.total_ports, 1025);
        assert_eq!(
            value.ranges(),
            [PortRange::new(1024, 2047), PortRange::new(4000, 4000)]
        );
    }
}
