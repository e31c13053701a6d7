//! `masq status`, `masq nat list` and `masq uninstall`: working on the pinned datapath, while
//! an agent runs or after it stopped.

use std::{
    io::{self, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
};

use clap::{Args, Subcommand};
use masq::{
    datapath::{
        attach::{AttachMode, programs_on},
        flows::{Flow, flows},
        gc::{self, monotonic_now_ns},
        maps::{DatapathMaps, Trie},
        pins::{DEFAULT_PIN_PATH, Hook, PinDir},
    },
    ipsec::{self, SnatUplink},
    node::{
        kernel::{Kernel, VERIFIER_LIMIT},
        reserved_ports::DEFAULT_SYSCTL_DIR,
    },
};
use masq_common::{
    layout::{MapMeta, NOMASQ_KIND_LINK_LOCAL, NOMASQ_KIND_MASQUERADE},
    ports::PortRange,
    settings::Settings,
};
use serde::Serialize;

use super::{OutputFormat, check_config::fail};

#[derive(Args, Debug)]
pub(crate) struct PinArgs {
    /// bpffs directory the agent pins its maps and links under.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_PATH)]
    pin_path: PathBuf,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pins: PinArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

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

#[derive(Args, Debug)]
pub(crate) struct UninstallArgs {
    #[command(flatten)]
    pins: PinArgs,
    /// Where the node's sysctls are (see `masq agent --sysctl-dir`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SYSCTL_DIR)]
    sysctl_dir: PathBuf,
}

fn open(pin_path: &std::path::Path) -> Result<DatapathMaps, ExitCode> {
    DatapathMaps::from_pins(pin_path).map_err(|error| fail(&error.to_string()))
}

#[derive(Serialize)]
struct StatusJson {
    pin_path: String,
    layout_version: u32,
    /// The running kernel's release, or why it could not be read.
    kernel: String,
    /// The datapath's programs as pinned by the agent, with what the verifier made of them.
    programs: Vec<PinnedProgramJson>,
    translating: bool,
    random_fully: bool,
    snat_ports: Vec<String>,
    /// The ports are shared with the node's own sockets (no `--to-ports`).
    ports_shared: bool,
    reserved_ports: Vec<String>,
    uplinks: Vec<UplinkJson>,
    nomasq_cidrs: Vec<String>,
    /// The source trie's networks (`nonMasqueradeSrcCIDRs`), both families.
    nomasq_src_cidrs: Vec<String>,
    /// Whether the egress program looks sources up (the settings flag).
    source_exemptions: bool,
    nat_flows: usize,
    nat_entries: usize,
    nat_capacity: u32,
    nat_v6_flows: usize,
    nat_v6_entries: usize,
    nat_v6_capacity: u32,
    /// Flows not assured (never answered, or the handshake not completed), IPv4 then IPv6:
    /// what a full table evicts.
    nat_unassured: [usize; 2],
    /// The unassured flows one local address may hold, IPv4 then IPv6 (0: no limit).
    pod_share: [u32; 2],
    /// The local addresses (pods, the node) holding the most unassured flows, busiest first.
    top_holders: Vec<HolderJson>,
    /// Flows the datapath evicted to make room since the maps were created (nonzero only).
    evictions: Vec<EvictionJson>,
    /// Node ports each remote endpoint may have in use (the SNAT ranges' size).
    ports_per_remote: u32,
    /// The remote endpoints with the most node ports in use, busiest first, both families.
    busiest_remotes: Vec<RemoteJson>,
    counters: Vec<(String, u64)>,
    counters_v6: Vec<(String, u64)>,
    /// XFRM output policies that select masqueraded traffic only after translation (so it
    /// leaves in clear text); `None` when they could not be read.
    ipsec_bypassed: Option<Vec<String>>,
    /// Why the XFRM policies could not be read.
    ipsec_error: Option<String>,
}

#[derive(Serialize)]
struct HolderJson {
    address: String,
    unassured: u64,
}

#[derive(Serialize)]
struct RemoteJson {
    /// `ip:port/protocol`.
    remote: String,
    /// The node address the flows leave with.
    node: String,
    ports_in_use: usize,
    /// Of [`StatusJson::ports_per_remote`], in percent.
    percent: u32,
}

#[derive(Serialize)]
struct EvictionJson {
    family: &'static str,
    cause: &'static str,
    class: &'static str,
    count: u64,
}

/// Local addresses shown in `masq status`, busiest first.
const TOP_HOLDERS: usize = 5;

#[derive(Serialize)]
struct UplinkJson {
    interface: String,
    ifindex: u32,
    /// The address IPv4 traffic is masqueraded to; `None` on an uplink without IPv4, where IPv4
    /// that would be masqueraded is dropped.
    node_ip: Option<String>,
    /// The address IPv6 traffic is masqueraded to, when IPv6 is translated on the uplink.
    node_ipv6: Option<String>,
    attach_mode: String,
    created_clsact: bool,
    hooks: Vec<HookJson>,
}

#[derive(Serialize)]
struct HookJson {
    hook: String,
    /// In the order the kernel runs them.
    programs: Vec<ProgramJson>,
    /// Why the kernel could not be asked.
    error: Option<String>,
}

#[derive(Serialize)]
struct ProgramJson {
    id: u32,
    name: Option<String>,
    masq: bool,
    how: String,
}

#[derive(Serialize)]
struct PinnedProgramJson {
    name: String,
    /// Instructions the verifier processed; `None` where the kernel does not report it (before
    /// Linux 5.16) or the pin cannot be read.
    verified_insns: Option<u32>,
}

/// The programs pinned under `pins`, with their verified sizes.
fn pinned_programs(pins: &PinDir) -> Vec<PinnedProgramJson> {
    pins.programs()
        .into_iter()
        .map(|(name, path)| PinnedProgramJson {
            verified_insns: aya::programs::ProgramInfo::from_pin(&path)
                .ok()
                .and_then(|info| info.verified_instruction_count()),
            name,
        })
        .collect()
}

fn port_list(ranges: &[PortRange]) -> Vec<String> {
    ranges.iter().map(PortRange::to_string).collect()
}

pub(crate) fn status(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let maps = match open(&args.pins.pin_path) {
        Ok(maps) => maps,
        Err(code) => return Ok(code),
    };
    let pins = PinDir::new(&args.pins.pin_path);
    let settings: Settings = maps.settings()?;
    let meta: MapMeta = maps.meta()?;
    let entries = maps.nat_entries()?;
    let entries_v6 = maps.nat_entries_of::<[u8; 16]>()?;
    let trie_v4 = maps.trie_entries::<Ipv4Addr>()?;
    let trie_v6 = maps.trie_entries::<Ipv6Addr>()?;
    let cidr = |address: IpAddr, prefix: u8, kind: u32| {
        // The trie's longest matching prefix decides: a masquerade entry carves its range
        // out of the exemptions around it.
        let suffix = match kind {
            NOMASQ_KIND_LINK_LOCAL => " (link-local)",
            NOMASQ_KIND_MASQUERADE => " (masquerade)",
            _ => "",
        };
        format!("{address}/{prefix}{suffix}")
    };
    let nonzero = |totals: Vec<(masq_common::counters::Counter, u64)>| -> Vec<(String, u64)> {
        totals
            .into_iter()
            .filter(|(_, value)| *value != 0)
            .map(|(counter, value)| (counter.name().to_owned(), value))
            .collect()
    };
    let uplinks: Vec<UplinkJson> = maps
        .uplinks()?
        .into_iter()
        .map(|(ifindex, uplink)| UplinkJson {
            interface: uplink.name().to_owned(),
            ifindex,
            node_ip: uplink
                .has_v4()
                .then(|| Ipv4Addr::from(uplink.snat_addr).to_string()),
            node_ipv6: (uplink.has_v6 != 0)
                .then(|| Ipv6Addr::from(uplink.snat_addr_v6).to_string()),
            attach_mode: AttachMode::of(&uplink)
                .map_or("unknown", AttachMode::name)
                .to_owned(),
            created_clsact: uplink.created_clsact != 0,
            hooks: [Hook::Egress, Hook::Ingress]
                .into_iter()
                .map(|hook| match programs_on(&pins, ifindex, &uplink, hook) {
                    Ok(programs) => HookJson {
                        hook: hook.name().to_owned(),
                        programs: programs
                            .into_iter()
                            .map(|program| ProgramJson {
                                id: program.program_id,
                                name: program.name,
                                masq: program.ours,
                                how: program.how,
                            })
                            .collect(),
                        error: None,
                    },
                    Err(error) => HookJson {
                        hook: hook.name().to_owned(),
                        programs: Vec::new(),
                        error: Some(error),
                    },
                })
                .collect(),
        })
        .collect();
    let snat_uplinks = uplinks
        .iter()
        .map(|uplink| SnatUplink {
            name: uplink.interface.clone(),
            ifindex: uplink.ifindex,
            ipv4: uplink.node_ip.as_deref().and_then(|ip| ip.parse().ok()),
            ipv6: uplink.node_ipv6.as_deref().and_then(|ip| ip.parse().ok()),
        })
        .collect();
    let nomasq = || ipsec::exempt_networks(&trie_v4, &trie_v6);
    let (ipsec_bypassed, ipsec_error) = match ipsec::check(snat_uplinks, nomasq) {
        Ok(bypassed) => (
            Some(bypassed.iter().map(ipsec::Bypass::describe).collect()),
            None,
        ),
        Err(error) => (None, Some(error.to_string())),
    };
    let capacity = maps.nat_v4_capacity();
    let mut top_holders: Vec<(IpAddr, u64)> = maps
        .holders_of::<[u8; 4]>()?
        .into_iter()
        .map(|(holder, count)| (IpAddr::from(holder), count))
        .chain(
            maps.holders_of::<[u8; 16]>()?
                .into_iter()
                .map(|(holder, count)| (IpAddr::from(holder), count)),
        )
        .filter(|&(_, count)| count != 0)
        .collect();
    top_holders.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top_holders.truncate(TOP_HOLDERS);
    let mut evictions = Vec::new();
    for (family, totals) in [
        ("ipv4", maps.evictions_of::<[u8; 4]>()?),
        ("ipv6", maps.evictions_of::<[u8; 16]>()?),
    ] {
        evictions.extend(totals.into_iter().filter(|&(_, _, count)| count != 0).map(
            |(cause, class, count)| EvictionJson {
                family,
                cause: cause.name(),
                class: class.name(),
                count,
            },
        ));
    }
    let ports_per_remote = settings.total_ports;
    let mut busiest_remotes: Vec<gc::RemoteUse> = gc::remote_use(entries.iter().copied())
        .into_iter()
        .chain(gc::remote_use(entries_v6.iter().copied()))
        .collect();
    busiest_remotes.sort_by(|a, b| b.ports.cmp(&a.ports).then(a.cmp(b)));
    busiest_remotes.truncate(gc::TOP_REMOTES);
    let unassured = |flows: &[Flow]| flows.iter().filter(|flow| !flow.assured()).count();
    let flows_v4 = flows(&entries);
    let flows_v6 = flows(&entries_v6);
    let status = StatusJson {
        pin_path: args.pins.pin_path.display().to_string(),
        layout_version: meta.layout_version,
        kernel: Kernel::current().map_or_else(|error| error.to_string(), |kernel| kernel.release),
        programs: pinned_programs(&pins),
        translating: settings.enabled(),
        random_fully: settings.random_fully(),
        snat_ports: port_list(settings.ranges()),
        ports_shared: settings.ports_shared(),
        reserved_ports: port_list(meta.reserved()),
        uplinks,
        nomasq_cidrs: trie_v4
            .iter()
            .map(|&((addr, prefix), kind)| cidr(addr.into(), prefix, kind))
            .chain(
                trie_v6
                    .iter()
                    .map(|&((addr, prefix), kind)| cidr(addr.into(), prefix, kind)),
            )
            .collect(),
        nomasq_src_cidrs: maps
            .trie_entries_of::<Ipv4Addr>(Trie::Sources)?
            .iter()
            .map(|&((addr, prefix), kind)| cidr(addr.into(), prefix, kind))
            .chain(
                maps.trie_entries_of::<Ipv6Addr>(Trie::Sources)?
                    .iter()
                    .map(|&((addr, prefix), kind)| cidr(addr.into(), prefix, kind)),
            )
            .collect(),
        source_exemptions: settings.source_exemptions(),
        nat_flows: flows_v4.len(),
        nat_entries: entries.len(),
        nat_capacity: capacity,
        nat_v6_flows: flows_v6.len(),
        nat_v6_entries: entries_v6.len(),
        nat_v6_capacity: maps.nat_v6_capacity(),
        nat_unassured: [unassured(&flows_v4), unassured(&flows_v6)],
        pod_share: settings.holder_share,
        top_holders: top_holders
            .into_iter()
            .map(|(address, unassured)| HolderJson {
                address: address.to_string(),
                unassured,
            })
            .collect(),
        evictions,
        ports_per_remote,
        busiest_remotes: busiest_remotes
            .iter()
            .map(|remote| RemoteJson {
                remote: remote.label(),
                node: remote.node.to_string(),
                ports_in_use: remote.ports,
                percent: remote.percent(ports_per_remote),
            })
            .collect(),
        counters: nonzero(maps.counter_totals()?),
        counters_v6: nonzero(maps.counter_totals_v6()?),
        ipsec_bypassed,
        ipsec_error,
    };
    let mut out = io::stdout().lock();
    if args.output == OutputFormat::Json {
        serde_json::to_writer_pretty(&mut out, &status)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "pin path:     {} (map layout v{})",
        status.pin_path, status.layout_version
    )?;
    writeln!(
        out,
        "datapath:     {}, ports {}{} ({})",
        if status.translating {
            "translating"
        } else {
            "NOT translating (no valid config yet)"
        },
        status.snat_ports.join(","),
        if status.ports_shared {
            " shared with the node"
        } else {
            ""
        },
        if status.random_fully {
            "random-fully"
        } else {
            "source port kept when free"
        }
    )?;
    writeln!(
        out,
        "reserved:     {}",
        if status.reserved_ports.is_empty() {
            "none".to_owned()
        } else {
            status.reserved_ports.join(",")
        }
    )?;
    writeln!(out, "kernel:       Linux {}", status.kernel)?;
    if status.programs.is_empty() {
        writeln!(
            out,
            "programs:     none pinned (an agent older than this one?)"
        )?;
    } else {
        let sizes: Vec<String> = status
            .programs
            .iter()
            .map(|program| match program.verified_insns {
                Some(size) => format!("{} {size}", program.name),
                None => format!("{} ?", program.name),
            })
            .collect();
        writeln!(
            out,
            "programs:     verified instructions (limit {VERIFIER_LIMIT}): {}",
            sizes.join(", ")
        )?;
    }
    for uplink in &status.uplinks {
        let addresses = match (&uplink.node_ip, &uplink.node_ipv6) {
            (Some(ipv4), Some(ipv6)) => format!("{ipv4} and {ipv6}"),
            (Some(ipv4), None) => ipv4.clone(),
            (None, Some(ipv6)) => {
                format!("{ipv6} (no IPv4 address: IPv4 to masquerade is dropped)")
            }
            (None, None) => "nothing (no IPv4 or IPv6 address)".to_owned(),
        };
        writeln!(
            out,
            "uplink:       {} (index {}) masquerades to {addresses}, attached with {}{}",
            uplink.interface,
            uplink.ifindex,
            uplink.attach_mode,
            if uplink.created_clsact {
                " (clsact qdisc created by masq)"
            } else {
                ""
            }
        )?;
        for hook in &uplink.hooks {
            let programs = match &hook.error {
                Some(error) => format!("unknown: {error}"),
                None if !hook.programs.iter().any(|program| program.masq) => {
                    "masq is NOT attached".to_owned()
                }
                None => hook
                    .programs
                    .iter()
                    .map(|program| {
                        format!(
                            "{}{} (id {}, {})",
                            if program.masq { "* " } else { "" },
                            program.name.as_deref().unwrap_or("?"),
                            program.id,
                            program.how
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            writeln!(out, "  {:<11} {programs}", format!("{}:", hook.hook))?;
        }
    }
    if status.uplinks.is_empty() {
        writeln!(out, "uplinks:      none (masq translates on no interface)")?;
    }
    writeln!(
        out,
        "non-masq:     {} trie entries: {}",
        status.nomasq_cidrs.len(),
        status.nomasq_cidrs.join(" ")
    )?;
    if !status.nomasq_src_cidrs.is_empty() || status.source_exemptions {
        writeln!(
            out,
            "exempt src:   {} trie entries{}: {}",
            status.nomasq_src_cidrs.len(),
            if status.source_exemptions {
                ""
            } else {
                " (not looked up: the settings flag is off)"
            },
            status.nomasq_src_cidrs.join(" ")
        )?;
    }
    match (&status.ipsec_bypassed, &status.ipsec_error) {
        (Some(bypassed), _) if bypassed.is_empty() => writeln!(
            out,
            "ipsec:        no XFRM output policy selects masqueraded traffic only after translation"
        )?,
        (Some(bypassed), _) => {
            writeln!(
                out,
                "ipsec:        {} XFRM output {} masqueraded traffic only after translation: masq translates after the policy lookup, so that traffic leaves in clear text (see docs/operating.md, IPsec)",
                bypassed.len(),
                if bypassed.len() == 1 {
                    "policy selects"
                } else {
                    "policies select"
                }
            )?;
            for policy in bypassed {
                writeln!(out, "  policy:     {policy}")?;
            }
        }
        (None, error) => writeln!(
            out,
            "ipsec:        unknown: {}",
            error.as_deref().unwrap_or("not read")
        )?,
    }
    writeln!(
        out,
        "nat table:    {} flows, {} of {} entries",
        status.nat_flows, status.nat_entries, status.nat_capacity
    )?;
    writeln!(
        out,
        "nat ipv6:     {} flows, {} of {} entries",
        status.nat_v6_flows, status.nat_v6_entries, status.nat_v6_capacity
    )?;
    let share = |share: u32| {
        if share == 0 {
            "no limit".to_owned()
        } else {
            share.to_string()
        }
    };
    writeln!(
        out,
        "unassured:    {} flows (ipv6 {}); each local address may hold {} (ipv6 {})",
        status.nat_unassured[0],
        status.nat_unassured[1],
        share(status.pod_share[0]),
        share(status.pod_share[1])
    )?;
    if !status.top_holders.is_empty() {
        let holders: Vec<String> = status
            .top_holders
            .iter()
            .map(|holder| format!("{} {}", holder.address, holder.unassured))
            .collect();
        writeln!(out, "holders:      {}", holders.join(", "))?;
    }
    if !status.busiest_remotes.is_empty() {
        let remotes: Vec<String> = status
            .busiest_remotes
            .iter()
            .map(|remote| {
                format!(
                    "{} {} ({}%)",
                    remote.remote, remote.ports_in_use, remote.percent
                )
            })
            .collect();
        writeln!(
            out,
            "remotes:      {} (ports in use, of {} each)",
            remotes.join(", "),
            status.ports_per_remote
        )?;
    }
    if !status.evictions.is_empty() {
        writeln!(out, "evictions:")?;
        for eviction in &status.evictions {
            let what = format!("{} {} {}", eviction.family, eviction.cause, eviction.class);
            writeln!(out, "  {what:<32} {}", eviction.count)?;
        }
    }
    // A node that translates no IPv6 has no IPv6 counters worth a heading.
    let ipv6_counters = (!status.counters_v6.is_empty()).then_some(&status.counters_v6);
    for (title, counters) in [
        ("counters:", Some(&status.counters)),
        ("ipv6 counters:", ipv6_counters),
    ]
    .into_iter()
    .filter_map(|(title, counters)| Some((title, counters?)))
    {
        writeln!(out, "{title}")?;
        for (name, value) in counters {
            writeln!(out, "  {name:<32} {value}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
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

pub(crate) fn nat(command: &NatCommand) -> anyhow::Result<ExitCode> {
    let NatCommand::List(args) = command;
    let maps = match open(&args.pins.pin_path) {
        Ok(maps) => maps,
        Err(code) => return Ok(code),
    };
    let now = monotonic_now_ns();
    let mut selected = Vec::new();
    let mut all = flows(&maps.nat_entries()?);
    all.extend(flows(&maps.nat_entries_of::<[u8; 16]>()?));
    for flow in all {
        match matches(&flow, args) {
            Ok(true) => selected.push(flow),
            Ok(false) => {}
            Err(message) => return Ok(fail(&message)),
        }
    }
    let seconds = |since: u64| now.saturating_sub(since) / 1_000_000_000;
    let timeouts = masq::node::timeouts::of_node(&args.sysctl_dir);
    let rows: Vec<FlowJson> = selected
        .iter()
        .map(|flow| FlowJson {
            protocol: flow.protocol_name(),
            source: flow.source.to_string(),
            remote: flow.remote.to_string(),
            translated: flow.translated.to_string(),
            state: flow.state().to_owned(),
            assured: flow.assured(),
            node_flow: flow.is_node_flow(),
            age_seconds: seconds(flow.egress.created_ns),
            idle_seconds: seconds(flow.last_seen_ns()),
            expires_in_seconds: (flow.last_seen_ns() + flow.lifetime_ns(&timeouts))
                .saturating_sub(now)
                / 1_000_000_000,
        })
        .collect();
    let mut out = io::stdout().lock();
    if args.output == OutputFormat::Json {
        serde_json::to_writer_pretty(&mut out, &rows)?;
        writeln!(out)?;
        return Ok(ExitCode::SUCCESS);
    }
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
    writeln!(out, "{} flows", rows.len())?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn uninstall(args: &UninstallArgs) -> anyhow::Result<ExitCode> {
    let mut out = io::stdout().lock();
    let mut written = Ok(());
    masq::datapath::lifecycle::uninstall(&args.pins.pin_path, &args.sysctl_dir, |step| {
        if written.is_ok() {
            written = writeln!(out, "{step}");
        }
    })?;
    written?;
    Ok(ExitCode::SUCCESS)
}
