//! IP fragments, of either family.
//!
//! Only the first fragment of a datagram carries the transport header, so only it can be
//! matched against a mapping. Its decision is remembered under (addresses, identification,
//! protocol) and applied to the later fragments, which need just the address rewritten: the
//! transport checksum in the first fragment already covers the whole datagram.

use aya_ebpf::{bindings::BPF_ANY, programs::TcContext};
use masq_common::{
    counters::Counter,
    nat::{Direction, FRAG_DROPPED, FRAG_TRANSLATED, FRAG_UNTOUCHED, FragEntry, FragKey},
    settings::Settings,
};

use crate::{
    clock::now_ns,
    counters::count_in,
    family::Family,
    packet::Ip,
    policy,
    rewrite::{self, End, Rewrite},
    verdict::Verdict,
};

#[inline(always)]
const fn key<A: Family>(ip: &Ip<A>, direction: Direction) -> FragKey<A> {
    FragKey {
        src_addr: ip.src,
        dst_addr: ip.dst,
        id: ip.id,
        protocol: ip.protocol,
        direction: direction as u8,
        pad: [0; 2],
    }
}

/// Remembers what was done to the first fragment `ip`: translated to `addr`, or left alone
/// when `addr` is `None`. Does nothing for unfragmented packets.
#[inline(always)]
pub(crate) fn remember<A: Family>(ip: &Ip<A>, direction: Direction, addr: Option<A>) {
    match addr {
        Some(addr) => record(ip, direction, addr, FRAG_TRANSLATED),
        // Any address: an untouched datagram's is never used.
        None => record(ip, direction, ip.src, FRAG_UNTOUCHED),
    }
}

/// Remembers that the first fragment `ip` is dropped (or about to be, unless a later step
/// records its translation): its later fragments are dropped too, so that no part of a
/// datagram masq could not translate leaves with the address it should not have. Does nothing
/// for unfragmented packets.
#[inline(always)]
pub(crate) fn remember_dropped<A: Family>(ip: &Ip<A>, direction: Direction) {
    record(ip, direction, ip.src, FRAG_DROPPED);
}

#[inline(always)]
fn record<A: Family>(ip: &Ip<A>, direction: Direction, addr: A, decision: u8) {
    if !ip.is_first_fragment() {
        return;
    }
    // Built field by field, the padding zeroed one volatile store per byte: from a literal,
    // LLVM merges the seven zero bytes of an IPv6 entry into a call to `memset`, a bpf-to-bpf
    // call whose frame Linux 6.1's verifier adds to the program's own (rounded up), which
    // pushed `masq_icmp6_egress` past 512 bytes.
    let mut entry = core::mem::MaybeUninit::<FragEntry<A>>::uninit();
    let fields = entry.as_mut_ptr();
    // SAFETY: every field of `entry` is written before it is read; the padding fields are
    // plain bytes (`[u8; N]`).
    let entry = unsafe {
        (&raw mut (*fields).addr).write(addr);
        (&raw mut (*fields).decision).write(decision);
        zero_volatile((&raw mut (*fields).pad).cast(), size_of::<[u8; 3]>());
        zero_volatile((&raw mut (*fields).align).cast(), size_of::<A::EntryPad>());
        (&raw mut (*fields).created_ns).write(now_ns());
        entry.assume_init()
    };
    // A full table only costs the later fragments their translation; nothing to do about it.
    let _ = A::frags().insert(key(ip, direction), entry, u64::from(BPF_ANY));
}

/// Zeroes the `len` bytes at `bytes` with a volatile store each, which LLVM cannot merge into
/// a `memset`.
///
/// # Safety
/// The `len` bytes at `bytes` must be valid for writes.
#[inline(always)]
unsafe fn zero_volatile(bytes: *mut u8, len: usize) {
    let mut index = 0;
    while index < len {
        // SAFETY: within the caller's `len` writable bytes.
        unsafe { core::ptr::write_volatile(bytes.add(index), 0) };
        index += 1;
    }
}

/// What was decided for `ip`'s datagram's first fragment, if it was seen.
#[derive(Clone, Copy)]
enum Decided<A> {
    /// Translated: later fragments get this address.
    Translated(A),
    /// Left alone, and so are the later fragments.
    Untouched,
    /// Dropped, and so are the later fragments.
    Dropped,
    /// No first fragment was seen (reordered or lost).
    Unseen,
}

/// The decision remembered for `ip`'s datagram.
#[inline(always)]
fn remembered<A: Family>(ip: &Ip<A>, direction: Direction) -> Decided<A> {
    let Some(entry) = A::frags().get_ptr(key(ip, direction)) else {
        return Decided::Unseen;
    };
    // SAFETY: the pointer comes from a successful lookup and is read at once.
    unsafe {
        match (*entry).decision {
            FRAG_TRANSLATED => Decided::Translated((*entry).addr),
            FRAG_DROPPED => Decided::Dropped,
            _ => Decided::Untouched,
        }
    }
}

/// A later fragment leaving the node.
#[inline(always)]
pub(crate) fn egress<A: Rewrite>(
    ctx: &TcContext,
    settings: &Settings,
    node_ip: A,
    ip: &Ip<A>,
) -> Verdict {
    let translate_to = match remembered(ip, Direction::Egress) {
        Decided::Translated(addr) => addr,
        Decided::Untouched => {
            count_in::<A>(Counter::EgressFragmentPassed);
            return Verdict::Pass;
        }
        Decided::Dropped => {
            count_in::<A>(Counter::EgressDropFragment);
            return Verdict::Drop;
        }
        // The first fragment was not seen (reordered or lost): fall back on the policy.
        Decided::Unseen if ip.src == node_ip => {
            count_in::<A>(Counter::EgressHostPassed);
            return Verdict::Pass;
        }
        Decided::Unseen if A::link_scoped(ip.src, ip.dst) => {
            count_in::<A>(Counter::EgressExemptLinkLocal);
            return Verdict::Pass;
        }
        // As a new flow's first packet would be decided.
        Decided::Unseen => match policy::pod_exemption(settings, ip.src, ip.dst) {
            Some(exemption) => {
                count_in::<A>(exemption);
                return Verdict::Pass;
            }
            None => node_ip,
        },
    };
    // Masqueraded by an uplink without an address of the family: dropped as its first
    // fragment was (or would have been).
    if A::unaddressed(translate_to) {
        count_in::<A>(Counter::EgressDropNoAddress);
        return Verdict::Drop;
    }
    if rewrite::address(ctx, ip, End::Source, translate_to).is_err() {
        count_in::<A>(Counter::EgressDropRewriteFailed);
        return Verdict::Drop;
    }
    count_in::<A>(Counter::EgressFragmentTranslated);
    Verdict::Pass
}

/// A later fragment arriving for the node.
#[inline(always)]
pub(crate) fn ingress<A: Rewrite>(ctx: &TcContext, ip: &Ip<A>) -> Verdict {
    match remembered(ip, Direction::Ingress) {
        Decided::Translated(addr) => {
            if rewrite::address(ctx, ip, End::Destination, addr).is_err() {
                count_in::<A>(Counter::IngressDropRewriteFailed);
                return Verdict::Drop;
            }
            count_in::<A>(Counter::IngressFragmentTranslated);
        }
        _ => count_in::<A>(Counter::IngressFragmentUnmatched),
    }
    Verdict::Pass
}
