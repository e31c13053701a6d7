//! What the programs tell TC to do with a packet.

use aya_ebpf::bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC};

/// Outcome of classifying one packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Let the packet continue (to the next tcx program, then the stack or the wire).
    Pass,
    /// Drop the packet; every drop has been counted by the caller.
    Drop,
}

impl Verdict {
    /// The TC return code. Passing returns "unspecified" (tcx: next program) rather than "ok"
    /// so that masq never short-circuits other programs attached to the uplink.
    #[inline(always)]
    pub(crate) const fn tc_action(self) -> i32 {
        match self {
            Self::Pass => TC_ACT_UNSPEC,
            Self::Drop => TC_ACT_SHOT,
        }
    }
}
