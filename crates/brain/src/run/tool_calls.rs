//! The turn's tool side: the agent's tool calls through the approval gate (allow, deny, or
//! ask a person, parking when nobody is there), each one's intent durable before it runs
//! and its outcome recorded after; the turn record that closes a turn; and the settling of
//! a resumed execution's interrupted turn (in-doubt calls told to the model, decided
//! approvals carried out).
//!
//! Invariants:
//! - The approval branch is written once ([`through_gate`]): a live turn and a resumed one
//!   go through the same code, the resumed one with the decision a person already made.
//! - A tool runs only after its `tool_call_started` is durable; a refused or in-doubt call
//!   still gets a result the model sees, recorded like any other.
//! - Stop means stop: once the run's token is cancelled, no call of the turn starts (each
//!   gets a "not run" result), and the running one is interrupted (`interrupted` in its
//!   `tool_call_finished`); the turn then completes, and the next boundary ends the run
//!   `shutdown`, so that a resumed run tells the model what happened.

use std::time::{Duration, Instant};

use nerve_core::Message;
use nerve_core::event::{
    ApprovalDecided, ApprovalDecision, ApprovalRequested, ChildEnding, CompactionTrigger, Decider,
    HookPoint, ToolCallFinished, ToolCallStarted, TurnCompleted,
};
use nerve_core::{
    Event, FinishReason, MessagePart, MessageRole, MicroUsd, TerminationReason, TokenUsage,
    ToolCall, ToolCallId, ToolError, ToolExecutor, ToolOutput, ToolResult, TurnRecord,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::compactor::{context_tool, run_context_tool};
use crate::guards::approval::{Approval, PolicyAction};
use crate::provider::text_tools;
use crate::run::execution::Run;
use crate::stop::Stop;
use crate::telemetry;

/// After an interrupt, how long the engine still waits for the running call's answer (the
/// sandbox's command gets SIGKILL two seconds after SIGINT; a tool that cannot be
/// interrupted is abandoned when this passes).
const INTERRUPTED_CALL_LIMIT: Duration = Duration::from_secs(5);

/// Runs `calls` in order through the approval gate. Returns the results; parks (as `Err`)
/// when a call waits for a human. Once the run is cancelled, the calls not yet started are
/// not run (each gets a result saying so).
pub(crate) async fn run_calls(
    run: &mut Run,
    turn: u32,
    calls: &[ToolCall],
) -> Result<Vec<ToolResult>, Stop> {
    let mut delegated = if run.cancel.is_cancelled() {
        Vec::new()
    } else {
        delegate_all(run, turn, calls).await?
    };
    let mut results = Vec::with_capacity(calls.len());
    for call in calls {
        if let Some(at) = delegated.iter().position(|r| r.call_id == call.id) {
            results.push(delegated.swap_remove(at));
            continue;
        }
        let result = if run.cancel.is_cancelled() {
            not_run(run, turn, call)
        } else {
            through_gate(run, turn, call, None).await?
        };
        results.push(result);
    }
    Ok(results)
}

/// Runs the turn's `delegate` calls, all at once (at most `max_parallel` children at a
/// time), before its other calls: each call's intent is durable before any child starts,
/// each child gets an even part of the parent's budget share, and each ends as its call's
/// result (recorded in the order of the calls) with its spend charged to the parent.
async fn delegate_all(
    run: &mut Run,
    turn: u32,
    calls: &[ToolCall],
) -> Result<Vec<ToolResult>, Stop> {
    let Some(delegator) = run.delegator.clone() else {
        return Ok(Vec::new());
    };
    let wanted: Vec<&ToolCall> = calls
        .iter()
        .filter(|c| c.name == crate::run::delegate::TOOL)
        .collect();
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    for call in &wanted {
        let repaired = run.take_text_repair(&call.id);
        run.journal.record(Event::ToolCallStarted(ToolCallStarted {
            turn,
            call: (*call).clone(),
            repaired,
        }));
    }
    run.journal.flush().await?;
    let config = run.config.delegation.clone();
    let (token_limit, cost_limit) = run.caller.budgets();
    let percent = config.budget_share_percent;
    let children = wanted.len();
    let budget_tokens = token_limit.map(|limit| {
        crate::run::delegate::share(limit, run.caller.usage().total(), percent, children)
    });
    let budget_cost = cost_limit.map(|limit| {
        MicroUsd(crate::run::delegate::share(
            limit.0,
            run.caller.cost().0,
            percent,
            children,
        ))
    });
    let turns_left = run
        .config
        .max_turns
        .saturating_sub(run.progress.turn_count());
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(config.max_parallel.max(1)));
    let mut running = tokio::task::JoinSet::new();
    let mut answers: Vec<Option<(ToolResult, Option<ChildEnding>)>> = vec![None; wanted.len()];
    let started = Instant::now();
    for (at, call) in wanted.iter().enumerate() {
        let args: crate::run::delegate::DelegateArgs =
            match serde_json::from_value(call.arguments.clone()) {
                Ok(args) => args,
                Err(e) => {
                    answers[at] = Some((
                        error_result(call, format!("invalid arguments for `delegate`: {e}")),
                        None,
                    ));
                    continue;
                }
            };
        let name = args
            .name
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| crate::run::delegate::DEFAULT_NAME.to_owned());
        let request = crate::run::delegate::ChildRequest {
            parent: run.execution_id,
            call_id: call.id.clone(),
            task: args.task,
            name,
            tools: args.tools,
            // At most the bound, and at most the parent's turns left (at least one).
            max_turns: args
                .max_turns
                .unwrap_or(config.max_turns)
                .clamp(1, config.max_turns.min(turns_left).max(1)),
            budget_tokens,
            budget_cost,
            cancel: run.cancel.child_token(),
        };
        let delegator = std::sync::Arc::clone(&delegator);
        let slots = std::sync::Arc::clone(&slots);
        running.spawn(async move {
            // A closed semaphore is never closed here; without a permit the child runs anyway.
            let _permit = slots.acquire_owned().await.ok();
            (at, delegator.run_child(request).await)
        });
    }
    // Ends: one join per child spawned above.
    while let Some(joined) = running.join_next().await {
        let Ok((at, outcome)) = joined else {
            continue;
        };
        answers[at] = Some(child_result(run, wanted[at], outcome));
    }
    let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut results = Vec::with_capacity(wanted.len());
    for (at, call) in wanted.iter().enumerate() {
        let answer = answers[at].take().unwrap_or_else(|| {
            (
                error_result(call, "the subagent's task failed".into()),
                None,
            )
        });
        results.push(record_ended(run, turn, answer, millis, false));
    }
    Ok(results)
}

/// A child's ending as its `delegate` call's result (and the record of the child), its
/// spend charged to the parent.
fn child_result(
    run: &mut Run,
    call: &ToolCall,
    outcome: Result<crate::run::delegate::ChildOutcome, String>,
) -> (ToolResult, Option<ChildEnding>) {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(why) => {
            let result = error_result(call, format!("the subagent could not start: {why}"));
            return (result, None);
        }
    };
    run.caller.charge(outcome.usage, outcome.cost);
    run.delegated.0 += outcome.usage;
    run.delegated.1 += outcome.cost;
    let (text, is_error) =
        crate::run::delegate::result_text(&outcome, run.config.delegation.answer_bytes);
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: run.config.trace.redactor.redact(&text).into_owned(),
        is_error,
    };
    let ending = ChildEnding {
        execution_id: outcome.child.to_string(),
        name: outcome.name,
        termination_reason: outcome.reason,
        turns: outcome.turns,
        usage: outcome.usage,
        cost: outcome.cost,
    };
    (result, Some(ending))
}

fn error_result(call: &ToolCall, content: String) -> ToolResult {
    ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error: true,
    }
}

/// A call the run was stopped before: the model is told it did not run.
fn not_run(run: &mut Run, turn: u32, call: &ToolCall) -> ToolResult {
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: "[Nerve] The call was not run: the user stopped the execution before it started."
            .into(),
        is_error: true,
    };
    finish_tool(run, turn, result, 0)
}

/// One call through the approval gate. `decided` is a person's decision already in the
/// log (a resumed execution's); without one, an `ask` asks the approver now.
async fn through_gate(
    run: &mut Run,
    turn: u32,
    call: &ToolCall,
    decided: Option<Approval>,
) -> Result<ToolResult, Stop> {
    if call.name == text_tools::UNREADABLE {
        // A call written as text that could not be read: nothing to run or approve.
        let result = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: text_tools::unreadable_result(call, &run.hands.definitions),
            is_error: true,
        };
        return Ok(finish_tool(run, turn, result, 0));
    }
    if context_tool(&run.config, call).is_some() || is_skill(run, call) {
        // recall and compress_context act on the conversation, not the workspace; skill
        // reads what the execution was given at its start.
        return execute_tool(run, turn, call).await;
    }
    let (action, rule) = run.config.policy.evaluate(call);
    match action {
        PolicyAction::Allow => {
            if run.config.policy.records_allows() {
                record_decision(
                    run,
                    turn,
                    call,
                    ApprovalDecision::Approved,
                    Decider::Policy,
                    &rule,
                    None,
                );
            }
            execute_tool(run, turn, call).await
        }
        PolicyAction::Deny => {
            record_decision(
                run,
                turn,
                call,
                ApprovalDecision::Denied,
                Decider::Policy,
                &rule,
                None,
            );
            deny(
                run,
                turn,
                call,
                &format!("denied by the tool policy ({rule})"),
            )
        }
        PolicyAction::Ask => {
            let approval = match decided {
                Some(approval) => approval,
                None => {
                    run.journal
                        .record(Event::ApprovalRequested(ApprovalRequested {
                            turn,
                            call: call.clone(),
                            rule: rule.clone(),
                        }));
                    run.journal.flush().await?;
                    let Some(approval) = run.hands.approver.decide(call, &rule).await else {
                        return Err(Stop::new(
                            TerminationReason::Parked,
                            format!(
                                "tool call {} ({}) waits for approval: nerve approve {}",
                                call.id, call.name, run.execution_id
                            ),
                        ));
                    };
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
                    );
                    approval
                }
            };
            if approval.approved {
                execute_tool(run, turn, call).await
            } else {
                let reason = approval.reason.unwrap_or_else(|| "no reason given".into());
                deny(run, turn, call, &format!("denied by the user: {reason}"))
            }
        }
    }
}

fn record_decision(
    run: &mut Run,
    turn: u32,
    call: &ToolCall,
    decision: ApprovalDecision,
    decided_by: Decider,
    rule: &str,
    reason: Option<String>,
) {
    run.journal.record(Event::ApprovalDecided(ApprovalDecided {
        turn,
        call_id: call.id.clone(),
        decision,
        decided_by,
        rule: rule.to_owned(),
        reason,
    }));
}

/// A refused call still gets a result the model sees (and it is recorded like any other).
fn deny(run: &mut Run, turn: u32, call: &ToolCall, why: &str) -> Result<ToolResult, Stop> {
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: format!("The call was not run: {why}."),
        is_error: true,
    };
    Ok(finish_tool(run, turn, result, 0))
}

/// Runs one call: its intent made durable, the tool (or context tool) run, the outcome
/// recorded, an oversized output offloaded to the archive. Where a tool call begins and
/// ends: inside its `execute_tool` span.
async fn execute_tool(run: &mut Run, turn: u32, call: &ToolCall) -> Result<ToolResult, Stop> {
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

/// Whether `call` is the `skill` tool of an execution that has skills.
fn is_skill(run: &Run, call: &ToolCall) -> bool {
    call.name == crate::run::skills::TOOL && !run.config.skills.is_empty()
}

async fn execute_tool_in(run: &mut Run, turn: u32, call: &ToolCall) -> Result<ToolResult, Stop> {
    let context = context_tool(&run.config, call);
    let skill = is_skill(run, call);
    if context.is_none()
        && !skill
        && let Some(why) = crate::run::hooks::at(
            run,
            HookPoint::PreToolUse,
            turn,
            Some(call),
            serde_json::json!({}),
        )
        .await
    {
        return deny(
            run,
            turn,
            call,
            &format!("blocked by a pre_tool_use hook: {why}"),
        );
    }
    let repaired = run.take_text_repair(&call.id);
    run.journal.record(Event::ToolCallStarted(ToolCallStarted {
        turn,
        call: call.clone(),
        repaired,
    }));
    run.journal.flush().await?;
    let started = Instant::now();
    let mut interrupted = false;
    let (content, is_error) = match context {
        None if skill => {
            let (content, is_error, loaded) =
                crate::run::skills::answer(&run.config.skills, call, turn);
            if let Some(loaded) = loaded {
                run.journal.record(Event::SkillLoaded(loaded));
            }
            (content, is_error)
        }
        Some(tool) => {
            run_context_tool(
                tool,
                call,
                &run.config,
                &mut run.window,
                &*run.archive,
                run.execution_id,
            )
            .await?
        }
        None => {
            let (output, stopped) = run_tool(&*run.hands.tools, &run.cancel, call).await;
            interrupted = stopped;
            let output = output.map_err(|e| Stop::new(TerminationReason::Error, e.to_string()))?;
            let mut content = output.content;
            if run.config.instructions.workspace
                && let Some(loaded) = run.instructions.nested(&*run.hands.tools, call).await
            {
                content.push_str(&crate::run::instructions::nested_note(&loaded));
                run.journal.record(Event::InstructionsLoaded(
                    nerve_core::event::InstructionsLoaded {
                        turn,
                        files: vec![loaded.file],
                    },
                ));
            }
            (content, output.is_error)
        }
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error,
    };
    let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    if context.is_none() && !skill {
        let outcome = serde_json::json!({
            "result": {"content": result.content, "is_error": result.is_error},
        });
        crate::run::hooks::at(run, HookPoint::PostToolUse, turn, Some(call), outcome).await;
    }
    // An oversized output goes to the archive at once; the conversation keeps a preview.
    // What recall returns stays whole: it was archived already.
    let turns = run.progress.turn_count();
    let offloaded = if context == Some(crate::run::builtin_tools::BuiltinTool::Recall) {
        None
    } else {
        run.compactor().offload(turns + 1, &result).await?
    };
    let Some((preview, block)) = offloaded else {
        return Ok(record_result(run, turn, result, millis, interrupted));
    };
    run.journal
        .record(Event::ToolCallFinished(ToolCallFinished {
            turn,
            result: result.clone(),
            duration_ms: millis,
            interrupted,
            child: None,
        }));
    let before = run.window.fill() + run.window.counter().count_text(&result.content);
    let kept = ToolResult {
        content: preview,
        ..result
    };
    run.push_message(Message::tool_result(kept.clone()));
    let index = run.window.messages().len() - 1;
    // The offload is a compaction inside the tool call's span.
    telemetry::compaction_span(run.execution_id, turn, CompactionTrigger::OutputSize)
        .in_scope(|| run.compactor().record_offload(turns, index, before, block));
    Ok(kept)
}

/// Runs a workspace tool until it ends or the run is cancelled; then the tool is told to
/// interrupt what it runs, and its answer is waited for at most [`INTERRUPTED_CALL_LIMIT`].
/// The flag says whether the call was interrupted.
/// (It takes the run's parts, not the run: a `&Run` held across an await would make the
/// run's future not `Send`, since the journal is not `Sync`.)
async fn run_tool(
    tools: &dyn ToolExecutor,
    cancel: &CancellationToken,
    call: &ToolCall,
) -> (Result<ToolOutput, ToolError>, bool) {
    let mut execution = tools.execute_until(call, Box::pin(cancel.clone().cancelled_owned()));
    tokio::select! {
        // A call that ended as the stop came counts as interrupted: its tool may have been
        // told to stop (the flag errs that way rather than hide an interrupted call).
        output = &mut execution => (output, cancel.is_cancelled()),
        () = cancel.cancelled() => {
            match tokio::time::timeout(INTERRUPTED_CALL_LIMIT, execution).await {
                Ok(output) => (output, true),
                Err(_) => (
                    Ok(ToolOutput::error(format!(
                        "[interrupted: the user stopped the execution, and the call did not stop within {}s; its effect is unknown]",
                        INTERRUPTED_CALL_LIMIT.as_secs()
                    ))),
                    true,
                ),
            }
        }
    }
}

/// Records a call's outcome and feeds it back to the model.
pub(crate) fn finish_tool(
    run: &mut Run,
    turn: u32,
    result: ToolResult,
    duration_ms: u64,
) -> ToolResult {
    record_result(run, turn, result, duration_ms, false)
}

/// [`finish_tool`] for a call that may have been interrupted.
fn record_result(
    run: &mut Run,
    turn: u32,
    result: ToolResult,
    duration_ms: u64,
    interrupted: bool,
) -> ToolResult {
    record_ended(run, turn, (result, None), duration_ms, interrupted)
}

/// Records a call's end (with its child, for a `delegate` call) and puts its result in
/// the conversation.
fn record_ended(
    run: &mut Run,
    turn: u32,
    (result, child): (ToolResult, Option<ChildEnding>),
    duration_ms: u64,
    interrupted: bool,
) -> ToolResult {
    run.journal
        .record(Event::ToolCallFinished(ToolCallFinished {
            turn,
            result: result.clone(),
            duration_ms,
            interrupted,
            child,
        }));
    run.push_message(Message::tool_result(result.clone()));
    result
}

/// Records the end of turn `number` (and the workspace's snapshot when the turn changed
/// it) and issues its commit (with a checkpoint when one is due): where a turn ends.
pub(crate) async fn complete(
    run: &mut Run,
    number: u32,
    usage: TokenUsage,
    finish: FinishReason,
    calls: &[ToolCall],
    started: Instant,
) {
    // The turn's children spent too, and were charged already: the record says so.
    let (child_usage, child_cost) = std::mem::take(&mut run.delegated);
    let record = TurnRecord {
        turn: number,
        usage: usage + child_usage,
        cost: run.caller.price(usage) + child_cost,
        tool_calls: calls.to_vec(),
        finish,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    run.journal.record(Event::TurnCompleted(TurnCompleted {
        turn: record.turn,
        usage: record.usage,
        cost: record.cost,
        tool_calls: calls.iter().map(|c| c.name.clone()).collect(),
        finish: record.finish,
        duration_ms: record.duration_ms,
    }));
    run.progress.turns.push(record);
    // Context tools (recall, compress_context, submit_plan) never touch the workspace.
    let may_have_changed = calls.iter().any(|call| {
        call.name == crate::run::delegate::TOOL
            || (context_tool(&run.config, call).is_none()
                && run.hands.tools.may_change_workspace(call))
    });
    run.workspace
        .after_turn(&mut run.journal, number, may_have_changed)
        .await;
    run.checkpoint();
}

/// The turn a crash or a park interrupted, as the log left it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Interrupted<'a> {
    /// Its number (completed turns + 1).
    pub(crate) number: u32,
    /// The usage of its model call, already charged.
    pub(crate) usage: TokenUsage,
    /// Calls started and never finished: their effect is unknown.
    pub(crate) in_doubt: &'a [ToolCallId],
    /// Decisions a person made on calls that were waiting for approval.
    pub(crate) approvals: &'a [(ToolCallId, Approval)],
    /// Calls of the turn that did finish.
    pub(crate) finished: &'a [ToolCall],
}

/// Settles the interrupted turn: the calls of the last assistant message that have no
/// result yet are told to the model when in doubt (never re-run), or go through the gate
/// with the decision already made; then the turn is completed. When every call had
/// finished, only the turn record was missing: it is written.
///
/// The settled turn is a `turn` span of the resumed execution (its model call is in the
/// interrupted run's trace), and each call settled here an `execute_tool` span under it:
/// an in-doubt call's span carries the error result the model is told, a decided call's
/// is the one [`execute_tool`] opens (or none when the decision refused it).
pub(crate) async fn settle(run: &mut Run, turn: Interrupted<'_>) -> Result<(), Stop> {
    let started = Instant::now();
    let pending = unanswered_calls(run.window.messages());
    if pending.is_empty() && turn.finished.is_empty() {
        return Ok(());
    }
    let span = telemetry::turn_span(telemetry::TurnInfo {
        execution_id: run.execution_id,
        turn: turn.number,
        step: run.progress.step,
        fill: run.window.fill(),
        capacity: run.config.context_window,
    });
    let calls = settle_in(run, turn, pending, started)
        .instrument(span.clone())
        .await?;
    telemetry::record_turn_end(
        &span,
        FinishReason::ToolCalls.as_str(),
        calls,
        turn.usage,
        run.caller.price(turn.usage),
    );
    Ok(())
}

/// Settles `pending` and completes the turn; returns how many calls the turn made.
async fn settle_in(
    run: &mut Run,
    turn: Interrupted<'_>,
    pending: Vec<ToolCall>,
    started: Instant,
) -> Result<usize, Stop> {
    for call in &pending {
        // A child in flight is resumed (or its ending read): its call is not in doubt.
        if turn.in_doubt.contains(&call.id)
            && call.name == crate::run::delegate::TOOL
            && let Some(delegator) = run.delegator.clone()
        {
            let started = Instant::now();
            let resumed = delegator
                .resume_child(run.execution_id, call.id.clone(), run.cancel.child_token())
                .await;
            if let Some(outcome) = resumed {
                let answer = child_result(run, call, outcome);
                let millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                record_ended(run, turn.number, answer, millis, false);
                continue;
            }
        }
        if turn.in_doubt.contains(&call.id) {
            let result = ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: "[Nerve] The execution stopped while this call was running, so its effect is unknown. \
                          Check the workspace before running it again."
                    .into(),
                is_error: true,
            };
            let span = telemetry::tool_span(run.execution_id, turn.number, call, &run.config.trace);
            telemetry::record_tool_result(&span, &run.config.trace, Ok(&result));
            span.in_scope(|| finish_tool(run, turn.number, result, 0));
            continue;
        }
        let decided = turn
            .approvals
            .iter()
            .find(|(id, _)| *id == call.id)
            .map(|(_, approval)| approval.clone());
        through_gate(run, turn.number, call, decided).await?;
    }
    let mut calls = turn.finished.to_vec();
    calls.extend(pending);
    complete(
        run,
        turn.number,
        turn.usage,
        FinishReason::ToolCalls,
        &calls,
        started,
    )
    .await;
    Ok(calls.len())
}

/// The calls of the last assistant message that have no result yet.
fn unanswered_calls(messages: &[Message]) -> Vec<ToolCall> {
    let answered: Vec<&ToolCallId> = messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|part| match part {
            MessagePart::ToolResult(result) => Some(&result.call_id),
            MessagePart::Text { .. }
            | MessagePart::ToolCall(_)
            | MessagePart::Thinking { .. }
            | MessagePart::CompactionSummary { .. } => None,
        })
        .collect();
    messages
        .iter()
        .rev()
        .find(|m| m.role == MessageRole::Assistant)
        .map(|m| {
            m.tool_calls()
                .filter(|call| !answered.contains(&&call.id))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}
