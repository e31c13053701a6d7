//! Reads a config file the way upstream's `k8s.io/apimachinery/pkg/util/yaml.ToJSON` does.
//!
//! Upstream turns the file into JSON before `json.Unmarshal` sees it: text whose first
//! non-space character is `{` is taken as JSON as it stands; anything else goes through
//! `sigs.k8s.io/yaml.YAMLToJSON`, which decodes the first YAML document with go-yaml v2 (YAML
//! 1.1: `yes`/`no`/`on`/`off` are booleans, `0777` is octal, ...) into Go maps and re-encodes
//! it with `json.Marshal` (object keys sorted, duplicates collapsed, floats in Go's shortest
//! form). What comes out here is the structure `json.Unmarshal` would then see, and failures
//! carry go-yaml's wording (`yaml: line N: ...`) because operators compare them with what the
//! Go agent logged.
//!
//! Tokens come from `yaml_rust2`'s scanner (itself derived from libyaml, as go-yaml v2 is).
//! The parser on top of it follows the state machine of libyaml's parser as go-yaml v2 ships
//! it, so grammar errors, their wording and their (famously off-by-one) line numbers match
//! Go's. `yaml_rust2` follows YAML 1.2 and is stricter or looser than libyaml in places; the
//! token source below translates its errors to libyaml's and corrects the differences found
//! by comparing both on many thousands of generated documents (tabs, anchor names, tag
//! characters, escapes, trailing content after quoted scalars, flow-context keys, `%YAML`
//! versions, control characters).
//!
//! Differences from Go that remain: flow collections nested deeper than 255 levels are
//! rejected (`yaml_rust2`'s limit; Go allows 10000); U+2028 and U+2029 are not line breaks; a
//! byte order mark is skipped only at the start; `#` inside a tag and a lone `?` key at the
//! very end of the input are read differently; error messages for some malformed inputs
//! differ in wording or line; and when two keys stringify alike (`1` and `"1"`) the later one
//! wins here while Go picks at random.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use yaml_rust2::scanner::{Marker, ScanError, Scanner, TScalarStyle, Token, TokenType};

use super::gojson::{self, JsonSyntaxError};
use super::value::JsonValue;

/// Why a config file could not be turned into JSON, displayed exactly as the Go agent would
/// report it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum YamlError {
    /// The file looked like JSON (its first non-space character is `{`) and Go's JSON reader
    /// rejected it; the message is `encoding/json`'s, unchanged.
    #[error("{0}")]
    Json(#[from] JsonSyntaxError),
    /// go-yaml rejected the document: a syntax error (`yaml: line 3: did not find expected
    /// key`) or a decoding failure (`yaml: unknown anchor 'x' referenced`).
    #[error("yaml: {}{problem}", line_prefix(*.line))]
    Yaml {
        /// The line go-yaml names, if it names one (it omits line 0 and often reports the
        /// line before the problem for grammar errors).
        line: Option<usize>,
        /// libyaml's or go-yaml's description of the problem.
        problem: String,
    },
    /// `sigs.k8s.io/yaml` found a mapping key JSON cannot express (a null or a number above
    /// `i64::MAX`), e.g. `unsupported map key of type: %!s(<nil>), key: <nil>, value: 1`.
    #[error("{0}")]
    UnsupportedMapKey(String),
    /// `json.Marshal` refused a float JSON cannot express: `.inf`, `-.inf` or `.nan`.
    #[error("json: unsupported value: {0}")]
    UnsupportedValue(&'static str),
}

fn line_prefix(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

/// Converts a config file to the JSON structure upstream's `ToJSON` + `json.Unmarshal` see.
///
/// JSON input (first non-whitespace character `{`) goes to [`gojson::parse`]. YAML input
/// yields the first document only; an empty or comment-only file is `null`. Mapping keys
/// become strings and objects come back sorted by key without duplicates, as `json.Marshal`
/// would emit them; numbers are rendered as Go renders the value go-yaml resolved.
///
/// # Errors
///
/// [`YamlError`], worded as the Go agent words it.
pub fn to_json(text: &str) -> Result<JsonValue, YamlError> {
    if text
        .trim_start_matches(char::is_whitespace)
        .starts_with('{')
    {
        return gojson::parse(text).map_err(YamlError::Json);
    }
    // libyaml skips a UTF-8 byte order mark at the start of the stream.
    let original = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut work = Work::new(original);
    let mut attempts = 0;
    let (composed, reached) = loop {
        let text: String = work.chars.iter().collect();
        let src = Source::new(&text, &work.was_tab, work.restore_char());
        let (result, reached) = compose(&src);
        let reached = src.byte_at(reached);
        match result {
            Err(Failure::Rewrite(rewrite)) if attempts < MAX_REWRITES => {
                attempts += 1;
                if let Err(e) = work.apply(&rewrite) {
                    break (Err(e), reached);
                }
            }
            Err(Failure::Rewrite(rewrite)) => break (Err(rewrite.fallback), reached),
            Err(Failure::Error(e)) => break (Err(e), reached),
            Ok(doc) => break (Ok(doc), reached),
        }
    };
    if let Some(err) = control_character_error(original, reached) {
        return Err(err);
    }
    let Some(doc) = composed? else {
        return Ok(JsonValue::Null);
    };
    let value = Decoder::new(&doc).run()?;
    to_json_value(value)
}

// ---------------------------------------------------------------------------------------------
// Working around yaml_rust2 where it is stricter than libyaml (it follows YAML 1.2).
//
// A few inputs libyaml accepts make yaml_rust2 fail: a tab after `key:`, `\'` in a
// double-quoted scalar, and continuation lines of quoted scalars or flow collections indented
// less than the enclosing block. For those the text is rewritten without changing its meaning
// to libyaml and without moving anything to another line, and parsed again.

/// Upper bound on re-parses, so a hostile file cannot make conversion quadratic for long.
const MAX_REWRITES: usize = 100;

/// Why one parse attempt stopped.
#[derive(Debug)]
enum Failure {
    /// A final error.
    Error(YamlError),
    /// yaml_rust2 refused something libyaml accepts; rewrite and try again.
    Rewrite(Rewrite),
}

impl From<YamlError> for Failure {
    fn from(e: YamlError) -> Self {
        Self::Error(e)
    }
}

type PResult<T> = Result<T, Failure>;

#[derive(Debug)]
enum Edit {
    /// Turn the tabs in this char range into spaces (libyaml treats both as separators there).
    TabsToSpaces { from: usize, to: usize },
    /// Replace the `\'` escapes of the double-quoted scalar starting here by a stand-in.
    QuoteEscapes { start: usize },
    /// Replace the chars at these indices by `~`: tag characters libyaml accepts and
    /// yaml_rust2 does not (the tag stays a custom one either way).
    TagChars { at: Vec<usize> },
    /// Insert a space at these char indices, splitting what yaml_rust2 reads as one token
    /// where libyaml sees several (`?` and `:` in flow scalars, anchor names).
    InsertSpaces { at: Vec<usize> },
    /// Indent these lines (char index of their first char) further: libyaml ignores the
    /// indentation of quoted scalar continuation lines and of flow collection content.
    Indent { line_starts: Vec<usize> },
}

#[derive(Debug)]
struct Rewrite {
    edit: Edit,
    /// What to report if the rewrite cannot be done.
    fallback: YamlError,
}

/// The text being parsed, with what the rewrites changed.
#[derive(Debug)]
struct Work {
    chars: Vec<char>,
    /// Spaces that were tabs in the input (the tab checks must still see them).
    was_tab: Vec<bool>,
    /// The escape letter standing in for `\'` and the char it produces, once one was needed.
    stand_in: Option<(char, char)>,
    /// An escape whose char the input never produces by itself, usable as the stand-in.
    free_stand_in: Option<(char, char)>,
    /// Spaces added in front of under-indented lines: more than any line's indentation.
    indent_by: usize,
}

impl Work {
    fn new(text: &str) -> Self {
        // libyaml treats NEL as a line break (and folds it like one), yaml_rust2 as text.
        let chars: Vec<char> = text
            .chars()
            .map(|c| if c == '\u{85}' { '\n' } else { c })
            .collect();
        let lower = text.to_ascii_lowercase();
        let free_stand_in = [
            ('0', '\0', ["\\0", "\\x00", "\\u0000"]),
            ('a', '\u{7}', ["\\a", "\\x07", "\\u0007"]),
            ('e', '\u{1b}', ["\\e", "\\x1b", "\\u001b"]),
            ('v', '\u{b}', ["\\v", "\\x0b", "\\u000b"]),
        ]
        .into_iter()
        .find(|(_, _, forms)| forms.iter().all(|f| !lower.contains(f)))
        .map(|(letter, produced, _)| (letter, produced));
        let widest = text
            .lines()
            .map(|l| l.len() - l.trim_start_matches([' ', '\t']).len())
            .max();
        Self {
            was_tab: vec![false; chars.len()],
            chars,
            stand_in: None,
            free_stand_in,
            indent_by: widest.unwrap_or(0) + 1,
        }
    }

    fn restore_char(&self) -> Option<char> {
        self.stand_in.map(|(_, produced)| produced)
    }

    fn apply(&mut self, rewrite: &Rewrite) -> Result<(), YamlError> {
        match &rewrite.edit {
            Edit::TabsToSpaces { from, to } => {
                let mut changed = false;
                for i in *from..*to {
                    if let Some(c @ '\t') = self.chars.get_mut(i) {
                        *c = ' ';
                        if let Some(flag) = self.was_tab.get_mut(i) {
                            *flag = true;
                        }
                        changed = true;
                    }
                }
                if !changed {
                    return Err(rewrite.fallback.clone());
                }
            }
            Edit::QuoteEscapes { start } => {
                let Some((letter, produced)) = self.free_stand_in else {
                    return Err(rewrite.fallback.clone());
                };
                let mut changed = false;
                let mut i = start + 1;
                while let Some(&c) = self.chars.get(i) {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(e @ '\'') = self.chars.get_mut(i + 1) {
                                *e = letter;
                                changed = true;
                            }
                            i += 2;
                        }
                        _ => i += 1,
                    }
                }
                if !changed {
                    return Err(rewrite.fallback.clone());
                }
                self.stand_in = Some((letter, produced));
            }
            Edit::TagChars { at } => {
                if at.is_empty() {
                    return Err(rewrite.fallback.clone());
                }
                for &i in at {
                    if let Some(c) = self.chars.get_mut(i) {
                        *c = '~';
                    }
                }
            }
            Edit::InsertSpaces { at } => {
                if at.is_empty() {
                    return Err(rewrite.fallback.clone());
                }
                for &i in at.iter().rev() {
                    let i = i.min(self.chars.len());
                    self.chars.insert(i, ' ');
                    self.was_tab.insert(i, false);
                }
            }
            Edit::Indent { line_starts } => {
                if line_starts.is_empty() {
                    return Err(rewrite.fallback.clone());
                }
                for &at in line_starts.iter().rev() {
                    let at = at.min(self.chars.len());
                    self.chars
                        .splice(at..at, std::iter::repeat_n(' ', self.indent_by));
                    self.was_tab
                        .splice(at..at, std::iter::repeat_n(false, self.indent_by));
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Source text helpers.

/// The text being parsed, with the positional lookups error reporting needs.
#[derive(Debug)]
struct Source<'a> {
    text: &'a str,
    /// Byte offset of every char, indexed by char position (yaml_rust2 marks count chars).
    offsets: Vec<usize>,
    /// Per char: a space that was a tab in the input.
    was_tab: &'a [bool],
    /// The char standing in for `\'` in double-quoted scalars, if any.
    restore: Option<char>,
}

/// libyaml's reader accepts only these code points.
fn is_yaml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' | '\u{10000}'..)
}

/// Go's libyaml reader decodes input in chunks of this many bytes.
const READER_CHUNK: usize = 512;

impl<'a> Source<'a> {
    fn new(text: &'a str, was_tab: &'a [bool], restore: Option<char>) -> Self {
        Self {
            text,
            offsets: text.char_indices().map(|(i, _)| i).collect(),
            was_tab,
            restore,
        }
    }

    /// Whether the char at this index is (or was, before a rewrite) a tab.
    fn is_tab(&self, char_index: usize, c: char) -> bool {
        c == '\t' || (c == ' ' && self.was_tab.get(char_index).copied().unwrap_or(false))
    }

    /// Char index of a byte offset.
    fn char_at(&self, byte: usize) -> usize {
        self.offsets.partition_point(|&b| b < byte)
    }

    fn byte_at(&self, char_index: usize) -> usize {
        self.offsets
            .get(char_index)
            .copied()
            .unwrap_or(self.text.len())
    }

    /// The text from a marker on.
    fn text_from(&self, mark: Marker) -> &'a str {
        self.text
            .get(self.byte_at(mark.index())..)
            .unwrap_or_default()
    }

    /// 1-based line of the end of the input, counting line breaks as libyaml does.
    fn eof_line(&self) -> usize {
        line_breaks(self.text) + 1
    }

    /// The line go-yaml names for a problem at the end of the stream: libyaml moves its mark
    /// to a new line there unless the input ends with a line break.
    fn stream_end_line(&self) -> usize {
        let forced = usize::from(!self.text.is_empty() && !self.text.ends_with(['\n', '\r']));
        line_breaks(self.text) + 1 + forced
    }

    /// 1-based line number of a byte offset.
    fn line_of_byte(&self, byte: usize) -> usize {
        line_breaks(self.text.get(..byte).unwrap_or(self.text)) + 1
    }
}

/// libyaml reports `control characters are not allowed` once its reader decodes the chunk
/// holding one, which happens before the scanner gets near it: emulate that using how far
/// the scanner got (`reached`, a byte offset).
fn control_character_error(text: &str, reached: usize) -> Option<YamlError> {
    let (at, _) = text.char_indices().find(|&(_, c)| !is_yaml_char(c))?;
    let chunk_start = (at / READER_CHUNK) * READER_CHUNK;
    if chunk_start == 0 || reached + 4 >= chunk_start {
        Some(YamlError::Yaml {
            line: None,
            problem: "control characters are not allowed".into(),
        })
    } else {
        None
    }
}

/// Counts line breaks as libyaml does (CR LF is one break; NEL, LS and PS count too).
fn line_breaks(s: &str) -> usize {
    let mut n = 0;
    let mut prev_cr = false;
    for c in s.chars() {
        match c {
            '\n' if prev_cr => {}
            '\n' | '\r' | '\u{85}' | '\u{2028}' | '\u{2029}' => n += 1,
            _ => {}
        }
        prev_cr = c == '\r';
    }
    n
}

/// A scanner error: go-yaml prints `problem_mark.line + 1`, or nothing on the first line.
fn scanner_error(line: usize, problem: &str) -> YamlError {
    YamlError::Yaml {
        line: (line > 1).then_some(line),
        problem: problem.to_owned(),
    }
}

/// A parser error: go-yaml prints the 0-based line of the problem (one less than the real
/// line), falling back to the context's line, and nothing when both are 0.
fn parser_error(problem: Marker, context: Option<Marker>, text: &str) -> YamlError {
    let problem_line = problem.line().saturating_sub(1);
    let context_line = context.map_or(0, |m| m.line().saturating_sub(1));
    let line = if problem_line != 0 {
        Some(problem_line)
    } else if context_line != 0 {
        Some(context_line)
    } else {
        None
    };
    YamlError::Yaml {
        line,
        problem: text.to_owned(),
    }
}

/// A failure go-yaml raises while decoding (`failf`): no line number.
fn decode_error(problem: String) -> YamlError {
    YamlError::Yaml {
        line: None,
        problem,
    }
}

// ---------------------------------------------------------------------------------------------
// Scanner errors: yaml_rust2's wording translated to libyaml's.

/// Which line libyaml's problem mark would be on for an error yaml_rust2 reports inside a
/// double-quoted scalar starting at `start`: the first escape libyaml would reject.
fn bad_escape(src: &Source<'_>, start: Marker) -> Option<(usize, &'static str)> {
    let base = src.byte_at(start.index());
    let rest = src.text_from(start);
    let mut chars = rest.char_indices().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return None,
            '\\' => {
                let &(_, e) = chars.peek()?;
                let code_len = match e {
                    'x' => 2,
                    'u' => 4,
                    'U' => 8,
                    '0' | 'a' | 'b' | 't' | '\t' | 'n' | 'v' | 'f' | 'r' | 'e' | ' ' | '"'
                    | '\'' | '\\' | 'N' | '_' | 'L' | 'P' | '\r' | '\n' => 0,
                    _ => {
                        return Some((
                            src.line_of_byte(base + i),
                            "found unknown escape character",
                        ));
                    }
                };
                chars.next();
                let mut value: u32 = 0;
                for _ in 0..code_len {
                    match chars.peek().and_then(|&(_, h)| h.to_digit(16)) {
                        Some(d) => {
                            value = value.saturating_mul(16).saturating_add(d);
                            chars.next();
                        }
                        None => {
                            return Some((
                                src.line_of_byte(base + i),
                                "did not find expected hexdecimal number",
                            ));
                        }
                    }
                }
                if code_len > 0 && char::from_u32(value).is_none() {
                    return Some((
                        src.line_of_byte(base + i),
                        "found invalid Unicode character escape code",
                    ));
                }
            }
            _ => {}
        }
    }
    None
}

/// 1-based line of the first document marker (`---`/`...` at a line start) after `start`.
fn document_indicator_line(src: &Source<'_>, start: Marker) -> usize {
    let base = src.byte_at(start.index());
    let rest = src.text_from(start);
    let mut at_line_start = false;
    for (i, c) in rest.char_indices() {
        if at_line_start {
            let tail = rest.get(i..).unwrap_or_default();
            if (tail.starts_with("---") || tail.starts_with("..."))
                && tail[3..]
                    .chars()
                    .next()
                    .is_none_or(|c| matches!(c, ' ' | '\t' | '\r' | '\n'))
            {
                return src.line_of_byte(base + i);
            }
        }
        at_line_start = matches!(c, '\n' | '\r');
    }
    start.line()
}

fn translate_scan_error(e: &ScanError, src: &Source<'_>) -> YamlError {
    let mark = *e.marker();
    let line = mark.line();
    let info = e.info();
    let cannot_start = "found character that cannot start any token";
    match info {
        "tabs disallowed within this context (block indentation)"
        | "tabs disallowed in this context"
        | "'-' must be followed by a valid YAML whitespace"
        | "':' must be followed by a valid YAML whitespace"
        | "expected whitespace" => scanner_error(line, cannot_start),
        _ if info.starts_with("unexpected character:") => scanner_error(line, cannot_start),
        "simple key expect ':'" | "simple key expected" => {
            scanner_error(line, "could not find expected ':'")
        }
        "while scanning a quoted scalar, found unexpected end of stream" => {
            scanner_error(src.eof_line(), "found unexpected end of stream")
        }
        "while scanning a quoted scalar, found unexpected document indicator" => scanner_error(
            document_indicator_line(src, mark),
            "found unexpected document indicator",
        ),
        "while parsing a quoted scalar, found unknown escape character"
        | "while parsing a quoted scalar, did not find expected hexadecimal number"
        | "while parsing a quoted scalar, found invalid Unicode character escape code" => {
            match bad_escape(src, mark) {
                Some((l, problem)) => scanner_error(l, problem),
                // yaml_rust2 rejected an escape libyaml accepts (`\'`); report it anyway.
                None => scanner_error(line, "found unknown escape character"),
            }
        }
        "\"-\" is only valid inside a block" => {
            // libyaml emits the entry and lets the parser complain about it.
            parser_error(mark, None, "did not find expected node content")
        }
        "recursion limit exceeded" => scanner_error(line, "exceeded max depth of 10000"),
        "a block scalar content cannot start with a tab" => scanner_error(
            line + 1,
            "found a tab character where an indentation space is expected",
        ),
        "while scanning a plain scalar, found a tab" => {
            scanner_error(line + 1, "found a tab character that violates indentation")
        }
        "invalid global tag character" => scanner_error(line, "did not find expected tag URI"),
        _ => {
            // Most of yaml_rust2's messages are libyaml's context and problem joined by ", ";
            // go-yaml shows only the problem.
            let problem = match info.split_once(", ") {
                Some((context, problem)) if context.starts_with("while ") => problem,
                _ => info,
            };
            scanner_error(line, problem)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens, with the checks that make yaml_rust2's scanner reject what libyaml rejects.

#[derive(Debug)]
struct Tokens<'a> {
    scanner: Scanner<std::str::Chars<'a>>,
    src: &'a Source<'a>,
    /// Checked tokens the parser has not consumed yet.
    queue: VecDeque<Token>,
    tabs: TabTracker,
    /// Tokens taken from `scanner` so far.
    delivered: usize,
    /// Set once yaml_rust2 stopped on something libyaml scans differently: the tokens libyaml
    /// would produce up to that point, then what to report if the parser wants more.
    replay: Option<(VecDeque<Token>, YamlError)>,
}

impl<'a> Tokens<'a> {
    fn new(src: &'a Source<'a>) -> Self {
        Self {
            scanner: Scanner::new(src.text.chars()),
            src,
            queue: VecDeque::new(),
            tabs: TabTracker::new(),
            delivered: 0,
            replay: None,
        }
    }

    /// How far the scanner has read, in chars.
    fn reached(&self) -> usize {
        self.scanner.mark().index()
    }

    fn peek(&mut self) -> PResult<&Token> {
        while self.queue.is_empty() {
            self.fetch()?;
        }
        self.queue
            .front()
            .ok_or_else(|| decode_error("unknown problem parsing YAML content".into()).into())
    }

    fn skip(&mut self) {
        self.queue.pop_front();
    }

    fn take(&mut self) -> PResult<Token> {
        self.peek()?;
        self.queue
            .pop_front()
            .ok_or_else(|| decode_error("unknown problem parsing YAML content".into()).into())
    }

    /// Reads, checks and queues the next token (two after a BLOCK-MAPPING-START, whose
    /// position yaml_rust2 puts after its first key: the key's KEY token tells where it is).
    fn fetch(&mut self) -> PResult<()> {
        let token = self.raw()?;
        let block_mapping = matches!(token.1, TokenType::BlockMappingStart);
        let flow_key = matches!(token.1, TokenType::Key)
            && self.tabs.flow_level > 0
            && !self.src.text_from(token.0).starts_with('?');
        let key_mark = token.0;
        let key_at = self.queue.len();
        self.accept(token)?;
        if block_mapping {
            let next = self.raw()?;
            self.accept(next)?;
        }
        if flow_key {
            self.drop_stale_flow_key(key_mark, key_at)?;
        }
        Ok(())
    }

    /// libyaml forgets a possible simple key once the scanner leaves its line (or gets 1024
    /// chars past it), in flow context too, where yaml_rust2 keeps it. For a KEY yaml_rust2
    /// inserted in flow context, read on to its `:` and drop the KEY if libyaml would not
    /// have made one: the parser then sees the `:` as libyaml does, a value without a key.
    fn drop_stale_flow_key(&mut self, key: Marker, key_at: usize) -> PResult<()> {
        let level = self.tabs.flow_level;
        loop {
            let token = self.raw()?;
            let is_value = matches!(token.1, TokenType::Value) && self.tabs.flow_level == level;
            let is_end = matches!(token.1, TokenType::StreamEnd);
            let value_mark = token.0;
            self.accept(token)?;
            if is_end {
                return Ok(());
            }
            if is_value {
                if value_mark.line() > key.line() || key.index() + 1024 < value_mark.index() {
                    self.queue.remove(key_at);
                }
                return Ok(());
            }
            if self.tabs.flow_level < level {
                return Ok(());
            }
        }
    }

    fn accept(&mut self, token: Token) -> PResult<()> {
        // yaml_rust2 wraps `[a: b]` entries in braces of its own; libyaml's parser handles
        // the KEY inside a flow sequence itself (and words its errors accordingly).
        let here = self.src.text_from(token.0);
        let inserted = match token.1 {
            TokenType::FlowMappingStart => !here.starts_with('{'),
            TokenType::FlowMappingEnd => !here.starts_with('}'),
            _ => false,
        };
        if inserted {
            return Ok(());
        }
        self.check(&token)?;
        self.tabs.track(&token, self.src)?;
        let block_scalar = matches!(
            token.1,
            TokenType::Scalar(TScalarStyle::Literal | TScalarStyle::Folded, _)
        );
        self.queue.push_back(token);
        if block_scalar && self.block_scalar_may_end_input() {
            // yaml_rust2 ends a block scalar that runs into the end of the input with a line
            // break libyaml does not add.
            let before = self.queue.len();
            self.fetch()?;
            let at_end = self.queue.get(before).is_some_and(|t| {
                matches!(t.1, TokenType::StreamEnd | TokenType::BlockEnd)
                    && t.0.index() >= self.src.offsets.len()
            });
            if at_end
                && let Some(Token(_, TokenType::Scalar(_, value))) = self.queue.get_mut(before - 1)
                && value.ends_with('\n')
            {
                value.pop();
            }
        }
        Ok(())
    }

    /// Whether the input ends inside a line with content (no final line break).
    fn block_scalar_may_end_input(&self) -> bool {
        let text = self.src.text;
        !text.ends_with(['\n', '\r'])
            && text
                .rsplit(['\n', '\r'])
                .next()
                .is_some_and(|l| !l.trim().is_empty())
    }

    /// The next token from yaml_rust2, or from the replay once it stopped.
    fn raw(&mut self) -> PResult<Token> {
        if let Some((tokens, fallback)) = &mut self.replay {
            return tokens.pop_front().ok_or_else(|| fallback.clone().into());
        }
        match self.scanner.next_token() {
            Ok(Some(token)) => {
                self.delivered += 1;
                Ok(token)
            }
            Ok(None) => {
                let mark = self.scanner.mark();
                Err(parser_error(mark, None, "did not find expected <stream-start>").into())
            }
            Err(e) => self.on_scan_error(&e),
        }
    }

    /// Continues with the tokens libyaml would produce: yaml_rust2's tokens for the text
    /// before `cut` (as far as they were not delivered yet), then `then`.
    fn start_replay(
        &mut self,
        cut: usize,
        then: Vec<Token>,
        fallback: YamlError,
    ) -> PResult<Token> {
        let prefix = self
            .src
            .text
            .get(..self.src.byte_at(cut))
            .unwrap_or_default();
        let mut scanner = Scanner::new(prefix.chars());
        let mut tokens = Vec::new();
        loop {
            match scanner.next_token() {
                Ok(Some(token)) => tokens.push(token),
                Ok(None) => break,
                Err(_) => return Err(fallback.into()),
            }
        }
        // Drop what only the artificial end of input produced.
        while tokens.last().is_some_and(|t| {
            matches!(t.1, TokenType::BlockEnd | TokenType::StreamEnd) && t.0.index() >= cut
        }) {
            tokens.pop();
        }
        let mut rest: VecDeque<Token> = tokens.into_iter().skip(self.delivered).collect();
        rest.extend(then);
        let first = rest.pop_front();
        self.replay = Some((rest, fallback.clone()));
        first.ok_or_else(|| fallback.into())
    }

    /// Decides what a yaml_rust2 scanner error means for libyaml: the same error reworded, a
    /// different libyaml error, or a construct libyaml accepts (rewrite and retry).
    fn on_scan_error(&mut self, e: &ScanError) -> PResult<Token> {
        let src = self.src;
        let fallback = translate_scan_error(e, src);
        let mark = *e.marker();
        let rewrite = |edit| {
            Err(Failure::Rewrite(Rewrite {
                edit,
                fallback: fallback.clone(),
            }))
        };
        if let Some(stale) = self.stale_flow_key(mark) {
            return Err(stale.into());
        }
        // A tab libyaml refuses before the failing token comes first.
        if self.tabs.flow_level == 0 && self.tabs.gap_is_blank(src, mark.index()) {
            self.tabs.check_gap(src, mark.index())?;
        }
        match e.info() {
            "while scanning a tag, did not find expected whitespace or line break"
            | "while parsing a tag, did not find expected tag URI" => {
                match libyaml_tag(src.text_from(mark)) {
                    Ok(odd) => {
                        let at = odd.into_iter().map(|k| mark.index() + k).collect();
                        rewrite(Edit::TagChars { at })
                    }
                    Err(problem) => Err(scanner_error(mark.line(), problem).into()),
                }
            }
            "while scanning a plain scalar, found a tab" => {
                let line = first_tab_indented_line(src, mark).unwrap_or(mark.line() + 1);
                Err(scanner_error(line, "found a tab character that violates indentation").into())
            }
            info if info.starts_with("while scanning a YAML directive") => {
                let start = src
                    .text
                    .get(..src.byte_at(mark.index()))
                    .unwrap_or_default();
                let line_start = start.rfind(['\n', '\r']).map_or(0, |p| p + 1);
                let directive = src.text.get(line_start..).unwrap_or_default();
                match version_directive_problem(directive) {
                    Some(problem) => Err(scanner_error(mark.line(), problem).into()),
                    None => Err(fallback.into()),
                }
            }
            "invalid trailing content after double-quoted scalar" => {
                self.trailing_content(mark, fallback.clone())
            }
            "illegal placement of ':' indicator" => {
                // libyaml sees the (multi-line) key as an entry followed by a VALUE token.
                let value = Token(mark, TokenType::Value);
                self.start_replay(mark.index(), vec![value], fallback)
            }
            "invalid content after document end marker" => {
                // libyaml ends the document at `...` and go-yaml reads no further.
                self.start_replay(mark.index(), Vec::new(), fallback)
            }
            "':' must be followed by a valid YAML whitespace" => {
                // libyaml takes the tabs after the `:` of a simple key as separators; the tab
                // checks still see them (and refuse them after a `?` key) on the next attempt.
                let colon = src
                    .text
                    .get(..src.byte_at(mark.index()))
                    .map_or(0, |before| {
                        src.char_at(before.trim_end_matches([' ', '\t']).len())
                    });
                rewrite(Edit::TabsToSpaces {
                    from: colon,
                    to: mark.index(),
                })
            }
            "tabs disallowed within this context (block indentation)"
            | "tabs disallowed in this context"
            | "'-' must be followed by a valid YAML whitespace" => {
                // Reword as libyaml would, when every token before the tab has been seen.
                if self.tabs.gap_is_blank(src, mark.index()) || self.tabs.gap_is_block() {
                    self.tabs.check_gap(src, mark.index() + 1)?;
                }
                Err(fallback.into())
            }
            "while parsing a quoted scalar, found unknown escape character" => {
                let quote_escape = src.text_from(mark).contains("\\'");
                if bad_escape(src, mark).is_none() && quote_escape {
                    rewrite(Edit::QuoteEscapes {
                        start: mark.index(),
                    })
                } else {
                    Err(fallback.into())
                }
            }
            "invalid indentation in quoted scalar" => {
                let single = src.text_from(mark).starts_with('\'');
                match libyaml_quoted_end(src, mark, single) {
                    Ok(end) => {
                        let starts = line_starts_between(src, mark.index(), end);
                        rewrite(Edit::Indent {
                            line_starts: starts,
                        })
                    }
                    Err(libyaml_error) => Err(libyaml_error.into()),
                }
            }
            "comments must be separated from other tokens by whitespace" => {
                // libyaml starts a comment at any `#` between tokens.
                rewrite(Edit::InsertSpaces {
                    at: vec![mark.index()],
                })
            }
            "tab cannot be used as indentation"
            | "invalid indentation"
            | "invalid indentation in flow construct" => {
                let byte = src.byte_at(mark.index());
                let line_start = src
                    .text
                    .get(..byte)
                    .map_or(0, |b| b.rfind(['\n', '\r']).map_or(0, |p| p + 1));
                rewrite(Edit::Indent {
                    line_starts: vec![src.char_at(line_start)],
                })
            }
            _ => Err(fallback.into()),
        }
    }

    /// yaml_rust2 holds back a flow collection that may be a simple key until the collection
    /// ends; libyaml gives up on a required one (at the block's indentation) as soon as its
    /// scanner reaches the next line, with `could not find expected ':'`. Called when
    /// yaml_rust2 fails at `failed`: returns libyaml's error if it comes first.
    fn stale_flow_key(&self, failed: Marker) -> Option<YamlError> {
        let src = self.src;
        if self.tabs.flow_level > 0 {
            return None;
        }
        let from = src.byte_at(self.tabs.prev_end);
        let rest = src.text.get(from..)?;
        let mut in_comment = false;
        let offset = rest.char_indices().find_map(|(i, c)| {
            match c {
                '\n' | '\r' => in_comment = false,
                '#' => in_comment = true,
                ' ' | '\t' => {}
                _ if !in_comment => return Some(i),
                _ => {}
            }
            None
        })?;
        let at = src.char_at(from + offset);
        let opener = rest.get(offset..)?;
        if !opener.starts_with(['[', '{']) || !self.tabs.key_allowed_after_gap(src, at) {
            return None;
        }
        let line_start = src
            .text
            .get(..from + offset)?
            .rfind(['\n', '\r'])
            .map_or(0, |p| p + 1);
        let col = src.text.get(line_start..from + offset)?.chars().count();
        if self.tabs.indents.last() != Some(&col) {
            return None;
        }
        // The first token on a later line is where libyaml notices.
        let line_end = opener.find(['\n', '\r'])?;
        let mut in_comment = false;
        let next = opener.get(line_end..)?.char_indices().find_map(|(i, c)| {
            match c {
                '\n' | '\r' => in_comment = false,
                '#' => in_comment = true,
                ' ' | '\t' => {}
                _ if !in_comment => return Some(i),
                _ => {}
            }
            None
        });
        let next_byte = next.map_or(src.text.len(), |i| from + offset + line_end + i);
        if src.byte_at(failed.index()) < next_byte {
            return None;
        }
        let line = if next.is_some() {
            src.line_of_byte(next_byte)
        } else {
            src.stream_end_line()
        };
        Some(scanner_error(line, "could not find expected ':'"))
    }

    /// yaml_rust2 refuses anything but a line end, `:` (or `,]}` in flow) right after a
    /// quoted scalar; libyaml scans it as the next token. Work out what libyaml reports.
    fn trailing_content(&mut self, at: Marker, fallback: YamlError) -> PResult<Token> {
        let src = self.src;
        let rest = src.text_from(at);
        let mut chars = rest.chars();
        let c = chars.next().unwrap_or(' ');
        let next = chars.next().unwrap_or('\n');
        let blankz = |c: char| matches!(c, ' ' | '\t' | '\r' | '\n');
        let line = at.line();
        // The closing quote is the last non-blank char before `at`.
        let before = src.text.get(..src.byte_at(at.index())).unwrap_or_default();
        let cut = src.char_at(before.trim_end_matches([' ', '\t']).len());
        let flow = self.flow_level_at(cut);
        if flow == 0 && c == '-' && blankz(next) {
            return Err(scanner_error(
                line,
                "block sequence entries are not allowed in this context",
            )
            .into());
        }
        if flow == 0 && c == '?' && blankz(next) {
            return Err(scanner_error(line, "mapping keys are not allowed in this context").into());
        }
        if matches!(c, '%' | '@' | '`') {
            return Err(scanner_error(line, "found character that cannot start any token").into());
        }
        if matches!(c, '&' | '*') && !(next.is_ascii_alphanumeric() || next == '_' || next == '-') {
            return Err(scanner_error(
                line,
                "did not find expected alphabetic or numeric character",
            )
            .into());
        }
        if matches!(c, '\'' | '"') {
            libyaml_quoted_end(src, at, c == '\'')?;
        }
        if flow == 0 && value_indicator_later(rest).is_none() {
            // A quoted scalar at the block's indentation must be a key: libyaml gives up on it
            // at the next line.
            let line_start = before.rfind(['\n', '\r']).map_or(0, |p| p + 1);
            let lead = before.get(line_start..).unwrap_or_default();
            let quote_col = lead
                .trim_end_matches(['"', '\''])
                .rfind(['"', '\''])
                .map(|p| lead.get(..p).unwrap_or_default());
            if let Some(indent) = quote_col {
                let col = indent.chars().count();
                if indent.trim().is_empty() && self.tabs.indents.last() == Some(&col) {
                    let after = rest.find(['\n', '\r']).and_then(|e| {
                        let tail = rest.get(e..)?;
                        let k = tail.find(|c: char| !c.is_whitespace())?;
                        Some(src.byte_at(at.index()) + e + k)
                    });
                    let line = after.map_or_else(|| src.stream_end_line(), |b| src.line_of_byte(b));
                    return Err(scanner_error(line, "could not find expected ':'").into());
                }
            }
        }
        if flow == 0 && value_indicator_later(rest).is_some() {
            // A `:` later on the line makes the quoted scalar a simple key, if one could
            // start where it does (then the mapping has no key for what follows it).
            let line_start = before.rfind(['\n', '\r']).map_or(0, |p| p + 1);
            if key_may_start_before_quote(before.get(line_start..).unwrap_or_default()) {
                return Err(parser_error(at, None, "did not find expected key").into());
            }
        }
        let next_token = Token(at, TokenType::Scalar(TScalarStyle::Plain, String::new()));
        self.start_replay(cut, vec![next_token], fallback)
    }

    /// The flow nesting level just before char index `at`, from yaml_rust2's tokens.
    fn flow_level_at(&self, at: usize) -> usize {
        let prefix = self
            .src
            .text
            .get(..self.src.byte_at(at))
            .unwrap_or_default();
        let mut level: usize = 0;
        for Token(mark, kind) in Scanner::new(prefix.chars()) {
            let here = self.src.text_from(mark);
            match kind {
                TokenType::FlowSequenceStart | TokenType::FlowMappingStart
                    if here.starts_with(['[', '{']) =>
                {
                    level += 1;
                }
                TokenType::FlowSequenceEnd | TokenType::FlowMappingEnd
                    if here.starts_with([']', '}']) =>
                {
                    level = level.saturating_sub(1);
                }
                _ => {}
            }
        }
        level
    }

    /// Rejects tokens libyaml's scanner would not have produced.
    fn check(&self, token: &Token) -> PResult<()> {
        let Token(mark, kind) = token;
        match kind {
            TokenType::Anchor(name) | TokenType::Alias(name) => {
                // libyaml's names are [0-9A-Za-z_-]+, ended by a blank or one of `?:,]}%@``.
                let bad = name
                    .char_indices()
                    .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'));
                if let Some((i, c)) = bad {
                    if !matches!(c, '?' | ':' | '%' | '@' | '`') || i == 0 {
                        return Err(scanner_error(
                            mark.line(),
                            "did not find expected alphabetic or numeric character",
                        )
                        .into());
                    }
                    // libyaml ends the name there and scans the rest as the next token.
                    let split = mark.index() + 1 + name.get(..i).map_or(0, |n| n.chars().count());
                    let fallback = scanner_error(
                        mark.line(),
                        "did not find expected alphabetic or numeric character",
                    );
                    return Err(Failure::Rewrite(Rewrite {
                        edit: Edit::InsertSpaces { at: vec![split] },
                        fallback,
                    }));
                }
            }
            TokenType::Tag(..) => {
                // libyaml's tags take in `!`, `,`, `[` and `]` (flow context included).
                let text = self.src.text_from(*mark);
                if !text.starts_with("!<") {
                    match libyaml_tag(text) {
                        Ok(odd) if odd.is_empty() => {}
                        Ok(odd) => {
                            let at = odd.into_iter().map(|k| mark.index() + k).collect();
                            let fallback = scanner_error(
                                mark.line(),
                                "did not find expected whitespace or line break",
                            );
                            return Err(Failure::Rewrite(Rewrite {
                                edit: Edit::TagChars { at },
                                fallback,
                            }));
                        }
                        Err(problem) => return Err(scanner_error(mark.line(), problem).into()),
                    }
                }
            }
            TokenType::TagDirective(handle, _) if handle.is_empty() => {
                // yaml_rust2 turns an unknown `%DIRECTIVE` into an empty tag directive.
                return Err(scanner_error(mark.line(), "found unknown directive name").into());
            }
            TokenType::VersionDirective(..) => {
                if let Some(problem) = version_directive_problem(self.src.text_from(*mark)) {
                    return Err(scanner_error(mark.line(), problem).into());
                }
            }
            TokenType::Scalar(TScalarStyle::Plain, value) if self.tabs.flow_level > 0 => {
                let here = self.src.text_from(*mark);
                if value.starts_with(['|', '>']) {
                    return Err(scanner_error(
                        mark.line(),
                        "found character that cannot start any token",
                    )
                    .into());
                }
                // In flow context `?` and `:` starting a token are indicators for libyaml
                // (separate them so yaml_rust2 agrees), and `?` also ends a plain scalar, which
                // leaves a KEY token where the parser wants `,` or the closing bracket.
                if value.starts_with(['?', ':']) {
                    let at = vec![mark.index() + 1];
                    let fallback = parser_error(*mark, None, "did not find expected node content");
                    return Err(Failure::Rewrite(Rewrite {
                        edit: Edit::InsertSpaces { at },
                        fallback,
                    }));
                }
                if here.starts_with(value.as_str()) && value.contains('?') {
                    let problem = if self.tabs.in_flow_mapping() {
                        "did not find expected ',' or '}'"
                    } else {
                        "did not find expected ',' or ']'"
                    };
                    return Err(parser_error(*mark, None, problem).into());
                }
            }
            TokenType::Scalar(TScalarStyle::DoubleQuoted, _) => {
                if let Some((line, problem)) = bad_escape(self.src, *mark) {
                    return Err(scanner_error(line, problem).into());
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// How libyaml treats the blanks between the previous token and the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gap {
    /// The previous token's end is not known (block scalars, multi-line plain scalars).
    Unknown,
    /// libyaml's `scan_to_next_token`: a tab is refused where a simple key may start, which in
    /// block context is after a line break or after a `-`, `?` or `:` indicator.
    Normal { key_allowed: bool },
    /// After a plain scalar, whose scanner swallows the following blanks and line breaks
    /// itself and refuses a tab left of the block's indentation on a later line.
    Plain { indent: usize },
    /// A block scalar whose content starts at the previous token's mark, indented this much:
    /// libyaml refuses a tab left of that indentation on the lines that may still belong to
    /// it.
    Block { indent: usize },
}

/// Follows yaml_rust2's tokens closely enough to find the tabs libyaml refuses and
/// yaml_rust2 accepts (libyaml allows tabs only where no token may start).
#[derive(Debug)]
struct TabTracker {
    flow_level: usize,
    /// Columns of the open block collections (libyaml's `indents`).
    indents: Vec<usize>,
    /// Char index just past the previous token's text.
    prev_end: usize,
    gap: Gap,
    /// Kinds of the open flow collections (`true` for mappings).
    brackets: Vec<bool>,
    /// A flow collection libyaml saved as a required simple key, not yet followed by `:`.
    flow_key: Option<Marker>,
    /// The last BLOCK-MAPPING-START's column is to be taken from the next token.
    indent_pending: bool,
    /// Whether the pending block-context key is a simple one (its KEY token was inserted):
    /// libyaml allows a tab after its `:`, but not after the `:` of a `?` key.
    simple_key: bool,
}

/// Where libyaml's scanner would end a quoted scalar starting at `start`: just past its
/// closing quote, or the error libyaml reports (a document marker inside it, or the end of
/// the input). libyaml does not care how its continuation lines are indented.
fn libyaml_quoted_end(src: &Source<'_>, start: Marker, single: bool) -> Result<usize, YamlError> {
    let base = src.byte_at(start.index());
    let text = src.text_from(start);
    let mut chars = text.char_indices().skip(1).peekable();
    let mut line_start = false;
    while let Some((i, c)) = chars.next() {
        if line_start {
            let tail = text.get(i..).unwrap_or_default();
            let marker = tail.starts_with("---") || tail.starts_with("...");
            if marker
                && tail[3..]
                    .chars()
                    .next()
                    .is_none_or(|c| matches!(c, ' ' | '\t' | '\r' | '\n'))
            {
                let line = src.line_of_byte(base + i);
                return Err(scanner_error(line, "found unexpected document indicator"));
            }
        }
        line_start = matches!(c, '\n' | '\r');
        match c {
            '\'' if single => {
                if chars.peek().is_some_and(|&(_, n)| n == '\'') {
                    chars.next();
                } else {
                    return Ok(src.char_at(base + i) + 1);
                }
            }
            '\\' if !single => {
                if let Some(&(_, n)) = chars.peek()
                    && !matches!(n, '\r' | '\n')
                {
                    chars.next();
                }
            }
            '"' if !single => return Ok(src.char_at(base + i) + 1),
            _ => {}
        }
    }
    Err(scanner_error(
        src.eof_line(),
        "found unexpected end of stream",
    ))
}

/// Char indices of the starts of the lines that begin strictly between two char indices.
fn line_starts_between(src: &Source<'_>, from: usize, to: usize) -> Vec<usize> {
    let (a, b) = (src.byte_at(from), src.byte_at(to));
    let mut starts = Vec::new();
    let Some(text) = src.text.get(a..b) else {
        return starts;
    };
    let mut prev = ' ';
    for (i, c) in text.char_indices() {
        if matches!(prev, '\n' | '\r') && c != '\n' {
            starts.push(src.char_at(a + i));
        }
        prev = c;
    }
    starts
}

/// Char index just past a quoted scalar starting at `start` (the opening quote).
fn quoted_end(src: &Source<'_>, start: usize, single: bool) -> Option<usize> {
    let text = src.text.get(src.byte_at(start)..)?;
    let mut chars = text.chars().enumerate().skip(1).peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if single => {
                if chars.peek().is_some_and(|&(_, n)| n == '\'') {
                    chars.next();
                } else {
                    return Some(start + i + 1);
                }
            }
            '\\' if !single => {
                chars.next();
            }
            '"' if !single => return Some(start + i + 1),
            _ => {}
        }
    }
    None
}

impl TabTracker {
    fn new() -> Self {
        Self {
            flow_level: 0,
            indents: Vec::new(),
            prev_end: 0,
            gap: Gap::Normal { key_allowed: true },
            simple_key: false,
            indent_pending: false,
            flow_key: None,
            brackets: Vec::new(),
        }
    }

    fn track(&mut self, token: &Token, src: &Source<'_>) -> PResult<()> {
        let Token(mark, kind) = token;
        let at = mark.index();
        let here = src.text_from(*mark);
        // Tokens yaml_rust2 inserts without text of their own: block collection boundaries,
        // the KEY of a simple key, and the braces of `[a: b]`.
        if let Some(key) = self.flow_key {
            // libyaml's stale check for a required simple key (a flow collection starting at
            // the block's indentation): it must be followed by `:` on the same line.
            if mark.line() > key.line() || key.index() + 1024 < mark.index() {
                return Err(scanner_error(mark.line(), "could not find expected ':'").into());
            }
        }
        if self.indent_pending {
            // The column of a mapping is its first key's, which yaml_rust2 does not put on
            // the BLOCK-MAPPING-START token (that one sits at the `:`).
            self.indent_pending = false;
            if let Some(last) = self.indents.last_mut() {
                *last = mark.col();
            }
        }
        let is_real = match kind {
            TokenType::BlockSequenceStart => {
                self.indents.push(mark.col());
                false
            }
            TokenType::BlockMappingStart => {
                self.indents.push(mark.col());
                self.indent_pending = true;
                return Ok(());
            }
            TokenType::BlockEnd => {
                self.indents.pop();
                false
            }
            TokenType::Key => {
                let real = here.starts_with('?');
                if self.flow_level == 0 {
                    self.simple_key = !real;
                }
                real
            }
            TokenType::FlowMappingStart => here.starts_with('{'),
            TokenType::FlowMappingEnd => here.starts_with('}'),
            _ => true,
        };
        if !is_real {
            // They sit where the next real token starts, so the blanks before it can be
            // checked already (the parser may fail on them before that token is read).
            if self.flow_level == 0
                && !matches!(
                    kind,
                    TokenType::FlowMappingStart | TokenType::FlowMappingEnd
                )
            {
                self.check_gap(src, at)?;
            }
            return Ok(());
        }
        // yaml_rust2 places a `-` entry after the blanks that follow the dash.
        let start = match kind {
            TokenType::BlockEntry => dash_before(src, *mark).unwrap_or(at),
            _ => at,
        };
        if self.flow_level == 0 {
            self.check_gap(src, start)?;
        }
        let (end, gap) = match kind {
            TokenType::StreamStart(_) => (0, Gap::Normal { key_allowed: true }),
            TokenType::StreamEnd => (at, Gap::Unknown),
            TokenType::Key => (
                at + 1,
                Gap::Normal {
                    key_allowed: self.flow_level == 0,
                },
            ),
            TokenType::Value => {
                let key_allowed = self.flow_level == 0 && !self.simple_key;
                if self.flow_level == 0 {
                    self.simple_key = false;
                    self.flow_key = None;
                }
                (at + 1, Gap::Normal { key_allowed })
            }
            TokenType::BlockEntry => (start + 1, Gap::Normal { key_allowed: true }),
            TokenType::FlowEntry => (at + 1, Gap::Normal { key_allowed: true }),
            TokenType::FlowSequenceStart | TokenType::FlowMappingStart => {
                if self.flow_level == 0
                    && self.indents.last() == Some(&mark.col())
                    && self.key_allowed_after_gap(src, at)
                {
                    self.flow_key = Some(*mark);
                }
                self.flow_level += 1;
                self.brackets
                    .push(matches!(kind, TokenType::FlowMappingStart));
                (at + 1, Gap::Normal { key_allowed: true })
            }
            TokenType::FlowSequenceEnd | TokenType::FlowMappingEnd => {
                self.flow_level = self.flow_level.saturating_sub(1);
                self.brackets.pop();
                (at + 1, Gap::Normal { key_allowed: false })
            }
            TokenType::Anchor(name) | TokenType::Alias(name) => (
                at + 1 + name.chars().count(),
                Gap::Normal { key_allowed: false },
            ),
            TokenType::Tag(..) => {
                let len = here
                    .chars()
                    .take_while(|c| !matches!(c, ' ' | '\t' | '\r' | '\n'))
                    .count();
                (at + len, Gap::Normal { key_allowed: false })
            }
            TokenType::DocumentStart | TokenType::DocumentEnd => {
                (at + 3, Gap::Normal { key_allowed: false })
            }
            TokenType::VersionDirective(..) | TokenType::TagDirective(..) => {
                // A directive takes its line break with it: no key may start right after.
                let len = here
                    .chars()
                    .take_while(|c| !matches!(c, '\r' | '\n'))
                    .count();
                let brk = if here.chars().nth(len) == Some('\r')
                    && here.chars().nth(len + 1) == Some('\n')
                {
                    2
                } else {
                    1
                };
                (at + len + brk, Gap::Normal { key_allowed: false })
            }
            TokenType::Scalar(TScalarStyle::Plain, value) => {
                if !value.contains(['\n', '\r']) && here.starts_with(value.as_str()) {
                    let indent = self.indents.last().map_or(0, |c| c + 1);
                    (at + value.chars().count(), Gap::Plain { indent })
                } else {
                    (at, Gap::Unknown)
                }
            }
            TokenType::Scalar(
                style @ (TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted),
                _,
            ) => match quoted_end(src, at, *style == TScalarStyle::SingleQuoted) {
                Some(end) => (end, Gap::Normal { key_allowed: false }),
                None => (at, Gap::Unknown),
            },
            TokenType::Scalar(..) => {
                // yaml_rust2 marks a block scalar at its first content line, and the column
                // there is the scalar's indentation unless an explicit indicator says more.
                let header = src.text.get(..src.byte_at(at)).unwrap_or_default();
                let indicator = header
                    .rfind(['|', '>'])
                    .map(|p| header.get(p..).unwrap_or_default());
                let explicit = indicator.is_none_or(|h| {
                    h.lines()
                        .next()
                        .unwrap_or_default()
                        .contains(|c: char| c.is_ascii_digit())
                });
                if explicit || mark.col() == 0 {
                    (at, Gap::Unknown)
                } else {
                    (at, Gap::Block { indent: mark.col() })
                }
            }
            TokenType::BlockSequenceStart | TokenType::BlockMappingStart | TokenType::BlockEnd => {
                (at, Gap::Unknown)
            }
        };
        self.prev_end = end;
        self.gap = gap;
        Ok(())
    }

    fn in_flow_mapping(&self) -> bool {
        self.brackets.last().copied().unwrap_or(false)
    }

    /// Whether libyaml would allow a simple key at `until`, after the current gap.
    fn key_allowed_after_gap(&self, src: &Source<'_>, until: usize) -> bool {
        let start = src.byte_at(self.prev_end);
        let end = src.byte_at(until).max(start);
        let has_break = src
            .text
            .get(start..end)
            .is_some_and(|g| g.contains(['\n', '\r']));
        match self.gap {
            Gap::Unknown => false,
            Gap::Normal { key_allowed } => key_allowed || has_break,
            Gap::Plain { .. } => has_break,
            Gap::Block { .. } => true,
        }
    }

    fn gap_is_block(&self) -> bool {
        matches!(self.gap, Gap::Block { .. })
    }

    /// Whether only blanks, line breaks and comments lie between the previous token and
    /// `until` (so no token was read there that this tracker has not seen).
    fn gap_is_blank(&self, src: &Source<'_>, until: usize) -> bool {
        let start = src.byte_at(self.prev_end);
        let end = src.byte_at(until).max(start);
        let mut in_comment = false;
        src.text
            .get(start..end)
            .unwrap_or_default()
            .chars()
            .all(|c| match c {
                '\n' | '\r' => {
                    in_comment = false;
                    true
                }
                '#' => {
                    in_comment = true;
                    true
                }
                ' ' | '\t' => true,
                _ => in_comment,
            })
    }

    /// Looks for a refused tab between the previous token and the one starting at `until`.
    fn check_gap(&self, src: &Source<'_>, until: usize) -> PResult<()> {
        let from = self.prev_end;
        let gap_chars = || {
            let start = src.byte_at(from);
            let end = src.byte_at(until).max(start);
            let text = src.text.get(start..end).unwrap_or_default();
            text.chars().enumerate().map(move |(k, c)| (from + k, c))
        };
        let refuse = |at: usize, problem: &str| -> PResult<()> {
            Err(scanner_error(src.line_of_byte(src.byte_at(at)), problem).into())
        };
        let cannot_start = "found character that cannot start any token";
        match self.gap {
            Gap::Unknown => Ok(()),
            Gap::Normal { key_allowed } => match first_refused_tab(src, gap_chars(), key_allowed) {
                Some(at) => refuse(at, cannot_start),
                None => Ok(()),
            },
            Gap::Block { indent } => {
                // Skip the content lines; on the lines after, blanks up to the indentation
                // belong to the scalar, and a tab among them is refused.
                let mut chars = gap_chars().peekable();
                let mut first_line = true;
                loop {
                    let mut col = 0;
                    let mut line_end = false;
                    while let Some(&(at, c)) = chars.peek() {
                        if c == ' ' && !src.is_tab(at, c) {
                            col += 1;
                            chars.next();
                            continue;
                        }
                        if src.is_tab(at, c) && col < indent && !first_line {
                            return refuse(
                                at,
                                "found a tab character where an indentation space is expected",
                            );
                        }
                        line_end = matches!(c, '\n' | '\r');
                        break;
                    }
                    if (col >= indent || first_line || line_end) && chars.peek().is_some() {
                        // Content or blank line: skip to the next line.
                        first_line = false;
                        for (_, c) in chars.by_ref() {
                            if matches!(c, '\n' | '\r') {
                                break;
                            }
                        }
                        continue;
                    }
                    // The scalar ended; the rest is scanned with keys allowed.
                    return match first_refused_tab(src, chars, true) {
                        Some(at) => refuse(at, cannot_start),
                        None => Ok(()),
                    };
                }
            }
            Gap::Plain { indent } => {
                let mut col = 0;
                let mut after_break = false;
                let mut chars = gap_chars();
                while let Some((at, c)) = chars.next() {
                    match c {
                        '\n' | '\r' => {
                            after_break = true;
                            col = 0;
                        }
                        ' ' | '\t' => {
                            if after_break && col < indent && src.is_tab(at, c) {
                                return refuse(
                                    at,
                                    "found a tab character that violates indentation",
                                );
                            }
                            col += 1;
                        }
                        '#' => {
                            // The plain scalar ends at the comment; the rest is scanned as
                            // usual, with keys allowed if a line break was swallowed.
                            let rest = std::iter::once((at, c)).chain(chars);
                            return match first_refused_tab(src, rest, after_break) {
                                Some(at) => refuse(at, cannot_start),
                                None => Ok(()),
                            };
                        }
                        _ => return Ok(()),
                    }
                }
                Ok(())
            }
        }
    }
}

/// Char index of the first tab libyaml's `scan_to_next_token` would stop at: one met where
/// a key may start (after a line break, or from the start if `key_allowed`), outside comments.
fn first_refused_tab(
    src: &Source<'_>,
    chars: impl Iterator<Item = (usize, char)>,
    key_allowed: bool,
) -> Option<usize> {
    let mut allowed = key_allowed;
    let mut in_comment = false;
    for (at, c) in chars {
        match c {
            '\n' | '\r' => {
                in_comment = false;
                allowed = true;
            }
            '#' => in_comment = true,
            ' ' | '\t' if allowed && !in_comment && src.is_tab(at, c) => return Some(at),
            _ => {}
        }
    }
    None
}

/// Whether libyaml allows a simple key at the quoted scalar that ends `line` (the text of
/// its line up to the closing quote): at the line start, after `- ` or `? `, or after node
/// properties there.
fn key_may_start_before_quote(line: &str) -> bool {
    let mut lead = line.trim_start_matches([' ', '\t']);
    loop {
        if lead.starts_with(['"', '\'']) {
            return true;
        }
        let word_end = lead.find([' ', '\t']).unwrap_or(lead.len());
        let word = lead.get(..word_end).unwrap_or_default();
        if word.is_empty() || !(word == "-" || word == "?" || word.starts_with(['&', '!'])) {
            return false;
        }
        lead = lead
            .get(word_end..)
            .unwrap_or_default()
            .trim_start_matches([' ', '\t']);
    }
}

/// Offset in `rest` (a line's remainder) of a `:` libyaml would take as a mapping value
/// indicator in block context: followed by a blank or the line end, outside quotes and
/// comments.
fn value_indicator_later(rest: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    let mut chars = rest.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if matches!(c, '\n' | '\r') {
            return None;
        }
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '\'' | '"' if matches!(prev, ' ' | '\t') => quote = Some(c),
                '#' if matches!(prev, ' ' | '\t') => return None,
                ':' if chars
                    .peek()
                    .is_none_or(|&(_, n)| matches!(n, ' ' | '\t' | '\r' | '\n')) =>
                {
                    return Some(i);
                }
                _ => {}
            },
        }
        prev = c;
    }
    None
}

/// libyaml's reading of a tag (`text` starts at its `!`): the char offsets of characters
/// it accepts in the tag and yaml_rust2 does not, or libyaml's error.
fn libyaml_tag(text: &str) -> Result<Vec<usize>, &'static str> {
    let chars: Vec<char> = text.chars().collect();
    let uri = |c: char| c.is_ascii_alphanumeric() || "-_;/?:@&=+$,.!~*'()[]%".contains(c);
    let mut i = 1;
    if chars.get(1) == Some(&'<') {
        return Err("did not find the expected '>'");
    }
    while chars
        .get(i)
        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
    {
        i += 1;
    }
    let handle_end = if chars.get(i) == Some(&'!') { i + 1 } else { 1 };
    let mut k = handle_end;
    while chars.get(k).copied().is_some_and(uri) {
        k += 1;
    }
    if handle_end > 1 && k == handle_end {
        return Err("did not find expected tag URI");
    }
    if !chars
        .get(k)
        .is_none_or(|c| matches!(c, ' ' | '\t' | '\r' | '\n'))
    {
        return Err("did not find expected whitespace or line break");
    }
    Ok((handle_end..k)
        .filter(|&j| {
            chars
                .get(j)
                .is_some_and(|c| matches!(c, '!' | ',' | '[' | ']'))
        })
        .collect())
}

/// 1-based line of the first line after `start`'s whose indentation holds a tab.
fn first_tab_indented_line(src: &Source<'_>, start: Marker) -> Option<usize> {
    let base = src.byte_at(start.index());
    let rest = src.text_from(start);
    let first_break = rest.find(['\n', '\r'])?;
    let mut offset = first_break;
    for line in rest.get(first_break..)?.split_inclusive(['\n', '\r']) {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        if line.get(..indent).is_some_and(|i| i.contains('\t')) {
            return Some(src.line_of_byte(base + offset + indent.min(1)));
        }
        offset += line.len();
    }
    None
}

/// libyaml's complaint about a `%YAML` directive line (`text` starts at the `%`), if any:
/// it allows at most two digits per number.
fn version_directive_problem(text: &str) -> Option<&'static str> {
    let line = text.lines().next().unwrap_or_default();
    let mut rest = line
        .get(5..)
        .unwrap_or_default()
        .trim_start_matches([' ', '\t']);
    // The major number, a `.`, the minor number.
    for i in 0..2 {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits > 2 {
            return Some("found extremely long version number");
        }
        if digits == 0 {
            return Some("did not find expected version number");
        }
        rest = rest.get(digits..).unwrap_or_default();
        if i == 0 {
            match rest.strip_prefix('.') {
                Some(r) => rest = r,
                None => return Some("did not find expected digit or '.' character"),
            }
        }
    }
    let rest = rest.trim_start_matches([' ', '\t']);
    if rest.is_empty() || rest.starts_with('#') {
        None
    } else {
        Some("did not find expected comment or line break")
    }
}

/// Char index of the `-` of a block entry whose token yaml_rust2 placed after the blanks.
fn dash_before(src: &Source<'_>, mark: Marker) -> Option<usize> {
    let end = src.byte_at(mark.index());
    let trimmed = src.text.get(..end)?.trim_end_matches([' ', '\t']);
    if !trimmed.ends_with('-') {
        return None;
    }
    src.offsets.binary_search(&(trimmed.len() - 1)).ok()
}

// ---------------------------------------------------------------------------------------------
// Parser: libyaml's parserc.go over yaml_rust2's tokens.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PState {
    StreamStart,
    ImplicitDocumentStart,
    DocumentStart,
    DocumentContent,
    DocumentEnd,
    BlockNode,
    BlockSequenceFirstEntry,
    BlockSequenceEntry,
    IndentlessSequenceEntry,
    BlockMappingFirstKey,
    BlockMappingKey,
    BlockMappingValue,
    FlowSequenceFirstEntry,
    FlowSequenceEntry,
    FlowSequenceEntryMappingKey,
    FlowSequenceEntryMappingValue,
    FlowSequenceEntryMappingEnd,
    FlowMappingFirstKey,
    FlowMappingKey,
    FlowMappingValue,
    FlowMappingEmptyValue,
    End,
}

#[derive(Debug)]
enum Event {
    StreamStart,
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias {
        name: String,
    },
    Scalar {
        value: String,
        anchor: Option<String>,
        tag: String,
        implicit: bool,
    },
    SequenceStart {
        anchor: Option<String>,
    },
    SequenceEnd,
    MappingStart {
        anchor: Option<String>,
    },
    MappingEnd,
}

/// Token kinds without payload, for the many "is the next token one of ..." tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    StreamStart,
    StreamEnd,
    VersionDirective,
    TagDirective,
    DocumentStart,
    DocumentEnd,
    BlockSequenceStart,
    BlockMappingStart,
    BlockEnd,
    FlowSequenceStart,
    FlowSequenceEnd,
    FlowMappingStart,
    FlowMappingEnd,
    BlockEntry,
    FlowEntry,
    Key,
    Value,
    Alias,
    Anchor,
    Tag,
    Scalar,
}

fn kind_of(t: &TokenType) -> Kind {
    match t {
        TokenType::StreamStart(_) => Kind::StreamStart,
        TokenType::StreamEnd => Kind::StreamEnd,
        TokenType::VersionDirective(..) => Kind::VersionDirective,
        TokenType::TagDirective(..) => Kind::TagDirective,
        TokenType::DocumentStart => Kind::DocumentStart,
        TokenType::DocumentEnd => Kind::DocumentEnd,
        TokenType::BlockSequenceStart => Kind::BlockSequenceStart,
        TokenType::BlockMappingStart => Kind::BlockMappingStart,
        TokenType::BlockEnd => Kind::BlockEnd,
        TokenType::FlowSequenceStart => Kind::FlowSequenceStart,
        TokenType::FlowSequenceEnd => Kind::FlowSequenceEnd,
        TokenType::FlowMappingStart => Kind::FlowMappingStart,
        TokenType::FlowMappingEnd => Kind::FlowMappingEnd,
        TokenType::BlockEntry => Kind::BlockEntry,
        TokenType::FlowEntry => Kind::FlowEntry,
        TokenType::Key => Kind::Key,
        TokenType::Value => Kind::Value,
        TokenType::Alias(_) => Kind::Alias,
        TokenType::Anchor(_) => Kind::Anchor,
        TokenType::Tag(..) => Kind::Tag,
        TokenType::Scalar(..) => Kind::Scalar,
    }
}

#[derive(Debug)]
struct Parser<'a> {
    tokens: Tokens<'a>,
    state: PState,
    states: Vec<PState>,
    marks: Vec<Marker>,
    tag_directives: Vec<(String, String)>,
}

const SECONDARY_TAG_PREFIX: &str = "tag:yaml.org,2002:";

impl<'a> Parser<'a> {
    fn new(src: &'a Source<'a>) -> Self {
        Self {
            tokens: Tokens::new(src),
            state: PState::StreamStart,
            states: Vec::new(),
            marks: Vec::new(),
            tag_directives: Vec::new(),
        }
    }

    fn peek(&mut self) -> PResult<(Kind, Marker)> {
        let t = self.tokens.peek()?;
        Ok((kind_of(&t.1), t.0))
    }

    fn take(&mut self) -> PResult<Token> {
        self.tokens.take()
    }

    fn pop_state(&mut self) {
        self.state = self.states.pop().unwrap_or(PState::End);
    }

    fn pop_mark(&mut self) -> Option<Marker> {
        self.marks.pop()
    }

    fn empty_scalar() -> Event {
        Event::Scalar {
            value: String::new(),
            anchor: None,
            tag: String::new(),
            implicit: true,
        }
    }

    fn next_event(&mut self) -> PResult<(Event, Marker)> {
        match self.state {
            PState::StreamStart => self.stream_start(),
            PState::ImplicitDocumentStart => self.document_start(true),
            PState::DocumentStart => self.document_start(false),
            PState::DocumentContent => self.document_content(),
            PState::DocumentEnd => self.document_end(),
            PState::BlockNode => self.parse_node(true, false),
            PState::BlockSequenceFirstEntry => self.block_sequence_entry(true),
            PState::BlockSequenceEntry => self.block_sequence_entry(false),
            PState::IndentlessSequenceEntry => self.indentless_sequence_entry(),
            PState::BlockMappingFirstKey => self.block_mapping_key(true),
            PState::BlockMappingKey => self.block_mapping_key(false),
            PState::BlockMappingValue => self.block_mapping_value(),
            PState::FlowSequenceFirstEntry => self.flow_sequence_entry(true),
            PState::FlowSequenceEntry => self.flow_sequence_entry(false),
            PState::FlowSequenceEntryMappingKey => self.flow_sequence_entry_mapping_key(),
            PState::FlowSequenceEntryMappingValue => self.flow_sequence_entry_mapping_value(),
            PState::FlowSequenceEntryMappingEnd => {
                let (_, mark) = self.peek()?;
                self.state = PState::FlowSequenceEntry;
                Ok((Event::MappingEnd, mark))
            }
            PState::FlowMappingFirstKey => self.flow_mapping_key(true),
            PState::FlowMappingKey => self.flow_mapping_key(false),
            PState::FlowMappingValue => self.flow_mapping_value(false),
            PState::FlowMappingEmptyValue => self.flow_mapping_value(true),
            PState::End => {
                let mark = self.tokens.scanner.mark();
                Ok((Event::StreamEnd, mark))
            }
        }
    }

    fn stream_start(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if kind != Kind::StreamStart {
            return Err(parser_error(mark, None, "did not find expected <stream-start>").into());
        }
        self.state = PState::ImplicitDocumentStart;
        self.tokens.skip();
        Ok((Event::StreamStart, mark))
    }

    fn document_start(&mut self, implicit: bool) -> PResult<(Event, Marker)> {
        let (mut kind, mut mark) = self.peek()?;
        if !implicit {
            while kind == Kind::DocumentEnd {
                self.tokens.skip();
                (kind, mark) = self.peek()?;
            }
        }
        let explicit_kinds = [
            Kind::VersionDirective,
            Kind::TagDirective,
            Kind::DocumentStart,
            Kind::StreamEnd,
        ];
        if implicit && !explicit_kinds.contains(&kind) {
            self.process_directives()?;
            self.states.push(PState::DocumentEnd);
            self.state = PState::BlockNode;
            Ok((Event::DocumentStart, mark))
        } else if kind != Kind::StreamEnd {
            self.process_directives()?;
            let (kind, mark) = self.peek()?;
            if kind != Kind::DocumentStart {
                return Err(
                    parser_error(mark, None, "did not find expected <document start>").into(),
                );
            }
            self.states.push(PState::DocumentEnd);
            self.state = PState::DocumentContent;
            self.tokens.skip();
            Ok((Event::DocumentStart, mark))
        } else {
            self.state = PState::End;
            self.tokens.skip();
            Ok((Event::StreamEnd, mark))
        }
    }

    fn process_directives(&mut self) -> PResult<()> {
        let mut seen_version = false;
        loop {
            let token = self.tokens.peek()?;
            let mark = token.0;
            match &token.1 {
                TokenType::VersionDirective(major, minor) => {
                    if seen_version {
                        return Err(
                            parser_error(mark, None, "found duplicate %YAML directive").into()
                        );
                    }
                    if *major != 1 || *minor != 1 {
                        return Err(
                            parser_error(mark, None, "found incompatible YAML document").into()
                        );
                    }
                    seen_version = true;
                }
                TokenType::TagDirective(handle, prefix) => {
                    let (handle, prefix) = (handle.clone(), prefix.clone());
                    if self.tag_directives.iter().any(|(h, _)| *h == handle) {
                        return Err(
                            parser_error(mark, None, "found duplicate %TAG directive").into()
                        );
                    }
                    self.tag_directives.push((handle, prefix));
                }
                _ => break,
            }
            self.tokens.skip();
        }
        for (handle, prefix) in [("!", "!"), ("!!", SECONDARY_TAG_PREFIX)] {
            if !self.tag_directives.iter().any(|(h, _)| h == handle) {
                self.tag_directives
                    .push((handle.to_owned(), prefix.to_owned()));
            }
        }
        Ok(())
    }

    fn document_content(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if matches!(
            kind,
            Kind::VersionDirective
                | Kind::TagDirective
                | Kind::DocumentStart
                | Kind::DocumentEnd
                | Kind::StreamEnd
        ) {
            self.pop_state();
            return Ok((Self::empty_scalar(), mark));
        }
        self.parse_node(true, false)
    }

    fn document_end(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if kind == Kind::DocumentEnd {
            self.tokens.skip();
        }
        self.tag_directives.clear();
        self.state = PState::DocumentStart;
        Ok((Event::DocumentEnd, mark))
    }

    fn parse_node(&mut self, block: bool, indentless: bool) -> PResult<(Event, Marker)> {
        let (kind, start_mark) = self.peek()?;
        if kind == Kind::Alias {
            self.pop_state();
            let Token(mark, t) = self.take()?;
            let name = match t {
                TokenType::Alias(name) => name,
                _ => String::new(),
            };
            return Ok((Event::Alias { name }, mark));
        }
        let mut anchor = None;
        let mut tag_parts = None;
        let mut tag_mark = start_mark;
        if kind == Kind::Anchor {
            if let Token(_, TokenType::Anchor(name)) = self.take()? {
                anchor = Some(name);
            }
            let (kind, mark) = self.peek()?;
            if kind == Kind::Tag {
                tag_mark = mark;
                if let Token(_, TokenType::Tag(handle, suffix)) = self.take()? {
                    tag_parts = Some((handle, suffix));
                }
            }
        } else if kind == Kind::Tag {
            if let Token(_, TokenType::Tag(handle, suffix)) = self.take()? {
                tag_parts = Some((handle, suffix));
            }
            let (kind, _) = self.peek()?;
            if kind == Kind::Anchor
                && let Token(_, TokenType::Anchor(name)) = self.take()?
            {
                anchor = Some(name);
            }
        }
        let mut tag = String::new();
        if let Some((handle, suffix)) = tag_parts {
            if handle.is_empty() {
                tag = suffix;
            } else {
                match self.tag_directives.iter().find(|(h, _)| *h == handle) {
                    Some((_, prefix)) => tag = format!("{prefix}{suffix}"),
                    None => {
                        return Err(parser_error(
                            tag_mark,
                            Some(start_mark),
                            "found undefined tag handle",
                        )
                        .into());
                    }
                }
            }
        }
        let implicit = tag.is_empty();
        let (kind, mark) = self.peek()?;
        if indentless && kind == Kind::BlockEntry {
            self.state = PState::IndentlessSequenceEntry;
            return Ok((Event::SequenceStart { anchor }, start_mark));
        }
        match kind {
            Kind::Scalar => {
                self.pop_state();
                let Token(_, t) = self.take()?;
                let (style, value) = match t {
                    TokenType::Scalar(style, value) => (style, value),
                    _ => (TScalarStyle::Plain, String::new()),
                };
                let value = match self.tokens.src.restore {
                    Some(stand_in) if style == TScalarStyle::DoubleQuoted => {
                        value.replace(stand_in, "'")
                    }
                    _ => value,
                };
                let implicit = (tag.is_empty() && style == TScalarStyle::Plain) || tag == "!";
                Ok((
                    Event::Scalar {
                        value,
                        anchor,
                        tag,
                        implicit,
                    },
                    start_mark,
                ))
            }
            Kind::FlowSequenceStart => {
                self.state = PState::FlowSequenceFirstEntry;
                Ok((Event::SequenceStart { anchor }, start_mark))
            }
            Kind::FlowMappingStart => {
                self.state = PState::FlowMappingFirstKey;
                Ok((Event::MappingStart { anchor }, start_mark))
            }
            Kind::BlockSequenceStart if block => {
                self.state = PState::BlockSequenceFirstEntry;
                Ok((Event::SequenceStart { anchor }, start_mark))
            }
            Kind::BlockMappingStart if block => {
                self.state = PState::BlockMappingFirstKey;
                Ok((Event::MappingStart { anchor }, start_mark))
            }
            _ if anchor.is_some() || !tag.is_empty() => {
                self.pop_state();
                let value = String::new();
                Ok((
                    Event::Scalar {
                        value,
                        anchor,
                        tag,
                        implicit,
                    },
                    start_mark,
                ))
            }
            _ => Err(
                parser_error(mark, Some(start_mark), "did not find expected node content").into(),
            ),
        }
    }

    fn block_sequence_entry(&mut self, first: bool) -> PResult<(Event, Marker)> {
        if first {
            let (_, mark) = self.peek()?;
            self.marks.push(mark);
            self.tokens.skip();
        }
        let (kind, mark) = self.peek()?;
        match kind {
            Kind::BlockEntry => {
                self.tokens.skip();
                let (kind, next) = self.peek()?;
                if kind != Kind::BlockEntry && kind != Kind::BlockEnd {
                    self.states.push(PState::BlockSequenceEntry);
                    self.parse_node(true, false)
                } else {
                    self.state = PState::BlockSequenceEntry;
                    Ok((Self::empty_scalar(), next))
                }
            }
            Kind::BlockEnd => {
                self.pop_state();
                self.pop_mark();
                self.tokens.skip();
                Ok((Event::SequenceEnd, mark))
            }
            _ => {
                let context = self.pop_mark();
                Err(parser_error(mark, context, "did not find expected '-' indicator").into())
            }
        }
    }

    fn indentless_sequence_entry(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if kind == Kind::BlockEntry {
            self.tokens.skip();
            let (kind, next) = self.peek()?;
            if !matches!(
                kind,
                Kind::BlockEntry | Kind::Key | Kind::Value | Kind::BlockEnd
            ) {
                self.states.push(PState::IndentlessSequenceEntry);
                return self.parse_node(true, false);
            }
            self.state = PState::IndentlessSequenceEntry;
            return Ok((Self::empty_scalar(), next));
        }
        self.pop_state();
        Ok((Event::SequenceEnd, mark))
    }

    fn block_mapping_key(&mut self, first: bool) -> PResult<(Event, Marker)> {
        if first {
            let (_, mark) = self.peek()?;
            self.marks.push(mark);
            self.tokens.skip();
        }
        let (kind, mark) = self.peek()?;
        match kind {
            Kind::Key => {
                self.tokens.skip();
                let (kind, next) = self.peek()?;
                if !matches!(kind, Kind::Key | Kind::Value | Kind::BlockEnd) {
                    self.states.push(PState::BlockMappingValue);
                    self.parse_node(true, true)
                } else {
                    self.state = PState::BlockMappingValue;
                    Ok((Self::empty_scalar(), next))
                }
            }
            Kind::BlockEnd => {
                self.pop_state();
                self.pop_mark();
                self.tokens.skip();
                Ok((Event::MappingEnd, mark))
            }
            _ => {
                let context = self.pop_mark();
                Err(parser_error(mark, context, "did not find expected key").into())
            }
        }
    }

    fn block_mapping_value(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if kind == Kind::Value {
            self.tokens.skip();
            let (kind, next) = self.peek()?;
            if !matches!(kind, Kind::Key | Kind::Value | Kind::BlockEnd) {
                self.states.push(PState::BlockMappingKey);
                return self.parse_node(true, true);
            }
            self.state = PState::BlockMappingKey;
            return Ok((Self::empty_scalar(), next));
        }
        self.state = PState::BlockMappingKey;
        Ok((Self::empty_scalar(), mark))
    }

    fn flow_sequence_entry(&mut self, first: bool) -> PResult<(Event, Marker)> {
        if first {
            let (_, mark) = self.peek()?;
            self.marks.push(mark);
            self.tokens.skip();
        }
        let (mut kind, mut mark) = self.peek()?;
        if kind != Kind::FlowSequenceEnd {
            if !first {
                if kind == Kind::FlowEntry {
                    self.tokens.skip();
                    (kind, mark) = self.peek()?;
                } else {
                    let context = self.pop_mark();
                    return Err(
                        parser_error(mark, context, "did not find expected ',' or ']'").into(),
                    );
                }
            }
            if kind == Kind::Key {
                self.state = PState::FlowSequenceEntryMappingKey;
                self.tokens.skip();
                return Ok((Event::MappingStart { anchor: None }, mark));
            } else if kind != Kind::FlowSequenceEnd {
                self.states.push(PState::FlowSequenceEntry);
                return self.parse_node(false, false);
            }
        }
        self.pop_state();
        self.pop_mark();
        self.tokens.skip();
        Ok((Event::SequenceEnd, mark))
    }

    fn flow_sequence_entry_mapping_key(&mut self) -> PResult<(Event, Marker)> {
        let (kind, mark) = self.peek()?;
        if !matches!(kind, Kind::Value | Kind::FlowEntry | Kind::FlowSequenceEnd) {
            self.states.push(PState::FlowSequenceEntryMappingValue);
            return self.parse_node(false, false);
        }
        // libyaml (as vendored by go-yaml v2) consumes the token here.
        self.tokens.skip();
        self.state = PState::FlowSequenceEntryMappingValue;
        Ok((Self::empty_scalar(), mark))
    }

    fn flow_sequence_entry_mapping_value(&mut self) -> PResult<(Event, Marker)> {
        let (mut kind, mut mark) = self.peek()?;
        if kind == Kind::Value {
            self.tokens.skip();
            (kind, mark) = self.peek()?;
            if kind != Kind::FlowEntry && kind != Kind::FlowSequenceEnd {
                self.states.push(PState::FlowSequenceEntryMappingEnd);
                return self.parse_node(false, false);
            }
        }
        self.state = PState::FlowSequenceEntryMappingEnd;
        Ok((Self::empty_scalar(), mark))
    }

    fn flow_mapping_key(&mut self, first: bool) -> PResult<(Event, Marker)> {
        if first {
            let (_, mark) = self.peek()?;
            self.marks.push(mark);
            self.tokens.skip();
        }
        let (mut kind, mut mark) = self.peek()?;
        if kind != Kind::FlowMappingEnd {
            if !first {
                if kind == Kind::FlowEntry {
                    self.tokens.skip();
                    (kind, mark) = self.peek()?;
                } else {
                    let context = self.pop_mark();
                    return Err(
                        parser_error(mark, context, "did not find expected ',' or '}'").into(),
                    );
                }
            }
            if kind == Kind::Key {
                self.tokens.skip();
                let (kind, next) = self.peek()?;
                if !matches!(kind, Kind::Value | Kind::FlowEntry | Kind::FlowMappingEnd) {
                    self.states.push(PState::FlowMappingValue);
                    return self.parse_node(false, false);
                }
                self.state = PState::FlowMappingValue;
                return Ok((Self::empty_scalar(), next));
            } else if kind != Kind::FlowMappingEnd {
                self.states.push(PState::FlowMappingEmptyValue);
                return self.parse_node(false, false);
            }
        }
        self.pop_state();
        self.pop_mark();
        self.tokens.skip();
        Ok((Event::MappingEnd, mark))
    }

    fn flow_mapping_value(&mut self, empty: bool) -> PResult<(Event, Marker)> {
        let (mut kind, mut mark) = self.peek()?;
        if empty {
            self.state = PState::FlowMappingKey;
            return Ok((Self::empty_scalar(), mark));
        }
        if kind == Kind::Value {
            self.tokens.skip();
            (kind, mark) = self.peek()?;
            if kind != Kind::FlowEntry && kind != Kind::FlowMappingEnd {
                self.states.push(PState::FlowMappingKey);
                return self.parse_node(false, false);
            }
        }
        self.state = PState::FlowMappingKey;
        Ok((Self::empty_scalar(), mark))
    }
}

// ---------------------------------------------------------------------------------------------
// Composer: the node tree of the first document, as go-yaml's `parser` builds it.

type NodeId = usize;

#[derive(Debug)]
enum Node {
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

#[derive(Debug)]
struct Doc {
    nodes: Vec<Node>,
    root: NodeId,
}

/// go-yaml's libyaml rejects block nesting deeper than this.
const MAX_DEPTH: usize = 10_000;

/// Parses the first document into a node tree. Also returns how far the scanner read, in
/// chars, which decides whether libyaml's reader would have met a control character.
fn compose(src: &Source<'_>) -> (PResult<Option<Doc>>, usize) {
    let mut parser = Parser::new(src);
    let result = compose_with(&mut parser);
    (result, parser.tokens.reached())
}

fn compose_with(parser: &mut Parser<'_>) -> PResult<Option<Doc>> {
    parser.next_event()?; // STREAM-START
    let (event, _) = parser.next_event()?;
    if !matches!(event, Event::DocumentStart) {
        return Ok(None);
    }
    let mut nodes: Vec<Node> = Vec::new();
    let mut anchors: HashMap<String, NodeId> = HashMap::new();
    let mut open: Vec<NodeId> = Vec::new();
    let mut root = None;
    loop {
        let (event, mark) = parser.next_event()?;
        let id = nodes.len();
        let (node, anchor, opens) = match event {
            Event::Scalar {
                value,
                anchor,
                tag,
                implicit,
            } => (
                Node::Scalar {
                    value,
                    tag,
                    implicit,
                },
                anchor,
                false,
            ),
            Event::Alias { name } => {
                let Some(&target) = anchors.get(&name) else {
                    return Err(decode_error(format!("unknown anchor '{name}' referenced")).into());
                };
                (Node::Alias { name, target }, None, false)
            }
            Event::SequenceStart { anchor } => (Node::Sequence(Vec::new()), anchor, true),
            Event::MappingStart { anchor } => (Node::Mapping(Vec::new()), anchor, true),
            Event::SequenceEnd | Event::MappingEnd => {
                open.pop();
                if open.is_empty() {
                    break;
                }
                continue;
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {
                return Err(decode_error(
                    "attempted to go past the end of stream; corrupted value?".into(),
                )
                .into());
            }
        };
        nodes.push(node);
        if let Some(name) = anchor {
            anchors.insert(name, id);
        }
        match open.last() {
            Some(&parent) => {
                if let Some(Node::Sequence(children) | Node::Mapping(children)) =
                    nodes.get_mut(parent)
                {
                    children.push(id);
                }
            }
            None => root = Some(id),
        }
        if opens {
            open.push(id);
            if open.len() > MAX_DEPTH {
                return Err(scanner_error(mark.line(), "exceeded max depth of 10000").into());
            }
        } else if open.is_empty() {
            break;
        }
    }
    // go-yaml insists on the DOCUMENT-END event, which makes libyaml look at the next token.
    parser.next_event()?;
    let root = root.unwrap_or(0);
    Ok(Some(Doc { nodes, root }))
}

// ---------------------------------------------------------------------------------------------
// Decoder: go-yaml v2's `decoder` unmarshalling into `interface{}`.

/// A Go value as go-yaml produces it for an `interface{}` target.
#[derive(Clone, Debug)]
enum GoVal {
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
struct GoMap {
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

struct Decoder<'d> {
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
    fn new(doc: &'d Doc) -> Self {
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

    fn run(mut self) -> Result<GoVal, YamlError> {
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
            if let Some(f) = go_parse_float(value) {
                return (FLOAT_TAG, GoVal::Float(f));
            }
        }
        b'D' | b'S' => {
            if (tag.is_empty() || tag == TIMESTAMP_TAG) && is_timestamp(value) {
                return (TIMESTAMP_TAG, GoVal::Str(value.to_owned()));
            }
            let plain: String = value.chars().filter(|&c| c != '_').collect();
            if let Some(i) = go_parse_int(&plain, 0) {
                return (INT_TAG, GoVal::Int(i));
            }
            if let Some(u) = go_parse_uint(&plain, 0) {
                return (INT_TAG, GoVal::Uint(u));
            }
            if is_yaml_style_float(&plain)
                && let Some(f) = go_parse_float(&plain)
            {
                return (FLOAT_TAG, GoVal::Float(f));
            }
            if let Some(bits) = plain.strip_prefix("0b") {
                if let Some(i) = go_parse_int(bits, 2) {
                    return (INT_TAG, GoVal::Int(i));
                }
                if let Some(u) = go_parse_uint(bits, 2) {
                    return (INT_TAG, GoVal::Uint(u));
                }
            } else if let Some(bits) = plain.strip_prefix("-0b")
                && let Some(i) = go_parse_int(&format!("-{bits}"), 2)
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

/// Go's `strconv.underscoreOK`.
fn underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut saw = b'^';
    let mut i = 0;
    let b = match b.first() {
        Some(b'+' | b'-') => b.get(1..).unwrap_or_default(),
        _ => b,
    };
    let mut hex = false;
    if b.len() >= 2 && b[0] == b'0' && matches!(b[1].to_ascii_lowercase(), b'b' | b'o' | b'x') {
        i = 2;
        saw = b'0';
        hex = b[1].eq_ignore_ascii_case(&b'x');
    }
    while let Some(&c) = b.get(i) {
        i += 1;
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
            continue;
        }
        if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
            continue;
        }
        if saw == b'_' {
            return false;
        }
        saw = b'!';
    }
    saw != b'_'
}

/// Go's `strconv.ParseUint(s, base, 64)` for base 0 (prefix-detected) or an explicit base.
fn go_parse_uint(s: &str, base: u32) -> Option<u64> {
    let b = s.as_bytes();
    let first = *b.first()?;
    let base0 = base == 0;
    let (base, digits) = if base0 {
        if first == b'0' {
            match b.get(1).map(u8::to_ascii_lowercase) {
                Some(b'b') if b.len() >= 3 => (2, b.get(2..)?),
                Some(b'o') if b.len() >= 3 => (8, b.get(2..)?),
                Some(b'x') if b.len() >= 3 => (16, b.get(2..)?),
                _ => (8, b.get(1..)?),
            }
        } else {
            (10, b)
        }
    } else {
        (base, b)
    };
    let mut n: u64 = 0;
    let mut underscores = false;
    for &c in digits {
        let d = match c {
            b'_' if base0 => {
                underscores = true;
                continue;
            }
            b'0'..=b'9' => c - b'0',
            b'a'..=b'z' => c - b'a' + 10,
            b'A'..=b'Z' => c - b'A' + 10,
            _ => return None,
        };
        if u32::from(d) >= base {
            return None;
        }
        n = n.checked_mul(u64::from(base))?.checked_add(u64::from(d))?;
    }
    if underscores && !underscore_ok(s) {
        return None;
    }
    Some(n)
}

/// Go's `strconv.ParseInt(s, base, 64)`.
fn go_parse_int(s: &str, base: u32) -> Option<i64> {
    let (neg, rest) = match s.as_bytes().first()? {
        b'+' => (false, s.get(1..)?),
        b'-' => (true, s.get(1..)?),
        _ => (false, s),
    };
    let un = go_parse_uint(rest, base)?;
    const CUTOFF: u64 = 1 << 63;
    if neg {
        if un > CUTOFF {
            return None;
        }
        Some(if un == CUTOFF {
            i64::MIN
        } else {
            -i64::try_from(un).ok()?
        })
    } else {
        i64::try_from(un).ok()
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for the decimal forms go-yaml hands it (the value starts
/// with `.` or passed the YAML float pattern); out-of-range values are errors as in Go.
fn go_parse_float(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    let mut i = 0;
    if matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let mut saw_digits = false;
    let mut saw_dot = false;
    let mut underscores = false;
    while let Some(&c) = b.get(i) {
        match c {
            b'_' => underscores = true,
            b'.' if !saw_dot => saw_dot = true,
            b'0'..=b'9' => saw_digits = true,
            _ => break,
        }
        i += 1;
    }
    if !saw_digits {
        return None;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        if !b.get(i).is_some_and(u8::is_ascii_digit) {
            return None;
        }
        while let Some(&c) = b.get(i) {
            match c {
                b'_' => underscores = true,
                b'0'..=b'9' => {}
                _ => break,
            }
            i += 1;
        }
    }
    if i != b.len() || (underscores && !underscore_ok(s)) {
        return None;
    }
    let cleaned: String = s.chars().filter(|&c| c != '_').collect();
    let f: f64 = cleaned.parse().ok()?;
    f.is_finite().then_some(f)
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

/// A Go string holding arbitrary bytes, as `json.Marshal` would print it: each byte that is
/// not part of valid UTF-8 becomes U+FFFD.
fn go_string_from_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = bad.get(1..).unwrap_or_default();
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Go formatting.

/// The shortest round-trip digits of a finite non-negative value and its decimal point
/// position (`0.d1d2... * 10^dp`), as Go's `strconv` computes them.
fn shortest_digits(x: f64, single: bool) -> (String, i32) {
    let sci = if single {
        format!("{:e}", x as f32)
    } else {
        format!("{x:e}")
    };
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exp: i32 = exp.parse().unwrap_or(0);
    if digits.chars().all(|c| c == '0') {
        return ("0".to_owned(), 1);
    }
    let trimmed = digits.trim_end_matches('0');
    (trimmed.to_owned(), exp + 1)
}

/// Go's `%e` body for shortest digits: `d.ddde±XX`.
fn fmt_e(digits: &str, dp: i32) -> String {
    let mut out = String::new();
    let mut chars = digits.chars();
    out.push(chars.next().unwrap_or('0'));
    let rest: String = chars.collect();
    if !rest.is_empty() {
        out.push('.');
        out.push_str(&rest);
    }
    let exp = if digits == "0" { 0 } else { dp - 1 };
    let sign = if exp < 0 { '-' } else { '+' };
    let _ = write!(out, "e{sign}{:02}", exp.unsigned_abs());
    out
}

/// Go's `%f` body for shortest digits.
fn fmt_f(digits: &str, dp: i32) -> String {
    let nd = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    let zeros = |n: i32| "0".repeat(usize::try_from(n).unwrap_or(0));
    if dp <= 0 {
        format!("0.{}{digits}", zeros(-dp))
    } else if dp >= nd {
        format!("{digits}{}", zeros(dp - nd))
    } else {
        let split = usize::try_from(dp).unwrap_or(0);
        format!(
            "{}.{}",
            digits.get(..split).unwrap_or_default(),
            digits.get(split..).unwrap_or_default()
        )
    }
}

/// `json.Marshal` of a finite float64.
fn json_float(f: f64) -> String {
    let neg = if f.is_sign_negative() { "-" } else { "" };
    let abs = f.abs();
    let (digits, dp) = shortest_digits(abs, false);
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let mut e = fmt_e(&digits, dp);
        // json.Marshal shortens "e-07" to "e-7".
        if let Some(pos) = e.find("e-0")
            && e.len() == pos + 4
        {
            e.remove(pos + 2);
        }
        format!("{neg}{e}")
    } else {
        format!("{neg}{}", fmt_f(&digits, dp))
    }
}

/// `strconv.FormatFloat(f, 'g', -1, bits)` for 32 or 64 bits.
fn format_g(f: f64, single: bool) -> String {
    let v = if single { f64::from(f as f32) } else { f };
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    let neg = if v.is_sign_negative() { "-" } else { "" };
    let (digits, dp) = shortest_digits(v.abs(), single);
    let exp = dp - 1;
    // Shortest formatting switches to an exponent outside [1e-4, 1e6).
    if !(-4..6).contains(&exp) {
        format!("{neg}{}", fmt_e(&digits, dp))
    } else {
        format!("{neg}{}", fmt_f(&digits, dp))
    }
}

/// strconv.IsPrint, approximated outside Latin-1 by "not a control or separator character".
fn go_is_print(c: char) -> bool {
    let u = u32::from(c);
    if u <= 0xff {
        return (0x20..=0x7e).contains(&u) || ((0xa1..=0xff).contains(&u) && u != 0xad);
    }
    !(c.is_control()
        || c.is_whitespace()
        || matches!(u, 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x206f | 0xfeff | 0xfff9..=0xfffb | 0xe000..=0xf8ff))
}

/// `strconv.Quote`.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            _ if go_is_print(c) => out.push(c),
            _ if u32::from(c) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            _ if u32::from(c) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            _ => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
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
            GoVal::Str(s) => out.push_str(&go_quote(s)),
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
            "unsupported map key of type: %!s(<nil>), key: <nil>, value: {}",
            go_syntax(v)
        ))),
        GoVal::Uint(_) | GoVal::Seq(_) | GoVal::Map(_) => {
            let type_name = match k {
                GoVal::Uint(_) => "uint64",
                GoVal::Seq(_) => "[]interface {}",
                _ => "map[interface {}]interface {}",
            };
            Err(YamlError::UnsupportedMapKey(format!(
                "unsupported map key of type: {type_name}, key: {}, value: {}",
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

fn to_json_value(root: GoVal) -> Result<JsonValue, YamlError> {
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
                GoVal::Float(f) if f.is_finite() => JsonValue::Number(json_float(f)),
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
    //! Every expected value and message below was produced by the Go code this module stands
    //! in for (apimachinery's `ToJSON` logic around sigs.k8s.io/yaml v1.6.0, go.yaml.in/yaml/v2
    //! v2.4.2 and encoding/json), run on the same input; JSON results are compared as the
    //! structure `gojson::parse` reads from the text Go printed.
    //! The differences listed in the module documentation are left untested.

    use super::*;

    #[track_caller]
    fn ok(yaml: &str, go_json: &str) {
        let want = gojson::parse(go_json).unwrap();
        match to_json(yaml) {
            Ok(got) => assert_eq!(got, want, "input {yaml:?}"),
            Err(e) => panic!("input {yaml:?}: unexpected error {e}"),
        }
    }

    #[track_caller]
    fn err(yaml: &str, go_message: &str) {
        match to_json(yaml) {
            Ok(got) => panic!("input {yaml:?}: expected {go_message:?}, got {got:?}"),
            Err(e) => assert_eq!(e.to_string(), go_message, "input {yaml:?}"),
        }
    }

    /// Input starting with `{` is JSON: the result is exactly `gojson::parse`'s.
    #[track_caller]
    fn same_as_json(text: &str) {
        assert_eq!(
            to_json(text),
            gojson::parse(text).map_err(YamlError::Json),
            "input {text:?}"
        );
    }

    fn s(v: &str) -> JsonValue {
        JsonValue::String(v.to_owned())
    }

    fn n(v: &str) -> JsonValue {
        JsonValue::Number(v.to_owned())
    }

    #[test]
    fn sample_config_structure() {
        let got = to_json(
            "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 172.16.0.0/12\n  - 192.168.0.0/16\n\
             cidrLimit: 64\nmasqLinkLocal: false\nmasqLinkLocalIPv6: false\nresyncInterval: 60s\n",
        )
        .unwrap();
        let want = JsonValue::Object(vec![
            ("cidrLimit".into(), n("64")),
            ("masqLinkLocal".into(), JsonValue::Bool(false)),
            ("masqLinkLocalIPv6".into(), JsonValue::Bool(false)),
            (
                "nonMasqueradeCIDRs".into(),
                JsonValue::Array(vec![
                    s("10.0.0.0/8"),
                    s("172.16.0.0/12"),
                    s("192.168.0.0/16"),
                ]),
            ),
            ("resyncInterval".into(), s("60s")),
        ]);
        assert_eq!(got, want);
    }

    #[test]
    fn list_item_without_value_is_null() {
        let got = to_json("nonMasqueradeCIDRs:\n  -\n  - 10.0.0.0/8\n").unwrap();
        let want = JsonValue::Object(vec![(
            "nonMasqueradeCIDRs".into(),
            JsonValue::Array(vec![JsonValue::Null, s("10.0.0.0/8")]),
        )]);
        assert_eq!(got, want);
    }

    #[test]
    fn star_is_the_upstream_error() {
        let e = to_json("*").unwrap_err();
        assert_eq!(
            e.to_string(),
            "yaml: did not find expected alphabetic or numeric character"
        );
        assert_eq!(
            e,
            YamlError::Yaml {
                line: None,
                problem: "did not find expected alphabetic or numeric character".into()
            }
        );
    }

    #[test]
    fn error_variants_display_like_go() {
        let yaml = YamlError::Yaml {
            line: Some(3),
            problem: "did not find expected key".into(),
        };
        assert_eq!(yaml.to_string(), "yaml: line 3: did not find expected key");
        let json = to_json("{\"a\" 1}").unwrap_err();
        assert_eq!(json.to_string(), "invalid character '1' after object key");
        assert!(matches!(json, YamlError::Json(_)));
        assert_eq!(
            YamlError::UnsupportedValue("+Inf").to_string(),
            "json: unsupported value: +Inf"
        );
        let key = to_json("~: 1\n").unwrap_err();
        assert_eq!(
            key,
            YamlError::UnsupportedMapKey(
                "unsupported map key of type: %!s(<nil>), key: <nil>, value: 1".into()
            )
        );
    }

    #[test]
    fn json_float_rendering() {
        for (f, want) in [
            (64.0, "64"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e-7, "1e-7"),
            (1.5e-7, "1.5e-7"),
            (1e-6, "0.000001"),
            (0.000_001_234, "0.000001234"),
            (123_456_789_012_345_678.0, "123456789012345680"),
            (-0.0, "-0"),
            (0.0, "0"),
            (0.1, "0.1"),
            (5e-324, "5e-324"),
            (1.797_693_134_862_315_7e308, "1.7976931348623157e+308"),
            (-2.5e-10, "-2.5e-10"),
        ] {
            assert_eq!(json_float(f), want, "{f}");
        }
    }

    #[test]
    fn float32_g_rendering_for_keys() {
        for (f, want) in [
            (1e300, "+Inf"),
            (1.234_567_891_234, "1.2345679"),
            (100_000.0, "100000"),
            (1e6, "1e+06"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5, "1.5"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Inf"),
        ] {
            assert_eq!(format_g(f, true), want, "{f}");
        }
        assert_eq!(format_g(123_456_789.0, false), "1.23456789e+08");
    }

    #[test]
    fn go_strconv_emulation() {
        assert_eq!(go_parse_int("0x1F", 0), Some(31));
        assert_eq!(go_parse_int("-0b101", 0), Some(-5));
        assert_eq!(go_parse_int("0o17", 0), Some(15));
        assert_eq!(go_parse_int("017", 0), Some(15));
        assert_eq!(go_parse_int("0", 0), Some(0));
        assert_eq!(go_parse_int("-9223372036854775808", 0), Some(i64::MIN));
        assert_eq!(go_parse_int("9223372036854775808", 0), None);
        assert_eq!(go_parse_int("08", 0), None);
        assert_eq!(go_parse_int("0x", 0), None);
        assert_eq!(go_parse_int("-101", 2), Some(-5));
        assert_eq!(go_parse_uint("18446744073709551615", 0), Some(u64::MAX));
        assert_eq!(go_parse_uint("+1", 0), None);
        assert_eq!(go_parse_float(".5_0"), Some(0.5));
        assert_eq!(go_parse_float("._5"), None);
        assert_eq!(go_parse_float("1e400"), None);
        assert_eq!(go_parse_float("1e-400"), Some(0.0));
        assert!(is_yaml_style_float("-1.5e+3"));
        assert!(!is_yaml_style_float("1e"));
        assert!(is_timestamp("2001-12-14t21:59:43.10-05:00"));
        assert!(is_timestamp("2004-02-29"));
        assert!(!is_timestamp("2001-02-29"));
        assert!(!is_timestamp("2001-12-14T21:59:43"));
        assert_eq!(go_base64_decode("aGVs\nbG8="), Some(b"hello".to_vec()));
        assert_eq!(go_base64_decode("aGk"), None);
        assert_eq!(go_string_from_bytes(b"a\xe2\x82b"), "a\u{FFFD}\u{FFFD}b");
    }

    #[test]
    fn deep_block_nesting_within_go_limit() {
        let doc = format!("{}x\n", "- ".repeat(MAX_DEPTH));
        let mut value = to_json(&doc).unwrap();
        let mut depth = 0;
        // Flatten before dropping so the test does not depend on recursive drop depth.
        while let JsonValue::Array(mut items) = value {
            depth += 1;
            value = items.pop().unwrap_or(JsonValue::Null);
        }
        assert_eq!(depth, MAX_DEPTH);
        assert_eq!(value, s("x"));
        err(
            &format!("{}x\n", "- ".repeat(MAX_DEPTH + 1)),
            "yaml: exceeded max depth of 10000",
        );
    }

    #[test]
    fn random_input_never_panics() {
        let alphabet: Vec<char> =
            " :-\t\n\r#'\"[]{},&*!|>?%@`~.019abynNT\\<=_\u{e9}\u{85}\u{feff}\u{2028}\u{0}\u{1}"
                .chars()
                .collect();
        let mut state: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let len = usize::try_from(next() % 40).unwrap();
            let text: String = (0..len)
                .map(|_| alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()])
                .collect();
            let _ = to_json(&text);
        }
    }

    #[test]
    fn upstream_sample_config() {
        ok(
            "nonMasqueradeCIDRs:\n  - 10.0.0.0/8\n  - 172.16.0.0/12\n  - 192.168.0.0/16\ncidrLimit: 64\nmasqLinkLocal: false\nmasqLinkLocalIPv6: false\nresyncInterval: 60s\n",
            "{\"cidrLimit\":64,\"masqLinkLocal\":false,\"masqLinkLocalIPv6\":false,\"nonMasqueradeCIDRs\":[\"10.0.0.0/8\",\"172.16.0.0/12\",\"192.168.0.0/16\"],\"resyncInterval\":\"60s\"}",
        );
        ok(
            "# ip-masq-agent config\nnonMasqueradeCIDRs: [10.0.0.0/8, fd00::/8]  # private ranges\nmasqLinkLocal: true\nresyncInterval: 1m30s\n",
            "{\"masqLinkLocal\":true,\"nonMasqueradeCIDRs\":[\"10.0.0.0/8\",\"fd00::/8\"],\"resyncInterval\":\"1m30s\"}",
        );
        ok(
            "nonMasqueradeCIDRs:\n- 10.0.0.0/8\ncidrLimit: 64.0\n",
            "{\"cidrLimit\":64,\"nonMasqueradeCIDRs\":[\"10.0.0.0/8\"]}",
        );
        ok(
            "apiVersion: v1\nkind: ConfigMap\ndata:\n  config: |\n    nonMasqueradeCIDRs:\n      - 10.0.0.0/8\n    resyncInterval: 60s\n",
            "{\"apiVersion\":\"v1\",\"data\":{\"config\":\"nonMasqueradeCIDRs:\\n  - 10.0.0.0/8\\nresyncInterval: 60s\\n\"},\"kind\":\"ConfigMap\"}",
        );
    }

    #[test]
    fn empty_and_trivial_documents() {
        ok("", "null");
        ok("   ", "null");
        ok("\n\n", "null");
        ok("# only a comment\n", "null");
        ok("---\n", "null");
        ok("--- \n...\n", "null");
        ok("~\n", "null");
        ok("null\n", "null");
        ok("just a string\n", "\"just a string\"");
        ok("42\n", "42");
        ok("- 1\n- 2\n", "[1,2]");
        ok("[a, b]\n", "[\"a\",\"b\"]");
        ok("'quoted top level'\n", "\"quoted top level\"");
    }

    #[test]
    fn list_items_without_value() {
        ok("list:\n  -\n  - a\n", "{\"list\":[null,\"a\"]}");
        ok("- \n-\n- x\n", "[null,null,\"x\"]");
        ok("a:\n", "{\"a\":null}");
        ok("a:\nb: ~\n", "{\"a\":null,\"b\":null}");
        err("[a, , b]\n", "yaml: did not find expected node content");
        err(
            "{a: , b}\n",
            "invalid character 'a' looking for beginning of object key string",
        );
    }

    #[test]
    fn multi_document_reads_first_only() {
        ok("a: 1\n---\nb: 2\n", "{\"a\":1}");
        ok("---\nfirst\n---\nsecond\n", "\"first\"");
        ok("a: 1\n...\n--- ]]]\n", "{\"a\":1}");
        ok("a: 1\n---\n'unterminated\n", "{\"a\":1}");
    }

    #[test]
    fn yaml_1_1_booleans_and_nulls() {
        ok(
            "b: [y, Y, yes, Yes, YES, n, N, no, No, NO, true, True, TRUE, false, False, FALSE, on, On, ON, off, Off, OFF]\n",
            "{\"b\":[true,true,true,true,true,false,false,false,false,false,true,true,true,false,false,false,true,true,true,false,false,false]}",
        );
        ok(
            "notbool: [yES, tRUE, oN, nO, Off1, truee]\n",
            "{\"notbool\":[\"yES\",\"tRUE\",\"oN\",\"nO\",\"Off1\",\"truee\"]}",
        );
        ok(
            "n: [~, null, Null, NULL, nULL, '', \"~\"]\ne:\n",
            "{\"e\":null,\"false\":[null,null,null,null,\"nULL\",\"\",\"~\"]}",
        );
    }

    #[test]
    fn integers() {
        ok(
            "i: [0, 1, -1, +1, 0x1F, 0X1f, 0o17, 0O17, 017, 0b101, 0B101, -0b101, 0b-101, 1_000, _1, 1_, 0_, 1__0]\n",
            "{\"i\":[0,1,-1,1,31,31,15,15,15,5,5,-5,-5,1000,\"_1\",1,0,10]}",
        );
        ok(
            "edge: [9223372036854775807, 9223372036854775808, 18446744073709551615, 18446744073709551616, -9223372036854775808, -9223372036854775809, +18446744073709551615, 0x10000000000000000, 0xFFFFFFFFFFFFFFFF]\n",
            "{\"edge\":[9223372036854775807,9223372036854775808,18446744073709551615,18446744073709552000,-9223372036854775808,-9223372036854776000,18446744073709552000,\"0x10000000000000000\",18446744073709551615]}",
        );
        ok(
            "notint: [0x, 0b, 0o, 0b12, 0x_1F, 08, 09.5, 0789, 1e5, 12e03, 0x1G]\n",
            "{\"notint\":[\"0x\",\"0b\",\"0o\",\"0b12\",31,8,9.5,789,100000,12000,\"0x1G\"]}",
        );
    }

    #[test]
    fn floats_render_like_go() {
        ok(
            "f: [1.0, 64.0, 1.5e-7, 1e21, 1e20, 1e-6, 1e-7, .5, -.5, +.5, 1., 0.1, 3.14159, 123456789012345678, 1.7976931348623157e308, 5e-324, 6.02e23, 1.5_0, .5_0]\n",
            "{\"f\":[1,64,1.5e-7,1e+21,100000000000000000000,0.000001,1e-7,0.5,-0.5,0.5,1,0.1,3.14159,123456789012345678,1.7976931348623157e+308,5e-324,6.02e+23,1.5,0.5]}",
        );
        ok("z: [-0, -0.0, +0, 0.0, .0]\n", "{\"z\":[0,-0,0,0,0]}");
        ok(
            "notfloat: [., .e5, ._5, .5e400, 1e400, .iNf, inf, -inf, nan, NaN, Infinity, 1e, 1.2.3]\n",
            "{\"notfloat\":[\".\",\".e5\",\"._5\",\".5e400\",\"1e400\",\".iNf\",\"inf\",\"-inf\",\"nan\",\"NaN\",\"Infinity\",\"1e\",\"1.2.3\"]}",
        );
        ok("under: 1e-400\n", "{\"under\":0}");
    }

    #[test]
    fn special_floats_are_json_errors() {
        err("x: .inf\n", "json: unsupported value: +Inf");
        err("x: -.Inf\n", "json: unsupported value: -Inf");
        err("x: .NaN\n", "json: unsupported value: NaN");
        err("x: [1, .nan]\ny: .inf\n", "json: unsupported value: +Inf");
        err("x: +.INF\n", "json: unsupported value: +Inf");
    }

    #[test]
    fn quoted_scalars_are_strings() {
        ok(
            "q: ['yes', \"no\", '1', \"0x1F\", '', \"\", '~', \"null\", '1.5', \"<<\"]\n",
            "{\"q\":[\"yes\",\"no\",\"1\",\"0x1F\",\"\",\"\",\"~\",\"null\",\"1.5\",\"\\u003c\\u003c\"]}",
        );
        err(
            "s: 'it''s'\nd: \"tab\\tnew\\nline \\u00e9 \\U0001F600 \\x41 \\/ slash? \\N \\_ \\L \\P \\e \\0\"\n",
            "yaml: line 2: found unknown escape character",
        );
        ok("a: \"x\\'y\"\n", "{\"a\":\"x'y\"}");
        ok(
            "k: \"<>&\"\nl: 'üñí 日本'\n",
            "{\"k\":\"\\u003c\\u003e\\u0026\",\"l\":\"üñí 日本\"}",
        );
        ok(
            "folded: 'multi\n  line'\nplain: multi\n  line text\ndq: \"a\n\n  b\"\n",
            "{\"dq\":\"a\\nb\",\"folded\":\"multi line\",\"plain\":\"multi line text\"}",
        );
    }

    #[test]
    fn block_scalars() {
        ok(
            "a: |\n  line1\n  line2\nb: >\n  folded\n  text\n\n  para\n",
            "{\"a\":\"line1\\nline2\\n\",\"b\":\"folded text\\npara\\n\"}",
        );
        ok(
            "a: |-\n  x\n\nb: |+\n  y\n\nc: end\n",
            "{\"a\":\"x\",\"b\":\"y\\n\\n\",\"c\":\"end\"}",
        );
        ok("a: |2\n   x\n", "{\"a\":\" x\\n\"}");
        ok("a: >-\n  x\n  y\n", "{\"a\":\"x y\"}");
        ok(
            "a: |\n  at end of input without newline",
            "{\"a\":\"at end of input without newline\"}",
        );
    }

    #[test]
    fn anchors_and_aliases() {
        ok("a: &x 1\nb: *x\n", "{\"a\":1,\"b\":1}");
        ok(
            "a: &x [1, 2]\nb: *x\nc: {k: *x}\n",
            "{\"a\":[1,2],\"b\":[1,2],\"c\":{\"k\":[1,2]}}",
        );
        ok("&a a: b\n*a : c\n", "{\"a\":\"c\"}");
        ok("a: &x\nb: *x\n", "{\"a\":null,\"b\":null}");
        ok("a: &x 1\nb: &x 2\nc: *x\n", "{\"a\":1,\"b\":2,\"c\":2}");
        ok("- &a\n- *a\n", "[null,null]");
        ok("a: !!str &x 12\nb: *x\n", "{\"a\":\"12\",\"b\":\"12\"}");
    }

    #[test]
    fn alias_expansion_limit() {
        err(
            "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n",
            "yaml: document contains excessive aliasing",
        );
        ok(
            "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n",
            "{\"a\":[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],\"b\":[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],\"c\":[[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]],[[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"],[\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\",\"x\"]]]}",
        );
    }

    #[test]
    fn merge_keys() {
        ok(
            "base: &base\n  a: 1\n  b: 2\nderived:\n  <<: *base\n  b: 3\n",
            "{\"base\":{\"a\":1,\"b\":2},\"derived\":{\"a\":1,\"b\":3}}",
        );
        ok(
            "base: &base\n  a: 1\nderived:\n  b: 3\n  <<: *base\n",
            "{\"base\":{\"a\":1},\"derived\":{\"a\":1,\"b\":3}}",
        );
        ok("d:\n  a: 0\n  <<: {a: 1}\n", "{\"d\":{\"a\":1}}");
        ok(
            "a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n",
            "{\"a\":{\"x\":1},\"b\":{\"true\":2,\"x\":2},\"c\":{\"true\":2,\"x\":1}}",
        );
        ok(
            "c:\n  '<<': {a: 1}\n",
            "{\"c\":{\"\\u003c\\u003c\":{\"a\":1}}}",
        );
        ok("c:\n  !!merge <<: {a: 1}\n", "{\"c\":{\"a\":1}}");
        ok("<<: {a: 1}\nb: 2\n", "{\"a\":1,\"b\":2}");
        ok("v: <<\n", "{\"v\":\"\\u003c\\u003c\"}");
    }

    #[test]
    fn duplicate_keys_last_wins() {
        ok("a: 1\na: 2\n", "{\"a\":2}");
        ok("b: 1\na: 2\nB: 3\nb: 4\n", "{\"B\":3,\"a\":2,\"b\":4}");
        ok("x: {k: 1, k: 2}\n", "{\"x\":{\"k\":2}}");
    }

    #[test]
    fn non_string_keys() {
        ok(
            "true: a\nno: b\n1.5: c\n10: d\n0x10: e\n",
            "{\"1.5\":\"c\",\"10\":\"d\",\"16\":\"e\",\"false\":\"b\",\"true\":\"a\"}",
        );
        ok(
            "1e300: x\n3.14159265358979: y\n100000: z\n1e6: w\n.nan: u\n-.inf: v\n0.1: t\n",
            "{\"-.inf\":\"v\",\".inf\":\"x\",\".nan\":\"u\",\"0.1\":\"t\",\"100000\":\"z\",\"1e+06\":\"w\",\"3.1415927\":true}",
        );
        ok("2001-12-14: date\n", "{\"2001-12-14\":\"date\"}");
    }

    #[test]
    fn tags() {
        ok(
            "t:\n- !!str 1\n- !!str yes\n- !!int '12'\n- !!bool yes\n- !!float 1\n- !!null ''\n- ! 12\n- !foo bar\n- !!binary aGVsbG8=\n- !!timestamp 2001-12-14\n- !!str\n- !<tag:yaml.org,2002:int> '7'\n- !!int 0x1F\n- !!float '2.50'\n",
            "{\"t\":[\"1\",\"yes\",12,true,1,null,\"12\",\"bar\",\"hello\",\"2001-12-14\",\"\",7,31,2.5]}",
        );
        err(
            "t: [!!str 1, !!str yes, !!int '12', !!bool yes, !!float 1, !!null '', ! 12, !foo bar, !!binary aGVsbG8=, !!timestamp 2001-12-14, !!str, !<tag:yaml.org,2002:int> '7']\n",
            "yaml: did not find expected ',' or ']'",
        );
        ok(
            "%TAG !e! tag:example.com,2000:\n---\na: !e!foo 1\n",
            "{\"a\":\"1\"}",
        );
        ok(
            "t: !!map [1]\nu: !!str {a: 1}\n",
            "{\"t\":[1],\"u\":{\"a\":1}}",
        );
        ok(
            "ts: [2001-12-14, 2001-12-14t21:59:43.10-05:00, 2002-12-14 21:59:43.10 -5]\n",
            "{\"ts\":[\"2001-12-14\",\"2001-12-14t21:59:43.10-05:00\",\"2002-12-14 21:59:43.10 -5\"]}",
        );
        ok(
            "t: !!timestamp 2001-12-14t21:59:43.10-05:00\nu: !!timestamp 2001-12-14 21:59:43.10\nv: !!timestamp 2001-12-14T21:59:43Z\n",
            "{\"t\":\"2001-12-14t21:59:43.10-05:00\",\"u\":\"2001-12-14 21:59:43.10\",\"v\":\"2001-12-14T21:59:43Z\"}",
        );
    }

    #[test]
    fn json_like_flow_and_nesting() {
        same_as_json("{\"a\": [1, 2, {\"b\": null}], \"c\": \"d\"}\n");
        ok(
            "x: {a: [1, {b: [2, {c: 3}]}], d: {}}\n",
            "{\"x\":{\"a\":[1,{\"b\":[2,{\"c\":3}]}],\"d\":{}}}",
        );
        ok("[a: b, c]\n", "[{\"a\":\"b\"},\"c\"]");
        ok("[? a : b]\n", "[{\"a\":\"b\"}]");
        err(
            "{a}\n",
            "invalid character 'a' looking for beginning of object key string",
        );
        err(
            "{? a}\n",
            "invalid character '?' looking for beginning of object key string",
        );
        ok("a: [b: c, d]\n", "{\"a\":[{\"b\":\"c\"},\"d\"]}");
        ok(
            "url: http://example.com:8080/path?q=1#frag\nlist: [http://x.y/z]\n",
            "{\"list\":[\"http://x.y/z\"],\"url\":\"http://example.com:8080/path?q=1#frag\"}",
        );
    }

    #[test]
    fn yaml_syntax_errors() {
        err(
            "*",
            "yaml: did not find expected alphabetic or numeric character",
        );
        err(
            "a: *\n",
            "yaml: did not find expected alphabetic or numeric character",
        );
        err(
            "&\na: 1\n",
            "yaml: did not find expected alphabetic or numeric character",
        );
        err(
            "a: &b.c 1\n",
            "yaml: did not find expected alphabetic or numeric character",
        );
        err("a: *y\n", "yaml: unknown anchor 'y' referenced");
        err(
            "a: b: c\n",
            "yaml: mapping values are not allowed in this context",
        );
        err(
            "a:\n  b: 1\n c: 2\n",
            "yaml: line 2: did not find expected key",
        );
        err(
            "a:\n  - 1\n  b: 2\n",
            "yaml: line 2: did not find expected '-' indicator",
        );
        err(
            "- a\nb: 1\n",
            "yaml: line 1: did not find expected '-' indicator",
        );
        err("a: 1\n- b\n", "yaml: line 1: did not find expected key");
        err("[1, 2\n", "yaml: line 1: did not find expected ',' or ']'");
        err(
            "{a: 1\n",
            "invalid character 'a' looking for beginning of object key string",
        );
        ok("[1, 2]]\n", "[1,2]");
        ok("a: [1 2]\n", "{\"a\":[\"1 2\"]}");
        err(
            "{a: 1 b}\n",
            "invalid character 'a' looking for beginning of object key string",
        );
        err(
            "key\nother: 1\n",
            "yaml: line 2: mapping values are not allowed in this context",
        );
        err("a: \"abc\n", "yaml: line 2: found unexpected end of stream");
        err("a: \"abc", "yaml: found unexpected end of stream");
        err(
            "a: 'abc\nb: 1\n",
            "yaml: line 3: found unexpected end of stream",
        );
        err(
            "a: \"x\n---\ny\"\n",
            "yaml: line 2: found unexpected document indicator",
        );
        err("a: \"x\\qy\"\n", "yaml: found unknown escape character");
        err("a: \"x\\/y\"\n", "yaml: found unknown escape character");
        err(
            "a: \"\\x4g\"\n",
            "yaml: did not find expected hexdecimal number",
        );
        err(
            "a: \"\\uD800\"\n",
            "yaml: found invalid Unicode character escape code",
        );
        err(
            "a: @b\n",
            "yaml: found character that cannot start any token",
        );
        err(
            "a: `b\n",
            "yaml: found character that cannot start any token",
        );
        err(
            "a: |0\n  x\n",
            "yaml: found an indentation indicator equal to 0",
        );
        err(
            "a: | x\n",
            "yaml: did not find expected comment or line break",
        );
        err(
            "%YAML 1.2\n---\na: 1\n",
            "yaml: found incompatible YAML document",
        );
        err(
            "%YAML 1.1\n%YAML 1.1\n---\na: 1\n",
            "yaml: line 1: found duplicate %YAML directive",
        );
        err(
            "%YAML 1.123\n---\n",
            "yaml: found extremely long version number",
        );
        err(
            "%FOO bar\n---\na: 1\n",
            "yaml: found unknown directive name",
        );
        err("a: !e!foo 1\n", "yaml: found undefined tag handle");
        err("a: \"x\" y\n", "yaml: did not find expected key");
        err("- 'a' b\n", "yaml: did not find expected '-' indicator");
        err("\"k\" x: 1\n", "yaml: did not find expected key");
        err("a: &a [*a]\n", "yaml: anchor 'a' value contains itself");
        err("a: &a {b: *a}\n", "yaml: anchor 'a' value contains itself");
        err(
            "? [a]\n: 1\n",
            "yaml: invalid map key: []interface {}{\"a\"}",
        );
        err(
            "? {a: 1}\n: 2\n",
            "yaml: invalid map key: map[interface {}]interface {}{\"a\":1}",
        );
        err(
            "~: a\n",
            "unsupported map key of type: %!s(<nil>), key: <nil>, value: \"a\"",
        );
        err(
            "? \n: v\n",
            "unsupported map key of type: %!s(<nil>), key: <nil>, value: \"v\"",
        );
        err(
            "18446744073709551615: x\n",
            "unsupported map key of type: uint64, key: 0xffffffffffffffff, value: \"x\"",
        );
        err(
            "t: !!int abc\n",
            "yaml: cannot decode !!str `abc` as a !!int",
        );
        err("t: !!bool 1\n", "yaml: cannot decode !!int `1` as a !!bool");
        err(
            "t: !!null foo\n",
            "yaml: cannot decode !!str `foo` as a !!null",
        );
        err(
            "t: !!binary '!!!'\n",
            "yaml: !!binary value contains invalid base64 data",
        );
        err(
            "t: !!binary aGk\n",
            "yaml: !!binary value contains invalid base64 data",
        );
        err(
            "t: !!float 18446744073709551615\n",
            "yaml: cannot decode !!int `18446744073709551615` as a !!float",
        );
        err(
            "t: !!timestamp 12\n",
            "yaml: cannot decode !!int `12` as a !!timestamp",
        );
        err(
            "t: !!timestamp 2001-02-30\n",
            "yaml: cannot decode !!str `2001-02-30` as a !!timestamp",
        );
        err(
            "t: !!timestamp 2001-12-14T21:59:43\n",
            "yaml: cannot decode !!str `2001-12-14T21:59:43` as a !!timestamp",
        );
        err(
            "c:\n  <<: 1\n",
            "yaml: map merge requires map or sequence of maps as the value",
        );
        err(
            "c:\n  <<: [1]\n",
            "yaml: map merge requires map or sequence of maps as the value",
        );
        err(
            "c:\n  <<: ~\n",
            "yaml: map merge requires map or sequence of maps as the value",
        );
        err("a: \u{1}\n", "yaml: control characters are not allowed");
        err("a: b\u{7f}\n", "yaml: control characters are not allowed");
        err(
            "a: b\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\nc: d\ne: \u{0}\n",
            "yaml: control characters are not allowed",
        );
    }

    #[test]
    fn tab_handling() {
        err(
            "key: value\n\tother: x\n",
            "yaml: line 2: found a tab character that violates indentation",
        );
        err(
            "a:\n\tb: 1\n",
            "yaml: line 2: found character that cannot start any token",
        );
        err(
            "\tkey: v\n",
            "yaml: found character that cannot start any token",
        );
        err(
            "a: b\n\t\nc: d\n",
            "yaml: line 2: found a tab character that violates indentation",
        );
        err(
            "a: 'b'\n\tc: d\n",
            "yaml: line 2: found character that cannot start any token",
        );
        err(
            "- a\n-\tb\n",
            "yaml: line 2: found character that cannot start any token",
        );
        ok("a:\tb\n", "{\"a\":\"b\"}");
        ok("a: b\t# c\n", "{\"a\":\"b\"}");
        ok("a:\t1\n", "{\"a\":1}");
        err(
            "- \tx\n",
            "yaml: found character that cannot start any token",
        );
        err(
            "? a\n:\tb\n",
            "yaml: line 2: found character that cannot start any token",
        );
        ok("a: 1\n  \t# c\nb: 2\n", "{\"a\":1,\"b\":2}");
        ok("a: [1,\t2]\n", "{\"a\":[1,2]}");
        err(
            "a:\n  b: 1\n\t# comment\n",
            "yaml: line 3: found a tab character that violates indentation",
        );
        err(
            "a: |\n  x\n\tb: 1\n",
            "yaml: line 3: found a tab character where an indentation space is expected",
        );
        ok("a\tb: 1\n", "{\"a\\tb\":1}");
    }

    #[test]
    fn line_endings_and_whitespace() {
        ok("a:\r\n  - 1\r\n  - 2\r\n", "{\"a\":[1,2]}");
        ok("a: 1\u{85}b: 2\n", "{\"a\":1,\"b\":2}");
        ok("\u{feff}a: 1\n", "{\"a\":1}");
        ok("a:    \n  - 1\n", "{\"a\":[1]}");
        ok("a: b # comment\n# c2\nd: e\n", "{\"a\":\"b\",\"d\":\"e\"}");
    }

    #[test]
    fn json_prefixed_input() {
        same_as_json(" {\"a\": 1}");
        same_as_json("\n\t{\"a\": [1, 2.50, 1e3]}\n");
        same_as_json("{\"a\": 1, \"a\": 2}");
        err(
            "\u{a0}{\"a\": 1}",
            "invalid character 'Â' looking for beginning of value",
        );
        ok("\u{feff}{\"a\": 1}", "{\"a\":1}");
        err(
            "{a: 1}",
            "invalid character 'a' looking for beginning of object key string",
        );
        err(
            "{\"a\": 1}\n---\n",
            "invalid character '-' after top-level value",
        );
        err(
            "  {\"a\": 1} x",
            "invalid character 'x' after top-level value",
        );
    }
}
