//! Issue 26 with the real agent: a ConfigMap that exempts 10.0.0.0/8 but masquerades the part
//! of it where the in-cluster peer lives (`masqueradeCIDRs`), and never masquerades one pod
//! (`nonMasqueradeSrcCIDRs`), in both families. Real connections from the sandbox's pods show
//! what leaves the node, under the eBPF backend (both attach modes) and the iptables backend;
//! `masq explain` in the node agrees with every one, and the metrics count the lists and the
//! exempt pod's packets. Needs root; fails loudly without it.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use masq_testbed::{
    agent::Agent,
    configmap::ConfigMapVolume,
    in_both_attach_modes,
    sandbox::{
        CLUSTER_PEER_IP, EXEMPTABLE_IPV6, NODE_IP, NODE_IPV6, OUTSIDE_IP, OUTSIDE_IPV6, Sandbox,
        SandboxOptions, pod_ip, pod_ipv6,
    },
    traffic::{tcp_server, tcp_source},
};

const TIMEOUT: Duration = Duration::from_secs(10);
const PORT: u16 = 8080;

/// Another address of the outside host inside 10.0.0.0/8 but outside the masquerade
/// exception, routed to it by the router like the in-cluster peer.
const OTHER_CLUSTER_IP: &str = "10.100.0.10";
/// Another IPv6 address of the outside host inside the exempt 2001:db8:ee::/64 but outside the
/// exception 2001:db8:ee::/120 (which holds [`EXEMPTABLE_IPV6`]).
const OTHER_EXEMPT_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xee, 0, 0, 0, 1, 0x10);

/// The ConfigMap: pod 2 is exempt whatever the destination; the in-cluster peer
/// (10.200.0.10) and 2001:db8:ee::10 are masquerade exceptions inside exempt ranges.
fn config() -> String {
    format!(
        "nonMasqueradeCIDRs: [10.0.0.0/8, 2001:db8:ee::/64]\n\
         masqueradeCIDRs: [10.200.0.0/24, 2001:db8:ee::/120]\n\
         nonMasqueradeSrcCIDRs: [{}/32, {}/128]\n",
        pod_ip(2),
        pod_ipv6(2)
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Ebpf,
    Iptables,
}

/// One connection the test makes: from which pod, to where, and whether it must leave with
/// the node's address.
struct Probe {
    pod: usize,
    destination: IpAddr,
    masqueraded: bool,
    why: &'static str,
}

fn probes() -> Vec<Probe> {
    let v4 = |text: &str| -> IpAddr { text.parse().unwrap_or_else(|error| panic!("{error}")) };
    let probe = |pod, destination, masqueraded, why| Probe {
        pod,
        destination,
        masqueraded,
        why,
    };
    vec![
        probe(
            1,
            IpAddr::V4(CLUSTER_PEER_IP),
            true,
            "the exception inside 10.0.0.0/8",
        ),
        probe(
            1,
            v4(OTHER_CLUSTER_IP),
            false,
            "10.0.0.0/8 outside the exception",
        ),
        probe(
            1,
            IpAddr::V4(OUTSIDE_IP),
            true,
            "outside, from a pod not exempt",
        ),
        probe(
            2,
            IpAddr::V4(OUTSIDE_IP),
            false,
            "outside, from the exempt pod",
        ),
        probe(
            2,
            IpAddr::V4(CLUSTER_PEER_IP),
            false,
            "the exception, from the exempt pod",
        ),
        probe(1, IpAddr::V6(EXEMPTABLE_IPV6), true, "the IPv6 exception"),
        probe(
            1,
            IpAddr::V6(OTHER_EXEMPT_IPV6),
            false,
            "the exempt /64 outside the exception",
        ),
        probe(
            1,
            IpAddr::V6(OUTSIDE_IPV6),
            true,
            "IPv6 outside, from a pod not exempt",
        ),
        probe(
            2,
            IpAddr::V6(OUTSIDE_IPV6),
            false,
            "IPv6 outside, from the exempt pod",
        ),
        probe(
            2,
            IpAddr::V6(EXEMPTABLE_IPV6),
            false,
            "the IPv6 exception, from the exempt pod",
        ),
    ]
}

fn exceptions_and_exempt_sources(sandbox: &Sandbox, backend: Backend) {
    sandbox.add_ipv6();
    sandbox.outside.ip(&[
        "addr",
        "add",
        &format!("{OTHER_CLUSTER_IP}/32"),
        "dev",
        "lo",
    ]);
    sandbox.router.ip(&[
        "route",
        "add",
        &format!("{OTHER_CLUSTER_IP}/32"),
        "via",
        &OUTSIDE_IP.to_string(),
    ]);
    sandbox.outside.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{OTHER_EXEMPT_IPV6}/128"),
        "dev",
        "lo",
    ]);
    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    volume.update(&[("ip-masq-agent", &config())]);
    let path = volume.key("ip-masq-agent");
    let path = path.to_string_lossy().into_owned();
    let mut args = vec!["--config", path.as_str(), "--enable-ipv6"];
    if backend == Backend::Iptables {
        args.extend(["--backend", "iptables"]);
    }
    let agent = Agent::start(sandbox, &args);
    let _servers = [
        tcp_server(&sandbox.outside, SocketAddr::from(([0, 0, 0, 0], PORT))),
        tcp_server(
            &sandbox.outside,
            SocketAddr::from((Ipv6Addr::UNSPECIFIED, PORT + 1)),
        ),
    ];

    for probe in probes() {
        let (node, pod, port) = if probe.destination.is_ipv6() {
            (
                IpAddr::V6(NODE_IPV6),
                IpAddr::V6(pod_ipv6(probe.pod)),
                PORT + 1,
            )
        } else {
            (IpAddr::V4(NODE_IP), IpAddr::V4(pod_ip(probe.pod)), PORT)
        };
        let seen = tcp_source(
            sandbox.pod(probe.pod),
            SocketAddr::new(probe.destination, port),
            TIMEOUT,
        )
        .to_canonical();
        let expected = if probe.masqueraded { node } else { pod };
        assert_eq!(
            seen,
            expected,
            "{backend:?}: pod {} to {} ({}) must leave with {expected}\n{}",
            probe.pod,
            probe.destination,
            probe.why,
            agent.log()
        );

        // `masq explain` in the node, on the agent's own config, says the same.
        let output = agent.masq_command(&[
            "explain",
            "--config",
            &path,
            "--enable-ipv6",
            "--source",
            &pod.to_string(),
            "--output",
            "json",
            &probe.destination.to_string(),
        ]);
        assert!(
            output.status.success(),
            "masq explain: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("masq explain printed no JSON: {error}"));
        assert_eq!(
            json[0]["masquerade"],
            serde_json::Value::Bool(probe.masqueraded),
            "explain disagrees on pod {} to {}: {json}",
            probe.pod,
            probe.destination
        );
    }

    for (list, family) in [
        ("nonMasqueradeCIDRs", "ipv4"),
        ("nonMasqueradeCIDRs", "ipv6"),
        ("masqueradeCIDRs", "ipv4"),
        ("masqueradeCIDRs", "ipv6"),
        ("nonMasqueradeSrcCIDRs", "ipv4"),
        ("nonMasqueradeSrcCIDRs", "ipv6"),
    ] {
        let series = format!("masq_config_list_cidrs{{list=\"{list}\",family=\"{family}\"}}");
        assert_eq!(agent.metric(&series), Some(1.0), "{series}");
    }
    if backend == Backend::Ebpf {
        // The exempt pod's packets are counted as such: its two connections per family, one
        // of them to a masquerade exception, handshake and data each.
        for family in ["ipv4", "ipv6"] {
            let series = format!(
                "masq_datapath_packets_total{{outcome=\"egress_exempt_source\",family=\"{family}\"}}"
            );
            let exempt = agent.metric(&series).unwrap_or(0.0);
            assert!(exempt >= 4.0, "{series} = {exempt}");
        }
    } else {
        let rules = String::from_utf8_lossy(
            &sandbox
                .node
                .exec("iptables", &["-w", "-t", "nat", "-S"])
                .stdout,
        )
        .into_owned();
        assert!(
            rules.contains(&format!("-A IP-MASQ-AGENT -s {}/32", pod_ip(2))),
            "{rules}"
        );
    }
    assert_eq!(sandbox.checksum_errors(), Vec::new());
}

in_both_attach_modes! {
fn the_ebpf_backend_masquerades_exceptions_and_spares_exempt_pods(attach_mode) {
    let sandbox = Sandbox::new("exc", SandboxOptions::in_mode(attach_mode));
    exceptions_and_exempt_sources(&sandbox, Backend::Ebpf);
}
}

#[test]
fn the_iptables_backend_masquerades_exceptions_and_spares_exempt_pods() {
    let sandbox = Sandbox::new("excipt", SandboxOptions::default());
    exceptions_and_exempt_sources(&sandbox, Backend::Iptables);
}
