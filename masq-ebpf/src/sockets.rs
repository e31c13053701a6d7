//! Whether one of the node's own sockets owns a tuple, asked of the kernel's socket tables.
//!
//! A packet to the node's address and a port in the SNAT range with no mapping is either for a
//! node socket (a listener, a connection the node opened from that port) or a reply to a flow
//! whose mapping is gone: the stack would answer the latter with a reset or a port unreachable
//! that tears down the remote end, so it is dropped instead.

use aya_ebpf::{
    bindings::BPF_F_CURRENT_NETNS,
    helpers::generated::{bpf_sk_lookup_udp, bpf_sk_release, bpf_skc_lookup_tcp},
    programs::TcContext,
};
use masq_common::nat::proto;

use crate::family::Family;

/// Which socket table a lookup asks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocketTable {
    /// TCP: listeners, established connections, handshakes and time-wait.
    Tcp,
    /// UDP: bound and connected sockets.
    Udp,
}

impl SocketTable {
    /// The table holding sockets of `protocol`, if the kernel can be asked about it.
    #[inline(always)]
    pub(crate) const fn of(protocol: u8) -> Option<Self> {
        match protocol {
            proto::TCP => Some(Self::Tcp),
            proto::UDP => Some(Self::Udp),
            _ => None,
        }
    }
}

/// Whether a socket of this network namespace in `table` would receive traffic from
/// `remote:remote_port` to `local:local_port` (a listener or a connected socket; for TCP also
/// connections in their handshake or time-wait). Callers that ask in a loop choose the table
/// once, outside it, so the verifier does not walk a branch per protocol on every pass.
#[inline(always)]
pub(crate) fn owned_in<A: Family>(
    ctx: &TcContext,
    table: SocketTable,
    remote: A,
    remote_port: u16,
    local: A,
    local_port: u16,
) -> bool {
    let (mut tuple, size) = A::socket_tuple(remote, remote_port, local, local_port);
    // A negative 32-bit namespace id means the namespace of the packet's device.
    let netns = BPF_F_CURRENT_NETNS as u64;
    let context = ctx.skb.skb.cast();
    // SAFETY: the context is the program's own; `tuple` lives across the call and `size` is
    // the size of the family's member, which the helper reads.
    let socket: *mut core::ffi::c_void = unsafe {
        match table {
            SocketTable::Tcp => bpf_skc_lookup_tcp(context, &mut tuple, size, netns, 0).cast(),
            SocketTable::Udp => bpf_sk_lookup_udp(context, &mut tuple, size, netns, 0).cast(),
        }
    };
    if socket.is_null() {
        return false;
    }
    // SAFETY: a non-null socket from a lookup helper holds a reference that must be released.
    unsafe { bpf_sk_release(socket) };
    true
}
