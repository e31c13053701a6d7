//! Adding to a value all CPUs share.
//!
//! The eBPF instruction set has an atomic add (`BPF_ATOMIC | BPF_ADD`, the old `XADD`, on every
//! kernel masq runs on), but the bpf target has no compare-and-swap, so `core` offers it no
//! atomic read-modify-write at all, and LLVM, told the target is single-threaded, would lower
//! one to a plain load and store. The add is written out as the instruction itself.

/// Adds `amount` to the `u64` at `target` with one atomic instruction. A subtraction is the
/// two's complement's add (`0u64.wrapping_sub(n)`).
///
/// # Safety
/// `target` must point at a valid, aligned `u64` of a map value, for the length of the call.
#[cfg(target_arch = "bpf")]
#[inline(always)]
pub(crate) unsafe fn add(target: *mut u64, amount: u64) {
    // SAFETY: as the caller promises; the instruction only touches `*target`.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({target} + 0) += {amount}",
            target = in(reg) target,
            amount = in(reg) amount,
            options(nostack),
        );
    }
}

/// Host builds (clippy, `cargo check`) only type-check the programs.
///
/// # Safety
/// As for the bpf target's.
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
pub(crate) unsafe fn add(target: *mut u64, amount: u64) {
    use core::sync::atomic::{AtomicU64, Ordering};
    // SAFETY: as the caller promises.
    unsafe { AtomicU64::from_ptr(target) }.fetch_add(amount, Ordering::Relaxed);
}
