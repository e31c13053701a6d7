//! The `clsact` qdisc and the filters on its hooks, over rtnetlink.
//!
//! Kernels before 6.6 have no tcx, so masq's legacy attach mode puts its classifiers on a
//! `clsact` qdisc as direct-action `cls_bpf` filters. aya adds the qdisc, attaches a filter and
//! replaces its program in place, but it cannot list the filters, tell a `clsact` from another
//! qdisc in the same slot, or remove one filter only while it is still masq's. This module does
//! those with plain rtnetlink requests on a blocking `NETLINK_ROUTE` socket: they are rare
//! control-plane calls, so each public function opens its own socket and closes it again.
//!
//! Listing needs no capability; adding and deleting need CAP_NET_ADMIN. Every refusal keeps the
//! kernel's errno (and its extended-ack text when it sends one), so callers can tell EPERM from
//! ENOENT from EEXIST from EOPNOTSUPP.
//!
//! Replies are parsed with bounds-checked reads only: a short or corrupt message is an error,
//! never a panic.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::{
    errno::Errno,
    sys::{
        socket::{
            AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv,
            recvfrom, sendto, setsockopt, socket, sockopt,
        },
        time::{TimeVal, TimeValLike},
    },
};

// Values from the kernel's uapi headers (linux/netlink.h, linux/rtnetlink.h,
// linux/pkt_sched.h, linux/pkt_cls.h). They are ABI and never change.

/// `sizeof(struct nlmsghdr)`.
const NLMSG_HDRLEN: usize = 16;
/// `sizeof(struct tcmsg)`, already a multiple of the netlink alignment.
const TCMSG_LEN: usize = 20;
/// `sizeof(struct nlattr)`.
const NLA_HDRLEN: usize = 4;
/// Messages and attributes start on 4-byte boundaries (`NLMSG_ALIGNTO`, `NLA_ALIGNTO`).
const ALIGN: usize = 4;

const NLM_F_REQUEST: u16 = 0x01;
const NLM_F_MULTI: u16 = 0x02;
const NLM_F_ACK: u16 = 0x04;
/// Set on dump messages when the table changed while the dump ran: the result may be torn.
const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NLM_F_ROOT | NLM_F_MATCH`.
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
/// On an NLMSG_ERROR: only the header of the failed request is echoed (NETLINK_CAP_ACK).
const NLM_F_CAPPED: u16 = 0x100;
/// On an NLMSG_ERROR: extended-ack attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;

const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_GETQDISC: u16 = 38;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_GETTFILTER: u16 = 46;

/// Strips `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER` from an attribute type.
const NLA_TYPE_MASK: u16 = 0x3fff;
/// Extended-ack attribute carrying the kernel's error text.
const NLMSGERR_ATTR_MSG: u16 = 1;

const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_CHAIN: u16 = 11;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_ID: u16 = 11;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;

/// The slot `clsact` (and the older `ingress` qdisc) lives in: `TC_H_CLSACT == TC_H_INGRESS`.
const TC_H_CLSACT: u32 = 0xffff_fff1;
/// The clsact qdisc's own handle, `ffff:` (`TC_H_MAKE(TC_H_CLSACT, 0)`).
const CLSACT_HANDLE: u32 = 0xffff_0000;
const TC_H_MIN_INGRESS: u32 = 0xfff2;
const TC_H_MIN_EGRESS: u32 = 0xfff3;

/// Kind string of the clsact qdisc.
const CLSACT_KIND: &str = "clsact";
/// Kind string of the eBPF classifier.
const BPF_KIND: &str = "bpf";

/// First receive buffer: the kernel fills dump datagrams up to 32 KiB when the reader offers
/// that much. Larger datagrams are measured first and the buffer grows.
const RECV_BUFFER: usize = 32 * 1024;
/// How long to wait for any reply before giving up: the kernel answers at once, so silence
/// means something is badly wrong and the agent should say so rather than hang.
const REPLY_TIMEOUT_SECONDS: i64 = 10;
/// How often a dump torn by concurrent changes is retried before failing.
const DUMP_ATTEMPTS: u32 = 3;

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
    pub const fn parent(self) -> u32 {
        let minor = match self {
            Self::Ingress => TC_H_MIN_INGRESS,
            Self::Egress => TC_H_MIN_EGRESS,
        };
        CLSACT_HANDLE | minor
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
    Malformed(&'static str),
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

    fn socket(operation: &'static str) -> impl FnOnce(Errno) -> Self {
        move |errno| Self::Socket { operation, errno }
    }
}

/// Formats the kernel's extended-ack text for an error message.
fn kernel_says(message: &Option<String>) -> String {
    message
        .as_deref()
        .map(|text| format!(" (kernel: {text})"))
        .unwrap_or_default()
}

/// The kind of the qdisc in the interface's ingress slot (`"clsact"`, `"ingress"`), or `None`
/// when it has none (RTM_GETQDISC dump, filtered by interface and parent `ffff:fff1`).
pub fn ingress_qdisc_kind(ifindex: u32) -> Result<Option<String>, TcNetlinkError> {
    Rtnl::open()?.ingress_qdisc_kind(ifindex)
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
    let mut rtnl = Rtnl::open()?;
    // NLM_F_EXCL turns an occupied slot into EEXIST; without it the kernel quietly accepts a
    // "change" of an existing clsact and created and found would look the same.
    let request = Request::new(
        RTM_NEWQDISC,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        TcMsg {
            ifindex,
            handle: CLSACT_HANDLE,
            parent: TC_H_CLSACT,
            info: 0,
        },
    )
    .string_attr(TCA_KIND, CLSACT_KIND)?;
    match rtnl.acknowledged(request, OPERATION, ifindex) {
        Ok(()) => Ok(true),
        // EEXIST only says the slot is taken: by a clsact (fine) or an `ingress` qdisc (not).
        Err(TcNetlinkError::Kernel {
            errno: Errno::EEXIST,
            message,
            ..
        }) => match rtnl.ingress_qdisc_kind(ifindex)? {
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
    let mut rtnl = Rtnl::open()?;
    // Naming the handle and kind makes the kernel refuse (EINVAL) rather than delete an
    // `ingress` qdisc that some other tool put in the same slot.
    let request = Request::new(
        RTM_DELQDISC,
        NLM_F_REQUEST | NLM_F_ACK,
        TcMsg {
            ifindex,
            handle: CLSACT_HANDLE,
            parent: TC_H_CLSACT,
            info: 0,
        },
    )
    .string_attr(TCA_KIND, CLSACT_KIND)?;
    match rtnl.acknowledged(request, "deleting the clsact qdisc", ifindex) {
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
        ) => match rtnl.ingress_qdisc_kind(ifindex)? {
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
    Rtnl::open()?.list_filters(ifindex, hook)
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
    let mut rtnl = Rtnl::open()?;
    let filters = rtnl.list_filters(ifindex, hook)?;
    let Some(ours) = filters.iter().find(|filter| {
        filter.chain == 0
            && filter.priority == priority
            && filter.handle == handle
            && filter.kind == BPF_KIND
            && filter.bpf_name.as_deref() == Some(expected_name)
    }) else {
        return Ok(false);
    };
    let request = Request::new(
        RTM_DELTFILTER,
        NLM_F_REQUEST | NLM_F_ACK,
        TcMsg {
            ifindex,
            handle,
            parent: hook.parent(),
            info: tc_info(priority, ours.protocol),
        },
    )
    .string_attr(TCA_KIND, BPF_KIND)?;
    match rtnl.acknowledged(request, "deleting a clsact filter", ifindex) {
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

/// `struct tcmsg`, the fixed header of every traffic-control message (family always AF_UNSPEC).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct TcMsg {
    /// The kernel's `int`, kept as its bit pattern: indexes are positive.
    ifindex: u32,
    handle: u32,
    parent: u32,
    info: u32,
}

impl TcMsg {
    fn encode_into(self, buf: &mut Vec<u8>) {
        // tcm_family (AF_UNSPEC) and three bytes of padding.
        buf.extend_from_slice(&[0; 4]);
        for field in [self.ifindex, self.handle, self.parent, self.info] {
            buf.extend_from_slice(&field.to_ne_bytes());
        }
    }

    fn decode(payload: &[u8]) -> Result<Self, TcNetlinkError> {
        let field =
            |offset| u32_at(payload, offset).ok_or(TcNetlinkError::Malformed("short tcmsg"));
        Ok(Self {
            ifindex: field(4)?,
            handle: field(8)?,
            parent: field(12)?,
            info: field(16)?,
        })
    }
}

/// The start of a netlink request: an `nlmsghdr` whose length is left at 0 for the caller to
/// fill in once the message is complete. The port id stays 0 so the kernel fills in the one it
/// assigned to the socket.
pub(crate) fn netlink_header(message_type: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(&0_u32.to_ne_bytes());
    buf.extend_from_slice(&message_type.to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&seq.to_ne_bytes());
    buf.extend_from_slice(&0_u32.to_ne_bytes());
    buf
}

/// A request being built: `nlmsghdr`, `tcmsg`, attributes.
#[derive(Debug)]
struct Request {
    buf: Vec<u8>,
}

impl Request {
    fn new(message_type: u16, flags: u16, tcmsg: TcMsg) -> Self {
        // Length and sequence number are filled in by `finish`.
        let mut buf = netlink_header(message_type, flags, 0);
        tcmsg.encode_into(&mut buf);
        Self { buf }
    }

    /// Appends a NUL-terminated string attribute, padded to the attribute alignment.
    fn string_attr(mut self, attribute: u16, value: &str) -> Result<Self, TcNetlinkError> {
        let length = u16::try_from(NLA_HDRLEN + value.len() + 1)
            .map_err(|_| TcNetlinkError::Malformed("request attribute longer than 64 KiB"))?;
        self.buf.extend_from_slice(&length.to_ne_bytes());
        self.buf.extend_from_slice(&attribute.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.buf.resize(align(self.buf.len()), 0);
        Ok(self)
    }

    /// The bytes to send, with length and sequence number in the header.
    fn finish(mut self, seq: u32) -> Result<Vec<u8>, TcNetlinkError> {
        let length = u32::try_from(self.buf.len())
            .map_err(|_| TcNetlinkError::Malformed("request longer than 4 GiB"))?;
        for (offset, value) in [(0, length), (8, seq)] {
            if let Some(slot) = self.buf.get_mut(offset..offset + 4) {
                slot.copy_from_slice(&value.to_ne_bytes());
            }
        }
        Ok(self.buf)
    }
}

/// A blocking `NETLINK_ROUTE` socket with its sequence counter and receive buffer.
#[derive(Debug)]
struct Rtnl {
    fd: OwnedFd,
    next_seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    fn open() -> Result<Self, TcNetlinkError> {
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkRoute,
        )
        .map_err(TcNetlinkError::socket("opening"))?;
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(TcNetlinkError::socket("binding"))?;
        setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &TimeVal::seconds(REPLY_TIMEOUT_SECONDS),
        )
        .map_err(TcNetlinkError::socket("setting the receive timeout"))?;
        // Best effort: extended acks (4.12+) add the kernel's reason to errors, capped acks
        // (4.3+) keep the failed request out of the error message. Older kernels work without.
        let _ = enable_netlink_option(&fd, libc::NETLINK_EXT_ACK);
        let _ = enable_netlink_option(&fd, libc::NETLINK_CAP_ACK);
        Ok(Self {
            fd,
            next_seq: 1,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// Sends a request to the kernel and returns its sequence number.
    fn send(&mut self, request: Request) -> Result<u32, TcNetlinkError> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let bytes = request.finish(seq)?;
        let sent = loop {
            match sendto(
                self.fd.as_raw_fd(),
                &bytes,
                &NetlinkAddr::new(0, 0),
                MsgFlags::empty(),
            ) {
                Err(Errno::EINTR) => {}
                result => break result.map_err(TcNetlinkError::socket("sending"))?,
            }
        };
        if sent != bytes.len() {
            return Err(TcNetlinkError::Malformed("request only partly sent"));
        }
        Ok(seq)
    }

    /// Receives one datagram from the kernel into `self.buf` and returns its length. The
    /// datagram's size is peeked first so a big one is never cut short.
    fn receive(&mut self) -> Result<usize, TcNetlinkError> {
        loop {
            let size = match recv(
                self.fd.as_raw_fd(),
                &mut self.buf,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC,
            ) {
                Err(Errno::EINTR) => continue,
                result => result.map_err(TcNetlinkError::socket("receiving"))?,
            };
            if size > self.buf.len() {
                self.buf.resize(size, 0);
            }
            let (length, sender) = match recvfrom::<NetlinkAddr>(self.fd.as_raw_fd(), &mut self.buf)
            {
                Err(Errno::EINTR) => continue,
                result => result.map_err(TcNetlinkError::socket("receiving"))?,
            };
            // Only the kernel (port 0) answers requests; anything else is not for us.
            if sender.is_some_and(|address| address.pid() == 0) {
                return Ok(length.min(self.buf.len()));
            }
        }
    }

    /// Sends a request that asks for an acknowledgement and waits for it.
    fn acknowledged(
        &mut self,
        request: Request,
        operation: &'static str,
        ifindex: u32,
    ) -> Result<(), TcNetlinkError> {
        let seq = self.send(request)?;
        loop {
            let length = self.receive()?;
            let datagram = self.buf.get(..length).unwrap_or_default();
            for message in Messages::new(datagram) {
                let message = message?;
                if message.seq != seq || message.kind != NLMSG_ERROR {
                    continue;
                }
                return match parse_error(&message)? {
                    None => Ok(()),
                    Some(refusal) => Err(refusal.into_error(operation, ifindex)),
                };
            }
        }
    }

    /// Runs a dump to its end, keeping what `parse` makes of each message; retried when the
    /// kernel marks it interrupted by concurrent changes.
    fn dump<T>(
        &mut self,
        request: impl Fn() -> Result<Request, TcNetlinkError>,
        operation: &'static str,
        ifindex: u32,
        mut parse: impl FnMut(&Message<'_>) -> Result<Option<T>, TcNetlinkError>,
    ) -> Result<Vec<T>, TcNetlinkError> {
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.send(request()?)?;
            let mut items = Vec::new();
            let mut interrupted = false;
            let mut done = false;
            while !done {
                let length = self.receive()?;
                let datagram = self.buf.get(..length).unwrap_or_default();
                for message in Messages::new(datagram) {
                    let message = message?;
                    if message.seq != seq {
                        continue;
                    }
                    interrupted |= message.flags & NLM_F_DUMP_INTR != 0;
                    match message.kind {
                        NLMSG_DONE => {
                            // The dump's own status: negative when it failed part way.
                            let status = i32_at(message.payload, 0).unwrap_or(0);
                            if status < 0 {
                                return Err(
                                    Refusal::from_code(status, None).into_error(operation, ifindex)
                                );
                            }
                            done = true;
                            break;
                        }
                        NLMSG_ERROR => match parse_error(&message)? {
                            Some(refusal) => return Err(refusal.into_error(operation, ifindex)),
                            None => {
                                done = true;
                                break;
                            }
                        },
                        NLMSG_OVERRUN => {
                            return Err(TcNetlinkError::Socket {
                                operation: "receiving a dump",
                                errno: Errno::ENOBUFS,
                            });
                        }
                        _ => {
                            if let Some(item) = parse(&message)? {
                                items.push(item);
                            }
                            // A reply without NLM_F_MULTI is complete in itself.
                            done |= message.flags & NLM_F_MULTI == 0;
                        }
                    }
                }
            }
            if !interrupted {
                return Ok(items);
            }
        }
        Err(TcNetlinkError::DumpInterrupted {
            operation,
            ifindex,
            attempts: DUMP_ATTEMPTS,
        })
    }

    fn ingress_qdisc_kind(&mut self, ifindex: u32) -> Result<Option<String>, TcNetlinkError> {
        // The qdisc dump covers every interface (the kernel ignores tcm_ifindex here), so the
        // interface is picked out of the answer.
        let request = || {
            Ok(Request::new(
                RTM_GETQDISC,
                NLM_F_REQUEST | NLM_F_DUMP,
                TcMsg {
                    ifindex,
                    ..TcMsg::default()
                },
            ))
        };
        let kinds = self.dump(request, "listing qdiscs", ifindex, |message| {
            parse_ingress_qdisc(message, ifindex)
        })?;
        Ok(kinds.into_iter().next())
    }

    fn list_filters(
        &mut self,
        ifindex: u32,
        hook: ClsactHook,
    ) -> Result<Vec<TcFilter>, TcNetlinkError> {
        // The filter dump resolves the parent through whatever qdisc holds handle ffff:; an
        // `ingress` qdisc answers for any minor, so without this check its filters would be
        // reported as clsact egress filters.
        if self.ingress_qdisc_kind(ifindex)?.as_deref() != Some(CLSACT_KIND) {
            return Ok(Vec::new());
        }
        let operation = match hook {
            ClsactHook::Ingress => "listing clsact ingress filters",
            ClsactHook::Egress => "listing clsact egress filters",
        };
        let request = || {
            Ok(Request::new(
                RTM_GETTFILTER,
                NLM_F_REQUEST | NLM_F_DUMP,
                TcMsg {
                    ifindex,
                    parent: hook.parent(),
                    ..TcMsg::default()
                },
            ))
        };
        self.dump(request, operation, ifindex, |message| {
            parse_filter(message, ifindex)
        })
    }
}

/// Sets a boolean `SOL_NETLINK` option.
fn enable_netlink_option(fd: &OwnedFd, option: libc::c_int) -> Result<(), Errno> {
    let on: libc::c_int = 1;
    let length = libc::socklen_t::try_from(size_of::<libc::c_int>()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: the descriptor is an open socket owned by `fd` for the whole call, and the value
    // pointer and length describe `on`, a live c_int the kernel only reads.
    let result = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_NETLINK,
            option,
            std::ptr::from_ref(&on).cast(),
            length,
        )
    };
    Errno::result(result).map(drop)
}

/// The kernel's "no" to a request: errno and its extended-ack text.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    errno: Errno,
    message: Option<String>,
}

impl Refusal {
    /// From the negative errno the kernel reports.
    fn from_code(code: i32, message: Option<String>) -> Self {
        Self {
            errno: Errno::from_raw(code.saturating_neg()),
            message,
        }
    }

    fn into_error(self, operation: &'static str, ifindex: u32) -> TcNetlinkError {
        TcNetlinkError::Kernel {
            operation,
            ifindex,
            errno: self.errno,
            message: self.message,
        }
    }
}

/// One netlink message inside a datagram.
#[derive(Clone, Copy, Debug)]
struct Message<'a> {
    kind: u16,
    flags: u16,
    seq: u32,
    payload: &'a [u8],
}

/// The messages of a datagram; stops after the first malformed one.
#[derive(Debug)]
struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Messages<'a> {
    fn new(datagram: &'a [u8]) -> Self {
        Self { rest: datagram }
    }
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<Message<'a>, TcNetlinkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let result = split_message(self.rest);
        self.rest = match &result {
            Ok((_, rest)) => *rest,
            Err(_) => &[],
        };
        Some(result.map(|(message, _)| message))
    }
}

/// Splits the first message off `buf`.
fn split_message(buf: &[u8]) -> Result<(Message<'_>, &[u8]), TcNetlinkError> {
    let short = TcNetlinkError::Malformed("datagram shorter than a message header");
    let length = u32_at(buf, 0).ok_or(short)?;
    let length = usize::try_from(length)
        .map_err(|_| TcNetlinkError::Malformed("message length does not fit in memory"))?;
    if length < NLMSG_HDRLEN {
        return Err(TcNetlinkError::Malformed(
            "message length below its header's",
        ));
    }
    let message = Message {
        kind: u16_at(buf, 4).ok_or(TcNetlinkError::Malformed("short message header"))?,
        flags: u16_at(buf, 6).ok_or(TcNetlinkError::Malformed("short message header"))?,
        seq: u32_at(buf, 8).ok_or(TcNetlinkError::Malformed("short message header"))?,
        payload: buf
            .get(NLMSG_HDRLEN..length)
            .ok_or(TcNetlinkError::Malformed(
                "message longer than its datagram",
            ))?,
    };
    // The last message's padding may be missing.
    let rest = buf.get(align(length)..).unwrap_or_default();
    Ok((message, rest))
}

/// The attributes in `buf` as (type without flag bits, payload); stops after a malformed one.
#[derive(Debug)]
struct Attributes<'a> {
    rest: &'a [u8],
}

impl<'a> Attributes<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { rest: buf }
    }
}

impl<'a> Iterator for Attributes<'a> {
    type Item = Result<(u16, &'a [u8]), TcNetlinkError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let result = split_attribute(self.rest);
        self.rest = match &result {
            Ok((_, _, rest)) => *rest,
            Err(_) => &[],
        };
        Some(result.map(|(kind, payload, _)| (kind, payload)))
    }
}

fn split_attribute(buf: &[u8]) -> Result<(u16, &[u8], &[u8]), TcNetlinkError> {
    let short = || TcNetlinkError::Malformed("truncated attribute header");
    let length = usize::from(u16_at(buf, 0).ok_or_else(short)?);
    let kind = u16_at(buf, 2).ok_or_else(short)? & NLA_TYPE_MASK;
    if length < NLA_HDRLEN {
        return Err(TcNetlinkError::Malformed(
            "attribute length below its header's",
        ));
    }
    let payload = buf
        .get(NLA_HDRLEN..length)
        .ok_or(TcNetlinkError::Malformed(
            "attribute longer than its message",
        ))?;
    let rest = buf.get(align(length)..).unwrap_or_default();
    Ok((kind, payload, rest))
}

/// Reads an NLMSG_ERROR: `None` for an acknowledgement, the refusal otherwise.
fn parse_error(message: &Message<'_>) -> Result<Option<Refusal>, TcNetlinkError> {
    let code =
        i32_at(message.payload, 0).ok_or(TcNetlinkError::Malformed("truncated error message"))?;
    if code == 0 {
        return Ok(None);
    }
    let text = if message.flags & NLM_F_ACK_TLVS != 0 {
        extended_ack_text(message)
    } else {
        None
    };
    Ok(Some(Refusal::from_code(code, text)))
}

/// The kernel's error text from the extended-ack attributes of an NLMSG_ERROR. Best effort:
/// anything unexpected just means no text.
fn extended_ack_text(message: &Message<'_>) -> Option<String> {
    // After the errno comes the failed request: its header only when capped, else all of it.
    let echoed = if message.flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        usize::try_from(u32_at(message.payload, 4)?).ok()?
    };
    let attributes = message.payload.get(align(4_usize.checked_add(echoed)?)..)?;
    Attributes::new(attributes)
        .map_while(Result::ok)
        .find(|(kind, _)| *kind == NLMSGERR_ATTR_MSG)
        .map(|(_, payload)| c_string(payload))
}

/// The kind of the qdisc in `ifindex`'s ingress slot, if `message` describes it.
fn parse_ingress_qdisc(
    message: &Message<'_>,
    ifindex: u32,
) -> Result<Option<String>, TcNetlinkError> {
    if message.kind != RTM_NEWQDISC {
        return Ok(None);
    }
    let tcmsg = TcMsg::decode(message.payload)?;
    if tcmsg.ifindex != ifindex || tcmsg.parent != TC_H_CLSACT {
        return Ok(None);
    }
    for attribute in Attributes::new(message.payload.get(TCMSG_LEN..).unwrap_or_default()) {
        let (kind, payload) = attribute?;
        if kind == TCA_KIND {
            return Ok(Some(c_string(payload)));
        }
    }
    Err(TcNetlinkError::Malformed("qdisc without a kind"))
}

/// The filter `message` describes, if it is one on `ifindex` (not a handle-0 classifier entry).
fn parse_filter(message: &Message<'_>, ifindex: u32) -> Result<Option<TcFilter>, TcNetlinkError> {
    if message.kind != RTM_NEWTFILTER {
        return Ok(None);
    }
    let tcmsg = TcMsg::decode(message.payload)?;
    if tcmsg.ifindex != ifindex || tcmsg.handle == 0 {
        return Ok(None);
    }
    let [priority_high, priority_low, protocol_high, protocol_low] = tcmsg.info.to_be_bytes();
    let mut filter = TcFilter {
        priority: u16::from_be_bytes([priority_high, priority_low]),
        handle: tcmsg.handle,
        // The low half of tcm_info holds the protocol in network order.
        protocol: u16::from_be(u16::from_be_bytes([protocol_high, protocol_low])),
        chain: 0,
        kind: String::new(),
        bpf_name: None,
        bpf_prog_id: None,
        direct_action: false,
    };
    let mut options = None;
    for attribute in Attributes::new(message.payload.get(TCMSG_LEN..).unwrap_or_default()) {
        let (kind, payload) = attribute?;
        match kind {
            TCA_KIND => filter.kind = c_string(payload),
            TCA_CHAIN => {
                filter.chain =
                    u32_at(payload, 0).ok_or(TcNetlinkError::Malformed("short TCA_CHAIN"))?;
            }
            TCA_OPTIONS => options = Some(payload),
            _ => {}
        }
    }
    // Option numbers mean different things for each classifier: only read a bpf filter's.
    if filter.kind == BPF_KIND
        && let Some(options) = options
    {
        for attribute in Attributes::new(options) {
            let (kind, payload) = attribute?;
            match kind {
                TCA_BPF_NAME => filter.bpf_name = Some(c_string(payload)),
                TCA_BPF_ID => {
                    filter.bpf_prog_id = Some(
                        u32_at(payload, 0).ok_or(TcNetlinkError::Malformed("short TCA_BPF_ID"))?,
                    );
                }
                TCA_BPF_FLAGS => {
                    let flags = u32_at(payload, 0)
                        .ok_or(TcNetlinkError::Malformed("short TCA_BPF_FLAGS"))?;
                    filter.direct_action = flags & TCA_BPF_FLAG_ACT_DIRECT != 0;
                }
                _ => {}
            }
        }
    }
    if filter.kind.is_empty() {
        return Err(TcNetlinkError::Malformed("filter without a kind"));
    }
    Ok(Some(filter))
}

/// Rounds up to the netlink alignment (saturating: an absurd length just runs off the end).
fn align(length: usize) -> usize {
    length.saturating_add(ALIGN - 1) & !(ALIGN - 1)
}

/// A string attribute up to its NUL (kernels always send one; a missing one is tolerated).
fn c_string(payload: &[u8]) -> String {
    let end = payload
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(payload.len());
    String::from_utf8_lossy(payload.get(..end).unwrap_or_default()).into_owned()
}

fn bytes_at<const N: usize>(buf: &[u8], offset: usize) -> Option<[u8; N]> {
    buf.get(offset..offset.checked_add(N)?)?.try_into().ok()
}

fn u16_at(buf: &[u8], offset: usize) -> Option<u16> {
    bytes_at(buf, offset).map(u16::from_ne_bytes)
}

fn u32_at(buf: &[u8], offset: usize) -> Option<u32> {
    bytes_at(buf, offset).map(u32::from_ne_bytes)
}

fn i32_at(buf: &[u8], offset: usize) -> Option<i32> {
    bytes_at(buf, offset).map(i32::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An attribute with the given payload, padded.
    fn attribute(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let length = u16::try_from(NLA_HDRLEN + payload.len()).unwrap();
        bytes.extend_from_slice(&length.to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(payload);
        bytes.resize(align(bytes.len()), 0);
        bytes
    }

    fn nested(kind: u16, attributes: &[Vec<u8>]) -> Vec<u8> {
        // The kernel marks nested attributes only sometimes; the parser must not care.
        attribute(kind | 0x8000, &attributes.concat())
    }

    /// A whole message: header, tcmsg, attributes.
    fn message(kind: u16, flags: u16, seq: u32, tcmsg: TcMsg, attributes: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        tcmsg.encode_into(&mut body);
        body.extend(attributes.concat());
        raw_message(kind, flags, seq, &body)
    }

    fn raw_message(kind: u16, flags: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let length = u32::try_from(NLMSG_HDRLEN + body.len()).unwrap();
        bytes.extend_from_slice(&length.to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&flags.to_ne_bytes());
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0_u32.to_ne_bytes());
        bytes.extend_from_slice(body);
        bytes.resize(align(bytes.len()), 0);
        bytes
    }

    fn bpf_filter_message(ifindex: u32) -> Vec<u8> {
        message(
            RTM_NEWTFILTER,
            NLM_F_MULTI,
            7,
            TcMsg {
                ifindex,
                handle: 0x6d61,
                parent: ClsactHook::Egress.parent(),
                info: tc_info(1, 3),
            },
            &[
                attribute(TCA_KIND, b"bpf\0"),
                attribute(TCA_CHAIN, &0_u32.to_ne_bytes()),
                nested(
                    TCA_OPTIONS,
                    &[
                        attribute(TCA_BPF_ID, &42_u32.to_ne_bytes()),
                        attribute(TCA_BPF_NAME, b"masq_egress\0"),
                        attribute(TCA_BPF_FLAGS, &TCA_BPF_FLAG_ACT_DIRECT.to_ne_bytes()),
                    ],
                ),
            ],
        )
    }

    fn only_message(bytes: &[u8]) -> Message<'_> {
        let messages: Vec<_> = Messages::new(bytes).collect::<Result<_, _>>().unwrap();
        assert_eq!(messages.len(), 1);
        messages[0]
    }

    #[test]
    fn hook_parents_match_tc_notation() {
        assert_eq!(ClsactHook::Ingress.parent(), 0xffff_fff2);
        assert_eq!(ClsactHook::Egress.parent(), 0xffff_fff3);
    }

    #[test]
    fn tc_info_puts_the_protocol_in_network_order() {
        let info = tc_info(0x1234, 0x0003);
        assert_eq!(info >> 16, 0x1234);
        assert_eq!(info & 0xffff, u32::from(0x0003_u16.to_be()));
    }

    #[test]
    fn bpf_filter_is_parsed() {
        let bytes = bpf_filter_message(5);
        let filter = parse_filter(&only_message(&bytes), 5).unwrap().unwrap();
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
        let bytes = bpf_filter_message(5);
        assert_eq!(parse_filter(&only_message(&bytes), 6).unwrap(), None);
        let header_entry = message(
            RTM_NEWTFILTER,
            NLM_F_MULTI,
            7,
            TcMsg {
                ifindex: 5,
                handle: 0,
                parent: ClsactHook::Egress.parent(),
                info: tc_info(1, 3),
            },
            &[attribute(TCA_KIND, b"bpf\0")],
        );
        assert_eq!(parse_filter(&only_message(&header_entry), 5).unwrap(), None);
    }

    #[test]
    fn options_of_other_classifiers_are_not_read_as_bpf_options() {
        // u32's option 7 is not a name and its option 11 not a program id.
        let bytes = message(
            RTM_NEWTFILTER,
            NLM_F_MULTI,
            1,
            TcMsg {
                ifindex: 2,
                handle: 0x8000_0800,
                parent: ClsactHook::Egress.parent(),
                info: tc_info(5, 3),
            },
            &[
                attribute(TCA_KIND, b"u32\0"),
                nested(
                    TCA_OPTIONS,
                    &[
                        attribute(TCA_BPF_NAME, b"not-a-name\0"),
                        attribute(TCA_BPF_ID, &9_u32.to_ne_bytes()),
                        attribute(TCA_BPF_FLAGS, &1_u32.to_ne_bytes()),
                    ],
                ),
            ],
        );
        let filter = parse_filter(&only_message(&bytes), 2).unwrap().unwrap();
        assert_eq!(filter.kind, "u32");
        assert_eq!(filter.priority, 5);
        assert_eq!(filter.handle, 0x8000_0800);
        assert_eq!(
            (filter.bpf_name, filter.bpf_prog_id, filter.direct_action),
            (None, None, false)
        );
    }

    #[test]
    fn ingress_slot_qdisc_is_found_and_others_ignored() {
        let clsact = message(
            RTM_NEWQDISC,
            NLM_F_MULTI,
            1,
            TcMsg {
                ifindex: 3,
                handle: CLSACT_HANDLE,
                parent: TC_H_CLSACT,
                info: 1,
            },
            &[attribute(TCA_KIND, b"clsact\0")],
        );
        let root = message(
            RTM_NEWQDISC,
            NLM_F_MULTI,
            1,
            TcMsg {
                ifindex: 3,
                handle: 0,
                parent: 0xffff_ffff,
                info: 1,
            },
            &[attribute(TCA_KIND, b"noqueue\0")],
        );
        let datagram = [root.clone(), clsact.clone()].concat();
        let kinds: Vec<_> = Messages::new(&datagram)
            .map(|message| parse_ingress_qdisc(&message.unwrap(), 3).unwrap())
            .collect();
        assert_eq!(kinds, [None, Some("clsact".to_owned())]);
        assert_eq!(
            parse_ingress_qdisc(&only_message(&clsact), 4).unwrap(),
            None
        );
    }

    #[test]
    fn several_messages_share_a_datagram() {
        let done = raw_message(NLMSG_DONE, NLM_F_MULTI, 7, &0_i32.to_ne_bytes());
        let datagram = [bpf_filter_message(5), bpf_filter_message(5), done].concat();
        let kinds: Vec<_> = Messages::new(&datagram)
            .map(|message| message.unwrap().kind)
            .collect();
        assert_eq!(kinds, [RTM_NEWTFILTER, RTM_NEWTFILTER, NLMSG_DONE]);
    }

    #[test]
    fn acknowledgement_and_refusal_with_extended_ack_text() {
        let ack = raw_message(NLMSG_ERROR, NLM_F_CAPPED, 1, &[0; 20]);
        assert_eq!(parse_error(&only_message(&ack)).unwrap(), None);

        // Capped refusal: errno, the request's header, then the text attribute.
        let mut body = (-libc::EEXIST).to_ne_bytes().to_vec();
        body.extend_from_slice(&[0; NLMSG_HDRLEN]);
        body.extend(attribute(NLMSGERR_ATTR_MSG, b"Exclusivity flag on\0"));
        let refusal = raw_message(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 1, &body);
        assert_eq!(
            parse_error(&only_message(&refusal)).unwrap(),
            Some(Refusal {
                errno: Errno::EEXIST,
                message: Some("Exclusivity flag on".to_owned())
            })
        );

        // Uncapped: the whole request (24 bytes here) is echoed before the attributes.
        let mut body = (-libc::EPERM).to_ne_bytes().to_vec();
        let echoed = raw_message(RTM_NEWQDISC, 0, 1, &[0xaa; 8]);
        body.extend_from_slice(&echoed);
        body.extend(attribute(NLMSGERR_ATTR_MSG, b"no\0"));
        let refusal = raw_message(NLMSG_ERROR, NLM_F_ACK_TLVS, 1, &body);
        assert_eq!(
            parse_error(&only_message(&refusal)).unwrap(),
            Some(Refusal {
                errno: Errno::EPERM,
                message: Some("no".to_owned())
            })
        );

        // Without the TLV flag there is no text, whatever follows.
        let plain = raw_message(NLMSG_ERROR, 0, 1, &(-libc::ENOENT).to_ne_bytes());
        assert_eq!(
            parse_error(&only_message(&plain)).unwrap(),
            Some(Refusal {
                errno: Errno::ENOENT,
                message: None
            })
        );
    }

    #[test]
    fn requests_are_laid_out_as_the_kernel_expects() {
        let request = Request::new(
            RTM_DELTFILTER,
            NLM_F_REQUEST | NLM_F_ACK,
            TcMsg {
                ifindex: 9,
                handle: 0x6d61,
                parent: ClsactHook::Egress.parent(),
                info: tc_info(1, 3),
            },
        )
        .string_attr(TCA_KIND, "bpf")
        .unwrap()
        .finish(77)
        .unwrap();
        // header 16 + tcmsg 20 + "bpf\0" attribute 8.
        assert_eq!(request.len(), 44);
        let message = only_message(&request);
        assert_eq!(
            (message.kind, message.flags, message.seq),
            (RTM_DELTFILTER, NLM_F_REQUEST | NLM_F_ACK, 77)
        );
        assert_eq!(
            TcMsg::decode(message.payload).unwrap(),
            TcMsg {
                ifindex: 9,
                handle: 0x6d61,
                parent: 0xffff_fff3,
                info: tc_info(1, 3),
            }
        );
        let attributes: Vec<_> = Attributes::new(&message.payload[TCMSG_LEN..])
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(attributes, [(TCA_KIND, &b"bpf\0"[..])]);

        // An odd-length string is padded to the alignment.
        let padded = Request::new(RTM_NEWQDISC, 0, TcMsg::default())
            .string_attr(TCA_KIND, "clsact")
            .unwrap()
            .finish(1)
            .unwrap();
        assert_eq!(padded.len(), NLMSG_HDRLEN + TCMSG_LEN + 12);
        assert_eq!(u16_at(&padded, NLMSG_HDRLEN + TCMSG_LEN), Some(11));
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
    }

    #[test]
    fn truncated_messages_are_errors_not_panics() {
        let datagram = [
            bpf_filter_message(5),
            raw_message(NLMSG_DONE, NLM_F_MULTI, 7, &0_i32.to_ne_bytes()),
        ]
        .concat();
        for cut in 0..datagram.len() {
            let prefix = &datagram[..cut];
            for message in Messages::new(prefix) {
                let Ok(message) = message else { break };
                let _ = parse_filter(&message, 5);
                let _ = parse_ingress_qdisc(&message, 5);
                let _ = parse_error(&message);
            }
        }
        // A message cut inside its options must not be reported as a filter.
        let whole = bpf_filter_message(5);
        let mut lying = whole.clone();
        // Claim the message is 8 bytes shorter than it is: the options attribute now overruns.
        let shorter = u32::try_from(whole.len() - 8).unwrap();
        lying[..4].copy_from_slice(&shorter.to_ne_bytes());
        let message = Messages::new(&lying).next().unwrap().unwrap();
        assert!(matches!(
            parse_filter(&message, 5),
            Err(TcNetlinkError::Malformed(_))
        ));
    }

    #[test]
    fn zero_length_attributes_and_messages_do_not_loop_forever() {
        let zero_attribute = [0_u8; 8];
        let items: Vec<_> = Attributes::new(&zero_attribute).collect();
        assert_eq!(items.len(), 1);
        assert!(items[0].is_err());
        let zero_message = [0_u8; 32];
        let items: Vec<_> = Messages::new(&zero_message).collect();
        assert_eq!(items.len(), 1);
        assert!(items[0].is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            for message in Messages::new(&bytes) {
                let Ok(message) = message else { break };
                let _ = parse_filter(&message, 5);
                let _ = parse_ingress_qdisc(&message, 5);
                let _ = parse_error(&message);
                let _ = extended_ack_text(&message);
            }
            for attribute in Attributes::new(&bytes) {
                if attribute.is_err() {
                    break;
                }
            }
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
            for message in Messages::new(&bytes) {
                let Ok(message) = message else { break };
                let _ = parse_filter(&message, 5);
                let _ = parse_error(&message);
                let _ = extended_ack_text(&message);
            }
        }
    }
}
