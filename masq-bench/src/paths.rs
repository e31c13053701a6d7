//! The paths measured: one sandbox each (pods, node, router; see `masq_testbed::sandbox`), the
//! node forwarding with no NAT, with upstream's iptables chain (nf_tables or legacy), with
//! masq, or with the masq of an earlier revision (`--baseline-agent`), and the plumbing that
//! lets the generator saturate the node without being the limit.

use std::{
    collections::BTreeSet,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use masq::datapath::maps::DatapathMaps;
use masq_testbed::{
    agent::Agent,
    netns::Netns,
    sandbox::{AttachMode, Sandbox, SandboxOptions, UPLINK},
};

use crate::{
    config::Config,
    frames::{Family, Link},
    tx::{PacketTx, RxCounter},
};

/// What the node does to pod traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Mode {
    /// Plain forwarding: the reference every other mode is a ratio to.
    NoNat,
    /// Upstream's chain, applied by `masq agent --backend iptables` with iptables-nft.
    Nft,
    /// The same chain with iptables-legacy (x_tables).
    Legacy,
    /// masq's eBPF datapath.
    Masq,
    /// The `masq` agent of an earlier revision ([`baseline`]), with the datapath it embeds.
    Baseline,
}

impl Mode {
    /// Every mode of this run: the reference, then [`Mode::compared`].
    pub(crate) fn all() -> Vec<Self> {
        std::iter::once(Self::NoNat)
            .chain(Self::compared())
            .collect()
    }

    /// Every mode compared with the reference: the baseline only when the run has one.
    pub(crate) fn compared() -> Vec<Self> {
        let mut modes = vec![Self::Nft, Self::Legacy, Self::Masq];
        if baseline().is_some() {
            modes.push(Self::Baseline);
        }
        modes
    }

    /// Whether the mode takes part in `family`'s traffic: the baseline only if its agent
    /// knows that family.
    pub(crate) fn runs(self, family: Family) -> bool {
        match self {
            Self::Baseline => baseline().is_some_and(|baseline| match family {
                Family::V4 => true,
                Family::V6 => baseline.ipv6,
            }),
            Self::NoNat | Self::Nft | Self::Legacy | Self::Masq => true,
        }
    }

    /// Whether a masq agent runs this path (this revision's or the baseline's).
    pub(crate) const fn is_masq(self) -> bool {
        matches!(self, Self::Masq | Self::Baseline)
    }

    /// The name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::NoNat => "no NAT",
            Self::Nft => "iptables-nft",
            Self::Legacy => "iptables-legacy",
            Self::Masq => "masq",
            Self::Baseline => baseline().map_or("masq@baseline", |baseline| &baseline.name),
        }
    }

    /// Whether `name` (from `--modes`) selects this mode: the end of its name (`nft`), or
    /// `baseline` for the baseline.
    pub(crate) fn is_named(self, name: &str) -> bool {
        self.name().ends_with(name) || (self == Self::Baseline && name == "baseline")
    }
}

/// The earlier revision's agent a run compares masq with.
#[derive(Debug)]
pub(crate) struct Baseline {
    /// Its `masq` binary, which embeds that revision's datapath and creates its own maps.
    pub(crate) agent: PathBuf,
    /// The revision, as given (a short commit id).
    pub(crate) revision: String,
    /// The mode's name in reports: `masq@<revision>`.
    pub(crate) name: String,
    /// Whether its agent has `--enable-ipv6` (it then takes part in the IPv6 traffic).
    pub(crate) ipv6: bool,
}

static BASELINE: OnceLock<Baseline> = OnceLock::new();

/// The run's baseline, if it has one.
pub(crate) fn baseline() -> Option<&'static Baseline> {
    BASELINE.get()
}

/// Makes `agent`, built from `revision`, the run's baseline (once, before any path starts).
pub(crate) fn set_baseline(agent: PathBuf, revision: &str) -> Result<()> {
    let help = Command::new(&agent)
        .args(["agent", "--help"])
        .output()
        .with_context(|| format!("running {}", agent.display()))?;
    if !help.status.success() {
        bail!(
            "{} agent --help failed: {}",
            agent.display(),
            String::from_utf8_lossy(&help.stderr).trim()
        );
    }
    let ipv6 = String::from_utf8_lossy(&help.stdout).contains("--enable-ipv6");
    BASELINE
        .set(Baseline {
            agent,
            revision: revision.to_owned(),
            name: format!("masq@{revision}"),
            ipv6,
        })
        .map_err(|_| anyhow::anyhow!("the baseline was set twice"))
}

/// The agent's garbage collection interval: its default.
pub(crate) const GC_INTERVAL: &str = "10s";

/// A neighbour of the node's uplink that no host answers for: where the sinks' traffic goes.
const NOWHERE: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 253);
/// [`NOWHERE`] on the uplink's IPv6 network.
const NOWHERE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xfd);

/// [`NOWHERE`] of `family`.
fn nowhere(family: Family) -> IpAddr {
    match family {
        Family::V4 => NOWHERE.into(),
        Family::V6 => NOWHERE_V6.into(),
    }
}

/// The two cores the UDP measurements use: the generator's, and the one the path under test
/// runs on (the NAPI thread of the pod's veth and the softirq work after it). The TCP stream's
/// client and server run on them too, in that order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cores {
    pub(crate) generator: usize,
    pub(crate) path: usize,
}

impl Cores {
    /// The first two cores this process may run on (one core: both, and the report says the
    /// generator shares its core with the path).
    pub(crate) fn pick() -> Result<Self> {
        let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
            .context("sched_getaffinity")?;
        let cores: Vec<usize> = (0..nix::sched::CpuSet::count())
            .filter(|&core| allowed.is_set(core).unwrap_or(false))
            .take(2)
            .collect();
        match cores.as_slice() {
            [generator, path] => Ok(Self {
                generator: *generator,
                path: *path,
            }),
            [only] => Ok(Self {
                generator: *only,
                path: *only,
            }),
            _ => bail!("no core to run on"),
        }
    }
}

/// Pins thread or process `pid` (0: the calling thread) to `core`.
pub(crate) fn pin(pid: i32, core: usize) -> Result<()> {
    let mut set = nix::sched::CpuSet::new();
    set.set(core)?;
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(pid), &set)
        .with_context(|| format!("pinning {pid} to core {core}"))
}

/// The ids of NAPI threads of interfaces named `device` (in any namespace).
fn napi_threads(device: &str) -> BTreeSet<i32> {
    let prefix = format!("napi/{device}-");
    let Ok(entries) = fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.starts_with(&prefix))
        })
        .collect()
}

/// The ksoftirqd thread of `core`.
fn ksoftirqd(core: usize) -> Option<i32> {
    let name = format!("ksoftirqd/{core}");
    fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == name)
        })
}

/// Trie capacity masq needs for `cidrs` CIDRs (plus link-local), at least its default.
pub(crate) fn trie_capacity(cidrs: usize) -> u32 {
    u32::try_from(cidrs + 16)
        .unwrap_or(u32::MAX)
        .max(masq_common::layout::NOMASQ_V4_MAX_ENTRIES)
}

/// Upstream's chain for `config` in `node`'s legacy (x_tables) tables of `family`, as the
/// agent's iptables backend writes it: the chain, the POSTROUTING jump, then the rules through
/// `iptables-restore --noflush` (`ip6tables-restore`) of what `masq render-iptables` prints.
fn apply_legacy(node: &Netns, config: &Config, family: Family) -> Result<()> {
    let program = match family {
        Family::V4 => "iptables-legacy",
        Family::V6 => "ip6tables-legacy",
    };
    let chain = masq::iptables::render::DEFAULT_CHAIN;
    node.exec(program, &["-w", "-t", "nat", "-N", chain]);
    let jump = masq::iptables::render::postrouting_jump_args(chain);
    let mut args = vec!["-w", "-t", "nat", "-A", "POSTROUTING"];
    args.extend(jump.iter().map(String::as_str));
    node.exec(program, &args);
    crate::apply::restore(
        node,
        &format!("{program}-restore"),
        &crate::apply::render(config, family)?,
    )?;
    Ok(())
}

/// One measured path. Fields drop in order: the agent goes before its namespaces.
#[derive(Debug)]
pub(crate) struct BenchPath {
    pub(crate) mode: Mode,
    /// The family of the traffic measured (an IPv6 path's sandbox is dual-stack).
    pub(crate) family: Family,
    /// Entries masq's NAT table holds (`--nat-max-entries`).
    pub(crate) nat_entries: u32,
    pub(crate) tx: PacketTx,
    /// Packets that left the node towards the sinks (the router's receive counter).
    pub(crate) sink: RxCounter,
    pub(crate) link: Link,
    /// The kernel threads that run this path on its core: the veth's NAPI thread, and the
    /// core's ksoftirqd should softirq work be deferred to it.
    path_threads: Vec<i32>,
    pub(crate) agent: Option<Agent>,
    pub(crate) sandbox: Sandbox,
    config: Config,
}

impl BenchPath {
    /// A fresh sandbox in `mode` with `cidrs` non-masquerade CIDRs of `family`, ready for the
    /// generator to send traffic of that family. For IPv6 the sandbox is dual-stack and the
    /// agent runs with `--enable-ipv6`.
    pub(crate) fn new(
        mode: Mode,
        family: Family,
        cidrs: usize,
        nat_entries: u32,
        cores: Cores,
    ) -> Result<Self> {
        Self::attached(mode, family, cidrs, nat_entries, cores, AttachMode::Tcx)
    }

    /// [`BenchPath::new`] with the agent attaching its programs in `attach_mode`.
    pub(crate) fn attached(
        mode: Mode,
        family: Family,
        cidrs: usize,
        nat_entries: u32,
        cores: Cores,
        attach_mode: AttachMode,
    ) -> Result<Self> {
        let sandbox = Sandbox::new("bn", SandboxOptions::in_mode(attach_mode));
        if family == Family::V6 {
            sandbox.add_ipv6();
        }
        let mut path_threads = prepare_for_generator(&sandbox, cores, family)?;
        path_threads.extend(ksoftirqd(cores.path));
        let config = Config::write(
            &std::env::temp_dir().join(format!("{}-config", sandbox.tag)),
            family,
            cidrs,
            false,
        )?;
        let [source_flag, source] = config.args();
        let mut args = vec![source_flag.as_str(), source.as_str()];
        if family == Family::V6 {
            args.push("--enable-ipv6");
        }
        let agent = match mode {
            Mode::NoNat => None,
            Mode::Nft => {
                args.extend(["--backend", "iptables"]);
                Some(Agent::start(&sandbox, &args))
            }
            // The DaemonSet grants no CAP_NET_RAW, which iptables-legacy needs (its rules go
            // through a raw socket): the chain the agent would write is applied as root.
            Mode::Legacy => {
                apply_legacy(&sandbox.node, &config, family)?;
                None
            }
            // The baseline runs exactly as masq does, from its own binary.
            Mode::Masq | Mode::Baseline => {
                let entries = nat_entries.to_string();
                let trie = trie_capacity(cidrs).to_string();
                let args = [
                    args.as_slice(),
                    &[
                        "--nat-max-entries",
                        &entries,
                        "--nomasq-max-entries",
                        &trie,
                        // The agent's default: the tests' 1 s would have the collector
                        // walk the whole table every second, on the cores being measured.
                        "--gc-interval",
                        GC_INTERVAL,
                    ],
                ]
                .concat();
                Some(match (mode, baseline()) {
                    (Mode::Baseline, Some(baseline)) => {
                        Agent::start_binary(&sandbox, &baseline.agent, &args)
                    }
                    (Mode::Baseline, None) => bail!("no baseline agent was given"),
                    // One generator stands for all of a node's pods: no share of the table is
                    // kept from it (revisions before the share had none).
                    _ => Agent::start(
                        &sandbox,
                        &[args.as_slice(), &["--nat-pod-share", "0"]].concat(),
                    ),
                })
            }
        };
        if family == Family::V6 {
            wait_for_link_local(&sandbox)?;
        }
        let link = Link {
            source: mac(sandbox.pod(1), "eth0")?,
            gateway: mac(&sandbox.node, "vpod1")?,
            pod: family.pod(1),
        };
        Ok(Self {
            mode,
            family,
            nat_entries,
            tx: PacketTx::open(sandbox.pod(1), "eth0")?,
            sink: RxCounter::open(&sandbox.router, "eth0")?,
            link,
            path_threads,
            agent,
            sandbox,
            config,
        })
    }

    /// CPU time the path's kernel threads have used so far: the path's own cost, whatever
    /// else runs on its core. Read through each thread's CPU clock, which, unlike
    /// `/proc/PID/schedstat`, includes the time of a thread that is running right now.
    pub(crate) fn path_time(&self) -> Duration {
        self.path_threads
            .iter()
            .filter_map(|&thread| {
                let mut clock: libc::clockid_t = 0;
                // SAFETY: `clock` is a valid place for the id.
                if unsafe { libc::clock_getcpuclockid(thread, &raw mut clock) } != 0 {
                    return None;
                }
                nix::time::clock_gettime(nix::time::ClockId::from_raw(clock))
                    .ok()
                    .map(Duration::from)
            })
            .sum()
    }

    /// The kernel threads that run the path (the pod veth's NAPI thread, the core's ksoftirqd).
    pub(crate) fn path_threads(&self) -> &[i32] {
        &self.path_threads
    }

    /// The config the agent reads.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// masq's maps, opened through the agent's pins (this revision's layout).
    pub(crate) fn masq_maps(&self) -> Result<DatapathMaps> {
        let agent = self.agent.as_ref().context("no agent")?;
        DatapathMaps::from_pins(agent.pin_path()).context("opening masq's pinned maps")
    }

    /// The baseline's NAT table of this path's family, through its pin: its layout is the
    /// baseline's own.
    pub(crate) fn baseline_nat(&self) -> Result<crate::rawnat::RawTable> {
        let agent = self.agent.as_ref().context("no agent")?;
        crate::rawnat::RawTable::open(agent.pin_path(), self.family)
    }

    /// Conntrack entries in the node's namespace.
    pub(crate) fn conntrack_entries(&self) -> Result<u64> {
        let output = self
            .sandbox
            .node
            .exec("sysctl", &["-n", "net.netfilter.nf_conntrack_count"]);
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .context("nf_conntrack_count")
    }
}

/// Makes pod 1 a traffic source the path cannot blame: its veth's receiving side on the node
/// runs in a NAPI thread pinned to the path's core, so the generator's core only queues frames;
/// and the traffic ends as soon as it has left the node.
fn prepare_for_generator(sandbox: &Sandbox, cores: Cores, family: Family) -> Result<Vec<i32>> {
    // veth hands a sender's packets to the peer's NAPI ring only when the sender does no TSO
    // (or the peer aggregates forwarded UDP, which would change what is measured).
    sandbox
        .pod(1)
        .exec("ethtool", &["-K", "eth0", "tso", "off"]);
    // GRO on a veth gives its receive side a NAPI context; "threaded" runs it in a kthread.
    sandbox.node.exec("ethtool", &["-K", "vpod1", "gro", "on"]);
    let before = napi_threads("vpod1");
    // `ip netns exec` mounts the namespace's own /sys, where the device's attributes are.
    let status = Command::new("ip")
        .args(["netns", "exec", sandbox.node.name(), "sh", "-c"])
        .arg("echo 1 > /sys/class/net/vpod1/threaded")
        .status()
        .context("ip netns exec")?;
    if !status.success() {
        bail!("could not make vpod1's NAPI threaded");
    }
    let threads: Vec<i32> = napi_threads("vpod1").difference(&before).copied().collect();
    if threads.is_empty() {
        bail!("vpod1 has no NAPI thread: this kernel's veth lacks threaded NAPI");
    }
    for &thread in &threads {
        pin(thread, cores.path)?;
    }
    // The node sends the sinks' traffic to a neighbour that does not exist (a permanent entry,
    // so no ARP), and the router's interface, seeing a frame for another host, drops it right
    // where IP input starts. The node does all its usual work (routing, the NAT under test,
    // transmission), and the sink adds as little as possible to every path alike: a route to
    // nowhere (blackhole) would cost the router a route allocation per packet.
    let nowhere = nowhere(family).to_string();
    sandbox.node.ip(&[
        "neigh",
        "add",
        &nowhere,
        "lladdr",
        "02:00:00:00:00:fe",
        "dev",
        UPLINK,
        "nud",
        "permanent",
    ]);
    for sink in [family.sink(), family.exempt_sink()] {
        sandbox
            .node
            .ip(&["route", "add", &sink.to_string(), "via", &nowhere]);
    }
    Ok(threads)
}

/// Waits until no address of the sandbox is tentative. The link-local addresses every interface
/// gets when it comes up go through duplicate address detection (about 2 s), and until then the
/// hops cannot resolve each other over IPv6: a TCP test's first connections would wait for SYN
/// retransmissions, which is not what is measured.
fn wait_for_link_local(sandbox: &Sandbox) -> Result<()> {
    let namespaces: Vec<&Netns> = sandbox
        .pods
        .iter()
        .chain([&sandbox.node, &sandbox.router, &sandbox.outside])
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let tentative = namespaces.iter().any(|netns| {
            !netns
                .ip(&["-6", "addr", "show", "tentative"])
                .stdout
                .is_empty()
        });
        if !tentative {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("IPv6 addresses of the sandbox are still tentative after 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The MAC address of `device` in `netns`.
fn mac(netns: &Netns, device: &str) -> Result<[u8; 6]> {
    let output = netns.ip(&["-j", "link", "show", device]);
    let links: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let text = links[0]["address"]
        .as_str()
        .context("no link address")?
        .to_owned();
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(text.split(':')) {
        *byte = u8::from_str_radix(part, 16)?;
    }
    Ok(mac)
}
