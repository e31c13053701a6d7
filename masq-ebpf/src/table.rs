//! The NAT tables' entries as the halves of flows: finding a half's other half, copying entries
//! and keys out of map memory without calls to `memcpy`, removing a flow whole.

use masq_common::{
    flow::Window,
    nat::{Direction, NatEntry, NatKey, ORIGIN_INBOUND},
};

use crate::family::Family;

/// Whether a flow of `origin` has two halves. An inbound flow has one: its replies are the
/// pod's own packets, recognised by their egress key.
#[inline(always)]
pub(crate) const fn has_peer(origin: u8) -> bool {
    origin != ORIGIN_INBOUND
}

/// The key of the other half of the flow whose half is `key`, its entry at `entry` (a map
/// value): [`NatKey::peer`] with the entry's address and port read by [`Family::load`] and
/// volatile loads, not copied (see there).
///
/// # Safety
/// `entry` must point at a valid entry for the length of the call.
#[inline(always)]
pub(crate) unsafe fn peer_of<A: Family>(key: &NatKey<A>, entry: *const NatEntry<A>) -> NatKey<A> {
    // SAFETY: as the caller promises.
    let (addr, port) = unsafe {
        (
            A::load(&raw const (*entry).addr),
            core::ptr::read_volatile(&raw const (*entry).port),
        )
    };
    match key.direction() {
        Some(Direction::Ingress) => NatKey::new(
            addr,
            key.src_addr,
            port,
            key.src_port,
            key.protocol,
            Direction::Egress,
        ),
        _ => NatKey::new(
            key.dst_addr,
            addr,
            key.dst_port,
            port,
            key.protocol,
            Direction::Ingress,
        ),
    }
}

/// The local address of the flow whose half is `key` at `entry`: who holds it (see
/// `holders`). An egress key's source; an ingress half restores exactly that address.
///
/// # Safety
/// `entry` must point at a valid entry for the length of the call.
#[inline(always)]
pub(crate) unsafe fn holder_of<A: Family>(key: &NatKey<A>, entry: *const NatEntry<A>) -> A {
    match key.direction() {
        // SAFETY: as the caller promises.
        Some(Direction::Ingress) => unsafe { A::load(&raw const (*entry).addr) },
        _ => key.src_addr,
    }
}

/// Copies the entry at `source` to `target` (map values both) field by field with volatile
/// loads and stores: neither a call to `memmove` (see [`Family::load`]) nor a copy of the whole
/// entry on the stack, which the IPv6 programs have no room for.
///
/// # Safety
/// Both must point at valid entries for the length of the call.
#[inline(always)]
pub(crate) unsafe fn copy_entry<A: Family>(target: *mut NatEntry<A>, source: *const NatEntry<A>) {
    // SAFETY: as the caller promises.
    unsafe {
        core::ptr::write_volatile(&raw mut (*target).addr, A::load(&raw const (*source).addr));
        macro_rules! copy_field {
            ($($name:ident).+) => {
                core::ptr::write_volatile(
                    &raw mut (*target).$($name).+,
                    core::ptr::read_volatile(&raw const (*source).$($name).+),
                )
            };
        }
        copy_field!(port);
        copy_field!(origin);
        copy_field!(state);
        copy_field!(assured);
        copy_field!(reset);
        copy_field!(pad);
        copy_field!(window.end);
        copy_field!(window.max_ack);
        copy_field!(window.offered_end);
        copy_field!(window.max_window);
        copy_field!(window.scale);
        copy_field!(window.flags);
        copy_field!(window.pad);
        copy_field!(align);
        copy_field!(created_ns);
        copy_field!(last_seen_ns);
    }
}

/// Writes a new half into `target` (a map value) field by field, with volatile stores: its
/// translation to `addr` and `port`, its flow's `origin`, `state` and times, and nothing
/// tracked of its window. From a literal, LLVM would zero the window and the padding with a
/// call to `memset`, a bpf-to-bpf call, and build an IPv6 entry on a stack that has no room.
///
/// # Safety
/// `target` must point at a valid, writable entry for the length of the call.
#[inline(always)]
pub(crate) unsafe fn write_entry<A: Family>(
    target: *mut NatEntry<A>,
    addr: A,
    port: u16,
    origin: u8,
    state: u8,
    created_ns: u64,
    last_seen_ns: u64,
) {
    // SAFETY: as the caller promises.
    unsafe {
        macro_rules! set {
            ($($name:ident).+, $value:expr) => {
                core::ptr::write_volatile(&raw mut (*target).$($name).+, $value)
            };
        }
        set!(addr, addr);
        set!(port, port);
        set!(origin, origin);
        set!(state, state);
        set!(assured, 0);
        set!(reset, 0);
        set!(pad, [0; 2]);
        set!(window.end, 0);
        set!(window.max_ack, 0);
        set!(window.offered_end, 0);
        set!(window.max_window, 0);
        set!(window.scale, 0);
        set!(window.flags, 0);
        set!(window.pad, [0; 2]);
        set!(align, A::ENTRY_PAD);
        set!(created_ns, created_ns);
        set!(last_seen_ns, last_seen_ns);
    }
}

/// Writes `window` into the window of the entry at `target` (a map value), field by field.
///
/// # Safety
/// `target` must point at a valid, writable entry for the length of the call.
#[inline(always)]
pub(crate) unsafe fn write_window<A: Family>(target: *mut NatEntry<A>, window: &Window) {
    // SAFETY: as the caller promises.
    unsafe {
        macro_rules! set {
            ($name:ident) => {
                core::ptr::write_volatile(&raw mut (*target).window.$name, window.$name)
            };
        }
        set!(end);
        set!(max_ack);
        set!(offered_end);
        set!(max_window);
        set!(scale);
        set!(flags);
    }
}

/// Copies the key at `source` to `target` field by field, as [`copy_entry`] copies entries.
///
/// # Safety
/// Both must point at valid keys for the length of the call.
#[inline(always)]
pub(crate) unsafe fn copy_key<A: Family>(target: *mut NatKey<A>, source: *const NatKey<A>) {
    // SAFETY: as the caller promises.
    unsafe {
        core::ptr::write_volatile(
            &raw mut (*target).src_addr,
            A::load(&raw const (*source).src_addr),
        );
        core::ptr::write_volatile(
            &raw mut (*target).dst_addr,
            A::load(&raw const (*source).dst_addr),
        );
        macro_rules! copy_field {
            ($name:ident) => {
                core::ptr::write_volatile(
                    &raw mut (*target).$name,
                    core::ptr::read_volatile(&raw const (*source).$name),
                )
            };
        }
        copy_field!(src_port);
        copy_field!(dst_port);
        copy_field!(protocol);
        copy_field!(direction);
        copy_field!(pad);
    }
}

/// Removes the flow whose halves are `key` and `peer_key` (`None`: it has one); returns whether
/// this call removed `key`'s half, which only one CPU's removal can.
#[inline(always)]
pub(crate) fn remove_flow<A: Family>(key: &NatKey<A>, peer_key: Option<&NatKey<A>>) -> bool {
    let removed = A::nat().remove(key).is_ok();
    if let Some(peer_key) = peer_key {
        let _ = A::nat().remove(peer_key);
    }
    removed
}
