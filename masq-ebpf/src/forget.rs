//! Making the verifier forget what a value was computed from.
//!
//! The verifier walks a program once per distinct state it can reach each instruction with: a
//! value computed along several paths (a window updated one way or another, an option found at
//! one offset or another) splits everything after it into one walk per path, and a few such
//! values in a row multiply. A value stored into a map and read back is known to the verifier
//! only by its width, so every path reaches the code after it in the same state. The programs
//! pass such values through [`FORGET`], a per-CPU slot private to this CPU while a program
//! runs.

use crate::maps::FORGET;

/// `value`, as the verifier knows a `u32` read from a map.
#[inline(always)]
pub(crate) fn word(value: u32) -> Option<u32> {
    let slot = FORGET.get_ptr_mut(0)?;
    // SAFETY: per-CPU array slots are private to this CPU while the program runs; volatile, so
    // the compiler reads back what the verifier cannot know rather than what it wrote.
    unsafe {
        core::ptr::write_volatile(&raw mut (*slot).word, value);
        Some(core::ptr::read_volatile(&raw const (*slot).word))
    }
}
