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
    net::Ipv4Addr,
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

/// CIDR counts the new-flow rate is measured at.
const CIDR_COUNTS: [usize; 3] = [3, 1_000, 5_000];
/// New flows per measurement: well inside both conntrack's and masq's table sizes.
const FLOWS: u64 = 100_000;
/// Flows the established-flow measurement cycles through.
const ESTABLISHED_FLOWS: u64 = 100;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Baseline,
    /// iptables with the nf_tables backend (Debian's default).
    Iptables,
    /// iptables-legacy (x_tables), what many Kubernetes node images still run.
    IptablesLegacy,
    Masq,
}

impl Mode {
    const fn name(self) -> &'static str {
        match self {
            Self::Baseline => "no NAT (baseline)",
            Self::Iptables => "iptables-nft MASQUERADE",
            Self::IptablesLegacy => "iptables-legacy MASQUERADE",
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
        Mode::IptablesLegacy => {
            // The agent runs `iptables` and `iptables-restore` from PATH.
            let bin = std::env::temp_dir().join("masq-bench-legacy-bin");
            let _ = fs::create_dir_all(&bin);
            for (name, target) in [
                ("iptables", "/usr/sbin/iptables-legacy"),
                ("iptables-restore", "/usr/sbin/iptables-legacy-restore"),
            ] {
                let _ = fs::remove_file(bin.join(name));
                std::os::unix::fs::symlink(target, bin.join(name)).expect("legacy symlink");
            }
            let path = format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            );
            let args = ["--config", config.as_str(), "--backend", "iptables"];
            Some(Agent::start_with_env(&sandbox, &args, &[("PATH", &path)]))
        }
        Mode::Masq => Some(Agent::start(&sandbox, &["--config", &config])),
    };
    (agent, sandbox)
}

/// The MAC address of `device` in `netns`.
fn mac(netns: &masq_testbed::netns::Netns, device: &str) -> [u8; 6] {
    let output = netns.ip(&["-j", "link", "show", device]);
    let links: serde_json::Value = serde_json::from_slice(&output.stdout).expect("ip -j link");
    let text = links[0]["address"]
        .as_str()
        .expect("link address")
        .to_owned();
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(text.split(':')) {
        *byte = u8::from_str_radix(part, 16).expect("mac byte");
    }
    mac
}

/// Packets the outside host received so far.
fn received(sandbox: &Sandbox) -> u64 {
    let output = sandbox.outside.ip(&["-j", "-s", "link", "show", "eth0"]);
    let links: serde_json::Value = serde_json::from_slice(&output.stdout).expect("ip -j -s link");
    links[0]["stats64"]["rx"]["packets"].as_u64().unwrap_or(0)
}

/// UDP frames from pod 1 to the outside host for the given port pairs, ready for a raw socket.
fn frames(sandbox: &Sandbox, ports: impl Iterator<Item = (u64, u64)>) -> Vec<Vec<u8>> {
    let source = mac(sandbox.pod(1), "eth0");
    let gateway = mac(&sandbox.node, "vpod1");
    ports
        .map(|(source_port, destination_port)| {
            let mut frame = Packet::udp(
                &format!("10.244.1.2:{source_port}"),
                &format!("{OUTSIDE_IP}:{destination_port}"),
            )
            .payload(b"masq bench")
            .frame();
            frame[0..6].copy_from_slice(&gateway);
            frame[6..12].copy_from_slice(&source);
            frame
        })
        .collect()
}

/// Sends `frames` from pod 1 through a raw socket as fast as the path takes them and returns
/// how many per second reached the outside host. No sockets, handshakes or replies are
/// involved: what differs between modes is the datapath's work.
fn blast(sandbox: &Sandbox, frames: Vec<Vec<u8>>) -> f64 {
    let count = frames.len() as u64;
    let before = received(sandbox);
    let elapsed = sandbox.pod(1).enter(move || {
        // SAFETY: plain socket creation; the descriptor is closed below.
        let socket = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        assert!(
            socket >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let index = nix::net::if_::if_nametoindex("eth0").expect("eth0 index");
        // SAFETY: sockaddr_ll is plain data; zero is a valid starting value.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_ifindex = i32::try_from(index).expect("ifindex");
        address.sll_protocol = 0x0800u16.to_be();
        // SAFETY: `address` is a valid sockaddr_ll of the size passed.
        let bound = unsafe {
            libc::bind(
                socket,
                std::ptr::from_ref(&address).cast(),
                size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(
            bound,
            0,
            "binding the raw socket: {}",
            std::io::Error::last_os_error()
        );
        let started = Instant::now();
        for frame in &frames {
            // SAFETY: the buffer is valid for its length; a failed send is simply not counted.
            unsafe { libc::send(socket, frame.as_ptr().cast(), frame.len(), 0) };
        }
        let elapsed = started.elapsed();
        // SAFETY: closing the descriptor opened above.
        unsafe { libc::close(socket) };
        elapsed
    });
    // Let the last packets land before counting.
    thread::sleep(Duration::from_millis(300));
    let arrived = received(sandbox).saturating_sub(before);
    if arrived < count * 9 / 10 {
        eprintln!("    only {arrived} of {count} packets arrived");
    }
    arrived as f64 / elapsed.as_secs_f64()
}

/// New flows per second: [`FLOWS`] packets, each with its own port pair, so each is a new
/// conntrack entry or masq mapping.
fn new_flows_per_second(sandbox: &Sandbox) -> f64 {
    blast(
        sandbox,
        frames(
            sandbox,
            (0..FLOWS).map(|index| (1024 + index % 400, 1 + index / 400)),
        ),
    )
}

/// Packets per second of [`ESTABLISHED_FLOWS`] flows that already exist.
fn established_packets_per_second(sandbox: &Sandbox) -> f64 {
    let ports = |count: u64| (0..count).map(|index| (2000 + index % ESTABLISHED_FLOWS, 9));
    blast(sandbox, frames(sandbox, ports(ESTABLISHED_FLOWS)));
    blast(sandbox, frames(sandbox, ports(FLOWS * 2)))
}

/// Bulk TCP throughput from a pod to the outside host with iperf3, in Gbit/s.
fn throughput_gbps(sandbox: &Sandbox) -> f64 {
    let mut server = sandbox
        .outside
        .command("iperf3")
        .args(["-s", "-1", "-p", "5201"])
        .stdout(std::process::Stdio::null())
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
        "### New flows per second ({FLOWS} UDP packets, each a new flow, from a pod to the outside host)\n"
    );
    let modes = [
        Mode::Baseline,
        Mode::Iptables,
        Mode::IptablesLegacy,
        Mode::Masq,
    ];
    let _ = writeln!(
        report,
        "| non-masquerade CIDRs | {} | iptables-nft / baseline | iptables-legacy / baseline | masq / baseline |",
        modes.map(Mode::name).join(" | ")
    );
    let _ = writeln!(report, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for cidrs in CIDR_COUNTS {
        let mut rates = [0.0; 4];
        for (slot, mode) in modes.into_iter().enumerate() {
            let (agent, sandbox) = setup(mode, cidrs);
            rates[slot] = new_flows_per_second(&sandbox);
            eprintln!(
                "  {cidrs:>5} CIDRs, {:<28} {:>9.0} flows/s",
                mode.name(),
                rates[slot]
            );
            drop(agent);
            drop(sandbox);
        }
        let _ = writeln!(
            report,
            "| {cidrs} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            rates[0],
            rates[1],
            rates[2],
            rates[3],
            ratio(rates[1], rates[0]),
            ratio(rates[2], rates[0]),
            ratio(rates[3], rates[0])
        );
    }

    eprintln!("bench: established flows");
    let _ = writeln!(
        report,
        "\n### Packets per second of established flows ({} UDP packets over {ESTABLISHED_FLOWS} flows, default config)\n",
        FLOWS * 2
    );
    let _ = writeln!(report, "| mode | packets/s | ratio to baseline |");
    let _ = writeln!(report, "|---|---:|---:|");
    let mut baseline_pps = 0.0;
    for mode in modes {
        let (agent, sandbox) = setup(mode, 3);
        let pps = established_packets_per_second(&sandbox);
        eprintln!("  {:<28} {pps:>9.0} packets/s", mode.name());
        if mode == Mode::Baseline {
            baseline_pps = pps;
        }
        let _ = writeln!(
            report,
            "| {} | {pps:.0} | {} |",
            mode.name(),
            ratio(pps, baseline_pps)
        );
        drop(agent);
        drop(sandbox);
    }

    eprintln!("bench: throughput");
    let _ = writeln!(
        report,
        "\n### Bulk TCP throughput (one iperf3 stream, 3s, default config)\n"
    );
    let _ = writeln!(report, "| mode | Gbit/s | ratio to baseline |");
    let _ = writeln!(report, "|---|---:|---:|");
    let mut baseline = 0.0;
    for mode in [
        Mode::Baseline,
        Mode::Iptables,
        Mode::IptablesLegacy,
        Mode::Masq,
    ] {
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
