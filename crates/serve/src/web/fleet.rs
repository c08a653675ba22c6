//! The fleet's page (`GET /fleet`): on a PostgreSQL log, the workers (each with its last
//! heartbeat and the executions it holds) and the task queue, newest first; a SQLite log
//! has no fleet, and the page says so in one line.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use nerve_runtime::log::{FleetTask, FleetWorker};

use super::{escape, logged_in, page, refused};
use crate::app::{App, read};

#[utoipa::path(
    get,
    path = "/fleet",
    tag = "web",
    operation_id = "web_fleet",
    security(("session" = [])),
    responses(
        (status = 200, description = "The workers (last heartbeat, the executions each holds) and the task queue of a PostgreSQL log; on a SQLite log, one line saying it has no fleet.", content_type = "text/html", body = String),
        (status = 401, description = "No session, or it ended, or its token was revoked: the login form.", content_type = "text/html", body = String),
    ),
)]
pub(crate) async fn fleet(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(form) = logged_in(&app, &headers).await {
        return *form;
    }
    let fleet = match read(&app, |reader| async move { Ok(reader.fleet().await?) }).await {
        Ok(fleet) => fleet,
        Err(error) => return refused(&app, &error),
    };
    let body = match fleet {
        None => "<h1>Fleet</h1><p class=\"no-fleet\">This log is a SQLite file: it has no fleet \
                 (no queue, no workers). <code>nerve submit</code> and <code>nerve worker</code> \
                 share a PostgreSQL log (<code>--db postgres://…</code>).</p>"
            .to_owned(),
        Some((tasks, workers)) => format!(
            "<h1>Fleet</h1><h2>Workers</h2>{}<h2>Queue</h2>{}",
            workers_table(&workers),
            queue_table(&tasks)
        ),
    };
    page(&app, StatusCode::OK, "Fleet", &body)
}

/// A link to an execution's page.
fn execution_link(id: &str) -> String {
    let id = escape(id);
    format!("<a href=\"/executions/{id}\">{id}</a>")
}

fn workers_table(workers: &[FleetWorker]) -> String {
    if workers.is_empty() {
        return "<p>No worker has said it is alive (<code>nerve worker</code>).</p>".to_owned();
    }
    let mut rows = String::new();
    for w in workers {
        let running: Vec<String> = w.executions.iter().map(|id| execution_link(id)).collect();
        let state = match &w.stopped_at {
            Some(at) => format!("stopped {}", escape(at)),
            None => "working".to_owned(),
        };
        let _ = write!(
            rows,
            "<tr class=\"worker\"><td class=\"name\">{}</td><td class=\"host\">{}</td>\
             <td class=\"seen\">{}</td><td class=\"worker-state\">{state}</td>\
             <td class=\"concurrency\">{}</td><td class=\"running\">{}</td></tr>",
            escape(&w.worker),
            escape(&w.host),
            escape(&w.last_seen),
            w.concurrency,
            if running.is_empty() {
                "none".to_owned()
            } else {
                running.join(" ")
            }
        );
    }
    format!(
        "<table id=\"workers\"><thead><tr><th>Worker</th><th>Host</th><th>Last heartbeat</th>\
         <th>State</th><th>Concurrency</th><th>Running</th></tr></thead><tbody>{rows}</tbody></table>"
    )
}

fn queue_table(tasks: &[FleetTask]) -> String {
    if tasks.is_empty() {
        return "<p>The queue is empty (<code>nerve submit</code>).</p>".to_owned();
    }
    let mut rows = String::new();
    for t in tasks {
        let state = if t.cancel_requested && t.state == "claimed" {
            "claimed, cancel requested".to_owned()
        } else {
            t.state.clone()
        };
        let _ = write!(
            rows,
            "<tr class=\"task\" data-state=\"{}\"><td>{}</td><td class=\"state\">{}</td>\
             <td>{}</td><td class=\"worker\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&t.state),
            execution_link(&t.execution_id),
            escape(&state),
            escape(&t.submitted_at),
            escape(t.worker.as_deref().unwrap_or_default()),
            escape(t.lease_until.as_deref().unwrap_or_default()),
            t.claims,
            escape(
                t.task
                    .as_deref()
                    .and_then(|task| task.lines().next())
                    .unwrap_or_default()
            ),
            escape(t.error.as_deref().unwrap_or_default()),
        );
    }
    format!(
        "<table id=\"queue\"><thead><tr><th>Execution</th><th>State</th><th>Submitted</th>\
         <th>Worker</th><th>Lease until</th><th>Claims</th><th>Task</th><th>Error</th></tr></thead>\
         <tbody>{rows}</tbody></table>"
    )
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
