//! `nerve diff`, `nerve rewind` and `nerve fork`: the workspace's history
//! (docs/checkpoints.md), which the runtime reads from the log and the execution's
//! snapshot store, and executions branched from another's turn.

use std::path::Path;

use nerve_runtime::snapshots::{Scope, Target};

use crate::{Failure, output};

/// `nerve diff ID [--turn N]`.
pub(crate) async fn diff(db: &Path, id: &str, turn: Option<u32>) -> Result<u8, Failure> {
    let scope = turn.map_or(Scope::Execution, Scope::Turn);
    output::line(&nerve_runtime::snapshots::diff_text(db, id, scope).await?);
    Ok(0)
}

/// `nerve rewind ID --turn N [--force]`.
pub(crate) async fn rewind(db: &Path, id: &str, turn: u32, force: bool) -> Result<u8, Failure> {
    for line in nerve_runtime::snapshots::rewind_to(db, id, Target::Turn(turn), force).await? {
        output::line(&line);
    }
    Ok(0)
}

/// `nerve fork ID --turn N [--in-place | --into DIR] [--task TEXT [--provider SPEC]] [--json]`:
/// prints the new execution's id (`{"execution_id"}` with `--json`); with `--task`, the
/// fork then continues with that message as `run --continue` would, and its summary is
/// what `--json` prints.
pub(crate) async fn fork(
    db: &Path,
    config_path: Option<&Path>,
    request: &nerve_runtime::fork::ForkRequest,
    then: Option<(String, Option<String>)>,
    json: bool,
) -> Result<u8, Failure> {
    let forked = nerve_runtime::fork::fork(db, request).await?;
    let id = forked.execution_id.to_string();
    if !json {
        output::line(&id);
        output::error_line(&format!(
            "forked execution {} at turn {} into {} ({})",
            forked.parent,
            forked.turn,
            id,
            forked.workspace.display()
        ));
    } else if then.is_none() {
        output::line(&serde_json::json!({ "execution_id": id }).to_string());
    }
    match then {
        None => Ok(0),
        Some((task, provider)) => {
            crate::run::continue_with(db, config_path, &id, task, provider, json).await
        }
    }
}
