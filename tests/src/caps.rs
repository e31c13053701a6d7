//! Running `masq` with exactly the capabilities the DaemonSet grants.
//!
//! A test that passes only as full root proves little: on a node the agent holds the
//! capabilities `deploy/` adds to an otherwise empty set. The set is read from the rendered
//! manifest (never restated here), and the process is checked to hold exactly that set.

use std::{
    fs,
    os::{fd::AsRawFd as _, unix::process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use yaml_rust2::{Yaml, YamlLoader};

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
pub struct CapabilitySet(pub u64);

impl CapabilitySet {
    /// The set of the named capabilities (`NET_ADMIN` or `CAP_NET_ADMIN`).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Self {
        let mut mask = 0;
        for name in names {
            let name = name.as_ref().trim_start_matches("CAP_");
            let number = CAPABILITY_NAMES
                .iter()
                .position(|known| known.eq_ignore_ascii_case(name))
                .unwrap_or_else(|| panic!("unknown capability {name:?}"));
            mask |= 1 << number;
        }
        Self(mask)
    }

    /// The names in the set.
    pub fn names(self) -> Vec<&'static str> {
        CAPABILITY_NAMES
            .iter()
            .enumerate()
            .filter(|(number, _)| self.0 & (1 << number) != 0)
            .map(|(_, name)| *name)
            .collect()
    }

    /// Whether capability `name` is in the set.
    pub fn contains(self, name: &str) -> bool {
        self.0 & Self::from_names(&[name]).0 != 0
    }
}

/// The repository's `deploy/` directory.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| panic!("the testbed lives inside the repository"))
        .join("deploy")
}

/// The capabilities the masq container of the DaemonSet that `kubectl kustomize deploy/`
/// renders is granted: it must drop `ALL` and add a list.
pub fn daemonset_capabilities() -> CapabilitySet {
    let dir = deploy_dir();
    let rendered = crate::netns::run(Command::new("kubectl").arg("kustomize").arg(&dir));
    let text = String::from_utf8_lossy(&rendered.stdout);
    let documents = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|error| panic!("the rendered manifests are not YAML: {error}"));
    let container = documents
        .iter()
        .filter(|document| document["kind"].as_str() == Some("DaemonSet"))
        .flat_map(|daemonset| {
            daemonset["spec"]["template"]["spec"]["containers"]
                .as_vec()
                .cloned()
                .unwrap_or_default()
        })
        .find(|container| container["name"].as_str() == Some("masq"))
        .unwrap_or_else(|| {
            panic!(
                "no DaemonSet with a container named masq in {}",
                dir.display()
            )
        });
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
    assert!(
        names(&capabilities["drop"])
            .iter()
            .any(|name| name == "ALL"),
        "the DaemonSet must drop ALL capabilities and add what it needs"
    );
    let added = names(&capabilities["add"]);
    assert!(
        !added.is_empty(),
        "the DaemonSet adds no capability: {capabilities:?}"
    );
    CapabilitySet::from_names(&added)
}

/// Makes `command` run in the network namespace at `netns` holding exactly `keep`, as root
/// does in a container that dropped every other capability: the namespace is entered while the
/// capability to do so is still held, then every other capability leaves the bounding set, so
/// the exec'd program's permitted and effective sets are `keep`.
pub fn run_restricted(command: &mut Command, netns: &Path, keep: CapabilitySet) {
    let namespace = fs::File::open(netns)
        .unwrap_or_else(|error| panic!("opening {}: {error}", netns.display()));
    let last_capability: u32 = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(40);
    // SAFETY: the closure runs between fork and exec and only makes raw system calls (setns,
    // prctl, close), which are async-signal-safe; `namespace` stays open in the parent until
    // the command is spawned because the closure owns it.
    unsafe {
        command.pre_exec(move || {
            if libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for capability in 0..=last_capability {
                if keep.0 & (1 << capability) == 0
                    && libc::prctl(
                        libc::PR_CAPBSET_DROP,
                        libc::c_ulong::from(capability),
                        0,
                        0,
                        0,
                    ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // Nothing may come back through the inheritable or ambient sets either.
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The effective capabilities of process `pid`.
pub fn effective_capabilities(pid: u32) -> CapabilitySet {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|error| panic!("reading the status of process {pid}: {error}"));
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .unwrap_or_else(|| panic!("no CapEff line for process {pid}"));
    CapabilitySet(
        u64::from_str_radix(hex.trim(), 16)
            .unwrap_or_else(|error| panic!("CapEff {hex:?}: {error}")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_masks_agree() {
        let set = CapabilitySet::from_names(&["BPF", "CAP_PERFMON", "net_admin"]);
        assert_eq!(set.0, (1 << 39) | (1 << 38) | (1 << 12));
        assert_eq!(set.names(), ["NET_ADMIN", "PERFMON", "BPF"]);
        assert!(set.contains("BPF"));
        assert!(!set.contains("SYS_ADMIN"));
    }
}
