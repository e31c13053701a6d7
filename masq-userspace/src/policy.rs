//! The masquerade policy: for any destination, masquerade or not, and why.
//!
//! This is the single source of truth. The iptables renderer walks its rules in order, the
//! datapath's tries are filled from [`Policy::nomasq_v4`] and [`Policy::nomasq_src_v4`] (and
//! their IPv6 twins), and `masq explain` prints [`Policy::decide_from`].
//!
//! A family whose config uses none of masq's own keys gets upstream's chain: link-local first
//! (unless masqueraded), then the configured CIDRs in order, each a `RETURN`, then `MASQUERADE`
//! for everything else. Only the destination matters, and the first matching rule (the longest
//! matching prefix in the trie: both exempt the union of the networks) decides.
//!
//! A family with `masqueradeCIDRs` or `nonMasqueradeSrcCIDRs` entries gets the longest-prefix
//! chain: the source exemptions first, whatever the destination; then every destination rule
//! (link-local, `nonMasqueradeCIDRs`, `masqueradeCIDRs`) from the longest prefix to the
//! shortest, each a `RETURN` or a `MASQUERADE`. First match is then longest match, which is
//! what the trie answers. Two rules of equal prefix that overlap have the same network: a
//! configured one comes before the built-in link-local one, and validation refuses one network
//! both masqueraded and kept.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Arc, OnceLock},
};

use ipnet::{Ipv4Net, Ipv6Net};

use masq_common::layout::{
    NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL, NOMASQ_KIND_MASQUERADE, NOMASQ_KIND_SOURCE,
};

use crate::config::{
    LINK_LOCAL_V4, LINK_LOCAL_V6,
    cidr::{Cidr, Family, Network},
    source::{CidrOrigin, EffectiveConfig, SourcedCidr},
};

/// Where a rule comes from, which says what it matches and what it does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleKind {
    /// Link-local, exempt because `masqLinkLocal`/`masqLinkLocalIPv6` is false.
    LinkLocal,
    /// Listed in `nonMasqueradeCIDRs` (or the defaults): destinations that keep the pod's
    /// address.
    Configured(CidrOrigin),
    /// Listed in `masqueradeCIDRs`: destinations masqueraded inside a shorter exempt prefix.
    Masquerade(CidrOrigin),
    /// Listed in `nonMasqueradeSrcCIDRs`: sources that keep their address, whatever the
    /// destination.
    Source(CidrOrigin),
}

/// One rule of the chain: a `RETURN`, or a `MASQUERADE` for a `masqueradeCIDRs` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The destinations it matches (the sources, for [`RuleKind::Source`]).
    pub cidr: Cidr,
    /// Why.
    pub kind: RuleKind,
}

impl Rule {
    /// Whether matching traffic is masqueraded (otherwise it keeps the pod's address).
    pub const fn masquerades(&self) -> bool {
        matches!(self.kind, RuleKind::Masquerade(_))
    }

    /// Whether the rule matches the source rather than the destination.
    pub const fn matches_source(&self) -> bool {
        matches!(self.kind, RuleKind::Source(_))
    }

    /// The file (or the defaults) the rule comes from; `None` for the built-in link-local.
    pub const fn origin(&self) -> Option<CidrOrigin> {
        match self.kind {
            RuleKind::LinkLocal => None,
            RuleKind::Configured(origin)
            | RuleKind::Masquerade(origin)
            | RuleKind::Source(origin) => Some(origin),
        }
    }
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
    /// The first matching `RETURN` rule (by destination, or by source).
    Exempt(&'policy Rule),
    /// The first matching rule is a `masqueradeCIDRs` entry's `MASQUERADE`.
    Masqueraded(&'policy Rule),
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

    /// The CIDRs of `list` of `family`, in config order (none for IPv6 without its chain).
    fn of_family<'list>(
        &self,
        list: &'list [SourcedCidr],
        family: Family,
    ) -> impl Iterator<Item = &'list SourcedCidr> + use<'list> {
        let has_chain = family == Family::Ipv4 || self.ipv6_enabled;
        list.iter()
            .filter(move |sourced| has_chain && sourced.cidr.family() == family)
    }

    /// The configured non-masquerade CIDRs of `family`, in config order.
    fn configured(&self, family: Family) -> impl Iterator<Item = &SourcedCidr> {
        self.of_family(&self.config.cidrs, family)
    }

    /// The `masqueradeCIDRs` entries of `family`, in config order.
    fn masquerade_cidrs(&self, family: Family) -> impl Iterator<Item = &SourcedCidr> {
        self.of_family(&self.config.masquerade_cidrs, family)
    }

    /// The `nonMasqueradeSrcCIDRs` entries of `family`, in config order.
    fn source_cidrs(&self, family: Family) -> impl Iterator<Item = &SourcedCidr> {
        self.of_family(&self.config.non_masquerade_src_cidrs, family)
    }

    /// Whether `family`'s chain is the longest-prefix one: its config has `masqueradeCIDRs` or
    /// `nonMasqueradeSrcCIDRs` entries. Otherwise it is upstream's, rule for rule.
    pub fn longest_prefix_first(&self, family: Family) -> bool {
        self.masquerade_cidrs(family).next().is_some() || self.source_cidrs(family).next().is_some()
    }

    fn chain(&self, family: Family) -> Vec<Rule> {
        let rule = |kind: fn(CidrOrigin) -> RuleKind| {
            move |sourced: &SourcedCidr| Rule {
                cidr: sourced.cidr.clone(),
                kind: kind(sourced.origin),
            }
        };
        let configured = self.configured(family).map(rule(RuleKind::Configured));
        if !self.longest_prefix_first(family) {
            return self
                .link_local(family)
                .into_iter()
                .chain(configured)
                .collect();
        }
        let mut destinations: Vec<Rule> = configured
            .chain(
                self.masquerade_cidrs(family)
                    .map(rule(RuleKind::Masquerade)),
            )
            .chain(self.link_local(family))
            .collect();
        // Stable: equal prefixes keep config order, and link-local, pushed last, comes after
        // a configured rule of its own network.
        destinations.sort_by_key(|rule| std::cmp::Reverse(rule.cidr.network().prefix_len()));
        self.source_cidrs(family)
            .map(rule(RuleKind::Source))
            .chain(destinations)
            .collect()
    }

    /// The rules of one family, in chain order.
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

    /// What the chain does with a pod's traffic to `destination`, whatever its source (source
    /// exemptions aside): see [`Policy::decide_from`].
    pub fn decide(&self, destination: IpAddr) -> Decision<'_> {
        self.decide_from(None, destination)
    }

    /// What the chain does with traffic from the pod at `source` (when known) to
    /// `destination`: the first matching rule decides (a `RETURN` keeps the pod's address, a
    /// `masqueradeCIDRs` rule masquerades), and traffic no rule matches is masqueraded.
    pub fn decide_from(&self, source: Option<IpAddr>, destination: IpAddr) -> Decision<'_> {
        // IPv4-mapped IPv6 addresses are IPv4, as Go's `To4` has it.
        let address = destination.to_canonical();
        let family = family_of(address);
        if family == Family::Ipv6 && !self.ipv6_enabled {
            return Decision {
                destination,
                masquerade: false,
                reason: Reason::Ipv6Disabled,
            };
        }
        // A source of the other family matches no `-s` rule of this family's chain.
        let source = source
            .map(|source| source.to_canonical())
            .filter(|source| family_of(*source) == family);
        let matched = self.rules(family).iter().find(|rule| {
            if rule.matches_source() {
                source.is_some_and(|source| rule.cidr.network().contains(&source))
            } else {
                rule.cidr.network().contains(&address)
            }
        });
        match matched {
            Some(rule) if rule.masquerades() => Decision {
                destination,
                masquerade: true,
                reason: Reason::Masqueraded(rule),
            },
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

    /// The `masqueradeCIDRs` entries that change nothing: the longest shorter prefix holding
    /// each (of any list, or link-local) masquerades already, or none does. Worth a warning:
    /// the entry was meant to carve an exception out of an exempt range that is not there.
    pub fn ineffective_masquerade_cidrs(&self) -> Vec<&SourcedCidr> {
        // The common config has none: no trie to build then.
        if self.config.masquerade_cidrs.is_empty() {
            return Vec::new();
        }
        let (entries_v4, entries_v6) = (self.nomasq_v4(), self.nomasq_v6());
        let mut ineffective = Vec::new();
        for family in [Family::Ipv4, Family::Ipv6] {
            for sourced in self.masquerade_cidrs(family) {
                let enclosing = match sourced.cidr.network() {
                    Network::V4(network) => (0..network.prefix_len()).rev().find_map(|len| {
                        let outer = Ipv4Net::new(network.addr(), len).ok()?.trunc();
                        entries_v4.get(&(outer.addr(), len)).copied()
                    }),
                    Network::V6(network) => (0..network.prefix_len()).rev().find_map(|len| {
                        let outer = Ipv6Net::new(network.addr(), len).ok()?.trunc();
                        entries_v6.get(&(outer.addr(), len)).copied()
                    }),
                };
                if matches!(enclosing, None | Some(NOMASQ_KIND_MASQUERADE)) {
                    ineffective.push(sourced);
                }
            }
        }
        ineffective
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

    /// The datapath's source trie: the IPv4 `nonMasqueradeSrcCIDRs` entries, each
    /// `NOMASQ_KIND_SOURCE`. Empty unless the config lists some, which is what lets the
    /// datapath skip the lookup.
    pub fn nomasq_src_v4(&self) -> NomasqEntries<Ipv4Addr> {
        self.source_entries()
    }

    /// The same for IPv6 (empty without `--enable-ipv6`).
    pub fn nomasq_src_v6(&self) -> NomasqEntries<Ipv6Addr> {
        self.source_entries()
    }

    fn source_entries<A: TrieAddress>(&self) -> NomasqEntries<A> {
        self.source_cidrs(A::FAMILY)
            .filter_map(|sourced| A::key(sourced.cidr.network()))
            .map(|key| (key, NOMASQ_KIND_SOURCE))
            .collect()
    }
}

/// The family upstream files an address under (IPv4-mapped addresses are canonical by now).
const fn family_of(address: IpAddr) -> Family {
    match address {
        IpAddr::V4(_) => Family::Ipv4,
        IpAddr::V6(_) => Family::Ipv6,
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
    ///
    /// In a longest-prefix family a configured network inside link-local keeps its own label:
    /// its rule comes before link-local's there. `masqueradeCIDRs` entries are
    /// `NOMASQ_KIND_MASQUERADE`; none has the key of a configured network (validation), and
    /// one with link-local's key comes first, as its rule does.
    fn trie_entries<A: TrieAddress>(&self) -> NomasqEntries<A> {
        let longest_prefix_first = self.longest_prefix_first(A::FAMILY);
        let link_local = self.link_local(A::FAMILY).map(|rule| *rule.cidr.network());
        let mut entries =
            Vec::with_capacity(self.config.cidrs.len() + self.config.masquerade_cidrs.len() + 1);
        for sourced in self.configured(A::FAMILY) {
            let network = sourced.cidr.network();
            let Some(key) = A::key(network) else {
                continue;
            };
            let kind = match &link_local {
                Some(link_local) if !longest_prefix_first && within(network, link_local) => {
                    NOMASQ_KIND_LINK_LOCAL
                }
                _ => NOMASQ_KIND_CIDR,
            };
            entries.push((key, kind));
        }
        for sourced in self.masquerade_cidrs(A::FAMILY) {
            if let Some(key) = A::key(sourced.cidr.network()) {
                entries.push((key, NOMASQ_KIND_MASQUERADE));
            }
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
    use crate::config::source::{CidrOrigin, test_config};

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

    /// A config with the new lists, every entry from the defaults' origin.
    fn extended(
        non_masquerade: &[&str],
        masquerade: &[&str],
        sources: &[&str],
        masq_link_local: bool,
    ) -> EffectiveConfig {
        let sourced = |texts: &[&str]| -> Vec<SourcedCidr> {
            texts
                .iter()
                .map(|text| SourcedCidr {
                    cidr: Cidr::parse(text).expect("cidr"),
                    origin: CidrOrigin::Default,
                })
                .collect()
        };
        EffectiveConfig {
            masquerade_cidrs: sourced(masquerade),
            non_masquerade_src_cidrs: sourced(sources),
            ..test_config(non_masquerade, masq_link_local, false)
        }
    }

    fn matched<'policy>(decision: &Decision<'policy>) -> Option<&'policy str> {
        match decision.reason {
            Reason::Exempt(rule) | Reason::Masqueraded(rule) => Some(rule.cidr.as_str()),
            Reason::NoRuleMatched | Reason::Ipv6Disabled => None,
        }
    }

    #[test]
    fn the_longest_prefix_decides_across_lists_three_deep() {
        let config = extended(
            &["10.0.0.0/8", "10.100.10.128/25"],
            &["10.100.10.0/24", "10.100.10.192/26"],
            &[],
            false,
        );
        let policy = Policy::new(&config, false);
        let cases = [
            ("10.1.1.1", false, Some("10.0.0.0/8")),
            ("10.100.10.5", true, Some("10.100.10.0/24")),
            ("10.100.10.130", false, Some("10.100.10.128/25")),
            ("10.100.10.200", true, Some("10.100.10.192/26")),
            ("203.0.113.1", true, None),
            ("169.254.169.254", false, Some("169.254.0.0/16")),
        ];
        for (destination, masquerade, rule) in cases {
            let decision = policy.decide(ip(destination));
            assert_eq!(
                (decision.masquerade, matched(&decision)),
                (masquerade, rule),
                "{destination}"
            );
        }
        // First match is longest match: the chain is ordered by prefix length.
        let prefixes: Vec<u8> = policy
            .rules(Family::Ipv4)
            .iter()
            .map(|rule| rule.cidr.network().prefix_len())
            .collect();
        assert_eq!(prefixes, [26, 25, 24, 16, 8]);
        assert!(policy.longest_prefix_first(Family::Ipv4));
        assert!(!policy.longest_prefix_first(Family::Ipv6));
    }

    #[test]
    fn the_trie_says_masquerade_where_the_chain_does() {
        let config = extended(
            &["10.0.0.0/8", "169.254.169.254/32"],
            &["10.100.10.0/24", "169.254.0.0/16"],
            &[],
            false,
        );
        let policy = Policy::new(&config, false);
        let entries = policy.nomasq_v4();
        let kind = |address: [u8; 4], prefix: u8| entries.get(&(Ipv4Addr::from(address), prefix));
        assert_eq!(kind([10, 100, 10, 0], 24), Some(&NOMASQ_KIND_MASQUERADE));
        assert_eq!(kind([10, 0, 0, 0], 8), Some(&NOMASQ_KIND_CIDR));
        // Link-local's own network listed as an exception: the configured rule comes first,
        // so the whole range is masqueraded but for the /32 that is longer.
        assert_eq!(kind([169, 254, 0, 0], 16), Some(&NOMASQ_KIND_MASQUERADE));
        assert_eq!(kind([169, 254, 169, 254], 32), Some(&NOMASQ_KIND_CIDR));
        assert!(policy.decide(ip("169.254.1.1")).masquerade);
        assert!(!policy.decide(ip("169.254.169.254")).masquerade);
        assert_eq!(
            entries.len(),
            4,
            "link-local's entry is the exception's: {entries:?}"
        );
    }

    #[test]
    fn exempt_sources_come_first_and_only_for_their_family() {
        let config = extended(
            &["10.0.0.0/8", "fd00::/8"],
            &["10.100.10.0/24"],
            &["100.64.0.0/16", "2001:db8:64::/48"],
            false,
        );
        let policy = Policy::new(&config, true);
        let exempt = Some(ip("100.64.1.2"));
        let other = Some(ip("10.244.1.2"));
        for destination in ["203.0.113.7", "10.100.10.5", "10.1.1.1"] {
            let decision = policy.decide_from(exempt, ip(destination));
            assert!(!decision.masquerade, "{destination}");
            assert!(
                matches!(decision.reason, Reason::Exempt(rule) if rule.matches_source()),
                "{destination}: {decision:?}"
            );
        }
        assert!(policy.decide_from(other, ip("203.0.113.7")).masquerade);
        assert!(policy.decide_from(other, ip("10.100.10.5")).masquerade);
        // An IPv4 source says nothing about IPv6 traffic, and the other way round.
        assert!(policy.decide_from(exempt, ip("2001:db8:1::1")).masquerade);
        assert!(
            !policy
                .decide_from(Some(ip("2001:db8:64::9")), ip("2001:db8:1::1"))
                .masquerade
        );
        assert!(
            policy
                .decide_from(Some(ip("2001:db8:64::9")), ip("203.0.113.7"))
                .masquerade
        );
        // IPv4-mapped sources are IPv4.
        assert!(
            !policy
                .decide_from(Some(ip("::ffff:100.64.1.2")), ip("203.0.113.7"))
                .masquerade
        );
        assert_eq!(
            policy.nomasq_src_v4().into_iter().collect::<Vec<_>>(),
            [((Ipv4Addr::new(100, 64, 0, 0), 16), NOMASQ_KIND_SOURCE)]
        );
        assert_eq!(policy.nomasq_src_v6().len(), 1);
        assert!(Policy::new(&config, false).nomasq_src_v6().is_empty());
        let rules = policy.rules(Family::Ipv4);
        assert!(rules.first().is_some_and(Rule::matches_source), "{rules:?}");
    }

    #[test]
    fn without_the_new_keys_the_chain_and_trie_are_upstreams() {
        let cidrs = ["10.1.0.0/16", "10.0.0.0/8", "169.254.169.254/32"];
        let plain = Policy::new(&test_config(&cidrs, false, false), false);
        let empty_lists = Policy::new(&extended(&cidrs, &[], &[], false), false);
        for policy in [&plain, &empty_lists] {
            assert!(!policy.longest_prefix_first(Family::Ipv4));
            let order: Vec<&str> = policy
                .rules(Family::Ipv4)
                .iter()
                .map(|rule| rule.cidr.as_str())
                .collect();
            assert_eq!(
                order,
                [
                    "169.254.0.0/16",
                    "10.1.0.0/16",
                    "10.0.0.0/8",
                    "169.254.169.254/32"
                ]
            );
            assert_eq!(
                policy
                    .nomasq_v4()
                    .get(&(Ipv4Addr::new(169, 254, 169, 254), 32)),
                Some(&NOMASQ_KIND_LINK_LOCAL)
            );
        }
        // Only the family with the new keys changes.
        let v4_only = Policy::new(&extended(&["fd00::/8"], &["10.9.0.0/16"], &[], false), true);
        assert!(v4_only.longest_prefix_first(Family::Ipv4));
        assert!(!v4_only.longest_prefix_first(Family::Ipv6));
        let v6_rules: Vec<&str> = v4_only
            .rules(Family::Ipv6)
            .iter()
            .map(|rule| rule.cidr.as_str())
            .collect();
        assert_eq!(v6_rules, ["fe80::/10", "fd00::/8"]);
    }

    #[test]
    fn exceptions_that_change_nothing_are_found() {
        let config = extended(
            &["10.0.0.0/8", "10.1.0.0/16"],
            &[
                "10.1.2.0/24",
                "10.1.2.128/25",
                "203.0.113.0/24",
                "10.0.0.0/7",
                "169.254.1.0/24",
            ],
            &[],
            false,
        );
        let policy = Policy::new(&config, false);
        let ineffective: Vec<&str> = policy
            .ineffective_masquerade_cidrs()
            .into_iter()
            .map(|sourced| sourced.cidr.as_str())
            .collect();
        // Inside another exception, outside every exempt range, or around the exempt ranges.
        assert_eq!(
            ineffective,
            ["10.1.2.128/25", "203.0.113.0/24", "10.0.0.0/7"]
        );
        let masq_link_local = Policy::new(&extended(&[], &["169.254.1.0/24"], &[], true), false);
        assert_eq!(masq_link_local.ineffective_masquerade_cidrs().len(), 1);
    }
}
