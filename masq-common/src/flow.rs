//! The state of a flow: one model for the datapath, the garbage collector and `masq nat list`.
//!
//! masq tracks each masqueraded flow as Linux conntrack tracks a connection, so that a flow
//! lives exactly as long as it would under iptables MASQUERADE, and the same flows are the
//! first to go when the table fills:
//!
//! * TCP runs conntrack's state machine ([`tcp_next`]): each segment moves the flow by the
//!   table of `nf_conntrack_proto_tcp.c`; a FIN or RST from the remote end counts only when
//!   it lies in the window conntrack would track ([`Window`], [`tcp_segment`]).
//! * UDP and protocols without a tracker of their own are *unreplied* until an answer comes,
//!   *replied* after it, and a *stream* once still active two seconds after they began
//!   ([`datagram_next`]); ICMP queries are unreplied or replied.
//!
//! A flow is *assured* as conntrack means it: a TCP connection whose handshake completed (the
//! originator's ACK after the SYN-ACK, not the SYN-ACK alone), or a datagram stream. An assured
//! flow is never evicted to admit a new one; the others are ([`evictable`]). How long an idle
//! flow lives is [`Timeouts::lifetime`].
//!
//! Everything here is plain arithmetic on the values the NAT entries hold, so the eBPF
//! programs, the agent and the tests run the same code.

use crate::nat::proto;

/// Which way a packet travels relative to its flow.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// From the end that opened the flow (a pod, the node; the remote end of a flow opened
    /// from outside).
    Original = 0,
    /// From the other end: the answers.
    Reply = 1,
}

/// conntrack's TCP states, with its numbering (`enum tcp_conntrack`).
pub mod tcp {
    /// No segment seen yet.
    pub const NONE: u8 = 0;
    /// The originator's SYN seen.
    pub const SYN_SENT: u8 = 1;
    /// The SYN-ACK seen.
    pub const SYN_RECV: u8 = 2;
    /// The originator's ACK after the SYN-ACK seen: the handshake is complete.
    pub const ESTABLISHED: u8 = 3;
    /// A FIN seen.
    pub const FIN_WAIT: u8 = 4;
    /// The FIN acknowledged; the other end has not closed yet.
    pub const CLOSE_WAIT: u8 = 5;
    /// FINs seen both ways; the last ACK awaited.
    pub const LAST_ACK: u8 = 6;
    /// The last ACK seen.
    pub const TIME_WAIT: u8 = 7;
    /// A RST seen.
    pub const CLOSE: u8 = 8;
    /// A SYN from the reply side too: a simultaneous open.
    pub const SYN_SENT2: u8 = 9;
    /// Number of states.
    pub const STATES: usize = 10;

    /// The state's name as conntrack prints it.
    pub const fn name(state: u8) -> &'static str {
        match state {
            NONE => "NONE",
            SYN_SENT => "SYN_SENT",
            SYN_RECV => "SYN_RECV",
            ESTABLISHED => "ESTABLISHED",
            FIN_WAIT => "FIN_WAIT",
            CLOSE_WAIT => "CLOSE_WAIT",
            LAST_ACK => "LAST_ACK",
            TIME_WAIT => "TIME_WAIT",
            CLOSE => "CLOSE",
            SYN_SENT2 => "SYN_SENT2",
            _ => "INVALID",
        }
    }

    /// Whether the connection is being torn down (conntrack's `tcp_can_early_drop`): what its
    /// garbage collector drops, with the unassured flows, while the table is nearly full.
    pub const fn closing(state: u8) -> bool {
        matches!(state, FIN_WAIT | CLOSE_WAIT | LAST_ACK | TIME_WAIT | CLOSE)
    }
}

/// States of a flow of UDP, ICMP and the protocols tracked without a state machine.
pub mod datagram {
    /// Only the originator has spoken.
    pub const UNREPLIED: u8 = 0;
    /// An answer came.
    pub const REPLIED: u8 = 1;
    /// Answered, and still active more than [`STREAM_AFTER_NS`] after it began: assured.
    pub const STREAM: u8 = 2;

    /// How long after its start a replied flow that is still active becomes a stream
    /// (conntrack's `stream_ts`).
    pub const STREAM_AFTER_NS: u64 = 2_000_000_000;

    /// The state's name.
    pub const fn name(state: u8) -> &'static str {
        match state {
            UNREPLIED => "UNREPLIED",
            REPLIED => "REPLIED",
            STREAM => "STREAM",
            _ => "INVALID",
        }
    }
}

/// What a TCP segment is to conntrack's state machine (`enum tcp_bit_set`), by its flags.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    /// SYN without ACK: a connection attempt.
    Syn = 0,
    /// SYN and ACK: the answer to a connection attempt.
    SynAck = 1,
    /// FIN (without SYN or RST).
    Fin = 2,
    /// ACK and nothing that ranks above it.
    Ack = 3,
    /// RST, whatever else is set.
    Rst = 4,
    /// None of these flags.
    None = 5,
}

/// TCP header flag bits (the 14th byte of the header).
pub mod tcp_flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// ACK.
    pub const ACK: u8 = 0x10;
}

impl Segment {
    /// The segment a TCP header's flag byte makes (conntrack's `get_conntrack_index`).
    #[inline(always)]
    pub const fn of(flags: u8) -> Self {
        if flags & tcp_flags::RST != 0 {
            Self::Rst
        } else if flags & tcp_flags::SYN != 0 {
            if flags & tcp_flags::ACK != 0 {
                Self::SynAck
            } else {
                Self::Syn
            }
        } else if flags & tcp_flags::FIN != 0 {
            Self::Fin
        } else if flags & tcp_flags::ACK != 0 {
            Self::Ack
        } else {
            Self::None
        }
    }
}

/// [`tcp_next`]: the segment is out of place but may be the endpoints' truth while masq is out
/// of step (a SYN on an open connection); it changes nothing.
pub const TCP_IGNORE: u8 = 0xfe;
/// [`tcp_next`]: the segment cannot happen in the flow's state; it changes nothing.
pub const TCP_INVALID: u8 = 0xff;

use tcp::{
    CLOSE as CL, CLOSE_WAIT as CW, ESTABLISHED as ES, FIN_WAIT as FW, LAST_ACK as LA,
    SYN_RECV as SR, SYN_SENT as SS, SYN_SENT2 as S2, TIME_WAIT as TW,
};
const IG: u8 = TCP_IGNORE;
const IV: u8 = TCP_INVALID;

/// Columns of a row of [`TCP_TRANSITIONS`]: the states, and padding to a power of two, so that an
/// index masked to the row's width stays inside the table whatever the compiler makes of the
/// bounds check (the eBPF verifier checks the masked index, not the checked one).
const ROW: usize = 16;

/// Rows of each side of [`TCP_TRANSITIONS`]: the segment kinds, padded to a power of two for
/// the same reason as [`ROW`].
const KINDS: usize = 8;

/// conntrack's transition table (`tcp_conntracks`): by side, segment and current state
/// (NONE, SYN_SENT, SYN_RECV, ESTABLISHED, FIN_WAIT, CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE,
/// SYN_SENT2), the next state.
static TCP_TRANSITIONS: [[[u8; ROW]; KINDS]; 2] = [
    // Original side.
    [
        row([SS, SS, IG, IG, IG, IG, IG, SS, SS, S2]), // syn
        row([IV, IV, SR, IV, IV, IV, IV, IV, IV, SR]), // synack
        row([IV, IV, FW, FW, LA, LA, LA, TW, CL, IV]), // fin
        row([ES, IV, ES, ES, CW, CW, TW, TW, CL, IV]), // ack
        row([IV, CL, CL, CL, CL, CL, CL, CL, CL, CL]), // rst
        row([IV, IV, IV, IV, IV, IV, IV, IV, IV, IV]), // none
        [IV; ROW],
        [IV; ROW],
    ],
    // Reply side.
    [
        row([IV, S2, IV, IV, IV, IV, IV, SS, IV, S2]), // syn
        row([IV, SR, IG, IG, IG, IG, IG, IG, IG, SR]), // synack
        row([IV, IV, FW, FW, LA, LA, LA, TW, CL, IV]), // fin
        row([IV, IG, SR, ES, CW, CW, TW, TW, CL, IG]), // ack
        row([IV, CL, CL, CL, CL, CL, CL, CL, CL, CL]), // rst
        row([IV, IV, IV, IV, IV, IV, IV, IV, IV, IV]), // none
        [IV; ROW],
        [IV; ROW],
    ],
];

/// A row of [`TCP_TRANSITIONS`]: the states' next states, padded with [`TCP_INVALID`].
const fn row(states: [u8; tcp::STATES]) -> [u8; ROW] {
    let mut row = [TCP_INVALID; ROW];
    let mut index = 0;
    while index < tcp::STATES {
        row[index] = states[index];
        index += 1;
    }
    row
}

/// The state a TCP flow in `state` moves to when `side` sends a segment of `kind` (a [`Segment`]
/// as `u8`; a larger number is none), as conntrack's table says; [`TCP_IGNORE`] or
/// [`TCP_INVALID`] when the segment leaves the state as it is.
///
/// The kind is a number, not a [`Segment`]: a datapath that passes the kind through a map (to
/// keep the verifier's states few) indexes with the number as read, masked; turning it back
/// into the enum first makes the compiler clamp it with branches, and Linux 6.1's verifier
/// follows the branch that cannot be taken with bounds that cannot be, and refuses the index.
#[inline(always)]
pub const fn tcp_next(state: u8, side: Side, kind: u8) -> u8 {
    if state as usize >= tcp::STATES {
        return TCP_INVALID;
    }
    TCP_TRANSITIONS[side as usize & 1][kind as usize & (KINDS - 1)][state as usize & (ROW - 1)]
}

/// The state a datagram flow (`protocol` UDP, ICMP or another without a tracker) in `state`,
/// begun at `began_ns`, moves to when `side` sends a packet at `now_ns`. A stream needs an
/// answer first and activity more than two seconds after the start; the answer itself never
/// makes one. ICMP queries never become streams.
#[inline(always)]
pub const fn datagram_next(state: u8, side: Side, protocol: u8, began_ns: u64, now_ns: u64) -> u8 {
    match state {
        datagram::UNREPLIED if matches!(side, Side::Reply) => datagram::REPLIED,
        datagram::REPLIED
            if !is_icmp(protocol)
                && now_ns.saturating_sub(began_ns) > datagram::STREAM_AFTER_NS =>
        {
            datagram::STREAM
        }
        _ => state,
    }
}

const fn is_icmp(protocol: u8) -> bool {
    protocol == proto::ICMP || protocol == proto::ICMPV6
}

/// Whether a flow may be evicted to admit a new one, as conntrack's `early_drop` evicts only
/// what is not assured.
#[inline(always)]
pub const fn evictable(assured: bool) -> bool {
    !assured
}

/// Whether the garbage collector may drop a flow early while the table is nearly full, as
/// conntrack's collector does above 95 %: what is not assured, and TCP connections being torn
/// down.
#[inline(always)]
pub const fn reclaimable(protocol: u8, state: u8, assured: bool) -> bool {
    !assured || (protocol == proto::TCP && tcp::closing(state))
}

/// The state a new flow of `protocol` starts in when its first packet (a TCP segment's flags
/// in `tcp_flags`) comes from the original side.
#[inline(always)]
pub const fn first_state(protocol: u8, tcp_flags: u8) -> u8 {
    if protocol == proto::TCP {
        // A SYN opens; anything else picks a connection up mid-stream (conntrack's loose
        // mode), which its table puts in ESTABLISHED from NONE on an ACK.
        match tcp_next(tcp::NONE, Side::Original, Segment::of(tcp_flags) as u8) {
            TCP_IGNORE | TCP_INVALID => tcp::ESTABLISHED,
            state => state,
        }
    } else {
        datagram::UNREPLIED
    }
}

/// One direction of a TCP connection as conntrack tracks it (`struct ip_ct_tcp_state`): what
/// that direction's sender has sent and offered. Each half of a flow holds its own sender's,
/// written only by the program that sees that direction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Window {
    /// The highest sequence number sent plus that segment's length (`td_end`).
    pub end: u32,
    /// The highest acknowledgement sent (`td_maxack`), valid with [`WINDOW_MAXACK`].
    pub max_ack: u32,
    /// The highest acknowledgement plus window offered: how far the other end may send (what
    /// conntrack keeps as the other direction's `td_maxend`).
    pub offered_end: u32,
    /// The largest window offered, scaled (`td_maxwin`); zero until the direction is tracked.
    pub max_window: u32,
    /// The sender's window scale (`td_scale`): what its window fields are shifted by once the
    /// handshake agreed on scaling. On a flow still in SYN_SENT, what the originator's SYN
    /// announced ([`NO_WINDOW_SCALE`] if it announced none).
    pub scale: u8,
    /// `WINDOW_*` bits.
    pub flags: u8,
    /// Keeps the layout free of implicit padding; always zero.
    pub pad: [u8; 2],
}

/// [`Window::scale`]: the SYN announced no window scaling.
pub const NO_WINDOW_SCALE: u8 = 0xff;
/// The largest window scale TCP allows (RFC 7323).
pub const MAX_WINDOW_SCALE: u8 = 14;
/// [`Window::flags`]: the direction is tracked (its sender has sent a segment masq saw).
pub const WINDOW_TRACKED: u8 = 1 << 0;
/// [`Window::flags`]: [`Window::max_ack`] holds an acknowledgement (conntrack's
/// `IP_CT_TCP_FLAG_MAXACK_SET`).
pub const WINDOW_MAXACK: u8 = 1 << 1;
/// [`Window::flags`]: masq did not see the handshake (a connection picked up mid-stream):
/// windows cannot be checked, and every FIN and RST counts, as conntrack is liberal with a
/// connection it picked up.
pub const WINDOW_LIBERAL: u8 = 1 << 2;
/// [`Window::flags`]: this direction's FIN was accepted, at [`Window::end`]. A later segment
/// of this sender that goes past it shows the FIN was not the sender's: the close is undone.
pub const WINDOW_FIN: u8 = 1 << 3;

/// conntrack's `MAXACKWINCONST`: how far behind the receiver's end an acknowledgement may lie
/// when the sender's window is smaller.
const MAX_ACK_WINDOW: u32 = 66_000;

/// A TCP segment as the window tracking reads it. Also what the egress program hands the
/// allocator about a new flow's first segment, so it has the layout of a map value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpSegment {
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number (meaningful with the ACK flag).
    pub ack: u32,
    /// Bytes of payload.
    pub len: u32,
    /// The window field, unscaled.
    pub window: u16,
    /// The header's flag byte.
    pub flags: u8,
    /// The window scale option of a SYN or SYN-ACK, or [`NO_WINDOW_SCALE`].
    pub scale: u8,
}

crate::impl_pod!(TcpSegment, Window);

/// Whether `segment` carries an acknowledgement to record (a RST with the ACK flag and a zero
/// acknowledgement, from broken stacks, does not).
#[inline(always)]
const fn acknowledges(segment: &TcpSegment) -> bool {
    segment.has(tcp_flags::ACK) && !(segment.has(tcp_flags::RST) && segment.ack == 0)
}

/// `a` comes before `b` in sequence space.
#[inline(always)]
const fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` comes after `b` in sequence space.
#[inline(always)]
const fn after(a: u32, b: u32) -> bool {
    before(b, a)
}

/// The later of two sequence numbers.
#[inline(always)]
const fn latest(a: u32, b: u32) -> u32 {
    if after(b, a) { b } else { a }
}

impl TcpSegment {
    /// The sequence number after the segment: its payload, and one for a SYN or a FIN
    /// (`segment_seq_plus_len`).
    #[inline(always)]
    pub const fn end(&self) -> u32 {
        let mut end = self.seq.wrapping_add(self.len);
        if self.flags & tcp_flags::SYN != 0 {
            end = end.wrapping_add(1);
        }
        if self.flags & tcp_flags::FIN != 0 {
            end = end.wrapping_add(1);
        }
        end
    }

    const fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

impl Window {
    /// Nothing tracked: a direction masq has not seen a segment of, or a protocol without
    /// windows.
    pub const EMPTY: Self = Self {
        end: 0,
        max_ack: 0,
        offered_end: 0,
        max_window: 0,
        scale: 0,
        flags: 0,
        pad: [0; 2],
    };

    /// The window of a direction whose first segment masq sees is `segment`: a SYN or a SYN-ACK
    /// (`tcp_init_sender`), which announces its window scale; or, with `liberal`, a segment of a
    /// connection picked up mid-stream, whose scale cannot be known.
    #[inline(always)]
    pub const fn first(segment: &TcpSegment, liberal: bool) -> Self {
        let end = segment.end();
        let window = if segment.window == 0 {
            1
        } else {
            segment.window as u32
        };
        let mut flags = WINDOW_TRACKED;
        let mut max_ack = 0;
        let mut offered_end = 0;
        if liberal {
            flags |= WINDOW_LIBERAL;
        }
        if segment.has(tcp_flags::ACK) {
            flags |= WINDOW_MAXACK;
            max_ack = segment.ack;
            offered_end = segment.ack.wrapping_add(window);
        }
        Self {
            end,
            max_ack,
            offered_end,
            max_window: window,
            scale: if segment.has(tcp_flags::SYN) {
                segment.scale
            } else {
                0
            },
            flags,
            pad: [0; 2],
        }
    }

    /// This direction's window scale in effect: none until both SYNs agreed on scaling.
    #[inline(always)]
    pub const fn effective_scale(&self) -> u8 {
        if self.scale > MAX_WINDOW_SCALE {
            0
        } else {
            self.scale
        }
    }

    /// The window after its sender sent `segment` (conntrack's update of `td_end`,
    /// `td_maxack`, `td_maxwin` and the other direction's `td_maxend`). Every value only moves
    /// forward, so a segment that changes nothing leaves the window as it was, and the
    /// datapath, which writes only what differs, writes nothing. Each field is computed apart
    /// from the window as it was ([`Window::flags_after`], [`Window::end_after`], ...), so that
    /// the datapath can write them one at a time.
    #[inline(always)]
    pub const fn after_sending(&self, segment: &TcpSegment) -> Self {
        Self {
            end: self.end_after(segment),
            max_ack: self.max_ack_after(segment),
            offered_end: self.offered_end_after(segment),
            max_window: self.max_window_after(segment),
            scale: self.scale,
            flags: self.flags_after(segment),
            pad: self.pad,
        }
    }

    /// [`Window::end`] after `segment`: the furthest sequence sent.
    #[inline(always)]
    pub const fn end_after(&self, segment: &TcpSegment) -> u32 {
        latest(self.end, segment.end())
    }

    /// [`Window::flags`] after `segment`: an acknowledgement recorded, and a FIN forgotten when
    /// data goes past it (the FIN was not this sender's).
    #[inline(always)]
    pub const fn flags_after(&self, segment: &TcpSegment) -> u8 {
        let mut flags = self.flags;
        if flags & WINDOW_FIN != 0 && !segment.has(tcp_flags::FIN) && after(segment.end(), self.end)
        {
            flags &= !WINDOW_FIN;
        }
        if acknowledges(segment) {
            flags |= WINDOW_MAXACK;
        }
        flags
    }

    /// [`Window::max_window`] after `segment`.
    #[inline(always)]
    pub const fn max_window_after(&self, segment: &TcpSegment) -> u32 {
        let window = self.offered(segment);
        if window > self.max_window {
            window
        } else {
            self.max_window
        }
    }

    /// [`Window::max_ack`] after `segment`.
    #[inline(always)]
    pub const fn max_ack_after(&self, segment: &TcpSegment) -> u32 {
        if acknowledges(segment)
            && (self.flags & WINDOW_MAXACK == 0 || after(segment.ack, self.max_ack))
        {
            segment.ack
        } else {
            self.max_ack
        }
    }

    /// [`Window::offered_end`] after `segment`.
    #[inline(always)]
    pub const fn offered_end_after(&self, segment: &TcpSegment) -> u32 {
        let offered = segment.ack.wrapping_add(self.offered(segment));
        if acknowledges(segment) && (self.offered_end == 0 || after(offered, self.offered_end)) {
            offered
        } else {
            self.offered_end
        }
    }

    /// The window `segment` offers, scaled (a SYN's never is).
    #[inline(always)]
    const fn offered(&self, segment: &TcpSegment) -> u32 {
        if segment.has(tcp_flags::SYN) {
            segment.window as u32
        } else {
            (segment.window as u32) << self.effective_scale()
        }
    }

    /// Whether the window of a sender that sent a FIN from `segment`: its FIN is recorded.
    #[inline(always)]
    pub const fn with_fin(&self, segment: &TcpSegment) -> Self {
        let mut next = *self;
        next.flags |= WINDOW_FIN;
        next.end = latest(next.end, segment.end());
        next
    }
}

/// Whether `segment`, from the sender whose window is `sender` towards the receiver whose
/// window is `receiver`, lies where conntrack's `tcp_in_window` accepts it: its sequence not
/// past what the receiver offered (I), not further behind the sender's end than the receiver's
/// largest window (II), and its acknowledgement neither ahead of what the receiver sent (III)
/// nor further behind than the largest window (IV). `sender` is the window as it was before
/// the segment. A direction not tracked yet is judged on the checks that do not need it, as
/// conntrack starts tracking it from that very segment.
#[inline(always)]
pub const fn in_window(
    sender: &Window,
    receiver: &Window,
    segment: &TcpSegment,
    state: u8,
) -> bool {
    if liberal(sender, receiver) {
        return true;
    }
    let mut seq = segment.seq;
    let mut end = segment.end();
    let sender_tracked = sender.flags & WINDOW_TRACKED != 0;
    let receiver_tracked = receiver.flags & WINDOW_TRACKED != 0;
    if segment.has(tcp_flags::RST) && seq == 0 && state == tcp::SYN_SENT {
        // A RST answering a SYN carries sequence zero.
        let own = if sender_tracked { sender.end } else { end };
        seq = own;
        end = own;
    }
    // No acknowledgement (or a broken stack's zero one on a RST): as if it acknowledged what
    // the receiver sent.
    let ack = if !segment.has(tcp_flags::ACK) || (segment.has(tcp_flags::RST) && segment.ack == 0) {
        receiver.end
    } else {
        segment.ack
    };
    // I. The upper bound: what the receiver offered, or, before it offered anything, the end
    // of what the sender itself sent first (its SYN-ACK, say).
    let upper = if receiver.flags & WINDOW_MAXACK != 0 {
        latest(
            receiver.offered_end,
            if sender_tracked { sender.end } else { end },
        )
    } else if sender_tracked {
        sender.end
    } else {
        end
    };
    if after(seq, upper) {
        return false;
    }
    if !receiver_tracked {
        return true;
    }
    // II. The lower bound.
    if sender_tracked
        && !after(
            end,
            sender.end.wrapping_sub(receiver.max_window).wrapping_sub(1),
        )
    {
        return false;
    }
    // III and IV. The acknowledgement.
    let max_ack_window = if sender.max_window > MAX_ACK_WINDOW {
        sender.max_window
    } else {
        MAX_ACK_WINDOW
    };
    !after(ack, receiver.end)
        && after(
            ack,
            receiver.end.wrapping_sub(max_ack_window).wrapping_sub(1),
        )
}

/// A TCP flow as the state machine reads it: the state both halves hold, and the reply half's
/// knowledge of whether an answer came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpFlow {
    /// `tcp::*` state.
    pub state: u8,
    /// The handshake completed.
    pub assured: bool,
    /// The last segment was an accepted RST that did not close the connection (conntrack keeps
    /// the state, for a challenge ACK, but gives it the CLOSE timeout).
    pub reset: bool,
    /// A packet came from the reply side before this one (conntrack's `IPS_SEEN_REPLY`).
    pub replied: bool,
}

/// What one TCP segment does to its flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpOutcome {
    /// The flow stays as it is (a segment of the current state, or one the table ignores).
    Unchanged,
    /// The flow moves on to this.
    Moved(TcpFlow),
    /// A SYN reuses the tuple of a connection that was over (TIME_WAIT, CLOSE): a new
    /// connection begins in SYN_SENT, on the same mapping, with nothing of the old one kept.
    Reopened,
    /// A FIN, RST or SYN-ACK from the remote end outside the window: it changes nothing, and
    /// is counted.
    OutOfWindow,
    /// The flow is over now: a RST while no answer had come (conntrack deletes such an entry
    /// at once: "if only reply is a RST, we can consider ourselves not to have an established
    /// connection").
    Killed,
}

impl TcpOutcome {
    /// The outcome as one word: what the datapath passes through a map so that the verifier
    /// meets the code after it in one state, whichever way the judgement went. Read back with
    /// [`TcpOutcome::decode`].
    #[inline(always)]
    pub const fn encode(self) -> u32 {
        match self {
            Self::Unchanged => 0,
            Self::Moved(flow) => {
                1 | (flow.state as u32) << 8
                    | (flow.assured as u32) << 16
                    | (flow.reset as u32) << 17
                    | (flow.replied as u32) << 18
            }
            Self::Reopened => 2,
            Self::OutOfWindow => 3,
            Self::Killed => 4,
        }
    }

    /// The outcome [`TcpOutcome::encode`] made `word` of (any other word: unchanged).
    #[inline(always)]
    pub const fn decode(word: u32) -> Self {
        match word & 0xff {
            1 => Self::Moved(TcpFlow {
                state: (word >> 8) as u8,
                assured: word & 1 << 16 != 0,
                reset: word & 1 << 17 != 0,
                replied: word & 1 << 18 != 0,
            }),
            2 => Self::Reopened,
            3 => Self::OutOfWindow,
            4 => Self::Killed,
            _ => Self::Unchanged,
        }
    }
}

/// What `segment` from `side` does to the TCP flow `flow`, whose halves' windows are `sender`
/// (the segment's sender, before this segment) and `receiver`. A segment from the local end
/// (`trusted`: the pod's or the node's own stack) is taken as it is; a FIN, RST or SYN-ACK from
/// the remote end must lie in the window. Mirrors `nf_conntrack_tcp_packet`: the checks of the
/// windows ([`tcp_checks`]), then the judgement on them ([`tcp_judge`]).
#[inline(always)]
pub const fn tcp_segment(
    flow: TcpFlow,
    side: Side,
    segment: &TcpSegment,
    sender: &Window,
    receiver: &Window,
    trusted: bool,
) -> TcpOutcome {
    let kind = Segment::of(segment.flags);
    tcp_judge(
        flow,
        side,
        kind,
        tcp_checks(flow, kind, segment, sender, receiver, trusted),
    )
}

/// What the judgement of a TCP segment needs of the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpChecks {
    /// The segment may move the flow: it comes from the local end, or needs no check, or lies
    /// in the window (a RST also not below the local end's acknowledgement).
    pub acceptable: bool,
    /// A RST closes the connection, rather than leave its state for a challenge ACK.
    pub closes: bool,
}

impl TcpChecks {
    /// The checks for a segment of `kind` (from the local end if `trusted`), given what
    /// [`in_window`], [`rst_below_ack`] and [`rst_closes`] said of it: what the datapath
    /// computes one by one, so that the verifier meets each in one state.
    #[inline(always)]
    pub const fn combine(
        kind: Segment,
        trusted: bool,
        in_window: bool,
        rst_below_ack: bool,
        rst_closes: bool,
    ) -> Self {
        let checked = !trusted && matches!(kind, Segment::Rst | Segment::Fin | Segment::SynAck);
        let below = matches!(kind, Segment::Rst) && rst_below_ack;
        Self {
            acceptable: !checked || (in_window && !below),
            closes: trusted || rst_closes,
        }
    }
}

/// The window checks of `segment` (of `kind`) on `flow` (see [`tcp_segment`]).
#[inline(always)]
pub const fn tcp_checks(
    flow: TcpFlow,
    kind: Segment,
    segment: &TcpSegment,
    sender: &Window,
    receiver: &Window,
    trusted: bool,
) -> TcpChecks {
    TcpChecks::combine(
        kind,
        trusted,
        in_window(sender, receiver, segment, flow.state),
        rst_below_ack(flow, segment, sender, receiver),
        rst_closes(flow, segment, sender, receiver),
    )
}

/// What a segment of `kind` from `side`, checked as `checks` says, does to `flow`: conntrack's
/// transition, with its rules for RSTs (one that is the only answer ends the flow at once), for
/// reopening a closed tuple, and for assurance (the originator's ACK completing the handshake,
/// or an answer to a connection picked up).
#[inline(always)]
pub const fn tcp_judge(flow: TcpFlow, side: Side, kind: Segment, checks: TcpChecks) -> TcpOutcome {
    tcp_judge_move(
        flow,
        side,
        kind,
        tcp_next(flow.state, side, kind as u8),
        checks,
    )
}

/// [`tcp_judge`], the transition (`tcp_next` of the flow's state, side and kind) given.
#[inline(always)]
pub const fn tcp_judge_move(
    flow: TcpFlow,
    side: Side,
    kind: Segment,
    next: u8,
    checks: TcpChecks,
) -> TcpOutcome {
    if next == TCP_INVALID || next == TCP_IGNORE {
        return TcpOutcome::Unchanged;
    }
    if !checks.acceptable {
        return TcpOutcome::OutOfWindow;
    }
    if matches!(kind, Segment::Rst) {
        if !flow.replied {
            return TcpOutcome::Killed;
        }
        return TcpOutcome::Moved(TcpFlow {
            state: if checks.closes { next } else { flow.state },
            assured: flow.assured,
            reset: !checks.closes,
            replied: flow.replied,
        });
    }
    if next == tcp::SYN_SENT && (flow.state == tcp::TIME_WAIT || flow.state == tcp::CLOSE) {
        return TcpOutcome::Reopened;
    }
    let assured = flow.assured
        || (flow.replied
            && next == tcp::ESTABLISHED
            && (flow.state == tcp::SYN_RECV || flow.state == tcp::ESTABLISHED));
    let moved = TcpFlow {
        state: next,
        assured,
        reset: false,
        replied: flow.replied || matches!(side, Side::Reply),
    };
    if moved.state == flow.state
        && moved.assured == flow.assured
        && moved.reset == flow.reset
        && moved.replied == flow.replied
    {
        TcpOutcome::Unchanged
    } else {
        TcpOutcome::Moved(moved)
    }
}

/// Whether the connection is established as conntrack's `nf_conntrack_tcp_established` says:
/// ESTABLISHED and assured.
const fn established(flow: TcpFlow) -> bool {
    flow.state == tcp::ESTABLISHED && flow.assured
}

const fn liberal(sender: &Window, receiver: &Window) -> bool {
    (sender.flags | receiver.flags) & WINDOW_LIBERAL != 0
}

/// conntrack's "invalid rst": a RST below the local end's highest acknowledgement is never
/// accepted (except one with sequence zero answering a SYN, before the connection is
/// established).
#[inline(always)]
pub const fn rst_below_ack(
    flow: TcpFlow,
    segment: &TcpSegment,
    sender: &Window,
    receiver: &Window,
) -> bool {
    if liberal(sender, receiver) || receiver.flags & WINDOW_MAXACK == 0 {
        return false;
    }
    if segment.seq == 0 && !established(flow) {
        return false;
    }
    before(segment.seq, receiver.max_ack)
}

/// Whether an in-window RST from the remote end of an answered connection closes it, as
/// conntrack decides: on a connection not established yet, always; on an established one, when
/// its sequence is the local end's highest acknowledgement exactly, or it ends the remote's own
/// data (a RST right after its last segment). Any other in-window RST may be answered by a
/// challenge ACK (RFC 5961), so the connection keeps its state with the CLOSE timeout until the
/// endpoints carry on.
#[inline(always)]
pub const fn rst_closes(
    flow: TcpFlow,
    segment: &TcpSegment,
    sender: &Window,
    receiver: &Window,
) -> bool {
    if liberal(sender, receiver) || receiver.flags & WINDOW_MAXACK == 0 {
        return true;
    }
    if !established(flow) || segment.seq == receiver.max_ack {
        return true;
    }
    sender.flags & WINDOW_TRACKED != 0 && segment.seq == sender.end
}

/// conntrack's default timeouts, in nanoseconds: how long a flow may stay idle in each state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// By `tcp::*` state (`nf_conntrack_tcp_timeout_*`).
    pub tcp: [u64; tcp::STATES],
    /// An ESTABLISHED connection that never saw an answer (picked up mid-stream):
    /// `nf_conntrack_tcp_timeout_unacknowledged`.
    pub tcp_unacknowledged: u64,
    /// UDP not yet a stream (`nf_conntrack_udp_timeout`).
    pub udp: u64,
    /// A UDP stream (`nf_conntrack_udp_timeout_stream`).
    pub udp_stream: u64,
    /// ICMP and ICMPv6 queries (`nf_conntrack_icmp_timeout`, `nf_conntrack_icmpv6_timeout`).
    pub icmp: u64,
    /// Any other protocol (`nf_conntrack_generic_timeout`).
    pub generic: u64,
}

const SECOND_NS: u64 = 1_000_000_000;

impl Timeouts {
    /// Linux's defaults.
    pub const LINUX_DEFAULTS: Self = Self {
        tcp: [
            120 * SECOND_NS,     // NONE (a new connection, as SYN_SENT)
            120 * SECOND_NS,     // SYN_SENT
            60 * SECOND_NS,      // SYN_RECV
            432_000 * SECOND_NS, // ESTABLISHED
            120 * SECOND_NS,     // FIN_WAIT
            60 * SECOND_NS,      // CLOSE_WAIT
            30 * SECOND_NS,      // LAST_ACK
            120 * SECOND_NS,     // TIME_WAIT
            10 * SECOND_NS,      // CLOSE
            120 * SECOND_NS,     // SYN_SENT2
        ],
        tcp_unacknowledged: 300 * SECOND_NS,
        udp: 30 * SECOND_NS,
        udp_stream: 120 * SECOND_NS,
        icmp: 30 * SECOND_NS,
        generic: 600 * SECOND_NS,
    };

    /// How long a flow of `protocol` in `state` may stay idle. `reset`: the last TCP segment
    /// was an accepted RST (see [`TcpFlow::reset`]).
    #[inline(always)]
    pub const fn lifetime(&self, protocol: u8, state: u8, assured: bool, reset: bool) -> u64 {
        match protocol {
            proto::TCP => {
                if reset {
                    return self.tcp[tcp::CLOSE as usize];
                }
                let by_state = if (state as usize) < tcp::STATES {
                    self.tcp[state as usize]
                } else {
                    self.tcp[tcp::CLOSE as usize]
                };
                if state == tcp::ESTABLISHED && !assured && by_state > self.tcp_unacknowledged {
                    self.tcp_unacknowledged
                } else {
                    by_state
                }
            }
            proto::UDP => {
                if state == datagram::STREAM {
                    self.udp_stream
                } else {
                    self.udp
                }
            }
            proto::ICMP | proto::ICMPV6 => self.icmp,
            _ => self.generic,
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Self::LINUX_DEFAULTS
    }
}

/// The kind of flow an eviction took, for counting.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowClass {
    /// TCP, no answer yet (SYN_SENT).
    TcpUnanswered = 0,
    /// TCP answered but not assured (the handshake not completed, or picked up).
    TcpUnassured = 1,
    /// TCP being torn down (only the garbage collector's reserve takes those).
    TcpClosing = 2,
    /// UDP or another datagram protocol, no answer yet.
    Unreplied = 3,
    /// UDP or another datagram protocol, answered but not a stream.
    Replied = 4,
    /// ICMP query.
    Icmp = 5,
    /// UDP opened from outside towards a pod, not yet a stream.
    Inbound = 6,
}

impl FlowClass {
    /// Every class, in index order.
    pub const ALL: [Self; 7] = [
        Self::TcpUnanswered,
        Self::TcpUnassured,
        Self::TcpClosing,
        Self::Unreplied,
        Self::Replied,
        Self::Icmp,
        Self::Inbound,
    ];

    /// The class of a flow of `protocol` in `state`, opened from outside if `inbound`.
    #[inline(always)]
    pub const fn of(protocol: u8, state: u8, inbound: bool) -> Self {
        if inbound {
            Self::Inbound
        } else if protocol == proto::TCP {
            if state == tcp::SYN_SENT || state == tcp::NONE {
                Self::TcpUnanswered
            } else if tcp::closing(state) {
                Self::TcpClosing
            } else {
                Self::TcpUnassured
            }
        } else if is_icmp(protocol) {
            Self::Icmp
        } else if state == datagram::UNREPLIED {
            Self::Unreplied
        } else {
            Self::Replied
        }
    }

    /// The label metrics and `masq status` use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::TcpUnanswered => "tcp_unanswered",
            Self::TcpUnassured => "tcp_unassured",
            Self::TcpClosing => "tcp_closing",
            Self::Unreplied => "unreplied",
            Self::Replied => "replied",
            Self::Icmp => "icmp",
            Self::Inbound => "inbound",
        }
    }
}

/// Why a flow was evicted.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EvictionCause {
    /// The table was full and a new flow needed room (conntrack's `early_drop`).
    TableFull = 0,
    /// The new flow's pod held its whole share of the table in unassured flows: one of its
    /// own made room.
    HolderShare = 1,
    /// The garbage collector keeps room free while the table is nearly full.
    Reserve = 2,
    /// A remote endpoint had no node port left for a pod's new flow: a flow of a pod holding
    /// more of that remote's ports gave one up.
    RemoteShare = 3,
}

impl EvictionCause {
    /// Every cause, in index order.
    pub const ALL: [Self; 4] = [
        Self::TableFull,
        Self::HolderShare,
        Self::Reserve,
        Self::RemoteShare,
    ];

    /// The label metrics and `masq status` use.
    pub const fn name(self) -> &'static str {
        match self {
            Self::TableFull => "table_full",
            Self::HolderShare => "holder_share",
            Self::Reserve => "reserve",
            Self::RemoteShare => "remote_share",
        }
    }
}

/// Slots of an evictions counter map: one per cause and class.
pub const EVICTION_SLOTS: u32 = (EvictionCause::ALL.len() * FlowClass::ALL.len()) as u32;

/// The slot of the evictions counter map that counts `class` evicted for `cause`.
#[inline(always)]
pub const fn eviction_slot(cause: EvictionCause, class: FlowClass) -> u32 {
    cause as u32 * FlowClass::ALL.len() as u32 + class as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts::LINUX_DEFAULTS;

    fn segment(flags: u8, seq: u32, ack: u32, len: u32, window: u16) -> TcpSegment {
        TcpSegment {
            flags,
            seq,
            ack,
            len,
            window,
            scale: NO_WINDOW_SCALE,
        }
    }

    const SYN: u8 = tcp_flags::SYN;
    const SYNACK: u8 = tcp_flags::SYN | tcp_flags::ACK;
    const ACK: u8 = tcp_flags::ACK;
    const FIN: u8 = tcp_flags::FIN | tcp_flags::ACK;
    const RST: u8 = tcp_flags::RST;

    /// Rows of conntrack's table as its comments give them, state by state: the transitions a
    /// reader can check against `nf_conntrack_proto_tcp.c` line by line.
    #[test]
    fn transitions_are_conntracks() {
        use Segment::*;
        use Side::*;
        let cases: &[(u8, Side, Segment, u8)] = &[
            (tcp::NONE, Original, Syn, tcp::SYN_SENT),
            (tcp::SYN_SENT, Original, Syn, tcp::SYN_SENT),
            (tcp::ESTABLISHED, Original, Syn, TCP_IGNORE),
            (tcp::TIME_WAIT, Original, Syn, tcp::SYN_SENT),
            (tcp::CLOSE, Original, Syn, tcp::SYN_SENT),
            (tcp::SYN_SENT, Reply, Syn, tcp::SYN_SENT2),
            (tcp::TIME_WAIT, Reply, Syn, tcp::SYN_SENT),
            (tcp::SYN_SENT, Reply, SynAck, tcp::SYN_RECV),
            (tcp::SYN_SENT2, Reply, SynAck, tcp::SYN_RECV),
            (tcp::SYN_RECV, Reply, SynAck, TCP_IGNORE),
            (tcp::SYN_SENT, Original, SynAck, TCP_INVALID),
            (tcp::SYN_SENT2, Original, SynAck, tcp::SYN_RECV),
            (tcp::SYN_RECV, Original, Ack, tcp::ESTABLISHED),
            (tcp::SYN_SENT, Original, Ack, TCP_INVALID),
            (tcp::SYN_SENT, Reply, Ack, TCP_IGNORE),
            (tcp::SYN_RECV, Reply, Ack, tcp::SYN_RECV),
            (tcp::NONE, Original, Ack, tcp::ESTABLISHED),
            (tcp::ESTABLISHED, Original, Fin, tcp::FIN_WAIT),
            (tcp::ESTABLISHED, Reply, Fin, tcp::FIN_WAIT),
            (tcp::SYN_SENT, Original, Fin, TCP_INVALID),
            (tcp::FIN_WAIT, Reply, Ack, tcp::CLOSE_WAIT),
            (tcp::FIN_WAIT, Reply, Fin, tcp::LAST_ACK),
            (tcp::CLOSE_WAIT, Original, Fin, tcp::LAST_ACK),
            (tcp::LAST_ACK, Original, Ack, tcp::TIME_WAIT),
            (tcp::LAST_ACK, Reply, Ack, tcp::TIME_WAIT),
            (tcp::TIME_WAIT, Original, Ack, tcp::TIME_WAIT),
            (tcp::CLOSE, Original, Ack, tcp::CLOSE),
            (tcp::SYN_SENT, Reply, Rst, tcp::CLOSE),
            (tcp::ESTABLISHED, Reply, Rst, tcp::CLOSE),
            (tcp::NONE, Original, Rst, TCP_INVALID),
            (tcp::ESTABLISHED, Original, None, TCP_INVALID),
        ];
        for &(state, side, segment, next) in cases {
            assert_eq!(
                tcp_next(state, side, segment as u8),
                next,
                "{} + {side:?} {segment:?}",
                tcp::name(state)
            );
        }
        assert_eq!(tcp_next(42, Original, Ack as u8), TCP_INVALID);
        assert_eq!(tcp_next(tcp::ESTABLISHED, Original, 7), TCP_INVALID);
    }

    #[test]
    fn flags_make_conntracks_segment_kinds() {
        assert_eq!(Segment::of(SYN), Segment::Syn);
        assert_eq!(Segment::of(SYNACK), Segment::SynAck);
        assert_eq!(Segment::of(FIN), Segment::Fin);
        assert_eq!(Segment::of(ACK), Segment::Ack);
        assert_eq!(Segment::of(RST | ACK), Segment::Rst);
        assert_eq!(Segment::of(SYN | RST), Segment::Rst);
        assert_eq!(Segment::of(0), Segment::None);
        assert_eq!(Segment::of(0x08 /* PSH */ | ACK), Segment::Ack);
    }

    /// A handshake as masq sees it from the middle: the pod's SYN, the remote's SYN-ACK, the
    /// pod's ACK. Returns the flow and both windows after each step's checks.
    struct Connection {
        flow: TcpFlow,
        pod: Window,
        remote: Window,
    }

    impl Connection {
        fn open() -> Self {
            let syn = TcpSegment {
                scale: 7,
                ..segment(SYN, 1_000, 0, 0, 64_240)
            };
            let mut connection = Self {
                flow: TcpFlow {
                    state: first_state(proto::TCP, SYN),
                    assured: false,
                    reset: false,
                    replied: false,
                },
                pod: Window::first(&syn, false),
                remote: Window::default(),
            };
            assert_eq!(connection.flow.state, tcp::SYN_SENT);
            let synack = TcpSegment {
                scale: 9,
                ..segment(SYNACK, 50_000, 1_001, 0, 65_160)
            };
            connection.remote_sends(&synack);
            assert_eq!(connection.flow.state, tcp::SYN_RECV);
            assert!(!connection.flow.assured, "a SYN-ACK alone does not assure");
            connection.pod_sends(&segment(ACK, 1_001, 50_001, 0, 502));
            assert_eq!(connection.flow.state, tcp::ESTABLISHED);
            assert!(connection.flow.assured);
            connection
        }

        fn apply(&mut self, outcome: TcpOutcome) -> TcpOutcome {
            if let TcpOutcome::Moved(flow) = outcome {
                self.flow = flow;
            }
            outcome
        }

        fn pod_sends(&mut self, segment: &TcpSegment) -> TcpOutcome {
            let outcome = tcp_segment(
                self.flow,
                Side::Original,
                segment,
                &self.pod,
                &self.remote,
                true,
            );
            self.pod = self.pod.after_sending(segment);
            if matches!(Segment::of(segment.flags), Segment::Fin) {
                self.pod = self.pod.with_fin(segment);
            }
            self.apply(outcome)
        }

        fn remote_sends(&mut self, segment: &TcpSegment) -> TcpOutcome {
            let outcome = tcp_segment(
                self.flow,
                Side::Reply,
                segment,
                &self.remote,
                &self.pod,
                false,
            );
            if !matches!(outcome, TcpOutcome::OutOfWindow) {
                self.remote = if self.remote.flags & WINDOW_TRACKED == 0 {
                    Window::first(segment, false)
                } else {
                    self.remote.after_sending(segment)
                };
                if segment.flags & tcp_flags::SYN != 0 {
                    // Both SYNs announced scaling: each side's scale holds.
                    if self.pod.scale == NO_WINDOW_SCALE || segment.scale == NO_WINDOW_SCALE {
                        self.pod.scale = 0;
                        self.remote.scale = 0;
                    }
                }
            }
            self.apply(outcome)
        }
    }

    #[test]
    fn the_handshake_assures_on_the_originators_ack_only() {
        let connection = Connection::open();
        assert_eq!(connection.pod.scale, 7);
        assert_eq!(connection.remote.scale, 9);
        // The pod's ACK offered 502 << 7 bytes past what it acknowledged.
        assert_eq!(connection.pod.offered_end, 50_001 + (502 << 7));
        assert_eq!(
            T.lifetime(proto::TCP, connection.flow.state, true, false),
            T.tcp[tcp::ESTABLISHED as usize]
        );
    }

    #[test]
    fn a_rst_as_the_only_answer_ends_the_flow_at_once() {
        let syn = segment(SYN, 77, 0, 0, 64_240);
        let flow = TcpFlow {
            state: tcp::SYN_SENT,
            assured: false,
            reset: false,
            replied: false,
        };
        let pod = Window::first(&syn, false);
        // Linux answers a SYN to a closed port with RST|ACK, sequence 0, acknowledging the SYN.
        let refused = segment(RST | ACK, 0, 78, 0, 0);
        assert_eq!(
            tcp_segment(flow, Side::Reply, &refused, &Window::default(), &pod, false),
            TcpOutcome::Killed
        );
        // One that does not acknowledge the SYN is not the remote's: it changes nothing.
        let spoofed = segment(RST | ACK, 0, 500_000, 0, 0);
        assert_eq!(
            tcp_segment(flow, Side::Reply, &spoofed, &Window::default(), &pod, false),
            TcpOutcome::OutOfWindow
        );
        // The pod giving up on its own attempt ends it too.
        assert_eq!(
            tcp_segment(
                flow,
                Side::Original,
                &segment(RST, 78, 0, 0, 0),
                &pod,
                &Window::default(),
                true
            ),
            TcpOutcome::Killed
        );
    }

    #[test]
    fn a_synack_without_the_pods_ack_stays_unassured() {
        let mut connection = Connection::open();
        connection.flow = TcpFlow {
            state: tcp::SYN_RECV,
            assured: false,
            reset: false,
            replied: true,
        };
        // Retransmitted SYN-ACKs change nothing.
        let again = segment(SYNACK, 50_000, 1_001, 0, 65_160);
        assert_eq!(connection.remote_sends(&again), TcpOutcome::Unchanged);
        assert!(!connection.flow.assured);
        assert_eq!(
            T.lifetime(proto::TCP, connection.flow.state, false, false),
            60 * SECOND_NS
        );
    }

    #[test]
    fn the_close_runs_through_conntracks_states_and_timeouts() {
        let mut connection = Connection::open();
        connection.pod_sends(&segment(FIN, 1_001, 50_001, 0, 502));
        assert_eq!(connection.flow.state, tcp::FIN_WAIT);
        connection.remote_sends(&segment(ACK, 50_001, 1_002, 0, 509));
        assert_eq!(connection.flow.state, tcp::CLOSE_WAIT);
        connection.remote_sends(&segment(FIN, 50_001, 1_002, 0, 509));
        assert_eq!(connection.flow.state, tcp::LAST_ACK);
        connection.pod_sends(&segment(ACK, 1_002, 50_002, 0, 502));
        assert_eq!(connection.flow.state, tcp::TIME_WAIT);
        assert!(connection.flow.assured, "an assured flow stays assured");
        assert_eq!(
            T.lifetime(proto::TCP, tcp::TIME_WAIT, true, false),
            120 * SECOND_NS
        );
        assert!(reclaimable(proto::TCP, tcp::TIME_WAIT, true));
        assert!(!evictable(true));
    }

    /// The abort the issue found kept alive: the remote sends 4 MiB, the pod acknowledges part
    /// of it, and the remote aborts with a RST at its next sequence number, megabytes past the
    /// pod's last ACK but inside what the pod offered.
    #[test]
    fn a_rst_after_a_burst_ends_the_connection() {
        let mut connection = Connection::open();
        // The pod offers a scaled window of 6 MiB.
        connection.pod_sends(&segment(ACK, 1_001, 50_001, 0, 49_152));
        let mut seq = 50_001_u32;
        for _ in 0..(4 << 20) / 1_448 {
            connection.remote_sends(&segment(ACK, seq, 1_001, 1_448, 509));
            seq = seq.wrapping_add(1_448);
        }
        // The pod has acknowledged only a part.
        connection.pod_sends(&segment(ACK, 1_001, 50_001 + (1 << 20), 0, 49_152));
        let outcome = connection.remote_sends(&segment(RST, seq, 0, 0, 0));
        assert!(matches!(outcome, TcpOutcome::Moved(_)), "{outcome:?}");
        assert_eq!(connection.flow.state, tcp::CLOSE);
        assert_eq!(
            T.lifetime(
                proto::TCP,
                connection.flow.state,
                true,
                connection.flow.reset
            ),
            10 * SECOND_NS
        );
    }

    #[test]
    fn rsts_and_fins_outside_the_window_change_nothing() {
        let mut connection = Connection::open();
        connection.pod_sends(&segment(ACK, 1_001, 50_001, 0, 502));
        let before = connection.flow;
        // Past what the pod offered (502 << 7 = 64,256 bytes).
        for spoofed in [
            segment(RST, 50_001 + 70_000, 0, 0, 0),
            segment(FIN, 50_001 + 70_000, 1_001, 0, 509),
            segment(FIN, 50_001u32.wrapping_sub(1 << 30), 1_001, 0, 509),
            // Acknowledging data the pod never sent.
            segment(FIN, 50_001, 900_000, 0, 509),
        ] {
            assert_eq!(
                connection.remote_sends(&spoofed),
                TcpOutcome::OutOfWindow,
                "{spoofed:?}"
            );
        }
        assert_eq!(connection.flow, before);
        // conntrack's "invalid rst": below the pod's acknowledgement, even inside the window.
        assert_eq!(
            connection.remote_sends(&segment(RST, 50_000, 0, 0, 0)),
            TcpOutcome::OutOfWindow
        );
    }

    /// A RST inside the window but not where the endpoint expects it may be answered by a
    /// challenge ACK: the state stays, with the CLOSE timeout, until the endpoints carry on.
    #[test]
    fn an_in_window_rst_off_the_mark_keeps_the_state_until_the_endpoints_carry_on() {
        let mut connection = Connection::open();
        connection.pod_sends(&segment(ACK, 1_001, 50_001, 0, 502));
        connection.remote_sends(&segment(RST, 50_001 + 1_000, 0, 0, 0));
        assert_eq!(connection.flow.state, tcp::ESTABLISHED);
        assert!(connection.flow.reset);
        assert_eq!(
            T.lifetime(proto::TCP, connection.flow.state, true, true),
            10 * SECOND_NS
        );
        // The pod carries on: the RST was not the end.
        connection.pod_sends(&segment(ACK, 1_001, 50_001, 5, 502));
        assert!(!connection.flow.reset);
        assert_eq!(
            T.lifetime(
                proto::TCP,
                connection.flow.state,
                true,
                connection.flow.reset
            ),
            T.tcp[tcp::ESTABLISHED as usize]
        );
        // At the pod's acknowledgement exactly, it closes.
        connection.remote_sends(&segment(RST, 50_001, 0, 0, 0));
        assert_eq!(connection.flow.state, tcp::CLOSE);
    }

    #[test]
    fn data_past_a_fin_undoes_it() {
        let mut connection = Connection::open();
        connection.pod_sends(&segment(ACK, 1_001, 50_001, 0, 502));
        connection.remote = connection
            .remote
            .with_fin(&segment(FIN, 50_001, 1_001, 0, 509));
        assert_ne!(connection.remote.flags & WINDOW_FIN, 0);
        // A retransmission of the FIN keeps it; data beyond it undoes it.
        connection.remote = connection
            .remote
            .after_sending(&segment(FIN, 50_001, 1_001, 0, 509));
        assert_ne!(connection.remote.flags & WINDOW_FIN, 0);
        connection.remote = connection
            .remote
            .after_sending(&segment(ACK, 50_002, 1_001, 100, 509));
        assert_eq!(connection.remote.flags & WINDOW_FIN, 0);
    }

    #[test]
    fn a_picked_up_connection_is_liberal_and_short_lived_until_answered() {
        let picked = segment(ACK, 5_000, 9_000, 100, 300);
        assert_eq!(first_state(proto::TCP, picked.flags), tcp::ESTABLISHED);
        let pod = Window::first(&picked, true);
        // Unanswered: conntrack's unacknowledged timeout, not five days.
        assert_eq!(
            T.lifetime(proto::TCP, tcp::ESTABLISHED, false, false),
            300 * SECOND_NS
        );
        let flow = TcpFlow {
            state: tcp::ESTABLISHED,
            assured: false,
            reset: false,
            replied: false,
        };
        // Liberal: any FIN counts.
        let fin = segment(FIN, 123, 5_100, 0, 10);
        assert!(in_window(&Window::default(), &pod, &fin, tcp::ESTABLISHED));
        // The first answer assures it.
        let answer = segment(ACK, 9_000, 5_100, 0, 10);
        assert_eq!(
            tcp_segment(flow, Side::Reply, &answer, &Window::default(), &pod, false),
            TcpOutcome::Moved(TcpFlow {
                replied: true,
                ..flow
            })
        );
        let replied = TcpFlow {
            replied: true,
            ..flow
        };
        assert_eq!(
            tcp_segment(
                replied,
                Side::Original,
                &picked,
                &pod,
                &Window::default(),
                true
            ),
            TcpOutcome::Moved(TcpFlow {
                assured: true,
                ..replied
            })
        );
    }

    #[test]
    fn outcomes_survive_their_encoding() {
        let moved = TcpFlow {
            state: tcp::SYN_SENT2,
            assured: true,
            reset: false,
            replied: true,
        };
        for outcome in [
            TcpOutcome::Unchanged,
            TcpOutcome::Moved(moved),
            TcpOutcome::Moved(TcpFlow {
                reset: true,
                assured: false,
                ..moved
            }),
            TcpOutcome::Reopened,
            TcpOutcome::OutOfWindow,
            TcpOutcome::Killed,
        ] {
            assert_eq!(TcpOutcome::decode(outcome.encode()), outcome);
        }
    }

    #[test]
    fn sequence_space_wraps() {
        assert!(before(u32::MAX, 1));
        assert!(after(1, u32::MAX));
        assert_eq!(latest(u32::MAX - 5, 3), 3);
        let near_wrap = segment(ACK, u32::MAX - 10, 1, 100, 10);
        assert_eq!(near_wrap.end(), 89);
    }

    #[test]
    fn datagrams_become_streams_as_conntrack_assures_them() {
        let second = SECOND_NS;
        let began = 10 * second;
        let mut state = datagram::UNREPLIED;
        // The originator's retries change nothing.
        state = datagram_next(state, Side::Original, proto::UDP, began, began + 5 * second);
        assert_eq!(state, datagram::UNREPLIED);
        // The first answer, even late, only replies.
        state = datagram_next(state, Side::Reply, proto::UDP, began, began + 5 * second);
        assert_eq!(state, datagram::REPLIED);
        assert_eq!(T.lifetime(proto::UDP, state, false, false), 30 * second);
        // Any packet after that, more than two seconds in: a stream.
        state = datagram_next(state, Side::Original, proto::UDP, began, began + 5 * second);
        assert_eq!(state, datagram::STREAM);
        assert_eq!(T.lifetime(proto::UDP, state, true, false), 120 * second);
        // A query answered at once is no stream: DNS lives 30 s.
        let quick = datagram_next(
            datagram::REPLIED,
            Side::Original,
            proto::UDP,
            began,
            began + second,
        );
        assert_eq!(quick, datagram::REPLIED);
        // ICMP never becomes one.
        let ping = datagram_next(
            datagram::REPLIED,
            Side::Original,
            proto::ICMP,
            began,
            began + 9 * second,
        );
        assert_eq!(ping, datagram::REPLIED);
        assert_eq!(T.lifetime(proto::ICMPV6, ping, false, false), 30 * second);
        assert_eq!(T.lifetime(47, datagram::STREAM, true, false), 600 * second);
    }

    #[test]
    fn eviction_slots_are_dense() {
        let mut seen = [false; EVICTION_SLOTS as usize];
        for cause in EvictionCause::ALL {
            for class in FlowClass::ALL {
                let slot = eviction_slot(cause, class) as usize;
                assert!(!seen[slot]);
                seen[slot] = true;
            }
        }
        assert!(seen.iter().all(|&slot| slot));
        assert_eq!(
            FlowClass::of(proto::TCP, tcp::SYN_SENT, false),
            FlowClass::TcpUnanswered
        );
        assert_eq!(
            FlowClass::of(proto::UDP, datagram::REPLIED, true),
            FlowClass::Inbound
        );
        assert_eq!(
            FlowClass::of(proto::ICMPV6, datagram::UNREPLIED, false),
            FlowClass::Icmp
        );
    }
}
