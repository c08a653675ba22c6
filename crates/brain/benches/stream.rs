//! The engine's streaming path against a bare reqwest loop reading the same server-sent
//! events from the same server, in the same run: how much later a token reaches the
//! display through the engine (HTTP client, SSE parser, Chat Completions decoder,
//! assembler, `ModelCaller`, the `DeltaObserver`) than the raw bytes holding it reach a
//! program that only reads the socket.
//!
//! The server is a plain thread on a loopback socket (`TCP_NODELAY`) answering
//! `POST /v1/chat/completions` with a chunked `text/event-stream` of one-token content
//! events, timing the moment it writes each one. Two shapes:
//! - paced: one event every PACE (a fast model), each its own write: the median latency
//!   per token of a round, from the server writing the event to the delta reaching the
//!   observer (the engine) or to the read that completes the event returning (the bare
//!   loop);
//! - unpaced: the whole stream written at once: from the server's first byte to the last
//!   token, per token (the decoding cost when the network is never the bottleneck).
//!
//! Method, for a shared machine whose load changes from one second to the next: rounds
//! come in *pairs*, one of each path back to back (which goes first alternates), and the
//! figure is the median over pairs of the ratio within a pair, with its quartiles. A pair
//! takes well under a second, so both of its rounds see about the same load; the median
//! of many pairs is then robust to the pairs a burst of load hit. The engine's provider
//! (its HTTP client) is built once, as in a run that makes many calls; the bare loop's
//! client likewise. Every round opens a new connection (the server closes it).
//!
//! Both paths are driven the way `nerve run` drives the engine: `block_on` on the main
//! thread of a two-worker runtime. The engine drains a live stream in a task of its own on
//! a worker (next to hyper's connection task), so its deltas never cross threads; the
//! bare loop reads in `block_on`, and each of its frames crosses threads twice (hyper
//! hands a body over one frame at a time). `worker` runs the bare loop in a spawned task
//! instead: a reference for the engine's own cost per token, without that hand-over.
//!
//! `cargo xtask bench stream` (or `cargo bench -p nerve-brain --bench stream [-- paced |
//! unpaced] [worker]`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // A benchmark's report.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nerve_brain::{
    AgentEngine, Delta, DeltaObserver, EngineConfig, OpenAiConfig, OpenAiProvider, Task,
};
use nerve_core::event::CallPurpose;
use nerve_core::testing::{CannedTools, DiscardSink};
use nerve_core::{ExecutionId, TaskId, TaskStatus, TerminationReason};
use tokio_util::sync::CancellationToken;

const PACE: Duration = Duration::from_millis(2);

/// One shape: how the server writes, how many tokens and pairs, what is measured.
struct Shape {
    paced: bool,
    tokens: usize,
    pairs: usize,
    name: &'static str,
    measure: fn(&[Instant], &[Instant]) -> f64,
}

const SHAPES: [Shape; 2] = [
    Shape {
        paced: true,
        tokens: 200,
        pairs: 41,
        name: "paced (one event every 2 ms, 200 tokens): latency per token, server write -> reader (a round's median)",
        measure: latency,
    },
    Shape {
        paced: false,
        tokens: 400,
        pairs: 151,
        name: "unpaced (400 events written at once): first byte -> last token, per token",
        measure: per_token,
    },
];

/// Pairs run before the measured ones (connections, caches, the allocator).
const WARM_UP: usize = 3;

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

fn tail(tokens: usize) -> String {
    format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":50,\"completion_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
    )
}

impl Server {
    fn start(paced: bool, tokens: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        let sent: Sent = Arc::default();
        let times = Arc::clone(&sent);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                serve(stream, paced, tokens, &times);
            }
        });
        Self { url, sent }
    }

    fn take_sent(&self) -> Vec<Instant> {
        std::mem::take(&mut *self.sent.lock().unwrap())
    }
}

fn serve(stream: TcpStream, paced: bool, tokens: usize, sent: &Mutex<Vec<Instant>>) {
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
    let mut times = Vec::with_capacity(tokens);
    if paced {
        for k in 0..tokens {
            let bytes = chunk(&event(k));
            std::thread::sleep(PACE);
            times.push(Instant::now());
            stream.write_all(bytes.as_bytes()).unwrap();
        }
    } else {
        let body: String = (0..tokens).map(|k| chunk(&event(k))).collect();
        let now = Instant::now();
        times.resize(tokens, now);
        stream.write_all(body.as_bytes()).unwrap();
    }
    // Noted before the end goes out: the engine stops reading at `[DONE]`, and its round
    // may end before this thread runs again.
    *sent.lock().unwrap() = times;
    stream.write_all(chunk(&tail(tokens)).as_bytes()).unwrap();
    stream.write_all(b"0\r\n\r\n").unwrap();
}

/// The anchor: POST, then read chunks until the end, noting when each event completed.
async fn bare(client: &reqwest::Client, url: &str, tokens: usize) -> Vec<Instant> {
    let mut response = client
        .post(format!("{url}/chat/completions"))
        .header("content-type", "application/json")
        .body(r#"{"model":"bench","stream":true,"messages":[{"role":"user","content":"go"}]}"#)
        .send()
        .await
        .unwrap();
    let mut done = Vec::with_capacity(tokens + 2);
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
    done.truncate(tokens);
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

/// The engine's path: one run whose single answer streams from the server.
async fn engine(provider: &Arc<OpenAiProvider>) -> Vec<Instant> {
    let arrivals = Arc::new(Arrivals::default());
    let mut engine = AgentEngine::new(
        Arc::clone(provider) as Arc<dyn nerve_brain::Provider>,
        Arc::new(CannedTools::default()),
        Arc::new(DiscardSink),
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

/// The value at quantile `q` (0 to 1, nearest rank) of `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[at]
}

fn median(values: &[f64]) -> f64 {
    quantile(values, 0.5)
}

/// The median latency of one round's tokens, in µs (a median: on a shared machine a few
/// tokens wait for a core, whichever path reads them).
fn latency(sent: &[Instant], arrived: &[Instant]) -> f64 {
    assert_eq!(arrived.len(), sent.len(), "every token arrived");
    median(
        &sent
            .iter()
            .zip(arrived)
            .map(|(s, a)| micros(a.saturating_duration_since(*s)))
            .collect::<Vec<_>>(),
    )
}

/// From the first byte to the last token, per token, in µs.
fn per_token(sent: &[Instant], arrived: &[Instant]) -> f64 {
    assert_eq!(arrived.len(), sent.len(), "every token arrived");
    let last = arrived[arrived.len() - 1];
    micros(last.saturating_duration_since(sent[0])) / sent.len() as f64
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// `median (p25–p75, min–max)` of `values`, each shown by `show`.
fn spread(values: &[f64], show: impl Fn(f64) -> String) -> String {
    format!(
        "median {} (p25 {}, p75 {}; min {}, max {})",
        show(median(values)),
        show(quantile(values, 0.25)),
        show(quantile(values, 0.75)),
        show(quantile(values, 0.0)),
        show(quantile(values, 1.0)),
    )
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
    // `cargo bench` passes `--bench`; any other argument names the shapes to run, or
    // `worker`: the anchor reads in a task spawned on the runtime instead of in `block_on`
    // (a reference: no hand-over between threads for the anchor either).
    let mut chosen: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let on_worker = chosen.iter().any(|c| c == "worker");
    chosen.retain(|c| c != "worker");
    println!(
        "stream benchmark: rounds in pairs (order alternating), {WARM_UP} warm-up pairs; anchor read {}; load average {} at the start",
        if on_worker {
            "by a task on a runtime worker"
        } else {
            "in block_on, as the engine is driven"
        },
        load_average()
    );
    for shape in &SHAPES {
        let key = if shape.paced { "paced" } else { "unpaced" };
        if !chosen.is_empty() && !chosen.iter().any(|c| c == key) {
            continue;
        }
        let server = Server::start(shape.paced, shape.tokens);
        let mut config = OpenAiConfig::new("bench");
        config.base_url.clone_from(&server.url);
        let provider = Arc::new(OpenAiProvider::new(config).unwrap());
        let anchor = || {
            let arrived = if on_worker {
                let (client, url, tokens) = (client.clone(), server.url.clone(), shape.tokens);
                runtime
                    .block_on(runtime.spawn(async move { bare(&client, &url, tokens).await }))
                    .unwrap()
            } else {
                runtime.block_on(bare(&client, &server.url, shape.tokens))
            };
            (shape.measure)(&server.take_sent(), &arrived)
        };
        let ours = || {
            let arrived = runtime.block_on(engine(&provider));
            (shape.measure)(&server.take_sent(), &arrived)
        };
        let (mut anchors, mut engines, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for pair in 0..WARM_UP + shape.pairs {
            let (a, e) = if pair % 2 == 0 {
                let a = anchor();
                (a, ours())
            } else {
                let e = ours();
                (anchor(), e)
            };
            if pair >= WARM_UP {
                anchors.push(a);
                engines.push(e);
                ratios.push(e / a);
            }
        }
        let us = |v: f64| format!("{v:.2} µs");
        let times = |v: f64| format!("{v:.3}x");
        println!("{} ({} pairs)", shape.name, shape.pairs);
        println!("  bare reqwest loop (anchor)  {}", spread(&anchors, us));
        println!("  engine -> DeltaObserver     {}", spread(&engines, us));
        println!("  ratio within a pair         {}", spread(&ratios, times));
        println!("  load average now {}", load_average());
    }
}
