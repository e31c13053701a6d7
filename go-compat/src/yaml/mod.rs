//! apimachinery's `yaml.ToJSON` as upstream ip-masq-agent calls it.
//!
//! Text whose first non-space character is `{` is JSON and goes to [`crate::json::parse`] as
//! it stands. Anything else goes through sigs.k8s.io/yaml's `YAMLToJSON`: go-yaml v2 decodes
//! the first YAML document (YAML 1.1: `yes`/`no`/`on`/`off` are booleans, `0777` is octal, ...)
//! into Go maps, which are re-encoded with `json.Marshal` (keys sorted, duplicates collapsed,
//! floats in Go's shortest form). Failures carry go-yaml's wording (`yaml: line N: ...`).
//!
//! Events come from libyaml itself ([`events`]), which go-yaml v2 is a port of. Where go-yaml
//! v2 departs from libyaml 0.2.5 the composer below restores go-yaml's behaviour: its reader
//! (UTF-8 and control characters checked 512 bytes at a time), `%YAML 1.1` only, the 10,000
//! level nesting limits, `\'` accepted and `\/` refused in double-quoted scalars, `?` ending
//! plain scalars in flow collections, tags going on through `,[]`, byte order marks read as
//! text inside the stream, and the spelling of "hexdecimal". Two of these need libyaml to read
//! a respelled input again (`\'` as `\x27`, a flow indicator in a tag as `%XX`): the same
//! characters to both parsers, on the same lines, at most once per occurrence.

mod convert;
mod events;

use std::collections::HashMap;

use self::{
    convert::{Decoder, Doc, Node, NodeId, to_json_value},
    events::{Event, Mark, ParseError, Parser},
};
use crate::json::{self, JsonSyntaxError, JsonValue};

/// Why a config file could not be turned into JSON, displayed exactly as the Go agent reports
/// it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// The file looked like JSON (its first non-space character is `{`) and Go's JSON reader
    /// rejected it; the message is `encoding/json`'s, unchanged.
    #[error(transparent)]
    Json(#[from] JsonSyntaxError),
    /// go-yaml rejected the document: a syntax error (`yaml: line 3: did not find expected
    /// key`) or a decoding failure (`yaml: unknown anchor 'x' referenced`).
    #[error("yaml: {}{problem}", line.map(|line| format!("line {line}: ")).unwrap_or_default())]
    Yaml {
        /// The line go-yaml names, if it names one (it omits line 0 and often reports the
        /// line before the problem for grammar errors).
        line: Option<usize>,
        /// libyaml's or go-yaml's description of the problem.
        problem: String,
    },
    /// sigs.k8s.io/yaml found a mapping key JSON cannot express (a null or a number above
    /// `i64::MAX`), e.g. `Unsupported map key of type: %!s(<nil>), key: <nil>, value: 1`.
    #[error("{0}")]
    UnsupportedMapKey(String),
    /// `json.Marshal` refused a float JSON cannot express: `.inf`, `-.inf` or `.nan`.
    #[error("json: unsupported value: {0}")]
    UnsupportedValue(&'static str),
}

pub(crate) const SECONDARY_TAG_PREFIX: &str = "tag:yaml.org,2002:";

pub(crate) fn decode_error(problem: String) -> YamlError {
    YamlError::Yaml {
        line: None,
        problem,
    }
}

impl From<ParseError> for YamlError {
    fn from(error: ParseError) -> Self {
        let problem = match error.problem.as_str() {
            // go-yaml's spelling.
            "did not find expected hexadecimal number" => "did not find expected hexdecimal number",
            other => other,
        };
        Self::Yaml {
            line: error.line(),
            problem: problem.to_owned(),
        }
    }
}

/// Converts a config file to the JSON structure upstream's `ToJSON` + `json.Unmarshal` see.
///
/// YAML input yields its first document only; an empty or comment-only file is `null`.
/// Mapping keys become strings and objects come back sorted by key without duplicates, as
/// `json.Marshal` emits them; numbers are rendered as Go renders the value go-yaml resolved.
///
/// # Errors
///
/// [`YamlError`], worded as the Go agent words it.
pub fn to_json(input: &[u8]) -> Result<JsonValue, YamlError> {
    // A document of the simple shape nests two levels: no thread with a deep stack needed.
    if !looks_like_json(input)
        && let Some(value) = convert::simple_document(input)
    {
        let value = to_json_value(value);
        // Debug builds (every test, the Go corpus) check that the full reader agrees.
        debug_assert_eq!(value, crate::on_deep_stack(|| to_json_here(input)));
        return value;
    }
    crate::on_deep_stack(|| to_json_here(input))
}

fn to_json_here(input: &[u8]) -> Result<JsonValue, YamlError> {
    if looks_like_json(input) {
        return json::parse_here(input).map_err(YamlError::Json);
    }
    let Some(doc) = compose(input)? else {
        return Ok(JsonValue::Null);
    };
    let value = to_json_value(Decoder::new(&doc).run()?)?;
    // The JSON text YAMLToJSON produced goes through json.Unmarshal, which refuses to nest
    // deeper than encoding/json's limit.
    json::check_depth(&value)?;
    Ok(value)
}

/// apimachinery's test: is the first non-space character `{`? Only the leading white space is
/// decoded, not the whole document.
fn looks_like_json(input: &[u8]) -> bool {
    // ASCII White_Space: tab, LF, VT, FF, CR and space.
    let start = input
        .iter()
        .position(|byte| !matches!(byte, b'\t'..=b'\r' | b' '));
    match start.map(|start| &input[start..]) {
        None => false,
        Some([first, ..]) if first.is_ascii() => *first == b'{',
        // unicode.IsSpace and Rust's White_Space are the same set.
        Some(rest) => String::from_utf8_lossy(rest)
            .trim_start_matches(char::is_whitespace)
            .starts_with('{'),
    }
}

/// go-yaml reads its input in chunks of this many bytes and checks each whole chunk.
const READER_CHUNK: usize = 512;
/// go-yaml's limit on both flow and block nesting.
const MAX_DEPTH: usize = 10_000;

/// Whether go-yaml's reader accepts the character `value`.
fn allowed(value: u32) -> bool {
    matches!(value, 0x09 | 0x0a | 0x0d | 0x20..=0x7e | 0x85 | 0xa0..=0xd7ff
        | 0xe000..=0xfffd | 0x10000..=0x10ffff)
}

/// The first byte go-yaml's reader refuses, and its message.
fn reader_error(input: &[u8]) -> Option<(usize, &'static str)> {
    // Valid UTF-8 (nearly every file, or the part before the first bad sequence) only needs
    // its characters checked.
    let at = std::str::from_utf8(input).map_or_else(|error| error.valid_up_to(), str::len);
    let valid = std::str::from_utf8(&input[..at]).unwrap_or_default();
    if let Some((bad, _)) = valid.char_indices().find(|&(_, c)| !allowed(u32::from(c))) {
        return Some((bad, "control characters are not allowed"));
    }
    // The sequence Rust refuses, which go-yaml refuses too, for one of these reasons.
    let lead = *input.get(at)?;
    let width = match lead {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return Some((at, "invalid leading UTF-8 octet")),
    };
    let Some(sequence) = input.get(at..at + width) else {
        return Some((at, "incomplete UTF-8 octet sequence"));
    };
    if sequence[1..].iter().any(|byte| byte & 0xc0 != 0x80) {
        return Some((at, "invalid trailing UTF-8 octet"));
    }
    let mut value = u32::from(lead) & [0x7f, 0x1f, 0x0f, 0x07][width - 1];
    for byte in &sequence[1..] {
        value = (value << 6) | u32::from(byte & 0x3f);
    }
    let shortest = [0, 0x80, 0x800, 0x10000][width - 1];
    if value < shortest {
        return Some((at, "invalid length of a UTF-8 sequence"));
    }
    Some((at, "invalid Unicode character"))
}

/// The line libyaml's marks give `index`: line breaks are LF, CR, CR LF, NEL, LS and PS.
fn line_at(input: &[u8], index: usize) -> usize {
    let text = String::from_utf8_lossy(input.get(..index).unwrap_or(input));
    let previous = std::iter::once('\0').chain(text.chars());
    text.chars()
        .zip(previous)
        .filter(|&(character, previous)| {
            matches!(character, '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
                || (character == '\n' && previous != '\r')
        })
        .count()
}

/// A scanner error at `index` as go-yaml words it (its line is the mark's, plus one).
fn scanner_error(input: &[u8], index: usize, problem: &str) -> YamlError {
    let line = line_at(input, index);
    YamlError::Yaml {
        line: (line != 0).then_some(line + 1),
        problem: problem.to_owned(),
    }
}

/// Stands in for a byte order mark libyaml would skip and go-yaml reads as text.
const BOM_STAND_IN: char = '\u{fefe}';

/// go-yaml skips a byte order mark at the start of a line only at the very start of its
/// buffer; libyaml skips it at the start of any line. Elsewhere go-yaml reads it as text, so
/// such marks are handed to libyaml as another character of the same class and turned back in
/// scalar values (unless the input holds that character already).
fn hide_inner_byte_order_marks(input: &mut [u8]) {
    const BOM: &[u8] = "\u{feff}".as_bytes();
    let stand_in = BOM_STAND_IN.to_string();
    // Both begin with the byte 0xef, which most files do not hold at all.
    if !input.contains(&0xef) || input.windows(3).any(|window| window == stand_in.as_bytes()) {
        return;
    }
    // The reader drops a leading mark and the scanner skips one right after it.
    let mut at = if input.starts_with(BOM) { 3 } else { 0 };
    if input[at..].starts_with(BOM) {
        at += 3;
    }
    while let Some(found) = input[at..].windows(3).position(|window| window == BOM) {
        let position = at + found;
        let line_start = position == 0
            || matches!(input[position - 1], b'\n' | b'\r')
            || (position >= 2 && input[position - 2..position] == [0xc2, 0x85])
            || (position >= 3
                && matches!(&input[position - 3..position], [0xe2, 0x80, 0xa8 | 0xa9]));
        if line_start {
            input[position..position + 3].copy_from_slice(stand_in.as_bytes());
        }
        at = position + 3;
    }
}

/// go-yaml's verdict on the first `%YAML` directive of the stream, which it checks before
/// looking at any later token: at most two digits a number, and version 1.1 only.
fn version_directive_error(input: &[u8]) -> Option<YamlError> {
    let text = String::from_utf8_lossy(input);
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if let Some(rest) = trimmed.strip_prefix("%YAML") {
            let version = rest
                .trim_start()
                .split([' ', '\t', '#'])
                .next()
                .unwrap_or_default();
            let (major, minor) = version.split_once('.')?;
            let digits = |number: &str| number.bytes().all(|byte| byte.is_ascii_digit());
            if !digits(major) || !digits(minor) {
                return None;
            }
            if major.len() > 2 || minor.len() > 2 {
                return Some(scanner_error(
                    input,
                    offset,
                    "found extremely long version number",
                ));
            }
            if (major, minor) != ("1", "1") {
                let line = line_at(input, offset);
                return Some(YamlError::Yaml {
                    line: (line != 0).then_some(line),
                    problem: "found incompatible YAML document".to_owned(),
                });
            }
            return None;
        }
        if !(trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('%')) {
            return None;
        }
        offset += line.len();
    }
    None
}

/// The escape in a double-quoted scalar's source that go-yaml refuses and libyaml accepts
/// (`\/`), if any.
fn refused_escape(source: &[u8]) -> Option<usize> {
    let mut escaped = false;
    let slash = source.iter().position(|&byte| {
        let refused = escaped && byte == b'/';
        escaped = !escaped && byte == b'\\';
        refused
    })?;
    Some(slash - 1)
}

/// Parses the first document into a node tree, with go-yaml v2's behaviour.
fn compose(original: &[u8]) -> Result<Option<Doc>, YamlError> {
    // go-yaml parses an empty input as a single line break.
    let mut input = if original.is_empty() { b"\n" } else { original }.to_vec();
    // UTF-16 input (by its byte order mark) is decoded by libyaml as by go-yaml.
    let utf16 = input.starts_with(&[0xff, 0xfe]) || input.starts_with(&[0xfe, 0xff]);
    let refused = if utf16 { None } else { reader_error(&input) };
    if let Some((at, _)) = refused {
        // libyaml never sees what go-yaml's reader refuses: it reports its own way.
        input.truncate(at);
    }
    hide_inner_byte_order_marks(&mut input);
    loop {
        let mut reached = Mark::default();
        let result = compose_events(&input, &mut reached);
        if let Some((at, problem)) = refused {
            // go-yaml meets the bad byte once it decodes the chunk holding it, which it does as
            // soon as the scanner needs any character of that chunk.
            let chunk_start = at - at % READER_CHUNK;
            if reached.index + 4 >= chunk_start {
                return Err(YamlError::Yaml {
                    line: None,
                    problem: problem.to_owned(),
                });
            }
        }
        match result {
            // libyaml refuses `\'`; go-yaml reads it as `'`. The same character, spelled in a
            // way both accept, lets the parse go on (lines do not move).
            Err(Failure::Parse(error))
                if error.problem == "found unknown escape character"
                    && input.get(error.problem_mark.index..error.problem_mark.index + 2)
                        == Some(b"\\'".as_slice()) =>
            {
                let at = error.problem_mark.index;
                input.splice(at..at + 2, b"\\x27".iter().copied());
            }
            Err(Failure::TagGoesOn(at)) => {
                let escaped = format!("%{:02X}", input[at]);
                input.splice(at..=at, escaped.bytes());
            }
            Err(Failure::Parse(error)) => {
                // libyaml accepts `%YAML 1.2` and longer numbers, then may fail later on.
                let directive = matches!(
                    error.problem.as_str(),
                    "found incompatible YAML document" | "did not find expected <document start>"
                );
                return Err(directive
                    .then(|| version_directive_error(&input))
                    .flatten()
                    .unwrap_or_else(|| error.into()));
            }
            Err(Failure::Go(error)) => return Err(error),
            Ok(doc) => return Ok(doc),
        }
    }
}

enum Failure {
    Parse(ParseError),
    Go(YamlError),
    /// go-yaml reads a tag on through this flow indicator, which libyaml ends it at.
    TagGoesOn(usize),
}

/// Where libyaml ends the tag whose `!` is at `bang`, if it ends it at a flow indicator, which
/// go-yaml's tag characters (YAML 1.1 URI characters) go on through. A verbatim tag (`!<...>`)
/// holds them in both; after its `>`, go-yaml refuses a comma that libyaml takes in a flow
/// collection, and refuses it as libyaml refuses `%`.
fn tag_stops_at_indicator(input: &[u8], bang: usize) -> Option<usize> {
    let tag = input.get(bang..).filter(|tag| tag.starts_with(b"!"))?;
    let verbatim = tag.starts_with(b"!<");
    let skip = 1 + usize::from(verbatim);
    let uri = |byte: &u8| {
        byte.is_ascii_alphanumeric()
            || b"-_;/?:@&=+$.%!~*'()".contains(byte)
            || (verbatim && b",[]".contains(byte))
    };
    let mut end = bang + skip + tag[skip..].iter().position(|byte| !uri(byte))?;
    end += usize::from(verbatim && input[end] == b'>');
    matches!(input.get(end), Some(b',' | b'[' | b']')).then_some(end)
}

/// Where the node properties at `start` go on after an anchor that comes first: past its
/// characters and the blanks, line breaks and comments between it and a tag.
fn after_anchor(input: &[u8], start: usize) -> usize {
    if input.get(start) != Some(&b'&') {
        return start;
    }
    let rest = &input[start + 1..];
    let name = rest
        .iter()
        .take_while(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-'))
        .count();
    let mut comment = false;
    let gap = rest[name..]
        .iter()
        .take_while(|&&byte| {
            comment = (comment || byte == b'#') && !matches!(byte, b'\r' | b'\n');
            comment || matches!(byte, b' ' | b'\t' | b'\r' | b'\n')
        })
        .count();
    start + 1 + name + gap
}

impl From<YamlError> for Failure {
    fn from(error: YamlError) -> Self {
        Self::Go(error)
    }
}

/// go-yaml's `parser.parse` of the first document, over libyaml's events.
fn compose_events(input: &[u8], reached: &mut Mark) -> Result<Option<Doc>, Failure> {
    let mut parser = Parser::new(input);
    let mut next = |reached: &mut Mark| match parser.next() {
        Ok((event, start, end)) => {
            *reached = end;
            Ok((event, start))
        }
        Err(error) => {
            *reached = error.problem_mark;
            // The scanner refused what follows a tag it ended at a flow indicator.
            let at = error.problem_mark.index;
            Err(
                match tag_stops_at_indicator(input, error.context_mark.index) {
                    Some(end) if error.scanner && end == at => Failure::TagGoesOn(at),
                    _ => Failure::Parse(error),
                },
            )
        }
    };
    next(reached)?; // STREAM-START
    let (event, _) = next(reached)?;
    let Event::DocumentStart { version } = event else {
        return Ok(None);
    };
    if version.is_some_and(|version| version != (1, 1))
        && let Some(error) = version_directive_error(input)
    {
        return Err(error.into());
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut anchors: HashMap<String, NodeId> = HashMap::new();
    // Open collections: the node, whether it is a flow collection and the line it starts on.
    let mut open: Vec<(NodeId, bool, usize)> = Vec::new();
    // The nesting of block (0) and flow (1) collections.
    let mut depths = [0; 2];
    loop {
        let (event, start) = next(reached)?;
        let id = nodes.len();
        let (node, anchor, opens) = match event {
            Event::Scalar {
                anchor,
                tag,
                value,
                plain_implicit,
                double_quoted,
                plain,
            } => {
                if double_quoted
                    && let Some(at) =
                        refused_escape(input.get(start.index..reached.index).unwrap_or_default())
                {
                    return Err(scanner_error(
                        input,
                        start.index + at,
                        "found unknown escape character",
                    )
                    .into());
                }
                // A tag libyaml ended at a comma in a flow collection, before an empty scalar.
                if !tag.is_empty()
                    && let Some(at) =
                        tag_stops_at_indicator(input, after_anchor(input, start.index))
                {
                    return Err(Failure::TagGoesOn(at));
                }
                if plain
                    && let Some(&(parent, true, open_line)) = open.last()
                    && let Some(at) = value.find('?')
                {
                    // go-yaml ends a plain scalar at `?` in a flow collection and reads a key
                    // indicator there, which no flow collection accepts after a node.
                    let question = input
                        .get(start.index..)
                        .and_then(|rest| rest.iter().position(|&byte| byte == b'?'))
                        .map_or(start.index + at, |offset| start.index + offset);
                    let line = match line_at(input, question) {
                        0 => open_line,
                        line => line,
                    };
                    let closer = if matches!(nodes.get(parent), Some(Node::Mapping(_))) {
                        '}'
                    } else {
                        ']'
                    };
                    return Err(YamlError::Yaml {
                        line: (line != 0).then_some(line),
                        problem: format!("did not find expected ',' or '{closer}'"),
                    }
                    .into());
                }
                let node = Node::Scalar {
                    value: value.replace(BOM_STAND_IN, "\u{feff}"),
                    tag,
                    implicit: plain_implicit,
                };
                (node, anchor, None)
            }
            Event::Alias { anchor } => {
                let Some(&target) = anchors.get(&anchor) else {
                    return Err(
                        decode_error(format!("unknown anchor '{anchor}' referenced")).into(),
                    );
                };
                let node = Node::Alias {
                    name: anchor,
                    target,
                };
                (node, None, None)
            }
            Event::SequenceStart { anchor, flow } => {
                (Node::Sequence(Vec::new()), anchor, Some(flow))
            }
            Event::MappingStart { anchor, flow } => (Node::Mapping(Vec::new()), anchor, Some(flow)),
            Event::CollectionEnd => {
                if let Some((_, flow, _)) = open.pop() {
                    depths[usize::from(flow)] -= 1;
                }
                if open.is_empty() {
                    break;
                }
                continue;
            }
            Event::StreamEnd | Event::DocumentStart { .. } | Event::DocumentEnd | Event::Other => {
                return Err(decode_error(
                    "attempted to go past the end of stream; corrupted value?".to_owned(),
                )
                .into());
            }
        };
        nodes.push(node);
        if let Some(name) = anchor {
            anchors.insert(name, id);
        }
        match open.last() {
            Some(&(parent, _, _)) => {
                if let Some(Node::Sequence(children) | Node::Mapping(children)) =
                    nodes.get_mut(parent)
                {
                    children.push(id);
                }
            }
            None if opens.is_none() => break,
            None => {}
        }
        if let Some(flow) = opens {
            open.push((id, flow, start.line));
            let depth = &mut depths[usize::from(flow)];
            *depth += 1;
            if *depth > MAX_DEPTH {
                return Err(
                    scanner_error(input, start.index, "exceeded max depth of 10000").into(),
                );
            }
        }
    }
    // go-yaml insists on the DOCUMENT-END event, which makes libyaml look at the next token.
    next(reached)?;
    Ok(Some(Doc { nodes, root: 0 }))
}
