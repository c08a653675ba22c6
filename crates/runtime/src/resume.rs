//! Continuing an execution from its log: read it once its hash chain verifies, check that
//! it may be resumed (or continued with a person's message), and fold its events into
//! what the engine needs to go on; and deciding a parked execution's pending approvals.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use nerve_brain::ResumeState;
use nerve_brain::guards::approval::Approval;
use nerve_core::event::{
    ApprovalDecided, ApprovalDecision, CallOutcome, CallPurpose, Decider, Started,
};
use nerve_core::{
    Event, EventSink, ExecutionId, MAX_RESUMES, MessageRole, Redactor, TaskStatus,
    TerminationReason, TokenUsage, may_resume,
};
use nerve_session::{EventStore, PgStore, Replay, SessionError, SqliteSink, Store, StoredEvent};

use crate::RuntimeError;

/// An execution as its log left it, ready to continue.
#[derive(Debug)]
pub struct Resumable {
    pub execution: ExecutionId,
    pub started: Started,
    pub state: ResumeState,
    /// Model calls already answered, per purpose: where a scripted provider continues.
    pub model_calls: BTreeMap<CallPurpose, usize>,
}

/// Reads `id`'s events once their hash chain verifies, and replays them. Every command
/// that continues an execution or appends to its log (`resume`, `approve`; `chat ID` and
/// `run --continue` when they come) goes through here.
pub async fn load(
    db: &Path,
    id: &str,
) -> Result<(ExecutionId, Vec<StoredEvent>, Replay), RuntimeError> {
    let execution: ExecutionId = id.parse().map_err(RuntimeError::usage)?;
    let verified = if crate::log::is_postgres(db) {
        let crate::log::Reader::Postgres(store) = crate::log::reader(db).await? else {
            return Err(RuntimeError::log("not a PostgreSQL log"));
        };
        EventStore::verified_events(&*store, execution).await
    } else {
        if !db.exists() {
            return Err(RuntimeError::NotFound(format!(
                "no event log at {} (pass --db)",
                db.display()
            )));
        }
        let store = Store::open_read_only(db).map_err(RuntimeError::from)?;
        store.verified_events(&execution)
    };
    let events = checked(execution, verified)?;
    let replay = nerve_session::replay(&execution.to_string(), &events);
    Ok((execution, events, replay))
}

/// The events of a verified read, or why the execution cannot be continued. Nothing is
/// built on, or appended to, a log whose chain does not verify: the model would see
/// whatever an editor of the database put there.
pub fn checked(
    execution: ExecutionId,
    verified: Result<Vec<StoredEvent>, SessionError>,
) -> Result<Vec<StoredEvent>, RuntimeError> {
    verified.map_err(|error| {
            if let SessionError::BrokenChain(broken) = &error {
                RuntimeError::log(format!(
                    "execution {execution} cannot be continued: its log is tampered or damaged ({broken}); see `nerve verify {execution}`"
                ))
            } else {
                RuntimeError::from(error)
            }
        })
}

/// Reads `id` from the log and checks that a person may continue it with a message
/// (`nerve chat ID`, `run --continue ID`): any ending will do, and a crash is recovered
/// first (which counts as a resume). Refused: a broken chain, pending approvals, a task
/// closed for good.
pub async fn continuable(db: &Path, id: &str) -> Result<(Resumable, Replay), RuntimeError> {
    let (execution, events, replay) = load(db, id).await?;
    let Some(started) = replay.started.clone() else {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} has no start event; nothing to continue"
        )));
    };
    no_pending_approvals(execution, &replay)?;
    if replay.messages.is_empty() {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} recorded no conversation; nothing to continue"
        )));
    }
    let task_status = replay.task_status.unwrap_or(TaskStatus::InProgress);
    if !task_status.can_transition_to(TaskStatus::InProgress)
        && task_status != TaskStatus::InProgress
    {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} left its task {task_status}, which cannot be taken up again"
        )));
    }
    let attempt = u32::try_from(replay.resumes.len() + 1).unwrap_or(u32::MAX);
    if replay.termination_reason.is_none() && attempt > MAX_RESUMES {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} crashed and was already resumed {} times; inspect it with `nerve replay {execution}`",
            replay.resumes.len()
        )));
    }
    let resumable = rebuild(execution, started, &events, &replay, task_status, attempt);
    Ok((resumable, replay))
}

/// Refuses an execution that waits for a person's decision: `approve` comes first.
fn no_pending_approvals(execution: ExecutionId, replay: &Replay) -> Result<(), RuntimeError> {
    if replay.pending_approvals.is_empty() {
        return Ok(());
    }
    Err(RuntimeError::conflict(format!(
        "execution {execution} waits for approval of {}: decide with `nerve approve {execution}` (or --deny) first",
        replay
            .pending_approvals
            .iter()
            .map(|p| p.call.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

/// Reads `id` from the log and checks that it can be resumed.
pub async fn resumable(db: &Path, id: &str) -> Result<Resumable, RuntimeError> {
    let (execution, events, replay) = load(db, id).await?;
    resumable_from(execution, &events, &replay)
}

/// On a PostgreSQL log, refuses an execution the task queue holds for a worker: the worker
/// (or the next one) continues it, and two writers would fork its conversation.
pub async fn not_in_a_worker(db: &Path, execution: ExecutionId) -> Result<(), RuntimeError> {
    let crate::log::Reader::Postgres(store) = crate::log::reader(db).await? else {
        return Ok(());
    };
    let entry = store
        .queue_entry(execution)
        .await
        .map_err(RuntimeError::from)?;
    match entry {
        Some(entry) if entry.state == "queued" || entry.state == "claimed" => {
            Err(RuntimeError::conflict(format!(
                "execution {execution} is {} in the task queue{}; a worker continues it (or `nerve cancel {execution}` first)",
                entry.state,
                entry.worker.map(|w| format!(" by {w}")).unwrap_or_default()
            )))
        }
        Some(_) | None => Ok(()),
    }
}

/// Checks that the execution whose verified log is `events` can be resumed, and rebuilds
/// what the engine needs to continue it.
pub fn resumable_from(
    execution: ExecutionId,
    events: &[StoredEvent],
    replay: &Replay,
) -> Result<Resumable, RuntimeError> {
    let Some(started) = replay.started.clone() else {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} has no start event; nothing to resume"
        )));
    };
    match replay.termination_reason {
        None => {}
        Some(reason) if reason.is_resumable() => {}
        Some(reason) => {
            return Err(RuntimeError::conflict(format!(
                "execution {execution} ended with {reason}, which cannot be resumed (only crashed, shutdown, parked, timed_out and error runs can)"
            )));
        }
    }
    let attempt = u32::try_from(replay.resumes.len() + 1).unwrap_or(u32::MAX);
    let task_status = replay.task_status.unwrap_or(TaskStatus::InProgress);
    if attempt > MAX_RESUMES {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} was already resumed {} times; inspect it with `nerve replay {execution}`",
            replay.resumes.len()
        )));
    }
    no_pending_approvals(execution, replay)?;
    if replay.messages.is_empty() {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} recorded no conversation; nothing to resume"
        )));
    }
    if !may_resume(task_status, attempt) {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} left its task {task_status}, which a resume cannot take up again"
        )));
    }
    Ok(rebuild(
        execution,
        started,
        events,
        replay,
        task_status,
        attempt,
    ))
}

/// What the engine needs to continue `execution` from its events and their replay.
fn rebuild(
    execution: ExecutionId,
    started: Started,
    events: &[StoredEvent],
    replay: &Replay,
    task_status: TaskStatus,
    attempt: u32,
) -> Resumable {
    // Decisions by a human, and usage of the turn that began but never completed.
    let mut approvals = Vec::new();
    let mut pending_turn_usage = TokenUsage::default();
    let mut model_calls: BTreeMap<CallPurpose, usize> = BTreeMap::new();
    // An agent answer is recorded in two commits: `model_called`, then the assistant message.
    // A crash between them leaves an answer the log does not hold; its cassette line must be
    // replayed, so it does not count as used (its usage was spent and stays counted).
    let mut unrecorded_answer = false;
    let mut unrecorded_answers = 0;
    // Calls of the turn that began but never completed, and those of them that finished.
    let mut started_calls: Vec<nerve_core::ToolCall> = Vec::new();
    let mut finished_calls: Vec<nerve_core::ToolCall> = Vec::new();
    for stored in events {
        let Ok(event) = serde_json::from_str::<Event>(&stored.payload) else {
            continue;
        };
        if let Event::ApprovalDecided(decided) = &event
            && decided.decided_by == Decider::User
        {
            let approved = decided.decision == ApprovalDecision::Approved;
            approvals.push((
                decided.call_id.clone(),
                Approval {
                    approved,
                    reason: decided.reason.clone(),
                },
            ));
        } else if let Event::ModelCalled(called) = &event {
            *model_calls.entry(called.purpose).or_default() += 1;
            unrecorded_answer =
                called.purpose == CallPurpose::Agent && called.outcome == CallOutcome::Ok;
            if called.purpose == CallPurpose::Agent && called.turn > replay.total_turns {
                pending_turn_usage += called.usage;
            }
        } else if let Event::MessageAppended(appended) = &event
            && appended.message.role == MessageRole::Assistant
        {
            unrecorded_answer = false;
        } else if let Event::ToolCallStarted(started_call) = &event
            && started_call.turn > replay.total_turns
        {
            started_calls.push(started_call.call.clone());
        } else if let Event::ToolCallFinished(finished) = &event
            && finished.turn > replay.total_turns
            && let Some(call) = started_calls
                .iter()
                .find(|c| c.id == finished.result.call_id)
        {
            finished_calls.push(call.clone());
        } else if let Event::Resumed(_) = &event {
            pending_turn_usage = TokenUsage::default();
            unrecorded_answers += usize::from(std::mem::take(&mut unrecorded_answer));
        }
    }
    unrecorded_answers += usize::from(unrecorded_answer);
    if let Some(used) = model_calls.get_mut(&CallPurpose::Agent) {
        *used = used.saturating_sub(unrecorded_answers);
    }
    let state = ResumeState {
        task_id: started.task_id,
        messages: replay.messages.clone(),
        turns: replay.total_turns,
        usage: replay.usage,
        cost: replay.cost,
        task_status,
        pending_turn_usage,
        in_doubt: replay.in_doubt.iter().map(|call| call.id.clone()).collect(),
        approvals,
        attempt,
        from_checkpoint_seq: replay.checkpoints.last().map(|c| c.seq),
        finished_in_incomplete_turn: finished_calls,
        workspace_tree: replay.workspace.last_snapshot.clone(),
    };
    Resumable {
        execution,
        started,
        state,
        model_calls,
    }
}

/// A sink for what a person appends to a finished execution's log (`approve`, `rewind`),
/// with the PostgreSQL store when the log is one (its task queue).
pub async fn person_sink(
    db: &Path,
) -> Result<(Arc<dyn EventSink>, Option<Arc<PgStore>>), RuntimeError> {
    if let Some(url) = db.to_str().filter(|_| crate::log::is_postgres(db)) {
        let store = Arc::new(
            PgStore::connect(url, Arc::new(Redactor::new()))
                .await
                .map_err(RuntimeError::from)?,
        );
        Ok((Arc::clone(&store) as Arc<dyn EventSink>, Some(store)))
    } else {
        let sink = SqliteSink::open(db, Arc::new(Redactor::new())).map_err(RuntimeError::from)?;
        Ok((Arc::new(sink), None))
    }
}

/// What [`approve`] did after recording the decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approved {
    /// The execution waits for `resume`.
    ToResume,
    /// The execution went back to the task queue (a PostgreSQL log), where a worker resumes it.
    Requeued,
}

/// `nerve approve ID [--deny] [--reason TEXT]`: records a human decision for every pending
/// approval of a parked execution; `decided` hears of each once it is recorded.
pub async fn approve(
    db: &Path,
    id: &str,
    deny: bool,
    reason: Option<String>,
    decided: impl FnMut(&nerve_session::PendingApproval),
) -> Result<(ExecutionId, Approved), RuntimeError> {
    let (execution, approved) = decide(db, id, None, deny, reason, decided).await?;
    // Every pending approval was decided: the execution goes on.
    Ok((execution, approved.unwrap_or(Approved::ToResume)))
}

/// Decides the pending approval of call `call_id` of a parked execution (the HTTP API's
/// `approvals` route). Returns what happened next once no approval is left pending
/// (`None`: others still wait).
pub async fn approve_call(
    db: &Path,
    id: &str,
    call_id: &str,
    deny: bool,
    reason: Option<String>,
) -> Result<(ExecutionId, Option<Approved>), RuntimeError> {
    decide(db, id, Some(call_id), deny, reason, |_| {}).await
}

/// Records the decision for the pending approvals of execution `id` (only call `only`'s,
/// when given); `None` as what happened next while some are still pending.
async fn decide(
    db: &Path,
    id: &str,
    only: Option<&str>,
    deny: bool,
    reason: Option<String>,
    mut decided: impl FnMut(&nerve_session::PendingApproval),
) -> Result<(ExecutionId, Option<Approved>), RuntimeError> {
    let (execution, _, replay) = load(db, id).await?;
    if replay.pending_approvals.is_empty() {
        let ended = replay
            .termination_reason
            .map_or_else(|| "is unfinished".to_owned(), |r| format!("ended {r}"));
        return Err(RuntimeError::conflict(format!(
            "execution {execution} has no pending approval (it {ended})"
        )));
    }
    if replay.termination_reason != Some(TerminationReason::Parked) {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} is not parked; approvals are decided on parked executions"
        )));
    }
    let (sink, queue) = person_sink(db).await?;
    let decision = if deny {
        ApprovalDecision::Denied
    } else {
        ApprovalDecision::Approved
    };
    let chosen: Vec<&nerve_session::PendingApproval> = replay
        .pending_approvals
        .iter()
        .filter(|pending| only.is_none_or(|call| pending.call.id.0 == call))
        .collect();
    if chosen.is_empty() {
        let waiting: Vec<&str> = replay
            .pending_approvals
            .iter()
            .map(|p| p.call.id.0.as_str())
            .collect();
        return Err(RuntimeError::NotFound(format!(
            "execution {execution} has no pending approval of call {}: it waits for {}",
            only.unwrap_or_default(),
            waiting.join(", ")
        )));
    }
    let left = replay.pending_approvals.len() - chosen.len();
    for pending in chosen {
        sink.append(
            execution,
            Event::ApprovalDecided(ApprovalDecided {
                turn: pending.turn,
                call_id: pending.call.id.clone(),
                decision,
                decided_by: Decider::User,
                rule: pending.rule.clone(),
                reason: reason.clone(),
            }),
        )
        .await
        .map_err(RuntimeError::failed)?;
        decided(pending);
    }
    if left > 0 {
        return Ok((execution, None));
    }
    // In a fleet, the decided execution goes back to the queue, where a worker resumes it.
    if let Some(queue) = queue
        && queue
            .requeue(execution)
            .await
            .map_err(RuntimeError::failed)?
    {
        return Ok((execution, Some(Approved::Requeued)));
    }
    Ok((execution, Some(Approved::ToResume)))
}

/// The workspace execution `id` (a full id) started on, as its `started` event names it;
/// `None` when the log holds no start for it (the caller's own checks then say why).
pub async fn workspace_of(db: &Path, id: &str) -> Result<Option<std::path::PathBuf>, RuntimeError> {
    let Ok(execution) = id.parse::<ExecutionId>() else {
        return Ok(None);
    };
    let reader = crate::log::reader(db).await?;
    let events = reader.events(execution).await.map_err(RuntimeError::log)?;
    Ok(events
        .iter()
        .find(|e| e.kind == "started")
        .and_then(|e| serde_json::from_str::<Started>(&e.payload).ok())
        .map(|s| std::path::PathBuf::from(s.workspace)))
}

/// The most recent execution in the log (`last` where an id is taken), or with `workspace`
/// the most recent that works on it (`run --continue` and `chat --continue` without an id).
/// Executions are looked at newest first, and each one's start is read only until one
/// matches.
pub async fn latest(db: &Path, workspace: Option<&Path>) -> Result<ExecutionId, RuntimeError> {
    let reader = crate::log::reader(db).await?;
    let executions = reader.executions().await.map_err(RuntimeError::log)?;
    let wanted = workspace
        .map(crate::environment::validate_workspace)
        .transpose()?;
    // Ends: one pass over a finite list.
    for summary in &executions {
        let Ok(execution) = summary.execution_id.parse::<ExecutionId>() else {
            continue;
        };
        let Some(wanted) = &wanted else {
            return Ok(execution);
        };
        let events = reader.events(execution).await.map_err(RuntimeError::log)?;
        let started = events
            .iter()
            .find(|e| e.kind == "started")
            .and_then(|e| serde_json::from_str::<Started>(&e.payload).ok());
        if started.is_some_and(|s| Path::new(&s.workspace) == wanted.as_path()) {
            return Ok(execution);
        }
    }
    Err(RuntimeError::usage(match &wanted {
        Some(dir) => format!(
            "no execution works on {} yet: start one with `nerve run` or `nerve chat`",
            dir.display()
        ),
        None => "the log holds no execution yet".to_owned(),
    }))
}
