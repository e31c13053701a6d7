//! Noticing config changes as they happen, with inotify.
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
use tokio::io::unix::AsyncFd;

use super::async_fd::{self, OwnsItsDescriptor};

/// Lets tokio poll the inotify descriptor.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

// SAFETY: the `Inotify` owns its descriptor and closes it only when dropped.
unsafe impl OwnsItsDescriptor for InotifyFd {}

/// An inotify watch on one directory.
pub(crate) struct DirectoryWatch {
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
    pub(crate) fn new(dir: &Path) -> io::Result<Self> {
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
        Ok(Self {
            inotify: async_fd::readable(InotifyFd(inotify))?,
        })
    }

    /// Waits for the next batch of changes and consumes it.
    pub(crate) async fn changed(&mut self) -> io::Result<()> {
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
