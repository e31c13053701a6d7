//! The input upstream hands to `iptables-restore --noflush`, byte for byte, and the arguments of
//! the POSTROUTING jump it ensures separately.

use std::fmt::Write as _;

use crate::{
    config::cidr::{Cidr, Family},
    policy::{Policy, RuleKind},
    ports::{TO_PORTS_PROTOCOLS, ToPorts},
};

/// Comment of every `RETURN` rule, pre-joined as upstream keeps it.
pub const NON_MASQ_RULE_COMMENT: &str =
    r#"-m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE""#;
/// Comment of every `MASQUERADE` rule.
pub const MASQ_RULE_COMMENT: &str = r#"-m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)""#;
/// Comment of the `RETURN` rule of a `nonMasqueradeSrcCIDRs` entry (masq's own key).
pub const NON_MASQ_SOURCE_RULE_COMMENT: &str = r#"-m comment --comment "ip-masq-agent: traffic from this source is not subject to MASQUERADE""#;
/// Comment of the `MASQUERADE` rules of a `masqueradeCIDRs` entry (masq's own key).
pub const MASQ_EXCEPTION_RULE_COMMENT: &str = r#"-m comment --comment "ip-masq-agent: traffic to this destination is subject to MASQUERADE (longest prefix first)""#;
/// Upstream's default chain name.
pub const DEFAULT_CHAIN: &str = "IP-MASQ-AGENT";

/// What shapes the rules besides the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleOptions {
    /// `--masq-chain`.
    pub chain: String,
    /// `--random-fully`, already combined with whether iptables supports it.
    pub random_fully: bool,
    /// `--to-ports`.
    pub to_ports: ToPorts,
}

/// The `iptables-restore` input for `family` (use `ip6tables-restore` for IPv6): the policy's
/// rules in chain order, then upstream's final `MASQUERADE`. A `masqueradeCIDRs` rule
/// masquerades exactly as the final rule does (the same `--random-fully` and `--to-ports`),
/// for its destinations only.
pub fn restore_input(policy: &Policy, family: Family, options: &RuleOptions) -> String {
    let chain = &options.chain;
    let mut text = format!("*nat\n:{chain} - [0:0]\n");
    let mut push_lines = |lines: Vec<String>| {
        for line in lines {
            text.push_str(&line);
            text.push('\n');
        }
    };
    for rule in policy.rules(family) {
        match rule.kind {
            RuleKind::Masquerade(_) => push_lines(masquerade_lines(
                options,
                MASQ_EXCEPTION_RULE_COMMENT,
                Some(&rule.cidr),
            )),
            RuleKind::Source(_) => push_lines(vec![format!(
                "-A {chain} {NON_MASQ_SOURCE_RULE_COMMENT} -s {} -j RETURN",
                rule.cidr
            )]),
            RuleKind::LinkLocal | RuleKind::Configured(_) => push_lines(vec![format!(
                "-A {chain} {NON_MASQ_RULE_COMMENT} -d {} -j RETURN",
                rule.cidr
            )]),
        }
    }
    push_lines(masq_rules(options));
    text.push_str("COMMIT\n");
    text
}

/// Upstream's `writeMasqRules`: per protocol and interval a `MASQUERADE --to-ports` rule that
/// takes its share of the remaining ports at random, then the catch-all.
pub fn masq_rules(options: &RuleOptions) -> Vec<String> {
    masquerade_lines(options, MASQ_RULE_COMMENT, None)
}

/// [`masq_rules`] with `comment`, for traffic to `destination` only when given.
fn masquerade_lines(
    options: &RuleOptions,
    comment: &str,
    destination: Option<&Cidr>,
) -> Vec<String> {
    let chain = &options.chain;
    let to = destination.map_or_else(String::new, |cidr| format!(" -d {cidr}"));
    let masquerade = if options.random_fully {
        format!("-A {chain} {comment}{to} -j MASQUERADE --random-fully")
    } else {
        format!("-A {chain} {comment}{to} -j MASQUERADE")
    };
    let mut lines = Vec::new();
    for protocol in TO_PORTS_PROTOCOLS {
        let mut remaining = options.to_ports.size();
        for interval in &options.to_ports.intervals {
            let mut line = format!("{masquerade} -p {protocol}");
            if remaining != interval.size() {
                let _ = write!(
                    line,
                    " -m statistic --mode random --probability {}",
                    probability(interval.size(), remaining)
                );
            }
            let _ = write!(line, " --to-ports {}", interval.to_go_string());
            lines.push(line);
            remaining -= interval.size();
        }
    }
    lines.push(masquerade);
    lines
}

/// `strconv.FormatFloat(share/remaining, 'f', -1, 64)`: the shortest decimal that round-trips,
/// never in exponent form, which is what Rust's `Display` for `f64` produces.
#[expect(
    clippy::cast_precision_loss,
    reason = "upstream divides Go ints converted to float64"
)]
fn probability(share: i64, remaining: i64) -> String {
    (share as f64 / remaining as f64).to_string()
}

/// The comment of the POSTROUTING jump (without quotes since upstream v2.12.2).
pub fn postrouting_jump_comment(chain: &str) -> String {
    format!(
        "ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom {chain} chain"
    )
}

/// The arguments of the jump upstream ensures (`-C` then `-A POSTROUTING -t nat ...`).
pub fn postrouting_jump_args(chain: &str) -> Vec<String> {
    [
        "-m",
        "comment",
        "--comment",
        &postrouting_jump_comment(chain),
        "-m",
        "addrtype",
        "!",
        "--dst-type",
        "LOCAL",
        "-j",
        chain,
    ]
    .iter()
    .map(|&arg| arg.to_owned())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::source::test_config;

    fn policy(
        cidrs: &[&str],
        masq_link_local: bool,
        masq_link_local_ipv6: bool,
        enable_ipv6: bool,
    ) -> Policy {
        let config = test_config(cidrs, masq_link_local, masq_link_local_ipv6);
        Policy::new(&config, enable_ipv6)
    }

    fn options(random_fully: bool, to_ports: &str) -> RuleOptions {
        RuleOptions {
            chain: DEFAULT_CHAIN.to_owned(),
            random_fully,
            to_ports: if to_ports.is_empty() {
                ToPorts::default()
            } else {
                ToPorts::parse(to_ports).expect("to-ports")
            },
        }
    }

    const RETURN: &str = r#"-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: local traffic is not subject to MASQUERADE" -d "#;
    const MASQ: &str = r#"-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)" -j MASQUERADE"#;

    fn expected(cidrs: &[&str], masq_line: &str) -> String {
        let mut text = String::from("*nat\n:IP-MASQ-AGENT - [0:0]\n");
        for cidr in cidrs {
            text.push_str(&format!("{RETURN}{cidr} -j RETURN\n"));
        }
        text.push_str(masq_line);
        text.push_str("\nCOMMIT\n");
        text
    }

    #[test]
    fn upstream_sync_masq_rules_cases() {
        for (random_fully, suffix) in [(false, ""), (true, " --random-fully")] {
            let masq_line = format!("{MASQ}{suffix}");
            let opts = options(random_fully, "");
            assert_eq!(
                restore_input(&policy(&[], false, false, false), Family::Ipv4, &opts),
                expected(&["169.254.0.0/16"], &masq_line),
                "empty config"
            );
            let defaults = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];
            assert_eq!(
                restore_input(&policy(&defaults, false, false, false), Family::Ipv4, &opts),
                expected(
                    &[
                        "169.254.0.0/16",
                        "10.0.0.0/8",
                        "172.16.0.0/12",
                        "192.168.0.0/16"
                    ],
                    &masq_line
                ),
                "default config masquerading reserved ranges"
            );
            let reserved = [
                "10.0.0.0/8",
                "172.16.0.0/12",
                "192.168.0.0/16",
                "100.64.0.0/10",
                "192.0.0.0/24",
                "192.0.2.0/24",
                "192.88.99.0/24",
                "198.18.0.0/15",
                "198.51.100.0/24",
                "203.0.113.0/24",
                "240.0.0.0/4",
            ];
            let mut with_link_local = vec!["169.254.0.0/16"];
            with_link_local.extend(reserved);
            assert_eq!(
                restore_input(&policy(&reserved, false, false, false), Family::Ipv4, &opts),
                expected(&with_link_local, &masq_line),
                "default config not masquerading reserved ranges"
            );
            assert_eq!(
                restore_input(
                    &policy(&["10.244.0.0/16", "fc00::/7"], false, false, true),
                    Family::Ipv4,
                    &opts
                ),
                expected(&["169.254.0.0/16", "10.244.0.0/16"], &masq_line),
                "config has ipv4 and ipv6 non masquerade cidr"
            );
        }
    }

    #[test]
    fn upstream_sync_masq_rules_ipv6_cases() {
        let opts = options(true, "");
        let masq_line = format!("{MASQ} --random-fully");
        assert_eq!(
            restore_input(&policy(&[], false, false, true), Family::Ipv6, &opts),
            expected(&["fe80::/10"], &masq_line)
        );
        assert_eq!(
            restore_input(
                &policy(&["10.244.0.0/16", "fc00::/7"], false, false, true),
                Family::Ipv6,
                &opts
            ),
            expected(&["fe80::/10", "fc00::/7"], &masq_line)
        );
        assert_eq!(
            restore_input(
                &policy(&["10.244.0.0/16", "fc00::/7"], false, true, true),
                Family::Ipv6,
                &opts
            ),
            expected(&["fc00::/7"], &masq_line)
        );
    }

    #[test]
    fn the_default_restore_input_byte_for_byte() {
        let defaults = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];
        let text = restore_input(
            &policy(&defaults, false, false, false),
            Family::Ipv4,
            &options(true, ""),
        );
        assert_eq!(
            text,
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
    }

    /// Upstream's `TestWriteMasqRules`, for both random-fully settings.
    #[test]
    fn upstream_write_masq_rules_cases() {
        for (random_fully, suffix) in [(false, ""), (true, " --random-fully")] {
            let l = format!("{MASQ}{suffix}");
            let per_protocol = |lines: &dyn Fn(&str) -> Vec<String>| {
                let mut all: Vec<String> = ["tcp", "udp", "sctp"]
                    .iter()
                    .flat_map(|protocol| lines(protocol))
                    .collect();
                all.push(l.clone());
                all
            };
            assert_eq!(
                masq_rules(&options(random_fully, "")),
                vec![l.clone()],
                "default"
            );
            assert_eq!(
                masq_rules(&options(random_fully, "1024-29999")),
                per_protocol(&|p| vec![format!("{l} -p {p} --to-ports 1024-29999")]),
                "single range"
            );
            assert_eq!(
                masq_rules(&options(random_fully, "1024-29999,32768-65535")),
                per_protocol(&|p| vec![
                    format!(
                        "{l} -p {p} -m statistic --mode random --probability 0.469292562840114 --to-ports 1024-29999"
                    ),
                    format!("{l} -p {p} --to-ports 32768-65535"),
                ]),
                "double ranges"
            );
            assert_eq!(
                masq_rules(&options(random_fully, "1024-29999,32768-49151,61000-65535")),
                per_protocol(&|p| vec![
                    format!(
                        "{l} -p {p} -m statistic --mode random --probability 0.5807279140612474 --to-ports 1024-29999"
                    ),
                    format!(
                        "{l} -p {p} -m statistic --mode random --probability 0.7831739961759082 --to-ports 32768-49151"
                    ),
                    format!("{l} -p {p} --to-ports 61000-65535"),
                ]),
                "triple ranges"
            );
            assert_eq!(
                masq_rules(&options(random_fully, "1024,65535")),
                per_protocol(&|p| vec![
                    format!(
                        "{l} -p {p} -m statistic --mode random --probability 0.5 --to-ports 1024"
                    ),
                    format!("{l} -p {p} --to-ports 65535"),
                ]),
                "individual ports"
            );
        }
    }

    #[test]
    fn probabilities_format_like_go() {
        assert_eq!(probability(1, 3), "0.3333333333333333");
        assert_eq!(probability(2, 3), "0.6666666666666666");
        assert_eq!(probability(1, 7), "0.14285714285714285");
        assert_eq!(probability(1, 10), "0.1");
        assert_eq!(probability(3, 7), "0.42857142857142855");
        assert_eq!(probability(3, 4), "0.75");
        assert_eq!(probability(1, 10_000_000), "0.0000001");
        let overlapping = masq_rules(&options(false, "5-5,5-5,5-5"));
        assert!(overlapping[0].contains("--probability 0.3333333333333333 --to-ports 5"));
        assert!(overlapping[1].contains("--probability 0.5 --to-ports 5"));
        assert!(!overlapping[2].contains("statistic"));
    }

    #[test]
    fn other_chains_and_the_jump() {
        let opts = RuleOptions {
            chain: "MASQ-TEST".to_owned(),
            random_fully: false,
            to_ports: ToPorts::default(),
        };
        let text = restore_input(&policy(&[], true, false, false), Family::Ipv4, &opts);
        assert_eq!(
            text,
            "*nat\n:MASQ-TEST - [0:0]\n-A MASQ-TEST -m comment --comment \"ip-masq-agent: outbound traffic is subject to MASQUERADE (must be last in chain)\" -j MASQUERADE\nCOMMIT\n"
        );
        assert_eq!(
            postrouting_jump_args("IP-MASQ-AGENT").join(" "),
            "-m comment --comment ip-masq-agent: ensure nat POSTROUTING directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain -m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT"
        );
    }

    #[test]
    fn exceptions_masquerade_like_the_final_rule_and_sources_return_first() {
        let mut config = test_config(&["10.0.0.0/8", "fd00::/8"], false, false);
        let sourced = |text: &str| crate::config::source::SourcedCidr {
            cidr: Cidr::parse(text).expect("cidr"),
            origin: crate::config::source::CidrOrigin::Default,
        };
        config.masquerade_cidrs = vec![sourced("10.100.10.0/24"), sourced("fd00:1::/32")];
        config.non_masquerade_src_cidrs = vec![sourced("100.64.0.0/16")];
        let policy = Policy::new(&config, true);
        let text = restore_input(
            &policy,
            Family::Ipv4,
            &options(true, "1024-29999,32768-65535"),
        );
        let exception = r#"-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: traffic to this destination is subject to MASQUERADE (longest prefix first)" -d 10.100.10.0/24 -j MASQUERADE --random-fully"#;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.get(2).copied(),
            Some(
                r#"-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: traffic from this source is not subject to MASQUERADE" -s 100.64.0.0/16 -j RETURN"#
            )
        );
        // The exception takes the final rule's ports, protocol by protocol, then its catch-all.
        assert_eq!(
            lines.get(3).copied(),
            Some(format!("{exception} -p tcp -m statistic --mode random --probability 0.469292562840114 --to-ports 1024-29999").as_str())
        );
        assert_eq!(lines.get(9).copied(), Some(exception));
        assert_eq!(
            lines.get(10).copied(),
            Some(format!("{RETURN}169.254.0.0/16 -j RETURN").as_str())
        );
        assert_eq!(
            lines.get(11).copied(),
            Some(format!("{RETURN}10.0.0.0/8 -j RETURN").as_str())
        );
        assert_eq!(lines.len(), 2 + 1 + 7 + 2 + 7 + 1, "{text}");
        // The IPv6 chain has no source exemption of its family, but an exception.
        let v6 = restore_input(&policy, Family::Ipv6, &options(false, ""));
        assert_eq!(
            v6,
            format!(
                "*nat\n:IP-MASQ-AGENT - [0:0]\n{}\n{RETURN}fe80::/10 -j RETURN\n{RETURN}fd00::/8 -j RETURN\n{MASQ}\nCOMMIT\n",
                r#"-A IP-MASQ-AGENT -m comment --comment "ip-masq-agent: traffic to this destination is subject to MASQUERADE (longest prefix first)" -d fd00:1::/32 -j MASQUERADE"#
            )
        );
    }
}
