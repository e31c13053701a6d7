//! A writer of cpio archives in the "newc" format, the one Linux unpacks as an initramfs.
//!
//! Small enough to write here rather than depend on a cpio tool; entries are written with
//! owner root and time 0, so the same inputs give the same archive.

/// Mode bits of the entry types the initramfs needs.
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// A newc archive being written.
#[derive(Debug, Default)]
pub(crate) struct Archive {
    bytes: Vec<u8>,
    next_inode: u32,
}

impl Archive {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A directory (`path` relative to the archive's root, e.g. `bin`).
    pub(crate) fn directory(&mut self, path: &str) {
        self.entry(path, S_IFDIR | 0o755, 2, (0, 0), &[]);
    }

    /// A regular file with permission bits `permissions` (e.g. 0o755).
    pub(crate) fn file(&mut self, path: &str, permissions: u32, data: &[u8]) {
        self.entry(path, S_IFREG | permissions, 1, (0, 0), data);
    }

    /// A symbolic link to `target`.
    pub(crate) fn symlink(&mut self, path: &str, target: &str) {
        self.entry(path, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes());
    }

    /// A character device node.
    pub(crate) fn char_device(&mut self, path: &str, permissions: u32, major: u32, minor: u32) {
        self.entry(path, S_IFCHR | permissions, 1, (major, minor), &[]);
    }

    /// The archive: the entries and the trailer.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[]);
        self.bytes
    }

    fn entry(&mut self, name: &str, mode: u32, links: u32, device: (u32, u32), data: &[u8]) {
        self.next_inode += 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid
            0, // gid
            links,
            0, // mtime
            u32::try_from(data.len()).unwrap_or(u32::MAX),
            0, // devmajor
            0, // devminor
            device.0,
            device.1,
            u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
            0, // check
        ];
        self.bytes.extend_from_slice(b"070701");
        for field in fields {
            self.bytes
                .extend_from_slice(format!("{field:08X}").as_bytes());
        }
        self.bytes.extend_from_slice(name.as_bytes());
        self.bytes.push(0);
        self.pad();
        self.bytes.extend_from_slice(data);
        self.pad();
    }

    /// Header plus name, and data, each end on a 4-byte boundary.
    fn pad(&mut self) {
        while !self.bytes.len().is_multiple_of(4) {
            self.bytes.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8-hex-digit field `index` of the header starting at `at`.
    fn field(bytes: &[u8], at: usize, index: usize) -> u32 {
        let start = at + 6 + index * 8;
        u32::from_str_radix(std::str::from_utf8(&bytes[start..start + 8]).unwrap(), 16).unwrap()
    }

    #[test]
    fn entries_are_newc_headers_padded_to_four_bytes() {
        let mut archive = Archive::new();
        archive.file("init", 0o755, b"#!/bin/sh\n");
        archive.char_device("dev/console", 0o600, 5, 1);
        let bytes = archive.finish();

        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(field(&bytes, 0, 1), S_IFREG | 0o755);
        assert_eq!(field(&bytes, 0, 6), 10, "file size");
        assert_eq!(field(&bytes, 0, 11), 5, "name size with its NUL");
        // 110 bytes of header + "init\0" = 115, padded to 116; the data follows.
        assert_eq!(&bytes[110..115], b"init\0");
        assert_eq!(&bytes[116..126], b"#!/bin/sh\n");
        // The data ends at 126, padded to 128, where the next header starts.
        let second = 128;
        assert_eq!(&bytes[second..second + 6], b"070701");
        assert_eq!(field(&bytes, second, 0), 2, "inode");
        assert_eq!(field(&bytes, second, 1), S_IFCHR | 0o600);
        assert_eq!(field(&bytes, second, 9), 5, "rdevmajor");
        assert_eq!(field(&bytes, second, 10), 1, "rdevminor");
        assert_eq!(&bytes[second + 110..second + 122], b"dev/console\0");

        let trailer = second + 124;
        assert_eq!(&bytes[trailer + 110..trailer + 121], b"TRAILER!!!\0");
        assert!(bytes.len().is_multiple_of(4));
    }

    #[test]
    fn symlinks_hold_their_target_as_data() {
        let mut archive = Archive::new();
        archive.symlink("bin/sh", "busybox");
        let bytes = archive.finish();
        assert_eq!(field(&bytes, 0, 1), S_IFLNK | 0o777);
        assert_eq!(field(&bytes, 0, 6), 7);
        // 110 + "bin/sh\0" = 117, padded to 120.
        assert_eq!(&bytes[120..127], b"busybox");
    }
}
