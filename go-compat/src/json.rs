//! Go's `encoding/json`: a reader that accepts, rejects and reports exactly as Go's does, the
//! string escaping of `json.Marshal`, and the field lookup of `json.Unmarshal`.
//!
//! Upstream ip-masq-agent hands its config file to `json.Unmarshal`. Operators see Go's error
//! text in logs and scripts grep for it, so a drop-in replacement must fail on the same inputs
//! with the same words. The reader below runs the same byte-at-a-time state machine as Go's
//! `encoding/json` scanner: `json.Unmarshal` runs that machine over the whole input
//! before decoding anything, so the first error in document order is the one reported, and the
//! message is built from the offending byte exactly as Go's `quoteChar` formats it.
//!
//! The same machine drives the construction of the [`JsonValue`], the way Go's decoder follows
//! the scanner's opcodes, so nothing here can accept a document Go rejects or the reverse.

use std::fmt::Write as _;

/// A JSON value as Go's `encoding/json` reads it: object members in document order
/// (duplicates included, later ones win when decoding) and numbers as their literal text (Go
/// tells `64` from `64.0` when decoding into an int).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonValue {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as its JSON literal text (e.g. `64`, `1.5`, `1e+21`).
    Number(String),
    /// A string, unescaped.
    String(String),
    /// An array.
    Array(Vec<JsonValue>),
    /// An object: members in document order, duplicates kept.
    Object(Vec<(String, JsonValue)>),
}

impl JsonValue {
    /// The kind of value as Go's `UnmarshalTypeError` names it: "string", "number", "bool",
    /// "array", "object" (and "null").
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Bool(_) => "bool",
            Self::Number(_) => "number",
            Self::String(_) => "string",
            Self::Array(_) => "array",
            Self::Object(_) => "object",
        }
    }
}

/// A string as `json.Marshal` writes it, with Go's escaping of `<`, `>`, `&`, U+2028 and
/// U+2029.
pub fn quote_string(text: &str) -> String {
    let mut quoted = String::from("\"");
    for character in text.chars() {
        match character {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(character));
            }
            _ if character < ' ' => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(character));
            }
            _ => quoted.push(character),
        }
    }
    quoted.push('"');
    quoted
}

/// How `encoding/json` finds the struct field for an object key: the exact name first, then
/// a case-insensitive match with the simple folds Go applies to ASCII letters (`ſ` folds to
/// `s`, the Kelvin sign to `k`). Returns the index in `names`.
pub fn find_field(names: &[&str], key: &str) -> Option<usize> {
    let fold = |character: char| match character {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        other => other.to_ascii_lowercase(),
    };
    names.iter().position(|name| *name == key).or_else(|| {
        names
            .iter()
            .position(|name| name.chars().map(fold).eq(key.chars().map(fold)))
    })
}

/// Go's `maxNestingDepth`: deeper documents are rejected rather than risking the stack.
const MAX_NESTING_DEPTH: usize = 10_000;

/// A JSON syntax error whose `Display` is, byte for byte, what Go's `*json.SyntaxError`
/// prints for the same input (for example `invalid character '}' after object key`).
///
/// Callers log it verbatim, so the text must not be reworded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct JsonSyntaxError {
    msg: String,
}

impl JsonSyntaxError {
    fn invalid_character(c: u8, context: &str) -> Self {
        Self {
            msg: format!("invalid character {} {context}", quote_char(c)),
        }
    }

    fn unexpected_end() -> Self {
        Self {
            msg: "unexpected end of JSON input".to_owned(),
        }
    }
}

/// Parses `text` as Go's `json.Unmarshal` would, keeping object members in document order
/// (duplicates included) and numbers as their literal text.
///
/// Strings are unescaped as Go does it: `\uXXXX` surrogate pairs are joined and an unpaired
/// surrogate becomes U+FFFD. Leading and trailing JSON whitespace (space, tab, CR, LF) is
/// allowed; anything else after the top-level value is an error.
///
/// # Errors
///
/// The first syntax error in document order, worded as Go words it.
pub fn parse(bytes: &[u8]) -> Result<JsonValue, JsonSyntaxError> {
    let text = bytes;
    let mut scanner = Scanner::new();
    let mut builder = Builder::default();
    for (i, &c) in bytes.iter().enumerate() {
        let op = scanner.step(c);
        if op == Op::Error {
            return Err(scanner.take_error());
        }
        builder.on_op(op, i, text);
    }
    let op = scanner.eof();
    if op == Op::Error {
        return Err(scanner.take_error());
    }
    builder.on_op(op, bytes.len(), text);
    // A valid document always yields a value; the fallback only keeps this total.
    builder
        .done
        .take()
        .ok_or_else(JsonSyntaxError::unexpected_end)
}

/// `json.Unmarshal`'s nesting limit applied to a value built some other way (the JSON text
/// sigs.k8s.io/yaml produced): the error names the bracket that went too deep.
pub fn check_depth(value: &JsonValue) -> Result<(), JsonSyntaxError> {
    let mut stack = vec![(value, 0)];
    while let Some((value, depth)) = stack.pop() {
        let (bracket, children): (u8, Vec<&JsonValue>) = match value {
            JsonValue::Array(items) => (b'[', items.iter().collect()),
            JsonValue::Object(members) => (b'{', members.iter().map(|(_, value)| value).collect()),
            _ => continue,
        };
        if depth + 1 > MAX_NESTING_DEPTH {
            return Err(JsonSyntaxError::invalid_character(
                bracket,
                "exceeded max depth",
            ));
        }
        stack.extend(children.into_iter().map(|child| (child, depth + 1)));
    }
    Ok(())
}

/// Formats a byte the way Go's `quoteChar` does: as a rune U+0000..U+00FF quoted like
/// `strconv.Quote`, but between single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => return "'\\''".to_owned(),
        b'"' => return "'\"'".to_owned(),
        _ => {}
    }
    let inner = match c {
        b'\\' => "\\\\".to_owned(),
        0x07 => "\\a".to_owned(),
        0x08 => "\\b".to_owned(),
        0x0c => "\\f".to_owned(),
        b'\n' => "\\n".to_owned(),
        b'\r' => "\\r".to_owned(),
        b'\t' => "\\t".to_owned(),
        0x0b => "\\v".to_owned(),
        _ if c < b' ' || c == 0x7f => format!("\\x{c:02x}"),
        // strconv.IsPrint for Latin-1: printable ASCII and U+00A1..U+00FF except U+00AD.
        0x20..=0x7e => char::from(c).to_string(),
        0xa1..=0xff if c != 0xad => char::from(c).to_string(),
        _ => format!("\\u{:04x}", u32::from(c)),
    };
    format!("'{inner}'")
}

/// What a scanner step tells its caller (Go's `scan*` opcodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Continue,
    BeginLiteral,
    BeginObject,
    ObjectKey,
    ObjectValue,
    EndObject,
    BeginArray,
    ArrayValue,
    EndArray,
    SkipSpace,
    End,
    Error,
}

/// What the innermost open composite value is waiting for (Go's `parse*` states).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Parse {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

/// The scanner's current state function (Go's `state*` functions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    BeginValueOrEmpty,
    BeginValue,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    /// Inside `\u`, with this many hex digits still to come.
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    /// Inside `true`, `false` or `null`, expecting the byte at this index of the word.
    Literal(&'static str, usize),
    Error,
}

#[derive(Debug)]
struct Scanner {
    state: State,
    end_top: bool,
    parse_state: Vec<Parse>,
    err: Option<JsonSyntaxError>,
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

impl Scanner {
    fn new() -> Self {
        Self {
            state: State::BeginValue,
            end_top: false,
            parse_state: Vec::new(),
            err: None,
        }
    }

    fn take_error(&mut self) -> JsonSyntaxError {
        self.err
            .take()
            .unwrap_or_else(JsonSyntaxError::unexpected_end)
    }

    fn error(&mut self, c: u8, context: &str) -> Op {
        self.state = State::Error;
        self.err = Some(JsonSyntaxError::invalid_character(c, context));
        Op::Error
    }

    /// Go's `scanner.eof`.
    fn eof(&mut self) -> Op {
        if self.err.is_some() {
            return Op::Error;
        }
        if self.end_top {
            return Op::End;
        }
        let op = self.step(b' ');
        if self.end_top {
            return op;
        }
        if self.err.is_none() {
            self.err = Some(JsonSyntaxError::unexpected_end());
        }
        Op::Error
    }

    fn push_parse_state(&mut self, c: u8, p: Parse, success: Op) -> Op {
        self.parse_state.push(p);
        if self.parse_state.len() <= MAX_NESTING_DEPTH {
            success
        } else {
            self.error(c, "exceeded max depth")
        }
    }

    fn pop_parse_state(&mut self) {
        self.parse_state.pop();
        if self.parse_state.is_empty() {
            self.state = State::EndTop;
            self.end_top = true;
        } else {
            self.state = State::EndValue;
        }
    }

    fn step(&mut self, c: u8) -> Op {
        match self.state {
            State::BeginValueOrEmpty => {
                if is_space(c) {
                    Op::SkipSpace
                } else if c == b']' {
                    self.end_value(c)
                } else {
                    self.begin_value(c)
                }
            }
            State::BeginValue => self.begin_value(c),
            State::BeginStringOrEmpty => {
                if is_space(c) {
                    Op::SkipSpace
                } else if c == b'}' {
                    if let Some(top) = self.parse_state.last_mut() {
                        *top = Parse::ObjectValue;
                    }
                    self.end_value(c)
                } else {
                    self.begin_string(c)
                }
            }
            State::BeginString => self.begin_string(c),
            State::EndValue => self.end_value(c),
            State::EndTop => self.end_top_state(c),
            State::InString => self.in_string(c),
            State::InStringEsc => match c {
                b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                    self.state = State::InString;
                    Op::Continue
                }
                b'u' => {
                    self.state = State::InStringEscU(4);
                    Op::Continue
                }
                _ => self.error(c, "in string escape code"),
            },
            State::InStringEscU(left) => {
                if c.is_ascii_hexdigit() {
                    self.state = if left <= 1 {
                        State::InString
                    } else {
                        State::InStringEscU(left - 1)
                    };
                    Op::Continue
                } else {
                    self.error(c, "in \\u hexadecimal character escape")
                }
            }
            State::Neg => match c {
                b'0' => {
                    self.state = State::Zero;
                    Op::Continue
                }
                b'1'..=b'9' => {
                    self.state = State::One;
                    Op::Continue
                }
                _ => self.error(c, "in numeric literal"),
            },
            State::One => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else {
                    self.zero(c)
                }
            }
            State::Zero => self.zero(c),
            State::Dot => {
                if c.is_ascii_digit() {
                    self.state = State::Dot0;
                    Op::Continue
                } else {
                    self.error(c, "after decimal point in numeric literal")
                }
            }
            State::Dot0 => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else if c == b'e' || c == b'E' {
                    self.state = State::E;
                    Op::Continue
                } else {
                    self.end_value(c)
                }
            }
            State::E => {
                if c == b'+' || c == b'-' {
                    self.state = State::ESign;
                    Op::Continue
                } else {
                    self.e_sign(c)
                }
            }
            State::ESign => self.e_sign(c),
            State::E0 => {
                if c.is_ascii_digit() {
                    Op::Continue
                } else {
                    self.end_value(c)
                }
            }
            State::Literal(word, at) => {
                let bytes = word.as_bytes();
                let expected = bytes.get(at).copied().unwrap_or(b' ');
                if c == expected {
                    self.state = if at + 1 >= bytes.len() {
                        State::EndValue
                    } else {
                        State::Literal(word, at + 1)
                    };
                    Op::Continue
                } else {
                    let context = format!("in literal {word} (expecting {})", quote_char(expected));
                    self.error(c, &context)
                }
            }
            State::Error => Op::Error,
        }
    }

    fn begin_value(&mut self, c: u8) -> Op {
        if is_space(c) {
            return Op::SkipSpace;
        }
        match c {
            b'{' => {
                self.state = State::BeginStringOrEmpty;
                self.push_parse_state(c, Parse::ObjectKey, Op::BeginObject)
            }
            b'[' => {
                self.state = State::BeginValueOrEmpty;
                self.push_parse_state(c, Parse::ArrayValue, Op::BeginArray)
            }
            b'"' => self.literal(State::InString),
            b'-' => self.literal(State::Neg),
            b'0' => self.literal(State::Zero),
            b't' => self.literal(State::Literal("true", 1)),
            b'f' => self.literal(State::Literal("false", 1)),
            b'n' => self.literal(State::Literal("null", 1)),
            b'1'..=b'9' => self.literal(State::One),
            _ => self.error(c, "looking for beginning of value"),
        }
    }

    fn literal(&mut self, next: State) -> Op {
        self.state = next;
        Op::BeginLiteral
    }

    fn begin_string(&mut self, c: u8) -> Op {
        if is_space(c) {
            Op::SkipSpace
        } else if c == b'"' {
            self.literal(State::InString)
        } else {
            self.error(c, "looking for beginning of object key string")
        }
    }

    fn end_value(&mut self, c: u8) -> Op {
        let Some(&ps) = self.parse_state.last() else {
            self.state = State::EndTop;
            self.end_top = true;
            return self.end_top_state(c);
        };
        if is_space(c) {
            self.state = State::EndValue;
            return Op::SkipSpace;
        }
        match ps {
            Parse::ObjectKey => {
                if c == b':' {
                    if let Some(top) = self.parse_state.last_mut() {
                        *top = Parse::ObjectValue;
                    }
                    self.state = State::BeginValue;
                    Op::ObjectKey
                } else {
                    self.error(c, "after object key")
                }
            }
            Parse::ObjectValue => {
                if c == b',' {
                    if let Some(top) = self.parse_state.last_mut() {
                        *top = Parse::ObjectKey;
                    }
                    self.state = State::BeginString;
                    Op::ObjectValue
                } else if c == b'}' {
                    self.pop_parse_state();
                    Op::EndObject
                } else {
                    self.error(c, "after object key:value pair")
                }
            }
            Parse::ArrayValue => {
                if c == b',' {
                    self.state = State::BeginValue;
                    Op::ArrayValue
                } else if c == b']' {
                    self.pop_parse_state();
                    Op::EndArray
                } else {
                    self.error(c, "after array element")
                }
            }
        }
    }

    fn end_top_state(&mut self, c: u8) -> Op {
        if !is_space(c) {
            // Go records the error now and reports it on the next call (or at eof).
            self.error(c, "after top-level value");
        }
        Op::End
    }

    fn in_string(&mut self, c: u8) -> Op {
        match c {
            b'"' => {
                self.state = State::EndValue;
                Op::Continue
            }
            b'\\' => {
                self.state = State::InStringEsc;
                Op::Continue
            }
            _ if c < 0x20 => self.error(c, "in string literal"),
            _ => Op::Continue,
        }
    }

    fn zero(&mut self, c: u8) -> Op {
        match c {
            b'.' => {
                self.state = State::Dot;
                Op::Continue
            }
            b'e' | b'E' => {
                self.state = State::E;
                Op::Continue
            }
            _ => self.end_value(c),
        }
    }

    fn e_sign(&mut self, c: u8) -> Op {
        if c.is_ascii_digit() {
            self.state = State::E0;
            Op::Continue
        } else {
            self.error(c, "in exponent of numeric literal")
        }
    }
}

/// An open composite value while its members are being read.
#[derive(Debug)]
enum Frame {
    Array(Vec<JsonValue>),
    Object(Vec<(String, JsonValue)>, Option<String>),
}

/// Builds the value from the scanner's opcodes, as Go's decoder does.
#[derive(Debug, Default)]
struct Builder {
    stack: Vec<Frame>,
    /// Start offset of the literal being scanned, if any.
    literal_start: Option<usize>,
    /// The most recently completed value, not yet placed in its container.
    done: Option<JsonValue>,
}

impl Builder {
    fn on_op(&mut self, op: Op, at: usize, text: &[u8]) {
        if op == Op::Continue {
            return;
        }
        if let Some(start) = self.literal_start.take() {
            let raw = text.get(start..at).unwrap_or_default();
            self.done = Some(literal_value(raw));
        }
        match op {
            Op::BeginLiteral => self.literal_start = Some(at),
            Op::BeginObject => self.stack.push(Frame::Object(Vec::new(), None)),
            Op::BeginArray => self.stack.push(Frame::Array(Vec::new())),
            Op::ObjectKey => {
                if let Some(Frame::Object(_, key)) = self.stack.last_mut() {
                    *key = match self.done.take() {
                        Some(JsonValue::String(s)) => Some(s),
                        _ => Some(String::new()),
                    };
                }
            }
            Op::ObjectValue | Op::ArrayValue => self.place_done(),
            Op::EndObject | Op::EndArray => {
                self.place_done();
                self.done = match self.stack.pop() {
                    Some(Frame::Array(items)) => Some(JsonValue::Array(items)),
                    Some(Frame::Object(members, _)) => Some(JsonValue::Object(members)),
                    None => None,
                };
            }
            Op::Continue | Op::SkipSpace | Op::End | Op::Error => {}
        }
    }

    /// Moves the completed value into the innermost open container.
    fn place_done(&mut self) {
        let Some(value) = self.done.take() else {
            return;
        };
        match self.stack.last_mut() {
            Some(Frame::Array(items)) => items.push(value),
            Some(Frame::Object(members, key)) => {
                members.push((key.take().unwrap_or_default(), value));
            }
            None => self.done = Some(value),
        }
    }
}

/// Turns the raw text of a scalar the scanner accepted into its value.
fn literal_value(raw: &[u8]) -> JsonValue {
    match raw.first() {
        Some(b'"') => JsonValue::String(unquote(raw)),
        Some(b't') => JsonValue::Bool(true),
        Some(b'f') => JsonValue::Bool(false),
        Some(b'n') => JsonValue::Null,
        _ => JsonValue::Number(String::from_utf8_lossy(raw).into_owned()),
    }
}

/// Bytes as a Go string reads when decoded rune by rune (`json.Unmarshal`, `json.Marshal`):
/// every byte that is not part of valid UTF-8 becomes U+FFFD.
pub fn go_string_from_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                out.push_str(valid);
                break;
            }
            Err(error) => {
                let (good, bad) = rest.split_at(error.valid_up_to());
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = bad.get(1..).unwrap_or_default();
            }
        }
    }
    out
}

/// Reads four hex digits of a `\uXXXX` escape starting at `s[0]` (Go's `getu4`).
fn getu4(s: &[u8]) -> Option<u32> {
    if s.len() < 6 || s[0] != b'\\' || s[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&s[2..6]).ok()?;
    u32::from_str_radix(hex, 16).ok()
}

/// Unescapes a quoted JSON string the scanner accepted, as Go's `unquote` does.
fn unquote(raw: &[u8]) -> String {
    let b = raw
        .strip_prefix(b"\"")
        .and_then(|inner| inner.strip_suffix(b"\""))
        .unwrap_or(raw);
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let simple = match b.get(i + 1).copied().unwrap_or(b'\\') {
            b'"' => Some('"'),
            b'\\' => Some('\\'),
            b'/' => Some('/'),
            b'b' => Some('\u{8}'),
            b'f' => Some('\u{c}'),
            b'n' => Some('\n'),
            b'r' => Some('\r'),
            b't' => Some('\t'),
            _ => None,
        };
        let mut push = |character: char| {
            out.extend_from_slice(character.encode_utf8(&mut [0; 4]).as_bytes());
        };
        if let Some(character) = simple {
            push(character);
            i += 2;
            continue;
        }
        let Some(r) = getu4(&b[i..]) else {
            // Unreachable for scanner-approved input; keep the byte and move on.
            push('\\');
            i += 1;
            continue;
        };
        i += 6;
        if (0xD800..0xE000).contains(&r) {
            // utf16.DecodeRune: a high surrogate followed by a `\u` low surrogate joins;
            // anything else becomes U+FFFD and the second escape is read on its own.
            if let Some(r2) = getu4(&b[i..])
                && (0xD800..0xDC00).contains(&r)
                && (0xDC00..0xE000).contains(&r2)
            {
                let joined = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
                push(char::from_u32(joined).unwrap_or(char::REPLACEMENT_CHARACTER));
                i += 6;
                continue;
            }
            push(char::REPLACEMENT_CHARACTER);
            continue;
        }
        push(char::from_u32(r).unwrap_or(char::REPLACEMENT_CHARACTER));
    }
    go_string_from_bytes(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<JsonValue, JsonSyntaxError> {
        super::parse(text.as_bytes())
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(v) => panic!("expected an error for {text:?}, got {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn num(s: &str) -> JsonValue {
        JsonValue::Number(s.to_owned())
    }

    fn string(s: &str) -> JsonValue {
        JsonValue::String(s.to_owned())
    }

    #[test]
    fn scalars() {
        assert_eq!(parse("null").unwrap(), JsonValue::Null);
        assert_eq!(parse("true").unwrap(), JsonValue::Bool(true));
        assert_eq!(parse("false").unwrap(), JsonValue::Bool(false));
        assert_eq!(parse("\"x\"").unwrap(), string("x"));
        assert_eq!(parse("0").unwrap(), num("0"));
        assert_eq!(parse(" \t\r\n42 \n").unwrap(), num("42"));
    }

    #[test]
    fn numbers_keep_their_literal_text() {
        for n in [
            "64",
            "64.0",
            "-0",
            "1e+21",
            "1E5",
            "0.5e-3",
            "12345678901234567890123",
            "-1.25",
        ] {
            assert_eq!(parse(n).unwrap(), num(n), "{n}");
            let doc = format!("{{\"n\":{n}}}");
            assert_eq!(
                parse(&doc).unwrap(),
                JsonValue::Object(vec![("n".into(), num(n))])
            );
        }
    }

    #[test]
    fn objects_keep_order_and_duplicates() {
        let v = parse(r#"{"b": 1, "a": [true, null, {}], "b": "again", "": []}"#).unwrap();
        assert_eq!(
            v,
            JsonValue::Object(vec![
                ("b".into(), num("1")),
                (
                    "a".into(),
                    JsonValue::Array(vec![
                        JsonValue::Bool(true),
                        JsonValue::Null,
                        JsonValue::Object(vec![])
                    ])
                ),
                ("b".into(), string("again")),
                (String::new(), JsonValue::Array(vec![])),
            ])
        );
    }

    #[test]
    fn nested_structures() {
        let v = parse(r#"[[1,[2,[3]]],{"a":{"b":{"c":[]}}}]"#).unwrap();
        assert_eq!(
            v,
            JsonValue::Array(vec![
                JsonValue::Array(vec![
                    num("1"),
                    JsonValue::Array(vec![num("2"), JsonValue::Array(vec![num("3")])])
                ]),
                JsonValue::Object(vec![(
                    "a".into(),
                    JsonValue::Object(vec![(
                        "b".into(),
                        JsonValue::Object(vec![("c".into(), JsonValue::Array(vec![]))])
                    )])
                )]),
            ])
        );
    }

    #[test]
    fn ip_masq_agent_json_config() {
        let v = parse(
            r#"{"nonMasqueradeCIDRs": ["10.0.0.0/8", "172.16.0.0/12"], "cidrLimit": 64,
                "masqLinkLocal": false, "resyncInterval": "60s"}"#,
        )
        .unwrap();
        assert_eq!(
            v,
            JsonValue::Object(vec![
                (
                    "nonMasqueradeCIDRs".into(),
                    JsonValue::Array(vec![string("10.0.0.0/8"), string("172.16.0.0/12")])
                ),
                ("cidrLimit".into(), num("64")),
                ("masqLinkLocal".into(), JsonValue::Bool(false)),
                ("resyncInterval".into(), string("60s")),
            ])
        );
    }

    #[test]
    fn string_escapes() {
        assert_eq!(
            parse(r#""a\"b\\c\/d\be\ff\ng\rh\ti""#).unwrap(),
            string("a\"b\\c/d\u{8}e\u{c}f\ng\rh\ti")
        );
        assert_eq!(parse(r#""\u0041\u00e9\u4e2D""#).unwrap(), string("Aé中"));
        assert_eq!(parse("\"héllo ☃ 😀\"").unwrap(), string("héllo ☃ 😀"));
    }

    #[test]
    fn surrogates_like_go() {
        // A proper pair joins.
        assert_eq!(parse(r#""\ud83d\ude00""#).unwrap(), string("😀"));
        // Lone high and lone low surrogates become U+FFFD.
        assert_eq!(parse(r#""\ud83d""#).unwrap(), string("\u{FFFD}"));
        assert_eq!(parse(r#""\ude00x""#).unwrap(), string("\u{FFFD}x"));
        // High followed by a non-surrogate escape: U+FFFD, then the escape on its own.
        assert_eq!(parse(r#""\ud83d\u0041""#).unwrap(), string("\u{FFFD}A"));
        // High followed by high then low: U+FFFD, then the pair.
        assert_eq!(
            parse(r#""\ud83d\ud83d\ude00""#).unwrap(),
            string("\u{FFFD}😀")
        );
        // High surrogate followed by a plain character.
        assert_eq!(parse(r#""\ud83dA""#).unwrap(), string("\u{FFFD}A"));
    }

    #[test]
    fn go_error_messages_end_of_input() {
        for text in [
            "", "   ", "\n", "[2, 3", "{", "{\"a\"", "{\"a\":", "{\"a\":1", "\"abc", "[",
        ] {
            assert_eq!(err(text), "unexpected end of JSON input", "{text:?}");
        }
        // Go's eof feeds a space to the state machine, which an open escape rejects.
        assert_eq!(err("\"\\"), "invalid character ' ' in string escape code");
        assert_eq!(
            err("\"\\u12"),
            r"invalid character ' ' in \u hexadecimal character escape"
        );
    }

    #[test]
    fn go_error_messages() {
        for (text, message) in [
            (
                r#"{"X": "foo", "Y"}"#,
                "invalid character '}' after object key",
            ),
            (r#"{"a" 1}"#, "invalid character '1' after object key"),
            (
                r#"{"X":12x}"#,
                "invalid character 'x' after object key:value pair",
            ),
            ("[1, 2, 3+]", "invalid character '+' after array element"),
            (
                "{*}",
                "invalid character '*' looking for beginning of object key string",
            ),
            (
                "{\"a\":1,}",
                "invalid character '}' looking for beginning of object key string",
            ),
            (
                "[1,]",
                "invalid character ']' looking for beginning of value",
            ),
            ("x", "invalid character 'x' looking for beginning of value"),
            (
                "{'a':1}",
                r"invalid character '\'' looking for beginning of object key string",
            ),
            (":", "invalid character ':' looking for beginning of value"),
            (
                "tx",
                "invalid character 'x' in literal true (expecting 'r')",
            ),
            (
                "trx",
                "invalid character 'x' in literal true (expecting 'u')",
            ),
            (
                "tru",
                "invalid character ' ' in literal true (expecting 'e')",
            ),
            (
                "fals",
                "invalid character ' ' in literal false (expecting 'e')",
            ),
            (
                "fx",
                "invalid character 'x' in literal false (expecting 'a')",
            ),
            (
                "nul",
                "invalid character ' ' in literal null (expecting 'l')",
            ),
            (
                "nx",
                "invalid character 'x' in literal null (expecting 'u')",
            ),
            (
                "True",
                "invalid character 'T' looking for beginning of value",
            ),
            ("truex", "invalid character 'x' after top-level value"),
            ("-", "invalid character ' ' in numeric literal"),
            (r#"{"F3": -}"#, "invalid character '}' in numeric literal"),
            ("-a", "invalid character 'a' in numeric literal"),
            (
                "1.",
                "invalid character ' ' after decimal point in numeric literal",
            ),
            (
                "1.e5",
                "invalid character 'e' after decimal point in numeric literal",
            ),
            ("1e", "invalid character ' ' in exponent of numeric literal"),
            (
                "1e+",
                "invalid character ' ' in exponent of numeric literal",
            ),
            (
                "1ex",
                "invalid character 'x' in exponent of numeric literal",
            ),
            ("01", "invalid character '1' after top-level value"),
            (
                r#"{"a":01}"#,
                "invalid character '1' after object key:value pair",
            ),
            ("+1", "invalid character '+' looking for beginning of value"),
            (".5", "invalid character '.' looking for beginning of value"),
            ("1.5.2", "invalid character '.' after top-level value"),
            ("\"a\tb\"", r"invalid character '\t' in string literal"),
            ("\"a\nb\"", r"invalid character '\n' in string literal"),
            ("\"\u{1}\"", r"invalid character '\x01' in string literal"),
            ("\"\u{1f}\"", r"invalid character '\x1f' in string literal"),
            (r#""\q""#, "invalid character 'q' in string escape code"),
            (r#""\'""#, r"invalid character '\'' in string escape code"),
            (r#""\U0041""#, "invalid character 'U' in string escape code"),
            (
                r#""\u12G4""#,
                r"invalid character 'G' in \u hexadecimal character escape",
            ),
            (
                r#""\u""#,
                r#"invalid character '"' in \u hexadecimal character escape"#,
            ),
            ("{} {}", "invalid character '{' after top-level value"),
            ("1 2", "invalid character '2' after top-level value"),
            ("{}x", "invalid character 'x' after top-level value"),
            ("[]\n\n]", "invalid character ']' after top-level value"),
            ("null,", "invalid character ',' after top-level value"),
            (
                "\u{c}{}",
                r"invalid character '\f' looking for beginning of value",
            ),
            ("{}\u{b}", r"invalid character '\v' after top-level value"),
            (
                "[x, \"\\q\"]",
                "invalid character 'x' looking for beginning of value",
            ),
            (
                "[1, \"\\q\", x]",
                "invalid character 'q' in string escape code",
            ),
            ("é", "invalid character 'Ã' looking for beginning of value"),
            (
                "\u{feff}{}",
                "invalid character 'ï' looking for beginning of value",
            ),
            (
                "\u{a0}{}",
                "invalid character 'Â' looking for beginning of value",
            ),
            ("[1\u{85}]", "invalid character 'Â' after array element"),
            (
                "\u{0}",
                r"invalid character '\x00' looking for beginning of value",
            ),
            (
                "[\u{1b}]",
                r"invalid character '\x1b' looking for beginning of value",
            ),
        ] {
            assert_eq!(err(text), message, "{text:?}");
        }
        assert_eq!(parse("\"\u{7f}\"").unwrap(), string("\u{7f}"));
        assert_eq!(parse(" {}\r\n\t ").unwrap(), JsonValue::Object(vec![]));
    }

    #[test]
    fn quote_char_formats_like_go() {
        assert_eq!(quote_char(b'a'), "'a'");
        assert_eq!(quote_char(b'\''), r"'\''");
        assert_eq!(quote_char(b'"'), "'\"'");
        assert_eq!(quote_char(b'\\'), r"'\\'");
        assert_eq!(quote_char(0), r"'\x00'");
        assert_eq!(quote_char(0x07), r"'\a'");
        assert_eq!(quote_char(0x7f), r"'\x7f'");
        assert_eq!(quote_char(0x80), r"'\u0080'");
        assert_eq!(quote_char(0xa0), r"'\u00a0'");
        assert_eq!(quote_char(0xad), r"'\u00ad'");
        assert_eq!(quote_char(0xc3), "'Ã'");
        assert_eq!(quote_char(0xff), "'ÿ'");
    }

    #[test]
    fn max_depth() {
        let ok = format!(
            "{}{}",
            "[".repeat(MAX_NESTING_DEPTH),
            "]".repeat(MAX_NESTING_DEPTH)
        );
        let v = parse(&ok).unwrap();
        // Flatten before dropping so the test does not depend on recursive drop depth.
        let mut depth = 0;
        let mut cur = v;
        while let JsonValue::Array(mut items) = cur {
            depth += 1;
            cur = items.pop().unwrap_or(JsonValue::Null);
        }
        assert_eq!(depth, MAX_NESTING_DEPTH);

        let deep = "[".repeat(MAX_NESTING_DEPTH + 1);
        assert_eq!(err(&deep), "invalid character '[' exceeded max depth");
        let deep_obj = format!("{}{{", "{\"a\":".repeat(MAX_NESTING_DEPTH));
        assert_eq!(err(&deep_obj), "invalid character '{' exceeded max depth");
        // The depth error comes before the end-of-input error.
        assert_eq!(
            err(&"[".repeat(20_000)),
            "invalid character '[' exceeded max depth"
        );
    }

    #[test]
    fn random_input_never_panics() {
        // A small deterministic xorshift generator keeps the test reproducible.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let alphabet = b"{}[]\",:\\ntrufalse0123456789.eE+-u \t\r\nxq\x01";
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = usize::try_from(state % 24).unwrap_or(0);
            let mut s = String::new();
            let mut x = state;
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let idx = usize::try_from(x % alphabet.len() as u64).unwrap_or(0);
                s.push(char::from(alphabet[idx]));
            }
            let _ = parse(&s);
        }
    }

    #[test]
    fn bytes_outside_utf8_become_replacement_characters() {
        assert_eq!(go_string_from_bytes(b"a\xe2\x82b"), "a\u{FFFD}\u{FFFD}b");
    }
}
