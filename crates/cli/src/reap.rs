//! `nerve reap [--all] [ID]`: the runtime removes sandbox containers left behind by `nerve`
//! processes that died (with `--all`, every Nerve container: an operator's override) and
//! the sandbox homes of executions that ended for good (completed, cancelled) or went
//! unused for a week; this prints what went and what stayed.

use std::path::Path;

use nerve_runtime::reap::HomeRemoval;

use crate::{Failure, output};

/// Reaps and prints one line per container: `removed NAME` or `kept NAME: REASON`, then a
/// count. `run` and `resume` reap orphans by themselves; this is for an operator, and for
/// containers whose owner this process cannot prove dead (another host, boot or PID
/// namespace, an unreadable label), which only `--all` removes.
pub(crate) async fn reap(db: &Path, all: bool, id: Option<&str>) -> Result<u8, Failure> {
    let reaped = nerve_runtime::reap::reap(db, all, id).await?;
    if let Some(error) = &reaped.log_unreadable {
        output::line(&format!(
            "cannot read the log ({error}): only sandbox homes unused for a week are removed"
        ));
    }
    let report = &reaped.report;
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
