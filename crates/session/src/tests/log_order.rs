//! The log's order across executions (`log_order.rs`) on both backends: a follower that
//! reads the log while several writers append to many executions at once, and resumes after
//! the last position it saw, gets every event exactly once, each execution's in sequence.
//! On PostgreSQL the writers are separate stores (as separate processes are), so their
//! transactions commit concurrently and out of the order they began in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::*;

/// Writers, and executions each writer appends to (interleaved, one event at a time).
const WRITERS: usize = 3;
const EXECUTIONS: usize = 4;
/// How long the writing and following may take: a watchdog, not a target.
const PATIENCE: Duration = Duration::from_secs(120);

/// Each writer appends the events of its executions, one at a time, round robin.
fn write<S: EventStore + 'static>(writers: Vec<Arc<S>>) -> Vec<tokio::task::JoinHandle<()>> {
    writers
        .into_iter()
        .map(|store| {
            tokio::spawn(async move {
                let ids: Vec<ExecutionId> = (0..EXECUTIONS).map(|_| ExecutionId::new()).collect();
                for event in full_log() {
                    for &id in &ids {
                        store.append(id, event.clone()).await.unwrap();
                    }
                }
            })
        })
        .collect()
}

/// What a follower saw: every event once, positions increasing, each execution's events
/// from 1 to its last, in order.
fn check(seen: &[LogEvent]) {
    assert!(
        seen.windows(2).all(|w| w[0].position < w[1].position),
        "positions increase"
    );
    let mut by_execution: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for logged in seen {
        by_execution
            .entry(&logged.event.execution_id)
            .or_default()
            .push(logged.event.seq);
    }
    assert_eq!(by_execution.len(), WRITERS * EXECUTIONS);
    let events = full_log().len() as u64;
    for (id, seqs) in by_execution {
        assert_eq!(seqs, (1..=events).collect::<Vec<_>>(), "{id}");
    }
    let unique: BTreeSet<LogPosition> = seen.iter().map(|l| l.position).collect();
    assert_eq!(unique.len(), seen.len());
}

/// Follows the log with `read` (from `start`, in batches of 5, resuming after the last
/// position each time) until every writer is done and nothing is left.
async fn follow<F, Fut>(
    start: LogPosition,
    writers: &[tokio::task::JoinHandle<()>],
    read: F,
) -> Vec<LogEvent>
where
    F: Fn(LogPosition) -> Fut,
    Fut: std::future::Future<Output = Vec<LogEvent>>,
{
    let deadline = Instant::now() + PATIENCE;
    let mut seen: Vec<LogEvent> = Vec::new();
    let mut after = start;
    // Ends: once every writer is done (known before the read) and the read finds nothing,
    // or at the deadline (a failure).
    loop {
        assert!(Instant::now() < deadline, "the writers did not finish");
        let done = writers.iter().all(tokio::task::JoinHandle::is_finished);
        let batch = read(after).await;
        if batch.is_empty() {
            if done {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if let Some(last) = batch.last() {
            after = last.position;
        }
        seen.extend(batch);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_log_is_followed_in_commit_order_exactly_once() {
    let (_dir, path) = temp_db();
    let sink = Arc::new(SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap());
    let reader = Store::open_read_only(&path).unwrap();
    assert_eq!(reader.log_end().unwrap(), LogPosition::START);
    let writers = write((0..WRITERS).map(|_| Arc::clone(&sink)).collect());
    let seen = follow(LogPosition::START, &writers, |after| {
        std::future::ready(reader.log_events_after(after, 5).unwrap())
    })
    .await;
    check(&seen);
    let end = reader.log_end().unwrap();
    assert_eq!(end, seen.last().unwrap().position);
    assert!(reader.log_events_after(end, 5).unwrap().is_empty());
    let wrong = LogPosition::Tx { tx: 1, row: 1 };
    assert!(reader.log_events_after(wrong, 5).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_log_is_followed_in_commit_order_exactly_once() {
    let url = match crate::pg_cluster::test_database().await {
        Ok(url) => url,
        Err(error) if std::env::var("NERVE_REQUIRE_DOCKER").as_deref() == Ok("1") => {
            panic!("PostgreSQL is required here (NERVE_REQUIRE_DOCKER=1): {error}")
        }
        Err(error) => {
            eprintln!("skipping: {error}");
            return;
        }
    };
    let connect = || async {
        Arc::new(
            PgStore::connect(&url, Arc::new(Redactor::new()))
                .await
                .unwrap(),
        )
    };
    let reader = connect().await;
    let start = reader.log_end().await.unwrap();
    let mut stores = Vec::new();
    for _ in 0..WRITERS {
        stores.push(connect().await);
    }
    let writers = write(stores);
    let seen = follow(start, &writers, |after| {
        let reader = Arc::clone(&reader);
        async move { reader.log_events_after(after, 5).await.unwrap() }
    })
    .await;
    check(&seen);
    // From the start of the log: the same events.
    let all = reader
        .log_events_after(LogPosition::START, 10_000)
        .await
        .unwrap();
    assert_eq!(all, seen);
    let end = reader.log_end().await.unwrap();
    assert!(reader.log_events_after(end, 5).await.unwrap().is_empty());
    assert!(
        reader
            .log_events_after(LogPosition::Row(3), 5)
            .await
            .is_err()
    );
}
