//! Is the established path flat from 3 to many CIDRs? The production datapath loaded twice,
//! once with the default 3 CIDRs and once with many, and timed against itself in alternating
//! rounds of `BPF_PROG_TEST_RUN`.
//!
//! Timed one after the other, two datapaths differ by the machine's drift as much as by
//! themselves: an earlier run had 3 CIDRs slower than 100,000, which no CIDR cost explains.
//! Here every round times both once, starting with a different one each round, and each one's
//! median over the rounds is taken.

use std::{net::Ipv4Addr, sync::Barrier};

use anyhow::{Result, anyhow, bail};
use aya::programs::SchedClassifier;
use masq_common::layout::NOMASQ_KIND_CIDR;
use masq_testbed::harness::Harness;

use crate::{
    config::cidr,
    frames::{Frame, SINK, udp},
    paths::{Cores, pin, trie_capacity},
    progtime::{link, median, mirror_mappings, run},
    udp::on_core,
};

/// Sizes of the comparison.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlatnessSettings {
    /// NAT table entries of both datapaths.
    pub(crate) nat_entries: u32,
    /// CIDRs of the large trie.
    pub(crate) many_cidrs: usize,
    /// Rounds; each times both datapaths once.
    pub(crate) rounds: usize,
    /// Repetitions of a frame the kernel averages over, per round.
    pub(crate) repeat: u32,
}

/// One datapath's times, in nanoseconds (medians over the rounds).
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
    /// Every round's established time, for the spread.
    pub(crate) established_rounds: Vec<f64>,
}

/// The comparison's result.
#[derive(Clone, Debug, Default)]
pub(crate) struct Flatness {
    /// The datapath with the default 3 CIDRs, then with many (empty when not measured).
    pub(crate) times: Vec<ContenderTimes>,
    /// CIDRs of the large trie.
    pub(crate) many_cidrs: usize,
}

/// One datapath under comparison and the frames it is timed with.
struct Contender {
    label: String,
    harness: Harness,
    /// An established flow for each core.
    flows: [Frame; 2],
}

impl Contender {
    fn new(label: String, mut harness: Harness) -> Result<Self> {
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
    settings: &FlatnessSettings,
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
    settings: &FlatnessSettings,
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

/// The production datapath with 3 CIDRs against the same with `many_cidrs`, on one pinned
/// core: a single-core measurement must not move between cores.
pub(crate) fn measure(settings: &FlatnessSettings, cores: Cores) -> Result<Flatness> {
    on_core(cores.path, || measure_here(settings, cores))
}

fn measure_here(settings: &FlatnessSettings, cores: Cores) -> Result<Flatness> {
    let capacity = trie_capacity(settings.many_cidrs);
    let few = Harness::sized(settings.nat_entries, capacity);
    let mut many = Harness::sized(settings.nat_entries, capacity);
    for index in 3..settings.many_cidrs {
        many.add_nomasq(&cidr(index), NOMASQ_KIND_CIDR);
    }
    let contenders = [
        Contender::new("3 CIDRs".to_owned(), few)?,
        Contender::new(format!("{} CIDRs", settings.many_cidrs), many)?,
    ];
    let established = repeated(&contenders, settings, |contender| {
        contender.flows[0].to_vec()
    })?;
    let exempt_frame = udp(&link(), Ipv4Addr::new(10, 1, 2, 3).into(), 2);
    let exempt = repeated(&contenders, settings, |_| exempt_frame.to_vec())?;
    let both = both_cores(&contenders, settings, cores)?;
    let times = contenders
        .iter()
        .zip(established)
        .zip(exempt)
        .zip(both)
        .map(
            |(((contender, (established, rounds)), (exempt, _)), both)| ContenderTimes {
                label: contender.label.clone(),
                established,
                established_both_cores: both,
                exempt,
                established_rounds: rounds,
            },
        )
        .collect();
    Ok(Flatness {
        times,
        many_cidrs: settings.many_cidrs,
    })
}
