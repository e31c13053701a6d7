//! `masq explain`.

use std::{
    io::{self, Write as _},
    net::IpAddr,
    process::ExitCode,
};

use clap::Args;
use masq::{
    config::source::{CidrOrigin, load},
    policy::{Decision, Policy, Reason, RuleKind},
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
    /// Destination addresses to explain.
    #[arg(value_name = "IP", required = true)]
    destinations: Vec<IpAddr>,
}

/// One decision in JSON form.
#[derive(Serialize)]
struct JsonDecision {
    destination: String,
    masquerade: bool,
    matched: Option<String>,
}

pub(crate) fn run(args: &ExplainArgs) -> anyhow::Result<ExitCode> {
    let config = match load(&args.config.source(), &args.flags.read_options()) {
        Ok(config) => config,
        Err(error) => return Ok(fail(&error.to_string())),
    };
    let policy = Policy::new(&config, args.flags.enable_ipv6);
    let decisions: Vec<Decision<'_>> = args
        .destinations
        .iter()
        .map(|&destination| policy.decide(destination))
        .collect();
    let mut out = io::stdout().lock();
    match args.output {
        OutputFormat::Json => {
            let json: Vec<JsonDecision> = decisions
                .iter()
                .map(|decision| JsonDecision {
                    destination: decision.destination.to_string(),
                    masquerade: decision.masquerade,
                    matched: match decision.reason {
                        Reason::Exempt(rule) => Some(rule.cidr.as_str().to_owned()),
                        Reason::NoRuleMatched | Reason::Ipv6Disabled => None,
                    },
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
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn reason(decision: &Decision<'_>) -> String {
    match decision.reason {
        Reason::NoRuleMatched => "no non-masquerade CIDR matches".to_owned(),
        Reason::Ipv6Disabled => "IPv6 is not masqueraded without --enable-ipv6".to_owned(),
        Reason::Exempt(rule) => match &rule.kind {
            RuleKind::LinkLocal => format!("link-local {} (masqLinkLocal is false)", rule.cidr),
            RuleKind::Configured(CidrOrigin::Default) => format!("matches {} (default)", rule.cidr),
            RuleKind::Configured(CidrOrigin::File(path)) => {
                format!("matches {} ({})", rule.cidr, path.display())
            }
        },
    }
}
