//! One guest: the script it runs as PID 1, qemu under a deadline, and the step files it leaves.
//!
//! The guest writes, for every step, `NAME.out`, `NAME.err` and, when the step is over,
//! `NAME.status` (`exit-status start end`, in seconds of guest uptime) to the results share, so
//! the host follows progress while qemu runs and knows which step a hung guest was in.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use super::{
    GuestTools,
    caps::Capabilities,
    initramfs::{GUEST_RESULTS, RESULTS_TAG, ROOT_TAG},
    series::{Action, Series, Step},
};
use crate::{arch::Arch, command::describe};

/// How long a guest may take from qemu's start to the guest script's first line. Under TCG
/// Debian's kernels boot in 5-12 s on this kind of machine.
pub(crate) const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// What the guest adds to a step's own timeout: `timeout -k`'s grace and the files' writing.
const STEP_SLACK: Duration = Duration::from_secs(20);
/// Exit statuses of coreutils' `timeout`: the step ran out of time (and ignored SIGTERM).
const TIMED_OUT: [i32; 2] = [124, 137];

/// Quotes `word` for a POSIX shell.
pub(crate) fn quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+=:,@%".contains(&b))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn quote_path(path: &Path) -> String {
    quote(&path.to_string_lossy())
}

/// What the guest script needs to know, all as paths the guest shares with the host.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    pub(crate) series: &'static Series,
    pub(crate) workspace: &'a Path,
    pub(crate) masq: &'a Path,
    /// Test executables of masq-testbed by target name.
    pub(crate) tests: &'a BTreeMap<String, PathBuf>,
    /// The guest's programs (kmod as modprobe, capsh's shell, `PATH`).
    pub(crate) tools: &'a GuestTools,
    pub(crate) caps: Capabilities,
}

impl Plan<'_> {
    /// How long the whole guest may run before the host kills it.
    pub(crate) fn deadline(&self) -> Duration {
        BOOT_TIMEOUT
            + self
                .series
                .steps
                .iter()
                .map(|step| Duration::from_secs(step.timeout_secs) + STEP_SLACK)
                .sum::<Duration>()
    }

    /// The shell command of `step`, its outputs redirected to the results share.
    fn command(&self, step: &Step) -> Result<String> {
        let file = |suffix: &str| format!("{GUEST_RESULTS}/{}.{suffix}", step.name);
        let timeout = format!("timeout -k 10 {}", step.timeout_secs);
        Ok(match &step.action {
            // At debug level a refused program's whole verifier log goes to stderr, whose
            // last lines a failure prints; stdout holds the JSON report alone either way.
            Action::CheckKernel { .. } => self.restricted(
                &timeout,
                &["--log-level", "debug", "check-kernel", "--output", "json"],
                &file,
            ),
            Action::Refused { args, .. } => self.restricted(&timeout, args, &file),
            Action::Tests {
                binary,
                module,
                args,
                exact,
            } => {
                let executable = self.tests.get(*binary).with_context(|| {
                    format!(
                        "cargo built no test executable {binary} of masq-testbed (step {} of \
                         {})",
                        step.name, self.series.name
                    )
                })?;
                let mut words = vec![quote_path(executable)];
                words.extend(args.iter().map(|arg| quote(arg)));
                if exact.is_empty() {
                    words.push(quote(&format!("{module}::")));
                } else {
                    words.push("--exact".to_owned());
                    words.extend(exact.iter().map(|name| quote(&format!("{module}::{name}"))));
                }
                // Where cargo runs a package's tests: its own directory.
                format!(
                    "(cd {} && exec {timeout} {}) > {} 2>&1 < /dev/null",
                    quote_path(&self.workspace.join("tests")),
                    words.join(" "),
                    file("out")
                )
            }
        })
    }

    /// `masq ARGS` holding only the DaemonSet's capabilities; the shell that executes it
    /// writes its own capability lines (those masq inherits) to `NAME.caps` first.
    fn restricted(&self, timeout: &str, args: &[&str], file: &dyn Fn(&str) -> String) -> String {
        let mut words = vec![quote_path(self.masq)];
        words.extend(args.iter().map(|arg| quote(arg)));
        format!(
            "{timeout} capsh --drop=\"$drop\" --shell={} -- -c 'grep ^Cap /proc/self/status >&3; \
             exec \"$0\" \"$@\"' {} > {} 2> {} 3> {} < /dev/null",
            quote(&self.tools.capsh_shell),
            words.join(" "),
            file("out"),
            file("err"),
            file("caps")
        )
    }

    /// The script the guest runs as PID 1 after switching to the host's root.
    pub(crate) fn script(&self) -> Result<String> {
        let mut script = String::new();
        let r = GUEST_RESULTS;
        let kmod = quote_path(&self.tools.kmod);
        let workspace = quote_path(self.workspace);
        let _ = write!(
            script,
            r#"#!/bin/sh
# Generated by `cargo xtask kernels` for the {series} kernel; runs as PID 1 in the guest.
export PATH={path}
export HOME=/root LANG=C.UTF-8 RUST_BACKTRACE=1 MASQ_BIN={masq}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
# The checkout may live under /tmp or /run (CI clones anywhere): keep it visible through the
# guest's own tmpfs there.
mkdir -p /mnt/masq-workspace && mount --bind {workspace} /mnt/masq-workspace
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p {workspace} && mount --bind /mnt/masq-workspace {workspace}
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t devpts devpts /dev/pts
# modprobe from Debian's kmod, so veth, clsact, cls_bpf, nf_tables... load on demand.
for tool in modprobe depmod insmod rmmod lsmod modinfo; do
    ln -sf {kmod} /usr/sbin/$tool
done
echo /usr/sbin/modprobe > /proc/sys/kernel/modprobe
hostname masq-guest
ip link set lo up
# Every capability but the DaemonSet's ({kept}), among those this kernel knows.
last=$(cat /proc/sys/kernel/cap_last_cap)
drop=
for cap in {others}; do
    if [ "${{cap%%:*}}" -le "$last" ]; then drop="$drop${{drop:+,}}${{cap#*:}}"; fi
done
read up idle < /proc/uptime
# Whether the programs run JIT-compiled (the JIT, not the interpreter, is what differs by
# architecture), before `booted`, which the host reads it with.
cat /proc/sys/net/core/bpf_jit_enable > {r}/bpf_jit_enable
echo "$(uname -r) $up" > {r}/booted
"#,
            series = self.series.name,
            path = quote(&self.tools.path),
            masq = quote_path(self.masq),
            kept = self.caps.names().join(", "),
            others = self.caps.others().join(" "),
        );
        for step in self.series.steps {
            let name = step.name;
            let _ = write!(
                script,
                r#"
echo "masq-guest: step {name}"
read start idle < /proc/uptime
echo "$start" > {r}/{name}.start
{command}
status=$?
read end idle < /proc/uptime
echo "$status $start $end" > {r}/{name}.status
echo "masq-guest: step {name} exited with $status"
"#,
                command = self.command(step)?,
            );
        }
        let _ = write!(
            script,
            r#"
echo done > {r}/done
sync
echo o > /proc/sysrq-trigger
sleep 60
"#
        );
        Ok(script)
    }
}

/// How a step ended, as the guest recorded it.
#[derive(Clone, Debug)]
pub(crate) struct Finished {
    pub(crate) status: i32,
    pub(crate) seconds: f64,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// The `Cap*:` lines of the shell that executed masq, for restricted steps.
    pub(crate) caps: Option<String>,
}

impl Finished {
    pub(crate) fn timed_out(&self) -> bool {
        TIMED_OUT.contains(&self.status)
    }
}

/// A step's files, once its status is written.
pub(crate) fn finished(results: &Path, step: &Step) -> Option<Finished> {
    let read = |suffix: &str| fs::read_to_string(results.join(format!("{}.{suffix}", step.name)));
    let status = read("status").ok()?;
    let mut fields = status.split_whitespace();
    let code = fields.next()?.parse().ok()?;
    let start: f64 = fields.next()?.parse().ok()?;
    let end: f64 = fields.next()?.parse().ok()?;
    Some(Finished {
        status: code,
        seconds: end - start,
        stdout: read("out").unwrap_or_default(),
        stderr: read("err").unwrap_or_default(),
        caps: read("caps").ok(),
    })
}

/// Whether the guest started `step` (its start file exists).
pub(crate) fn started(results: &Path, step: &Step) -> bool {
    results.join(format!("{}.start", step.name)).is_file()
}

/// Whether the guest's BPF JIT is on (`net.core.bpf_jit_enable`), once the guest script has
/// started; `None` when it could not be read.
pub(crate) fn jit_enabled(results: &Path) -> Option<bool> {
    let text = fs::read_to_string(results.join("bpf_jit_enable")).ok()?;
    Some(text.trim().parse::<u8>().ok()? != 0)
}

/// `(release, seconds of guest uptime)` once the guest script has started.
pub(crate) fn booted(results: &Path) -> Option<(String, f64)> {
    let text = fs::read_to_string(results.join("booted")).ok()?;
    let mut fields = text.split_whitespace();
    let release = fields.next()?.to_owned();
    let uptime = fields.next()?.parse().ok()?;
    Some((release, uptime))
}

/// How the guest ended.
#[derive(Debug)]
pub(crate) enum Exit {
    /// The guest script got to its end and powered off.
    Completed,
    /// qemu exited without the script finishing (a panic, a failed init).
    Stopped(String),
    /// The host killed qemu at the deadline.
    TimedOut(Duration),
}

/// The qemu system emulator of `arch`, its machine and CPU (TCG: this machine's /dev/kvm
/// cannot run stock guests), and the guest's serial console.
fn qemu(arch: Arch) -> (&'static str, &'static [&'static str], &'static str) {
    match arch {
        Arch::Amd64 => (
            "qemu-system-x86_64",
            &["-accel", "tcg,thread=multi", "-cpu", "max"],
            "ttyS0",
        ),
        // `virt` has PCI for the 9p shares and a PL011 serial port. Debian's arm64 kernels
        // sign return addresses (pointer authentication), and the architected cipher is slow
        // to emulate; qemu's implementation-defined one is cheap and just as valid to a guest.
        Arch::Arm64 => (
            "qemu-system-aarch64",
            &[
                "-machine",
                "virt",
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                "max,pauth-impdef=on",
            ],
            "ttyAMA0",
        ),
    }
}

/// The Debian package of `arch`'s qemu.
pub(crate) fn qemu_package(arch: Arch) -> &'static str {
    match arch {
        Arch::Amd64 => "qemu-system-x86",
        Arch::Arm64 => "qemu-system-arm",
    }
}

/// Boots `vmlinuz` (of `arch`) with `initrd` and the shares, calling `poll` about twice a
/// second while qemu runs (to report progress from the results share), and kills it at
/// `deadline`.
pub(crate) fn boot(
    arch: Arch,
    vmlinuz: &Path,
    initrd: &Path,
    results: &Path,
    deadline: Duration,
    poll: &mut dyn FnMut(),
) -> Result<Exit> {
    let log = fs::File::create(results.join("qemu.log"))?;
    let (program, machine, console) = qemu(arch);
    let mut qemu = Command::new(program);
    qemu.args(machine)
        .args(["-smp", "2", "-m", "2G"])
        .args(["-nodefaults", "-no-reboot", "-display", "none"])
        .arg("-serial")
        .arg(format!(
            "file:{}",
            option_path(&results.join("console.log"))
        ))
        .arg("-kernel")
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(format!("console={console} panic=-1 loglevel=5"))
        .arg("-fsdev")
        .arg(format!(
            "local,id={ROOT_TAG},path=/,security_model=none,readonly=on,multidevs=remap"
        ))
        .arg("-device")
        .arg(format!(
            "virtio-9p-pci,fsdev={ROOT_TAG},mount_tag={ROOT_TAG}"
        ))
        .arg("-fsdev")
        .arg(format!(
            "local,id={RESULTS_TAG},path={},security_model=none,multidevs=remap",
            option_path(results)
        ))
        .arg("-device")
        .arg(format!(
            "virtio-9p-pci,fsdev={RESULTS_TAG},mount_tag={RESULTS_TAG}"
        ))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let line = describe(&qemu);
    fs::write(results.join("qemu.command"), format!("{line}\n"))?;
    let mut child = qemu
        .spawn()
        .with_context(|| format!("could not start `{line}`"))?;
    let started = Instant::now();
    loop {
        poll();
        if let Some(status) = child.try_wait()? {
            poll();
            if results.join("done").is_file() {
                return Ok(Exit::Completed);
            }
            let log = fs::read_to_string(results.join("qemu.log")).unwrap_or_default();
            return Ok(Exit::Stopped(format!(
                "qemu exited ({status}) before the guest script finished{}",
                if log.trim().is_empty() {
                    String::new()
                } else {
                    format!(": {}", log.trim())
                }
            )));
        }
        if started.elapsed() > deadline {
            child.kill().context("killing qemu")?;
            let _ = child.wait();
            poll();
            return Ok(Exit::TimedOut(deadline));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// A path inside a qemu option, where `,` separates options unless doubled.
fn option_path(path: &Path) -> String {
    path.display().to_string().replace(',', ",,")
}

/// The last `count` lines of `text`.
pub(crate) fn tail(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Fails unless qemu's system emulator for `arch` is installed.
pub(crate) fn check_qemu(arch: Arch) -> Result<()> {
    let (program, _, _) = qemu(arch);
    if crate::command::succeeds(program, &["--version"]) {
        return Ok(());
    }
    bail!(
        "{program} does not run; run `apt-get install {}`",
        qemu_package(arch)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell_only_when_needed() {
        assert_eq!(
            quote("/work/main/target/debug/masq"),
            "/work/main/target/debug/masq"
        );
        assert_eq!(quote("--test-threads"), "--test-threads");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn tails_keep_the_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
    }
}
