//! The CPU architectures masq is built and tested for, and what building for each takes on this
//! (x86-64 Debian) machine.
//!
//! Nodes run x86-64 and arm64 (Graviton, Ampere). Everything for arm64 is cross-built here with
//! Debian's cross toolchain, and arm64's Debian packages are fetched and unpacked, never
//! installed, so the host's own packages stay those of its architecture.

use std::process::Command;

use anyhow::{Result, bail};

use crate::command::cargo;

/// An architecture, named as Debian and the OCI image spec both name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Arch {
    Amd64,
    Arm64,
}

impl Arch {
    /// Every architecture, the host's first.
    pub(crate) const ALL: [Self; 2] = [Self::Amd64, Self::Arm64];

    /// The machine xtask runs on; other architectures are cross-built.
    pub(crate) fn host() -> Result<Self> {
        match std::env::consts::ARCH {
            "x86_64" => Ok(Self::Amd64),
            "aarch64" => Ok(Self::Arm64),
            other => bail!("xtask runs on x86-64 or arm64 machines, not {other}"),
        }
    }

    /// Debian's name, which is also the OCI `architecture`.
    pub(crate) fn debian(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }

    /// The GNU triplet of Debian's multiarch library directories and cross tools.
    pub(crate) fn triplet(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64-linux-gnu",
            Self::Arm64 => "aarch64-linux-gnu",
        }
    }

    /// The Rust target of the image's static binary.
    pub(crate) fn musl_target(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64-unknown-linux-musl",
            Self::Arm64 => "aarch64-unknown-linux-musl",
        }
    }

    /// The Rust target of test executables that run on Debian's glibc.
    pub(crate) fn gnu_target(self) -> &'static str {
        match self {
            Self::Amd64 => "x86_64-unknown-linux-gnu",
            Self::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// Whether xtask runs on this architecture (whose builds need no cross toolchain).
    pub(crate) fn is_host(self) -> bool {
        Self::host().is_ok_and(|host| host == self)
    }

    /// The Debian packages that build `target` (one of this architecture's) here: none for the
    /// host's own, else the cross compiler (whose gcc links, and whose binutils strip, that
    /// architecture's ELF files), and for the glibc target the cross glibc it links against
    /// (a Recommends of the compiler only; musl targets bring their own C library).
    pub(crate) fn cross_packages(self, target: &str) -> Vec<String> {
        if self.is_host() {
            return Vec::new();
        }
        let mut packages = vec![format!("gcc-{}", self.triplet().replace('_', "-"))];
        if target.ends_with("-gnu") {
            packages.push(format!("libc6-dev-{}-cross", self.debian()));
        }
        packages
    }

    /// A tool of this architecture's binutils: the host's own, or the cross one.
    pub(crate) fn tool(self, name: &str) -> String {
        if self.is_host() {
            name.to_owned()
        } else {
            format!("{}-{name}", self.triplet())
        }
    }

    /// `cargo` set up to build for `target` (one of this architecture's). Rust's own linker
    /// choice for a foreign target is the host's `cc`, which cannot link it: the cross gcc is
    /// named through the variable cargo reads for that target alone, so no configuration
    /// file changes what other builds (or other checkouts) link with.
    pub(crate) fn cargo(self, target: &str) -> Command {
        let mut command = cargo();
        if !self.is_host() {
            let variable = format!(
                "CARGO_TARGET_{}_LINKER",
                target.to_uppercase().replace('-', "_")
            );
            command.env(variable, self.tool("gcc"));
        }
        command
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.debian())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_target_links_with_the_cross_gcc_through_its_own_variable() {
        let foreign = if Arch::host().unwrap() == Arch::Amd64 {
            Arch::Arm64
        } else {
            Arch::Amd64
        };
        let command = foreign.cargo(foreign.musl_target());
        let variables: Vec<(String, String)> = command
            .get_envs()
            .filter_map(|(key, value)| {
                Some((
                    key.to_string_lossy().into_owned(),
                    value?.to_string_lossy().into_owned(),
                ))
            })
            .collect();
        // Spelled out rather than derived the way the code derives them.
        let expected = match foreign {
            Arch::Arm64 => (
                "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER",
                "aarch64-linux-gnu-gcc",
            ),
            Arch::Amd64 => (
                "CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER",
                "x86_64-linux-gnu-gcc",
            ),
        };
        assert_eq!(variables, [(expected.0.to_owned(), expected.1.to_owned())]);
        let host = Arch::host().unwrap();
        assert_eq!(host.cargo(host.musl_target()).get_envs().count(), 0);
        assert_eq!(host.tool("strip"), "strip");
    }
}
