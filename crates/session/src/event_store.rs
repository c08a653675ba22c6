//! The event log as a trait: everything the engine and the CLI need from a backend, so a
//! shared PostgreSQL backend can stand beside the embedded SQLite one ([`crate::SqliteSink`]).
//!
//! Contract every backend keeps: an execution's sequence numbers are gap-free from 1 and
//! assigned in commit order; a write returns only after it is durable; the hash chain is
//! computed exactly as [`crate::GENESIS_HASH`] and the chain module define it, so a log can
//! move between backends and still verify; payloads are redacted before they are stored;
//! readers see whole commits only.

use async_trait::async_trait;
use nerve_core::event::Compaction;
use nerve_core::{BlockId, Event, EventSink, ExecutionId};

use crate::SessionError;
use crate::archive::{ArchiveBlock, ArchiveHit, NewBlock};
use crate::chain::ChainError;
use crate::chain::StoredEvent;
use crate::replay::Replay;
use crate::store::{ExecutionSummary, ResumePoint, StoredCheckpoint};
use crate::transfer::ExecutionLog;

/// An event log backend: appends (through [`EventSink`] and [`EventStore::append_all`]),
/// checkpoints, the archive, and the reads behind `replay`, `list`, `show` and `resume`.
#[async_trait]
pub trait EventStore: EventSink {
    /// Appends `events` to `execution` atomically, in order; returns their sequence numbers.
    async fn append_all(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
    ) -> Result<Vec<u64>, SessionError>;

    /// Saves `snapshot` (the agent context after `turn`) with its `checkpoint` event,
    /// atomically; returns the event's sequence number, which is the checkpoint's id.
    async fn write_checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<u64, SessionError>;

    /// Archives `blocks` on their own; returns their `created_seq`.
    async fn put_blocks(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
    ) -> Result<u64, SessionError>;

    /// Archives `blocks` and appends the `compaction` event that archived them, atomically;
    /// returns the event's sequence number.
    async fn compact(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
        compaction: Compaction,
    ) -> Result<u64, SessionError>;

    /// Every event of `execution`, in order. [`SessionError::UnknownExecution`] when none.
    async fn events(&self, execution: ExecutionId) -> Result<Vec<StoredEvent>, SessionError>;

    /// Every event of `execution`, in order, once their hash chain verifies
    /// ([`SessionError::BrokenChain`] otherwise): what a resume builds on.
    async fn verified_events(
        &self,
        execution: ExecutionId,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        let events = self.events(execution).await?;
        crate::chain::verify_events(&events).map_err(SessionError::BrokenChain)?;
        Ok(events)
    }

    /// The replay of `execution`'s log.
    async fn replay(&self, execution: ExecutionId) -> Result<Replay, SessionError>;

    /// Recomputes the hash chain; `Ok(Err(..))` names the first bad sequence number.
    async fn verify(&self, execution: ExecutionId)
    -> Result<Result<u64, ChainError>, SessionError>;

    /// All executions, newest first.
    async fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError>;

    /// The executions whose id starts with `prefix` (any case), in id order, at most
    /// `limit`; a prefix with anything but hex digits and `-` matches nothing. The default
    /// filters [`EventStore::executions`]; a backend with an index on ids should override it.
    async fn executions_with_prefix(
        &self,
        prefix: String,
        limit: usize,
    ) -> Result<Vec<ExecutionId>, SessionError> {
        let Some(prefix) = crate::store::id_prefix(&prefix) else {
            return Ok(Vec::new());
        };
        let mut ids = self
            .executions()
            .await?
            .into_iter()
            .filter(|e| e.execution_id.starts_with(&prefix))
            .filter_map(|e| e.execution_id.parse().ok())
            .collect::<Vec<ExecutionId>>();
        ids.sort();
        ids.truncate(limit);
        Ok(ids)
    }

    /// One execution's summary.
    async fn execution(&self, execution: ExecutionId) -> Result<ExecutionSummary, SessionError>;

    /// The latest checkpoint, verified against its chained event; `None` when there is none.
    async fn latest_checkpoint(
        &self,
        execution: ExecutionId,
    ) -> Result<Option<StoredCheckpoint>, SessionError>;

    /// The latest checkpoint, the events after it, and the replay, from one snapshot.
    async fn resume_point(&self, execution: ExecutionId) -> Result<ResumePoint, SessionError>;

    /// One archived block of `execution`; `None` for an unknown id or another execution's.
    async fn archive_block(
        &self,
        execution: ExecutionId,
        block: BlockId,
    ) -> Result<Option<ArchiveBlock>, SessionError>;

    /// Full-text search over `execution`'s archive; any `query` text is safe.
    async fn search_archive(
        &self,
        execution: ExecutionId,
        query: String,
        limit: usize,
    ) -> Result<Vec<ArchiveHit>, SessionError>;

    /// Every event of `execution` with its snapshot, and its archive blocks, read from one
    /// snapshot of the log: what `nerve export` writes.
    async fn export(&self, execution: ExecutionId) -> Result<ExecutionLog, SessionError>;

    /// Loads a log checked by [`crate::parse_log`] as it is, in one transaction: events
    /// keep their times and hashes, so the execution verifies here as it did where it was
    /// exported. Refused, with nothing written, when the execution already has events in
    /// this log. Returns the number of events written.
    async fn import(&self, log: ExecutionLog) -> Result<u64, SessionError>;
}
