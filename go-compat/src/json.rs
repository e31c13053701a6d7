//! Go's `encoding/json`: a reader that accepts, rejects and reports exactly as Go's does, the
//! string escaping of `json.Marshal`, and the field lookup of `json.Unmarshal`.
//!
//! Upstream ip-masq-agent hands its config file to `json.Unmarshal`. Operators see Go's error
//! text in logs and scripts grep for it, so a drop-in replacement must fail on the same inputs
//! with the same words. `json.Unmarshal` checks the whole input with its scanner before
//! decoding anything, so the first error in document order is the one reported; the reader
//! below reads in that order, follows the scanner's grammar byte for byte, and builds the
//! message from the offending byte as Go's `quoteChar` formats it. At the end of the input
//! Go's scanner is fed one space, which decides whether a cut-off document is "unexpected end
//! of JSON input" or an invalid character `' '`.

use std::fmt::Write as _;

use crate::strconv::quote;

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
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' | '\0'..'\u{20}' => {
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
    // Every level of nesting takes a byte, so a short document fits any thread's stack.
    if bytes.len() <= 1000 {
        parse_here(bytes)
    } else {
        crate::on_deep_stack(|| parse_here(bytes))
    }
}

/// [`parse`] on the calling thread's stack.
pub(crate) fn parse_here(bytes: &[u8]) -> Result<JsonValue, JsonSyntaxError> {
    let mut reader = Reader {
        bytes,
        at: 0,
        depth: 0,
    };
    let value = reader.value()?;
    match reader.skip_space() {
        Some(c) => invalid(c, "after top-level value"),
        None => Ok(value),
    }
}

/// `json.Unmarshal`'s nesting limit applied to a value built some other way (the JSON text
/// sigs.k8s.io/yaml produced): the error names the first bracket, in text order, that goes
/// too deep.
pub fn check_depth(value: &JsonValue) -> Result<(), JsonSyntaxError> {
    fn check(value: &JsonValue, depth: usize) -> Result<(), JsonSyntaxError> {
        let (bracket, children): (u8, Vec<&JsonValue>) = match value {
            JsonValue::Array(items) => (b'[', items.iter().collect()),
            JsonValue::Object(members) => (b'{', members.iter().map(|(_, value)| value).collect()),
            _ => return Ok(()),
        };
        if depth > MAX_NESTING_DEPTH {
            return invalid(bracket, "exceeded max depth");
        }
        children
            .into_iter()
            .try_for_each(|child| check(child, depth + 1))
    }
    check(value, 1)
}

/// Formats a byte the way Go's `quoteChar` does: as the rune U+0000..U+00FF quoted by
/// `strconv.Quote`, but between single quotes.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => "'\\''".to_owned(),
        b'"' => "'\"'".to_owned(),
        _ => {
            let quoted = quote(&char::from(c).to_string());
            format!("'{}'", &quoted[1..quoted.len() - 1])
        }
    }
}

/// Go's error for the byte `c`, met `context`.
fn invalid<T>(c: u8, context: &str) -> Result<T, JsonSyntaxError> {
    Err(JsonSyntaxError {
        msg: format!("invalid character {} {context}", quote_char(c)),
    })
}

/// Reads one JSON document in the order Go's scanner does.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Open arrays and objects.
    depth: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// The next byte, or the space Go's scanner is fed at the end of the input.
    fn next_or_space(&mut self) -> u8 {
        let c = self.peek().unwrap_or(b' ');
        self.at = (self.at + 1).min(self.bytes.len());
        c
    }

    /// Consumes white space and the byte after it, if there is one.
    fn skip_space(&mut self) -> Option<u8> {
        while let Some(c) = self.peek() {
            self.at += 1;
            if !matches!(c, b' ' | b'\t' | b'\r' | b'\n') {
                return Some(c);
            }
        }
        None
    }

    /// Like [`Self::skip_space`], where the document cannot end.
    fn more(&mut self) -> Result<u8, JsonSyntaxError> {
        self.skip_space()
            .ok_or_else(JsonSyntaxError::unexpected_end)
    }

    fn value(&mut self) -> Result<JsonValue, JsonSyntaxError> {
        let c = self.more()?;
        self.value_from(c)
    }

    /// The value whose first byte, `c`, was just consumed.
    fn value_from(&mut self, c: u8) -> Result<JsonValue, JsonSyntaxError> {
        Ok(match c {
            b'{' => self.object()?,
            b'[' => self.array()?,
            b'"' => JsonValue::String(self.string()?),
            b'-' | b'0'..=b'9' => self.number(c)?,
            b't' => self.word("true", JsonValue::Bool(true))?,
            b'f' => self.word("false", JsonValue::Bool(false))?,
            b'n' => self.word("null", JsonValue::Null)?,
            _ => return invalid(c, "looking for beginning of value"),
        })
    }

    /// The members of an array or object whose opening bracket, `open`, was consumed: each
    /// read by `member` from its first byte, separated by commas, up to `close`; `after` says
    /// where a wrong separator was met.
    fn members(
        &mut self,
        (open, close): (u8, u8),
        after: &str,
        mut member: impl FnMut(&mut Self, u8) -> Result<(), JsonSyntaxError>,
    ) -> Result<(), JsonSyntaxError> {
        self.depth += 1;
        if self.depth > MAX_NESTING_DEPTH {
            return invalid(open, "exceeded max depth");
        }
        let mut c = self.more()?;
        if c != close {
            loop {
                member(self, c)?;
                match self.more()? {
                    b',' => c = self.more()?,
                    end if end == close => break,
                    other => return invalid(other, after),
                }
            }
        }
        self.depth -= 1;
        Ok(())
    }

    fn array(&mut self) -> Result<JsonValue, JsonSyntaxError> {
        let mut items = Vec::new();
        self.members((b'[', b']'), "after array element", |reader, c| {
            items.push(reader.value_from(c)?);
            Ok(())
        })?;
        Ok(JsonValue::Array(items))
    }

    fn object(&mut self) -> Result<JsonValue, JsonSyntaxError> {
        let mut members = Vec::new();
        self.members((b'{', b'}'), "after object key:value pair", |reader, c| {
            if c != b'"' {
                return invalid(c, "looking for beginning of object key string");
            }
            let key = reader.string()?;
            let colon = reader.more()?;
            if colon != b':' {
                return invalid(colon, "after object key");
            }
            members.push((key, reader.value()?));
            Ok(())
        })?;
        Ok(JsonValue::Object(members))
    }

    /// The rest of `true`, `false` or `null`, whose first letter was consumed.
    fn word(&mut self, word: &str, value: JsonValue) -> Result<JsonValue, JsonSyntaxError> {
        for expected in word.bytes().skip(1) {
            let c = self.next_or_space();
            if c != expected {
                let context = format!("in literal {word} (expecting {})", quote_char(expected));
                return invalid(c, &context);
            }
        }
        Ok(value)
    }

    /// A number whose first byte (`-` or a digit) was consumed; it ends before the first byte
    /// that cannot continue it, which the caller reads next.
    fn number(&mut self, first: u8) -> Result<JsonValue, JsonSyntaxError> {
        let start = self.at - 1;
        let mut c = first;
        if c == b'-' {
            c = self.next_or_space();
            if !c.is_ascii_digit() {
                return invalid(c, "in numeric literal");
            }
        }
        // A leading zero is a whole integer part.
        if c != b'0' {
            self.digits();
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            let c = self.next_or_space();
            if !c.is_ascii_digit() {
                return invalid(c, "after decimal point in numeric literal");
            }
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            let mut c = self.next_or_space();
            if c == b'+' || c == b'-' {
                c = self.next_or_space();
            }
            if !c.is_ascii_digit() {
                return invalid(c, "in exponent of numeric literal");
            }
            self.digits();
        }
        let literal = &self.bytes[start..self.at];
        Ok(JsonValue::Number(
            String::from_utf8_lossy(literal).into_owned(),
        ))
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
    }

    /// A string whose opening quote was consumed, unescaped as Go's `unquote` does.
    fn string(&mut self) -> Result<String, JsonSyntaxError> {
        let mut text = Vec::new();
        loop {
            let c = self.peek().ok_or_else(JsonSyntaxError::unexpected_end)?;
            self.at += 1;
            let unescaped = match c {
                b'"' => return Ok(go_string_from_bytes(&text)),
                b'\\' => self.escape()?,
                _ if c < 0x20 => return invalid(c, "in string literal"),
                _ => {
                    text.push(c);
                    continue;
                }
            };
            text.extend_from_slice(unescaped.encode_utf8(&mut [0; 4]).as_bytes());
        }
    }

    /// The character an escape stands for, its backslash consumed. `utf16.DecodeRune`'s
    /// rules: a high surrogate joins a `\u` low surrogate right after it; any other surrogate
    /// is U+FFFD, and an escape after it is read on its own.
    fn escape(&mut self) -> Result<char, JsonSyntaxError> {
        Ok(match self.next_or_space() {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = self.hex4()?;
                let low = (0xD800..0xDC00)
                    .contains(&unit)
                    .then(|| self.low_surrogate_ahead())
                    .flatten();
                match low {
                    Some(low) => {
                        self.at += 6;
                        let joined = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        char::from_u32(joined).unwrap_or(char::REPLACEMENT_CHARACTER)
                    }
                    None => char::from_u32(unit).unwrap_or(char::REPLACEMENT_CHARACTER),
                }
            }
            c => return invalid(c, "in string escape code"),
        })
    }

    /// The four hex digits of a `\u` escape.
    fn hex4(&mut self) -> Result<u32, JsonSyntaxError> {
        let mut unit = 0;
        for _ in 0..4 {
            let c = self.next_or_space();
            let Some(digit) = char::from(c).to_digit(16) else {
                return invalid(c, "in \\u hexadecimal character escape");
            };
            unit = unit * 16 + digit;
        }
        Ok(unit)
    }

    /// The low surrogate a `\u` escape right here holds, without consuming it.
    fn low_surrogate_ahead(&self) -> Option<u32> {
        let escape = self.bytes.get(self.at..self.at + 6)?;
        let hex = std::str::from_utf8(escape.strip_prefix(b"\\u")?).ok()?;
        u32::from_str_radix(hex, 16)
            .ok()
            .filter(|unit| (0xDC00..0xE000).contains(unit))
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
