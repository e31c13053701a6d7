//! Keeping the node's own sockets out of the SNAT port range.
//!
//! The node and its masqueraded pods share one address. If a node socket picked an ephemeral
//! port that masq also hands out towards the same remote endpoint, replies would reach the wrong
//! party. Linux never auto-binds ports listed in `net.ipv4.ip_local_reserved_ports`, so the agent
//! adds the SNAT ranges there (remembering what it added, so `masq uninstall` removes exactly
//! that). Sockets that bind such a port explicitly are tracked by the datapath instead.

use std::path::Path;

use masq_common::ports::PortRange;

use crate::sys::sysctl;
pub use crate::sys::sysctl::{DEFAULT_SYSCTL_DIR, SysctlError};

const RESERVED_PORTS: &str = "net/ipv4/ip_local_reserved_ports";
const EPHEMERAL_PORTS: &str = "net/ipv4/ip_local_port_range";

/// Parses a kernel port list such as `1024-29999,32768`.
pub fn parse_port_list(text: &str) -> Vec<PortRange> {
    let ranges = text
        .trim()
        .split(',')
        .filter(|item| !item.is_empty())
        .filter_map(|item| {
            let (first, last) = item.split_once('-').unwrap_or((item, item));
            Some(PortRange::new(
                first.trim().parse().ok()?,
                last.trim().parse().ok()?,
            ))
        })
        .collect();
    normalize(ranges)
}

/// Writes ranges the way the kernel accepts them.
pub fn format_port_list(ranges: &[PortRange]) -> String {
    normalize(ranges.to_vec())
        .iter()
        .map(|range| {
            if range.first == range.last {
                range.first.to_string()
            } else {
                format!("{}-{}", range.first, range.last)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Sorts and merges overlapping or adjacent ranges; drops empty ones.
pub fn normalize(mut ranges: Vec<PortRange>) -> Vec<PortRange> {
    ranges.retain(|range| range.size() > 0);
    ranges.sort();
    let mut merged: Vec<PortRange> = Vec::with_capacity(ranges.len());
    for range in ranges {
        match merged.last_mut() {
            Some(last) if u32::from(range.first) <= u32::from(last.last) + 1 => {
                last.last = last.last.max(range.last);
            }
            _ => merged.push(range),
        }
    }
    merged
}

/// The ports of `wanted` not already in `present`.
pub fn difference(wanted: &[PortRange], present: &[PortRange]) -> Vec<PortRange> {
    let present = normalize(present.to_vec());
    let mut result = Vec::new();
    for range in normalize(wanted.to_vec()) {
        let mut start = u32::from(range.first);
        let end = u32::from(range.last);
        for taken in &present {
            let (taken_first, taken_last) = (u32::from(taken.first), u32::from(taken.last));
            if taken_last < start || taken_first > end {
                continue;
            }
            if taken_first > start {
                result.push(port_range(start, taken_first - 1));
            }
            start = taken_last + 1;
            if start > end {
                break;
            }
        }
        if start <= end {
            result.push(port_range(start, end));
        }
    }
    result
}

fn port_range(first: u32, last: u32) -> PortRange {
    PortRange::new(
        u16::try_from(first).unwrap_or(u16::MAX),
        u16::try_from(last).unwrap_or(u16::MAX),
    )
}

/// The node's ephemeral port range, read under `sysctl_dir` (normally `/proc/sys`).
pub fn ephemeral_range(sysctl_dir: &Path) -> Result<PortRange, SysctlError> {
    let text = sysctl::read(sysctl_dir, EPHEMERAL_PORTS)?;
    let mut numbers = text
        .split_whitespace()
        .filter_map(|number| number.parse::<u16>().ok());
    match (numbers.next(), numbers.next()) {
        (Some(first), Some(last)) => Ok(PortRange::new(first, last)),
        _ => Err(SysctlError::unparsable(sysctl_dir, EPHEMERAL_PORTS, &text)),
    }
}

/// The currently reserved ports.
pub fn reserved(sysctl_dir: &Path) -> Result<Vec<PortRange>, SysctlError> {
    Ok(parse_port_list(&sysctl::read(sysctl_dir, RESERVED_PORTS)?))
}

/// Adds `ranges` to the reserved ports and returns what was not reserved before.
pub fn reserve(sysctl_dir: &Path, ranges: &[PortRange]) -> Result<Vec<PortRange>, SysctlError> {
    let present = reserved(sysctl_dir)?;
    let added = difference(ranges, &present);
    if !added.is_empty() {
        let mut all = present;
        all.extend_from_slice(&added);
        sysctl::write(sysctl_dir, RESERVED_PORTS, &format_port_list(&all))?;
    }
    Ok(added)
}

/// Removes `ranges` (what [`reserve`] added) from the reserved ports.
pub fn release(sysctl_dir: &Path, ranges: &[PortRange]) -> Result<(), SysctlError> {
    if ranges.is_empty() {
        return Ok(());
    }
    let present = reserved(sysctl_dir)?;
    let remaining = difference(&present, ranges);
    if remaining != present {
        sysctl::write(sysctl_dir, RESERVED_PORTS, &format_port_list(&remaining))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn r(first: u16, last: u16) -> PortRange {
        PortRange::new(first, last)
    }

    #[test]
    fn lists_parse_and_format() {
        assert_eq!(
            parse_port_list("1024-29999,32768\n"),
            [r(1024, 29_999), r(32_768, 32_768)]
        );
        assert_eq!(parse_port_list(""), []);
        assert_eq!(parse_port_list("5,4,3-4"), [r(3, 5)]);
        assert_eq!(
            format_port_list(&[r(80, 80), r(1024, 2047), r(2048, 3000)]),
            "80,1024-3000"
        );
        assert_eq!(format_port_list(&[]), "");
    }

    #[test]
    fn reserve_and_release_touch_only_what_masq_added() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ipv4 = dir.path().join("net/ipv4");
        fs::create_dir_all(&ipv4).expect("mkdir");
        fs::write(ipv4.join("ip_local_reserved_ports"), "8080,20000\n").expect("write");
        fs::write(ipv4.join("ip_local_port_range"), "32768\t60999\n").expect("write");
        assert_eq!(
            ephemeral_range(dir.path()).expect("range"),
            r(32_768, 60_999)
        );
        let added = reserve(dir.path(), &[r(1024, 29_999)]).expect("reserve");
        assert_eq!(added, [r(1024, 8079), r(8081, 19_999), r(20_001, 29_999)]);
        assert_eq!(reserved(dir.path()).expect("read"), [r(1024, 29_999)]);
        release(dir.path(), &added).expect("release");
        assert_eq!(
            reserved(dir.path()).expect("read"),
            [r(8080, 8080), r(20_000, 20_000)]
        );
    }

    #[test]
    fn difference_keeps_what_is_new() {
        assert_eq!(difference(&[r(1024, 29_999)], &[]), [r(1024, 29_999)]);
        assert_eq!(
            difference(&[r(1024, 29_999)], &[r(8080, 8080), r(9090, 9091)]),
            [r(1024, 8079), r(8081, 9089), r(9092, 29_999)]
        );
        assert_eq!(difference(&[r(10, 20)], &[r(0, 100)]), []);
        assert_eq!(difference(&[r(10, 20)], &[r(15, 30)]), [r(10, 14)]);
        assert_eq!(
            difference(&[r(0, 65_535)], &[r(0, 0), r(65_535, 65_535)]),
            [r(1, 65_534)]
        );
    }
}
