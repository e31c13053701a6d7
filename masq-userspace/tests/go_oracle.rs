//! Replays the Go oracle corpus (`tests/go-oracle/corpus.jsonl`) through masq's config loader:
//! every document must be accepted with the same config, or rejected with the same message, as
//! upstream's Go pipeline does it, unless `tests/go-oracle/known-differences.txt` lists it with
//! a reason. See `tests/go-oracle/regenerate.sh` for how it is made (go-compat's own
//! `tests/go_routines.rs` replays Go's answers of the single routines).
//!
//! Documents that set masq's own keys (`masqueradeCIDRs`, `nonMasqueradeSrcCIDRs`, under any
//! spelling `encoding/json` matches) are held to more than the list: upstream's struct has no
//! such fields and ignores them, so masq must read the document with those keys removed exactly
//! as Go reads the whole one, and where both accept the whole document, the upstream part of
//! masq's config (the list, `cidrLimit`, the flags, the interval, the log line without masq's
//! keys) must be Go's. Only honouring its own keys may set masq apart there.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::{collections::BTreeMap, fmt::Write as _, fs, path::Path};

use base64::Engine as _;
use go_compat::json::{JsonValue, find_field, quote_string};
use masq::config::{
    GoDuration, MASQUERADE_CIDRS_KEY, MasqConfig, NON_MASQUERADE_SRC_CIDRS_KEY,
    source::{ConfigError, ConfigSource, EffectiveConfig, ReadOptions, load},
};
use serde_json::{Value, json};

/// One document and what Go made of it.
struct Case {
    id: String,
    doc: Vec<u8>,
    ipv6: bool,
    reserved: bool,
    /// What sigs.k8s.io/yaml's YAMLToJSON produced, when the document went that way.
    yaml_json: Option<String>,
    /// Go's outcome: the accepted config (normalized) or the error text.
    go: Result<Value, String>,
}

/// How masq may differ from Go on a listed document.
#[derive(Debug, PartialEq, Eq)]
enum Allowed {
    /// Both reject it, with different messages.
    Wording,
    /// masq decides differently (a gap documented with its reason).
    Decision,
    /// The outcome is Go's, the JSON masq converts the YAML to is not.
    Conversion,
}

fn corpus_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/go-oracle"))
}

/// Standard base64 with padding, as the oracle writes the documents.
fn base64_decode(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64 document")
}

fn read_corpus() -> Vec<Case> {
    let text = fs::read_to_string(corpus_dir().join("corpus.jsonl")).expect("corpus.jsonl");
    text.lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("corpus line is JSON");
            let string = |key: &str| record.get(key).and_then(Value::as_str).map(str::to_owned);
            let go = match (record.get("ok"), string("err")) {
                (Some(accepted), None) => Ok(accepted.clone()),
                (None, Some(message)) => Err(message),
                _ => panic!("corpus line without one outcome: {line}"),
            };
            Case {
                id: string("id").expect("id"),
                doc: base64_decode(&string("doc").expect("doc")),
                ipv6: record.get("ipv6") == Some(&Value::Bool(true)),
                reserved: record.get("reserved") == Some(&Value::Bool(true)),
                yaml_json: string("yaml_json"),
                go,
            }
        })
        .collect()
}

/// `known-differences.txt`: `ID KIND REASON` lines, `#` comments.
fn read_allowed() -> BTreeMap<String, (Allowed, String)> {
    let text = fs::read_to_string(corpus_dir().join("known-differences.txt"))
        .expect("known-differences.txt");
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with('#'))
        .map(|line| {
            let mut fields = line.splitn(3, ' ');
            let id = fields.next().unwrap_or_default().to_owned();
            let kind = match fields.next() {
                Some("wording") => Allowed::Wording,
                Some("decision") => Allowed::Decision,
                Some("conversion") => Allowed::Conversion,
                other => panic!("unknown kind {other:?} in {line}"),
            };
            let reason = fields.next().unwrap_or_default().trim().to_owned();
            assert!(
                !reason.is_empty(),
                "an allowed difference needs a reason: {line}"
            );
            (id, (kind, reason))
        })
        .collect()
}

/// The config masq will apply, in the oracle's normalized form: the CIDRs in rule order, `null`
/// where Go's list is nil (upstream logs it so).
fn normalized(config: &EffectiveConfig) -> Value {
    let cidrs: Vec<&str> = config.cidrs.iter().map(|c| c.cidr.as_str()).collect();
    json!({
        "cidrs": config.raw.non_masquerade_cidrs.as_ref().map(|_| cidrs),
        "cidrLimit": config.raw.cidr_limit,
        "masqLinkLocal": config.raw.masq_link_local,
        "masqLinkLocalIPv6": config.raw.masq_link_local_ipv6,
        "resyncInterval": config.raw.resync_interval.to_string(),
        "logged": config.raw.to_go_json(),
    })
}

/// [`normalized`] of what upstream would see of `config`: the config without masq's own lists,
/// so the log line is upstream's. Everything else in the normalized form is upstream's already.
fn upstream_part(config: &EffectiveConfig) -> Value {
    let mut normalized = normalized(config);
    let upstream = MasqConfig {
        masquerade_cidrs: None,
        non_masquerade_src_cidrs: None,
        ..config.raw.clone()
    };
    normalized["logged"] = Value::String(upstream.to_go_json());
    normalized
}

/// The fields masq's decoder matches keys to: upstream's, then masq's own two.
const FIELDS: [&str; 7] = [
    "nonMasqueradeCIDRs",
    "cidrLimit",
    "masqLinkLocal",
    "masqLinkLocalIPv6",
    "resyncInterval",
    MASQUERADE_CIDRS_KEY,
    NON_MASQUERADE_SRC_CIDRS_KEY,
];

/// For a document that sets masq's own keys (under any spelling `encoding/json` matches to
/// them), the JSON text of it without them, members otherwise in the order decoding sees them:
/// the document upstream's struct, which lacks those fields, effectively decodes.
fn without_own_keys(document: &JsonValue) -> Option<String> {
    let JsonValue::Object(members) = document else {
        return None;
    };
    let own = |key: &str| {
        find_field(&FIELDS, key)
            .and_then(|index| FIELDS.get(index))
            .is_some_and(|field| {
                [MASQUERADE_CIDRS_KEY, NON_MASQUERADE_SRC_CIDRS_KEY].contains(field)
            })
    };
    if !members.iter().any(|(key, _)| own(key)) {
        return None;
    }
    let kept = members
        .iter()
        .filter(|(key, _)| !own(key))
        .cloned()
        .collect();
    let mut text = String::new();
    write_json(&JsonValue::Object(kept), false, &mut text);
    Some(text)
}

/// Runs `work` with room for documents nested 10,000 deep (Go grows its stacks for them).
fn on_big_stack<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    let thread = std::thread::Builder::new().stack_size(256 << 20);
    thread
        .spawn(work)
        .expect("thread")
        .join()
        .expect("no panic")
}

#[test]
fn masq_reads_every_corpus_document_as_go_does() {
    on_big_stack(read_every_corpus_document_as_go_does);
}

fn read_every_corpus_document_as_go_does() {
    let cases = read_corpus();
    let allowed = read_allowed();
    assert!(cases.len() > 1000, "the corpus is suspiciously small");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ip-masq-agent");
    let mut report = String::new();
    let mut mismatches = 0;
    let mut own_key_cases = 0;
    let mut stale = Vec::new();
    // For maintaining the allow-list: every difference, as JSON lines, to this file.
    let mut dump = std::env::var_os("MASQ_ORACLE_DIFFS").map(|_| String::new());
    for case in &cases {
        fs::write(&path, &case.doc).expect("write document");
        let options = ReadOptions {
            nomasq_all_reserved_ranges: case.reserved,
            enable_ipv6: case.ipv6,
            resync_interval: GoDuration::from_secs(60),
        };
        // The JSON document sigs.k8s.io/yaml makes of a YAML file, as json.Marshal writes it
        // (where masq's conversion fails, the outcomes differ unless Go failed alike).
        let document = go_compat::yaml::to_json(&case.doc).ok();
        let mut converted = String::new();
        if let (Some(_), Some(value)) = (&case.yaml_json, &document) {
            write_json(value, true, &mut converted);
        }
        let conversion_differs = !converted.is_empty() && case.yaml_json != Some(converted);
        let masq = load(&ConfigSource::File(path.clone()), &options);
        // Upstream ignores masq's own keys: without them, masq must read the document as Go
        // read it whole, and the upstream part of what masq accepts must be Go's.
        let mut own_keys_problem = None;
        if let Some(stripped) = document.as_ref().and_then(without_own_keys) {
            own_key_cases += 1;
            if let (Ok(config), Ok(go)) = (&masq, &case.go)
                && upstream_part(config) != *go
            {
                own_keys_problem = Some(format!(
                    "the upstream part of masq's config is not Go's: {:?}",
                    upstream_part(config)
                ));
            }
            fs::write(&path, &stripped).expect("write document");
            let without = load(&ConfigSource::File(path.clone()), &options)
                .map(|config| normalized(&config))
                .map_err(|e| e.to_string());
            if without != case.go {
                own_keys_problem = Some(format!(
                    "without masq's own keys ({stripped}) masq reads {without:?}"
                ));
            }
        }
        // docs/configuration.md, "Differences from ip-masq-agent": a file holding no document
        // is rejected rather than meaning the defaults.
        if case.yaml_json.as_deref() == Some("null")
            && matches!(masq, Err(ConfigError::Empty { .. }))
        {
            continue;
        }
        let masq = masq
            .map(|config| normalized(&config))
            .map_err(|e| e.to_string());
        let differs = masq != case.go;
        match (allowed.get(&case.id), differs, conversion_differs) {
            _ if own_keys_problem.is_some() => {
                mismatches += 1;
                let _ = writeln!(
                    report,
                    "{} (ipv6 {}, reserved {}): {:?}\n  go:   {:?}\n  {}",
                    case.id,
                    case.ipv6,
                    case.reserved,
                    String::from_utf8_lossy(&case.doc),
                    case.go,
                    own_keys_problem.unwrap_or_default()
                );
            }
            (None, false, false) => {}
            (Some((Allowed::Wording, _)), true, false) if masq.is_err() && case.go.is_err() => {}
            (Some((Allowed::Decision, _)), true, _)
            | (Some((Allowed::Conversion, _)), false, true) => {}
            (Some(_), false, false) => stale.push(case.id.clone()),
            (listed, ..) => {
                if let Some(dump) = dump.as_mut() {
                    let kind = match (differs, masq.is_err() && case.go.is_err()) {
                        (false, _) => "conversion",
                        (true, true) => "wording",
                        (true, false) => "decision",
                    };
                    let line = json!({"id": case.id, "kind": kind, "doc": String::from_utf8_lossy(&case.doc),
                        "go": format!("{:?}", case.go), "masq": format!("{masq:?}")});
                    let _ = writeln!(dump, "{line}");
                }
                mismatches += 1;
                if mismatches <= 40 {
                    let _ = writeln!(
                        report,
                        "{} (ipv6 {}, reserved {}{}): {:?}\n  go:   {:?}\n  masq: {:?}{}",
                        case.id,
                        case.ipv6,
                        case.reserved,
                        listed.map_or(String::new(), |(kind, _)| format!(", listed as {kind:?}")),
                        String::from_utf8_lossy(&case.doc)
                            .chars()
                            .take(160)
                            .collect::<String>(),
                        case.go,
                        masq,
                        if conversion_differs {
                            format!("\n  YAMLToJSON differs from Go's {:?}", case.yaml_json)
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
    }
    if let (Some(dump), Some(path)) = (dump, std::env::var_os("MASQ_ORACLE_DIFFS")) {
        fs::write(path, dump).expect("write the differences");
    }
    assert!(
        own_key_cases >= 50,
        "only {own_key_cases} corpus documents set masq's own keys (gen.py, MASQ_KEYS)"
    );
    let unknown: Vec<&String> = allowed
        .keys()
        .filter(|id| !cases.iter().any(|case| &case.id == *id))
        .collect();
    assert!(
        mismatches == 0 && stale.is_empty() && unknown.is_empty(),
        "{mismatches} of {} corpus documents read differently from Go:\n{report}\n\
         listed in known-differences.txt but now read as Go does (remove them): {stale:?}\n\
         listed but not in the corpus: {unknown:?}",
        cases.len()
    );
}

/// A decoded JSON value as compact JSON text; with `sort`, object keys sorted as `json.Marshal`
/// writes a map, otherwise members (duplicates included) in their order.
fn write_json(value: &JsonValue, sort: bool, out: &mut String) {
    let mut list = |(open, close), items: Vec<(Option<&String>, &JsonValue)>| {
        out.push(open);
        for (at, (key, item)) in items.into_iter().enumerate() {
            out.push_str(if at == 0 { "" } else { "," });
            if let Some(key) = key {
                let _ = write!(out, "{}:", quote_string(key));
            }
            write_json(item, sort, out);
        }
        out.push(close);
    };
    match value {
        JsonValue::Array(items) => list(('[', ']'), items.iter().map(|i| (None, i)).collect()),
        JsonValue::Object(members) => {
            let mut members: Vec<_> = members.iter().map(|(k, v)| (Some(k), v)).collect();
            if sort {
                members.sort_by_key(|(key, _)| *key);
            }
            list(('{', '}'), members);
        }
        JsonValue::Null => out.push_str("null"),
        JsonValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        JsonValue::Number(n) => out.push_str(n),
        JsonValue::String(s) => out.push_str(&quote_string(s)),
    }
}
