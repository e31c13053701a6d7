//! What `kubectl apply -k` creates, checked on the rendered manifests: no ConfigMap of the
//! user's is ever shipped (so applying leaves it byte-identical and deleting never removes it),
//! every layout reads its config where ip-masq-agent's users keep it, runs on Linux nodes only,
//! with what bpffs and iptables need, probes where the agent listens, and updates without two
//! agents on a node. And docs/configuration.md documents every agent flag with its default.
//! Needs kubectl (cargo xtask test installs it), not root.

#![expect(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "helpers of these tests fail the test with the value that broke it"
)]

use std::{collections::BTreeMap, net::SocketAddr, process::Command};

use masq_testbed::{
    agent::masq_binary,
    manifest::{KUSTOMIZATIONS, container, deploy_dir, find, render, strings},
};
use serde_json::Value;

/// The layouts that run the agent, and what each adds to the base.
const AGENT_LAYOUTS: &[&str] = &[
    "",
    "overlays/upstream",
    "overlays/aks",
    "overlays/migrate",
    "examples/overlay",
];

fn agent(layout: &str) -> Value {
    find(&render(layout), "DaemonSet", "masq").clone()
}

fn volume<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|volume| volume["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

fn mount<'a>(container: &'a Value, path: &str) -> &'a Value {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|mount| mount["mountPath"] == path)
        .unwrap_or_else(|| panic!("nothing mounted at {path}"))
}

#[test]
fn no_kustomization_ships_a_configmap() {
    for kustomization in KUSTOMIZATIONS {
        let shipped: Vec<Value> = render(kustomization)
            .into_iter()
            .filter(|object| object["kind"] == "ConfigMap")
            .map(|object| object["metadata"]["name"].clone())
            .collect();
        assert!(
            shipped.is_empty(),
            "deploy/{kustomization} ships ConfigMap(s) {shipped:?}: `kubectl apply -k` would \
             overwrite the user's and `kubectl delete -k` would delete it"
        );
    }
}

#[test]
fn the_default_is_the_upstream_layout() {
    assert_eq!(render(""), render("overlays/upstream"));
}

#[test]
fn each_layout_reads_its_config_where_its_users_keep_it() {
    // kubernetes-sigs/ip-masq-agent: ConfigMap ip-masq-agent, key config, at
    // /etc/config/ip-masq-agent, optional.
    for layout in ["overlays/upstream", "overlays/migrate"] {
        let daemonset = agent(layout);
        let masq = container(&daemonset, "masq");
        let config = &volume(&daemonset, "config")["configMap"];
        assert_eq!(config["name"], "ip-masq-agent", "{layout}");
        assert_eq!(config["optional"], true, "{layout}");
        assert_eq!(
            config["items"],
            serde_json::json!([{"key": "config", "path": "ip-masq-agent"}]),
            "{layout}"
        );
        assert_eq!(mount(masq, "/etc/config")["name"], "config");
        let args = strings(&masq["args"]);
        assert!(
            args.contains(&"--config=/etc/config/ip-masq-agent".to_owned()),
            "{layout}: {args:?}"
        );
        assert!(!args.iter().any(|arg| arg.starts_with("--config-dir")));
    }
    // Azure ip-masq-agent-v2: a projected volume of the user's and the cloud's ConfigMaps.
    let daemonset = agent("overlays/aks");
    let masq = container(&daemonset, "masq");
    let sources = &volume(&daemonset, "config")["projected"]["sources"];
    assert_eq!(
        *sources,
        serde_json::json!([
            {"configMap": {"name": "azure-ip-masq-agent-config", "optional": true}},
            {"configMap": {"name": "azure-ip-masq-agent-config-reconciled", "optional": true}},
        ])
    );
    assert_eq!(mount(masq, "/etc/config")["name"], "config");
    let args = strings(&masq["args"]);
    assert!(
        args.contains(&"--config-dir=/etc/config".to_owned()),
        "{args:?}"
    );
    assert!(!args.iter().any(|arg| arg.starts_with("--config=")));
    // Only the migrate layout takes over from iptables.
    for layout in AGENT_LAYOUTS {
        let args = strings(&container(&agent(layout), "masq")["args"]);
        assert_eq!(
            args.contains(&"--take-over-iptables".to_owned()),
            *layout == "overlays/migrate",
            "{layout}: {args:?}"
        );
    }
}

/// Checks one container that touches bpffs: Linux only, AppArmor and SELinux that allow bpffs
/// writes (field and annotation), seccomp that allows bpf(), read-only root, no privilege.
fn assert_bpffs_ready(workload: &Value, name: &str, context: &str) {
    let pod = &workload["spec"]["template"];
    assert_eq!(
        pod["spec"]["nodeSelector"]["kubernetes.io/os"], "linux",
        "{context}: Windows nodes must not get the pod"
    );
    assert_eq!(
        pod["metadata"]["annotations"]
            [format!("container.apparmor.security.beta.kubernetes.io/{name}")],
        "unconfined",
        "{context}: AppArmor annotation for clusters before 1.30"
    );
    let container = container(workload, name);
    let security = &container["securityContext"];
    assert_eq!(
        security["appArmorProfile"]["type"], "Unconfined",
        "{context}"
    );
    assert_eq!(security["seLinuxOptions"]["type"], "spc_t", "{context}");
    assert_eq!(
        security["seccompProfile"]["type"], "Unconfined",
        "{context}"
    );
    assert_eq!(security["readOnlyRootFilesystem"], true, "{context}");
    assert_eq!(security["allowPrivilegeEscalation"], false, "{context}");
    assert_ne!(security["privileged"], true, "{context}");
    assert_eq!(
        strings(&security["capabilities"]["drop"]),
        ["ALL"],
        "{context}"
    );
    let bpffs = mount(container, "/sys/fs/bpf");
    assert_eq!(bpffs["mountPropagation"], "HostToContainer", "{context}");
    let volume = volume(workload, bpffs["name"].as_str().unwrap());
    assert_eq!(
        volume["hostPath"],
        serde_json::json!({"path": "/sys/fs/bpf", "type": "Directory"}),
        "{context}"
    );
}

#[test]
fn every_layout_runs_on_linux_nodes_with_what_bpffs_and_iptables_need() {
    for layout in AGENT_LAYOUTS {
        let daemonset = agent(layout);
        assert_bpffs_ready(&daemonset, "masq", layout);
        let masq = container(&daemonset, "masq");
        let mut expected = vec!["BPF", "PERFMON", "NET_ADMIN"];
        if *layout == "overlays/migrate" {
            // Reading and changing iptables-legacy rules goes through a raw socket.
            expected.push("NET_RAW");
        }
        assert_eq!(
            strings(&masq["securityContext"]["capabilities"]["add"]),
            expected,
            "{layout}"
        );
        // The host's xtables lock, not a private one, or iptables-legacy would not serialize
        // with the node's other iptables users.
        let lock = mount(masq, "/run/xtables.lock");
        assert_eq!(
            volume(&daemonset, lock["name"].as_str().unwrap())["hostPath"],
            serde_json::json!({"path": "/run/xtables.lock", "type": "FileOrCreate"}),
            "{layout}"
        );
        let volumes = daemonset["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap();
        assert!(
            volumes.iter().all(|volume| volume["emptyDir"].is_null()),
            "{layout}: an emptyDir would hide host paths"
        );
    }
    let uninstall = find(&render("uninstall"), "DaemonSet", "masq-uninstall").clone();
    assert_bpffs_ready(&uninstall, "uninstall", "uninstall");
    assert_eq!(
        strings(&container(&uninstall, "uninstall")["args"])[0],
        "uninstall"
    );
    assert_eq!(strings(&container(&uninstall, "done")["args"]), ["pause"]);
}

/// Where the agent listens, from its `--metrics-addr`.
fn metrics_addr(masq: &Value) -> SocketAddr {
    strings(&masq["args"])
        .iter()
        .find_map(|arg| arg.strip_prefix("--metrics-addr="))
        .expect("--metrics-addr")
        .parse()
        .unwrap()
}

#[test]
fn probes_reach_the_agent_where_it_listens_and_metrics_stay_on_loopback_by_default() {
    for layout in AGENT_LAYOUTS {
        let daemonset = agent(layout);
        let masq = container(&daemonset, "masq");
        let listening = metrics_addr(masq);
        let exposed = *layout == "examples/overlay";
        assert_eq!(
            listening.ip().is_loopback(),
            !exposed,
            "{layout}: only the metrics-on-node-address component exposes metrics"
        );
        let annotations = &daemonset["spec"]["template"]["metadata"]["annotations"];
        assert_eq!(
            annotations["prometheus.io/scrape"] == "true",
            exposed,
            "{layout}"
        );
        let ports: BTreeMap<String, u64> = masq["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|port| {
                (
                    port["name"].as_str().unwrap().to_owned(),
                    port["containerPort"].as_u64().unwrap(),
                )
            })
            .collect();
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let probe = &masq[probe];
            let get = &probe["httpGet"];
            // The kubelet shares the node's network namespace with a hostNetwork pod.
            assert_eq!(get["host"], "127.0.0.1", "{layout}");
            assert_eq!(get["path"], path, "{layout}");
            let port = get["port"]
                .as_u64()
                .or_else(|| ports.get(get["port"].as_str().unwrap()).copied())
                .unwrap();
            assert_eq!(port, u64::from(listening.port()), "{layout}");
            assert!(probe["timeoutSeconds"].as_u64() >= Some(5), "{layout}");
            assert!(probe["failureThreshold"].as_u64() >= Some(3), "{layout}");
        }
    }
}

#[test]
fn rolling_updates_never_put_two_agents_on_a_node() {
    for layout in AGENT_LAYOUTS {
        let strategy = &agent(layout)["spec"]["updateStrategy"];
        assert_eq!(strategy["type"], "RollingUpdate", "{layout}");
        assert_eq!(strategy["rollingUpdate"]["maxSurge"], 0, "{layout}");
        assert!(!strategy["rollingUpdate"]["maxUnavailable"].is_null());
    }
}

#[test]
fn the_images_are_the_one_cargo_xtask_image_builds() {
    // xtask tags the image with the workspace version; a version bump must move the manifests.
    let expected = format!("masq:{}", env!("CARGO_PKG_VERSION"));
    for kustomization in KUSTOMIZATIONS {
        for object in render(kustomization) {
            let spec = &object["spec"]["template"]["spec"];
            for list in ["containers", "initContainers"] {
                for container in spec[list].as_array().into_iter().flatten() {
                    let image = container["image"].as_str().unwrap();
                    if *kustomization == "examples/overlay" {
                        assert_eq!(image, format!("registry.example.com/{expected}"));
                    } else {
                        assert_eq!(image, expected, "deploy/{kustomization}");
                    }
                }
            }
        }
    }
}

#[test]
fn every_rendered_container_runs_masq_with_arguments_it_accepts() {
    let mut checked = 0;
    for kustomization in KUSTOMIZATIONS {
        for object in render(kustomization) {
            let spec = &object["spec"]["template"]["spec"];
            for list in ["initContainers", "containers"] {
                for container in spec[list].as_array().into_iter().flatten() {
                    assert!(
                        container["command"].is_null(),
                        "deploy/{kustomization}: the image has nothing but masq to run"
                    );
                    let mut args = strings(&container["args"]);
                    args.push("--help".to_owned());
                    let output = Command::new(masq_binary()).args(&args).output().unwrap();
                    assert!(
                        output.status.success(),
                        "deploy/{kustomization}: masq rejects {args:?}: {}",
                        String::from_utf8_lossy(&output.stderr)
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 7, "containers found");
}

/// `--flag` → the default `masq agent --help` prints for it, if any.
fn agent_flags() -> BTreeMap<String, Option<String>> {
    let output = Command::new(masq_binary())
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if (2..=6).contains(&indent) && trimmed.starts_with('-') {
            let long = trimmed
                .split([',', ' ', '[', '='])
                .find(|word| word.starts_with("--"))
                .map(str::to_owned);
            if let Some(long) = &long {
                flags.insert(long.clone(), None);
            }
            current = long;
        } else if let (Some(flag), Some(default)) = (
            &current,
            trimmed
                .strip_prefix("[default: ")
                .and_then(|rest| rest.strip_suffix(']')),
        ) {
            flags.insert(flag.clone(), Some(default.to_owned()));
        }
    }
    flags.remove("--help");
    flags.remove("--version");
    flags
}

#[test]
fn the_docs_document_every_agent_flag_with_its_default() {
    let reference = std::fs::read_to_string(deploy_dir().join("../docs/configuration.md")).unwrap();
    let section = reference
        .split("\n## Flags\n")
        .nth(1)
        .expect("docs/configuration.md has a `## Flags` section")
        .split("\n## ")
        .next()
        .unwrap();
    let rows: BTreeMap<String, String> = section
        .lines()
        .filter(|line| line.starts_with("| `--"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let flag = cells[0]
                .trim_start_matches("| `")
                .split(['`', ' ', '['])
                .next()
                .unwrap()
                .to_owned();
            (flag, cells.get(1).copied().unwrap_or_default().to_owned())
        })
        .collect();
    let flags = agent_flags();
    assert!(flags.len() > 20, "help parsed badly: {flags:?}");
    for (flag, default) in &flags {
        let row = rows
            .get(flag)
            .unwrap_or_else(|| panic!("docs/configuration.md's Flags table lacks {flag}"));
        if let Some(default) = default {
            assert!(
                row.contains(&format!("`{default}`")),
                "docs/configuration.md gives {flag} the default {row}, masq agent --help says {default}"
            );
        }
    }
    for flag in rows.keys() {
        assert!(
            flags.contains_key(flag),
            "docs/configuration.md documents {flag}, which masq agent does not take"
        );
    }
}
