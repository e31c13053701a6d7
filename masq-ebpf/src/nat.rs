//! The NAT table: finding a packet's mapping, creating new ones, and giving back the mappings
//! the agent removed.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::generated::bpf_get_prandom_u32,
    programs::TcContext,
};
use masq_common::{
    counters::{ALLOC_CHUNK, Counter, FIRST_ALLOC_ROUND, MIN_ALLOC_ROUND},
    flow::{TcpSegment, Window, datagram, first_state, tcp_flags},
    nat::{Direction, NatEntry, NatKey, ORIGIN_HOST, ORIGIN_INBOUND, PortSearch, proto},
    settings::Settings,
};

use crate::{
    clock::now_ns,
    counters::{count_in, record_allocation},
    evict,
    family::Family,
    holders, policy,
    sockets::{self, SocketTable},
    table::{copy_entry, peer_of, write_entry, write_window},
    track,
};

/// The translation a packet's half of a flow holds, as a lookup found it.
#[derive(Clone, Copy)]
pub(crate) struct Mapping<A> {
    /// The address to put in place of the local (egress) or node (ingress) address.
    pub(crate) addr: A,
    /// The port to put in place of the local or node port.
    pub(crate) port: u16,
    /// `ORIGIN_*` of the flow.
    pub(crate) origin: u8,
    /// 1 when the packet leaves its flow as it is and was tracked (see `track::quiet`); 0 when
    /// it is a flow event, tracked by nothing yet.
    pub(crate) quiet: u8,
}

/// The mapping stored under `key`, with the packet (of `key`'s protocol; for TCP, `segment`)
/// tracked on its flow if it changes nothing but its window and last-seen time (see
/// `track::quiet`); a packet that moves its flow is left for the flow-event program
/// ([`Mapping::quiet`] zero). `outbound`: the packet leaves by the uplink.
#[inline(always)]
pub(crate) fn lookup<A: Family>(
    key: &NatKey<A>,
    outbound: bool,
    segment: &TcpSegment,
) -> Option<Mapping<A>> {
    let half = A::nat().get_ptr_mut(key)?;
    // SAFETY: the pointer comes from a successful lookup and stays valid for this program run;
    // the translation's fields are read once, here.
    let (addr, port, origin) = unsafe {
        (
            A::load(&raw const (*half).addr),
            core::ptr::read_volatile(&raw const (*half).port),
            core::ptr::read_volatile(&raw const (*half).origin),
        )
    };
    let quiet = track::quiet(half, outbound, key.protocol, segment, now_ns());
    Some(Mapping {
        addr,
        port,
        origin,
        quiet: u8::from(quiet),
    })
}

/// Why no mapping could be created.
pub(crate) enum AllocError {
    /// Every port tried is taken towards this remote endpoint.
    NoPort,
    /// An SCTP flow's own port is taken towards this remote endpoint.
    SctpPortInUse,
    /// The NAT table is full (and nothing could be evicted, or the allocator's next run will
    /// try again after an eviction): the new flow is dropped.
    TableFull,
    /// The flow's pod holds its whole share of the table in unassured flows, and none of
    /// them could make room.
    HolderShare,
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
/// created the same flow meanwhile, its mapping wins and ours is rolled back. Before anything,
/// a pod at its share of the table must make room among its own flows (see `evict`).
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
    // The node's own traffic is never refused for its share: a pod's flood cannot touch it,
    // and a node that floods is the operator's to see.
    if origin != ORIGIN_HOST && !evict::within_share::<A>(settings, request.source) {
        return Some(Err(AllocError::HolderShare));
    }
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
        // The node's own flow holds its own port: no socket lookup, which would find it.
        let sockets = if origin == ORIGIN_HOST {
            None
        } else {
            socket_table(request)
        };
        if !socket_owned(ctx, request, sockets, port) {
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
    /// The local end: the flow's source, its holder.
    source: A,
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
    let slot = A::handoff().get_ptr(0)?;
    // SAFETY: the slot is a valid, aligned map value private to this CPU while the program
    // runs; the field pointers are derived from it without creating references.
    unsafe {
        let key = &raw const (*slot).request.key;
        Some(NewFlow {
            source: A::load(&raw const (*key).src_addr),
            remote: A::load(&raw const (*key).dst_addr),
            snat_addr: A::load(&raw const (*slot).request.node_addr),
            remote_port: core::ptr::read_volatile(&raw const (*key).dst_port),
            src_port: core::ptr::read_volatile(&raw const (*key).src_port),
            protocol: core::ptr::read_volatile(&raw const (*key).protocol),
            origin: core::ptr::read_volatile(&raw const (*slot).request.origin),
        })
    }
}

/// The port search's state, read back from the request slot like [`request`], so that every
/// run of the allocator and every way into the search meet one verification of it.
#[inline(always)]
fn search_state<A: Family>() -> Option<PortSearch> {
    let slot = A::handoff().get_ptr(0)?;
    // SAFETY: as in `request`.
    Some(unsafe { core::ptr::read_volatile(&raw const (*slot).search) })
}

/// Stores the port search's state in the request slot for the rest of this run and the next.
#[inline(always)]
fn store_search<A: Family>(search: PortSearch) {
    if let Some(slot) = A::handoff().get_ptr_mut(0) {
        // SAFETY: as in `request`.
        unsafe { core::ptr::write_volatile(&raw mut (*slot).search, search) };
    }
}

/// Sets the request's search to try `port` alone (the port a flow just gave up for it; see
/// `evict::take_from_busier`): the allocator's next run maps the flow there, or finds no port.
#[inline(always)]
pub(crate) fn search_one<A: Family>(port: u16) {
    store_search::<A>(PortSearch {
        first: port,
        round: MIN_ALLOC_ROUND as u16,
        size: 1,
        start: 0,
        step: 0,
    });
}

/// Marks the request's search as over, whatever its outcome, so that the next request finds
/// no search to resume even if it comes from an egress program older than this allocator
/// (during an upgrade, which shares the request slot), which does not reset it.
#[inline(always)]
pub(crate) fn end_search<A: Family>() {
    if let Some(slot) = A::handoff().get_ptr_mut(0) {
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

/// The socket table a flow of `request`'s protocol must not clash with on a port the search
/// gives it (the node's own flows too: one given another port must not take a node socket's);
/// `None` for protocols the kernel cannot be asked about.
#[inline(always)]
fn socket_table<A: Family>(request: &NewFlow<A>) -> Option<SocketTable> {
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
/// leaves the mapping (the egress half) in the slot for the new-flow program.
///
/// The entries are built in the slot and inserted from there: an IPv6 entry is 64 bytes, and
/// two of them beside the keys would not fit the program's 512-byte stack. The flow starts in
/// the state its first packet gives it, and a TCP flow's window from its first segment (a flow
/// picked up mid-stream, without its handshake, liberal: see `flow::WINDOW_LIBERAL`).
#[inline(always)]
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "by value, the entries and keys in the slot would be copied to the stack"
)]
fn create<A: Family>(port: u16) -> Result<(), AllocError> {
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        return Err(AllocError::TableFull);
    };
    let now = now_ns();
    // SAFETY: per-CPU array slots are private to this CPU while the program runs. Each field is
    // read afresh, volatile (see `request`), where it is used, rather than copied out whole;
    // the map helpers read the key and the entries from the slot.
    unsafe {
        let key = &raw const (*slot).request.key;
        let snat_addr = A::load(&raw const (*slot).request.node_addr);
        let origin = core::ptr::read_volatile(&raw const (*slot).request.origin);
        let protocol = core::ptr::read_volatile(&raw const (*key).protocol);
        let segment = core::ptr::read_volatile(&raw const (*slot).request.segment);
        let state = first_state(protocol, segment.flags);
        let reply_key = NatKey::new(
            A::load(&raw const (*key).dst_addr),
            snat_addr,
            core::ptr::read_volatile(&raw const (*key).dst_port),
            port,
            protocol,
            Direction::Ingress,
        );
        let mapping = &raw mut (*slot).mapping;
        write_entry(
            mapping,
            A::load(&raw const (*key).src_addr),
            core::ptr::read_volatile(&raw const (*key).src_port),
            origin,
            state,
            now,
            0,
        );
        insert_reply_half(&reply_key, &*mapping)?;
        write_entry(mapping, snat_addr, port, origin, state, now, now);
        if protocol == proto::TCP {
            write_window(
                mapping,
                &Window::first(&segment, segment.flags & tcp_flags::SYN == 0),
            );
        }
        if A::nat()
            .insert(&*key, &(*slot).mapping, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            return Ok(());
        }
        let _ = A::nat().remove(&reply_key);
        // Another CPU mapped this flow first: use theirs.
        if let Some(existing) = A::nat().get_ptr(&*key) {
            copy_entry(&raw mut (*slot).mapping, existing);
            return Ok(());
        }
    }
    Err(AllocError::TableFull)
}

/// Inserts the ingress half `entry` of a new mapping under `reply_key` if that tuple is free,
/// which reserves it for the flow.
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
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        return Err(AllocError::TableFull);
    };
    let now = now_ns();
    // SAFETY: as in `create`.
    unsafe {
        let key = &raw const (*slot).request.key;
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
        let protocol = core::ptr::read_volatile(&raw const (*key).protocol);
        let mapping = &raw mut (*slot).mapping;
        write_entry(
            mapping,
            A::load(&raw const (*key).src_addr),
            0,
            ORIGIN_HOST,
            first_state(protocol, 0),
            now,
            0,
        );
        if A::nat()
            .insert(&reply_key, &*mapping, u64::from(BPF_ANY))
            .is_err()
        {
            return Err(AllocError::TableFull);
        }
        write_entry(
            mapping,
            node_ip,
            0,
            ORIGIN_HOST,
            first_state(protocol, 0),
            now,
            now,
        );
        if A::nat()
            .insert(&*key, &(*slot).mapping, u64::from(BPF_ANY))
            .is_err()
        {
            return Err(AllocError::TableFull);
        }
    }
    record_allocation(Some(1));
    Ok(())
}

/// What became of a packet that had no mapping, when the buried flows were asked (see
/// [`revive`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Revival {
    /// Its flow's old mapping is back in the table.
    Revived,
    /// Its flow was masqueraded but cannot have its old mapping back (the address is gone, or
    /// the tuple taken): on egress it gets a new one, as conntrack picks up a flow it lost.
    PickUp,
    /// masq never translated its flow (or forgot it): it passes as it is.
    Unknown,
}

/// Gives the TCP flow whose half `key` is (of either direction) its mapping back, if the agent
/// buried it (see `maps::BURIED_V4`) and the address it was masqueraded to is still `node_ip`.
///
/// The agent removes a flow idle past conntrack's timeout for its state, or bound to an address
/// the uplink lost, and buries both halves first. conntrack (`tcp_loose`) picks such a flow up
/// again from any segment, on a new port under MASQUERADE's `--random-fully`, which the remote
/// end answers with a reset; and a reply it no longer knows reaches the node's stack, which
/// resets the connection. masq gives the flow back its own halves, in the state they were
/// buried in (the caller then tracks the packet on it, its flags applied), when the tuple is
/// still free; on a new address, the egress side picks it up as conntrack does. Buried flows
/// are forgotten when revived, or when a new connection takes the tuple.
#[inline(always)]
pub(crate) fn revive<A: Family>(ctx: &TcContext, key: &NatKey<A>, node_ip: A) -> Revival {
    let Some(own) = A::buried().get_ptr(key) else {
        return Revival::Unknown;
    };
    let outbound = key.direction() == Some(Direction::Egress);
    let lost = if outbound {
        Revival::PickUp
    } else {
        Revival::Unknown
    };
    // SAFETY: the pointer comes from a successful lookup. The buried halves are inserted from
    // where they lie, not copied (two IPv6 entries do not fit beside the rest on the stack);
    // both are forgotten once the flow is back.
    let peer_key = &unsafe { peer_of(key, own) };
    let Some(peer) = A::buried().get_ptr(peer_key) else {
        // Half a flow cannot come back; forget it.
        let _ = A::buried().remove(key);
        return lost;
    };
    let (egress_key, reply_key, egress, reply) = if outbound {
        (key, peer_key, own, peer)
    } else {
        (peer_key, key, peer, own)
    };
    // SAFETY: both pointers come from successful lookups; the values are read by the helpers
    // alone.
    let (egress, reply): (&NatEntry<A>, &NatEntry<A>) = unsafe { (&*egress, &*reply) };
    // The address the flow was masqueraded to (what its replies are addressed to) must still
    // be the uplink's, and no node socket may have taken the tuple since.
    let gone = reply_key.dst_addr != node_ip
        || sockets::owned_in(
            ctx,
            SocketTable::Tcp,
            reply_key.src_addr,
            reply_key.src_port,
            reply_key.dst_addr,
            reply_key.dst_port,
        );
    // The reply half first, as the allocator inserts: it is the lock on the reply tuple. A
    // reply half still there (the agent stopped between removing one half and the other) is
    // the flow's own if it restores the flow's source.
    let inserted_reply = !gone
        && A::nat()
            .insert(reply_key, reply, u64::from(BPF_NOEXIST))
            .is_ok();
    let reply_ours = inserted_reply
        || (!gone
            && A::nat().get_ptr(reply_key).is_some_and(|existing| {
                // SAFETY: the pointer comes from a successful lookup, read at once.
                unsafe { peer_of(reply_key, existing) == *egress_key }
            }));
    let outcome = if !reply_ours {
        lost
    } else if A::nat()
        .insert(egress_key, egress, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        // SAFETY: a reference to a map value, read once.
        if unsafe { core::ptr::read_volatile(&raw const egress.assured) } == 0 {
            holders::add_one::<A>(egress_key.src_addr);
        }
        Revival::Revived
    } else if A::nat().get_ptr(egress_key).is_some_and(|existing| {
        // SAFETY: the pointer comes from a successful lookup, read at once.
        unsafe { peer_of(egress_key, existing) == *reply_key }
    }) {
        // The egress half is the flow's own: the agent stopped between the halves, or another
        // CPU revived the flow first. With the reply half, the flow is whole.
        Revival::Revived
    } else {
        // A new mapping took the egress tuple meanwhile: it stands.
        if inserted_reply {
            let _ = A::nat().remove(reply_key);
        }
        if A::nat().get_ptr(key).is_some() {
            Revival::Revived
        } else {
            lost
        }
    };
    let _ = A::buried().remove(key);
    let _ = A::buried().remove(peer_key);
    outcome
}

/// What became of a UDP datagram from a masqueraded address to a pod (see [`track_inbound`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Inbound {
    /// The pod's answers need nothing (an exempt destination for them), or the flow is known.
    Known,
    /// A new inbound flow is tracked.
    Tracked,
    /// The pod holds its whole share of the table in unassured flows and none made room: the
    /// datagram is dropped, as conntrack drops what it cannot track.
    Refused,
    /// The table is full of assured flows: the flow is not tracked, its datagram passes.
    Untracked,
}

/// Remembers a UDP flow that a masqueraded address opened towards a pod; `key` is the tuple the
/// pod's replies will carry on egress. The replies are then recognised and left alone, as
/// conntrack would treat them, instead of being masqueraded as new flows. Flows whose replies
/// the policy exempts anyway need nothing. The flow counts against the pod's share, as the
/// pod's own flows do: a flood from outside towards one pod churns that pod's flows only.
#[inline(always)]
pub(crate) fn track_inbound<A: Family>(settings: &Settings, key: &NatKey<A>) -> Inbound {
    // Most inbound traffic to pods comes from non-masquerade (in-cluster) addresses: the
    // policy's own decision for the pod's replies answers for those without touching the NAT
    // table.
    if policy::pod_exemption(settings, key.src_addr, key.dst_addr).is_some() {
        return Inbound::Known;
    }
    if A::nat().get_ptr(key).is_some() {
        return Inbound::Known;
    }
    if !evict::within_share::<A>(settings, key.src_addr) {
        return Inbound::Refused;
    }
    let now = now_ns();
    // Built in the hand-off's mapping, the program's scratch: an IPv6 entry on the stack
    // would not fit beside the rest.
    let Some(slot) = A::handoff().get_ptr_mut(0) else {
        return Inbound::Untracked;
    };
    // SAFETY: per-CPU array slots are private to this CPU while the program runs.
    let identity = unsafe {
        let identity = &raw mut (*slot).mapping;
        write_entry(
            identity,
            key.src_addr,
            key.src_port,
            ORIGIN_INBOUND,
            datagram::UNREPLIED,
            now,
            now,
        );
        &*identity
    };
    let mut inserted = A::nat().insert(key, identity, u64::from(BPF_NOEXIST));
    if inserted.is_err() && A::nat().get_ptr(key).is_none() && evict::make_room::<A>(settings) {
        inserted = A::nat().insert(key, identity, u64::from(BPF_NOEXIST));
    }
    if inserted.is_err() {
        return if A::nat().get_ptr(key).is_some() {
            Inbound::Known
        } else {
            Inbound::Untracked
        };
    }
    // SAFETY: `key` is the caller's, valid for the call.
    unsafe { evict::admitted::<A>(settings, key) };
    Inbound::Tracked
}
