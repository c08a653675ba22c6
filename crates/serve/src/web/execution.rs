//! An execution's page: its state and totals (turns, tokens, cost, context fill), the
//! replay's completeness and gaps, the calls waiting for a decision (with Approve and Deny
//! buttons for a token that may decide them), the transcript `nerve show` prints, the
//! workspace's diff per turn, and, while it runs, its events as they arrive (`live.js`).
//! `POST /executions/{id}/approvals` is the buttons' form.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::FormRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nerve_core::{Event, TerminationReason};
use nerve_runtime::log::{Replay, StoredEvent};
use nerve_runtime::snapshots::Scope as DiffScope;
use nerve_runtime::tokens::Scope;
use serde::Deserialize;

use super::{escape, logged_in, page, refused, to_execution};
use crate::app::{App, execution_id, read};
use crate::auth::{same_origin, session};

/// The most turns whose diff the page shows (the latest ones).
const DIFF_TURNS: usize = 50;

#[utoipa::path(
    get,
    path = "/executions/{id}",
    tag = "web",
    operation_id = "web_execution",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    security(("session" = [])),
    responses(
        (status = 200, description = "The execution's page: state, totals, completeness and gaps, the calls waiting for a decision, the transcript, the diff per turn; live while it runs.", content_type = "text/html", body = String),
        (status = 400, description = "The id is not an execution id: a page saying why.", content_type = "text/html", body = String),
        (status = 401, description = "No session, or it ended, or its token was revoked: the login form.", content_type = "text/html", body = String),
        (status = 404, description = "No execution with this id: a page saying why.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn execution(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let scope = match logged_in(&app, &headers).await {
        Ok(scope) => scope,
        Err(form) => return *form,
    };
    let execution = match execution_id(&id) {
        Ok(execution) => execution,
        Err(error) => return refused(&app, &error),
    };
    let found = read(&app, move |reader| async move {
        let events = reader.events(execution).await?;
        let replayed = reader.replay(execution).await?;
        Ok((events, replayed))
    })
    .await;
    let (events, replayed) = match found {
        Ok(found) => found,
        // Started a moment ago (the start form leads here): nothing logged yet.
        Err(error) if error.status() == StatusCode::NOT_FOUND && app.runs.is_running(execution) => {
            return starting(&app, execution);
        }
        Err(error) => return refused(&app, &error),
    };
    let last = events.last();
    // Followed live while it runs here (the script reloads the page at its finish).
    let live = app.runs.is_running(execution);
    let mut body = format!("<h1>Execution <code>{execution}</code></h1>");
    body.push_str(&facts(&events, &replayed, live));
    body.push_str(&approvals(
        &replayed,
        execution,
        scope >= Scope::Approve,
        live,
    ));
    let transcript = nerve_runtime::views::transcript::transcript(&events, &replayed);
    let _ = write!(
        body,
        "<h2>Transcript</h2><pre id=\"transcript\">{}</pre>",
        escape(&transcript.join("\n"))
    );
    if live {
        let _ = write!(
            body,
            "<h2>Live events</h2><ol id=\"live\" aria-live=\"polite\" data-execution=\"{execution}\" data-after=\"{}\"></ol>\
             <script src=\"/assets/live.js\"></script>",
            last.map_or(0, |e| e.seq)
        );
    }
    body.push_str(&diffs(&app, execution, &replayed).await);
    page(&app, StatusCode::OK, &execution.to_string(), &body)
}

/// The page of an execution that has not logged its first event yet: it follows the
/// stream from the start.
fn starting(app: &App, execution: nerve_core::ExecutionId) -> Response {
    let body = format!(
        "<h1>Execution <code>{execution}</code></h1><h2>Summary</h2><dl class=\"facts\">\
         <dt>State</dt><dd class=\"state\">starting</dd></dl>\
         <h2>Live events</h2><ol id=\"live\" aria-live=\"polite\" data-execution=\"{execution}\" data-after=\"0\"></ol>\
         <script src=\"/assets/live.js\"></script>"
    );
    page(app, StatusCode::OK, &execution.to_string(), &body)
}

/// State, totals, context fill, and the replay's completeness and gaps.
fn facts(events: &[StoredEvent], replayed: &Replay, live: bool) -> String {
    let state = match replayed.termination_reason {
        // Running here (again, after a decision or a message).
        _ if live => "running".to_owned(),
        Some(reason) => reason.to_string(),
        None => "unfinished (no finish event)".to_owned(),
    };
    let mut out = String::from("<h2>Summary</h2><dl class=\"facts\">");
    let mut fact = |name: &str, class: &str, value: &str| {
        let _ = write!(
            out,
            "<dt>{name}</dt><dd class=\"{class}\">{}</dd>",
            escape(value)
        );
    };
    fact("State", "state", &state);
    if let Some(started) = &replayed.started {
        fact("Model", "model", &started.model);
        fact("Workspace", "workspace", &started.workspace);
    }
    fact("Turns", "turns", &replayed.total_turns.to_string());
    fact(
        "Tokens",
        "tokens",
        &format!(
            "{} in, {} out",
            replayed.usage.input_tokens, replayed.usage.output_tokens
        ),
    );
    fact("Cost", "cost", &format!("${:.4}", replayed.cost.as_usd()));
    fact("Context fill", "fill", &context_fill(events));
    let completeness = replayed.completeness();
    fact(
        "Replay",
        "completeness",
        &format!(
            "{:.0}% complete ({})",
            completeness * 100.0,
            if replayed.complete {
                "complete"
            } else {
                "incomplete"
            }
        ),
    );
    if let Some(error) = &replayed.error {
        // A parked execution's "error" says what it waits for.
        let parked = replayed.termination_reason == Some(TerminationReason::Parked);
        fact(if parked { "Waiting" } else { "Error" }, "error", error);
    }
    out.push_str("</dl>");
    if replayed.gaps.is_empty() {
        out.push_str("<p class=\"gaps\">No gaps in the log.</p>");
    } else {
        out.push_str("<h3>Gaps</h3><ul class=\"gaps\">");
        for gap in &replayed.gaps {
            let kind = serde_json::to_value(gap.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = write!(
                out,
                "<li><strong>{}</strong>: {}</li>",
                escape(&kind),
                escape(&gap.detail)
            );
        }
        out.push_str("</ul>");
    }
    out
}

/// The last completed turn's input tokens over the model's window.
fn context_fill(events: &[StoredEvent]) -> String {
    let mut window = None;
    let mut last = None;
    for stored in events {
        match serde_json::from_str::<Event>(&stored.payload) {
            Ok(Event::ContextCreated(created)) => window = created.context_window.or(window),
            Ok(Event::TurnCompleted(done)) => last = Some((done.turn, done.usage.input_tokens)),
            Ok(_) | Err(_) => {}
        }
    }
    match (last, window) {
        (None, _) => "no turn completed yet".to_owned(),
        (Some((turn, tokens)), Some(window)) if window > 0 => {
            // Token counts stay far below 2^52, where f64 is exact.
            #[allow(clippy::cast_precision_loss)]
            let share = tokens as f64 / window as f64 * 100.0;
            format!("{tokens} of {window} tokens ({share:.0}%) at turn {turn}")
        }
        (Some((turn, tokens)), _) => {
            format!("{tokens} tokens at turn {turn} (the window is unknown)")
        }
    }
}

/// The calls waiting for a decision, with the buttons when `may_decide`.
fn approvals(
    replayed: &Replay,
    execution: nerve_core::ExecutionId,
    may_decide: bool,
    live: bool,
) -> String {
    if replayed.pending_approvals.is_empty() || live {
        return String::new();
    }
    let mut out = String::from("<h2>Waiting for a decision</h2>");
    for pending in &replayed.pending_approvals {
        let call = &pending.call;
        let _ = write!(
            out,
            "<div class=\"approval\" data-call=\"{}\"><p><strong>{}</strong> <code>{}</code> (rule <code>{}</code>)</p>",
            escape(&call.id.to_string()),
            escape(&call.name),
            escape(&nerve_runtime::views::transcript::key_argument(call)),
            escape(&pending.rule)
        );
        if may_decide {
            for (decision, label) in [("allow", "Approve"), ("deny", "Deny")] {
                let _ = write!(
                    out,
                    "<form class=\"inline\" method=\"post\" action=\"/executions/{execution}/approvals\">\
                     <input type=\"hidden\" name=\"call_id\" value=\"{}\">\
                     <input type=\"hidden\" name=\"decision\" value=\"{decision}\">\
                     <button type=\"submit\" name=\"button\" value=\"{decision}\">{label}</button></form> ",
                    escape(&call.id.to_string())
                );
            }
        } else {
            out.push_str("<p>A token with scope <code>approve</code> decides it.</p>");
        }
        out.push_str("</div>");
    }
    out
}

/// What each turn that changed the workspace changed, newest last.
async fn diffs(app: &App, execution: nerve_core::ExecutionId, replayed: &Replay) -> String {
    let changed: Vec<u32> = replayed.workspace.changed.keys().copied().collect();
    if changed.is_empty() {
        return "<h2>Workspace changes</h2><p>No turn changed the workspace.</p>".to_owned();
    }
    let mut out = String::from("<h2>Workspace changes</h2>");
    let skip = changed.len().saturating_sub(DIFF_TURNS);
    if skip > 0 {
        let _ = write!(
            out,
            "<p>The last {DIFF_TURNS} of {} turns that changed it (<code>nerve diff</code> shows any).</p>",
            changed.len()
        );
    }
    for turn in changed.into_iter().skip(skip) {
        let text = nerve_runtime::snapshots::diff_text(
            app.db,
            &execution.to_string(),
            DiffScope::Turn(turn),
        )
        .await
        .unwrap_or_else(|e| e.to_string());
        let _ = write!(
            out,
            "<details class=\"diff\" open><summary>Turn {turn}</summary><pre class=\"diff\">{}</pre></details>",
            escape(&text)
        );
    }
    out
}

/// The Approve and Deny buttons.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct DecisionForm {
    /// The parked call's id.
    call_id: String,
    /// `allow` or `deny`.
    decision: String,
}

/// `POST /executions/{id}/approvals` (the Approve and Deny buttons): recorded as the API
/// records it; back to the page, which follows the resumed execution.
#[utoipa::path(
    post,
    path = "/executions/{id}/approvals",
    tag = "web",
    operation_id = "web_decide",
    params(("id" = String, Path, format = "uuid", description = "The execution's id (a whole UUID).")),
    request_body(content = DecisionForm, content_type = "application/x-www-form-urlencoded"),
    security(("session" = [])),
    responses(
        (status = 303, description = "Recorded (and resumed once nothing is left pending): to the execution's page."),
        (status = 400, description = "The id is not an execution id: a page saying why.", content_type = "text/html", body = String),
        (status = 401, description = "No session: a page saying why.", content_type = "text/html", body = String),
        (status = 403, description = "Not from this server's page, or a scope below `approve`: a page saying why.", content_type = "text/html", body = String),
        (status = 404, description = "No call of this execution waits for a decision: a page saying why.", content_type = "text/html", body = String),
        (status = 409, description = "The execution is not parked: a page saying why.", content_type = "text/html", body = String),
        (status = 415, description = "Not a form (`application/x-www-form-urlencoded`): a page saying why.", content_type = "text/html", body = String),
        (status = 422, description = "A field missing or malformed, a decision other than allow or deny: a page saying why.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn decide(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
    form: Result<Form<DecisionForm>, FormRejection>,
) -> Response {
    let decided = async {
        same_origin(&headers)?;
        let (name, _) = session(&app, &headers, Scope::Approve).await?;
        let execution = execution_id(&id)?;
        let Form(form) = form.map_err(super::form_refused)?;
        let deny = match form.decision.as_str() {
            "allow" => false,
            "deny" => true,
            other => {
                return Err(crate::app::ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("decision {other:?} is neither allow nor deny"),
                ));
            }
        };
        let reason = format!("decided in the web view (token {name})");
        crate::actions::decide(&app, execution, &form.call_id, deny, reason).await?;
        Ok(execution)
    };
    to_execution(&app, decided.await)
}
