//! The datapath programs' own time per packet, from the kernel's `BPF_PROG_TEST_RUN` timing:
//! what masq costs without the stack around it.

use std::{
    net::Ipv4Addr,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use masq_common::{
    counters::Counter,
    nat::{Address, Direction, NatEntry, NatKey},
};
use masq_testbed::{
    harness::{Harness, NODE_IP},
    pktgen6::Packet6,
};

use crate::{
    config::cidr,
    frames::{Frame, Link, SINK, ports, udp},
    paths::trie_capacity,
    profile::{self, Profile},
};

/// One path's time in nanoseconds, with few and with many CIDRs in the trie.
#[derive(Clone, Debug)]
pub(crate) struct ProgramTime {
    pub(crate) path: &'static str,
    pub(crate) few: f64,
    pub(crate) many: f64,
}

/// Sizes of the measurement.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ProgramSettings {
    /// NAT table entries (two per flow).
    pub(crate) nat_entries: u32,
    /// CIDRs of the large trie.
    pub(crate) many_cidrs: usize,
    /// Repetitions of a frame the kernel averages over.
    pub(crate) repeat: u32,
    /// Single runs whose median is taken where a frame cannot be repeated (a new flow exists
    /// after its first run).
    pub(crate) single_runs: usize,
}

const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);

pub(crate) fn link() -> Link {
    Link {
        source: [2, 0, 0, 0, 0, 1],
        gateway: [2, 0, 0, 0, 0, 2],
        pod: POD.into(),
    }
}

/// The frames of new flows `start..start + count` from the pod to the sink.
pub(crate) fn new_flow_frames(start: u64, count: u64) -> Vec<Frame> {
    let link = link();
    (start..start + count)
        .map(|id| udp(&link, SINK.into(), id))
        .collect()
}

/// Kernel nanoseconds per run of `program` on `frame`, averaged over `repeat` runs.
pub(crate) fn run(program: &SchedClassifier, frame: &[u8], repeat: u32) -> Result<f64> {
    run_output(program, frame, repeat).map(|(time, _)| time)
}

/// [`run`], with the frame as the program left it.
pub(crate) fn run_output(
    program: &SchedClassifier,
    frame: &[u8],
    repeat: u32,
) -> Result<(f64, Vec<u8>)> {
    let mut out = vec![0u8; frame.len() + 256];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    out.truncate(usize::try_from(result.data_size_out).unwrap_or(out.len()));
    Ok((result.duration.as_secs_f64() * 1e9, out))
}

pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median single-run time of `program` over `frames`, each run once.
fn single_runs<F: AsRef<[u8]>>(program: &SchedClassifier, frames: &[F]) -> Result<f64> {
    let times: Result<Vec<f64>> = frames
        .iter()
        .map(|frame| run(program, frame.as_ref(), 1))
        .collect();
    Ok(median(times?))
}

/// The rows the report reasons about, by their path text.
pub(crate) const ESTABLISHED_REPEATED: &str =
    "egress, established flow, repeated (lookup, rewrite; warm caches)";
pub(crate) const EXEMPT: &str = "egress, exempt destination (lookup miss, trie)";
pub(crate) const NOT_IPV4: &str = "egress, not IP (parse, pass)";
pub(crate) const NEW_FLOW: &str = "egress, new flow into a nearly full table";
pub(crate) const ESTABLISHED_V6_REPEATED: &str =
    "egress, IPv6 established flow, repeated (tail call, lookup, rewrite)";

/// One row of the table: which field of [`Times`] it shows.
type Field = fn(&Times) -> f64;

/// The paths' times at one trie size.
struct Times {
    established: f64,
    established_repeated: f64,
    established_v6_repeated: f64,
    exempt_v6: f64,
    reply: f64,
    exempt: f64,
    non_ip: f64,
    /// The exempt destination with `nonMasqueradeSrcCIDRs` in use (its trie looked up first).
    exempt_with_sources: f64,
    /// A pod whose source is in `nonMasqueradeSrcCIDRs`.
    exempt_source: f64,
    new_flow: f64,
    /// A new flow into a full table, admitted by evicting an unanswered flow.
    evicting: f64,
    overhead: f64,
}

/// The mirror image of an egress mapping: its translated tuple, as an egress key, maps back to
/// the original. A repeated established frame then alternates between the two (each run
/// translates what the previous one wrote), so the kernel can average the established path
/// over many runs with warm caches, as a busy flow sees it.
fn mirrored<A: Address>(key: &NatKey<A>, entry: &NatEntry<A>) -> (NatKey<A>, NatEntry<A>) {
    let key_back = NatKey::new(
        entry.addr,
        key.dst_addr,
        entry.port,
        key.dst_port,
        key.protocol,
        Direction::Egress,
    );
    let entry_back = NatEntry {
        addr: key.src_addr,
        port: key.src_port,
        ..*entry
    };
    (key_back, entry_back)
}

/// Adds the mirror image of every IPv4 egress mapping in the table (see [`mirrored`]).
pub(crate) fn mirror_mappings(harness: &mut Harness) -> Result<()> {
    let mappings = harness.egress_mappings();
    if mappings.is_empty() {
        bail!("no mapping to mirror");
    }
    for (key, entry) in mappings {
        let (key, entry) = mirrored(&key, &entry);
        harness
            .datapath
            .maps
            .nat_v4
            .insert(key, entry, 0)
            .context("inserting the mirrored mapping")?;
    }
    Ok(())
}

/// The IPv6 addresses of the IPv6 rows (documentation ranges).
const NODE_V6: &str = "2001:db8:1::1";
const POD_V6: &str = "2001:db8:ab::5";
const REMOTE_V6: &str = "2001:db8:ff::1";

/// [`mirror_mappings`] for the IPv6 table's one egress mapping.
fn mirror_mapping_v6(harness: &mut Harness) -> Result<()> {
    let (key, entry) = harness
        .nat_v6()
        .into_iter()
        .find(|(key, _)| key.direction() == Some(Direction::Egress))
        .context("no IPv6 mapping to mirror")?;
    let (key, entry) = mirrored(&key, &entry);
    harness
        .datapath
        .maps
        .nat_v6
        .insert(key, entry, 0)
        .context("inserting the mirrored IPv6 mapping")
}

/// Every path, with the default 3 CIDRs and with `many_cidrs`, the NAT table filled for the
/// new-flow paths.
///
/// The kernel runs a repeated frame on the same buffer, so a program that rewrites the frame
/// sees its own output from the second run on: the established and reply paths (which rewrite)
/// and new flows (which exist after one run) are timed in single runs with a fresh copy each,
/// less the cost of timing a single run, measured as the difference between single and
/// repeated runs of a frame the programs leave alone (not IPv4).
///
/// Then, for `profile_for`, a thread runs the established frame over and over under `perf`:
/// where the established path's time goes, the program's own instructions or the kernel
/// functions it calls.
pub(crate) fn measure(
    settings: &ProgramSettings,
    profile_for: Duration,
) -> Result<(Vec<ProgramTime>, Profile)> {
    let mut harness = Harness::sized(settings.nat_entries, trie_capacity(settings.many_cidrs));
    let link = link();
    let established = udp(&link, SINK.into(), 0);
    run(harness.datapath.egress()?, &established, 1)?;
    let translated = harness
        .egress_mappings()
        .first()
        .map(|(_, entry)| entry.port)
        .context("the first packet made no mapping")?;
    let (_, remote_port) = ports(0);
    mirror_mappings(&mut harness)?;
    let reply = masq_testbed::pktgen::Packet::udp(
        &format!("{SINK}:{remote_port}"),
        &format!("{NODE_IP}:{translated}"),
    )
    .payload(b"masq bench reply!!")
    .frame();
    let exempt = udp(&link, Ipv4Addr::new(10, 1, 2, 3).into(), 1);
    // masq's own keys: a source range the pod above is outside of, and a pod inside it.
    harness.add_nomasq_src("100.64.0.0/16");
    let exempt_pod = Link {
        pod: Ipv4Addr::new(100, 64, 0, 5).into(),
        ..link
    };
    let from_exempt_source = udp(&exempt_pod, SINK.into(), 2);
    // The flag on only for the rows that measure it: the others are the cost without the keys.
    let with_sources = |harness: &mut Harness, times: &mut Times| -> Result<()> {
        harness.set_source_exemptions(true);
        let egress = harness.datapath.egress()?;
        times.exempt_with_sources = run(egress, &exempt, settings.repeat)?;
        times.exempt_source = run(egress, &from_exempt_source, settings.repeat)?;
        harness.set_source_exemptions(false);
        Ok(())
    };
    let non_ip = masq_testbed::pktgen::arp_frame();
    // IPv6: the same established flow and exempt destination, in the IPv6 programs.
    harness.set_uplink_v6(Some(NODE_V6.parse()?));
    harness.add_nomasq_v6("2001:db8:ab::/48", masq_common::layout::NOMASQ_KIND_CIDR);
    let established_v6 = Packet6::udp(POD_V6, 5000, REMOTE_V6, 53).frame();
    run(harness.datapath.egress()?, &established_v6, 1)?;
    mirror_mapping_v6(&mut harness)?;
    let exempt_v6 = Packet6::udp(POD_V6, 5001, "2001:db8:ab::9", 53).frame();
    let singles = settings.single_runs;
    let repeat = settings.repeat;
    let mut next_id = 1_000_000u64;
    let mut fresh = |count: u64| -> Vec<Frame> {
        let frames = new_flow_frames(next_id, count);
        next_id += count;
        frames
    };
    let times = |harness: &Harness, new_flows: &[Frame]| -> Result<Times> {
        let egress = harness.datapath.egress()?;
        let ingress = harness.datapath.ingress()?;
        let non_ip_repeated = run(egress, &non_ip, repeat)?;
        let overhead = single_runs(egress, &vec![non_ip.clone(); singles])? - non_ip_repeated;
        Ok(Times {
            established: single_runs(egress, &vec![established; singles])? - overhead,
            established_repeated: run(egress, &established, repeat)?,
            established_v6_repeated: run(egress, &established_v6, repeat)?,
            exempt_v6: run(egress, &exempt_v6, repeat)?,
            reply: single_runs(ingress, &vec![reply.clone(); singles])? - overhead,
            exempt: run(egress, &exempt, repeat)?,
            non_ip: non_ip_repeated,
            exempt_with_sources: f64::NAN,
            exempt_source: f64::NAN,
            new_flow: single_runs(egress, new_flows)? - overhead,
            evicting: f64::NAN,
            overhead,
        })
    };

    // Fill the table with real new flows to all but the flows measured next.
    let flows = u64::from(settings.nat_entries / 2);
    let room = 2 * singles as u64 + 1;
    let egress = harness.datapath.egress()?;
    for frame in fresh(flows.saturating_sub(room)) {
        run(egress, &frame, 1)?;
    }
    let mut few = times(&harness, &fresh(singles as u64))?;
    with_sources(&mut harness, &mut few)?;
    for index in 3..settings.many_cidrs {
        harness.add_nomasq(&cidr(index), masq_common::layout::NOMASQ_KIND_CIDR);
    }
    let mut many = times(&harness, &fresh(singles as u64))?;
    with_sources(&mut harness, &mut many)?;
    // Now fill it up: from then on a new flow evicts one of the fill's flows, which were never
    // answered (as conntrack's early_drop would), to get its mapping.
    let egress = harness.datapath.egress()?;
    let full_count = |harness: &Harness| {
        harness.evicted(masq_common::flow::EvictionCause::TableFull)
            + harness.counter(Counter::EgressDropTableFull)
    };
    let full_before = full_count(&harness);
    while full_count(&harness) == full_before {
        let frame = fresh(1).first().copied().context("no frame")?;
        run(egress, &frame, 1)?;
    }
    many.evicting = single_runs(egress, &fresh(singles as u64))? - many.overhead;
    for index in 3..settings.many_cidrs {
        harness.remove_nomasq(&cidr(index));
    }
    few.evicting = single_runs(harness.datapath.egress()?, &fresh(singles as u64))? - few.overhead;

    let rows: [(&'static str, Field); 12] = [
        ("egress, established flow (lookup, rewrite)", |t| {
            t.established
        }),
        (ESTABLISHED_REPEATED, |t| t.established_repeated),
        ("ingress, reply of a flow (lookup, rewrite)", |t| t.reply),
        (EXEMPT, |t| t.exempt),
        (NOT_IPV4, |t| t.non_ip),
        (
            "egress, exempt destination, nonMasqueradeSrcCIDRs in use (source trie miss first)",
            |t| t.exempt_with_sources,
        ),
        (
            "egress, source in nonMasqueradeSrcCIDRs (source trie hit)",
            |t| t.exempt_source,
        ),
        (ESTABLISHED_V6_REPEATED, |t| t.established_v6_repeated),
        (
            "egress, IPv6 exempt destination (tail call, lookup miss, trie)",
            |t| t.exempt_v6,
        ),
        (NEW_FLOW, |t| t.new_flow),
        (
            "egress, new flow into a full table (evicts an unanswered flow)",
            |t| t.evicting,
        ),
        (
            "(timing one single run, subtracted from the single-run rows)",
            |t| t.overhead,
        ),
    ];
    let times = rows
        .into_iter()
        .map(|(path, value)| ProgramTime {
            path,
            few: value(&few),
            many: value(&many),
        })
        .collect();
    let profile = profile_repeated(harness.datapath.egress()?, &established, profile_for)?;
    Ok((times, profile))
}

/// `perf` samples of a thread that runs `program` on `frame` for `duration`, in batches the
/// kernel repeats.
fn profile_repeated(
    program: &SchedClassifier,
    frame: &[u8],
    duration: Duration,
) -> Result<Profile> {
    std::thread::scope(|scope| {
        let (thread_id, thread_started) = mpsc::channel();
        let (start, started) = mpsc::channel::<()>();
        let runner = scope.spawn(move || -> Result<()> {
            let _ = thread_id.send(nix::unistd::gettid().as_raw());
            // Dropped unsent if perf did not start: nothing to sample then.
            if started.recv().is_err() {
                return Ok(());
            }
            let began = Instant::now();
            while began.elapsed() < duration {
                run(program, frame, 10_000)?;
            }
            Ok(())
        });
        let thread = thread_started
            .recv()
            .context("the profiled thread did not start")?;
        profile::sample(profile::Sampled::Threads(&[thread]), move || {
            let _ = start.send(());
            runner
                .join()
                .map_err(|_| anyhow!("the profiled thread panicked"))?
        })
    })
}
