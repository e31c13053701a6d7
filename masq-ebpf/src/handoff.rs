//! Handing a packet on: to the program the fast path leaves it to, and, at the end of its tail
//! calls, to the program that rewrites it with the mapping settled for it (which reads it back
//! with [`settled`]).
//!
//! The verifier checks a program from its entry, once per distinct state it can reach a point
//! with, and every program's stack is 512 bytes. The egress and ingress programs, which every
//! packet runs, keep to the fast path: parse, look the mapping up, rewrite. What is rare there
//! (a new flow's port search, a flow event, a revival, a new inbound flow) runs in programs of
//! their own, which these tail-call; the packet's headers are unchanged in between, and what
//! they pass along lies in the per-CPU hand-off (`Handoff`).

use aya_ebpf::programs::TcContext;
use masq_common::{
    counters::Counter,
    flow::TcpSegment,
    nat::{NO_INDEX_SLOT, NatKey},
};

use crate::{family::Family, maps::PROGS, nat::Mapping, table::copy_key};

/// What a program hands on with a packet (see `FlowRequest`).
pub(crate) struct Request<'a, A> {
    /// The packet's tuple.
    pub(crate) key: &'a NatKey<A>,
    /// The uplink's address.
    pub(crate) node_addr: A,
    /// `ORIGIN_*` of a new flow.
    pub(crate) origin: u8,
    /// `EVENT_*`.
    pub(crate) event: u8,
    /// What the packet's translation counts under.
    pub(crate) counter: Counter,
    /// The packet's TCP segment.
    pub(crate) segment: &'a TcpSegment,
}

/// Writes `request` into the hand-off and tail-calls the program in `MAP_PROGS` slot
/// `program`. Does not return when the tail call succeeds; returns if the slot or the
/// hand-off is missing (the agent has not finished loading the datapath).
///
/// Only the request part of the hand-off is written (and the search reset): the rest is the
/// programs', and writing a whole zeroed hand-off costs a call to a byte-by-byte memset.
#[inline(always)]
pub(crate) fn hand_over<A: Family>(ctx: &TcContext, request: &Request<'_, A>, program: u32) {
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU array slots are private to this CPU while the program runs, and the tail
    // call below runs the next program on this CPU before anything else can.
    unsafe {
        copy_key(&raw mut (*slot).request.key, request.key);
        macro_rules! set {
            ($($name:ident).+, $value:expr) => {
                core::ptr::write_volatile(&raw mut (*slot).$($name).+, $value)
            };
        }
        set!(request.node_addr, request.node_addr);
        set!(request.origin, request.origin);
        set!(request.event, request.event);
        set!(request.counter, request.counter as u16);
        set!(request.segment.seq, request.segment.seq);
        set!(request.segment.ack, request.segment.ack);
        set!(request.segment.len, request.segment.len);
        set!(request.segment.window, request.segment.window);
        set!(request.segment.flags, request.segment.flags);
        set!(request.segment.scale, request.segment.scale);
        // A new request: the allocator begins a search rather than resuming one.
        set!(search.round, 0);
        set!(index_slot, NO_INDEX_SLOT);
        set!(took_port, 0);
        PROGS.tail_call(ctx, program);
    }
}

/// Puts `mapping` into the hand-off as the translation to apply, with `counter`, and
/// tail-calls the rewrite for the packet's direction. Returns if the tail call failed.
#[inline(always)]
pub(crate) fn rewrite_with<A: Family>(
    ctx: &TcContext,
    mapping: &Mapping<A>,
    counter: Counter,
    outbound: bool,
) {
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `hand_over`.
    unsafe {
        core::ptr::write_volatile(&raw mut (*slot).mapping.addr, mapping.addr);
        core::ptr::write_volatile(&raw mut (*slot).mapping.port, mapping.port);
        core::ptr::write_volatile(&raw mut (*slot).mapping.origin, mapping.origin);
        core::ptr::write_volatile(&raw mut (*slot).request.counter, counter as u16);
        PROGS.tail_call(
            ctx,
            if outbound {
                A::SLOT_SOURCE_NAT
            } else {
                A::SLOT_REVERSE_NAT
            },
        );
    }
}

/// The key and the translation in the hand-off, and the counter to count under: what the
/// rewrite programs (`egress::source_nat`, `ingress::reverse_nat`) apply.
#[inline(always)]
pub(crate) fn settled<A: Family>() -> Option<(NatKey<A>, Mapping<A>, u16)> {
    let slot = A::handoff().get_ptr(0)?;
    let mut key = core::mem::MaybeUninit::<NatKey<A>>::uninit();
    // SAFETY: only this CPU writes its slot; the key and the translation are copied out field
    // by field, not the whole hand-off (the IPv6 programs' stack is small). `copy_key` writes
    // every field of `key`.
    unsafe {
        copy_key(key.as_mut_ptr(), &raw const (*slot).request.key);
        Some((
            key.assume_init(),
            Mapping {
                addr: A::load(&raw const (*slot).mapping.addr),
                port: core::ptr::read_volatile(&raw const (*slot).mapping.port),
                origin: core::ptr::read_volatile(&raw const (*slot).mapping.origin),
                quiet: 1,
            },
            core::ptr::read_volatile(&raw const (*slot).request.counter),
        ))
    }
}
