//! Taking over from upstream ip-masq-agent: its chain (`IP-MASQ-AGENT` by default) masquerades
//! every new flow before masq's programs see it, so masq refuses to run next to it unless told
//! to take over, and then removes the chain and its POSTROUTING jumps. A reconciled
//! ip-masq-agent (AKS, GKE) recreates the chain, so it is looked for again at every resync.

use std::sync::atomic::{AtomicBool, Ordering};

use super::apply::{Iptables, IptablesError};
use crate::{causes::WithCauses, config::cidr::Family};

/// What the agent does about upstream's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeOverOptions {
    /// The chain's name (`--masq-chain`).
    pub chain: String,
    /// Remove the chain instead of refusing to start next to it (`--take-over-iptables`).
    pub take_over: bool,
}

/// Why upstream's chain stays in masq's way.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    /// The chain is installed and taking over was not asked for.
    #[error(
        "an ip-masq-agent chain {chain} ({family}, {jumps} POSTROUTING jump(s)) is installed; masquerading \
         twice breaks flows. Remove upstream ip-masq-agent first, or start masq with --take-over-iptables \
         to delete the chain and its jumps"
    )]
    ChainPresent {
        /// The chain.
        chain: String,
        /// Where it was found.
        family: Family,
        /// How many jumps lead to it.
        jumps: usize,
    },
    /// iptables could not remove it.
    #[error(transparent)]
    Iptables(#[from] IptablesError),
}

/// What a look for the chain after startup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// No chain, nothing done.
    Absent,
    /// The chain was back and is removed now: the flows it masqueraded are masq's to take over.
    TookOver,
    /// The chain is installed and stays (named here): it masquerades pods, not masq.
    StillInstalled(String),
}

/// At startup, before anything changes: refuses to go on next to upstream's chain unless told
/// to take over. The chain itself is removed only once masq's programs are attached
/// ([`take_over`]), so that no packet of a flow it translated leaves untranslated meanwhile.
pub fn refuse_unless_taking_over(options: &TakeOverOptions) -> Result<(), TakeOverError> {
    visit_chains(options, false).map(|_| ())
}

/// Removes upstream's chain and its jumps, if it is installed and taking over was asked for
/// (else refuses, as [`refuse_unless_taking_over`]). Returns whether it removed one: the
/// caller then adopts the flows the chain masqueraded.
pub fn take_over(options: &TakeOverOptions) -> Result<bool, TakeOverError> {
    visit_chains(options, true)
}

/// Looks for upstream's chain again (a reconciled ip-masq-agent recreates it): removes it with
/// `--take-over-iptables`, and otherwise reports it, since it masquerades before masq sees the
/// packets.
pub fn recheck(options: &TakeOverOptions) -> Recheck {
    match take_over(options) {
        Ok(true) => Recheck::TookOver,
        Ok(false) => Recheck::Absent,
        Err(error) => {
            tracing::error!(chain = %options.chain, error = %WithCauses(&error), "an ip-masq-agent chain is back: pods are masqueraded by it, not by masq");
            Recheck::StillInstalled(options.chain.clone())
        }
    }
}

/// Looks for the chain in each family's nat table; refuses where it is found without
/// `take_over`, and with `remove` removes it. Returns whether any was removed.
fn visit_chains(options: &TakeOverOptions, remove: bool) -> Result<bool, TakeOverError> {
    let mut took_over = false;
    for family in [Family::Ipv4, Family::Ipv6] {
        let iptables = match Iptables::detect(family) {
            Ok(iptables) => iptables,
            Err(error) => {
                tracing::debug!(error = %WithCauses(&error), %family, "no iptables to check for an upstream chain");
                continue;
            }
        };
        let (jumps, exists) = match iptables.find_chain(&options.chain) {
            Ok(found) => found,
            Err(error) => {
                // iptables-legacy reads its tables through a raw socket: without CAP_NET_RAW
                // (the base DaemonSet does not grant it) an upstream chain there is invisible.
                // Said once, loudly, rather than at every resync or not at all.
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %WithCauses(&error), %family, "cannot list the nat table, so an ip-masq-agent chain there would go unnoticed; on iptables-legacy nodes grant CAP_NET_RAW (deploy/overlays/migrate does)");
                } else {
                    tracing::debug!(error = %WithCauses(&error), %family, "cannot list the nat table");
                }
                continue;
            }
        };
        if jumps.is_empty() && !exists {
            continue;
        }
        if !options.take_over {
            return Err(TakeOverError::ChainPresent {
                chain: options.chain.clone(),
                family,
                jumps: jumps.len(),
            });
        }
        if !remove {
            continue;
        }
        let removed = iptables.remove_chain(&options.chain)?;
        took_over = true;
        tracing::warn!(chain = %options.chain, %family, jumps = removed, "took over from iptables: removed the chain and its POSTROUTING jumps");
    }
    Ok(took_over)
}
