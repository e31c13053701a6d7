//! Rebuilds the eBPF object when bpf-linker changes: the linker is not a Cargo dependency, so
//! without this an upgraded linker would keep serving a stale object from the build cache.

use which::which;

fn main() {
    println!("cargo:rerun-if-env-changed=PATH");
    if let Ok(linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
