//! `masq check-config`.

use std::{
    io::{self, Write as _},
    process::ExitCode,
};

use clap::Args;
use masq::{
    causes::WithCauses,
    config::{
        MASQUERADE_CIDRS_KEY, NON_MASQUERADE_SRC_CIDRS_KEY,
        cidr::Family,
        source::{CidrOrigin, ConfigOrigin, EffectiveConfig, SourcedCidr, load},
    },
    datapath::{maps::Trie, sync::check_capacity},
    policy::{Policy, RuleKind},
};
use masq_common::layout::{NOMASQ_SRC_MAX_ENTRIES, NOMASQ_V4_MAX_ENTRIES};

use super::args::{ConfigArgs, UpstreamFlags};

/// How many CIDRs the summary lists before it abbreviates.
const LISTED_CIDRS: usize = 24;

#[derive(Args, Debug)]
pub(crate) struct CheckConfigArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    flags: UpstreamFlags,
    /// The agent's --nomasq-max-entries: a config needing more trie entries is one the agent
    /// would refuse.
    #[arg(long, value_name = "ENTRIES", default_value_t = NOMASQ_V4_MAX_ENTRIES)]
    nomasq_max_entries: u32,
}

pub(crate) fn run(args: &CheckConfigArgs) -> anyhow::Result<ExitCode> {
    // Upstream exits at startup on a bad --to-ports; the config is never read then.
    if let Err(error) = args.flags.to_ports() {
        return Ok(fail(&WithCauses(&error).to_string()));
    }
    let config = match load(&args.config.source(), &args.flags.read_options()) {
        Ok(config) => config,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    let policy = Policy::new(&config, args.flags.enable_ipv6);
    // What the eBPF agent would refuse beyond upstream's validation.
    let capacities = [
        (
            Trie::Destinations,
            policy.nomasq_v4().len(),
            args.nomasq_max_entries,
        ),
        (
            Trie::Destinations,
            policy.nomasq_v6().len(),
            args.nomasq_max_entries,
        ),
        (
            Trie::Sources,
            policy.nomasq_src_v4().len(),
            NOMASQ_SRC_MAX_ENTRIES,
        ),
        (
            Trie::Sources,
            policy.nomasq_src_v6().len(),
            NOMASQ_SRC_MAX_ENTRIES,
        ),
    ];
    for (trie, needed, capacity) in capacities {
        if let Err(error) = check_capacity(trie, needed, capacity) {
            return Ok(fail(&WithCauses(&error).to_string()));
        }
    }
    let mut out = io::stdout().lock();
    write_summary(&mut out, &config, &policy, args)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints upstream's message alone on stderr, so it can be compared verbatim.
pub(crate) fn fail(message: &str) -> ExitCode {
    let _ = writeln!(io::stderr().lock(), "{message}");
    ExitCode::FAILURE
}

/// Lists `cidrs` with their family and origin, the first [`LISTED_CIDRS`] of them.
fn write_cidrs(out: &mut impl io::Write, cidrs: &[SourcedCidr]) -> io::Result<()> {
    for sourced in cidrs.iter().take(LISTED_CIDRS) {
        let origin = match &sourced.origin {
            CidrOrigin::Default => "default".to_owned(),
            CidrOrigin::File(path) => path.file_name().map_or_else(
                || path.display().to_string(),
                |name| name.to_string_lossy().into_owned(),
            ),
        };
        writeln!(
            out,
            "    {:<20} {:<5} {origin}",
            sourced.cidr.as_str(),
            sourced.cidr.family().to_string()
        )?;
    }
    if cidrs.len() > LISTED_CIDRS {
        writeln!(out, "    ... and {} more", cidrs.len() - LISTED_CIDRS)?;
    }
    Ok(())
}

fn write_summary(
    out: &mut impl io::Write,
    config: &EffectiveConfig,
    policy: &Policy,
    args: &CheckConfigArgs,
) -> io::Result<()> {
    writeln!(out, "config OK")?;
    writeln!(out, "  source:         {}", config.origin)?;
    let limit = match config.origin {
        ConfigOrigin::Directory { .. } | ConfigOrigin::NoMatchingFiles(_) => {
            format!("limit {} per file", config.raw.cidr_limit)
        }
        _ => format!("limit {}", config.raw.cidr_limit),
    };
    writeln!(
        out,
        "  non-masquerade: {} CIDRs ({limit})",
        config.cidrs.len()
    )?;
    write_cidrs(out, &config.cidrs)?;
    for (key, list, what) in [
        (
            MASQUERADE_CIDRS_KEY,
            &config.masquerade_cidrs,
            "masqueraded inside the ranges above",
        ),
        (
            NON_MASQUERADE_SRC_CIDRS_KEY,
            &config.non_masquerade_src_cidrs,
            "sources never masqueraded",
        ),
    ] {
        if !list.is_empty() {
            writeln!(out, "  {key}: {} CIDRs ({what})", list.len())?;
            write_cidrs(out, list)?;
        }
    }
    for sourced in policy.ineffective_masquerade_cidrs() {
        writeln!(
            out,
            "  warning: {MASQUERADE_CIDRS_KEY} entry {} ({}) changes nothing: no non-masquerade range holds it, so its traffic is masqueraded anyway",
            sourced.cidr, sourced.origin
        )?;
    }
    for family in [Family::Ipv4, Family::Ipv6] {
        if policy.longest_prefix_first(family) {
            writeln!(
                out,
                "  {family} rules:     source exemptions first, then the longest matching prefix decides"
            )?;
        }
    }
    let link_local = |family: Family, flag: bool, key: &str| {
        let exempt = policy
            .rules(family)
            .iter()
            .find(|rule| rule.kind == RuleKind::LinkLocal);
        match exempt {
            Some(rule) => format!("{} not masqueraded ({key}: {flag})", rule.cidr),
            None => format!("masqueraded ({key}: {flag})"),
        }
    };
    writeln!(
        out,
        "  link-local:     {}",
        link_local(Family::Ipv4, config.raw.masq_link_local, "masqLinkLocal")
    )?;
    if policy.ipv6_enabled() {
        writeln!(
            out,
            "  ipv6:           enabled; link-local {}",
            link_local(
                Family::Ipv6,
                config.raw.masq_link_local_ipv6,
                "masqLinkLocalIPv6"
            )
        )?;
    } else {
        writeln!(
            out,
            "  ipv6:           disabled (--enable-ipv6=false): IPv6 traffic is never masqueraded"
        )?;
    }
    writeln!(
        out,
        "  resync:         every {}",
        config.raw.resync_interval
    )?;
    let ports = if args.flags.to_ports.is_empty() {
        "any (iptables); 1024-29999 (eBPF datapath)".to_owned()
    } else {
        args.flags.to_ports.clone()
    };
    writeln!(
        out,
        "  masquerade:     chain {}, --random-fully={}, ports {ports}",
        args.flags.masq_chain, args.flags.random_fully
    )
}
