//! `nerve approve ID [--deny] [--reason TEXT]`: the runtime records a person's decision for
//! every pending approval of a parked execution; this says what was decided and what next.

use std::path::Path;

use nerve_runtime::resume::Approved;

use crate::{Failure, output};

/// `config` is the `--config` given, repeated in the `resume` suggested.
pub(crate) async fn approve(
    db: &Path,
    config: Option<&Path>,
    id: &str,
    deny: bool,
    reason: Option<String>,
) -> Result<u8, Failure> {
    let (execution, approved) = nerve_runtime::resume::approve(db, id, deny, reason, |pending| {
        output::line(&format!(
            "{} {} call {} ({})",
            if deny { "denied" } else { "approved" },
            pending.call.name,
            pending.call.id,
            pending.rule
        ));
    })
    .await?;
    match approved {
        Approved::Requeued => {
            output::line(&format!("queued again: a worker resumes {execution}"));
        }
        Approved::ToResume => {
            let db_flag = if nerve_runtime::log::default_db().is_ok_and(|default| default == db) {
                String::new()
            } else {
                format!("--db {} ", db.display())
            };
            let line = match config {
                Some(config) => format!(
                    "continue it with: nerve {db_flag}--config {} resume {execution}",
                    config.display()
                ),
                None => format!(
                    "continue it with: nerve {db_flag}resume {execution} (with the --config it ran with, if any)"
                ),
            };
            output::line(&line);
        }
    }
    Ok(0)
}
