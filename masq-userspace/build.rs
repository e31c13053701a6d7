//! Compiles `masq-ebpf` for the bpf target (nightly toolchain, bpf-linker, BTF) so the agent can
//! embed the object. `cargo xtask build-ebpf` installs what this needs.

use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // aya-build watches the eBPF crate; the shared types live next door.
    println!("cargo:rerun-if-changed=../masq-common/src");
    println!("cargo:rerun-if-changed=../masq-common/Cargo.toml");
    let package = Package {
        name: "masq-ebpf",
        root_dir: "../masq-ebpf",
        ..Default::default()
    };
    aya_build::build_ebpf([package], Toolchain::Nightly)
        .map_err(|error| anyhow!("{error:#}"))
        .context(
            "building the eBPF datapath failed; run `cargo xtask build-ebpf`, which installs \
             the nightly rust-src component and a bpf-linker matching its LLVM",
        )
}
