//! Nerve's event log: an append-only SQLite store (or a shared PostgreSQL one) with a per-execution hash chain, a
//! group-committing writer that implements [`nerve_core::EventSink`] and [`EventStore`],
//! checkpoints and an archive with full-text search beside the log, an executions index,
//! and a pure replay that rebuilds an execution and scores how completely it was recorded.

mod archive;
mod chain;
mod encode;
mod event_store;
#[cfg(feature = "kill-points")]
pub mod kill_points;
mod log_order;
mod pg;
#[cfg(any(test, feature = "test-cluster"))]
pub mod pg_cluster;
mod pg_fleet;
mod pg_queue;
mod replay;
mod schema;
mod store;
mod tokens;
mod transfer;
mod wal;
mod writer;

pub use archive::{ArchiveBlock, ArchiveHit, NewBlock, fts_query};
pub use chain::{ChainError, GENESIS_HASH, StoredEvent, verify_events};
pub use encode::redacted_json;
pub use event_store::EventStore;
pub use log_order::{BadPosition, LogEvent, LogPosition};
pub use pg::tls::SslMode;
pub use pg::{PgStore, is_postgres_url};
pub use pg_fleet::{FleetTask, FleetWorker};
pub use pg_queue::{Cancelled, Claim, LeaseState, Listener, QueueEntry};
pub use replay::{
    COMPLETE_AT, CheckpointMark, CompactionRecord, Gap, GapKind, PendingApproval, ProxyTally,
    Replay, ResumeMark, WorkspaceHistory, replay,
};
pub use store::{ExecutionSummary, ResumePoint, Store, StoredCheckpoint};
pub use tokens::{TOKEN_PREFIX, TokenRecord};
pub use transfer::{
    EXPORT_FORMAT, EXPORT_VERSION, ExecutionLog, ImportError, LoggedEvent, parse_log, write_log,
};
pub use writer::SqliteSink;

/// Errors of the event log. None of them is retryable by the caller: a database that
/// cannot be opened or written stays that way until a human looks at it, and a record that
/// does not decode will not decode on the next try either.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The database file could not be opened, migrated or queried. Returned by every
    /// [`Store`] method.
    #[error("event log {path}: {source}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    /// A database server (the PostgreSQL log) could not be reached, migrated or queried;
    /// `log` names it without its password. Returned by every [`PgStore`] method. Whether
    /// a retry helps depends on the cause (a server restarting, yes; a bad URL, no).
    #[error("event log {log}: {message}")]
    Database { log: String, message: String },
    /// The first connection to a database server failed: it is down or unreachable, it
    /// refused the user, or TLS could not be agreed (the message says which check the
    /// server's certificate failed). `log` names it without its password. Returned by
    /// [`PgStore::connect`]; retryable when the server was only down.
    #[error("cannot connect to {log}: {message}")]
    Connect { log: String, message: String },
    /// The database was written by a newer Nerve. Returned by [`Store::open`].
    #[error(
        "event log {path} has schema version {found}, newer than this nerve understands ({supported})"
    )]
    SchemaTooNew {
        path: String,
        found: i64,
        supported: i64,
    },
    /// No event has ever been recorded for this execution id. Returned by the reads that
    /// need one ([`Store::events`], [`Store::replay`], [`Store::verify`], ...).
    #[error("no execution with id {0}")]
    UnknownExecution(String),
    /// An event, snapshot or block could not be serialised. A bug, not an input error.
    #[error("cannot encode event: {0}")]
    Encode(#[from] serde_json::Error),
    /// A stored record does not hold together: a checkpoint whose snapshot does not match
    /// the hash its chained event recorded, an archive block that does not decode. Returned
    /// by [`Store::latest_checkpoint`], [`Store::archive_block`], [`Store::search_archive`].
    #[error("event log record is corrupt: {0}")]
    Corrupt(String),
    /// The execution's hash chain does not verify: an event was edited, removed or
    /// reordered. Returned by [`Store::verified_events`] and
    /// [`EventStore::verified_events`], which refuse to hand such a log to a resume. Not
    /// retryable: the log needs a human (`nerve verify` names the same sequence).
    #[error(transparent)]
    BrokenChain(ChainError),
    /// The transaction holding this write failed (the message says why); nothing of it was
    /// written. Returned by the writes of [`SqliteSink`] and [`Store`].
    #[error("event log write failed: {0}")]
    Write(String),
    /// The writer thread is gone (it panicked or the sink was dropped). Returned by the
    /// writes of [`SqliteSink`].
    #[error("event log writer stopped")]
    WriterGone,
    /// A read on the blocking pool panicked or was cancelled (the runtime shuts down).
    /// Returned by the reads of [`SqliteSink`].
    #[error("event log reader stopped")]
    ReaderGone,
}

/// The engine's port speaks [`nerve_core::SinkError`]; the message stays this error's text.
impl From<SessionError> for nerve_core::SinkError {
    fn from(error: SessionError) -> Self {
        let message = error.to_string();
        match error {
            SessionError::WriterGone | SessionError::ReaderGone => Self::Unavailable(message),
            SessionError::Encode(_) => Self::Encode(message),
            SessionError::Corrupt(_) | SessionError::BrokenChain(_) => Self::Corrupt(message),
            SessionError::Sqlite { .. }
            | SessionError::Database { .. }
            | SessionError::Connect { .. }
            | SessionError::SchemaTooNew { .. }
            | SessionError::UnknownExecution(_)
            | SessionError::Write(_) => Self::Write(message),
        }
    }
}

#[cfg(test)]
mod tests;
