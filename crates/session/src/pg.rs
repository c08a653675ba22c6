//! The PostgreSQL event log: the same events, encoding, redaction and hash chain as the
//! SQLite log, in a server that many workers on many machines share.
//!
//! Writes go through one writer task per process that commits whatever is queued in one
//! transaction (group commit), as the SQLite writer does; the queue is filled when a write
//! is first polled, so a sink keeps the order in which an engine issues its commits. Each
//! transaction takes the head rows of the executions it appends to `FOR UPDATE`, in
//! execution-id order (so two processes never deadlock): sequence numbers stay gap-free and
//! the chain linear under any number of concurrent writers. `synchronous_commit` is on, so
//! a write returns once it is durable on the server. Reads go through a small pool.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use nerve_core::event::Compaction;
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, Enqueued, Event, EventSink, ExecutionId, Message,
    RecallHit, Redactor, SinkError, Snapshot,
};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{GenericClient, Row};

use crate::SessionError;
use crate::archive::{ArchiveBlock, ArchiveHit, NewBlock, searchable_text};
use crate::chain::{ChainCheck, ChainError, GENESIS_HASH, StoredEvent};
use crate::encode::{
    EncodedEvent, Write, Written, encode_batch, encode_blocks, encode_checkpoint, encode_event,
    index_update, sha256_hex,
};
use crate::event_store::EventStore;
use crate::replay::{Replay, replay};
use crate::store::{ExecutionSummary, ResumePoint, StoredCheckpoint, to_i64, to_u64};
use crate::transfer::{ExecutionLog, LoggedEvent};

pub(crate) mod tls;
mod tokens;
mod writer;

use writer::{BlockColumns, EventColumns, run_writer, update_heads};

/// The schema version this Nerve writes.
const SCHEMA_VERSION: i64 = 5;
/// The most writes committed in one transaction.
const MAX_BATCH: usize = 1024;
/// Connections for reads (the writer holds one more).
const POOL_SIZE: usize = 8;
/// The advisory lock that serialises migrations between processes opening the log at once.
const MIGRATION_LOCK: i64 = 0x6e65_7276_6531;
/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Terms of a search beyond this many are dropped, as for the SQLite archive.
const MAX_TERMS: usize = 32;
const MAX_TERM_CHARS: usize = 64;

/// Each entry migrates from version `index` to `index + 1`. Never edited once released.
const MIGRATIONS: &[&str] = &[
    // 1: the log, the executions index with each execution's chain head, the archive.
    r"
    CREATE TABLE executions (
        execution_id       TEXT PRIMARY KEY,
        started_at         TEXT NOT NULL,
        updated_at         TEXT NOT NULL,
        head_seq           BIGINT NOT NULL DEFAULT 0,
        head_hash          TEXT NOT NULL,
        task               TEXT,
        loop_type          TEXT,
        model              TEXT,
        task_status        TEXT,
        termination_reason TEXT,
        error              TEXT,
        total_turns        BIGINT NOT NULL DEFAULT 0,
        input_tokens       BIGINT NOT NULL DEFAULT 0,
        output_tokens      BIGINT NOT NULL DEFAULT 0,
        cost_micro_usd     BIGINT NOT NULL DEFAULT 0,
        resumes            BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX executions_newest ON executions (started_at DESC, execution_id DESC);
    CREATE TABLE events (
        execution_id TEXT NOT NULL,
        seq          BIGINT NOT NULL CHECK (seq >= 1),
        ts           TEXT NOT NULL,
        kind         TEXT NOT NULL,
        version      INTEGER NOT NULL,
        payload      TEXT NOT NULL,
        prev_hash    TEXT NOT NULL,
        hash         TEXT NOT NULL,
        snapshot     TEXT,
        PRIMARY KEY (execution_id, seq)
    );
    CREATE TABLE archive_blocks (
        block_id     TEXT PRIMARY KEY,
        execution_id TEXT NOT NULL,
        created_seq  BIGINT NOT NULL,
        ts           TEXT NOT NULL,
        messages     TEXT NOT NULL,
        note         TEXT NOT NULL,
        text         TEXT NOT NULL,
        search       TSVECTOR GENERATED ALWAYS AS (to_tsvector('english', text)) STORED
    );
    CREATE INDEX archive_by_execution ON archive_blocks (execution_id, created_seq);
    CREATE INDEX archive_search ON archive_blocks USING GIN (search);
    CREATE FUNCTION nerve_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'append-only: % refused on %', TG_OP, TG_TABLE_NAME;
    END $$;
    CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
        FOR EACH ROW EXECUTE FUNCTION nerve_append_only();
    CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
        FOR EACH STATEMENT EXECUTE FUNCTION nerve_append_only();
    CREATE TRIGGER archive_append_only BEFORE UPDATE OR DELETE ON archive_blocks
        FOR EACH ROW EXECUTE FUNCTION nerve_append_only();
    CREATE TRIGGER archive_no_truncate BEFORE TRUNCATE ON archive_blocks
        FOR EACH STATEMENT EXECUTE FUNCTION nerve_append_only();
    ",
    // 2: the task queue: submitted executions, claimed by workers under a lease.
    r"
    CREATE TABLE queue (
        execution_id TEXT PRIMARY KEY,
        submitted_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        spec         TEXT NOT NULL,
        state        TEXT NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'claimed', 'finished', 'cancelled')),
        worker       TEXT,
        lease_until  TIMESTAMPTZ,
        claims       INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX queue_ready ON queue (submitted_at) WHERE state IN ('queued', 'claimed');
    ",
    // 3: cancelling a running execution (its worker stops it at the next boundary), and
    // executions a worker could not start (`failed`, with the reason).
    r"
    ALTER TABLE queue ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT false;
    ALTER TABLE queue ADD COLUMN error TEXT;
    ALTER TABLE queue DROP CONSTRAINT queue_state_check;
    ALTER TABLE queue ADD CONSTRAINT queue_state_check
        CHECK (state IN ('queued', 'claimed', 'finished', 'cancelled', 'failed'));
    ",
    // 4: the API tokens of `nerve serve`, as the SQLite log keeps them (`pg/tokens.rs`):
    // only a token's SHA-256 is stored; a revoked token keeps its row and its name.
    r"
    CREATE TABLE api_tokens (
        name         TEXT PRIMARY KEY,
        hash         TEXT NOT NULL UNIQUE,
        scope        TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        last_used_at TEXT,
        revoked_at   TEXT
    );
    ",
    // 5: the log's order across executions (`log_order.rs`: the writing transaction's id
    // and a row number, filled in by the defaults, so appends are unchanged), and the
    // workers that say they are alive (`pg_fleet.rs`).
    r"
    ALTER TABLE events ADD COLUMN tx xid8 NOT NULL DEFAULT pg_current_xact_id();
    ALTER TABLE events ADD COLUMN log_id BIGINT GENERATED ALWAYS AS IDENTITY;
    CREATE INDEX events_in_log_order ON events (tx, log_id);
    CREATE TABLE workers (
        worker      TEXT PRIMARY KEY,
        host        TEXT NOT NULL,
        concurrency INTEGER NOT NULL,
        started_at  TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        last_seen   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        stopped_at  TIMESTAMPTZ
    );
    ",
];

const SUMMARY_COLUMNS: &str = "execution_id, started_at, updated_at, head_seq, task, loop_type, \
     model, task_status, termination_reason, error, total_turns, input_tokens, output_tokens, \
     cost_micro_usd, resumes, \
     (SELECT w.payload::jsonb->>'workspace' FROM events w \
       WHERE w.execution_id = executions.execution_id AND w.seq = 1 AND w.kind = 'started'), \
     (SELECT w.payload::jsonb->>'parent' FROM events w \
       WHERE w.execution_id = executions.execution_id AND w.seq = 1 AND w.kind = 'started'), \
     (SELECT w.payload::jsonb->>'call_id' FROM events w \
       WHERE w.execution_id = executions.execution_id AND w.seq = 1 AND w.kind = 'started')";
/// The summary columns of the executions the queue holds without events (submitted, not
/// started: queued, claimed a moment ago, cancelled or failed before a worker started
/// them), and their queue state: `nerve list` shows every execution the log knows, a
/// cancelled submission too. `started_at` is when it was submitted, in the log's own
/// fixed-width UTC form.
const QUEUED_SUMMARIES: &str = "SELECT q.execution_id,
         to_char(q.submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
         to_char(q.submitted_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
         0::int8, q.spec::jsonb->>'task', q.spec::jsonb->>'loop', q.spec::jsonb->>'model',
         CASE q.state WHEN 'cancelled' THEN 'cancelled' WHEN 'failed' THEN 'failed'
              ELSE 'created' END,
         NULL::text, q.error, 0::int8, 0::int8, 0::int8, 0::int8, 0::int8,
         COALESCE(q.spec::jsonb->'workspace'->>'path', q.spec::jsonb->'workspace'->'git'->>'url'),
         NULL::text, NULL::text, q.state
     FROM queue q
     WHERE NOT EXISTS (SELECT 1 FROM executions e
                       WHERE e.execution_id = q.execution_id AND e.head_seq > 0)";
const SELECT_EVENTS: &str = "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash \
     FROM events WHERE execution_id = $1 ORDER BY seq";
const INSERT_EVENTS: &str = "INSERT INTO events
     (execution_id, seq, ts, kind, version, payload, prev_hash, hash, snapshot)
     SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::int4[],
                          $6::text[], $7::text[], $8::text[], $9::text[])";
const INSERT_BLOCKS: &str = "INSERT INTO archive_blocks
     (block_id, execution_id, created_seq, ts, messages, note, text)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[],
                          $6::text[], $7::text[])";
const UPDATE_HEADS: &str = "UPDATE executions x SET
       updated_at = u.updated_at, head_seq = u.head_seq, head_hash = u.head_hash,
       task = u.task, loop_type = u.loop_type, model = u.model, task_status = u.task_status,
       termination_reason = u.termination_reason, error = u.error,
       total_turns = u.total_turns, input_tokens = u.input_tokens,
       output_tokens = u.output_tokens, cost_micro_usd = u.cost_micro_usd, resumes = u.resumes
     FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[], $6::text[],
                 $7::text[], $8::text[], $9::text[], $10::text[], $11::int8[], $12::int8[],
                 $13::int8[], $14::int8[], $15::int8[])
       AS u(execution_id, updated_at, head_seq, head_hash, task, loop_type, model, task_status,
            termination_reason, error, total_turns, input_tokens, output_tokens,
            cost_micro_usd, resumes)
     WHERE x.execution_id = u.execution_id";

/// An execution's chain head and index row, locked for one transaction.
#[derive(Debug, Clone)]
struct Head {
    seq: u64,
    hash: String,
    row: ExecutionSummary,
}

struct Job {
    write: Write,
    /// The worker whose lease this write needs (see [`PgStore::hold_lease`]).
    lease: Option<String>,
    /// Its place among every write of this process (see [`Failures`]).
    ticket: u64,
    /// Queued after a write of its execution failed, before that failure was seen.
    doomed: bool,
    reply: oneshot::Sender<Result<Written, String>>,
}

/// What keeps a failed write from leaving a hole in its execution's log. A sink that queues
/// a batch before the previous one is durable ([`EventSink::enqueue`]) may have later
/// batches of the execution queued when one fails; those must fail too (the engine stops
/// at the first failure, and a log with a batch missing in the middle would tell a run that
/// never happened).
/// So when a write of an execution fails, every write of it queued until then (by ticket)
/// and until its writer has seen the failure fails as well, without being written; writes
/// queued after that (a resume) are written again.
#[derive(Debug, Default)]
struct Failures {
    next_ticket: std::sync::atomic::AtomicU64,
    state: std::sync::Mutex<FailureState>,
}

#[derive(Debug, Default)]
struct FailureState {
    /// Execution → the last ticket handed out when one of its writes failed.
    failed_up_to: std::collections::HashMap<String, u64>,
    /// Executions whose last failure no caller has received yet.
    unseen: std::collections::HashSet<String>,
}

impl Failures {
    fn lock(&self) -> std::sync::MutexGuard<'_, FailureState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A ticket for a write of `execution` queued now, and whether it is doomed.
    fn ticket(&self, execution: &str) -> (u64, bool) {
        let state = self.lock();
        let ticket = self
            .next_ticket
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (ticket, state.unseen.contains(execution))
    }

    /// Records that a write of `execution` failed (before its caller is told).
    fn failed(&self, execution: &str) {
        let mut state = self.lock();
        let last = self
            .next_ticket
            .load(std::sync::atomic::Ordering::SeqCst)
            .saturating_sub(1);
        state.failed_up_to.insert(execution.to_owned(), last);
        state.unseen.insert(execution.to_owned());
    }

    /// A caller received a failure of `execution`: writes it queues from now on are new.
    fn seen(&self, execution: &str) {
        self.lock().unseen.remove(execution);
    }

    /// Whether `job` must fail unwritten because an earlier write of its execution failed.
    fn dooms(&self, job: &Job) -> bool {
        job.doomed
            || self
                .lock()
                .failed_up_to
                .get(&job.write.execution_id)
                .is_some_and(|&last| job.ticket <= last)
    }
}

/// The answer to a write that an earlier failed write of its execution doomed.
fn doomed_message(shown: &str, execution: &str) -> String {
    format!(
        "event log {shown}: an earlier write of execution {execution} failed; this later one was not written"
    )
}

/// The leases this process holds: execution id → worker. Shared with the writer task,
/// which marks a lease lost when the server refused a write under it.
pub(crate) type Leases = Arc<std::sync::Mutex<BTreeMap<String, HeldLease>>>;

#[derive(Debug, Clone)]
pub(crate) struct HeldLease {
    pub(crate) worker: String,
    pub(crate) lost: bool,
}

/// The PostgreSQL-backed [`EventSink`], [`ContextArchive`] and [`EventStore`]. Cheap to
/// share behind an `Arc`; all executions of a process share its writer task.
#[derive(Debug)]
pub struct PgStore {
    pool: Pool,
    pub(crate) redactor: Arc<Redactor>,
    jobs: mpsc::UnboundedSender<Job>,
    /// The URL without its password, for error messages.
    shown: String,
    /// Where a listening connection of its own goes (`events --follow`, idle workers).
    pub(crate) config: tokio_postgres::Config,
    /// How every connection speaks TLS (the URL's `sslmode` and `sslrootcert`).
    pub(crate) tls: tls::Connector,
    pub(crate) leases: Leases,
    failures: Arc<Failures>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("execution_id", &self.write.execution_id)
            .finish_non_exhaustive()
    }
}

/// Whether `db` names a PostgreSQL log (`postgres://…` or `postgresql://…`) rather than a
/// SQLite file.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

impl PgStore {
    /// Connects to the log at `url` (`postgres://user[:password]@host[:port]/dbname`, with
    /// libpq's `sslmode` and `sslrootcert` among its parameters: see [`tls`]), creating or
    /// migrating its tables, and starts the writer task on the current Tokio runtime.
    /// Every payload, snapshot and archived message passes through `redactor`.
    pub async fn connect(url: &str, redactor: Arc<Redactor>) -> Result<Self, SessionError> {
        let (mut config, security) = tls::parse_url(url)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        let shown = shown_url(&config);
        let err = |e: &dyn std::error::Error| SessionError::Database {
            log: shown.clone(),
            message: with_causes(e),
        };
        let connector = tls::connector(&security).map_err(|message| SessionError::Connect {
            log: shown.clone(),
            message,
        })?;
        let manager = Manager::from_config(
            config.clone(),
            connector.make.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE + 1)
            .build()
            .map_err(|e| err(&e))?;
        {
            let mut client = pool.get().await.map_err(|e| {
                // The driver's error, not the pool's wrapping of it.
                let cause: &(dyn std::error::Error + 'static) =
                    if let deadpool_postgres::PoolError::Backend(inner) = &e {
                        inner
                    } else {
                        &e
                    };
                SessionError::Connect {
                    log: shown.clone(),
                    message: tls::explain(cause, &security, &host_of(&config))
                        .unwrap_or_else(|| with_causes(cause)),
                }
            })?;
            let found = migrate(&mut client).await.map_err(|e| err(&e))?;
            if found > SCHEMA_VERSION {
                return Err(SessionError::SchemaTooNew {
                    path: shown,
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
        }
        let (jobs, queue) = mpsc::unbounded_channel();
        let leases = Leases::default();
        let failures = Arc::new(Failures::default());
        tokio::spawn(run_writer(
            pool.clone(),
            shown.clone(),
            queue,
            Arc::clone(&leases),
            Arc::clone(&failures),
        ));
        Ok(Self {
            pool,
            redactor,
            jobs,
            shown,
            config,
            tls: connector,
            leases,
            failures,
        })
    }

    /// The log's URL without its password.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The redactor every write passes through.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    pub(crate) fn db_err(&self, e: &dyn std::error::Error) -> SessionError {
        SessionError::Database {
            log: self.shown.clone(),
            message: with_causes(e),
        }
    }

    pub(crate) async fn client(&self) -> Result<deadpool_postgres::Object, SessionError> {
        self.pool.get().await.map_err(|e| self.db_err(&e))
    }

    /// Queues `write` for the writer (at once, in this call's first poll) and waits for it.
    async fn write(&self, write: Write) -> Result<Written, SessionError> {
        self.queue_write(write).await
    }

    /// Queues `write` for the writer now (its place in the order is taken before this
    /// returns); the future waits for it to be durable.
    fn queue_write(
        &self,
        write: Write,
    ) -> impl std::future::Future<Output = Result<Written, SessionError>> + Send + 'static {
        let (reply, answer) = oneshot::channel();
        let lease = self.lease_of(&write.execution_id);
        let execution = write.execution_id.clone();
        let (ticket, doomed) = self.failures.ticket(&execution);
        let queued = self
            .jobs
            .send(Job {
                write,
                lease,
                ticket,
                doomed,
                reply,
            })
            .is_ok();
        let failures = Arc::clone(&self.failures);
        async move {
            if !queued {
                return Err(SessionError::WriterGone);
            }
            match answer.await {
                Ok(Ok(written)) => Ok(written),
                Ok(Err(message)) => {
                    failures.seen(&execution);
                    Err(SessionError::Write(message))
                }
                Err(_) => Err(SessionError::WriterGone),
            }
        }
    }

    /// The write of one engine batch (`None` when there is nothing to write), encoded and
    /// redacted on the caller's thread.
    fn batch_write(
        &self,
        execution: ExecutionId,
        events: &[Event],
        checkpoint: Option<&Snapshot>,
    ) -> Result<Option<Write>, SessionError> {
        encode_batch(execution.to_string(), events, checkpoint, &self.redactor)
            .map_err(SessionError::Encode)
    }

    fn encode_all(&self, events: &[Event]) -> Result<Vec<EncodedEvent>, SessionError> {
        events
            .iter()
            .map(|e| encode_event(e, &self.redactor).map_err(SessionError::Encode))
            .collect()
    }

    async fn read_events<C: GenericClient>(
        &self,
        client: &C,
        execution: &str,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        let rows = client
            .query(SELECT_EVENTS, &[&execution])
            .await
            .map_err(|e| self.db_err(&e))?;
        if rows.is_empty() {
            return Err(SessionError::UnknownExecution(execution.to_owned()));
        }
        rows.iter()
            .map(|row| stored_event(row).map_err(|e| self.db_err(&e)))
            .collect()
    }

    async fn read_checkpoint<C: GenericClient>(
        &self,
        client: &C,
        execution: &str,
    ) -> Result<Option<StoredCheckpoint>, SessionError> {
        let row = client
            .query_opt(
                "SELECT seq, ts, snapshot, kind, payload FROM events
                 WHERE execution_id = $1 AND snapshot IS NOT NULL ORDER BY seq DESC LIMIT 1",
                &[&execution],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let got = || -> Result<_, tokio_postgres::Error> {
            Ok((
                to_u64(row.try_get::<_, i64>(0)?),
                row.try_get::<_, String>(1)?,
                row.try_get::<_, String>(2)?,
                row.try_get::<_, String>(3)?,
                row.try_get::<_, String>(4)?,
            ))
        };
        let (seq, ts, snapshot, kind, payload) = got().map_err(|e| self.db_err(&e))?;
        checked_checkpoint(execution, seq, ts, &snapshot, &kind, &payload).map(Some)
    }

    /// Every event of `execution` with its snapshot, and its archive blocks: what
    /// `nerve export` writes.
    pub async fn export(&self, execution: ExecutionId) -> Result<ExecutionLog, SessionError> {
        let id = execution.to_string();
        let mut pooled = self.client().await?;
        let client: &mut tokio_postgres::Client = &mut pooled;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| self.db_err(&e))?;
        let rows = tx
            .query(
                "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash, snapshot
                 FROM events WHERE execution_id = $1 ORDER BY seq",
                &[&id],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        if rows.is_empty() {
            return Err(SessionError::UnknownExecution(id));
        }
        let events = rows
            .iter()
            .map(|row| {
                Ok(LoggedEvent {
                    event: stored_event(row)?,
                    snapshot: row.try_get(8)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))?;
        let rows = tx
            .query(
                "SELECT block_id, created_seq, ts, messages, note FROM archive_blocks
                 WHERE execution_id = $1 ORDER BY created_seq, block_id",
                &[&id],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let mut blocks = Vec::with_capacity(rows.len());
        for row in &rows {
            blocks.push(self.archive_row(&id, row)?);
        }
        tx.commit().await.map_err(|e| self.db_err(&e))?;
        Ok(ExecutionLog {
            execution_id: id,
            events,
            blocks,
        })
    }

    /// Loads a checked log (see [`crate::parse_log`]) as it is, in one transaction: its
    /// events keep their times and hashes, so it verifies here as it did where it came
    /// from. Refused when the execution already has events in this log. Returns the number
    /// of events written.
    pub async fn import(&self, log: &ExecutionLog) -> Result<u64, SessionError> {
        let mut pooled = self.client().await?;
        let client: &mut tokio_postgres::Client = &mut pooled;
        let tx = client.transaction().await.map_err(|e| self.db_err(&e))?;
        let id = log.execution_id.as_str();
        let (first, last) = match (log.events.first(), log.events.last()) {
            (Some(first), Some(last)) => (&first.event, &last.event),
            _ => return Err(SessionError::Corrupt("an import without events".into())),
        };
        let inserted = tx
            .execute(
                "INSERT INTO executions (execution_id, started_at, updated_at, head_hash)
                 VALUES ($1, $2, $2, $3) ON CONFLICT (execution_id) DO NOTHING",
                &[&id, &first.ts, &GENESIS_HASH],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        if inserted == 0 {
            return Err(SessionError::Write(format!(
                "execution {id} is already in this log; nothing was imported"
            )));
        }
        let mut row = ExecutionSummary::new(id, &first.ts);
        let plain = Redactor::new();
        let mut cols = EventColumns::default();
        for logged in &log.events {
            let e = &logged.event;
            if let Ok(event) = serde_json::from_str::<Event>(&e.payload) {
                row.apply(&index_update(&event, &plain));
            }
            cols.push(e, logged.snapshot.clone());
        }
        row.updated_at.clone_from(&last.ts);
        row.events = last.seq;
        cols.insert(&tx, INSERT_EVENTS)
            .await
            .map_err(|e| self.db_err(&e))?;
        let mut blocks = BlockColumns::default();
        for block in &log.blocks {
            let messages = serde_json::to_string(&block.messages)?;
            let mut text = block.note.clone();
            text.push('\n');
            text.push_str(&searchable_text(&block.messages));
            blocks.push(
                block.block_id.to_string(),
                id,
                block.created_seq,
                &block.ts,
                messages,
                block.note.clone(),
                text,
            );
        }
        blocks
            .insert(&tx, INSERT_BLOCKS)
            .await
            .map_err(|e| self.db_err(&e))?;
        let head = Head {
            seq: last.seq,
            hash: last.hash.clone(),
            row,
        };
        update_heads(&tx, UPDATE_HEADS, &[&head], &last.ts)
            .await
            .map_err(|e| self.db_err(&e))?;
        tx.commit().await.map_err(|e| self.db_err(&e))?;
        Ok(last.seq)
    }

    fn archive_row(&self, execution: &str, row: &Row) -> Result<ArchiveBlock, SessionError> {
        let got = || -> Result<_, tokio_postgres::Error> {
            Ok((
                row.try_get::<_, String>(0)?,
                row.try_get::<_, i64>(1)?,
                row.try_get::<_, String>(2)?,
                row.try_get::<_, String>(3)?,
                row.try_get::<_, String>(4)?,
            ))
        };
        let (block_id, created_seq, ts, messages, note) = got().map_err(|e| self.db_err(&e))?;
        let messages: Vec<Message> = serde_json::from_str(&messages).map_err(|e| {
            SessionError::Corrupt(format!(
                "archive block {block_id}: messages do not decode: {e}"
            ))
        })?;
        Ok(ArchiveBlock {
            block_id: block_id.parse().map_err(|e| {
                SessionError::Corrupt(format!("archive block id {block_id:?}: {e}"))
            })?,
            execution_id: execution.to_owned(),
            created_seq: to_u64(created_seq),
            ts,
            messages,
            note,
        })
    }
}

/// An error and its causes in one line: the driver's own message is often only "error
/// connecting to server", with the reason (connection refused, a bad password) below it.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        let next = inner.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        cause = inner.source();
    }
    text
}

/// The first host of `config`, as the URL names it.
fn host_of(config: &tokio_postgres::Config) -> String {
    config
        .get_hosts()
        .first()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .unwrap_or_default()
}

/// `postgres://user@host:port/dbname`, never the password.
fn shown_url(config: &tokio_postgres::Config) -> String {
    let host = host_of(config);
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or_default(),
        config.get_dbname().unwrap_or_default()
    )
}

async fn migrate(client: &mut tokio_postgres::Client) -> Result<i64, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS nerve_schema (version BIGINT NOT NULL)")
        .await?;
    let found: i64 = tx
        .query_one("SELECT COALESCE(MAX(version), 0) FROM nerve_schema", &[])
        .await?
        .try_get(0)?;
    let mut version = found;
    for (from, sql) in MIGRATIONS.iter().enumerate() {
        let from = i64::try_from(from).unwrap_or(i64::MAX);
        if from < version {
            continue;
        }
        tx.batch_execute(sql).await?;
        version = from + 1;
        tx.execute(
            "INSERT INTO nerve_schema (version) VALUES ($1)",
            &[&version],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(found.max(version))
}

pub(crate) fn stored_event(row: &Row) -> Result<StoredEvent, tokio_postgres::Error> {
    Ok(StoredEvent {
        execution_id: row.try_get(0)?,
        seq: to_u64(row.try_get(1)?),
        ts: row.try_get(2)?,
        kind: row.try_get(3)?,
        version: u32::try_from(row.try_get::<_, i32>(4)?).unwrap_or(0),
        payload: row.try_get(5)?,
        prev_hash: row.try_get(6)?,
        hash: row.try_get(7)?,
    })
}

/// A row of [`SUMMARY_COLUMNS`]: [`summary`]'s columns, then the parent and the call its
/// `started` names (columns 16 and 17).
fn listed_summary(row: &Row) -> Result<ExecutionSummary, tokio_postgres::Error> {
    Ok(ExecutionSummary {
        parent: row.try_get(16)?,
        call_id: row.try_get(17)?,
        ..summary(row)?
    })
}

fn summary(row: &Row) -> Result<ExecutionSummary, tokio_postgres::Error> {
    let count =
        |i: usize| -> Result<u64, tokio_postgres::Error> { Ok(to_u64(row.try_get::<_, i64>(i)?)) };
    Ok(ExecutionSummary {
        execution_id: row.try_get(0)?,
        started_at: row.try_get(1)?,
        updated_at: row.try_get(2)?,
        events: count(3)?,
        task: row.try_get(4)?,
        loop_type: row.try_get(5)?,
        model: row.try_get(6)?,
        task_status: row.try_get(7)?,
        termination_reason: row.try_get(8)?,
        error: row.try_get(9)?,
        total_turns: u32::try_from(count(10)?).unwrap_or(u32::MAX),
        input_tokens: count(11)?,
        output_tokens: count(12)?,
        cost_micro_usd: count(13)?,
        resumes: u32::try_from(count(14)?).unwrap_or(u32::MAX),
        workspace: row.try_get(15)?,
        parent: None,
        call_id: None,
        queue_state: None,
    })
}

/// A checkpoint's snapshot, checked against the SHA-256 its chained event recorded.
fn checked_checkpoint(
    execution: &str,
    seq: u64,
    ts: String,
    snapshot: &str,
    kind: &str,
    payload: &str,
) -> Result<StoredCheckpoint, SessionError> {
    let corrupt = |why: &str| {
        SessionError::Corrupt(format!("checkpoint {seq} of execution {execution}: {why}"))
    };
    let recorded = match (kind, serde_json::from_str::<Event>(payload).ok()) {
        ("checkpoint", Some(Event::Checkpoint(event))) => event,
        _ => return Err(corrupt("its checkpoint event is missing")),
    };
    if sha256_hex(snapshot) != recorded.snapshot_sha256 {
        return Err(corrupt(
            "the snapshot does not match the hash its checkpoint event recorded",
        ));
    }
    let snapshot = serde_json::from_str(snapshot)
        .map_err(|e| corrupt(&format!("snapshot is not JSON: {e}")))?;
    Ok(StoredCheckpoint {
        seq,
        turn: recorded.turn,
        ts,
        snapshot,
    })
}

/// The text a search looks for: the first terms of `query` that hold a letter or digit,
/// each cut to a bounded length; `plainto_tsquery` makes them one AND of plain lexemes, so
/// no input is ever an operator.
fn search_text(query: &str) -> Option<String> {
    let terms: Vec<String> = query
        .split_whitespace()
        .filter(|term| term.chars().any(char::is_alphanumeric))
        .take(MAX_TERMS)
        .map(|term| {
            term.chars()
                .filter(|c| !c.is_control())
                .take(MAX_TERM_CHARS)
                .collect()
        })
        .collect();
    (!terms.is_empty()).then(|| terms.join(" "))
}

#[async_trait]
impl EventSink for PgStore {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let event = encode_event(&event, &self.redactor)
            .map_err(|e| SinkError::from(SessionError::Encode(e)))?;
        let written = self
            .write(Write::events(execution.to_string(), vec![event]))
            .await
            .map_err(SinkError::from)?;
        written
            .seqs
            .first()
            .copied()
            .ok_or_else(|| SinkError::Corrupt("the writer returned no sequence number".into()))
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        EventStore::write_checkpoint(self, execution, turn, snapshot)
            .await
            .map(Some)
            .map_err(SinkError::from)
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        let Some(write) = self.batch_write(execution, &events, checkpoint.as_ref())? else {
            return Ok(None);
        };
        let written = self.write(write).await?;
        Ok(checkpoint.map(|_| written.head))
    }

    /// Encodes the batch here and queues it at once: its place in the order is taken
    /// before this returns, so the engine's next batch may go in the same transaction.
    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        let has_checkpoint = checkpoint.is_some();
        let write = match self.batch_write(execution, &events, checkpoint.as_ref()) {
            Ok(Some(write)) => write,
            Ok(None) => return Enqueued::Placed(Box::pin(std::future::ready(Ok(None)))),
            Err(error) => {
                return Enqueued::Placed(Box::pin(std::future::ready(Err(error.into()))));
            }
        };
        let written = self.queue_write(write);
        Enqueued::Placed(Box::pin(async move {
            let written = written.await?;
            Ok(has_checkpoint.then_some(written.head))
        }))
    }
}

#[async_trait]
impl EventStore for PgStore {
    async fn append_all(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
    ) -> Result<Vec<u64>, SessionError> {
        let encoded = self.encode_all(&events)?;
        if encoded.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self
            .write(Write::events(execution.to_string(), encoded))
            .await?
            .seqs)
    }

    async fn write_checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<u64, SessionError> {
        let write = encode_checkpoint(execution.to_string(), turn, &snapshot, &self.redactor)?;
        Ok(self.write(write).await?.head)
    }

    async fn put_blocks(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
    ) -> Result<u64, SessionError> {
        let write = encode_blocks(execution.to_string(), &blocks, None, &self.redactor)?;
        Ok(self.write(write).await?.head)
    }

    async fn compact(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
        compaction: Compaction,
    ) -> Result<u64, SessionError> {
        let event = Event::Compaction(compaction);
        let write = encode_blocks(execution.to_string(), &blocks, Some(&event), &self.redactor)?;
        Ok(self.write(write).await?.head)
    }

    async fn events(&self, execution: ExecutionId) -> Result<Vec<StoredEvent>, SessionError> {
        let pooled = self.client().await?;
        let client: &tokio_postgres::Client = &pooled;
        self.read_events(client, &execution.to_string()).await
    }

    async fn replay(&self, execution: ExecutionId) -> Result<Replay, SessionError> {
        let events = EventStore::events(self, execution).await?;
        Ok(replay(&execution.to_string(), &events))
    }

    async fn verify(
        &self,
        execution: ExecutionId,
    ) -> Result<Result<u64, ChainError>, SessionError> {
        let events = EventStore::events(self, execution).await?;
        let mut check = ChainCheck::default();
        for event in &events {
            check.push(&event.fields());
        }
        Ok(check.finish().map_err(|(error, _)| error))
    }

    async fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {SUMMARY_COLUMNS}, NULL::text FROM executions WHERE head_seq > 0
                     UNION ALL {QUEUED_SUMMARIES}
                     ORDER BY 2 DESC, 1 DESC"
                ),
                &[],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| {
                let mut listed = listed_summary(row)?;
                listed.queue_state = row.try_get(18)?;
                Ok(listed)
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }

    async fn execution(&self, execution: ExecutionId) -> Result<ExecutionSummary, SessionError> {
        let id = execution.to_string();
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {SUMMARY_COLUMNS} FROM executions
                     WHERE execution_id = $1 AND head_seq > 0"
                ),
                &[&id],
            )
            .await
            .map_err(|e| self.db_err(&e))?
            .ok_or(SessionError::UnknownExecution(id))?;
        listed_summary(&row).map_err(|e| self.db_err(&e))
    }

    async fn latest_checkpoint(
        &self,
        execution: ExecutionId,
    ) -> Result<Option<StoredCheckpoint>, SessionError> {
        let pooled = self.client().await?;
        let client: &tokio_postgres::Client = &pooled;
        self.read_checkpoint(client, &execution.to_string()).await
    }

    async fn resume_point(&self, execution: ExecutionId) -> Result<ResumePoint, SessionError> {
        let id = execution.to_string();
        let mut pooled = self.client().await?;
        let client: &mut tokio_postgres::Client = &mut pooled;
        // One snapshot: a commit between the two reads cannot make them disagree.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(|e| self.db_err(&e))?;
        let events = self.read_events(&tx, &id).await?;
        let checkpoint = self.read_checkpoint(&tx, &id).await?;
        tx.commit().await.map_err(|e| self.db_err(&e))?;
        let after = checkpoint.as_ref().map_or(0, |c| c.seq);
        let later = events.iter().filter(|e| e.seq > after).cloned().collect();
        Ok(ResumePoint {
            replay: replay(&id, &events),
            checkpoint,
            later,
        })
    }

    async fn archive_block(
        &self,
        execution: ExecutionId,
        block: BlockId,
    ) -> Result<Option<ArchiveBlock>, SessionError> {
        let id = execution.to_string();
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT block_id, created_seq, ts, messages, note FROM archive_blocks
                 WHERE block_id = $1 AND execution_id = $2",
                &[&block.to_string(), &id],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        row.map(|row| self.archive_row(&id, &row)).transpose()
    }

    async fn search_archive(
        &self,
        execution: ExecutionId,
        query: String,
        limit: usize,
    ) -> Result<Vec<ArchiveHit>, SessionError> {
        let Some(text) = search_text(&query) else {
            return Ok(Vec::new());
        };
        if limit == 0 {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT b.block_id, b.created_seq, b.note,
                        ts_headline('english', b.text, q,
                                    'StartSel=\"\", StopSel=\"\", MaxWords=24, MinWords=8, FragmentDelimiter=\"…\", MaxFragments=1')
                 FROM archive_blocks b, plainto_tsquery('english', $1) q
                 WHERE b.execution_id = $2 AND b.search @@ q
                 ORDER BY b.note LIKE 'summary%', ts_rank(b.search, q) DESC, b.created_seq, b.block_id
                 LIMIT $3",
                &[&text, &execution.to_string(), &to_i64(limit as u64)],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let mut hits = Vec::with_capacity(rows.len());
        for row in &rows {
            let got = || -> Result<_, tokio_postgres::Error> {
                Ok((
                    row.try_get::<_, String>(0)?,
                    row.try_get::<_, i64>(1)?,
                    row.try_get::<_, String>(2)?,
                    row.try_get::<_, String>(3)?,
                ))
            };
            let (block_id, created_seq, note, snippet) = got().map_err(|e| self.db_err(&e))?;
            hits.push(ArchiveHit {
                block_id: block_id.parse().map_err(|e| {
                    SessionError::Corrupt(format!("archive block id {block_id:?}: {e}"))
                })?,
                created_seq: to_u64(created_seq),
                note,
                snippet,
            });
        }
        Ok(hits)
    }

    async fn export(&self, execution: ExecutionId) -> Result<ExecutionLog, SessionError> {
        PgStore::export(self, execution).await
    }

    async fn import(&self, log: ExecutionLog) -> Result<u64, SessionError> {
        PgStore::import(self, &log).await
    }
}

/// The archive port `nerve-brain` compacts into, as [`crate::SqliteSink`]'s.
#[async_trait]
impl ContextArchive for PgStore {
    async fn archive(&self, execution: ExecutionId, block: ArchivedBlock) -> Result<(), SinkError> {
        self.archive_many(execution, vec![block]).await
    }

    /// One write for all of them.
    async fn archive_many(
        &self,
        execution: ExecutionId,
        blocks: Vec<ArchivedBlock>,
    ) -> Result<(), SinkError> {
        crate::archive::put_archived(self, execution, blocks).await
    }

    async fn fetch(
        &self,
        execution: ExecutionId,
        id: BlockId,
    ) -> Result<Option<ArchivedBlock>, SinkError> {
        let block = self
            .archive_block(execution, id)
            .await
            .map_err(SinkError::from)?;
        Ok(block.map(|block| ArchivedBlock {
            id: block.block_id,
            messages: block.messages,
            note: block.note,
        }))
    }

    async fn search(
        &self,
        execution: ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<RecallHit>, SinkError> {
        let hits = self
            .search_archive(execution, query.to_owned(), limit)
            .await
            .map_err(SinkError::from)?;
        Ok(hits
            .into_iter()
            .map(|hit| RecallHit {
                id: hit.block_id,
                note: hit.note,
                snippet: hit.snippet,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_backend_and_hide_the_password() {
        assert!(is_postgres_url("postgres://u@h/d"));
        assert!(is_postgres_url("postgresql://u@h/d"));
        assert!(!is_postgres_url("/var/lib/nerve.db"));
        assert!(!is_postgres_url("postgres.db"));
        let config: tokio_postgres::Config = "postgres://alice:hunter2@db.example:6543/nerve"
            .parse()
            .unwrap();
        let shown = shown_url(&config);
        assert_eq!(shown, "postgres://alice@db.example:6543/nerve");
    }

    #[test]
    fn search_text_keeps_words_and_drops_noise() {
        assert_eq!(
            search_text("  failing   tests "),
            Some("failing tests".into())
        );
        assert_eq!(search_text("-- ** ()"), None);
        assert_eq!(search_text(&"x ".repeat(100)).map(|t| t.len()), Some(63));
    }
}
