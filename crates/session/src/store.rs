//! The SQLite store: opening and migrating the database, appending encoded events in one
//! transaction, reading an execution back, verifying its chain, listing executions.

use std::collections::HashMap;
use std::path::Path;

use nerve_core::ExecutionId;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use serde::Serialize;

use crate::SessionError;
use crate::chain::{ChainError, GENESIS_HASH, event_hash};
use crate::schema::{SCHEMA_VERSION, migrate};

/// One event as stored: the payload is the redacted JSON text that was hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredEvent {
    pub execution_id: String,
    pub seq: u64,
    pub ts: String,
    pub kind: String,
    pub version: u32,
    pub payload: String,
    pub prev_hash: String,
    pub hash: String,
}

/// One line of `nerve list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecutionSummary {
    pub execution_id: String,
    pub started_at: String,
    pub task: Option<String>,
    /// `None` while running, or when the run crashed before finishing.
    pub termination_reason: Option<String>,
    pub events: u64,
}

/// An event ready to be appended: already serialised and redacted by the writer.
#[derive(Debug, Clone)]
pub(crate) struct EncodedEvent {
    pub(crate) execution_id: String,
    pub(crate) kind: &'static str,
    pub(crate) version: u32,
    pub(crate) payload: String,
}

/// A connection to the event log. Readers and the writer each hold their own; WAL mode lets
/// readers in other processes proceed while the writer commits.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: String,
}

impl Store {
    /// Opens (creating and migrating if needed) the log at `path`. The parent directory
    /// is created when missing.
    pub fn open(path: &Path) -> Result<Self, SessionError> {
        let shown = path.display().to_string();
        let err = |source| SessionError::Sqlite { path: shown.clone(), source };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.exists() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                        Some(format!("cannot create directory {}: {e}", parent.display())),
                    ))
                })?;
            }
        }
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err)?;
        // FULL: an append is durable when its commit returns, power loss included.
        conn.pragma_update(None, "synchronous", "FULL").map_err(err)?;
        let found = migrate(&mut conn).map_err(err)?;
        if found > SCHEMA_VERSION {
            return Err(SessionError::SchemaTooNew { path: shown, found, supported: SCHEMA_VERSION });
        }
        Ok(Self { conn, path: shown })
    }

    /// Opens an existing log for reading only; never creates or migrates anything.
    pub fn open_read_only(path: &Path) -> Result<Self, SessionError> {
        let shown = path.display().to_string();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| SessionError::Sqlite { path: shown.clone(), source })?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(|source| SessionError::Sqlite { path: shown.clone(), source })?;
        Ok(Self { conn, path: shown })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    fn sql_err(&self, source: rusqlite::Error) -> SessionError {
        SessionError::Sqlite { path: self.path.clone(), source }
    }

    /// Appends a batch in one transaction and returns each event's sequence number.
    pub(crate) fn append_batch(&mut self, batch: &[EncodedEvent]) -> Result<Vec<u64>, SessionError> {
        let ts = now_rfc3339();
        let path = self.path.clone();
        let err = |source| SessionError::Sqlite { path: path.clone(), source };
        let tx = self.conn.transaction().map_err(err)?;
        let mut heads: HashMap<&str, (u64, String)> = HashMap::new();
        let mut seqs = Vec::with_capacity(batch.len());
        {
            let mut head_query = tx
                .prepare_cached(
                    "SELECT seq, hash FROM events WHERE execution_id = ?1 ORDER BY seq DESC LIMIT 1",
                )
                .map_err(err)?;
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO events (execution_id, seq, ts, kind, version, payload, prev_hash, hash)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(err)?;
            for event in batch {
                let id = event.execution_id.as_str();
                let (last_seq, prev_hash) = match heads.get(id) {
                    Some(head) => head.clone(),
                    None => head_query
                        .query_row([id], |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)))
                        .optional()
                        .map_err(err)?
                        .map(|(seq, hash)| (u64::try_from(seq).unwrap_or(0), hash))
                        .unwrap_or_else(|| (0, GENESIS_HASH.to_owned())),
                };
                let seq = last_seq + 1;
                let hash = event_hash(&prev_hash, id, seq, &ts, event.kind, event.version, &event.payload);
                insert
                    .execute(params![
                        id,
                        i64::try_from(seq).unwrap_or(i64::MAX),
                        ts,
                        event.kind,
                        event.version,
                        event.payload,
                        prev_hash,
                        hash
                    ])
                    .map_err(err)?;
                heads.insert(id, (seq, hash));
                seqs.push(seq);
            }
        }
        tx.commit().map_err(err)?;
        Ok(seqs)
    }

    /// Every event of `execution`, in sequence order.
    pub fn events(&self, execution: &ExecutionId) -> Result<Vec<StoredEvent>, SessionError> {
        let events = self.events_raw(&execution.to_string())?;
        if events.is_empty() {
            return Err(SessionError::UnknownExecution(execution.to_string()));
        }
        Ok(events)
    }

    fn events_raw(&self, execution: &str) -> Result<Vec<StoredEvent>, SessionError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash
                 FROM events WHERE execution_id = ?1 ORDER BY seq",
            )
            .map_err(|e| self.sql_err(e))?;
        let rows = stmt
            .query_map([execution], |row| {
                Ok(StoredEvent {
                    execution_id: row.get(0)?,
                    seq: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                    ts: row.get(2)?,
                    kind: row.get(3)?,
                    version: row.get(4)?,
                    payload: row.get(5)?,
                    prev_hash: row.get(6)?,
                    hash: row.get(7)?,
                })
            })
            .map_err(|e| self.sql_err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.sql_err(e))
    }

    /// Recomputes `execution`'s hash chain. `Ok(Err(..))` names the first bad sequence.
    pub fn verify(&self, execution: &ExecutionId) -> Result<Result<u64, ChainError>, SessionError> {
        Ok(verify_chain(&self.events(execution)?))
    }

    /// All executions, newest first.
    pub fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.execution_id, s.ts, json_extract(s.payload, '$.task'),
                    (SELECT json_extract(f.payload, '$.termination_reason') FROM events f
                      WHERE f.execution_id = s.execution_id AND f.kind = 'finish'
                      ORDER BY f.seq DESC LIMIT 1),
                    (SELECT MAX(e.seq) FROM events e WHERE e.execution_id = s.execution_id)
                 FROM events s WHERE s.seq = 1
                 ORDER BY s.ts DESC, s.execution_id DESC",
            )
            .map_err(|e| self.sql_err(e))?;
        let rows = stmt
            .query_map([], |row| {
                Ok(ExecutionSummary {
                    execution_id: row.get(0)?,
                    started_at: row.get(1)?,
                    task: row.get(2)?,
                    termination_reason: row.get(3)?,
                    events: u64::try_from(row.get::<_, i64>(4)?).unwrap_or(0),
                })
            })
            .map_err(|e| self.sql_err(e))?;
        rows.collect::<Result<Vec<_>, _>>().map_err(|e| self.sql_err(e))
    }
}

/// Checks sequence contiguity, `prev_hash` links and every recomputed hash.
pub(crate) fn verify_chain(events: &[StoredEvent]) -> Result<u64, ChainError> {
    let mut prev = GENESIS_HASH;
    for (index, event) in events.iter().enumerate() {
        let expected_seq = index as u64 + 1;
        if event.seq != expected_seq {
            return Err(ChainError {
                seq: expected_seq,
                reason: format!("sequence {expected_seq} is missing (found {})", event.seq),
            });
        }
        if event.prev_hash != prev {
            return Err(ChainError { seq: event.seq, reason: "previous-hash link does not match".into() });
        }
        let recomputed = event_hash(
            prev,
            &event.execution_id,
            event.seq,
            &event.ts,
            &event.kind,
            event.version,
            &event.payload,
        );
        if recomputed != event.hash {
            return Err(ChainError { seq: event.seq, reason: "content does not match its hash".into() });
        }
        prev = &event.hash;
    }
    Ok(events.len() as u64)
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}
