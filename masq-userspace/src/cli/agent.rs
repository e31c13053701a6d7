//! `masq agent`.

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use masq::{
    agent::{self, AgentOptions, BackendOptions, EbpfOptions, IptablesOptions},
    causes::WithCauses,
    config::GoDuration,
    datapath::{
        attach::{AttachMode, HookPosition, HookPositions},
        lifecycle::LifecycleOptions,
        pins::DEFAULT_PIN_PATH,
    },
    iptables::take_over::TakeOverOptions,
    node::{
        self, kernel::supported_kernel, reserved_ports::DEFAULT_SYSCTL_DIR, uplinks::UplinkOptions,
    },
    ports::{SnatPorts, parse_port_range},
};
use masq_common::{
    layout::NOMASQ_V4_MAX_ENTRIES,
    ports::{DEFAULT_NODEPORT_RANGE, PortRange},
};

use super::{
    args::{ConfigArgs, UpstreamFlags},
    check_config::fail,
};

/// `--backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    /// The TC eBPF datapath (IPv4).
    Ebpf,
    /// Upstream's iptables chain, applied the upstream way (IPv4 and IPv6).
    Iptables,
}

/// `--attach-mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AttachModeArg {
    /// tcx where the kernel has it, else tc.
    Auto,
    /// Pinned tcx links.
    Tcx,
    /// clsact qdisc and direct-action cls_bpf filters.
    Tc,
}

/// `--egress-hook-position` and `--ingress-hook-position`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum HookPositionArg {
    /// Before every other program on the hook.
    First,
    /// After every other program on the hook.
    Last,
}

impl HookPositionArg {
    const fn position(self) -> HookPosition {
        match self {
            Self::First => HookPosition::First,
            Self::Last => HookPosition::Last,
        }
    }
}

/// A `--node-ip` other hosts can answer: not unspecified, loopback, multicast or broadcast.
fn parse_node_ip(text: &str) -> Result<Ipv4Addr, String> {
    let address: Ipv4Addr = text
        .parse()
        .map_err(|error| format!("{text:?} is not an IPv4 address: {error}"))?;
    if address.is_unspecified()
        || address.is_loopback()
        || address.is_multicast()
        || address.is_broadcast()
    {
        return Err(format!(
            "{address} cannot be a source address other hosts answer to"
        ));
    }
    Ok(address)
}

#[derive(Args, Debug)]
pub(crate) struct AgentArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    flags: UpstreamFlags,

    /// Which datapath to drive.
    #[arg(long, value_enum, default_value_t = BackendArg::Ebpf)]
    backend: BackendArg,

    /// With the eBPF backend: remove an upstream ip-masq-agent chain (and its POSTROUTING jumps)
    /// instead of refusing to start next to it.
    #[arg(long)]
    take_over_iptables: bool,

    /// An interface to translate on; repeat for several. Each masquerades to its own address, as
    /// MASQUERADE does; with --enable-ipv6 it may have no IPv4 address (IPv4 to be masqueraded
    /// leaving by it is then dropped) [default: every interface traffic leaves the node by: up,
    /// with a global address, and either an Ethernet device backed by a NIC or routing towards
    /// a gateway, or a device without a link-layer header (WireGuard, tun, IP tunnels) that a
    /// route goes through, in that address's family (IPv6 with --enable-ipv6 only); followed
    /// as interfaces, addresses and routes come and go].
    #[arg(long = "interface", value_name = "IFACE")]
    interfaces: Vec<String>,

    /// Address masqueraded traffic leaves with, for a single --interface [default: the
    /// interface's primary IPv4, followed if it changes].
    #[arg(long, value_name = "IP", requires = "interfaces", value_parser = parse_node_ip)]
    node_ip: Option<Ipv4Addr>,

    /// How the programs hang on the interfaces: tcx links (Linux 6.6+), or direct-action
    /// filters on a clsact qdisc (tc, older kernels); auto picks tcx where the kernel has it and
    /// keeps what a previous agent used on an interface.
    #[arg(long, value_enum, default_value_t = AttachModeArg::Auto)]
    attach_mode: AttachModeArg,

    /// Where masq's egress program runs among other tc programs on an uplink: first (later
    /// programs see the node's address and port, as under iptables) or last.
    #[arg(long, value_enum, default_value_t = HookPositionArg::First)]
    egress_hook_position: HookPositionArg,

    /// Where masq's ingress program runs among other tc programs on an uplink: first (no
    /// program before it can keep a reply from being translated back) or last (programs before
    /// it see the node's address and port, as under iptables, but one that ends the chain skips
    /// masq and its replies never reach the pods).
    #[arg(long, value_enum, default_value_t = HookPositionArg::First)]
    ingress_hook_position: HookPositionArg,

    /// bpffs directory where maps and links are pinned; a restarted agent adopts what it finds.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_PATH)]
    pin_path: PathBuf,

    /// NAT table capacity in entries (two per flow) for a fresh install; auto holds as many
    /// flows as the kernel's default conntrack table for the node's memory.
    #[arg(long, value_name = "ENTRIES|auto", default_value = "auto",
          value_parser = parse_nat_capacity)]
    nat_max_entries: NatCapacity,

    /// The most unassured flows one pod may hold, as a percentage of the NAT table's flows: a pod
    /// at its share (one connecting to closed ports, or spraying datagrams) admits a new flow
    /// only in place of one of its own, so it cannot fill the table for the others. Flows opened
    /// from outside towards a pod count against that pod. 0: no limit (conntrack's behaviour).
    #[arg(long, value_name = "PERCENT", default_value_t = DEFAULT_POD_SHARE,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    nat_pod_share: u8,

    /// Capacity of the non-masquerade trie: the most CIDRs (plus link-local) a config may
    /// need. A config that needs more is rejected whole; a new value takes effect at the next
    /// start without dropping flows.
    #[arg(long, value_name = "ENTRIES", default_value_t = NOMASQ_V4_MAX_ENTRIES,
          value_parser = clap::value_parser!(u32).range(1..=16_777_216))]
    nomasq_max_entries: u32,

    /// The cluster's NodePort range; SNAT ports are never taken from it.
    #[arg(long, value_name = "RANGE", default_value_t = DEFAULT_NODEPORT_RANGE, value_parser = parse_port_range)]
    service_node_port_range: PortRange,

    /// How often expired flows are removed (Go duration).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_positive_duration)]
    gc_interval: Duration,

    /// Serve Prometheus metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9523).
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<SocketAddr>,

    /// If the pinned maps come from an incompatible masq version, replace them (live flows are
    /// lost) instead of refusing to start.
    #[arg(long)]
    replace_incompatible_state: bool,

    /// Emit per-packet datapath debug logs (costly; for troubleshooting only).
    #[arg(long)]
    datapath_debug_log: bool,

    /// Where the node's sysctls are; in a container without a writable /proc/sys, a host mount
    /// of it (the port reservation is written there).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SYSCTL_DIR)]
    sysctl_dir: PathBuf,
}

/// `--nat-pod-share`'s default: a quarter of the table, so that at least four pods flooding
/// at once are needed to fill it.
const DEFAULT_POD_SHARE: u8 = 25;

/// `--nat-max-entries`: a number of entries, or sized from the node's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NatCapacity {
    FromMemory,
    Entries(u32),
}

fn parse_nat_capacity(text: &str) -> Result<NatCapacity, String> {
    if text == "auto" {
        return Ok(NatCapacity::FromMemory);
    }
    match text.parse::<u32>() {
        Ok(entries) if entries >= 2 => Ok(NatCapacity::Entries(entries)),
        Ok(_) => Err("a flow takes two entries: at least 2".to_owned()),
        Err(error) => Err(format!("{error} (a number of entries, or auto)")),
    }
}

impl NatCapacity {
    fn entries(self) -> anyhow::Result<u32> {
        match self {
            Self::Entries(entries) => Ok(entries),
            Self::FromMemory => {
                let memory = node::memory::total_memory()
                    .context("reading the node's memory size for --nat-max-entries=auto")?;
                Ok(node::memory::nat_entries_for(memory))
            }
        }
    }
}

fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    GoDuration::parse(text)?
        .to_std()
        .ok_or_else(|| format!("{text:?} must be positive"))
}

impl AgentArgs {
    /// The eBPF backend's options, each part's from its flags.
    fn ebpf_options(&self, snat_ports: SnatPorts) -> anyhow::Result<EbpfOptions> {
        Ok(EbpfOptions {
            lifecycle: LifecycleOptions {
                pin_path: self.pin_path.clone(),
                nat_max_entries: self.nat_max_entries.entries()?,
                nomasq_max_entries: self.nomasq_max_entries,
                ipv6: self.flags.enable_ipv6,
                replace_incompatible_state: self.replace_incompatible_state,
                debug_log: self.datapath_debug_log,
            },
            uplinks: UplinkOptions {
                interfaces: self.interfaces.clone(),
                node_ip: self.node_ip,
                enable_ipv6: self.flags.enable_ipv6,
            },
            upstream_chain: TakeOverOptions {
                chain: self.flags.masq_chain.clone(),
                take_over: self.take_over_iptables,
            },
            attach_mode: match self.attach_mode {
                AttachModeArg::Auto => None,
                AttachModeArg::Tcx => Some(AttachMode::Tcx),
                AttachModeArg::Tc => Some(AttachMode::Tc),
            },
            hook_positions: HookPositions {
                egress: self.egress_hook_position.position(),
                ingress: self.ingress_hook_position.position(),
            },
            snat_ports,
            random_fully: self.flags.random_fully,
            nat_pod_share: self.nat_pod_share,
            timeouts: node::timeouts::of_node(&self.sysctl_dir),
            sysctl_dir: self.sysctl_dir.clone(),
        })
    }
}

pub(crate) fn run(args: &AgentArgs) -> anyhow::Result<ExitCode> {
    // A kernel that cannot run the datapath is refused in one line, before anything is logged
    // or changed on the node.
    if args.backend == BackendArg::Ebpf
        && let Err(error) = supported_kernel()
    {
        return Ok(fail(&WithCauses(&error).to_string()));
    }
    if args.node_ip.is_some() && args.interfaces.len() != 1 {
        return Ok(fail(
            "--node-ip sets the address of one interface; name exactly one --interface with it",
        ));
    }
    let to_ports = match args.flags.to_ports() {
        Ok(to_ports) => to_ports,
        Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
    };
    let backend = match args.backend {
        // The datapath needs ranges it can use.
        BackendArg::Ebpf => match to_ports.snat_ports(args.service_node_port_range) {
            Ok(snat_ports) => BackendOptions::Ebpf(Box::new(args.ebpf_options(snat_ports)?)),
            Err(error) => return Ok(fail(&WithCauses(&error).to_string())),
        },
        // The iptables backend hands --to-ports to the kernel as upstream does.
        BackendArg::Iptables => BackendOptions::Iptables(IptablesOptions {
            chain: args.flags.masq_chain.clone(),
            ipv6: args.flags.enable_ipv6,
            random_fully: args.flags.random_fully,
            to_ports,
        }),
    };
    let options = AgentOptions {
        source: args.config.source(),
        read: args.flags.read_options(),
        enable_ipv6: args.flags.enable_ipv6,
        gc_interval: args.gc_interval,
        metrics_addr: args.metrics_addr,
        backend,
    };
    // The agent's loop runs on this thread (`block_on`) and does its datapath work (a GC pass
    // over a full NAT table, a large reload) synchronously; the metrics and health endpoints
    // are spawned tasks, which run on the runtime's own workers and so keep answering the
    // kubelet's probes meanwhile.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let shutdown = async {
            let mut terminate =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(signal) => signal,
                    Err(error) => {
                        tracing::error!(error = %WithCauses(&error), "cannot listen for SIGTERM");
                        return std::future::pending().await;
                    }
                };
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM received"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
            }
        };
        agent::run(options, shutdown).await
    })?;
    Ok(ExitCode::SUCCESS)
}
