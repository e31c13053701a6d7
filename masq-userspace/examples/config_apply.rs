//! Times a reload as `masq-bench` does (read, decode, validate, policy; then the trie diff and
//! write) for configs of N CIDRs, the bench's file text: `cargo run --release -p masq-userspace
//! --example config_apply [N...]` (as root, for the trie): a read of the file, the first load,
//! and one-CIDR changes as the agent takes them. `--parse-only` skips the trie, `--reloads N`
//! makes N one-CIDR changes for a profiler to watch, and `--phases` times the steps of a read
//! one by one.

#![expect(
    clippy::print_stdout,
    clippy::expect_used,
    reason = "a measurement printed for a person, on files it writes itself"
)]

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use masq::{
    config::{
        GoDuration,
        source::{ConfigSource, ReadOptions, load},
    },
    datapath::{
        object::{Datapath, LoadOptions},
        sync::{TrieView, sync_nomasq},
    },
    policy::Policy,
};

const OPTIONS: ReadOptions = ReadOptions {
    nomasq_all_reserved_ranges: false,
    enable_ipv6: false,
    resync_interval: GoDuration::from_secs(60),
};

/// masq-bench/src/config.rs: the defaults, then /32s in 100.64.0.0/10, flow style.
fn file_text(count: usize, changed: bool) -> String {
    let mut text = format!("cidrLimit: {}\nnonMasqueradeCIDRs: [", count.max(64));
    for index in 0..count {
        let separator = if index == 0 { "" } else { ", " };
        let cidr = match index {
            0 => "10.0.0.0/8".to_owned(),
            1 => "172.16.0.0/12".to_owned(),
            2 => "192.168.0.0/16".to_owned(),
            _ if changed && index == count - 1 => "100.127.255.255/32".to_owned(),
            _ => format!("{}/32", Ipv4Addr::from_bits(0x6440_0000 + index as u32)),
        };
        let _ = write!(text, "{separator}{cidr}");
    }
    text.push_str("]\n");
    text
}

/// The agent's read of a config and its trie entries.
fn parse(source: &ConfigSource) -> masq::policy::NomasqEntries<Ipv4Addr> {
    let config = load(source, &OPTIONS).expect("valid config");
    Policy::shared(Arc::new(config), false).nomasq_v4()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().any(|arg| arg == name);
    let soak = args
        .iter()
        .position(|arg| arg == "--reloads")
        .and_then(|at| args.get(at + 1)?.parse::<u64>().ok());
    let mut sizes: Vec<usize> = args.iter().filter_map(|arg| arg.parse().ok()).collect();
    if soak.is_some() {
        // The last number is the size; the first, the count.
        sizes.drain(..sizes.len().saturating_sub(1).min(1));
    }
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000, 50_000];
    }
    let dir = tempfile_dir();
    for count in sizes {
        let full = dir.join(format!("full-{count}"));
        let changed = dir.join(format!("changed-{count}"));
        std::fs::write(&full, file_text(count, false)).expect("write");
        std::fs::write(&changed, file_text(count, true)).expect("write");
        // The file the agent reads, replaced by one version or the other as the kubelet does.
        let live = dir.join(format!("live-{count}"));
        let replace = |round: u64| {
            let staged = live.with_extension("next");
            let version = if round.is_multiple_of(2) {
                &changed
            } else {
                &full
            };
            std::fs::copy(version, &staged).expect("copy");
            std::fs::rename(&staged, &live).expect("rename");
        };
        replace(1);
        let live = ConfigSource::File(live.clone());
        if let Some(reloads) = soak {
            for round in 0..reloads {
                replace(round);
                std::hint::black_box(parse(&live));
            }
            return;
        }
        if flag("--phases") {
            phases(&ConfigSource::File(changed.clone()));
            continue;
        }
        // CPU time (every thread of the process) of reading alone: the machine may be busy.
        let runs = 30;
        let source = ConfigSource::File(changed.clone());
        let cpu_started = cpu_time();
        for _ in 0..runs {
            std::hint::black_box(parse(&source));
        }
        let parse_cpu = (cpu_time() - cpu_started) / runs;
        let parse_times = (0..runs)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(parse(&source));
                started.elapsed()
            })
            .collect();
        print!(
            "{count:>6} CIDRs: read {:>9.3?} (CPU {parse_cpu:>9.3?})",
            median(parse_times)
        );
        if !flag("--parse-only") {
            let mut datapath = Datapath::load(&LoadOptions {
                nat_max_entries: 1024,
                nomasq_max_entries: u32::try_from(count + 16).expect("size"),
                ..LoadOptions::default()
            })
            .expect("datapath (run as root)");
            let started = Instant::now();
            apply(&live, &mut datapath);
            let load = started.elapsed();
            let change_times = (0..u64::from(runs))
                .map(|round| {
                    replace(round);
                    let started = Instant::now();
                    apply(&live, &mut datapath);
                    started.elapsed()
                })
                .collect();
            print!(
                "  load {load:>9.3?}  one change {:>9.3?}",
                median(change_times)
            );
        }
        println!("  (medians of {runs})");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agent's reload: read, policy, trie.
fn apply(source: &ConfigSource, datapath: &mut Datapath) {
    let desired = parse(source);
    sync_nomasq(&mut datapath.maps, &desired, TrieView::LastSynced).expect("trie");
}

/// The steps of `load` and the policy, timed one by one (medians of 30).
fn phases(source: &ConfigSource) {
    let ConfigSource::File(path) = source else {
        return;
    };
    let mut times = vec![Vec::new(); 7];
    for _ in 0..30 {
        let mut lap = Instant::now();
        let mut step = |index: usize| {
            times[index].push(lap.elapsed());
            lap = Instant::now();
        };
        let bytes = std::fs::read(path).expect("read");
        step(0);
        let document = go_compat::yaml::to_json(&bytes).expect("yaml");
        step(1);
        let raw = masq::config::decode::decode_upstream(
            document,
            masq::config::MasqConfig::defaults(false),
        )
        .expect("decode");
        step(2);
        let cidrs = masq::config::validate::validate_cidrs(
            raw.non_masquerade_cidrs
                .as_ref()
                .map(|cidrs| cidrs.iter())
                .unwrap_or_default(),
            raw.cidr_limit,
            false,
            masq::config::source::CidrOrigin::Default,
        )
        .expect("valid");
        step(3);
        drop(cidrs);
        let config = load(source, &OPTIONS).expect("valid config");
        step(4);
        let policy = Policy::new(&config, false);
        step(5);
        std::hint::black_box(policy.nomasq_v4());
        step(6);
    }
    let names = [
        "read",
        "to_json",
        "decode",
        "validate",
        "load (all)",
        "Policy::new",
        "nomasq_v4",
    ];
    for (name, times) in names.iter().zip(times) {
        println!("  {name:<12} {:>9.3?}", median(times));
    }
}

fn cpu_time() -> Duration {
    let time = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID)
        .expect("process CPU clock");
    Duration::from(time)
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("masq-config-apply-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
