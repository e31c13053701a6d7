//! Bringing the datapath maps in line with the policy and the agent's settings.

use std::cmp::Ordering;

use aya::maps::lpm_trie::Key;
use masq_common::{
    ports::PortRange,
    settings::{MAX_PORT_RANGES, SETTING_ENABLED, SETTING_RANDOM_FULLY, Settings},
};

use crate::policy::NomasqEntries;

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

/// Makes a family's `trie` hold exactly `desired` (see [`sync_nomasq`]). A trie the handles
/// lack (a source trie opened from an older masq's pins) holds nothing, so nothing is all it
/// can be made to hold.
pub fn sync_trie<A: NomasqTrie>(
    maps: &mut DatapathMaps,
    trie: Trie,
    desired: &NomasqEntries<A>,
    view: TrieView,
) -> Result<TrieSync, DatapathError> {
    if A::trie(maps, trie).is_none() {
        if desired.is_empty() {
            return Ok(TrieSync::default());
        }
        return Err(DatapathError::Missing {
            kind: "map",
            name: A::map_name(trie),
        });
    }
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
    let mut journal = Journal {
        trie,
        undo: Vec::new(),
    };
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
            Ok(report)
        }
        // The undo may fail too: the next sync reads what the kernel holds.
        Err(error) => {
            journal.undo(maps);
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
    /// The journal's trie (`sync_trie` checked that the handles have it).
    fn map<'maps>(
        &self,
        maps: &'maps mut DatapathMaps,
    ) -> Result<&'maps mut aya::maps::LpmTrie<aya::maps::MapData, A::Octets, u32>, DatapathError>
    {
        A::trie_mut(maps, self.trie).ok_or(DatapathError::Missing {
            kind: "map",
            name: A::map_name(self.trie),
        })
    }

    fn write(
        &mut self,
        maps: &mut DatapathMaps,
        key: (A, u8),
        kind: u32,
        before: Option<u32>,
    ) -> Result<(), DatapathError> {
        self.map(maps)?
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
        self.map(maps)?
            .remove(&trie_key(key))
            .map_err(DatapathError::map("removing from", A::map_name(self.trie)))?;
        self.undo.push((key, before));
        Ok(())
    }

    /// Puts every changed entry back as it was, newest change first.
    fn undo(self, maps: &mut DatapathMaps) {
        let name = A::map_name(self.trie);
        let Some(trie) = A::trie_mut(maps, self.trie) else {
            return;
        };
        for (key, before) in self.undo.into_iter().rev() {
            let restored = match before {
                Some(kind) => trie.insert(&trie_key(key), kind, 0),
                None => trie.remove(&trie_key(key)),
            };
            if let Err(error) = restored {
                tracing::error!(trie = name, cidr = %format!("{}/{}", key.0, key.1), %error, "could not undo a trie change; the next resync repairs it");
            }
        }
    }
}

/// The settings value for the datapath.
pub fn settings(ranges: &[PortRange], random_fully: bool) -> Settings {
    let mut settings = Settings::DISABLED;
    settings.flags = SETTING_ENABLED
        | if random_fully {
            SETTING_RANDOM_FULLY
        } else {
            0
        };
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
        );
        assert!(value.enabled() && value.random_fully());
        assert_eq!(value.total_ports, 1025);
        assert_eq!(
            value.ranges(),
            [PortRange::new(1024, 2047), PortRange::new(4000, 4000)]
        );
    }
}
