//! The packet generator: prebuilt Ethernet frames pushed into a pod's interface through an
//! `AF_PACKET` socket with `sendmmsg`, bypassing the qdisc layer.
//!
//! The generator must never be what limits a figure, or every mode looks alike and the cheapest
//! path is flattered. So nothing is built while sending (frames are made beforehand), each
//! system call carries a batch of frames, and the frames enter the node through a veth whose
//! receive side runs in its own NAPI thread on another core (see `paths`): the generator's core
//! only copies frames into the veth's ring, and the path under test runs elsewhere. When the path
//! is slower, the ring is full and `sendmsg` says `ENOBUFS`: such frames are counted as rejected,
//! cost the path nothing, and show that the generator outran it.

use std::{
    fs::File,
    io::Read as _,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use masq_testbed::netns::Netns;

use crate::frames::Frame;

/// Frames per `sendmmsg` call: enough to amortize the system call, few enough to stop on time.
const BATCH: usize = 64;

/// `SOL_PACKET` socket option: hand frames straight to the driver (no qdisc, as a NIC's
/// own generator would).
const PACKET_QDISC_BYPASS: libc::c_int = 20;

/// What one sending run did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sent {
    /// Frames the kernel took.
    pub(crate) accepted: u64,
    /// Frames refused because the next hop's ring was full (`ENOBUFS`): the path is slower.
    pub(crate) rejected: u64,
    /// Wall time of the run.
    pub(crate) elapsed: Duration,
}

/// An `AF_PACKET` socket bound to one interface of one namespace.
#[derive(Debug)]
pub(crate) struct PacketTx {
    fd: OwnedFd,
}

impl PacketTx {
    /// A socket sending on `device` inside `netns`. It receives nothing (protocol 0), so it
    /// costs no copies of the traffic it generates.
    pub(crate) fn open(netns: &Netns, device: &str) -> Result<Self> {
        let device = device.to_owned();
        netns.enter(move || Self::open_here(&device))
    }

    fn open_here(device: &str) -> Result<Self> {
        // SAFETY: plain socket creation; the descriptor is owned right below.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error()).context("AF_PACKET socket");
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        set_option(&fd, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1)
            .context("PACKET_QDISC_BYPASS")?;
        // A frame stays charged to the socket until the receiving NAPI thread consumes it; a
        // large buffer lets the veth ring, not the socket, decide when the path is full.
        set_option(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &(16 << 20))
            .context("SO_SNDBUFFORCE")?;
        let index = nix::net::if_::if_nametoindex(device)
            .with_context(|| format!("no interface {device}"))?;
        // SAFETY: sockaddr_ll is plain data; zero is a valid starting value.
        let mut address: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        address.sll_family = libc::AF_PACKET as u16;
        address.sll_ifindex = i32::try_from(index)?;
        // SAFETY: `address` is a valid sockaddr_ll of the size passed.
        let bound = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::from_ref(&address).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if bound != 0 {
            return Err(std::io::Error::last_os_error()).context("binding the AF_PACKET socket");
        }
        Ok(Self { fd })
    }

    /// Sends `frames` until `deadline`: over and over with `cycle`, else once at most.
    pub(crate) fn send(&self, frames: &[Frame], cycle: bool, deadline: Instant) -> Result<Sent> {
        self.send_paced(frames, cycle, deadline, None)
    }

    /// Like [`PacketTx::send`], at most `rate` frames per second when given: slower than the
    /// path, so that (nearly) every frame gets through, which is what filling a table needs.
    pub(crate) fn send_paced(
        &self,
        frames: &[Frame],
        cycle: bool,
        deadline: Instant,
        rate: Option<f64>,
    ) -> Result<Sent> {
        if frames.is_empty() {
            bail!("nothing to send");
        }
        let started = Instant::now();
        let mut sent = Sent::default();
        let mut next = 0usize;
        // SAFETY: zeroed iovec and mmsghdr are valid (null pointers, zero lengths); each entry
        // is filled before it is handed to the kernel.
        let mut iovecs: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut messages: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        loop {
            if next == frames.len() {
                if !cycle {
                    break;
                }
                next = 0;
            }
            if Instant::now() >= deadline {
                break;
            }
            if let Some(rate) = rate {
                let due = started
                    + Duration::from_secs_f64((sent.accepted + sent.rejected) as f64 / rate);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
            let count = BATCH.min(frames.len() - next);
            for slot in 0..count {
                iovecs[slot] = libc::iovec {
                    iov_base: frames[next + slot].as_ptr().cast_mut().cast(),
                    iov_len: frames[next + slot].len(),
                };
                messages[slot].msg_hdr.msg_iov = &raw mut iovecs[slot];
                messages[slot].msg_hdr.msg_iovlen = 1;
            }
            // SAFETY: `messages[..count]` point at `iovecs[..count]`, which point at frames
            // that outlive the call; the kernel only reads them.
            let done = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    messages.as_mut_ptr(),
                    u32::try_from(count)?,
                    0,
                )
            };
            if done < 0 {
                let error = std::io::Error::last_os_error();
                match error.raw_os_error() {
                    // The first frame of the batch found the ring full: skip it.
                    Some(libc::ENOBUFS | libc::EAGAIN) => {
                        sent.rejected += 1;
                        next += 1;
                    }
                    _ => return Err(error).context("sendmmsg"),
                }
            } else {
                // The batch stops at the first refused frame; that frame is skipped, not
                // retried, so a full ring never makes the generator wait on it.
                let done = usize::try_from(done)?;
                sent.accepted += done as u64;
                next += done;
                if done < count {
                    sent.rejected += 1;
                    next += 1;
                }
            }
        }
        sent.elapsed = started.elapsed();
        Ok(sent)
    }
}

/// `setsockopt(fd, level, name, value)`.
pub(crate) fn set_option<T>(
    fd: &impl std::os::fd::AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> std::io::Result<()> {
    // SAFETY: `value` is a valid T of the size passed, read by the kernel only.
    let result = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            std::ptr::from_ref(value).cast(),
            libc::socklen_t::try_from(size_of::<T>()).unwrap_or(0),
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The receive counter of one interface in another namespace, read without spawning anything:
/// `/proc/thread-self/net/dev` opened from a thread inside that namespace keeps showing that
/// namespace's devices.
#[derive(Debug)]
pub(crate) struct RxCounter {
    file: File,
    device: String,
}

impl RxCounter {
    /// The counter of `device` in `netns`.
    pub(crate) fn open(netns: &Netns, device: &str) -> Result<Self> {
        let file = netns
            .enter(|| File::open("/proc/thread-self/net/dev"))
            .context("opening /proc/thread-self/net/dev")?;
        let counter = Self {
            file,
            device: device.to_owned(),
        };
        counter.packets()?;
        Ok(counter)
    }

    /// Packets the interface received so far.
    pub(crate) fn packets(&self) -> Result<u64> {
        let mut text = String::with_capacity(2048);
        // A seq_file restarts from its beginning when read from offset 0.
        let mut file = &self.file;
        std::io::Seek::rewind(&mut file)?;
        file.read_to_string(&mut text)?;
        let prefix = format!("{}:", self.device);
        text.lines()
            .find_map(|line| {
                let rest = line.trim_start().strip_prefix(&prefix)?;
                // rx bytes, rx packets, ...
                rest.split_whitespace().nth(1)?.parse().ok()
            })
            .with_context(|| format!("no {} in /proc/net/dev", self.device))
    }
}
