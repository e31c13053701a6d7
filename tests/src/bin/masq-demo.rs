//! `cargo xtask demo`: builds a sandbox of namespaces, runs `masq agent` on the default config,
//! sends traffic, and shows what was masqueraded. Everything is removed at the end, also when
//! something fails.

#![expect(
    clippy::print_stdout,
    reason = "the demo talks to the person running it"
)]

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    process::{ExitCode, Output},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    sandbox::{CLUSTER_PEER_IP, NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions, pod_ip},
    traffic::{ping, tcp_server, tcp_transfer, udp_request, udp_server},
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn verdict(from_node: bool, seen: IpAddr) -> &'static str {
    match (from_node, seen == IpAddr::V4(NODE_IP)) {
        (true, _) => "node's own address, untouched",
        (false, true) => "masqueraded (node IP)",
        (false, false) => "kept pod IP",
    }
}

fn main() -> ExitCode {
    println!(
        r"
masq demo: ip-masq-agent's decisions, made by an eBPF datapath

  pod1 10.244.1.2 ─┐
                   ├─ node 192.0.2.1 ── router ── outside host 198.51.100.10
  pod2 10.244.2.2 ─┘   masq on up0                in-cluster peer 10.200.0.10
                       (default config: 10/8, 172.16/12, 192.168/16 and
                        link-local keep pod IPs; everything else is masqueraded)
"
    );
    let sandbox = Sandbox::new("demo", SandboxOptions::default());
    println!("sandbox ready: namespaces {}-*", sandbox.tag);
    let missing_config = format!("/tmp/{}-no-config", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &missing_config]);
    println!("masq agent running in the node namespace (no config file: upstream defaults)\n");

    let any = |port| SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port);
    let _tcp = tcp_server(&sandbox.outside, any(8080));
    let _udp = udp_server(&sandbox.outside, any(5353));

    let mut rows: Vec<(String, String, String, String)> = Vec::new();
    let mut failed = false;
    let mut record =
        |from: &str, to: String, protocol: &str, seen: Result<SocketAddr, String>| match seen {
            Ok(peer) => {
                let verdict = verdict(from.starts_with("node"), peer.ip());
                rows.push((
                    from.to_owned(),
                    to,
                    protocol.to_owned(),
                    format!("{:<22} {verdict}", peer.to_string()),
                ));
            }
            Err(error) => {
                failed = true;
                rows.push((
                    from.to_owned(),
                    to,
                    protocol.to_owned(),
                    format!("FAILED: {error}"),
                ));
            }
        };
    let outside_tcp = SocketAddrV4::new(OUTSIDE_IP, 8080);
    let outside_udp = SocketAddrV4::new(OUTSIDE_IP, 5353);
    let peer_tcp = SocketAddrV4::new(CLUSTER_PEER_IP, 8080);
    let payload = vec![42u8; 1 << 20];
    for pod in 1..=2 {
        let name = format!("pod{pod} {}", pod_ip(pod));
        let seen = sandbox
            .pod(pod)
            .enter(|| tcp_transfer(outside_tcp, "demo", &payload, TIMEOUT))
            .map(|t| t.peer);
        record(
            &name,
            outside_tcp.to_string(),
            "tcp 1 MiB",
            seen.map_err(|e| e.to_string()),
        );
        let seen = sandbox
            .pod(pod)
            .enter(|| udp_request(outside_udp, b"hello", TIMEOUT))
            .map(|(peer, _)| peer);
        record(
            &name,
            outside_udp.to_string(),
            "udp",
            seen.map_err(|e| e.to_string()),
        );
        let seen = sandbox
            .pod(pod)
            .enter(|| tcp_transfer(peer_tcp, "demo", b"hello", TIMEOUT))
            .map(|t| t.peer);
        record(
            &name,
            peer_tcp.to_string(),
            "tcp",
            seen.map_err(|e| e.to_string()),
        );
    }
    let pinged = ping(sandbox.pod(1), &OUTSIDE_IP.to_string(), 3);
    let node_seen = sandbox
        .node
        .enter(|| tcp_transfer(outside_tcp, "node", b"hi", TIMEOUT))
        .map(|t| t.peer);
    record(
        "node 192.0.2.1",
        outside_tcp.to_string(),
        "tcp (node's own)",
        node_seen.map_err(|e| e.to_string()),
    );

    println!(
        "{:<18} {:<22} {:<17} THE RECEIVER SAW",
        "FROM", "TO", "TRAFFIC"
    );
    for (from, to, protocol, seen) in &rows {
        println!("{from:<18} {to:<22} {protocol:<17} {seen}");
    }
    println!(
        "{:<18} {:<22} {:<17} {}",
        "pod1 10.244.1.2",
        OUTSIDE_IP.to_string(),
        "ping x3",
        if pinged { "all replies back" } else { "FAILED" }
    );
    failed |= !pinged;

    println!("\n$ masq explain {OUTSIDE_IP} {CLUSTER_PEER_IP} 169.254.169.254");
    let explain = agent.masq_command(&[
        "explain",
        "--config",
        &missing_config,
        &OUTSIDE_IP.to_string(),
        &CLUSTER_PEER_IP.to_string(),
        "169.254.169.254",
    ]);
    print!("{}", stdout(&explain));
    println!("\n$ masq nat list");
    print!("{}", stdout(&agent.masq(&["nat", "list"])));
    println!("\n$ masq status");
    print!("{}", stdout(&agent.masq(&["status"])));
    let errors = sandbox.checksum_errors();
    println!(
        "\nchecksum errors counted by the receivers (nstat): {}",
        if errors.is_empty() {
            "none".to_owned()
        } else {
            format!("{errors:?}")
        }
    );
    failed |= !errors.is_empty();

    drop(agent);
    drop(sandbox);
    println!("\nsandbox removed (agent uninstalled, namespaces deleted)");
    if failed {
        println!("some traffic failed; see above");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
