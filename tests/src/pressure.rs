//! A NAT table at capacity under new-flow pressure, checked the same way for both families:
//! new flows are admitted by evicting flows that are not assured (counted), as conntrack's
//! `early_drop` does, and no live, assured flow, busy or idle, breaks or changes port.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use crate::{
    agent::Agent,
    sandbox::Sandbox,
    traffic::{HeldConnection, UdpFlow, udp_client},
    wait_for,
};

/// Live flows of each protocol: 50 TCP and 50 UDP take 200 of a 256-entry table.
const LIVE_FLOWS: usize = 50;
/// New flows sent at once, far more than the table has room for.
const NEW_FLOWS: u32 = 300;
/// The `--nat-max-entries` the agent must run with: 128 flows.
pub const TABLE_ENTRIES: u64 = 256;

/// The agent's arguments for these tests: the table of [`TABLE_ENTRIES`], and no pod share.
/// Pod 1's live flows take 100 of the table's 128 flows, 50 of them datagram flows that are
/// not streams yet for two seconds: a share of so small a table would count them against the
/// pod, which is not what these tests are about (the share has its own, in e2e's `conntrack`).
pub const TABLE_ARGS: [&str; 4] = ["--nat-max-entries", "256", "--nat-pod-share", "0"];

/// With `agent` running with `--nat-max-entries` [`TABLE_ENTRIES`] (and `--enable-ipv6` for
/// IPv6), opens live flows from pod 1 to the TCP and UDP echo servers `tcp` and `udp` (which
/// must see them from `node`; the UDP ones become assured streams), fills the table from pod 2
/// with one-shot queries, and checks that the table made room by evicting those, and that
/// every live flow still answers with the peer it had.
pub fn full_table_keeps_live_flows(
    sandbox: &Sandbox,
    agent: &Agent,
    tcp: SocketAddr,
    udp: SocketAddr,
    node: IpAddr,
) {
    let timeout = Duration::from_secs(10);
    let family = if tcp.is_ipv4() { "ipv4" } else { "ipv6" };
    let (mut held, udp_flows) = sandbox.pod(1).enter(|| {
        let held: Vec<HeldConnection> = (0..LIVE_FLOWS)
            .map(|index| {
                HeldConnection::open(tcp, &format!("live{index}"), None, timeout)
                    .unwrap_or_else(|error| panic!("live {family} TCP flow {index}: {error}"))
            })
            .collect();
        let flows: Vec<(UdpFlow, SocketAddr)> = (0..LIVE_FLOWS)
            .map(|index| {
                let flow = UdpFlow::open(udp, timeout)
                    .unwrap_or_else(|error| panic!("UDP socket: {error}"));
                let peer = flow
                    .request(b"first")
                    .unwrap_or_else(|error| panic!("live {family} UDP flow {index}: {error}"));
                (flow, peer)
            })
            .collect();
        (held, flows)
    });
    assert!(
        held.iter().all(|connection| connection.peer.ip() == node)
            && udp_flows.iter().all(|(_, peer)| peer.ip() == node),
        "live {family} flows must leave with the node's address {node}"
    );
    // Answered and still active more than two seconds after they began: assured UDP streams,
    // which conntrack (and masq) never evict.
    std::thread::sleep(Duration::from_millis(2_200));
    sandbox.pod(1).enter(|| {
        for (index, (flow, peer)) in udp_flows.iter().enumerate() {
            let now = flow.request(b"stream");
            assert!(
                now.as_ref().is_ok_and(|now| now == peer),
                "live {family} UDP flow {index} broke before any pressure: {now:?}"
            );
        }
    });

    sandbox.pod(2).enter(|| {
        for index in 0..NEW_FLOWS {
            udp_client(udp, timeout)
                .and_then(|socket| socket.send_to(format!("new{index}").as_bytes(), udp))
                .unwrap_or_else(|error| panic!("sending new flow {index}: {error}"));
        }
    });
    wait_for(
        &format!("the full {family} table to admit new flows by evicting unassured ones"),
        timeout,
        || agent.evictions(family) > 0.0,
    );

    for (index, connection) in held.iter_mut().enumerate() {
        connection
            .echo(&format!("after pressure {index}"))
            .unwrap_or_else(|error| panic!("live {family} TCP flow {index} broke: {error}"));
    }
    sandbox.pod(1).enter(|| {
        for (index, (flow, peer)) in udp_flows.iter().enumerate() {
            let now = flow.request(b"after pressure");
            assert!(
                now.as_ref().is_ok_and(|now| now == peer),
                "live {family} UDP flow {index} was re-mapped or broke: {now:?}, was {peer}"
            );
        }
    });
    let entries_key = if tcp.is_ipv4() {
        "nat_entries"
    } else {
        "nat_v6_entries"
    };
    let entries = agent.status()[entries_key].as_u64().unwrap_or(u64::MAX);
    assert!(
        entries <= TABLE_ENTRIES,
        "{entries} entries in a {TABLE_ENTRIES}-entry {family} table"
    );
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}
