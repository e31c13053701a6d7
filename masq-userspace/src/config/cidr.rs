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
    text: Text,
    network: Network,
}

/// The longest text kept in place (every IPv4 CIDR without padded prefixes, short IPv6 ones).
const INLINE: usize = 22;

/// A CIDR's text. Policies and configs copy CIDRs by the ten thousand: a short text is copied
/// with the CIDR, with no allocation to make or free, a longer one is shared. Which one is
/// decided by the length alone, so equal texts compare and hash alike.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Text {
    Inline { len: u8, bytes: [u8; INLINE] },
    Shared(Arc<str>),
}

impl From<&str> for Text {
    fn from(text: &str) -> Self {
        let mut bytes = [0; INLINE];
        match (bytes.get_mut(..text.len()), u8::try_from(text.len())) {
            (Some(inline), Ok(len)) => {
                inline.copy_from_slice(text.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Shared(text.into()),
        }
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
        match &self.text {
            // Copied whole from a `&str`: always valid UTF-8.
            Text::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Text::Shared(text) => text,
        }
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use ipnet::{Ipv4Net, Ipv6Net};

    use super::*;

    fn v4(addr: Ipv4Addr, prefix: u8) -> Network {
        Network::V4(Ipv4Net::new_assert(addr, prefix))
    }

    fn error(text: &str) -> String {
        match Cidr::parse(text) {
            Ok(cidr) => panic!("{text} parsed as {:?}", cidr.network()),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn upstream_validation_messages() {
        for (text, message) in [
            (
                "abcdefg",
                r#"CIDR "abcdefg" could not be parsed, invalid CIDR address: abcdefg"#,
            ),
            (
                "10.256.0.0/16",
                r#"CIDR "10.256.0.0/16" could not be parsed, invalid CIDR address: 10.256.0.0/16"#,
            ),
            (
                "10.0.0.1/8",
                r#"CIDR "10.0.0.1/8" is not aligned to a CIDR block, ip: "10.0.0.1" network: "10.0.0.0/8""#,
            ),
            ("", r#"CIDR "" could not be parsed, invalid CIDR address: "#),
            (
                "fc00::1/7",
                r#"CIDR "fc00::1/7" is not aligned to a CIDR block, ip: "fc00::1" network: "fc00::/7""#,
            ),
        ] {
            assert_eq!(error(text), message);
        }
    }

    #[test]
    fn go_parse_rules() {
        for rejected in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/+8",
            "10.0.0.0/-1",
            "010.0.0.0/8",
            " 10.0.0.0/8",
            "10.0.0.0/8 ",
            "10.0.0/8",
            "10.0.0.0.0/8",
            "fe80::/129",
            "fe80::%eth0/64",
            "::ffff:010.0.0.0/104",
            "10.0.0.0/0008x",
        ] {
            assert!(
                Cidr::parse(rejected).is_err(),
                "{rejected} should be rejected"
            );
        }
        for accepted in [
            "10.0.0.0/08",
            "0.0.0.0/0",
            "FC00::/7",
            "::/0",
            "10.0.0.0/32",
            "1.2.3.4/32",
        ] {
            assert!(
                Cidr::parse(accepted).is_ok(),
                "{accepted} should be accepted"
            );
        }
    }

    #[test]
    fn family_follows_to4() {
        let mapped = Cidr::parse("::ffff:10.0.0.0/104").expect("mapped CIDR");
        assert_eq!(mapped.family(), Family::Ipv4);
        assert_eq!(mapped.network(), &v4(Ipv4Addr::new(10, 0, 0, 0), 8));
        assert_eq!(mapped.as_str(), "::ffff:10.0.0.0/104");
        assert_eq!(
            Cidr::parse("fc00::/7").map(|cidr| cidr.family()),
            Ok(Family::Ipv6)
        );
        assert_eq!(
            error("::ffff:10.0.0.0/8"),
            r#"CIDR "::ffff:10.0.0.0/8" is not aligned to a CIDR block, ip: "10.0.0.0" network: "::/8""#
        );
        let all_mapped = Cidr::parse("::ffff:0:0/96").expect("::ffff:0:0/96");
        assert_eq!(all_mapped.network(), &v4(Ipv4Addr::UNSPECIFIED, 0));
    }

    #[test]
    fn builtins_agree_with_parsing() {
        let link_local = Cidr::builtin("169.254.0.0/16", v4(Ipv4Addr::new(169, 254, 0, 0), 16));
        assert_eq!(Cidr::parse("169.254.0.0/16"), Ok(link_local));
        let v6 = Cidr::builtin(
            "fe80::/10",
            Network::V6(Ipv6Net::new_assert(
                Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0),
                10,
            )),
        );
        assert_eq!(Cidr::parse("fe80::/10"), Ok(v6));
    }

    #[test]
    fn containment() {
        let net = v4(Ipv4Addr::new(10, 0, 0, 0), 8);
        let contains =
            |ip: &str| net.contains(&ip.parse::<std::net::IpAddr>().expect("ip").to_canonical());
        assert!(contains("10.255.1.1"));
        assert!(contains("::ffff:10.1.1.1"));
        assert!(!contains("11.0.0.1"));
        assert!(!contains("fc00::1"));
        let all = v4(Ipv4Addr::UNSPECIFIED, 0);
        assert!(all.contains(&"1.2.3.4".parse::<std::net::IpAddr>().expect("ip")));
        assert!(net.contains(&v4(Ipv4Addr::new(10, 1, 0, 0), 16)));
        assert!(!net.contains(&v4(Ipv4Addr::new(0, 0, 0, 0), 0)));
    }
}
