//! What the agent knows about itself, shared with the metrics and health endpoints.

use std::{
    net::Ipv4Addr,
    sync::{Arc, Mutex, MutexGuard},
    time::SystemTime,
};

use masq_common::flow::FlowClass;

use crate::{datapath::gc::GcReports, node::uplinks::UplinkIpv6};

/// A snapshot of the agent's state.
#[derive(Clone, Debug, Default)]
pub struct AgentStatus {
    /// The datapath is attached and a valid config (or adopted state) is in force.
    pub ready: bool,
    /// Why it is not ready, when it is not.
    pub not_ready_reason: Option<String>,
    /// The interfaces masq translates on.
    pub uplinks: Vec<UplinkStatus>,
    /// An upstream ip-masq-agent chain found installed next to masq (it masquerades first).
    pub upstream_chain: Option<String>,
    /// Human-readable origin of the config in force.
    pub config_origin: Option<String>,
    /// The CIDRs of each list in force, per family.
    pub list_cidrs: ListCidrs,
    /// Entries in the datapath's non-masquerade trie.
    pub trie_entries: usize,
    /// Successful config loads.
    pub reloads_ok: u64,
    /// Failed config loads.
    pub reloads_failed: u64,
    /// The last load error, kept until a load succeeds.
    pub last_error: Option<ConfigFailure>,
    /// When the last load succeeded.
    pub last_success: Option<SystemTime>,
    /// When the last load failed.
    pub last_failure: Option<SystemTime>,
    /// Capacity of the NAT table in entries.
    pub nat_capacity: u32,
    /// Capacity of the IPv6 NAT table in entries (1 without `--enable-ipv6`).
    pub nat_capacity_v6: u32,
    /// The last garbage collection.
    pub last_gc: GcReports,
    /// Flows removed by garbage collection since start.
    pub gc_expired_total: u64,
    /// Flows the collector retired early to keep room free (the table over 95 % full) since
    /// start, by family (IPv4, IPv6) and class (`FlowClass` as index).
    pub gc_reclaimed_total: [[u64; FlowClass::ALL.len()]; 2],
    /// The unassured flows each local address may hold, by family (IPv4, IPv6); 0: no limit.
    pub pod_share: [u32; 2],
    /// When the agent started.
    pub started: Option<SystemTime>,
    /// Whether the pinned state was adopted from a previous agent.
    pub adopted: bool,
    /// The kernel the datapath was loaded into, once it is.
    pub kernel: Option<KernelStatus>,
    /// What the last look at the node's IPsec policies found; `None` before the first (eBPF
    /// backend only).
    pub ipsec: Option<IpsecStatus>,
}

/// How many CIDRs each list of the config in force holds, as `[IPv4, IPv6]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListCidrs {
    /// `nonMasqueradeCIDRs` (or the defaults).
    pub non_masquerade: [usize; 2],
    /// `masqueradeCIDRs`.
    pub masquerade: [usize; 2],
    /// `nonMasqueradeSrcCIDRs`.
    pub non_masquerade_src: [usize; 2],
}

impl ListCidrs {
    /// The sizes of `config`'s lists.
    pub fn of(config: &crate::config::source::EffectiveConfig) -> Self {
        let count = |list: &[crate::config::source::SourcedCidr]| {
            let v6 = list
                .iter()
                .filter(|sourced| sourced.cidr.family() == crate::config::cidr::Family::Ipv6)
                .count();
            [list.len() - v6, v6]
        };
        Self {
            non_masquerade: count(&config.cidrs),
            masquerade: count(&config.masquerade_cidrs),
            non_masquerade_src: count(&config.non_masquerade_src_cidrs),
        }
    }
}

/// The node's XFRM output policies that select masqueraded traffic only after translation
/// (see [`crate::ipsec`]): MASQUERADE's second lookup would have applied them, masq's
/// translation comes after the only one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IpsecStatus {
    /// The policies were read; these are bypassed (none: nothing leaks).
    Checked(Vec<BypassedPolicy>),
    /// The policies could not be read: bypassed ones would go unnoticed.
    Unknown(String),
}

/// One bypassed policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BypassedPolicy {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// The policy and the address it selects, in words.
    pub description: String,
}

/// The kernel the datapath runs on, and what its verifier made of the programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelStatus {
    /// The kernel's release (`uname -r`).
    pub release: String,
    /// The attach mode of new attachments on this kernel.
    pub attach_mode: &'static str,
    /// Instructions the verifier processed for each program (`None` before Linux 5.16).
    pub verified_sizes: Vec<(&'static str, Option<u32>)>,
}

/// Why the last config load failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigFailure {
    /// A fixed word for metrics: read, syntax, decode, invalid, empty, capacity, apply.
    pub reason: &'static str,
    /// The error, bounded in length.
    pub message: String,
}

/// One interface masq translates on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UplinkStatus {
    /// The interface.
    pub interface: String,
    /// The address IPv4 traffic leaving by it is masqueraded to; `None` when the interface has
    /// no IPv4 address (an IPv6-only uplink: IPv4 to be masqueraded is dropped).
    pub node_ip: Option<Ipv4Addr>,
    /// `tcx` or `tc`.
    pub attach_mode: &'static str,
    /// Whether `node_ip` is an address of the interface (a `--node-ip` may not be).
    pub address_is_local: bool,
    /// What IPv6 traffic leaving by it is masqueraded to.
    pub ipv6: UplinkIpv6,
}

/// The status behind a lock, cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct SharedStatus(Arc<Mutex<AgentStatus>>);

impl SharedStatus {
    /// Locks the status; a panic while holding the lock does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, AgentStatus> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the current status.
    pub fn snapshot(&self) -> AgentStatus {
        self.lock().clone()
    }
}
