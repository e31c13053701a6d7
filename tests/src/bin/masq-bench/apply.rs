//! Applying a config of N CIDRs, and a change of one CIDR in it: masq's trie against
//! `iptables-restore` of upstream's chain, as `masq render-iptables` writes it.

use std::{
    fs,
    io::Write as _,
    process::Stdio,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use masq::{
    config::{
        go::GoDuration,
        source::{ConfigSource, ReadOptions, load},
    },
    datapath::{
        object::{Datapath, LoadOptions},
        sync::sync_nomasq,
    },
    policy::Policy,
};
use masq_testbed::{agent::masq_binary, netns::Netns};

use crate::paths::{TempFile, config_text, trie_capacity};

/// What applying one config took.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Applied {
    /// Reading and validating the file, and computing the policy.
    pub(crate) parse: Duration,
    /// Writing the trie (masq) or running `iptables-restore` (iptables).
    pub(crate) write: Duration,
}

impl Applied {
    pub(crate) fn total(&self) -> Duration {
        self.parse + self.write
    }
}

/// One list size.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ApplyTimes {
    pub(crate) cidrs: usize,
    pub(crate) masq_load: Applied,
    pub(crate) masq_change: Applied,
    pub(crate) nft_load: Duration,
    pub(crate) nft_change: Duration,
    pub(crate) legacy_load: Duration,
    pub(crate) legacy_change: Duration,
}

/// The config with its last CIDR replaced by another: a one-CIDR change.
fn changed_text(count: usize) -> String {
    let text = config_text(count);
    let last = crate::paths::cidr(count - 1);
    text.replace(&format!("- {last}\n"), "- 100.127.255.255/32\n")
}

/// masq: the agent's reload (read, validate, policy, trie diff and write) for `path`.
fn masq_apply(
    maps: &mut masq::datapath::maps::DatapathMaps,
    path: &std::path::Path,
) -> Result<Applied> {
    let options = ReadOptions {
        nomasq_all_reserved_ranges: false,
        enable_ipv6: false,
        resync_interval: GoDuration::from_secs(60),
    };
    let started = Instant::now();
    let config = load(&ConfigSource::File(path.to_path_buf()), &options)?;
    let desired = Policy::new(&config, false).nomasq_v4();
    let parse = started.elapsed();
    let started = Instant::now();
    sync_nomasq(maps, &desired)?;
    Ok(Applied {
        parse,
        write: started.elapsed(),
    })
}

/// `program --noflush` with `input` on stdin inside `netns`, timed from start to exit.
pub(crate) fn restore(netns: &Netns, program: &str, input: &str) -> Result<Duration> {
    let started = Instant::now();
    let mut child = netns
        .command(program)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {program}"))?;
    child
        .stdin
        .take()
        .context("no stdin")?
        .write_all(input.as_bytes())?;
    let output = child.wait_with_output()?;
    let elapsed = started.elapsed();
    if !output.status.success() {
        bail!(
            "{program} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(elapsed)
}

/// The restore input the agent's iptables backend writes for the config at `path`.
pub(crate) fn render(path: &std::path::Path) -> Result<String> {
    let output = std::process::Command::new(masq_binary())
        .arg("render-iptables")
        .arg("--config")
        .arg(path)
        .output()
        .context("running masq render-iptables")?;
    if !output.status.success() {
        bail!(
            "masq render-iptables: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Loading `cidrs` CIDRs into an empty trie / chain, then changing one of them.
pub(crate) fn measure(cidrs: usize) -> Result<ApplyTimes> {
    let dir = std::env::temp_dir();
    let tag = masq_testbed::netns::unique_tag("bnapply");
    let full = TempFile(dir.join(format!("{tag}-full")));
    let changed = TempFile(dir.join(format!("{tag}-changed")));
    fs::write(&full.0, config_text(cidrs))?;
    fs::write(&changed.0, changed_text(cidrs))?;

    let mut datapath = Datapath::load(&LoadOptions {
        nat_max_entries: 1024,
        nomasq_max_entries: trie_capacity(cidrs),
        ..LoadOptions::default()
    })?;
    let masq_load = masq_apply(&mut datapath.maps, &full.0)?;
    let masq_change = masq_apply(&mut datapath.maps, &changed.0)?;

    let (full_rules, changed_rules) = (render(&full.0)?, render(&changed.0)?);
    let mut times = ApplyTimes {
        cidrs,
        masq_load,
        masq_change,
        ..ApplyTimes::default()
    };
    for (program, load, change) in [
        (
            "iptables-nft-restore",
            &mut times.nft_load,
            &mut times.nft_change,
        ),
        (
            "iptables-legacy-restore",
            &mut times.legacy_load,
            &mut times.legacy_change,
        ),
    ] {
        let netns = Netns::new(&format!("{tag}-ipt"));
        *load = restore(&netns, program, &full_rules)?;
        // Upstream rewrites the whole chain on every change.
        *change = restore(&netns, program, &changed_rules)?;
    }
    Ok(times)
}
