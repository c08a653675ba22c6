//! `GET /api/v1/events`: every execution's events as Server-Sent Events, in the log's own
//! order, as they are appended. Each event's `id:` is its position in the log
//! (`nerve_runtime::log::LogPosition`: totally ordered across executions, and a reader
//! that resumes after one misses none and sees none twice) and its `data:` the event as
//! `events --json` lists it, with its `execution_id` (through the redactor).
//! `Last-Event-ID` (or `?after=POSITION` on a first connection) resumes after that
//! position; `?after=0` starts at the log's beginning; without either, the stream starts
//! at the log's end (the events appended from then on). It never ends by itself: the
//! client leaves, its token is revoked (or its web session ends), or the server stops.

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::response::sse::Event;
use nerve_runtime::log::{LogEvent, LogPosition};
use tokio::sync::mpsc;

use crate::app::{ApiError, App};
use crate::auth::{Credential, authorize_read};
use crate::events::{POLL, RECHECK};
use crate::openapi::{ErrorBody, LogEventItem};

/// The most events read from the log at once.
const BATCH: usize = 256;

/// `?after=POSITION`: where a stream starts when no `Last-Event-ID` says.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamFrom {
    after: Option<String>,
}

#[utoipa::path(
    get,
    path = "/api/v1/events",
    tag = "api",
    operation_id = "log_events",
    params(
        ("after" = Option<String>, Query, description = "Start after this position (a first connection; `Last-Event-ID` wins). `0`: the log's beginning. Without either: the log's end."),
        ("Last-Event-ID" = Option<String>, Header, description = "The position of the last event the client saw: the stream resumes after it."),
    ),
    security(("bearer" = []), ("session" = [])),
    responses(
        (status = 200, description = "Server-Sent Events of every execution, in the log's order: each event's `id:` is its position in the log (`N` on a SQLite log, `T.N` on a PostgreSQL log; opaque, send it back as `Last-Event-ID`) and its `data:` the event with its execution (the schema `LogEventItem`). It never ends by itself; comment lines keep it alive.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `Last-Event-ID` or `after` that is not a position of this log, or another query.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
    ),
)]
pub(crate) async fn stream(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    from: Result<Query<StreamFrom>, QueryRejection>,
) -> Response {
    let opened = async {
        authorize_read(&app, &headers).await?;
        let Query(from) = from.map_err(|_| {
            ApiError::new(StatusCode::BAD_REQUEST, "the query is not ?after=POSITION")
        })?;
        let asked = match headers.get("last-event-id") {
            Some(value) => Some(value.to_str().unwrap_or("(not text)").to_owned()),
            None => from.after,
        };
        let after = asked.map(|text| position(&app, &text)).transpose()?;
        let credential = Credential::required(&headers)?;
        // Where the log ends as the stream opens: what is appended from here on reaches
        // the client, also when it arrives before the follower's first read.
        let after = match after {
            Some(after) => after,
            None => {
                crate::app::read(&app, |reader| async move { Ok(reader.log_end().await?) }).await?
            }
        };
        Ok((after, credential))
    };
    let (after, credential) = match opened.await {
        Ok(opened) => opened,
        Err(error) => return app.respond(Err(error)),
    };
    // Until the client leaves, its credential ends, or the server stops.
    crate::events::sse(&app, move |app, sender| async move {
        follow(&app, after, &credential, &sender).await;
    })
}

/// `text` as a position of this server's log: `N` on SQLite, `T.N` (or `0`) on PostgreSQL.
fn position(app: &App, text: &str) -> Result<LogPosition, ApiError> {
    let bad = |why: String| ApiError::new(StatusCode::BAD_REQUEST, why);
    let position: LogPosition = text.parse().map_err(|e| bad(format!("{e}")))?;
    let postgres = nerve_runtime::log::is_postgres(app.db);
    match position {
        LogPosition::Row(0) => Ok(position),
        LogPosition::Row(_) if !postgres => Ok(position),
        LogPosition::Tx { .. } if postgres => Ok(position),
        LogPosition::Row(_) | LogPosition::Tx { .. } => Err(bad(format!(
            "{text:?} is not a position of this server's log ({} on a {} log)",
            if postgres { "T.N" } else { "N" },
            if postgres { "PostgreSQL" } else { "SQLite" }
        ))),
    }
}

/// The event as the stream's `data:` gives it.
fn data(logged: &LogEvent) -> String {
    let event = &logged.event;
    let item = LogEventItem {
        execution_id: event.execution_id.clone(),
        seq: event.seq,
        ts: event.ts.clone(),
        kind: event.kind.clone(),
        payload: serde_json::from_str(&event.payload).unwrap_or(serde_json::Value::Null),
    };
    serde_json::to_string(&item).unwrap_or_default()
}

/// Sends the events after `after` as they are appended, until the client leaves, the
/// `credential` that authorized the stream ends, or the server stops.
async fn follow(
    app: &App,
    mut after: LogPosition,
    credential: &Credential,
    sender: &mpsc::Sender<Event>,
) {
    let reader = match app.reader().await {
        Ok(reader) => reader,
        Err(error) => {
            tracing::warn!(%error, "the log's event stream cannot read the log");
            return;
        }
    };
    let mut checked = std::time::Instant::now();
    // Ends: when the client is gone (a send fails or the channel closed), when the
    // credential no longer holds (checked every RECHECK), or when the server stops.
    loop {
        if checked.elapsed() >= RECHECK {
            if !credential.still_valid(app).await {
                tracing::debug!(
                    "the log's event stream: its token was revoked or its session ended"
                );
                return;
            }
            checked = std::time::Instant::now();
        }
        let new = match reader.log_events_after(after, BATCH).await {
            Ok(new) => new,
            Err(error) => {
                tracing::warn!(%error, "the log's event stream stopped");
                return;
            }
        };
        for logged in &new {
            let event = Event::default()
                .id(logged.position.to_string())
                .data(app.redactor.redact(&data(logged)));
            if sender.send(event).await.is_err() {
                return;
            }
            after = logged.position;
        }
        // A full batch: more may be waiting already.
        if new.len() == BATCH && !app.stopping.is_cancelled() {
            continue;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = sender.closed() => return,
            () = app.stopping.cancelled() => return,
        }
    }
}
