//! A dual-stack node: with `--enable-ipv6` masq masquerades a pod's IPv6 TCP, UDP and ping to
//! the node's global IPv6 address while IPv4 keeps working beside it, keeps the pod address
//! for a non-masquerade IPv6 CIDR, and follows the uplink's IPv6 address as it comes and goes.
//! Without the flag IPv6 is left alone. The agent holds only the DaemonSet's capabilities.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    configmap::ConfigMapVolume,
    in_both_attach_modes,
    pressure::{TABLE_ARGS, full_table_keeps_live_flows},
    sandbox::{
        AttachMode, EXEMPTABLE_IPV6, NODE_IP, NODE_IPV6, OUTSIDE_IP, OUTSIDE_IPV6, Sandbox,
        SandboxOptions, UPLINK, pod_ipv6,
    },
    traffic::{
        HeldConnection, Server, fnv1a, payload, ping, tcp_server, tcp_source, tcp_transfer,
        udp_request, udp_server,
    },
    wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;

/// The outside host's servers: TCP and UDP on both families, reporting who they saw.
fn servers(sandbox: &Sandbox) -> Vec<Server> {
    let outside = &sandbox.outside;
    let any_v4 = |port| SocketAddr::from((Ipv4Addr::UNSPECIFIED, port));
    // Bound to the IPv6 addresses one by one, so they do not take the IPv4 ports too.
    let v6 = |address: Ipv6Addr, port| SocketAddr::from((address, port));
    vec![
        tcp_server(outside, any_v4(TCP_PORT)),
        udp_server(outside, any_v4(UDP_PORT)),
        tcp_server(outside, v6(OUTSIDE_IPV6, TCP_PORT)),
        udp_server(outside, v6(OUTSIDE_IPV6, UDP_PORT)),
        tcp_server(outside, v6(EXEMPTABLE_IPV6, TCP_PORT)),
    ]
}

/// A dual-stack sandbox with the outside host's servers running.
fn dual_stack(prefix: &str, attach_mode: AttachMode) -> (Sandbox, Vec<Server>) {
    let sandbox = Sandbox::new(prefix, SandboxOptions::in_mode(attach_mode));
    sandbox.add_ipv6();
    let servers = servers(&sandbox);
    (sandbox, servers)
}

/// A config path that does not exist: the defaults (10/8, 172.16/12, 192.168/16).
fn absent_config(sandbox: &Sandbox) -> String {
    format!("/tmp/{}-absent", sandbox.tag)
}

/// The address a TCP server at `destination` sees pod 1's connection come from.
fn tcp_arrives_from(sandbox: &Sandbox, destination: IpAddr) -> IpAddr {
    tcp_source(
        sandbox.pod(1),
        SocketAddr::new(destination, TCP_PORT),
        TIMEOUT,
    )
}

/// The address a UDP server at `destination` sees pod 1's datagram come from.
fn udp_arrives_from(sandbox: &Sandbox, destination: IpAddr) -> IpAddr {
    let server = SocketAddr::new(destination, UDP_PORT);
    sandbox
        .pod(1)
        .enter(|| udp_request(server, b"probe", TIMEOUT))
        .unwrap_or_else(|error| panic!("UDP to {server} failed: {error}"))
        .0
        .ip()
}

/// TCP, UDP and ping from pod 1 to the outside host's IPv6 address leave with the node's.
fn assert_ipv6_masqueraded(sandbox: &Sandbox, agent: &Agent) {
    let node_v6 = IpAddr::V6(NODE_IPV6);
    assert_eq!(tcp_arrives_from(sandbox, OUTSIDE_IPV6.into()), node_v6);
    assert_eq!(udp_arrives_from(sandbox, OUTSIDE_IPV6.into()), node_v6);
    assert!(
        ping(sandbox.pod(1), &OUTSIDE_IPV6.to_string(), 3),
        "ping6 from the pod to the outside host failed:\n{}",
        agent.log()
    );
}

/// A ConfigMap volume exempting 10.0.0.0/8 and 2001:db8:ee::/64 (where [`EXEMPTABLE_IPV6`]
/// is), and the path of its key; the volume is removed when dropped.
fn config(sandbox: &Sandbox) -> (ConfigMapVolume, String) {
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    volume.update(&[(
        "ip-masq-agent",
        "nonMasqueradeCIDRs: [10.0.0.0/8, 2001:db8:ee::/64]\n",
    )]);
    let path = volume.key("ip-masq-agent").to_string_lossy().into_owned();
    (volume, path)
}

/// The `translated` address of every IPv6 ICMP flow `masq nat list` shows.
fn icmpv6_translations(agent: &Agent) -> Vec<String> {
    let output = agent.masq(&["nat", "list", "--protocol", "icmpv6", "--output", "json"]);
    assert!(
        output.status.success(),
        "masq nat list: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let flows: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("masq nat list printed no JSON: {error}"));
    flows
        .as_array()
        .map(|flows| {
            flows
                .iter()
                .filter_map(|flow| flow["translated"].as_str())
                .filter_map(|translated| translated.parse::<SocketAddr>().ok())
                .map(|translated| translated.ip().to_string())
                .collect()
        })
        .unwrap_or_default()
}

in_both_attach_modes! {
/// TCP, UDP and ping from a pod to an outside IPv6 host leave with the node's global IPv6
/// address, IPv4 is masqueraded at the same time, and a non-masquerade IPv6 CIDR keeps the
/// pod's address.
fn a_dual_stack_node_masquerades_both_families(attach_mode) {
    let (sandbox, _servers) = dual_stack("v6", attach_mode);
    let (_volume, config) = config(&sandbox);
    let agent = Agent::start(&sandbox, &["--config", &config, "--enable-ipv6"]);

    assert_ipv6_masqueraded(&sandbox, &agent);
    assert!(
        icmpv6_translations(&agent).contains(&NODE_IPV6.to_string()),
        "the echo was not masqueraded to the node's address: {:?}",
        icmpv6_translations(&agent)
    );
    // IPv4 beside it, unchanged.
    assert_eq!(tcp_arrives_from(&sandbox, OUTSIDE_IP.into()), IpAddr::V4(NODE_IP));
    assert_eq!(udp_arrives_from(&sandbox, OUTSIDE_IP.into()), IpAddr::V4(NODE_IP));
    // A non-masquerade IPv6 CIDR keeps the pod's address.
    assert_eq!(
        tcp_arrives_from(&sandbox, EXEMPTABLE_IPV6.into()),
        IpAddr::V6(pod_ipv6(1))
    );

    let status = agent.status();
    assert_eq!(
        status["uplinks"][0]["node_ipv6"].as_str(),
        Some(NODE_IPV6.to_string().as_str()),
        "{status}"
    );
    assert!(status["nat_v6_flows"].as_u64() >= Some(3), "{status}");
    let text = String::from_utf8_lossy(&agent.masq(&["status"]).stdout).into_owned();
    assert!(
        text.contains(&format!("masquerades to {NODE_IP} and {NODE_IPV6},")),
        "{text}"
    );
    assert!(text.contains("2001:db8:ee::/64 "), "{text}");
    assert!(text.contains("nat ipv6:") && text.contains("ipv6 counters:"), "{text}");
    let listed = String::from_utf8_lossy(&agent.masq(&["nat", "list", "--pod", &pod_ipv6(1).to_string()]).stdout).into_owned();
    assert!(listed.contains(&format!("[{NODE_IPV6}]:")), "{listed}");
    let missing = format!("masq_uplink_ipv6_missing{{interface=\"{UPLINK}\"}}");
    assert_eq!(agent.metric(&missing), Some(0.0));
    for family in ["ipv4", "ipv6"] {
        let new_mappings = format!(
            "masq_datapath_packets_total{{outcome=\"egress_new_mapping\",family=\"{family}\"}}"
        );
        assert!(agent.metric(&new_mappings) >= Some(2.0), "{new_mappings}");
    }
    assert!(sandbox.checksum_errors().is_empty(), "{:?}", sandbox.checksum_errors());
}
}

/// Without `--enable-ipv6` IPv6 passes untranslated, as upstream without ip6tables rules: the
/// outside host sees the pod's own address (and IPv4 is masqueraded as always). The config is
/// the default one: an IPv6 CIDR without the flag is upstream's error.
#[test]
fn without_enable_ipv6_ipv6_keeps_pod_addresses() {
    let (sandbox, _servers) = dual_stack("v6off", AttachMode::Tcx);
    let agent = Agent::start(&sandbox, &["--config", &absent_config(&sandbox)]);
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IPV6.into()),
        IpAddr::V6(pod_ipv6(1))
    );
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IP.into()),
        IpAddr::V4(NODE_IP)
    );
    // Nothing is reported missing where IPv6 is not asked for.
    let missing = format!("masq_uplink_ipv6_missing{{interface=\"{UPLINK}\"}}");
    assert_eq!(agent.metric(&missing), None);
    assert_eq!(
        agent.metric("masq_nat_capacity_entries{family=\"ipv6\"}"),
        Some(1.0)
    );
}

/// Named with `--interface` or found by the agent, an uplink without a global IPv6 address
/// leaves IPv6 untranslated, says so and sets the metric, and IPv4 works meanwhile (the agent
/// does not fail); once the address arrives it is used within moments (netlink address
/// events), and it is dropped again when the address is deprecated.
mod the_uplink_ipv6_address_is_followed {
    use super::*;

    #[test]
    fn named_uplink() {
        the_uplink_ipv6_address_is_followed_on(&[UPLINK]);
    }

    #[test]
    fn found_uplink() {
        the_uplink_ipv6_address_is_followed_on(&[]);
    }
}

fn the_uplink_ipv6_address_is_followed_on(interfaces: &[&str]) {
    let (sandbox, _servers) = dual_stack("v6addr", AttachMode::Tcx);
    let (_volume, config) = config(&sandbox);
    sandbox.node.ip(&[
        "-6",
        "addr",
        "del",
        &format!("{NODE_IPV6}/64"),
        "dev",
        UPLINK,
    ]);
    let agent = Agent::start_on(
        &sandbox,
        interfaces,
        &["--config", &config, "--enable-ipv6"],
    );
    let missing = format!("masq_uplink_ipv6_missing{{interface=\"{UPLINK}\"}}");
    assert_eq!(agent.metric(&missing), Some(1.0));
    assert!(
        agent.log().contains("no global IPv6 address"),
        "no warning:\n{}",
        agent.log()
    );
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IP.into()),
        IpAddr::V4(NODE_IP)
    );

    sandbox.add_node_ipv6();
    wait_for(
        "the uplink's new IPv6 address",
        Duration::from_secs(5),
        || agent.metric(&missing) == Some(0.0),
    );
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IPV6.into()),
        IpAddr::V6(NODE_IPV6)
    );

    // Deprecated (preferred lifetime over): no longer a source for new connections.
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
    wait_for(
        "the deprecated address to be dropped",
        Duration::from_secs(5),
        || agent.metric(&missing) == Some(1.0),
    );
    assert!(
        agent.status()["uplinks"][0]["node_ipv6"].is_null(),
        "{}",
        agent.status()
    );
}

/// A node that ran without `--enable-ipv6` has IPv6 maps with room for nothing; an agent
/// restarted with the flag adopts the pinned state (IPv4 flows carry on) and replaces just
/// those two maps with full-size ones, so IPv6 is masqueraded at once.
#[test]
fn enabling_ipv6_on_adopted_pins_sizes_the_ipv6_maps() {
    let (sandbox, _servers) = dual_stack("v6adopt", AttachMode::Tcx);
    let absent = absent_config(&sandbox);
    let mut agent = Agent::start(&sandbox, &["--config", &absent]);
    let capacity = |family: &str| {
        agent_capacity(&agent, family).unwrap_or_else(|| panic!("no {family} capacity"))
    };
    assert_eq!(capacity("ipv6"), 1.0);
    let ipv4_capacity = capacity("ipv4");
    let server = SocketAddrV4::new(OUTSIDE_IP, TCP_PORT);
    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(server, "held", None, TIMEOUT))
        .unwrap_or_else(|error| panic!("connecting to {server}: {error}"));
    assert_eq!(held.peer.ip(), IpAddr::V4(NODE_IP));

    agent.relaunch(&["--config", &absent, "--enable-ipv6"]);
    agent.wait_ready();
    assert!(
        agent.log().contains("sized the pinned IPv6 maps"),
        "{}",
        agent.log()
    );
    assert_eq!(agent_capacity(&agent, "ipv6"), Some(ipv4_capacity));
    assert!(
        agent.log().contains("adopted the pinned maps"),
        "{}",
        agent.log()
    );
    held.echo("still here")
        .unwrap_or_else(|error| panic!("the IPv4 flow broke across the restart: {error}"));
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IPV6.into()),
        IpAddr::V6(NODE_IPV6)
    );
}

fn agent_capacity(agent: &Agent, family: &str) -> Option<f64> {
    agent.metric(&format!("masq_nat_capacity_entries{{family=\"{family}\"}}"))
}

/// Path MTU discovery over IPv6, where routers never fragment: the router's link to the outside
/// host carries 1280 bytes, the pod sends 1500-byte segments, and the router's Packet Too Big
/// goes to the node's address. Unless masq hands it to the pod, the transfer stalls.
#[test]
fn path_mtu_discovery_over_ipv6_reaches_the_pod() {
    let sandbox = Sandbox::new(
        "v6pmtu",
        SandboxOptions {
            outside_mtu: 1280,
            ..SandboxOptions::in_mode(AttachMode::Tcx)
        },
    );
    sandbox.add_ipv6();
    let _servers = servers(&sandbox);
    let absent = absent_config(&sandbox);
    let agent = Agent::start(&sandbox, &["--config", &absent, "--enable-ipv6"]);
    let data = payload(1 << 20, 7);
    let server = SocketAddr::new(OUTSIDE_IPV6.into(), TCP_PORT);
    let transfer = sandbox
        .pod(1)
        .enter(|| tcp_transfer(server, "pmtu6", &data, Duration::from_secs(20)))
        .unwrap_or_else(|error| {
            panic!("transfer across the smaller MTU: {error}\n{}", agent.log())
        });
    assert_eq!((transfer.bytes, transfer.hash), (data.len(), fnv1a(&data)));
    assert_eq!(transfer.peer.ip(), IpAddr::V6(NODE_IPV6));
    let translated =
        "masq_datapath_packets_total{outcome=\"ingress_icmp_error_translated\",family=\"ipv6\"}";
    assert!(
        agent.metric(translated) >= Some(1.0),
        "no Packet Too Big was translated for the pod"
    );
    assert!(
        sandbox.checksum_errors().is_empty(),
        "{:?}",
        sandbox.checksum_errors()
    );
}

/// An IPv6 connection keeps its translation across an agent restart: its next segment is
/// translated as before (a lost mapping would send it with the pod's address, and the remote
/// would reset it), and new flows are masqueraded as before.
#[test]
fn an_ipv6_flow_survives_an_agent_restart() {
    let (sandbox, _servers) = dual_stack("v6restart", AttachMode::Tcx);
    let absent = absent_config(&sandbox);
    let mut agent = Agent::start(&sandbox, &["--config", &absent, "--enable-ipv6"]);
    let server = SocketAddr::new(OUTSIDE_IPV6.into(), TCP_PORT);
    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(server, "held6", None, TIMEOUT))
        .unwrap_or_else(|error| panic!("connecting to {server}: {error}"));
    assert_eq!(held.peer.ip(), IpAddr::V6(NODE_IPV6));
    held.echo("before")
        .unwrap_or_else(|error| panic!("echo before the restart: {error}"));
    agent.restart();
    held.echo("after")
        .unwrap_or_else(|error| panic!("the IPv6 flow broke across the restart: {error}"));
    assert_eq!(
        tcp_arrives_from(&sandbox, OUTSIDE_IPV6.into()),
        IpAddr::V6(NODE_IPV6)
    );
}

/// A ConfigMap update that adds an IPv6 non-masquerade CIDR applies to new flows within
/// moments, and its removal too, as for IPv4.
#[test]
fn an_ipv6_cidr_swapped_into_the_config_applies_to_new_flows() {
    let (sandbox, _servers) = dual_stack("v6swap", AttachMode::Tcx);
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    let write = |volume: &mut ConfigMapVolume, cidrs: &str| {
        volume.update(&[("ip-masq-agent", &format!("nonMasqueradeCIDRs: [{cidrs}]\n"))]);
    };
    write(&mut volume, "10.0.0.0/8");
    let path = volume.key("ip-masq-agent").to_string_lossy().into_owned();
    let _agent = Agent::start(&sandbox, &["--config", &path, "--enable-ipv6"]);
    let arrives = || tcp_arrives_from(&sandbox, EXEMPTABLE_IPV6.into());
    assert_eq!(arrives(), IpAddr::V6(NODE_IPV6));

    write(&mut volume, "10.0.0.0/8, 2001:db8:ee::/64");
    wait_for("the IPv6 CIDR to apply", Duration::from_secs(5), || {
        arrives() == IpAddr::V6(pod_ipv6(1))
    });
    write(&mut volume, "10.0.0.0/8");
    wait_for("the IPv6 CIDR to go", Duration::from_secs(5), || {
        arrives() == IpAddr::V6(NODE_IPV6)
    });
}

/// An IPv6-only node (EKS IPv6, kind with `ipFamily: ipv6`): its uplink has a global IPv6
/// address and the IPv6 default route, and no IPv4 address at all. With `--enable-ipv6` masq
/// finds that uplink by itself and masquerades IPv6 there, and IPv4 that would need the
/// missing address is dropped and counted, as MASQUERADE drops it. Without the flag the agent
/// refuses to start, saying what is missing.
#[test]
fn an_ipv6_only_node_is_found_by_its_ipv6_route_and_masquerades_ipv6() {
    let (sandbox, _servers) = dual_stack("v6only", AttachMode::Tcx);
    sandbox.remove_node_ipv4();
    let (_volume, config) = config(&sandbox);

    let probe = Agent::unstarted(&sandbox);
    let pin_path = probe.pin_path().to_string_lossy().into_owned();
    let refused = probe.masq_command(&[
        "agent",
        "--metrics-addr",
        "127.0.0.1:0",
        "--pin-path",
        &pin_path,
        "--config",
        &config,
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "started without an uplink");
    assert!(
        stderr.contains("no interface carries traffic out of the node")
            && stderr.contains("--enable-ipv6"),
        "{stderr}"
    );
    assert!(!probe.pin_path().exists(), "the refused start left pins");

    // No --interface: the agent chooses.
    let agent = Agent::start_on(&sandbox, &[], &["--config", &config, "--enable-ipv6"]);
    let uplinks = agent.status()["uplinks"].clone();
    assert_eq!(uplinks.as_array().map(Vec::len), Some(1), "{uplinks}");
    assert_eq!(uplinks[0]["interface"].as_str(), Some(UPLINK), "{uplinks}");
    assert!(uplinks[0]["node_ip"].is_null(), "{uplinks}");
    assert_eq!(
        uplinks[0]["node_ipv6"].as_str(),
        Some(NODE_IPV6.to_string().as_str()),
        "{uplinks}"
    );
    assert_eq!(
        agent.metric(&format!(
            "masq_uplink_info{{interface=\"{UPLINK}\",node_ip=\"\",attach_mode=\"tcx\"}}"
        )),
        Some(1.0)
    );

    let node_v6 = IpAddr::V6(NODE_IPV6);
    assert_ipv6_masqueraded(&sandbox, &agent);

    // IPv4 routed out of the uplink anyway (a route and neighbour by hand: the node has no
    // IPv4 address to resolve one with) has no address to be masqueraded to.
    let router_mac = sandbox.router.exec("cat", &["/sys/class/net/eth0/address"]);
    let router_mac = String::from_utf8_lossy(&router_mac.stdout)
        .trim()
        .to_owned();
    sandbox
        .node
        .ip(&["route", "add", "198.51.100.0/24", "dev", UPLINK]);
    sandbox.node.ip(&[
        "neigh",
        "replace",
        &OUTSIDE_IP.to_string(),
        "lladdr",
        &router_mac,
        "dev",
        UPLINK,
        "nud",
        "permanent",
    ]);
    sandbox.pod(1).enter(|| {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            socket
                .send_to(b"v4", SocketAddrV4::new(OUTSIDE_IP, UDP_PORT))
                .unwrap();
        }
    });
    let dropped = "masq_datapath_packets_total{outcome=\"egress_drop_no_address\",family=\"ipv4\"}";
    wait_for(
        "IPv4 without an address to masquerade to to be dropped and counted",
        TIMEOUT,
        || agent.metric(dropped) >= Some(3.0),
    );

    // The uplink gets an IPv4 address after all, and loses it again: followed both ways.
    let node_ip = || agent.status()["uplinks"][0]["node_ip"].clone();
    sandbox
        .node
        .ip(&["addr", "add", &format!("{NODE_IP}/24"), "dev", UPLINK]);
    wait_for("the new IPv4 address to be followed", TIMEOUT, || {
        node_ip().as_str() == Some(NODE_IP.to_string().as_str())
    });
    sandbox.remove_node_ipv4();
    wait_for("the IPv4 address's loss to be followed", TIMEOUT, || {
        node_ip().is_null()
    });
    assert_eq!(tcp_arrives_from(&sandbox, OUTSIDE_IPV6.into()), node_v6);

    // Named rather than found, the uplink without IPv4 is taken too.
    let mut agent = agent;
    agent.kill();
    let agent = Agent::start_on(&sandbox, &[UPLINK], &["--config", &config, "--enable-ipv6"]);
    assert!(agent.status()["uplinks"][0]["node_ip"].is_null());
    assert_eq!(udp_arrives_from(&sandbox, OUTSIDE_IPV6.into()), node_v6);
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}

/// As the IPv4 table's test (`nat.rs`): an IPv6 NAT table at capacity admits new flows by
/// evicting unassured ones, counted, and every live IPv6 flow, TCP or UDP, keeps working with
/// the port it had.
#[test]
fn a_full_ipv6_nat_table_admits_new_flows_and_never_breaks_a_live_one() {
    let (sandbox, _servers) = dual_stack("v6full", AttachMode::Tcx);
    let absent = absent_config(&sandbox);
    let agent = Agent::start(
        &sandbox,
        &[&["--config", &absent, "--enable-ipv6"][..], &TABLE_ARGS].concat(),
    );
    full_table_keeps_live_flows(
        &sandbox,
        &agent,
        SocketAddr::from((OUTSIDE_IPV6, TCP_PORT)),
        SocketAddr::from((OUTSIDE_IPV6, UDP_PORT)),
        NODE_IPV6.into(),
    );
}
