//! The state of a running execution and the operations every loop shares: recording
//! events, appending messages, the turn-boundary guardrails, and model calls with retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::event::{CallPurpose, MessageAppended, ModelCalled, Retry, TaskTransition};
use nerve_core::{
    Event, EventSink, ExecutionId, Message, SinkError, TaskStatus, TerminationReason, TokenUsage,
    ToolDefinition, ToolExecutor,
};
use tokio_util::sync::CancellationToken;

use crate::approval::Approver;
use crate::context::AgentContext;
use crate::engine::EngineConfig;
use crate::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use crate::stagnation::StagnationDetector;

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
    pub(crate) tool_definitions: Vec<ToolDefinition>,
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) config: EngineConfig,
    pub(crate) ctx: AgentContext,
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: Option<Instant>,
    pub(crate) stagnation: StagnationDetector,
    pub(crate) guards: Guards,
    /// The plan step the loop is in (1-based), for events scoped to a step.
    pub(crate) step: Option<u32>,
}

impl Run {
    pub(crate) async fn record(&self, event: Event) -> Result<(), SinkError> {
        self.sink.append(self.execution_id, event).await.map(|_| ())
    }

    pub(crate) async fn push_message(&mut self, message: Message) -> Result<(), SinkError> {
        let index = u32::try_from(self.ctx.messages.len()).unwrap_or(u32::MAX);
        self.record(Event::MessageAppended(MessageAppended {
            index,
            message: message.clone(),
        }))
        .await?;
        self.ctx.messages.push(message);
        Ok(())
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
                return Err(Stop::shutdown());
            }
            let request = ModelRequest {
                messages: &self.ctx.messages,
                tools,
                purpose,
            };
            let call = provider.complete(request);
            let result = match self.deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline.into(), call).await {
                    Ok(result) => result,
                    Err(_) => {
                        return Err(Stop::new(
                            TerminationReason::TimedOut,
                            "wall-clock timeout reached during a model call",
                        ));
                    }
                },
                None => call.await,
            };
            let (outcome, usage) = match &result {
                Ok(response) => ("ok", response.usage),
                Err(error) => (error.kind(), TokenUsage::default()),
            };
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
                        ));
                    }
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    self.record(Event::Retry(Retry {
                        turn,
                        attempt,
                        error: kind.to_owned(),
                        delay_ms,
                    }))
                    .await?;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.cancel.cancelled() => return Err(Stop::shutdown()),
                    }
                    slept += delay;
                    attempt += 1;
                }
                Err(
                    error @ (ProviderError::ContextOverflow(_) | ProviderError::Permanent { .. }),
                ) => {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!("provider error: {error}"),
                    ));
                }
            }
        }
    }
}

fn percent(used: u64, limit: u64) -> u32 {
    if limit == 0 {
        return 100;
    }
    u32::try_from(u128::from(used) * 100 / u128::from(limit)).unwrap_or(u32::MAX)
}
