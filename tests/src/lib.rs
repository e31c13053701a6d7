//! Helpers for masq's privileged tests.
//!
//! The datapath tests follow a pktgen / setup / check shape: [`pktgen`] crafts a frame,
//! [`harness`] loads the datapath and configures its maps, the program runs through
//! `BPF_PROG_TEST_RUN`, and [`check`] parses the output and verifies every checksum from
//! scratch.
//!
//! The namespace tests build a [`sandbox`] (pods, a node, a router, an outside host), run the
//! real `masq agent` in the node namespace ([`agent`]) and send real [`traffic`]. The container
//! tests run the image instead, as the rendered [`manifest`]s say, under podman ([`container`]).

pub mod agent;
pub mod check;
pub mod configmap;
pub mod container;
pub mod harness;
pub mod manifest;
pub mod netns;
pub mod pktgen;
pub mod sandbox;
pub mod traffic;
