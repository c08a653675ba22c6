//! `--provider anthropic` through the binary, against an in-process server on a real socket
//! speaking the Anthropic Messages wire format: the request Nerve sends (path, headers, body)
//! and the run it makes of the answers, tool use included.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::crash::verify;
use crate::support::{docker_available, events_json, last_json, nerve_env, stderr};

/// One request as the server received it.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    path: String,
    headers: BTreeMap<String, String>,
    body: Value,
}

/// A Messages endpoint answering each request with the next of its replies (a 500 once
/// they run out), recording what it received. Connections are closed after one exchange.
struct MessagesServer {
    url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl MessagesServer {
    fn start(replies: Vec<Value>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let received = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let log = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (log, replies) = (Arc::clone(&log), Arc::clone(&replies));
                std::thread::spawn(move || serve(stream, &log, &replies));
            }
        });
        Self { url, received }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    log: &Mutex<Vec<Received>>,
    replies: &Mutex<std::vec::IntoIter<Value>>,
) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    // The CLI's reachability probe connects and closes without a request.
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
    let length: usize = headers
        .get("content-length")
        .map_or(0, |v| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    log.lock().unwrap().push(Received {
        method,
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let (status, answer) = match replies.lock().unwrap().next() {
        Some(reply) => ("200 OK", reply),
        None => (
            "500 Internal Server Error",
            json!({"type": "error", "error": {"type": "api_error", "message": "no more replies"}}),
        ),
    };
    let answer = answer.to_string();
    let mut stream = reader.into_inner();
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
        answer.len()
    );
    let _ = stream.flush();
}

fn message(id: &str, content: Value, stop_reason: &str, input: u64, output: u64) -> Value {
    json!({
        "id": id, "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output}
    })
}

const KEY: &str = "sk-ant-e2e-0123456789abcdefghijklmnop";

#[test]
fn the_anthropic_provider_runs_a_task_over_the_messages_wire_format() {
    if !docker_available() {
        return;
    }
    let server = MessagesServer::start(vec![
        message(
            "msg_1",
            json!([
                {"type": "text", "text": "I will write the note."},
                {"type": "tool_use", "id": "toolu_e2e_1", "name": "write_file",
                 "input": {"path": "note.txt", "content": "from claude\n"}}
            ]),
            "tool_use",
            1200,
            40,
        ),
        message(
            "msg_2",
            json!([{"type": "text", "text": "note.txt is written."}]),
            "end_turn",
            1300,
            10,
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let db = dir.path().join("nerve.db");
    let output = nerve_env(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Write the note.",
            "--provider",
            "anthropic",
            "--model",
            "claude-haiku-4-5",
            "--json",
        ],
        &[
            ("ANTHROPIC_BASE_URL", &server.url),
            ("ANTHROPIC_API_KEY", KEY),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], 2, "{result}");
    assert_eq!(result["input_tokens"], 2500, "{result}");
    assert_eq!(result["output_tokens"], 50, "{result}");
    assert!(
        result["cost_usd"].as_f64().unwrap() > 0.0,
        "a priced model: {result}"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("note.txt")).unwrap(),
        "from claude\n"
    );

    let received = server.received();
    assert_eq!(received.len(), 2, "{received:?}");
    for request in &received {
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.headers["x-api-key"], KEY);
        assert_eq!(request.headers["anthropic-version"], "2023-06-01");
        assert!(!request.headers.contains_key("authorization"));
        assert_eq!(request.body["model"], "claude-haiku-4-5");
        assert!(request.body["max_tokens"].as_u64().unwrap() > 0);
        let tools: Vec<&str> = request.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(tools.contains(&"write_file"), "{tools:?}");
    }
    // The system prompt travels apart from the messages, with the context indicator; the
    // task is the first user turn.
    let system = received[0].body["system"].to_string();
    assert!(system.contains("/workspace"), "{system}");
    assert!(system.contains("[Context: "), "{system}");
    assert_eq!(received[0].body["messages"][0]["role"], "user");
    assert!(
        received[0].body["messages"][0]
            .to_string()
            .contains("Write the note."),
        "{}",
        received[0].body
    );
    // The second request answers the tool use with its result.
    let second = received[1].body["messages"].to_string();
    assert!(
        second.contains("\"tool_use_id\":\"toolu_e2e_1\""),
        "{second}"
    );
    assert!(second.contains("tool_result"), "{second}");

    let id = result["execution_id"].as_str().unwrap();
    let events = events_json(&db, id);
    assert_eq!(events[0]["payload"]["provider"], "anthropic");
    assert_eq!(events[0]["payload"]["model"], "claude-haiku-4-5");
    assert!(
        !serde_json::to_string(&events).unwrap().contains(KEY),
        "the API key reached the log"
    );
    verify(&db, id);
}
