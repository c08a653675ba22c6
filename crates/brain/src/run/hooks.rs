//! The user's hooks at the execution's fixed points (`session_start`, `user_prompt_submit`,
//! `pre_tool_use`, `post_tool_use`, `stop`), through the [`Hooks`](nerve_core::Hooks) port
//! (the runtime runs them on the host): each run recorded as a `hook_ran` event, and a
//! block handed back as the text the model sees.

use nerve_core::event::{HookPoint, HookRan, HookVerdict};
use nerve_core::{Event, ToolCall};

use crate::run::execution::Run;

/// Runs the hooks at `point` with `input` (an object: the engine's fields; the runtime adds
/// the execution's id and workspace), records each run, and returns the blocking hook's
/// stderr when one blocked.
pub(crate) async fn at(
    run: &mut Run,
    point: HookPoint,
    turn: u32,
    call: Option<&ToolCall>,
    mut input: serde_json::Value,
) -> Option<String> {
    let hooks = run.hooks.clone()?;
    if !hooks.any(point) {
        return None;
    }
    if let Some(map) = input.as_object_mut() {
        map.insert("event".into(), serde_json::json!(point.as_str()));
        if let Some(call) = call {
            map.insert("tool".into(), serde_json::json!(call.name));
            map.insert("arguments".into(), call.arguments.clone());
            map.insert("call_id".into(), serde_json::json!(call.id));
        }
    }
    let outcomes = hooks
        .run(point, call.map(|c| c.name.as_str()), &input)
        .await;
    let mut blocked = None;
    for outcome in outcomes {
        if outcome.verdict == HookVerdict::Block && blocked.is_none() {
            blocked = Some(if outcome.stderr.trim().is_empty() {
                format!(
                    "blocked by the {} hook `{}`",
                    point.as_str(),
                    outcome.command.join(" ")
                )
            } else {
                outcome.stderr.trim_end().to_owned()
            });
        }
        run.journal.record(Event::HookRan(HookRan {
            point,
            turn,
            call_id: call.map(|c| c.id.clone()),
            tool: call.map(|c| c.name.clone()),
            command: outcome.command,
            exit_code: outcome.exit_code,
            timed_out: outcome.timed_out,
            verdict: outcome.verdict,
            stderr: outcome.stderr,
            duration_ms: outcome.duration_ms,
        }));
    }
    blocked
}
