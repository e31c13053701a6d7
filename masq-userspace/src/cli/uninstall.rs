//! `masq uninstall`: detaching the datapath, removing its pins and undoing the port
//! reservation.

use std::{
    io::{self, Write as _},
    path::PathBuf,
    process::ExitCode,
};

use clap::Args;
use masq::node::reserved_ports::DEFAULT_SYSCTL_DIR;

use super::pins::PinArgs;

#[derive(Args, Debug)]
pub(crate) struct UninstallArgs {
    #[command(flatten)]
    pins: PinArgs,
    /// Where the node's sysctls are (see `masq agent --sysctl-dir`).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SYSCTL_DIR)]
    sysctl_dir: PathBuf,
}

pub(crate) fn run(args: &UninstallArgs) -> anyhow::Result<ExitCode> {
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
