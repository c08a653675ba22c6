//! The routes of `/api/v1`: each checks the caller's token first, then does one thing
//! through the runtime, and answers JSON that went through the redactor.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use nerve_core::ExecutionId;
use nerve_runtime::launch::{ContinueRequest, RunRequest};
use nerve_runtime::resume::Approved;
use nerve_runtime::tokens::Scope;
use serde::Deserialize;
use serde_json::json;

use crate::Settings;
use crate::app::{ApiError, App, execution_id, read};
use crate::auth::{authorize, authorize_read};

/// The API's routes. No CORS layer: a browser on another origin gets no
/// `Access-Control-Allow-Origin`, so it cannot read an answer nor send a JSON body.
pub(crate) fn router(app: Arc<App>) -> Router {
    let limit = app.settings.body_limit;
    Router::new()
        .route("/api/v1/executions", get(list).post(create))
        .route("/api/v1/executions/{id}", get(show))
        .route("/api/v1/executions/{id}/messages", post(message))
        .route("/api/v1/executions/{id}/cancel", post(cancel))
        .route("/api/v1/executions/{id}/approvals", post(approval))
        .route("/api/v1/executions/{id}/events", get(crate::events::stream))
        .route("/", get(crate::web::home))
        .route("/executions/{id}", get(crate::web::execution))
        .route("/login", post(crate::web::login))
        .route("/logout", post(crate::web::logout))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(app)
}

async fn not_found(State(app): State<Arc<App>>) -> Response {
    app.respond(Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route (see docs/api.md)",
    )))
}

async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let answer = async {
        authorize_read(&app, &headers)?;
        let executions = read(
            app.db,
            |reader| async move { Ok(reader.executions().await?) },
        )
        .await?;
        Ok((StatusCode::OK, json!({ "executions": executions })))
    };
    app.respond(answer.await)
}

async fn show(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let answer = async {
        authorize_read(&app, &headers)?;
        let execution = execution_id(&id)?;
        let replayed = read(app.db, move |reader| async move {
            let replayed = reader.replay(execution).await?;
            Ok(nerve_runtime::views::json::replay_json(&replayed))
        })
        .await?;
        Ok((StatusCode::OK, replayed))
    };
    app.respond(answer.await)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    workspace: PathBuf,
    task: String,
    provider: Option<String>,
}

async fn create(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Json<Create>, JsonRejection>,
) -> Response {
    let answer = async {
        authorize(&app, &headers, Scope::Run)?;
        let Json(body) = body?;
        let workspace = nerve_runtime::launch::validate_workspace(&body.workspace)?;
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
        let provider = match body.provider {
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
        if body.task.trim().is_empty() {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "the task is empty"));
        }
        let request = RunRequest {
            workspace,
            task: body.task,
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
        Ok((StatusCode::CREATED, json!({ "execution_id": execution })))
    };
    app.respond(answer.await)
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Message {
    text: String,
}

async fn message(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    body: Result<Json<Message>, JsonRejection>,
) -> Response {
    let answer = async {
        authorize(&app, &headers, Scope::Run)?;
        let execution = execution_id(&id)?;
        let Json(body) = body?;
        if body.text.trim().is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "the message is empty",
            ));
        }
        refuse_running(&app, execution).await?;
        let run = &app.settings.run;
        let request = ContinueRequest {
            message: body.text,
            workspace: None,
            provider: None,
            loop_type: run.loop_type,
            max_turns: run.max_turns,
            image: run.image.clone(),
        };
        let (launch, start) =
            nerve_runtime::launch::continued(request, app.db, app.config, &execution.to_string())
                .await?;
        if !app.runs.start(launch, start).await {
            refuse_running(&app, execution).await?;
        }
        Ok((StatusCode::ACCEPTED, json!({ "execution_id": execution })))
    };
    app.respond(answer.await)
}

/// 409 while `execution` runs in this server (after waiting a little for one that is
/// closing its sandbox after its finish event).
async fn refuse_running(app: &App, execution: ExecutionId) -> Result<(), ApiError> {
    if !app.runs.ended(execution, crate::runs::CLOSING).await {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("execution {execution} is running: wait for its finish event"),
        ));
    }
    Ok(())
}

async fn cancel(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let answer = async {
        authorize(&app, &headers, Scope::Run)?;
        let execution = execution_id(&id)?;
        if app.runs.cancel(execution) {
            return Ok((
                StatusCode::ACCEPTED,
                json!({ "execution_id": execution, "cancel": "requested" }),
            ));
        }
        if nerve_runtime::log::is_postgres(app.db) {
            let (_, done) = nerve_runtime::queue::cancel(app.db, &execution.to_string()).await?;
            let done = match done {
                nerve_runtime::queue::Cancel::Queued => "cancelled",
                nerve_runtime::queue::Cancel::Requested => "requested",
            };
            return Ok((
                StatusCode::ACCEPTED,
                json!({ "execution_id": execution, "cancel": done }),
            ));
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("execution {execution} is not running in this server"),
        ))
    };
    app.respond(answer.await)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Decision {
    call_id: String,
    decision: Decided,
    reason: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Decided {
    Allow,
    Deny,
}

async fn approval(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    body: Result<Json<Decision>, JsonRejection>,
) -> Response {
    let answer = async {
        let token = authorize(&app, &headers, Scope::Approve)?;
        let execution = execution_id(&id)?;
        let Json(body) = body?;
        let deny = matches!(body.decision, Decided::Deny);
        // Parked a moment ago: its sandbox may still be closing.
        refuse_running(&app, execution).await?;
        let reason = body
            .reason
            .unwrap_or_else(|| format!("decided through the HTTP API (token {token})"));
        let (_, next) = nerve_runtime::resume::approve_call(
            app.db,
            &execution.to_string(),
            &body.call_id,
            deny,
            Some(reason),
        )
        .await?;
        // Decided in full: this server resumes it (a fleet's worker does, once requeued).
        let resumed = match next {
            Some(Approved::ToResume) => {
                let resumable =
                    nerve_runtime::resume::resumable(app.db, &execution.to_string()).await?;
                let (launch, start) =
                    nerve_runtime::launch::resumed(app.db, app.config, resumable, None, None)
                        .await?;
                app.runs.start(launch, start).await
            }
            Some(Approved::Requeued) | None => false,
        };
        Ok((
            StatusCode::OK,
            json!({
                "execution_id": execution,
                "call_id": body.call_id,
                "decision": if deny { "deny" } else { "allow" },
                "resumed": resumed,
                "requeued": matches!(next, Some(Approved::Requeued)),
            }),
        ))
    };
    app.respond(answer.await)
}
