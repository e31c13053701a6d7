//! CIDRs as upstream understands them: parsed by Go's `net.ParseCIDR`, classified by
//! `To4() == nil`, and written into rules exactly as the user spelled them.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

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

/// A network in its matching form: the address family's own bits and a prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Network {
    /// An IPv4 network.
    V4 {
        /// Network address (host bits zero).
        addr: Ipv4Addr,
        /// Prefix length, 0..=32.
        prefix: u8,
    },
    /// An IPv6 network.
    V6 {
        /// Network address (host bits zero).
        addr: Ipv6Addr,
        /// Prefix length, 0..=128.
        prefix: u8,
    },
}

impl Network {
    /// The IPv4 network `addr/prefix` with host bits cleared.
    pub fn v4(addr: Ipv4Addr, prefix: u8) -> Self {
        let prefix = prefix.min(32);
        Self::V4 {
            addr: Ipv4Addr::from_bits(addr.to_bits() & mask32(prefix)),
            prefix,
        }
    }

    /// The IPv6 network `addr/prefix` with host bits cleared.
    pub fn v6(addr: Ipv6Addr, prefix: u8) -> Self {
        let prefix = prefix.min(128);
        Self::V6 {
            addr: Ipv6Addr::from_bits(addr.to_bits() & mask128(prefix)),
            prefix,
        }
    }

    /// Whether `ip` lies in the network. IPv4-mapped IPv6 addresses match IPv4 networks.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self, normalize(ip)) {
            (Self::V4 { addr, prefix }, IpAddr::V4(ip)) => {
                ip.to_bits() & mask32(*prefix) == addr.to_bits()
            }
            (Self::V6 { addr, prefix }, IpAddr::V6(ip)) => {
                ip.to_bits() & mask128(*prefix) == addr.to_bits()
            }
            _ => false,
        }
    }

    /// Whether every address of `other` is in `self`.
    pub fn covers(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::V4 { prefix, .. },
                Self::V4 {
                    addr,
                    prefix: inner,
                },
            )
            | (
                Self::V6 { prefix, .. },
                Self::V4 {
                    addr,
                    prefix: inner,
                },
            ) if inner >= prefix => self.contains(IpAddr::V4(*addr)),
            (
                Self::V6 { prefix, .. },
                Self::V6 {
                    addr,
                    prefix: inner,
                },
            ) if inner >= prefix => self.contains(IpAddr::V6(*addr)),
            _ => false,
        }
    }

    /// The family of the network.
    pub const fn family(&self) -> Family {
        match self {
            Self::V4 { .. } => Family::Ipv4,
            Self::V6 { .. } => Family::Ipv6,
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4 { addr, prefix } => write!(formatter, "{addr}/{prefix}"),
            Self::V6 { addr, prefix } => write!(formatter, "{addr}/{prefix}"),
        }
    }
}

/// Turns IPv4-mapped IPv6 addresses into IPv4, as Go's `To4` does.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

const fn mask32(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix as u32)
    }
}

const fn mask128(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix as u32)
    }
}

/// A CIDR from a config file: the text as written, and what it means.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cidr {
    text: String,
    network: Network,
}

impl Cidr {
    /// Parses `text` with `net.ParseCIDR`'s rules and requires it to be aligned, as upstream's
    /// validation does. The error is upstream's message for that CIDR.
    pub fn parse(text: &str) -> Result<Self, CidrError> {
        let parsed = go_parse_cidr(text).ok_or_else(|| CidrError::Unparsable {
            cidr: text.to_owned(),
        })?;
        if parsed.ip != parsed.masked {
            return Err(CidrError::NotAligned {
                cidr: text.to_owned(),
                ip: go_ip_string(&parsed.ip),
                network: parsed.go_network_string(),
            });
        }
        let network = if let Some(v4) = parsed.ip_v4() {
            // An IPv4-mapped IPv6 CIDR keeps only the prefix bits beyond ::ffff:0:0/96.
            let prefix = if parsed.bits == 32 {
                parsed.prefix
            } else {
                parsed.prefix.saturating_sub(96)
            };
            Network::v4(v4, prefix)
        } else {
            Network::v6(Ipv6Addr::from(parsed.ip), parsed.prefix)
        };
        Ok(Self {
            text: text.to_owned(),
            network,
        })
    }

    /// A built-in CIDR (the link-local ranges) whose meaning is known without parsing.
    pub fn builtin(text: &'static str, network: Network) -> Self {
        Self {
            text: text.to_owned(),
            network,
        }
    }

    /// The CIDR exactly as written in the config.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// What the CIDR matches.
    pub const fn network(&self) -> &Network {
        &self.network
    }

    /// The family upstream files the CIDR under.
    pub const fn family(&self) -> Family {
        self.network.family()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.text)
    }
}

/// Why a CIDR was rejected; the messages are upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// `net.ParseCIDR` failed.
    #[error("CIDR {} could not be parsed, invalid CIDR address: {cidr}", super::go::quote(.cidr))]
    Unparsable {
        /// The CIDR as written.
        cidr: String,
    },
    /// The address has host bits set.
    #[error(
        "CIDR {} is not aligned to a CIDR block, ip: {} network: {}",
        super::go::quote(.cidr),
        super::go::quote(.ip),
        super::go::quote(.network)
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

/// The result of Go's `net.ParseCIDR`, in its 16-byte representation.
struct GoCidr {
    /// The address, IPv4 addresses in IPv4-mapped form.
    ip: [u8; 16],
    /// `ip` masked with the prefix.
    masked: [u8; 16],
    /// 32 for dotted-quad input, 128 for IPv6 syntax (even when IPv4-mapped).
    bits: u8,
    prefix: u8,
}

const V4_IN_V6_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

impl GoCidr {
    fn ip_v4(&self) -> Option<Ipv4Addr> {
        to4(&self.ip)
    }

    /// Go's `IPNet.String()` of the masked network. A masked address that is still
    /// IPv4-mapped can only come from a prefix of at least 96 bits, so the 4-byte form's prefix
    /// is the remainder.
    fn go_network_string(&self) -> String {
        match to4(&self.masked) {
            Some(v4) if self.bits == 32 => format!("{v4}/{}", self.prefix),
            Some(v4) => format!("{v4}/{}", self.prefix.saturating_sub(96)),
            None => format!("{}/{}", Ipv6Addr::from(self.masked), self.prefix),
        }
    }
}

fn to4(ip: &[u8; 16]) -> Option<Ipv4Addr> {
    (ip[..12] == V4_IN_V6_PREFIX).then(|| Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]))
}

/// Go's `net.IP.String()` for a 16-byte address.
fn go_ip_string(ip: &[u8; 16]) -> String {
    match to4(ip) {
        Some(v4) => v4.to_string(),
        None => Ipv6Addr::from(*ip).to_string(),
    }
}

/// `net.ParseCIDR` (Go 1.22+, via `netip.ParseAddr`): `None` where Go returns
/// `invalid CIDR address`.
fn go_parse_cidr(text: &str) -> Option<GoCidr> {
    let (addr, mask) = text.split_once('/')?;
    let (ip, bits) = if addr.contains(':') {
        (parse_ipv6(addr)?.octets(), 128)
    } else {
        (parse_ipv4(addr)?.to_ipv6_mapped().octets(), 32)
    };
    let prefix = parse_prefix(mask, bits)?;
    let mask_bits = if bits == 32 {
        mask128(prefix + 96)
    } else {
        mask128(prefix)
    };
    let masked = (u128::from_be_bytes(ip) & mask_bits).to_be_bytes();
    // Go masks a 4-byte-form address with a 4-byte mask, which keeps the ::ffff: prefix.
    let masked = if bits == 32 {
        with_v4_prefix(masked)
    } else {
        masked
    };
    Some(GoCidr {
        ip,
        masked,
        bits,
        prefix,
    })
}

fn with_v4_prefix(mut ip: [u8; 16]) -> [u8; 16] {
    ip[..12].copy_from_slice(&V4_IN_V6_PREFIX);
    ip
}

/// Go's `dtoi` on the prefix: decimal digits only (leading zeros allowed), at most `bits`.
fn parse_prefix(text: &str, bits: u8) -> Option<u8> {
    if text.is_empty() || text.len() > 8 || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let value: u32 = text.parse().ok()?;
    u8::try_from(value).ok().filter(|prefix| *prefix <= bits)
}

/// `netip.ParseAddr` for IPv4: four decimal fields, no leading zeros, each at most 255.
fn parse_ipv4(text: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut fields = text.split('.');
    for octet in &mut octets {
        let field = fields.next()?;
        if field.is_empty() || field.len() > 3 || !field.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        if field.len() > 1 && field.starts_with('0') {
            return None;
        }
        *octet = field.parse().ok()?;
    }
    fields.next().is_none().then_some(Ipv4Addr::from(octets))
}

/// `netip.ParseAddr` for IPv6 (no zones: `ParseCIDR` rejects them). The embedded IPv4 form is
/// checked with the same strict rules as plain IPv4.
fn parse_ipv6(text: &str) -> Option<Ipv6Addr> {
    if text.contains('%') {
        return None;
    }
    if let Some(last_colon) = text.rfind(':')
        && text[last_colon + 1..].contains('.')
    {
        parse_ipv4(&text[last_colon + 1..])?;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        match Cidr::parse(text) {
            Ok(cidr) => panic!("{text} parsed as {:?}", cidr.network()),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn upstream_validation_messages() {
        assert_eq!(
            error("abcdefg"),
            r#"CIDR "abcdefg" could not be parsed, invalid CIDR address: abcdefg"#
        );
        assert_eq!(
            error("10.256.0.0/16"),
            r#"CIDR "10.256.0.0/16" could not be parsed, invalid CIDR address: 10.256.0.0/16"#
        );
        assert_eq!(
            error("10.0.0.1/8"),
            r#"CIDR "10.0.0.1/8" is not aligned to a CIDR block, ip: "10.0.0.1" network: "10.0.0.0/8""#
        );
        assert_eq!(
            error(""),
            r#"CIDR "" could not be parsed, invalid CIDR address: "#
        );
        assert_eq!(
            error("fc00::1/7"),
            r#"CIDR "fc00::1/7" is not aligned to a CIDR block, ip: "fc00::1" network: "fc00::/7""#
        );
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
        assert_eq!(
            mapped.network(),
            &Network::v4(Ipv4Addr::new(10, 0, 0, 0), 8)
        );
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
        assert_eq!(all_mapped.network(), &Network::v4(Ipv4Addr::UNSPECIFIED, 0));
    }

    #[test]
    fn builtins_agree_with_parsing() {
        let link_local = Cidr::builtin(
            "169.254.0.0/16",
            Network::v4(Ipv4Addr::new(169, 254, 0, 0), 16),
        );
        assert_eq!(Cidr::parse("169.254.0.0/16"), Ok(link_local));
        let v6 = Cidr::builtin(
            "fe80::/10",
            Network::v6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0), 10),
        );
        assert_eq!(Cidr::parse("fe80::/10"), Ok(v6));
    }

    #[test]
    fn containment() {
        let net = Network::v4(Ipv4Addr::new(10, 0, 0, 0), 8);
        assert!(net.contains("10.255.1.1".parse().expect("ip")));
        assert!(net.contains("::ffff:10.1.1.1".parse().expect("ip")));
        assert!(!net.contains("11.0.0.1".parse().expect("ip")));
        assert!(!net.contains("fc00::1".parse().expect("ip")));
        let all = Network::v4(Ipv4Addr::UNSPECIFIED, 0);
        assert!(all.contains("1.2.3.4".parse().expect("ip")));
        assert!(net.covers(&Network::v4(Ipv4Addr::new(10, 1, 0, 0), 16)));
        assert!(!net.covers(&Network::v4(Ipv4Addr::new(0, 0, 0, 0), 0)));
    }
}
