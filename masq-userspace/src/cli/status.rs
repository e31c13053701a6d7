//! `masq status`: the pinned datapath at a glance, as text for people or JSON for programs.

use std::{
    io::{self, Write},
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
    process::ExitCode,
};

use clap::Args;
use masq::{
    causes::WithCauses,
    datapath::{
        attach::{AttachMode, programs_on},
        gc,
        pins::{Hook, PinDir},
        snapshot::{DatapathCounts, DatapathSnapshot, FAMILIES, FlowTable, TrieContents},
    },
    ipsec::{self, SnatUplink},
    node::kernel::{Kernel, VERIFIER_LIMIT},
};
use masq_common::{
    counters::Counter,
    layout::{NOMASQ_KIND_LINK_LOCAL, NOMASQ_KIND_MASQUERADE, Uplink},
    ports::PortRange,
};
use serde::Serialize;

use super::{
    OutputFormat,
    pins::{PinArgs, open},
};

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pins: PinArgs,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

/// What `masq status` shows: the JSON it prints with `--output json`, and what its text is
/// written from.
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

pub(crate) fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let maps = match open(&args.pins.pin_path) {
        Ok(maps) => maps,
        Err(code) => return Ok(code),
    };
    let snapshot = DatapathSnapshot::read(&maps)?;
    let status = StatusJson::gather(&args.pins.pin_path, &snapshot);
    let mut out = io::stdout().lock();
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &status)?;
            writeln!(out)?;
        }
        OutputFormat::Text => status.write_text(&mut out)?,
    }
    Ok(ExitCode::SUCCESS)
}

impl StatusJson {
    /// The status of the datapath in `snapshot`, pinned under `pin_path`, with what the
    /// kernel says about its programs and the node's IPsec policies.
    fn gather(pin_path: &Path, snapshot: &DatapathSnapshot) -> Self {
        let pins = PinDir::new(pin_path);
        let settings = &snapshot.settings;
        let (ipsec_bypassed, ipsec_error) = match bypassed_ipsec_policies(snapshot) {
            Ok(bypassed) => (Some(bypassed), None),
            Err(error) => (None, Some(error)),
        };
        let [ipv4, ipv6] = &snapshot.tables;
        let [counters, counters_v6] = snapshot
            .counts
            .packets
            .each_ref()
            .map(|totals| nonzero_counters(totals));
        Self {
            pin_path: pin_path.display().to_string(),
            layout_version: snapshot.meta.layout_version,
            kernel: Kernel::current().map_or_else(
                |error| WithCauses(&error).to_string(),
                |kernel| kernel.release,
            ),
            programs: pinned_programs(&pins),
            translating: settings.enabled(),
            random_fully: settings.random_fully(),
            snat_ports: port_list(settings.ranges()),
            ports_shared: settings.ports_shared(),
            reserved_ports: port_list(snapshot.meta.reserved()),
            uplinks: snapshot
                .uplinks
                .iter()
                .map(|(ifindex, uplink)| UplinkJson::gather(&pins, *ifindex, uplink))
                .collect(),
            nomasq_cidrs: trie_cidrs(&snapshot.destinations),
            nomasq_src_cidrs: trie_cidrs(&snapshot.sources),
            source_exemptions: settings.source_exemptions(),
            nat_flows: ipv4.flows.len(),
            nat_entries: ipv4.entries,
            nat_capacity: ipv4.capacity,
            nat_v6_flows: ipv6.flows.len(),
            nat_v6_entries: ipv6.entries,
            nat_v6_capacity: ipv6.capacity,
            nat_unassured: snapshot.tables.each_ref().map(FlowTable::unassured),
            pod_share: settings.holder_share,
            top_holders: snapshot
                .busiest_holders(gc::TOP_HOLDERS)
                .into_iter()
                .map(|(address, unassured)| HolderJson {
                    address: address.to_string(),
                    unassured,
                })
                .collect(),
            evictions: evictions(&snapshot.counts),
            ports_per_remote: settings.total_ports,
            busiest_remotes: snapshot
                .busiest_remotes(gc::TOP_REMOTES)
                .iter()
                .map(|remote| RemoteJson {
                    remote: remote.label(),
                    node: remote.node.to_string(),
                    ports_in_use: remote.ports,
                    percent: remote.percent(settings.total_ports),
                })
                .collect(),
            counters,
            counters_v6,
            ipsec_bypassed,
            ipsec_error,
        }
    }

    /// The text `masq status` prints, a line (or a block) per part of the datapath.
    fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        self.write_settings(out)?;
        self.write_programs(out)?;
        for uplink in &self.uplinks {
            uplink.write_text(out)?;
        }
        if self.uplinks.is_empty() {
            writeln!(out, "uplinks:      none (masq translates on no interface)")?;
        }
        self.write_exemptions(out)?;
        self.write_ipsec(out)?;
        self.write_nat_tables(out)?;
        self.write_evictions(out)?;
        self.write_counters(out)
    }

    /// The pin path, the translation settings, the reserved ports and the kernel.
    fn write_settings(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "pin path:     {} (map layout v{})",
            self.pin_path, self.layout_version
        )?;
        writeln!(
            out,
            "datapath:     {}, ports {}{} ({})",
            if self.translating {
                "translating"
            } else {
                "NOT translating (no valid config yet)"
            },
            self.snat_ports.join(","),
            if self.ports_shared {
                " shared with the node"
            } else {
                ""
            },
            if self.random_fully {
                "random-fully"
            } else {
                "source port kept when free"
            }
        )?;
        writeln!(
            out,
            "reserved:     {}",
            if self.reserved_ports.is_empty() {
                "none".to_owned()
            } else {
                self.reserved_ports.join(",")
            }
        )?;
        writeln!(out, "kernel:       Linux {}", self.kernel)
    }

    /// The pinned programs and their verified sizes.
    fn write_programs(&self, out: &mut impl Write) -> io::Result<()> {
        if self.programs.is_empty() {
            return writeln!(
                out,
                "programs:     none pinned (an agent older than this one?)"
            );
        }
        let sizes: Vec<String> = self
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
        )
    }

    /// The destination trie's entries, and the source trie's when it has any or is looked up.
    fn write_exemptions(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "non-masq:     {} trie entries: {}",
            self.nomasq_cidrs.len(),
            self.nomasq_cidrs.join(" ")
        )?;
        if self.nomasq_src_cidrs.is_empty() && !self.source_exemptions {
            return Ok(());
        }
        writeln!(
            out,
            "exempt src:   {} trie entries{}: {}",
            self.nomasq_src_cidrs.len(),
            if self.source_exemptions {
                ""
            } else {
                " (not looked up: the settings flag is off)"
            },
            self.nomasq_src_cidrs.join(" ")
        )
    }

    /// The XFRM policies masqueraded traffic bypasses, or why they could not be read.
    fn write_ipsec(&self, out: &mut impl Write) -> io::Result<()> {
        match (&self.ipsec_bypassed, &self.ipsec_error) {
            (Some(bypassed), _) if bypassed.is_empty() => writeln!(
                out,
                "ipsec:        no XFRM output policy selects masqueraded traffic only after translation"
            ),
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
                Ok(())
            }
            (None, error) => writeln!(
                out,
                "ipsec:        unknown: {}",
                error.as_deref().unwrap_or("not read")
            ),
        }
    }

    /// The NAT tables' use: flows, entries, unassured flows, and who holds the most of them
    /// and of the remotes' ports.
    fn write_nat_tables(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "nat table:    {} flows, {} of {} entries",
            self.nat_flows, self.nat_entries, self.nat_capacity
        )?;
        writeln!(
            out,
            "nat ipv6:     {} flows, {} of {} entries",
            self.nat_v6_flows, self.nat_v6_entries, self.nat_v6_capacity
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
            self.nat_unassured[0],
            self.nat_unassured[1],
            share(self.pod_share[0]),
            share(self.pod_share[1])
        )?;
        if !self.top_holders.is_empty() {
            let holders: Vec<String> = self
                .top_holders
                .iter()
                .map(|holder| format!("{} {}", holder.address, holder.unassured))
                .collect();
            writeln!(out, "holders:      {}", holders.join(", "))?;
        }
        if !self.busiest_remotes.is_empty() {
            let remotes: Vec<String> = self
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
                self.ports_per_remote
            )?;
        }
        Ok(())
    }

    /// The datapath's evictions by family, cause and class, when it made any.
    fn write_evictions(&self, out: &mut impl Write) -> io::Result<()> {
        if self.evictions.is_empty() {
            return Ok(());
        }
        writeln!(out, "evictions:")?;
        for eviction in &self.evictions {
            let what = format!("{} {} {}", eviction.family, eviction.cause, eviction.class);
            writeln!(out, "  {what:<32} {}", eviction.count)?;
        }
        Ok(())
    }

    /// The packet counters that are not zero; IPv6's only when there are any, as a node that
    /// translates no IPv6 has no IPv6 counters worth a heading.
    fn write_counters(&self, out: &mut impl Write) -> io::Result<()> {
        let ipv6_counters = (!self.counters_v6.is_empty()).then_some(&self.counters_v6);
        for (title, counters) in [
            ("counters:", Some(&self.counters)),
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
        Ok(())
    }
}

impl UplinkJson {
    /// Uplink `ifindex` as the datapath records it, with what runs on its hooks.
    fn gather(pins: &PinDir, ifindex: u32, uplink: &Uplink) -> Self {
        Self {
            interface: uplink.name().to_owned(),
            ifindex,
            node_ip: uplink
                .has_v4()
                .then(|| Ipv4Addr::from(uplink.snat_addr).to_string()),
            node_ipv6: (uplink.has_v6 != 0)
                .then(|| Ipv6Addr::from(uplink.snat_addr_v6).to_string()),
            attach_mode: AttachMode::of(uplink)
                .map_or("unknown", AttachMode::name)
                .to_owned(),
            created_clsact: uplink.created_clsact != 0,
            hooks: [Hook::Egress, Hook::Ingress]
                .into_iter()
                .map(|hook| HookJson::gather(pins, ifindex, uplink, hook))
                .collect(),
        }
    }

    /// The uplink's line, and a line per hook with the programs on it.
    fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        let addresses = match (&self.node_ip, &self.node_ipv6) {
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
            self.interface,
            self.ifindex,
            self.attach_mode,
            if self.created_clsact {
                " (clsact qdisc created by masq)"
            } else {
                ""
            }
        )?;
        for hook in &self.hooks {
            writeln!(
                out,
                "  {:<11} {}",
                format!("{}:", hook.hook),
                hook.programs_text()
            )?;
        }
        Ok(())
    }
}

impl HookJson {
    /// What runs on `hook` of uplink `ifindex`, as the kernel says.
    fn gather(pins: &PinDir, ifindex: u32, uplink: &Uplink, hook: Hook) -> Self {
        match programs_on(pins, ifindex, uplink, hook) {
            Ok(programs) => Self {
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
            Err(error) => Self {
                hook: hook.name().to_owned(),
                programs: Vec::new(),
                error: Some(error),
            },
        }
    }

    /// The programs in the order they run, masq's starred, or why there are none to show.
    fn programs_text(&self) -> String {
        if let Some(error) = &self.error {
            return format!("unknown: {error}");
        }
        if !self.programs.iter().any(|program| program.masq) {
            return "masq is NOT attached".to_owned();
        }
        self.programs
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
            .join(", ")
    }
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

/// A trie's entries as `address/prefix`, each marked with the kind of entry it is when it is
/// not an exemption: the trie's longest matching prefix decides, and a masquerade entry
/// carves its range out of the exemptions around it.
fn trie_cidrs(trie: &TrieContents) -> Vec<String> {
    trie.entries()
        .map(|(address, prefix, kind)| {
            let suffix = match kind {
                NOMASQ_KIND_LINK_LOCAL => " (link-local)",
                NOMASQ_KIND_MASQUERADE => " (masquerade)",
                _ => "",
            };
            format!("{address}/{prefix}{suffix}")
        })
        .collect()
}

/// The counters that are not zero, by name.
fn nonzero_counters(totals: &[(Counter, u64)]) -> Vec<(String, u64)> {
    totals
        .iter()
        .filter(|(_, value)| *value != 0)
        .map(|(counter, value)| (counter.name().to_owned(), *value))
        .collect()
}

/// The evictions the datapath made, by family, cause and class (nonzero only).
fn evictions(counts: &DatapathCounts) -> Vec<EvictionJson> {
    FAMILIES
        .into_iter()
        .zip(&counts.evictions)
        .flat_map(|(family, totals)| {
            totals
                .iter()
                .filter(|&&(_, _, count)| count != 0)
                .map(move |&(cause, class, count)| EvictionJson {
                    family,
                    cause: cause.name(),
                    class: class.name(),
                    count,
                })
        })
        .collect()
}

/// The node's XFRM output policies that masqueraded traffic leaves by in clear text, in
/// words, or why they could not be read.
fn bypassed_ipsec_policies(snapshot: &DatapathSnapshot) -> Result<Vec<String>, String> {
    let uplinks = snapshot
        .uplinks
        .iter()
        .map(|(ifindex, uplink)| SnatUplink {
            name: uplink.name().to_owned(),
            ifindex: *ifindex,
            ipv4: uplink.has_v4().then(|| Ipv4Addr::from(uplink.snat_addr)),
            ipv6: (uplink.has_v6 != 0).then(|| Ipv6Addr::from(uplink.snat_addr_v6)),
        })
        .collect();
    let destinations = &snapshot.destinations;
    let nomasq = || ipsec::exempt_networks(&destinations.ipv4, &destinations.ipv6);
    match ipsec::check(uplinks, nomasq) {
        Ok(bypassed) => Ok(bypassed.iter().map(ipsec::Bypass::describe).collect()),
        Err(error) => Err(WithCauses(&error).to_string()),
    }
}
