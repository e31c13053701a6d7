//! Counting outcomes: into per-CPU maps, or (the shared-counters benchmark variant) into
//! arrays all CPUs add to atomically.

use masq_common::counters::{ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter, alloc_bucket};
#[cfg(not(feature = "variant-shared-counters"))]
use per_cpu::{PacketCounters, add, allocation_histogram};
#[cfg(feature = "variant-shared-counters")]
use shared::{PacketCounters, add, allocation_histogram};

/// An address family whose packets are counted apart from the other's.
pub(crate) trait Counted {
    /// The family's packet counters, one slot per `Counter`.
    fn counters() -> &'static PacketCounters;
}

/// Adds one packet to `counter` of IPv4 (and of frames of neither family).
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    count_in::<[u8; 4]>(counter);
}

/// Adds one packet to `counter` of family `A`.
#[inline(always)]
pub(crate) fn count_in<A: Counted>(counter: Counter) {
    add(A::counters(), counter as u32, 1);
}

/// Records that a new flow found a port after `attempts` tries, or none at all (`None`).
#[inline(always)]
pub(crate) fn record_allocation(attempts: Option<u32>) {
    let bump = |slot: u32, amount: u64| add(allocation_histogram(), slot, amount);
    match attempts {
        Some(attempts) => {
            bump(alloc_bucket(attempts), 1);
            bump(ALLOC_SUM_SLOT, u64::from(attempts));
        }
        None => bump(ALLOC_FAILED_SLOT, 1),
    }
}

/// Counts go to per-CPU arrays: each CPU adds to its own copy with a plain add, and no two CPUs
/// write the same cache line; the agent sums the copies when it reads them.
#[cfg(not(feature = "variant-shared-counters"))]
mod per_cpu {
    use aya_ebpf::btf_maps::PerCpuArray;
    use masq_common::counters::{ALLOC_HISTOGRAM_BUCKETS, COUNTER_COUNT};

    use super::Counted;
    use crate::{
        family::V6,
        maps::{ALLOC_RETRIES, COUNTERS, COUNTERS_V6},
    };

    pub(super) type PacketCounters = PerCpuArray<u64, { COUNTER_COUNT as usize }>;

    impl Counted for [u8; 4] {
        #[inline(always)]
        fn counters() -> &'static PacketCounters {
            &COUNTERS
        }
    }

    impl Counted for V6 {
        #[inline(always)]
        fn counters() -> &'static PacketCounters {
            &COUNTERS_V6
        }
    }

    #[inline(always)]
    pub(super) fn allocation_histogram()
    -> &'static PerCpuArray<u64, { ALLOC_HISTOGRAM_BUCKETS as usize }> {
        &ALLOC_RETRIES
    }

    #[inline(always)]
    pub(super) fn add<const N: usize>(counters: &PerCpuArray<u64, N>, index: u32, amount: u64) {
        if let Some(slot) = counters.get_ptr_mut(index) {
            // SAFETY: per-CPU array slots are private to this CPU while the program runs.
            unsafe { *slot += amount };
        }
    }
}

/// The shared-counters benchmark variant: counts go to one copy for all CPUs, added to
/// atomically, as a datapath without per-CPU maps would count. The per-CPU maps stay declared
/// (the agent opens them) but read zero.
#[cfg(feature = "variant-shared-counters")]
mod shared {
    use aya_ebpf::btf_maps::Array;
    use masq_common::counters::{ALLOC_HISTOGRAM_BUCKETS, COUNTER_COUNT};

    use super::Counted;
    use crate::{
        family::V6,
        maps::{SHARED_COUNTERS, SHARED_COUNTERS_V6, SHARED_RETRIES},
    };

    pub(super) type PacketCounters = Array<u64, { COUNTER_COUNT as usize }>;

    impl Counted for [u8; 4] {
        #[inline(always)]
        fn counters() -> &'static PacketCounters {
            &SHARED_COUNTERS
        }
    }

    impl Counted for V6 {
        #[inline(always)]
        fn counters() -> &'static PacketCounters {
            &SHARED_COUNTERS_V6
        }
    }

    #[inline(always)]
    pub(super) fn allocation_histogram() -> &'static Array<u64, { ALLOC_HISTOGRAM_BUCKETS as usize }>
    {
        &SHARED_RETRIES
    }

    #[inline(always)]
    pub(super) fn add<const N: usize>(counters: &Array<u64, N>, index: u32, amount: u64) {
        if let Some(slot) = counters.get_ptr_mut(index) {
            // SAFETY: the slot is an aligned `u64` of the map, valid while the program runs.
            unsafe { atomic_add(slot, amount) };
        }
    }

    /// Adds `amount` to `*slot` with one atomic instruction (`BPF_ATOMIC | BPF_ADD`). The bpf
    /// target has no compare-and-swap, so `core` offers it no atomic read-modify-write at all,
    /// though the instruction set has this add.
    ///
    /// # Safety
    ///
    /// `slot` must point at a valid, aligned `u64` of a map value.
    #[cfg(target_arch = "bpf")]
    #[inline(always)]
    unsafe fn atomic_add(slot: *mut u64, amount: u64) {
        // SAFETY: the caller passes a map value the verifier lets the program write.
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({slot} + 0) += {amount}",
                slot = in(reg) slot,
                amount = in(reg) amount,
                options(nostack),
            );
        }
    }

    /// Host builds only type-check the programs.
    ///
    /// # Safety
    ///
    /// As for the bpf target's.
    #[cfg(not(target_arch = "bpf"))]
    #[inline(always)]
    unsafe fn atomic_add(slot: *mut u64, amount: u64) {
        use core::sync::atomic::{AtomicU64, Ordering};
        // SAFETY: as the caller guarantees.
        unsafe { AtomicU64::from_ptr(slot) }.fetch_add(amount, Ordering::Relaxed);
    }
}
