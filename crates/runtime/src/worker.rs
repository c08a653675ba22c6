//! A worker: claims submitted executions from the PostgreSQL task queue and runs them, at
//! most `concurrency` at once, all through one shared log connection pool. `nerve worker`
//! runs each in a sandbox on this machine's Docker ([`SandboxRunner`]); a benchmark may run
//! the engine in process with a [`Runner`] of its own, under the same claims and leases.
//!
//! Each claim is a lease the worker renews every third of its length. The worker registers
//! it with the store, so each of its appends to that execution commits only while the
//! server still records the lease as this worker's: a worker that stalled past its lease
//! (paused, partitioned) and another worker took the execution over can never append to
//! it again, and stops it. A claim whose worker died is claimed again once its lease runs
//! out; the new worker resumes it from the log (the resume-attempt bound and the in-doubt
//! rules of a resume apply). An execution that already finished (its worker died before
//! releasing it) is released as it is.
//!
//! A worker that takes an execution over removes the earlier claim's sandbox from its
//! Docker engine first, also one whose worker is alive but lost the lease.
//!
//! Cancelling [`Worker::drain`] drains the worker: it stops claiming, its executions stop
//! now ([`STOP_EFFECT`]; `shutdown`, resumable), and it gives their claims back to the
//! queue, where other workers resume them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use nerve_core::{ExecutionId, TerminationReason};
use nerve_session::{EventStore, LeaseState, PgStore, SessionError};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::config::Config;
use crate::observer::Unobserved;
use crate::queue::{Claim, Spec, Workspace, queue_store};

/// What stopping a running execution does (a drain, `nerve cancel`, Ctrl-C): said to
/// whoever stops one, so that nobody waits for a "turn boundary" that no longer applies.
pub const STOP_EFFECT: &str = "no new tool call starts, a running command is interrupted (SIGINT, then SIGKILL 2 s later) and the execution ends `shutdown`, resumable";

/// What a draining worker says of the executions it stops.
pub fn draining_note(running: usize) -> String {
    format!("draining: {running} execution(s) stop now: {STOP_EFFECT}")
}

/// What a worker says when it sees that its execution `id` was cancelled.
pub fn cancelled_note(id: ExecutionId) -> String {
    format!("{id} was cancelled; stopping it now: {STOP_EFFECT}")
}

/// How long an idle worker waits for a submit's notification before it looks anyway (an
/// expired lease of a dead worker notifies nobody).
const IDLE_RECHECK: Duration = Duration::from_secs(1);

/// How often a worker says it is alive (the fleet's view shows its last heartbeat).
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How a worker is asked to work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSettings {
    /// Executions run at once.
    pub concurrency: usize,
    /// How long a claim holds without being renewed.
    pub lease: Duration,
    /// Where `--git` workspaces are cloned (default: the XDG state directory's
    /// `nerve/workspaces`).
    pub workspaces: Option<PathBuf>,
}

/// How one claimed execution went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It ran (fresh or resumed) and ended with this reason, after this many turns.
    Ended(TerminationReason, u32),
    /// Its log shows it finished before (its worker died before releasing it).
    AlreadyEnded(TerminationReason),
    /// It cannot run here: the reason.
    Failed(String),
}

/// What became of a claim once its execution stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// The queue records the outcome (finished, back in the queue, or failed).
    Released(Outcome),
    /// The lease was lost (it ran out and another worker took the execution over, or the
    /// claim ended): the execution was stopped, nothing more of it was appended.
    LeaseLost,
    /// The queue could not record the outcome: why.
    NotReleased(Outcome, String),
}

/// Runs a claimed execution to its end (fresh, resumed, or found ended).
#[async_trait]
pub trait Runner: Send + Sync {
    async fn run(&self, worker: &Worker, claim: &Claim, cancel: CancellationToken) -> Outcome;
}

/// Hears what a worker has to say: claims, endings, failures to renew or release. One
/// line each, without the worker's name (the front end adds it).
pub trait Reporter: Send + Sync {
    fn say(&self, worker: &str, text: &str);
}

/// Says nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quiet;

impl Reporter for Quiet {
    fn say(&self, _worker: &str, _text: &str) {}
}

/// What every execution of a worker shares.
pub struct Worker {
    name: String,
    store: Arc<PgStore>,
    lease: Duration,
    /// Where the sandbox homes are: the home of an execution cancelled for good goes.
    homes: Option<PathBuf>,
    runner: Arc<dyn Runner>,
    reporter: Arc<dyn Reporter>,
    /// Cancelled when the worker drains; each execution's token is a child of it.
    drain: CancellationToken,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("name", &self.name)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Worker {
    /// `nerve worker`'s: claims from the queue of the log at `db` and runs each claimed
    /// execution in a sandbox on this machine's Docker (checked here, not at the first
    /// claim). `capture_content`: whether spans may carry message content.
    pub async fn start(
        db: &Path,
        config: Config,
        settings: &WorkerSettings,
        capture_content: bool,
        reporter: Arc<dyn Reporter>,
    ) -> Result<Self, RuntimeError> {
        let redactor = crate::launch::config_redactor(&config)?;
        let store = Arc::new(queue_store(db, redactor).await?);
        nerve_hands::connect_docker()
            .await
            .map_err(RuntimeError::sandbox)?;
        let workspaces = match &settings.workspaces {
            Some(dir) => dir.clone(),
            None => default_workspaces()?,
        };
        let runner = SandboxRunner {
            db: db.to_path_buf(),
            config,
            workspaces,
            capture_content,
        };
        Ok(Self::new(
            worker_name(),
            store,
            settings.lease,
            Arc::new(runner),
            reporter,
            // Without a state directory no sandbox starts either; nothing to discard.
            crate::log::homes_dir(db).ok(),
        ))
    }

    /// A worker named `name` on `store`'s queue that runs its claims with `runner`.
    pub fn new(
        name: String,
        store: Arc<PgStore>,
        lease: Duration,
        runner: Arc<dyn Runner>,
        reporter: Arc<dyn Reporter>,
        homes: Option<PathBuf>,
    ) -> Self {
        Self {
            name,
            store,
            lease,
            homes,
            runner,
            reporter,
            drain: CancellationToken::new(),
        }
    }

    /// `host:pid` for a `nerve worker`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log and its queue.
    pub fn store(&self) -> &Arc<PgStore> {
        &self.store
    }

    /// Cancel it to drain the worker.
    pub fn drain(&self) -> &CancellationToken {
        &self.drain
    }

    fn say(&self, text: &str) {
        self.reporter.say(&self.name, text);
    }

    /// Claims and runs executions, at most `concurrency` at once, until drained; then
    /// waits for the running ones to stop and give their claims back.
    pub async fn work(self: &Arc<Self>, concurrency: usize) -> Result<(), RuntimeError> {
        let mut listener = self
            .store
            .listen("nerve_queue")
            .await
            .map_err(RuntimeError::from)?;
        self.say(&format!(
            "claiming executions from {} (concurrency {}, lease {} s)",
            self.store.url(),
            concurrency,
            self.lease.as_secs()
        ));
        let heartbeat = tokio::spawn(heartbeats(Arc::clone(self), concurrency));
        let mut running: JoinSet<Handled> = JoinSet::new();
        // Ends: when the worker is drained (a signal, or the front end).
        while !self.drain.is_cancelled() {
            // Ends: the set holds at most `concurrency` tasks.
            while running.try_join_next().is_some() {}
            if running.len() < concurrency {
                match self.claim().await {
                    Ok(Some(claim)) => {
                        let cancel = self.drain.child_token();
                        running.spawn(Arc::clone(self).handle(claim, cancel));
                        continue;
                    }
                    Ok(None) => {}
                    Err(error) => self.say(&format!("cannot claim: {error}")),
                }
                tokio::select! {
                    () = self.drain.cancelled() => {}
                    _ = listener.next(IDLE_RECHECK) => {}
                    Some(_) = running.join_next(), if !running.is_empty() => {}
                }
            } else {
                tokio::select! {
                    () = self.drain.cancelled() => {}
                    _ = running.join_next() => {}
                }
            }
        }
        self.say(&draining_note(running.len()));
        // Ends: every execution stops (its token is cancelled: no new tool call starts, a
        // running command is interrupted and killed 2 s later, a model call is abandoned).
        while running.join_next().await.is_some() {}
        heartbeat.abort();
        if let Err(error) = self.store.worker_stopped(&self.name).await {
            self.say(&format!("cannot record that this worker stopped: {error}"));
        }
        self.say("drained; every claim released");
        Ok(())
    }

    /// Claims the next queued (or abandoned) execution, if any.
    pub async fn claim(&self) -> Result<Option<Claim>, RuntimeError> {
        self.store
            .claim(&self.name, self.lease)
            .await
            .map_err(RuntimeError::from)
    }

    /// Runs one claimed execution under its lease, then releases the claim (or reports
    /// that it was lost).
    pub async fn handle(self: Arc<Self>, claim: Claim, cancel: CancellationToken) -> Handled {
        let id = claim.execution_id;
        self.store.hold_lease(id, &self.name);
        self.say(&format!("claimed {id} (claim {})", claim.claims));
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(
            Arc::clone(&self),
            id,
            cancel.clone(),
            Arc::clone(&lost),
        ));
        let outcome = self.runner.run(&self, &claim, cancel.clone()).await;
        renewer.abort();
        if lost.load(Ordering::SeqCst) || self.store.lease_lost(id) {
            self.store.drop_lease(id);
            self.say(&format!(
                "lost the lease on {id} (it ran out and another worker took the execution over, or the claim ended); stopped it, nothing more of it is appended by this worker"
            ));
            return Handled::LeaseLost;
        }
        let name = &self.name;
        let released = match &outcome {
            Outcome::Ended(reason, turns) => {
                // A drained execution goes back to the queue for another worker to resume.
                let back = *reason == TerminationReason::Shutdown && self.drain.is_cancelled();
                // Stopped by `nerve cancel`: over for good, its sandbox home goes with it.
                if *reason == TerminationReason::Shutdown && !back && cancel.is_cancelled() {
                    self.discard_home(id);
                }
                self.say(&format!(
                    "{id} ended {reason} after {turns} turns{}",
                    if back { "; released to the queue" } else { "" }
                ));
                self.store.release(id, name, !back).await
            }
            Outcome::AlreadyEnded(reason) => {
                self.say(&format!("{id} had already ended {reason}; released it"));
                self.store.release(id, name, true).await
            }
            Outcome::Failed(message) => {
                self.say(&format!("{id} failed: {message}"));
                self.store.fail(id, name, message).await
            }
        };
        match released {
            Ok(true) => Handled::Released(outcome),
            Ok(false) => {
                let why = format!("the claim on {id} had ended before it was released");
                self.say(&why);
                Handled::NotReleased(outcome, why)
            }
            Err(error) => {
                let why = format!("cannot release {id}: {error}");
                self.say(&why);
                Handled::NotReleased(outcome, why)
            }
        }
    }

    /// Removes the sandbox home of `id`, over for good; a failure is said, never fatal.
    fn discard_home(&self, id: ExecutionId) {
        let Some(homes) = &self.homes else {
            return;
        };
        if let Err(error) = nerve_hands::discard_sandbox_home(Some(homes), id) {
            self.say(&format!("cannot remove the sandbox home of {id}: {error}"));
        }
    }
}

/// Renews the lease every third of its length. A cancel asked for (seen at a renewal)
/// stops the execution then ([`STOP_EFFECT`]); a lost lease stops it too (its appends are
/// refused anyway).
async fn renew(
    worker: Arc<Worker>,
    id: ExecutionId,
    cancel: CancellationToken,
    lost: Arc<AtomicBool>,
) {
    // Ends: when the lease is lost, or when the caller aborts it (the execution stopped).
    loop {
        tokio::time::sleep(worker.lease / 3).await;
        match worker.store.renew(id, &worker.name, worker.lease).await {
            Ok(LeaseState::Held) => {}
            Ok(LeaseState::CancelRequested) => {
                if !cancel.is_cancelled() {
                    worker.say(&cancelled_note(id));
                    cancel.cancel();
                }
            }
            Ok(LeaseState::Lost) => {
                lost.store(true, Ordering::SeqCst);
                cancel.cancel();
                return;
            }
            // The append check still guards the log; the next renewal may get through.
            Err(error) => worker.say(&format!("cannot renew the lease on {id}: {error}")),
        }
    }
}

/// Runs claimed executions in sandboxes through the runtime's launch: `nerve worker`'s.
struct SandboxRunner {
    db: PathBuf,
    config: Config,
    workspaces: PathBuf,
    capture_content: bool,
}

#[async_trait]
impl Runner for SandboxRunner {
    /// Starts the claimed execution fresh, resumes it from the log, or finds it ended.
    async fn run(&self, worker: &Worker, claim: &Claim, cancel: CancellationToken) -> Outcome {
        let id = claim.execution_id;
        let spec: Spec = match serde_json::from_value(claim.spec.clone()) {
            Ok(spec) => spec,
            Err(error) => {
                return Outcome::Failed(format!("its submission does not decode: {error}"));
            }
        };
        let workspace = match self.prepare_workspace(worker, &spec, id).await {
            Ok(dir) => dir,
            Err(message) => return Outcome::Failed(message),
        };
        if claim.claims > 1
            && let Err(message) = take_over_sandboxes(id).await
        {
            return Outcome::Failed(message);
        }
        let verified = EventStore::verified_events(worker.store.as_ref(), id).await;
        let launched = match verified {
            Err(SessionError::UnknownExecution(_)) => {
                let request = match spec.request(workspace) {
                    Ok(request) => request,
                    Err(message) => return Outcome::Failed(message),
                };
                crate::launch::fresh(&request, &self.db, &self.config, id).await
            }
            verified => {
                let events = match crate::resume::checked(id, verified) {
                    Ok(events) => events,
                    Err(error) => return Outcome::Failed(error.to_string()),
                };
                let replay = nerve_session::replay(&id.to_string(), &events);
                match replay.termination_reason {
                    None | Some(TerminationReason::Shutdown) => {}
                    Some(reason) => return Outcome::AlreadyEnded(reason),
                }
                match crate::resume::resumable_from(id, &events, &replay) {
                    Ok(resumable) => {
                        worker.say(&format!(
                            "resuming {id} after turn {} (attempt {})",
                            replay.total_turns, resumable.state.attempt
                        ));
                        crate::launch::resumed(
                            &self.db,
                            &self.config,
                            resumable,
                            None,
                            Some(workspace),
                        )
                        .await
                    }
                    Err(error) => Err(error),
                }
            }
        };
        let (mut launch, start) = match launched {
            Ok(launched) => launched,
            Err(error) => return Outcome::Failed(error.to_string()),
        };
        launch.log = Some(Arc::clone(&worker.store) as Arc<dyn crate::log::Log>);
        launch.capture_content = self.capture_content;
        match launch.execute(start, Arc::new(Unobserved), cancel).await {
            Ok(result) => Outcome::Ended(result.termination_reason, result.context.turn_count()),
            Err(error) => Outcome::Failed(error.to_string()),
        }
    }
}

impl SandboxRunner {
    /// The directory the execution works on: the shared path, or this worker's clone of the
    /// repository (made once per execution; a resume on this machine reuses it).
    async fn prepare_workspace(
        &self,
        worker: &Worker,
        spec: &Spec,
        id: ExecutionId,
    ) -> Result<PathBuf, String> {
        let (url, git_ref) = match &spec.workspace {
            Workspace::Path(path) => return Ok(path.clone()),
            Workspace::Git { url, git_ref } => (url, git_ref),
        };
        let workspaces = &self.workspaces;
        let dir = workspaces.join(id.to_string());
        if dir.join(".git").is_dir() {
            return Ok(dir);
        }
        std::fs::create_dir_all(workspaces)
            .map_err(|e| format!("cannot create {}: {e}", workspaces.display()))?;
        // Cloned beside its final name and renamed, so a worker that dies mid-clone leaves no
        // half checkout that a resume would take for the workspace.
        let partial = workspaces.join(format!(".{id}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        let redact = |text: &str| worker.store.redactor().redact(text).into_owned();
        git(&[
            "clone",
            "--quiet",
            "--",
            url,
            &partial.display().to_string(),
        ])
        .await
        .map_err(|e| redact(&format!("cannot clone {url}: {e}")))?;
        if let Some(git_ref) = git_ref {
            git(&[
                "-C",
                &partial.display().to_string(),
                "checkout",
                "--quiet",
                git_ref,
                "--",
            ])
            .await
            .map_err(|e| redact(&format!("cannot check out {git_ref} of {url}: {e}")))?;
        }
        std::fs::rename(&partial, &dir)
            .map_err(|e| format!("cannot move the clone to {}: {e}", dir.display()))?;
        Ok(dir)
    }
}

/// Removes the sandboxes an earlier claim of `id` left on this Docker engine, also one
/// whose worker is still alive: this worker holds the lease now, so that worker can no
/// longer append to the execution, and its container only holds the name a resume needs.
async fn take_over_sandboxes(id: ExecutionId) -> Result<(), String> {
    let docker = nerve_hands::connect_docker()
        .await
        .map_err(|e| e.to_string())?;
    let report = nerve_hands::reap(&docker, nerve_hands::ReapScope::All, Some(&id.to_string()))
        .await
        .map_err(|e| format!("cannot remove the sandbox of its earlier claim: {e}"))?;
    if let Some((name, reason)) = report.kept.first() {
        return Err(format!(
            "cannot remove the sandbox {name} of its earlier claim: {reason}"
        ));
    }
    Ok(())
}

/// Runs `git ARGS` without a terminal prompt; its first stderr line on failure.
async fn git(args: &[&str]) -> Result<(), String> {
    let output = tokio::process::Command::new("git")
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    Err(stderr
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("git failed")
        .trim()
        .to_owned())
}

/// Says every [`HEARTBEAT`] that `worker` is alive, until aborted when it stops. A failed
/// heartbeat is said once, until one succeeds again (the queue's own calls report a log
/// that went away).
async fn heartbeats(worker: Arc<Worker>, concurrency: usize) {
    let host = worker
        .name
        .rsplit_once(':')
        .map_or(worker.name.as_str(), |(host, _)| host)
        .to_owned();
    let concurrency = u32::try_from(concurrency).unwrap_or(u32::MAX);
    let mut failing = false;
    // Ends: aborted by `work` once the worker has drained.
    loop {
        match worker
            .store
            .worker_seen(&worker.name, &host, concurrency)
            .await
        {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                worker.say(&format!("cannot record a heartbeat: {error}"));
            }
            Err(_) => {}
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// `host:pid`, unique among live workers.
fn worker_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}

fn default_workspaces() -> Result<PathBuf, RuntimeError> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".local/state")))
        .ok_or_else(|| {
            RuntimeError::usage(
                "cannot locate a state directory for --git clones: pass --workspaces DIR",
            )
        })?;
    Ok(state.join("nerve").join("workspaces"))
}

#[cfg(test)]
mod tests {
    use nerve_core::ExecutionId;

    /// A stop interrupts at once (issue 32): the worker's lines say so, not "next turn
    /// boundary".
    #[test]
    fn a_stop_says_it_happens_now_not_at_a_turn_boundary() {
        for note in [
            super::draining_note(2),
            super::cancelled_note(ExecutionId::new()),
        ] {
            assert!(!note.contains("boundary"), "{note}");
            assert!(note.contains("stop"), "{note}");
            assert!(
                note.contains("no new tool call starts, a running command is interrupted"),
                "{note}"
            );
        }
    }
}
