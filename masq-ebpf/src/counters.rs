//! Counting outcomes into per-CPU maps: each CPU adds to its own copy with a plain add, no two
//! CPUs write the same cache line, and the agent sums the copies when it reads them.

use aya_ebpf::btf_maps::PerCpuArray;
use masq_common::{
    counters::{ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, COUNTER_COUNT, Counter, alloc_bucket},
    flow::{EVICTION_SLOTS, EvictionCause, FlowClass, eviction_slot},
};

use crate::{
    family::V6,
    maps::{ALLOC_RETRIES, COUNTERS, COUNTERS_V6, EVICTIONS, EVICTIONS_V6},
};

/// A family's packet counters, one slot per `Counter`.
pub(crate) type PacketCounters = PerCpuArray<u64, { COUNTER_COUNT as usize }>;
/// A family's eviction counters, one slot per cause and class.
pub(crate) type EvictionCounters = PerCpuArray<u64, { EVICTION_SLOTS as usize }>;

/// An address family whose packets are counted apart from the other's.
pub(crate) trait Counted {
    /// The family's packet counters.
    fn counters() -> &'static PacketCounters;
    /// The family's eviction counters.
    fn evictions() -> &'static EvictionCounters;
}

impl Counted for [u8; 4] {
    #[inline(always)]
    fn counters() -> &'static PacketCounters {
        &COUNTERS
    }

    #[inline(always)]
    fn evictions() -> &'static EvictionCounters {
        &EVICTIONS
    }
}

impl Counted for V6 {
    #[inline(always)]
    fn counters() -> &'static PacketCounters {
        &COUNTERS_V6
    }

    #[inline(always)]
    fn evictions() -> &'static EvictionCounters {
        &EVICTIONS_V6
    }
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

/// Counts one flow of `class` evicted for `cause` in family `A`.
#[inline(always)]
pub(crate) fn count_eviction<A: Counted>(cause: EvictionCause, class: FlowClass) {
    add(A::evictions(), eviction_slot(cause, class), 1);
}

/// Records that a new flow found a port after `attempts` tries, or none at all (`None`).
#[inline(always)]
pub(crate) fn record_allocation(attempts: Option<u32>) {
    let bump = |slot: u32, amount: u64| add(&ALLOC_RETRIES, slot, amount);
    match attempts {
        Some(attempts) => {
            bump(alloc_bucket(attempts), 1);
            bump(ALLOC_SUM_SLOT, u64::from(attempts));
        }
        None => bump(ALLOC_FAILED_SLOT, 1),
    }
}

#[inline(always)]
fn add<const N: usize>(counters: &PerCpuArray<u64, N>, index: u32, amount: u64) {
    if let Some(slot) = counters.get_ptr_mut(index) {
        // SAFETY: per-CPU array slots are private to this CPU while the program runs.
        unsafe { *slot += amount };
    }
}
