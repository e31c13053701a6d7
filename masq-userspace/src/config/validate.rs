//! Upstream's validation: the CIDR count, then each CIDR in order (parse, alignment, IPv6
//! gate). Duplicates and overlaps are accepted; the first failure rejects the whole config.
//!
//! masq's own lists (`masqueradeCIDRs`, `nonMasqueradeSrcCIDRs`) go through the same checks
//! after `nonMasqueradeCIDRs`, and count towards `cidrLimit`: a config without them is
//! validated exactly as upstream validates it. One rule is new: a prefix may not be both
//! masqueraded and kept, since no longest match could choose between the two.

use super::{
    MASQUERADE_CIDRS_KEY,
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
        /// Entries in `nonMasqueradeCIDRs`, `masqueradeCIDRs` and `nonMasqueradeSrcCIDRs`.
        count: usize,
    },
    /// A CIDR does not parse or is not aligned.
    #[error(transparent)]
    Cidr(#[from] CidrError),
    /// The same network in `masqueradeCIDRs` and `nonMasqueradeCIDRs`.
    #[error(
        "CIDR {} is listed in both {MASQUERADE_CIDRS_KEY} ({masquerade_origin}) and \
         nonMasqueradeCIDRs as {} ({non_masquerade_origin}): the longest matching prefix decides, \
         and one prefix cannot both masquerade and keep the pod's address; remove it from one list",
        go_compat::strconv::quote(.cidr),
        go_compat::strconv::quote(.non_masquerade_cidr)
    )]
    InBothLists {
        /// The `masqueradeCIDRs` entry as written.
        cidr: String,
        /// Where it was listed.
        masquerade_origin: CidrOrigin,
        /// The `nonMasqueradeCIDRs` entry with the same network, as written.
        non_masquerade_cidr: String,
        /// Where that was listed.
        non_masquerade_origin: CidrOrigin,
    },
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
    check_count(cidrs.len(), limit)?;
    parse_all(cidrs, enable_ipv6, origin)
}

/// The three CIDR lists of one file, as written (an absent list is empty).
#[derive(Clone, Copy, Debug, Default)]
pub struct CidrLists<'text> {
    /// `nonMasqueradeCIDRs`.
    pub non_masquerade: &'text [CidrText],
    /// `masqueradeCIDRs`.
    pub masquerade: &'text [CidrText],
    /// `nonMasqueradeSrcCIDRs`.
    pub non_masquerade_src: &'text [CidrText],
}

/// The three lists of one file, validated, in the order written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValidLists {
    /// `nonMasqueradeCIDRs`.
    pub non_masquerade: Vec<SourcedCidr>,
    /// `masqueradeCIDRs`.
    pub masquerade: Vec<SourcedCidr>,
    /// `nonMasqueradeSrcCIDRs`.
    pub non_masquerade_src: Vec<SourcedCidr>,
}

/// Validates a file's lists: the count of all three against `limit`, then each list in turn
/// (`nonMasqueradeCIDRs` first, as upstream). That no prefix is both masqueraded and kept is
/// [`check_not_in_both`]'s, on the lists in force (a directory's merged ones).
/// `origins` are those of `nonMasqueradeCIDRs` (the defaults, when the file does not set it)
/// and of masq's own lists.
pub fn validate_lists(
    lists: CidrLists<'_>,
    limit: i64,
    enable_ipv6: bool,
    [non_masquerade_origin, origin]: [CidrOrigin; 2],
) -> Result<ValidLists, ValidationError> {
    let count =
        lists.non_masquerade.len() + lists.masquerade.len() + lists.non_masquerade_src.len();
    check_count(count, limit)?;
    let valid = ValidLists {
        non_masquerade: parse_all(
            lists.non_masquerade.iter(),
            enable_ipv6,
            non_masquerade_origin,
        )?,
        masquerade: parse_all(lists.masquerade.iter(), enable_ipv6, origin)?,
        non_masquerade_src: parse_all(lists.non_masquerade_src.iter(), enable_ipv6, origin)?,
    };
    Ok(valid)
}

/// Refuses a `masqueradeCIDRs` entry whose network is also in `nonMasqueradeCIDRs` (of any
/// file, in directory mode, or of the defaults the file did not replace).
pub fn check_not_in_both(
    non_masquerade: &[SourcedCidr],
    masquerade: &[SourcedCidr],
) -> Result<(), ValidationError> {
    if masquerade.is_empty() {
        return Ok(());
    }
    let kept: std::collections::HashMap<&super::cidr::Network, &SourcedCidr> = non_masquerade
        .iter()
        .map(|sourced| (sourced.cidr.network(), sourced))
        .collect();
    for sourced in masquerade {
        if let Some(kept) = kept.get(sourced.cidr.network()) {
            return Err(ValidationError::InBothLists {
                cidr: sourced.cidr.as_str().to_owned(),
                masquerade_origin: sourced.origin,
                non_masquerade_cidr: kept.cidr.as_str().to_owned(),
                non_masquerade_origin: kept.origin,
            });
        }
    }
    Ok(())
}

fn check_count(count: usize, limit: i64) -> Result<(), ValidationError> {
    if i64::try_from(count).map_or(true, |count| count > limit) {
        return Err(ValidationError::TooManyCidrs { limit, count });
    }
    Ok(())
}

fn parse_all<'text>(
    cidrs: impl ExactSizeIterator<Item = &'text CidrText>,
    enable_ipv6: bool,
    origin: CidrOrigin,
) -> Result<Vec<SourcedCidr>, ValidationError> {
    let mut valid = Vec::with_capacity(cidrs.len());
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
