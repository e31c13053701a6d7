//! The flow-event program: what the egress and ingress programs leave to it (see `handoff`).
//!
//! * `EVENT_TRACK`: a packet that moves its flow's state (a SYN-ACK, the ACK completing a
//!   handshake, a FIN, a RST, a datagram's first answer): judged with both halves
//!   (`track::packet`), then rewritten as the half it matched says. A RST that was the flow's
//!   only answer ends the flow; it is still delivered, translated.
//! * `EVENT_INBOUND`: a datagram from outside towards a pod, of a flow not tracked yet: tracked,
//!   against the pod's share (`nat::track_inbound`).

use aya_ebpf::programs::TcContext;
use masq_common::{
    counters::Counter,
    flow::TcpSegment,
    nat::{Direction, EVENT_INBOUND, EVENT_TRACK, NatKey, ORIGIN_INBOUND},
};

use crate::{
    clock::now_ns,
    counters::count_in,
    family::Family,
    forget, handoff, maps,
    nat::{self, Inbound, Mapping},
    track::{self, Fate},
    verdict::Verdict,
};

/// Entry point of `masq_flow_event`.
#[inline(always)]
pub(crate) fn handle<A: Family>(ctx: &TcContext) -> i32 {
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        count_in::<A>(Counter::EgressDropNoAllocator);
        return Verdict::Drop.tc_action();
    };
    let Some(settings) = maps::settings() else {
        count_in::<A>(Counter::EgressNotConfigured);
        return Verdict::Pass.tc_action();
    };
    // SAFETY: only this CPU writes its slot; the key and segment are read in place (a copy of
    // an IPv6 key would crowd the stack), the rest copied out.
    let (key, segment, event, counter) = unsafe {
        (
            &(*slot).request.key,
            &(*slot).request.segment,
            core::ptr::read_volatile(&raw const (*slot).request.event),
            core::ptr::read_volatile(&raw const (*slot).request.counter),
        )
    };
    // Forgotten (see `forget`): the two directions share most of the work, and a direction the
    // verifier knew exactly would have it verify all of it twice.
    let outbound = key.direction() == Some(Direction::Egress) && event != EVENT_INBOUND;
    let outbound = forget::word(u32::from(outbound)).is_some_and(|word| word != 0);
    let counter = Counter::of(counter).unwrap_or(if outbound {
        Counter::EgressMasqueraded
    } else {
        Counter::IngressReverseNat
    });
    match event {
        EVENT_TRACK => {}
        EVENT_INBOUND => {
            return match nat::track_inbound::<A>(settings, key) {
                Inbound::Tracked => {
                    count_in::<A>(Counter::IngressInboundTracked);
                    Verdict::Pass.tc_action()
                }
                Inbound::Refused => {
                    count_in::<A>(Counter::IngressDropHolderShare);
                    Verdict::Drop.tc_action()
                }
                Inbound::Known | Inbound::Untracked => {
                    count_in::<A>(Counter::IngressPassed);
                    Verdict::Pass.tc_action()
                }
            };
        }
        _ => {
            count_in::<A>(Counter::EgressDropNoAllocator);
            return Verdict::Drop.tc_action();
        }
    }
    track_and_rewrite(ctx, key, segment, outbound, counter)
}

/// Tracks the packet on the flow of `key` and hands it to the rewrite for its direction, with
/// the translation its half holds; a flow the packet ends goes after its translation is read.
#[inline(always)]
fn track_and_rewrite<A: Family>(
    ctx: &TcContext,
    key: &NatKey<A>,
    segment: &TcpSegment,
    outbound: bool,
    counter: Counter,
) -> i32 {
    let Some(half) = A::nat().get_ptr_mut(key) else {
        // Gone since the fast path looked (the agent removed it a moment ago): the packet
        // goes as a packet without a mapping would, to the stack if it arrives, and leaves
        // untranslated only if it could open nothing (a new mapping needs the allocator,
        // which the next packet reaches).
        count_in::<A>(if outbound {
            Counter::EgressDropNoAllocator
        } else {
            Counter::IngressNoMappingPassed
        });
        return if outbound {
            Verdict::Drop.tc_action()
        } else {
            Verdict::Pass.tc_action()
        };
    };
    // SAFETY: the pointer comes from a successful lookup, valid for this program run; the
    // translation is read before the flow may end.
    let mapping = unsafe {
        Mapping {
            addr: A::load(&raw const (*half).addr),
            port: core::ptr::read_volatile(&raw const (*half).port),
            origin: core::ptr::read_volatile(&raw const (*half).origin),
            quiet: 0,
        }
    };
    if track::packet(key, half, outbound, key.protocol, segment, now_ns()) == Fate::Ended {
        // SAFETY: as above.
        unsafe { track::end(key, half) };
    }
    // A datagram from outside towards a pod is not rewritten: its flow's one half holds the
    // pod's own tuple, for the pod's answers.
    if mapping.origin == ORIGIN_INBOUND && !outbound {
        count_in::<A>(Counter::IngressPassed);
        return Verdict::Pass.tc_action();
    }
    handoff::rewrite_with(ctx, &mapping, counter, outbound);
    count_in::<A>(Counter::EgressDropNoAllocator);
    Verdict::Drop.tc_action()
}
