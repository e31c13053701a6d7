//! Re-reading a config file whose only change is in its CIDR list, without reading it whole.
//!
//! A ConfigMap of 10,000 CIDRs is edited one CIDR at a time, and the kubelet swaps in the whole
//! file: reading all of it again costs milliseconds, nearly all of it in the 9,999 CIDRs that
//! did not change. So the reader keeps the last file it read well, with where each list entry
//! sits in it ([`LastFile`]). When the new text differs from it only inside the list, and what
//! replaced the old entries is plain CIDR entries in the list's own style, only those are read
//! and validated, and the others are taken over from the last config.
//!
//! This is sound because it is confined to documents of go-compat's simple shape (`key: value`
//! lines at column 0, a list in flow style on one line or as `- item` lines) that libyaml
//! reads as go-compat's fast reader does: there, the meaning of a list entry is its text, and
//! an entry of letters, digits, `.`, `_` and a `/` is a string to YAML. Anything else (the
//! list emptied, a comment, quotes, another key changed) is read whole. Debug builds read every
//! file whole as well and check that both readings agree, and the tests compare them on edits
//! of every kind.

use std::{ops::Range, sync::Arc};

use super::{
    MasqConfig,
    cidr::{Cidr, CidrText, Family},
    source::{CidrOrigin, ConfigError, EffectiveConfig, SourcedCidr},
    validate::ValidationError,
};

/// The field whose list is re-read in place (keys match it as `encoding/json` does).
const LIST_KEY: &str = "nonMasqueradeCIDRs";

/// How the list is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    /// `key: [a, b, c]` on one line.
    Flow,
    /// `key:` then one `- a` line per entry, each indented by this many spaces.
    Block { indent: usize },
}

/// A file re-read in place: its config and what to remember of it, or why it is refused.
pub(super) type Reread = Result<(Arc<EffectiveConfig>, Option<LastFile>), ConfigError>;

/// The last file read well: its bytes, where its list entries are, and its config.
#[derive(Debug)]
pub(super) struct LastFile {
    bytes: Vec<u8>,
    style: Style,
    /// Each entry's text, in list order (byte offsets into `bytes`).
    entries: Vec<Range<u32>>,
    /// The origin every entry of the file shares.
    origin: CidrOrigin,
    config: Arc<EffectiveConfig>,
}

impl LastFile {
    /// Remembers `config`, read from `bytes`, if the file has the simple shape and its list
    /// entries are exactly the config's CIDRs.
    pub(super) fn new(bytes: Vec<u8>, config: Arc<EffectiveConfig>) -> Option<Self> {
        let (style, entries) = locate_list(&bytes)?;
        let texts = config.raw.non_masquerade_cidrs.as_ref()?;
        let agrees = entries.len() == texts.len()
            && entries.len() == config.cidrs.len()
            && entries
                .iter()
                .zip(texts)
                .all(|(span, text)| slice(&bytes, span) == Some(text.as_bytes()));
        let origin = config.cidrs.first()?.origin;
        agrees.then_some(Self {
            bytes,
            style,
            entries,
            origin,
            config,
        })
    }

    /// The config of `bytes` if they differ from the last file's only by list entries this
    /// module can read, with what to remember of them (nothing new when they are the same);
    /// `None` when the file must be read whole.
    pub(super) fn reread(&self, bytes: &[u8], enable_ipv6: bool) -> Option<Reread> {
        let old = &self.bytes;
        let prefix = common_prefix(old, bytes);
        let suffix = common_suffix(&old[prefix..], &bytes[prefix..]);
        if prefix == old.len() && prefix == bytes.len() {
            return Some(Ok((Arc::clone(&self.config), None)));
        }
        // The old entries whose bytes changed, widened by one byte on each side so that an
        // insertion at an entry's edge takes that entry along.
        let (changed_start, changed_end) = (prefix, old.len() - suffix);
        let first = self
            .unit_at(changed_start.saturating_sub(1))
            .or_else(|| self.unit_at(changed_start))?;
        let last = self
            .unit_at(changed_end)
            .or_else(|| self.unit_at(changed_end.checked_sub(1)?))?;
        if self.unit(first).start > changed_start || self.unit(last).end < changed_end {
            return None;
        }
        let (start, end) = (self.unit(first).start, self.unit(last).end);
        let new_end = bytes.len().checked_sub(old.len() - end)?;
        let region = bytes.get(start..new_end)?;
        let (texts, spans) = self.read_units(region, start, last + 1 == self.entries.len())?;
        let replaced = first..last + 1;
        if self.entries.len() - replaced.len() + texts.len() == 0 {
            // `key:` alone is null, `key: []` empty: read whole.
            return None;
        }
        let config = match self.splice(replaced.clone(), &texts, enable_ipv6) {
            Ok(config) => Arc::new(config),
            Err(error) => return Some(Err(error)),
        };
        // The entries after the replaced ones moved by the change in length (both files are
        // at most 1 MiB, see `locate_list`).
        let moved = i32::try_from(bytes.len()).ok()? - i32::try_from(old.len()).ok()?;
        let mut entries = Vec::with_capacity(config.cidrs.len());
        entries.extend_from_slice(&self.entries[..replaced.start]);
        entries.extend(spans);
        entries.extend(self.entries[replaced.end..].iter().map(|span| {
            span.start.wrapping_add_signed(moved)..span.end.wrapping_add_signed(moved)
        }));
        let remembered = Self {
            bytes: bytes.to_vec(),
            style: self.style,
            entries,
            origin: self.origin,
            config: Arc::clone(&config),
        };
        Some(Ok((config, Some(remembered))))
    }

    /// The bytes that belong to entry `index`: in flow style the entry and what separates it
    /// from the next; in block style its whole line.
    fn unit(&self, index: usize) -> Range<usize> {
        let span = |index: usize| {
            self.entries
                .get(index)
                .map(|span| span.start as usize..span.end as usize)
        };
        let Some(entry) = span(index) else {
            return 0..0;
        };
        match self.style {
            Style::Flow => entry.start..span(index + 1).map_or(entry.end, |next| next.start),
            Style::Block { indent } => entry.start - indent - 2..entry.end + 1,
        }
    }

    /// The entry whose unit holds byte `at`.
    fn unit_at(&self, at: usize) -> Option<usize> {
        let after = self
            .entries
            .partition_point(|span| self.unit_start(span) <= at);
        let index = after.checked_sub(1)?;
        (self.unit(index).contains(&at)).then_some(index)
    }

    fn unit_start(&self, span: &Range<u32>) -> usize {
        match self.style {
            Style::Flow => span.start as usize,
            Style::Block { indent } => span.start as usize - indent - 2,
        }
    }

    /// Reads `region`, the new text of whole units starting at byte `offset`, into entry
    /// texts and their spans. `at_end`: the region ends the list (in flow style, without a
    /// separator after its last entry).
    fn read_units(
        &self,
        region: &[u8],
        offset: usize,
        at_end: bool,
    ) -> Option<(Vec<CidrText>, Vec<Range<u32>>)> {
        let (mut texts, mut spans) = (Vec::new(), Vec::new());
        let mut push = |start: usize, text: &[u8]| -> Option<()> {
            let text = std::str::from_utf8(text)
                .ok()
                .filter(|text| is_entry(text))?;
            let start = offset + start;
            spans.push(u32::try_from(start).ok()?..u32::try_from(start + text.len()).ok()?);
            texts.push(CidrText::from(text));
            Some(())
        };
        match self.style {
            Style::Flow => {
                // Entries, each followed by `,` and spaces but for the list's last one.
                let (mut at, mut last_unseparated) = (0, false);
                while at < region.len() {
                    let end = memchr::memchr(b',', &region[at..])
                        .map_or(region.len(), |found| at + found);
                    push(at, &region[at..end])?;
                    last_unseparated = end == region.len();
                    at = end + 1;
                    at += region
                        .get(at..)
                        .unwrap_or_default()
                        .iter()
                        .take_while(|&&byte| byte == b' ')
                        .count();
                }
                if last_unseparated != at_end {
                    return None;
                }
            }
            Style::Block { indent } => {
                let mut at = 0;
                while at < region.len() {
                    let line_end = at + region[at..].iter().position(|&byte| byte == b'\n')?;
                    let line = &region[at..line_end];
                    let (spaces, rest) = line.split_at_checked(indent)?;
                    let text = rest.strip_prefix(b"- ")?;
                    if spaces.iter().any(|&byte| byte != b' ') {
                        return None;
                    }
                    push(at + indent + 2, text)?;
                    at = line_end + 1;
                }
            }
        }
        Some((texts, spans))
    }

    /// The last config with the entries `replaced` replaced by `texts`, validated as
    /// upstream validates a list: the count first, then each entry in order. The entries kept
    /// were valid before, so the first failure is among the new ones.
    fn splice(
        &self,
        replaced: Range<usize>,
        texts: &[CidrText],
        enable_ipv6: bool,
    ) -> Result<EffectiveConfig, ConfigError> {
        let old = &*self.config;
        let count = old.cidrs.len() - replaced.len() + texts.len();
        let limit = old.raw.cidr_limit;
        if i64::try_from(count).map_or(true, |count| count > limit) {
            return Err(ConfigError::Invalid(ValidationError::TooManyCidrs {
                limit,
                count,
            }));
        }
        let mut fresh = Vec::with_capacity(texts.len());
        for text in texts {
            let cidr = Cidr::parse(text).map_err(|error| ConfigError::Invalid(error.into()))?;
            if !enable_ipv6 && cidr.family() == Family::Ipv6 {
                return Err(ConfigError::Invalid(ValidationError::Ipv6NotEnabled {
                    cidr: text.to_string(),
                }));
            }
            fresh.push(SourcedCidr {
                cidr,
                origin: self.origin,
            });
        }
        // Both lists share every chunk the change does not touch with the last config.
        let cidrs = old.cidrs.spliced(replaced.clone(), fresh);
        let old_texts = old.raw.non_masquerade_cidrs.as_ref();
        let list = old_texts.map_or_else(
            || texts.iter().cloned().collect(),
            |old_texts| old_texts.spliced(replaced, texts.iter().cloned()),
        );
        let raw = MasqConfig {
            non_masquerade_cidrs: Some(list),
            ..old.raw.without_cidrs()
        };
        Ok(EffectiveConfig {
            origin: old.origin.clone(),
            cidrs,
            raw,
        })
    }
}

fn slice<'b>(bytes: &'b [u8], span: &Range<u32>) -> Option<&'b [u8]> {
    bytes.get(span.start as usize..span.end as usize)
}

/// An entry read in place: go-compat's plain scalar characters, and a `/`, which makes it a
/// string to YAML (no number, boolean, null or timestamp has one).
fn is_entry(text: &str) -> bool {
    is_plain(text.as_bytes()) && text.contains('/')
}

/// go-compat's plain scalar: letters, digits, `.`, `/` and `_`, at least one.
fn is_plain(text: &[u8]) -> bool {
    let plain = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'/' | b'_');
    !text.is_empty() && every(text, plain)
}

/// `bytes.iter().all(test)` without the early exit, so that the loop is vectorized: a config
/// is checked a byte at a time at a fraction of the cost.
fn every(bytes: &[u8], test: impl Fn(u8) -> bool) -> bool {
    bytes.iter().fold(true, |all, &byte| all & test(byte))
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    // Compared a chunk at a time: a 1 MiB file takes microseconds.
    let whole: usize = a
        .chunks(64)
        .zip(b.chunks(64))
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a.len())
        .sum();
    whole
        + a[whole..]
            .iter()
            .zip(&b[whole..])
            .take_while(|(a, b)| a == b)
            .count()
}

fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let whole: usize = a
        .rchunks(64)
        .zip(b.rchunks(64))
        .take_while(|(a, b)| a == b)
        .map(|(a, _)| a.len())
        .sum();
    let (a, b) = (&a[..a.len() - whole], &b[..b.len() - whole]);
    whole
        + a.iter()
            .rev()
            .zip(b.iter().rev())
            .take_while(|(a, b)| a == b)
            .count()
}

/// The list of [`LIST_KEY`] in a document of go-compat's simple shape, and the span of each
/// entry; `None` for any other document, or when no key or several keys name the list.
fn locate_list(bytes: &[u8]) -> Option<(Style, Vec<Range<u32>>)> {
    if !every(bytes, |byte| byte == b'\n' || (0x20..0x7f).contains(&byte))
        || u32::try_from(bytes.len()).is_err()
    {
        return None;
    }
    let plain = is_plain;
    let mut lines = Vec::new();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', bytes)
        .chain((bytes.last() != Some(&b'\n')).then_some(bytes.len()))
    {
        lines.push(start..end);
        start = end + 1;
    }
    let mut found = None;
    let mut index = 0;
    while let Some(line) = lines.get(index).cloned() {
        index += 1;
        let text = &bytes[line.clone()];
        if text.is_empty() {
            continue;
        }
        let colon = text.iter().position(|&byte| byte == b':')?;
        let (key, rest) = (&text[..colon], &text[colon + 1..]);
        if key.len() > 64 || !key.iter().all(u8::is_ascii_alphanumeric) || key.is_empty() {
            return None;
        }
        let is_list = key.eq_ignore_ascii_case(LIST_KEY.as_bytes());
        let mut entries = Vec::new();
        let style = if rest.is_empty() {
            // Block items, all at one indentation, each line ending with a line feed.
            let mut indent = None;
            while let Some(item) = lines.get(index) {
                let text = &bytes[item.clone()];
                let spaces = text.iter().take_while(|&&byte| byte == b' ').count();
                let Some(scalar) = text[spaces..].strip_prefix(b"- ") else {
                    break;
                };
                if *indent.get_or_insert(spaces) != spaces || !plain(scalar) {
                    return None;
                }
                let at = item.start + spaces + 2;
                entries.push(at as u32..item.end as u32);
                if item.end == bytes.len() {
                    // The last line has no line feed: an entry added after it would need one.
                    if is_list {
                        return None;
                    }
                }
                index += 1;
            }
            Style::Block { indent: indent? }
        } else if let Some(list) = rest.strip_prefix(b" [") {
            let list = list.strip_suffix(b"]")?;
            let list_start = line.start + colon + 3;
            if !list.is_empty() {
                let mut at = 0;
                let commas = memchr::memchr_iter(b',', list).chain([list.len()]);
                for end in commas {
                    let item = &list[at..end];
                    let leading = item.iter().take_while(|&&byte| byte == b' ').count();
                    let trailing = item.iter().rev().take_while(|&&byte| byte == b' ').count();
                    let scalar = item.get(leading..item.len().checked_sub(trailing)?)?;
                    if !plain(scalar) {
                        return None;
                    }
                    let start = list_start + at + leading;
                    entries.push(start as u32..(start + scalar.len()) as u32);
                    at = end + 1;
                }
            }
            Style::Flow
        } else if plain(rest.strip_prefix(b" ")?) {
            continue;
        } else {
            return None;
        };
        if is_list {
            if found.is_some() {
                return None;
            }
            found = Some((style, entries));
        }
    }
    found.filter(|(_, entries)| !entries.is_empty())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{
        GoDuration,
        source::{ConfigReader, ConfigSource, ReadOptions, load},
    };

    const OPTIONS: ReadOptions = ReadOptions {
        nomasq_all_reserved_ranges: false,
        enable_ipv6: false,
        resync_interval: GoDuration::from_secs(60),
    };

    fn entries(count: usize) -> Vec<String> {
        (0..count)
            .map(|index| format!("10.{index}.0.0/16"))
            .collect()
    }

    /// A config listing `entries` in flow style (`None`) or in block style at an indentation.
    fn document(entries: &[String], block_indent: Option<usize>) -> String {
        let list = match block_indent {
            None => format!(" [{}]\n", entries.join(", ")),
            Some(indent) => {
                entries
                    .iter()
                    .map(|entry| format!("\n{}- {entry}", " ".repeat(indent)))
                    .collect::<String>()
                    + "\n"
            }
        };
        format!("cidrLimit: 40\nnonMasqueradeCIDRs:{list}masqLinkLocal: true\n")
    }

    /// Writes `text` and reads it with `reader` and whole; both must agree. Whether `reader`
    /// read it in place.
    fn read_and_compare(reader: &mut ConfigReader, path: &Path, text: &str) -> bool {
        std::fs::write(path, text).expect("write");
        let before = reader.reads_in_place();
        let incremental = reader.load();
        let whole = load(&ConfigSource::File(path.to_path_buf()), &OPTIONS);
        match (&incremental, &whole) {
            (Ok(incremental), Ok(whole)) => assert_eq!(**incremental, *whole, "{text}"),
            _ => assert_eq!(
                incremental.as_ref().err().map(ToString::to_string),
                whole.as_ref().err().map(ToString::to_string),
                "{text}"
            ),
        }
        reader.reads_in_place() > before
    }

    fn reader() -> (tempfile::TempDir, std::path::PathBuf, ConfigReader) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ip-masq-agent");
        let reader = ConfigReader::new(ConfigSource::File(path.clone()), OPTIONS);
        (dir, path, reader)
    }

    type Edit = fn(&mut Vec<String>);

    /// Edits of the list the kubelet may hand over, good and bad.
    const EDITS: &[(&str, Edit)] = &[
        ("change the first", |list| list[0] = "11.0.0.0/8".into()),
        ("change one inside", |list| {
            list[3] = "192.168.7.0/24".into();
        }),
        ("change the last", |list| {
            *list.last_mut().unwrap() = "100.64.0.0/10".into();
        }),
        ("insert first", |list| {
            list.insert(0, "198.18.0.0/15".into());
        }),
        ("insert inside", |list| {
            list.insert(2, "203.0.113.0/24".into());
        }),
        ("append", |list| list.push("192.0.2.0/24".into())),
        ("remove the first", |list| drop(list.remove(0))),
        ("remove one inside", |list| drop(list.remove(2))),
        ("remove the last", |list| drop(list.pop())),
        ("replace two by three", |list| {
            list.splice(
                1..3,
                ["1.0.0.0/8", "2.0.0.0/8", "3.0.0.0/8"].map(String::from),
            );
        }),
        ("a duplicate", |list| list.push(list[0].clone())),
        ("not aligned", |list| list[1] = "10.1.2.3/16".into()),
        ("unparsable", |list| list[2] = "10.1.2/16".into()),
        ("a bad prefix", |list| list[2] = "10.0.0.0/33".into()),
        ("over the limit", |list| list.extend(entries(40))),
        ("back to good", |list| *list = entries(8)),
    ];

    #[test]
    fn list_edits_are_read_in_place_and_as_a_whole_read_reads_them() {
        for block_indent in [None, Some(0), Some(2)] {
            let (_dir, path, mut reader) = reader();
            let mut list = entries(8);
            assert!(!read_and_compare(
                &mut reader,
                &path,
                &document(&list, block_indent)
            ));
            for (what, edit) in EDITS {
                let mut edited = list.clone();
                edit(&mut edited);
                let text = document(&edited, block_indent);
                assert!(
                    read_and_compare(&mut reader, &path, &text),
                    "{what}: {text}"
                );
                if reader.load().is_ok() {
                    list = edited;
                }
            }
            // The same file again costs nothing.
            let text = document(&list, block_indent);
            assert!(read_and_compare(&mut reader, &path, &text));
        }
    }

    #[test]
    fn other_changes_are_read_whole() {
        let list = entries(8);
        let flow = document(&list, None);
        let changes = [
            flow.replace("cidrLimit: 40", "cidrLimit: 4"),
            flow.replace("masqLinkLocal: true", "masqLinkLocal: false"),
            flow.replace("10.3.0.0/16", "'10.3.0.0/16'"),
            flow.replace("10.3.0.0/16", "10.3.0.0/16 # a comment"),
            flow.replace("10.3.0.0/16", "2001:db8::/32"),
            flow.replace("10.3.0.0/16", "1234"),
            flow.replace(&list.join(", "), ""),
            // Valid YAML that the in-place reader leaves to the whole read.
            flow.replace("10.7.0.0/16]", "10.7.0.0/16, ]"),
            flow.replace("[10.0.0.0/16", "[ 10.0.0.0/16"),
            document(&list, Some(2)),
            document(&["fd00::/8".into()], Some(2)),
        ];
        for text in changes {
            let (_dir, path, mut reader) = reader();
            read_and_compare(&mut reader, &path, &flow);
            assert!(!read_and_compare(&mut reader, &path, &text), "{text}");
        }
        // A block list emptied is null, not an empty list.
        let (_dir, path, mut reader) = reader();
        let block = document(&entries(1), Some(2));
        read_and_compare(&mut reader, &path, &block);
        let emptied = block.replace("\n  - 10.0.0.0/16", "");
        assert!(!read_and_compare(&mut reader, &path, &emptied));
    }

    /// Random edits, chained: of the list (entries replaced, inserted or removed, good and bad)
    /// and of random bytes anywhere. Whatever they make of the file, reading in place agrees
    /// with reading whole, and the list edits are read in place.
    #[test]
    fn random_edits_agree_with_whole_reads() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut random = move |below: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % below as u64) as usize
        };
        const ALPHABET: &[u8] = b"0123456789./, -\n#a:_[]'";
        let (mut in_place, mut list_edits) = (0, 0);
        for round in 0..60 {
            let (_dir, path, mut reader) = reader();
            let block_indent = [None, Some(0), Some(2)][round % 3];
            let mut list = entries(1 + random(12));
            read_and_compare(&mut reader, &path, &document(&list, block_indent));
            for _ in 0..15 {
                if random(4) == 0 {
                    let mut text = document(&list, block_indent).into_bytes();
                    let at = random(text.len() + 1);
                    let removed = random(6).min(text.len() - at);
                    let inserted = (0..random(8)).map(|_| ALPHABET[random(ALPHABET.len())]);
                    text.splice(at..at + removed, inserted);
                    if let Ok(text) = String::from_utf8(text) {
                        read_and_compare(&mut reader, &path, &text);
                    }
                    continue;
                }
                // Aligned or not, or a prefix too long.
                let entry = format!(
                    "{}.{}.{}.0/{}",
                    1 + random(250),
                    random(256),
                    [0, 0, 0, 1][random(4)],
                    [8, 16, 24, 33][random(4)]
                );
                let at = random(list.len() + 1);
                match random(3) {
                    0 if at < list.len() => list[at] = entry,
                    1 if list.len() > 1 && at < list.len() => drop(list.remove(at)),
                    _ => list.insert(at, entry),
                }
                list_edits += 1;
                let text = document(&list, block_indent);
                in_place += usize::from(read_and_compare(&mut reader, &path, &text));
            }
        }
        // Not every one: after a random byte edit the last file read well may be older.
        assert!(
            in_place * 10 > list_edits * 7,
            "{in_place} of {list_edits} list edits read in place"
        );
    }
}
