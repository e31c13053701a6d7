//! The `masq` binary end to end: exit codes, upstream's messages on stderr, and output formats.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn masq(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_masq"))
        .args(args)
        .output()
        .expect("running masq")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

struct ConfigFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn config_file(contents: &str) -> ConfigFile {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ip-masq-agent");
    fs::write(&path, contents).expect("write config");
    ConfigFile { _dir: dir, path }
}

fn path_arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[test]
fn check_config_accepts_a_missing_file_as_defaults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("ip-masq-agent");
    let output = masq(&["check-config", "--config", &path_arg(&missing)]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("defaults (no file at"), "{text}");
    for cidr in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] {
        assert!(text.contains(cidr), "{text}");
    }
    assert!(text.contains("169.254.0.0/16 not masqueraded"), "{text}");
}

#[test]
fn check_config_prints_upstream_messages_verbatim() {
    let many: String = (0..65)
        .map(|index| format!("  - 10.{index}.0.0/16\n"))
        .collect();
    let cases = [
        (
            format!("nonMasqueradeCIDRs:\n{many}"),
            "the daemon can only accept up to 64 CIDRs (excluding link-local), but got 65 CIDRs (excluding link local)",
        ),
        (
            "nonMasqueradeCIDRs:\n  - abcdefg\n".to_owned(),
            r#"CIDR "abcdefg" could not be parsed, invalid CIDR address: abcdefg"#,
        ),
        (
            "nonMasqueradeCIDRs: [10.256.0.0/16]\n".to_owned(),
            r#"CIDR "10.256.0.0/16" could not be parsed, invalid CIDR address: 10.256.0.0/16"#,
        ),
        (
            "nonMasqueradeCIDRs: [10.0.0.1/8]\n".to_owned(),
            r#"CIDR "10.0.0.1/8" is not aligned to a CIDR block, ip: "10.0.0.1" network: "10.0.0.0/8""#,
        ),
        (
            "nonMasqueradeCIDRs: [fc00::/7]\n".to_owned(),
            "ipv6 is not enabled, but ipv6 cidr fc00::/7 provided. Enable ipv6 using --enable-ipv6 agent flag",
        ),
        (
            "*".to_owned(),
            "yaml: did not find expected alphabetic or numeric character",
        ),
        (
            "{*".to_owned(),
            "invalid character '*' looking for beginning of object key string",
        ),
        (
            r#"{"cidrLimit":"64"}"#.to_owned(),
            "json: cannot unmarshal string into Go struct field MasqConfig.cidrLimit of type int",
        ),
        (
            "resyncInterval: 60\n".to_owned(),
            "json: cannot unmarshal number into Go struct field MasqConfig.resyncInterval of type string",
        ),
    ];
    for (contents, message) in cases {
        let file = config_file(&contents);
        let output = masq(&["check-config", "--config", &path_arg(&file.path)]);
        assert_eq!(output.status.code(), Some(1), "{contents}");
        assert_eq!(stderr(&output), format!("{message}\n"), "{contents}");
        assert!(stdout(&output).is_empty());
    }
}

#[test]
fn check_config_honours_upstream_flags() {
    let file = config_file("nonMasqueradeCIDRs: [fc00::/7, 10.0.0.0/8]\nresyncInterval: 5m\n");
    let output = masq(&[
        "check-config",
        "--config",
        &path_arg(&file.path),
        "--enable-ipv6",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("fc00::/7") && text.contains("every 5m0s"),
        "{text}"
    );
    assert!(text.contains("fe80::/10 not masqueraded"), "{text}");

    let bad_ports = masq(&[
        "check-config",
        "--config",
        &path_arg(&file.path),
        "--enable-ipv6",
        "--to-ports=3-1",
    ]);
    assert_eq!(bad_ports.status.code(), Some(1));
    assert_eq!(
        stderr(&bad_ports),
        "Invalid --to-ports flag \"3-1\": first is greater than last in \"3-1\"\n"
    );
}

#[test]
fn explain_reports_decisions_as_json() {
    let file = config_file("nonMasqueradeCIDRs: [10.0.0.0/8, 10.1.0.0/16]\n");
    let output = masq(&[
        "explain",
        "--config",
        &path_arg(&file.path),
        "--output",
        "json",
        "10.1.2.3",
        "203.0.113.9",
        "169.254.169.254",
        "fc00::1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let decisions: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let origin = file.path.display().to_string();
    assert_eq!(
        decisions,
        serde_json::json!([
            {"destination": "10.1.2.3", "masquerade": false, "matched": "10.0.0.0/8",
             "list": "nonMasqueradeCIDRs", "origin": origin},
            {"destination": "203.0.113.9", "masquerade": true, "matched": null, "list": null,
             "origin": null},
            {"destination": "169.254.169.254", "masquerade": false, "matched": "169.254.0.0/16",
             "list": "link-local", "origin": null},
            {"destination": "fc00::1", "masquerade": false, "matched": null, "list": null,
             "origin": null},
        ])
    );
    let text = masq(&[
        "explain",
        "--config",
        &path_arg(&file.path),
        "203.0.113.9",
        "10.9.9.9",
    ]);
    let text = stdout(&text);
    assert!(
        text.contains("203.0.113.9  masquerade") && text.contains("matches 10.0.0.0/8"),
        "{text}"
    );
}

#[test]
fn explain_rejects_what_is_not_an_address() {
    let output = masq(&[
        "explain",
        "--config",
        "/nonexistent/ip-masq-agent",
        "not-an-ip",
    ]);
    assert_eq!(
        output.status.code(),
        Some(2),
        "clap usage errors exit with 2"
    );
}

#[test]
fn render_iptables_matches_upstream_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = path_arg(&dir.path().join("absent"));
    let output = masq(&["render-iptables", "--config", &missing]);
    assert!(output.status.success());
    assert_eq!(
        stdout(&output),
        concat!(
            "*nat\n",
            ":IP-MASQ-AGENT - [0:0]\n",
            "-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: local traffic is not subject to MASQUERADE\" -d 169.254.0.0/16 -j RETURN\n",
            "-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: local traffic is not subject to MASQUERADE\" -d 10.0.0.0/8 -j RETURN\n",
            "-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: local traffic is not subject to MASQUERADE\" -d 172.16.0.0/12 -j RETURN\n",
            "-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: local traffic is not subject to MASQUERADE\" -d 192.168.0.0/16 -j RETURN\n",
            "-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)\" -j MASQUERADE --random-fully\n",
            "COMMIT\n",
        )
    );

    let output = masq(&[
        "render-iptables",
        "--config",
        &missing,
        "-random-fully=false",
        "-masq-chain=MASQ",
        "--to-ports",
        "1024,65535",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let masq_line = r#"-A MASQ -m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE"#;
    assert!(text.starts_with("*nat\n:MASQ - [0:0]\n"), "{text}");
    assert!(
        text.contains(&format!(
            "{masq_line} -p tcp -m statistic --mode random --probability 0.5 --to-ports 1024\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{masq_line} -p sctp --to-ports 65535\n")),
        "{text}"
    );
    assert!(text.ends_with(&format!("{masq_line}\nCOMMIT\n")), "{text}");
}

#[test]
fn render_iptables_ipv6_needs_the_flag() {
    let file = config_file("nonMasqueradeCIDRs: [10.244.0.0/16, fc00::/7]\n");
    let without = masq(&[
        "render-iptables",
        "--config",
        &path_arg(&file.path),
        "--family",
        "ipv6",
    ]);
    assert_eq!(without.status.code(), Some(1));
    let with = masq(&[
        "render-iptables",
        "--config",
        &path_arg(&file.path),
        "--family",
        "ipv6",
        "--enable-ipv6",
    ]);
    assert!(with.status.success(), "{}", stderr(&with));
    let text = stdout(&with);
    assert!(
        text.contains("-d fe80::/10 -j RETURN\n") && text.contains("-d fc00::/7 -j RETURN\n"),
        "{text}"
    );
    assert!(!text.contains("10.244.0.0/16"), "{text}");
}

#[test]
fn directory_mode_reads_every_ip_masq_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::write(
        dir.path().join("ip-masq-agent"),
        "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
    )
    .expect("write");
    fs::write(
        dir.path().join("ip-masq-agent-reconciled"),
        "nonMasqueradeCIDRs: [100.64.0.0/10]\n",
    )
    .expect("write");
    let output = masq(&[
        "explain",
        "--config-dir",
        &path_arg(dir.path()),
        "--output",
        "json",
        "100.64.1.1",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let decisions: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(decisions[0]["matched"], "100.64.0.0/10");
}

#[test]
fn klog_flags_are_tolerated() {
    let output = masq(&[
        "check-config",
        "--config",
        "/nonexistent/file",
        "--v=2",
        "--logtostderr",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
}

/// The arguments the shipped DaemonSets pass must be ones `masq` accepts (the layouts' additions
/// are checked on the rendered manifests by masq-testbed's deploy tests).
#[test]
fn the_deployed_arguments_parse() {
    for manifest in ["base/daemonset.yaml", "uninstall/daemonset.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy")
            .join(manifest);
        let text = fs::read_to_string(&path).expect("manifest");
        let documents = yaml_rust2::YamlLoader::load_from_str(&text).expect("manifest YAML");
        let spec = &documents[0]["spec"]["template"]["spec"];
        let containers = spec["initContainers"]
            .as_vec()
            .into_iter()
            .flatten()
            .chain(spec["containers"].as_vec().into_iter().flatten());
        let mut checked = 0;
        for container in containers {
            let Some(args) = container["args"].as_vec() else {
                continue;
            };
            let mut args: Vec<&str> = args
                .iter()
                .map(|arg| arg.as_str().expect("string argument"))
                .collect();
            args.push("--help");
            let output = masq(&args);
            assert!(
                output.status.success(),
                "{manifest}: masq rejects {args:?}: {}",
                stderr(&output)
            );
            checked += 1;
        }
        assert!(checked > 0, "{manifest} runs masq with no arguments?");
    }
}

#[test]
fn agent_errors_are_logged_as_json_when_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pins = path_arg(&dir.path().join("not-bpffs"));
    let output = masq(&[
        "--log-format",
        "json",
        "agent",
        "--interface",
        "lo",
        "--pin-path",
        &pins,
        "--config",
        "/nonexistent/x",
    ]);
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    let line = text
        .lines()
        .find(|line| line.contains("\"level\":\"ERROR\""))
        .unwrap_or_else(|| panic!("{text}"));
    let record: serde_json::Value = serde_json::from_str(line).expect("a JSON log record");
    assert!(
        record["message"]
            .as_str()
            // Interfaces are checked before anything else (loopback's frames are neither
            // Ethernet nor bare IP).
            .is_some_and(|message| message.contains("lo has link type 772")),
        "{record}"
    );
}

/// The issue-26 example through the binary: "10.0.0.0/8 keeps pod IPs except 10.100.10.0/24"
/// and "never masquerade pods in 100.64.0.0/16", as `explain` judges it and as the rules say.
#[test]
fn masquerade_exceptions_and_exempt_sources_in_explain_and_the_rules() {
    let file = config_file(concat!(
        "nonMasqueradeCIDRs: [10.0.0.0/8]\n",
        "masqueradeCIDRs: [10.100.10.0/24]\n",
        "nonMasqueradeSrcCIDRs: [100.64.0.0/16]\n",
    ));
    let config = path_arg(&file.path);
    let explain = |source: Option<&str>, destination: &str| {
        let mut args = vec!["explain", "--config", &config, "-o", "json"];
        if let Some(source) = source {
            args.extend(["--source", source]);
        }
        args.push(destination);
        let output = masq(&args);
        assert!(output.status.success(), "{}", stderr(&output));
        let decisions: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        (
            decisions[0]["masquerade"].as_bool().expect("verdict"),
            decisions[0]["list"].as_str().unwrap_or("none").to_owned(),
        )
    };
    let pod = Some("10.244.1.5");
    assert_eq!(
        explain(pod, "10.100.10.7"),
        (true, "masqueradeCIDRs".into())
    );
    assert_eq!(
        explain(pod, "10.100.11.7"),
        (false, "nonMasqueradeCIDRs".into())
    );
    assert_eq!(explain(pod, "203.0.113.7"), (true, "none".into()));
    let exempt = Some("100.64.3.4");
    assert_eq!(
        explain(exempt, "203.0.113.7"),
        (false, "nonMasqueradeSrcCIDRs".into())
    );
    assert_eq!(
        explain(exempt, "10.100.10.7"),
        (false, "nonMasqueradeSrcCIDRs".into())
    );
    // Without a source only the destination is judged.
    assert_eq!(
        explain(None, "10.100.10.7"),
        (true, "masqueradeCIDRs".into())
    );

    let output = masq(&[
        "render-iptables",
        "--config",
        &config,
        "-random-fully=false",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let comment =
        |text: &str| format!("-A IP-MASQ-AGENT -m comment --comment \"ip-masq-agent: {text}\"");
    let keep = comment("local traffic is not subject to MASQUERADE");
    assert_eq!(
        stdout(&output),
        [
            "*nat".to_owned(),
            ":IP-MASQ-AGENT - [0:0]".to_owned(),
            format!(
                "{} -s 100.64.0.0/16 -j RETURN",
                comment("traffic from this source is not subject to MASQUERADE")
            ),
            format!(
                "{} -d 10.100.10.0/24 -j MASQUERADE",
                comment(
                    "traffic to this destination is subject to MASQUERADE (longest prefix first)"
                )
            ),
            format!("{keep} -d 169.254.0.0/16 -j RETURN"),
            format!("{keep} -d 10.0.0.0/8 -j RETURN"),
            format!(
                "{} -j MASQUERADE",
                comment("outbound traffic is subject to MASQUERADE (must be last in chain)")
            ),
            "COMMIT\n".to_owned(),
        ]
        .join("\n")
    );
}

#[test]
fn a_prefix_both_masqueraded_and_kept_is_refused_naming_both_origins() {
    let dir = tempfile::tempdir().expect("tempdir");
    let keeps = dir.path().join("ip-masq-keep");
    let masquerades = dir.path().join("ip-masq-exceptions");
    fs::write(&keeps, "nonMasqueradeCIDRs: [10.0.0.0/8, 10.100.10.0/24]\n").expect("write");
    fs::write(&masquerades, "masqueradeCIDRs: [10.100.10.0/24]\n").expect("write");
    let output = masq(&["check-config", "--config-dir", &path_arg(dir.path())]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    let message = stderr(&output);
    assert!(
        message.contains(&format!(
            "CIDR \"10.100.10.0/24\" is listed in both masqueradeCIDRs ({})",
            masquerades.display()
        )) && message.contains(&format!("\"10.100.10.0/24\" ({})", keeps.display())),
        "{message}"
    );
    // Either alone is fine.
    fs::remove_file(&keeps).expect("remove");
    let output = masq(&["check-config", "--config-dir", &path_arg(dir.path())]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("changes nothing"),
        "an exception with no range around it is flagged: {}",
        stdout(&output)
    );
}
