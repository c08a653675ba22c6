//! What every route shares: the server's state ([`App`]), a refused request
//! ([`ApiError`], answered as `{"error": "one line"}` with its status), JSON answers
//! through the redactor, and reads of the log off the async workers.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use nerve_core::{ExecutionId, Redactor};
use nerve_runtime::config::Config;
use nerve_runtime::log::{Reader, SessionError};
use nerve_runtime::{ErrorKind, RuntimeError};
use serde_json::{Value, json};

use crate::Settings;
use crate::runs::Runs;
use crate::sessions::Sessions;

/// What every route shares.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) db: &'static Path,
    pub(crate) config: &'static Config,
    pub(crate) settings: Settings,
    /// The log's database, for the tokens.
    pub(crate) tokens: nerve_runtime::tokens::TokenStore,
    /// The configuration's secrets: every answer goes through it.
    pub(crate) redactor: Arc<Redactor>,
    pub(crate) runs: Runs,
    /// The web view's logins.
    pub(crate) sessions: Sessions,
    /// Cancelled when the server stops: the event streams end, so that the graceful
    /// shutdown, which waits for every answer to finish, does not wait for them forever.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
}

/// A refused or failed request: its status and one line saying why.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl std::fmt::Display) -> Self {
        Self {
            status,
            message: message.to_string(),
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> Self {
        let status = match error.kind() {
            ErrorKind::Usage | ErrorKind::Engine => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Provider | ErrorKind::Sandbox | ErrorKind::Log => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ErrorKind::Config | ErrorKind::Failed => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error)
    }
}

impl From<SessionError> for ApiError {
    fn from(error: SessionError) -> Self {
        if matches!(error, SessionError::UnknownExecution(_)) {
            return Self::new(StatusCode::NOT_FOUND, error);
        }
        RuntimeError::from(error).into()
    }
}

impl From<JsonRejection> for ApiError {
    /// axum's status (413 over the body limit, 415 without a JSON content type, 400 or
    /// 422 for a body that is not the route's object), with its text as one line.
    fn from(rejection: JsonRejection) -> Self {
        let text = rejection.body_text();
        Self::new(rejection.status(), text.lines().next().unwrap_or_default())
    }
}

pub(crate) type Answer = Result<(StatusCode, Value), ApiError>;

impl App {
    /// `value` (or the error) as a JSON response, through the redactor.
    pub(crate) fn respond(&self, answer: Answer) -> Response {
        let (status, value) = match answer {
            Ok(answer) => answer,
            Err(error) => (error.status, json!({ "error": error.message })),
        };
        let body = self.redactor.redact(&value.to_string()).into_owned();
        let mut response = (status, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        response
    }
}

/// The execution `id` names (a whole id).
pub(crate) fn execution_id(id: &str) -> Result<ExecutionId, ApiError> {
    id.parse()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("execution id {id:?}: {e}")))
}

impl App {
    /// The log's reader: the server's PostgreSQL pool, shared, or a SQLite connection of
    /// its own.
    pub(crate) async fn reader(&self) -> Result<Reader, RuntimeError> {
        match self.tokens.reader() {
            Some(shared) => Ok(shared),
            None => nerve_runtime::log::reader(self.db).await,
        }
    }
}

/// Runs `read` with the log's reader on a blocking thread: the SQLite reader holds a
/// connection that is not `Sync`, so its futures cannot run on the async workers.
pub(crate) async fn read<T, F, Fut>(app: &Arc<App>, read: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(Reader) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, ApiError>>,
{
    let handle = tokio::runtime::Handle::current();
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || {
        handle.block_on(async move {
            let reader = app.reader().await?;
            read(reader).await
        })
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("a log read failed: {e}"),
        )
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_errors_answer_with_the_status_of_whose_fault_it_was() {
        let check = |error: RuntimeError, status: StatusCode| {
            let message = error.to_string();
            let answer = ApiError::from(error);
            assert_eq!((answer.status, answer.message), (status, message));
        };
        check(
            RuntimeError::usage("workspace x: does not exist"),
            StatusCode::BAD_REQUEST,
        );
        check(
            RuntimeError::NotFound("no execution".into()),
            StatusCode::NOT_FOUND,
        );
        check(RuntimeError::conflict("not parked"), StatusCode::CONFLICT);
        check(
            RuntimeError::sandbox("no Docker"),
            StatusCode::SERVICE_UNAVAILABLE,
        );
        check(
            RuntimeError::failed("disk full"),
            StatusCode::INTERNAL_SERVER_ERROR,
        );
        let unknown = ApiError::from(SessionError::UnknownExecution("e".into()));
        assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    }
}
