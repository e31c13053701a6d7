//! Counting outcomes into the per-CPU maps.

use masq_common::counters::{ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter, alloc_bucket};

use crate::{
    family::Family,
    maps::{ALLOC_RETRIES, COUNTERS},
};

/// Adds one packet to `counter` of IPv4 (and of frames of neither family).
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU array slots are private to this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

/// Adds one packet to `counter` of family `A`.
#[inline(always)]
pub(crate) fn count_in<A: Family>(counter: Counter) {
    if let Some(slot) = A::counters().get_ptr_mut(counter as u32) {
        // SAFETY: as in `count`.
        unsafe { *slot += 1 };
    }
}

/// Records that a new flow found a port after `attempts` tries, or none at all (`None`).
#[inline(always)]
pub(crate) fn record_allocation(attempts: Option<u32>) {
    let bump = |slot: u32, amount: u64| {
        if let Some(slot) = ALLOC_RETRIES.get_ptr_mut(slot) {
            // SAFETY: per-CPU array slots are private to this CPU while the program runs.
            unsafe { *slot += amount };
        }
    };
    match attempts {
        Some(attempts) => {
            bump(alloc_bucket(attempts), 1);
            bump(ALLOC_SUM_SLOT, u64::from(attempts));
        }
        None => bump(ALLOC_FAILED_SLOT, 1),
    }
}
