//! The iptables backend: upstream's rules, applied the upstream way. A fallback for nodes where
//! eBPF cannot run, and the reference the eBPF backend is compared against.

use super::{AgentError, AgentOptions, Backend};
use crate::{
    config::cidr::Family,
    iptables::{
        apply::Iptables,
        render::{RuleOptions, restore_input},
    },
    policy::Policy,
};

/// iptables for IPv4 and, with `--enable-ipv6`, ip6tables.
pub(super) struct IptablesBackend {
    ipv4: Iptables,
    ipv6: Option<Iptables>,
    synced: bool,
}

impl IptablesBackend {
    /// Detects the iptables versions (and with them `--random-fully` support).
    pub(super) fn start(options: &AgentOptions) -> Result<Self, AgentError> {
        let ipv4 = Iptables::detect(Family::Ipv4)?;
        let ipv6 = if options.enable_ipv6 {
            Some(Iptables::detect(Family::Ipv6)?)
        } else {
            None
        };
        tracing::info!(version = %ipv4.version, random_fully = ipv4.has_random_fully, chain = %options.upstream_chain.chain, "iptables backend");
        Ok(Self {
            ipv4,
            ipv6,
            synced: false,
        })
    }
}

impl Backend for IptablesBackend {
    /// Whether rules were written at least once.
    fn enabled(&self) -> bool {
        self.synced
    }

    /// Rewrites the chain for each family, as upstream does on every sync (which also repairs
    /// tampering).
    fn apply(
        &mut self,
        policy: &Policy,
        options: &AgentOptions,
        _trigger: &'static str,
    ) -> Result<usize, AgentError> {
        for (family, iptables) in [
            (Family::Ipv4, Some(&self.ipv4)),
            (Family::Ipv6, self.ipv6.as_ref()),
        ] {
            let Some(iptables) = iptables else {
                continue;
            };
            let rules = RuleOptions {
                chain: options.upstream_chain.chain.clone(),
                random_fully: options.random_fully && iptables.has_random_fully,
                to_ports: options.to_ports.clone(),
            };
            iptables.sync(
                &options.upstream_chain.chain,
                &restore_input(policy, family, &rules),
            )?;
        }
        self.synced = true;
        Ok(policy.rules(Family::Ipv4).len() + policy.rules(Family::Ipv6).len())
    }

    fn left_in_place(&self) -> &'static str {
        "the iptables rules stay in place"
    }
}
