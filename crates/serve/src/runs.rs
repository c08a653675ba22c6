//! The executions this server runs: each a tokio task with its cancellation token, by id.
//! A `cancel` request cancels the token (the engine stops at once, as Ctrl-C stops `nerve
//! run`: no new tool call starts, a running command is interrupted); the server's shutdown cancels them all and waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nerve_core::ExecutionId;
use nerve_runtime::launch::{Launch, Start};
use nerve_runtime::observer::Unobserved;
use tokio_util::sync::CancellationToken;

/// How long a request waits for an execution that wrote its finish event to close its
/// sandbox, before it is refused as still running.
pub(crate) const CLOSING: Duration = Duration::from_secs(30);

/// An execution running here: its cancellation, and a token cancelled once its task ended
/// (the sandbox closed after the finish event).
#[derive(Debug, Clone)]
struct Running {
    cancel: CancellationToken,
    ended: CancellationToken,
}

#[derive(Debug, Default)]
pub(crate) struct Runs {
    running: Arc<Mutex<HashMap<ExecutionId, Running>>>,
    tasks: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl Runs {
    /// Whether `execution` runs in this server now.
    pub(crate) fn is_running(&self, execution: ExecutionId) -> bool {
        self.lock().contains_key(&execution)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ExecutionId, Running>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits (up to `within`) for `execution` to stop running here: a request right after
    /// the finish event finds its sandbox still closing. `false`: it still runs.
    pub(crate) async fn ended(&self, execution: ExecutionId, within: Duration) -> bool {
        let Some(ended) = self.lock().get(&execution).map(|r| r.ended.clone()) else {
            return true;
        };
        tokio::time::timeout(within, ended.cancelled())
            .await
            .is_ok()
    }

    /// Runs `launch` from `start` in a task of its own; `false` when the execution runs
    /// already (nothing is started).
    pub(crate) async fn start(&self, launch: Launch<'static>, start: Start) -> bool {
        let execution = launch.execution_id;
        let cancel = CancellationToken::new();
        let ended = CancellationToken::new();
        {
            let mut running = self.lock();
            if running.contains_key(&execution) {
                return false;
            }
            running.insert(
                execution,
                Running {
                    cancel: cancel.clone(),
                    ended: ended.clone(),
                },
            );
        }
        let running = Arc::clone(&self.running);
        let mut tasks = self.tasks.lock().await;
        // Ends: it only takes tasks that have finished already.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            match launch.execute(start, Arc::new(Unobserved), cancel).await {
                Ok(result) => {
                    tracing::info!(%execution, reason = %result.termination_reason, "execution ended");
                }
                Err(error) => tracing::warn!(%execution, %error, "execution failed"),
            }
            running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&execution);
            ended.cancel();
        });
        true
    }

    /// Stops `execution` now (no new tool call starts, a running command is interrupted);
    /// `false` when it does not run here.
    pub(crate) fn cancel(&self, execution: ExecutionId) -> bool {
        self.lock()
            .get(&execution)
            .map(|r| r.cancel.cancel())
            .is_some()
    }

    /// Cancels every execution and waits for each to stop.
    pub(crate) async fn stop_all(&self) {
        for running in self.lock().values() {
            running.cancel.cancel();
        }
        let mut tasks = self.tasks.lock().await;
        // Ends: the set only shrinks here, and each task ends once its engine stops.
        while tasks.join_next().await.is_some() {}
    }
}
