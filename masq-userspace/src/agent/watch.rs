//! Noticing config changes as they happen.
//!
//! The kubelet updates a ConfigMap volume by writing a new timestamped directory and renaming a
//! `..data` symlink over the old one; the file itself is never written in place. Watching the
//! file would miss that, so the directory holding it is watched for any entry change.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd, RawFd},
    path::Path,
};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::{Interest, unix::AsyncFd};

/// Lets tokio poll the inotify descriptor.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify watch on one directory.
pub struct DirectoryWatch {
    inotify: AsyncFd<InotifyFd>,
}

impl std::fmt::Debug for DirectoryWatch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("DirectoryWatch")
            .finish_non_exhaustive()
    }
}

impl DirectoryWatch {
    /// Watches `dir` for entries being created, removed, renamed or written.
    pub fn new(dir: &Path) -> io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(
            dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_ATTRIB
                | AddWatchFlags::IN_DELETE_SELF
                | AddWatchFlags::IN_MOVE_SELF,
        )?;
        // SAFETY: the descriptor is owned by the `Inotify` inside the `AsyncFd` and is neither
        // closed nor replaced while registered.
        let inotify =
            unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE)? };
        Ok(Self { inotify })
    }

    /// Waits for the next batch of changes and consumes it.
    pub async fn changed(&mut self) -> io::Result<()> {
        loop {
            let mut guard = self.inotify.readable().await?;
            match guard.get_inner().0.read_events() {
                Ok(events) if !events.is_empty() => {
                    // Drain whatever else is queued so one swap yields one reload.
                    while matches!(guard.get_inner().0.read_events(), Ok(more) if !more.is_empty())
                    {
                    }
                    guard.clear_ready();
                    return Ok(());
                }
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// A netlink socket subscribed to link, IPv4 address and IPv4 route changes: the events that
/// can change which interfaces carry traffic out of the node, or the address of one.
pub struct InterfaceWatch {
    socket: AsyncFd<std::os::fd::OwnedFd>,
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
    pub fn new() -> io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        const RTMGRP_LINK: u32 = 0x1;
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV4_ROUTE: u32 = 0x40;
        // SAFETY: socket(2) with constant arguments; the result is checked before it is owned.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_nl is plain old data; all zeroes is a valid value.
        let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        address.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE;
        // SAFETY: `address` is a valid sockaddr_nl of the size given, alive across the call.
        let bound = unsafe {
            libc::bind(
                socket.as_raw_fd(),
                std::ptr::from_ref(&address).cast(),
                u32::try_from(size_of::<libc::sockaddr_nl>()).map_err(io::Error::other)?,
            )
        };
        if bound != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the descriptor is owned by the `AsyncFd` and is neither closed nor replaced
        // while registered.
        let socket = unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE)? };
        Ok(Self { socket })
    }

    /// Waits for the next change and consumes everything queued, so a burst (an interface
    /// coming up with its addresses and routes) is one wake-up. An overrun (`ENOBUFS`) also
    /// counts as a change: something happened that was not seen.
    pub async fn changed(&mut self) -> io::Result<()> {
        let mut buffer = [0u8; 8192];
        loop {
            let mut guard = self.socket.readable().await?;
            let mut seen = false;
            loop {
                // SAFETY: `buffer` is writable for its length and outlives the call.
                let read = unsafe {
                    libc::recv(
                        guard.get_inner().as_raw_fd(),
                        buffer.as_mut_ptr().cast(),
                        buffer.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if read > 0 {
                    seen = true;
                    continue;
                }
                let error = io::Error::last_os_error();
                match error.raw_os_error() {
                    Some(libc::EAGAIN) => break,
                    Some(libc::ENOBUFS) => seen = true,
                    Some(libc::EINTR) => {}
                    _ if read == 0 => break,
                    _ => return Err(error),
                }
            }
            guard.clear_ready();
            if seen {
                return Ok(());
            }
        }
    }
}
