//! The node's memory, as the kernel reports it (`sysinfo(2)`), and how much of it this process
//! may lock (`RLIMIT_MEMLOCK`).

use std::io;

/// Bytes of memory the node has.
pub fn total_memory() -> io::Result<u64> {
    // SAFETY: `sysinfo` is plain old data; all zeroes is a valid value.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, writable `sysinfo` struct, and the call writes only into it.
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(info.totalram.saturating_mul(u64::from(info.mem_unit)))
}

/// This process's soft `RLIMIT_MEMLOCK` in bytes; `None` if unlimited.
pub(crate) fn memlock_limit() -> io::Result<Option<u64>> {
    use nix::sys::resource::{RLIM_INFINITY, Resource, getrlimit};
    let (soft, _) = getrlimit(Resource::RLIMIT_MEMLOCK)?;
    Ok((soft != RLIM_INFINITY).then_some(soft))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_node_reports_its_memory() {
        let memory = total_memory().unwrap();
        assert!(memory > 64 << 20, "{memory} bytes");
    }
}
