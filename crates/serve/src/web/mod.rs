//! The web view, rendered on the server (everything it shows is readable without
//! JavaScript; one small embedded script makes an execution's page follow its event
//! stream): `GET /` logs in with a token (the form's input is named `token`) or lists the
//! executions with a form that starts one; `GET /executions/{id}` is an execution's page
//! (`execution.rs`). A login is a session whose id the HttpOnly, SameSite=Strict cookie
//! holds (Secure under TLS); the forms that change something also have to come from this
//! server's own page (`auth::same_origin`). Everything shown is escaped and passes the
//! redactor.

pub(crate) mod execution;
pub(crate) mod fleet;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::extract::rejection::FormRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use nerve_runtime::tokens::Scope;
use serde::Deserialize;

use crate::app::{ApiError, App, read};
use crate::auth::{COOKIE, check_scope, same_origin, session, session_cookie};
use crate::openapi::ErrorBody;

/// The script of an execution's page, embedded in the binary.
const LIVE_JS: &str = include_str!("live.js");

/// `text` safe inside HTML text and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            other => out.push(other),
        }
    }
    out
}

/// A whole page around `body`, through the redactor, with headers that allow scripts only
/// from this server and no framing.
fn page(app: &App, status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · nerve</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>\
         <body><header><a href=\"/\">nerve</a> · <a href=\"/fleet\">Fleet</a></header><main>{body}</main></body></html>",
        escape(title)
    );
    let html = app.redactor.redact(&html).into_owned();
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem}\
 table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.25rem .5rem;border-bottom:1px solid #ddd}\
 pre{white-space:pre-wrap;background:#f6f6f6;padding:.5rem}header{margin-bottom:1rem;font-weight:bold}\
 dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}dl.facts dt{font-weight:bold}\
 form.inline{display:inline}label{display:block;margin-top:.5rem}input[type=text],textarea{width:100%;box-sizing:border-box}\
 .approval{border:2px solid #c80;padding:.5rem;margin:.5rem 0}ol#live li{font-family:monospace;white-space:pre-wrap}\
 pre.diff{font-size:.9em}:focus{outline:3px solid #48c}";

/// A page saying why a web request was refused, with its status.
fn refused(app: &App, error: &ApiError) -> Response {
    let body = format!(
        "<h1>Refused</h1><p role=\"alert\">{}</p><p><a href=\"/\">Back to the executions</a></p>",
        escape(error.message())
    );
    page(app, error.status(), "Refused", &body)
}

fn login_form(app: &App, status: StatusCode, message: Option<&str>) -> Response {
    let message = message
        .map(|m| format!("<p role=\"alert\">{}</p>", escape(m)))
        .unwrap_or_default();
    let body = format!(
        "<h1>Log in</h1>{message}<form method=\"post\" action=\"/login\">\
         <label for=\"token\">API token (<code>nerve token create</code>)</label> \
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required> \
         <button type=\"submit\">Log in</button></form>"
    );
    page(app, status, "Log in", &body)
}

/// The scope of the request's live session, or the login form to answer with: `200` on
/// the home page without a session (where a visit starts), `401` on every other page.
pub(crate) async fn logged_in(app: &App, headers: &HeaderMap) -> Result<Scope, Box<Response>> {
    if session_cookie(headers).is_none() {
        return Err(Box::new(login_form(app, StatusCode::UNAUTHORIZED, None)));
    }
    session(app, headers, Scope::Read)
        .await
        .map(|(_, scope)| scope)
        .map_err(|_| {
            Box::new(login_form(
                app,
                StatusCode::UNAUTHORIZED,
                Some("The session ended or its token was revoked: log in again."),
            ))
        })
}

#[utoipa::path(
    get,
    path = "/",
    tag = "web",
    operation_id = "web_home",
    security((), ("session" = [])),
    responses(
        (status = 200, description = "Logged in: the executions, a Log out button and (scope `run` or more) the start form. Without a session: the login form (an input named `token`).", content_type = "text/html", body = String),
        (status = 401, description = "The session ended or its token was revoked: the login form.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn home(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if session_cookie(&headers).is_none() {
        return login_form(&app, StatusCode::OK, None);
    }
    let scope = match logged_in(&app, &headers).await {
        Ok(scope) => scope,
        Err(form) => return *form,
    };
    let executions = match read(&app, |reader| async move { Ok(reader.executions().await?) }).await
    {
        Ok(executions) => executions,
        Err(error) => return refused(&app, &error),
    };
    let mut rows = String::new();
    for e in &executions {
        let id = escape(&e.execution_id);
        let running = e
            .execution_id
            .parse()
            .is_ok_and(|execution| app.runs.is_running(execution));
        let state = match e.termination_reason.as_deref().or(e.queue_state.as_deref()) {
            // A parked execution just approved runs again here.
            _ if running => "running",
            Some(state) => state,
            None => "unfinished",
        };
        rows.push_str(&format!(
            "<tr><td><a href=\"/executions/{id}\">{id}</a></td><td>{}</td><td class=\"state\">{}</td><td>{}</td></tr>",
            escape(&e.started_at),
            escape(state),
            escape(e.task.as_deref().and_then(|t| t.lines().next()).unwrap_or_default())
        ));
    }
    let start = if scope >= Scope::Run {
        start_form(&app.settings.workspace_roots)
    } else {
        String::new()
    };
    let body = format!(
        "<h1>Executions</h1><form method=\"post\" action=\"/logout\"><button type=\"submit\">Log out</button></form>\
         {start}<table><thead><tr><th>ID</th><th>Started</th><th>State</th><th>Task</th></tr></thead><tbody>{rows}</tbody></table>"
    );
    page(&app, StatusCode::OK, "Executions", &body)
}

/// The form that starts an execution, with the workspaces under the roots to pick from.
fn start_form(roots: &[PathBuf]) -> String {
    if roots.is_empty() {
        return "<p>This server has no <code>--workspace-root</code>: executions cannot be started here.</p>"
            .to_owned();
    }
    let mut options = String::new();
    for root in roots {
        options.push_str(&format!(
            "<option value=\"{}\">",
            escape(&root.display().to_string())
        ));
        for dir in subdirectories(root) {
            options.push_str(&format!(
                "<option value=\"{}\">",
                escape(&dir.display().to_string())
            ));
        }
    }
    let first = escape(&roots[0].display().to_string());
    format!(
        "<h2>Start an execution</h2><form method=\"post\" action=\"/executions\" id=\"start\">\
         <label for=\"workspace\">Workspace (a directory under {first}{})</label>\
         <input id=\"workspace\" name=\"workspace\" type=\"text\" list=\"workspaces\" required>\
         <datalist id=\"workspaces\">{options}</datalist>\
         <label for=\"task\">Task</label><textarea id=\"task\" name=\"task\" rows=\"3\" required></textarea>\
         <p><button type=\"submit\">Start</button></p></form>",
        if roots.len() > 1 {
            " or another root"
        } else {
            ""
        }
    )
}

/// The directories directly under `root`, by name, at most 100 (a hint, not a listing).
fn subdirectories(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .take(100)
        .collect();
    dirs.sort();
    dirs
}

/// The start form.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct Start {
    /// A directory under a `--workspace-root`.
    #[schema(value_type = String)]
    workspace: PathBuf,
    task: String,
}

/// `POST /executions` (the start form): the execution starts, and its page follows it.
#[utoipa::path(
    post,
    path = "/executions",
    tag = "web",
    operation_id = "web_start",
    request_body(content = Start, content_type = "application/x-www-form-urlencoded"),
    security(("session" = [])),
    responses(
        (status = 303, description = "Started: to its page (`Location`)."),
        (status = 400, description = "An empty task, a workspace that is not a directory: a page saying why.", content_type = "text/html", body = String),
        (status = 401, description = "No session: a page saying why.", content_type = "text/html", body = String),
        (status = 403, description = "Not from this server's page (`Origin`, `Sec-Fetch-Site`), a scope below `run`, a workspace outside every `--workspace-root`: a page saying why.", content_type = "text/html", body = String),
        (status = 415, description = "Not a form (`application/x-www-form-urlencoded`): a page saying why.", content_type = "text/html", body = String),
        (status = 422, description = "A field missing or malformed: a page saying why.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn start(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    form: Result<Form<Start>, FormRejection>,
) -> Response {
    let started = async {
        same_origin(&headers)?;
        session(&app, &headers, Scope::Run).await?;
        let Form(form) = form.map_err(form_refused)?;
        crate::actions::create_execution(&app, &form.workspace, form.task, None).await
    };
    to_execution(&app, started.await)
}

/// A form body that is not the form's (not `application/x-www-form-urlencoded`: 415; a
/// field missing or malformed: 422), as a refusal; checked after the credentials, as
/// everything a route does.
pub(crate) fn form_refused(rejection: FormRejection) -> ApiError {
    let text = rejection.body_text();
    ApiError::new(rejection.status(), text.lines().next().unwrap_or_default())
}

/// After a form that acted on an execution: its page, or why the form was refused.
fn to_execution(app: &App, acted: Result<nerve_core::ExecutionId, ApiError>) -> Response {
    match acted {
        Ok(execution) => see_other(&format!("/executions/{execution}"), None),
        Err(error) => refused(app, &error),
    }
}

/// The login form.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct Login {
    /// An API token (`nerve token create`).
    token: String,
}

#[utoipa::path(
    post,
    path = "/login",
    tag = "web",
    operation_id = "web_login",
    request_body(content = Login, content_type = "application/x-www-form-urlencoded"),
    security(()),
    responses(
        (status = 303, description = "Logged in: to `/`, with the session cookie (`Set-Cookie: nerve_session=...; HttpOnly; SameSite=Strict`)."),
        (status = 401, description = "An unknown or revoked token: the login form again.", content_type = "text/html", body = String),
        (status = 403, description = "Not from this server's page (`Origin`, `Sec-Fetch-Site`).", content_type = "text/html", body = String),
        (status = 415, description = "Not a form (`application/x-www-form-urlencoded`): a page saying why.", content_type = "text/html", body = String),
        (status = 422, description = "No `token` field: a page saying why.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn login(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    login: Result<Form<Login>, FormRejection>,
) -> Response {
    if let Err(error) = same_origin(&headers) {
        return refused(&app, &error);
    }
    let Form(login) = match login {
        Ok(login) => login,
        Err(rejection) => return refused(&app, &form_refused(rejection)),
    };
    let token = login.token.trim();
    if check_scope(&app, token, Scope::Read).await.is_err() {
        return login_form(
            &app,
            StatusCode::UNAUTHORIZED,
            Some("The token is unknown or revoked."),
        );
    }
    let Some(id) = app.sessions.start(token) else {
        return refused(
            &app,
            &ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the operating system gave no randomness for a session",
            ),
        );
    };
    let secure = if app.settings.tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    let lifetime = crate::sessions::LIFETIME.as_secs();
    see_other(
        "/",
        Some(&format!(
            "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={lifetime}{secure}"
        )),
    )
}

/// `POST /logout`: the session ends (its cookie is refused from now on) and is cleared.
#[utoipa::path(
    post,
    path = "/logout",
    tag = "web",
    operation_id = "web_logout",
    security(("session" = [])),
    responses(
        (status = 303, description = "The session ended: to `/`, the cookie cleared."),
        (status = 403, description = "Not from this server's page (`Origin`, `Sec-Fetch-Site`).", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn logout(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(error) = same_origin(&headers) {
        return refused(&app, &error);
    }
    if let Some(id) = session_cookie(&headers) {
        app.sessions.end(id);
    }
    let secure = if app.settings.tls.is_some() {
        "; Secure"
    } else {
        ""
    };
    see_other(
        "/",
        Some(&format!(
            "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}"
        )),
    )
}

/// `GET /assets/live.js`, for a logged-in page only (no route without authentication).
#[utoipa::path(
    get,
    path = "/assets/live.js",
    tag = "web",
    operation_id = "web_script",
    security(("session" = [])),
    responses(
        (status = 200, description = "The script that makes an execution's page follow its event stream.", content_type = "text/javascript", body = String),
        (status = 401, description = "No web session.", body = ErrorBody),
    ),
)]
pub(crate) async fn live_js(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(error) = session(&app, &headers, Scope::Read).await {
        return app.respond(Err(error));
    }
    let mut response = LIVE_JS.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/javascript; charset=utf-8"),
    );
    response
}

/// A 303 to `location`, setting `cookie` when given.
fn see_other(location: &str, cookie: Option<&str>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(location) {
        headers.insert(header::LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}
