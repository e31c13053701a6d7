//! Garbage collection of the NAT table: flows end when they have been idle longer than Linux
//! conntrack would keep them, and their ports become free again.
//!
//! The datapath records, per half, when it last saw a packet (refreshed at most once a second)
//! and which TCP flags it saw. LRU eviction only acts when the table is full; this collector is
//! what normally frees ports, so the table's fullness reflects live flows.

use std::collections::HashMap;

use masq_common::{
    layout::MAP_FRAGS_V4,
    nat::{
        Direction, FLOW_SEEN, FRAG_LIFETIME_NS, FlowMarks, NatEntry, NatKey, ORIGIN_HOST,
        ORIGIN_INBOUND, ORIGIN_POD, proto,
    },
    timeouts::FlowTimeouts,
};

use super::{
    batch::Taken,
    error::DatapathError,
    maps::{BPF_NOEXIST, DatapathMaps, NatTable},
};

/// What one collection found and did, per family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
}

/// What one collection of one family's table found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Flows (egress halves) in the table before collecting.
    pub flows: usize,
    /// Entries in the table before collecting (both halves, orphans included).
    pub entries: usize,
    /// Flows removed because they expired.
    pub expired: usize,
    /// Halves without a partner removed because they expired.
    pub orphans: usize,
    /// Fragment decisions removed.
    pub fragments: usize,
}

/// The current `CLOCK_MONOTONIC` time, the clock `bpf_ktime_get_coarse_ns` reads.
pub fn monotonic_now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    let seconds = u64::try_from(now.tv_sec()).unwrap_or(0);
    let nanos = u64::try_from(now.tv_nsec()).unwrap_or(0);
    seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Removes expired flows of both families and fragment decisions as of `now_ns`.
pub fn collect(
    maps: &mut DatapathMaps,
    timeouts: &FlowTimeouts,
    now_ns: u64,
) -> Result<GcReports, DatapathError> {
    let mut ipv4 = collect_table::<[u8; 4]>(maps, timeouts, now_ns)?;
    ipv4.fragments = collect_fragments(maps, now_ns)?;
    let ipv6 = collect_table::<[u8; 16]>(maps, timeouts, now_ns)?;
    Ok(GcReports { ipv4, ipv6 })
}

/// Removes the expired flows of one family's NAT table.
pub fn collect_table<A: NatTable>(
    maps: &mut DatapathMaps,
    timeouts: &FlowTimeouts,
    now_ns: u64,
) -> Result<GcReport, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let entries = maps.nat_entries_of::<A>()?;
    let table: HashMap<NatKey<A>, NatEntry<A>> = entries.iter().copied().collect();
    let mut report = GcReport {
        entries: table.len(),
        ..GcReport::default()
    };

    for (key, entry) in &entries {
        match key.direction() {
            Some(Direction::Egress) => {
                report.flows += 1;
                let peer_key = key.peer(entry);
                match table.get(&peer_key) {
                    Some(peer)
                        if timeouts.expired(key.protocol, entry, peer, now_ns)
                            && collect_flow(
                                maps,
                                &Judged::new(*key, *entry, Some((peer_key, Some(*peer)))),
                            )? =>
                    {
                        report.expired += 1;
                    }
                    Some(_) => {}
                    None if timeouts.expired(key.protocol, entry, &alone(entry), now_ns)
                        && collect_flow(maps, &Judged::new(*key, *entry, None))? =>
                    {
                        report.orphans += 1;
                    }
                    None => {}
                }
            }
            Some(Direction::Ingress) => {
                let peer_key = key.peer(entry);
                if !table.contains_key(&peer_key)
                    && timeouts.expired(key.protocol, entry, &alone(entry), now_ns)
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
    Ok(report)
}

/// A flow the collector judged expired on its snapshot of the table: what each half held then.
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
    /// The half `key` holding `entry` judged expired, with its other half's key and entry
    /// (`None` for an orphan).
    pub const fn new(
        key: NatKey<A>,
        entry: NatEntry<A>,
        peer: Option<(NatKey<A>, Option<NatEntry<A>>)>,
    ) -> Self {
        Self { key, entry, peer }
    }
}

/// Removes a flow judged expired (see [`Judged`]), unless a packet refreshed it since; returns
/// whether it did.
///
/// Each half is taken out with its value at that instant (`BPF_MAP_LOOKUP_AND_DELETE_ELEM`), so
/// no refresh between the judgement and the removal goes unseen, as one between a read and a
/// separate delete would: a half that changed since the judgement was refreshed by a packet,
/// and what was taken out is put back at once, so the flow lives on. A packet in the
/// microseconds a half is out finds no mapping (one refreshing the other half recreates the
/// missing one); no refreshed flow is lost for good. The egress half goes first: while it is
/// out, the reply half still translates replies. Kernels before 5.14 cannot take hash entries
/// out; there a read just before the removal, compared with the judgement, is the last check.
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
            put_back(maps, peer_key, &taken)?;
            put_back(maps, &judged.key, &judged.entry)?;
            Ok(false)
        }
        Taken::Unsupported => {
            remove(maps, peer_key)?;
            Ok(true)
        }
        Taken::Removed(_) | Taken::Absent => Ok(true),
    }
}

/// Removes a flow judged expired on the snapshot, unless a packet refreshed it since (see
/// [`retire`]), and remembers an answered TCP flow for a late segment; returns whether it did.
fn collect_flow<A: NatTable>(
    maps: &mut DatapathMaps,
    judged: &Judged<A>,
) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    if !retire(maps, judged)? {
        return Ok(false);
    }
    let answered = judged
        .peer
        .and_then(|(_, peer)| peer)
        .is_some_and(|peer| peer.marks.bits() & FLOW_SEEN != 0);
    if answered {
        bury(maps, &judged.key, &judged.entry)?;
    }
    Ok(true)
}

/// Keeps the egress half of a removed flow where the egress program finds it if a segment of
/// the flow still comes (`nat::revive` in the datapath): a masqueraded TCP connection gets its
/// mapping back instead of leaving with the pod's address. Other flows need nothing: a UDP or
/// ICMP packet without a mapping gets a new one, as under conntrack, and the node's own flows
/// are not translated. An LRU table: the flows removed last are kept.
fn bury<A: NatTable>(
    maps: &mut DatapathMaps,
    key: &NatKey<A>,
    entry: &NatEntry<A>,
) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let masqueraded_tcp = key.protocol == proto::TCP
        && key.direction() == Some(Direction::Egress)
        && entry.origin == ORIGIN_POD;
    match A::expired_mut(maps) {
        Some(expired) if masqueraded_tcp => expired
            .insert(key, entry, 0)
            .map_err(DatapathError::map("writing", A::EXPIRED_MAP_NAME)),
        _ => Ok(()),
    }
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
    super::batch::take(A::table_fd(maps), key)
        .map_err(DatapathError::map("removing from", A::MAP_NAME))
}

/// Puts a half taken out by [`retire`] back, unless a packet created one meanwhile (which wins:
/// it is newer).
fn put_back<A: NatTable>(
    maps: &mut DatapathMaps,
    key: &NatKey<A>,
    entry: &NatEntry<A>,
) -> Result<(), DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    match A::table_mut(maps).insert(key, entry, BPF_NOEXIST) {
        Ok(()) => Ok(()),
        Err(aya::maps::MapError::SyscallError(error))
            if error.io_error.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(())
        }
        Err(error) => Err(DatapathError::map("restoring in", A::MAP_NAME)(error)),
    }
}

/// Removes every flow masqueraded to `address`, both halves, and returns how many: the address
/// has left its uplink, and MASQUERADE's address notifier flushes the conntrack entries bound
/// to it, so that the next packet of each flow gets a new mapping on the address the uplink has
/// now instead of leaving from one the node no longer owns. The node's own flows (identity
/// entries) are left to expire: their sockets are bound to the old address and end with it.
pub fn flush_address<A: NatTable>(
    maps: &mut DatapathMaps,
    address: A,
) -> Result<usize, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let mut flushed = 0;
    for (key, entry) in maps.nat_entries_of::<A>()? {
        let masqueraded_to_it = key.direction() == Some(Direction::Egress)
            && entry.addr == address
            && entry.origin != ORIGIN_HOST
            && entry.origin != ORIGIN_INBOUND;
        if masqueraded_to_it {
            remove(maps, &key)?;
            remove(maps, &key.peer(&entry))?;
            // A TCP connection's next segment is then picked up on the new address rather
            // than leaving with the pod's, as conntrack picks up a flow after the flush.
            bury(maps, &key, &entry)?;
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

/// The other half a half without one is judged against. An inbound UDP flow has no other half by
/// design: its one entry sees both directions. Any other half is alone because its flow was
/// torn down (a conflict, a failed insert): it is judged as never answered, so it goes after
/// the short unanswered timeouts instead of holding its port for an established TCP flow's 5
/// days.
fn alone<A: NatTable>(entry: &NatEntry<A>) -> NatEntry<A>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    if entry.origin == ORIGIN_INBOUND {
        return *entry;
    }
    NatEntry {
        marks: FlowMarks::default(),
        last_seen_ns: 0,
        ..*entry
    }
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
    use masq_common::nat::{FLOW_SEEN, ORIGIN_POD, proto};

    use super::*;

    fn half<A: NatTable>(address: A, origin: u8, marks: u8) -> NatEntry<A>
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        NatEntry::new(address, 2_000, origin, FlowMarks::from_bits(marks), 0, 0)
    }

    const fn after(seconds: u64) -> u64 {
        seconds * 1_000_000_000
    }

    /// Issue 9: an egress half left without its reply half (its TCP flow marked as seen) was
    /// held as established, 5 days. Both families are judged alike.
    fn a_half_left_alone_goes_after_the_unanswered_timeout<A: NatTable>(address: A)
    where
        NatKey<A>: aya::Pod,
        NatEntry<A>: aya::Pod,
    {
        let timeouts = FlowTimeouts::LINUX_DEFAULTS;
        let orphan = half(address, ORIGIN_POD, FLOW_SEEN);
        assert!(!timeouts.expired(proto::TCP, &orphan, &alone(&orphan), after(119)));
        assert!(timeouts.expired(proto::TCP, &orphan, &alone(&orphan), after(121)));
        // An inbound UDP flow is one entry by design, and keeps what it saw.
        let inbound = half(address, ORIGIN_INBOUND, FLOW_SEEN);
        assert_eq!(alone(&inbound), inbound);
    }

    #[test]
    fn an_ipv4_half_left_alone_goes_after_the_unanswered_timeout() {
        a_half_left_alone_goes_after_the_unanswered_timeout([192, 0, 2, 1]);
    }

    #[test]
    fn an_ipv6_half_left_alone_goes_after_the_unanswered_timeout() {
        let address = "2001:db8::1"
            .parse::<std::net::Ipv6Addr>()
            .expect("address");
        a_half_left_alone_goes_after_the_unanswered_timeout(address.octets());
    }

    #[test]
    fn an_icmpv6_echo_lives_as_long_as_an_icmp_echo() {
        let timeouts = FlowTimeouts::LINUX_DEFAULTS;
        let v6 = half([0x20; 16], ORIGIN_POD, FLOW_SEEN);
        let v4 = half([192, 0, 2, 1], ORIGIN_POD, FLOW_SEEN);
        assert_eq!(
            timeouts.idle_limit(proto::ICMPV6, &v6, &v6),
            timeouts.idle_limit(proto::ICMP, &v4, &v4)
        );
    }
}
