//! The manifests under deploy/ as `kubectl kustomize` renders them, as JSON values, so tests
//! check (and run) what `kubectl apply -k` would create rather than the sources.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Map, Value};
use yaml_rust2::{Yaml, YamlLoader};

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| Path::new(".."))
        .join("deploy")
}

/// The kustomizations a user applies: the default, each layout, the uninstall job, and the
/// example overlay.
pub const KUSTOMIZATIONS: &[&str] = &[
    "",
    "overlays/upstream",
    "overlays/aks",
    "overlays/migrate",
    "uninstall",
    "examples/overlay",
];

/// Every object of the kustomization at `deploy/<path>` ("" for deploy/ itself).
pub fn render(path: &str) -> Vec<Value> {
    let dir = deploy_dir().join(path);
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|error| {
            panic!("cannot run kubectl (cargo xtask test installs it): {error}")
        });
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    parse_documents(&String::from_utf8_lossy(&output.stdout))
}

/// Parses a multi-document YAML stream.
pub fn parse_documents(text: &str) -> Vec<Value> {
    YamlLoader::load_from_str(text)
        .unwrap_or_else(|error| panic!("rendered manifests are not YAML: {error}"))
        .iter()
        .map(to_json)
        .collect()
}

fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Null, Value::Number),
        Yaml::Integer(value) => Value::from(*value),
        Yaml::String(text) => Value::String(text.clone()),
        Yaml::Boolean(value) => Value::Bool(*value),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(entries) => Value::Object(
            entries
                .iter()
                .map(|(key, value)| {
                    let key = match key {
                        Yaml::String(text) => text.clone(),
                        Yaml::Integer(value) => value.to_string(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(value))
                })
                .collect::<Map<String, Value>>(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// The object of `kind` named `name`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|object| object["kind"] == kind && object["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among the rendered objects"))
}

/// A container of a workload's pod template, init containers included.
pub fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    let spec = &workload["spec"]["template"]["spec"];
    ["containers", "initContainers"]
        .iter()
        .filter_map(|list| spec[*list].as_array())
        .flatten()
        .find(|container| container["name"] == name)
        .unwrap_or_else(|| panic!("no container {name} in {}", workload["metadata"]["name"]))
}

/// The strings of a JSON array (empty when absent).
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
