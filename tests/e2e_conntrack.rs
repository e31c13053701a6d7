//! Where masq must behave as conntrack and MASQUERADE do on a real node: every packet the
//! kernel would deliver is delivered, whatever masq's own table holds.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use masq_testbed::{
    agent::Agent,
    sandbox::{
        AttachMode, NODE_IP, OUTSIDE_IP, ROUTER_NODE_SIDE, Sandbox, SandboxOptions, UPLINK, pod_ip,
    },
    traffic::{tcp_server, tcp_transfer, udp_request, udp_server},
};

/// Ports of the node's address that a CNI portmap plugin forwards to a pod (`hostPort`), both
/// inside masq's default SNAT range (1024-29999).
const HOST_PORT_TCP: u16 = 8080;
const HOST_PORT_UDP: u16 = 8125;

/// Issue 24, point 1: the node DNATs a port of its own address to a pod, as the CNI portmap
/// plugin does for every `hostPort` (and kube-proxy for a Service's `externalIPs`). Such a
/// packet matches no mapping and no node socket, yet the kernel hands it to the stack, where
/// PREROUTING sends it on to the pod; masq dropped it as a stale reply.
fn host_ports_reach_their_pod(mode: AttachMode) {
    let sandbox = Sandbox::new("hostport", SandboxOptions::in_mode(mode));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent]);
    let pod = pod_ip(1);
    let _tcp = tcp_server(
        sandbox.pod(1),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, HOST_PORT_TCP),
    );
    let _udp = udp_server(
        sandbox.pod(1),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, HOST_PORT_UDP),
    );
    for (protocol, port) in [("tcp", HOST_PORT_TCP), ("udp", HOST_PORT_UDP)] {
        let port = port.to_string();
        let target = format!("{pod}:{port}");
        let output = sandbox.node.exec(
            "iptables",
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-d",
                &NODE_IP.to_string(),
                "-p",
                protocol,
                "--dport",
                &port,
                "-j",
                "DNAT",
                "--to-destination",
                &target,
            ],
        );
        assert!(output.status.success(), "iptables DNAT rule: {output:?}");
    }
    let timeout = Duration::from_secs(3);
    let (tcp_answered, udp_answered) = sandbox.outside.enter(|| {
        let tcp = (0..3)
            .filter(|round| {
                tcp_transfer(
                    SocketAddrV4::new(NODE_IP, HOST_PORT_TCP),
                    "hostport",
                    format!("tcp {round}").as_bytes(),
                    timeout,
                )
                .is_ok()
            })
            .count();
        let udp = (0..3)
            .filter(|round| {
                udp_request(
                    SocketAddrV4::new(NODE_IP, HOST_PORT_UDP),
                    format!("udp {round}").as_bytes(),
                    timeout,
                )
                .is_ok()
            })
            .count();
        (tcp, udp)
    });
    let status = agent.status();
    assert_eq!(
        (tcp_answered, udp_answered),
        (3, 3),
        "hostPort connections answered from outside (TCP, UDP); counters: {:?}",
        status["counters"]
    );
    assert_eq!(
        agent.metric(
            "masq_datapath_drops_total{direction=\"ingress\",reason=\"no_mapping\",family=\"ipv4\"}"
        ),
        None,
        "{:?}",
        status["counters"]
    );
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}

#[test]
fn host_ports_reach_their_pod_tcx() {
    host_ports_reach_their_pod(AttachMode::Tcx);
}

#[test]
fn host_ports_reach_their_pod_tc() {
    host_ports_reach_their_pod(AttachMode::Tc);
}

/// The address the node's uplink moves to in the renumbering test.
const RENUMBERED_NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);

/// Issue 24, point 4: when the uplink's address changes (DHCP, a prefix change), a flow that
/// never idles (QUIC, RTP, a WireGuard tunnel in a pod) kept leaving from the address the node
/// no longer owns, as long as it lived. MASQUERADE's address notifier flushes the conntrack
/// entries bound to the old address, so the next packet is masqueraded to the new one.
#[test]
fn a_live_udp_stream_follows_the_uplinks_new_address() {
    let sandbox = Sandbox::new("renumber", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent]);
    let server = udp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5004),
    );
    let running = Arc::new(AtomicBool::new(true));
    let stream = {
        let running = Arc::clone(&running);
        sandbox.pod(1).spawn(move || {
            let socket = UdpSocket::bind("0.0.0.0:0").expect("binding the pod's socket");
            let deadline = Instant::now() + Duration::from_secs(30);
            while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                let _ = socket.send_to(b"rtp", SocketAddrV4::new(OUTSIDE_IP, 5004));
                thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let sources = |server: &masq_testbed::traffic::Server| -> Vec<IpAddr> {
        server.peers().iter().map(SocketAddr::ip).collect()
    };
    thread::sleep(Duration::from_secs(1));
    assert!(
        sources(&server).contains(&IpAddr::V4(NODE_IP)),
        "the stream leaves with the node's address: {:?}",
        sources(&server)
    );
    // Renumber: the new address first (promoted when the old one goes), then the old one away.
    sandbox
        .node
        .sysctl(&format!("net.ipv4.conf.{UPLINK}.promote_secondaries"), "1");
    sandbox.node.ip(&[
        "addr",
        "add",
        &format!("{RENUMBERED_NODE_IP}/24"),
        "dev",
        UPLINK,
    ]);
    sandbox
        .node
        .ip(&["addr", "del", &format!("{NODE_IP}/24"), "dev", UPLINK]);
    sandbox.node.ip(&[
        "route",
        "replace",
        "default",
        "via",
        &ROUTER_NODE_SIDE.to_string(),
    ]);
    let renumbered = sources(&server).len();
    // The agent follows address events within moments; give it two seconds, then watch one.
    thread::sleep(Duration::from_secs(2));
    let settled = sources(&server).len();
    thread::sleep(Duration::from_secs(1));
    running.store(false, Ordering::Relaxed);
    let _ = stream.join();
    let seen = sources(&server);
    let last_second = &seen[settled.min(seen.len())..];
    assert!(
        last_second.len() >= 5,
        "the stream stopped arriving after the renumbering: {} datagrams before it, {} after",
        renumbered,
        seen.len() - renumbered
    );
    assert!(
        last_second
            .iter()
            .all(|source| *source == IpAddr::V4(RENUMBERED_NODE_IP)),
        "two seconds after the renumbering the stream still leaves from {:?}; counters {:?}",
        last_second,
        agent.status()["counters"]
    );
}
