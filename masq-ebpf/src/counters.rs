//! Counting outcomes into the per-CPU maps.

use masq_common::counters::{Counter, MAX_ALLOC_ATTEMPTS};

use crate::maps::{ALLOC_RETRIES, COUNTERS};

/// Adds one packet to `counter`.
#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU array slots are private to this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}

/// Records that a new flow found a port on attempt `attempt` (0-based), or none at all when
/// `attempt` is `MAX_ALLOC_ATTEMPTS`.
#[inline(always)]
pub(crate) fn record_allocation(attempt: u32) {
    let bucket = if attempt > MAX_ALLOC_ATTEMPTS {
        MAX_ALLOC_ATTEMPTS
    } else {
        attempt
    };
    if let Some(slot) = ALLOC_RETRIES.get_ptr_mut(bucket) {
        // SAFETY: per-CPU array slots are private to this CPU while the program runs.
        unsafe { *slot += 1 };
    }
}
