//! NAT state under pressure, as a busy node sees it: a table at capacity must refuse new flows
//! (counted) and never break a live one, whatever the new-flow load.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    sandbox::{NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions},
    traffic::{HeldConnection, UdpFlow, tcp_server, udp_server},
};

const TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn a_full_nat_table_refuses_new_flows_and_never_breaks_a_live_one() {
    let sandbox = Sandbox::new("full", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    // 256 entries: 128 flows. 50 TCP and 50 UDP live flows take 200.
    let agent = Agent::start(&sandbox, &["--config", &absent, "--nat-max-entries", "256"]);
    let _tcp = tcp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 8080),
    );
    let _udp = udp_server(
        &sandbox.outside,
        SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 5353),
    );
    let outside = |port| SocketAddrV4::new(OUTSIDE_IP, port);

    let (mut held, udp_flows) = sandbox.pod(1).enter(|| {
        let held: Vec<HeldConnection> = (0..50)
            .map(|index| {
                HeldConnection::open(outside(8080), &format!("live{index}"), None, TIMEOUT).unwrap()
            })
            .collect();
        let flows: Vec<(UdpFlow, std::net::SocketAddr)> = (0..50)
            .map(|_| {
                let flow = UdpFlow::open(outside(5353), TIMEOUT).unwrap();
                let peer = flow.request(b"first").unwrap();
                (flow, peer)
            })
            .collect();
        (held, flows)
    });
    assert!(
        held.iter()
            .all(|connection| connection.peer.ip() == NODE_IP)
    );

    // New-flow pressure: 300 new UDP flows at once, far more than the table has room for.
    sandbox.pod(2).enter(|| {
        for index in 0..300u32 {
            let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
            socket
                .send_to(format!("new{index}").as_bytes(), outside(5353))
                .unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let refused = agent
        .metric("masq_datapath_packets_total{outcome=\"egress_drop_table_full\"}")
        .unwrap_or(0.0);
    assert!(
        refused > 0.0,
        "the table never filled: {:?}",
        agent.status()["counters"]
    );

    // Every live flow, busy or idle, still works with the port it had.
    for (index, connection) in held.iter_mut().enumerate() {
        connection
            .echo(&format!("after pressure {index}"))
            .unwrap_or_else(|error| panic!("live TCP flow {index} broke: {error}"));
    }
    sandbox.pod(1).enter(|| {
        for (index, (flow, peer)) in udp_flows.iter().enumerate() {
            assert_eq!(
                flow.request(b"after pressure").unwrap(),
                *peer,
                "live UDP flow {index} was re-mapped"
            );
        }
    });
    let entries = agent.status()["nat_entries"].as_u64().unwrap_or(u64::MAX);
    assert!(entries <= 256, "{entries} entries in a 256-entry table");
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}
