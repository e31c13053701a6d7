//! Generated configs for the agreement tests: `masq explain`, the eBPF datapath and the
//! iptables rules must take the same decision for every (pod source, destination) pair.
//!
//! A config is built from a few *roots* (networks a test may route to: documentation ranges,
//! the private ranges of the default list, link-local) by nesting up to three levels of
//! `nonMasqueradeCIDRs` and `masqueradeCIDRs` inside them, plus `masqueradeCIDRs` entries no
//! exempt range encloses, entries inside link-local (with `masqLinkLocal` either way), and
//! `nonMasqueradeSrcCIDRs` inside the pods' range. Sample pairs sit on every boundary: the first
//! and last address of each network and the addresses just outside it.
//!
//! Everything comes from one seed through [`Rng`]; case `i` of seed `s` is the same on every
//! run, so a failure names both and the config's YAML.
//!
//! [`datapath`] runs pairs through the datapath (`BPF_PROG_TEST_RUN`), [`iptables`] through the
//! rendered iptables rules with real traffic between namespaces.

pub mod datapath;
pub mod iptables;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use masq::{
    config::{
        GoDuration,
        source::{ConfigError, ConfigSource, EffectiveConfig, ReadOptions, load},
    },
    policy::Policy,
};

pub use crate::fuzz::rng::Rng;

/// A network of either family as plain bits, so that nesting and boundaries are computed
/// once for both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Net {
    /// IPv6 (128 bits) or IPv4 (32 bits, in the low bits).
    pub v6: bool,
    /// The network address.
    pub bits: u128,
    /// The prefix length.
    pub len: u8,
}

impl Net {
    /// An IPv4 network from its address and prefix length.
    pub fn v4(address: [u8; 4], len: u8) -> Self {
        Self::new(false, u128::from(u32::from_be_bytes(address)), len)
    }

    /// An IPv6 network from its address and prefix length.
    pub fn v6(address: Ipv6Addr, len: u8) -> Self {
        Self::new(true, address.to_bits(), len)
    }

    fn new(v6: bool, bits: u128, len: u8) -> Self {
        let mut net = Self { v6, bits, len };
        net.bits &= !net.host_mask();
        net
    }

    /// Address bits of the family.
    pub const fn width(self) -> u8 {
        if self.v6 { 128 } else { 32 }
    }

    /// Every address bit of the family set.
    const fn all_ones(self) -> u128 {
        u128::MAX >> (128 - self.width() as u32)
    }

    /// The bits of an address inside the network that are not the prefix.
    const fn host_mask(self) -> u128 {
        if self.len >= self.width() {
            0
        } else {
            self.all_ones() >> self.len
        }
    }

    /// The network's first address, as bits.
    pub const fn first(self) -> u128 {
        self.bits
    }

    /// Its last address, as bits.
    pub const fn last(self) -> u128 {
        self.bits | self.host_mask()
    }

    /// Whether the address `bits` (of the same family) lies inside.
    pub const fn contains_bits(self, bits: u128) -> bool {
        bits & !self.host_mask() == self.bits
    }

    /// Whether `address` lies inside.
    pub fn contains(self, address: IpAddr) -> bool {
        match address {
            IpAddr::V4(address) => !self.v6 && self.contains_bits(u128::from(address.to_bits())),
            IpAddr::V6(address) => self.v6 && self.contains_bits(address.to_bits()),
        }
    }

    /// Whether `inner` lies inside (a prefix at least as long, of the same family).
    pub const fn encloses(self, inner: Self) -> bool {
        self.v6 == inner.v6 && inner.len >= self.len && self.contains_bits(inner.bits)
    }

    /// The address of the family with `bits`.
    pub fn address(self, bits: u128) -> IpAddr {
        if self.v6 {
            IpAddr::V6(Ipv6Addr::from_bits(bits))
        } else {
            IpAddr::V4(Ipv4Addr::from_bits(
                u32::try_from(bits & self.all_ones()).unwrap_or(u32::MAX),
            ))
        }
    }

    /// A random network `1..=max_extra` bits longer inside this one (this one when it is a
    /// single address).
    pub fn child(self, rng: &mut Rng, max_extra: u8) -> Self {
        let extra = u8::try_from(rng.between(1, usize::from(max_extra.max(1)))).unwrap_or(1);
        let len = self.len.saturating_add(extra).min(self.width());
        let random = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
        Self::new(self.v6, self.bits | (random & self.host_mask()), len)
    }

    /// The boundaries of the network: its first and last address, one random address inside,
    /// and the addresses just before and just after it (when the family has them).
    pub fn boundaries(self, rng: &mut Rng) -> Vec<IpAddr> {
        let random = (u128::from(rng.next_u64()) << 64) | u128::from(rng.next_u64());
        let mut bits = vec![
            self.first(),
            self.last(),
            self.bits | (random & self.host_mask()),
        ];
        bits.extend(self.first().checked_sub(1));
        if self.last() < self.all_ones() {
            bits.push(self.last() + 1);
        }
        bits.into_iter().map(|bits| self.address(bits)).collect()
    }

    /// The CIDR as Go prints it (`10.0.0.0/8`, `2001:db8::/32`).
    pub fn text(self) -> String {
        format!("{}/{}", self.address(self.bits), self.len)
    }

    /// The same CIDR spelled with every IPv6 group written out in four digits, which Go (and
    /// masq) parse to the same network: for IPv4, the usual text.
    pub fn expanded_text(self) -> String {
        match self.address(self.bits) {
            IpAddr::V4(_) => self.text(),
            IpAddr::V6(address) => {
                let groups: Vec<String> = address
                    .segments()
                    .iter()
                    .map(|group| format!("{group:04x}"))
                    .collect();
                format!("{}/{}", groups.join(":"), self.len)
            }
        }
    }
}

/// IPv4 link-local, exempt unless `masqLinkLocal`.
pub fn link_local_v4() -> Net {
    Net::v4([169, 254, 0, 0], 16)
}

/// IPv6 link-local, exempt unless `masqLinkLocalIPv6`.
pub fn link_local_v6() -> Net {
    Net::v6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10)
}

/// The IPv4 networks destinations are generated in. The real-traffic test makes every address
/// of them local to its receiving namespace, so they must never hold the pods' or the transit
/// link's addresses: 10.0.0.0/8, 172.16.0.0/12 and 192.168.0.0/16 (the default list) live only
/// inside test namespaces, the others are documentation ranges.
pub fn roots_v4() -> [Net; 5] {
    [
        Net::v4([10, 0, 0, 0], 8),
        Net::v4([172, 16, 0, 0], 12),
        Net::v4([192, 168, 0, 0], 16),
        Net::v4([198, 51, 100, 0], 24),
        Net::v4([203, 0, 113, 0], 24),
    ]
}

/// The IPv6 networks destinations are generated in: two documentation /48s and a unique-local
/// /16 that lives only inside test namespaces.
pub fn roots_v6() -> [Net; 3] {
    [
        Net::v6(Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 0), 48),
        Net::v6(Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, 0), 48),
        Net::v6(Ipv6Addr::new(0xfd10, 0, 0, 0, 0, 0, 0, 0), 16),
    ]
}

/// The pods' IPv4 range (inside test namespaces only): sample sources come from it.
pub fn pods_v4() -> Net {
    Net::v4([100, 64, 0, 0], 16)
}

/// The pods' IPv6 range (unique-local, inside test namespaces only).
pub fn pods_v6() -> Net {
    Net::v6(Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0, 0, 0, 0), 64)
}

/// Where `nonMasqueradeSrcCIDRs` entries are generated: the first half of the pods' IPv4
/// range (the other half holds the test links' own addresses).
fn source_root_v4() -> Net {
    Net::v4([100, 64, 0, 0], 17)
}

/// The same for IPv6: the first /80 of the pods' /64.
fn source_root_v6() -> Net {
    Net::v6(Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0, 0, 0, 0), 80)
}

/// Pod addresses every case samples besides its source boundaries: ones no source exemption
/// is generated around (outside [`source_root_v4`] / [`source_root_v6`]).
fn plain_pods() -> [IpAddr; 2] {
    [
        IpAddr::V4(Ipv4Addr::new(100, 64, 200, 7)),
        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0xc8, 0, 0, 7)),
    ]
}

/// One list entry: its network, and whether it is written with every IPv6 group spelled out
/// (`2001:0db8:000a:0000:...`), which Go (and masq) parse to the same network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// The network.
    pub net: Net,
    /// Whether the text is the expanded spelling.
    pub expanded: bool,
}

impl Entry {
    const fn plain(net: Net) -> Self {
        Self {
            net,
            expanded: false,
        }
    }

    fn yaml(self) -> String {
        let text = if self.expanded {
            self.net.expanded_text()
        } else {
            self.net.text()
        };
        format!("\"{text}\"")
    }
}

/// The config lists, in the order written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lists {
    /// `nonMasqueradeCIDRs`; `None` leaves the key out (upstream's defaults apply).
    pub non_masquerade: Option<Vec<Entry>>,
    /// `masqueradeCIDRs`.
    pub masquerade: Vec<Entry>,
    /// `nonMasqueradeSrcCIDRs`.
    pub non_masquerade_src: Vec<Entry>,
}

/// The networks of `entries`.
pub fn nets(entries: &[Entry]) -> Vec<Net> {
    entries.iter().map(|entry| entry.net).collect()
}

/// One generated config.
#[derive(Clone, Debug)]
pub struct Case {
    /// The seed of the run.
    pub seed: u64,
    /// The case's index within the run.
    pub index: usize,
    /// `--enable-ipv6`.
    pub enable_ipv6: bool,
    /// `masqLinkLocal`.
    pub masq_link_local: bool,
    /// `masqLinkLocalIPv6`.
    pub masq_link_local_ipv6: bool,
    /// The lists.
    pub lists: Lists,
}

/// The default `nonMasqueradeCIDRs`, in force when the key is absent.
fn default_list() -> Vec<Net> {
    vec![
        Net::v4([10, 0, 0, 0], 8),
        Net::v4([172, 16, 0, 0], 12),
        Net::v4([192, 168, 0, 0], 16),
    ]
}

impl Case {
    /// `nonMasqueradeCIDRs` in force: the list, or the defaults when the key is absent.
    pub fn non_masquerade(&self) -> Vec<Net> {
        self.lists
            .non_masquerade
            .as_deref()
            .map_or_else(default_list, nets)
    }

    /// Whether the config uses the new lists for `v6`'s family (the longest-prefix chain).
    pub fn has_extensions(&self, v6: bool) -> bool {
        self.lists
            .masquerade
            .iter()
            .chain(&self.lists.non_masquerade_src)
            .any(|entry| entry.net.v6 == v6)
    }

    fn list_yaml(key: &str, entries: &[Entry]) -> String {
        let entries: Vec<String> = entries.iter().map(|entry| entry.yaml()).collect();
        format!("{key}: [{}]\n", entries.join(", "))
    }

    /// The config file.
    pub fn yaml(&self) -> String {
        let mut yaml = String::new();
        if let Some(list) = &self.lists.non_masquerade {
            yaml.push_str(&Self::list_yaml("nonMasqueradeCIDRs", list));
        }
        if !self.lists.masquerade.is_empty() {
            yaml.push_str(&Self::list_yaml("masqueradeCIDRs", &self.lists.masquerade));
        }
        if !self.lists.non_masquerade_src.is_empty() {
            yaml.push_str(&Self::list_yaml(
                "nonMasqueradeSrcCIDRs",
                &self.lists.non_masquerade_src,
            ));
        }
        let _ = writeln!(yaml, "masqLinkLocal: {}", self.masq_link_local);
        let _ = writeln!(yaml, "masqLinkLocalIPv6: {}", self.masq_link_local_ipv6);
        yaml
    }

    /// What to print when the case fails: how to replay it, the flags and the config.
    pub fn describe(&self) -> String {
        format!(
            "case {} of seed {:#x} (replay: MASQ_AGREEMENT_SEED={:#x} MASQ_AGREEMENT_CASE={}), \
             --enable-ipv6={}, config:\n{}",
            self.index,
            self.seed,
            self.seed,
            self.index,
            self.enable_ipv6,
            self.yaml()
        )
    }

    /// The read options the config is loaded with.
    pub const fn read_options(&self) -> ReadOptions {
        ReadOptions {
            nomasq_all_reserved_ranges: false,
            enable_ipv6: self.enable_ipv6,
            resync_interval: GoDuration::from_secs(60),
        }
    }

    /// Every destination network of the case, link-local and the roots included: the
    /// networks whose boundaries the samples sit on.
    fn destination_nets(&self) -> Vec<Net> {
        let mut nets: Vec<Net> = self
            .non_masquerade()
            .into_iter()
            .chain(nets(&self.lists.masquerade))
            .chain([link_local_v4()])
            .chain(roots_v4())
            .collect();
        if self.enable_ipv6 {
            nets.push(link_local_v6());
            nets.extend(roots_v6());
        }
        nets.sort();
        nets.dedup();
        nets
    }

    /// Pod sources to try: the boundaries of every source exemption that lie in the pods'
    /// range, and pods no exemption is generated around.
    pub fn sources(&self, rng: &mut Rng) -> Vec<IpAddr> {
        let mut sources: BTreeSet<IpAddr> = plain_pods()
            .into_iter()
            .filter(|pod| pod.is_ipv4() || self.enable_ipv6)
            .collect();
        for net in nets(&self.lists.non_masquerade_src) {
            let pods = if net.v6 { pods_v6() } else { pods_v4() };
            sources.extend(
                net.boundaries(rng)
                    .into_iter()
                    .filter(|&address| pods.contains(address)),
            );
        }
        sources.into_iter().collect()
    }

    /// Destinations to try: the boundaries of every destination network.
    pub fn destinations(&self, rng: &mut Rng) -> Vec<IpAddr> {
        let mut destinations = BTreeSet::new();
        for net in self.destination_nets() {
            destinations.extend(net.boundaries(rng));
        }
        destinations.into_iter().collect()
    }

    /// (source, destination) pairs of one family each: every destination with a source, every
    /// source with a few destinations, and as many more random combinations as `limit`
    /// allows.
    pub fn pairs(&self, rng: &mut Rng, limit: usize) -> Vec<(IpAddr, IpAddr)> {
        let sources = self.sources(rng);
        let destinations = self.destinations(rng);
        let mut pairs = BTreeSet::new();
        for v6 in [false, true] {
            let of_family = |address: &&IpAddr| address.is_ipv6() == v6;
            let sources: Vec<IpAddr> = sources.iter().filter(of_family).copied().collect();
            let destinations: Vec<IpAddr> =
                destinations.iter().filter(of_family).copied().collect();
            if sources.is_empty() || destinations.is_empty() {
                continue;
            }
            let all = sources.len() * destinations.len();
            if all <= limit {
                for &source in &sources {
                    pairs.extend(
                        destinations
                            .iter()
                            .map(|&destination| (source, destination)),
                    );
                }
                continue;
            }
            for (index, &destination) in destinations.iter().enumerate() {
                pairs.insert((sources[index % sources.len()], destination));
            }
            for &source in &sources {
                for _ in 0..4 {
                    pairs.insert((source, destinations[rng.below(destinations.len())]));
                }
            }
            let budget = limit.saturating_sub(pairs.len()).min(all);
            for _ in 0..budget {
                pairs.insert((
                    sources[rng.below(sources.len())],
                    destinations[rng.below(destinations.len())],
                ));
            }
        }
        pairs.into_iter().collect()
    }

    /// The case with `net` added to the list it is not in (to `masqueradeCIDRs` when it is a
    /// `nonMasqueradeCIDRs` entry, and the other way round), in the other spelling than the
    /// entry it repeats when `respell` (IPv6 only): a config validation must refuse.
    pub fn with_equal_prefix(&self, net: Net, rng: &mut Rng, respell: bool) -> Self {
        let spelled = |written: Option<&Entry>| Entry {
            net,
            expanded: written.is_some_and(|entry| entry.expanded) != (respell && net.v6),
        };
        let mut case = self.clone();
        if self.non_masquerade().contains(&net) {
            // With the key absent the network is one of the defaults, written nowhere.
            let written = self.lists.non_masquerade.iter().flatten();
            let entry = spelled(written.clone().find(|entry| entry.net == net));
            let at = rng.below(case.lists.masquerade.len() + 1);
            case.lists.masquerade.insert(at, entry);
        } else {
            let written = self.lists.masquerade.iter().find(|entry| entry.net == net);
            let mut kept = self
                .lists
                .non_masquerade
                .clone()
                .unwrap_or_else(|| default_list().into_iter().map(Entry::plain).collect());
            let at = rng.below(kept.len() + 1);
            kept.insert(at, spelled(written));
            case.lists.non_masquerade = Some(kept);
        }
        case
    }
}

/// What the generator may produce.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Chance in percent of `--enable-ipv6` (with IPv6 entries).
    pub ipv6_percent: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Self { ipv6_percent: 50 }
    }
}

/// The lists being built for one case, refusing an entry that would put one network in both
/// destination lists.
#[derive(Debug, Default)]
struct Builder {
    non_masquerade: Vec<Net>,
    masquerade: Vec<Net>,
    non_masquerade_src: Vec<Net>,
    /// Whether `nonMasqueradeCIDRs` is left out (its entries are then the defaults').
    defaults: bool,
    /// Whether the config has no `masqueradeCIDRs` (upstream's chain, or source exemptions
    /// alone).
    no_masquerade: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Keep,
    Masquerade,
}

impl List {
    const fn other(self) -> Self {
        match self {
            Self::Keep => Self::Masquerade,
            Self::Masquerade => Self::Keep,
        }
    }
}

impl Builder {
    fn kept(&self) -> Vec<Net> {
        if self.defaults {
            default_list()
        } else {
            self.non_masquerade.clone()
        }
    }

    /// Adds `net` to `list` unless the other destination list holds the same network.
    fn add(&mut self, list: List, net: Net) -> bool {
        match list {
            List::Keep if self.defaults || self.masquerade.contains(&net) => false,
            List::Keep => {
                self.non_masquerade.push(net);
                true
            }
            List::Masquerade if self.no_masquerade || self.kept().contains(&net) => false,
            List::Masquerade => {
                self.masquerade.push(net);
                true
            }
        }
    }

    /// A chain of up to three nested networks inside `root`, alternating lists (mostly), with
    /// a sibling now and then.
    fn nest(&mut self, rng: &mut Rng, root: Net, first: List) {
        let depth = rng.pick(&[1, 2, 2, 3, 3, 3, 3]);
        let max_extra = if root.v6 { 24 } else { 6 };
        let mut list = first;
        let mut outer = if rng.chance(40) {
            root
        } else {
            root.child(rng, max_extra)
        };
        for _ in 0..depth {
            self.add(list, outer);
            if rng.chance(20) {
                let sibling = root.child(rng, max_extra.saturating_mul(2));
                self.add(list, sibling);
            }
            list = if rng.chance(80) { list.other() } else { list };
            outer = outer.child(rng, max_extra);
        }
    }
}

/// Generates case `index` of `seed`.
pub fn generate(seed: u64, index: usize, shape: Shape) -> Case {
    let mut rng = Rng::new(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let enable_ipv6 = rng.chance(shape.ipv6_percent);
    let mut builder = Builder {
        defaults: rng.chance(12),
        no_masquerade: rng.chance(15),
        ..Builder::default()
    };
    let mut families = vec![false];
    if enable_ipv6 {
        families.push(true);
    }
    for &v6 in &families {
        let roots: Vec<Net> = if v6 {
            roots_v6().to_vec()
        } else {
            roots_v4().to_vec()
        };
        // Nested chains in one to three roots; the first level is mostly exempt, the classic
        // "exempt a range, masquerade a part of it, exempt a part of that" shape.
        let chains = rng.between(1, 3);
        for _ in 0..chains {
            let root = rng.pick(&roots);
            let first = if rng.chance(75) {
                List::Keep
            } else {
                List::Masquerade
            };
            builder.nest(&mut rng, root, first);
        }
        // A masqueradeCIDRs entry in a root no exempt entry touches: it changes nothing.
        if rng.chance(35) {
            let kept = builder.kept();
            let free: Vec<Net> = roots
                .iter()
                .copied()
                .filter(|root| {
                    !kept
                        .iter()
                        .any(|net| net.encloses(*root) || root.encloses(*net))
                })
                .collect();
            if !free.is_empty() {
                let root = rng.pick(&free);
                let net = if rng.chance(30) {
                    root
                } else {
                    root.child(&mut rng, 8)
                };
                builder.add(List::Masquerade, net);
            }
        }
        // Link-local: entries of either list inside it, or the whole range masqueraded.
        if rng.chance(50) {
            let link_local = if v6 { link_local_v6() } else { link_local_v4() };
            let first = if rng.chance(65) {
                List::Masquerade
            } else {
                List::Keep
            };
            builder.nest(&mut rng, link_local, first);
        }
        // The same network twice in one list is accepted.
        if rng.chance(15) && !builder.non_masquerade.is_empty() {
            let again = rng.pick(&builder.non_masquerade);
            builder.non_masquerade.push(again);
        }
        if rng.chance(15) && !builder.masquerade.is_empty() {
            let again = rng.pick(&builder.masquerade);
            builder.masquerade.push(again);
        }
        // Source exemptions: nested too, down to single pods.
        if rng.chance(55) {
            let root = if v6 {
                source_root_v6()
            } else {
                source_root_v4()
            };
            for _ in 0..rng.between(1, 3) {
                let net = if rng.chance(20) {
                    // One pod.
                    root.child(&mut rng, root.width())
                } else {
                    root.child(&mut rng, if v6 { 40 } else { 9 })
                };
                builder.non_masquerade_src.push(net);
                if rng.chance(30) {
                    builder
                        .non_masquerade_src
                        .push(net.child(&mut rng, if v6 { 30 } else { 5 }));
                }
            }
        }
    }
    // Entries of both families interleave in the lists, as a dual-stack config writes them.
    for list in [
        &mut builder.non_masquerade,
        &mut builder.masquerade,
        &mut builder.non_masquerade_src,
    ] {
        for at in (1..list.len()).rev() {
            list.swap(at, rng.below(at + 1));
        }
    }
    // Some IPv6 entries spelled out in full: the same networks to Go, other texts to
    // iptables and to the tries' writer.
    let mut entries = |list: Vec<Net>| -> Vec<Entry> {
        list.into_iter()
            .map(|net| Entry {
                net,
                expanded: net.v6 && rng.chance(20),
            })
            .collect()
    };
    let lists = Lists {
        non_masquerade: (!builder.defaults).then(|| entries(builder.non_masquerade)),
        masquerade: entries(builder.masquerade),
        non_masquerade_src: entries(builder.non_masquerade_src),
    };
    Case {
        seed,
        index,
        enable_ipv6,
        masq_link_local: rng.chance(50),
        masq_link_local_ipv6: rng.chance(50),
        lists,
    }
}

/// A directory for config files, removed when dropped.
#[derive(Debug)]
pub struct ConfigDir {
    path: PathBuf,
}

impl ConfigDir {
    /// A new, empty directory under the system's temporary directory.
    pub fn new(tag: &str) -> Self {
        let path = std::env::temp_dir().join(format!("{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path)
            .unwrap_or_else(|error| panic!("creating {}: {error}", path.display()));
        Self { path }
    }

    /// Writes `case`'s config to a file of this directory and returns its path.
    pub fn write(&self, case: &Case) -> PathBuf {
        let path = self.path.join(format!("ip-masq-agent-{}", case.index));
        fs::write(&path, case.yaml())
            .unwrap_or_else(|error| panic!("writing {}: {error}", path.display()));
        path
    }

    /// Loads `case` the way the agent reads its config file.
    pub fn load(&self, case: &Case) -> Result<EffectiveConfig, ConfigError> {
        let path = self.write(case);
        load(&ConfigSource::File(path), &case.read_options())
    }

    /// Loads `case`, failing the test when the config is refused, and builds its policy.
    pub fn policy(&self, case: &Case) -> Policy {
        let config = self.load(case).unwrap_or_else(|error| {
            panic!(
                "a generated config was refused: {error}\n{}",
                case.describe()
            )
        });
        Policy::new(&config, case.enable_ipv6)
    }
}

impl Drop for ConfigDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// One place the decision was taken and what it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The pod source.
    pub source: IpAddr,
    /// The destination.
    pub destination: IpAddr,
    /// What `explain` (the policy) says: masquerade or not, and why.
    pub explain: String,
    /// What the other implementation did.
    pub observed: String,
}

/// Fails the test with every mismatch of `case` (at most a screenful), the case, its chains
/// and what `context` adds, when there is any mismatch.
pub fn assert_agreement(
    what: &str,
    case: &Case,
    policy: &Policy,
    mismatches: &[Mismatch],
    context: impl FnOnce() -> String,
) {
    if mismatches.is_empty() {
        return;
    }
    let mut report = format!(
        "{what} disagrees with explain on {} pairs of {}\n",
        mismatches.len(),
        case.describe()
    );
    for mismatch in mismatches.iter().take(12) {
        let _ = writeln!(
            report,
            "  {} -> {}: explain {}, {what} {}",
            mismatch.source, mismatch.destination, mismatch.explain, mismatch.observed
        );
    }
    for v6 in [false, true] {
        let family = if v6 {
            masq::config::cidr::Family::Ipv6
        } else {
            masq::config::cidr::Family::Ipv4
        };
        let _ = writeln!(report, "chain ({family}):");
        for rule in policy.rules(family) {
            let _ = writeln!(report, "  {} {:?}", rule.cidr, rule.kind);
        }
    }
    report.push_str(&context());
    panic!("{report}");
}

/// The policy's decision in words, for reports.
pub fn explained(policy: &Policy, source: IpAddr, destination: IpAddr) -> String {
    let decision = policy.decide_from(Some(source), destination);
    let verdict = if decision.masquerade {
        "masquerade"
    } else {
        "keep"
    };
    format!("{verdict} ({:?})", decision.reason)
}
