//! The agent over its life: ConfigMap updates, bad configs, restarts and kills in the middle of
//! traffic, metrics, uninstall, the iptables backend and taking over from it. Needs root.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    thread,
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use masq_testbed::{
    agent::Agent,
    configmap::ConfigMapVolume,
    in_both_attach_modes,
    sandbox::{
        AttachMode, CLUSTER_PEER_IP, NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions, UPLINK, pod_ip,
    },
    traffic::{
        HeldConnection, UdpFlow, fnv1a, tcp_server, tcp_source, tcp_transfer_paced, udp_server,
    },
    wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn outside(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(OUTSIDE_IP, port)
}

fn any(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)
}

fn is_node(peer: SocketAddr) -> bool {
    peer.ip() == IpAddr::V4(NODE_IP)
}

/// The source address a new TCP flow from `pod` to `destination` arrives with.
fn arrives_from(sandbox: &Sandbox, pod: usize, destination: SocketAddrV4) -> IpAddr {
    tcp_source(sandbox.pod(pod), destination, TIMEOUT)
}

fn metric(agent: &Agent, series: &str) -> f64 {
    agent.metric(series).unwrap_or(0.0)
}

/// What `masq status` says runs on the uplink's `hook`: (masq's own, how) per program.
fn uplink_programs(agent: &Agent, hook: &str) -> Vec<(bool, String)> {
    let status = agent.status();
    let uplink = status["uplinks"]
        .as_array()
        .and_then(|uplinks| uplinks.iter().find(|uplink| uplink["interface"] == UPLINK))
        .unwrap_or_else(|| panic!("{UPLINK} is not an uplink in {status}"))
        .clone();
    let hook = uplink["hooks"]
        .as_array()
        .and_then(|hooks| hooks.iter().find(|entry| entry["hook"] == hook))
        .unwrap_or_else(|| panic!("no {hook} hook in {uplink}"));
    assert!(hook["error"].is_null(), "{hook}");
    hook["programs"]
        .as_array()
        .map(|programs| {
            programs
                .iter()
                .map(|program| {
                    (
                        program["masq"] == true,
                        program["how"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that masq runs exactly once on each hook of the uplink, attached in `mode`.
fn assert_attached_once(agent: &Agent, mode: AttachMode) {
    for hook in ["egress", "ingress"] {
        let ours: Vec<String> = uplink_programs(agent, hook)
            .into_iter()
            .filter(|(masq, _)| *masq)
            .map(|(_, how)| how)
            .collect();
        let expected = match mode {
            AttachMode::Tcx => "tcx link",
            AttachMode::Tc => "tc bpf filter",
        };
        assert!(
            ours.len() == 1 && ours[0].starts_with(expected),
            "masq must run once on {hook} through a {expected}: {ours:?}"
        );
    }
}

in_both_attach_modes! {
fn a_configmap_update_reaches_new_flows_within_a_second_and_spares_live_ones(attach_mode) {
    let sandbox = Sandbox::new("cm", SandboxOptions::in_mode(attach_mode));
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    volume.update(&[(
        "ip-masq-agent",
        "nonMasqueradeCIDRs: [10.0.0.0/8]\nresyncInterval: 60s\n",
    )]);
    let config = volume.key("ip-masq-agent");
    let agent = Agent::start(&sandbox, &["--config", config.to_str().unwrap()]);
    let _server = tcp_server(&sandbox.outside, any(8080));

    let mut live = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(outside(8080), "live", None, TIMEOUT))
        .unwrap();
    assert!(is_node(live.peer));
    let reloads_before = metric(&agent, "masq_config_reloads_total{result=\"ok\"}");

    // The outside network becomes non-masquerade: the kubelet swaps ..data.
    let swapped = Instant::now();
    volume.update(&[(
        "ip-masq-agent",
        "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\nresyncInterval: 60s\n",
    )]);
    let elapsed = loop {
        if arrives_from(&sandbox, 1, outside(8080)) == IpAddr::V4(pod_ip(1)) {
            break swapped.elapsed();
        }
        assert!(
            swapped.elapsed() < Duration::from_secs(5),
            "the update never reached new flows:\n{}",
            agent.log()
        );
        thread::sleep(Duration::from_millis(20));
    };
    assert!(
        elapsed < Duration::from_secs(1),
        "the update took {elapsed:?} to reach new flows"
    );

    // The live flow keeps its translation (the remote would reset it otherwise).
    live.echo("still translated")
        .expect("the live flow lost its mapping");
    assert!(metric(&agent, "masq_config_reloads_total{result=\"ok\"}") > reloads_before);
    drop(agent);
}
}

in_both_attach_modes! {
fn restarting_or_killing_the_agent_loses_no_flow(attach_mode) {
    let sandbox = Sandbox::new("rst", SandboxOptions::in_mode(attach_mode));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let mut agent = Agent::start(&sandbox, &["--config", &absent]);
    let _tcp = tcp_server(&sandbox.outside, any(8080));
    let _udp = udp_server(&sandbox.outside, any(5353));

    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(outside(8080), "held", None, TIMEOUT))
        .unwrap();
    let udp = sandbox
        .pod(2)
        .enter(|| UdpFlow::open(outside(5353), TIMEOUT))
        .unwrap();
    let udp_peer = udp.request(b"first").unwrap();
    assert!(is_node(held.peer) && is_node(udp_peer));
    assert_attached_once(&agent, attach_mode);

    // A transfer paced over several seconds, across the restarts below.
    let data: Vec<u8> = (0..6_000_000u32).map(|index| (index % 251) as u8).collect();
    let expected = (data.len(), fnv1a(&data));
    let bulk = sandbox.pod(1).spawn(move || {
        tcp_transfer_paced(
            outside(8080),
            "bulk",
            &data,
            64 * 1024,
            Duration::from_millis(40),
            Duration::from_secs(30),
        )
    });
    thread::sleep(Duration::from_millis(500));

    // SIGTERM: the agent exits cleanly, the datapath keeps translating without it.
    let status = agent.terminate();
    assert!(status.success(), "the agent exited with {status}");
    held.echo("while stopped")
        .expect("held flow broken while the agent was stopped");
    assert_eq!(udp.request(b"while stopped").unwrap(), udp_peer);
    agent.restart();
    assert!(
        agent.log().contains("adopted the pinned maps"),
        "{}",
        agent.log()
    );

    // The new agent sees the old flows.
    let listed = agent.masq(&["nat", "list", "--pod", "10.244.1.2", "--output", "json"]);
    let flows: Vec<serde_json::Value> =
        serde_json::from_slice(&listed.stdout).expect("nat list json");
    let translated = SocketAddrV4::new(NODE_IP, held.peer.port()).to_string();
    assert!(
        flows
            .iter()
            .any(|flow| flow["translated"] == translated.as_str()),
        "{flows:?}"
    );

    // SIGKILL in the middle of traffic.
    agent.kill();
    held.echo("while killed")
        .expect("held flow broken while the agent was dead");
    assert_eq!(
        udp.request(b"while killed").unwrap(),
        udp_peer,
        "the UDP flow changed its port"
    );
    agent.restart();
    held.echo("after restart")
        .expect("held flow broken after the restart");
    assert_eq!(udp.request(b"after restart").unwrap(), udp_peer);
    // The restarted agents replaced the programs in place: one of masq's per hook, still.
    assert_attached_once(&agent, attach_mode);

    let transfer = bulk
        .join()
        .expect("bulk thread")
        .expect("bulk transfer across restarts");
    assert_eq!(
        (transfer.bytes, transfer.hash),
        expected,
        "the transfer was damaged"
    );
    assert!(is_node(transfer.peer));
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}
}

in_both_attach_modes! {
fn bad_configs_never_change_the_datapath(attach_mode) {
    let sandbox = Sandbox::new("bad", SandboxOptions::in_mode(attach_mode));
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    let good = "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.20/32]\n";
    volume.update(&[("ip-masq-agent", good)]);
    let config = volume.key("ip-masq-agent");
    let agent = Agent::start(&sandbox, &["--config", config.to_str().unwrap()]);
    let _server = tcp_server(&sandbox.outside, any(8080));
    let trie_before = agent.status()["nomasq_cidrs"].clone();
    assert_eq!(
        trie_before.as_array().map(Vec::len),
        Some(3),
        "{trie_before}"
    );

    let bad_configs = [
        ("garbage", "*"),
        ("empty", ""),
        (
            "half-written YAML",
            "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 198.51.",
        ),
        (
            "half-written JSON",
            "{\"nonMasqueradeCIDRs\": [\"10.0.0.0/8\"",
        ),
        (
            "over the limit",
            "cidrLimit: 1\nnonMasqueradeCIDRs: [10.0.0.0/8, 1.0.0.0/8]\n",
        ),
    ];
    for (what, contents) in bad_configs {
        let failed = metric(&agent, "masq_config_reloads_total{result=\"failed\"}");
        volume.update(&[("ip-masq-agent", contents)]);
        wait_for(
            &format!("the {what} config to be rejected"),
            Duration::from_secs(3),
            || metric(&agent, "masq_config_reloads_total{result=\"failed\"}") > failed,
        );
        assert_eq!(
            agent.status()["nomasq_cidrs"],
            trie_before,
            "a {what} config changed the trie"
        );
        let (_, page) = agent.http_get("/metrics").expect("metrics");
        assert!(
            page.contains("masq_config_last_error{reason="),
            "no error reported for the {what} config"
        );
        let (ready, _) = agent.http_get("/readyz").expect("readyz");
        assert!(
            ready.contains(" 200 "),
            "the last good config stays in force: {ready}"
        );
    }
    assert_eq!(
        arrives_from(&sandbox, 1, SocketAddrV4::new(CLUSTER_PEER_IP, 8080)),
        IpAddr::V4(pod_ip(1))
    );

    let ok = metric(&agent, "masq_config_reloads_total{result=\"ok\"}");
    volume.update(&[("ip-masq-agent", "nonMasqueradeCIDRs: [10.0.0.0/8]\n")]);
    wait_for("a good config to load", Duration::from_secs(3), || {
        metric(&agent, "masq_config_reloads_total{result=\"ok\"}") > ok
    });
    assert_eq!(
        agent.status()["nomasq_cidrs"].as_array().map(Vec::len),
        Some(2)
    );
    let (_, page) = agent.http_get("/metrics").expect("metrics");
    assert!(
        !page.contains("masq_config_last_error{reason="),
        "a successful load clears the error"
    );
}
}

in_both_attach_modes! {
fn an_agent_without_a_valid_config_translates_nothing_until_it_gets_one(attach_mode) {
    let sandbox = Sandbox::new("nocfg", SandboxOptions::in_mode(attach_mode));
    let dir = std::env::temp_dir().join(format!("{}-cfg", sandbox.tag));
    fs::create_dir_all(&dir).unwrap();
    let config = dir.join("ip-masq-agent");
    fs::write(&config, "nonMasqueradeCIDRs: [not-a-cidr]\n").unwrap();
    let _server = tcp_server(&sandbox.outside, any(8080));
    let agent = Agent::launch(&sandbox, &["--config", config.to_str().unwrap()]);
    agent.wait_serving();
    let (ready, body) = agent.http_get("/readyz").expect("readyz");
    assert!(
        ready.contains(" 503 ") && body.contains("could not be parsed"),
        "{ready} {body}"
    );
    assert_eq!(metric(&agent, "masq_ready"), 0.0);
    assert!(metric(&agent, "masq_config_reloads_total{result=\"failed\"}") >= 1.0);
    // Like upstream with no rules written: nothing is masqueraded.
    assert_eq!(
        arrives_from(&sandbox, 1, outside(8080)),
        IpAddr::V4(pod_ip(1))
    );

    fs::write(&config, "nonMasqueradeCIDRs: [10.0.0.0/8]\n").unwrap();
    wait_for("the agent to become ready", Duration::from_secs(3), || {
        agent
            .http_get("/readyz")
            .is_some_and(|(status, _)| status.contains(" 200 "))
    });
    assert!(is_node(SocketAddr::new(
        arrives_from(&sandbox, 1, outside(8080)),
        0
    )));
    drop(agent);
    let _ = fs::remove_dir_all(dir);
}
}

/// Parses the Prometheus text format strictly enough to catch malformed output.
fn parse_exposition(page: &str) -> Vec<(String, f64)> {
    let mut samples = Vec::new();
    let mut typed = std::collections::HashSet::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let name = words.next().unwrap().to_owned();
            assert!(
                matches!(words.next(), Some("counter" | "gauge" | "histogram")),
                "{line}"
            );
            assert!(typed.insert(name), "type declared twice: {line}");
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        assert!(!line.starts_with('#'), "unknown comment: {line}");
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name: {line}"
        );
        if let Some(labels) = series.strip_prefix(name)
            && !labels.is_empty()
        {
            assert!(
                labels.starts_with('{') && labels.ends_with('}'),
                "bad labels: {line}"
            );
        }
        let base = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_sum")
            .trim_end_matches("_count");
        assert!(
            typed.contains(name) || typed.contains(base),
            "sample before its TYPE: {line}"
        );
        samples.push((series.to_owned(), value));
    }
    samples
}

in_both_attach_modes! {
fn metrics_and_health_are_served(attach_mode) {
    let sandbox = Sandbox::new("met", SandboxOptions::in_mode(attach_mode));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent]);
    let _server = tcp_server(&sandbox.outside, any(8080));
    for _ in 0..5 {
        assert!(is_node(SocketAddr::new(
            arrives_from(&sandbox, 1, outside(8080)),
            0
        )));
    }
    // The table gauges come from the garbage collector, which runs every second here.
    thread::sleep(Duration::from_millis(1500));
    let (status, page) = agent.http_get("/metrics").expect("metrics");
    assert!(status.contains(" 200 "));
    let samples = parse_exposition(&page);
    let value = |series: &str| {
        samples
            .iter()
            .find(|(name, _)| name == series)
            .map(|(_, value)| *value)
    };
    assert_eq!(value("masq_ready"), Some(1.0));
    assert!(
        samples
            .iter()
            .any(|(name, _)| name.starts_with("masq_build_info{"))
    );
    assert!(value("masq_datapath_packets_total{outcome=\"egress_new_mapping\",family=\"ipv4\"}") >= Some(5.0));
    assert!(value("masq_datapath_packets_total{outcome=\"ingress_reverse_nat\",family=\"ipv4\"}") >= Some(5.0));
    assert!(value("masq_port_allocation_attempts_count") >= Some(5.0));
    // Sized from the node's memory by default, like the kernel's conntrack table.
    let memory = masq::node::memory::total_memory().unwrap();
    let capacity = masq::node::memory::nat_entries_for(memory);
    assert_eq!(value("masq_nat_capacity_entries{family=\"ipv4\"}"), Some(f64::from(capacity)));
    assert!(value("masq_nat_flows{family=\"ipv4\"}") >= Some(5.0), "{page}");
    assert_eq!(value("masq_config_cidrs{family=\"ipv4\"}"), Some(3.0));
    assert_eq!(value("masq_nomasq_trie_entries"), Some(4.0));
    assert!(value("masq_config_reloads_total{result=\"ok\"}") >= Some(1.0));

    // The pinned maps carry BTF: bpftool prints named fields.
    let nat_pin = agent.pin_path().join("masq_nat_v4");
    let dump = sandbox.node.exec(
        "bpftool",
        &["--json", "map", "dump", "pinned", nat_pin.to_str().unwrap()],
    );
    let dump: serde_json::Value = serde_json::from_slice(&dump.stdout).expect("bpftool json");
    let first = &dump[0]["formatted"];
    assert!(
        first["key"]["src_addr"].is_array() && first["value"]["last_seen_ns"].is_u64(),
        "{dump}"
    );

    assert_eq!(
        agent
            .http_get("/healthz")
            .map(|(status, body)| (status.contains(" 200 "), body)),
        Some((true, "ok\n".to_owned()))
    );
    assert!(
        agent
            .http_get("/readyz")
            .is_some_and(|(status, _)| status.contains(" 200 "))
    );
    assert!(
        agent
            .http_get("/nope")
            .is_some_and(|(status, _)| status.contains(" 404 "))
    );
}
}

in_both_attach_modes! {
fn uninstall_leaves_no_pin_link_or_sysctl_behind(attach_mode) {
    let sandbox = Sandbox::new("uni", SandboxOptions::in_mode(attach_mode));
    // A reservation the operator made before masq: it must survive the uninstall.
    sandbox
        .node
        .sysctl("net.ipv4.ip_local_reserved_ports", "8080");
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let reserved = |sandbox: &Sandbox| {
        let output = sandbox
            .node
            .exec("cat", &["/proc/sys/net/ipv4/ip_local_reserved_ports"]);
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    // Ports shared with the node (no --to-ports) are not reserved.
    let mut agent = Agent::start(&sandbox, &["--config", &absent]);
    assert_eq!(reserved(&sandbox), "8080");
    agent.kill();
    // --to-ports makes them masq's alone: reserved, and recorded for the uninstall.
    agent.relaunch(&["--config", &absent, "--to-ports", "1024-29999"]);
    agent.wait_ready();
    let _server = tcp_server(&sandbox.outside, any(8080));
    assert!(is_node(SocketAddr::new(
        arrives_from(&sandbox, 1, outside(8080)),
        0
    )));
    assert_eq!(reserved(&sandbox), "1024-29999");
    // Back to shared ports: the reservation masq made is given back, the operator's stays.
    agent.kill();
    agent.relaunch(&["--config", &absent]);
    agent.wait_ready();
    assert_eq!(reserved(&sandbox), "8080");
    agent.kill();
    agent.relaunch(&["--config", &absent, "--to-ports", "1024-29999"]);
    agent.wait_ready();
    assert_eq!(reserved(&sandbox), "1024-29999");

    agent.kill();
    let output = agent.masq(&["uninstall"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!agent.pin_path().exists(), "pins left behind");
    assert_eq!(
        reserved(&sandbox),
        "8080",
        "the reservation was not undone exactly"
    );
    let attached = sandbox.node.enter(|| {
        [TcAttachType::Egress, TcAttachType::Ingress].map(|hook| {
            SchedClassifier::query_tcx(UPLINK, hook)
                .map(|(_, programs)| programs.len())
                .unwrap_or(usize::MAX)
        })
    });
    assert_eq!(attached, [0, 0], "programs still attached to the uplink");
    // masq created the clsact qdisc in tc mode, and nothing else uses it: it goes too.
    assert!(
        !sandbox.node.has_clsact(UPLINK),
        "the clsact qdisc masq created is left behind"
    );
    assert_eq!(
        arrives_from(&sandbox, 1, outside(8080)),
        IpAddr::V4(pod_ip(1)),
        "traffic is still translated"
    );
}
}

in_both_attach_modes! {
fn the_iptables_backend_masquerades_the_same_destinations_and_ebpf_takes_over(attach_mode) {
    let sandbox = Sandbox::new("ipt", SandboxOptions::in_mode(attach_mode));
    sandbox
        .outside
        .ip(&["addr", "add", "198.51.100.20/32", "dev", "eth0"]);
    let dir = std::env::temp_dir().join(format!("{}-cfg", sandbox.tag));
    fs::create_dir_all(&dir).unwrap();
    let config = dir.join("ip-masq-agent");
    fs::write(
        &config,
        "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.20/32]\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_owned();
    let _server = tcp_server(&sandbox.outside, any(8080));
    let destinations = [
        outside(8080),
        SocketAddrV4::new("198.51.100.20".parse().unwrap(), 8080),
        SocketAddrV4::new(CLUSTER_PEER_IP, 8080),
    ];
    let observe =
        |sandbox: &Sandbox| destinations.map(|destination| arrives_from(sandbox, 1, destination));

    let mut agent = Agent::start(&sandbox, &["--config", &config, "--backend", "iptables"]);
    let with_iptables = observe(&sandbox);
    let rules =
        String::from_utf8_lossy(&sandbox.node.exec("iptables", &["-t", "nat", "-S"]).stdout)
            .into_owned();
    assert!(
        rules.contains("-A IP-MASQ-AGENT -d 198.51.100.20/32"),
        "{rules}"
    );
    assert!(rules.contains("-j MASQUERADE --random-fully"), "{rules}");
    assert_eq!(agent.terminate().code(), Some(0));

    // The eBPF backend refuses to masquerade on top of the chain...
    agent.relaunch(&["--config", &config]);
    let status = agent
        .wait_exit(Duration::from_secs(10))
        .expect("the agent should refuse to start");
    assert!(!status.success());
    assert!(
        agent.log().contains("--take-over-iptables"),
        "{}",
        agent.log()
    );

    // ...until told to take over.
    agent.relaunch(&["--config", &config, "--take-over-iptables"]);
    agent.wait_ready();
    let rules =
        String::from_utf8_lossy(&sandbox.node.exec("iptables", &["-t", "nat", "-S"]).stdout)
            .into_owned();
    assert!(
        !rules.contains("IP-MASQ-AGENT"),
        "the chain survived the take-over: {rules}"
    );
    let with_ebpf = observe(&sandbox);

    let node = IpAddr::V4(NODE_IP);
    let pod = IpAddr::V4(pod_ip(1));
    assert_eq!(with_iptables, [node, pod, pod]);
    assert_eq!(with_ebpf, with_iptables, "the backends disagree");
    drop(agent);
    let _ = fs::remove_dir_all(dir);
}
}

/// Replaces the agent's pinned map `name` by an empty one of `map_type` with the given key and
/// value sizes and 3 entries, as an older masq would have pinned it.
fn replace_pinned_map(agent: &Agent, name: &str, map_type: &str, key: u32, value: u32) {
    let pin = agent.pin_path().join(name);
    fs::remove_file(&pin).unwrap();
    let (key, value) = (key.to_string(), value.to_string());
    let created = std::process::Command::new("bpftool")
        .args(["map", "create", pin.to_str().unwrap(), "type", map_type])
        .args(["key", &key, "value", &value, "entries", "3", "name", name])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
}

in_both_attach_modes! {
fn incompatible_pinned_state_is_refused_unless_replacement_is_requested(attach_mode) {
    let sandbox = Sandbox::new("inc", SandboxOptions::in_mode(attach_mode));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let mut agent = Agent::start(&sandbox, &["--config", &absent]);
    agent.kill();
    // Pretend an older masq pinned a fragment table of another size: a map whose shape the
    // programs depend on.
    replace_pinned_map(&agent, "masq_frags_v4", "lru_hash", 16, 16);

    agent.relaunch(&["--config", &absent]);
    let status = agent
        .wait_exit(Duration::from_secs(10))
        .expect("the agent should refuse the pins");
    assert!(!status.success());
    let log = agent.log();
    assert!(
        log.contains("incompatible layout") && log.contains("masq_frags_v4 holds 3 entries"),
        "{log}"
    );

    agent.relaunch(&["--config", &absent, "--replace-incompatible-state"]);
    agent.wait_ready();
    let _server = tcp_server(&sandbox.outside, any(8080));
    assert!(is_node(SocketAddr::new(
        arrives_from(&sandbox, 1, outside(8080)),
        0
    )));
}
}

in_both_attach_modes! {
fn datapath_debug_logs_are_off_by_default_and_reach_the_agent_log_when_asked(attach_mode) {
    let sandbox = Sandbox::new("dbg", SandboxOptions::in_mode(attach_mode));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let _server = tcp_server(&sandbox.outside, any(8080));
    let mut agent = Agent::start(&sandbox, &["--config", &absent, "--log-level", "debug"]);
    assert!(is_node(SocketAddr::new(
        arrives_from(&sandbox, 1, outside(8080)),
        0
    )));
    assert!(
        !agent.log().contains("new mapping"),
        "per-packet records without --datapath-debug-log"
    );

    agent.relaunch(&[
        "--config",
        &absent,
        "--log-level",
        "debug",
        "--datapath-debug-log",
    ]);
    agent.wait_ready();
    assert!(is_node(SocketAddr::new(
        arrives_from(&sandbox, 1, outside(8080)),
        0
    )));
    wait_for("a datapath debug record", Duration::from_secs(3), || {
        agent.log().contains("new mapping proto 6 10.244.1.2:")
    });
}
}

in_both_attach_modes! {
/// `masq status` names everything that runs on the uplink, masq's own and others', and uninstall
/// removes masq's part only: another program's tc filter, and the qdisc it needs, stay.
fn status_shows_what_runs_on_the_uplink_and_uninstall_leaves_other_programs_alone(attach_mode) {
    let sandbox = Sandbox::new("own", SandboxOptions::in_mode(attach_mode));
    // Another agent's filter (a CNI's, say), there before masq.
    sandbox.node.exec("tc", &["qdisc", "add", "dev", UPLINK, "clsact"]);
    sandbox.node.exec(
        "tc",
        &["filter", "add", "dev", UPLINK, "egress", "pref", "7", "u32", "match", "u32", "0", "0"],
    );
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let mut agent = Agent::start(&sandbox, &["--config", &absent]);
    let _server = tcp_server(&sandbox.outside, any(8080));
    assert!(is_node(SocketAddr::new(arrives_from(&sandbox, 1, outside(8080)), 0)));
    assert_attached_once(&agent, attach_mode);
    let egress = uplink_programs(&agent, "egress");
    assert!(
        egress
            .iter()
            .any(|(masq, how)| !masq && how.starts_with("tc u32 filter prio 7")),
        "the other filter is not shown: {egress:?}"
    );
    // masq runs first, so no program that ends the chain (or the filter walk) bypasses it.
    assert!(egress.first().is_some_and(|(masq, _)| *masq), "{egress:?}");
    let text = agent.masq(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("uplink:       {UPLINK} (index"))
            && text.contains(&format!("attached with {}", attach_mode.flag())),
        "{text}"
    );

    agent.kill();
    let output = agent.masq(&["uninstall"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for hook in ["egress", "ingress"] {
        let left = sandbox.node.tc_filters(UPLINK, hook);
        assert!(
            left.iter().all(|filter| !filter.contains("masq_")),
            "masq's filter survived the uninstall: {left:?}"
        );
    }
    let egress = sandbox.node.tc_filters(UPLINK, "egress");
    assert!(
        egress.iter().any(|filter| filter.contains("pref 7 u32")),
        "uninstall removed a filter masq did not add: {egress:?}"
    );
    assert!(sandbox.node.has_clsact(UPLINK), "uninstall removed a qdisc masq did not add");
    assert_eq!(
        arrives_from(&sandbox, 1, outside(8080)),
        IpAddr::V4(pod_ip(1)),
        "traffic is still translated"
    );
}
}
