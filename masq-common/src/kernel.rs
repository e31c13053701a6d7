//! The oldest kernels the datapath runs on.
//!
//! These live next to the map layouts because they describe the eBPF object: which helpers, map
//! types and instructions it uses. `masq-testbed`'s `kernel_compat` test reads the built object
//! and fails if it uses anything newer than [`MIN_KERNEL_TC`], or anything its tables do not know.

use core::fmt;

/// A Linux release, `major.minor`. Stable point releases add no BPF features, so the patch level
/// is left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelVersion {
    /// First number of the release.
    pub major: u32,
    /// Second number of the release.
    pub minor: u32,
}

impl KernelVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Oldest kernel for legacy tc attachment (a clsact qdisc with direct-action cls_bpf filters,
/// set up over netlink). Two things set it, both 5.11:
///
/// * the programs stamp flows with `bpf_ktime_get_coarse_ns`, which 5.11 introduced;
/// * 5.11 charges BPF memory to the memory cgroup instead of `RLIMIT_MEMLOCK`, which the agent
///   does not raise: at its default size the NAT table alone takes about 20 MiB, far over the
///   usual 64 KiB or 8 MiB limit.
///
/// Everything else is older: the aya-log ring buffer and `CAP_BPF`/`CAP_PERFMON` (5.8), bounded
/// loops (5.3), global data (5.2).
pub const MIN_KERNEL_TC: KernelVersion = KernelVersion::new(5, 11);

/// Oldest kernel with tcx (`BPF_TCX_INGRESS`/`BPF_TCX_EGRESS` links), the attachment the agent
/// prefers: links can be pinned and their program swapped atomically.
pub const MIN_KERNEL_TCX: KernelVersion = KernelVersion::new(6, 6);

/// First kernel whose `bpf_l4_csum_replace` takes `BPF_F_IPV6`: without it, a pseudo-header
/// update of a `CHECKSUM_COMPLETE` skb also moves `skb->csum` as an IPv4 header checksum would
/// absorb the change, which is wrong for IPv6 (see `CSUM_L4_IPV6_GLOBAL`).
pub const MIN_KERNEL_L4_CSUM_IPV6: KernelVersion = KernelVersion::new(6, 16);

/// `BPF_F_IPV6` of `bpf_l4_csum_replace` (include/uapi/linux/bpf.h, Linux 6.16); older kernels
/// refuse the call with `-EINVAL`.
pub const BPF_F_IPV6: u64 = 1 << 7;

/// Name of the eBPF object's load-time constant that says whether the kernel takes
/// [`BPF_F_IPV6`] (1) or the programs must undo the helper's `skb->csum` change themselves (0).
/// The verifier sees the value and removes the branch not taken.
pub const CSUM_L4_IPV6_GLOBAL: &str = "MASQ_L4_CSUM_IPV6";
