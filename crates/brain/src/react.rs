//! The ReAct loop: think (one model call), act (run the tool calls it asked for), observe
//! (feed the results back), until the model answers without tool calls or a guardrail
//! stops it. Its turn is also the unit of work of the plan loops' steps.

use std::sync::Arc;
use std::time::Instant;

use nerve_core::event::{
    ApprovalDecided, ApprovalDecision, ApprovalRequested, CallPurpose, CompactionTrigger, Decider,
    Stagnation, StagnationAction, ToolCallFinished, ToolCallStarted, TurnCompleted,
};
use nerve_core::{
    Event, Message, MessagePart, MessageRole, TerminationReason, ToolCall, ToolResult, TurnRecord,
};
use tracing::Instrument;

use crate::approval::PolicyAction;
use crate::provider::FinishReason;
use crate::runner::{Run, Stop};
use crate::stagnation::{TurnSignature, Verdict, corrective_message};
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

pub(crate) async fn run(run: &mut Run) -> Stop {
    loop {
        match turn(run).await {
            Ok(TurnEnd::Continue) => {}
            Ok(TurnEnd::Final(_)) => return Stop::completed(),
            Err(stop) => return stop,
        }
    }
}

/// One turn: the boundary checks, one model call, its tool calls, the turn record, and the
/// guardrails that look at the result (stagnation, max-tokens, premature end).
pub(crate) async fn turn(run: &mut Run) -> Result<TurnEnd, Stop> {
    run.check_boundary()?;
    let span = telemetry::turn_span(telemetry::TurnInfo {
        execution_id: run.execution_id,
        turn: run.ctx.turn_count() + 1,
        step: run.step,
        fill: run.fill(),
        capacity: run.config.context_window,
    });
    turn_in(run, &span).instrument(span.clone()).await
}

async fn turn_in(run: &mut Run, span: &tracing::Span) -> Result<TurnEnd, Stop> {
    run.maybe_compact().await?;
    run.warn_near_budget().await?;
    let started = Instant::now();
    let number = run.ctx.turn_count() + 1;
    // Shared, not copied: the definitions hold JSON schemas.
    let tools = Arc::clone(&run.tool_definitions);
    let response = run.call_model(number, CallPurpose::Agent, &tools).await?;
    let calls: Vec<ToolCall> = response.message.tool_calls().cloned().collect();
    let text = response.message.text_content();
    run.push_message(response.message).await?;
    let results = execute_calls(run, number, &calls).await?;
    complete_turn(
        run,
        number,
        response.usage,
        response.finish.as_str(),
        &calls,
        started,
    )
    .await?;
    telemetry::record_turn_end(
        span,
        response.finish.as_str(),
        calls.len(),
        response.usage,
        run.config.pricing.cost(response.usage),
    );
    after_turn(run, number, &calls, &results, response.finish, text).await
}

/// Records the end of turn `number`.
pub(crate) async fn complete_turn(
    run: &mut Run,
    number: u32,
    usage: nerve_core::TokenUsage,
    finish: &str,
    calls: &[ToolCall],
    started: Instant,
) -> Result<(), Stop> {
    let record = TurnRecord {
        turn: number,
        usage,
        cost: run.config.pricing.cost(usage),
        tool_calls: calls.to_vec(),
        finish: finish.to_owned(),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    run.record(Event::TurnCompleted(TurnCompleted {
        turn: record.turn,
        usage: record.usage,
        cost: record.cost,
        tool_calls: calls.iter().map(|c| c.name.clone()).collect(),
        finish: record.finish.clone(),
        duration_ms: record.duration_ms,
    }))
    .await?;
    run.ctx.turns.push(record);
    run.checkpoint().await
}

/// The guardrails that judge a finished turn.
pub(crate) async fn after_turn(
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
                record_stagnation(run, number, StagnationAction::Corrected, &report).await?;
                run.push_message(Message::user(format!(
                    "[Nerve] {}",
                    corrective_message(&report)
                )))
                .await?;
                Ok(TurnEnd::Continue)
            }
            Verdict::Terminate(report) => {
                record_stagnation(run, number, StagnationAction::Terminated, &report).await?;
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
        && run.guards.max_tokens_continuations < run.config.max_tokens_recoveries
    {
        run.guards.max_tokens_continuations += 1;
        run.push_message(Message::user(CONTINUE_AFTER_MAX_TOKENS))
            .await?;
        return Ok(TurnEnd::Continue);
    }
    if text.trim().is_empty()
        && last_tool_result_failed(&run.ctx.messages)
        && run.guards.premature_reprompts < run.config.premature_end_retries
    {
        run.guards.premature_reprompts += 1;
        run.push_message(Message::user(REPROMPT_AFTER_FAILURE))
            .await?;
        return Ok(TurnEnd::Continue);
    }
    Ok(TurnEnd::Final(text))
}

async fn record_stagnation(
    run: &Run,
    turn: u32,
    action: StagnationAction,
    report: &crate::stagnation::StagnationReport,
) -> Result<(), Stop> {
    run.record(Event::Stagnation(Stagnation {
        turn,
        action,
        repetition_ratio: report.repetition_ratio,
        cycle_length: report.cycle_length.and_then(|k| u32::try_from(k).ok()),
        repeated_calls: report.repeated_calls.clone(),
        no_progress_call: report.no_progress_call.clone(),
        step: run.step,
    }))
    .await?;
    Ok(())
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

/// Runs `calls` in order through the approval gate, recording intent before and outcome
/// after each. Returns the results; parks (as `Err`) when a call waits for a human.
pub(crate) async fn execute_calls(
    run: &mut Run,
    turn: u32,
    calls: &[ToolCall],
) -> Result<Vec<ToolResult>, Stop> {
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        if run.is_context_tool(call) {
            // recall and compress_context act on the conversation, not the workspace.
            results.push(execute_tool(run, turn, call).await?);
            continue;
        }
        let (action, rule) = run.config.policy.evaluate(call);
        let result = match action {
            PolicyAction::Allow => execute_tool(run, turn, call).await?,
            PolicyAction::Deny => {
                record_decision(
                    run,
                    turn,
                    call,
                    ApprovalDecision::Denied,
                    Decider::Policy,
                    &rule,
                    None,
                )
                .await?;
                deny(
                    run,
                    turn,
                    call,
                    &format!("denied by the tool policy ({rule})"),
                )
                .await?
            }
            PolicyAction::Ask => {
                run.record(Event::ApprovalRequested(ApprovalRequested {
                    turn,
                    call: call.clone(),
                    rule: rule.clone(),
                }))
                .await?;
                run.flush().await?;
                match run.approver.decide(call, &rule).await {
                    None => {
                        return Err(Stop::new(
                            TerminationReason::Parked,
                            format!(
                                "tool call {} ({}) waits for approval: nerve approve <id>",
                                call.id, call.name
                            ),
                        ));
                    }
                    Some(approval) => {
                        let decision = if approval.approved {
                            ApprovalDecision::Approved
                        } else {
                            ApprovalDecision::Denied
                        };
                        record_decision(
                            run,
                            turn,
                            call,
                            decision,
                            Decider::User,
                            &rule,
                            approval.reason.clone(),
                        )
                        .await?;
                        if approval.approved {
                            execute_tool(run, turn, call).await?
                        } else {
                            let reason =
                                approval.reason.unwrap_or_else(|| "no reason given".into());
                            deny(run, turn, call, &format!("denied by the user: {reason}")).await?
                        }
                    }
                }
            }
        };
        results.push(result);
    }
    Ok(results)
}

pub(crate) async fn record_decision(
    run: &Run,
    turn: u32,
    call: &ToolCall,
    decision: ApprovalDecision,
    decided_by: Decider,
    rule: &str,
    reason: Option<String>,
) -> Result<(), Stop> {
    run.record(Event::ApprovalDecided(ApprovalDecided {
        turn,
        call_id: call.id.clone(),
        decision,
        decided_by,
        rule: rule.to_owned(),
        reason,
    }))
    .await?;
    Ok(())
}

/// A refused call still gets a result the model sees (and it is recorded like any other).
pub(crate) async fn deny(
    run: &mut Run,
    turn: u32,
    call: &ToolCall,
    why: &str,
) -> Result<ToolResult, Stop> {
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: format!("The call was not run: {why}."),
        is_error: true,
    };
    finish_tool(run, turn, result, 0).await
}

/// Runs one call (intent recorded and durable first) inside its `execute_tool` span.
pub(crate) async fn execute_tool(
    run: &mut Run,
    turn: u32,
    call: &ToolCall,
) -> Result<ToolResult, Stop> {
    let span = telemetry::tool_span(run.execution_id, turn, call, &run.config.trace);
    let result = execute_tool_in(run, turn, call)
        .instrument(span.clone())
        .await;
    telemetry::record_tool_result(
        &span,
        &run.config.trace,
        result
            .as_ref()
            .map_err(|stop| stop.error.as_deref().unwrap_or("the tool call failed")),
    );
    result
}

async fn execute_tool_in(run: &mut Run, turn: u32, call: &ToolCall) -> Result<ToolResult, Stop> {
    run.record(Event::ToolCallStarted(ToolCallStarted {
        turn,
        call: call.clone(),
    }))
    .await?;
    run.flush().await?;
    let started = Instant::now();
    let (content, is_error) = if run.is_context_tool(call) {
        run.context_tool(call).await?
    } else {
        let output = run
            .tools
            .execute(call)
            .await
            .map_err(|e| Stop::new(TerminationReason::Error, e.to_string()))?;
        (output.content, output.is_error)
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error,
    };
    let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    // An oversized output goes to the archive at once; the conversation keeps a preview.
    let offloaded = if call.name == "recall" {
        None
    } else {
        run.offload(&result).await?
    };
    let Some((preview, block)) = offloaded else {
        return finish_tool(run, turn, result, millis).await;
    };
    run.record(Event::ToolCallFinished(ToolCallFinished {
        turn,
        result: result.clone(),
        duration_ms: millis,
    }))
    .await?;
    let before = run.fill() + run.counter.count_text(&result.content);
    let kept = ToolResult {
        content: preview,
        ..result
    };
    run.push_message(Message::tool_result(kept.clone())).await?;
    let span = telemetry::compaction_span(run.execution_id, turn, CompactionTrigger::OutputSize);
    run.record_offload(run.ctx.messages.len() - 1, before, block)
        .instrument(span)
        .await?;
    Ok(kept)
}

pub(crate) async fn finish_tool(
    run: &mut Run,
    turn: u32,
    result: ToolResult,
    duration_ms: u64,
) -> Result<ToolResult, Stop> {
    run.record(Event::ToolCallFinished(ToolCallFinished {
        turn,
        result: result.clone(),
        duration_ms,
    }))
    .await?;
    run.push_message(Message::tool_result(result.clone()))
        .await?;
    Ok(result)
}
