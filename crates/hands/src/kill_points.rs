//! Crash injection for tests (the `kill-points` feature only; a normal build has none of
//! this): the process kills itself with SIGKILL right before the k-th tool call it runs
//! (`NERVE_KILL_BEFORE_TOOL_CALL=k`: the call's intent is in the log, nothing ran), or
//! right after the k-th call returned and before anyone learns of it
//! (`NERVE_KILL_AFTER_TOOL_CALL=k`: the effect happened, its finish is not in the log).
//! Calls are counted from 1 per process, in the order [`crate::SandboxTools`] runs them.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The variable naming the tool call before which the process dies.
pub const KILL_BEFORE_TOOL_CALL: &str = "NERVE_KILL_BEFORE_TOOL_CALL";
/// The variable naming the tool call after which the process dies.
pub const KILL_AFTER_TOOL_CALL: &str = "NERVE_KILL_AFTER_TOOL_CALL";

/// The armed call numbers (before, after), read once.
fn armed() -> (Option<u64>, Option<u64>) {
    static ARMED: OnceLock<(Option<u64>, Option<u64>)> = OnceLock::new();
    *ARMED.get_or_init(|| (read(KILL_BEFORE_TOOL_CALL), read(KILL_AFTER_TOOL_CALL)))
}

fn read(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    match value.trim().parse() {
        Ok(k) => Some(k),
        Err(_) => {
            // Not silently disarmed: a test that set it wants to know.
            tracing::error!(%value, "{name} is not a call number; no kill point armed");
            None
        }
    }
}

/// Tool calls begun by this process.
static BEGUN: AtomicU64 = AtomicU64::new(0);
/// Tool calls returned in this process.
static RETURNED: AtomicU64 = AtomicU64::new(0);

/// Called right before a tool call runs.
pub(crate) fn before_call() {
    let number = BEGUN.fetch_add(1, Ordering::SeqCst) + 1;
    if armed().0 == Some(number) {
        die("before", number);
    }
}

/// Called right after a tool call returned.
pub(crate) fn after_call() {
    let number = RETURNED.fetch_add(1, Ordering::SeqCst) + 1;
    if armed().1 == Some(number) {
        die("after", number);
    }
}

fn die(when: &str, number: u64) -> ! {
    tracing::warn!(number, "kill point: SIGKILL {when} a tool call");
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    // SIGKILL cannot be caught; should it not have been delivered, still never return.
    std::process::abort()
}
