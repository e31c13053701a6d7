//! The configs the bench writes: N non-masquerade CIDRs, none of which holds the destination of
//! the masqueraded traffic. The IPv6 section's configs list upstream's three IPv4 defaults and
//! N IPv6 CIDRs, as a dual-stack node's would.
//!
//! masq reads at most 1 MiB per file (what a ConfigMap holds), and directory mode takes at most
//! 64 CIDRs per file (as Azure's agent): about 60,000 /32s in YAML's compact flow style is the
//! most one config can hold. [`MAX_CIDRS`] stays under that.

use std::{
    fmt::Write as _,
    fs,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use crate::frames::Family;
use anyhow::{Context as _, Result, bail};
use masq::config::{
    GoDuration,
    source::{ConfigSource, ReadOptions},
};

/// The most CIDRs a config of this bench holds: about 16 bytes each, under 1 MiB.
pub(crate) const MAX_CIDRS: usize = 50_000;

/// The `index`th CIDR: upstream's three defaults (the first, 10.0.0.0/8, holds
/// [`crate::frames::EXEMPT_SINK`]), then /32s in 100.64.0.0/10.
pub(crate) fn cidr(index: usize) -> String {
    match index {
        0 => "10.0.0.0/8".to_owned(),
        1 => "172.16.0.0/12".to_owned(),
        2 => "192.168.0.0/16".to_owned(),
        _ => {
            let offset = u32::try_from(index).unwrap_or(u32::MAX);
            format!(
                "{}/32",
                Ipv4Addr::from_bits(Ipv4Addr::new(100, 64, 0, 0).to_bits() + offset)
            )
        }
    }
}

/// The `index`th IPv6 CIDR: three /48s (the first, 2001:db8:a::/48, holds
/// [`crate::frames::EXEMPT_SINK_V6`]), then /128s in 2001:db8:100::/48.
pub(crate) fn cidr_v6(index: usize) -> String {
    match index {
        0..3 => format!("2001:db8:{:x}::/48", 0xa + index),
        _ => {
            let offset = u128::try_from(index).unwrap_or(u128::MAX);
            format!(
                "{}/128",
                Ipv6Addr::from_bits(
                    Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0).to_bits() + offset
                )
            )
        }
    }
}

/// The CIDRs of a config of `family` with `count` CIDRs of that family.
fn cidrs(family: Family, count: usize) -> Vec<String> {
    match family {
        Family::V4 => (0..count).map(cidr).collect(),
        Family::V6 => (0..3).map(cidr).chain((0..count).map(cidr_v6)).collect(),
    }
}

/// One config file listing `cidrs`, in flow style (`[a, b]`), the most compact YAML.
fn file_text(cidrs: &[String], limit: usize) -> String {
    let mut text = format!("cidrLimit: {limit}\nnonMasqueradeCIDRs: [");
    for (index, cidr) in cidrs.iter().enumerate() {
        let separator = if index == 0 { "" } else { ", " };
        let _ = write!(text, "{separator}{cidr}");
    }
    text.push_str("]\n");
    text
}

/// A config file, removed when dropped.
#[derive(Debug)]
pub(crate) struct Config {
    path: PathBuf,
}

impl Config {
    /// `count` CIDRs of `family` at `path`; with `changed`, the last CIDR is replaced by
    /// another: a one-CIDR change.
    pub(crate) fn write(path: &Path, family: Family, count: usize, changed: bool) -> Result<Self> {
        let limit = match family {
            Family::V4 => count,
            Family::V6 => count + 3,
        };
        Self::write_limited(path, family, count, changed, limit.max(64))
    }

    fn write_limited(
        path: &Path,
        family: Family,
        count: usize,
        changed: bool,
        limit: usize,
    ) -> Result<Self> {
        // IPv6 CIDRs take up to twice the room.
        let most = match family {
            Family::V4 => MAX_CIDRS,
            Family::V6 => MAX_CIDRS / 2,
        };
        if count > most {
            bail!("{count} CIDRs do not fit one config (at most {most} here)");
        }
        let mut cidrs = cidrs(family, count);
        if changed && let Some(last) = cidrs.last_mut() {
            *last = match family {
                Family::V4 => "100.127.255.255/32",
                Family::V6 => "2001:db8:1ff::ffff/128",
            }
            .to_owned();
        }
        fs::write(path, file_text(&cidrs, limit))
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// Replaces the config by one of `count` CIDRs the way the kubelet updates a mounted
    /// ConfigMap: written aside, then renamed into place.
    pub(crate) fn replace(&self, count: usize) -> Result<()> {
        let staged = Self::write(&self.path.with_extension("next"), Family::V4, count, false)?;
        fs::rename(&staged.path, &self.path).context("renaming the new config into place")
    }

    /// Replaces the config by a copy of `other`, written aside and renamed into place.
    pub(crate) fn replace_with(&self, other: &Self) -> Result<()> {
        let staged = self.path.with_extension("next");
        fs::copy(&other.path, &staged).context("staging the new config")?;
        fs::rename(&staged, &self.path).context("renaming the new config into place")
    }

    /// The agent's (and `masq render-iptables`') arguments naming it.
    pub(crate) fn args(&self) -> [String; 2] {
        ["--config".to_owned(), self.path.display().to_string()]
    }

    /// Where the agent reads it from.
    pub(crate) fn source(&self) -> ConfigSource {
        ConfigSource::File(self.path.clone())
    }

    /// The agent's default reading options.
    pub(crate) fn read_options() -> ReadOptions {
        ReadOptions {
            nomasq_all_reserved_ranges: false,
            enable_ipv6: false,
            resync_interval: GoDuration::from_secs(60),
        }
    }
}

impl Drop for Config {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
