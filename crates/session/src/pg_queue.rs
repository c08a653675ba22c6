//! The start of the task queue on the PostgreSQL log: `submit` queues an execution (its run
//! options as redacted JSON), workers `claim` the oldest ready one with `FOR UPDATE SKIP
//! LOCKED` under a lease they `renew`, and `release` it when done (or give it back). A
//! claim whose lease ran out (its worker died or stalled) is ready again; the stale worker's
//! `renew` and `release` then fail, so it learns it lost the execution.
//!
//! A worker registers the leases it holds with [`PgStore::hold_lease`]: from then on every
//! write of that execution from this process commits only while the server still records
//! the lease as the worker's and unexpired (checked inside the append transaction, see
//! `pg.rs`), so a worker that lost its lease can never append to that execution again.
//!
//! Cancelling a queued execution ends it at once; cancelling a claimed one asks its
//! worker (through `renew`) to stop it, at once, when it next renews the lease.

use std::time::Duration;

use nerve_core::ExecutionId;
use serde::Serialize;
use tokio::sync::mpsc;

use crate::SessionError;
use crate::chain::StoredEvent;
use crate::encode::redacted_json;
use crate::pg::{HeldLease, PgStore};
use crate::store::to_i64;

/// A claimed execution: what to run, and how many times it has been claimed (1 the first
/// time; more when a worker's lease ran out before it finished).
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub execution_id: ExecutionId,
    pub spec: serde_json::Value,
    pub claims: u32,
}

/// A queue entry as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueEntry {
    pub execution_id: String,
    /// `queued`, `claimed`, `finished`, `cancelled` or `failed`.
    pub state: String,
    pub worker: Option<String>,
    pub claims: u32,
    /// Why a worker could not run it (`failed` only).
    pub error: Option<String>,
    /// The run options it was submitted with (redacted).
    pub spec: serde_json::Value,
}

/// What [`PgStore::renew`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Still the worker's, now until the new deadline.
    Held,
    /// Still the worker's, but someone ran `nerve cancel`: stop at the next boundary.
    CancelRequested,
    /// No longer the worker's: it ran out and another worker claimed the execution, or it
    /// ended. The worker must stop that execution; its appends are refused.
    Lost,
}

/// What [`PgStore::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancelled {
    /// It was queued and is now cancelled: no worker will run it.
    Queued,
    /// A worker runs it; the worker stops it when it next renews the lease.
    Requested,
    /// It was neither queued nor running (finished, failed, cancelled, or not in the queue).
    NotWaiting,
}

fn millis(lease: Duration) -> f64 {
    lease.as_secs_f64() * 1000.0
}

impl PgStore {
    /// Queues `execution` with its run options `spec` (redacted like every payload).
    /// Refused when the execution was submitted before.
    pub async fn submit(
        &self,
        execution: ExecutionId,
        spec: &serde_json::Value,
    ) -> Result<(), SessionError> {
        let spec = redacted_json(spec, &self.redactor)?;
        let client = self.client().await?;
        let made = client
            .execute(
                "INSERT INTO queue (execution_id, spec) VALUES ($1, $2)
                 ON CONFLICT (execution_id) DO NOTHING",
                &[&execution.to_string(), &spec],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        if made == 0 {
            return Err(SessionError::Write(format!(
                "execution {execution} was submitted before"
            )));
        }
        self.notify_queue().await
    }

    /// Claims the oldest ready execution for `worker` until `lease` from now: one queued, or
    /// one whose claim's lease ran out. Concurrent workers skip each other's locked rows,
    /// so no execution is claimed twice at once. `None` when nothing is ready.
    pub async fn claim(
        &self,
        worker: &str,
        lease: Duration,
    ) -> Result<Option<Claim>, SessionError> {
        let client = self.client().await?;
        // A cancelled execution whose worker died is not taken up again.
        client
            .execute(
                "UPDATE queue SET state = 'cancelled', worker = NULL, lease_until = NULL
                 WHERE state = 'claimed' AND cancel_requested
                   AND lease_until < clock_timestamp()",
                &[],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let row = client
            .query_opt(
                "UPDATE queue SET state = 'claimed', worker = $1, claims = claims + 1,
                        lease_until = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE execution_id = (
                     SELECT execution_id FROM queue
                     WHERE state = 'queued'
                        OR (state = 'claimed' AND NOT cancel_requested
                            AND lease_until < clock_timestamp())
                     ORDER BY submitted_at, execution_id
                     LIMIT 1 FOR UPDATE SKIP LOCKED)
                 RETURNING execution_id, spec, claims",
                &[&worker, &millis(lease)],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let got = || -> Result<(String, String, i32), tokio_postgres::Error> {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        };
        let (id, spec, claims) = got().map_err(|e| self.db_err(&e))?;
        Ok(Some(Claim {
            execution_id: id
                .parse()
                .map_err(|e| SessionError::Corrupt(format!("queued execution id {id:?}: {e}")))?,
            spec: serde_json::from_str(&spec).map_err(|e| {
                SessionError::Corrupt(format!("queued execution {id}: spec does not decode: {e}"))
            })?,
            claims: u32::try_from(claims).unwrap_or(0),
        }))
    }

    /// Extends `worker`'s lease on `execution` to `lease` from now, and says whether the
    /// worker still holds it and whether a cancel was asked for.
    pub async fn renew(
        &self,
        execution: ExecutionId,
        worker: &str,
        lease: Duration,
    ) -> Result<LeaseState, SessionError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE queue SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
                 WHERE execution_id = $1 AND worker = $2 AND state = 'claimed'
                   AND lease_until > clock_timestamp()
                 RETURNING cancel_requested",
                &[&execution.to_string(), &worker, &millis(lease)],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(match row {
            None => LeaseState::Lost,
            Some(row) if row.try_get::<_, bool>(0).map_err(|e| self.db_err(&e))? => {
                LeaseState::CancelRequested
            }
            Some(_) => LeaseState::Held,
        })
    }

    /// Ends `worker`'s claim on `execution`: `finished`, or given back to the queue (a
    /// draining worker; another worker resumes it). A cancel asked for meanwhile ends it
    /// `cancelled` either way. False when the worker no longer held it.
    pub async fn release(
        &self,
        execution: ExecutionId,
        worker: &str,
        finished: bool,
    ) -> Result<bool, SessionError> {
        let client = self.client().await?;
        let released = client
            .execute(
                "UPDATE queue SET state = CASE WHEN cancel_requested THEN 'cancelled'
                                               WHEN $3 THEN 'finished' ELSE 'queued' END,
                        worker = NULL, lease_until = NULL
                 WHERE execution_id = $1 AND worker = $2 AND state = 'claimed'",
                &[&execution.to_string(), &worker, &finished],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        self.drop_lease(execution);
        Ok(released == 1)
    }

    /// Ends `worker`'s claim on `execution` as `failed`: the worker could not run it (a
    /// workspace it cannot reach, a spec it cannot read, a log it may not resume). False
    /// when the worker no longer held it.
    pub async fn fail(
        &self,
        execution: ExecutionId,
        worker: &str,
        error: &str,
    ) -> Result<bool, SessionError> {
        let error = self.redactor.redact(error);
        let client = self.client().await?;
        let failed = client
            .execute(
                "UPDATE queue SET state = 'failed', error = $3, worker = NULL, lease_until = NULL
                 WHERE execution_id = $1 AND worker = $2 AND state = 'claimed'",
                &[&execution.to_string(), &worker, &error.as_ref()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        self.drop_lease(execution);
        Ok(failed == 1)
    }

    /// Puts a finished execution back in the queue (a parked one whose approval was just
    /// decided), so a worker resumes it. False when it was not finished in the queue.
    pub async fn requeue(&self, execution: ExecutionId) -> Result<bool, SessionError> {
        let client = self.client().await?;
        let requeued = client
            .execute(
                "UPDATE queue SET state = 'queued', worker = NULL, lease_until = NULL
                 WHERE execution_id = $1 AND state = 'finished'",
                &[&execution.to_string()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        if requeued == 1 {
            self.notify_queue().await?;
        }
        Ok(requeued == 1)
    }

    /// Cancels a queued execution, or asks the worker running it to stop it at its next
    /// turn boundary.
    pub async fn cancel(&self, execution: ExecutionId) -> Result<Cancelled, SessionError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "UPDATE queue SET
                        state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
                        cancel_requested = (state = 'claimed')
                 WHERE execution_id = $1 AND state IN ('queued', 'claimed')
                 RETURNING state",
                &[&execution.to_string()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let Some(row) = row else {
            return Ok(Cancelled::NotWaiting);
        };
        let state: String = row.try_get(0).map_err(|e| self.db_err(&e))?;
        Ok(if state == "cancelled" {
            Cancelled::Queued
        } else {
            Cancelled::Requested
        })
    }

    /// From now on, every write of `execution` from this process commits only while
    /// `worker` holds its lease (checked in the append transaction).
    pub fn hold_lease(&self, execution: ExecutionId, worker: &str) {
        if let Ok(mut leases) = self.leases.lock() {
            leases.insert(
                execution.to_string(),
                HeldLease {
                    worker: worker.to_owned(),
                    lost: false,
                },
            );
        }
    }

    /// Whether a write of `execution` was refused because its lease was lost.
    pub fn lease_lost(&self, execution: ExecutionId) -> bool {
        self.leases
            .lock()
            .ok()
            .and_then(|leases| leases.get(&execution.to_string()).map(|l| l.lost))
            .unwrap_or(false)
    }

    /// Stops checking a lease for `execution` (the worker released it).
    pub fn drop_lease(&self, execution: ExecutionId) {
        if let Ok(mut leases) = self.leases.lock() {
            leases.remove(&execution.to_string());
        }
    }

    pub(crate) fn lease_of(&self, execution: &str) -> Option<String> {
        self.leases
            .lock()
            .ok()
            .and_then(|leases| leases.get(execution).map(|l| l.worker.clone()))
    }

    /// Wakes idle workers (`LISTEN nerve_queue`).
    async fn notify_queue(&self) -> Result<(), SessionError> {
        let client = self.client().await?;
        client
            .execute("SELECT pg_notify('nerve_queue', '')", &[])
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(())
    }

    /// The events of `execution` after sequence number `after`, in order (none when it has
    /// none yet).
    pub async fn events_after(
        &self,
        execution: ExecutionId,
        after: u64,
    ) -> Result<Vec<StoredEvent>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash
                 FROM events WHERE execution_id = $1 AND seq > $2 ORDER BY seq",
                &[&execution.to_string(), &to_i64(after)],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| crate::pg::stored_event(row).map_err(|e| self.db_err(&e)))
            .collect()
    }

    /// A connection of its own that listens on `channel` (`nerve_events`: the id of each
    /// execution a commit appended to; `nerve_queue`: a submit). Notifications arrive on
    /// the returned [`Listener`] until it is dropped.
    pub async fn listen(&self, channel: &str) -> Result<Listener, SessionError> {
        let (client, mut connection) = self
            .config
            .connect(self.tls.make.clone())
            .await
            .map_err(|e| self.db_err(&e))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            loop {
                let message = std::future::poll_fn(|cx| connection.poll_message(cx)).await;
                match message {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(note))) => {
                        if tx.send(note.payload().to_owned()).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => return,
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(Listener {
            _client: client,
            notes: rx,
            driver,
        })
    }

    /// The queue entry of `execution`, if it was submitted.
    pub async fn queue_entry(
        &self,
        execution: ExecutionId,
    ) -> Result<Option<QueueEntry>, SessionError> {
        let id = execution.to_string();
        Ok(self
            .queue()
            .await?
            .into_iter()
            .find(|entry| entry.execution_id == id))
    }

    /// Every queue entry, oldest first.
    pub async fn queue(&self) -> Result<Vec<QueueEntry>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT execution_id, state, worker, claims, error, spec FROM queue
                 ORDER BY submitted_at, execution_id",
                &[],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(QueueEntry {
                    execution_id: row.try_get(0)?,
                    state: row.try_get(1)?,
                    worker: row.try_get(2)?,
                    claims: u32::try_from(row.try_get::<_, i32>(3)?).unwrap_or(0),
                    error: row.try_get(4)?,
                    spec: serde_json::from_str(&row.try_get::<_, String>(5)?)
                        .unwrap_or(serde_json::Value::Null),
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }
}

/// Notifications of one channel (see [`PgStore::listen`]), on a connection of their own.
#[derive(Debug)]
pub struct Listener {
    _client: tokio_postgres::Client,
    notes: mpsc::UnboundedReceiver<String>,
    driver: tokio::task::JoinHandle<()>,
}

impl Listener {
    /// The next notification's payload, or `None` once `within` passed without one. An
    /// error when the connection ended (the server went away).
    pub async fn next(&mut self, within: Duration) -> Result<Option<String>, SessionError> {
        match tokio::time::timeout(within, self.notes.recv()).await {
            Ok(Some(payload)) => Ok(Some(payload)),
            Ok(None) => Err(SessionError::Database {
                log: "postgres".into(),
                message: "the listening connection ended".into(),
            }),
            Err(_) => Ok(None),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.driver.abort();
    }
}
