//! Types and pure functions shared by the masq eBPF datapath and its userspace agent.
//!
//! Everything that crosses the kernel/userspace boundary lives here: the `#[repr(C)]` layouts of
//! map keys and values, the names the maps are pinned under, the counter indices, and the small
//! pieces of arithmetic (port selection, incremental checksums, the flow state model) that both sides
//! must agree on. The crate is `no_std` so the eBPF programs can use it; with the `user` feature
//! it also implements `aya::Pod` for the map types.

#![no_std]

pub mod checksum;
pub mod counters;
pub mod flow;
pub mod kernel;
pub mod layout;
pub mod nat;
pub mod ports;
pub mod settings;

/// Implements `aya::Pod` for plain-old-data map types when building for userspace.
macro_rules! impl_pod {
    ($($ty:ty),+ $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is `#[repr(C)]`, `Copy`, built only from integers and byte arrays,
            // and has explicit padding fields, so every bit pattern is a valid value.
            unsafe impl aya::Pod for $ty {}
        )+
    };
}
pub(crate) use impl_pod;
