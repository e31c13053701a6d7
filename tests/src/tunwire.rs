//! A wire made of two tun devices, one in each of two namespaces, whose packets this process
//! carries from one to the other: an uplink without a link-layer header (veth pairs are
//! Ethernet), as WireGuard, IP tunnels and VPN clients give a node.

use std::{
    fs::OpenOptions,
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, OwnedFd},
        unix::fs::OpenOptionsExt as _,
    },
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::netns::Netns;

/// The two tun devices and the thread that carries packets between them; dropping it stops the
/// thread and removes both devices (they live as long as their descriptors).
#[derive(Debug)]
pub struct TunWire {
    stop: Arc<AtomicBool>,
    relay: Option<JoinHandle<()>>,
}

impl TunWire {
    /// Creates tun device `a_name` in `a` and `b_name` in `b` (both down and unaddressed) and
    /// starts carrying packets between them.
    pub fn new(a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> Self {
        let open = |netns: &Netns, name: &str| {
            netns
                .enter(|| open_tun(name))
                .unwrap_or_else(|error| panic!("creating tun device {name}: {error}"))
        };
        let ends = [open(a, a_name), open(b, b_name)];
        let stop = Arc::new(AtomicBool::new(false));
        let relay = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || carry(&ends, &stop))
        };
        Self {
            stop,
            relay: Some(relay),
        }
    }
}

impl Drop for TunWire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(relay) = self.relay.take() {
            let _ = relay.join();
        }
    }
}

/// Opens `/dev/net/tun` as a new tun device `name` (IP packets, no packet-information
/// header) in the calling thread's namespace.
fn open_tun(name: &str) -> io::Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")?;
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (slot, byte) in request
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *slot = byte as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads the ifreq, which lives across the call.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &raw mut request) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OwnedFd::from(file))
}

/// Copies every packet read from one end to the other until `stop`, checking it ten times a
/// second.
fn carry(ends: &[OwnedFd; 2], stop: &AtomicBool) {
    let mut buffer = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) {
        let mut polled = [
            PollFd::new(ends[0].as_fd(), PollFlags::POLLIN),
            PollFd::new(ends[1].as_fd(), PollFlags::POLLIN),
        ];
        if poll(&mut polled, PollTimeout::from(100_u8)).is_err() {
            continue;
        }
        let readable: Vec<bool> = polled
            .iter()
            .map(|fd| {
                fd.revents()
                    .is_some_and(|events| events.contains(PollFlags::POLLIN))
            })
            .collect();
        for (from, to) in [(0, 1), (1, 0)] {
            if !readable[from] {
                continue;
            }
            // Everything queued, a packet per read; a device that is down refuses writes,
            // and the packet is lost, as on a wire.
            while let Ok(length) = nix::unistd::read(&ends[from], &mut buffer) {
                if length == 0 {
                    break;
                }
                let _ = nix::unistd::write(&ends[to], &buffer[..length]);
            }
        }
    }
}
