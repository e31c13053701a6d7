//! The NAT table: finding, refreshing, repairing and allocating mappings.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::lpm_trie::Key,
    helpers::generated::{bpf_get_prandom_u32, bpf_ktime_get_coarse_ns},
    programs::TcContext,
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
    sockets,
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

/// A SYN on a closing TCP flow reuses the tuple for a new connection (as after TIME_WAIT): the
/// flow starts over, as conntrack does, keeping its port.
#[inline(always)]
fn reopen(key: &NatKeyV4, entry: &mut NatEntryV4) {
    let now = now_ns();
    entry.flags &= !FLOW_TCP_CLOSING;
    entry.created_ns = now;
    if let Some(peer) = NAT_V4.get_ptr_mut(key.peer(entry)) {
        // SAFETY: as in `lookup`. The reply half forgets the old connection entirely: until
        // the new one is answered it is not established.
        unsafe {
            (*peer).flags = 0;
            (*peer).created_ns = now;
        }
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
    /// The NAT table is full: the new flow is dropped, no live flow is evicted.
    TableFull,
}

/// `-EEXIST`: the key of a `BPF_NOEXIST` insert is taken.
const EEXIST: i32 = -17;

/// Creates both halves of a mapping for the egress tuple `key`, translating to `node_ip`.
///
/// Ports are scanned in order from a random start (the pod's own port first where it is kept),
/// like the kernel's unique-tuple search, so a range with a free port is never reported full
/// while fewer than [`MAX_ALLOC_ATTEMPTS`] ports are taken. Each candidate is looked up before
/// it is inserted: a taken port costs a lookup and changes nothing. The ingress half is
/// inserted first and only if absent: it reserves `(remote, remote port, node, port,
/// protocol)` for this flow, so two flows never share a reply tuple. If another CPU created the
/// same flow meanwhile, its mapping wins and ours is rolled back. The table is a plain hash:
/// when it is full the new flow is refused, and no live flow is ever evicted.
#[inline(always)]
pub(crate) fn allocate(
    ctx: &TcContext,
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
    // SAFETY: the helper takes no arguments and has no preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    // `settings()` only hands out settings with ports, but the map value can change under the
    // program: never divide by a value the verifier cannot see is nonzero.
    let Some((first, size, start)) = random
        .checked_rem(settings.total_ports)
        .and_then(|offset| settings.range_at(offset))
    else {
        return Err(AllocError::NoPort);
    };
    // The scan runs through the range the random start fell in (all of it, for the single
    // range of the default), wrapping at its end.
    let candidates = if size < MAX_ALLOC_ATTEMPTS {
        size
    } else {
        MAX_ALLOC_ATTEMPTS
    };
    let reply_key_for = |port: u16| {
        key.peer(&NatEntryV4 {
            addr: node_ip,
            port,
            ..restore
        })
    };
    let free = |port: u16| NAT_V4.get_ptr(reply_key_for(port)).is_none();

    // A port that must or may be kept is tried on its own, before any scan.
    let mut attempt: u32 = 0;
    let mut found = None;
    let first_choice = match fixed_port {
        Some(port) => Some(port),
        None if preferred => Some(key.src_port),
        None => None,
    };
    if let Some(port) = first_choice {
        attempt = 1;
        if free(port) {
            found = Some((port, reply_key_for(port)));
        }
    }
    // The scan only looks, with one comparison per step, so the loop stays within what the
    // verifier explores; the inserts happen once, after it.
    if found.is_none() && fixed_port.is_none() {
        let mut within = start;
        let mut step: u32 = 0;
        while step < MAX_ALLOC_ATTEMPTS {
            if step >= candidates {
                break;
            }
            let port = first.wrapping_add(within as u16);
            within += 1;
            if within >= size {
                within = 0;
            }
            step += 1;
            if free(port) {
                found = Some((port, reply_key_for(port)));
                break;
            }
        }
        attempt += step;
    }
    let Some((port, reply_key)) = found else {
        record_allocation(None);
        return Err(if key.protocol == proto::SCTP {
            AllocError::SctpPortInUse
        } else {
            AllocError::NoPort
        });
    };
    // The node's own sockets hold tuples too (a listener in the range, such as kubelet's
    // 10250, answered from a remote port): a pod flow given the same tuple would receive the
    // node's traffic. Such a port is refused; the packet's retransmission scans from a new
    // random start.
    if origin != ORIGIN_HOST
        && sockets::node_owns(ctx, key.protocol, key.dst_addr, key.dst_port, node_ip, port)
    {
        record_allocation(None);
        return Err(AllocError::NoPort);
    }
    match NAT_V4.insert(reply_key, restore, u64::from(BPF_NOEXIST)) {
        Ok(()) => {}
        // Another CPU took the port between the look and the insert; the packet's next
        // retransmission scans again.
        Err(EEXIST) => {
            record_allocation(None);
            return Err(AllocError::NoPort);
        }
        Err(_) => {
            record_allocation(None);
            return Err(AllocError::TableFull);
        }
    }
    let forward = NatEntryV4 {
        addr: node_ip,
        port,
        flags: flow_flags | FLOW_SEEN,
        origin,
        created_ns: now,
        last_seen_ns: now,
    };
    if NAT_V4.insert(key, forward, u64::from(BPF_NOEXIST)).is_ok() {
        record_allocation(Some(attempt));
        return Ok(forward);
    }
    let _ = NAT_V4.remove(reply_key);
    // Another CPU mapped this flow first: use theirs.
    if let Some(existing) = NAT_V4.get_ptr(key) {
        record_allocation(Some(attempt));
        // SAFETY: as in `lookup`.
        return Ok(unsafe { *existing });
    }
    record_allocation(None);
    Err(AllocError::TableFull)
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
