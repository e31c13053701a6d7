//! The reference and the path under test, measured in alternating windows of the same run.
//!
//! A busy machine drifts: other work starts and stops, caches and frequencies change. Measured
//! one after the other, two paths differ by that drift as much as by their own costs; measured
//! in short alternating windows, both see the same drift. Pairs are ordered ABBA (reference
//! first, then test first), so a steady trend cancels within every two pairs too.

use anyhow::{Result, bail};

use crate::cpu::CpuUse;

/// Which path a window measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Reference,
    Test,
}

/// What one window measured, or (as [`Totals`]) all windows of one side added up.
#[derive(Clone, Debug, Default)]
pub(crate) struct Window {
    /// What got through: packets, connections or bytes.
    pub(crate) units: u64,
    pub(crate) seconds: f64,
    /// Frames the generator offered (accepted or refused by the full ring).
    pub(crate) offered: u64,
    /// Frames refused because the path was full.
    pub(crate) rejected: u64,
    /// Every core's time during the window.
    pub(crate) cpu: CpuUse,
    /// The generator thread's own CPU seconds.
    pub(crate) generator_seconds: f64,
    /// CPU seconds of the kernel threads that run the path (generator tests only).
    pub(crate) path_seconds: f64,
}

/// The windows of one side, added up.
pub(crate) type Totals = Window;

impl Window {
    /// Adds another window's figures to these.
    pub(crate) fn add(&mut self, window: &Self) {
        self.units += window.units;
        self.seconds += window.seconds;
        self.offered += window.offered;
        self.rejected += window.rejected;
        self.cpu.add(&window.cpu);
        self.generator_seconds += window.generator_seconds;
        self.path_seconds += window.path_seconds;
    }

    /// Units per second.
    pub(crate) fn rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.units as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// CPU nanoseconds the path's threads spent per unit.
    pub(crate) fn path_ns_per_unit(&self) -> f64 {
        if self.units == 0 {
            return f64::NAN;
        }
        self.path_seconds * 1e9 / self.units as f64
    }

    /// Busy CPU nanoseconds (all cores) per unit.
    pub(crate) fn cpu_ns_per_unit(&self) -> f64 {
        if self.units == 0 {
            return f64::NAN;
        }
        self.cpu.busy_seconds() * 1e9 / self.units as f64
    }
}

/// A path under test against the reference.
#[derive(Clone, Debug, Default)]
pub(crate) struct Comparison {
    pub(crate) reference: Totals,
    pub(crate) test: Totals,
    /// The ratio of each pair of windows (see [`Comparison::ratio`]).
    pub(crate) pair_ratios: Vec<f64>,
}

impl Comparison {
    /// How the path compares with the reference, over all windows (1.0: as fast).
    ///
    /// Where the path's own threads are known (the generator tests), it is the reference's
    /// CPU time per packet over the path's: the packet rate ratio of a core that does nothing
    /// else, whatever other work took the core during the windows. On a quiet machine it equals
    /// [`Comparison::rate_ratio`]. Elsewhere it is the rate ratio.
    pub(crate) fn ratio(&self) -> f64 {
        ratio(&self.reference, &self.test)
    }

    /// Test rate over reference rate, over all windows.
    pub(crate) fn rate_ratio(&self) -> f64 {
        let reference = self.reference.rate();
        if reference > 0.0 {
            self.test.rate() / reference
        } else {
            f64::NAN
        }
    }

    /// What one unit costs the path under test on top of the reference in CPU time of the
    /// threads that run the path: independent of what else took the core.
    pub(crate) fn extra_path_ns(&self) -> f64 {
        self.test.path_ns_per_unit() - self.reference.path_ns_per_unit()
    }

    /// What one unit costs the path under test on top of the reference, in wall nanoseconds
    /// of a saturated path: 1/rate(test) - 1/rate(reference).
    pub(crate) fn extra_ns(&self) -> f64 {
        let (test, reference) = (self.test.rate(), self.reference.rate());
        if test > 0.0 && reference > 0.0 {
            1e9 / test - 1e9 / reference
        } else {
            f64::NAN
        }
    }

    /// Lowest and highest pair ratio: how much the windows disagreed.
    pub(crate) fn spread(&self) -> (f64, f64) {
        let low = self
            .pair_ratios
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min);
        let high = self
            .pair_ratios
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        (low, high)
    }
}

/// See [`Comparison::ratio`].
fn ratio(reference: &Window, test: &Window) -> f64 {
    if reference.path_seconds > 0.0 && test.path_seconds > 0.0 {
        reference.path_ns_per_unit() / test.path_ns_per_unit()
    } else if reference.rate() > 0.0 {
        test.rate() / reference.rate()
    } else {
        f64::NAN
    }
}

/// Runs `pairs` pairs of windows. `between` runs after every window, outside the timing (to
/// undo what a window left behind, say).
pub(crate) fn alternate(
    pairs: usize,
    mut measure: impl FnMut(Side) -> Result<Window>,
    mut between: impl FnMut(Side) -> Result<()>,
) -> Result<Comparison> {
    let mut comparison = Comparison::default();
    for pair in 0..pairs {
        let order = if pair % 2 == 0 {
            [Side::Reference, Side::Test]
        } else {
            [Side::Test, Side::Reference]
        };
        let mut windows = [Window::default(), Window::default()];
        for side in order {
            if crate::interrupted() {
                bail!("interrupted");
            }
            let window = measure(side)?;
            match side {
                Side::Reference => comparison.reference.add(&window),
                Side::Test => comparison.test.add(&window),
            }
            windows[usize::from(side == Side::Test)] = window;
            between(side)?;
        }
        let [reference, test] = &windows;
        comparison.pair_ratios.push(ratio(reference, test));
    }
    Ok(comparison)
}
