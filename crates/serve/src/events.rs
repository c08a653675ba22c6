//! `GET /api/v1/executions/{id}/events`: the execution's events as Server-Sent Events,
//! each with `id:` its sequence number and `data:` the event as `events --json` lists it
//! (through the redactor). `Last-Event-ID` resumes after that sequence number (so does
//! `?after=N`, for a browser's `EventSource`, which cannot send the header at first). The
//! stream ends after the execution's `finish` event; an execution this server has just
//! started is waited for until its first event. A SQLite log is read every
//! [`POLL`] through a read-only connection, which never blocks the writer.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use nerve_core::ExecutionId;
use nerve_runtime::log::SessionError;
use tokio::sync::mpsc;

use crate::app::{ApiError, App, execution_id};
use crate::auth::{Credential, authorize_read};
use crate::openapi::ErrorBody;

/// How often the log is read for new events.
pub(crate) const POLL: Duration = Duration::from_millis(200);
/// Events buffered for a slow client before the reader waits for it.
const BUFFER: usize = 256;
/// How often a stream checks that its token (or web session) still holds: a revocation or
/// a logout ends the streams it authorized within this.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// `?after=N`: where a stream starts when no `Last-Event-ID` says.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamFrom {
    after: Option<u64>,
}

#[utoipa::path(
    get,
    path = "/api/v1/executions/{id}/events",
    tag = "api",
    operation_id = "execution_events",
    params(
        ("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID)."),
        ("after" = Option<u64>, Query, description = "Start after this sequence number (for a first connection; `Last-Event-ID` wins)."),
        ("Last-Event-ID" = Option<u64>, Header, description = "The sequence number of the last event the client saw: the stream resumes after it."),
    ),
    security(("bearer" = []), ("session" = [])),
    responses(
        (status = 200, description = "Server-Sent Events: each event's `id:` is its sequence number and its `data:` the event as `nerve events ID --json` lists it (the schema `EventItem`). The stream ends after the execution's `finish` event; comment lines keep it alive.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A malformed id, `Last-Event-ID` or query.", body = ErrorBody),
        (status = 401, description = "No token, or an unknown or revoked one.", body = ErrorBody),
        (status = 404, description = "No execution with this id.", body = ErrorBody),
    ),
)]
pub(crate) async fn stream(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    from: Result<Query<StreamFrom>, QueryRejection>,
) -> Response {
    let opened = async {
        authorize_read(&app, &headers).await?;
        let execution = execution_id(&id)?;
        let Query(from) = from.map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "the query is not ?after=SEQUENCE_NUMBER",
            )
        })?;
        let after = if headers.contains_key("last-event-id") {
            last_event_id(&headers)?
        } else {
            from.after.unwrap_or(0)
        };
        // Known before the stream starts: a 404 is a status, not an empty stream.
        let known = app.runs.is_running(execution)
            || crate::app::read(&app, move |reader| async move {
                match reader.events_after(execution, 0).await {
                    Ok(events) => Ok(!events.is_empty()),
                    Err(SessionError::UnknownExecution(_)) => Ok(false),
                    Err(error) => Err(error.into()),
                }
            })
            .await?;
        if !known {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no execution with id {execution}"),
            ));
        }
        let credential = Credential::required(&headers)?;
        Ok((execution, after, credential))
    };
    let (execution, after, credential) = match opened.await {
        Ok(opened) => opened,
        Err(error) => return app.respond(Err(error)),
    };
    sse(&app, move |app, sender| async move {
        follow(&app, execution, after, &credential, &sender).await;
    })
}

/// A `text/event-stream` answer of the events `follow` sends. The follower runs on a
/// blocking thread (the SQLite reader is not `Sync`); the stream ends when it returns
/// (it returns when the client goes away too: its sends fail).
pub(crate) fn sse<F, Fut>(app: &Arc<App>, follow: F) -> Response
where
    F: FnOnce(Arc<App>, mpsc::Sender<Event>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (sender, receiver) = mpsc::channel::<Event>(BUFFER);
    let follower = Arc::clone(app);
    tokio::task::spawn_blocking(move || {
        let handle = tokio::runtime::Handle::current();
        handle.block_on(follow(follower, sender));
    });
    let events = tokio_stream(receiver).map(Ok::<_, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The receiver as a stream, item by item.
pub(crate) fn tokio_stream(
    receiver: mpsc::Receiver<Event>,
) -> impl futures_util::Stream<Item = Event> {
    futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|event| (event, receiver))
    })
}

/// The sequence number the client saw last (`Last-Event-ID`), 0 without one.
fn last_event_id(headers: &HeaderMap) -> Result<u64, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(0);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "Last-Event-ID is not an event's sequence number",
            )
        })
}

/// Sends the events after `after` as they are appended, until the finish event, the
/// client's leaving, an execution that stopped running here without one, or the end of
/// the `credential` that authorized the stream.
async fn follow(
    app: &App,
    execution: ExecutionId,
    mut after: u64,
    credential: &Credential,
    sender: &mpsc::Sender<Event>,
) {
    let reader = match app.reader().await {
        Ok(reader) => reader,
        Err(error) => {
            tracing::warn!(%error, "an event stream cannot read the log");
            return;
        }
    };
    // A client that resumes after the finish event has seen everything, unless the
    // execution runs on here (a message or an approval continued it).
    let finished = after > 0
        && reader
            .events_after(execution, after - 1)
            .await
            .is_ok_and(|seen| {
                seen.first()
                    .is_some_and(|e| e.seq == after && e.kind == "finish")
            });
    let mut checked = std::time::Instant::now();
    // Ends: at the finish event, when the client is gone (a send fails or the channel
    // closed), when the server stops, when the credential no longer holds, or when the
    // execution does not run here and the client has seen its finish (or it has no event).
    loop {
        if checked.elapsed() >= RECHECK {
            if !credential.still_valid(app).await {
                tracing::debug!(%execution, "an event stream's token was revoked or its session ended");
                return;
            }
            checked = std::time::Instant::now();
        }
        let running = app.runs.is_running(execution);
        let new = match reader.events_after(execution, after).await {
            Ok(new) => new,
            Err(SessionError::UnknownExecution(_)) => Vec::new(),
            Err(error) => {
                tracing::warn!(%error, %execution, "an event stream stopped");
                return;
            }
        };
        for stored in &new {
            let data = nerve_runtime::views::json::event_json(stored).to_string();
            let event = Event::default()
                .id(stored.seq.to_string())
                .data(app.redactor.redact(&data));
            if sender.send(event).await.is_err() {
                return;
            }
            after = stored.seq;
            if stored.kind == "finish" {
                return;
            }
        }
        // Not running here and nothing new: the client saw its finish already, or it never
        // started (a launch that failed before its first event).
        if new.is_empty() && !running && (finished || after == 0) {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = sender.closed() => return,
            () = app.stopping.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn check(value: Option<&str>, expected: Result<u64, ()>) {
        let mut headers = HeaderMap::new();
        if let Some(value) = value {
            headers.insert("last-event-id", HeaderValue::from_str(value).unwrap());
        }
        assert_eq!(
            last_event_id(&headers).map_err(|_| ()),
            expected,
            "{value:?}"
        );
    }

    #[test]
    fn last_event_id_is_a_sequence_number() {
        check(None, Ok(0));
        check(Some("42"), Ok(42));
        check(Some(" 7 "), Ok(7));
        check(Some("-1"), Err(()));
        check(Some("seven"), Err(()));
        check(Some(""), Err(()));
    }
}
