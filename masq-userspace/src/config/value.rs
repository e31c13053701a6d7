//! The document model a config file is parsed into before it is decoded.
//!
//! Upstream turns YAML into JSON text and hands that to Go's `encoding/json`. This type is that
//! JSON, kept faithful to what Go's decoder sees: object members in document order (duplicates
//! included, later ones win) and numbers as their literal text (Go distinguishes `64` from
//! `64.0` when decoding into an int).

/// A JSON value as Go's `encoding/json` would read it.
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
