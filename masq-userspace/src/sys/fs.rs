//! What the kernel says about files and filesystems: which filesystem a file is on, which
//! filesystems are mounted where, and an exclusive lock on a directory.

use std::{fs::File, io, path::Path};

use nix::fcntl::{Flock, FlockArg};

/// The filesystem `file` is on, as its magic number (linux/magic.h), or `None` if the kernel
/// does not say.
pub(crate) fn filesystem_magic(file: &File) -> Option<u64> {
    nix::sys::statfs::fstatfs(file)
        .ok()
        .and_then(|stat| u64::try_from(stat.filesystem_type().0).ok())
}

/// Whether a filesystem of type `kind` (as `/proc/self/mounts` names it: `bpf`, `tmpfs`) is
/// mounted at `path` or at a directory above it. `false` if the mount table cannot be read.
pub(crate) fn mounted_at_or_above(path: &Path, kind: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts")
        .is_ok_and(|mounts| mount_table_has(&mounts, path, kind))
}

fn mount_table_has(mounts: &str, path: &Path, kind: &str) -> bool {
    mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let _device = fields.next();
        let (Some(mount_point), Some(mounted)) = (fields.next(), fields.next()) else {
            return false;
        };
        mounted == kind && path.starts_with(mount_point)
    })
}

/// An exclusive `flock(2)` on an open directory or file, held until the returned value is
/// dropped (or the process dies).
pub(crate) type Lock = Flock<File>;

/// Why a lock was not taken.
#[derive(Debug)]
pub(crate) enum LockRefused {
    /// Another process holds it.
    Held,
    /// The kernel refused for another reason.
    Failed(io::Error),
}

/// Takes an exclusive lock on `file` without waiting.
pub(crate) fn lock_exclusive_now(file: File) -> Result<Lock, LockRefused> {
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| match errno {
        nix::errno::Errno::EWOULDBLOCK => LockRefused::Held,
        errno => LockRefused::Failed(errno.into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "sysfs /sys sysfs rw 0 0\nbpf /sys/fs/bpf bpf rw 0 0\n";

    #[test]
    fn a_path_below_a_mount_point_is_on_it() {
        assert!(mount_table_has(
            MOUNTS,
            Path::new("/sys/fs/bpf/masq"),
            "bpf"
        ));
        assert!(mount_table_has(MOUNTS, Path::new("/sys/fs/bpf"), "bpf"));
        assert!(!mount_table_has(MOUNTS, Path::new("/sys/fs/bpffs"), "bpf"));
        assert!(!mount_table_has(MOUNTS, Path::new("/tmp/masq"), "bpf"));
    }

    #[test]
    fn a_held_lock_is_refused_to_a_second_taker() {
        let dir = std::env::temp_dir();
        let first = lock_exclusive_now(File::open(&dir).unwrap()).expect("the first lock");
        assert!(matches!(
            lock_exclusive_now(File::open(&dir).unwrap()),
            Err(LockRefused::Held)
        ));
        drop(first);
        lock_exclusive_now(File::open(&dir).unwrap()).expect("the lock once released");
    }
}
