//! Where masq must behave as conntrack and MASQUERADE do on a real node: every packet the
//! kernel would deliver is delivered, whatever masq's own table holds.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use masq_testbed::{
    agent::Agent,
    capture::PodSourceWatch,
    sandbox::{
        AttachMode, NODE_IP, OUTSIDE_IP, ROUTER_NODE_SIDE, Sandbox, SandboxOptions, UPLINK, pod_ip,
    },
    traffic::{
        HeldConnection, tcp_server, tcp_transfer, udp_delayed_server, udp_query_once, udp_request,
        udp_server,
    },
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
/// pod of the node could open a connection (0 of 10) while they were held (120 s). A pod now
/// holds at most its share of the table in unassured flows (`--nat-pod-share`), its new flows
/// taking the place of its own; and a full table evicts an unassured flow, never an assured one,
/// as conntrack's `early_drop`.
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
    masq_testbed::wait_for(
        "the flood to reach its share of the table",
        Duration::from_secs(10),
        || agent.evictions("ipv4") > 0.0,
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
    let share = agent
        .metric_sum(
            "masq_nat_evictions_total",
            &[r#"family="ipv4""#, r#"cause="holder_share""#],
        )
        .unwrap_or(0.0);
    assert!(
        share > 0.0,
        "the flooding pod's new flows replaced none of its own: {:?}",
        status["evictions"]
    );
    let busiest = &status["top_holders"][0];
    assert_eq!(
        busiest["address"],
        pod_ip(1).to_string(),
        "masq status names the flooding pod: {status}"
    );
    drop(flood);
}

/// Issue 32: pod 1 connects in a loop to a port where the remote answers each SYN with a RST
/// (a health checker, a client retrying a dead service). masq held each such flow 10 s as
/// closed, so with `--nat-max-entries 1024` the table filled within seconds and another pod got
/// 0 of 10 new connections; conntrack deletes a flow whose only answer is a RST at once, and
/// the iptables path gave 10 of 10.
#[test]
fn a_pod_connecting_to_closed_ports_leaves_the_other_pods_new_connections_working() {
    let sandbox = Sandbox::new("closed", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(
        &sandbox,
        &["--config", &absent, "--nat-max-entries", "1024"],
    );
    let _tcp = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let running = Arc::new(AtomicBool::new(true));
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let looping = {
        let (running, refused) = (Arc::clone(&running), Arc::clone(&refused));
        sandbox.pod(1).spawn(move || {
            // Nothing listens on port 9 of the outside host: its stack answers with a RST.
            let closed = SocketAddr::from((OUTSIDE_IP, 9));
            let deadline = Instant::now() + Duration::from_secs(30);
            while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                if std::net::TcpStream::connect_timeout(&closed, Duration::from_secs(1))
                    .is_err_and(|error| error.kind() == std::io::ErrorKind::ConnectionRefused)
                {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // Five seconds of the loop: under the 10 s hold, far more closed flows than the table has.
    thread::sleep(Duration::from_secs(5));
    let timeout = Duration::from_secs(3);
    let connections = sandbox.pod(2).enter(|| {
        (0..10)
            .filter(|index| {
                tcp_transfer(
                    SocketAddrV4::new(OUTSIDE_IP, 8080),
                    &format!("new{index}"),
                    b"while pod 1 loops",
                    timeout,
                )
                .is_ok()
            })
            .count()
    });
    running.store(false, Ordering::Relaxed);
    let _ = looping.join();
    let refused = refused.load(Ordering::Relaxed);
    let status = agent.status();
    assert!(
        connections >= 9,
        "{connections} of 10 new connections while pod 1 met {refused} closed ports; counters {:?}",
        status["counters"]
    );
    assert!(
        refused > 512,
        "pod 1 met only {refused} closed ports: the loop never pressed the table"
    );
    assert!(
        agent.counter("tcp_refused", false) >= refused / 2,
        "flows answered only by a RST were not ended at once: {:?}",
        status["counters"]
    );
}

/// Queries answered, of 30, each from a new socket of pod 2 (a new flow) to the resolver on the
/// outside host's port 5300, each given a second.
fn queries_answered(sandbox: &Sandbox) -> usize {
    let resolver = SocketAddr::from((OUTSIDE_IP, 5300));
    sandbox.pod(2).enter(|| {
        (0..30)
            .filter(|index| {
                udp_query_once(
                    resolver,
                    format!("query {index}").as_bytes(),
                    Duration::from_secs(1),
                )
            })
            .count()
    })
}

/// Gives a spray up to 20 s to press on the table: until the sprayer's new flows replace its
/// own (or, without a share, the table's).
fn wait_for_pressure(agent: &Agent) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.evictions("ipv4") == 0.0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
    }
}

/// The outside host drops UDP to ports 10000-60000: a spray towards them is never answered.
fn black_hole_udp(netns: &masq_testbed::netns::Netns) {
    let dropped = netns.exec(
        "iptables",
        &[
            "-A",
            "INPUT",
            "-p",
            "udp",
            "--dport",
            "10000:60000",
            "-j",
            "DROP",
        ],
    );
    assert!(dropped.status.success(), "{dropped:?}");
}

/// Sprays UDP from the namespace it runs in to `target` (its ports 10000-59999 in turn, from
/// 16 sockets: 800,000 flows, more than the default table holds) until `running` is cleared or
/// 60 s pass. Paced below 100,000 datagrams a second, the rate of the issue's reproduction:
/// unpaced, it would take the cores from everything else on a 2-core machine, and what is
/// measured would be the kernel's queues rather than masq's table.
fn spray(target: IpAddr, running: &AtomicBool) {
    let sockets: Vec<UdpSocket> = (0..16)
        .filter_map(|_| UdpSocket::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0)).ok())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut port = 10_000_u16;
    let mut sent = 0_u32;
    while running.load(Ordering::Relaxed) && Instant::now() < deadline {
        for socket in &sockets {
            let _ = socket.send_to(b"spray", SocketAddr::new(target, port));
        }
        port = if port >= 59_999 { 10_000 } else { port + 1 };
        sent += 1;
        if sent.is_multiple_of(64) {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What a spray did: queries answered of 30, evictions by cause, and `masq status` after.
struct SprayOutcome {
    answered: usize,
    holder_share: f64,
    table_full: f64,
    status: serde_json::Value,
}

/// Pod 1 sprays UDP at black-hole addresses on an agent started with `args`, while pod 2 asks
/// a resolver answering after 50 ms 30 times.
fn queries_answered_during_a_spray(tag: &str, args: &[&str]) -> SprayOutcome {
    let sandbox = Sandbox::new(tag, SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let mut all = vec!["--config", absent.as_str()];
    all.extend_from_slice(args);
    let agent = Agent::start(&sandbox, &all);
    let _resolver = udp_delayed_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5300),
        Duration::from_millis(50),
    );
    black_hole_udp(&sandbox.outside);
    let running = Arc::new(AtomicBool::new(true));
    let sprayer = {
        let running = Arc::clone(&running);
        sandbox
            .pod(1)
            .spawn(move || spray(IpAddr::V4(OUTSIDE_IP), &running))
    };
    wait_for_pressure(&agent);
    let answered = queries_answered(&sandbox);
    running.store(false, Ordering::Relaxed);
    let _ = sprayer.join();
    let evicted = |cause: &str| {
        agent
            .metric_sum(
                "masq_nat_evictions_total",
                &[r#"family="ipv4""#, &format!(r#"cause="{cause}""#)],
            )
            .unwrap_or(0.0)
    };
    SprayOutcome {
        answered,
        holder_share: evicted("holder_share"),
        table_full: evicted("table_full"),
        status: agent.status(),
    }
}

/// Issue 32: a pod spraying UDP at black-hole addresses kept the default-sized table full, and
/// eviction took one of the newest flows: another pod's queries to a resolver answering after
/// 50 ms were answered 25 times of 30 (the iptables path: 30). Its pod share bounds what the
/// spraying pod holds, so the others' flows are never evicted for it.
#[test]
fn a_udp_spray_from_a_pod_costs_another_pods_queries_nothing() {
    let spray = queries_answered_during_a_spray("spray", &[]);
    assert!(
        spray.answered >= 29,
        "{} of 30 queries answered during the spray; evictions {}, holders {}",
        spray.answered,
        spray.status["evictions"],
        spray.status["top_holders"]
    );
    assert!(
        spray.holder_share > 0.0,
        "the spray never reached its share: {}",
        spray.status
    );
}

/// The same spray without a pod share, as conntrack has none: the table fills, and each new
/// flow evicts an unassured one sampled from the whole table, so a victim lives about as long
/// as the whole table takes to churn (seconds), not as long as a few dozen new flows take.
#[test]
fn without_a_pod_share_a_full_table_evicts_from_the_whole_table() {
    let spray = queries_answered_during_a_spray("spraysh0", &["--nat-pod-share", "0"]);
    assert!(
        spray.answered >= 29,
        "{} of 30 queries answered during the spray; evictions {}, counters {}",
        spray.answered,
        spray.status["evictions"],
        spray.status["counters"]
    );
    assert!(
        spray.table_full > 0.0,
        "the spray never filled the table: {}",
        spray.status
    );
}

/// Issue 32: the same spray from outside, at a pod's own address: every datagram of a new
/// flow is tracked (the pod's answers must not be masqueraded), against the destination pod's
/// share, so the other pods' flows are untouched.
#[test]
fn a_udp_spray_from_outside_at_a_pod_costs_the_other_pods_nothing() {
    let sandbox = Sandbox::new("inspray", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent]);
    let _resolver = udp_delayed_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5300),
        Duration::from_millis(50),
    );
    let running = Arc::new(AtomicBool::new(true));
    let sprayer = {
        let running = Arc::clone(&running);
        sandbox
            .outside
            .spawn(move || spray(IpAddr::V4(pod_ip(1)), &running))
    };
    wait_for_pressure(&agent);
    let answered = queries_answered(&sandbox);
    running.store(false, Ordering::Relaxed);
    let _ = sprayer.join();
    let status = agent.status();
    assert!(
        answered >= 29,
        "{answered} of 30 queries answered during the spray; evictions {}, holders {}",
        status["evictions"],
        status["top_holders"]
    );
    assert!(
        agent.evictions("ipv4") > 0.0,
        "the spray never pressed on the table: {status}"
    );
    assert_eq!(
        status["top_holders"][0]["address"],
        pod_ip(1).to_string(),
        "the flows opened towards pod 1 count against pod 1: {status}"
    );
}

/// Issue 32: with one SNAT port, held by pod 1 towards a remote, pod 2's 3,000-byte datagram
/// to the same remote gets no mapping: its first fragment was dropped, and its two later
/// fragments left with pod 2's address. conntrack reassembles and drops the whole datagram;
/// masq drops the later fragments of a datagram whose first it dropped.
#[test]
fn no_fragment_of_a_datagram_that_got_no_mapping_leaves_with_the_pods_address() {
    let sandbox = Sandbox::new("frags", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(
        &sandbox,
        &["--config", &absent, "--to-ports", "20000-20000"],
    );
    let _server = udp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5353),
    );
    let server = SocketAddr::from((OUTSIDE_IP, 5353));
    let timeout = Duration::from_secs(3);
    let (peer, _) = sandbox
        .pod(1)
        .enter(|| udp_request(server, b"holding the port", timeout))
        .expect("pod 1's flow");
    assert_eq!(peer, SocketAddr::from((NODE_IP, 20_000)));

    let watch = PodSourceWatch::start(&sandbox.router, "eth0");
    sandbox.pod(2).enter(|| {
        let socket = UdpSocket::bind("0.0.0.0:0").expect("a socket");
        socket
            .send_to(&[7_u8; 3_000], server)
            .expect("sending the datagram");
    });
    thread::sleep(Duration::from_millis(500));
    let (leaked, first) = watch.seen();
    assert_eq!(
        leaked,
        0,
        "frames with a pod's address reached the router: {first:?}; counters {:?}",
        agent.status()["counters"]
    );
    assert_eq!(agent.counter("egress_drop_no_port", false), 1);
    assert_eq!(agent.counter("egress_drop_fragment", false), 2);
}

/// Issue 32, point 5: a pod holds a TCP connection over IPv6; the node's uplink gets a second
/// global address and the first is deprecated (`preferred_lft 0`), still on the interface.
/// masq flushed the flow and the pod's next segment left from the new address: the remote reset
/// the connection. MASQUERADE flushes only when an address is removed; the connection carries on
/// from the old address, and new ones leave from the new.
#[test]
fn a_live_ipv6_connection_survives_a_change_of_the_nodes_preferred_source() {
    use masq_testbed::sandbox::{NODE_IPV6, OUTSIDE_IPV6};

    let sandbox = Sandbox::new("prefsrc", SandboxOptions::default());
    sandbox.add_ipv6();
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent, "--enable-ipv6"]);
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddr::from((Ipv6Addr::UNSPECIFIED, 8080)),
    );
    let server = SocketAddr::from((OUTSIDE_IPV6, 8080));
    let timeout = Duration::from_secs(3);
    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(server, "held", None, timeout))
        .expect("an IPv6 connection");
    assert_eq!(held.peer.ip(), IpAddr::V6(NODE_IPV6));

    let renumbered = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2);
    sandbox.node.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{renumbered}/64"),
        "dev",
        UPLINK,
        "nodad",
    ]);
    sandbox.node.ip(&[
        "-6",
        "addr",
        "change",
        &format!("{NODE_IPV6}/64"),
        "dev",
        UPLINK,
        "preferred_lft",
        "0",
    ]);
    masq_testbed::wait_for(
        "the agent to follow the new preferred source",
        Duration::from_secs(10),
        || agent.status()["uplinks"][0]["node_ipv6"] == renumbered.to_string(),
    );
    for round in 0..5 {
        held.echo(&format!("after the change {round}"))
            .unwrap_or_else(|error| {
                panic!(
                    "the connection broke after the change of source: {error}\n{}",
                    agent.log()
                )
            });
        thread::sleep(Duration::from_millis(100));
    }
    let new_source = masq_testbed::traffic::tcp_source(sandbox.pod(2), server, timeout);
    assert_eq!(
        new_source,
        IpAddr::V6(renumbered),
        "new flows take the new source"
    );
    assert!(
        !agent.log().contains("flushed"),
        "flows were flushed while their address stayed:\n{}",
        agent.log()
    );
}

/// Issue 32, point 4: a remote that aborts after a large burst sends its RST at the end of
/// what it sent, megabytes past the pod's last acknowledgement (its ACKs are still on their
/// way); masq accepted a RST only within 64 KiB of that acknowledgement, so the flow kept its
/// established lifetime (5 days). conntrack checks the RST against the window it tracks, which
/// the burst is inside: the flow ends, and is gone in the CLOSE timeout (10 s).
#[test]
fn an_abort_after_a_large_burst_ends_the_flow_within_ten_seconds() {
    use std::io::{Read as _, Write as _};

    let sandbox = Sandbox::new("abort", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent, "--gc-interval", "1s"]);
    // The pod's ACKs leave it through a narrow queue: what masq has seen acknowledged lags
    // what the remote sent by its whole window, as on a path with a long round trip.
    let throttled = sandbox.pod(1).exec(
        "tc",
        &[
            "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "200kbit", "burst", "1600",
            "latency", "5s",
        ],
    );
    assert!(throttled.status.success(), "{throttled:?}");
    let listener = sandbox.outside.enter(|| {
        std::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8090))
            .expect("listening")
    });
    let server = thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("the pod's connection");
        let burst = vec![0x5a_u8; 4 << 20];
        let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
        let _ = stream.write_all(&burst);
        // Abort: the RST carries the sequence number after the last byte sent.
        let linger = nix::sys::socket::sockopt::Linger;
        let _ = nix::sys::socket::setsockopt(
            &stream,
            linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
        drop(stream);
    });
    let read = sandbox.pod(1).enter(|| {
        let mut stream = std::net::TcpStream::connect_timeout(
            &SocketAddr::from((OUTSIDE_IP, 8090)),
            Duration::from_secs(3),
        )
        .expect("connecting");
        let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
        let mut buffer = vec![0_u8; 1 << 16];
        let mut total = 0_usize;
        loop {
            match stream.read(&mut buffer) {
                Ok(0) | Err(_) => break total,
                Ok(read) => total += read,
            }
        }
    });
    let _ = server.join();
    let aborted = Instant::now();
    let flows = || {
        let listed = agent.masq(&["nat", "list", "--protocol", "tcp", "--output", "json"]);
        let flows: serde_json::Value =
            serde_json::from_slice(&listed.stdout).unwrap_or(serde_json::Value::Null);
        flows.as_array().map_or(0, |flows| {
            flows
                .iter()
                .filter(|flow| flow["remote"] == format!("{OUTSIDE_IP}:8090"))
                .count()
        })
    };
    while flows() > 0 && aborted.elapsed() < Duration::from_secs(15) {
        thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        flows(),
        0,
        "the aborted flow (the pod read {read} bytes) was still there {:?} after the RST; counters {:?}",
        aborted.elapsed(),
        agent.status()["counters"]
    );
    assert!(
        aborted.elapsed() < Duration::from_secs(13),
        "the aborted flow took {:?} to go",
        aborted.elapsed()
    );
}

/// Issue 32, point 3: the collector and the flush after a renumbering take a flow's two halves
/// out one at a time, and a flow they remove may still be busy: no segment of it may leave with
/// the pod's address, and no reply may reach the node's stack (which would reset the
/// connection). Here conntrack's established timeout is 2 s and the collector runs five times a
/// second, so a stream pausing 2.5 s between its chunks is collected in every pause, and brought
/// back by its next segment; then the uplink is renumbered under a busy stream.
#[test]
fn flows_the_collector_or_a_flush_removes_under_a_stream_never_leak_a_pod_address() {
    use masq_testbed::{
        sandbox::ROUTER_NODE_SIDE,
        traffic::{fnv1a, payload, tcp_transfer_paced},
    };

    let sandbox = Sandbox::new("busygc", SandboxOptions::default());
    // Where conntrack is a module, its sysctls exist once it is loaded (a kernel may have it
    // built in, and no modprobe); setting the timeout below fails loudly if they do not.
    let _ = std::process::Command::new("modprobe")
        .arg("nf_conntrack")
        .status();
    sandbox
        .node
        .sysctl("net.netfilter.nf_conntrack_tcp_timeout_established", "2");
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start(&sandbox, &["--config", &absent, "--gc-interval", "200ms"]);
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let server = SocketAddr::from((OUTSIDE_IP, 8080));
    let watch = PodSourceWatch::start(&sandbox.router, "eth0");

    let data = payload(40_000, 7);
    let transfer = sandbox
        .pod(1)
        .enter(|| {
            tcp_transfer_paced(
                server,
                "paced",
                &data,
                8_000,
                Duration::from_millis(2_500),
                Duration::from_secs(10),
            )
        })
        .unwrap_or_else(|error| {
            panic!(
                "the paced stream broke: {error}; counters {:?}",
                agent.status()["counters"]
            )
        });
    assert_eq!((transfer.bytes, transfer.hash), (data.len(), fnv1a(&data)));
    assert!(
        agent.counter("egress_tcp_revived", false) + agent.counter("ingress_tcp_revived", false)
            > 0,
        "the collector never removed the pausing stream: {:?}",
        agent.status()["counters"]
    );

    // A busy stream while the uplink is renumbered: its flow is flushed and picked up on the
    // new address (the remote then resets it, as under MASQUERADE); nothing leaves as the pod.
    let running = Arc::new(AtomicBool::new(true));
    let stream = {
        let running = Arc::clone(&running);
        sandbox.pod(2).spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(20);
            let chunk = vec![1_u8; 1_000];
            if let Ok(mut stream) =
                std::net::TcpStream::connect_timeout(&server, Duration::from_secs(3))
            {
                use std::io::Write as _;
                let _ = writeln!(stream, "sink busy");
                while running.load(Ordering::Relaxed) && Instant::now() < deadline {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                    thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(500));
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
    thread::sleep(Duration::from_secs(2));
    running.store(false, Ordering::Relaxed);
    let _ = stream.join();
    let (leaked, first) = watch.seen();
    assert_eq!(
        leaked,
        0,
        "frames with a pod's address reached the router: {first:?}; counters {:?}",
        agent.status()["counters"]
    );
    assert!(
        agent.log().contains("flushed"),
        "the renumbering flushed nothing:\n{}",
        agent.log()
    );
}

/// Issue 32, point 6: a flow adopted from upstream's chain keeps the node port netfilter gave
/// it, usually inside the node's ephemeral range, where a node socket may later pick it
/// towards the same remote. conntrack gives such a clashing connection another port; masq did
/// not, and the node's replies went to the pod. Both now work, each with its own replies.
#[test]
fn a_node_connection_that_clashes_with_an_adopted_flow_keeps_its_replies() {
    let sandbox = Sandbox::new("clash", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let server = SocketAddrV4::new(OUTSIDE_IP, 8080);
    let timeout = Duration::from_secs(3);
    let mut agent = Agent::start(&sandbox, &["--config", &absent, "--backend", "iptables"]);
    // A flow netfilter mapped outside masq's SNAT range, where the node's sockets pick ports.
    let mut held = (0..40)
        .find_map(|attempt| {
            let connection = sandbox
                .pod(1)
                .enter(|| HeldConnection::open(server, &format!("held{attempt}"), None, timeout))
                .expect("a connection through upstream's chain");
            (connection.peer.ip() == IpAddr::V4(NODE_IP) && connection.peer.port() >= 32_768)
                .then_some(connection)
        })
        .expect("40 connections through upstream's chain, none mapped above 32767");
    let port = held.peer.port();
    assert_eq!(agent.terminate().code(), Some(0));
    agent.relaunch(&["--config", &absent, "--take-over-iptables"]);
    agent.wait_ready();

    let mut node = sandbox
        .node
        .enter(|| {
            HeldConnection::open(
                server,
                "node",
                Some(SocketAddrV4::new(NODE_IP, port)),
                timeout,
            )
        })
        .unwrap_or_else(|error| {
            panic!(
                "the node's connection from port {port} failed: {error}; counters {:?}",
                agent.status()["counters"]
            )
        });
    assert_ne!(
        node.peer.port(),
        port,
        "the node's connection got another port"
    );
    node.echo("node").expect("the node's connection answers");
    held.echo("pod").expect("the adopted flow answers the pod");
    assert_eq!(agent.counter("egress_host_remapped", false), 1);
}
