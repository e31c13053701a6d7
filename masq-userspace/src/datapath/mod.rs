//! The eBPF datapath: the embedded object, its maps, and attaching it to an interface.

pub mod error;
pub mod maps;
pub mod object;

pub use error::DatapathError;
