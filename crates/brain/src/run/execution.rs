//! A running execution: the parts that do the work, owned side by side, and the few
//! operations that span them (the turn-boundary guardrails, the checkpoint, task
//! transitions, a model call that may compact on overflow). The loops (`react`, `plan`)
//! drive a `Run`; `engine` builds one and records its start and finish.
//!
//! The parts, each with one job:
//! - [`Journal`]: batches events, issues commits, knows the head of the commit chain;
//! - [`Window`]: the conversation, its token counts, the compaction state;
//! - [`ModelCaller`]: model calls with retries, budget checks and charges;
//! - [`Hands`]: the tools and who approves their calls; `turn` runs the calls through the
//!   approval gate.
//!
//! Compaction borrows the window, the journal and the caller for one operation
//! ([`Run::compactor`]); nothing else changes the conversation besides appending to it.

use nerve_core::event::ModelErrorKind;
use std::sync::Arc;
use std::time::Instant;

use nerve_core::event::{CallPurpose, TaskTransition, ToolProtocolSwitched, ToolTransport};
use nerve_core::{
    ContextArchive, Event, ExecutionId, FinishReason, LoopType, Message, MessagePart, Snapshot,
    TaskId, TaskStatus, TerminationReason, ToolCallId, ToolDefinition, ToolExecutor, TurnRecord,
};
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::context::compactor::Compactor;
use crate::context::window::Window;
use crate::guards::approval::Approver;
use crate::guards::stagnation::StagnationDetector;
use crate::provider::model_call::ModelResponse;
use crate::provider::text_tools::{self, ToolProtocol};
use crate::run::journal::Journal;
use crate::run::model_caller::{CallError, ModelCaller};
use crate::stop::Stop;

/// How many times one model call compacts after the server refused its prompt as over the
/// window, when every refusal states the server's count of the prompt (each compaction is
/// then aimed by that count, and a refusal after it is new information). A refusal that
/// states no count gets one compaction and one retry (the design's contract).
const OVERFLOW_COMPACTIONS: u32 = 3;

/// How many times one model call is asked again after its answer ran away (each time with
/// a note about it in the conversation); then the run ends `error`.
const RUNAWAY_RETRIES: u32 = 2;

/// Counters of the one-shot and bounded guardrails.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Guards {
    pub(crate) near_budget_warned: bool,
    pub(crate) max_tokens_continuations: u32,
    pub(crate) premature_reprompts: u32,
}

/// Where the execution stands: what the conversation does not show.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub(crate) task_id: TaskId,
    pub(crate) task_status: TaskStatus,
    /// The loop that runs (never `auto` once resolved).
    pub(crate) loop_type: LoopType,
    pub(crate) turns: Vec<TurnRecord>,
    /// Checkpoints taken by this run.
    pub(crate) checkpoints: u32,
    pub(crate) guards: Guards,
    /// The plan step the loop is in (1-based), for events scoped to a step.
    pub(crate) step: Option<u32>,
}

impl Progress {
    pub(crate) fn turn_count(&self) -> u32 {
        u32::try_from(self.turns.len()).unwrap_or(u32::MAX)
    }
}

/// The tools of an execution and who approves their calls.
pub(crate) struct Hands {
    pub(crate) tools: Arc<dyn ToolExecutor>,
    /// Who answers `ask` rules; `Unattended` parks instead.
    pub(crate) approver: Arc<dyn Approver>,
    /// Offered every turn: the sandbox's tools and the context tools. Shared, not copied:
    /// the definitions hold JSON schemas.
    pub(crate) definitions: Arc<[ToolDefinition]>,
}

/// Everything a loop needs while it runs.
pub(crate) struct Run {
    pub(crate) execution_id: ExecutionId,
    pub(crate) config: EngineConfig,
    pub(crate) journal: Journal,
    pub(crate) window: Window,
    pub(crate) caller: ModelCaller,
    pub(crate) hands: Hands,
    /// Where compaction archives what it takes out.
    pub(crate) archive: Arc<dyn ContextArchive>,
    pub(crate) progress: Progress,
    pub(crate) stagnation: StagnationDetector,
    /// Workspace snapshots at turn boundaries.
    pub(crate) workspace: crate::run::workspace_tracker::WorkspaceTracker,
    pub(crate) cancel: CancellationToken,
    /// How the agent provider carries tool calls (its `tool_protocol`).
    pub(crate) tool_protocol: ToolProtocol,
    /// Whether calls travel as text now: on `text`, and on `auto` once it switched.
    pub(crate) tools_as_text: bool,
    /// The calls of the last answer read from text that had to be repaired, and what was
    /// repaired: their `tool_call_started` events say so.
    pub(crate) text_repairs: Vec<(ToolCallId, String)>,
    /// The directories looked in for project instructions, and the files given.
    pub(crate) instructions: crate::run::instructions::Tracker,
    /// The user's hooks, when any are configured.
    pub(crate) hooks: Option<Arc<dyn nerve_core::Hooks>>,
    /// Runs `delegate` calls' children; `None` when the execution does not delegate.
    pub(crate) delegator: Option<crate::run::delegate::SharedDelegator>,
    /// What this turn's children spent (charged already), for its turn record.
    pub(crate) delegated: (nerve_core::TokenUsage, nerve_core::MicroUsd),
}

impl Run {
    /// What was repaired to read `call` from text, if anything (said once).
    pub(crate) fn take_text_repair(&mut self, call: &ToolCallId) -> Option<String> {
        let at = self.text_repairs.iter().position(|(id, _)| id == call)?;
        Some(self.text_repairs.swap_remove(at).1)
    }

    /// Appends `message` to the conversation (recorded).
    pub(crate) fn push_message(&mut self, message: Message) {
        self.window.push(&mut self.journal, message);
    }

    /// The compaction machinery on this run's window.
    pub(crate) fn compactor(&mut self) -> Compactor<'_> {
        Compactor {
            execution: self.execution_id,
            config: &self.config,
            window: &mut self.window,
            journal: &mut self.journal,
            caller: &mut self.caller,
            archive: &*self.archive,
        }
    }

    /// Every `checkpoint_every` turns, a snapshot of the state the conversation does not
    /// show (the conversation itself is in the log, message by message, so the snapshot
    /// stays small and a turn's cost stays flat however long the history grows). Either
    /// way the turn's events are issued here and written during the next model call.
    pub(crate) fn checkpoint(&mut self) {
        let every = self.config.checkpoint_every;
        let turn = self.progress.turn_count();
        if every == 0 || !turn.is_multiple_of(every) {
            self.journal.issue(None);
            return;
        }
        let guards = self.progress.guards;
        let snapshot = serde_json::json!({
            "turn": turn,
            "messages": self.window.messages().len(),
            "usage": self.caller.usage(),
            "cost": self.caller.cost(),
            "task_status": self.progress.task_status,
            "loop_type": self.progress.loop_type,
            "compactions": self.window.compaction.count,
            "archived_blocks": self.window.compaction.archived_blocks,
            "step": self.progress.step,
            "guards": {
                "near_budget_warned": guards.near_budget_warned,
                "max_tokens_continuations": guards.max_tokens_continuations,
                "premature_reprompts": guards.premature_reprompts,
            },
        });
        // Counted now: a commit that fails fails the run at its next flush.
        self.journal.issue(Some(Snapshot {
            turn,
            state: snapshot,
        }));
        self.progress.checkpoints += 1;
    }

    pub(crate) fn transition(&mut self, to: TaskStatus) -> Result<(), Stop> {
        let from = self.progress.task_status;
        from.transition(to)
            .map_err(|e| Stop::new(TerminationReason::Error, e.to_string()))?;
        self.journal
            .record(Event::TaskTransition(TaskTransition { from, to }));
        self.progress.task_status = to;
        Ok(())
    }

    /// The checks made at every turn boundary, in order: cancellation, wall clock, turns.
    pub(crate) fn check_boundary(&self) -> Result<(), Stop> {
        if self.cancel.is_cancelled() {
            return Err(Stop::shutdown());
        }
        if self
            .caller
            .deadline()
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(Stop::new(
                TerminationReason::TimedOut,
                "wall-clock timeout reached",
            ));
        }
        if self.progress.turn_count() >= self.config.max_turns {
            return Err(Stop::new(
                TerminationReason::MaxTurns,
                format!("reached the limit of {} turns", self.config.max_turns),
            ));
        }
        Ok(())
    }

    /// Once per execution, when 512 tokens or 10% of the cost limit are left, tells the
    /// model to wrap up.
    pub(crate) fn warn_near_budget(&mut self) {
        if self.progress.guards.near_budget_warned {
            return;
        }
        if self
            .caller
            .near_budget(self.config.reserve_tokens, self.config.reserve_cost_percent)
        {
            self.progress.guards.near_budget_warned = true;
            self.push_message(Message::user(
                "[Nerve] The budget for this task is nearly spent. Finish the most important remaining work \
                 now and give your final answer.",
            ));
        }
    }

    /// One model call on the conversation, with retries. When the window overflows, it
    /// compacts now, whatever the thresholds say, and asks once more; when the refusals
    /// state the server's count of the prompt, up to [`OVERFLOW_COMPACTIONS`] times, each
    /// compaction aimed by that count. A runaway answer is asked for again with a note,
    /// the request fitted again with it.
    pub(crate) async fn call_model(
        &mut self,
        turn: u32,
        purpose: CallPurpose,
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, Stop> {
        let mut compactions = 0;
        // Ends: each pass is one call (its retries bounded in ModelCaller::call); after an
        // overflow it compacts at most OVERFLOW_COMPACTIONS times (once when the refusal
        // states no count), a compaction that frees nothing ends the run, and a
        // runaway answer is asked again at most RUNAWAY_RETRIES times.
        let mut runaways = 0;
        loop {
            let (message, stated) = match self.call_once(turn, purpose, tools).await {
                Ok(response) => return Ok(self.read_text_calls(turn, tools, response)),
                Err(CallError::Stop(stop)) => return Err(stop),
                Err(CallError::Runaway(why)) => {
                    // Asking again for the same prompt gets the same answer from a model
                    // that samples greedily: the retry carries a note about what happened.
                    runaways += 1;
                    if runaways > RUNAWAY_RETRIES {
                        return Err(Stop::new(
                            TerminationReason::Error,
                            format!("the model's answers kept running away: {why}"),
                        ));
                    }
                    self.journal.record(Event::Retry(nerve_core::event::Retry {
                        turn,
                        attempt: runaways,
                        error: ModelErrorKind::Runaway,
                        delay_ms: 0,
                    }));
                    self.push_message(Message::user(format!(
                        "[Nerve] Your last answer was stopped because {why}. Do not repeat \
                         yourself: make one tool call, or give a short final answer."
                    )));
                    // The request was fitted to the window without the note: fitted again,
                    // so that the note cannot take the retry over it.
                    let turns = self.progress.turn_count();
                    self.compactor().fit_request(turns).await?;
                    continue;
                }
                // A summary call never compacts for itself (the compactor calls the caller
                // directly); kept for the purpose's sake.
                Err(CallError::Overflow { message, .. }) if purpose == CallPurpose::Summary => {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!("provider error: context_overflow: {message}"),
                    ));
                }
                Err(CallError::Overflow {
                    message,
                    stated_tokens,
                }) => (message, stated_tokens),
            };
            if compactions > 0 && (stated.is_none() || compactions == OVERFLOW_COMPACTIONS) {
                return Err(Stop::new(
                    TerminationReason::Error,
                    format!(
                        "provider error: context_overflow: {message} (still too large after compaction)"
                    ),
                ));
            }
            if !self.compactor().compact_for_overflow(turn, stated).await? {
                return Err(Stop::new(
                    TerminationReason::Error,
                    format!(
                        "provider error: context_overflow: {message} (compaction could not make room)"
                    ),
                ));
            }
            compactions += 1;
        }
    }

    async fn call_once(
        &mut self,
        turn: u32,
        purpose: CallPurpose,
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, CallError> {
        if self.tools_as_text && !tools.is_empty() {
            // The tools go in the system prompt and the calls in the text: no API tools.
            let rendered = text_tools::render(self.window.messages(), tools);
            return self
                .caller
                .call(&mut self.journal, turn, purpose, &rendered, &[])
                .await;
        }
        self.caller
            .call(
                &mut self.journal,
                turn,
                purpose,
                self.window.messages(),
                tools,
            )
            .await
    }

    /// The calls written in the text of an answer without native calls become its calls,
    /// when the provider takes them (`tool_protocol` `text`, or `auto`: strictly, naming a
    /// known tool, and then the run switches to text, recorded). See `text_tools`.
    fn read_text_calls(
        &mut self,
        turn: u32,
        tools: &[ToolDefinition],
        mut response: ModelResponse,
    ) -> ModelResponse {
        if tools.is_empty() || response.message.tool_calls().next().is_some() {
            return response;
        }
        let strict = match self.tool_protocol {
            ToolProtocol::Native => return response,
            ToolProtocol::Text => false,
            ToolProtocol::Auto => !self.tools_as_text,
        };
        self.text_repairs.clear();
        let calls = text_tools::parse(&response.message.text_content(), tools, strict);
        if calls.is_empty() {
            return response;
        }
        if !self.tools_as_text {
            self.tools_as_text = true;
            let mut named: Vec<&str> = calls.iter().filter_map(|c| c.name.as_deref()).collect();
            named.dedup();
            self.journal
                .record(Event::ToolProtocolSwitched(ToolProtocolSwitched {
                    turn,
                    from: ToolTransport::Native,
                    to: ToolTransport::Text,
                    reason: format!(
                        "the answer wrote a call of `{}` as text and made no native call",
                        named.join("`, `")
                    ),
                }));
        }
        for (n, mut text_call) in calls.into_iter().enumerate() {
            let repaired = text_call.repaired.take();
            let call = text_call.into_call(turn, n);
            if let Some(what) = repaired {
                tracing::info!(turn, call = %call.id, %what, "repaired a call written as text");
                self.text_repairs.push((call.id.clone(), what));
            }
            response.message.parts.push(MessagePart::ToolCall(call));
        }
        response.finish = FinishReason::ToolCalls;
        response
    }
}
