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
    layout::{PROG_SLOT_ALLOCATOR, PROG_SLOT_NEW_FLOW},
    nat::{NatKeyV4, ORIGIN_HOST},
};

use crate::{
    counters::count,
    egress,
    maps::{self, ALLOC_REQUEST, PROGS},
    nat::{self, AllocError},
    packet::{self, EarlyOutcomes},
    verdict::Verdict,
};

/// Asks the allocator to map the flow of `key`, leaving by the uplink whose address is
/// `snat_addr`, and to translate the packet. Does not return when the tail call succeeds;
/// returns if the allocator's slot is empty.
///
/// Only the fields the allocator reads are written: the rest of the slot is its output and
/// scratch space, and writing a whole zeroed request costs a call to a byte-by-byte memset.
#[inline(always)]
pub(crate) fn hand_over(
    ctx: &TcContext,
    key: &NatKeyV4,
    snat_addr: [u8; 4],
    origin: u8,
    flow_flags: u8,
) {
    let Some(slot) = ALLOC_REQUEST.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU array slots are private to this CPU while the program runs, and the tail
    // call below runs the allocator on this CPU before anything else can.
    unsafe {
        (*slot).key = *key;
        (*slot).snat_addr = snat_addr;
        (*slot).origin = origin;
        (*slot).flow_flags = flow_flags;
        PROGS.tail_call(ctx, PROG_SLOT_ALLOCATOR);
    }
}

/// Entry point of `masq_allocator`: creates the mapping, then hands the packet to
/// `masq_new_flow`.
#[inline(always)]
pub(crate) fn allocate(ctx: &TcContext) -> i32 {
    let Some(slot) = ALLOC_REQUEST.get_ptr_mut(0) else {
        count(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    // SAFETY: the value is copied out at once; only this CPU writes its slot.
    let request = unsafe { *slot };
    let Some(settings) = maps::settings() else {
        count(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    let key = request.key;
    let counter = match nat::allocate::<[u8; 4]>(ctx, settings) {
        Ok(entry) => {
            // SAFETY: as above.
            unsafe {
                (*slot).entry = entry;
                PROGS.tail_call(ctx, PROG_SLOT_NEW_FLOW);
            }
            // The mapping exists; the packet's retransmission will find it.
            Counter::EgressDropNoAllocator
        }
        Err(AllocError::NoPort) => {
            debug!(
                ctx,
                "no free port towards {:i}:{}",
                u32::from_be_bytes(key.dst_addr),
                key.dst_port
            );
            Counter::EgressDropNoPort
        }
        Err(AllocError::TableFull) => {
            debug!(ctx, "NAT table full: new flow refused");
            Counter::EgressDropTableFull
        }
        Err(AllocError::SctpPortInUse) => {
            debug!(
                ctx,
                "SCTP port {} taken towards {:i}",
                key.src_port,
                u32::from_be_bytes(key.dst_addr)
            );
            Counter::EgressDropSctpPortInUse
        }
    };
    count(counter);
    Verdict::Drop.tc_action()
}

/// Entry point of `masq_new_flow`: translates the packet whose flow the allocator just mapped.
#[inline(always)]
pub(crate) fn translate_new_flow(ctx: &TcContext) -> i32 {
    // SAFETY: the value is copied out at once; only this CPU writes its slot.
    let Some(request) = ALLOC_REQUEST.get_ptr(0).map(|slot| unsafe { *slot }) else {
        count(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    let (key, entry) = (request.key, request.entry);
    debug!(
        ctx,
        "new mapping proto {} {:i}:{} -> {:i}:{} as port {}",
        key.protocol,
        u32::from_be_bytes(key.src_addr),
        key.src_port,
        u32::from_be_bytes(key.dst_addr),
        key.dst_port,
        entry.port
    );
    let counter = if request.origin == ORIGIN_HOST {
        Counter::EgressHostTracked
    } else {
        Counter::EgressNewMapping
    };
    // The egress program parsed these same headers a moment ago; parsing them again gives the
    // verifier the bounds it needs to rewrite them.
    let outcomes = EarlyOutcomes {
        not_ipv4: Counter::EgressNotIpv4,
        malformed: Counter::EgressMalformed,
    };
    let Some(ip) = packet::classifiable(ctx, &outcomes) else {
        return Verdict::Pass.tc_action();
    };
    egress::translate(ctx, &ip, &key, &entry, counter).tc_action()
}
