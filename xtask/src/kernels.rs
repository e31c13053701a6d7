//! `cargo xtask kernels`: masq's tests inside real Debian kernels, booted under qemu.
//!
//! The host runs one kernel; nodes run others. Each series of the matrix
//! ([`series::MATRIX`]) is Debian's newest build of it, fetched with a private apt
//! configuration into a cache outside the repository ([`apt`]), booted under qemu's TCG (this
//! machine's /dev/kvm cannot run stock guests) on the host's own root file system, so the test
//! executables cargo built run unchanged. Each guest runs its series' steps and writes their
//! outputs to `target/kernels/<series>/`; the host judges them, prints a line per step as it
//! ends, and a table of the instruction counts each kernel's verifier processed for masq's
//! programs (also written to `target/kernels/matrix.md`), which must stay below half of the
//! verifier's limit.
//!
//! `--arch arm64` boots Debian's arm64 kernel under qemu-system-aarch64 the same way, with
//! cross-built executables and a userland of Debian's arm64 packages ([`foreign_tools`]).

pub(crate) mod apt;
mod caps;
mod guest;
mod initramfs;
mod report;
pub(crate) mod series;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use self::{
    apt::{Apt, Extracted},
    caps::Capabilities,
    guest::{Exit, Finished, Plan},
    report::CheckKernel,
    series::{Action, BOOKWORM, KMOD, Series, Step},
};
use crate::{
    arch::Arch,
    command::{cargo, run},
    setup, workspace_root,
};

/// Debian packages of the host the matrix uses: the initramfs' shell, capsh for the
/// DaemonSet's capabilities, decompressors for modules, cpio for the initramfs, the archive
/// keyring for apt (and qemu, by the guests' architecture: [`guest::qemu_package`]).
const HOST_PACKAGES: &[&str] = &[
    "busybox-static",
    "libcap2-bin",
    "xz-utils",
    "zstd",
    "cpio",
    "debian-archive-keyring",
];

/// busybox-static's binary, the initramfs' only program.
const BUSYBOX: &str = "/bin/busybox";

/// The arm64 packages an arm64 guest's userland is made of (the host's root, which the guest
/// shares, holds x86-64 programs): busybox for the initramfs and the guest script, capsh for
/// the DaemonSet's capabilities, kmod for modprobe; with their libraries (glibc among them,
/// which the cross-built test executables need too).
const ARM64_GUEST_PACKAGES: &[&str] = &["busybox-static", "libcap2-bin", "kmod"];

/// The busybox applets the guest script and the init run by name.
const GUEST_APPLETS: &[&str] = &[
    "sh", "mount", "umount", "cat", "ln", "rm", "mkdir", "hostname", "ip", "grep", "timeout", "tr",
    "sync", "sleep", "ls", "uname",
];

/// The guest's programs: the host's for an x86-64 guest, arm64 ones from Debian's packages
/// for an arm64 guest.
#[derive(Debug)]
pub(crate) struct GuestTools {
    /// A static busybox, the initramfs' only program.
    pub(crate) busybox: PathBuf,
    /// kmod, as modprobe in the guest.
    pub(crate) kmod: PathBuf,
    /// The shell that runs the guest script after the init.
    pub(crate) shell: String,
    /// The shell capsh runs a restricted step's command with.
    pub(crate) capsh_shell: String,
    /// The guest script's `PATH`.
    pub(crate) path: String,
    /// Symlinks the init makes in the guest's root (path in the guest, target) before it
    /// hands over.
    pub(crate) links: Vec<(String, PathBuf)>,
}

/// The host's own programs, for an x86-64 guest on this x86-64 host: kmod from Debian's
/// package (the host has none installed).
fn host_tools(kmod: &Path) -> GuestTools {
    GuestTools {
        busybox: PathBuf::from(BUSYBOX),
        kmod: kmod.to_path_buf(),
        shell: "/bin/sh".to_owned(),
        capsh_shell: "/bin/bash".to_owned(),
        path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        links: Vec::new(),
    }
}

/// A foreign guest's programs from `arch`'s Debian packages unpacked into a sysroot: a
/// directory of applet links under `results` for its
/// `PATH`, and links that put the sysroot's loader and libraries where that architecture's
/// executables look for them, in the multiarch directories no x86-64 file uses.
fn foreign_tools(cache: &Path, arch: Arch, results: &Path) -> Result<GuestTools> {
    let sysroot = crate::sysroot::assemble(cache, "guest", arch, ARM64_GUEST_PACKAGES)?;
    let usr = sysroot.root.join("usr");
    let busybox = usr.join("bin/busybox");
    let bin = results.join("bin");
    fs::create_dir_all(&bin).with_context(|| format!("creating {}", bin.display()))?;
    for applet in GUEST_APPLETS {
        std::os::unix::fs::symlink(&busybox, bin.join(applet))?;
    }
    std::os::unix::fs::symlink(usr.join("sbin/capsh"), bin.join("capsh"))?;
    let triplet = arch.triplet();
    let loader = fs::read_dir(usr.join("lib"))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .find(|name| name.starts_with("ld-linux"))
        .with_context(|| format!("no dynamic loader in {}", usr.join("lib").display()))?;
    Ok(GuestTools {
        kmod: usr.join("bin/kmod"),
        // busybox picks the applet by the name it is run as.
        shell: bin.join("sh").display().to_string(),
        capsh_shell: bin.join("sh").display().to_string(),
        path: bin.display().to_string(),
        links: vec![
            (format!("/usr/lib/{triplet}"), usr.join("lib").join(triplet)),
            (format!("/usr/lib/{loader}"), usr.join("lib").join(&loader)),
            // The kernel runs /sbin/modprobe for a module from the first mount on: the host's
            // would be an x86-64 program, whose execution asks for a binfmt module, which runs
            // modprobe again, until the kernel throttles it (seconds of boot).
            ("/usr/sbin/modprobe".to_owned(), usr.join("bin/kmod")),
        ],
        busybox,
    })
}

/// The executables the guests run, built on the host.
#[derive(Debug)]
struct Binaries {
    masq: PathBuf,
    /// masq-testbed's test executables by target name.
    tests: BTreeMap<String, PathBuf>,
}

/// The executables of `build ARGS --message-format=json-render-diagnostics` (`build` being a
/// cargo command) whose artifact
/// `select` accepts, by target name.
fn built_executables(
    mut build: std::process::Command,
    args: &[&str],
    select: &dyn Fn(&serde_json::Value) -> bool,
) -> Result<BTreeMap<String, PathBuf>> {
    build
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .current_dir(workspace_root())
        .stdout(Stdio::piped());
    let line = crate::command::describe(&build);
    let mut child = build
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let stdout = child.stdout.take().context("cargo has no stdout")?;
    let mut found = BTreeMap::new();
    for text in BufReader::new(stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&text?) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || !select(&message) {
            continue;
        }
        if let (Some(name), Some(executable)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) {
            found.insert(name.to_owned(), PathBuf::from(executable));
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("`{line}` failed with {status}");
    }
    Ok(found)
}

fn build_binaries(arch: Arch) -> Result<Binaries> {
    if arch.is_host() {
        let masq = built_executables(
            cargo(),
            &["build", "--package", "masq-userspace", "--bin", "masq"],
            &|message| message["target"]["kind"] == serde_json::json!(["bin"]),
        )?
        .remove("masq")
        .context("cargo did not report the masq binary")?;
        let tests = built_executables(
            cargo(),
            &["test", "--package", "masq-testbed", "--no-run"],
            &|message| message["profile"]["test"] == true,
        )?;
        return Ok(Binaries { masq, tests });
    }
    // The image's binary, static, so it needs nothing of the guest; the datapath tests on
    // Debian's glibc of that architecture, which the guest gets from the sysroot.
    setup::ensure_cross_build(arch, arch.musl_target())?;
    let target = arch.gnu_target();
    setup::ensure_cross_build(arch, target)?;
    let masq = crate::image::build_static_masq(arch)?;
    let mut args = vec![
        "test",
        "--no-run",
        "--target",
        target,
        "--package",
        "masq-testbed",
    ];
    let binaries: BTreeSet<&str> = series::ARM64_MATRIX
        .iter()
        .flat_map(|series| series.steps)
        .filter_map(|step| match step.action {
            Action::Tests { binary, .. } => Some(binary),
            _ => None,
        })
        .collect();
    for binary in binaries {
        args.extend(["--test", binary]);
    }
    let tests = built_executables(arch.cargo(target), &args, &|message| {
        message["profile"]["test"] == true
    })?;
    Ok(Binaries { masq, tests })
}

/// A kernel build extracted in the cache.
#[derive(Debug)]
struct Kernel {
    build: Extracted,
    release: String,
    vmlinuz: PathBuf,
    modules: PathBuf,
}

impl Kernel {
    fn describe(&self) -> String {
        format!(
            "{} {} ({}, from {})",
            self.build.package, self.build.version, self.release, self.build.origin
        )
    }
}

/// The one `lib/modules/RELEASE` of an extracted kernel package.
fn modules_dir(root: &Path) -> Result<PathBuf> {
    let dir = root.join("lib/modules");
    let mut releases: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_dir())
        .collect();
    match releases.len() {
        1 => Ok(releases.remove(0)),
        count => bail!(
            "{} holds {count} kernel releases, expected one",
            dir.display()
        ),
    }
}

fn release_of(modules: &Path) -> Result<String> {
    modules
        .file_name()
        .and_then(|name| name.to_str())
        .map(str::to_owned)
        .context("a kernel release that is not UTF-8")
}

/// The newest build of `series`, extracted, with modules.dep written by kmod's depmod (Debian
/// writes it when the package is installed, which it never is here).
fn fetch_kernel(
    cache: &Path,
    mirrors: &apt::Mirrors,
    series: &Series,
    kmod: &Path,
) -> Result<Kernel> {
    let apt = Apt::prepare(cache, series.suites, mirrors, series.arch)?;
    let image = series.image;
    let depmod = |root: &Path| -> Result<()> {
        let modules = modules_dir(root)?;
        let release = release_of(&modules)?;
        run(std::process::Command::new(kmod)
            .arg0("depmod")
            .arg("-b")
            .arg(root)
            .arg(&release))
        .with_context(|| format!("depmod for {release}"))
    };
    let build = apt::fetch(
        &apt,
        &cache.join(series.name),
        image.prefix,
        &|name| image.matches(name),
        &depmod,
    )?;
    let modules = modules_dir(&build.root)?;
    let release = release_of(&modules)?;
    let vmlinuz = build.root.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.is_file() || !modules.join("modules.dep").is_file() {
        bail!(
            "{} is incomplete (no vmlinuz or modules.dep); delete it to fetch it again",
            build.root.display()
        );
    }
    Ok(Kernel {
        build,
        release,
        vmlinuz,
        modules,
    })
}

/// Debian's kmod, extracted: its binary is modprobe and depmod by the name it is run as.
fn fetch_kmod(cache: &Path, mirrors: &apt::Mirrors) -> Result<PathBuf> {
    // depmod runs on the host.
    let apt = Apt::prepare(cache, BOOKWORM, mirrors, Arch::host()?)?;
    let kmod = apt::fetch(
        &apt,
        &cache.join("kmod"),
        KMOD,
        &|name| name == KMOD,
        &|_| Ok(()),
    )?;
    let binary = ["bin/kmod", "usr/bin/kmod"]
        .iter()
        .map(|path| kmod.root.join(path))
        .find(|path| path.is_file())
        .with_context(|| format!("no bin/kmod in {}", kmod.root.display()))?;
    if !crate::command::succeeds(&binary, &["--version"]) {
        bail!(
            "{} does not run on this machine (its libraries: liblzma, libzstd, libcrypto)",
            binary.display()
        );
    }
    Ok(binary)
}

/// How one step went.
#[derive(Debug)]
struct StepOutcome {
    step: &'static Step,
    seconds: Option<f64>,
    /// `None` when the step passed.
    problem: Option<String>,
    report: Option<CheckKernel>,
}

/// How one kernel went.
#[derive(Debug)]
struct KernelOutcome {
    series: &'static Series,
    build: String,
    boot_seconds: Option<f64>,
    total_seconds: f64,
    steps: Vec<StepOutcome>,
    /// A failure outside the steps (fetching, booting, the guest's end).
    problem: Option<String>,
}

impl KernelOutcome {
    fn failed(&self) -> bool {
        self.problem.is_some() || self.steps.iter().any(|step| step.problem.is_some())
    }

    fn check_kernel(&self) -> Result<&CheckKernel, String> {
        let step = self
            .steps
            .iter()
            .find(|step| matches!(step.step.action, Action::CheckKernel { .. }));
        match step {
            Some(StepOutcome {
                report: Some(report),
                ..
            }) => Ok(report),
            Some(StepOutcome {
                problem: Some(problem),
                ..
            }) => Err(problem.lines().next().unwrap_or_default().to_owned()),
            _ => Err(self
                .problem
                .clone()
                .unwrap_or_else(|| "did not run".to_owned())),
        }
    }
}

/// Judges a finished step.
fn judge(
    step: &Step,
    finished: &Finished,
    release: &str,
    caps: Capabilities,
) -> (Option<String>, Option<CheckKernel>) {
    if finished.timed_out() {
        return (
            Some(format!(
                "timed out after {} s (exit status {})",
                step.timeout_secs, finished.status
            )),
            None,
        );
    }
    let restricted = matches!(
        step.action,
        Action::CheckKernel { .. } | Action::Refused { .. }
    );
    if restricted {
        let held = finished
            .caps
            .as_deref()
            .and_then(Capabilities::effective_in);
        if held != Some(caps) {
            return (
                Some(format!(
                    "masq did not run with exactly the DaemonSet's capabilities ({}): {}",
                    caps.names().join(", "),
                    finished
                        .caps
                        .as_deref()
                        .unwrap_or("no capability lines")
                        .trim()
                )),
                None,
            );
        }
    }
    match &step.action {
        Action::CheckKernel { attach_mode } => {
            if finished.status != 0 {
                // The debug log comes first; masq's error is the last line.
                let last = finished
                    .stderr
                    .lines()
                    .rfind(|line| !line.trim().is_empty())
                    .unwrap_or("(no stderr)");
                return (
                    Some(format!(
                        "masq check-kernel exited with {}: {last}",
                        finished.status
                    )),
                    None,
                );
            }
            match CheckKernel::parse(&finished.stdout) {
                Ok(report) => (report.problem(release, attach_mode), Some(report)),
                Err(error) => (Some(format!("{error:#}")), None),
            }
        }
        Action::Refused { minimum, .. } => (
            report::refusal_problem(finished.status, &finished.stderr, release, minimum),
            None,
        ),
        Action::Tests { exact, .. } => {
            let problem = report::libtest_problem(&finished.stdout, exact.len());
            let problem = match problem {
                Some(problem) if finished.status == 0 => Some(problem),
                Some(problem) => Some(format!("exit status {}; {problem}", finished.status)),
                None if finished.status != 0 => Some(format!("exit status {}", finished.status)),
                None => None,
            };
            (problem, None)
        }
    }
}

/// Prints what a failing step left: its output's last lines and the console's.
fn print_failure(series: &Series, step: &Step, finished: Option<&Finished>, results: &Path) {
    const LINES: usize = 30;
    if let Some(finished) = finished {
        for (stream, text) in [("stdout", &finished.stdout), ("stderr", &finished.stderr)] {
            if !text.trim().is_empty() {
                eprintln!(
                    "---- {} {}: last {LINES} lines of {stream} ({}) ----\n{}",
                    series.name,
                    step.name,
                    results
                        .join(format!(
                            "{}.{}",
                            step.name,
                            if stream == "stdout" { "out" } else { "err" }
                        ))
                        .display(),
                    guest::tail(text, LINES)
                );
            }
        }
    }
    print_console(series, results);
}

fn print_console(series: &Series, results: &Path) {
    let console = results.join("console.log");
    let text = fs::read_to_string(&console).unwrap_or_default();
    eprintln!(
        "---- {}: last 20 lines of the console ({}) ----\n{}\n----",
        series.name,
        console.display(),
        guest::tail(&text, 20)
    );
}

/// Everything a kernel's run needs from the host.
struct Host<'a> {
    cache: &'a Path,
    mirrors: &'a apt::Mirrors,
    /// The host's kmod, for depmod.
    kmod: &'a Path,
    tools: &'a GuestTools,
    binaries: &'a Binaries,
    caps: Capabilities,
    results_root: &'a Path,
}

/// Fetches, boots and judges one kernel.
fn run_series(series: &'static Series, host: &Host<'_>) -> KernelOutcome {
    let started = Instant::now();
    let mut outcome = KernelOutcome {
        series,
        build: String::new(),
        boot_seconds: None,
        total_seconds: 0.0,
        steps: Vec::new(),
        problem: None,
    };
    if let Err(error) = boot_and_judge(series, host, &mut outcome) {
        let problem = format!("{}: {error:#}", series.name);
        eprintln!("kernels: {problem}");
        outcome.problem = Some(problem);
    }
    outcome.total_seconds = started.elapsed().as_secs_f64();
    outcome
}

fn boot_and_judge(
    series: &'static Series,
    host: &Host<'_>,
    outcome: &mut KernelOutcome,
) -> Result<()> {
    eprintln!("kernels: {} ({}): fetching", series.name, series.release);
    let kernel = fetch_kernel(host.cache, host.mirrors, series, host.kmod)
        .with_context(|| format!("fetching the {} kernel", series.name))?;
    outcome.build = format!(
        "{} {} ({})",
        kernel.build.package, kernel.build.version, kernel.release
    );
    println!("kernels: {}: {}", series.name, kernel.describe());

    let results = host.results_root.join(series.name);
    let _ = fs::remove_dir_all(&results);
    fs::create_dir_all(&results).with_context(|| format!("creating {}", results.display()))?;
    let initrd = results.join("initrd.cpio");
    initramfs::write(
        &initramfs::Layout {
            modules: &kernel.modules,
            release: &kernel.release,
            links: &host.tools.links,
            shell: &host.tools.shell,
        },
        &host.tools.busybox,
        &initrd,
    )?;
    let plan = Plan {
        series,
        workspace: &workspace_root(),
        masq: &host.binaries.masq,
        tests: &host.binaries.tests,
        tools: host.tools,
        caps: host.caps,
    };
    fs::write(results.join(initramfs::GUEST_SCRIPT), plan.script()?)?;

    let boot_started = Instant::now();
    let mut release = None;
    let mut done = vec![false; series.steps.len()];
    let mut poll = || {
        if release.is_none()
            && let Some((guest_release, uptime)) = guest::booted(&results)
        {
            let seconds = boot_started.elapsed().as_secs_f64();
            let jit = match guest::jit_enabled(&results) {
                Some(true) => "BPF JIT on",
                Some(false) => "BPF JIT off: the interpreter runs the programs",
                None => "BPF JIT unknown",
            };
            println!(
                "kernels: {}: booted {guest_release} in {seconds:.1} s (guest uptime {uptime:.1} \
                 s, {jit})",
                series.name
            );
            outcome.boot_seconds = Some(seconds);
            release = Some(guest_release);
        }
        let Some(release) = &release else {
            return;
        };
        for (index, step) in series.steps.iter().enumerate() {
            if done[index] {
                continue;
            }
            let Some(finished) = guest::finished(&results, step) else {
                continue;
            };
            done[index] = true;
            let (problem, report) = judge(step, &finished, release, host.caps);
            println!(
                "kernels: {} {:<48} {} {:>7.1} s",
                series.name,
                step.name,
                if problem.is_some() { "FAIL" } else { "pass" },
                finished.seconds
            );
            if let Some(problem) = &problem {
                println!("kernels: {} {}: {problem}", series.name, step.name);
                print_failure(series, step, Some(&finished), &results);
            }
            outcome.steps.push(StepOutcome {
                step,
                seconds: Some(finished.seconds),
                problem,
                report,
            });
        }
    };
    let exit = guest::boot(
        series.arch,
        &kernel.vmlinuz,
        &initrd,
        &results,
        plan.deadline(),
        &mut poll,
    )?;
    // Steps that never finished: the one the guest was in, and those after it.
    for step in series.steps {
        if outcome
            .steps
            .iter()
            .any(|outcome| outcome.step.name == step.name)
        {
            continue;
        }
        let why = match (&exit, guest::started(&results, step)) {
            (Exit::TimedOut(deadline), true) => format!(
                "the guest was still in this step when the host killed it after {} s",
                deadline.as_secs()
            ),
            (Exit::Stopped(why), true) => format!("the guest stopped during this step: {why}"),
            (_, false) => "never started (the guest stopped before it)".to_owned(),
            (Exit::Completed, true) => "left no status".to_owned(),
        };
        println!("kernels: {} {:<48} FAIL", series.name, step.name);
        println!("kernels: {} {}: {why}", series.name, step.name);
        let finished = Finished {
            status: -1,
            seconds: 0.0,
            stdout: fs::read_to_string(results.join(format!("{}.out", step.name)))
                .unwrap_or_default(),
            stderr: fs::read_to_string(results.join(format!("{}.err", step.name)))
                .unwrap_or_default(),
            caps: None,
        };
        if guest::started(&results, step) {
            print_failure(series, step, Some(&finished), &results);
        }
        outcome.steps.push(StepOutcome {
            step,
            seconds: None,
            problem: Some(why),
            report: None,
        });
    }
    match exit {
        Exit::Completed => Ok(()),
        Exit::Stopped(why) => {
            if outcome.boot_seconds.is_none() {
                print_console(series, &results);
            }
            bail!("kernel {}: {why}", kernel.release)
        }
        Exit::TimedOut(deadline) => {
            if outcome.boot_seconds.is_none() {
                print_console(series, &results);
            }
            bail!(
                "kernel {} timed out: qemu killed after {} s{}",
                kernel.release,
                deadline.as_secs(),
                if outcome.boot_seconds.is_none() {
                    " before the guest script started"
                } else {
                    ""
                }
            )
        }
    }
}

/// The summary: a line per kernel and step, then the instruction counts; also written, as
/// Markdown, to `target/kernels/matrix.md`.
fn summarize(outcomes: &[KernelOutcome], results_root: &Path, arch: Arch) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let mut steps = String::from(
        "| series | kernel build | step | result | seconds |\n|---|---|---|---|---:|\n",
    );
    println!("\nkernels: summary");
    for outcome in outcomes {
        println!(
            "  {} {}: {} (boot {}, {:.0} s in all)",
            outcome.series.name,
            if outcome.build.is_empty() {
                "(not fetched)"
            } else {
                &outcome.build
            },
            if outcome.failed() { "FAILED" } else { "passed" },
            outcome
                .boot_seconds
                .map_or_else(|| "-".to_owned(), |seconds| format!("{seconds:.0} s")),
            outcome.total_seconds
        );
        if let Some(problem) = &outcome.problem {
            failures.push(problem.clone());
        }
        let _ = writeln!(
            steps,
            "| {} | {} | (boot) | {} | {} |",
            outcome.series.name,
            outcome.build,
            if outcome.boot_seconds.is_some() {
                "pass"
            } else {
                "FAIL"
            },
            outcome
                .boot_seconds
                .map_or_else(|| "-".to_owned(), |seconds| format!("{seconds:.1}"))
        );
        for step in &outcome.steps {
            let seconds = step
                .seconds
                .map_or_else(|| "-".to_owned(), |seconds| format!("{seconds:.1}"));
            let result = step.problem.as_deref().map_or("pass", |_| "FAIL");
            println!("    {:<48} {result} {seconds:>7} s", step.step.name);
            let _ = writeln!(
                steps,
                "| {} | {} | {} | {result}{} | {seconds} |",
                outcome.series.name,
                outcome.build,
                step.step.name,
                step.problem
                    .as_deref()
                    .map(|problem| format!(
                        ": {}",
                        problem
                            .lines()
                            .next()
                            .unwrap_or_default()
                            .replace('|', "\\|")
                    ))
                    .unwrap_or_default()
            );
            if let Some(problem) = &step.problem {
                failures.push(format!(
                    "{} {}: {}",
                    outcome.series.name,
                    step.step.name,
                    problem.lines().next().unwrap_or_default()
                ));
            }
        }
    }

    // Only kernels that must load masq run check-kernel; 5.10 refuses it.
    let checked: Vec<&KernelOutcome> = outcomes
        .iter()
        .filter(|outcome| {
            outcome
                .series
                .steps
                .iter()
                .any(|step| matches!(step.action, Action::CheckKernel { .. }))
        })
        .collect();
    let rows: Vec<report::Row<'_>> = checked
        .iter()
        .map(|outcome| report::Row {
            series: outcome.series.name,
            build: outcome.build.clone(),
            report: outcome.check_kernel(),
        })
        .collect();
    let table = report::table(&rows);
    if !rows.is_empty() {
        println!("\nkernels: instructions the verifier processed per program\n{table}");
    }
    for outcome in &checked {
        if let Ok(report) = outcome.check_kernel() {
            for program in report.over_budget() {
                failures.push(format!(
                    "{}: {} needs {} verified instructions, at or above half of the verifier's \
                     limit ({} of {})",
                    outcome.series.name,
                    program.name,
                    program.verified_insns,
                    report.budget(),
                    report.verifier_limit
                ));
            }
        }
    }
    let markdown = format!(
        "# Kernel matrix\n\nWritten by `cargo xtask kernels`. Every program must stay below half \
         of the verifier's limit on every kernel.\n\n## Verified instructions\n\n{table}\n\
         ## Steps\n\n{steps}"
    );
    // Each architecture's runs keep their own table.
    let path = results_root.join(if arch == Arch::Amd64 {
        "matrix.md".to_owned()
    } else {
        format!("matrix-{arch}.md")
    });
    fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    println!("kernels: wrote {}", path.display());
    Ok(failures)
}

/// Holds the cache's lock file `name` for this run: another run (another checkout's CI) would
/// otherwise replace a build while a guest boots it, or extract into the same place.
pub(crate) fn lock_cache(cache: &Path, name: &str) -> Result<fs::File> {
    let path = cache.join(name);
    let file = fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            eprintln!(
                "kernels: waiting for another run holding {}",
                path.display()
            );
            file.lock()
                .with_context(|| format!("locking {}", path.display()))?;
        }
        Err(fs::TryLockError::Error(error)) => {
            return Err(error).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// Runs the matrix of `arch` (the series `selection` names, or all). Without `keep_going` it
/// stops after the first kernel that fails.
pub(crate) fn run_matrix(selection: &[String], arch: Arch, keep_going: bool) -> Result<()> {
    let matrix = series::select(selection, arch)?;
    setup::ensure_privileged_environment(setup::TEST_PACKAGES)?;
    setup::ensure_packages(HOST_PACKAGES)?;
    setup::ensure_packages(&[guest::qemu_package(arch)])?;
    guest::check_qemu(arch)?;
    if !Path::new(BUSYBOX).is_file() {
        bail!("{BUSYBOX} is missing; run `apt-get install busybox-static`");
    }
    let started = Instant::now();
    let binaries = build_binaries(arch)?;
    let caps = caps::daemonset_capabilities()?;
    let cache = apt::cache_root();
    fs::create_dir_all(&cache).with_context(|| {
        format!(
            "creating the kernel cache {} (set {} to move it)",
            cache.display(),
            apt::CACHE_ENV
        )
    })?;
    let _lock = lock_cache(&cache, ".lock")?;
    let mirrors = apt::host_mirrors()?;
    let kmod = fetch_kmod(&cache, &mirrors).context("fetching Debian's kmod for the guests")?;
    let results_root = workspace_root().join("target").join("kernels");
    fs::create_dir_all(&results_root)?;
    let tools = if arch.is_host() {
        host_tools(&kmod)
    } else {
        // Outside every series' results directory, which each boot clears.
        let tools_dir = results_root.join(format!("tools-{arch}"));
        let _ = fs::remove_dir_all(&tools_dir);
        foreign_tools(&cache, arch, &tools_dir)
            .with_context(|| format!("assembling the {arch} guests' programs"))?
    };
    let host = Host {
        cache: &cache,
        mirrors: &mirrors,
        kmod: &kmod,
        tools: &tools,
        binaries: &binaries,
        caps,
        results_root: &results_root,
    };
    let mut outcomes = Vec::new();
    for (index, series) in matrix.iter().enumerate() {
        let outcome = run_series(series, &host);
        let failed = outcome.failed();
        outcomes.push(outcome);
        if failed && !keep_going && index + 1 < matrix.len() {
            eprintln!("kernels: stopping after the first failing kernel (--keep-going runs all)");
            break;
        }
    }
    let failures = summarize(&outcomes, &results_root, arch)?;
    println!(
        "kernels: {} kernels in {:.0} s",
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        bail!(
            "the kernel matrix failed:\n  {}\n(outputs in {})",
            failures.join("\n  "),
            results_root.display()
        );
    }
    Ok(())
}
