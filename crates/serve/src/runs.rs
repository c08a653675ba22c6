//! The executions this server runs: each a tokio task with its cancellation token, by id.
//! A `cancel` request cancels the token (the engine stops at its next turn boundary, as
//! Ctrl-C stops `nerve run`); the server's shutdown cancels them all and waits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use nerve_core::ExecutionId;
use nerve_runtime::launch::{Launch, Start};
use nerve_runtime::observer::Unobserved;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
pub(crate) struct Runs {
    running: Arc<Mutex<HashMap<ExecutionId, CancellationToken>>>,
    tasks: tokio::sync::Mutex<tokio::task::JoinSet<()>>,
}

impl Runs {
    /// Whether `execution` runs in this server now.
    pub(crate) fn is_running(&self, execution: ExecutionId) -> bool {
        self.lock().contains_key(&execution)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ExecutionId, CancellationToken>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `launch` from `start` in a task of its own; `false` when the execution runs
    /// already (nothing is started).
    pub(crate) async fn start(&self, launch: Launch<'static>, start: Start) -> bool {
        let execution = launch.execution_id;
        let cancel = CancellationToken::new();
        {
            let mut running = self.lock();
            if running.contains_key(&execution) {
                return false;
            }
            running.insert(execution, cancel.clone());
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
        });
        true
    }

    /// Asks `execution` to stop at its next turn boundary; `false` when it does not run here.
    pub(crate) fn cancel(&self, execution: ExecutionId) -> bool {
        self.lock()
            .get(&execution)
            .map(CancellationToken::cancel)
            .is_some()
    }

    /// Cancels every execution and waits for each to stop.
    pub(crate) async fn stop_all(&self) {
        for token in self.lock().values() {
            token.cancel();
        }
        let mut tasks = self.tasks.lock().await;
        // Ends: the set only shrinks here, and each task ends once its engine stops.
        while tasks.join_next().await.is_some() {}
    }
}
