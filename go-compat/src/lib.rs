//! The pieces of Go that decide how upstream ip-masq-agent reads its config, reproduced with
//! Go's behaviour and messages: apimachinery's YAML-or-JSON conversion (go-yaml v2 and
//! sigs.k8s.io/yaml, [`yaml`]), `encoding/json` ([`json`]), `net.ParseCIDR` ([`net`]),
//! `time.ParseDuration` ([`time`]) and `strconv` ([`strconv`]).
//!
//! Operators compare masq's messages with what the Go agent logged, and scripts grep for them,
//! so each routine follows Go rather than Rust's conventions. Each exists once, here.

pub mod json;
pub mod net;
pub mod strconv;
pub mod time;
pub mod yaml;

/// Runs `work` on a thread whose stack holds the deepest document these readers meet.
///
/// Reading and decoding recurse once per level of nesting, and YAML aliases stack levels on
/// levels: a config of a few hundred kilobytes can nest a hundred thousand deep before
/// go-yaml's alias limit or the JSON depth limit rejects it. Go grows a goroutine's stack up to
/// 1 GB for that; this thread reserves [`DEEP_STACK`] bytes, of which only the pages used
/// become memory.
pub(crate) fn on_deep_stack<T: Send>(work: impl Fn() -> T + Send + Sync) -> T {
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("go-compat".to_owned())
            .stack_size(DEEP_STACK)
            .spawn_scoped(scope, &work)
        {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: the caller's stack reads every ordinary document.
            Err(_) => work(),
        }
    })
}

/// The stack reserved by [`on_deep_stack`].
const DEEP_STACK: usize = 1 << 30;
