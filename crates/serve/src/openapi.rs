//! The OpenAPI description of the server (`GET /api/v1/openapi.json`), generated from the
//! handlers' `#[utoipa::path]` attributes and the types below, which are the types the
//! routes answer with: an answer is one of these serialized, so the description cannot
//! say one thing while the route sends another. utoipa-axum registers every handler with
//! the router and with the description at once (`api::routes`).
//!
//! Two security schemes: the `Authorization: Bearer` token (`bearer`) and the web view's
//! session cookie (`session`), which stands for a token on the reading routes and the web
//! view's own forms only (docs/api.md). The document itself is made and served by `api`,
//! which owns the routes it describes.

use nerve_runtime::log::ExecutionSummary;
use serde::{Deserialize, Serialize};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// The document's frame: what it is, and its security schemes. The paths come from the
/// router (`api::routes`).
#[derive(OpenApi)]
#[openapi(
    info(
        title = "nerve serve",
        version = "1",
        description = "The HTTP API and web view of Nerve, an execution runtime for LLM agents (docs/api.md). Every route needs a token (`nerve token create`), except the login form (`GET /`, `POST /login`). Errors are `{\"error\": \"one line\"}`.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    tags(
        (name = "api", description = "The JSON API: `Authorization: Bearer TOKEN` (the reading routes also take the web view's session cookie)."),
        (name = "web", description = "The web view: server-rendered HTML; its forms need the session cookie and a same-origin `Origin` header."),
    ),
    components(schemas(EventItem, LogEventItem)),
    modifiers(&Schemes),
)]
pub(crate) struct Frame;

/// The security schemes every operation names.
struct Schemes;

/// The `bearer` scheme's name in the document.
pub(crate) const BEARER: &str = "bearer";
/// The `session` scheme's name in the document.
pub(crate) const SESSION: &str = "session";

impl Modify for Schemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("nerve_ and 64 hex digits")
                    .description(Some(
                        "An API token (`nerve token create --name N --scope read|run|approve|admin`). Scopes include the ones before them. Unknown or revoked: 401; a scope too weak: 403.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            SESSION,
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::auth::COOKIE,
                "The web view's session (`POST /login`), standing for a token: on the reading routes and the web view's own forms, never on `POST /api/v1/...`.",
            ))),
        );
    }
}

/// A refused or failed request.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    /// One line saying why.
    pub(crate) error: String,
}

/// `GET /api/v1/executions`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecutionList {
    /// Newest first.
    pub(crate) executions: Vec<ExecutionItem>,
}

/// An execution as `nerve list --json` lists it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ExecutionItem {
    pub(crate) execution_id: String,
    /// When it started (for a submission not started yet: when it was submitted).
    pub(crate) started_at: String,
    /// When its last event was written.
    pub(crate) updated_at: String,
    pub(crate) task: Option<String>,
    /// The directory it works on (for a submission not started yet: its path or `--git` URL).
    pub(crate) workspace: Option<String>,
    /// A child execution's parent (a `delegate` call's); absent for an execution of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) parent: Option<String>,
    /// With `parent`: the id of the parent's `delegate` call that started it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) call_id: Option<String>,
    pub(crate) loop_type: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) task_status: Option<String>,
    /// Null while it runs, or when it crashed before finishing.
    pub(crate) termination_reason: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) total_turns: u32,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost_micro_usd: u64,
    pub(crate) resumes: u32,
    /// The number of events (the last sequence number).
    pub(crate) events: u64,
    /// Only for a submission of a PostgreSQL log's queue that has no event yet: `queued`,
    /// `claimed`, `cancelled` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue_state: Option<String>,
}

impl From<ExecutionSummary> for ExecutionItem {
    /// Every field by name: a field the log adds does not compile until it is here, and so
    /// in the description.
    fn from(summary: ExecutionSummary) -> Self {
        let ExecutionSummary {
            execution_id,
            started_at,
            updated_at,
            task,
            workspace,
            parent,
            call_id,
            loop_type,
            model,
            task_status,
            termination_reason,
            error,
            total_turns,
            input_tokens,
            output_tokens,
            cost_micro_usd,
            resumes,
            events,
            queue_state,
        } = summary;
        Self {
            execution_id,
            started_at,
            updated_at,
            task,
            workspace,
            parent,
            call_id,
            loop_type,
            model,
            task_status,
            termination_reason,
            error,
            total_turns,
            input_tokens,
            output_tokens,
            cost_micro_usd,
            resumes,
            events,
            queue_state,
        }
    }
}

/// `GET /api/v1/executions/{id}`: the object of `nerve show --json` (= `replay --json`),
/// the execution rebuilt from its log. The route answers what the runtime's view makes;
/// a test reads that view into this type, which refuses a field it does not name.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Read by the test that keeps it equal to the view; documents the answer.
pub(crate) struct ExecutionReport {
    pub(crate) execution_id: String,
    /// How completely the log records the execution, 0 to 1.
    pub(crate) completeness: f64,
    /// Completeness at least 0.85.
    pub(crate) complete: bool,
    pub(crate) total_turns: u32,
    /// `completed`, `max_turns`, `budget_exhausted`, `shutdown`, `stagnation`, `error`,
    /// `parked` or `timed_out`; null when it never finished.
    pub(crate) termination_reason: Option<String>,
    pub(crate) task_status: Option<String>,
    pub(crate) task: Option<String>,
    /// The number of messages of the rebuilt conversation.
    pub(crate) messages: u64,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cache_read_tokens: u64,
    pub(crate) cache_write_tokens: u64,
    /// The share of input tokens served from the prompt cache, 0 to 1.
    pub(crate) cached_input_share: f64,
    pub(crate) cost_usd: f64,
    pub(crate) error: Option<String>,
    /// What the log does not say, and why it matters.
    pub(crate) gaps: Vec<GapItem>,
    pub(crate) malformed_events: u32,
    pub(crate) duplicate_turns: u32,
    /// The number of events.
    pub(crate) events: u64,
}

/// A gap of the replay.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // As `ExecutionReport`.
pub(crate) struct GapItem {
    /// `tool_call_in_doubt`, `turn_incomplete`, `no_finish`, `broken_chain`,
    /// `sequence_gap`, `turns_not_contiguous` or `approval_undecided`.
    pub(crate) kind: String,
    pub(crate) detail: String,
}

/// One event as `nerve events ID --json` lists it: the `data:` of the execution's stream.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // As `ExecutionReport`.
pub(crate) struct EventItem {
    /// Its sequence number in the execution (also the stream's `id:`).
    pub(crate) seq: u64,
    pub(crate) ts: String,
    /// `started`, `message_appended`, `tool_call_started`, `tool_call_finished`,
    /// `turn_completed`, `finish`, ... (docs/events.md).
    pub(crate) kind: String,
    /// The event's fields, as the log stores them (redacted).
    pub(crate) payload: serde_json::Value,
}

/// One event of the log-wide stream (`GET /api/v1/events`): the event with its execution.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LogEventItem {
    pub(crate) execution_id: String,
    pub(crate) seq: u64,
    pub(crate) ts: String,
    pub(crate) kind: String,
    pub(crate) payload: serde_json::Value,
}

/// `POST /api/v1/executions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateBody {
    /// A directory under one of the server's `--workspace-root`s.
    #[schema(value_type = String)]
    pub(crate) workspace: std::path::PathBuf,
    pub(crate) task: String,
    /// `--provider` or one of `--allow-provider` (default: `--provider`).
    pub(crate) provider: Option<String>,
}

/// `POST /api/v1/executions/{id}/messages`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessageBody {
    /// The execution's next message (as `nerve run --continue`).
    pub(crate) text: String,
}

/// `POST /api/v1/executions/{id}/approvals`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DecisionBody {
    /// The parked call's id (`nerve show` lists the calls waiting for a decision).
    pub(crate) call_id: String,
    pub(crate) decision: Decision,
    /// Recorded with the decision (default: `decided through the HTTP API (token NAME)`).
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Decision {
    Allow,
    Deny,
}

/// The answer to a created execution, or to a message that continues one.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Accepted {
    pub(crate) execution_id: String,
}

/// `POST /api/v1/executions/{id}/cancel`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct CancelAnswer {
    pub(crate) execution_id: String,
    pub(crate) cancel: CancelState,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CancelState {
    /// It runs (here, or on a fleet's worker): it stops at once.
    Requested,
    /// It was queued (a PostgreSQL log's queue): no worker will run it.
    Cancelled,
}

/// `POST /api/v1/executions/{id}/approvals`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DecisionAnswer {
    pub(crate) execution_id: String,
    pub(crate) call_id: String,
    pub(crate) decision: Decision,
    /// No approval is left pending and this server resumed the execution.
    pub(crate) resumed: bool,
    /// No approval is left pending and the execution went back to the fleet's queue.
    pub(crate) requeued: bool,
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
