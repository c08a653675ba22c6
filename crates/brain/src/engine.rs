//! `AgentEngine`: takes a task from `assigned` to a well-defined end. It validates the
//! task, chooses the loop, records the start, seeds the conversation, runs the loop under
//! the guardrails and records the finish; every step is an event through the sink port.
//! It also resumes an execution rebuilt from its log.

use std::sync::Arc;

use nerve_core::event::HookPoint;
use nerve_core::event::{ContextCreated, Finish, Resumed, Started};
use nerve_core::{
    CredentialKeyError, Event, EventSink, ExecutionId, LoopType, Message, MicroUsd, TaskId,
    TaskStatus, TerminationReason, TokenUsage, ToolCall, ToolCallId, ToolExecutor, TransitionError,
    validate_metadata,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::context::compactor::context_tool_definitions;
use crate::context::memory_archive::MemoryArchive;
use crate::guards::approval::{Approval, Approver, Unattended};
use crate::guards::stagnation::StagnationDetector;
use crate::loops::auto::select_loop;
use crate::loops::plan_execute::{self, PlanMode};
use crate::loops::react;
use crate::provider::port::Provider;
use crate::provider::text_tools::ToolProtocol;
use crate::provider::tokens::{TokenCounter, counter_for_model};
use crate::run::execution::{Guards, Hands, Progress, Run};
use crate::run::journal::Journal;
use crate::run::model_caller::ModelCaller;
use crate::run::state::{AgentContext, ExecutionResult};
use crate::run::system_prompt::PromptProfile;
use crate::run::tool_calls::{self, Interrupted};
use crate::run::workspace_tracker::WorkspaceTracker;
use crate::stop::Stop;
use crate::telemetry::{self, TraceConfig};

use crate::config::EngineConfig;

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

/// An execution as its log left it, for [`AgentEngine::resume`]. The CLI builds it from
/// the session's replay; brain does not read the log itself.
#[derive(Debug, Clone)]
pub struct ResumeState {
    pub task_id: TaskId,
    pub messages: Vec<Message>,
    /// Completed turns.
    pub turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub task_status: TaskStatus,
    /// Usage of the model call of the turn that began but never completed, if any.
    pub pending_turn_usage: TokenUsage,
    /// Tool calls started but never finished: their effect is in doubt.
    pub in_doubt: Vec<ToolCallId>,
    /// Human decisions recorded for calls that were waiting for approval.
    pub approvals: Vec<(ToolCallId, Approval)>,
    /// 1 for the first resume.
    pub attempt: u32,
    pub from_checkpoint_seq: Option<u64>,
    /// Tool calls of the turn that began but never completed which did finish: when every
    /// call of that turn finished, only its `turn_completed` record is missing.
    pub finished_in_incomplete_turn: Vec<ToolCall>,
    /// The workspace's tree as the log last recorded it (`workspace_snapshot` or
    /// `workspace_rewound`); `None` for logs without snapshots.
    pub workspace_tree: Option<String>,
}

/// A person's next message on an execution that already ran: `nerve chat` and
/// `nerve run --continue`. The execution keeps its id, log, conversation and spend; the
/// message is appended (an ordinary `message_appended`, after a `task_transition` back to
/// `in_progress` when the task had left it) and the loop runs again.
#[derive(Debug, Clone)]
pub struct FollowUp {
    /// What the person said.
    pub message: String,
    /// The loop for this message: `react`, or `plan_execute` to plan it first. `auto` and
    /// `hybrid` run as ReAct and plan-execute respectively.
    pub loop_type: LoopType,
    /// The log has no finish for the last attempt (a crash): record a resume and settle
    /// the interrupted turn first, as [`AgentEngine::resume`] does.
    pub recover: bool,
    /// Compact the conversation before the message runs (`/compact`), whatever the
    /// thresholds say; recorded as any compaction.
    pub compact: bool,
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
    /// The log holds nothing to resume from. Not retryable.
    #[error("nothing to resume: {0}")]
    NothingToResume(String),
}

/// Runs agents. Holds the concrete parts behind the core ports.
#[derive(Clone)]
pub struct AgentEngine {
    pub provider: Arc<dyn Provider>,
    /// A separate model for planning and checkpoint calls; `None`: `provider`.
    pub planner: Option<Arc<dyn Provider>>,
    pub tools: Arc<dyn ToolExecutor>,
    pub sink: Arc<dyn EventSink>,
    /// Who answers `ask` rules; [`Unattended`] parks instead.
    pub approver: Arc<dyn Approver>,
    /// Where compaction archives context; in memory unless the log's archive is wired in.
    pub archive: Arc<dyn nerve_core::ContextArchive>,
    /// Who sees answers as they stream; nobody unless the CLI wires a display in.
    pub deltas: Arc<dyn crate::provider::stream::DeltaObserver>,
    /// Snapshots of the workspace at turn boundaries; `None`: none are taken.
    pub workspace: Option<Arc<dyn nerve_core::WorkspaceSnapshots>>,
    /// The user's hooks (run on the host by the runtime); `None`: none.
    pub hooks: Option<Arc<dyn nerve_core::Hooks>>,
    /// Reads a resumed parent's children from the log; `None`: a `delegate` call in flight
    /// at a crash is in doubt like any other call.
    pub children: Option<Arc<dyn ChildLog>>,
    pub config: EngineConfig,
}

impl std::fmt::Debug for AgentEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEngine")
            .field("provider", &self.provider.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl AgentEngine {
    /// An engine with no separate planner and no interactive approver.
    pub fn new(
        provider: Arc<dyn Provider>,
        tools: Arc<dyn ToolExecutor>,
        sink: Arc<dyn EventSink>,
        config: EngineConfig,
    ) -> Self {
        Self {
            provider,
            planner: None,
            tools,
            sink,
            approver: Arc::new(Unattended),
            archive: Arc::new(MemoryArchive::default()),
            deltas: Arc::new(crate::provider::stream::IgnoreDeltas),
            workspace: None,
            hooks: None,
            children: None,
            config,
        }
    }

    /// Builds the parts of one execution and wires them into a [`Run`].
    fn new_run(
        &self,
        execution_id: ExecutionId,
        progress: Progress,
        messages: Vec<Message>,
        spent: (TokenUsage, MicroUsd),
        cancel: CancellationToken,
        workspace_tree: Option<String>,
    ) -> Run {
        let counter: Arc<dyn TokenCounter> = counter_for_model(self.provider.model());
        let mut definitions = self.tools.definitions();
        if self.config.compaction.enabled {
            definitions.extend(context_tool_definitions(
                self.config.compaction.agent_controlled,
            ));
        }
        if !self.config.skills.is_empty() {
            definitions.push(crate::run::skills::definition());
        }
        let delegates = self.config.delegation.enabled && self.config.lineage.parent.is_none();
        if delegates {
            definitions.push(crate::run::delegate::definition());
        }
        let tool_tokens = counter.count_tools(&definitions);
        let tool_protocol = self.provider.tool_protocol();
        let tools_as_text = match tool_protocol {
            ToolProtocol::Native => false,
            ToolProtocol::Text => true,
            // A resumed run that had switched goes on with text.
            ToolProtocol::Auto => crate::provider::text_tools::used(&messages),
        };
        let instructions = crate::run::instructions::Tracker::resumed(&messages);
        Run {
            execution_id,
            config: self.config.clone(),
            journal: Journal::new(execution_id, Arc::clone(&self.sink)),
            window: crate::context::window::Window::new(
                messages,
                counter,
                tool_tokens,
                self.config.context_window,
            ),
            caller: ModelCaller::new(
                execution_id,
                Arc::clone(&self.provider),
                self.planner.clone(),
                &self.config,
                cancel.clone(),
                spent,
                Arc::clone(&self.deltas),
            ),
            hands: Hands {
                tools: Arc::clone(&self.tools),
                approver: Arc::clone(&self.approver),
                definitions: definitions.into(),
            },
            archive: Arc::clone(&self.archive),
            progress,
            stagnation: StagnationDetector::new(self.config.stagnation),
            workspace: WorkspaceTracker::new(self.workspace.clone(), workspace_tree),
            cancel,
            tool_protocol,
            tools_as_text,
            text_repairs: Vec::new(),
            instructions,
            hooks: self.hooks.clone(),
            delegator: delegates.then(|| {
                Arc::new(EngineDelegator {
                    engine: self.clone(),
                }) as crate::run::delegate::SharedDelegator
            }),
            delegated: (TokenUsage::default(), MicroUsd::ZERO),
        }
    }

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
        let progress = Progress {
            task_id: task.id,
            task_status: task.status,
            loop_type: self.config.loop_type,
            turns: Vec::new(),
            checkpoints: 0,
            guards: Guards::default(),
            step: None,
        };
        let spent = (TokenUsage::default(), MicroUsd::ZERO);
        let mut run = self.new_run(execution_id, progress, Vec::new(), spent, cancel, None);
        // A fresh run has spent nothing, so only the complexity decides here.
        run.progress.loop_type = select_loop(
            self.config.loop_type,
            self.config.complexity,
            run.caller.budget_used_percent(),
            &self.config.auto,
        );
        Ok(execute(
            run,
            Begin::Fresh {
                engine: self,
                task: &task,
            },
        )
        .await)
    }

    async fn start(&self, run: &mut Run, task: &Task) -> Result<(), Stop> {
        let mut recorded = self.config.recorded_config.clone();
        if let Some(map) = recorded.as_object_mut() {
            map.insert(
                "requested_loop".into(),
                serde_json::json!(self.config.loop_type),
            );
        }
        run.journal.record(Event::Started(Started {
            task_id: task.id,
            task: task.description.clone(),
            workspace: task.workspace.clone(),
            loop_type: run.progress.loop_type,
            provider: self.provider.name().to_owned(),
            model: self.provider.model().to_owned(),
            max_turns: self.config.max_turns,
            config: recorded,
            parent: self.config.lineage.parent.clone(),
            call_id: self.config.lineage.call_id.clone(),
            fork: None,
        }));
        if run.progress.task_status == TaskStatus::Created {
            run.transition(TaskStatus::Assigned)?;
        }
        run.journal.record(Event::ContextCreated(ContextCreated {
            context_window: self.config.context_window,
            tools: run
                .hands
                .definitions
                .iter()
                .map(|d| d.name.clone())
                .collect(),
        }));
        let profile = self
            .config
            .prompt_profile
            .unwrap_or_else(|| PromptProfile::for_model(self.provider.model()));
        let mut system = profile.system_prompt().to_owned();
        let instructions = start_instructions(&self.config, &*run.hands.tools).await;
        if !instructions.is_empty() {
            system.push_str(&crate::run::instructions::system_section(&instructions));
            run.journal.record(Event::InstructionsLoaded(
                nerve_core::event::InstructionsLoaded {
                    turn: 0,
                    files: instructions.into_iter().map(|l| l.file).collect(),
                },
            ));
        }
        if !self.config.skills.is_empty() {
            system.push_str(&crate::run::skills::system_section(&self.config.skills));
        }
        run.push_message(Message::system(system));
        crate::run::hooks::at(run, HookPoint::SessionStart, 0, None, serde_json::json!({})).await;
        let prompt = serde_json::json!({ "prompt": task.description });
        if let Some(why) =
            crate::run::hooks::at(run, HookPoint::UserPromptSubmit, 0, None, prompt).await
        {
            return Err(Stop::new(
                TerminationReason::Error,
                format!("a user_prompt_submit hook blocked the task: {why}"),
            ));
        }
        run.push_message(Message::user(task.description.clone()).pinned());
        run.window.refresh_indicator(&mut run.journal);
        run.transition(TaskStatus::InProgress)
    }

    /// Continues an execution from its log: records the resume, settles the calls of the
    /// interrupted turn (in-doubt calls are told to the model, never re-run; decided
    /// approvals are carried out), then runs the loop to the end. A plan loop
    /// (`config.loop_type` is the loop the execution started with) is rebuilt from the
    /// conversation and goes on at the step, turn or planning call where it stopped; when
    /// its conversation is not one the plan loop wrote (its plan compacted away), it
    /// continues as ReAct with the plan in the conversation.
    pub async fn resume(
        &self,
        execution_id: ExecutionId,
        state: ResumeState,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, EngineError> {
        if state.messages.is_empty() {
            return Err(EngineError::NothingToResume(
                "the log holds no conversation".into(),
            ));
        }
        let plan = plan_mode(self.config.loop_type, &self.config).and_then(|mode| {
            plan_execute::rebuild(&state.messages, mode, self.config.max_replans).map(|r| (mode, r))
        });
        let loop_type = if plan.is_some() {
            self.config.loop_type
        } else {
            LoopType::React
        };
        let progress = Progress {
            task_id: state.task_id,
            task_status: state.task_status,
            loop_type,
            // Turn records before the resume are in the log; keep the count contiguous.
            turns: prior_turns(state.turns),
            checkpoints: 0,
            guards: Guards::default(),
            step: None,
        };
        let spent = (
            state.usage + state.pending_turn_usage,
            state.cost + self.config.pricing.cost(state.pending_turn_usage),
        );
        let run = self.new_run(
            execution_id,
            progress,
            state.messages.clone(),
            spent,
            cancel,
            state.workspace_tree.clone(),
        );
        Ok(execute(run, Begin::Resumed(&state, plan)).await)
    }
}

impl AgentEngine {
    /// Continues an execution with a person's message (see [`FollowUp`]): its state as the
    /// log left it, the message appended, then the loop until it ends again. Turn limits
    /// are the caller's: `config.max_turns` counts from the execution's first turn.
    pub async fn follow_up(
        &self,
        execution_id: ExecutionId,
        state: ResumeState,
        follow_up: FollowUp,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, EngineError> {
        if state.messages.is_empty() {
            return Err(EngineError::NothingToResume(
                "the log holds no conversation".into(),
            ));
        }
        if follow_up.message.trim().is_empty() {
            return Err(EngineError::NothingToResume("the message is empty".into()));
        }
        let progress = Progress {
            task_id: state.task_id,
            task_status: state.task_status,
            loop_type: match follow_up.loop_type {
                LoopType::React | LoopType::Auto => LoopType::React,
                LoopType::PlanExecute | LoopType::Hybrid => LoopType::PlanExecute,
            },
            turns: prior_turns(state.turns),
            checkpoints: 0,
            guards: Guards::default(),
            step: None,
        };
        let spent = (
            state.usage + state.pending_turn_usage,
            state.cost + self.config.pricing.cost(state.pending_turn_usage),
        );
        let run = self.new_run(
            execution_id,
            progress,
            state.messages.clone(),
            spent,
            cancel,
            state.workspace_tree.clone(),
        );
        Ok(execute(run, Begin::FollowUp(&state, &follow_up)).await)
    }
}

/// Placeholders for the turns before a resume or a follow-up, so the count stays
/// contiguous; the log holds the real records.
fn prior_turns(turns: u32) -> Vec<nerve_core::TurnRecord> {
    (1..=turns)
        .map(|turn| nerve_core::TurnRecord {
            turn,
            usage: TokenUsage::default(),
            cost: MicroUsd::ZERO,
            tool_calls: Vec::new(),
            // A turn before the resume point did not end the run, so it asked for tools
            // (or was re-prompted after one).
            finish: nerve_core::FinishReason::ToolCalls,
            duration_ms: 0,
        })
        .collect()
}

/// How an execution begins.
enum Begin<'a> {
    Fresh {
        engine: &'a AgentEngine,
        task: &'a Task,
    },
    /// With the plan loop rebuilt from the conversation, when it was one.
    Resumed(&'a ResumeState, Option<(PlanMode, plan_execute::Resumed)>),
    FollowUp(&'a ResumeState, &'a FollowUp),
}

/// The project instructions a fresh execution starts with: the user's file, then the
/// workspace root's.
async fn start_instructions(
    config: &EngineConfig,
    tools: &dyn nerve_core::ToolExecutor,
) -> Vec<crate::run::instructions::Loaded> {
    let mut loaded = Vec::new();
    if let Some(user) = &config.instructions.user {
        loaded.push(crate::run::instructions::bounded(
            nerve_core::event::InstructionsSource::User,
            &user.path,
            &user.text,
        ));
    }
    if config.instructions.workspace
        && let Some(root) = crate::run::instructions::root(tools).await
    {
        loaded.push(root);
    }
    loaded
}

/// One execution from its first event to its finish: where an execution begins and ends,
/// inside its `invoke_agent` span (the root of its trace).
async fn execute(run: Run, begin: Begin<'_>) -> ExecutionResult {
    let provider = run.caller.provider();
    let span = telemetry::execution_span(telemetry::ExecutionInfo {
        execution_id: run.execution_id,
        task_id: run.progress.task_id,
        provider: provider.name(),
        model: provider.model(),
        loop_type: run.progress.loop_type,
        resume_attempt: match &begin {
            Begin::Fresh { .. } => None,
            Begin::Resumed(state, _) => Some(state.attempt),
            Begin::FollowUp(state, follow_up) => follow_up.recover.then_some(state.attempt),
        },
    });
    let trace = run.config.trace.clone();
    let result = execute_in(run, begin).instrument(span.clone()).await;
    trace_end(&span, &trace, &result);
    result
}

async fn execute_in(mut run: Run, begin: Begin<'_>) -> ExecutionResult {
    let outcome = match begin {
        Begin::Fresh { engine, task } => match engine.start(&mut run, task).await {
            // Durable before the first model call, however long that takes: the run is
            // listed. The workspace as the run found it is the base of turn 1's changes.
            Ok(()) => match start_snapshot(&mut run).await {
                Ok(()) => drive(&mut run).await,
                Err(error) => error.into(),
            },
            Err(stop) => stop,
        },
        Begin::Resumed(state, mut plan) => match resume_start(&mut run, state, plan.as_mut()).await
        {
            Ok(()) => match plan {
                Some((mode, resumed)) => plan_execute::resume(&mut run, mode, resumed).await,
                // The crash came after the final answer's turn was recorded and before the
                // finish: the answer stands, the model is not asked again.
                None if answered(run.window.messages()) => Stop::completed(),
                None => react::run(&mut run).await,
            },
            Err(stop) => stop,
        },
        Begin::FollowUp(state, follow_up) => {
            let prompt = serde_json::json!({ "prompt": follow_up.message });
            let turns = run.progress.turn_count();
            match crate::run::hooks::at(&mut run, HookPoint::UserPromptSubmit, turns, None, prompt)
                .await
            {
                Some(why) => Stop::new(
                    TerminationReason::Error,
                    format!("a user_prompt_submit hook blocked the message: {why}"),
                ),
                None => match follow_up_start(&mut run, state, follow_up).await {
                    Ok(()) => drive(&mut run).await,
                    Err(stop) => stop,
                },
            }
        }
    };
    let turns = run.progress.turn_count();
    if !outcome.log_failed {
        let ending = serde_json::json!({ "termination_reason": outcome.reason });
        crate::run::hooks::at(&mut run, HookPoint::Stop, turns, None, ending).await;
    }
    finish(run, outcome).await
}

/// Whether the conversation ends with the agent's final answer: an assistant message with
/// text and no tool calls (a re-prompt or a continuation would follow it with a message).
fn answered(messages: &[Message]) -> bool {
    messages.last().is_some_and(|last| {
        last.role == nerve_core::MessageRole::Assistant
            && last.tool_calls().next().is_none()
            && !last.text_content().trim().is_empty()
    })
}

/// Records how the execution ended on its span.
fn trace_end(span: &tracing::Span, config: &TraceConfig, result: &ExecutionResult) {
    let ctx = &result.context;
    telemetry::record_execution_end(
        span,
        config,
        telemetry::ExecutionEnd {
            reason: result.termination_reason,
            task_status: ctx.task_status,
            turns: ctx.turn_count(),
            usage: ctx.usage,
            cost: ctx.cost,
            compactions: ctx.compactions,
            error: result.error.as_deref(),
        },
    );
}

/// Records the workspace as the run found it (turn 0), then makes the start durable.
async fn start_snapshot(run: &mut Run) -> Result<(), nerve_core::SinkError> {
    run.workspace.after_turn(&mut run.journal, 0, true).await;
    run.journal.flush().await
}

async fn resume_start(
    run: &mut Run,
    state: &ResumeState,
    plan: Option<&mut (PlanMode, plan_execute::Resumed)>,
) -> Result<(), Stop> {
    run.journal.record(Event::Resumed(Resumed {
        attempt: state.attempt,
        from_checkpoint_seq: state.from_checkpoint_seq,
        from_turn: state.turns,
        in_doubt: state.in_doubt.clone(),
    }));
    if run.progress.task_status != TaskStatus::InProgress {
        run.transition(TaskStatus::InProgress)?;
    }
    // Before the interrupted turn is settled (which snapshots its end): what differs now
    // was done by the interrupted calls or by someone else, and the model is told.
    let changed = run.workspace.reconcile(&mut run.journal, state.turns).await;
    run.journal.flush().await?;
    if let Some((mode, resumed)) = plan {
        resumed.answer_pending(run, *mode);
    }
    let settled = settle_interrupted(run, state).await;
    // After the settled calls' results: a message between a call and its result would be
    // refused by the providers.
    if let Some(message) = changed {
        run.push_message(Message::user(message));
    }
    settled
}

async fn settle_interrupted(run: &mut Run, state: &ResumeState) -> Result<(), Stop> {
    tool_calls::settle(
        run,
        Interrupted {
            number: state.turns + 1,
            usage: state.pending_turn_usage,
            in_doubt: &state.in_doubt,
            approvals: &state.approvals,
            finished: &state.finished_in_incomplete_turn,
        },
    )
    .await
}

/// Where a follow-up begins: a crashed attempt settled first, the task back in progress,
/// the person's message appended and durable before the first model call.
async fn follow_up_start(
    run: &mut Run,
    state: &ResumeState,
    follow_up: &FollowUp,
) -> Result<(), Stop> {
    if follow_up.recover {
        resume_start(run, state, None).await?;
    } else {
        if run.progress.task_status != TaskStatus::InProgress {
            run.transition(TaskStatus::InProgress)?;
        }
        // The person may have edited the workspace since the last message.
        let turns = run.progress.turn_count();
        if let Some(message) = run.workspace.reconcile(&mut run.journal, turns).await {
            run.push_message(Message::user(message));
        }
    }
    if follow_up.compact {
        let turns = run.progress.turn_count();
        run.compactor().compact_for_overflow(turns, None).await?;
    }
    run.push_message(Message::user(follow_up.message.clone()));
    Ok(run.journal.flush().await?)
}

async fn drive(run: &mut Run) -> Stop {
    match plan_mode(run.progress.loop_type, &run.config) {
        Some(mode) => plan_execute::run(run, mode).await,
        None => react::run(run).await,
    }
}

/// How a plan loop of `loop_type` behaves; `None` for the ReAct loop.
fn plan_mode(loop_type: LoopType, config: &EngineConfig) -> Option<PlanMode> {
    match loop_type {
        LoopType::React | LoopType::Auto => None,
        LoopType::PlanExecute => Some(PlanMode {
            max_steps: config.plan_max_steps,
            step_turns: None,
            checkpoints: false,
        }),
        LoopType::Hybrid => Some(PlanMode {
            max_steps: config.hybrid_max_steps,
            step_turns: Some(config.hybrid_step_turns),
            checkpoints: true,
        }),
    }
}

/// Applies the post-execution transition and records the finish.
async fn finish(mut run: Run, outcome: Stop) -> ExecutionResult {
    let target = match outcome.reason {
        TerminationReason::Completed => Some(TaskStatus::InReview),
        // Interrupted, or suspended when a checkpoint was taken to resume from.
        TerminationReason::Shutdown if run.progress.checkpoints > 0 => Some(TaskStatus::Suspended),
        TerminationReason::Shutdown => Some(TaskStatus::Interrupted),
        TerminationReason::Error => Some(TaskStatus::Failed),
        TerminationReason::MaxTurns
        | TerminationReason::BudgetExhausted
        | TerminationReason::TimedOut
        | TerminationReason::Stagnation
        | TerminationReason::Parked => None,
    };
    let mut error = outcome.error;
    if outcome.log_failed {
        // Nothing more goes to a log that refused a write (see `Stop::log_failed`).
        return result(run, outcome.reason, error);
    }
    if let Some(to) = target
        && run.progress.task_status.can_transition_to(to)
        && let Err(stop) = run.transition(to)
    {
        error.get_or_insert(stop.error.unwrap_or_default());
        if stop.log_failed {
            return result(run, outcome.reason, error);
        }
    }
    if outcome.reason == TerminationReason::Error && error.is_none() {
        error = Some("unknown error".into());
    }
    let finish = Finish {
        termination_reason: outcome.reason,
        task_status: run.progress.task_status,
        total_turns: run.progress.turn_count(),
        usage: run.caller.usage(),
        cost: run.caller.cost(),
        error: error.clone(),
    };
    run.journal.record(Event::Finish(finish));
    if let Err(sink_error) = run.journal.flush().await {
        tracing::error!(%sink_error, "could not record the finish event");
        error.get_or_insert_with(|| sink_error.to_string());
    }
    result(run, outcome.reason, error)
}

/// The engine's [`Delegator`](crate::run::delegate::Delegator): a child is this engine run
/// again as an execution of its own, on the same sandbox (its tools, narrowed to the
/// request's), log, archive, approver and hooks, with its own provider view (a cassette's
/// lines for its name), budget share and turn limit, no snapshots of its own (the parent's
/// turn takes the workspace's) and no streamed deltas; it may not delegate in turn.
struct EngineDelegator {
    engine: AgentEngine,
}

impl EngineDelegator {
    /// The engine a child named `name` runs on: this one, narrowed and limited.
    fn child_engine(
        &self,
        limits: ChildLimits,
        parent: ExecutionId,
        call: ToolCallId,
    ) -> AgentEngine {
        let mut engine = self.engine.clone();
        if let Some(provider) = engine.provider.for_agent(&limits.name) {
            engine.provider = provider;
        }
        engine.planner = None;
        engine.tools = Arc::new(crate::run::delegate::Subset {
            inner: Arc::clone(&engine.tools),
            allowed: limits.tools.clone(),
        });
        engine.workspace = None;
        engine.deltas = Arc::new(crate::provider::stream::IgnoreDeltas);
        let config = &mut engine.config;
        config.loop_type = LoopType::React;
        config.complexity = None;
        config.max_turns = limits.max_turns;
        config.budget_tokens = limits.budget_tokens;
        config.budget_cost = limits.budget_cost;
        config.delegation.enabled = false;
        config.lineage = crate::config::Lineage {
            parent: Some(parent.to_string()),
            call_id: Some(call),
        };
        config.recorded_config = serde_json::json!({
            "max_turns": limits.max_turns,
            "timeout_secs": config.timeout.map(|t| t.as_secs()),
            "budget_tokens": limits.budget_tokens,
            "budget_usd": limits.budget_cost.map(MicroUsd::as_usd),
            "context_window": config.context_window,
            "agent": limits.name,
            "tools": limits.tools,
        });
        engine
    }
}

/// A child's name, tools and limits, from its `delegate` call or, resumed, its start.
#[derive(Debug, Clone)]
pub struct ChildLimits {
    pub name: String,
    pub tools: Option<Vec<String>>,
    pub max_turns: u32,
    pub budget_tokens: Option<u64>,
    pub budget_cost: Option<MicroUsd>,
}

/// What the log says of a `delegate` call's child, for its resumed parent.
#[derive(Debug)]
pub enum ChildState {
    /// The child ended (its parent did not record it): its outcome.
    Ended(crate::run::delegate::ChildOutcome),
    /// The child did not end: what resuming it takes.
    Unfinished(Box<ChildResume>),
}

/// A child execution to resume.
pub struct ChildResume {
    pub child: ExecutionId,
    pub limits: ChildLimits,
    pub state: ResumeState,
    /// Its provider when not the parent's view for its name (a cassette read on from
    /// where the child's log stopped).
    pub provider: Option<Arc<dyn Provider>>,
}

impl std::fmt::Debug for ChildResume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildResume")
            .field("child", &self.child)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// The front end's reading of the log for children: the child a parent's `delegate` call
/// started. Brain never reads the log itself.
#[async_trait::async_trait]
pub trait ChildLog: Send + Sync {
    async fn child_of(&self, parent: ExecutionId, call: &ToolCallId) -> Option<ChildState>;
}

/// A child's ending as its parent hears it.
fn child_outcome(
    child: ExecutionId,
    name: String,
    result: ExecutionResult,
) -> crate::run::delegate::ChildOutcome {
    let answer = result
        .context
        .messages
        .iter()
        .rev()
        .find(|m| m.role == nerve_core::MessageRole::Assistant)
        .map(Message::text_content)
        .unwrap_or_default();
    crate::run::delegate::ChildOutcome {
        child,
        name,
        reason: result.termination_reason,
        answer,
        error: result.error,
        turns: result.context.turn_count(),
        usage: result.context.usage,
        cost: result.context.cost,
    }
}

#[async_trait::async_trait]
impl crate::run::delegate::Delegator for EngineDelegator {
    async fn run_child(
        &self,
        request: crate::run::delegate::ChildRequest,
    ) -> Result<crate::run::delegate::ChildOutcome, String> {
        let limits = ChildLimits {
            name: request.name,
            tools: request.tools,
            max_turns: request.max_turns,
            budget_tokens: request.budget_tokens,
            budget_cost: request.budget_cost,
        };
        let name = limits.name.clone();
        let engine = self.child_engine(limits, request.parent, request.call_id);
        let child = ExecutionId::new();
        let task = Task {
            id: TaskId::new(),
            description: request.task,
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: engine.config.delegation.workspace.clone(),
        };
        let result = engine
            .run(child, task, request.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(child_outcome(child, name, result))
    }

    async fn resume_child(
        &self,
        parent: ExecutionId,
        call_id: ToolCallId,
        cancel: CancellationToken,
    ) -> Option<Result<crate::run::delegate::ChildOutcome, String>> {
        let log = self.engine.children.as_ref()?;
        match log.child_of(parent, &call_id).await? {
            ChildState::Ended(outcome) => Some(Ok(outcome)),
            ChildState::Unfinished(resume) => {
                let ChildResume {
                    child,
                    limits,
                    state,
                    provider,
                } = *resume;
                let name = limits.name.clone();
                let mut engine = self.child_engine(limits, parent, call_id);
                if let Some(provider) = provider {
                    engine.provider = provider;
                }
                let result = engine.resume(child, state, cancel).await;
                Some(
                    result
                        .map(|result| child_outcome(child, name, result))
                        .map_err(|e| e.to_string()),
                )
            }
        }
    }
}

/// What the caller gets back: the run's state and why it stopped.
fn result(
    run: Run,
    termination_reason: TerminationReason,
    error: Option<String>,
) -> ExecutionResult {
    let Run {
        execution_id,
        window,
        caller,
        progress,
        ..
    } = run;
    let compactions = window.compaction.count;
    ExecutionResult {
        context: AgentContext {
            execution_id,
            task_id: progress.task_id,
            messages: window.into_messages(),
            turns: progress.turns,
            usage: caller.usage(),
            cost: caller.cost(),
            task_status: progress.task_status,
            compactions,
            checkpoints: progress.checkpoints,
            loop_type: progress.loop_type,
        },
        termination_reason,
        error,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use nerve_core::Event;
    use nerve_core::event::{CallOutcome, ModelErrorKind};

    use super::*;
    use crate::provider::scripted::ScriptedProvider;
    use nerve_core::testing::{EchoTools, MemorySink};

    struct Outcome {
        result: Result<ExecutionResult, EngineError>,
        sink: Arc<MemorySink>,
    }

    async fn run_with(
        cassette: &str,
        config: EngineConfig,
        metadata: serde_json::Value,
        cancel: bool,
    ) -> Outcome {
        let sink = Arc::new(MemorySink::default());
        let engine = AgentEngine::new(
            Arc::new(ScriptedProvider::parse("test", cassette).unwrap()),
            Arc::new(EchoTools::default()),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            config,
        );
        let task = Task {
            id: TaskId::new(),
            description: "do it".into(),
            metadata,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        };
        let token = CancellationToken::new();
        if cancel {
            token.cancel();
        }
        let result = engine.run(ExecutionId::new(), task, token).await;
        Outcome { result, sink }
    }

    /// Two `delegate` calls in one answer: two children, each reading its agent's lines,
    /// whose answers come back as the calls' results; the parent's totals are its own and
    /// the children's; a child is offered no `delegate` of its own.
    #[tokio::test]
    async fn delegate_runs_children_that_report_back_on_one_budget() {
        let cassette = r#"{"usage":{"input_tokens":10,"output_tokens":1},"tool_calls":[{"id":"d1","name":"delegate","arguments":{"task":"one","name":"a"}},{"id":"d2","name":"delegate","arguments":{"task":"two","name":"b","max_turns":50}}]}
{"agent":"b","usage":{"input_tokens":7,"output_tokens":1},"text":"B done"}
{"agent":"a","usage":{"input_tokens":5,"output_tokens":1},"text":"A done"}
{"usage":{"input_tokens":10,"output_tokens":1},"text":"all done"}"#;
        let mut config = EngineConfig::default();
        config.delegation.enabled = true;
        let outcome = run_with(cassette, config, serde_json::Value::Null, false).await;
        let result = outcome.result.unwrap();
        assert_eq!(result.termination_reason, TerminationReason::Completed);
        assert_eq!(result.context.usage, TokenUsage::new(32, 4));
        let results = outcome.sink.tool_results();
        assert_eq!(results.len(), 2);
        assert!(
            results[0].content.contains("Subagent a:") && results[0].content.contains("A done")
        );
        assert!(
            results[1].content.contains("Subagent b:") && results[1].content.contains("B done")
        );
        let events = outcome.sink.events();
        let started: Vec<&Started> = events
            .iter()
            .filter_map(|e| {
                if let Event::Started(s) = e {
                    Some(s)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(started.len(), 3);
        assert_eq!(started[0].parent, None);
        let parent = started[1].parent.clone().unwrap();
        assert_eq!(started[2].parent.as_deref(), Some(parent.as_str()));
        let calls: Vec<_> = started[1..]
            .iter()
            .map(|s| s.call_id.clone().unwrap().0)
            .collect();
        assert!(calls.contains(&"d1".to_owned()) && calls.contains(&"d2".to_owned()));
        // A child asking for more turns than the bound gets the bound.
        assert!(
            started[1..].iter().all(|s| s.max_turns == 10),
            "{started:?}"
        );
        let offered: Vec<bool> = events
            .iter()
            .filter_map(|e| {
                if let Event::ContextCreated(c) = e {
                    Some(c.tools.iter().any(|t| t == "delegate"))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(offered, [true, false, false]);
    }

    async fn check(
        cassette: &str,
        config: EngineConfig,
        reason: TerminationReason,
        status: TaskStatus,
    ) -> Outcome {
        let outcome = run_with(cassette, config, serde_json::Value::Null, false).await;
        let result = outcome.result.as_ref().unwrap();
        assert_eq!(result.termination_reason, reason, "{:?}", result.error);
        assert_eq!(result.context.task_status, status);
        let events = outcome.sink.events();
        match events.last() {
            Some(Event::Finish(finish)) => {
                assert_eq!(finish.termination_reason, reason);
                assert_eq!(finish.task_status, status);
                assert_eq!(finish.error, result.error);
            }
            other => panic!("the last event must be the finish, got {other:?}"),
        }
        outcome
    }

    const TOOL_TURN: &str = r#"{"tool_calls":[{"name":"shell","arguments":{"command":"ls"}}]}"#;

    #[tokio::test]
    async fn completed_run_records_every_step_in_order() {
        let cassette = format!("{TOOL_TURN}\n{{\"text\":\"done\"}}");
        let outcome = check(
            &cassette,
            EngineConfig::default(),
            TerminationReason::Completed,
            TaskStatus::InReview,
        )
        .await;
        assert_eq!(
            outcome.sink.kinds(),
            [
                "started",
                "task_transition",
                "context_created",
                "message_appended",
                "message_appended",
                "task_transition",
                "model_called",
                "message_appended",
                "tool_call_started",
                "tool_call_finished",
                "message_appended",
                "turn_completed",
                "model_called",
                "message_appended",
                "turn_completed",
                "task_transition",
                "finish",
            ]
        );
        let result = outcome.result.unwrap();
        assert_eq!(result.context.turn_count(), 2);
        assert_eq!(result.context.messages.len(), 5);
        assert!(result.context.messages[1].pinned, "the task is pinned");
    }

    #[tokio::test]
    async fn max_turns_stops_the_loop_and_leaves_the_task_in_progress() {
        let cassette = [TOOL_TURN; 5].join("\n");
        let config = EngineConfig {
            max_turns: 2,
            ..EngineConfig::default()
        };
        let outcome = check(
            &cassette,
            config,
            TerminationReason::MaxTurns,
            TaskStatus::InProgress,
        )
        .await;
        assert_eq!(outcome.result.unwrap().context.turn_count(), 2);
    }

    #[tokio::test]
    async fn a_rate_limit_is_retried_and_recorded() {
        let cassette = "{\"error\":\"rate_limited\",\"retry_after_ms\":5}\n{\"text\":\"done\"}";
        let outcome = check(
            cassette,
            EngineConfig::default(),
            TerminationReason::Completed,
            TaskStatus::InReview,
        )
        .await;
        let retries: Vec<_> = outcome
            .sink
            .events()
            .into_iter()
            .filter_map(|e| {
                if let Event::Retry(retry) = e {
                    Some(retry)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(retries.len(), 1);
        assert_eq!(retries[0].error, ModelErrorKind::RateLimited);
        assert!(retries[0].delay_ms >= 5);
    }

    #[tokio::test]
    async fn a_permanent_error_fails_the_task_with_a_message() {
        let outcome = check(
            "{\"error\":\"auth\"}",
            EngineConfig::default(),
            TerminationReason::Error,
            TaskStatus::Failed,
        )
        .await;
        let error = outcome.result.unwrap().error.unwrap();
        assert!(error.contains("auth"), "{error}");
    }

    #[tokio::test]
    async fn an_exhausted_script_is_an_error_not_a_hang() {
        let outcome = check(
            TOOL_TURN,
            EngineConfig::default(),
            TerminationReason::Error,
            TaskStatus::Failed,
        )
        .await;
        assert!(
            outcome
                .result
                .unwrap()
                .error
                .unwrap()
                .contains("script exhausted")
        );
    }

    #[tokio::test]
    async fn the_token_budget_is_checked_before_each_call() {
        let cassette = r#"{"tool_calls":[{"name":"shell","arguments":{}}],"usage":{"input_tokens":90,"output_tokens":20}}
{"text":"never reached"}"#;
        let config = EngineConfig {
            budget_tokens: Some(100),
            ..EngineConfig::default()
        };
        let outcome = check(
            cassette,
            config,
            TerminationReason::BudgetExhausted,
            TaskStatus::InProgress,
        )
        .await;
        assert_eq!(outcome.result.unwrap().context.turn_count(), 1);
    }

    #[tokio::test]
    async fn cancellation_stops_at_the_boundary_and_interrupts_the_task() {
        let outcome = run_with(
            "{\"text\":\"x\"}",
            EngineConfig::default(),
            serde_json::Value::Null,
            true,
        )
        .await;
        let result = outcome.result.unwrap();
        assert_eq!(result.termination_reason, TerminationReason::Shutdown);
        assert_eq!(result.context.task_status, TaskStatus::Interrupted);
        assert_eq!(result.context.turn_count(), 0);
    }

    /// A tool whose first call stops the run (as a person's Ctrl-C would) and then waits
    /// for its interrupt; it counts the calls it was asked to run.
    #[derive(Default)]
    struct StoppingTool {
        cancel: CancellationToken,
        calls: std::sync::atomic::AtomicU32,
    }

    #[async_trait::async_trait]
    impl nerve_core::ToolExecutor for StoppingTool {
        fn definitions(&self) -> Vec<nerve_core::ToolDefinition> {
            Vec::new()
        }

        async fn execute(
            &self,
            _call: &nerve_core::ToolCall,
        ) -> Result<nerve_core::ToolOutput, nerve_core::ToolError> {
            unreachable!("the engine runs tools through execute_until")
        }

        async fn execute_until(
            &self,
            _call: &nerve_core::ToolCall,
            interrupt: nerve_core::Interrupt<'_>,
        ) -> Result<nerve_core::ToolOutput, nerve_core::ToolError> {
            self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.cancel.cancel();
            interrupt.await;
            Ok(nerve_core::ToolOutput::error("[interrupted]"))
        }
    }

    #[tokio::test]
    async fn a_stop_interrupts_the_running_call_and_starts_no_other() {
        let cassette = r#"{"tool_calls":[{"name":"shell","arguments":{"command":"sleep 10"}},{"name":"shell","arguments":{"command":"echo next"}}]}
{"text":"never asked"}"#;
        let sink = Arc::new(MemorySink::default());
        let tools = Arc::new(StoppingTool::default());
        let cancel = tools.cancel.clone();
        let engine = AgentEngine::new(
            Arc::new(ScriptedProvider::parse("test", cassette).unwrap()),
            Arc::clone(&tools) as Arc<dyn nerve_core::ToolExecutor>,
            Arc::clone(&sink) as Arc<dyn EventSink>,
            EngineConfig::default(),
        );
        let task = Task {
            id: TaskId::new(),
            description: "do it".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        };
        let result = engine.run(ExecutionId::new(), task, cancel).await.unwrap();
        assert_eq!(result.termination_reason, TerminationReason::Shutdown);
        assert_eq!(result.context.turn_count(), 1, "the stopped turn completes");
        assert_eq!(tools.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        let events = sink.events();
        let started = events
            .iter()
            .filter(|e| matches!(e, Event::ToolCallStarted(_)))
            .count();
        assert_eq!(started, 1, "the second call never starts");
        let finished: Vec<_> = events
            .iter()
            .filter_map(|e| {
                if let Event::ToolCallFinished(finished) = e {
                    Some(finished)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(finished.len(), 2);
        assert!(finished[0].interrupted);
        assert_eq!(finished[0].result.content, "[interrupted]");
        assert!(!finished[1].interrupted);
        assert!(
            finished[1].result.content.contains("The call was not run"),
            "{}",
            finished[1].result.content
        );
    }

    #[tokio::test]
    async fn a_stop_abandons_the_model_call_in_flight() {
        let cassette = r#"{"delay_ms":60000,"text":"never"}"#;
        let sink = Arc::new(MemorySink::default());
        let engine = AgentEngine::new(
            Arc::new(ScriptedProvider::parse("test", cassette).unwrap()),
            Arc::new(EchoTools::default()),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            EngineConfig::default(),
        );
        let task = Task {
            id: TaskId::new(),
            description: "do it".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        };
        let cancel = CancellationToken::new();
        let stopper = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            stopper.cancel();
        });
        let started = std::time::Instant::now();
        let result = engine.run(ExecutionId::new(), task, cancel).await.unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!(result.termination_reason, TerminationReason::Shutdown);
        assert_eq!(result.context.turn_count(), 0);
        let called: Vec<_> = sink
            .events()
            .into_iter()
            .filter_map(|e| {
                if let Event::ModelCalled(called) = e {
                    Some(called.outcome)
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(called, [CallOutcome::Cancelled]);
    }

    #[tokio::test]
    async fn credentials_in_task_metadata_are_refused_before_anything_is_recorded() {
        let metadata = serde_json::json!({"deploy": {"api_key": "x"}});
        let outcome = run_with("{\"text\":\"x\"}", EngineConfig::default(), metadata, false).await;
        let error = outcome.result.unwrap_err().to_string();
        assert!(error.contains("deploy.api_key"), "{error}");
        assert!(outcome.sink.kinds().is_empty());
    }

    #[tokio::test]
    async fn a_timeout_ends_the_run_as_timed_out() {
        // The first answer arrives late; the second would take far longer than the limit.
        let cassette = r#"{"delay_ms":300,"tool_calls":[{"name":"shell","arguments":{}}]}
{"delay_ms":60000,"text":"never"}"#;
        let config = EngineConfig {
            timeout: Some(Duration::from_millis(100)),
            ..EngineConfig::default()
        };
        let outcome = check(
            cassette,
            config,
            TerminationReason::TimedOut,
            TaskStatus::InProgress,
        )
        .await;
        assert_eq!(
            outcome.result.unwrap().context.turn_count(),
            0,
            "the slow first call is cut off"
        );
    }
}
