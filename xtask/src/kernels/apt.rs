//! Debian packages fetched through a private apt configuration into a cache outside the
//! repository, never installed.
//!
//! Each set of suites has its own sources.list, package lists and apt cache under the cache
//! root, so the host's apt state is never read or written: not its sources, not its lists, not
//! its `apt.conf.d` (whose hooks, on this machine, clean the host's archive cache and refresh
//! AppStream data after every update). The lists are refreshed at most once a day, so a run
//! without network works off the cache.

use std::{
    cmp::Ordering,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};

use super::series::{Archive, Suite};
use crate::{
    arch::Arch,
    command::{output, run},
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

/// The mirrors of the machine's apt sources (`/etc/apt/sources.list` and `sources.list.d`).
pub(crate) fn host_mirrors() -> Result<Mirrors> {
    let mut text = fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    if let Ok(entries) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = entries
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .filter(|path| {
                path.extension()
                    .is_some_and(|extension| extension == "list" || extension == "sources")
            })
            .collect();
        paths.sort();
        for path in paths {
            text.push('\n');
            text.push_str(&fs::read_to_string(&path).unwrap_or_default());
        }
    }
    mirrors_in(&text).context(
        "no Debian mirror (a URI ending in /debian) in /etc/apt/sources.list or \
         /etc/apt/sources.list.d; add one, e.g. `deb http://deb.debian.org/debian bookworm main`",
    )
}

/// The Debian mirrors among apt source entries in either format (one-line `deb URI ...` or
/// deb822 `URIs:` fields): the first URI ending in `/debian`, and the first ending in
/// `/debian-security` or else the same host's `/debian-security`. Third-party sources are
/// ignored.
fn mirrors_in(sources: &str) -> Option<Mirrors> {
    let mut uris = Vec::new();
    for line in sources.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("deb ") {
            // `deb [options] URI suite components`
            let rest = rest.trim_start();
            let rest = if rest.starts_with('[') {
                rest.split_once(']').map_or("", |(_, after)| after)
            } else {
                rest
            };
            uris.extend(rest.split_whitespace().next());
        } else if let Some(list) = line.strip_prefix("URIs:") {
            uris.extend(list.split_whitespace());
        }
    }
    let trimmed = uris.iter().map(|uri| uri.trim_end_matches('/'));
    let main = trimmed.clone().find(|uri| uri.ends_with("/debian"))?;
    let security = trimmed
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
    pub(crate) fn lists_are_fresh(&self) -> bool {
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
            "Dir::State::status=/dev/null".to_owned(),
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
    pub(crate) fn update(&self) -> Result<()> {
        run(self.command("apt-get").args(["update", "--error-on=any"]))?;
        fs::write(self.stamp(), "").with_context(|| format!("writing {}", self.stamp().display()))
    }

    /// The newest build among the packages named `prefix...` that `wanted` accepts; `None`
    /// when the lists have none.
    pub(crate) fn newest(
        &self,
        prefix: &str,
        wanted: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Candidate>> {
        let names = output(self.command("apt-cache").args(["pkgnames", prefix]))?;
        let names: Vec<&str> = names.lines().map(str::trim).filter(|n| wanted(n)).collect();
        if names.is_empty() {
            return Ok(None);
        }
        let madison = output(self.command("apt-cache").arg("madison").args(&names))?;
        Ok(newest(parse_madison(&madison)))
    }

    /// `packages` and every package they need to work (`Depends` and `Pre-Depends`,
    /// recursively; the first of alternatives), sorted.
    pub(crate) fn dependency_closure(&self, packages: &[&str]) -> Result<Vec<String>> {
        let listing = output(
            self.command("apt-cache")
                .args(["depends", "--recurse", "--no-recommends", "--no-suggests"])
                .args([
                    "--no-conflicts",
                    "--no-breaks",
                    "--no-replaces",
                    "--no-enhances",
                ])
                .args(packages),
        )?;
        Ok(closure_in(&listing))
    }

    /// Downloads `candidate` into `dir` and returns the .deb's path.
    pub(crate) fn download(&self, candidate: &Candidate, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        run(self
            .command("apt-get")
            .arg("download")
            .arg(format!("{}={}", candidate.package, candidate.version))
            .current_dir(dir))?;
        fs::read_dir(dir)?
            .filter_map(|entry| entry.ok().map(|entry| entry.path()))
            .find(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| {
                        name.starts_with(&format!("{}_", candidate.package))
                            && name.ends_with(".deb")
                    })
            })
            .with_context(|| {
                format!(
                    "apt-get download left no {} .deb in {}",
                    candidate.package,
                    dir.display()
                )
            })
    }
}

/// The real packages `apt-cache depends --recurse` names: its unindented lines, without the
/// virtual ones (`<name>`), which some real package named there provides.
fn closure_in(listing: &str) -> Vec<String> {
    let mut packages: Vec<String> = listing
        .lines()
        .filter(|line| !line.starts_with([' ', '|']) && !line.trim().is_empty())
        .map(str::trim)
        .filter(|name| !name.starts_with('<'))
        .map(str::to_owned)
        .collect();
    packages.sort();
    packages.dedup();
    packages
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

/// The candidate with the highest Debian version (ties: the greatest name, so the choice never
/// depends on the lists' order).
fn newest(candidates: Vec<Candidate>) -> Option<Candidate> {
    candidates.into_iter().max_by(|a, b| {
        compare_versions(&a.version, &b.version).then_with(|| a.package.cmp(&b.package))
    })
}

/// Orders Debian versions as dpkg does (`[epoch:]upstream[-revision]`, `~` before anything,
/// digit runs numerically).
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    let (epoch_a, upstream_a, revision_a) = split_version(a);
    let (epoch_b, upstream_b, revision_b) = split_version(b);
    epoch_a
        .cmp(&epoch_b)
        .then_with(|| compare_part(upstream_a, upstream_b))
        .then_with(|| compare_part(revision_a, revision_b))
}

fn split_version(version: &str) -> (u64, &str, &str) {
    let (epoch, rest) = match version.split_once(':') {
        Some((epoch, rest)) if epoch.bytes().all(|b| b.is_ascii_digit()) => {
            (epoch.parse().unwrap_or(0), rest)
        }
        _ => (0, version),
    };
    match rest.rsplit_once('-') {
        Some((upstream, revision)) => (epoch, upstream, revision),
        None => (epoch, rest, ""),
    }
}

/// dpkg's `verrevcmp`: alternating runs of non-digits (compared by [`char_order`]) and digits
/// (compared as numbers).
fn compare_part(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while !a.is_empty() || !b.is_empty() {
        while a.first().is_some_and(|c| !c.is_ascii_digit())
            || b.first().is_some_and(|c| !c.is_ascii_digit())
        {
            let order = char_order(a.first().copied()).cmp(&char_order(b.first().copied()));
            if order != Ordering::Equal {
                return order;
            }
            a = a.get(1..).unwrap_or_default();
            b = b.get(1..).unwrap_or_default();
        }
        let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
        let (run_a, run_b) = (digits(a), digits(b));
        let number_a = a[..run_a].iter().skip_while(|&&c| c == b'0').count();
        let number_b = b[..run_b].iter().skip_while(|&&c| c == b'0').count();
        // Without leading zeros, a longer run is a larger number; equal lengths compare as text.
        let order = number_a
            .cmp(&number_b)
            .then_with(|| a[run_a - number_a..run_a].cmp(&b[run_b - number_b..run_b]));
        if order != Ordering::Equal {
            return order;
        }
        a = &a[run_a..];
        b = &b[run_b..];
    }
    Ordering::Equal
}

/// dpkg's `order`: `~` sorts before the end of the part, which sorts before letters, which sort
/// before other characters.
fn char_order(c: Option<u8>) -> i32 {
    match c {
        None => 0,
        Some(c) if c.is_ascii_digit() => 0,
        Some(c) if c.is_ascii_alphabetic() => i32::from(c),
        Some(b'~') => -1,
        Some(c) => i32::from(c) + 256,
    }
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

/// The directory a build is extracted to (`:` of an epoch is not wanted in paths).
fn build_dir(store: &Path, package: &str, version: &str) -> PathBuf {
    store.join(format!("{package}_{}", version.replace(':', "%3a")))
}

/// The newest build of `prefix...` that `wanted` accepts, extracted under `store`: taken from
/// the cache when the lists name a build already there, else downloaded and extracted, with
/// `prepare` run on the extracted tree before it takes its final place; older builds in
/// `store` are removed. Lists older than a day are refreshed first; when that fails (no
/// network), the lists on disk decide, and without lists the newest build in the cache is used.
pub(crate) fn fetch(
    apt: &Apt,
    store: &Path,
    prefix: &str,
    wanted: &dyn Fn(&str) -> bool,
    prepare: &dyn Fn(&Path) -> Result<()>,
) -> Result<Extracted> {
    let mut refreshed = false;
    let mut refresh_error = None;
    if !apt.lists_are_fresh() {
        match apt.update() {
            Ok(()) => refreshed = true,
            Err(error) => {
                eprintln!("xtask: {error:#}; using the package lists on disk, if any");
                refresh_error = Some(error);
            }
        }
    }
    let mut problem = None;
    loop {
        let candidate = match apt.newest(prefix, wanted) {
            Ok(candidate) => candidate,
            Err(error) => {
                problem = Some(error);
                None
            }
        };
        if let Some(candidate) = candidate {
            let dir = build_dir(store, &candidate.package, &candidate.version);
            let ready = if dir.is_dir() {
                Ok(())
            } else {
                download_and_extract(apt, store, &candidate, &dir, prepare)
            };
            match ready {
                Ok(()) => {
                    prune(store, &dir);
                    return Ok(Extracted {
                        package: candidate.package,
                        version: candidate.version,
                        origin: candidate.origin,
                        root: dir,
                    });
                }
                Err(error) => problem = Some(error),
            }
        }
        // The lists may be older than the archive (a build removed since): refresh them once.
        if refreshed || refresh_error.is_some() {
            break;
        }
        match apt.update() {
            Ok(()) => refreshed = true,
            Err(error) => refresh_error = Some(error),
        }
    }
    if let Some(cached) = newest_in_store(store) {
        eprintln!(
            "xtask: using {} {} from the cache: {:#}",
            cached.package,
            cached.version,
            refresh_error
                .or(problem)
                .unwrap_or_else(|| anyhow::anyhow!("the lists offer no build"))
        );
        return Ok(cached);
    }
    let mut error =
        problem.unwrap_or_else(|| anyhow::anyhow!("the package lists offer no package {prefix}…"));
    if let Some(refresh) = refresh_error {
        error = error.context(format!("refreshing the package lists failed: {refresh:#}"));
    }
    Err(error.context(format!(
        "no build of {prefix}… could be fetched into {} (Debian's archive must be reachable \
         for the first run)",
        store.display()
    )))
}

fn download_and_extract(
    apt: &Apt,
    store: &Path,
    candidate: &Candidate,
    dir: &Path,
    prepare: &dyn Fn(&Path) -> Result<()>,
) -> Result<()> {
    eprintln!(
        "xtask: fetching {} {} ({})",
        candidate.package, candidate.version, candidate.origin
    );
    let downloads = store.join(".download");
    let _ = fs::remove_dir_all(&downloads);
    let deb = apt.download(candidate, &downloads)?;
    let partial = store.join(".partial");
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    prepare(&partial)?;
    fs::rename(&partial, dir)
        .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))?;
    let _ = fs::remove_dir_all(&downloads);
    Ok(())
}

/// Removes every build in `store` but `keep`, so the cache holds one build per series.
fn prune(store: &Path, keep: &Path) {
    let Ok(entries) = fs::read_dir(store) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path != keep && path.is_dir() {
            eprintln!("xtask: removing the older build {}", path.display());
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// The newest build extracted in `store`, by the version in its directory name.
fn newest_in_store(store: &Path) -> Option<Extracted> {
    fs::read_dir(store)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (package, version) = name.split_once('_')?;
            (!name.starts_with('.')).then(|| Extracted {
                package: package.to_owned(),
                version: version.replace("%3a", ":"),
                origin: "cache".to_owned(),
                root: entry.path(),
            })
        })
        .max_by(|a, b| compare_versions(&a.version, &b.version))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_dpkg_orders_them() {
        let ascending = [
            "5.10.223-1",
            "5.10.262-1",
            "6.1.158-1",
            "6.1.192-1",
            "6.1.192-2",
            "6.12.90-1~bpo12+1",
            "6.12.90-1",
            "6.12.90-2~bpo12+1",
            "6.12.95-1~bpo12+1",
            "6.12.117-1~deb12u1",
            "1:0.1-1",
        ];
        for pair in ascending.windows(2) {
            assert_eq!(
                compare_versions(pair[0], pair[1]),
                Ordering::Less,
                "{pair:?}"
            );
            assert_eq!(
                compare_versions(pair[1], pair[0]),
                Ordering::Greater,
                "{pair:?}"
            );
        }
        assert_eq!(compare_versions("1.0", "1.00"), Ordering::Equal);
        assert_eq!(compare_versions("1.0~rc1", "1.0"), Ordering::Less);
        assert_eq!(compare_versions("1.0a", "1.0+"), Ordering::Less);
        assert_eq!(compare_versions("30+20221128-1", "28-1"), Ordering::Greater);
    }

    #[test]
    fn the_newest_build_wins_whatever_the_order_of_the_lists() {
        let madison = "\
linux-image-6.12.90+deb12.1-amd64 | 6.12.90-2~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.95+deb12-amd64 | 6.12.95-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.9+deb12-amd64 | 6.12.9-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
linux-image-6.12.90+deb12-amd64 | 6.12.90-1~bpo12+1 | http://deb.debian.org/debian bookworm-backports/main amd64 Packages
";
        let candidates = parse_madison(madison);
        assert_eq!(candidates.len(), 4);
        let chosen = newest(candidates.clone()).unwrap();
        assert_eq!(chosen.package, "linux-image-6.12.95+deb12-amd64");
        assert_eq!(chosen.version, "6.12.95-1~bpo12+1");
        assert_eq!(chosen.origin, "bookworm-backports/main");
        let mut reversed = candidates;
        reversed.reverse();
        assert_eq!(newest(reversed).unwrap(), chosen);
        assert_eq!(newest(Vec::new()), None);
    }

    #[test]
    fn a_closure_is_the_real_packages_apt_cache_lists() {
        let listing = "\
iptables
  Depends: libc6
  Depends: netbase
 |Depends: <libnftnl11>
libc6
  Depends: libgcc-s1
netbase
<debconf-2.0>
libgcc-s1
  Depends: libc6
";
        assert_eq!(
            closure_in(listing),
            ["iptables", "libc6", "libgcc-s1", "netbase"]
        );
    }

    #[test]
    fn the_security_archive_wins_over_the_release() {
        let madison = "\
 linux-image-6.1.0-50-amd64 |  6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
 linux-image-6.1.0-56-amd64 |  6.1.192-2 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
";
        let chosen = newest(parse_madison(madison)).unwrap();
        assert_eq!(chosen.package, "linux-image-6.1.0-56-amd64");
        assert_eq!(chosen.origin, "bookworm-security/main");
    }

    #[test]
    fn mirrors_come_from_either_source_format() {
        let deb822 = "\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
";
        let third_party = "deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n";
        let expected = Mirrors {
            main: "http://deb.debian.org/debian".to_owned(),
            security: "http://deb.debian.org/debian-security".to_owned(),
        };
        assert_eq!(
            mirrors_in(&format!("{third_party}{deb822}")),
            Some(expected.clone())
        );
        let one_line = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://ftp.example.org/debian/ bookworm main\n";
        assert_eq!(
            mirrors_in(one_line),
            Some(Mirrors {
                main: "http://ftp.example.org/debian".to_owned(),
                security: "http://ftp.example.org/debian-security".to_owned(),
            })
        );
        assert_eq!(mirrors_in(third_party), None);
    }
}
