//! An operator's bad day: the agent killed while it installs, two agents on one pin path, a
//! metrics port in use, bad flags, oversized and odd config files, configs the datapath cannot
//! hold. Each ends with the datapath matching the config in force and the next start working.

#![expect(
    clippy::expect_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    thread,
    time::Duration,
};

use masq_testbed::{
    agent::{Agent, METRICS_ADDR},
    sandbox::{NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions},
    traffic::{tcp_server, tcp_source},
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn arrives_from(sandbox: &Sandbox, destination: Ipv4Addr) -> IpAddr {
    tcp_source(
        sandbox.pod(1),
        SocketAddrV4::new(destination, 8080),
        TIMEOUT,
    )
}

fn reserved_ports(sandbox: &Sandbox) -> String {
    let output = sandbox
        .node
        .exec("cat", &["/proc/sys/net/ipv4/ip_local_reserved_ports"]);
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The sibling directory a fresh map set is staged in before it is published.
fn staging(agent: &Agent) -> std::path::PathBuf {
    let pins = agent.pin_path();
    let name = pins
        .file_name()
        .expect("pin path has a name")
        .to_string_lossy();
    pins.with_file_name(format!("{name}-staging"))
}

#[test]
fn a_kill_at_any_instant_of_the_first_start_never_blocks_the_next() {
    let sandbox = Sandbox::new("crash", SandboxOptions::default());
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let args = ["--config", absent.as_str()];
    // From before the process has done anything to well after a first start completes.
    for delay_ms in [0, 5, 15, 30, 45, 60, 80, 100, 130, 160, 200, 250, 320, 400] {
        let mut agent = Agent::launch(&sandbox, &args);
        thread::sleep(Duration::from_millis(delay_ms));
        agent.kill();
        // The next start finds either nothing, leftovers it removes, or a complete datapath.
        agent.restart();
        assert!(
            !agent.log().contains("incompatible layout"),
            "killed after {delay_ms} ms, the next start refused:\n{}",
            agent.log()
        );
        assert_eq!(
            arrives_from(&sandbox, OUTSIDE_IP),
            IpAddr::V4(NODE_IP),
            "killed after {delay_ms} ms, the next start does not translate"
        );
        assert!(
            !staging(&agent).exists(),
            "killed after {delay_ms} ms: staged maps left after a complete start"
        );
        agent.kill();
        let output = agent.masq(&["uninstall"]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!agent.pin_path().exists() && !staging(&agent).exists());
    }
}

#[test]
fn a_second_agent_on_the_same_pin_path_is_refused_and_the_first_keeps_running() {
    let sandbox = Sandbox::new("lock", SandboxOptions::default());
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let first = Agent::start(&sandbox, &["--config", &absent]);
    let links_before = first.status()["uplinks"].clone();

    let pin_path = first.pin_path().to_string_lossy().into_owned();
    let output = first.masq_command(&[
        "agent",
        "--interface",
        "up0",
        "--config",
        &absent,
        "--pin-path",
        &pin_path,
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the second agent started");
    assert!(
        stderr.contains("another masq agent is running with the pin path"),
        "{stderr}"
    );
    assert_eq!(
        first.status()["uplinks"],
        links_before,
        "the second agent changed the first one's attachment"
    );
    assert_eq!(arrives_from(&sandbox, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    let (status, _) = first.http_get("/readyz").expect("readyz");
    assert!(status.contains(" 200 "), "{status}");
}

#[test]
fn a_metrics_port_in_use_or_a_bad_flag_stops_the_agent_before_it_changes_anything() {
    let sandbox = Sandbox::new("port", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let probe = Agent::unstarted(&sandbox);
    let reserved_before = reserved_ports(&sandbox);
    let pin_path = probe.pin_path().to_string_lossy().into_owned();

    // Someone else serves on the metrics address.
    let _occupant = sandbox.node.spawn(|| {
        let listener = std::net::TcpListener::bind(METRICS_ADDR).expect("bind");
        thread::sleep(Duration::from_secs(5));
        drop(listener);
    });
    thread::sleep(Duration::from_millis(200));
    let cases: [(&[&str], &str); 3] = [
        (&["--metrics-addr", METRICS_ADDR], "serving metrics on"),
        (&["--nat-max-entries", "0"], "--nat-max-entries"),
        (&["--nat-max-entries", "1"], "--nat-max-entries"),
    ];
    for (extra, expected) in cases {
        let mut args = vec![
            "agent",
            "--interface",
            "up0",
            "--config",
            &absent,
            "--pin-path",
            &pin_path,
        ];
        args.extend_from_slice(extra);
        let output = probe.masq_command(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} started");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!probe.pin_path().exists(), "{args:?} left pins");
        assert!(!staging(&probe).exists(), "{args:?} left staged maps");
        assert_eq!(
            reserved_ports(&sandbox),
            reserved_before,
            "{args:?} reserved ports"
        );
        let attached = sandbox.node.tc_filters("up0", "egress");
        assert!(attached.is_empty(), "{args:?} attached: {attached:?}");
    }
    let _ = fs::remove_file(&absent);
}

#[test]
fn a_config_the_trie_cannot_hold_is_rejected_whole_and_the_datapath_keeps_the_one_in_force() {
    let sandbox = Sandbox::new("cap", SandboxOptions::default());
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let dir = std::env::temp_dir().join(format!("{}-config", sandbox.tag));
    fs::create_dir_all(&dir).expect("config dir");
    let config = dir.join("ip-masq-agent");
    let write = |cidrs: &[&str]| {
        let text = format!(
            "cidrLimit: 1000\nnonMasqueradeCIDRs: [{}]\nresyncInterval: 1s\n",
            cidrs.join(", ")
        );
        // A rename, as the kubelet swaps ConfigMaps: never a half-written file.
        let temporary = dir.join("next");
        fs::write(&temporary, text).expect("write config");
        fs::rename(&temporary, &config).expect("swap config");
    };
    let defaults = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];
    write(&defaults);
    let config_arg = config.to_string_lossy().into_owned();
    let agent = Agent::start(
        &sandbox,
        &["--config", &config_arg, "--nomasq-max-entries", "8"],
    );
    let trie = || agent.status()["nomasq_cidrs"].clone();
    let in_force = trie();
    assert_eq!(arrives_from(&sandbox, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    let failed = || agent.metric("masq_config_reloads_total{result=\"failed\"}");
    let failed_before = failed().unwrap_or(0.0);

    // Eight CIDRs, one of them the outside host's network, plus link-local: nine entries.
    let too_many = [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "192.0.0.0/24",
        "240.0.0.0/4",
    ];
    write(&too_many);
    masq_testbed::wait_for("the rejection", Duration::from_secs(5), || {
        failed().unwrap_or(0.0) > failed_before
    });
    assert!(
        agent.log().contains("raise --nomasq-max-entries"),
        "{}",
        agent.log()
    );
    assert_eq!(trie(), in_force, "a rejected config changed the trie");
    assert_eq!(
        arrives_from(&sandbox, OUTSIDE_IP),
        IpAddr::V4(NODE_IP),
        "the datapath exempts a destination the config in force masquerades"
    );
    let (status, _) = agent.http_get("/readyz").expect("readyz");
    assert!(
        status.contains(" 200 "),
        "the config in force is still applied: {status}"
    );

    // check-config says the same, naming the flag; it accepts the config with room for it.
    let check = |extra: &[&str]| {
        let mut args = vec!["check-config", "--config", config_arg.as_str()];
        args.extend_from_slice(extra);
        agent.masq_command(&args)
    };
    let refused = check(&["--nomasq-max-entries", "8"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("raise --nomasq-max-entries"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(check(&[]).status.success());

    // Seven entries fit, though old and new together do not: applied whole.
    let fits = [
        "100.64.0.0/10",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "192.0.0.0/24",
        "240.0.0.0/4",
        "10.0.0.0/8",
    ];
    write(&fits);
    masq_testbed::wait_for("the new config", Duration::from_secs(5), || {
        trie().as_array().map(Vec::len) == Some(fits.len() + 1)
    });
    assert_eq!(
        arrives_from(&sandbox, OUTSIDE_IP),
        IpAddr::V4(masq_testbed::sandbox::pod_ip(1)),
        "the outside network is exempt now"
    );
    write(&defaults);
    masq_testbed::wait_for("the defaults again", Duration::from_secs(5), || {
        trie() == in_force
    });
    assert_eq!(arrives_from(&sandbox, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn odd_and_oversized_config_files_never_hang_the_agent_nor_flood_logs_and_metrics() {
    let sandbox = Sandbox::new("odd", SandboxOptions::default());
    let dir = std::env::temp_dir().join(format!("{}-config", sandbox.tag));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("config dir");
    let config = dir.join("ip-masq-agent");
    // A FIFO where the config should be: opening it for reading would wait for a writer.
    nix::unistd::mkfifo(&config, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let config_arg = config.to_string_lossy().into_owned();
    let mut agent = Agent::launch(&sandbox, &["--config", &config_arg]);
    agent.wait_serving();
    let (status, body) = agent.http_get("/readyz").expect("readyz");
    assert!(
        status.contains(" 503 ") && body.contains("not a regular file (a FIFO)"),
        "{status}: {body}"
    );
    assert_eq!(
        agent.metric("masq_config_last_error{reason=\"read\"}"),
        Some(1.0)
    );

    // A valid config arrives (as the kubelet swaps it in: a rename).
    let swap = |contents: &[u8]| {
        let next = dir.join("next");
        fs::write(&next, contents).expect("write");
        fs::rename(&next, &config).expect("swap");
    };
    swap(b"nonMasqueradeCIDRs: [10.0.0.0/8]\n");
    agent.wait_ready();

    // A megabyte of garbage in one CIDR: rejected, and its text appears nowhere whole.
    let failed = agent
        .metric("masq_config_reloads_total{result=\"failed\"}")
        .unwrap_or(0.0);
    let mut garbage = b"nonMasqueradeCIDRs: [\"".to_vec();
    garbage.extend(std::iter::repeat_n(b'x', 1_000_000));
    garbage.extend(b"\"]\n");
    swap(&garbage);
    masq_testbed::wait_for("the garbage to be rejected", Duration::from_secs(5), || {
        agent
            .metric("masq_config_reloads_total{result=\"failed\"}")
            .unwrap_or(0.0)
            > failed
    });
    let (_, page) = agent.http_get("/metrics").expect("metrics");
    assert!(
        page.len() < 64 * 1024,
        "metrics page of {} bytes",
        page.len()
    );
    assert_eq!(
        agent.metric("masq_config_last_error{reason=\"invalid\"}"),
        Some(1.0),
        "{page}"
    );
    let (status, body) = agent.http_get("/readyz").expect("readyz");
    assert!(
        status.contains(" 200 "),
        "the config in force stays: {status}"
    );
    let longest = agent.log().lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 4096, "a log line of {longest} bytes");

    // Too large for a ConfigMap, and /dev/zero: refused without reading them whole.
    let huge = dir.join("huge");
    fs::File::create(&huge)
        .and_then(|file| file.set_len(50 << 20))
        .expect("sparse file");
    fs::rename(&huge, &config).expect("swap");
    masq_testbed::wait_for(
        "the huge file to be refused",
        Duration::from_secs(5),
        || agent.metric("masq_config_last_error{reason=\"read\"}") == Some(1.0),
    );
    let _ = fs::remove_file(&config);
    std::os::unix::fs::symlink("/dev/zero", &config).expect("symlink");
    thread::sleep(Duration::from_millis(500));
    let (_, body_after) = agent.http_get("/metrics").expect("metrics still served");
    assert!(body_after.contains("masq_config_last_error{reason=\"read\"} 1"));
    let (status, _) = agent.http_get("/readyz").expect("readyz");
    assert!(status.contains(" 200 "), "{status} {body}");
    let _ = fs::remove_dir_all(&dir);
}
