//! Helpers for masq's privileged tests.
//!
//! The datapath tests follow a pktgen / setup / check shape: [`pktgen`] crafts a frame,
//! [`harness`] loads the datapath and configures its maps, the program runs through
//! `BPF_PROG_TEST_RUN`, and [`check`] parses the output and verifies every checksum from
//! scratch.

pub mod check;
pub mod harness;
pub mod pktgen;
