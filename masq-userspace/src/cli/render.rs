//! `masq render-iptables`.

use std::{
    io::{self, Write as _},
    process::ExitCode,
};

use clap::{Args, ValueEnum};
use masq::{
    causes::WithCauses,
    config::{cidr::Family, source::load},
    iptables::render::restore_input,
    policy::Policy,
};

use super::{
    args::{ConfigArgs, UpstreamFlags},
    check_config::fail,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RenderFamily {
    /// The iptables-restore input.
    Ipv4,
    /// The ip6tables-restore input (needs --enable-ipv6, as upstream).
    Ipv6,
}

#[derive(Args, Debug)]
pub(crate) struct RenderArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    flags: UpstreamFlags,
    /// Which table to render.
    #[arg(long, value_enum, default_value_t = RenderFamily::Ipv4)]
    family: RenderFamily,
}

pub(crate) fn run(args: &RenderArgs) -> anyhow::Result<ExitCode> {
    let options = match args.flags.rule_options() {
        Ok(options) => options,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    let config = match load(&args.config.source(), &args.flags.read_options()) {
        Ok(config) => config,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    let family = match args.family {
        RenderFamily::Ipv4 => Family::Ipv4,
        RenderFamily::Ipv6 if !args.flags.enable_ipv6 => {
            return Ok(fail(
                "IPv6 masquerading rules: not enabled (pass --enable-ipv6, as the agent would need)",
            ));
        }
        RenderFamily::Ipv6 => Family::Ipv6,
    };
    let policy = Policy::new(&config, args.flags.enable_ipv6);
    io::stdout()
        .lock()
        .write_all(restore_input(&policy, family, &options).as_bytes())?;
    Ok(ExitCode::SUCCESS)
}
