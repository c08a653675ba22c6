//! `nerve approve ID [--deny] [--reason TEXT]`: the runtime records a person's decision for
//! every pending approval of a parked execution; this says what was decided and what next.

use std::path::Path;

use nerve_runtime::resume::Approved;

use crate::{Failure, output};

pub(crate) async fn approve(
    db: &Path,
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
            output::line(&format!("continue it with: nerve resume {execution}"));
        }
    }
    Ok(0)
}
