//! Watching the wire upstream of the node for what must never reach it: a packet with a pod's
//! address as its source, where masq should have masqueraded it.
//!
//! The watch reads every frame arriving on an interface of the router through an `AF_PACKET`
//! socket, before the router's netfilter (whose defragmentation would hold back the later
//! fragments of a datagram whose first fragment never came, the very packets looked for).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
};

use crate::netns::Netns;

/// `ETH_P_ALL`, in network order as `AF_PACKET` wants it.
const ETH_P_ALL_BE: u16 = 0x0003_u16.to_be();
/// `PACKET_OUTGOING`: a frame the router itself sends.
const PACKET_OUTGOING: u8 = 4;

/// Counts the frames arriving on one interface whose source is a pod's address, until dropped.
#[derive(Debug)]
pub struct PodSourceWatch {
    running: Arc<AtomicBool>,
    seen: Arc<AtomicU64>,
    first: Arc<std::sync::Mutex<Option<String>>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// Whether `source` is a pod's address in the sandbox (10.244.0.0/16, 2001:db8:244::/48).
fn is_pod(source: IpAddr) -> bool {
    match source {
        IpAddr::V4(address) => address.octets()[..2] == [10, 244],
        IpAddr::V6(address) => address.segments()[..3] == [0x2001, 0xdb8, 0x244],
    }
}

/// The IP source of an Ethernet frame, if it carries IPv4 or IPv6.
fn source_of(frame: &[u8]) -> Option<IpAddr> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let ip = frame.get(14..)?;
    match ethertype {
        0x0800 => {
            let octets: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(octets)))
        }
        0x86dd => {
            let octets: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

impl PodSourceWatch {
    /// Starts watching `device` of `netns`.
    pub fn start(netns: &Netns, device: &str) -> Self {
        let ifindex = netns
            .enter(|| nix::net::if_::if_nametoindex(device))
            .unwrap_or_else(|error| panic!("no {device} in {}: {error}", netns.name()));
        let running = Arc::new(AtomicBool::new(true));
        let seen = Arc::new(AtomicU64::new(0));
        let first = Arc::new(std::sync::Mutex::new(None));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (running, seen, first) = (running.clone(), seen.clone(), first.clone());
            netns.spawn(move || {
                let socket = open(ifindex);
                let _ = ready_tx.send(());
                let mut buffer = vec![0_u8; 65_536];
                while running.load(Ordering::Relaxed) {
                    let mut address: libc::sockaddr_ll = unsafe_zeroed();
                    let mut length = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>())
                        .unwrap_or(libc::socklen_t::MAX);
                    // SAFETY: the buffer and the address are valid for the lengths given.
                    let read = unsafe {
                        libc::recvfrom(
                            socket.as_raw_fd(),
                            buffer.as_mut_ptr().cast(),
                            buffer.len(),
                            0,
                            std::ptr::from_mut(&mut address).cast(),
                            &raw mut length,
                        )
                    };
                    let Ok(read) = usize::try_from(read) else {
                        // The receive timeout: look at the flag again.
                        continue;
                    };
                    if address.sll_pkttype == PACKET_OUTGOING {
                        continue;
                    }
                    if let Some(source) = buffer.get(..read).and_then(source_of)
                        && is_pod(source)
                    {
                        seen.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut first) = first.lock() {
                            first.get_or_insert_with(|| {
                                format!("{source}: {}", crate::fuzz::wire::hex(&buffer[..read]))
                            });
                        }
                    }
                }
            })
        };
        ready_rx
            .recv()
            .unwrap_or_else(|error| panic!("the watch on {device} did not start: {error}"));
        Self {
            running,
            seen,
            first,
            thread: Some(thread),
        }
    }

    /// Frames seen so far with a pod's source address, and the first of them.
    pub fn seen(&self) -> (u64, Option<String>) {
        let first = self.first.lock().ok().and_then(|first| first.clone());
        (self.seen.load(Ordering::Relaxed), first)
    }
}

impl Drop for PodSourceWatch {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An all-zero `sockaddr_ll`.
fn unsafe_zeroed() -> libc::sockaddr_ll {
    // SAFETY: `sockaddr_ll` is plain old data, valid all zero.
    unsafe { std::mem::zeroed() }
}

/// An `AF_PACKET` socket bound to interface `ifindex`, its reads giving up after 100 ms.
fn open(ifindex: u32) -> OwnedFd {
    // SAFETY: no pointers; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(ETH_P_ALL_BE),
        )
    };
    assert!(
        fd >= 0,
        "AF_PACKET socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut address = unsafe_zeroed();
    address.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or(0);
    address.sll_protocol = ETH_P_ALL_BE;
    address.sll_ifindex = i32::try_from(ifindex).unwrap_or(0);
    // SAFETY: the address is valid for its length.
    let bound = unsafe {
        libc::bind(
            socket.as_raw_fd(),
            std::ptr::from_ref(&address).cast(),
            libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or(0),
        )
    };
    assert_eq!(bound, 0, "binding: {}", std::io::Error::last_os_error());
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: the option value is valid for its length.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::from_ref(&timeout).cast(),
            libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap_or(0),
        )
    };
    assert_eq!(set, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
    socket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_sources_are_told_from_others_in_both_families() {
        let frame = |ethertype: u16, ip: &[u8]| {
            let mut frame = vec![0_u8; 12];
            frame.extend_from_slice(&ethertype.to_be_bytes());
            frame.extend_from_slice(ip);
            frame
        };
        let mut v4 = vec![0x45_u8; 20];
        v4[12..16].copy_from_slice(&[10, 244, 2, 2]);
        assert!(source_of(&frame(0x0800, &v4)).is_some_and(is_pod));
        v4[12..16].copy_from_slice(&[192, 0, 2, 1]);
        assert!(!source_of(&frame(0x0800, &v4)).is_some_and(is_pod));
        let mut v6 = vec![0x60_u8; 40];
        v6[8..24].copy_from_slice(
            &"2001:db8:244:1::2"
                .parse::<Ipv6Addr>()
                .unwrap_or(Ipv6Addr::UNSPECIFIED)
                .octets(),
        );
        assert!(source_of(&frame(0x86dd, &v6)).is_some_and(is_pod));
        assert_eq!(source_of(&frame(0x0806, &[0; 28])), None);
    }
}
