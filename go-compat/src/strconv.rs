//! Go's `strconv`: quoting, integer and float parsing, and float formatting.
//!
//! Upstream's messages quote values with `%q` and its numbers go through `strconv`, so masq
//! reproduces Go's rules (prefixes, underscores, ranges, shortest float forms) rather than
//! Rust's.

use std::fmt::Write as _;

/// Go's `strconv.Quote` (what `%q` does to a string).
pub fn quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        match character {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\u{07}' => quoted.push_str("\\a"),
            '\u{08}' => quoted.push_str("\\b"),
            '\u{0c}' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\u{0b}' => quoted.push_str("\\v"),
            _ if is_print(character) => quoted.push(character),
            _ if character < ' ' || character == '\u{7f}' => {
                let _ = write!(quoted, "\\x{:02x}", u32::from(character));
            }
            _ if u32::from(character) < 0x10000 => {
                let _ = write!(quoted, "\\u{:04x}", u32::from(character));
            }
            _ => {
                let _ = write!(quoted, "\\U{:08x}", u32::from(character));
            }
        }
    }
    quoted.push('"');
    quoted
}

/// Go's `strconv.IsPrint`, exact for Latin-1 and approximated beyond it: letters, marks,
/// numbers, punctuation and symbols are printable; controls, spaces other than U+0020,
/// format characters and private-use or unassigned planes are not.
pub fn is_print(character: char) -> bool {
    let code = u32::from(character);
    if code < 0x80 {
        return (0x20..0x7f).contains(&code);
    }
    let format = matches!(
        code,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f | 0x2028..=0x202e
            | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb | 0xe0001 | 0xe0020..=0xe007f
    );
    let private_or_unassigned = matches!(code, 0xe000..=0xf8ff | 0xf0000..);
    !character.is_control() && !character.is_whitespace() && !format && !private_or_unassigned
}

/// Go's `strconv.Atoi` on a 64-bit platform, with its error messages.
pub fn atoi(text: &str) -> Result<i64, String> {
    parse_int(text, 10).ok_or_else(|| {
        let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
        let problem = if !digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit()) {
            "value out of range"
        } else {
            "invalid syntax"
        };
        format!("strconv.Atoi: parsing {}: {problem}", quote(text))
    })
}

/// Go's `strconv.underscoreOK`.
pub(crate) fn underscore_ok(s: &str) -> bool {
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

/// Go's `strconv.ParseUint(s, base, 64)` for base 0 (prefix-detected) or an explicit base;
/// `None` where Go returns an error.
pub fn parse_uint(s: &str, base: u32) -> Option<u64> {
    let prefixed = |prefix: &str| {
        s.get(..2)
            .filter(|start| start.eq_ignore_ascii_case(prefix) && s.len() > 2)
            .map(|_| &s[2..])
    };
    let (radix, digits) = match base {
        0 => prefixed("0b")
            .map(|digits| (2, digits))
            .or_else(|| prefixed("0o").map(|digits| (8, digits)))
            .or_else(|| prefixed("0x").map(|digits| (16, digits)))
            .unwrap_or(if s.starts_with('0') { (8, s) } else { (10, s) }),
        _ => (base, s),
    };
    // Underscores only separate digits, and only where the base comes from the text.
    if s.contains('_') && (base != 0 || !underscore_ok(s)) {
        return None;
    }
    let digits = digits.replace('_', "");
    // Rust's parser takes a sign, Go's does not.
    if digits.starts_with('+') {
        return None;
    }
    u64::from_str_radix(&digits, radix).ok()
}

/// Go's `strconv.ParseInt(s, base, 64)`; `None` where Go returns an error.
pub fn parse_int(s: &str, base: u32) -> Option<i64> {
    let (neg, rest) = match s.as_bytes().first()? {
        b'+' => (false, s.get(1..)?),
        b'-' => (true, s.get(1..)?),
        _ => (false, s),
    };
    let magnitude = parse_uint(rest, base)?;
    if neg {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `strconv.ParseFloat(s, 64)` for the decimal forms go-yaml hands it (the value starts
/// with `.` or passed the YAML float pattern); out-of-range values are errors as in Go. Rust
/// reads the same decimal forms once the underscores Go allows are gone (the words `inf` and
/// `nan` it also takes come out non-finite, refused like an overflow).
pub fn parse_float(s: &str) -> Option<f64> {
    if s.contains('_') && !underscore_ok(s) {
        return None;
    }
    let f: f64 = s.replace('_', "").parse().ok()?;
    f.is_finite().then_some(f)
}

// Float formatting. Rust prints floats with the same shortest round-trip digits as Go's
// `strconv` (`{}` in fixed notation, `{:e}` in scientific); Go differs in when it switches to
// an exponent and in how it writes one.

/// Go's exponent: a sign always, and (in `%e` and `%g`) at least two digits.
fn go_exponent(exponent: i32, min_digits: usize) -> String {
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{:0min_digits$}", exponent.unsigned_abs())
}

/// `{:e}` split into mantissa and exponent.
fn scientific(text: &str) -> (&str, i32) {
    let (mantissa, exponent) = text.split_once('e').unwrap_or((text, "0"));
    (mantissa, exponent.parse().unwrap_or(0))
}

/// `json.Marshal` of a finite float64: an exponent outside [1e-6, 1e21), written without a
/// leading zero.
pub fn format_json_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let text = format!("{f:e}");
        let (mantissa, exponent) = scientific(&text);
        format!("{mantissa}e{}", go_exponent(exponent, 1))
    } else {
        f.to_string()
    }
}

/// `strconv.FormatFloat(f, 'g', -1, bits)` for 32 or 64 bits: an exponent outside
/// [1e-4, 1e6).
pub fn format_g(f: f64, single: bool) -> String {
    let v = if single { f64::from(f as f32) } else { f };
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    let (text, fixed) = if single {
        (format!("{:e}", v as f32), (v as f32).to_string())
    } else {
        (format!("{v:e}"), v.to_string())
    };
    let (mantissa, exponent) = scientific(&text);
    if v != 0.0 && !(-4..6).contains(&exponent) {
        format!("{mantissa}e{}", go_exponent(exponent, 2))
    } else {
        fixed
    }
}
