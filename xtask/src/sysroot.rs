//! Debian packages of any architecture unpacked into one tree: the files an image or a guest of
//! that architecture takes, without installing anything foreign on the host.
//!
//! The packages (those asked for and what apt would install with them) come through the
//! private apt configuration of the kernel matrix, for the wanted architecture; their .deb
//! files stay cached, and the tree is put together again only when a package's build changed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{
    arch::Arch,
    command::{pipe, run},
    kernels::{
        self,
        apt::{self, Apt, Build},
        series::BOOKWORM,
    },
};

/// The unpacked packages.
#[derive(Debug)]
pub(crate) struct Sysroot {
    pub(crate) root: PathBuf,
    /// The builds unpacked, and the directory of their .deb files.
    builds: Vec<Build>,
    debs: PathBuf,
}

impl Sysroot {
    /// The files and symlinks of `package` alone, as absolute paths inside the tree (before
    /// `/bin`, `/sbin` and `/lib` moved under `/usr`, whose links still lead there), as
    /// `dpkg --listfiles` would list them.
    pub(crate) fn files(&self, package: &str) -> Result<Vec<PathBuf>> {
        let build = self
            .builds
            .iter()
            .find(|build| build.package == package)
            .with_context(|| format!("the sysroot {} holds no {package}", self.root.display()))?;
        let listing = pipe(
            Command::new("dpkg-deb")
                .arg("--fsys-tarfile")
                .arg(self.debs.join(build.deb_name())),
            Command::new("tar").arg("--list"),
        )?;
        Ok(paths_in(&listing))
    }
}

/// The paths of a `tar --list` of a package's files (`./usr/sbin/iptables`), directories
/// (`./usr/sbin/`) left out, as absolute paths.
fn paths_in(listing: &str) -> Vec<PathBuf> {
    listing
        .lines()
        .filter(|line| !line.ends_with('/'))
        .filter_map(|line| line.strip_prefix('.'))
        .map(PathBuf::from)
        .collect()
}

/// Moves `/bin`, `/sbin` and `/lib` under `/usr` and leaves symlinks in their place, as on
/// a Debian 12 system (whose packages still ship files in both): the tree then has one
/// directory of libraries per architecture, which a guest can point the loader's default path
/// at, and an image staged from it gets the same links as one staged from the host.
fn merge_usr(root: &Path) -> Result<()> {
    for dir in ["bin", "sbin", "lib"] {
        let top = root.join(dir);
        if fs::symlink_metadata(&top).is_ok_and(|meta| meta.is_dir()) {
            let under_usr = root.join("usr").join(dir);
            fs::create_dir_all(&under_usr)
                .with_context(|| format!("creating {}", under_usr.display()))?;
            run(Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", top.display()))
                .arg(&under_usr))?;
            fs::remove_dir_all(&top).with_context(|| format!("removing {}", top.display()))?;
            std::os::unix::fs::symlink(format!("usr/{dir}"), &top)
                .with_context(|| format!("linking {}", top.display()))?;
        }
    }
    Ok(())
}

/// Debian 12's `wanted` packages for `arch` and their dependencies, unpacked into
/// `<cache>/sysroot@<arch>/<name>`; their .deb files are kept in `<cache>/packages@<arch>`.
pub(crate) fn assemble(cache: &Path, name: &str, arch: Arch, wanted: &[&str]) -> Result<Sysroot> {
    // Its own lock, not the kernels': an image build need not wait for another checkout's
    // whole kernel matrix, which never touches these packages.
    let _lock = kernels::lock_cache(cache, &format!(".lock-packages@{arch}"))?;
    let mirrors = apt::host_mirrors()?;
    let apt = Apt::prepare(cache, BOOKWORM, &mirrors, arch)?;
    let _ = apt.refresh_if_stale();
    let builds = apt.resolve(wanted).with_context(|| {
        format!(
            "resolving the dependencies of {} ({arch})",
            wanted.join(", ")
        )
    })?;
    let debs = cache.join(format!("packages@{arch}"));
    let root = cache.join(format!("sysroot@{arch}")).join(name);
    let sysroot = Sysroot {
        root: root.clone(),
        builds,
        debs: debs.clone(),
    };
    // What the tree was made of: when a build changes, the tree is made again from scratch
    // (a newer build may have dropped files).
    let mut manifest: Vec<String> = sysroot.builds.iter().map(Build::deb_name).collect();
    manifest.sort();
    let manifest = manifest.join("\n") + "\n";
    let stamp = root.with_extension("builds");
    let unpacked = root.is_dir()
        && fs::read_to_string(&stamp).ok().as_deref() == Some(manifest.as_str())
        && sysroot
            .builds
            .iter()
            .all(|build| debs.join(build.deb_name()).is_file());
    if unpacked {
        return Ok(sysroot);
    }
    apt.download(
        sysroot
            .builds
            .iter()
            .map(|build| (&*build.package, &*build.version)),
        &debs,
    )?;
    // One build per package: older ones go (another tree's packages stay), and so do the
    // directories of extracted packages an older xtask kept here.
    for entry in fs::read_dir(&debs).with_context(|| format!("reading {}", debs.display()))? {
        let entry = entry?;
        let file = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            let _ = fs::remove_dir_all(entry.path());
        } else if sysroot.builds.iter().any(|build| {
            file.starts_with(&format!("{}_", build.package)) && file != build.deb_name()
        }) {
            let _ = fs::remove_file(entry.path());
        }
    }
    eprintln!(
        "xtask: unpacking {} {arch} packages into {}",
        sysroot.builds.len(),
        root.display()
    );
    let partial = root.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for build in &sysroot.builds {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(debs.join(build.deb_name()))
            .arg(&partial))?;
    }
    merge_usr(&partial)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root)
        .with_context(|| format!("moving {} to {}", partial.display(), root.display()))?;
    fs::write(&stamp, manifest).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(sysroot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packages_listing_is_its_files_and_links_as_absolute_paths() {
        let listing = "./\n./usr/\n./usr/sbin/\n./usr/sbin/xtables-nft-multi\n./usr/sbin/iptables\n\
                       ./usr/lib/aarch64-linux-gnu/xtables/libxt_MASQUERADE.so\n";
        assert_eq!(
            paths_in(listing),
            [
                "/usr/sbin/xtables-nft-multi",
                "/usr/sbin/iptables",
                "/usr/lib/aarch64-linux-gnu/xtables/libxt_MASQUERADE.so",
            ]
            .map(PathBuf::from)
        );
    }
}
