//! IPsec: an XFRM output policy that selects the node's address would protect masqueraded pod
//! traffic under MASQUERADE (netfilter looks the policy up again after SNAT) but not under
//! masq, which translates after the kernel's only lookup. The agent must say so (a warning
//! once per change, `masq_xfrm_policies_bypassed{family}`, a `masq status` line) for exactly
//! those policies, in both families, and follow policies as they come and go. The agent
//! holds only the DaemonSet's capabilities, so this also shows they suffice to read the
//! policies.

use std::time::Duration;

use masq_testbed::{
    agent::Agent,
    configmap::ConfigMapVolume,
    sandbox::{NODE_IP, NODE_IPV6, Sandbox, SandboxOptions},
    wait_for,
};

/// The warning's words, as the log has them.
const WARNING: &str = "select masqueraded traffic only after translation";

fn bypassed(agent: &Agent, family: &str) -> Option<f64> {
    agent.metric(&format!(
        r#"masq_xfrm_policies_bypassed{{family="{family}"}}"#
    ))
}

fn status_text(agent: &Agent) -> String {
    let output = agent.masq(&["status"]);
    assert!(
        output.status.success(),
        "masq status: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn warnings(agent: &Agent) -> usize {
    agent.log().matches(WARNING).count()
}

#[test]
fn policies_that_select_masqueraded_traffic_only_after_translation_are_reported() {
    let sandbox = Sandbox::new("ipsec", SandboxOptions::default());
    sandbox.add_ipv6();
    let node = &sandbox.node;
    let node_ip = NODE_IP.to_string();
    let node_ipv6 = NODE_IPV6.to_string();
    let policy = |args: &[&str]| {
        node.ip(&[&["xfrm", "policy"], args].concat());
    };
    let tunnel = |local: &str, peer: &str| -> Vec<String> {
        [
            "tmpl", "src", local, "dst", peer, "proto", "esp", "mode", "tunnel",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let add = |selector: &[&str], template: &[String]| {
        let mut args: Vec<&str> = vec!["add"];
        args.extend_from_slice(selector);
        args.extend(template.iter().map(String::as_str));
        policy(&args);
    };

    // None of these selects masqueraded traffic only after translation:
    // the whole source family (the pods' traffic matches before translation too),
    add(
        &["src", "0.0.0.0/0", "dst", "198.51.100.0/24", "dir", "out"],
        &tunnel(&node_ip, "198.51.100.254"),
    );
    add(
        &["src", "::/0", "dst", "2001:db8:ff::/64", "dir", "out"],
        &tunnel(&node_ipv6, "2001:db8:ff::fe"),
    );
    // a destination the default config does not masquerade (10.0.0.0/8),
    add(
        &[
            "src",
            &format!("{node_ip}/32"),
            "dst",
            "10.200.0.0/16",
            "dir",
            "out",
        ],
        &tunnel(&node_ip, "198.51.100.254"),
    );
    // an allow policy without templates (clear text either way),
    add(
        &[
            "src",
            &format!("{node_ip}/32"),
            "dst",
            "203.0.113.0/24",
            "dir",
            "out",
        ],
        &[],
    );
    // another direction,
    add(
        &[
            "src",
            &format!("{node_ip}/32"),
            "dst",
            "198.51.100.0/24",
            "dir",
            "fwd",
        ],
        &tunnel(&node_ip, "198.51.100.254"),
    );
    // and a source that is not the node's.
    add(
        &[
            "src",
            "192.0.2.77/32",
            "dst",
            "198.51.100.0/24",
            "dir",
            "out",
        ],
        &tunnel(&node_ip, "198.51.100.254"),
    );

    let mut volume = ConfigMapVolume::new(&format!("{}-cm", sandbox.tag));
    volume.update(&[("ip-masq-agent", "resyncInterval: 1s\n")]);
    let config = volume.key("ip-masq-agent").to_string_lossy().into_owned();
    let agent = Agent::start(&sandbox, &["--config", &config, "--enable-ipv6"]);
    wait_for("the first IPsec check", Duration::from_secs(5), || {
        bypassed(&agent, "ipv4").is_some()
    });
    assert_eq!(bypassed(&agent, "ipv4"), Some(0.0));
    assert_eq!(bypassed(&agent, "ipv6"), Some(0.0));
    let text = status_text(&agent);
    assert!(
        text.contains(
            "ipsec:        no XFRM output policy selects masqueraded traffic only after translation"
        ),
        "{text}"
    );
    assert_eq!(agent.status()["ipsec_bypassed"], serde_json::json!([]));
    assert_eq!(warnings(&agent), 0, "{}", agent.log());

    // A host-to-network tunnel for the node's own address, in each family: MASQUERADE's
    // second lookup would send masqueraded pod traffic through it.
    add(
        &[
            "src",
            &format!("{node_ip}/32"),
            "dst",
            "198.51.100.0/24",
            "dir",
            "out",
        ],
        &tunnel(&node_ip, "198.51.100.254"),
    );
    add(
        &[
            "src",
            &format!("{node_ipv6}/128"),
            "dst",
            "2001:db8:ff::/64",
            "dir",
            "out",
        ],
        &tunnel(&node_ipv6, "2001:db8:ff::fe"),
    );
    wait_for(
        "both policies to be reported",
        Duration::from_secs(10),
        || bypassed(&agent, "ipv4") == Some(1.0) && bypassed(&agent, "ipv6") == Some(1.0),
    );
    let text = status_text(&agent);
    assert!(
        text.contains(
            "ipsec:        2 XFRM output policies select masqueraded traffic only after translation"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  policy:     src {node_ip}/32 dst 198.51.100.0/24 dir out with IPsec"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  policy:     src {node_ipv6}/128 dst 2001:db8:ff::/64 dir out with IPsec"
        )),
        "{text}"
    );
    assert_eq!(
        agent.status()["ipsec_bypassed"].as_array().map(Vec::len),
        Some(2)
    );
    let log = agent.log();
    assert!(
        log.contains(WARNING) && log.contains("--backend iptables"),
        "{log}"
    );
    // Once per change, not once per resync.
    let reported = warnings(&agent);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(warnings(&agent), reported, "{}", agent.log());

    // Gone again: the metric follows, and the log says so.
    policy(&[
        "delete",
        "src",
        &format!("{node_ip}/32"),
        "dst",
        "198.51.100.0/24",
        "dir",
        "out",
    ]);
    policy(&[
        "delete",
        "src",
        &format!("{node_ipv6}/128"),
        "dst",
        "2001:db8:ff::/64",
        "dir",
        "out",
    ]);
    wait_for(
        "the policies to be forgotten",
        Duration::from_secs(10),
        || bypassed(&agent, "ipv4") == Some(0.0) && bypassed(&agent, "ipv6") == Some(0.0),
    );
    assert!(agent.log().contains("any more"), "{}", agent.log());
    let text = status_text(&agent);
    assert!(
        text.contains("ipsec:        no XFRM output policy"),
        "{text}"
    );
}
