//! Streaming through the binary: `--provider openai` against an in-process Chat Completions
//! server on a real socket that streams its answers as server-sent events (chunked, split
//! inside events and inside UTF-8 characters) and can cut a stream mid-answer. The run's
//! `--jsonl` output shows the deltas as they come, the events as logged, the summary last;
//! a cut stream is retried, and a server that keeps cutting ends the run `error`, which
//! `nerve resume` completes once the server behaves.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::crash::verify;
use crate::support::{nerve_env, sandbox_available, stderr, stdout};

const KEY: &str = "sk-stream-e2e-0123456789abcdefghij";
const MODEL: &str = "smol-stream";

/// What the server does with one request.
#[derive(Debug, Clone)]
enum Reply {
    /// Streams these pieces (each one HTTP chunk), then ends the body properly.
    Stream(Vec<Vec<u8>>),
    /// Streams these pieces, then closes the connection in the middle of the body.
    Cut(Vec<Vec<u8>>),
}

/// A Chat Completions endpoint that answers each request with the next reply; once they
/// run out, with `fallback` while `healthy` is false and the `healthy` replies after.
struct StreamServer {
    url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    healthy: Arc<AtomicBool>,
}

struct Plan {
    replies: VecDeque<Reply>,
    fallback: Reply,
    healthy: VecDeque<Reply>,
}

impl StreamServer {
    fn start(plan: Plan) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let healthy = Arc::new(AtomicBool::new(false));
        let plan = Arc::new(Mutex::new(plan));
        let (log, flag) = (Arc::clone(&requests), Arc::clone(&healthy));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, plan, flag) = (Arc::clone(&log), Arc::clone(&plan), Arc::clone(&flag));
                std::thread::spawn(move || serve(stream, &log, &plan, &flag));
            }
        });
        Self {
            url,
            requests,
            healthy,
        }
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, log: &Mutex<Vec<Value>>, plan: &Mutex<Plan>, healthy: &AtomicBool) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    // The CLI's reachability probe connects and closes without a request.
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    log.lock()
        .unwrap()
        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
    let reply = {
        let mut plan = plan.lock().unwrap();
        match plan.replies.pop_front() {
            Some(reply) => reply,
            None if healthy.load(Ordering::SeqCst) => plan
                .healthy
                .pop_front()
                .unwrap_or_else(|| plan.fallback.clone()),
            None => plan.fallback.clone(),
        }
    };
    let mut stream = reader.into_inner();
    let _ = stream.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    );
    let (pieces, cut) = match reply {
        Reply::Stream(pieces) => (pieces, false),
        Reply::Cut(pieces) => (pieces, true),
    };
    for piece in pieces {
        let _ = write!(stream, "{:x}\r\n", piece.len());
        let _ = stream.write_all(&piece);
        let _ = stream.write_all(b"\r\n");
        let _ = stream.flush();
    }
    if !cut {
        let _ = stream.write_all(b"0\r\n\r\n");
    }
    let _ = stream.flush();
    // Dropping the socket closes it: without the last chunk, mid-body.
}

fn event(delta: Value, finish: Option<&str>) -> String {
    let chunk = json!({"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {chunk}\n\n")
}

fn usage(input: u64, output: u64) -> String {
    let chunk = json!({"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "model": MODEL,
        "choices": [], "usage": {"prompt_tokens": input, "completion_tokens": output}});
    format!("data: {chunk}\n\n")
}

/// `text` as pieces of at most `size` bytes, cut anywhere (inside events and characters).
fn pieces(text: &str, size: usize) -> Vec<Vec<u8>> {
    text.as_bytes().chunks(size).map(<[u8]>::to_vec).collect()
}

/// The first answer: a little text, then a `write_file` call streamed in fragments.
fn tool_answer() -> Reply {
    let text = [
        event(json!({"role": "assistant", "content": ""}), None),
        event(json!({"content": "Writing "}), None),
        event(json!({"content": "the note…"}), None),
        event(
            json!({"tool_calls": [{"index": 0, "id": "call_e2e_1", "type": "function",
                "function": {"name": "write_file", "arguments": ""}}]}),
            None,
        ),
        event(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\": \"note.txt\", "}}]}),
            None,
        ),
        event(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"content\": \"streamed ✓\\n\"}"}}]}),
            None,
        ),
        event(json!({}), Some("tool_calls")),
        usage(900, 30),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    Reply::Stream(pieces(&text, 37))
}

/// The last answer: text only, with multi-byte characters split across reads.
fn final_answer() -> Reply {
    let text = [
        event(json!({"content": "The note is "}), None),
        event(json!({"content": "written ✓ — "}), None),
        event(json!({"content": "done."}), Some("stop")),
        usage(1000, 12),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat();
    Reply::Stream(pieces(&text, 5))
}

/// An answer that breaks off after its first words, inside an event.
fn cut_answer() -> Reply {
    let text = [
        event(json!({"role": "assistant", "content": ""}), None),
        event(json!({"content": "Half an ans"}), None),
        event(json!({"content": "wer that never"}), None),
    ]
    .concat();
    let keep = text.len() - 20;
    Reply::Cut(vec![text.as_bytes()[..keep].to_vec()])
}

/// `nerve run --jsonl` against `server`, in a fresh directory holding `workspace/` and
/// `nerve.db`.
fn run_jsonl(server: &StreamServer) -> (tempfile::TempDir, std::process::Output) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let output = nerve_env(
        &dir.path().join("nerve.db"),
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Write note.txt saying it was streamed.",
            "--provider",
            "openai",
            "--model",
            MODEL,
            "--jsonl",
        ],
        &env(server),
    );
    (dir, output)
}

/// Every stdout line parsed; each must be one JSON object, and none may hold the key.
fn json_lines(output: &std::process::Output) -> Vec<Value> {
    let text = stdout(output);
    assert!(!text.contains(KEY), "the key reached stdout");
    text.lines()
        .map(|line| {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"))
        })
        .inspect(|line| assert!(line["type"].is_string(), "no type: {line}"))
        .collect()
}

fn position(lines: &[Value], what: impl Fn(&Value) -> bool) -> usize {
    lines
        .iter()
        .position(what)
        .unwrap_or_else(|| panic!("no such line in {lines:#?}"))
}

fn delta_text(lines: &[Value]) -> String {
    lines
        .iter()
        .filter(|l| l["type"] == "delta" && l["kind"] == "text")
        .map(|l| l["text"].as_str().unwrap())
        .collect()
}

fn env(server: &StreamServer) -> [(&str, &str); 2] {
    [("OPENAI_BASE_URL", &server.url), ("OPENAI_API_KEY", KEY)]
}

fn check_requests_streamed(server: &StreamServer) {
    for request in server.requests() {
        assert_eq!(request["stream"], true, "{request}");
        assert_eq!(request["model"], MODEL);
    }
}

#[test]
fn a_stream_cut_mid_answer_is_retried_and_jsonl_shows_it_live() {
    if !sandbox_available() {
        return;
    }
    let server = StreamServer::start(Plan {
        replies: [cut_answer(), tool_answer(), final_answer()].into(),
        fallback: cut_answer(),
        healthy: VecDeque::new(),
    });
    let (dir, output) = run_jsonl(&server);
    let (workspace, db) = (dir.path().join("workspace"), dir.path().join("nerve.db"));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let lines = json_lines(&output);

    // The summary is last, with --json's fields.
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary", "{summary}");
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert_eq!(summary["total_turns"], 2, "{summary}");
    assert_eq!(summary["input_tokens"], 1900, "{summary}");
    assert_eq!(summary["output_tokens"], 42, "{summary}");
    assert_eq!(summary["error"], Value::Null);
    let id = summary["execution_id"].as_str().unwrap();
    assert_eq!(
        std::fs::read_to_string(workspace.join("note.txt")).unwrap(),
        "streamed ✓\n"
    );

    // Deltas of the cut attempt, then its failure and the retry, then the whole answers.
    assert_eq!(
        delta_text(&lines),
        "Half an ansWriting the note…The note is written ✓ — done."
    );
    let events: Vec<&Value> = lines.iter().filter(|l| l["type"] == "event").collect();
    let calls: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "model_called")
        .map(|e| &e["payload"])
        .collect();
    let outcomes: Vec<&str> = calls
        .iter()
        .map(|c| c["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["truncated_stream", "ok", "ok"]);
    assert!(
        calls[0].get("time_to_first_token_ms").is_none(),
        "{}",
        calls[0]
    );
    for call in &calls[1..] {
        assert!(call["time_to_first_token_ms"].is_u64(), "{call}");
    }
    let cut = position(&lines, |l| {
        l["type"] == "delta" && l["text"] == "Half an ans"
    });
    let retry = position(&lines, |l| {
        l["kind"] == "retry" && l["payload"]["error"] == "truncated_stream"
    });
    let tool_start = position(&lines, |l| {
        l["type"] == "delta" && l["kind"] == "tool_call" && l["name"] == "write_file"
    });
    let first_ok = position(&lines, |l| {
        l["kind"] == "model_called" && l["payload"]["outcome"] == "ok"
    });
    let tool_run = position(&lines, |l| l["kind"] == "tool_call_started");
    assert!(
        cut < retry && retry < tool_start && tool_start < first_ok && first_ok < tool_run,
        "{lines:#?}"
    );
    // Every event line is the event the log holds, in the log's order.
    let logged = crate::support::events_json(&db, id);
    let printed: Vec<&Value> = events.iter().map(|e| &e["payload"]).collect();
    let stored: Vec<&Value> = logged
        .iter()
        .map(|e| &e["payload"])
        .filter(|p| p["kind"] != "checkpoint")
        .collect();
    assert_eq!(printed, stored);
    // The log keeps whole messages: the answer with the tool call is one message.
    let assistant: Vec<&Value> = stored
        .iter()
        .filter(|p| p["kind"] == "message_appended" && p["message"]["role"] == "assistant")
        .copied()
        .collect();
    assert_eq!(assistant.len(), 2, "{assistant:#?}");
    check_requests_streamed(&server);
    assert_eq!(server.requests().len(), 3);
    verify(&db, id);
}

#[test]
fn a_server_that_keeps_cutting_ends_error_and_resume_completes_once_it_behaves() {
    if !sandbox_available() {
        return;
    }
    let server = StreamServer::start(Plan {
        replies: VecDeque::new(),
        fallback: cut_answer(),
        healthy: [tool_answer(), final_answer()].into(),
    });
    let (dir, output) = run_jsonl(&server);
    let (workspace, db) = (dir.path().join("workspace"), dir.path().join("nerve.db"));
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let lines = json_lines(&output);
    let summary = lines.last().unwrap();
    assert_eq!(summary["type"], "summary");
    assert_eq!(summary["termination_reason"], "error", "{summary}");
    let error = summary["error"].as_str().unwrap();
    assert!(
        error.contains("truncated_stream") && error.contains("5 attempts"),
        "{error}"
    );
    let retries = lines.iter().filter(|l| l["kind"] == "retry").count();
    assert_eq!(retries, 4);
    assert_eq!(server.requests().len(), 5);
    let id = summary["execution_id"].as_str().unwrap().to_owned();
    verify(&db, &id);

    server.healthy.store(true, Ordering::SeqCst);
    let resumed = nerve_env(&db, &["resume", &id, "--jsonl"], &env(&server));
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let lines = json_lines(&resumed);
    let summary = lines.last().unwrap();
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert_eq!(summary["execution_id"], id.as_str());
    assert_eq!(
        delta_text(&lines),
        "Writing the note…The note is written ✓ — done."
    );
    assert!(lines.iter().any(|l| l["kind"] == "resumed"), "{lines:#?}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("note.txt")).unwrap(),
        "streamed ✓\n"
    );
    check_requests_streamed(&server);
    verify(&db, &id);
    assert_db_has_no_key(&db);
}

/// The key is nowhere in the log's files.
fn assert_db_has_no_key(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", db.display());
        if let Ok(bytes) = std::fs::read(&path) {
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "{path} holds the key"
            );
        }
    }
}
