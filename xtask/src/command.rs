//! Running external commands with readable failures.

use std::{
    ffi::OsStr,
    process::{Command, Output, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// Formats a command line for messages.
pub(crate) fn describe(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(
        command
            .get_args()
            .map(|arg| arg.to_string_lossy().into_owned()),
    );
    words.join(" ")
}

/// Runs `command` with inherited stdio and fails unless it exits successfully.
pub(crate) fn run(command: &mut Command) -> Result<()> {
    let line = describe(command);
    let status = command
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed with {status}");
    }
    Ok(())
}

/// Runs `command` capturing its output; fails unless it exits successfully.
pub(crate) fn output(command: &mut Command) -> Result<String> {
    let line = describe(command);
    let Output {
        status,
        stdout,
        stderr,
    } = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!(
            "`{line}` failed with {status}: {}",
            String::from_utf8_lossy(&stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// Runs `producer | consumer`; fails unless both exit successfully. Returns what the consumer
/// wrote to its standard output, unless that was redirected.
pub(crate) fn pipe(producer: &mut Command, consumer: &mut Command) -> Result<String> {
    let line = format!("{} | {}", describe(producer), describe(consumer));
    let mut first = producer
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stream = first
        .stdout
        .take()
        .context("a piped stdout that is missing")?;
    let second = consumer.stdin(stream).output();
    if !second.as_ref().is_ok_and(|output| output.status.success()) {
        // The end of the pipe the consumer read is still open here: a producer with more to
        // write would wait for ever.
        let _ = first.kill();
    }
    let first_status = first.wait()?;
    let Output {
        status,
        stdout,
        stderr,
    } = second.with_context(|| format!("could not start `{line}`"))?;
    if !first_status.success() || !status.success() {
        bail!(
            "`{line}` failed with {first_status} | {status}: {}",
            String::from_utf8_lossy(&stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&stdout).into_owned())
}

/// Whether `program` runs and exits successfully with `args`, output discarded.
pub(crate) fn succeeds(program: impl AsRef<OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// A `cargo` command using the toolchain that runs this xtask.
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    Command::new(cargo)
}
