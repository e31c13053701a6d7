//! Helpers for masq's privileged tests.
//!
//! The datapath tests follow a pktgen / setup / check shape: [`pktgen`] crafts a frame,
//! [`harness`] loads the datapath and configures its maps, the program runs through
//! `BPF_PROG_TEST_RUN`, and [`check`] parses the output and verifies every checksum from
//! scratch.
//!
//! [`fuzz`] drives random and mutated frames through both programs the same way and checks
//! every result against an oracle of what the datapath may do to a frame.
//!
//! [`agreement`] generates configs and checks that `masq explain`, the datapath and the
//! iptables rules decide alike for every pod source and destination.
//!
//! [`kernel_compat`] lists what the built datapath object needs from the kernel, without root.
//!
//! The namespace tests build a [`sandbox`] (pods, a node, a router, an outside host), run the
//! real `masq agent` in the node namespace ([`agent`]) and send real [`traffic`]. The container
//! tests run the image instead, as the rendered [`manifest`]s say, under podman ([`container`]).

pub mod agent;
pub mod agreement;
pub mod caps;
pub mod capture;
pub mod check;
pub mod configmap;
pub mod container;
pub mod fuzz;
pub mod harness;
pub mod kernel_compat;
pub mod manifest;
pub mod netns;
pub mod observer;
pub mod pktgen;
pub mod pktgen6;
pub mod pressure;
pub mod sandbox;
pub mod traffic;
pub mod tunwire;

/// Polls `condition` until it holds, failing the test with `what` after `timeout`.
pub fn wait_for(what: &str, timeout: std::time::Duration, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("timed out waiting for {what}");
}

/// Defines a namespace test twice, once per attach mode: `fn name(mode) { ... }` becomes the
/// tests `name::tcx` and `name::tc`, each calling the body with that
/// [`sandbox::AttachMode`].
#[macro_export]
macro_rules! in_both_attach_modes {
    ($(#[$meta:meta])* fn $name:ident($mode:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            use super::*;

            fn run($mode: $crate::sandbox::AttachMode) $body

            #[test]
            fn tcx() {
                run($crate::sandbox::AttachMode::Tcx);
            }

            #[test]
            fn tc() {
                run($crate::sandbox::AttachMode::Tc);
            }
        }
    };
}
