//! Applying the rules the way upstream does, for `masq agent --backend iptables`, and finding
//! (and, when asked, removing) an upstream chain before the eBPF backend takes over.
//!
//! Upstream, on every sync: creates the chain (`-N`, "exists" is fine), ensures the POSTROUTING
//! jump (`-C`, then `-A` if missing), and rewrites the chain with `iptables-restore --noflush`.
//! All commands wait for the xtables lock (`-w 5 -W 100000`) instead of failing on contention.

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use super::render::postrouting_jump_args;
use crate::config::cidr::Family;

/// An iptables command failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The binary could not be run.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// It ran and failed.
    #[error("{command} failed: {output}")]
    Failed {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },
}

/// iptables (or ip6tables) on this node.
#[derive(Clone, Debug)]
pub struct Iptables {
    family: Family,
    /// Whether `MASQUERADE --random-fully` is supported (iptables >= 1.6.2).
    pub has_random_fully: bool,
    /// The version reported, e.g. `1.8.9`.
    pub version: String,
}

/// Parses `iptables v1.8.9 (nf_tables)`.
fn parse_version(text: &str) -> Option<Vec<u32>> {
    let start = text.find(" v")? + 2;
    let version: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let parts: Option<Vec<u32>> = version.split('.').map(|part| part.parse().ok()).collect();
    parts.filter(|parts| parts.len() >= 2)
}

impl Iptables {
    /// Detects the installed version, as upstream does once at startup.
    pub fn detect(family: Family) -> Result<Self, IptablesError> {
        let mut probe = Self {
            family,
            has_random_fully: false,
            version: String::new(),
        };
        let output = probe.run(&["--version"], None, false)?;
        let version = parse_version(&output).unwrap_or_else(|| vec![1, 4, 11]);
        probe.has_random_fully = version >= vec![1, 6, 2];
        probe.version = version
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(".");
        Ok(probe)
    }

    const fn program(&self, restore: bool) -> &'static str {
        match (self.family, restore) {
            (Family::Ipv4, false) => "iptables",
            (Family::Ipv4, true) => "iptables-restore",
            (Family::Ipv6, false) => "ip6tables",
            (Family::Ipv6, true) => "ip6tables-restore",
        }
    }

    fn run(
        &self,
        args: &[&str],
        input: Option<&str>,
        restore: bool,
    ) -> Result<String, IptablesError> {
        let program = self.program(restore);
        let mut command = Command::new(program);
        if args != ["--version"] {
            command.args(["-w", "5", "-W", "100000"]);
        }
        command.args(args).stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let line = format!("{program} {}", args.join(" "));
        let mut child = command.spawn().map_err(|source| IptablesError::Spawn {
            program: program.to_owned(),
            source,
        })?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin
                .write_all(text.as_bytes())
                .map_err(|source| IptablesError::Spawn {
                    program: program.to_owned(),
                    source,
                })?;
        }
        let output = child
            .wait_with_output()
            .map_err(|source| IptablesError::Spawn {
                program: program.to_owned(),
                source,
            })?;
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        if output.status.success() {
            Ok(printed)
        } else {
            Err(IptablesError::Failed {
                command: line,
                output: printed.trim().to_owned(),
            })
        }
    }

    /// Upstream's sync: ensure the chain, ensure the jump, restore the chain's rules.
    pub fn sync(&self, chain: &str, restore_input: &str) -> Result<(), IptablesError> {
        if self.run(&["-t", "nat", "-S", chain], None, false).is_err() {
            self.run(&["-t", "nat", "-N", chain], None, false)?;
        }
        let jump = postrouting_jump_args(chain);
        let jump: Vec<&str> = jump.iter().map(String::as_str).collect();
        let check: Vec<&str> = ["-t", "nat", "-C", "POSTROUTING"]
            .iter()
            .copied()
            .chain(jump.iter().copied())
            .collect();
        if self.run(&check, None, false).is_err() {
            let append: Vec<&str> = ["-t", "nat", "-A", "POSTROUTING"]
                .iter()
                .copied()
                .chain(jump.iter().copied())
                .collect();
            self.run(&append, None, false)?;
        }
        self.run(&["--noflush"], Some(restore_input), true)
            .map(|_| ())
    }

    /// The POSTROUTING rules that jump to `chain` (as `-A ...` lines), and whether the chain
    /// exists: the traces of an upstream ip-masq-agent (or of this backend).
    pub fn find_chain(&self, chain: &str) -> Result<(Vec<String>, bool), IptablesError> {
        let rules = self.run(&["-t", "nat", "-S", "POSTROUTING"], None, false)?;
        let jump = format!("-j {chain}");
        let jumps = rules
            .lines()
            .filter(|line| {
                line.starts_with("-A POSTROUTING")
                    && (line.ends_with(&jump) || line.contains(&format!("{jump} ")))
            })
            .map(str::to_owned)
            .collect();
        let exists = self.run(&["-t", "nat", "-S", chain], None, false).is_ok();
        Ok((jumps, exists))
    }

    /// Removes every POSTROUTING jump to `chain`, then the chain itself. Connections already
    /// translated by it keep their conntrack bindings until they end.
    pub fn remove_chain(&self, chain: &str) -> Result<usize, IptablesError> {
        let (jumps, exists) = self.find_chain(chain)?;
        for rule in &jumps {
            let words = split_rule(rule.trim_start_matches("-A POSTROUTING").trim());
            let mut args = vec![
                "-t".to_owned(),
                "nat".to_owned(),
                "-D".to_owned(),
                "POSTROUTING".to_owned(),
            ];
            args.extend(words);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            self.run(&args, None, false)?;
        }
        if exists {
            self.run(&["-t", "nat", "-F", chain], None, false)?;
            self.run(&["-t", "nat", "-X", chain], None, false)?;
        }
        Ok(jumps.len())
    }
}

/// Splits an `iptables -S` rule into arguments, honouring double quotes.
fn split_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut escaped = false;
    let mut in_word = false;
    for character in rule.chars() {
        match character {
            _ if escaped => {
                current.push(character);
                escaped = false;
            }
            '\\' if quoted => escaped = true,
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            ' ' if !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            _ => {
                current.push(character);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(current);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(
            parse_version("iptables v1.8.9 (nf_tables)\n"),
            Some(vec![1, 8, 9])
        );
        assert_eq!(parse_version("ip6tables v1.6.2"), Some(vec![1, 6, 2]));
        assert_eq!(parse_version("garbage"), None);
        assert!(
            vec![1, 6, 2] >= vec![1, 6, 2]
                && vec![1, 8, 9] >= vec![1, 6, 2]
                && vec![1, 6, 1] < vec![1, 6, 2]
        );
    }

    #[test]
    fn rules_split_like_a_shell() {
        assert_eq!(
            split_rule(
                r#"-m comment --comment "ip-masq-agent: ensure nat POSTROUTING" -m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT"#
            ),
            [
                "-m",
                "comment",
                "--comment",
                "ip-masq-agent: ensure nat POSTROUTING",
                "-m",
                "addrtype",
                "!",
                "--dst-type",
                "LOCAL",
                "-j",
                "IP-MASQ-AGENT"
            ]
        );
        assert_eq!(
            split_rule(r#"--comment "\"quoted\"" -j X"#),
            ["--comment", "\"quoted\"", "-j", "X"]
        );
    }
}
