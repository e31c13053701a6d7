//! Making a fresh machine ready: toolchain parts, bpf-linker, Debian packages, bpffs.
//!
//! Every step checks first and acts only when something is missing, so a prepared machine pays
//! a few milliseconds. A step that cannot fix things itself stops with a message naming what is
//! missing and the command that installs it.

use std::{
    env, fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    arch::Arch,
    command::{describe, output, run, succeeds},
};

/// The toolchain the eBPF object is built with (aya-build runs `rustup run nightly cargo`).
pub(crate) const EBPF_TOOLCHAIN: &str = "nightly";
/// bpf-linker release known to work with the pinned aya set.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Debian packages the tests and the demo use.
pub(crate) const TEST_PACKAGES: &[&str] = &[
    "iproute2",          // ip, nstat, tc: namespaces, veths, routes, counters, foreign filters
    "iptables",          // the iptables backend and the MASQUERADE comparison
    "ethtool",           // toggling veth checksum offload
    "bpftool",           // inspecting pinned maps in tests and by hand
    "procps",            // sysctl
    "iputils-ping",      // ping from pods
    "wireguard-tools",   // wg: the WireGuard uplink test (in the kernel matrix's guests)
    "util-linux",        // nsenter: run the agent in a namespace without hiding bpffs
    "kubectl",           // kubectl kustomize: render the manifests under deploy/
    "iperf3",            // the benchmark's TCP stream
    "fonts-dejavu-core", // the font of the benchmark's plot
    "linux-perf",        // the benchmark's profile of the path core
];

/// Debian packages `cargo xtask image` uses: buildah assembles the image, iptables is copied
/// into it, binutils strips the binary.
const IMAGE_PACKAGES: &[&str] = &["buildah", "iptables", "binutils"];

/// Debian packages the container tests use on top of the image's: podman runs the image with
/// runc (see [`ensure_container_runtime`]).
pub(crate) const CONTAINER_PACKAGES: &[&str] = &["podman", "runc"];

/// Podman's settings for this kind of machine. Without CAP_SYS_RESOURCE podman cannot raise the
/// default file limits it applies to every container, so it must apply none.
const CONTAINERS_CONF: &str = "/etc/containers/containers.conf";
const CONTAINERS_CONF_CONTENT: &str = "\
# Written by masq's `cargo xtask`: podman must not set ulimits on machines (such as VMs and
# containers) that lack CAP_SYS_RESOURCE. Edit freely; xtask only writes this file if it is
# missing.
[containers]
default_ulimits = []
";

/// The PyPI package that validates the manifests against the Kubernetes schemas.
const MANIFEST_VALIDATOR: &str = "kubernetes-validate";

/// Installs the manifest validator unless it is there.
pub(crate) fn ensure_manifest_validator() -> Result<()> {
    if succeeds("python3", &["-m", "kubernetes_validate", "--version"]) {
        return Ok(());
    }
    eprintln!("xtask: installing {MANIFEST_VALIDATOR} from PyPI");
    run(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--root-user-action=ignore",
        MANIFEST_VALIDATOR,
    ]))
    .with_context(|| {
        format!("could not install {MANIFEST_VALIDATOR}; run `pip install {MANIFEST_VALIDATOR}`")
    })
}

/// Everything `cargo xtask build-ebpf` needs.
pub(crate) fn ensure_ebpf_toolchain() -> Result<()> {
    ensure_rust_src()?;
    ensure_bpf_linker()
}

/// Everything the tests, the demo and the benchmarks need: the toolchain, packages, bpffs, root.
pub(crate) fn ensure_privileged_environment(packages: &[&str]) -> Result<()> {
    ensure_root()?;
    ensure_ebpf_toolchain()?;
    ensure_packages(packages)?;
    ensure_bpffs()
}

/// Everything `cargo xtask image` needs for `arches`: buildah and iptables, the musl targets,
/// the cross toolchains, root.
pub(crate) fn ensure_image_tools(arches: &[Arch]) -> Result<()> {
    ensure_root()?;
    ensure_packages(IMAGE_PACKAGES)?;
    for arch in arches {
        ensure_cross_build(*arch, arch.musl_target())?;
    }
    Ok(())
}

/// The Rust target `target` of `arch`, and the cross compiler that links it when `arch` is not
/// the host's.
pub(crate) fn ensure_cross_build(arch: Arch, target: &str) -> Result<()> {
    let packages = arch.cross_packages(target);
    ensure_packages(&packages.iter().map(String::as_str).collect::<Vec<_>>())?;
    ensure_rust_target(target)
}

/// Podman (with runc) installed and configured for this machine.
pub(crate) fn ensure_container_runtime() -> Result<()> {
    ensure_packages(CONTAINER_PACKAGES)?;
    if Path::new(CONTAINERS_CONF).exists() {
        return Ok(());
    }
    eprintln!("xtask: writing {CONTAINERS_CONF} (no default ulimits)");
    fs::create_dir_all("/etc/containers").context("creating /etc/containers")?;
    fs::write(CONTAINERS_CONF, CONTAINERS_CONF_CONTENT)
        .with_context(|| format!("writing {CONTAINERS_CONF}"))
}

/// Adds the standard library for `target` to the toolchain that runs cargo, unless it is there.
fn ensure_rust_target(target: &str) -> Result<()> {
    let installed = output(Command::new("rustup").args(["target", "list", "--installed"]))
        .with_context(|| format!("rustup is needed to add the {target} target"))?;
    if installed.lines().any(|line| line.trim() == target) {
        return Ok(());
    }
    eprintln!("xtask: adding the {target} target");
    run(Command::new("rustup").args(["target", "add", target]))
        .with_context(|| format!("could not add {target}; run `rustup target add {target}`"))
}

fn ensure_root() -> Result<()> {
    // The tests create network namespaces, load eBPF programs and change sysctls; images go to
    // the system's container storage, where podman running as root finds them.
    let uid = output(Command::new("id").arg("-u"))?;
    if uid.trim() != "0" {
        bail!(
            "the tests, the demo, the benchmarks and the image build need root (network \
             namespaces, eBPF, sysctls, the system's container storage); run them as root, e.g. \
             `sudo -E cargo xtask test`"
        );
    }
    Ok(())
}

fn ensure_rust_src() -> Result<()> {
    let toolchains = output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is needed to build the eBPF object")?;
    if !toolchains
        .lines()
        .any(|line| line.starts_with(EBPF_TOOLCHAIN))
    {
        bail!(
            "the `{EBPF_TOOLCHAIN}` toolchain is missing; install it with \
             `rustup toolchain install {EBPF_TOOLCHAIN} --component rust-src`"
        );
    }
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        EBPF_TOOLCHAIN,
    ]))?;
    if installed.lines().any(|line| line.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for {EBPF_TOOLCHAIN} (needed by -Z build-std)");
    run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        EBPF_TOOLCHAIN,
    ]))
    .context(format!(
        "could not install rust-src; run `rustup component add rust-src --toolchain \
             {EBPF_TOOLCHAIN}` by hand"
    ))
}

/// The nightly toolchain's LLVM: its major version and the shared library rustc uses.
struct NightlyLlvm {
    major: u32,
    library: PathBuf,
}

fn nightly_llvm() -> Result<NightlyLlvm> {
    let version = output(Command::new("rustc").args([&format!("+{EBPF_TOOLCHAIN}"), "-vV"]))?;
    let major = version
        .lines()
        .find_map(|line| line.strip_prefix("LLVM version: "))
        .and_then(|llvm| llvm.split('.').next())
        .and_then(|major| major.trim().parse().ok())
        .context("`rustc +nightly -vV` did not report an LLVM version")?;
    let sysroot =
        output(Command::new("rustc").args([&format!("+{EBPF_TOOLCHAIN}"), "--print", "sysroot"]))?;
    let lib_dir = Path::new(sysroot.trim()).join("lib");
    // rustup ships libLLVM as `libLLVM.so.<major>.<minor>-rust-<version>` (plus an alias).
    let library = fs::read_dir(&lib_dir)
        .with_context(|| format!("reading {}", lib_dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(&format!("libLLVM.so.{major}.")))
        })
        .with_context(|| format!("no libLLVM.so.{major}.* in {}", lib_dir.display()))?;
    Ok(NightlyLlvm { major, library })
}

fn cargo_home() -> Result<PathBuf> {
    if let Some(home) = env::var_os("CARGO_HOME") {
        return Ok(PathBuf::from(home));
    }
    let home = env::var_os("HOME").context("neither CARGO_HOME nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cargo"))
}

/// bpf-linker must link the same LLVM as rustc, or it cannot read rustc's bitcode. This one is
/// built against the nightly toolchain's own libLLVM, through a prefix of symlinks that must
/// outlive the build (the binary finds libLLVM through an rpath into it).
fn ensure_bpf_linker() -> Result<()> {
    let llvm = nightly_llvm()?;
    let library_name = llvm
        .library
        .file_name()
        .and_then(|name| name.to_str())
        .context("libLLVM has a non-UTF-8 name")?
        .to_owned();
    if let Some(linker) = find_in_path("bpf-linker")
        && succeeds(&linker, &["--version"])
    {
        let linked = output(Command::new("ldd").arg(&linker)).unwrap_or_default();
        let uses_nightly_llvm = linked
            .lines()
            .any(|line| line.contains(&library_name) && !line.contains("not found"));
        if uses_nightly_llvm {
            return Ok(());
        }
        eprintln!(
            "xtask: {} does not use the nightly toolchain's {library_name}; rebuilding it",
            linker.display()
        );
    }

    let prefix = cargo_home()?.join("masq-llvm");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib)
        .with_context(|| format!("creating {}", prefix_lib.display()))?;
    for alias in ["libLLVM.so", library_name.as_str()] {
        let link = prefix_lib.join(alias);
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).with_context(|| format!("replacing {}", link.display()))?;
        }
        symlink(&llvm.library, &link).with_context(|| format!("creating {}", link.display()))?;
    }
    eprintln!(
        "xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM {} (about a minute)",
        llvm.major
    );
    let mut install = Command::new("cargo");
    install
        .args([
            "install",
            "--force",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        ])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{}", llvm.major),
        ])
        .env("LLVM_PREFIX", &prefix);
    let line = describe(&install);
    run(&mut install).with_context(|| {
        format!(
            "could not build bpf-linker; the command was `LLVM_PREFIX={} {line}`",
            prefix.display()
        )
    })?;
    if !succeeds("bpf-linker", &["--version"]) {
        bail!(
            "bpf-linker was installed but does not run; is {} on PATH?",
            cargo_home()?.join("bin").display()
        );
    }
    Ok(())
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Installs the Debian packages in `packages` that are missing.
pub(crate) fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|package| {
            let status = output(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]));
            // "unknown ok not-installed" also ends in "installed": compare the last word.
            !status.is_ok_and(|status| status.split_whitespace().last() == Some("installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    let install = || {
        let mut command = Command::new("apt-get");
        command
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing);
        run(&mut command)
    };
    if install().is_err() {
        // A fresh machine may have no package lists yet. A source that cannot be reached makes
        // `update` fail as a whole even when the Debian archive was refreshed, so its status is
        // only reported; the second install attempt decides.
        if let Err(error) = run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["update", "-qq"]))
        {
            eprintln!("xtask: {error:#}; trying the install anyway");
        }
        install().with_context(|| {
            format!(
                "could not install {}; run `apt-get install {}`",
                missing.join(", "),
                missing.join(" ")
            )
        })?;
    }
    Ok(())
}

/// Mounts bpffs on /sys/fs/bpf unless it is mounted already; pinning needs it.
fn ensure_bpffs() -> Result<()> {
    let mounts = fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    let mounted = mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let _device = fields.next();
        fields.next() == Some("/sys/fs/bpf") && fields.next() == Some("bpf")
    });
    if mounted {
        return Ok(());
    }
    eprintln!("xtask: mounting bpffs on /sys/fs/bpf");
    fs::create_dir_all("/sys/fs/bpf").context("creating /sys/fs/bpf")?;
    run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"]))
        .context("could not mount bpffs; run `mount -t bpf bpf /sys/fs/bpf`")
}
