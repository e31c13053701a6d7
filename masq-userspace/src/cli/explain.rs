//! `masq explain`.

use std::{
    io::{self, Write as _},
    net::IpAddr,
    process::ExitCode,
};

use clap::Args;
use masq::{
    causes::WithCauses,
    config::{MASQUERADE_CIDRS_KEY, NON_MASQUERADE_SRC_CIDRS_KEY, source::load},
    policy::{Decision, Policy, Reason, Rule, RuleKind},
};
use serde::Serialize;

use super::{
    OutputFormat,
    args::{ConfigArgs, UpstreamFlags},
    check_config::fail,
};

#[derive(Args, Debug)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    flags: UpstreamFlags,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
    /// The pod address the traffic comes from, checked against `nonMasqueradeSrcCIDRs`.
    /// Without it only the destination is judged.
    #[arg(long, alias = "from", value_name = "IP")]
    source: Option<IpAddr>,
    /// Destination addresses to explain.
    #[arg(value_name = "IP", required = true)]
    destinations: Vec<IpAddr>,
}

/// One decision in JSON form.
#[derive(Serialize)]
struct JsonDecision {
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    destination: String,
    masquerade: bool,
    /// The CIDR of the rule that decided (a source CIDR for a source exemption).
    matched: Option<String>,
    /// Which list that rule comes from: `nonMasqueradeCIDRs`, `masqueradeCIDRs`,
    /// `nonMasqueradeSrcCIDRs` or `link-local`.
    list: Option<&'static str>,
    /// The file it was read from, or `default`.
    origin: Option<String>,
}

pub(crate) fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.source(), &args.flags.read_options()) {
        Ok(config) => config,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    let policy = Policy::new(&config, args.flags.enable_ipv6);
    let decisions: Vec<Decision<'_>> = args
        .destinations
        .iter()
        .map(|&destination| policy.decide_from(args.source, destination))
        .collect();
    let mut out = io::stdout().lock();
    match args.output {
        OutputFormat::Json => {
            let json: Vec<JsonDecision> = decisions
                .iter()
                .map(|decision| {
                    let rule = decided_by(decision);
                    JsonDecision {
                        source: args.source.map(|source| source.to_string()),
                        destination: decision.destination.to_string(),
                        masquerade: decision.masquerade,
                        matched: rule.map(|rule| rule.cidr.as_str().to_owned()),
                        list: rule.map(|rule| list_name(&rule.kind)),
                        origin: rule.and_then(Rule::origin).map(|origin| origin.to_string()),
                    }
                })
                .collect();
            serde_json::to_writer_pretty(&mut out, &json)?;
            writeln!(out)?;
        }
        OutputFormat::Text => {
            let width = decisions
                .iter()
                .map(|decision| decision.destination.to_string().len())
                .max()
                .unwrap_or(0);
            for decision in &decisions {
                let verdict = if decision.masquerade {
                    "masquerade"
                } else {
                    "keep source"
                };
                writeln!(
                    out,
                    "{:<width$}  {verdict:<11}  {}",
                    decision.destination.to_string(),
                    reason(decision)
                )?;
            }
            if args.source.is_none() && !config.non_masquerade_src_cidrs.is_empty() {
                writeln!(
                    out,
                    "(judged by destination only: pass --source to check {NON_MASQUERADE_SRC_CIDRS_KEY})"
                )?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The rule that decided, if one did.
const fn decided_by<'policy>(decision: &Decision<'policy>) -> Option<&'policy Rule> {
    match decision.reason {
        Reason::Exempt(rule) | Reason::Masqueraded(rule) => Some(rule),
        Reason::NoRuleMatched | Reason::Ipv6Disabled => None,
    }
}

/// The config key a rule comes from.
const fn list_name(kind: &RuleKind) -> &'static str {
    match kind {
        RuleKind::LinkLocal => "link-local",
        RuleKind::Configured(_) => "nonMasqueradeCIDRs",
        RuleKind::Masquerade(_) => MASQUERADE_CIDRS_KEY,
        RuleKind::Source(_) => NON_MASQUERADE_SRC_CIDRS_KEY,
    }
}

fn reason(decision: &Decision<'_>) -> String {
    match decision.reason {
        Reason::NoRuleMatched => "no non-masquerade CIDR matches".to_owned(),
        Reason::Ipv6Disabled => "IPv6 is not masqueraded without --enable-ipv6".to_owned(),
        Reason::Exempt(rule) | Reason::Masqueraded(rule) => match &rule.kind {
            RuleKind::LinkLocal => format!("link-local {} (masqLinkLocal is false)", rule.cidr),
            RuleKind::Configured(from) => format!("matches {} ({from})", rule.cidr),
            RuleKind::Masquerade(from) => format!(
                "matches {MASQUERADE_CIDRS_KEY} entry {}, the longest matching prefix ({from})",
                rule.cidr
            ),
            RuleKind::Source(from) => format!(
                "source is in {NON_MASQUERADE_SRC_CIDRS_KEY} entry {} ({from})",
                rule.cidr
            ),
        },
    }
}
