//! Garbage collection of the NAT table: flows end when they have been idle longer than conntrack
//! would keep them in their state, and their ports become free again.
//!
//! Each pass reads the whole table once ([`collect_table`]) and judges every flow on that
//! snapshot with the flow model (`masq_common::flow`): its state and assurance, in its halves,
//! give its lifetime; the later of its halves' last-seen times, its last activity. A flow idle
//! past its lifetime is retired ([`retire`]). While the table is more than 95 % full, the pass
//! also retires the flows conntrack's collector drops early, the unassured and the TCP
//! connections being torn down, oldest first, until it is 90 % full: room kept free, so that a
//! new flow rarely has to evict one. And it corrects the datapath's count of unassured flows per
//! holder from what the snapshot holds.

use std::{collections::HashMap, net::IpAddr};

use masq_common::{
    flow::{FlowClass, Timeouts, datagram, reclaimable, tcp},
    layout::MAP_FRAGS_V4,
    nat::{
        Address, Direction, FRAG_LIFETIME_NS, NatEntry, NatKey, ORIGIN_HOST, ORIGIN_INBOUND,
        ORIGIN_POD, RemoteHolder, last_activity, proto,
    },
};

use super::{
    error::DatapathError,
    maps::{BPF_NOEXIST, DatapathMaps, NatTable},
};
use crate::sys::bpf::{self, Taken};
pub use crate::sys::clock::monotonic_now_ns;

/// Above this share of the table (in thousandths) a pass retires reclaimable flows...
const RESERVE_HIGH_PER_MILLE: usize = 950;
/// ...until the table is back at this share.
const RESERVE_LOW_PER_MILLE: usize = 900;
/// Holders a report keeps, busiest first.
pub const TOP_HOLDERS: usize = 5;

/// What one collection found and did, per family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReports {
    /// The IPv4 table, and the IPv4 fragment decisions.
    pub ipv4: GcReport,
    /// The IPv6 table.
    pub ipv6: GcReport,
}

impl GcReports {
    /// Flows removed because they expired, in both families.
    pub const fn expired(&self) -> usize {
        self.ipv4.expired + self.ipv6.expired
    }

    /// Halves without a partner removed, in both families.
    pub const fn orphans(&self) -> usize {
        self.ipv4.orphans + self.ipv6.orphans
    }

    /// Flows retired early to keep room free, in both families.
    pub fn reclaimed(&self) -> usize {
        self.ipv4.reclaimed_total() + self.ipv6.reclaimed_total()
    }
}

/// What one collection of one family's table found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Flows (egress halves) in the table before collecting.
    pub flows: usize,
    /// Entries in the table before collecting (both halves, orphans included).
    pub entries: usize,
    /// Flows removed because they expired.
    pub expired: usize,
    /// Halves without a partner removed because they expired.
    pub orphans: usize,
    /// Flows retired early to keep room free (the table was over 95 % full), by class
    /// (`FlowClass` as index).
    pub reclaimed: [usize; FlowClass::ALL.len()],
    /// Fragment decisions removed.
    pub fragments: usize,
    /// Unassured flows in the table after collecting.
    pub unassured: usize,
    /// The local addresses holding the most unassured flows after collecting, busiest first
    /// (at most [`TOP_HOLDERS`]).
    pub top_holders: Vec<(IpAddr, u64)>,
    /// The remote endpoints whose node ports are most in use after collecting, busiest first
    /// (at most [`TOP_REMOTES`]).
    pub busiest_remotes: Vec<RemoteUse>,
    /// The node ports each remote endpoint may have in use (the settings' ports).
    pub ports_per_remote: u32,
}

/// The node ports one remote endpoint has in use: it can hold one flow per port of the ranges
/// (for each node address), so a remote near its ranges' size refuses new flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct RemoteUse {
    /// The node address the flows leave with.
    pub node: IpAddr,
    /// The remote address and port (0 for protocols without ports).
    pub remote: std::net::SocketAddr,
    /// IP protocol number.
    pub protocol: u8,
    /// Node ports in use towards it.
    pub ports: usize,
}

impl RemoteUse {
    /// `ip:port/protocol`, as metrics and `masq status` name a remote.
    pub fn label(&self) -> String {
        let protocol = match self.protocol {
            proto::TCP => "tcp".to_owned(),
            proto::UDP => "udp".to_owned(),
            proto::SCTP => "sctp".to_owned(),
            proto::ICMP => "icmp".to_owned(),
            proto::ICMPV6 => "icmpv6".to_owned(),
            other => other.to_string(),
        };
        format!("{}/{protocol}", self.remote)
    }

    /// Its share of `ports_per_remote`, in percent.
    pub fn percent(&self, ports_per_remote: u32) -> u32 {
        if ports_per_remote == 0 {
            return 0;
        }
        u32::try_from(self.ports.saturating_mul(100) / ports_per_remote as usize)
            .unwrap_or(u32::MAX)
    }
}

/// Remote endpoints a report keeps, busiest first.
pub const TOP_REMOTES: usize = 5;

/// From this share of its ports on (in percent), a remote is busy: the collector records how
/// many of them each pod holds, for the allocator to share out the last ones (see the
/// datapath's `evict::take_from_busier`).
const BUSY_REMOTE_PERCENT: usize = 50;

/// Node ports in use per remote endpoint among `entries` (egress halves of flows that took a
/// node port: the pods' and the node's own), busiest first.
pub fn remote_use<A: Address + Into<IpAddr>>(
    entries: impl IntoIterator<Item = (NatKey<A>, NatEntry<A>)>,
) -> Vec<RemoteUse> {
    let mut counts: HashMap<(A, A, u16, u8), usize> = HashMap::new();
    for (key, entry) in entries {
        if key.direction() == Some(Direction::Egress) && entry.origin != ORIGIN_INBOUND {
            *counts
                .entry((entry.addr, key.dst_addr, key.dst_port, key.protocol))
                .or_default() += 1;
        }
    }
    let mut remotes: Vec<RemoteUse> = counts
        .into_iter()
        .map(|((node, remote, remote_port, protocol), ports)| RemoteUse {
            node: node.into(),
            remote: std::net::SocketAddr::new(remote.into(), remote_port),
            protocol,
            ports,
        })
        .collect();
    remotes.sort_by(|a, b| b.ports.cmp(&a.ports).then(a.cmp(b)));
    remotes
}

impl GcReport {
    /// Flows retired early, whatever their class.
    pub fn reclaimed_total(&self) -> usize {
        self.reclaimed.iter().sum()
    }
}

/// Collects both families' tables and the fragment decisions as of `now_ns`.
pub fn collect(
    maps: &mut DatapathMaps,
    timeouts: &Timeouts,
    now_ns: u64,
) -> Result<GcReports, DatapathError> {
    let mut ipv4 = collect_table::<[u8; 4]>(maps, timeouts, now_ns)?;
    ipv4.fragments = collect_fragments(maps, now_ns)?;
    let ipv6 = collect_table::<[u8; 16]>(maps, timeouts, now_ns)?;
    Ok(GcReports { ipv4, ipv6 })
}

/// A flow of the snapshot: its halves' keys and what they held.
#[derive(Clone, Copy, Debug)]
pub struct Judged<A: NatTable>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    key: NatKey<A>,
    entry: NatEntry<A>,
    /// The other half's key, and what it held (`None`: it had none).
    peer: Option<(NatKey<A>, Option<NatEntry<A>>)>,
}

impl<A: NatTable> Judged<A>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    /// The half `key` holding `entry`, with its other half's key and entry (`None` for an
    /// orphan).
    pub const fn new(
        key: NatKey<A>,
        entry: NatEntry<A>,
        peer: Option<(NatKey<A>, Option<NatEntry<A>>)>,
    ) -> Self {
        Self { key, entry, peer }
    }

    /// The other half's entry, if the flow had one.
    fn peer_entry(&self) -> Option<&NatEntry<A>> {
        self.peer.as_ref().and_then(|(_, entry)| entry.as_ref())
    }
}

/// Collects one family's table (see the module's documentation).
pub fn collect_table<A: NatTable>(
    maps: &mut DatapathMaps,
    timeouts: &Timeouts,
    now_ns: u64,
) -> Result<GcReport, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    // The holders' counts as the pass begins: the datapath's changes during the pass are what
    // the count read at its end holds beyond these.
    let holders_before: HashMap<A, u64> = maps.holders_of::<A>()?.into_iter().collect();
    let entries = maps.nat_entries_of::<A>()?;
    let table: HashMap<NatKey<A>, NatEntry<A>> = entries.iter().copied().collect();
    let mut report = GcReport {
        entries: table.len(),
        ..GcReport::default()
    };
    // The flows that stay, for the reserve and the holders' counts.
    let mut live: Vec<(Judged<A>, u64)> = Vec::new();
    for (key, entry) in &entries {
        match key.direction() {
            Some(Direction::Egress) => {
                report.flows += 1;
                let peer = (entry.origin != ORIGIN_INBOUND).then(|| {
                    let peer_key = key.peer(entry);
                    (peer_key, table.get(&peer_key).copied())
                });
                let judged = Judged::new(*key, *entry, peer);
                let orphan = matches!(judged.peer, Some((_, None)));
                let lifetime = if orphan {
                    alone_lifetime(timeouts, key.protocol)
                } else {
                    entry.lifetime(key.protocol, timeouts)
                };
                let last = last_activity(entry, judged.peer_entry());
                if now_ns.saturating_sub(last) > lifetime && collect_flow(maps, &judged)? {
                    if orphan {
                        report.orphans += 1;
                    } else {
                        report.expired += 1;
                    }
                } else {
                    live.push((judged, last));
                }
            }
            Some(Direction::Ingress) => {
                let peer_key = key.peer(entry);
                if !table.contains_key(&peer_key)
                    && now_ns.saturating_sub(last_activity(entry, None))
                        > alone_lifetime(timeouts, key.protocol)
                    && collect_flow(maps, &Judged::new(*key, *entry, None))?
                {
                    report.orphans += 1;
                }
            }
            // Not written by any masq datapath: drop it rather than let it hold a slot.
            None => {
                remove(maps, key)?;
                report.orphans += 1;
            }
        }
    }
    let capacity = A::capacity(maps) as usize;
    let remaining = report.entries - 2 * report.expired - report.orphans;
    reclaim(maps, &mut live, remaining, capacity, &mut report)?;
    reconcile_holders(maps, &live, &holders_before, &mut report)?;
    record_busy_remotes(maps, &live, &mut report)?;
    Ok(report)
}

/// How long a half without its other half may stay idle: as a flow that was never answered, so
/// that it goes after the short unanswered timeouts instead of holding its port for an
/// established TCP flow's five days.
fn alone_lifetime(timeouts: &Timeouts, protocol: u8) -> u64 {
    let state = if protocol == proto::TCP {
        tcp::SYN_SENT
    } else {
        datagram::UNREPLIED
    };
    timeouts.lifetime(protocol, state, false, false)
}

/// Retires the oldest reclaimable flows of `live` while the table (`entries` of `capacity`) is
/// over [`RESERVE_HIGH_PER_MILLE`], down to [`RESERVE_LOW_PER_MILLE`], as conntrack's collector
/// drops unassured and closing entries while its table is over 95 %. Retired flows leave
/// `live`.
fn reclaim<A: NatTable>(
    maps: &mut DatapathMaps,
    live: &mut Vec<(Judged<A>, u64)>,
    mut entries: usize,
    capacity: usize,
    report: &mut GcReport,
) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    if capacity == 0 || entries * 1000 <= capacity * RESERVE_HIGH_PER_MILLE {
        return Ok(());
    }
    let target = capacity * RESERVE_LOW_PER_MILLE / 1000;
    let mut candidates: Vec<usize> = (0..live.len())
        .filter(|&index| {
            let (judged, _) = &live[index];
            reclaimable(
                judged.key.protocol,
                judged.entry.state,
                judged.entry.is_assured(),
            )
        })
        .collect();
    candidates.sort_by_key(|&index| live[index].1);
    let mut retired = Vec::new();
    for index in candidates {
        if entries <= target {
            break;
        }
        let judged = live[index].0;
        if collect_flow(maps, &judged)? {
            let class = FlowClass::of(
                judged.key.protocol,
                judged.entry.state,
                judged.entry.origin == ORIGIN_INBOUND,
            );
            report.reclaimed[class as usize] += 1;
            entries -= if judged.peer.is_some() { 2 } else { 1 };
            retired.push(index);
        }
    }
    retired.sort_unstable();
    for index in retired.into_iter().rev() {
        live.swap_remove(index);
    }
    Ok(())
}

/// Corrects the holders' counts of unassured flows from the snapshot (see `nat::Holder`): each
/// count becomes what the snapshot holds for that holder, plus what the datapath added or took
/// since the pass began (what its count now holds beyond the one read then). A correction is
/// written only where it changes something; a holder with nothing left, whose count did not
/// move during the pass, is forgotten. Also fills the report's busiest holders.
fn reconcile_holders<A: NatTable>(
    maps: &mut DatapathMaps,
    live: &[(Judged<A>, u64)],
    before: &HashMap<A, u64>,
    report: &mut GcReport,
) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let mut counted: HashMap<A, u64> = HashMap::new();
    for (judged, _) in live {
        if !judged.entry.is_assured() {
            *counted.entry(judged.key.src_addr).or_default() += 1;
        }
    }
    report.unassured = counted.values().sum::<u64>() as usize;
    let now: HashMap<A, u64> = maps.holders_of::<A>()?.into_iter().collect();
    let mut holders: Vec<A> = counted.keys().chain(now.keys()).copied().collect();
    holders.sort_unstable();
    holders.dedup();
    for holder in holders {
        let now_count = now.get(&holder).copied().unwrap_or(0);
        let moved = i128::from(now_count) - i128::from(before.get(&holder).copied().unwrap_or(0));
        let snapshot = counted.get(&holder).copied().unwrap_or(0);
        let corrected = u64::try_from((i128::from(snapshot) + moved).max(0)).unwrap_or(0);
        if corrected == 0 && moved == 0 {
            match A::holders_mut(maps).remove(&holder) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(error) => {
                    return Err(DatapathError::map("removing from", A::HOLDERS_MAP_NAME)(
                        error,
                    ));
                }
            }
        } else if corrected != now_count {
            A::holders_mut(maps)
                .insert(
                    holder,
                    masq_common::nat::Holder {
                        unassured: corrected,
                    },
                    0,
                )
                .map_err(DatapathError::map("writing", A::HOLDERS_MAP_NAME))?;
        }
    }
    let mut busiest: Vec<(IpAddr, u64)> = counted
        .into_iter()
        .map(|(holder, count)| (holder.into(), count))
        .collect();
    busiest.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    busiest.truncate(TOP_HOLDERS);
    report.top_holders = busiest;
    Ok(())
}

/// Records the busiest remotes in `report`, and writes how many ports each pod holds towards
/// every busy one (see [`BUSY_REMOTE_PERCENT`]) into the remote-holders table, removing what it
/// held for remotes no longer busy.
fn record_busy_remotes<A: NatTable>(
    maps: &mut DatapathMaps,
    live: &[(Judged<A>, u64)],
    report: &mut GcReport,
) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    report.ports_per_remote = maps.settings()?.total_ports;
    let remotes = remote_use(live.iter().map(|(judged, _)| (judged.key, judged.entry)));
    let busy_ports = report.ports_per_remote as usize * BUSY_REMOTE_PERCENT / 100;
    let mut per_remote: HashMap<(A, u16, u8), usize> = HashMap::new();
    for (judged, _) in live {
        if judged.entry.origin != ORIGIN_INBOUND {
            let key = &judged.key;
            *per_remote
                .entry((key.dst_addr, key.dst_port, key.protocol))
                .or_default() += 1;
        }
    }
    let busy: Vec<(A, u16, u8)> = per_remote
        .into_iter()
        .filter(|&(_, ports)| busy_ports > 0 && ports >= busy_ports)
        .map(|(remote, _)| remote)
        .collect();
    let mut held: HashMap<RemoteHolder<A>, u64> = HashMap::new();
    for (judged, _) in live {
        let key = &judged.key;
        if judged.entry.origin == ORIGIN_POD
            && busy.contains(&(key.dst_addr, key.dst_port, key.protocol))
        {
            *held.entry(RemoteHolder::of(key.src_addr, key)).or_default() += 1;
        }
    }
    A::sync_remote_holders(maps, &held)?;
    report.busiest_remotes = remotes.into_iter().take(TOP_REMOTES).collect();
    Ok(())
}

/// Removes a flow judged on the snapshot, unless a packet refreshed it since (see [`retire`]);
/// returns whether it did.
fn collect_flow<A: NatTable>(
    maps: &mut DatapathMaps,
    judged: &Judged<A>,
) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let buried = bury(maps, judged)?;
    let retired = retire(maps, judged)?;
    if !retired && buried {
        unbury(maps, judged)?;
    }
    Ok(retired)
}

/// Removes a flow judged on the snapshot (see [`Judged`]), unless a packet refreshed it since;
/// returns whether it did.
///
/// The order is what keeps a live flow's packets right while its halves go, and it matters:
///
/// 1. a masqueraded TCP flow is buried first ([`bury`], by the caller): from then on, a
///    segment of either end that finds a half missing gives the flow its halves back (the
///    datapath's `nat::revive`), so no segment leaves with the pod's address and no reply
///    reaches the node's stack (which would reset the connection). Other flows need nothing:
///    a pod's datagram without a mapping gets a new one, as under conntrack.
/// 2. The egress half is taken out with the value it had at that instant
///    (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`): if it is not what was judged, a packet refreshed the
///    flow, and it is put back unless a packet made it anew meanwhile (theirs wins: it is
///    newer). While it is out, the reply half still translates replies.
/// 3. The reply half likewise. If a reply refreshed it, it is put back, and the egress half
///    too, only if the reply half is the flow's again: a half is never restored over a tuple
///    another flow took.
///
/// Kernels before 5.14 cannot take hash entries out; there a read just before the removal,
/// compared with the judgement, is the last check.
pub fn retire<A: NatTable>(
    maps: &mut DatapathMaps,
    judged: &Judged<A>,
) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    match take(maps, &judged.key)? {
        Taken::Unsupported => {
            if get(maps, &judged.key)? != Some(judged.entry) {
                return Ok(false);
            }
            if let Some((peer_key, peer)) = &judged.peer
                && get(maps, peer_key)? != *peer
            {
                return Ok(false);
            }
            remove(maps, &judged.key)?;
            if let Some((peer_key, _)) = &judged.peer {
                remove(maps, peer_key)?;
            }
            return Ok(true);
        }
        Taken::Removed(taken) if taken != judged.entry => {
            put_back(maps, &judged.key, &taken)?;
            return Ok(false);
        }
        Taken::Removed(_) | Taken::Absent => {}
    }
    let Some((peer_key, judged_peer)) = &judged.peer else {
        return Ok(true);
    };
    match take(maps, peer_key)? {
        Taken::Removed(taken) if Some(taken) != *judged_peer => {
            if put_back(maps, peer_key, &taken)? {
                put_back(maps, &judged.key, &judged.entry)?;
            }
            Ok(false)
        }
        Taken::Unsupported => {
            remove(maps, peer_key)?;
            Ok(true)
        }
        Taken::Removed(_) | Taken::Absent => Ok(true),
    }
}

/// Keeps both halves of a masqueraded TCP flow where the datapath finds them if a segment of the
/// flow still comes, from either end (`nat::revive` in the datapath): the connection gets its
/// mapping back, in the state it was in, instead of leaving with the pod's address or being
/// reset by the node's stack. Other flows need nothing (see [`retire`]). An LRU table: the
/// flows removed last are kept. Returns whether the flow was buried.
fn bury<A: NatTable>(maps: &mut DatapathMaps, judged: &Judged<A>) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let masqueraded_tcp = judged.key.protocol == proto::TCP
        && judged.key.direction() == Some(Direction::Egress)
        && judged.entry.origin == ORIGIN_POD;
    let Some((peer_key, Some(peer))) = judged.peer.filter(|_| masqueraded_tcp) else {
        return Ok(false);
    };
    let buried = A::buried_mut(maps);
    for (key, entry) in [(&judged.key, &judged.entry), (&peer_key, &peer)] {
        buried
            .insert(key, entry, 0)
            .map_err(DatapathError::map("writing", A::BURIED_MAP_NAME))?;
    }
    Ok(true)
}

/// Forgets a flow [`bury`] buried that lives on after all.
fn unbury<A: NatTable>(maps: &mut DatapathMaps, judged: &Judged<A>) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let buried = A::buried_mut(maps);
    let keys = std::iter::once(judged.key).chain(judged.peer.map(|(peer_key, _)| peer_key));
    for key in keys {
        match buried.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(error) => {
                return Err(DatapathError::map("removing from", A::BURIED_MAP_NAME)(
                    error,
                ));
            }
        }
    }
    Ok(())
}

/// Takes `key`'s entry out of its table (see [`retire`]).
fn take<A: NatTable>(
    maps: &DatapathMaps,
    key: &NatKey<A>,
) -> Result<Taken<NatEntry<A>>, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    bpf::take(A::table_fd(maps), key).map_err(DatapathError::map("removing from", A::MAP_NAME))
}

/// Puts a half taken out by [`retire`] back, unless a packet created one meanwhile (which wins:
/// it is newer); returns whether it was put back.
fn put_back<A: NatTable>(
    maps: &mut DatapathMaps,
    key: &NatKey<A>,
    entry: &NatEntry<A>,
) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    match A::table_mut(maps).insert(key, entry, BPF_NOEXIST) {
        Ok(()) => Ok(true),
        Err(aya::maps::MapError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(false)
        }
        Err(error) => Err(DatapathError::map("restoring in", A::MAP_NAME)(error)),
    }
}

/// Removes every flow masqueraded to `address`, both halves, and returns how many: the address
/// has left its uplink, and MASQUERADE's address notifier flushes the conntrack entries bound
/// to it, so that the next packet of each flow gets a new mapping on the address the uplink has
/// now instead of leaving from one the node no longer owns. A TCP flow is buried first (see
/// [`retire`]), so that its next segment, in the instant between the halves' removals or after,
/// is picked up on the new address rather than leaving with the pod's. The node's own flows
/// (identity entries) are left to expire: their sockets are bound to the old address and end
/// with it.
pub fn flush_address<A: NatTable>(
    maps: &mut DatapathMaps,
    address: A,
) -> Result<usize, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let entries = maps.nat_entries_of::<A>()?;
    let table: HashMap<NatKey<A>, NatEntry<A>> = entries.iter().copied().collect();
    let mut flushed = 0;
    for (key, entry) in &entries {
        let masqueraded_to_it = key.direction() == Some(Direction::Egress)
            && entry.addr == address
            && entry.origin != ORIGIN_HOST
            && entry.origin != ORIGIN_INBOUND;
        if masqueraded_to_it {
            let peer_key = key.peer(entry);
            let judged = Judged::new(
                *key,
                *entry,
                Some((peer_key, table.get(&peer_key).copied())),
            );
            bury(maps, &judged)?;
            remove(maps, key)?;
            remove(maps, &peer_key)?;
            flushed += 1;
        }
    }
    Ok(flushed)
}

/// Removes the IPv4 fragment decisions older than a fragment may live; returns how many.
fn collect_fragments(maps: &mut DatapathMaps, now_ns: u64) -> Result<usize, DatapathError> {
    let mut removed = 0;
    let stale_fragments: Vec<_> = maps
        .frags_v4
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, entry)| now_ns.saturating_sub(entry.created_ns) > FRAG_LIFETIME_NS)
        .map(|(key, _)| key)
        .collect();
    for key in stale_fragments {
        match maps.frags_v4.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => removed += 1,
            Err(error) => return Err(DatapathError::map("removing from", MAP_FRAGS_V4)(error)),
        }
    }
    Ok(removed)
}

fn get<A: NatTable>(
    maps: &DatapathMaps,
    key: &NatKey<A>,
) -> Result<Option<NatEntry<A>>, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    match A::table(maps).get(key, 0) {
        Ok(entry) => Ok(Some(entry)),
        Err(aya::maps::MapError::KeyNotFound) => Ok(None),
        Err(error) => Err(DatapathError::map("reading", A::MAP_NAME)(error)),
    }
}

fn remove<A: NatTable>(maps: &mut DatapathMaps, key: &NatKey<A>) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    match A::table_mut(maps).remove(key) {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(error) => Err(DatapathError::map("removing from", A::MAP_NAME)(error)),
    }
}

#[cfg(test)]
mod tests {
    use masq_common::nat::proto;

    use super::*;

    const fn after(seconds: u64) -> u64 {
        seconds * 1_000_000_000
    }

    /// Issue 9: an egress half left without its reply half (its TCP flow marked as seen) was
    /// held as established, 5 days. A half alone goes as an unanswered flow would, whatever
    /// its state says.
    #[test]
    fn a_half_left_alone_goes_after_the_unanswered_timeout() {
        let timeouts = Timeouts::LINUX_DEFAULTS;
        assert_eq!(alone_lifetime(&timeouts, proto::TCP), after(120));
        assert_eq!(alone_lifetime(&timeouts, proto::UDP), after(30));
        assert_eq!(alone_lifetime(&timeouts, proto::ICMP), after(30));
    }

    #[test]
    fn an_icmpv6_echo_lives_as_long_as_an_icmp_echo() {
        let timeouts = Timeouts::LINUX_DEFAULTS;
        assert_eq!(
            timeouts.lifetime(proto::ICMPV6, datagram::REPLIED, false, false),
            timeouts.lifetime(proto::ICMP, datagram::REPLIED, false, false)
        );
    }
}
