//! The capabilities the DaemonSet grants masq, for the guest steps that run `masq` directly.
//!
//! The testbed's `caps` module does the same for the tests; xtask cannot depend on the
//! testbed, so the reading of the manifest is repeated here: the set comes from the rendered
//! manifest (never restated), and a process keeps it by dropping every other capability from
//! its bounding set before it executes masq as root, as the tests' `run_restricted` does
//! (here with `capsh --drop`, since the command runs in the guest's shell).

use std::process::Command;

use anyhow::{Context as _, Result, bail};
use yaml_rust2::{Yaml, YamlLoader};

use crate::{command::output, workspace_root};

/// Capability names as Kubernetes writes them (without `CAP_`), by number.
const CAPABILITY_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// A set of capabilities as a bit mask (bit N = capability N), as `/proc/PID/status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Capabilities(pub(crate) u64);

impl Capabilities {
    fn from_names(names: &[String]) -> Result<Self> {
        let mut mask = 0;
        for name in names {
            let bare = name.trim_start_matches("CAP_");
            let number = CAPABILITY_NAMES
                .iter()
                .position(|known| known.eq_ignore_ascii_case(bare))
                .with_context(|| format!("unknown capability {name:?}"))?;
            mask |= 1 << number;
        }
        Ok(Self(mask))
    }

    /// `number:cap_name` of every capability not in the set, for the guest to drop those its
    /// kernel knows (`/proc/sys/kernel/cap_last_cap`).
    pub(crate) fn others(self) -> Vec<String> {
        CAPABILITY_NAMES
            .iter()
            .enumerate()
            .filter(|(number, _)| self.0 & (1 << number) == 0)
            .map(|(number, name)| format!("{number}:cap_{}", name.to_ascii_lowercase()))
            .collect()
    }

    /// The names, for messages.
    pub(crate) fn names(self) -> Vec<&'static str> {
        CAPABILITY_NAMES
            .iter()
            .enumerate()
            .filter(|(number, _)| self.0 & (1 << number) != 0)
            .map(|(_, name)| *name)
            .collect()
    }

    /// The effective set in `/proc/PID/status` text.
    pub(crate) fn effective_in(status: &str) -> Option<Self> {
        let hex = status
            .lines()
            .find_map(|line| line.strip_prefix("CapEff:"))?;
        u64::from_str_radix(hex.trim(), 16).ok().map(Self)
    }
}

/// The capabilities added to the masq container of the DaemonSet that `kubectl kustomize
/// deploy/` renders (which must drop ALL).
pub(crate) fn daemonset_capabilities() -> Result<Capabilities> {
    let dir = workspace_root().join("deploy");
    let rendered =
        output(Command::new("kubectl").arg("kustomize").arg(&dir)).with_context(|| {
            format!(
                "rendering {} for the DaemonSet's capabilities",
                dir.display()
            )
        })?;
    capabilities_in(&rendered)
}

fn capabilities_in(rendered: &str) -> Result<Capabilities> {
    let documents = YamlLoader::load_from_str(rendered).context("the manifests are not YAML")?;
    let container = documents
        .iter()
        .filter(|document| document["kind"].as_str() == Some("DaemonSet"))
        .filter_map(|daemonset| daemonset["spec"]["template"]["spec"]["containers"].as_vec())
        .flatten()
        .find(|container| container["name"].as_str() == Some("masq"))
        .context("no DaemonSet with a container named masq in the rendered manifests")?;
    let capabilities = &container["securityContext"]["capabilities"];
    let names = |list: &Yaml| -> Vec<String> {
        list.as_vec()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|item| item.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    if !names(&capabilities["drop"])
        .iter()
        .any(|name| name == "ALL")
    {
        bail!("the DaemonSet's masq container must drop ALL capabilities and add what it needs");
    }
    let added = names(&capabilities["add"]);
    if added.is_empty() {
        bail!("the DaemonSet's masq container adds no capability");
    }
    Capabilities::from_names(&added)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFEST: &str = "\
apiVersion: v1
kind: ServiceAccount
metadata: {name: masq}
---
apiVersion: apps/v1
kind: DaemonSet
spec:
  template:
    spec:
      containers:
      - name: masq
        securityContext:
          capabilities:
            add: [BPF, PERFMON, NET_ADMIN]
            drop: [ALL]
";

    #[test]
    fn the_daemonsets_added_capabilities_are_read() {
        let caps = capabilities_in(MANIFEST).unwrap();
        assert_eq!(caps, Capabilities((1 << 39) | (1 << 38) | (1 << 12)));
        assert_eq!(caps.names(), ["NET_ADMIN", "PERFMON", "BPF"]);
        let others = caps.others();
        assert_eq!(others.len(), 38);
        assert_eq!(others[0], "0:cap_chown");
        assert!(others.contains(&"21:cap_sys_admin".to_owned()));
        assert!(!others.iter().any(|cap| cap.ends_with(":cap_bpf")));
        assert!(capabilities_in(&MANIFEST.replace("[ALL]", "[]")).is_err());
    }

    #[test]
    fn the_effective_set_is_read_from_proc_status() {
        let status = "Name:\tbash\nCapInh:\t0000000000000000\nCapEff:\t000000c000001000\n";
        assert_eq!(
            Capabilities::effective_in(status),
            Some(Capabilities((1 << 39) | (1 << 38) | (1 << 12)))
        );
    }
}
