//! The PostgreSQL writer: batches of events and archive blocks as column arrays, one
//! transaction per batch that checks and moves each execution's head (and the leases of
//! queued executions), retried while heads move under it.

use std::collections::BTreeMap;
use std::sync::Arc;

use deadpool_postgres::Pool;
use tokio::sync::mpsc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row};

use super::{
    Failures, Head, INSERT_BLOCKS, INSERT_EVENTS, Job, Leases, MAX_BATCH, UPDATE_HEADS,
    doomed_message, summary, with_causes,
};
use crate::chain::{GENESIS_HASH, StoredEvent, event_hash};
use crate::encode::{Write, Written};
use crate::store::{ExecutionSummary, now_rfc3339, to_i64};

/// Events as columns, for one `INSERT … SELECT * FROM UNNEST(…)`: a batch of any size is
/// one statement.
#[derive(Default)]
pub(super) struct EventColumns {
    execution_id: Vec<String>,
    seq: Vec<i64>,
    ts: Vec<String>,
    kind: Vec<String>,
    version: Vec<i32>,
    payload: Vec<String>,
    prev_hash: Vec<String>,
    hash: Vec<String>,
    snapshot: Vec<Option<String>>,
}

impl EventColumns {
    pub(super) fn push(&mut self, e: &StoredEvent, snapshot: Option<String>) {
        self.execution_id.push(e.execution_id.clone());
        self.seq.push(to_i64(e.seq));
        self.ts.push(e.ts.clone());
        self.kind.push(e.kind.clone());
        self.version
            .push(i32::try_from(e.version).unwrap_or(i32::MAX));
        self.payload.push(e.payload.clone());
        self.prev_hash.push(e.prev_hash.clone());
        self.hash.push(e.hash.clone());
        self.snapshot.push(snapshot);
    }

    pub(super) async fn insert<
        C: GenericClient,
        S: tokio_postgres::ToStatement + ?Sized + Sync + Send,
    >(
        &self,
        client: &C,
        statement: &S,
    ) -> Result<(), tokio_postgres::Error> {
        if self.seq.is_empty() {
            return Ok(());
        }
        let params: [&(dyn ToSql + Sync); 9] = [
            &self.execution_id,
            &self.seq,
            &self.ts,
            &self.kind,
            &self.version,
            &self.payload,
            &self.prev_hash,
            &self.hash,
            &self.snapshot,
        ];
        client.execute(statement, &params).await.map(|_| ())
    }
}

#[derive(Default)]
pub(super) struct BlockColumns {
    block_id: Vec<String>,
    execution_id: Vec<String>,
    created_seq: Vec<i64>,
    ts: Vec<String>,
    messages: Vec<String>,
    note: Vec<String>,
    text: Vec<String>,
}

impl BlockColumns {
    #[allow(clippy::too_many_arguments)] // One per column, in the table's order.
    pub(super) fn push(
        &mut self,
        block_id: String,
        execution_id: &str,
        created_seq: u64,
        ts: &str,
        messages: String,
        note: String,
        text: String,
    ) {
        self.block_id.push(block_id);
        self.execution_id.push(execution_id.to_owned());
        self.created_seq.push(to_i64(created_seq));
        self.ts.push(ts.to_owned());
        self.messages.push(messages);
        self.note.push(note);
        self.text.push(text);
    }

    pub(super) async fn insert<
        C: GenericClient,
        S: tokio_postgres::ToStatement + ?Sized + Sync + Send,
    >(
        &self,
        client: &C,
        statement: &S,
    ) -> Result<(), tokio_postgres::Error> {
        if self.block_id.is_empty() {
            return Ok(());
        }
        let params: [&(dyn ToSql + Sync); 7] = [
            &self.block_id,
            &self.execution_id,
            &self.created_seq,
            &self.ts,
            &self.messages,
            &self.note,
            &self.text,
        ];
        client.execute(statement, &params).await.map(|_| ())
    }
}

/// Writes the heads and index rows of `heads` (their executions' rows are locked).
pub(super) async fn update_heads<
    C: GenericClient,
    S: tokio_postgres::ToStatement + ?Sized + Sync + Send,
>(
    client: &C,
    statement: &S,
    heads: &[&Head],
    ts: &str,
) -> Result<(), tokio_postgres::Error> {
    let mut id = Vec::new();
    let mut updated_at = Vec::new();
    let mut head_seq = Vec::new();
    let mut head_hash = Vec::new();
    let mut task = Vec::new();
    let mut loop_type = Vec::new();
    let mut model = Vec::new();
    let mut task_status = Vec::new();
    let mut termination_reason = Vec::new();
    let mut error = Vec::new();
    let mut total_turns = Vec::new();
    let mut input_tokens = Vec::new();
    let mut output_tokens = Vec::new();
    let mut cost = Vec::new();
    let mut resumes = Vec::new();
    for head in heads {
        let row = &head.row;
        id.push(row.execution_id.clone());
        updated_at.push(ts.to_owned());
        head_seq.push(to_i64(head.seq));
        head_hash.push(head.hash.clone());
        task.push(row.task.clone());
        loop_type.push(row.loop_type.clone());
        model.push(row.model.clone());
        task_status.push(row.task_status.clone());
        termination_reason.push(row.termination_reason.clone());
        error.push(row.error.clone());
        total_turns.push(i64::from(row.total_turns));
        input_tokens.push(to_i64(row.input_tokens));
        output_tokens.push(to_i64(row.output_tokens));
        cost.push(to_i64(row.cost_micro_usd));
        resumes.push(i64::from(row.resumes));
    }
    let params: [&(dyn ToSql + Sync); 15] = [
        &id,
        &updated_at,
        &head_seq,
        &head_hash,
        &task,
        &loop_type,
        &model,
        &task_status,
        &termination_reason,
        &error,
        &total_turns,
        &input_tokens,
        &output_tokens,
        &cost,
        &resumes,
    ];
    client.execute(statement, &params).await.map(|_| ())
}

/// The statements a commit sends, prepared once per connection (deadpool caches them with
/// the connection): a cached statement is sent with its parameters in one message, where
/// a query given as text costs a round trip of its own to be prepared first.
struct Statements {
    lock_heads: tokio_postgres::Statement,
    make_heads: tokio_postgres::Statement,
    check_leases: tokio_postgres::Statement,
    insert_events: tokio_postgres::Statement,
    insert_blocks: tokio_postgres::Statement,
    update_heads: tokio_postgres::Statement,
    notify: tokio_postgres::Statement,
}

const LOCK_HEADS: &str = "SELECT execution_id, started_at, updated_at, head_seq, task, \
     loop_type, model, task_status, termination_reason, error, total_turns, input_tokens, \
     output_tokens, cost_micro_usd, resumes, NULL::text, head_hash FROM executions
     WHERE execution_id = ANY($1) ORDER BY execution_id FOR UPDATE";
const MAKE_HEADS: &str = "INSERT INTO executions (execution_id, started_at, updated_at, head_hash)
     SELECT id, $2, $2, $3 FROM UNNEST($1::text[]) AS id ORDER BY id
     ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id";
const CHECK_LEASES: &str = "SELECT q.execution_id FROM queue q
     JOIN UNNEST($1::text[], $2::text[]) AS l(execution_id, worker)
       ON q.execution_id = l.execution_id AND q.worker = l.worker
     WHERE q.state = 'claimed' AND q.lease_until > clock_timestamp()
     ORDER BY q.execution_id FOR SHARE OF q";
const NOTIFY: &str = "SELECT pg_notify('nerve_events', id) FROM UNNEST($1::text[]) AS id";

impl Statements {
    async fn prepare(
        client: &deadpool_postgres::ClientWrapper,
    ) -> Result<Self, tokio_postgres::Error> {
        Ok(Self {
            lock_heads: client.prepare_cached(LOCK_HEADS).await?,
            make_heads: client.prepare_cached(MAKE_HEADS).await?,
            check_leases: client.prepare_cached(CHECK_LEASES).await?,
            insert_events: client.prepare_cached(INSERT_EVENTS).await?,
            insert_blocks: client.prepare_cached(INSERT_BLOCKS).await?,
            update_heads: client.prepare_cached(UPDATE_HEADS).await?,
            notify: client.prepare_cached(NOTIFY).await?,
        })
    }
}

/// The heads in `rows` (from [`LOCK_HEADS`]) that `ids` asked for.
fn heads_in<'a>(
    rows: &[Row],
    ids: &[&'a str],
    heads: &mut BTreeMap<&'a str, Head>,
) -> Result<(), CommitError> {
    for row in rows {
        let row_summary = summary(row)?;
        let head = Head {
            seq: row_summary.events,
            hash: row.try_get(16)?,
            row: row_summary,
        };
        if let Some(id) = ids.iter().find(|id| **id == head.row.execution_id) {
            heads.insert(*id, head);
        }
    }
    Ok(())
}

/// Completes `heads`, the locked head rows of `ids` (sorted, distinct), with those the
/// first [`LOCK_HEADS`] did not find: new executions' rows are created (and so locked).
/// Another process creating one at the same moment wins its insert; the next select then
/// waits for that process's lock.
async fn lock_missing_heads<'a>(
    client: &tokio_postgres::Client,
    statements: &Statements,
    ids: &[&'a str],
    ts: &str,
    heads: &mut BTreeMap<&'a str, Head>,
) -> Result<(), CommitError> {
    // Ends: at most HEAD_PASSES passes. Each inserts the missing heads or locks the
    // committed ones; a head is missing again only when another transaction inserted it and
    // rolled back in between, and a storm of those becomes an error, not a spin.
    for _ in 0..HEAD_PASSES {
        let missing: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| !heads.contains_key(id))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let made = client
            .query(&statements.make_heads, &[&missing, &ts, &GENESIS_HASH])
            .await?;
        for row in made {
            let made: String = row.try_get(0)?;
            if let Some(id) = missing.iter().find(|id| **id == made) {
                heads.insert(
                    *id,
                    Head {
                        seq: 0,
                        hash: GENESIS_HASH.to_owned(),
                        row: ExecutionSummary::new(id, ts),
                    },
                );
            }
        }
        let wanted: Vec<&str> = missing
            .into_iter()
            .filter(|id| !heads.contains_key(id))
            .collect();
        if !wanted.is_empty() {
            let rows = client.query(&statements.lock_heads, &[&wanted]).await?;
            heads_in(&rows, &wanted, heads)?;
        }
    }
    let missing: Vec<String> = ids
        .iter()
        .filter(|id| !heads.contains_key(*id))
        .map(|id| (*id).to_owned())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(CommitError::HeadsContended(missing))
    }
}

/// Why a commit failed; nothing of it was written either way.
#[derive(Debug)]
enum CommitError {
    Database(tokio_postgres::Error),
    /// The server no longer records these (execution, worker) leases as held.
    LeaseLost(Vec<(String, String)>),
    /// The executions' head rows kept vanishing between their insert and their lock
    /// (other transactions inserting them and rolling back), HEAD_PASSES times.
    HeadsContended(Vec<String>),
}

/// Passes of [`lock_missing_heads`] before it gives up on a head that keeps vanishing.
const HEAD_PASSES: u32 = 16;

impl From<tokio_postgres::Error> for CommitError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Database(error)
    }
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Database(error) => write!(f, "{}", with_causes(error)),
            Self::HeadsContended(ids) => write!(
                f,
                "the head rows of {} kept vanishing under concurrent transactions ({HEAD_PASSES} tries); nothing was appended",
                ids.join(", ")
            ),
            Self::LeaseLost(lost) => {
                let (execution, worker) = lost.first().map_or(("", ""), |(e, w)| (e, w));
                write!(
                    f,
                    "worker {worker} no longer holds the lease on execution {execution} (it ran out and another worker took the execution over, or it was cancelled); nothing was appended"
                )
            }
        }
    }
}

/// Which of the `(execution, worker)` leases a [`CHECK_LEASES`] answer (`rows`) does not
/// show as held and unexpired.
fn lost_leases(
    leased: &[(String, String)],
    rows: &[Row],
) -> Result<Vec<(String, String)>, tokio_postgres::Error> {
    let held: Vec<String> = rows
        .iter()
        .map(|row| row.try_get::<_, String>(0))
        .collect::<Result<_, _>>()?;
    Ok(leased
        .iter()
        .filter(|(e, _)| !held.contains(e))
        .cloned()
        .collect())
}

/// Commits `writes` in one transaction; on error nothing of them was written. A write
/// with a lease (`(write, Some(worker))`) commits only while that worker holds it.
///
/// Two round trips, each a pipeline the server answers in order:
/// 1. `BEGIN`, the head rows of the executions written to locked `FOR UPDATE` (in id
///    order, so two writers locking overlapping sets never deadlock), and the leases
///    checked with their queue rows share-locked until the commit: a claim (an UPDATE of
///    the row) cannot take the execution over between this check and the commit, so the
///    worker that takes it over reads a log that already holds this write;
/// 2. the events, archive blocks and heads written, and `COMMIT`; then the notification
///    to `events --follow` listeners, outside the transaction (inside, PostgreSQL would
///    serialise every notifying commit of every process on one lock, fsync included;
///    a follower that misses one reads again within seconds anyway).
///
/// When a statement fails, the server refuses the rest of the transaction and turns the
/// pipelined `COMMIT` into a rollback: every answer is checked before the write counts.
async fn commit(
    client: &tokio_postgres::Client,
    statements: &Statements,
    writes: &[(&Write, Option<&str>)],
) -> Result<Vec<Written>, CommitError> {
    let outcome = commit_in(client, statements, writes).await;
    if outcome.is_err() {
        // Ends the transaction if the failure left it open (a warning, not an error, when
        // the pipelined COMMIT already ended it). A connection that broke is dropped by
        // the pool.
        let _ = client.batch_execute("ROLLBACK").await;
    }
    outcome
}

async fn commit_in(
    client: &tokio_postgres::Client,
    statements: &Statements,
    writes: &[(&Write, Option<&str>)],
) -> Result<Vec<Written>, CommitError> {
    let ts = now_rfc3339();
    let mut ids: Vec<&str> = writes
        .iter()
        .map(|(w, _)| w.execution_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut leased: Vec<(String, String)> = writes
        .iter()
        .filter_map(|(w, lease)| lease.map(|l| (w.execution_id.clone(), l.to_owned())))
        .collect();
    leased.sort();
    leased.dedup();
    let (lease_ids, lease_workers): (Vec<&str>, Vec<&str>) =
        leased.iter().map(|(e, w)| (e.as_str(), w.as_str())).unzip();
    let check = async {
        if leased.is_empty() {
            Ok(Vec::new())
        } else {
            client
                .query(&statements.check_leases, &[&lease_ids, &lease_workers])
                .await
        }
    };
    let locking: [&(dyn ToSql + Sync); 1] = [&ids];
    let ((), locked, held) = tokio::try_join!(
        client.batch_execute("BEGIN"),
        client.query(&statements.lock_heads, &locking),
        check
    )?;
    let mut heads = BTreeMap::new();
    heads_in(&locked, &ids, &mut heads)?;
    lock_missing_heads(client, statements, &ids, &ts, &mut heads).await?;
    let lost = lost_leases(&leased, &held)?;
    if !lost.is_empty() {
        return Err(CommitError::LeaseLost(lost));
    }
    let mut events = EventColumns::default();
    let mut blocks = BlockColumns::default();
    let mut out = Vec::with_capacity(writes.len());
    for (write, _) in writes {
        let id = write.execution_id.as_str();
        let Some(head) = heads.get_mut(id) else {
            continue;
        };
        let mut seqs = Vec::with_capacity(write.events.len());
        let last = write.events.len().saturating_sub(1);
        for (i, event) in write.events.iter().enumerate() {
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
            let snapshot = write.snapshot.clone().filter(|_| i == last);
            events.execution_id.push(id.to_owned());
            events.seq.push(to_i64(seq));
            events.ts.push(ts.clone());
            events.kind.push(event.kind.to_owned());
            events
                .version
                .push(i32::try_from(event.version).unwrap_or(i32::MAX));
            events.payload.push(event.payload.clone());
            events
                .prev_hash
                .push(std::mem::replace(&mut head.hash, hash));
            events.hash.push(head.hash.clone());
            events.snapshot.push(snapshot);
            head.seq = seq;
            head.row.apply(&event.index);
            seqs.push(seq);
        }
        for block in &write.blocks {
            blocks.push(
                block.block_id.clone(),
                id,
                head.seq,
                &ts,
                block.messages.clone(),
                block.note.clone(),
                block.text.clone(),
            );
        }
        out.push(Written {
            seqs,
            head: head.seq,
        });
    }
    let touched: Vec<&Head> = heads.values().collect();
    let notified: [&(dyn ToSql + Sync); 1] = [&ids];
    let (written, notified) = tokio::join!(
        async {
            tokio::try_join!(
                events.insert(client, &statements.insert_events),
                blocks.insert(client, &statements.insert_blocks),
                update_heads(client, &statements.update_heads, &touched, &ts),
                client.batch_execute("COMMIT"),
            )
        },
        client.execute(&statements.notify, &notified)
    );
    written?;
    if let Err(error) = notified {
        tracing::debug!(error = %with_causes(&error), "event log: notifying followers failed");
    }
    Ok(out)
}

/// The writer task: takes every write queued since its last commit and commits them in
/// one transaction. When a batch fails, its writes are retried one by one, so that one bad
/// write (a duplicate block id, a lost lease) fails alone, with the later writes of its
/// execution (see [`Failures`]).
pub(super) async fn run_writer(
    pool: Pool,
    shown: String,
    mut queue: mpsc::UnboundedReceiver<Job>,
    leases: Leases,
    failures: Arc<Failures>,
) {
    let mut batch: Vec<Job> = Vec::new();
    let describe = |error: &CommitError| match error {
        CommitError::LeaseLost(lost) => {
            if let Ok(mut held) = leases.lock() {
                for (execution, _) in lost {
                    if let Some(lease) = held.get_mut(execution) {
                        lease.lost = true;
                    }
                }
            }
            format!("event log {shown}: {error}")
        }
        CommitError::Database(_) | CommitError::HeadsContended(_) => {
            format!("event log {shown}: {error}")
        }
    };
    let fail = |job: Job, message: String| {
        failures.failed(&job.write.execution_id);
        let _ = job.reply.send(Err(message));
    };
    // Ends: when every sender (the store's handles) is dropped; each batch takes at most
    // MAX_BATCH jobs.
    while let Some(job) = queue.recv().await {
        batch.push(job);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (doomed, live): (Vec<Job>, Vec<Job>) =
            batch.drain(..).partition(|job| failures.dooms(job));
        for job in doomed {
            // Not recorded as a failure of its own: its caller may never ask (the engine
            // stops at the earlier one), and the execution must not stay doomed.
            let message = doomed_message(&shown, &job.write.execution_id);
            let _ = job.reply.send(Err(message));
        }
        batch = live;
        if batch.is_empty() {
            continue;
        }
        let connected = match pool.get().await {
            Ok(pooled) => Statements::prepare(&pooled)
                .await
                .map(|statements| (pooled, statements))
                .map_err(|error| with_causes(&error)),
            Err(error) => Err(error.to_string()),
        };
        let (pooled, statements) = match connected {
            Ok(connected) => connected,
            Err(error) => {
                let message = format!("event log {shown}: {error}");
                for job in batch.drain(..) {
                    fail(job, message.clone());
                }
                continue;
            }
        };
        let client: &tokio_postgres::Client = &pooled;
        let writes: Vec<(&Write, Option<&str>)> = batch
            .iter()
            .map(|job| (&job.write, job.lease.as_deref()))
            .collect();
        let outcome = commit(client, &statements, &writes).await;
        drop(writes);
        match outcome {
            Ok(written) => {
                for (job, written) in batch.drain(..).zip(written) {
                    let _ = job.reply.send(Ok(written));
                }
            }
            Err(error) if batch.len() == 1 => {
                tracing::debug!(%error, "event log write failed");
                let message = describe(&error);
                for job in batch.drain(..) {
                    fail(job, message.clone());
                }
            }
            Err(error) => {
                tracing::debug!(%error, "event log batch failed; committing its writes one by one");
                for job in batch.drain(..) {
                    if failures.dooms(&job) {
                        let message = doomed_message(&shown, &job.write.execution_id);
                        let _ = job.reply.send(Err(message));
                        continue;
                    }
                    let result = commit(client, &statements, &[(&job.write, job.lease.as_deref())])
                        .await
                        .map_err(|e| describe(&e))
                        .and_then(|mut written| {
                            written
                                .pop()
                                .ok_or_else(|| "the store returned no result".to_owned())
                        });
                    match result {
                        Ok(written) => {
                            let _ = job.reply.send(Ok(written));
                        }
                        Err(message) => fail(job, message),
                    }
                }
            }
        }
    }
}
