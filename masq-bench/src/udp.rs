//! Small UDP packets from the generator: established flows, and new flows into a full table.

use std::{
    fs,
    net::IpAddr,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use masq::datapath::maps::{DatapathMaps, NatTable};
use masq_common::{
    counters::Counter,
    nat::{Direction, NatEntry, NatKey, proto},
};
use masq_testbed::sandbox::AttachMode;

use crate::{
    cpu::{CpuTimes, thread_time},
    frames::{Family, Frame, Link, ports, udp_flows},
    interleave::{Comparison, Side, Window, alternate},
    paths::{BenchPath, Cores, Mode, pin},
};

/// After a window, the time the last queued frames get to leave the path, so they are not
/// counted in the next window (the veth ring holds 256 frames: well under a millisecond).
const DRAIN: Duration = Duration::from_millis(5);

/// Flow ids of the established-flow test.
const ESTABLISHED_IDS: u64 = 0;
/// Flow ids that fill the table.
const PREFILL_IDS: u64 = 1 << 22;
/// Flow ids of measured new flows; each window takes fresh ones.
const WINDOW_IDS: u64 = 1 << 26;

/// How long and how often.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UdpSettings {
    /// Length of an established-flow window.
    pub(crate) window: Duration,
    /// Window pairs per figure.
    pub(crate) pairs: usize,
    /// Flows the established test cycles through.
    pub(crate) established_flows: u64,
    /// Pairs of new-flow windows.
    pub(crate) new_flow_pairs: usize,
    /// Flows the table holds in the new-flow test, for conntrack at most its global
    /// `nf_conntrack_max`; `None`: exactly that.
    pub(crate) conntrack_flows: Option<u64>,
}

/// Runs `work` on a thread pinned to `core`, so the generator never shares the path's core.
pub(crate) fn on_core<T: Send>(core: usize, work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    thread::scope(|scope| {
        scope
            .spawn(move || {
                pin(0, core)?;
                work()
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// One window: `frames` into `path` until `length` is over (or, without `cycle`, until each was
/// sent once), counting what reached the sink.
pub(crate) fn window(
    path: &BenchPath,
    frames: &[Frame],
    cycle: bool,
    length: Duration,
) -> Result<Window> {
    let cpu_before = CpuTimes::read()?;
    let generator_before = thread_time();
    let path_before = path.path_time();
    let sunk_before = path.sink.packets()?;
    let started = Instant::now();
    let sent = path.tx.send(frames, cycle, started + length)?;
    let sunk = path.sink.packets()?.saturating_sub(sunk_before);
    let seconds = started.elapsed().as_secs_f64();
    let generator_seconds = (thread_time() - generator_before).as_secs_f64();
    let path_seconds = (path.path_time() - path_before).as_secs_f64();
    let cpu = CpuTimes::read()?.since(&cpu_before);
    thread::sleep(DRAIN);
    Ok(Window {
        units: sunk,
        seconds,
        offered: sent.accepted + sent.rejected,
        rejected: sent.rejected,
        cpu,
        generator_seconds,
        path_seconds,
    })
}

/// The frames of flows `ids` from `path`'s pod to its family's sink (masqueraded).
fn sink_flows(path: &BenchPath, ids: std::ops::Range<u64>) -> Vec<Frame> {
    udp_flows(&path.link, path.family.sink(), ids)
}

/// Sends every frame once and lets the path settle: creates the state of established flows.
fn warm(path: &BenchPath, frames: &[Frame]) -> Result<()> {
    for _ in 0..3 {
        path.tx
            .send(frames, false, Instant::now() + Duration::from_secs(5))?;
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Packets per second of established flows, both paths interleaved.
pub(crate) fn established(
    reference: &BenchPath,
    test: &BenchPath,
    settings: &UdpSettings,
    cores: Cores,
) -> Result<Comparison> {
    let ids = || ESTABLISHED_IDS..ESTABLISHED_IDS + settings.established_flows;
    let reference_frames = sink_flows(reference, ids());
    let test_frames = sink_flows(test, ids());
    on_core(cores.generator, || {
        warm(reference, &reference_frames)?;
        warm(test, &test_frames)?;
        alternate(
            settings.pairs,
            |side| match side {
                Side::Reference => window(reference, &reference_frames, true, settings.window),
                Side::Test => window(test, &test_frames, true, settings.window),
            },
            |_| Ok(()),
        )
    })
}

/// The new-flow figure and the state of the table it was measured at.
#[derive(Clone, Debug, Default)]
pub(crate) struct NewFlows {
    pub(crate) comparison: Comparison,
    /// Flows the table holds at most.
    pub(crate) capacity: u64,
    /// Lowest and highest fill of the table during the measured windows, 0 to 1.
    pub(crate) fill: (f64, f64),
    /// New flows measured per window (fresh tuples each).
    pub(crate) window_flows: u64,
    /// New flows the path refused because its table was full (`None`: the baseline's agent
    /// did not say).
    pub(crate) refused_full: Option<u64>,
}

/// `nf_conntrack_max`: a global setting, the same for every namespace.
fn conntrack_max() -> Result<u64> {
    fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_max")
        .context("reading nf_conntrack_max (is nf_conntrack loaded?)")?
        .trim()
        .parse()
        .context("nf_conntrack_max")
}

/// How full the path's table is, and its capacity in flows.
trait Table {
    fn flows(&self) -> Result<u64>;
}

/// masq's table of one family: entries come in pairs, one per direction of a flow.
struct MasqTable<'a> {
    maps: &'a DatapathMaps,
    family: Family,
}

/// Entries in `A`'s NAT table.
fn masq_entries<A: NatTable>(maps: &DatapathMaps) -> u64
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    A::table(maps).keys().filter(Result::is_ok).count() as u64
}

impl Table for MasqTable<'_> {
    fn flows(&self) -> Result<u64> {
        let entries = match self.family {
            Family::V4 => masq_entries::<[u8; 4]>(self.maps),
            Family::V6 => masq_entries::<[u8; 16]>(self.maps),
        };
        Ok(entries / 2)
    }
}

/// masq's count of new flows `family`'s full table refused.
fn refused_full(maps: &DatapathMaps, family: Family) -> Result<u64> {
    let counter = Counter::EgressDropTableFull;
    Ok(match family {
        Family::V4 => maps.counter(counter)?,
        Family::V6 => maps.counter_v6(counter)?,
    })
}

/// The NAT table of a masq path under test, as the new-flow test fills it and deletes each
/// window's flows again.
enum MasqNat {
    /// This revision's agent: its maps, with this revision's types.
    Typed(Box<DatapathMaps>, Family),
    /// The baseline's agent: its table with a layout of its own, whose entries after the fill
    /// are remembered so that whatever a window adds can be deleted.
    Raw(crate::rawnat::RawTable),
}

impl MasqNat {
    fn open(path: &BenchPath) -> Result<Self> {
        Ok(match path.mode {
            Mode::Baseline => Self::Raw(path.baseline_nat()?),
            _ => Self::Typed(Box::new(path.masq_maps()?), path.family),
        })
    }

    /// The table now holds what the windows are to find in it.
    fn filled(&mut self) -> Result<()> {
        match self {
            Self::Typed(..) => Ok(()),
            Self::Raw(table) => table.keep_current(),
        }
    }

    /// Deletes the flows `ids` created from `path`'s pod to its sink (the baseline's: every
    /// entry added since [`MasqNat::filled`]); returns how many there were.
    fn forget(&mut self, path: &BenchPath, ids: std::ops::Range<u64>) -> Result<u64> {
        match self {
            Self::Typed(maps, _) => {
                Ok(forget_masq_flows(maps, &path.link, path.family.sink(), ids))
            }
            Self::Raw(table) => table.forget_new(),
        }
    }

    /// New flows the full table refused so far: the baseline's from its agent's metrics,
    /// which a revision without them leaves unknown.
    fn refused_full(&self, path: &BenchPath) -> Result<Option<u64>> {
        match self {
            Self::Typed(maps, family) => refused_full(maps, *family).map(Some),
            Self::Raw(_) => {
                let family = match path.family {
                    Family::V4 => "ipv4",
                    Family::V6 => "ipv6",
                };
                let series = format!(
                    "masq_datapath_drops_total{{direction=\"egress\",reason=\"table_full\",family=\"{family}\"}}"
                );
                Ok(path
                    .agent
                    .as_ref()
                    .and_then(|agent| agent.metric(&series))
                    .map(|value| value as u64))
            }
        }
    }
}

impl Table for MasqNat {
    fn flows(&self) -> Result<u64> {
        match self {
            Self::Typed(maps, family) => MasqTable {
                maps,
                family: *family,
            }
            .flows(),
            Self::Raw(table) => Ok(table.entries()? / 2),
        }
    }
}

struct Conntrack<'a> {
    path: &'a BenchPath,
}

impl Table for Conntrack<'_> {
    fn flows(&self) -> Result<u64> {
        self.path.conntrack_entries()
    }
}

/// New flows per second while filling a table: below what every path creates, so that a pass
/// creates nearly all it sends and the fill takes seconds, well inside UDP's 30 s lifetime.
const FILL_RATE: f64 = 80_000.0;
/// The longest a fill may take, when a busy machine slows the path down (flows that expire
/// meanwhile are made up for).
const FILL_TIME: Duration = Duration::from_secs(60);

/// Sends new flows to `destination` until the table holds `target` flows. Each pass sends, at
/// [`FILL_RATE`], as many fresh flows (ids from `next_id` on) as are still missing, so a table
/// that does not evict is never overfilled, and flows that expire meanwhile are made up for.
/// A pass whose frames the path refused (other work took its core) does not count against the
/// ten passes a fill may take; [`FILL_TIME`] bounds them all.
fn fill(
    path: &BenchPath,
    table: &dyn Table,
    destination: IpAddr,
    next_id: &mut u64,
    target: u64,
) -> Result<u64> {
    let started = Instant::now();
    let deadline = started + FILL_TIME;
    let mut clean_passes = 0;
    let (mut passes, mut offered, mut refused) = (0, 0, 0);
    let mut flows = table.flows()?;
    while flows < target && clean_passes < 10 && Instant::now() < deadline && !crate::interrupted()
    {
        let missing = target - flows;
        let frames = udp_flows(&path.link, destination, *next_id..*next_id + missing);
        *next_id += missing;
        let sent = path
            .tx
            .send_paced(&frames, false, deadline, Some(FILL_RATE))?;
        if sent.rejected == 0 {
            clean_passes += 1;
        }
        passes += 1;
        offered += sent.accepted + sent.rejected;
        refused += sent.rejected;
        thread::sleep(DRAIN);
        flows = table.flows()?;
    }
    if flows < target * 99 / 100 {
        bail!(
            "{}: the table holds {flows} flows after filling, not {target} ({passes} passes in \
             {:.1} s offered {offered} new flows, the path refused {refused}: is the machine busy?)",
            path.mode.name(),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(flows)
}

/// masq's table filled to capacity by the generator.
pub(crate) struct MasqFill {
    /// Entries in the table.
    pub(crate) entries: u64,
}

impl MasqFill {
    /// Sends new flows into `path` (masq) until its table is full.
    pub(crate) fn to_capacity(path: &BenchPath) -> Result<Self> {
        let maps = path.masq_maps()?;
        let capacity = u64::from(path.nat_entries / 2);
        let table = MasqTable {
            maps: &maps,
            family: path.family,
        };
        let flows = fill(
            path,
            &table,
            path.family.sink(),
            &mut { PREFILL_IDS },
            capacity,
        )?;
        Ok(Self { entries: 2 * flows })
    }
}

/// Removes from masq's table the flows `ids` created from the pod at `link` to `sink`, as the
/// garbage collector frees expired flows on a busy node; returns how many there were.
fn forget_masq_flows(
    maps: &mut DatapathMaps,
    link: &Link,
    sink: IpAddr,
    ids: std::ops::Range<u64>,
) -> u64 {
    match (link.pod, sink) {
        (IpAddr::V4(pod), IpAddr::V4(sink)) => forget(maps, pod.octets(), sink.octets(), ids),
        (IpAddr::V6(pod), IpAddr::V6(sink)) => forget(maps, pod.octets(), sink.octets(), ids),
        _ => 0,
    }
}

/// [`forget_masq_flows`] in `A`'s table.
fn forget<A: NatTable>(maps: &mut DatapathMaps, pod: A, sink: A, ids: std::ops::Range<u64>) -> u64
where
    NatKey<A>: aya::Pod,
    NatEntry<A>: aya::Pod,
{
    let table = A::table_mut(maps);
    let mut removed = 0;
    for id in ids {
        let (source, destination) = ports(id);
        let key = NatKey::new(
            pod,
            sink,
            source,
            destination,
            proto::UDP,
            Direction::Egress,
        );
        if let Ok(entry) = table.get(&key, 0) {
            let peer = key.peer(&entry);
            let _ = table.remove(&peer);
            let _ = table.remove(&key);
            removed += 1;
        }
    }
    removed
}

/// New flows per second, each packet a new 5-tuple, with the path's table filled first.
///
/// conntrack evicts an unreplied flow to admit a new one when it is full, so its table is filled
/// to `nf_conntrack_max` and stays full. masq's table is filled to capacity less the flows one
/// window creates, and after each window those flows are deleted again, as the garbage
/// collector frees expired flows on a busy node (outside the timed windows): what is timed is
/// the admission of a new flow, as the previous revisions (which never evicted) were timed. Each
/// test window sends fresh tuples once; the reference, which keeps no state, gets the same
/// number.
pub(crate) fn new_flows(
    reference: &BenchPath,
    test: &mut BenchPath,
    settings: &UdpSettings,
    cores: Cores,
) -> Result<NewFlows> {
    // The table's capacity in flows, and how far to fill it (all of it but in quick runs).
    let (capacity, target) = match test.mode {
        Mode::Masq | Mode::Baseline => (
            u64::from(test.nat_entries / 2),
            u64::from(test.nat_entries / 2),
        ),
        Mode::Nft | Mode::Legacy => {
            let max = conntrack_max()?;
            (
                max,
                settings.conntrack_flows.map_or(max, |flows| flows.min(max)),
            )
        }
        Mode::NoNat => bail!("the reference has no table"),
    };
    let window_flows = (target / 8).clamp(64, 65_536);
    let reference_frames = sink_flows(reference, WINDOW_IDS..WINDOW_IDS + window_flows);
    let (family, sink) = (test.family, test.family.sink());
    let mut nat = if test.mode.is_masq() {
        Some(MasqNat::open(test)?)
    } else {
        None
    };
    let test_ref: &BenchPath = test;
    on_core(cores.generator, || {
        let mut next_id = WINDOW_IDS;
        let mut take_ids = || {
            let ids = next_id..next_id + window_flows;
            next_id += window_flows;
            ids
        };
        // Flows in the table when a test window starts, and the most a window added.
        let base;
        let mut most_created = 0;
        let mut refused_before = Some(0);
        match nat.as_mut() {
            Some(nat) => {
                // The first fill leaves a whole window of room; a trial window shows how many
                // flows a window really creates, and the room shrinks to twice that (windows vary).
                let mut prefill_ids = PREFILL_IDS;
                fill(
                    test_ref,
                    nat,
                    sink,
                    &mut prefill_ids,
                    capacity - window_flows,
                )?;
                nat.filled()?;
                let ids = take_ids();
                let trial = sink_flows(test_ref, ids.clone());
                window(test_ref, &trial, false, Duration::from_secs(1))?;
                let created = nat.forget(test_ref, ids)?;
                let room = (2 * created + 64).min(window_flows);
                base = fill(test_ref, nat, sink, &mut prefill_ids, capacity - room)?;
                nat.filled()?;
                refused_before = nat.refused_full(test_ref)?;
            }
            None => {
                let table = Conntrack { path: test_ref };
                let exempt = family.exempt_sink();
                base = fill(test_ref, &table, exempt, &mut { PREFILL_IDS }, target)?;
            }
        }
        // The measuring closure reads the current window's frames while the one between windows
        // replaces them: both go through a RefCell.
        let current = std::cell::RefCell::new({
            let ids = take_ids();
            let frames = sink_flows(test_ref, ids.clone());
            (ids, frames)
        });
        let mut lowest = base;
        let comparison = alternate(
            settings.new_flow_pairs,
            |side| match side {
                Side::Reference => {
                    window(reference, &reference_frames, false, Duration::from_secs(1))
                }
                Side::Test => window(test_ref, &current.borrow().1, false, Duration::from_secs(1)),
            },
            |side| {
                if side == Side::Test {
                    let ids = current.borrow().0.clone();
                    match nat.as_mut() {
                        Some(nat) => {
                            let created = nat.forget(test_ref, ids)?;
                            most_created = most_created.max(created);
                        }
                        // conntrack stays full by itself; what matters is that it does.
                        None => lowest = lowest.min(Conntrack { path: test_ref }.flows()?),
                    }
                    let ids = take_ids();
                    let frames = sink_flows(test_ref, ids.clone());
                    *current.borrow_mut() = (ids, frames);
                }
                Ok(())
            },
        )?;
        let refused_full = match nat.as_ref() {
            Some(nat) => nat
                .refused_full(test_ref)?
                .zip(refused_before)
                .map(|(after, before)| after.saturating_sub(before)),
            None => Some(0),
        };
        Ok(NewFlows {
            comparison,
            capacity,
            fill: (
                lowest as f64 / capacity as f64,
                (base + most_created) as f64 / capacity as f64,
            ),
            window_flows,
            refused_full,
        })
    })
}

/// Established flows, then new flows, through one path for `length`, reporting only the rates:
/// something for a profiler to watch.
pub(crate) fn soak(
    mode: Mode,
    cidrs: usize,
    nat_entries: u32,
    cores: Cores,
    length: Duration,
) -> Result<()> {
    let path = BenchPath::new(mode, Family::V4, cidrs, nat_entries, cores)?;
    let established = sink_flows(&path, ESTABLISHED_IDS..ESTABLISHED_IDS + 256);
    let fresh = sink_flows(&path, WINDOW_IDS..WINDOW_IDS + u64::from(nat_entries / 2));
    on_core(cores.generator, || {
        warm(&path, &established)?;
        eprintln!(
            "soak: established flows on core {} for {:?}",
            cores.path,
            length / 2
        );
        let measured = window(&path, &established, true, length / 2)?;
        eprintln!(
            "soak: {:.0} packets/s",
            measured.units as f64 / measured.seconds
        );
        eprintln!(
            "soak: new flows (until the table is full) for {:?}",
            length / 2
        );
        let measured = window(&path, &fresh, true, length / 2)?;
        eprintln!(
            "soak: {:.0} packets/s",
            measured.units as f64 / measured.seconds
        );
        Ok(())
    })
}

/// masq's established packets with its programs attached by a clsact qdisc (tc, the mode of
/// kernels before 6.6) against the same with tcx links, interleaved: what each attach mode's
/// dispatch costs a packet.
pub(crate) fn attach_modes(
    nat_entries: u32,
    settings: &UdpSettings,
    cores: Cores,
) -> Result<Comparison> {
    let path = |attach_mode| {
        BenchPath::attached(Mode::Masq, Family::V4, 3, nat_entries, cores, attach_mode)
    };
    let (tcx, tc) = (path(AttachMode::Tcx)?, path(AttachMode::Tc)?);
    established(&tcx, &tc, settings, cores)
}

/// Where the path's threads spend their time on masq's established and new-flow traffic,
/// sampled by `perf`: the profile that says what bounds each figure.
pub(crate) fn profile_masq(
    nat_entries: u32,
    cores: Cores,
    length: Duration,
) -> Result<crate::profile::Profiles> {
    let reference = BenchPath::new(Mode::NoNat, Family::V4, 3, nat_entries, cores)?;
    let path = BenchPath::new(Mode::Masq, Family::V4, 3, nat_entries, cores)?;
    let ids = || ESTABLISHED_IDS..ESTABLISHED_IDS + 256;
    let reference_frames = sink_flows(&reference, ids());
    let established = sink_flows(&path, ids());
    let mut maps = path.masq_maps()?;
    on_core(cores.generator, || {
        warm(&reference, &reference_frames)?;
        warm(&path, &established)?;
        let established_reference = profile_window(&reference, &reference_frames, length)?;
        let established = profile_window(&path, &established, length)?;
        // As in the new-flow test: the table full but for the flows a window creates, which
        // are deleted again after each window.
        let capacity = u64::from(nat_entries / 2);
        let window_flows = (capacity / 8).clamp(64, 65_536);
        let mut prefill_ids = PREFILL_IDS;
        fill(
            &path,
            &MasqTable {
                maps: &maps,
                family: path.family,
            },
            path.family.sink(),
            &mut prefill_ids,
            capacity - window_flows,
        )?;
        let mut next_id = WINDOW_IDS;
        let started = Instant::now();
        let mut totals = Window::default();
        let mut new_flows = crate::profile::sample(
            crate::profile::Sampled::Threads(path.path_threads()),
            || {
                while started.elapsed() < length && !crate::interrupted() {
                    let ids = next_id..next_id + window_flows;
                    next_id += window_flows;
                    let frames = sink_flows(&path, ids.clone());
                    totals.add(&window(&path, &frames, false, length)?);
                    forget_masq_flows(&mut maps, &path.link, path.family.sink(), ids);
                }
                Ok(())
            },
        )?;
        new_flows.path_ns_per_unit = Some(totals.path_ns_per_unit()).filter(|ns| ns.is_finite());
        Ok(crate::profile::Profiles {
            established,
            established_reference,
            new_flows,
            ..crate::profile::Profiles::default()
        })
    })
    .and_then(|profiles| {
        // The new-flow profile left the table full but for one window's flows: room for the
        // stream's one flow.
        let iptables = BenchPath::new(Mode::Nft, Family::V4, 3, nat_entries, cores)?;
        let streams = crate::tcp::profile_stream(&[&reference, &path, &iptables], length, cores)?;
        let [stream_reference, stream, stream_iptables] =
            <[crate::profile::Profile; 3]>::try_from(streams)
                .map_err(|_| anyhow::anyhow!("a stream profile is missing"))?;
        Ok(crate::profile::Profiles {
            stream,
            stream_reference,
            stream_iptables,
            ..profiles
        })
    })
}

/// The profile of `path`'s threads during one window of `frames`, cycled, with the threads'
/// time per packet in it.
fn profile_window(
    path: &BenchPath,
    frames: &[Frame],
    length: Duration,
) -> Result<crate::profile::Profile> {
    let mut measured = None;
    let mut profile = crate::profile::sample(
        crate::profile::Sampled::Threads(path.path_threads()),
        || {
            measured = Some(window(path, frames, true, length)?);
            Ok(())
        },
    )?;
    profile.path_ns_per_unit = measured.map(|window| window.path_ns_per_unit());
    Ok(profile)
}
