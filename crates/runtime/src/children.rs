//! A resumed parent's children, read from the log for the engine (brain's `ChildLog`):
//! the child execution a `delegate` call started (its `started` names the parent and the
//! call), with its ending when it ended, or what resuming it takes when it did not.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use nerve_brain::{ChildLimits, ChildLog, ChildResume, ChildState, Provider};
use nerve_core::{ExecutionId, MessageRole, MicroUsd, ToolCallId};

/// The log at `db`, read for children.
pub(crate) struct LogChildren {
    pub(crate) db: PathBuf,
}

#[async_trait]
impl ChildLog for LogChildren {
    async fn child_of(&self, parent: ExecutionId, call: &ToolCallId) -> Option<ChildState> {
        let child = self.find(parent, call).await?;
        let (_, _, replay) = crate::resume::load(&self.db, &child.to_string())
            .await
            .ok()?;
        let started = replay.started.clone()?;
        let number = |key: &str| started.config.get(key).and_then(serde_json::Value::as_u64);
        let limits = ChildLimits {
            name: started
                .config
                .get("agent")
                .and_then(|a| a.as_str())
                .unwrap_or(nerve_brain::run::delegate::DEFAULT_NAME)
                .to_owned(),
            tools: serde_json::from_value(started.config["tools"].clone()).ok(),
            max_turns: started.max_turns,
            budget_tokens: number("budget_tokens"),
            budget_cost: started
                .config
                .get("budget_usd")
                .and_then(serde_json::Value::as_f64)
                .and_then(MicroUsd::from_usd),
        };
        if let Some(reason) = replay.termination_reason {
            let answer = replay
                .messages
                .iter()
                .rev()
                .find(|m| m.role == MessageRole::Assistant)
                .map(nerve_core::Message::text_content)
                .unwrap_or_default();
            return Some(ChildState::Ended(
                nerve_brain::run::delegate::ChildOutcome {
                    child,
                    name: limits.name,
                    reason,
                    answer,
                    error: replay.error.clone(),
                    turns: replay.total_turns,
                    usage: replay.usage,
                    cost: replay.cost,
                },
            ));
        }
        let resumable = crate::resume::resumable(&self.db, &child.to_string())
            .await
            .ok()?;
        let provider = match started.provider.strip_prefix("script:") {
            Some(path) => Some(Arc::new(
                crate::launch::scripted_for(std::path::Path::new(path), &resumable).ok()?,
            ) as Arc<dyn Provider>),
            None => None,
        };
        Some(ChildState::Unfinished(Box::new(ChildResume {
            child,
            limits,
            state: resumable.state,
            provider,
        })))
    }
}

impl LogChildren {
    /// The execution whose `started` names `parent` and `call`, from the log's index (its
    /// `parent` and `call_id` come from each execution's `started`); the oldest if more
    /// than one did (ids are UUID v7, ordered by time).
    async fn find(&self, parent: ExecutionId, call: &ToolCallId) -> Option<ExecutionId> {
        let summaries = if crate::log::is_postgres(&self.db) {
            let crate::log::Reader::Postgres(store) = crate::log::reader(&self.db).await.ok()?
            else {
                return None;
            };
            nerve_session::EventStore::executions(store.as_ref())
                .await
                .ok()?
        } else {
            // On the blocking pool: the SQLite reader is not `Sync`.
            let db = self.db.clone();
            tokio::task::spawn_blocking(move || {
                nerve_session::Store::open_read_only(&db)
                    .ok()?
                    .executions()
                    .ok()
            })
            .await
            .ok()
            .flatten()?
        };
        let parent = parent.to_string();
        summaries
            .into_iter()
            .filter(|s| {
                s.parent.as_deref() == Some(parent.as_str())
                    && s.call_id.as_deref() == Some(call.0.as_str())
            })
            .filter_map(|s| s.execution_id.parse::<ExecutionId>().ok())
            .min()
    }
}
