//! Property tests: the rendered iptables chain, `explain` (the policy), and the datapath's trie
//! contents make the same decision for every destination, on random configs.

#![expect(
    clippy::expect_used,
    reason = "test helpers fail the test with context"
)]

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    str::FromStr,
};

use masq::{
    config::{
        GoDuration,
        cidr::Family,
        source::{ConfigSource, ReadOptions, load},
    },
    iptables::render::{DEFAULT_CHAIN, RuleOptions, restore_input},
    policy::Policy,
    ports::ToPorts,
};
use proptest::prelude::*;

/// An aligned IPv4 CIDR built from random bits.
fn cidr_strategy() -> impl Strategy<Value = String> {
    (any::<u32>(), 0u8..=32).prop_map(|(bits, prefix)| {
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        format!("{}/{prefix}", Ipv4Addr::from_bits(bits & mask))
    })
}

/// Addresses that often fall inside interesting ranges.
fn address_strategy() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        any::<u32>().prop_map(Ipv4Addr::from_bits),
        (any::<u16>()).prop_map(|low| Ipv4Addr::new(169, 254, (low >> 8) as u8, low as u8)),
        (any::<u16>()).prop_map(|low| Ipv4Addr::new(10, (low >> 8) as u8, low as u8, 1)),
    ]
}

/// What the rendered chain does with `destination`, read from the restore input alone: the
/// first `-d CIDR -j RETURN` that matches exempts it, reaching `MASQUERADE` masquerades it.
fn chain_masquerades(restore_input: &str, destination: Ipv4Addr) -> bool {
    for line in restore_input.lines() {
        if let Some(position) = line.find(" -d ") {
            let cidr = line[position + 4..].split(' ').next().unwrap_or_default();
            let (address, prefix) = cidr.split_once('/').expect("CIDR in rule");
            let address = Ipv4Addr::from_str(address).expect("rule address");
            let prefix: u32 = prefix.parse().expect("rule prefix");
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix)
            };
            if destination.to_bits() & mask == address.to_bits() & mask {
                assert!(line.ends_with(" -j RETURN"), "{line}");
                return false;
            }
        } else if line.contains("-j MASQUERADE") {
            return true;
        }
    }
    panic!("chain without a final MASQUERADE:\n{restore_input}");
}

/// What the datapath's longest-prefix-match trie does: any matching entry exempts.
fn trie_masquerades(policy: &Policy, destination: Ipv4Addr) -> bool {
    !policy.nomasq_v4().keys().any(|(address, prefix)| {
        let mask = if *prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(*prefix))
        };
        destination.to_bits() & mask == address.to_bits()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chain_policy_and_trie_agree(
        cidrs in prop::collection::vec(cidr_strategy(), 0..12),
        masq_link_local in any::<bool>(),
        destinations in prop::collection::vec(address_strategy(), 1..24),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ip-masq-agent");
        let list: Vec<String> = cidrs.iter().map(|cidr| format!("  - {cidr}\n")).collect();
        fs::write(&path, format!("nonMasqueradeCIDRs:\n{}masqLinkLocal: {masq_link_local}\n", list.concat()))
            .expect("write config");
        let options = ReadOptions {
            nomasq_all_reserved_ranges: false,
            enable_ipv6: false,
            resync_interval: GoDuration::from_secs(60),
        };
        let config = load(&ConfigSource::File(path), &options).expect("random aligned CIDRs are valid");
        let policy = Policy::new(&config, false);
        let rules = RuleOptions { chain: DEFAULT_CHAIN.to_owned(), random_fully: true, to_ports: ToPorts::default() };
        let rendered = restore_input(&policy, Family::Ipv4, &rules);
        for destination in destinations {
            let explained = policy.decide(IpAddr::V4(destination)).masquerade;
            prop_assert_eq!(explained, chain_masquerades(&rendered, destination), "chain vs explain for {}", destination);
            prop_assert_eq!(explained, trie_masquerades(&policy, destination), "trie vs explain for {}", destination);
        }
    }
}
