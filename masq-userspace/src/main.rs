//! The `masq` binary: parses the command line, sets up logging, and runs the command.

#![deny(unsafe_code)]

mod cli;

use std::process::ExitCode;

use clap::Parser as _;
use tracing_subscriber::{EnvFilter, fmt};

use crate::cli::{Cli, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse_from(cli::normalize_go_flags(std::env::args_os()));
    init_logging(&cli);
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{}", masq::causes::WithCauses(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn init_logging(cli: &Cli) {
    let level = cli
        .log_level
        .clone()
        .unwrap_or_else(|| match cli.klog.verbosity {
            Some(verbosity) if verbosity >= 4 => "debug".to_owned(),
            _ => "info".to_owned(),
        });
    let filter = EnvFilter::try_new(&level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_target(false).init(),
    }
    let ignored = cli.klog.ignored();
    if !ignored.is_empty() {
        tracing::warn!(flags = %ignored.join(" "), "ignoring klog flags that masq does not use");
    }
}
