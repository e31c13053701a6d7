//! Tracking a packet on its flow: `masq_common::flow`'s model applied to the NAT table's
//! entries, one packet at a time.
//!
//! Most packets of a flow change nothing but their own direction's window and, once a second,
//! their half's last-seen time: they read their half, write what moved in it, and leave
//! ([`quiet`], in the programs every packet runs). A packet that moves the flow (a SYN-ACK, the
//! ACK that completes a handshake, a FIN, a RST, a datagram's first answer, the two-second mark
//! of a stream) is a flow event: the flow-event program judges it with both halves and writes
//! the new state into both ([`packet`]), a handful of times per flow. Two CPUs moving one flow at
//! the same instant (both ends' FINs crossing) may leave the halves a step apart; the next such
//! packet moves them on, and every state's lifetime is finite, so a lost write holds nothing
//! for long.

use masq_common::{
    counters::Counter,
    flow::{
        NO_WINDOW_SCALE, Segment, Side, TCP_IGNORE, TCP_INVALID, TcpChecks, TcpFlow, TcpOutcome,
        TcpSegment, WINDOW_FIN, WINDOW_TRACKED, Window, datagram, datagram_next, in_window,
        rst_below_ack, rst_closes, tcp, tcp_judge_move, tcp_next,
    },
    nat::{Direction, NatEntry, NatKey, ORIGIN_INBOUND, TOUCH_INTERVAL_NS, proto},
};

use crate::{
    counters::count_in,
    family::Family,
    forget, holders,
    table::{has_peer, holder_of, peer_of, remove_flow, write_window},
};

/// What became of a packet's flow.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The flow goes on.
    Lives,
    /// The flow is over with this packet (a RST as its only answer): the packet is translated,
    /// then both halves go (see [`end`]).
    Ended,
}

/// Which side of its flow a packet comes from: the local end's packets leave (`outbound`),
/// except on a flow opened from outside, whose originator is the remote end.
#[inline(always)]
const fn side(outbound: bool, origin: u8) -> Side {
    if outbound == (origin != ORIGIN_INBOUND) {
        Side::Original
    } else {
        Side::Reply
    }
}

/// Whether a packet of `protocol` (for TCP, `segment`) leaves the flow whose half is at `half`
/// (a map value) in its state: then its direction's window and its half's last-seen time are
/// recorded, as [`packet`] would, and nothing else is to do. Otherwise nothing is written: the
/// packet is a flow event, for [`packet`] in the flow-event program. `outbound`: the packet
/// leaves by the uplink.
#[inline(always)]
pub(crate) fn quiet<A: Family>(
    half: *mut NatEntry<A>,
    outbound: bool,
    protocol: u8,
    segment: &TcpSegment,
    now: u64,
) -> bool {
    // SAFETY: `half` is the value the caller's lookup found, valid for this program run.
    let (origin, state, reset) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*half).origin),
            core::ptr::read_volatile(&raw const (*half).state),
            core::ptr::read_volatile(&raw const (*half).reset),
        )
    };
    let side = side(outbound, origin);
    if protocol == proto::TCP {
        if !quiet_segment(half, side, state, reset, segment) {
            return false;
        }
        record(half, segment);
    } else if datagram_next(state, side, protocol, created(half), now) != state {
        return false;
    }
    refresh(half, protocol, segment, now);
    true
}

/// Whether a TCP segment moves nothing but its half's window: not a segment its state machine
/// acts on, no RST to forget, no FIN belied. Nothing is written.
#[inline(always)]
fn quiet_segment<A: Family>(
    half: *mut NatEntry<A>,
    side: Side,
    state: u8,
    reset: u8,
    segment: &TcpSegment,
) -> bool {
    let kind = Segment::of(segment.flags);
    if !matches!(kind, Segment::Ack | Segment::None) || reset != 0 {
        return false;
    }
    let next = tcp_next(state, side, kind as u8);
    if next != state && next != TCP_IGNORE && next != TCP_INVALID {
        return false;
    }
    // SAFETY: `half` is a valid map value (see `quiet`).
    let window = unsafe { fresh_window(&raw const (*half).window) };
    let fin_undone =
        window.flags & WINDOW_FIN != 0 && window.flags_after(segment) & WINDOW_FIN == 0;
    !fin_undone
}

/// Records `segment`, which `half`'s direction sent, in its window, field by field: each field
/// is computed from the window as it then is and written (only if it moved) before the next is
/// computed. The verifier then meets each field's computation in one state; a whole new window
/// computed at once would be verified once for every combination of the fields' branches.
/// The order matters: the acknowledgement and the offered end read the flags as they were, the
/// flags read the end as it was.
#[inline(always)]
fn record<A: Family>(half: *mut NatEntry<A>, segment: &TcpSegment) {
    // SAFETY: callers pass the value their lookup found; every field is read afresh.
    unsafe {
        let window = &raw mut (*half).window;
        if core::ptr::read_volatile(&raw const (*window).flags) & WINDOW_TRACKED == 0 {
            // This direction's first segment (a SYN-ACK, the first answer of a flow picked up):
            // liberal when the other direction is, which `in_window` reads from either half.
            write_window(half, &Window::first(&fresh(segment), false));
            return;
        }
        macro_rules! step {
            ($field:ident, $after:ident) => {
                let value = fresh_window(window).$after(&fresh(segment));
                let field = &raw mut (*window).$field;
                if core::ptr::read_volatile(field) != value {
                    core::ptr::write_volatile(field, value);
                }
            };
        }
        step!(max_ack, max_ack_after);
        step!(offered_end, offered_end_after);
        step!(max_window, max_window_after);
        step!(flags, flags_after);
        step!(end, end_after);
    }
}

/// Refreshes `half`'s last-seen time at most once per [`TOUCH_INTERVAL_NS`] (and at its
/// direction's first packet). A SYN retransmitted before any answer does not extend its flow's
/// life, as conntrack's does not: a client reusing a port would otherwise hold the mapping
/// forever.
#[inline(always)]
fn refresh<A: Family>(half: *mut NatEntry<A>, protocol: u8, segment: &TcpSegment, now: u64) {
    // The state and the flags read afresh: values the code before refined, carried here,
    // would have the verifier walk what follows once per refinement.
    // SAFETY: callers pass the value their lookup found.
    let (state, last_seen) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*half).state),
            core::ptr::read_volatile(&raw const (*half).last_seen_ns),
        )
    };
    let retransmitted_syn = protocol == proto::TCP
        && matches!(Segment::of(fresh(segment).flags), Segment::Syn)
        && state == tcp::SYN_SENT;
    if (last_seen == 0 || now.wrapping_sub(last_seen) >= TOUCH_INTERVAL_NS) && !retransmitted_syn {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&raw mut (*half).last_seen_ns, now) };
    }
}

/// Tracks a flow event: a packet of `protocol` (for TCP, `segment`) at monotonic time `now` on
/// the flow whose half under `key` is at `half` (a map value), judged with both halves: its
/// direction's window, the flow's state in both halves, its last-seen time. `outbound`: the
/// packet leaves by the uplink.
#[inline(always)]
pub(crate) fn packet<A: Family>(
    key: &NatKey<A>,
    half: *mut NatEntry<A>,
    outbound: bool,
    protocol: u8,
    segment: &TcpSegment,
    now: u64,
) -> Fate {
    // SAFETY: `half` is the value the caller's lookup found, valid for this program run.
    let (origin, state) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*half).origin),
            core::ptr::read_volatile(&raw const (*half).state),
        )
    };
    let side = side(outbound, origin);
    let fate = if protocol == proto::TCP {
        let fate = tcp_packet(key, half, side, outbound, segment, now);
        // Every way the segment went meets what follows in one state (see `forget`).
        match forget::word(u32::from(fate == Fate::Ended)) {
            Some(0) | None => Fate::Lives,
            Some(_) => Fate::Ended,
        }
    } else {
        let next = datagram_next(state, side, protocol, created(half), now);
        if next != state {
            // SAFETY: as above.
            let peer = unsafe { peer_half(key, half) };
            let assured = next == datagram::STREAM;
            store_state(half, peer, next, assured, false);
            if assured {
                // SAFETY: as above.
                holders::remove_one::<A>(unsafe { holder_of(key, half) });
            }
        }
        Fate::Lives
    };
    refresh(half, protocol, segment, now);
    fate
}

/// [`packet`] for TCP.
///
/// The judgement is `flow::tcp_segment`'s, computed in steps whose inputs are read afresh from
/// map memory and whose results are forgotten (see `forget`): each step's branches are then
/// verified once, where the whole judgement in one piece would be verified once for every
/// combination of them, and a million instructions do not suffice.
#[inline(always)]
fn tcp_packet<A: Family>(
    key: &NatKey<A>,
    half: *mut NatEntry<A>,
    side: Side,
    outbound: bool,
    segment: &TcpSegment,
    now: u64,
) -> Fate {
    // Whether data past an accepted FIN belies it (see `Window::flags_after`).
    // SAFETY: `half` is a valid map value for this program run (see `packet`).
    let fin_undone = unsafe {
        let window = fresh_window(&raw const (*half).window);
        window.flags & WINDOW_FIN != 0 && window.flags_after(&fresh(segment)) & WINDOW_FIN == 0
    };
    let fin_undone = forget::word(u32::from(fin_undone)).is_some_and(|word| word != 0);

    // The flow as the halves hold it.
    // SAFETY: as above.
    let peer = unsafe { peer_half(key, half) };
    // SAFETY: as above; `peer` comes from a successful lookup, valid for this program run.
    let flow = unsafe {
        // Whether an answer came before this packet: the reply half has carried one.
        let reply_half = if matches!(key.direction(), Some(Direction::Ingress)) {
            Some(half)
        } else {
            peer
        };
        TcpFlow {
            state: core::ptr::read_volatile(&raw const (*half).state),
            assured: core::ptr::read_volatile(&raw const (*half).assured) != 0,
            reset: core::ptr::read_volatile(&raw const (*half).reset) != 0,
            replied: reply_half.is_some_and(|reply| {
                core::ptr::read_volatile(&raw const (*reply).last_seen_ns) != 0
            }),
        }
    };
    let kind = Segment::of(fresh(segment).flags);
    let Some(kind_word) = forget::word(kind as u32) else {
        return Fate::Lives;
    };

    // The checks, one at a time.
    let forget_bool = |value: bool| forget::word(u32::from(value)).is_some_and(|word| word != 0);
    // SAFETY: as above; every input is read afresh.
    let (in_window, below_ack, closes) = unsafe {
        let sender = &raw const (*half).window;
        let receiver = peer.map_or(core::ptr::null(), |peer| &raw const (*peer).window);
        let receiver = || {
            if receiver.is_null() {
                Window::EMPTY
            } else {
                fresh_window(receiver)
            }
        };
        let state = core::ptr::read_volatile(&raw const (*half).state);
        (
            forget_bool(in_window(
                &fresh_window(sender),
                &receiver(),
                &fresh(segment),
                state,
            )),
            forget_bool(rst_below_ack(
                fresh_flow(flow),
                &fresh(segment),
                &fresh_window(sender),
                &receiver(),
            )),
            forget_bool(rst_closes(
                fresh_flow(flow),
                &fresh(segment),
                &fresh_window(sender),
                &receiver(),
            )),
        )
    };

    // The judgement.
    let kind = segment_of(kind_word);
    let checks = TcpChecks::combine(kind, outbound, in_window, below_ack, closes);
    let flow = fresh_flow(flow);
    // The transition from the kind as read back (see `tcp_next`).
    let next = tcp_next(flow.state, side, kind_word as u8);
    let judged = tcp_judge_move(flow, side, kind, next, checks);
    let outcome = match forget::word(judged.encode()) {
        Some(word) => TcpOutcome::decode(word),
        None => TcpOutcome::Unchanged,
    };

    // What it does to the halves. What the steps above learned is not carried here (their
    // booleans, exact in each state, would multiply this part's verification): what a step
    // needs is read afresh.
    let forget_bool = |value: bool| forget::word(u32::from(value)).is_some_and(|word| word != 0);
    match outcome {
        TcpOutcome::Unchanged => {
            record(half, segment);
            if fin_undone {
                undo_close(half, peer);
            }
        }
        TcpOutcome::Moved(moved) => {
            // SAFETY: as above.
            let newly_assured = forget_bool(
                moved.assured
                    && unsafe { core::ptr::read_volatile(&raw const (*half).assured) } == 0,
            );
            record(half, segment);
            let kind = Segment::of(fresh(segment).flags);
            if matches!(kind, Segment::Fin) {
                // SAFETY: as above.
                unsafe {
                    let window = fresh_window(&raw const (*half).window).with_fin(&fresh(segment));
                    write_window(half, &window);
                }
            }
            if matches!(kind, Segment::SynAck) {
                agree_on_scaling(half, peer, &fresh(segment));
            }
            store_state(half, peer, moved.state, moved.assured, moved.reset);
            if newly_assured {
                // SAFETY: as above.
                holders::remove_one::<A>(unsafe { holder_of(key, half) });
            }
        }
        TcpOutcome::Reopened => reopen(key, half, peer, &fresh(segment), now),
        TcpOutcome::OutOfWindow => count_in::<A>(Counter::TcpCloseOutOfWindow),
        TcpOutcome::Killed => return Fate::Ended,
    }
    Fate::Lives
}

/// A copy of `segment` read afresh, field by field (see [`tcp_packet`]).
#[inline(always)]
fn fresh(segment: &TcpSegment) -> TcpSegment {
    let segment: *const TcpSegment = segment;
    // SAFETY: a valid reference; volatile, so no earlier read of it is reused.
    unsafe {
        TcpSegment {
            seq: core::ptr::read_volatile(&raw const (*segment).seq),
            ack: core::ptr::read_volatile(&raw const (*segment).ack),
            len: core::ptr::read_volatile(&raw const (*segment).len),
            window: core::ptr::read_volatile(&raw const (*segment).window),
            flags: core::ptr::read_volatile(&raw const (*segment).flags),
            scale: core::ptr::read_volatile(&raw const (*segment).scale),
        }
    }
}

/// A copy of the window at `window` (a map value) read afresh, field by field.
///
/// # Safety
/// `window` must point at a valid window for the length of the call.
#[inline(always)]
unsafe fn fresh_window(window: *const Window) -> Window {
    // SAFETY: as the caller promises.
    unsafe {
        Window {
            end: core::ptr::read_volatile(&raw const (*window).end),
            max_ack: core::ptr::read_volatile(&raw const (*window).max_ack),
            offered_end: core::ptr::read_volatile(&raw const (*window).offered_end),
            max_window: core::ptr::read_volatile(&raw const (*window).max_window),
            scale: core::ptr::read_volatile(&raw const (*window).scale),
            flags: core::ptr::read_volatile(&raw const (*window).flags),
            pad: [0; 2],
        }
    }
}

/// `flow` with each field forgotten (see [`tcp_packet`]).
#[inline(always)]
fn fresh_flow(flow: TcpFlow) -> TcpFlow {
    let word = u32::from(flow.state)
        | u32::from(flow.assured) << 8
        | u32::from(flow.reset) << 9
        | u32::from(flow.replied) << 10;
    let word = forget::word(word).unwrap_or(word);
    TcpFlow {
        state: word as u8,
        assured: word & 1 << 8 != 0,
        reset: word & 1 << 9 != 0,
        replied: word & 1 << 10 != 0,
    }
}

/// The segment kind `word` holds (`Segment as u32`).
#[inline(always)]
const fn segment_of(word: u32) -> Segment {
    match word {
        0 => Segment::Syn,
        1 => Segment::SynAck,
        2 => Segment::Fin,
        3 => Segment::Ack,
        4 => Segment::Rst,
        _ => Segment::None,
    }
}

/// The other half of the flow whose half under `key` is at `half`, if it has one and it is
/// there.
///
/// # Safety
/// `half` must point at a valid entry for the length of the call.
#[inline(always)]
unsafe fn peer_half<A: Family>(
    key: &NatKey<A>,
    half: *mut NatEntry<A>,
) -> Option<*mut NatEntry<A>> {
    // SAFETY: as the caller promises.
    let origin = unsafe { core::ptr::read_volatile(&raw const (*half).origin) };
    if !has_peer(origin) {
        return None;
    }
    // SAFETY: as the caller promises.
    A::nat().get_ptr_mut(unsafe { peer_of(key, half) })
}

/// When the flow of `half` began.
#[inline(always)]
fn created<A: Family>(half: *const NatEntry<A>) -> u64 {
    // SAFETY: callers pass the value their lookup found.
    unsafe { core::ptr::read_volatile(&raw const (*half).created_ns) }
}

/// Writes the flow's state into both halves.
#[inline(always)]
fn store_state<A: Family>(
    half: *mut NatEntry<A>,
    peer: Option<*mut NatEntry<A>>,
    state: u8,
    assured: bool,
    reset: bool,
) {
    let write = |entry: *mut NatEntry<A>| {
        // SAFETY: both pointers come from successful lookups, valid for this program run.
        unsafe {
            core::ptr::write_volatile(&raw mut (*entry).state, state);
            core::ptr::write_volatile(&raw mut (*entry).assured, u8::from(assured));
            core::ptr::write_volatile(&raw mut (*entry).reset, u8::from(reset));
        }
    };
    write(half);
    if let Some(peer) = peer {
        write(peer);
    }
}

/// The SYN-ACK settles window scaling (RFC 7323): each direction's windows are scaled only if
/// both SYNs announced a scale. The originator's announcement waits in its half; the answer's
/// is in `segment`.
#[inline(always)]
fn agree_on_scaling<A: Family>(
    half: *mut NatEntry<A>,
    peer: Option<*mut NatEntry<A>>,
    segment: &TcpSegment,
) {
    // SAFETY: callers pass values their lookups found.
    let announced = peer.map_or(NO_WINDOW_SCALE, |peer| unsafe {
        core::ptr::read_volatile(&raw const (*peer).window.scale)
    });
    let agreed = segment.scale <= masq_common::flow::MAX_WINDOW_SCALE
        && announced <= masq_common::flow::MAX_WINDOW_SCALE;
    if agreed {
        return;
    }
    // SAFETY: callers pass values their lookups found.
    unsafe { core::ptr::write_volatile(&raw mut (*half).window.scale, 0) };
    if let Some(peer) = peer {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(&raw mut (*peer).window.scale, 0) };
    }
}

/// A FIN masq accepted, belied by the data its sender sent after it: the close was not the
/// endpoint's. The connection goes back to ESTABLISHED, unless the other end has closed too.
#[inline(always)]
fn undo_close<A: Family>(half: *mut NatEntry<A>, peer: Option<*mut NatEntry<A>>) {
    // SAFETY: callers pass values their lookups found.
    let (state, assured, reset, other_closed) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*half).state),
            core::ptr::read_volatile(&raw const (*half).assured) != 0,
            core::ptr::read_volatile(&raw const (*half).reset) != 0,
            peer.is_some_and(|peer| {
                core::ptr::read_volatile(&raw const (*peer).window.flags) & WINDOW_FIN != 0
            }),
        )
    };
    if other_closed || !matches!(state, tcp::FIN_WAIT | tcp::CLOSE_WAIT | tcp::LAST_ACK) {
        return;
    }
    store_state(half, peer, tcp::ESTABLISHED, assured, reset);
}

/// A SYN reuses the tuple of a connection that was over: a new connection begins on the same
/// mapping, with nothing of the old one kept (its windows, its answer, its assurance), as
/// conntrack starts a new entry. It counts against its holder again until assured.
#[inline(always)]
fn reopen<A: Family>(
    key: &NatKey<A>,
    half: *mut NatEntry<A>,
    peer: Option<*mut NatEntry<A>>,
    segment: &TcpSegment,
    now: u64,
) {
    // SAFETY: callers pass values their lookups found.
    let was_assured = unsafe { core::ptr::read_volatile(&raw const (*half).assured) } != 0;
    let fresh = Window::first(segment, false);
    // SAFETY: callers pass values their lookups found.
    unsafe {
        core::ptr::write_volatile(&raw mut (*half).window, fresh);
        core::ptr::write_volatile(&raw mut (*half).created_ns, now);
    }
    if let Some(peer) = peer {
        // SAFETY: as above.
        unsafe {
            core::ptr::write_volatile(&raw mut (*peer).window, Window::EMPTY);
            core::ptr::write_volatile(&raw mut (*peer).created_ns, now);
            core::ptr::write_volatile(&raw mut (*peer).last_seen_ns, 0);
        }
    }
    store_state(half, peer, tcp::SYN_SENT, false, false);
    if was_assured {
        // SAFETY: as above.
        holders::add_one::<A>(unsafe { holder_of(key, half) });
    }
}

/// Ends the flow whose half under `key` is at `half` (its packet translated already): both
/// halves go, and it no longer counts against its holder (it was never assured).
///
/// # Safety
/// `half` must point at a valid entry for the length of the call.
#[inline(always)]
pub(crate) unsafe fn end<A: Family>(key: &NatKey<A>, half: *mut NatEntry<A>) {
    // SAFETY: as the caller promises.
    let (origin, holder) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*half).origin),
            holder_of(key, half),
        )
    };
    let peer_key = has_peer(origin).then(|| {
        // SAFETY: as the caller promises.
        unsafe { peer_of(key, half) }
    });
    if remove_flow(key, peer_key.as_ref()) {
        holders::remove_one::<A>(holder);
        count_in::<A>(Counter::TcpRefused);
    }
}
