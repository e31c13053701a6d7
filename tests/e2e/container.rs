//! The image `cargo xtask image` builds, run under podman exactly as the rendered DaemonSets run
//! it (image, arguments, capabilities, read-only root, seccomp/AppArmor/SELinux settings, the
//! node's bpffs, sysctls and xtables lock, ConfigMap volumes laid out as the kubelet writes them)
//! on a sandbox node: it masquerades, survives being killed without breaking a live flow, follows
//! ConfigMap swaps, takes over from an iptables-legacy ip-masq-agent chain with the migrate
//! layout, reads the AKS layout's ConfigMaps, explains a missing bpffs, and the uninstall
//! DaemonSet's containers leave nothing behind. Needs root, podman and the image.

#![expect(
    clippy::unwrap_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{
    fs,
    io::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4},
    path::{Path, PathBuf},
    process::Stdio,
    thread,
    time::{Duration, Instant},
};

use aya::programs::{SchedClassifier, TcAttachType};
use masq::iptables::render::postrouting_jump_args;
use masq_testbed::{
    agent::{http_get, masq_binary, uninstall_quietly},
    configmap::ConfigMapVolume,
    container::{Container, ContainerSpec},
    manifest::{container, find, render},
    netns::{Netns, unique_tag},
    sandbox::{
        CLUSTER_PEER_IP, NODE_IP, OUTSIDE_IP, Sandbox, SandboxOptions, UPLINK, link_node_to_router,
        pod_ip,
    },
    traffic::{HeldConnection, tcp_server, tcp_source, tcp_transfer},
};
use serde_json::Value;

const TIMEOUT: Duration = Duration::from_secs(10);
/// A second outside host, in a documentation range no config here exempts.
const FAR_IP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);

fn outside(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(OUTSIDE_IP, port)
}

fn any(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)
}

/// The source address a new TCP flow from pod 1 to `destination` arrives with.
fn arrives_from(sandbox: &Sandbox, destination: SocketAddrV4) -> IpAddr {
    tcp_source(sandbox.pod(1), destination, TIMEOUT)
}

fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// Gives the outside host a second address, [`FAR_IP`], routed like the first.
fn add_far_host(sandbox: &Sandbox) {
    sandbox
        .outside
        .ip(&["addr", "add", &format!("{FAR_IP}/32"), "dev", "eth0"]);
    sandbox.router.ip(&[
        "route",
        "add",
        &format!("{FAR_IP}/32"),
        "via",
        &OUTSIDE_IP.to_string(),
    ]);
}

fn rendered_daemonset(kustomization: &str, name: &str) -> Value {
    find(&render(kustomization), "DaemonSet", name).clone()
}

/// Removes the pins of a test's agent even when the test fails half-way.
struct Pins {
    node: PathBuf,
    path: PathBuf,
}

impl Pins {
    fn new(sandbox: &Sandbox) -> Self {
        Self {
            node: sandbox.node.path(),
            path: PathBuf::from("/sys/fs/bpf").join(&sandbox.tag),
        }
    }

    /// The agent's arguments for this sandbox: its uplink and these pins.
    fn args(&self) -> [String; 2] {
        [
            format!("--interface={UPLINK}"),
            format!("--pin-path={}", self.path.display()),
        ]
    }
}

impl Drop for Pins {
    fn drop(&mut self) {
        uninstall_quietly(&self.node, &self.path);
    }
}

/// The agent container of a rendered layout on the sandbox's node.
fn agent_spec(
    layout: &str,
    sandbox: &Sandbox,
    pins: &Pins,
    config: &ConfigMapVolume,
) -> (Value, ContainerSpec) {
    let daemonset = rendered_daemonset(layout, "masq");
    let args = pins.args();
    let spec = ContainerSpec::from_manifest(
        &daemonset,
        "masq",
        &sandbox.node,
        &[("config", config.dir())],
    )
    .with_args(&[&args[0], &args[1]]);
    (daemonset, spec)
}

/// Where the kubelet sends a probe of the agent container: `(address, path)`.
fn probe_target(daemonset: &Value, probe: &str) -> (SocketAddr, String) {
    let masq = container(daemonset, "masq");
    let get = &masq[probe]["httpGet"];
    let port = get["port"].as_u64().unwrap_or_else(|| {
        masq["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|port| port["name"] == get["port"])
            .and_then(|port| port["containerPort"].as_u64())
            .unwrap()
    });
    // Without a host the kubelet probes the pod IP, which is the node's with hostNetwork.
    let host: IpAddr = get["host"]
        .as_str()
        .map_or(IpAddr::V4(NODE_IP), |host| host.parse().unwrap());
    (
        SocketAddr::new(host, u16::try_from(port).unwrap()),
        get["path"].as_str().unwrap().to_owned(),
    )
}

/// Waits until the readiness probe, sent from the node as the kubelet sends it, succeeds.
fn wait_ready(sandbox: &Sandbox, daemonset: &Value, agent: &Container) {
    let (address, path) = probe_target(daemonset, "readinessProbe");
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if !agent.running() {
            panic!("the agent container exited:\n{}", agent.logs());
        }
        if http_get(&sandbox.node.path(), address, &path)
            .is_some_and(|(status, _)| status.contains(" 200 "))
        {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
    panic!("the agent is not ready after 20s:\n{}", agent.logs());
}

fn reserved_ports(netns: &Netns) -> String {
    let output = netns.exec("cat", &["/proc/sys/net/ipv4/ip_local_reserved_ports"]);
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn the_default_daemonset_masquerades_survives_a_kill_follows_configmap_swaps_and_uninstalls() {
    let sandbox = Sandbox::new("ctr", SandboxOptions::default());
    add_far_host(&sandbox);
    let pins = Pins::new(&sandbox);
    let mut config = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    config.update(&[("ip-masq-agent", "nonMasqueradeCIDRs: [10.0.0.0/8]\n")]);
    let host_reserved = fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap();
    let _server = tcp_server(&sandbox.outside, any(8080));

    let (daemonset, spec) = agent_spec("", &sandbox, &pins, &config);
    // With ports masq's alone, as an operator appends them (see docs/operating.md): the
    // reservation shows that sysctl writes reach the node through the sysctl mount.
    let mut agent = Container::start(&sandbox.tag, spec.with_args(&["--to-ports=1024-29999"]));
    wait_ready(&sandbox, &daemonset, &agent);
    let (live, path) = probe_target(&daemonset, "livenessProbe");
    assert!(
        http_get(&sandbox.node.path(), live, &path)
            .is_some_and(|(status, _)| status.contains(" 200 ")),
        "the liveness probe fails"
    );
    // Health and metrics are on the node's loopback, not on its addresses.
    let on_node_ip = SocketAddr::new(IpAddr::V4(NODE_IP), live.port());
    assert!(
        http_get(&sandbox.node.path(), on_node_ip, "/metrics").is_none(),
        "metrics are served on the node address"
    );

    let far = SocketAddrV4::new(FAR_IP, 8080);
    assert_eq!(arrives_from(&sandbox, outside(8080)), IpAddr::V4(NODE_IP));
    assert_eq!(arrives_from(&sandbox, far), IpAddr::V4(NODE_IP));
    assert_eq!(
        arrives_from(&sandbox, SocketAddrV4::new(CLUSTER_PEER_IP, 8080)),
        IpAddr::V4(pod_ip(1))
    );
    // The port reservation went to the node's namespace through the sysctl mount, not to this
    // machine's.
    assert_eq!(reserved_ports(&sandbox.node), "1024-29999");
    assert_eq!(
        fs::read_to_string("/proc/sys/net/ipv4/ip_local_reserved_ports").unwrap(),
        host_reserved
    );

    // Killed like a crashed or evicted pod: the live flow keeps its translation throughout.
    let mut held = sandbox
        .pod(1)
        .enter(|| HeldConnection::open(outside(8080), "held", None, TIMEOUT))
        .unwrap();
    assert_eq!(held.peer.ip(), IpAddr::V4(NODE_IP));
    agent.kill();
    held.echo("while the pod is gone")
        .expect("the live flow broke when the agent was killed");
    agent.restart();
    wait_ready(&sandbox, &daemonset, &agent);
    assert!(
        agent.logs().contains("adopted the pinned maps"),
        "{}",
        agent.logs()
    );
    held.echo("after the restart")
        .expect("the live flow broke across the restart");

    // The kubelet swaps ..data: the outside network becomes exempt for new flows only.
    config.update(&[(
        "ip-masq-agent",
        "nonMasqueradeCIDRs: [10.0.0.0/8, 198.51.100.0/24]\n",
    )]);
    wait_for("the ConfigMap update", Duration::from_secs(5), || {
        arrives_from(&sandbox, outside(8080)) == IpAddr::V4(pod_ip(1))
    });
    assert_eq!(arrives_from(&sandbox, far), IpAddr::V4(NODE_IP));
    held.echo("after the swap")
        .expect("the config change broke a live flow");

    // Stopped as the kubelet stops it: SIGTERM, a clean exit, and the datapath stays.
    assert_eq!(
        agent.stop(Duration::from_secs(30)),
        Some(0),
        "{}",
        agent.logs()
    );
    held.echo("with the agent stopped")
        .expect("the live flow broke when the agent stopped");
    drop(held);

    // The uninstall DaemonSet: its init container cleans the node, its main container idles
    // until deleted.
    let uninstall = rendered_daemonset("uninstall", "masq-uninstall");
    let pin_arg = pins.args()[1].clone();
    let cleaned = ContainerSpec::from_manifest(&uninstall, "uninstall", &sandbox.node, &[])
        .with_args(&[&pin_arg])
        .run_to_completion();
    assert!(
        cleaned.status.success(),
        "masq uninstall failed: {}{}",
        String::from_utf8_lossy(&cleaned.stdout),
        String::from_utf8_lossy(&cleaned.stderr)
    );
    assert!(!pins.path.exists(), "pins left behind");
    assert_eq!(
        reserved_ports(&sandbox.node),
        "",
        "the port reservation is left"
    );
    let attached = sandbox.node.enter(|| {
        [TcAttachType::Egress, TcAttachType::Ingress].map(|hook| {
            SchedClassifier::query_tcx(UPLINK, hook)
                .map(|(_, programs)| programs.len())
                .unwrap_or(usize::MAX)
        })
    });
    assert_eq!(attached, [0, 0], "programs still attached to the uplink");
    assert_eq!(arrives_from(&sandbox, far), IpAddr::V4(pod_ip(1)));

    let mut done = Container::start(
        &sandbox.tag,
        ContainerSpec::from_manifest(&uninstall, "done", &sandbox.node, &[]),
    );
    thread::sleep(Duration::from_millis(500));
    assert!(done.running(), "the idle container exited: {}", done.logs());
    let stopping = Instant::now();
    assert_eq!(
        done.stop(Duration::from_secs(10)),
        Some(0),
        "{}",
        done.logs()
    );
    assert!(
        stopping.elapsed() < Duration::from_secs(5),
        "masq pause ignored SIGTERM"
    );
}

#[test]
fn a_restarted_agent_attaches_anew_when_the_uplink_was_recreated() {
    let sandbox = Sandbox::new("cupl", SandboxOptions::default());
    add_far_host(&sandbox);
    let pins = Pins::new(&sandbox);
    let config = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    let _server = tcp_server(&sandbox.outside, any(8080));
    let (daemonset, spec) = agent_spec("", &sandbox, &pins, &config);
    let mut agent = Container::start(&sandbox.tag, spec);
    wait_ready(&sandbox, &daemonset, &agent);
    agent.kill();

    // The node's uplink is deleted and created again under the same name: the pinned links now
    // point at a device that is gone.
    let (node, router) = (&sandbox.node, &sandbox.router);
    node.ip(&["link", "del", UPLINK]);
    link_node_to_router(node, router);

    agent.restart();
    wait_ready(&sandbox, &daemonset, &agent);
    // The old interface index is gone: its attachment is dropped, the new one attached.
    assert!(
        agent
            .logs()
            .contains("no longer translating on this interface"),
        "{}",
        agent.logs()
    );
    assert_eq!(
        arrives_from(&sandbox, SocketAddrV4::new(FAR_IP, 8080)),
        IpAddr::V4(NODE_IP)
    );
}

#[test]
fn the_migrate_layout_takes_over_an_iptables_legacy_ip_masq_agent_chain() {
    let sandbox = Sandbox::new("cmig", SandboxOptions::default());
    add_far_host(&sandbox);
    let pins = Pins::new(&sandbox);
    let mut config = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    config.update(&[("ip-masq-agent", "nonMasqueradeCIDRs: [10.0.0.0/8]\n")]);
    let _server = tcp_server(&sandbox.outside, any(8080));

    // What a running ip-masq-agent on an iptables-legacy node leaves: its chain, written with
    // iptables-restore, and the POSTROUTING jump.
    let rendered = std::process::Command::new(masq_binary())
        .args(["render-iptables", "--config"])
        .arg(config.key("ip-masq-agent"))
        .output()
        .unwrap();
    assert!(rendered.status.success());
    let mut restore = sandbox
        .node
        .command("iptables-legacy-restore")
        .arg("--noflush")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    restore
        .stdin
        .take()
        .unwrap()
        .write_all(&rendered.stdout)
        .unwrap();
    assert!(restore.wait().unwrap().success());
    let jump = postrouting_jump_args("IP-MASQ-AGENT");
    let mut append = vec!["-t", "nat", "-A", "POSTROUTING"];
    append.extend(jump.iter().map(String::as_str));
    sandbox.node.exec("iptables-legacy", &append);
    let far = SocketAddrV4::new(FAR_IP, 8080);
    assert_eq!(arrives_from(&sandbox, far), IpAddr::V4(NODE_IP));

    let (daemonset, spec) = agent_spec("overlays/migrate", &sandbox, &pins, &config);
    // MASQUERADE keeps the pod's ephemeral port, and so does masq on its default shared
    // ports: a range of masq's own tells which of the two translated the flow.
    let agent = Container::start(&sandbox.tag, spec.with_args(&["--to-ports=1024-29999"]));
    wait_ready(&sandbox, &daemonset, &agent);
    let logs = agent.logs();
    assert!(logs.contains("using iptables-legacy"), "{logs}");
    assert!(logs.contains("took over from iptables"), "{logs}");
    let rules = sandbox.node.exec("iptables-legacy", &["-t", "nat", "-S"]);
    let rules = String::from_utf8_lossy(&rules.stdout);
    assert!(
        !rules.contains("IP-MASQ-AGENT"),
        "the chain survived the take-over: {rules}"
    );
    // Now masq masquerades: the flow gets a port from the range masq was given.
    let transfer = sandbox
        .pod(1)
        .enter(|| tcp_transfer(far, "after", b"after", TIMEOUT))
        .unwrap();
    assert_eq!(transfer.peer.ip(), IpAddr::V4(NODE_IP));
    assert!(
        (1024..=29_999).contains(&transfer.peer.port()),
        "{}",
        transfer.peer
    );
    assert_eq!(
        arrives_from(&sandbox, SocketAddrV4::new(CLUSTER_PEER_IP, 8080)),
        IpAddr::V4(pod_ip(1))
    );
}

#[test]
fn the_aks_layout_merges_the_users_and_the_clouds_configmaps() {
    let sandbox = Sandbox::new("caks", SandboxOptions::default());
    add_far_host(&sandbox);
    let pins = Pins::new(&sandbox);
    // The projected volume holds both ConfigMaps' keys in one kubelet-written directory.
    let mut config = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    config.update(&[
        ("ip-masq-agent", "nonMasqueradeCIDRs: [198.51.100.0/24]\n"),
        (
            "ip-masq-agent-reconciled",
            "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqLinkLocal: true\n",
        ),
    ]);
    let _server = tcp_server(&sandbox.outside, any(8080));
    let (daemonset, spec) = agent_spec("overlays/aks", &sandbox, &pins, &config);
    let agent = Container::start(&sandbox.tag, spec);
    wait_ready(&sandbox, &daemonset, &agent);
    assert_eq!(arrives_from(&sandbox, outside(8080)), IpAddr::V4(pod_ip(1)));
    assert_eq!(
        arrives_from(&sandbox, SocketAddrV4::new(CLUSTER_PEER_IP, 8080)),
        IpAddr::V4(pod_ip(1))
    );
    assert_eq!(
        arrives_from(&sandbox, SocketAddrV4::new(FAR_IP, 8080)),
        IpAddr::V4(NODE_IP)
    );
}

#[test]
fn without_a_bpffs_the_agent_exits_naming_the_fix() {
    // A node without bpffs: the DaemonSet's hostPath then mounts a plain directory.
    let node = Netns::new(&format!("{}-node", unique_tag("cbpf")));
    // An uplink that passes the interface checks, which come before the pin path's.
    node.ip(&[
        "link", "add", "up0", "type", "veth", "peer", "name", "up0peer",
    ]);
    node.ip(&["addr", "add", "192.0.2.1/24", "dev", "up0"]);
    node.ip(&["link", "set", "up0", "up"]);
    let plain = std::env::temp_dir().join(format!("{}-not-bpffs", node.name()));
    fs::create_dir_all(&plain).unwrap();
    let config = ConfigMapVolume::new(&format!("{}-cm", node.name()));
    let daemonset = rendered_daemonset("", "masq");
    let pin_path = Path::new("/sys/fs/bpf").join(node.name());
    let spec = ContainerSpec::from_manifest(&daemonset, "masq", &node, &[("config", config.dir())])
        .with_mount("/sys/fs/bpf", &plain)
        .with_args(&[
            "--interface=up0",
            &format!("--pin-path={}", pin_path.display()),
        ]);
    let output = spec.run_to_completion();
    let _ = fs::remove_dir_all(&plain);
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{printed}");
    assert!(
        printed.contains("is not on a bpf filesystem")
            && printed.contains("mount -t bpf bpf /sys/fs/bpf")
            && printed.contains("/etc/fstab"),
        "{printed}"
    );
}
