//! The iptables backend: upstream's rules, applied the upstream way. A fallback for nodes where
//! eBPF cannot run, and the reference the eBPF backend is compared against.

use super::{AgentError, Backend};
use crate::{
    config::cidr::Family,
    iptables::{
        apply::Iptables,
        render::{RuleOptions, restore_input},
    },
    policy::Policy,
    ports::ToPorts,
};

/// How the iptables backend writes upstream's chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IptablesOptions {
    /// The chain (`--masq-chain`).
    pub chain: String,
    /// Also write the IPv6 chain, with ip6tables (`--enable-ipv6`).
    pub ipv6: bool,
    /// `--random-fully`, where iptables has it.
    pub random_fully: bool,
    /// `--to-ports` as upstream parsed it.
    pub to_ports: ToPorts,
}

/// iptables for IPv4 and, with `--enable-ipv6`, ip6tables.
pub(super) struct IptablesBackend {
    options: IptablesOptions,
    ipv4: Iptables,
    ipv6: Option<Iptables>,
    synced: bool,
}

impl IptablesBackend {
    /// Detects the iptables versions (and with them `--random-fully` support).
    pub(super) fn start(options: IptablesOptions) -> Result<Self, AgentError> {
        let ipv4 = Iptables::detect(Family::Ipv4)?;
        let ipv6 = if options.ipv6 {
            Some(Iptables::detect(Family::Ipv6)?)
        } else {
            None
        };
        tracing::info!(version = %ipv4.version, random_fully = ipv4.has_random_fully, chain = %options.chain, "iptables backend");
        Ok(Self {
            options,
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
    fn apply(&mut self, policy: &Policy, _trigger: &'static str) -> Result<usize, AgentError> {
        let options = &self.options;
        for (family, iptables) in [
            (Family::Ipv4, Some(&self.ipv4)),
            (Family::Ipv6, self.ipv6.as_ref()),
        ] {
            let Some(iptables) = iptables else {
                continue;
            };
            let rules = RuleOptions {
                chain: options.chain.clone(),
                random_fully: options.random_fully && iptables.has_random_fully,
                to_ports: options.to_ports.clone(),
            };
            iptables.sync(&options.chain, &restore_input(policy, family, &rules))?;
        }
        self.synced = true;
        Ok(policy.rules(Family::Ipv4).len() + policy.rules(Family::Ipv6).len())
    }

    fn left_in_place(&self) -> &'static str {
        "the iptables rules stay in place"
    }
}
