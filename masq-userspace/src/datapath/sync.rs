//! Bringing the datapath maps in line with the policy and the agent's settings.

use std::{
    cmp::Ordering,
    net::{Ipv4Addr, Ipv6Addr},
};

use aya::maps::lpm_trie::Key;
use masq_common::{
    ports::PortRange,
    settings::{
        MAX_PORT_RANGES, SETTING_ENABLED, SETTING_RANDOM_FULLY, SETTING_SOURCE_EXEMPTIONS, Settings,
    },
};

use crate::{
    causes::WithCauses,
    config::cidr::Family,
    policy::{NomasqEntries, TrieAddress as _},
};

use super::{
    error::DatapathError,
    maps::{DatapathMaps, NomasqTrie, Trie},
};

/// What a trie sync changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrieSync {
    /// Entries inserted or relabelled.
    pub added: usize,
    /// Entries deleted.
    pub removed: usize,
    /// Entries already right.
    pub unchanged: usize,
}

/// A config whose entries do not fit a trie.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the config needs {needed} {what}, but the datapath holds at most {capacity}{remedy}",
    what = match .trie {
        Trie::Destinations => "non-masquerade trie entries (CIDRs plus link-local)",
        Trie::Sources => "source trie entries of one family (nonMasqueradeSrcCIDRs)",
    },
    remedy = match .trie {
        Trie::Destinations => "; raise --nomasq-max-entries",
        Trie::Sources => "",
    }
)]
pub struct TrieCapacityError {
    /// Entries the config needs.
    pub needed: usize,
    /// Entries the trie holds.
    pub capacity: u32,
    /// Which trie.
    pub trie: Trie,
}

/// What a trie sync compares the desired entries with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrieView {
    /// The trie as the kernel holds it, read entry by entry: repairs any drift (a hand edit, a
    /// change the kernel refused and could not undo). Costs a syscall pair per entry.
    Kernel,
    /// What the last successful sync wrote, when there was one (else the kernel's view): a
    /// config change then costs only the syscalls of what changed.
    LastSynced,
}

/// Checks that `needed` entries fit a destination trie of `capacity`, before anything is
/// changed.
pub fn check_trie_capacity(needed: usize, capacity: u32) -> Result<(), TrieCapacityError> {
    check_capacity(Trie::Destinations, needed, capacity)
}

/// Checks that `needed` entries fit `trie` of `capacity`, before anything is changed.
pub fn check_capacity(trie: Trie, needed: usize, capacity: u32) -> Result<(), TrieCapacityError> {
    if needed > capacity as usize {
        return Err(TrieCapacityError {
            needed,
            capacity,
            trie,
        });
    }
    Ok(())
}

/// Makes a family's non-masquerade trie hold exactly `desired`, or, if the kernel refuses a change
/// half-way, exactly what it held before: a config is applied whole or not at all.
///
/// New and changed entries are written before stale ones are deleted, so a destination that is
/// exempt under both the old and the new config is exempt at every instant of the change: no
/// packet is masqueraded by mistake while the trie is in flux. Only when old and new together
/// exceed the trie's capacity are the stale entries deleted before the last additions.
pub fn sync_nomasq<A: NomasqTrie>(
    maps: &mut DatapathMaps,
    desired: &NomasqEntries<A>,
    view: TrieView,
) -> Result<TrieSync, DatapathError> {
    sync_trie(maps, Trie::Destinations, desired, view)
}

/// Makes a family's source trie hold exactly `desired` (`nonMasqueradeSrcCIDRs`), as
/// [`sync_nomasq`] does the destination trie: whole or not at all, additions first.
pub fn sync_nomasq_src<A: NomasqTrie>(
    maps: &mut DatapathMaps,
    desired: &NomasqEntries<A>,
    view: TrieView,
) -> Result<TrieSync, DatapathError> {
    sync_trie(maps, Trie::Sources, desired, view)
}

/// Makes a family's `trie` hold exactly `desired` (see [`sync_nomasq`]).
pub fn sync_trie<A: NomasqTrie>(
    maps: &mut DatapathMaps,
    trie: Trie,
    desired: &NomasqEntries<A>,
    view: TrieView,
) -> Result<TrieSync, DatapathError> {
    apply_trie(maps, trie, desired, view).map(|(report, _)| report)
}

/// [`sync_trie`], with the journal of what it changed, for a later failure to undo.
fn apply_trie<A: NomasqTrie>(
    maps: &mut DatapathMaps,
    trie: Trie,
    desired: &NomasqEntries<A>,
    view: TrieView,
) -> Result<(TrieSync, Journal<A>), DatapathError> {
    let mut journal = Journal {
        trie,
        undo: Vec::new(),
    };
    let capacity = A::capacity(maps, trie);
    check_capacity(trie, desired.len(), capacity)?;
    let current: NomasqEntries<A> = match (view, A::last_synced(maps, trie).take()) {
        (TrieView::LastSynced, Some(last)) => last,
        _ => maps.trie_entries_of::<A>(trie)?.into_iter().collect(),
    };
    // Both maps are sorted: one walk over the two finds what to write and what to delete, so
    // a small change to a large list costs no lookups per entry.
    let (mut changes, mut stale) = (Vec::new(), Vec::new());
    let (mut want, mut have) = (desired.iter().peekable(), current.iter().peekable());
    loop {
        let order = match (want.peek(), have.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((wanted, _)), Some((held, _))) => A::order(wanted).cmp(&A::order(held)),
        };
        match order {
            Ordering::Less => changes.extend(want.next().copied()),
            Ordering::Greater => stale.extend(have.next().map(|&(key, _)| key)),
            Ordering::Equal => {
                if let (Some(&(key, kind)), Some(&(_, held))) = (want.next(), have.next())
                    && kind != held
                {
                    changes.push((key, kind));
                }
            }
        }
    }
    let report = TrieSync {
        added: changes.len(),
        removed: stale.len(),
        unchanged: desired.len() - changes.len(),
    };
    // Additions that fit next to every old entry go first; the rest after the removals.
    let mut room = (capacity as usize).saturating_sub(current.len());
    let (early, late): (Vec<_>, Vec<_>) = changes.iter().partition(|(key, _)| {
        if current.get(key).is_some() {
            return true;
        }
        if room > 0 {
            room -= 1;
            return true;
        }
        false
    });
    if !late.is_empty() {
        tracing::warn!(
            late = late.len(),
            capacity,
            trie = A::map_name(trie),
            "the old and new entries together exceed the trie: stale entries are removed before the last additions"
        );
    }
    let applied = (|| {
        for &(key, kind) in &early {
            journal.write(maps, key, kind, current.get(&key).copied())?;
        }
        for &key in &stale {
            journal.remove(maps, key, current.get(&key).copied())?;
        }
        for &(key, kind) in &late {
            journal.write(maps, key, kind, None)?;
        }
        Ok(())
    })();
    match applied {
        Ok(()) => {
            *A::last_synced(maps, trie) = Some(desired.clone());
            Ok((report, journal))
        }
        // The undo may fail too: the next sync reads what the kernel holds.
        Err(error) => {
            journal.undo(maps);
            Err(error)
        }
    }
}

/// What every trie of the datapath should hold: a config's whole say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedTries {
    /// The IPv4 destination trie.
    pub destinations_v4: NomasqEntries<Ipv4Addr>,
    /// The IPv6 destination trie (empty without `--enable-ipv6`).
    pub destinations_v6: NomasqEntries<Ipv6Addr>,
    /// The IPv4 source trie.
    pub sources_v4: NomasqEntries<Ipv4Addr>,
    /// The IPv6 source trie.
    pub sources_v6: NomasqEntries<Ipv6Addr>,
}

/// Every trie empty.
impl Default for WantedTries {
    fn default() -> Self {
        // `NomasqEntries`' derived `Default` would ask the address to have one.
        Self {
            destinations_v4: std::iter::empty().collect(),
            destinations_v6: std::iter::empty().collect(),
            sources_v4: std::iter::empty().collect(),
            sources_v6: std::iter::empty().collect(),
        }
    }
}

impl WantedTries {
    /// Whether the source tries hold entries once synced, so the datapath must look pod
    /// sources up (`SETTING_SOURCE_EXEMPTIONS`).
    pub fn source_exemptions(&self) -> bool {
        !self.sources_v4.is_empty() || !self.sources_v6.is_empty()
    }
}

/// What a sync of one trie changed: its family, which trie, the counts.
pub type TrieReport = (Family, Trie, TrieSync);

/// Puts a synced trie back as it was before (its journal's undo).
type Undo = Box<dyn FnOnce(&mut DatapathMaps)>;

/// Makes every trie hold what `wanted` says, or, if one cannot, every trie what it held
/// before: a config is applied whole or not at all. Every trie's capacity is checked before
/// any is changed. The destination tries go first, then the source tries; the caller sets
/// `SETTING_SOURCE_EXEMPTIONS` only afterwards, so the datapath never looks sources up in a
/// trie that is still being filled.
pub fn sync_tries(
    maps: &mut DatapathMaps,
    wanted: &WantedTries,
    view: TrieView,
) -> Result<Vec<TrieReport>, DatapathError> {
    for (trie, needed, capacity) in [
        (
            Trie::Destinations,
            wanted.destinations_v4.len(),
            Ipv4Addr::capacity(maps, Trie::Destinations),
        ),
        (
            Trie::Destinations,
            wanted.destinations_v6.len(),
            Ipv6Addr::capacity(maps, Trie::Destinations),
        ),
        (
            Trie::Sources,
            wanted.sources_v4.len(),
            Ipv4Addr::capacity(maps, Trie::Sources),
        ),
        (
            Trie::Sources,
            wanted.sources_v6.len(),
            Ipv6Addr::capacity(maps, Trie::Sources),
        ),
    ] {
        // A missing source trie (never in a loaded datapath) is `sync_trie`'s to report.
        if trie == Trie::Sources && capacity == 0 {
            continue;
        }
        check_capacity(trie, needed, capacity)?;
    }
    let mut reports = Vec::with_capacity(4);
    // The journals of the tries synced so far, to undo newest first if a later one fails.
    let mut synced: Vec<Undo> = Vec::with_capacity(4);
    let applied = (|| {
        let (report, journal) =
            apply_trie(maps, Trie::Destinations, &wanted.destinations_v4, view)?;
        reports.push((Ipv4Addr::FAMILY, Trie::Destinations, report));
        synced.push(Box::new(move |maps| journal.undo(maps)));
        let (report, journal) =
            apply_trie(maps, Trie::Destinations, &wanted.destinations_v6, view)?;
        reports.push((Ipv6Addr::FAMILY, Trie::Destinations, report));
        synced.push(Box::new(move |maps| journal.undo(maps)));
        let (report, journal) = apply_trie(maps, Trie::Sources, &wanted.sources_v4, view)?;
        reports.push((Ipv4Addr::FAMILY, Trie::Sources, report));
        synced.push(Box::new(move |maps| journal.undo(maps)));
        let (report, _) = apply_trie(maps, Trie::Sources, &wanted.sources_v6, view)?;
        reports.push((Ipv6Addr::FAMILY, Trie::Sources, report));
        Ok::<(), DatapathError>(())
    })();
    match applied {
        Ok(()) => Ok(reports),
        Err(error) => {
            // The trie that failed undid its own changes; those synced before it go back from
            // their journals, which holds even on the first sync, when nothing was synced
            // before to go back to.
            for undo in synced.into_iter().rev() {
                undo(maps);
            }
            Err(error)
        }
    }
}

/// The trie changes made so far, to be undone if a later one fails.
struct Journal<A> {
    /// Which trie.
    trie: Trie,
    /// (entry, its value before the change, if it had one).
    undo: Vec<((A, u8), Option<u32>)>,
}

fn trie_key<A: NomasqTrie>((addr, prefix): (A, u8)) -> Key<A::Octets> {
    Key::new(u32::from(prefix), addr.octets())
}

impl<A: NomasqTrie> Journal<A> {
    /// The journal's trie.
    fn map<'maps>(
        &self,
        maps: &'maps mut DatapathMaps,
    ) -> &'maps mut aya::maps::LpmTrie<aya::maps::MapData, A::Octets, u32> {
        A::trie_mut(maps, self.trie)
    }

    fn write(
        &mut self,
        maps: &mut DatapathMaps,
        key: (A, u8),
        kind: u32,
        before: Option<u32>,
    ) -> Result<(), DatapathError> {
        self.map(maps)
            .insert(&trie_key(key), kind, 0)
            .map_err(DatapathError::map("inserting into", A::map_name(self.trie)))?;
        self.undo.push((key, before));
        Ok(())
    }

    fn remove(
        &mut self,
        maps: &mut DatapathMaps,
        key: (A, u8),
        before: Option<u32>,
    ) -> Result<(), DatapathError> {
        self.map(maps)
            .remove(&trie_key(key))
            .map_err(DatapathError::map("removing from", A::map_name(self.trie)))?;
        self.undo.push((key, before));
        Ok(())
    }

    /// Puts every changed entry back as it was, newest change first. What the trie then holds
    /// is known only to the kernel: the next sync reads it there.
    fn undo(self, maps: &mut DatapathMaps) {
        *A::last_synced(maps, self.trie) = None;
        let name = A::map_name(self.trie);
        let trie = A::trie_mut(maps, self.trie);
        for (key, before) in self.undo.into_iter().rev() {
            let restored = match before {
                Some(kind) => trie.insert(&trie_key(key), kind, 0),
                None => trie.remove(&trie_key(key)),
            };
            if let Err(error) = restored {
                tracing::error!(trie = name, cidr = %format!("{}/{}", key.0, key.1), error = %WithCauses(&error), "could not undo a trie change; the next resync repairs it");
            }
        }
    }
}

/// The settings value for the datapath; `source_exemptions` when the source tries hold
/// entries (see [`WantedTries::source_exemptions`]).
pub fn settings(ranges: &[PortRange], random_fully: bool, source_exemptions: bool) -> Settings {
    let mut settings = Settings::DISABLED;
    let flag = |on: bool, bit: u32| if on { bit } else { 0 };
    settings.flags = SETTING_ENABLED
        | flag(random_fully, SETTING_RANDOM_FULLY)
        | flag(source_exemptions, SETTING_SOURCE_EXEMPTIONS);
    let ranges = &ranges[..ranges.len().min(MAX_PORT_RANGES)];
    for (slot, range) in settings.port_ranges.iter_mut().zip(ranges) {
        *slot = *range;
    }
    settings.port_range_count = u32::try_from(ranges.len()).unwrap_or(0);
    settings.total_ports = ranges.iter().map(PortRange::size).sum();
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_carry_ranges_and_flags() {
        let value = settings(
            &[PortRange::new(1024, 2047), PortRange::new(4000, 4000)],
            true,
            false,
        );
        assert!(value.enabled() && value.random_fully());
        assert!(!value.source_exemptions());
        assert_eq!(value.total_ports, 1025);
        assert_eq!(
            value.ranges(),
            [PortRange::new(1024, 2047), PortRange::new(4000, 4000)]
        );
    }

    #[test]
    fn sources_are_looked_up_exactly_while_the_source_tries_hold_entries() {
        let ranges = [PortRange::new(1024, 2047)];
        let with = settings(&ranges, false, true);
        assert!(with.enabled() && with.source_exemptions() && !with.random_fully());
        assert_eq!(
            settings(&ranges, false, false).flags,
            with.flags & !SETTING_SOURCE_EXEMPTIONS
        );

        let mut wanted = WantedTries {
            destinations_v4: [(("10.0.0.0".parse().unwrap(), 8), 1)]
                .into_iter()
                .collect(),
            ..WantedTries::default()
        };
        assert!(
            !wanted.source_exemptions(),
            "destination entries alone need no source lookup"
        );
        wanted.sources_v6 = [(("2001:db8::".parse().unwrap(), 32), 4)]
            .into_iter()
            .collect();
        assert!(wanted.source_exemptions());
    }

    #[test]
    fn a_source_trie_overflow_names_the_source_trie() {
        let message = check_capacity(Trie::Sources, 3, 2)
            .expect_err("3 entries in 2")
            .to_string();
        assert!(
            message.contains("nonMasqueradeSrcCIDRs") && !message.contains("--nomasq-max-entries"),
            "{message}"
        );
        let message = check_trie_capacity(3, 2).expect_err("3 in 2").to_string();
        assert!(message.contains("--nomasq-max-entries"), "{message}");
    }
}
