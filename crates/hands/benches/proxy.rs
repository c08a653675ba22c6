//! `cargo xtask bench proxy`: what the auth proxy adds, as ratios against a direct loopback
//! upstream measured in the same run.
//!
//! - Latency of a small GET (p50, p99), contenders sampled alternately, sample by sample:
//!   direct with keep-alive (the anchor), direct with a new connection per request, through
//!   the proxy (a rule without a credential; no scrubbing), through the proxy with a
//!   credential injected and the body scrubbed, and through the executor's relay and the
//!   proxy (the path a command in the sandbox takes, here on the host's loopback).
//! - Throughput: small requests per second with 8 concurrent keep-alive clients, and bulk
//!   MB/s of a 64 MiB body.
//!
//! The proxy connects to the upstream afresh for every request (nothing of one request can
//! leak into another), so "direct, new connection" is the fairer anchor for its cost; both
//! are reported. Decisions go to an in-memory sink: the event log's durable append is
//! measured by the session benchmarks, not here.
//!
//! A custom harness (`harness = false`): the figures are p50/p99 ratios between contenders
//! sampled alternately, which a per-function harness does not report.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A report for people.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nerve_core::ExecutionId;
use nerve_core::testing::DiscardSink;
use nerve_hands::proxy::{
    Credential, HostPattern, Proxy, ProxyConfig, ProxyLimits, ProxyRule, UpstreamScheme,
};
use secrecy::SecretString;
use tokio::net::{TcpListener, TcpStream, UnixStream};

const SAMPLES: usize = 2000;
const WARMUP: usize = 200;
const CONCURRENCY: usize = 8;
const REQUESTS_PER_CLIENT: usize = 500;
const THROUGHPUT_ROUNDS: usize = 3;
const BIG_BYTES: usize = 64 << 20;
const BIG_ROUNDS: usize = 7;

/// `/small` answers `ok`; `/big` streams [`BIG_BYTES`] in 64 KiB chunks.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let chunk = Bytes::from(vec![b'x'; 64 << 10]);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let _ = stream.set_nodelay(true);
            let chunk = chunk.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: hyper::Request<Incoming>| {
                    let chunk = chunk.clone();
                    async move {
                        let big = request.uri().path() == "/big";
                        let count = if big { BIG_BYTES / chunk.len() } else { 0 };
                        let frames = futures_util::stream::iter(
                            (0..count)
                                .map(move |_| Ok::<_, Infallible>(Frame::data(chunk.clone()))),
                        );
                        let small =
                            futures_util::stream::iter((!big).then(|| {
                                Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"ok")))
                            }));
                        let body = StreamBody::new(futures_util::StreamExt::chain(frames, small));
                        let length = if big { BIG_BYTES } else { 2 };
                        let response = hyper::Response::builder()
                            .header("content-length", length)
                            .body(body)
                            .unwrap();
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

fn proxy(port: u16, credential: bool) -> Proxy {
    let rule = ProxyRule {
        upstream_scheme: UpstreamScheme::Http,
        upstream_port: Some(port),
        allow_private: true,
        credential: credential.then(|| Credential {
            name: "bench".to_owned(),
            header: "Authorization".to_owned(),
            template: "Bearer {secret}".to_owned(),
            secret: SecretString::from("bench-secret-0123456789abcdef"),
        }),
        ..ProxyRule::new(HostPattern::parse("127.0.0.1").unwrap())
    };
    let config = ProxyConfig {
        limits: ProxyLimits {
            max_response_body_bytes: 1 << 30,
            ..ProxyLimits::default()
        },
        ..ProxyConfig::new(vec![rule])
    };
    Proxy::start(config, Arc::new(DiscardSink), ExecutionId::new()).unwrap()
}

/// Where a contender sends its requests.
#[derive(Clone)]
enum Route {
    /// Straight to the upstream; `fresh` opens a new connection per request.
    Direct { address: SocketAddr, fresh: bool },
    /// Through a proxy's unix socket.
    Proxy(PathBuf),
    /// Through the executor's relay (TCP) to a proxy.
    Relay(SocketAddr),
}

async fn open(route: &Route) -> SendRequest<Full<Bytes>> {
    async fn handshake<T>(io: T) -> SendRequest<Full<Bytes>>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .unwrap();
        tokio::spawn(connection);
        sender
    }
    match route {
        Route::Direct { address, .. } | Route::Relay(address) => {
            let stream = TcpStream::connect(address).await.unwrap();
            stream.set_nodelay(true).unwrap();
            handshake(stream).await
        }
        Route::Proxy(path) => handshake(UnixStream::connect(path).await.unwrap()).await,
    }
}

/// A contender: a route and its open connection.
struct Client {
    route: Route,
    upstream: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Client {
    async fn new(route: Route, upstream: SocketAddr) -> Self {
        let sender = Some(open(&route).await);
        Self {
            route,
            upstream,
            sender,
        }
    }

    /// One GET of `path`; returns the body's size.
    async fn get(&mut self, path: &str) -> usize {
        if matches!(self.route, Route::Direct { fresh: true, .. }) || self.sender.is_none() {
            self.sender = Some(open(&self.route).await);
        }
        let uri = match self.route {
            Route::Direct { .. } => path.to_owned(),
            Route::Proxy(_) | Route::Relay(_) => format!("http://{}{path}", self.upstream),
        };
        let request = hyper::Request::get(uri)
            .header("host", self.upstream.to_string())
            .body(Full::new(Bytes::new()))
            .unwrap();
        let sender = self.sender.as_mut().unwrap();
        sender.ready().await.unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let mut body = response.into_body();
        let mut size = 0;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                size += data.len();
            }
        }
        size
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let upstream = upstream().await;
        let plain = proxy(upstream.port(), false);
        let credentialed = proxy(upstream.port(), true);
        let relay = nerve_executor::spawn_relay(nerve_executor::RelayConfig::new(
            credentialed.socket_path(),
            "127.0.0.1:0".parse().unwrap(),
        ))
        .unwrap();
        let routes = [
            (
                "direct, keep-alive (anchor)",
                Route::Direct {
                    address: upstream,
                    fresh: false,
                },
            ),
            (
                "direct, new connection per request",
                Route::Direct {
                    address: upstream,
                    fresh: true,
                },
            ),
            (
                "proxy, allowed (no credential, no scrubbing)",
                Route::Proxy(plain.socket_path()),
            ),
            (
                "proxy, credential injected + body scrubbed",
                Route::Proxy(credentialed.socket_path()),
            ),
            (
                "relay + proxy, credential injected + scrubbed",
                Route::Relay(relay.local_addr()),
            ),
        ];
        latency(&routes, upstream).await;
        throughput(&routes, upstream).await;
        bulk(&routes, upstream).await;
        drop((plain, credentialed));
    });
}

async fn latency(routes: &[(&str, Route)], upstream: SocketAddr) {
    let mut clients = Vec::new();
    for (_, route) in routes {
        clients.push(Client::new(route.clone(), upstream).await);
    }
    let mut samples = vec![Vec::with_capacity(SAMPLES); routes.len()];
    for round in 0..WARMUP + SAMPLES {
        for (index, client) in clients.iter_mut().enumerate() {
            let started = Instant::now();
            assert_eq!(client.get("/small").await, 2);
            if round >= WARMUP {
                samples[index].push(started.elapsed());
            }
        }
    }
    println!("\n## latency of a small GET ({SAMPLES} samples each, interleaved)\n");
    println!("| contender | p50 | p99 | p50 / anchor | p99 / anchor | p50 added |");
    println!("|---|---|---|---|---|---|");
    let mut anchor = None;
    for ((name, _), mut samples) in routes.iter().zip(samples) {
        samples.sort();
        let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
        let (a50, a99) = *anchor.get_or_insert((p50, p99));
        println!(
            "| {name} | {} | {} | {:.2}× | {:.2}× | {} |",
            ms(p50),
            ms(p99),
            p50.as_secs_f64() / a50.as_secs_f64(),
            p99.as_secs_f64() / a99.as_secs_f64(),
            ms(p50.saturating_sub(a50)),
        );
    }
}

async fn throughput(routes: &[(&str, Route)], upstream: SocketAddr) {
    println!(
        "\n## throughput, small GETs ({CONCURRENCY} clients × {REQUESTS_PER_CLIENT} requests, keep-alive to the first hop; median of {THROUGHPUT_ROUNDS} rounds, contenders alternated)\n"
    );
    println!("| contender | requests/s | vs anchor |");
    println!("|---|---|---|");
    let mut rates = vec![Vec::new(); routes.len()];
    for _ in 0..THROUGHPUT_ROUNDS {
        for (index, (_, route)) in routes.iter().enumerate() {
            let started = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..CONCURRENCY {
                let route = route.clone();
                tasks.push(tokio::spawn(async move {
                    let mut client = Client::new(route, upstream).await;
                    for _ in 0..REQUESTS_PER_CLIENT {
                        client.get("/small").await;
                    }
                }));
            }
            for task in tasks {
                task.await.unwrap();
            }
            let elapsed = started.elapsed().as_secs_f64();
            rates[index].push((CONCURRENCY * REQUESTS_PER_CLIENT) as f64 / elapsed);
        }
    }
    let mut anchor = None;
    for ((name, _), mut rates) in routes.iter().zip(rates) {
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let anchor = *anchor.get_or_insert(median);
        println!("| {name} | {median:.0} | {:.2}× |", median / anchor);
    }
}

async fn bulk(routes: &[(&str, Route)], upstream: SocketAddr) {
    let mut clients = Vec::new();
    for (_, route) in routes {
        clients.push(Client::new(route.clone(), upstream).await);
    }
    let mut rates = vec![Vec::new(); routes.len()];
    for _ in 0..BIG_ROUNDS {
        for (index, client) in clients.iter_mut().enumerate() {
            let started = Instant::now();
            assert_eq!(client.get("/big").await, BIG_BYTES);
            rates[index].push(BIG_BYTES as f64 / started.elapsed().as_secs_f64() / 1e6);
        }
    }
    println!("\n## bulk download, 64 MiB body (median of {BIG_ROUNDS}, interleaved)\n");
    println!("| contender | MB/s | vs anchor |");
    println!("|---|---|---|");
    let mut anchor = None;
    for ((name, _), mut rates) in routes.iter().zip(rates) {
        rates.sort_by(f64::total_cmp);
        let median = rates[rates.len() / 2];
        let anchor = *anchor.get_or_insert(median);
        println!("| {name} | {median:.0} | {:.2}× |", median / anchor);
    }
}
