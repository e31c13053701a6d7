//! The datapath's benchmark variants: design alternatives built as cargo features of
//! `masq-ebpf`, one object each, which the benchmark loads next to the production object to
//! measure what each production choice is worth. None is for production.
//!
//! The one list both sides read: `cargo xtask build-ebpf-variants` builds an object per name
//! (`<name>.o`), and the benchmark looks for exactly those files.

/// The `masq-ebpf` features that select a variant, each built alone. A name here must be a
/// feature in `masq-ebpf/Cargo.toml`, where each is described (xtask checks both lists agree).
pub const VARIANTS: &[&str] = &[
    "variant-shared-counters",
    "variant-touch-every-packet",
    "variant-lru-table",
    "variant-lru-table-no-common",
    "variant-one-entry-per-flow",
];

/// The object built by the same recipe with none of these features: the production datapath,
/// which the benchmark times beside the embedded object as an A/A control (two identical
/// datapaths differ only by the noise of the measurement).
pub const CONTROL: &str = "production";
