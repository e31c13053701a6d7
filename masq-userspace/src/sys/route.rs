//! The node's routes: the routing tables as `/proc/self/net` lists them, read in one place for
//! everything that asks which interfaces traffic leaves by (`node::interfaces`) and which
//! networks sit behind the node's own devices (`ipsec`); and the kernel's own choice of a
//! source address, asked over rtnetlink.
//!
//! Both are the calling thread's network namespace's, as `/proc/self` is.

use std::{
    fs, io,
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use netlink_packet_core::{DecodeError, ParseableParametrized as _};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteMessage},
};

use super::netlink::{Family, NetlinkError, NetlinkSocket};

/// `RTF_*` flags of a route.
const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;
const RTF_REJECT: u32 = 0x200;
const RTF_LOCAL: u32 = 0x8000_0000;

/// One route: where it leads, through which interface, and its `RTF_*` flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// The interface the route sends traffic through.
    pub(crate) interface: String,
    /// The network it leads to (the default route is `0.0.0.0/0` or `::/0`).
    pub(crate) destination: IpNet,
    flags: u32,
}

impl Route {
    /// In use: up, and neither a rejecting route nor one of the local table's routes to the
    /// node's own addresses.
    pub(crate) const fn usable(&self) -> bool {
        self.flags & RTF_UP != 0 && self.flags & (RTF_REJECT | RTF_LOCAL) == 0
    }

    /// Towards a gateway (a next hop), or the default route.
    pub(crate) fn towards_a_gateway(&self) -> bool {
        self.flags & RTF_GATEWAY != 0 || self.destination.prefix_len() == 0
    }

    /// To a network on the interface's own link (no next hop).
    pub(crate) const fn direct(&self) -> bool {
        self.flags & RTF_GATEWAY == 0
    }
}

/// The IPv4 routes of the main table.
pub(crate) fn ipv4_routes() -> io::Result<Vec<Route>> {
    Ok(parse_v4(&fs::read_to_string("/proc/self/net/route")?))
}

/// The IPv6 routes of every table (`NotFound` when IPv6 is disabled in the kernel).
pub(crate) fn ipv6_routes() -> io::Result<Vec<Route>> {
    Ok(parse_v6(&fs::read_to_string("/proc/self/net/ipv6_route")?))
}

/// The routes of `/proc/net/route` (IPv4, main table): a header line, then `Iface Destination
/// Gateway Flags RefCnt Use Metric Mask ...`, addresses as the kernel's hex of the
/// network-order word. A line it cannot read is left out.
pub(crate) fn parse_v4(table: &str) -> Vec<Route> {
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
pub(crate) fn parse_v6(table: &str) -> Vec<Route> {
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

/// How long to wait for the kernel's choice of a source: it answers at once.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// The source address the kernel picks for `destination` leaving by interface `ifindex`
/// (`RTM_GETROUTE` with `RTA_OIF`, answered with `RTA_PREFSRC`, as `ip -6 route get
/// DESTINATION oif IFACE`); `None` when it has no route there. No packet is sent, and no
/// capability is needed.
pub(crate) fn kernel_ipv6_source(
    ifindex: u32,
    destination: Ipv6Addr,
) -> Result<Option<Ipv6Addr>, NetlinkError> {
    let mut socket = NetlinkSocket::open(Family::Route, REPLY_TIMEOUT)?;
    let request = || {
        let mut route = RouteMessage::default();
        route.header.address_family = AddressFamily::Inet6;
        // A host route: the kernel's choice for this one destination.
        route.header.destination_prefix_length = 128;
        route.attributes = vec![
            RouteAttribute::Destination(RouteAddress::Inet6(destination)),
            RouteAttribute::Oif(ifindex),
        ];
        RouteNetlinkMessage::GetRoute(route)
    };
    match socket.query(request, preferred_source_in) {
        Ok(sources) => Ok(sources.into_iter().next()),
        // No route by that interface.
        Err(NetlinkError::Refused { .. }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// `RTA_PREFSRC` of an `RTM_NEWROUTE` answer; `None` for another message or a route without
/// one.
fn preferred_source_in(kind: u16, payload: &[u8]) -> Result<Option<Ipv6Addr>, DecodeError> {
    let RouteNetlinkMessage::NewRoute(route) =
        RouteNetlinkMessage::parse_with_param(payload, kind)?
    else {
        return Ok(None);
    };
    Ok(route
        .attributes
        .into_iter()
        .find_map(|attribute| match attribute {
            RouteAttribute::PrefSource(RouteAddress::Inet6(source)) => Some(source),
            _ => None,
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v6(text: &str) -> Ipv6Addr {
        text.parse().expect("IPv6 address")
    }

    /// An `RTM_NEWROUTE` answer as the kernel writes it: rtmsg, RTA_TABLE, RTA_DST, RTA_OIF,
    /// RTA_PREFSRC.
    #[test]
    fn the_kernel_route_answer_names_the_source() {
        use netlink_packet_core::Emitable as _;
        const RTM_NEWROUTE: u16 = 24;
        let mut route = RouteMessage::default();
        route.header.address_family = AddressFamily::Inet6;
        route.header.destination_prefix_length = 128;
        route.header.table = 254;
        route.attributes = vec![
            RouteAttribute::Table(254),
            RouteAttribute::Destination(RouteAddress::Inet6(v6("2000::1"))),
            RouteAttribute::Oif(2),
            RouteAttribute::PrefSource(RouteAddress::Inet6(v6("2001:db8::7"))),
        ];
        let mut reply = vec![0; route.buffer_len()];
        route.emit(&mut reply);
        assert_eq!(
            preferred_source_in(RTM_NEWROUTE, &reply).ok(),
            Some(Some(v6("2001:db8::7")))
        );
        // A route without a preferred source, and a cut answer: no address, no panic.
        route.attributes.pop();
        let mut bare = vec![0; route.buffer_len()];
        route.emit(&mut bare);
        assert_eq!(preferred_source_in(RTM_NEWROUTE, &bare).ok(), Some(None));
        for cut in 0..reply.len() {
            let read = preferred_source_in(RTM_NEWROUTE, &reply[..cut]);
            assert!(!matches!(read, Ok(Some(source)) if source != v6("2001:db8::7")));
        }
    }

    #[test]
    fn this_namespace_has_a_route_table() {
        assert!(ipv4_routes().is_ok());
    }
}
