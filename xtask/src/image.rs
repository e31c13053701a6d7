//! `cargo xtask image`: masq's container images, built from this repository and Debian's
//! packages alone, since no registry (and so no base image) can be assumed.
//!
//! Each image (linux/amd64, linux/arm64) starts `FROM scratch` and holds:
//!
//! * `/usr/local/bin/masq`, a release build for the architecture's musl target: statically
//!   linked, so it needs no library at all (the entrypoint); arm64's is cross-built with
//!   Debian's cross gcc as the linker;
//! * iptables 1.8 from Debian's `iptables` package of that architecture, both backends:
//!   `xtables-nft-multi` and `xtables-legacy-multi` with their `iptables-{nft,legacy}[-save|
//!   -restore]` names (and the ip6tables ones), every iptables extension module (masq lists the
//!   node's POSTROUTING rules, whichever matches other agents put there, and a listing that
//!   meets an unknown extension can fail), and exactly the shared libraries these ask for
//!   (`DT_NEEDED`, recursively, read from the files without running them), with the dynamic
//!   loader. The host's architecture takes the host's installed package; another takes
//!   Debian's packages of that architecture, unpacked into a sysroot ([`crate::sysroot`]).
//!
//! There is deliberately no plain `iptables`: masq then picks `iptables-nft` or
//! `iptables-legacy` by the node's rules, as Kubernetes' iptables-wrapper does, without a shell.
//! Each image is committed to the local container storage (where podman finds it) as
//! `masq:<workspace version>-<arch>`, the host's also as `masq:<workspace version>`, and
//! exported as a docker-archive for loading onto nodes; with both architectures, the manifest
//! list `masq:<workspace version>-multiarch` names them together.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    os::unix::fs::symlink,
    path::{Component, Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    arch::Arch,
    command::{output, run},
    kernels::apt,
    setup, sysroot, workspace_root,
};

/// The image's name; the manifests under deploy/ refer to it by this name (kustomize `images:`).
pub(crate) const NAME: &str = "masq";
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

/// What was built for one architecture.
pub(crate) struct Built {
    pub(crate) arch: Arch,
    pub(crate) reference: String,
    pub(crate) archive: PathBuf,
    pub(crate) size: u64,
}

/// The multi-architecture manifest list over the images of one build.
pub(crate) struct Manifest {
    pub(crate) reference: String,
    pub(crate) archive: PathBuf,
}

/// `masq:<version>-<arch>`: one architecture's image. The host's is also `masq:<version>`.
pub(crate) fn arch_reference(arch: Arch) -> String {
    format!("{}-{arch}", reference())
}

/// `masq:<version>-multiarch`: the manifest list. A manifest list and an image cannot share a
/// name in the local storage, and `masq:<version>` stays the host's image, which podman and the
/// container tests run.
pub(crate) fn manifest_reference() -> String {
    format!("{}-multiarch", reference())
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

/// Builds the image of each of `arches` as `masq:<version>-<arch>`, the host's also as
/// `masq:<version>` (and as `also`, if given), exports each, and with more than one
/// architecture makes the manifest list over them.
pub(crate) fn build(arches: &[Arch], also: Option<&str>) -> Result<(Vec<Built>, Option<Manifest>)> {
    setup::ensure_image_tools(arches)?;
    let host = Arch::host()?;
    let out_dir = workspace_root().join("target").join("image");
    let mut built = Vec::new();
    for &arch in arches {
        let source = Source::for_arch(arch)?;
        let binary = build_static_masq(arch)?;
        let rootfs = out_dir.join(arch.debian()).join("rootfs");
        stage_rootfs(&rootfs, &binary, &source)?;
        let size = tree_size(&rootfs)?;
        let mut names = vec![arch_reference(arch)];
        if arch == host {
            names.push(reference());
            names.extend(also.map(str::to_owned));
        }
        commit(&rootfs, &names, arch)?;
        // The host's keeps the name it always had; nodes load whichever is theirs.
        let archive = if arch == host {
            out_dir.join(format!("{NAME}-{}.tar", tag()))
        } else {
            out_dir.join(format!("{NAME}-{}-{arch}.tar", tag()))
        };
        let _ = fs::remove_file(&archive);
        // Named as a node's runtime resolves the manifests' short name `masq:<tag>`
        // (docker.io/library/...), so `ctr images import` or `kind load image-archive` make it
        // available under the name the pods ask for, on a node of either architecture.
        run(Command::new("buildah")
            .args(["push", "--quiet", &names[0]])
            .arg(format!(
                "docker-archive:{}:docker.io/library/{}",
                archive.display(),
                reference()
            )))?;
        built.push(Built {
            arch,
            reference: names[0].clone(),
            archive,
            size,
        });
    }
    let manifest = if built.len() > 1 {
        Some(manifest_list(&built, &out_dir)?)
    } else {
        None
    };
    Ok((built, manifest))
}

/// The manifest list over `built`, in the local storage and as an OCI archive holding every
/// architecture (which `buildah manifest push --all` or `skopeo copy --all` sends to a
/// registry, and `ctr images import --all-platforms` loads).
fn manifest_list(built: &[Built], out_dir: &Path) -> Result<Manifest> {
    let list = manifest_reference();
    // A list made earlier points at the images of that build: it is made anew.
    if output(Command::new("buildah").args(["manifest", "exists", &list])).is_ok() {
        // Prints what it removed, which the caller has no use for.
        output(Command::new("buildah").args(["manifest", "rm", &list]))?;
    }
    output(Command::new("buildah").args(["manifest", "create", &list]))?;
    for image in built {
        output(Command::new("buildah").args([
            "manifest",
            "add",
            "--os",
            "linux",
            "--arch",
            image.arch.debian(),
            &list,
            &format!("containers-storage:{}", qualified(&image.reference)),
        ]))?;
    }
    let listed = output(Command::new("buildah").args(["manifest", "inspect", &list]))?;
    let listed: serde_json::Value = serde_json::from_str(&listed)
        .with_context(|| format!("`buildah manifest inspect {list}` is not JSON"))?;
    let mut platforms: Vec<&str> = listed["manifests"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .filter_map(|entry| entry["platform"]["architecture"].as_str())
                .collect()
        })
        .unwrap_or_default();
    platforms.sort_unstable();
    let mut expected: Vec<&str> = built.iter().map(|image| image.arch.debian()).collect();
    expected.sort_unstable();
    if platforms != expected {
        bail!("the manifest list {list} holds {platforms:?}, not {expected:?}");
    }
    let archive = out_dir.join(format!("{NAME}-{}-multiarch.oci.tar", tag()));
    let _ = fs::remove_file(&archive);
    run(Command::new("buildah")
        .args(["manifest", "push", "--all", "--quiet", &list])
        .arg(format!(
            "oci-archive:{}:docker.io/library/{}",
            archive.display(),
            reference()
        )))?;
    Ok(Manifest {
        reference: list,
        archive,
    })
}

/// A short name as the local storage stores it.
fn qualified(name: &str) -> String {
    match name.split_once('/') {
        Some((registry, _)) if registry.contains(['.', ':']) || registry == "localhost" => {
            name.to_owned()
        }
        _ => format!("localhost/{name}"),
    }
}

/// Where one architecture's iptables and libraries come from: the host's own installed
/// packages for its architecture; Debian's packages of the other, unpacked into a sysroot.
struct Source {
    arch: Arch,
    /// The tree the image's paths are looked up in: `/`, or the sysroot.
    root: PathBuf,
    /// The iptables package's files, as paths inside `root`.
    iptables_files: Vec<PathBuf>,
}

impl Source {
    fn for_arch(arch: Arch) -> Result<Self> {
        if arch.is_host() {
            let files = output(Command::new("dpkg").args(["--listfiles", "iptables"]))
                .context("listing the files of Debian's iptables package")?;
            return Ok(Self {
                arch,
                root: PathBuf::from("/"),
                iptables_files: files.lines().map(PathBuf::from).collect(),
            });
        }
        let cache = apt::cache_root();
        fs::create_dir_all(&cache)
            .with_context(|| format!("creating the package cache {}", cache.display()))?;
        let sysroot = sysroot::assemble(&cache, "image", arch, &["iptables"])?;
        Ok(Self {
            arch,
            iptables_files: sysroot.files("iptables")?,
            root: sysroot.root,
        })
    }

    /// The path of `path` (absolute, as inside the image) on this machine.
    fn host_path(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
}

/// `cargo build --release` for `arch`'s musl target; the path of the binary.
pub(crate) fn build_static_masq(arch: Arch) -> Result<PathBuf> {
    let target = arch.musl_target();
    let mut build = arch.cargo(target);
    build
        .args(["build", "--release", "--target", target])
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
        bail!("building masq for {target} failed");
    }
    executable.context("cargo reported no masq executable")
}

/// Lays out the image's files under `rootfs`.
fn stage_rootfs(rootfs: &Path, binary: &Path, source: &Source) -> Result<()> {
    if rootfs.exists() {
        fs::remove_dir_all(rootfs).with_context(|| format!("clearing {}", rootfs.display()))?;
    }
    let masq = rootfs.join(ENTRYPOINT.trim_start_matches('/'));
    fs::create_dir_all(masq.parent().context("entrypoint has a directory")?)?;
    fs::copy(binary, &masq).with_context(|| format!("copying {}", binary.display()))?;
    // Symbols only serve debuggers; the image ships without them.
    run(Command::new(source.arch.tool("strip"))
        .arg("--strip-all")
        .arg(&masq))?;
    // The image has no libc for it: a dynamic binary would not even start.
    let linked = dynamic_linking(&masq)?;
    if linked.interpreter.is_some() || !linked.needed.is_empty() {
        bail!(
            "{} is not statically linked: it asks for {:?} and {:?}",
            binary.display(),
            linked.interpreter,
            linked.needed
        );
    }

    let mut elves = Vec::new();
    for command in IPTABLES_COMMANDS {
        let path = Path::new(SBIN).join(command);
        if fs::symlink_metadata(source.host_path(&path)).is_err() {
            bail!(
                "{} is missing; the image takes iptables from Debian's iptables package \
                 (`apt-get install iptables`)",
                source.host_path(&path).display()
            );
        }
        elves.push(stage_path(rootfs, &source.root, &path)?);
    }
    for extension in iptables_extensions(&source.iptables_files)? {
        elves.push(stage_path(rootfs, &source.root, &extension)?);
    }
    elves.sort();
    elves.dedup();
    let mut libraries = Vec::new();
    for elf in &elves {
        shared_libraries(source, elf, &mut libraries)?;
    }
    libraries.sort();
    libraries.dedup();
    for library in &libraries {
        stage_path(rootfs, &source.root, library)?;
    }
    Ok(())
}

/// Every iptables extension module among the `iptables` package's `files` (not the arptables
/// and ebtables ones, which masq never runs).
fn iptables_extensions(files: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let extensions: Vec<PathBuf> = files
        .iter()
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
        .cloned()
        .collect();
    if !extensions
        .iter()
        .any(|path| path.ends_with("libxt_MASQUERADE.so"))
    {
        bail!("the iptables package lists no libxt_MASQUERADE.so; is it installed?");
    }
    Ok(extensions)
}

/// What an ELF file asks the dynamic loader for.
#[derive(Debug, Default, PartialEq, Eq)]
struct DynamicLinking {
    /// `PT_INTERP`: the loader's path.
    interpreter: Option<String>,
    /// `DT_NEEDED`: library names.
    needed: Vec<String>,
    /// `DT_RUNPATH` and `DT_RPATH` directories.
    search: Vec<String>,
}

/// Reads `elf`'s program headers and dynamic section with `readelf`, which reads any
/// architecture's ELF files (`ldd` would run the loader, which only the host's can).
fn dynamic_linking(elf: &Path) -> Result<DynamicLinking> {
    let text = output(
        Command::new("readelf")
            .args(["--wide", "--program-headers", "--dynamic"])
            .arg(elf),
    )
    .with_context(|| format!("reading the ELF headers of {}", elf.display()))?;
    Ok(parse_readelf(&text))
}

fn parse_readelf(text: &str) -> DynamicLinking {
    let bracketed = |line: &str| {
        let (_, rest) = line.split_once('[')?;
        rest.rsplit_once(']').map(|(inside, _)| inside.to_owned())
    };
    let mut linking = DynamicLinking::default();
    for line in text.lines() {
        if line.contains("Requesting program interpreter:") {
            linking.interpreter = line
                .split_once("interpreter: ")
                .and_then(|(_, rest)| rest.strip_suffix(']'))
                .map(str::to_owned);
        } else if line.contains("(NEEDED)") {
            linking.needed.extend(bracketed(line));
        } else if line.contains("(RUNPATH)") || line.contains("(RPATH)") {
            linking.search.extend(
                bracketed(line)
                    .iter()
                    .flat_map(|dirs| dirs.split(':').map(str::to_owned)),
            );
        }
    }
    linking
}

/// Adds to `found` the loader and the shared libraries `elf` (a path inside `source`) needs,
/// recursively, found as Debian's loader finds them: the ELF file's own search path, then
/// the multiarch directories, then /lib and /usr/lib.
fn shared_libraries(source: &Source, elf: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    let linking = dynamic_linking(&source.host_path(elf))?;
    if let Some(interpreter) = &linking.interpreter {
        let interpreter = PathBuf::from(interpreter);
        if !found.contains(&interpreter) {
            found.push(interpreter);
        }
    }
    let triplet = source.arch.triplet();
    let directories: Vec<String> = linking
        .search
        .iter()
        .filter(|dir| dir.starts_with('/'))
        .cloned()
        .chain([
            format!("/lib/{triplet}"),
            format!("/usr/lib/{triplet}"),
            "/lib".to_owned(),
            "/usr/lib".to_owned(),
        ])
        .collect();
    for name in &linking.needed {
        let library = directories
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|path| source.host_path(path).exists())
            .with_context(|| {
                format!(
                    "{} needs {name}, which is in none of {} under {}",
                    elf.display(),
                    directories.join(", "),
                    source.root.display()
                )
            })?;
        if !found.contains(&library) {
            found.push(library.clone());
            shared_libraries(source, &library, found)?;
        }
    }
    Ok(())
}

/// Copies `path` (absolute, as inside the image) from the tree `source` into `rootfs` at the
/// same place, recreating every symlink met on the way (`/lib64` -> `usr/lib64`,
/// `iptables-nft` -> `xtables-nft-multi`, ...) so that the path resolves inside the image
/// exactly as in `source`. Returns the real file's path, as inside the image.
fn stage_path(rootfs: &Path, source: &Path, path: &Path) -> Result<PathBuf> {
    let mut resolved = PathBuf::from("/");
    let components: Vec<Component<'_>> = path.components().collect();
    for (index, component) in components.iter().enumerate() {
        let Component::Normal(name) = component else {
            if matches!(component, Component::ParentDir) {
                resolved.pop();
            }
            continue;
        };
        let inside = resolved.join(name);
        let relative = inside.strip_prefix("/")?;
        let host = source.join(relative);
        let staged = rootfs.join(relative);
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
            // An absolute target means the same inside the image as inside `source`.
            let target = if target.is_absolute() {
                target
            } else {
                resolved.join(target)
            };
            return stage_path(rootfs, source, &target.join(rest));
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
            return Ok(inside);
        }
        resolved = inside;
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

/// Commits `rootfs` as `arch`'s image named `names`; the images those names had before are removed
/// when no other name and no container uses them any more.
fn commit(rootfs: &Path, names: &[String], arch: Arch) -> Result<()> {
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
        arch.debian(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readelf_gives_the_loader_the_libraries_and_the_search_path() {
        let text = "\
Program Headers:
  Type           Offset   VirtAddr           PhysAddr           FileSiz  MemSiz   Flg Align
  INTERP         0x000238 0x0000000000000238 0x0000000000000238 0x00001b 0x00001b R   0x1
      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]

Dynamic section at offset 0x1fd18 contains 29 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libxtables.so.12]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000001d (RUNPATH)            Library runpath: [/usr/lib/a:/usr/lib/b]
 0x000000000000000e (SONAME)             Library soname: [libfoo.so.1]
";
        assert_eq!(
            parse_readelf(text),
            DynamicLinking {
                interpreter: Some("/lib/ld-linux-aarch64.so.1".to_owned()),
                needed: vec!["libxtables.so.12".to_owned(), "libc.so.6".to_owned()],
                search: vec!["/usr/lib/a".to_owned(), "/usr/lib/b".to_owned()],
            }
        );
        assert_eq!(qualified("masq:0.1.0-amd64"), "localhost/masq:0.1.0-amd64");
        assert_eq!(qualified("localhost/masq:1"), "localhost/masq:1");
        assert_eq!(
            qualified("registry.example.com/masq:1"),
            "registry.example.com/masq:1"
        );
        // A static binary: no loader, no libraries.
        assert_eq!(
            parse_readelf("\nThere is no dynamic section in this file.\n"),
            DynamicLinking::default()
        );
    }
}
