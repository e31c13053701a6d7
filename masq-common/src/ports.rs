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

/// The ports MASQUERADE gives a flow from a port of 1024 or above when no `--to-ports` is
/// given: shared with the node's own sockets, as conntrack shares them (see
/// [`shared_snat_ranges`]).
pub const SHARED_PORTS: PortRange = PortRange::new(1024, 65_535);

/// The ranges SNAT ports come from when `--to-ports` is not given: [`SHARED_PORTS`] but the
/// NodePort range `nodeports`, which stays the Services'. The node's own sockets use the same
/// ports; a pod's flow never takes a tuple a node socket holds, and a node flow whose tuple a
/// pod's flow holds gets another port (conntrack's null binding). Returns the ranges and how
/// many of the two are not empty.
pub const fn shared_snat_ranges(nodeports: PortRange) -> ([PortRange; 2], usize) {
    if nodeports.size() == 0 || !nodeports.overlaps(&SHARED_PORTS) {
        return ([SHARED_PORTS, PortRange::EMPTY], 1);
    }
    let below = if nodeports.first > SHARED_PORTS.first {
        PortRange::new(SHARED_PORTS.first, nodeports.first - 1)
    } else {
        PortRange::EMPTY
    };
    let above = if nodeports.last < SHARED_PORTS.last {
        PortRange::new(nodeports.last + 1, SHARED_PORTS.last)
    } else {
        PortRange::EMPTY
    };
    match (below.size() != 0, above.size() != 0) {
        (true, true) => ([below, above], 2),
        (true, false) => ([below, PortRange::EMPTY], 1),
        (false, true) => ([above, PortRange::EMPTY], 1),
        (false, false) => ([PortRange::EMPTY, PortRange::EMPTY], 0),
    }
}

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
    fn shared_ranges_are_the_kernels_but_the_nodeports() {
        let (ranges, count) = shared_snat_ranges(DEFAULT_NODEPORT_RANGE);
        assert_eq!(count, 2);
        assert_eq!(
            ranges,
            [PortRange::new(1024, 29_999), PortRange::new(32_768, 65_535)]
        );
        assert_eq!(ranges[0].size() + ranges[1].size(), 61_744);
        assert!(
            ranges
                .iter()
                .all(|range| !range.overlaps(&DEFAULT_NODEPORT_RANGE))
        );
        assert_eq!(
            shared_snat_ranges(PortRange::new(1024, 2047)),
            ([PortRange::new(2048, 65_535), PortRange::EMPTY], 1)
        );
        assert_eq!(
            shared_snat_ranges(PortRange::new(60_000, 65_535)),
            ([PortRange::new(1024, 59_999), PortRange::EMPTY], 1)
        );
        assert_eq!(
            shared_snat_ranges(PortRange::EMPTY),
            ([SHARED_PORTS, PortRange::EMPTY], 1)
        );
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
