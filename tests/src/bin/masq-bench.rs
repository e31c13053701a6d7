//! `cargo xtask bench`: masq against the kernel's iptables MASQUERADE (upstream's exact chain,
//! applied by `masq agent --backend iptables`) and a no-NAT baseline, side by side in one run.
//!
//! Every mode gets a fresh sandbox, so no conntrack or NAT state leaks between modes. Results
//! are printed as a Markdown report with ratios to the baseline; absolute numbers depend on the
//! machine, the ratios are what to compare.

#![expect(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "the benchmark reports on the terminal"
)]
#![expect(
    clippy::expect_used,
    reason = "a benchmark that cannot set up has nothing to report"
)]

use std::{
    fmt::Write as _,
    fs,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use aya::programs::{TestRun, TestRunOptions};
use masq_testbed::{
    agent::Agent,
    harness::Harness,
    pktgen::{Packet, TCP_ACK, TCP_PSH, TCP_SYN},
    sandbox::{OUTSIDE_IP, Sandbox, SandboxOptions},
};
use nix::sys::socket::{setsockopt, sockopt::Linger};

/// How long each rate measurement runs.
const WINDOW: Duration = Duration::from_secs(3);
/// Client threads opening connections.
const CLIENTS: usize = 2;
/// CIDR counts the new-flow rate is measured at.
const CIDR_COUNTS: [usize; 3] = [3, 1_000, 5_000];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Baseline,
    Iptables,
    Masq,
}

impl Mode {
    const fn name(self) -> &'static str {
        match self {
            Self::Baseline => "no NAT (baseline)",
            Self::Iptables => "iptables MASQUERADE",
            Self::Masq => "masq (eBPF)",
        }
    }
}

/// A config with `count` non-masquerade CIDRs, none of which matches the outside host, so
/// iptables walks the whole chain for every new flow.
fn config_with(count: usize, path: &std::path::Path) {
    let mut text = format!("cidrLimit: {}\nnonMasqueradeCIDRs:\n", count.max(64));
    for index in 0..count {
        let cidr = if index < 3 {
            ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"][index].to_owned()
        } else {
            let host = u32::try_from(index).expect("small index");
            format!(
                "{}/32",
                Ipv4Addr::from_bits(Ipv4Addr::new(100, 64, 0, 0).to_bits() + host)
            )
        };
        let _ = writeln!(text, "  - {cidr}");
    }
    fs::write(path, text).expect("writing the config");
}

/// A sandbox running `mode` with `cidrs` non-masquerade CIDRs; the agent (if any) is returned
/// first so it is dropped before the namespaces.
fn setup(mode: Mode, cidrs: usize) -> (Option<Agent>, Sandbox) {
    let sandbox = Sandbox::new("bench", SandboxOptions::default());
    let config = std::env::temp_dir().join(format!("{}-config", sandbox.tag));
    config_with(cidrs, &config);
    let config = config.to_string_lossy().into_owned();
    let agent = match mode {
        Mode::Baseline => None,
        Mode::Iptables => Some(Agent::start(
            &sandbox,
            &["--config", &config, "--backend", "iptables"],
        )),
        Mode::Masq => Some(Agent::start(&sandbox, &["--config", &config])),
    };
    (agent, sandbox)
}

/// New TCP connections per second from a pod to the outside host: connect, then close with a
/// reset so neither side keeps TIME_WAIT state.
fn new_flows_per_second(sandbox: &Sandbox) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let server_stop = stop.clone();
    let server = sandbox.outside.spawn(move || {
        let listener =
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9000)).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        while !server_stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => drop(stream),
                Err(_) => thread::sleep(Duration::from_micros(200)),
            }
        }
    });
    thread::sleep(Duration::from_millis(200));
    let completed = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let completed = completed.clone();
            sandbox.pod(1).spawn(move || {
                let target = SocketAddr::V4(SocketAddrV4::new(OUTSIDE_IP, 9000));
                let deadline = Instant::now() + WINDOW;
                while Instant::now() < deadline {
                    if let Ok(stream) = TcpStream::connect_timeout(&target, Duration::from_secs(1))
                    {
                        let _ = setsockopt(
                            &stream,
                            Linger,
                            &libc::linger {
                                l_onoff: 1,
                                l_linger: 0,
                            },
                        );
                        completed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for client in clients {
        let _ = client.join();
    }
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    completed.load(Ordering::Relaxed) as f64 / WINDOW.as_secs_f64()
}

/// Bulk TCP throughput from a pod to the outside host with iperf3, in Gbit/s.
fn throughput_gbps(sandbox: &Sandbox) -> f64 {
    let mut server = sandbox
        .outside
        .command("iperf3")
        .args(["-s", "-1", "-p", "5201"])
        .spawn()
        .expect("iperf3 server");
    thread::sleep(Duration::from_millis(300));
    let output = sandbox
        .pod(1)
        .command("iperf3")
        .args(["-c", &OUTSIDE_IP.to_string(), "-p", "5201", "-t", "3", "-J"])
        .output()
        .expect("iperf3 client");
    let _ = server.wait();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    report["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9
}

/// Average kernel time per packet of a datapath program on a frame, through
/// `BPF_PROG_TEST_RUN` with many repetitions.
fn program_ns(program: &aya::programs::SchedClassifier, frame: &[u8]) -> f64 {
    let mut out = vec![0u8; frame.len() + 256];
    let options = TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        repeat: 2_000_000,
        ..TestRunOptions::default()
    };
    let result = program.test_run(options).expect("BPF_PROG_TEST_RUN");
    result.duration.as_secs_f64() * 1e9
}

fn ratio(value: f64, baseline: f64) -> String {
    if baseline > 0.0 {
        format!("{:.2}x", value / baseline)
    } else {
        "-".to_owned()
    }
}

fn main() {
    let started = Instant::now();
    let mut report = String::from("## Results\n\n");

    eprintln!("bench: new flows per second");
    let _ = writeln!(
        report,
        "### New TCP flows per second (pod to outside host, {CLIENTS} clients, {}s)\n",
        WINDOW.as_secs()
    );
    let _ = writeln!(
        report,
        "| non-masquerade CIDRs | no NAT (baseline) | iptables MASQUERADE | masq (eBPF) | iptables / baseline | masq / baseline |"
    );
    let _ = writeln!(report, "|---:|---:|---:|---:|---:|---:|");
    for cidrs in CIDR_COUNTS {
        let mut rates = [0.0; 3];
        for (slot, mode) in [Mode::Baseline, Mode::Iptables, Mode::Masq]
            .into_iter()
            .enumerate()
        {
            let (agent, sandbox) = setup(mode, cidrs);
            rates[slot] = new_flows_per_second(&sandbox);
            eprintln!(
                "  {cidrs:>5} CIDRs, {:<20} {:>9.0} flows/s",
                mode.name(),
                rates[slot]
            );
            drop(agent);
            drop(sandbox);
        }
        let _ = writeln!(
            report,
            "| {cidrs} | {:.0} | {:.0} | {:.0} | {} | {} |",
            rates[0],
            rates[1],
            rates[2],
            ratio(rates[1], rates[0]),
            ratio(rates[2], rates[0])
        );
    }

    eprintln!("bench: throughput");
    let _ = writeln!(
        report,
        "\n### Bulk TCP throughput (one iperf3 stream, 3s, default config)\n"
    );
    let _ = writeln!(report, "| mode | Gbit/s | ratio to baseline |");
    let _ = writeln!(report, "|---|---:|---:|");
    let mut baseline = 0.0;
    for mode in [Mode::Baseline, Mode::Iptables, Mode::Masq] {
        let (agent, sandbox) = setup(mode, 3);
        let gbps = throughput_gbps(&sandbox);
        eprintln!("  {:<20} {gbps:.2} Gbit/s", mode.name());
        if mode == Mode::Baseline {
            baseline = gbps;
        }
        let _ = writeln!(
            report,
            "| {} | {gbps:.2} | {} |",
            mode.name(),
            ratio(gbps, baseline)
        );
        drop(agent);
        drop(sandbox);
    }

    eprintln!("bench: per-packet datapath cost");
    let mut harness = Harness::new();
    let egress = harness.datapath.egress().expect("egress program");
    let ingress = harness.datapath.ingress().expect("ingress program");
    let established = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_ACK | TCP_PSH)
        .payload(&[0; 1400])
        .frame();
    let syn = Packet::tcp("10.244.1.5:40000", "203.0.113.10:443", TCP_SYN).frame();
    let _ = harness.egress(&syn);
    let translated_port = harness
        .egress_mappings()
        .first()
        .map_or(0, |(_, entry)| entry.port);
    let reply = Packet::tcp(
        "203.0.113.10:443",
        &format!("192.0.2.1:{translated_port}"),
        TCP_ACK,
    )
    .payload(&[0; 1400])
    .frame();
    let exempt = Packet::tcp("10.244.1.5:40000", "10.1.2.3:443", TCP_ACK)
        .payload(&[0; 1400])
        .frame();
    let non_ip = masq_testbed::pktgen::ipv6_frame();
    let _ = writeln!(
        report,
        "\n### Datapath cost per packet (BPF_PROG_TEST_RUN, 2,000,000 repetitions)\n"
    );
    let _ = writeln!(report, "| path | ns/packet |");
    let _ = writeln!(report, "|---|---:|");
    for (path, program, frame) in [
        (
            "egress, established flow (lookup + rewrite)",
            egress,
            &established,
        ),
        (
            "egress, exempt destination (lookup miss + trie)",
            egress,
            &exempt,
        ),
        (
            "ingress, reply of a flow (lookup + rewrite)",
            ingress,
            &reply,
        ),
        ("egress, not IPv4 (parse and pass)", egress, &non_ip),
    ] {
        let nanos = program_ns(program, frame);
        eprintln!("  {path:<50} {nanos:.1} ns");
        let _ = writeln!(report, "| {path} | {nanos:.1} |");
    }
    // The trie lookup does not grow with the number of CIDRs (it grows with prefix length).
    for index in 0..5_000u32 {
        let address = Ipv4Addr::from_bits(Ipv4Addr::new(100, 64, 0, 0).to_bits() + index);
        harness.add_nomasq(
            &format!("{address}/32"),
            masq_common::layout::NOMASQ_KIND_CIDR,
        );
    }
    let egress = harness.datapath.egress().expect("egress program");
    let nanos = program_ns(egress, &exempt);
    let path = "egress, exempt destination, 5,004 CIDRs in the trie";
    eprintln!("  {path:<50} {nanos:.1} ns");
    let _ = writeln!(report, "| {path} | {nanos:.1} |");
    let _ = writeln!(
        report,
        "\nTotal run time: {:.0}s.",
        started.elapsed().as_secs_f64()
    );
    println!("{report}");
}
