//! `nerve submit` and `nerve cancel`: the task queue on the PostgreSQL log. A submitted
//! execution is its run options (a [`Spec`]) in the queue until a `nerve worker` claims it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::ValueEnum;
use nerve_core::{ExecutionId, Redactor};
use nerve_session::{Cancelled, PgStore};
use serde::{Deserialize, Serialize};

use crate::Failure;
use crate::args::{ComplexityArg, LoopArg, RunArgs, SubmitArgs};
use crate::output;

/// The version of [`Spec`] this Nerve writes and reads.
const SPEC_VERSION: u32 = 1;

/// What a worker needs to start a submitted execution: `run`'s options, the task's text
/// (a task file is read at submit time) and where the workspace is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Spec {
    pub(crate) version: u32,
    pub(crate) workspace: Workspace,
    pub(crate) task: String,
    pub(crate) provider: String,
    pub(crate) model: Option<String>,
    #[serde(rename = "loop")]
    pub(crate) loop_type: String,
    pub(crate) complexity: Option<String>,
    pub(crate) max_turns: u32,
    pub(crate) timeout_secs: Option<u64>,
    pub(crate) budget_usd: Option<f64>,
    pub(crate) budget_tokens: Option<u64>,
    pub(crate) context_window: Option<u64>,
    pub(crate) image: Option<String>,
}

/// Where a submitted execution's workspace is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Workspace {
    /// A directory every worker reaches at this path (a shared filesystem).
    Path(PathBuf),
    /// A repository each worker clones into a fresh directory of its own.
    Git {
        url: String,
        #[serde(rename = "ref")]
        git_ref: Option<String>,
    },
}

/// The name clap gives a value (`plan_execute`).
fn value_name(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

impl Spec {
    /// The spec of `args`, checked as `run` checks them, with paths made absolute.
    fn from_args(args: &SubmitArgs) -> Result<Self, Failure> {
        let run = &args.run;
        if run.jsonl {
            return Err(Failure::usage(
                "submit prints the execution id only; follow the run with `nerve events ID --follow`",
            ));
        }
        let workspace = match &args.git {
            Some(url) => {
                if url.trim().is_empty() || url.starts_with('-') {
                    return Err(Failure::usage(format!(
                        "--git {url:?} is not a repository URL"
                    )));
                }
                Workspace::Git {
                    url: url.clone(),
                    git_ref: args.git_ref.clone(),
                }
            }
            None => match run
                .workspace
                .as_deref()
                .filter(|w| !w.as_os_str().is_empty())
            {
                Some(workspace) => {
                    Workspace::Path(nerve_runtime::launch::validate_workspace(workspace)?)
                }
                None => {
                    return Err(Failure::usage(
                        "name the workspace with --workspace DIR (a path every worker reaches) or --git URL",
                    ));
                }
            },
        };
        if let Some(id) = &run.continue_id {
            return Err(Failure::usage(format!(
                "submit queues a new execution: continue {id} with `nerve run --continue {id}`"
            )));
        }
        let spec = run.provider.as_deref().unwrap_or("openai");
        let provider = match spec.strip_prefix("script:") {
            Some(path) => {
                let path = std::fs::canonicalize(path)
                    .map_err(|e| Failure::usage(format!("cassette {path}: {e}")))?;
                format!("script:{}", path.display())
            }
            None => spec.to_owned(),
        };
        if let Some(usd) = run.budget_usd
            && nerve_core::MicroUsd::from_usd(usd).is_none()
        {
            return Err(Failure::usage(format!(
                "--budget-usd {usd} is not a dollar amount"
            )));
        }
        Ok(Self {
            version: SPEC_VERSION,
            workspace,
            task: crate::run::read_task(run)?,
            provider,
            model: run.model.clone(),
            loop_type: value_name(&run.loop_type),
            complexity: run.complexity.as_ref().map(value_name),
            max_turns: run.max_turns,
            timeout_secs: run.timeout,
            budget_usd: run.budget_usd,
            budget_tokens: run.budget_tokens,
            context_window: run.context_window,
            image: run.image.clone(),
        })
    }

    /// `run`'s arguments for this spec on `workspace` (a `--git` spec's clone).
    pub(crate) fn run_args(&self, workspace: PathBuf) -> Result<RunArgs, String> {
        if self.version != SPEC_VERSION {
            return Err(format!(
                "submitted with spec version {}, this worker reads {SPEC_VERSION}",
                self.version
            ));
        }
        let loop_type = LoopArg::from_str(&self.loop_type, false)
            .map_err(|_| format!("unknown loop {:?}", self.loop_type))?;
        let complexity = self
            .complexity
            .as_deref()
            .map(|c| ComplexityArg::from_str(c, false))
            .transpose()
            .map_err(|_| format!("unknown complexity {:?}", self.complexity))?;
        Ok(RunArgs {
            workspace: Some(workspace),
            task: Some(self.task.clone()),
            task_file: None,
            provider: Some(self.provider.clone()),
            continue_id: None,
            quiet: false,
            model: self.model.clone(),
            loop_type,
            complexity,
            max_turns: self.max_turns,
            timeout: self.timeout_secs,
            budget_usd: self.budget_usd,
            budget_tokens: self.budget_tokens,
            context_window: self.context_window,
            image: self.image.clone(),
            // A worker's fallback is its own configuration's (`[sandbox] fallback`).
            sandbox_fallback: None,
            json: true,
            jsonl: false,
        })
    }
}

/// The task queue lives in the PostgreSQL log only.
pub(crate) async fn queue_store(db: &Path, redactor: Arc<Redactor>) -> Result<PgStore, Failure> {
    let Some(url) = db.to_str().filter(|_| nerve_runtime::log::is_postgres(db)) else {
        return Err(Failure::usage(
            "the task queue needs a PostgreSQL log: pass --db postgres://user@host:port/dbname (see docs/postgres.md)",
        ));
    };
    PgStore::connect(url, redactor)
        .await
        .map_err(Failure::usage)
}

pub(crate) async fn submit(args: SubmitArgs, db: &Path) -> Result<u8, Failure> {
    let spec = Spec::from_args(&args)?;
    let store = queue_store(db, Arc::new(Redactor::new())).await?;
    let execution = ExecutionId::new();
    let value = serde_json::to_value(&spec)
        .map_err(|e| Failure::runtime(format!("cannot encode the submission: {e}")))?;
    store
        .submit(execution, &value)
        .await
        .map_err(Failure::runtime)?;
    if args.run.json {
        output::json(&serde_json::json!({ "execution_id": execution.to_string() }));
    } else {
        output::line(&execution.to_string());
    }
    Ok(0)
}

pub(crate) async fn cancel(db: &Path, id: &str) -> Result<u8, Failure> {
    let execution: ExecutionId = id.parse().map_err(Failure::usage)?;
    let store = queue_store(db, Arc::new(Redactor::new())).await?;
    match store.cancel(execution).await.map_err(Failure::runtime)? {
        Cancelled::Queued => output::line(&format!("cancelled {execution}: it had not started")),
        Cancelled::Requested => output::line(&format!(
            "cancelling {execution}: its worker stops it at the next turn boundary"
        )),
        Cancelled::NotWaiting => {
            let state = store
                .queue_entry(execution)
                .await
                .map_err(Failure::runtime)?
                .map_or_else(
                    || "was never submitted".to_owned(),
                    |e| format!("is {}", e.state),
                );
            return Err(Failure::usage(format!(
                "execution {execution} is neither queued nor running: it {state}"
            )));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_round_trips_through_its_json() {
        let spec = Spec {
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
        };
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["workspace"]["git"]["ref"], "v1");
        assert_eq!(json["loop"], "plan_execute");
        let back: Spec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
        let args = back.run_args(PathBuf::from("/w")).unwrap();
        assert_eq!(args.loop_type, LoopArg::PlanExecute);
        assert_eq!(args.complexity, Some(ComplexityArg::Epic));
        let mut newer = spec;
        newer.version = 9;
        assert!(
            newer
                .run_args(PathBuf::from("/w"))
                .unwrap_err()
                .contains("version 9")
        );
    }
}
