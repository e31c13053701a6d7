//! Go's `time.Duration`: `time.ParseDuration` with its messages, and `Duration.String`.
//!
//! `resyncInterval` is a Go duration string, and upstream logs and rejects it with Go's words.

use std::fmt::Write as _;

/// The `time` package's own quoting (used in duration errors): bytes outside printable ASCII
/// become `\xNN`.
fn time_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for character in text.chars() {
        if character < ' ' || !character.is_ascii() {
            let mut buffer = [0u8; 4];
            for byte in character.encode_utf8(&mut buffer).bytes() {
                let _ = write!(quoted, "\\x{byte:02x}");
            }
        } else {
            if character == '"' || character == '\\' {
                quoted.push('\\');
            }
            quoted.push(character);
        }
    }
    quoted.push('"');
    quoted
}

/// A Go `time.Duration`: signed nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct GoDuration(pub i64);

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

impl GoDuration {
    /// `n` whole seconds.
    pub const fn from_secs(seconds: i64) -> Self {
        Self(seconds.saturating_mul(SECOND as i64))
    }

    /// The duration as a std `Duration`, or `None` when it is zero or negative.
    pub fn to_std(self) -> Option<std::time::Duration> {
        u64::try_from(self.0)
            .ok()
            .filter(|nanos| *nanos > 0)
            .map(std::time::Duration::from_nanos)
    }

    /// Go's `time.ParseDuration`, with its error messages.
    pub fn parse(original: &str) -> Result<Self, String> {
        let invalid = || format!("time: invalid duration {}", time_quote(original));
        let negative = original.starts_with('-');
        let mut rest = original.strip_prefix(['-', '+']).unwrap_or(original);
        if rest == "0" {
            return Ok(Self(0));
        }
        if rest.is_empty() {
            return Err(invalid());
        }
        let mut total: u64 = 0;
        while !rest.is_empty() {
            if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
                return Err(invalid());
            }
            let (whole, after_whole) = leading_int(rest).ok_or_else(invalid)?;
            let has_whole = after_whole.len() != rest.len();
            // A dot is consumed even when no digit follows it.
            let dot = after_whole.strip_prefix('.');
            let (fraction, scale, after_fraction) =
                dot.map_or((0, 1.0, after_whole), leading_fraction);
            let has_fraction = dot.is_some_and(|dot| dot.len() != after_fraction.len());
            rest = after_fraction;
            if !has_whole && !has_fraction {
                return Err(invalid());
            }
            let unit_len = rest
                .find(|c: char| c == '.' || c.is_ascii_digit())
                .unwrap_or(rest.len());
            if unit_len == 0 {
                return Err(format!(
                    "time: missing unit in duration {}",
                    time_quote(original)
                ));
            }
            let (unit_text, after_unit) = rest.split_at(unit_len);
            rest = after_unit;
            let unit = match unit_text {
                "ns" => NANOSECOND,
                "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
                "ms" => MILLISECOND,
                "s" => SECOND,
                "m" => MINUTE,
                "h" => HOUR,
                _ => {
                    return Err(format!(
                        "time: unknown unit {} in duration {}",
                        time_quote(unit_text),
                        time_quote(original)
                    ));
                }
            };
            const LIMIT: u64 = 1 << 63;
            if whole > LIMIT / unit {
                return Err(invalid());
            }
            let mut value = whole * unit;
            if fraction > 0 {
                #[expect(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "Go computes the fractional part in float64 and truncates"
                )]
                let fractional = (fraction as f64 * (unit as f64 / scale)) as u64;
                value = value.saturating_add(fractional);
                if value > LIMIT {
                    return Err(invalid());
                }
            }
            total = total.saturating_add(value);
            if total > LIMIT {
                return Err(invalid());
            }
        }
        if negative {
            // 1 << 63 itself is representable as the most negative duration.
            return Ok(Self(0i64.wrapping_sub_unsigned(total)));
        }
        i64::try_from(total).map(Self).map_err(|_| invalid())
    }
}

/// `value * 10 + digit`, if that is at most 1 << 63 (Go's bound on the parts of a duration).
fn append_digit(value: u64, digit: u8) -> Option<u64> {
    let value = value
        .checked_mul(10)?
        .checked_add(u64::from(digit - b'0'))?;
    (value <= 1 << 63).then_some(value)
}

fn leading_int(text: &str) -> Option<(u64, &str)> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let value = text[..digits].bytes().try_fold(0, append_digit)?;
    Some((value, &text[digits..]))
}

fn leading_fraction(text: &str) -> (u64, f64, &str) {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (mut value, mut scale) = (0u64, 1f64);
    // Go ignores the digits after the value would overflow.
    for digit in text[..digits].bytes() {
        let Some(next) = append_digit(value, digit) else {
            break;
        };
        (value, scale) = (next, scale * 10.0);
    }
    (value, scale, &text[digits..])
}

impl std::fmt::Display for GoDuration {
    /// Go's `Duration.String`: `1m0s`, `1.5s`, `300ms`, `0s`.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let negative = self.0 < 0;
        let magnitude = self.0.unsigned_abs();
        let mut text = String::new();
        if magnitude < SECOND {
            if magnitude == 0 {
                return formatter.write_str("0s");
            }
            let (unit, divisor, places) = if magnitude < MICROSECOND {
                ("ns", 1, 0)
            } else if magnitude < MILLISECOND {
                ("\u{b5}s", MICROSECOND, 3)
            } else {
                ("ms", MILLISECOND, 6)
            };
            text.push_str(&fraction_text(magnitude, divisor, places));
            text.push_str(unit);
        } else {
            let hours = magnitude / HOUR;
            let minutes = (magnitude % HOUR) / MINUTE;
            let seconds_part = magnitude % MINUTE;
            if hours > 0 {
                let _ = write!(text, "{hours}h");
            }
            if hours > 0 || minutes > 0 {
                let _ = write!(text, "{minutes}m");
            }
            text.push_str(&fraction_text(seconds_part, SECOND, 9));
            text.push('s');
        }
        if negative {
            formatter.write_str("-")?;
        }
        formatter.write_str(&text)
    }
}

/// `value / divisor` with up to `places` decimals, trailing zeros (and a bare dot) removed.
fn fraction_text(value: u64, divisor: u64, places: usize) -> String {
    let whole = value / divisor;
    let remainder = value % divisor;
    if remainder == 0 || places == 0 {
        return whole.to_string();
    }
    let digits = format!("{remainder:0places$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}
