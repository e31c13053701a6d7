//! The eBPF backend: the pinned datapath on the uplink.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
};

use masq_common::{
    layout::{
        IPV6_DISABLED_ENTRIES, MAP_FLOW_INDEX_V6, MAP_NAT_V6, MAP_NOMASQ_V4, MAP_NOMASQ_V6,
        MAX_RESERVED_RANGES, MapMeta, Uplink,
    },
    ports::PortRange,
    settings::{SETTING_SHARED_PORTS, Settings},
};

use super::{
    AgentError, AgentOptions, Backend,
    status::{KernelStatus, SharedStatus, UplinkIpv6, UplinkStatus},
};
use crate::{
    datapath::{
        DatapathError,
        attach::{AttachMode, attach_uplink, detach_uplink},
        gc,
        maps::{DatapathMaps, KernelFlow, Trie},
        object::{Datapath, LoadOptions, StagedMaps},
        pins::{PinDir, PinnedCapacities, PinnedState, is_on_bpffs},
        sync::{TrieView, WantedTries, settings, sync_tries},
    },
    iptables::take_over::{self, Recheck},
    node::{
        conntrack,
        interfaces,
        kernel::supported_kernel,
        reserved_ports,
        uplinks::{self, Strictness, WantedUplink, wanted_uplinks},
    },
    policy::Policy,
};

/// The datapath and what the agent knows about it.
pub(super) struct EbpfBackend {
    datapath: Datapath,
    pins: PinDir,
    /// Held for the agent's life: one agent per pin path.
    _lock: nix::fcntl::Flock<std::fs::File>,
    /// The mode new attachments use.
    attach_mode: AttachMode,
    /// Interfaces this process swapped its programs into (by index), with their names. An
    /// interface not listed here runs an older agent's programs, or none.
    attached: BTreeMap<u32, String>,
    /// Translation is on: a config (or an adopted trie) is in force.
    enabled: bool,
    /// The source tries hold entries, so the settings carry `SETTING_SOURCE_EXEMPTIONS`.
    source_exemptions: bool,
    /// The remote endpoints (node address, remote, protocol) the agent warned about for
    /// having [`CROWDED_PERCENT`] of their node ports in use, until they fall below
    /// [`UNCROWDED_PERCENT`] again.
    crowded_remotes: BTreeSet<(IpAddr, SocketAddr, u8)>,
}

/// From this share of its node ports in use (in percent), a remote endpoint is warned about,
/// once: new flows towards it are refused once all are taken.
const CROWDED_PERCENT: u32 = 80;
/// Below this share a warned remote is forgotten, so that it is warned about again if it
/// fills up again (a margin, so that a remote hovering at the mark warns once).
const UNCROWDED_PERCENT: u32 = 70;

impl EbpfBackend {
    /// Loads (or adopts) the datapath. Programs are attached by [`Self::reconcile_uplinks`]
    /// once the trie and the settings are right.
    pub(super) fn start(options: &AgentOptions, status: &SharedStatus) -> Result<Self, AgentError> {
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
        let pins = PinDir::new(&options.pin_path);
        if !is_on_bpffs(pins.root()) {
            return Err(AgentError::NotBpffs(pins.root().to_path_buf()));
        }
        pins.create()?;
        let lock = pins.lock()?;
        // Refused here if upstream's chain is installed without --take-over-iptables; removed
        // only once masq's programs are attached (`finish_startup`), so that no packet of a
        // live flow leaves untranslated in between.
        take_over::refuse_unless_taking_over(&options.upstream_chain)?;
        if pins.remove_staging()? {
            tracing::warn!(staging = %pins.staging().display(), "removed the maps of an install that was interrupted");
        }
        let mut state = pins.inspect()?;
        if let PinnedState::Leftovers(maps) = &state {
            tracing::warn!(
                ?maps,
                "removing the maps of an install that was interrupted before it completed; starting afresh"
            );
            pins.remove_maps()?;
            state = PinnedState::Empty;
        }
        let (adopted, nat_max_entries, pinned) = match state {
            PinnedState::Empty | PinnedState::Leftovers(_) => {
                (false, options.nat_max_entries, None)
            }
            PinnedState::Compatible(pinned) => {
                if pinned.nat != options.nat_max_entries {
                    tracing::warn!(
                        pinned = pinned.nat,
                        requested = options.nat_max_entries,
                        "keeping the pinned NAT table's capacity; resizing it needs `masq uninstall` (which drops live flows)"
                    );
                }
                (true, pinned.nat, Some(pinned))
            }
            PinnedState::Incompatible(detail) if options.replace_incompatible_state => {
                tracing::warn!(%detail, "replacing incompatible pinned state as requested; live flows are lost");
                pins.remove_maps()?;
                (false, options.nat_max_entries, None)
            }
            PinnedState::Incompatible(detail) => {
                return Err(DatapathError::IncompatiblePins {
                    pin_path: pins.root().to_path_buf(),
                    detail,
                    attached: !pins.links().is_empty(),
                }
                .into());
            }
        };
        let mut datapath = match pinned {
            Some(pinned) => adopt_maps(&pins, nat_max_entries, pinned, options)?,
            None => create_maps(&pins, nat_max_entries, options)?,
        };
        if options.datapath_debug_log {
            spawn_logger(&mut datapath)?;
        }
        let enabled = adopted && datapath.maps.settings()?.enabled();
        // Adopted source tries stay in force until a config says otherwise, and the settings
        // written before that must keep the datapath looking them up.
        let source_exemptions = adopted
            && (!datapath
                .maps
                .trie_entries_of::<Ipv4Addr>(Trie::Sources)?
                .is_empty()
                || !datapath
                    .maps
                    .trie_entries_of::<Ipv6Addr>(Trie::Sources)?
                    .is_empty());
        let node_addresses: Vec<IpAddr> = wanted.iter().flat_map(WantedUplink::addresses).collect();
        take_in_kernel_nat_flows(&mut datapath, &node_addresses, options, false);
        if let Err(error) = datapath.pin_programs(&pins) {
            tracing::warn!(%error, "could not pin the programs; `masq status` will not show their verified sizes");
        }
        let verified = datapath.verified_sizes()?;
        {
            let mut state = status.lock();
            state.nat_capacity = datapath.maps.nat_v4_capacity();
            state.nat_capacity_v6 = datapath.maps.nat_v6_capacity();
            state.pod_share = datapath.maps.holder_shares(options.nat_pod_share);
            state.adopted = adopted;
            state.kernel = Some(KernelStatus {
                release: kernel.release.clone(),
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
            interfaces = ?names, %attach_mode, pin_path = %pins.root().display(), adopted, nat_max_entries,
            kernel = %kernel.release, verified_instructions = %sizes.join(","),
            "datapath loaded{}", if adopted { " (adopted the pinned maps: live flows continue)" } else { "" }
        );
        Ok(Self {
            datapath,
            pins,
            _lock: lock,
            attach_mode,
            attached: BTreeMap::new(),
            enabled,
            source_exemptions,
            crowded_remotes: BTreeSet::new(),
        })
    }

    /// Writes the settings: translating with the current address and ports, or (before any
    /// valid config) passing everything through.
    fn write_settings(&mut self, options: &AgentOptions) -> Result<(), AgentError> {
        let value = if self.enabled {
            let mut value = settings(
                &options.snat_ranges,
                options.random_fully,
                self.source_exemptions,
            );
            self.datapath
                .maps
                .size_settings(&mut value, options.nat_pod_share);
            if options.ports_shared {
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

    /// Reserves the SNAT ports from the node's ephemeral allocation and records what was added;
    /// with ports shared with the node, gives back what an earlier start reserved instead.
    fn reserve_ports(&mut self, options: &AgentOptions) -> Result<(), AgentError> {
        if options.ports_shared {
            return self.release_reserved_ports(options);
        }
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

    /// Warns once about each remote endpoint the collection found with
    /// [`CROWDED_PERCENT`] of its node ports in use.
    fn warn_of_crowded_remotes(&mut self, report: &gc::GcReports) {
        let mut still_crowded = BTreeSet::new();
        for family in [&report.ipv4, &report.ipv6] {
            for remote in &family.busiest_remotes {
                let id = (remote.node, remote.remote, remote.protocol);
                let percent = remote.percent(family.ports_per_remote);
                if percent >= UNCROWDED_PERCENT && self.crowded_remotes.contains(&id) {
                    still_crowded.insert(id);
                } else if percent >= CROWDED_PERCENT {
                    still_crowded.insert(id);
                    tracing::warn!(
                        remote = %remote.label(),
                        node = %remote.node,
                        ports_in_use = remote.ports,
                        ports = family.ports_per_remote,
                        percent,
                        "a remote endpoint has most of its node ports in use: new flows towards it are refused once all are taken (more ports: --to-ports, or none for 1024-65535)"
                    );
                }
            }
        }
        self.crowded_remotes = still_crowded;
    }

    /// Takes the ports an earlier start reserved (with `--to-ports`) out of the node's reserved
    /// ports again, and forgets the record: the ports are shared with the node now.
    fn release_reserved_ports(&mut self, options: &AgentOptions) -> Result<(), AgentError> {
        let mut meta = self.datapath.maps.meta()?;
        if meta.reserved().is_empty() {
            return Ok(());
        }
        reserved_ports::release(&options.sysctl_dir, meta.reserved())?;
        tracing::info!(ports = %reserved_ports::format_port_list(meta.reserved()), "released the ports an earlier --to-ports reserved: the ports are shared with the node now");
        meta.reserved = [PortRange::EMPTY; MAX_RESERVED_RANGES];
        meta.reserved_count = 0;
        self.datapath.maps.set_meta(&meta)?;
        Ok(())
    }

    /// Brings the interfaces masq translates on in line with what should be: attaches (or swaps
    /// this process's programs in) where traffic leaves the node, follows address changes, and
    /// detaches from interfaces that are gone or no longer wanted. Called at startup (where an
    /// error stops the agent) and on every resync and interface change (where it is logged).
    fn reconcile_uplinks(
        &mut self,
        options: &AgentOptions,
        status: &SharedStatus,
        strictness: Strictness,
    ) -> Result<(), AgentError> {
        let wanted = wanted_uplinks(&options.uplinks, strictness)?;
        let recorded: BTreeMap<u32, Uplink> = self.datapath.maps.uplinks()?.into_iter().collect();
        let mut first_error = None;

        for (ifindex, uplink) in uplinks::unwanted(&recorded, &wanted) {
            tracing::warn!(
                interface = uplink.name(),
                ifindex,
                "no longer translating on this interface (gone, or no longer an uplink)"
            );
            let detached = detach_uplink(&self.pins, ifindex, &uplink)
                .map_err(AgentError::from)
                .and_then(|()| Ok(self.datapath.maps.remove_uplink(ifindex)?));
            self.attached.remove(&ifindex);
            if let Err(error) = detached {
                tracing::error!(interface = uplink.name(), %error, "detaching failed");
                first_error.get_or_insert(error);
            }
        }

        for uplink in &wanted {
            let previous = recorded.get(&uplink.ifindex);
            let result = if self.attached.get(&uplink.ifindex) == Some(&uplink.name) {
                self.follow_address(uplink, previous)
            } else {
                self.attach_uplink(uplink, previous, options)
            };
            if let Err(error) = result {
                tracing::error!(interface = %uplink.name, %error, "attaching failed");
                if strictness == Strictness::Startup {
                    return Err(error);
                }
                first_error.get_or_insert(error);
            }
        }

        let uplinks = self
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
                } else if options.enable_ipv6 {
                    UplinkIpv6::NoAddress
                } else {
                    UplinkIpv6::NotTranslated
                },
            })
            .collect();
        status.lock().uplinks = uplinks;
        first_error.map_or(Ok(()), Err)
    }

    fn attach_uplink(
        &mut self,
        wanted: &WantedUplink,
        previous: Option<&Uplink>,
        options: &AgentOptions,
    ) -> Result<(), AgentError> {
        let recorded_mode = previous.and_then(AttachMode::of);
        // Auto keeps whatever a previous agent used there: switching means a moment with no
        // program or two of them.
        let mode = match (options.attach_mode, recorded_mode) {
            (None, Some(recorded)) => recorded,
            _ => self.attach_mode,
        };
        if let (Some(previous), Some(recorded)) = (previous, recorded_mode)
            && recorded != mode
        {
            tracing::warn!(interface = %wanted.name, from = %recorded, to = %mode, "switching attach mode; packets in between pass untranslated");
            detach_uplink(&self.pins, wanted.ifindex, previous)?;
        }
        let (record, outcomes) = attach_uplink(
            &mut self.datapath,
            &self.pins,
            &wanted.name,
            wanted.ifindex,
            mode,
            previous.filter(|_| recorded_mode == Some(mode)),
            options.hook_positions,
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
    /// [`take_in_kernel_nat_flows`]), on the uplinks' current addresses.
    fn adopt_upstream_flows(&mut self, options: &AgentOptions) {
        let node_addresses: Vec<IpAddr> = self
            .datapath
            .maps
            .uplinks()
            .unwrap_or_default()
            .iter()
            .flat_map(|(_, uplink)| {
                let ipv4 = uplink.has_v4().then(|| IpAddr::from(uplink.snat_addr));
                let ipv6 = (uplink.has_v6 != 0).then(|| IpAddr::from(uplink.snat_addr_v6));
                ipv4.into_iter().chain(ipv6)
            })
            .collect();
        take_in_kernel_nat_flows(&mut self.datapath, &node_addresses, options, true);
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
    fn apply(
        &mut self,
        policy: &Policy,
        options: &AgentOptions,
        trigger: &'static str,
    ) -> Result<usize, AgentError> {
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
            if let Err(error) = self.write_settings(options) {
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
    fn finish_startup(
        &mut self,
        options: &AgentOptions,
        status: &SharedStatus,
    ) -> Result<(), AgentError> {
        self.write_settings(options)?;
        self.reserve_ports(options)?;
        self.reconcile_uplinks(options, status, Strictness::Startup)?;
        if take_over::take_over(&options.upstream_chain)? {
            self.adopt_upstream_flows(options);
        }
        Ok(())
    }

    fn translates_on_uplinks(&self) -> bool {
        true
    }

    fn follow_uplinks(&mut self, options: &AgentOptions, status: &SharedStatus) {
        // Errors are logged where they happen; the other uplinks carry on.
        let _ = self.reconcile_uplinks(options, status, Strictness::Running);
    }

    fn resync(&mut self, options: &AgentOptions, status: &SharedStatus) {
        self.follow_uplinks(options, status);
        match take_over::recheck(&options.upstream_chain) {
            Recheck::StillInstalled(chain) => status.lock().upstream_chain = Some(chain),
            Recheck::TookOver => {
                status.lock().upstream_chain = None;
                self.adopt_upstream_flows(options);
            }
            Recheck::Absent => status.lock().upstream_chain = None,
        }
    }

    fn collect_garbage(&mut self, options: &AgentOptions, status: &SharedStatus) {
        match gc::collect(
            &mut self.datapath.maps,
            &options.timeouts,
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
                self.warn_of_crowded_remotes(&report);
                state.last_gc = report;
            }
            Err(error) => tracing::error!(%error, "flow garbage collection failed"),
        }
    }
}

/// One thing [`uninstall`] did or left alone, in words for the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UninstallStep {
    /// An interrupted install's staging directory was removed.
    RemovedStagedMaps,
    /// Nothing was pinned, so nothing was changed (beyond an empty pin directory).
    NothingPinned(PathBuf),
    /// The programs were detached from an uplink.
    Detached {
        /// The interface.
        interface: String,
        /// How they were attached (`tcx`, `tc`), if known.
        mode: Option<AttachMode>,
    },
    /// These ports were taken out of `net.ipv4.ip_local_reserved_ports` again.
    ReleasedPorts(Vec<PortRange>),
    /// The record of what was reserved could not be read, so the reservation stays.
    ReservedPortsUnknown(String),
    /// An interrupted install left maps (and had not reserved ports yet).
    RemovingLeftovers,
    /// The pins come from another masq version, whose record of reserved ports is not read.
    ReservedPortsOfAnotherVersion,
    /// A pin or directory was removed.
    Removed(PathBuf),
    /// Everything is gone.
    Done,
}

impl fmt::Display for UninstallStep {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        const KEEPING_PORTS: &str = "leaving net.ipv4.ip_local_reserved_ports as it is";
        match self {
            Self::RemovedStagedMaps => {
                formatter.write_str("removed the staged maps of an interrupted install")
            }
            Self::NothingPinned(root) => write!(
                formatter,
                "nothing pinned under {}; nothing to uninstall",
                root.display()
            ),
            Self::Detached { interface, mode } => write!(
                formatter,
                "detached from {interface} ({})",
                mode.map_or("unknown mode", AttachMode::name)
            ),
            Self::ReleasedPorts(ranges) => write!(
                formatter,
                "released reserved ports {}",
                reserved_ports::format_port_list(ranges)
            ),
            Self::ReservedPortsUnknown(error) => write!(
                formatter,
                "could not read which ports masq reserved ({error}); {KEEPING_PORTS}"
            ),
            Self::RemovingLeftovers => formatter.write_str(
                "an interrupted install left maps behind (it never reserved ports); removing them",
            ),
            Self::ReservedPortsOfAnotherVersion => write!(
                formatter,
                "pinned maps are from another masq version; {KEEPING_PORTS}"
            ),
            Self::Removed(path) => write!(formatter, "removed {}", path.display()),
            Self::Done => formatter
                .write_str("masq is uninstalled from this node (programs detached, maps released)"),
        }
    }
}

/// Undoes what [`EbpfBackend::start`] and the startup after it did to the node: detaches the
/// programs from every uplink (tc filters live on the interfaces, not under the pin path: masq
/// removes its own, and a clsact qdisc only where it created it), releases exactly the ports
/// it reserved, and removes its pins. Each step is reported as it is done, so an error
/// leaves a record of how far it got.
pub fn uninstall(
    pin_path: &Path,
    sysctl_dir: &Path,
    mut report: impl FnMut(UninstallStep),
) -> Result<(), AgentError> {
    let pins = PinDir::new(pin_path);
    if pins.remove_staging()? {
        report(UninstallStep::RemovedStagedMaps);
    }
    match pins.inspect()? {
        PinnedState::Empty if pins.links().is_empty() => {
            report(UninstallStep::NothingPinned(pins.root().to_path_buf()));
            if pins.root().exists() {
                pins.remove_all()?;
            }
            return Ok(());
        }
        PinnedState::Compatible { .. } => {
            let maps = DatapathMaps::from_pins(pins.root())?;
            for (ifindex, uplink) in maps.uplinks()? {
                detach_uplink(&pins, ifindex, &uplink)?;
                report(UninstallStep::Detached {
                    interface: uplink.name().to_owned(),
                    mode: AttachMode::of(&uplink),
                });
            }
            match maps.meta() {
                Ok(meta) => {
                    reserved_ports::release(sysctl_dir, meta.reserved())?;
                    if !meta.reserved().is_empty() {
                        report(UninstallStep::ReleasedPorts(meta.reserved().to_vec()));
                    }
                }
                Err(error) => report(UninstallStep::ReservedPortsUnknown(error.to_string())),
            }
        }
        PinnedState::Leftovers(_) => report(UninstallStep::RemovingLeftovers),
        PinnedState::Empty | PinnedState::Incompatible(_) => {
            report(UninstallStep::ReservedPortsOfAnotherVersion);
        }
    }
    for path in pins.remove_all()? {
        report(UninstallStep::Removed(path));
    }
    report(UninstallStep::Done);
    Ok(())
}

/// Takes in the flows netfilter source-NATs to an uplink's address (read from conntrack),
/// before the programs are attached:
///
/// * after a take-over (`took_over`), upstream's flows (pod flows netfilter masqueraded, with
///   no destination NAT) are adopted: masq maps them to the node port they have, and their
///   conntrack entries are deleted. With its chain gone, netfilter does not reliably keep
///   translating them (an iptables-nft node sent the next packet out with the pod's address),
///   so masq translates them from then on, on the same port: they keep working to their end.
/// * every other such flow with a port in masq's ranges (another MASQUERADE rule's) keeps
///   its translation in netfilter, and its tuple is reserved: no pod flow gets its port.
///
/// A conntrack that cannot be read is logged, not fatal: masq's egress program reserves the
/// port of a flow netfilter translates at its next packet anyway.
fn take_in_kernel_nat_flows(
    datapath: &mut Datapath,
    node_addresses: &[IpAddr],
    options: &AgentOptions,
    took_over: bool,
) {
    let in_range = |port: u16| options.snat_ranges.iter().any(|range| range.contains(port));
    let is_node = |address: IpAddr| node_addresses.contains(&address);
    let now_ns = gc::monotonic_now_ns();
    let (mut adopted, mut reserved, mut taken) = (0_usize, 0_usize, 0_usize);
    let families = if options.enable_ipv6 {
        &[false, true][..]
    } else {
        &[false][..]
    };
    for &ipv6 in families {
        let flows = match conntrack::source_nat_flows(ipv6) {
            Ok(flows) => flows,
            Err(error) => {
                tracing::warn!(%error, "could not read the flows netfilter translates; their ports are reserved at their next packet instead");
                continue;
            }
        };
        for flow in flows.iter().filter(|flow| is_node(flow.node)) {
            let adopt = took_over && !flow.dst_nat && !is_node(flow.source);
            if !adopt && !in_range(flow.node_port) {
                continue;
            }
            let inserted = match (flow.source, flow.node, flow.remote) {
                (IpAddr::V4(source), IpAddr::V4(node), IpAddr::V4(remote)) => {
                    let flow = kernel_flow(flow, source.octets(), node.octets(), remote.octets());
                    datapath
                        .maps
                        .insert_kernel_flow(&if adopt { flow } else { flow.reserved() }, now_ns)
                }
                (IpAddr::V6(source), IpAddr::V6(node), IpAddr::V6(remote)) => {
                    let flow = kernel_flow(flow, source.octets(), node.octets(), remote.octets());
                    datapath
                        .maps
                        .insert_kernel_flow(&if adopt { flow } else { flow.reserved() }, now_ns)
                }
                _ => continue,
            };
            match inserted {
                Ok(true) if adopt => match conntrack::forget(flow) {
                    Ok(()) => adopted += 1,
                    Err(error) => {
                        tracing::warn!(%error, source = %flow.source, remote = %flow.remote, "adopted a flow but could not delete its conntrack entry; netfilter may translate it too");
                    }
                },
                Ok(true) => reserved += 1,
                Ok(false) => taken += 1,
                Err(error) => {
                    tracing::warn!(%error, "could not record a flow netfilter translates");
                }
            }
        }
    }
    if adopted + reserved + taken > 0 {
        tracing::info!(
            adopted,
            reserved,
            already_mapped_by_masq = taken,
            "took in the flows netfilter translates to the uplinks' addresses: upstream's are masq's now, on their ports; the others keep their ports"
        );
    }
}

/// `flow` in one family's addresses.
const fn kernel_flow<A: Copy>(
    flow: &conntrack::KernelNatFlow,
    source: A,
    node: A,
    remote: A,
) -> KernelFlow<A> {
    KernelFlow {
        protocol: flow.protocol,
        source,
        source_port: flow.source_port,
        node,
        node_port: flow.node_port,
        remote,
        remote_port: flow.remote_port,
        replied: flow.replied,
    }
}

/// A fresh map set: created and pinned in the staging directory, stamped with the layout
/// version, then published into the pin directory (the layout record last), so that a kill at
/// any instant leaves either leftovers the next start removes or a complete set it adopts.
fn create_maps(
    pins: &PinDir,
    nat_max_entries: u32,
    options: &AgentOptions,
) -> Result<Datapath, AgentError> {
    let staging = pins.create_staging()?;
    let built = Datapath::load(&LoadOptions {
        nat_max_entries,
        nomasq_max_entries: options.nomasq_max_entries,
        staged: None,
        pin_dir: Some(staging),
        debug_log: options.datapath_debug_log,
        ipv6: options.enable_ipv6,
    })
    .and_then(|mut datapath| {
        datapath.maps.set_meta(&MapMeta::current(nat_max_entries))?;
        pins.publish()?;
        Ok(datapath)
    });
    built.map_err(|error| {
        if let Err(cleanup) = pins.remove_staging() {
            tracing::warn!(%cleanup, "could not remove the staged maps; the next start will");
        }
        error.into()
    })
}

/// Adopts the pinned maps, replacing those whose capacity no longer fits the options: a trie
/// of another `--nomasq-max-entries` (rebuilt with the old one's entries), and IPv6 maps an
/// agent without `--enable-ipv6` created with room for nothing (empty, so nothing is lost). The
/// replacements are built in the staging directory, then renamed over the old pins: the
/// programs still attached keep the old maps until the new programs take over, and a kill at
/// any instant leaves one complete map of each pinned. A trie too small for what the old one
/// holds is not built; the old capacity stays.
fn adopt_maps(
    pins: &PinDir,
    nat_max_entries: u32,
    pinned: PinnedCapacities,
    options: &AgentOptions,
) -> Result<Datapath, AgentError> {
    let mut replaced = Vec::new();
    let mut trie_entries = Vec::new();
    if pinned.nomasq != options.nomasq_max_entries {
        let old = DatapathMaps::from_pins(pins.root())?.nomasq_entries()?;
        if old.len() > options.nomasq_max_entries as usize {
            tracing::warn!(
                pinned = pinned.nomasq,
                requested = options.nomasq_max_entries,
                entries = old.len(),
                "the trie holds more entries than --nomasq-max-entries allows; keeping its capacity"
            );
        } else {
            replaced.push(MAP_NOMASQ_V4);
            trie_entries = old;
        }
    }
    if options.enable_ipv6 {
        for (name, capacity, wanted) in [
            (MAP_NAT_V6, pinned.nat_v6, nat_max_entries),
            (MAP_NOMASQ_V6, pinned.nomasq_v6, options.nomasq_max_entries),
        ] {
            if capacity <= IPV6_DISABLED_ENTRIES && wanted > capacity {
                replaced.push(name);
            }
        }
        // The IPv6 flow index is sized from the IPv6 table.
        if replaced.contains(&MAP_NAT_V6) {
            replaced.push(MAP_FLOW_INDEX_V6);
        }
    }
    let load = |staged| {
        Datapath::load(&LoadOptions {
            nat_max_entries,
            nomasq_max_entries: options.nomasq_max_entries,
            staged,
            pin_dir: Some(pins.root().to_path_buf()),
            debug_log: options.datapath_debug_log,
            ipv6: options.enable_ipv6,
        })
    };
    if replaced.is_empty() {
        return Ok(load(None)?);
    }
    let staging = pins.create_staging()?;
    let built = load(Some(StagedMaps {
        dir: staging,
        names: replaced.clone(),
    }))
    .and_then(|mut datapath| {
        for (addr, prefix, kind) in &trie_entries {
            datapath
                .maps
                .nomasq_v4
                .insert(
                    &aya::maps::lpm_trie::Key::new(u32::from(*prefix), *addr),
                    kind,
                    0,
                )
                .map_err(DatapathError::map("inserting into", MAP_NOMASQ_V4))?;
        }
        pins.publish_staged(&replaced)?;
        Ok(datapath)
    });
    match built {
        Ok(datapath) => {
            if replaced.contains(&MAP_NOMASQ_V4) {
                tracing::info!(
                    from = pinned.nomasq,
                    to = options.nomasq_max_entries,
                    "resized the non-masquerade trie; the new programs use it from the swap on"
                );
            }
            if replaced.contains(&MAP_NAT_V6) || replaced.contains(&MAP_NOMASQ_V6) {
                tracing::info!(
                    nat_max_entries,
                    nomasq_max_entries = options.nomasq_max_entries,
                    "sized the pinned IPv6 maps for translation (an agent without --enable-ipv6 created them empty)"
                );
            }
            Ok(datapath)
        }
        Err(error) => {
            if let Err(cleanup) = pins.remove_staging() {
                tracing::warn!(%cleanup, "could not remove the staged maps; the next start will");
            }
            Err(error.into())
        }
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
