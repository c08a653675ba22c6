//! `nerve submit` and `nerve cancel`: the runtime's task queue on the PostgreSQL log. A
//! submitted execution is its run options (a [`Spec`]) in the queue until a `nerve worker`
//! claims it.

use std::path::Path;

use clap::ValueEnum;
use nerve_runtime::queue::{Cancel, SPEC_VERSION, Spec, Workspace};

use crate::Failure;
use crate::args::SubmitArgs;
use crate::output;

/// The name clap gives a value (`plan_execute`).
fn value_name(value: &impl ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// The spec of `args`, checked as `run` checks them, with paths made absolute.
fn spec(args: &SubmitArgs) -> Result<Spec, Failure> {
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
    if let Some(id) = run.continue_id.as_ref().or(run.resume_id.as_ref()) {
        return Err(Failure::usage(format!(
            "submit queues a new execution: continue {id} with `nerve run --continue {id}`"
        )));
    }
    // A worker's settings decide these for what it runs; a flag here would be lost.
    if run.approval.is_some() || run.no_project_instructions {
        return Err(Failure::usage(
            "submit does not carry --approval or --no-project-instructions: set `approval` in the worker's settings",
        ));
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
    Ok(Spec {
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
pub(crate) async fn submit(args: SubmitArgs, db: &Path) -> Result<u8, Failure> {
    let spec = spec(&args)?;
    let execution = nerve_runtime::queue::submit(db, &spec).await?;
    if args.run.json {
        output::json(&serde_json::json!({ "execution_id": execution.to_string() }));
    } else {
        output::line(&execution.to_string());
    }
    Ok(0)
}

pub(crate) async fn cancel(db: &Path, id: &str) -> Result<u8, Failure> {
    match nerve_runtime::queue::cancel(db, id).await? {
        (execution, Cancel::Queued) => {
            output::line(&format!("cancelled {execution}: it had not started"));
        }
        (execution, Cancel::Requested) => output::line(&format!(
            "cancelling {execution}: its worker stops it when it next renews its lease (within a third of the lease, 10 s by default): {}",
            nerve_runtime::worker::STOP_EFFECT
        )),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;
    use nerve_core::{Complexity, LoopType};

    use super::value_name;
    use crate::args::{ComplexityArg, LoopArg};

    /// A submission names its loop and complexity as clap does; a worker reads them as the
    /// log spells them: the two agree for every value.
    #[test]
    fn clap_names_are_the_names_the_log_uses() {
        for arg in LoopArg::value_variants() {
            let name = value_name(arg);
            let parsed: LoopType = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(parsed, crate::run::loop_type(*arg), "{name}");
        }
        for arg in ComplexityArg::value_variants() {
            let name = value_name(arg);
            let parsed: Complexity = serde_json::from_value(serde_json::json!(name)).unwrap();
            assert_eq!(parsed, crate::run::complexity(*arg), "{name}");
        }
    }
}
