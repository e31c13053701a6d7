//! Handing descriptors to tokio's reactor, so that a task can wait for them to become readable:
//! the interface watch's netlink socket, the config directory's inotify instance and the
//! datapath's log ring buffer.
//!
//! Registering is unsafe since tokio 1.54 (tokio#8587): the reactor polls the raw descriptor
//! the value reports, so the value must own it, keep it open and report the same one for as
//! long as it is registered. [`OwnsItsDescriptor`] names the types known to do so, and
//! [`readable`] registers only those.

use std::{io, os::fd::AsRawFd};

use tokio::io::{Interest, unix::AsyncFd};

/// A value that owns one open descriptor from its creation until it is dropped, and always
/// reports that one from `as_raw_fd`.
///
/// # Safety
///
/// Implement it only for types that keep that promise: tokio would otherwise poll a descriptor
/// that was closed, or reused for another file.
pub(crate) unsafe trait OwnsItsDescriptor: AsRawFd {}

// SAFETY: a netlink socket owns its descriptor, closes it only when dropped, and reports it
// unchanged.
unsafe impl OwnsItsDescriptor for netlink_sys::Socket {}

// SAFETY: the logger owns its ring buffer map, whose descriptor it reports; the map stays open
// until the logger is dropped.
unsafe impl<T> OwnsItsDescriptor for aya_log::EbpfLogger<T> {}

/// `inner`, registered with the current tokio runtime for readability.
pub(crate) fn readable<T: OwnsItsDescriptor>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsItsDescriptor` promises what registering requires.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(io::Error::from)
}
