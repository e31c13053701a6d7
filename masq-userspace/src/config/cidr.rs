//! CIDRs as upstream understands them: parsed by Go's `net.ParseCIDR`, classified by
//! `To4() == nil`, and written into rules exactly as the user spelled them.

use std::{fmt, sync::Arc};

use go_compat::{net::parse_cidr, strconv::quote};
/// A network in its matching form: the address family's own bits and a prefix length.
pub use ipnet::IpNet as Network;

/// Address family of a CIDR, decided as upstream does: an address that Go can express in four
/// bytes (including IPv4-mapped IPv6 such as `::ffff:10.0.0.0/104`) is IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (iptables).
    Ipv4,
    /// IPv6 (ip6tables).
    Ipv6,
}

impl fmt::Display for Family {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        })
    }
}

/// A CIDR from a config file: the text as written, and what it means.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    text: CidrText,
    network: Network,
}

/// The longest text kept in place (every IPv4 CIDR without padded prefixes, short IPv6 ones).
const INLINE: usize = 22;

/// A CIDR list entry's text, as written. Configs, policies and the reader's cache copy CIDRs
/// by the ten thousand: a short text is copied with its entry, with no allocation to make or
/// free, a longer one is shared. Which one is decided by the length alone, so equal texts
/// compare and hash alike.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CidrText(Repr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl CidrText {
    /// The text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Copied whole from a `&str`: always valid UTF-8.
            Repr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Shared(text) => text,
        }
    }
}

impl From<&str> for CidrText {
    fn from(text: &str) -> Self {
        let mut bytes = [0; INLINE];
        match (bytes.get_mut(..text.len()), u8::try_from(text.len())) {
            (Some(inline), Ok(len)) => {
                inline.copy_from_slice(text.as_bytes());
                Self(Repr::Inline { len, bytes })
            }
            _ => Self(Repr::Shared(text.into())),
        }
    }
}

impl From<String> for CidrText {
    fn from(text: String) -> Self {
        Self::from(text.as_str())
    }
}

impl Default for CidrText {
    fn default() -> Self {
        Self::from("")
    }
}

impl std::ops::Deref for CidrText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for CidrText {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), formatter)
    }
}

impl Cidr {
    /// Parses `text` with `net.ParseCIDR`'s rules and requires it to be aligned, as upstream's
    /// validation does. The error is upstream's message for that CIDR.
    pub fn parse(text: &str) -> Result<Self, CidrError> {
        let parsed = parse_cidr(text).ok_or_else(|| CidrError::Unparsable {
            cidr: text.to_owned(),
        })?;
        if !parsed.is_aligned() {
            return Err(CidrError::NotAligned {
                cidr: text.to_owned(),
                ip: parsed.ip_string(),
                network: parsed.network_string(),
            });
        }
        Ok(Self {
            text: text.into(),
            network: parsed.network(),
        })
    }

    /// A built-in CIDR (the link-local ranges) whose meaning is known without parsing.
    pub fn builtin(text: &'static str, network: Network) -> Self {
        Self {
            text: text.into(),
            network,
        }
    }

    /// The CIDR exactly as written in the config.
    pub fn as_str(&self) -> &str {
        self.text.as_str()
    }

    /// The CIDR's text, to copy into another list.
    pub const fn text(&self) -> &CidrText {
        &self.text
    }

    /// What the CIDR matches.
    pub const fn network(&self) -> &Network {
        &self.network
    }

    /// The family upstream files the CIDR under.
    pub const fn family(&self) -> Family {
        match self.network {
            Network::V4(_) => Family::Ipv4,
            Network::V6(_) => Family::Ipv6,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// Why a CIDR was rejected; the messages are upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// `net.ParseCIDR` failed.
    #[error("CIDR {} could not be parsed, invalid CIDR address: {cidr}", quote(.cidr))]
    Unparsable {
        /// The CIDR as written.
        cidr: String,
    },
    /// The address has host bits set.
    #[error(
        "CIDR {} is not aligned to a CIDR block, ip: {} network: {}",
        quote(.cidr),
        quote(.ip),
        quote(.network)
    )]
    NotAligned {
        /// The CIDR as written.
        cidr: String,
        /// The address part, as Go prints it.
        ip: String,
        /// The network, as Go prints it.
        network: String,
    },
}
