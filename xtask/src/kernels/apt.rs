//! Debian packages fetched by apt itself through a private configuration into a cache outside
//! the repository, never installed.
//!
//! The cache root is `/var/cache/masq/kernels`, or the directory `MASQ_KERNEL_CACHE` names.
//! Each set of suites and architecture has its own `sources.list`, package lists and apt cache
//! under it, so the host's apt state is never written, and read only for the mirror its sources
//! name: not its lists, not its dpkg status, not its `apt.conf.d` (whose hooks, on this
//! machine, clean the host's archive cache and refresh AppStream data after every update).
//! Debian's tools do the work: `apt-get update`
//! refreshes the lists (at most once a day, so a run without network works off the cache),
//! `apt-cache` names the builds they offer, `dpkg --compare-versions` orders them, `apt-get
//! install --simulate` resolves dependencies, `apt-get download` fetches and `dpkg-deb -x`
//! unpacks.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, anyhow, bail};

use super::series::{Archive, Suite};
use crate::{
    arch::Arch,
    command::{describe, output, run},
};

/// Overrides where packages are cached (default [`DEFAULT_CACHE`]).
pub(crate) const CACHE_ENV: &str = "MASQ_KERNEL_CACHE";
/// Outside the repository, so a fresh clone on the same machine reuses what an earlier run
/// downloaded (about 1 GB of extracted kernels).
const DEFAULT_CACHE: &str = "/var/cache/masq/kernels";
/// How old package lists may get before a run refreshes them.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// The keyring that signs Debian's archives, bullseye's included.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The cache root.
pub(crate) fn cache_root() -> PathBuf {
    std::env::var_os(CACHE_ENV).map_or_else(|| PathBuf::from(DEFAULT_CACHE), PathBuf::from)
}

/// The mirror host's two archives, as the machine's own apt sources name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mirrors {
    main: String,
    security: String,
}

impl Mirrors {
    fn uri(&self, archive: Archive) -> &str {
        match archive {
            Archive::Main => &self.main,
            Archive::Security => &self.security,
        }
    }
}

/// The Debian mirrors of the machine's apt sources, as apt itself reads them (either format).
pub(crate) fn host_mirrors() -> Result<Mirrors> {
    let uris = output(Command::new("apt-get").env("LC_ALL", "C").args([
        "indextargets",
        "--no-release-info",
        "--format",
        "$(REPO_URI)",
    ]))?;
    mirrors_in(&uris).context(
        "no Debian mirror (a URI ending in /debian) in the machine's apt sources; add one, e.g. \
         `deb http://deb.debian.org/debian bookworm main`",
    )
}

/// Among repository URIs (one a line): the first ending in `/debian`, and the first ending in
/// `/debian-security` or else the same host's `/debian-security`. Third-party sources are
/// ignored.
fn mirrors_in(uris: &str) -> Option<Mirrors> {
    let uris = uris.lines().map(|uri| uri.trim().trim_end_matches('/'));
    let main = uris.clone().find(|uri| uri.ends_with("/debian"))?;
    let security = uris
        .clone()
        .find(|uri| uri.ends_with("/debian-security"))
        .map_or_else(|| format!("{main}-security"), str::to_owned);
    Some(Mirrors {
        main: main.to_owned(),
        security,
    })
}

/// A package build the lists offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) package: String,
    pub(crate) version: String,
    /// Where it comes from, e.g. `bookworm-security/main`.
    pub(crate) origin: String,
}

/// A package build apt's resolver picked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Build {
    pub(crate) package: String,
    pub(crate) version: String,
    /// `all` or the configuration's architecture.
    pub(crate) arch: String,
}

impl Build {
    /// What `apt-get download` names its file.
    pub(crate) fn deb_name(&self) -> String {
        format!(
            "{}_{}.deb",
            file_stem(&self.package, &self.version),
            self.arch
        )
    }
}

/// `PACKAGE_VERSION`, an epoch's `:` written `%3a`, as apt names files.
fn file_stem(package: &str, version: &str) -> String {
    format!("{package}_{}", version.replace(':', "%3a"))
}

/// A private apt configuration for a set of suites.
#[derive(Debug)]
pub(crate) struct Apt {
    dir: PathBuf,
    arch: Arch,
}

impl Apt {
    /// The configuration for `suites` of architecture `arch` (created or updated under
    /// `cache`).
    pub(crate) fn prepare(
        cache: &Path,
        suites: &[Suite],
        mirrors: &Mirrors,
        arch: Arch,
    ) -> Result<Self> {
        if !Path::new(KEYRING).is_file() {
            bail!("{KEYRING} is missing; run `apt-get install debian-archive-keyring`");
        }
        let name: Vec<&str> = suites.iter().map(|suite| suite.name).collect();
        let mut name = name.join("+");
        // The host's architecture keeps the name it always had, so existing caches stay valid.
        if !arch.is_host() {
            name = format!("{name}@{arch}");
        }
        let dir = cache.join("apt").join(name);
        for sub in ["lists/partial", "cache/archives/partial", "empty"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let sources: String = suites
            .iter()
            .map(|suite| {
                format!(
                    "deb [signed-by={KEYRING}] {} {} main\n",
                    mirrors.uri(suite.archive),
                    suite.name
                )
            })
            .collect();
        let apt = Self { dir, arch };
        // Read before anything else (see `command`), so the host's apt.conf.d is never read.
        let config = apt.dir.join("apt.conf");
        fs::write(
            &config,
            format!(
                "// Written by `cargo xtask kernels`.\nDir::Etc::Parts \"{}\";\n",
                apt.dir.join("empty").display()
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let list = apt.dir.join("sources.list");
        if fs::read_to_string(&list).ok().as_deref() != Some(sources.as_str()) {
            fs::write(&list, sources).with_context(|| format!("writing {}", list.display()))?;
            // Lists of other sources say nothing about these.
            let _ = fs::remove_file(apt.stamp());
        }
        Ok(apt)
    }

    fn stamp(&self) -> PathBuf {
        self.dir.join("lists-updated")
    }

    /// Whether the lists were refreshed successfully less than a day ago.
    fn lists_are_fresh(&self) -> bool {
        fs::metadata(self.stamp())
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| SystemTime::now().duration_since(modified).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE)
    }

    /// `program` (apt-get or apt-cache) reading only this configuration.
    ///
    /// apt reads `APT_CONFIG` first, then the `Dir::Etc::Parts` directory, and applies `-o`
    /// options only after both: the parts directory can only be replaced through `APT_CONFIG`
    /// (the host's holds hooks run after every update and its own cache settings).
    fn command(&self, program: &str) -> Command {
        let dir = |sub: &str| self.dir.join(sub).display().to_string();
        let mut command = Command::new(program);
        command
            .env("LC_ALL", "C")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("APT_CONFIG", dir("apt.conf"))
            .arg("-q");
        let options = [
            format!("Dir::Etc::SourceList={}", dir("sources.list")),
            format!("Dir::Etc::SourceParts={}", dir("empty")),
            format!("Dir::Etc::PreferencesParts={}", dir("empty")),
            "Dir::Etc::Preferences=/dev/null".to_owned(),
            format!("Dir::State::Lists={}", dir("lists")),
            // Nothing is installed, so a resolution names every package needed.
            "Dir::State::status=/dev/null".to_owned(),
            format!("Dir::State::extended_states={}", dir("extended_states")),
            format!("Dir::Cache={}", dir("cache")),
            // Downloads go to a directory of this cache that the `_apt` user cannot write.
            "APT::Sandbox::User=root".to_owned(),
            // Named even for the host's, so these lists never depend on the host's dpkg.
            format!("APT::Architecture={}", self.arch),
            format!("APT::Architectures={}", self.arch),
        ];
        for option in options {
            command.arg("-o").arg(option);
        }
        command
    }

    /// `apt-get update` with this configuration; an index that failed to download fails it
    /// (apt otherwise keeps the old lists and exits 0), so the lists count as fresh only when
    /// they are.
    fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "--error-on=any"]))?;
        fs::write(self.stamp(), "").with_context(|| format!("writing {}", self.stamp().display()))
    }

    /// Refreshes the lists unless they are fresh: `None` when they were, else how the refresh
    /// went (a failure is reported: the lists on disk, if any, decide then).
    pub(crate) fn refresh_if_stale(&self) -> Option<Result<()>> {
        if self.lists_are_fresh() {
            return None;
        }
        let refresh = self.update();
        if let Err(error) = &refresh {
            eprintln!("xtask: {error:#}; using the package lists on disk, if any");
        }
        Some(refresh)
    }

    /// The newest build among the packages named `prefix...` that `wanted` accepts; `None`
    /// when the lists have none.
    fn newest(&self, prefix: &str, wanted: &dyn Fn(&str) -> bool) -> Result<Option<Candidate>> {
        let names = output(self.command("apt-cache").args(["pkgnames", prefix]))?;
        let mut names: Vec<&str> = names.lines().map(str::trim).filter(|n| wanted(n)).collect();
        if names.is_empty() {
            return Ok(None);
        }
        // Of two names with the same build, the greater one, whatever the lists' order.
        names.sort_unstable_by(|a, b| b.cmp(a));
        let madison = output(self.command("apt-cache").arg("madison").args(&names))?;
        newest(parse_madison(&madison), |candidate| &candidate.version)
    }

    /// The builds apt would install for `packages` on a system with nothing installed: the
    /// packages and every package they need (`Depends` and `Pre-Depends`, recursively,
    /// alternatives as apt's resolver picks them), each with its architecture.
    pub(crate) fn resolve(&self, packages: &[&str]) -> Result<Vec<Build>> {
        let simulation = output(
            self.command("apt-get")
                .args(["install", "--simulate", "--no-install-recommends"])
                .args(packages),
        )?;
        Ok(installs_in(&simulation))
    }

    /// `apt-get download` of each `(package, version)` into `dir`; apt skips the files
    /// already there.
    pub(crate) fn download<'a>(
        &self,
        builds: impl IntoIterator<Item = (&'a str, &'a str)>,
        dir: &Path,
    ) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let specs = builds
            .into_iter()
            .map(|(package, version)| format!("{package}={version}"));
        run(self
            .command("apt-get")
            .arg("download")
            .args(specs)
            .current_dir(dir))
    }
}

/// The `(package, version, origin)` lines of `apt-cache madison`.
fn parse_madison(text: &str) -> Vec<Candidate> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let package = fields.next()?;
            let version = fields.next()?;
            // "http://deb.debian.org/debian bookworm-backports/main amd64 Packages"
            let origin = fields.next()?.split_whitespace().nth(1)?;
            (!package.is_empty() && !version.is_empty()).then(|| Candidate {
                package: package.to_owned(),
                version: version.to_owned(),
                origin: origin.to_owned(),
            })
        })
        .collect()
}

/// The `Inst PACKAGE (VERSION RELEASE [ARCH])` lines of `apt-get install --simulate`.
fn installs_in(simulation: &str) -> Vec<Build> {
    simulation
        .lines()
        .filter_map(|line| {
            let (package, rest) = line.strip_prefix("Inst ")?.split_once(" (")?;
            let version = rest.split_whitespace().next()?;
            let arch = rest.split_once('[')?.1.split_once(']')?.0;
            Some(Build {
                package: package.to_owned(),
                version: version.to_owned(),
                arch: arch.to_owned(),
            })
        })
        .collect()
}

/// Whether Debian version `a` is higher than `b`, as dpkg orders them.
fn is_newer(a: &str, b: &str) -> Result<bool> {
    let mut command = Command::new("dpkg");
    command.args(["--compare-versions", a, "gt", b]);
    let status = command
        .status()
        .with_context(|| format!("could not start `{}`", describe(&command)))?;
    match status.code() {
        Some(0) => Ok(true),
        Some(1) => Ok(false),
        _ => bail!("`{}` failed with {status}", describe(&command)),
    }
}

/// The item with the highest Debian version (`version` of it); of equal ones, the first.
fn newest<T>(items: Vec<T>, version: impl Fn(&T) -> &str) -> Result<Option<T>> {
    let mut best: Option<T> = None;
    for item in items {
        if let Some(current) = &best
            && !is_newer(version(&item), version(current))?
        {
            continue;
        }
        best = Some(item);
    }
    Ok(best)
}

/// A package build extracted into the cache.
#[derive(Clone, Debug)]
pub(crate) struct Extracted {
    pub(crate) package: String,
    pub(crate) version: String,
    /// Where it came from, or that it was taken from the cache without consulting the lists.
    pub(crate) origin: String,
    pub(crate) root: PathBuf,
}

/// The newest build of `prefix...` that `wanted` accepts, extracted under `store` (one
/// directory per build, named like apt's files, [`file_stem`]): taken from the cache when the lists name a build already there, else downloaded and
/// extracted, with `prepare` run on the extracted tree before it takes its final place; older
/// builds in `store` are removed. Lists older than a day are refreshed first, and once more
/// when the build they name cannot be had (the archive may have dropped it since); when
/// refreshing fails (no network), the lists on disk decide, and without lists the newest build
/// in the cache is used.
pub(crate) fn fetch(
    apt: &Apt,
    store: &Path,
    prefix: &str,
    wanted: &dyn Fn(&str) -> bool,
    prepare: &dyn Fn(&Path) -> Result<()>,
) -> Result<Extracted> {
    let mut refresh = apt.refresh_if_stale();
    let problem = loop {
        match fetch_newest(apt, store, prefix, wanted, prepare) {
            Ok(extracted) => return Ok(extracted),
            Err(error) if refresh.is_none() => {
                eprintln!("xtask: {error:#}; refreshing the package lists");
                refresh = Some(apt.update());
            }
            Err(error) => break error,
        }
    };
    let refresh_error = refresh.and_then(Result::err);
    if let Some(cached) = newest_in_store(store)? {
        eprintln!(
            "xtask: using {} {} from the cache: {:#}",
            cached.package,
            cached.version,
            refresh_error.as_ref().unwrap_or(&problem)
        );
        return Ok(cached);
    }
    let mut error = problem;
    if let Some(refresh) = refresh_error {
        error = error.context(format!("refreshing the package lists failed: {refresh:#}"));
    }
    Err(error.context(format!(
        "no build of {prefix}… could be fetched into {} (Debian's archive must be reachable \
         for the first run)",
        store.display()
    )))
}

/// The newest build the lists name, from the cache or else downloaded and extracted.
fn fetch_newest(
    apt: &Apt,
    store: &Path,
    prefix: &str,
    wanted: &dyn Fn(&str) -> bool,
    prepare: &dyn Fn(&Path) -> Result<()>,
) -> Result<Extracted> {
    let candidate = apt
        .newest(prefix, wanted)?
        .ok_or_else(|| anyhow!("the package lists offer no package {prefix}…"))?;
    let stem = file_stem(&candidate.package, &candidate.version);
    let dir = store.join(&stem);
    if !dir.is_dir() {
        eprintln!(
            "xtask: fetching {} {} ({})",
            candidate.package, candidate.version, candidate.origin
        );
        let downloads = store.join(".download");
        let partial = store.join(".partial");
        for scratch in [&downloads, &partial] {
            let _ = fs::remove_dir_all(scratch);
        }
        apt.download([(&*candidate.package, &*candidate.version)], &downloads)?;
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(downloads.join(format!("{stem}_{}.deb", apt.arch)))
            .arg(&partial))?;
        prepare(&partial)?;
        fs::rename(&partial, &dir)
            .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))?;
        let _ = fs::remove_dir_all(&downloads);
    }
    // One build per series: the others go.
    for other in builds_in(store)? {
        if other.root != dir {
            eprintln!("xtask: removing the older build {}", other.root.display());
            let _ = fs::remove_dir_all(&other.root);
        }
    }
    Ok(Extracted {
        package: candidate.package,
        version: candidate.version,
        origin: candidate.origin,
        root: dir,
    })
}

/// The builds extracted in `store`, by their directories' names.
fn builds_in(store: &Path) -> Result<Vec<Extracted>> {
    let Ok(entries) = fs::read_dir(store) else {
        return Ok(Vec::new());
    };
    let mut builds = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", store.display()))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if let Some((package, version)) = name.split_once('_')
            && !name.starts_with('.')
        {
            builds.push(Extracted {
                package: package.to_owned(),
                version: version.replace("%3a", ":"),
                origin: "cache".to_owned(),
                root: entry.path(),
            });
        }
    }
    Ok(builds)
}

/// The newest build extracted in `store`.
fn newest_in_store(store: &Path) -> Result<Option<Extracted>> {
    newest(builds_in(store)?, |build| &build.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dpkg_picks_the_newest_build_whatever_the_order_of_the_lists() {
        let madison = "\
linux-image-6.12.90+deb12.1-amd64 | 6.12.90-2~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.9+deb12-amd64 | 6.12.9-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.90+deb12-amd64 | 6.12.90-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
";
        let candidates = parse_madison(madison);
        assert_eq!(candidates.len(), 4);
        let chosen = newest(candidates.clone(), |c| &c.version).unwrap().unwrap();
        assert_eq!(chosen.package, "linux-image-6.12.95+deb12-amd64");
        assert_eq!(chosen.version, "6.12.95-1~bpo12+1");
        assert_eq!(chosen.origin, "bookworm-backports/main");
        let mut reversed = candidates;
        reversed.reverse();
        assert_eq!(newest(reversed, |c| &c.version).unwrap(), Some(chosen));
        assert_eq!(
            newest(Vec::<Candidate>::new(), |c| &c.version).unwrap(),
            None
        );
    }

    #[test]
    fn dpkg_orders_tildes_epochs_and_revisions() {
        // Each later than the one before: a plain text or numeric order gets some wrong.
        let ascending = [
            "6.12.90-1~bpo12+1",
            "6.12.90-1",
            "6.12.117-1~deb12u1",
            "1:0.1-1",
        ];
        for pair in ascending.windows(2) {
            assert!(is_newer(pair[1], pair[0]).unwrap(), "{pair:?}");
            assert!(!is_newer(pair[0], pair[1]).unwrap(), "{pair:?}");
        }
        assert!(is_newer("not a version", "1").is_err());
        let versions = ["6.1.192-1", "6.1.192-2", "6.1.158-1"].map(str::to_owned);
        assert_eq!(
            newest(versions.to_vec(), String::as_str)
                .unwrap()
                .as_deref(),
            Some("6.1.192-2")
        );
    }

    #[test]
    fn the_security_archive_wins_over_the_release() {
        let madison = "\
 linux-image-6.1.0-50-amd64 |  6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
 linux-image-6.1.0-56-amd64 |  6.1.192-2 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
";
        let chosen = newest(parse_madison(madison), |c| &c.version)
            .unwrap()
            .unwrap();
        assert_eq!(chosen.package, "linux-image-6.1.0-56-amd64");
        assert_eq!(chosen.origin, "bookworm-security/main");
    }

    #[test]
    fn a_simulated_install_names_every_build_with_its_architecture() {
        let simulation = "\
NOTE: This is only a simulation!
The following NEW packages will be installed:
  iptables libc6 netbase
Inst netbase (6.4 Debian:12.15/oldstable [all])
Inst libgcc-s1 (12.2.0-14+deb12u1 Debian:12.15/oldstable [arm64]) []
Inst busybox-static (1:1.35.0-4+deb12u1+b1 Debian:12.15/oldstable [arm64])
Conf netbase (6.4 Debian:12.15/oldstable [all])
";
        let builds = installs_in(simulation);
        let names: Vec<String> = builds.iter().map(Build::deb_name).collect();
        assert_eq!(
            names,
            [
                "netbase_6.4_all.deb",
                "libgcc-s1_12.2.0-14+deb12u1_arm64.deb",
                "busybox-static_1%3a1.35.0-4+deb12u1+b1_arm64.deb",
            ]
        );
    }

    #[test]
    fn mirrors_are_the_debian_ones_among_the_hosts_repositories() {
        let uris = "\
https://packages.cloud.google.com/apt/
http://deb.debian.org/debian/
http://deb.debian.org/debian-security/
";
        assert_eq!(
            mirrors_in(uris),
            Some(Mirrors {
                main: "http://deb.debian.org/debian".to_owned(),
                security: "http://deb.debian.org/debian-security".to_owned(),
            })
        );
        assert_eq!(
            mirrors_in("http://ftp.example.org/debian/\n"),
            Some(Mirrors {
                main: "http://ftp.example.org/debian".to_owned(),
                security: "http://ftp.example.org/debian-security".to_owned(),
            })
        );
        assert_eq!(mirrors_in("https://deb.nodesource.com/node_20.x/\n"), None);
    }
}
