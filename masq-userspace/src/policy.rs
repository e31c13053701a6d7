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
    sync::{Arc, OnceLock},
};

use ipnet::{Ipv4Net, Ipv6Net};

use masq_common::layout::{NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL};

use crate::config::{
    LINK_LOCAL_V4, LINK_LOCAL_V6,
    cidr::{Cidr, Family, Network},
    source::{CidrOrigin, EffectiveConfig, SourcedCidr},
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

/// The rules for both families, from one config.
#[derive(Clone, Debug)]
pub struct Policy {
    config: Arc<EffectiveConfig>,
    ipv6_enabled: bool,
    /// The chain's rules (IPv4, IPv6), built on first use: the datapath needs only the trie
    /// entries, which come from the config directly.
    rules: OnceLock<[Vec<Rule>; 2]>,
}

impl Policy {
    /// Builds the chain upstream would write for `config`.
    pub fn new(config: &EffectiveConfig, enable_ipv6: bool) -> Self {
        Self::shared(Arc::new(config.clone()), enable_ipv6)
    }

    /// The same for a config shared with its reader, without copying it.
    pub const fn shared(config: Arc<EffectiveConfig>, enable_ipv6: bool) -> Self {
        Self {
            config,
            ipv6_enabled: enable_ipv6,
            rules: OnceLock::new(),
        }
    }

    /// The family's link-local rule, first in its chain unless the family's link-local range
    /// is masqueraded (or the family has no chain).
    fn link_local(&self, family: Family) -> Option<Rule> {
        let rule = |text: &'static str, network: Network| Rule {
            cidr: Cidr::builtin(text, network),
            kind: RuleKind::LinkLocal,
        };
        match family {
            Family::Ipv4 => (!self.config.raw.masq_link_local).then(|| {
                rule(
                    LINK_LOCAL_V4,
                    Network::V4(Ipv4Net::new_assert(Ipv4Addr::new(169, 254, 0, 0), 16)),
                )
            }),
            Family::Ipv6 => {
                (self.ipv6_enabled && !self.config.raw.masq_link_local_ipv6).then(|| {
                    rule(
                        LINK_LOCAL_V6,
                        Network::V6(Ipv6Net::new_assert(
                            Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
                            10,
                        )),
                    )
                })
            }
        }
    }

    /// The configured CIDRs of `family`, in config order (none for IPv6 without its chain).
    fn configured(&self, family: Family) -> impl Iterator<Item = &SourcedCidr> {
        let has_chain = family == Family::Ipv4 || self.ipv6_enabled;
        self.config
            .cidrs
            .iter()
            .filter(move |sourced| has_chain && sourced.cidr.family() == family)
    }

    fn chain(&self, family: Family) -> Vec<Rule> {
        let configured = self.configured(family).map(|sourced| Rule {
            cidr: sourced.cidr.clone(),
            kind: RuleKind::Configured(sourced.origin),
        });
        self.link_local(family)
            .into_iter()
            .chain(configured)
            .collect()
    }

    /// The `RETURN` rules of one family, in chain order.
    pub fn rules(&self, family: Family) -> &[Rule] {
        let [ipv4, ipv6] = self
            .rules
            .get_or_init(|| [self.chain(Family::Ipv4), self.chain(Family::Ipv6)]);
        match family {
            Family::Ipv4 => ipv4,
            Family::Ipv6 => ipv6,
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
        let family = match address {
            IpAddr::V4(_) => Family::Ipv4,
            IpAddr::V6(_) => Family::Ipv6,
        };
        if family == Family::Ipv6 && !self.ipv6_enabled {
            return Decision {
                destination,
                masquerade: false,
                reason: Reason::Ipv6Disabled,
            };
        }
        let rules = self.rules(family);
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
    pub fn nomasq_v4(&self) -> NomasqEntries<Ipv4Addr> {
        self.trie_entries()
    }

    /// The same for IPv6 (empty without `--enable-ipv6`), `fe80::/10` labelled link-local.
    pub fn nomasq_v6(&self) -> NomasqEntries<Ipv6Addr> {
        self.trie_entries()
    }

    /// TEMP stub (drop when merging): the IPv4 source trie, `nonMasqueradeSrcCIDRs`.
    pub fn nomasq_src_v4(&self) -> NomasqEntries<Ipv4Addr> {
        std::iter::empty().collect()
    }

    /// TEMP stub (drop when merging): the IPv6 source trie.
    pub fn nomasq_src_v6(&self) -> NomasqEntries<Ipv6Addr> {
        std::iter::empty().collect()
    }
}

/// An address of one family as trie entries need it: its family, the key of a network, and
/// the address as an integer of the same order. Entries are sorted and searched by the integer,
/// which compares in one instruction where the address compares as a byte array.
pub trait TrieAddress: Ord + Copy {
    /// The address as an integer.
    type Bits: Ord + Copy;
    /// The family of the address.
    const FAMILY: Family;
    /// A network of this family as a trie key, (address, prefix length).
    fn key(network: &Network) -> Option<(Self, u8)>;
    /// The address's bits, network order as an integer's.
    fn bits(self) -> Self::Bits;
    /// The order of a trie key: by address, then prefix length.
    fn order(key: &(Self, u8)) -> (Self::Bits, u8) {
        (key.0.bits(), key.1)
    }
}

impl TrieAddress for Ipv4Addr {
    type Bits = u32;
    const FAMILY: Family = Family::Ipv4;
    fn key(network: &Network) -> Option<(Self, u8)> {
        match network {
            Network::V4(network) => Some((network.addr(), network.prefix_len())),
            Network::V6(_) => None,
        }
    }
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

impl TrieAddress for Ipv6Addr {
    type Bits = u128;
    const FAMILY: Family = Family::Ipv6;
    fn key(network: &Network) -> Option<(Self, u8)> {
        match network {
            Network::V6(network) => Some((network.addr(), network.prefix_len())),
            Network::V4(_) => None,
        }
    }
    fn bits(self) -> u128 {
        self.to_bits()
    }
}

/// A family's non-masquerade trie entries, (address, prefix length) to `NOMASQ_KIND_*`: sorted
/// by key, each key once. What the policy wants the trie to hold, and what a sync wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NomasqEntries<A>(Vec<((A, u8), u32)>);

impl<A: TrieAddress> NomasqEntries<A> {
    /// How many entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The kind of the entry for `key`, if there is one.
    pub fn get(&self, key: &(A, u8)) -> Option<&u32> {
        let wanted = A::order(key);
        let at = self
            .0
            .binary_search_by(|(held, _)| A::order(held).cmp(&wanted))
            .ok()?;
        self.0.get(at).map(|(_, kind)| kind)
    }

    /// The keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &(A, u8)> {
        self.0.iter().map(|(key, _)| key)
    }

    /// The entries, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, ((A, u8), u32)> {
        self.0.iter()
    }
}

/// Of entries with equal keys, the first one stays: the first rule decides.
impl<A: TrieAddress> FromIterator<((A, u8), u32)> for NomasqEntries<A> {
    fn from_iter<I: IntoIterator<Item = ((A, u8), u32)>>(entries: I) -> Self {
        let mut entries: Vec<_> = entries.into_iter().collect();
        // Stable, and nearly linear on a list written in order, as most are.
        entries.sort_by_key(|(key, _)| A::order(key));
        entries.dedup_by_key(|(key, _)| A::order(key));
        Self(entries)
    }
}

impl<A: TrieAddress> From<BTreeMap<(A, u8), u32>> for NomasqEntries<A> {
    fn from(entries: BTreeMap<(A, u8), u32>) -> Self {
        Self(entries.into_iter().collect())
    }
}

impl<A> IntoIterator for NomasqEntries<A> {
    type Item = ((A, u8), u32);
    type IntoIter = std::vec::IntoIter<((A, u8), u32)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'entries, A> IntoIterator for &'entries NomasqEntries<A> {
    type Item = &'entries ((A, u8), u32);
    type IntoIter = std::slice::Iter<'entries, ((A, u8), u32)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Policy {
    /// The trie entries of `A`'s family (see [`Policy::nomasq_v4`]), from the config without
    /// building the chain.
    fn trie_entries<A: TrieAddress>(&self) -> NomasqEntries<A> {
        let link_local = self.link_local(A::FAMILY).map(|rule| *rule.cidr.network());
        let mut entries = Vec::with_capacity(self.config.cidrs.len() + 1);
        for sourced in self.configured(A::FAMILY) {
            let network = sourced.cidr.network();
            let Some(key) = A::key(network) else {
                continue;
            };
            let kind = match &link_local {
                Some(link_local) if within(network, link_local) => NOMASQ_KIND_LINK_LOCAL,
                _ => NOMASQ_KIND_CIDR,
            };
            entries.push((key, kind));
        }
        // Last, not first as in the chain: lists are mostly written in order, and the sort is
        // fastest on long ascending runs. Where a configured network has its key, it has its
        // kind too, so which of the two is kept makes no difference.
        entries.extend(
            link_local
                .as_ref()
                .and_then(A::key)
                .map(|key| (key, NOMASQ_KIND_LINK_LOCAL)),
        );
        entries.into_iter().collect()
    }
}

/// Whether `inner` lies within `outer`, a network of the same family: a prefix at least as long,
/// starting inside it. (`IpNet`'s `contains` answers the same, behind a call that copies both
/// enums through the stack: a third of the time of a 10,000-CIDR policy.)
#[inline]
fn within(inner: &Network, outer: &Network) -> bool {
    match (inner, outer) {
        (Network::V4(inner), Network::V4(outer)) => {
            inner.prefix_len() >= outer.prefix_len() && outer.contains(&inner.addr())
        }
        (Network::V6(inner), Network::V6(outer)) => {
            inner.prefix_len() >= outer.prefix_len() && outer.contains(&inner.addr())
        }
        _ => false,
    }
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
            &config(
                &[
                    "10.0.0.0/8",
                    "169.254.169.254/32",
                    "10.0.0.0/8",
                    "169.254.0.0/15",
                    "169.254.0.0/16",
                ],
                false,
            ),
            false,
        );
        let entries = policy.nomasq_v4();
        assert_eq!(entries.len(), 4, "duplicates collapse: {entries:?}");
        // A network around the link-local range starts inside it, but the chain's first rule
        // matches only part of it.
        assert_eq!(
            entries.get(&(Ipv4Addr::new(169, 254, 0, 0), 15)),
            Some(&NOMASQ_KIND_CIDR)
        );
        assert_eq!(
            entries.get(&(Ipv4Addr::new(169, 254, 0, 0), 16)),
            Some(&NOMASQ_KIND_LINK_LOCAL)
        );
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
