//! What a start does with the pin directory, decided from what is pinned and what is requested
//! alone: no kernel is asked, so every case is tested here.

use masq_common::layout::{
    IPV6_DISABLED_ENTRIES, MAP_FLOW_INDEX_V6, MAP_NAT_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6,
};

use super::LifecycleOptions;
use crate::datapath::pins::{PinnedCapacities, PinnedState};

/// What a start does with the pin directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Create and pin a fresh map set, once the maps `clearing` says are removed.
    Install {
        /// What is pinned already and goes first.
        clearing: Option<Clearing>,
    },
    /// Adopt the pinned map set: live flows continue.
    Adopt(Adoption),
    /// Leave the pins alone and refuse to start: they are of another layout, and replacing
    /// them was not asked for.
    Refuse {
        /// What differs.
        detail: String,
    },
}

/// Pinned maps a fresh install removes first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Clearing {
    /// Maps of an install interrupted before it completed: no program uses them.
    Leftovers(Vec<&'static str>),
    /// Maps of another layout (what differs), replaced as asked
    /// (`--replace-incompatible-state`): their live flows are lost.
    Incompatible(String),
}

/// How the pinned map set is adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adoption {
    /// The capacities the pinned maps were created with. The NAT table keeps its own:
    /// resizing it needs `masq uninstall`, which drops live flows.
    pub pinned: PinnedCapacities,
    /// The NAT capacity requested, when it differs from the pinned one and so is not applied.
    pub ignored_nat_max_entries: Option<u32>,
    /// The capacity the non-masquerade trie is rebuilt with (holding the old one's entries),
    /// when another one is requested; kept if the entries do not fit (see
    /// [`Adoption::replaced_maps`]).
    pub trie_capacity: Option<u32>,
    /// The IPv6 maps an agent without `--enable-ipv6` created with room for nothing, to be
    /// replaced by ones sized for translation (they are empty, so nothing is lost).
    pub ipv6_maps: Vec<&'static str>,
}

impl Adoption {
    /// The maps to build afresh and rename over the pinned ones, in that order; `trie_fits`
    /// says whether the pinned trie's entries fit [`Adoption::trie_capacity`].
    pub fn replaced_maps(&self, trie_fits: bool) -> Vec<&'static str> {
        let trie = (self.trie_capacity.is_some() && trie_fits).then_some(MAP_NOMASQ_V4);
        trie.into_iter()
            .chain(self.ipv6_maps.iter().copied())
            .collect()
    }
}

/// What to do, given what is `pinned` and what is `requested`.
pub fn plan(pinned: PinnedState, requested: &LifecycleOptions) -> Plan {
    match pinned {
        PinnedState::Empty => Plan::Install { clearing: None },
        PinnedState::Leftovers(maps) => Plan::Install {
            clearing: Some(Clearing::Leftovers(maps)),
        },
        PinnedState::Compatible(pinned) => Plan::Adopt(adoption(pinned, requested)),
        PinnedState::Incompatible(detail) if requested.replace_incompatible_state => {
            Plan::Install {
                clearing: Some(Clearing::Incompatible(detail)),
            }
        }
        PinnedState::Incompatible(detail) => Plan::Refuse { detail },
    }
}

/// How maps created with the `pinned` capacities are adopted by an agent `requested` to use
/// others.
fn adoption(pinned: PinnedCapacities, requested: &LifecycleOptions) -> Adoption {
    let mut ipv6_maps = Vec::new();
    if requested.ipv6 {
        // The IPv6 NAT table takes the capacity of the IPv4 one, which is the pinned one.
        for (name, capacity, wanted) in [
            (MAP_NAT_V6, pinned.nat_v6, pinned.nat),
            (
                MAP_NOMASQ_V6,
                pinned.nomasq_v6,
                requested.nomasq_max_entries,
            ),
        ] {
            if capacity <= IPV6_DISABLED_ENTRIES && wanted > capacity {
                ipv6_maps.push(name);
            }
        }
        // The IPv6 flow index is sized from the IPv6 table.
        if ipv6_maps.contains(&MAP_NAT_V6) {
            ipv6_maps.push(MAP_FLOW_INDEX_V6);
        }
    }
    Adoption {
        pinned,
        ignored_nat_max_entries: (requested.nat_max_entries != pinned.nat)
            .then_some(requested.nat_max_entries),
        trie_capacity: (requested.nomasq_max_entries != pinned.nomasq)
            .then_some(requested.nomasq_max_entries),
        ipv6_maps,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// What an agent with IPv6 off asks for by default, at a NAT capacity of 1,024 entries.
    fn requested() -> LifecycleOptions {
        LifecycleOptions {
            pin_path: PathBuf::from("/sys/fs/bpf/masq"),
            nat_max_entries: 1024,
            nomasq_max_entries: 64,
            ipv6: false,
            replace_incompatible_state: false,
            debug_log: false,
        }
    }

    /// Maps created by an agent asked for [`requested`].
    const PINNED: PinnedCapacities = PinnedCapacities {
        nat: 1024,
        nomasq: 64,
        nat_v6: IPV6_DISABLED_ENTRIES,
        nomasq_v6: IPV6_DISABLED_ENTRIES,
    };

    fn adopted(pinned: PinnedCapacities, requested: &LifecycleOptions) -> Adoption {
        match plan(PinnedState::Compatible(pinned), requested) {
            Plan::Adopt(adoption) => adoption,
            other => panic!("compatible pins must be adopted, got {other:?}"),
        }
    }

    #[test]
    fn nothing_pinned_is_a_fresh_install() {
        assert_eq!(
            plan(PinnedState::Empty, &requested()),
            Plan::Install { clearing: None }
        );
    }

    #[test]
    fn an_interrupted_install_is_cleared_and_started_afresh() {
        let leftovers = vec![MAP_NOMASQ_V4, MAP_NAT_V6];
        assert_eq!(
            plan(PinnedState::Leftovers(leftovers.clone()), &requested()),
            Plan::Install {
                clearing: Some(Clearing::Leftovers(leftovers))
            }
        );
    }

    #[test]
    fn another_layout_is_refused_unless_its_replacement_is_asked_for() {
        let pinned = || PinnedState::Incompatible("map layout version 5".to_owned());
        assert_eq!(
            plan(pinned(), &requested()),
            Plan::Refuse {
                detail: "map layout version 5".to_owned()
            }
        );
        let replacing = LifecycleOptions {
            replace_incompatible_state: true,
            ..requested()
        };
        assert_eq!(
            plan(pinned(), &replacing),
            Plan::Install {
                clearing: Some(Clearing::Incompatible("map layout version 5".to_owned()))
            }
        );
    }

    #[test]
    fn pins_made_as_requested_are_adopted_as_they_are() {
        let adoption = adopted(PINNED, &requested());
        assert_eq!(adoption.pinned, PINNED);
        assert_eq!(adoption.ignored_nat_max_entries, None);
        assert_eq!(adoption.trie_capacity, None);
        assert!(adoption.replaced_maps(true).is_empty());
    }

    #[test]
    fn the_nat_table_keeps_its_capacity_whatever_is_requested() {
        let larger = LifecycleOptions {
            nat_max_entries: 4096,
            ..requested()
        };
        let adoption = adopted(PINNED, &larger);
        assert_eq!(adoption.pinned.nat, 1024);
        assert_eq!(adoption.ignored_nat_max_entries, Some(4096));
        assert!(adoption.replaced_maps(true).is_empty());
    }

    #[test]
    fn a_trie_of_another_capacity_is_rebuilt_when_its_entries_fit() {
        let larger = LifecycleOptions {
            nomasq_max_entries: 256,
            ..requested()
        };
        let adoption = adopted(PINNED, &larger);
        assert_eq!(adoption.trie_capacity, Some(256));
        assert_eq!(adoption.replaced_maps(true), [MAP_NOMASQ_V4]);
        assert!(adoption.replaced_maps(false).is_empty());
    }

    #[test]
    fn ipv6_maps_made_without_ipv6_are_sized_when_it_is_turned_on() {
        let with_ipv6 = LifecycleOptions {
            ipv6: true,
            nomasq_max_entries: 256,
            ..requested()
        };
        assert_eq!(
            adopted(PINNED, &with_ipv6).replaced_maps(true),
            [MAP_NOMASQ_V4, MAP_NAT_V6, MAP_NOMASQ_V6, MAP_FLOW_INDEX_V6]
        );
        // Sized already: kept, also when IPv6 is turned off again.
        let sized = PinnedCapacities {
            nat_v6: 1024,
            nomasq_v6: 64,
            ..PINNED
        };
        let ipv6_only = LifecycleOptions {
            ipv6: true,
            ..requested()
        };
        assert!(adopted(sized, &ipv6_only).replaced_maps(true).is_empty());
        assert!(adopted(sized, &requested()).replaced_maps(true).is_empty());
    }
}
