//! Attaching the classifiers to an interface, in one of two ways that both outlive the agent:
//!
//! * **tcx** (Linux 6.6+): links pinned under the pin directory. A new agent swaps its freshly
//!   loaded program into the existing link (`BPF_LINK_UPDATE`), so packets never see a moment
//!   without a program, and never two.
//! * **tc** (older kernels): direct-action cls_bpf filters on a clsact qdisc. Filters belong to
//!   the interface, not to a process; a new agent replaces the program of its own filter in
//!   place (same priority and handle), which is atomic as well.
//!
//! What masq added is recorded in the uplinks map ([`Uplink`]), so detaching removes exactly
//! that: masq's own links or filters, and a clsact qdisc only if masq created it and nothing
//! else uses it. No call here needs CAP_SYS_ADMIN.

use aya::{
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::{FdLink, LinkError, PinnedLink},
        tc::{NlOptions, SchedClassifierLink, TcAttachOptions},
    },
    util::KernelVersion,
};
use masq_common::layout::{ATTACH_TC, ATTACH_TCX, PROG_EGRESS, PROG_INGRESS, Uplink};

use super::{
    error::DatapathError,
    object::Datapath,
    pins::{Hook, PinDir},
    tc_netlink::{self, ClsactHook},
};
use crate::{causes::WithCauses, sys::bpf};

/// How the programs hang on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Pinned tcx links (Linux 6.6+).
    Tcx,
    /// Direct-action cls_bpf filters on a clsact qdisc (older kernels).
    Tc,
}

impl AttachMode {
    /// The mode this kernel supports best: tcx where it exists.
    pub fn best_for_kernel() -> Self {
        match KernelVersion::current() {
            Ok(version) if version >= KernelVersion::new(6, 6, 0) => Self::Tcx,
            _ => Self::Tc,
        }
    }

    /// The mode recorded in an uplinks map entry.
    pub const fn of(uplink: &Uplink) -> Option<Self> {
        match uplink.attach_mode {
            ATTACH_TCX => Some(Self::Tcx),
            ATTACH_TC => Some(Self::Tc),
            _ => None,
        }
    }

    /// Its code in the uplinks map.
    pub const fn code(self) -> u8 {
        match self {
            Self::Tcx => ATTACH_TCX,
            Self::Tc => ATTACH_TC,
        }
    }

    /// Its name in flags, logs and `masq status`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Tc => "tc",
        }
    }
}

impl std::fmt::Display for AttachMode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.name())
    }
}

/// What attaching did for one hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachOutcome {
    /// A new link or filter was created.
    Created,
    /// The existing link or filter now runs the new program.
    Replaced,
    /// The pinned link was no longer attached (its interface went away); a new one replaced it.
    Recreated,
    /// The link or filter sat elsewhere than the position asked for: it was removed and a new
    /// one created there (packets in between passed untranslated).
    Moved,
}

/// Where masq's program sits among the programs on a hook (tcx links, or tc filters by
/// priority). See docs/operating.md, "Other programs on the uplink".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HookPosition {
    /// Before every other program: nothing that ends the chain early can skip masq.
    #[default]
    First,
    /// After every other program: those before it see packets as they are on the wire on
    /// ingress (the node's address and port, as under iptables before conntrack's reverse
    /// NAT), but one that ends the chain skips masq.
    Last,
}

impl HookPosition {
    /// Name used in flags, logs and `masq status`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Last => "last",
        }
    }

    /// Where a tcx link is created.
    fn link_order(self) -> LinkOrder {
        match self {
            Self::First => LinkOrder::first(),
            Self::Last => LinkOrder::last(),
        }
    }

    /// The priority of masq's tc filter: tc runs filters by ascending priority.
    const fn tc_priority(self) -> u16 {
        match self {
            Self::First => TC_PRIORITY_FIRST,
            Self::Last => TC_PRIORITY_LAST,
        }
    }

    /// Whether the program `ours` holds this position among `order` (a hook's tcx programs in
    /// the order they run).
    fn holds(self, order: &[u32], ours: u32) -> bool {
        match self {
            Self::First => order.first() == Some(&ours),
            Self::Last => order.last() == Some(&ours),
        }
    }
}

/// masq's place on each hook of an uplink.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookPositions {
    /// On egress. First by default: later programs then see what iptables shows them, the
    /// node's address and port, and none before masq can send a pod's packet out untranslated.
    pub egress: HookPosition,
    /// On ingress. First by default: a program before masq that ends the chain (returns
    /// `TC_ACT_OK`, as many do) would keep replies from being translated back at all.
    pub ingress: HookPosition,
}

impl HookPositions {
    /// The position asked for on `hook`.
    pub const fn of(self, hook: Hook) -> HookPosition {
        match hook {
            Hook::Egress => self.egress,
            Hook::Ingress => self.ingress,
        }
    }
}

/// The program of `hook` and its name.
fn program_of(
    datapath: &mut Datapath,
    hook: Hook,
) -> Result<(&mut SchedClassifier, &'static str), DatapathError> {
    Ok(match hook {
        Hook::Egress => (datapath.egress_mut()?, PROG_EGRESS),
        Hook::Ingress => (datapath.ingress_mut()?, PROG_INGRESS),
    })
}

const fn attach_type(hook: Hook) -> TcAttachType {
    match hook {
        Hook::Egress => TcAttachType::Egress,
        Hook::Ingress => TcAttachType::Ingress,
    }
}

const fn clsact_hook(hook: Hook) -> ClsactHook {
    match hook {
        Hook::Egress => ClsactHook::Egress,
        Hook::Ingress => ClsactHook::Ingress,
    }
}

const HOOKS: [Hook; 2] = [Hook::Egress, Hook::Ingress];

/// Priority of masq's tc filters when first: nothing that ends the filter walk runs before.
const TC_PRIORITY_FIRST: u16 = 1;
/// Priority of masq's tc filters when last: the highest tc allows.
const TC_PRIORITY_LAST: u16 = u16::MAX;
/// Handle of masq's tc filters ("mq"); a restarted agent finds its filters by program name.
const TC_HANDLE: u32 = 0x6d71;

/// Attaches both programs to interface `name` (index `ifindex`) in `mode`, taking over what a
/// previous agent attached there, and returns the record to keep in the uplinks map (with
/// `snat_addr` left for the caller) and what happened per hook.
pub fn attach_uplink(
    datapath: &mut Datapath,
    pins: &PinDir,
    name: &str,
    ifindex: u32,
    mode: AttachMode,
    previous: Option<&Uplink>,
    positions: HookPositions,
) -> Result<(Uplink, [(Hook, AttachOutcome); 2]), DatapathError> {
    let ifname = Uplink::encode_name(name).ok_or_else(|| DatapathError::Attach {
        interface: name.to_owned(),
        detail: "the interface name is longer than the kernel allows".to_owned(),
    })?;
    let mut record = Uplink::new(
        previous.map_or([0; 4], |previous| previous.snat_addr),
        mode.code(),
        ifname,
    );
    let mut outcomes = [(Hook::Egress, AttachOutcome::Created); 2];
    match mode {
        AttachMode::Tcx => {
            for (slot, hook) in outcomes.iter_mut().zip(HOOKS) {
                *slot = (
                    hook,
                    attach_tcx(datapath, pins, name, ifindex, hook, positions.of(hook))?,
                );
            }
        }
        AttachMode::Tc => {
            let created =
                tc_netlink::add_clsact(ifindex).map_err(|error| DatapathError::Attach {
                    interface: name.to_owned(),
                    detail: WithCauses(&error).to_string(),
                })?;
            // A qdisc masq created stays masq's across restarts, whoever finds it.
            let created_before =
                previous.is_some_and(|previous| previous.created_clsact != 0 && !created);
            record.created_clsact = u8::from(created || created_before);
            for (slot, hook) in outcomes.iter_mut().zip(HOOKS) {
                *slot = (
                    hook,
                    attach_tc(datapath, name, ifindex, hook, positions.of(hook))?,
                );
            }
        }
    }
    Ok((record, outcomes))
}

fn attach_tcx(
    datapath: &mut Datapath,
    pins: &PinDir,
    name: &str,
    ifindex: u32,
    hook: Hook,
    position: HookPosition,
) -> Result<AttachOutcome, DatapathError> {
    let (program, program_name) = program_of(datapath, hook)?;
    let path = pins.link(hook, name);
    let mut outcome = AttachOutcome::Created;
    match bpf::open_pinned(&path) {
        Ok(link) => {
            let info = bpf::tcx_link_info(std::os::fd::AsFd::as_fd(&link)).map_err(|error| {
                DatapathError::Link {
                    path: path.clone(),
                    detail: WithCauses(&error).to_string(),
                }
            })?;
            // A hook that cannot be queried is taken as in place: moving the link would leave a
            // gap without translation on the strength of no evidence.
            let in_place = match bpf::tcx_program_ids(ifindex, hook) {
                Ok(order) => position.holds(&order, info.program_id),
                Err(error) => {
                    tracing::warn!(interface = name, hook = hook.name(), error = %WithCauses(&error), "could not read the hook's program order; leaving masq's link where it is");
                    true
                }
            };
            if info.ifindex == ifindex && info.hook == Some(hook) && !in_place {
                tracing::warn!(
                    interface = name,
                    hook = hook.name(),
                    position = position.name(),
                    "moving masq's program on the hook; packets in between pass untranslated"
                );
                drop(link);
                remove_pin(&path)?;
                outcome = AttachOutcome::Moved;
            } else if info.ifindex == ifindex && info.hook == Some(hook) {
                let pinned = PinnedLink::from_pin(&path).map_err(|error| DatapathError::Link {
                    path: path.clone(),
                    detail: WithCauses(&error).to_string(),
                })?;
                let link = SchedClassifierLink::try_from(FdLink::from(pinned)).map_err(
                    |error: LinkError| DatapathError::Link {
                        path: path.clone(),
                        detail: WithCauses(&error).to_string(),
                    },
                )?;
                let link_id = program
                    .attach_to_link(link)
                    .map_err(DatapathError::program("replacing in link", program_name))?;
                // The pin keeps the link; dropping our handle must not detach it.
                drop(
                    program
                        .take_link(link_id)
                        .map_err(DatapathError::program("releasing link of", program_name))?,
                );
                return Ok(AttachOutcome::Replaced);
            } else {
                tracing::warn!(
                    link = %path.display(),
                    linked_ifindex = info.ifindex,
                    ifindex,
                    "pinned link no longer hangs on this interface (it was recreated); creating a new one"
                );
                remove_pin(&path)?;
                outcome = AttachOutcome::Recreated;
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(DatapathError::Link {
                path,
                detail: WithCauses(&error).to_string(),
            });
        }
    }
    // Where asked (see `HookPositions` for the defaults and why).
    let link_id = program
        .attach_with_options(
            name,
            attach_type(hook),
            TcAttachOptions::TcxOrder(position.link_order()),
        )
        .map_err(DatapathError::program("attaching", program_name))?;
    let link = program
        .take_link(link_id)
        .map_err(DatapathError::program("taking link of", program_name))?;
    let fd_link = FdLink::try_from(link).map_err(|error| DatapathError::Link {
        path: path.clone(),
        detail: WithCauses(&error).to_string(),
    })?;
    fd_link.pin(&path).map_err(|source| DatapathError::Pin {
        what: format!("{} link", hook.name()),
        path,
        source,
    })?;
    Ok(outcome)
}

fn attach_tc(
    datapath: &mut Datapath,
    name: &str,
    ifindex: u32,
    hook: Hook,
    position: HookPosition,
) -> Result<AttachOutcome, DatapathError> {
    let (program, program_name) = program_of(datapath, hook)?;
    let attach_error = |detail: String| DatapathError::Attach {
        interface: name.to_owned(),
        detail,
    };
    let (ours, others): (Vec<tc_netlink::TcFilter>, Vec<tc_netlink::TcFilter>) =
        tc_netlink::list_filters(ifindex, clsact_hook(hook))
            .map_err(|error| attach_error(WithCauses(&error).to_string()))?
            .into_iter()
            .partition(|filter| filter.bpf_name.as_deref() == Some(program_name));
    let priority = position.tc_priority();
    let (placed, misplaced): (Vec<_>, Vec<_>) = ours
        .into_iter()
        .partition(|filter| filter.priority == priority);
    let delete = |filter: &tc_netlink::TcFilter| {
        tc_netlink::delete_filter_if_named(
            ifindex,
            clsact_hook(hook),
            filter.priority,
            filter.handle,
            program_name,
        )
        .map_err(|error| attach_error(WithCauses(&error).to_string()))
    };
    if placed.is_empty() && !misplaced.is_empty() {
        tracing::warn!(
            interface = name,
            hook = hook.name(),
            position = position.name(),
            "moving masq's program on the hook; packets in between pass untranslated"
        );
    }
    // Filters at another priority (a changed position), and leftovers of an interrupted attach
    // next to the one kept: each would run the old program a second time.
    for filter in misplaced.iter().chain(placed.iter().skip(1)) {
        delete(filter)?;
    }
    let (link_id, outcome) = if let Some(existing) = placed.first() {
        let link = SchedClassifierLink::attached(
            name,
            attach_type(hook),
            existing.priority,
            existing.handle.into(),
            None,
        )
        .map_err(|error| attach_error(WithCauses(&error).to_string()))?;
        let link_id = program
            .attach_to_link(link)
            .map_err(DatapathError::program("replacing in filter", program_name))?;
        (link_id, AttachOutcome::Replaced)
    } else {
        // tc runs filters in priority order and the first verdict other than "continue" ends
        // the walk: say so when another filter shares masq's end of it.
        let contested = match position {
            HookPosition::First => others.iter().any(|filter| filter.priority <= priority),
            HookPosition::Last => others.iter().any(|filter| filter.priority >= priority),
        };
        if contested {
            tracing::warn!(
                interface = name,
                hook = hook.name(),
                position = position.name(),
                "another tc filter shares masq's priority at that end of the hook"
            );
        }
        let options = NlOptions {
            priority,
            handle: TC_HANDLE.into(),
            ..NlOptions::default()
        };
        let link_id = program
            .attach_with_options(name, attach_type(hook), TcAttachOptions::Netlink(options))
            .map_err(DatapathError::program("attaching", program_name))?;
        let outcome = if misplaced.is_empty() {
            AttachOutcome::Created
        } else {
            AttachOutcome::Moved
        };
        (link_id, outcome)
    };
    let link = program
        .take_link(link_id)
        .map_err(DatapathError::program("taking filter of", program_name))?;
    // Dropping the handle would delete the filter; the filter must outlive the agent.
    std::mem::forget(link);
    Ok(outcome)
}

/// Removes what masq attached to interface `ifindex` as `uplink` records it. An interface that
/// is gone took its filters with it; a tcx link pin is removed either way.
pub fn detach_uplink(pins: &PinDir, ifindex: u32, uplink: &Uplink) -> Result<(), DatapathError> {
    let name = uplink.name();
    match AttachMode::of(uplink) {
        Some(AttachMode::Tcx) | None => {
            for hook in HOOKS {
                let path = pins.link(hook, name);
                if std::fs::symlink_metadata(&path).is_ok() {
                    remove_pin(&path)?;
                }
            }
        }
        Some(AttachMode::Tc) => {
            if !interface_is(ifindex, name) {
                return Ok(());
            }
            let detach_error = |detail: String| DatapathError::Attach {
                interface: name.to_owned(),
                detail,
            };
            let mut others = 0;
            for hook in HOOKS {
                let program_name = match hook {
                    Hook::Egress => PROG_EGRESS,
                    Hook::Ingress => PROG_INGRESS,
                };
                for filter in tc_netlink::list_filters(ifindex, clsact_hook(hook))
                    .map_err(|error| detach_error(WithCauses(&error).to_string()))?
                {
                    if filter.bpf_name.as_deref() == Some(program_name) {
                        tc_netlink::delete_filter_if_named(
                            ifindex,
                            clsact_hook(hook),
                            filter.priority,
                            filter.handle,
                            program_name,
                        )
                        .map_err(|error| detach_error(WithCauses(&error).to_string()))?;
                    } else {
                        others += 1;
                    }
                }
            }
            if uplink.created_clsact != 0 {
                if others == 0 {
                    tc_netlink::delete_clsact(ifindex)
                        .map_err(|error| detach_error(WithCauses(&error).to_string()))?;
                } else {
                    tracing::info!(
                        interface = name,
                        filters = others,
                        "leaving the clsact qdisc masq created: other filters use it now"
                    );
                }
            }
        }
    }
    Ok(())
}

/// Whether interface `ifindex` still exists under `name` (not deleted, not reused).
fn interface_is(ifindex: u32, name: &str) -> bool {
    crate::sys::link::index(name) == Some(ifindex)
}

fn remove_pin(path: &std::path::Path) -> Result<(), DatapathError> {
    std::fs::remove_file(path).map_err(|source| DatapathError::Io {
        what: "removing",
        path: path.to_path_buf(),
        source,
    })
}

/// One program attached to a hook, as `masq status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookProgram {
    /// The program's id (0 when unknown).
    pub program_id: u32,
    /// Its name where the kernel tells it without CAP_SYS_ADMIN (tc filters carry it).
    pub name: Option<String>,
    /// Whether it is masq's own attachment.
    pub ours: bool,
    /// How it is attached: `tcx link N`, `tc filter prio P handle H`.
    pub how: String,
}

/// What runs on `hook` of interface `ifindex`, in the order the kernel runs it: tcx programs
/// first, then tc filters. An error is the reason the kernel would not say.
pub fn programs_on(
    pins: &PinDir,
    ifindex: u32,
    uplink: &Uplink,
    hook: Hook,
) -> Result<Vec<HookProgram>, String> {
    let name = uplink.name();
    let our_name = match hook {
        Hook::Egress => PROG_EGRESS,
        Hook::Ingress => PROG_INGRESS,
    };
    let our_link = bpf::open_pinned(&pins.link(hook, name))
        .ok()
        .and_then(|fd| bpf::tcx_link_info(std::os::fd::AsFd::as_fd(&fd)).ok())
        .filter(|info| info.ifindex == ifindex);
    let mut programs: Vec<HookProgram> = bpf::tcx_program_ids(ifindex, hook)
        .map_err(|error| format!("querying tcx: {}", WithCauses(&error)))?
        .into_iter()
        .map(|program_id| {
            let ours = our_link.is_some_and(|info| info.program_id == program_id);
            HookProgram {
                program_id,
                // Other programs' names would need CAP_SYS_ADMIN (opening them by id).
                name: ours.then(|| our_name.to_owned()),
                ours,
                how: match our_link {
                    Some(info) if ours => format!("tcx link {}", info.link_id),
                    _ => "tcx".to_owned(),
                },
            }
        })
        .collect();
    let filters = tc_netlink::list_filters(ifindex, clsact_hook(hook))
        .map_err(|error| format!("listing tc filters: {}", WithCauses(&error)))?;
    programs.extend(filters.into_iter().map(|filter| HookProgram {
        program_id: filter.bpf_prog_id.unwrap_or(0),
        ours: AttachMode::of(uplink) == Some(AttachMode::Tc)
            && filter.bpf_name.as_deref() == Some(our_name),
        how: format!(
            "tc {} filter prio {} handle {:#x}{}",
            filter.kind,
            filter.priority,
            filter.handle,
            if filter.direct_action { " da" } else { "" }
        ),
        name: filter.bpf_name,
    }));
    Ok(programs)
}
