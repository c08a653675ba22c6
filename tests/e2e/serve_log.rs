//! `nerve serve`'s log-wide event stream (`GET /api/v1/events`), its OpenAPI description
//! and its fleet page, from outside: the real binary on a real socket. Two executions run
//! at once in real sandboxes; one stream of the whole log, interrupted and resumed with
//! `Last-Event-ID`, yields every event of both exactly once, in the log's order.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::serve::{SECRET, json_of, login, raw_request, request, serve, slowed_demo, token};
use crate::support::{PATIENCE, copy_example, docker_available, nerve, stdout};

/// The log-wide stream from `after` (`?after=` on a first connection) or `last_event_id`
/// (a reconnection): the events as `(id, data)` until `enough` says so (then the
/// connection is dropped) or the server ends the stream; and the raw text.
fn log_stream(
    addr: &str,
    token: &str,
    after: Option<&str>,
    last_event_id: Option<&str>,
    enough: impl Fn(&[(String, Value)]) -> bool,
) -> (Vec<(String, Value)>, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let query = after.map(|a| format!("?after={a}")).unwrap_or_default();
    let mut head = format!(
        "GET /api/v1/events{query} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\nConnection: close\r\n"
    );
    if let Some(id) = last_event_id {
        head.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let (mut seen, mut raw, mut line) = (Vec::new(), String::new(), String::new());
    let mut current: Option<String> = None;
    let deadline = Instant::now() + PATIENCE;
    // Ends: when `enough` holds, when the server ends the stream, or at the deadline (a
    // failure).
    loop {
        assert!(Instant::now() < deadline, "not enough came: {raw}");
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        raw.push_str(&line);
        if line.starts_with("HTTP/1.1 ") {
            assert!(line.contains(" 200 "), "{line}");
        } else if let Some(value) = line.strip_prefix("id: ") {
            current = Some(value.trim().to_owned());
        } else if let Some(data) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            seen.push((current.take().unwrap(), data));
            if enough(&seen) {
                break;
            }
        }
    }
    (seen, raw)
}

/// How many executions' finish events are among `seen`.
fn finished(seen: &[(String, Value)]) -> usize {
    seen.iter()
        .filter(|(_, e)| e["kind"] == "finish")
        .map(|(_, e)| e["execution_id"].as_str().unwrap().to_owned())
        .collect::<BTreeSet<_>>()
        .len()
}

#[test]
fn the_log_stream_resumed_yields_every_event_of_two_executions_exactly_once() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspaces: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            let parent = dir.path().join(name);
            std::fs::create_dir(&parent).unwrap();
            copy_example("demo", &parent)
        })
        .collect();
    // Five answers 300 ms apart: the two runs overlap.
    let provider = format!("script:{}", slowed_demo(dir.path(), 300).display());
    let run = token(&db, "runner", "run");
    let read = token(&db, "reader", "read");
    let served = serve(
        &db,
        &[
            "--workspace-root",
            dir.path().to_str().unwrap(),
            "--provider",
            &provider,
        ],
        &[("OPENAI_API_KEY", SECRET)],
    );
    let addr = &served.addr;
    // The secret in the task: the log stores it redacted, and so the stream sends it.
    let ids: Vec<String> = workspaces
        .iter()
        .map(|workspace| {
            let body = json!({
                "workspace": workspace,
                "task": format!("fix greet.sh; the key is {SECRET}"),
            })
            .to_string();
            let (status, answer) =
                request(addr, "POST", "/api/v1/executions", Some(&run), Some(&body));
            assert_eq!(status, 201, "{answer}");
            json_of(&answer)["execution_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();

    // From the log's start, interrupted after 7 events (mid-run), resumed after the last
    // one seen until both executions have finished.
    let (first, first_raw) = log_stream(addr, &read, Some("0"), None, |seen| seen.len() >= 7);
    let last = first.last().unwrap().0.clone();
    let (rest, rest_raw) = log_stream(addr, &read, None, Some(&last), |seen| finished(seen) == 2);
    let all: Vec<(String, Value)> = first.into_iter().chain(rest).collect();

    // Totally ordered (a SQLite log's positions are its row ids), nothing twice.
    let positions: Vec<u64> = all.iter().map(|(id, _)| id.parse().unwrap()).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions increase: {positions:?}"
    );
    // Each execution's events exactly as `nerve events ID --json` lists them, each once.
    let mut by_execution: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (_, event) in &all {
        let mut event = event.clone();
        let id = event
            .as_object_mut()
            .unwrap()
            .remove("execution_id")
            .unwrap();
        by_execution
            .entry(id.as_str().unwrap().to_owned())
            .or_default()
            .push(event);
    }
    assert_eq!(
        by_execution.keys().cloned().collect::<BTreeSet<_>>(),
        ids.iter().cloned().collect::<BTreeSet<_>>()
    );
    for id in &ids {
        let cli = json_of(&stdout(&nerve(&db, &["events", id, "--json"])));
        assert_eq!(Value::Array(by_execution[id].clone()), cli, "{id}");
        assert_eq!(cli.as_array().unwrap().last().unwrap()["kind"], "finish");
    }
    let raw = [first_raw, rest_raw].join("");
    assert!(raw.contains("[REDACTED"), "nothing was redacted");
    assert!(!raw.contains(SECRET), "the secret reached the stream");

    // A client that saw everything resumes at the end: nothing more comes.
    let end = positions.last().unwrap().to_string();
    let mut stream = TcpStream::connect(addr.as_str()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let head = format!(
        "GET /api/v1/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {read}\r\nLast-Event-ID: {end}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut quiet = String::new();
    // Ends: at the read timeout (2 s without a byte), the expected way, or if the server
    // closed the stream.
    let _ = BufReader::new(stream).read_to_string(&mut quiet);
    assert!(quiet.contains(" 200 "), "{quiet}");
    assert!(!quiet.contains("data:"), "{quiet}");
}

#[test]
fn the_log_stream_refuses_bad_positions_and_ends_with_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let read = token(&db, "reader", "read");
    let watcher = token(&db, "watcher", "read");
    let mut served = serve(&db, &[], &[]);
    let addr = served.addr.clone();
    let (status, answer) = request(&addr, "GET", "/api/v1/events", None, None);
    assert_eq!(status, 401, "{answer}");
    for (path, header) in [
        ("/api/v1/events?after=seven", None),
        ("/api/v1/events?from=0", None),
        // A PostgreSQL log's position, on a SQLite log.
        ("/api/v1/events", Some("12.3")),
        ("/api/v1/events", Some("-1")),
    ] {
        let auth = format!("Bearer {read}");
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(id) = header {
            headers.push(("Last-Event-ID", id));
        }
        let (status, _, answer) = raw_request(&addr, "GET", path, &headers, None);
        assert_eq!(status, 400, "{path} {header:?}: {answer}");
        assert!(json_of(&answer)["error"].is_string(), "{answer}");
    }

    // An open stream (nothing to send: the log is empty) ends soon after its token is
    // revoked.
    let mut stream = TcpStream::connect(addr.as_str()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "GET /api/v1/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {watcher}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    assert!(nerve(&db, &["token", "revoke", "watcher"]).status.success());
    let revoked = Instant::now();
    let mut rest = String::new();
    // Returns at the end of the response (the server closes it); the read timeout
    // (PATIENCE) bounds it.
    reader.read_to_string(&mut rest).unwrap();
    assert!(
        revoked.elapsed() < Duration::from_secs(10),
        "the stream outlived its token by {:?}",
        revoked.elapsed()
    );

    // The OpenAPI description, to a reader only.
    let (status, _) = request(&addr, "GET", "/api/v1/openapi.json", None, None);
    assert_eq!(status, 401);
    let (status, document) = request(&addr, "GET", "/api/v1/openapi.json", Some(&read), None);
    assert_eq!(status, 200);
    let document = json_of(&document);
    assert_eq!(document["openapi"], "3.1.0");
    for path in ["/api/v1/events", "/api/v1/executions/{id}/events", "/fleet"] {
        assert!(document["paths"][path].is_object(), "{path}");
    }

    // The fleet page of a SQLite log says, in one line, that there is none.
    let cookie = login(&addr, &read);
    let (status, _, page) =
        raw_request(&addr, "GET", "/fleet", &[("Cookie", cookie.as_str())], None);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("class=\"no-fleet\""), "{page}");
    assert!(page.contains("it has no fleet"), "{page}");
    served.process.assert_alive("the end of the test");

    // SIGTERM with a stream open: the stream ends and the server exits, rather than its
    // graceful shutdown waiting for an answer that never ends by itself.
    let mut stream = TcpStream::connect(addr.as_str()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "GET /api/v1/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {read}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    assert!(status.contains(" 200 "), "{status}");
    let stopping = Instant::now();
    served.process.signal("TERM");
    let mut rest = String::new();
    // Returns when the server closes the stream; the read timeout (PATIENCE) bounds it.
    reader.read_to_string(&mut rest).unwrap();
    let output = served.process.wait();
    assert!(output.status.success(), "{output:?}");
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the server took {:?} to stop",
        stopping.elapsed()
    );
}

/// The fleet's workers as the fleet page reads them, from the PostgreSQL log at `url`.
fn fleet_workers(url: &str) -> Vec<nerve_session::FleetWorker> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = nerve_session::PgStore::connect(url, std::sync::Arc::default())
            .await
            .unwrap();
        store.fleet_workers().await.unwrap()
    })
}

/// Polls the log's workers until `done` holds for them, or the deadline (a failure).
fn wait_for_workers(
    url: &str,
    what: &str,
    done: impl Fn(&[nerve_session::FleetWorker]) -> bool,
) -> Vec<nerve_session::FleetWorker> {
    let deadline = Instant::now() + PATIENCE;
    // Ends: when `done` holds, or at the deadline (a failure).
    loop {
        let workers = fleet_workers(url);
        if done(&workers) {
            return workers;
        }
        assert!(Instant::now() < deadline, "{what}: {workers:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_real_worker_says_it_is_alive_and_that_it_stopped() {
    let Some(url) = crate::transfer::postgres_url() else {
        return;
    };
    let worker = crate::support::spawn_nerve(std::path::Path::new(&url), &["worker"]);
    let alive = wait_for_workers(&url, "the worker's heartbeat", |w| w.len() == 1);
    let seen = &alive[0];
    assert!(
        seen.worker.starts_with(&format!("{}:", seen.host)),
        "{seen:?}"
    );
    assert!(
        seen.stopped_at.is_none() && seen.executions.is_empty(),
        "{seen:?}"
    );
    // A heartbeat every 5 s: the last one moves on.
    let first_seen = seen.last_seen.clone();
    wait_for_workers(&url, "a later heartbeat", |w| w[0].last_seen > first_seen);
    worker.signal("TERM");
    let output = worker.wait();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stopped = wait_for_workers(&url, "the worker's stop", |w| w[0].stopped_at.is_some());
    assert!(stopped[0].stopped_at >= Some(first_seen), "{stopped:?}");
}

/// The schemathesis release that checks the served description against the server.
const SCHEMATHESIS: &str = "4.32.5";

/// The `schemathesis` executable from its venv under `~/.cache/nerve/` (installed from
/// PyPI the first time); `None` (the test skips) without python3's `venv`, except under
/// `NERVE_REQUIRE_DOCKER=1` (CI), where that is a failure.
fn schemathesis() -> Option<std::path::PathBuf> {
    let venv = crate::support::nerve_cache(&format!("schemathesis-{SCHEMATHESIS}"));
    let python = std::process::Command::new("python3")
        .args(["-c", "import venv"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !python && !venv.join(".nerve-complete").exists() {
        let reason = "no python3 with venv to install schemathesis";
        assert!(
            !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
            "{reason} (required: NERVE_REQUIRE_DOCKER=1)"
        );
        eprintln!("skipping: {reason}");
        return None;
    }
    let requirement = format!("schemathesis=={SCHEMATHESIS}");
    Some(crate::support::python_venv(&venv, &requirement, "schemathesis").unwrap())
}

/// Schemathesis generates requests from the served description (valid ones and invalid
/// ones, every operation, bounded in examples and time, with a fixed seed) and checks each
/// answer against it: its status is documented, its content type and body match the
/// schema, no 5xx. With a `read` token, so the changing routes answer their refusals. The
/// log-wide stream is left out: its answer never ends by itself, and an answer that does
/// not end is what the tool would flag.
#[test]
fn the_served_description_holds_for_every_answer_under_schemathesis() {
    let Some(schemathesis) = schemathesis() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let read = token(&db, "fuzzer", "read");
    let served = serve(&db, &[], &[]);
    let (status, document) = request(
        &served.addr,
        "GET",
        "/api/v1/openapi.json",
        Some(&read),
        None,
    );
    assert_eq!(status, 200);
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, document).unwrap();
    let output = std::process::Command::new(schemathesis)
        .arg("run")
        .arg(&path)
        .args(["--url", &format!("http://{}", served.addr)])
        .args(["--header", &format!("Authorization: Bearer {read}")])
        .args(["--exclude-path", "/api/v1/events"])
        .args(["--max-examples", "15", "--seed", "35", "--workers", "1"])
        .args(["--request-timeout", "10", "--max-time", "60"])
        .args(["--warnings", "off", "--no-color"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains(" passed"), "{report}");
}
