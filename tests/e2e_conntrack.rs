//! Where masq must behave as conntrack and MASQUERADE do on a real node: every packet the
//! kernel would deliver is delivered, whatever masq's own table holds.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    sandbox::{AttachMode, NODE_IP, Sandbox, SandboxOptions, pod_ip},
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
