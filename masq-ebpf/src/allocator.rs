//! New flows: the port allocator and the translation of a new flow's packet, two classifiers
//! the egress program reaches by tail call.
//!
//! The verifier checks a program from its entry, once per distinct state it can reach a point
//! with. Inside the egress program the port search would be checked once for every parsing path
//! into it (IP options, fragments, protocols), which capped it at a few dozen ports; and the
//! rewrite after the search would be checked once for every port it can stop at. Split into
//! `masq_allocator` (search and insert, from one entry state) and `masq_new_flow` (parse and
//! rewrite, once), the search can try as many ports as the kernel's NAT. The programs pass the
//! flow and its mapping along in a per-CPU map; the packet's headers are unchanged in between.

use aya_ebpf::programs::TcContext;
use aya_log_ebpf::debug;
use masq_common::{
    counters::Counter,
    nat::{NatKey, ORIGIN_HOST},
};

use crate::{
    counters::{count_in, record_allocation},
    egress, evict,
    family::Family,
    maps::{self, PROGS},
    nat::{self, AllocError, Allocation},
    verdict::Verdict,
};

/// Asks the allocator to map the flow of `key`, leaving by the uplink whose address is
/// `snat_addr`, and to translate the packet. Does not return when the tail call succeeds;
/// returns if the allocator's slot is empty.
///
/// Only the fields the allocator reads are written: the rest of the slot is its output and
/// scratch space, and writing a whole zeroed request costs a call to a byte-by-byte memset.
#[inline(always)]
pub(crate) fn hand_over<A: Family>(
    ctx: &TcContext,
    key: &NatKey<A>,
    snat_addr: A,
    origin: u8,
    flow_flags: u8,
) {
    let Some(slot) = A::alloc_request().get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU array slots are private to this CPU while the program runs, and the tail
    // call below runs the allocator on this CPU before anything else can.
    unsafe {
        (*slot).key = *key;
        (*slot).snat_addr = snat_addr;
        (*slot).origin = origin;
        (*slot).flow_flags = flow_flags;
        // A new request: the allocator begins a search rather than resuming one.
        (*slot).search.round = 0;
        PROGS.tail_call(ctx, A::SLOT_ALLOCATOR);
    }
}

/// Entry point of `masq_allocator`: creates the mapping, then hands the packet to
/// `masq_new_flow`; or, when this run's chunk of ports is taken, runs itself again for the
/// next chunk (see `nat::allocate`).
#[inline(always)]
pub(crate) fn allocate<A: Family>(ctx: &TcContext) -> i32 {
    let Some(slot) = A::alloc_request().get_ptr_mut(0) else {
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
            (*slot).key.src_port,
            (*slot).key.dst_port,
            (*slot).key.protocol,
        )
    };
    let allocated = nat::allocate::<A>(ctx, settings);
    if !matches!(allocated, Ok(Allocation::SearchGoesOn)) {
        nat::end_search::<A>();
    }
    let counter = match allocated {
        Ok(Allocation::Mapped) => {
            // SAFETY: only this CPU writes its slot; the key is copied out.
            let key = unsafe { (*slot).key };
            evict::remember::<A>(&key);
            // SAFETY: the context is the program's own; the mapping is in the slot.
            unsafe { PROGS.tail_call(ctx, A::SLOT_NEW_FLOW) };
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
            debug!(
                ctx,
                "no free port towards remote port {} (proto {})", dst_port, protocol
            );
            Counter::EgressDropNoPort
        }
        Err(AllocError::TableFull) => {
            // Room made by evicting a flow that was never answered: the request starts over
            // (its search ended above), as conntrack admits a new flow after `early_drop`.
            if evict::make_room::<A>() {
                // SAFETY: the context is the program's own; the request is in the slot.
                unsafe { PROGS.tail_call(ctx, A::SLOT_ALLOCATOR) };
            }
            debug!(ctx, "NAT table full: new flow refused");
            Counter::EgressDropTableFull
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

/// Entry point of `masq_new_flow`: translates the packet whose flow the allocator just mapped.
#[inline(always)]
pub(crate) fn translate_new_flow<A: Family>(ctx: &TcContext) -> i32 {
    // SAFETY: the value is copied out at once; only this CPU writes its slot.
    let Some(request) = A::alloc_request().get_ptr(0).map(|slot| unsafe { *slot }) else {
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    let (key, entry) = (request.key, request.entry);
    A::log_new_mapping(ctx, &key, entry.port);
    let counter = if request.origin == ORIGIN_HOST {
        Counter::EgressHostTracked
    } else {
        Counter::EgressNewMapping
    };
    // The egress program parsed these same headers a moment ago; parsing them again gives the
    // verifier the bounds it needs to rewrite them.
    let Some(ip) = A::parse_again(ctx) else {
        return Verdict::Pass.tc_action();
    };
    egress::translate(ctx, &ip, &key, &entry, counter).tc_action()
}
