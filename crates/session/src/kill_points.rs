//! Crash injection for tests (the `kill-points` feature only; a normal build has none of
//! this): with `NERVE_KILL_AFTER_EVENT=k` set, the process kills itself with SIGKILL the
//! moment the commit holding the event with sequence number `k` is durable, before any
//! caller learns of it. A commit is atomic, so the log then ends with the whole transaction
//! that holds event `k`: exactly what a crash right after that append leaves behind.

use std::sync::OnceLock;

/// The variable naming the sequence number after which the process dies.
pub const KILL_AFTER_EVENT: &str = "NERVE_KILL_AFTER_EVENT";

/// The armed sequence number, read once.
fn armed() -> Option<u64> {
    static ARMED: OnceLock<Option<u64>> = OnceLock::new();
    *ARMED.get_or_init(|| {
        let value = std::env::var(KILL_AFTER_EVENT).ok()?;
        match value.trim().parse() {
            Ok(seq) => Some(seq),
            Err(_) => {
                // Not silently disarmed: a test that set it wants to know.
                tracing::error!(%value, "{KILL_AFTER_EVENT} is not a sequence number; no kill point armed");
                None
            }
        }
    })
}

/// Called once a commit is durable, with the last sequence number it wrote.
pub(crate) fn durable(head: u64) {
    if armed().is_some_and(|k| head >= k) {
        // The test reads this line to know the kill was ours, not a crash of its own.
        tracing::warn!(head, "kill point: SIGKILL after a durable event");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; should it not have been delivered, still never return.
        std::process::abort();
    }
}
