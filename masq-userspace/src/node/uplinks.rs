//! The uplinks: the interfaces masq translates on, with the addresses each masquerades to, and
//! how an uplink's record in the datapath follows those addresses as they change.
//!
//! They are the interfaces named with `--interface`, or else every interface traffic leaves
//! the node by (see [`interfaces::uplink_candidates`]). Finding them asks the kernel; deciding
//! what a change of address does to the record and to the flows of the old address does not,
//! so it is tested here without one.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use masq_common::layout::{LINK_ETHERNET, Uplink};

use super::{
    interfaces::{self, InterfaceError},
    renumbering,
};
use crate::causes::WithCauses;

/// How an uplink treats IPv6.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UplinkIpv6 {
    /// IPv6 is not translated anywhere (no `--enable-ipv6`).
    #[default]
    NotTranslated,
    /// IPv6 should be translated, but the interface has no global IPv6 address to
    /// masquerade to: IPv6 traffic leaving by it passes untranslated.
    NoAddress,
    /// Masqueraded to this address.
    Address(Ipv6Addr),
}

/// Which interfaces to translate on, and with which addresses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UplinkOptions {
    /// The interfaces named with `--interface`; empty: every interface traffic leaves the node
    /// by, followed as they come and go.
    pub interfaces: Vec<String>,
    /// `--node-ip`: the IPv4 address the one named interface masquerades to; its primary IPv4
    /// when `None` (followed if it changes).
    pub node_ip: Option<Ipv4Addr>,
    /// `--enable-ipv6`: IPv6 is translated too, so an uplink may be one by IPv6 alone.
    pub enable_ipv6: bool,
}

/// Why there is nothing (or not what was named) to translate on.
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// A named interface, or the routes and addresses, could not be used.
    #[error(transparent)]
    Interface(#[from] InterfaceError),
    /// No interface to translate on.
    #[error(
        "no interface carries traffic out of the node (none is up with a global IPv4 address and \
         a route via a gateway, or backed by a NIC); name one with --interface (an IPv6-only node \
         needs --enable-ipv6)"
    )]
    NoUplink,
    /// No interface to translate on, IPv6 included.
    #[error(
        "no interface carries traffic out of the node (none is up with a global IPv4 or IPv6 \
         address and a route of that family via a gateway, or backed by a NIC); name one with \
         --interface"
    )]
    NoUplinkDualStack,
}

/// How hard a problem with the interfaces hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strictness {
    /// At startup: anything wrong with what the operator asked for stops the agent before it
    /// changes anything.
    Startup,
    /// Later: interfaces come and go; problems are logged and the rest carries on.
    Running,
}

/// An interface to translate on, and the address its traffic is masqueraded to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WantedUplink {
    /// The interface's name.
    pub name: String,
    /// Its index.
    pub ifindex: u32,
    /// What IPv4 traffic leaving by it is masqueraded to; `None` on an uplink without IPv4 (an
    /// IPv6-only node's, with `--enable-ipv6`), where it is dropped as MASQUERADE drops it.
    pub address: Option<Ipv4Addr>,
    /// Whether the address is one of the interface's own (a `--node-ip` may not be).
    pub address_is_local: bool,
    /// What IPv6 traffic leaving by it is masqueraded to.
    pub ipv6: UplinkIpv6,
    /// What its frames start with (`LINK_*`).
    pub link: u8,
}

/// An uplink's record once it followed its interface's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowedAddresses {
    /// The record: the addresses the interface has now, and per family the former address
    /// whose flows live on.
    pub record: Uplink,
    /// Former addresses kept from now on: changed, but still on the interface.
    pub newly_kept: Vec<IpAddr>,
    /// Addresses that left the interface: their flows go, unless another uplink still
    /// answers for them (see [`answers_for`]).
    pub gone: Vec<IpAddr>,
}

impl WantedUplink {
    /// The IPv6 address to record for the datapath, if IPv6 is translated on this uplink.
    pub const fn ipv6_address(&self) -> Option<Ipv6Addr> {
        match self.ipv6 {
            UplinkIpv6::Address(address) => Some(address),
            UplinkIpv6::NotTranslated | UplinkIpv6::NoAddress => None,
        }
    }

    /// The addresses its traffic is masqueraded to: IPv4, IPv6, either or both.
    pub fn addresses(&self) -> impl Iterator<Item = IpAddr> {
        let ipv4 = self.address.map(IpAddr::V4);
        let ipv6 = self.ipv6_address().map(IpAddr::V6);
        ipv4.into_iter().chain(ipv6)
    }

    /// Whether `record`, found at `ifindex`, is this uplink's (an index can be reused by
    /// another interface once its own is gone).
    pub fn is_recorded_as(&self, ifindex: u32, record: &Uplink) -> bool {
        self.ifindex == ifindex && self.name == record.name()
    }

    /// `record` with this uplink's addresses: IPv4 (or none) and IPv6 (or none).
    pub fn with_addresses(&self, record: Uplink) -> Uplink {
        let address = self.ipv6_address();
        Uplink {
            link: self.link,
            snat_addr: self.address.as_ref().map_or([0; 4], Ipv4Addr::octets),
            has_v6: u8::from(address.is_some()),
            snat_addr_v6: address.as_ref().map_or([0; 16], Ipv6Addr::octets),
            ..record
        }
    }

    /// The record `previous` once it follows this uplink's addresses: new flows take the new
    /// address; the flows of the old one live on while it is still the interface's
    /// (`still_on_interface`; the kernel's preferred IPv6 source changes routinely, the old
    /// address staying, deprecated), and go only when it is removed, as MASQUERADE's notifier
    /// flushes conntrack's entries on removal only. Only the interface's own addresses can be
    /// kept: a `--node-ip` that is none of them goes at once.
    pub fn follow(
        &self,
        previous: &Uplink,
        still_on_interface: impl Fn(IpAddr) -> bool,
    ) -> FollowedAddresses {
        let mut record = self.with_addresses(*previous);
        let on_interface = |address: IpAddr| self.address_is_local && still_on_interface(address);
        let v4 = |address: [u8; 4]| (address != [0; 4]).then(|| IpAddr::from(address));
        let v6 = |address: [u8; 16]| (address != [0; 16]).then(|| IpAddr::from(address));
        let mut gone = Vec::new();
        let former_v4 = renumbering::former_address(
            v4(previous.snat_addr),
            v4(record.snat_addr),
            v4(previous.former_addr),
            on_interface,
            &mut gone,
        );
        let former_v6 = renumbering::former_address(
            (previous.has_v6 != 0).then(|| IpAddr::from(previous.snat_addr_v6)),
            (record.has_v6 != 0).then(|| IpAddr::from(record.snat_addr_v6)),
            v6(previous.former_addr_v6),
            on_interface,
            &mut gone,
        );
        record.former_addr = match former_v4 {
            Some(IpAddr::V4(address)) => address.octets(),
            _ => [0; 4],
        };
        record.former_addr_v6 = match former_v6 {
            Some(IpAddr::V6(address)) => address.octets(),
            _ => [0; 16],
        };
        let newly_kept = [former_v4, former_v6]
            .into_iter()
            .flatten()
            .filter(|&address| {
                v4(previous.former_addr) != Some(address)
                    && v6(previous.former_addr_v6) != Some(address)
            })
            .collect();
        FollowedAddresses {
            record,
            newly_kept,
            gone,
        }
    }

    /// Says which of the uplink's addresses changed since `previous` was recorded.
    pub fn report_address_changes(&self, previous: &Uplink) {
        let current = self.with_addresses(*previous);
        if previous.snat_addr != current.snat_addr {
            let old = previous
                .has_v4()
                .then(|| Ipv4Addr::from(previous.snat_addr));
            tracing::warn!(interface = %self.name, ?old, new = ?self.address, "the interface's address changed; new flows use the new one");
            self.warn_if_ipv4_missing();
        }
        if (previous.has_v6, previous.snat_addr_v6) != (current.has_v6, current.snat_addr_v6) {
            let old = (previous.has_v6 != 0).then(|| Ipv6Addr::from(previous.snat_addr_v6));
            tracing::warn!(interface = %self.name, ?old, new = ?self.ipv6_address(), "the interface's IPv6 address changed; new IPv6 flows use the new one");
            self.warn_if_ipv6_missing();
        }
    }

    /// Says that IPv4 traffic to be masqueraded leaving by this uplink is dropped.
    pub fn warn_if_ipv4_missing(&self) {
        if self.address.is_none() {
            tracing::warn!(
                interface = %self.name,
                "the interface has no IPv4 address: IPv4 traffic from pods that would be masqueraded leaving by it is dropped (counted as egress_drop_no_address), as MASQUERADE drops it, until it gets one"
            );
        }
    }

    /// Says, loudly, that IPv6 traffic leaving by this uplink passes untranslated.
    pub fn warn_if_ipv6_missing(&self) {
        if self.ipv6 == UplinkIpv6::NoAddress {
            tracing::warn!(
                interface = %self.name,
                "the interface has no global IPv6 address to masquerade to (or it is tentative or deprecated): IPv6 traffic leaving by it keeps pod addresses until it gets one"
            );
        }
    }
}

/// The uplinks recorded in the datapath that are no longer wanted: gone, or no longer an
/// uplink (or their index now belongs to another interface).
pub fn unwanted(recorded: &BTreeMap<u32, Uplink>, wanted: &[WantedUplink]) -> Vec<(u32, Uplink)> {
    recorded
        .iter()
        .filter(|&(&ifindex, record)| {
            !wanted
                .iter()
                .any(|uplink| uplink.is_recorded_as(ifindex, record))
        })
        .map(|(&ifindex, record)| (ifindex, *record))
        .collect()
}

/// Whether any of the recorded `uplinks` still answers for `address`: masquerades to it, or
/// keeps it as its former address. The flows of an address no uplink answers for are flushed,
/// so that their next packet is mapped afresh on the address the uplink has now.
pub fn answers_for(uplinks: &[(u32, Uplink)], address: IpAddr) -> bool {
    uplinks.iter().any(|(_, uplink)| match address {
        IpAddr::V4(address) => {
            let octets = address.octets();
            (uplink.has_v4() && uplink.snat_addr == octets) || uplink.former_addr == octets
        }
        IpAddr::V6(address) => {
            let octets = address.octets();
            (uplink.has_v6 != 0 && uplink.snat_addr_v6 == octets) || uplink.former_addr_v6 == octets
        }
    })
}

/// The addresses the recorded `uplinks` masquerade to.
pub fn recorded_addresses(uplinks: &[(u32, Uplink)]) -> Vec<IpAddr> {
    uplinks
        .iter()
        .flat_map(|(_, uplink)| {
            let ipv4 = uplink.has_v4().then(|| IpAddr::from(uplink.snat_addr));
            let ipv6 = (uplink.has_v6 != 0).then(|| IpAddr::from(uplink.snat_addr_v6));
            ipv4.into_iter().chain(ipv6)
        })
        .collect()
}

/// The interfaces to translate on: the ones named with `--interface`, or every interface
/// traffic leaves the node by, each with the address MASQUERADE would give its traffic.
pub fn wanted_uplinks(
    options: &UplinkOptions,
    strictness: Strictness,
) -> Result<Vec<WantedUplink>, UplinkError> {
    if options.interfaces.is_empty() {
        return discovered_uplinks(options.enable_ipv6, strictness);
    }
    let mut chosen = Vec::new();
    for name in &options.interfaces {
        let interface = match interfaces::interface(name) {
            Ok(interface) => interface,
            Err(error) if strictness == Strictness::Running => {
                tracing::warn!(interface = %name, error = %WithCauses(&error), "a named interface is missing; translating on the others");
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let link = interfaces::link_of(interface.link_type);
        let problem = if link.is_some() {
            match options
                .node_ip
                .or_else(|| interface.global_ipv4.first().copied())
            {
                Some(address) => Ok(Some(address)),
                // An IPv6-only uplink: IPv6 is masqueraded, IPv4 to be masqueraded dropped.
                // Its IPv6 address may still be tentative: it is followed once it settles.
                None if options.enable_ipv6 && interface.global_ipv6 => Ok(None),
                None if options.enable_ipv6 => Err(InterfaceError::NoAddressAtAll(name.clone())),
                None => Err(InterfaceError::NoAddress(name.clone())),
            }
        } else {
            Err(InterfaceError::UnsupportedLink {
                name: name.clone(),
                link_type: interface.link_type,
            })
        };
        match problem.map(|address| (address, link.unwrap_or(LINK_ETHERNET))) {
            Ok((address, link)) => {
                let address_is_local =
                    address.is_none_or(|address| interface.global_ipv4.contains(&address));
                if !address_is_local && strictness == Strictness::Startup {
                    tracing::warn!(
                        interface = %name, node_ip = ?address,
                        "--node-ip is not an address of the interface: replies reach the node only if the network routes it here"
                    );
                }
                chosen.push(WantedUplink {
                    link,
                    ipv6: ipv6_of(options.enable_ipv6, &interface.name),
                    name: interface.name,
                    ifindex: interface.index,
                    address,
                    address_is_local,
                });
            }
            Err(error) if strictness == Strictness::Running => {
                tracing::warn!(interface = %name, error = %WithCauses(&error), "not translating on this interface for now");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(chosen)
}

/// Every interface traffic leaves the node by, when none is named.
fn discovered_uplinks(
    enable_ipv6: bool,
    strictness: Strictness,
) -> Result<Vec<WantedUplink>, UplinkError> {
    let present = interfaces::interfaces()?;
    let gateways = interfaces::Gateways::read(enable_ipv6)?;
    // A candidate without IPv4 is one by its IPv6 routes or NIC, which only count with
    // --enable-ipv6.
    let chosen: Vec<WantedUplink> = interfaces::uplink_candidates(&present, &gateways)
        .into_iter()
        .map(|interface| WantedUplink {
            link: interfaces::link_of(interface.link_type).unwrap_or(LINK_ETHERNET),
            address: interface.global_ipv4.first().copied(),
            address_is_local: true,
            ipv6: ipv6_of(enable_ipv6, &interface.name),
            name: interface.name,
            ifindex: interface.index,
        })
        .collect();
    if chosen.is_empty() && strictness == Strictness::Startup {
        return Err(if enable_ipv6 {
            UplinkError::NoUplinkDualStack
        } else {
            UplinkError::NoUplink
        });
    }
    Ok(chosen)
}

/// How IPv6 traffic leaving by `interface` is to be translated: not at all without
/// `--enable-ipv6`, else to the interface's global address, if it has one. A missing address
/// does not stop the agent (IPv4 carries on): it is reported per uplink instead.
fn ipv6_of(enable_ipv6: bool, interface: &str) -> UplinkIpv6 {
    if !enable_ipv6 {
        return UplinkIpv6::NotTranslated;
    }
    match interfaces::snat_ipv6(interface) {
        Ok(Some(address)) => UplinkIpv6::Address(address),
        Ok(None) => UplinkIpv6::NoAddress,
        Err(error) => {
            tracing::warn!(%interface, error = %WithCauses(&error), "could not read the interface's IPv6 addresses");
            UplinkIpv6::NoAddress
        }
    }
}

#[cfg(test)]
mod tests {
    use masq_common::layout::ATTACH_TCX;

    use super::*;

    const OLD: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const NEW: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);

    fn wanted(address: Option<Ipv4Addr>, address_is_local: bool) -> WantedUplink {
        WantedUplink {
            name: "eth0".to_owned(),
            ifindex: 2,
            address,
            address_is_local,
            ipv6: UplinkIpv6::NotTranslated,
            link: LINK_ETHERNET,
        }
    }

    fn recorded(address: Ipv4Addr) -> Uplink {
        Uplink::new(
            address.octets(),
            ATTACH_TCX,
            Uplink::encode_name("eth0").expect("a short name"),
        )
    }

    #[test]
    fn an_unchanged_address_leaves_the_record_as_it_is() {
        let previous = recorded(OLD);
        let followed = wanted(Some(OLD), true).follow(&previous, |_| true);
        assert_eq!(followed.record, previous);
        assert!(followed.newly_kept.is_empty() && followed.gone.is_empty());
    }

    #[test]
    fn a_changed_address_still_on_the_interface_keeps_its_flows() {
        let followed = wanted(Some(NEW), true).follow(&recorded(OLD), |_| true);
        assert_eq!(followed.record.snat_addr, NEW.octets());
        assert_eq!(followed.record.former_addr, OLD.octets());
        assert_eq!(followed.newly_kept, [IpAddr::V4(OLD)]);
        assert!(followed.gone.is_empty());

        // Followed again, the former address is no longer news.
        let again = wanted(Some(NEW), true).follow(&followed.record, |_| true);
        assert_eq!(again.record, followed.record);
        assert!(again.newly_kept.is_empty());
    }

    #[test]
    fn a_removed_address_takes_its_flows_with_it() {
        let followed =
            wanted(Some(NEW), true).follow(&recorded(OLD), |address| address != IpAddr::V4(OLD));
        assert_eq!(followed.record.former_addr, [0; 4]);
        assert_eq!(followed.gone, [IpAddr::V4(OLD)]);
    }

    #[test]
    fn a_node_ip_that_is_not_the_interfaces_is_never_kept() {
        let followed = wanted(Some(NEW), false).follow(&recorded(OLD), |_| true);
        assert_eq!(followed.record.former_addr, [0; 4]);
        assert_eq!(followed.gone, [IpAddr::V4(OLD)]);
    }

    #[test]
    fn recorded_uplinks_no_longer_wanted_are_found_by_index_and_name() {
        let record = recorded(OLD);
        let recorded = BTreeMap::from([(2, record), (3, record)]);
        let eth0 = wanted(Some(OLD), true);
        // Index 3 holds a record named eth0, but eth0 is index 2 now.
        assert_eq!(unwanted(&recorded, &[eth0]), [(3, record)]);
        assert_eq!(unwanted(&recorded, &[]).len(), 2);
    }

    #[test]
    fn an_address_is_answered_for_while_an_uplink_has_it_or_keeps_it() {
        let mut record = recorded(NEW);
        record.former_addr = OLD.octets();
        let uplinks = [(2, record)];
        assert!(answers_for(&uplinks, IpAddr::V4(NEW)));
        assert!(answers_for(&uplinks, IpAddr::V4(OLD)));
        assert!(!answers_for(
            &uplinks,
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 3))
        ));
        assert!(!answers_for(
            &uplinks,
            "2001:db8::1".parse().expect("an address")
        ));
    }
}
