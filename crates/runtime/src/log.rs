//! Which log `--db` (or `NERVE_DB`) names, and opening it: a SQLite file (the default), or
//! a PostgreSQL server when the value is a `postgres://…` or `postgresql://…` URL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_core::{ContextArchive, ExecutionId, Redactor};
use nerve_session::{EventStore, PgStore, SqliteSink, Store, is_postgres_url};
// What the log's readers hand a front end to show (`list`, `show`, `replay`, `events`,
// `verify`, `export`): the log's own read-side types, re-exported on purpose, so that a
// front end reads the log through the runtime and never opens it itself.
pub use nerve_session::{
    BadPosition, ChainError, ExecutionLog, ExecutionSummary, FleetTask, FleetWorker, Listener,
    LogEvent, LogPosition, QueueEntry, Replay, SessionError, StoredEvent, redacted_json,
};

use crate::RuntimeError;

/// Everything a run needs from a log: the engine's sink, the archive, and the reads.
pub trait Log: EventStore + ContextArchive {}
impl<T: EventStore + ContextArchive> Log for T {}

/// The log when a front end names none: `nerve.db` under the XDG state directory.
pub fn default_db() -> Result<PathBuf, RuntimeError> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME").map(|home| Path::new(&home).join(".local").join("state"))
        })
        .ok_or_else(|| {
            RuntimeError::usage("cannot locate a state directory: set --db, NERVE_DB or HOME")
        })?;
    Ok(state.join("nerve").join("nerve.db"))
}

/// Whether `db` is a PostgreSQL URL rather than a SQLite path.
pub fn is_postgres(db: &Path) -> bool {
    db.to_str().is_some_and(is_postgres_url)
}

/// The directory beside the log where an execution's host-side state lives (snapshot
/// stores, sandbox homes): the SQLite file's directory, or for a PostgreSQL log the state
/// directory where the default log lives. Always absolute: a sandbox home under it is
/// bind-mounted, and Docker takes a relative source for a volume's name.
pub fn state_dir(db: &Path) -> Result<std::path::PathBuf, RuntimeError> {
    let base = if is_postgres(db) {
        default_db()?
    } else {
        db.to_path_buf()
    };
    let dir = base
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    std::path::absolute(dir).map_err(|e| {
        RuntimeError::usage(format!(
            "the log's directory {}: {}",
            dir.display(),
            crate::error::describe_io(&e)
        ))
    })
}

/// Where the sandbox homes of the log at `db` live (`<state dir>/homes/<execution id>`).
pub fn homes_dir(db: &Path) -> Result<std::path::PathBuf, RuntimeError> {
    Ok(state_dir(db)?.join("homes"))
}

/// Opens `db` for writing: creating and migrating it when needed.
pub async fn writer(db: &Path, redactor: Arc<Redactor>) -> Result<Arc<dyn Log>, RuntimeError> {
    if let Some(url) = db.to_str().filter(|db| is_postgres_url(db)) {
        let store = PgStore::connect(url, redactor)
            .await
            .map_err(RuntimeError::from)?;
        return Ok(Arc::new(store));
    }
    Ok(Arc::new(
        SqliteSink::open(db, redactor).map_err(RuntimeError::from)?,
    ))
}

/// A log opened for the read-only commands. A SQLite file is opened read-only (never
/// created, migrated or locked against a writer); a PostgreSQL log through its store.
#[derive(Debug)]
pub enum Reader {
    Sqlite(Box<Store>),
    /// Shared: a server's reads all go through one pool ([`crate::tokens::TokenStore::reader`]).
    Postgres(Arc<PgStore>),
}

/// Opens `db` for reading; a SQLite file must exist.
pub async fn reader(db: &Path) -> Result<Reader, RuntimeError> {
    if let Some(url) = db.to_str().filter(|db| is_postgres_url(db)) {
        let store = PgStore::connect(url, Arc::new(Redactor::new()))
            .await
            .map_err(RuntimeError::from)?;
        return Ok(Reader::Postgres(Arc::new(store)));
    }
    if !db.exists() {
        return Err(RuntimeError::NotFound(format!(
            "no event log at {} (run `nerve run` first, or pass --db)",
            db.display()
        )));
    }
    Ok(Reader::Sqlite(Box::new(
        Store::open_read_only(db).map_err(RuntimeError::from)?,
    )))
}

impl Reader {
    /// Whether this is the PostgreSQL log (the one with a task queue).
    pub fn is_postgres(&self) -> bool {
        matches!(self, Self::Postgres(_))
    }

    pub async fn events(&self, execution: ExecutionId) -> Result<Vec<StoredEvent>, SessionError> {
        match self {
            Self::Sqlite(store) => store.events(&execution),
            Self::Postgres(store) => store.events(execution).await,
        }
    }

    pub async fn replay(&self, execution: ExecutionId) -> Result<Replay, SessionError> {
        match self {
            // Streams the rows: one thread verifies the chain while another decodes.
            Self::Sqlite(store) => store.replay(&execution),
            Self::Postgres(store) => store.replay(execution).await,
        }
    }

    pub async fn verify(
        &self,
        execution: ExecutionId,
    ) -> Result<Result<u64, ChainError>, SessionError> {
        match self {
            Self::Sqlite(store) => store.verify(&execution),
            Self::Postgres(store) => store.verify(execution).await,
        }
    }

    pub async fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError> {
        match self {
            Self::Sqlite(store) => store.executions(),
            Self::Postgres(store) => store.executions().await,
        }
    }

    pub async fn export(&self, execution: ExecutionId) -> Result<ExecutionLog, SessionError> {
        match self {
            Self::Sqlite(store) => store.export(&execution),
            Self::Postgres(store) => store.export(execution).await,
        }
    }

    /// The events of `execution` after sequence number `after` (none: an empty list).
    pub async fn events_after(
        &self,
        execution: ExecutionId,
        after: u64,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        match self {
            Self::Sqlite(store) => store.events_after(&execution, after),
            Self::Postgres(store) => store.events_after(execution, after).await,
        }
    }

    /// The task queue, oldest first (a SQLite log has none: empty).
    pub async fn queue(&self) -> Result<Vec<QueueEntry>, SessionError> {
        match self {
            Self::Sqlite(_) => Ok(Vec::new()),
            Self::Postgres(store) => store.queue().await,
        }
    }

    /// `execution`'s entry in the task queue, if the log has a queue and it is there.
    pub async fn queue_entry(
        &self,
        execution: ExecutionId,
    ) -> Result<Option<QueueEntry>, SessionError> {
        match self {
            Self::Sqlite(_) => Ok(None),
            Self::Postgres(store) => store.queue_entry(execution).await,
        }
    }

    /// Where the log ends now: following it from here gets the events appended from now on.
    pub async fn log_end(&self) -> Result<LogPosition, SessionError> {
        match self {
            Self::Sqlite(store) => store.log_end(),
            Self::Postgres(store) => store.log_end().await,
        }
    }

    /// The events of every execution after `after`, in the log's order (see
    /// [`LogPosition`]), at most `limit`.
    pub async fn log_events_after(
        &self,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEvent>, SessionError> {
        match self {
            Self::Sqlite(store) => store.log_events_after(after, limit),
            Self::Postgres(store) => store.log_events_after(after, limit).await,
        }
    }

    /// The fleet: the queue's latest tasks and the workers; `None` for a SQLite log, which
    /// has no queue and no workers.
    pub async fn fleet(&self) -> Result<Option<(Vec<FleetTask>, Vec<FleetWorker>)>, SessionError> {
        match self {
            Self::Sqlite(_) => Ok(None),
            Self::Postgres(store) => Ok(Some((
                store.fleet_tasks().await?,
                store.fleet_workers().await?,
            ))),
        }
    }

    /// A listener for the log's notifications on `channel`; `None` for a SQLite log, which
    /// notifies nobody (a follower polls it).
    pub async fn listen(&self, channel: &str) -> Result<Option<Listener>, SessionError> {
        match self {
            Self::Sqlite(_) => Ok(None),
            Self::Postgres(store) => store.listen(channel).await.map(Some),
        }
    }

    /// The ids that start with `prefix` (any case), in id order, at most `limit`.
    pub async fn executions_with_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<ExecutionId>, SessionError> {
        match self {
            Self::Sqlite(store) => store.executions_with_prefix(prefix, limit),
            Self::Postgres(store) => store.executions_with_prefix(prefix.to_owned(), limit).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--db target/demo/nerve.db` (the demo's): the homes beside it are an absolute path,
    /// which Docker mounts, not a relative one it takes for a volume's name.
    #[test]
    fn the_state_beside_a_relative_log_is_absolute() {
        for db in ["target/demo/nerve.db", "nerve.db"] {
            let homes = homes_dir(Path::new(db)).unwrap();
            assert!(homes.is_absolute(), "{db}: {}", homes.display());
            assert!(homes.ends_with("homes"), "{}", homes.display());
        }
    }
}
