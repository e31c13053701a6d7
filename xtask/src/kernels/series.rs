//! The kernel series of the matrix, pinned here, and the steps each guest runs.
//!
//! A series names where Debian publishes it and the shape of its image packages' names; the
//! build is not pinned: every run takes the newest build of the series the archive has, and
//! prints which one ran. Steps are data, so a series gains a test by gaining a line.

use crate::arch::Arch;

/// One of Debian's two archives, on the mirror host the machine's own apt sources use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Archive {
    /// `…/debian`: releases, their point-release updates and backports.
    Main,
    /// `…/debian-security`: security updates, where most kernel builds appear first.
    Security,
}

/// A suite of an archive (component `main`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Suite {
    pub(crate) archive: Archive,
    pub(crate) name: &'static str,
}

const fn main(name: &'static str) -> Suite {
    Suite {
        archive: Archive::Main,
        name,
    }
}

const fn security(name: &'static str) -> Suite {
    Suite {
        archive: Archive::Security,
        name,
    }
}

/// Debian 12's suites: the machines' own release, which also provides kmod for the guests.
pub(crate) const BOOKWORM: &[Suite] = &[
    main("bookworm"),
    main("bookworm-updates"),
    security("bookworm-security"),
];

/// Debian 11's suites.
const BULLSEYE: &[Suite] = &[
    main("bullseye"),
    main("bullseye-updates"),
    security("bullseye-security"),
];

/// Debian 12's backports alone, so the newest 6.12 is the backport (bookworm-security also
/// carries 6.12 builds, as `…~deb12u1`; listing it here would pick those).
const BOOKWORM_BACKPORTS: &[Suite] = &[main("bookworm-backports")];

/// A package taken from a private apt configuration: the one with the highest version among
/// those whose name is `prefix`, a build tag without `-`, then `suffix`.
///
/// The build tag excludes `-`, so `linux-image-6.1.0-` + tag + `-amd64` matches
/// `linux-image-6.1.0-56-amd64` but neither the flavours (`…-56-rt-amd64`, `…-cloud-amd64`),
/// nor the debug and unsigned packages (`…-amd64-dbg`), nor the meta package
/// `linux-image-6.1-amd64`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PackagePattern {
    pub(crate) prefix: &'static str,
    pub(crate) suffix: &'static str,
}

impl PackagePattern {
    /// Whether `name` is a build of this pattern.
    pub(crate) fn matches(&self, name: &str) -> bool {
        name.strip_prefix(self.prefix)
            .and_then(|rest| rest.strip_suffix(self.suffix))
            .is_some_and(|tag| {
                !tag.is_empty()
                    && tag
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~'))
            })
    }
}

/// The package of depmod (run on the host) and modprobe (in the guests), from [`BOOKWORM`].
pub(crate) const KMOD: &str = "kmod";

/// A kernel series of the matrix.
#[derive(Debug)]
pub(crate) struct Series {
    /// What `--kernel` selects, and the results directory's name.
    pub(crate) name: &'static str,
    /// The kernel's (and the guest's) architecture.
    pub(crate) arch: Arch,
    /// Where it comes from, for the log.
    pub(crate) release: &'static str,
    pub(crate) suites: &'static [Suite],
    pub(crate) image: PackagePattern,
    pub(crate) steps: &'static [Step],
}

/// What a guest runs, in order; every step runs even when an earlier one failed, so one boot
/// reports everything.
#[derive(Debug)]
pub(crate) struct Step {
    /// Unique within a series; names the step's files in the results directory.
    pub(crate) name: &'static str,
    pub(crate) action: Action,
    /// The guest kills the step after this long: a few times what it takes under TCG on this
    /// kind of machine, so a hang costs minutes, not the matrix.
    pub(crate) timeout_secs: u64,
}

/// The arguments `masq` is refused with on too old a kernel: an agent on the loopback
/// interface, pinning under a path no other test uses.
const AGENT_ON_LO: &[&str] = &[
    "agent",
    "--interface",
    "lo",
    "--pin-path",
    "/sys/fs/bpf/masq-matrix",
];

#[derive(Debug)]
pub(crate) enum Action {
    /// `masq --log-level debug check-kernel --output json` under the DaemonSet's capabilities
    /// exits 0 with its JSON report (the verified instruction counts of the table), naming the
    /// running kernel and this attach mode. The debug level puts a refused program's verifier
    /// log on stderr.
    CheckKernel { attach_mode: &'static str },
    /// `masq ARGS` under the DaemonSet's capabilities fails: a non-zero status and one line on
    /// stderr naming the kernel's version and the oldest supported one, `minimum`.
    Refused {
        args: &'static [&'static str],
        minimum: &'static str,
    },
    /// Tests of one module of a test executable of `masq-testbed` (the executable by its
    /// target name, the module as its `main.rs` declares it), as root (the tests drop the agent
    /// to the DaemonSet's capabilities themselves), with libtest arguments. With `exact`, only
    /// those tests of the module run (`--exact MODULE::NAME`) and each must pass; otherwise
    /// every test of the module runs (libtest's filter `MODULE::`, which selects the names that
    /// contain it) and at least one must.
    Tests {
        binary: &'static str,
        module: &'static str,
        args: &'static [&'static str],
        exact: &'static [&'static str],
    },
}

/// The oldest kernel masq supports (memlock-free map accounting, BPF helpers it uses).
const MINIMUM: &str = "5.11";

const CHECK_TC: Step = Step {
    name: "check-kernel",
    action: Action::CheckKernel { attach_mode: "tc" },
    timeout_secs: 120,
};

const CHECK_TCX: Step = Step {
    name: "check-kernel",
    action: Action::CheckKernel { attach_mode: "tcx" },
    timeout_secs: 120,
};

/// Every test of a module of the `datapath` binary: crafted packets through BPF_PROG_TEST_RUN
/// (each test loads the datapath, so the verifier runs once a test: 10-60 s a module under
/// TCG).
const fn datapath(name: &'static str, module: &'static str) -> Step {
    Step {
        name,
        action: Action::Tests {
            binary: "datapath",
            module,
            args: &["--test-threads", "2"],
            exact: &[],
        },
        timeout_secs: 300,
    }
}

const DATAPATH_V4: Step = datapath("datapath", "ipv4");
const DATAPATH_V6: Step = datapath("datapath_v6", "ipv6");

/// End-to-end tests of one module of the `e2e` binary: an agent, namespaces, real traffic.
/// Tests that name no attach mode use the kernel's own (tc before 6.6).
const fn e2e(
    name: &'static str,
    module: &'static str,
    test: &'static [&'static str],
    timeout_secs: u64,
) -> Step {
    tests_step(name, module, &["--test-threads", "1"], test, timeout_secs)
}

/// One step running `test` of module `module` of the `e2e` binary with libtest arguments
/// `args`.
const fn tests_step(
    name: &'static str,
    module: &'static str,
    args: &'static [&'static str],
    test: &'static [&'static str],
    timeout_secs: u64,
) -> Step {
    Step {
        name,
        action: Action::Tests {
            binary: "e2e",
            module,
            args,
            exact: test,
        },
        timeout_secs,
    }
}

/// Through tc filters (`AttachMode::Tc`).
const E2E_TC: Step = e2e(
    "traffic_through_tc_filters_with_checksum_offload_on",
    "datapath",
    &["traffic_through_tc_filters_with_checksum_offload_on"],
    150,
);
/// Through tcx links (`AttachMode::Tcx`, Linux 6.6 and later).
const E2E_TCX: Step = e2e(
    "traffic_with_checksum_offload_on",
    "datapath",
    &["traffic_with_checksum_offload_on"],
    150,
);
/// Conntrack parity on a node: a hostPort's DNAT, a take-over under a live flow, a SYN flood
/// against a full table, a renumbered uplink (in the kernel's own attach mode).
const E2E_CONNTRACK: Step = e2e(
    "e2e_conntrack",
    "conntrack",
    &[
        "host_ports_reach_their_pod_tc",
        "a_take_over_keeps_upstreams_live_flows_and_their_ports",
        "a_syn_flood_from_one_pod_leaves_the_other_pods_new_connections_working",
        "a_live_udp_stream_follows_the_uplinks_new_address",
    ],
    300,
);

/// NAT state as conntrack keeps it (issue 32): closed ports, sprays from a pod and from
/// outside, fragments without a mapping, a change of preferred source, an abort after a burst,
/// flows removed under a stream, a node connection clashing with an adopted flow.
const E2E_NAT_STATE: Step = e2e(
    "e2e_nat_state",
    "conntrack",
    &[
        "a_pod_connecting_to_closed_ports_leaves_the_other_pods_new_connections_working",
        "a_udp_spray_from_a_pod_costs_another_pods_queries_nothing",
        "without_a_pod_share_a_full_table_evicts_from_the_whole_table",
        "a_udp_spray_from_outside_at_a_pod_costs_the_other_pods_nothing",
        "no_fragment_of_a_datagram_that_got_no_mapping_leaves_with_the_pods_address",
        "a_live_ipv6_connection_survives_a_change_of_the_nodes_preferred_source",
        "an_abort_after_a_large_burst_ends_the_flow_within_ten_seconds",
        "flows_the_collector_or_a_flush_removes_under_a_stream_never_leak_a_pod_address",
        "a_node_connection_that_clashes_with_an_adopted_flow_keeps_its_replies",
    ],
    600,
);

/// Ports per remote (issue 33): 40,000 flows from pods to one remote, each on a node port of
/// its own, the node's own query to it answered; a crowded remote warned about and shown.
const E2E_PORTS: Step = e2e(
    "e2e_ports",
    "nat",
    &[
        "forty_thousand_flows_from_pods_to_one_remote_all_get_a_node_port",
        "a_remote_running_out_of_ports_is_warned_about_and_shown",
    ],
    300,
);

/// masq's own rules (issue 26): a masquerade exception inside an exempt range and an exempt
/// pod source, through the agent in the kernel's own attach mode and through its iptables
/// backend.
const E2E_RULES_TC: Step = e2e(
    "e2e_rules",
    "rules",
    &[
        "the_ebpf_backend_masquerades_exceptions_and_spares_exempt_pods::tc",
        "the_iptables_backend_masquerades_exceptions_and_spares_exempt_pods",
    ],
    200,
);

/// The same through tcx links (6.6 and later).
const E2E_RULES_TCX: Step = e2e(
    "e2e_rules_tcx",
    "rules",
    &["the_ebpf_backend_masquerades_exceptions_and_spares_exempt_pods::tcx"],
    150,
);

/// Tests that need what the development kernel lacks, marked `#[ignore]` there and run here
/// with `--ignored`: each must pass.
const fn e2e_guest_only(
    name: &'static str,
    module: &'static str,
    test: &'static [&'static str],
    timeout_secs: u64,
) -> Step {
    tests_step(
        name,
        module,
        &["--test-threads", "1", "--ignored"],
        test,
        timeout_secs,
    )
}

/// A WireGuard uplink (the module loads on demand in the guests) through tc filters.
const E2E_WIREGUARD_TC: Step = e2e_guest_only(
    "wireguard_tc",
    "uplinks",
    &["a_wireguard_uplink_masquerades_pod_traffic_tc"],
    150,
);

/// The same through tcx links (6.6 and later).
const E2E_WIREGUARD_TCX: Step = e2e_guest_only(
    "wireguard_tcx",
    "uplinks",
    &["a_wireguard_uplink_masquerades_pod_traffic_tcx"],
    150,
);

/// IPv6 and IPv4 through masq as CHECKSUM_COMPLETE skbs, both directions: on 6.1 and 6.12 the
/// programs correct skb->csum themselves (no BPF_F_IPV6 before 6.16). Needs fentry programs
/// (or a "hw csum failure" report that debugfs can rearm), which the development machine's
/// lockdown refuses.
const E2E_CSUM_COMPLETE: Step = e2e_guest_only(
    "e2e_checksum_complete",
    "checksum_complete",
    &["checksum_complete_packets_keep_a_right_sum_through_masq"],
    150,
);

/// The matrix, in the order it runs.
pub(crate) const MATRIX: &[Series] = &[
    Series {
        arch: Arch::Amd64,
        name: "6.1",
        release: "Debian 12 bookworm",
        suites: BOOKWORM,
        image: PackagePattern {
            prefix: "linux-image-6.1.0-",
            suffix: "-amd64",
        },
        steps: &[
            CHECK_TC,
            DATAPATH_V4,
            DATAPATH_V6,
            E2E_TC,
            E2E_CONNTRACK,
            E2E_NAT_STATE,
            E2E_PORTS,
            E2E_RULES_TC,
            E2E_CSUM_COMPLETE,
            E2E_WIREGUARD_TC,
        ],
    },
    Series {
        arch: Arch::Amd64,
        name: "6.12",
        release: "Debian 12 bookworm-backports",
        suites: BOOKWORM_BACKPORTS,
        image: PackagePattern {
            prefix: "linux-image-6.12.",
            suffix: "-amd64",
        },
        // The BPF_PROG_TEST_RUN suite runs on the oldest kernel here (6.1) and on the host's
        // (the newest): on 6.12 the verifier's check of every program and the end-to-end steps
        // cover the datapath, which keeps `cargo xtask test` well under 30 minutes.
        steps: &[
            CHECK_TCX,
            E2E_TCX,
            E2E_TC,
            E2E_CONNTRACK,
            E2E_NAT_STATE,
            E2E_PORTS,
            E2E_RULES_TC,
            E2E_RULES_TCX,
            E2E_CSUM_COMPLETE,
            E2E_WIREGUARD_TC,
            E2E_WIREGUARD_TCX,
        ],
    },
    Series {
        arch: Arch::Amd64,
        name: "5.10",
        release: "Debian 11 bullseye",
        suites: BULLSEYE,
        image: PackagePattern {
            prefix: "linux-image-5.10.0-",
            suffix: "-amd64",
        },
        steps: &[
            Step {
                name: "check-kernel-refuses",
                action: Action::Refused {
                    args: &["check-kernel", "--output", "json"],
                    minimum: MINIMUM,
                },
                timeout_secs: 60,
            },
            Step {
                name: "agent-refuses",
                action: Action::Refused {
                    args: AGENT_ON_LO,
                    minimum: MINIMUM,
                },
                timeout_secs: 60,
            },
        ],
    },
];

/// The arm64 series: Debian 12's arm64 kernel, which runs only `check-kernel` and the
/// `BPF_PROG_TEST_RUN` tests (the guest's userland is a few arm64 packages, not the host's,
/// so the namespace tests, which need iproute2, iptables and more, stay on x86-64). Under TCG
/// an arm64 guest is several times slower than an x86-64 one, hence the longer timeouts.
pub(crate) const ARM64_MATRIX: &[Series] = &[Series {
    arch: Arch::Arm64,
    name: "6.1-arm64",
    release: "Debian 12 bookworm, arm64",
    suites: BOOKWORM,
    image: PackagePattern {
        prefix: "linux-image-6.1.0-",
        suffix: "-arm64",
    },
    steps: &[
        Step {
            timeout_secs: 600,
            ..CHECK_TC
        },
        Step {
            timeout_secs: 1500,
            ..DATAPATH_V4
        },
        Step {
            timeout_secs: 1500,
            ..DATAPATH_V6
        },
    ],
}];

/// The series of `arch` (x86-64: [`MATRIX`], arm64: [`ARM64_MATRIX`]) that `names` select, in
/// order; all of them when `names` is empty.
pub(crate) fn select(names: &[String], arch: Arch) -> anyhow::Result<Vec<&'static Series>> {
    let matrix = match arch {
        Arch::Amd64 => MATRIX,
        Arch::Arm64 => ARM64_MATRIX,
    };
    if let Some(unknown) = names
        .iter()
        .find(|name| !matrix.iter().any(|series| series.name == name.as_str()))
    {
        let known: Vec<&str> = matrix.iter().map(|series| series.name).collect();
        anyhow::bail!(
            "no {arch} kernel series {unknown:?} in the matrix; known: {}",
            known.join(", ")
        );
    }
    Ok(matrix
        .iter()
        .filter(|series| names.is_empty() || names.iter().any(|name| name == series.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_take_the_plain_flavour_only() {
        let pattern = MATRIX[0].image;
        assert!(pattern.matches("linux-image-6.1.0-56-amd64"));
        for other in [
            "linux-image-6.1.0-56-rt-amd64",
            "linux-image-6.1.0-56-cloud-amd64",
            "linux-image-6.1.0-56-amd64-dbg",
            "linux-image-6.1.0-56-amd64-unsigned",
            "linux-image-6.1.0--amd64",
            "linux-image-6.1-amd64",
            "linux-image-amd64",
        ] {
            assert!(!pattern.matches(other), "{other}");
        }
        let backports = MATRIX[1].image;
        assert!(backports.matches("linux-image-6.12.95+deb12-amd64"));
        assert!(backports.matches("linux-image-6.12.90+deb12.1-amd64"));
        assert!(!backports.matches("linux-image-6.12-amd64"));
        assert!(!backports.matches("linux-image-6.12.95+deb12-cloud-amd64"));
        let arm64 = ARM64_MATRIX[0].image;
        assert!(arm64.matches("linux-image-6.1.0-56-arm64"));
        assert!(!arm64.matches("linux-image-6.1.0-56-rt-arm64"));
        assert!(!arm64.matches("linux-image-6.1.0-56-amd64"));
    }

    #[test]
    fn step_names_are_unique_within_a_series() {
        for series in MATRIX.iter().chain(ARM64_MATRIX) {
            let mut names: Vec<&str> = series.steps.iter().map(|step| step.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), series.steps.len(), "{}", series.name);
        }
    }

    /// Every test step names a test binary of masq-testbed, a module its `main.rs` declares and
    /// functions that module defines, so a moved or renamed test fails here, not in a guest.
    #[test]
    fn test_steps_name_binaries_modules_and_tests_that_exist() {
        let tests = crate::workspace_root().join("tests");
        let manifest = std::fs::read_to_string(tests.join("Cargo.toml")).unwrap();
        for series in MATRIX.iter().chain(ARM64_MATRIX) {
            for step in series.steps {
                let Action::Tests {
                    binary,
                    module,
                    exact,
                    ..
                } = step.action
                else {
                    continue;
                };
                let context = format!("step {} of {}", step.name, series.name);
                assert!(
                    manifest.contains(&format!("name = \"{binary}\"")),
                    "{context}: tests/Cargo.toml has no test binary {binary}"
                );
                let main = std::fs::read_to_string(tests.join(binary).join("main.rs")).unwrap();
                assert!(
                    main.lines().any(|line| line == format!("mod {module};")),
                    "{context}: tests/{binary}/main.rs declares no module {module}"
                );
                let path = tests.join(binary).join(format!("{module}.rs"));
                let source = std::fs::read_to_string(&path).unwrap();
                for name in exact {
                    // `in_both_attach_modes!` makes the tests `NAME::tc` and `NAME::tcx` of
                    // `fn NAME(mode)`.
                    let function = name.split("::").next().unwrap_or(name);
                    assert!(
                        source.contains(&format!("fn {function}(")),
                        "{context}: {} defines no test {name}",
                        path.display()
                    );
                }
            }
        }
    }

    #[test]
    fn selection_keeps_the_matrix_order_and_rejects_unknown_series() {
        let picked = select(&["5.10".to_owned(), "6.1".to_owned()], Arch::Amd64).unwrap();
        let names: Vec<&str> = picked.iter().map(|series| series.name).collect();
        assert_eq!(names, ["6.1", "5.10"]);
        assert_eq!(select(&[], Arch::Amd64).unwrap().len(), MATRIX.len());
        assert!(select(&["4.19".to_owned()], Arch::Amd64).is_err());
        assert!(select(&["6.1".to_owned()], Arch::Arm64).is_err());
        let arm64 = select(&[], Arch::Arm64).unwrap();
        assert!(arm64.iter().all(|series| series.arch == Arch::Arm64));
        assert!(MATRIX.iter().all(|series| series.arch == Arch::Amd64));
    }
}
