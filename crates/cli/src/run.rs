//! `nerve run`: validate every input first, then start the sandbox, open the log and run
//! the engine. A run that never started writes nothing to the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nerve_brain::{AgentEngine, EngineConfig, ExecutionResult, Provider, Task};
use nerve_core::{
    Complexity, EventSink, ExecutionId, LoopType, MicroUsd, Redactor, TaskId, TaskStatus,
};
use nerve_hands::{DEFAULT_IMAGE, ImageSource, Sandbox, SandboxConfig, SandboxTools};
use nerve_session::SqliteSink;
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::args::{ComplexityArg, LoopArg, RunArgs};
use crate::config::Config;
use crate::output;
use crate::progress::{Mode, ProgressSink};

/// Environment variables whose values are registered with the redactor when set.
const PROVIDER_KEY_VARS: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

pub(crate) async fn run(
    args: RunArgs,
    db: &Path,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    let config = Config::load(config_path)?;
    let workspace = validate_workspace(&args.workspace)?;
    let description = read_task(&args)?;
    let provider = crate::provider::build(&args.provider, args.model.as_deref())?;
    let budget_cost = args
        .budget_usd
        .map(|usd| {
            MicroUsd::from_usd(usd)
                .ok_or_else(|| Failure::usage(format!("--budget-usd {usd} is not a dollar amount")))
        })
        .transpose()?;
    let redactor = Arc::new(build_redactor()?);

    let docker = nerve_hands::connect_docker()
        .await
        .map_err(Failure::usage)?;
    if let Err(error) = nerve_hands::reap_orphans(&docker).await {
        tracing::warn!(%error, "could not reap orphaned sandboxes");
    }
    let image = args
        .image
        .clone()
        .or(config.sandbox.image.clone())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
    if image == DEFAULT_IMAGE
        && !nerve_hands::image_exists(&docker, &image)
            .await
            .map_err(Failure::usage)?
    {
        if !args.json {
            output::error_line(&format!("building the sandbox image {image} (once)"));
        }
        let source = config
            .sandbox
            .busybox
            .clone()
            .map_or_else(ImageSource::default, |busybox| ImageSource { busybox });
        nerve_hands::build_default_image(&docker, &source, &image)
            .await
            .map_err(Failure::usage)?;
    }

    let execution_id = ExecutionId::new();
    let sandbox_config = SandboxConfig::new(image, workspace.clone(), execution_id);
    let sandbox = Arc::new(
        Sandbox::start(docker, &sandbox_config)
            .await
            .map_err(Failure::usage)?,
    );
    let outcome = run_in_sandbox(
        &args,
        db,
        &workspace,
        description,
        provider,
        budget_cost,
        redactor,
        execution_id,
        &sandbox,
    )
    .await;
    if let Err(error) = sandbox.remove().await {
        tracing::warn!(%error, "could not remove the sandbox; the reaper will at the next start");
    }
    let result = outcome?;
    report(&result, args.json);
    Ok(
        if result.termination_reason == nerve_core::TerminationReason::Completed {
            0
        } else {
            1
        },
    )
}

#[allow(clippy::too_many_arguments)] // One call site; a struct would only rename these.
async fn run_in_sandbox(
    args: &RunArgs,
    db: &Path,
    workspace: &Path,
    description: String,
    provider: Arc<dyn Provider>,
    budget_cost: Option<MicroUsd>,
    redactor: Arc<nerve_core::Redactor>,
    execution_id: ExecutionId,
    sandbox: &Arc<Sandbox>,
) -> Result<ExecutionResult, Failure> {
    let log = SqliteSink::open(db, redactor).map_err(Failure::usage)?;
    let progress = Arc::new(ProgressSink::new(log, Mode::detect(args.json), args.context_window));
    let sink: Arc<dyn EventSink> = Arc::clone(&progress) as Arc<dyn EventSink>;
    let loop_type = match args.loop_type {
        LoopArg::React => LoopType::React,
        LoopArg::PlanExecute => LoopType::PlanExecute,
        LoopArg::Hybrid => LoopType::Hybrid,
        LoopArg::Auto => LoopType::Auto,
    };
    let complexity = args.complexity.map(|c| match c {
        ComplexityArg::Simple => Complexity::Simple,
        ComplexityArg::Medium => Complexity::Medium,
        ComplexityArg::Complex => Complexity::Complex,
        ComplexityArg::Epic => Complexity::Epic,
    });
    let engine = AgentEngine::new(
        provider,
        Arc::new(SandboxTools::new(Arc::clone(sandbox))),
        sink,
        EngineConfig {
            loop_type,
            complexity,
            max_turns: args.max_turns,
            timeout: args.timeout.map(Duration::from_secs),
            budget_tokens: args.budget_tokens,
            budget_cost,
            context_window: args.context_window,
            recorded_config: serde_json::json!({
                "max_turns": args.max_turns,
                "timeout_secs": args.timeout,
                "budget_tokens": args.budget_tokens,
                "budget_usd": args.budget_usd,
                "context_window": args.context_window,
                "complexity": complexity,
                "container": sandbox.container_id(),
            }),
            ..EngineConfig::default()
        },
    );
    let task = Task {
        id: TaskId::new(),
        description,
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: workspace.display().to_string(),
    };
    if !args.json {
        output::error_line(&format!("execution {execution_id}"));
    }
    let cancel = CancellationToken::new();
    let watcher = tokio::spawn(watch_interrupts(cancel.clone()));
    let result = engine
        .run(execution_id, task, cancel)
        .await
        .map_err(Failure::usage);
    watcher.abort();
    progress.finish();
    result
}

/// First Ctrl-C: stop at the next turn boundary. Second: abort at once.
async fn watch_interrupts(cancel: CancellationToken) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    output::error_line("nerve: stopping at the next turn boundary (Ctrl-C again to abort)");
    cancel.cancel();
    if tokio::signal::ctrl_c().await.is_ok() {
        output::error_line("nerve: aborted");
        std::process::exit(130);
    }
}

fn validate_workspace(path: &Path) -> Result<PathBuf, Failure> {
    let resolved = std::fs::canonicalize(path).map_err(|e| {
        Failure::usage(format!("workspace {}: {}", path.display(), describe_io(&e)))
    })?;
    if !resolved.is_dir() {
        return Err(Failure::usage(format!(
            "workspace {} is not a directory",
            path.display()
        )));
    }
    Ok(resolved)
}

fn read_task(args: &RunArgs) -> Result<String, Failure> {
    let text = match (&args.task, &args.task_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => std::fs::read_to_string(file).map_err(|e| {
            Failure::usage(format!("task file {}: {}", file.display(), describe_io(&e)))
        })?,
        (None, None) => {
            return Err(Failure::usage(
                "give the task with --task TEXT or --task-file FILE",
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(Failure::usage("the task is empty"));
    }
    Ok(text)
}

fn build_redactor() -> Result<Redactor, Failure> {
    let secrets: Vec<(&str, SecretString)> = PROVIDER_KEY_VARS
        .iter()
        .filter_map(|name| {
            std::env::var(name)
                .ok()
                .filter(|v| v.len() >= nerve_core::redact::MIN_SECRET_LEN)
                .map(|v| (*name, SecretString::from(v)))
        })
        .collect();
    Redactor::with_secrets(secrets.iter().map(|(name, secret)| (*name, secret)))
        .map_err(Failure::usage)
}

fn describe_io(error: &std::io::Error) -> String {
    // An if-chain, not a match: io::ErrorKind is non-exhaustive.
    if error.kind() == std::io::ErrorKind::NotFound {
        "does not exist".to_owned()
    } else if error.kind() == std::io::ErrorKind::PermissionDenied {
        "permission denied".to_owned()
    } else {
        error.to_string()
    }
}

fn report(result: &ExecutionResult, json: bool) {
    let ctx = &result.context;
    if json {
        output::json(&serde_json::json!({
            "execution_id": ctx.execution_id.to_string(),
            "termination_reason": result.termination_reason,
            "task_status": ctx.task_status,
            "total_turns": ctx.turn_count(),
            "input_tokens": ctx.usage.input_tokens,
            "output_tokens": ctx.usage.output_tokens,
            "cost_usd": ctx.cost.as_usd(),
            "compactions": ctx.compactions,
            "error": result.error,
        }));
    } else {
        output::line(&format!(
            "{}: {} after {} turns ({} in / {} out tokens, {}), task {}{}",
            ctx.execution_id,
            result.termination_reason,
            ctx.turn_count(),
            ctx.usage.input_tokens,
            ctx.usage.output_tokens,
            ctx.cost,
            ctx.task_status,
            result
                .error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    }
}
