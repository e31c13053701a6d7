//! The whole datapath with real traffic between namespaces: pods behind a node running
//! `masq agent`, a router, and an outside host. Needs root.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    sandbox::{
        AttachMode, CLUSTER_PEER_IP, NODE_IP, OUTSIDE_IP, Offload, Sandbox, SandboxOptions, pod_ip,
    },
    traffic::{
        HeldConnection, fnv1a, payload, ping, tcp_server, tcp_transfer, udp_request, udp_server,
    },
};

const TIMEOUT: Duration = Duration::from_secs(10);

/// A sandbox with an agent on its node; the agent is declared first so it is stopped and
/// uninstalled before the namespaces go away.
struct Cluster {
    agent: Agent,
    sandbox: Sandbox,
}

fn cluster(prefix: &str, options: SandboxOptions, agent_args: &[&str]) -> Cluster {
    let sandbox = Sandbox::new(prefix, options);
    let config = std::env::temp_dir().join(format!("{}-absent-config", sandbox.tag));
    let mut args = vec!["--config", config.to_str().unwrap_or_default()];
    args.extend_from_slice(agent_args);
    let agent = Agent::start(&sandbox, &args);
    Cluster { agent, sandbox }
}

fn outside(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(OUTSIDE_IP, port)
}

fn counter(agent: &Agent, outcome: &str) -> f64 {
    agent
        .metric(&format!(
            "masq_datapath_packets_total{{outcome=\"{outcome}\",family=\"ipv4\"}}"
        ))
        .unwrap_or(0.0)
}

fn is_node(peer: SocketAddr) -> bool {
    peer.ip() == IpAddr::V4(NODE_IP)
}

/// TCP, UDP and ICMP to a masqueraded destination leave with the node address and come back;
/// traffic to a non-masquerade destination keeps the pod address; every checksum verifies.
fn traffic_in_both_directions(offload: Offload, attach_mode: AttachMode) {
    let cluster = cluster(
        if offload == Offload::On { "on" } else { "off" },
        SandboxOptions {
            offload,
            ..SandboxOptions::in_mode(attach_mode)
        },
        &[],
    );
    let Cluster { agent, sandbox } = &cluster;
    let tcp = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let udp = udp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5353),
    );

    let bulk = payload(4 << 20, 7);
    let transfer = sandbox
        .pod(1)
        .enter(|| tcp_transfer(outside(8080), "bulk", &bulk, TIMEOUT))
        .expect("bulk transfer");
    assert!(
        is_node(transfer.peer),
        "masqueraded TCP arrived from {}",
        transfer.peer
    );
    assert!(
        transfer.peer.port() >= 1024 && !(30_000..=32_767).contains(&transfer.peer.port()),
        "SNAT port {} outside the default ranges (1024-65535 but the NodePorts)",
        transfer.peer.port()
    );
    assert_eq!(
        (transfer.bytes, transfer.hash),
        (bulk.len(), fnv1a(&bulk)),
        "data corrupted in transit"
    );

    let (peer, echoed) = sandbox
        .pod(2)
        .enter(|| udp_request(outside(5353), b"hello over udp", TIMEOUT))
        .expect("UDP request");
    assert!(is_node(peer), "masqueraded UDP arrived from {peer}");
    assert_eq!(echoed, b"hello over udp");

    assert!(
        ping(sandbox.pod(1), &OUTSIDE_IP.to_string(), 3),
        "ping to the outside host failed"
    );

    // Destinations in 10.0.0.0/8 are exempt: the peer sees the pod.
    let exempt = sandbox
        .pod(1)
        .enter(|| {
            tcp_transfer(
                SocketAddrV4::new(CLUSTER_PEER_IP, 8080),
                "exempt",
                b"in-cluster",
                TIMEOUT,
            )
        })
        .expect("exempt transfer");
    assert_eq!(exempt.peer.ip(), IpAddr::V4(pod_ip(1)));
    let (peer, _) = sandbox
        .pod(2)
        .enter(|| udp_request(SocketAddrV4::new(CLUSTER_PEER_IP, 5353), b"x", TIMEOUT))
        .expect("exempt UDP");
    assert_eq!(peer.ip(), IpAddr::V4(pod_ip(2)));

    // The node's own traffic is untouched.
    let node_transfer = sandbox
        .node
        .enter(|| tcp_transfer(outside(8080), "node", b"from the node", TIMEOUT))
        .expect("node transfer");
    assert!(is_node(node_transfer.peer));
    assert!(
        node_transfer.peer.port() >= 32_768,
        "node socket got port {} from the SNAT range",
        node_transfer.peer.port()
    );

    assert_eq!(
        sandbox.checksum_errors(),
        Vec::new(),
        "receivers counted checksum errors"
    );
    assert!(
        counter(agent, "egress_new_mapping") >= 3.0,
        "{}",
        agent.log()
    );
    assert!(counter(agent, "ingress_reverse_nat") > 0.0);
    assert!(counter(agent, "egress_exempt_cidr") > 0.0);
    assert!(counter(agent, "egress_host_passed") > 0.0);
    assert_eq!(
        counter(agent, "egress_drop_rewrite_failed")
            + counter(agent, "ingress_drop_rewrite_failed"),
        0.0
    );
    drop((tcp, udp));
}

#[test]
fn traffic_with_checksum_offload_on() {
    traffic_in_both_directions(Offload::On, AttachMode::Tcx);
}

#[test]
fn traffic_with_checksum_offload_off() {
    traffic_in_both_directions(Offload::Off, AttachMode::Tcx);
}

/// tc filters run after the tcx hook, at another point of the device's transmit path.
#[test]
fn traffic_through_tc_filters_with_checksum_offload_on() {
    traffic_in_both_directions(Offload::On, AttachMode::Tc);
}

#[test]
fn path_mtu_discovery_reaches_the_pod() {
    let options = SandboxOptions {
        outside_mtu: 1280,
        ..SandboxOptions::default()
    };
    let cluster = cluster("pmtu", options, &[]);
    let Cluster { agent, sandbox } = &cluster;
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let data = payload(1 << 20, 3);
    // The pod's 1500-byte segments carry DF; the router can only send 1280. Unless masq hands
    // the router's "fragmentation needed" to the pod, the connection stalls.
    let transfer = sandbox
        .pod(1)
        .enter(|| tcp_transfer(outside(8080), "pmtu", &data, Duration::from_secs(20)))
        .expect("transfer across the smaller MTU");
    assert_eq!((transfer.bytes, transfer.hash), (data.len(), fnv1a(&data)));
    assert!(is_node(transfer.peer));
    assert!(
        counter(agent, "ingress_icmp_error_translated") >= 1.0,
        "no fragmentation-needed was translated for the pod"
    );
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}

#[test]
fn concurrent_flows_to_one_endpoint_get_distinct_ports() {
    let cluster = cluster(
        "many",
        SandboxOptions {
            pods: 3,
            ..SandboxOptions::default()
        },
        &[],
    );
    let Cluster { agent, sandbox } = &cluster;
    let server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    const PER_POD: usize = 40;
    let mut all_peers = Vec::new();
    for index in 1..=3 {
        let peers = sandbox.pod(index).enter(|| {
            let mut connections: Vec<HeldConnection> = (0..PER_POD)
                .map(|flow| {
                    HeldConnection::open(
                        outside(8080),
                        &format!("pod{index}-{flow}"),
                        None,
                        TIMEOUT,
                    )
                    .expect("connect")
                })
                .collect();
            // Each connection's replies reach the pod that owns it, on the right socket.
            for (flow, connection) in connections.iter_mut().enumerate() {
                connection
                    .echo(&format!("pod{index} flow{flow} says hi"))
                    .expect("echo on a masqueraded flow");
            }
            connections
                .iter()
                .map(|connection| connection.peer)
                .collect::<Vec<_>>()
        });
        all_peers.extend(peers);
    }
    assert_eq!(all_peers.len(), 3 * PER_POD);
    assert!(all_peers.iter().all(|peer| is_node(*peer)), "{all_peers:?}");
    let ports: HashSet<u16> = all_peers.iter().map(SocketAddr::port).collect();
    assert_eq!(
        ports.len(),
        all_peers.len(),
        "two flows to one endpoint shared a port"
    );
    assert_eq!(server.peers().len(), 3 * PER_POD);
    let listed = agent.masq(&[
        "nat",
        "list",
        "--remote",
        "198.51.100.10:8080",
        "--output",
        "json",
    ]);
    let flows: Vec<serde_json::Value> =
        serde_json::from_slice(&listed.stdout).expect("nat list json");
    assert_eq!(
        flows.len(),
        3 * PER_POD,
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
}

#[test]
fn an_exhausted_port_range_drops_new_flows_and_keeps_old_ones() {
    let cluster = cluster(
        "full",
        SandboxOptions::default(),
        &["--to-ports", "20000-20003"],
    );
    let Cluster { agent, sandbox } = &cluster;
    let _server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let _other = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8081),
    );
    sandbox.pod(1).enter(|| {
        let mut held: Vec<HeldConnection> = (0..4)
            .map(|flow| {
                HeldConnection::open(outside(8080), &format!("held{flow}"), None, TIMEOUT)
                    .expect("connect")
            })
            .collect();
        let ports: HashSet<u16> = held
            .iter()
            .map(|connection| connection.peer.port())
            .collect();
        assert_eq!(ports, (20_000..=20_003).collect::<HashSet<u16>>());
        let refused =
            HeldConnection::open(outside(8080), "one-too-many", None, Duration::from_secs(2));
        assert!(
            refused.is_err(),
            "a fifth flow to the same endpoint got a port"
        );
        for (flow, connection) in held.iter_mut().enumerate() {
            connection
                .echo(&format!("still alive {flow}"))
                .expect("an existing flow was harmed");
        }
        // Ports are unique per remote endpoint, so another endpoint still has all four.
        let elsewhere = HeldConnection::open(outside(8081), "elsewhere", None, TIMEOUT)
            .expect("other endpoint");
        assert!((20_000..=20_003).contains(&elsewhere.peer.port()));
    });
    assert!(counter(agent, "egress_drop_no_port") >= 1.0);
    assert!(
        agent
            .metric("masq_port_allocation_failures_total")
            .unwrap_or(0.0)
            >= 1.0
    );
}

#[test]
fn node_sockets_and_pod_flows_share_a_destination() {
    let cluster = cluster(
        "share",
        SandboxOptions::default(),
        &["--to-ports", "20000-20002"],
    );
    let Cluster { sandbox, .. } = &cluster;
    let server = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    // A node socket explicitly bound inside the SNAT range holds its port...
    let mut node_flow = sandbox
        .node
        .enter(|| {
            HeldConnection::open(
                outside(8080),
                "node",
                Some(SocketAddrV4::new(NODE_IP, 20_000)),
                TIMEOUT,
            )
        })
        .expect("node socket");
    assert_eq!(
        node_flow.peer,
        SocketAddr::V4(SocketAddrV4::new(NODE_IP, 20_000))
    );
    // ...and the pods' flows to the same endpoint get the other ports.
    let mut pod_flows = Vec::new();
    for index in 1..=2 {
        let flow = sandbox
            .pod(index)
            .enter(|| HeldConnection::open(outside(8080), &format!("pod{index}"), None, TIMEOUT))
            .expect("pod flow");
        assert!(is_node(flow.peer));
        assert!(
            (20_001..=20_002).contains(&flow.peer.port()),
            "pod flow got {}",
            flow.peer
        );
        pod_flows.push(flow);
    }
    // An ephemeral node socket works alongside.
    let ephemeral = sandbox
        .node
        .enter(|| tcp_transfer(outside(8080), "ephemeral", b"node", TIMEOUT))
        .expect("ephemeral");
    assert!(is_node(ephemeral.peer) && ephemeral.peer.port() >= 32_768);
    node_flow.echo("node still fine").expect("node flow broken");
    for flow in &mut pod_flows {
        flow.echo("pod still fine").expect("pod flow broken");
    }
    assert_eq!(server.peers().len(), 4);
}

/// Flows opened from outside directly towards a pod (routed pod addresses) are answered with
/// the pod's address, as conntrack would: masq must not masquerade the answers.
#[test]
fn flows_opened_from_outside_are_answered_by_the_pod() {
    let cluster = cluster("in", SandboxOptions::default(), &[]);
    let Cluster { agent, sandbox } = &cluster;
    let _tcp = tcp_server(
        sandbox.pod(1),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let _udp = udp_server(
        sandbox.pod(1),
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5353),
    );

    let transfer = sandbox
        .outside
        .enter(|| {
            tcp_transfer(
                SocketAddrV4::new(pod_ip(1), 8080),
                "inbound",
                b"hello pod",
                TIMEOUT,
            )
        })
        .expect("TCP opened from outside");
    assert_eq!(
        transfer.peer.ip(),
        IpAddr::V4(OUTSIDE_IP),
        "the pod saw a translated client"
    );

    let answered_from = sandbox.outside.enter(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").expect("socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        socket
            .send_to(b"hello pod", SocketAddrV4::new(pod_ip(1), 5353))
            .expect("send");
        let mut buffer = [0u8; 256];
        socket
            .recv_from(&mut buffer)
            .map(|(_, from)| from)
            .expect("UDP answer")
    });
    assert_eq!(
        answered_from,
        SocketAddr::V4(SocketAddrV4::new(pod_ip(1), 5353)),
        "the answer was masqueraded"
    );
    assert!(counter(agent, "ingress_inbound_tracked") >= 1.0);
    assert!(counter(agent, "egress_inbound_reply") >= 1.0);
    assert!(counter(agent, "egress_tcp_midstream_passed") >= 1.0);
    assert_eq!(counter(agent, "egress_new_mapping"), 0.0);
}
