//! masq's TC datapath.
//!
//! Two classifiers sit on the node's uplink:
//!
//! * [`masq_egress`] sends traffic towards masqueraded destinations out with the node's
//!   address, allocating a port mapping for each new flow;
//! * [`masq_ingress`] restores the pod address and port on the replies.
//!
//! What is rare on their paths runs in classifiers of their own, never attached, which they
//! tail-call: [`masq_allocator`] creates a new flow's mapping, [`masq_flow_event`] handles a
//! packet that moves its flow's state (or brings a removed flow back, or opens one from
//! outside), and [`masq_source_nat`] and [`masq_reverse_nat`] rewrite the packet at the end.
//! Each IPv6 program is a program of its own too, verified apart.
//!
//! Everything the programs know comes from maps the agent fills (see `maps`). Every path counts
//! exactly one outcome; nothing is logged per packet unless the agent turns on debug logging.

#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// The holders' counts are added to atomically by an instruction written out (see `atomic`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

// The modules, floor by floor (see docs/datapath.md, "The code"); each imports only from the
// floors below it, which xtask's `ebpf_modules_form_floors` test keeps so.
//
// Leaf types and helpers.
mod address;
mod atomic;
mod clock;
mod header;
mod verdict;
// The maps, and what differs per family.
mod counters;
mod family;
mod forget;
mod maps;
mod policy;
// Parsing and rewriting packets.
mod frag;
mod icmp;
mod packet;
mod rewrite;
// NAT state.
mod evict;
mod holders;
mod nat;
mod sockets;
mod table;
mod track;
// The programs: their entry points, and the hand-over between them.
mod allocator;
mod egress;
mod event;
mod handoff;
mod ingress;

use aya_ebpf::{macros::classifier, programs::TcContext};

use crate::address::V6;

/// TC egress classifier for the uplink: masquerades pod traffic towards destinations outside
/// the non-masquerade CIDRs. Attached by the agent first on the hook (tcx link first in the chain,
/// or tc filter at priority 1), so that no program that ends the chain can bypass it; returns
/// "next" for every packet it does not drop, so the programs after it still run.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_egress(ctx: TcContext) -> i32 {
    egress::classify(&ctx)
}

/// TC ingress classifier for the uplink: reverses the translation for replies of masqueraded
/// flows and leaves everything else alone.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_ingress(ctx: TcContext) -> i32 {
    ingress::classify(&ctx)
}

/// Port allocator, tail-called (through the `masq_progs` array, which the agent fills) for each
/// packet that needs a new mapping: finds a free port and creates both halves of the mapping,
/// then tail-calls `masq_source_nat`; or drops and counts the packet.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_allocator(ctx: TcContext) -> i32 {
    allocator::allocate::<[u8; 4]>(&ctx)
}

/// Rewrites a leaving packet's source with the mapping its hand-off holds (a new flow's, or one
/// a flow event settled); tail-called by the allocator and the flow-event program.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_source_nat(ctx: TcContext) -> i32 {
    egress::source_nat::<[u8; 4]>(&ctx)
}

/// Rewrites an arriving packet's destination with the mapping its hand-off holds; tail-called by
/// the flow-event program.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_reverse_nat(ctx: TcContext) -> i32 {
    ingress::reverse_nat::<[u8; 4]>(&ctx)
}

/// Handles what the egress and ingress programs leave to it (see `event`): a packet that moves
/// its flow's state, one whose flow the agent removed, a datagram opening a flow from outside.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_flow_event(ctx: TcContext) -> i32 {
    event::handle::<[u8; 4]>(&ctx)
}

/// IPv6 egress classifier, tail-called by `masq_egress` for IPv6 frames (through `masq_progs`):
/// the same classification as IPv4, on its own tables, verified apart.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_egress6(ctx: TcContext) -> i32 {
    egress::classify_v6(&ctx)
}

/// IPv6 ingress classifier, tail-called by `masq_ingress` for IPv6 frames.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_ingress6(ctx: TcContext) -> i32 {
    ingress::classify_v6(&ctx)
}

/// IPv6 port allocator, as `masq_allocator` for IPv4.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_allocator6(ctx: TcContext) -> i32 {
    allocator::allocate::<V6>(&ctx)
}

/// Translates an ICMPv6 error leaving by an uplink (its quoted packet too); tail-called by
/// `masq_egress6`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_icmp6_egress(ctx: TcContext) -> i32 {
    egress::icmp_error_v6(&ctx)
}

/// Translates an ICMPv6 error arriving on an uplink (its quoted packet too); tail-called by
/// `masq_ingress6`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_icmp6_ingress(ctx: TcContext) -> i32 {
    ingress::icmp_error_v6(&ctx)
}

/// IPv6 `masq_source_nat`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_source_nat6(ctx: TcContext) -> i32 {
    egress::source_nat::<V6>(&ctx)
}

/// IPv6 `masq_reverse_nat`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_reverse_nat6(ctx: TcContext) -> i32 {
    ingress::reverse_nat::<V6>(&ctx)
}

/// Takes a port for a pod's new flow that found none from a pod holding more of the remote's
/// ports (see `allocator::share_port`).
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_port_share(ctx: TcContext) -> i32 {
    allocator::share_port::<[u8; 4]>(&ctx)
}

/// IPv6 `masq_port_share`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_port_share6(ctx: TcContext) -> i32 {
    allocator::share_port::<V6>(&ctx)
}

/// IPv6 `masq_flow_event`.
#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the classifier macro fixes the signature"
)]
fn masq_flow_event6(ctx: TcContext) -> i32 {
    event::handle::<V6>(&ctx)
}

/// The kernel requires a GPL-compatible license for the helpers the programs call.
#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // Unreachable in a verified program: the verifier rejects any path that could get here.
    loop {}
}

/// Host builds (clippy, `cargo check`) only type-check the programs.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
