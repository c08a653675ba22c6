//! Wire tests of the provider clients against an in-process HTTP/1.1 server on 127.0.0.1
//! that speaks the real formats: whole JSON answers, server-sent event streams delivered in
//! pieces cut at awkward places (inside a UTF-8 character, inside a `data:` line), error
//! statuses, connections that break mid-stream or never answer. Request bodies are insta
//! snapshots (`cargo insta review`, or `INSTA_UPDATE=always cargo test -p nerve-brain`).
//!
//! The last section runs the engine: a scripted rate limit and a real 429 are retried and
//! logged, and tool arguments that are not JSON reach the model as an error result.

// The helpers below are test code too; a failed set-up should panic loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nerve_brain::provider::anthropic::REDACTED_THINKING;
use nerve_brain::provider::retry::RetryPolicy;
use nerve_brain::{
    AgentEngine, AnthropicConfig, AnthropicProvider, Delta, EngineConfig, HttpConfig, ModelRequest,
    ModelResponse, ModelStream, OpenAiConfig, OpenAiProvider, Provider, ProviderError,
    ScriptedProvider, StreamChunk, Task,
};
use nerve_core::event::CallPurpose;
use nerve_core::testing::MemorySink;
use nerve_core::{
    Event, EventSink, ExecutionId, FinishReason, Message, MessagePart, MessageRole, TaskId,
    TaskStatus, TerminationReason, TokenUsage, ToolCall, ToolCallId, ToolDefinition, ToolError,
    ToolExecutor, ToolOutput, ToolResult,
};
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------------------
// The in-process server.

/// One scripted HTTP response.
#[derive(Clone)]
enum Reply {
    /// A whole body with a status and extra headers.
    Whole {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// `200 text/event-stream`, chunked, one write per piece; `abort` drops the connection
    /// before the final chunk.
    Stream { pieces: Vec<Vec<u8>>, abort: bool },
    /// `200 text/event-stream`, chunked, a piece every `gap`; then the end, or (`stall`)
    /// silence with the connection held open until the client closes it.
    Paced {
        pieces: Vec<Vec<u8>>,
        gap: Duration,
        stall: bool,
    },
    /// Reads the request and never answers.
    Hang,
    /// `reply` after `wait` of silence: a model writing a whole answer before sending it.
    Late { wait: Duration, reply: Box<Reply> },
}

fn json(status: u16, body: serde_json::Value) -> Reply {
    Reply::Whole {
        status,
        headers: Vec::new(),
        body: body.to_string(),
    }
}

#[derive(Debug, Clone)]
struct Recorded {
    path: String,
    headers: HashMap<String, String>,
    body: serde_json::Value,
}

struct TestServer {
    url: String,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    /// Notified when a client closes a stalled stream's connection.
    hung_up: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Serves `replies` in order, one connection each, then stops listening.
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&recorded);
        let hung_up = Arc::new(tokio::sync::Notify::new());
        let hang_ups = Arc::clone(&hung_up);
        let task = tokio::spawn(async move {
            for reply in replies {
                let (mut socket, _) = listener.accept().await.unwrap();
                socket.set_nodelay(true).unwrap();
                let request = read_request(&mut socket).await;
                log.lock().unwrap().push(request);
                write_reply(socket, reply, &hang_ups).await;
            }
        });
        Self {
            url,
            recorded,
            hung_up,
            task,
        }
    }

    fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }
}

async fn read_request(socket: &mut TcpStream) -> Recorded {
    let mut buffer = Vec::new();
    let head_end = loop {
        let mut chunk = [0_u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the client closed before sending a request");
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8(buffer[..head_end].to_vec()).unwrap();
    let mut lines = head.lines();
    let request_line = lines.next().unwrap().to_owned();
    let path = request_line.split(' ').nth(1).unwrap().to_owned();
    let headers: HashMap<String, String> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .get("content-length")
        .map_or(0, |l| l.parse().unwrap());
    let mut body = buffer[head_end..].to_vec();
    while body.len() < length {
        let mut chunk = [0_u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap();
        body.extend_from_slice(&chunk[..n]);
    }
    assert!(request_line.starts_with("POST "), "{request_line}");
    Recorded {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap(),
    }
}

async fn write_reply(mut socket: TcpStream, reply: Reply, hung_up: &tokio::sync::Notify) {
    match reply {
        Reply::Whole {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            socket.write_all(head.as_bytes()).await.unwrap();
            socket.write_all(body.as_bytes()).await.unwrap();
            socket.shutdown().await.ok();
        }
        Reply::Stream { pieces, abort } => {
            // Give the client a chance to read each piece on its own.
            if !write_pieces(&mut socket, pieces, Duration::from_millis(1)).await {
                return;
            }
            if abort {
                drop(socket);
                return;
            }
            socket.write_all(b"0\r\n\r\n").await.ok();
            socket.shutdown().await.ok();
        }
        Reply::Paced { pieces, gap, stall } => {
            if !write_pieces(&mut socket, pieces, gap).await {
                return;
            }
            if stall {
                // Until the client closes the connection (or breaks it).
                while matches!(socket.read(&mut [0_u8; 64]).await, Ok(n) if n > 0) {}
                hung_up.notify_one();
                return;
            }
            socket.write_all(b"0\r\n\r\n").await.ok();
            socket.shutdown().await.ok();
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Reply::Late { wait, reply } => {
            tokio::time::sleep(wait).await;
            Box::pin(write_reply(socket, *reply, hung_up)).await;
        }
    }
}

/// Writes a chunked event-stream head, then each piece as a chunk followed by a `gap`.
/// `false`: the client went away.
async fn write_pieces(socket: &mut TcpStream, pieces: Vec<Vec<u8>>, gap: Duration) -> bool {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    socket.write_all(head.as_bytes()).await.unwrap();
    for piece in pieces {
        let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
        chunk.extend_from_slice(&piece);
        chunk.extend_from_slice(b"\r\n");
        if socket.write_all(&chunk).await.is_err() {
            return false;
        }
        socket.flush().await.ok();
        tokio::time::sleep(gap).await;
    }
    true
}

/// Cuts `text` into pieces of 1 to 11 bytes, always inside the first multi-byte character
/// and inside the first `data:` field name (the text must have both).
fn awkward(text: &str) -> Vec<Vec<u8>> {
    let bytes = text.as_bytes();
    let wide = text
        .char_indices()
        .find(|(_, c)| c.len_utf8() > 1)
        .expect("a multi-byte character")
        .0;
    let data = text.find("data:").expect("a data line");
    let mut cuts = vec![wide + 1, data + 2];
    let mut at = 0;
    for size in [1, 5, 2, 11, 3, 7, 4].iter().cycle() {
        at += size;
        if at >= bytes.len() {
            break;
        }
        cuts.push(at);
    }
    cuts.push(bytes.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut start = 0;
    cuts.into_iter()
        .map(|end| {
            let piece = bytes[start..end].to_vec();
            start = end;
            piece
        })
        .collect()
}

fn sse(events: &[serde_json::Value]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

fn named_sse(events: &[serde_json::Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

fn http() -> HttpConfig {
    HttpConfig {
        proxy_from_env: false,
        ..HttpConfig::default()
    }
}

fn openai(server: &TestServer) -> OpenAiProvider {
    let mut config = OpenAiConfig::new("gpt-4o");
    config.base_url = format!("{}/v1", server.url);
    config.api_key = Some(SecretString::from("sk-test-0123456789"));
    config.http = http();
    OpenAiProvider::new(config).unwrap()
}

fn anthropic(server: &TestServer) -> AnthropicProvider {
    let mut config = AnthropicConfig::new("claude-sonnet-4-5");
    config.base_url = server.url.clone();
    config.api_key = Some(SecretString::from("sk-ant-test-0123456789"));
    config.max_output_tokens = 4_096;
    config.http = http();
    AnthropicProvider::new(config).unwrap()
}

fn tools() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: "shell".into(),
            description: "Run a shell command in the workspace.".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
        },
        ToolDefinition {
            name: "read_file".into(),
            description: "Read a file.".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        },
    ]
}

/// A conversation with every kind of part: system, pinned task, thinking with a signature,
/// redacted thinking, text, a tool call, its result (an error), and a follow-up.
fn conversation() -> Vec<Message> {
    vec![
        Message::system("You are Nerve."),
        Message::user("Make the failing test pass.").pinned(),
        Message {
            role: MessageRole::Assistant,
            parts: vec![
                MessagePart::Thinking {
                    text: "Run the tests first.".into(),
                    signature: Some("EqQBCgIYAhIM".into()),
                },
                MessagePart::Thinking {
                    text: "opaque-data".into(),
                    signature: Some(REDACTED_THINKING.into()),
                },
                MessagePart::Text {
                    text: "Running the tests.".into(),
                },
                MessagePart::ToolCall(ToolCall {
                    id: ToolCallId("call_1".into()),
                    name: "shell".into(),
                    arguments: serde_json::json!({"command": "cargo test"}),
                }),
            ],
            pinned: false,
        },
        Message::tool_result(ToolResult {
            call_id: ToolCallId("call_1".into()),
            name: "shell".into(),
            content: "test result: FAILED. 1 passed; 1 failed".into(),
            is_error: true,
        }),
    ]
}

fn request<'a>(messages: &'a [Message], tools: &'a [ToolDefinition]) -> ModelRequest<'a> {
    ModelRequest {
        messages,
        tools,
        purpose: CallPurpose::Agent,
    }
}

/// Drains a stream, checking that exactly one terminal chunk ends it.
async fn drain(mut stream: ModelStream) -> (Vec<Delta>, Result<ModelResponse, ProviderError>) {
    let mut deltas = Vec::new();
    let mut end = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            StreamChunk::Delta(delta) => {
                assert!(end.is_none(), "a delta after the terminal chunk");
                deltas.push(delta);
            }
            StreamChunk::End(result) => {
                assert!(end.is_none(), "a second terminal chunk");
                end = Some(result);
            }
        }
    }
    assert!(stream.next().await.is_none());
    (deltas, end.expect("no terminal chunk"))
}

fn text_of(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(text) => Some(text.as_str()),
            Delta::Thinking(_) | Delta::ToolCallStart { .. } | Delta::ToolCallArguments { .. } => {
                None
            }
        })
        .collect()
}

fn calls(response: &ModelResponse) -> Vec<(String, String, serde_json::Value)> {
    response
        .message
        .tool_calls()
        .map(|c| (c.id.0.clone(), c.name.clone(), c.arguments.clone()))
        .collect()
}

fn transient(error: &ProviderError) -> (&'static str, Option<Duration>) {
    match error {
        ProviderError::Transient {
            kind, retry_after, ..
        } => (kind.as_str(), *retry_after),
        ProviderError::ContextOverflow { .. } | ProviderError::Permanent { .. } => {
            panic!("not transient: {error}")
        }
    }
}

// ---------------------------------------------------------------------------------------
// OpenAI-compatible Chat Completions.

#[tokio::test]
async fn openai_plain_answer() {
    let server = TestServer::start(vec![json(
        200,
        serde_json::json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-2024-08-06",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Fixed — all tests pass ✓", "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1200, "completion_tokens": 9, "total_tokens": 1209,
                      "prompt_tokens_details": {"cached_tokens": 1024}, "completion_tokens_details": {"reasoning_tokens": 0}},
            "system_fingerprint": "fp_1"
        }),
    )])
    .await;
    let (messages, tools) = (conversation(), tools());
    let response = openai(&server)
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    assert_eq!(response.message.text_content(), "Fixed — all tests pass ✓");
    assert_eq!(response.finish, FinishReason::Stop);
    assert_eq!(
        response.usage,
        TokenUsage {
            cache_read_tokens: 1024,
            ..TokenUsage::new(1200, 9)
        }
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], "Bearer sk-test-0123456789");
    insta::assert_json_snapshot!("openai_request", sent.body);
}

#[tokio::test]
async fn openai_parallel_tool_calls() {
    let server = TestServer::start(vec![json(
        200,
        serde_json::json!({
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":\"ls\"}"}},
                {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"Cargo.toml\"}"}}
            ]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 30}
        }),
    )])
    .await;
    let (messages, tools) = (conversation(), tools());
    let response = openai(&server)
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(
        calls(&response),
        vec![
            (
                "call_a".into(),
                "shell".into(),
                serde_json::json!({"command": "ls"})
            ),
            (
                "call_b".into(),
                "read_file".into(),
                serde_json::json!({"path": "Cargo.toml"})
            ),
        ]
    );
}

fn chunk(delta: serde_json::Value, finish: Option<&str>) -> serde_json::Value {
    serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
}

fn openai_tool_stream() -> String {
    let mut text = sse(&[
        chunk(
            serde_json::json!({"role": "assistant", "content": "", "refusal": null}),
            None,
        ),
        chunk(serde_json::json!({"content": "Checking — "}), None),
        chunk(serde_json::json!({"content": "both ✓"}), None),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "id": "call_A", "type": "function", "function": {"name": "shell", "arguments": ""}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"comm"}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 1, "id": "call_B", "type": "function", "function": {"name": "read_file", "arguments": ""}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "function": {"arguments": "and\": \"ls ✓\"}"}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 1, "function": {"arguments": "{\"path\": \"é.txt\"}"}}]}),
            None,
        ),
        chunk(serde_json::json!({}), Some("tool_calls")),
        serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70, "prompt_tokens_details": {"cached_tokens": 0}}}),
    ]);
    text.push_str("data: [DONE]\n\n");
    text
}

#[tokio::test]
async fn openai_streamed_tool_call_deltas_split_awkwardly() {
    let text = openai_tool_stream();
    let server = TestServer::start(vec![Reply::Stream {
        pieces: awkward(&text),
        abort: false,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let (deltas, end) = drain(openai(&server).stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    assert_eq!(text_of(&deltas), "Checking — both ✓");
    assert_eq!(response.message.text_content(), "Checking — both ✓");
    assert_eq!(
        calls(&response),
        vec![
            (
                "call_A".into(),
                "shell".into(),
                serde_json::json!({"command": "ls ✓"})
            ),
            (
                "call_B".into(),
                "read_file".into(),
                serde_json::json!({"path": "é.txt"})
            ),
        ]
    );
    assert!(deltas.contains(&Delta::ToolCallStart {
        index: 1,
        id: "call_B".into(),
        name: "read_file".into()
    }));
    assert!(deltas.contains(&Delta::ToolCallArguments {
        index: 0,
        fragment: "{\"comm".into()
    }));
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(response.usage, TokenUsage::new(50, 20));
    let sent = &server.requests()[0];
    assert_eq!(sent.headers["accept"], "text/event-stream");
    insta::assert_json_snapshot!("openai_stream_request", sent.body);
}

/// How vLLM, llama.cpp and Ollama differ: reasoning fields, no ids, arguments in one
/// piece, `stop` for tool calls, no usage, text that looks like a tool call.
#[tokio::test]
async fn openai_local_server_quirks() {
    let text = sse(&[
        chunk(
            serde_json::json!({"role": "assistant", "reasoning_content": "The user wants "}),
            None,
        ),
        chunk(serde_json::json!({"reasoning": "a listing — ✓."}), None),
        chunk(
            serde_json::json!({"content": "<tool_call>{\"name\": \"shell\"}</tool_call>"}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 0, "function": {"name": "shell", "arguments": "{\"command\": \"ls\"}"}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"tool_calls": [{"index": 1, "function": {"name": "list_dir", "arguments": ""}}]}),
            None,
        ),
        chunk(serde_json::json!({}), Some("stop")),
    ]);
    let server = TestServer::start(vec![Reply::Stream {
        pieces: awkward(&text),
        abort: false,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let (_, end) = drain(openai(&server).stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(
        response.message.parts[0],
        MessagePart::Thinking {
            text: "The user wants a listing — ✓.".into(),
            signature: None
        }
    );
    assert_eq!(
        response.message.text_content(),
        "<tool_call>{\"name\": \"shell\"}</tool_call>"
    );
    let calls = calls(&response);
    assert_eq!(calls.len(), 2, "the text is not a third call");
    assert!(calls.iter().all(|(id, _, _)| id.starts_with("call_")));
    assert_ne!(calls[0].0, calls[1].0);
    assert_eq!(calls[1].2, serde_json::json!({}));
    assert!(
        response.usage.input_tokens > 0 && response.usage.output_tokens > 0,
        "estimated: {:?}",
        response.usage
    );
}

#[tokio::test]
async fn a_server_that_ignores_stream_true_still_answers() {
    let whole = serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "whole ✓"}}]});
    let anthropic_whole = serde_json::json!({"content": [{"type": "text", "text": "whole ✓"}], "stop_reason": "end_turn"});
    let server = TestServer::start(vec![json(200, whole), json(200, anthropic_whole)]).await;
    let (messages, tools) = (conversation(), tools());
    let (deltas, end) = drain(openai(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(text_of(&deltas), "whole ✓");
    assert_eq!(end.unwrap().message.text_content(), "whole ✓");
    let (deltas, end) = drain(anthropic(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(text_of(&deltas), "whole ✓");
    assert_eq!(end.unwrap().finish, FinishReason::Stop);
}

/// `stream = false`: the client asks for whole answers and replays them as deltas.
#[tokio::test]
async fn a_provider_with_streaming_off_asks_for_whole_answers() {
    let whole = serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "whole ✓"}}]});
    let anthropic_whole = serde_json::json!({"content": [{"type": "text", "text": "whole ✓"}], "stop_reason": "end_turn"});
    let server = TestServer::start(vec![json(200, whole), json(200, anthropic_whole)]).await;
    let mut config = OpenAiConfig::new("gpt-4o");
    config.base_url = format!("{}/v1", server.url);
    config.http = http();
    config.stream = false;
    let openai = OpenAiProvider::new(config).unwrap();
    let mut config = AnthropicConfig::new("claude-sonnet-4-5");
    config.base_url = server.url.clone();
    config.http = http();
    config.stream = false;
    let anthropic = AnthropicProvider::new(config).unwrap();
    let (messages, tools) = (conversation(), tools());
    for provider in [&openai as &dyn Provider, &anthropic] {
        let stream = provider.stream(request(&messages, &tools)).await;
        assert!(!stream.is_live());
        let (deltas, end) = drain(stream).await;
        assert_eq!(text_of(&deltas), "whole ✓");
        assert_eq!(end.unwrap().message.text_content(), "whole ✓");
    }
    for request in server.requests() {
        assert_eq!(request.body["stream"], false, "{:?}", request.body);
        assert!(request.body.get("stream_options").is_none());
    }
}

/// llama-cpp-python accepts `stream: true` with tools, sends keep-alive comments, and ends
/// the stream without an event when the model calls a tool ("Automatic streaming tool
/// choice is not supported"). The same request is asked for whole, and from then on every
/// answer is asked for whole; a stream that had begun is never asked for again.
#[tokio::test]
async fn a_stream_that_ends_before_any_event_is_asked_for_whole() {
    let tool_answer = llama_cpp_tool_answer();
    let anthropic_whole = serde_json::json!({"content": [{"type": "text", "text": "whole ✓"}], "stop_reason": "end_turn"});
    let pings = |abort| Reply::Stream {
        pieces: vec![
            b": ping - 2026-11-25\r\n\r\n".to_vec(),
            b": ping\n\n".to_vec(),
        ],
        abort,
    };
    let server = TestServer::start(vec![
        pings(false),
        json(200, tool_answer),
        json(200, answer("then whole")),
        pings(true),
        json(200, anthropic_whole),
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let openai = openai(&server);
    let (deltas, end) = drain(openai.stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    assert_eq!(calls(&response).len(), 1, "{response:?}");
    assert!(
        deltas
            .iter()
            .any(|d| matches!(d, Delta::ToolCallStart { name, .. } if name == "shell")),
        "{deltas:?}"
    );
    // Sticky: the next answer is not streamed.
    let stream = openai.stream(request(&messages, &tools)).await;
    assert!(!stream.is_live());
    assert_eq!(
        drain(stream).await.1.unwrap().message.text_content(),
        "then whole"
    );
    // A stream cut before its first event (the Messages shape) is asked for whole too.
    let (deltas, end) = drain(anthropic(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(text_of(&deltas), "whole ✓");
    assert_eq!(end.unwrap().message.text_content(), "whole ✓");
    let streamed: Vec<_> = server
        .requests()
        .iter()
        .map(|r| {
            (
                r.body["stream"].clone(),
                r.body.get("stream_options").is_some(),
            )
        })
        .collect();
    assert_eq!(
        streamed,
        [
            (serde_json::json!(true), true),
            (serde_json::json!(false), false),
            (serde_json::json!(false), false),
            (serde_json::json!(true), false),
            (serde_json::json!(false), false),
        ]
    );
    // Everything but `stream` is the same request.
    let mut bodies: Vec<_> = server.requests().into_iter().map(|r| r.body).collect();
    for body in &mut bodies {
        let body = body.as_object_mut().unwrap();
        body.remove("stream");
        body.remove("stream_options");
    }
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[3], bodies[4]);
}

/// LiteLLM in front of llama-cpp-python turns the server's failed stream into an empty
/// answer (Chat Completions: a `stop` chunk and `[DONE]`; Messages: an empty text block and
/// `end_turn`). Such an answer is asked for whole; a whole answer that is empty too is the
/// model's, and streaming goes on.
#[tokio::test]
async fn an_empty_streamed_answer_is_asked_for_whole() {
    let empty_chat = format!(
        "{}data: [DONE]\n\n",
        sse(&[chunk(serde_json::json!({}), Some("stop"))])
    );
    let empty_messages = named_sse(&[
        serde_json::json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "smollm2", "usage": {"input_tokens": 0, "output_tokens": 0}}}),
        serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        serde_json::json!({"type": "content_block_stop", "index": 0}),
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 0}}),
        serde_json::json!({"type": "message_stop"}),
    ]);
    let stream = |text: &str| Reply::Stream {
        pieces: vec![text.as_bytes().to_vec()],
        abort: false,
    };
    let anthropic_tool = serde_json::json!({"content": [{"type": "tool_use", "id": "call_1", "name": "shell", "input": {"command": "ls"}}], "stop_reason": "tool_use"});
    let server = TestServer::start(vec![
        stream(&empty_chat),
        json(200, answer("")),
        stream(&empty_chat),
        json(200, llama_cpp_tool_answer()),
        json(200, answer("whole from now on")),
        stream(&empty_messages),
        json(200, anthropic_tool),
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let openai = openai(&server);
    // Empty whole too: the model's answer, and the next one is streamed again.
    let (_, end) = drain(openai.stream(request(&messages, &tools)).await).await;
    assert!(end.unwrap().message.parts.is_empty());
    let (_, end) = drain(openai.stream(request(&messages, &tools)).await).await;
    assert_eq!(calls(&end.unwrap()).len(), 1);
    let stream = openai.stream(request(&messages, &tools)).await;
    assert!(!stream.is_live());
    assert_eq!(
        drain(stream).await.1.unwrap().message.text_content(),
        "whole from now on"
    );
    let (deltas, end) = drain(anthropic(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(calls(&end.unwrap()).len(), 1, "{deltas:?}");
    let streamed: Vec<bool> = server
        .requests()
        .iter()
        .map(|r| r.body["stream"] == true)
        .collect();
    assert_eq!(streamed, [true, false, true, false, false, true, false]);
}

/// A stream that had begun and then broke is a transient error, never asked for whole.
#[tokio::test]
async fn a_stream_cut_after_its_first_event_is_not_asked_for_whole() {
    let first = sse(&[chunk(serde_json::json!({"content": "hel"}), None)]);
    let server = TestServer::start(vec![Reply::Stream {
        pieces: vec![first.into_bytes()],
        abort: true,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let (deltas, end) = drain(openai(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(text_of(&deltas), "hel");
    assert_eq!(transient(&end.unwrap_err()).0, "truncated_stream");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn openai_bad_input_from_the_model_never_crashes() {
    let mut text = String::from("data: this is not json\n\n: a comment\n\n");
    text.push_str(&sse(&[
        serde_json::json!({"choices": []}),
        serde_json::json!({"choices": null}),
        chunk(serde_json::json!({"tool_calls": [{"index": 0, "id": "call_X", "function": {"name": "shell", "arguments": "{\"command\": ls -la ✓"}}]}), None),
        chunk(serde_json::json!({}), Some("a_reason_from_the_future")),
    ]));
    text.push_str("data: [DONE]\n\n");
    let server = TestServer::start(vec![
        Reply::Stream {
            pieces: awkward(&text),
            abort: false,
        },
        json(200, serde_json::json!({"choices": []})),
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai(&server);
    let (_, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(
        calls(&response),
        vec![(
            "call_X".into(),
            "shell".into(),
            serde_json::json!("{\"command\": ls -la ✓")
        )]
    );
    // No choices at all: an empty answer, not a failure.
    let empty = provider.complete(request(&messages, &tools)).await.unwrap();
    assert!(empty.message.parts.is_empty());
    assert_eq!(empty.finish, FinishReason::Stop);
}

#[tokio::test]
async fn openai_rate_limits_and_server_errors() {
    let server = TestServer::start(vec![
        Reply::Whole {
            status: 429,
            headers: vec![("retry-after", "2".into())],
            body: serde_json::json!({"error": {"message": "Rate limit reached for gpt-4o", "type": "requests", "code": "rate_limit_exceeded"}}).to_string(),
        },
        Reply::Whole { status: 429, headers: vec![("retry-after-ms", "150".into()), ("retry-after", "1".into())], body: "{}".into() },
        Reply::Whole { status: 429, headers: vec![("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT".into())], body: "{}".into() },
        json(500, serde_json::json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}})),
        json(401, serde_json::json!({"error": {"message": "Incorrect API key provided: sk-test***", "type": "invalid_request_error", "code": "invalid_api_key"}})),
        json(400, serde_json::json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}})),
        json(429, serde_json::json!({"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota"}})),
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai(&server);
    let call = || provider.complete(request(&messages, &tools));
    let error = call().await.unwrap_err();
    assert_eq!(
        transient(&error),
        ("rate_limited", Some(Duration::from_secs(2)))
    );
    assert_eq!(
        error.to_string(),
        "rate_limited: HTTP 429 from openai: Rate limit reached for gpt-4o"
    );
    assert_eq!(
        transient(&call().await.unwrap_err()),
        ("rate_limited", Some(Duration::from_millis(150)))
    );
    assert_eq!(
        transient(&call().await.unwrap_err()),
        ("rate_limited", Some(Duration::ZERO)),
        "a date in the past"
    );
    assert_eq!(
        transient(&call().await.unwrap_err()),
        ("server_error", None)
    );
    assert_eq!(call().await.unwrap_err().kind().as_str(), "auth");
    assert!(matches!(
        call().await.unwrap_err(),
        ProviderError::ContextOverflow { .. }
    ));
    assert_eq!(call().await.unwrap_err().kind().as_str(), "quota");
}

#[tokio::test]
async fn openai_stream_errors_end_with_one_terminal_chunk() {
    let text = openai_tool_stream();
    let (both, check) = (text.find("both").unwrap(), text.find('✓').unwrap() + 1);
    let mut broken = awkward(&text[..both]);
    broken.push(text.as_bytes()[both..check].to_vec()); // Ends inside `✓`.
    let server = TestServer::start(vec![
        // The connection drops mid-stream, inside a character.
        Reply::Stream { pieces: broken, abort: true },
        // The body ends cleanly but without a finish reason or [DONE].
        Reply::Stream { pieces: vec![sse(&[chunk(serde_json::json!({"content": "partial"}), None)]).into_bytes()], abort: false },
        // An error event in the middle of the stream.
        Reply::Stream {
            pieces: vec![sse(&[
                chunk(serde_json::json!({"content": "partial"}), None),
                serde_json::json!({"error": {"message": "The server had an error", "type": "server_error"}}),
            ])
            .into_bytes()],
            abort: false,
        },
        // A 429 before the stream starts.
        Reply::Whole { status: 429, headers: vec![("retry-after", "3".into())], body: "{}".into() },
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai(&server);
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(
        text_of(&deltas),
        "Checking — ",
        "what arrived before the break was delivered"
    );
    assert_eq!(transient(&end.unwrap_err()).0, "truncated_stream");
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(text_of(&deltas), "partial");
    assert_eq!(transient(&end.unwrap_err()).0, "truncated_stream");
    let (_, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(transient(&end.unwrap_err()).0, "server_error");
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert!(deltas.is_empty());
    assert_eq!(
        transient(&end.unwrap_err()),
        ("rate_limited", Some(Duration::from_secs(3)))
    );
}

#[tokio::test]
async fn unreachable_and_silent_servers_are_transient() {
    let free = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = format!("http://{}", free.local_addr().unwrap());
    drop(free);
    let mut config = OpenAiConfig::new("gpt-4o");
    config.base_url = format!("{closed}/v1");
    config.http = http();
    let (messages, tools) = (conversation(), tools());
    let refused = OpenAiProvider::new(config)
        .unwrap()
        .complete(request(&messages, &tools))
        .await
        .unwrap_err();
    assert_eq!(transient(&refused).0, "connection", "{refused}");

    let server = TestServer::start(vec![Reply::Hang, Reply::Hang]).await;
    let mut config = AnthropicConfig::new("claude-haiku-4-5");
    config.base_url = server.url.clone();
    config.http = HttpConfig {
        idle_timeout: Duration::from_millis(200),
        request_timeout: Duration::from_millis(300),
        ..http()
    };
    let provider = AnthropicProvider::new(config).unwrap();
    let silent = provider
        .complete(request(&messages, &tools))
        .await
        .unwrap_err();
    assert_eq!(transient(&silent).0, "timeout", "{silent}");
    let (_, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(transient(&end.unwrap_err()).0, "timeout");
}

/// An OpenAI client whose idle timeout is `idle` (its whole-request timeout far above).
fn openai_idle(server: &TestServer, idle: Duration) -> OpenAiProvider {
    let mut config = OpenAiConfig::new("gpt-4o");
    config.base_url = format!("{}/v1", server.url);
    config.http = HttpConfig {
        idle_timeout: idle,
        request_timeout: Duration::from_secs(600),
        ..http()
    };
    OpenAiProvider::new(config).unwrap()
}

#[tokio::test]
async fn a_whole_answer_slower_than_the_idle_limit_is_waited_for() {
    // Silent for four idle limits before the whole answer (a non-streaming server sends
    // nothing until the model is done): the request timeout bounds that wait, not the
    // idle limit (which cut llama-cpp-python's long answers off at 300 s of 600).
    let answer = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    });
    let server = TestServer::start(vec![Reply::Late {
        wait: Duration::from_millis(800),
        reply: Box::new(json(200, answer)),
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai_idle(&server, Duration::from_millis(200));
    let response = provider.complete(request(&messages, &tools)).await.unwrap();
    assert_eq!(response.message.text_content(), "done");
}

#[tokio::test]
async fn a_stream_that_goes_silent_ends_in_a_timeout() {
    let first = sse(&[chunk(serde_json::json!({"content": "Thinking"}), None)]);
    let server = TestServer::start(vec![Reply::Paced {
        pieces: vec![first.into_bytes()],
        gap: Duration::ZERO,
        stall: true,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai_idle(&server, Duration::from_millis(200));
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(
        text_of(&deltas),
        "Thinking",
        "what came before the silence was delivered"
    );
    let error = end.unwrap_err();
    assert_eq!(transient(&error).0, "timeout", "{error}");
    assert!(
        error
            .to_string()
            .contains("no data from the server in time"),
        "{error}"
    );
}

#[tokio::test]
async fn a_stream_that_keeps_flowing_outlasts_the_idle_timeout() {
    // Fourteen events 50 ms apart: the stream lasts well over the 500 ms idle timeout,
    // and no silence comes near it.
    let pieces = (0..14)
        .map(|k| sse(&[chunk(serde_json::json!({"content": format!("{k} ")}), None)]).into_bytes())
        .chain([
            (sse(&[chunk(serde_json::json!({}), Some("stop"))]) + "data: [DONE]\n\n").into_bytes(),
        ])
        .collect();
    let server = TestServer::start(vec![Reply::Paced {
        pieces,
        gap: Duration::from_millis(50),
        stall: false,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = openai_idle(&server, Duration::from_millis(500));
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    let expected: String = (0..14).map(|k| format!("{k} ")).collect();
    assert_eq!(text_of(&deltas), expected);
    assert_eq!(response.message.text_content(), expected);
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages.

#[tokio::test]
async fn anthropic_plain_answer() {
    let server = TestServer::start(vec![json(
        200,
        serde_json::json!({
            "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
            "content": [{"type": "text", "text": "Fixed — all tests pass ✓"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1500, "output_tokens": 12}
        }),
    )])
    .await;
    let (messages, tools) = (conversation(), tools());
    let response = anthropic(&server)
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    assert_eq!(response.message.text_content(), "Fixed — all tests pass ✓");
    assert_eq!(response.finish, FinishReason::Stop);
    assert_eq!(
        response.usage,
        TokenUsage {
            input_tokens: 1520,
            output_tokens: 12,
            cache_read_tokens: 1500,
            cache_write_tokens: 0
        }
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], "sk-ant-test-0123456789");
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert!(!sent.headers.contains_key("authorization"));
    insta::assert_json_snapshot!("anthropic_request", sent.body);
}

#[tokio::test]
async fn anthropic_parallel_tool_calls() {
    let server = TestServer::start(vec![json(
        200,
        serde_json::json!({
            "id": "msg_02", "type": "message", "role": "assistant",
            "content": [
                {"type": "text", "text": "Two things at once."},
                {"type": "tool_use", "id": "toolu_01", "name": "shell", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_02", "name": "read_file", "input": {"path": "Cargo.toml"}}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 100, "output_tokens": 50}
        }),
    )])
    .await;
    let (messages, tools) = (conversation(), tools());
    let response = anthropic(&server)
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(
        calls(&response),
        vec![
            (
                "toolu_01".into(),
                "shell".into(),
                serde_json::json!({"command": "ls"})
            ),
            (
                "toolu_02".into(),
                "read_file".into(),
                serde_json::json!({"path": "Cargo.toml"})
            ),
        ]
    );
}

fn anthropic_stream() -> String {
    let block_delta = |index: u32, delta: serde_json::Value| serde_json::json!({"type": "content_block_delta", "index": index, "delta": delta});
    let stop = |index: u32| serde_json::json!({"type": "content_block_stop", "index": index});
    named_sse(&[
        serde_json::json!({"type": "message_start", "message": {"id": "msg_03", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 12, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 2000, "output_tokens": 1}}}),
        serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        block_delta(
            0,
            serde_json::json!({"type": "thinking_delta", "thinking": "List first — "}),
        ),
        block_delta(
            0,
            serde_json::json!({"type": "thinking_delta", "thinking": "then read é."}),
        ),
        block_delta(
            0,
            serde_json::json!({"type": "signature_delta", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}),
        ),
        stop(0),
        serde_json::json!({"type": "ping"}),
        serde_json::json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
        block_delta(
            1,
            serde_json::json!({"type": "text_delta", "text": "Looking ✓"}),
        ),
        stop(1),
        serde_json::json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_01", "name": "shell", "input": {}}}),
        block_delta(
            2,
            serde_json::json!({"type": "input_json_delta", "partial_json": ""}),
        ),
        block_delta(
            2,
            serde_json::json!({"type": "input_json_delta", "partial_json": "{\"command\": \"l"}),
        ),
        block_delta(
            2,
            serde_json::json!({"type": "input_json_delta", "partial_json": "s -la\"}"}),
        ),
        stop(2),
        serde_json::json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_02", "name": "read_file", "input": {}}}),
        block_delta(
            3,
            serde_json::json!({"type": "input_json_delta", "partial_json": "{\"path\":\"é.md\"}"}),
        ),
        stop(3),
        serde_json::json!({"type": "an_event_from_the_future", "index": 9}),
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 87}}),
        serde_json::json!({"type": "message_stop"}),
    ])
}

#[tokio::test]
async fn anthropic_streamed_blocks_split_awkwardly() {
    let text = anthropic_stream();
    let server = TestServer::start(vec![Reply::Stream {
        pieces: awkward(&text),
        abort: false,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let (deltas, end) = drain(anthropic(&server).stream(request(&messages, &tools)).await).await;
    let response = end.unwrap();
    assert_eq!(
        response.message.parts[..2],
        [
            MessagePart::Thinking {
                text: "List first — then read é.".into(),
                signature: Some("EqQBCgIYAhIM1gbcDa9GJwZA".into())
            },
            MessagePart::Text {
                text: "Looking ✓".into()
            },
        ]
    );
    assert_eq!(
        calls(&response),
        vec![
            (
                "toolu_01".into(),
                "shell".into(),
                serde_json::json!({"command": "ls -la"})
            ),
            (
                "toolu_02".into(),
                "read_file".into(),
                serde_json::json!({"path": "é.md"})
            ),
        ]
    );
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(
        response.usage,
        TokenUsage {
            input_tokens: 2112,
            output_tokens: 87,
            cache_read_tokens: 2000,
            cache_write_tokens: 100
        }
    );
    assert_eq!(text_of(&deltas), "Looking ✓");
    assert!(deltas.contains(&Delta::Thinking("then read é.".into())));
    assert!(deltas.contains(&Delta::ToolCallArguments {
        index: 0,
        fragment: "s -la\"}".into()
    }));
    let sent = &server.requests()[0];
    assert_eq!(sent.body["stream"], true);
    insta::assert_json_snapshot!("anthropic_stream_request", sent.body);
}

#[tokio::test]
async fn anthropic_errors_and_broken_streams() {
    let text = anthropic_stream();
    let half = text.find("toolu_02").unwrap();
    let error_event = named_sse(&[
        serde_json::json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}),
        serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    ]);
    let server = TestServer::start(vec![
        Reply::Whole {
            status: 429,
            headers: vec![("retry-after", "4".into())],
            body: serde_json::json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}).to_string(),
        },
        json(529, serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        json(500, serde_json::json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}})),
        json(400, serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 208310 tokens > 200000 maximum"}})),
        Reply::Stream { pieces: awkward(&text[..half]), abort: true },
        Reply::Stream { pieces: vec![error_event.into_bytes()], abort: false },
        Reply::Stream { pieces: vec![text.as_bytes()[..half].to_vec()], abort: false },
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    let provider = anthropic(&server);
    let call = || provider.complete(request(&messages, &tools));
    assert_eq!(
        transient(&call().await.unwrap_err()),
        ("rate_limited", Some(Duration::from_secs(4)))
    );
    assert_eq!(transient(&call().await.unwrap_err()), ("overloaded", None));
    assert_eq!(
        transient(&call().await.unwrap_err()),
        ("server_error", None)
    );
    assert!(matches!(
        call().await.unwrap_err(),
        ProviderError::ContextOverflow { .. }
    ));
    let (deltas, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(
        text_of(&deltas),
        "Looking ✓",
        "deltas before the disconnect were delivered"
    );
    assert_eq!(transient(&end.unwrap_err()).0, "truncated_stream");
    let (_, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(transient(&end.unwrap_err()).0, "overloaded");
    let (_, end) = drain(provider.stream(request(&messages, &tools)).await).await;
    assert_eq!(
        transient(&end.unwrap_err()).0,
        "truncated_stream",
        "no message_stop"
    );
}

// ---------------------------------------------------------------------------------------
// Through the engine: retries are logged, bad arguments become an error result.

/// A shell tool that reads its arguments the way the real tool layer does.
struct StrictShell;

#[derive(serde::Deserialize)]
#[allow(dead_code)] // Read only to validate.
struct ShellArgs {
    command: String,
}

#[async_trait]
impl ToolExecutor for StrictShell {
    fn definitions(&self) -> Vec<ToolDefinition> {
        tools()[..1].to_vec()
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        Ok(
            match serde_json::from_value::<ShellArgs>(call.arguments.clone()) {
                Ok(_) => ToolOutput::ok("ran"),
                Err(e) => ToolOutput::error(format!("invalid arguments for `{}`: {e}", call.name)),
            },
        )
    }
}

async fn run_engine(provider: Arc<dyn Provider>) -> (TerminationReason, Vec<Event>) {
    let sink = Arc::new(MemorySink::default());
    let config = EngineConfig {
        retry: RetryPolicy {
            base_delay: Duration::from_millis(1),
            ..RetryPolicy::default()
        },
        ..EngineConfig::default()
    };
    let engine = AgentEngine::new(
        provider,
        Arc::new(StrictShell),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        config,
    );
    let task = Task {
        id: TaskId::new(),
        description: "list the files".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/tmp/workspace".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(result.error, None);
    let events = sink.events();
    (result.termination_reason, events)
}

fn retries(events: &[Event]) -> Vec<(String, u64)> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::Retry(retry) = e {
                Some((retry.error.to_string(), retry.delay_ms))
            } else {
                None
            }
        })
        .collect()
}

#[tokio::test]
async fn a_scripted_rate_limit_is_retried_and_logged() {
    let cassette = r#"{"error":"rate_limited","retry_after_ms":50}
{"tool_calls":[{"name":"shell","arguments":{"command":"ls"}}]}
{"text":"done"}"#;
    let provider = Arc::new(ScriptedProvider::parse("retry.jsonl", cassette).unwrap());
    let (reason, events) = run_engine(provider).await;
    assert_eq!(reason, TerminationReason::Completed);
    let retries = retries(&events);
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].0, "rate_limited");
    assert!(retries[0].1 >= 50, "Retry-After honoured: {retries:?}");
}

#[tokio::test]
async fn a_real_429_is_retried_and_bad_arguments_reach_the_model() {
    let server = TestServer::start(vec![
        Reply::Whole { status: 429, headers: vec![("retry-after-ms", "30".into())], body: "{}".into() },
        json(200, serde_json::json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_bad", "type": "function", "function": {"name": "shell", "arguments": "{\"command\": ls"}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}})),
        json(200, serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Sorry, fixed."}}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 3}})),
    ])
    .await;
    let (reason, events) = run_engine(Arc::new(openai(&server))).await;
    assert_eq!(reason, TerminationReason::Completed);
    assert_eq!(retries(&events).len(), 1);
    assert!(retries(&events)[0].1 >= 30);
    // The third request shows the model its raw arguments and the tool's error.
    let third = &server.requests()[2].body;
    let messages = third["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        "{\"command\": ls"
    );
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_call_id"], "call_bad");
    let content = result["content"].as_str().unwrap();
    assert!(
        content.starts_with("invalid arguments for `shell`: invalid type: string"),
        "{content}"
    );
}

// ---------------------------------------------------------------------------------------
// What real servers taught: llama.cpp's server, LiteLLM, plain web servers.

/// A whole llama.cpp answer: the call in `tool_calls` and again in the legacy
/// `function_call`, its arguments spaced as the model wrote them.
fn llama_cpp_tool_answer() -> serde_json::Value {
    let arguments = "{ \"command\": \"ls -l\",  \"timeout\": 5 }";
    serde_json::json!({
        "id": "chatcmpl-x", "object": "chat.completion", "model": "smollm2",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
            "role": "assistant", "content": null,
            "function_call": {"name": "shell:", "arguments": arguments},
            "tool_calls": [{"id": "call__0_shell_cmpl-x", "type": "function", "function": {"name": "shell", "arguments": arguments}}]
        }}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320}
    })
}

fn answer(text: &str) -> serde_json::Value {
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 3}})
}

#[tokio::test]
async fn llama_cpp_calls_go_back_exactly_as_returned() {
    let server = TestServer::start(vec![
        json(200, llama_cpp_tool_answer()),
        json(200, answer("Listed.")),
    ])
    .await;
    let (reason, _) = run_engine(Arc::new(openai(&server))).await;
    assert_eq!(reason, TerminationReason::Completed);
    let second = &server.requests()[1].body;
    let assistant = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "assistant")
        .unwrap()
        .clone();
    // One call (the legacy duplicate ignored), its name and bytes as the server sent
    // them, and `""` beside it, never `null`.
    assert_eq!(
        assistant,
        serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call__0_shell_cmpl-x", "type": "function",
             "function": {"name": "shell", "arguments": "{ \"command\": \"ls -l\",  \"timeout\": 5 }"}}
        ]})
    );
    insta::assert_json_snapshot!("llama_cpp_second_request", second);
}

#[tokio::test]
async fn a_streamed_function_call_beside_tool_calls_is_ignored() {
    let chunks = [
        chunk(
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "shell", "arguments": ""}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"function_call": {"name": "shell:", "arguments": "{\"command\": "}, "tool_calls": [{"index": 0, "function": {"arguments": "{\"command\": "}}]}),
            None,
        ),
        chunk(
            serde_json::json!({"function_call": {"arguments": "\"ls\"}"}, "tool_calls": [{"index": 0, "function": {"arguments": "\"ls\"}"}}]}),
            None,
        ),
        chunk(serde_json::json!({}), Some("tool_calls")),
    ];
    let text = format!("{}data: [DONE]\n\n", sse(&chunks));
    let server = TestServer::start(vec![Reply::Stream {
        pieces: vec![text.into_bytes()],
        abort: false,
    }])
    .await;
    let (messages, tools) = (conversation(), tools());
    let (_, end) = drain(openai(&server).stream(request(&messages, &tools)).await).await;
    assert_eq!(
        calls(&end.unwrap()),
        vec![(
            "call_1".into(),
            "shell".into(),
            serde_json::json!({"command": "ls"})
        )]
    );
}

#[tokio::test]
async fn the_output_limit_fits_the_window() {
    let anthropic_reply = serde_json::json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 1}});
    let server = TestServer::start(vec![
        json(200, anthropic_reply.clone()),
        json(200, answer("ok")),
        json(200, answer("ok")),
    ])
    .await;
    let (messages, tools) = (conversation(), tools());
    // A gateway in front of a 4k local model: the model table does not know it.
    let mut config = AnthropicConfig::new("smollm2");
    config.base_url = server.url.clone();
    config.max_output_tokens = 8_192;
    config.context_window = Some(4_096);
    config.http = http();
    let provider = AnthropicProvider::new(config).unwrap();
    provider.complete(request(&messages, &tools)).await.unwrap();
    let mut local = OpenAiConfig::new("smollm2");
    local.base_url = format!("{}/v1", server.url);
    local.context_window = Some(4_096);
    local.http = http();
    let local = OpenAiProvider::new(local).unwrap();
    local.complete(request(&messages, &tools)).await.unwrap();
    let mut capped = OpenAiConfig::new("smollm2");
    capped.base_url = format!("{}/v1", server.url);
    capped.context_window = Some(4_096);
    capped.max_output_tokens = Some(512);
    capped.http = http();
    OpenAiProvider::new(capped)
        .unwrap()
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    let sent = server.requests();
    let anthropic_max = sent[0].body["max_tokens"].as_u64().unwrap();
    let local_max = sent[1].body["max_tokens"].as_u64().unwrap();
    // The prompt (a few hundred tokens with the tools) leaves less than the window.
    for max in [anthropic_max, local_max] {
        assert!((3_000..4_000).contains(&max), "{max}");
    }
    assert_eq!(sent[2].body["max_tokens"], 512);
}

/// The output limit of every request `server` was sent.
fn max_tokens_sent(server: &TestServer) -> Vec<u64> {
    server
        .requests()
        .iter()
        .map(|r| r.body["max_tokens"].as_u64().unwrap())
        .collect()
}

/// A server that counts the prompt higher than the estimate (a small model's tokenizer):
/// the next request's output limit leaves the room its count says is left.
#[tokio::test]
async fn the_output_limit_learns_the_servers_count_of_the_prompt() {
    let reported = |input: u64| {
        serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": input, "completion_tokens": 1, "total_tokens": input + 1}})
    };
    let (messages, tools) = (conversation(), tools());
    let estimate = nerve_brain::provider::tokens::counter_for_model("smollm2");
    let estimated = estimate.count_messages(&messages) + estimate.count_tools(&tools);
    let server = TestServer::start(vec![
        json(200, reported(estimated * 2)),
        json(200, reported(estimated / 2)),
        json(200, answer("ok")),
    ])
    .await;
    let mut config = OpenAiConfig::new("smollm2");
    config.base_url = format!("{}/v1", server.url);
    config.context_window = Some(4_096);
    config.http = http();
    let provider = OpenAiProvider::new(config).unwrap();
    for _ in 0..3 {
        provider.complete(request(&messages, &tools)).await.unwrap();
    }
    let max = max_tokens_sent(&server);
    let room = |prompt: u64| 4_096 - prompt - prompt / 10;
    // Before any report: the estimate. After a count twice the estimate: twice the
    // prompt. After one below it: the estimate again, never less.
    assert_eq!(max, [room(estimated), room(estimated * 2), room(estimated)]);
}

/// A refusal of a prompt over the window that states the server's count of it (here
/// LiteLLM's words for llama-cpp-python's) calibrates the estimate as a report does: the
/// next request's output limit leaves the room that count says is left, streamed or not.
#[tokio::test]
async fn a_refusal_that_states_the_servers_count_calibrates_the_output_limit() {
    let (messages, tools) = (conversation(), tools());
    let estimate = nerve_brain::provider::tokens::counter_for_model("smollm2");
    let estimated = estimate.count_messages(&messages) + estimate.count_tools(&tools);
    let refusal = |stated: u64| {
        json(
            400,
            serde_json::json!({"error": {"message": format!(
                "litellm.ContextWindowExceededError: OpenAIException - This model's maximum context length is 4096 tokens. However, you requested {} tokens ({stated} in the messages, 256 in the completion).",
                stated + 256
            ), "type": "invalid_request_error", "code": "400"}}),
        )
    };
    let room = |prompt: u64| 4_096 - prompt - prompt / 10;
    for stream in [false, true] {
        let server = TestServer::start(vec![refusal(estimated * 3), json(200, answer("ok"))]).await;
        let mut config = OpenAiConfig::new("smollm2");
        config.base_url = format!("{}/v1", server.url);
        config.context_window = Some(4_096);
        config.http = http();
        let provider = OpenAiProvider::new(config).unwrap();
        let first = if stream {
            drain(provider.stream(request(&messages, &tools)).await)
                .await
                .1
        } else {
            provider.complete(request(&messages, &tools)).await
        };
        match first {
            Err(ProviderError::ContextOverflow {
                message,
                stated_tokens,
            }) => {
                assert!(message.contains("in the messages"), "{message}");
                assert!(stated_tokens.is_some(), "{message}");
            }
            other => panic!("stream {stream}: {other:?}"),
        }
        // What the compactor weighs the fill by from now on.
        assert_eq!(provider.prompt_scale_permille(), 3_000, "stream {stream}");
        provider.complete(request(&messages, &tools)).await.unwrap();
        let max = max_tokens_sent(&server);
        assert_eq!(
            max,
            [room(estimated), room(estimated * 3)],
            "stream {stream}"
        );
    }
}

#[tokio::test]
async fn anthropic_cache_breakpoints_and_their_absence() {
    let reply = serde_json::json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 1}});
    let server = TestServer::start(vec![json(200, reply.clone()), json(200, reply)]).await;
    let mut messages = conversation();
    messages.push(Message {
        role: MessageRole::Assistant,
        parts: vec![MessagePart::ToolCall(ToolCall {
            // An id from another server that this API would refuse.
            id: ToolCallId("functions.shell:1".into()),
            name: "shell".into(),
            arguments: serde_json::json!({"command": "cargo test -- --nocapture"}),
        })],
        pinned: false,
    });
    messages.push(Message::tool_result(ToolResult {
        call_id: ToolCallId("functions.shell:1".into()),
        name: "shell".into(),
        content: "thread 'x' panicked".into(),
        is_error: false,
    }));
    let tools = tools();
    anthropic(&server)
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    let mut config = AnthropicConfig::new("smollm2");
    config.base_url = server.url.clone();
    config.prompt_caching = false;
    config.http = http();
    AnthropicProvider::new(config)
        .unwrap()
        .complete(request(&messages, &tools))
        .await
        .unwrap();
    let sent = server.requests();
    let cached = &sent[0].body;
    let breakpoints = cached.to_string().matches("cache_control").count();
    assert_eq!(
        breakpoints, 4,
        "tools, system, the stable prefix, the last message"
    );
    insta::assert_json_snapshot!("anthropic_cached_request", cached);
    let plain = &sent[1].body;
    assert!(!plain.to_string().contains("cache_control"), "{plain}");
    assert_eq!(plain["system"], "You are Nerve.");
    let ids: Vec<&str> = plain["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .filter_map(|b| b.get("id").or_else(|| b.get("tool_use_id")))
        .filter_map(serde_json::Value::as_str)
        .collect();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert_eq!(ids[0], "call_1");
    assert_eq!(
        ids[2], ids[3],
        "a made-up id pairs the call with its result"
    );
    assert!(ids[2].starts_with("call_") && !ids[2].contains([':', '.']));
}

async fn run_engine_with(
    provider: Arc<dyn Provider>,
    retry: RetryPolicy,
) -> (TerminationReason, Vec<Event>, Option<String>) {
    let sink = Arc::new(MemorySink::default());
    let config = EngineConfig {
        retry,
        ..EngineConfig::default()
    };
    let engine = AgentEngine::new(
        provider,
        Arc::new(StrictShell),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        config,
    );
    let task = Task {
        id: TaskId::new(),
        description: "list the files".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/tmp/workspace".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    let events = sink.events();
    (result.termination_reason, events, result.error)
}

#[tokio::test]
async fn a_deadline_during_a_stream_stops_reading_it_and_closes_the_connection() {
    let first = sse(&[chunk(serde_json::json!({"content": "Thinking"}), None)]);
    let server = TestServer::start(vec![Reply::Paced {
        pieces: vec![first.into_bytes()],
        gap: Duration::ZERO,
        stall: true,
    }])
    .await;
    let engine = AgentEngine::new(
        Arc::new(openai(&server)),
        Arc::new(StrictShell),
        Arc::new(MemorySink::default()),
        EngineConfig {
            timeout: Some(Duration::from_millis(300)),
            ..EngineConfig::default()
        },
    );
    let task = Task {
        id: TaskId::new(),
        description: "list the files".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/tmp/workspace".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(result.termination_reason, TerminationReason::TimedOut);
    // The stream was read by a task of its own: giving up the call must stop it, or the
    // connection stays open until the idle timeout (five minutes). The bound only keeps a
    // regression from hanging the suite.
    tokio::time::timeout(Duration::from_secs(60), server.hung_up.notified())
        .await
        .expect("the client closed the stalled stream's connection");
}

fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        base_delay: Duration::from_millis(1),
        connection_base_delay: Duration::from_millis(100),
        ..RetryPolicy::default()
    }
}

#[tokio::test]
async fn errors_are_retried_by_what_retrying_can_change() {
    let page = "<!DOCTYPE HTML>\n<html><head><title>Error response</title></head>\n<body><h1>Error response</h1>\n<p>Error code: 501</p>\n<p>Message: Unsupported method ('POST').</p>\n</body></html>\n";
    let refusal = r#"{"error":{"message":"1 validation error for ChatCompletionRequestAssistantMessage\ncontent\n  Input should be a valid string","type":"internal_server_error","param":null,"code":null}}"#;
    let cases: Vec<(Reply, usize, &str)> = vec![
        (
            Reply::Whole {
                status: 501,
                headers: vec![("content-type", "text/html".into())],
                body: page.into(),
            },
            0,
            "provider error: not_found: HTTP 501 from openai: Error response Error code: 501 Message: Unsupported method ('POST').",
        ),
        (
            json(
                401,
                serde_json::json!({"error": {"message": "Incorrect API key provided: sk-test-****6789.", "type": "invalid_request_error", "code": "invalid_api_key"}}),
            ),
            0,
            "provider error: auth: HTTP 401 from openai: Incorrect API key provided: sk-test-****6789.",
        ),
        (
            Reply::Whole {
                status: 500,
                headers: Vec::new(),
                body: refusal.into(),
            },
            1,
            "provider failed after 2 attempts: server_rejected: HTTP 500 from openai: 1 validation error for ChatCompletionRequestAssistantMessage content Input should be a valid string",
        ),
    ];
    for (reply, retried, message) in cases {
        let server = TestServer::start(vec![reply.clone(), reply.clone(), reply]).await;
        let (reason, events, error) =
            run_engine_with(Arc::new(openai(&server)), quick_retries()).await;
        assert_eq!(reason, TerminationReason::Error);
        assert_eq!(retries(&events).len(), retried, "{message}");
        assert_eq!(server.requests().len(), retried + 1);
        assert_eq!(error.as_deref(), Some(message));
    }
}

#[tokio::test]
async fn a_restarting_server_is_waited_for() {
    // A server that resets the first connections, as one going down and coming back does,
    // then answers: it comes back after the client retried, whatever the machine's load
    // (a condition, not a delay the retries are expected to outlast).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut config = OpenAiConfig::new("smollm2");
    config.base_url = format!("http://{address}/v1");
    config.http = http();
    let provider = Arc::new(OpenAiProvider::new(config).unwrap());
    let restart = tokio::spawn(async move {
        for _ in 0..2 {
            let (socket, _) = listener.accept().await.unwrap();
            // Closed with a reset, before anything is read or answered.
            #[allow(deprecated)]
            socket.set_linger(Some(Duration::ZERO)).unwrap();
            drop(socket);
        }
        let (mut socket, _) = listener.accept().await.unwrap();
        read_request(&mut socket).await;
        write_reply(
            socket,
            json(200, answer("Back.")),
            &tokio::sync::Notify::new(),
        )
        .await;
    });
    let (reason, events, error) = run_engine_with(provider, quick_retries()).await;
    restart.await.unwrap();
    assert_eq!(error, None);
    assert_eq!(reason, TerminationReason::Completed);
    let retries = retries(&events);
    // One retry per reset, each waiting at least the fixed half of its doubling step.
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert!(
        retries.iter().all(|(kind, _)| kind == "connection"),
        "{retries:?}"
    );
    assert!(retries[0].1 >= 50 && retries[1].1 >= 100, "{retries:?}");
}

// ---------------------------------------------------------------------------------------
// Tools as text: the exact bytes `llama-server` (llama.cpp 0c1e570, `--jinja`, the
// corrected chat template) streamed for Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, greedy), kept
// in `tests/recorded/`.

/// A recorded event stream, replayed one event per write.
fn recorded(name: &str) -> Reply {
    let path = format!("{}/tests/recorded/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    Reply::Stream {
        pieces: text
            .split_inclusive("\n\n")
            .map(|event| event.as_bytes().to_vec())
            .collect(),
        abort: false,
    }
}

/// The tools Qwen was offered when the answers were recorded (`edit_file` besides, for the
/// answers written here), answering as the real ones did: the test run fails with the
/// `NameError`, a file is written or edited. The calls are kept.
#[derive(Default)]
struct RecordedTools {
    edit: bool,
    calls: Mutex<Vec<ToolCall>>,
}

#[async_trait]
impl ToolExecutor for RecordedTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let schema = |props: serde_json::Value, required: &[&str]| serde_json::json!({"type": "object", "properties": props, "required": required});
        let mut tools = vec![
            ToolDefinition {
                name: "shell".into(),
                description: "Run a shell command in the workspace.".into(),
                parameters: schema(
                    serde_json::json!({"command": {"type": "string"}}),
                    &["command"],
                ),
            },
            ToolDefinition {
                name: "write_file".into(),
                description: "Write a whole file.".into(),
                parameters: schema(
                    serde_json::json!({"path": {"type": "string"}, "content": {"type": "string"}}),
                    &["path", "content"],
                ),
            },
        ];
        if self.edit {
            tools.push(ToolDefinition {
                name: "edit_file".into(),
                description: "Replace old_text with new_text in a file.".into(),
                parameters: schema(
                    serde_json::json!({"path": {"type": "string"}, "old_text": {"type": "string"},
                        "new_text": {"type": "string"}}),
                    &["path", "old_text", "new_text"],
                ),
            });
        }
        tools
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        self.calls.lock().unwrap().push(call.clone());
        Ok(match call.name.as_str() {
            "shell" => ToolOutput::error(
                "E       NameError: name 'math' is not defined\n1 failed in 0.04s\n[exit status 1]",
            ),
            _ => ToolOutput::ok(format!("wrote {}", call.arguments["path"])),
        })
    }
}

/// Every tool result in `events`, in order.
fn results(events: &[Event]) -> Vec<ToolResult> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::ToolCallFinished(finished) = e {
                Some(finished.result.clone())
            } else {
                None
            }
        })
        .collect()
}

/// Every `tool_call_started` event's `repaired`, in order.
fn repairs(events: &[Event]) -> Vec<Option<String>> {
    events
        .iter()
        .filter_map(|e| {
            if let Event::ToolCallStarted(started) = e {
                Some(started.repaired.clone())
            } else {
                None
            }
        })
        .collect()
}

/// The geometry task of the recorded answers, run against `server` through a provider on
/// `auto` (the default), with `edit_file` offered when `edit`: its end, its events, the
/// calls that reached the tools.
async fn run_geometry(
    server: &TestServer,
    edit: bool,
    max_turns: u32,
) -> (TerminationReason, Vec<Event>, Vec<ToolCall>) {
    let mut config = OpenAiConfig::new("qwen2.5-coder-1.5b");
    config.base_url = format!("{}/v1", server.url);
    config.http = http();
    assert_eq!(config.tool_protocol, nerve_brain::ToolProtocol::Auto);
    let sink = Arc::new(MemorySink::default());
    let tools = Arc::new(RecordedTools {
        edit,
        ..RecordedTools::default()
    });
    let engine = AgentEngine::new(
        Arc::new(OpenAiProvider::new(config).unwrap()),
        Arc::clone(&tools) as Arc<dyn ToolExecutor>,
        Arc::clone(&sink) as Arc<dyn EventSink>,
        EngineConfig {
            max_turns,
            ..EngineConfig::default()
        },
    );
    let task = Task {
        id: TaskId::new(),
        description: "`test_geometry.py` fails with an error. Fix the code, not the test.".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/tmp/workspace".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    let events = sink.events();
    let calls = tools.calls.lock().unwrap().clone();
    (result.termination_reason, events, calls)
}

/// Qwen, offered native tools, wrote its call as a ```` ```json ```` block and the server
/// passed it on as text. On `tool_protocol = "auto"` the call runs and the run switches to
/// text (an event); the next request has no `tools`, the tool list and call format in the
/// system prompt, the answer as it was written and the result in `<tool_response>` tags.
/// Qwen's next answer names `write_file` in a fenced block whose JSON is broken (the
/// file's docstring quotes are not escaped): the call is repaired, runs with the file's
/// text as Qwen meant it, and its `tool_call_started` says what was repaired.
#[tokio::test]
async fn a_local_models_calls_written_as_text_run_through_auto() {
    let server = TestServer::start(vec![
        recorded("qwen-fenced-call.sse"),
        recorded("qwen-unreadable-call.sse"),
    ])
    .await;
    let (reason, events, calls) = run_geometry(&server, false, 2).await;
    assert_eq!(reason, TerminationReason::MaxTurns);
    let switched: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::ToolProtocolSwitched(_)))
        .collect();
    assert_eq!(switched.len(), 1, "{events:?}");
    let results = results(&events);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0].name, "shell");
    assert_eq!(results[1].name, "write_file");
    assert!(!results[1].is_error, "{results:?}");
    assert_eq!(
        calls[1].arguments,
        serde_json::json!({"path": "geometry.py", "content": "import math\n\ndef distance(a, b):\n    \"\"\"The Euclidean distance between points a and b, each (x, y).\"\"\"\n    dx = a[0] - b[0]\n    dy = a[1] - b[1]\n    return math.sqrt(dx * dx + dy * dy)"})
    );
    assert_eq!(
        repairs(&events),
        [
            None,
            Some("escaped 6 double quotes inside strings".to_owned())
        ]
    );
    // The requests: native tools first, then none, the tools described in the prompt.
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[0].body["tools"].is_array());
    let second = &requests[1].body;
    assert!(
        second.get("tools").is_none() && second.get("tool_choice").is_none(),
        "{second}"
    );
    let messages = second["messages"].as_array().unwrap();
    let system = messages[0]["content"].as_str().unwrap();
    assert!(
        system.contains("- write_file {path: string, content: string}: Write a whole file."),
        "{system}"
    );
    assert!(
        messages[2]["content"]
            .as_str()
            .unwrap()
            .starts_with("```json\n{\n  \"name\": \"shell\""),
        "{second}"
    );
    assert!(messages[2].get("tool_calls").is_none(), "{second}");
    assert_eq!(
        messages[3]["content"],
        "<tool_response>\nE       NameError: name 'math' is not defined\n1 failed in 0.04s\n[exit status 1]\n</tool_response>"
    );
    assert_eq!(messages[3]["role"], "user");
}

/// An answer streamed as `llama-server` streams Qwen's (the recorded streams' shape: a
/// keep-alive comment, a role event, the text a few characters an event, the finish, the
/// usage and timings, `[DONE]`).
fn qwen_stream(text: &str) -> Reply {
    let event = |choices: serde_json::Value| {
        let mut event = serde_json::json!({"choices": choices, "created": 1795829829,
            "id": "chatcmpl-7VLX6q50d3vcP9grDzIB8j1WNzsiGVdY", "model": "qwen2.5-coder-1.5b",
            "system_fingerprint": "b1-0c1e570", "object": "chat.completion.chunk"});
        if event["choices"].as_array().is_some_and(Vec::is_empty) {
            event["usage"] = serde_json::json!({"completion_tokens": 105, "prompt_tokens": 627,
                "total_tokens": 732, "prompt_tokens_details": {"cached_tokens": 37}});
            event["timings"] = serde_json::json!({"cache_n": 37, "prompt_n": 590,
                "prompt_ms": 76260.475, "predicted_n": 105, "predicted_ms": 47381.968});
        }
        format!("data: {event}\n\n").into_bytes()
    };
    let mut pieces = vec![
        b":\n\n".to_vec(),
        event(serde_json::json!([{"finish_reason": null, "index": 0,
            "delta": {"role": "assistant", "content": null}}])),
    ];
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(3) {
        let piece: String = piece.iter().collect();
        pieces.push(event(
            serde_json::json!([{"finish_reason": null, "index": 0,
            "delta": {"content": piece}}]),
        ));
    }
    pieces.push(event(
        serde_json::json!([{"finish_reason": "stop", "index": 0, "delta": {}}]),
    ));
    pieces.push(event(serde_json::json!([])));
    pieces.push(b"data: [DONE]\n\n".to_vec());
    Reply::Stream {
        pieces,
        abort: false,
    }
}

/// What a run of Qwen's `answers` (streamed as `llama-server` does) through a provider on
/// `auto` did: its end, its events, the calls that reached the tools.
async fn run_qwen(answers: &[&str]) -> (TerminationReason, Vec<Event>, Vec<ToolCall>) {
    let server = TestServer::start(answers.iter().map(|a| qwen_stream(a)).collect()).await;
    let outcome = run_geometry(&server, true, 5).await;
    assert_eq!(server.requests().len(), answers.len());
    outcome
}

/// Whether the run switched to calls written as text.
fn switched(events: &[Event]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, Event::ToolProtocolSwitched(_)))
}

/// Qwen's `edit_file` as it writes a file's text into JSON: the docstring's `"""` not
/// escaped, the line breaks raw, in a ```` ```json ```` block. Read strictly (on `auto`,
/// before any switch) it is repaired into one call of `edit_file` with the text meant.
#[tokio::test]
async fn an_edit_with_an_unescaped_docstring_and_raw_line_breaks_is_repaired() {
    let edit = "I'll add the missing import.\n```json\n{\n  \"name\": \"edit_file\",\n  \"arguments\": {\n    \"path\": \"geometry.py\",\n    \"old_text\": \"def distance(a, b):\n    \"\"\"The Euclidean distance between points a and b, each (x, y).\"\"\"\",\n    \"new_text\": \"import math\n\ndef distance(a, b):\n    \"\"\"The Euclidean distance between points a and b, each (x, y).\"\"\"\"\n  }\n}\n```";
    let (reason, events, calls) = run_qwen(&[edit, "The import is added."]).await;
    assert_eq!(reason, TerminationReason::Completed);
    assert!(switched(&events));
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].name, "edit_file");
    let docstring = "    \"\"\"The Euclidean distance between points a and b, each (x, y).\"\"\"";
    assert_eq!(
        calls[0].arguments,
        serde_json::json!({
            "path": "geometry.py",
            "old_text": format!("def distance(a, b):\n{docstring}"),
            "new_text": format!("import math\n\ndef distance(a, b):\n{docstring}"),
        })
    );
    assert_eq!(
        repairs(&events),
        [Some(
            "escaped 12 double quotes and 4 control characters (line breaks or tabs) inside strings"
                .to_owned()
        )]
    );
}

/// A `<tool_call>` block with a raw line break in its command, and a bare call missing its
/// last brace at the end of an answer: each repaired and run. (The command fails, so the
/// text answer after it is asked once to make the change it describes: a second answer.)
#[tokio::test]
async fn a_raw_line_break_and_a_missing_last_brace_are_repaired() {
    let tagged = "<tool_call>\n{\"name\": \"shell\", \"arguments\": {\"command\": \"cd tests &&\npython3 -m pytest -q\"}}\n</tool_call>";
    let (reason, events, calls) = run_qwen(&[tagged, "Done.", "Done."]).await;
    assert_eq!(reason, TerminationReason::Completed);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].arguments,
        serde_json::json!({"command": "cd tests &&\npython3 -m pytest -q"})
    );
    assert_eq!(
        repairs(&events),
        [Some(
            "escaped 1 control character (a line break or tab) inside strings".to_owned()
        )]
    );
    let bare = "Let me run the tests.\n{\"name\": \"shell\", \"arguments\": {\"command\": \"python3 -m pytest -q\"}";
    let (reason, events, calls) = run_qwen(&[bare, "Done.", "Done."]).await;
    assert_eq!(reason, TerminationReason::Completed);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].arguments,
        serde_json::json!({"command": "python3 -m pytest -q"})
    );
    assert_eq!(
        repairs(&events),
        [Some("added 1 closing bracket at the end".to_owned())]
    );
}

/// What the repair must leave alone: prose with braces (a line that starts like an object
/// but is no call), an example call of a tool that does not exist in an explanation (read
/// strictly), and a call cut off inside a string, which stays an `unreadable_tool_call`
/// with the error result it got before.
#[tokio::test]
async fn prose_examples_and_calls_beyond_repair_are_left_alone() {
    let prose = "The function returns a dict such as {\"a\": \"b\"} for each row:\n{\"a\": \"x\"y\", \"b\": 2}\nso nothing else is needed.";
    let example = "You could run them with:\n```json\n{\"name\": \"run_tests\", \"arguments\": {\"filter\": \"test_\"distance\"\"}}\n```\nbut the fix is already in place.";
    for answer in [prose, example] {
        let (reason, events, calls) = run_qwen(&[answer]).await;
        assert_eq!(reason, TerminationReason::Completed, "{answer}");
        assert!(calls.is_empty(), "{answer}: {calls:?}");
        assert!(!switched(&events), "{answer}");
    }
    let cut = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.py\", \"content\": \"def f():\n    return \"x";
    let (reason, events, calls) = run_qwen(&[cut, "Done.", "Done."]).await;
    assert_eq!(reason, TerminationReason::Completed);
    assert!(calls.is_empty(), "{calls:?}");
    let results = results(&events);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].name, "unreadable_tool_call");
    assert!(
        results[0].content.starts_with(
            "[Nerve] Your tool call was not run: the call is not valid JSON (control character"
        ) && results[0]
            .content
            .contains("The arguments of `write_file`: write_file {path: string, content: string}."),
        "{}",
        results[0].content
    );
}
