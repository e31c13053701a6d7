//! Datapaths that differ in one thing, timed against each other in alternating rounds of
//! `BPF_PROG_TEST_RUN`: the trie's size (is the established path flat from 3 to 100,000
//! CIDRs?) and the design choices of the NAT table and counters (what each alternative would
//! cost or save), each built as its own object (`cargo xtask build-ebpf-variants`).
//!
//! Timed one after the other, two datapaths differ by the machine's drift as much as by
//! themselves: an earlier run had 3 CIDRs slower than 100,000, which no CIDR cost explains.
//! Here every round times every contender once, starting with a different one each round, and
//! each contender's median over the rounds is taken.

use std::{net::Ipv4Addr, path::Path, sync::Barrier};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::programs::SchedClassifier;
use masq_common::layout::NOMASQ_KIND_CIDR;
use masq_testbed::harness::{Harness, NODE_IP};

use crate::{
    config::cidr,
    frames::{Frame, SINK, udp},
    paths::{Cores, pin, trie_capacity},
    progtime::{link, median, mirror_mappings, new_flow_frames, run, run_output},
    udp::on_core,
};

/// Sizes of the comparison.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SideBySideSettings {
    /// NAT table entries of every contender.
    pub(crate) nat_entries: u32,
    /// CIDRs of the large trie in the flatness comparison.
    pub(crate) many_cidrs: usize,
    /// Rounds; each times every contender once.
    pub(crate) rounds: usize,
    /// Repetitions of a frame the kernel averages over, per round.
    pub(crate) repeat: u32,
    /// New flows timed per contender (single runs, interleaved frame by frame).
    pub(crate) single_runs: usize,
}

/// One contender's times, in nanoseconds (medians over the rounds).
#[derive(Clone, Debug)]
pub(crate) struct ContenderTimes {
    pub(crate) label: String,
    /// An established packet, repeated (warm caches), on one core.
    pub(crate) established: f64,
    /// The same on both cores at once, one flow per core (as RSS spreads flows): what sharing
    /// a cache line between cores costs.
    pub(crate) established_both_cores: f64,
    /// A packet to an exempt destination (trie hit), repeated.
    pub(crate) exempt: f64,
    /// New flows into a table all but full (single runs, cold), when measured.
    pub(crate) new_flow: Option<f64>,
    /// New flows into a full table, and how many of them got a mapping (an LRU table evicts
    /// to admit them; the hash table refuses them).
    pub(crate) new_flow_full: Option<(f64, usize)>,
    /// Every round's established time, for the spread.
    pub(crate) established_rounds: Vec<f64>,
}

/// Both comparisons.
#[derive(Clone, Debug, Default)]
pub(crate) struct SideBySide {
    /// The production object with the default 3 CIDRs and with many.
    pub(crate) flatness: Vec<ContenderTimes>,
    /// The production object and each design alternative, 3 CIDRs, tables filled.
    pub(crate) designs: Vec<ContenderTimes>,
    /// New flows timed per contender in each of the two fills.
    pub(crate) new_flows_timed: usize,
    /// CIDRs of the large trie.
    pub(crate) many_cidrs: usize,
    /// NAT table entries of every contender.
    pub(crate) nat_entries: u32,
}

/// One datapath under comparison and the frames it is timed with.
struct Contender {
    label: String,
    harness: Harness,
    /// NAT entries one flow takes.
    entries_per_flow: u32,
    /// An established flow for each core.
    flows: [Frame; 2],
}

impl Contender {
    fn new(label: String, mut harness: Harness, entries_per_flow: u32) -> Result<Self> {
        let link = link();
        let flows = [udp(&link, SINK.into(), 0), udp(&link, SINK.into(), 1)];
        let egress = harness.datapath.egress()?;
        for flow in &flows {
            run(egress, flow, 1)?;
        }
        let mapped = harness.egress_mappings().len();
        if mapped != flows.len() {
            bail!(
                "{label}: {mapped} of the {} established flows got a mapping",
                flows.len()
            );
        }
        mirror_mappings(&mut harness)?;
        Ok(Self {
            label,
            harness,
            entries_per_flow,
            flows,
        })
    }

    fn egress(&self) -> Result<&SchedClassifier> {
        Ok(self.harness.datapath.egress()?)
    }
}

/// The contenders in a different order each round (rotated), so none is always first.
fn rotated(count: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..count).map(move |index| (index + round) % count)
}

/// Each contender's median time of `frame_of` repeated, over alternating rounds, with every
/// round's time.
fn repeated(
    contenders: &[Contender],
    settings: &SideBySideSettings,
    frame_of: impl Fn(&Contender) -> Vec<u8>,
) -> Result<Vec<(f64, Vec<f64>)>> {
    let mut rounds = vec![Vec::with_capacity(settings.rounds); contenders.len()];
    for round in 0..settings.rounds {
        for index in rotated(contenders.len(), round) {
            let contender = &contenders[index];
            rounds[index].push(run(
                contender.egress()?,
                &frame_of(contender),
                settings.repeat,
            )?);
        }
    }
    Ok(rounds
        .into_iter()
        .map(|times| (median(times.clone()), times))
        .collect())
}

/// Each contender's median time of an established packet with both cores running one flow
/// each at the same moment.
fn both_cores(
    contenders: &[Contender],
    settings: &SideBySideSettings,
    cores: Cores,
) -> Result<Vec<f64>> {
    let mut rounds = vec![Vec::with_capacity(settings.rounds); contenders.len()];
    for round in 0..settings.rounds {
        for index in rotated(contenders.len(), round) {
            let contender = &contenders[index];
            let egress = contender.egress()?;
            let start = Barrier::new(2);
            let times = std::thread::scope(|scope| -> Result<Vec<f64>> {
                let workers: Vec<_> = [cores.generator, cores.path]
                    .into_iter()
                    .zip(&contender.flows)
                    .map(|(core, flow)| {
                        let start = &start;
                        scope.spawn(move || -> Result<f64> {
                            pin(0, core)?;
                            start.wait();
                            run(egress, flow, settings.repeat)
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .map(|worker| {
                        worker
                            .join()
                            .map_err(|_| anyhow!("a timing thread panicked"))?
                    })
                    .collect()
            })?;
            rounds[index].push(times.iter().sum::<f64>() / times.len().max(1) as f64);
        }
    }
    Ok(rounds.into_iter().map(median).collect())
}

/// What timing one single run adds, for each contender: a frame the programs leave alone
/// (not IP) timed singly and repeated.
fn single_run_overheads(
    contenders: &[Contender],
    settings: &SideBySideSettings,
) -> Result<Vec<f64>> {
    let non_ip = masq_testbed::pktgen::arp_frame();
    let mut singles = vec![Vec::with_capacity(settings.single_runs); contenders.len()];
    for round in 0..settings.single_runs {
        for index in rotated(contenders.len(), round) {
            singles[index].push(run(contenders[index].egress()?, &non_ip, 1)?);
        }
    }
    let repeated = repeated(contenders, settings, |_| non_ip.clone())?;
    Ok(singles
        .into_iter()
        .zip(repeated)
        .map(|(singles, (repeated, _))| median(singles) - repeated)
        .collect())
}

/// Each contender's median single-run time over `frames` (every contender runs frame `i`
/// before any runs frame `i + 1`), and how many of the frames it translated.
fn new_flows(contenders: &[Contender], frames: &[Frame]) -> Result<Vec<(f64, usize)>> {
    let node: Ipv4Addr = NODE_IP.parse()?;
    let mut times = vec![Vec::with_capacity(frames.len()); contenders.len()];
    let mut admitted = vec![0; contenders.len()];
    for (round, frame) in frames.iter().enumerate() {
        for index in rotated(contenders.len(), round) {
            let (time, output) = run_output(contenders[index].egress()?, frame, 1)?;
            times[index].push(time);
            // IPv4 source address: 14 bytes of Ethernet, 12 into the IP header.
            if output.get(26..30) == Some(&node.octets()[..]) {
                admitted[index] += 1;
            }
        }
    }
    Ok(times.into_iter().map(median).zip(admitted).collect())
}

/// Times established and exempt packets of every contender, and with `fill`, new flows into
/// nearly full and then full tables.
fn compare(
    contenders: &[Contender],
    settings: &SideBySideSettings,
    cores: Cores,
    fill: bool,
) -> Result<Vec<ContenderTimes>> {
    let established = repeated(contenders, settings, |contender| {
        contender.flows[0].to_vec()
    })?;
    let exempt_frame = udp(&link(), Ipv4Addr::new(10, 1, 2, 3).into(), 2);
    let exempt = repeated(contenders, settings, |_| exempt_frame.to_vec())?;
    let both = both_cores(contenders, settings, cores)?;
    let (nearly_full, full) = if fill {
        let singles = settings.single_runs as u64;
        // Every contender gets the same flows, up to all but `room` flows of its capacity.
        let room = 2 * singles + 1;
        let first_id = 1_000_000;
        let mut largest_fill = 0;
        for contender in contenders {
            let fill =
                u64::from(settings.nat_entries / contender.entries_per_flow).saturating_sub(room);
            let egress = contender.egress()?;
            for frame in new_flow_frames(first_id, fill) {
                run(egress, &frame, 1)?;
            }
            largest_fill = largest_fill.max(fill);
        }
        let mut next = first_id + largest_fill;
        // Frames new to every table.
        let nearly_full = new_flows(contenders, &new_flow_frames(next, singles))?;
        next += singles;
        for (contender, (_, admitted)) in contenders.iter().zip(&nearly_full) {
            if *admitted != settings.single_runs {
                bail!(
                    "{}: only {admitted} of {singles} new flows got a mapping in a table that \
                     had room for them",
                    contender.label
                );
            }
        }
        // More than the room left: every table is full after these.
        let top_up = new_flow_frames(next, room);
        next += room;
        for contender in contenders {
            let egress = contender.egress()?;
            for frame in &top_up {
                run(egress, frame, 1)?;
            }
        }
        let full = new_flows(contenders, &new_flow_frames(next, singles))?;
        let overheads = single_run_overheads(contenders, settings)?;
        let less = |times: Vec<(f64, usize)>| -> Vec<(f64, usize)> {
            times
                .into_iter()
                .zip(&overheads)
                .map(|((time, admitted), overhead)| (time - overhead, admitted))
                .collect()
        };
        (
            less(nearly_full)
                .into_iter()
                .map(|(time, _)| Some(time))
                .collect(),
            less(full).into_iter().map(Some).collect(),
        )
    } else {
        (vec![None; contenders.len()], vec![None; contenders.len()])
    };
    Ok(contenders
        .iter()
        .zip(established)
        .zip(exempt)
        .zip(both)
        .zip(nearly_full.into_iter().zip(full))
        .map(
            |((((contender, (established, rounds)), (exempt, _)), both), (new_flow, full))| {
                ContenderTimes {
                    label: contender.label.clone(),
                    established,
                    established_both_cores: both,
                    exempt,
                    new_flow,
                    new_flow_full: full,
                    established_rounds: rounds,
                }
            },
        )
        .collect())
}

/// The production object with 3 CIDRs against the same with `many_cidrs`, on one pinned core
/// (see [`designs`]).
pub(crate) fn flatness(settings: &SideBySideSettings, cores: Cores) -> Result<Vec<ContenderTimes>> {
    on_core(cores.path, || flatness_here(settings, cores))
}

fn flatness_here(settings: &SideBySideSettings, cores: Cores) -> Result<Vec<ContenderTimes>> {
    let capacity = trie_capacity(settings.many_cidrs);
    let few = Harness::sized(settings.nat_entries, capacity);
    let mut many = Harness::sized(settings.nat_entries, capacity);
    for index in 3..settings.many_cidrs {
        many.add_nomasq(&cidr(index), NOMASQ_KIND_CIDR);
    }
    let contenders = [
        Contender::new("3 CIDRs".to_owned(), few, 2)?,
        Contender::new(format!("{} CIDRs", settings.many_cidrs), many, 2)?,
    ];
    compare(&contenders, settings, cores, false)
}

/// What the design alternative built with `feature` (one of
/// `masq_common::variants::VARIANTS`, or the control) changes, and the NAT entries a flow
/// takes in it.
fn design(feature: &str) -> Result<(&'static str, u32)> {
    Ok(match feature {
        masq_common::variants::CONTROL => (
            "production again, built as the alternatives are (A/A control: the measurement's \
             own noise)",
            2,
        ),
        "variant-shared-counters" => (
            "shared counters (one array, atomic adds) instead of per-CPU",
            2,
        ),
        "variant-touch-every-packet" => (
            "the entry refreshed on every packet (timestamp written, other half looked up) \
             instead of once a second",
            2,
        ),
        "variant-lru-table" => ("LRU tables (evict when full) instead of refusing", 2),
        "variant-lru-table-no-common" => {
            ("LRU tables with per-CPU lists (`BPF_F_NO_COMMON_LRU`)", 2)
        }
        "variant-one-entry-per-flow" => (
            "one entry a flow (no reverse entry: what it saves at most; replies dropped)",
            1,
        ),
        other => bail!("the bench does not know the datapath variant {other}"),
    })
}

/// The production object against each alternative built in `variants` (`<feature>.o`), on
/// one pinned core: a single-core measurement must not move between cores (the tables'
/// per-CPU free lists, and an LRU table's per-CPU lists, belong to the core an insert runs on).
pub(crate) fn designs(
    settings: &SideBySideSettings,
    cores: Cores,
    variants: &Path,
) -> Result<Vec<ContenderTimes>> {
    on_core(cores.path, || designs_here(settings, cores, variants))
}

fn designs_here(
    settings: &SideBySideSettings,
    cores: Cores,
    variants: &Path,
) -> Result<Vec<ContenderTimes>> {
    let capacity = trie_capacity(3);
    let mut contenders = vec![Contender::new(
        "production: per-CPU counters, touched once a second, hash tables, two entries a flow"
            .to_owned(),
        Harness::sized(settings.nat_entries, capacity),
        2,
    )?];
    let built = std::iter::once(masq_common::variants::CONTROL)
        .chain(masq_common::variants::VARIANTS.iter().copied());
    for feature in built {
        let (label, entries_per_flow) = design(feature)?;
        let path = variants.join(format!("{feature}.o"));
        let object = std::fs::read(&path).with_context(|| {
            format!(
                "reading {} (cargo xtask build-ebpf-variants builds it)",
                path.display()
            )
        })?;
        let harness = Harness::sized_from_object(&object, settings.nat_entries, capacity);
        contenders.push(Contender::new(label.to_owned(), harness, entries_per_flow)?);
    }
    compare(&contenders, settings, cores, true)
}
