//! Finding the uplink and the node address when the operator does not name them.

use std::{fs, net::Ipv4Addr};

use nix::{ifaddrs::getifaddrs, net::if_::if_nametoindex};

/// Why the uplink or its address could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    /// No default IPv4 route.
    #[error("no default IPv4 route to take the uplink from; pass --interface")]
    NoDefaultRoute,
    /// The routing table could not be read.
    #[error("reading /proc/net/route: {0}")]
    RouteTable(#[source] std::io::Error),
    /// The interface does not exist.
    #[error("interface {0} does not exist")]
    NoSuchInterface(String),
    /// The interface has no IPv4 address.
    #[error("interface {0} has no IPv4 address to masquerade to; pass --node-ip")]
    NoAddress(String),
    /// Listing addresses failed.
    #[error("listing interface addresses: {0}")]
    Addresses(#[source] nix::Error),
}

/// The interface of the default IPv4 route with the lowest metric.
pub fn default_route_interface() -> Result<String, InterfaceError> {
    let table = fs::read_to_string("/proc/net/route").map_err(InterfaceError::RouteTable)?;
    default_route_in(&table).ok_or(InterfaceError::NoDefaultRoute)
}

/// Parses `/proc/net/route`: `Iface Destination Gateway Flags RefCnt Use Metric Mask ...`.
fn default_route_in(table: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (interface, destination, flags, metric, mask) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(3)?,
                fields.get(6)?,
                fields.get(7)?,
            );
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let default = *destination == "00000000" && *mask == "00000000" && flags & RTF_UP != 0;
            default.then(|| {
                (
                    metric.parse::<u32>().unwrap_or(u32::MAX),
                    (*interface).to_owned(),
                )
            })
        })
        .min()
        .map(|(_, interface)| interface)
}

/// The interface's index, or an error naming it.
pub fn interface_index(interface: &str) -> Result<u32, InterfaceError> {
    if_nametoindex(interface).map_err(|_| InterfaceError::NoSuchInterface(interface.to_owned()))
}

/// The primary IPv4 address of `interface` (the first the kernel lists).
pub fn primary_ipv4(interface: &str) -> Result<Ipv4Addr, InterfaceError> {
    interface_index(interface)?;
    getifaddrs()
        .map_err(InterfaceError::Addresses)?
        .filter(|address| address.interface_name == interface)
        .find_map(|address| {
            address.address.and_then(|sockaddr| {
                sockaddr
                    .as_sockaddr_in()
                    .map(nix::sys::socket::SockaddrIn::ip)
            })
        })
        .ok_or_else(|| InterfaceError::NoAddress(interface.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
eth0\t00000000\t010011AC\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";

    #[test]
    fn the_lowest_metric_default_route_wins() {
        assert_eq!(default_route_in(TABLE).as_deref(), Some("eth0"));
        let no_default = TABLE
            .lines()
            .filter(|line| !line.contains("\t00000000\t0"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(default_route_in(&no_default), None);
    }

    #[test]
    fn loopback_has_an_address() {
        assert_eq!(primary_ipv4("lo").ok(), Some(Ipv4Addr::LOCALHOST));
        assert!(matches!(
            primary_ipv4("masq-nonexistent0"),
            Err(InterfaceError::NoSuchInterface(_))
        ));
    }
}
