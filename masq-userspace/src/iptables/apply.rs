//! Applying the rules the way upstream does, for `masq agent --backend iptables`, and finding
//! (and, when asked, removing) an upstream chain before the eBPF backend takes over.
//!
//! Upstream, on every sync: creates the chain (`-N`, "exists" is fine), ensures the POSTROUTING
//! jump (`-C`, then `-A` if missing), and rewrites the chain with `iptables-restore --noflush`.
//! All commands wait for the xtables lock (`-w 5 -W 100000`) instead of failing on contention.
//!
//! Which iptables: a node's own `iptables` when there is one (a host install), otherwise, as in
//! masq's image, the one of `iptables-nft` and `iptables-legacy` that holds the node's rules,
//! chosen the way Kubernetes' iptables-wrapper chooses (see [`Variant`]).

use std::{
    env,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
    sync::OnceLock,
};

use super::render::postrouting_jump_args;
use crate::{causes::WithCauses, config::cidr::Family};

/// An iptables command failed.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The binary could not be run.
    #[error("cannot run {program}")]
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

/// Which iptables binaries the commands go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `iptables`, `iptables-restore`: whichever backend the node installed or selected.
    System,
    /// `iptables-nft`, `iptables-nft-restore`: the nf_tables backend.
    Nft,
    /// `iptables-legacy`, `iptables-legacy-restore`: the legacy xtables backend.
    Legacy,
}

impl Variant {
    /// What goes between `iptables` and `-restore` / `-save` in the binaries' names.
    const fn infix(self) -> &'static str {
        match self {
            Self::System => "",
            Self::Nft => "-nft",
            Self::Legacy => "-legacy",
        }
    }

    /// The binary for `family`, plain (`iptables`) or with a `-save` / `-restore` suffix.
    fn program(self, family: Family, suffix: &str) -> String {
        let base = match family {
            Family::Ipv4 => "iptables",
            Family::Ipv6 => "ip6tables",
        };
        format!("{base}{}{suffix}", self.infix())
    }

    /// The variant this process uses, chosen once: every command, both families, must talk to
    /// the same backend, or a chain found in one would be removed from the other.
    pub fn selected() -> Self {
        static SELECTED: OnceLock<Variant> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            let (variant, reason) = select(on_path, &run_save);
            tracing::info!(iptables = %variant.program(Family::Ipv4, ""), "{reason}");
            variant
        })
    }
}

/// Whether `program` is an executable file in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    let Some(path) = env::var_os("PATH") else {
        return false;
    };
    env::split_paths(&path).any(|dir| {
        Path::new(&dir)
            .join(program)
            .metadata()
            .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
    })
}

/// What running an `*-save` command gave: its output, or what it printed when it failed.
type SaveOutput = Result<String, String>;

/// Runs an `*-save` command.
fn run_save(program: &str, args: &[&str]) -> SaveOutput {
    match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(output) if output.status.success() => {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        }
        Ok(output) => Err(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        Err(error) => Err(WithCauses(&error).to_string()),
    }
}

/// Chains kubelet (1.17 and later) creates in the backend the node uses.
const KUBELET_HINT_CHAINS: [&str; 2] = [":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY "];

fn has_kubelet_hint(save: &str) -> bool {
    save.lines().any(|line| {
        KUBELET_HINT_CHAINS
            .iter()
            .any(|hint| line.starts_with(hint))
    })
}

fn count_rules(save: &str) -> usize {
    save.lines().filter(|line| line.starts_with("-A ")).count()
}

/// Picks the variant and says why. A node's own `iptables` wins. Between `iptables-nft` and
/// `iptables-legacy`, the rule of Kubernetes' iptables-wrapper: the backend holding kubelet's
/// hint chains, else the one holding more rules, nft on a tie (a node with no rules at all
/// most likely runs a distribution whose default is nft).
fn select(
    installed: impl Fn(&str) -> bool,
    save: &dyn Fn(&str, &[&str]) -> SaveOutput,
) -> (Variant, String) {
    if installed("iptables") {
        return (Variant::System, "using the node's iptables".to_owned());
    }
    match (installed("iptables-nft"), installed("iptables-legacy")) {
        (true, true) => {}
        (true, false) => return (Variant::Nft, "only iptables-nft is installed".to_owned()),
        (false, true) => {
            return (
                Variant::Legacy,
                "only iptables-legacy is installed".to_owned(),
            );
        }
        (false, false) => return (Variant::System, "no iptables is installed".to_owned()),
    }
    // nft is asked for the mangle table alone (cheap on nodes with large rule sets); legacy for
    // everything, because naming a table makes the legacy kernel side create it.
    let nft_mangle = [Family::Ipv4, Family::Ipv6]
        .map(|family| save(&Variant::Nft.program(family, "-save"), &["-t", "mangle"]));
    if nft_mangle.iter().flatten().any(|out| has_kubelet_hint(out)) {
        return (
            Variant::Nft,
            "using iptables-nft: kubelet's hint chains are in nf_tables".to_owned(),
        );
    }
    let legacy = [Family::Ipv4, Family::Ipv6]
        .map(|family| save(&Variant::Legacy.program(family, "-save"), &[]));
    for failed in legacy.iter().filter_map(|out| out.as_ref().err()) {
        if failed.contains("Permission denied") {
            tracing::warn!(
                error = %failed,
                "cannot read the iptables-legacy rules (that needs CAP_NET_RAW): rules there, such \
                 as an ip-masq-agent chain, go unnoticed"
            );
        }
    }
    if legacy.iter().flatten().any(|out| has_kubelet_hint(out)) {
        return (
            Variant::Legacy,
            "using iptables-legacy: kubelet's hint chains are in the legacy tables".to_owned(),
        );
    }
    let nft_all = [Family::Ipv4, Family::Ipv6]
        .map(|family| save(&Variant::Nft.program(family, "-save"), &[]));
    let total = |outputs: &[SaveOutput; 2]| -> usize {
        outputs.iter().flatten().map(|out| count_rules(out)).sum()
    };
    let (legacy_rules, nft_rules) = (total(&legacy), total(&nft_all));
    if legacy_rules > nft_rules {
        (
            Variant::Legacy,
            format!("using iptables-legacy: it holds {legacy_rules} rules, nf_tables {nft_rules}"),
        )
    } else {
        (
            Variant::Nft,
            format!(
                "using iptables-nft: it holds {nft_rules} rules, the legacy tables {legacy_rules}"
            ),
        )
    }
}

/// iptables (or ip6tables) on this node.
#[derive(Clone, Debug)]
pub struct Iptables {
    family: Family,
    variant: Variant,
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
            variant: Variant::selected(),
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

    fn program(&self, restore: bool) -> String {
        self.variant
            .program(self.family, if restore { "-restore" } else { "" })
    }

    fn run(
        &self,
        args: &[&str],
        input: Option<&str>,
        restore: bool,
    ) -> Result<String, IptablesError> {
        let program = self.program(restore);
        let mut command = Command::new(&program);
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
        let spawn_error = |source| IptablesError::Spawn {
            program: program.clone(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
            stdin.write_all(text.as_bytes()).map_err(spawn_error)?;
        }
        let output = child.wait_with_output().map_err(spawn_error)?;
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
    use std::collections::HashMap;

    use super::*;

    /// `select` against made-up `*-save` outputs, keyed by the command line.
    fn select_with(installed: &[&str], saves: &[(&str, Result<&str, &str>)]) -> Variant {
        let saves: HashMap<String, SaveOutput> = saves
            .iter()
            .map(|(line, out)| {
                (
                    (*line).to_owned(),
                    out.map(str::to_owned).map_err(str::to_owned),
                )
            })
            .collect();
        let save = |program: &str, args: &[&str]| {
            let line = [program]
                .iter()
                .chain(args)
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            saves
                .get(&line)
                .cloned()
                .unwrap_or_else(|| Ok(String::new()))
        };
        select(|program| installed.contains(&program), &save).0
    }

    const BOTH: &[&str] = &["iptables-nft", "iptables-legacy"];
    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const TWO_RULES: &str =
        "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j A\n-A POSTROUTING -j B\nCOMMIT\n";
    const ONE_RULE: &str = "*nat\n:POSTROUTING ACCEPT [0:0]\n-A POSTROUTING -j A\nCOMMIT\n";

    #[test]
    fn a_nodes_own_iptables_wins() {
        assert_eq!(
            select_with(&["iptables", "iptables-nft", "iptables-legacy"], &[]),
            Variant::System
        );
        assert_eq!(select_with(&["iptables-nft"], &[]), Variant::Nft);
        assert_eq!(select_with(&["iptables-legacy"], &[]), Variant::Legacy);
        assert_eq!(select_with(&[], &[]), Variant::System);
    }

    #[test]
    fn kubelets_hint_chains_decide_before_rule_counts() {
        assert_eq!(
            select_with(
                BOTH,
                &[
                    ("ip6tables-nft-save -t mangle", Ok(HINT)),
                    ("iptables-legacy-save", Ok(TWO_RULES)),
                ]
            ),
            Variant::Nft
        );
        assert_eq!(
            select_with(
                BOTH,
                &[
                    ("iptables-legacy-save", Ok(HINT)),
                    ("iptables-nft-save", Ok(TWO_RULES)),
                ]
            ),
            Variant::Legacy
        );
    }

    #[test]
    fn without_hints_the_backend_with_more_rules_wins_and_nft_takes_ties() {
        assert_eq!(
            select_with(
                BOTH,
                &[
                    ("iptables-legacy-save", Ok(ONE_RULE)),
                    ("ip6tables-legacy-save", Ok(ONE_RULE)),
                    ("iptables-nft-save", Ok(ONE_RULE)),
                ]
            ),
            Variant::Legacy
        );
        assert_eq!(
            select_with(
                BOTH,
                &[
                    ("iptables-legacy-save", Ok(ONE_RULE)),
                    ("iptables-nft-save", Ok(TWO_RULES)),
                ]
            ),
            Variant::Nft
        );
        assert_eq!(select_with(BOTH, &[]), Variant::Nft);
        // A backend that cannot be read counts as empty.
        assert_eq!(
            select_with(
                BOTH,
                &[
                    (
                        "iptables-legacy-save",
                        Err("Permission denied (you must be root)")
                    ),
                    ("iptables-nft-save", Ok(ONE_RULE)),
                ]
            ),
            Variant::Nft
        );
    }

    #[test]
    fn programs_are_named_like_the_iptables_package_names_them() {
        assert_eq!(Variant::System.program(Family::Ipv4, ""), "iptables");
        assert_eq!(
            Variant::Nft.program(Family::Ipv6, "-restore"),
            "ip6tables-nft-restore"
        );
        assert_eq!(
            Variant::Legacy.program(Family::Ipv4, "-save"),
            "iptables-legacy-save"
        );
    }

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
