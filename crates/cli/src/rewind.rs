//! `nerve diff` and `nerve rewind`: the workspace's history (docs/checkpoints.md), which
//! the runtime reads from the log and the execution's snapshot store.

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
