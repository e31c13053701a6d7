//! The eBPF backend: the pinned datapath on the uplink.

use std::net::Ipv4Addr;

use masq_common::{
    layout::{MAX_RESERVED_RANGES, MapMeta},
    ports::PortRange,
    settings::Settings,
};

use super::{AgentError, AgentOptions, netif, reserved_ports, status::SharedStatus};
use crate::{
    config::cidr::Family,
    datapath::{
        DatapathError,
        attach::attach,
        gc,
        object::{Datapath, LoadOptions},
        pins::{PinDir, PinnedState, is_on_bpffs},
        sync::{TrieSync, settings, sync_nomasq},
    },
    iptables::apply::Iptables,
    policy::Policy,
};

/// The datapath and what the agent knows about it.
pub(super) struct EbpfBackend {
    datapath: Datapath,
    pins: PinDir,
    interface: String,
    node_ip: Ipv4Addr,
    /// Translation is on: a config (or an adopted trie) is in force.
    enabled: bool,
}

impl EbpfBackend {
    /// Loads (or adopts) the datapath. Programs are attached by [`Self::attach`] once the trie
    /// and the settings are right.
    pub(super) fn start(options: &AgentOptions, status: &SharedStatus) -> Result<Self, AgentError> {
        let interface = match &options.interface {
            Some(interface) => interface.clone(),
            None => netif::default_route_interface()?,
        };
        netif::interface_index(&interface)?;
        let node_ip = match options.node_ip {
            Some(node_ip) => node_ip,
            None => netif::primary_ipv4(&interface)?,
        };
        take_over_upstream_chain(options)?;
        if options.enable_ipv6 {
            tracing::warn!(
                "the eBPF datapath masquerades IPv4 only; IPv6 needs --backend iptables"
            );
        }
        let pins = PinDir::new(&options.pin_path);
        if !is_on_bpffs(pins.root()) {
            return Err(AgentError::NotBpffs(pins.root().to_path_buf()));
        }
        pins.create()?;
        let (adopted, nat_max_entries) = match pins.inspect()? {
            PinnedState::Empty => (false, options.nat_max_entries),
            PinnedState::Compatible { nat_max_entries } => {
                if nat_max_entries != options.nat_max_entries {
                    tracing::warn!(
                        pinned = nat_max_entries,
                        requested = options.nat_max_entries,
                        "keeping the pinned NAT table's capacity; resizing it needs `masq uninstall` (which drops live flows)"
                    );
                }
                (true, nat_max_entries)
            }
            PinnedState::Incompatible(detail) if options.replace_incompatible_state => {
                tracing::warn!(%detail, "replacing incompatible pinned state as requested; live flows are lost");
                pins.remove_maps()?;
                (false, options.nat_max_entries)
            }
            PinnedState::Incompatible(detail) => {
                return Err(DatapathError::IncompatiblePins {
                    pin_path: pins.root().to_path_buf(),
                    detail,
                }
                .into());
            }
        };
        let load = LoadOptions {
            nat_max_entries,
            pin_dir: Some(pins.root().to_path_buf()),
            debug_log: options.datapath_debug_log,
        };
        let mut datapath = Datapath::load(&load)?;
        if !adopted {
            datapath.maps.set_meta(&MapMeta::current(nat_max_entries))?;
        }
        if options.datapath_debug_log {
            spawn_logger(&mut datapath)?;
        }
        let enabled = adopted && datapath.maps.settings()?.enabled();
        {
            let mut state = status.lock();
            state.interface.clone_from(&interface);
            state.node_ip = Some(node_ip);
            state.nat_capacity = nat_max_entries;
            state.adopted = adopted;
        }
        tracing::info!(
            %interface, %node_ip, pin_path = %pins.root().display(), adopted, nat_max_entries,
            "datapath loaded{}", if adopted { " (adopted the pinned maps: live flows continue)" } else { "" }
        );
        Ok(Self {
            datapath,
            pins,
            interface,
            node_ip,
            enabled,
        })
    }

    /// Whether translation is on.
    pub(super) const fn enabled(&self) -> bool {
        self.enabled
    }

    /// Brings the trie in line with `policy` and turns translation on.
    pub(super) fn apply(
        &mut self,
        policy: &Policy,
        options: &AgentOptions,
    ) -> Result<TrieSync, AgentError> {
        let report = sync_nomasq(&mut self.datapath.maps, &policy.nomasq_v4())?;
        if !self.enabled {
            self.enabled = true;
            self.write_settings(options)?;
        }
        Ok(report)
    }

    /// Entries the trie holds for `policy`.
    pub(super) fn trie_entries(policy: &Policy) -> usize {
        policy.nomasq_v4().len()
    }

    /// Writes the settings: translating with the current address and ports, or (before any
    /// valid config) passing everything through.
    pub(super) fn write_settings(&mut self, options: &AgentOptions) -> Result<(), AgentError> {
        let value = if self.enabled {
            settings(self.node_ip, &options.snat_ranges, options.random_fully)
        } else {
            tracing::warn!(
                "no valid config yet: the datapath passes all traffic untranslated until one is read"
            );
            Settings::DISABLED
        };
        self.datapath.maps.set_settings(&value)?;
        Ok(())
    }

    /// Reserves the SNAT ports from the node's ephemeral allocation and records what was added.
    pub(super) fn reserve_ports(&mut self, options: &AgentOptions) -> Result<(), AgentError> {
        let ephemeral = reserved_ports::ephemeral_range(&options.sysctl_dir)?;
        if options
            .snat_ranges
            .iter()
            .any(|range| range.overlaps(&ephemeral))
        {
            tracing::info!(
                %ephemeral,
                "the SNAT range overlaps the node's ephemeral ports; the reservation keeps node sockets out of it"
            );
        }
        let added = reserved_ports::reserve(&options.sysctl_dir, &options.snat_ranges)?;
        let mut meta = self.datapath.maps.meta()?;
        let mut recorded: Vec<PortRange> = meta.reserved().to_vec();
        recorded.extend_from_slice(&added);
        let recorded = reserved_ports::normalize(recorded);
        if recorded.len() > MAX_RESERVED_RANGES {
            tracing::warn!(
                ranges = recorded.len(),
                "too many reserved ranges to record; `masq uninstall` will leave some in place"
            );
        }
        for (slot, range) in meta
            .reserved
            .iter_mut()
            .zip(recorded.iter().chain(std::iter::repeat(&PortRange::EMPTY)))
        {
            *slot = *range;
        }
        meta.reserved_count = u32::try_from(recorded.len().min(MAX_RESERVED_RANGES)).unwrap_or(0);
        self.datapath.maps.set_meta(&meta)?;
        if !added.is_empty() {
            tracing::info!(ports = %reserved_ports::format_port_list(&added), "reserved the SNAT ports from the node's ephemeral allocation");
        }
        Ok(())
    }

    /// Attaches (or swaps in) the programs.
    pub(super) fn attach(&mut self) -> Result<(), AgentError> {
        for (hook, outcome) in attach(&mut self.datapath, &self.pins, &self.interface)? {
            tracing::info!(interface = %self.interface, hook = hook.name(), ?outcome, "program attached");
        }
        Ok(())
    }

    /// Re-reads the node address when it was not given explicitly (DHCP may change it).
    pub(super) fn follow_node_address(&mut self, options: &AgentOptions, status: &SharedStatus) {
        if options.node_ip.is_some() {
            return;
        }
        match netif::primary_ipv4(&self.interface) {
            Ok(address) if address != self.node_ip => {
                tracing::warn!(old = %self.node_ip, new = %address, "the node address changed; new flows use the new one");
                self.node_ip = address;
                status.lock().node_ip = Some(address);
                if let Err(error) = self.write_settings(options) {
                    tracing::error!(%error, "updating the datapath settings failed");
                }
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot read the node address; keeping {}", self.node_ip);
            }
        }
    }

    /// Removes expired flows.
    pub(super) fn collect_garbage(&mut self, options: &AgentOptions, status: &SharedStatus) {
        match gc::collect(
            &mut self.datapath.maps,
            &options.timeouts,
            gc::monotonic_now_ns(),
        ) {
            Ok(report) => {
                if report.expired + report.orphans > 0 {
                    tracing::debug!(?report, "expired flows collected");
                }
                let mut state = status.lock();
                state.gc_expired_total += u64::try_from(report.expired).unwrap_or(0);
                state.last_gc = report;
            }
            Err(error) => tracing::error!(%error, "flow garbage collection failed"),
        }
    }

    /// The pin directory.
    pub(super) fn pin_path(&self) -> &std::path::Path {
        self.pins.root()
    }
}

/// Forwards aya-log records to tracing (through the `log` facade) on a background task.
fn spawn_logger(datapath: &mut Datapath) -> Result<(), AgentError> {
    let logger = datapath.take_logger()?;
    // SAFETY: the logger owns its ring buffer descriptor, which stays open and registered
    // while the task owning the `AsyncFd` runs.
    let mut logger = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    }
    .map_err(|error| DatapathError::Logger(error.to_string()))?;
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = logger.readable_mut().await else {
                return;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
    tracing::warn!("datapath debug logging is on: every translated packet is logged, at a cost");
    Ok(())
}

/// An upstream ip-masq-agent chain masquerading at the same time as masq would translate
/// twice and break flows. Refuse to start next to one unless told to remove it.
fn take_over_upstream_chain(options: &AgentOptions) -> Result<(), AgentError> {
    for family in [Family::Ipv4, Family::Ipv6] {
        let iptables = match Iptables::detect(family) {
            Ok(iptables) => iptables,
            Err(error) => {
                tracing::debug!(%error, %family, "no iptables to check for an upstream chain");
                continue;
            }
        };
        let (jumps, exists) = match iptables.find_chain(&options.masq_chain) {
            Ok(found) => found,
            Err(error) => {
                tracing::debug!(%error, %family, "cannot list the nat table");
                continue;
            }
        };
        if jumps.is_empty() && !exists {
            continue;
        }
        if !options.take_over_iptables {
            return Err(AgentError::UpstreamChainPresent {
                chain: options.masq_chain.clone(),
                family,
                jumps: jumps.len(),
            });
        }
        let removed = iptables.remove_chain(&options.masq_chain)?;
        tracing::warn!(chain = %options.masq_chain, %family, jumps = removed, "took over from iptables: removed the chain and its POSTROUTING jumps");
    }
    Ok(())
}
