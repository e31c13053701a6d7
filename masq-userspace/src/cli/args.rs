//! Argument groups shared by the commands: where the config comes from, and upstream's flags
//! (same names, same defaults, same `--flag=false` syntax as Go's `flag` package).

use std::path::PathBuf;

use clap::{ArgAction, Args};
use masq::{
    config::{
        DEFAULT_CONFIG_FILE, GoDuration,
        source::{ConfigSource, ReadOptions},
    },
    iptables::render::{DEFAULT_CHAIN, RuleOptions},
    ports::{ToPorts, ToPortsError},
};

/// Go's `strconv.ParseBool`, which upstream's boolean flags accept.
pub(crate) fn parse_go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean value {text:?}")),
    }
}

/// Where the ip-masq-agent config comes from.
#[derive(Args, Clone, Debug)]
pub(crate) struct ConfigArgs {
    /// Config file (YAML or JSON) read with kubernetes-sigs/ip-masq-agent semantics: a missing
    /// file means defaults, a bad file is rejected and the last good config stays in force.
    #[arg(long, value_name = "FILE", conflicts_with = "config_dir", default_value = DEFAULT_CONFIG_FILE)]
    pub(crate) config: PathBuf,

    /// Directory read with Azure ip-masq-agent-v2 semantics: every file named `ip-masq*`,
    /// CIDR lists unioned, booleans ORed, defaults only when no such file exists.
    #[arg(long, value_name = "DIR")]
    pub(crate) config_dir: Option<PathBuf>,
}

impl ConfigArgs {
    /// The source the arguments select.
    pub(crate) fn source(&self) -> ConfigSource {
        match &self.config_dir {
            Some(dir) => ConfigSource::Directory(dir.clone()),
            None => ConfigSource::File(self.config.clone()),
        }
    }
}

/// The flags of ip-masq-agent (and the Azure variant's `--resync-interval`).
#[derive(Args, Clone, Debug)]
pub(crate) struct UpstreamFlags {
    /// Name of nat chain for iptables masquerade rules.
    #[arg(long, value_name = "CHAIN", default_value = DEFAULT_CHAIN)]
    pub(crate) masq_chain: String,

    /// Whether to disable masquerade for all IPv4 ranges reserved by RFCs.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub(crate) nomasq_all_reserved_ranges: bool,

    /// Whether to enable IPv6.
    #[arg(long = "enable-ipv6", value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool,
          action = ArgAction::Set)]
    pub enable_ipv6: bool,

    /// Whether to add --random-fully to the masquerade rule, if the system supports it (the eBPF
    /// datapath then picks every port at random; without it the pod's port is kept when free).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_value = "true",
          default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub(crate) random_fully: bool,

    /// Masquerade to specified ports only, example: "1024-29999,32768-65535"; applicable to tcp,
    /// udp, sctp protocols. The eBPF datapath uses 1024-29999 when this is empty.
    #[arg(long, value_name = "PORTS", default_value = "")]
    pub(crate) to_ports: String,

    /// How often to refresh the config (in seconds) in --config-dir mode; with --config the
    /// file's resyncInterval applies (default 60s).
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub(crate) resync_interval: i64,
}

impl UpstreamFlags {
    /// How the config is to be read under these flags.
    pub(crate) fn read_options(&self) -> ReadOptions {
        ReadOptions {
            nomasq_all_reserved_ranges: self.nomasq_all_reserved_ranges,
            enable_ipv6: self.enable_ipv6,
            resync_interval: GoDuration::from_secs(self.resync_interval),
        }
    }

    /// `--to-ports` parsed as upstream does (an error is upstream's exit message).
    pub(crate) fn to_ports(&self) -> Result<ToPorts, ToPortsError> {
        if self.to_ports.is_empty() {
            Ok(ToPorts::default())
        } else {
            ToPorts::parse(&self.to_ports)
        }
    }

    /// What the iptables rules are rendered with.
    pub(crate) fn rule_options(&self) -> Result<RuleOptions, ToPortsError> {
        Ok(RuleOptions {
            chain: self.masq_chain.clone(),
            random_fully: self.random_fully,
            to_ports: self.to_ports()?,
        })
    }
}

/// klog's flags, which upstream DaemonSets pass (`--v=2`, `--logtostderr`). Accepted so masq
/// is a drop-in replacement; `--v` sets the log level, the others are ignored.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct KlogFlags {
    /// klog verbosity: 0-3 info, 4 and above debug.
    #[arg(long = "v", value_name = "LEVEL", global = true, hide = true)]
    pub(crate) verbosity: Option<u8>,
    #[arg(long = "logtostderr", global = true, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    logtostderr: Option<bool>,
    #[arg(long = "alsologtostderr", global = true, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    alsologtostderr: Option<bool>,
    #[arg(long = "skip_headers", global = true, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    skip_headers: Option<bool>,
    #[arg(long = "vmodule", global = true, hide = true)]
    vmodule: Option<String>,
    #[arg(long = "log_dir", global = true, hide = true)]
    log_dir: Option<String>,
    #[arg(long = "log_file", global = true, hide = true)]
    log_file: Option<String>,
    #[arg(long = "stderrthreshold", global = true, hide = true)]
    stderrthreshold: Option<String>,
}

impl KlogFlags {
    /// klog flags that were given but have no effect in masq, for a startup warning.
    pub(crate) fn ignored(&self) -> Vec<&'static str> {
        let mut ignored = Vec::new();
        for (present, name) in [
            (self.logtostderr.is_some(), "--logtostderr"),
            (self.alsologtostderr.is_some(), "--alsologtostderr"),
            (self.skip_headers.is_some(), "--skip_headers"),
            (self.vmodule.is_some(), "--vmodule"),
            (self.log_dir.is_some(), "--log_dir"),
            (self.log_file.is_some(), "--log_file"),
            (self.stderrthreshold.is_some(), "--stderrthreshold"),
        ] {
            if present {
                ignored.push(name);
            }
        }
        ignored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_booleans() {
        for truthy in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(truthy), Ok(true));
        }
        for falsy in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(falsy), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}
