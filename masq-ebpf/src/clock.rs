//! The time the programs stamp flows and fragments with. A leaf: the NAT state and the
//! fragments' records both read it.

use aya_ebpf::helpers::generated::{bpf_jiffies64, bpf_ktime_get_coarse_ns};

/// The coarse clock as last read, with the tick (jiffies) it was read in.
#[repr(C)]
struct CoarseClock {
    jiffies: u64,
    ns: u64,
}

/// The last reading of the coarse clock, shared by all CPUs. Written by the programs (the
/// first packet of each tick on each CPU), never by the agent; a global rather than a pinned
/// map because it is a cache: a new program starts with its own, empty.
static mut COARSE_CLOCK: CoarseClock = CoarseClock { jiffies: 0, ns: 0 };

/// Monotonic time in nanoseconds (CLOCK_MONOTONIC), coarse: it moves once per tick.
///
/// The coarse clock changes only when jiffies do, and the kernel reads jiffies inline where it
/// must call out for the clock, so the clock is read once per tick and cached. Every packet of
/// a flow asks for the time, and a helper call costs as much as the rest of the lookup. Two
/// CPUs refreshing the cache at once can leave a reading one tick old, never one ahead.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments; the kernel inlines it as a load of jiffies.
    let jiffies = unsafe { bpf_jiffies64() };
    let clock = &raw mut COARSE_CLOCK;
    // SAFETY: `clock` points at the program's global; concurrent writers store whole fields,
    // and a mismatched pair is at most a tick old (see above). Volatile, so each packet reads
    // what another CPU may have stored.
    unsafe {
        if core::ptr::read_volatile(&raw const (*clock).jiffies) == jiffies {
            return core::ptr::read_volatile(&raw const (*clock).ns);
        }
        let ns = bpf_ktime_get_coarse_ns();
        core::ptr::write_volatile(&raw mut (*clock).ns, ns);
        core::ptr::write_volatile(&raw mut (*clock).jiffies, jiffies);
        ns
    }
}
