//! The task queue on the PostgreSQL log: a submitted execution is its run options (a
//! [`Spec`]) in the queue until a worker claims it; `cancel` stops it queued, or asks its
//! worker to stop it (at its next lease renewal; then at once).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_core::{Complexity, ExecutionId, LoopType, Redactor};
pub use nerve_session::Claim;
use nerve_session::{Cancelled, PgStore};
use serde::{Deserialize, Serialize};

use crate::RuntimeError;
use crate::launch::RunRequest;

/// The version of [`Spec`] this Nerve writes and reads.
pub const SPEC_VERSION: u32 = 1;

/// What a worker needs to start a submitted execution: `run`'s options, the task's text
/// (a task file is read at submit time) and where the workspace is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub version: u32,
    pub workspace: Workspace,
    pub task: String,
    pub provider: String,
    pub model: Option<String>,
    /// The loop's name as the log spells it (`plan_execute`).
    #[serde(rename = "loop")]
    pub loop_type: String,
    /// The complexity's name as the log spells it (`epic`).
    pub complexity: Option<String>,
    pub max_turns: u32,
    pub timeout_secs: Option<u64>,
    pub budget_usd: Option<f64>,
    pub budget_tokens: Option<u64>,
    pub context_window: Option<u64>,
    pub image: Option<String>,
}

/// Where a submitted execution's workspace is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Workspace {
    /// A directory every worker reaches at this path (a shared filesystem).
    Path(PathBuf),
    /// A repository each worker clones into a fresh directory of its own.
    Git {
        url: String,
        #[serde(rename = "ref")]
        git_ref: Option<String>,
    },
}

impl Spec {
    /// The run this spec asks for on `workspace` (a `--git` spec's clone), or why it cannot
    /// be run here.
    pub fn request(&self, workspace: PathBuf) -> Result<RunRequest, String> {
        if self.version != SPEC_VERSION {
            return Err(format!(
                "submitted with spec version {}, this worker reads {SPEC_VERSION}",
                self.version
            ));
        }
        let loop_type: LoopType =
            named(&self.loop_type).ok_or_else(|| format!("unknown loop {:?}", self.loop_type))?;
        let complexity: Option<Complexity> = self
            .complexity
            .as_deref()
            .map(|c| named(c).ok_or_else(|| format!("unknown complexity {:?}", self.complexity)))
            .transpose()?;
        if self.task.trim().is_empty() {
            return Err("the task is empty".to_owned());
        }
        Ok(RunRequest {
            workspace,
            task: self.task.clone(),
            provider: self.provider.clone(),
            model: self.model.clone(),
            loop_type,
            complexity,
            max_turns: self.max_turns,
            timeout_secs: self.timeout_secs,
            budget_usd: self.budget_usd,
            budget_tokens: self.budget_tokens,
            context_window: self.context_window,
            image: self.image.clone(),
            project_instructions: true,
        })
    }
}

/// The value of an enum the log spells `name`.
fn named<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_owned())).ok()
}

/// The task queue lives in the PostgreSQL log only.
pub async fn queue_store(db: &Path, redactor: Arc<Redactor>) -> Result<PgStore, RuntimeError> {
    let Some(url) = db.to_str().filter(|_| crate::log::is_postgres(db)) else {
        return Err(RuntimeError::usage(
            "the task queue needs a PostgreSQL log: pass --db postgres://user@host:port/dbname (see docs/postgres.md)",
        ));
    };
    PgStore::connect(url, redactor)
        .await
        .map_err(RuntimeError::from)
}

/// Queues `spec` in the log at `db` as a new execution; its id.
pub async fn submit(db: &Path, spec: &Spec) -> Result<ExecutionId, RuntimeError> {
    let store = queue_store(db, Arc::new(Redactor::new())).await?;
    let execution = ExecutionId::new();
    let value = serde_json::to_value(spec)
        .map_err(|e| RuntimeError::failed(format!("cannot encode the submission: {e}")))?;
    store
        .submit(execution, &value)
        .await
        .map_err(RuntimeError::failed)?;
    Ok(execution)
}

/// What [`cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// It was queued and is now cancelled: no worker will run it.
    Queued,
    /// A worker runs it; the worker stops it when it next renews the lease.
    Requested,
}

/// Cancels execution `id` in the queue of the log at `db`; refused when it is neither
/// queued nor running.
pub async fn cancel(db: &Path, id: &str) -> Result<(ExecutionId, Cancel), RuntimeError> {
    let execution: ExecutionId = id.parse().map_err(RuntimeError::usage)?;
    let store = queue_store(db, Arc::new(Redactor::new())).await?;
    match store
        .cancel(execution)
        .await
        .map_err(RuntimeError::failed)?
    {
        Cancelled::Queued => Ok((execution, Cancel::Queued)),
        Cancelled::Requested => Ok((execution, Cancel::Requested)),
        Cancelled::NotWaiting => {
            let state = store
                .queue_entry(execution)
                .await
                .map_err(RuntimeError::failed)?
                .map_or_else(
                    || "was never submitted".to_owned(),
                    |e| format!("is {}", e.state),
                );
            Err(RuntimeError::conflict(format!(
                "execution {execution} is neither queued nor running: it {state}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        Spec {
            version: SPEC_VERSION,
            workspace: Workspace::Git {
                url: "https://example.org/repo.git".into(),
                git_ref: Some("v1".into()),
            },
            task: "fix it".into(),
            provider: "openai".into(),
            model: Some("gpt".into()),
            loop_type: "plan_execute".into(),
            complexity: Some("epic".into()),
            max_turns: 7,
            timeout_secs: Some(60),
            budget_usd: Some(0.5),
            budget_tokens: None,
            context_window: None,
            image: None,
        }
    }

    #[test]
    fn a_spec_round_trips_through_its_json() {
        let spec = spec();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["workspace"]["git"]["ref"], "v1");
        assert_eq!(json["loop"], "plan_execute");
        let back: Spec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
        let request = back.request(PathBuf::from("/w")).unwrap();
        assert_eq!(request.loop_type, LoopType::PlanExecute);
        assert_eq!(request.complexity, Some(Complexity::Epic));
        assert_eq!(
            (request.workspace, request.max_turns, request.timeout_secs),
            (PathBuf::from("/w"), 7, Some(60))
        );
    }

    #[test]
    fn a_spec_this_worker_cannot_read_says_why() {
        let check = |change: fn(&mut Spec), expected: &str| {
            let mut spec = spec();
            change(&mut spec);
            assert_eq!(spec.request(PathBuf::from("/w")).unwrap_err(), expected);
        };
        check(
            |s| s.version = 9,
            "submitted with spec version 9, this worker reads 1",
        );
        check(|s| s.loop_type = "spiral".into(), "unknown loop \"spiral\"");
        check(
            |s| s.complexity = Some("vast".into()),
            "unknown complexity Some(\"vast\")",
        );
        check(|s| s.task = " \n".into(), "the task is empty");
    }
}
