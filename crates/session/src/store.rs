//! The SQLite store: opening and migrating the database, committing writes (events, a
//! checkpoint's snapshot in its event's row, archive rows, the executions index) in one
//! transaction, and reading an execution back, verifying its chain, listing executions.
//!
//! Reads never see a torn write: every read method runs one statement, or one read
//! transaction when it needs several, so it sees one committed snapshot of the WAL.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;

use nerve_core::event::Compaction;
use nerve_core::{BlockId, Event, ExecutionId, Message, Redactor};
use rusqlite::types::Type;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, TransactionBehavior, params};
use serde::Serialize;

use crate::SessionError;
use crate::archive::{ArchiveBlock, ArchiveHit, NewBlock, fts_query};
use crate::chain::{
    ChainCheck, ChainError, Fields, GENESIS_HASH, StoredEvent, content_matches, event_hash,
    verify_events,
};
use crate::encode::{
    IndexUpdate, RowWrite, Write, Written, encode_blocks, encode_checkpoint, encode_event,
    sha256_hex,
};
use crate::replay::{Replay, replay};
use crate::schema::{
    SCHEMA_VERSION, V2, V3, V4, derived_executions, execution_columns, migrate, user_version,
    with_last_event, with_last_keyed_event,
};
use crate::transfer::{ExecutionLog, LoggedEvent};
use crate::wal::{WalFlush, WalRoom};

mod decode;

use decode::{Decoder, Hashing};

/// Chain heads cached by a writing connection beyond this many are forgotten (they are
/// re-read from the log on the next append), so a long-lived process stays small.
const MAX_CACHED_HEADS: usize = 4096;
/// The most events an execution's index row on disk may lag behind its log by turns alone.
/// Readers add those turns from the events, so the row is not rewritten in every turn's
/// commit (one page in four or five); a run of eight events a turn rewrites it every
/// eighth turn.
const ROW_LAG: u64 = 64;
/// The writing connection's page cache, in KiB (negative: SQLite's unit for KiB).
const WRITER_CACHE_KIB: i64 = -16_384;

/// One row of the executions index: a line of `nerve list`, the header of `nerve show`.
/// Maintained by the writer in the same transaction as the events it summarises, so it
/// never disagrees with a committed log; the events themselves are never touched.
/// `updated_at` and `events` come from the execution's last event when read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExecutionSummary {
    pub execution_id: String,
    pub started_at: String,
    /// When the last event was written.
    pub updated_at: String,
    pub task: Option<String>,
    /// The directory the execution works on, as its `started` event names it (derived from
    /// that event when read: no column holds it); for a submission not started yet, its
    /// path or `--git` URL.
    pub workspace: Option<String>,
    /// A child execution's parent (a `delegate` call's) and that call's id, from its
    /// `started` event; absent for an execution of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    pub loop_type: Option<String>,
    pub model: Option<String>,
    pub task_status: Option<String>,
    /// `None` while running, or when the run crashed before finishing (or was resumed).
    pub termination_reason: Option<String>,
    pub error: Option<String>,
    pub total_turns: u32,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_micro_usd: u64,
    pub resumes: u32,
    /// The number of events (the last sequence number).
    pub events: u64,
    /// For an execution the task queue holds that has no events yet (submitted, and not
    /// started by a worker): its state there, `queued`, `claimed`, `cancelled` or `failed`.
    /// Absent for every execution with events (and so always in a SQLite log, which has no
    /// queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_state: Option<String>,
}

impl ExecutionSummary {
    /// Whether the execution can never run again: it completed (a completed execution is
    /// never resumed), or it was cancelled in the queue before it started. Its sandbox home
    /// is of no more use (`nerve reap` removes it).
    pub fn ended_for_good(&self) -> bool {
        self.termination_reason.as_deref() == Some("completed")
            || self.queue_state.as_deref() == Some("cancelled")
    }

    pub(crate) fn new(execution_id: &str, ts: &str) -> Self {
        Self {
            execution_id: execution_id.to_owned(),
            started_at: ts.to_owned(),
            updated_at: ts.to_owned(),
            task: None,
            workspace: None,
            parent: None,
            call_id: None,
            loop_type: None,
            model: None,
            task_status: None,
            termination_reason: None,
            error: None,
            total_turns: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_micro_usd: 0,
            resumes: 0,
            events: 0,
            queue_state: None,
        }
    }

    pub(crate) fn apply(&mut self, update: &IndexUpdate) {
        match update {
            IndexUpdate::Nothing => {}
            IndexUpdate::Started {
                task,
                loop_type,
                model,
            } => {
                if self.task.is_none() {
                    self.task = Some(task.clone());
                    self.loop_type = Some((*loop_type).to_owned());
                    self.model = Some(model.clone());
                }
            }
            IndexUpdate::Turn { turn, usage, cost } => {
                self.total_turns = self.total_turns.max(*turn);
                self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens);
                self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
                self.cost_micro_usd = self.cost_micro_usd.saturating_add(cost.0);
            }
            IndexUpdate::Status(status) => {
                // After a finish, a transition is a person's follow-up (`nerve chat`, `run
                // --continue`): a new attempt whose ending is not known yet, as replay says
                // (replay.rs, `reopen_after_finish`). At the end of an attempt the
                // transition comes before its finish.
                if self.termination_reason.is_some() {
                    self.termination_reason = None;
                    self.error = None;
                }
                self.task_status = Some((*status).to_owned());
            }
            IndexUpdate::Finish {
                reason,
                status,
                turns,
                usage,
                cost,
                error,
            } => {
                // The finish event's totals are authoritative: they include summariser and
                // retry spend that no turn carries.
                self.termination_reason = Some((*reason).to_owned());
                self.task_status = Some((*status).to_owned());
                self.total_turns = self.total_turns.max(*turns);
                self.input_tokens = usage.input_tokens;
                self.output_tokens = usage.output_tokens;
                self.cost_micro_usd = cost.0;
                self.error.clone_from(error);
            }
            IndexUpdate::Resumed => {
                self.resumes = self.resumes.saturating_add(1);
                self.termination_reason = None;
                self.error = None;
            }
        }
    }
}

/// The latest checkpoint of an execution: a snapshot of the agent context, taken right
/// after the event with sequence number `seq` (its `checkpoint` event).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoredCheckpoint {
    pub seq: u64,
    pub turn: u32,
    pub ts: String,
    pub snapshot: serde_json::Value,
}

/// What `resume` starts from, read in one snapshot of the log: the latest checkpoint, the
/// events after it, and the replay of the whole execution (in-doubt calls, resume attempts).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResumePoint {
    pub checkpoint: Option<StoredCheckpoint>,
    /// Events after the checkpoint (all events when there is none).
    pub later: Vec<StoredEvent>,
    pub replay: Replay,
}

/// What a writing connection remembers about an execution between transactions.
#[derive(Debug, Clone)]
struct Head {
    /// The execution's key in `execution_keys`, which the events' primary key is made of.
    key: i64,
    seq: u64,
    hash: String,
    /// The index row as of `seq`.
    row: ExecutionSummary,
    /// The last event the row on disk summarises.
    as_of: u64,
    /// The row changed in a way that must be written with this transaction.
    dirty: bool,
    /// The row holds turns that the row on disk does not (readers add them from the log).
    behind: bool,
}

/// A connection to the event log. Readers and the writer each hold their own; WAL mode lets
/// readers in other processes proceed while the writer commits.
#[derive(Debug)]
pub struct Store {
    pub(crate) conn: Connection,
    path: String,
    /// The database's schema version: a read-only store may look at an older database.
    schema: i64,
    /// Chain heads and index rows of the executions this connection appended to. Valid as
    /// long as no other process appends to the same execution; if one does, the insert hits
    /// the primary key, the transaction rolls back and the entry is dropped.
    heads: HashMap<String, Head>,
    /// Zeroed space kept ahead of the WAL's frames (writing connections only).
    wal: WalRoom,
}

const INSERT_EVENT: &str = "INSERT INTO events
     (execution_id, seq, ts, kind, version, payload, prev_hash, hash, execution, snapshot)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
/// An execution's events after a sequence number, in order, through its key.
const SELECT_EVENTS: &str =
    "SELECT e.execution_id, e.seq, e.ts, e.kind, e.version, e.payload, e.prev_hash, e.hash
     FROM execution_keys k JOIN events e ON e.execution = k.key
     WHERE k.execution_id = ?1 AND e.seq > ?2 ORDER BY e.seq";
/// [`SELECT_EVENTS`] for logs written before version 4, keyed by the execution id itself.
const SELECT_EVENTS_BY_ID: &str =
    "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash
     FROM events WHERE execution_id = ?1 AND seq > ?2 ORDER BY seq";

impl Store {
    /// Opens (creating and migrating if needed) the log at `path`. The parent directory
    /// is created when missing.
    pub fn open(path: &Path) -> Result<Self, SessionError> {
        let shown = path.display().to_string();
        let err = |source| SessionError::Sqlite {
            path: shown.clone(),
            source,
        };
        if let Some(parent) = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty() && !p.exists())
        {
            std::fs::create_dir_all(parent).map_err(|e| {
                err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                    Some(format!("cannot create directory {}: {e}", parent.display())),
                ))
            })?;
        }
        let mut conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        // FULL: an append is durable when its commit returns, power loss included.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        // Many executions appending at once touch index pages all over the tree; with the
        // default 2 MiB cache the writer re-reads them from the OS in every transaction.
        conn.pragma_update(None, "cache_size", WRITER_CACHE_KIB)
            .map_err(err)?;
        let found = migrate(&mut conn).map_err(err)?;
        if found > SCHEMA_VERSION {
            return Err(SessionError::SchemaTooNew {
                path: shown,
                found,
                supported: SCHEMA_VERSION,
            });
        }
        let wal = WalRoom::new(conn.path().unwrap_or(&shown));
        Ok(Self {
            conn,
            path: shown,
            schema: SCHEMA_VERSION,
            heads: HashMap::new(),
            wal,
        })
    }

    /// Opens an existing log for reading only; never creates or migrates anything. A log
    /// written by an older Nerve is read as it is (no checkpoints, no archive, the
    /// executions index derived from the events).
    ///
    /// A log its reader cannot write (an audit copy, `chmod 444`, another user's) is read
    /// too: SQLite needs to create the WAL's shared-memory file to read a WAL database, and
    /// when it cannot (SQLITE_READONLY, SQLITE_CANTOPEN) the log is opened again as
    /// immutable, which reads the file as it is, with no locks and no WAL. Nobody who can
    /// write it is writing it then: a writer would have left the WAL files to read through.
    pub fn open_read_only(path: &Path) -> Result<Self, SessionError> {
        let shown = path.display().to_string();
        let err = |source| SessionError::Sqlite {
            path: shown.clone(),
            source,
        };
        let open = |path: &Path, flags: OpenFlags| -> rusqlite::Result<(Connection, i64)> {
            let conn = Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
            conn.busy_timeout(std::time::Duration::from_secs(10))?;
            let schema = user_version(&conn)?;
            Ok((conn, schema))
        };
        let (conn, schema) = match open(path, OpenFlags::SQLITE_OPEN_READ_ONLY) {
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if matches!(
                    failure.code,
                    rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen
                ) && path.exists() =>
            {
                open(
                    Path::new(&immutable_uri(path)),
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
                )
                .map_err(err)?
            }
            other => other.map_err(err)?,
        };
        let wal = WalRoom::new(&shown);
        Ok(Self {
            conn,
            path: shown,
            schema,
            heads: HashMap::new(),
            wal,
        })
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub(crate) fn sql_err(&self, source: rusqlite::Error) -> SessionError {
        SessionError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    // ---- writes -------------------------------------------------------------------------

    /// Appends `events` to `execution` in one transaction, redacted by `redactor`, and
    /// returns their sequence numbers. Durable when it returns. For a process with several
    /// executions, [`crate::SqliteSink`] does the same through one group-committing writer.
    pub fn append(
        &mut self,
        execution: &ExecutionId,
        events: &[Event],
        redactor: &Redactor,
    ) -> Result<Vec<u64>, SessionError> {
        let encoded = events
            .iter()
            .map(|e| encode_event(e, redactor))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self
            .apply_one(&Write::events(execution.to_string(), encoded))?
            .seqs)
    }

    /// Saves a checkpoint of `snapshot` (the agent context after `turn`) with its
    /// `checkpoint` event, atomically, and returns the event's sequence number: the
    /// checkpoint's id.
    pub fn write_checkpoint(
        &mut self,
        execution: &ExecutionId,
        turn: u32,
        snapshot: &serde_json::Value,
        redactor: &Redactor,
    ) -> Result<u64, SessionError> {
        let write = encode_checkpoint(execution.to_string(), turn, snapshot, redactor)?;
        Ok(self.apply_one(&write)?.head)
    }

    /// Archives `blocks` on their own; returns their `created_seq` (the execution's last
    /// sequence number). Prefer [`Store::compact`], which records why they were archived.
    pub fn put_blocks(
        &mut self,
        execution: &ExecutionId,
        blocks: &[NewBlock],
        redactor: &Redactor,
    ) -> Result<u64, SessionError> {
        let write = encode_blocks(execution.to_string(), blocks, None, redactor)?;
        Ok(self.apply_one(&write)?.head)
    }

    /// Archives `blocks` and appends the `compaction` event that took them out of the
    /// conversation, atomically; returns the event's sequence number (the blocks'
    /// `created_seq`).
    pub fn compact(
        &mut self,
        execution: &ExecutionId,
        blocks: &[NewBlock],
        compaction: Compaction,
        redactor: &Redactor,
    ) -> Result<u64, SessionError> {
        let event = Event::Compaction(compaction);
        let write = encode_blocks(execution.to_string(), blocks, Some(&event), redactor)?;
        Ok(self.apply_one(&write)?.head)
    }

    /// Commits one write, trying a second time when the first fails: a failed transaction
    /// wrote nothing and dropped the cached heads it used, so a head made stale by another
    /// process is re-read. Failures that are not about stale heads fail twice.
    pub(crate) fn apply_one(&mut self, write: &Write) -> Result<Written, SessionError> {
        let mut written = match self.apply(&[write]) {
            Ok(written) => written,
            Err(error) => {
                tracing::debug!(%error, "event log write failed; retrying once with fresh heads");
                self.apply(&[write])?
            }
        };
        written
            .pop()
            .ok_or_else(|| SessionError::Write("the store returned no result".into()))
    }

    /// Commits `writes` in one transaction and returns what each produced. On error nothing
    /// was written, and the cached heads of the executions involved are dropped.
    pub(crate) fn apply(&mut self, writes: &[&Write]) -> Result<Vec<Written>, SessionError> {
        self.commit(writes)
    }

    fn commit(&mut self, writes: &[&Write]) -> Result<Vec<Written>, SessionError> {
        let ts = now_rfc3339();
        let Self {
            conn,
            path,
            heads,
            wal,
            ..
        } = self;
        let err = |source| SessionError::Sqlite {
            path: path.clone(),
            source,
        };
        // Immediate: take the write lock before reading the heads, so another process's
        // commit cannot slip in between (a deferred transaction would fail with BUSY then).
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        // Under the write lock, as the room must be made.
        if let Err(error) = wal.ensure() {
            tracing::debug!(%error, "cannot make room in the event log's WAL; commits grow it");
        }
        let mut touched: HashMap<&str, Head> = HashMap::new();
        let mut out = Vec::with_capacity(writes.len());
        {
            let mut insert_event = tx.prepare_cached(INSERT_EVENT).map_err(err)?;
            for write in writes {
                let id = write.execution_id.as_str();
                let head = match touched.entry(id) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        // Taken out of the cache: it goes back only if the commit succeeds.
                        let head = match heads.remove(id) {
                            Some(head) => head,
                            None => load_head(&tx, id, &ts).map_err(err)?,
                        };
                        entry.insert(head)
                    }
                };
                let mut seqs = Vec::with_capacity(write.events.len());
                let last = write.events.len().saturating_sub(1);
                for (i, event) in write.events.iter().enumerate() {
                    // The index row is written with the first event and the few kinds it
                    // summarises, and a turn's totals every `ROW_LAG` events at most; the
                    // last event's time and number are read from the log.
                    match event.index.row_write() {
                        RowWrite::Never => {}
                        RowWrite::Soon => head.behind = true,
                        RowWrite::Now => head.dirty = true,
                    }
                    head.dirty |= head.seq == 0;
                    let seq = head.seq + 1;
                    let hash = event_hash(
                        &head.hash,
                        id,
                        seq,
                        &ts,
                        event.kind,
                        event.version,
                        &event.payload,
                    );
                    // A checkpoint's snapshot goes in its event's row: the write's last.
                    let snapshot = write.snapshot.as_deref().filter(|_| i == last);
                    insert_event
                        .execute(params![
                            id,
                            to_i64(seq),
                            ts,
                            event.kind,
                            event.version,
                            event.payload,
                            head.hash,
                            hash,
                            head.key,
                            snapshot
                        ])
                        .map_err(err)?;
                    head.seq = seq;
                    head.hash = hash;
                    head.row.apply(&event.index);
                    seqs.push(seq);
                }
                for block in &write.blocks {
                    tx.prepare_cached(
                        "INSERT INTO archive_blocks (block_id, execution_id, created_seq, ts, messages, note, text)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            block.block_id,
                            id,
                            to_i64(head.seq),
                            ts,
                            block.messages,
                            block.note,
                            block.text
                        ])
                    })
                    .map_err(err)?;
                }
                out.push(Written {
                    seqs,
                    head: head.seq,
                });
            }
            let mut upsert = tx
                .prepare_cached(concat!(
                    "INSERT INTO executions (",
                    execution_columns!(),
                    ", as_of) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
                     ON CONFLICT (execution_id) DO UPDATE SET as_of = excluded.as_of,
                       task = excluded.task, loop_type = excluded.loop_type, model = excluded.model,
                       task_status = excluded.task_status, termination_reason = excluded.termination_reason,
                       error = excluded.error, total_turns = excluded.total_turns,
                       input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
                       cost_micro_usd = excluded.cost_micro_usd, resumes = excluded.resumes"
                ))
                .map_err(err)?;
            let due = |head: &Head| {
                head.dirty || (head.behind && head.seq >= head.as_of.saturating_add(ROW_LAG))
            };
            for head in touched.values_mut().filter(|head| due(head)) {
                let row = &head.row;
                upsert
                    .execute(params![
                        row.execution_id,
                        row.started_at,
                        row.task,
                        row.loop_type,
                        row.model,
                        row.task_status,
                        row.termination_reason,
                        row.error,
                        row.total_turns,
                        to_i64(row.input_tokens),
                        to_i64(row.output_tokens),
                        to_i64(row.cost_micro_usd),
                        row.resumes,
                        to_i64(head.seq)
                    ])
                    .map_err(err)?;
                (head.as_of, head.dirty, head.behind) = (head.seq, false, false);
            }
        }
        tx.commit().map_err(err)?;
        if heads.len() + touched.len() > MAX_CACHED_HEADS {
            heads.clear();
        }
        for (id, head) in touched {
            // A finished execution rarely gets another event (only when resumed).
            if head.row.termination_reason.is_none() {
                heads.insert(id.to_owned(), head);
            }
        }
        Ok(out)
    }

    /// Stops this connection from checkpointing the WAL at the end of its commits: the
    /// sink's writer leaves that to a checkpointer thread, off the append path.
    pub(crate) fn disable_auto_checkpoint(&self) -> Result<(), SessionError> {
        self.conn
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(|e| self.sql_err(e))
    }

    /// Leaves the WAL's flush to the caller, who must not report a write committed before
    /// a [`WalFlush::flush`] that began after the commit has returned. Commits then write
    /// their frames and return; a thread of the caller's can flush one batch while this
    /// connection commits the next. A crash of the process loses nothing written (the
    /// frames are in the kernel's cache); a power loss loses at most what was never
    /// reported durable, and SQLite's WAL stays consistent with `synchronous=NORMAL`
    /// (recovery stops at the first frame whose checksum fails). `None`, and nothing
    /// changed, when the log is not in WAL mode.
    pub(crate) fn defer_flush(&self) -> Result<Option<WalFlush>, SessionError> {
        let err = |e| self.sql_err(e);
        let mode: String = self
            .conn
            .query_row("PRAGMA journal_mode", [], |row| row.get(0))
            .map_err(err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Ok(None);
        }
        self.conn
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(err)?;
        Ok(Some(WalFlush::new(self.conn.path().unwrap_or(&self.path))))
    }

    /// Copies what it can of the WAL into the database without waiting for readers or the
    /// writer (a passive checkpoint); the writer starts the WAL over once all is copied.
    pub(crate) fn checkpoint(&self) -> Result<(), SessionError> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(|e| self.sql_err(e))
    }

    // ---- reads --------------------------------------------------------------------------

    /// Every event of `execution`, in sequence order.
    pub fn events(&self, execution: &ExecutionId) -> Result<Vec<StoredEvent>, SessionError> {
        let events = self.events_after(execution, 0)?;
        if events.is_empty() {
            return Err(SessionError::UnknownExecution(execution.to_string()));
        }
        Ok(events)
    }

    /// Every event of `execution`, in order, once their hash chain verifies:
    /// [`SessionError::BrokenChain`] names the first bad sequence otherwise. What anything
    /// that continues an execution (`resume`, `chat ID`, `run --continue`) reads, so that a
    /// tampered log never reaches the model.
    pub fn verified_events(
        &self,
        execution: &ExecutionId,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        let events = self.events(execution)?;
        verify_events(&events).map_err(SessionError::BrokenChain)?;
        Ok(events)
    }

    /// The events of `execution` with a sequence number above `after`, in order.
    pub fn events_after(
        &self,
        execution: &ExecutionId,
        after: u64,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        read_events(
            &self.conn,
            self.select_events(),
            &execution.to_string(),
            after,
        )
        .map_err(|e| self.sql_err(e))
    }

    /// Replays `execution` straight from the database rows: the same result as
    /// [`crate::replay`] over [`Store::events`], in less time. This thread reads the rows
    /// and checks the chain's sequence and links on SQLite's own buffers; a second thread
    /// decodes and rebuilds the execution from copies of the payloads, in batches. The
    /// content hashes are split between the two: this thread recomputes those of even
    /// batches, the decoding thread those of odd ones (from copies of their fields), and the
    /// earliest mismatch either finds is the break reported.
    pub fn replay(&self, execution: &ExecutionId) -> Result<Replay, SessionError> {
        let id = execution.to_string();
        let mut stmt = self
            .conn
            .prepare_cached(self.select_events())
            .map_err(|e| self.sql_err(e))?;
        let mut rows = stmt.query(params![id, 0]).map_err(|e| self.sql_err(e))?;
        let mut chain = ChainCheck::default();
        let replayer = std::thread::scope(|scope| {
            let mut decoder = Decoder::start(scope, &id);
            // The first event, by sequence number, whose content this thread found not to
            // match its hash.
            let mut content_break = None;
            let mut read = || -> Result<(), SessionError> {
                while let Some(row) = rows.next().map_err(|e| self.sql_err(e))? {
                    let fields = fields(row).map_err(|e| self.sql_err(e))?;
                    let in_chain = chain.push_link(&fields);
                    // Every other batch's hashes are checked on the decoding thread, so
                    // that the two threads share the hashing.
                    if decoder.push(&fields, in_chain) == Hashing::Here
                        && in_chain
                        && content_break.is_none()
                        && !content_matches(&fields)
                    {
                        content_break = Some(fields.seq);
                    }
                }
                Ok(())
            };
            let outcome = read();
            let (replayer, theirs) = decoder.finish();
            if let Some(seq) = content_break.into_iter().chain(theirs).min() {
                chain.content_break(seq);
            }
            outcome.map(|()| replayer)
        })?;
        if replayer.is_empty() {
            return Err(SessionError::UnknownExecution(id));
        }
        Ok(replayer.finish(&chain))
    }

    /// Recomputes `execution`'s hash chain. `Ok(Err(..))` names the first bad sequence.
    pub fn verify(&self, execution: &ExecutionId) -> Result<Result<u64, ChainError>, SessionError> {
        let id = execution.to_string();
        let mut check = ChainCheck::default();
        let mut stmt = self
            .conn
            .prepare_cached(self.select_events())
            .map_err(|e| self.sql_err(e))?;
        let mut rows = stmt.query(params![id, 0]).map_err(|e| self.sql_err(e))?;
        let mut any = false;
        while let Some(row) = rows.next().map_err(|e| self.sql_err(e))? {
            check.push(&fields(row).map_err(|e| self.sql_err(e))?);
            any = true;
        }
        if !any {
            return Err(SessionError::UnknownExecution(id));
        }
        Ok(check.finish().map_err(|(error, _)| error))
    }

    /// The query of an execution's events for this database's version.
    fn select_events(&self) -> &'static str {
        if self.schema >= V4 {
            SELECT_EVENTS
        } else {
            SELECT_EVENTS_BY_ID
        }
    }

    /// All executions, newest first, from the executions index.
    pub fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError> {
        let sql = if self.schema >= V4 {
            concat!(
                with_last_keyed_event!(),
                " ORDER BY x.started_at DESC, x.execution_id DESC"
            )
        } else if self.schema >= V2 {
            concat!(
                with_last_event!("executions"),
                " ORDER BY x.started_at DESC, x.execution_id DESC"
            )
        } else {
            concat!(
                with_last_event!(concat!("(", derived_executions!(), ")")),
                " ORDER BY x.started_at DESC, x.execution_id DESC"
            )
        };
        let mut stmt = self.conn.prepare(sql).map_err(|e| self.sql_err(e))?;
        let rows = stmt
            .query_map([], listed_summary)
            .map_err(|e| self.sql_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.sql_err(e))
    }

    /// The executions whose id starts with `prefix`, in id order, at most `limit`: how an
    /// abbreviated id (`nerve show 0192f0c4`) becomes a whole one, as in git. The match
    /// ignores case; a prefix with anything but hex digits and `-` matches nothing.
    pub fn executions_with_prefix(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<ExecutionId>, SessionError> {
        let Some(prefix) = id_prefix(prefix) else {
            return Ok(Vec::new());
        };
        let sql = if self.schema >= V4 {
            "SELECT execution_id FROM execution_keys \
             WHERE execution_id >= ?1 AND execution_id < ?2 ORDER BY execution_id LIMIT ?3"
        } else if self.schema >= V2 {
            "SELECT execution_id FROM executions \
             WHERE execution_id >= ?1 AND execution_id < ?2 ORDER BY execution_id LIMIT ?3"
        } else {
            "SELECT DISTINCT execution_id FROM events \
             WHERE execution_id >= ?1 AND execution_id < ?2 ORDER BY execution_id LIMIT ?3"
        };
        // `~` sorts after every hex digit and `-`: the range holds exactly the prefix's ids.
        let upper = format!("{prefix}~");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.sql_err(e))?;
        let ids = stmt
            .query_map(params![prefix, upper, limit], |row| row.get::<_, String>(0))
            .map_err(|e| self.sql_err(e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.sql_err(e))?;
        ids.iter()
            .map(|id| {
                id.parse().map_err(|_| {
                    SessionError::Corrupt(format!("execution id `{id}` is not a UUID"))
                })
            })
            .collect()
    }

    /// One execution's line of the index.
    pub fn execution(&self, execution: &ExecutionId) -> Result<ExecutionSummary, SessionError> {
        let sql = if self.schema >= V4 {
            concat!(with_last_keyed_event!(), " WHERE x.execution_id = ?1")
        } else if self.schema >= V2 {
            concat!(with_last_event!("executions"), " WHERE x.execution_id = ?1")
        } else {
            concat!(
                with_last_event!(concat!("(", derived_executions!(), ")")),
                " WHERE x.execution_id = ?1"
            )
        };
        let id = execution.to_string();
        self.conn
            .query_row(sql, [&id], listed_summary)
            .optional()
            .map_err(|e| self.sql_err(e))?
            .ok_or(SessionError::UnknownExecution(id))
    }

    /// The latest checkpoint of `execution`, checked against the hash its `checkpoint` event
    /// recorded in the chain. `None` when it has none.
    pub fn latest_checkpoint(
        &self,
        execution: &ExecutionId,
    ) -> Result<Option<StoredCheckpoint>, SessionError> {
        if self.schema < V2 {
            return Ok(None);
        }
        let id = execution.to_string();
        let sql = if self.schema >= V4 {
            // Walks the execution's keys back from its last event: a turn or so.
            "SELECT e.seq, e.ts, e.snapshot, NULL, e.kind, e.payload
             FROM execution_keys k JOIN events e ON e.execution = k.key
             WHERE k.execution_id = ?1 AND e.snapshot IS NOT NULL ORDER BY e.seq DESC LIMIT 1"
        } else {
            // Older logs keep snapshots in a table of their own, their SHA-256 beside them.
            "SELECT c.seq, c.ts, c.snapshot, c.sha256, e.kind, e.payload
             FROM checkpoints c LEFT JOIN events e ON e.execution_id = c.execution_id AND e.seq = c.seq
             WHERE c.execution_id = ?1 ORDER BY c.seq DESC LIMIT 1"
        };
        let row = self
            .conn
            .query_row(sql, [&id], |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, Option<String>>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            })
            .optional()
            .map_err(|e| self.sql_err(e))?;
        let Some((seq, ts, snapshot, beside, kind, payload)) = row else {
            return Ok(None);
        };
        let seq = to_u64(seq);
        let corrupt =
            |why: &str| SessionError::Corrupt(format!("checkpoint {seq} of execution {id}: {why}"));
        let recorded = match (
            kind.as_deref(),
            payload.and_then(|p| serde_json::from_str::<Event>(&p).ok()),
        ) {
            (Some("checkpoint"), Some(Event::Checkpoint(event))) => event,
            _ => return Err(corrupt("its checkpoint event is missing")),
        };
        let sha256 = sha256_hex(&snapshot);
        if sha256 != recorded.snapshot_sha256 || beside.is_some_and(|beside| beside != sha256) {
            return Err(corrupt(
                "the snapshot does not match the hash its checkpoint event recorded",
            ));
        }
        let snapshot = serde_json::from_str(&snapshot)
            .map_err(|e| corrupt(&format!("snapshot is not JSON: {e}")))?;
        Ok(Some(StoredCheckpoint {
            seq,
            turn: recorded.turn,
            ts,
            snapshot,
        }))
    }

    /// The latest checkpoint, the events after it and the replay of the whole execution,
    /// all read from one snapshot of the log.
    pub fn resume_point(&self, execution: &ExecutionId) -> Result<ResumePoint, SessionError> {
        // A read transaction: a writer committing between the statements cannot make the
        // checkpoint and the events disagree.
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(|e| self.sql_err(e))?;
        let events = self.events(execution)?;
        let checkpoint = self.latest_checkpoint(execution)?;
        tx.finish().map_err(|e| self.sql_err(e))?;
        let after = checkpoint.as_ref().map_or(0, |c| c.seq);
        let later = events.iter().filter(|e| e.seq > after).cloned().collect();
        Ok(ResumePoint {
            replay: replay(&execution.to_string(), &events),
            checkpoint,
            later,
        })
    }

    /// One archived block of `execution` (blocks of other executions are not visible).
    pub fn archive_block(
        &self,
        execution: &ExecutionId,
        block: &BlockId,
    ) -> Result<Option<ArchiveBlock>, SessionError> {
        if self.schema < V2 {
            return Ok(None);
        }
        let sql = if self.schema >= V3 {
            "SELECT created_seq, ts, messages, note FROM archive_blocks WHERE block_id = ?1 AND execution_id = ?2"
        } else {
            "SELECT created_seq, ts, messages, '' FROM archive_blocks WHERE block_id = ?1 AND execution_id = ?2"
        };
        let row = self
            .conn
            .query_row(
                sql,
                params![block.to_string(), execution.to_string()],
                |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                    ))
                },
            )
            .optional()
            .map_err(|e| self.sql_err(e))?;
        let Some((created_seq, ts, messages, note)) = row else {
            return Ok(None);
        };
        let messages: Vec<Message> = serde_json::from_str(&messages).map_err(|e| {
            SessionError::Corrupt(format!(
                "archive block {block}: messages do not decode: {e}"
            ))
        })?;
        Ok(Some(ArchiveBlock {
            block_id: *block,
            execution_id: execution.to_string(),
            created_seq: to_u64(created_seq),
            ts,
            messages,
            note,
        }))
    }

    /// Searches `execution`'s archive for free text (see [`crate::fts_query`]: any input is
    /// safe), best matches first, at most `limit`. Original outputs and messages rank above
    /// summaries (blocks whose note starts with `summary`), which restate them shortened.
    pub fn search_archive(
        &self,
        execution: &ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<ArchiveHit>, SessionError> {
        let Some(fts) = fts_query(query) else {
            return Ok(Vec::new());
        };
        if self.schema < V2 || limit == 0 {
            return Ok(Vec::new());
        }
        let sql = if self.schema >= V3 {
            "SELECT b.block_id, b.created_seq, snippet(archive_fts, 0, '', '', '…', 24), b.note
             FROM archive_fts JOIN archive_blocks b ON b.id = archive_fts.rowid
             WHERE archive_fts MATCH ?1 AND b.execution_id = ?2
             ORDER BY b.note LIKE 'summary%', rank LIMIT ?3"
        } else {
            "SELECT b.block_id, b.created_seq, snippet(archive_fts, 0, '', '', '…', 24), ''
             FROM archive_fts JOIN archive_blocks b ON b.id = archive_fts.rowid
             WHERE archive_fts MATCH ?1 AND b.execution_id = ?2
             ORDER BY rank LIMIT ?3"
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.sql_err(e))?;
        let rows = stmt
            .query_map(
                params![fts, execution.to_string(), to_i64(limit as u64)],
                |row| {
                    Ok((
                        row.get::<_, String>(0)?,
                        row.get::<_, i64>(1)?,
                        row.get::<_, String>(2)?,
                        row.get::<_, String>(3)?,
                    ))
                },
            )
            .map_err(|e| self.sql_err(e))?;
        let mut hits = Vec::new();
        for row in rows {
            let (block_id, created_seq, snippet, note) = row.map_err(|e| self.sql_err(e))?;
            let block_id = block_id.parse().map_err(|e| {
                SessionError::Corrupt(format!("archive block id {block_id:?}: {e}"))
            })?;
            hits.push(ArchiveHit {
                block_id,
                created_seq: to_u64(created_seq),
                note,
                snippet,
            });
        }
        Ok(hits)
    }
}

// ---- moving a log between backends ---------------------------------------------------------

impl Store {
    /// Every event of `execution` with its snapshot, and its archive blocks, read in one
    /// transaction: what `nerve export` writes.
    pub fn export(&self, execution: &ExecutionId) -> Result<ExecutionLog, SessionError> {
        let id = execution.to_string();
        let err = |e| self.sql_err(e);
        let tx = self.conn.unchecked_transaction().map_err(err)?;
        let sql = if self.schema >= V4 {
            "SELECT e.execution_id, e.seq, e.ts, e.kind, e.version, e.payload, e.prev_hash, e.hash,
                    e.snapshot
             FROM execution_keys k JOIN events e ON e.execution = k.key
             WHERE k.execution_id = ?1 ORDER BY e.seq"
        } else if self.schema >= V2 {
            "SELECT e.execution_id, e.seq, e.ts, e.kind, e.version, e.payload, e.prev_hash, e.hash,
                    c.snapshot
             FROM events e LEFT JOIN checkpoints c
               ON c.execution_id = e.execution_id AND c.seq = e.seq
             WHERE e.execution_id = ?1 ORDER BY e.seq"
        } else {
            "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash, NULL
             FROM events WHERE execution_id = ?1 ORDER BY seq"
        };
        let events = tx
            .prepare(sql)
            .and_then(|mut stmt| {
                stmt.query_map([&id], |row| {
                    Ok(LoggedEvent {
                        event: stored_event(row)?,
                        snapshot: row.get(8)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(err)?;
        if events.is_empty() {
            return Err(SessionError::UnknownExecution(id));
        }
        let mut blocks = Vec::new();
        if self.schema >= V2 {
            let sql = if self.schema >= V3 {
                "SELECT block_id FROM archive_blocks WHERE execution_id = ?1 ORDER BY id"
            } else {
                "SELECT block_id FROM archive_blocks WHERE execution_id = ?1 ORDER BY rowid"
            };
            let ids = tx
                .prepare(sql)
                .and_then(|mut stmt| {
                    stmt.query_map([&id], |row| row.get::<_, String>(0))?
                        .collect::<rusqlite::Result<Vec<_>>>()
                })
                .map_err(err)?;
            for block in ids {
                let block: BlockId = block.parse().map_err(|e| {
                    SessionError::Corrupt(format!("archive block id {block:?}: {e}"))
                })?;
                if let Some(found) = self.archive_block(execution, &block)? {
                    blocks.push(found);
                }
            }
        }
        tx.finish().map_err(err)?;
        Ok(ExecutionLog {
            execution_id: id,
            events,
            blocks,
        })
    }

    /// Loads a log checked by [`crate::parse_log`] as it is, in one transaction: its events
    /// keep their times and hashes. Refused, with nothing written, when the execution
    /// already has events here. Returns the number of events written.
    pub fn import(&mut self, log: &ExecutionLog) -> Result<u64, SessionError> {
        let id = log.execution_id.as_str();
        let (first, last) = match (log.events.first(), log.events.last()) {
            (Some(first), Some(last)) => (&first.event, &last.event),
            _ => return Err(SessionError::Corrupt("an import without events".into())),
        };
        let Self {
            conn, path, heads, ..
        } = self;
        let err = |source| SessionError::Sqlite {
            path: path.clone(),
            source,
        };
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        let head = load_head(&tx, id, &first.ts).map_err(err)?;
        if head.seq > 0 {
            return Err(SessionError::Write(format!(
                "execution {id} is already in this log; nothing was imported"
            )));
        }
        let mut row = ExecutionSummary::new(id, &first.ts);
        let plain = Redactor::new();
        {
            let mut insert = tx.prepare_cached(INSERT_EVENT).map_err(err)?;
            for logged in &log.events {
                let e = &logged.event;
                if let Ok(event) = serde_json::from_str::<Event>(&e.payload) {
                    row.apply(&crate::encode::index_update(&event, &plain));
                }
                insert
                    .execute(params![
                        id,
                        to_i64(e.seq),
                        e.ts,
                        e.kind,
                        e.version,
                        e.payload,
                        e.prev_hash,
                        e.hash,
                        head.key,
                        logged.snapshot
                    ])
                    .map_err(err)?;
            }
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO archive_blocks (block_id, execution_id, created_seq, ts, messages, note, text)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(err)?;
            for block in &log.blocks {
                let mut text = block.note.clone();
                text.push('\n');
                text.push_str(&crate::archive::searchable_text(&block.messages));
                insert
                    .execute(params![
                        block.block_id.to_string(),
                        id,
                        to_i64(block.created_seq),
                        block.ts,
                        serde_json::to_string(&block.messages)?,
                        block.note,
                        text
                    ])
                    .map_err(err)?;
            }
            tx.prepare_cached(concat!(
                "INSERT INTO executions (",
                execution_columns!(),
                ", as_of) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
            ))
            .and_then(|mut upsert| {
                upsert.execute(params![
                    row.execution_id,
                    row.started_at,
                    row.task,
                    row.loop_type,
                    row.model,
                    row.task_status,
                    row.termination_reason,
                    row.error,
                    row.total_turns,
                    to_i64(row.input_tokens),
                    to_i64(row.output_tokens),
                    to_i64(row.cost_micro_usd),
                    row.resumes,
                    to_i64(last.seq)
                ])
            })
            .map_err(err)?;
        }
        tx.commit().map_err(err)?;
        heads.remove(id);
        Ok(last.seq)
    }
}

fn read_events(
    conn: &Connection,
    sql: &str,
    execution: &str,
    after: u64,
) -> rusqlite::Result<Vec<StoredEvent>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(params![execution, to_i64(after)], stored_event)?;
    rows.collect()
}

/// An event from the first eight columns of `row` (those of [`SELECT_EVENTS`]).
pub(crate) fn stored_event(row: &Row<'_>) -> rusqlite::Result<StoredEvent> {
    Ok(StoredEvent {
        execution_id: row.get(0)?,
        seq: to_u64(row.get(1)?),
        ts: row.get(2)?,
        kind: row.get(3)?,
        version: row.get(4)?,
        payload: row.get(5)?,
        prev_hash: row.get(6)?,
        hash: row.get(7)?,
    })
}

/// A row of [`SELECT_EVENTS`], borrowed from SQLite's buffers.
fn fields<'a>(row: &'a Row<'_>) -> rusqlite::Result<Fields<'a>> {
    let text = |i: usize| -> rusqlite::Result<&'a str> {
        row.get_ref(i)?
            .as_str()
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, Type::Text, Box::new(e)))
    };
    Ok(Fields {
        execution_id: text(0)?,
        seq: to_u64(row.get(1)?),
        ts: text(2)?,
        kind: text(3)?,
        version: row.get(4)?,
        payload: text(5)?,
        prev_hash: text(6)?,
        hash: text(7)?,
    })
}

/// A row of [`with_last_event`] or [`with_last_keyed_event`]: [`summary`]'s columns, then
/// the parent and the call its `started` names (columns 16 and 17).
fn listed_summary(row: &Row<'_>) -> rusqlite::Result<ExecutionSummary> {
    Ok(ExecutionSummary {
        parent: row.get(16)?,
        call_id: row.get(17)?,
        ..summary(row)?
    })
}

/// A row of [`with_last_event`]: the index columns, then the last event's time and number.
fn summary(row: &Row<'_>) -> rusqlite::Result<ExecutionSummary> {
    Ok(ExecutionSummary {
        execution_id: row.get(0)?,
        started_at: row.get(1)?,
        task: row.get(2)?,
        loop_type: row.get(3)?,
        model: row.get(4)?,
        task_status: row.get(5)?,
        termination_reason: row.get(6)?,
        error: row.get(7)?,
        total_turns: u32::try_from(row.get::<_, i64>(8)?).unwrap_or(u32::MAX),
        input_tokens: to_u64(row.get(9)?),
        output_tokens: to_u64(row.get(10)?),
        cost_micro_usd: to_u64(row.get(11)?),
        resumes: u32::try_from(row.get::<_, i64>(12)?).unwrap_or(u32::MAX),
        updated_at: row.get(13)?,
        events: to_u64(row.get(14)?),
        workspace: row.get(15)?,
        parent: None,
        call_id: None,
        queue_state: None,
    })
}

/// The chain head, key and index row of `execution` as committed. An execution gets its
/// key in the transaction of its first event; without one it has no events, and the key is
/// made here (it goes away with the transaction if that fails). The row is brought up to
/// the head with the turns logged after its `as_of`.
fn load_head(conn: &Connection, execution: &str, ts: &str) -> rusqlite::Result<Head> {
    let row = conn
        .prepare_cached(concat!(
            "SELECT ",
            execution_columns!(),
            ", '', 0, NULL, as_of FROM executions WHERE execution_id = ?1"
        ))?
        .query_row([execution], |row| Ok((summary(row)?, to_u64(row.get(16)?))))
        .optional()?;
    let key = conn
        .prepare_cached("SELECT key FROM execution_keys WHERE execution_id = ?1")?
        .query_row([execution], |row| row.get::<_, i64>(0))
        .optional()?;
    // A missing row is written with the next commit, whatever it holds.
    let missing = row.is_none();
    let (mut row, as_of) = row.unwrap_or_else(|| (ExecutionSummary::new(execution, ts), 0));
    let mut behind = false;
    let (key, head) = match key {
        Some(key) => {
            let head = conn
                .prepare_cached(
                    "SELECT seq, hash FROM events WHERE execution = ?1 ORDER BY seq DESC LIMIT 1",
                )?
                .query_row([key], |row| {
                    Ok((to_u64(row.get(0)?), row.get::<_, String>(1)?))
                })
                .optional()?;
            let mut turns = conn.prepare_cached(
                "SELECT payload FROM events
                 WHERE execution = ?1 AND seq > ?2 AND kind = 'turn_completed' ORDER BY seq",
            )?;
            let mut turns = turns.query(params![key, to_i64(as_of)])?;
            while let Some(turn) = turns.next()? {
                // As the readers' sums do, a payload that does not decode counts for nothing.
                if let Ok(Event::TurnCompleted(turn)) =
                    serde_json::from_str(turn.get_ref(0)?.as_str()?)
                {
                    row.apply(&IndexUpdate::Turn {
                        turn: turn.turn,
                        usage: turn.usage,
                        cost: turn.cost,
                    });
                    behind = true;
                }
            }
            (key, head)
        }
        None => {
            conn.prepare_cached("INSERT INTO execution_keys (execution_id) VALUES (?1)")?
                .execute([execution])?;
            (conn.last_insert_rowid(), None)
        }
    };
    let (seq, hash) = head.unwrap_or_else(|| (0, GENESIS_HASH.to_owned()));
    Ok(Head {
        key,
        seq,
        hash,
        row,
        as_of,
        dirty: missing,
        behind,
    })
}

pub(crate) fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn to_u64(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Fixed-width UTC timestamps (microseconds, always six digits), so they sort as text.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(time::OffsetDateTime::now_utc())
}

/// `now` as [`now_rfc3339`] writes it.
pub(crate) fn rfc3339(now: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.microsecond()
    )
}

/// `prefix` lower-cased, or `None` when it is empty or cannot start an execution id.
pub(crate) fn id_prefix(prefix: &str) -> Option<String> {
    let prefix = prefix.trim().to_ascii_lowercase();
    (!prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        .then_some(prefix)
}

/// `path` as an SQLite URI that opens it read-only and immutable (docs: "URI Filenames"):
/// the characters a URI gives meaning to, and bytes beyond ASCII, are percent-encoded.
fn immutable_uri(path: &Path) -> String {
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'%' | b'?' | b'#' | 0x80.. => uri.push_str(&format!("%{byte:02X}")),
            _ => uri.push(char::from(*byte)),
        }
    }
    uri.push_str("?mode=ro&immutable=1");
    uri
}
