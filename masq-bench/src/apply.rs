//! Applying a config of N CIDRs, and a change of one CIDR in it: masq's trie against
//! `iptables-restore` of upstream's chain, as `masq render-iptables` writes it.

use std::{
    collections::BTreeMap,
    io::Write as _,
    net::Ipv4Addr,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use masq::{
    config::source::{ConfigSource, ReadOptions, load},
    datapath::{
        object::{Datapath, LoadOptions},
        sync::{TrieView, sync_nomasq},
    },
    policy::{NomasqEntries, Policy},
};
use masq_common::layout::{NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL};
use masq_testbed::{agent::masq_binary, netns::Netns};

use crate::{
    config::{Config, MAX_CIDRS, cidr},
    frames::Family,
    paths::trie_capacity,
};

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
    /// Whether the list came from a config file (else, too large for one, only the trie was
    /// written, from a list built in memory).
    pub(crate) from_config: bool,
    pub(crate) masq_load: Applied,
    /// A one-CIDR change, the median of [`CHANGES`].
    pub(crate) masq_change: Applied,
    /// iptables-nft and iptables-legacy: (load, change), when a config could be rendered.
    pub(crate) nft: Option<(Duration, Duration)>,
    pub(crate) legacy: Option<(Duration, Duration)>,
}

/// How many changes are timed (alternating between two versions of the file).
pub(crate) const CHANGES: usize = 11;

/// masq: the agent's reload (read, validate, policy, trie diff and write).
fn masq_apply(
    maps: &mut masq::datapath::maps::DatapathMaps,
    source: &ConfigSource,
    options: &ReadOptions,
) -> Result<Applied> {
    let started = Instant::now();
    let config = load(source, options)?;
    let desired = Policy::shared(Arc::new(config), false).nomasq_v4();
    let parse = started.elapsed();
    let started = Instant::now();
    sync_nomasq(maps, &desired, TrieView::LastSynced)?;
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

/// The restore input the agent's iptables backend writes for `config`, for `family`'s table
/// (IPv6: as with `--enable-ipv6`).
pub(crate) fn render(config: &Config, family: Family) -> Result<String> {
    let ipv6: &[&str] = match family {
        Family::V4 => &[],
        Family::V6 => &["--enable-ipv6", "--family", "ipv6"],
    };
    let output = std::process::Command::new(masq_binary())
        .arg("render-iptables")
        .args(config.args())
        .args(ipv6)
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

/// A trie for `cidrs` CIDRs, loaded and unattached.
fn datapath(cidrs: usize) -> Result<Datapath> {
    Ok(Datapath::load(&LoadOptions {
        nat_max_entries: 1024,
        nomasq_max_entries: trie_capacity(cidrs),
        ..LoadOptions::default()
    })?)
}

/// Loading `cidrs` CIDRs into an empty trie / chain, then changing one of them.
pub(crate) fn measure(cidrs: usize) -> Result<ApplyTimes> {
    if cidrs > MAX_CIDRS {
        return measure_trie_only(cidrs);
    }
    let dir = std::env::temp_dir();
    let tag = masq_testbed::netns::unique_tag("bnapply");
    let full = Config::write(&dir.join(format!("{tag}-full")), Family::V4, cidrs, false)?;
    let changed = Config::write(&dir.join(format!("{tag}-changed")), Family::V4, cidrs, true)?;
    // The file the agent reads, replaced by each version in turn as the kubelet does.
    let live = Config::write(&dir.join(format!("{tag}-live")), Family::V4, cidrs, false)?;
    let (source, options) = (live.source(), Config::read_options());
    let mut datapath = datapath(cidrs)?;
    let masq_load = masq_apply(&mut datapath.maps, &source, &options)?;
    let mut times = Vec::with_capacity(CHANGES);
    for round in 0..CHANGES {
        live.replace_with([&full, &changed][(round + 1) % 2])?;
        times.push(masq_apply(&mut datapath.maps, &source, &options)?);
    }
    times.sort_by_key(Applied::total);
    let masq_change = times[CHANGES / 2];
    let (full_rules, changed_rules) = (render(&full, Family::V4)?, render(&changed, Family::V4)?);
    let mut iptables = [None, None];
    for (program, times) in ["iptables-nft-restore", "iptables-legacy-restore"]
        .into_iter()
        .zip(&mut iptables)
    {
        let netns = Netns::new(&format!("{tag}-ipt"));
        let load = restore(&netns, program, &full_rules)?;
        // Upstream rewrites the whole chain on every change.
        *times = Some((load, restore(&netns, program, &changed_rules)?));
    }
    let [nft, legacy] = iptables;
    Ok(ApplyTimes {
        cidrs,
        from_config: true,
        masq_load,
        masq_change,
        nft,
        legacy,
    })
}

/// A list too large for any config masq reads: only the trie write, from the list the policy
/// would compute (the CIDRs and link-local).
fn measure_trie_only(cidrs: usize) -> Result<ApplyTimes> {
    let entry = |text: &str| -> Result<((Ipv4Addr, u8), u32)> {
        let (address, prefix) = text.split_once('/').context("no prefix")?;
        Ok(((address.parse()?, prefix.parse()?), NOMASQ_KIND_CIDR))
    };
    let mut desired = (0..cidrs)
        .map(|index| entry(&cidr(index)))
        .collect::<Result<BTreeMap<_, _>>>()?;
    let entries = |desired: &BTreeMap<_, _>| NomasqEntries::from(desired.clone());
    desired.insert((Ipv4Addr::new(169, 254, 0, 0), 16), NOMASQ_KIND_LINK_LOCAL);
    let mut datapath = datapath(cidrs)?;
    let wanted = entries(&desired);
    let started = Instant::now();
    sync_nomasq(&mut datapath.maps, &wanted, TrieView::LastSynced)?;
    let load = started.elapsed();
    let last = entry(&cidr(cidrs - 1))?.0;
    desired.remove(&last);
    desired.insert((Ipv4Addr::new(100, 127, 255, 255), 32), NOMASQ_KIND_CIDR);
    let wanted = entries(&desired);
    let started = Instant::now();
    sync_nomasq(&mut datapath.maps, &wanted, TrieView::LastSynced)?;
    let change = started.elapsed();
    Ok(ApplyTimes {
        cidrs,
        from_config: false,
        masq_load: Applied {
            parse: Duration::ZERO,
            write: load,
        },
        masq_change: Applied {
            parse: Duration::ZERO,
            write: change,
        },
        nft: None,
        legacy: None,
    })
}
