//! The datapath programs' own time per packet, from the kernel's `BPF_PROG_TEST_RUN` timing:
//! what masq costs without the stack around it.

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result};
use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use masq_common::counters::Counter;
use masq_testbed::harness::{Harness, NODE_IP};

use crate::{
    frames::{Link, SINK, ports, udp},
    paths::{cidr, trie_capacity},
    tx::Frame,
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

fn link() -> Link {
    Link {
        source: [2, 0, 0, 0, 0, 1],
        gateway: [2, 0, 0, 0, 0, 2],
        pod: POD,
    }
}

/// Kernel nanoseconds per run of `program` on `frame`, averaged over `repeat` runs.
fn run(program: &SchedClassifier, frame: &[u8], repeat: u32) -> Result<f64> {
    let mut out = vec![0u8; frame.len() + 256];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok(result.duration.as_secs_f64() * 1e9)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median single-run time of `program` over `frames`, each run once.
fn single_runs(program: &SchedClassifier, frames: &[Frame]) -> Result<f64> {
    let times: Result<Vec<f64>> = frames.iter().map(|frame| run(program, frame, 1)).collect();
    Ok(median(times?))
}

/// Every path, with the default 3 CIDRs and with `many_cidrs`, the NAT table filled for the
/// new-flow paths.
pub(crate) fn measure(settings: &ProgramSettings) -> Result<Vec<ProgramTime>> {
    let mut harness = Harness::sized(settings.nat_entries, trie_capacity(settings.many_cidrs));
    let link = link();
    let established = udp(&link, SINK, 0);
    let egress = harness.datapath.egress()?;
    run(egress, &established, 1)?;
    let translated = harness
        .egress_mappings()
        .first()
        .map(|(_, entry)| entry.port)
        .context("the first packet made no mapping")?;
    let (source_port, destination_port) = ports(0);
    let reply = masq_testbed::pktgen::Packet::udp(
        &format!("{SINK}:{destination_port}"),
        &format!("{NODE_IP}:{translated}"),
    )
    .payload(b"masq bench reply!!")
    .frame();
    let _ = source_port;
    let exempt = udp(&link, Ipv4Addr::new(10, 1, 2, 3), 1);
    let non_ip = masq_testbed::pktgen::ipv6_frame();
    let flows = u64::from(settings.nat_entries / 2);
    let new_flow_frames = |from: u64| -> Vec<Frame> {
        (from..from + settings.single_runs as u64)
            .map(|id| udp(&link, SINK, id))
            .collect()
    };

    let repeat = settings.repeat;
    let mut few = Vec::new();
    let egress = harness.datapath.egress()?;
    let ingress = harness.datapath.ingress()?;
    few.push(run(egress, &established, repeat)?);
    few.push(run(egress, &established, 1).and_then(|_| single_runs(egress, &[established; 64]))?);
    few.push(run(ingress, &reply, repeat)?);
    few.push(run(egress, &exempt, repeat)?);
    few.push(run(egress, &non_ip, repeat)?);
    // Fill the table to all but the flows measured next, with real new flows.
    let room = 2 * settings.single_runs as u64 + 1;
    let fill: Vec<Frame> = (1_000_000..1_000_000 + flows.saturating_sub(room))
        .map(|id| udp(&link, SINK, id))
        .collect();
    for frame in &fill {
        run(egress, frame, 1)?;
    }
    few.push(single_runs(egress, &new_flow_frames(10_000_000))?);

    for index in 3..settings.many_cidrs {
        let text = cidr(index);
        harness.add_nomasq(&text, masq_common::layout::NOMASQ_KIND_CIDR);
    }
    let egress = harness.datapath.egress()?;
    let ingress = harness.datapath.ingress()?;
    let mut many = vec![
        run(egress, &established, repeat)?,
        single_runs(egress, &[established; 64])?,
        run(ingress, &reply, repeat)?,
        run(egress, &exempt, repeat)?,
        run(egress, &non_ip, repeat)?,
        single_runs(egress, &new_flow_frames(20_000_000))?,
    ];
    // Now fill it up: a new flow is refused.
    let refused_before = harness.counter(Counter::EgressDropTableFull);
    let mut id = 30_000_000;
    while harness.counter(Counter::EgressDropTableFull) == refused_before {
        run(egress, &udp(&link, SINK, id), 1)?;
        id += 1;
    }
    let full = udp(&link, SINK, id);
    many.push(run(egress, &full, repeat)?);
    // The same with few CIDRs: take the large list out again.
    for index in 3..settings.many_cidrs {
        harness.remove_nomasq(&cidr(index));
    }
    let egress = harness.datapath.egress()?;
    few.push(run(egress, &full, repeat)?);

    let paths = [
        "egress, established flow (lookup, rewrite)",
        "egress, established flow, single runs (timer overhead included)",
        "ingress, reply of a flow (lookup, rewrite)",
        "egress, exempt destination (lookup miss, trie)",
        "egress, not IPv4 (parse, pass)",
        "egress, new flow into a nearly full table, single runs (timer overhead included)",
        "egress, new flow refused by a full table",
    ];
    Ok(paths
        .into_iter()
        .zip(few.into_iter().zip(many))
        .map(|(path, (few, many))| ProgramTime { path, few, many })
        .collect())
}
