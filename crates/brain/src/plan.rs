//! The plan loops. `plan_execute` plans once through `submit_plan`, runs each step as a
//! ReAct sub-loop and replans when a step fails; `hybrid` also bounds each step's turns and
//! takes a checkpoint summary after every step, which may revise the remaining plan.
//! The protocol a model (or a cassette) follows is documented in `docs/loops.md`.

use nerve_core::event::CallPurpose;
use nerve_core::{Message, TerminationReason, ToolCall, ToolResult};

use crate::builtin::{BuiltinTool, SubmitPlanArgs};
use crate::react::{self, TurnEnd};
use crate::runner::Run;
use crate::stop::Stop;
use crate::turn;

/// The prefix of a final step answer that reports failure.
pub(crate) const STEP_FAILED: &str = "STEP FAILED";

/// How a plan loop behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanMode {
    pub(crate) max_steps: usize,
    /// Turns per step; `None` for plan-execute (only `max_turns` bounds a step).
    pub(crate) step_turns: Option<u32>,
    /// A summary call after each step that may revise the remaining plan (hybrid).
    pub(crate) checkpoints: bool,
}

/// How one step ended.
enum StepEnd {
    Done,
    Failed(String),
}

pub(crate) async fn run(run: &mut Run, mode: PlanMode) -> Stop {
    match drive(run, mode).await {
        Ok(()) => Stop::completed(),
        Err(stop) => stop,
    }
}

async fn drive(run: &mut Run, mode: PlanMode) -> Result<(), Stop> {
    let mut steps = plan(
        run,
        mode,
        &format!(
            "[Nerve] Before acting, plan the task: call submit_plan with 1 to {} concrete steps.",
            mode.max_steps
        ),
    )
    .await?;
    let mut replans = 0;
    let mut index = 0;
    let mut step_number = 0u32;
    while index < steps.len() {
        step_number += 1;
        run.progress.step = Some(step_number);
        run.stagnation.reset();
        // The active step is the subgoal: its messages are never compacted away.
        run.window.protect_from = Some(run.window.messages().len());
        let text = format!(
            "[Nerve] Step {}/{}: {}\nWhen the step is done, reply with a one-line summary and no tool calls. \
             If it cannot be done, reply with \"{STEP_FAILED}: <reason>\".",
            index + 1,
            steps.len(),
            steps[index]
        );
        run.push_message(Message::user(text));
        match step(run, mode).await? {
            StepEnd::Done => {
                index += 1;
                if mode.checkpoints
                    && let Some(revised) = checkpoint(run, mode, &steps[index..]).await?
                {
                    steps.truncate(index);
                    steps.extend(revised);
                }
            }
            StepEnd::Failed(reason) => {
                if replans >= run.config.max_replans {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!(
                            "step {} failed after {replans} replans: {reason}",
                            index + 1
                        ),
                    ));
                }
                replans += 1;
                let remaining = plan(
                    run,
                    mode,
                    &format!(
                        "[Nerve] Step {} failed: {reason}\nReplan the rest of the task: call submit_plan with the \
                         steps that remain (replan {replans} of {}).",
                        index + 1,
                        run.config.max_replans
                    ),
                )
                .await?;
                steps.truncate(index);
                steps.extend(remaining);
            }
        }
    }
    run.progress.step = None;
    run.window.protect_from = None;
    Ok(())
}

/// Runs one step as a ReAct sub-loop until the model answers without tool calls.
async fn step(run: &mut Run, mode: PlanMode) -> Result<StepEnd, Stop> {
    let mut turns = 0;
    loop {
        if mode.step_turns.is_some_and(|limit| turns >= limit) {
            return Ok(StepEnd::Failed(format!(
                "the step did not finish within {turns} turns"
            )));
        }
        turns += 1;
        match react::turn(run).await? {
            TurnEnd::Continue => {}
            TurnEnd::Final(text) => {
                let trimmed = text.trim_start();
                return Ok(match trimmed.strip_prefix(STEP_FAILED) {
                    Some(reason) => {
                        StepEnd::Failed(reason.trim_start_matches([':', ' ']).trim().to_owned())
                    }
                    None => StepEnd::Done,
                });
            }
        }
    }
}

/// A planning call: asks for `submit_plan` and returns the steps.
async fn plan(run: &mut Run, mode: PlanMode, instruction: &str) -> Result<Vec<String>, Stop> {
    run.push_message(Message::user(instruction));
    let (text, steps) = plan_call(run, mode, "Plan accepted").await?;
    // Lenient with models that write the plan as text: numbered or bulleted lines.
    let steps = steps
        .or_else(|| steps_from_text(&text, mode.max_steps))
        .unwrap_or_else(|| vec!["Do the task, then verify the result.".to_owned()]);
    Ok(steps)
}

/// One `plan` call offering only `submit_plan`: answers every call it makes (`accepted` or
/// why not) and returns the answer's text and the first valid plan.
async fn plan_call(
    run: &mut Run,
    mode: PlanMode,
    accepted: &str,
) -> Result<(String, Option<Vec<String>>), Stop> {
    let response = run
        .call_model(
            run.progress.turn_count(),
            CallPurpose::Plan,
            &[BuiltinTool::SubmitPlan.definition()],
        )
        .await?;
    let text = response.message.text_content();
    let calls: Vec<ToolCall> = response.message.tool_calls().cloned().collect();
    run.push_message(response.message);
    let mut plan = None;
    for call in &calls {
        let parsed = parse_plan(call, mode.max_steps);
        let content = match &parsed {
            Ok(steps) => format!("{accepted}: {} steps.", steps.len()),
            Err(problem) => format!("Plan rejected: {problem}"),
        };
        let is_error = parsed.is_err();
        let result = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        };
        let turns = run.progress.turn_count();
        turn::finish_tool(run, turns, result, 0);
        if plan.is_none() {
            plan = parsed.ok();
        }
    }
    Ok((text, plan))
}

/// After a step (hybrid): a progress summary that may revise the remaining steps.
async fn checkpoint(
    run: &mut Run,
    mode: PlanMode,
    remaining: &[String],
) -> Result<Option<Vec<String>>, Stop> {
    let listed = if remaining.is_empty() {
        "none".to_owned()
    } else {
        remaining
            .iter()
            .enumerate()
            .map(|(i, s)| format!("{}. {s}", i + 1))
            .collect::<Vec<_>>()
            .join("\n")
    };
    run.push_message(Message::user(format!(
        "[Nerve] Checkpoint: summarise the progress so far in two or three sentences. Remaining steps:\n{listed}\n\
         If they should change, call submit_plan with the new remaining steps; otherwise answer with the summary only."
    )));
    let (_, revised) = plan_call(run, mode, "Remaining plan replaced").await?;
    Ok(revised)
}

fn parse_plan(call: &ToolCall, max_steps: usize) -> Result<Vec<String>, String> {
    if BuiltinTool::parse(&call.name) != Some(BuiltinTool::SubmitPlan) {
        return Err(format!(
            "`{}` is not available while planning; call submit_plan",
            call.name
        ));
    }
    let plan: SubmitPlanArgs = serde_json::from_value(call.arguments.clone())
        .map_err(|e| format!("invalid submit_plan arguments: {e}"))?;
    let steps: Vec<String> = plan
        .steps
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if steps.is_empty() {
        return Err("the plan has no steps".into());
    }
    Ok(steps.into_iter().take(max_steps).collect())
}

fn steps_from_text(text: &str, max_steps: usize) -> Option<Vec<String>> {
    let steps: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter_map(|line| {
            let rest = line.trim_start_matches(|c: char| c.is_ascii_digit());
            let marker_len = line.len() - rest.len();
            let rest = if marker_len > 0 {
                rest.strip_prefix('.').or_else(|| rest.strip_prefix(')'))?
            } else {
                rest.strip_prefix("- ")
                    .or_else(|| rest.strip_prefix("* "))?
            };
            let step = rest.trim();
            (!step.is_empty()).then(|| step.to_owned())
        })
        .take(max_steps)
        .collect();
    (!steps.is_empty()).then_some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_from_the_tool_call_or_from_text() {
        let call = |args: serde_json::Value| ToolCall {
            id: "p".into(),
            name: "submit_plan".into(),
            arguments: args,
        };
        assert_eq!(
            parse_plan(&call(serde_json::json!({"steps": ["a", " ", "b"]})), 7).unwrap(),
            ["a", "b"]
        );
        assert_eq!(
            parse_plan(&call(serde_json::json!({"steps": ["1", "2", "3"]})), 2).unwrap(),
            ["1", "2"]
        );
        assert!(
            parse_plan(&call(serde_json::json!({"steps": []})), 7)
                .unwrap_err()
                .contains("no steps")
        );
        assert!(
            parse_plan(&call(serde_json::json!({"stps": []})), 7)
                .unwrap_err()
                .contains("invalid")
        );
        assert_eq!(
            steps_from_text("Plan:\n1. read\n2) fix\n- test\nthanks", 7).unwrap(),
            ["read", "fix", "test"]
        );
        assert_eq!(steps_from_text("no list here", 7), None);
    }
}
