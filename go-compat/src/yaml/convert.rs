//! go-yaml v2's decoder into `interface{}` (scalar resolution, merge keys, aliases) and
//! sigs.k8s.io/yaml's conversion of the result to JSON, as upstream runs them.

use std::collections::HashMap;
use std::fmt::Write as _;

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
    Map(GoMap),
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
        match Self::key_id(&k) {
            Some(id) => {
                if let Some(&at) = self.index.get(&id) {
                    if let Some(slot) = self.entries.get_mut(at) {
                        slot.1 = v;
                    }
                } else {
                    self.index.insert(id, self.entries.len());
                    self.entries.push((k, v));
                }
            }
            None => self.entries.push((k, v)),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Task {
    /// `d.unmarshal(n, new interface{})`: pushes the node's value.
    Unmarshal(NodeId),
    /// `d.unmarshal(n, out)` with `out` the map being built (merge keys).
    UnmarshalInto(NodeId),
    EndAlias(NodeId),
    FinishSeq(usize),
    FinishMap,
    CheckKey,
    SetPair,
    Merge(NodeId),
    MergeElem(NodeId),
}

pub(super) struct Decoder<'d> {
    doc: &'d Doc,
    decode_count: usize,
    alias_count: usize,
    alias_depth: usize,
    active_aliases: Vec<bool>,
    tasks: Vec<Task>,
    values: Vec<GoVal>,
    maps: Vec<GoMap>,
}

impl std::fmt::Debug for Decoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder")
            .field("decode_count", &self.decode_count)
            .finish_non_exhaustive()
    }
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
            tasks: Vec::new(),
            values: Vec::new(),
            maps: Vec::new(),
        }
    }

    fn node(&self, id: NodeId) -> Option<&'d Node> {
        self.doc.nodes.get(id)
    }

    pub(super) fn run(mut self) -> Result<GoVal, YamlError> {
        // The document node itself is one decode operation.
        self.count()?;
        self.tasks.push(Task::Unmarshal(self.doc.root));
        while let Some(task) = self.tasks.pop() {
            self.step(task)?;
        }
        Ok(self.values.pop().unwrap_or(GoVal::Nil))
    }

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

    fn enter_alias(&mut self, id: NodeId, name: &str) -> Result<(), YamlError> {
        let Some(active) = self.active_aliases.get_mut(id) else {
            return Ok(());
        };
        if *active {
            return Err(decode_error(format!(
                "anchor '{name}' value contains itself"
            )));
        }
        *active = true;
        self.alias_depth += 1;
        self.tasks.push(Task::EndAlias(id));
        Ok(())
    }

    fn push_pairs(&mut self, children: &[NodeId]) {
        for pair in children.chunks(2).rev() {
            let (k, v) = match pair {
                [k, v] => (*k, *v),
                _ => continue,
            };
            if self.is_merge(k) {
                self.tasks.push(Task::Merge(v));
            } else {
                self.tasks.extend([
                    Task::SetPair,
                    Task::Unmarshal(v),
                    Task::CheckKey,
                    Task::Unmarshal(k),
                ]);
            }
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

    fn step(&mut self, task: Task) -> Result<(), YamlError> {
        match task {
            Task::Unmarshal(id) => {
                self.count()?;
                match self.node(id) {
                    Some(Node::Alias { name, target }) => {
                        self.enter_alias(id, name)?;
                        self.tasks.push(Task::Unmarshal(*target));
                    }
                    Some(Node::Scalar {
                        value,
                        tag,
                        implicit,
                    }) => {
                        let v = resolve_scalar(value, tag, *implicit)?;
                        self.values.push(v);
                    }
                    Some(Node::Sequence(children)) => {
                        self.tasks.push(Task::FinishSeq(children.len()));
                        self.tasks
                            .extend(children.iter().rev().map(|&c| Task::Unmarshal(c)));
                    }
                    Some(Node::Mapping(children)) => {
                        self.maps.push(GoMap::default());
                        self.tasks.push(Task::FinishMap);
                        self.push_pairs(children);
                    }
                    None => self.values.push(GoVal::Nil),
                }
            }
            Task::UnmarshalInto(id) => {
                self.count()?;
                match self.node(id) {
                    Some(Node::Alias { name, target }) => {
                        self.enter_alias(id, name)?;
                        self.tasks.push(Task::UnmarshalInto(*target));
                    }
                    Some(Node::Mapping(children)) => self.push_pairs(children),
                    _ => return Err(want_map()),
                }
            }
            Task::EndAlias(id) => {
                self.alias_depth = self.alias_depth.saturating_sub(1);
                if let Some(active) = self.active_aliases.get_mut(id) {
                    *active = false;
                }
            }
            Task::FinishSeq(n) => {
                let items = self.values.split_off(self.values.len().saturating_sub(n));
                self.values.push(GoVal::Seq(items));
            }
            Task::FinishMap => {
                let map = self.maps.pop().unwrap_or_default();
                self.values.push(GoVal::Map(map));
            }
            Task::CheckKey => {
                if let Some(k @ (GoVal::Seq(_) | GoVal::Map(_))) = self.values.last() {
                    return Err(decode_error(format!("invalid map key: {}", go_syntax(k))));
                }
            }
            Task::SetPair => {
                let v = self.values.pop().unwrap_or(GoVal::Nil);
                let k = self.values.pop().unwrap_or(GoVal::Nil);
                if let Some(map) = self.maps.last_mut() {
                    map.set(k, v);
                }
            }
            Task::Merge(id) => match self.node(id) {
                Some(Node::Mapping(_)) => self.tasks.push(Task::UnmarshalInto(id)),
                Some(Node::Alias { .. }) => {
                    if !self.is_mapping_or_alias_to_one(id) {
                        return Err(want_map());
                    }
                    self.tasks.push(Task::UnmarshalInto(id));
                }
                Some(Node::Sequence(children)) => {
                    // Earlier maps take precedence, so the last is merged first.
                    self.tasks
                        .extend(children.iter().map(|&c| Task::MergeElem(c)));
                }
                _ => return Err(want_map()),
            },
            Task::MergeElem(id) => {
                if !self.is_mapping_or_alias_to_one(id) {
                    return Err(want_map());
                }
                self.tasks.push(Task::UnmarshalInto(id));
            }
        }
        Ok(())
    }
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
fn resolve(tag: &str, value: &str) -> Result<(String, GoVal), YamlError> {
    let resolvable = matches!(
        tag,
        "" | STR_TAG | BOOL_TAG | INT_TAG | FLOAT_TAG | NULL_TAG | TIMESTAMP_TAG
    );
    if !resolvable {
        return Ok((tag.to_owned(), GoVal::Str(value.to_owned())));
    }
    let (rtag, out) = resolve_untyped(tag, value);
    if matches!(tag, "" | STR_TAG | BINARY_TAG) || tag == rtag {
        return Ok((rtag.to_owned(), out));
    }
    if tag == FLOAT_TAG && rtag == INT_TAG {
        // An int (but not a uint64) may be read as a float.
        if let GoVal::Int(i) = out {
            return Ok((FLOAT_TAG.to_owned(), GoVal::Float(i as f64)));
        }
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
    if hint == 0 || tag == STR_TAG || tag == BINARY_TAG {
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
            if (tag.is_empty() || tag == TIMESTAMP_TAG) && is_timestamp(value) {
                return (TIMESTAMP_TAG, GoVal::Str(value.to_owned()));
            }
            let plain: String = value.chars().filter(|&c| c != '_').collect();
            if let Some(i) = parse_int(&plain, 0) {
                return (INT_TAG, GoVal::Int(i));
            }
            if let Some(u) = parse_uint(&plain, 0) {
                return (INT_TAG, GoVal::Uint(u));
            }
            if is_yaml_style_float(&plain)
                && let Some(f) = parse_float(&plain)
            {
                return (FLOAT_TAG, GoVal::Float(f));
            }
            if let Some(bits) = plain.strip_prefix("0b") {
                if let Some(i) = parse_int(bits, 2) {
                    return (INT_TAG, GoVal::Int(i));
                }
                if let Some(u) = parse_uint(bits, 2) {
                    return (INT_TAG, GoVal::Uint(u));
                }
            } else if let Some(bits) = plain.strip_prefix("-0b")
                && let Some(i) = parse_int(&format!("-{bits}"), 2)
            {
                return (INT_TAG, GoVal::Int(i));
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
        let Some(bytes) = go_base64_decode(value) else {
            return Err(decode_error(
                "!!binary value contains invalid base64 data".into(),
            ));
        };
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
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while b.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        *i - start
    };
    if b.get(i) == Some(&b'.') {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            digits(&mut i);
        }
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// go-yaml's `parseTimestamp`: does `s` match one of the layouts it tries with `time.Parse`?
fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let year_digits = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if year_digits != 4 || b.get(4) != Some(&b'-') {
        return false;
    }
    let mut p = TimeParser { b, i: 5 };
    let Ok(year) = s.get(..4).unwrap_or_default().parse::<u32>() else {
        return false;
    };
    let (Some(month), true, Some(day)) = (p.num(), p.lit(b'-'), p.num()) else {
        return false;
    };
    if !(1..=12).contains(&month) || day < 1 || day > days_in(month, year) {
        return false;
    }
    match b.get(p.i) {
        None => true,
        Some(b'T' | b't') => {
            p.i += 1;
            p.clock() && p.zone() && p.i == b.len()
        }
        Some(b' ') => {
            while b.get(p.i) == Some(&b' ') {
                p.i += 1;
            }
            p.clock() && p.i == b.len()
        }
        Some(_) => false,
    }
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
    /// Go's `getnum(s, false)`: one or two digits.
    fn num(&mut self) -> Option<u32> {
        let d1 = self.b.get(self.i).filter(|c| c.is_ascii_digit())?;
        self.i += 1;
        let mut n = u32::from(d1 - b'0');
        if let Some(d2) = self.b.get(self.i).filter(|c| c.is_ascii_digit()) {
            self.i += 1;
            n = n * 10 + u32::from(d2 - b'0');
        }
        Some(n)
    }

    fn lit(&mut self, c: u8) -> bool {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    /// `15:4:5` with an optional fraction (`.` or `,` then any number of digits).
    fn clock(&mut self) -> bool {
        let Some(hour) = self.num() else { return false };
        if !self.lit(b':') {
            return false;
        }
        let Some(minute) = self.num() else {
            return false;
        };
        if !self.lit(b':') {
            return false;
        }
        let Some(second) = self.num() else {
            return false;
        };
        if hour >= 24 || minute >= 60 || second >= 60 {
            return false;
        }
        if matches!(self.b.get(self.i), Some(b'.' | b','))
            && self.b.get(self.i + 1).is_some_and(u8::is_ascii_digit)
        {
            self.i += 1;
            while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
        }
        true
    }

    /// `Z07:00`: `Z` or `±hh:mm`.
    fn zone(&mut self) -> bool {
        if self.lit(b'Z') {
            return true;
        }
        let rest = self.b.get(self.i..).unwrap_or_default();
        let [sign, h1, h2, b':', m1, m2, ..] = rest else {
            return false;
        };
        if !matches!(sign, b'+' | b'-') || ![h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()) {
            return false;
        }
        let hours = u32::from(h1 - b'0') * 10 + u32::from(h2 - b'0');
        let minutes = u32::from(m1 - b'0') * 10 + u32::from(m2 - b'0');
        self.i += 6;
        hours <= 24 && minutes <= 60
    }
}

/// Go's `base64.StdEncoding.DecodeString` (padding required, CR and LF ignored).
fn go_base64_decode(s: &str) -> Option<Vec<u8>> {
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'\r' && c != b'\n').collect();
    if !clean.len().is_multiple_of(4) {
        return None;
    }
    let value = |c: u8| -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    };
    let mut out = Vec::with_capacity(clean.len() / 4 * 3);
    let quanta = clean.len() / 4;
    for (q, chunk) in clean.chunks(4).enumerate() {
        let last = q + 1 == quanta;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n: u32 = 0;
        for &c in chunk.get(..4 - pad)? {
            n = (n << 6) | value(c)?;
        }
        n <<= 6 * pad;
        let bytes = n.to_be_bytes();
        out.extend_from_slice(bytes.get(1..4 - pad)?);
    }
    Some(out)
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

/// Go's `%#v` of a value held in an `interface{}` (nested ones print `interface {}(nil)`).
fn go_syntax(v: &GoVal) -> String {
    let mut out = String::new();
    // (value, nested) pairs, written in order; `None` closes a composite.
    let mut work: Vec<Option<(&GoVal, bool)>> = vec![Some((v, false))];
    let mut seps: Vec<Option<&'static str>> = vec![None];
    while let Some(item) = work.pop() {
        if let Some(sep) = seps.pop().flatten() {
            out.push_str(sep);
        }
        let Some((v, nested)) = item else {
            out.push('}');
            continue;
        };
        match v {
            GoVal::Nil if nested => out.push_str("interface {}(nil)"),
            GoVal::Nil => out.push_str("<nil>"),
            GoVal::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            GoVal::Int(i) => out.push_str(&i.to_string()),
            GoVal::Uint(u) => {
                let _ = write!(out, "{u:#x}");
            }
            GoVal::Float(f) => out.push_str(&format_g(*f, false)),
            GoVal::Str(s) => out.push_str(&quote(s)),
            GoVal::Seq(items) => {
                out.push_str("[]interface {}{");
                work.push(None);
                seps.push(None);
                for (i, item) in items.iter().enumerate().rev() {
                    work.push(Some((item, true)));
                    seps.push((i > 0).then_some(", "));
                }
            }
            GoVal::Map(map) => {
                out.push_str("map[interface {}]interface {}{");
                let mut entries: Vec<&(GoVal, GoVal)> = map.entries.iter().collect();
                entries.sort_by(|a, b| key_order(&a.0, &b.0));
                work.push(None);
                seps.push(None);
                for (i, (k, val)) in entries.iter().enumerate().rev() {
                    work.push(Some((val, true)));
                    seps.push(Some(":"));
                    work.push(Some((k, true)));
                    seps.push((i > 0).then_some(", "));
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// sigs.k8s.io/yaml's convertToJSONableObject followed by json.Marshal.

/// The JSON object key `sigs.k8s.io/yaml` makes of a Go map key.
fn key_string(k: &GoVal, v: &GoVal) -> Result<String, YamlError> {
    match k {
        GoVal::Str(s) => Ok(s.clone()),
        GoVal::Int(i) => Ok(i.to_string()),
        GoVal::Bool(b) => Ok(b.to_string()),
        GoVal::Float(f) => Ok(match format_g(*f, true).as_str() {
            "+Inf" => ".inf".to_owned(),
            "-Inf" => "-.inf".to_owned(),
            "NaN" => ".nan".to_owned(),
            s => s.to_owned(),
        }),
        GoVal::Nil => Err(YamlError::UnsupportedMapKey(format!(
            "Unsupported map key of type: %!s(<nil>), key: <nil>, value: {}",
            go_syntax(v)
        ))),
        GoVal::Uint(_) | GoVal::Seq(_) | GoVal::Map(_) => {
            let type_name = match k {
                GoVal::Uint(_) => "uint64",
                GoVal::Seq(_) => "[]interface {}",
                _ => "map[interface {}]interface {}",
            };
            Err(YamlError::UnsupportedMapKey(format!(
                "Unsupported map key of type: {type_name}, key: {}, value: {}",
                go_syntax(k),
                go_syntax(v)
            )))
        }
    }
}

/// A composite being converted: remaining children and the converted ones.
#[derive(Debug)]
enum ConvFrame {
    Arr(std::vec::IntoIter<GoVal>, Vec<JsonValue>),
    Obj(
        std::vec::IntoIter<(String, GoVal)>,
        Vec<(String, JsonValue)>,
        String,
    ),
}

pub(super) fn to_json_value(root: GoVal) -> Result<JsonValue, YamlError> {
    let mut stack: Vec<ConvFrame> = Vec::new();
    let mut unsupported: Option<&'static str> = None;
    let mut next = Some(root);
    loop {
        let done = match next.take() {
            Some(GoVal::Seq(items)) => {
                stack.push(ConvFrame::Arr(items.into_iter(), Vec::new()));
                None
            }
            Some(GoVal::Map(map)) => {
                let mut members: Vec<(String, GoVal)> = Vec::with_capacity(map.entries.len());
                for (k, v) in map.entries {
                    let key = key_string(&k, &v)?;
                    members.push((key, v));
                }
                // Distinct Go keys may stringify alike (1 and "1"); the later one wins here.
                let mut seen: HashMap<String, usize> = HashMap::new();
                let mut unique: Vec<(String, GoVal)> = Vec::with_capacity(members.len());
                for (k, v) in members {
                    if let Some(&at) = seen.get(&k) {
                        if let Some(slot) = unique.get_mut(at) {
                            slot.1 = v;
                        }
                    } else {
                        seen.insert(k.clone(), unique.len());
                        unique.push((k, v));
                    }
                }
                unique.sort_by(|a, b| a.0.cmp(&b.0));
                stack.push(ConvFrame::Obj(
                    unique.into_iter(),
                    Vec::new(),
                    String::new(),
                ));
                None
            }
            Some(scalar) => Some(match scalar {
                GoVal::Nil => JsonValue::Null,
                GoVal::Bool(b) => JsonValue::Bool(b),
                GoVal::Int(i) => JsonValue::Number(i.to_string()),
                GoVal::Uint(u) => JsonValue::Number(u.to_string()),
                GoVal::Float(f) if f.is_finite() => JsonValue::Number(format_json_float(f)),
                GoVal::Float(f) => {
                    if unsupported.is_none() {
                        unsupported = Some(if f.is_nan() {
                            "NaN"
                        } else if f > 0.0 {
                            "+Inf"
                        } else {
                            "-Inf"
                        });
                    }
                    JsonValue::Null
                }
                GoVal::Str(s) => JsonValue::String(s),
                GoVal::Seq(_) | GoVal::Map(_) => JsonValue::Null,
            }),
            None => None,
        };
        // Place a finished value, or pull the next child of the innermost composite.
        let mut finished = done;
        loop {
            let Some(frame) = stack.last_mut() else {
                // Only key errors come before json.Marshal's float check; both are done.
                if let Some(what) = unsupported {
                    return Err(YamlError::UnsupportedValue(what));
                }
                return Ok(finished.unwrap_or(JsonValue::Null));
            };
            if let Some(value) = finished.take() {
                match frame {
                    ConvFrame::Arr(_, out) => out.push(value),
                    ConvFrame::Obj(_, out, key) => out.push((std::mem::take(key), value)),
                }
            }
            let child = match frame {
                ConvFrame::Arr(items, _) => items.next(),
                ConvFrame::Obj(members, _, key) => members.next().map(|(k, v)| {
                    *key = k;
                    v
                }),
            };
            if let Some(child) = child {
                next = Some(child);
                break;
            }
            finished = match stack.pop() {
                Some(ConvFrame::Arr(_, out)) => Some(JsonValue::Array(out)),
                Some(ConvFrame::Obj(_, out, _)) => Some(JsonValue::Object(out)),
                None => None,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_scalar_forms_match_go() {
        assert!(is_yaml_style_float("-1.5e+3"));
        assert!(!is_yaml_style_float("1e"));
        assert!(is_timestamp("2001-12-14t21:59:43.10-05:00"));
        assert!(is_timestamp("2004-02-29"));
        assert!(!is_timestamp("2001-02-29"));
        assert!(!is_timestamp("2001-12-14T21:59:43"));
        assert_eq!(go_base64_decode("aGVs\nbG8="), Some(b"hello".to_vec()));
        assert_eq!(go_base64_decode("aGk"), None);
    }
}
