//! `nerve reap [--all] [ID]`: removes sandbox containers left behind by `nerve` processes
//! that died, and, with `--all`, every Nerve container (an operator's override); and the
//! sandbox homes of executions that ended for good (completed, cancelled) or went unused
//! for a week.

use std::collections::HashSet;
use std::path::Path;

use nerve_core::ExecutionId;
use nerve_hands::{HomeRemoval, HomeSweep, ReapScope};

use crate::{Failure, output};
use nerve_runtime::log::Reader;

/// The executions of the log at `db` that can never run again, or why the log could not
/// say (then only unused homes go).
async fn ended_for_good(db: &Path) -> Result<HashSet<String>, String> {
    let store = nerve_runtime::log::reader(db)
        .await
        .map_err(|e| e.to_string())?;
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

/// Reaps and prints one line per container: `removed NAME` or `kept NAME: REASON`, then a
/// count. `run` and `resume` reap orphans by themselves; this is for an operator, and for
/// containers whose owner this process cannot prove dead (another host, boot or PID
/// namespace, an unreadable label), which only `--all` removes.
pub(crate) async fn reap(db: &Path, all: bool, id: Option<&str>) -> Result<u8, Failure> {
    let execution = id
        .map(|id| {
            id.parse::<ExecutionId>()
                .map(|id| id.to_string())
                .map_err(|e| Failure::usage(format!("`{id}` is not an execution id: {e}")))
        })
        .transpose()?;
    let docker = nerve_hands::connect_docker()
        .await
        .map_err(Failure::usage)?;
    let scope = if all {
        ReapScope::All
    } else {
        ReapScope::Orphans
    };
    let ended = match ended_for_good(db).await {
        Ok(ended) => ended,
        Err(error) => {
            output::line(&format!(
                "cannot read the log ({error}): only sandbox homes unused for a week are removed"
            ));
            HashSet::new()
        }
    };
    let homes = HomeSweep {
        dir: Some(nerve_runtime::log::homes_dir(db)?),
        ended,
        ..HomeSweep::default()
    };
    let report = nerve_hands::reap_with(&docker, scope, execution.as_deref(), &homes)
        .await
        .map_err(Failure::runtime)?;
    for name in &report.removed {
        output::line(&format!("removed {name}"));
    }
    for (name, reason) in &report.kept {
        output::line(&format!("kept {name}: {reason}"));
    }
    for (execution, why) in &report.homes_removed {
        let why = match why {
            HomeRemoval::Ended => "it ended for good: completed or cancelled",
            HomeRemoval::Unused => "unused for a week",
        };
        output::line(&format!("removed the sandbox home of {execution} ({why})"));
    }
    output::line(&format!(
        "{} removed, {} kept{}",
        report.removed.len(),
        report.kept.len(),
        if report.kept.is_empty() || all {
            ""
        } else {
            " (`nerve reap --all` removes those too)"
        }
    ));
    Ok(0)
}
