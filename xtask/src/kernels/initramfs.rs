//! The guests' initramfs: busybox, the modules that mount the host's root, and an init that
//! switches to it.
//!
//! The guest's root is the host's `/`, shared read-only over 9p with a tmpfs overlaid, so the
//! host's binaries and test executables run unchanged. Debian builds the 9p and overlay
//! drivers (and before 6.12 virtio_pci) as modules, so the initramfs carries them, in
//! dependency order, decompressed on the host: bookworm's busybox `insmod` reads 6.12's
//! `.ko.xz`, but busybox has no zstd, which newer Debian kernels compress modules with.
//!
//! The tree is staged in a directory and archived by Debian's `cpio` in the "newc" format
//! Linux unpacks, as initramfs-tools does it (`find . | cpio -o -H newc`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::{PermissionsExt as _, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::command::{describe, pipe, run};

/// The modules that mount the root, by module name.
const ROOT_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay"];

/// 9p tags of the two shares qemu exports.
pub(crate) const ROOT_TAG: &str = "hostroot";
pub(crate) const RESULTS_TAG: &str = "results";
/// Where the results share appears in the guest.
pub(crate) const GUEST_RESULTS: &str = "/masq-results";
/// The script the init hands over to, inside the results share.
pub(crate) const GUEST_SCRIPT: &str = "guest.sh";

/// A module's name from its path in modules.dep (`kernel/fs/9p/9p.ko.xz` → `9p`); `-` and `_`
/// are the same in module names.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.split(".ko").next().unwrap_or(file).replace('-', "_")
}

/// The module files (paths relative to the modules directory) to load, in order, so that
/// `wanted` are loaded: each after its dependencies, built-in ones skipped.
fn load_order(modules_dep: &str, modules_builtin: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let mut dependencies: BTreeMap<String, (String, Vec<String>)> = BTreeMap::new();
    for line in modules_dep.lines() {
        let Some((module, deps)) = line.split_once(':') else {
            continue;
        };
        let deps = deps.split_whitespace().map(str::to_owned).collect();
        dependencies.insert(module_name(module), (module.to_owned(), deps));
    }
    let builtin: BTreeSet<String> = modules_builtin.lines().map(module_name).collect();

    fn visit(
        name: &str,
        dependencies: &BTreeMap<String, (String, Vec<String>)>,
        order: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> Result<()> {
        if !seen.insert(name.to_owned()) {
            return Ok(());
        }
        let (path, deps) = dependencies
            .get(name)
            .with_context(|| format!("module {name} is not in modules.dep"))?;
        // modules.dep lists every dependency, those needed first last.
        for dep in deps.iter().rev() {
            visit(&module_name(dep), dependencies, order, seen)?;
        }
        order.push(path.clone());
        Ok(())
    }

    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for name in wanted {
        if builtin.contains(*name) {
            continue;
        }
        if !dependencies.contains_key(*name) {
            bail!("module {name} is neither built in nor in modules.dep");
        }
        visit(name, &dependencies, &mut order, &mut seen)?;
    }
    Ok(order)
}

/// A module's contents, decompressed.
fn read_module(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let decompressor = if name.ends_with(".ko.xz") {
        Some("xz")
    } else if name.ends_with(".ko.zst") {
        Some("zstd")
    } else if name.ends_with(".ko.gz") {
        Some("gzip")
    } else {
        None
    };
    let Some(decompressor) = decompressor else {
        return fs::read(path).with_context(|| format!("reading {}", path.display()));
    };
    let mut command = Command::new(decompressor);
    command.args(["-d", "-c"]).arg(path);
    let result = command
        .output()
        .with_context(|| format!("could not run `{}`", describe(&command)))?;
    if !result.status.success() {
        bail!(
            "`{}` failed: {}",
            describe(&command),
            String::from_utf8_lossy(&result.stderr).trim()
        );
    }
    Ok(result.stdout)
}

/// Paths the init needs, as the guest sees them (the same as the host's).
#[derive(Debug)]
pub(crate) struct Layout<'a> {
    /// The extracted `lib/modules/RELEASE`.
    pub(crate) modules: &'a Path,
    pub(crate) release: &'a str,
    /// Symlinks to make in the guest's root before handing over: (path, target).
    pub(crate) links: &'a [(String, PathBuf)],
    /// What runs the guest script.
    pub(crate) shell: &'a str,
}

/// The init: mount the host's root read-only over 9p, a tmpfs over it, the extracted modules
/// at /lib/modules/RELEASE and the results share, then hand over to the guest script as PID 1.
/// Any failure powers the guest off at once, and the host reports the console's last lines.
fn init_script(layout: &Layout<'_>) -> String {
    let modules = layout.modules.display();
    let release = layout.release;
    let shell = layout.shell;
    // A foreign guest's loader and libraries, where its executables look for them; what the
    // host has there (its cross binutils' files) means nothing to the guest.
    let links: String = layout
        .links
        .iter()
        .map(|(path, target)| {
            format!(
                "rm -rf /newroot{path} && ln -s {} /newroot{path} || fail \"linking {path} failed\"\n",
                target.display()
            )
        })
        .collect();
    format!(
        r#"#!/bin/sh
# Generated by `cargo xtask kernels`.
export PATH=/bin
fail() {{
    echo "masq-init: $*"
    echo o > /proc/sysrq-trigger
    sleep 60
}}
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "masq-init: loading $(ls /modules | tr '\n' ' ')"
for module in /modules/*.ko; do
    insmod "$module" || fail "insmod $module failed"
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 {ROOT_TAG} /lower \
    || fail "mounting the host's root over 9p failed"
mount -t tmpfs -o mode=0755 scratch /scratch || fail "mounting the scratch tmpfs failed"
mkdir -p /scratch/upper /scratch/work
mount -t overlay -o lowerdir=/lower,upperdir=/scratch/upper,workdir=/scratch/work overlay /newroot \
    || fail "mounting the overlay failed"
mkdir -p /newroot/lib/modules/{release} /newroot{GUEST_RESULTS}
mount -o bind /lower{modules} /newroot/lib/modules/{release} \
    || fail "binding the modules of {release} failed"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 {RESULTS_TAG} /newroot{GUEST_RESULTS} \
    || fail "mounting the results share failed"
{links}mount --move /dev /newroot/dev || fail "moving /dev failed"
umount /proc /sys
exec switch_root /newroot {shell} {GUEST_RESULTS}/{GUEST_SCRIPT}
"#
    )
}

/// Writes the initramfs for a kernel whose modules (with modules.dep) are in `layout.modules`,
/// staged in `out` with the extension `d`.
pub(crate) fn write(layout: &Layout<'_>, busybox: &Path, out: &Path) -> Result<()> {
    let read = |name: &str| {
        let path = layout.modules.join(name);
        fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let order = load_order(
        &read("modules.dep")?,
        &read("modules.builtin")?,
        ROOT_MODULES,
    )?;
    let staging = out.with_extension("d");
    let _ = fs::remove_dir_all(&staging);
    for dir in [
        "bin", "dev", "proc", "sys", "lower", "scratch", "newroot", "modules",
    ] {
        let dir = staging.join(dir);
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // The kernel opens the console before it runs /init, before devtmpfs is mounted.
    run(Command::new("mknod")
        .args(["-m", "600"])
        .arg(staging.join("dev/console"))
        .args(["c", "5", "1"]))?;
    let bin = staging.join("bin");
    fs::copy(busybox, bin.join("busybox"))
        .with_context(|| format!("copying {}", busybox.display()))?;
    for applet in [
        "sh",
        "mount",
        "umount",
        "insmod",
        "mkdir",
        "rm",
        "ln",
        "ls",
        "tr",
        "sleep",
        "switch_root",
    ] {
        symlink("busybox", bin.join(applet))
            .with_context(|| format!("linking {applet} in {}", bin.display()))?;
    }
    for (index, module) in order.iter().enumerate() {
        let contents = read_module(&layout.modules.join(module))?;
        // Numbered, so the init's glob loads them in this order.
        let path = staging.join(format!("modules/{index:02}-{}.ko", module_name(module)));
        fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    }
    let init = staging.join("init");
    fs::write(&init, init_script(layout)).with_context(|| format!("writing {}", init.display()))?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let archive = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    // Owned by root whoever stages it; `find` names each directory before what it holds.
    pipe(
        Command::new("find")
            .args([".", "-print0"])
            .current_dir(&staging),
        Command::new("cpio")
            .args(["--null", "--create", "--format=newc", "--owner=0:0"])
            .args(["--reproducible", "--quiet"])
            .current_dir(&staging)
            .stdout(archive),
    )?;
    fs::remove_dir_all(&staging).with_context(|| format!("removing {}", staging.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_after_their_dependencies_and_builtins_are_skipped() {
        let dep = "\
kernel/fs/overlayfs/overlay.ko.xz:
kernel/fs/netfs/netfs.ko.xz:
kernel/net/9p/9pnet.ko.xz:
kernel/net/9p/9pnet_virtio.ko.xz: kernel/net/9p/9pnet.ko.xz
kernel/fs/9p/9p.ko.xz: kernel/net/9p/9pnet.ko.xz kernel/fs/netfs/netfs.ko.xz
kernel/drivers/net/veth.ko.xz:
";
        let builtin = "kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio_pci.ko\n";
        let order = load_order(dep, builtin, ROOT_MODULES).unwrap();
        assert_eq!(
            order,
            [
                "kernel/net/9p/9pnet.ko.xz",
                "kernel/net/9p/9pnet_virtio.ko.xz",
                "kernel/fs/netfs/netfs.ko.xz",
                "kernel/fs/9p/9p.ko.xz",
                "kernel/fs/overlayfs/overlay.ko.xz",
            ]
        );
    }

    #[test]
    fn dependencies_listed_last_load_first() {
        // virtio_pci needs virtio_pci_modern_dev, which needs virtio_ring... as 6.1 lists them.
        let dep = "\
kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio_pci_legacy_dev.ko kernel/drivers/virtio/virtio_pci_modern_dev.ko kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio_pci_legacy_dev.ko:
kernel/drivers/virtio/virtio_pci_modern_dev.ko:
kernel/drivers/virtio/virtio_ring.ko: kernel/drivers/virtio/virtio.ko
kernel/drivers/virtio/virtio.ko:
";
        let order = load_order(dep, "", &["virtio_pci"]).unwrap();
        assert_eq!(
            order
                .iter()
                .map(|path| module_name(path))
                .collect::<Vec<_>>(),
            [
                "virtio",
                "virtio_ring",
                "virtio_pci_modern_dev",
                "virtio_pci_legacy_dev",
                "virtio_pci"
            ]
        );
    }

    #[test]
    fn a_missing_module_is_an_error() {
        assert!(load_order("kernel/a.ko:\n", "", &["overlay"]).is_err());
    }
}
