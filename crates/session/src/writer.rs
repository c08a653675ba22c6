//! The single writer: one thread owns the write connection and commits whatever writes
//! have queued up in one transaction (group commit). Each call returns after the
//! transaction holding it has committed and the WAL has been flushed to disk past it, so an
//! append is durable when it returns; many executions appending at once share one flush per
//! batch.
//!
//! The connection commits without flushing (`synchronous=NORMAL`) and the writer flushes
//! the WAL before it replies: itself when nothing else is queued (no hop to another
//! thread), or through a flusher thread when more writes wait, so that one batch's
//! `fdatasync` and the next batch's inserts overlap instead of taking turns.
//!
//! Callers encode and redact on their own threads; the writer only assigns sequence
//! numbers, hashes and inserts. Reads go to a separate read-only connection, so a slow
//! `recall` search never delays an append.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, PoisonError, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nerve_core::event::Compaction;
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, Enqueued, Event, EventSink, ExecutionId, RecallHit,
    Redactor, SinkError, Snapshot,
};
use tokio::sync::oneshot;

use crate::SessionError;
use crate::archive::{ArchiveBlock, ArchiveHit, NewBlock};
use crate::chain::ChainError;
use crate::chain::StoredEvent;
use crate::encode::{
    EncodedEvent, Write, Written, encode_batch, encode_blocks, encode_checkpoint, encode_event,
};
use crate::event_store::EventStore;
use crate::replay::Replay;
use crate::store::{ExecutionSummary, ResumePoint, Store, StoredCheckpoint};
use crate::transfer::ExecutionLog;
use crate::wal::WalFlush;

/// The most rows committed in one transaction. Large enough that a burst of appends from
/// many executions shares few fsyncs; small enough that one transaction stays short.
const MAX_BATCH: usize = 1024;
/// A batch stops gathering when no append arrived for this long: the burst is over.
const ARRIVAL_GAP: Duration = Duration::from_micros(100);
/// The longest a batch waits for company, whatever the last commit cost. Waiting saves
/// flushes; since a flush no longer holds up the next commit when writes are queued (the
/// flusher thread takes it), a long wait only leaves the writer idle: with 1,024 executions
/// each awaiting its appends, 0.5 ms measured 49–58% of one transaction's throughput where
/// 2 ms measured 44–51% (four alternating runs each).
const MAX_GATHER: Duration = Duration::from_micros(500);
/// Rows committed between two requests to the checkpointer: one to three WAL pages a
/// row, so a WAL of some 16–40 MiB. Each checkpoint costs two fsyncs on the checkpointer,
/// and the commit after it one more on the writer (to start the WAL over); at SQLite's
/// usual 1,000 pages (400 rows) that was one commit in eight when 50 executions append at
/// once. A larger WAL also copies a page rewritten by several commits only once.
const CHECKPOINT_EVERY_ROWS: usize = 4000;

struct Job {
    write: Write,
    /// The outcome, and the write itself: the caller's thread allocated it and frees it
    /// (freeing on the writer's thread took the allocator's cross-thread path, in the one
    /// thread every append waits for).
    reply: oneshot::Sender<(Result<Written, String>, Write)>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("execution_id", &self.write.execution_id)
            .finish_non_exhaustive()
    }
}

/// The SQLite-backed [`EventSink`] and [`EventStore`]. Cheap to share behind an `Arc`;
/// concurrent executions in one process share its writer.
#[derive(Debug)]
pub struct SqliteSink {
    jobs: Arc<Queue>,
    redactor: Arc<Redactor>,
    reader: Arc<Mutex<Store>>,
    /// The database file, for imports (which write on their own connection).
    path: std::path::PathBuf,
}

impl SqliteSink {
    /// Opens the log at `path` and starts the writer thread. Every payload, snapshot and
    /// archived message passes through `redactor` before it is written.
    pub fn open(path: &Path, redactor: Arc<Redactor>) -> Result<Self, SessionError> {
        let store = Store::open(path)?;
        let reader = Store::open_read_only(path)?;
        // Checkpoints run on their own thread and connection: on the writer, every few
        // hundred commits one append would wait for megabytes of copying and two fsyncs.
        let checkpointer = Store::open(path)?;
        store.disable_auto_checkpoint()?;
        let (pokes, poked) = mpsc::sync_channel::<()>(1);
        thread::Builder::new()
            .name("nerve-log-checkpoint".into())
            .spawn(move || run_checkpointer(&checkpointer, &poked))
            .map_err(|_| SessionError::WriterGone)?;
        let jobs = Arc::new(Queue::default());
        let queue = Arc::clone(&jobs);
        thread::Builder::new()
            .name("nerve-log-writer".into())
            .spawn(move || {
                // However the writer ends, nobody is left waiting for it.
                let _closing = Closing(&queue);
                run_writer(store, &queue, &pokes);
            })
            .map_err(|_| SessionError::WriterGone)?;
        Ok(Self {
            jobs,
            redactor,
            reader: Arc::new(Mutex::new(reader)),
            path: path.to_path_buf(),
        })
    }

    /// Hands `write` to the writer and waits for its commit.
    async fn submit(&self, write: Write) -> Result<Written, SessionError> {
        let (reply, answer) = oneshot::channel();
        if !self.jobs.push(Job { write, reply }) {
            return Err(SessionError::WriterGone);
        }
        match answer.await {
            Ok((Ok(written), _)) => Ok(written),
            Ok((Err(message), _)) => Err(SessionError::Write(message)),
            Err(_) => Err(SessionError::WriterGone),
        }
    }

    /// Encodes and redacts `events` on the caller's thread, as the log stores them.
    fn encode_all(&self, events: &[Event]) -> Result<Vec<EncodedEvent>, SessionError> {
        events
            .iter()
            .map(|e| encode_event(e, &self.redactor).map_err(SessionError::Encode))
            .collect()
    }

    /// Runs a read on the read-only connection, off the async threads.
    async fn read<T, F>(&self, read: F) -> Result<T, SessionError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, SessionError> + Send + 'static,
    {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            // A panic while reading leaves no half-done state behind: reads only.
            let store = reader.lock().unwrap_or_else(PoisonError::into_inner);
            read(&store)
        })
        .await
        .map_err(|_| SessionError::ReaderGone)?
    }
}

impl Drop for SqliteSink {
    fn drop(&mut self) {
        // The writer commits what is queued, then stops.
        self.jobs.close();
    }
}

/// The writer's inbox. A channel would wake the writer for every append; while it gathers
/// a batch, this one wakes it once, when the company it expects has arrived (or to see
/// whether the appends stopped coming). On two cores, fifty wake-ups per commit took the
/// core the appenders needed to produce the batch.
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<Inbox>,
    arrived: Condvar,
}

#[derive(Debug, Default)]
struct Inbox {
    jobs: VecDeque<Job>,
    /// The rows queued (see [`Write::weight`]).
    weight: usize,
    /// The writer sleeps until this many jobs are queued (0: it is not sleeping).
    want: usize,
    /// No more jobs are taken: the sink or the writer is gone.
    closed: bool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inbox> {
        // Every update of the inbox is one push or one drain: a panic cannot tear it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`; false when the writer is gone.
    fn push(&self, job: Job) -> bool {
        let mut inbox = self.lock();
        if inbox.closed {
            return false;
        }
        inbox.weight += job.write.weight();
        inbox.jobs.push_back(job);
        if inbox.want > 0 && (inbox.jobs.len() >= inbox.want || inbox.weight >= MAX_BATCH) {
            inbox.want = 0;
            self.arrived.notify_one();
        }
        true
    }

    fn close(&self) {
        self.lock().closed = true;
        self.arrived.notify_one();
    }

    /// Nothing is queued.
    fn is_idle(&self) -> bool {
        self.lock().jobs.is_empty()
    }

    /// The next batch: waits for a first job, then, when the last batch had `company`
    /// jobs, for up to that many while they keep coming (no pause longer than
    /// `ARRIVAL_GAP`) until `patience` has passed since the first arrived. `None` once
    /// closed and empty.
    fn next_batch(&self, company: usize, patience: Duration) -> Option<Vec<Job>> {
        let mut inbox = self.lock();
        // Ends: when a job arrives or the queue is closed (the writer's owner dropped it);
        // the wait for company below is bounded by `patience` and ARRIVAL_GAP.
        while inbox.jobs.is_empty() {
            if inbox.closed {
                return None;
            }
            inbox.want = 1;
            inbox = self
                .arrived
                .wait(inbox)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let deadline = Instant::now() + patience;
        let mut seen = inbox.jobs.len();
        while inbox.jobs.len() < company && inbox.weight < MAX_BATCH && !inbox.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inbox.want = company;
            let (next, waited) = self
                .arrived
                .wait_timeout(inbox, left.min(ARRIVAL_GAP))
                .unwrap_or_else(PoisonError::into_inner);
            inbox = next;
            if waited.timed_out() {
                if inbox.jobs.len() == seen {
                    break; // The burst is over.
                }
                seen = inbox.jobs.len();
            }
        }
        inbox.want = 0;
        let mut weight = 0;
        let mut batch = Vec::with_capacity(inbox.jobs.len().min(company.max(1)));
        while weight < MAX_BATCH {
            let Some(job) = inbox.jobs.pop_front() else {
                break;
            };
            weight += job.write.weight();
            batch.push(job);
        }
        inbox.weight -= weight;
        Some(batch)
    }
}

/// Closes the queue when the writer thread ends, even by a panic, and drops what is left
/// in it: each waiting caller then learns that the writer is gone.
struct Closing<'a>(&'a Queue);

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut inbox = self.0.lock();
        inbox.closed = true;
        inbox.jobs.clear();
    }
}

/// Checkpoints whenever the writer asks, until the writer is gone.
fn run_checkpointer(store: &Store, poked: &mpsc::Receiver<()>) {
    while poked.recv().is_ok() {
        if let Err(error) = store.checkpoint() {
            // The WAL only grows until the next try; appends are not affected.
            tracing::warn!(%error, "event log checkpoint failed");
        }
    }
}

/// A write the writer has committed, and what its caller is to be told.
type Outcome = (Job, Result<Written, String>);

/// Tells each caller how its write went. Called once the committed writes are durable.
fn reply(outcomes: Vec<Outcome>) {
    #[cfg(feature = "kill-points")]
    for (_, result) in &outcomes {
        if let Ok(written) = result {
            crate::kill_points::durable(written.head);
        }
    }
    for (job, result) in outcomes {
        let _ = job.reply.send((result, job.write));
    }
}

/// Writes committed with their frames not yet flushed, handed by the writer to the flusher
/// thread, which flushes them while the writer commits the next batch.
#[derive(Debug, Default)]
struct Unflushed {
    state: Mutex<Handed>,
    handed: Condvar,
}

#[derive(Debug, Default)]
struct Handed {
    outcomes: Vec<Outcome>,
    /// The writer is done: flush what is left, then stop.
    closed: bool,
    /// A flush failed. Nothing committed since is known to be durable, and a later flush
    /// that succeeds proves nothing (the kernel may have dropped the pages that failed), so
    /// every write from then on is reported failed.
    failed: Option<String>,
}

impl Unflushed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Handed> {
        // Every update is one push, one take or one flag: a panic cannot tear it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hand_off(&self, outcomes: Vec<Outcome>) {
        self.lock().outcomes.extend(outcomes);
        self.handed.notify_one();
    }

    /// What was handed off and not yet taken by the flusher.
    fn take(&self) -> Vec<Outcome> {
        std::mem::take(&mut self.lock().outcomes)
    }

    fn failed(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    fn fail(&self, message: &str) {
        let mut handed = self.lock();
        if handed.failed.is_none() {
            tracing::error!(%message, "event log flush failed; the writer stops");
            handed.failed = Some(message.to_owned());
        }
    }

    /// Flushes the WAL, then tells the callers of `outcomes`. A write that committed is
    /// reported committed only if no flush, this one or the other thread's, has failed by
    /// the time this one returns: the frames a failed flush lost may precede this one's,
    /// and recovery stops at the first missing frame. Otherwise every such write is
    /// reported failed, and the failure is returned (and kept).
    fn flush_and_reply(
        &self,
        wal: &mut WalFlush,
        mut outcomes: Vec<Outcome>,
    ) -> Result<(), String> {
        let failed = || self.failed().map_or(Ok(()), Err);
        let flushed = failed().and_then(|()| {
            if outcomes.iter().any(|(_, result)| result.is_ok()) {
                wal.flush()
                    .map_err(|e| format!("the event log could not be flushed to disk: {e}"))
                    .and_then(|()| failed())
            } else {
                Ok(())
            }
        });
        if let Err(message) = &flushed {
            self.fail(message);
            for (_, result) in &mut outcomes {
                if result.is_ok() {
                    *result = Err(message.clone());
                }
            }
        }
        reply(outcomes);
        flushed
    }

    fn close(&self) {
        self.lock().closed = true;
        self.handed.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// Flushes what the writer hands off, until the writer is done and nothing is left.
fn run_flusher(unflushed: &Unflushed, mut wal: WalFlush) {
    loop {
        let outcomes = {
            let mut handed = unflushed.lock();
            // Ends: when the writer hands off work or closes (it closes when it stops).
            while handed.outcomes.is_empty() && !handed.closed {
                handed = unflushed
                    .handed
                    .wait(handed)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if handed.outcomes.is_empty() {
                return;
            }
            std::mem::take(&mut handed.outcomes)
        };
        // A failure is kept in `unflushed`, where the writer finds it and stops.
        let _ = unflushed.flush_and_reply(&mut wal, outcomes);
    }
}

/// Commits `jobs` in one transaction; when that fails, each on its own.
///
/// When a write of an execution fails, the writes of that execution queued before the
/// failure (later in this batch, or waiting in `queue`) are refused, not written: their
/// caller queued them before it could hear of the failure (an engine issues its next batch
/// while the last is being written), and writing them would leave a hole in the log (a
/// turn's end lost, the next turn's start kept). `refusing` counts, per execution, the
/// queued writes still to refuse; a write queued after the failure was heard is made. The
/// failure is replied at once (nothing of it was written, so there is nothing to flush),
/// so that a caller about to queue its next write can see it first.
fn commit(
    store: &mut Store,
    jobs: Vec<Job>,
    queue: &Queue,
    refusing: &mut std::collections::HashMap<String, (usize, String)>,
) -> Vec<Outcome> {
    let mut refused: Vec<Outcome> = Vec::new();
    let mut kept: Vec<Job> = Vec::with_capacity(jobs.len());
    for job in jobs {
        match refuse(refusing, &job.write.execution_id) {
            Some(message) => refused.push((job, Err(message))),
            None => kept.push(job),
        }
    }
    reply(refused);
    if kept.is_empty() {
        return Vec::new();
    }
    let writes: Vec<&Write> = kept.iter().map(|job| &job.write).collect();
    match store.apply(&writes) {
        Ok(written) => kept.into_iter().zip(written.into_iter().map(Ok)).collect(),
        Err(error) => {
            // One bad write must not fail every execution that shared its batch: retry
            // each on its own (the failed transaction wrote nothing, and the heads it
            // touched were dropped from the cache, so they are re-read).
            tracing::warn!(%error, writes = kept.len(), "event log batch failed; retrying writes one by one");
            let mut outcomes = Vec::with_capacity(kept.len());
            let mut failed_now: Vec<Outcome> = Vec::new();
            // Executions whose write failed in this batch, with the failure: their later
            // writes in it were queued before it.
            let mut failed_here: std::collections::HashMap<String, String> =
                std::collections::HashMap::new();
            for job in kept {
                if let Some(first) = failed_here.get(&job.write.execution_id) {
                    let message = after_failure(first);
                    failed_now.push((job, Err(message)));
                    continue;
                }
                match store.apply_one(&job.write) {
                    Ok(written) => outcomes.push((job, Ok(written))),
                    Err(error) => {
                        let message = error.to_string();
                        tracing::error!(%message, "event log write failed");
                        let execution = job.write.execution_id.clone();
                        // A lost batch of events dooms every later write of the
                        // execution in this writer, not only those queued now: a caller
                        // may queue its next batch after the failure but before it hears
                        // of it, and that batch would follow the hole too. (The engine
                        // writes nothing once it has heard; `resume` runs in a process
                        // with a writer of its own.) A failed write of archive blocks
                        // alone leaves no hole: only what was queued behind it is refused.
                        let queued = if job.write.events.is_empty() {
                            queue
                                .lock()
                                .jobs
                                .iter()
                                .filter(|queued| queued.write.execution_id == execution)
                                .count()
                        } else {
                            FOR_GOOD
                        };
                        refusing.insert(execution.clone(), (queued, message.clone()));
                        failed_here.insert(execution, message.clone());
                        failed_now.push((job, Err(message)));
                    }
                }
            }
            reply(failed_now);
            outcomes
        }
    }
}

/// Whether the next write of `execution` taken from the queue is refused (it was queued
/// before one of its writes failed), with the reason.
fn refuse(
    refusing: &mut std::collections::HashMap<String, (usize, String)>,
    execution: &str,
) -> Option<String> {
    let (left, first) = refusing.get_mut(execution)?;
    if *left == FOR_GOOD {
        return Some(after_failure(first));
    }
    if *left == 0 {
        refusing.remove(execution);
        return None;
    }
    *left -= 1;
    Some(after_failure(first))
}

/// The count of writes to refuse after a lost batch of events: all of them.
const FOR_GOOD: usize = usize::MAX;

fn after_failure(first: &str) -> String {
    format!("an earlier write of this execution failed ({first}); nothing after it is written")
}

fn run_writer(mut store: Store, queue: &Queue, checkpoint: &mpsc::SyncSender<()>) {
    // The connection commits without flushing, and the writer flushes before it replies:
    // itself when nothing else is queued, else through the flusher thread, so that one
    // batch's flush and the next batch's inserts overlap.
    let wal = match store.defer_flush() {
        Ok(wal) => wal,
        Err(error) => {
            tracing::warn!(%error, "event log: SQLite flushes each commit itself");
            None
        }
    };
    let unflushed = Unflushed::default();
    thread::scope(|scope| {
        if let Some(wal) = &wal {
            let flusher = wal.another();
            let unflushed = &unflushed;
            if let Err(error) = thread::Builder::new()
                .name("nerve-log-flush".into())
                .spawn_scoped(scope, move || run_flusher(unflushed, flusher))
            {
                // Without the thread, the writer flushes every batch itself.
                tracing::warn!(%error, "event log: no flusher thread");
                unflushed.close();
            }
        }
        // However the writer ends, even by a panic, the flusher flushes what it was handed
        // and stops, and this thread ends after it (the scope waits for it).
        let _done = Done(&unflushed);
        write_batches(&mut store, queue, checkpoint, wal, &unflushed);
    });
}

/// Closes the hand-off when dropped.
struct Done<'a>(&'a Unflushed);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

fn write_batches(
    store: &mut Store,
    queue: &Queue,
    checkpoint: &mpsc::SyncSender<()>,
    mut wal: Option<WalFlush>,
    unflushed: &Unflushed,
) {
    // How the previous batch went: with company, the next one waits a moment for it.
    let (mut last_jobs, mut last_commit) = (0usize, Duration::ZERO);
    // Rows committed since the checkpointer was last asked to run.
    let mut unchecked = 0usize;
    // Executions with a failed write, and how many of their queued writes to refuse.
    let mut refusing = std::collections::HashMap::new();
    // Group commit proper. Appenders woken by the last commit are still producing their
    // next event; committing the moment the first arrives would pay a whole flush for a
    // handful of them. So when the last batch had company, wait for as many again while
    // they keep coming, for at most half as long as the last commit took. A lone appender
    // never waits.
    while let Some(jobs) = queue.next_batch(
        if last_jobs > 1 { last_jobs } else { 0 },
        (last_commit / 2).min(MAX_GATHER),
    ) {
        if let Some(message) = unflushed.failed() {
            reply(
                jobs.into_iter()
                    .map(|job| (job, Err(message.clone())))
                    .collect(),
            );
            return;
        }
        let weight: usize = jobs.iter().map(|job| job.write.weight()).sum();
        last_jobs = jobs.len();
        let committing_since = Instant::now();
        let outcomes = commit(store, jobs, queue, &mut refusing);
        unchecked += weight;
        if unchecked >= CHECKPOINT_EVERY_ROWS {
            // Full: it is still busy with the previous request, which will cover this one.
            let _ = checkpoint.try_send(());
            unchecked = 0;
        }
        match wal.as_mut() {
            // SQLite flushed the commit itself.
            None => reply(outcomes),
            // Nothing to overlap the flush with (or no flusher): flush here, sparing the
            // hop to another thread, for this batch and whatever the flusher has not taken.
            Some(wal) if queue.is_idle() || unflushed.is_closed() => {
                let mut all = unflushed.take();
                all.extend(outcomes);
                if unflushed.flush_and_reply(wal, all).is_err() {
                    return;
                }
            }
            Some(_) => unflushed.hand_off(outcomes),
        }
        last_commit = committing_since.elapsed();
    }
}

#[async_trait]
impl EventSink for SqliteSink {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let event = encode_event(&event, &self.redactor)
            .map_err(|e| SinkError::from(SessionError::Encode(e)))?;
        let written = self
            .submit(Write::events(execution.to_string(), vec![event]))
            .await
            .map_err(SinkError::from)?;
        written
            .seqs
            .first()
            .copied()
            .ok_or_else(|| SinkError::Write("the writer returned no sequence number".into()))
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
        let has_checkpoint = checkpoint.is_some();
        let Some(write) = self.batch_write(execution, &events, checkpoint)? else {
            return Ok(None);
        };
        let written = self.submit(write).await.map_err(SinkError::from)?;
        Ok(has_checkpoint.then_some(written.head))
    }

    /// Encodes the batch here and queues it at once: its place in the order is taken
    /// before this returns.
    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        let has_checkpoint = checkpoint.is_some();
        let write = match self.batch_write(execution, &events, checkpoint) {
            Ok(Some(write)) => write,
            Ok(None) => return Enqueued::Placed(Box::pin(std::future::ready(Ok(None)))),
            Err(error) => return Enqueued::Placed(Box::pin(std::future::ready(Err(error)))),
        };
        let (reply, answer) = oneshot::channel();
        let queued = self.jobs.push(Job { write, reply });
        Enqueued::Placed(Box::pin(async move {
            if !queued {
                return Err(SinkError::from(SessionError::WriterGone));
            }
            match answer.await {
                Ok((Ok(written), _)) => Ok(has_checkpoint.then_some(written.head)),
                Ok((Err(message), _)) => Err(SessionError::Write(message).into()),
                Err(_) => Err(SessionError::WriterGone.into()),
            }
        }))
    }
}

impl SqliteSink {
    /// The write of one batch (`None` when there is nothing to write), encoded and redacted
    /// on the caller's thread.
    fn batch_write(
        &self,
        execution: ExecutionId,
        events: &[Event],
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<Write>, SinkError> {
        encode_batch(
            execution.to_string(),
            events,
            checkpoint.as_ref(),
            &self.redactor,
        )
        .map_err(|e| SinkError::from(SessionError::Encode(e)))
    }
}

#[async_trait]
impl EventStore for SqliteSink {
    async fn append_all(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
    ) -> Result<Vec<u64>, SessionError> {
        let encoded = self.encode_all(&events)?;
        Ok(self
            .submit(Write::events(execution.to_string(), encoded))
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
        Ok(self.submit(write).await?.head)
    }

    async fn put_blocks(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
    ) -> Result<u64, SessionError> {
        let write = encode_blocks(execution.to_string(), &blocks, None, &self.redactor)?;
        Ok(self.submit(write).await?.head)
    }

    async fn compact(
        &self,
        execution: ExecutionId,
        blocks: Vec<NewBlock>,
        compaction: Compaction,
    ) -> Result<u64, SessionError> {
        let event = Event::Compaction(compaction);
        let write = encode_blocks(execution.to_string(), &blocks, Some(&event), &self.redactor)?;
        Ok(self.submit(write).await?.head)
    }

    async fn events(&self, execution: ExecutionId) -> Result<Vec<StoredEvent>, SessionError> {
        self.read(move |store| store.events(&execution)).await
    }

    async fn replay(&self, execution: ExecutionId) -> Result<Replay, SessionError> {
        self.read(move |store| store.replay(&execution)).await
    }

    async fn verify(
        &self,
        execution: ExecutionId,
    ) -> Result<Result<u64, ChainError>, SessionError> {
        self.read(move |store| store.verify(&execution)).await
    }

    async fn executions(&self) -> Result<Vec<ExecutionSummary>, SessionError> {
        self.read(Store::executions).await
    }

    async fn executions_with_prefix(
        &self,
        prefix: String,
        limit: usize,
    ) -> Result<Vec<ExecutionId>, SessionError> {
        self.read(move |store| store.executions_with_prefix(&prefix, limit))
            .await
    }

    async fn execution(&self, execution: ExecutionId) -> Result<ExecutionSummary, SessionError> {
        self.read(move |store| store.execution(&execution)).await
    }

    async fn latest_checkpoint(
        &self,
        execution: ExecutionId,
    ) -> Result<Option<StoredCheckpoint>, SessionError> {
        self.read(move |store| store.latest_checkpoint(&execution))
            .await
    }

    async fn resume_point(&self, execution: ExecutionId) -> Result<ResumePoint, SessionError> {
        self.read(move |store| store.resume_point(&execution)).await
    }

    async fn archive_block(
        &self,
        execution: ExecutionId,
        block: BlockId,
    ) -> Result<Option<ArchiveBlock>, SessionError> {
        self.read(move |store| store.archive_block(&execution, &block))
            .await
    }

    async fn search_archive(
        &self,
        execution: ExecutionId,
        query: String,
        limit: usize,
    ) -> Result<Vec<ArchiveHit>, SessionError> {
        self.read(move |store| store.search_archive(&execution, &query, limit))
            .await
    }
    async fn export(&self, execution: ExecutionId) -> Result<ExecutionLog, SessionError> {
        self.read(move |store| store.export(&execution)).await
    }

    async fn import(&self, log: ExecutionLog) -> Result<u64, SessionError> {
        // Its own writing connection: the events keep their times and hashes, which the
        // group-committing writer never does.
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || Store::open(&path)?.import(&log))
            .await
            .map_err(|_| SessionError::WriterGone)?
    }
}

/// The archive port `nerve-brain` compacts into: blocks are stored beside the log, redacted
/// like every payload, searchable with FTS5.
#[async_trait]
impl ContextArchive for SqliteSink {
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
    use nerve_core::TaskStatus;
    use nerve_core::event::TaskTransition;

    use super::*;

    /// Where a job's caller hears of it.
    type Answer = oneshot::Receiver<(Result<Written, String>, Write)>;

    /// A write with one event, its job, and where the job's caller hears of it.
    fn job() -> (Job, Answer) {
        let event = Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        });
        let encoded = encode_event(&event, &Redactor::new()).unwrap();
        let (reply, answer) = oneshot::channel();
        let write = Write::events(ExecutionId::new().to_string(), vec![encoded]);
        (Job { write, reply }, answer)
    }

    fn committed() -> Result<Written, String> {
        Ok(Written {
            seqs: vec![1],
            head: 1,
        })
    }

    fn heard(
        answer: oneshot::Receiver<(Result<Written, String>, Write)>,
    ) -> Result<Written, String> {
        answer.blocking_recv().unwrap().0
    }

    /// A WAL that exists, so its flush succeeds.
    fn wal() -> (tempfile::TempDir, WalFlush) {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("log.db");
        std::fs::write(dir.path().join("log.db-wal"), b"frames").unwrap();
        let wal = WalFlush::new(database.to_str().unwrap());
        (dir, wal)
    }

    /// A job of `execution`: one event, or (with `block`) an archive block.
    fn job_of(execution: &str, block: Option<nerve_core::BlockId>) -> (Job, Answer) {
        let write = match block {
            Some(block_id) => crate::encode::encode_blocks(
                execution.to_owned(),
                &[NewBlock {
                    block_id,
                    messages: Vec::new(),
                    note: "note".into(),
                }],
                None,
                &Redactor::new(),
            )
            .unwrap(),
            None => {
                let mut job = job().0.write;
                job.execution_id = execution.to_owned();
                job
            }
        };
        let (reply, answer) = oneshot::channel();
        (Job { write, reply }, answer)
    }

    /// A write that fails leaves no hole: the writes of its execution queued before the
    /// failure (later in its batch, or waiting in the queue) are refused; one queued after
    /// it is made, and other executions are not touched.
    #[test]
    fn writes_queued_behind_a_failed_one_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("log.db")).unwrap();
        let (x, y) = (
            ExecutionId::new().to_string(),
            ExecutionId::new().to_string(),
        );
        let block = nerve_core::BlockId::new();
        let (first, first_hears) = job_of(&x, Some(block));
        let queue = Queue::default();
        let mut refusing = std::collections::HashMap::new();
        reply(commit(&mut store, vec![first], &queue, &mut refusing));
        assert!(heard(first_hears).is_ok());

        // The same block again fails; X's event behind it in the batch and X's event
        // waiting in the queue are refused; Y's event is written.
        let (again, again_hears) = job_of(&x, Some(block));
        let (behind, behind_hears) = job_of(&x, None);
        let (other, other_hears) = job_of(&y, None);
        let (waiting, waiting_hears) = job_of(&x, None);
        assert!(queue.push(waiting));
        reply(commit(
            &mut store,
            vec![again, behind, other],
            &queue,
            &mut refusing,
        ));
        assert!(heard(again_hears).is_err());
        let refused = heard(behind_hears).unwrap_err();
        assert!(
            refused.contains("an earlier write of this execution failed"),
            "{refused}"
        );
        assert!(heard(other_hears).is_ok());
        let waiting = queue.next_batch(0, Duration::ZERO).unwrap();
        reply(commit(&mut store, waiting, &queue, &mut refusing));
        assert!(heard(waiting_hears).is_err());

        // Queued after the failure was heard: written, right after X's first write.
        let (after, after_hears) = job_of(&x, None);
        reply(commit(&mut store, vec![after], &queue, &mut refusing));
        assert_eq!(heard(after_hears).unwrap().seqs, [1]);
    }

    /// A lost batch of events dooms the execution in this writer for good: unlike a lost
    /// archive block, a write queued after the failure was heard is refused too (it may
    /// have been queued before its caller heard, and would follow the hole). Other
    /// executions write on.
    #[test]
    fn a_lost_batch_of_events_refuses_every_later_write_of_its_execution() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("log.db")).unwrap();
        let (x, y) = (
            ExecutionId::new().to_string(),
            ExecutionId::new().to_string(),
        );
        let block = nerve_core::BlockId::new();
        let queue = Queue::default();
        let mut refusing = std::collections::HashMap::new();
        let (first, first_hears) = job_of(&x, Some(block));
        reply(commit(&mut store, vec![first], &queue, &mut refusing));
        assert!(heard(first_hears).is_ok());

        // Events with the same block again: the whole write fails, its events are lost.
        let event = Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        });
        let write = crate::encode::encode_blocks(
            x.clone(),
            &[NewBlock {
                block_id: block,
                messages: Vec::new(),
                note: "note".into(),
            }],
            Some(&event),
            &Redactor::new(),
        )
        .unwrap();
        assert!(!write.events.is_empty());
        let (reply_to, lost_hears) = oneshot::channel();
        let (other, other_hears) = job_of(&y, None);
        reply(commit(
            &mut store,
            vec![
                Job {
                    write,
                    reply: reply_to,
                },
                other,
            ],
            &queue,
            &mut refusing,
        ));
        assert!(heard(lost_hears).is_err());
        assert!(heard(other_hears).is_ok());

        // Queued long after the failure was heard: still refused, each time.
        for _ in 0..3 {
            let (later, later_hears) = job_of(&x, None);
            reply(commit(&mut store, vec![later], &queue, &mut refusing));
            let refused = heard(later_hears).unwrap_err();
            assert!(
                refused.contains("an earlier write of this execution failed"),
                "{refused}"
            );
        }
        let (y_again, y_again_hears) = job_of(&y, None);
        reply(commit(&mut store, vec![y_again], &queue, &mut refusing));
        assert_eq!(heard(y_again_hears).unwrap().seqs, [2]);
    }

    #[test]
    fn committed_writes_are_reported_after_the_flush() {
        let (_dir, mut wal) = wal();
        let ((first, first_hears), (second, second_hears)) = (job(), job());
        let outcomes = vec![(first, committed()), (second, Err("refused".to_owned()))];
        Unflushed::default()
            .flush_and_reply(&mut wal, outcomes)
            .unwrap();
        assert_eq!(heard(first_hears), committed());
        assert_eq!(heard(second_hears), Err("refused".to_owned()));
    }

    #[test]
    fn a_failed_flush_reports_every_committed_write_failed() {
        // The WAL is not there: the flush fails, so the commit is not known to be on disk.
        let dir = tempfile::tempdir().unwrap();
        let mut wal = WalFlush::new(dir.path().join("log.db").to_str().unwrap());
        let ((first, first_hears), (second, second_hears)) = (job(), job());
        let outcomes = vec![(first, committed()), (second, Err("refused".to_owned()))];
        let unflushed = Unflushed::default();
        let message = unflushed.flush_and_reply(&mut wal, outcomes).unwrap_err();
        assert!(
            message.starts_with("the event log could not be flushed to disk"),
            "{message}"
        );
        assert_eq!(heard(first_hears), Err(message.clone()));
        assert_eq!(heard(second_hears), Err("refused".to_owned()));
        // Kept: the writer stops, and no later flush is believed.
        assert_eq!(unflushed.failed(), Some(message));
    }

    #[test]
    fn a_flush_on_one_thread_proves_nothing_once_the_other_failed() {
        let (_dir, mut wal) = wal();
        let unflushed = Unflushed::default();
        unflushed.fail("the event log could not be flushed to disk: EIO");
        let (job, hears) = job();
        let message = unflushed
            .flush_and_reply(&mut wal, vec![(job, committed())])
            .unwrap_err();
        assert_eq!(heard(hears), Err(message));
    }

    #[test]
    fn after_a_failed_flush_no_later_write_is_reported_durable() {
        let (_dir, wal) = wal();
        let unflushed = Unflushed::default();
        unflushed.fail("the event log could not be flushed to disk: EIO");
        let (late, late_hears) = job();
        unflushed.hand_off(vec![(late, committed())]);
        unflushed.close();
        // It would flush successfully now, and must not take that as proof.
        run_flusher(&unflushed, wal);
        assert_eq!(
            heard(late_hears),
            Err("the event log could not be flushed to disk: EIO".to_owned())
        );
    }

    #[test]
    fn the_flusher_reports_what_it_was_handed_and_stops_when_closed() {
        let (_dir, wal) = wal();
        let unflushed = Unflushed::default();
        let answers: Vec<_> = (0..3)
            .map(|_| {
                let (job, answer) = job();
                unflushed.hand_off(vec![(job, committed())]);
                answer
            })
            .collect();
        unflushed.close();
        run_flusher(&unflushed, wal);
        for answer in answers {
            assert_eq!(heard(answer), committed());
        }
        assert!(unflushed.take().is_empty());
    }
}
