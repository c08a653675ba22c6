//! `nerve worker`: the runtime's worker (claims from the PostgreSQL task queue, leases,
//! sandboxes on this machine's Docker; see `nerve_runtime::worker`) with its lines on
//! stderr. SIGTERM (or Ctrl-C) drains the worker: it stops claiming, its executions stop at
//! once (no new tool call starts, a running command is interrupted; `shutdown`, resumable), and it gives their claims back to the
//! queue, where other workers resume them. A second signal aborts at once.

use std::path::Path;
use std::sync::Arc;

use nerve_runtime::worker::{Reporter, Worker, WorkerSettings};
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::output;

pub(crate) async fn work(
    db: &Path,
    config_path: Option<&Path>,
    settings: WorkerSettings,
) -> Result<u8, Failure> {
    // A worker serves many workspaces: the user's settings and --config only.
    let config =
        crate::settings::load(config_path, None, nerve_runtime::settings::Flags::default())?;
    let worker = Worker::start(
        db,
        config,
        &settings,
        crate::telemetry::capture_content()?,
        Arc::new(Stderr),
    )
    .await?;
    let worker = Arc::new(worker);
    tokio::spawn(watch_signals(
        worker.drain().clone(),
        worker.name().to_owned(),
    ));
    worker.work(settings.concurrency).await?;
    Ok(0)
}

/// The worker's lines, on stderr.
struct Stderr;

impl Reporter for Stderr {
    fn say(&self, worker: &str, text: &str) {
        say(worker, text);
    }
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
        &format!(
            "stopping: no new claims; running executions stop now: {} (signal again to abort)",
            nerve_runtime::worker::STOP_EFFECT
        ),
    );
    drain.cancel();
    next().await;
    say(&name, "aborted");
    std::process::exit(130);
}

fn say(worker: &str, text: &str) {
    output::error_line(&format!("nerve worker {worker}: {text}"));
}
