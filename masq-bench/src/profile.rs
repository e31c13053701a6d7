//! `perf` samples of the path's kernel threads while traffic crosses it: which kernel functions
//! (and which of masq's programs) its time goes to.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// Where one profile's samples went.
#[derive(Clone, Debug, Default)]
pub(crate) struct Profile {
    /// (function, share of the samples, 0 to 1), every function `perf` sampled, largest
    /// first.
    pub(crate) functions: Vec<(String, f64)>,
    /// Samples taken.
    pub(crate) samples: u64,
    /// The path's kernel threads' CPU time per unit while the profile was taken, when known:
    /// turns shares into nanoseconds per unit.
    pub(crate) path_ns_per_unit: Option<f64>,
}

/// The profiles the report shows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Profiles {
    pub(crate) established: Profile,
    /// No NAT on the same established traffic: what masq's established profile is compared
    /// with, function by function.
    pub(crate) established_reference: Profile,
    /// Every core during one iperf3 stream through masq, and through no NAT: what masq's
    /// programs and the kernel functions they call cost a stream. Times per 1500 bytes.
    pub(crate) stream: Profile,
    pub(crate) stream_reference: Profile,
    /// The same stream through iptables-nft: what netfilter's NAT costs it.
    pub(crate) stream_iptables: Profile,
    pub(crate) new_flows: Profile,
    /// masq's egress program alone on an established packet, run over and over by
    /// `BPF_PROG_TEST_RUN`: its own instructions against the kernel functions it calls.
    pub(crate) program: Profile,
}

impl Profile {
    /// The share of the samples in masq's programs' own instructions.
    pub(crate) fn in_programs(&self) -> f64 {
        self.share_of(|function| function.ends_with(PROGRAM_SUFFIX))
    }

    /// The share of the samples in the functions `chosen` picks.
    pub(crate) fn share_of(&self, chosen: impl Fn(&str) -> bool) -> f64 {
        self.functions
            .iter()
            .filter(|(function, _)| chosen(function))
            .map(|(_, share)| share)
            .sum()
    }
}

/// A function's nanoseconds per unit in a profile and in its reference, both listed, and what
/// the profile spends on it more.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Difference {
    pub(crate) function: String,
    pub(crate) reference_ns: f64,
    pub(crate) ns: f64,
}

impl Difference {
    pub(crate) fn extra_ns(&self) -> f64 {
        self.ns - self.reference_ns
    }
}

/// Function by function, what `profile` spends per unit more than `reference`, largest first;
/// a function only one of them sampled costs the other nothing. Empty unless both know their
/// time per unit.
pub(crate) fn differences(profile: &Profile, reference: &Profile) -> Vec<Difference> {
    let (Some(per_unit), Some(reference_per_unit)) =
        (profile.path_ns_per_unit, reference.path_ns_per_unit)
    else {
        return Vec::new();
    };
    let (profile_shares, reference_shares) = (shares(profile), shares(reference));
    let mut functions: Vec<&str> = profile_shares
        .keys()
        .chain(reference_shares.keys())
        .copied()
        .collect();
    functions.sort_unstable();
    functions.dedup();
    let ns_in = |shares: &std::collections::HashMap<&str, f64>, per_unit: f64, function: &str| {
        shares.get(function).map_or(0.0, |share| share * per_unit)
    };
    let mut differences: Vec<Difference> = functions
        .into_iter()
        .map(|function| Difference {
            function: function.to_owned(),
            reference_ns: ns_in(&reference_shares, reference_per_unit, function),
            ns: ns_in(&profile_shares, per_unit, function),
        })
        .collect();
    differences.sort_by(|a, b| b.extra_ns().total_cmp(&a.extra_ns()));
    differences
}

/// Each function's share in `profile`, by name: a full profile has thousands of functions.
fn shares(profile: &Profile) -> std::collections::HashMap<&str, f64> {
    profile
        .functions
        .iter()
        .map(|(name, share)| (name.as_str(), *share))
        .collect()
}

/// How [`readable`] marks a JITed program.
pub(crate) const PROGRAM_SUFFIX: &str = " (eBPF program)";

/// Functions a report shows per profile.
pub(crate) const SHOWN: usize = 12;

/// What `perf record` samples.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sampled<'a> {
    /// These threads (a path's kernel threads): their own time, whatever else runs on their
    /// core.
    Threads(&'a [i32]),
    /// Every core, idle time included: work spread over threads that come and go (a TCP
    /// stream's sender, receiver and softirqs).
    AllCores,
}

/// Samples `sampled` with `perf record` while `work` runs.
pub(crate) fn sample(sampled: Sampled<'_>, work: impl FnOnce() -> Result<()>) -> Result<Profile> {
    let data = PathBuf::from(format!("/tmp/masq-bench-perf-{}.data", std::process::id()));
    let target = match sampled {
        Sampled::Threads(threads) => {
            let threads: Vec<String> = threads.iter().map(i32::to_string).collect();
            vec!["-t".to_owned(), threads.join(",")]
        }
        Sampled::AllCores => vec!["-a".to_owned()],
    };
    let _ = fs::remove_file(&data);
    let mut recorder = std::process::Command::new("perf")
        .args(["record", "--quiet"])
        .args(&target)
        .arg("-o")
        .arg(&data)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting perf record (cargo xtask bench installs linux-perf)")?;
    if let Err(error) = wait_until_recording(&mut recorder, &data) {
        let _ = recorder.kill();
        let _ = recorder.wait();
        return Err(error);
    }
    let worked = work();
    // SIGINT makes perf record write its file and exit.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(recorder.id()).unwrap_or(i32::MAX)),
        nix::sys::signal::Signal::SIGINT,
    )
    .context("stopping perf record")?;
    let recorded = recorder
        .wait_with_output()
        .context("waiting for perf record")?;
    worked?;
    if !recorded.status.success() && !data.exists() {
        bail!(
            "perf record failed: {}",
            String::from_utf8_lossy(&recorded.stderr)
        );
    }
    let report = std::process::Command::new("perf")
        .args(["report", "--stdio", "--no-children", "--sort", "sym", "-i"])
        .arg(&data)
        .output()
        .context("running perf report")?;
    let _ = fs::remove_file(&data);
    if !report.status.success() {
        bail!(
            "perf report failed: {}",
            String::from_utf8_lossy(&report.stderr)
        );
    }
    Ok(parse(&String::from_utf8_lossy(&report.stdout)))
}

/// Waits until `perf record` has written its file's header, which it does once its events are
/// open, and a moment more for them to be enabled. A fixed pause was too short once on a busy
/// machine: stopped before it had started, perf wrote nothing and the profile failed.
fn wait_until_recording(recorder: &mut Child, data: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::metadata(data).map_or(true, |file| file.len() == 0) {
        if let Some(status) = recorder.try_wait().context("waiting for perf record")? {
            bail!("perf record exited before it recorded anything ({status})");
        }
        if Instant::now() >= deadline {
            bail!("perf record did not start recording within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    Ok(())
}

/// The functions of `perf report --stdio --no-children --sort sym` output. All are kept: a
/// sum over a group of functions (masq's, netfilter's) then counts every function of the
/// group that was sampled, not only the largest (within the shares' rounding to 0.01%).
fn parse(report: &str) -> Profile {
    let samples = report
        .lines()
        .find_map(|line| {
            line.strip_prefix("# Samples: ")?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .map_or(0, |count| {
            let (digits, scale) = match count.strip_suffix('K') {
                Some(digits) => (digits, 1_000.0),
                None => (count.as_str(), 1.0),
            };
            (digits.parse::<f64>().unwrap_or(0.0) * scale) as u64
        });
    let functions = report
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let share = fields.next()?.strip_suffix('%')?.parse::<f64>().ok()?;
            let _kind = fields.next()?;
            let function: Vec<&str> = fields.collect();
            (!function.is_empty()).then(|| (readable(&function.join(" ")), share / 100.0))
        })
        .collect();
    Profile {
        functions,
        samples,
        path_ns_per_unit: None,
    }
}

/// A JITed program's symbol (`bpf_prog_<tag>_<name>`) by its name; anything else as it is.
fn readable(symbol: &str) -> String {
    symbol
        .strip_prefix("bpf_prog_")
        .and_then(|rest| rest.split_once('_'))
        .map_or_else(
            || symbol.to_owned(),
            |(_tag, name)| format!("{name}{PROGRAM_SUFFIX}"),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_perf_report_lines() {
        let report = "# Samples: 18K of event 'cpu-clock:ppp'\n#\n     24.68%  [k] lookup_nulls_elem_raw\n      6.14%  [k] bpf_prog_03a2f839501d4a8e_masq_egress\n\n";
        let profile = parse(report);
        assert_eq!(profile.samples, 18_000);
        let names: Vec<&str> = profile
            .functions
            .iter()
            .map(|(name, _)| name.as_str())
            .collect();
        assert_eq!(
            names,
            ["lookup_nulls_elem_raw", "masq_egress (eBPF program)"]
        );
        let shares: Vec<f64> = profile.functions.iter().map(|(_, share)| *share).collect();
        assert!((shares[0] - 0.2468).abs() < 1e-9 && (shares[1] - 0.0614).abs() < 1e-9);
        assert!((profile.in_programs() - 0.0614).abs() < 1e-9);
        assert!((profile.share_of(|function| function.contains("nulls")) - 0.2468).abs() < 1e-9);
    }

    #[test]
    fn recording_starts_when_the_file_has_a_header_and_fails_if_perf_exits_first() {
        let data = std::env::temp_dir().join(format!("masq-bench-wait-{}", std::process::id()));
        let _ = fs::remove_file(&data);
        let mut writer = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sleep 0.2; echo header > {}; sleep 5",
                data.display()
            ))
            .spawn()
            .unwrap();
        let started = Instant::now();
        let waited = wait_until_recording(&mut writer, &data);
        let _ = writer.kill();
        let _ = writer.wait();
        assert!(waited.is_ok(), "{waited:?}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        fs::remove_file(&data).unwrap();

        let mut quitter = std::process::Command::new("true").spawn().unwrap();
        let error = wait_until_recording(&mut quitter, &data).unwrap_err();
        assert!(
            error.to_string().contains("exited before it recorded"),
            "{error}"
        );
    }

    #[test]
    fn differences_are_nanoseconds_per_unit_largest_first() {
        let listed = |functions: &[(&str, f64)], per_unit: f64| Profile {
            functions: functions
                .iter()
                .map(|(name, share)| ((*name).to_owned(), *share))
                .collect(),
            samples: 1000,
            path_ns_per_unit: Some(per_unit),
        };
        let reference = listed(&[("ip_forward", 0.5), ("veth_xmit", 0.25)], 1000.0);
        let profile = listed(
            &[
                ("ip_forward", 0.25),
                ("masq_egress", 0.125),
                ("veth_xmit", 0.125),
            ],
            2000.0,
        );
        let found = differences(&profile, &reference);
        let extra: Vec<(&str, f64)> = found
            .iter()
            .map(|difference| (difference.function.as_str(), difference.extra_ns()))
            .collect();
        assert_eq!(
            extra,
            [
                ("masq_egress", 250.0),
                ("ip_forward", 0.0),
                ("veth_xmit", 0.0)
            ]
        );
        assert_eq!(found[0].reference_ns, 0.0);
        let unknown = Profile {
            path_ns_per_unit: None,
            ..reference.clone()
        };
        assert!(differences(&profile, &unknown).is_empty());
    }
}
