//! `cargo xtask bench`: masq against upstream's iptables chain (nf_tables and legacy) and plain
//! forwarding, measured so that nothing flatters masq: a generator faster than every path, the
//! reference measured in the same run in alternating windows, the NAT tables full for new
//! flows, and what limited each figure reported next to it. Writes BENCHMARKS.md and its plot.
//!
//! `--quick` runs every part at tiny sizes: it checks that the harness works end to end (as
//! `cargo xtask test` does), and its numbers mean nothing.
//!
//! `--baseline-agent` adds the `masq` agent of an earlier revision (`cargo xtask bench
//! --baseline REV` builds it) as one more mode of the traffic tests, measured like masq and
//! shown next to it with the ratio between the two.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the benchmark reports progress and results on the terminal"
)]

mod apply;
mod config;
mod cpu;
mod flatness;
mod footprint;
mod frames;
mod interleave;
mod paths;
mod profile;
mod progtime;
mod rawnat;
mod report;
mod tcp;
mod tx;
mod udp;

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;

use crate::{
    flatness::{Flatness, FlatnessSettings},
    footprint::FootprintSettings,
    frames::Family,
    paths::{BenchPath, Cores, Mode},
    profile::Profiles,
    progtime::ProgramSettings,
    report::{Figures, Results, Run},
    udp::UdpSettings,
};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// When the run started, for progress lines.
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Whether SIGINT or SIGTERM arrived: loops stop, and the namespaces, agents and pins are
/// removed on the way out.
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

#[derive(Parser, Debug)]
#[command(
    name = "masq-bench",
    about = "masq against iptables MASQUERADE and no NAT"
)]
struct Args {
    /// Tiny sizes, every part once: checks the harness, measures nothing.
    #[arg(long)]
    quick: bool,
    /// Where to write the Markdown report.
    #[arg(long, value_name = "FILE")]
    output: PathBuf,
    /// Where to write the PNG plot (the report links it by file name).
    #[arg(long, value_name = "FILE")]
    plot: PathBuf,
    /// The command line to print in the report.
    #[arg(long, default_value = "cargo xtask bench")]
    command: String,
    /// The masq revision to print in the report.
    #[arg(long, default_value = "(unknown revision)")]
    revision: String,
    /// Only these CIDR counts (comma-separated), for a partial run while developing.
    #[arg(long, value_delimiter = ',')]
    cidrs: Vec<usize>,
    /// Only these modes (nft, legacy, masq, baseline), for a partial run while developing.
    #[arg(long, value_delimiter = ',')]
    modes: Vec<String>,
    /// Only the traffic of these families (ipv4, ipv6), for a partial run while developing.
    #[arg(long, value_delimiter = ',')]
    families: Vec<String>,
    /// Skip the program, config apply and footprint parts.
    #[arg(long)]
    traffic_only: bool,
    /// Instead of measuring, push traffic through one path for this long, for a profiler to
    /// watch (`perf record -C CORE`): established flows, then new flows, each half the time.
    /// The first of --modes and --cidrs choose the path (default: masq, 3 CIDRs).
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,
    /// Only time the datapath programs (BPF_PROG_TEST_RUN), print the times and write nothing:
    /// the quick loop while changing the datapath.
    #[arg(long)]
    program_only: bool,
    /// The `masq` binary of an earlier revision (it embeds that revision's datapath): its
    /// agent is measured in every traffic test as one more mode, `masq@<revision>`.
    #[arg(long, value_name = "PATH", requires = "baseline_revision")]
    baseline_agent: Option<PathBuf>,
    /// The revision `--baseline-agent` was built from, as the report names it.
    #[arg(long, value_name = "REV", requires = "baseline_agent")]
    baseline_revision: Option<String>,
}

/// How long and how large everything is.
#[derive(Clone, Debug)]
struct Plan {
    cidr_counts: Vec<usize>,
    /// The CIDR counts of the IPv6 traffic (IPv6 CIDRs, beside the three IPv4 defaults).
    ipv6_cidr_counts: Vec<usize>,
    /// iptables is measured up to this many CIDRs.
    iptables_max_cidrs: usize,
    udp: UdpSettings,
    nat_entries: u32,
    connect_pairs: usize,
    connect_window: Duration,
    stream_pairs: usize,
    stream_seconds: u32,
    program: ProgramSettings,
    flatness: FlatnessSettings,
    apply_sizes: Vec<usize>,
    footprint: FootprintSettings,
    /// How long each profile samples the path's core.
    profile: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        // Same capacity in flows for both: masq holds two entries a flow.
        let conntrack_max: u32 =
            std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(262_144);
        if quick {
            return Self {
                cidr_counts: vec![3],
                ipv6_cidr_counts: vec![3],
                iptables_max_cidrs: 3,
                udp: UdpSettings {
                    window: Duration::from_millis(20),
                    pairs: 2,
                    established_flows: 16,
                    new_flow_pairs: 2,
                    // Windows of 1,024 new flows (an eighth of the table): long enough for
                    // some to have crossed the path when a window ends.
                    conntrack_flows: Some(8192),
                },
                nat_entries: 16_384,
                connect_pairs: 1,
                connect_window: Duration::from_millis(50),
                stream_pairs: 1,
                stream_seconds: 1,
                program: ProgramSettings {
                    nat_entries: 2048,
                    many_cidrs: 1000,
                    repeat: 100,
                    single_runs: 11,
                },
                flatness: FlatnessSettings {
                    nat_entries: 2048,
                    many_cidrs: 1000,
                    rounds: 3,
                    repeat: 100,
                },
                apply_sizes: vec![100],
                footprint: FootprintSettings {
                    nat_entries: 2048,
                    reload_cidrs: 1000,
                    idle: Duration::from_millis(500),
                    scan: Duration::from_millis(1500),
                    expire: false,
                },
                profile: Duration::from_millis(500),
            };
        }
        Self {
            cidr_counts: vec![3, 1_000, 10_000, config::MAX_CIDRS],
            ipv6_cidr_counts: vec![3],
            iptables_max_cidrs: 10_000,
            udp: UdpSettings {
                window: Duration::from_millis(100),
                pairs: 16,
                established_flows: 256,
                new_flow_pairs: 16,
                conntrack_flows: None,
            },
            nat_entries: conntrack_max.saturating_mul(2),
            connect_pairs: 12,
            connect_window: Duration::from_millis(200),
            stream_pairs: 8,
            stream_seconds: 1,
            program: ProgramSettings {
                nat_entries: conntrack_max.saturating_mul(2),
                many_cidrs: 100_000,
                repeat: 1_000_000,
                single_runs: 2001,
            },
            flatness: FlatnessSettings {
                nat_entries: conntrack_max.saturating_mul(2),
                many_cidrs: 100_000,
                rounds: 41,
                repeat: 50_000,
            },
            apply_sizes: vec![1_000, 10_000, config::MAX_CIDRS, 100_000],
            footprint: FootprintSettings {
                nat_entries: conntrack_max.saturating_mul(2),
                reload_cidrs: 10_000,
                idle: Duration::from_secs(3),
                // More than one collection at the default interval.
                scan: Duration::from_secs(12),
                expire: true,
            },
            profile: Duration::from_secs(4),
        }
    }

    /// The CIDR counts `family`'s traffic is measured at.
    fn cidr_counts(&self, family: Family) -> &[usize] {
        match family {
            Family::V4 => &self.cidr_counts,
            Family::V6 => &self.ipv6_cidr_counts,
        }
    }
}

/// Removes what a killed earlier run may have left: its namespaces and pins (named by this
/// program's prefixes, with the pid of a process that is gone).
fn remove_leftovers() {
    let ours = |name: &str| {
        let Some(rest) = name
            .strip_prefix("masq-bn")
            .map(|rest| rest.trim_start_matches("apply"))
        else {
            return false;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        // The tag holds the pid modulo 100,000; a live process with that pid may own it.
        !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if ours(&name) {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "del", &name])
                    .output();
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf") {
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if ours(&name) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

fn machine(args: &Args, cores: usize) -> Run {
    let output = |program: &str, arguments: &[&str]| {
        std::process::Command::new(program)
            .args(arguments)
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                line.strip_prefix("MemTotal:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0.0);
    Run {
        command: args.command.clone(),
        date: output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        revision: args.revision.clone(),
        cpu: cpu::model(),
        cores,
        memory_gib: memory_kib / f64::from(1 << 20),
        kernel: output("uname", &["-r"]),
        iptables: output("iptables", &["--version"]),
        elapsed: Duration::ZERO,
        quick: args.quick,
        mitigations: ["spectre_v2", "retbleed", "spec_rstack_overflow"]
            .map(|name| {
                let state = std::fs::read_to_string(format!(
                    "/sys/devices/system/cpu/vulnerabilities/{name}"
                ))
                .unwrap_or_else(|_| "unknown".to_owned());
                format!("{name}: {}", state.trim())
            })
            .join("; "),
    }
}

/// Every traffic test of `mode` at `cidrs` CIDRs against the reference, in the reference's
/// family.
fn traffic(
    reference: &BenchPath,
    mode: Mode,
    cidrs: usize,
    plan: &Plan,
    cores: Cores,
) -> Result<Figures> {
    let family = reference.family;
    let mut test = BenchPath::new(mode, family, cidrs, plan.nat_entries, cores)?;
    let progress = |test: &str, comparison: &interleave::Comparison| {
        progress(family, mode, cidrs, test, comparison);
    };
    let established = udp::established(reference, &test, &plan.udp, cores)?;
    progress("established", &established);
    let (connect, connect_failures) =
        tcp::connect_close(reference, &test, plan.connect_pairs, plan.connect_window)?;
    progress("connect+close", &connect);
    let stream = tcp::stream(
        reference,
        &test,
        plan.stream_pairs,
        plan.stream_seconds,
        cores,
    )?;
    progress("one TCP stream", &stream);
    // Last: it leaves the table full.
    let new_flows = udp::new_flows(reference, &mut test, &plan.udp, cores)?;
    progress("new flows", &new_flows.comparison);
    Ok(Figures {
        family,
        mode,
        cidrs,
        established,
        new_flows,
        connect,
        connect_failures,
        stream,
    })
}

fn progress(
    family: Family,
    mode: Mode,
    cidrs: usize,
    test: &str,
    comparison: &interleave::Comparison,
) {
    eprintln!(
        "bench: {:>4}s {} {:<16} {cidrs:>6} CIDRs  {test:<14} ratio {:.2}  ({:.0}/s against {:.0}/s)",
        STARTED
            .get()
            .map_or(0, |started| started.elapsed().as_secs()),
        family.name(),
        mode.name(),
        comparison.ratio(),
        comparison.test.rate(),
        comparison.reference.rate()
    );
}

/// The established path with 3 CIDRs and with many, timed in alternating rounds.
fn flatness(plan: &Plan, cores: Cores) -> Result<Flatness> {
    eprintln!(
        "bench: the established path with 3 and with {} CIDRs, side by side",
        plan.flatness.many_cidrs
    );
    let flatness = flatness::measure(&plan.flatness, cores)?;
    for times in &flatness.times {
        eprintln!(
            "  {:<85} {:>6.0} ns {:>6.0} ns both cores {:>6.0} ns exempt",
            times.label, times.established, times.established_both_cores, times.exempt,
        );
    }
    Ok(flatness)
}

fn print_program_times(times: &[progtime::ProgramTime]) {
    for time in times {
        eprintln!(
            "  {:<85} {:>6.0} ns {:>6.0} ns",
            time.path, time.few, time.many
        );
    }
}

/// What `--quick` checks: every part produced something (never how much).
fn check(results: &Results) -> Result<()> {
    if paths::baseline().is_some()
        && !results
            .figures
            .iter()
            .any(|figures| figures.mode == Mode::Baseline)
    {
        bail!("the baseline was not measured");
    }
    for figures in &results.figures {
        for (name, comparison) in [
            ("established", &figures.established),
            ("new flows", &figures.new_flows.comparison),
            ("connect+close", &figures.connect),
            ("stream", &figures.stream),
        ] {
            if comparison.reference.units == 0 || comparison.test.units == 0 {
                bail!(
                    "{} {} at {} CIDRs: the {name} test moved nothing through one of the paths",
                    figures.family.name(),
                    figures.mode.name(),
                    figures.cidrs
                );
            }
        }
    }
    if results
        .program
        .iter()
        .any(|time| !(time.few > 0.0 && time.many > 0.0))
    {
        bail!("a BPF_PROG_TEST_RUN time is missing");
    }
    let profiles = &results.profiles;
    if [
        &profiles.established,
        &profiles.established_reference,
        &profiles.stream,
        &profiles.stream_reference,
        &profiles.stream_iptables,
        &profiles.new_flows,
        &profiles.program,
    ]
    .iter()
    .any(|profile| profile.functions.is_empty())
    {
        bail!("a perf profile is empty");
    }
    if profile::differences(&profiles.established, &profiles.established_reference).is_empty()
        || profile::differences(&profiles.stream, &profiles.stream_reference).is_empty()
    {
        bail!("the established or stream profiles cannot be compared: a time per unit is missing");
    }
    if !results
        .attach_modes
        .as_ref()
        .is_some_and(|comparison| comparison.ratio().is_finite())
    {
        bail!("the attach modes were not compared");
    }
    let flatness = &results.flatness.times;
    if flatness.len() != 2
        || flatness
            .iter()
            .any(|times| !(times.established > 0.0 && times.established_both_cores > 0.0))
    {
        bail!("a time of the flatness comparison is missing");
    }
    if results.apply.is_empty() || results.footprint.phases.is_empty() {
        bail!("the config apply or footprint part produced nothing");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    masq_testbed::netns::require_root();
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    remove_leftovers();
    if let (Some(agent), Some(revision)) = (&args.baseline_agent, &args.baseline_revision) {
        paths::set_baseline(agent.clone(), revision)?;
    }
    let started = *STARTED.get_or_init(Instant::now);
    let plan = Plan::new(args.quick);
    let cores = Cores::pick()?;
    let online = std::thread::available_parallelism().map_or(1, usize::from);
    let mut run = machine(&args, online);

    if let Some(seconds) = args.soak {
        let mode = Mode::all()
            .into_iter()
            .find(|mode| args.modes.first().is_some_and(|name| mode.is_named(name)))
            .unwrap_or(Mode::Masq);
        let cidrs = args.cidrs.first().copied().unwrap_or(3);
        return udp::soak(
            mode,
            cidrs,
            plan.nat_entries,
            cores,
            Duration::from_secs(seconds),
        );
    }
    if args.program_only {
        let (times, profile) = progtime::measure(&plan.program, plan.profile)?;
        print_program_times(&times);
        for (function, share) in profile.functions.iter().take(profile::SHOWN) {
            eprintln!("  {:>5.1}%  {function}", 100.0 * share);
        }
        flatness(&plan, cores)?;
        return Ok(());
    }
    let mut figures = Vec::new();
    for family in Family::ALL {
        if !(args.families.is_empty()
            || args
                .families
                .iter()
                .any(|name| family.name().eq_ignore_ascii_case(name)))
        {
            continue;
        }
        // Each family's reference forwards that family: an IPv6 one is dual-stack, as its
        // paths under test are.
        let reference = BenchPath::new(Mode::NoNat, family, 3, plan.nat_entries, cores)?;
        for &cidrs in plan.cidr_counts(family) {
            // The baseline right after masq, so the two are measured close together.
            for mode in Mode::compared() {
                let chosen = (args.cidrs.is_empty() || args.cidrs.contains(&cidrs))
                    && (args.modes.is_empty() || args.modes.iter().any(|name| mode.is_named(name)))
                    && mode.runs(family);
                if !chosen || (!mode.is_masq() && cidrs > plan.iptables_max_cidrs) {
                    continue;
                }
                if interrupted() {
                    bail!("interrupted");
                }
                figures.push(traffic(&reference, mode, cidrs, &plan, cores).with_context(
                    || format!("{} {} at {cidrs} CIDRs", family.name(), mode.name()),
                )?);
            }
        }
    }

    let (program, flatness, apply, footprint, profiles, attach_modes) = if args.traffic_only {
        Default::default()
    } else {
        eprintln!("bench: datapath programs (BPF_PROG_TEST_RUN)");
        let (program, program_profile) = progtime::measure(&plan.program, plan.profile)?;
        print_program_times(&program);
        let flatness = flatness(&plan, cores)?;
        let mut apply = Vec::new();
        for &cidrs in &plan.apply_sizes {
            eprintln!("bench: applying {cidrs} CIDRs");
            apply.push(apply::measure(cidrs)?);
        }
        eprintln!("bench: the agent's footprint");
        let footprint = footprint::measure(&plan.footprint, cores)?;
        eprintln!("bench: profiling masq's path (perf)");
        let profiles = Profiles {
            program: program_profile,
            ..udp::profile_masq(plan.nat_entries, cores, plan.profile)?
        };
        eprintln!("bench: attach modes (tc against tcx)");
        let attach_modes = udp::attach_modes(plan.nat_entries, &plan.udp, cores)?;
        (
            program,
            flatness,
            apply,
            footprint,
            profiles,
            Some(attach_modes),
        )
    };
    run.elapsed = started.elapsed();
    let results = Results {
        run,
        cores,
        figures,
        program,
        program_many: plan.program.many_cidrs,
        flatness,
        apply,
        footprint,
        profiles,
        attach_modes,
    };
    let plot_name = args
        .plot
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    report::plot(&results, &args.plot)?;
    let markdown = report::markdown(&results, &plot_name);
    std::fs::write(&args.output, &markdown)
        .with_context(|| format!("writing {}", args.output.display()))?;
    println!("{markdown}");
    if args.quick {
        check(&results)?;
        eprintln!(
            "bench: quick run complete in {:.0} s: every part works (its numbers mean nothing)",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
