//! Runtime settings of the datapath, written by the agent into a one-entry array map.
//!
//! They live in a map rather than in load-time constants so that the agent can change the node
//! address or the port range of running programs, and so that a restarted agent can read back
//! what the datapath is doing.

use crate::ports::PortRange;

/// Most port intervals a `--to-ports` specification may list.
pub const MAX_PORT_RANGES: usize = 8;

/// The datapath translates nothing until the agent has written settings with this bit.
pub const SETTING_ENABLED: u32 = 1 << 0;
/// Pick every port at random (iptables `--random-fully`); without it the original source port is
/// tried first and kept when free.
pub const SETTING_RANDOM_FULLY: u32 = 1 << 1;
/// The source tries (`layout::MAP_NOMASQ_SRC_V4`, `layout::MAP_NOMASQ_SRC_V6`) hold entries.
/// Set by the agent once it has filled them, cleared when a config empties them; the egress
/// program looks a pod's source up only while it is set, so a config without
/// `nonMasqueradeSrcCIDRs` costs no lookup per packet.
pub const SETTING_SOURCE_EXEMPTIONS: u32 = 1 << 2;
/// The ports are shared with the node's own sockets (no `--to-ports`): the node's flows are
/// left alone, in the ranges too, unless a pod's mapping holds the tuple one would be answered
/// on (then it gets another port, as conntrack's null binding gives one). Without it the
/// ranges are masq's alone (reserved from the node's ephemeral ports) and a node flow inside
/// them is tracked, keeping its port, so no pod flow takes it.
pub const SETTING_SHARED_PORTS: u32 = 1 << 3;

/// Value of the settings map (key 0): what holds for every uplink. The address each uplink
/// masquerades to lives in the uplinks map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `SETTING_*` bits.
    pub flags: u32,
    /// Number of valid entries in `port_ranges`.
    pub port_range_count: u32,
    /// Sum of the sizes of the valid port ranges.
    pub total_ports: u32,
    /// Port intervals translated flows may use, in the order given by the operator.
    pub port_ranges: [PortRange; MAX_PORT_RANGES],
    /// By family ([`FAMILY_IPV4`], [`FAMILY_IPV6`]): the most unassured flows one holder (a
    /// pod, the node) may have in the family's table, its share; zero for no limit.
    pub holder_share: [u32; 2],
    /// By family: the slots of the family's flow index (`layout::MAP_FLOW_INDEX_V4`), which
    /// eviction samples at random.
    pub flow_slots: [u32; 2],
}

/// Index of the IPv4 values of [`Settings::holder_share`] and [`Settings::flow_slots`].
pub const FAMILY_IPV4: usize = 0;
/// Index of the IPv6 values of [`Settings::holder_share`] and [`Settings::flow_slots`].
pub const FAMILY_IPV6: usize = 1;

impl Settings {
    /// Settings that translate nothing: what the datapath sees before the agent configured it.
    pub const DISABLED: Self = Self {
        flags: 0,
        port_range_count: 0,
        total_ports: 0,
        port_ranges: [PortRange::EMPTY; MAX_PORT_RANGES],
        holder_share: [0; 2],
        flow_slots: [0; 2],
    };

    /// Whether the datapath should translate at all.
    #[inline(always)]
    pub const fn enabled(&self) -> bool {
        self.flags & SETTING_ENABLED != 0 && self.total_ports != 0
    }

    /// Whether every port is chosen at random.
    #[inline(always)]
    pub const fn random_fully(&self) -> bool {
        self.flags & SETTING_RANDOM_FULLY != 0
    }

    /// Whether some pod sources are never masqueraded (the source tries hold entries).
    #[inline(always)]
    pub const fn source_exemptions(&self) -> bool {
        self.flags & SETTING_SOURCE_EXEMPTIONS != 0
    }

    /// Whether the ports are shared with the node's own sockets (see [`SETTING_SHARED_PORTS`]).
    #[inline(always)]
    pub const fn ports_shared(&self) -> bool {
        self.flags & SETTING_SHARED_PORTS != 0
    }

    /// The configured port ranges.
    pub fn ranges(&self) -> &[PortRange] {
        let count = (self.port_range_count as usize).min(MAX_PORT_RANGES);
        self.port_ranges.get(..count).unwrap_or(&[])
    }

    /// Whether `port` lies inside one of the configured ranges.
    #[inline(always)]
    pub fn port_in_range(&self, port: u16) -> bool {
        let mut index = 0;
        while index < MAX_PORT_RANGES {
            if index as u32 >= self.port_range_count {
                return false;
            }
            if let Some(range) = self.port_ranges.get(index)
                && range.contains(port)
            {
                return true;
            }
            index += 1;
        }
        false
    }

    /// The range holding position `offset` when all ranges are laid end to end, as (its first
    /// port, its size, `offset`'s position within it), or `None` when `offset` is past the last.
    #[inline(always)]
    pub fn range_at(&self, offset: u32) -> Option<(u16, u32, u32)> {
        let mut remaining = offset;
        let mut index = 0;
        while index < MAX_PORT_RANGES {
            if index as u32 >= self.port_range_count {
                return None;
            }
            let range = self.port_ranges.get(index)?;
            let size = range.size();
            if remaining < size {
                return Some((range.first, size, remaining));
            }
            remaining -= size;
            index += 1;
        }
        None
    }

    /// The port at position `offset` when all ranges are laid end to end, or `None` when
    /// `offset` is past the last one.
    #[inline(always)]
    pub fn port_at(&self, offset: u32) -> Option<u16> {
        self.range_at(offset)
            .map(|(first, _, within)| first.wrapping_add(within as u16))
    }
}

crate::impl_pod!(Settings);

#[cfg(test)]
mod tests {
    use super::*;

    fn settings_with(ranges: &[PortRange]) -> Settings {
        let mut settings = Settings::DISABLED;
        for (slot, range) in settings.port_ranges.iter_mut().zip(ranges) {
            *slot = *range;
        }
        settings.port_range_count = ranges.len() as u32;
        settings.total_ports = ranges.iter().map(PortRange::size).sum();
        settings.flags = SETTING_ENABLED;
        settings
    }

    #[test]
    fn port_at_walks_ranges_in_order() {
        let settings = settings_with(&[PortRange::new(100, 101), PortRange::new(200, 202)]);
        let ports: [Option<u16>; 6] =
            core::array::from_fn(|offset| settings.port_at(offset as u32));
        assert_eq!(
            ports,
            [Some(100), Some(101), Some(200), Some(201), Some(202), None]
        );
    }

    #[test]
    fn range_at_finds_the_range_and_the_position_in_it() {
        let settings = settings_with(&[PortRange::new(100, 101), PortRange::new(200, 202)]);
        assert_eq!(settings.range_at(0), Some((100, 2, 0)));
        assert_eq!(settings.range_at(3), Some((200, 3, 1)));
        assert_eq!(settings.range_at(5), None);
    }

    #[test]
    fn port_in_range_only_counts_configured_ranges() {
        let settings = settings_with(&[PortRange::new(1024, 2047)]);
        assert!(settings.port_in_range(1024));
        assert!(settings.port_in_range(2047));
        assert!(!settings.port_in_range(2048));
        assert!(
            !settings.port_in_range(0),
            "unused slots must not match port 0"
        );
    }

    #[test]
    fn disabled_until_flagged_and_given_ports() {
        assert!(!Settings::DISABLED.enabled());
        let mut settings = settings_with(&[PortRange::new(1, 1)]);
        assert!(settings.enabled());
        settings.total_ports = 0;
        assert!(!settings.enabled());
    }
}
