//! What the API and the web view both do to an execution, each behind its own way of
//! authorizing: start one under a workspace root, refuse to act on one still running, and
//! record a decision on a parked call (resuming the execution once nothing is pending).

use std::path::Path;

use axum::http::StatusCode;
use nerve_core::ExecutionId;
use nerve_runtime::launch::RunRequest;
use nerve_runtime::resume::Approved;

use crate::Settings;
use crate::app::{ApiError, App};

/// Starts an execution of `task` in `workspace` (under a `--workspace-root`) with the
/// server's run options: what `POST /api/v1/executions` and the web view's form do.
pub(crate) async fn create_execution(
    app: &App,
    workspace: &Path,
    task: String,
    provider: Option<String>,
) -> Result<ExecutionId, ApiError> {
    let workspace = nerve_runtime::launch::validate_workspace(workspace)?;
    let settings = &app.settings;
    if !settings
        .workspace_roots
        .iter()
        .any(|root| workspace.starts_with(root))
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "workspace {} is not under a --workspace-root of this server (roots: {})",
                workspace.display(),
                roots(settings)
            ),
        ));
    }
    let run = &settings.run;
    let provider = match provider {
        None => run.provider.clone(),
        Some(asked) if asked == run.provider || settings.allowed_providers.contains(&asked) => {
            asked
        }
        Some(asked) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "provider {asked:?} is not allowed by this server's settings (--provider, --allow-provider)"
                ),
            ));
        }
    };
    if task.trim().is_empty() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "the task is empty"));
    }
    let request = RunRequest {
        workspace,
        task,
        provider,
        model: run.model.clone(),
        loop_type: run.loop_type,
        complexity: run.complexity,
        max_turns: run.max_turns,
        timeout_secs: run.timeout_secs,
        budget_usd: run.budget_usd,
        budget_tokens: run.budget_tokens,
        context_window: run.context_window,
        image: run.image.clone(),
        // The workspace's AGENTS.md reaches the model, as under `nerve run`.
        project_instructions: true,
    };
    let execution = ExecutionId::new();
    let (launch, start) =
        nerve_runtime::launch::fresh(&request, app.db, app.config, execution).await?;
    app.runs.start(launch, start).await;
    Ok(execution)
}

fn roots(settings: &Settings) -> String {
    if settings.workspace_roots.is_empty() {
        return "none".to_owned();
    }
    settings
        .workspace_roots
        .iter()
        .map(|root| root.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// 409 while `execution` runs in this server (after waiting a little for one that is
/// closing its sandbox after its finish event).
pub(crate) async fn refuse_running(app: &App, execution: ExecutionId) -> Result<(), ApiError> {
    if !app.runs.ended(execution, crate::runs::CLOSING).await {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("execution {execution} is running: wait for its finish event"),
        ));
    }
    Ok(())
}

/// Records the decision on `call_id` of the parked `execution` as `nerve approve` does and,
/// once nothing is left pending, resumes it here (a fleet's worker does, once requeued):
/// what `POST .../approvals` and the web view's buttons do. Whether it was requeued or
/// resumed here.
pub(crate) async fn decide(
    app: &App,
    execution: ExecutionId,
    call_id: &str,
    deny: bool,
    reason: String,
) -> Result<(Option<Approved>, bool), ApiError> {
    // Parked a moment ago: its sandbox may still be closing.
    refuse_running(app, execution).await?;
    let (_, next) = nerve_runtime::resume::approve_call(
        app.db,
        &execution.to_string(),
        call_id,
        deny,
        Some(reason),
    )
    .await?;
    let resumed = match next {
        Some(Approved::ToResume) => {
            let resumable =
                nerve_runtime::resume::resumable(app.db, &execution.to_string()).await?;
            let (launch, start) =
                nerve_runtime::launch::resumed(app.db, app.config, resumable, None, None).await?;
            app.runs.start(launch, start).await
        }
        Some(Approved::Requeued) | None => false,
    };
    Ok((next, resumed))
}
