//! Nerve's event log: an append-only SQLite store with a per-execution hash chain, a
//! group-committing writer that implements [`nerve_core::EventSink`], and a pure replay
//! that rebuilds an execution and scores how completely it was recorded.

mod chain;
mod replay;
mod schema;
mod store;
mod writer;

pub use chain::{ChainError, GENESIS_HASH};
pub use replay::{COMPLETE_AT, Gap, GapKind, Replay, replay};
pub use store::{ExecutionSummary, Store, StoredEvent};
pub use writer::SqliteSink;

/// Errors of the event log. None of them is retryable by the caller: a database that
/// cannot be opened or written stays that way until a human looks at it.
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
    /// The database was written by a newer Nerve. Returned by [`Store::open`].
    #[error("event log {path} has schema version {found}, newer than this nerve understands ({supported})")]
    SchemaTooNew { path: String, found: i64, supported: i64 },
    /// No event has ever been recorded for this execution id.
    #[error("no execution with id {0}")]
    UnknownExecution(String),
    /// An event could not be serialised. A bug, not an input error.
    #[error("cannot encode event: {0}")]
    Encode(#[from] serde_json::Error),
    /// The writer thread is gone (it panicked or the sink was dropped).
    #[error("event log writer stopped")]
    WriterGone,
}

#[cfg(test)]
mod tests;
