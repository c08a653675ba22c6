//! The routes of `/api/v1`: each checks the caller's token first, then does one thing
//! through the runtime, and answers JSON that went through the redactor.

use std::sync::{Arc, OnceLock};

use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use nerve_runtime::launch::ContinueRequest;
use nerve_runtime::resume::Approved;
use nerve_runtime::tokens::Scope;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::actions::{create_execution, decide, refuse_running};
use crate::app::{ApiError, App, execution_id, read};
use crate::auth::{authorize, authorize_read};
use crate::openapi::{
    Accepted, CancelAnswer, CancelState, CreateBody, Decision, DecisionAnswer, DecisionBody,
    ErrorBody, ExecutionItem, ExecutionList, ExecutionReport, MessageBody,
};

/// Every route, each registered with the router and with the OpenAPI description at once
/// (`routes!` reads the handler's `#[utoipa::path]`), so no route goes undescribed.
pub(crate) fn routes() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::with_openapi(crate::openapi::Frame::openapi())
        .routes(routes!(list, create))
        .routes(routes!(show))
        .routes(routes!(message))
        .routes(routes!(cancel))
        .routes(routes!(approval))
        .routes(routes!(crate::events::stream))
        .routes(routes!(crate::log_stream::stream))
        .routes(routes!(openapi_json))
        .routes(routes!(crate::web::home))
        .routes(routes!(crate::web::start))
        .routes(routes!(crate::web::execution::execution))
        .routes(routes!(crate::web::execution::decide))
        .routes(routes!(crate::web::fleet::fleet))
        .routes(routes!(crate::web::live_js))
        .routes(routes!(crate::web::login))
        .routes(routes!(crate::web::logout))
}

/// The server's router. No CORS layer: a browser on another origin gets no
/// `Access-Control-Allow-Origin`, so it cannot read an answer nor send a JSON body.
pub(crate) fn router(app: Arc<App>) -> Router {
    let limit = app.settings.body_limit;
    let (router, _) = routes().split_for_parts();
    router
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

/// A typed answer as the JSON value [`App::respond`] sends.
fn answer<T: serde::Serialize>(status: StatusCode, value: &T) -> crate::app::Answer {
    let value = serde_json::to_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the answer does not serialize: {e}"),
        )
    })?;
    Ok((status, value))
}

/// The executions, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/executions",
    tag = "api",
    operation_id = "list_executions",
    security(("bearer" = []), ("session" = [])),
    responses(
        (status = 200, description = "Every execution of the log, with the fields of `nerve list --json`.", body = ExecutionList),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
    ),
)]
pub(crate) async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    let answered = async {
        authorize_read(&app, &headers).await?;
        let executions = read(&app, |reader| async move { Ok(reader.executions().await?) }).await?;
        let executions = executions.into_iter().map(ExecutionItem::from).collect();
        answer(StatusCode::OK, &ExecutionList { executions })
    };
    app.respond(answered.await)
}

/// One execution, rebuilt from its log: the object of `nerve show --json`.
#[utoipa::path(
    get,
    path = "/api/v1/executions/{id}",
    tag = "api",
    operation_id = "show_execution",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    security(("bearer" = []), ("session" = [])),
    responses(
        (status = 200, description = "The object of `nerve show --json` (= `replay --json`).", body = ExecutionReport),
        (status = 400, description = "The id is not an execution id.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 404, description = "No execution with this id.", body = ErrorBody),
    ),
)]
pub(crate) async fn show(
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

/// Starts an execution in a workspace under a `--workspace-root`, with the server's run
/// options; it starts at once.
#[utoipa::path(
    post,
    path = "/api/v1/executions",
    tag = "api",
    operation_id = "create_execution",
    request_body = CreateBody,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Started.", body = Accepted),
        (status = 400, description = "A malformed body, an empty task, a workspace that is not a directory.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 403, description = "A scope below `run`; a workspace outside every `--workspace-root`; a provider the settings do not allow.", body = ErrorBody),
        (status = 413, description = "A body over `--max-body`.", body = ErrorBody),
        (status = 415, description = "Not `Content-Type: application/json`.", body = ErrorBody),
        (status = 422, description = "A body that is not this object (an unknown field, a missing one).", body = ErrorBody),
    ),
)]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Json<CreateBody>, JsonRejection>,
) -> Response {
    let answered = async {
        authorize(&app, &headers, Scope::Run).await?;
        let Json(body) = body?;
        let execution = create_execution(&app, &body.workspace, body.task, body.provider).await?;
        answer(
            StatusCode::CREATED,
            &Accepted {
                execution_id: execution.to_string(),
            },
        )
    };
    app.respond(answered.await)
}

/// Sends an execution its next message (as `nerve run --continue`); it runs again.
#[utoipa::path(
    post,
    path = "/api/v1/executions/{id}/messages",
    tag = "api",
    operation_id = "send_message",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    request_body = MessageBody,
    security(("bearer" = [])),
    responses(
        (status = 202, description = "The execution runs again with this message.", body = Accepted),
        (status = 400, description = "A malformed body or id, an empty message.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 403, description = "A scope below `run`.", body = ErrorBody),
        (status = 404, description = "No execution with this id.", body = ErrorBody),
        (status = 409, description = "The execution is running.", body = ErrorBody),
        (status = 413, description = "A body over `--max-body`.", body = ErrorBody),
        (status = 415, description = "Not `Content-Type: application/json`.", body = ErrorBody),
        (status = 422, description = "A body that is not this object.", body = ErrorBody),
    ),
)]
pub(crate) async fn message(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    body: Result<Json<MessageBody>, JsonRejection>,
) -> Response {
    let answered = async {
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
        answer(
            StatusCode::ACCEPTED,
            &Accepted {
                execution_id: execution.to_string(),
            },
        )
    };
    app.respond(answered.await)
}

/// Stops a running execution at once (as Ctrl-C stops `nerve run`), or a queued one.
#[utoipa::path(
    post,
    path = "/api/v1/executions/{id}/cancel",
    tag = "api",
    operation_id = "cancel_execution",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "It stops (`requested`), or, queued on a PostgreSQL log, will never run (`cancelled`).", body = CancelAnswer),
        (status = 400, description = "The id is not an execution id.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 403, description = "A scope below `run`.", body = ErrorBody),
        (status = 409, description = "It does not run in this server (on a SQLite log).", body = ErrorBody),
    ),
)]
pub(crate) async fn cancel(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let answered = async {
        authorize(&app, &headers, Scope::Run).await?;
        let execution = execution_id(&id)?;
        let cancelled = |cancel| {
            answer(
                StatusCode::ACCEPTED,
                &CancelAnswer {
                    execution_id: execution.to_string(),
                    cancel,
                },
            )
        };
        if app.runs.cancel(execution) {
            return cancelled(CancelState::Requested);
        }
        if nerve_runtime::log::is_postgres(app.db) {
            let (_, done) = nerve_runtime::queue::cancel(app.db, &execution.to_string()).await?;
            return cancelled(match done {
                nerve_runtime::queue::Cancel::Queued => CancelState::Cancelled,
                nerve_runtime::queue::Cancel::Requested => CancelState::Requested,
            });
        }
        Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("execution {execution} is not running in this server"),
        ))
    };
    app.respond(answered.await)
}

/// Decides a parked call, as `nerve approve` does; once no approval is left pending, the
/// execution resumes.
#[utoipa::path(
    post,
    path = "/api/v1/executions/{id}/approvals",
    tag = "api",
    operation_id = "decide_approval",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    request_body = DecisionBody,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Recorded.", body = DecisionAnswer),
        (status = 400, description = "A malformed body or id.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 403, description = "A scope below `approve`.", body = ErrorBody),
        (status = 404, description = "No call of this execution waits for a decision.", body = ErrorBody),
        (status = 409, description = "The execution is not parked.", body = ErrorBody),
        (status = 413, description = "A body over `--max-body`.", body = ErrorBody),
        (status = 415, description = "Not `Content-Type: application/json`.", body = ErrorBody),
        (status = 422, description = "A body that is not this object.", body = ErrorBody),
    ),
)]
pub(crate) async fn approval(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    body: Result<Json<DecisionBody>, JsonRejection>,
) -> Response {
    let answered = async {
        let token = authorize(&app, &headers, Scope::Approve).await?;
        let execution = execution_id(&id)?;
        let Json(body) = body?;
        let deny = body.decision == Decision::Deny;
        let reason = body
            .reason
            .unwrap_or_else(|| format!("decided through the HTTP API (token {token})"));
        let (next, resumed) = decide(&app, execution, &body.call_id, deny, reason).await?;
        answer(
            StatusCode::OK,
            &DecisionAnswer {
                execution_id: execution.to_string(),
                call_id: body.call_id,
                decision: body.decision,
                resumed,
                requeued: matches!(next, Some(Approved::Requeued)),
            },
        )
    };
    app.respond(answered.await)
}

/// The document, made once.
pub(crate) fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut document = serde_json::to_value(crate::api::routes().into_openapi())
            .unwrap_or_else(|e| {
                serde_json::json!({ "error": format!("the description does not serialize: {e}") })
            });
        absent_not_null(&mut document);
        serde_json::to_string_pretty(&document).unwrap_or_default()
    })
}

/// An optional parameter (a header or a query field) is absent or has a value; it is never
/// `null` (a header cannot be), whatever type utoipa writes for an `Option`.
fn absent_not_null(document: &mut serde_json::Value) {
    let Some(paths) = document.get_mut("paths").and_then(|p| p.as_object_mut()) else {
        return;
    };
    let parameters = paths
        .values_mut()
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("parameters"))
        .filter_map(|parameters| parameters.as_array_mut())
        .flatten();
    for parameter in parameters {
        let Some(types) = parameter.pointer_mut("/schema/type") else {
            continue;
        };
        let named: Vec<serde_json::Value> = types
            .as_array()
            .map(|list| list.iter().filter(|t| *t != "null").cloned().collect())
            .unwrap_or_default();
        if let [single] = named.as_slice() {
            *types = single.clone();
        }
    }
}

/// `GET /api/v1/openapi.json`: the description, to a reader (a token of scope `read`, as
/// every other route: "no route without authentication").
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    tag = "api",
    operation_id = "openapi",
    security(("bearer" = []), ("session" = [])),
    responses(
        (status = 200, description = "This document (OpenAPI 3.1).", content_type = "application/json", body = Object),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
    ),
)]
pub(crate) async fn openapi_json(
    axum::extract::State(app): axum::extract::State<std::sync::Arc<App>>,
    headers: HeaderMap,
) -> Response {
    if let Err(error) = authorize_read(&app, &headers).await {
        return app.respond(Err(error));
    }
    let mut response = (StatusCode::OK, document()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
