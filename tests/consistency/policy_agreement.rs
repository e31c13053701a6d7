//! Issue 26: `masqueradeCIDRs` and `nonMasqueradeSrcCIDRs` must mean the same thing wherever
//! masq decides. Over generated configs (nested ranges three levels deep, masquerade entries
//! no exempt range encloses, link-local either way, source exemptions, both families) and
//! (pod source, destination) pairs on every boundary, the decision must be identical in:
//!
//! * `masq explain` (`Policy::decide_from`, and the binary for a few configs);
//! * the eBPF datapath, its tries filled from the policy, through `BPF_PROG_TEST_RUN`;
//! * the iptables rules `render-iptables` writes, installed in a namespace and crossed by real
//!   connections.
//!
//! Configs that put one network in both destination lists must be refused instead.
//!
//! Seeded: `MASQ_AGREEMENT_SEED` (default below) and `MASQ_AGREEMENT_CONFIGS` change the run,
//! `MASQ_AGREEMENT_CASE=N` replays one case; every failure prints all three. Needs root (loads
//! eBPF programs, creates namespaces) and iptables; fails loudly without them.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    process::Command,
    time::Instant,
};

use masq::{
    config::{cidr::Family, source::ConfigError, validate::ValidationError},
    policy::{Policy, Reason, RuleKind},
};
use masq_testbed::{
    agent::masq_binary,
    agreement::{
        Case, ConfigDir, Net, Rng, Shape, assert_agreement,
        datapath::DatapathProbe,
        generate,
        iptables::{RulesBed, assignable, routable},
        link_local_v4, link_local_v6, nets,
    },
};

/// The default seed: fixed, so that a plain run is repeatable.
const SEED: u64 = 0x6167_7265_656d_6e74;
/// Configs the explain/datapath comparison generates by default.
const CONFIGS: usize = 1_500;
/// Pairs tried per config in that comparison, at most.
const PAIRS_PER_CONFIG: usize = 400;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |text| {
        let text = text.trim();
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        parsed.unwrap_or_else(|error| panic!("{name}={text}: {error}"))
    })
}

/// The case indexes to run: all of `0..count`, or the one `MASQ_AGREEMENT_CASE` names.
fn case_indexes(count: usize) -> Vec<usize> {
    match std::env::var("MASQ_AGREEMENT_CASE") {
        Ok(index) => vec![
            index
                .trim()
                .parse()
                .unwrap_or_else(|error| panic!("MASQ_AGREEMENT_CASE={index}: {error}")),
        ],
        Err(_) => (0..count).collect(),
    }
}

/// What a run has met, so that a generator that stopped producing a shape fails the test
/// instead of quietly testing less.
#[derive(Debug, Default)]
struct Coverage {
    /// Shapes of configs, by name: how many configs had them.
    shapes: BTreeMap<&'static str, usize>,
    /// Decisions, by family and reason: how many pairs had them.
    reasons: BTreeMap<(Family, &'static str), usize>,
}

impl Coverage {
    fn shape(&mut self, name: &'static str, present: bool) {
        *self.shapes.entry(name).or_default() += usize::from(present);
    }

    fn config(&mut self, case: &Case, policy: &Policy) {
        for v6 in [false, true] {
            let suffix = |v4: &'static str, v6_name: &'static str| if v6 { v6_name } else { v4 };
            self.shape(
                suffix(
                    "keep > masquerade > keep (IPv4)",
                    "keep > masquerade > keep (IPv6)",
                ),
                nested_three_deep(case, v6),
            );
            let link_local = if v6 { link_local_v6() } else { link_local_v4() };
            let masq_link_local = if v6 {
                case.masq_link_local_ipv6
            } else {
                case.masq_link_local
            };
            let in_link_local = nets(&case.lists.masquerade)
                .iter()
                .any(|net| link_local.encloses(*net));
            self.shape(
                suffix(
                    "masquerade entry in exempt link-local (IPv4)",
                    "masquerade entry in exempt link-local (IPv6)",
                ),
                in_link_local && !masq_link_local && (!v6 || case.enable_ipv6),
            );
            self.shape(
                suffix(
                    "masquerade entry in masqueraded link-local (IPv4)",
                    "masquerade entry in masqueraded link-local (IPv6)",
                ),
                in_link_local && masq_link_local && (!v6 || case.enable_ipv6),
            );
            self.shape(
                suffix("source exemptions (IPv4)", "source exemptions (IPv6)"),
                case.lists
                    .non_masquerade_src
                    .iter()
                    .any(|entry| entry.net.v6 == v6),
            );
        }
        self.shape(
            "masquerade entry no exempt range encloses",
            !policy.ineffective_masquerade_cidrs().is_empty(),
        );
        self.shape(
            "no masquerade entries, source exemptions",
            case.lists.masquerade.is_empty() && !case.lists.non_masquerade_src.is_empty(),
        );
        self.shape(
            "none of masq's own keys (upstream's chain)",
            case.lists.masquerade.is_empty() && case.lists.non_masquerade_src.is_empty(),
        );
        self.shape(
            "defaults with masquerade entries",
            case.lists.non_masquerade.is_none() && !case.lists.masquerade.is_empty(),
        );
        self.shape(
            "same network twice in a list",
            [case.non_masquerade(), nets(&case.lists.masquerade)]
                .iter()
                .any(|list| list.iter().collect::<BTreeSet<_>>().len() < list.len()),
        );
        self.shape(
            "expanded IPv6 spelling",
            case.lists
                .masquerade
                .iter()
                .chain(case.lists.non_masquerade.iter().flatten())
                .any(|entry| entry.expanded),
        );
    }

    fn decision(&mut self, policy: &Policy, source: IpAddr, destination: IpAddr) {
        let family = if destination.is_ipv6() {
            Family::Ipv6
        } else {
            Family::Ipv4
        };
        let reason = match policy.decide_from(Some(source), destination).reason {
            Reason::Exempt(rule) => match rule.kind {
                RuleKind::Source(_) => "exempt source",
                RuleKind::LinkLocal => "exempt link-local",
                RuleKind::Configured(_) => "exempt destination",
                RuleKind::Masquerade(_) => "masquerade rule marked exempt",
            },
            Reason::Masqueraded(_) => "masqueraded by a masqueradeCIDRs entry",
            Reason::NoRuleMatched => "masqueraded, no rule",
            Reason::Ipv6Disabled => "IPv6 disabled",
        };
        *self.reasons.entry((family, reason)).or_default() += 1;
    }

    /// Fails unless every shape was met in `least` configs and every reason in both families.
    fn assert_met(&self, least: usize) {
        let thin: Vec<_> = self
            .shapes
            .iter()
            .filter(|(_, count)| **count < least)
            .collect();
        assert!(
            thin.is_empty(),
            "shapes met too rarely: {thin:?} ({self:#?})"
        );
        for family in [Family::Ipv4, Family::Ipv6] {
            for reason in [
                "exempt source",
                "exempt link-local",
                "exempt destination",
                "masqueraded by a masqueradeCIDRs entry",
                "masqueraded, no rule",
            ] {
                assert!(
                    self.reasons.contains_key(&(family, reason)),
                    "no {family} pair was {reason}: {self:#?}"
                );
            }
        }
    }
}

/// Whether `case` has, in one family, an exempt network holding a masqueraded one holding an
/// exempt one.
fn nested_three_deep(case: &Case, v6: bool) -> bool {
    let kept: Vec<Net> = case
        .non_masquerade()
        .into_iter()
        .filter(|net| net.v6 == v6)
        .collect();
    let masqueraded: Vec<Net> = nets(&case.lists.masquerade)
        .into_iter()
        .filter(|net| net.v6 == v6)
        .collect();
    let inside = |outer: Net, inner: Net| outer.encloses(inner) && outer != inner;
    kept.iter().any(|&outer| {
        masqueraded
            .iter()
            .any(|&middle| inside(outer, middle) && kept.iter().any(|&inner| inside(middle, inner)))
    }) && (!v6 || case.enable_ipv6)
}

#[test]
fn generated_configs_decide_alike_in_explain_and_the_datapath() {
    let seed = env_u64("MASQ_AGREEMENT_SEED", SEED);
    let count =
        usize::try_from(env_u64("MASQ_AGREEMENT_CONFIGS", CONFIGS as u64)).unwrap_or(CONFIGS);
    let started = Instant::now();
    let dir = ConfigDir::new("masq-agreement");
    let mut probe = DatapathProbe::new();
    let mut coverage = Coverage::default();
    let (mut pairs_run, indexes) = (0, case_indexes(count));
    for &index in &indexes {
        let case = generate(seed, index, Shape::default());
        let policy = dir.policy(&case);
        let mut rng = Rng::new(seed ^ 0x7061_6972 ^ index as u64);
        let pairs = case.pairs(&mut rng, PAIRS_PER_CONFIG);
        coverage.config(&case, &policy);
        for &(source, destination) in &pairs {
            coverage.decision(&policy, source, destination);
        }
        probe.install(&policy);
        let mismatches = probe.compare(&policy, &pairs);
        assert_agreement("the datapath", &case, &policy, &mismatches, String::new);
        pairs_run += pairs.len();
    }
    println!(
        "seed {seed:#x}: {} configs, {pairs_run} pairs, explain and the datapath agree ({:.1} s)\n{coverage:#?}",
        indexes.len(),
        started.elapsed().as_secs_f64()
    );
    if indexes.len() == count && count >= CONFIGS {
        coverage.assert_met(5);
    }
}

#[test]
fn the_explain_command_decides_as_the_policy() {
    let seed = env_u64("MASQ_AGREEMENT_SEED", SEED);
    let dir = ConfigDir::new("masq-agreement-cli");
    // The first generated configs with IPv6 and source exemptions in both families, and one
    // without IPv6: the command's flags and its --source are what is tied in here.
    let mut chosen: Vec<Case> = Vec::new();
    for index in 0..500 {
        let case = generate(seed, index, Shape::default());
        let sources_in = |v6: bool| {
            case.lists
                .non_masquerade_src
                .iter()
                .any(|entry| entry.net.v6 == v6)
        };
        let wanted = if chosen.is_empty() {
            case.enable_ipv6 && sources_in(false) && sources_in(true)
        } else {
            !case.enable_ipv6 && sources_in(false) && !case.lists.masquerade.is_empty()
        };
        if wanted {
            chosen.push(case);
            if chosen.len() == 2 {
                break;
            }
        }
    }
    assert_eq!(
        chosen.len(),
        2,
        "the generator offers no config of the wanted shapes"
    );
    let mut decisions = 0;
    for case in &chosen {
        let path = dir.write(case);
        let policy = dir.policy(case);
        let mut rng = Rng::new(seed ^ case.index as u64);
        let mut by_source: BTreeMap<IpAddr, Vec<IpAddr>> = BTreeMap::new();
        for (source, destination) in case.pairs(&mut rng, 200) {
            by_source.entry(source).or_default().push(destination);
        }
        for (source, destinations) in by_source {
            let mut command = Command::new(masq_binary());
            command.arg("explain").arg("--config").arg(&path);
            if case.enable_ipv6 {
                command.arg("--enable-ipv6");
            }
            command.args(["--source", &source.to_string(), "--output", "json"]);
            command.args(destinations.iter().map(ToString::to_string));
            let output = command
                .output()
                .unwrap_or_else(|error| panic!("running masq explain: {error}"));
            assert!(
                output.status.success(),
                "masq explain failed: {}\n{}",
                String::from_utf8_lossy(&output.stderr),
                case.describe()
            );
            let json: serde_json::Value = serde_json::from_slice(&output.stdout)
                .unwrap_or_else(|error| panic!("masq explain printed no JSON: {error}"));
            let answers = json
                .as_array()
                .unwrap_or_else(|| panic!("masq explain printed no list: {json}"));
            assert_eq!(answers.len(), destinations.len(), "{json}");
            for (answer, &destination) in answers.iter().zip(&destinations) {
                let decision = policy.decide_from(Some(source), destination);
                let matched = match decision.reason {
                    Reason::Exempt(rule) | Reason::Masqueraded(rule) => {
                        serde_json::Value::from(rule.cidr.as_str())
                    }
                    Reason::NoRuleMatched | Reason::Ipv6Disabled => serde_json::Value::Null,
                };
                assert_eq!(
                    (
                        &answer["destination"],
                        &answer["masquerade"],
                        &answer["matched"]
                    ),
                    (
                        &serde_json::Value::from(destination.to_string()),
                        &serde_json::Value::from(decision.masquerade),
                        &matched
                    ),
                    "masq explain --source {source} {destination} disagrees with the policy: \
                     {answer}\n{}",
                    case.describe()
                );
                decisions += 1;
            }
        }
    }
    assert!(decisions > 100, "only {decisions} decisions compared");
}

#[test]
fn one_network_in_both_destination_lists_is_refused() {
    let seed = env_u64("MASQ_AGREEMENT_SEED", SEED);
    let dir = ConfigDir::new("masq-agreement-refused");
    let mut met = BTreeMap::<&str, usize>::new();
    for index in 0..200 {
        let case = generate(seed, index, Shape::default());
        let mut rng = Rng::new(seed ^ 0x6571 ^ index as u64);
        let kept = case.non_masquerade();
        let masqueraded = nets(&case.lists.masquerade);
        let mut candidates = Vec::new();
        if !kept.is_empty() {
            let from = if case.lists.non_masquerade.is_none() {
                "a default entry also masqueraded"
            } else {
                "a nonMasqueradeCIDRs entry also masqueraded"
            };
            candidates.push((kept[rng.below(kept.len())], from));
        }
        if !masqueraded.is_empty() {
            candidates.push((
                masqueraded[rng.below(masqueraded.len())],
                "a masqueradeCIDRs entry also kept",
            ));
        }
        for (net, what) in candidates {
            let respell = net.v6 && rng.chance(50);
            let refused = case.with_equal_prefix(net, &mut rng, respell);
            let what = if respell { "spelled otherwise" } else { what };
            match dir.load(&refused) {
                Err(ConfigError::Invalid(ValidationError::InBothLists { .. })) => {
                    *met.entry(what).or_default() += 1;
                }
                other => panic!(
                    "{} in both lists was not refused as such: {:?}\n{}",
                    net.text(),
                    other.map(|_| "accepted"),
                    refused.describe()
                ),
            }
        }
    }
    for what in [
        "a default entry also masqueraded",
        "a nonMasqueradeCIDRs entry also masqueraded",
        "a masqueradeCIDRs entry also kept",
        "spelled otherwise",
    ] {
        assert!(
            met.get(what).is_some_and(|count| *count >= 3),
            "{what}: {met:?}"
        );
    }

    // The command line says so too, with upstream's exit code for a bad config.
    let case = generate(seed, 0, Shape::default());
    let net = case.non_masquerade()[0];
    let refused = case.with_equal_prefix(net, &mut Rng::new(seed), false);
    let path = dir.write(&refused);
    let mut command = Command::new(masq_binary());
    command.arg("check-config").arg("--config").arg(&path);
    if refused.enable_ipv6 {
        command.arg("--enable-ipv6");
    }
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("running masq check-config: {error}"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is listed in both masqueradeCIDRs"),
        "{stderr}\n{}",
        refused.describe()
    );
}

/// Pairs the real-traffic bed can carry, at most `per_family` of each family: masqueraded and
/// kept ones in turn (as far as there are both), each side every destination once before any
/// twice.
fn routable_pairs(
    case: &Case,
    policy: &Policy,
    seed: u64,
    per_family: usize,
) -> Vec<(IpAddr, IpAddr)> {
    let mut rng = Rng::new(seed ^ 0x7472 ^ case.index as u64);
    let mut candidates: Vec<(IpAddr, IpAddr)> = case
        .pairs(&mut rng, 2_000)
        .into_iter()
        .filter(|&(source, destination)| assignable(source) && routable(destination))
        .collect();
    for at in (1..candidates.len()).rev() {
        candidates.swap(at, rng.below(at + 1));
    }
    let mut chosen = Vec::new();
    for v6 in [false, true] {
        let queue = |masquerade: bool| {
            let of_kind: Vec<_> = candidates
                .iter()
                .copied()
                .filter(|&(source, destination)| {
                    destination.is_ipv6() == v6
                        && policy.decide_from(Some(source), destination).masquerade == masquerade
                })
                .collect();
            let mut seen = BTreeSet::new();
            let (mut queue, again): (Vec<_>, Vec<_>) = of_kind
                .into_iter()
                .partition(|(_, destination)| seen.insert(*destination));
            queue.extend(again);
            queue.into_iter()
        };
        let (mut masqueraded, mut kept) = (queue(true), queue(false));
        let mut taken = 0;
        while taken < per_family {
            let (first, second) = if taken % 2 == 0 {
                (&mut masqueraded, &mut kept)
            } else {
                (&mut kept, &mut masqueraded)
            };
            let Some(pair) = first.next().or_else(|| second.next()) else {
                break;
            };
            chosen.push(pair);
            taken += 1;
        }
    }
    chosen
}

#[test]
fn the_iptables_rules_decide_alike_with_real_traffic() {
    let seed = env_u64("MASQ_AGREEMENT_SEED", SEED);
    let started = Instant::now();
    let dir = ConfigDir::new("masq-agreement-iptables");
    // A few configs of the shapes that matter, the first the generator offers of each.
    type Wanted = (&'static str, fn(&Case, &Policy) -> bool);
    let wanted: [Wanted; 6] = [
        (
            "IPv4 keep > masquerade > keep, with source exemptions",
            |case, _| {
                nested_three_deep(case, false)
                    && case
                        .lists
                        .non_masquerade_src
                        .iter()
                        .any(|entry| !entry.net.v6)
            },
        ),
        (
            "IPv6 keep > masquerade > keep, with source exemptions",
            |case, _| {
                nested_three_deep(case, true)
                    && case
                        .lists
                        .non_masquerade_src
                        .iter()
                        .any(|entry| entry.net.v6)
            },
        ),
        (
            "masquerade entry inside exempt IPv4 link-local",
            |case, _| {
                !case.masq_link_local
                    && nets(&case.lists.masquerade)
                        .iter()
                        .any(|net| link_local_v4().encloses(*net))
            },
        ),
        (
            "masquerade entry inside masqueraded IPv4 link-local",
            |case, _| {
                case.masq_link_local
                    && nets(&case.lists.masquerade)
                        .iter()
                        .any(|net| link_local_v4().encloses(*net))
            },
        ),
        (
            "defaults, and a masquerade entry no exempt range encloses",
            |case, policy| {
                case.lists.non_masquerade.is_none()
                    && !policy.ineffective_masquerade_cidrs().is_empty()
            },
        ),
        (
            "source exemptions and no masquerade entry, both families",
            |case, _| {
                case.enable_ipv6
                    && case.lists.masquerade.is_empty()
                    && case
                        .lists
                        .non_masquerade_src
                        .iter()
                        .any(|entry| entry.net.v6)
                    && case
                        .lists
                        .non_masquerade_src
                        .iter()
                        .any(|entry| !entry.net.v6)
            },
        ),
    ];
    let mut cases = Vec::new();
    let replay = std::env::var_os("MASQ_AGREEMENT_CASE").is_some();
    if replay {
        // The one case, whatever its shape.
        let case = generate(seed, case_indexes(0)[0], Shape::default());
        let policy = dir.policy(&case);
        cases.push(("the replayed case", case, policy));
    }
    for &(name, predicate) in wanted.iter().filter(|_| !replay) {
        let found = (0..2_000).find_map(|index| {
            let case = generate(seed, index, Shape::default());
            let policy = dir.policy(&case);
            predicate(&case, &policy).then_some((case, policy))
        });
        let (case, policy) =
            found.unwrap_or_else(|| panic!("the generator offers no config with {name}"));
        cases.push((name, case, policy));
    }
    let mut bed = RulesBed::new("agr");
    let mut outcomes = BTreeMap::<bool, usize>::new();
    let mut pairs_run = 0;
    for (name, case, policy) in &cases {
        let pairs = routable_pairs(case, policy, seed, 24);
        assert!(
            pairs.len() >= 10,
            "{name}: only {} routable pairs",
            pairs.len()
        );
        bed.install(policy);
        let mismatches = bed.compare(policy, &pairs);
        assert_agreement("iptables (real traffic)", case, policy, &mismatches, || {
            format!("{name}: the node's nat table:\n{}", bed.rules())
        });
        for &(source, destination) in &pairs {
            *outcomes
                .entry(policy.decide_from(Some(source), destination).masquerade)
                .or_default() += 1;
        }
        pairs_run += pairs.len();
    }
    println!(
        "{} configs, {pairs_run} connections: iptables agrees with explain ({:.1} s), \
         masquerade/keep: {outcomes:?}",
        cases.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        replay
            || outcomes.get(&true).is_some_and(|count| *count >= 10)
                && outcomes.get(&false).is_some_and(|count| *count >= 10),
        "too few of one decision: {outcomes:?}"
    );
}
