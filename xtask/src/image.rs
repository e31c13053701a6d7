//! `cargo xtask image`: masq's container image, built from this repository and the build
//! machine's Debian packages alone, since no registry (and so no base image) can be assumed.
//!
//! The image starts `FROM scratch` and holds:
//!
//! * `/usr/local/bin/masq`, a release build for the musl target: statically linked, so it needs
//!   no library at all (the entrypoint);
//! * iptables 1.8 from Debian's `iptables` package, both backends: `xtables-nft-multi` and
//!   `xtables-legacy-multi` with their `iptables-{nft,legacy}[-save|-restore]` names (and the
//!   ip6tables ones), every iptables extension module (masq lists the node's POSTROUTING rules,
//!   whichever matches other agents put there, and a listing that meets an unknown extension can
//!   fail), and exactly the shared libraries `ldd` says these need, with the dynamic loader.
//!
//! There is deliberately no plain `iptables`: masq then picks `iptables-nft` or
//! `iptables-legacy` by the node's rules, as Kubernetes' iptables-wrapper does, without a shell.
//! The image is committed to the local container storage (where podman finds it) as
//! `masq:<workspace version>` and exported as a docker-archive for loading onto nodes.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::fs::symlink,
    path::{Component, Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    command::{cargo, output, run},
    setup, workspace_root,
};

/// The image's name; the manifests under deploy/ refer to it by this name (kustomize `images:`).
pub(crate) const NAME: &str = "masq";
/// The static target the binary is built for.
pub(crate) const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";
/// Where the iptables binaries live in the image, as in Debian.
const SBIN: &str = "/usr/sbin";
/// What runs in the image.
const ENTRYPOINT: &str = "/usr/local/bin/masq";
/// The commands of both iptables backends masq may run, as the `iptables` package names them.
const IPTABLES_COMMANDS: &[&str] = &[
    "iptables-nft",
    "iptables-nft-save",
    "iptables-nft-restore",
    "ip6tables-nft",
    "ip6tables-nft-save",
    "ip6tables-nft-restore",
    "iptables-legacy",
    "iptables-legacy-save",
    "iptables-legacy-restore",
    "ip6tables-legacy",
    "ip6tables-legacy-save",
    "ip6tables-legacy-restore",
];

/// The tag: the workspace version, which the manifests' `images:` entries carry too.
pub(crate) fn tag() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// `masq:<version>`.
pub(crate) fn reference() -> String {
    format!("{NAME}:{}", tag())
}

/// What was built.
pub(crate) struct Built {
    pub(crate) reference: String,
    pub(crate) archive: PathBuf,
    pub(crate) size: u64,
}

/// A name for the image private to this checkout. Checkouts on one machine share the container
/// storage and all build `masq:<version>`; the tests run this name, so they test their own
/// checkout's build even while another checkout rebuilds.
pub(crate) fn checkout_reference() -> String {
    let root = workspace_root();
    let hash = root
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("localhost/{NAME}-checkout:{hash:016x}")
}

/// Builds the image as `masq:<version>` (and as `also`, if given) and exports it.
pub(crate) fn build(also: Option<&str>) -> Result<Built> {
    setup::ensure_image_tools()?;
    let binary = build_static_masq()?;
    let out_dir = workspace_root().join("target").join("image");
    let rootfs = out_dir.join("rootfs");
    stage_rootfs(&rootfs, &binary)?;
    let size = tree_size(&rootfs)?;
    let reference = reference();
    let mut names = also.map(str::to_owned).into_iter().collect::<Vec<_>>();
    names.push(reference.clone());
    commit(&rootfs, &names)?;
    let archive = out_dir.join(format!("{NAME}-{}.tar", tag()));
    let _ = fs::remove_file(&archive);
    // Named as a node's runtime resolves the manifests' short name `masq:<tag>`
    // (docker.io/library/...), so `ctr images import` or `kind load image-archive` make it
    // available under the name the pods ask for.
    run(Command::new("buildah")
        .args(["push", "--quiet", &reference])
        .arg(format!(
            "docker-archive:{}:docker.io/library/{reference}",
            archive.display()
        )))?;
    Ok(Built {
        reference,
        archive,
        size,
    })
}

/// `cargo build --release` for the musl target; the path of the binary.
fn build_static_masq() -> Result<PathBuf> {
    let mut build = cargo();
    build
        .args(["build", "--release", "--target", MUSL_TARGET])
        .args(["--package", "masq-userspace", "--bin", "masq"])
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    let mut child = build.spawn().context("could not start cargo build")?;
    let stdout = child.stdout.take().context("cargo build has no stdout")?;
    let mut executable = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if message["reason"] == "compiler-artifact"
            && message["target"]["name"] == "masq"
            && let Some(path) = message["executable"].as_str()
        {
            executable = Some(PathBuf::from(path));
        }
    }
    if !child.wait()?.success() {
        bail!("building masq for {MUSL_TARGET} failed");
    }
    executable.context("cargo reported no masq executable")
}

/// Lays out the image's files under `rootfs`.
fn stage_rootfs(rootfs: &Path, binary: &Path) -> Result<()> {
    if rootfs.exists() {
        fs::remove_dir_all(rootfs).with_context(|| format!("clearing {}", rootfs.display()))?;
    }
    let masq = rootfs.join(ENTRYPOINT.trim_start_matches('/'));
    fs::create_dir_all(masq.parent().context("entrypoint has a directory")?)?;
    fs::copy(binary, &masq).with_context(|| format!("copying {}", binary.display()))?;
    // Symbols only serve debuggers; the image ships without them.
    run(Command::new("strip").arg("--strip-all").arg(&masq))?;
    // The image has no libc for it: a dynamic binary would not even start.
    let linked = Command::new("ldd").arg(&masq).output()?;
    let linked = String::from_utf8_lossy(&[linked.stdout, linked.stderr].concat()).into_owned();
    if !linked.contains("statically linked") && !linked.contains("not a dynamic executable") {
        bail!(
            "{} is not statically linked: {}",
            binary.display(),
            linked.trim()
        );
    }

    let mut elves = Vec::new();
    for command in IPTABLES_COMMANDS {
        let path = Path::new(SBIN).join(command);
        if fs::symlink_metadata(&path).is_err() {
            bail!(
                "{} is missing; the image takes iptables from Debian's iptables package \
                 (`apt-get install iptables`)",
                path.display()
            );
        }
        elves.push(stage_path(rootfs, &path)?);
    }
    for extension in iptables_extensions()? {
        elves.push(stage_path(rootfs, &extension)?);
    }
    elves.sort();
    elves.dedup();
    let mut libraries = Vec::new();
    for elf in &elves {
        libraries.extend(shared_libraries(elf)?);
    }
    libraries.sort();
    libraries.dedup();
    for library in &libraries {
        stage_path(rootfs, library)?;
    }
    Ok(())
}

/// Every iptables extension module of the `iptables` package (not the arptables and ebtables
/// ones, which masq never runs).
fn iptables_extensions() -> Result<Vec<PathBuf>> {
    let files = output(Command::new("dpkg").args(["--listfiles", "iptables"]))
        .context("listing the files of Debian's iptables package")?;
    let extensions: Vec<PathBuf> = files
        .lines()
        .map(Path::new)
        .filter(|path| path.parent().is_some_and(|dir| dir.ends_with("xtables")))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| {
                    ["libxt_", "libipt_", "libip6t_"]
                        .iter()
                        .any(|prefix| name.starts_with(prefix))
                        && name.ends_with(".so")
                })
        })
        .map(Path::to_path_buf)
        .collect();
    if !extensions
        .iter()
        .any(|path| path.ends_with("libxt_MASQUERADE.so"))
    {
        bail!("the iptables package lists no libxt_MASQUERADE.so; is it installed?");
    }
    Ok(extensions)
}

/// The shared libraries (and the dynamic loader) an ELF file needs, as `ldd` resolves them.
fn shared_libraries(elf: &Path) -> Result<Vec<PathBuf>> {
    let listing = output(Command::new("ldd").arg(elf))?;
    let mut libraries = Vec::new();
    for line in listing.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("{}: {line}", elf.display());
        }
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or the loader
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no file.
        let path = line.split_once("=> ").map_or(line, |(_, path)| path);
        let path = path.split(" (").next().unwrap_or_default().trim();
        if path.starts_with('/') {
            libraries.push(PathBuf::from(path));
        }
    }
    Ok(libraries)
}

/// Copies `path` into `rootfs` at the same place, recreating every symlink met on the way
/// (`/lib64` -> `usr/lib64`, `iptables-nft` -> `xtables-nft-multi`, ...) so that the path
/// resolves inside the image exactly as on this machine. Returns the real file's path here.
fn stage_path(rootfs: &Path, path: &Path) -> Result<PathBuf> {
    let mut resolved = PathBuf::from("/");
    let components: Vec<Component<'_>> = path.components().collect();
    for (index, component) in components.iter().enumerate() {
        let Component::Normal(name) = component else {
            if matches!(component, Component::ParentDir) {
                resolved.pop();
            }
            continue;
        };
        let host = resolved.join(name);
        let staged = rootfs.join(host.strip_prefix("/")?);
        let meta =
            fs::symlink_metadata(&host).with_context(|| format!("reading {}", host.display()))?;
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&host)?;
            if fs::symlink_metadata(&staged).is_err() {
                if let Some(parent) = staged.parent() {
                    fs::create_dir_all(parent)?;
                }
                symlink(&target, &staged)
                    .with_context(|| format!("linking {}", staged.display()))?;
            }
            let rest: PathBuf = components[index + 1..].iter().collect();
            let target = if target.is_absolute() {
                target
            } else {
                resolved.join(target)
            };
            return stage_path(rootfs, &target.join(rest));
        }
        if index + 1 == components.len() {
            if meta.is_dir() {
                bail!("{} is a directory, not a file", host.display());
            }
            if fs::symlink_metadata(&staged).is_err() {
                if let Some(parent) = staged.parent() {
                    fs::create_dir_all(parent)?;
                }
                fs::copy(&host, &staged).with_context(|| format!("copying {}", host.display()))?;
            }
            return Ok(host);
        }
        resolved = host;
    }
    bail!("{} names no file", path.display())
}

/// Bytes of regular files under `dir`.
fn tree_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += tree_size(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Removes a buildah working container unless it was committed.
struct WorkingContainer(String);

impl Drop for WorkingContainer {
    fn drop(&mut self) {
        let _ = Command::new("buildah")
            .args(["rm", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The ID of the image called `name`, if there is one.
fn image_id(name: &str) -> Option<String> {
    output(Command::new("buildah").args(["images", "--quiet", name]))
        .ok()
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
}

/// Commits `rootfs` as an image named `names`; the images those names had before are removed
/// when no other name and no container uses them any more.
fn commit(rootfs: &Path, names: &[String]) -> Result<()> {
    let reference = names.first().context("an image needs a name")?;
    let previous: Vec<String> = names.iter().filter_map(|name| image_id(name)).collect();
    let container = WorkingContainer(
        output(Command::new("buildah").args(["from", "--quiet", "scratch"]))?
            .trim()
            .to_owned(),
    );
    run(Command::new("buildah")
        .args(["copy", "--quiet", &container.0])
        .arg(format!("{}/", rootfs.display()))
        .arg("/"))?;
    let version_label = format!("org.opencontainers.image.version={}", tag());
    run(Command::new("buildah").args([
        "config",
        "--os",
        "linux",
        "--arch",
        "amd64",
        "--entrypoint",
        &format!("[\"{ENTRYPOINT}\"]"),
        "--cmd",
        "agent",
        "--env",
        "PATH=/usr/local/bin:/usr/sbin:/usr/bin",
        "--workingdir",
        "/",
        "--label",
        "org.opencontainers.image.title=masq",
        "--label",
        &version_label,
        "--label",
        "org.opencontainers.image.source=https://github.com/masq-project/masq",
        &container.0,
    ]))?;
    // Prints the new image's ID, which the caller has no use for.
    output(Command::new("buildah").args(["commit", "--quiet", &container.0, reference]))?;
    for name in &names[1..] {
        run(Command::new("buildah").args(["tag", reference, name]))?;
    }
    // Only images that lost their last name: another checkout's name may still be on one (and
    // `buildah rmi` would remove it regardless).
    let dangling =
        output(Command::new("buildah").args(["images", "--quiet", "--filter", "dangling=true"]))
            .unwrap_or_default();
    for stale in previous
        .iter()
        .filter(|id| dangling.lines().any(|line| line.trim() == id.as_str()))
    {
        // Fails while a container still runs it, which is fine.
        let _ = Command::new("buildah")
            .args(["rmi", stale])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    Ok(())
}
