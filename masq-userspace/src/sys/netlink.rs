//! Netlink requests, framed and answered in one place for every family masq speaks:
//! rtnetlink (traffic control in [`super::tc`], the kernel's source address in
//! [`super::route`]), XFRM ([`super::xfrm`]) and netfilter's conntrack ([`super::conntrack`]).
//!
//! The messages themselves are built and read with the `netlink-packet-*` crates, or by hand
//! where they fall short. What those crates leave to their users is here, written once: a
//! blocking socket that gives up when the kernel stays silent, framing a request with its
//! flags and sequence number, matching answers to it by sequence number and sender, reading an
//! acknowledgement, a reply or a dump to its end (again when the kernel marks a dump torn),
//! and the kernel's refusal with its extended-ack text, which `netlink-packet-core` 0.9 hands
//! over as the raw bytes after an error's code.
//!
//! Each caller opens its own socket and closes it again: these are rare control-plane requests.
//! The socket that listens to the kernel's announcements is [`super::interface_watch`]'s.

use std::{io, time::Duration};

use netlink_packet_core::{
    DecodeError, ErrorBuffer, ErrorMessage, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_MULTIPART, NLM_F_REQUEST, NLMSG_ALIGNTO, NLMSG_DONE, NLMSG_ERROR,
    NLMSG_OVERRUN, NetlinkBuffer, NetlinkHeader, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable, NlasIterator, Parseable as _, parse_i32, parse_string, parse_u32,
};
use netlink_sys::{
    Socket, SocketAddr,
    protocols::{NETLINK_NETFILTER, NETLINK_ROUTE, NETLINK_XFRM},
};
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

/// The netlink families masq sends requests to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// `NETLINK_ROUTE`: links, addresses, routes, qdiscs and filters.
    Route,
    /// `NETLINK_XFRM`: IPsec policies and states.
    Xfrm,
    /// `NETLINK_NETFILTER`: conntrack, among netfilter's subsystems.
    Netfilter,
}

impl Family {
    const fn protocol(self) -> isize {
        match self {
            Self::Route => NETLINK_ROUTE,
            Self::Xfrm => NETLINK_XFRM,
            Self::Netfilter => NETLINK_NETFILTER,
        }
    }
}

/// A netlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetlinkError {
    /// The socket could not be opened or used.
    #[error("netlink socket: {operation} failed: {errno}")]
    Socket {
        /// What was being done.
        operation: &'static str,
        /// The system call's error (EAGAIN when the kernel did not answer in time).
        errno: Errno,
    },
    /// The kernel refused the request, or ended a dump with an error part way.
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

impl NetlinkError {
    /// Opening the socket failed.
    pub(crate) const OPENING: &str = "opening";

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

/// The kernel's refusal as an `io::Error`: its errno, with its extended-ack text when it sent
/// one.
pub(super) fn errno_with_text(errno: Errno, message: Option<String>) -> io::Error {
    match message {
        Some(text) => io::Error::other(format!("{errno} (kernel: {text})")),
        None => io::Error::from(errno),
    }
}

/// A message of type `message_type` whose payload is given as bytes: a request the crates
/// have no type for (an XFRM dump needs none), or, in tests, any message as the kernel sends it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawMessage<'payload> {
    /// The netlink message type.
    pub(crate) message_type: u16,
    /// What follows the netlink header.
    pub(crate) payload: &'payload [u8],
}

impl NetlinkSerializable for RawMessage<'_> {
    fn message_type(&self) -> u16 {
        self.message_type
    }

    fn buffer_len(&self) -> usize {
        self.payload.len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        buffer.copy_from_slice(self.payload);
    }
}

/// A blocking netlink socket of one family, with its sequence counter and receive buffer.
#[derive(Debug)]
pub(crate) struct NetlinkSocket {
    socket: Socket,
    next_seq: u32,
    buf: Vec<u8>,
}

impl NetlinkSocket {
    /// Opens a socket of `family` whose receives give up after `reply_timeout`: the kernel
    /// answers at once, so silence means something is badly wrong and the caller should say so
    /// rather than hang.
    pub(crate) fn open(family: Family, reply_timeout: Duration) -> Result<Self, NetlinkError> {
        let mut socket =
            Socket::new(family.protocol()).map_err(NetlinkError::socket(NetlinkError::OPENING))?;
        socket
            .bind_auto()
            .map_err(NetlinkError::socket("binding"))?;
        let seconds = i64::try_from(reply_timeout.as_secs()).unwrap_or(i64::MAX);
        setsockopt(&socket, sockopt::ReceiveTimeout, &TimeVal::seconds(seconds)).map_err(
            |errno| NetlinkError::Socket {
                operation: "setting the receive timeout",
                errno,
            },
        )?;
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

    /// Sends `request` with `flags` (`NLM_F_REQUEST` and `NLM_F_ACK` added) and waits for the
    /// kernel's acknowledgement.
    pub(crate) fn acknowledged<M: NetlinkSerializable>(
        &mut self,
        flags: u16,
        request: impl Fn() -> M,
    ) -> Result<(), NetlinkError> {
        self.exchange(NLM_F_REQUEST | NLM_F_ACK | flags, request, |_, _| {
            Ok(None::<()>)
        })
        .map(drop)
    }

    /// Sends the dump request `request` and reads every message of the dump, sent again when
    /// the kernel marks it torn by concurrent changes. Returns what `parse` makes of each
    /// message other than netlink's own (done, error, overrun), given its type and payload.
    pub(crate) fn dump<M: NetlinkSerializable, T>(
        &mut self,
        request: impl Fn() -> M,
        parse: impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    ) -> Result<Vec<T>, NetlinkError> {
        self.exchange(NLM_F_REQUEST | NLM_F_DUMP, request, parse)
    }

    /// Sends `request` and reads its one reply (see [`Self::dump`] for `parse`).
    pub(crate) fn query<M: NetlinkSerializable, T>(
        &mut self,
        request: impl Fn() -> M,
        parse: impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    ) -> Result<Vec<T>, NetlinkError> {
        self.exchange(NLM_F_REQUEST, request, parse)
    }

    /// Sends `request` with `flags` and reads its answer to the end: the acknowledgement (with
    /// `NLM_F_ACK`), the one reply, or every message of a dump, sent again when the kernel
    /// marks it torn.
    fn exchange<M: NetlinkSerializable, T>(
        &mut self,
        flags: u16,
        request: impl Fn() -> M,
        mut parse: impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    ) -> Result<Vec<T>, NetlinkError> {
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
        Err(NetlinkError::Interrupted {
            attempts: DUMP_ATTEMPTS,
        })
    }

    /// Sends a request to the kernel and returns its sequence number.
    fn send<M: NetlinkSerializable>(
        &mut self,
        flags: u16,
        message: M,
    ) -> Result<u32, NetlinkError> {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let bytes = frame(flags, seq, message);
        let kernel = SocketAddr::new(0, 0);
        let sent = loop {
            match self.socket.send_to(&bytes, &kernel, 0) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                result => break result.map_err(NetlinkError::socket("sending"))?,
            }
        };
        if sent != bytes.len() {
            return Err(NetlinkError::Malformed(
                "request only partly sent".to_owned(),
            ));
        }
        Ok(seq)
    }

    /// Receives one datagram from the kernel into `self.buf` and returns its length. The
    /// datagram's size is peeked first so a big one is never cut short.
    fn receive(&mut self) -> Result<usize, NetlinkError> {
        loop {
            let peeked = self
                .socket
                .recv_from(&mut &mut self.buf[..], libc::MSG_PEEK | libc::MSG_TRUNC);
            let size = match peeked {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                result => result.map_err(NetlinkError::socket("receiving"))?.0,
            };
            if size > self.buf.len() {
                self.buf.resize(size, 0);
            }
            let (length, sender) = match self.socket.recv_from(&mut &mut self.buf[..], 0) {
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                result => result.map_err(NetlinkError::socket("receiving"))?,
            };
            // Only the kernel (port 0) answers requests; anything else is not for us.
            if sender.port_number() == 0 {
                return Ok(length.min(self.buf.len()));
            }
        }
    }
}

/// `message` framed as a request to the kernel: the netlink header with `flags` and sequence
/// number `seq`, then the message.
pub(crate) fn frame<M: NetlinkSerializable>(flags: u16, seq: u32, message: M) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    bytes
}

/// How far an answer has been read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Answer {
    /// Its last message has been read.
    pub(super) done: bool,
    /// The kernel marked a dump torn by concurrent changes.
    pub(super) interrupted: bool,
}

/// Reads one datagram of the answer to request `seq` into `items` (see
/// [`NetlinkSocket::dump`]), up to the answer's end. Messages of other requests are skipped.
pub(super) fn read_datagram<T>(
    mut rest: &[u8],
    seq: u32,
    wants_ack: bool,
    parse: &mut impl FnMut(u16, &[u8]) -> Result<Option<T>, DecodeError>,
    items: &mut Vec<T>,
    answer: &mut Answer,
) -> Result<(), NetlinkError> {
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
                    return Err(NetlinkError::Refused {
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
                return Err(NetlinkError::Socket {
                    operation: "receiving a dump",
                    errno: Errno::ENOBUFS,
                });
            }
            _ => {
                let item = parse(message.message_type(), message.payload())
                    .map_err(|error| NetlinkError::malformed(&error))?;
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
pub(super) fn split_message<'a>(
    datagram: &mut &'a [u8],
) -> Result<NetlinkBuffer<&'a [u8]>, NetlinkError> {
    let all: &'a [u8] = std::mem::take(datagram);
    let message =
        NetlinkBuffer::new_checked(all).map_err(|error| NetlinkError::malformed(&error))?;
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
pub(super) fn refusal(
    message: &NetlinkBuffer<&[u8]>,
) -> Result<Option<NetlinkError>, NetlinkError> {
    let error = ErrorBuffer::new_checked(&message.payload())
        .and_then(|buffer| ErrorMessage::parse(&buffer))
        .map_err(|error| NetlinkError::malformed(&error))?;
    let Some(code) = error.code else {
        return Ok(None);
    };
    let text = if message.flags() & NLM_F_ACK_TLVS != 0 {
        extended_ack_text(message.flags(), &error.header)
    } else {
        None
    };
    Ok(Some(NetlinkError::Refused {
        errno: Errno::from_raw(code.get().saturating_neg()),
        message: text,
    }))
}

/// The kernel's error text among the extended-ack attributes that follow an error's code and
/// the failed request (only its header when capped). Best effort: anything unexpected just
/// means no text.
pub(super) fn extended_ack_text(flags: u16, after_code: &[u8]) -> Option<String> {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The sequence number of the request the tests' answers belong to.
    pub(in crate::sys) const SEQ: u32 = 7;
    /// A message type that is no netlink control message.
    const DATA: u16 = 0x10;

    /// A message of request [`SEQ`] as the kernel sends it: padded, so that messages can be
    /// put together into a datagram.
    pub(in crate::sys) fn message(message_type: u16, flags: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = frame(
            flags,
            SEQ,
            RawMessage {
                message_type,
                payload,
            },
        );
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    /// An NLMSG_ERROR with `code` (0: an acknowledgement) and `after_code`.
    fn error(flags: u16, code: i32, after_code: &[u8]) -> Vec<u8> {
        message(
            NLMSG_ERROR,
            flags,
            &[&code.to_ne_bytes(), after_code].concat(),
        )
    }

    /// The extended-ack text attribute holding `text`, padded.
    fn text_attribute(text: &[u8]) -> Vec<u8> {
        let length = u16::try_from(4 + text.len()).unwrap_or(u16::MAX);
        let mut bytes = [
            &length.to_ne_bytes()[..],
            &NLMSGERR_ATTR_MSG.to_ne_bytes(),
            text,
        ]
        .concat();
        bytes.resize(bytes.len().next_multiple_of(4), 0);
        bytes
    }

    /// Every message of `datagram`, in order, up to a malformed one.
    pub(in crate::sys) fn messages(
        datagram: &[u8],
    ) -> Vec<Result<NetlinkBuffer<&[u8]>, NetlinkError>> {
        let mut rest = datagram;
        let mut found = Vec::new();
        while !rest.is_empty() {
            found.push(split_message(&mut rest));
        }
        found
    }

    /// Reads `datagram` as an answer to [`SEQ`]; payloads of data messages are collected.
    fn read(datagram: &[u8], wants_ack: bool) -> (Result<(), NetlinkError>, Vec<Vec<u8>>, Answer) {
        let mut items = Vec::new();
        let mut answer = Answer::default();
        let result = read_datagram(
            datagram,
            SEQ,
            wants_ack,
            &mut |_, payload: &[u8]| Ok(Some(payload.to_vec())),
            &mut items,
            &mut answer,
        );
        (result, items, answer)
    }

    #[test]
    fn a_request_is_framed_with_its_flags_and_sequence_number() {
        let bytes = frame(
            NLM_F_REQUEST | NLM_F_DUMP,
            9,
            RawMessage {
                message_type: 0x15,
                payload: &[1, 2, 3, 4, 5, 6],
            },
        );
        assert_eq!(bytes.len(), NLMSG_HDRLEN + 6);
        assert_eq!(&bytes[..4], &22_u32.to_ne_bytes());
        assert_eq!(&bytes[4..6], &0x15_u16.to_ne_bytes());
        assert_eq!(&bytes[6..8], &(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
        assert_eq!(&bytes[8..12], &9_u32.to_ne_bytes());
        // The port is the kernel's to fill in.
        assert_eq!(&bytes[12..16], &[0; 4]);
        assert_eq!(&bytes[16..22], &[1, 2, 3, 4, 5, 6]);
        let empty = frame(
            NLM_F_REQUEST,
            1,
            RawMessage {
                message_type: 0x15,
                payload: &[],
            },
        );
        assert_eq!(empty.len(), NLMSG_HDRLEN);
    }

    #[test]
    fn several_messages_share_a_datagram_and_the_last_may_lack_its_padding() {
        let mut last = message(DATA, 0, &[9, 9, 9]);
        last.truncate(NLMSG_HDRLEN + 3);
        let datagram = [
            message(DATA, 0, &[1]),
            message(NLMSG_DONE, 0, &[0; 4]),
            last,
        ]
        .concat();
        let found: Vec<_> = messages(&datagram)
            .into_iter()
            .map(|message| {
                let message = message.expect("well formed");
                (message.message_type(), message.payload().to_vec())
            })
            .collect();
        assert_eq!(
            found,
            [
                (DATA, vec![1]),
                (NLMSG_DONE, vec![0; 4]),
                (DATA, vec![9, 9, 9])
            ]
        );
    }

    #[test]
    fn zero_short_and_overlong_messages_are_errors_that_end_the_datagram() {
        let zero = messages(&[0; 32]);
        assert_eq!(zero.len(), 1);
        assert!(matches!(zero[0], Err(NetlinkError::Malformed(_))));
        let mut short_header = message(NLMSG_DONE, 0, &[]);
        short_header[..4].copy_from_slice(&8_u32.to_ne_bytes());
        assert!(matches!(
            read(&short_header, false).0,
            Err(NetlinkError::Malformed(_))
        ));
        let mut overlong = message(NLMSG_DONE, 0, &[]);
        overlong[..4].copy_from_slice(&64_u32.to_ne_bytes());
        assert!(matches!(
            read(&overlong, false).0,
            Err(NetlinkError::Malformed(_))
        ));
    }

    #[test]
    fn a_dump_ends_at_done_and_skips_other_requests() {
        let mut other = message(NLMSG_DONE, 0, &[0; 4]);
        other[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
        let first = [
            message(DATA, NLM_F_MULTIPART, &[1]),
            other,
            message(DATA, NLM_F_MULTIPART, &[2]),
        ]
        .concat();
        let (result, items, answer) = read(&first, false);
        assert!(result.is_ok());
        assert_eq!(items, [vec![1], vec![2]]);
        assert_eq!(
            answer,
            Answer::default(),
            "another request's NLMSG_DONE is not ours"
        );
        let (result, _, answer) = read(&message(NLMSG_DONE, NLM_F_MULTIPART, &[0; 4]), false);
        assert!(result.is_ok());
        assert!(answer.done);
        // Nothing after the end of the answer is read.
        let trailing = [message(NLMSG_DONE, 0, &[0; 4]), message(DATA, 0, &[3])].concat();
        assert!(read(&trailing, false).1.is_empty());
    }

    #[test]
    fn a_dump_torn_by_changes_is_marked_and_one_failed_part_way_is_refused() {
        let torn = [
            message(DATA, NLM_F_MULTIPART | NLM_F_DUMP_INTR, &[1]),
            message(NLMSG_DONE, NLM_F_MULTIPART, &[0; 4]),
        ]
        .concat();
        let (result, _, answer) = read(&torn, false);
        assert!(result.is_ok());
        assert_eq!(
            answer,
            Answer {
                done: true,
                interrupted: true
            }
        );
        let failed = message(NLMSG_DONE, 0, &(-libc::EMSGSIZE).to_ne_bytes());
        assert!(matches!(
            read(&failed, false).0,
            Err(NetlinkError::Refused {
                errno: Errno::EMSGSIZE,
                message: None
            })
        ));
        assert!(matches!(
            read(&message(NLMSG_OVERRUN, 0, &[]), false).0,
            Err(NetlinkError::Socket {
                errno: Errno::ENOBUFS,
                ..
            })
        ));
    }

    #[test]
    fn a_single_reply_ends_the_answer_unless_an_acknowledgement_is_awaited() {
        let reply = message(DATA, 0, &[5]);
        let (_, items, answer) = read(&reply, false);
        assert_eq!((items.len(), answer.done), (1, true));
        let (_, _, answer) = read(&reply, true);
        assert!(!answer.done);
        let (result, _, answer) = read(&error(0, 0, &[0; 16]), true);
        assert!(result.is_ok());
        assert!(answer.done);
    }

    #[test]
    fn a_data_message_the_caller_cannot_read_is_malformed() {
        let mut items: Vec<()> = Vec::new();
        let result = read_datagram(
            &message(DATA, 0, &[1]),
            SEQ,
            false,
            &mut |_, _| Err(DecodeError::from("unreadable")),
            &mut items,
            &mut Answer::default(),
        );
        assert!(
            matches!(result, Err(NetlinkError::Malformed(text)) if text.contains("unreadable"))
        );
    }

    #[test]
    fn acknowledgement_and_refusal_with_extended_ack_text() {
        let refused = |bytes: &[u8]| {
            let message = messages(bytes).remove(0).expect("well formed");
            match refusal(&message).expect("readable") {
                Some(NetlinkError::Refused { errno, message }) => Some((errno, message)),
                Some(other) => panic!("{other:?}"),
                None => None,
            }
        };
        assert_eq!(refused(&error(NLM_F_CAPPED, 0, &[0; 16])), None);

        // Capped refusal: errno, the request's header, then the text attribute.
        let capped = [vec![0; 16], text_attribute(b"Exclusivity flag on\0")].concat();
        assert_eq!(
            refused(&error(
                NLM_F_CAPPED | NLM_F_ACK_TLVS,
                -libc::EEXIST,
                &capped
            )),
            Some((Errno::EEXIST, Some("Exclusivity flag on".to_owned())))
        );

        // Uncapped: the whole request (24 bytes here) is echoed before the attributes.
        let mut request = vec![0; 24];
        request[..4].copy_from_slice(&24_u32.to_ne_bytes());
        let uncapped = [request, text_attribute(b"no\0")].concat();
        assert_eq!(
            refused(&error(NLM_F_ACK_TLVS, -libc::EPERM, &uncapped)),
            Some((Errno::EPERM, Some("no".to_owned())))
        );

        // Without the TLV flag there is no text, whatever follows.
        assert_eq!(
            refused(&error(0, -libc::ENOENT, &text_attribute(b"ignored\0"))),
            Some((Errno::ENOENT, None))
        );
        // An error too short for its code is malformed.
        let short = message(NLMSG_ERROR, 0, &[1, 2]);
        assert!(refusal(&messages(&short).remove(0).expect("header")).is_err());
    }

    #[test]
    fn extended_ack_text_is_best_effort() {
        // Attributes starting with a zero-length one, an echo longer than what follows, and
        // nothing at all: no text, no panic.
        assert_eq!(extended_ack_text(NLM_F_CAPPED, &[0; 16 + 8]), None);
        assert_eq!(extended_ack_text(0, &200_u32.to_ne_bytes()), None);
        assert_eq!(extended_ack_text(0, &[]), None);
    }
}
