//! `nerve events ID --follow`: the timeline so far, then each event as it is appended,
//! until the execution's `finish` event. On PostgreSQL the log's commits notify
//! (`LISTEN nerve_events`, one notification per execution a commit appended to); a SQLite
//! log is polled through a read-only connection, which never blocks its writer. An
//! execution without events yet is waited for (on PostgreSQL only while the queue holds it).

use std::path::Path;
use std::time::Duration;

use nerve_core::ExecutionId;
use nerve_runtime::log::{SessionError, StoredEvent};

use crate::Failure;
use crate::inspect::{event_json, event_line};
use crate::output;
use nerve_runtime::log::{Reader, reader};

/// How often a SQLite log is read for new events.
const POLL: Duration = Duration::from_millis(200);
/// How long a PostgreSQL follower waits for a notification before it reads anyway (a
/// guard against a lost listening connection, not the way events normally arrive).
const RECHECK: Duration = Duration::from_secs(2);

pub(crate) async fn follow(db: &Path, id: &str, json: bool, full: bool) -> Result<u8, Failure> {
    let execution: ExecutionId = id.parse().map_err(Failure::usage)?;
    let store = reader(db).await?;
    let mut listener = store.listen("nerve_events").await.map_err(Failure::usage)?;
    let wanted = execution.to_string();
    let mut after = 0;
    // Ends: at the execution's `finish` event (or an error); a running one is followed for
    // as long as it runs.
    loop {
        let new = match events_after(&store, execution, after).await {
            Ok(new) => new,
            // Not started yet: wait for it when the queue holds it, or, on SQLite (no
            // queue to ask), when the whole id was given (a `run` about to write it).
            Err(SessionError::UnknownExecution(_)) if after == 0 => {
                if !may_start(&store, execution).await? {
                    return Err(Failure::usage(format!("no execution with id {execution}")));
                }
                Vec::new()
            }
            Err(error) => return Err(Failure::usage(error)),
        };
        for event in &new {
            if json {
                output::json(&event_json(event));
            } else {
                output::line(&event_line(event, full));
            }
            after = event.seq;
        }
        if new.iter().any(|e| e.kind == "finish") {
            return Ok(0);
        }
        match &mut listener {
            Some(listener) => {
                // Wait for a commit to this execution (or the recheck).
                let deadline = tokio::time::Instant::now() + RECHECK;
                // Ends: at the deadline, or at a notification for this execution.
                loop {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    match listener.next(left).await.map_err(Failure::runtime)? {
                        Some(payload) if payload == wanted => break,
                        Some(_) => {}
                        None => break,
                    }
                }
            }
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// The events after `after`; [`SessionError::UnknownExecution`] while it has none.
async fn events_after(
    store: &Reader,
    execution: ExecutionId,
    after: u64,
) -> Result<Vec<StoredEvent>, SessionError> {
    let events = store.events_after(execution, after).await?;
    if events.is_empty() && after == 0 {
        return Err(SessionError::UnknownExecution(execution.to_string()));
    }
    Ok(events)
}

/// Whether `execution`, which has no event yet, may still start: the PostgreSQL task queue
/// holds it waiting for a worker (or being started); a SQLite log cannot tell, so yes.
async fn may_start(store: &Reader, execution: ExecutionId) -> Result<bool, Failure> {
    if !store.is_postgres() {
        return Ok(true);
    }
    let entry = store.queue_entry(execution).await.map_err(Failure::usage)?;
    Ok(entry.is_some_and(|e| e.state == "queued" || e.state == "claimed"))
}
