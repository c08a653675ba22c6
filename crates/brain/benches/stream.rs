//! The engine's streaming path against a bare reqwest loop reading the same server-sent
//! events from the same server, in the same run: how much later a token reaches the
//! display through the engine (HTTP client, SSE parser, Chat Completions decoder,
//! assembler, `ModelCaller`, the `DeltaObserver`) than the raw bytes holding it reach a
//! program that only reads the socket.
//!
//! The server is a plain thread on a loopback socket (`TCP_NODELAY`) answering
//! `POST /v1/chat/completions` with a chunked `text/event-stream` of TOKENS one-token
//! content events, timing the moment it writes each one. Two shapes:
//! - paced: one event every PACE (a fast model), each its own write: the median latency
//!   per token, from the server writing the event to the delta reaching the observer (the
//!   engine) or to the read that completes the event returning (the bare loop);
//! - unpaced: the whole stream written at once: from the server's first byte to the last
//!   token, per token (the decoding cost when the network is never the bottleneck).
//!
//! `cargo xtask bench stream` (or `cargo bench -p nerve-brain --bench stream`); ROUNDS
//! rounds of each, alternating, medians reported.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // A benchmark's report.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nerve_brain::{
    AgentEngine, Delta, DeltaObserver, EngineConfig, OpenAiConfig, OpenAiProvider, Task,
};
use nerve_core::event::CallPurpose;
use nerve_core::{
    Event, EventSink, ExecutionId, SinkError, TaskId, TaskStatus, TerminationReason, ToolCall,
    ToolDefinition, ToolError, ToolExecutor, ToolOutput,
};
use tokio_util::sync::CancellationToken;

const TOKENS: usize = 400;
const PACE: Duration = Duration::from_millis(2);
const ROUNDS: usize = 11;

/// When the server wrote each token's event.
type Sent = Arc<Mutex<Vec<Instant>>>;

struct Server {
    url: String,
    sent: Sent,
}

fn event(k: usize) -> String {
    let chunk = serde_json::json!({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
        "model": "bench", "choices": [{"index": 0, "delta": {"content": format!(" tok{k}")}, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

const TAIL: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":400}}\n\ndata: [DONE]\n\n";

impl Server {
    fn start(paced: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let sent: Sent = Arc::default();
        let times = Arc::clone(&sent);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                serve(stream, paced, &times);
            }
        });
        Self { url, sent }
    }

    fn take_sent(&self) -> Vec<Instant> {
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

fn serve(stream: TcpStream, paced: bool, sent: &Mutex<Vec<Instant>>) {
    stream.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut length = 0;
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.trim_end().is_empty() {
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
    let mut stream = reader.into_inner();
    stream
        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        .unwrap();
    let chunk = |text: &str| format!("{:x}\r\n{text}\r\n", text.len());
    let mut times = Vec::with_capacity(TOKENS);
    if paced {
        for k in 0..TOKENS {
            let bytes = chunk(&event(k));
            std::thread::sleep(PACE);
            times.push(Instant::now());
            stream.write_all(bytes.as_bytes()).unwrap();
        }
    } else {
        let body: String = (0..TOKENS).map(|k| chunk(&event(k))).collect();
        let now = Instant::now();
        times.resize(TOKENS, now);
        stream.write_all(body.as_bytes()).unwrap();
    }
    stream.write_all(chunk(TAIL).as_bytes()).unwrap();
    stream.write_all(b"0\r\n\r\n").unwrap();
    *sent.lock().unwrap() = times;
}

/// The anchor: POST, then read chunks until the end, noting when each event completed.
async fn bare(client: &reqwest::Client, url: &str) -> Vec<Instant> {
    let mut response = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"go"}]}"#)
        .send()
        .await
        .unwrap();
    let mut done = Vec::with_capacity(TOKENS + 2);
    let mut last = 0_u8;
    while let Some(bytes) = response.chunk().await.unwrap() {
        let now = Instant::now();
        for &byte in &bytes {
            if byte == b'\n' && last == b'\n' {
                done.push(now);
            }
            last = byte;
        }
    }
    done.truncate(TOKENS);
    done
}

/// Notes when each text delta reached it.
#[derive(Default)]
struct Arrivals(Mutex<Vec<Instant>>);

impl DeltaObserver for Arrivals {
    fn delta(&self, _: ExecutionId, _: CallPurpose, delta: &Delta) {
        if let Delta::Text(_) = delta {
            self.0.lock().unwrap().push(Instant::now());
        }
    }
}

struct NoSink;

#[async_trait]
impl EventSink for NoSink {
    async fn append(&self, _: ExecutionId, _: Event) -> Result<u64, SinkError> {
        Ok(0)
    }
}

struct NoTools;

#[async_trait]
impl ToolExecutor for NoTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        Vec::new()
    }

    async fn execute(&self, _: &ToolCall) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok(""))
    }
}

/// The engine's path: one run whose single answer streams from the server.
async fn engine(url: &str) -> Vec<Instant> {
    let mut config = OpenAiConfig::new("bench");
    config.base_url = url.to_owned();
    let arrivals = Arc::new(Arrivals::default());
    let mut engine = AgentEngine::new(
        Arc::new(OpenAiProvider::new(config).unwrap()),
        Arc::new(NoTools),
        Arc::new(NoSink),
        EngineConfig::default(),
    );
    engine.deltas = Arc::clone(&arrivals) as Arc<dyn DeltaObserver>;
    let task = Task {
        id: TaskId::new(),
        description: "go".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(result.termination_reason, TerminationReason::Completed);
    std::mem::take(&mut *arrivals.0.lock().unwrap())
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median latency of one round's tokens, in µs (a median: on a shared machine a few
/// tokens wait for a core, whichever path reads them).
fn latency(sent: &[Instant], arrived: &[Instant]) -> f64 {
    assert_eq!(sent.len(), TOKENS);
    assert_eq!(arrived.len(), TOKENS, "every token arrived");
    median(
        sent.iter()
            .zip(arrived)
            .map(|(s, a)| micros(a.saturating_duration_since(*s)))
            .collect(),
    )
}

/// From the first byte to the last token, per token, in µs.
fn per_token(sent: &[Instant], arrived: &[Instant]) -> f64 {
    micros(arrived[TOKENS - 1].saturating_duration_since(sent[0])) / TOKENS as f64
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The engine's client brings its own TLS set-up; a bare client needs a process default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    println!("stream benchmark: {TOKENS} one-token events, {ROUNDS} rounds, medians");
    for (paced, name, measure) in [
        (
            true,
            "paced (one event every 2 ms): median latency per token, server write -> reader",
            latency as fn(&[Instant], &[Instant]) -> f64,
        ),
        (
            false,
            "unpaced (whole stream at once): first byte -> last token, per token",
            per_token,
        ),
    ] {
        let server = Server::start(paced);
        let (mut anchor, mut ours) = (Vec::new(), Vec::new());
        // One warm-up of each, then alternating rounds.
        for round in 0..=ROUNDS {
            let arrived = runtime.block_on(bare(&client, &server.url));
            let a = measure(&server.take_sent(), &arrived);
            let arrived = runtime.block_on(engine(&server.url));
            let e = measure(&server.take_sent(), &arrived);
            if round > 0 {
                anchor.push(a);
                ours.push(e);
            }
        }
        let (anchor, ours) = (median(anchor), median(ours));
        println!("{name}");
        println!("  bare reqwest loop (anchor) {anchor:>9.2} µs");
        println!("  engine -> DeltaObserver    {ours:>9.2} µs");
        println!("  ratio                      {:>9.2}x", ours / anchor);
    }
}
