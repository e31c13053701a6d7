//! Sizing the NAT table from the node's memory, the way the kernel sizes conntrack's.

/// Bytes of memory the node has, as the kernel reports it.
pub use crate::sys::memory::total_memory;

/// The NAT table capacity (entries, two per flow) that holds as many flows as the kernel's
/// default `nf_conntrack_max` on a node with `memory` bytes: 262,144 flows above 4 GiB, 65,536
/// above 1 GiB, and 1/16384 of memory in 8-byte buckets (at least 1,024) below that. masq
/// then tracks as many flows as iptables MASQUERADE would before refusing new ones; at about
/// 100 bytes per entry the largest default takes about 50 MiB.
pub const fn nat_entries_for(memory: u64) -> u32 {
    const GIB: u64 = 1 << 30;
    let flows = if memory > 4 * GIB {
        262_144
    } else if memory > GIB {
        65_536
    } else {
        let buckets = memory / 16_384 / 8;
        if buckets < 1_024 {
            1_024
        } else {
            buckets as u32
        }
    };
    flows * 2
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn follows_the_kernels_conntrack_defaults() {
        assert_eq!(nat_entries_for(24 * GIB), 524_288);
        assert_eq!(nat_entries_for(4 * GIB + 1), 524_288);
        assert_eq!(nat_entries_for(4 * GIB), 131_072);
        assert_eq!(nat_entries_for(2 * GIB), 131_072);
        assert_eq!(nat_entries_for(GIB), 16_384);
        assert_eq!(nat_entries_for(256 << 20), 4_096);
        assert_eq!(nat_entries_for(0), 2_048);
    }
}
