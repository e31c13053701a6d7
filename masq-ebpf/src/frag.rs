//! IPv4 fragments.
//!
//! Only the first fragment of a datagram carries the transport header, so only it can be
//! matched against a mapping. Its decision is remembered under (addresses, identification,
//! protocol) and applied to the later fragments, which need just the address rewritten: the
//! transport checksum in the first fragment already covers the whole datagram.

use aya_ebpf::{bindings::BPF_ANY, btf_maps::lpm_trie::Key, programs::TcContext};
use masq_common::{
    counters::Counter,
    layout::NOMASQ_KIND_LINK_LOCAL,
    nat::{Direction, FRAG_TRANSLATED, FRAG_UNTOUCHED, FragEntryV4, FragKeyV4},
};

use crate::{
    counters::count,
    maps::{FRAGS_V4, NOMASQ_V4},
    nat::now_ns,
    packet::Ipv4,
    rewrite::{self, End},
    verdict::Verdict,
};

#[inline(always)]
const fn key(ip: &Ipv4, direction: Direction) -> FragKeyV4 {
    FragKeyV4 {
        src_addr: ip.src,
        dst_addr: ip.dst,
        // IPv4 identifiers are 16 bits wide.
        id: ip.id as u16,
        protocol: ip.protocol,
        direction: direction as u8,
    }
}

/// Remembers what was done to the first fragment `ip`: translated to `addr`, or left alone
/// when `addr` is `None`. Does nothing for unfragmented packets.
#[inline(always)]
pub(crate) fn remember(ip: &Ipv4, direction: Direction, addr: Option<[u8; 4]>) {
    if !ip.is_first_fragment() {
        return;
    }
    let entry = FragEntryV4 {
        addr: addr.unwrap_or([0; 4]),
        decision: if addr.is_some() {
            FRAG_TRANSLATED
        } else {
            FRAG_UNTOUCHED
        },
        pad: [0; 3],
        created_ns: now_ns(),
    };
    // A full table only costs the later fragments their translation; nothing to do about it.
    let _ = FRAGS_V4.insert(key(ip, direction), entry, u64::from(BPF_ANY));
}

#[inline(always)]
fn remembered(ip: &Ipv4, direction: Direction) -> Option<FragEntryV4> {
    // SAFETY: the pointer comes from a successful lookup and is read once, immediately.
    FRAGS_V4
        .get_ptr(key(ip, direction))
        .map(|entry| unsafe { *entry })
}

/// A later fragment leaving the node.
#[inline(always)]
pub(crate) fn egress(ctx: &TcContext, node_ip: [u8; 4], ip: &Ipv4) -> Verdict {
    let translate_to = match remembered(ip, Direction::Egress) {
        Some(entry) if entry.decision == FRAG_TRANSLATED => entry.addr,
        Some(_) => {
            count(Counter::EgressFragmentPassed);
            return Verdict::Pass;
        }
        // The first fragment was not seen (reordered or lost): fall back on the policy.
        None if ip.src == node_ip => {
            count(Counter::EgressHostPassed);
            return Verdict::Pass;
        }
        None => match NOMASQ_V4.get(&Key::new(32, ip.dst)) {
            Some(&NOMASQ_KIND_LINK_LOCAL) => {
                count(Counter::EgressExemptLinkLocal);
                return Verdict::Pass;
            }
            Some(_) => {
                count(Counter::EgressExemptCidr);
                return Verdict::Pass;
            }
            None => node_ip,
        },
    };
    if rewrite::address(ctx, ip, End::Source, translate_to).is_err() {
        count(Counter::EgressDropRewriteFailed);
        return Verdict::Drop;
    }
    count(Counter::EgressFragmentTranslated);
    Verdict::Pass
}

/// A later fragment arriving for the node.
#[inline(always)]
pub(crate) fn ingress(ctx: &TcContext, ip: &Ipv4) -> Verdict {
    match remembered(ip, Direction::Ingress) {
        Some(entry) if entry.decision == FRAG_TRANSLATED => {
            if rewrite::address(ctx, ip, End::Destination, entry.addr).is_err() {
                count(Counter::IngressDropRewriteFailed);
                return Verdict::Drop;
            }
            count(Counter::IngressFragmentTranslated);
        }
        _ => count(Counter::IngressFragmentUnmatched),
    }
    Verdict::Pass
}
