//! Counting outcomes into per-CPU maps (each family's its own, see `Family::counters`): each
//! CPU adds to its own copy with a plain add, no two CPUs write the same cache line, and the
//! agent sums the copies when it reads them.

use aya_ebpf::btf_maps::PerCpuArray;
use masq_common::{
    counters::{ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter, alloc_bucket},
    flow::{EvictionCause, FlowClass, eviction_slot},
};

use crate::{family::Family, maps::ALLOC_RETRIES};

/// Adds one packet to `counter` of IPv4 (and of frames of neither family).
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    count_in::<[u8; 4]>(counter);
}

/// Adds one packet to `counter` of family `A`.
#[inline(always)]
pub(crate) fn count_in<A: Family>(counter: Counter) {
    add(A::counters(), counter as u32, 1);
}

/// Counts one flow of `class` evicted for `cause` in family `A`.
#[inline(always)]
pub(crate) fn count_eviction<A: Family>(cause: EvictionCause, class: FlowClass) {
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
