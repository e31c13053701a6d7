//! Finding the interfaces traffic leaves the node by and the address each masquerades to.
//!
//! What the kernel says about the node's interfaces, addresses and routes is read by
//! [`crate::sys::link`] and [`crate::sys::route`], in the calling thread's network namespace;
//! this module decides from it which interfaces are uplinks and what their addresses are.

use std::{
    collections::BTreeSet,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use masq_common::layout::{LINK_ETHERNET, LINK_IP};

pub use crate::sys::link::Ipv6AddressState;
use crate::sys::{
    link::{self, LinkAddresses, LinkInspector},
    route::{self, Route},
};

/// Why the uplink or its address could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    /// The routing table could not be read.
    #[error("reading /proc/net/route")]
    RouteTable(#[source] io::Error),
    /// The IPv6 routing table could not be read.
    #[error("reading /proc/net/ipv6_route")]
    RouteTableV6(#[source] io::Error),
    /// The interface does not exist.
    #[error("interface {0} does not exist")]
    NoSuchInterface(String),
    /// The interface has no IPv4 address.
    #[error("interface {0} has no IPv4 address to masquerade to; pass --node-ip")]
    NoAddress(String),
    /// The interface has neither an IPv4 address nor a global IPv6 one (with `--enable-ipv6`).
    #[error(
        "interface {0} has neither an IPv4 address nor a global IPv6 address to masquerade to; \
         pass --node-ip for IPv4"
    )]
    NoAddressAtAll(String),
    /// Listing addresses failed.
    #[error("listing interface addresses")]
    Addresses(#[source] nix::Error),
    /// The interface's frames start with a link-layer header the datapath does not parse.
    #[error(
        "interface {name} has link type {link_type}, whose frames masq cannot parse; masq \
         translates on Ethernet devices and on devices without a link-layer header (tun, \
         WireGuard, IPIP and SIT tunnels, raw-IP interfaces)"
    )]
    UnsupportedLink {
        /// The interface.
        name: String,
        /// Its `ARPHRD_*` type.
        link_type: u16,
    },
    /// An ioctl on the interface failed.
    #[error("inspecting interface {name}")]
    Inspect {
        /// The interface.
        name: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
}

/// `ARPHRD_ETHER`: the link type of Ethernet devices (veth, bridges, bonds, VLANs and NICs).
pub const ARPHRD_ETHER: u16 = 1;

/// The `LINK_*` of an interface of link type `link_type` (`ARPHRD_*`): how the datapath finds
/// the IP header in its frames, or `None` where it cannot. Devices without a link-layer header
/// hand tc the IP packet itself: tun (`ARPHRD_NONE`, as WireGuard), raw-IP interfaces
/// (`ARPHRD_RAWIP`), IPv4-in-IPv4 and IPv6 tunnels (`ARPHRD_TUNNEL`, `ARPHRD_TUNNEL6`) and SIT.
/// GRE devices may carry a header of their own, and others (InfiniBand, PPP over hardware
/// framing) another layout: MASQUERADE translates there, masq refuses them by name.
pub const fn link_of(link_type: u16) -> Option<u8> {
    const ARPHRD_RAWIP: u16 = 519;
    const ARPHRD_TUNNEL: u16 = 768;
    const ARPHRD_TUNNEL6: u16 = 769;
    const ARPHRD_SIT: u16 = 776;
    const ARPHRD_NONE: u16 = 0xfffe;
    match link_type {
        ARPHRD_ETHER => Some(LINK_ETHERNET),
        ARPHRD_NONE | ARPHRD_RAWIP | ARPHRD_TUNNEL | ARPHRD_TUNNEL6 | ARPHRD_SIT => Some(LINK_IP),
        _ => None,
    }
}

/// One interface of the node as the uplink choice sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetInterface {
    /// Its name.
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Administratively up.
    pub up: bool,
    /// The loopback device.
    pub loopback: bool,
    /// Its `ARPHRD_*` link type.
    pub link_type: u16,
    /// Backed by hardware (the driver reports a bus), as a NIC is and a veth is not.
    pub physical: bool,
    /// Its IPv4 addresses usable as a source towards other hosts, primary first.
    pub global_ipv4: Vec<Ipv4Addr>,
    /// Whether it has an IPv6 address of global scope (not loopback, link-local, multicast or
    /// unspecified), whatever its state: what makes it an IPv6 uplink candidate.
    pub global_ipv6: bool,
}

/// Whether an address can be a source towards other hosts (what MASQUERADE would pick).
fn is_global(address: Ipv4Addr) -> bool {
    !(address.is_loopback()
        || address.is_link_local()
        || address.is_unspecified()
        || address.is_multicast()
        || address.is_broadcast())
}

/// Whether an IPv6 address has global scope: a source towards other networks.
fn is_global_v6(address: Ipv6Addr) -> bool {
    !(address.is_loopback()
        || address.is_unspecified()
        || address.is_multicast()
        || address.is_unicast_link_local())
}

/// Every interface of the namespace, in index order.
pub fn interfaces() -> Result<Vec<NetInterface>, InterfaceError> {
    let links = link::addresses().map_err(InterfaceError::Addresses)?;
    let inspector = LinkInspector::open().map_err(|source| InterfaceError::Inspect {
        name: String::new(),
        source,
    })?;
    let mut interfaces = Vec::new();
    for LinkAddresses {
        name,
        up,
        loopback,
        ipv4,
        ipv6,
    } in links
    {
        // An interface that vanished since the listing is simply not there any more.
        let Some(index) = link::index(&name) else {
            continue;
        };
        let link_type = inspector
            .link_type(&name)
            .map_err(|source| InterfaceError::Inspect {
                name: name.clone(),
                source,
            })?;
        interfaces.push(NetInterface {
            up,
            loopback,
            physical: is_physical(&inspector, &name),
            link_type,
            index,
            name,
            global_ipv4: ipv4
                .into_iter()
                .filter(|&address| is_global(address))
                .collect(),
            global_ipv6: ipv6.into_iter().any(is_global_v6),
        });
    }
    interfaces.sort_by_key(|interface| interface.index);
    Ok(interfaces)
}

/// Whether the interface is backed by hardware: its driver reports a bus address, as NICs do.
/// Virtual devices (veth, bridge, bond, vxlan) report none or do not answer, and some fill in a
/// placeholder rather than leaving it empty.
fn is_physical(inspector: &LinkInspector, name: &str) -> bool {
    inspector
        .driver_bus(name)
        .is_some_and(|bus| !matches!(bus.as_str(), "N/A" | "tap" | ""))
}

/// The interface named `name`, or an error saying it does not exist.
pub fn interface(name: &str) -> Result<NetInterface, InterfaceError> {
    interface_index(name)?;
    interfaces()?
        .into_iter()
        .find(|interface| interface.name == name)
        .ok_or_else(|| InterfaceError::NoSuchInterface(name.to_owned()))
}

/// The interfaces of the node's routes towards a gateway (the default route included: the ones
/// traffic leaves the node by), per family; and
/// the interfaces any route goes through, which is what makes a device without a link-layer
/// header (a tunnel, a VPN) an uplink: its routes have no gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gateways {
    /// Interfaces of IPv4 routes towards a gateway (the default route included).
    pub ipv4: BTreeSet<String>,
    /// Interfaces of IPv6 routes towards a gateway (the default route included); empty when
    /// IPv6 is not translated, so IPv6 routes then choose nothing.
    pub ipv6: BTreeSet<String>,
    /// Interfaces of any IPv4 route.
    pub routed_ipv4: BTreeSet<String>,
    /// Interfaces of any IPv6 route; empty when IPv6 is not translated.
    pub routed_ipv6: BTreeSet<String>,
}

impl Gateways {
    /// Reads both routing tables (the IPv6 one only when `ipv6`: IPv6 is translated).
    pub fn read(ipv6: bool) -> Result<Self, InterfaceError> {
        let routes = route::ipv4_routes().map_err(InterfaceError::RouteTable)?;
        let routes_v6 = if ipv6 {
            match route::ipv6_routes() {
                Ok(routes) => routes,
                Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(error) => return Err(InterfaceError::RouteTableV6(error)),
            }
        } else {
            Vec::new()
        };
        let (ipv4, routed_ipv4) = gateway_and_routed(&routes);
        let (ipv6, routed_ipv6) = gateway_and_routed(&routes_v6);
        Ok(Self {
            ipv4,
            ipv6,
            routed_ipv4,
            routed_ipv6,
        })
    }
}

/// The interfaces of a table's routes towards a gateway, and of all its routes, from one parse.
/// Every IPv6 table is listed, so the local table's routes (to the node's own addresses) and
/// rejecting routes (an unreachable default on `lo`) are told apart by their flags.
fn gateway_and_routed(routes: &[Route]) -> (BTreeSet<String>, BTreeSet<String>) {
    let gateway = interfaces_of(routes.iter(), Route::towards_a_gateway);
    let routed = interfaces_of(routes.iter(), |_| true);
    (gateway, routed)
}

/// The interfaces of the usable routes among `routes` that `wanted` picks (never loopback's).
fn interfaces_of<'route>(
    routes: impl Iterator<Item = &'route Route>,
    wanted: impl Fn(&Route) -> bool,
) -> BTreeSet<String> {
    routes
        .filter(|route| route.usable() && route.interface != "lo" && wanted(route))
        .map(|route| route.interface.clone())
        .collect()
}

/// The interfaces masq translates on when none are named: up, with an address other hosts can
/// answer to, and, in the same family:
/// * an Ethernet device either backed by hardware or carrying routes towards a gateway. That
///   takes every NIC and the interface of the default route, and leaves out pod veths and pod
///   bridges (no hardware, only routes to directly attached pods) and loopback;
/// * a device without a link-layer header (a tunnel, WireGuard, tun: see [`link_of`]) that any
///   route goes through: its routes have no gateway, and pods never sit behind one.
///
/// An interface with a global IPv6 address and IPv6 routes (`gateways.ipv6`, read only with
/// `--enable-ipv6`) is an uplink without any IPv4 address: the uplink of an IPv6-only node.
pub fn uplink_candidates(interfaces: &[NetInterface], gateways: &Gateways) -> Vec<NetInterface> {
    interfaces
        .iter()
        .filter(|interface| {
            let name = &interface.name;
            let (ipv4_routes, ipv6_routes) = match link_of(interface.link_type) {
                Some(LINK_ETHERNET) => (
                    interface.physical || gateways.ipv4.contains(name),
                    interface.physical || gateways.ipv6.contains(name),
                ),
                Some(_) => (
                    gateways.routed_ipv4.contains(name),
                    gateways.routed_ipv6.contains(name),
                ),
                None => (false, false),
            };
            let ipv4 = !interface.global_ipv4.is_empty() && ipv4_routes;
            let ipv6 = interface.global_ipv6 && ipv6_routes;
            interface.up && !interface.loopback && (ipv4 || ipv6)
        })
        .cloned()
        .collect()
}

/// The interface's index, or an error naming it.
pub fn interface_index(interface: &str) -> Result<u32, InterfaceError> {
    link::index(interface).ok_or_else(|| InterfaceError::NoSuchInterface(interface.to_owned()))
}

/// The primary IPv4 address of `interface` (the first the kernel lists).
pub fn primary_ipv4(interface: &str) -> Result<Ipv4Addr, InterfaceError> {
    interface_index(interface)?;
    addresses_of(interface)?
        .ipv4
        .into_iter()
        .next()
        .ok_or_else(|| InterfaceError::NoAddress(interface.to_owned()))
}

/// Whether `address` is one of `interface`'s addresses, whatever its state (an IPv6 address
/// past its preferred lifetime, deprecated, is still the interface's: connections using it carry
/// on).
pub fn has_address(interface: &str, address: IpAddr) -> Result<bool, InterfaceError> {
    Ok(match address {
        IpAddr::V4(address) => addresses_of(interface)?.ipv4.contains(&address),
        IpAddr::V6(address) => link::ipv6_address_states(interface)
            .iter()
            .any(|state| state.address == address),
    })
}

/// The addresses of `interface`, each family's in the order the kernel lists them.
fn addresses_of(interface: &str) -> Result<LinkAddresses, InterfaceError> {
    link::addresses_of(interface).map_err(InterfaceError::Addresses)
}

/// The address IPv6 traffic leaving by an interface is masqueraded to when the kernel routes no
/// global destination by it: the first usable global address in the interface's own order
/// (`listed`, newest first, the order in which the kernel's source selection breaks ties),
/// else the lowest usable one. `None` when it has none.
pub fn choose_snat_ipv6(listed: &[Ipv6Addr], states: &[Ipv6AddressState]) -> Option<Ipv6Addr> {
    let usable: BTreeSet<Ipv6Addr> = states
        .iter()
        .filter(|state| state.usable_as_source())
        .map(|state| state.address)
        .collect();
    listed
        .iter()
        .copied()
        .find(|address| usable.contains(address))
        .or_else(|| usable.first().copied())
}

/// The global IPv6 address masqueraded IPv6 traffic leaving by `interface` gets, if it has one
/// the kernel would use as a source: the kernel's own choice for a global destination by that
/// interface (`ip -6 route get 2000::1 oif IFACE`) when it routes one there, else see
/// [`choose_snat_ipv6`].
pub fn snat_ipv6(interface: &str) -> Result<Option<Ipv6Addr>, InterfaceError> {
    // No IPv6 on the node (disabled in the kernel) reads as no address.
    let states = link::ipv6_address_states(interface);
    if states.is_empty() {
        return Ok(None);
    }
    let usable = |address: &Ipv6Addr| {
        states
            .iter()
            .any(|state| state.address == *address && state.usable_as_source())
    };
    let kernel_choice = interface_index(interface).ok().and_then(|ifindex| {
        route::kernel_ipv6_source(ifindex, GLOBAL_PROBE)
            .ok()
            .flatten()
    });
    if let Some(source) = kernel_choice.filter(usable) {
        return Ok(Some(source));
    }
    let listed = addresses_of(interface)?.ipv6;
    Ok(choose_snat_ipv6(&listed, &states))
}

/// A global unicast destination (2000::/3) to ask the kernel's source choice for: no packet is
/// sent to it.
const GLOBAL_PROBE: Ipv6Addr = Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 1);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::link::tests::IF_INET6;

    fn gateway_interfaces_in(table: &str) -> BTreeSet<String> {
        gateway_and_routed(&route::parse_v4(table)).0
    }

    fn gateway_interfaces_v6_in(table: &str) -> BTreeSet<String> {
        gateway_and_routed(&route::parse_v6(table)).0
    }

    fn routed_interfaces_in(table: &str) -> BTreeSet<String> {
        gateway_and_routed(&route::parse_v4(table)).1
    }

    const TABLE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
eth0\t00000000\t010011AC\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
eth0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";

    #[test]
    fn gateway_routes_and_the_default_route_mark_uplinks() {
        let table = format!(
            "{TABLE}vpod1\t0001F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
             up1\t8071CB00\t7E71CBC0\t0003\t0\t0\t0\t80FFFFFF\t0\t0\t0\n"
        );
        let uplinks = gateway_interfaces_in(&table);
        assert_eq!(
            uplinks.into_iter().collect::<Vec<_>>(),
            ["eth0", "eth1", "up1"]
        );
    }

    fn candidate(name: &str, physical: bool, addresses: &[Ipv4Addr]) -> NetInterface {
        NetInterface {
            name: name.to_owned(),
            index: 2,
            up: true,
            loopback: false,
            link_type: ARPHRD_ETHER,
            physical,
            global_ipv4: addresses.to_vec(),
            global_ipv6: false,
        }
    }

    /// This machine's table, with a gateway route and a dev-only default added: every table is
    /// listed, the local table's routes and the unreachable default on `lo` too.
    const IPV6_ROUTE: &str = "\
fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0
20010db8000900000000000000000000 30 00000000000000000000000000000000 00 20010db8000000000000000000000001 00000400 00000001 00000000 00000003      up1
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 00000800 00000001 00000000 00000001      up2
00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000004 00000000 80200001     eth0
20010db8000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000004 00000000 80200001    vpod1
ff000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000003 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
20010db800ab00000000000000000005 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000400 00000001 00000000 00000001    vpod1
";

    #[test]
    fn ipv6_gateway_routes_and_default_routes_mark_uplinks() {
        // eth0: the default route via a gateway; up1: a route via a gateway; up2: a default
        // route without one. Not lo's unreachable default, not vpod1's local and host routes.
        assert_eq!(
            gateway_interfaces_v6_in(IPV6_ROUTE)
                .into_iter()
                .collect::<Vec<_>>(),
            ["eth0", "up1", "up2"]
        );
        assert!(gateway_interfaces_v6_in("").is_empty());
        assert!(gateway_interfaces_v6_in("garbage\n00 00\n").is_empty());
    }

    #[test]
    fn an_ipv6_only_interface_is_an_uplink_only_with_ipv6_routes() {
        let mut ipv6_only = candidate("eth0", false, &[]);
        ipv6_only.global_ipv6 = true;
        let mut pod_bridge = candidate("cni0", false, &[]);
        pod_bridge.global_ipv6 = true;
        let mut nic = candidate("ens5", true, &[]);
        nic.global_ipv6 = true;
        let all = [ipv6_only, pod_bridge, nic, candidate("eth1", false, &[])];
        let names = |gateways: &Gateways| -> Vec<String> {
            uplink_candidates(&all, gateways)
                .into_iter()
                .map(|interface| interface.name)
                .collect()
        };
        let mut gateways = Gateways {
            ipv4: ["eth0".to_owned(), "eth1".to_owned()].into(),
            ..Gateways::default()
        };
        // An IPv4 route does not make an interface without IPv4 an uplink; a NIC with a global
        // IPv6 address is one.
        assert_eq!(names(&gateways), ["ens5"]);
        gateways.ipv6 = gateway_interfaces_v6_in(IPV6_ROUTE);
        assert_eq!(names(&gateways), ["eth0", "ens5"]);
    }

    /// Issue 25, point 2: a tun or WireGuard device that routes use was refused when named and
    /// skipped in auto mode, so pods' traffic through it left untranslated. A device without a
    /// link-layer header is an uplink when any route goes through it (its routes have no
    /// gateway); an Ethernet device still needs hardware or a gateway route, and other link
    /// types are never chosen.
    #[test]
    fn pod_veths_loopback_and_unroutable_devices_are_not_uplinks() {
        let address = [Ipv4Addr::new(192, 0, 2, 1)];
        let routed: BTreeSet<String> = ["veth-routed".to_owned()].into();
        let l3 = |name: &str, link_type: u16| {
            let mut device = candidate(name, false, &address);
            device.link_type = link_type;
            device
        };
        let mut down = candidate("eth2", true, &address);
        down.up = false;
        let mut lo = candidate("lo", false, &[Ipv4Addr::LOCALHOST]);
        lo.loopback = true;
        let all = [
            candidate("eth0", true, &address),
            candidate("veth-routed", false, &address),
            candidate("vpod1", false, &[Ipv4Addr::new(10, 244, 1, 1)]),
            candidate("eth1", true, &[]),
            l3("tun0", 0xfffe),
            l3("wg0", 0xfffe),
            l3("ib0", 32),
            down,
            lo,
        ];
        let gateways = Gateways {
            ipv4: routed,
            ipv6: ["eth1".to_owned()].into(),
            // Routes through tun0 (none has a gateway), and through the InfiniBand device,
            // whose frames masq cannot parse; wg0 carries none.
            routed_ipv4: ["tun0".to_owned(), "ib0".to_owned(), "vpod1".to_owned()].into(),
            routed_ipv6: BTreeSet::new(),
        };
        let chosen: Vec<String> = uplink_candidates(&all, &gateways)
            .into_iter()
            .map(|interface| interface.name)
            .collect();
        assert_eq!(chosen, ["eth0", "veth-routed", "tun0"]);
        assert_eq!(link_of(0xfffe), Some(LINK_IP));
        assert_eq!(link_of(ARPHRD_ETHER), Some(LINK_ETHERNET));
        assert_eq!(link_of(32), None);
    }

    #[test]
    fn any_route_marks_the_interface_it_goes_through() {
        // A route without a gateway (a tunnel's, here on tun0) marks its interface too; a
        // route that is not up does not.
        let table = format!(
            "{TABLE}tun0\t0071CBC0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
             wg9\t0071CBC0\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        );
        let routed: Vec<String> = routed_interfaces_in(&table).into_iter().collect();
        assert_eq!(routed, ["eth0", "eth1", "tun0"]);
    }

    #[test]
    fn the_namespace_lists_loopback() {
        let all = interfaces().expect("interfaces");
        let lo = all
            .iter()
            .find(|interface| interface.loopback)
            .expect("loopback is listed");
        assert_eq!(lo.name, "lo");
        assert!(lo.global_ipv4.is_empty(), "127/8 is not global: {lo:?}");
        assert!(!lo.physical);
    }

    fn v6(text: &str) -> Ipv6Addr {
        text.parse().expect("IPv6 address")
    }

    #[test]
    fn the_ipv6_source_is_global_settled_and_not_deprecated() {
        // Usable on up0: ::1 and ::5 (see the table).
        let states = link::ipv6_addresses_in(IF_INET6, "up0");
        // The interface's own order decides among the usable ones...
        assert_eq!(
            choose_snat_ipv6(
                &[v6("2001:db8::2"), v6("2001:db8::5"), v6("2001:db8::1")],
                &states
            ),
            Some(v6("2001:db8::5"))
        );
        // ...and without it, the lowest.
        assert_eq!(choose_snat_ipv6(&[], &states), Some(v6("2001:db8::1")));
        let lo = link::ipv6_addresses_in(IF_INET6, "lo");
        assert_eq!(choose_snat_ipv6(&[Ipv6Addr::LOCALHOST], &lo), None);
        assert_eq!(
            choose_snat_ipv6(&[], &link::ipv6_addresses_in(IF_INET6, "eth9")),
            None
        );
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
