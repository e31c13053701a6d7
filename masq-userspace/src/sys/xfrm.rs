//! The node's IPsec (XFRM) output policies, read over netlink (`NETLINK_XFRM`,
//! `XFRM_MSG_GETPOLICY` dump).
//!
//! The kernel looks a forwarded packet's output policy up at routing, before tc egress, with
//! the pod's source address. MASQUERADE looks it up again after SNAT (`nf_xfrm_me_harder`);
//! masq translates at tc egress, after the lookup, so the agent needs the policies to tell
//! which ones would have covered masqueraded traffic (see [`crate::ipsec`]).
//!
//! The dump is read by the [`super::netlink`] socket, as route netlink's are: a receive timeout,
//! sequence and sender checks, a buffer sized to each datagram, the kernel's refusal and the
//! error status a dump that fails part way ends with. The few structures needed are parsed
//! here by hand. `netlink-packet-xfrm` 0.5 builds on the same netlink-packet-core 0.9, but its
//! policy parser slices its input at fixed lengths and panics on a short reply; a policy here
//! is read defensively instead: a short or odd one is an error, never a panic, and never a
//! policy without its templates. The layouts (`linux/xfrm.h`, 64-bit and 32-bit alike except
//! where said):
//!
//! ```text
//! xfrm_userpolicy_info: sel (xfrm_selector, 56 bytes) | lft (64) | curlft (32) | priority u32
//!                       | index u32 | dir u8 | action u8 | flags u8 | share u8 | padding to u64
//! xfrm_selector:        daddr [16] | saddr [16] | dport be16 | dport_mask be16 | sport be16
//!                       | sport_mask be16 | family u16 | prefixlen_d u8 | prefixlen_s u8
//!                       | proto u8 | pad [3] | ifindex i32 | user u32
//! ```
//!
//! followed by attributes (`struct nlattr`, 4-byte aligned): `XFRMA_TMPL` (templates: the SAs
//! the policy requires), `XFRMA_MARK` (`{v, m}`) and `XFRMA_IF_ID` (an XFRM interface's id).

use std::{
    io,
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_core::{DecodeError, NlasIterator};
use nix::errno::Errno;

use super::netlink::{Family, NetlinkError, NetlinkSocket, RawMessage, errno_with_text};

/// How long to wait for the kernel's answer: it answers at once, so silence means something
/// is badly wrong, and the agent's loop must not hang on it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
const XFRM_MSG_NEWPOLICY: u16 = 0x13;
const XFRM_MSG_GETPOLICY: u16 = 0x15;
const XFRMA_TMPL: u16 = 5;
const XFRMA_MARK: u16 = 21;
const XFRMA_IF_ID: u16 = 31;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// Where `xfrm_userpolicy_info`'s fields after the selector and lifetimes start.
const PRIORITY_AT: usize = 56 + 64 + 32;
/// The struct's size: its `__u64` lifetimes align it to 8 bytes where the ABI aligns `u64` so
/// (64-bit targets, arm32), to 4 on i386. Attributes follow at this offset.
const USERPOLICY_INFO_LEN: usize = (PRIORITY_AT + 12).next_multiple_of(align_of::<u64>());

/// `XFRM_POLICY_OUT`.
pub(crate) const DIR_OUT: u8 = 1;
/// `XFRM_POLICY_BLOCK`.
pub(crate) const ACTION_BLOCK: u8 = 1;

/// One XFRM policy, as much of it as deciding which traffic it selects needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XfrmPolicy {
    /// The selector's source network.
    pub source: IpNet,
    /// The selector's destination network.
    pub destination: IpNet,
    /// IP protocol the selector takes (0: any).
    pub protocol: u8,
    /// Source port and mask (host order; mask 0: any).
    pub source_port: (u16, u16),
    /// Destination port and mask (host order; mask 0: any).
    pub destination_port: (u16, u16),
    /// The output interface the selector is bound to (0: any).
    pub ifindex: i32,
    /// `XFRM_POLICY_IN`, `_OUT` or `_FWD` (socket policies add `XFRM_POLICY_MAX`).
    pub direction: u8,
    /// `XFRM_POLICY_ALLOW` (0) or `XFRM_POLICY_BLOCK` (1).
    pub action: u8,
    /// Lower runs first.
    pub priority: u32,
    /// The kernel's index of the policy.
    pub index: u32,
    /// How many templates (required SAs) it has: none means "pass in clear".
    pub templates: usize,
    /// The packet mark it is limited to, `(value, mask)`, when it has one.
    pub mark: Option<(u32, u32)>,
    /// The XFRM interface it belongs to (0: none; such a policy applies only to traffic routed
    /// into that interface).
    pub if_id: u32,
}

impl XfrmPolicy {
    /// Whether it changes what happens to traffic it selects: it requires IPsec (has
    /// templates) or drops it (block). An allow policy without templates lets traffic pass in
    /// clear, as no policy at all does.
    pub const fn protects(&self) -> bool {
        self.action == ACTION_BLOCK || self.templates > 0
    }
}

/// Why the policies could not be read.
#[derive(Debug, thiserror::Error)]
pub enum XfrmError {
    /// The netlink socket failed, the kernel did not answer in time, or a reply could not be
    /// read.
    #[error("reading XFRM policies over netlink")]
    Netlink(#[source] io::Error),
    /// The kernel refused the dump (EPERM without CAP_NET_ADMIN) or ended it with an error part
    /// way.
    #[error("the kernel refused the XFRM policy dump or failed it part way")]
    Refused(#[source] io::Error),
    /// A policy could not be parsed.
    #[error("an unreadable XFRM policy reply: {0}")]
    Decode(&'static str),
}

impl From<NetlinkError> for XfrmError {
    fn from(error: NetlinkError) -> Self {
        match error {
            NetlinkError::Refused { errno, message } => {
                Self::Refused(errno_with_text(errno, message))
            }
            error => Self::Netlink(io::Error::other(error)),
        }
    }
}

/// Every XFRM policy of the calling thread's network namespace. A kernel without XFRM netlink
/// (`CONFIG_XFRM_USER` off) has none that an IPsec daemon could have installed through it.
pub(crate) fn policies() -> Result<Vec<XfrmPolicy>, XfrmError> {
    let mut socket = match NetlinkSocket::open(Family::Xfrm, REPLY_TIMEOUT) {
        Ok(socket) => socket,
        Err(NetlinkError::Socket {
            operation: NetlinkError::OPENING,
            errno: Errno::EPROTONOSUPPORT,
        }) => return Ok(Vec::new()),
        Err(error) => return Err(error.into()),
    };
    // The dump request has no payload.
    let request = || RawMessage {
        message_type: XFRM_MSG_GETPOLICY,
        payload: &[],
    };
    Ok(socket.dump(request, parse_message)?)
}

/// One message of the dump: a policy, or `None` for anything else.
fn parse_message(message_type: u16, payload: &[u8]) -> Result<Option<XfrmPolicy>, DecodeError> {
    if message_type != XFRM_MSG_NEWPOLICY {
        return Ok(None);
    }
    parse_policy(payload).map_err(|error| DecodeError::from(error.to_string()))
}

/// One `XFRM_MSG_NEWPOLICY` payload; `None` for a selector of a family other than IPv4 and
/// IPv6, which selects nothing masq translates.
fn parse_policy(payload: &[u8]) -> Result<Option<XfrmPolicy>, XfrmError> {
    const SHORT: XfrmError = XfrmError::Decode("a policy shorter than xfrm_userpolicy_info");
    if payload.len() < USERPOLICY_INFO_LEN {
        return Err(SHORT);
    }
    let family = u16_at(payload, 40).ok_or(SHORT)?;
    let prefix_d = *payload.get(42).ok_or(SHORT)?;
    let prefix_s = *payload.get(43).ok_or(SHORT)?;
    let network = |at: usize, prefix: u8| -> Result<Option<IpNet>, XfrmError> {
        let bytes = payload.get(at..at + 16).ok_or(SHORT)?;
        let invalid = XfrmError::Decode("a selector prefix longer than its address");
        Ok(match family {
            AF_INET => {
                let octets: [u8; 4] = bytes
                    .get(..4)
                    .and_then(|b| b.try_into().ok())
                    .ok_or(SHORT)?;
                let net = Ipv4Net::new(Ipv4Addr::from(octets), prefix).map_err(|_| invalid)?;
                Some(IpNet::V4(net.trunc()))
            }
            AF_INET6 => {
                let octets: [u8; 16] = bytes.try_into().map_err(|_| SHORT)?;
                let net = Ipv6Net::new(Ipv6Addr::from(octets), prefix).map_err(|_| invalid)?;
                Some(IpNet::V6(net.trunc()))
            }
            _ => None,
        })
    };
    let (Some(destination), Some(source)) = (network(0, prefix_d)?, network(16, prefix_s)?) else {
        return Ok(None);
    };
    let be16 = |at: usize| {
        payload
            .get(at..at + 2)
            .and_then(|bytes| bytes.try_into().ok())
            .map(u16::from_be_bytes)
            .ok_or(SHORT)
    };
    let mut policy = XfrmPolicy {
        source,
        destination,
        protocol: *payload.get(44).ok_or(SHORT)?,
        destination_port: (be16(32)?, be16(34)?),
        source_port: (be16(36)?, be16(38)?),
        ifindex: u32_at(payload, 48).ok_or(SHORT)?.cast_signed(),
        priority: u32_at(payload, PRIORITY_AT).ok_or(SHORT)?,
        index: u32_at(payload, PRIORITY_AT + 4).ok_or(SHORT)?,
        direction: *payload.get(PRIORITY_AT + 8).ok_or(SHORT)?,
        action: *payload.get(PRIORITY_AT + 9).ok_or(SHORT)?,
        templates: 0,
        mark: None,
        if_id: 0,
    };
    // An attribute cut short, or 1-3 bytes too few for its header, is an error: a policy cut
    // inside its attributes must not pass for one without templates.
    for attribute in NlasIterator::new(payload.get(USERPOLICY_INFO_LEN..).unwrap_or_default()) {
        let attribute =
            attribute.map_err(|_| XfrmError::Decode("an attribute length beyond its message"))?;
        let value = attribute.value();
        match attribute.kind() {
            // `struct xfrm_user_tmpl` is 64 bytes; any content means at least one template.
            XFRMA_TMPL => policy.templates = value.len().div_ceil(64),
            XFRMA_MARK => {
                policy.mark = u32_at(value, 0).zip(u32_at(value, 4));
            }
            XFRMA_IF_ID => policy.if_id = u32_at(value, 0).unwrap_or(0),
            _ => {}
        }
    }
    Ok(Some(policy))
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    bytes
        .get(at..at.checked_add(2)?)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u16::from_ne_bytes)
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at.checked_add(4)?)
        .and_then(|bytes| bytes.try_into().ok())
        .map(u32::from_ne_bytes)
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NLM_F_MULTIPART, NLMSG_DONE, NLMSG_ERROR};

    use super::*;
    use crate::sys::netlink::{
        Answer, read_datagram,
        tests::{self, SEQ},
    };

    /// Reads one datagram of the dump as [`policies`] does; says whether it ended the dump.
    fn parse_datagram(datagram: &[u8], policies: &mut Vec<XfrmPolicy>) -> Result<bool, XfrmError> {
        let mut answer = Answer::default();
        read_datagram(
            datagram,
            SEQ,
            false,
            &mut parse_message,
            policies,
            &mut answer,
        )?;
        Ok(answer.done)
    }

    /// An `xfrm_userpolicy_info` as the kernel lays it out, then `attributes`.
    fn payload(
        family: u16,
        source: &[u8],
        prefix_s: u8,
        destination: &[u8],
        prefix_d: u8,
        attributes: &[(u16, Vec<u8>)],
    ) -> Vec<u8> {
        let mut bytes = vec![0_u8; USERPOLICY_INFO_LEN];
        bytes[..destination.len()].copy_from_slice(destination);
        bytes[16..16 + source.len()].copy_from_slice(source);
        bytes[32..34].copy_from_slice(&8080_u16.to_be_bytes());
        bytes[34..36].copy_from_slice(&0xffff_u16.to_be_bytes());
        bytes[40..42].copy_from_slice(&family.to_ne_bytes());
        bytes[42] = prefix_d;
        bytes[43] = prefix_s;
        bytes[44] = 6;
        bytes[48..52].copy_from_slice(&3_i32.to_ne_bytes());
        bytes[PRIORITY_AT..PRIORITY_AT + 4].copy_from_slice(&100_u32.to_ne_bytes());
        bytes[PRIORITY_AT + 4..PRIORITY_AT + 8].copy_from_slice(&7_u32.to_ne_bytes());
        bytes[PRIORITY_AT + 8] = DIR_OUT;
        for (kind, value) in attributes {
            let length = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
            bytes.extend_from_slice(&length.to_ne_bytes());
            bytes.extend_from_slice(&kind.to_ne_bytes());
            bytes.extend_from_slice(value);
            bytes.resize(bytes.len().next_multiple_of(4), 0);
        }
        bytes
    }

    /// A message of the dump, marked part of a multipart answer.
    fn message(kind: u16, payload: &[u8]) -> Vec<u8> {
        tests::message(kind, NLM_F_MULTIPART, payload)
    }

    fn marked(value: u32, mask: u32) -> Vec<u8> {
        [value.to_ne_bytes(), mask.to_ne_bytes()].concat()
    }

    #[test]
    fn a_policy_is_read_with_its_selector_and_attributes() {
        let bytes = payload(
            AF_INET,
            &[192, 0, 2, 1],
            32,
            &[198, 51, 100, 7],
            24,
            &[
                (XFRMA_TMPL, vec![0; 128]),
                (XFRMA_MARK, marked(1, 0xff)),
                (99, vec![1, 2, 3]),
            ],
        );
        let policy = parse_policy(&bytes).ok().flatten();
        assert_eq!(
            policy,
            Some(XfrmPolicy {
                source: "192.0.2.1/32".parse().unwrap_or_else(|_| unreachable!()),
                destination: "198.51.100.0/24".parse().unwrap_or_else(|_| unreachable!()),
                protocol: 6,
                source_port: (0, 0),
                destination_port: (8080, 0xffff),
                ifindex: 3,
                direction: DIR_OUT,
                action: 0,
                priority: 100,
                index: 7,
                templates: 2,
                mark: Some((1, 0xff)),
                if_id: 0,
            })
        );
        let v6 = payload(
            AF_INET6,
            &[0x20, 0x01, 0x0d, 0xb8, 0, 1],
            48,
            &[],
            0,
            &[(XFRMA_IF_ID, 5_u32.to_ne_bytes().to_vec())],
        );
        let policy = parse_policy(&v6).ok().flatten();
        assert_eq!(
            policy.as_ref().map(|policy| policy.source.to_string()),
            Some("2001:db8:1::/48".to_owned())
        );
        assert_eq!(
            policy.as_ref().map(|policy| policy.destination.to_string()),
            Some("::/0".to_owned())
        );
        assert_eq!(
            policy.map(|policy| (policy.if_id, policy.templates)),
            Some((5, 0))
        );
    }

    #[test]
    fn short_and_odd_policies_are_errors_or_skipped_never_panics() {
        let good = payload(
            AF_INET,
            &[192, 0, 2, 1],
            32,
            &[198, 51, 100, 0],
            24,
            &[(XFRMA_TMPL, vec![0; 64])],
        );
        for cut in 0..=good.len() {
            // Cut inside the fixed part: an error; inside the attributes: an error too. Only a
            // cut between the fixed part and the attributes leaves a whole policy (one without
            // attributes); the netlink header's length catches that cut.
            let parsed = parse_policy(&good[..cut]);
            assert!(
                parsed.is_err() || cut == USERPOLICY_INFO_LEN || cut == good.len(),
                "cut at {cut}: {parsed:?}"
            );
        }
        let too_long_prefix = payload(AF_INET, &[192, 0, 2, 1], 33, &[0; 4], 0, &[]);
        assert!(parse_policy(&too_long_prefix).is_err());
        let other_family = payload(0, &[], 0, &[], 0, &[]);
        assert!(matches!(parse_policy(&other_family), Ok(None)));
        let mut bad_attribute = payload(AF_INET, &[192, 0, 2, 1], 32, &[0; 4], 0, &[]);
        bad_attribute.extend_from_slice(&200_u16.to_ne_bytes());
        bad_attribute.extend_from_slice(&XFRMA_TMPL.to_ne_bytes());
        assert!(parse_policy(&bad_attribute).is_err());
        let mut zero_attribute = payload(AF_INET, &[192, 0, 2, 1], 32, &[0; 4], 0, &[]);
        zero_attribute.extend_from_slice(&[0; 4]);
        assert!(parse_policy(&zero_attribute).is_err());
    }

    #[test]
    fn a_dump_ends_at_done_and_reports_refusals() {
        let policy = payload(
            AF_INET,
            &[192, 0, 2, 1],
            32,
            &[198, 51, 100, 0],
            24,
            &[(XFRMA_TMPL, vec![0; 64])],
        );
        let mut policies = Vec::new();
        let first = [
            message(XFRM_MSG_NEWPOLICY, &policy),
            message(0x10, &[1, 2, 3]),
        ]
        .concat();
        assert!(matches!(parse_datagram(&first, &mut policies), Ok(false)));
        assert!(matches!(
            parse_datagram(&message(NLMSG_DONE, &[0; 4]), &mut policies),
            Ok(true)
        ));
        assert_eq!(policies.len(), 1);

        let refused = message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        match parse_datagram(&refused, &mut policies) {
            Err(XfrmError::Refused(error)) => assert_eq!(error.raw_os_error(), Some(libc::EPERM)),
            other => panic!("{other:?}"),
        }
        let datagram = [
            message(XFRM_MSG_NEWPOLICY, &policy),
            message(NLMSG_DONE, &[0; 4]),
        ]
        .concat();
        for cut in 1..datagram.len() {
            let mut policies = Vec::new();
            // Whatever the cut, an answer: never a panic.
            let _ = parse_datagram(&datagram[..cut], &mut policies);
        }
        // A dump that fails part way says so in its NLMSG_DONE: not a complete dump.
        let failed = [
            message(XFRM_MSG_NEWPOLICY, &policy),
            message(NLMSG_DONE, &(-libc::EMSGSIZE).to_ne_bytes()),
        ]
        .concat();
        match parse_datagram(&failed, &mut Vec::new()) {
            Err(XfrmError::Refused(error)) => {
                assert_eq!(error.raw_os_error(), Some(libc::EMSGSIZE));
            }
            other => panic!("{other:?}"),
        }
    }
}
