//! Go's `net.ParseCIDR` and the `net.IP` and `net.IPNet` strings upstream's messages print.
//!
//! Go's address syntax differs from Rust's parsers: it refuses IPv4 fields with leading zeros
//! (also inside IPv6), zones, and signs in the prefix, and accepts leading zeros in the prefix.
//! An IPv4-mapped IPv6 address is IPv4 to Go (`To4` succeeds), which decides the family.

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// `::ffff:0:0/96`, where IPv4 addresses live in Go's 16-byte form.
const V4_IN_V6: u128 = 0xffff << 32;

/// What `net.ParseCIDR` returns: the address and the network, in Go's 16-byte form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoCidr {
    /// The address, IPv4 addresses in IPv4-mapped form.
    ip: u128,
    /// `ip` masked with the prefix (Go masks IPv4 input with a 4-byte mask, which keeps the
    /// IPv4-mapped prefix).
    masked: u128,
    /// 32 for dotted-quad input, 128 for IPv6 syntax (even when IPv4-mapped).
    bits: u8,
    prefix: u8,
}

fn to4(ip: u128) -> Option<Ipv4Addr> {
    (ip >> 32 == V4_IN_V6 >> 32).then(|| Ipv4Addr::from_bits(ip as u32))
}

impl GoCidr {
    /// `ip.Equal(ipnet.IP)`: the address has no host bits set.
    pub fn is_aligned(&self) -> bool {
        self.ip == self.masked
    }

    /// Go's `IP.String()` of the address.
    pub fn ip_string(&self) -> String {
        to4(self.ip).map_or_else(|| Ipv6Addr::from(self.ip).to_string(), |v4| v4.to_string())
    }

    /// Go's `IPNet.String()` of the network. A masked address that is still IPv4-mapped can
    /// only come from a prefix of at least 96 bits, so the 4-byte form's prefix is the rest.
    pub fn network_string(&self) -> String {
        match to4(self.masked) {
            Some(v4) if self.bits == 32 => format!("{v4}/{}", self.prefix),
            Some(v4) => format!("{v4}/{}", self.prefix.saturating_sub(96)),
            None => format!("{}/{}", Ipv6Addr::from(self.masked), self.prefix),
        }
    }

    /// The addresses the CIDR matches, in the family Go files it under (`To4`): an
    /// IPv4-mapped network keeps only the prefix bits beyond `::ffff:0:0/96`.
    pub fn network(&self) -> IpNet {
        let v6 = || {
            Ipv6Net::new(Ipv6Addr::from(self.masked), self.prefix)
                .map_or(IpNet::V6(Ipv6Net::default()), |net| IpNet::V6(net.trunc()))
        };
        match to4(self.masked) {
            Some(v4) => {
                let prefix = if self.bits == 32 {
                    self.prefix
                } else {
                    self.prefix.saturating_sub(96)
                };
                Ipv4Net::new(v4, prefix).map_or_else(|_| v6(), |net| IpNet::V4(net.trunc()))
            }
            None => v6(),
        }
    }
}

/// `net.ParseCIDR` (Go 1.22+, via `netip.ParseAddr`): `None` where Go returns
/// `invalid CIDR address`.
pub fn parse_cidr(text: &str) -> Option<GoCidr> {
    // Byte searches: the CIDRs of a large config are parsed by the ten thousand. The prefix is
    // short, so the slash is sought from the end; a text with two is refused either way (a
    // slash is neither a digit of the prefix nor part of an address).
    let slash = text.bytes().rposition(|byte| byte == b'/')?;
    let (addr, mask) = (&text[..slash], &text.as_bytes()[slash + 1..]);
    // No IPv4 address holds a colon, and an address without one is not IPv6.
    let (ip, bits) = match parse_ipv4(addr.as_bytes()) {
        Some(v4) => (V4_IN_V6 | u128::from(v4.to_bits()), 32),
        None if addr.contains(':') => (parse_ipv6(addr)?.to_bits(), 128),
        None => return None,
    };
    let prefix = parse_prefix(mask, bits)?;
    // An IPv4 prefix masks the last 32 bits only: the IPv4-mapped prefix stays.
    let full = if bits == 32 { prefix + 96 } else { prefix };
    let masked = ip & u128::MAX.checked_shl(128 - u32::from(full)).unwrap_or(0);
    Some(GoCidr {
        ip,
        masked,
        bits,
        prefix,
    })
}

/// Go's `dtoi` on the prefix: decimal digits only (leading zeros allowed, any number of them),
/// at most `bits`. `dtoi` gives up once the value reaches 0xFFFFFF; digits only make it grow,
/// so stopping as soon as it exceeds `bits` decides the same.
fn parse_prefix(text: &[u8], bits: u8) -> Option<u8> {
    let value = text.iter().try_fold(0u32, |value, &digit| {
        let value = value * 10 + u32::from(digit.checked_sub(b'0').filter(|d| *d <= 9)?);
        (value <= u32::from(bits)).then_some(value)
    });
    u8::try_from(value.filter(|_| !text.is_empty())?).ok()
}

/// `netip.ParseAddr` for IPv4: four decimal fields, no leading zeros, each at most 255.
fn parse_ipv4(text: &[u8]) -> Option<Ipv4Addr> {
    let (mut octets, mut field, mut value, mut digits) = ([0u8; 4], 0, 0u32, 0);
    for &byte in text {
        match byte {
            b'.' => {
                *octets.get_mut(field)? = u8::try_from(value).ok().filter(|_| digits > 0)?;
                (field, value, digits) = (field + 1, 0, 0);
            }
            // At most three digits, and none after a leading zero.
            b'0'..=b'9' if digits < 3 && (digits == 0 || value != 0) => {
                (value, digits) = (value * 10 + u32::from(byte - b'0'), digits + 1);
            }
            _ => return None,
        }
    }
    *octets.get_mut(3).filter(|_| field == 3)? = u8::try_from(value).ok().filter(|_| digits > 0)?;
    Some(Ipv4Addr::from(octets))
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
        parse_ipv4(&text.as_bytes()[last_colon + 1..])?;
    }
    text.parse().ok()
}
