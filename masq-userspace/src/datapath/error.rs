//! Errors of the datapath layer.

use std::path::PathBuf;

use aya::{EbpfError, maps::MapError, pin::PinError, programs::ProgramError};

/// Something went wrong loading, adopting or operating the eBPF datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The embedded object could not be parsed or its maps created.
    #[error("loading the eBPF object failed")]
    Load(#[from] EbpfError),
    /// The kernel refused to create a map for lack of permission: on a kernel that charges
    /// BPF memory to `RLIMIT_MEMLOCK`, the DaemonSet's capabilities cannot raise the limit.
    #[error(
        "the kernel refused to create map {map} (EPERM): it needs CAP_BPF, and a kernel that \
         charges BPF memory to RLIMIT_MEMLOCK (Linux before 5.11, or a vendor kernel that \
         still does) also needs the memory under the memlock limit ({memlock}): grant the \
         container CAP_SYS_RESOURCE, or raise its memlock limit (LimitMEMLOCK=infinity for \
         the container runtime)"
    )]
    MapCreationRefused {
        /// Which map.
        map: String,
        /// The process's memlock limit, as a person reads it.
        memlock: String,
    },
    /// The object lacks a map or program this version of masq expects.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        /// "map" or "program".
        kind: &'static str,
        /// Name looked for.
        name: &'static str,
    },
    /// A map operation failed.
    #[error("{operation} map {map} failed")]
    Map {
        /// What was being done.
        operation: &'static str,
        /// Which map.
        map: &'static str,
        /// The kernel's answer.
        #[source]
        source: MapError,
    },
    /// A program could not be loaded or attached.
    #[error("{operation} program {program} failed")]
    Program {
        /// What was being done.
        operation: &'static str,
        /// Which program.
        program: &'static str,
        /// The kernel's answer, including the verifier log for load failures.
        #[source]
        source: ProgramError,
    },
    /// The kernel refused to load a program: its verifier's verdict, in one line (the whole
    /// verifier log goes to the debug log, where it belongs).
    #[error("the kernel refused program {program}: {verdict}")]
    Refused {
        /// Which program.
        program: &'static str,
        /// The `BPF_PROG_LOAD` syscall's error.
        #[source]
        source: std::io::Error,
        /// What the verifier said last, or which helper the kernel lacks.
        verdict: String,
    },
    /// Pinning or unpinning failed.
    #[error("pinning {what} at {path} failed")]
    Pin {
        /// What was pinned.
        what: String,
        /// Where.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: PinError,
    },
    /// A pinned link could not be used.
    #[error("the tcx link pinned at {path} cannot be used: {detail}")]
    Link {
        /// The pin.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// Attaching to or detaching from an interface failed outside of a program operation
    /// (qdisc, filter listing).
    #[error("interface {interface}: {detail}")]
    Attach {
        /// The interface.
        interface: String,
        /// What went wrong.
        detail: String,
    },
    /// Filesystem trouble under the pin directory.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The config does not fit the trie.
    #[error(transparent)]
    TrieCapacity(#[from] super::sync::TrieCapacityError),
    /// Another agent holds the pin directory.
    #[error(
        "another masq agent is running with the pin path {}; two agents would replace each \
         other's programs (stop it, or give this one another --pin-path)",
        .0.display()
    )]
    PinPathInUse(PathBuf),
    /// The datapath's debug records cannot be read.
    #[error("reading datapath debug logs: {0}")]
    Logger(String),
    /// Nothing is pinned where an inspection command looked.
    #[error("no masq datapath is pinned under {0} (is the agent running with this --pin-path?)")]
    NotPinned(PathBuf),
}

impl DatapathError {
    /// The error of loading the object: a map the kernel refused to create for lack of
    /// permission is said so, with what to grant.
    pub(crate) fn loading(error: EbpfError) -> Self {
        match error {
            EbpfError::MapError(MapError::CreateError { name, io_error })
                if io_error.raw_os_error() == Some(libc::EPERM) =>
            {
                Self::MapCreationRefused {
                    map: name,
                    memlock: memlock_limit(),
                }
            }
            error => Self::Load(error),
        }
    }

    pub(crate) fn map(operation: &'static str, map: &'static str) -> impl FnOnce(MapError) -> Self {
        move |source| Self::Map {
            operation,
            map,
            source,
        }
    }

    pub(crate) fn program(
        operation: &'static str,
        program: &'static str,
    ) -> impl FnOnce(ProgramError) -> Self {
        move |source| match source {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                let log = verifier_log.to_string();
                tracing::debug!(program, verifier_log = %log, "the verifier refused a program");
                Self::Refused {
                    program,
                    source: io_error,
                    verdict: verifier_verdict(&log),
                }
            }
            source => Self::Program {
                operation,
                program,
                source,
            },
        }
    }
}

/// The process's `RLIMIT_MEMLOCK`, for the map-creation error.
fn memlock_limit() -> String {
    match crate::sys::memory::memlock_limit() {
        Ok(None) => "unlimited here".to_owned(),
        Ok(Some(bytes)) => format!("{} KiB here", bytes / 1024),
        Err(error) => format!("unknown: {error}"),
    }
}

/// The verifier's verdict on a program it refused, in one line: the helper the kernel lacks
/// if that is the reason, else the last line the verifier wrote.
fn verifier_verdict(log: &str) -> String {
    /// What the verifier says of a helper number it does not know (`unknown#160`).
    const UNKNOWN_HELPER: &str = "invalid func unknown#";
    if let Some(at) = log.find(UNKNOWN_HELPER) {
        let number: String = log[at + UNKNOWN_HELPER.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        return format!(
            "it calls BPF helper #{number}, which this kernel does not have (a newer kernel is \
             needed)"
        );
    }
    // The verifier ends its log with statistics, after the reason.
    let statistics = |line: &str| {
        ["processed ", "verification time", "stack depth"]
            .iter()
            .any(|prefix| line.starts_with(prefix))
    };
    log.lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !statistics(line))
        .map_or_else(|| "the verifier gave no reason".to_owned(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_the_kernel_refuses_to_create_says_what_to_grant() {
        let refused = DatapathError::loading(EbpfError::MapError(MapError::CreateError {
            name: "masq_nat_v4".to_owned(),
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        }))
        .to_string();
        assert!(!refused.contains('\n'), "{refused}");
        assert!(refused.contains("masq_nat_v4"), "{refused}");
        assert!(refused.contains("RLIMIT_MEMLOCK"), "{refused}");
        assert!(refused.contains("CAP_SYS_RESOURCE"), "{refused}");
        let other = DatapathError::loading(EbpfError::MapError(MapError::CreateError {
            name: "masq_nat_v4".to_owned(),
            io_error: std::io::Error::from_raw_os_error(libc::ENOMEM),
        }));
        assert!(matches!(other, DatapathError::Load(_)), "{other}");
    }

    #[test]
    fn the_verdict_is_the_verifiers_last_line_or_the_missing_helper() {
        let too_large = "0: (bf) r6 = r1\n1: (85) call bpf_get_prandom_u32#7\n...\nBPF program \
                         is too large. Processed 1000001 insn\nprocessed 1000001 insns (limit \
                         1000000) max_states_per_insn 4\n\n";
        assert_eq!(
            verifier_verdict(too_large),
            "BPF program is too large. Processed 1000001 insn"
        );
        let stack = "combined stack size of 2 calls is 544. Too large\nverification time 11424 \
                     usec\nstack depth 488+0\nprocessed 7941 insns (limit 1000000) \
                     max_states_per_insn 10\n";
        assert_eq!(
            verifier_verdict(stack),
            "combined stack size of 2 calls is 544. Too large"
        );
        let old = "0: (85) call unknown#160\ninvalid func unknown#160\nprocessed 1 insns\n";
        let verdict = verifier_verdict(old);
        assert!(verdict.contains("#160"), "{verdict}");
        assert!(!verdict.contains('\n'), "{verdict}");
        assert_eq!(verifier_verdict("\n \n"), "the verifier gave no reason");
    }
}
