//! An in-process Chat Completions server on a real socket (127.0.0.1, HTTP/1.1, the OpenAI
//! wire format) that enforces a context window as vLLM and OpenAI do: a request whose
//! prompt and requested output (`max_tokens`) do not fit is refused with `400` and
//! `"code": "context_length_exceeded"`. Other requests are answered by a closure (the
//! benchmark's cassette and summariser). The prompt is counted with the calibrated estimate
//! over what the wire carries: each message's content, its tool calls' names and arguments,
//! and the tool definitions as JSON; per-message framing is not counted, so the server
//! counts a little less than the engine does and refuses only what is over by its own
//! count too.

#![allow(unreachable_pub)] // Benchmark code, used from one harness.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use nerve_brain::TokenCounter;
use nerve_brain::provider::tokens::Estimate;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server answers a request that fits: the JSON body of a `200`, or an error
/// status with its body.
pub type Answer = Result<serde_json::Value, (u16, serde_json::Value)>;

/// Answers the requests that fit, given the request body.
pub type Handler = Arc<dyn Fn(&serde_json::Value) -> Answer + Send + Sync>;

/// What the server saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub requests: AtomicUsize,
    /// Requests refused as over the window.
    pub rejected: AtomicUsize,
    /// The largest prompt, by the server's count, in tokens.
    pub largest: AtomicU64,
}

pub struct WindowServer {
    pub base_url: String,
    pub seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WindowServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WindowServer {
    /// Listens on a free port of 127.0.0.1, on the current runtime.
    pub async fn start(window: u64, handler: Handler) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        let seen = Arc::new(Seen::default());
        let served = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let handler = Arc::clone(&handler);
                let seen = Arc::clone(&served);
                tokio::spawn(async move {
                    serve(socket, window, &handler, &seen).await;
                });
            }
        });
        Self {
            base_url,
            seen,
            task,
        }
    }
}

/// The prompt of a Chat Completions request as the server counts it.
pub fn prompt_tokens(body: &serde_json::Value) -> u64 {
    let counter = Estimate;
    let mut total = 0;
    for message in body["messages"].as_array().into_iter().flatten() {
        match &message["content"] {
            serde_json::Value::String(text) => total += counter.count_text(text),
            serde_json::Value::Array(parts) => {
                for part in parts {
                    if let Some(text) = part["text"].as_str() {
                        total += counter.count_text(text);
                    }
                }
            }
            serde_json::Value::Null
            | serde_json::Value::Bool(_)
            | serde_json::Value::Number(_)
            | serde_json::Value::Object(_) => {}
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            total += counter.count_text(call["function"]["name"].as_str().unwrap_or_default());
            total += counter.count_text(call["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    if let Some(tools) = body.get("tools") {
        total += counter.count_text(&tools.to_string());
    }
    total
}

/// Serves one connection: requests in turn until the client closes it.
async fn serve(mut socket: TcpStream, window: u64, handler: &Handler, seen: &Seen) {
    socket.set_nodelay(true).ok();
    let mut buffer = Vec::new();
    loop {
        let Some(body) = read_request(&mut socket, &mut buffer).await else {
            return;
        };
        seen.requests.fetch_add(1, Ordering::SeqCst);
        let (status, reply) = match serde_json::from_slice::<serde_json::Value>(&body) {
            Err(e) => (
                400,
                serde_json::json!({"error": {"message": format!("invalid JSON: {e}"), "type": "invalid_request_error"}}),
            ),
            Ok(request) => {
                let prompt = prompt_tokens(&request);
                seen.largest.fetch_max(prompt, Ordering::SeqCst);
                let output = request["max_tokens"]
                    .as_u64()
                    .or_else(|| request["max_completion_tokens"].as_u64())
                    .unwrap_or(0);
                if prompt + output > window {
                    seen.rejected.fetch_add(1, Ordering::SeqCst);
                    (
                        400,
                        serde_json::json!({"error": {
                            "message": format!("This model's maximum context length is {window} tokens. However, you requested {} tokens ({prompt} in the messages, {output} in the completion).", prompt + output),
                            "type": "invalid_request_error",
                            "param": "messages",
                            "code": "context_length_exceeded",
                        }}),
                    )
                } else {
                    match handler(&request) {
                        Ok(body) => (200, body),
                        Err((status, body)) => (status, body),
                    }
                }
            }
        };
        let body = reply.to_string();
        let head = format!(
            "HTTP/1.1 {status} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            if status == 200 { "OK" } else { "Error" },
            body.len()
        );
        if socket.write_all(head.as_bytes()).await.is_err()
            || socket.write_all(body.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

/// Reads one request and returns its body; `None` when the client closed the connection.
/// `buffer` carries bytes read past the request over to the next.
async fn read_request(socket: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut chunk = [0_u8; 16 * 1024];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let length: usize = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, value)| value.trim().parse().unwrap_or(0));
    while buffer.len() < head_end + length {
        let mut chunk = [0_u8; 64 * 1024];
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer[head_end..head_end + length].to_vec();
    buffer.drain(..head_end + length);
    Some(body)
}

/// A Chat Completions answer: `text` and tool calls (`id`, `name`, `arguments`).
pub fn completion(text: &str, calls: &[(String, String, serde_json::Value)]) -> serde_json::Value {
    let tool_calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            serde_json::json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()},
            })
        })
        .collect();
    let mut message = serde_json::json!({"role": "assistant", "content": text});
    if !tool_calls.is_empty() {
        message["tool_calls"] = serde_json::Value::Array(tool_calls);
    }
    serde_json::json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "bench",
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" },
        }],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
    })
}
