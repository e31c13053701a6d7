//! The eBPF datapath: the embedded object, its maps, pinning, attaching, keeping the maps in
//! line with the policy, and collecting expired flows.

pub mod attach;
pub mod error;
pub mod flows;
pub mod gc;
pub mod maps;
pub mod object;
pub mod pins;
pub mod sync;

pub use error::DatapathError;
