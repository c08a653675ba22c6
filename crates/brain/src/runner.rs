//! The state of a running execution and the operations every loop shares: recording
//! events, appending messages, the turn-boundary guardrails, and model calls with retries.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use nerve_core::event::{CallPurpose, MessageAppended, ModelCalled, Retry, TaskTransition};
use nerve_core::{
    ContextArchive, Event, EventSink, ExecutionId, Message, SinkError, Snapshot, TaskStatus,
    TerminationReason, TokenUsage, ToolDefinition, ToolExecutor,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::approval::Approver;
use crate::compaction::CompactionStrategyRequest;
use crate::context::AgentContext;
use crate::engine::EngineConfig;
use crate::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use crate::stagnation::StagnationDetector;
use crate::telemetry;
use crate::tokens::TokenCounter;

/// Why a loop stopped; carried out of the guardrail checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stop {
    pub(crate) reason: TerminationReason,
    pub(crate) error: Option<String>,
}

impl Stop {
    pub(crate) fn new(reason: TerminationReason, error: impl Into<String>) -> Self {
        Self {
            reason,
            error: Some(error.into()),
        }
    }

    pub(crate) fn completed() -> Self {
        Self {
            reason: TerminationReason::Completed,
            error: None,
        }
    }

    pub(crate) fn shutdown() -> Self {
        Self {
            reason: TerminationReason::Shutdown,
            error: None,
        }
    }
}

impl From<SinkError> for Stop {
    fn from(error: SinkError) -> Self {
        Self::new(TerminationReason::Error, error.to_string())
    }
}

/// Counters of the one-shot and bounded guardrails.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Guards {
    pub(crate) near_budget_warned: bool,
    pub(crate) max_tokens_continuations: u32,
    pub(crate) premature_reprompts: u32,
}

/// Everything a loop needs while it runs.
pub(crate) struct Run {
    pub(crate) execution_id: ExecutionId,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) planner: Option<Arc<dyn Provider>>,
    pub(crate) tools: Arc<dyn ToolExecutor>,
    pub(crate) approver: Arc<dyn Approver>,
    pub(crate) tool_definitions: Arc<[ToolDefinition]>,
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) config: EngineConfig,
    pub(crate) ctx: AgentContext,
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: Option<Instant>,
    pub(crate) stagnation: StagnationDetector,
    pub(crate) guards: Guards,
    /// The plan step the loop is in (1-based), for events scoped to a step.
    pub(crate) step: Option<u32>,
    /// Where compaction archives what it takes out.
    pub(crate) archive: Arc<dyn ContextArchive>,
    pub(crate) counter: Arc<dyn TokenCounter>,
    /// Token count of each message of `ctx.messages`, kept in step with it.
    pub(crate) counts: Vec<u64>,
    /// Tokens of the tool definitions offered every turn.
    pub(crate) tool_tokens: u64,
    pub(crate) compaction: CompactionState,
    /// Messages from this index on belong to the active plan step: never compacted.
    pub(crate) protect_from: Option<usize>,
    /// Events recorded but not yet committed; see [`Run::record`].
    pub(crate) pending: Mutex<Vec<Event>>,
    /// The commits issued and not yet waited for, chained in order (the turn boundary's,
    /// on its way to disk while the next model call runs); see [`Run::commit_behind`].
    pub(crate) in_flight: Mutex<Option<InFlight>>,
}

/// A commit issued and not yet waited for: a sink's future, polled once so that its batch
/// has taken its place in the execution's order (see [`EventSink::commit`]).
pub(crate) type InFlight = Pin<Box<dyn Future<Output = Result<Option<u64>, SinkError>> + Send>>;

/// The guards of compaction, reset on resume.
#[derive(Debug, Clone, Default)]
pub(crate) struct CompactionState {
    /// No automatic compaction before this turn (after a failure).
    pub(crate) cooldown_until: u32,
    /// The fill at which summarising last failed to shrink the context: no new attempt
    /// until the conversation has grown past it.
    pub(crate) exhausted_at: Option<u64>,
    pub(crate) archived_blocks: usize,
    /// A `compress_context` call waiting for the turn boundary.
    pub(crate) requested: Option<CompactionStrategyRequest>,
}

impl Run {
    /// Records `event` as the execution's next. Events are committed in batches, each one
    /// durable before whatever may follow it matters: [`Run::flush`] runs before a tool is
    /// called (its intent is durable before any side effect), before a retry's sleep or a
    /// person's approval, once the run has started, and with the finish event. At a turn
    /// boundary ([`Run::checkpoint`]) and before a model call the commit starts without
    /// being waited for ([`Run::commit_behind`]): it reaches the disk while the model
    /// answers, and the next flush waits for it. A crash in between loses only events that
    /// changed nothing outside the process: the log stays a consistent prefix. One commit
    /// per step instead of per event, and the turn's end committed during the next model
    /// call, is what keeps a turn cheap (see docs/benchmarks.md, "End to end").
    pub(crate) async fn record(&self, event: Event) -> Result<(), SinkError> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
        Ok(())
    }

    /// Issues a commit of the events recorded so far (with `checkpoint` after them) without
    /// waiting for the disk: it is written while the loop goes on to its next model call,
    /// and the next [`Run::flush`] (before a tool runs, before any other wait, with the
    /// finish) waits for it. Only for what comes before a model call, which changes nothing
    /// outside the process: a tool's intent and everything up to an approval or the finish
    /// are still durable before they matter.
    async fn commit_behind(&self, checkpoint: Option<Snapshot>) {
        let Some(next) = self.issue(checkpoint).await else {
            return;
        };
        let mut slot = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *slot = Some(match slot.take() {
            // Behind those still in flight: waited for in order.
            Some(before) => Box::pin(async move {
                before.await?;
                next.await
            }),
            None => next,
        });
    }

    /// Hands the recorded events to the sink and polls its commit once, which queues the
    /// batch behind every batch issued before; `None` when there is nothing to commit.
    async fn issue(&self, checkpoint: Option<Snapshot>) -> Option<InFlight> {
        let events =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        if events.is_empty() && checkpoint.is_none() {
            return None;
        }
        let sink = Arc::clone(&self.sink);
        let execution = self.execution_id;
        let mut commit: InFlight =
            Box::pin(async move { sink.commit(execution, events, checkpoint).await });
        let polled = std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await;
        Some(match polled {
            Poll::Ready(done) => Box::pin(std::future::ready(done)),
            Poll::Pending => commit,
        })
    }

    /// Makes every event recorded so far durable: issues their commit, then waits for it
    /// and every commit issued before it. The batch is queued before the earlier commits
    /// are waited for, so that a group-committing sink may write them in one transaction.
    /// When an earlier commit failed, this fails with its error; a tool call whose intent
    /// was queued behind it then never runs.
    pub(crate) async fn flush(&self) -> Result<(), SinkError> {
        self.commit_behind(None).await;
        let in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match in_flight {
            Some(commits) => commits.await.map(|_| ()),
            None => Ok(()),
        }
    }

    pub(crate) async fn push_message(&mut self, message: Message) -> Result<(), SinkError> {
        let index = u32::try_from(self.ctx.messages.len()).unwrap_or(u32::MAX);
        self.record(Event::MessageAppended(MessageAppended {
            index,
            message: message.clone(),
        }))
        .await?;
        self.counts.push(self.counter.count_message(&message));
        self.ctx.messages.push(message);
        Ok(())
    }

    /// Every `checkpoint_every` turns, a snapshot of the state the conversation does not
    /// show (the conversation itself is in the log, message by message, so the snapshot
    /// stays small and a turn's cost stays flat however long the history grows).
    pub(crate) async fn checkpoint(&mut self) -> Result<(), Stop> {
        let every = self.config.checkpoint_every;
        let turn = self.ctx.turn_count();
        if every == 0 || !turn.is_multiple_of(every) {
            self.commit_behind(None).await;
            return Ok(());
        }
        let snapshot = serde_json::json!({
            "turn": turn,
            "messages": self.ctx.messages.len(),
            "usage": self.ctx.usage,
            "cost": self.ctx.cost,
            "task_status": self.ctx.task_status,
            "loop_type": self.ctx.loop_type,
            "compactions": self.ctx.compactions,
            "archived_blocks": self.compaction.archived_blocks,
            "step": self.step,
            "guards": {
                "near_budget_warned": self.guards.near_budget_warned,
                "max_tokens_continuations": self.guards.max_tokens_continuations,
                "premature_reprompts": self.guards.premature_reprompts,
            },
        });
        let snapshot = Snapshot {
            turn,
            state: snapshot,
        };
        // Counted now: a commit that fails fails the run at its next commit.
        self.commit_behind(Some(snapshot)).await;
        self.ctx.checkpoints += 1;
        Ok(())
    }

    /// Tokens the next request will carry: every message plus the tool definitions.
    pub(crate) fn fill(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.tool_tokens
    }

    pub(crate) async fn transition(&mut self, to: TaskStatus) -> Result<(), Stop> {
        let from = self.ctx.task_status;
        from.transition(to)
            .map_err(|e| Stop::new(TerminationReason::Error, e.to_string()))?;
        self.record(Event::TaskTransition(TaskTransition { from, to }))
            .await?;
        self.ctx.task_status = to;
        Ok(())
    }

    /// The checks made at every turn boundary, in order: cancellation, wall clock, turns.
    pub(crate) fn check_boundary(&self) -> Result<(), Stop> {
        if self.cancel.is_cancelled() {
            return Err(Stop::shutdown());
        }
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() >= deadline)
        {
            return Err(Stop::new(
                TerminationReason::TimedOut,
                "wall-clock timeout reached",
            ));
        }
        if self.ctx.turn_count() >= self.config.max_turns {
            return Err(Stop::new(
                TerminationReason::MaxTurns,
                format!("reached the limit of {} turns", self.config.max_turns),
            ));
        }
        Ok(())
    }

    /// Budgets are checked before every model call, retries and plan calls included.
    fn check_budget(&self) -> Result<(), Stop> {
        if let Some(limit) = self.config.budget_tokens
            && self.ctx.usage.total() >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!(
                    "token budget exhausted: {} of {limit} tokens used",
                    self.ctx.usage.total()
                ),
            ));
        }
        if let Some(limit) = self.config.budget_cost
            && self.ctx.cost >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!("cost budget exhausted: {} of {limit} spent", self.ctx.cost),
            ));
        }
        Ok(())
    }

    /// The share of the tightest budget already used, in percent (0 without budgets).
    pub(crate) fn budget_used_percent(&self) -> u32 {
        let tokens = self
            .config
            .budget_tokens
            .map_or(0, |limit| percent(self.ctx.usage.total(), limit));
        let cost = self
            .config
            .budget_cost
            .map_or(0, |limit| percent(self.ctx.cost.0, limit.0));
        tokens.max(cost)
    }

    /// Once per execution, when 512 tokens or 10% of the cost limit are left, tells the
    /// model to wrap up.
    pub(crate) async fn warn_near_budget(&mut self) -> Result<(), Stop> {
        if self.guards.near_budget_warned {
            return Ok(());
        }
        let tokens_near = self.config.budget_tokens.is_some_and(|limit| {
            limit.saturating_sub(self.ctx.usage.total()) <= self.config.reserve_tokens
        });
        let cost_near = self.config.budget_cost.is_some_and(|limit| {
            let reserve = limit.0 / 100 * u64::from(self.config.reserve_cost_percent);
            limit.0.saturating_sub(self.ctx.cost.0) <= reserve
        });
        if tokens_near || cost_near {
            self.guards.near_budget_warned = true;
            self.push_message(Message::user(
                "[Nerve] The budget for this task is nearly spent. Finish the most important remaining work \
                 now and give your final answer.",
            ))
            .await?;
        }
        Ok(())
    }

    /// One model call with retries. The usage of every attempt is charged.
    pub(crate) async fn call_model(
        &mut self,
        turn: u32,
        purpose: CallPurpose,
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, Stop> {
        match self.call_model_on(turn, purpose, None, tools).await {
            Err(Overflow::Context(message)) if purpose != CallPurpose::Summary => {
                // The window overflowed: compact now, whatever the thresholds say, and retry once.
                let compacted = self.compact_for_overflow(turn).await?;
                if !compacted {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!(
                            "provider error: context_overflow: {message} (compaction could not make room)"
                        ),
                    ));
                }
                match self.call_model_on(turn, purpose, None, tools).await {
                    Ok(response) => Ok(response),
                    Err(Overflow::Context(message)) => Err(Stop::new(
                        TerminationReason::Error,
                        format!(
                            "provider error: context_overflow: {message} (still too large after compaction)"
                        ),
                    )),
                    Err(Overflow::Stop(stop)) => Err(stop),
                }
            }
            Err(Overflow::Context(message)) => Err(Stop::new(
                TerminationReason::Error,
                format!("provider error: context_overflow: {message}"),
            )),
            Err(Overflow::Stop(stop)) => Err(stop),
            Ok(response) => Ok(response),
        }
    }

    /// One model call with retries on `messages` (the conversation when `None`).
    pub(crate) async fn call_model_on(
        &mut self,
        turn: u32,
        purpose: CallPurpose,
        messages: Option<&[Message]>,
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, Overflow> {
        let provider = match (purpose, &self.planner) {
            (CallPurpose::Plan, Some(planner)) => Arc::clone(planner),
            (CallPurpose::Plan | CallPurpose::Agent | CallPurpose::Summary, _) => {
                Arc::clone(&self.provider)
            }
        };
        let mut attempt = 1;
        let mut slept = Duration::ZERO;
        loop {
            self.check_budget()?;
            if self.cancel.is_cancelled() {
                return Err(Stop::shutdown().into());
            }
            // What led to this call (a compaction, a reminder) goes to disk during the wait,
            // behind the turn boundary's commit if that is still running; whatever the
            // answer leads to waits for both (see `Run::commit_behind`).
            self.commit_behind(None).await;
            let request = ModelRequest {
                messages: messages.unwrap_or(&self.ctx.messages),
                tools,
                purpose,
            };
            let span = telemetry::chat_span(
                telemetry::ChatInfo {
                    execution_id: self.execution_id,
                    provider: provider.name(),
                    model: provider.model(),
                    purpose,
                    turn,
                    attempt,
                },
                &self.config.trace,
                request.messages,
            );
            let call = provider.complete(request).instrument(span.clone());
            let result = match self.deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), call).await {
                    Ok(result) => result,
                    Err(_) => {
                        let why = "wall-clock timeout reached during a model call";
                        telemetry::record_chat_error(
                            &span,
                            &self.config.trace,
                            crate::provider::kind::TIMEOUT,
                            why,
                        );
                        return Err(Stop::new(TerminationReason::TimedOut, why).into());
                    }
                },
                None => call.await,
            };
            let (outcome, usage) = match &result {
                Ok(response) => ("ok", response.usage),
                Err(error) => (error.kind(), TokenUsage::default()),
            };
            telemetry::record_chat_result(
                &span,
                &self.config.trace,
                provider.model(),
                &result,
                self.config.pricing.cost(usage),
            );
            self.record(Event::ModelCalled(ModelCalled {
                turn,
                purpose,
                outcome: outcome.to_owned(),
                usage,
            }))
            .await?;
            match result {
                Ok(response) => {
                    self.ctx.usage += response.usage;
                    self.ctx.cost += self.config.pricing.cost(response.usage);
                    return Ok(response);
                }
                Err(ProviderError::Transient {
                    kind,
                    message,
                    retry_after,
                }) => {
                    let delay = self.config.retry.delay(attempt, retry_after);
                    if attempt >= self.config.retry.max_attempts
                        || slept + delay > self.config.retry.max_total_delay
                    {
                        return Err(Stop::new(
                            TerminationReason::Error,
                            format!("provider failed after {attempt} attempts: {kind}: {message}"),
                        )
                        .into());
                    }
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    self.record(Event::Retry(Retry {
                        turn,
                        attempt,
                        error: kind.to_owned(),
                        delay_ms,
                    }))
                    .await?;
                    self.flush().await?;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.cancel.cancelled() => return Err(Stop::shutdown().into()),
                    }
                    slept += delay;
                    attempt += 1;
                }
                Err(ProviderError::ContextOverflow(message)) => {
                    return Err(Overflow::Context(message));
                }
                Err(error @ ProviderError::Permanent { .. }) => {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!("provider error: {error}"),
                    )
                    .into());
                }
            }
        }
    }
}

/// A model call that failed: a stop, or a context overflow the caller may compact for.
#[derive(Debug)]
pub(crate) enum Overflow {
    Stop(Stop),
    Context(String),
}

impl From<Stop> for Overflow {
    fn from(stop: Stop) -> Self {
        Self::Stop(stop)
    }
}

impl From<SinkError> for Overflow {
    fn from(error: SinkError) -> Self {
        Self::Stop(error.into())
    }
}

fn percent(used: u64, limit: u64) -> u32 {
    if limit == 0 {
        return 100;
    }
    u32::try_from(u128::from(used) * 100 / u128::from(limit)).unwrap_or(u32::MAX)
}
