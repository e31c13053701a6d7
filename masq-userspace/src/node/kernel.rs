//! The kernel the agent runs on: whether masq's datapath can run there at all, said in one
//! line before anything on the node changes, and what to call it in logs and metrics.

use std::path::Path;

/// A kernel's version, as far as masq's requirements go (the one the eBPF object's own
/// requirements are written in).
pub use masq_common::kernel::KernelVersion;

use crate::sys::sysctl::{self, DEFAULT_SYSCTL_DIR, SysctlError};

/// The oldest kernel masq's datapath runs on. `bpf_ktime_get_coarse_ns`, which dates every
/// flow, arrived in 5.11; so did the charging of BPF memory to the memory cgroup, before which
/// every map counts against `RLIMIT_MEMLOCK`, which a DaemonSet without `CAP_SYS_RESOURCE`
/// cannot raise.
pub const MINIMUM: KernelVersion = masq_common::kernel::MIN_KERNEL_TC;

/// The verifier's limit on instructions processed per program (`BPF_COMPLEXITY_LIMIT_INSNS`,
/// the same on every kernel masq supports).
pub const VERIFIER_LIMIT: u32 = 1_000_000;

/// What a kernel older than [`MINIMUM`] lacks, for the refusal.
const MISSING_BELOW_MINIMUM: &str = "the bpf_ktime_get_coarse_ns helper that dates every flow, \
     and BPF memory charged to the memory cgroup (older kernels charge it to RLIMIT_MEMLOCK, \
     which the DaemonSet's capabilities cannot raise)";

/// The running kernel's release string (`uname -r`) and the version read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kernel {
    /// The release as the kernel states it, e.g. `6.1.0-28-amd64`.
    pub release: String,
    /// Its version.
    pub version: KernelVersion,
}

/// Why masq cannot run on this kernel, or cannot tell.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel is older than [`MINIMUM`].
    #[error(
        "Linux {release} is older than {MINIMUM}, the oldest kernel masq runs on: it lacks \
         {MISSING_BELOW_MINIMUM}; keep ip-masq-agent on this node until its kernel is upgraded"
    )]
    TooOld {
        /// The running kernel's release.
        release: String,
    },
    /// The release string could not be read.
    #[error("the kernel's release is unknown")]
    Unreadable(#[source] SysctlError),
    /// The release string names no version.
    #[error("the kernel's release {0:?} does not start with a version such as 6.1")]
    Unparsable(String),
}

/// The sysctl in which the running kernel states its release.
const OSRELEASE: &str = "kernel/osrelease";

impl Kernel {
    /// The running kernel.
    pub fn current() -> Result<Self, KernelError> {
        let release = sysctl::read(Path::new(DEFAULT_SYSCTL_DIR), OSRELEASE)
            .map_err(KernelError::Unreadable)?;
        Self::from_release(release.trim())
    }

    /// The kernel whose release string is `release`.
    pub fn from_release(release: &str) -> Result<Self, KernelError> {
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .map(str::parse::<u32>);
        match (numbers.next(), numbers.next()) {
            (Some(Ok(major)), Some(Ok(minor)))
                if release.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                Ok(Self {
                    release: release.to_owned(),
                    version: KernelVersion { major, minor },
                })
            }
            _ => Err(KernelError::Unparsable(release.to_owned())),
        }
    }

    /// Refuses a kernel older than [`MINIMUM`], in one line that says what it lacks.
    pub fn require_supported(&self) -> Result<(), KernelError> {
        if self.version < MINIMUM {
            return Err(KernelError::TooOld {
                release: self.release.clone(),
            });
        }
        Ok(())
    }
}

/// The running kernel, refused in one line if masq cannot run on it.
pub fn supported_kernel() -> Result<Kernel, KernelError> {
    let kernel = Kernel::current()?;
    kernel.require_supported()?;
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_distribution_releases() {
        for (release, major, minor) in [
            ("6.1.0-28-amd64", 6, 1),
            ("5.10.0-33-cloud-amd64", 5, 10),
            ("5.15.0-1064-azure", 5, 15),
            ("6.12.12+bpo-amd64", 6, 12),
            ("6.18", 6, 18),
            ("4.18.0-553.el8_10.x86_64", 4, 18),
        ] {
            let kernel = Kernel::from_release(release).expect(release);
            assert_eq!(kernel.version, KernelVersion { major, minor }, "{release}");
            assert_eq!(kernel.release, release);
        }
        for release in ["", "six", "6", "-6.1", "6.x"] {
            assert!(Kernel::from_release(release).is_err(), "{release:?}");
        }
    }

    #[test]
    fn kernels_below_the_minimum_are_refused_in_one_line_naming_both() {
        let old = Kernel::from_release("5.10.0-33-amd64").expect("parses");
        let message = old
            .require_supported()
            .expect_err("5.10 is too old")
            .to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains("5.10.0-33-amd64"), "{message}");
        assert!(message.contains("5.11"), "{message}");
        assert!(message.contains("bpf_ktime_get_coarse_ns"), "{message}");
        assert!(message.contains("RLIMIT_MEMLOCK"), "{message}");
        for release in ["5.11.0", "5.15.0-1064-azure", "6.1.0-28-amd64", "10.0"] {
            let kernel = Kernel::from_release(release).expect(release);
            assert!(kernel.require_supported().is_ok(), "{release}");
        }
    }
}
