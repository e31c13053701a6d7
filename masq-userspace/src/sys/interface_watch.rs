//! The kernel's announcements of link, address and route changes: a netlink socket subscribed
//! to rtnetlink's multicast groups, for the agent to follow the interfaces traffic leaves by.

use std::io;

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};
use tokio::io::unix::AsyncFd;

use super::async_fd;

/// A netlink socket subscribed to link, address and route changes of both families: the
/// events that can change which interfaces carry traffic out of the node, or an address of one.
/// What changed is not read: any event means the interfaces are looked at again.
pub(crate) struct InterfaceWatch {
    socket: AsyncFd<Socket>,
}

impl std::fmt::Debug for InterfaceWatch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("InterfaceWatch")
            .finish_non_exhaustive()
    }
}

impl InterfaceWatch {
    /// Subscribes in the calling thread's network namespace (no capability needed).
    pub(crate) fn new() -> io::Result<Self> {
        // The `RTMGRP_*` multicast groups (linux/rtnetlink.h, ABI), which the crates leave to
        // their users.
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV4_ROUTE: u32 = 0x40;
        // IPv6 addresses come, go, finish duplicate address detection and are deprecated: each
        // can change the address IPv6 traffic is masqueraded to. IPv6 routes make the uplinks
        // of an IPv6-only node.
        const RTMGRP_IPV6_IFADDR: u32 = 0x100;
        const RTMGRP_IPV6_ROUTE: u32 = 0x400;
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind(&SocketAddr::new(
            0,
            RTMGRP_LINK
                | RTMGRP_IPV4_IFADDR
                | RTMGRP_IPV4_ROUTE
                | RTMGRP_IPV6_IFADDR
                | RTMGRP_IPV6_ROUTE,
        ))?;
        socket.set_non_blocking(true)?;
        Ok(Self {
            socket: async_fd::readable(socket)?,
        })
    }

    /// Waits for the next change and consumes everything queued, so a burst (an interface
    /// coming up with its addresses and routes) is one wake-up. An overrun (`ENOBUFS`) also
    /// counts as a change: something happened that was not seen.
    pub(crate) async fn changed(&mut self) -> io::Result<()> {
        let mut buffer = [0u8; 8192];
        loop {
            let mut guard = self.socket.readable().await?;
            let mut seen = false;
            loop {
                match guard.get_inner().recv(&mut &mut buffer[..], 0) {
                    Ok(0) => break,
                    Ok(_) => seen = true,
                    Err(error) => match error.raw_os_error() {
                        Some(libc::EAGAIN) => break,
                        Some(libc::ENOBUFS) => seen = true,
                        Some(libc::EINTR) => {}
                        _ => return Err(error),
                    },
                }
            }
            guard.clear_ready();
            if seen {
                return Ok(());
            }
        }
    }
}
