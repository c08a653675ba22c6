//! `nerve reap [--all] [ID]`: removes sandbox containers left behind by `nerve` processes
//! that died, and, with `--all`, every Nerve container (an operator's override).

use nerve_core::ExecutionId;
use nerve_hands::ReapScope;

use crate::{Failure, output};

/// Reaps and prints one line per container: `removed NAME` or `kept NAME: REASON`, then a
/// count. `run` and `resume` reap orphans by themselves; this is for an operator, and for
/// containers whose owner this process cannot prove dead (another host, boot or PID
/// namespace, an unreadable label), which only `--all` removes.
pub(crate) async fn reap(all: bool, id: Option<&str>) -> Result<u8, Failure> {
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
    let report = nerve_hands::reap(&docker, scope, execution.as_deref())
        .await
        .map_err(Failure::runtime)?;
    for name in &report.removed {
        output::line(&format!("removed {name}"));
    }
    for (name, reason) in &report.kept {
        output::line(&format!("kept {name}: {reason}"));
    }
    for execution in &report.homes_removed {
        output::line(&format!(
            "removed the sandbox home of {execution} (unused for a week)"
        ));
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
