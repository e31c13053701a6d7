//! Garbage collection of the NAT table: flows end when they have been idle longer than Linux
//! conntrack would keep them, and their ports become free again.
//!
//! The datapath records, per half, when it last saw a packet (refreshed at most once a second)
//! and which TCP flags it saw. LRU eviction only acts when the table is full; this collector is
//! what normally frees ports, so the table's fullness reflects live flows.

use std::collections::HashMap;

use masq_common::{
    layout::MAP_FRAGS_V4,
    nat::{Direction, FRAG_LIFETIME_NS, FlowMarks, NatEntry, NatKey, ORIGIN_HOST, ORIGIN_INBOUND},
    timeouts::FlowTimeouts,
};

use super::{
    error::DatapathError,
    maps::{DatapathMaps, NatTable},
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
                        // A packet may have refreshed the flow since the snapshot.
                        && still_expired(maps, key, timeouts, now_ns, Some(&peer_key))? =>
                    {
                        remove(maps, key)?;
                        remove(maps, &peer_key)?;
                        report.expired += 1;
                    }
                    Some(_) => {}
                    None if timeouts.expired(key.protocol, entry, &alone(entry), now_ns)
                        && still_expired(maps, key, timeouts, now_ns, None)? =>
                    {
                        remove(maps, key)?;
                        report.orphans += 1;
                    }
                    None => {}
                }
            }
            Some(Direction::Ingress) => {
                let peer_key = key.peer(entry);
                if !table.contains_key(&peer_key)
                    && timeouts.expired(key.protocol, entry, &alone(entry), now_ns)
                    && still_expired(maps, key, timeouts, now_ns, None)?
                {
                    remove(maps, key)?;
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

/// Re-reads the entries of a flow and checks it is still expired.
fn still_expired<A: NatTable>(
    maps: &DatapathMaps,
    key: &NatKey<A>,
    timeouts: &FlowTimeouts,
    now_ns: u64,
    peer_key: Option<&NatKey<A>>,
) -> Result<bool, DatapathError>
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let Some(entry) = get(maps, key)? else {
        return Ok(false);
    };
    let peer = match peer_key {
        Some(peer_key) => get(maps, peer_key)?.unwrap_or_else(|| alone(&entry)),
        None => alone(&entry),
    };
    Ok(timeouts.expired(key.protocol, &entry, &peer, now_ns))
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
