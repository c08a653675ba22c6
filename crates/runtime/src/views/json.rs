//! The JSON objects the read commands print and the HTTP API answers with, made once here:
//! an execution as `replay --json` / `show --json` give it, and one event as `events --json`
//! lists it.

use serde_json::Value;

use crate::log::{Replay, StoredEvent};

/// An execution rebuilt from its log (`replay --json`, `show --json`, the API's
/// `GET /api/v1/executions/{id}`).
pub fn replay_json(replayed: &Replay) -> Value {
    serde_json::json!({
        "execution_id": replayed.execution_id,
        "completeness": replayed.completeness(),
        "complete": replayed.complete,
        "total_turns": replayed.total_turns,
        "termination_reason": replayed.termination_reason,
        "task_status": replayed.task_status,
        "task": replayed.started.as_ref().map(|s| s.task.clone()),
        "messages": replayed.messages.len(),
        "input_tokens": replayed.usage.input_tokens,
        "output_tokens": replayed.usage.output_tokens,
        "cache_read_tokens": replayed.usage.cache_read_tokens,
        "cache_write_tokens": replayed.usage.cache_write_tokens,
        "cached_input_share": cached_share(&replayed.usage),
        "cost_usd": replayed.cost.as_usd(),
        "error": replayed.error,
        "gaps": replayed.gaps,
        "malformed_events": replayed.malformed_events,
        "duplicate_turns": replayed.duplicate_turns,
        "events": replayed.events,
    })
}

/// The share of input tokens served from the prompt cache, 0 to 1.
pub fn cached_share(usage: &nerve_core::TokenUsage) -> f64 {
    if usage.input_tokens == 0 {
        return 0.0;
    }
    let read = usage.cache_read_tokens.min(usage.input_tokens);
    // Token counts stay far below 2^52, where f64 is exact.
    #[allow(clippy::cast_precision_loss)]
    let share = read as f64 / usage.input_tokens as f64;
    (share * 1000.0).round() / 1000.0
}

/// One event as `events --json` lists it: `{seq, ts, kind, payload}`.
pub fn event_json(e: &StoredEvent) -> Value {
    serde_json::json!({
        "seq": e.seq,
        "ts": e.ts,
        "kind": e.kind,
        "payload": serde_json::from_str::<Value>(&e.payload).unwrap_or(Value::Null),
    })
}
