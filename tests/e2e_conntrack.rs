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
    traffic::{HeldConnection, tcp_server, tcp_transfer, udp_request, udp_server},
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

/// Issue 24, point 2: upstream's `MASQUERADE --random-fully` maps pod flows to ports in
/// 1024-65535, and after `--take-over-iptables` netfilter keeps translating them from their
/// conntrack entries. masq must neither drop their replies nor hand the same (node port,
/// remote, protocol) to a new pod flow. Here masq's range is cut down to the held flow's port
/// and the one after it, and two new flows towards the same server ask for both before the
/// held flow sends again: only the other port may be handed out.
#[test]
fn a_take_over_keeps_upstreams_live_flows_and_their_ports() {
    let sandbox = Sandbox::new("takeover", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let server = SocketAddrV4::new(OUTSIDE_IP, 8080);
    let timeout = Duration::from_secs(3);
    let mut agent = Agent::start(&sandbox, &["--config", &absent, "--backend", "iptables"]);
    // A flow netfilter mapped into masq's default range (as 45 % of upstream's are).
    let mut held = (0..40)
        .find_map(|attempt| {
            let connection = sandbox
                .pod(1)
                .enter(|| HeldConnection::open(server, &format!("held{attempt}"), None, timeout))
                .expect("a connection through upstream's chain");
            (connection.peer.ip() == IpAddr::V4(NODE_IP)
                && (1024..=29_998).contains(&connection.peer.port()))
            .then_some(connection)
        })
        .expect("40 connections through upstream's chain, none mapped into 1024-29998");
    let port = held.peer.port();
    held.echo("before")
        .expect("the held flow works under upstream's chain");
    assert_eq!(agent.terminate().code(), Some(0));

    let ports = format!("{port}-{}", port + 1);
    agent.relaunch(&[
        "--config",
        &absent,
        "--take-over-iptables",
        "--to-ports",
        &ports,
    ]);
    agent.wait_ready();
    let new_flows: Vec<Option<SocketAddr>> = (0..2)
        .map(|flow| {
            sandbox.pod(2).enter(|| {
                tcp_transfer(server, &format!("new{flow}"), b"new", timeout)
                    .ok()
                    .map(|transfer| transfer.peer)
            })
        })
        .collect();
    let mut failures = Vec::new();
    let echoed = (0..13)
        .filter(|round| {
            thread::sleep(Duration::from_millis(100));
            held.echo(&format!("after {round}"))
                .map_err(|error| failures.push(error.to_string()))
                .is_ok()
        })
        .count();
    let status = agent.status();
    assert_eq!(
        echoed,
        13,
        "echoes of upstream's live flow after the take-over ({failures:?}); counters {:?}; \
         flows {}",
        status["counters"],
        String::from_utf8_lossy(&sandbox.node.exec("iptables", &["-t", "nat", "-S"]).stdout)
    );
    assert_eq!(
        new_flows,
        [Some(SocketAddr::from((NODE_IP, port + 1))), None],
        "the held flow's port {port} was handed to a new flow (ports {ports}); counters {:?}",
        status["counters"]
    );
}

/// Issue 24, point 3: one pod opening connections to a black hole (a port scan, a retry storm
/// against a dead endpoint) filled a 1024-entry table with never-answered SYNs, and then no
/// pod of the node could open a connection (0 of 10) while they were held (120 s). As
/// conntrack's `early_drop`, a new flow now evicts a never-answered one; assured flows stay.
#[test]
fn a_syn_flood_from_one_pod_leaves_the_other_pods_new_connections_working() {
    use std::os::fd::OwnedFd;

    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, connect, socket};

    let sandbox = Sandbox::new("synflood", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(
        &sandbox,
        &["--config", &absent, "--nat-max-entries", "1024"],
    );
    let _tcp = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let _dns = udp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 53),
    );
    let black_hole = sandbox.outside.exec(
        "iptables",
        &["-A", "INPUT", "-p", "tcp", "--dport", "9999", "-j", "DROP"],
    );
    assert!(black_hole.status.success(), "{black_hole:?}");
    let timeout = Duration::from_secs(3);
    let mut held = sandbox
        .pod(2)
        .enter(|| HeldConnection::open(SocketAddrV4::new(OUTSIDE_IP, 8080), "held", None, timeout))
        .expect("an assured connection before the flood");

    // 700 connection attempts that are never answered: more flows than the table holds.
    let flood: Vec<OwnedFd> = sandbox.pod(1).enter(|| {
        (0..700)
            .map(|_| {
                let attempt = socket(
                    AddressFamily::Inet,
                    SockType::Stream,
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                    None,
                )
                .expect("a socket");
                let target = SockaddrIn::from(SocketAddrV4::new(OUTSIDE_IP, 9999));
                // EINPROGRESS: the SYN is on its way.
                let _ = connect(std::os::fd::AsRawFd::as_raw_fd(&attempt), &target);
                attempt
            })
            .collect()
    });
    let evicted =
        "masq_datapath_packets_total{outcome=\"nat_evicted_tcp_unanswered\",family=\"ipv4\"}";
    masq_testbed::wait_for(
        "the flood to fill the table",
        Duration::from_secs(10),
        || {
            agent.metric(evicted) > Some(0.0)
                || agent.status()["nat_entries"].as_u64() >= Some(1000)
        },
    );

    let (connections, queries) = sandbox.pod(2).enter(|| {
        let connections = (0..10)
            .filter(|index| {
                tcp_transfer(
                    SocketAddrV4::new(OUTSIDE_IP, 8080),
                    &format!("new{index}"),
                    b"during the flood",
                    timeout,
                )
                .is_ok()
            })
            .count();
        let queries = (0..3)
            .filter(|index| {
                udp_request(
                    SocketAddrV4::new(OUTSIDE_IP, 53),
                    format!("query {index}").as_bytes(),
                    timeout,
                )
                .is_ok()
            })
            .count();
        (connections, queries)
    });
    let status = agent.status();
    assert_eq!(
        (connections, queries),
        (10, 3),
        "new connections and DNS queries during the flood; counters {:?}",
        status["counters"]
    );
    held.echo("after the flood")
        .expect("the assured connection opened before the flood still works");
    assert!(
        agent.metric(evicted) > Some(0.0),
        "no never-answered flow was evicted: {:?}",
        status["counters"]
    );
    drop(flood);
}
