//! The start of the task queue on the PostgreSQL log: `submit` queues an execution (its run
//! options as redacted JSON), workers `claim` the oldest ready one with `FOR UPDATE SKIP
//! LOCKED` under a lease they `renew`, and `release` it when done (or give it back). A
//! claim whose lease ran out (its worker died or stalled) is ready again; the stale worker's
//! `renew` and `release` then fail, so it learns it lost the execution.
//!
//! Not yet wired: `nerve submit` / `nerve worker`, and the lease check inside the append
//! transaction (issue 22).

use std::time::Duration;

use nerve_core::ExecutionId;
use serde::Serialize;

use crate::SessionError;
use crate::encode::redacted_json;
use crate::pg::PgStore;

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
    /// `queued`, `claimed`, `finished` or `cancelled`.
    pub state: String,
    pub worker: Option<String>,
    pub claims: u32,
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
        Ok(())
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
        let row = client
            .query_opt(
                "UPDATE queue SET state = 'claimed', worker = $1, claims = claims + 1,
                        lease_until = clock_timestamp() + $2 * interval '1 millisecond'
                 WHERE execution_id = (
                     SELECT execution_id FROM queue
                     WHERE state = 'queued'
                        OR (state = 'claimed' AND lease_until < clock_timestamp())
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

    /// Extends `worker`'s lease on `execution` to `lease` from now. False when the worker
    /// no longer holds it (the lease ran out and another worker claimed it, or it was
    /// cancelled): the worker must stop that execution.
    pub async fn renew(
        &self,
        execution: ExecutionId,
        worker: &str,
        lease: Duration,
    ) -> Result<bool, SessionError> {
        let client = self.client().await?;
        let renewed = client
            .execute(
                "UPDATE queue SET lease_until = clock_timestamp() + $3 * interval '1 millisecond'
                 WHERE execution_id = $1 AND worker = $2 AND state = 'claimed'",
                &[&execution.to_string(), &worker, &millis(lease)],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(renewed == 1)
    }

    /// Ends `worker`'s claim on `execution`: `finished`, or given back to the queue (a
    /// draining worker). False when the worker no longer held it.
    pub async fn release(
        &self,
        execution: ExecutionId,
        worker: &str,
        finished: bool,
    ) -> Result<bool, SessionError> {
        let client = self.client().await?;
        let released = client
            .execute(
                "UPDATE queue SET state = CASE WHEN $3 THEN 'finished' ELSE 'queued' END,
                        worker = NULL, lease_until = NULL
                 WHERE execution_id = $1 AND worker = $2 AND state = 'claimed'",
                &[&execution.to_string(), &worker, &finished],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(released == 1)
    }

    /// Cancels a queued or claimed execution; its worker's next `renew` fails. False when
    /// it was not waiting or running.
    pub async fn cancel(&self, execution: ExecutionId) -> Result<bool, SessionError> {
        let client = self.client().await?;
        let cancelled = client
            .execute(
                "UPDATE queue SET state = 'cancelled', lease_until = NULL
                 WHERE execution_id = $1 AND state IN ('queued', 'claimed')",
                &[&execution.to_string()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(cancelled == 1)
    }

    /// Every queue entry, oldest first.
    pub async fn queue(&self) -> Result<Vec<QueueEntry>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT execution_id, state, worker, claims FROM queue
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
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }
}
