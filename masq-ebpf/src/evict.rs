//! Room in a full NAT table: evicting a flow that was never answered, as conntrack's
//! `early_drop` does, so that one pod flooding SYNs at a black hole (or a spoofed flood of
//! inbound UDP) cannot shut every pod's new connections out. An assured flow (see
//! `masq_common::nat::unassured`) is never evicted.
//!
//! conntrack looks for a victim in the new tuple's hash neighbourhood; a BPF program cannot
//! walk a hash map's buckets, so the programs keep the keys of the last flows created in a
//! ring ([`YOUNG_FLOWS`] of them), and a new flow that finds the table full evicts the oldest
//! of those still unassured. A flood fills the ring with its own flows, so it is the flood
//! that makes room. The ring is shared by all CPUs, so a flood on one CPU makes room for new
//! flows on any: concurrent writers may overwrite each other's slot or read a key half
//! written, which only costs a candidate, since a flow is evicted only after its entries say
//! it is unassured.

use aya_ebpf::btf_maps::Array;
use masq_common::{
    counters::Counter,
    nat::{NatEntry, NatKey, ORIGIN_INBOUND, proto, unassured},
};

use crate::{counters::count_in, family::Family};

/// How many of the last flows created are remembered as candidates for eviction.
pub(crate) const YOUNG_FLOWS: usize = 32;
/// How many candidates a full table's new flow looks at, oldest first.
const EVICTION_TRIES: u32 = 8;

/// The last flows created: their egress keys, in a ring whose next slot is the oldest.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct YoungFlows<A: Family> {
    next: u32,
    pad: u32,
    keys: [NatKey<A>; YOUNG_FLOWS],
}

/// The map type of [`YoungFlows`]: one ring for all CPUs.
pub(crate) type YoungFlowsMap<A> = Array<YoungFlows<A>, 1>;

/// Remembers the flow whose egress key is `key` as the newest.
#[inline(always)]
pub(crate) fn remember<A: Family>(key: &NatKey<A>) {
    let Some(ring) = A::young().get_ptr_mut(0) else {
        return;
    };
    // SAFETY: the pointer is the map value's; other CPUs write it too, which costs at most a
    // candidate (see the module's documentation).
    unsafe {
        let next = (*ring).next;
        if let Some(slot) = (*ring).keys.get_mut(next as usize % YOUNG_FLOWS) {
            *slot = *key;
        }
        (*ring).next = next.wrapping_add(1);
    }
}

/// Evicts the oldest unassured flow remembered, if any of the oldest
/// [`EVICTION_TRIES`] is; counts it by its class. Returns whether one was evicted.
#[inline(always)]
pub(crate) fn make_room<A: Family>() -> bool {
    let Some(ring) = A::young().get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: as in `remember`.
    let next = unsafe { (*ring).next };
    let mut tried = 0;
    while tried < EVICTION_TRIES {
        let index = next.wrapping_add(tried) as usize % YOUNG_FLOWS;
        tried += 1;
        // SAFETY: as in `remember`; the key is copied out before the table is touched.
        let Some(key) = (unsafe { (*ring).keys.get(index).copied() }) else {
            continue;
        };
        if let Some(counter) = evict_if_unassured(&key) {
            count_in::<A>(counter);
            return true;
        }
    }
    false
}

/// Removes the flow whose egress key is `key` if it is unassured, and says which class of
/// eviction that was.
#[inline(always)]
fn evict_if_unassured<A: Family>(key: &NatKey<A>) -> Option<Counter> {
    // SAFETY: the pointer comes from a successful lookup; the entry is copied at once.
    let egress: NatEntry<A> = unsafe { *A::nat().get_ptr(key)? };
    if egress.origin == ORIGIN_INBOUND {
        if !unassured(key.protocol, &egress, &egress) {
            return None;
        }
        let _ = A::nat().remove(key);
        return Some(Counter::NatEvictedInbound);
    }
    let peer = key.peer(&egress);
    // SAFETY: as above. A flow whose reply half is missing cannot be answered: it goes.
    if let Some(ingress) = A::nat().get_ptr(peer).map(|ingress| unsafe { *ingress })
        && !unassured(key.protocol, &egress, &ingress)
    {
        return None;
    }
    let _ = A::nat().remove(key);
    let _ = A::nat().remove(peer);
    Some(if key.protocol == proto::TCP {
        Counter::NatEvictedTcpUnanswered
    } else {
        Counter::NatEvictedUnassured
    })
}
