//! BENCHMARKS.md and its plot, from one run's results.

use std::{fmt::Write as _, path::Path, time::Duration};

use anyhow::{Context as _, Result};
use plotters::prelude::*;

use crate::{
    apply::ApplyTimes,
    footprint::Footprint,
    frames::Family,
    interleave::{Comparison, Totals},
    paths::{Cores, Mode},
    progtime::ProgramTime,
    udp::NewFlows,
};

/// Everything measured for one mode at one CIDR count, in one family.
#[derive(Clone, Debug)]
pub(crate) struct Figures {
    pub(crate) family: Family,
    pub(crate) mode: Mode,
    pub(crate) cidrs: usize,
    pub(crate) established: Comparison,
    pub(crate) new_flows: NewFlows,
    pub(crate) connect: Comparison,
    pub(crate) connect_failures: u64,
    pub(crate) stream: Comparison,
}

/// The machine and the run.
#[derive(Clone, Debug, Default)]
pub(crate) struct Run {
    pub(crate) command: String,
    pub(crate) date: String,
    pub(crate) revision: String,
    pub(crate) cpu: String,
    pub(crate) cores: usize,
    pub(crate) memory_gib: f64,
    pub(crate) kernel: String,
    pub(crate) iptables: String,
    pub(crate) elapsed: Duration,
    pub(crate) quick: bool,
    /// The kernel's return-stack mitigations (what makes each kernel call dear).
    pub(crate) mitigations: String,
}

/// A whole run's results.
#[derive(Clone, Debug)]
pub(crate) struct Results {
    pub(crate) run: Run,
    pub(crate) cores: Cores,
    pub(crate) figures: Vec<Figures>,
    pub(crate) program: Vec<ProgramTime>,
    pub(crate) program_many: usize,
    /// The established path with 3 CIDRs and with many, timed side by side.
    pub(crate) flatness: crate::flatness::Flatness,
    pub(crate) apply: Vec<ApplyTimes>,
    pub(crate) footprint: Footprint,
    pub(crate) profiles: crate::profile::Profiles,
    /// masq attached by a clsact qdisc (test) against tcx links (reference), established
    /// packets at 3 CIDRs.
    pub(crate) attach_modes: Option<Comparison>,
}

impl Results {
    /// The traffic figures of `family`.
    fn of(&self, family: Family) -> Vec<&Figures> {
        self.figures
            .iter()
            .filter(|figures| figures.family == family)
            .collect()
    }
}

/// The four traffic tests, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Test {
    Established,
    NewFlows,
    Connect,
    Stream,
}

impl Test {
    const ALL: [Self; 4] = [
        Self::Established,
        Self::NewFlows,
        Self::Connect,
        Self::Stream,
    ];

    const fn title(self) -> &'static str {
        match self {
            Self::Established => "Established flows, small UDP packets/s",
            Self::NewFlows => "New flows/s, table full",
            Self::Connect => "TCP connect+close/s",
            Self::Stream => "One TCP stream (iperf3)",
        }
    }

    fn of(self, figures: &Figures) -> &Comparison {
        match self {
            Self::Established => &figures.established,
            Self::NewFlows => &figures.new_flows.comparison,
            Self::Connect => &figures.connect,
            Self::Stream => &figures.stream,
        }
    }

    /// The reference's rate, in the test's unit.
    fn rate(self, totals: &Totals) -> String {
        match self {
            Self::Established | Self::NewFlows => format!(
                "{:.0}k pkt/s, {:.0} ns/pkt",
                totals.rate() / 1e3,
                totals.path_ns_per_unit()
            ),
            Self::Connect => format!("{:.0} conn/s", totals.rate()),
            Self::Stream => format!("{:.2} Gbit/s", totals.rate() * 8.0 / 1e9),
        }
    }

    /// What a unit costs on top of the reference.
    fn extra(self, comparison: &Comparison) -> String {
        self.format_extra(self.extra_value(comparison))
    }

    /// What a unit costs on top of the reference, in the unit [`Test::format_extra`] shows.
    fn extra_value(self, comparison: &Comparison) -> f64 {
        match self {
            // The path threads' CPU time per packet: what else ran on the core does not count.
            Self::Established | Self::NewFlows => comparison.extra_path_ns(),
            // Both cores work for a connection: its price is CPU time, not wall time.
            Self::Connect => {
                (comparison.test.cpu_ns_per_unit() - comparison.reference.cpu_ns_per_unit()) / 1e3
            }
            // Per 1500-byte packet's worth of the stream.
            Self::Stream => comparison.extra_ns() * 1500.0,
        }
    }

    /// An extra cost (or a difference of two) with its unit.
    fn format_extra(self, value: f64) -> String {
        match self {
            Self::Established => format!("{value:+.0} ns/pkt"),
            Self::NewFlows => format!("{value:+.0} ns/flow"),
            Self::Connect => format!("{value:+.1} µs CPU/conn"),
            Self::Stream => format!("{value:+.0} ns/1500 B"),
        }
    }
}

/// The no NAT cost per unit a ratio target leaves for the path's extra cost.
fn budget(reference_ns: f64, target: f64) -> f64 {
    reference_ns * (1.0 / target - 1.0)
}

/// The time of `path` in `BPF_PROG_TEST_RUN` with few CIDRs (NaN when not measured).
fn program_time(results: &Results, path: &str) -> f64 {
    results
        .program
        .iter()
        .find(|time| time.path == path)
        .map_or(f64::NAN, |time| time.few)
}

/// What the packet targets leave room for on this machine, against what masq spends, from
/// this run's figures: the evidence where a target is out of reach.
fn bounds(results: &Results, out: &mut String) {
    let program = |path: &str| program_time(results, path);
    let ipv4 = results.of(Family::V4);
    let Some(masq) = ipv4.iter().find(|figures| figures.mode == Mode::Masq) else {
        return;
    };
    let conntrack = ipv4.iter().find(|figures| {
        matches!(figures.mode, Mode::Nft | Mode::Legacy) && figures.cidrs == masq.cidrs
    });
    let _ = writeln!(out, "\n## What bounds the packet targets\n");
    let _ = writeln!(
        out,
        "From this run, at {} CIDRs. A ratio target r leaves the path (1/r - 1) times what no NAT \
         spends per unit. The kernel here mitigates return-stack attacks ({}), so every call into \
         the kernel (a helper, a hash lookup) pays for a guarded return.\n",
        masq.cidrs, results.run.mitigations
    );
    let established = &masq.established;
    let reference = established.reference.path_ns_per_unit();
    let _ = writeln!(
        out,
        "* **Established packets (target 0.95).** No NAT spends {reference:.0} ns per packet, so \
         0.95 leaves {:.0} ns. masq's egress program alone takes {:.0} ns for an established \
         packet (repeated `BPF_PROG_TEST_RUN`, warm caches), with the four kernel calls a \
         translation with `--random-fully` needs: the NAT lookup, the transport checksum's \
         updates for the address and for the port (two: a checksum the stack completes later \
         takes the first and not the second, and only the kernel knows which kind the packet \
         has), and one store of the IPv4 checksum, addresses and ports. A packet it only parses \
         and passes takes {:.0} ns; one it looks up and exempts, {:.0} ns. Measured on the path: \
         {:+.0} ns per packet.",
        budget(reference, 0.95),
        program(crate::progtime::ESTABLISHED_REPEATED),
        program(crate::progtime::NOT_IPV4),
        program(crate::progtime::EXEMPT),
        established.extra_path_ns()
    );
    let profile = &results.profiles.program;
    if !profile.functions.is_empty() {
        let callees: Vec<String> = profile
            .functions
            .iter()
            .filter(|(function, _)| !function.ends_with(crate::profile::PROGRAM_SUFFIX))
            .take(4)
            .map(|(function, share)| format!("`{function}` {:.0}%", 100.0 * share))
            .collect();
        let _ = writeln!(
            out,
            "  Where the program's time goes (`perf` on a thread running it over and over, {} \
             samples; [the table below](#where-an-established-packets-program-time-goes-perf)): \
             {:.0}% in its own instructions, the rest in the kernel, most in {}.",
            profile.samples,
            100.0 * profile.in_programs(),
            callees.join(", ")
        );
    }
    established_kernel_time(results, budget(reference, 0.95), out);
    let new_flows = &masq.new_flows.comparison;
    let reference = new_flows.reference.path_ns_per_unit();
    let kernel = conntrack.map_or_else(String::new, |figures| {
        format!(
            " The kernel's own NAT ({}) in the same run: {:+.0} ns per flow.",
            figures.mode.name(),
            figures.new_flows.comparison.extra_path_ns()
        )
    });
    let _ = writeln!(
        out,
        "* **New flows (target 0.7).** No NAT spends {reference:.0} ns per packet, so 0.7 leaves \
         {:.0} ns per flow. A new flow is a lookup and two inserts into a table of {} flows that \
         is nearly full (buckets and free elements cold in the cache), a socket lookup, and two \
         tail calls; masq's programs take {:.0} ns for it (single run, cold). Measured on the \
         path: {:+.0} ns per flow.{kernel}",
        budget(reference, 0.7),
        masq.new_flows.capacity,
        program(crate::progtime::NEW_FLOW),
        new_flows.extra_path_ns()
    );
    new_flow_kernel_time(results, budget(reference, 0.7), out);
    stream_bound(results, masq, conntrack.copied(), out);
}

/// `value` with its difference from `baseline`, in nanoseconds.
fn ns_against(value: f64, baseline: f64, is_baseline: bool) -> String {
    if is_baseline {
        format!("{value:.0} ns")
    } else {
        format!("{value:.0} ns ({:+.0})", value - baseline)
    }
}

/// The established path with the default 3 CIDRs and with many, timed in alternating rounds.
fn flatness(results: &Results, out: &mut String) {
    let flatness = &results.flatness;
    let [few, many] = flatness.times.as_slice() else {
        return;
    };
    let _ = writeln!(
        out,
        "\n## Flatness: the established path from 3 to {} CIDRs\n",
        flatness.many_cidrs
    );
    let rounds = few.established_rounds.len();
    let (low, high) = round_spread(few, many);
    let _ = writeln!(
        out,
        "The datapath loaded twice, with 3 CIDRs and with {}, and timed with repeated \
         `BPF_PROG_TEST_RUN` in {rounds} alternating rounds (each round times both once, \
         starting with a different one), medians shown: machine drift falls on both alike; \
         the single-core rows run on one pinned core. Both cores at once: one thread per core, \
         each on its own established flow, at the same moment.\n",
        flatness.many_cidrs
    );
    let _ = writeln!(
        out,
        "**Target: the established packet within 10% from 3 to {} CIDRs.** The established \
         packet took {:.0} ns with 3 CIDRs and {:.0} ns with {}: {:+.1}% (the rounds' own \
         ratios {low:.2}-{high:.2}). An established packet never reaches the trie: its mapping \
         is found first. The exempt destination (in 10.0.0.0/8) is found near the trie's root \
         whatever its size: the added CIDRs are /32s in 100.64.0.0/10.\n",
        flatness.many_cidrs,
        few.established,
        many.established,
        many.label,
        100.0 * (many.established / few.established - 1.0)
    );
    let _ = writeln!(
        out,
        "| trie | established packet | both cores at once | exempt destination |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|");
    for (index, times) in [few, many].into_iter().enumerate() {
        let is_baseline = index == 0;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            times.label,
            ns_against(times.established, few.established, is_baseline),
            ns_against(
                times.established_both_cores,
                few.established_both_cores,
                is_baseline
            ),
            ns_against(times.exempt, few.exempt, is_baseline),
        );
    }
}

/// The lowest and highest ratio of `many`'s round time to `few`'s in the same round.
fn round_spread(
    few: &crate::flatness::ContenderTimes,
    many: &crate::flatness::ContenderTimes,
) -> (f64, f64) {
    let ratios: Vec<f64> = few
        .established_rounds
        .iter()
        .zip(&many.established_rounds)
        .map(|(few, many)| many / few)
        .collect();
    if ratios.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), ratio| {
            (low.min(*ratio), high.max(*ratio))
        })
}

/// What the benchmark variants (design alternatives built into the datapath behind `masq-ebpf`
/// features, removed since) proved, as the last run that measured them recorded it. Static
/// text: nothing in this run measures it again.
const DESIGN_CHOICES: &str = "\
## Design choices measured earlier

Until the benchmark variants left the production datapath, this benchmark also timed the
datapath against alternatives built from the same source with one `masq-ebpf` feature each:
repeated `BPF_PROG_TEST_RUN` in 41 alternating rounds on one pinned core, 3 CIDRs, NAT tables
of 524288 entries; new flows 2001 single runs per datapath, first into tables filled to all but
4003 flows, then into full ones. From the run of 2026-11-27 (masq 5334561; AMD EPYC, 2 cores,
Linux 6.18.44): the production datapath took 160 ns for an established packet (165 ns with
both cores at once), 1821 ns for a new flow into a nearly full table and 2482 ns into a full
one; the same source built the way the alternatives were differed by +0, +0, +1 and +41 ns,
the measurement's own noise.

* **Per-CPU counters, not one shared array with atomic adds.** Shared counters: 161 ns (+1)
  per established packet, 166 ns (+1) on both cores at once, new flows 1791 ns (-30) and
  2563 ns (+81): no difference beyond the noise on two cores.
* **A flow's entry refreshed at most once a second, not on every packet** (timestamp written,
  other half looked up). Refreshing on every packet: 196 ns (+36) per established packet, 200
  ns (+36) on both cores at once; new flows 1801 ns (-20) and 2532 ns (+50).
* **Hash tables, not LRU tables.** An LRU table (evicts when full): 161 ns (+1) established,
  new flows 1711 ns (-110) nearly full and 1490 ns (-992) full, 2001 of 2001 admitted, each by
  evicting an entry, half of some flow, answered or not; the production table admits a new
  flow into a full table only by evicting one never answered.
* **No per-CPU LRU lists.** LRU tables with per-CPU lists (`BPF_F_NO_COMMON_LRU`): 161 ns
  (+1) established, new flows 2161 ns (+340) nearly full and 2112 ns (-370) full: each core
  gets its share of the capacity, and one core filling the table already evicts when the
  table is nearly full.
* **Two entries a flow.** One entry a flow (no reverse entry: what it saves at most; replies
  dropped): 160 ns (+0) established, 166 ns (+0) on both cores, new flows 1520 ns (-301)
  nearly full and 2202 ns (-280) full.

The alternatives' code (the `variant-*` features of `masq-ebpf`, `cargo xtask
build-ebpf-variants`, `masq-bench --variants`) lives on at the git tag `bench-variants`
(commit 87a82e3).
";

/// The attach modes side by side: what dispatching through a clsact qdisc costs a packet
/// against tcx.
fn attach_modes(results: &Results, out: &mut String) {
    let Some(comparison) = &results.attach_modes else {
        return;
    };
    let _ = writeln!(out, "\n## Attach modes: tc (clsact) against tcx\n");
    let _ = writeln!(
        out,
        "masq at 3 CIDRs with its programs attached by a clsact qdisc and direct-action \
         filters (`--attach-mode tc`, what kernels before 6.6 get) against the same with tcx \
         links (the default here), established flows measured as above, in alternating \
         windows; the tcx path is the reference. Ratio {}; the tcx path's threads spent {:.0} \
         ns per packet.",
        ratio_cell(Test::Established, comparison),
        comparison.reference.path_ns_per_unit()
    );
}

/// What masq's programs and the kernel functions they call cost one TCP stream, and what
/// netfilter's NAT costs it, from the profiles of all cores during a stream through masq,
/// through iptables-nft and through no NAT: the stream's figure where the interleaved runs
/// spread more than the difference to be shown.
fn stream_bound(results: &Results, masq: &Figures, conntrack: Option<&Figures>, out: &mut String) {
    let profiles = &results.profiles;
    let masq_functions = group_differences(
        &profiles.stream,
        &profiles.stream_reference,
        MASQ_STREAM_FUNCTIONS,
    );
    if masq_functions.is_empty() {
        return;
    }
    let masq_ns: f64 = masq_functions.iter().map(|(_, ns)| ns).sum();
    let largest: Vec<String> = masq_functions
        .iter()
        .take(4)
        .map(|(function, ns)| format!("`{function}` {ns:.1} ns"))
        .collect();
    let stream = &masq.stream;
    let (low, high) = stream.spread();
    // No NAT's wall time per 1500 bytes in the windows paired with masq's: were all of masq's
    // work on the stream's critical path, each of its nanoseconds would add one to this.
    let reference_rate = stream.reference.rate();
    let reference_wall = if reference_rate > 0.0 {
        1e9 * 1500.0 / reference_rate
    } else {
        f64::NAN
    };
    let serial_ratio = reference_wall / (reference_wall + masq_ns.max(0.0));
    // No NAT's busy time of all cores per 1500 bytes: were the stream bound by the CPU as a
    // whole, masq's nanoseconds would add to this.
    let reference_cpu = stream.reference.cpu_ns_per_unit() * 1500.0;
    let cpu_ratio = reference_cpu / (reference_cpu + masq_ns.max(0.0));
    let kernel = conntrack.map_or_else(String::new, |figures| {
        format!(
            "; {} in the same run: {:.2}",
            figures.mode.name(),
            figures.stream.ratio()
        )
    });
    let spread = if high - low > 1.0 - 0.98 {
        " Runs of one stream spread by more than the target's margin, so the profiles measure \
         what masq adds."
    } else {
        ""
    };
    let netfilter = group_differences(
        &profiles.stream_iptables,
        &profiles.stream_reference,
        NETFILTER_FUNCTIONS,
    );
    let iptables = if netfilter.is_empty() || masq_ns <= 0.0 {
        String::new()
    } else {
        let netfilter_ns: f64 = netfilter.iter().map(|(_, ns)| ns).sum();
        format!(
            " Through iptables-nft the same stream spends {netfilter_ns:.1} ns per 1500 bytes \
             more in netfilter's functions (the hooks, conntrack, the NAT chain's rules, the \
             NAT and its checksum updates) than through no NAT, {:.1} times what masq's \
             functions take: masq {} than netfilter.",
            netfilter_ns / masq_ns,
            if netfilter_ns > masq_ns {
                "adds less CPU time to a stream"
            } else {
                "adds no less CPU time to a stream"
            }
        )
    };
    let _ = writeln!(
        out,
        "* **One TCP stream (target 0.98, never below iptables).** masq measured {:.2} \
         ({:+.0} ns per 1500 bytes; window pairs {low:.2}-{high:.2}{kernel}).{spread} In \
         profiles of every core during one stream through no NAT, one through masq (its NAT \
         table nearly full, left so by the new-flow profile) and one through iptables-nft, \
         taken one after the other, masq's programs, the helpers and map functions they call \
         and the tc hook take {masq_ns:.1} ns of CPU per 1500 bytes more than through no NAT \
         ({}; from the functions' shares of the samples, so approximate). The stream's data \
         reaches them as GSO packets of up to 64 KiB and its ACKs one by one. In the windows \
         paired \
         with masq's, no NAT kept the cores busy {reference_cpu:.0} ns per 1500 bytes and took \
         {reference_wall:.0} ns of wall time: with masq's time added to the CPU the stream \
         uses, the ratio would be {cpu_ratio:.3}; in the worst case, all of it on the stream's \
         critical path, {serial_ratio:.3}.{iptables}",
        stream.ratio(),
        stream.extra_ns() * 1500.0,
        largest.join(", ")
    );
}

/// What `profile` spends per unit more than `reference` in each function of `group` either of
/// them sampled, largest first. Empty when a time per unit is missing.
fn group_differences(
    profile: &crate::profile::Profile,
    reference: &crate::profile::Profile,
    group: &[&str],
) -> Vec<(String, f64)> {
    crate::profile::differences(profile, reference)
        .into_iter()
        .filter(|difference| named_by(&difference.function, group))
        .map(|difference| {
            let extra = difference.extra_ns();
            (difference.function, extra)
        })
        .collect()
}

/// Whether `function` is a program or a kernel function whose name, leading underscores
/// aside, begins with one of `prefixes`. A part anywhere in the name would also catch
/// unrelated functions (`xt_` in `context_switch`).
fn named_by(function: &str, prefixes: &[&str]) -> bool {
    if function.ends_with(crate::profile::PROGRAM_SUFFIX) {
        return prefixes.contains(&crate::profile::PROGRAM_SUFFIX);
    }
    let name = function.trim_start_matches('_');
    prefixes.iter().any(|prefix| name.starts_with(prefix))
}

/// masq's part of a stream's profile, by name prefix: its programs, the helpers and map
/// functions they call, and the tc hook that runs them.
const MASQ_STREAM_FUNCTIONS: &[&str] = &[
    crate::profile::PROGRAM_SUFFIX,
    "bpf_skb_",
    "bpf_l3_csum_replace",
    "bpf_l4_csum_replace",
    "bpf_ktime",
    "bpf_map_",
    "bpf_tail_call",
    "tcx_",
    "tc_run",
    "tcf_classify",
    "htab_",
    "lookup_nulls_elem_raw",
    "lookup_elem_raw",
    "jhash",
    "inet_proto_csum_replace",
    "skb_ensure_writable",
];

/// netfilter's part of a stream's profile through iptables, by name prefix: the hooks,
/// conntrack, the NAT chain's rules, and the NAT with its packet rewrite and checksum updates.
const NETFILTER_FUNCTIONS: &[&str] = &[
    "nf_",
    "nft_",
    "ipt_",
    "xt_",
    "ipv4_conntrack",
    "ipv4_confirm",
    "hash_conntrack",
    "siphash",
    "l4proto_manip_pkt",
    "tcp_manip_pkt",
    "udp_manip_pkt",
    "inet_proto_csum_replace",
    "masquerade",
    "xfrm_decode_session",
];

/// Whether `function` belongs to a group of functions named by the parts of their names.
fn in_group(function: &str, group: &[&str]) -> bool {
    group.iter().any(|part| function.contains(part))
}

/// Kernel functions of the NAT table (hash walks, inserts, element allocation).
const NAT_TABLE_FUNCTIONS: &[&str] = &[
    "htab_",
    "lookup_nulls_elem_raw",
    "lookup_elem_raw",
    "pcpu_freelist",
    "jhash",
];

/// Kernel functions that update checksums and store rewritten headers for the programs.
const REWRITE_FUNCTIONS: &[&str] = &["csum_replace", "store_bytes", "skb_ensure_writable"];

/// Kernel functions of a socket lookup, which tells whether a node socket holds a port.
const SOCKET_LOOKUP_FUNCTIONS: &[&str] = &[
    "lib_lookup",
    "inet_lookup",
    "inet6_lookup",
    "sk_lookup",
    "sk_release",
];

/// What the comparison of the established profiles says the kernel calls an established
/// packet's translation makes cost on the path, against what the target leaves.
fn established_kernel_time(results: &Results, budget: f64, out: &mut String) {
    let differences = crate::profile::differences(
        &results.profiles.established,
        &results.profiles.established_reference,
    );
    if differences.is_empty() {
        return;
    }
    let extra_in = |parts: &[&str]| -> f64 {
        differences
            .iter()
            .filter(|difference| in_group(&difference.function, parts))
            .map(crate::profile::Difference::extra_ns)
            .sum()
    };
    let (table, rewrite) = (extra_in(NAT_TABLE_FUNCTIONS), extra_in(REWRITE_FUNCTIONS));
    let program = extra_in(&[crate::profile::PROGRAM_SUFFIX]);
    let verdict = if table + rewrite > budget {
        "more than the target leaves for everything"
    } else {
        "within what the target leaves"
    };
    let _ = writeln!(
        out,
        "  On the path ([masq against no NAT, function by function](#what-an-established-packet-costs-masqs-path-more-than-no-nats-function-by-function)): \
         the NAT lookup's kernel functions take {table:.0} ns per packet and the checksum \
         updates and the store {rewrite:.0} ns, {verdict}; masq's own instructions {program:.0} \
         ns, in caches the stack around them keeps busy."
    );
}

/// What the new-flow profile says the kernel calls a new flow cannot do without cost per
/// flow: the profile's shares of the path's time, times the path's time per packet (every
/// packet a new flow).
fn new_flow_kernel_time(results: &Results, budget: f64, out: &mut String) {
    let profile = &results.profiles.new_flows;
    let Some(per_packet) = profile
        .path_ns_per_unit
        .filter(|ns| ns.is_finite() && *ns > 0.0)
    else {
        return;
    };
    let time_in =
        |parts: &[&str]| per_packet * profile.share_of(|function| in_group(function, parts));
    let (table, sockets) = (
        time_in(NAT_TABLE_FUNCTIONS),
        time_in(SOCKET_LOOKUP_FUNCTIONS),
    );
    let verdict = if table + sockets > budget {
        "more than the target leaves for everything".to_owned()
    } else {
        format!(
            "{:.0}% of what the target leaves",
            100.0 * (table + sockets) / budget
        )
    };
    let _ = writeln!(
        out,
        "  Where the flow's time goes ([the path's profile](#where-the-paths-time-goes-perf), \
         each function's share of the path's {per_packet:.0} ns per packet while it was taken): \
         the NAT table's kernel functions (the hash \
         walks of the two lookups and the inserts, cache misses in a table of this size) \
         {table:.0} ns, and the lookup of the node's sockets that keeps pod flows off the \
         node's ports {sockets:.0} ns: together {verdict}, before any of masq's own \
         instructions run."
    );
}

/// The perf profile of the established packet's program run alone.
fn program_profile(results: &Results, out: &mut String) {
    let profile = &results.profiles.program;
    if profile.functions.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\n## Where an established packet's program time goes (perf)\n"
    );
    let _ = writeln!(
        out,
        "`perf record -t` on a thread that runs the egress program on the established frame of \
         the table above, 10,000 runs per `BPF_PROG_TEST_RUN` call, for as long as each path \
         profile below ({} samples). The program's own instructions include the cost of \
         returning into it from each kernel function it called. `bpf_test_run` and the timer \
         are the test harness.\n",
        profile.samples
    );
    let _ = writeln!(out, "| function | share |");
    let _ = writeln!(out, "|---|---:|");
    for (function, share) in profile.functions.iter().take(crate::profile::SHOWN) {
        let _ = writeln!(out, "| `{function}` | {:.1}% |", 100.0 * share);
    }
}

/// The perf profiles of the path's core, side by side.
fn profiles(results: &Results, out: &mut String) {
    let (established, new_flows) = (&results.profiles.established, &results.profiles.new_flows);
    if established.functions.is_empty() && new_flows.functions.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## Where the path's time goes (perf)\n");
    let _ = writeln!(
        out,
        "`perf record -t <the path's kernel threads>` while masq (3 CIDRs) carries established \
         flows, then new flows into a table kept full but for the flows a window creates ({} \
         and {} samples): the functions with the largest shares of the path's time, masq's \
         programs among them. The rest of each column is the stack's forwarding, which no NAT \
         pays too.\n",
        established.samples, new_flows.samples
    );
    let _ = writeln!(
        out,
        "| established flows | share | new flows, table full | share |"
    );
    let _ = writeln!(out, "|---|---:|---|---:|");
    let rows = established
        .functions
        .len()
        .max(new_flows.functions.len())
        .min(crate::profile::SHOWN);
    let cell = |profile: &crate::profile::Profile, row: usize| {
        profile.functions.get(row).map_or_else(
            || " | ".to_owned(),
            |(function, share)| format!("`{function}` | {:.1}%", 100.0 * share),
        )
    };
    for row in 0..rows {
        let _ = writeln!(
            out,
            "| {} | {} |",
            cell(established, row),
            cell(new_flows, row)
        );
    }
    extra_time(results, out);
}

/// Where masq's established packets spend time that no NAT's do not, function by function.
fn extra_time(results: &Results, out: &mut String) {
    let (profile, reference) = (
        &results.profiles.established,
        &results.profiles.established_reference,
    );
    let differences = crate::profile::differences(profile, reference);
    let (Some(per_packet), Some(reference_per_packet)) =
        (profile.path_ns_per_unit, reference.path_ns_per_unit)
    else {
        return;
    };
    if differences.is_empty() {
        return;
    }
    let more: Vec<_> = differences
        .iter()
        .filter(|difference| difference.extra_ns() > 0.0)
        .collect();
    let listed: f64 = more.iter().map(|difference| difference.extra_ns()).sum();
    let _ = writeln!(
        out,
        "\n### What an established packet costs masq's path more than no NAT's, function by \
         function\n\nThe same established traffic through the no NAT sandbox, profiled the \
         same way ({} samples) just before masq's; each function's share of a profile times \
         that path's CPU time per packet ({reference_per_packet:.0} ns without NAT, \
         {per_packet:.0} ns with masq: {:+.0} ns). The functions that cost masq more add up \
         to {listed:+.0} ns; the largest:\n",
        reference.samples,
        per_packet - reference_per_packet
    );
    let _ = writeln!(out, "| function | no NAT | masq | more |");
    let _ = writeln!(out, "|---|---:|---:|---:|");
    for difference in more.iter().take(crate::profile::SHOWN) {
        let _ = writeln!(
            out,
            "| `{}` | {:.0} ns | {:.0} ns | {:+.0} ns |",
            difference.function,
            difference.reference_ns,
            difference.ns,
            difference.extra_ns()
        );
    }
}

/// Why a generator figure is what it is.
fn limit(totals: &Totals, cores: Cores) -> String {
    if totals.offered == 0 {
        return format!("all cores {:.0}% busy", 100.0 * totals.cpu.busy_all());
    }
    let rejected = totals.rejected as f64 / totals.offered as f64;
    let generator = totals.generator_seconds / totals.seconds.max(1e-9);
    let path = totals.path_seconds / totals.seconds.max(1e-9);
    let core = totals.cpu.busy(cores.path);
    if rejected > 0.05 {
        format!(
            "path: its threads ran {:.0}% of the time (core {:.0}% busy), {:.0}% of the frames refused",
            100.0 * path,
            100.0 * core,
            100.0 * rejected
        )
    } else if generator > 0.9 {
        format!(
            "GENERATOR ({:.0}% of its core; the path's threads ran {:.0}%)",
            100.0 * generator,
            100.0 * path
        )
    } else {
        format!(
            "neither (generator {:.0}%, path threads {:.0}%)",
            100.0 * generator,
            100.0 * path
        )
    }
}

fn ratio_cell(test: Test, comparison: &Comparison) -> String {
    let (low, high) = comparison.spread();
    let rate = match test {
        Test::Established | Test::NewFlows => {
            format!("; rate ratio {:.2}", comparison.rate_ratio())
        }
        Test::Connect | Test::Stream => String::new(),
    };
    format!(
        "**{:.2}** ({}{rate}; pairs {:.2}-{:.2})",
        comparison.ratio(),
        test.extra(comparison),
        low,
        high
    )
}

fn cidr_counts(figures: &[&Figures]) -> Vec<usize> {
    let mut counts: Vec<usize> = figures.iter().map(|figures| figures.cidrs).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn find<'a>(figures: &[&'a Figures], mode: Mode, cidrs: usize) -> Option<&'a Figures> {
    figures
        .iter()
        .find(|figures| figures.mode == mode && figures.cidrs == cidrs)
        .copied()
}

fn millis(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1e3)
}

/// The compared modes' column titles, with the baseline's ratio column when the run has a
/// baseline, and their header rule: each followed by `|`.
fn mode_columns() -> (String, String) {
    let mut titles: Vec<String> = Mode::compared()
        .into_iter()
        .map(|mode| mode.name().to_owned())
        .collect();
    if Mode::compared().contains(&Mode::Baseline) {
        titles.push(format!("masq / {}", Mode::Baseline.name()));
    }
    let rule = "---|".repeat(titles.len());
    let titles = titles
        .iter()
        .map(|title| format!(" {title} |"))
        .collect::<String>();
    (titles, rule)
}

/// The no NAT cell and the compared modes' cells of `test` at `cidrs`, and the baseline's
/// ratio cell when the run has a baseline, each followed by `|`.
fn mode_cells(test: Test, figures: &[&Figures], cidrs: usize) -> String {
    let compared = Mode::compared();
    let reference = compared
        .iter()
        .find_map(|&mode| find(figures, mode, cidrs))
        .map(|figures| test.rate(&test.of(figures).reference))
        .unwrap_or_default();
    let mut cells = format!(" 1.00 ({reference}) |");
    for &mode in &compared {
        let cell = find(figures, mode, cidrs).map_or_else(
            || "not run".to_owned(),
            |figures| ratio_cell(test, test.of(figures)),
        );
        let _ = write!(cells, " {cell} |");
    }
    if compared.contains(&Mode::Baseline) {
        let _ = write!(cells, " {} |", new_over_old(test, figures, cidrs));
    }
    cells
}

/// masq against the baseline at `cidrs`: masq's ratio to no NAT over the baseline's (each from
/// its own windows against the same reference; above 1.00 this revision is faster) and the
/// difference of their extra costs per unit.
fn new_over_old(test: Test, figures: &[&Figures], cidrs: usize) -> String {
    let (Some(new), Some(old)) = (
        find(figures, Mode::Masq, cidrs),
        find(figures, Mode::Baseline, cidrs),
    ) else {
        return "-".to_owned();
    };
    let (new, old) = (test.of(new), test.of(old));
    format!(
        "**{:.2}** ({})",
        new.ratio() / old.ratio(),
        test.format_extra(test.extra_value(new) - test.extra_value(old))
    )
}

const RATIO_LEGEND: &str = "Ratio to no NAT (1.00 = free), the extra cost per unit, and the \
     lowest and highest ratio of the window pairs; the no NAT column gives its rate (and CPU \
     time per packet).\n";

/// What limited each figure of `tests`, one row per figures and test (a test column when
/// there are several).
fn limits_table(tests: &[Test], figures: &[&Figures], cores: Cores, out: &mut String) {
    let (head, rule) = if tests.len() > 1 {
        ("| test ", "|---")
    } else {
        ("", "")
    };
    let _ = writeln!(out, "\nWhat limited each figure:\n");
    let _ = writeln!(
        out,
        "{head}| mode | CIDRs | no NAT windows | measured windows |"
    );
    let _ = writeln!(out, "{rule}|---|---:|---|---|");
    for &test in tests {
        for figures in figures {
            let comparison = test.of(figures);
            let title = if tests.len() > 1 {
                format!("| {} ", test.title())
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{title}| {} | {} | {} | {} |",
                figures.mode.name(),
                figures.cidrs,
                limit(&comparison.reference, cores),
                limit(&comparison.test, cores)
            );
        }
    }
}

/// The NAT tables of the new-flow test during its measured windows.
fn fill_table(figures: &[&Figures], out: &mut String) {
    let _ = writeln!(out, "\nThe tables during the measured windows:\n");
    let _ = writeln!(
        out,
        "| mode | CIDRs | capacity (flows) | fill | new flows per window | refused (table full) |"
    );
    let _ = writeln!(out, "|---|---:|---:|---|---:|---:|");
    for figures in figures {
        let flows = &figures.new_flows;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1}%-{:.1}% | {} | {} |",
            figures.mode.name(),
            figures.cidrs,
            flows.capacity,
            100.0 * flows.fill.0,
            100.0 * flows.fill.1,
            flows.window_flows,
            flows
                .refused_full
                .map_or_else(|| "-".to_owned(), |refused| refused.to_string())
        );
    }
}

/// The connect+close test's failed connections.
fn connect_failures(figures: &[&Figures], out: &mut String) {
    let failures: u64 = figures.iter().map(|figures| figures.connect_failures).sum();
    let _ = writeln!(
        out,
        "\nConnections that failed or timed out (1 s): {failures}."
    );
}

/// One section per test, a row per CIDR count: the IPv4 traffic.
fn traffic_sections(figures: &[&Figures], cores: Cores, out: &mut String) {
    if figures.is_empty() {
        return;
    }
    let counts = cidr_counts(figures);
    for test in Test::ALL {
        let _ = writeln!(out, "## {}\n", test.title());
        let _ = writeln!(out, "{RATIO_LEGEND}");
        let (titles, rule) = mode_columns();
        let _ = writeln!(out, "| CIDRs | no NAT |{titles}");
        let _ = writeln!(out, "|---:|---|{rule}");
        for &cidrs in &counts {
            let _ = writeln!(out, "| {cidrs} |{}", mode_cells(test, figures, cidrs));
        }
        limits_table(&[test], figures, cores, out);
        match test {
            Test::NewFlows => fill_table(figures, out),
            Test::Connect => connect_failures(figures, out),
            Test::Established | Test::Stream => {}
        }
        out.push('\n');
    }
}

/// The IPv6 traffic: every test in one table, a row per test and CIDR count.
fn ipv6_section(results: &Results, out: &mut String) {
    let figures = &results.of(Family::V6);
    if figures.is_empty() {
        return;
    }
    let _ = writeln!(out, "## IPv6\n");
    out.push_str(IPV6_METHOD);
    let _ = writeln!(out, "\n{RATIO_LEGEND}");
    let (titles, rule) = mode_columns();
    let _ = writeln!(out, "| test | IPv6 CIDRs | no NAT |{titles}");
    let _ = writeln!(out, "|---|---:|---|{rule}");
    for test in Test::ALL {
        for cidrs in cidr_counts(figures) {
            let _ = writeln!(
                out,
                "| {} | {cidrs} |{}",
                test.title(),
                mode_cells(test, figures, cidrs)
            );
        }
    }
    let (v4, v6) = (
        program_time(results, crate::progtime::ESTABLISHED_REPEATED),
        program_time(results, crate::progtime::ESTABLISHED_V6_REPEATED),
    );
    if v4.is_finite() && v6.is_finite() {
        let _ = writeln!(
            out,
            "\nmasq's egress programs alone take {v6:.0} ns for an established IPv6 packet (a tail \
             call into the IPv6 program, the lookup and the rewrite) against \
             {v4:.0} ns for IPv4 (`BPF_PROG_TEST_RUN`, repeated, warm caches; see below)."
        );
    }
    limits_table(&Test::ALL, figures, results.cores, out);
    fill_table(figures, out);
    connect_failures(figures, out);
    out.push('\n');
}

/// The Markdown report.
pub(crate) fn markdown(results: &Results, plot_name: &str) -> String {
    let run = &results.run;
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmarks\n");
    let _ = writeln!(
        out,
        "Written by `{}` on {} ({}; the run took {:.0} s). Do not edit: run the command again.\n",
        run.command,
        run.date,
        if run.quick {
            "QUICK MODE, tiny sizes, numbers meaningless"
        } else {
            "full length"
        },
        run.elapsed.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "Machine: {}, {} cores, {:.0} GiB, Linux {}, {}; masq {}.\n",
        run.cpu, run.cores, run.memory_gib, run.kernel, run.iptables, run.revision
    );
    out.push_str(METHOD);
    baseline_method(&mut out);
    let _ = writeln!(
        out,
        "\n![ratio to no NAT against CIDR count]({plot_name})\n"
    );

    traffic_sections(&results.of(Family::V4), results.cores, &mut out);
    ipv6_section(results, &mut out);

    let _ = writeln!(
        out,
        "## The datapath programs' own time (BPF_PROG_TEST_RUN)\n"
    );
    let _ = writeln!(
        out,
        "Kernel time per run of masq's programs on 60-byte frames, without the stack around \
         them. Repeated frames are averaged by the kernel; a new flow exists after its first \
         run, so new flows are single runs (median), which include the timer's own overhead: \
         compare them with the single-run established row.\n"
    );
    let _ = writeln!(out, "| path | 3 CIDRs | {} CIDRs |", results.program_many);
    let _ = writeln!(out, "|---|---:|---:|");
    for time in &results.program {
        let _ = writeln!(
            out,
            "| {} | {:.0} ns | {:.0} ns |",
            time.path, time.few, time.many
        );
    }

    flatness(results, &mut out);
    let _ = write!(out, "\n{DESIGN_CHOICES}");
    bounds(results, &mut out);
    attach_modes(results, &mut out);
    program_profile(results, &mut out);
    profiles(results, &mut out);

    let _ = writeln!(out, "\n## Applying a config\n");
    let _ = writeln!(
        out,
        "masq: what the agent does on a reload (read and validate the file, compute the policy; \
         then diff and write the trie), called in-process on a loaded, unattached datapath. \
         iptables: `iptables-restore --noflush` of the chain `masq render-iptables` writes for \
         the same config, as upstream applies it (upstream also runs `iptables -S` and `-C` \
         first, not counted). A change replaces one CIDR; upstream rewrites the whole chain. \
         masq's changes are the agent's own reader at work: the file is replaced at its path \
         by rename, as the kubelet does, {CHANGES} times, and the median is shown; every \
         reload reads the whole file.\n",
        CHANGES = crate::apply::CHANGES
    );
    let _ = writeln!(
        out,
        "| CIDRs | masq load (parse + trie) | masq one change (parse + trie) | iptables-nft load | iptables-nft change | iptables-legacy load | iptables-legacy change |"
    );
    let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|");
    for apply in &results.apply {
        let pair = |times: Option<(Duration, Duration)>| {
            times.map_or_else(
                || "- | -".to_owned(),
                |(load, change)| format!("{} | {}", millis(load), millis(change)),
            )
        };
        let masq = |applied: &crate::apply::Applied| {
            if apply.from_config {
                format!(
                    "{} ({} + {})",
                    millis(applied.total()),
                    millis(applied.parse),
                    millis(applied.write)
                )
            } else {
                format!("trie only: {}", millis(applied.write))
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            apply.cidrs,
            masq(&apply.masq_load),
            masq(&apply.masq_change),
            pair(apply.nft),
            pair(apply.legacy)
        );
    }
    if results.apply.iter().any(|apply| !apply.from_config) {
        let _ = writeln!(
            out,
            "\nNo config masq reads can hold more than about 60,000 CIDRs: a file is read up to \
             1 MiB (what a ConfigMap holds) and directory mode takes 64 CIDRs per file. Larger \
             lists are timed on the trie alone, from the list the policy would compute."
        );
    }

    let footprint = &results.footprint;
    let _ = writeln!(out, "\n## The agent's footprint\n");
    let _ = writeln!(
        out,
        "`masq agent` in a sandbox, sampled every 10 ms (memory from `/proc/PID/status`, CPU from \
         `/proc/PID/stat`), with a `/healthz` request after the other, 10 ms apart, as a probe \
         would send them. The garbage collector runs every {} (the default), over a table of {} \
         entries.\n",
        footprint.gc_interval, footprint.table_entries
    );
    let _ = writeln!(
        out,
        "| phase | seconds | agent CPU | peak RSS | /healthz answers | slowest | 99th percentile |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for phase in &footprint.phases {
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.0}% ({:.2} s) | {:.1} MiB | {} | {} | {} |",
            phase.name,
            phase.seconds,
            100.0 * phase.cpu_seconds / phase.seconds.max(1e-9),
            phase.cpu_seconds,
            phase.peak_rss as f64 / f64::from(1 << 20),
            phase.probes,
            millis(phase.healthz_max),
            millis(phase.healthz_p99)
        );
    }
    out
}

const METHOD: &str = "\
## How it is measured

Each mode runs in a fresh sandbox of network namespaces (pods, a node, a router; see
`tests/src/sandbox.rs`); a second sandbox that only forwards (no NAT, no conntrack) is the
reference. The reference and the path under test are measured **in alternating windows of the
same run** (100 ms for packets, 200 ms for connections, 1 s iperf3 runs; pairs in ABBA order),
so whatever else the machine does affects both alike. The sections per test are IPv4; the
[IPv6](#ipv6) section has the same tests over IPv6, measured the same way.

* **Ratio.** For connections and the stream: the path's rate over the reference's in the same
  windows. For the generator's packets: no NAT's CPU time per packet over the path's, counting
  the time of the kernel threads that run the path (see below): the packet rate ratio of a
  core that does nothing else, which other work on a busy machine cannot skew. On a quiet
  machine it equals the rate ratio, which is shown next to it.
* **Generator.** Prebuilt 60-byte UDP/IPv4 frames (64 bytes on a wire) sent with `sendmmsg` on an
  `AF_PACKET` socket (qdisc bypassed) by a thread pinned to one core. The pod's veth delivers
  them to a NAPI thread pinned to the other core, where the whole path runs (the node's
  forwarding and NAT, the transmission to the router). When the path is slower than the
  generator, the veth's ring is full and the generator's extra frames are refused at once: they
  cost the path nothing. The traffic leaves the node towards a neighbour that does not exist, so
  the router drops it as soon as it arrives; what is counted is what left the node.
* **Extra ns per packet or flow** is the difference in CPU time per packet of the kernel
  threads that run the path (the veth's NAPI thread and the core's ksoftirqd, read from their
  CPU clocks): what each unit costs on top of plain forwarding, whatever else ran on the
  core. The reference column gives that time for plain forwarding. For connections,
  where both cores work, it is the difference in busy CPU time of all cores per connection
  (from `/proc/stat`); for the stream, `1/rate` per 1500 bytes.
* **What limited a figure**: the share of frames refused (the path was full), how much of the
  time the path's threads ran (less than 100% while refusing frames: other work took the
  core), and the generator thread's own CPU time. A figure marked GENERATOR was limited by the
  generator and understates the difference between the paths.
* **Established flows**: 256 flows that exist already (each sent before the windows), cycled.
* **New flows, table full**: every packet a new 5-tuple to one remote host (ports vary, so no
  remote endpoint runs short of ports). conntrack evicts an unreplied flow to admit a new one
  when full: its table is filled to `nf_conntrack_max` (a global setting) and stays full.
  masq's table (`--nat-max-entries` = twice `nf_conntrack_max`, two entries a flow; no
  `--nat-pod-share`, the generator standing for all of a node's pods) is filled to capacity
  less what one window creates, and after each window those flows are deleted again, as the
  garbage collector frees expired flows on a busy node: what is timed is a new flow's
  admission. The fill is shown with the results.
* **TCP connect+close**: two client threads in a pod connect to the outside host and close
  with a reset (no TIME_WAIT); the server accepts and closes. Every connection is a new flow.
* **One TCP stream**: iperf3 from a pod to the outside host, one stream, offloads on; the
  client runs on one core and the server on the other, in every window alike.
* **CIDRs**: the config lists upstream's three defaults plus /32s in 100.64.0.0/10, none of
  which holds the destination, so iptables walks its whole chain for each new flow. The largest
  list, 50,000, is near the most one config file can hold (masq reads up to 1 MiB, what a
  ConfigMap holds); iptables is run up to 10,000, where a new flow already walks 10,000 rules.
";

/// How the baseline is measured, when the run has one.
fn baseline_method(out: &mut String) {
    let Some(baseline) = crate::paths::baseline() else {
        return;
    };
    let name = &baseline.name;
    let ipv6 = if baseline.ipv6 {
        "IPv4 and IPv6"
    } else {
        "IPv4 (its agent has no `--enable-ipv6`)"
    };
    let _ = writeln!(
        out,
        "* **{name}**: the `masq` agent of revision {} (`cargo xtask bench --baseline`, built in \
         release from a worktree of that revision), with the datapath it embeds and maps of its \
         own, run with the same flags, table sizes and sandboxes as masq and measured as one \
         more mode against the same no NAT reference, right after masq at each CIDR count, for \
         {ipv6}. The column masq / {name} divides masq's ratio by {name}'s (above 1.00: this \
         revision is faster) and gives the difference of their extra costs. Its new-flow test \
         reads {name}'s NAT table without its types: the entries the fill leaves are \
         remembered and whatever a window adds is deleted again. The sections after the \
         traffic measure this revision alone.",
        baseline.revision
    );
}

const IPV6_METHOD: &str = "\
The same four tests over IPv6, each against a no NAT reference of its own that forwards IPv6,
in alternating windows as above. Every sandbox is dual-stack (pods, node, router and outside
host get addresses in 2001:db8::/32, and the node forwards IPv6).

* **Generator**: 62-byte frames (Ethernet, IPv6 and UDP headers, no payload: the smallest
  UDP/IPv6 frame, 66 bytes on a wire), to a host behind the node's uplink that does not exist,
  as for IPv4.
* **iptables**: upstream's ip6tables chain, as `masq render-iptables --family ipv6` writes it
  (`fe80::/10` and each IPv6 CIDR RETURN, then `MASQUERADE --random-fully`), applied by the
  agent's iptables backend with `--enable-ipv6` (nf_tables) or with `ip6tables-legacy-restore`.
  **masq** runs with `--enable-ipv6`: IPv6 frames go through its IPv6 programs and NAT table.
* **Config**: upstream's three IPv4 defaults and the IPv6 CIDRs counted in the table
  (2001:db8:a::/48, 2001:db8:b::/48, 2001:db8:c::/48, then /128s), none of which holds the
  masqueraded destination; conntrack's table is filled with flows to a host in the first.
* **New flows, table full**: masq's IPv6 NAT table (`--nat-max-entries` sizes it as the IPv4
  one) and conntrack (`nf_conntrack_max`, shared by both families) filled as for IPv4.
* **TCP**: connections and the iperf3 stream go to the outside host's IPv6 address.
";

/// One colour a mode, in the order of [`Mode::all`]; the last is the baseline's.
const COLORS: [RGBColor; 5] = [
    RGBColor(120, 120, 120),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Where Debian's fonts-dejavu-core puts its sans-serif font (`cargo xtask bench` installs it).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The plot: one panel per test, the ratio to no NAT against the CIDR count, one line per mode
/// (IPv4: the IPv6 section has one CIDR count).
pub(crate) fn plot(results: &Results, path: &Path) -> Result<()> {
    let figures = results.of(Family::V4);
    let font = std::fs::read(FONT)
        .with_context(|| format!("reading {FONT} (apt-get install fonts-dejavu-core)"))?;
    // plotters keeps registered fonts for the life of the process.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))?;
    let counts = cidr_counts(&figures);
    let max_count = counts.last().copied().unwrap_or(3).max(10) as f64 * 3.0;
    // Room above 1.0 for a mode that beats the reference within noise.
    let top = figures
        .iter()
        .flat_map(|figures| Test::ALL.map(|test| test.of(figures).ratio()))
        .filter(|ratio| ratio.is_finite())
        .fold(1.1f64, f64::max)
        * 1.05;
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(80);
    title.draw(&Text::new(
        "masq against iptables MASQUERADE (IPv4): rate relative to no NAT (1.0 = free)",
        (20, 12),
        ("sans-serif", 26),
    ))?;
    // One legend for the four panels, above them, where it hides no point.
    for (index, (mode, color)) in Mode::all().into_iter().zip(COLORS).enumerate() {
        let x = 20 + i32::try_from(index).unwrap_or(0) * 220;
        title.draw(&PathElement::new(
            vec![(x, 62), (x + 40, 62)],
            ShapeStyle::from(&color).stroke_width(4),
        ))?;
        title.draw(&Text::new(mode.name(), (x + 50, 52), ("sans-serif", 19)))?;
    }
    for (area, test) in body.split_evenly((2, 2)).iter().zip(Test::ALL) {
        let mut chart = ChartBuilder::on(area)
            .caption(test.title(), ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d((2.0f64..max_count).log_scale(), 0.0f64..top)?;
        chart
            .configure_mesh()
            .x_desc("non-masquerade CIDRs")
            .y_desc("ratio to no NAT")
            .x_label_formatter(&|value| format!("{value:.0}"))
            .label_style(("sans-serif", 15))
            .draw()?;
        for (mode, color) in Mode::all().into_iter().zip(COLORS) {
            let points: Vec<(f64, f64)> = if mode == Mode::NoNat {
                counts.iter().map(|&count| (count as f64, 1.0)).collect()
            } else {
                points(&figures, test, mode)
            };
            let style = ShapeStyle::from(&color).stroke_width(3);
            chart.draw_series(LineSeries::new(points.clone(), style))?;
            chart.draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 5, ShapeStyle::from(&color).filled())),
            )?;
        }
    }
    root.present()?;
    Ok(())
}

fn points(figures: &[&Figures], test: Test, mode: Mode) -> Vec<(f64, f64)> {
    figures
        .iter()
        .filter(|figures| figures.mode == mode)
        .map(|figures| (figures.cidrs as f64, test.of(figures).ratio()))
        .filter(|(_, ratio)| ratio.is_finite())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_groups_match_name_prefixes_and_programs_only() {
        let program = format!("masq_ingress{}", crate::profile::PROGRAM_SUFFIX);
        assert!(named_by(&program, MASQ_STREAM_FUNCTIONS));
        assert!(!named_by(&program, NETFILTER_FUNCTIONS));
        assert!(named_by("__nf_conntrack_find_get", NETFILTER_FUNCTIONS));
        assert!(named_by("nft_do_chain", NETFILTER_FUNCTIONS));
        assert!(named_by("bpf_l4_csum_replace", MASQ_STREAM_FUNCTIONS));
        // Parts of other names are not prefixes.
        assert!(!named_by("context_switch", NETFILTER_FUNCTIONS));
        assert!(!named_by("__next_timer_interrupt", NETFILTER_FUNCTIONS));
        assert!(!named_by("bpf_lsm_socket_recvmsg", MASQ_STREAM_FUNCTIONS));
    }
}
