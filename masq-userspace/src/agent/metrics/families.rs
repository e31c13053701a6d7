//! The agent's families: what it is and translates on, what the datapath counted, what the NAT
//! tables hold and did, and the config in force. Each scrape reads the agent's status and the
//! datapath's counts anew.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use masq_common::{
    counters::{ALLOC_ATTEMPT_BUCKETS, ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter},
    flow::{EvictionCause, FlowClass},
    layout::MAP_LAYOUT_VERSION,
};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::MetricType,
};

use super::{counter, counters, family, gauge, gauges};
use crate::{
    agent::status::{AgentStatus, IpsecStatus, SharedStatus},
    causes::WithCauses,
    datapath::{
        maps::DatapathMaps,
        snapshot::{DatapathCounts, FAMILIES},
    },
    node::uplinks::UplinkIpv6,
};

/// The datapath's counts as the maps pinned under `pin_path` hold them now: none at all for an
/// agent without a datapath (no `pin_path`), `None` when the maps cannot be read.
fn read_counts(pin_path: Option<&Path>) -> Option<DatapathCounts> {
    let Some(pin_path) = pin_path else {
        return Some(DatapathCounts::default());
    };
    DatapathMaps::from_pins(pin_path)
        .and_then(|maps| DatapathCounts::read(&maps))
        .inspect_err(|error| tracing::debug!(error = %WithCauses(error), "reading the datapath's counts for a scrape"))
        .ok()
}

fn seconds(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map(|elapsed| elapsed.as_secs_f64())
}

/// The agent's families, read when a scrape encodes them.
#[derive(Debug)]
pub(super) enum AgentCollector {
    /// What `/metrics` serves: the shared status and the pinned maps as they are now.
    Live {
        status: SharedStatus,
        pin_path: Option<PathBuf>,
    },
    /// Fixed values, for [`render`] (boxed: far larger than the live variant).
    Fixed(Box<(AgentStatus, Option<DatapathCounts>)>),
}

impl Collector for AgentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        match self {
            Self::Live { status, pin_path } => {
                let status = status.snapshot();
                let counts = read_counts(pin_path.as_deref());
                encode_agent(&mut encoder, &status, counts.as_ref())
            }
            Self::Fixed(fixed) => encode_agent(&mut encoder, &fixed.0, fixed.1.as_ref()),
        }
    }
}

/// Encodes the agent's families: what the agent is and translates on, what the datapath
/// counted, what the NAT tables hold and did, and the config in force.
fn encode_agent(
    encoder: &mut DescriptorEncoder<'_>,
    status: &AgentStatus,
    counts: Option<&DatapathCounts>,
) -> fmt::Result {
    encode_identity(encoder, status)?;
    encode_uplinks(encoder, status)?;
    encode_translation_bypasses(encoder, status)?;
    if let Some(started) = seconds(status.started) {
        gauge(
            encoder,
            "masq_start_time_seconds",
            "When the agent started (Unix time).",
            started,
        )?;
    }
    encode_packets(encoder, counts)?;
    if let Some(counts) = counts {
        encode_port_allocation(encoder, &counts.allocation)?;
    }
    encode_nat_tables(encoder, status)?;
    encode_nat_state(encoder, status, counts)?;
    encode_config(encoder, status)
}

/// What runs: masq's version and map layout, whether it is ready, its config source, and the
/// kernel with what its verifier made of each program.
fn encode_identity(encoder: &mut DescriptorEncoder<'_>, status: &AgentStatus) -> fmt::Result {
    let layout = MAP_LAYOUT_VERSION.to_string();
    family(
        encoder,
        "masq_build_info",
        "masq version and datapath map layout.",
        MetricType::Gauge,
        gauges([(
            [
                ("version", env!("CARGO_PKG_VERSION")),
                ("layout_version", layout.as_str()),
            ],
            1i64,
        )]),
    )?;
    gauge(
        encoder,
        "masq_ready",
        "1 when the datapath is attached and a config is in force.",
        i64::from(status.ready),
    )?;
    let adopted = status.adopted.to_string();
    family(
        encoder,
        "masq_agent_info",
        "The config source in force, and whether pinned state was adopted.",
        MetricType::Gauge,
        gauges([(
            [
                ("config", status.config_origin.as_deref().unwrap_or("")),
                ("adopted", adopted.as_str()),
            ],
            1i64,
        )]),
    )?;
    let Some(kernel) = &status.kernel else {
        return Ok(());
    };
    family(
        encoder,
        "masq_kernel_info",
        "The kernel the datapath is loaded into, and the attach mode new attachments use on it.",
        MetricType::Gauge,
        gauges([(
            [
                ("release", kernel.release.as_str()),
                ("attach_mode", kernel.attach_mode),
            ],
            1i64,
        )]),
    )?;
    family(
        encoder,
        "masq_program_verified_instructions",
        "Instructions the kernel's verifier processed for each datapath program (its limit is 1,000,000); absent where the kernel does not report it (before Linux 5.16).",
        MetricType::Gauge,
        gauges(kernel.verified_sizes.iter().filter_map(|(program, size)| {
            size.map(|size| ([("program", *program)], i64::from(size)))
        })),
    )
}

/// The interfaces masq translates on: the address each masquerades to, how the programs are
/// attached, and whether that address is the interface's own, in each family.
fn encode_uplinks(encoder: &mut DescriptorEncoder<'_>, status: &AgentStatus) -> fmt::Result {
    let node_ips: Vec<String> = status
        .uplinks
        .iter()
        // An uplink without IPv4 (an IPv6-only node's) has an empty address.
        .map(|uplink| {
            uplink
                .node_ip
                .map_or_else(String::new, |address| address.to_string())
        })
        .collect();
    family(
        encoder,
        "masq_uplink_info",
        "One series per interface masq translates on: the address traffic leaving by it is masqueraded to, and how the programs are attached.",
        MetricType::Gauge,
        gauges(
            status
                .uplinks
                .iter()
                .zip(&node_ips)
                .map(|(uplink, node_ip)| {
                    (
                        [
                            ("interface", uplink.interface.as_str()),
                            ("node_ip", node_ip.as_str()),
                            ("attach_mode", uplink.attach_mode),
                        ],
                        1i64,
                    )
                }),
        ),
    )?;
    family(
        encoder,
        "masq_uplink_address_local",
        "Per uplink: 1 when the address traffic is masqueraded to is one of the interface's own, 0 for a --node-ip the interface does not have (replies must be routed to the node).",
        MetricType::Gauge,
        gauges(status.uplinks.iter().map(|uplink| {
            (
                [("interface", uplink.interface.as_str())],
                i64::from(uplink.address_is_local),
            )
        })),
    )?;
    family(
        encoder,
        "masq_uplink_ipv6_missing",
        "Per uplink, with --enable-ipv6: 1 while the interface has no global IPv6 address to masquerade to (IPv6 traffic leaving by it keeps pod addresses), else 0.",
        MetricType::Gauge,
        gauges(status.uplinks.iter().filter_map(|uplink| {
            let missing = match uplink.ipv6 {
                UplinkIpv6::NotTranslated => return None,
                UplinkIpv6::NoAddress => 1i64,
                UplinkIpv6::Address(_) => 0,
            };
            Some(([("interface", uplink.interface.as_str())], missing))
        })),
    )
}

/// What acts on masqueraded traffic other than masq: an upstream chain masquerading before
/// it, and IPsec policies the translated traffic escapes.
fn encode_translation_bypasses(
    encoder: &mut DescriptorEncoder<'_>,
    status: &AgentStatus,
) -> fmt::Result {
    gauge(
        encoder,
        "masq_upstream_chain_present",
        "1 while an upstream ip-masq-agent chain is installed next to masq (it masquerades before masq sees the packets).",
        i64::from(status.upstream_chain.is_some()),
    )?;
    // Absent until the policies were read: an unreadable policy table is not "none".
    let Some(IpsecStatus::Checked(bypassed)) = &status.ipsec else {
        return Ok(());
    };
    let count = |family: &str| {
        i64::try_from(
            bypassed
                .iter()
                .filter(|policy| policy.family == family)
                .count(),
        )
        .unwrap_or(i64::MAX)
    };
    family(
        encoder,
        "masq_xfrm_policies_bypassed",
        "XFRM (IPsec) output policies that select masqueraded traffic only after translation: MASQUERADE would have applied them, under masq that traffic leaves in clear text.",
        MetricType::Gauge,
        gauges(FAMILIES.map(|name| ([("family", name)], count(name)))),
    )
}

/// The datapath's packet counters: every outcome, and the drops by direction and reason.
fn encode_packets(
    encoder: &mut DescriptorEncoder<'_>,
    counts: Option<&DatapathCounts>,
) -> fmt::Result {
    let by_family: Vec<(&str, &[(Counter, u64)])> = counts
        .map(|counts| {
            FAMILIES
                .into_iter()
                .zip(counts.packets.iter().map(Vec::as_slice))
                .collect()
        })
        .unwrap_or_default();
    family(
        encoder,
        "masq_datapath_packets",
        "Packets handled by the datapath, by outcome and address family.",
        MetricType::Counter,
        counters(by_family.iter().flat_map(|&(family, totals)| {
            totals.iter().map(move |&(counter, value)| {
                ([("outcome", counter.name()), ("family", family)], value)
            })
        })),
    )?;
    family(
        encoder,
        "masq_datapath_drops",
        "Packets the datapath dropped, by reason and address family.",
        MetricType::Counter,
        counters(by_family.iter().flat_map(|&(family, totals)| {
            totals.iter().filter_map(move |&(counter, value)| {
                let name = counter.name();
                let (direction, reason) = name
                    .strip_prefix("egress_drop_")
                    .map(|reason| ("egress", reason))
                    .or_else(|| {
                        name.strip_prefix("ingress_drop_")
                            .map(|reason| ("ingress", reason))
                    })?;
                Some((
                    [
                        ("direction", direction),
                        ("reason", reason),
                        ("family", family),
                    ],
                    value,
                ))
            })
        })),
    )?;
    gauge(
        encoder,
        "masq_datapath_read_errors",
        "1 when the pinned maps could not be read for this scrape.",
        i64::from(counts.is_none()),
    )
}

/// The ports new flows tried before one was free, from the datapath's `allocation`
/// histogram, and the flows that found none; nothing while the histogram is not whole.
fn encode_port_allocation(encoder: &mut DescriptorEncoder<'_>, allocation: &[u64]) -> fmt::Result {
    let (Some(attempts), Some(&failed), Some(&sum)) = (
        allocation.get(..ALLOC_ATTEMPT_BUCKETS as usize),
        allocation.get(ALLOC_FAILED_SLOT as usize),
        allocation.get(ALLOC_SUM_SLOT as usize),
    ) else {
        return Ok(());
    };
    // Bucket `index` counts flows that needed at most 2^index attempts; the +Inf bucket adds
    // nothing, as the last finite bound is the most attempts the datapath makes.
    let buckets: Vec<(f64, u64)> = attempts
        .iter()
        .enumerate()
        .map(|(index, &count)| (f64::from(1u32 << index), count))
        .chain([(f64::INFINITY, 0)])
        .collect();
    let count = attempts.iter().sum();
    #[expect(
        clippy::cast_precision_loss,
        reason = "the sum of attempts stays far below 2^53"
    )]
    let sum = sum as f64;
    encoder
        .encode_descriptor(
            "masq_port_allocation_attempts",
            "Ports tried per new flow until a free one was found (successful allocations).",
            None,
            MetricType::Histogram,
        )?
        .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    counter(
        encoder,
        "masq_port_allocation_failures",
        "New flows that found no free port.",
        failed,
    )
}

/// The NAT tables' size and use at the last garbage collection, and the flows it expired.
fn encode_nat_tables(encoder: &mut DescriptorEncoder<'_>, status: &AgentStatus) -> fmt::Result {
    let gc = FAMILIES
        .into_iter()
        .zip([&status.last_gc.ipv4, &status.last_gc.ipv6]);
    family(
        encoder,
        "masq_nat_entries",
        "NAT table entries (two per flow) at the last garbage collection, by address family.",
        MetricType::Gauge,
        gauges(
            gc.clone()
                .map(|(family, report)| ([("family", family)], report.entries)),
        ),
    )?;
    family(
        encoder,
        "masq_nat_flows",
        "Translated flows at the last garbage collection, by address family.",
        MetricType::Gauge,
        gauges(gc.map(|(family, report)| ([("family", family)], report.flows))),
    )?;
    family(
        encoder,
        "masq_nat_capacity_entries",
        "Capacity of the NAT table, by address family (1 for IPv6 without --enable-ipv6).",
        MetricType::Gauge,
        gauges(
            FAMILIES
                .into_iter()
                .zip([status.nat_capacity, status.nat_capacity_v6])
                .map(|(family, capacity)| ([("family", family)], capacity)),
        ),
    )?;
    counter(
        encoder,
        "masq_gc_expired_flows",
        "Flows removed by garbage collection since start.",
        status.gc_expired_total,
    )
}

/// What the NAT table's state machine and its limits did: evictions by cause and class, the
/// unassured flows, the busiest holder against its share, and the busiest remotes against
/// their ports.
fn encode_nat_state(
    encoder: &mut DescriptorEncoder<'_>,
    status: &AgentStatus,
    counts: Option<&DatapathCounts>,
) -> fmt::Result {
    encode_evictions(encoder, status, counts)?;
    let gc = [&status.last_gc.ipv4, &status.last_gc.ipv6];
    family(
        encoder,
        "masq_nat_unassured_flows",
        "Flows not assured (never answered, or the handshake not completed) at the last garbage collection, by family: what a full table evicts.",
        MetricType::Gauge,
        gauges(
            FAMILIES
                .into_iter()
                .zip(gc)
                .map(|(family, report)| ([("family", family)], report.unassured)),
        ),
    )?;
    family(
        encoder,
        "masq_nat_busiest_holder_unassured_flows",
        "Unassured flows of the local address (pod or node) holding the most at the last garbage collection, by family; `masq status` names it.",
        MetricType::Gauge,
        gauges(FAMILIES.into_iter().zip(gc).map(|(family, report)| {
            (
                [("family", family)],
                report.top_holders.first().map_or(0, |&(_, flows)| flows),
            )
        })),
    )?;
    // The busiest few remotes only, so the label set stays bounded.
    let remotes: Vec<([(&str, String); 2], u64)> = FAMILIES
        .into_iter()
        .zip(gc)
        .flat_map(|(family, report)| {
            report.busiest_remotes.iter().map(move |remote| {
                (
                    [("family", family.to_owned()), ("remote", remote.label())],
                    remote.ports as u64,
                )
            })
        })
        .collect();
    family(
        encoder,
        "masq_nat_remote_ports_in_use",
        "Node ports in use towards each of the busiest remote endpoints (ip:port/protocol) at the last garbage collection, by family: a remote whose ports are all in use refuses new flows (see masq_nat_ports_per_remote).",
        MetricType::Gauge,
        gauges(remotes),
    )?;
    gauge(
        encoder,
        "masq_nat_ports_per_remote",
        "Node ports each remote endpoint may have in use: the size of the SNAT port ranges.",
        i64::from(gc[0].ports_per_remote.max(gc[1].ports_per_remote)),
    )?;
    family(
        encoder,
        "masq_nat_pod_share_flows",
        "Unassured flows one local address may hold before its new flows replace its own (--nat-pod-share of the table's flows), by family; 0: no limit.",
        MetricType::Gauge,
        gauges(
            FAMILIES
                .into_iter()
                .zip(status.pod_share)
                .map(|(family, share)| ([("family", family)], share)),
        ),
    )
}

/// The flows removed to make room: the datapath's (a full table, a holder at its share) and
/// the collector's (the reserve) in one family, by what made room and what it took.
fn encode_evictions(
    encoder: &mut DescriptorEncoder<'_>,
    status: &AgentStatus,
    counts: Option<&DatapathCounts>,
) -> fmt::Result {
    let mut evictions = Vec::new();
    for (index, family) in FAMILIES.into_iter().enumerate() {
        let by_datapath = counts.map_or(&[][..], |counts| &counts.evictions[index]);
        for &(cause, class, count) in by_datapath {
            // The datapath never evicts for the reserve: a count there is not the collector's.
            if cause != EvictionCause::Reserve {
                evictions.push((
                    [
                        ("family", family),
                        ("cause", cause.name()),
                        ("class", class.name()),
                    ],
                    count,
                ));
            }
        }
        for (class, &count) in FlowClass::ALL.iter().zip(&status.gc_reclaimed_total[index]) {
            evictions.push((
                [
                    ("family", family),
                    ("cause", EvictionCause::Reserve.name()),
                    ("class", class.name()),
                ],
                count,
            ));
        }
    }
    family(
        encoder,
        "masq_nat_evictions",
        "Flows removed to make room, by family, cause (table_full: a new flow in a full table; holder_share: a new flow of a local address at its --nat-pod-share; reserve: the collector keeping the table under 90 % once over 95 %) and class of the flow removed. Assured flows are never evicted.",
        MetricType::Counter,
        counters(evictions),
    )
}

/// The config in force and its loads: results, when, the last error's kind, and the CIDRs
/// of each list with the trie entries they make.
fn encode_config(encoder: &mut DescriptorEncoder<'_>, status: &AgentStatus) -> fmt::Result {
    family(
        encoder,
        "masq_config_reloads",
        "Config loads, by result.",
        MetricType::Counter,
        counters([
            ([("result", "ok")], status.reloads_ok),
            ([("result", "failed")], status.reloads_failed),
        ]),
    )?;
    if let Some(time) = seconds(status.last_success) {
        gauge(
            encoder,
            "masq_config_last_success_timestamp_seconds",
            "When a config last loaded.",
            time,
        )?;
    }
    if let Some(time) = seconds(status.last_failure) {
        gauge(
            encoder,
            "masq_config_last_failure_timestamp_seconds",
            "When a config last failed to load.",
            time,
        )?;
    }
    // The reason is one of a fixed set of words; the message (free text) stays out of labels.
    family(
        encoder,
        "masq_config_last_error",
        "1 with the kind of the last config error (read, syntax, decode, invalid, empty, capacity, apply) until a load succeeds; the message is in the log and /readyz.",
        MetricType::Gauge,
        gauges(
            status
                .last_error
                .iter()
                .map(|error| ([("reason", error.reason)], 1i64)),
        ),
    )?;
    family(
        encoder,
        "masq_config_cidrs",
        "Non-masquerade CIDRs in force, by family.",
        MetricType::Gauge,
        gauges(
            FAMILIES
                .into_iter()
                .zip(status.list_cidrs.non_masquerade)
                .map(|(family, cidrs)| ([("family", family)], cidrs)),
        ),
    )?;
    let lists = [
        ("nonMasqueradeCIDRs", status.list_cidrs.non_masquerade),
        ("masqueradeCIDRs", status.list_cidrs.masquerade),
        (
            "nonMasqueradeSrcCIDRs",
            status.list_cidrs.non_masquerade_src,
        ),
    ];
    family(
        encoder,
        "masq_config_list_cidrs",
        "CIDRs in force, by config list and family.",
        MetricType::Gauge,
        gauges(lists.into_iter().flat_map(|(list, by_family)| {
            FAMILIES
                .into_iter()
                .zip(by_family)
                .map(move |(family, cidrs)| ([("list", list), ("family", family)], cidrs))
        })),
    )?;
    gauge(
        encoder,
        "masq_nomasq_trie_entries",
        "Entries in the datapath's non-masquerade trie (link-local included).",
        status.trie_entries,
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::{
        super::{
            render,
            tests::{bucket, sample},
        },
        *,
    };

    /// Every cause and class of eviction, each `count` times.
    fn evictions(count: u64) -> Vec<(EvictionCause, FlowClass, u64)> {
        EvictionCause::ALL
            .into_iter()
            .flat_map(|cause| FlowClass::ALL.map(|class| (cause, class, count)))
            .collect()
    }

    /// The datapath counts the evictions that make room for a new flow, the agent those its
    /// collector makes to keep room free: one family holds both, each under its cause.
    #[test]
    fn evictions_are_exported_by_cause_and_class_from_the_datapath_and_the_collector() {
        let (mut status, mut counts) = representative();
        counts.evictions[0] = evictions(0);
        counts.evictions[0][masq_common::flow::eviction_slot(
            EvictionCause::HolderShare,
            FlowClass::TcpUnanswered,
        ) as usize]
            .2 = 40;
        // The datapath never counts the reserve: a value there is not the collector's.
        counts.evictions[0][masq_common::flow::eviction_slot(
            EvictionCause::Reserve,
            FlowClass::TcpUnanswered,
        ) as usize]
            .2 = 999;
        status.gc_reclaimed_total[0][FlowClass::TcpUnanswered as usize] = 3;
        status.pod_share = [128, 0];
        status.last_gc.ipv4.unassured = 150;
        status.last_gc.ipv4.top_holders = vec![("10.244.1.5".parse().expect("address"), 128)];
        let page = render(&status, Some(&counts));
        let series = |cause: &str, class: &str| {
            format!(r#"masq_nat_evictions_total{{family="ipv4",cause="{cause}",class="{class}"}}"#)
        };
        assert_eq!(
            sample(&page, &series("holder_share", "tcp_unanswered")),
            Some(40.0),
            "{page}"
        );
        assert_eq!(
            sample(&page, &series("reserve", "tcp_unanswered")),
            Some(3.0),
            "{page}"
        );
        assert_eq!(
            sample(&page, &series("table_full", "tcp_unanswered")),
            Some(0.0),
            "{page}"
        );
        let gauge = |name: &str| sample(&page, &format!(r#"{name}{{family="ipv4"}}"#));
        assert_eq!(gauge("masq_nat_unassured_flows"), Some(150.0));
        assert_eq!(
            gauge("masq_nat_busiest_holder_unassured_flows"),
            Some(128.0)
        );
        assert_eq!(gauge("masq_nat_pod_share_flows"), Some(128.0));
    }

    /// Uplink `up0`, masquerading IPv4 to 192.0.2.1 (`address_is_local`: the interface's own)
    /// and IPv6 as `ipv6` says.
    fn up0(address_is_local: bool, ipv6: UplinkIpv6) -> crate::agent::status::UplinkStatus {
        crate::agent::status::UplinkStatus {
            interface: "up0".to_owned(),
            node_ip: Some(std::net::Ipv4Addr::new(192, 0, 2, 1)),
            attach_mode: "tcx",
            address_is_local,
            ipv6,
        }
    }

    /// A status and counts under which every family masq can export has a series.
    pub(in crate::agent::metrics) fn representative() -> (AgentStatus, DatapathCounts) {
        let status = AgentStatus {
            ready: true,
            uplinks: vec![up0(false, UplinkIpv6::NoAddress)],
            upstream_chain: Some("IP-MASQ-AGENT".to_owned()),
            config_origin: Some("defaults".to_owned()),
            last_error: Some(crate::agent::status::ConfigFailure {
                reason: "read",
                message: "gone".to_owned(),
            }),
            last_success: Some(SystemTime::now()),
            last_failure: Some(SystemTime::now()),
            started: Some(SystemTime::now()),
            kernel: Some(crate::agent::status::KernelStatus {
                release: "6.1.0-28-amd64".to_owned(),
                attach_mode: "tc",
                verified_sizes: vec![("masq_egress", Some(42_744)), ("masq_ingress", None)],
            }),
            ipsec: Some(IpsecStatus::Checked(vec![
                crate::agent::status::BypassedPolicy {
                    family: "ipv4",
                    description: "src 192.0.2.1/32 dst 198.51.100.0/24".to_owned(),
                },
            ])),
            last_gc: crate::datapath::gc::GcReports {
                ipv4: crate::datapath::gc::GcReport {
                    busiest_remotes: vec![crate::datapath::gc::RemoteUse {
                        node: std::net::Ipv4Addr::new(192, 0, 2, 1).into(),
                        remote: "198.51.100.10:53".parse().expect("an endpoint"),
                        protocol: masq_common::nat::proto::UDP,
                        ports: 7,
                    }],
                    ports_per_remote: 61_744,
                    ..crate::datapath::gc::GcReport::default()
                },
                ..crate::datapath::gc::GcReports::default()
            },
            ..AgentStatus::default()
        };
        let every_counter_once: Vec<(Counter, u64)> =
            Counter::ALL.iter().map(|&counter| (counter, 1)).collect();
        let counts = DatapathCounts {
            packets: [every_counter_once.clone(), every_counter_once],
            allocation: vec![1; masq_common::counters::ALLOC_HISTOGRAM_BUCKETS as usize],
            evictions: [evictions(1), evictions(1)],
        };
        (status, counts)
    }

    /// Every family's name and type, and each sample name's label names in order, as
    /// `name type` and `  sample{label,label}` lines.
    fn shape(page: &str) -> String {
        let mut shape = String::new();
        let mut last = String::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                shape.push_str(rest);
                shape.push('\n');
                last.clear();
            } else if !line.starts_with('#') {
                let series = line.rsplit_once(' ').map_or(line, |(series, _)| series);
                let (name, labels) = series.split_once('{').unwrap_or((series, ""));
                let names: Vec<&str> = labels
                    .split("\",")
                    .filter_map(|label| label.split_once('=').map(|(name, _)| name))
                    .collect();
                let signature = if names.is_empty() {
                    format!("  {name}\n")
                } else {
                    format!("  {name}{{{}}}\n", names.join(","))
                };
                if signature != last {
                    shape.push_str(&signature);
                    last = signature;
                }
            }
        }
        shape
    }

    /// Dashboards and alerts match these names, types and labels: a change here must be
    /// deliberate (update `metrics.golden` and the table in docs/operating.md together).
    #[test]
    fn exported_families_match_the_golden_list() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        let golden = include_str!("metrics.golden");
        assert_eq!(
            shape(&page),
            golden,
            "the exported families changed; the page was:\n{page}"
        );
    }

    #[test]
    fn bypassed_ipsec_policies_are_counted_per_family_once_read() {
        let (mut status, counts) = representative();
        let page = render(&status, Some(&counts));
        let series = |family: &str| format!(r#"masq_xfrm_policies_bypassed{{family="{family}"}}"#);
        assert_eq!(sample(&page, &series("ipv4")), Some(1.0), "{page}");
        assert_eq!(sample(&page, &series("ipv6")), Some(0.0), "{page}");
        // Unreadable policies are not "none".
        status.ipsec = Some(IpsecStatus::Unknown("EPERM".to_owned()));
        let page = render(&status, Some(&counts));
        assert!(!page.contains("masq_xfrm_policies_bypassed"), "{page}");
    }

    #[test]
    fn the_kernel_and_each_programs_verified_size_are_exported() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        assert_eq!(
            sample(
                &page,
                r#"masq_kernel_info{release="6.1.0-28-amd64",attach_mode="tc"}"#
            ),
            Some(1.0),
            "{page}"
        );
        assert_eq!(
            sample(
                &page,
                r#"masq_program_verified_instructions{program="masq_egress"}"#
            ),
            Some(42_744.0),
            "{page}"
        );
        assert!(
            !page.contains(r#"program="masq_ingress""#),
            "a size the kernel did not report has no series: {page}"
        );
    }

    #[test]
    fn every_family_is_declared_before_use_and_labels_are_escaped() {
        let status = AgentStatus {
            ready: true,
            uplinks: vec![up0(true, UplinkIpv6::NotTranslated)],
            config_origin: Some("/etc/config/ip-masq-agent (file)".to_owned()),
            last_error: Some(crate::agent::status::ConfigFailure {
                reason: "invalid",
                message: "CIDR \"x\" could not be parsed\nnext".to_owned(),
            }),
            ..AgentStatus::default()
        };
        let counts = DatapathCounts {
            packets: [
                vec![
                    (Counter::EgressMasqueraded, 5),
                    (Counter::EgressDropNoPort, 2),
                ],
                vec![(Counter::EgressMasqueraded, 7)],
            ],
            // Nine attempt buckets (3 flows at the first port, 1 at the second), 2 failures,
            // 5 attempts in all.
            allocation: vec![3, 1, 0, 0, 0, 0, 0, 0, 0, 2, 5],
            evictions: [evictions(0), evictions(0)],
        };
        let page = render(&status, Some(&counts));
        assert!(
            page.contains(
                r#"masq_agent_info{config="/etc/config/ip-masq-agent (file)",adopted="false"} 1"#
            ),
            "{page}"
        );
        assert!(
            page.contains(
                r#"masq_uplink_info{interface="up0",node_ip="192.0.2.1",attach_mode="tcx"} 1"#
            ),
            "{page}"
        );
        assert!(page.contains("masq_upstream_chain_present 0\n"), "{page}");
        assert!(
            page.contains(
                "masq_datapath_packets_total{outcome=\"egress_masqueraded\",family=\"ipv4\"} 5\n"
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "masq_datapath_packets_total{outcome=\"egress_masqueraded\",family=\"ipv6\"} 7\n"
            ),
            "{page}"
        );
        assert!(
            page.contains(
                "masq_datapath_drops_total{direction=\"egress\",reason=\"no_port\",family=\"ipv4\"} 2\n"
            ),
            "{page}"
        );
        assert_eq!(
            bucket(&page, "masq_port_allocation_attempts", 2.0),
            Some(4.0),
            "{page}"
        );
        assert!(
            page.contains("masq_port_allocation_attempts_count 4\n"),
            "{page}"
        );
        // prometheus-client writes the sum as a float ("5.0"); the value is what matters.
        assert_eq!(
            sample(&page, "masq_port_allocation_attempts_sum"),
            Some(5.0),
            "{page}"
        );
        assert!(
            page.contains("masq_port_allocation_failures_total 2\n"),
            "{page}"
        );
        assert!(
            page.contains("masq_config_last_error{reason=\"invalid\"} 1\n")
                && !page.contains("could not be parsed"),
            "{page}"
        );
        let mut declared = std::collections::HashSet::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap_or_default().to_owned());
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let base = name
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                assert!(
                    declared.contains(name) || declared.contains(base),
                    "{name} used before its TYPE line"
                );
            }
        }
    }
}
