//! The node's network interfaces as the kernel describes them: their names, flags and
//! addresses (`getifaddrs`), their indexes, link types and drivers (`if_nametoindex` and ioctls
//! on an inet socket), and the state of their IPv6 addresses (`/proc/self/net/if_inet6`).
//!
//! Everything here asks the kernel through the calling thread's network namespace, never
//! through `/sys/class/net`, whose view belongs to whoever mounted sysfs: in a container or a
//! test namespace it can show another namespace. Which interfaces are uplinks, and which of
//! their addresses traffic is masqueraded to, is `node::interfaces`' business.

use std::{
    collections::BTreeMap,
    ffi::CStr,
    fs, io,
    net::{Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use nix::{
    ifaddrs::getifaddrs,
    net::if_::{InterfaceFlags, if_nametoindex},
    sys::socket::{SockaddrIn, SockaddrIn6},
};

/// One interface's flags and addresses, each family's in the order the kernel lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LinkAddresses {
    /// The interface's name.
    pub(crate) name: String,
    /// Administratively up (`IFF_UP`).
    pub(crate) up: bool,
    /// The loopback device (`IFF_LOOPBACK`).
    pub(crate) loopback: bool,
    /// Its IPv4 addresses.
    pub(crate) ipv4: Vec<Ipv4Addr>,
    /// Its IPv6 addresses, of any scope and state.
    pub(crate) ipv6: Vec<Ipv6Addr>,
}

/// Every interface of the namespace with its flags and addresses, by name.
pub(crate) fn addresses() -> Result<Vec<LinkAddresses>, nix::Error> {
    let mut found: BTreeMap<String, (InterfaceFlags, LinkAddresses)> = BTreeMap::new();
    for address in getifaddrs()? {
        let (flags, link) = found
            .entry(address.interface_name.clone())
            .or_insert_with(|| {
                let link = LinkAddresses {
                    name: address.interface_name.clone(),
                    ..LinkAddresses::default()
                };
                (address.flags, link)
            });
        *flags |= address.flags;
        let Some(sockaddr) = address.address else {
            continue;
        };
        if let Some(ipv4) = sockaddr.as_sockaddr_in().map(SockaddrIn::ip) {
            link.ipv4.push(ipv4);
        }
        if let Some(ipv6) = sockaddr.as_sockaddr_in6().map(SockaddrIn6::ip) {
            link.ipv6.push(ipv6);
        }
    }
    Ok(found
        .into_values()
        .map(|(flags, link)| LinkAddresses {
            up: flags.contains(InterfaceFlags::IFF_UP),
            loopback: flags.contains(InterfaceFlags::IFF_LOOPBACK),
            ..link
        })
        .collect())
}

/// The flags and addresses of the interface `name`; an interface without any (or none at
/// all) has empty lists.
pub(crate) fn addresses_of(name: &str) -> Result<LinkAddresses, nix::Error> {
    Ok(addresses()?
        .into_iter()
        .find(|link| link.name == name)
        .unwrap_or_default())
}

/// The index of the interface `name`, if it exists.
pub(crate) fn index(name: &str) -> Option<u32> {
    if_nametoindex(name).ok()
}

/// An inet socket to ask the kernel about interfaces with ioctls.
#[derive(Debug)]
pub(crate) struct LinkInspector {
    socket: OwnedFd,
}

impl LinkInspector {
    /// Opens the socket.
    pub(crate) fn open() -> io::Result<Self> {
        // SAFETY: socket(2) with constant arguments; the result is checked before it is owned.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { socket })
    }

    /// The `ARPHRD_*` link type of the interface `name` (`SIOCGIFHWADDR`).
    pub(crate) fn link_type(&self, name: &str) -> io::Result<u16> {
        let mut request = ifreq_for(name);
        // SAFETY: SIOCGIFHWADDR reads the name and writes the hardware address into `request`,
        // which lives across the call.
        let result = unsafe {
            libc::ioctl(
                self.socket.as_raw_fd(),
                ioctl_request(libc::SIOCGIFHWADDR),
                std::ptr::from_mut(&mut request),
            )
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the ioctl filled the hardware address member of the union.
        Ok(unsafe { request.ifr_ifru.ifru_hwaddr.sa_family })
    }

    /// The bus address the driver of the interface `name` reports (`ETHTOOL_GDRVINFO`), empty
    /// when it reports none; `None` when it does not answer. Hardware NICs report theirs;
    /// virtual devices report none, a placeholder, or do not answer.
    pub(crate) fn driver_bus(&self, name: &str) -> Option<String> {
        const ETHTOOL_GDRVINFO: u32 = 0x3;
        let mut info = DriverInfo {
            cmd: ETHTOOL_GDRVINFO,
            ..DriverInfo::default()
        };
        let mut request = ifreq_for(name);
        request.ifr_ifru.ifru_data = std::ptr::from_mut(&mut info).cast();
        // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO fills the `DriverInfo` that `request`
        // points to; both live across the call.
        let result = unsafe {
            libc::ioctl(
                self.socket.as_raw_fd(),
                ioctl_request(libc::SIOCETHTOOL),
                std::ptr::from_mut(&mut request),
            )
        };
        (result == 0).then(|| {
            CStr::from_bytes_until_nul(&info.bus_info)
                .map_or_else(
                    |_| String::from_utf8_lossy(&info.bus_info),
                    CStr::to_string_lossy,
                )
                .into_owned()
        })
    }
}

/// `request` as `ioctl(2)` takes it: unsigned with glibc, signed with musl (the image's build).
const fn ioctl_request(request: libc::c_ulong) -> libc::Ioctl {
    request as libc::Ioctl
}

/// An `ifreq` naming `name` (truncated names never match a real interface).
fn ifreq_for(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *slot = byte as libc::c_char;
    }
    request
}

/// `struct ethtool_drvinfo` (`include/uapi/linux/ethtool.h`).
#[repr(C)]
#[derive(Default)]
struct DriverInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// One IPv6 address of an interface as `/proc/net/if_inet6` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6AddressState {
    /// The address.
    pub address: Ipv6Addr,
    /// The kernel's scope: `RT_SCOPE_UNIVERSE` (0) for a global address.
    pub scope: u8,
    /// The low byte of its `IFA_F_*` flags.
    pub flags: u8,
}

impl Ipv6AddressState {
    /// Whether the kernel would use it as a source towards another network: global, past
    /// duplicate address detection and not deprecated (an address past its preferred lifetime,
    /// or one the operator marked `preferred_lft 0`, is not chosen for new connections).
    pub const fn usable_as_source(&self) -> bool {
        const RT_SCOPE_UNIVERSE: u8 = 0;
        const IFA_F_DADFAILED: u8 = 0x08;
        const IFA_F_DEPRECATED: u8 = 0x20;
        const IFA_F_TENTATIVE: u8 = 0x40;
        self.scope == RT_SCOPE_UNIVERSE
            && self.flags & (IFA_F_DADFAILED | IFA_F_DEPRECATED | IFA_F_TENTATIVE) == 0
    }
}

/// The IPv6 addresses of the interface `name` with their states. None when the node has no
/// IPv6 (disabled in the kernel).
pub(crate) fn ipv6_address_states(name: &str) -> Vec<Ipv6AddressState> {
    let table = fs::read_to_string("/proc/self/net/if_inet6").unwrap_or_default();
    ipv6_addresses_in(&table, name)
}

/// Parses `/proc/net/if_inet6`: `address ifindex prefix_len scope flags name`, hex fields.
pub(crate) fn ipv6_addresses_in(table: &str, interface: &str) -> Vec<Ipv6AddressState> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.get(5) != Some(&interface) {
                return None;
            }
            let address = u128::from_str_radix(fields.first()?, 16).ok()?;
            Some(Ipv6AddressState {
                address: Ipv6Addr::from(address),
                scope: u8::from_str_radix(fields.get(3)?, 16).ok()?,
                flags: u8::from_str_radix(fields.get(4)?, 16).ok()?,
            })
        })
        .collect()
}

const _: () = assert!(size_of::<DriverInfo>() == 196);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A table with addresses in every state, on two interfaces and loopback.
    pub(crate) const IF_INET6: &str = "\
20010db8000000000000000000000001 02 40 00 80   up0
20010db8000000000000000000000002 02 40 00 c0   up0
20010db8000000000000000000000003 02 40 00 20   up0
fe800000000000000000000000000001 02 40 20 80   up0
20010db8000000000000000000000004 02 40 00 08   up0
20010db8000000000000000000000005 02 40 00 80   up0
20010db8000000000000000000000009 03 40 00 80   up1
00000000000000000000000000000001 01 80 10 80      lo
";

    #[test]
    fn ipv6_addresses_are_read_with_their_state() {
        let states = ipv6_addresses_in(IF_INET6, "up0");
        assert_eq!(states.len(), 6, "{states:?}");
        let usable: Vec<String> = states
            .iter()
            .filter(|state| state.usable_as_source())
            .map(|state| state.address.to_string())
            .collect();
        // ::2 is tentative, ::3 deprecated, fe80::1 link-local, ::4 failed DAD.
        assert_eq!(usable, ["2001:db8::1", "2001:db8::5"]);
        assert_eq!(ipv6_addresses_in(IF_INET6, "eth9"), []);
        assert_eq!(ipv6_addresses_in("garbage\n", "up0"), []);
    }

    #[test]
    fn loopback_is_listed_with_its_address_and_answers_the_ioctls() {
        let links = addresses().expect("getifaddrs");
        let lo = links
            .iter()
            .find(|link| link.loopback)
            .expect("loopback is listed");
        assert_eq!(
            addresses_of(&lo.name)
                .ok()
                .and_then(|lo| lo.ipv4.first().copied()),
            Some(Ipv4Addr::LOCALHOST)
        );
        assert!(index(&lo.name).is_some());
        assert_eq!(index("masq-nonexistent0"), None);
        let inspector = LinkInspector::open().expect("an inet socket");
        // ARPHRD_LOOPBACK.
        assert_eq!(inspector.link_type(&lo.name).ok(), Some(772));
        assert!(inspector.link_type("masq-nonexistent0").is_err());
    }
}
