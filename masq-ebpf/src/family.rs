//! What the NAT core needs to know of an address family: its tables, its non-masquerade trie and
//! how to ask the kernel about its sockets. Implemented for the address type itself, so the type
//! of a key or an address picks the family, and the NAT logic exists once for both.

use aya_ebpf::{
    bindings::{
        bpf_sock_tuple, bpf_sock_tuple__bindgen_ty_1, bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1,
    },
    btf_maps::{HashMap, PerCpuArray, lpm_trie::Key},
};
use masq_common::{
    layout::NAT_V4_DEFAULT_MAX_ENTRIES,
    nat::{Address, AllocRequest, NatEntry, NatKey},
};

use crate::maps::{ALLOC_REQUEST, NAT_V4, NOMASQ_V4};

/// The NAT tables' capacity as declared; the agent sets the real one at load time.
pub(crate) const NAT_DECLARED_ENTRIES: usize = NAT_V4_DEFAULT_MAX_ENTRIES as usize;

/// An address family the datapath translates.
pub(crate) trait Family: Address + 'static {
    /// The family's NAT table.
    fn nat() -> &'static HashMap<NatKey<Self>, NatEntry<Self>, NAT_DECLARED_ENTRIES>;
    /// The per-CPU slot in which the egress program hands a new flow to the allocator.
    fn alloc_request() -> &'static PerCpuArray<AllocRequest<Self>, 1>;
    /// The `NOMASQ_KIND_*` of the non-masquerade entry that holds `addr`, if one does.
    fn exempt(addr: Self) -> Option<u32>;
    /// The socket lookup tuple `remote:remote_port -> local:local_port`, and how many of its
    /// bytes the lookup helpers read.
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32);
}

impl Family for [u8; 4] {
    #[inline(always)]
    fn nat() -> &'static HashMap<NatKey<Self>, NatEntry<Self>, NAT_DECLARED_ENTRIES> {
        &NAT_V4
    }

    #[inline(always)]
    fn alloc_request() -> &'static PerCpuArray<AllocRequest<Self>, 1> {
        &ALLOC_REQUEST
    }

    #[inline(always)]
    fn exempt(addr: Self) -> Option<u32> {
        NOMASQ_V4.get(&Key::new(32, addr)).copied()
    }

    #[inline(always)]
    fn socket_tuple(
        remote: Self,
        remote_port: u16,
        local: Self,
        local_port: u16,
    ) -> (bpf_sock_tuple, u32) {
        let tuple = bpf_sock_tuple {
            __bindgen_anon_1: bpf_sock_tuple__bindgen_ty_1 {
                ipv4: bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1 {
                    saddr: u32::from_ne_bytes(remote),
                    daddr: u32::from_ne_bytes(local),
                    sport: remote_port.to_be(),
                    dport: local_port.to_be(),
                },
            },
        };
        (
            tuple,
            size_of::<bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>() as u32,
        )
    }
}
