//! Room for new flows: eviction from the whole table, and each holder's share of it.
//!
//! conntrack admits a new flow into a full table by dropping one that was never assured, found
//! near the new tuple's hash bucket (`early_drop`): its victims are effectively random across
//! the table, so a young flow lives about as long as the table takes to churn. A BPF program
//! cannot walk a hash map's buckets, so every new flow writes its egress key into a slot of an
//! index with room for every flow the table holds ([`admitted`]), and a flow that needs room
//! samples random slots and evicts the first unassured flow it finds ([`make_room`]): victims
//! random across the table, as conntrack's.
//!
//! Beyond conntrack, no local address (a pod's, the node's) may hold more than its share of
//! the table in unassured flows (`--nat-pod-share`). A holder at its share admits a new flow
//! only in place of one of its own unassured flows, sampled the same way ([`within_share`]), so
//! a pod spraying SYNs or datagrams at a black hole, or a flood from outside towards one pod,
//! churns its own flows and costs the others nothing.

use aya_ebpf::helpers::generated::bpf_get_prandom_u32;
use masq_common::{
    flow::{EvictionCause, FlowClass},
    nat::{Direction, NO_INDEX_SLOT, NatKey, ORIGIN_INBOUND, RemoteHolder},
    settings::Settings,
};

use crate::{
    atomic,
    counters::count_eviction,
    family::Family,
    holders,
    maps::FLOW_CURSOR,
    table::{copy_key, has_peer, peer_of, remove_flow},
};

/// `BPF_NOEXIST`: insert only if absent.
const NOEXIST: u64 = 1;

/// Slots a flow that needs room in a full table samples. A full table under a flood holds
/// mostly unassured flows, found at the first try; one full of assured flows holds nothing to
/// evict, and the new flow is refused after these.
const TABLE_FULL_SAMPLES: u32 = 8;
/// Slots a holder at its share samples for one of its own flows. A holder at its share holds
/// a quarter of the table (by default), so 16 samples miss all of its flows 1 time in 100.
const HOLDER_SAMPLES: u32 = 16;

/// Records the new flow whose egress key is at `key` (a map value, or the caller's): it counts
/// against its holder, the key's source, until it is assured, and takes a slot of the flow
/// index: the slot of the flow evicted to make room for it, if one was (see
/// `Handoff::index_slot`), so that every eviction leaves as many flows indexed as before;
/// otherwise the cursor's next, so that the index fills without two flows in one slot.
///
/// # Safety
/// `key` must point at a valid key for the length of the call.
#[inline(always)]
pub(crate) unsafe fn admitted<A: Family>(settings: &Settings, key: *const NatKey<A>) {
    // SAFETY: as the caller promises.
    let holder = unsafe { A::load(&raw const (*key).src_addr) };
    holders::add_one::<A>(holder);
    let Some(slots) = index_slots::<A>(settings) else {
        return;
    };
    let slot = match freed_slot::<A>() {
        Some(slot) if slot < slots => slot,
        _ => match FLOW_CURSOR.get_ptr_mut(A::FAMILY as u32) {
            Some(cursor) => {
                // SAFETY: a valid map value, an aligned `u64`. Two CPUs reading the same value
                // before either adds write one slot twice: one flow goes unindexed.
                let next = unsafe { core::ptr::read_volatile(cursor) };
                // SAFETY: as above.
                unsafe { atomic::add(cursor, 1) };
                (next % u64::from(slots)) as u32
            }
            None => return,
        },
    };
    if let Some(target) = A::flow_index().get_ptr_mut(slot) {
        // SAFETY: `target` is a valid map value; `key` as the caller promises. Another CPU
        // writing the same slot may leave a key of two flows, which looks up nothing.
        unsafe { copy_key(target, key) };
    }
}

/// The flow index slot an eviction freed for the flow being admitted, if any.
#[inline(always)]
fn freed_slot<A: Family>() -> Option<u32> {
    let handoff = A::handoff().get_ptr(0)?;
    // SAFETY: per-CPU; this program run is its only user.
    let slot = unsafe { core::ptr::read_volatile(&raw const (*handoff).index_slot) };
    (slot != NO_INDEX_SLOT).then_some(slot)
}

/// Hands the flow index slot `slot`, whose flow was just evicted, to the flow being admitted.
#[inline(always)]
fn free_slot<A: Family>(slot: u32) {
    if let Some(handoff) = A::handoff().get_ptr_mut(0) {
        // SAFETY: per-CPU; this program run is its only user.
        unsafe { core::ptr::write_volatile(&raw mut (*handoff).index_slot, slot) };
    }
}

/// Whether `holder` may open another unassured flow: it holds fewer than its share, or one of
/// its own unassured flows made room.
#[inline(always)]
pub(crate) fn within_share<A: Family>(settings: &Settings, holder: A) -> bool {
    let share = settings.holder_share.get(A::FAMILY).copied().unwrap_or(0);
    if share == 0 || holders::unassured::<A>(holder) < u64::from(share) {
        return true;
    }
    evict_sampled::<A>(
        settings,
        Some(holder),
        HOLDER_SAMPLES,
        EvictionCause::HolderShare,
    )
}

/// Makes room in a full table by evicting an unassured flow sampled from the whole table;
/// returns whether one was evicted.
#[inline(always)]
pub(crate) fn make_room<A: Family>(settings: &Settings) -> bool {
    evict_sampled::<A>(settings, None, TABLE_FULL_SAMPLES, EvictionCause::TableFull)
}

/// The flow index's slots the agent set for family `A`, if any.
#[inline(always)]
fn index_slots<A: Family>(settings: &Settings) -> Option<u32> {
    settings
        .flow_slots
        .get(A::FAMILY)
        .copied()
        .filter(|&slots| slots != 0)
}

/// Samples up to `samples` slots of the flow index and evicts the first flow that is unassured
/// (and, with `holder`, held by it); counts it under `cause` and its class.
#[inline(always)]
fn evict_sampled<A: Family>(
    settings: &Settings,
    holder: Option<A>,
    samples: u32,
    cause: EvictionCause,
) -> bool {
    let Some(slots) = index_slots::<A>(settings) else {
        return false;
    };
    let mut sample = 0;
    while sample < samples {
        sample += 1;
        let Some((slot, key)) = sample_egress_key::<A>(slots) else {
            continue;
        };
        if holder.is_some_and(|holder| key.src_addr != holder) {
            continue;
        }
        if let Some((class, _)) = evict::<A>(&key) {
            count_eviction::<A>(cause, class);
            free_slot::<A>(slot);
            return true;
        }
    }
    false
}

/// One random slot of the flow index out of `slots`, with the egress key it holds; `None` if the
/// slot is empty or holds another direction's key.
#[inline(always)]
fn sample_egress_key<A: Family>(slots: u32) -> Option<(u32, NatKey<A>)> {
    // SAFETY: the helper takes no arguments and has no preconditions.
    let slot = unsafe { bpf_get_prandom_u32() } % slots;
    let indexed = A::flow_index().get_ptr(slot)?;
    // The key is copied out before anything is judged: another CPU may write the slot
    // meanwhile, and the flow removed must be the flow judged.
    let mut key = core::mem::MaybeUninit::<NatKey<A>>::uninit();
    // SAFETY: `indexed` is a valid map value; `copy_key` writes every field of `key`.
    let key = unsafe {
        copy_key(key.as_mut_ptr(), indexed);
        key.assume_init()
    };
    (key.direction() == Some(Direction::Egress)).then_some((slot, key))
}

/// Removes the flow whose egress key is `key` if it is there and unassured; returns its class
/// and the node port it held.
#[inline(always)]
fn evict<A: Family>(key: &NatKey<A>) -> Option<(FlowClass, u16)> {
    let egress = A::nat().get_ptr(key)?;
    // SAFETY: the pointer comes from a successful lookup; each field is read once.
    let (assured, origin, state, port) = unsafe {
        (
            core::ptr::read_volatile(&raw const (*egress).assured),
            core::ptr::read_volatile(&raw const (*egress).origin),
            core::ptr::read_volatile(&raw const (*egress).state),
            core::ptr::read_volatile(&raw const (*egress).port),
        )
    };
    if assured != 0 {
        return None;
    }
    let peer_key = has_peer(origin).then(|| {
        // SAFETY: as above.
        unsafe { peer_of(key, egress) }
    });
    if !remove_flow(key, peer_key.as_ref()) {
        // Another CPU removed it first, and counted it.
        return None;
    }
    holders::remove_one::<A>(key.src_addr);
    Some((
        FlowClass::of(key.protocol, state, origin == ORIGIN_INBOUND),
        port,
    ))
}

/// Beyond conntrack, which refuses a flow towards a remote endpoint none of whose ports is
/// free: takes one for the pod whose new flow is in the hand-off from a pod holding more of that
/// remote's ports. Samples the flow index for an unassured flow towards the same remote
/// `ip:port` of the same protocol, held by a pod whose count in the remote-holders table
/// (which the agent fills for busy remotes) exceeds the new flow's pod's by two or more, and
/// evicts it; returns the node port it held, now the new flow's to take. A pod's share of a busy
/// remote thus tends to the others': no pod keeps the last ports from every other. Assured
/// flows are never taken. At most one port per new flow.
#[inline(always)]
pub(crate) fn take_from_busier<A: Family>(settings: &Settings) -> Option<u16> {
    let slots = index_slots::<A>(settings)?;
    let handoff = A::handoff().get_ptr_mut(0)?;
    // SAFETY: per-CPU; this program run is its only user. The key's fields are read one by one.
    let (mine, took) = unsafe {
        let key = &raw const (*handoff).request.key;
        (
            &RemoteHolder {
                holder: A::load(&raw const (*key).src_addr),
                remote: A::load(&raw const (*key).dst_addr),
                remote_port: core::ptr::read_volatile(&raw const (*key).dst_port),
                protocol: core::ptr::read_volatile(&raw const (*key).protocol),
                pad: 0,
            },
            core::ptr::read_volatile(&raw const (*handoff).took_port),
        )
    };
    if took != 0 {
        return None;
    }
    let my_count = A::remote_holders()
        .get_ptr(mine)
        // SAFETY: a valid map value, read at once.
        .map_or(0, |count| unsafe { core::ptr::read_volatile(count) });
    let mut sample = 0;
    while sample < HOLDER_SAMPLES {
        sample += 1;
        let Some((slot, key)) = sample_egress_key::<A>(slots) else {
            continue;
        };
        if key.dst_addr != mine.remote
            || key.dst_port != mine.remote_port
            || key.protocol != mine.protocol
            || key.src_addr == mine.holder
        {
            continue;
        }
        let theirs = &RemoteHolder::of(key.src_addr, &key);
        let Some(their_count) = A::remote_holders().get_ptr_mut(theirs) else {
            continue;
        };
        // SAFETY: a valid map value, read at once.
        if unsafe { core::ptr::read_volatile(their_count) } <= my_count.saturating_add(1) {
            continue;
        }
        let Some((class, port)) = evict::<A>(&key) else {
            continue;
        };
        count_eviction::<A>(EvictionCause::RemoteShare, class);
        free_slot::<A>(slot);
        // SAFETY: a valid, aligned `u64` map value; the add is atomic.
        unsafe { atomic::add(their_count.cast(), 0_u64.wrapping_sub(1)) };
        match A::remote_holders().get_ptr_mut(mine) {
            // SAFETY: as above.
            Some(count) => unsafe { atomic::add(count.cast(), 1) },
            // The pod's first port towards this remote since the collector counted.
            None => {
                let _ = A::remote_holders().insert(mine, 1, NOEXIST);
            }
        }
        // SAFETY: per-CPU, as above.
        unsafe { core::ptr::write_volatile(&raw mut (*handoff).took_port, 1) };
        return Some(port);
    }
    None
}
