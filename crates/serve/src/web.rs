//! The web view, server-rendered (no JavaScript needed to read it; a few lines of it make
//! an execution's page follow its event stream): `GET /` logs in with a token (the form's
//! input is named `token`) or lists the executions; `GET /executions/{id}` shows one as the
//! transcript `nerve show` prints and appends its events as they arrive. The token is kept
//! in an HttpOnly, SameSite=Strict cookie, which only the reading routes accept. Everything
//! shown is escaped and passes the redactor. The page's markup is embedded here.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use nerve_runtime::tokens::Scope;
use serde::Deserialize;

use crate::app::{App, execution_id, read};
use crate::auth::{COOKIE, check, cookie_token};

/// `text` safe inside HTML text and attribute values.
fn escape(text: &str) -> String {
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

fn page(app: &App, status: StatusCode, title: &str, body: &str) -> Response {
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · nerve</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>\
         <body><header><a href=\"/\">nerve</a></header><main>{body}</main></body></html>",
        escape(title)
    );
    let html = app.redactor.redact(&html).into_owned();
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Scripts only from this page itself; never framed by another site.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
    );
    response
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:1rem}\
 table{border-collapse:collapse;width:100%}td,th{text-align:left;padding:.25rem .5rem;border-bottom:1px solid #ddd}\
 pre{white-space:pre-wrap;background:#f6f6f6;padding:.5rem}header{margin-bottom:1rem;font-weight:bold}";

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

/// The live token of the request's cookie, or the login form to answer with.
fn logged_in(app: &App, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let Some(token) = cookie_token(headers) else {
        return Err(Box::new(login_form(app, StatusCode::OK, None)));
    };
    check(app, token, Scope::Read).map(|_| ()).map_err(|_| {
        Box::new(login_form(
            app,
            StatusCode::UNAUTHORIZED,
            Some("The token is unknown or revoked: log in again."),
        ))
    })
}

pub(crate) async fn home(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(form) = logged_in(&app, &headers) {
        return *form;
    }
    let executions = match read(
        app.db,
        |reader| async move { Ok(reader.executions().await?) },
    )
    .await
    {
        Ok(executions) => executions,
        Err(error) => return app.respond(Err(error)),
    };
    let mut rows = String::new();
    for e in &executions {
        let id = e.execution_id.to_string();
        rows.push_str(&format!(
            "<tr><td><a href=\"/executions/{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&e.started_at),
            escape(
                e.termination_reason
                    .as_deref()
                    .or(e.queue_state.as_deref())
                    .unwrap_or("running")
            ),
            escape(e.task.as_deref().and_then(|t| t.lines().next()).unwrap_or_default())
        ));
    }
    let body = format!(
        "<h1>Executions</h1><form method=\"post\" action=\"/logout\"><button type=\"submit\">Log out</button></form>\
         <table><thead><tr><th>ID</th><th>Started</th><th>State</th><th>Task</th></tr></thead><tbody>{rows}</tbody></table>"
    );
    page(&app, StatusCode::OK, "Executions", &body)
}

pub(crate) async fn execution(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if let Err(form) = logged_in(&app, &headers) {
        return *form;
    }
    let answer = async {
        let execution = execution_id(&id)?;
        read(app.db, move |reader| async move {
            let events = reader.events(execution).await?;
            let replayed = reader.replay(execution).await?;
            let last = events.last().map_or(0, |e| e.seq);
            Ok((
                nerve_runtime::views::transcript::transcript(&events, &replayed),
                last,
            ))
        })
        .await
    };
    let (lines, last) = match answer.await {
        Ok(found) => found,
        Err(error) => return app.respond(Err(error)),
    };
    let transcript = escape(&lines.join("\n"));
    // Follows the stream from the last event shown (the cookie goes with it); each event
    // arriving is appended as a line. Without JavaScript the page is the transcript.
    let body = format!(
        "<h1>Execution <code>{id}</code></h1><pre id=\"transcript\">{transcript}</pre>\
         <h2>Live events</h2><ol id=\"live\" aria-live=\"polite\"></ol>\
         <script>(function(){{var s=new EventSource('/api/v1/executions/{id}/events');\
         s.onmessage=function(m){{var e=JSON.parse(m.data);if(e.seq<={last})return;var li=document.createElement('li');\
         li.className='event';li.textContent=e.seq+' '+e.kind;document.getElementById('live').appendChild(li);\
         if(e.kind==='finish')s.close();}};}})();</script>",
        id = escape(&id)
    );
    page(&app, StatusCode::OK, &id, &body)
}

#[derive(Debug, Deserialize)]
pub(crate) struct Login {
    token: String,
}

pub(crate) async fn login(State(app): State<Arc<App>>, Form(login): Form<Login>) -> Response {
    let token = login.token.trim();
    if check(&app, token, Scope::Read).is_err() {
        return login_form(
            &app,
            StatusCode::UNAUTHORIZED,
            Some("The token is unknown or revoked."),
        );
    }
    redirect_home(&format!(
        "{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/"
    ))
}

pub(crate) async fn logout() -> Response {
    redirect_home(&format!(
        "{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"
    ))
}

fn redirect_home(cookie: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    let headers = response.headers_mut();
    headers.insert(header::LOCATION, HeaderValue::from_static("/"));
    if let Ok(cookie) = HeaderValue::from_str(cookie) {
        headers.insert(header::SET_COOKIE, cookie);
    }
    response
}
