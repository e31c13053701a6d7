//! The datapath's side of the agreement: one loaded datapath whose tries and settings are
//! brought in line with each case's policy by the agent's own code, and UDP datagrams from a pod source to a
//! destination run through `masq_egress` with `BPF_PROG_TEST_RUN`.

use std::net::{IpAddr, Ipv6Addr};

use masq::{
    datapath::sync::{TrieView, WantedTries, settings, sync_tries},
    policy::{Policy, Reason, RuleKind},
};
use masq_common::{counters::Counter, ports::PortRange};

use super::Mismatch;
use crate::{
    check::Ipv4View,
    harness::{Action, Harness, node_ip},
    pktgen::Packet,
    pktgen6::{Ipv6View, Packet6},
};

/// The node's IPv6 address in the datapath's tests: what masqueraded IPv6 leaves with.
pub const NODE_IPV6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);

/// The SNAT ports: every one for the taking.
const PORTS: [PortRange; 1] = [PortRange::new(1024, 65_535)];
/// Whether ports are chosen at random (`--random-fully`).
const RANDOM_FULLY: bool = true;

/// The counters that say why a packet was left alone.
const EXEMPTIONS: [Counter; 3] = [
    Counter::EgressExemptSource,
    Counter::EgressExemptCidr,
    Counter::EgressExemptLinkLocal,
];

/// What the datapath did with one datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Whether its source became the node's address.
    pub masqueraded: bool,
    /// The exemption counter it moved, if any.
    pub exemption: Option<Counter>,
}

/// A loaded datapath the cases take turns in.
#[derive(Debug)]
pub struct DatapathProbe {
    harness: Harness,
    next_port: u16,
}

impl Default for DatapathProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl DatapathProbe {
    /// Loads the datapath (fails the test without root) with every port for the taking.
    pub fn new() -> Self {
        let mut harness = Harness::unconfigured();
        harness.configure(&PORTS, RANDOM_FULLY);
        Self {
            harness,
            next_port: 10_000,
        }
    }

    /// Empties the NAT tables, so that no mapping of an earlier case (which is looked up before
    /// the policy) carries over.
    fn clear_nat(&mut self) {
        let maps = &mut self.harness.datapath.maps;
        let keys: Vec<_> = maps.nat_v4.keys().filter_map(Result::ok).collect();
        for key in keys {
            let _ = maps.nat_v4.remove(&key);
        }
        let keys: Vec<_> = maps.nat_v6.keys().filter_map(Result::ok).collect();
        for key in keys {
            let _ = maps.nat_v6.remove(&key);
        }
        let left = [maps.nat_v4.keys().count(), maps.nat_v6.keys().count()];
        assert_eq!(left, [0; 2], "NAT tables left non-empty between cases");
    }

    /// Installs `policy` with the agent's own code: [`sync_tries`] makes every trie hold what
    /// [`Policy::nomasq_v4`], [`Policy::nomasq_v6`], [`Policy::nomasq_src_v4`] and
    /// [`Policy::nomasq_src_v6`] say (whatever an earlier case left in them), then the
    /// settings are written as the agent writes them, the source flag from
    /// [`WantedTries::source_exemptions`]; IPv6 is translated only with `--enable-ipv6`.
    pub fn install(&mut self, policy: &Policy) {
        self.clear_nat();
        self.next_port = 10_000;
        let wanted = WantedTries {
            destinations_v4: policy.nomasq_v4(),
            destinations_v6: policy.nomasq_v6(),
            sources_v4: policy.nomasq_src_v4(),
            sources_v6: policy.nomasq_src_v6(),
        };
        let maps = &mut self.harness.datapath.maps;
        sync_tries(maps, &wanted, TrieView::LastSynced)
            .unwrap_or_else(|error| panic!("syncing the tries: {error}"));
        maps.set_settings(&settings(&PORTS, RANDOM_FULLY, wanted.source_exemptions()))
            .unwrap_or_else(|error| panic!("{error}"));
        self.harness
            .set_uplink_v6(policy.ipv6_enabled().then_some(NODE_IPV6));
    }

    fn exemption_counters(&self, v6: bool) -> [u64; 3] {
        EXEMPTIONS.map(|counter| {
            if v6 {
                self.harness.counter_v6(counter)
            } else {
                self.harness.counter(counter)
            }
        })
    }

    /// Sends a new UDP flow from `source` to `destination` out of the uplink: `Err` describes
    /// anything but a clean pass (a drop, a rewrite of something other than the source).
    pub fn send(&mut self, source: IpAddr, destination: IpAddr) -> Result<Outcome, String> {
        // Every pair a flow of its own, so that no mapping answers for it.
        let port = self.next_port;
        self.next_port = self.next_port.wrapping_add(1).max(10_000);
        let v6 = destination.is_ipv6();
        let before = self.exemption_counters(v6);
        let (frame, node) = match (source, destination) {
            (IpAddr::V4(source), IpAddr::V4(destination)) => (
                Packet::udp(&format!("{source}:{port}"), &format!("{destination}:5353")).frame(),
                IpAddr::V4(node_ip()),
            ),
            (IpAddr::V6(source), IpAddr::V6(destination)) => (
                Packet6::udp(&source.to_string(), port, &destination.to_string(), 5353).frame(),
                IpAddr::V6(NODE_IPV6),
            ),
            _ => return Err("source and destination of different families".to_owned()),
        };
        let run = self.harness.egress(&frame);
        if run.action != Action::Pass {
            return Err(format!("dropped ({:?})", self.harness.counters()));
        }
        let (seen_source, seen_destination) = if v6 {
            let view = Ipv6View::of_frame(&run.frame);
            (IpAddr::V6(view.src), IpAddr::V6(view.dst))
        } else {
            let view = Ipv4View::of_frame(&run.frame);
            (IpAddr::V4(view.src), IpAddr::V4(view.dst))
        };
        let after = self.exemption_counters(v6);
        let moved: Vec<Counter> = EXEMPTIONS
            .iter()
            .zip(before.iter().zip(after))
            .filter(|(_, (before, after))| *after != **before)
            .map(|(counter, _)| *counter)
            .collect();
        let exemption = match moved.as_slice() {
            [] => None,
            [counter] => Some(*counter),
            more => return Err(format!("moved several exemption counters: {more:?}")),
        };
        if seen_destination != destination {
            return Err(format!("rewrote the destination to {seen_destination}"));
        }
        if seen_source == node {
            Ok(Outcome {
                masqueraded: true,
                exemption,
            })
        } else if seen_source == source && run.frame == frame {
            Ok(Outcome {
                masqueraded: false,
                exemption,
            })
        } else {
            Err(format!(
                "left with {seen_source}, neither the pod's nor the node's address"
            ))
        }
    }

    /// Runs every pair and returns where the datapath disagrees with the policy: on the
    /// decision, or on the reason its counters give (the exemption explain names).
    pub fn compare(&mut self, policy: &Policy, pairs: &[(IpAddr, IpAddr)]) -> Vec<Mismatch> {
        let mut mismatches = Vec::new();
        for &(source, destination) in pairs {
            let decision = policy.decide_from(Some(source), destination);
            let expected_counter = match &decision.reason {
                Reason::Exempt(rule) => Some(match rule.kind {
                    RuleKind::Source(_) => Counter::EgressExemptSource,
                    RuleKind::LinkLocal => Counter::EgressExemptLinkLocal,
                    _ => Counter::EgressExemptCidr,
                }),
                // Without --enable-ipv6 the uplink has no IPv6 address: nothing is decided.
                Reason::Ipv6Disabled | Reason::Masqueraded(_) | Reason::NoRuleMatched => None,
            };
            let observed = self.send(source, destination);
            let agrees = observed.as_ref().is_ok_and(|outcome| {
                outcome.masqueraded == decision.masquerade && outcome.exemption == expected_counter
            });
            if !agrees {
                mismatches.push(Mismatch {
                    source,
                    destination,
                    explain: format!(
                        "{} (expects counter {expected_counter:?})",
                        super::explained(policy, source, destination)
                    ),
                    observed: match observed {
                        Ok(outcome) => format!("{outcome:?}"),
                        Err(error) => error,
                    },
                });
            }
        }
        mismatches
    }
}
