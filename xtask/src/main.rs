//! `cargo xtask`: the developer entry points of masq.
//!
//! * `build-ebpf`: installs what the eBPF build needs and builds the datapath object;
//! * `test`: prepares the machine, then runs formatting, lints and every test (as root);
//! * `demo`: a sandbox of namespaces showing what masq masquerades;
//! * `bench`: masq against iptables MASQUERADE and no NAT, side by side (`--quick`: the harness
//!   at tiny sizes, which `test` runs too; `--baseline REV`: and against masq of revision REV),
//!   the `masq-bench` crate;
//! * `image`: the container images (linux/amd64, linux/arm64) and their manifest list, from
//!   scratch, with buildah;
//! * `kernels`: the tests inside Debian's 5.10, 6.1 and 6.12 kernels under qemu (`test` runs
//!   the whole matrix too).

#![expect(clippy::print_stderr, reason = "xtask reports progress on stderr")]
#![expect(
    clippy::print_stdout,
    reason = "xtask prints results for the developer"
)]

mod arch;
mod command;
#[cfg(test)]
mod floors;
mod image;
mod kernels;
mod setup;
mod sysroot;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

use crate::{
    arch::Arch,
    command::{cargo, output, run},
};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Developer tasks for masq")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the eBPF toolchain parts if needed and build the datapath object.
    BuildEbpf,
    /// Build a sandbox of namespaces (pods, a node running masq, an outside host), send
    /// traffic, and show what was masqueraded. Needs root.
    Demo,
    /// Measure masq against iptables MASQUERADE and no NAT in one run (packets, new flows and
    /// connections per second and one TCP stream by CIDR count; the programs' own time; config
    /// apply; the agent's footprint), and write BENCHMARKS.md and benchmarks.png. Needs root
    /// and a quiet machine; takes about 15 minutes.
    Bench {
        /// Every part at tiny sizes, to check the harness works (`test` runs this); the report
        /// goes to target/bench-quick/ and its numbers mean nothing.
        #[arg(long)]
        quick: bool,
        /// Also measure the `masq` agent of this git revision (a commit, tag or branch) in
        /// every traffic test, next to masq, with the ratio between them. It is built in
        /// release from a worktree under target/bench-baseline/<commit>/ (kept for later runs;
        /// the first build takes minutes) and runs with the datapath it embeds.
        #[arg(long, value_name = "REV")]
        baseline: Option<String>,
    },
    /// Build the container images from scratch with buildah (a static masq and both iptables
    /// backends), linux/amd64 and linux/arm64, as `masq:<version>-<arch>` (the host's also as
    /// `masq:<version>`) and the manifest list `masq:<version>-multiarch` over them, store them
    /// where podman finds them, and export them to target/image/ for loading onto nodes
    /// (masq-<version>.tar is the host's, masq-<version>-arm64.tar the other,
    /// masq-<version>-multiarch.oci.tar both). Needs root.
    Image {
        /// Only this architecture (repeatable), e.g. `--arch amd64`; no manifest list unless
        /// both are built.
        #[arg(long = "arch", value_name = "ARCH")]
        arches: Vec<Arch>,
    },
    /// Boot Debian's kernels of the matrix (5.10, 6.1, 6.12; the newest build of each, cached
    /// in /var/cache/masq/kernels) under qemu and run masq's checks and tests inside each;
    /// outputs go to target/kernels/, the verifier's instruction counts to
    /// target/kernels/matrix.md. Needs root.
    Kernels {
        /// Only this series (repeatable), e.g. `--kernel 6.12`.
        #[arg(long = "kernel", value_name = "SERIES")]
        kernels: Vec<String>,
        /// Boot the remaining kernels after one failed.
        #[arg(long)]
        keep_going: bool,
        /// The architecture's series: `arm64` boots Debian's arm64 6.1 under
        /// qemu-system-aarch64 with cross-built binaries (check-kernel and the
        /// BPF_PROG_TEST_RUN tests; slow under TCG, so never part of `test`).
        #[arg(long, value_name = "ARCH", default_value = "amd64")]
        arch: Arch,
    },
    /// Prepare the machine (toolchain, packages, bpffs, podman), then check formatting and
    /// lints, validate the manifests, build the image, run every test, then the kernel matrix
    /// (see `kernels`) and the quick benchmark. Needs root.
    Test {
        /// Skip `cargo fmt --check` and clippy.
        #[arg(long)]
        no_lint: bool,
        /// Arguments passed to `cargo test` after `--` (test name filters, --nocapture, ...).
        #[arg(last = true)]
        test_args: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::BuildEbpf => build_ebpf(),
        Task::Demo => demo(),
        Task::Bench { quick, baseline } => bench(quick, baseline.as_deref()),
        Task::Image { mut arches } => {
            if arches.is_empty() {
                arches = Arch::ALL.to_vec();
            }
            arches.sort_unstable();
            arches.dedup();
            build_image(&arches, None).map(|_| ())
        }
        Task::Kernels {
            kernels,
            keep_going,
            arch,
        } => kernels::run_matrix(&kernels, arch, keep_going),
        Task::Test { no_lint, test_args } => test(no_lint, &test_args),
    }
}

fn build_ebpf() -> Result<()> {
    setup::ensure_ebpf_toolchain()?;
    let object = build_userspace_and_locate_object()?;
    let size = std::fs::metadata(&object)
        .map(|meta| meta.len())
        .unwrap_or(0);
    println!("eBPF object: {} ({size} bytes)", object.display());
    Ok(())
}

/// Builds `masq-userspace`, whose build script compiles the eBPF object, and returns the path of
/// the object it embedded.
fn build_userspace_and_locate_object() -> Result<PathBuf> {
    let mut build = cargo();
    build
        .args([
            "build",
            "--package",
            "masq-userspace",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped());
    let mut child = build.spawn().context("could not start cargo build")?;
    let stdout = child.stdout.take().context("cargo build has no stdout")?;
    let mut out_dir = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let is_ours = message["package_id"]
            .as_str()
            .is_some_and(|id| id.contains("masq-userspace"));
        if message["reason"] == "build-script-executed" && is_ours {
            out_dir = message["out_dir"].as_str().map(PathBuf::from);
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("building masq-userspace (and with it the eBPF object) failed");
    }
    let object = out_dir
        .context("cargo did not report masq-userspace's build script")?
        .join("masq-ebpf");
    if !object.is_file() {
        bail!("the eBPF object was not produced at {}", object.display());
    }
    Ok(object)
}

fn demo() -> Result<()> {
    setup::ensure_privileged_environment(setup::TEST_PACKAGES)?;
    build_masq_and_run("masq-testbed", "masq-demo", false, &[])
}

fn bench(quick: bool, baseline: Option<&str>) -> Result<()> {
    setup::ensure_privileged_environment(setup::TEST_PACKAGES)?;
    run_bench(quick, baseline)
}

/// Runs the benchmark: at full length in release, writing BENCHMARKS.md and its plot at the
/// repository's root; quick in the debug build `cargo test` made, writing to target/. With
/// `baseline`, the agent of that revision is built first and measured next to masq.
fn run_bench(quick: bool, baseline: Option<&str>) -> Result<()> {
    let root = workspace_root();
    let baseline = baseline.map(build_baseline).transpose()?;
    let output = if quick {
        let dir = root.join("target").join("bench-quick");
        std::fs::create_dir_all(&dir)?;
        dir
    } else {
        root.clone()
    };
    let mut command = "cargo xtask bench".to_owned();
    if quick {
        command.push_str(" --quick");
    }
    if let Some(baseline) = &baseline {
        command.push_str(&format!(" --baseline {}", baseline.revision));
    }
    let mut args = vec![
        "--output".to_owned(),
        output.join("BENCHMARKS.md").display().to_string(),
        "--plot".to_owned(),
        output.join("benchmarks.png").display().to_string(),
        "--command".to_owned(),
        command,
        "--revision".to_owned(),
        revision(),
    ];
    if let Some(baseline) = baseline {
        args.extend([
            "--baseline-agent".to_owned(),
            baseline.agent.display().to_string(),
            "--baseline-revision".to_owned(),
            baseline.revision,
        ]);
    }
    if quick {
        args.push("--quick".to_owned());
    }
    build_masq_and_run("masq-bench", "masq-bench", !quick, &args)
}

/// The `masq` agent of an earlier revision, for the benchmark's `--baseline`.
struct Baseline {
    /// The release binary, which embeds that revision's datapath.
    agent: PathBuf,
    /// The revision's short commit id.
    revision: String,
}

/// Builds the `masq` agent of `rev` in release: a worktree of that commit at
/// target/bench-baseline/<short commit>/src with its own target directory beside it, both
/// kept, so a later run against the same commit only checks that nothing changed.
fn build_baseline(rev: &str) -> Result<Baseline> {
    let root = workspace_root();
    let git = |args: &[&str]| -> Result<String> {
        output(Command::new("git").arg("-C").arg(&root).args(args))
            .map(|text| text.trim().to_owned())
    };
    let commit = git(&[
        "rev-parse",
        "--verify",
        "--quiet",
        "--end-of-options",
        &format!("{rev}^{{commit}}"),
    ])
    .with_context(|| format!("--baseline {rev}: not a commit of this repository"))?;
    let short = git(&["rev-parse", "--short", &commit])?;
    let dir = root.join("target").join("bench-baseline").join(&short);
    let source = dir.join("src");
    let target_dir = dir.join("target");
    worktree_at(&root, &commit, &source)?;
    eprintln!(
        "bench: building masq of {short} in {} (the first build of a revision takes minutes)",
        source.display()
    );
    run(cargo()
        .current_dir(&source)
        .args(["build", "--quiet", "--release"])
        .args(["--package", "masq-userspace", "--bin", "masq"])
        .arg("--target-dir")
        .arg(&target_dir))
    .with_context(|| format!("building masq of {short} for --baseline"))?;
    let agent = target_dir.join("release").join("masq");
    if !agent.is_file() {
        bail!("building masq of {short} left no {}", agent.display());
    }
    Ok(Baseline {
        agent,
        revision: short,
    })
}

/// Makes `path` a worktree of the repository at `root` with `commit` checked out (detached).
/// A worktree already there is reused, its files reset to `commit`; anything else at `path`
/// (a plain directory, a worktree of another repository) is removed first. A registration
/// whose directory is gone (`cargo clean`) is taken over.
fn worktree_at(root: &Path, commit: &str, path: &Path) -> Result<()> {
    let git_in = |dir: &Path, args: &[&str]| -> Result<String> {
        output(Command::new("git").arg("-C").arg(dir).args(args)).map(|text| text.trim().to_owned())
    };
    if path.exists() {
        // A directory inside this checkout answers for the checkout unless it is a worktree
        // of its own: its top level must be the directory itself, and its repository ours.
        let canonical = |path: &Path| std::fs::canonicalize(path).ok();
        let ours = git_in(path, &["rev-parse", "--show-toplevel"])
            .is_ok_and(|top| canonical(Path::new(&top)) == canonical(path))
            && git_in(path, &["rev-parse", "--git-common-dir"])
                .ok()
                .and_then(|common| canonical(&path.join(common)))
                == git_in(root, &["rev-parse", "--git-common-dir"])
                    .ok()
                    .and_then(|common| canonical(&root.join(common)));
        if ours {
            git_in(
                path,
                &["checkout", "--quiet", "--force", "--detach", commit],
            )?;
            git_in(path, &["clean", "--quiet", "--force", "-d"])?;
            return Ok(());
        }
        // Not a worktree of ours (or a broken one): a registered worktree is unregistered
        // with its directory, anything else just removed.
        let _ = git_in(
            root,
            &["worktree", "remove", "--force", &path.to_string_lossy()],
        );
        if path.exists() {
            std::fs::remove_dir_all(path)
                .with_context(|| format!("removing {}", path.display()))?;
        }
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    // --force: take over a registration whose directory was deleted.
    git_in(
        root,
        &[
            "worktree",
            "add",
            "--quiet",
            "--force",
            "--detach",
            &path.to_string_lossy(),
            commit,
        ],
    )?;
    Ok(())
}

/// The checkout's commit, and whether it has uncommitted changes.
fn revision() -> String {
    let commit = output(Command::new("git").arg("-C").arg(workspace_root()).args([
        "rev-parse",
        "--short",
        "HEAD",
    ]))
    .map(|text| text.trim().to_owned())
    .unwrap_or_else(|_| "(unknown revision)".to_owned());
    let dirty = output(Command::new("git").arg("-C").arg(workspace_root()).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]))
    .is_ok_and(|text| !text.trim().is_empty());
    if dirty {
        format!("{commit} with uncommitted changes")
    } else {
        commit
    }
}

/// Builds the `masq` binary (which the sandbox runs as the agent), then runs binary `program` of
/// `package` (the testbed's demo, the benchmark) with the same profile and `args`: it finds
/// `masq` next to itself in the target directory.
fn build_masq_and_run(package: &str, program: &str, release: bool, args: &[String]) -> Result<()> {
    let profile: &[&str] = if release { &["--release"] } else { &[] };
    run(cargo().args(["build", "--quiet"]).args(profile).args([
        "--package",
        "masq-userspace",
        "--bin",
        "masq",
    ]))?;
    run(cargo()
        .args(["run", "--quiet"])
        .args(profile)
        .args(["--package", package, "--bin", program, "--"])
        .args(args))
}

/// The repository's root (xtask lives one level below it), whatever directory cargo runs in.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn build_image(arches: &[Arch], also: Option<&str>) -> Result<()> {
    let (built, manifest) = image::build(arches, also)?;
    for image in &built {
        println!(
            "image {} (linux/{}, {:.1} MB of files), exported to {}",
            image.reference,
            image.arch,
            image.size as f64 / 1e6,
            image.archive.display()
        );
    }
    if let Some(manifest) = manifest {
        println!(
            "manifest list {} over {}, exported to {}",
            manifest.reference,
            built
                .iter()
                .map(|image| format!("linux/{}", image.arch))
                .collect::<Vec<_>>()
                .join(" and "),
            manifest.archive.display()
        );
    }
    Ok(())
}

/// The oldest Kubernetes the manifests are validated for: `securityContext.appArmorProfile`
/// exists from 1.30 on. The validator's own default, the newest it knows, is checked as well.
const OLDEST_KUBERNETES: &str = "1.30.0";

/// Every kustomization under `dir` (not components, which only render inside one).
fn kustomizations(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    let file = dir.join("kustomization.yaml");
    if file.is_file()
        && std::fs::read_to_string(&file)?
            .lines()
            .any(|line| line.trim() == "kind: Kustomization")
    {
        found.push(dir.to_path_buf());
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            kustomizations(&entry.path(), found)?;
        }
    }
    Ok(())
}

/// Renders every kustomization under deploy/ (the layouts, the uninstall job, the example
/// overlay) and validates it, and the example ConfigMaps, against the Kubernetes schemas.
fn validate_manifests() -> Result<()> {
    setup::ensure_manifest_validator()?;
    let root = workspace_root().join("deploy");
    let mut found = Vec::new();
    kustomizations(&root, &mut found)?;
    found.sort();
    let scratch = std::env::temp_dir().join(format!("masq-manifests-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let mut files = Vec::new();
    for kustomization in &found {
        let rendered = output(Command::new("kubectl").arg("kustomize").arg(kustomization))
            .with_context(|| format!("{} does not render", kustomization.display()))?;
        // Named after the kustomization, so the validator's messages say which one failed.
        let relative = kustomization.strip_prefix(&root).unwrap_or(kustomization);
        let name = format!("deploy/{}", relative.display()).replace('/', "_");
        let file = scratch.join(format!("{}.yaml", name.trim_end_matches('_')));
        std::fs::write(&file, rendered)?;
        files.push(file);
    }
    for entry in std::fs::read_dir(root.join("examples"))? {
        let path = entry?.path();
        if path
            .extension()
            .is_some_and(|extension| extension == "yaml")
        {
            files.push(path);
        }
    }
    let validated = [Some(OLDEST_KUBERNETES), None]
        .into_iter()
        .try_for_each(|version| {
            let mut validate = Command::new("python3");
            validate.args(["-m", "kubernetes_validate", "--strict", "--quiet"]);
            if let Some(version) = version {
                validate.args(["--kubernetes-version", version]);
            }
            run(validate.args(&files)).with_context(|| {
                format!(
                    "the manifests do not validate against Kubernetes {}",
                    version.unwrap_or("(the newest the validator knows)")
                )
            })
        });
    let _ = std::fs::remove_dir_all(&scratch);
    validated?;
    println!(
        "{} kustomizations under deploy/ render, and they and the examples validate",
        found.len()
    );
    Ok(())
}

fn test(no_lint: bool, test_args: &[String]) -> Result<()> {
    setup::ensure_privileged_environment(setup::TEST_PACKAGES)?;
    setup::ensure_container_runtime()?;
    if !no_lint {
        run(cargo().args(["fmt", "--all", "--", "--check"]))
            .context("formatting differs; run `cargo fmt --all`")?;
        run(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    validate_manifests()?;
    // The container tests run this image under podman, by this checkout's own name for it.
    // Only the host's architecture: podman runs nothing else here, and cross-building arm64's
    // would add minutes to every run for an image no test starts.
    let image = image::checkout_reference();
    build_image(&[Arch::host()?], Some(&image))?;
    let mut tests = cargo();
    tests
        .args(["test", "--workspace"])
        .env("MASQ_TEST_IMAGE", &image);
    if !test_args.is_empty() {
        tests.arg("--").args(test_args);
    }
    run(&mut tests)?;
    // The same tests inside the other kernels masq supports (and the refusal of an older one).
    // Every kernel runs even after one failed, so one run reports the whole matrix.
    if test_args.is_empty() {
        kernels::run_matrix(&[], Arch::Amd64, true).context("the kernel matrix failed")?;
    }
    // The benchmark harness at tiny sizes, so it never rots (it checks that every part runs,
    // never a timing). Skipped when the tests were filtered.
    if test_args.is_empty() {
        run_bench(true, None).context("the quick benchmark failed")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `git ARGS` in `dir` with a fixed identity, its output trimmed.
    fn git(dir: &Path, args: &[&str]) -> Result<String> {
        output(
            Command::new("git")
                .arg("-C")
                .arg(dir)
                .args(["-c", "user.name=xtask", "-c", "user.email=xtask@localhost"])
                .args(args),
        )
        .map(|text| text.trim().to_owned())
    }

    /// The baseline's worktree is created at the commit, reused (reset to the commit) on the
    /// next run, moved to another commit, recreated after its directory was deleted while
    /// still registered, and replaces a plain directory in its way.
    #[test]
    fn baseline_worktree_is_created_reused_and_replaced() -> Result<()> {
        let scratch = std::env::temp_dir().join(format!("xtask-worktree-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let repo = scratch.join("repo");
        std::fs::create_dir_all(&repo)?;
        git(&repo, &["init", "--quiet"])?;
        std::fs::write(repo.join("file"), "one")?;
        git(&repo, &["add", "file"])?;
        git(&repo, &["commit", "--quiet", "-m", "one"])?;
        let first = git(&repo, &["rev-parse", "HEAD"])?;
        std::fs::write(repo.join("file"), "two")?;
        git(&repo, &["commit", "--quiet", "-am", "two"])?;
        let second = git(&repo, &["rev-parse", "HEAD"])?;
        let path = scratch.join("baseline").join("src");
        let head = |path: &Path| git(path, &["rev-parse", "HEAD"]);

        worktree_at(&repo, &first, &path)?;
        assert_eq!(head(&path)?, first);
        assert_eq!(std::fs::read_to_string(path.join("file"))?, "one");

        // Reused: local changes and stray files are undone, ignored build output would stay.
        std::fs::write(path.join("file"), "changed")?;
        std::fs::write(path.join("stray"), "")?;
        worktree_at(&repo, &first, &path)?;
        assert_eq!(head(&path)?, first);
        assert_eq!(std::fs::read_to_string(path.join("file"))?, "one");
        assert!(!path.join("stray").exists());

        worktree_at(&repo, &second, &path)?;
        assert_eq!(std::fs::read_to_string(path.join("file"))?, "two");

        // Deleted behind git's back, still registered.
        std::fs::remove_dir_all(&path)?;
        worktree_at(&repo, &first, &path)?;
        assert_eq!(head(&path)?, first);

        // Something else in the way.
        git(
            &repo,
            &["worktree", "remove", "--force", &path.to_string_lossy()],
        )?;
        std::fs::create_dir_all(&path)?;
        std::fs::write(path.join("other"), "")?;
        worktree_at(&repo, &second, &path)?;
        assert_eq!(head(&path)?, second);
        assert!(!path.join("other").exists());

        let worktrees = git(&repo, &["worktree", "list", "--porcelain"])?;
        assert_eq!(worktrees.matches("worktree ").count(), 2, "{worktrees}");
        std::fs::remove_dir_all(&scratch)?;
        Ok(())
    }
}
