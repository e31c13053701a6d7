//! Judging what the guests report: `masq check-kernel`'s JSON, refusals, libtest summaries,
//! and the matrix's table of verified instruction counts.

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

/// `masq check-kernel --output json`: what the running kernel verified of masq's programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CheckKernel {
    pub(crate) kernel: String,
    pub(crate) attach_mode: String,
    pub(crate) programs: Vec<Program>,
    pub(crate) verifier_limit: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Program {
    pub(crate) name: String,
    pub(crate) verified_insns: u64,
}

impl CheckKernel {
    /// Parses the report: one JSON object, every field present and typed.
    pub(crate) fn parse(stdout: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(stdout.trim())
            .context("check-kernel's output is not one JSON value")?;
        let text = |key: &str| {
            value[key]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("check-kernel's JSON has no string {key:?}"))
        };
        let kernel = text("kernel")?;
        let attach_mode = text("attach_mode")?;
        let verifier_limit = value["verifier_limit"]
            .as_u64()
            .filter(|limit| *limit > 0)
            .context("check-kernel's JSON has no positive integer \"verifier_limit\"")?;
        let programs = value["programs"]
            .as_array()
            .context("check-kernel's JSON has no array \"programs\"")?
            .iter()
            .map(|program| {
                Ok(Program {
                    name: program["name"]
                        .as_str()
                        .context("a program without a string \"name\"")?
                        .to_owned(),
                    verified_insns: program["verified_insns"]
                        .as_u64()
                        .context("a program without an integer \"verified_insns\"")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        if programs.is_empty() {
            bail!("check-kernel reported no program");
        }
        Ok(Self {
            kernel,
            attach_mode,
            programs,
            verifier_limit,
        })
    }

    /// The instruction count a program must stay below: half of the verifier's limit, so a
    /// program has room to grow, and a kernel that explores more states than the one measured
    /// still accepts it.
    pub(crate) fn budget(&self) -> u64 {
        self.verifier_limit / 2
    }

    /// The programs at or above [`Self::budget`].
    pub(crate) fn over_budget(&self) -> Vec<&Program> {
        self.programs
            .iter()
            .filter(|program| program.verified_insns >= self.budget())
            .collect()
    }

    /// What is wrong with the report for a guest running `release` that must attach in
    /// `attach_mode`.
    pub(crate) fn problem(&self, release: &str, attach_mode: &str) -> Option<String> {
        if self.kernel != release {
            return Some(format!(
                "check-kernel reports kernel {:?}, the guest runs {release:?}",
                self.kernel
            ));
        }
        if self.attach_mode != attach_mode {
            return Some(format!(
                "check-kernel picks attach mode {:?}, expected {attach_mode:?}",
                self.attach_mode
            ));
        }
        None
    }
}

/// `major.minor` of a kernel release (`5.10.0-46-amd64` → `5.10`).
pub(crate) fn major_minor(release: &str) -> &str {
    let numeric = release
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(release.len());
    let numeric = &release[..numeric];
    numeric
        .match_indices('.')
        .nth(1)
        .map_or(numeric, |(second, _)| &numeric[..second])
}

/// What is wrong with how `masq` refused a kernel too old for it: it must fail, with exactly
/// one non-empty line on stderr naming the running kernel's version and the minimum.
pub(crate) fn refusal_problem(
    status: i32,
    stderr: &str,
    release: &str,
    minimum: &str,
) -> Option<String> {
    if status == 0 {
        return Some("masq accepted a kernel it must refuse (exit status 0)".to_owned());
    }
    let lines: Vec<&str> = stderr.lines().collect();
    let [line] = lines.as_slice() else {
        return Some(format!(
            "stderr must be exactly one line, it has {}",
            lines.len()
        ));
    };
    let version = major_minor(release);
    if line.trim().is_empty() || !line.contains(version) || !line.contains(minimum) {
        return Some(format!(
            "stderr must name the kernel's {version} and the minimum {minimum}: {:?}",
            strip_ansi(line)
        ));
    }
    None
}

/// What is wrong with a libtest run's output: a failed or missing summary, no test run, or,
/// when `exact` names tests, not exactly that many passed (a renamed test must not pass
/// silently by running nothing).
pub(crate) fn libtest_problem(stdout: &str, exact: usize) -> Option<String> {
    let summaries: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("test result: "))
        .collect();
    let Some(summary) = summaries.last() else {
        return Some("no libtest summary (`test result:`) in the output".to_owned());
    };
    if !summary.starts_with("ok.") {
        return Some(match first_panic(stdout) {
            Some(panic) => format!("test result: {summary}; first panic: {panic}"),
            None => format!("test result: {summary}"),
        });
    }
    let passed: u64 = summary
        .split(';')
        .find_map(|part| {
            part.trim()
                .trim_start_matches("ok.")
                .trim()
                .strip_suffix(" passed")
        })
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0);
    if passed == 0 {
        return Some(format!("no test ran: test result: {summary}"));
    }
    if exact > 0 && passed != exact as u64 {
        return Some(format!(
            "{passed} tests passed, expected exactly {exact}: test result: {summary}"
        ));
    }
    None
}

/// The message of the first panic in a libtest output, which says why more often than the
/// last lines do: its first line and, when the message goes on (an agent's log), its last.
fn first_panic(stdout: &str) -> Option<String> {
    let mut lines = stdout.lines();
    lines.find(|line| line.contains("' panicked at ") || line.contains(") panicked at "))?;
    let message: Vec<&str> = lines
        .take_while(|line| !line.trim().is_empty() && !line.starts_with("stack backtrace:"))
        .collect();
    let first = strip_ansi(message.first()?.trim());
    Some(match message.last() {
        Some(last) if message.len() > 1 => format!("{first} … {}", strip_ansi(last.trim())),
        _ => first,
    })
}

/// `text` without ANSI escape sequences (`ESC [ ... letter`), as the agent's colored log
/// lines have them.
pub(crate) fn strip_ansi(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// One kernel of the matrix as the table shows it.
#[derive(Debug)]
pub(crate) struct Row<'a> {
    pub(crate) series: &'a str,
    /// Package, version and release.
    pub(crate) build: String,
    pub(crate) report: Result<&'a CheckKernel, String>,
}

/// The table of verified instruction counts, in Markdown: a line per program and kernel.
pub(crate) fn table(rows: &[Row<'_>]) -> String {
    let mut table = String::from(
        "| series | kernel build | attach | program | verified insns | of the limit |\n\
         |---|---|---|---|---:|---:|\n",
    );
    for row in rows {
        match &row.report {
            Ok(report) => {
                for program in &report.programs {
                    let share =
                        program.verified_insns as f64 * 100.0 / report.verifier_limit as f64;
                    let flag = if program.verified_insns >= report.budget() {
                        " (at or above half)"
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        table,
                        "| {} | {} | {} | {} | {} | {share:.1} %{flag} |",
                        row.series,
                        row.build,
                        report.attach_mode,
                        program.name,
                        program.verified_insns
                    );
                }
            }
            Err(problem) => {
                let _ = writeln!(
                    table,
                    "| {} | {} | | check-kernel failed: {} | | |",
                    row.series,
                    row.build,
                    problem.replace('|', "\\|")
                );
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"{"kernel": "6.1.0-56-amd64", "attach_mode": "tc",
        "programs": [{"name": "masq_egress", "verified_insns": 12345},
                     {"name": "masq_allocator", "verified_insns": 500000}],
        "verifier_limit": 1000000}"#;

    #[test]
    fn the_report_parses_and_half_the_limit_is_the_budget() {
        let report = CheckKernel::parse(REPORT).unwrap();
        assert_eq!(report.kernel, "6.1.0-56-amd64");
        assert_eq!(report.attach_mode, "tc");
        assert_eq!(report.budget(), 500_000);
        let over: Vec<&str> = report
            .over_budget()
            .iter()
            .map(|program| program.name.as_str())
            .collect();
        assert_eq!(over, ["masq_allocator"], "at the budget is over it");
        assert_eq!(report.problem("6.1.0-56-amd64", "tc"), None);
        assert!(report.problem("6.1.0-56-amd64", "tcx").is_some());
        assert!(report.problem("6.1.0-55-amd64", "tc").is_some());

        let under = REPORT.replace("500000", "499999");
        assert!(CheckKernel::parse(&under).unwrap().over_budget().is_empty());
    }

    #[test]
    fn malformed_reports_are_rejected() {
        for bad in [
            "",
            "not json",
            r#"{"kernel": "x", "attach_mode": "tc", "programs": [], "verifier_limit": 1000000}"#,
            r#"{"kernel": "x", "attach_mode": "tc", "programs": [{"name": "p"}], "verifier_limit": 1}"#,
            r#"{"kernel": "x", "programs": [{"name": "p", "verified_insns": 1}], "verifier_limit": 1}"#,
            r#"{"kernel": "x", "attach_mode": "tc", "programs": [{"name": "p", "verified_insns": 1}], "verifier_limit": 0}"#,
        ] {
            assert!(CheckKernel::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refusals_are_one_line_naming_both_versions() {
        let release = "5.10.0-46-amd64";
        let good = "masq needs Linux 5.11 or later; this kernel is 5.10.0-46-amd64\n";
        assert_eq!(refusal_problem(1, good, release, "5.11"), None);
        assert!(refusal_problem(0, good, release, "5.11").is_some());
        assert!(refusal_problem(1, "", release, "5.11").is_some());
        assert!(refusal_problem(1, &format!("{good}{good}"), release, "5.11").is_some());
        assert!(refusal_problem(1, "kernel too old\n", release, "5.11").is_some());
        assert!(refusal_problem(2, "error: unrecognized subcommand\n", release, "5.11").is_some());
    }

    #[test]
    fn major_minor_of_releases() {
        assert_eq!(major_minor("5.10.0-46-amd64"), "5.10");
        assert_eq!(major_minor("6.12.95+deb12-amd64"), "6.12");
        assert_eq!(major_minor("6.1"), "6.1");
    }

    #[test]
    fn libtest_summaries_must_pass_and_run_something() {
        let ok = "running 2 tests\ntest a ... ok\ntest b ... ok\n\n\
                  test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 3 filtered out; finished in 1.00s\n";
        assert_eq!(libtest_problem(ok, 0), None);
        assert_eq!(libtest_problem(ok, 2), None);
        assert!(libtest_problem(ok, 1).is_some());
        let none = "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 0.00s\n";
        assert!(libtest_problem(none, 0).is_some());
        let failed = "---- a stdout ----\n\nthread 'a' (141) panicked at tests/src/harness.rs:120:37:\n\
                      loading the datapath: refused\nstack backtrace:\n\
                      test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(
            libtest_problem(failed, 0).unwrap(),
            "test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; \
             first panic: loading the datapath: refused"
        );
        assert!(libtest_problem("thread 'main' panicked\n", 0).is_some());
    }

    #[test]
    fn a_panic_with_an_agents_log_is_summed_up_by_its_first_and_last_lines() {
        let output = "thread 't' (189) panicked at tests/src/agent.rs:204:17:\n\
                      masq agent exited with exit status: 1:\n\
                      \u{1b}[2m2026\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m serving\n\
                      \u{1b}[2m2026\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m the kernel refused program p\n\
                      \nstack backtrace:\n";
        assert_eq!(
            first_panic(output).unwrap(),
            "masq agent exited with exit status: 1: … 2026 ERROR the kernel refused program p"
        );
        assert_eq!(
            strip_ansi("\u{1b}[3mprogram\u{1b}[0m\u{1b}[2m=\u{1b}[0m"),
            "program="
        );
    }

    #[test]
    fn the_table_has_a_line_per_program_and_flags_the_budget() {
        let report = CheckKernel::parse(REPORT).unwrap();
        let rows = [
            Row {
                series: "6.1",
                build: "linux-image-6.1.0-56-amd64 6.1.192-2".to_owned(),
                report: Ok(&report),
            },
            Row {
                series: "6.12",
                build: "b".to_owned(),
                report: Err("exit status 2".to_owned()),
            },
        ];
        let table = table(&rows);
        assert_eq!(table.lines().count(), 2 + 2 + 1);
        assert!(table.contains("| masq_egress | 12345 | 1.2 % |"));
        assert!(table.contains("| masq_allocator | 500000 | 50.0 % (at or above half) |"));
        assert!(table.contains("check-kernel failed: exit status 2"));
    }
}
