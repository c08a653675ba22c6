//! `nerve worker`: claims submitted executions from the PostgreSQL task queue and runs
//! them, at most `--concurrency` at once, each in a sandbox on this machine's Docker
//! (`DOCKER_HOST` respected), all through one shared log connection pool.
//!
//! Each claim is a lease the worker renews every third of its length. The worker registers
//! it with the store, so each of its appends to that execution commits only while the
//! server still records the lease as this worker's: a worker that stalled past its lease
//! (paused, partitioned) and another worker took the execution over can never append to
//! it again, and stops it with one line. A claim whose worker died is claimed again once
//! its lease runs out; the new worker resumes it from the log (the resume-attempt bound and
//! the in-doubt rules of `nerve resume` apply). An execution that already finished (its
//! worker died before releasing it) is released as it is.
//!
//! A worker that takes an execution over removes the earlier claim's sandbox from its
//! Docker engine first, also one whose worker is alive but lost the lease.
//!
//! SIGTERM (or Ctrl-C) drains the worker: it stops claiming, its executions stop at their
//! next turn boundary (`shutdown`, resumable), and it gives their claims back to the
//! queue, where other workers resume them. A second signal aborts at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nerve_core::{ExecutionId, TerminationReason};
use nerve_session::{Claim, EventStore, LeaseState, PgStore, SessionError};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use nerve_runtime::observer::Unobserved;

use crate::Failure;
use crate::output;
use crate::queue::{Spec, Workspace, queue_store};
use nerve_runtime::config::Config;

/// How long an idle worker waits for a submit's notification before it looks anyway (an
/// expired lease of a dead worker notifies nobody).
const IDLE_RECHECK: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) concurrency: usize,
    pub(crate) lease: Duration,
    pub(crate) workspaces: Option<PathBuf>,
}

/// What every execution of this worker shares.
struct Worker {
    name: String,
    db: PathBuf,
    config: Config,
    store: Arc<PgStore>,
    lease: Duration,
    workspaces: PathBuf,
    /// Cancelled when the worker drains; each execution's token is a child of it.
    drain: CancellationToken,
}

/// How one claimed execution went.
enum Outcome {
    /// It ran (fresh or resumed) and ended with this reason.
    Ended(TerminationReason, u32),
    /// Its log shows it finished before (its worker died before releasing it).
    AlreadyEnded(TerminationReason),
    /// It cannot run here: the reason.
    Failed(String),
}

pub(crate) async fn work(
    db: &Path,
    config_path: Option<&Path>,
    settings: Settings,
) -> Result<u8, Failure> {
    let config = Config::load(config_path)?;
    let redactor = nerve_runtime::launch::config_redactor(&config)?;
    let store = Arc::new(queue_store(db, redactor).await?);
    // Fail at once, not at the first claim, on a machine without a Docker engine.
    nerve_hands::connect_docker()
        .await
        .map_err(Failure::usage)?;
    let workspaces = match settings.workspaces {
        Some(dir) => dir,
        None => default_workspaces()?,
    };
    let worker = Arc::new(Worker {
        name: worker_name(),
        db: db.to_path_buf(),
        config,
        store: Arc::clone(&store),
        lease: settings.lease,
        workspaces,
        drain: CancellationToken::new(),
    });
    let mut listener = store.listen("nerve_queue").await.map_err(Failure::usage)?;
    tokio::spawn(watch_signals(worker.drain.clone(), worker.name.clone()));
    say(
        &worker.name,
        &format!(
            "claiming executions from {} (concurrency {}, lease {} s)",
            store.url(),
            settings.concurrency,
            settings.lease.as_secs()
        ),
    );
    let mut running: JoinSet<()> = JoinSet::new();
    while !worker.drain.is_cancelled() {
        while running.try_join_next().is_some() {}
        if running.len() < settings.concurrency {
            match store.claim(&worker.name, worker.lease).await {
                Ok(Some(claim)) => {
                    let cancel = worker.drain.child_token();
                    running.spawn(handle(Arc::clone(&worker), claim, cancel));
                    continue;
                }
                Ok(None) => {}
                Err(error) => say(&worker.name, &format!("cannot claim: {error}")),
            }
            tokio::select! {
                () = worker.drain.cancelled() => {}
                _ = listener.next(IDLE_RECHECK) => {}
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        } else {
            tokio::select! {
                () = worker.drain.cancelled() => {}
                _ = running.join_next() => {}
            }
        }
    }
    say(
        &worker.name,
        &format!(
            "draining: {} execution(s) stop at their next turn boundary",
            running.len()
        ),
    );
    while running.join_next().await.is_some() {}
    say(&worker.name, "drained; every claim released");
    Ok(0)
}

/// Runs one claimed execution under its lease, then releases the claim (or reports that
/// it was lost).
async fn handle(worker: Arc<Worker>, claim: Claim, cancel: CancellationToken) {
    let id = claim.execution_id;
    worker.store.hold_lease(id, &worker.name);
    say(
        &worker.name,
        &format!("claimed {id} (claim {})", claim.claims),
    );
    let lost = Arc::new(AtomicBool::new(false));
    let renewer = tokio::spawn(renew(
        Arc::clone(&worker),
        id,
        cancel.clone(),
        Arc::clone(&lost),
    ));
    let outcome = take_up(&worker, &claim, cancel.clone()).await;
    renewer.abort();
    if lost.load(Ordering::SeqCst) || worker.store.lease_lost(id) {
        worker.store.drop_lease(id);
        say(
            &worker.name,
            &format!(
                "lost the lease on {id} (it ran out and another worker took the execution over, or the claim ended); stopped it, nothing more of it is appended by this worker"
            ),
        );
        return;
    }
    let name = &worker.name;
    let released = match outcome {
        Outcome::Ended(reason, turns) => {
            // A drained execution goes back to the queue for another worker to resume.
            let back = reason == TerminationReason::Shutdown && worker.drain.is_cancelled();
            // Stopped by `nerve cancel`: over for good, its sandbox home goes with it.
            if reason == TerminationReason::Shutdown && !back && cancel.is_cancelled() {
                discard_home(&worker, id);
            }
            say(
                name,
                &format!(
                    "{id} ended {reason} after {turns} turns{}",
                    if back { "; released to the queue" } else { "" }
                ),
            );
            worker.store.release(id, name, !back).await
        }
        Outcome::AlreadyEnded(reason) => {
            say(
                name,
                &format!("{id} had already ended {reason}; released it"),
            );
            worker.store.release(id, name, true).await
        }
        Outcome::Failed(message) => {
            say(name, &format!("{id} failed: {message}"));
            worker.store.fail(id, name, &message).await
        }
    };
    match released {
        Ok(true) => {}
        Ok(false) => say(
            name,
            &format!("the claim on {id} had ended before it was released"),
        ),
        Err(error) => say(name, &format!("cannot release {id}: {error}")),
    }
}

/// Removes the sandbox home of `id`, over for good; a failure is said, never fatal.
fn discard_home(worker: &Worker, id: ExecutionId) {
    let removed = nerve_runtime::log::homes_dir(&worker.db)
        .map_err(|e| e.to_string())
        .and_then(|homes| {
            nerve_hands::discard_sandbox_home(Some(&homes), id).map_err(|e| e.to_string())
        });
    if let Err(error) = removed {
        say(
            &worker.name,
            &format!("cannot remove the sandbox home of {id}: {error}"),
        );
    }
}

/// Renews the lease every third of its length. A cancel asked for stops the execution at
/// its next boundary; a lost lease stops it too (its appends are refused anyway).
async fn renew(
    worker: Arc<Worker>,
    id: ExecutionId,
    cancel: CancellationToken,
    lost: Arc<AtomicBool>,
) {
    loop {
        tokio::time::sleep(worker.lease / 3).await;
        match worker.store.renew(id, &worker.name, worker.lease).await {
            Ok(LeaseState::Held) => {}
            Ok(LeaseState::CancelRequested) => {
                if !cancel.is_cancelled() {
                    say(
                        &worker.name,
                        &format!("{id} was cancelled; stopping it at the next turn boundary"),
                    );
                    cancel.cancel();
                }
            }
            Ok(LeaseState::Lost) => {
                lost.store(true, Ordering::SeqCst);
                cancel.cancel();
                return;
            }
            // The append check still guards the log; the next renewal may get through.
            Err(error) => say(
                &worker.name,
                &format!("cannot renew the lease on {id}: {error}"),
            ),
        }
    }
}

/// Starts the claimed execution fresh, resumes it from the log, or finds it ended.
async fn take_up(worker: &Worker, claim: &Claim, cancel: CancellationToken) -> Outcome {
    let id = claim.execution_id;
    let spec: Spec = match serde_json::from_value(claim.spec.clone()) {
        Ok(spec) => spec,
        Err(error) => return Outcome::Failed(format!("its submission does not decode: {error}")),
    };
    let workspace = match prepare_workspace(worker, &spec, id).await {
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
            let args = match spec.run_args(workspace) {
                Ok(args) => args,
                Err(message) => return Outcome::Failed(message),
            };
            let request = match crate::run::request(&args) {
                Ok(request) => request,
                Err(failure) => return Outcome::Failed(failure.message),
            };
            nerve_runtime::launch::fresh(&request, &worker.db, &worker.config, id).await
        }
        verified => {
            let events = match nerve_runtime::resume::checked(id, verified) {
                Ok(events) => events,
                Err(failure) => return Outcome::Failed(failure.to_string()),
            };
            let replay = nerve_session::replay(&id.to_string(), &events);
            match replay.termination_reason {
                None | Some(TerminationReason::Shutdown) => {}
                Some(reason) => return Outcome::AlreadyEnded(reason),
            }
            match nerve_runtime::resume::resumable_from(id, &events, &replay) {
                Ok(resumable) => {
                    say(
                        &worker.name,
                        &format!(
                            "resuming {id} after turn {} (attempt {})",
                            replay.total_turns, resumable.state.attempt
                        ),
                    );
                    nerve_runtime::launch::resumed(
                        &worker.db,
                        &worker.config,
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
    launch.log = Some(Arc::clone(&worker.store) as Arc<dyn nerve_runtime::log::Log>);
    launch.capture_content = match crate::telemetry::capture_content() {
        Ok(capture) => capture,
        Err(failure) => return Outcome::Failed(failure.message),
    };
    match launch.execute(start, Arc::new(Unobserved), cancel).await {
        Ok(result) => Outcome::Ended(result.termination_reason, result.context.turn_count()),
        Err(error) => Outcome::Failed(error.to_string()),
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

/// The directory the execution works on: the shared path, or this worker's clone of the
/// repository (made once per execution; a resume on this machine reuses it).
async fn prepare_workspace(
    worker: &Worker,
    spec: &Spec,
    id: ExecutionId,
) -> Result<PathBuf, String> {
    let (url, git_ref) = match &spec.workspace {
        Workspace::Path(path) => return Ok(path.clone()),
        Workspace::Git { url, git_ref } => (url, git_ref),
    };
    let dir = worker.workspaces.join(id.to_string());
    if dir.join(".git").is_dir() {
        return Ok(dir);
    }
    std::fs::create_dir_all(&worker.workspaces)
        .map_err(|e| format!("cannot create {}: {e}", worker.workspaces.display()))?;
    // Cloned beside its final name and renamed, so a worker that dies mid-clone leaves no
    // half checkout that a resume would take for the workspace.
    let partial = worker.workspaces.join(format!(".{id}.partial"));
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

/// The first SIGTERM or Ctrl-C drains; a second aborts.
async fn watch_signals(drain: CancellationToken, name: String) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    let mut next = async || {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    next().await;
    say(
        &name,
        "stopping: no new claims; running executions stop at their next turn boundary (signal again to abort)",
    );
    drain.cancel();
    next().await;
    say(&name, "aborted");
    std::process::exit(130);
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

fn default_workspaces() -> Result<PathBuf, Failure> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".local/state")))
        .ok_or_else(|| {
            Failure::usage(
                "cannot locate a state directory for --git clones: pass --workspaces DIR",
            )
        })?;
    Ok(state.join("nerve").join("workspaces"))
}

fn say(worker: &str, text: &str) {
    output::error_line(&format!("nerve worker {worker}: {text}"));
}
