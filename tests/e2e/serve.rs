//! `nerve serve` from outside: the real binary on a real socket, spoken to in HTTP/1.1 by
//! hand (what a client sends is what the test shows). Tokens come from `nerve token`;
//! executions run the scripted provider in the real sandbox.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use crate::parked::ASK_BEFORE_SED;
use crate::support::{
    PATIENCE, Running, copy_example, docker_available, nerve, root, spawn_nerve_env, stderr, stdout,
};

/// A secret the server's environment registers with the redactor (as a provider key).
pub(crate) const SECRET: &str = "sk-serve-e2e-0123456789abcdefghijklmnopqrstuv";

/// A running `nerve serve` and its address.
pub(crate) struct Served {
    pub(crate) process: Running,
    pub(crate) addr: String,
}

pub(crate) fn serve(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Served {
    let mut all = vec!["serve"];
    if !args.contains(&"--listen") {
        all.extend(["--listen", "127.0.0.1:0"]);
    }
    all.extend_from_slice(args);
    let mut process = spawn_nerve_env(db, &all, env);
    process.wait_for_stderr("the server's address", |e| e.contains("://"));
    let stderr = process.stderr_so_far();
    let addr = stderr
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    Served { process, addr }
}

/// `nerve serve` with `root` as its workspace root, `provider` as its provider, and
/// `extra` options.
pub(crate) fn serve_scripted(db: &Path, root: &Path, provider: &str, extra: &[&str]) -> Served {
    let mut args = vec![
        "--workspace-root",
        root.to_str().unwrap(),
        "--provider",
        provider,
    ];
    args.extend_from_slice(extra);
    serve(db, &args, &[])
}

pub(crate) fn token(db: &Path, name: &str, scope: &str) -> String {
    let created = nerve(db, &["token", "create", "--name", name, "--scope", scope]);
    assert!(created.status.success(), "{}", stderr(&created));
    let token = stdout(&created);
    // The token alone on stdout.
    assert_eq!(token.lines().count(), 1, "{token:?}");
    token.trim().to_owned()
}

/// One request with `Connection: close`; the status and the body (dechunked).
pub(crate) fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = Vec::new();
    if let Some(auth) = &auth {
        headers.push(("Authorization", auth.as_str()));
    }
    if method == "POST" {
        headers.push(("Content-Type", "application/json"));
    }
    let (status, _, body) = raw_request(addr, method, path, &headers, body);
    (status, body)
}

/// One request with these headers; the status, the response's head and its body.
pub(crate) fn raw_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    exchange(stream, addr, method, path, headers, body)
}

/// One request on `stream` (plain or TLS); the status, the response's head and its body.
pub(crate) fn exchange(
    mut stream: impl Read + Write,
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, String, String) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let body = body.unwrap_or_default();
    if method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) before reading a large body, and close.
    let _ = stream.write_all(body.as_bytes());
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head.to_owned(), body)
}

/// A chunked body's data.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    // Ends: each pass consumes a chunk, the last one has size 0 (or the text runs out).
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Starts an execution of "fix greet.sh" in `workspace` over the API; its id.
fn start_execution(addr: &str, token: &str, workspace: &Path) -> String {
    let body = json!({ "workspace": workspace, "task": "fix greet.sh" }).to_string();
    let (status, answer) = request(addr, "POST", "/api/v1/executions", Some(token), Some(&body));
    assert_eq!(status, 201, "{answer}");
    json_of(&answer)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub(crate) fn json_of(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// An execution's event stream from `after` (`Last-Event-ID`): the events as `(id, data)`
/// until the stream ends, or only the first `stop_after` (then the connection is dropped).
/// Also the stream's raw text, for the secret check.
fn events(
    addr: &str,
    id: &str,
    token: &str,
    after: Option<u64>,
    stop_after: Option<usize>,
) -> (Vec<(u64, Value)>, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut head = format!(
        "GET /api/v1/executions/{id}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\nConnection: close\r\n"
    );
    if let Some(after) = after {
        head.push_str(&format!("Last-Event-ID: {after}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut raw = String::new();
    let mut seen = Vec::new();
    let mut current: Option<u64> = None;
    let deadline = Instant::now() + PATIENCE;
    let mut line = String::new();
    // Ends: at the end of the stream (the server closes after the finish event), after
    // `stop_after` events, or at the deadline (a failure).
    loop {
        assert!(Instant::now() < deadline, "the stream did not end: {raw}");
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        raw.push_str(&line);
        if let Some(value) = line.strip_prefix("id: ") {
            current = Some(value.trim().parse().unwrap());
        } else if let Some(data) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            let id = current.take().unwrap();
            assert_eq!(data["seq"], id, "id: is the sequence number");
            let finished = data["kind"] == "finish";
            seen.push((id, data));
            if stop_after.is_some_and(|n| seen.len() >= n) {
                break;
            }
            if finished {
                // The server ends the response here: the terminating chunk follows.
                let mut rest = String::new();
                let _ = reader.read_to_string(&mut rest);
                raw.push_str(&rest);
                break;
            }
        }
    }
    (seen, raw)
}

#[test]
fn every_route_refuses_without_a_token_with_a_weak_scope_or_once_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let read = token(&db, "reader", "read");
    let run = token(&db, "runner", "run");
    let approve = token(&db, "approver", "approve");
    let roots = dir.path().to_str().unwrap();
    let mut served = serve(&db, &["--workspace-root", roots, "--max-body", "1024"], &[]);
    let addr = served.addr.clone();
    let id = "01a2213d-f2a1-76d4-9b21-7fda99b76c0c";
    let weaker = |scope: &str| match scope {
        "run" => Some(&read),
        "approve" => Some(&run),
        _ => None,
    };
    let routes = [
        ("GET", "/api/v1/executions".to_owned(), "read", None),
        ("GET", format!("/api/v1/executions/{id}"), "read", None),
        (
            "GET",
            format!("/api/v1/executions/{id}/events"),
            "read",
            None,
        ),
        (
            "POST",
            "/api/v1/executions".to_owned(),
            "run",
            Some(r#"{"workspace":"/","task":"t"}"#),
        ),
        (
            "POST",
            format!("/api/v1/executions/{id}/messages"),
            "run",
            Some(r#"{"text":"t"}"#),
        ),
        (
            "POST",
            format!("/api/v1/executions/{id}/cancel"),
            "run",
            None,
        ),
        (
            "POST",
            format!("/api/v1/executions/{id}/approvals"),
            "approve",
            Some(r#"{"call_id":"c","decision":"allow"}"#),
        ),
    ];
    for (method, path, scope, body) in &routes {
        let (status, answer) = request(&addr, method, path, None, *body);
        assert_eq!(status, 401, "{method} {path} without a token: {answer}");
        assert!(
            json_of(&answer)["error"]
                .as_str()
                .unwrap()
                .contains("Bearer")
        );
        let (status, _) = request(&addr, method, path, Some("nerve_0000"), *body);
        assert_eq!(status, 401, "{method} {path} with an unknown token");
        if let Some(weak) = weaker(scope) {
            let (status, answer) = request(&addr, method, path, Some(weak), *body);
            assert_eq!(status, 403, "{method} {path} with a weaker scope: {answer}");
            assert!(
                json_of(&answer)["error"]
                    .as_str()
                    .unwrap()
                    .contains(&format!("needs {scope}")),
                "{answer}"
            );
        }
    }
    // A strong enough token passes the check (and meets the route's own answer).
    let (status, answer) = request(&addr, "GET", "/api/v1/executions", Some(&approve), None);
    assert_eq!(
        (status, json_of(&answer)),
        (200, json!({ "executions": [] }))
    );
    let (status, answer) = request(
        &addr,
        "POST",
        "/api/v1/executions",
        Some(&run),
        Some(r#"{"workspace":"/","task":"t"}"#),
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("not under a --workspace-root"), "{answer}");
    // A body over the limit: 413.
    let big = format!(r#"{{"workspace":"/","task":"{}"}}"#, "x".repeat(4096));
    let (status, answer) = request(&addr, "POST", "/api/v1/executions", Some(&run), Some(&big));
    assert_eq!(status, 413, "{answer}");

    // Revoked: refused at once, on the running server.
    let (status, _) = request(&addr, "GET", "/api/v1/executions", Some(&read), None);
    assert_eq!(status, 200);
    let revoked = nerve(&db, &["token", "revoke", "reader"]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    let (status, _) = request(&addr, "GET", "/api/v1/executions", Some(&read), None);
    assert_eq!(status, 401);
    let listed = nerve(&db, &["token", "list", "--json"]);
    let listed = json_of(&stdout(&listed));
    let reader = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "reader")
        .unwrap();
    assert!(
        reader["revoked_at"].is_string() && reader["last_used_at"].is_string(),
        "{reader}"
    );
    assert!(!stdout(&nerve(&db, &["token", "list"])).contains(&read));
    served.process.assert_alive("the end of the test");
}

/// The same tokens on a PostgreSQL log: made by `nerve --db postgres://… token create`,
/// checked by a server on that log (scopes as on SQLite), their use recorded, and a
/// revocation refused at once by the running server.
#[test]
fn tokens_on_a_postgres_log_authorize_and_are_revoked_at_once() {
    let Some(pg) = crate::transfer::postgres_url() else {
        return;
    };
    let db = Path::new(&pg);
    let dir = tempfile::tempdir().unwrap();
    let read = token(db, "pg-reader", "read");
    let cassette = slowed_demo(dir.path(), 0);
    let provider = format!("script:{}", cassette.display());
    let mut served = serve_scripted(db, dir.path(), &provider, &[]);
    let addr = served.addr.clone();
    let (status, _) = request(&addr, "GET", "/api/v1/executions", None, None);
    assert_eq!(status, 401);
    let (status, answer) = request(&addr, "GET", "/api/v1/executions", Some(&read), None);
    assert_eq!(
        (status, json_of(&answer)),
        (200, json!({ "executions": [] }))
    );
    let id = "01a2213d-f2a1-76d4-9b21-7fda99b76c0c";
    let (status, answer) = request(
        &addr,
        "POST",
        &format!("/api/v1/executions/{id}/cancel"),
        Some(&read),
        None,
    );
    assert_eq!(status, 403, "{answer}");
    assert!(answer.contains("needs run"), "{answer}");
    // A message continues an execution: not on a PostgreSQL log yet (as `run --continue`).
    let run = token(db, "pg-runner", "run");
    let (status, answer) = request(
        &addr,
        "POST",
        &format!("/api/v1/executions/{id}/messages"),
        Some(&run),
        Some(r#"{"text":"more"}"#),
    );
    assert_eq!(status, 501, "{answer}");
    assert!(answer.contains("not built yet"), "{answer}");
    // An execution made over the API runs and is recorded in the PostgreSQL log.
    if docker_available() {
        let workspace = copy_example("demo", dir.path());
        let made = start_execution(&addr, &run, &workspace);
        let (seen, _) = events(&addr, &made, &read, None, None);
        let finish = &seen.last().unwrap().1;
        assert_eq!(finish["kind"], "finish");
        assert_eq!(
            finish["payload"]["termination_reason"], "completed",
            "{finish}"
        );
        let (status, answer) = request(&addr, "GET", "/api/v1/executions", Some(&read), None);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            json_of(&answer)["executions"][0]["execution_id"],
            made.as_str()
        );
    }

    let revoked = nerve(db, &["token", "revoke", "pg-reader"]);
    assert!(revoked.status.success(), "{}", stderr(&revoked));
    let (status, _) = request(&addr, "GET", "/api/v1/executions", Some(&read), None);
    assert_eq!(status, 401);
    let listed = nerve(db, &["token", "list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listed = json_of(&stdout(&listed));
    let reader = &listed.as_array().unwrap()[0];
    assert_eq!(reader["name"], "pg-reader", "oldest first: {listed}");
    assert!(
        reader["revoked_at"].is_string() && reader["last_used_at"].is_string(),
        "{reader}"
    );
    // Names stay taken, as on SQLite.
    let again = nerve(
        db,
        &["token", "create", "--name", "pg-reader", "--scope", "read"],
    );
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    served.process.assert_alive("the end of the test");
}

#[test]
fn serve_refuses_a_network_address_without_tls_and_bad_token_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let refused = nerve(&db, &["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("without TLS"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(stderr(&refused).lines().count(), 1);
    let bad = nerve(
        &db,
        &["token", "create", "--name", "two words", "--scope", "read"],
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    token(&db, "once", "read");
    let again = nerve(
        &db,
        &["token", "create", "--name", "once", "--scope", "read"],
    );
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    let missing = nerve(&db, &["token", "revoke", "nobody"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
}

/// The demo's cassette, each answer slowed so that the stream is read while it runs, with
/// a first turn that shows the secret (in the model's text and a tool's output).
fn slow_cassette(dir: &Path) -> std::path::PathBuf {
    let demo = std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap();
    let mut lines = vec![
        json!({
            "text": format!("Checking the key {SECRET}."),
            // Into a workspace file too: the page's diff of the turn holds it.
            "tool_calls": [{"name": "shell", "arguments": {"command": format!("echo {SECRET} | tee key.txt")}}],
            "delay_ms": 300,
        })
        .to_string(),
    ];
    for line in demo.lines().filter(|l| l.starts_with('{')).take(5) {
        let mut answer: Value = serde_json::from_str(line).unwrap();
        answer["delay_ms"] = json!(300);
        lines.push(answer.to_string());
    }
    let path = dir.join("slow.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

/// The demo's cassette with every answer delayed by `delay_ms`, so that a client acts
/// while the execution runs.
pub(crate) fn slowed_demo(dir: &Path, delay_ms: u64) -> std::path::PathBuf {
    let demo = std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap();
    let lines: Vec<String> = demo
        .lines()
        .filter(|l| l.starts_with('{'))
        .take(5)
        .map(|line| {
            let mut answer: Value = serde_json::from_str(line).unwrap();
            answer["delay_ms"] = json!(delay_ms);
            answer.to_string()
        })
        .collect();
    let path = dir.join(format!("slowed-{delay_ms}.jsonl"));
    std::fs::write(&path, lines.join("\n")).unwrap();
    path
}

#[test]
fn a_revoked_token_ends_its_open_event_stream_at_once() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    // Five answers a second apart: the run outlasts the revocation by seconds.
    let provider = format!("script:{}", slowed_demo(dir.path(), 1000).display());
    let run = token(&db, "runner", "run");
    let watcher = token(&db, "watcher", "read");
    let served = serve_scripted(&db, dir.path(), &provider, &[]);
    let addr = &served.addr;
    let id = start_execution(addr, &run, &workspace);

    let mut stream = TcpStream::connect(addr.as_str()).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = format!(
        "GET /api/v1/executions/{id}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {watcher}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut kinds = Vec::new();
    let mut revoked = false;
    let deadline = Instant::now() + PATIENCE;
    // Ends: when the server closes the stream, or at the deadline (a failure).
    loop {
        assert!(
            Instant::now() < deadline,
            "the stream did not end: {kinds:?}"
        );
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(data) = line.strip_prefix("data: ") {
            let event: Value = serde_json::from_str(data.trim()).unwrap();
            kinds.push(event["kind"].as_str().unwrap().to_owned());
            if !revoked {
                // The first event came: revoke the token whose stream this is.
                assert!(nerve(&db, &["token", "revoke", "watcher"]).status.success());
                revoked = true;
            }
        }
    }
    assert!(revoked, "no event came");
    assert!(
        !kinds.iter().any(|k| k == "finish"),
        "the stream outlived its token: {kinds:?}"
    );
    // The execution itself ran on to its end.
    let (all, _) = events(addr, &id, &run, None, None);
    assert_eq!(all.last().unwrap().1["kind"], "finish");
    assert!(all.len() > kinds.len(), "{} <= {}", all.len(), kinds.len());
}

#[test]
fn an_execution_made_over_the_api_streams_resumes_exactly_once_and_leaks_no_secret() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    let cassette = slow_cassette(dir.path());
    let provider = format!("script:{}", cassette.display());
    let run = token(&db, "runner", "run");
    let root_dir = dir.path().to_str().unwrap();
    let served = serve(
        &db,
        &["--workspace-root", root_dir, "--provider", &provider],
        &[("OPENAI_API_KEY", SECRET)],
    );
    let addr = &served.addr;
    let body = json!({
        "workspace": workspace,
        "task": format!("fix greet.sh; the key is {SECRET}"),
    })
    .to_string();
    let (status, answer) = request(addr, "POST", "/api/v1/executions", Some(&run), Some(&body));
    assert_eq!(status, 201, "{answer}");
    let id = json_of(&answer)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Interrupted after 9 events (mid-run: every answer takes 300 ms), resumed after the
    // last one seen.
    let (first, first_raw) = events(addr, &id, &run, None, Some(9));
    assert_eq!(first.len(), 9);
    let last = first.last().unwrap().0;
    let (rest, rest_raw) = events(addr, &id, &run, Some(last), None);
    let seqs: Vec<u64> = first.iter().chain(&rest).map(|(seq, _)| *seq).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "every event exactly once, in order");
    let (_, finish) = rest.last().unwrap();
    assert_eq!(finish["kind"], "finish");
    assert_eq!(
        finish["payload"]["termination_reason"], "completed",
        "{finish}"
    );
    // A client that saw the finish event gets an empty stream that ends.
    let (after_end, _) = events(addr, &id, &run, Some(*seqs.last().unwrap()), None);
    assert!(after_end.is_empty());

    // The events are those of `events --json`.
    let cli = json_of(&stdout(&nerve(&db, &["events", &id, "--json"])));
    let streamed: Vec<Value> = first.iter().chain(&rest).map(|(_, e)| e.clone()).collect();
    assert_eq!(Value::Array(streamed), cli);

    let (status, list) = request(addr, "GET", "/api/v1/executions", Some(&run), None);
    assert_eq!(status, 200);
    assert_eq!(json_of(&list)["executions"][0]["execution_id"], id.as_str());
    let (status, show) = request(
        addr,
        "GET",
        &format!("/api/v1/executions/{id}"),
        Some(&run),
        None,
    );
    assert_eq!(status, 200);
    let shown = json_of(&show);
    let cli_show = json_of(&stdout(&nerve(&db, &["show", &id, "--json"])));
    assert_eq!(shown, cli_show);
    assert_eq!(shown["termination_reason"], "completed");

    // The secret was there to leak (in the model's text, the tool's output and the
    // task), and reached no answer.
    // The web view's page of it: the transcript, escaped and redacted.
    let cookie = login(addr, &run);
    let (status, _, page) = raw_request(
        addr,
        "GET",
        &format!("/executions/{id}"),
        &[("Cookie", cookie.as_str())],
        None,
    );
    assert_eq!(status, 200);
    assert!(
        page.contains("fix greet.sh") && page.contains("<dd class=\"state\">completed</dd>"),
        "{page}"
    );
    assert!(
        page.contains("key.txt"),
        "the diff of the turn that wrote it: {page}"
    );
    let (status, _, home) = raw_request(addr, "GET", "/", &[("Cookie", cookie.as_str())], None);
    assert_eq!(status, 200);
    assert!(home.contains("fix greet.sh"), "{home}");
    let everything = [first_raw, rest_raw, list, show, page, home].join("\n");
    assert!(everything.contains("[REDACTED"), "nothing was redacted");
    assert!(
        !everything.contains(SECRET),
        "the secret reached a response"
    );
    assert!(
        std::fs::read_to_string(workspace.join("greet.sh"))
            .unwrap()
            .contains("Hello, Nerve!")
    );
}

#[test]
fn a_parked_call_is_approved_over_the_api_and_runs() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, ASK_BEFORE_SED).unwrap();
    let provider = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let run = token(&db, "runner", "run");
    let approve = token(&db, "approver", "approve");
    let served = serve_scripted(
        &db,
        dir.path(),
        &provider,
        &["--config", config.to_str().unwrap()],
    );
    let addr = &served.addr;
    let id = start_execution(addr, &run, &workspace);
    let (parked, _) = events(addr, &id, &run, None, None);
    let (parked_at, finish) = parked.last().unwrap();
    assert_eq!(
        finish["payload"]["termination_reason"], "parked",
        "{finish}"
    );
    let asked = parked
        .iter()
        .find(|(_, e)| e["kind"] == "approval_requested")
        .unwrap();
    let call_id = asked.1["payload"]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let approvals = format!("/api/v1/executions/{id}/approvals");
    let decide = |call: &str| json!({ "call_id": call, "decision": "allow" }).to_string();
    let (status, _) = request(
        addr,
        "POST",
        &approvals,
        Some(&run),
        Some(&decide(&call_id)),
    );
    assert_eq!(status, 403);
    let (status, answer) = request(
        addr,
        "POST",
        &approvals,
        Some(&approve),
        Some(&decide("nope")),
    );
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = request(
        addr,
        "POST",
        &approvals,
        Some(&approve),
        Some(r#"{"call_id":"x","decision":"maybe"}"#),
    );
    assert_eq!(status, 422, "{answer}");
    let (status, answer) = request(
        addr,
        "POST",
        &approvals,
        Some(&approve),
        Some(&decide(&call_id)),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(json_of(&answer)["resumed"], true, "{answer}");

    // The server resumes it: the approved sed runs and the execution completes.
    let (resumed, _) = events(addr, &id, &run, Some(*parked_at), None);
    assert_eq!(resumed.first().unwrap().0, parked_at + 1);
    assert!(resumed.iter().any(|(_, e)| e["kind"] == "approval_decided"));
    let (_, finish) = resumed.last().unwrap();
    assert_eq!(
        finish["payload"]["termination_reason"], "completed",
        "{finish}"
    );
    assert!(
        std::fs::read_to_string(workspace.join("greet.sh"))
            .unwrap()
            .contains("Hello, Nerve!")
    );
    // A message to it is its next turn; the cassette has its answer.
    let (status, answer) = request(
        addr,
        "POST",
        &format!("/api/v1/executions/{id}/messages"),
        Some(&run),
        Some(r#"{"text":"anything else?"}"#),
    );
    assert_eq!(status, 202, "{answer}");
    let last = resumed.last().unwrap().0;
    let (followed, _) = events(addr, &id, &run, Some(last), None);
    let (_, finish) = followed.last().unwrap();
    assert_eq!(
        finish["payload"]["termination_reason"], "completed",
        "{finish}"
    );
}

#[test]
fn a_running_execution_is_cancelled_over_the_api() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    let provider = format!("script:{}", slow_cassette(dir.path()).display());
    let run = token(&db, "runner", "run");
    let served = serve_scripted(&db, dir.path(), &provider, &[]);
    let addr = &served.addr;
    let id = start_execution(addr, &run, &workspace);
    let (first, _) = events(addr, &id, &run, None, Some(3));
    let cancel = format!("/api/v1/executions/{id}/cancel");
    let (status, answer) = request(addr, "POST", &cancel, Some(&run), None);
    assert_eq!(status, 202, "{answer}");
    let (rest, _) = events(addr, &id, &run, Some(first.last().unwrap().0), None);
    let (_, finish) = rest.last().unwrap();
    assert_eq!(
        finish["payload"]["termination_reason"], "shutdown",
        "{finish}"
    );
    // Not running here any more: nothing to cancel (once its sandbox is closed).
    let deadline = Instant::now() + PATIENCE;
    // Ends: at the 409, or at the deadline (a failure).
    loop {
        let (status, _) = request(addr, "POST", &cancel, Some(&run), None);
        if status == 409 {
            break;
        }
        assert_eq!(status, 202);
        assert!(
            Instant::now() < deadline,
            "still running after its finish event"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The web view's login form posted with `token` from this server's own page; the
/// session cookie (`nerve_session=ID`) to send back.
pub(crate) fn login(addr: &str, token: &str) -> String {
    let origin = format!("http://{addr}");
    let (status, head, page) = raw_request(
        addr,
        "POST",
        "/login",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", origin.as_str()),
        ],
        Some(&format!("token={token}")),
    );
    assert_eq!(status, 303, "{head}{page}");
    let cookie = set_cookie(&head);
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(token),
        "the cookie holds a session, not the token"
    );
    cookie.split(';').next().unwrap().trim().to_owned()
}

/// The `Set-Cookie` header's value in a response head.
pub(crate) fn set_cookie(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("set-cookie")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no Set-Cookie in {head}"))
}

#[test]
fn the_web_view_logs_in_with_a_token_in_a_strict_session_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let read = token(&db, "viewer", "read");
    let admin = token(&db, "admin", "admin");
    let served = serve(
        &db,
        &["--workspace-root", dir.path().to_str().unwrap()],
        &[],
    );
    let addr = &served.addr;
    let origin = format!("http://{addr}");

    let (status, _, page) = raw_request(addr, "GET", "/", &[], None);
    assert_eq!(status, 200);
    assert!(page.contains("name=\"token\""), "{page}");
    let form = [
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Origin", origin.as_str()),
    ];
    let (status, _, page) = raw_request(addr, "POST", "/login", &form, Some("token=nerve_00"));
    assert_eq!(status, 401);
    assert!(page.contains("unknown or revoked"), "{page}");
    // A login form posted from another site is refused (login CSRF).
    let (status, _, page) = raw_request(
        addr,
        "POST",
        "/login",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", "http://evil.example"),
        ],
        Some(&format!("token={read}")),
    );
    assert_eq!(status, 403, "{page}");

    let cookie = login(addr, &read);
    let with_cookie = [("Cookie", cookie.as_str())];
    let (status, _, page) = raw_request(addr, "GET", "/", &with_cookie, None);
    assert_eq!(status, 200);
    assert!(
        page.contains("<h1>Executions</h1>") && !page.contains(&read),
        "{page}"
    );
    // A read token gets no form that starts an execution.
    assert!(!page.contains("action=\"/executions\""), "{page}");
    // The cookie reads the API too, and never authorizes the API's changes.
    let (status, _, _) = raw_request(addr, "GET", "/api/v1/executions", &with_cookie, None);
    assert_eq!(status, 200);
    let mut post = with_cookie.to_vec();
    post.push(("Content-Type", "application/json"));
    post.push(("Origin", origin.as_str()));
    let (status, _, _) = raw_request(
        addr,
        "POST",
        "/api/v1/executions",
        &post,
        Some(r#"{"workspace":"/","task":"t"}"#),
    );
    assert_eq!(status, 401);

    // An admin's session starts executions through the form, from this server's page only.
    let admin_cookie = login(addr, &admin);
    let (status, _, page) =
        raw_request(addr, "GET", "/", &[("Cookie", admin_cookie.as_str())], None);
    assert_eq!(status, 200);
    assert!(page.contains("action=\"/executions\""), "{page}");
    // The start form counts only from this server's own page and for a run scope; then
    // the server's own rules answer (/ is under no root).
    let start = "workspace=%2F&task=t";
    for (session, from, why) in [
        (&admin_cookie, None, "no Origin header"),
        (
            &admin_cookie,
            Some("http://evil.example"),
            "is not this server",
        ),
        (
            &admin_cookie,
            Some(origin.as_str()),
            "not under a --workspace-root",
        ),
        (&cookie, Some(origin.as_str()), "needs run"),
    ] {
        let mut headers = vec![
            ("Cookie", session.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ];
        headers.extend(from.map(|o| ("Origin", o)));
        let (status, _, page) = raw_request(addr, "POST", "/executions", &headers, Some(start));
        assert_eq!(status, 403, "{from:?}: {page}");
        assert!(page.contains(why), "{page}");
    }
    let read_form = [
        ("Cookie", cookie.as_str()),
        ("Content-Type", "application/x-www-form-urlencoded"),
        ("Origin", origin.as_str()),
    ];

    // Logging out ends the session: its cookie is refused from then on, even if kept,
    // while the token itself still works.
    let (status, head, _) = raw_request(addr, "POST", "/logout", &read_form, Some(""));
    assert_eq!(status, 303);
    assert!(set_cookie(&head).contains("Max-Age=0"), "{head}");
    let (status, _, page) = raw_request(addr, "GET", "/", &with_cookie, None);
    assert_eq!(status, 401);
    assert!(page.contains("name=\"token\""), "{page}");
    let (status, _, _) = raw_request(addr, "GET", "/api/v1/executions", &with_cookie, None);
    assert_eq!(status, 401);
    let (status, _) = request(addr, "GET", "/api/v1/executions", Some(&read), None);
    assert_eq!(status, 200);
    // A revoked token's session is back at the login form on the next page.
    let again = login(addr, &read);
    assert_ne!(again, cookie);
    assert!(nerve(&db, &["token", "revoke", "viewer"]).status.success());
    let (status, _, page) = raw_request(addr, "GET", "/", &[("Cookie", again.as_str())], None);
    assert_eq!(status, 401);
    assert!(page.contains("name=\"token\""), "{page}");
}
