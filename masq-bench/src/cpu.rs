//! Where the CPU went: per-core time from `/proc/stat`, the calling thread's own time, and a
//! process's time and memory from `/proc/PID`.

use std::{fs, time::Duration};

use anyhow::{Context as _, Result};

/// `/proc/stat` columns: user nice system idle iowait irq softirq steal.
const COLUMNS: usize = 8;
const IDLE: usize = 3;
const IOWAIT: usize = 4;

/// Clock ticks per second of `/proc/stat` and `/proc/PID/stat`.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// Cumulative time of every core, in ticks.
#[derive(Clone, Debug, Default)]
pub(crate) struct CpuTimes(Vec<[u64; COLUMNS]>);

impl CpuTimes {
    /// The counters now.
    pub(crate) fn read() -> Result<Self> {
        let text = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        let cores = text
            .lines()
            .filter(|line| {
                line.starts_with("cpu") && line.as_bytes().get(3).is_some_and(u8::is_ascii_digit)
            })
            .map(|line| {
                let mut values = [0u64; COLUMNS];
                for (slot, field) in values.iter_mut().zip(line.split_whitespace().skip(1)) {
                    *slot = field.parse().unwrap_or(0);
                }
                values
            })
            .collect();
        Ok(Self(cores))
    }

    /// What each core did between `earlier` and `self`.
    pub(crate) fn since(&self, earlier: &Self) -> CpuUse {
        CpuUse(
            self.0
                .iter()
                .zip(&earlier.0)
                .map(|(now, before)| {
                    let mut delta = [0u64; COLUMNS];
                    for (index, slot) in delta.iter_mut().enumerate() {
                        *slot = now[index].saturating_sub(before[index]);
                    }
                    delta
                })
                .collect(),
        )
    }
}

/// Ticks each core spent, by kind, over some interval.
#[derive(Clone, Debug, Default)]
pub(crate) struct CpuUse(Vec<[u64; COLUMNS]>);

impl CpuUse {
    /// Adds another interval.
    pub(crate) fn add(&mut self, other: &Self) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), [0; COLUMNS]);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            for (slot, value) in mine.iter_mut().zip(theirs) {
                *slot += value;
            }
        }
    }

    fn total(&self, core: usize) -> u64 {
        self.0.get(core).map_or(0, |values| values.iter().sum())
    }

    /// Share of `core`'s time it was busy (anything but idle and I/O wait).
    pub(crate) fn busy(&self, core: usize) -> f64 {
        let Some(values) = self.0.get(core) else {
            return 0.0;
        };
        let total = self.total(core);
        if total == 0 {
            return 0.0;
        }
        (total - values[IDLE] - values[IOWAIT]) as f64 / total as f64
    }

    /// Share of all cores' time they were busy.
    pub(crate) fn busy_all(&self) -> f64 {
        let total: u64 = (0..self.0.len()).map(|core| self.total(core)).sum();
        if total == 0 {
            return 0.0;
        }
        let idle: u64 = self
            .0
            .iter()
            .map(|values| values[IDLE] + values[IOWAIT])
            .sum();
        (total - idle) as f64 / total as f64
    }

    /// Seconds of every core together, idle included.
    pub(crate) fn seconds(&self) -> f64 {
        let total: u64 = (0..self.0.len()).map(|core| self.total(core)).sum();
        total as f64 / ticks_per_second()
    }

    /// Busy seconds of every core together.
    pub(crate) fn busy_seconds(&self) -> f64 {
        let busy: u64 = self
            .0
            .iter()
            .map(|values| values.iter().sum::<u64>() - values[IDLE] - values[IOWAIT])
            .sum();
        busy as f64 / ticks_per_second()
    }
}

/// CPU time the calling thread has used.
pub(crate) fn thread_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// CPU time (user and system) a process has used, from `/proc/PID/stat`.
pub(crate) fn process_time(pid: u32) -> Result<Duration> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = text
        .rsplit_once(')')
        .map_or(text.as_str(), |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ... utime(11) stime(12).
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&index| fields.get(index)?.parse::<u64>().ok())
        .sum();
    Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_second()))
}

/// Resident memory of a process in bytes, from `/proc/PID/status`.
pub(crate) fn resident_bytes(pid: u32) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    text.lines()
        .find_map(|line| {
            let kib = line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?;
            kib.trim().parse::<u64>().ok()
        })
        .map(|kib| kib * 1024)
        .context("no VmRSS")
}

/// The model name of the first core.
pub(crate) fn model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                Some(
                    line.strip_prefix("model name")?
                        .split_once(':')?
                        .1
                        .trim()
                        .to_owned(),
                )
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}
