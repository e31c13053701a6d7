//! `--to-ports`: upstream's interval syntax, and the SNAT port ranges the datapath uses.
//!
//! Upstream parses the flag loosely (no range check: `70000` is accepted and only fails later
//! in iptables-restore). masq renders the rules from the text exactly as upstream would, but
//! refuses ranges the datapath cannot honour before it starts, with a message that says why.

use masq_common::{
    ports::{PortRange, shared_snat_ranges},
    settings::MAX_PORT_RANGES,
};

use go_compat::strconv::{atoi, quote};

/// Protocols upstream applies `--to-ports` to, in rule order.
pub const TO_PORTS_PROTOCOLS: [&str; 3] = ["tcp", "udp", "sctp"];

/// One interval of `--to-ports`, with Go `int` bounds as upstream parses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// First port.
    pub first: i64,
    /// Last port (inclusive).
    pub last: i64,
}

impl Interval {
    /// Number of ports, zero when reversed.
    pub const fn size(&self) -> i64 {
        if self.last < self.first {
            0
        } else {
            self.last - self.first + 1
        }
    }

    /// Upstream's `Interval.String`: `42`, `42-44`, or empty when invalid.
    pub fn to_go_string(&self) -> String {
        if self.first < 0 || self.last < self.first {
            String::new()
        } else if self.first == self.last {
            self.first.to_string()
        } else {
            format!("{}-{}", self.first, self.last)
        }
    }

    fn parse(text: &str) -> Result<Self, String> {
        let parts: Vec<&str> = text.split('-').collect();
        if parts.len() > 2 {
            return Err(format!("invalid interval {}", quote(text)));
        }
        let first = atoi(parts[0])?;
        let Some(last) = parts.get(1) else {
            return Ok(Self { first, last: first });
        };
        let last = atoi(last)?;
        if first > last {
            return Err(format!("first is greater than last in {}", quote(text)));
        }
        Ok(Self { first, last })
    }
}

/// The ports masqueraded flows get, and whether the node's own sockets share them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnatPorts {
    /// The ranges, in order.
    pub ranges: Vec<PortRange>,
    /// Shared with the node (no `--to-ports`): not reserved from the node's ephemeral ports;
    /// the node's flows are left alone unless they clash with a pod's (see
    /// `masq_common::settings::SETTING_SHARED_PORTS`).
    pub shared: bool,
}

/// A parsed `--to-ports` flag.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToPorts {
    /// The intervals in the order given; overlaps are kept, as upstream does.
    pub intervals: Vec<Interval>,
}

/// `--to-ports` could not be parsed (upstream's message) or cannot be used by the datapath.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToPortsError {
    /// Upstream rejects the flag.
    #[error("Invalid --to-ports flag {}: {message}", quote(.flag))]
    Syntax {
        /// The flag's value.
        flag: String,
        /// The interval parser's message.
        message: String,
    },
    /// A port outside 1-65535.
    #[error("--to-ports interval {interval} is outside 1-65535")]
    OutOfRange {
        /// The interval as written back.
        interval: String,
    },
    /// More intervals than the datapath holds.
    #[error(
        "--to-ports lists {count} intervals; the eBPF datapath supports at most {MAX_PORT_RANGES}"
    )]
    TooManyIntervals {
        /// How many were given.
        count: usize,
    },
    /// The SNAT range would hand out NodePorts.
    #[error(
        "--to-ports interval {interval} overlaps the NodePort range {nodeports}: replies to masqueraded \
         flows would be taken for NodePort traffic; choose ports outside it (see --service-node-port-range)"
    )]
    OverlapsNodePorts {
        /// The offending interval.
        interval: String,
        /// The NodePort range.
        nodeports: PortRange,
    },
}

impl ToPorts {
    /// Upstream's `interval.ParseIntervals`: comma-separated, no trimming, order kept.
    pub fn parse(flag: &str) -> Result<Self, ToPortsError> {
        let intervals = flag
            .split(',')
            .map(Interval::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|message| ToPortsError::Syntax {
                flag: flag.to_owned(),
                message,
            })?;
        Ok(Self { intervals })
    }

    /// Total ports over all intervals.
    pub fn size(&self) -> i64 {
        self.intervals.iter().map(Interval::size).sum()
    }

    /// The port ranges the datapath allocates from: the intervals, checked against what the
    /// datapath supports and against the NodePort range, masq's alone; or, without
    /// `--to-ports`, the kernel's (1024-65535 but the NodePorts), shared with the node as
    /// conntrack shares them.
    pub fn snat_ports(&self, nodeports: PortRange) -> Result<SnatPorts, ToPortsError> {
        if self.intervals.is_empty() {
            let (ranges, count) = shared_snat_ranges(nodeports);
            return Ok(SnatPorts {
                ranges: ranges.get(..count).unwrap_or_default().to_vec(),
                shared: true,
            });
        }
        Ok(SnatPorts {
            ranges: self.snat_ranges(nodeports)?,
            shared: false,
        })
    }

    /// The intervals as the datapath's port ranges (see [`ToPorts::snat_ports`]).
    fn snat_ranges(&self, nodeports: PortRange) -> Result<Vec<PortRange>, ToPortsError> {
        if self.intervals.len() > MAX_PORT_RANGES {
            return Err(ToPortsError::TooManyIntervals {
                count: self.intervals.len(),
            });
        }
        self.intervals
            .iter()
            .map(|interval| {
                let text = interval.to_go_string();
                let first = u16::try_from(interval.first).ok().filter(|port| *port > 0);
                let last = u16::try_from(interval.last).ok();
                let (Some(first), Some(last)) = (first, last) else {
                    return Err(ToPortsError::OutOfRange { interval: text });
                };
                let range = PortRange::new(first, last);
                if range.overlaps(&nodeports) {
                    return Err(ToPortsError::OverlapsNodePorts {
                        interval: text,
                        nodeports,
                    });
                }
                Ok(range)
            })
            .collect()
    }
}

/// Parses a `first-last` range flag such as `--service-node-port-range`.
pub fn parse_port_range(text: &str) -> Result<PortRange, String> {
    let (first, last) = text
        .split_once('-')
        .ok_or_else(|| format!("{text:?} is not a range like 30000-32767"))?;
    let first: u16 = first
        .trim()
        .parse()
        .map_err(|_| format!("{first:?} is not a port"))?;
    let last: u16 = last
        .trim()
        .parse()
        .map_err(|_| format!("{last:?} is not a port"))?;
    if first > last {
        return Err(format!("{text:?}: first port is greater than last"));
    }
    Ok(PortRange::new(first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(flag: &str) -> Vec<(i64, i64)> {
        ToPorts::parse(flag)
            .map(|ports| ports.intervals.iter().map(|i| (i.first, i.last)).collect())
            .unwrap_or_default()
    }

    fn error(flag: &str) -> String {
        ToPorts::parse(flag)
            .map(|_| String::new())
            .unwrap_or_else(|error| error.to_string())
    }

    #[test]
    fn upstream_interval_cases() {
        assert_eq!(parsed("42-44,80"), [(42, 44), (80, 80)]);
        assert_eq!(parsed("42,43,44"), [(42, 42), (43, 43), (44, 44)]);
        assert_eq!(parsed("43,42"), [(43, 43), (42, 42)]);
        assert_eq!(parsed("80-88,42-44"), [(80, 88), (42, 44)]);
        assert_eq!(parsed("42-44,42-43"), [(42, 44), (42, 43)]);
        assert_eq!(parsed("42"), [(42, 42)]);
        assert_eq!(parsed("42-42"), [(42, 42)]);
        for bad in [
            "42, 43, 44",
            "42-43-44",
            "4x",
            "42-41",
            "42 - 44",
            "4x-44",
            "42-4x",
            "-44",
            "42-",
            ",",
        ] {
            assert!(ToPorts::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upstream_exit_messages() {
        assert_eq!(
            error(","),
            r#"Invalid --to-ports flag ",": strconv.Atoi: parsing "": invalid syntax"#
        );
        assert_eq!(
            error("-1"),
            r#"Invalid --to-ports flag "-1": strconv.Atoi: parsing "": invalid syntax"#
        );
        assert_eq!(
            error(" 1"),
            r#"Invalid --to-ports flag " 1": strconv.Atoi: parsing " 1": invalid syntax"#
        );
        assert_eq!(
            error("3-1"),
            r#"Invalid --to-ports flag "3-1": first is greater than last in "3-1""#
        );
        assert_eq!(
            error("1-2-3"),
            r#"Invalid --to-ports flag "1-2-3": invalid interval "1-2-3""#
        );
    }

    #[test]
    fn interval_strings_and_sizes() {
        let interval = |first, last| Interval { first, last };
        assert_eq!(interval(42, 44).size(), 3);
        assert_eq!(interval(42, 42).size(), 1);
        assert_eq!(interval(44, 42).size(), 0);
        assert_eq!(interval(42, 44).to_go_string(), "42-44");
        assert_eq!(interval(42, 42).to_go_string(), "42");
        assert_eq!(interval(0, 0).to_go_string(), "0");
        assert_eq!(interval(0, 42).to_go_string(), "0-42");
        assert_eq!(interval(-1, 1).to_go_string(), "");
        assert_eq!(interval(44, 42).to_go_string(), "");
        let two = ToPorts::parse("42-44,82-84").expect("valid");
        assert_eq!(two.size(), 6);
        assert_eq!(ToPorts::default().size(), 0);
    }

    #[test]
    fn snat_ranges_are_checked_for_the_datapath() {
        let nodeports = masq_common::ports::DEFAULT_NODEPORT_RANGE;
        assert_eq!(
            ToPorts::default().snat_ports(nodeports),
            Ok(SnatPorts {
                ranges: vec![PortRange::new(1024, 29_999), PortRange::new(32_768, 65_535)],
                shared: true,
            })
        );
        assert_eq!(
            ToPorts::parse("1024-29999")
                .expect("valid")
                .snat_ports(nodeports),
            Ok(SnatPorts {
                ranges: vec![PortRange::new(1024, 29_999)],
                shared: false,
            })
        );
        let ok = ToPorts::parse("1024-29999,32768-65535").expect("valid");
        assert_eq!(
            ok.snat_ranges(nodeports),
            Ok(vec![
                PortRange::new(1024, 29_999),
                PortRange::new(32_768, 65_535)
            ])
        );
        let too_high = ToPorts::parse("60000-70000").expect("upstream accepts it");
        assert_eq!(
            too_high
                .snat_ranges(nodeports)
                .map_err(|error| error.to_string()),
            Err("--to-ports interval 60000-70000 is outside 1-65535".to_owned())
        );
        assert!(
            ToPorts::parse("0-100")
                .expect("valid")
                .snat_ranges(nodeports)
                .is_err()
        );
        let nodeport = ToPorts::parse("29000-30500").expect("valid");
        assert!(matches!(
            nodeport.snat_ranges(nodeports),
            Err(ToPortsError::OverlapsNodePorts { .. })
        ));
        let many = ToPorts::parse("1,2,3,4,5,6,7,8,9").expect("valid");
        assert!(matches!(
            many.snat_ranges(nodeports),
            Err(ToPortsError::TooManyIntervals { count: 9 })
        ));
    }

    #[test]
    fn port_range_flag() {
        assert_eq!(
            parse_port_range("30000-32767"),
            Ok(PortRange::new(30_000, 32_767))
        );
        assert!(parse_port_range("30000").is_err());
        assert!(parse_port_range("5-1").is_err());
    }
}
