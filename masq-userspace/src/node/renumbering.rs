//! An uplink's addresses as they change: which address's flows live on, and which go.
//!
//! MASQUERADE forgets a flow only when the address it was masqueraded to is removed from the
//! node (its notifier flushes conntrack's entries then); a change of the address new flows take,
//! the old one staying on the interface (the kernel's preferred IPv6 source moves on with SLAAC
//! renumbering and temporary addresses, the old address deprecated), leaves the flows alone.

use std::net::IpAddr;

/// The former address (see `masq_common::layout::Uplink::former_addr`) an uplink keeps for one family once its
/// address went from `old` to `new`, given the one it kept before: an address that changed but
/// is still on the interface (`on_interface`) is kept, an address that left it is pushed on
/// `gone` (its flows are flushed), and so is an older former address a newer one replaces
/// (one is kept per family: renumbering twice within one flow's life is rare).
pub fn former_address(
    old: Option<IpAddr>,
    new: Option<IpAddr>,
    former: Option<IpAddr>,
    on_interface: impl Fn(IpAddr) -> bool,
    gone: &mut Vec<IpAddr>,
) -> Option<IpAddr> {
    // An address that came back is current again, not former.
    let mut kept = former.filter(|&former| Some(former) != new);
    if let Some(old) = old.filter(|&old| Some(old) != new) {
        if on_interface(old) {
            if let Some(replaced) = kept.replace(old) {
                gone.push(replaced);
            }
        } else {
            gone.push(old);
        }
    }
    if let Some(former) = kept
        && !on_interface(former)
    {
        gone.push(former);
        kept = None;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn a_changed_address_still_on_the_interface_is_kept_and_one_removed_goes() {
        let (old, new) = (address("2001:db8::1"), address("2001:db8::2"));
        let mut gone = Vec::new();
        let kept = former_address(Some(old), Some(new), None, |_| true, &mut gone);
        assert_eq!((kept, gone.as_slice()), (Some(old), &[][..]));

        let kept = former_address(Some(old), Some(new), None, |_| false, &mut gone);
        assert_eq!((kept, gone.as_slice()), (None, &[old][..]));
    }

    #[test]
    fn the_former_address_goes_when_it_leaves_the_interface_or_comes_back() {
        let (former, now) = (address("192.0.2.1"), address("192.0.2.3"));
        let mut gone = Vec::new();
        // Nothing changed, the former address still there: kept.
        let kept = former_address(Some(now), Some(now), Some(former), |_| true, &mut gone);
        assert_eq!((kept, gone.as_slice()), (Some(former), &[][..]));
        // Removed since: its flows go.
        let kept = former_address(
            Some(now),
            Some(now),
            Some(former),
            |a| a != former,
            &mut gone,
        );
        assert_eq!((kept, gone.as_slice()), (None, &[former][..]));
        // Current again: neither former nor gone.
        gone.clear();
        let kept = former_address(Some(now), Some(former), Some(former), |_| true, &mut gone);
        assert_eq!((kept, gone.as_slice()), (Some(now), &[][..]));
    }

    #[test]
    fn a_second_change_replaces_the_older_former_address() {
        let (first, second, third) = (
            address("2001:db8::1"),
            address("2001:db8::2"),
            address("2001:db8::3"),
        );
        let mut gone = Vec::new();
        let kept = former_address(Some(second), Some(third), Some(first), |_| true, &mut gone);
        assert_eq!((kept, gone.as_slice()), (Some(second), &[first][..]));
    }

    #[test]
    fn an_uplink_that_loses_its_address_keeps_the_flows_while_the_address_stays() {
        let old = address("192.0.2.1");
        let mut gone = Vec::new();
        let kept = former_address(Some(old), None, None, |_| true, &mut gone);
        assert_eq!((kept, gone.as_slice()), (Some(old), &[][..]));
    }
}
