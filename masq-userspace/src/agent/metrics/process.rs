//! The process families Prometheus client libraries export, for the agent's own process.

use std::fmt;

use procfs::{
    WithCurrentSystemInfo as _,
    process::{LimitValue, Process},
};
use prometheus_client::{collector::Collector, encoding::DescriptorEncoder};

use super::{counter, gauge};

/// The process families Prometheus client libraries export, read from `/proc/self` at every
/// scrape.
///
/// A value that cannot be read is left out rather than reported as 0, as other clients do.
#[derive(Debug)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let encoder = &mut encoder;
        // Counted before procfs opens `/proc/self`, whose handle would be counted too.
        let open_fds = open_fds();
        let process = Process::myself().ok();
        let stat = process.as_ref().and_then(|process| process.stat().ok());
        if let Some(stat) = &stat {
            counter(
                encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                seconds_of_ticks(stat.utime + stat.stime),
            )?;
        }
        if let Some(open) = open_fds {
            gauge(
                encoder,
                "process_open_fds",
                "Number of open file descriptors.",
                open,
            )?;
        }
        let max_fds = process
            .as_ref()
            .and_then(|process| process.limits().ok())
            .map(|limits| limits.max_open_files.soft_limit);
        if let Some(LimitValue::Value(max)) = max_fds {
            gauge(
                encoder,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max,
            )?;
        }
        let Some(stat) = &stat else {
            return Ok(());
        };
        gauge(
            encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize,
        )?;
        gauge(
            encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            stat.rss_bytes().get(),
        )?;
        if let Ok(boot) = procfs::boot_time_secs() {
            #[expect(clippy::cast_precision_loss, reason = "Unix times stay far below 2^53")]
            let boot = boot as f64;
            gauge(
                encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot + seconds_of_ticks(stat.starttime),
            )?;
        }
        Ok(())
    }
}

/// The file descriptors this process has open, less the one reading them. (procfs's
/// `Process::fd_count` counts the handles it opens itself as well, one or two by kernel.)
fn open_fds() -> Option<usize> {
    let fds = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(fds.count().saturating_sub(1))
}

/// `ticks` of the clock `/proc` counts process times in, in seconds.
#[expect(
    clippy::cast_precision_loss,
    reason = "tick counts stay far below 2^53"
)]
fn seconds_of_ticks(ticks: u64) -> f64 {
    ticks as f64 / procfs::ticks_per_second() as f64
}

#[cfg(test)]
mod tests {
    use super::super::{families::tests::representative, render, tests::sample};

    #[test]
    fn the_process_families_describe_this_process() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or_else(|error| panic!("getrlimit: {error}"));
        #[expect(
            clippy::cast_precision_loss,
            reason = "a file limit stays far below 2^53"
        )]
        let soft = soft as f64;
        assert_eq!(sample(&page, "process_max_fds"), Some(soft), "{page}");
        let resident = sample(&page, "process_resident_memory_bytes").unwrap_or_default();
        let size = sample(&page, "process_virtual_memory_bytes").unwrap_or_default();
        assert!(resident > 0.0 && size >= resident, "{page}");
        assert!(
            sample(&page, "process_cpu_seconds_total").is_some_and(|seconds| seconds >= 0.0),
            "{page}"
        );
    }
}
