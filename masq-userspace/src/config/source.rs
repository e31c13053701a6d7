//! Reading the config from a file (upstream) or a directory (Azure ip-masq-agent-v2) and
//! turning it into the [`EffectiveConfig`] everything else derives from.

use std::{
    collections::{BTreeSet, HashSet},
    fs::{self, File},
    io::{self, Read as _},
    os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Condvar, Mutex, PoisonError},
    thread,
    time::Duration,
};

use super::{
    AZURE_CIDR_LIMIT, CONFIG_FILE_PREFIX, GoDuration, MasqConfig,
    cidr::{Cidr, CidrText},
    decode::{self, DecodeError},
    validate::{CidrLists, ValidLists, ValidationError, check_not_in_both, validate_lists},
};
use go_compat::{
    json::JsonValue,
    strconv::quote,
    yaml::{self as goyaml, YamlError},
};

/// Where the config comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// One file, upstream semantics.
    File(PathBuf),
    /// A directory of `ip-masq*` files, Azure ip-masq-agent-v2 semantics.
    Directory(PathBuf),
}

/// Settings of the agent that shape how a config is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// `--nomasq-all-reserved-ranges`: extends the default CIDR list.
    pub nomasq_all_reserved_ranges: bool,
    /// `--enable-ipv6`: IPv6 CIDRs are rejected without it.
    pub enable_ipv6: bool,
    /// `--resync-interval`: the interval in directory mode, where files have no such key.
    pub resync_interval: GoDuration,
}

/// Where an exempt CIDR came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CidrOrigin {
    /// The built-in defaults.
    Default,
    /// A config file: its path, kept once for the agent's life (see [`CidrOrigin::file`]).
    File(&'static Path),
}

impl CidrOrigin {
    /// The origin of the CIDRs of the file at `path`.
    ///
    /// Every CIDR carries its origin, and a reload copies 10,000 of them: a reference copies
    /// for free where a shared pointer costs two atomic operations per CIDR and reload. Each
    /// path is stored once, for good: an agent reads one config file, or the few `ip-masq*`
    /// files of its directory, so what is kept is a handful of paths.
    pub fn file(path: &Path) -> Self {
        static PATHS: Mutex<BTreeSet<&'static Path>> = Mutex::new(BTreeSet::new());
        let mut paths = PATHS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&known) = paths.get(path) {
            return Self::File(known);
        }
        let kept: &'static Path = Box::leak(path.to_path_buf().into_boxed_path());
        paths.insert(kept);
        Self::File(kept)
    }
}

impl std::fmt::Display for CidrOrigin {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => formatter.write_str("default"),
            Self::File(path) => write!(formatter, "{}", path.display()),
        }
    }
}

/// A validated CIDR of one of the lists and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourcedCidr {
    /// The CIDR.
    pub cidr: Cidr,
    /// Its origin.
    pub origin: CidrOrigin,
}

/// Why the defaults are in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// The config file does not exist.
    MissingFile(PathBuf),
    /// The directory holds no `ip-masq*` file.
    NoMatchingFiles(PathBuf),
    /// Read from this file.
    File(PathBuf),
    /// Read from these files of a directory, in order.
    Directory {
        /// The directory.
        dir: PathBuf,
        /// The file names read.
        files: Vec<String>,
    },
}

impl std::fmt::Display for ConfigOrigin {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingFile(path) => {
                write!(formatter, "defaults (no file at {})", path.display())
            }
            Self::NoMatchingFiles(dir) => {
                write!(
                    formatter,
                    "defaults (no ip-masq* file in {})",
                    dir.display()
                )
            }
            Self::File(path) => write!(formatter, "{} (file)", path.display()),
            Self::Directory { dir, files } => {
                write!(
                    formatter,
                    "{} (directory: {})",
                    dir.display(),
                    files.join(", ")
                )
            }
        }
    }
}

/// A config that passed validation: what the policy, the maps and the rules are built from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectiveConfig {
    /// Where it came from.
    pub origin: ConfigOrigin,
    /// Non-masquerade CIDRs in rule order (config order; in directory mode by file, then first
    /// appearance, duplicates removed).
    pub cidrs: Vec<SourcedCidr>,
    /// `masqueradeCIDRs`, in the same order: destinations masqueraded although a shorter
    /// non-masquerade prefix holds them.
    pub masquerade_cidrs: Vec<SourcedCidr>,
    /// `nonMasqueradeSrcCIDRs`, in the same order: pod sources never masqueraded.
    pub non_masquerade_src_cidrs: Vec<SourcedCidr>,
    /// The config in upstream's form (directory mode: the merged flags, the `cidrLimit` that
    /// applied per file and `--resync-interval`): the flags, the interval, and the logs.
    pub raw: MasqConfig,
}

/// Why a config could not be read; messages follow upstream's (file mode: the bare cause, as
/// upstream logs it; directory mode: the Azure agent's wrapped messages). Those messages quote
/// their cause in Go's words, verbatim, so the cause is part of the message and not also a
/// `source()` that would say it a second time.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be opened or read.
    #[error("{}", go_io_error(.op, .path, .cause))]
    Read {
        /// "open" or "read".
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause, quoted in the message in Go's words.
        cause: io::Error,
    },
    /// Not YAML or JSON.
    #[error(transparent)]
    Syntax(YamlError),
    /// Values of the wrong type.
    #[error(transparent)]
    Decode(DecodeError),
    /// Rejected by validation.
    #[error(transparent)]
    Invalid(ValidationError),
    /// The file holds no document (empty, blank, or comments only). Upstream would fall back to
    /// the defaults (the Azure agent: to masquerading everything); masq treats it like any
    /// bad file, because an empty file is what a half-written update looks like.
    #[error(
        "config file {} is empty; keeping the config in force instead of falling back to the defaults \
         (remove the file to use the defaults)", .path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The directory could not be listed.
    #[error("failed to read config directory, error: {}", go_io_error("open", .dir, .cause))]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// The cause, quoted in the message in Go's words.
        cause: io::Error,
    },
    /// A file of the directory failed to read, convert, decode or validate: the Azure agent's
    /// words around the cause.
    #[error("{}", azure_file_error(.name, .cause))]
    DirFile {
        /// The file name.
        name: String,
        /// What went wrong with it, quoted in the message.
        cause: Box<ConfigError>,
    },
}

/// The Azure agent's message for a file of its directory. JSON passes through its YAML step
/// untouched, so JSON syntax errors surface when it unmarshals.
fn azure_file_error(name: &str, error: &ConfigError) -> String {
    let name = quote(name);
    match error {
        ConfigError::Syntax(YamlError::Json(_)) | ConfigError::Decode(_) => {
            format!("failed to unmarshal config file {name}, error: {error}")
        }
        ConfigError::Syntax(_) => {
            format!("failed to convert config file {name} to JSON, error: {error}")
        }
        ConfigError::Invalid(_) => format!("config file {name} is invalid: {error}"),
        _ => format!("failed to read config file {name}, error: {error}"),
    }
}

/// Formats an I/O error the way Go's `*PathError` prints: `open /x: no such file or directory`.
fn go_io_error(op: &str, path: &Path, error: &io::Error) -> String {
    let cause = match error.raw_os_error() {
        Some(libc::ENOENT) => "no such file or directory".to_owned(),
        Some(libc::EACCES) => "permission denied".to_owned(),
        Some(libc::EISDIR) => "is a directory".to_owned(),
        Some(libc::ENOTDIR) => "not a directory".to_owned(),
        Some(libc::ELOOP) => "too many levels of symbolic links".to_owned(),
        Some(libc::EIO) => "input/output error".to_owned(),
        _ => {
            let text = error.to_string();
            let text = text.split(" (os error").next().unwrap_or(&text).to_owned();
            let mut characters = text.chars();
            characters.next().map_or(text.clone(), |first| {
                first.to_lowercase().chain(characters).collect()
            })
        }
    };
    format!("{op} {}: {cause}", path.display())
}

/// The largest config file read: a ConfigMap holds at most 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// How long one read may take before it is given up (a hung network filesystem).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Paths whose read hung past [`READ_TIMEOUT`] and has not returned yet: reading them again
/// would only pile up stuck threads.
static HANGING_READS: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// Reads a config file as upstream does, but bounded: only regular files (a FIFO would block
/// the agent, `/dev/zero` never ends), at most [`MAX_CONFIG_BYTES`], within [`READ_TIMEOUT`].
fn read_file(path: &Path) -> Result<Vec<u8>, (&'static str, io::Error)> {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| ("open", error))?;
    let metadata = file.metadata().map_err(|error| ("open", error))?;
    let kind = metadata.file_type();
    // A directory fails its read with upstream's "is a directory", as in Go.
    if !kind.is_file() && !kind.is_dir() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else {
            "a socket"
        };
        return Err((
            "open",
            io::Error::other(format!("not a regular file ({what})")),
        ));
    }
    let too_large = |size: u64| {
        io::Error::other(format!(
            "{size} bytes is more than a ConfigMap holds ({MAX_CONFIG_BYTES} bytes)"
        ))
    };
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(("read", too_large(metadata.len())));
    }
    let bytes = if on_local_filesystem(&file) {
        let mut bytes = Vec::with_capacity(usize::try_from(metadata.len()).unwrap_or(0) + 1);
        (&file)
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map(|_| bytes)
    } else {
        read_with_timeout(path, file)
    }
    .map_err(|error| ("read", error))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(("read", too_large(bytes.len() as u64)));
    }
    Ok(bytes)
}

/// Whether `file` is on a disk or memory filesystem, whose reads cannot hang: it is read
/// inline. Any other (NFS, FUSE, ...) is read on a helper thread with a timeout, which costs
/// a thread per read: on a 2-core node, more than reading a 10k-CIDR file inline.
fn on_local_filesystem(file: &File) -> bool {
    // The kernel's magic numbers (linux/magic.h): tmpfs, ext2/3/4, XFS, Btrfs, overlayfs and
    // F2FS. nix names only some of them for musl, which the agent is built for.
    const LOCAL: [u64; 6] = [
        0x0102_1994,
        0xef53,
        0x5846_5342,
        0x9123_683e,
        0x794c_7630,
        0xf2f5_2010,
    ];
    crate::sys::fs::filesystem_magic(file).is_some_and(|magic| LOCAL.contains(&magic))
}

/// What the helper thread of [`read_with_timeout`] hands back, unless it was given up on.
#[derive(Default)]
struct ReadSlot {
    result: Option<io::Result<Vec<u8>>>,
    abandoned: bool,
}

/// Reads at most one byte more than [`MAX_CONFIG_BYTES`] on a helper thread, giving up after
/// [`READ_TIMEOUT`]. A read given up on marks its path as hanging until it returns.
fn read_with_timeout(path: &Path, file: File) -> io::Result<Vec<u8>> {
    let hanging = || HANGING_READS.lock().unwrap_or_else(PoisonError::into_inner);
    if hanging().contains(path) {
        return Err(io::Error::other(
            "an earlier read of this file still hangs; not reading it again",
        ));
    }
    let shared = Arc::new((Mutex::new(ReadSlot::default()), Condvar::new()));
    let for_reader = Arc::clone(&shared);
    let owned = path.to_path_buf();
    thread::Builder::new()
        .name("config-read".to_owned())
        .spawn(move || {
            let mut bytes = Vec::new();
            let result = file
                .take(MAX_CONFIG_BYTES + 1)
                .read_to_end(&mut bytes)
                .map(|_| bytes);
            let (slot, done) = &*for_reader;
            let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
            if slot.abandoned {
                HANGING_READS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&owned);
            } else {
                slot.result = Some(result);
                done.notify_one();
            }
        })?;
    let (slot, done) = &*shared;
    let slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut slot, _) = done
        .wait_timeout_while(slot, READ_TIMEOUT, |slot| slot.result.is_none())
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(result) = slot.result.take() {
        return result;
    }
    // Marked under the slot's lock: the reader cannot finish between the two steps.
    slot.abandoned = true;
    hanging().insert(path.to_path_buf());
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!("no data within {} s", READ_TIMEOUT.as_secs()),
    ))
}

impl ConfigError {
    /// The kind of failure, for a metric label (never free text).
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::Read { .. } | Self::ReadDir { .. } => "read",
            Self::Syntax(_) => "syntax",
            Self::Decode(_) => "decode",
            Self::Invalid(_) => "invalid",
            Self::Empty { .. } => "empty",
            Self::DirFile { cause, .. } => cause.reason(),
        }
    }
}

/// Reads the config from `source` with upstream's semantics for that source.
pub fn load(source: &ConfigSource, options: &ReadOptions) -> Result<EffectiveConfig, ConfigError> {
    match source {
        ConfigSource::File(path) => load_file(path, options),
        ConfigSource::Directory(dir) => load_directory(dir, options),
    }
}

fn defaults(
    origin: ConfigOrigin,
    options: &ReadOptions,
    resync_interval: GoDuration,
) -> EffectiveConfig {
    let raw = MasqConfig {
        resync_interval,
        ..MasqConfig::defaults(options.nomasq_all_reserved_ranges)
    };
    let cidrs = raw
        .non_masquerade_cidrs
        .iter()
        .flatten()
        .filter_map(|text| Cidr::parse(text).ok())
        .map(|cidr| SourcedCidr {
            cidr,
            origin: CidrOrigin::Default,
        })
        .collect();
    EffectiveConfig {
        origin,
        cidrs,
        masquerade_cidrs: Vec::new(),
        non_masquerade_src_cidrs: Vec::new(),
        raw,
    }
}

/// Reads a file as upstream does, bounded (see [`read_file`]).
fn read_bytes(path: &Path) -> Result<Vec<u8>, ConfigError> {
    read_file(path).map_err(|(op, cause)| ConfigError::Read {
        op,
        path: path.to_path_buf(),
        cause,
    })
}

/// Converts a file's bytes to JSON as upstream does; a file holding no document is refused
/// (see [`ConfigError::Empty`]).
fn to_document(path: &Path, bytes: &[u8]) -> Result<JsonValue, ConfigError> {
    match goyaml::to_json(bytes).map_err(ConfigError::Syntax)? {
        JsonValue::Null => Err(ConfigError::Empty {
            path: path.to_path_buf(),
        }),
        document => Ok(document),
    }
}

fn read_document(path: &Path) -> Result<JsonValue, ConfigError> {
    to_document(path, &read_bytes(path)?)
}

/// Whether the config file is absent, which means defaults.
fn is_missing(path: &Path) -> bool {
    matches!(fs::metadata(path), Err(error) if error.kind() == io::ErrorKind::NotFound)
}

/// Upstream's `syncConfig`: a missing file means defaults; anything else must read, convert,
/// decode over the defaults, and validate.
fn load_file(path: &Path, options: &ReadOptions) -> Result<EffectiveConfig, ConfigError> {
    if is_missing(path) {
        let origin = ConfigOrigin::MissingFile(path.to_path_buf());
        return Ok(defaults(origin, options, super::DEFAULT_RESYNC_INTERVAL));
    }
    file_config(path, &read_bytes(path)?, options)
}

/// The config of a file's `bytes`: converted, decoded over the defaults, and validated.
fn file_config(
    path: &Path,
    bytes: &[u8],
    options: &ReadOptions,
) -> Result<EffectiveConfig, ConfigError> {
    let document = to_document(path, bytes)?;
    let base = MasqConfig::defaults(options.nomasq_all_reserved_ranges);
    let lists_non_masquerade = decode::sets_non_masquerade_cidrs(&document);
    let raw = decode::decode_upstream(document, base).map_err(ConfigError::Decode)?;
    let lists = CidrLists {
        non_masquerade: raw.non_masquerade_cidrs.as_deref().unwrap_or_default(),
        masquerade: raw.masquerade_cidrs.as_deref().unwrap_or_default(),
        non_masquerade_src: raw.non_masquerade_src_cidrs.as_deref().unwrap_or_default(),
    };
    // The non-masquerade entries of a file without the key are upstream's defaults: their
    // origin says so, in `explain` and in the error naming a prefix also masqueraded.
    let non_masquerade_origin = if lists_non_masquerade {
        CidrOrigin::file(path)
    } else {
        CidrOrigin::Default
    };
    let valid = validate_lists(
        lists,
        raw.cidr_limit,
        options.enable_ipv6,
        [non_masquerade_origin, CidrOrigin::file(path)],
    )
    .and_then(|valid| {
        check_not_in_both(&valid.non_masquerade, &valid.masquerade)?;
        Ok(valid)
    })
    .map_err(ConfigError::Invalid)?;
    let origin = ConfigOrigin::File(path.to_path_buf());
    Ok(EffectiveConfig {
        origin,
        cidrs: valid.non_masquerade,
        masquerade_cidrs: valid.masquerade,
        non_masquerade_src_cidrs: valid.non_masquerade_src,
        raw,
    })
}

/// The Azure agent's `syncConfig`: every `ip-masq*` entry of the directory, in name order, each
/// decoded into an empty config and validated on its own, then merged.
fn load_directory(dir: &Path, options: &ReadOptions) -> Result<EffectiveConfig, ConfigError> {
    let unlistable = |cause| ConfigError::ReadDir {
        dir: dir.to_path_buf(),
        cause,
    };
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(unlistable)? {
        if let Some(name) = entry.map_err(unlistable)?.file_name().to_str()
            && name.starts_with(CONFIG_FILE_PREFIX)
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    if names.is_empty() {
        let origin = ConfigOrigin::NoMatchingFiles(dir.to_path_buf());
        return Ok(defaults(origin, options, options.resync_interval));
    }

    let mut merged = ValidLists::default();
    let mut seen = [HashSet::new(), HashSet::new(), HashSet::new()];
    let (mut masq_link_local, mut masq_link_local_ipv6) = (false, false);
    for name in &names {
        let path = dir.join(name);
        let in_file = |error| match error {
            ConfigError::Empty { .. } => error,
            error => ConfigError::DirFile {
                name: name.clone(),
                cause: Box::new(error),
            },
        };
        let document = read_document(&path).map_err(in_file)?;
        let file =
            decode::decode_azure(document).map_err(|error| in_file(ConfigError::Decode(error)))?;
        let lists = CidrLists {
            non_masquerade: &file.non_masquerade_cidrs,
            masquerade: &file.masquerade_cidrs,
            non_masquerade_src: &file.non_masquerade_src_cidrs,
        };
        let origin = CidrOrigin::file(&path);
        let valid = validate_lists(
            lists,
            AZURE_CIDR_LIMIT,
            options.enable_ipv6,
            [origin, origin],
        )
        .map_err(|error| in_file(ConfigError::Invalid(error)))?;
        // The Azure agent deduplicates identical strings (its order is random; ours is the
        // order files and entries were read in). masq's own lists are merged the same way.
        for ((list, into), seen) in [
            (valid.non_masquerade, &mut merged.non_masquerade),
            (valid.masquerade, &mut merged.masquerade),
            (valid.non_masquerade_src, &mut merged.non_masquerade_src),
        ]
        .into_iter()
        .zip(&mut seen)
        {
            for sourced in list {
                // Equal texts parse to equal CIDRs, so the set compares the texts.
                if seen.insert(sourced.cidr.clone()) {
                    into.push(sourced);
                }
            }
        }
        masq_link_local |= file.masq_link_local;
        masq_link_local_ipv6 |= file.masq_link_local_ipv6;
    }
    // One file may masquerade what another keeps: that is refused like within one file.
    check_not_in_both(&merged.non_masquerade, &merged.masquerade).map_err(ConfigError::Invalid)?;
    // The Azure agent appends every file's list to a nil one, which stays nil when no file
    // lists a CIDR.
    let texts = |list: &[SourcedCidr]| -> Vec<CidrText> {
        list.iter()
            .map(|sourced| sourced.cidr.text().clone())
            .collect()
    };
    let non_empty = |texts: Vec<CidrText>| (!texts.is_empty()).then_some(texts);
    let raw = MasqConfig {
        non_masquerade_cidrs: non_empty(texts(&merged.non_masquerade)),
        cidr_limit: AZURE_CIDR_LIMIT,
        masq_link_local,
        masq_link_local_ipv6,
        resync_interval: options.resync_interval,
        masquerade_cidrs: non_empty(texts(&merged.masquerade)),
        non_masquerade_src_cidrs: non_empty(texts(&merged.non_masquerade_src)),
    };
    let origin = ConfigOrigin::Directory {
        dir: dir.to_path_buf(),
        files: names,
    };
    Ok(EffectiveConfig {
        origin,
        cidrs: merged.non_masquerade,
        masquerade_cidrs: merged.masquerade,
        non_masquerade_src_cidrs: merged.non_masquerade_src,
        raw,
    })
}

/// A file-mode config holding `cidrs` (as defaults) for the unit tests of the modules that
/// consume configs.
#[cfg(test)]
pub(crate) fn test_config(
    cidrs: &[&str],
    masq_link_local: bool,
    masq_link_local_ipv6: bool,
) -> EffectiveConfig {
    EffectiveConfig {
        origin: ConfigOrigin::File(super::DEFAULT_CONFIG_FILE.into()),
        cidrs: cidrs
            .iter()
            .filter_map(|text| Cidr::parse(text).ok())
            .map(|cidr| SourcedCidr {
                cidr,
                origin: CidrOrigin::Default,
            })
            .collect(),
        masquerade_cidrs: Vec::new(),
        non_masquerade_src_cidrs: Vec::new(),
        raw: MasqConfig {
            masq_link_local,
            masq_link_local_ipv6,
            ..MasqConfig::defaults(false)
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::{super::DEFAULT_NON_MASQUERADE_CIDRS, *};

    const OPTIONS: ReadOptions = ReadOptions {
        nomasq_all_reserved_ranges: false,
        enable_ipv6: false,
        resync_interval: GoDuration::from_secs(60),
    };

    fn texts(config: &EffectiveConfig) -> Vec<&str> {
        config
            .cidrs
            .iter()
            .map(|sourced| sourced.cidr.as_str())
            .collect()
    }

    #[test]
    fn a_missing_file_means_defaults() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("absent");
        let config = load(&ConfigSource::File(path.clone()), &OPTIONS).expect("defaults");
        assert_eq!(config.origin, ConfigOrigin::MissingFile(path.clone()));
        assert_eq!(texts(&config), DEFAULT_NON_MASQUERADE_CIDRS);
        let reserved = ReadOptions {
            nomasq_all_reserved_ranges: true,
            ..OPTIONS
        };
        let config = load(&ConfigSource::File(path), &reserved).expect("defaults");
        assert_eq!(config.cidrs.len(), 11);
    }

    #[test]
    fn files_holding_no_document_are_refused() {
        // Go reads them as the defaults; the corpus (tests/go-oracle) checks that masq refuses
        // every such file, this the words it refuses them with.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ip-masq-agent");
        fs::write(&path, "# only a comment\n").expect("write");
        let error = load(&ConfigSource::File(path), &OPTIONS).map(|_| ());
        let error = error.map_err(|error| error.to_string());
        assert!(
            matches!(&error, Err(text) if text.contains("is empty; keeping the config in force")),
            "{error:?}"
        );
    }

    #[test]
    fn unreadable_files_report_go_path_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = load(&ConfigSource::File(dir.path().to_path_buf()), &OPTIONS).map(|_| ());
        let message = error.map_err(|error| error.to_string());
        assert_eq!(
            message,
            Err(format!("read {}: is a directory", dir.path().display()))
        );
    }

    #[test]
    fn odd_and_oversized_files_are_refused_without_reading_them_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let huge = dir.path().join("huge");
        let file = File::create(&huge).expect("create");
        // Sparse: 50 MB that take no disk.
        file.set_len(50 << 20).expect("set_len");
        let cases = [
            (fifo, "open", "not a regular file (a FIFO)"),
            (
                PathBuf::from("/dev/zero"),
                "open",
                "not a regular file (a device)",
            ),
            (
                huge,
                "read",
                "52428800 bytes is more than a ConfigMap holds (1048576 bytes)",
            ),
        ];
        for (path, op, cause) in cases {
            let started = std::time::Instant::now();
            let error = load(&ConfigSource::File(path.clone()), &OPTIONS)
                .map(|_| ())
                .map_err(|error| (error.reason(), error.to_string()));
            assert_eq!(
                error,
                Err(("read", format!("{op} {}: {cause}", path.display())))
            );
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "{path:?} blocked"
            );
        }
        let at_limit = dir.path().join("at-limit");
        let mut text = b"nonMasqueradeCIDRs: [10.0.0.0/8]\n".to_vec();
        text.resize(MAX_CONFIG_BYTES as usize, b'\n');
        fs::write(&at_limit, text).expect("write");
        assert!(load(&ConfigSource::File(at_limit), &OPTIONS).is_ok());
    }

    /// Files off disk and memory filesystems are read on a helper thread: a read that hangs
    /// is given up after the timeout, and not tried again while it still hangs. (A FIFO opened
    /// for writing too stands in for a hung network filesystem: reading it blocks forever.)
    #[test]
    fn reads_that_hang_are_given_up_and_not_repeated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let regular = dir.path().join("regular");
        fs::write(&regular, "cidrLimit: 3\n").expect("write");
        assert!(on_local_filesystem(&File::open(&regular).expect("open")));
        let read = read_with_timeout(&regular, File::open(&regular).expect("open"));
        assert_eq!(read.expect("read"), b"cidrLimit: 3\n");

        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let open = || {
            File::options()
                .read(true)
                .write(true)
                .open(&fifo)
                .expect("open")
        };
        let started = std::time::Instant::now();
        let error = read_with_timeout(&fifo, open()).expect_err("a read that hangs");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= READ_TIMEOUT);
        let started = std::time::Instant::now();
        let again = read_with_timeout(&fifo, open()).expect_err("refused");
        assert!(again.to_string().contains("still hangs"), "{again}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    fn write_configmap(dir: &Path, files: &[(&str, &str)], generation: &str) {
        // The kubelet's layout: real files in a timestamped directory, `..data` pointing at it,
        // and one symlink per key through `..data`.
        let data_dir = dir.join(generation);
        fs::create_dir(&data_dir).expect("data dir");
        for (name, contents) in files {
            fs::write(data_dir.join(name), contents).expect("write");
        }
        let temporary = dir.join("..data_tmp");
        symlink(generation, &temporary).expect("symlink");
        fs::rename(&temporary, dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let link = dir.join(name);
            if fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(name), &link).expect("key symlink");
            }
        }
    }

    #[test]
    fn directory_mode_merges_like_azure() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_configmap(
            dir.path(),
            &[
                (
                    "ip-masq-agent",
                    "nonMasqueradeCIDRs: [172.16.0.0/12, 10.0.0.0/8]\ncidrLimit: 1\n",
                ),
                (
                    "ip-masq-agent-reconciled",
                    "nonMasqueradeCIDRs: [1.0.0.0/8, 10.0.0.0/8]\nmasqLinkLocal: true\n",
                ),
                ("bad-prefix", "nonMasqueradeCIDRs: [9.0.0.0/8]\n"),
            ],
            "..2026_11_22_01_02_03.123",
        );
        let options = ReadOptions {
            resync_interval: GoDuration::from_secs(30),
            ..OPTIONS
        };
        let config =
            load(&ConfigSource::Directory(dir.path().to_path_buf()), &options).expect("valid");
        assert_eq!(texts(&config), ["172.16.0.0/12", "10.0.0.0/8", "1.0.0.0/8"]);
        assert!(config.raw.masq_link_local);
        assert_eq!(config.raw.resync_interval.to_string(), "30s");
        match &config.origin {
            ConfigOrigin::Directory { files, .. } => {
                assert_eq!(files, &["ip-masq-agent", "ip-masq-agent-reconciled"]);
            }
            other => panic!("unexpected origin {other:?}"),
        }
    }

    #[test]
    fn directory_mode_defaults_only_without_matching_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(
            dir.path().join("bad-prefix-config-0"),
            "nonMasqueradeCIDRs: [9.0.0.0/8]\n",
        )
        .expect("write");
        let config =
            load(&ConfigSource::Directory(dir.path().to_path_buf()), &OPTIONS).expect("defaults");
        assert_eq!(texts(&config), DEFAULT_NON_MASQUERADE_CIDRS);
        fs::write(dir.path().join("ip-masq-config-0"), "masqLinkLocal: true\n").expect("write");
        fs::write(dir.path().join("ip-masq-config-1"), "# nothing yet\n").expect("write");
        let error = load(&ConfigSource::Directory(dir.path().to_path_buf()), &OPTIONS).map(|_| ());
        assert!(matches!(error, Err(ConfigError::Empty { .. })), "{error:?}");
        fs::remove_file(dir.path().join("ip-masq-config-1")).expect("remove");
        let config =
            load(&ConfigSource::Directory(dir.path().to_path_buf()), &OPTIONS).expect("valid");
        assert!(
            config.cidrs.is_empty(),
            "a matching file without CIDRs means no exempt CIDRs"
        );
    }

    #[test]
    fn directory_mode_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let check = |name: &str, contents: &str, expected: &str| {
            let file = root.join(name);
            fs::write(&file, contents).expect("write");
            let error = load(&ConfigSource::Directory(root.clone()), &OPTIONS)
                .map(|_| ())
                .map_err(|e| e.to_string());
            fs::remove_file(&file).expect("cleanup");
            assert_eq!(error, Err(expected.to_owned()), "{contents}");
        };
        check(
            "ip-masq-config-0",
            "{*",
            r#"failed to unmarshal config file "ip-masq-config-0", error: invalid character '*' looking for beginning of object key string"#,
        );
        check(
            "ip-masq-config-0",
            "*",
            r#"failed to convert config file "ip-masq-config-0" to JSON, error: yaml: did not find expected alphabetic or numeric character"#,
        );
        check(
            "ip-masq-config-0",
            "nonMasqueradeCIDRs:\n  -\n",
            r#"config file "ip-masq-config-0" is invalid: CIDR "" could not be parsed, invalid CIDR address: "#,
        );
        let missing = root.join("missing");
        let error = load(&ConfigSource::Directory(missing.clone()), &OPTIONS)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            error,
            Err(format!(
                "failed to read config directory, error: open {}: no such file or directory",
                missing.display()
            ))
        );
    }

    #[test]
    fn masq_keys_are_read_counted_and_checked_against_each_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ip-masq-agent");
        let read = |contents: &str| {
            fs::write(&path, contents).expect("write");
            load(&ConfigSource::File(path.clone()), &OPTIONS).map_err(|error| error.to_string())
        };
        let config =
            read("masqueradeCIDRs: [10.100.10.0/24]\nnonMasqueradeSrcCIDRs: [100.64.0.0/16]\n")
                .expect("valid");
        // The defaults stay, with their origin: the file did not list them.
        assert_eq!(texts(&config), DEFAULT_NON_MASQUERADE_CIDRS);
        assert!(
            config
                .cidrs
                .iter()
                .all(|sourced| sourced.origin == CidrOrigin::Default)
        );
        assert_eq!(config.masquerade_cidrs[0].origin, CidrOrigin::file(&path));
        assert_eq!(
            config.non_masquerade_src_cidrs[0].cidr.as_str(),
            "100.64.0.0/16"
        );
        assert!(
            config.raw.to_go_json().ends_with(
                r#""resyncInterval":"1m0s","masqueradeCIDRs":["10.100.10.0/24"],"nonMasqueradeSrcCIDRs":["100.64.0.0/16"]}"#
            ),
            "{}",
            config.raw.to_go_json()
        );
        // Without the keys, upstream's log line exactly.
        let plain = read("nonMasqueradeCIDRs: [10.0.0.0/8]\n").expect("valid");
        assert_eq!(
            plain.raw.to_go_json(),
            r#"{"nonMasqueradeCIDRs":["10.0.0.0/8"],"cidrLimit":64,"masqLinkLocal":false,"masqLinkLocalIPv6":false,"resyncInterval":"1m0s"}"#
        );
        // cidrLimit counts every list (the 3 defaults and 2 more).
        assert_eq!(
            read("cidrLimit: 4\nmasqueradeCIDRs: [10.1.0.0/16]\nnonMasqueradeSrcCIDRs: [100.64.0.0/16]\n"),
            Err("the daemon can only accept up to 4 CIDRs (excluding link-local), but got 5 CIDRs (excluding link local)".to_owned())
        );
        // nonMasqueradeCIDRs is validated first, as upstream does.
        assert_eq!(
            read("masqueradeCIDRs: [bad]\nnonMasqueradeCIDRs: [10.0.0.1/8]\n"),
            Err(r#"CIDR "10.0.0.1/8" is not aligned to a CIDR block, ip: "10.0.0.1" network: "10.0.0.0/8""#.to_owned())
        );
        assert_eq!(
            read("nonMasqueradeSrcCIDRs: [2001:db8::/32]\n"),
            Err("ipv6 is not enabled, but ipv6 cidr 2001:db8::/32 provided. Enable ipv6 using --enable-ipv6 agent flag".to_owned())
        );
        let both = read("masqueradeCIDRs: [172.16.0.0/12]\n").expect_err("in both");
        assert!(
            both.starts_with(&format!(
                r#"CIDR "172.16.0.0/12" is listed in both masqueradeCIDRs ({}) and nonMasqueradeCIDRs as "172.16.0.0/12" (default)"#,
                path.display()
            )),
            "{both}"
        );
        // A null list is no list; an explicit empty one is logged as such.
        let null = read("masqueradeCIDRs: null\nnonMasqueradeSrcCIDRs: []\n").expect("valid");
        assert!(null.masquerade_cidrs.is_empty() && null.non_masquerade_src_cidrs.is_empty());
        assert!(
            null.raw
                .to_go_json()
                .ends_with(r#","nonMasqueradeSrcCIDRs":[]}"#)
        );
    }

    #[test]
    fn directory_mode_merges_masq_keys_and_refuses_a_clash_across_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_configmap(
            dir.path(),
            &[
                (
                    "ip-masq-a",
                    "nonMasqueradeCIDRs: [10.0.0.0/8]\nmasqueradeCIDRs: [10.1.0.0/16]\n",
                ),
                (
                    "ip-masq-b",
                    "masqueradeCIDRs: [10.1.0.0/16, 10.2.0.0/16]\nnonMasqueradeSrcCIDRs: [100.64.0.0/16]\n",
                ),
            ],
            "..2026_11_27_01_02_03.1",
        );
        let source = ConfigSource::Directory(dir.path().to_path_buf());
        let config = load(&source, &OPTIONS).expect("valid");
        let masquerade: Vec<&str> = config
            .masquerade_cidrs
            .iter()
            .map(|sourced| sourced.cidr.as_str())
            .collect();
        assert_eq!(
            masquerade,
            ["10.1.0.0/16", "10.2.0.0/16"],
            "merged, duplicates once"
        );
        assert_eq!(config.non_masquerade_src_cidrs.len(), 1);

        write_configmap(
            dir.path(),
            &[
                (
                    "ip-masq-a",
                    "nonMasqueradeCIDRs: [10.0.0.0/8, 10.2.0.0/16]\n",
                ),
                ("ip-masq-b", "masqueradeCIDRs: [10.2.0.0/16]\n"),
            ],
            "..2026_11_27_01_02_04.2",
        );
        let error = load(&source, &OPTIONS)
            .map(|_| ())
            .map_err(|error| error.to_string());
        let (a, b) = (dir.path().join("ip-masq-a"), dir.path().join("ip-masq-b"));
        assert_eq!(
            error,
            Err(format!(
                r#"CIDR "10.2.0.0/16" is listed in both masqueradeCIDRs ({}) and nonMasqueradeCIDRs as "10.2.0.0/16" ({}): the longest matching prefix decides, and one prefix cannot both masquerade and keep the pod's address; remove it from one list"#,
                b.display(),
                a.display()
            ))
        );
    }
}
