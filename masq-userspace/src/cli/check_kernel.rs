//! `masq check-kernel`: whether this node's kernel runs masq's datapath, proven by loading it.

use std::{
    io::{self, Write as _},
    process::ExitCode,
};

use clap::Args;
use masq::{
    causes::WithCauses,
    datapath::{
        attach::AttachMode,
        object::{Datapath, LoadOptions},
    },
    node::kernel::{Kernel, VERIFIER_LIMIT, supported_kernel},
};
use serde::Serialize;

use super::{OutputFormat, check_config::fail};

/// NAT table entries of the trial load: the programs are the same whatever the table's size,
/// and a small table keeps the check from taking the agent's memory.
const TRIAL_NAT_ENTRIES: u32 = 1024;

#[derive(Args, Debug)]
pub(crate) struct CheckKernelArgs {
    /// Output format.
    #[arg(long, short, value_enum, default_value_t = OutputFormat::Text)]
    output: OutputFormat,
}

#[derive(Serialize)]
struct KernelReport {
    kernel: String,
    attach_mode: &'static str,
    programs: Vec<ProgramReport>,
    verifier_limit: u32,
}

#[derive(Serialize)]
struct ProgramReport {
    name: &'static str,
    /// `None` where the kernel does not report it (before Linux 5.16).
    verified_insns: Option<u32>,
}

pub(crate) fn run(args: &CheckKernelArgs) -> anyhow::Result<ExitCode> {
    let kernel = match supported_kernel() {
        Ok(kernel) => kernel,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    // Loaded, never attached, with private maps that vanish with the process.
    let datapath = match Datapath::load(&LoadOptions {
        nat_max_entries: TRIAL_NAT_ENTRIES,
        ..LoadOptions::default()
    }) {
        Ok(datapath) => datapath,
        Err(error) => {
            return Ok(fail(&format!(
                "Linux {}: {}",
                kernel.release,
                WithCauses(&error)
            )));
        }
    };
    let report = KernelReport {
        kernel: kernel.release.clone(),
        attach_mode: AttachMode::best_for_kernel().name(),
        programs: datapath
            .verified_sizes()?
            .into_iter()
            .map(|(name, verified_insns)| ProgramReport {
                name,
                verified_insns,
            })
            .collect(),
        verifier_limit: VERIFIER_LIMIT,
    };
    let mut out = io::stdout().lock();
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_text(&mut out, &kernel, &report)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn write_text(out: &mut impl io::Write, kernel: &Kernel, report: &KernelReport) -> io::Result<()> {
    writeln!(
        out,
        "Linux {} runs masq's datapath, attached with {}",
        kernel.release, report.attach_mode
    )?;
    writeln!(
        out,
        "instructions the verifier processed per program (limit {}):",
        report.verifier_limit
    )?;
    for program in &report.programs {
        match program.verified_insns {
            Some(count) => writeln!(out, "  {:<20} {count:>9}", program.name)?,
            None => writeln!(
                out,
                "  {:<20} {:>9}",
                program.name, "(not reported by this kernel)"
            )?,
        }
    }
    Ok(())
}
