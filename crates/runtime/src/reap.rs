//! Removing what dead executions left behind: sandbox containers whose owning process is
//! provably dead (or, on an operator's word, every Nerve container), and the sandbox homes
//! of executions that ended for good (completed, cancelled) or went unused for a week.

use std::collections::HashSet;
use std::path::Path;

use nerve_core::ExecutionId;
pub use nerve_hands::{HomeRemoval, ReapReport};
use nerve_hands::{HomeSweep, ReapScope};

use crate::RuntimeError;
use crate::log::Reader;

/// What [`reap`] removed and kept.
#[derive(Debug)]
pub struct Reaped {
    pub report: ReapReport,
    /// Why the log could not say which executions ended for good, when it could not: then
    /// only homes unused for a week were removed.
    pub log_unreadable: Option<String>,
}

/// The executions of the log at `db` that can never run again, or why the log could not
/// say (then only unused homes go).
async fn ended_for_good(db: &Path) -> Result<HashSet<String>, String> {
    let store = crate::log::reader(db).await.map_err(|e| e.to_string())?;
    let mut ended: HashSet<String> = store
        .executions()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(nerve_session::ExecutionSummary::ended_for_good)
        .map(|e| e.execution_id)
        .collect();
    // A running execution cancelled in the queue has events: its queue row says so.
    if let Reader::Postgres(pg) = &store {
        let queue = pg.queue().await.map_err(|e| e.to_string())?;
        ended.extend(
            queue
                .into_iter()
                .filter(|entry| entry.state == "cancelled")
                .map(|entry| entry.execution_id),
        );
    }
    Ok(ended)
}

/// Reaps the orphaned containers (every Nerve container with `all`; only execution `id`'s
/// with `id`) on this machine's Docker engine, and the sandbox homes beside the log at
/// `db` that no execution will use again.
pub async fn reap(db: &Path, all: bool, id: Option<&str>) -> Result<Reaped, RuntimeError> {
    let execution = id
        .map(|id| {
            id.parse::<ExecutionId>()
                .map(|id| id.to_string())
                .map_err(|e| RuntimeError::usage(format!("`{id}` is not an execution id: {e}")))
        })
        .transpose()?;
    let docker = nerve_hands::connect_docker()
        .await
        .map_err(RuntimeError::sandbox)?;
    let scope = if all {
        ReapScope::All
    } else {
        ReapScope::Orphans
    };
    let (ended, log_unreadable) = match ended_for_good(db).await {
        Ok(ended) => (ended, None),
        Err(error) => (HashSet::new(), Some(error)),
    };
    let homes = HomeSweep {
        dir: Some(crate::log::homes_dir(db)?),
        ended,
        ..HomeSweep::default()
    };
    let report = nerve_hands::reap_with(&docker, scope, execution.as_deref(), &homes)
        .await
        .map_err(RuntimeError::failed)?;
    Ok(Reaped {
        report,
        log_unreadable,
    })
}
