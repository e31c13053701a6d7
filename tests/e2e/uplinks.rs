//! The interfaces masq translates on, on a node with more than one: each masquerades with its
//! own address, as MASQUERADE does; interfaces and addresses that come and go are followed;
//! bad interface choices are refused before anything changes; and an upstream chain that comes
//! back is noticed. The agent holds only the DaemonSet's capabilities (see `agent`).

#![expect(
    clippy::expect_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    configmap::ConfigMapVolume,
    in_both_attach_modes,
    sandbox::{
        AttachMode, NODE_IP, NODE_IPV6, OUTSIDE_IP, OUTSIDE_IPV6, SECOND_NODE_IP, SECOND_NODE_IPV6,
        SECOND_OUTSIDE_IP, SECOND_OUTSIDE_IPV6, SECOND_UPLINK, Sandbox, SandboxOptions, UPLINK,
        route_second_network,
    },
    traffic::{
        HeldConnection, ping, tcp_server, tcp_source, tcp_transfer, udp_request, udp_server,
    },
    tunwire::TunWire,
    wait_for,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn any(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)
}

/// The address a server at `destination` sees pod `pod`'s connection come from.
fn arrives_from(sandbox: &Sandbox, pod: usize, destination: Ipv4Addr) -> IpAddr {
    tcp_source(
        sandbox.pod(pod),
        SocketAddrV4::new(destination, 8080),
        TIMEOUT,
    )
}

/// `(interface, node_ip, attach_mode)` of every uplink `masq status` lists.
fn uplinks(agent: &Agent) -> Vec<(String, String, String)> {
    agent.status()["uplinks"]
        .as_array()
        .map(|uplinks| {
            uplinks
                .iter()
                .map(|uplink| {
                    let text = |key: &str| uplink[key].as_str().unwrap_or_default().to_owned();
                    (text("interface"), text("node_ip"), text("attach_mode"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn uplink(name: &str, address: Ipv4Addr, mode: AttachMode) -> (String, String, String) {
    (name.to_owned(), address.to_string(), mode.flag().to_owned())
}

in_both_attach_modes! {
/// Found without `--interface`: the default route's interface and the one routing to a second
/// network are uplinks, the pod veths are not. An uplink that comes up later is picked up, an
/// address change is followed, and an interface that vanishes is cleaned up, all within
/// moments (netlink events, not the resync interval).
fn every_uplink_masquerades_with_its_own_address_and_follows_changes(attach_mode) {
    let sandbox = Sandbox::new(
        "nic",
        SandboxOptions {
            second_uplink: true,
            ..SandboxOptions::in_mode(attach_mode)
        },
    );
    let second = sandbox.second_outside.as_ref().expect("second uplink");
    let _first_server = tcp_server(&sandbox.outside, any(8080));
    let _second_server = tcp_server(second, any(8080));
    // Down at first: not an uplink yet.
    sandbox.node.ip(&["link", "set", SECOND_UPLINK, "down"]);

    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start_on(&sandbox, &[], &["--config", &absent]);
    assert_eq!(uplinks(&agent), [uplink(UPLINK, NODE_IP, attach_mode)]);
    assert_eq!(arrives_from(&sandbox, 1, OUTSIDE_IP), IpAddr::V4(NODE_IP));

    // The second NIC comes up with its route: picked up without a restart or a resync.
    sandbox.node.ip(&["link", "set", SECOND_UPLINK, "up"]);
    route_second_network(&sandbox.node);
    wait_for("the second uplink to be picked up", Duration::from_secs(5), || {
        uplinks(&agent).len() == 2
    });
    assert_eq!(
        uplinks(&agent),
        [
            uplink(UPLINK, NODE_IP, attach_mode),
            uplink(SECOND_UPLINK, SECOND_NODE_IP, attach_mode)
        ]
    );
    assert_eq!(arrives_from(&sandbox, 1, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    assert_eq!(
        arrives_from(&sandbox, 2, SECOND_OUTSIDE_IP),
        IpAddr::V4(SECOND_NODE_IP),
        "traffic leaving by the second uplink must get its address"
    );
    assert!(
        agent.metric(&format!(
            "masq_uplink_info{{interface=\"{SECOND_UPLINK}\",node_ip=\"{SECOND_NODE_IP}\",attach_mode=\"{}\"}}",
            attach_mode.flag()
        )) == Some(1.0),
        "{}",
        agent.log()
    );

    // Its address changes (DHCP): new flows follow.
    let renumbered = Ipv4Addr::new(203, 0, 113, 2);
    sandbox.node.ip(&["addr", "flush", "dev", SECOND_UPLINK]);
    sandbox.node.ip(&[
        "addr",
        "add",
        &format!("{renumbered}/25"),
        "dev",
        SECOND_UPLINK,
    ]);
    route_second_network(&sandbox.node);
    wait_for("the new address to be followed", Duration::from_secs(5), || {
        uplinks(&agent).contains(&uplink(SECOND_UPLINK, renumbered, attach_mode))
    });
    assert_eq!(
        arrives_from(&sandbox, 2, SECOND_OUTSIDE_IP),
        IpAddr::V4(renumbered)
    );

    // The NIC goes away: masq forgets it and leaves nothing of it behind.
    sandbox.node.ip(&["link", "del", SECOND_UPLINK]);
    wait_for("the vanished uplink to be dropped", Duration::from_secs(5), || {
        uplinks(&agent) == [uplink(UPLINK, NODE_IP, attach_mode)]
    });
    let links = agent.pin_path().join("links");
    let leftovers: Vec<String> = fs::read_dir(&links)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .filter(|name| name.ends_with(SECOND_UPLINK))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(leftovers, Vec::<String>::new(), "pins of the vanished uplink");
    assert_eq!(arrives_from(&sandbox, 1, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}
}

/// With `--enable-ipv6`, each of two dual-stack uplinks masquerades IPv6 to its own global
/// address as well as IPv4 to its own IPv4 address. The second uplink's index is past the
/// uplink slots, so its IPv6 address is found in the hash.
#[test]
fn every_uplink_masquerades_ipv6_with_its_own_address_too() {
    let sandbox = Sandbox::new(
        "nic6",
        SandboxOptions {
            second_uplink: true,
            ..SandboxOptions::default()
        },
    );
    sandbox.add_ipv6();
    sandbox.add_second_uplink_ipv6();
    let second = sandbox.second_outside.as_ref().expect("second uplink");
    let _servers = [
        tcp_server(&sandbox.outside, any(8080)),
        tcp_server(second, any(8080)),
        tcp_server(&sandbox.outside, SocketAddr::from((OUTSIDE_IPV6, 8080))),
        tcp_server(second, SocketAddr::from((SECOND_OUTSIDE_IPV6, 8080))),
        udp_server(&sandbox.outside, SocketAddr::from((OUTSIDE_IPV6, 5353))),
        udp_server(second, SocketAddr::from((SECOND_OUTSIDE_IPV6, 5353))),
    ];
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start_on(&sandbox, &[], &["--config", &absent, "--enable-ipv6"]);
    let status = agent.status();
    let ipv6_of = |name: &str| {
        status["uplinks"]
            .as_array()
            .and_then(|uplinks| uplinks.iter().find(|uplink| uplink["interface"] == name))
            .and_then(|uplink| uplink["node_ipv6"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(ipv6_of(UPLINK), Some(NODE_IPV6.to_string()), "{status}");
    assert_eq!(
        ipv6_of(SECOND_UPLINK),
        Some(SECOND_NODE_IPV6.to_string()),
        "{status}"
    );

    for pod in [1, 2] {
        let from = |destination: IpAddr| {
            tcp_source(
                sandbox.pod(pod),
                SocketAddr::new(destination, 8080),
                TIMEOUT,
            )
        };
        let udp_from = |destination: IpAddr| {
            sandbox
                .pod(pod)
                .enter(|| udp_request(SocketAddr::new(destination, 5353), b"probe", TIMEOUT))
                .expect("UDP over IPv6")
                .0
                .ip()
        };
        assert_eq!(from(OUTSIDE_IPV6.into()), IpAddr::V6(NODE_IPV6));
        assert_eq!(
            from(SECOND_OUTSIDE_IPV6.into()),
            IpAddr::V6(SECOND_NODE_IPV6),
            "IPv6 leaving by the second uplink must get its address"
        );
        assert_eq!(udp_from(OUTSIDE_IPV6.into()), IpAddr::V6(NODE_IPV6));
        assert_eq!(
            udp_from(SECOND_OUTSIDE_IPV6.into()),
            IpAddr::V6(SECOND_NODE_IPV6)
        );
        assert_eq!(arrives_from(&sandbox, pod, OUTSIDE_IP), IpAddr::V4(NODE_IP));
        assert_eq!(
            arrives_from(&sandbox, pod, SECOND_OUTSIDE_IP),
            IpAddr::V4(SECOND_NODE_IP)
        );
    }
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}

#[test]
fn named_interfaces_are_the_only_ones_translated_on() {
    let sandbox = Sandbox::new(
        "named",
        SandboxOptions {
            second_uplink: true,
            ..SandboxOptions::default()
        },
    );
    let second = sandbox.second_outside.as_ref().expect("second uplink");
    let _first_server = tcp_server(&sandbox.outside, any(8080));
    let _second_server = tcp_server(second, any(8080));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let mut agent = Agent::start_on(&sandbox, &[UPLINK, SECOND_UPLINK], &["--config", &absent]);
    assert_eq!(arrives_from(&sandbox, 1, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    assert_eq!(
        arrives_from(&sandbox, 1, SECOND_OUTSIDE_IP),
        IpAddr::V4(SECOND_NODE_IP)
    );

    // Restarted on the first only: the second is released, and what leaves by it keeps the
    // pod address (which the second network cannot route back: the server never sees it).
    agent.kill();
    let mut agent = Agent::start_on(&sandbox, &[UPLINK], &["--config", &absent]);
    assert_eq!(uplinks(&agent), [uplink(UPLINK, NODE_IP, AttachMode::Tcx)]);
    let untranslated = sandbox.pod(1).enter(|| {
        tcp_transfer(
            SocketAddrV4::new(SECOND_OUTSIDE_IP, 8080),
            "probe",
            b"probe",
            Duration::from_secs(2),
        )
    });
    assert!(
        untranslated.is_err(),
        "traffic by an interface masq was not asked to use was translated: {untranslated:?}"
    );
    assert_eq!(arrives_from(&sandbox, 2, OUTSIDE_IP), IpAddr::V4(NODE_IP));
    agent.kill();
}

/// Runs `masq agent ARGS` in the node namespace (DaemonSet capabilities) until it exits, and
/// returns its exit status and log.
fn agent_fails(agent: &Agent, args: &[&str]) -> (bool, String) {
    let pin_path = agent.pin_path().to_string_lossy().into_owned();
    let mut full = vec!["agent", "--metrics-addr", "127.0.0.1:0"];
    if !args.contains(&"--pin-path") {
        full.extend(["--pin-path", &pin_path]);
    }
    full.extend_from_slice(args);
    let output = agent.masq_command(&full);
    (
        !output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_interface_choices_are_refused_with_a_clear_error_and_change_nothing() {
    let sandbox = Sandbox::new("badif", SandboxOptions::default());
    // An Ethernet interface without an address.
    sandbox.node.ip(&[
        "link", "add", "noaddr0", "type", "veth", "peer", "name", "noaddr1",
    ]);
    sandbox.node.ip(&["link", "set", "noaddr0", "up"]);
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    // Only to name the pin path and run commands; never started.
    let probe = Agent::unstarted(&sandbox);
    let reserved = || {
        let output = sandbox
            .node
            .exec("cat", &["/proc/sys/net/ipv4/ip_local_reserved_ports"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let reserved_before = reserved();

    let cases: [(&[&str], &str); 8] = [
        (
            &["--interface", "nosuch0"],
            "interface nosuch0 does not exist",
        ),
        (
            &["--interface", "noaddr0"],
            "interface noaddr0 has no IPv4 address",
        ),
        // With --enable-ipv6 an interface may lack IPv4 (an IPv6-only node's), not both.
        (
            &["--interface", "noaddr0", "--enable-ipv6"],
            "interface noaddr0 has neither an IPv4 address nor a global IPv6 address",
        ),
        // Loopback's frames are neither Ethernet nor bare IP (tun devices are taken now).
        (&["--interface", "lo"], "interface lo has link type 772"),
        (
            &["--interface", UPLINK, "--node-ip", "0.0.0.0"],
            "0.0.0.0 cannot be a source address",
        ),
        (
            &["--interface", UPLINK, "--node-ip", "224.0.0.1"],
            "cannot be a source address",
        ),
        (
            &[
                "--interface",
                UPLINK,
                "--interface",
                "noaddr0",
                "--node-ip",
                "192.0.2.1",
            ],
            "name exactly one --interface",
        ),
        (
            &["--interface", UPLINK, "--pin-path", "/tmp"],
            "is not on a bpf filesystem",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["--config", absent.as_str()];
        all.extend_from_slice(args);
        let (failed, stderr) = agent_fails(&probe, &all);
        assert!(failed, "masq agent {all:?} started");
        assert!(
            stderr.contains(expected),
            "{all:?}: expected {expected:?} in:\n{stderr}"
        );
        let mentions = stderr
            .lines()
            .filter(|line| line.contains(expected))
            .count();
        assert_eq!(mentions, 1, "{all:?}: said once, on one line:\n{stderr}");
        assert!(
            !probe.pin_path().exists(),
            "{all:?} left pins at {}",
            probe.pin_path().display()
        );
        for device in [UPLINK, "noaddr0"] {
            assert!(
                !sandbox.node.has_clsact(device),
                "{all:?} added a qdisc to {device}"
            );
        }
    }
    assert_eq!(reserved(), reserved_before, "ports were reserved");
}

in_both_attach_modes! {
/// A reconciled ip-masq-agent (AKS, GKE) recreates its chain after masq took over: masq sees it
/// at the next resync, reports it (not ready, a metric, an error naming the chain), and with
/// `--take-over-iptables` removes it again.
fn an_upstream_chain_that_comes_back_is_reported_or_removed_again(attach_mode) {
    let sandbox = Sandbox::new("chain", SandboxOptions::in_mode(attach_mode));
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    volume.update(&[("ip-masq-agent", "resyncInterval: 1s\n")]);
    let config = volume.key("ip-masq-agent").to_string_lossy().into_owned();
    let install_upstream = || {
        sandbox.node.exec("iptables", &["-t", "nat", "-N", "IP-MASQ-AGENT"]);
        sandbox.node.exec(
            "iptables",
            &[
                "-t", "nat", "-A", "POSTROUTING", "-m", "addrtype", "!", "--dst-type", "LOCAL",
                "-j", "IP-MASQ-AGENT",
            ],
        );
    };
    let chain_installed = || {
        let rules = sandbox.node.exec("iptables", &["-t", "nat", "-S"]);
        String::from_utf8_lossy(&rules.stdout).contains("IP-MASQ-AGENT")
    };

    let mut agent = Agent::start(&sandbox, &["--config", &config]);
    install_upstream();
    wait_for("the chain to be reported", Duration::from_secs(5), || {
        agent.metric("masq_upstream_chain_present") == Some(1.0)
    });
    let (status, body) = agent.http_get("/readyz").expect("readyz");
    assert!(status.contains(" 503 ") && body.contains("IP-MASQ-AGENT"), "{status}: {body}");
    assert!(agent.log().contains("an ip-masq-agent chain is back"), "{}", agent.log());
    assert!(chain_installed(), "masq removed the chain without --take-over-iptables");

    // With --take-over-iptables the chain is removed at startup and whenever it returns.
    agent.relaunch(&["--config", &config, "--take-over-iptables"]);
    agent.wait_ready();
    assert!(!chain_installed());
    install_upstream();
    wait_for("the returning chain to be removed", Duration::from_secs(5), || {
        !chain_installed()
    });
    assert_eq!(agent.metric("masq_upstream_chain_present"), Some(0.0));
    let (status, _) = agent.http_get("/readyz").expect("readyz");
    assert!(status.contains(" 200 "), "{status}");
}
}

#[test]
fn a_node_ip_the_interface_does_not_have_is_used_but_reported() {
    let sandbox = Sandbox::new("nodeip", SandboxOptions::default());
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let foreign = "192.0.2.99";
    let agent = Agent::start(&sandbox, &["--config", &absent, "--node-ip", foreign]);
    assert_eq!(
        uplinks(&agent),
        [uplink(
            UPLINK,
            foreign.parse().expect("address"),
            AttachMode::Tcx
        )]
    );
    assert!(
        agent
            .log()
            .contains("--node-ip is not an address of the interface"),
        "{}",
        agent.log()
    );
    assert_eq!(
        agent.metric(&format!(
            "masq_uplink_address_local{{interface=\"{UPLINK}\"}}"
        )),
        Some(0.0)
    );
}

/// Gives `device` in `netns` the point-to-point address `local` towards `remote` (no duplicate
/// address detection for IPv6) and brings it up.
fn address_tunnel(netns: &masq_testbed::netns::Netns, device: &str, local: IpAddr, remote: IpAddr) {
    let family = if local.is_ipv6() { "-6" } else { "-4" };
    let (local, remote) = (local.to_string(), remote.to_string());
    let mut args = vec![
        family, "addr", "add", &local, "peer", &remote, "dev", device,
    ];
    if family == "-6" {
        args.push("nodad");
    }
    netns.ip(&args);
    netns.ip(&["link", "set", device, "up"]);
}

/// The tun uplink's address on the node, and its peer's on the router.
const TUN_NODE_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);
const TUN_ROUTER_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);

/// Through a tunnel uplink whose address is [`TUN_NODE_IP`], towards the outside host (TCP and
/// UDP servers on 8080 and 5353): TCP, UDP and ping from pod 1 leave with the tunnel's address,
/// the outside host's port unreachable reaches the pod's socket, and a connection held across
/// an agent restart carries on.
fn pods_leave_through_the_tunnel_translated(sandbox: &Sandbox, agent: &mut Agent) {
    assert_eq!(
        arrives_from(sandbox, 1, OUTSIDE_IP),
        IpAddr::V4(TUN_NODE_IP)
    );
    let (peer, _) = sandbox
        .pod(1)
        .enter(|| {
            udp_request(
                SocketAddrV4::new(OUTSIDE_IP, 5353),
                b"over the tunnel",
                TIMEOUT,
            )
        })
        .expect("a UDP answer through the tunnel");
    assert_eq!(peer.ip(), IpAddr::V4(TUN_NODE_IP));
    assert!(
        ping(sandbox.pod(1), &OUTSIDE_IP.to_string(), 3),
        "ping through the tunnel"
    );
    let refused = sandbox.pod(1).enter(|| {
        let socket = std::net::UdpSocket::bind(any(0))?;
        socket.connect(SocketAddrV4::new(OUTSIDE_IP, 9))?;
        socket.set_read_timeout(Some(TIMEOUT))?;
        socket.send(b"anyone?")?;
        socket.recv(&mut [0; 64])
    });
    assert_eq!(
        refused.map_err(|error| error.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "the ICMP error reached the pod"
    );
    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(SocketAddrV4::new(OUTSIDE_IP, 8080), "held", None, TIMEOUT))
        .expect("a held connection");
    assert_eq!(held.peer.ip(), IpAddr::V4(TUN_NODE_IP));
    agent.restart();
    held.echo("after the restart")
        .expect("the held connection carries on");
    assert_eq!(
        arrives_from(sandbox, 1, OUTSIDE_IP),
        IpAddr::V4(TUN_NODE_IP)
    );
}

in_both_attach_modes! {
/// Issue 25, point 2: a tun uplink (a device without a link-layer header, as WireGuard, IP
/// tunnels and VPN clients are) was refused by name ("not an Ethernet device") and skipped when
/// uplinks are found, so pods' traffic routed through it left with their own addresses, where
/// MASQUERADE translates on any device. It is now found by its route and translated like an
/// Ethernet uplink: TCP, UDP, ping and ICMP errors, across a restart.
fn a_tun_uplink_found_by_its_route_is_translated_like_an_ethernet_one(attach_mode) {
    let sandbox = Sandbox::new("tun", SandboxOptions::in_mode(attach_mode));
    let _wire = TunWire::new(&sandbox.node, "tun0", &sandbox.router, "tun1");
    address_tunnel(&sandbox.node, "tun0", TUN_NODE_IP.into(), TUN_ROUTER_IP.into());
    address_tunnel(&sandbox.router, "tun1", TUN_ROUTER_IP.into(), TUN_NODE_IP.into());
    // The outside host is reached through the tunnel, everything else by the default route.
    sandbox
        .node
        .ip(&["route", "add", &format!("{OUTSIDE_IP}/32"), "dev", "tun0"]);
    let _tcp = tcp_server(&sandbox.outside, any(8080));
    let _udp = udp_server(&sandbox.outside, any(5353));
    // Without masq, the pod's own address goes out through the tunnel.
    assert_eq!(
        arrives_from(&sandbox, 1, OUTSIDE_IP),
        IpAddr::V4(masq_testbed::sandbox::pod_ip(1))
    );

    // No --interface: the uplinks are found.
    let mut agent = Agent::start_on(&sandbox, &[], &[]);
    let listed = uplinks(&agent);
    assert!(
        listed.contains(&uplink("tun0", TUN_NODE_IP, attach_mode))
            && listed.contains(&uplink(UPLINK, NODE_IP, attach_mode)),
        "{listed:?}"
    );
    pods_leave_through_the_tunnel_translated(&sandbox, &mut agent);
    drop(agent);
}
}

/// A tun device named with `--interface` is taken, where it was refused as not Ethernet.
#[test]
fn a_tun_device_named_as_the_uplink_is_taken() {
    let sandbox = Sandbox::new("tunname", SandboxOptions::default());
    let _wire = TunWire::new(&sandbox.node, "tun0", &sandbox.router, "tun1");
    address_tunnel(
        &sandbox.node,
        "tun0",
        TUN_NODE_IP.into(),
        TUN_ROUTER_IP.into(),
    );
    let agent = Agent::start_on(&sandbox, &["tun0"], &[]);
    let listed: Vec<String> = uplinks(&agent)
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    assert_eq!(listed, ["tun0"]);
}

/// A key pair for WireGuard (`wg genkey`, `wg pubkey`): the private key's file in `dir` and the
/// public key.
fn wireguard_keys(dir: &ConfigMapVolume, side: &str) -> (String, String) {
    let path = dir
        .key(&format!("{side}.key"))
        .to_string_lossy()
        .into_owned();
    let private = std::process::Command::new("wg")
        .arg("genkey")
        .output()
        .expect("wg genkey (Debian's wireguard-tools)");
    fs::write(&path, &private.stdout).expect("writing the private key");
    let mut public = std::process::Command::new("wg")
        .arg("pubkey")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wg pubkey");
    std::io::Write::write_all(
        public.stdin.as_mut().expect("wg pubkey's input"),
        &private.stdout,
    )
    .expect("feeding wg pubkey");
    let public = public.wait_with_output().expect("wg pubkey's output");
    (
        path,
        String::from_utf8_lossy(&public.stdout).trim().to_owned(),
    )
}

/// Issue 25, point 2, over WireGuard: the node reaches the outside host through a WireGuard
/// tunnel to the router, whose peer entry for the node allows only the node's tunnel address
/// (cryptokey routing), as a WireGuard egress gateway does. A pod's packet that leaves the
/// tunnel untranslated is dropped there: without masq the pod cannot connect; with masq (the
/// tunnel found by its route) TCP, UDP, ping, an ICMP error and a connection held across a
/// restart go through with the tunnel address.
///
/// Needs the kernel's WireGuard, which this repository's development kernel lacks: `cargo
/// xtask kernels` runs it in the Debian guests (tc on 6.1, both modes on 6.12), where the
/// module loads on demand; run by hand with `--ignored` elsewhere.
fn a_wireguard_uplink_masquerades_pod_traffic(attach_mode: AttachMode) {
    let sandbox = Sandbox::new("wg", SandboxOptions::in_mode(attach_mode));
    // Removed with the directory when the test ends, however it ends.
    let keys = ConfigMapVolume::new(&format!("{}-wg", sandbox.tag));
    let (node_key, node_public) = wireguard_keys(&keys, "node");
    let (router_key, router_public) = wireguard_keys(&keys, "router");
    let tunnel = |netns: &masq_testbed::netns::Netns,
                  (device, key, port): (&str, &str, &str),
                  (peer, allowed, endpoint): (&str, &str, String),
                  (local, remote): (Ipv4Addr, Ipv4Addr)| {
        netns.ip(&["link", "add", device, "type", "wireguard"]);
        netns.exec(
            "wg",
            &[
                "set",
                device,
                "private-key",
                key,
                "listen-port",
                port,
                "peer",
                peer,
                "allowed-ips",
                allowed,
                "endpoint",
                &endpoint,
            ],
        );
        address_tunnel(netns, device, local.into(), remote.into());
    };
    tunnel(
        &sandbox.node,
        ("wg0", &node_key, "51820"),
        (&router_public, "0.0.0.0/0", "192.0.2.254:51821".to_owned()),
        (TUN_NODE_IP, TUN_ROUTER_IP),
    );
    tunnel(
        &sandbox.router,
        ("wg1", &router_key, "51821"),
        (
            &node_public,
            &format!("{TUN_NODE_IP}/32"),
            format!("{NODE_IP}:51820"),
        ),
        (TUN_ROUTER_IP, TUN_NODE_IP),
    );
    sandbox
        .node
        .ip(&["route", "add", &format!("{OUTSIDE_IP}/32"), "dev", "wg0"]);
    let _tcp = tcp_server(&sandbox.outside, any(8080));
    let _udp = udp_server(&sandbox.outside, any(5353));
    let server = SocketAddrV4::new(OUTSIDE_IP, 8080);

    let untranslated = sandbox
        .pod(1)
        .enter(|| tcp_transfer(server, "plain", b"plain", Duration::from_secs(3)));
    assert!(
        untranslated.is_err(),
        "the router's peer took the pod's own address: {untranslated:?}"
    );

    let mut agent = Agent::start_on(&sandbox, &[], &[]);
    assert!(
        uplinks(&agent).contains(&uplink("wg0", TUN_NODE_IP, attach_mode)),
        "{:?}",
        uplinks(&agent)
    );
    pods_leave_through_the_tunnel_translated(&sandbox, &mut agent);
}

#[test]
#[ignore = "needs the kernel's WireGuard: run by `cargo xtask kernels` in the Debian guests"]
fn a_wireguard_uplink_masquerades_pod_traffic_tc() {
    a_wireguard_uplink_masquerades_pod_traffic(AttachMode::Tc);
}

#[test]
#[ignore = "needs the kernel's WireGuard and tcx: run by `cargo xtask kernels` in the 6.12 guest"]
fn a_wireguard_uplink_masquerades_pod_traffic_tcx() {
    a_wireguard_uplink_masquerades_pod_traffic(AttachMode::Tcx);
}

/// The tun uplink's IPv6 addresses, on the node and on the router.
const TUN_NODE_IPV6: std::net::Ipv6Addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
const TUN_ROUTER_IPV6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 2);

/// IPv6 over a device without a link-layer header: the programs take the family from the skb's
/// protocol, there being no ethertype to read, and find the IPv6 header at offset 0.
#[test]
fn a_tun_uplink_masquerades_ipv6_too() {
    let sandbox = Sandbox::new("tun6", SandboxOptions::default());
    sandbox.add_ipv6();
    let _wire = TunWire::new(&sandbox.node, "tun0", &sandbox.router, "tun1");
    address_tunnel(
        &sandbox.node,
        "tun0",
        TUN_NODE_IPV6.into(),
        TUN_ROUTER_IPV6.into(),
    );
    address_tunnel(
        &sandbox.router,
        "tun1",
        TUN_ROUTER_IPV6.into(),
        TUN_NODE_IPV6.into(),
    );
    sandbox.node.ip(&[
        "-6",
        "route",
        "add",
        &format!("{OUTSIDE_IPV6}/128"),
        "dev",
        "tun0",
    ]);
    // Back to the node's tunnel address by the tunnel (an IPv6 peer address makes no route).
    sandbox.router.ip(&[
        "-6",
        "route",
        "replace",
        &format!("{TUN_NODE_IPV6}/128"),
        "dev",
        "tun1",
    ]);
    let _tcp = tcp_server(&sandbox.outside, SocketAddr::from((OUTSIDE_IPV6, 8080)));
    let _udp = udp_server(&sandbox.outside, SocketAddr::from((OUTSIDE_IPV6, 5353)));
    let absent = format!("/tmp/{}-absent", sandbox.tag);
    let agent = Agent::start_on(&sandbox, &[], &["--config", &absent, "--enable-ipv6"]);
    let status = agent.status();
    let tun_ipv6 = status["uplinks"]
        .as_array()
        .and_then(|uplinks| uplinks.iter().find(|uplink| uplink["interface"] == "tun0"))
        .and_then(|uplink| uplink["node_ipv6"].as_str())
        .map(str::to_owned);
    assert_eq!(tun_ipv6, Some(TUN_NODE_IPV6.to_string()), "{status}");
    let from = tcp_source(
        sandbox.pod(1),
        SocketAddr::from((OUTSIDE_IPV6, 8080)),
        TIMEOUT,
    );
    assert_eq!(from, IpAddr::V6(TUN_NODE_IPV6));
    let (peer, _) = sandbox
        .pod(1)
        .enter(|| {
            udp_request(
                SocketAddr::from((OUTSIDE_IPV6, 5353)),
                b"over the tunnel",
                TIMEOUT,
            )
        })
        .expect("a UDP answer over IPv6 through the tunnel");
    assert_eq!(peer.ip(), IpAddr::V6(TUN_NODE_IPV6));
    drop(agent);
}
