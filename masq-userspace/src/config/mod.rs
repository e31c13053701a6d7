//! The ip-masq-agent configuration, read exactly as upstream reads it.
//!
//! Two sources exist in the wild and both are supported:
//!
//! * a single file (kubernetes-sigs/ip-masq-agent, `/etc/config/ip-masq-agent`): absent keys
//!   keep their defaults, a missing file means defaults, a bad file is rejected and the last
//!   good config stays in force;
//! * a directory (Azure ip-masq-agent-v2, `/etc/config/`): every file named `ip-masq*` is read,
//!   CIDR lists are unioned and booleans ORed, and defaults apply only when no such file exists.
//!
//! Files go through the same pipeline as upstream's: YAML 1.1 (or JSON) to a JSON document
//! (`go_compat::yaml`), decoded with `encoding/json`'s rules ([`decode`]), then validated with
//! upstream's messages ([`validate`]).

pub mod cidr;
pub mod decode;

pub mod source;
pub mod validate;

use std::fmt::Write as _;

use go_compat::json::quote_string as json_string;

use cidr::CidrText;

/// Go's `time.Duration`, which `resyncInterval` is.
pub use go_compat::time::GoDuration;

/// Where upstream mounts the config file.
pub const DEFAULT_CONFIG_FILE: &str = "/etc/config/ip-masq-agent";
/// Where the Azure agent looks for config files.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/config/";
/// Prefix of the file names the Azure agent reads from its directory.
pub const CONFIG_FILE_PREFIX: &str = "ip-masq";

/// IPv4 link-local, exempt from masquerade unless `masqLinkLocal` is true.
pub const LINK_LOCAL_V4: &str = "169.254.0.0/16";
/// IPv6 link-local, exempt from masquerade unless `masqLinkLocalIPv6` is true.
pub const LINK_LOCAL_V6: &str = "fe80::/10";

/// The non-masquerade CIDRs used when the config does not list any (RFC 1918).
pub const DEFAULT_NON_MASQUERADE_CIDRS: [&str; 3] =
    ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"];

/// Appended to the defaults by `--nomasq-all-reserved-ranges`, in upstream's order.
pub const RESERVED_RANGES: [&str; 8] = [
    "100.64.0.0/10",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "240.0.0.0/4",
];

/// The key of masq's masquerade exceptions inside non-masquerade ranges.
pub const MASQUERADE_CIDRS_KEY: &str = "masqueradeCIDRs";
/// The key of masq's never-masqueraded pod sources.
pub const NON_MASQUERADE_SRC_CIDRS_KEY: &str = "nonMasqueradeSrcCIDRs";

/// Default `cidrLimit`.
pub const DEFAULT_CIDR_LIMIT: i64 = 64;
/// The limit the Azure agent applies to each file.
pub const AZURE_CIDR_LIMIT: i64 = 64;
/// Default `resyncInterval`.
pub const DEFAULT_RESYNC_INTERVAL: GoDuration = GoDuration::from_secs(60);

/// Upstream's `MasqConfig`: the config file's keys with their values before validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasqConfig {
    /// `nonMasqueradeCIDRs`, exactly as written. `None` is Go's nil slice, what `null` decodes
    /// to; an explicit `[]` is an empty list, which Go tells apart when it prints the config.
    pub non_masquerade_cidrs: Option<Vec<CidrText>>,
    /// `cidrLimit`.
    pub cidr_limit: i64,
    /// `masqLinkLocal`.
    pub masq_link_local: bool,
    /// `masqLinkLocalIPv6`.
    pub masq_link_local_ipv6: bool,
    /// `resyncInterval`.
    pub resync_interval: GoDuration,
    /// `masqueradeCIDRs` (masq's own key, which upstream ignores): destinations masqueraded
    /// even inside a non-masquerade range, the longest matching prefix deciding. `None` when
    /// absent.
    pub masquerade_cidrs: Option<Vec<CidrText>>,
    /// `nonMasqueradeSrcCIDRs` (masq's own key, which upstream ignores): pod sources never
    /// masqueraded, whatever the destination. `None` when absent.
    pub non_masquerade_src_cidrs: Option<Vec<CidrText>>,
}

impl MasqConfig {
    /// Upstream's `NewMasqConfig`: what applies when the file or a key is absent.
    pub fn defaults(nomasq_all_reserved_ranges: bool) -> Self {
        let reserved: &[&str] = if nomasq_all_reserved_ranges {
            &RESERVED_RANGES
        } else {
            &[]
        };
        let cidrs = DEFAULT_NON_MASQUERADE_CIDRS
            .iter()
            .chain(reserved)
            .map(|&cidr| cidr.into())
            .collect();
        Self {
            non_masquerade_cidrs: Some(cidrs),
            cidr_limit: DEFAULT_CIDR_LIMIT,
            masq_link_local: false,
            masq_link_local_ipv6: false,
            resync_interval: DEFAULT_RESYNC_INTERVAL,
            masquerade_cidrs: None,
            non_masquerade_src_cidrs: None,
        }
    }

    /// The settings other than the CIDR lists (which are `None`), without copying the lists.
    pub const fn without_cidrs(&self) -> Self {
        Self {
            non_masquerade_cidrs: None,
            cidr_limit: self.cidr_limit,
            masq_link_local: self.masq_link_local,
            masq_link_local_ipv6: self.masq_link_local_ipv6,
            resync_interval: self.resync_interval,
            masquerade_cidrs: None,
            non_masquerade_src_cidrs: None,
        }
    }

    /// The config as Go's `json.Marshal` writes it (upstream logs `Using config: ...`): a nil
    /// list is `null`, an empty one `[]`. masq's own keys follow upstream's, only when the
    /// file has them, so that a config without them logs exactly as upstream's does.
    pub fn to_go_json(&self) -> String {
        let mut json = String::from("{\"nonMasqueradeCIDRs\":");
        write_go_list(&mut json, self.non_masquerade_cidrs.as_deref());
        let _ = write!(
            json,
            ",\"cidrLimit\":{},\"masqLinkLocal\":{},\"masqLinkLocalIPv6\":{},\"resyncInterval\":{}}}",
            self.cidr_limit,
            self.masq_link_local,
            self.masq_link_local_ipv6,
            json_string(&self.resync_interval.to_string())
        );
        json.pop();
        for (key, list) in [
            (MASQUERADE_CIDRS_KEY, &self.masquerade_cidrs),
            (NON_MASQUERADE_SRC_CIDRS_KEY, &self.non_masquerade_src_cidrs),
        ] {
            if list.is_some() {
                let _ = write!(json, ",\"{key}\":");
                write_go_list(&mut json, list.as_deref());
            }
        }
        json.push('}');
        json
    }
}

/// A `[]string` as `json.Marshal` writes it.
fn write_go_list(json: &mut String, list: Option<&[CidrText]>) {
    match list {
        None => json.push_str("null"),
        Some(cidrs) => {
            let items: Vec<String> = cidrs.iter().map(|cidr| json_string(cidr)).collect();
            let _ = write!(json, "[{}]", items.join(","));
        }
    }
}
