//! masq next to another program on its uplink's hooks: where it sits decides what the other
//! program sees, and traffic flows either way. The agent holds only the DaemonSet's
//! capabilities (see `agent`).

#![expect(
    clippy::expect_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    in_both_attach_modes,
    observer::{Hook, Observer},
    sandbox::{AttachMode, NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions, UPLINK, pod_ip},
    traffic::{tcp_server, tcp_source},
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Whether masq's program comes before the other program on `hook` of the uplink, as
/// `masq status` lists the hook's programs in the order they run.
fn masq_runs_first(agent: &Agent, hook: &str) -> bool {
    let status = agent.status();
    let uplink = status["uplinks"]
        .as_array()
        .and_then(|uplinks| uplinks.iter().find(|uplink| uplink["interface"] == UPLINK))
        .expect("the uplink is listed");
    let programs = uplink["hooks"]
        .as_array()
        .and_then(|hooks| hooks.iter().find(|listed| listed["hook"] == hook))
        .and_then(|listed| listed["programs"].as_array())
        .expect("the hook's programs are listed");
    assert_eq!(
        programs.len(),
        2,
        "masq and the other program: {programs:?}"
    );
    programs[0]["masq"] == true
}

in_both_attach_modes! {
/// Issue 25, point 5. Under iptables every tc program sees the node's address and NAT port in
/// both directions: on egress after POSTROUTING's SNAT, on ingress before conntrack undoes it.
/// With masq first on both hooks (the default), a program after it sees the node's address
/// leaving but the pod's address coming back; with `--ingress-hook-position last` (and egress
/// last too, here) the other program runs first and sees what it sees without NAT: the pod
/// leaving, the node's address coming back. Traffic is translated either way, and a restart
/// with other positions moves masq's programs.
fn another_program_on_the_hooks_sees_what_masqs_place_gives_it(attach_mode) {
    let sandbox = Sandbox::new("hook", SandboxOptions::in_mode(attach_mode));
    let _server = tcp_server(&sandbox.outside, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080));
    let pin_dir = std::path::PathBuf::from(format!("/sys/fs/bpf/{}-observer", sandbox.tag));
    let observe = |hook: Hook| {
        let observer = Observer::load().expect("the other program loads");
        match attach_mode {
            AttachMode::Tcx => observer.attach_tcx(&sandbox.node, UPLINK, hook, true),
            AttachMode::Tc => observer.attach_tc(&sandbox.node, UPLINK, hook, 100, &pin_dir),
        }
    };
    if attach_mode == AttachMode::Tc {
        // The other program's clsact: masq finds it there and leaves it when it goes.
        sandbox.node.exec("tc", &["qdisc", "add", "dev", UPLINK, "clsact"]);
    }
    let egress = observe(Hook::Egress);
    let ingress = observe(Hook::Ingress);
    let connect = || {
        tcp_source(
            sandbox.pod(1),
            SocketAddrV4::new(OUTSIDE_IP, 8080),
            TIMEOUT,
        )
    };

    let mut agent = Agent::start(&sandbox, &[]);
    assert!(masq_runs_first(&agent, "egress") && masq_runs_first(&agent, "ingress"));
    assert_eq!(connect(), IpAddr::V4(NODE_IP));
    assert_eq!(egress.last_seen(), (NODE_IP, OUTSIDE_IP), "egress after masq");
    assert_eq!(ingress.last_seen(), (OUTSIDE_IP, pod_ip(1)), "ingress after masq");

    agent.relaunch(&[
        "--egress-hook-position",
        "last",
        "--ingress-hook-position",
        "last",
    ]);
    agent.wait_ready();
    assert!(!masq_runs_first(&agent, "egress") && !masq_runs_first(&agent, "ingress"));
    assert_eq!(connect(), IpAddr::V4(NODE_IP), "translated with masq last");
    assert_eq!(egress.last_seen(), (pod_ip(1), OUTSIDE_IP), "egress before masq");
    assert_eq!(ingress.last_seen(), (OUTSIDE_IP, NODE_IP), "ingress before masq");
}
}
