//! A blocking rtnetlink socket for the agent's rare control-plane requests: the clsact qdisc
//! and its filters (`datapath::tc_netlink`) and the kernel's choice of a source address
//! (`node::interfaces`), and, on a `NETLINK_XFRM` socket, the IPsec policy dump
//! (`node::xfrm`). Each caller opens its own socket and closes it again.
//!
//! Messages are built and read with `netlink-packet-route`. What those crates leave to their
//! users stays here: matching answers to a request by sequence number and sender, reading a
//! dump to its end (and again when the kernel marks it torn), and the kernel's extended-ack
//! text, which `netlink-packet-core` 0.9 hands over as the raw bytes after an error's code.

use std::io;

use netlink_packet_core::{
    DecodeError, ErrorBuffer, ErrorMessage, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED,
    NLM_F_DUMP_INTR, NLM_F_MULTIPART, NLMSG_ALIGNTO, NLMSG_DONE, NLMSG_ERROR, NLMSG_OVERRUN,
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NlasIterator, Parseable as _, parse_i32, parse_string, parse_u32,
};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use nix::{
    errno::Errno,
    sys::{
        socket::{setsockopt, sockopt},
        time::{TimeVal, TimeValLike as _},
    },
};

/// `sizeof(struct nlmsghdr)`: what a capped error echoes of the failed request (ABI;
/// `netlink-packet-core` keeps its own copy private).
const NLMSG_HDRLEN: usize = 16;
/// The extended-ack attribute carrying the kernel's error text (`NLMSGERR_ATTR_MSG`).
const NLMSGERR_ATTR_MSG: u16 = 1;
/// First receive buffer: the kernel fills dump datagrams up to 32 KiB when the reader offers
/// that much. Larger datagrams are measured first and the buffer grows.
const RECV_BUFFER: usize = 32 * 1024;
/// How often a dump torn by concurrent changes is retried before failing.
const DUMP_ATTEMPTS: u32 = 3;

/// An rtnetlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RtnlError {
    /// The socket could not be opened or used.
    #[error("netlink socket: {operation} failed: {errno}")]
    Socket {
        /// What was being done.
        operation: &'static str,
        /// The system call's error (EAGAIN when the kernel did not answer in time).
        errno: Errno,
    },
    /// The kernel refused the request.
    #[error("{errno}")]
    Refused {
        /// The kernel's errno.
        errno: Errno,
        /// Its extended-ack text, when it sent one.
        message: Option<String>,
    },
    /// A dump kept being torn by concurrent changes.
    #[error("the dump was interrupted by concurrent changes {attempts} times in a row")]
    Interrupted {
        /// How many dumps were tried.
        attempts: u32,
    },
    /// A message was too short or inconsistent.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
}

impl RtnlError {
    fn socket(operation: &'static str) -> impl FnOnce(io::Error) -> Self {
        move |error| Self::Socket {
            operation,
            errno: Errno::from_raw(error.raw_os_error().unwrap_or(libc::EIO)),
        }
    }

    fn malformed(error: &DecodeError) -> Self {
        Self::Malformed(error.to_string())
    }
}

/// A blocking `NETLINK_ROUTE` socket with its sequence counter and receive buffer.
#[derive(Debug)]
pub(crate) struct Rtnl {
    socket: Socket,
    next_seq: u32,
    buf: Vec<u8>,
}

impl Rtnl {
    /// Opens a socket whose receives give up after `reply_timeout_seconds`: the kernel answers
    /// at once, so silence means something is badly wrong and the caller should say so rather
    /// than hang.
    pub(crate) fn open(reply_timeout_seconds: i64) -> Result<Self, RtnlError> {
        Self::open_protocol(NETLINK_ROUTE, reply_timeout_seconds)
    }

    /// [`Self::open`] for another netlink family (`NETLINK_XFRM`): the framing, errors and
    /// dumps are netlink's own, the same in every family.
    pub(crate) fn open_protocol(
        protocol: isize,
        reply_timeout_seconds: i64,
    ) -> Result<Self, RtnlError> {
        let mut socket = Socket::new(protocol).map_err(RtnlError::socket("opening"))?;
        socket.bind_auto().map_err(RtnlError::socket("binding"))?;
        setsockopt(
            &socket,
            sockopt::ReceiveTimeout,
            &TimeVal::seconds(reply_timeout_seconds),
        )
        .map_err(|errno| RtnlError::Socket {
            operation: "setting the receive timeout",
            errno,
        })?;
        // Best effort: extended acks (4.12+) add the kernel's reason to errors, capped acks
        // (4.3+) keep the failed request out of the error message. Older kernels work without.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        Ok(Self {
            socket,
            next_seq: 1,
            buf: vec![0; RECV_BUFFER],
        })
    }

    /// Sends `request` with `flags` and reads its answer to the end: the acknowledgement (with
    /// `NLM_F_ACK`), the one reply, or every message of a dump, sent again when the kernel
    /// marks it torn by concurrent changes. Returns what `parse` makes of each answer other
    /// than netlink's own (done, error, overrun), given its message type and payload.
    pub(crate) fn exchange<M: NetlinkSerializable, T>(
        &mut self,
        flags: u16,
        request: impl Fn() -> M,
        mut parse: impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    ) -> Result<Vec<T>, RtnlError> {
        // An acknowledged request ends with the acknowledgement, whatever comes before it.
        let wants_ack = flags & NLM_F_ACK != 0;
        for _ in 0..DUMP_ATTEMPTS {
            let seq = self.send(flags, request())?;
            let mut items = Vec::new();
            let mut answer = Answer::default();
            while !answer.done {
                let length = self.receive()?;
                let datagram = self.buf.get(..length).unwrap_or_default();
                read_datagram(
                    datagram,
                    seq,
                    wants_ack,
                    &mut parse,
                    &mut items,
                    &mut answer,
                )?;
            }
            if !answer.interrupted {
                return Ok(items);
            }
        }
        Err(RtnlError::Interrupted {
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// Sends a request to the kernel and returns its sequence number.
    fn send<M: NetlinkSerializable>(&mut self, flags: u16, message: M) -> Result<u32, RtnlError> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = seq;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        request.finalize();
        let mut bytes = vec![0; request.buffer_len()];
        request.serialize(&mut bytes);
        let kernel = SocketAddr::new(0, 0);
        let sent = loop {
            match self.socket.send_to(&bytes, &kernel, 0) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                result => break result.map_err(RtnlError::socket("sending"))?,
            }
        };
        if sent != bytes.len() {
            return Err(RtnlError::Malformed("request only partly sent".to_owned()));
        }
        Ok(seq)
    }

    /// Receives one datagram from the kernel into `self.buf` and returns its length. The
    /// datagram's size is peeked first so a big one is never cut short.
    fn receive(&mut self) -> Result<usize, RtnlError> {
        loop {
            let peeked = self
                .socket
                .recv_from(&mut &mut self.buf[..], libc::MSG_PEEK | libc::MSG_TRUNC);
            let size = match peeked {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                result => result.map_err(RtnlError::socket("receiving"))?.0,
            };
            if size > self.buf.len() {
                self.buf.resize(size, 0);
            }
            let (length, sender) = match self.socket.recv_from(&mut &mut self.buf[..], 0) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                result => result.map_err(RtnlError::socket("receiving"))?,
            };
            // Only the kernel (port 0) answers requests; anything else is not for us.
            if sender.port_number() == 0 {
                return Ok(length.min(self.buf.len()));
            }
        }
    }
}

/// How far an answer has been read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Answer {
    /// Its last message has been read.
    pub(crate) done: bool,
    /// The kernel marked a dump torn by concurrent changes.
    pub(crate) interrupted: bool,
}

/// Reads one datagram of the answer to request `seq` into `items` (see [`Rtnl::exchange`]),
/// up to the answer's end. Messages of other requests are skipped.
pub(crate) fn read_datagram<T>(
    mut rest: &[u8],
    seq: u32,
    wants_ack: bool,
    parse: &mut impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    items: &mut Vec<T>,
    answer: &mut Answer,
) -> Result<(), RtnlError> {
    while !rest.is_empty() && !answer.done {
        let message = split_message(&mut rest)?;
        if message.sequence_number() != seq {
            continue;
        }
        answer.interrupted |= message.flags() & NLM_F_DUMP_INTR != 0;
        match message.message_type() {
            NLMSG_DONE => {
                // The dump's own status: negative when it failed part way.
                let status = message
                    .payload()
                    .get(..4)
                    .and_then(|status| parse_i32(status).ok())
                    .unwrap_or(0);
                if status < 0 {
                    return Err(RtnlError::Refused {
                        errno: Errno::from_raw(status.saturating_neg()),
                        message: None,
                    });
                }
                answer.done = true;
            }
            NLMSG_ERROR => match refusal(&message)? {
                Some(refusal) => return Err(refusal),
                None => answer.done = true,
            },
            NLMSG_OVERRUN => {
                return Err(RtnlError::Socket {
                    operation: "receiving a dump",
                    errno: Errno::ENOBUFS,
                });
            }
            _ => {
                let item = parse(message.message_type(), message.payload())
                    .map_err(|error| RtnlError::malformed(&error))?;
                if let Some(item) = item {
                    items.push(item);
                }
                // A reply without NLM_F_MULTI is complete in itself.
                answer.done |= !wants_ack && message.flags() & NLM_F_MULTIPART == 0;
            }
        }
    }
    Ok(())
}

/// Splits the first message off `datagram`. A malformed one is an error and ends the
/// datagram: nothing after it can be trusted.
pub(crate) fn split_message<'a>(
    datagram: &mut &'a [u8],
) -> Result<NetlinkBuffer<&'a [u8]>, RtnlError> {
    let all: &'a [u8] = std::mem::take(datagram);
    let message = NetlinkBuffer::new_checked(all).map_err(|error| RtnlError::malformed(&error))?;
    let length = usize::try_from(message.length()).unwrap_or(usize::MAX);
    // The last message's padding may be missing.
    *datagram = all.get(align(length)..).unwrap_or_default();
    Ok(message)
}

/// Rounds up to the netlink alignment (saturating: an absurd length just runs off the end).
fn align(length: usize) -> usize {
    let alignment = usize::from(NLMSG_ALIGNTO);
    length.saturating_add(alignment - 1) & !(alignment - 1)
}

/// Reads an NLMSG_ERROR: `None` for an acknowledgement, the refusal otherwise.
pub(crate) fn refusal(message: &NetlinkBuffer<&[u8]>) -> Result<Option<RtnlError>, RtnlError> {
    let error = ErrorBuffer::new_checked(&message.payload())
        .and_then(|buffer| ErrorMessage::parse(&buffer))
        .map_err(|error| RtnlError::malformed(&error))?;
    let Some(code) = error.code else {
        return Ok(None);
    };
    let text = if message.flags() & NLM_F_ACK_TLVS != 0 {
        extended_ack_text(message.flags(), &error.header)
    } else {
        None
    };
    Ok(Some(RtnlError::Refused {
        errno: Errno::from_raw(code.get().saturating_neg()),
        message: text,
    }))
}

/// The kernel's error text among the extended-ack attributes that follow an error's code and
/// the failed request (only its header when capped). Best effort: anything unexpected just
/// means no text.
pub(crate) fn extended_ack_text(flags: u16, after_code: &[u8]) -> Option<String> {
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        usize::try_from(parse_u32(after_code.get(..4)?).ok()?).ok()?
    };
    NlasIterator::new(after_code.get(align(echoed)..)?)
        .map_while(Result::ok)
        .find(|attribute| attribute.kind() == NLMSGERR_ATTR_MSG)
        .and_then(|attribute| parse_string(attribute.value()).ok())
}
