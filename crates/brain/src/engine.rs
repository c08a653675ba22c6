//! `AgentEngine`: takes a task from `assigned` to a well-defined end. It validates the
//! task, records the start, seeds the conversation, runs a loop under the guardrails and
//! records the finish; every step is an event through the sink port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::event::{
    CallPurpose, ContextCreated, Finish, MessageAppended, ModelCalled, Retry, Started,
    TaskTransition,
};
use nerve_core::{
    CredentialKeyError, Event, EventSink, ExecutionId, LoopType, Message, MicroUsd, SinkError,
    TaskId, TaskStatus, TerminationReason, TokenUsage, ToolDefinition, ToolExecutor,
    TransitionError, validate_metadata,
};
use tokio_util::sync::CancellationToken;

use crate::context::{AgentContext, ExecutionResult};
use crate::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use crate::react;
use crate::retry::RetryPolicy;

/// Prices in micro-dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    pub input_per_million: u64,
    pub output_per_million: u64,
}

impl Pricing {
    pub fn cost(&self, usage: TokenUsage) -> MicroUsd {
        MicroUsd::for_tokens(usage.input_tokens, self.input_per_million)
            + MicroUsd::for_tokens(usage.output_tokens, self.output_per_million)
    }
}

/// The guardrails and choices of one execution.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub loop_type: LoopType,
    pub max_turns: u32,
    pub timeout: Option<Duration>,
    pub budget_tokens: Option<u64>,
    pub budget_cost: Option<MicroUsd>,
    pub pricing: Pricing,
    pub context_window: Option<u64>,
    pub retry: RetryPolicy,
    /// Settings worth recording in the start event (never secrets).
    pub recorded_config: serde_json::Value,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            loop_type: LoopType::React,
            max_turns: 20,
            timeout: None,
            budget_tokens: None,
            budget_cost: None,
            pricing: Pricing::default(),
            context_window: None,
            retry: RetryPolicy::default(),
            recorded_config: serde_json::Value::Null,
        }
    }
}

/// The work handed to the agent.
#[derive(Debug, Clone)]
pub struct Task {
    pub id: TaskId,
    pub description: String,
    /// Free-form metadata; checked for credential-like keys before anything runs.
    pub metadata: serde_json::Value,
    pub status: TaskStatus,
    /// Shown in the start event; the sandbox knows the real path.
    pub workspace: String,
}

/// Why an execution could not start. Nothing has been recorded when these are returned.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The task metadata carries credential-like keys. Not retryable: fix the task.
    #[error(transparent)]
    CredentialsInTask(#[from] CredentialKeyError),
    /// The task is in a status that cannot start (completed, cancelled). Not retryable.
    #[error("task cannot start: {0}")]
    TaskStatus(#[from] TransitionError),
    /// The budget is already exhausted before the first call. Not retryable.
    #[error("budget exhausted before start: {0}")]
    Budget(String),
}

/// Runs agents. Holds the concrete parts behind the core ports.
#[derive(Clone)]
pub struct AgentEngine {
    pub provider: Arc<dyn Provider>,
    pub tools: Arc<dyn ToolExecutor>,
    pub sink: Arc<dyn EventSink>,
    pub config: EngineConfig,
}

impl std::fmt::Debug for AgentEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEngine")
            .field("provider", &self.provider.name())
            .field("config", &self.config)
            .finish()
    }
}

const SYSTEM_PROMPT: &str = "You are Nerve, an autonomous software agent working in a sandboxed workspace. \
The workspace is your current directory (/workspace); it has no network access. Use the tools to inspect \
and change it, verify what you did, and finish with a short final answer that says what changed.";

/// Why a loop stopped early; carried out of the guardrail checks.
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
}

impl From<SinkError> for Stop {
    fn from(error: SinkError) -> Self {
        Self::new(TerminationReason::Error, error.to_string())
    }
}

/// Everything a loop needs while it runs.
pub(crate) struct Run {
    pub(crate) execution_id: ExecutionId,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) tools: Arc<dyn ToolExecutor>,
    pub(crate) tool_definitions: Vec<ToolDefinition>,
    sink: Arc<dyn EventSink>,
    pub(crate) config: EngineConfig,
    pub(crate) ctx: AgentContext,
    cancel: CancellationToken,
    deadline: Option<Instant>,
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

    async fn transition(&mut self, to: TaskStatus) -> Result<(), Stop> {
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
            return Err(Stop {
                reason: TerminationReason::Shutdown,
                error: None,
            });
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

    /// Budgets are checked before every model call, retries included.
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

    /// One model call with retries. Usage of every attempt is charged.
    pub(crate) async fn call_model(
        &mut self,
        turn: u32,
        purpose: CallPurpose,
    ) -> Result<ModelResponse, Stop> {
        let mut attempt = 1;
        let mut slept = Duration::ZERO;
        loop {
            self.check_budget()?;
            if self.cancel.is_cancelled() {
                return Err(Stop {
                    reason: TerminationReason::Shutdown,
                    error: None,
                });
            }
            let request = ModelRequest {
                messages: &self.ctx.messages,
                tools: &self.tool_definitions,
                purpose,
            };
            let result = self.provider.complete(request).await;
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
                    let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                    self.record(Event::Retry(Retry {
                        turn,
                        attempt,
                        error: kind.to_owned(),
                        delay_ms: millis,
                    }))
                    .await?;
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.cancel.cancelled() => return Err(Stop { reason: TerminationReason::Shutdown, error: None }),
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

impl AgentEngine {
    /// Runs `task` to its end. Returns `Err` only when the execution could not start, in
    /// which case nothing was recorded.
    pub async fn run(
        &self,
        execution_id: ExecutionId,
        task: Task,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, EngineError> {
        validate_metadata(&task.metadata)?;
        let status = if task.status == TaskStatus::Created {
            TaskStatus::Created.transition(TaskStatus::Assigned)?
        } else {
            task.status
        };
        status.transition(TaskStatus::InProgress)?;
        if self.config.budget_tokens == Some(0) || self.config.budget_cost == Some(MicroUsd::ZERO) {
            return Err(EngineError::Budget("the budget is zero".into()));
        }

        let mut run = Run {
            execution_id,
            provider: Arc::clone(&self.provider),
            tools: Arc::clone(&self.tools),
            tool_definitions: self.tools.definitions(),
            sink: Arc::clone(&self.sink),
            config: self.config.clone(),
            ctx: AgentContext {
                execution_id,
                task_id: task.id,
                messages: Vec::new(),
                turns: Vec::new(),
                usage: TokenUsage::default(),
                cost: MicroUsd::ZERO,
                task_status: task.status,
                compactions: 0,
            },
            cancel,
            deadline: self.config.timeout.map(|t| Instant::now() + t),
        };
        let outcome = match self.start(&mut run, &task).await {
            Ok(()) => self.drive(&mut run).await,
            Err(stop) => stop,
        };
        Ok(finish(run, outcome).await)
    }

    async fn start(&self, run: &mut Run, task: &Task) -> Result<(), Stop> {
        run.record(Event::Started(Started {
            task_id: task.id,
            task: task.description.clone(),
            workspace: task.workspace.clone(),
            loop_type: self.config.loop_type,
            provider: self.provider.name().to_owned(),
            model: self.provider.model().to_owned(),
            max_turns: self.config.max_turns,
            config: self.config.recorded_config.clone(),
        }))
        .await?;
        if run.ctx.task_status == TaskStatus::Created {
            run.transition(TaskStatus::Assigned).await?;
        }
        run.record(Event::ContextCreated(ContextCreated {
            context_window: self.config.context_window,
            tools: run
                .tool_definitions
                .iter()
                .map(|d| d.name.clone())
                .collect(),
        }))
        .await?;
        run.push_message(Message::system(SYSTEM_PROMPT)).await?;
        run.push_message(Message::user(task.description.clone()).pinned())
            .await?;
        run.transition(TaskStatus::InProgress).await?;
        Ok(())
    }

    async fn drive(&self, run: &mut Run) -> Stop {
        match self.config.loop_type {
            // The plan loops arrive with the engine issue; until then every loop is react.
            LoopType::React | LoopType::PlanExecute | LoopType::Hybrid | LoopType::Auto => {
                react::run(run).await
            }
        }
    }
}

/// Applies the post-execution transition and records the finish.
async fn finish(mut run: Run, outcome: Stop) -> ExecutionResult {
    let target = match outcome.reason {
        TerminationReason::Completed => Some(TaskStatus::InReview),
        TerminationReason::Shutdown => Some(TaskStatus::Interrupted),
        TerminationReason::Error => Some(TaskStatus::Failed),
        TerminationReason::MaxTurns
        | TerminationReason::BudgetExhausted
        | TerminationReason::TimedOut
        | TerminationReason::Stagnation
        | TerminationReason::Parked => None,
    };
    let mut error = outcome.error;
    if let Some(to) = target
        && run.ctx.task_status.can_transition_to(to)
        && let Err(stop) = run.transition(to).await
    {
        error.get_or_insert(stop.error.unwrap_or_default());
    }
    if outcome.reason == TerminationReason::Error && error.is_none() {
        error = Some("unknown error".into());
    }
    let finish = Finish {
        termination_reason: outcome.reason,
        task_status: run.ctx.task_status,
        total_turns: run.ctx.turn_count(),
        usage: run.ctx.usage,
        cost: run.ctx.cost,
        error: error.clone(),
    };
    if let Err(sink_error) = run.record(Event::Finish(finish)).await {
        tracing::error!(%sink_error, "could not record the finish event");
        error.get_or_insert_with(|| sink_error.to_string());
    }
    ExecutionResult {
        context: run.ctx,
        termination_reason: outcome.reason,
        error,
    }
}
