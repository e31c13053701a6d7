//! Decoding a JSON document into the config structs with Go `encoding/json`'s rules.
//!
//! The rules that matter to users: keys match case-insensitively (an exact match wins), unknown
//! keys are ignored, `null` leaves ints and bools alone but empties a list, and `resyncInterval`
//! goes through `metav1.Duration`, which parses even `null` (and fails on it). When values
//! have the wrong type Go keeps decoding and reports the first type error, unless a
//! `resyncInterval` error stops it first.
//!
//! masq's own lists (`masqueradeCIDRs`, `nonMasqueradeSrcCIDRs`) decode like
//! `nonMasqueradeCIDRs`, as they would if upstream's struct had them.

use go_compat::json::{JsonValue, find_field};

use super::{
    GoDuration, MASQUERADE_CIDRS_KEY, MasqConfig, NON_MASQUERADE_SRC_CIDRS_KEY, cidr::CidrText,
};

/// A value of the wrong type or an unparsable duration, with Go's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// `json.UnmarshalTypeError` on a field.
    #[error(
        "json: cannot unmarshal {value} into Go struct field MasqConfig.{field} of type {go_type}"
    )]
    FieldType {
        /// What was found: `string`, `number 1.5`, `bool`, `array`, `object`.
        value: String,
        /// The field's JSON name.
        field: &'static str,
        /// The Go type expected.
        go_type: &'static str,
    },
    /// The document is not an object.
    #[error("json: cannot unmarshal {0} into Go value of type main.MasqConfig")]
    DocumentType(&'static str),
    /// `resyncInterval` is not a Go duration.
    #[error("{0}")]
    Duration(String),
}

const NON_MASQUERADE_CIDRS: &str = "nonMasqueradeCIDRs";
const CIDR_LIMIT: &str = "cidrLimit";
const MASQ_LINK_LOCAL: &str = "masqLinkLocal";
const MASQ_LINK_LOCAL_IPV6: &str = "masqLinkLocalIPv6";
const RESYNC_INTERVAL: &str = "resyncInterval";

/// The JSON names of upstream's fields, and of the fewer the Azure agent's struct has, each
/// followed by masq's own two lists (which both agents ignore as unknown keys).
const UPSTREAM_FIELDS: &[&str] = &[
    NON_MASQUERADE_CIDRS,
    CIDR_LIMIT,
    MASQ_LINK_LOCAL,
    MASQ_LINK_LOCAL_IPV6,
    RESYNC_INTERVAL,
    MASQUERADE_CIDRS_KEY,
    NON_MASQUERADE_SRC_CIDRS_KEY,
];
const AZURE_FIELDS: &[&str] = &[
    NON_MASQUERADE_CIDRS,
    MASQ_LINK_LOCAL,
    MASQ_LINK_LOCAL_IPV6,
    MASQUERADE_CIDRS_KEY,
    NON_MASQUERADE_SRC_CIDRS_KEY,
];

/// Go's "first type error wins": the first error saved is the one reported.
type Errors = Option<DecodeError>;

fn save(errors: &mut Errors, value: &JsonValue, field: &'static str, go_type: &'static str) {
    errors.get_or_insert_with(|| DecodeError::FieldType {
        value: match value {
            JsonValue::Number(literal) if go_type == "int" => format!("number {literal}"),
            other => other.kind().to_owned(),
        },
        field,
        go_type,
    });
}

/// Decodes an upstream config file over `base` (upstream's defaults): keys that are absent keep
/// their value from `base`. The document is consumed: its strings become the config's.
pub fn decode_upstream(document: JsonValue, base: MasqConfig) -> Result<MasqConfig, DecodeError> {
    decode_fields(document, UPSTREAM_FIELDS, base)
}

/// Whether an upstream config document sets `nonMasqueradeCIDRs` (under any spelling Go
/// matches), rather than leaving the defaults in place.
pub fn sets_non_masquerade_cidrs(document: &JsonValue) -> bool {
    let JsonValue::Object(members) = document else {
        return false;
    };
    members.iter().any(|(key, _)| {
        find_field(UPSTREAM_FIELDS, key)
            .and_then(|index| UPSTREAM_FIELDS.get(index))
            .is_some_and(|&field| field == NON_MASQUERADE_CIDRS)
    })
}

/// One file of the Azure agent's directory, decoded into a zero-valued struct.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AzureFileConfig {
    /// `nonMasqueradeCIDRs`; empty when absent or null.
    pub non_masquerade_cidrs: Vec<CidrText>,
    /// `masqLinkLocal`.
    pub masq_link_local: bool,
    /// `masqLinkLocalIPv6`.
    pub masq_link_local_ipv6: bool,
    /// `masqueradeCIDRs`; empty when absent or null.
    pub masquerade_cidrs: Vec<CidrText>,
    /// `nonMasqueradeSrcCIDRs`; empty when absent or null.
    pub non_masquerade_src_cidrs: Vec<CidrText>,
}

/// Decodes one Azure config file. `cidrLimit` and `resyncInterval` are not fields there and are
/// ignored like any unknown key.
pub fn decode_azure(document: JsonValue) -> Result<AzureFileConfig, DecodeError> {
    let zero = MasqConfig {
        non_masquerade_cidrs: None,
        cidr_limit: 0,
        masq_link_local: false,
        masq_link_local_ipv6: false,
        resync_interval: GoDuration::from_secs(0),
        masquerade_cidrs: None,
        non_masquerade_src_cidrs: None,
    };
    let config = decode_fields(document, AZURE_FIELDS, zero)?;
    Ok(AzureFileConfig {
        non_masquerade_cidrs: config.non_masquerade_cidrs.unwrap_or_default(),
        masq_link_local: config.masq_link_local,
        masq_link_local_ipv6: config.masq_link_local_ipv6,
        masquerade_cidrs: config.masquerade_cidrs.unwrap_or_default(),
        non_masquerade_src_cidrs: config.non_masquerade_src_cidrs.unwrap_or_default(),
    })
}

/// `json.Unmarshal` of `document` into `config`, for the struct that has `fields`.
fn decode_fields(
    document: JsonValue,
    fields: &[&'static str],
    mut config: MasqConfig,
) -> Result<MasqConfig, DecodeError> {
    let members = match document {
        JsonValue::Null => return Ok(config),
        JsonValue::Object(members) => members,
        other => return Err(DecodeError::DocumentType(other.kind())),
    };
    let mut errors = None;
    for (key, value) in members {
        let Some(&field) = find_field(fields, &key).and_then(|index| fields.get(index)) else {
            continue;
        };
        match field {
            NON_MASQUERADE_CIDRS => {
                decode_cidrs(value, field, &mut config.non_masquerade_cidrs, &mut errors);
            }
            MASQUERADE_CIDRS_KEY => {
                decode_cidrs(value, field, &mut config.masquerade_cidrs, &mut errors);
            }
            NON_MASQUERADE_SRC_CIDRS_KEY => {
                decode_cidrs(
                    value,
                    field,
                    &mut config.non_masquerade_src_cidrs,
                    &mut errors,
                );
            }
            CIDR_LIMIT => decode_int(&value, field, &mut config.cidr_limit, &mut errors),
            MASQ_LINK_LOCAL => decode_bool(&value, field, &mut config.masq_link_local, &mut errors),
            MASQ_LINK_LOCAL_IPV6 => {
                decode_bool(&value, field, &mut config.masq_link_local_ipv6, &mut errors);
            }
            RESYNC_INTERVAL => config.resync_interval = decode_duration(&value)?,
            _ => {}
        }
    }
    errors.map_or(Ok(config), Err)
}

/// A `[]string` field. `null` makes it nil (`None`), an array a list, empty or not. Go decodes
/// an array into the existing slice: a `null` element keeps the value already at that index
/// (upstream's defaults!) or is empty past its end.
fn decode_cidrs(
    value: JsonValue,
    field: &'static str,
    target: &mut Option<Vec<CidrText>>,
    errors: &mut Errors,
) {
    match value {
        JsonValue::Null => *target = None,
        JsonValue::Array(items) => {
            let previous = target.take().unwrap_or_default();
            let mut decoded_items = Vec::with_capacity(items.len());
            for (index, item) in items.into_iter().enumerate() {
                let decoded = match item {
                    JsonValue::String(text) => text.into(),
                    JsonValue::Null => previous.get(index).cloned().unwrap_or_default(),
                    other => {
                        save(errors, &other, field, "string");
                        previous.get(index).cloned().unwrap_or_default()
                    }
                };
                decoded_items.push(decoded);
            }
            *target = Some(decoded_items);
        }
        other => save(errors, &other, field, "[]string"),
    }
}

/// An `int` field (64-bit): integer literals only; `null` keeps the current value.
fn decode_int(value: &JsonValue, field: &'static str, target: &mut i64, errors: &mut Errors) {
    match value {
        JsonValue::Null => {}
        JsonValue::Number(literal) => match literal.parse::<i64>() {
            Ok(number) => *target = number,
            Err(_) => save(errors, value, field, "int"),
        },
        other => save(errors, other, field, "int"),
    }
}

/// A `bool` field; `null` keeps the current value.
fn decode_bool(value: &JsonValue, field: &'static str, target: &mut bool, errors: &mut Errors) {
    match value {
        JsonValue::Null => {}
        JsonValue::Bool(flag) => *target = *flag,
        other => save(errors, other, field, "bool"),
    }
}

/// `metav1.Duration.UnmarshalJSON`: the value is unmarshalled into a string (null gives the
/// empty string) and parsed with `time.ParseDuration`. Its errors end decoding at once.
fn decode_duration(value: &JsonValue) -> Result<GoDuration, DecodeError> {
    let text = match value {
        JsonValue::String(text) => text.as_str(),
        JsonValue::Null => "",
        other => {
            return Err(DecodeError::FieldType {
                value: other.kind().to_owned(),
                field: RESYNC_INTERVAL,
                go_type: "string",
            });
        }
    };
    GoDuration::parse(text).map_err(DecodeError::Duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Whole documents, read from a file, are checked against Go in the oracle corpus
    // (tests/go-oracle/gen.py, FORMER_TESTS); Azure's reading has no oracle.

    #[test]
    fn azure_reads_its_keys_only_and_null_list_elements_as_empty() {
        let (null, string) = (JsonValue::Null, |s: &str| JsonValue::String(s.to_owned()));
        let cidrs = JsonValue::Array(vec![null.clone(), string("1.0.0.0/8"), null.clone(), null]);
        let document = JsonValue::Object(vec![
            ("nonMasqueradeCIDRs".to_owned(), cidrs),
            ("cidrLimit".to_owned(), string("not even a number")),
            (
                "resyncInterval".to_owned(),
                JsonValue::Number("5".to_owned()),
            ),
            ("masqLinkLocal".to_owned(), JsonValue::Bool(true)),
        ]);
        assert_eq!(
            decode_azure(document),
            Ok(AzureFileConfig {
                non_masquerade_cidrs: ["", "1.0.0.0/8", "", ""].map(CidrText::from).to_vec(),
                masq_link_local: true,
                masq_link_local_ipv6: false,
                masquerade_cidrs: Vec::new(),
                non_masquerade_src_cidrs: Vec::new(),
            })
        );
    }
}
