//! `masq agent`: the node daemon.
//!
//! With the eBPF backend, startup order matters for correctness:
//!
//! 1. find the interfaces traffic leaves the node by and their addresses; refuse to run next
//!    to an upstream iptables chain unless told to take it over;
//! 2. adopt the pinned maps if a previous agent left a compatible set (restarts and upgrades
//!    keep every flow), or create and pin fresh ones;
//! 3. read the config and fill the non-masquerade trie (a diff against what is there);
//! 4. write the settings, which enable translation;
//! 5. reserve the SNAT ports from the node's own ephemeral allocation;
//! 6. attach the programs to every uplink, swapping them into the links or filters a previous
//!    agent left, and record each uplink's address in the datapath.
//!
//! Translation is never enabled before the trie holds the exemptions. Afterwards the agent
//! re-reads the config when its directory changes and every resync interval, applies changes,
//! follows interfaces and addresses as they come and go, checks that no upstream chain came
//! back, collects expired flows, and serves metrics. Stopping it, or killing it, leaves the
//! datapath running from its pins; [`crate::datapath::lifecycle::uninstall`] (`masq uninstall`)
//! removes it.
//!
//! The iptables backend instead rewrites upstream's chain on every sync, like upstream.

mod ebpf;
mod iptables_backend;
pub mod metrics;
pub mod status;

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::time::{Instant, sleep_until};

use self::{
    ebpf::EbpfBackend,
    iptables_backend::IptablesBackend,
    status::{BypassedPolicy, ConfigFailure, IpsecStatus, SharedStatus},
};
pub use self::{ebpf::EbpfOptions, iptables_backend::IptablesOptions};
use crate::{
    causes::WithCauses,
    config::source::{ConfigSource, EffectiveConfig, ReadOptions, load as load_config},
    datapath::{DatapathError, lifecycle::LifecycleError},
    ipsec::{self, SnatUplink},
    iptables::{apply::IptablesError, take_over::TakeOverError},
    node::{
        interfaces,
        uplinks::{UplinkError, UplinkIpv6},
    },
    policy::Policy,
    sys::{inotify::DirectoryWatch, interface_watch::InterfaceWatch},
};

/// How the agent runs: where its config comes from and how often it looks again, where it
/// reports, and the datapath it drives with that datapath's own options.
#[derive(Clone, Debug)]
pub struct AgentOptions {
    /// Where the config comes from.
    pub source: ConfigSource,
    /// How it is read.
    pub read: ReadOptions,
    /// `--enable-ipv6`: the policy covers IPv6 too.
    pub enable_ipv6: bool,
    /// How often expired flows are collected.
    pub gc_interval: Duration,
    /// Where to serve metrics and health.
    pub metrics_addr: Option<SocketAddr>,
    /// Which datapath, and how it runs.
    pub backend: BackendOptions,
}

/// Which datapath the agent drives, and how.
#[derive(Clone, Debug)]
pub enum BackendOptions {
    /// The TC eBPF datapath.
    Ebpf(Box<EbpfOptions>),
    /// Upstream's iptables chain.
    Iptables(IptablesOptions),
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// There is nothing (or not what was named) to translate on.
    #[error(transparent)]
    Uplinks(#[from] UplinkError),
    /// The eBPF datapath failed.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// The kernel cannot run the datapath.
    #[error(transparent)]
    Kernel(#[from] crate::node::kernel::KernelError),
    /// iptables failed.
    #[error(transparent)]
    Iptables(#[from] IptablesError),
    /// The pinned datapath could not be installed or adopted.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// Upstream's chain is in the way.
    #[error(transparent)]
    TakeOver(#[from] TakeOverError),
    /// tcx was asked for on a kernel without it.
    #[error("--attach-mode tcx needs Linux 6.6 or later; use --attach-mode tc (or auto)")]
    TcxUnsupported,
    /// The metrics endpoint could not be served.
    #[error("serving metrics on {addr}")]
    Metrics {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// What the agent drives. The agent reads configs, keeps time and reports status; a backend
/// turns the policy into what the kernel does to packets. Only the eBPF backend follows
/// interfaces and flows, so those hooks do nothing by default.
trait Backend {
    /// Whether translation is on: a valid config was applied (or adopted with the pins).
    fn enabled(&self) -> bool;

    /// Brings the kernel in line with `policy`. Returns the entries it took (trie entries or
    /// rules), for the status.
    fn apply(&mut self, policy: &Policy, trigger: &'static str) -> Result<usize, AgentError>;

    /// What stays in place once the agent stops, for the log.
    fn left_in_place(&self) -> &'static str;

    /// Completes startup once the first config was read.
    fn finish_startup(&mut self, _status: &SharedStatus) -> Result<(), AgentError> {
        Ok(())
    }

    /// Whether it translates on the node's uplinks, which it then follows as they change (and
    /// without which it is not ready).
    fn translates_on_uplinks(&self) -> bool {
        false
    }

    /// Follows the uplinks after an interface change.
    fn follow_uplinks(&mut self, _status: &SharedStatus) {}

    /// The periodic check beyond re-reading the config.
    fn resync(&mut self, _status: &SharedStatus) {}

    /// Removes expired flows.
    fn collect_garbage(&mut self, _status: &SharedStatus) {}
}

struct Agent {
    options: AgentOptions,
    backend: Box<dyn Backend>,
    /// The config in force, once one was valid.
    config: Option<Arc<EffectiveConfig>>,
    status: SharedStatus,
    /// What the last IPsec check logged, so that a finding is logged once per change.
    ipsec_logged: Option<IpsecStatus>,
}

/// The longest error text the agent repeats in logs, `/readyz` and status.
const MAX_ERROR_TEXT: usize = 1024;

/// `text`, cut to [`MAX_ERROR_TEXT`] bytes at a character boundary, saying how much was cut.
fn bounded(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} more bytes)", &text[..end], text.len() - end)
}

/// Runs the agent until `shutdown` completes. With the eBPF backend the datapath stays
/// attached afterwards.
pub async fn run(
    options: AgentOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let status = SharedStatus::default();
    status.lock().started = Some(SystemTime::now());
    // The port is taken before anything changes on the node: an address in use stops the
    // agent before it attaches or reserves anything.
    let pin_path = match &options.backend {
        BackendOptions::Ebpf(ebpf) => Some(ebpf.lifecycle.pin_path.clone()),
        BackendOptions::Iptables(_) => None,
    };
    let _metrics = match options.metrics_addr {
        Some(addr) => Some(
            metrics::serve(addr, status.clone(), pin_path)
                .await
                .map_err(|source| AgentError::Metrics { addr, source })?,
        ),
        None => None,
    };
    let backend: Box<dyn Backend> = match &options.backend {
        BackendOptions::Ebpf(ebpf) => Box::new(EbpfBackend::start((**ebpf).clone(), &status)?),
        BackendOptions::Iptables(iptables) => Box::new(IptablesBackend::start(iptables.clone())?),
    };
    let mut agent = Agent {
        options,
        backend,
        config: None,
        status: status.clone(),
        ipsec_logged: None,
    };
    // Watching starts before the first read: a config swapped in while the datapath is still
    // being attached is then picked up at once, not at the next resync.
    let watch = agent.watch();
    agent.reload("startup");
    agent.backend.finish_startup(&agent.status)?;
    agent.update_readiness();
    agent.check_ipsec();
    agent.run(watch, shutdown).await;
    Ok(())
}

impl Agent {
    async fn run(&mut self, watch: Option<DirectoryWatch>, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut watch = watch;
        let mut interfaces = if self.backend.translates_on_uplinks() {
            InterfaceWatch::new()
                .inspect_err(|error| tracing::warn!(error = %WithCauses(error), "cannot watch interface changes; they are picked up at the next resync"))
                .ok()
        } else {
            None
        };
        let mut next_resync = Instant::now() + self.resync_interval();
        let mut next_gc = Instant::now() + self.options.gc_interval;
        loop {
            tokio::select! {
                () = &mut shutdown => {
                    tracing::info!("stopping; {}", self.backend.left_in_place());
                    return;
                }
                () = sleep_until(next_resync) => {
                    self.reload("resync");
                    self.backend.resync(&self.status);
                    self.update_readiness();
                    self.check_ipsec();
                    if watch.is_none() {
                        watch = self.watch();
                    }
                    next_resync = Instant::now() + self.resync_interval();
                }
                changed = async {
                    match watch.as_mut() {
                        Some(watch) => watch.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Err(error) = changed {
                        tracing::warn!(error = %WithCauses(&error), "config watch failed; relying on the resync interval");
                        watch = None;
                        continue;
                    }
                    // The kubelet's swap is several renames; let it settle.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    self.reload("change");
                    self.check_ipsec();
                }
                changed = async {
                    match interfaces.as_mut() {
                        Some(watch) => watch.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Err(error) = changed {
                        tracing::warn!(error = %WithCauses(&error), "interface watch failed; relying on the resync interval");
                        interfaces = None;
                        continue;
                    }
                    // An interface comes up as a burst of link, address and route events.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if let Some(watch) = interfaces.as_mut() {
                        let _ = tokio::time::timeout(Duration::ZERO, watch.changed()).await;
                    }
                    self.backend.follow_uplinks(&self.status);
                    self.update_readiness();
                    self.check_ipsec();
                }
                () = sleep_until(next_gc) => {
                    self.backend.collect_garbage(&self.status);
                    next_gc = Instant::now() + self.options.gc_interval;
                }
            }
        }
    }

    /// The directory whose changes mean a config change.
    fn watched_directory(&self) -> PathBuf {
        match &self.options.source {
            ConfigSource::Directory(dir) => dir.clone(),
            ConfigSource::File(path) => path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        }
    }

    fn watch(&self) -> Option<DirectoryWatch> {
        let dir = self.watched_directory();
        match DirectoryWatch::new(&dir) {
            Ok(watch) => Some(watch),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), error = %WithCauses(&error), "cannot watch the config directory; changes apply at the next resync");
                None
            }
        }
    }

    fn resync_interval(&self) -> Duration {
        let configured = self
            .config
            .as_ref()
            .map_or(self.options.read.resync_interval, |config| {
                config.raw.resync_interval
            });
        // Upstream busy-loops on zero or negative intervals; a second is the floor here.
        configured
            .to_std()
            .map_or(Duration::from_secs(1), |interval| {
                interval.max(Duration::from_secs(1))
            })
    }

    /// Reads the config; a valid one replaces the one in force, an invalid one is reported and
    /// changes nothing.
    fn reload(&mut self, trigger: &'static str) {
        match load_config(&self.options.source, &self.options.read).map(Arc::new) {
            Ok(config) => match self.apply(config, trigger) {
                Ok(()) => {
                    let mut state = self.status.lock();
                    state.reloads_ok += 1;
                    state.last_success = Some(SystemTime::now());
                    state.last_error = None;
                }
                Err(error) => {
                    let reason = match &error {
                        AgentError::Datapath(DatapathError::TrieCapacity(_)) => "capacity",
                        _ => "apply",
                    };
                    self.record_failure(
                        reason,
                        &format!("applying the config: {}", WithCauses(&error)),
                    );
                }
            },
            Err(error) => self.record_failure(error.reason(), &WithCauses(&error).to_string()),
        }
        self.update_readiness();
    }

    fn record_failure(&self, reason: &'static str, message: &str) {
        // A config's own text can end up in its error (a 1 MiB "CIDR"): logs, /readyz and
        // status get a bounded excerpt.
        let message = bounded(message);
        tracing::error!(error = %message, reason, "Error syncing configuration; keeping the config in force");
        let mut state = self.status.lock();
        state.reloads_failed += 1;
        state.last_failure = Some(SystemTime::now());
        state.last_error = Some(ConfigFailure { reason, message });
    }

    fn apply(
        &mut self,
        config: Arc<EffectiveConfig>,
        trigger: &'static str,
    ) -> Result<(), AgentError> {
        let policy = Policy::shared(Arc::clone(&config), self.options.enable_ipv6);
        let entries = self.backend.apply(&policy, trigger)?;
        // Compared once the datapath has it: a change is in force before it is logged.
        if self.config.as_ref() != Some(&config) {
            tracing::info!(trigger, origin = %config.origin, "Using config: {}", config.raw.to_go_json());
            for sourced in policy.ineffective_masquerade_cidrs() {
                tracing::warn!(cidr = %sourced.cidr, origin = %sourced.origin, "masqueradeCIDRs entry changes nothing: no non-masquerade range holds it, so its traffic is masqueraded anyway");
            }
            let mut state = self.status.lock();
            state.config_origin = Some(config.origin.to_string());
            state.list_cidrs = status::ListCidrs::of(&config);
            state.trie_entries = entries;
        } else {
            tracing::debug!(trigger, "config unchanged");
        }
        self.config = Some(config);
        Ok(())
    }

    /// Looks for XFRM output policies that masq's translation bypasses (see [`ipsec`]) and
    /// reports them: in the status the metrics are read from, and in the log once per change. Run after every config load, uplink change and resync: policies change behind
    /// masq's back (an IPsec daemon installs them), and no netlink group announces them to a
    /// process without a subscription it would have to keep reading.
    fn check_ipsec(&mut self) {
        // Only the eBPF datapath translates after the lookup; nothing is translated before a
        // config is in force.
        if !self.backend.translates_on_uplinks() {
            return;
        }
        let Some(config) = &self.config else {
            return;
        };
        let policy = Policy::shared(Arc::clone(config), self.options.enable_ipv6);
        let nomasq = || ipsec::exempt_networks(&policy.nomasq_v4(), &policy.nomasq_v6());
        let uplinks = self
            .status
            .lock()
            .uplinks
            .iter()
            .map(|uplink| SnatUplink {
                ifindex: interfaces::interface_index(&uplink.interface).unwrap_or(0),
                name: uplink.interface.clone(),
                ipv4: uplink.node_ip,
                ipv6: match uplink.ipv6 {
                    UplinkIpv6::Address(address) => Some(address),
                    UplinkIpv6::NotTranslated | UplinkIpv6::NoAddress => None,
                },
            })
            .collect();
        let found = match ipsec::check(uplinks, nomasq) {
            Ok(bypassed) => IpsecStatus::Checked(
                bypassed
                    .iter()
                    .map(|bypass| BypassedPolicy {
                        family: bypass.family(),
                        description: bypass.describe(),
                    })
                    .collect(),
            ),
            Err(error) => IpsecStatus::Unknown(WithCauses(&error).to_string()),
        };
        if self.ipsec_logged.as_ref() != Some(&found) {
            match &found {
                IpsecStatus::Checked(bypassed) if bypassed.is_empty() => {
                    if self.ipsec_logged.is_some() {
                        tracing::info!(
                            "no XFRM (IPsec) output policy selects masqueraded traffic only after translation any more"
                        );
                    }
                }
                IpsecStatus::Checked(bypassed) => {
                    let policies: Vec<&str> = bypassed
                        .iter()
                        .map(|policy| policy.description.as_str())
                        .collect();
                    tracing::warn!(
                        count = bypassed.len(),
                        policies = %policies.join("; "),
                        "XFRM (IPsec) output policies select masqueraded traffic only after translation: MASQUERADE would have applied them, but masq translates after the kernel's only policy lookup, so this traffic leaves in clear text (and a block policy does not drop it). Make the policies select the pods' addresses too, or run this node with --backend iptables (see docs/operating.md, IPsec)"
                    );
                }
                IpsecStatus::Unknown(error) => {
                    tracing::warn!(%error, "cannot read the XFRM (IPsec) policies: masqueraded traffic a policy would select only after translation would leave in clear text unnoticed");
                }
            }
            self.ipsec_logged = Some(found.clone());
        }
        self.status.lock().ipsec = Some(found);
    }

    fn update_readiness(&self) {
        let enabled = self.backend.enabled();
        let mut state = self.status.lock();
        let reason = if !enabled {
            Some(state.last_error.as_ref().map_or_else(
                || "no valid config in force".to_owned(),
                |error| error.message.clone(),
            ))
        } else if let Some(chain) = &state.upstream_chain {
            Some(format!(
                "the ip-masq-agent chain {chain} is installed and masquerades before masq; remove upstream ip-masq-agent or run with --take-over-iptables"
            ))
        } else if self.backend.translates_on_uplinks() && state.uplinks.is_empty() {
            Some("no interface to translate on".to_owned())
        } else {
            None
        };
        state.ready = reason.is_none();
        state.not_ready_reason = reason;
    }
}
