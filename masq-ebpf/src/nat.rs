//! The NAT table: finding, refreshing, repairing and allocating mappings.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::generated::{bpf_get_prandom_u32, bpf_jiffies64, bpf_ktime_get_coarse_ns},
    programs::TcContext,
};
use masq_common::{
    counters::{ALLOC_CHUNK, Counter, FIRST_ALLOC_ROUND, MIN_ALLOC_ROUND},
    nat::{
        Direction, FIN_WINDOW, FLOW_ACK_BYTES, FLOW_ANSWERED, FLOW_FLAG_BYTES, FLOW_SEEN,
        FLOW_TCP_CLOSING, FLOW_TCP_RST, FlowMarks, NatEntry, NatKey, ORIGIN_HOST, ORIGIN_INBOUND,
        PortSearch, RST_WINDOW, SEQ_LOW_MASK, SeqLow, proto,
    },
    settings::Settings,
};

use crate::{
    counters::{count_in, record_allocation},
    family::Family,
    packet::TcpNumbers,
    sockets::{self, SocketTable},
};

/// The coarse clock as last read, with the tick (jiffies) it was read in.
#[repr(C)]
struct CoarseClock {
    jiffies: u64,
    ns: u64,
}

/// The last reading of the coarse clock, shared by all CPUs. Written by the programs (the
/// first packet of each tick on each CPU), never by the agent; a global rather than a pinned
/// map because it is a cache: a new program starts with its own, empty.
static mut COARSE_CLOCK: CoarseClock = CoarseClock { jiffies: 0, ns: 0 };

/// Monotonic time in nanoseconds (CLOCK_MONOTONIC), coarse: it moves once per tick.
///
/// The coarse clock changes only when jiffies do, and the kernel reads jiffies inline where it
/// must call out for the clock, so the clock is read once per tick and cached. Every packet of
/// a flow asks for the time, and a helper call costs as much as the rest of the lookup. Two
/// CPUs refreshing the cache at once can leave a reading one tick old, never one ahead.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: the helper takes no arguments; the kernel inlines it as a load of jiffies.
    let jiffies = unsafe { bpf_jiffies64() };
    let clock = &raw mut COARSE_CLOCK;
    // SAFETY: `clock` points at the program's global; concurrent writers store whole fields,
    // and a mismatched pair is at most a tick old (see above). Volatile, so each packet reads
    // what another CPU may have stored.
    unsafe {
        if core::ptr::read_volatile(&raw const (*clock).jiffies) == jiffies {
            return core::ptr::read_volatile(&raw const (*clock).ns);
        }
        let ns = bpf_ktime_get_coarse_ns();
        core::ptr::write_volatile(&raw mut (*clock).ns, ns);
        core::ptr::write_volatile(&raw mut (*clock).jiffies, jiffies);
        ns
    }
}

/// Which end of a flow sent the packet being looked up.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    /// The pod or the node (egress): its TCP flags are its own stack's, and are trusted.
    Local,
    /// The remote end (ingress): a RST or FIN counts only inside the tracked window.
    Remote,
}

/// The mapping stored under `key`, refreshed for a packet carrying `flow_flags` (and, for TCP,
/// the sequence numbers `tcp`) from `sender`.
///
/// The refresh writes to the entry only when a new TCP flag shows up or the last refresh is
/// more than [`TOUCH_INTERVAL_NS`](masq_common::nat::TOUCH_INTERVAL_NS) old, so an established
/// flow costs one lookup per packet. At each refresh the other half is checked and recreated
/// if it is missing (one half deleted alone, or evicted in the LRU benchmark variants).
/// A local TCP segment also records its acknowledgement when it moved (see `record_ack`).
#[inline(always)]
pub(crate) fn lookup<A: Family>(
    key: &NatKey<A>,
    flow_flags: u8,
    tcp_opens: bool,
    tcp: TcpNumbers,
    sender: Sender,
) -> Option<NatEntry<A>> {
    let entry = A::nat().get_ptr_mut(key)?;
    // SAFETY: the pointer comes from a successful lookup and stays valid for this program run;
    // concurrent writers only ever store whole fields, and a torn timestamp is harmless.
    let entry = unsafe { &mut *entry };
    let mut observed = flow_flags | FLOW_SEEN;
    let marked = entry.marks.bits();
    if sender == Sender::Remote
        && observed & FLOW_TCP_CLOSING & !marked != 0
        && !closes_in_window(key, entry, observed, tcp.seq)
    {
        observed &= !FLOW_TCP_CLOSING;
        count_in::<A>(Counter::TcpCloseOutOfWindow);
    }
    if tcp_opens && marked & FLOW_TCP_CLOSING != 0 {
        reopen(key, entry);
    }
    if sender == Sender::Local {
        record_ack(entry, tcp.ack);
    }
    let now = now_ns();
    if refresh_due(observed, marked, entry, now) {
        // A RST marked on this half, and this side carries on a refresh interval later: the
        // endpoint ignored it (a RST in the window masq checks, yet not the one the endpoint
        // expected), so the flow keeps its lifetime. A real RST ends its side's packets.
        if marked & FLOW_TCP_RST != 0 && observed & FLOW_TCP_RST == 0 {
            unmark(&mut entry.marks, FLOW_TCP_RST);
        }
        mark(&mut entry.marks, observed);
        entry.last_seen_ns = now;
        ensure_peer(key, entry);
    }
    Some(*entry)
}

/// Records the acknowledgement a local TCP segment carries (zero for a segment without one, and
/// for other protocols, which then store nothing): the remote end's RST and FIN are checked
/// against it. Written whenever it moves, which is every segment that acknowledges new data:
/// a store into the entry the lookup just read, made by the egress program alone, so no other
/// CPU's half shares the line. Concurrent segments of one flow on two CPUs may leave bytes of
/// both acknowledgements (each byte is a plain store): a RST then checked against it is kept
/// out rather than let in, what conntrack does with one it doubts.
#[inline(always)]
fn record_ack<A: Family>(entry: &mut NatEntry<A>, ack: u32) {
    let seen = SeqLow::of(ack).0;
    for (index, byte) in entry.marks.0[FLOW_ACK_BYTES].iter_mut().enumerate() {
        if *byte != seen[index] {
            // SAFETY: `byte` is a valid, aligned byte of the entry.
            unsafe { core::ptr::write_volatile(byte, seen[index]) };
        }
    }
}

/// Whether a RST or FIN (in `observed`) with sequence number `seq`, arriving from the remote end
/// on the reply half `(key, entry)`, lies where the local end's last acknowledgement says it
/// may (see `RST_WINDOW`, `FIN_WINDOW`). Without an acknowledgement to check against (a flow not
/// yet answered, one an older masq made), it counts, as conntrack's does before it saw one.
#[inline(always)]
fn closes_in_window<A: Family>(
    key: &NatKey<A>,
    entry: &NatEntry<A>,
    observed: u8,
    seq: u32,
) -> bool {
    // SAFETY: `entry` is the reply half the lookup found.
    let Some(local) = A::nat().get_ptr(unsafe { peer_of(key, entry) }) else {
        return true;
    };
    // SAFETY: as in `lookup`; a volatile read, as the egress program writes it meanwhile.
    let acked = unsafe { core::ptr::read_volatile(&raw const (*local).marks) }.ack_low();
    if acked == SeqLow::UNKNOWN {
        return true;
    }
    let distance = acked.distance_to(seq);
    if observed & FLOW_TCP_RST != 0 {
        distance < RST_WINDOW
    } else {
        !(FIN_WINDOW..=SEQ_LOW_MASK - FIN_WINDOW).contains(&distance)
    }
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

/// Copies the entry at `source` to `target` (map values both) field by field with volatile
/// loads and stores: neither a call to `memmove` (see [`Family::load`]) nor a copy of the whole
/// entry on the stack, which the IPv6 allocator has no room for.
///
/// # Safety
/// Both must point at valid entries for the length of the call.
#[inline(always)]
unsafe fn copy_into<A: Family>(target: *mut NatEntry<A>, source: *const NatEntry<A>) {
    // SAFETY: as the caller promises.
    unsafe {
        core::ptr::write_volatile(&raw mut (*target).addr, A::load(&raw const (*source).addr));
        macro_rules! copy_field {
            ($name:ident) => {
                core::ptr::write_volatile(
                    &raw mut (*target).$name,
                    core::ptr::read_volatile(&raw const (*source).$name),
                )
            };
        }
        copy_field!(port);
        copy_field!(origin);
        copy_field!(pad);
        copy_field!(marks);
        copy_field!(align);
        copy_field!(created_ns);
        copy_field!(last_seen_ns);
    }
}

/// Whether a packet with `observed` flags refreshes `entry`, marked `marked`. Flags are
/// recorded as soon as they show up; the timestamp only as often as flow lifetimes need (see
/// `TOUCH_INTERVAL_NS`), so that an established flow's packets only read their entry.
#[cfg(not(feature = "variant-touch-every-packet"))]
#[inline(always)]
fn refresh_due<A: Family>(observed: u8, marked: u8, entry: &NatEntry<A>, now: u64) -> bool {
    observed & !marked != 0
        || now.wrapping_sub(entry.last_seen_ns) >= masq_common::nat::TOUCH_INTERVAL_NS
}

/// The touch-every-packet benchmark variant: every packet refreshes its entry, as a datapath
/// without the rate limit would.
#[cfg(feature = "variant-touch-every-packet")]
#[inline(always)]
fn refresh_due<A: Family>(_observed: u8, _marked: u8, _entry: &NatEntry<A>, _now: u64) -> bool {
    true
}

/// Sets the `FLOW_*` bits of `bits` in `marks`, each by a store of its own byte (see
/// `FlowMarks`). The stores are volatile so the compiler cannot merge them into one wider
/// read-modify-write, which would bring back the lost update the byte per bit avoids.
#[inline(always)]
fn mark(marks: &mut FlowMarks, bits: u8) {
    set_marks(marks, bits, 1);
}

/// Clears the `FLOW_*` bits of `bits` in `marks`, byte by byte as [`mark`] sets them.
#[inline(always)]
fn unmark(marks: &mut FlowMarks, bits: u8) {
    set_marks(marks, bits, 0);
}

#[inline(always)]
fn set_marks(marks: &mut FlowMarks, bits: u8, value: u8) {
    for (index, byte) in marks.0[..FLOW_FLAG_BYTES].iter_mut().enumerate() {
        if bits & (1 << index) != 0 && *byte != value {
            // SAFETY: `byte` is a valid, aligned byte of the entry.
            unsafe { core::ptr::write_volatile(byte, value) };
        }
    }
}

/// A SYN on a closing TCP flow reuses the tuple for a new connection (as after TIME_WAIT): the
/// flow starts over, as conntrack does, keeping its port.
#[inline(always)]
fn reopen<A: Family>(key: &NatKey<A>, entry: &mut NatEntry<A>) {
    let now = now_ns();
    unmark(&mut entry.marks, FLOW_TCP_CLOSING);
    entry.created_ns = now;
    // SAFETY: `entry` is the half the lookup found.
    let peer_key = unsafe { peer_of(key, entry) };
    if let Some(peer) = A::nat().get_ptr_mut(peer_key) {
        // SAFETY: as in `lookup`. The reply half forgets the old connection entirely: until
        // the new one is answered it is not established.
        unsafe {
            unmark(&mut (*peer).marks, u8::MAX);
            (*peer).created_ns = now;
        }
    }
}

/// Recreates the other half of the flow if it is missing (see [`lookup`]). If its tuple now
/// belongs to another flow, this half is removed so that the next packet allocates afresh.
#[inline(always)]
fn ensure_peer<A: Family>(key: &NatKey<A>, entry: &NatEntry<A>) {
    if !has_peer(entry) {
        return;
    }
    let peer = key.peer(entry);
    let Some(existing) = A::nat().get_ptr(peer) else {
        if A::nat()
            .insert(peer, key.peer_entry(entry), u64::from(BPF_NOEXIST))
            .is_ok()
        {
            count_in::<A>(Counter::MappingRepaired);
        }
        return;
    };
    // SAFETY: as in `lookup`.
    let existing = unsafe { *existing };
    if peer.peer(&existing) != *key {
        count_in::<A>(Counter::MappingConflict);
        let _ = A::nat().remove(key);
    }
}

/// Whether `entry`'s flow has another half. Inbound flows have none: their replies are the
/// pod's own packets.
#[cfg(not(feature = "variant-one-entry-per-flow"))]
#[inline(always)]
fn has_peer<A: Family>(entry: &NatEntry<A>) -> bool {
    entry.origin != ORIGIN_INBOUND
}

/// The one-entry benchmark variant: no flow has another half, and none is recreated.
#[cfg(feature = "variant-one-entry-per-flow")]
#[inline(always)]
fn has_peer<A: Family>(_entry: &NatEntry<A>) -> bool {
    false
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

/// What one run of the allocator achieved.
pub(crate) enum Allocation {
    /// Both halves of the mapping exist; it is in the request slot.
    Mapped,
    /// This run's chunk of ports was taken; the search goes on in the allocator's next run,
    /// from where the request slot says.
    SearchGoesOn,
}

/// Creates both halves of a mapping for the new flow in the allocator's request slot, or tries
/// the next chunk of its port search. Runs in the allocator program only (see `allocator`).
///
/// Ports are searched like the kernel's unique-tuple search: rounds of 128, 64, 32 and 16 ports
/// tried in order, each from a new random start, so a range of up to 128 ports is searched
/// whole and a larger one gets 240 tries. A port that must or may be kept (SCTP, the node's own
/// flows, everything without `--random-fully`) is tried first, on its own, by inserting its
/// reply half. Each candidate of the search is looked up before anything is inserted, so a
/// taken port costs a lookup and changes nothing. Every port is also checked against the node's
/// own sockets, so no pod flow is given a tuple a node listener or connection holds. The
/// histogram records how many ports were tried.
///
/// One run tries at most [`ALLOC_CHUNK`] ports of the search; the state of the search lives in
/// the request slot, and the allocator tail-calls itself for the next chunk (at most
/// [`MAX_ALLOC_RUNS`](masq_common::counters::MAX_ALLOC_RUNS) runs). The verifier thus walks a chunk, not the whole search, which is
/// what lets the search keep the kernel's persistence on kernels whose verifier prunes less
/// than 6.18's (6.1 gave up on the whole search in one program at its million instructions).
/// Nearly every flow finds its port in the first run, so the tail calls cost only when ports
/// are scarce.
///
/// The ingress half is inserted first and only if absent: it reserves `(remote, remote port,
/// node, port, protocol)` for this flow, so two flows never share a reply tuple. If another CPU
/// created the same flow meanwhile, its mapping wins and ours is rolled back. The table is a
/// plain hash: when it is full the new flow is refused, and no live flow is ever evicted.
///
/// The search and the inserts read the request afresh from its slot ([`request`]): what the
/// code before them learned about its fields (which protocol, which range, whether the port is
/// kept) would otherwise split them into one verification per combination.
#[inline(always)]
pub(crate) fn allocate<A: Family>(
    ctx: &TcContext,
    settings: &Settings,
) -> Result<Allocation, AllocError> {
    let Some(request) = request::<A>() else {
        return Err(AllocError::TableFull);
    };
    let Some(search) = search_state::<A>() else {
        return Err(AllocError::TableFull);
    };
    if search.round == 0
        && let Some(decided) = begin::<A>(ctx, settings, &request)
    {
        return decided.map(|()| Allocation::Mapped);
    }
    // One search per socket table, each with its table fixed: a choice of table inside the
    // search would be one more branch on every port tried.
    let chunk = match socket_table(&request) {
        None => search_chunk::<A>(ctx, None),
        Some(SocketTable::Tcp) => search_chunk::<A>(ctx, Some(SocketTable::Tcp)),
        Some(SocketTable::Udp) => search_chunk::<A>(ctx, Some(SocketTable::Udp)),
    };
    match chunk {
        Some(Chunk::Found(port)) => create::<A>(port).map(|()| Allocation::Mapped),
        Some(Chunk::Taken) => Ok(Allocation::SearchGoesOn),
        None => Err(AllocError::NoPort),
    }
}

/// The first run for a request: maps the flow on a port it keeps, or decides that it cannot,
/// or (`None`) sets up the port search, which starts in this same run.
#[inline(always)]
fn begin<A: Family>(
    ctx: &TcContext,
    settings: &Settings,
    request: &NewFlow<A>,
) -> Option<Result<(), AllocError>> {
    let origin = request.origin;
    // Ports that cannot change: SCTP's (CRC32c) and those of protocols without ports (always
    // 0). Plain values rather than an `Option`: LLVM fills the payload of a `None` from any
    // register, a map pointer included, which the verifier rejects.
    let has_ports = matches!(request.protocol, proto::TCP | proto::UDP | proto::SCTP)
        || request.protocol == A::ICMP;
    if origin == ORIGIN_HOST && !has_ports {
        return Some(reserve_for_node::<A>(request.snat_addr));
    }
    let fixed = request.protocol == proto::SCTP || !has_ports;
    // The node's own flows keep their port whenever it is free, as do all flows without
    // --random-fully (iptables MASQUERADE tries the original port first too).
    let preferred = (origin == ORIGIN_HOST || !settings.random_fully())
        && settings.port_in_range(request.src_port);
    if fixed || preferred {
        let port = if has_ports { request.src_port } else { 0 };
        // No lookup of the reply tuple first: the insert that reserves it refuses a taken one
        // at the cost of that lookup, and the preferred port is nearly always free. On a full
        // table the lookup was a walk of a cold bucket on every new flow.
        if !socket_owned(ctx, request, socket_table(request), port) {
            match create::<A>(port) {
                Err(AllocError::NoPort) => {}
                created => {
                    record_allocation(Some(1));
                    return Some(created);
                }
            }
        }
        if fixed {
            record_allocation(None);
            return Some(Err(if request.protocol == proto::SCTP {
                AllocError::SctpPortInUse
            } else {
                AllocError::NoPort
            }));
        }
    }
    if start_search::<A>(settings) {
        None
    } else {
        record_allocation(None);
        Some(Err(AllocError::NoPort))
    }
}

/// The new flow the allocator maps: the part of its request the port search needs. The
/// inserts read the rest from the slot ([`create`]): a copy of the whole request would not fit
/// the IPv6 allocator's stack.
#[derive(Clone, Copy)]
struct NewFlow<A: Family> {
    /// The remote end: the flow's destination.
    remote: A,
    snat_addr: A,
    remote_port: u16,
    src_port: u16,
    protocol: u8,
    origin: u8,
}

/// The allocator's request, read from its per-CPU slot with volatile reads: the compiler may
/// not reuse values it saw written or read before, so the verifier knows nothing about the
/// fields but their width. Only the fields the allocator needs are copied (the program's stack
/// is 512 bytes).
#[inline(always)]
fn request<A: Family>() -> Option<NewFlow<A>> {
    let slot = A::alloc_request().get_ptr(0)?;
    // SAFETY: the slot is a valid, aligned map value private to this CPU while the program
    // runs; the field pointers are derived from it without creating references.
    unsafe {
        let key = &raw const (*slot).key;
        Some(NewFlow {
            remote: core::ptr::read_volatile(&raw const (*key).dst_addr),
            snat_addr: core::ptr::read_volatile(&raw const (*slot).snat_addr),
            remote_port: core::ptr::read_volatile(&raw const (*key).dst_port),
            src_port: core::ptr::read_volatile(&raw const (*key).src_port),
            protocol: core::ptr::read_volatile(&raw const (*key).protocol),
            origin: core::ptr::read_volatile(&raw const (*slot).origin),
        })
    }
}

/// The port search's state, read back from the request slot like [`request`], so that every
/// run of the allocator and every way into the search meet one verification of it.
#[inline(always)]
fn search_state<A: Family>() -> Option<PortSearch> {
    let slot = A::alloc_request().get_ptr(0)?;
    // SAFETY: as in `request`.
    Some(unsafe { core::ptr::read_volatile(&raw const (*slot).search) })
}

/// Stores the port search's state in the request slot for the rest of this run and the next.
#[inline(always)]
fn store_search<A: Family>(search: PortSearch) {
    if let Some(slot) = A::alloc_request().get_ptr_mut(0) {
        // SAFETY: as in `request`.
        unsafe { core::ptr::write_volatile(&raw mut (*slot).search, search) };
    }
}

/// Marks the request's search as over, whatever its outcome, so that the next request finds
/// no search to resume even if it comes from an egress program older than this allocator
/// (during an upgrade, which shares the request slot), which does not reset it.
#[inline(always)]
pub(crate) fn end_search<A: Family>() {
    if let Some(slot) = A::alloc_request().get_ptr_mut(0) {
        // SAFETY: as in `request`.
        unsafe { core::ptr::write_volatile(&raw mut (*slot).search.round, 0) };
    }
}

/// The reply tuple of `request`'s flow if it left from node port `port`.
#[inline(always)]
fn reply_key<A: Family>(request: &NewFlow<A>, port: u16) -> NatKey<A> {
    NatKey::new(
        request.remote,
        request.snat_addr,
        request.remote_port,
        port,
        request.protocol,
        Direction::Ingress,
    )
}

/// Whether `request`'s flow may leave from node port `port`: no mapping holds the reply tuple,
/// and no node socket in `sockets` (the table pod flows of this protocol are checked against,
/// if any) does.
#[inline(always)]
fn usable<A: Family>(
    ctx: &TcContext,
    request: &NewFlow<A>,
    sockets: Option<SocketTable>,
    port: u16,
) -> bool {
    A::nat().get_ptr(reply_key(request, port)).is_none()
        && !socket_owned(ctx, request, sockets, port)
}

/// Whether a node socket in `sockets` (see [`usable`]) holds `request`'s flow's tuple if it
/// left from node port `port`.
#[inline(always)]
fn socket_owned<A: Family>(
    ctx: &TcContext,
    request: &NewFlow<A>,
    sockets: Option<SocketTable>,
    port: u16,
) -> bool {
    sockets.is_some_and(|table| {
        sockets::owned_in(
            ctx,
            table,
            request.remote,
            request.remote_port,
            request.snat_addr,
            port,
        )
    })
}

/// The socket table a pod flow of `request`'s protocol must not clash with; `None` for the
/// node's own flows (the kernel already keeps its own sockets apart) and protocols the kernel
/// cannot be asked about.
#[inline(always)]
fn socket_table<A: Family>(request: &NewFlow<A>) -> Option<SocketTable> {
    if request.origin == ORIGIN_HOST {
        return None;
    }
    SocketTable::of(request.protocol)
}

/// Sets up the kernel's search for a free port: rounds from [`FIRST_ALLOC_ROUND`] ports down
/// to [`MIN_ALLOC_ROUND`], halving, each in order from a new random start (wrapping at the
/// range's end); a round that covered the whole range ends the search. The range is chosen
/// once, at a random position over all ranges laid end to end, so each port is equally likely
/// to be tried first; with several `--to-ports` ranges a flow's search stays in the range it
/// drew. Returns false if the settings name no port.
#[inline(always)]
fn start_search<A: Family>(settings: &Settings) -> bool {
    // SAFETY: the helper takes no arguments and has no preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    // `settings()` only hands out settings with ports, but the map value can change under the
    // program: never divide by a value the verifier cannot see is nonzero.
    let Some((first, size, start)) = random
        .checked_rem(settings.total_ports)
        .and_then(|offset| settings.range_at(offset))
    else {
        return false;
    };
    store_search::<A>(PortSearch {
        first,
        round: FIRST_ALLOC_ROUND as u16,
        size,
        start,
        step: 0,
    });
    true
}

/// What one chunk of the port search found.
enum Chunk {
    /// A free port.
    Found(u16),
    /// Every port of the chunk was taken; the search state now points at the next chunk.
    Taken,
}

/// Tries the next [`ALLOC_CHUNK`] ports of the search in the request slot. `None` when the
/// search is over without a port (recorded in the histogram, as is a port found).
#[inline(always)]
fn search_chunk<A: Family>(ctx: &TcContext, sockets: Option<SocketTable>) -> Option<Chunk> {
    let request = request::<A>()?;
    let PortSearch {
        first,
        round,
        size,
        start,
        step,
    } = search_state::<A>()?;
    let round = u32::from(round);
    let start = start.checked_rem(size)?;
    // Ports tried in the rounds before this one: 128 + 64 + ... down to twice this round's.
    let before = 2 * FIRST_ALLOC_ROUND.saturating_sub(round);
    let mut index: u32 = 0;
    while index < ALLOC_CHUNK {
        let tried = step.wrapping_add(index);
        if tried >= size {
            // The round has covered the whole range.
            record_allocation(None);
            return None;
        }
        // Wrapping by subtraction, not by resetting to zero: a position the verifier knows
        // exactly after a wrap would start a new chain of states at every step where the wrap
        // can happen.
        let mut within = start + tried;
        if within >= size {
            within -= size;
        }
        let port = first.wrapping_add(within as u16);
        index += 1;
        if usable(ctx, &request, sockets, port) {
            record_allocation(Some(before + tried + 1));
            return Some(Chunk::Found(port));
        }
    }
    let step = step.wrapping_add(ALLOC_CHUNK);
    if step >= size {
        record_allocation(None);
        return None;
    }
    let next = if step < round {
        PortSearch {
            first,
            round: round as u16,
            size,
            start,
            step,
        }
    } else {
        let round = round / 2;
        if round < MIN_ALLOC_ROUND {
            record_allocation(None);
            return None;
        }
        // SAFETY: the helper takes no arguments and has no preconditions.
        let random = unsafe { bpf_get_prandom_u32() };
        PortSearch {
            first,
            round: round as u16,
            size,
            start: random.checked_rem(size)?,
            step: 0,
        }
    };
    store_search::<A>(next);
    Some(Chunk::Taken)
}

/// Inserts both halves of the mapping of the request's flow through node port `port`, and
/// leaves the mapping (the egress half) in the request slot for the new-flow program.
///
/// The entries are built in the slot and inserted from there: an IPv6 entry is 48 bytes, and
/// two of them beside the keys would not fit the program's 512-byte stack.
#[inline(always)]
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "by value, the entries and keys in the slot would be copied to the stack"
)]
fn create<A: Family>(port: u16) -> Result<(), AllocError> {
    let Some(slot) = A::alloc_request().get_ptr_mut(0) else {
        return Err(AllocError::TableFull);
    };
    let now = now_ns();
    // SAFETY: per-CPU array slots are private to this CPU while the program runs. Each field is
    // read afresh, volatile (see `request`), where it is used, rather than copied out whole;
    // the map helpers read the key and the entries from the slot.
    unsafe {
        let key = &raw const (*slot).key;
        let snat_addr = core::ptr::read_volatile(&raw const (*slot).snat_addr);
        let origin = core::ptr::read_volatile(&raw const (*slot).origin);
        let reply_key = NatKey::new(
            core::ptr::read_volatile(&raw const (*key).dst_addr),
            snat_addr,
            core::ptr::read_volatile(&raw const (*key).dst_port),
            port,
            core::ptr::read_volatile(&raw const (*key).protocol),
            Direction::Ingress,
        );
        (*slot).entry = NatEntry::new(
            core::ptr::read_volatile(&raw const (*key).src_addr),
            core::ptr::read_volatile(&raw const (*key).src_port),
            origin,
            FlowMarks::from_bits(0),
            now,
            0,
        );
        insert_reply_half(&reply_key, &(*slot).entry)?;
        let flow_flags = core::ptr::read_volatile(&raw const (*slot).flow_flags);
        (*slot).entry = NatEntry::new(
            snat_addr,
            port,
            origin,
            FlowMarks::from_bits(flow_flags | FLOW_SEEN | FLOW_ANSWERED),
            now,
            now,
        );
        if A::nat()
            .insert(&*key, &(*slot).entry, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            return Ok(());
        }
        remove_reply_half(&reply_key);
        // Another CPU mapped this flow first: use theirs.
        if let Some(existing) = A::nat().get_ptr(&*key) {
            copy_into(&raw mut (*slot).entry, existing);
            return Ok(());
        }
    }
    Err(AllocError::TableFull)
}

/// Inserts the ingress half `entry` of a new mapping under `reply_key` if that tuple is free,
/// which reserves it for the flow.
#[cfg(not(feature = "variant-one-entry-per-flow"))]
#[inline(always)]
fn insert_reply_half<A: Family>(
    reply_key: &NatKey<A>,
    entry: &NatEntry<A>,
) -> Result<(), AllocError> {
    /// `-EEXIST`: the key of a `BPF_NOEXIST` insert is taken.
    const EEXIST: i32 = -17;
    match A::nat().insert(reply_key, entry, u64::from(BPF_NOEXIST)) {
        Ok(()) => Ok(()),
        // The port is taken: a preferred port is tried by this insert alone (the caller then
        // searches), and a searched one was taken by another CPU since its lookup (the packet's
        // next retransmission searches again).
        Err(EEXIST) => Err(AllocError::NoPort),
        Err(_) => Err(AllocError::TableFull),
    }
}

/// The one-entry benchmark variant: the ingress half is never inserted, so a new flow costs one
/// insert (its replies then find no mapping and are dropped).
#[cfg(feature = "variant-one-entry-per-flow")]
#[inline(always)]
fn insert_reply_half<A: Family>(
    _reply_key: &NatKey<A>,
    _entry: &NatEntry<A>,
) -> Result<(), AllocError> {
    Ok(())
}

/// Frees the ingress half inserted under `reply_key` when its egress half could not be.
#[cfg(not(feature = "variant-one-entry-per-flow"))]
#[inline(always)]
fn remove_reply_half<A: Family>(reply_key: &NatKey<A>) {
    let _ = A::nat().remove(reply_key);
}

/// The one-entry benchmark variant: there is no ingress half to free.
#[cfg(feature = "variant-one-entry-per-flow")]
#[inline(always)]
fn remove_reply_half<A: Family>(_reply_key: &NatKey<A>) {}

/// Reserves a tuple of a protocol without ports (GRE, ESP, ...) for the node's own traffic
/// towards that remote. Such a tuple can belong to one flow only, and the node's own (a tunnel
/// endpoint, typically) always wins: a pod flow holding it loses its mapping here (counted as a
/// conflict) and its next packet is refused, so the node's traffic is never delivered to a pod.
/// Leaves the mapping in the request slot, as [`create`] does.
#[inline(always)]
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "by value, the entries and keys in the slot would be copied to the stack"
)]
fn reserve_for_node<A: Family>(node_ip: A) -> Result<(), AllocError> {
    let Some(slot) = A::alloc_request().get_ptr_mut(0) else {
        return Err(AllocError::TableFull);
    };
    let now = now_ns();
    // SAFETY: as in `create`.
    unsafe {
        let key = &raw const (*slot).key;
        // The reply tuple: the remote's packets to the node, with no ports.
        let reply_key = NatKey::new(
            core::ptr::read_volatile(&raw const (*key).dst_addr),
            node_ip,
            0,
            0,
            core::ptr::read_volatile(&raw const (*key).protocol),
            Direction::Ingress,
        );
        if let Some(existing) = A::nat().get_ptr(&reply_key)
            && (*existing).origin != ORIGIN_HOST
        {
            // The pod flow's egress key, read straight from its entry.
            count_in::<A>(Counter::MappingConflict);
            let _ = A::nat().remove(&peer_of(&reply_key, existing));
        }
        (*slot).entry = NatEntry::new(
            core::ptr::read_volatile(&raw const (*key).src_addr),
            0,
            ORIGIN_HOST,
            FlowMarks::from_bits(0),
            now,
            0,
        );
        if A::nat()
            .insert(&reply_key, &(*slot).entry, u64::from(BPF_ANY))
            .is_err()
        {
            return Err(AllocError::TableFull);
        }
        (*slot).entry = NatEntry::new(
            node_ip,
            0,
            ORIGIN_HOST,
            FlowMarks::from_bits(FLOW_SEEN | FLOW_ANSWERED),
            now,
            now,
        );
        if A::nat()
            .insert(&*key, &(*slot).entry, u64::from(BPF_ANY))
            .is_err()
        {
            return Err(AllocError::TableFull);
        }
    }
    record_allocation(Some(1));
    Ok(())
}

/// What became of a TCP segment that needs masquerading, opens no connection and has no
/// mapping (see [`revive`]).
pub(crate) enum Revival {
    /// Its flow's old mapping is back in the table.
    Revived,
    /// Its flow was masqueraded but cannot have its old mapping back (the address is gone, or
    /// the port taken): it gets a new one, as conntrack picks up a flow it lost.
    PickUp,
    /// masq never translated its flow (or forgot it): it leaves as it is, as conntrack leaves
    /// the flows it holds untranslated.
    Unknown,
}

/// Gives the flow of `key`, whose mapping the agent removed, its mapping back, if its egress half
/// is among the removed ones and the uplink's address is still `node_ip`.
///
/// The agent removes a flow idle past conntrack's timeout for its state, or bound to an
/// address the uplink lost. conntrack (`tcp_loose`) picks such a flow up again from any
/// segment, on a new port under MASQUERADE's `--random-fully`, which the remote end answers
/// with a reset. masq gives it back its own port when it is still free, and the connection
/// lives; on a new address it picks the flow up as conntrack does. The flows masq never saw
/// translated are not among the removed ones: they pass as before.
#[inline(always)]
pub(crate) fn revive<A: Family>(ctx: &TcContext, key: &NatKey<A>, node_ip: A) -> Revival {
    let Some(removed) = A::expired().get_ptr(key) else {
        return Revival::Unknown;
    };
    // SAFETY: the pointer comes from a successful lookup; the entry is copied at once.
    let removed = unsafe { *removed };
    let _ = A::expired().remove(key);
    if removed.addr != node_ip
        || sockets::owned_in(
            ctx,
            SocketTable::Tcp,
            key.dst_addr,
            key.dst_port,
            removed.addr,
            removed.port,
        )
    {
        return Revival::PickUp;
    }
    let now = now_ns();
    let egress = NatEntry::new(
        removed.addr,
        removed.port,
        removed.origin,
        FlowMarks::from_bits(FLOW_SEEN | FLOW_ANSWERED),
        now,
        now,
    );
    let reply_key = key.peer(&egress);
    let reply = NatEntry::new(
        key.src_addr,
        key.src_port,
        removed.origin,
        FlowMarks::from_bits(FLOW_SEEN),
        now,
        now,
    );
    // The reply half first, as the allocator inserts: it is the lock on the reply tuple.
    if A::nat()
        .insert(reply_key, reply, u64::from(BPF_NOEXIST))
        .is_err()
    {
        return Revival::PickUp;
    }
    if A::nat()
        .insert(key, egress, u64::from(BPF_NOEXIST))
        .is_err()
    {
        // Another CPU mapped the flow meanwhile: its mapping stands.
        let _ = A::nat().remove(reply_key);
        return Revival::PickUp;
    }
    Revival::Revived
}

/// Remembers a UDP flow that a masqueraded address opened towards a pod; `key` is the tuple
/// the pod's replies will carry on egress. The replies are then recognised and left alone, as
/// conntrack would treat them, instead of being masqueraded as new flows. Flows whose replies
/// the policy exempts anyway need nothing. Returns whether a new flow was recorded.
#[inline(always)]
pub(crate) fn track_inbound<A: Family>(settings: &Settings, key: &NatKey<A>) -> bool {
    // Most inbound traffic to pods comes from non-masquerade (in-cluster) addresses: the
    // policy's own decision for the pod's replies answers for those without touching the NAT
    // table.
    if crate::egress::pod_exemption(settings, key.src_addr, key.dst_addr).is_some() {
        return false;
    }
    if lookup(key, FLOW_SEEN, false, TcpNumbers::default(), Sender::Remote).is_some() {
        return false;
    }
    let now = now_ns();
    let identity = NatEntry::new(
        key.src_addr,
        key.src_port,
        ORIGIN_INBOUND,
        FlowMarks::from_bits(FLOW_SEEN),
        now,
        now,
    );
    let tracked = A::nat()
        .insert(key, identity, u64::from(BPF_NOEXIST))
        .is_ok();
    if tracked {
        crate::evict::remember::<A>(key);
    }
    tracked
}
