//! The `masq` command line.

mod agent;
mod args;
mod check_config;
mod check_kernel;
mod explain;
mod nat;
mod pause;
mod pins;
mod render;
mod status;
mod uninstall;

use std::{ffi::OsString, process::ExitCode};

use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

use self::args::KlogFlags;

/// masq: Kubernetes' ip-masq-agent as an eBPF datapath.
#[derive(Parser, Debug)]
#[command(name = "masq", version, about, long_about = None, propagate_version = true)]
pub(crate) struct Cli {
    /// Log format.
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,

    /// Log level (error, warn, info, debug, trace) or a tracing filter directive.
    #[arg(long, global = true, value_name = "FILTER")]
    pub(crate) log_level: Option<String>,

    #[command(flatten)]
    pub(crate) klog: KlogFlags,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    /// Aligned text for people.
    Text,
    /// JSON for programs.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run the node agent: load and attach the datapath, keep it in line with the config.
    Agent(Box<agent::AgentArgs>),
    /// Validate the config as the agent would and print the effective config, or upstream's
    /// error message (exit status 1).
    CheckConfig(check_config::CheckConfigArgs),
    /// Load the datapath (without attaching it) to prove this kernel runs it, and report each
    /// program's verified size; refuse an unsupported kernel in one line (exit status 1).
    CheckKernel(check_kernel::CheckKernelArgs),
    /// Tell, for each destination, whether traffic to it is masqueraded and which rule decides.
    Explain(explain::ExplainArgs),
    /// Print the input ip-masq-agent passes to iptables-restore for this config and these flags.
    RenderIptables(render::RenderArgs),
    /// Show the pinned datapath: attachment, settings, exempt CIDRs, table use, counters.
    Status(status::StatusArgs),
    /// Inspect the NAT table.
    #[command(subcommand)]
    Nat(nat::NatCommand),
    /// Detach the datapath, remove its pins and undo the port reservation.
    Uninstall(uninstall::UninstallArgs),
    /// Do nothing until terminated (SIGTERM or SIGINT): keeps the uninstall DaemonSet's pods
    /// running once their init container has run `masq uninstall`.
    Pause,
}

/// Go's `flag` package accepts long flags with one dash (`-masq-chain=X`); rewrite those to
/// clap's two-dash form so existing DaemonSet arguments keep working.
pub(crate) fn normalize_go_flags(arguments: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let command = Cli::command();
    let mut long_names: Vec<String> = Vec::new();
    collect_long_names(&command, &mut long_names);
    arguments
        .into_iter()
        .map(|argument| {
            let Some(text) = argument.to_str() else {
                return argument;
            };
            let Some(rest) = text.strip_prefix('-') else {
                return argument;
            };
            if rest.starts_with('-') || rest.len() < 2 {
                return argument;
            }
            let name = rest.split('=').next().unwrap_or(rest);
            if long_names.iter().any(|known| known == name) {
                OsString::from(format!("-{text}"))
            } else {
                argument
            }
        })
        .collect()
}

fn collect_long_names(command: &clap::Command, names: &mut Vec<String>) {
    for argument in command.get_arguments() {
        if let Some(long) = argument.get_long() {
            names.push(long.to_owned());
        }
    }
    for subcommand in command.get_subcommands() {
        collect_long_names(subcommand, names);
    }
}

/// Runs the parsed command.
pub(crate) fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Agent(args) => agent::run(&args),
        Command::CheckConfig(args) => check_config::run(&args),
        Command::CheckKernel(args) => check_kernel::run(&args),
        Command::Explain(args) => explain::run(&args),
        Command::RenderIptables(args) => render::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Nat(command) => nat::run(&command),
        Command::Uninstall(args) => uninstall::run(&args),
        Command::Pause => pause::run(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn single_dash_long_flags_are_accepted() {
        let normalized = normalize_go_flags(
            [
                "masq",
                "check-config",
                "-masq-chain=X",
                "-enable-ipv6",
                "--to-ports=1",
                "-v=2",
                "-h",
            ]
            .map(OsString::from),
        );
        let normalized: Vec<&str> = normalized
            .iter()
            .filter_map(|argument| argument.to_str())
            .collect();
        assert_eq!(
            normalized,
            [
                "masq",
                "check-config",
                "--masq-chain=X",
                "--enable-ipv6",
                "--to-ports=1",
                "--v=2",
                "-h"
            ]
        );
    }
}
