//! How long conntrack keeps a flow in each state on this node: its `nf_conntrack_*_timeout*`
//! sysctls. masq ends flows when the iptables path would, so it reads the same values; a value
//! it cannot read (netfilter's conntrack not loaded, a sysctl this kernel lacks) keeps Linux's
//! default.

use std::path::Path;

use masq_common::flow::{Timeouts, tcp};

use crate::sys::sysctl;

/// Where each timeout lives under the sysctl directory (`/proc/sys`), in seconds.
const TCP_SYSCTLS: [(u8, &str); 9] = [
    (tcp::SYN_SENT, "nf_conntrack_tcp_timeout_syn_sent"),
    (tcp::SYN_RECV, "nf_conntrack_tcp_timeout_syn_recv"),
    (tcp::ESTABLISHED, "nf_conntrack_tcp_timeout_established"),
    (tcp::FIN_WAIT, "nf_conntrack_tcp_timeout_fin_wait"),
    (tcp::CLOSE_WAIT, "nf_conntrack_tcp_timeout_close_wait"),
    (tcp::LAST_ACK, "nf_conntrack_tcp_timeout_last_ack"),
    (tcp::TIME_WAIT, "nf_conntrack_tcp_timeout_time_wait"),
    (tcp::CLOSE, "nf_conntrack_tcp_timeout_close"),
    // conntrack's SYN_SENT2 (simultaneous open) shares SYN_SENT's timeout.
    (tcp::SYN_SENT2, "nf_conntrack_tcp_timeout_syn_sent"),
];

/// conntrack's timeouts as this node sets them, `sysctl_dir` standing for `/proc/sys`.
pub fn of_node(sysctl_dir: &Path) -> Timeouts {
    let read = |name: &str, default: u64| -> u64 {
        sysctl::read(sysctl_dir, &format!("net/netfilter/{name}"))
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .map_or(default, |seconds| seconds.saturating_mul(1_000_000_000))
    };
    let defaults = Timeouts::LINUX_DEFAULTS;
    let mut timeouts = defaults;
    for (state, name) in TCP_SYSCTLS {
        let state = usize::from(state);
        if let (Some(slot), Some(&default)) = (timeouts.tcp.get_mut(state), defaults.tcp.get(state))
        {
            *slot = read(name, default);
        }
    }
    // A connection not yet past its handshake (conntrack's NONE) is held as SYN_SENT.
    timeouts.tcp[usize::from(tcp::NONE)] = timeouts.tcp[usize::from(tcp::SYN_SENT)];
    timeouts.tcp_unacknowledged = read(
        "nf_conntrack_tcp_timeout_unacknowledged",
        defaults.tcp_unacknowledged,
    );
    timeouts.udp = read("nf_conntrack_udp_timeout", defaults.udp);
    timeouts.udp_stream = read("nf_conntrack_udp_timeout_stream", defaults.udp_stream);
    timeouts.icmp = read("nf_conntrack_icmp_timeout", defaults.icmp);
    timeouts.generic = read("nf_conntrack_generic_timeout", defaults.generic);
    timeouts
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn the_nodes_values_replace_the_defaults_and_missing_ones_keep_them() {
        let dir = tempfile::tempdir().expect("a directory");
        let netfilter = dir.path().join("net/netfilter");
        fs::create_dir_all(&netfilter).expect("creating it");
        fs::write(
            netfilter.join("nf_conntrack_tcp_timeout_established"),
            "7200\n",
        )
        .expect("writing");
        fs::write(netfilter.join("nf_conntrack_tcp_timeout_syn_sent"), "60\n").expect("writing");
        fs::write(netfilter.join("nf_conntrack_udp_timeout"), "not a number\n").expect("writing");

        let timeouts = of_node(dir.path());
        let second = 1_000_000_000;
        let defaults = Timeouts::LINUX_DEFAULTS;
        assert_eq!(timeouts.tcp[usize::from(tcp::ESTABLISHED)], 7200 * second);
        assert_eq!(timeouts.tcp[usize::from(tcp::SYN_SENT)], 60 * second);
        assert_eq!(timeouts.tcp[usize::from(tcp::SYN_SENT2)], 60 * second);
        assert_eq!(timeouts.tcp[usize::from(tcp::NONE)], 60 * second);
        assert_eq!(
            timeouts.udp, defaults.udp,
            "an unreadable value keeps the default"
        );
        assert_eq!(timeouts.udp_stream, defaults.udp_stream);
        assert_eq!(of_node(&dir.path().join("absent")), defaults);
    }
}
