//! `masq nat list`: the translated flows, as the NAT tables pair their halves.

use std::{
    io::{self, Write},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
};

use clap::{Args, Subcommand};
use masq::{
    datapath::{flows::Flow, gc::monotonic_now_ns, snapshot::DatapathSnapshot},
    node::reserved_ports::DEFAULT_SYSCTL_DIR,
};
use masq_common::flow::Timeouts;
use serde::Serialize;

use super::{
    OutputFormat,
    check_config::fail,
    pins::{PinArgs, open},
};

#[derive(Subcommand, Debug)]
pub(crate) enum NatCommand {
    /// List translated flows.
    List(NatListArgs),
}

#[derive(Args, Debug)]
pub(crate) struct NatListArgs {
    #[command(flatten)]
    pins: PinArgs,
    /// Only flows from this pod (or node) address.
    #[arg(long, value_name = "IP")]
    pod: Option<IpAddr>,
    /// Only flows to this remote address, or address:port (`[address]:port` for IPv6).
    #[arg(long, value_name = "IP[:PORT]")]
    remote: Option<String>,
    /// Only this protocol (tcp, udp, icmp, icmpv6, sctp, or a number).
    #[arg(long, value_name = "PROTO")]
    protocol: Option<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    /// Where the node's sysctls are: conntrack's timeouts there say when each flow expires
    /// (see `masq agent --sysctl-dir`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SYSCTL_DIR)]
    sysctl_dir: PathBuf,
}

#[derive(Serialize)]
struct FlowJson {
    protocol: String,
    source: String,
    remote: String,
    translated: String,
    state: String,
    assured: bool,
    node_flow: bool,
    age_seconds: u64,
    idle_seconds: u64,
    expires_in_seconds: u64,
}

impl FlowJson {
    /// `flow` as `masq nat list` shows it at `now_ns`, expiring after conntrack's `timeouts`.
    fn of(flow: &Flow, now_ns: u64, timeouts: &Timeouts) -> Self {
        let seconds = |since: u64| now_ns.saturating_sub(since) / 1_000_000_000;
        Self {
            protocol: flow.protocol_name(),
            source: flow.source.to_string(),
            remote: flow.remote.to_string(),
            translated: flow.translated.to_string(),
            state: flow.state().to_owned(),
            assured: flow.assured(),
            node_flow: flow.is_node_flow(),
            age_seconds: seconds(flow.egress.created_ns),
            idle_seconds: seconds(flow.last_seen_ns()),
            expires_in_seconds: (flow.last_seen_ns() + flow.lifetime_ns(timeouts))
                .saturating_sub(now_ns)
                / 1_000_000_000,
        }
    }
}

fn matches(flow: &Flow, args: &NatListArgs) -> Result<bool, String> {
    if let Some(pod) = args.pod
        && flow.source.ip() != pod
    {
        return Ok(false);
    }
    if let Some(remote) = &args.remote {
        let wanted = match remote.parse::<SocketAddr>() {
            Ok(endpoint) => endpoint == flow.remote,
            Err(_) => match remote.parse::<IpAddr>() {
                Ok(address) => address == flow.remote.ip(),
                Err(_) => {
                    return Err(format!(
                        "--remote {remote:?} is not an IP address or address:port ([v6]:port)"
                    ));
                }
            },
        };
        if !wanted {
            return Ok(false);
        }
    }
    if let Some(protocol) = &args.protocol
        && !(flow.protocol_name() == protocol.to_ascii_lowercase()
            || flow.protocol.to_string() == *protocol)
    {
        return Ok(false);
    }
    Ok(true)
}

pub(crate) fn run(command: &NatCommand) -> anyhow::Result<ExitCode> {
    let NatCommand::List(args) = command;
    let maps = match open(&args.pins.pin_path) {
        Ok(maps) => maps,
        Err(code) => return Ok(code),
    };
    let now = monotonic_now_ns();
    let snapshot = DatapathSnapshot::read(&maps)?;
    let mut selected = Vec::new();
    for flow in snapshot.flows() {
        match matches(flow, args) {
            Ok(true) => selected.push(flow),
            Ok(false) => {}
            Err(message) => return Ok(fail(&message)),
        }
    }
    let timeouts = masq::node::timeouts::of_node(&args.sysctl_dir);
    let rows: Vec<FlowJson> = selected
        .into_iter()
        .map(|flow| FlowJson::of(flow, now, &timeouts))
        .collect();
    let mut out = io::stdout().lock();
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &rows)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_flow_table(&mut out, &rows)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The flows as a table with a header, a row per flow and the count at the end.
fn write_flow_table(out: &mut impl Write, rows: &[FlowJson]) -> io::Result<()> {
    let sources: Vec<String> = rows
        .iter()
        .map(|row| {
            if row.node_flow {
                format!("{} (node)", row.source)
            } else {
                row.source.clone()
            }
        })
        .collect();
    // Columns as wide as their widest endpoint: an IPv6 one is twice an IPv4 one.
    let width = |column: &mut dyn Iterator<Item = usize>| column.max().unwrap_or(0).max(21);
    let source_width = width(&mut sources.iter().map(String::len));
    let remote_width = width(&mut rows.iter().map(|row| row.remote.len()));
    let translated_width = width(&mut rows.iter().map(|row| row.translated.len()));
    writeln!(
        out,
        "{:<6} {:<source_width$} {:<remote_width$} {:<translated_width$} {:<11} {:<7} {:>8} {:>8} {:>8}",
        "PROTO", "SOURCE", "REMOTE", "TRANSLATED", "STATE", "ASSURED", "AGE", "IDLE", "EXPIRES"
    )?;
    for (row, source) in rows.iter().zip(&sources) {
        writeln!(
            out,
            "{:<6} {source:<source_width$} {:<remote_width$} {:<translated_width$} {:<11} {:<7} {:>7}s {:>7}s {:>7}s",
            row.protocol,
            row.remote,
            row.translated,
            row.state,
            if row.assured { "yes" } else { "no" },
            row.age_seconds,
            row.idle_seconds,
            row.expires_in_seconds
        )?;
    }
    writeln!(out, "{} flows", rows.len())
}
