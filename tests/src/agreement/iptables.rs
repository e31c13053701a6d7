//! The iptables backend's side of the agreement, with real traffic:
//!
//! ```text
//!  pod (every sample source,      node (the rendered chain       receiver (every address
//!  100.64.0.0/16, fd00:64::/64) ── and the POSTROUTING jump) ──── of the roots is local:
//!                                   192.0.2.1, 2001:db8:ffff::1    AnyIP routes to lo)
//! ```
//!
//! The pod connects from the sample's source (bound before connecting) to the sample's
//! destination; the receiver's TCP server reports the address the connection came from: the
//! pod's, or the node's when the chain masqueraded it. Nothing leaves these namespaces: the
//! receiver answers for the roots itself (documentation ranges and private ranges that exist
//! only here) and has no other link.

use std::{
    collections::BTreeSet,
    io::{self, BufRead as _, BufReader, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream},
    os::fd::AsRawFd as _,
    time::Duration,
};

use masq::{
    config::cidr::Family,
    iptables::{
        apply::Iptables,
        render::{DEFAULT_CHAIN, RuleOptions, restore_input},
    },
    policy::Policy,
    ports::ToPorts,
};
use nix::sys::{
    socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, connect, setsockopt,
        socket, sockopt,
    },
    time::TimeVal,
};

use super::{Mismatch, Net, pods_v4, pods_v6, roots_v4, roots_v6};
use crate::{
    netns::{Netns, run, unique_tag},
    traffic::{Server, tcp_server},
};

/// The node's address on its link to the receiver: what a masqueraded connection comes from.
pub const NODE_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The receiver's address on that link.
const RECEIVER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The same over IPv6.
pub const NODE_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
const RECEIVER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 2);
/// The node's and the pod's addresses on the pod link, in the pods' ranges but outside where
/// sources are generated.
const NODE_POD_SIDE_V4: Ipv4Addr = Ipv4Addr::new(100, 64, 255, 254);
const POD_V4: Ipv4Addr = Ipv4Addr::new(100, 64, 255, 253);
const NODE_POD_SIDE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0xffff, 0, 0, 0xfffe);
const POD_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x64, 0, 0, 0xffff, 0, 0, 0xfffd);
/// The receiver's ports.
const PORT_V4: u16 = 7001;
const PORT_V6: u16 = 7002;
/// How long one connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Whether the real-traffic bed can carry traffic to `destination` from the pod: it must be
/// inside one of the roots (the only addresses the receiver has) and not one of the links'
/// own addresses. IPv6 link-local destinations never leave the pod's link, so they cannot be
/// tried here (the datapath check covers them).
pub fn routable(destination: IpAddr) -> bool {
    let roots: Vec<Net> = roots_v4().into_iter().chain(roots_v6()).collect();
    roots.iter().any(|root| root.contains(destination))
        || super::link_local_v4().contains(destination)
}

/// Whether `source` can be a pod address in the bed (inside the pods' ranges, not a link's
/// own address).
pub fn assignable(source: IpAddr) -> bool {
    (pods_v4().contains(source) || pods_v6().contains(source))
        && ![
            IpAddr::V4(POD_V4),
            IpAddr::V4(NODE_POD_SIDE_V4),
            IpAddr::V6(POD_V6),
            IpAddr::V6(NODE_POD_SIDE_V6),
        ]
        .contains(&source)
}

/// The three namespaces, the receiver's servers, and the pod addresses added so far.
#[derive(Debug)]
pub struct RulesBed {
    pub pod: Netns,
    pub node: Netns,
    pub receiver: Netns,
    assigned: BTreeSet<IpAddr>,
    /// The agent's iptables for IPv4 and IPv6, as it detects them.
    iptables: [Iptables; 2],
    _servers: [Server; 2],
}

impl RulesBed {
    /// Builds the namespaces (fails the test without root or without `ip`).
    pub fn new(prefix: &str) -> Self {
        crate::netns::require_root();
        let tag = unique_tag(prefix);
        let pod = Netns::new(&format!("{tag}-pod"));
        let node = Netns::new(&format!("{tag}-node"));
        let receiver = Netns::new(&format!("{tag}-rcv"));
        for netns in [&pod, &node, &receiver] {
            for scope in ["all", "default"] {
                netns.sysctl(&format!("net.ipv6.conf.{scope}.accept_ra"), "0");
                netns.sysctl(&format!("net.ipv6.conf.{scope}.disable_ipv6"), "0");
            }
        }
        node.add_veth("vpod", &pod, "eth0");
        node.add_veth("up0", &receiver, "eth0");
        let address = |netns: &Netns, address: String, device: &str| {
            // No duplicate address detection: an IPv6 address is usable at once.
            let nodad = address.contains(':').then_some("nodad");
            let mut args = vec!["addr", "add", &address, "dev", device];
            args.extend(nodad);
            netns.ip(&args);
        };
        // Single addresses and routes to the pods' ranges, not subnets on the pod link: a
        // subnet would make its first and last address special (IPv4 broadcast routes, the
        // IPv6 subnet-router anycast address, which the node would answer itself), and every
        // address of the ranges must be a possible pod.
        address(&pod, format!("{POD_V4}/32"), "eth0");
        address(&pod, format!("{POD_V6}/128"), "eth0");
        address(&node, format!("{NODE_POD_SIDE_V4}/32"), "vpod");
        address(&node, format!("{NODE_POD_SIDE_V6}/128"), "vpod");
        address(&node, format!("{NODE_V4}/24"), "up0");
        address(&node, format!("{NODE_V6}/64"), "up0");
        address(&receiver, format!("{RECEIVER_V4}/24"), "eth0");
        address(&receiver, format!("{RECEIVER_V6}/64"), "eth0");
        for (netns, device) in [
            (&pod, "eth0"),
            (&node, "vpod"),
            (&node, "up0"),
            (&receiver, "eth0"),
        ] {
            netns.ip(&["link", "set", device, "up"]);
        }
        pod.ip(&["route", "add", &NODE_POD_SIDE_V4.to_string(), "dev", "eth0"]);
        pod.ip(&[
            "-6",
            "route",
            "add",
            &NODE_POD_SIDE_V6.to_string(),
            "dev",
            "eth0",
        ]);
        node.ip(&["route", "add", &pods_v4().text(), "dev", "vpod"]);
        node.ip(&["-6", "route", "add", &pods_v6().text(), "dev", "vpod"]);
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            &NODE_POD_SIDE_V4.to_string(),
        ]);
        pod.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &NODE_POD_SIDE_V6.to_string(),
        ]);
        node.ip(&["route", "add", "default", "via", &RECEIVER_V4.to_string()]);
        node.ip(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &RECEIVER_V6.to_string(),
        ]);
        node.sysctl("net.ipv4.ip_forward", "1");
        node.sysctl("net.ipv6.conf.all.forwarding", "1");
        receiver.ip(&[
            "route",
            "add",
            &pods_v4().text(),
            "via",
            &NODE_V4.to_string(),
        ]);
        receiver.ip(&[
            "-6",
            "route",
            "add",
            &pods_v6().text(),
            "via",
            &NODE_V6.to_string(),
        ]);
        // AnyIP: every address of the roots (and IPv4 link-local) is the receiver's own.
        for root in roots_v4().into_iter().chain([super::link_local_v4()]) {
            receiver.ip(&["route", "add", "local", &root.text(), "dev", "lo"]);
        }
        for root in roots_v6() {
            receiver.ip(&["-6", "route", "add", "local", &root.text(), "dev", "lo"]);
        }
        let iptables = [Family::Ipv4, Family::Ipv6].map(|family| {
            node.enter(|| Iptables::detect(family))
                .unwrap_or_else(|error| panic!("detecting {family} iptables: {error}"))
        });
        let servers = [
            tcp_server(
                &receiver,
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT_V4)),
            ),
            tcp_server(
                &receiver,
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, PORT_V6)),
            ),
        ];
        Self {
            pod,
            node,
            receiver,
            assigned: BTreeSet::new(),
            iptables,
            _servers: servers,
        }
    }

    /// Writes `policy`'s chains with the agent's own [`Iptables::sync`] (ensure the chain,
    /// ensure the POSTROUTING jump, `iptables-restore --noflush`), run in the node's namespace:
    /// both families when IPv6 is enabled, and otherwise an empty IPv6 chain, as no rule at all.
    pub fn install(&mut self, policy: &Policy) {
        for (family, iptables) in [Family::Ipv4, Family::Ipv6].into_iter().zip(&self.iptables) {
            let input = if family == Family::Ipv6 && !policy.ipv6_enabled() {
                // Upstream writes no IPv6 rules then; an empty chain (which clears an earlier
                // case's) is the same.
                format!("*nat\n:{DEFAULT_CHAIN} - [0:0]\nCOMMIT\n")
            } else {
                let options = RuleOptions {
                    chain: DEFAULT_CHAIN.to_owned(),
                    random_fully: iptables.has_random_fully,
                    to_ports: ToPorts::default(),
                };
                restore_input(policy, family, &options)
            };
            self.node
                .enter(|| iptables.sync(DEFAULT_CHAIN, &input))
                .unwrap_or_else(|error| panic!("syncing the {family} rules:\n{input}\n{error}"));
        }
    }

    /// Gives the pod `source` (once).
    pub fn assign(&mut self, source: IpAddr) {
        assert!(assignable(source), "{source} cannot be a pod address here");
        if self.assigned.insert(source) {
            let address = format!("{source}/{}", if source.is_ipv6() { 128 } else { 32 });
            let mut args = vec!["addr", "add", &address, "dev", "eth0"];
            if source.is_ipv6() {
                args.push("nodad");
            }
            self.pod.ip(&args);
        }
    }

    /// The address the receiver sees a connection from `source` to `destination` come from.
    pub fn seen_source(&mut self, source: IpAddr, destination: IpAddr) -> io::Result<IpAddr> {
        self.assign(source);
        let port = if destination.is_ipv6() {
            PORT_V6
        } else {
            PORT_V4
        };
        let server = SocketAddr::new(destination, port);
        self.pod
            .enter(|| connection_peer(source, server))
            .map(|peer| peer.ip().to_canonical())
    }

    /// Sends every pair and returns where the source the receiver saw disagrees with the
    /// policy's decision.
    pub fn compare(&mut self, policy: &Policy, pairs: &[(IpAddr, IpAddr)]) -> Vec<Mismatch> {
        let mut mismatches = Vec::new();
        for &(source, destination) in pairs {
            let decision = policy.decide_from(Some(source), destination);
            let node = if destination.is_ipv6() {
                IpAddr::V6(NODE_V6)
            } else {
                IpAddr::V4(NODE_V4)
            };
            let expected = if decision.masquerade { node } else { source };
            let seen = self.seen_source(source, destination);
            if !matches!(seen, Ok(seen) if seen == expected) {
                mismatches.push(Mismatch {
                    source,
                    destination,
                    explain: super::explained(policy, source, destination),
                    observed: match seen {
                        Ok(seen) if seen == node => format!("masquerade (came from {seen})"),
                        Ok(seen) if seen == source => format!("keep (came from {seen})"),
                        Ok(seen) => format!("came from {seen}"),
                        Err(error) => format!("no connection: {error}"),
                    },
                });
            }
        }
        mismatches
    }

    /// The rules in the node's nat table, for failure reports.
    pub fn rules(&self) -> String {
        let mut text = String::new();
        for program in ["iptables", "ip6tables"] {
            let output = run(self.node.command(program).args(["-w", "-t", "nat", "-S"]));
            text.push_str(&String::from_utf8_lossy(&output.stdout));
        }
        text
    }
}

/// Connects from `source` (an address of this namespace) to a [`tcp_server`] at `server` and
/// returns the peer address the server reports. Call from inside the pod's namespace.
fn connection_peer(source: IpAddr, server: SocketAddr) -> io::Result<SocketAddr> {
    let family = if source.is_ipv6() {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let socket = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    // A blocking connect gives up after the send timeout (Linux), not after minutes of SYNs.
    let timeout = TimeVal::new(i64::try_from(CONNECT_TIMEOUT.as_secs()).unwrap_or(3), 0);
    setsockopt(&socket, sockopt::SendTimeout, &timeout)?;
    setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)?;
    match (source, server) {
        (IpAddr::V4(source), SocketAddr::V4(server)) => {
            bind(
                socket.as_raw_fd(),
                &SockaddrIn::from(std::net::SocketAddrV4::new(source, 0)),
            )?;
            connect(socket.as_raw_fd(), &SockaddrIn::from(server))?;
        }
        (IpAddr::V6(source), SocketAddr::V6(server)) => {
            let local = std::net::SocketAddrV6::new(source, 0, 0, 0);
            bind(socket.as_raw_fd(), &SockaddrIn6::from(local))?;
            connect(socket.as_raw_fd(), &SockaddrIn6::from(server))?;
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "source and server of different families",
            ));
        }
    }
    let mut stream = TcpStream::from(socket);
    // The server's "sink" mode: an id line, the data, EOF; it answers with the peer it saw.
    writeln!(stream, "sink probe")?;
    stream.shutdown(Shutdown::Write)?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply)?;
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|peer| peer.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad report {reply:?}")))
}
