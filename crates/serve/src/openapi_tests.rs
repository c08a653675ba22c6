//! The description against the server itself: a snapshot of the document (so a change of
//! the API shows in review), every route of the router described with exactly its
//! methods, the served document behind a token, and the documented answers equal to the
//! runtime's views they describe.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use nerve_runtime::config::Config;
use nerve_runtime::tokens::Scope;
use serde_json::Value;
use tower::ServiceExt as _;

use super::*;
use crate::Server;
use crate::api::document;

fn doc() -> Value {
    serde_json::from_str(document()).unwrap()
}

/// A server on a fresh SQLite log (not serving: its router is called in-process), and a
/// token of scope `read`.
async fn server() -> (tempfile::TempDir, Server, String) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let settings = crate::test_settings();
    let server = Server::bind(db.clone(), Config::default(), settings)
        .await
        .unwrap();
    let token = nerve_runtime::tokens::create(&db, "reader", Scope::Read)
        .await
        .unwrap();
    (dir, server, token)
}

async fn call(
    server: &Server,
    method: Method,
    path: &str,
    token: Option<&str>,
) -> (StatusCode, String) {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = crate::api::router(std::sync::Arc::clone(&server.app))
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[test]
fn the_document_is_the_reviewed_one() {
    insta::assert_snapshot!("openapi.json", document());
}

/// The router's paths, read from its `Debug` form (axum lists its routes' paths there and
/// nowhere else): what the server really routes, not what the description says.
fn router_paths() -> BTreeSet<String> {
    let (router, _) = crate::api::routes().split_for_parts();
    let debug = format!("{router:?}");
    let paths: BTreeSet<String> = debug
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|text| text.starts_with('/') && !text.contains("__private__axum"))
        .map(str::to_owned)
        .collect();
    assert!(
        paths.contains("/api/v1/executions"),
        "axum's Debug no longer lists the paths: read them another way: {debug}"
    );
    paths
}

/// `{id}` filled with an id no execution has.
fn concrete(path: &str) -> String {
    path.replace("{id}", "01a2213d-f2a1-76d4-9b21-7fda99b76c0c")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_described_with_exactly_its_methods() {
    let doc = doc();
    let described: BTreeMap<String, BTreeSet<String>> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(path, item)| {
            let methods = item.as_object().unwrap().keys().cloned().collect();
            (path.clone(), methods)
        })
        .collect();
    assert_eq!(
        router_paths(),
        described.keys().cloned().collect::<BTreeSet<_>>(),
        "the router's paths and the description's"
    );
    let (_dir, server, _) = server().await;
    for (path, methods) in &described {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::PATCH,
        ] {
            let name = method.as_str().to_ascii_lowercase();
            let (status, body) = call(&server, method.clone(), &concrete(path), None).await;
            if methods.contains(&name) {
                assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{name} {path}");
                assert!(!body.contains("no such route"), "{name} {path}: {body}");
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{name} {path} is routed but not described"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_document_is_served_to_a_reader_only() {
    let (_dir, server, token) = server().await;
    let (status, body) = call(&server, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, body) = call(&server, Method::GET, "/api/v1/openapi.json", Some(&token)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, document());
}

#[test]
fn every_operation_names_its_security_and_every_json_answer_its_schema() {
    let doc = doc();
    let schemes: BTreeSet<&str> = doc["components"]["securitySchemes"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(schemes, BTreeSet::from([BEARER, SESSION]));
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let security = operation["security"].as_array();
            assert!(
                security.is_some_and(|s| !s.is_empty()),
                "{method} {path} names no security"
            );
            let open = security
                .unwrap()
                .iter()
                .any(|s| s.as_object().is_some_and(serde_json::Map::is_empty));
            // Only the login form answers without a credential.
            assert_eq!(
                open,
                (path == "/" && method == "get") || path == "/login",
                "{method} {path}"
            );
            for (status, response) in operation["responses"].as_object().unwrap() {
                if let Some(json) = response["content"].get("application/json") {
                    assert!(json["schema"].is_object(), "{method} {path} {status}");
                }
            }
        }
    }
}

/// The properties the description gives schema `name`.
fn properties(name: &str) -> BTreeSet<String> {
    doc()["components"]["schemas"][name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no schema {name}"))
        .keys()
        .cloned()
        .collect()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn the_documented_answers_are_the_runtime_views() {
    // An execution with no event: every field of the view is there (most empty), and a
    // gap (no finish).
    let replayed = nerve_session::replay("01a2213d-f2a1-76d4-9b21-7fda99b76c0c", &[]);
    let shown = nerve_runtime::views::json::replay_json(&replayed);
    assert_eq!(keys(&shown), properties("ExecutionReport"));
    let report: ExecutionReport = serde_json::from_value(shown.clone()).unwrap();
    assert!(!report.gaps.is_empty(), "{shown}");
    assert_eq!(keys(&shown["gaps"][0]), properties("GapItem"));

    let stored = nerve_runtime::log::StoredEvent {
        execution_id: "01a2213d-f2a1-76d4-9b21-7fda99b76c0c".to_owned(),
        seq: 1,
        ts: "2026-01-01T00:00:00.000000Z".to_owned(),
        kind: "finish".to_owned(),
        version: 1,
        payload: r#"{"termination_reason":"completed"}"#.to_owned(),
        prev_hash: String::new(),
        hash: String::new(),
    };
    let event = nerve_runtime::views::json::event_json(&stored);
    assert_eq!(keys(&event), properties("EventItem"));
    serde_json::from_value::<EventItem>(event.clone()).unwrap();
    let mut logged = properties("EventItem");
    logged.insert("execution_id".to_owned());
    assert_eq!(properties("LogEventItem"), logged);

    let summary = nerve_runtime::log::ExecutionSummary {
        execution_id: "e".to_owned(),
        started_at: "s".to_owned(),
        updated_at: "u".to_owned(),
        task: None,
        workspace: None,
        parent: Some("p".to_owned()),
        call_id: Some("c".to_owned()),
        loop_type: None,
        model: None,
        task_status: None,
        termination_reason: None,
        error: None,
        total_turns: 0,
        input_tokens: 0,
        output_tokens: 0,
        cost_micro_usd: 0,
        resumes: 0,
        events: 0,
        queue_state: Some("queued".to_owned()),
    };
    let listed = serde_json::to_value(&summary).unwrap();
    let item = serde_json::to_value(ExecutionItem::from(summary)).unwrap();
    assert_eq!(item, listed, "the API lists what `nerve list --json` does");
    assert_eq!(keys(&item), properties("ExecutionItem"));
}
