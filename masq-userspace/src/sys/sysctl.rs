//! The kernel's sysctls, read and written as files under a sysctl directory: `/proc/sys`, or
//! where the node's is mounted in a container that cannot write its own.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// Where sysctls are read and written unless told otherwise.
pub const DEFAULT_SYSCTL_DIR: &str = "/proc/sys";

/// A sysctl could not be read or written, or its value was not what the kernel writes there.
#[derive(Debug, thiserror::Error)]
#[error("{action} {}", .path.display())]
pub struct SysctlError {
    action: &'static str,
    path: PathBuf,
    #[source]
    source: io::Error,
}

impl SysctlError {
    /// The value `text` of sysctl `name` under `dir` could not be parsed.
    pub(crate) fn unparsable(dir: &Path, name: &str, text: &str) -> Self {
        Self {
            action: "parsing",
            path: dir.join(name),
            source: io::Error::new(io::ErrorKind::InvalidData, text.trim().to_owned()),
        }
    }
}

/// The value of sysctl `name` (a path such as `net/ipv4/ip_local_port_range`) under `dir`.
pub(crate) fn read(dir: &Path, name: &str) -> Result<String, SysctlError> {
    let path = dir.join(name);
    fs::read_to_string(&path).map_err(|source| SysctlError {
        action: "reading",
        path,
        source,
    })
}

/// Sets sysctl `name` under `dir` to `value`.
pub(crate) fn write(dir: &Path, name: &str, value: &str) -> Result<(), SysctlError> {
    let path = dir.join(name);
    // An empty value is written as a newline: the kernel rejects a zero-length write.
    let value = if value.is_empty() { "\n" } else { value };
    fs::write(&path, value).map_err(|source| SysctlError {
        action: "writing",
        path,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_and_written_under_the_directory_and_errors_name_the_path() {
        let dir = tempfile::tempdir().expect("a directory");
        fs::create_dir_all(dir.path().join("net/ipv4")).expect("mkdir");
        write(dir.path(), "net/ipv4/ip_local_reserved_ports", "").expect("written");
        assert_eq!(
            read(dir.path(), "net/ipv4/ip_local_reserved_ports").ok(),
            Some("\n".to_owned())
        );
        let missing = read(dir.path(), "net/ipv4/absent").expect_err("absent");
        assert!(
            missing.to_string().starts_with("reading ")
                && missing.to_string().contains("net/ipv4/absent"),
            "{missing}"
        );
    }
}
