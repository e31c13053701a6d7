//! The Go routines the rest of masq uses, at their historical path: `%q` quoting,
//! `strconv.Atoi` and `time.Duration`. They live in the `go-compat` crate.

pub use go_compat::{
    strconv::{atoi, quote},
    time::GoDuration,
};
