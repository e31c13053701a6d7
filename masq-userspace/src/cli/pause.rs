//! `masq pause`.
//!
//! A DaemonSet's pods must keep running, but the uninstall DaemonSet has nothing left to do once
//! `masq uninstall` ran in its init container. Its image has no shell and no `sleep`, so the masq
//! binary itself waits. As PID 1 of its container it gets no default signal handling: SIGTERM has
//! to be handled explicitly, or deleting the DaemonSet would wait out the grace period.

use std::process::ExitCode;

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};

pub(crate) fn run() -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
        tracing::info!("nothing to do; waiting to be terminated");
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}
