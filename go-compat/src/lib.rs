//! The pieces of Go that decide how upstream ip-masq-agent reads its config, reproduced with
//! Go's behaviour and messages: apimachinery's YAML-or-JSON conversion (go-yaml v2 and
//! sigs.k8s.io/yaml, [`yaml`]), `encoding/json` ([`json`]), `net.ParseCIDR` ([`net`]),
//! `time.ParseDuration` ([`time`]) and `strconv` ([`strconv`]).
//!
//! Operators compare masq's messages with what the Go agent logged, and scripts grep for them,
//! so each routine follows Go rather than Rust's conventions. Each exists once, here.

pub mod json;
pub mod net;
pub mod strconv;
pub mod time;
pub mod yaml;
