//! The model caller: one model call with the budget checked before every attempt, retries
//! of transient failures with backoff (each one an event), the wall-clock deadline and
//! cancellation, and the spend of every attempt charged.
//!
//! Invariants:
//! - The budgets are checked before every attempt, retries, plan and summary calls
//!   included; the usage of every answered attempt is charged to `usage` and `cost`.
//! - Every attempt is recorded (`model_called`), answered or not. What led to the call
//!   goes to disk during the wait ([`Journal::issue`]); a retry's sleep waits for the log.
//! - A `context_overflow` is handed back ([`CallError::Overflow`]): the caller of this part
//!   decides whether compaction can make room. This part never changes the conversation.
//!
//! Streaming lands in [`ModelCaller::attempt`]: it is the one place a provider is asked,
//! so deltas will be forwarded from there while the attempt runs, and the rest (retries,
//! charges, events) stays as it is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::event::{CallPurpose, ModelCalled, Retry};
use nerve_core::{
    Event, ExecutionId, Message, MicroUsd, TerminationReason, TokenUsage, ToolDefinition,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::EngineConfig;
use crate::journal::Journal;
use crate::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use crate::retry::RetryPolicy;
use crate::stop::Stop;
use crate::telemetry::{self, TraceConfig};

/// A model call that failed: a stop, or a context overflow the caller may compact for.
#[derive(Debug)]
pub(crate) enum CallError {
    Stop(Stop),
    Overflow(String),
}

impl From<Stop> for CallError {
    fn from(stop: Stop) -> Self {
        Self::Stop(stop)
    }
}

pub(crate) struct ModelCaller {
    /// On every model call's span.
    execution_id: ExecutionId,
    provider: Arc<dyn Provider>,
    /// Answers `plan` calls when set.
    planner: Option<Arc<dyn Provider>>,
    retry: RetryPolicy,
    config: Budgets,
    deadline: Option<Instant>,
    cancel: CancellationToken,
    /// Spent so far by every call of the execution (and, resumed, before it).
    usage: TokenUsage,
    cost: MicroUsd,
    /// What an attempt's span carries.
    trace: TraceConfig,
}

/// The limits and prices the caller charges by.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    tokens: Option<u64>,
    cost: Option<MicroUsd>,
    pricing: crate::config::Pricing,
}

impl ModelCaller {
    pub(crate) fn new(
        execution_id: ExecutionId,
        provider: Arc<dyn Provider>,
        planner: Option<Arc<dyn Provider>>,
        config: &EngineConfig,
        cancel: CancellationToken,
        spent: (TokenUsage, MicroUsd),
    ) -> Self {
        Self {
            execution_id,
            provider,
            planner,
            retry: config.retry,
            config: Budgets {
                tokens: config.budget_tokens,
                cost: config.budget_cost,
                pricing: config.pricing,
            },
            deadline: config.timeout.map(|t| Instant::now() + t),
            cancel,
            usage: spent.0,
            cost: spent.1,
            trace: config.trace.clone(),
        }
    }

    /// The provider of the execution's agent calls.
    pub(crate) fn provider(&self) -> &dyn Provider {
        &*self.provider
    }

    pub(crate) fn usage(&self) -> TokenUsage {
        self.usage
    }

    pub(crate) fn cost(&self) -> MicroUsd {
        self.cost
    }

    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The cost of `usage` at this execution's prices.
    pub(crate) fn price(&self, usage: TokenUsage) -> MicroUsd {
        self.config.pricing.cost(usage)
    }

    /// The share of the tightest budget already used, in percent (0 without budgets).
    pub(crate) fn budget_used_percent(&self) -> u32 {
        let tokens = self
            .config
            .tokens
            .map_or(0, |limit| percent(self.usage.total(), limit));
        let cost = self
            .config
            .cost
            .map_or(0, |limit| percent(self.cost.0, limit.0));
        tokens.max(cost)
    }

    /// Whether what is left of a budget is at most the reserve (the near-budget warning).
    pub(crate) fn near_budget(&self, reserve_tokens: u64, reserve_cost_percent: u32) -> bool {
        let tokens_near = self
            .config
            .tokens
            .is_some_and(|limit| limit.saturating_sub(self.usage.total()) <= reserve_tokens);
        let cost_near = self.config.cost.is_some_and(|limit| {
            let reserve = limit.0 / 100 * u64::from(reserve_cost_percent);
            limit.0.saturating_sub(self.cost.0) <= reserve
        });
        tokens_near || cost_near
    }

    /// Budgets are checked before every model call, retries and plan calls included.
    fn check_budget(&self) -> Result<(), Stop> {
        if let Some(limit) = self.config.tokens
            && self.usage.total() >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!(
                    "token budget exhausted: {} of {limit} tokens used",
                    self.usage.total()
                ),
            ));
        }
        if let Some(limit) = self.config.cost
            && self.cost >= limit
        {
            return Err(Stop::new(
                TerminationReason::BudgetExhausted,
                format!("cost budget exhausted: {} of {limit} spent", self.cost),
            ));
        }
        Ok(())
    }

    /// One model call with retries on `messages`. The usage of every attempt is charged.
    pub(crate) async fn call(
        &mut self,
        journal: &mut Journal,
        turn: u32,
        purpose: CallPurpose,
        messages: &[Message],
        tools: &[ToolDefinition],
    ) -> Result<ModelResponse, CallError> {
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
            // answer leads to waits for both.
            journal.issue(None);
            let request = ModelRequest {
                messages,
                tools,
                purpose,
            };
            let result = self.attempt(&*provider, request, turn, attempt).await?;
            let (outcome, usage) = match &result {
                Ok(response) => ("ok", response.usage),
                Err(error) => (error.kind(), TokenUsage::default()),
            };
            journal.record(Event::ModelCalled(ModelCalled {
                turn,
                purpose,
                outcome: outcome.to_owned(),
                usage,
            }));
            match result {
                Ok(response) => {
                    self.usage += response.usage;
                    self.cost += self.config.pricing.cost(response.usage);
                    return Ok(response);
                }
                Err(ProviderError::Transient {
                    kind,
                    message,
                    retry_after,
                }) => {
                    let next = self.retry.next_delay(attempt, slept, kind, retry_after);
                    let Some(delay) = next else {
                        return Err(Stop::new(
                            TerminationReason::Error,
                            format!("provider failed after {attempt} attempts: {kind}: {message}"),
                        )
                        .into());
                    };
                    let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    journal.record(Event::Retry(Retry {
                        turn,
                        attempt,
                        error: kind.to_owned(),
                        delay_ms,
                    }));
                    journal.flush().await.map_err(Stop::from)?;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.cancel.cancelled() => return Err(Stop::shutdown().into()),
                    }
                    slept += delay;
                    attempt += 1;
                }
                Err(ProviderError::ContextOverflow(message)) => {
                    return Err(CallError::Overflow(message));
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

    /// One attempt: the provider asked once, within the wall-clock deadline. `Err` only
    /// when the deadline passed; the provider's own failure is the inner result. Each
    /// attempt is one `chat` span, a deadline cut-off included (an error span).
    async fn attempt(
        &self,
        provider: &dyn Provider,
        request: ModelRequest<'_>,
        turn: u32,
        attempt: u32,
    ) -> Result<Result<ModelResponse, ProviderError>, Stop> {
        let span = telemetry::chat_span(
            telemetry::ChatInfo {
                execution_id: self.execution_id,
                provider: provider.name(),
                model: provider.model(),
                purpose: request.purpose,
                turn,
                attempt,
            },
            &self.trace,
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
                        &self.trace,
                        crate::provider::kind::TIMEOUT,
                        why,
                    );
                    return Err(Stop::new(TerminationReason::TimedOut, why));
                }
            },
            None => call.await,
        };
        let usage = result.as_ref().map(|r| r.usage).unwrap_or_default();
        telemetry::record_chat_result(
            &span,
            &self.trace,
            provider.model(),
            &result,
            self.config.pricing.cost(usage),
        );
        Ok(result)
    }
}

fn percent(used: u64, limit: u64) -> u32 {
    if limit == 0 {
        return 100;
    }
    u32::try_from(u128::from(used) * 100 / u128::from(limit)).unwrap_or(u32::MAX)
}
