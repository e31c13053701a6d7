//! The port allocator: a classifier the egress program tail-calls for a packet that needs a
//! mapping. A new flow gets a port it searches, both halves created, and its packet handed to
//! `masq_source_nat` to be rewritten. A TCP segment of a flow the agent buried (from either
//! end, `EVENT_REVIVE`) gets the flow's old halves back (`nat::revive`), and goes on to the
//! flow-event program to be tracked and rewritten on them; a pod's segment whose flow cannot
//! come back is picked up on a new mapping, as conntrack picks a flow up.
//!
//! Inside the egress program the port search would be checked once for every parsing path into
//! it (IP options, fragments, protocols), which capped it at a few dozen ports; and the rewrite
//! after the search would be checked once for every port it can stop at. As programs of their
//! own, the search can try as many ports as the kernel's NAT.

use aya_ebpf::programs::TcContext;
use aya_log_ebpf::debug;
use masq_common::{
    counters::Counter,
    nat::{
        Direction, EVENT_NEW_FLOW, EVENT_REVIVE, EVENT_TRACK, Handoff, NatKey, ORIGIN_HOST,
        ORIGIN_POD, proto,
    },
};

use crate::{
    counters::{count_in, record_allocation},
    evict,
    family::Family,
    maps::{self, PROGS},
    nat::{self, AllocError, Allocation},
    verdict::Verdict,
};

/// Entry point of `masq_allocator`: creates the mapping, then hands the packet to
/// `masq_source_nat`; or, when this run's chunk of ports is taken, runs itself again for the
/// next chunk (see `nat::allocate`).
#[inline(always)]
pub(crate) fn allocate<A: Family>(ctx: &TcContext) -> i32 {
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    let Some(settings) = maps::settings() else {
        count_in::<A>(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    // SAFETY: only this CPU writes its slot. The ports and protocol alone, for the debug
    // records: a copy of the whole request would not fit the IPv6 allocator's stack.
    let (src_port, dst_port, protocol) = unsafe {
        (
            (*slot).request.key.src_port,
            (*slot).request.key.dst_port,
            (*slot).request.key.protocol,
        )
    };
    // SAFETY: as above.
    if unsafe { core::ptr::read_volatile(&raw const (*slot).request.event) } == EVENT_REVIVE {
        return revive::<A>(ctx, slot);
    }
    let allocated = nat::allocate::<A>(ctx, settings);
    if !matches!(allocated, Ok(Allocation::SearchGoesOn)) {
        nat::end_search::<A>();
    }
    let counter = match allocated {
        Ok(Allocation::Mapped) => {
            // SAFETY: only this CPU writes its slot; the key is read in place.
            let key = unsafe { &raw const (*slot).request.key };
            // SAFETY: as above.
            unsafe { evict::admitted::<A>(settings, key) };
            if protocol == proto::TCP {
                // A new connection takes the tuple: a buried one must not come back on it.
                // SAFETY: as above.
                let key: &NatKey<A> = unsafe { &*key };
                let _ = A::buried().remove(key);
            }
            // SAFETY: as above.
            let (origin, port) = unsafe { ((*slot).mapping.origin, (*slot).mapping.port) };
            let counter = match (origin == ORIGIN_HOST, port == src_port) {
                (false, _) => Counter::EgressNewMapping,
                (true, true) => Counter::EgressHostTracked,
                // The node's flow clashed with a mapping: it leaves from another port, as
                // conntrack's null binding gives it one.
                (true, false) => Counter::EgressHostRemapped,
            };
            // SAFETY: as above.
            unsafe { (*slot).request.counter = counter as u16 };
            // SAFETY: the context is the program's own; the mapping is in the slot.
            unsafe { PROGS.tail_call(ctx, A::SLOT_SOURCE_NAT) };
            // The mapping exists; the packet's retransmission will find it.
            Counter::EgressDropNoAllocator
        }
        Ok(Allocation::SearchGoesOn) => {
            // SAFETY: as above; the search's state is in the slot.
            unsafe { PROGS.tail_call(ctx, A::SLOT_ALLOCATOR) };
            // Only if the kernel refused the tail call: the search cannot go on.
            record_allocation(None);
            Counter::EgressDropNoPort
        }
        Err(AllocError::NoPort) => {
            // Towards a remote with no port left, a pod's flow may take one from a pod holding
            // more of that remote's ports (once).
            // SAFETY: as above.
            let (origin, took) = unsafe {
                (
                    core::ptr::read_volatile(&raw const (*slot).request.origin),
                    core::ptr::read_volatile(&raw const (*slot).took_port),
                )
            };
            if origin == ORIGIN_POD && took == 0 {
                // SAFETY: the context is the program's own; the request is in the slot.
                unsafe { PROGS.tail_call(ctx, A::SLOT_PORT_SHARE) };
            }
            debug!(
                ctx,
                "no free port towards remote port {} (proto {})", dst_port, protocol
            );
            Counter::EgressDropNoPort
        }
        Err(AllocError::TableFull) => {
            // Room made by evicting a flow that was never assured: the request starts over (its
            // search ended above), as conntrack admits a new flow after `early_drop`.
            if evict::make_room::<A>(settings) {
                // SAFETY: the context is the program's own; the request is in the slot.
                unsafe { PROGS.tail_call(ctx, A::SLOT_ALLOCATOR) };
            }
            debug!(ctx, "NAT table full: new flow refused");
            Counter::EgressDropTableFull
        }
        Err(AllocError::HolderShare) => {
            debug!(
                ctx,
                "the pod holds its share of the NAT table: new flow refused"
            );
            Counter::EgressDropHolderShare
        }
        Err(AllocError::SctpPortInUse) => {
            debug!(
                ctx,
                "SCTP port {} taken towards remote port {}", src_port, dst_port
            );
            Counter::EgressDropSctpPortInUse
        }
    };
    count_in::<A>(counter);
    Verdict::Drop.tc_action()
}

/// A segment of a flow the agent buried (see `nat::revive`): its halves come back and the
/// flow-event program tracks and rewrites it on them; a pod's segment whose flow cannot come
/// back starts over here as a new flow (each by a tail call, so that what the revival learned
/// does not multiply the verification of what follows).
#[inline(always)]
fn revive<A: Family>(ctx: &TcContext, slot: *mut Handoff<A>) -> i32 {
    // SAFETY: only this CPU writes its slot; the key is read in place.
    let (key, node_addr) = unsafe {
        (
            &(*slot).request.key,
            A::load(&raw const (*slot).request.node_addr),
        )
    };
    let outbound = key.direction() == Some(Direction::Egress);
    match nat::revive::<A>(ctx, key, node_addr) {
        nat::Revival::Revived => {
            // SAFETY: as above; the request stays as it is but for what is asked.
            unsafe {
                core::ptr::write_volatile(&raw mut (*slot).request.event, EVENT_TRACK);
                PROGS.tail_call(ctx, A::SLOT_FLOW_EVENT);
            }
        }
        nat::Revival::PickUp => {
            // SAFETY: as above.
            unsafe {
                core::ptr::write_volatile(&raw mut (*slot).request.event, EVENT_NEW_FLOW);
                core::ptr::write_volatile(
                    &raw mut (*slot).request.counter,
                    Counter::EgressNewMapping as u16,
                );
                PROGS.tail_call(ctx, A::SLOT_ALLOCATOR);
            }
        }
        nat::Revival::Unknown => {
            count_in::<A>(if outbound {
                Counter::EgressTcpMidstreamPassed
            } else {
                Counter::IngressNoMappingPassed
            });
            return Verdict::Pass.tc_action();
        }
    }
    // Only if the kernel refused the tail call.
    count_in::<A>(Counter::EgressDropNoAllocator);
    Verdict::Drop.tc_action()
}

/// Entry point of `masq_port_share`: a pod's new flow found no port towards its remote. If a
/// pod holding more of that remote's ports gives one up (see `evict::take_from_busier`), the
/// flow goes back to the allocator to take that port; otherwise it is refused.
#[inline(always)]
pub(crate) fn share_port<A: Family>(ctx: &TcContext) -> i32 {
    if let Some(settings) = maps::settings()
        && let Some(port) = evict::take_from_busier::<A>(settings)
    {
        nat::search_one::<A>(port);
        // SAFETY: the context is the program's own; the request is in the slot.
        unsafe { PROGS.tail_call(ctx, A::SLOT_ALLOCATOR) };
    }
    count_in::<A>(Counter::EgressDropNoPort);
    Verdict::Drop.tc_action()
}
