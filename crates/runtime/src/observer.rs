//! What a front end hears of an execution while the runtime assembles and runs it: the
//! events on their way to the log, the answer's deltas as the model writes them, what the
//! runtime has to say beside the execution (an image being built, an MCP server without
//! tools), and the approvals a person may decide. A terminal draws a transcript from them,
//! `--jsonl` prints them, an editor or a web page would forward them.

use std::sync::Arc;

use async_trait::async_trait;
/// What an observer hears and answers, re-exported on purpose: a front end (the editor
/// agent) implements [`Observer`] without depending on brain.
pub use nerve_brain::Delta;
use nerve_brain::DeltaObserver;
pub use nerve_brain::guards::approval::Approval;
use nerve_brain::guards::approval::Approver;
use nerve_core::event::CallPurpose;
use nerve_core::{Enqueued, Event, EventSink, ExecutionId, SinkError, Snapshot, ToolCall};

/// Something the runtime says beside the execution's events. None of it is recorded; a
/// front end shows it, logs it or drops it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The default sandbox image is missing and is being built (once).
    BuildingDefaultImage { image: String },
    /// An image is being built from this Dockerfile (said only when something is built: a
    /// reused image says nothing); its output lines follow as [`Notice::BuildOutput`].
    BuildingImage { dockerfile: std::path::PathBuf },
    /// One line of an image build's output.
    BuildOutput(String),
    /// An MCP server's warning (it runs on the host, say).
    McpWarning(String),
    /// An MCP server offers no tools; the execution goes on without it.
    McpNoTools { server: String, error: String },
    /// The workspace's snapshot store cannot be opened: the execution goes on without
    /// snapshots, and `diff`/`rewind` have nothing for it.
    NoSnapshots { reason: String },
    /// A skill's `SKILL.md` could not be used (malformed, too large, a name taken): the
    /// execution goes on without it.
    SkillSkipped {
        path: std::path::PathBuf,
        reason: String,
    },
}

/// A front end's ears. Every method has a default that ignores what it hears, and none may
/// block: events and deltas arrive on the engine's tasks.
#[async_trait]
pub trait Observer: Send + Sync {
    /// Events of `execution` on their way to the log, in order, before they are durable
    /// (and before the log's redactor has seen them: a front end that shows them redacts
    /// with [`crate::launch::Launch::redactor`]).
    fn events(&self, execution: ExecutionId, events: &[Event]) {
        let _ = (execution, events);
    }

    /// A piece of an answer as the model streams it: shown, never recorded.
    fn delta(&self, execution: ExecutionId, purpose: CallPurpose, delta: &Delta) {
        let _ = (execution, purpose, delta);
    }

    /// What the runtime says beside the execution.
    fn notice(&self, notice: Notice) {
        let _ = notice;
    }

    /// A person's decision on a tool call an `ask` rule holds; `None` (the default) when
    /// nobody is there to ask: the execution parks, to be decided with `approve`.
    async fn approve(&self, call: &ToolCall, rule: &str) -> Option<Approval> {
        let _ = (call, rule);
        None
    }
}

/// Hears nothing: an unattended execution (a worker's), whose notices go to the log of
/// `tracing`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn notice(&self, notice: Notice) {
        match notice {
            Notice::NoSnapshots { reason } => {
                tracing::warn!(%reason, "no workspace snapshots for this run");
            }
            Notice::SkillSkipped { path, reason } => {
                tracing::warn!(path = %path.display(), %reason, "skill skipped");
            }
            Notice::BuildingDefaultImage { .. }
            | Notice::BuildingImage { .. }
            | Notice::BuildOutput(_)
            | Notice::McpWarning(_)
            | Notice::McpNoTools { .. } => {}
        }
    }
}

/// The child executions (a `delegate` call's) an observer has heard of: a front end that
/// draws one execution leaves their events out (the parent's call and result say what
/// they did). A child is known by its first batch, which starts with its `started`
/// naming a parent.
#[derive(Debug, Default)]
pub struct Children(std::sync::Mutex<std::collections::HashSet<ExecutionId>>);

impl Children {
    /// Whether `events` of `execution` are a child's.
    pub fn of_child(&self, execution: ExecutionId, events: &[Event]) -> bool {
        let mut known = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Event::Started(started)) = events.first()
            && started.parent.is_some()
        {
            known.insert(execution);
        }
        known.contains(&execution)
    }
}

/// The log's sink, telling the observer of every event before it is handed on.
pub(crate) struct ObservedSink {
    pub(crate) observer: Arc<dyn Observer>,
    pub(crate) inner: Arc<dyn EventSink>,
}

#[async_trait]
impl EventSink for ObservedSink {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        self.observer
            .events(execution, std::slice::from_ref(&event));
        self.inner.append(execution, event).await
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        self.inner.checkpoint(execution, turn, snapshot).await
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        self.observer.events(execution, &events);
        self.inner.commit(execution, events, checkpoint).await
    }

    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        self.observer.events(execution, &events);
        self.inner.enqueue(execution, events, checkpoint)
    }
}

/// The observer as the engine's delta observer and approver.
pub(crate) struct Ears(pub(crate) Arc<dyn Observer>);

impl DeltaObserver for Ears {
    fn delta(&self, execution_id: ExecutionId, purpose: CallPurpose, delta: &Delta) {
        self.0.delta(execution_id, purpose, delta);
    }
}

#[async_trait]
impl Approver for Ears {
    async fn decide(&self, call: &ToolCall, rule: &str) -> Option<Approval> {
        self.0.approve(call, rule).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nerve_core::TaskStatus;
    use nerve_core::event::TaskTransition;
    use nerve_core::testing::MemorySink;

    use super::*;

    /// Records what it hears.
    #[derive(Default)]
    struct Recorder {
        heard: Mutex<Vec<String>>,
    }

    impl Observer for Recorder {
        fn events(&self, _execution: ExecutionId, events: &[Event]) {
            if let Ok(mut heard) = self.heard.lock() {
                heard.extend(events.iter().map(|e| e.kind().as_str().to_owned()));
            }
        }
    }

    fn transition() -> Event {
        Event::TaskTransition(TaskTransition {
            from: TaskStatus::Created,
            to: TaskStatus::InProgress,
        })
    }

    #[tokio::test]
    async fn every_event_is_heard_before_the_log_gets_it() {
        let observer = Arc::new(Recorder::default());
        let log = Arc::new(MemorySink::default());
        let sink = ObservedSink {
            observer: Arc::clone(&observer) as Arc<dyn Observer>,
            inner: Arc::clone(&log) as Arc<dyn EventSink>,
        };
        let execution = ExecutionId::new();
        sink.append(execution, transition()).await.unwrap();
        sink.commit(execution, vec![transition(), transition()], None)
            .await
            .unwrap();
        let heard = observer.heard.lock().unwrap().clone();
        assert_eq!(heard.len(), 3);
        assert_eq!(heard, log.kinds());
    }

    #[tokio::test]
    async fn nobody_to_ask_parks() {
        let ears = Ears(Arc::new(Unobserved));
        let call = ToolCall {
            id: "c".into(),
            name: "shell".into(),
            arguments: serde_json::json!({}),
        };
        assert_eq!(ears.decide(&call, "rule").await, None);
    }

    #[test]
    fn a_child_is_known_by_its_first_batch_and_stays_known() {
        let started = |parent: Option<&str>| {
            Event::Started(nerve_core::event::Started {
                task_id: nerve_core::TaskId::new(),
                task: "t".into(),
                workspace: "/w".into(),
                loop_type: nerve_core::LoopType::React,
                provider: "p".into(),
                model: "m".into(),
                max_turns: 1,
                config: serde_json::Value::Null,
                parent: parent.map(str::to_owned),
                call_id: None,
                fork: None,
            })
        };
        let children = Children::default();
        let (parent, child) = (ExecutionId::new(), ExecutionId::new());
        assert!(!children.of_child(parent, &[started(None)]));
        assert!(children.of_child(child, &[started(Some("p"))]));
        let later = Event::Retry(nerve_core::event::Retry {
            turn: 1,
            attempt: 1,
            error: nerve_core::event::ModelErrorKind::Timeout,
            delay_ms: 1,
        });
        assert!(children.of_child(child, std::slice::from_ref(&later)));
        assert!(!children.of_child(parent, &[later]));
    }
}
