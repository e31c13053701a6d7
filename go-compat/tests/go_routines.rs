//! Replays `routines.jsonl`: what Go's own functions (`strconv`, `time`, `net.ParseCIDR`,
//! `encoding/json`) answer for thousands of inputs, recorded by the oracle in
//! `masq-userspace/tests/go-oracle` (`regenerate.sh` writes this file too). Each answer must be
//! go-compat's, byte for byte.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::{fmt::Write as _, fs};

use base64::Engine as _;
use go_compat::{
    json::{JsonValue, parse, quote_string},
    net::parse_cidr,
    strconv::{atoi, format_g, format_json_float, parse_float, parse_int, parse_uint, quote},
    time::GoDuration,
};
use serde_json::Value;

/// A JSON value as main.go writes it from Go's token stream: each token and a space.
fn tokens(value: &JsonValue, out: &mut String) {
    match value {
        JsonValue::Null => out.push_str("null"),
        JsonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        JsonValue::Number(n) => out.push_str(n),
        JsonValue::String(s) => out.push_str(&quote_string(s)),
        JsonValue::Array(items) => {
            out.push_str("[ ");
            items.iter().for_each(|item| tokens(item, out));
            out.push(']');
        }
        JsonValue::Object(members) => {
            out.push_str("{ ");
            for (key, item) in members {
                out.push_str(&quote_string(key));
                out.push(' ');
                tokens(item, out);
            }
            out.push('}');
        }
    }
    out.push(' ');
}

/// go-compat's answer to one routines.jsonl record: `Err(None)` where go-compat reports an
/// error without Go's text (the caller words it).
fn go_compat_answer(routine: &str, input: &[u8], arg: u32) -> Result<String, Option<String>> {
    let text = match routine {
        "json.Unmarshal" => "",
        _ => std::str::from_utf8(input).expect("text input"),
    };
    let number = |text: &str| text.parse::<f64>().expect("float input");
    let no_text = |answer: Option<String>| answer.ok_or(None);
    match routine {
        "strconv.Quote" => Ok(quote(text)),
        "strconv.Atoi" => atoi(text).map(|n| n.to_string()).map_err(Some),
        "strconv.ParseInt" => no_text(parse_int(text, arg).map(|n| n.to_string())),
        "strconv.ParseUint" => no_text(parse_uint(text, arg).map(|n| n.to_string())),
        "strconv.ParseFloat" => no_text(parse_float(text).map(|f| f.to_bits().to_string())),
        "strconv.FormatFloat" => Ok(format_g(number(text), arg == 32)),
        "json.Marshal(float64)" => Ok(format_json_float(number(text))),
        "time.ParseDuration" => GoDuration::parse(text)
            .map(|d| d.0.to_string())
            .map_err(Some),
        "time.Duration.String" => Ok(GoDuration(text.parse().expect("nanoseconds")).to_string()),
        "net.ParseCIDR" => no_text(parse_cidr(text).map(|cidr| {
            let (network, aligned) = (cidr.network_string(), cidr.is_aligned());
            let mut out = format!("{} {network} {aligned}", cidr.ip_string());
            if aligned {
                // What masq matches: Go's network, in the family upstream files the CIDR under.
                let _ = write!(out, " ipv4={}", cidr.network().addr().is_ipv4());
                if cidr.network().to_string() != network {
                    let _ = write!(out, " (matches {})", cidr.network());
                }
            }
            out
        })),
        "json.Unmarshal" => parse(input)
            .map(|value| {
                let mut out = String::new();
                tokens(&value, &mut out);
                out
            })
            .map_err(|error| Some(error.to_string())),
        other => panic!("unknown routine {other}"),
    }
}

#[test]
fn go_compat_routines_answer_as_go_does() {
    let text = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/routines.jsonl"))
        .expect("routines.jsonl");
    // Documents nest 10,000 deep (Go grows its stacks for them).
    let replay = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let mut failures = Vec::new();
            for line in text.lines() {
                let record: Value = serde_json::from_str(line).expect("routine line is JSON");
                let field = |key: &str| record.get(key).and_then(Value::as_str);
                let routine = field("routine").expect("routine");
                let input = field("b64").map_or_else(
                    || field("input").unwrap_or_default().as_bytes().to_vec(),
                    |b64| {
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .expect("base64 input")
                    },
                );
                let arg = record.get("arg").and_then(Value::as_u64).unwrap_or(0);
                let masq = go_compat_answer(routine, &input, u32::try_from(arg).expect("arg"));
                let agrees = match (&masq, field("out"), field("err")) {
                    (Ok(answer), Some(out), None) => answer == out,
                    (Err(None), None, Some(_)) => true,
                    (Err(Some(answer)), None, Some(err)) => answer == err,
                    _ => false,
                };
                if !agrees {
                    failures.push(format!("{line}\n  go-compat: {masq:?}"));
                }
            }
            failures
        });
    let failures = replay.expect("thread").join().expect("no panic");
    assert!(
        failures.is_empty(),
        "{} routine answers differ from Go's:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
