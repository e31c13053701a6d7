//! The NAT table: finding, refreshing, repairing and allocating mappings.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::lpm_trie::Key,
    helpers::generated::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns},
};
use masq_common::{
    counters::{Counter, MAX_ALLOC_ATTEMPTS},
    nat::{
        FLOW_SEEN, FLOW_TCP_CLOSING, NatEntryV4, NatKeyV4, ORIGIN_HOST, ORIGIN_INBOUND,
        TOUCH_INTERVAL_NS, proto,
    },
    settings::Settings,
};

use crate::{
    counters::{count, record_allocation},
    maps::{NAT_V4, NOMASQ_V4},
};

/// Monotonic time in nanoseconds, coarse (a few milliseconds) but cheap.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments and has no preconditions.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// The mapping stored under `key`, refreshed for a packet carrying `flow_flags`.
///
/// The refresh writes to the entry only when a new TCP flag shows up or the last refresh is
/// more than [`TOUCH_INTERVAL_NS`] old, so an established flow costs one lookup per packet. At
/// each refresh the other half is checked and recreated if LRU eviction took it.
#[inline(always)]
pub(crate) fn lookup(key: &NatKeyV4, flow_flags: u8, tcp_opens: bool) -> Option<NatEntryV4> {
    let entry = NAT_V4.get_ptr_mut(key)?;
    // SAFETY: the pointer comes from a successful lookup and stays valid for this program run;
    // concurrent writers only ever store whole fields, and a torn timestamp is harmless.
    let entry = unsafe { &mut *entry };
    let observed = flow_flags | FLOW_SEEN;
    if tcp_opens && entry.flags & FLOW_TCP_CLOSING != 0 {
        reopen(key, entry);
    }
    let now = now_ns();
    if observed & !entry.flags != 0 || now.wrapping_sub(entry.last_seen_ns) >= TOUCH_INTERVAL_NS {
        entry.flags |= observed;
        entry.last_seen_ns = now;
        ensure_peer(key, entry);
    }
    Some(*entry)
}

/// A SYN on a closing TCP flow reuses the tuple for a new connection (as after TIME_WAIT):
/// forget the closing state of both halves so the new connection gets the established timeout.
#[inline(always)]
fn reopen(key: &NatKeyV4, entry: &mut NatEntryV4) {
    entry.flags &= !FLOW_TCP_CLOSING;
    if let Some(peer) = NAT_V4.get_ptr_mut(key.peer(entry)) {
        // SAFETY: as in `lookup`.
        unsafe { (*peer).flags &= !FLOW_TCP_CLOSING };
    }
}

/// Recreates the other half of the flow if LRU eviction took it. If its tuple now belongs to
/// another flow, this half is removed so that the next packet allocates afresh.
#[inline(always)]
fn ensure_peer(key: &NatKeyV4, entry: &NatEntryV4) {
    if entry.origin == ORIGIN_INBOUND {
        // Inbound flows have no reply half: their replies are the pod's own packets.
        return;
    }
    let peer = key.peer(entry);
    let Some(existing) = NAT_V4.get_ptr(peer) else {
        if NAT_V4
            .insert(peer, key.peer_entry(entry), u64::from(BPF_NOEXIST))
            .is_ok()
        {
            count(Counter::MappingRepaired);
        }
        return;
    };
    // SAFETY: as in `lookup`.
    let existing = unsafe { *existing };
    if peer.peer(&existing) != *key {
        count(Counter::MappingConflict);
        let _ = NAT_V4.remove(key);
    }
}

/// Why no mapping could be created.
pub(crate) enum AllocError {
    /// Every port tried is taken towards this remote endpoint.
    NoPort,
    /// An SCTP flow's own port is taken towards this remote endpoint.
    SctpPortInUse,
}

/// Creates both halves of a mapping for the egress tuple `key`, translating to `node_ip`.
///
/// The ingress half is inserted first and only if absent: it reserves `(remote, remote port,
/// node, port, protocol)` for this flow, so two flows never share a reply tuple. If another CPU
/// created the same flow meanwhile, its mapping wins and ours is rolled back.
#[inline(always)]
pub(crate) fn allocate(
    settings: &Settings,
    node_ip: [u8; 4],
    key: &NatKeyV4,
    origin: u8,
    flow_flags: u8,
) -> Result<NatEntryV4, AllocError> {
    let now = now_ns();
    let restore = NatEntryV4 {
        addr: key.src_addr,
        port: key.src_port,
        flags: 0,
        origin,
        created_ns: now,
        last_seen_ns: 0,
    };
    // Ports that cannot change: SCTP (CRC32c) and protocols without ports (always 0).
    let fixed_port = match key.protocol {
        proto::TCP | proto::UDP | proto::ICMP => None,
        proto::SCTP => Some(key.src_port),
        _ => Some(0),
    };
    // The node's own flows keep their port whenever it is free, as do all flows without
    // --random-fully (iptables MASQUERADE tries the original port first too).
    let preferred =
        (origin == ORIGIN_HOST || !settings.random_fully()) && settings.port_in_range(key.src_port);

    let mut attempt = 0;
    while attempt < MAX_ALLOC_ATTEMPTS {
        let port = match fixed_port {
            Some(port) if attempt == 0 => port,
            Some(_) => break,
            None if attempt == 0 && preferred => key.src_port,
            None => {
                // SAFETY: the helper takes no arguments and has no preconditions.
                let random = unsafe { bpf_get_prandom_u32() };
                // `settings()` only hands out settings with ports, but the map value can change
                // under the program: never divide by a value the verifier cannot see is nonzero.
                let Some(port) = random
                    .checked_rem(settings.total_ports)
                    .and_then(|offset| settings.port_at(offset))
                else {
                    break;
                };
                port
            }
        };
        let reply = NatEntryV4 {
            addr: node_ip,
            port,
            ..restore
        };
        let reply_key = key.peer(&reply);
        if NAT_V4
            .insert(reply_key, restore, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            record_allocation(attempt);
            let forward = NatEntryV4 {
                addr: node_ip,
                port,
                flags: flow_flags | FLOW_SEEN,
                origin,
                created_ns: now,
                last_seen_ns: now,
            };
            if NAT_V4.insert(key, forward, u64::from(BPF_NOEXIST)).is_ok() {
                return Ok(forward);
            }
            // Another CPU mapped this flow first: release our reservation and use theirs.
            let _ = NAT_V4.remove(reply_key);
            return match NAT_V4.get_ptr(key) {
                // SAFETY: as in `lookup`.
                Some(existing) => Ok(unsafe { *existing }),
                None => Err(AllocError::NoPort),
            };
        }
        attempt += 1;
    }
    record_allocation(MAX_ALLOC_ATTEMPTS);
    if key.protocol == proto::SCTP {
        Err(AllocError::SctpPortInUse)
    } else {
        Err(AllocError::NoPort)
    }
}

/// Remembers a UDP flow that a masqueraded address opened towards a pod; `key` is the tuple
/// the pod's replies will carry on egress. The replies are then recognised and left alone, as
/// conntrack would treat them, instead of being masqueraded as new flows. Flows from
/// non-masquerade addresses need nothing: their replies are exempt anyway. Returns whether a
/// new flow was recorded.
#[inline(always)]
pub(crate) fn track_inbound(key: &NatKeyV4) -> bool {
    // Most inbound traffic to pods comes from non-masquerade (in-cluster) addresses: the trie
    // answers for those without touching the NAT table.
    if NOMASQ_V4.get(&Key::new(32, key.dst_addr)).is_some() {
        return false;
    }
    if lookup(key, FLOW_SEEN, false).is_some() {
        return false;
    }
    let now = now_ns();
    let identity = NatEntryV4 {
        addr: key.src_addr,
        port: key.src_port,
        flags: FLOW_SEEN,
        origin: ORIGIN_INBOUND,
        created_ns: now,
        last_seen_ns: now,
    };
    NAT_V4.insert(key, identity, u64::from(BPF_NOEXIST)).is_ok()
}
