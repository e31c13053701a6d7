//! How many unassured flows each local address holds (`masq_common::nat::Holder`), so that no
//! pod can take more than its share of a full table in flows that were never answered.
//!
//! A flow counts against its holder from its creation until it is assured or removed: the
//! programs add and subtract atomically as they create, assure and evict flows; the agent's
//! garbage collector corrects the count from the table on every pass, for the flows it removes
//! itself and for whatever two CPUs raced over.

use masq_common::nat::Holder;

use crate::{atomic, family::Family};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// Unassured flows `holder` has now.
#[inline(always)]
pub(crate) fn unassured<A: Family>(holder: A) -> u64 {
    A::holders().get_ptr(holder).map_or(0, |count| {
        // SAFETY: the pointer comes from a successful lookup and is read at once.
        unsafe { core::ptr::read_volatile(count) }.flows()
    })
}

/// One more unassured flow for `holder`.
#[inline(always)]
pub(crate) fn add_one<A: Family>(holder: A) {
    let count = match A::holders().get_ptr_mut(holder) {
        Some(count) => count,
        None => {
            // The first flow of this holder: whoever inserts first, every CPU adds to the
            // same record after.
            let _ = A::holders().insert(holder, Holder::default(), NOEXIST);
            match A::holders().get_ptr_mut(holder) {
                Some(count) => count,
                None => return,
            }
        }
    };
    // SAFETY: a valid map value; the field is a `u64` at its start, aligned.
    unsafe { atomic::add(&raw mut (*count).unassured, 1) };
}

/// One unassured flow fewer for `holder` (its flow was assured, or removed before).
#[inline(always)]
pub(crate) fn remove_one<A: Family>(holder: A) {
    if let Some(count) = A::holders().get_ptr_mut(holder) {
        // SAFETY: as in `add_one`.
        unsafe { atomic::add(&raw mut (*count).unassured, 0_u64.wrapping_sub(1)) };
    }
}
