//! The single writer: one thread owns the write connection and commits whatever appends
//! have queued up in one transaction (group commit). Each append returns after the
//! transaction holding it has committed.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;

use async_trait::async_trait;
use nerve_core::{Event, EventSink, ExecutionId, Redactor, SinkError};
use tokio::sync::oneshot;

use crate::SessionError;
use crate::store::{EncodedEvent, Store};

/// The most appends committed in one transaction.
const MAX_BATCH: usize = 512;

struct Job {
    event: EncodedEvent,
    reply: oneshot::Sender<Result<u64, String>>,
}

/// The SQLite-backed [`EventSink`]. Cheap to share behind an `Arc`; concurrent executions
/// in one process share its writer.
#[derive(Debug)]
pub struct SqliteSink {
    jobs: mpsc::Sender<Job>,
    redactor: Arc<Redactor>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("kind", &self.event.kind).finish_non_exhaustive()
    }
}

impl SqliteSink {
    /// Opens the log at `path` and starts the writer thread. Every payload passes through
    /// `redactor` before it is written.
    pub fn open(path: &Path, redactor: Arc<Redactor>) -> Result<Self, SessionError> {
        let store = Store::open(path)?;
        let (jobs, queue) = mpsc::channel::<Job>();
        thread::Builder::new()
            .name("nerve-log-writer".into())
            .spawn(move || run_writer(store, &queue))
            .map_err(|_| SessionError::WriterGone)?;
        Ok(Self { jobs, redactor })
    }

    /// Serialises and redacts `event` the way the writer stores it.
    fn encode(&self, execution: ExecutionId, event: &Event) -> Result<EncodedEvent, SessionError> {
        let mut value = serde_json::to_value(event)?;
        redact_strings(&mut value, &self.redactor);
        Ok(EncodedEvent {
            execution_id: execution.to_string(),
            kind: event.kind().as_str(),
            version: nerve_core::event::EVENT_VERSION,
            payload: value.to_string(),
        })
    }
}

fn run_writer(mut store: Store, queue: &mpsc::Receiver<Job>) {
    while let Ok(first) = queue.recv() {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let batch: Vec<EncodedEvent> = jobs.iter().map(|job| job.event.clone()).collect();
        match store.append_batch(&batch) {
            Ok(seqs) => {
                for (job, seq) in jobs.into_iter().zip(seqs) {
                    let _ = job.reply.send(Ok(seq));
                }
            }
            Err(error) => {
                let message = error.to_string();
                tracing::error!(%message, events = jobs.len(), "event log append failed");
                for job in jobs {
                    let _ = job.reply.send(Err(message.clone()));
                }
            }
        }
    }
}

/// Replaces secrets in every string of `value` (object keys stay as they are: they are
/// ours, not data).
fn redact_strings(value: &mut serde_json::Value, redactor: &Redactor) {
    match value {
        serde_json::Value::String(text) => {
            if let std::borrow::Cow::Owned(redacted) = redactor.redact(text) {
                *text = redacted;
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(|item| redact_strings(item, redactor)),
        serde_json::Value::Object(map) => map.values_mut().for_each(|item| redact_strings(item, redactor)),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {}
    }
}

#[async_trait]
impl EventSink for SqliteSink {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let event = self.encode(execution, &event).map_err(|e| SinkError(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        self.jobs.send(Job { event, reply }).map_err(|_| SinkError(SessionError::WriterGone.to_string()))?;
        match answer.await {
            Ok(Ok(seq)) => Ok(seq),
            Ok(Err(message)) => Err(SinkError(message)),
            Err(_) => Err(SinkError(SessionError::WriterGone.to_string())),
        }
    }
}
