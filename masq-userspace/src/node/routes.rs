//! The node's routes as `/proc` lists them, read in one place for everything that asks which
//! interfaces traffic leaves by (`interfaces`) and which networks sit behind the node's own
//! devices (`ipsec`).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// `RTF_*` flags of a route.
const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;
const RTF_REJECT: u32 = 0x200;
const RTF_LOCAL: u32 = 0x8000_0000;

/// One route: where it leads, through which interface, and its `RTF_*` flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The interface the route sends traffic through.
    pub interface: String,
    /// The network it leads to (the default route is `0.0.0.0/0` or `::/0`).
    pub destination: IpNet,
    flags: u32,
}

impl Route {
    /// In use: up, and neither a rejecting route nor one of the local table's routes to the
    /// node's own addresses.
    pub const fn usable(&self) -> bool {
        self.flags & RTF_UP != 0 && self.flags & (RTF_REJECT | RTF_LOCAL) == 0
    }

    /// Towards a gateway (a next hop), or the default route.
    pub fn towards_a_gateway(&self) -> bool {
        self.flags & RTF_GATEWAY != 0 || self.destination.prefix_len() == 0
    }

    /// To a network on the interface's own link (no next hop).
    pub const fn direct(&self) -> bool {
        self.flags & RTF_GATEWAY == 0
    }
}

/// The routes of `/proc/net/route` (IPv4, main table): a header line, then `Iface Destination
/// Gateway Flags RefCnt Use Metric Mask ...`, addresses as the kernel's hex of the
/// network-order word. A line it cannot read is left out.
pub fn parse_v4(table: &str) -> Vec<Route> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let hex = |at: usize| u32::from_str_radix(fields.get(at)?, 16).ok();
            let (destination, flags, mask) = (hex(1)?, hex(3)?, hex(7)?);
            let prefix = u32::from_be_bytes(mask.to_ne_bytes()).leading_ones();
            let destination = Ipv4Net::new(
                Ipv4Addr::from(destination.to_ne_bytes()),
                u8::try_from(prefix).ok()?,
            )
            .ok()?;
            Some(Route {
                interface: (*fields.first()?).to_owned(),
                destination: IpNet::V4(destination),
                flags,
            })
        })
        .collect()
}

/// The routes of `/proc/net/ipv6_route` (every table): `destination prefix_len source
/// prefix_len next_hop metric refcnt use flags device`, hex fields without a header line.
pub fn parse_v6(table: &str) -> Vec<Route> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let destination = Ipv6Addr::from(u128::from_str_radix(fields.first()?, 16).ok()?);
            let prefix = u8::from_str_radix(fields.get(1)?, 16).ok()?;
            Some(Route {
                interface: (*fields.get(9)?).to_owned(),
                destination: IpNet::V6(Ipv6Net::new(destination, prefix).ok()?),
                flags: u32::from_str_radix(fields.get(8)?, 16).ok()?,
            })
        })
        .collect()
}
