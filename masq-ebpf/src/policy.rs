//! What the config says of a pod's packet that belongs to no mapping: masqueraded, or left
//! alone by which exemption. Asked by the egress classifier for a new flow, by the fragments
//! for a later fragment whose first was not seen, and for a flow opened from outside (whose
//! replies the policy may already exempt), so that all of them decide alike.

use masq_common::{
    counters::Counter,
    layout::{NOMASQ_KIND_LINK_LOCAL, NOMASQ_KIND_MASQUERADE},
    settings::Settings,
};

use crate::family::Family;

/// What the policy says of a pod's packet that belongs to no mapping: the counter of the
/// exemption that leaves it alone, or `None` when it is masqueraded. Shared by new flows and by
/// later fragments whose first fragment was not seen, so that both decide alike.
///
/// A source in `nonMasqueradeSrcCIDRs` is never masqueraded, whatever the destination; its
/// trie is looked up only while the agent says it holds entries, so a config without such
/// sources costs nothing more per packet. Then the destination's longest matching prefix
/// decides: a `masqueradeCIDRs` entry masquerades as if nothing matched.
#[inline(always)]
pub(crate) fn pod_exemption<A: Family>(settings: &Settings, src: A, dst: A) -> Option<Counter> {
    if settings.source_exemptions() && A::source_exempt(src) {
        return Some(Counter::EgressExemptSource);
    }
    match A::exempt(dst) {
        Some(NOMASQ_KIND_LINK_LOCAL) => Some(Counter::EgressExemptLinkLocal),
        Some(NOMASQ_KIND_MASQUERADE) | None => None,
        Some(_) => Some(Counter::EgressExemptCidr),
    }
}
