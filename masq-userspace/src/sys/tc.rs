//! The `clsact` qdisc and the filters on its hooks, over rtnetlink.
//!
//! Kernels before 6.6 have no tcx, so masq's legacy attach mode puts its classifiers on a
//! `clsact` qdisc as direct-action `cls_bpf` filters. aya adds the qdisc, attaches a filter and
//! replaces its program in place, but it cannot list the filters, tell a `clsact` from another
//! qdisc in the same slot, or remove one filter only while it is still masq's. This module does
//! those with `netlink-packet-route` messages on the [`super::netlink`] socket: they are rare
//! control-plane calls, so each public function opens its own socket and closes it again. The
//! datapath knows this module as `datapath::tc_netlink`.
//!
//! Listing needs no capability; adding and deleting need CAP_NET_ADMIN. Every refusal keeps the
//! kernel's errno (and its extended-ack text when it sends one), so callers can tell EPERM from
//! ENOENT from EEXIST from EOPNOTSUPP. A short or corrupt reply is an error, never a panic.

use std::time::Duration;

use netlink_packet_core::{
    DecodeError, NLA_HEADER_SIZE, NLM_F_CREATE, NLM_F_EXCL, NlasIterator,
    ParseableParametrized as _, parse_string, parse_u32,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcBpfFlags, TcFilterBpfOption, TcHandle, TcHeader, TcMessage, TcOption},
};
use nix::errno::Errno;

use super::netlink::{Family, NetlinkError, NetlinkSocket};

/// The clsact qdisc's own handle, `ffff:` (`TC_H_MAKE(TC_H_CLSACT, 0)`).
const CLSACT_HANDLE: TcHandle = TcHandle {
    major: TcHandle::CLSACT.major,
    minor: 0,
};

/// Kind string of the clsact qdisc.
const CLSACT_KIND: &str = "clsact";
/// Kind string of the eBPF classifier.
const BPF_KIND: &str = netlink_packet_route::tc::TcFilterBpf::KIND;

/// How long to wait for any reply before giving up (see [`NetlinkSocket::open`]).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A hook of the clsact qdisc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClsactHook {
    /// Packets arriving on the interface.
    Ingress,
    /// Packets leaving through the interface.
    Egress,
}

impl ClsactHook {
    /// The filter parent addressing this hook: `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)` or
    /// `..._EGRESS`, `ffff:fff2` / `ffff:fff3` in tc's notation.
    pub fn parent(self) -> u32 {
        self.handle().into()
    }

    const fn handle(self) -> TcHandle {
        let minor = match self {
            Self::Ingress => TcHandle::MIN_INGRESS,
            Self::Egress => TcHandle::MIN_EGRESS,
        };
        TcHandle {
            major: TcHandle::CLSACT.major,
            minor,
        }
    }

    /// Name used in messages.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

/// One filter found on a clsact hook: a cls_bpf filter, or another tool's filter of any kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcFilter {
    /// Priority (`tc ... prio`, shown as `pref`): lower numbers run first.
    pub priority: u16,
    /// The filter's handle within its priority (aya's `TcHandle` as a `u32`).
    pub handle: u32,
    /// Ethernet protocol matched, host order `ETH_P_*` (`ETH_P_ALL`, 3, for aya's filters).
    pub protocol: u16,
    /// The filter chain; 0 unless the filter was added with `chain N`. Only chain 0 runs
    /// without a `goto chain` action.
    pub chain: u32,
    /// The classifier kind: `"bpf"`, `"u32"`, `"matchall"`, ...
    pub kind: String,
    /// `TCA_BPF_NAME` of a bpf filter: aya sets the program's name, tc the object and section.
    pub bpf_name: Option<String>,
    /// Id of the program a bpf filter runs (`TCA_BPF_ID`), as in `bpftool prog show id N`.
    pub bpf_prog_id: Option<u32>,
    /// Whether a bpf filter runs in direct-action mode (its return code is the verdict).
    pub direct_action: bool,
}

/// An rtnetlink request failed, or its answer could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum TcNetlinkError {
    /// The netlink socket could not be opened or used.
    #[error("rtnetlink socket: {operation} failed: {errno}")]
    Socket {
        /// What was being done.
        operation: &'static str,
        /// The system call's error (EAGAIN when the kernel did not answer in time).
        errno: Errno,
    },
    /// The kernel refused a request.
    #[error("{operation} on interface {ifindex} failed: {errno}{}", kernel_says(.message))]
    Kernel {
        /// What was being done.
        operation: &'static str,
        /// The interface index.
        ifindex: u32,
        /// The kernel's errno: EPERM without CAP_NET_ADMIN, ENOENT for what does not exist,
        /// EEXIST for what already does, EOPNOTSUPP for what this kernel lacks.
        errno: Errno,
        /// The kernel's extended-ack text, when it sent one.
        message: Option<String>,
    },
    /// The kernel has no clsact qdisc, so the legacy attach mode cannot work on it.
    #[error(
        "kernel without clsact: adding the clsact qdisc to interface {ifindex} failed with \
         {errno}{}; masq's legacy attach mode needs the clsact qdisc (Linux 4.5 or later built \
         with CONFIG_NET_SCHED and CONFIG_NET_SCH_INGRESS) and cls_bpf (CONFIG_NET_CLS_BPF)",
        kernel_says(.message)
    )]
    ClsactUnsupported {
        /// The interface index.
        ifindex: u32,
        /// ENOENT (unknown qdisc kind) or EOPNOTSUPP (no traffic control at all).
        errno: Errno,
        /// The kernel's extended-ack text, when it sent one.
        message: Option<String>,
    },
    /// Another qdisc occupies the slot clsact needs (typically the older `ingress` qdisc).
    #[error(
        "interface {ifindex} has a {kind:?} qdisc where clsact belongs (parent ffff:fff1); masq \
         does not replace another tool's qdisc: remove it (`tc qdisc del dev <interface> \
         {kind}`) if nothing needs it"
    )]
    IngressSlotTaken {
        /// The interface index.
        ifindex: u32,
        /// The kind of the qdisc found there.
        kind: String,
    },
    /// A delete was asked for priority 0 or handle 0, which the kernel reads as "every filter
    /// in the chain" or "every filter at this priority".
    #[error(
        "refusing to delete filter prio {priority} handle {handle:#x} on interface {ifindex}: a \
         zero priority or handle would make the kernel delete other filters too"
    )]
    Wildcard {
        /// The interface index.
        ifindex: u32,
        /// The priority asked for.
        priority: u16,
        /// The handle asked for.
        handle: u32,
    },
    /// A dump kept being torn by concurrent changes.
    #[error(
        "{operation} on interface {ifindex}: the dump was interrupted by concurrent changes \
         {attempts} times in a row"
    )]
    DumpInterrupted {
        /// What was being listed.
        operation: &'static str,
        /// The interface index.
        ifindex: u32,
        /// How many dumps were tried.
        attempts: u32,
    },
    /// A message was too short or inconsistent.
    #[error("malformed rtnetlink message: {0}")]
    Malformed(String),
}

impl TcNetlinkError {
    /// The errno behind the error, when there is one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Socket { errno, .. }
            | Self::Kernel { errno, .. }
            | Self::ClsactUnsupported { errno, .. } => Some(*errno),
            Self::IngressSlotTaken { .. }
            | Self::Wildcard { .. }
            | Self::DumpInterrupted { .. }
            | Self::Malformed(_) => None,
        }
    }

    /// Whether this says the kernel cannot do clsact at all (as opposed to a failure on one
    /// interface), for a clear "kernel without clsact" diagnosis.
    pub fn is_kernel_without_clsact(&self) -> bool {
        matches!(self, Self::ClsactUnsupported { .. })
    }

    /// The error of `operation` on interface `ifindex` that the exchange failed with.
    fn from_netlink(error: NetlinkError, operation: &'static str, ifindex: u32) -> Self {
        match error {
            NetlinkError::Socket {
                operation: step,
                errno,
            } => Self::Socket {
                operation: step,
                errno,
            },
            NetlinkError::Refused { errno, message } => Self::Kernel {
                operation,
                ifindex,
                errno,
                message,
            },
            NetlinkError::Interrupted { attempts } => Self::DumpInterrupted {
                operation,
                ifindex,
                attempts,
            },
            NetlinkError::Malformed(what) => Self::Malformed(what),
        }
    }
}

/// Formats the kernel's extended-ack text for an error message.
fn kernel_says(message: &Option<String>) -> String {
    message
        .as_deref()
        .map(|text| format!(" (kernel: {text})"))
        .unwrap_or_default()
}

fn open() -> Result<NetlinkSocket, TcNetlinkError> {
    NetlinkSocket::open(Family::Route, REPLY_TIMEOUT)
        .map_err(|error| TcNetlinkError::from_netlink(error, "opening a socket", 0))
}

/// The kind of the qdisc in the interface's ingress slot (`"clsact"`, `"ingress"`), or `None`
/// when it has none (RTM_GETQDISC dump, filtered by interface and parent `ffff:fff1`).
pub fn ingress_qdisc_kind(ifindex: u32) -> Result<Option<String>, TcNetlinkError> {
    ingress_qdisc_kind_with(&mut open()?, ifindex)
}

/// Whether the interface has a clsact qdisc.
pub fn has_clsact(ifindex: u32) -> Result<bool, TcNetlinkError> {
    Ok(ingress_qdisc_kind(ifindex)?.as_deref() == Some(CLSACT_KIND))
}

/// Adds a clsact qdisc: `Ok(true)` if it was created, `Ok(false)` if the interface had one
/// already. Fails with [`TcNetlinkError::ClsactUnsupported`] on a kernel without clsact and with
/// [`TcNetlinkError::IngressSlotTaken`] when another qdisc (an `ingress`) holds its place.
pub fn add_clsact(ifindex: u32) -> Result<bool, TcNetlinkError> {
    const OPERATION: &str = "adding the clsact qdisc";
    let mut rtnl = open()?;
    // NLM_F_EXCL turns an occupied slot into EEXIST; without it the kernel quietly accepts a
    // "change" of an existing clsact and created and found would look the same.
    let request = || {
        RouteNetlinkMessage::NewQueueDiscipline(tc_message(
            ifindex,
            CLSACT_HANDLE,
            TcHandle::CLSACT,
            0,
            Some(CLSACT_KIND),
        ))
    };
    match acknowledged(
        &mut rtnl,
        NLM_F_CREATE | NLM_F_EXCL,
        request,
        OPERATION,
        ifindex,
    ) {
        Ok(()) => Ok(true),
        // EEXIST only says the slot is taken: by a clsact (fine) or an `ingress` qdisc (not).
        Err(TcNetlinkError::Kernel {
            errno: Errno::EEXIST,
            message,
            ..
        }) => match ingress_qdisc_kind_with(&mut rtnl, ifindex)? {
            Some(kind) if kind == CLSACT_KIND => Ok(false),
            Some(kind) => Err(TcNetlinkError::IngressSlotTaken { ifindex, kind }),
            None => Err(TcNetlinkError::Kernel {
                operation: OPERATION,
                ifindex,
                errno: Errno::EEXIST,
                message,
            }),
        },
        Err(error) => Err(unsupported_if_kernel_lacks_clsact(error)),
    }
}

/// Deletes the clsact qdisc, and with it every filter on both of its hooks. `Ok(false)` when
/// there was none; another qdisc in the slot (an `ingress`) is left alone.
pub fn delete_clsact(ifindex: u32) -> Result<bool, TcNetlinkError> {
    let mut rtnl = open()?;
    // Naming the handle and kind makes the kernel refuse (EINVAL) rather than delete an
    // `ingress` qdisc that some other tool put in the same slot.
    let request = || {
        RouteNetlinkMessage::DelQueueDiscipline(tc_message(
            ifindex,
            CLSACT_HANDLE,
            TcHandle::CLSACT,
            0,
            Some(CLSACT_KIND),
        ))
    };
    match acknowledged(&mut rtnl, 0, request, "deleting the clsact qdisc", ifindex) {
        Ok(()) => Ok(true),
        Err(TcNetlinkError::Kernel {
            errno: Errno::ENOENT,
            ..
        }) => Ok(false),
        // The kernel answers EINVAL ("invalid handle", "must match existing qdisc") both when
        // the slot holds another qdisc and when it is empty but was used before: tell a clsact
        // that still exists (a real failure) from one that does not.
        Err(
            error @ TcNetlinkError::Kernel {
                errno: Errno::EINVAL,
                ..
            },
        ) => match ingress_qdisc_kind_with(&mut rtnl, ifindex)? {
            Some(kind) if kind == CLSACT_KIND => Err(error),
            _ => Ok(false),
        },
        Err(error) => Err(error),
    }
}

/// All filters on the clsact hook of the interface (RTM_GETTFILTER dump of parent
/// `ffff:fff2`/`ffff:fff3`), in the kernel's order: by chain, then priority. Empty when the
/// interface has no clsact qdisc.
///
/// The kernel also reports one entry per priority with handle 0 that stands for the classifier
/// instance rather than a filter; those are left out.
pub fn list_filters(ifindex: u32, hook: ClsactHook) -> Result<Vec<TcFilter>, TcNetlinkError> {
    list_filters_with(&mut open()?, ifindex, hook)
}

/// Deletes exactly the filter at (`priority`, `handle`) in chain 0 of the hook, only if it is a
/// bpf filter whose `TCA_BPF_NAME` is `expected_name`; returns whether it deleted one. Another
/// tool's filter is never touched: a different kind or name, or no filter there, is `Ok(false)`.
///
/// Checking and deleting are two requests, so a filter swapped in between by another writer
/// at the same priority and handle could still go; the delete names the kind and protocol it
/// saw, so only a bpf filter of that protocol can be hit.
pub fn delete_filter_if_named(
    ifindex: u32,
    hook: ClsactHook,
    priority: u16,
    handle: u32,
    expected_name: &str,
) -> Result<bool, TcNetlinkError> {
    if priority == 0 || handle == 0 {
        return Err(TcNetlinkError::Wildcard {
            ifindex,
            priority,
            handle,
        });
    }
    let mut rtnl = open()?;
    let filters = list_filters_with(&mut rtnl, ifindex, hook)?;
    let Some(ours) = filters.iter().find(|filter| {
        filter.chain == 0
            && filter.priority == priority
            && filter.handle == handle
            && filter.kind == BPF_KIND
            && filter.bpf_name.as_deref() == Some(expected_name)
    }) else {
        return Ok(false);
    };
    let request = || {
        RouteNetlinkMessage::DelTrafficFilter(tc_message(
            ifindex,
            handle.into(),
            hook.handle(),
            tc_info(priority, ours.protocol),
            Some(BPF_KIND),
        ))
    };
    match acknowledged(&mut rtnl, 0, request, "deleting a clsact filter", ifindex) {
        Ok(()) => Ok(true),
        // Gone since the listing: nothing left to delete.
        Err(TcNetlinkError::Kernel {
            errno: Errno::ENOENT,
            ..
        }) => Ok(false),
        Err(error) => Err(error),
    }
}

/// Turns the errors the kernel gives for an unknown qdisc kind (ENOENT) or for missing traffic
/// control support (EOPNOTSUPP: no RTM_NEWQDISC handler) into the dedicated variant.
fn unsupported_if_kernel_lacks_clsact(error: TcNetlinkError) -> TcNetlinkError {
    match error {
        TcNetlinkError::Kernel {
            ifindex,
            errno: errno @ (Errno::ENOENT | Errno::EOPNOTSUPP),
            message,
            ..
        } => TcNetlinkError::ClsactUnsupported {
            ifindex,
            errno,
            message,
        },
        other => other,
    }
}

/// `tcm_info` of a filter: priority in the upper half, protocol in network order in the lower.
fn tc_info(priority: u16, protocol: u16) -> u32 {
    (u32::from(priority) << 16) | u32::from(protocol.to_be())
}

/// A traffic-control message about interface `ifindex` (family AF_UNSPEC), with its kind when
/// it names one.
fn tc_message(
    ifindex: u32,
    handle: TcHandle,
    parent: TcHandle,
    info: u32,
    kind: Option<&str>,
) -> TcMessage {
    let header = TcHeader {
        // The kernel's `int`, kept as its bit pattern: indexes are positive.
        index: ifindex.cast_signed(),
        handle,
        parent,
        info,
        ..TcHeader::default()
    };
    let attributes = kind
        .map(|kind| TcAttribute::Kind(kind.to_owned()))
        .into_iter()
        .collect();
    TcMessage::from_parts(header, attributes)
}

/// Sends `request` with `flags` and waits for the kernel's acknowledgement.
fn acknowledged(
    rtnl: &mut NetlinkSocket,
    flags: u16,
    request: impl Fn() -> RouteNetlinkMessage,
    operation: &'static str,
    ifindex: u32,
) -> Result<(), TcNetlinkError> {
    rtnl.acknowledged(flags, request)
        .map_err(|error| TcNetlinkError::from_netlink(error, operation, ifindex))
}

fn ingress_qdisc_kind_with(
    rtnl: &mut NetlinkSocket,
    ifindex: u32,
) -> Result<Option<String>, TcNetlinkError> {
    // The qdisc dump covers every interface (the kernel ignores tcm_ifindex here), so the
    // interface is picked out of the answer.
    let request = || {
        RouteNetlinkMessage::GetQueueDiscipline(tc_message(
            ifindex,
            TcHandle::UNSPEC,
            TcHandle::UNSPEC,
            0,
            None,
        ))
    };
    let kinds = rtnl
        .dump(request, |kind, payload| {
            parse_ingress_qdisc(kind, payload, ifindex)
        })
        .map_err(|error| TcNetlinkError::from_netlink(error, "listing qdiscs", ifindex))?;
    Ok(kinds.into_iter().next())
}

fn list_filters_with(
    rtnl: &mut NetlinkSocket,
    ifindex: u32,
    hook: ClsactHook,
) -> Result<Vec<TcFilter>, TcNetlinkError> {
    // The filter dump resolves the parent through whatever qdisc holds handle ffff:; an
    // `ingress` qdisc answers for any minor, so without this check its filters would be
    // reported as clsact egress filters.
    if ingress_qdisc_kind_with(rtnl, ifindex)?.as_deref() != Some(CLSACT_KIND) {
        return Ok(Vec::new());
    }
    let operation = match hook {
        ClsactHook::Ingress => "listing clsact ingress filters",
        ClsactHook::Egress => "listing clsact egress filters",
    };
    let request = || {
        RouteNetlinkMessage::GetTrafficFilter(tc_message(
            ifindex,
            TcHandle::UNSPEC,
            hook.handle(),
            0,
            None,
        ))
    };
    rtnl.dump(request, |kind, payload| {
        parse_filter(kind, payload, ifindex)
    })
    .map_err(|error| TcNetlinkError::from_netlink(error, operation, ifindex))
}

/// The message of type `kind` in `payload` if it is about interface `ifindex`. Only then is it
/// read whole: another interface's qdisc or filter that the crate cannot read must not fail a
/// listing that does not concern it.
fn tc_message_on(
    kind: u16,
    payload: &[u8],
    ifindex: u32,
) -> Result<Option<RouteNetlinkMessage>, DecodeError> {
    if TcHeader::parse(payload)?.index.cast_unsigned() != ifindex {
        return Ok(None);
    }
    RouteNetlinkMessage::parse_with_param(payload, kind).map(Some)
}

/// The kind of the qdisc in `ifindex`'s ingress slot, if the message describes it.
fn parse_ingress_qdisc(
    kind: u16,
    payload: &[u8],
    ifindex: u32,
) -> Result<Option<String>, DecodeError> {
    let qdisc = match tc_message_on(kind, payload, ifindex) {
        Ok(Some(RouteNetlinkMessage::NewQueueDiscipline(qdisc))) => qdisc,
        Ok(_) => return Ok(None),
        // Another qdisc of the interface (a root qdisc with options the crate cannot read) is
        // none of masq's business; one in the ingress slot is read without the crate.
        Err(unreadable) => {
            let Ok(header) = TcHeader::parse(payload) else {
                return Err(unreadable);
            };
            if header.parent != TcHandle::CLSACT {
                return Ok(None);
            }
            return raw_kind(payload).map(Some).ok_or(unreadable);
        }
    };
    if qdisc.header.parent != TcHandle::CLSACT {
        return Ok(None);
    }
    qdisc
        .attributes
        .into_iter()
        .find_map(|attribute| match attribute {
            TcAttribute::Kind(kind) => Some(Some(kind)),
            _ => None,
        })
        .ok_or_else(|| DecodeError::from("qdisc without a kind"))
}

/// The filter the message describes, if it is one on `ifindex` (not a handle-0 classifier
/// entry).
fn parse_filter(kind: u16, payload: &[u8], ifindex: u32) -> Result<Option<TcFilter>, DecodeError> {
    let message = match tc_message_on(kind, payload, ifindex) {
        Ok(Some(RouteNetlinkMessage::NewTrafficFilter(message))) => message,
        Ok(_) => return Ok(None),
        Err(error) if kind == RTM_NEWTFILTER => return foreign_filter(payload, error),
        Err(error) => return Err(error),
    };
    let (header, attributes) = message.into_parts();
    let Some(mut filter) = unnamed_filter(&header) else {
        return Ok(None);
    };
    for attribute in attributes {
        match attribute {
            TcAttribute::Kind(kind) => filter.kind = kind,
            TcAttribute::Chain(chain) => filter.chain = chain,
            // The crate reads options by the classifier's kind, so only a bpf filter's come
            // out as bpf options.
            TcAttribute::Options(options) => {
                for option in options {
                    match option {
                        TcOption::Bpf(TcFilterBpfOption::ProgName(name)) => {
                            filter.bpf_name = Some(name);
                        }
                        TcOption::Bpf(TcFilterBpfOption::ProgId(id)) => {
                            filter.bpf_prog_id = Some(id);
                        }
                        TcOption::Bpf(TcFilterBpfOption::Flags(flags)) => {
                            filter.direct_action = flags.contains(TcBpfFlags::DirectAction);
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    if filter.kind.is_empty() {
        return Err(DecodeError::from("filter without a kind"));
    }
    Ok(Some(filter))
}

/// `RTM_NEWTFILTER`: the message type of a filter in a dump.
const RTM_NEWTFILTER: u16 = 44;
/// `TCA_KIND` and `TCA_CHAIN`: the filter attributes read without the crate.
const TCA_KIND: u16 = 1;
const TCA_CHAIN: u16 = 11;

/// The filter at `header`'s place, of no kind yet and with no program, if it is a filter (not
/// a handle-0 classifier entry).
fn unnamed_filter(header: &TcHeader) -> Option<TcFilter> {
    let handle = u32::from(header.handle);
    if handle == 0 {
        return None;
    }
    let [priority_high, priority_low, protocol_high, protocol_low] = header.info.to_be_bytes();
    Some(TcFilter {
        priority: u16::from_be_bytes([priority_high, priority_low]),
        handle,
        // The low half of tcm_info holds the protocol in network order.
        protocol: u16::from_be(u16::from_be_bytes([protocol_high, protocol_low])),
        chain: 0,
        kind: String::new(),
        bpf_name: None,
        bpf_prog_id: None,
        direct_action: false,
    })
}

/// A filter on the interface asked about whose attributes the crate cannot read (another
/// program's classifier with options the crate decodes strictly, or a kind newer than it):
/// not a bpf filter, so not masq's, and what masq needs of a foreign filter
/// (its place, its kind, so that masq never takes or removes it) is in the header and the
/// `TCA_KIND` and `TCA_CHAIN` attributes, read here without the crate. `unreadable` is the
/// crate's error, returned if even those cannot be read.
fn foreign_filter(
    payload: &[u8],
    unreadable: DecodeError,
) -> Result<Option<TcFilter>, DecodeError> {
    let Ok(header) = TcHeader::parse(payload) else {
        return Err(unreadable);
    };
    let Some(mut filter) = unnamed_filter(&header) else {
        return Ok(None);
    };
    let Some(kind) = raw_kind(payload) else {
        return Err(unreadable);
    };
    // A bpf filter the crate cannot read may be masq's own: an error, not a stranger.
    if kind == BPF_KIND {
        return Err(unreadable);
    }
    filter.kind = kind;
    filter.chain = raw_u32_attribute(payload, TCA_CHAIN).unwrap_or_default();
    Ok(Some(filter))
}

/// The raw attributes of the tc message `payload`, or `None` if one does not lie within it (a
/// corrupt message, not a foreign one).
fn raw_attributes(payload: &[u8]) -> Option<Vec<(u16, &[u8])>> {
    NlasIterator::new(payload.get(TC_HEADER_LEN..)?)
        .map(|attribute| {
            let attribute = attribute.ok()?;
            let value = attribute.into_inner();
            let length = usize::from(u16::from_ne_bytes([*value.first()?, *value.get(1)?]));
            let kind = u16::from_ne_bytes([*value.get(2)?, *value.get(3)?]);
            Some((kind, value.get(NLA_HEADER_SIZE..length)?))
        })
        .collect()
}

/// The `TCA_KIND` of the tc message `payload`, read without the crate.
fn raw_kind(payload: &[u8]) -> Option<String> {
    let attributes = raw_attributes(payload)?;
    let (_, value) = attributes.iter().find(|(kind, _)| *kind == TCA_KIND)?;
    parse_string(value).ok().filter(|kind| !kind.is_empty())
}

/// The `u32` attribute `wanted` of the tc message `payload`, read without the crate.
fn raw_u32_attribute(payload: &[u8], wanted: u16) -> Option<u32> {
    let attributes = raw_attributes(payload)?;
    let (_, value) = attributes.iter().find(|(kind, _)| *kind == wanted)?;
    parse_u32(value).ok()
}

/// Size of `struct tcmsg`, the header before a tc message's attributes.
const TC_HEADER_LEN: usize = 20;

#[cfg(test)]
mod tests {
    use netlink_packet_core::{DefaultNla, Emitable as _, NLM_F_MULTIPART, NetlinkBuffer};
    use netlink_packet_route::tc::TcFilterU32Option;
    use proptest::prelude::*;

    use super::*;
    use crate::sys::netlink::{extended_ack_text, frame, refusal, tests::messages};

    fn filter_message(ifindex: u32, handle: u32, attributes: Vec<TcAttribute>) -> Vec<u8> {
        let mut message = tc_message(ifindex, handle.into(), ClsactHook::Egress.handle(), 0, None);
        message.header.info = tc_info(1, 3);
        message.attributes = attributes;
        frame(
            NLM_F_MULTIPART,
            7,
            RouteNetlinkMessage::NewTrafficFilter(message),
        )
    }

    fn bpf_filter_message(ifindex: u32) -> Vec<u8> {
        filter_message(
            ifindex,
            0x6d61,
            vec![
                TcAttribute::Kind(BPF_KIND.to_owned()),
                TcAttribute::Chain(0),
                TcAttribute::Options(vec![
                    TcOption::Bpf(TcFilterBpfOption::ProgId(42)),
                    TcOption::Bpf(TcFilterBpfOption::ProgName("masq_egress".to_owned())),
                    TcOption::Bpf(TcFilterBpfOption::Flags(TcBpfFlags::DirectAction)),
                ]),
            ],
        )
    }

    fn qdisc_message(ifindex: u32, handle: TcHandle, parent: TcHandle, kind: &str) -> Vec<u8> {
        let message = tc_message(ifindex, handle, parent, 1, Some(kind));
        frame(
            NLM_F_MULTIPART,
            1,
            RouteNetlinkMessage::NewQueueDiscipline(message),
        )
    }

    fn only_message(bytes: &[u8]) -> NetlinkBuffer<&[u8]> {
        let mut all = messages(bytes);
        assert_eq!(all.len(), 1);
        all.remove(0).unwrap()
    }

    fn filter_in(bytes: &[u8], ifindex: u32) -> Result<Option<TcFilter>, DecodeError> {
        let message = only_message(bytes);
        parse_filter(message.message_type(), message.payload(), ifindex)
    }

    fn qdisc_in(bytes: &[u8], ifindex: u32) -> Option<String> {
        let message = only_message(bytes);
        parse_ingress_qdisc(message.message_type(), message.payload(), ifindex).unwrap()
    }

    /// Everything a reply is put through, for the tests that feed it damaged bytes.
    fn read_all(datagram: &[u8]) {
        for message in messages(datagram) {
            let Ok(message) = message else { break };
            let (kind, payload) = (message.message_type(), message.payload());
            let _ = parse_filter(kind, payload, 5);
            let _ = parse_ingress_qdisc(kind, payload, 5);
            let _ = refusal(&message);
            let _ = extended_ack_text(message.flags(), payload);
        }
    }

    #[test]
    fn hook_parents_match_tc_notation() {
        assert_eq!(ClsactHook::Ingress.parent(), 0xffff_fff2);
        assert_eq!(ClsactHook::Egress.parent(), 0xffff_fff3);
        assert_eq!(u32::from(CLSACT_HANDLE), 0xffff_0000);
        assert_eq!(u32::from(TcHandle::CLSACT), 0xffff_fff1);
    }

    #[test]
    fn tc_info_puts_the_protocol_in_network_order() {
        let info = tc_info(0x1234, 0x0003);
        assert_eq!(info >> 16, 0x1234);
        assert_eq!(info & 0xffff, u32::from(0x0003_u16.to_be()));
    }

    #[test]
    fn bpf_filter_is_parsed() {
        let filter = filter_in(&bpf_filter_message(5), 5).unwrap().unwrap();
        assert_eq!(
            filter,
            TcFilter {
                priority: 1,
                handle: 0x6d61,
                protocol: 3,
                chain: 0,
                kind: "bpf".to_owned(),
                bpf_name: Some("masq_egress".to_owned()),
                bpf_prog_id: Some(42),
                direct_action: true,
            }
        );
    }

    #[test]
    fn filters_of_other_interfaces_and_classifier_entries_are_skipped() {
        assert_eq!(filter_in(&bpf_filter_message(5), 6).unwrap(), None);
        let header_entry = filter_message(5, 0, vec![TcAttribute::Kind(BPF_KIND.to_owned())]);
        assert_eq!(filter_in(&header_entry, 5).unwrap(), None);
    }

    #[test]
    fn options_of_other_classifiers_are_not_read_as_bpf_options() {
        // u32's option 8 (the input device) is bpf's TCA_BPF_FLAGS, its option 11 (flags)
        // bpf's TCA_BPF_ID.
        let bytes = filter_message(
            2,
            0x8000_0800,
            vec![
                TcAttribute::Kind("u32".to_owned()),
                TcAttribute::Options(vec![
                    TcOption::U32(TcFilterU32Option::Other(DefaultNla::new(
                        8,
                        b"eth0\0".to_vec(),
                    ))),
                    TcOption::U32(TcFilterU32Option::Other(DefaultNla::new(
                        11,
                        9_u32.to_ne_bytes().to_vec(),
                    ))),
                ]),
            ],
        );
        let filter = filter_in(&bytes, 2).unwrap().unwrap();
        assert_eq!(filter.kind, "u32");
        assert_eq!(filter.priority, 1);
        assert_eq!(filter.handle, 0x8000_0800);
        assert_eq!(
            (filter.bpf_name, filter.bpf_prog_id, filter.direct_action),
            (None, None, false)
        );
    }

    /// A foreign filter whose options the crate decodes strictly and finds wrong (here u32's
    /// option 7, a nested action list, holding garbage) is still listed, as foreign: a node's
    /// other classifiers must never stop masq from listing the hook it shares with them.
    #[test]
    fn a_foreign_filter_the_crate_cannot_read_is_still_listed() {
        let bytes = filter_message(
            2,
            0x8000_0801,
            vec![
                TcAttribute::Kind("u32".to_owned()),
                TcAttribute::Chain(4),
                TcAttribute::Options(vec![TcOption::U32(TcFilterU32Option::Other(
                    DefaultNla::new(7, vec![0xff; 7]),
                ))]),
            ],
        );
        let filter = filter_in(&bytes, 2).unwrap().unwrap();
        assert_eq!(
            (filter.kind.as_str(), filter.handle, filter.chain),
            ("u32", 0x8000_0801, 4)
        );
        assert_eq!((filter.bpf_name, filter.bpf_prog_id), (None, None));
    }

    #[test]
    fn ingress_slot_qdisc_is_found_and_others_ignored() {
        let clsact = qdisc_message(3, CLSACT_HANDLE, TcHandle::CLSACT, "clsact");
        let root = qdisc_message(3, TcHandle::UNSPEC, TcHandle::ROOT, "noqueue");
        let datagram = [root, clsact.clone()].concat();
        let kinds: Vec<_> = messages(&datagram)
            .into_iter()
            .map(|message| {
                let message = message.unwrap();
                parse_ingress_qdisc(message.message_type(), message.payload(), 3).unwrap()
            })
            .collect();
        assert_eq!(kinds, [None, Some("clsact".to_owned())]);
        assert_eq!(qdisc_in(&clsact, 4), None);
    }

    /// A root qdisc on the uplink whose options the crate cannot read (fq_codel's target cut to
    /// one byte) does not stop masq finding what sits in the ingress slot.
    #[test]
    fn an_unreadable_qdisc_outside_the_ingress_slot_is_ignored() {
        let mut root = qdisc_message(3, TcHandle::UNSPEC, TcHandle::ROOT, "fq_codel");
        // TCA_OPTIONS holding TCA_FQ_CODEL_TARGET with one byte of its u32.
        root.extend_from_slice(&[12, 0, 2, 0x80, 5, 0, 1, 0, 7, 0, 0, 0]);
        let length = u32::try_from(root.len()).unwrap();
        root[..4].copy_from_slice(&length.to_ne_bytes());
        let message = messages(&root).remove(0).unwrap();
        assert!(
            tc_message_on(message.message_type(), message.payload(), 3).is_err(),
            "the crate reads this qdisc: the test no longer exercises the fallback"
        );
        assert_eq!(
            parse_ingress_qdisc(message.message_type(), message.payload(), 3).unwrap(),
            None
        );
    }

    #[test]
    fn requests_name_the_interface_handles_and_kind() {
        let request = tc_message(
            9,
            0x6d61.into(),
            ClsactHook::Egress.handle(),
            tc_info(1, 3),
            Some(BPF_KIND),
        );
        let mut bytes = vec![0; request.buffer_len()];
        request.emit(&mut bytes);
        // tcmsg 20 + "bpf\0" attribute 8.
        assert_eq!(bytes.len(), 28);
        let header = TcHeader::parse(&bytes).unwrap();
        assert_eq!(
            (
                header.index,
                u32::from(header.handle),
                u32::from(header.parent),
                header.info
            ),
            (9, 0x6d61, 0xffff_fff3, tc_info(1, 3))
        );
        assert_eq!(&bytes[20..], b"\x08\x00\x01\x00bpf\0");

        // An odd-length kind is padded to the alignment.
        let clsact = tc_message(1, CLSACT_HANDLE, TcHandle::CLSACT, 0, Some(CLSACT_KIND));
        assert_eq!(clsact.buffer_len(), 20 + 12);
    }

    #[test]
    fn kernel_errors_keep_their_errno_and_clsact_gaps_get_their_own_variant() {
        let refusal = |errno| TcNetlinkError::Kernel {
            operation: "adding the clsact qdisc",
            ifindex: 4,
            errno,
            message: Some("Specified qdisc kind is unknown".to_owned()),
        };
        for errno in [Errno::ENOENT, Errno::EOPNOTSUPP] {
            let error = unsupported_if_kernel_lacks_clsact(refusal(errno));
            assert!(error.is_kernel_without_clsact(), "{error}");
            assert_eq!(error.errno(), Some(errno));
            let text = error.to_string();
            assert!(text.starts_with("kernel without clsact"), "{text}");
            assert!(text.contains("Specified qdisc kind is unknown"), "{text}");
        }
        let error = unsupported_if_kernel_lacks_clsact(refusal(Errno::EPERM));
        assert!(!error.is_kernel_without_clsact());
        assert_eq!(error.errno(), Some(Errno::EPERM));
        // What the exchange reports keeps the operation, the interface and the text.
        let refused = NetlinkError::Refused {
            errno: Errno::EEXIST,
            message: Some("Exclusivity flag on".to_owned()),
        };
        let error = TcNetlinkError::from_netlink(refused, "adding the clsact qdisc", 4);
        assert_eq!(
            error.to_string(),
            "adding the clsact qdisc on interface 4 failed: EEXIST: File exists (kernel: \
             Exclusivity flag on)"
        );
    }

    #[test]
    fn truncated_messages_are_errors_not_panics() {
        let datagram = [
            bpf_filter_message(5),
            qdisc_message(5, CLSACT_HANDLE, TcHandle::CLSACT, "clsact"),
        ]
        .concat();
        for cut in 0..datagram.len() {
            read_all(&datagram[..cut]);
        }
        // A message cut inside its options must not be reported as a filter.
        let mut lying = bpf_filter_message(5);
        // Claim the message is 8 bytes shorter than it is: the options attribute now overruns.
        let shorter = u32::try_from(lying.len() - 8).unwrap();
        lying[..4].copy_from_slice(&shorter.to_ne_bytes());
        let message = messages(&lying).remove(0).unwrap();
        assert!(parse_filter(message.message_type(), message.payload(), 5).is_err());
    }

    #[test]
    fn zero_length_attributes_do_not_loop_forever() {
        let mut zero_attribute = bpf_filter_message(5);
        zero_attribute.extend_from_slice(&[0; 8]);
        let length = u32::try_from(zero_attribute.len()).unwrap();
        zero_attribute[..4].copy_from_slice(&length.to_ne_bytes());
        assert!(filter_in(&zero_attribute, 5).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            read_all(&bytes);
        }

        #[test]
        fn corrupted_filter_messages_never_panic(
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            // Start from a valid message so the parser gets deep before meeting the damage.
            let mut bytes = bpf_filter_message(5);
            for (index, value) in flips {
                let at = index.index(bytes.len());
                bytes[at] = value;
            }
            read_all(&bytes);
        }
    }
}
