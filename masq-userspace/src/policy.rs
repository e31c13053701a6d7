//! The masquerade policy: for any destination, masquerade or not, and why.
//!
//! This is the single source of truth. The iptables renderer walks its rules in order, the
//! datapath's trie is filled from [`Policy::nomasq_v4`], and `masq explain` prints
//! [`Policy::decide`]. The rules are upstream's chain: link-local first (unless masqueraded),
//! then the configured CIDRs in order, each a `RETURN`, then `MASQUERADE` for everything else.
//! Only the destination matters.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};

use masq_common::layout::{NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL};

use crate::config::{
    LINK_LOCAL_V4, LINK_LOCAL_V6,
    cidr::{Cidr, Family, Network},
    source::{CidrOrigin, EffectiveConfig},
};

/// Why a rule exempts its destinations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// Link-local, exempt because `masqLinkLocal`/`masqLinkLocalIPv6` is false.
    LinkLocal,
    /// Listed in `nonMasqueradeCIDRs` (or the defaults).
    Configured(CidrOrigin),
}

/// One `RETURN` rule of the chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The destinations it exempts.
    pub cidr: Cidr,
    /// Why.
    pub kind: RuleKind,
}

/// The decision for one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision<'policy> {
    /// The destination asked about.
    pub destination: IpAddr,
    /// Whether traffic to it leaves with the node's address.
    pub masquerade: bool,
    /// Why.
    pub reason: Reason<'policy>,
}

/// Why a destination is (not) masqueraded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason<'policy> {
    /// The first matching `RETURN` rule.
    Exempt(&'policy Rule),
    /// No rule matched: the final `MASQUERADE`.
    NoRuleMatched,
    /// IPv6 without `--enable-ipv6`: upstream installs no IPv6 rules at all.
    Ipv6Disabled,
}

/// The rules for both families.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    ipv4: Vec<Rule>,
    ipv6: Vec<Rule>,
    ipv6_enabled: bool,
}

impl Policy {
    /// Builds the chain upstream would write for `config`.
    pub fn new(config: &EffectiveConfig, enable_ipv6: bool) -> Self {
        let link_local = |text: &'static str, network: Network| Rule {
            cidr: Cidr::builtin(text, network),
            kind: RuleKind::LinkLocal,
        };
        let configured = |family: Family| {
            config
                .cidrs
                .iter()
                .filter(move |sourced| sourced.cidr.family() == family)
                .map(|sourced| Rule {
                    cidr: sourced.cidr.clone(),
                    kind: RuleKind::Configured(sourced.origin.clone()),
                })
        };
        let mut ipv4: Vec<Rule> = Vec::with_capacity(config.cidrs.len() + 1);
        if !config.raw.masq_link_local {
            ipv4.push(link_local(
                LINK_LOCAL_V4,
                Network::V4(Ipv4Net::new_assert(Ipv4Addr::new(169, 254, 0, 0), 16)),
            ));
        }
        ipv4.extend(configured(Family::Ipv4));
        let mut ipv6: Vec<Rule> = Vec::new();
        if enable_ipv6 {
            if !config.raw.masq_link_local_ipv6 {
                ipv6.push(link_local(
                    LINK_LOCAL_V6,
                    Network::V6(Ipv6Net::new_assert(
                        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
                        10,
                    )),
                ));
            }
            ipv6.extend(configured(Family::Ipv6));
        }
        Self {
            ipv4,
            ipv6,
            ipv6_enabled: enable_ipv6,
        }
    }

    /// The `RETURN` rules of one family, in chain order.
    pub fn rules(&self, family: Family) -> &[Rule] {
        match family {
            Family::Ipv4 => &self.ipv4,
            Family::Ipv6 => &self.ipv6,
        }
    }

    /// Whether IPv6 rules exist at all.
    pub const fn ipv6_enabled(&self) -> bool {
        self.ipv6_enabled
    }

    /// What the chain does with traffic to `destination`: the first matching `RETURN` rule
    /// exempts it, otherwise it is masqueraded.
    pub fn decide(&self, destination: IpAddr) -> Decision<'_> {
        // IPv4-mapped IPv6 destinations are IPv4, as Go's `To4` has it.
        let address = destination.to_canonical();
        let (rules, family) = match address {
            IpAddr::V4(_) => (&self.ipv4, Family::Ipv4),
            IpAddr::V6(_) => (&self.ipv6, Family::Ipv6),
        };
        if family == Family::Ipv6 && !self.ipv6_enabled {
            return Decision {
                destination,
                masquerade: false,
                reason: Reason::Ipv6Disabled,
            };
        }
        match rules
            .iter()
            .find(|rule| rule.cidr.network().contains(&address))
        {
            Some(rule) => Decision {
                destination,
                masquerade: false,
                reason: Reason::Exempt(rule),
            },
            None => Decision {
                destination,
                masquerade: true,
                reason: Reason::NoRuleMatched,
            },
        }
    }

    /// The datapath's non-masquerade trie: every IPv4 network with its `NOMASQ_KIND_*`.
    ///
    /// The trie answers with the longest matching prefix while the chain answers with the first
    /// matching rule; both exempt exactly the union of the networks, so the decision is the
    /// same. For the counters to agree with the chain too, a configured network inside the
    /// exempt link-local range is labelled link-local (the chain's first rule would match it).
    pub fn nomasq_v4(&self) -> BTreeMap<(Ipv4Addr, u8), u32> {
        trie_entries(&self.ipv4, |network| match network {
            Network::V4(network) => Some((network.addr(), network.prefix_len())),
            Network::V6(_) => None,
        })
    }

    /// The same for IPv6 (empty without `--enable-ipv6`), `fe80::/10` labelled link-local.
    pub fn nomasq_v6(&self) -> BTreeMap<(Ipv6Addr, u8), u32> {
        trie_entries(&self.ipv6, |network| match network {
            Network::V6(network) => Some((network.addr(), network.prefix_len())),
            Network::V4(_) => None,
        })
    }
}

/// The trie entries of one family's `rules` (see [`Policy::nomasq_v4`]); `key` gives a
/// network of the family as (address, prefix length).
fn trie_entries<A: Ord + Copy>(
    rules: &[Rule],
    key: impl Fn(&Network) -> Option<(A, u8)>,
) -> BTreeMap<(A, u8), u32> {
    let link_local = rules
        .iter()
        .find(|rule| rule.kind == RuleKind::LinkLocal)
        .map(|rule| *rule.cidr.network());
    let mut entries: Vec<((A, u8), u32)> = Vec::with_capacity(rules.len());
    for rule in rules {
        let Some(network) = key(rule.cidr.network()) else {
            continue;
        };
        let inside_link_local =
            link_local.is_some_and(|link_local| link_local.contains(rule.cidr.network()));
        let kind = if rule.kind == RuleKind::LinkLocal || inside_link_local {
            NOMASQ_KIND_LINK_LOCAL
        } else {
            NOMASQ_KIND_CIDR
        };
        entries.push((network, kind));
    }
    // Sorted, the map is built in one pass rather than by an insertion per rule; of equal
    // keys the stable sort keeps the first rule first, and the first rule decides.
    entries.sort_by_key(|&(key, _)| key);
    entries.dedup_by_key(|&mut (key, _)| key);
    entries.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::source::test_config;

    fn config(cidrs: &[&str], masq_link_local: bool) -> EffectiveConfig {
        test_config(cidrs, masq_link_local, false)
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn first_matching_rule_decides() {
        let policy = Policy::new(&config(&["10.0.0.0/8", "10.1.0.0/16"], false), false);
        let decision = policy.decide(ip("10.1.2.3"));
        assert!(!decision.masquerade);
        assert!(
            matches!(decision.reason, Reason::Exempt(rule) if rule.cidr.as_str() == "10.0.0.0/8")
        );
        let link_local = policy.decide(ip("169.254.169.254"));
        assert!(matches!(
            link_local.reason,
            Reason::Exempt(Rule {
                kind: RuleKind::LinkLocal,
                ..
            })
        ));
        let outside = policy.decide(ip("203.0.113.7"));
        assert!(outside.masquerade);
        assert_eq!(outside.reason, Reason::NoRuleMatched);
    }

    #[test]
    fn masq_link_local_drops_the_link_local_rule() {
        let policy = Policy::new(&config(&[], true), false);
        assert!(policy.decide(ip("169.254.169.254")).masquerade);
        assert!(policy.rules(Family::Ipv4).is_empty());
    }

    #[test]
    fn ipv6_follows_the_flag() {
        let policy = Policy::new(&config(&["fc00::/7"], false), false);
        let decision = policy.decide(ip("fc00::1"));
        assert_eq!(
            (decision.masquerade, decision.reason),
            (false, Reason::Ipv6Disabled)
        );
        let enabled = Policy::new(&config(&["fc00::/7"], false), true);
        assert!(!enabled.decide(ip("fc00::1")).masquerade);
        assert!(!enabled.decide(ip("fe80::1")).masquerade);
        assert!(enabled.decide(ip("2001:db8::1")).masquerade);
        // IPv4-mapped destinations are IPv4.
        assert!(!enabled.decide(ip("::ffff:169.254.1.1")).masquerade);
    }

    #[test]
    fn trie_entries_label_link_local_like_the_chain() {
        let policy = Policy::new(
            &config(&["10.0.0.0/8", "169.254.169.254/32", "10.0.0.0/8"], false),
            false,
        );
        let entries = policy.nomasq_v4();
        assert_eq!(entries.len(), 3, "duplicates collapse: {entries:?}");
        assert_eq!(
            entries.get(&(Ipv4Addr::new(169, 254, 169, 254), 32)),
            Some(&NOMASQ_KIND_LINK_LOCAL)
        );
        assert_eq!(
            entries.get(&(Ipv4Addr::new(10, 0, 0, 0), 8)),
            Some(&NOMASQ_KIND_CIDR)
        );
        let without_exemption = Policy::new(&config(&["169.254.169.254/32"], true), false);
        assert_eq!(
            without_exemption
                .nomasq_v4()
                .get(&(Ipv4Addr::new(169, 254, 169, 254), 32)),
            Some(&NOMASQ_KIND_CIDR)
        );
    }

    #[test]
    fn ipv6_trie_entries_exempt_link_local_unless_masqueraded() {
        let v6 = |text: &str| text.parse::<Ipv6Addr>().expect("address");
        let cidrs = ["10.0.0.0/8", "2001:db8:10::/48", "fe80::1/128"];
        let policy = Policy::new(&test_config(&cidrs, false, false), true);
        let entries = policy.nomasq_v6();
        assert_eq!(
            entries.into_iter().collect::<Vec<_>>(),
            [
                ((v6("2001:db8:10::"), 48), NOMASQ_KIND_CIDR),
                ((v6("fe80::"), 10), NOMASQ_KIND_LINK_LOCAL),
                ((v6("fe80::1"), 128), NOMASQ_KIND_LINK_LOCAL),
            ]
        );
        let masq_link_local = Policy::new(&test_config(&cidrs, false, true), true);
        assert_eq!(
            masq_link_local.nomasq_v6().get(&(v6("fe80::1"), 128)),
            Some(&NOMASQ_KIND_CIDR)
        );
        // Without --enable-ipv6 the IPv6 trie stays empty.
        let disabled = Policy::new(&test_config(&cidrs, false, false), false);
        assert!(disabled.nomasq_v6().is_empty());
    }
}
