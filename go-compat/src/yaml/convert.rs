//! go-yaml v2's decoder into `interface{}` (scalar resolution, merge keys, aliases) and
//! sigs.k8s.io/yaml's conversion of the result to JSON, as upstream runs them.

use std::collections::{BTreeMap, HashMap, hash_map::Entry};

use base64::{
    Engine as _, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};

use super::{SECONDARY_TAG_PREFIX, YamlError, decode_error};
use crate::{
    json::{JsonValue, go_string_from_bytes},
    strconv::{format_g, format_json_float, parse_float, parse_int, parse_uint, quote},
};

/// Index of a node in [`Doc::nodes`].
pub(super) type NodeId = usize;

/// A node of the first document, as go-yaml's parser builds it.
#[derive(Debug)]
pub(super) enum Node {
    Scalar {
        value: String,
        tag: String,
        implicit: bool,
    },
    Sequence(Vec<NodeId>),
    /// Keys and values alternate.
    Mapping(Vec<NodeId>),
    Alias {
        name: String,
        target: NodeId,
    },
}

/// The node tree of a document.
#[derive(Debug)]
pub(super) struct Doc {
    pub(super) nodes: Vec<Node>,
    pub(super) root: NodeId,
}

/// A Go value as go-yaml produces it for an `interface{}` target.
#[derive(Clone, Debug)]
pub(super) enum GoVal {
    Nil,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<GoVal>),
    /// Boxed: a value is then as small as a [`JsonValue`], so a long sequence is converted
    /// in place.
    Map(Box<GoMap>),
}

/// Hashable identity of a scalar Go map key (`interface{}` equality).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum KeyId {
    Nil,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(u64),
    Str(String),
}

/// A `map[interface{}]interface{}`: insertion order is kept only to make the unspecified
/// parts of Go's behaviour (key collisions after stringification) deterministic.
#[derive(Clone, Debug, Default)]
pub(super) struct GoMap {
    entries: Vec<(GoVal, GoVal)>,
    index: HashMap<KeyId, usize>,
}

impl GoMap {
    fn key_id(k: &GoVal) -> Option<KeyId> {
        Some(match k {
            GoVal::Nil => KeyId::Nil,
            GoVal::Bool(b) => KeyId::Bool(*b),
            GoVal::Int(i) => KeyId::Int(*i),
            GoVal::Uint(u) => KeyId::Uint(*u),
            // NaN never equals itself, so every NaN key is a new entry; -0 == +0.
            GoVal::Float(f) if f.is_nan() => return None,
            GoVal::Float(f) => KeyId::Float(if *f == 0.0 { 0 } else { f.to_bits() }),
            GoVal::Str(s) => KeyId::Str(s.clone()),
            GoVal::Seq(_) | GoVal::Map(_) => return None,
        })
    }

    /// `reflect.Value.SetMapIndex`: an existing key keeps its slot and takes the new value.
    fn set(&mut self, k: GoVal, v: GoVal) {
        let Some(id) = Self::key_id(&k) else {
            return self.entries.push((k, v));
        };
        match self.index.entry(id) {
            Entry::Occupied(at) => self.entries[*at.get()].1 = v,
            Entry::Vacant(slot) => {
                slot.insert(self.entries.len());
                self.entries.push((k, v));
            }
        }
    }
}

/// go-yaml's decoder state while it unmarshals one document into `interface{}`.
pub(super) struct Decoder<'d> {
    doc: &'d Doc,
    decode_count: usize,
    alias_count: usize,
    alias_depth: usize,
    /// The aliases being expanded, by node: one reached again contains itself.
    active_aliases: Vec<bool>,
}

/// go-yaml's `allowedAliasRatio`: how much of a document may come from alias expansion.
fn allowed_alias_ratio(decode_count: usize) -> f64 {
    const LOW: usize = 400_000;
    const HIGH: usize = 4_000_000;
    if decode_count <= LOW {
        0.99
    } else if decode_count >= HIGH {
        0.10
    } else {
        0.99 - 0.89 * ((decode_count - LOW) as f64 / (HIGH - LOW) as f64)
    }
}

fn want_map() -> YamlError {
    decode_error("map merge requires map or sequence of maps as the value".into())
}

impl<'d> Decoder<'d> {
    pub(super) fn new(doc: &'d Doc) -> Self {
        Self {
            doc,
            decode_count: 0,
            alias_count: 0,
            alias_depth: 0,
            active_aliases: vec![false; doc.nodes.len()],
        }
    }

    fn node(&self, id: NodeId) -> Option<&'d Node> {
        self.doc.nodes.get(id)
    }

    pub(super) fn run(mut self) -> Result<GoVal, YamlError> {
        // The document node itself is one decode operation.
        self.count()?;
        self.value(self.doc.root)
    }

    /// Every `d.unmarshal` counts towards go-yaml's limit on aliasing.
    fn count(&mut self) -> Result<(), YamlError> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        if self.alias_count > 100
            && self.decode_count > 1000
            && self.alias_count as f64 / self.decode_count as f64
                > allowed_alias_ratio(self.decode_count)
        {
            return Err(decode_error("document contains excessive aliasing".into()));
        }
        Ok(())
    }

    /// `d.alias`: decodes what alias `id` points at with `decode`.
    fn through_alias<T>(
        &mut self,
        id: NodeId,
        name: &str,
        decode: impl FnOnce(&mut Self) -> Result<T, YamlError>,
    ) -> Result<T, YamlError> {
        if self.active_aliases.get(id).copied().unwrap_or(false) {
            return Err(decode_error(format!(
                "anchor '{name}' value contains itself"
            )));
        }
        self.active_aliases[id] = true;
        self.alias_depth += 1;
        let decoded = decode(self);
        self.alias_depth -= 1;
        self.active_aliases[id] = false;
        decoded
    }

    /// `d.unmarshal(n, new interface{})`.
    fn value(&mut self, id: NodeId) -> Result<GoVal, YamlError> {
        self.count()?;
        match self.node(id) {
            Some(Node::Alias { name, target }) => {
                self.through_alias(id, name, |decoder| decoder.value(*target))
            }
            Some(Node::Scalar {
                value,
                tag,
                implicit,
            }) => resolve_scalar(value, tag, *implicit),
            Some(Node::Sequence(children)) => children
                .iter()
                .map(|&child| self.value(child))
                .collect::<Result<_, _>>()
                .map(GoVal::Seq),
            Some(Node::Mapping(children)) => {
                let mut map = Box::default();
                self.pairs(children, &mut map)?;
                Ok(GoVal::Map(map))
            }
            None => Ok(GoVal::Nil),
        }
    }

    /// `d.unmarshal(n, out)` with `out` a map being built: the target of a merge key.
    fn merge_into(&mut self, id: NodeId, map: &mut GoMap) -> Result<(), YamlError> {
        self.count()?;
        match self.node(id) {
            Some(Node::Alias { name, target }) => {
                self.through_alias(id, name, |decoder| decoder.merge_into(*target, map))
            }
            Some(Node::Mapping(children)) => self.pairs(children, map),
            _ => Err(want_map()),
        }
    }

    /// The key and value pairs of a mapping, into `map`.
    fn pairs(&mut self, children: &[NodeId], map: &mut GoMap) -> Result<(), YamlError> {
        for pair in children.chunks_exact(2) {
            let (key, value) = (pair[0], pair[1]);
            if self.is_merge(key) {
                self.merge(value, map)?;
                continue;
            }
            let key = self.value(key)?;
            if matches!(key, GoVal::Seq(_) | GoVal::Map(_)) {
                return Err(decode_error(format!(
                    "invalid map key: {}",
                    go_syntax(&key, false)
                )));
            }
            let value = self.value(value)?;
            map.set(key, value);
        }
        Ok(())
    }

    /// `d.merge`: a map, an alias to one, or a sequence of those; earlier maps take
    /// precedence, so the last is merged first.
    fn merge(&mut self, id: NodeId, map: &mut GoMap) -> Result<(), YamlError> {
        match self.node(id) {
            _ if self.is_mapping_or_alias_to_one(id) => self.merge_into(id, map),
            Some(Node::Sequence(children)) => children.iter().rev().try_for_each(|&child| {
                if !self.is_mapping_or_alias_to_one(child) {
                    return Err(want_map());
                }
                self.merge_into(child, map)
            }),
            _ => Err(want_map()),
        }
    }

    fn is_merge(&self, id: NodeId) -> bool {
        matches!(self.node(id), Some(Node::Scalar { value, tag, implicit })
            if value == "<<" && (*implicit || tag == MERGE_TAG))
    }

    fn is_mapping_or_alias_to_one(&self, id: NodeId) -> bool {
        match self.node(id) {
            Some(Node::Mapping(_)) => true,
            Some(Node::Alias { target, .. }) => {
                matches!(self.node(*target), Some(Node::Mapping(_)))
            }
            _ => false,
        }
    }
}

/// The shape nearly every config has, read without libyaml: `key: value` lines at column 0,
/// each value a plain scalar, a one-line flow sequence of them, or block sequence items
/// (`- item`) on the lines below. `None` for anything else, which the full reader takes.
///
/// Only printable ASCII, line feeds and scalars of letters, digits, `.`, `/` and `_` are
/// allowed: no comment, quote, tag, anchor, indicator or line break inside a node, so libyaml
/// and go-yaml's composer could read nothing else from these bytes, and every scalar goes
/// through the same resolution and map as on the full path. A 10,000-CIDR list is read in a
/// fraction of libyaml's time.
pub(super) fn simple_document(input: &[u8]) -> Option<GoVal> {
    if !every(input, |byte| byte == b'\n' || (0x20..0x7f).contains(&byte)) {
        return None;
    }
    let text = std::str::from_utf8(input).ok()?;
    let plain = |scalar: &str| {
        let safe = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'/' | b'_');
        // An untagged plain scalar: `resolve_scalar(scalar, "", true)`.
        (!scalar.is_empty() && every(scalar.as_bytes(), safe))
            .then(|| resolve_untyped("", scalar).1)
    };
    let mut map = Box::<GoMap>::default();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.is_empty() {
            continue;
        }
        let (key, rest) = line.split_once(':')?;
        // Far below libyaml's 1,024-character limit on a simple key.
        if key.is_empty() || key.len() > 64 || !key.bytes().all(|byte| byte.is_ascii_alphanumeric())
        {
            return None;
        }
        let value = if rest.is_empty() {
            let (mut items, mut indent) = (Vec::new(), None);
            let item = |line: &&str| line.trim_start_matches(' ').starts_with("- ");
            while let Some(line) = lines.next_if(item) {
                let scalar = line.trim_start_matches(' ');
                let at = line.len() - scalar.len();
                if *indent.get_or_insert(at) != at {
                    return None;
                }
                items.push(plain(&scalar[2..])?);
            }
            (!items.is_empty()).then_some(GoVal::Seq(items))?
        } else if let Some(list) = rest.strip_prefix(" [") {
            let list = list.strip_suffix(']')?;
            if list.is_empty() {
                GoVal::Seq(Vec::new())
            } else {
                let items = list.split(',').map(|item| plain(item.trim_matches(' ')));
                GoVal::Seq(items.collect::<Option<_>>()?)
            }
        } else {
            plain(rest.strip_prefix(' ')?)?
        };
        map.set(plain(key)?, value);
    }
    (!map.entries.is_empty()).then_some(GoVal::Map(map))
}

/// `bytes.iter().all(test)` without the early exit: no branch per byte, so the loop is
/// vectorized (a tenth of the instructions on a config's text and scalars).
fn every(bytes: &[u8], test: impl Fn(u8) -> bool) -> bool {
    bytes.iter().fold(true, |all, &byte| all & test(byte))
}

// ---------------------------------------------------------------------------------------------
// Scalar resolution: go-yaml v2's resolve.go.

const STR_TAG: &str = "tag:yaml.org,2002:str";
const BOOL_TAG: &str = "tag:yaml.org,2002:bool";
const INT_TAG: &str = "tag:yaml.org,2002:int";
const FLOAT_TAG: &str = "tag:yaml.org,2002:float";
const NULL_TAG: &str = "tag:yaml.org,2002:null";
const TIMESTAMP_TAG: &str = "tag:yaml.org,2002:timestamp";
const BINARY_TAG: &str = "tag:yaml.org,2002:binary";
const MERGE_TAG: &str = "tag:yaml.org,2002:merge";

fn short_tag(tag: &str) -> String {
    match tag.strip_prefix(SECONDARY_TAG_PREFIX) {
        Some(rest) => format!("!!{rest}"),
        None => tag.to_owned(),
    }
}

/// go-yaml's `resolveMap`: the YAML 1.1 words with a fixed meaning.
fn resolve_word(s: &str) -> Option<(&'static str, GoVal)> {
    Some(match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            (BOOL_TAG, GoVal::Bool(true))
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            (BOOL_TAG, GoVal::Bool(false))
        }
        "" | "~" | "null" | "Null" | "NULL" => (NULL_TAG, GoVal::Nil),
        ".nan" | ".NaN" | ".NAN" => (FLOAT_TAG, GoVal::Float(f64::NAN)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            (FLOAT_TAG, GoVal::Float(f64::INFINITY))
        }
        "-.inf" | "-.Inf" | "-.INF" => (FLOAT_TAG, GoVal::Float(f64::NEG_INFINITY)),
        "<<" => (MERGE_TAG, GoVal::Str("<<".into())),
        _ => return None,
    })
}

/// go-yaml's `resolve(tag, in)`: the tag a scalar resolves to and its Go value.
fn resolve<'t>(tag: &'t str, value: &str) -> Result<(&'t str, GoVal), YamlError> {
    let resolvable = matches!(
        tag,
        "" | STR_TAG | BOOL_TAG | INT_TAG | FLOAT_TAG | NULL_TAG | TIMESTAMP_TAG
    );
    if !resolvable {
        return Ok((tag, GoVal::Str(value.to_owned())));
    }
    let (rtag, out) = resolve_untyped(tag, value);
    if matches!(tag, "" | STR_TAG | BINARY_TAG) || tag == rtag {
        return Ok((rtag, out));
    }
    // An int (but not a uint64) may be read as a float.
    if tag == FLOAT_TAG
        && let GoVal::Int(i) = out
    {
        return Ok((FLOAT_TAG, GoVal::Float(i as f64)));
    }
    Err(decode_error(format!(
        "cannot decode {} `{value}` as a {}",
        short_tag(rtag),
        short_tag(tag)
    )))
}

fn resolve_untyped(tag: &str, value: &str) -> (&'static str, GoVal) {
    let hint = match value.as_bytes().first() {
        None => b'N',
        Some(b'+' | b'-') => b'S',
        Some(b'0'..=b'9') => b'D',
        Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
        Some(b'.') => b'.',
        Some(_) => 0,
    };
    // Numbers, timestamps and the words are spelled with these bytes only: anything else (the
    // `/` of every CIDR) is a string, without trying each number syntax on it.
    let numeric = |byte: u8| {
        byte.is_ascii_alphanumeric()
            || matches!(byte, b'+' | b'-' | b'.' | b',' | b':' | b'_' | b' ' | b'~')
    };
    if hint == 0 || tag == STR_TAG || tag == BINARY_TAG || !every(value.as_bytes(), numeric) {
        return (STR_TAG, GoVal::Str(value.to_owned()));
    }
    if let Some(found) = resolve_word(value) {
        return found;
    }
    match hint {
        b'.' => {
            if let Some(f) = parse_float(value) {
                return (FLOAT_TAG, GoVal::Float(f));
            }
        }
        b'D' | b'S' => {
            if (tag.is_empty() || tag == TIMESTAMP_TAG) && is_timestamp(value).is_some() {
                return (TIMESTAMP_TAG, GoVal::Str(value.to_owned()));
            }
            // ParseInt, then ParseUint (which refuses a sign: "-0b" is only tried as an int).
            let int = |text: &str, base| {
                (parse_int(text, base).map(GoVal::Int))
                    .or_else(|| parse_uint(text, base).map(GoVal::Uint))
            };
            let plain: String = value.chars().filter(|&c| c != '_').collect();
            if let Some(int) = int(&plain, 0) {
                return (INT_TAG, int);
            }
            if is_yaml_style_float(&plain)
                && let Some(f) = parse_float(&plain)
            {
                return (FLOAT_TAG, GoVal::Float(f));
            }
            let binary = match plain.strip_prefix("-0b") {
                Some(bits) => Some(format!("-{bits}")),
                None => plain.strip_prefix("0b").map(str::to_owned),
            };
            if let Some(int) = binary.and_then(|bits| int(&bits, 2)) {
                return (INT_TAG, int);
            }
        }
        _ => {}
    }
    (STR_TAG, GoVal::Str(value.to_owned()))
}

/// go-yaml's `d.scalar` for an `interface{}` target.
fn resolve_scalar(value: &str, tag: &str, implicit: bool) -> Result<GoVal, YamlError> {
    if tag.is_empty() && !implicit {
        return Ok(GoVal::Str(value.to_owned()));
    }
    let (rtag, resolved) = resolve(tag, value)?;
    if rtag == BINARY_TAG {
        let bytes = go_base64_decode(value)
            .ok_or_else(|| decode_error("!!binary value contains invalid base64 data".into()))?;
        return Ok(GoVal::Str(go_string_from_bytes(&bytes)));
    }
    if rtag == TIMESTAMP_TAG {
        // Kept as the original text "for backward compatibility".
        return Ok(GoVal::Str(value.to_owned()));
    }
    Ok(resolved)
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_style_float(s: &str) -> bool {
    fn unsigned(s: &str) -> &str {
        s.strip_prefix(['+', '-']).unwrap_or(s)
    }
    let digits = |s: &str| s.bytes().all(|byte| byte.is_ascii_digit());
    let s = unsigned(s);
    let (mantissa, exponent) = s.split_once(['e', 'E']).unwrap_or((s, "0"));
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let exponent = unsigned(exponent);
    !matches!(mantissa, "" | ".")
        && digits(whole)
        && digits(fraction)
        && !exponent.is_empty()
        && digits(exponent)
}

/// go-yaml's `parseTimestamp`: does `s` start with a four-digit year and a dash, and match one
/// of the layouts it tries with `time.Parse`: `2006-1-2T15:4:5.999999999Z07:00` (or with
/// `t`), `2006-1-2 15:4:5.999999999` (any number of spaces) or `2006-1-2`?
fn is_timestamp(s: &str) -> Option<()> {
    let b = s.as_bytes();
    let year: u32 = s.get(..4)?.parse().ok()?;
    let mut p = TimeParser { b, i: 4 };
    (b[..4].iter().all(u8::is_ascii_digit)).then_some(())?;
    p.lit(b'-')?;
    let month = p.num()?;
    p.lit(b'-')?;
    let day = p.num()?;
    ((1..=12).contains(&month) && (1..=days_in(month, year)).contains(&day)).then_some(())?;
    match b.get(p.i) {
        None => return Some(()),
        Some(b'T' | b't') => {
            p.i += 1;
            p.clock()?;
            p.zone()?;
        }
        Some(b' ') => {
            while p.lit(b' ').is_some() {}
            p.clock()?;
        }
        Some(_) => return None,
    }
    (p.i == b.len()).then_some(())
}

fn days_in(month: u32, year: u32) -> u32 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A cursor over a timestamp, with Go's `time.Parse` rules for the fields go-yaml uses.
#[derive(Debug)]
struct TimeParser<'a> {
    b: &'a [u8],
    i: usize,
}

impl TimeParser<'_> {
    /// Go's `getnum(s, false)`: one digit, or two.
    fn num(&mut self) -> Option<u32> {
        let mut n = None;
        for _ in 0..2 {
            let Some(digit) = self.b.get(self.i).filter(|c| c.is_ascii_digit()) else {
                break;
            };
            self.i += 1;
            n = Some(n.unwrap_or(0) * 10 + u32::from(digit - b'0'));
        }
        n
    }

    fn lit(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// `15:4:5`, then an optional fraction (`.` or `,` and digits).
    fn clock(&mut self) -> Option<()> {
        let hour = self.num()?;
        self.lit(b':')?;
        let minute = self.num()?;
        self.lit(b':')?;
        let second = self.num()?;
        (hour < 24 && minute < 60 && second < 60).then_some(())?;
        if matches!(self.b.get(self.i), Some(b'.' | b','))
            && self.b.get(self.i + 1).is_some_and(u8::is_ascii_digit)
        {
            self.i += 1;
            while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
        }
        Some(())
    }

    /// `Z07:00`: `Z` or `±hh:mm`, at most 24 hours and 60 minutes.
    fn zone(&mut self) -> Option<()> {
        if self.lit(b'Z').is_some() {
            return Some(());
        }
        let [b'+' | b'-', h1, h2, b':', m1, m2, ..] = self.b.get(self.i..)? else {
            return None;
        };
        let two = |tens: &u8, ones: &u8| {
            (tens.is_ascii_digit() && ones.is_ascii_digit())
                .then(|| u32::from(tens - b'0') * 10 + u32::from(ones - b'0'))
        };
        let (hours, minutes) = (two(h1, h2)?, two(m1, m2)?);
        self.i += 6;
        (hours <= 24 && minutes <= 60).then_some(())
    }
}

/// Go's `base64.StdEncoding.DecodeString`: padding required, CR and LF ignored, and (Go's
/// decoding is not strict) the bits after the last byte need not be zero.
fn go_base64_decode(s: &str) -> Option<Vec<u8>> {
    const GO_STD_ENCODING: GeneralPurpose = GeneralPurpose::new(
        &alphabet::STANDARD,
        GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'\r' && c != b'\n').collect();
    GO_STD_ENCODING.decode(clean).ok()
}

/// Rank of a dynamic type when Go's `fmt` sorts `interface{}` map keys (by type first).
fn type_rank(v: &GoVal) -> u8 {
    match v {
        GoVal::Nil => 0,
        GoVal::Bool(_) => 1,
        GoVal::Int(_) => 2,
        GoVal::Uint(_) => 3,
        GoVal::Float(_) => 4,
        GoVal::Str(_) => 5,
        GoVal::Seq(_) => 6,
        GoVal::Map(_) => 7,
    }
}

fn key_order(a: &GoVal, b: &GoVal) -> std::cmp::Ordering {
    match (a, b) {
        (GoVal::Bool(x), GoVal::Bool(y)) => x.cmp(y),
        (GoVal::Int(x), GoVal::Int(y)) => x.cmp(y),
        (GoVal::Uint(x), GoVal::Uint(y)) => x.cmp(y),
        (GoVal::Float(x), GoVal::Float(y)) => x.total_cmp(y),
        (GoVal::Str(x), GoVal::Str(y)) => x.cmp(y),
        _ => type_rank(a).cmp(&type_rank(b)),
    }
}

/// Go's `%#v` of a value held in an `interface{}`; a `nested` nil (inside a slice or map)
/// prints with its type.
fn go_syntax(value: &GoVal, nested: bool) -> String {
    match value {
        GoVal::Nil if nested => "interface {}(nil)".to_owned(),
        GoVal::Nil => "<nil>".to_owned(),
        GoVal::Bool(b) => b.to_string(),
        GoVal::Int(i) => i.to_string(),
        GoVal::Uint(u) => format!("{u:#x}"),
        GoVal::Float(f) => format_g(*f, false),
        GoVal::Str(s) => quote(s),
        GoVal::Seq(items) => {
            let items: Vec<String> = items.iter().map(|item| go_syntax(item, true)).collect();
            format!("[]interface {{}}{{{}}}", items.join(", "))
        }
        GoVal::Map(map) => {
            let mut entries: Vec<&(GoVal, GoVal)> = map.entries.iter().collect();
            entries.sort_by(|a, b| key_order(&a.0, &b.0));
            let entries: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}:{}", go_syntax(k, true), go_syntax(v, true)))
                .collect();
            format!(
                "map[interface {{}}]interface {{}}{{{}}}",
                entries.join(", ")
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// sigs.k8s.io/yaml's convertToJSONableObject followed by json.Marshal.

/// The JSON object key `sigs.k8s.io/yaml` makes of a Go map key.
fn key_string(k: &GoVal, v: &GoVal) -> Result<String, YamlError> {
    let type_name = match k {
        GoVal::Str(s) => return Ok(s.clone()),
        GoVal::Int(i) => return Ok(i.to_string()),
        GoVal::Bool(b) => return Ok(b.to_string()),
        GoVal::Float(f) => {
            return Ok(match format_g(*f, true).as_str() {
                "+Inf" => ".inf".to_owned(),
                "-Inf" => "-.inf".to_owned(),
                "NaN" => ".nan".to_owned(),
                s => s.to_owned(),
            });
        }
        // `%s` of a nil interface.
        GoVal::Nil => "%!s(<nil>)",
        GoVal::Uint(_) => "uint64",
        GoVal::Seq(_) => "[]interface {}",
        GoVal::Map(_) => "map[interface {}]interface {}",
    };
    Err(YamlError::UnsupportedMapKey(format!(
        "Unsupported map key of type: {type_name}, key: {}, value: {}",
        go_syntax(k, false),
        go_syntax(v, false)
    )))
}

/// `convertToJSONableObject` and `json.Marshal`: maps become objects with string keys, sorted,
/// one member per key (distinct Go keys may stringify alike, 1 and "1": the later one wins
/// here). Key errors come first; then `json.Marshal` refuses the first float JSON cannot
/// express, in the order it writes them.
pub(super) fn to_json_value(root: GoVal) -> Result<JsonValue, YamlError> {
    let mut unsupported = None;
    let value = convert(root, &mut unsupported)?;
    unsupported.map_or(Ok(value), |what| Err(YamlError::UnsupportedValue(what)))
}

fn convert(value: GoVal, unsupported: &mut Option<&'static str>) -> Result<JsonValue, YamlError> {
    Ok(match value {
        GoVal::Nil => JsonValue::Null,
        GoVal::Bool(b) => JsonValue::Bool(b),
        GoVal::Int(i) => JsonValue::Number(i.to_string()),
        GoVal::Uint(u) => JsonValue::Number(u.to_string()),
        GoVal::Float(f) if f.is_finite() => JsonValue::Number(format_json_float(f)),
        GoVal::Float(f) => {
            let what = if f.is_nan() {
                "NaN"
            } else if f > 0.0 {
                "+Inf"
            } else {
                "-Inf"
            };
            unsupported.get_or_insert(what);
            JsonValue::Null
        }
        GoVal::Str(s) => JsonValue::String(s),
        GoVal::Seq(items) => JsonValue::Array(
            items
                .into_iter()
                .map(|item| convert(item, unsupported))
                .collect::<Result<_, _>>()?,
        ),
        GoVal::Map(map) => {
            let members = map
                .entries
                .into_iter()
                .map(|(k, v)| Ok((key_string(&k, &v)?, v)))
                .collect::<Result<BTreeMap<String, GoVal>, YamlError>>()?;
            JsonValue::Object(
                members
                    .into_iter()
                    .map(|(key, value)| Ok((key, convert(value, unsupported)?)))
                    .collect::<Result<_, YamlError>>()?,
            )
        }
    })
}
