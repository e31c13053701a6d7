//! Remote endpoints running out of node ports: a remote can hold one flow per port of the
//! ranges (for each node address), so one that most of them are in use towards refuses new
//! flows soon. The operator hears of each once, when it fills up, not at every collection.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
};

use super::gc::GcReports;

/// From this share of its node ports in use (in percent), a remote endpoint is warned about,
/// once: new flows towards it are refused once all are taken.
const CROWDED_PERCENT: u32 = 80;
/// Below this share a warned remote is forgotten, so that it is warned about again if it
/// fills up again (a margin, so that a remote hovering at the mark warns once).
const UNCROWDED_PERCENT: u32 = 70;

/// A remote endpoint: the node address its flows leave with, the remote, the IP protocol.
type RemoteId = (IpAddr, SocketAddr, u8);

/// The remote endpoints warned about for having [`CROWDED_PERCENT`] of their node ports in
/// use, until they fall below [`UNCROWDED_PERCENT`] again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrowdedRemotes {
    warned: BTreeSet<RemoteId>,
}

impl CrowdedRemotes {
    /// Warns about each remote endpoint the collection found crowded that was not warned
    /// about yet, and returns them.
    pub fn warn_of(&mut self, report: &GcReports) -> Vec<RemoteId> {
        let mut still_crowded = BTreeSet::new();
        let mut warned = Vec::new();
        for family in [&report.ipv4, &report.ipv6] {
            for remote in &family.busiest_remotes {
                let id = (remote.node, remote.remote, remote.protocol);
                let percent = remote.percent(family.ports_per_remote);
                if percent >= UNCROWDED_PERCENT && self.warned.contains(&id) {
                    still_crowded.insert(id);
                } else if percent >= CROWDED_PERCENT {
                    still_crowded.insert(id);
                    warned.push(id);
                    tracing::warn!(
                        remote = %remote.label(),
                        node = %remote.node,
                        ports_in_use = remote.ports,
                        ports = family.ports_per_remote,
                        percent,
                        "a remote endpoint has most of its node ports in use: new flows towards it are refused once all are taken (more ports: --to-ports, or none for 1024-65535)"
                    );
                }
            }
        }
        self.warned = still_crowded;
        warned
    }
}

#[cfg(test)]
mod tests {
    use masq_common::nat::proto;

    use super::*;
    use crate::datapath::gc::RemoteUse;

    /// A report of one IPv4 remote with `ports` of 100 node ports in use.
    fn report(ports: usize) -> GcReports {
        let mut report = GcReports::default();
        report.ipv4.ports_per_remote = 100;
        report.ipv4.busiest_remotes = vec![RemoteUse {
            node: "192.0.2.1".parse().expect("an address"),
            remote: "198.51.100.1:443".parse().expect("a socket address"),
            protocol: proto::TCP,
            ports,
        }];
        report
    }

    #[test]
    fn a_crowded_remote_is_warned_about_once_until_it_empties() {
        let mut crowded = CrowdedRemotes::default();
        assert!(crowded.warn_of(&report(79)).is_empty());
        assert_eq!(crowded.warn_of(&report(80)).len(), 1);
        // Still crowded, or hovering above the lower mark: said already.
        assert!(crowded.warn_of(&report(95)).is_empty());
        assert!(crowded.warn_of(&report(70)).is_empty());
        // Below it, forgotten: filling up again is news.
        assert!(crowded.warn_of(&report(69)).is_empty());
        assert_eq!(crowded.warn_of(&report(85)).len(), 1);
    }
}
