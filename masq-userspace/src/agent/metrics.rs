//! Prometheus metrics and health endpoints.
//!
//! `GET /metrics` (Prometheus text exposition format 0.0.4), `GET /healthz` (the agent is alive),
//! `GET /readyz` (the datapath is attached and a config is in force). HTTP is hyper's, on the
//! agent's own runtime; the families are modelled with prometheus-client and every value is read
//! when a scrape asks for it: the agent's status, the pinned datapath maps and `/proc/self`.

use std::{
    convert::Infallible,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Bytes,
    header::{CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use masq_common::{
    counters::{ALLOC_ATTEMPT_BUCKETS, ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter},
    flow::{EvictionCause, FlowClass},
    layout::MAP_LAYOUT_VERSION,
};
use procfs::{
    WithCurrentSystemInfo as _,
    process::{LimitValue, Process},
};
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
        NoLabelSet,
    },
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tokio::{net::TcpListener, task::JoinHandle};

use super::status::{AgentStatus, IpsecStatus, SharedStatus, UplinkIpv6};
use crate::datapath::{
    maps::DatapathMaps,
    snapshot::{DatapathCounts, FAMILIES},
};

/// How long one connection may take, request and response together: a slow or stuck client
/// must not hold a task (and a file descriptor) for ever.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the classic Prometheus text format, which is what `/metrics` serves.
const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running server; stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    task: JoinHandle<()>,
    /// The address actually bound (useful with port 0).
    pub local_addr: SocketAddr,
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every request handler shares.
#[derive(Debug)]
struct Endpoint {
    status: SharedStatus,
    registry: Registry,
}

/// How long a port another process still holds is retried before the bind fails.
const BIND_RETRY_FOR: Duration = Duration::from_secs(3);

/// Binds `addr`, retrying for a moment while it is in use: the agent this one replaces may
/// still be letting go of it (a killed process whose forked child has not reached `exec` yet
/// holds a copy of the socket).
async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + BIND_RETRY_FOR;
    loop {
        match TcpListener::bind(addr).await {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// Binds `addr` and serves until the returned handle is dropped.
///
/// The socket is bound before this returns, so a bind error comes back here and not later.
pub async fn serve(
    addr: SocketAddr,
    status: SharedStatus,
    pin_path: Option<PathBuf>,
) -> std::io::Result<MetricsServer> {
    let listener = bind(addr).await?;
    let local_addr = listener.local_addr()?;
    tracing::info!(%local_addr, "serving /metrics, /healthz and /readyz");
    let endpoint = Arc::new(Endpoint {
        registry: registry(AgentCollector::Live {
            status: status.clone(),
            pin_path,
        }),
        status,
    });
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let endpoint = Arc::clone(&endpoint);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let endpoint = Arc::clone(&endpoint);
                    async move { Ok::<_, Infallible>(respond(&endpoint, &request).await) }
                });
                // One request per connection, as scrapers and probes use them: no idle
                // keep-alive connections to bound.
                let connection = http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(REQUEST_TIMEOUT, connection).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::debug!(%error, "metrics connection failed"),
                    Err(error) => tracing::debug!(%error, "metrics request timed out"),
                }
            });
        }
    });
    Ok(MetricsServer { task, local_addr })
}

fn text(code: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

async fn respond<B>(endpoint: &Arc<Endpoint>, request: &Request<B>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed\n".to_owned(),
        );
    }
    match request.uri().path() {
        "/metrics" => {
            // Reading the pinned maps is a run of bpf syscalls: keep it off the runtime's thread.
            let scrape = Arc::clone(endpoint);
            match tokio::task::spawn_blocking(move || encode(&scrape.registry)).await {
                Ok(Ok(page)) => text(StatusCode::OK, EXPOSITION_CONTENT_TYPE, page),
                Ok(Err(fmt::Error)) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "rendering failed\n".to_owned(),
                ),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    format!("rendering failed: {error}\n"),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => {
            let status = endpoint.status.lock();
            if status.ready {
                text(StatusCode::OK, "text/plain", "ready\n".to_owned())
            } else {
                let reason = status.not_ready_reason.as_deref().unwrap_or("starting");
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {reason}\n"),
                )
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_owned(),
        ),
    }
}

/// The registry `/metrics` serves: the agent's families, then the process's.
fn registry(agent: AgentCollector) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(agent));
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// Encodes `registry` in the classic Prometheus text format.
fn encode(registry: &Registry) -> Result<String, fmt::Error> {
    let mut openmetrics = String::with_capacity(8 * 1024);
    prometheus_client::encoding::text::encode_registry(&mut openmetrics, registry)?;
    Ok(to_prometheus_text(&openmetrics))
}

/// Turns prometheus-client's OpenMetrics text into the classic 0.0.4 text format.
///
/// The two differ in what this agent emits only in counter family names (OpenMetrics names the
/// family without `_total`, the classic format names it as its sample, which is what dashboards
/// and the 0.0.4 parser match) and in the `# EOF` trailer the classic format does not have.
fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 256);
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let comment = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|prefix| line.starts_with(prefix));
        if let Some(prefix) = comment {
            let rest = &line[prefix.len()..];
            let name = rest.split(' ').next().unwrap_or_default();
            if counters.contains(name) {
                out.push_str(prefix);
                out.push_str(name);
                out.push_str("_total");
                out.push_str(&rest[name.len()..]);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The page `/metrics` would serve for `status` and the datapath's `counts` (`None`: the maps
/// could not be read), process metrics included.
pub fn render(status: &AgentStatus, counts: Option<&DatapathCounts>) -> String {
    let registry = registry(AgentCollector::Fixed(Box::new((
        status.clone(),
        counts.cloned(),
    ))));
    // Writing to a String cannot fail, and every value is encodable.
    encode(&registry).unwrap_or_else(|fmt::Error| String::new())
}

/// The datapath's counts as the maps pinned under `pin_path` hold them now: none at all for an
/// agent without a datapath (no `pin_path`), `None` when the maps cannot be read.
fn read_counts(pin_path: Option<&Path>) -> Option<DatapathCounts> {
    let Some(pin_path) = pin_path else {
        return Some(DatapathCounts::default());
    };
    DatapathMaps::from_pins(pin_path)
        .and_then(|maps| DatapathCounts::read(&maps))
        .inspect_err(|error| tracing::debug!(%error, "reading the datapath's counts for a scrape"))
        .ok()
}

fn seconds(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map(|elapsed| elapsed.as_secs_f64())
}

/// The agent's families, read when a scrape encodes them.
#[derive(Debug)]
enum AgentCollector {
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

/// A family of one or more series of `metric`.
fn family<L: EncodeLabelSet, M: EncodeMetric>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric_type: MetricType,
    series: impl IntoIterator<Item = (L, M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A gauge family without labels.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    // Straight on the family's encoder: a labelled series with no labels would read `name{}`.
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family without labels; `name` is without the `_total` the encoding appends.
fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeCounterValue,
) -> fmt::Result {
    // Straight on the family's encoder: a labelled series with no labels would read `name{}`.
    ConstCounter::new(value).encode(encoder.encode_descriptor(
        name,
        help,
        None,
        MetricType::Counter,
    )?)
}

/// Gauge series of `series`' values under their labels.
fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    series: impl IntoIterator<Item = (L, V)>,
) -> impl Iterator<Item = (L, ConstGauge<V>)> {
    series
        .into_iter()
        .map(|(labels, value)| (labels, ConstGauge::new(value)))
}

/// Counter series of `series`' values under their labels.
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    series: impl IntoIterator<Item = (L, V)>,
) -> impl Iterator<Item = (L, ConstCounter<V>)> {
    series
        .into_iter()
        .map(|(labels, value)| (labels, ConstCounter::new(value)))
}

/// The process families Prometheus client libraries export, read from `/proc/self` at every
/// scrape.
///
/// A value that cannot be read is left out rather than reported as 0, as other clients do.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let encoder = &mut encoder;
        // Counted before procfs opens `/proc/self`, whose handle would be counted too.
        let open_fds = open_fds();
        let process = Process::myself().ok();
        let stat = process.as_ref().and_then(|process| process.stat().ok());
        if let Some(stat) = &stat {
            counter(
                encoder,
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                seconds_of_ticks(stat.utime + stat.stime),
            )?;
        }
        if let Some(open) = open_fds {
            gauge(
                encoder,
                "process_open_fds",
                "Number of open file descriptors.",
                open,
            )?;
        }
        let max_fds = process
            .as_ref()
            .and_then(|process| process.limits().ok())
            .map(|limits| limits.max_open_files.soft_limit);
        if let Some(LimitValue::Value(max)) = max_fds {
            gauge(
                encoder,
                "process_max_fds",
                "Maximum number of open file descriptors.",
                max,
            )?;
        }
        let Some(stat) = &stat else {
            return Ok(());
        };
        gauge(
            encoder,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize,
        )?;
        gauge(
            encoder,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            stat.rss_bytes().get(),
        )?;
        if let Ok(boot) = procfs::boot_time_secs() {
            #[expect(clippy::cast_precision_loss, reason = "Unix times stay far below 2^53")]
            let boot = boot as f64;
            gauge(
                encoder,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot + seconds_of_ticks(stat.starttime),
            )?;
        }
        Ok(())
    }
}

/// The file descriptors this process has open, less the one reading them. (procfs's
/// `Process::fd_count` counts the handles it opens itself as well, one or two by kernel.)
fn open_fds() -> Option<usize> {
    let fds = std::fs::read_dir("/proc/self/fd").ok()?;
    Some(fds.count().saturating_sub(1))
}

/// `ticks` of the clock `/proc` counts process times in, in seconds.
#[expect(
    clippy::cast_precision_loss,
    reason = "tick counts stay far below 2^53"
)]
fn seconds_of_ticks(ticks: u64) -> f64 {
    ticks as f64 / procfs::ticks_per_second() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `series` (name and labels, exactly) on `page`.
    fn sample(page: &str, series: &str) -> Option<f64> {
        page.lines()
            .filter(|line| !line.starts_with('#'))
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// The value of histogram `name`'s bucket bounded by `bound` on `page`, however the bound
    /// is written (`2`, `2.0`).
    fn bucket(page: &str, name: &str, bound: f64) -> Option<f64> {
        let prefix = format!("{name}_bucket{{le=\"");
        page.lines().find_map(|line| {
            let (written, value) = line.strip_prefix(&prefix)?.split_once("\"} ")?;
            (written.parse::<f64>().ok()? == bound).then(|| value.parse().ok())?
        })
    }

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

    /// A status and counts under which every family masq can export has a series.
    fn representative() -> (AgentStatus, DatapathCounts) {
        let status = AgentStatus {
            ready: true,
            uplinks: vec![crate::agent::status::UplinkStatus {
                interface: "up0".to_owned(),
                node_ip: Some(std::net::Ipv4Addr::new(192, 0, 2, 1)),
                attach_mode: "tcx",
                address_is_local: false,
                ipv6: UplinkIpv6::NoAddress,
            }],
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
    fn the_page_is_the_classic_text_format() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        assert!(!page.contains("# EOF"), "{page}");
        assert!(!page.contains("# UNIT"), "{page}");
        assert!(
            page.contains("# TYPE masq_datapath_packets_total counter\n"),
            "{page}"
        );
        assert!(page.contains("# HELP process_cpu_seconds_total "), "{page}");
        assert_eq!(
            sample(&page, r#"masq_uplink_address_local{interface="up0"}"#),
            Some(0.0),
            "{page}"
        );
        assert_eq!(
            bucket(&page, "masq_port_allocation_attempts", 32.0),
            Some(6.0),
            "{page}"
        );
        let start = sample(&page, "process_start_time_seconds").unwrap_or_default();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        assert!(start > 1e9 && start <= now + 1.0, "{page}");
        assert!(
            sample(&page, "process_resident_memory_bytes").unwrap_or_default() > 0.0,
            "{page}"
        );
        assert!(
            sample(&page, "process_open_fds").unwrap_or_default() >= 1.0,
            "{page}"
        );
    }

    #[test]
    fn the_process_families_describe_this_process() {
        let (status, counts) = representative();
        let page = render(&status, Some(&counts));
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .unwrap_or_else(|error| panic!("getrlimit: {error}"));
        #[expect(
            clippy::cast_precision_loss,
            reason = "a file limit stays far below 2^53"
        )]
        let soft = soft as f64;
        assert_eq!(sample(&page, "process_max_fds"), Some(soft), "{page}");
        let resident = sample(&page, "process_resident_memory_bytes").unwrap_or_default();
        let size = sample(&page, "process_virtual_memory_bytes").unwrap_or_default();
        assert!(resident > 0.0 && size >= resident, "{page}");
        assert!(
            sample(&page, "process_cpu_seconds_total").is_some_and(|seconds| seconds >= 0.0),
            "{page}"
        );
    }

    #[test]
    fn only_counter_names_and_the_trailer_differ_from_openmetrics() {
        let openmetrics = "# HELP a_seconds A counter.\n# TYPE a_seconds counter\na_seconds_total 1\n\
             # HELP b A gauge named like a counter.\n# TYPE b gauge\nb 2.5\n\
             # TYPE h histogram\nh_sum 1.5\nh_count 1\nh_bucket{le=\"0.5\"} 0\n\
             h_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(openmetrics),
            "# HELP a_seconds_total A counter.\n# TYPE a_seconds_total counter\na_seconds_total 1\n\
             # HELP b A gauge named like a counter.\n# TYPE b gauge\nb 2.5\n\
             # TYPE h histogram\nh_sum 1.5\nh_count 1\nh_bucket{le=\"0.5\"} 0\n\
             h_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 1\n"
        );
    }

    /// Sends one raw HTTP/1.1 request and returns the status line and body.
    async fn request(addr: SocketAddr, method: &str, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|error| {
                panic!("connecting to {addr}: {error}");
            });
        let head = format!("{method} {path} HTTP/1.1\r\nHost: masq\r\n\r\n");
        stream
            .write_all(head.as_bytes())
            .await
            .unwrap_or_else(|error| panic!("sending: {error}"));
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .unwrap_or_else(|error| panic!("reading: {error}"));
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        let status = head.lines().next().unwrap_or_default().to_owned();
        (status, body.to_owned())
    }

    #[tokio::test]
    async fn endpoints_answer_by_path_and_method() {
        let status = SharedStatus::default();
        status.lock().not_ready_reason = Some("no uplink yet".to_owned());
        let server = serve(SocketAddr::from(([127, 0, 0, 1], 0)), status.clone(), None)
            .await
            .unwrap_or_else(|error| panic!("binding: {error}"));
        let addr = server.local_addr;

        let (code, body) = request(addr, "GET", "/metrics").await;
        assert_eq!(code, "HTTP/1.1 200 OK");
        assert!(body.contains("masq_ready 0\n"), "{body}");
        assert!(body.contains("# TYPE process_open_fds gauge\n"), "{body}");
        assert_eq!(request(addr, "GET", "/healthz").await.1, "ok\n");
        assert_eq!(
            request(addr, "GET", "/readyz").await,
            (
                "HTTP/1.1 503 Service Unavailable".to_owned(),
                "not ready: no uplink yet\n".to_owned()
            )
        );
        status.lock().ready = true;
        assert_eq!(
            request(addr, "GET", "/readyz?verbose").await,
            ("HTTP/1.1 200 OK".to_owned(), "ready\n".to_owned())
        );
        assert_eq!(
            request(addr, "GET", "/nothing").await.0,
            "HTTP/1.1 404 Not Found"
        );
        assert_eq!(
            request(addr, "POST", "/metrics").await.0,
            "HTTP/1.1 405 Method Not Allowed"
        );

        // A second bind of the same address fails in `serve` itself.
        assert!(serve(addr, status, None).await.is_err());
    }

    #[test]
    fn every_family_is_declared_before_use_and_labels_are_escaped() {
        let status = AgentStatus {
            ready: true,
            uplinks: vec![crate::agent::status::UplinkStatus {
                interface: "up0".to_owned(),
                node_ip: Some(std::net::Ipv4Addr::new(192, 0, 2, 1)),
                attach_mode: "tcx",
                address_is_local: true,
                ipv6: UplinkIpv6::NotTranslated,
            }],
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
