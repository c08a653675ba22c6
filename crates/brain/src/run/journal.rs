//! The journal: an execution's events on their way to the log. It batches what the loop
//! records, issues commits through the sink, and knows the head of the chain of commits
//! still in flight, so that whoever needs the log to be durable waits for exactly that.
//!
//! Invariants:
//! - [`Journal::record`] is plain and synchronous: it cannot fail and never waits; the event
//!   is durable only after a later [`Journal::flush`].
//! - Events reach the log in the order they were recorded. Each batch takes its place in
//!   the execution's order when [`Journal::issue`] returns ([`EventSink::enqueue`]); a sink
//!   that cannot place a batch without waiting gets it only once every earlier batch is
//!   durable.
//! - [`Journal::flush`] returns once every event recorded before it is durable, or with the
//!   first error of any commit in the chain; nothing recorded after a failed commit is
//!   reported durable.

use std::sync::Arc;

use nerve_core::{Enqueued, Event, EventSink, ExecutionId, PendingCommit, SinkError, Snapshot};

pub(crate) struct Journal {
    execution: ExecutionId,
    sink: Arc<dyn EventSink>,
    /// Recorded, not yet issued.
    pending: Vec<Event>,
    /// The last commit issued and not yet waited for, chained behind every earlier one.
    head: Option<PendingCommit>,
}

impl Journal {
    pub(crate) fn new(execution: ExecutionId, sink: Arc<dyn EventSink>) -> Self {
        Self {
            execution,
            sink,
            pending: Vec::new(),
            head: None,
        }
    }

    /// Records `event` as the execution's next.
    pub(crate) fn record(&mut self, event: Event) {
        self.pending.push(event);
    }

    /// Issues a commit of the events recorded so far (with `checkpoint` after them) without
    /// waiting for the disk: its place in the order is fixed now, and it is written while
    /// the loop goes on. The next [`Journal::flush`] waits for it.
    pub(crate) fn issue(&mut self, checkpoint: Option<Snapshot>) {
        let events = std::mem::take(&mut self.pending);
        if events.is_empty() && checkpoint.is_none() {
            return;
        }
        let next: PendingCommit = match self.sink.enqueue(self.execution, events, checkpoint) {
            Enqueued::Placed(commit) => commit,
            // Started only once the head is durable (it is chained behind it below), which
            // is what keeps a deferring sink's batches in order.
            Enqueued::Deferred { events, checkpoint } => {
                let sink = Arc::clone(&self.sink);
                let execution = self.execution;
                Box::pin(async move { sink.commit(execution, events, checkpoint).await })
            }
        };
        self.head = Some(match self.head.take() {
            Some(before) => Box::pin(async move {
                before.await?;
                next.await
            }),
            None => next,
        });
    }

    /// Makes every event recorded so far durable: issues their commit, then waits for the
    /// whole chain. The batch is placed before the earlier commits are waited for, so that
    /// a group-committing sink may write them in one transaction. When an earlier commit
    /// failed, this fails with its error.
    pub(crate) async fn flush(&mut self) -> Result<(), SinkError> {
        self.issue(None);
        match self.head.take() {
            Some(chain) => chain.await.map(|_| ()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use nerve_core::event::{TaskTransition, TurnCompleted};
    use nerve_core::{FinishReason, MicroUsd, TaskStatus, TokenUsage};

    use super::*;

    /// A sink that only knows `append` (so it defers every batch) and fails the append
    /// numbered `fail_at`.
    #[derive(Default)]
    struct AppendOnly {
        turns: Mutex<Vec<u32>>,
        fail_at: Option<usize>,
    }

    #[async_trait]
    impl EventSink for AppendOnly {
        async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
            if self.fail_at == Some(self.turns.lock().unwrap().len()) {
                return Err(SinkError::Write("disk full".into()));
            }
            // Yield once, so that a commit started early would interleave with another.
            tokio::task::yield_now().await;
            let mut turns = self.turns.lock().unwrap();
            if let Event::TurnCompleted(turn) = event {
                turns.push(turn.turn);
            }
            Ok(turns.len() as u64)
        }
    }

    fn turn(n: u32) -> Event {
        Event::TurnCompleted(TurnCompleted {
            turn: n,
            usage: TokenUsage::default(),
            cost: MicroUsd::ZERO,
            tool_calls: Vec::new(),
            finish: FinishReason::Stop,
            duration_ms: 0,
        })
    }

    #[tokio::test]
    async fn batches_of_a_deferring_sink_reach_it_in_order() {
        let sink = Arc::new(AppendOnly::default());
        let mut journal = Journal::new(ExecutionId::new(), Arc::clone(&sink) as _);
        for n in 1..=12 {
            journal.record(turn(n));
            if n % 3 == 0 {
                journal.issue(None);
            }
        }
        assert!(
            sink.turns.lock().unwrap().is_empty(),
            "nothing before a flush"
        );
        journal.flush().await.unwrap();
        assert_eq!(*sink.turns.lock().unwrap(), (1..=12).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_failed_commit_fails_the_next_flush_and_stops_the_chain() {
        let sink = Arc::new(AppendOnly {
            fail_at: Some(1),
            ..AppendOnly::default()
        });
        let mut journal = Journal::new(ExecutionId::new(), Arc::clone(&sink) as _);
        journal.record(turn(1));
        journal.record(turn(2));
        journal.issue(None);
        journal.record(Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        }));
        journal.record(turn(3));
        let error = journal.flush().await.unwrap_err();
        assert_eq!(error, SinkError::Write("disk full".into()));
        assert_eq!(
            *sink.turns.lock().unwrap(),
            [1],
            "turn 3 queued behind the failure"
        );
    }
}
