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
use nerve_runtime::launch::ContinueRequest;
use nerve_runtime::resume::Approved;
use nerve_runtime::tokens::Scope;
use serde::Deserialize;
use serde_json::json;

use crate::actions::{create_execution, decide, refuse_running};
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
        .route("/executions", post(crate::web::start))
        .route("/executions/{id}", get(crate::web::execution))
        .route("/executions/{id}/approvals", post(crate::web::decide))
        .route("/assets/live.js", get(crate::web::live_js))
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
        authorize_read(&app, &headers).await?;
        let executions = read(&app, |reader| async move { Ok(reader.executions().await?) }).await?;
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
        authorize_read(&app, &headers).await?;
        let execution = execution_id(&id)?;
        let replayed = read(&app, move |reader| async move {
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
        authorize(&app, &headers, Scope::Run).await?;
        let Json(body) = body?;
        let execution = create_execution(&app, &body.workspace, body.task, body.provider).await?;
        Ok((StatusCode::CREATED, json!({ "execution_id": execution })))
    };
    app.respond(answer.await)
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
        authorize(&app, &headers, Scope::Run).await?;
        let execution = execution_id(&id)?;
        let Json(body) = body?;
        if body.text.trim().is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "the message is empty",
            ));
        }
        if nerve_runtime::log::is_postgres(app.db) {
            // As `nerve run --continue` (the CLI refuses it on a PostgreSQL log).
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "continuing an execution with a message on a PostgreSQL log is not built yet: `nerve export` it and `nerve import` it into a SQLite log to continue it there",
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

async fn cancel(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let answer = async {
        authorize(&app, &headers, Scope::Run).await?;
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
        let token = authorize(&app, &headers, Scope::Approve).await?;
        let execution = execution_id(&id)?;
        let Json(body) = body?;
        let deny = matches!(body.decision, Decided::Deny);
        let reason = body
            .reason
            .unwrap_or_else(|| format!("decided through the HTTP API (token {token})"));
        let (next, resumed) = decide(&app, execution, &body.call_id, deny, reason).await?;
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
