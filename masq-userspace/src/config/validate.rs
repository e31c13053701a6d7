//! Upstream's validation: the CIDR count, then each CIDR in order (parse, alignment, IPv6
//! gate). Duplicates and overlaps are accepted; the first failure rejects the whole config.

use super::{
    cidr::{Cidr, CidrError, CidrText, Family},
    source::{CidrOrigin, SourcedCidr},
};

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

/// Validates `cidrs` against `limit` and the IPv6 gate, returning them parsed in order, each
/// with `origin`.
pub fn validate_cidrs<'text>(
    cidrs: impl ExactSizeIterator<Item = &'text CidrText>,
    limit: i64,
    enable_ipv6: bool,
    origin: CidrOrigin,
) -> Result<Vec<SourcedCidr>, ValidationError> {
    let count = cidrs.len();
    if i64::try_from(count).map_or(true, |count| count > limit) {
        return Err(ValidationError::TooManyCidrs { limit, count });
    }
    let mut valid = Vec::with_capacity(count);
    for text in cidrs {
        let cidr = Cidr::parse(text)?;
        if !enable_ipv6 && cidr.family() == Family::Ipv6 {
            return Err(ValidationError::Ipv6NotEnabled {
                cidr: text.to_string(),
            });
        }
        valid.push(SourcedCidr { cidr, origin });
    }
    Ok(valid)
}
