//! The eBPF backend: the pinned datapath on the uplinks. It orchestrates the parts: the
//! pinned state's lifecycle ([`crate::datapath::lifecycle`]), the uplinks and their addresses
//! ([`crate::node::uplinks`]) and the take-over of upstream's chain
//! ([`crate::iptables::take_over`]), in the order that keeps every flow translated.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
};

use masq_common::{
    flow::Timeouts,
    layout::Uplink,
    settings::{SETTING_SHARED_PORTS, Settings},
};

use super::{
    AgentError, Backend,
    status::{KernelStatus, SharedStatus, UplinkStatus},
};
use crate::{
    causes::WithCauses,
    datapath::{
        DatapathError,
        attach::{AttachMode, HookPositions, attach_uplink, detach_uplink},
        crowded_remotes::CrowdedRemotes,
        gc,
        lifecycle::{HeldPins, LifecycleOptions, Loaded, port_reservation},
        maps::{DatapathMaps, Trie},
        netfilter_flows::{self, Intake},
        object::Datapath,
        sync::{TrieView, WantedTries, settings, sync_tries},
    },
    iptables::take_over::{self, Recheck, TakeOverOptions},
    node::{
        interfaces,
        kernel::supported_kernel,
        uplinks::{self, Strictness, UplinkIpv6, UplinkOptions, WantedUplink, wanted_uplinks},
    },
    policy::Policy,
    ports::SnatPorts,
};

/// How the eBPF backend runs: the options of its parts, and how it translates.
#[derive(Clone, Debug)]
pub struct EbpfOptions {
    /// The pinned datapath: where, and how large.
    pub lifecycle: LifecycleOptions,
    /// The interfaces to translate on.
    pub uplinks: UplinkOptions,
    /// Upstream's chain, which masq refuses to run next to unless it takes it over.
    pub upstream_chain: TakeOverOptions,
    /// How the programs are attached; `None`: tcx where the kernel has it, else tc.
    pub attach_mode: Option<AttachMode>,
    /// Where masq's programs sit among other programs on each hook.
    pub hook_positions: HookPositions,
    /// The ports masqueraded flows may use, and whether the node's own sockets share them.
    pub snat_ports: SnatPorts,
    /// Pick every port at random (`--random-fully`).
    pub random_fully: bool,
    /// The most unassured flows one pod may hold, as a percentage of the NAT table's flows
    /// (0: no limit).
    pub nat_pod_share: u8,
    /// Flow idle timeouts.
    pub timeouts: Timeouts,
    /// Where the node's sysctls are (`/proc/sys`, or a host mount in a container).
    pub sysctl_dir: PathBuf,
}

/// The datapath and what the agent knows about it.
pub(super) struct EbpfBackend {
    options: EbpfOptions,
    datapath: Datapath,
    /// Held for the agent's life: one agent per pin path.
    pins: HeldPins,
    /// The mode new attachments use.
    attach_mode: AttachMode,
    /// Interfaces this process swapped its programs into (by index), with their names. An
    /// interface not listed here runs an older agent's programs, or none.
    attached: BTreeMap<u32, String>,
    /// Translation is on: a config (or an adopted trie) is in force.
    enabled: bool,
    /// The source tries hold entries, so the settings carry `SETTING_SOURCE_EXEMPTIONS`.
    source_exemptions: bool,
    /// The remote endpoints warned about for running out of node ports.
    crowded_remotes: CrowdedRemotes,
}

impl EbpfBackend {
    /// Loads (or adopts) the datapath. Programs are attached by [`Self::reconcile_uplinks`]
    /// once the trie and the settings are right.
    pub(super) fn start(options: EbpfOptions, status: &SharedStatus) -> Result<Self, AgentError> {
        // Everything the operator named is checked before anything changes on the node.
        let kernel = supported_kernel()?;
        let wanted = wanted_uplinks(&options.uplinks, Strictness::Startup)?;
        let attach_mode = match options.attach_mode {
            Some(AttachMode::Tcx) if AttachMode::best_for_kernel() != AttachMode::Tcx => {
                return Err(AgentError::TcxUnsupported);
            }
            Some(mode) => mode,
            None => AttachMode::best_for_kernel(),
        };
        let pins = HeldPins::take(&options.lifecycle.pin_path)?;
        // Refused here if upstream's chain is installed without --take-over-iptables; removed
        // only once masq's programs are attached (`finish_startup`), so that no packet of a
        // live flow leaves untranslated in between.
        take_over::refuse_unless_taking_over(&options.upstream_chain)?;
        let Loaded {
            mut datapath,
            adopted,
            nat_max_entries,
        } = pins.load(&options.lifecycle)?;
        if options.lifecycle.debug_log {
            spawn_logger(&mut datapath)?;
        }
        let enabled = adopted && datapath.maps.settings()?.enabled();
        // Adopted source tries stay in force until a config says otherwise, and the settings
        // written before that must keep the datapath looking them up.
        let source_exemptions = adopted && holds_source_exemptions(&datapath.maps)?;
        let node_addresses: Vec<IpAddr> = wanted.iter().flat_map(WantedUplink::addresses).collect();
        netfilter_flows::take_in(
            &mut datapath.maps,
            &node_addresses,
            &options.snat_ports.ranges,
            options.uplinks.enable_ipv6,
            Intake::Reserve,
        );
        if let Err(error) = datapath.pin_programs(pins.dir()) {
            tracing::warn!(error = %WithCauses(&error), "could not pin the programs; `masq status` will not show their verified sizes");
        }
        let backend = Self {
            options,
            datapath,
            pins,
            attach_mode,
            attached: BTreeMap::new(),
            enabled,
            source_exemptions,
            crowded_remotes: CrowdedRemotes::default(),
        };
        backend.report_loaded(status, &kernel.release, &wanted, adopted, nat_max_entries)?;
        Ok(backend)
    }

    /// Puts what was loaded in the status, and says it in the log.
    fn report_loaded(
        &self,
        status: &SharedStatus,
        kernel: &str,
        wanted: &[WantedUplink],
        adopted: bool,
        nat_max_entries: u32,
    ) -> Result<(), AgentError> {
        let maps = &self.datapath.maps;
        let verified = self.datapath.verified_sizes()?;
        let attach_mode = self.attach_mode;
        {
            let mut state = status.lock();
            state.nat_capacity = maps.nat_v4_capacity();
            state.nat_capacity_v6 = maps.nat_v6_capacity();
            state.pod_share = maps.holder_shares(self.options.nat_pod_share);
            state.adopted = adopted;
            state.kernel = Some(KernelStatus {
                release: kernel.to_owned(),
                attach_mode: attach_mode.name(),
                verified_sizes: verified.clone(),
            });
        }
        let names: Vec<&str> = wanted.iter().map(|uplink| uplink.name.as_str()).collect();
        let sizes: Vec<String> = verified
            .iter()
            .map(|(program, size)| match size {
                Some(size) => format!("{program}={size}"),
                None => format!("{program}=?"),
            })
            .collect();
        tracing::info!(
            interfaces = ?names, %attach_mode, pin_path = %self.pins.dir().root().display(), adopted, nat_max_entries,
            %kernel, verified_instructions = %sizes.join(","),
            "datapath loaded{}", if adopted { " (adopted the pinned maps: live flows continue)" } else { "" }
        );
        Ok(())
    }

    /// Writes the settings: translating with the current address and ports, or (before any
    /// valid config) passing everything through.
    fn write_settings(&mut self) -> Result<(), AgentError> {
        let options = &self.options;
        let value = if self.enabled {
            let mut value = settings(
                &options.snat_ports.ranges,
                options.random_fully,
                self.source_exemptions,
            );
            self.datapath
                .maps
                .size_settings(&mut value, options.nat_pod_share);
            if options.snat_ports.shared {
                value.flags |= SETTING_SHARED_PORTS;
            }
            value
        } else {
            tracing::warn!(
                "no valid config yet: the datapath passes all traffic untranslated until one is read"
            );
            Settings::DISABLED
        };
        self.datapath.maps.set_settings(&value)?;
        Ok(())
    }

    /// Brings the interfaces masq translates on in line with what should be: attaches (or swaps
    /// this process's programs in) where traffic leaves the node, follows address changes, and
    /// detaches from interfaces that are gone or no longer wanted. Called at startup (where an
    /// error stops the agent) and on every resync and interface change (where it is logged).
    fn reconcile_uplinks(
        &mut self,
        status: &SharedStatus,
        strictness: Strictness,
    ) -> Result<(), AgentError> {
        let wanted = wanted_uplinks(&self.options.uplinks, strictness)?;
        let recorded: BTreeMap<u32, Uplink> = self.datapath.maps.uplinks()?.into_iter().collect();
        let mut first_error = None;

        for (ifindex, uplink) in uplinks::unwanted(&recorded, &wanted) {
            tracing::warn!(
                interface = uplink.name(),
                ifindex,
                "no longer translating on this interface (gone, or no longer an uplink)"
            );
            let detached = detach_uplink(self.pins.dir(), ifindex, &uplink)
                .map_err(AgentError::from)
                .and_then(|()| Ok(self.datapath.maps.remove_uplink(ifindex)?));
            self.attached.remove(&ifindex);
            if let Err(error) = detached {
                tracing::error!(interface = uplink.name(), error = %WithCauses(&error), "detaching failed");
                first_error.get_or_insert(error);
            }
        }

        for uplink in &wanted {
            let previous = recorded.get(&uplink.ifindex);
            let result = if self.attached.get(&uplink.ifindex) == Some(&uplink.name) {
                self.follow_address(uplink, previous)
            } else {
                self.attach_uplink(uplink, previous)
            };
            if let Err(error) = result {
                tracing::error!(interface = %uplink.name, error = %WithCauses(&error), "attaching failed");
                if strictness == Strictness::Startup {
                    return Err(error);
                }
                first_error.get_or_insert(error);
            }
        }

        status.lock().uplinks = self.uplink_statuses(&wanted)?;
        first_error.map_or(Ok(()), Err)
    }

    /// What the status says of the uplinks this process attached to.
    fn uplink_statuses(&self, wanted: &[WantedUplink]) -> Result<Vec<UplinkStatus>, AgentError> {
        let statuses = self
            .datapath
            .maps
            .uplinks()?
            .into_iter()
            .filter(|(ifindex, _)| self.attached.contains_key(ifindex))
            .map(|(ifindex, uplink)| UplinkStatus {
                interface: uplink.name().to_owned(),
                node_ip: uplink.has_v4().then(|| Ipv4Addr::from(uplink.snat_addr)),
                attach_mode: AttachMode::of(&uplink).map_or("?", AttachMode::name),
                address_is_local: wanted
                    .iter()
                    .find(|wanted| wanted.ifindex == ifindex)
                    .is_none_or(|wanted| wanted.address_is_local),
                ipv6: if uplink.has_v6 != 0 {
                    UplinkIpv6::Address(Ipv6Addr::from(uplink.snat_addr_v6))
                } else if self.options.uplinks.enable_ipv6 {
                    UplinkIpv6::NoAddress
                } else {
                    UplinkIpv6::NotTranslated
                },
            })
            .collect();
        Ok(statuses)
    }

    /// Attaches the programs to `wanted` (taking over from what an older agent attached there,
    /// recorded as `previous`), then records it: the record turns translation on.
    fn attach_uplink(
        &mut self,
        wanted: &WantedUplink,
        previous: Option<&Uplink>,
    ) -> Result<(), AgentError> {
        let recorded_mode = previous.and_then(AttachMode::of);
        // Auto keeps whatever a previous agent used there: switching means a moment with no
        // program or two of them.
        let mode = match (self.options.attach_mode, recorded_mode) {
            (None, Some(recorded)) => recorded,
            _ => self.attach_mode,
        };
        if let (Some(previous), Some(recorded)) = (previous, recorded_mode)
            && recorded != mode
        {
            tracing::warn!(interface = %wanted.name, from = %recorded, to = %mode, "switching attach mode; packets in between pass untranslated");
            detach_uplink(self.pins.dir(), wanted.ifindex, previous)?;
        }
        let (record, outcomes) = attach_uplink(
            &mut self.datapath,
            self.pins.dir(),
            &wanted.name,
            wanted.ifindex,
            mode,
            previous.filter(|_| recorded_mode == Some(mode)),
            self.options.hook_positions,
        )?;
        let record = wanted.with_addresses(record);
        // The entry turns translation on for the interface, so it comes after the programs.
        self.datapath.maps.set_uplink(wanted.ifindex, &record)?;
        self.attached.insert(wanted.ifindex, wanted.name.clone());
        for (hook, outcome) in outcomes {
            tracing::info!(interface = %wanted.name, node_ip = ?wanted.address, node_ipv6 = ?wanted.ipv6_address(), %mode, hook = hook.name(), ?outcome, "program attached");
        }
        wanted.warn_if_ipv4_missing();
        wanted.warn_if_ipv6_missing();
        Ok(())
    }

    /// Makes masq translate the flows upstream's chain masqueraded, just removed (see
    /// [`netfilter_flows::take_in`]), on the uplinks' current addresses.
    fn adopt_upstream_flows(&mut self) {
        let recorded = self.datapath.maps.uplinks().unwrap_or_default();
        netfilter_flows::take_in(
            &mut self.datapath.maps,
            &uplinks::recorded_addresses(&recorded),
            &self.options.snat_ports.ranges,
            self.options.uplinks.enable_ipv6,
            Intake::AfterTakeOver,
        );
    }

    /// Updates the addresses of an interface this process attached to, when they changed
    /// (DHCP, router advertisements, an operator's change), and flushes the flows of an address
    /// that left the node (see [`WantedUplink::follow`]).
    fn follow_address(
        &mut self,
        wanted: &WantedUplink,
        previous: Option<&Uplink>,
    ) -> Result<(), AgentError> {
        let Some(previous) = previous else {
            return Ok(());
        };
        wanted.report_address_changes(previous);
        // An unreadable list reads as "still there": flows are never flushed on a guess.
        let followed = wanted.follow(previous, |address| {
            interfaces::has_address(&wanted.name, address).unwrap_or(true)
        });
        if followed.record == *previous {
            return Ok(());
        }
        self.datapath
            .maps
            .set_uplink(wanted.ifindex, &followed.record)?;
        for address in followed.newly_kept {
            tracing::info!(interface = %wanted.name, %address, "the former address is still the interface's: its flows carry on until it is removed");
        }
        let recorded = self.datapath.maps.uplinks()?;
        for address in followed.gone {
            if uplinks::answers_for(&recorded, address) {
                continue;
            }
            let flushed = match address {
                IpAddr::V4(address) => {
                    gc::flush_address(&mut self.datapath.maps, address.octets())?
                }
                IpAddr::V6(address) => {
                    gc::flush_address(&mut self.datapath.maps, address.octets())?
                }
            };
            tracing::info!(interface = %wanted.name, %address, flushed, "the address was removed: the flows masqueraded to it are flushed");
        }
        Ok(())
    }
}

impl Backend for EbpfBackend {
    fn enabled(&self) -> bool {
        self.enabled
    }

    /// Brings the trie in line with `policy` and turns translation on. A config change is
    /// compared with what the last sync wrote, so it costs only the entries that changed; the
    /// periodic resync compares with what the kernel holds, so anything that drifted (a change
    /// the kernel refused and could not undo, a hand edit) is repaired. An unchanged config
    /// writes nothing.
    fn apply(&mut self, policy: &Policy, trigger: &'static str) -> Result<usize, AgentError> {
        let view = if trigger == "resync" {
            TrieView::Kernel
        } else {
            TrieView::LastSynced
        };
        let wanted = WantedTries {
            destinations_v4: policy.nomasq_v4(),
            destinations_v6: policy.nomasq_v6(),
            sources_v4: policy.nomasq_src_v4(),
            sources_v6: policy.nomasq_src_v6(),
        };
        // Every trie fits before any is changed, and one that fails puts the others back, so
        // a config is applied whole or not at all. (Without --enable-ipv6 the IPv6 tries are
        // kept empty.)
        let reports = sync_tries(&mut self.datapath.maps, &wanted, view)?;
        for (family, trie, report) in reports {
            if report.added + report.removed > 0 {
                tracing::info!(
                    trigger,
                    %family,
                    trie = match trie {
                        Trie::Destinations => "destinations",
                        Trie::Sources => "sources",
                    },
                    added = report.added,
                    removed = report.removed,
                    unchanged = report.unchanged,
                    "non-masquerade trie synced"
                );
            }
        }
        // The source tries are filled by now: the datapath may look sources up from the
        // settings' next read on (and stops when a config empties them, which is harmless
        // in either order: an empty trie matches nothing).
        let source_exemptions = wanted.source_exemptions();
        if !self.enabled || source_exemptions != self.source_exemptions {
            let held = self.source_exemptions;
            self.enabled = true;
            self.source_exemptions = source_exemptions;
            if let Err(error) = self.write_settings() {
                // Written again by the next apply, which finds the flag still to change.
                self.source_exemptions = held;
                return Err(error);
            }
        }
        Ok(wanted.destinations_v4.len() + wanted.destinations_v6.len())
    }

    fn left_in_place(&self) -> &'static str {
        "the datapath stays attached and keeps translating"
    }

    /// Turns translation on (or keeps it off until a valid config), reserves the SNAT ports
    /// and attaches to the uplinks: after the trie, so nothing is translated without its
    /// exemptions.
    fn finish_startup(&mut self, status: &SharedStatus) -> Result<(), AgentError> {
        self.write_settings()?;
        port_reservation::reserve(
            &mut self.datapath.maps,
            &self.options.sysctl_dir,
            &self.options.snat_ports,
        )?;
        self.reconcile_uplinks(status, Strictness::Startup)?;
        if take_over::take_over(&self.options.upstream_chain)? {
            self.adopt_upstream_flows();
        }
        Ok(())
    }

    fn translates_on_uplinks(&self) -> bool {
        true
    }

    fn follow_uplinks(&mut self, status: &SharedStatus) {
        // Errors are logged where they happen; the other uplinks carry on.
        let _ = self.reconcile_uplinks(status, Strictness::Running);
    }

    fn resync(&mut self, status: &SharedStatus) {
        self.follow_uplinks(status);
        let recheck = take_over::recheck(&self.options.upstream_chain);
        status.lock().upstream_chain = match &recheck {
            Recheck::StillInstalled(chain) => Some(chain.clone()),
            Recheck::TookOver | Recheck::Absent => None,
        };
        if recheck == Recheck::TookOver {
            self.adopt_upstream_flows();
        }
    }

    fn collect_garbage(&mut self, status: &SharedStatus) {
        match gc::collect(
            &mut self.datapath.maps,
            &self.options.timeouts,
            gc::monotonic_now_ns(),
        ) {
            Ok(report) => {
                if report.expired() + report.orphans() > 0 {
                    tracing::debug!(?report, "expired flows collected");
                }
                if report.reclaimed() > 0 {
                    tracing::info!(
                        reclaimed = report.reclaimed(),
                        "the NAT table is over 95 % full: unassured and closing flows retired early"
                    );
                }
                let mut state = status.lock();
                state.gc_expired_total += u64::try_from(report.expired()).unwrap_or(0);
                for (totals, family) in state
                    .gc_reclaimed_total
                    .iter_mut()
                    .zip([&report.ipv4, &report.ipv6])
                {
                    for (total, reclaimed) in totals.iter_mut().zip(family.reclaimed) {
                        *total += u64::try_from(reclaimed).unwrap_or(0);
                    }
                }
                self.crowded_remotes.warn_of(&report);
                state.last_gc = report;
            }
            Err(error) => {
                tracing::error!(error = %WithCauses(&error), "flow garbage collection failed");
            }
        }
    }
}

/// Whether the source tries (`nonMasqueradeSrcCIDRs`) hold entries.
fn holds_source_exemptions(maps: &DatapathMaps) -> Result<bool, DatapathError> {
    Ok(!maps.trie_entries_of::<Ipv4Addr>(Trie::Sources)?.is_empty()
        || !maps.trie_entries_of::<Ipv6Addr>(Trie::Sources)?.is_empty())
}

/// Forwards aya-log records to tracing (through the `log` facade) on a background task.
fn spawn_logger(datapath: &mut Datapath) -> Result<(), AgentError> {
    let logger = datapath.take_logger()?;
    let mut logger = crate::sys::async_fd::readable(logger)
        .map_err(|error| DatapathError::Logger(WithCauses(&error).to_string()))?;
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
