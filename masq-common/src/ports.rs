//! Port ranges that translated flows may use.

/// An inclusive interval of ports, in host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// First port of the interval.
    pub first: u16,
    /// Last port of the interval (inclusive).
    pub last: u16,
}

impl PortRange {
    /// A range that contains nothing; used for unused slots.
    pub const EMPTY: Self = Self { first: 1, last: 0 };

    /// The interval `first..=last`.
    pub const fn new(first: u16, last: u16) -> Self {
        Self { first, last }
    }

    /// Number of ports in the interval.
    #[inline(always)]
    pub const fn size(&self) -> u32 {
        if self.last < self.first {
            0
        } else {
            (self.last - self.first) as u32 + 1
        }
    }

    /// Whether `port` lies in the interval.
    #[inline(always)]
    pub const fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }

    /// Whether the two intervals share at least one port.
    pub const fn overlaps(&self, other: &Self) -> bool {
        self.size() != 0
            && other.size() != 0
            && self.first <= other.last
            && other.first <= self.last
    }
}

impl core::fmt::Display for PortRange {
    /// `first-last`, the form `--service-node-port-range` and `masq status` use.
    fn fmt(&self, formatter: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(formatter, "{}-{}", self.first, self.last)
    }
}

/// The range SNAT ports come from when `--to-ports` is not given: it stays clear of the
/// NodePort range (30000-32767) and of Linux's default ephemeral range (32768-60999) that the
/// node's own sockets use, and the agent additionally reserves it from host allocation.
pub const DEFAULT_SNAT_RANGE: PortRange = PortRange::new(1024, 29_999);

/// Kubernetes' default NodePort range; SNAT ports must never land in it.
pub const DEFAULT_NODEPORT_RANGE: PortRange = PortRange::new(30_000, 32_767);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_membership() {
        assert_eq!(PortRange::new(10, 10).size(), 1);
        assert_eq!(PortRange::new(0, 65_535).size(), 65_536);
        assert_eq!(PortRange::EMPTY.size(), 0);
        assert!(!PortRange::EMPTY.contains(0));
        assert!(!PortRange::EMPTY.contains(1));
    }

    #[test]
    fn default_range_avoids_nodeports_and_ephemeral_ports() {
        assert!(!DEFAULT_SNAT_RANGE.overlaps(&DEFAULT_NODEPORT_RANGE));
        assert!(!DEFAULT_SNAT_RANGE.overlaps(&PortRange::new(32_768, 60_999)));
    }

    #[test]
    fn overlap_is_symmetric_and_inclusive() {
        let a = PortRange::new(100, 200);
        let b = PortRange::new(200, 300);
        assert!(a.overlaps(&b) && b.overlaps(&a));
        assert!(!a.overlaps(&PortRange::new(201, 300)));
        assert!(!a.overlaps(&PortRange::EMPTY));
    }
}
