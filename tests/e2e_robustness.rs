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
    traffic::{tcp_server, tcp_transfer},
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn arrives_from(sandbox: &Sandbox, destination: Ipv4Addr) -> IpAddr {
    let destination = SocketAddrV4::new(destination, 8080);
    sandbox
        .pod(1)
        .enter(|| tcp_transfer(destination, "probe", b"probe", TIMEOUT))
        .unwrap_or_else(|error| panic!("flow to {destination} failed: {error}"))
        .peer
        .ip()
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
