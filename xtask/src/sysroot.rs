//! Debian packages of any architecture unpacked into one tree: the files an image or a guest of
//! that architecture takes, without installing anything foreign on the host.
//!
//! The packages (those asked for and what they depend on) come through the private apt
//! configuration of the kernel matrix, for the wanted architecture, and stay cached one build
//! per package; the tree is put together again only when a package's build changed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{
    arch::Arch,
    command::run,
    kernels::{
        self,
        apt::{self, Apt, Extracted},
        series::BOOKWORM,
    },
};

/// The unpacked packages.
#[derive(Debug)]
pub(crate) struct Sysroot {
    pub(crate) root: PathBuf,
    pub(crate) packages: Vec<Extracted>,
}

impl Sysroot {
    /// The unpacked tree of `package` alone (not merged under `/usr`).
    pub(crate) fn package(&self, package: &str) -> Result<&Extracted> {
        self.packages
            .iter()
            .find(|extracted| extracted.package == package)
            .with_context(|| format!("the sysroot {} holds no {package}", self.root.display()))
    }
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
/// `<cache>/sysroot@<arch>/<name>`.
pub(crate) fn assemble(cache: &Path, name: &str, arch: Arch, wanted: &[&str]) -> Result<Sysroot> {
    // Its own lock, not the kernels': an image build need not wait for another checkout's
    // whole kernel matrix, which never touches these packages.
    let _lock = kernels::lock_cache(cache, &format!(".lock-packages@{arch}"))?;
    let mirrors = apt::host_mirrors()?;
    let apt = Apt::prepare(cache, BOOKWORM, &mirrors, arch)?;
    if !apt.lists_are_fresh()
        && let Err(error) = apt.update()
    {
        eprintln!("xtask: {error:#}; using the {arch} package lists on disk, if any");
    }
    let closure = apt.dependency_closure(wanted).with_context(|| {
        format!(
            "resolving the dependencies of {} ({arch})",
            wanted.join(", ")
        )
    })?;
    let store = cache.join(format!("packages@{arch}"));
    let mut packages = Vec::new();
    for package in &closure {
        packages.push(apt::fetch(
            &apt,
            &store.join(package),
            package,
            &|candidate| candidate == package,
            &|_| Ok(()),
        )?);
    }
    let root = cache.join(format!("sysroot@{arch}")).join(name);
    // What the tree was made of: when a build changes, the tree is made again from scratch
    // (a newer build may have dropped files).
    let manifest: String = packages
        .iter()
        .map(|extracted| format!("{} {}\n", extracted.package, extracted.version))
        .collect();
    let stamp = root.with_extension("builds");
    if root.is_dir() && fs::read_to_string(&stamp).ok().as_deref() == Some(manifest.as_str()) {
        return Ok(Sysroot { root, packages });
    }
    eprintln!(
        "xtask: unpacking {} {arch} packages into {}",
        packages.len(),
        root.display()
    );
    let partial = root.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for extracted in &packages {
        // `cp -a` keeps each package's symlinks as the package made them.
        run(Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", extracted.root.display()))
            .arg(&partial))?;
    }
    merge_usr(&partial)?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root)
        .with_context(|| format!("moving {} to {}", partial.display(), root.display()))?;
    fs::write(&stamp, manifest).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(Sysroot { root, packages })
}
