//! A frame fuzzer for the datapath through `BPF_PROG_TEST_RUN`.
//!
//! [`generate`] crafts frames (flows, replies to the mappings the fuzzer created, ICMP errors
//! about them, fragments, foreign protocols) and mutates them; [`Fuzzer`] runs each through
//! `masq_egress` or `masq_ingress` of one loaded datapath and hands the result to the
//! [`oracle`], which knows what the datapath may do to a frame and checks the counters; the
//! [`model`] is what the fuzzer learnt about the datapath's tables from the frames so far.
//!
//! The run is split into epochs: each starts with empty tables and a configuration of its own
//! (the harness default, small port ranges so that allocation fails, or the device not an
//! uplink). Everything comes from one seed ([`rng`]): a failure prints it, with the frame, its
//! outcome and the frames before it. The datapath's own port choice (`bpf_get_prandom_u32`) is
//! not seeded, so a replay reproduces the fuzzer's decisions while translated ports may differ.
//!
//! Datapath bugs that are known and not fixed yet are described by [`KnownBug`]s: a predicate
//! over the frame (and what the model knows) that says precisely which frames the bug affects,
//! and the violations those frames may show. Such frames still run, and any other violation
//! they show still fails.

pub mod generate;
pub mod model;
pub mod oracle;
pub mod rng;
pub mod v6;
pub mod wire;

use std::{collections::VecDeque, net::Ipv4Addr, time::Instant};

use aya::programs::{TestRun, TestRunOptions};
use masq::datapath::object::{Datapath, LoadOptions};
use masq_common::{
    counters::Counter,
    layout::{NOMASQ_KIND_CIDR, NOMASQ_KIND_LINK_LOCAL},
    nat::Direction,
    ports::PortRange,
};

use self::{
    generate::Generator,
    model::Model,
    oracle::{Kind, Observation, Violation},
    rng::Rng,
    wire::hex,
};
use crate::harness::{Harness, node_ip, require_root};

/// A datapath bug the fuzzer knows about, whose frames the random run tolerates.
#[derive(Clone, Copy, Debug)]
pub struct KnownBug {
    pub name: &'static str,
    /// Whether `frame` belongs to the bug's class: decided from the input and what the model
    /// knows before the frame runs, never from what the datapath did with it.
    pub matches: fn(&Probe<'_>) -> bool,
    /// The violations frames of the class may show; any other still fails.
    pub tolerated: &'static [Kind],
    /// A minimal deterministic case: sends what it needs through the fuzzer (whose epoch it
    /// may configure) and returns the frame that must still fail the expected way.
    pub reproduce: fn(&mut Fuzzer) -> Reproduction,
}

/// The frame of a [`KnownBug`] case and exactly the violations it must show while the bug lives.
#[derive(Debug)]
pub struct Reproduction {
    pub direction: Direction,
    pub frame: Vec<u8>,
    pub shows: &'static [Kind],
}

/// What a [`KnownBug`] predicate may look at.
#[derive(Debug)]
pub struct Probe<'a> {
    pub direction: Direction,
    pub frame: &'a [u8],
    pub model: &'a Model,
    pub uplink: Option<[u8; 4]>,
}

/// How the datapath is configured during an epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub ranges: Vec<PortRange>,
    pub random_fully: bool,
    /// Whether the test device is an uplink; when it is not, nothing may be translated.
    pub uplink: bool,
    /// Whether the uplink translates IPv6 too (to [`v6::NODE_V6`]); IPv6 frames are then
    /// generated and checked by [`v6`].
    pub ipv6: bool,
}

impl Config {
    /// The harness default: ports 1024-29999 chosen at random.
    pub fn default_ports() -> Self {
        Self {
            ranges: vec![PortRange::new(1024, 29_999)],
            random_fully: true,
            uplink: true,
            ipv6: false,
        }
    }

    /// The configuration of epoch `epoch`: the run cycles through all of them, so every one is
    /// met within [`CONFIGS`] epochs.
    fn of_epoch(epoch: u64, rng: &mut Rng) -> Self {
        let (ranges, random_fully) = match epoch % CONFIGS {
            0 => (vec![PortRange::new(1024, 29_999)], true),
            // Four ports: new flows to one remote endpoint soon find none free.
            1 => (vec![PortRange::new(20_000, 20_003)], rng.chance(50)),
            2 => (vec![PortRange::new(1024, 29_999)], false),
            3 => (
                vec![
                    PortRange::new(20_000, 20_001),
                    PortRange::new(25_000, 25_001),
                ],
                rng.chance(50),
            ),
            _ => {
                return Self {
                    uplink: false,
                    ..Self::default_ports()
                };
            }
        };
        Self {
            ranges,
            random_fully,
            uplink: true,
            // Most uplink epochs translate IPv6 as well; the others check that IPv6 is left
            // alone where it is not translated.
            ipv6: rng.chance(70),
        }
    }
}

/// How many epoch configurations [`Config::of_epoch`] cycles through.
pub const CONFIGS: u64 = 5;
/// The longest epoch, in frames.
pub const MAX_EPOCH: u64 = 1000;

/// What happened to one frame.
#[derive(Debug)]
pub struct Sent {
    pub code: i32,
    pub output: Vec<u8>,
    pub counter: Option<Counter>,
    pub violations: Vec<Violation>,
    /// The known bugs whose classes the frame belongs to and which tolerate its violations,
    /// when between them they tolerate all of them; empty otherwise.
    pub excused_by: Vec<&'static str>,
}

/// Totals of a run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Frames the programs ran on.
    pub frames: u64,
    /// Frames `BPF_PROG_TEST_RUN` refused before running the program (too short for their
    /// ethertype on this kernel).
    pub refused: u64,
    pub drops: u64,
    /// Passed frames that came back different.
    pub translated: u64,
    pub epochs: u64,
    /// Frames of each known bug's class that showed its violations.
    pub excused: Vec<(&'static str, u64)>,
    /// How often each outcome was counted.
    pub outcomes: Vec<(Counter, u64)>,
    /// How often each outcome was counted for IPv6 frames by an uplink translating IPv6 (also
    /// in `outcomes`).
    pub ipv6_outcomes: Vec<(Counter, u64)>,
    /// Sum of the `*_drop_*` counters, read from the datapath at the end.
    pub drop_counters: u64,
    /// Sum of every outcome counter, read from the datapath at the end.
    pub outcome_counters: u64,
}

/// Frames remembered for failure reports.
const HISTORY: usize = 12;

/// A class of unexcused violations met in survey mode: its signature, how often, and the full
/// report of its first frame.
#[derive(Debug)]
pub struct Finding {
    pub signature: String,
    pub count: u64,
    pub first: String,
}

/// Drives frames through one loaded datapath and checks every result.
#[derive(Debug)]
pub struct Fuzzer {
    pub harness: Harness,
    pub rng: Rng,
    pub seed: u64,
    pub model: Model,
    pub config: Config,
    pub stats: Stats,
    known: &'static [KnownBug],
    generator: Generator,
    generator6: v6::Generator6,
    history: VecDeque<String>,
    started: Instant,
    /// In survey mode, violations are collected by signature instead of failing at once.
    survey: Option<Vec<Finding>>,
}

impl Fuzzer {
    /// A datapath with the harness's non-masquerade CIDRs and a NAT table large enough never to
    /// evict within an epoch (eviction would make the model's view of the mappings stale).
    pub fn new(seed: u64, known: &'static [KnownBug]) -> Self {
        require_root();
        let options = LoadOptions {
            nat_max_entries: 65_536,
            // IPv6 maps of full size: most epochs translate IPv6 too.
            ipv6: true,
            ..LoadOptions::default()
        };
        let datapath = Datapath::load(&options)
            .unwrap_or_else(|error| panic!("loading the datapath: {error}"));
        let mut harness = Harness { datapath };
        for cidr in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"] {
            harness.add_nomasq(cidr, NOMASQ_KIND_CIDR);
        }
        harness.add_nomasq("169.254.0.0/16", NOMASQ_KIND_LINK_LOCAL);
        harness.add_nomasq_v6(v6::EXEMPT_V6_CIDR, NOMASQ_KIND_CIDR);
        harness.add_nomasq_v6("fe80::/10", NOMASQ_KIND_LINK_LOCAL);
        let mut fuzzer = Self {
            harness,
            rng: Rng::new(seed),
            seed,
            model: Model::default(),
            config: Config::default_ports(),
            stats: Stats::default(),
            known,
            generator: Generator::new(node_ip()),
            generator6: v6::Generator6::default(),
            history: VecDeque::new(),
            started: Instant::now(),
            survey: None,
        };
        fuzzer.start_epoch(Config::default_ports());
        fuzzer
    }

    /// Empties the NAT and fragment tables, forgets the model, and applies `config`.
    pub fn start_epoch(&mut self, config: Config) {
        let maps = &mut self.harness.datapath.maps;
        let keys: Vec<_> = maps.nat_v4.keys().filter_map(Result::ok).collect();
        for key in keys {
            maps.nat_v4
                .remove(&key)
                .unwrap_or_else(|error| panic!("emptying the NAT table: {error}"));
        }
        let keys: Vec<_> = maps.frags_v4.keys().filter_map(Result::ok).collect();
        for key in keys {
            maps.frags_v4
                .remove(&key)
                .unwrap_or_else(|error| panic!("emptying the fragment table: {error}"));
        }
        let keys: Vec<_> = maps.nat_v6.keys().filter_map(Result::ok).collect();
        for key in keys {
            maps.nat_v6
                .remove(&key)
                .unwrap_or_else(|error| panic!("emptying the IPv6 NAT table: {error}"));
        }
        self.harness.configure(&config.ranges, config.random_fully);
        if !config.uplink {
            self.harness.set_uplink(None);
        } else if config.ipv6 {
            self.harness.set_uplink_v6(Some(v6::NODE_V6));
        }
        let reached = self.model.v6.reached;
        self.model = Model::default();
        self.model.v6.reached = reached;
        self.generator.clear();
        self.generator6.clear();
        self.config = config;
        self.stats.epochs += 1;
    }

    /// Runs `frames` generated frames, in epochs of random length and configuration.
    pub fn run(&mut self, frames: u64) {
        let mut left_in_epoch = 0;
        let mut epoch = 0;
        for _ in 0..frames {
            if left_in_epoch == 0 {
                let config = Config::of_epoch(epoch, &mut self.rng);
                epoch += 1;
                left_in_epoch = self.rng.between(100, MAX_EPOCH as usize);
                self.start_epoch(config);
            }
            left_in_epoch -= 1;
            let (direction, frame) = if self.config.ipv6 && self.rng.chance(25) {
                self.generator6.frame(&mut self.rng, &self.model.v6)
            } else {
                self.generator.next(&mut self.rng, &self.model)
            };
            self.send(direction, &frame);
        }
    }

    fn uplink(&self) -> Option<[u8; 4]> {
        self.config.uplink.then(|| node_ip().octets())
    }

    fn uplink_v6(&self) -> Option<[u8; 16]> {
        (self.config.uplink && self.config.ipv6).then(|| v6::NODE_V6.octets())
    }

    /// Every outcome counter, both families' counts together (IPv6 frames count in the IPv6
    /// programs' counters).
    fn counters(&self) -> Vec<u64> {
        Counter::ALL
            .iter()
            .map(|counter| self.harness.counter(*counter) + self.harness.counter_v6(*counter))
            .collect()
    }

    fn test_run(&self, direction: Direction, frame: &[u8]) -> Result<(i32, Vec<u8>), String> {
        let datapath = &self.harness.datapath;
        let program = match direction {
            Direction::Egress => datapath.egress(),
            Direction::Ingress => datapath.ingress(),
        }
        .map_err(|error| error.to_string())?;
        let mut out = vec![0u8; frame.len() + 256];
        let options = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ..TestRunOptions::default()
        };
        let result = program
            .test_run(options)
            .map_err(|error| format!("BPF_PROG_TEST_RUN: {error:?}"))?;
        out.truncate(result.data_size_out as usize);
        Ok((result.return_value as i32, out))
    }

    /// Runs one frame and checks it, without failing: what the known-bug cases need.
    pub fn run_frame(&mut self, direction: Direction, frame: &[u8]) -> Sent {
        let before = self.counters();
        let run = self.test_run(direction, frame);
        let after = self.counters();
        let (code, output) = match run {
            Ok(run) => run,
            Err(_) if wire::test_run_may_refuse(frame) => {
                assert_eq!(
                    before,
                    after,
                    "{}",
                    self.report(direction, frame, None, "counters moved for a refused frame")
                );
                self.stats.refused += 1;
                return Sent {
                    code: oracle::REFUSED,
                    output: frame.to_vec(),
                    counter: None,
                    violations: Vec::new(),
                    excused_by: Vec::new(),
                };
            }
            Err(error) => panic!("{}", self.report(direction, frame, None, &error)),
        };
        let moved: Vec<(Counter, u64)> = Counter::ALL
            .iter()
            .zip(before.iter().zip(&after))
            .filter(|(_, (before, after))| before != after)
            .map(|(counter, (before, after))| (*counter, after.wrapping_sub(*before)))
            .collect();
        let observation = Observation {
            direction,
            input: frame,
            code,
            output: &output,
            moved: &moved,
            uplink: self.uplink(),
            uplink_v6: self.uplink_v6(),
            ranges: &self.config.ranges,
        };
        let (counter, violations) = oracle::check(&observation, &self.model);
        let probe = Probe {
            direction,
            frame,
            model: &self.model,
            uplink: self.uplink(),
        };
        let matching: Vec<&KnownBug> = if violations.is_empty() {
            Vec::new()
        } else {
            self.known
                .iter()
                .filter(|bug| (bug.matches)(&probe))
                .collect()
        };
        let excused = violations.iter().all(|violation| {
            matching
                .iter()
                .any(|bug| bug.tolerated.contains(&violation.kind))
        });
        let excused_by: Vec<&'static str> = if excused {
            matching
                .iter()
                .filter(|bug| {
                    violations
                        .iter()
                        .any(|violation| bug.tolerated.contains(&violation.kind))
                })
                .map(|bug| bug.name)
                .collect()
        } else {
            Vec::new()
        };
        let dropped = code == oracle::DROP;
        self.model.learn(
            direction,
            frame,
            (!dropped).then_some(output.as_slice()),
            counter,
        );
        // The packet was translated on its flow, which it then ended (a RST while no answer
        // had come).
        if moved
            .iter()
            .any(|(counter, _)| *counter == Counter::TcpRefused)
        {
            self.model.forget_refused(direction, frame);
        }
        let ipv6 = self.uplink_v6().is_some() && wire::is_ipv6_frame(frame);
        self.account(
            dropped,
            frame != output.as_slice(),
            counter,
            ipv6,
            &excused_by,
        );
        let sent = Sent {
            code,
            output,
            counter,
            violations,
            excused_by,
        };
        self.remember(direction, frame, &sent);
        sent
    }

    /// Collects unexcused violations by class instead of failing at the first: for triage,
    /// when a datapath change makes several classes appear at once. See [`Self::findings`].
    pub fn survey(&mut self) {
        self.survey = Some(Vec::new());
    }

    /// The classes of unexcused violations met in survey mode.
    pub fn findings(&self) -> &[Finding] {
        self.survey.as_deref().unwrap_or(&[])
    }

    /// Runs one frame and fails the test on any violation not excused by a known bug (in
    /// survey mode, records it).
    pub fn send(&mut self, direction: Direction, frame: &[u8]) -> Sent {
        let sent = self.run_frame(direction, frame);
        if !sent.violations.is_empty() && sent.excused_by.is_empty() {
            let lines: Vec<String> = sent
                .violations
                .iter()
                .map(|violation| format!("  - {:?}: {}", violation.kind, violation.detail))
                .collect();
            let what = format!("{}\n  output: {}", lines.join("\n"), hex(&sent.output));
            // The failing frame is the last one in the history; report the ones before it.
            let last = self.history.pop_back();
            let report = self.report(direction, frame, Some(&sent), &what);
            let Some(findings) = &mut self.survey else {
                panic!("{report}");
            };
            self.history.extend(last);
            let mut kinds: Vec<String> = sent
                .violations
                .iter()
                .map(|violation| format!("{:?}", violation.kind))
                .collect();
            kinds.sort();
            kinds.dedup();
            let protocol = wire::Ip::of_frame(frame).map(|ip| ip.protocol);
            let signature = format!(
                "{direction:?} protocol {protocol:?} {}: {}",
                sent.counter.map_or("?", Counter::name),
                kinds.join(" ")
            );
            match findings
                .iter_mut()
                .find(|finding| finding.signature == signature)
            {
                Some(finding) => finding.count += 1,
                None => findings.push(Finding {
                    signature,
                    count: 1,
                    first: report,
                }),
            }
        }
        sent
    }

    fn account(
        &mut self,
        dropped: bool,
        changed: bool,
        counter: Option<Counter>,
        ipv6: bool,
        excused_by: &[&'static str],
    ) {
        let stats = &mut self.stats;
        stats.frames += 1;
        stats.drops += u64::from(dropped);
        stats.translated += u64::from(!dropped && changed);
        if let Some(counter) = counter {
            let tallies = [
                Some(&mut stats.outcomes),
                ipv6.then_some(&mut stats.ipv6_outcomes),
            ];
            for outcomes in tallies.into_iter().flatten() {
                match outcomes.iter_mut().find(|(known, _)| *known == counter) {
                    Some((_, count)) => *count += 1,
                    None => outcomes.push((counter, 1)),
                }
            }
        }
        for &name in excused_by {
            match stats.excused.iter_mut().find(|(known, _)| *known == name) {
                Some((_, count)) => *count += 1,
                None => stats.excused.push((name, 1)),
            }
        }
    }

    fn remember(&mut self, direction: Direction, frame: &[u8], sent: &Sent) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(format!(
            "{direction:?} {} -> {} {}",
            hex(frame),
            sent.code,
            sent.counter.map_or("?", Counter::name)
        ));
    }

    fn report(
        &self,
        direction: Direction,
        frame: &[u8],
        sent: Option<&Sent>,
        what: &str,
    ) -> String {
        let outcome = sent.map_or_else(String::new, |sent| {
            format!(
                " -> return code {}, counted as {}",
                sent.code,
                sent.counter.map_or("?", Counter::name)
            )
        });
        // Refused frames were generated too: the replay count includes them.
        let sent = self.stats.frames + self.stats.refused;
        format!(
            "datapath fuzzer: frame #{sent} ({direction:?}){outcome}\n{what}\n  input:  {}\n  \
             seed {:#x} (replay: MASQ_FUZZ_SEED={:#x} MASQ_FUZZ_FRAMES={sent} cargo test -p \
             masq-testbed --test datapath fuzz::), epoch {} with {:?}, uplink {}\n  frames \
             before it, oldest first:\n    {}",
            hex(frame),
            self.seed,
            self.seed,
            self.stats.epochs,
            self.config,
            Ipv4Addr::from(self.uplink().unwrap_or_default()),
            self.history
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n    ")
        )
    }

    /// Cross-checks the counters the datapath kept over the whole run with the verdicts seen:
    /// the drop counters add up to the drops, the outcome counters to the frames.
    pub fn finish(&mut self) {
        let totals: Vec<(Counter, u64)> = Counter::ALL
            .iter()
            .zip(self.counters())
            .map(|(counter, total)| (*counter, total))
            .collect();
        let sum = |wanted: &dyn Fn(Counter) -> bool| -> u64 {
            totals
                .iter()
                .filter(|(counter, _)| wanted(*counter))
                .map(|(_, value)| value)
                .sum()
        };
        self.stats.drop_counters = sum(&|counter| oracle::DROPS.contains(&counter));
        self.stats.outcome_counters = sum(&|counter| !oracle::EVENTS.contains(&counter));
        assert_eq!(
            (self.stats.drop_counters, self.stats.outcome_counters),
            (self.stats.drops, self.stats.frames),
            "(drop counters, outcome counters) against (drop verdicts, frames) (seed {:#x})",
            self.seed
        );
    }

    /// Frames per second since the datapath was loaded, checks and counter reads included.
    pub fn rate(&self) -> f64 {
        self.stats.frames as f64 / self.started.elapsed().as_secs_f64().max(1e-9)
    }
}
