//! Upstream's validation: the CIDR count, then each CIDR in order (parse, alignment, IPv6
//! gate). Duplicates and overlaps are accepted; the first failure rejects the whole config.

use super::cidr::{Cidr, CidrError, Family};

/// Why a config was rejected; the messages are upstream's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// More CIDRs than `cidrLimit` (counting every entry, valid or not, of both families).
    #[error(
        "the daemon can only accept up to {limit} CIDRs (excluding link-local), but got {count} CIDRs \
         (excluding link local)"
    )]
    TooManyCidrs {
        /// `cidrLimit`.
        limit: i64,
        /// Entries in `nonMasqueradeCIDRs`.
        count: usize,
    },
    /// A CIDR does not parse or is not aligned.
    #[error(transparent)]
    Cidr(#[from] CidrError),
    /// An IPv6 CIDR without `--enable-ipv6`.
    #[error(
        "ipv6 is not enabled, but ipv6 cidr {cidr} provided. Enable ipv6 using --enable-ipv6 agent flag"
    )]
    Ipv6NotEnabled {
        /// The CIDR as written.
        cidr: String,
    },
}

/// Validates `cidrs` against `limit` and the IPv6 gate, returning them parsed in order.
pub fn validate_cidrs(
    cidrs: &[String],
    limit: i64,
    enable_ipv6: bool,
) -> Result<Vec<Cidr>, ValidationError> {
    let count = cidrs.len();
    if i64::try_from(count).map_or(true, |count| count > limit) {
        return Err(ValidationError::TooManyCidrs { limit, count });
    }
    cidrs
        .iter()
        .map(|text| {
            let cidr = Cidr::parse(text)?;
            if !enable_ipv6 && cidr.family() == Family::Ipv6 {
                return Err(ValidationError::Ipv6NotEnabled { cidr: text.clone() });
            }
            Ok(cidr)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cidrs: &[&str], limit: i64, enable_ipv6: bool) -> Result<usize, String> {
        let cidrs: Vec<String> = cidrs.iter().map(|&cidr| cidr.to_owned()).collect();
        validate_cidrs(&cidrs, limit, enable_ipv6)
            .map(|parsed| parsed.len())
            .map_err(|error| error.to_string())
    }

    #[test]
    fn upstream_config_validate_cases() {
        assert_eq!(check(&[], 64, false), Ok(0));
        assert_eq!(
            check(
                &["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"],
                64,
                false
            ),
            Ok(3)
        );
        let unparsable = r#"CIDR "abcdefg" could not be parsed, invalid CIDR address: abcdefg"#;
        assert_eq!(check(&["abcdefg"], 64, false), Err(unparsable.to_owned()));
        assert_eq!(
            check(&["10.0.0.0/8", "abcdefg"], 64, false),
            Err(unparsable.to_owned())
        );
        assert_eq!(
            check(&["10.256.0.0/16"], 64, false),
            Err(
                r#"CIDR "10.256.0.0/16" could not be parsed, invalid CIDR address: 10.256.0.0/16"#
                    .to_owned()
            )
        );
        assert_eq!(
            check(&["10.0.0.1/8"], 64, false),
            Err(r#"CIDR "10.0.0.1/8" is not aligned to a CIDR block, ip: "10.0.0.1" network: "10.0.0.0/8""#.to_owned())
        );
    }

    #[test]
    fn the_limit_counts_everything_before_parsing() {
        let many: Vec<String> = (0..65).map(|index| format!("10.{index}.0.0/16")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(
            check(&many, 64, false),
            Err("the daemon can only accept up to 64 CIDRs (excluding link-local), but got 65 CIDRs (excluding link local)"
                .to_owned())
        );
        assert_eq!(check(&many[..64], 64, false), Ok(64));
        // Invalid and IPv6 entries count too, and the count is checked first.
        assert_eq!(
            check(&["garbage", "fc00::/7"], 1, false),
            Err("the daemon can only accept up to 1 CIDRs (excluding link-local), but got 2 CIDRs (excluding link local)"
                .to_owned())
        );
        assert!(check(&["10.0.0.0/8"], 0, false).is_err());
        assert!(check(&["10.0.0.0/8"], -1, false).is_err());
        assert_eq!(
            check(&["10.0.0.0/8", "10.0.0.0/8"], 64, false),
            Ok(2),
            "duplicates are accepted"
        );
    }

    #[test]
    fn ipv6_needs_the_flag() {
        assert_eq!(
            check(&["10.0.0.0/8", "fc00::/7"], 64, false),
            Err("ipv6 is not enabled, but ipv6 cidr fc00::/7 provided. Enable ipv6 using --enable-ipv6 agent flag"
                .to_owned())
        );
        assert_eq!(check(&["10.0.0.0/8", "fc00::/7"], 64, true), Ok(2));
        // IPv4-mapped IPv6 counts as IPv4, as in upstream.
        assert_eq!(check(&["::ffff:10.0.0.0/104"], 64, false), Ok(1));
        // Parse errors come before the gate, in list order.
        assert_eq!(
            check(&["fc00::/7", "bad"], 64, false),
            Err("ipv6 is not enabled, but ipv6 cidr fc00::/7 provided. Enable ipv6 using --enable-ipv6 agent flag"
                .to_owned())
        );
    }
}
