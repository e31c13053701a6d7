//! The kernel's clocks.

/// The current `CLOCK_MONOTONIC` time in nanoseconds, the clock `bpf_ktime_get_coarse_ns`
/// reads; 0 if the kernel does not tell.
pub fn monotonic_now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    let seconds = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}
