//! Errors of the datapath layer.

use std::path::PathBuf;

use aya::{EbpfError, maps::MapError, pin::PinError, programs::ProgramError};

/// Something went wrong loading, adopting or operating the eBPF datapath.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// The embedded object could not be parsed or its maps created.
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] EbpfError),
    /// The object lacks a map or program this version of masq expects.
    #[error("the eBPF object has no {kind} named {name}")]
    Missing {
        /// "map" or "program".
        kind: &'static str,
        /// Name looked for.
        name: &'static str,
    },
    /// A map operation failed.
    #[error("{operation} map {map} failed: {source}")]
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
    #[error("{operation} program {program} failed: {source}")]
    Program {
        /// What was being done.
        operation: &'static str,
        /// Which program.
        program: &'static str,
        /// The kernel's answer, including the verifier log for load failures.
        #[source]
        source: ProgramError,
    },
    /// Pinning or unpinning failed.
    #[error("pinning {what} at {path} failed: {source}")]
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
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The pinned maps were created by an incompatible version of masq.
    #[error(
        "the maps pinned under {pin_path} have an incompatible layout ({detail}); {running}. Run \
         `masq uninstall --pin-path {pin_path}` to remove them (live flows are lost), or start \
         the agent with --replace-incompatible-state",
        running = if *attached {
            "the datapath attached from them keeps running, untouched"
        } else {
            "no program is attached from them"
        }
    )]
    IncompatiblePins {
        /// The pin directory.
        pin_path: PathBuf,
        /// What differs.
        detail: String,
        /// Whether programs are attached from the pin directory (pinned links exist).
        attached: bool,
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
        move |source| Self::Program {
            operation,
            program,
            source,
        }
    }
}
