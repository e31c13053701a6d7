//! Prometheus metrics and health endpoints.
//!
//! `GET /metrics` (text exposition format 0.0.4), `GET /healthz` (the agent is alive),
//! `GET /readyz` (the datapath is attached and a config is in force). The server is a small
//! HTTP/1.1 responder: one request per connection, bounded reads, no dependencies.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use masq_common::{
    counters::{ALLOC_ATTEMPT_BUCKETS, ALLOC_FAILED_SLOT, ALLOC_SUM_SLOT, Counter},
    layout::MAP_LAYOUT_VERSION,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

use super::status::{AgentStatus, SharedStatus};
use crate::datapath::maps::DatapathMaps;

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

/// Binds `addr` and serves until the returned handle is dropped.
pub async fn serve(
    addr: SocketAddr,
    status: SharedStatus,
    pin_path: Option<PathBuf>,
) -> std::io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr).await?;
    let local_addr = listener.local_addr()?;
    tracing::info!(%local_addr, "serving /metrics, /healthz and /readyz");
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let status = status.clone();
            let pin_path = pin_path.clone();
            tokio::spawn(async move {
                if let Err(error) =
                    tokio::time::timeout(Duration::from_secs(10), handle(stream, &status, pin_path))
                        .await
                {
                    tracing::debug!(%error, "metrics request timed out");
                }
            });
        }
    });
    Ok(MetricsServer { task, local_addr })
}

async fn handle(mut stream: TcpStream, status: &SharedStatus, pin_path: Option<PathBuf>) {
    let mut request = Vec::with_capacity(1024);
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|window| window == b"\r\n\r\n") && request.len() < 16 * 1024 {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => request.extend_from_slice(&buffer[..read]),
        }
    }
    let head = String::from_utf8_lossy(&request);
    let mut words = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, path) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    let path = path.split('?').next().unwrap_or_default();
    let (code, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            let snapshot = status.snapshot();
            let body = tokio::task::spawn_blocking(move || {
                let readings = pin_path.as_deref().map(read_datapath).unwrap_or_default();
                render(&snapshot, &readings)
            })
            .await
            .unwrap_or_else(|error| format!("# rendering failed: {error}\n"));
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_owned()),
        ("GET", "/readyz") if status.lock().ready => ("200 OK", "text/plain", "ready\n".to_owned()),
        ("GET", "/readyz") => {
            let reason = status
                .lock()
                .not_ready_reason
                .clone()
                .unwrap_or_else(|| "starting".to_owned());
            (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {reason}\n"),
            )
        }
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Counters and the allocation histogram read from the pinned maps.
#[derive(Debug, Default)]
pub struct DatapathReadings {
    /// Counter totals, or empty when the maps could not be read.
    pub counters: Vec<(Counter, u64)>,
    /// Allocation histogram buckets.
    pub allocation: Vec<u64>,
    /// Why the maps could not be read.
    pub error: Option<String>,
}

fn read_datapath(pin_path: &std::path::Path) -> DatapathReadings {
    let read = || -> Result<DatapathReadings, crate::datapath::DatapathError> {
        let maps = DatapathMaps::from_pins(pin_path)?;
        Ok(DatapathReadings {
            counters: maps.counter_totals()?,
            allocation: maps.alloc_histogram()?,
            error: None,
        })
    };
    read().unwrap_or_else(|error| DatapathReadings {
        error: Some(error.to_string()),
        ..DatapathReadings::default()
    })
}

fn seconds(time: Option<SystemTime>) -> Option<f64> {
    time.and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map(|elapsed| elapsed.as_secs_f64())
}

/// Escapes a label value (`\`, `"` and newlines).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The metrics page for `status` and `datapath`.
pub fn render(status: &AgentStatus, datapath: &DatapathReadings) -> String {
    let mut out = String::with_capacity(8 * 1024);

    family(
        &mut out,
        "masq_build_info",
        "gauge",
        "masq version and datapath map layout.",
    );
    let _ = writeln!(
        out,
        "masq_build_info{{version=\"{}\",layout_version=\"{MAP_LAYOUT_VERSION}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    family(
        &mut out,
        "masq_ready",
        "gauge",
        "1 when the datapath is attached and a config is in force.",
    );
    let _ = writeln!(out, "masq_ready {}", u8::from(status.ready));
    family(
        &mut out,
        "masq_agent_info",
        "gauge",
        "The config source in force, and whether pinned state was adopted.",
    );
    let _ = writeln!(
        out,
        "masq_agent_info{{config=\"{}\",adopted=\"{}\"}} 1",
        label(status.config_origin.as_deref().unwrap_or("")),
        status.adopted
    );
    family(
        &mut out,
        "masq_uplink_info",
        "gauge",
        "One series per interface masq translates on: the address traffic leaving by it is masqueraded to, and how the programs are attached.",
    );
    for uplink in &status.uplinks {
        let _ = writeln!(
            out,
            "masq_uplink_info{{interface=\"{}\",node_ip=\"{}\",attach_mode=\"{}\"}} 1",
            label(&uplink.interface),
            uplink.node_ip,
            uplink.attach_mode
        );
    }
    family(
        &mut out,
        "masq_uplink_address_local",
        "gauge",
        "Per uplink: 1 when the address traffic is masqueraded to is one of the interface's own, 0 for a --node-ip the interface does not have (replies must be routed to the node).",
    );
    for uplink in &status.uplinks {
        let _ = writeln!(
            out,
            "masq_uplink_address_local{{interface=\"{}\"}} {}",
            label(&uplink.interface),
            u8::from(uplink.address_is_local)
        );
    }
    family(
        &mut out,
        "masq_upstream_chain_present",
        "gauge",
        "1 while an upstream ip-masq-agent chain is installed next to masq (it masquerades before masq sees the packets).",
    );
    let _ = writeln!(
        out,
        "masq_upstream_chain_present {}",
        u8::from(status.upstream_chain.is_some())
    );
    if let Some(started) = seconds(status.started) {
        family(
            &mut out,
            "masq_start_time_seconds",
            "gauge",
            "When the agent started (Unix time).",
        );
        let _ = writeln!(out, "masq_start_time_seconds {started}");
    }

    family(
        &mut out,
        "masq_datapath_packets_total",
        "counter",
        "Packets handled by the datapath, by outcome.",
    );
    for (counter, value) in &datapath.counters {
        let _ = writeln!(
            out,
            "masq_datapath_packets_total{{outcome=\"{}\"}} {value}",
            counter.name()
        );
    }
    family(
        &mut out,
        "masq_datapath_drops_total",
        "counter",
        "Packets the datapath dropped, by reason.",
    );
    for (counter, value) in &datapath.counters {
        if let Some(reason) = counter
            .name()
            .strip_prefix("egress_drop_")
            .or_else(|| counter.name().strip_prefix("ingress_drop_"))
        {
            let direction = if counter.name().starts_with("egress") {
                "egress"
            } else {
                "ingress"
            };
            let _ = writeln!(
                out,
                "masq_datapath_drops_total{{direction=\"{direction}\",reason=\"{reason}\"}} {value}"
            );
        }
    }
    family(
        &mut out,
        "masq_datapath_read_errors",
        "gauge",
        "1 when the pinned maps could not be read for this scrape.",
    );
    let _ = writeln!(
        out,
        "masq_datapath_read_errors {}",
        u8::from(datapath.error.is_some())
    );

    if let (Some(attempts), Some(&failed), Some(&sum)) = (
        datapath.allocation.get(..ALLOC_ATTEMPT_BUCKETS as usize),
        datapath.allocation.get(ALLOC_FAILED_SLOT as usize),
        datapath.allocation.get(ALLOC_SUM_SLOT as usize),
    ) {
        family(
            &mut out,
            "masq_port_allocation_attempts",
            "histogram",
            "Ports tried per new flow until a free one was found (successful allocations).",
        );
        let mut cumulative = 0u64;
        for (index, count) in attempts.iter().enumerate() {
            cumulative += count;
            let _ = writeln!(
                out,
                "masq_port_allocation_attempts_bucket{{le=\"{}\"}} {cumulative}",
                1u32 << index
            );
        }
        let _ = writeln!(
            out,
            "masq_port_allocation_attempts_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(out, "masq_port_allocation_attempts_sum {sum}");
        let _ = writeln!(out, "masq_port_allocation_attempts_count {cumulative}");
        family(
            &mut out,
            "masq_port_allocation_failures_total",
            "counter",
            "New flows that found no free port.",
        );
        let _ = writeln!(out, "masq_port_allocation_failures_total {failed}");
    }

    family(
        &mut out,
        "masq_nat_entries",
        "gauge",
        "NAT table entries (two per flow) at the last garbage collection.",
    );
    let _ = writeln!(out, "masq_nat_entries {}", status.last_gc.entries);
    family(
        &mut out,
        "masq_nat_flows",
        "gauge",
        "Translated flows at the last garbage collection.",
    );
    let _ = writeln!(out, "masq_nat_flows {}", status.last_gc.flows);
    family(
        &mut out,
        "masq_nat_capacity_entries",
        "gauge",
        "Capacity of the NAT table.",
    );
    let _ = writeln!(out, "masq_nat_capacity_entries {}", status.nat_capacity);
    family(
        &mut out,
        "masq_gc_expired_flows_total",
        "counter",
        "Flows removed by garbage collection since start.",
    );
    let _ = writeln!(
        out,
        "masq_gc_expired_flows_total {}",
        status.gc_expired_total
    );

    family(
        &mut out,
        "masq_config_reloads_total",
        "counter",
        "Config loads, by result.",
    );
    let _ = writeln!(
        out,
        "masq_config_reloads_total{{result=\"ok\"}} {}",
        status.reloads_ok
    );
    let _ = writeln!(
        out,
        "masq_config_reloads_total{{result=\"failed\"}} {}",
        status.reloads_failed
    );
    if let Some(time) = seconds(status.last_success) {
        family(
            &mut out,
            "masq_config_last_success_timestamp_seconds",
            "gauge",
            "When a config last loaded.",
        );
        let _ = writeln!(out, "masq_config_last_success_timestamp_seconds {time}");
    }
    if let Some(time) = seconds(status.last_failure) {
        family(
            &mut out,
            "masq_config_last_failure_timestamp_seconds",
            "gauge",
            "When a config last failed to load.",
        );
        let _ = writeln!(out, "masq_config_last_failure_timestamp_seconds {time}");
    }
    family(
        &mut out,
        "masq_config_last_error",
        "gauge",
        "1 with the kind of the last config error (read, syntax, decode, invalid, empty, capacity, apply) until a load succeeds; the message is in the log and /readyz.",
    );
    if let Some(error) = &status.last_error {
        let _ = writeln!(
            out,
            "masq_config_last_error{{reason=\"{}\"}} 1",
            error.reason
        );
    }
    family(
        &mut out,
        "masq_config_cidrs",
        "gauge",
        "Non-masquerade CIDRs in force, by family.",
    );
    let _ = writeln!(
        out,
        "masq_config_cidrs{{family=\"ipv4\"}} {}",
        status.cidrs_v4
    );
    let _ = writeln!(
        out,
        "masq_config_cidrs{{family=\"ipv6\"}} {}",
        status.cidrs_v6
    );
    family(
        &mut out,
        "masq_nomasq_trie_entries",
        "gauge",
        "Entries in the datapath's non-masquerade trie (link-local included).",
    );
    let _ = writeln!(out, "masq_nomasq_trie_entries {}", status.trie_entries);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_declared_before_use_and_labels_are_escaped() {
        let status = AgentStatus {
            ready: true,
            uplinks: vec![crate::agent::status::UplinkStatus {
                interface: "up0".to_owned(),
                node_ip: std::net::Ipv4Addr::new(192, 0, 2, 1),
                attach_mode: "tcx",
                address_is_local: true,
            }],
            config_origin: Some("/etc/config/ip-masq-agent (file)".to_owned()),
            last_error: Some(crate::agent::status::ConfigFailure {
                reason: "invalid",
                message: "CIDR \"x\" could not be parsed\nnext".to_owned(),
            }),
            ..AgentStatus::default()
        };
        let readings = DatapathReadings {
            counters: vec![
                (Counter::EgressMasqueraded, 5),
                (Counter::EgressDropNoPort, 2),
            ],
            // Six attempt buckets (3 flows at the first port, 1 at the second), 2 failures,
            // 5 attempts in all.
            allocation: vec![3, 1, 0, 0, 0, 0, 2, 5],
            error: None,
        };
        let page = render(&status, &readings);
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
            page.contains("masq_datapath_packets_total{outcome=\"egress_masqueraded\"} 5\n"),
            "{page}"
        );
        assert!(
            page.contains("masq_datapath_drops_total{direction=\"egress\",reason=\"no_port\"} 2\n"),
            "{page}"
        );
        assert!(
            page.contains("masq_port_allocation_attempts_bucket{le=\"2\"} 4\n"),
            "{page}"
        );
        assert!(
            page.contains("masq_port_allocation_attempts_count 4\n"),
            "{page}"
        );
        assert!(
            page.contains("masq_port_allocation_attempts_sum 5\n"),
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
