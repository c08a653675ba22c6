//! The ReAct loop: think (one model call), act (run the tool calls it asked for), observe
//! (feed the results back), until the model answers without tool calls or a guardrail
//! stops it. Its turn is also the unit of work of the plan loops' steps.

use std::sync::Arc;
use std::time::Instant;

use nerve_core::event::{CallPurpose, Stagnation, StagnationAction};
use nerve_core::{
    FinishReason, Message, MessagePart, MessageRole, TerminationReason, ToolCall, ToolResult,
};
use tracing::Instrument;

use crate::guards::stagnation::{TurnSignature, Verdict, corrective_message};
use crate::run::execution::Run;
use crate::run::tool_calls;
use crate::stop::Stop;
use crate::telemetry;

/// How a turn ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// Tool calls ran (or a guardrail re-prompted); the loop goes on.
    Continue,
    /// The model answered without tool calls: its final text.
    Final(String),
}

const CONTINUE_AFTER_MAX_TOKENS: &str =
    "[Nerve] Your answer was cut off by the output limit. Continue exactly where you stopped.";
const REPROMPT_AFTER_FAILURE: &str = "[Nerve] Your last tool call failed and you ended without an answer. \
Read the error, then either fix the problem with another tool call or explain why the task cannot be done.";
/// For a model that writes its calls as text (a small local model, in practice): an answer
/// right after a failed call, with nothing run since, is more often a fix described than a
/// fix made. Asked once per failure; a second answer ends the run.
const REPROMPT_TEXT_AFTER_FAILURE: &str = "[Nerve] Your last tool call failed and nothing has run since, \
so nothing you described has been done. If the task still needs a change, make it now with a tool call; \
if it is done or cannot be done, give your final answer again.";

pub(crate) async fn run(run: &mut Run) -> Stop {
    // Ends: each pass is one turn, and `check_boundary` ends the run at `max_turns` (and at
    // the deadline or a cancellation; the caller checks the budgets); max-tokens
    // continuations, re-prompts and stagnation corrections are bounded counters, not extra
    // turns.
    loop {
        match turn(run).await {
            Ok(TurnEnd::Continue) => {}
            Ok(TurnEnd::Final(_)) => return Stop::completed(),
            Err(stop) => return stop,
        }
    }
}

/// One turn: the boundary checks, one model call, its tool calls, the turn record, and the
/// guardrails that look at the result (stagnation, max-tokens, premature end). Where a
/// turn begins (after the boundary's compaction) and ends (`tool_calls::complete`). Its `turn`
/// span opens after the boundary checks, so the boundary's compaction is its child.
pub(crate) async fn turn(run: &mut Run) -> Result<TurnEnd, Stop> {
    run.check_boundary()?;
    let span = telemetry::turn_span(telemetry::TurnInfo {
        execution_id: run.execution_id,
        turn: run.progress.turn_count() + 1,
        step: run.progress.step,
        fill: run.window.fill(),
        capacity: run.config.context_window,
    });
    turn_in(run, &span).instrument(span.clone()).await
}

async fn turn_in(run: &mut Run, span: &tracing::Span) -> Result<TurnEnd, Stop> {
    let turns = run.progress.turn_count();
    // The warning first, so that the boundary's fit counts it: a message appended after
    // the fit could take the request over the window.
    run.warn_near_budget();
    run.compactor().maybe_compact(turns).await?;
    let started = Instant::now();
    let number = turns + 1;
    let tools = Arc::clone(&run.hands.definitions);
    let response = run.call_model(number, CallPurpose::Agent, &tools).await?;
    let calls: Vec<ToolCall> = response.message.tool_calls().cloned().collect();
    let text = response.message.text_content();
    run.push_message(response.message);
    let results = tool_calls::run_calls(run, number, &calls).await?;
    tool_calls::complete(
        run,
        number,
        response.usage,
        response.finish,
        &calls,
        started,
    )
    .await;
    telemetry::record_turn_end(
        span,
        response.finish.as_str(),
        calls.len(),
        response.usage,
        run.caller.price(response.usage),
    );
    after_turn(run, number, &calls, &results, response.finish, text)
}

/// The guardrails that judge a finished turn.
fn after_turn(
    run: &mut Run,
    number: u32,
    calls: &[ToolCall],
    results: &[ToolResult],
    finish: FinishReason,
    text: String,
) -> Result<TurnEnd, Stop> {
    if !calls.is_empty() {
        return match run.stagnation.observe(TurnSignature::new(calls, results)) {
            Verdict::Continue => Ok(TurnEnd::Continue),
            Verdict::Correct(report) => {
                record_stagnation(run, number, StagnationAction::Corrected, &report);
                run.push_message(Message::user(format!(
                    "[Nerve] {}",
                    corrective_message(&report)
                )));
                Ok(TurnEnd::Continue)
            }
            Verdict::Terminate(report) => {
                record_stagnation(run, number, StagnationAction::Terminated, &report);
                Err(Stop::new(
                    TerminationReason::Stagnation,
                    format!(
                        "the agent kept repeating itself: {}",
                        report.repeated_calls.join(", ")
                    ),
                ))
            }
        };
    }
    if finish == FinishReason::MaxTokens
        && run.progress.guards.max_tokens_continuations < run.config.max_tokens_recoveries
    {
        run.progress.guards.max_tokens_continuations += 1;
        run.push_message(Message::user(CONTINUE_AFTER_MAX_TOKENS));
        return Ok(TurnEnd::Continue);
    }
    if run.progress.guards.premature_reprompts < run.config.premature_end_retries
        && last_tool_result_failed(run.window.messages())
    {
        let reprompt = if text.trim().is_empty() {
            Some(REPROMPT_AFTER_FAILURE)
        } else if run.tools_as_text && !reprompted_since_last_result(run.window.messages()) {
            Some(REPROMPT_TEXT_AFTER_FAILURE)
        } else {
            None
        };
        if let Some(reprompt) = reprompt {
            run.progress.guards.premature_reprompts += 1;
            run.push_message(Message::user(reprompt));
            return Ok(TurnEnd::Continue);
        }
    }
    Ok(TurnEnd::Final(text))
}

/// Whether the text re-prompt was already sent after the last tool result: the model, asked
/// once, answered again, and that answer stands.
fn reprompted_since_last_result(messages: &[Message]) -> bool {
    messages
        .iter()
        .rev()
        .take_while(|m| m.role != MessageRole::Tool)
        .any(|m| m.role == MessageRole::User && m.text_content() == REPROMPT_TEXT_AFTER_FAILURE)
}

fn record_stagnation(
    run: &mut Run,
    turn: u32,
    action: StagnationAction,
    report: &crate::guards::stagnation::StagnationReport,
) {
    let step = run.progress.step;
    run.journal
        .record(nerve_core::Event::Stagnation(Stagnation {
            turn,
            action,
            repetition_ratio: report.repetition_ratio,
            cycle_length: report.cycle_length.and_then(|k| u32::try_from(k).ok()),
            repeated_calls: report.repeated_calls.clone(),
            no_progress_call: report.no_progress_call.clone(),
            step,
        }));
}

/// Whether the last tool result before the final assistant message was a failure, looking
/// past our own re-prompts and earlier empty answers.
fn last_tool_result_failed(messages: &[Message]) -> bool {
    messages
        .iter()
        .rev()
        .skip(1)
        .find(|m| match m.role {
            MessageRole::Tool => true,
            MessageRole::Assistant => {
                m.tool_calls().next().is_some() || !m.text_content().trim().is_empty()
            }
            MessageRole::User | MessageRole::System => false,
        })
        .is_some_and(|m| {
            m.parts
                .iter()
                .any(|part| matches!(part, MessagePart::ToolResult(result) if result.is_error))
        })
}
