//! The fleet as the PostgreSQL log knows it, for the web view of `nerve serve`: the task
//! queue (newest first) and the workers, each of which says it is alive every few seconds
//! ([`PgStore::worker_seen`]) and that it stopped when it drains ([`PgStore::worker_stopped`]).
//! A worker killed outright never says it stopped: its last heartbeat grows old.

use serde::Serialize;

use crate::SessionError;
use crate::pg::PgStore;

/// The most queue entries and workers the fleet view reads.
const MOST: i64 = 200;

/// A timestamp column in the log's own fixed-width UTC form.
macro_rules! utc {
    ($column:literal) => {
        concat!(
            "to_char(",
            $column,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"
        )
    };
}

/// A task of the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetTask {
    pub execution_id: String,
    /// `queued`, `claimed`, `finished`, `cancelled` or `failed`.
    pub state: String,
    pub submitted_at: String,
    /// The worker that holds it (`claimed` only).
    pub worker: Option<String>,
    /// Until when its worker's lease holds (`claimed` only).
    pub lease_until: Option<String>,
    pub claims: u32,
    pub cancel_requested: bool,
    /// The task's text, as submitted (redacted).
    pub task: Option<String>,
    /// Why a worker could not run it (`failed` only).
    pub error: Option<String>,
}

/// A worker that said it is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FleetWorker {
    /// `host:pid`.
    pub worker: String,
    pub host: String,
    pub concurrency: u32,
    pub started_at: String,
    /// Its last heartbeat.
    pub last_seen: String,
    /// When it drained and stopped, if it said so.
    pub stopped_at: Option<String>,
    /// The executions it holds claims on now.
    pub executions: Vec<String>,
}

impl PgStore {
    /// Records that `worker` (on `host`, running at most `concurrency` executions) is
    /// alive now.
    pub async fn worker_seen(
        &self,
        worker: &str,
        host: &str,
        concurrency: u32,
    ) -> Result<(), SessionError> {
        let client = self.client().await?;
        let concurrency = i32::try_from(concurrency).unwrap_or(i32::MAX);
        client
            .execute(
                "INSERT INTO workers (worker, host, concurrency) VALUES ($1, $2, $3)
                 ON CONFLICT (worker) DO UPDATE
                 SET host = $2, concurrency = $3, last_seen = clock_timestamp(),
                     stopped_at = NULL",
                &[&worker, &host, &concurrency],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(())
    }

    /// Records that `worker` drained and stopped.
    pub async fn worker_stopped(&self, worker: &str) -> Result<(), SessionError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE workers SET stopped_at = clock_timestamp(), last_seen = clock_timestamp()
                 WHERE worker = $1",
                &[&worker],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(())
    }

    /// The latest tasks of the queue, newest first (at most 200).
    pub async fn fleet_tasks(&self) -> Result<Vec<FleetTask>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                concat!(
                    "SELECT execution_id, state, ",
                    utc!("submitted_at"),
                    ", worker, ",
                    utc!("lease_until"),
                    ", claims, cancel_requested, spec::jsonb->>'task', error
                     FROM queue ORDER BY submitted_at DESC, execution_id DESC LIMIT $1"
                ),
                &[&MOST],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(FleetTask {
                    execution_id: row.try_get(0)?,
                    state: row.try_get(1)?,
                    submitted_at: row.try_get(2)?,
                    worker: row.try_get(3)?,
                    lease_until: row.try_get(4)?,
                    claims: u32::try_from(row.try_get::<_, i32>(5)?).unwrap_or(0),
                    cancel_requested: row.try_get(6)?,
                    task: row.try_get(7)?,
                    error: row.try_get(8)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }

    /// The workers, the latest heartbeat first (at most 200), with the executions each
    /// holds a claim on.
    pub async fn fleet_workers(&self) -> Result<Vec<FleetWorker>, SessionError> {
        let client = self.client().await?;
        let rows = client
            .query(
                concat!(
                    "SELECT w.worker, w.host, w.concurrency, ",
                    utc!("w.started_at"),
                    ", ",
                    utc!("w.last_seen"),
                    ", ",
                    utc!("w.stopped_at"),
                    ", ARRAY(SELECT q.execution_id FROM queue q
                             WHERE q.worker = w.worker AND q.state = 'claimed'
                             ORDER BY q.submitted_at, q.execution_id)
                     FROM workers w ORDER BY w.last_seen DESC, w.worker LIMIT $1"
                ),
                &[&MOST],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(FleetWorker {
                    worker: row.try_get(0)?,
                    host: row.try_get(1)?,
                    concurrency: u32::try_from(row.try_get::<_, i32>(2)?).unwrap_or(0),
                    started_at: row.try_get(3)?,
                    last_seen: row.try_get(4)?,
                    stopped_at: row.try_get(5)?,
                    executions: row.try_get(6)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }
}
