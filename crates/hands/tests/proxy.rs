//! The auth proxy against in-process upstreams on 127.0.0.1: injection, scrubbing, the
//! policy and the attacks on it. Requests go in through the proxy's unix socket, as the
//! sandbox's relay and the `http_request` tool send them; some as raw bytes, to say what a
//! well-behaved client never would.
//!
//! Host names are resolved by a fake resolver that maps test names to 127.0.0.1 and
//! records every name it was asked about. No address but 127.0.0.1 is ever connected to:
//! the cases naming others are refused before any connection.
//!
//! Time bounds are liveness bounds (a hung exchange fails after a minute), never timing
//! assertions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nerve_core::event::{ProxyDecision, ProxyVerdict};
use nerve_core::{Event, EventSink, ExecutionId, SinkError};
use nerve_hands::proxy::{
    Credential, HostPattern, HttpRequest, Proxy, ProxyConfig, ProxyLimits, ProxyRule, Resolve,
    UpstreamScheme,
};
use secrecy::SecretString;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

const CANARY: &str = "canary-7f3a9c1e-do-not-leak";
const LIVENESS: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// Fixtures: an event sink, a resolver, upstream servers, clients.

#[derive(Default)]
struct MemorySink {
    events: Mutex<Vec<ProxyDecision>>,
    fail: bool,
}

#[async_trait]
impl EventSink for MemorySink {
    async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        if self.fail {
            return Err(SinkError::Write("disk full".to_owned()));
        }
        let Event::ProxyDecision(decision) = event else {
            panic!("the proxy emitted something else: {event:?}");
        };
        let mut events = self.events.lock().unwrap();
        events.push(decision);
        Ok(events.len() as u64)
    }
}

impl MemorySink {
    fn decisions(&self) -> Vec<ProxyDecision> {
        self.events.lock().unwrap().clone()
    }

    fn last(&self) -> ProxyDecision {
        self.decisions().pop().expect("no decision recorded")
    }
}

/// Maps names to addresses and remembers every name it was asked about.
#[derive(Default)]
struct FakeResolver {
    table: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
    /// Never answer (a dead DNS server).
    hang: bool,
}

#[async_trait]
impl Resolve for FakeResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.asked.lock().unwrap().push(host.to_owned());
        if self.hang {
            std::future::pending::<()>().await;
        }
        self.table
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown test host"))
    }
}

/// What an upstream received.
#[derive(Debug, Clone)]
struct Received {
    method: String,
    uri: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What an upstream answers.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Vec<u8>>,
    /// Before the response head.
    delay: Duration,
    /// Between body chunks.
    chunk_delay: Duration,
}

impl Reply {
    fn ok(body: impl Into<Vec<u8>>) -> Self {
        Self {
            status: 200,
            headers: Vec::new(),
            chunks: vec![body.into()],
            delay: Duration::ZERO,
            chunk_delay: Duration::ZERO,
        }
    }
}

type Handler = Arc<dyn Fn(&Received) -> Reply + Send + Sync>;

/// An HTTP upstream on 127.0.0.1 that records what it receives.
struct Upstream {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn start(handler: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let log = Arc::clone(&received);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let handler = Arc::clone(&handler);
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = service_fn(move |request: hyper::Request<Incoming>| {
                        let handler = Arc::clone(&handler);
                        let log = Arc::clone(&log);
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let received = Received {
                                method: parts.method.to_string(),
                                uri: parts.uri.to_string(),
                                headers: parts
                                    .headers
                                    .iter()
                                    .map(|(n, v)| {
                                        (
                                            n.to_string(),
                                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                                        )
                                    })
                                    .collect(),
                                body: body.to_vec(),
                            };
                            log.lock().unwrap().push(received.clone());
                            let reply = handler(&received);
                            tokio::time::sleep(reply.delay).await;
                            Ok::<_, Infallible>(respond(reply))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            port,
            received,
            task,
        }
    }

    /// Reflects the request as JSON, and its `Authorization` in `x-echo-authorization`;
    /// `?chunked` sends the body one byte per chunk.
    async fn echo() -> Self {
        Self::start(|seen| {
            let mut headers = serde_json::Map::new();
            for (name, value) in &seen.headers {
                headers.insert(name.clone(), serde_json::Value::String(value.clone()));
            }
            let body = serde_json::json!({
                "method": seen.method,
                "uri": seen.uri,
                "headers": headers,
                "body": String::from_utf8_lossy(&seen.body),
            })
            .to_string()
            .into_bytes();
            let mut reply = Reply::ok(Vec::new());
            reply.chunks = if seen.uri.contains("chunked") {
                body.iter().map(|b| vec![*b]).collect()
            } else {
                vec![body]
            };
            reply
                .headers
                .push(("content-type".to_owned(), "application/json".to_owned()));
            if let Some(auth) = seen.header("authorization") {
                reply
                    .headers
                    .push(("x-echo-authorization".to_owned(), auth.to_owned()));
            }
            reply
        })
        .await
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

/// A streamed body, so that replies can pause between chunks.
type UpstreamBody =
    StreamBody<futures_util::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn respond(reply: Reply) -> hyper::Response<UpstreamBody> {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    let chunk_delay = reply.chunk_delay;
    let chunks = reply.chunks;
    tokio::spawn(async move {
        for chunk in chunks {
            if sender.send(Bytes::from(chunk)).await.is_err() {
                return;
            }
            tokio::time::sleep(chunk_delay).await;
        }
    });
    let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(Frame::data(chunk)), receiver))
    });
    let mut response = hyper::Response::new(StreamBody::new(
        Box::pin(stream) as futures_util::stream::BoxStream<'static, _>
    ));
    *response.status_mut() = hyper::StatusCode::from_u16(reply.status).unwrap();
    for (name, value) in reply.headers {
        response.headers_mut().append(
            hyper::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            hyper::header::HeaderValue::from_str(&value).unwrap(),
        );
    }
    response
}

fn credential() -> Credential {
    Credential {
        name: "github".to_owned(),
        header: "Authorization".to_owned(),
        template: "Bearer {secret}".to_owned(),
        secret: SecretString::from(CANARY),
    }
}

/// A rule for a test host served by `upstream` on 127.0.0.1.
fn rule(host: &str, upstream: &Upstream) -> ProxyRule {
    ProxyRule {
        upstream_scheme: UpstreamScheme::Http,
        upstream_port: Some(upstream.port),
        allow_private: true,
        ..ProxyRule::new(HostPattern::parse(host).unwrap())
    }
}

fn credentialed(host: &str, upstream: &Upstream) -> ProxyRule {
    ProxyRule {
        methods: vec!["GET".into(), "HEAD".into(), "POST".into()],
        paths: vec!["/v1/".into()],
        credential: Some(credential()),
        ..rule(host, upstream)
    }
}

struct Harness {
    proxy: Proxy,
    sink: Arc<MemorySink>,
    resolver: Arc<FakeResolver>,
}

impl Harness {
    fn new(rules: Vec<ProxyRule>, names: &[&str]) -> Self {
        Self::with(rules, names, ProxyLimits::default(), false)
    }

    fn with(rules: Vec<ProxyRule>, names: &[&str], limits: ProxyLimits, fail: bool) -> Self {
        let resolver = Arc::new(FakeResolver {
            table: names
                .iter()
                .map(|n| ((*n).to_owned(), vec![IpAddr::from([127, 0, 0, 1])]))
                .collect(),
            ..FakeResolver::default()
        });
        Self::with_resolver(rules, resolver, limits, fail)
    }

    fn with_resolver(
        rules: Vec<ProxyRule>,
        resolver: Arc<FakeResolver>,
        limits: ProxyLimits,
        fail: bool,
    ) -> Self {
        let sink = Arc::new(MemorySink {
            fail,
            ..MemorySink::default()
        });
        let config = ProxyConfig {
            rules,
            limits,
            resolver: Arc::clone(&resolver) as Arc<dyn Resolve>,
        };
        let proxy = Proxy::start(
            config,
            Arc::clone(&sink) as Arc<dyn EventSink>,
            ExecutionId::new(),
        )
        .unwrap();
        Self {
            proxy,
            sink,
            resolver,
        }
    }

    /// Sends a request with hyper over the proxy's socket; the body is `Err` when it broke
    /// off.
    async fn send(&self, method: &str, uri: &str, headers: &[(&str, &str)], body: &str) -> Answer {
        let mut request = hyper::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        tokio::time::timeout(LIVENESS, async {
            let stream = UnixStream::connect(self.proxy.socket_path()).await.unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            let response = sender.send_request(request).await.unwrap();
            let (head, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .map_err(|e| e.to_string());
            Answer {
                status: head.status.as_u16(),
                headers: head.headers,
                body,
            }
        })
        .await
        .expect("the exchange hung")
    }

    async fn get(&self, uri: &str) -> Answer {
        self.send("GET", uri, &[], "").await
    }

    /// Sends raw bytes and returns everything the proxy wrote back before closing.
    async fn raw(&self, bytes: &[u8]) -> String {
        raw_exchange(&self.proxy.socket_path(), bytes).await
    }

    /// Nothing the proxy recorded holds the secret, in any form an event takes.
    fn assert_events_clean(&self) {
        for decision in self.sink.decisions() {
            let json = serde_json::to_string(&decision).unwrap();
            assert!(!json.contains(CANARY), "{json}");
        }
    }

    fn asked(&self) -> Vec<String> {
        self.resolver.asked.lock().unwrap().clone()
    }
}

async fn raw_exchange(socket: &Path, bytes: &[u8]) -> String {
    tokio::time::timeout(LIVENESS, async {
        let mut stream = UnixStream::connect(socket).await.unwrap();
        stream.write_all(bytes).await.unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    })
    .await
    .expect("the raw exchange hung")
}

#[derive(Debug)]
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    body: Result<String, String>,
}

impl Answer {
    fn text(&self) -> &str {
        self.body
            .as_deref()
            .unwrap_or_else(|e| panic!("the body broke off: {e}"))
    }

    fn assert_clean(&self) {
        for (name, value) in &self.headers {
            assert!(
                !String::from_utf8_lossy(value.as_bytes()).contains(CANARY),
                "{name}"
            );
        }
        if let Ok(body) = &self.body {
            assert!(!body.contains(CANARY), "{body}");
        }
    }
}

fn status_of(raw: &str) -> u16 {
    raw.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {raw:?}"))
}

// ---------------------------------------------------------------------------------------
// Injection and scrubbing.

#[tokio::test]
async fn the_credential_replaces_whatever_the_sandbox_sends_and_is_scrubbed_from_the_answer() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let answer = h
        .send(
            "POST",
            "http://good.test/v1/items?x=1",
            &[
                ("Authorization", "Bearer sandbox-made-up"),
                ("Proxy-Authorization", "Basic eDp5"),
                ("Cookie", "session=abc"),
                ("X-Api-Key", "k-123"),
                ("X-Auth-Token", "t-123"),
                ("Accept-Encoding", "gzip"),
                ("Connection", "x-custom-hop"),
                ("X-Custom-Hop", "dropped"),
                ("X-Kept", "kept"),
            ],
            "payload",
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.assert_clean();
    let received = good.received();
    assert_eq!(received.len(), 1);
    let seen = &received[0];
    assert_eq!(seen.uri, "/v1/items?x=1", "origin-form upstream");
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert_eq!(
        seen.headers
            .iter()
            .filter(|(n, _)| n == "authorization")
            .count(),
        1
    );
    for gone in [
        "proxy-authorization",
        "cookie",
        "x-api-key",
        "x-auth-token",
        "x-custom-hop",
    ] {
        assert_eq!(seen.header(gone), None, "{gone} was forwarded");
    }
    assert_eq!(seen.header("x-kept"), Some("kept"));
    assert_eq!(seen.header("accept-encoding"), Some("identity"));
    assert_eq!(
        seen.header("host"),
        Some(format!("good.test:{}", good.port).as_str())
    );
    assert_eq!(seen.body, b"payload");
    // The echo reflected the secret in its body and a header: both scrubbed.
    let body: serde_json::Value = serde_json::from_str(answer.text()).unwrap();
    assert_eq!(body["headers"]["authorization"], "Bearer [REDACTED:github]");
    assert_eq!(
        answer.headers["x-echo-authorization"],
        "Bearer [REDACTED:github]"
    );
    let decision = h.sink.last();
    assert_eq!(
        decision,
        ProxyDecision {
            host: "good.test".into(),
            method: "POST".into(),
            path: "/v1/items".into(),
            decision: ProxyVerdict::Injected,
            status: Some(200),
            credential: Some("github".into()),
            reason: None,
        }
    );
    h.assert_events_clean();
}

#[tokio::test]
async fn a_secret_cut_into_one_byte_chunks_is_still_scrubbed() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let answer = h.get("http://good.test/v1/chunked").await;
    assert_eq!(answer.status, 200);
    answer.assert_clean();
    assert!(
        answer.text().contains("Bearer [REDACTED:github]"),
        "{}",
        answer.text()
    );
    assert_eq!(
        answer.headers.get("content-length"),
        None,
        "the length changed"
    );
}

#[tokio::test]
async fn the_http_request_client_goes_through_the_same_rules() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let client = h.proxy.client();
    let request = |method: &str, url: &str| HttpRequest {
        method: method.to_owned(),
        url: url.to_owned(),
        headers: vec![("Authorization".to_owned(), "Bearer mine".to_owned())],
        body: None,
    };
    let ok = client
        .send(request("GET", "http://good.test/v1/me"))
        .await
        .unwrap();
    assert_eq!(ok.status, 200);
    let body = String::from_utf8(ok.body).unwrap();
    assert!(
        body.contains("Bearer [REDACTED:github]") && !body.contains(CANARY),
        "{body}"
    );
    assert_eq!(
        good.received()[0].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    let denied = client
        .send(request("GET", "http://evil.test/"))
        .await
        .unwrap();
    assert_eq!(denied.status, 403);
    assert!(
        denied
            .headers
            .contains(&("x-nerve-proxy".to_owned(), "denied".to_owned()))
    );
    assert_eq!(
        String::from_utf8(denied.body).unwrap(),
        "nerve proxy: denied: no rule allows the host evil.test\n"
    );
    let https = client
        .send(request("GET", "https://good.test/v1/me"))
        .await
        .unwrap();
    assert_eq!(
        https.status, 200,
        "gateway mode: the rule picks the upstream scheme"
    );
    h.assert_events_clean();
}

// ---------------------------------------------------------------------------------------
// Where credentials go.

#[tokio::test]
async fn a_credential_never_goes_to_another_host() {
    let good = Upstream::echo().await;
    let other = Upstream::echo().await;
    let h = Harness::new(
        vec![
            credentialed("good.test", &good),
            ProxyRule {
                methods: vec!["GET".into(), "POST".into()],
                ..rule("*.other.test", &other)
            },
        ],
        &["good.test", "a.other.test", "good.test.other.test"],
    );
    for uri in [
        "http://a.other.test/v1/x",
        "http://good.test.other.test/v1/x",
    ] {
        let answer = h
            .send("GET", uri, &[("Authorization", "Bearer sandbox-own")], "")
            .await;
        assert_eq!(answer.status, 200, "{uri}");
        assert_eq!(h.sink.last().decision, ProxyVerdict::Allowed);
        assert_eq!(h.sink.last().credential, None);
    }
    for seen in other.received() {
        let all = format!("{seen:?}");
        assert!(!all.contains(CANARY), "{all}");
        // Without a credential of its own, the rule passes the sandbox's header on.
        assert_eq!(seen.header("authorization"), Some("Bearer sandbox-own"));
    }
    for (uri, status) in [
        ("http://evil.test/v1/x", 403),
        ("http://sub.good.test/v1/x", 403),
        ("http://other.test/v1/x", 403),
        ("http://evilgood.test/v1/x", 403),
    ] {
        let answer = h.get(uri).await;
        assert_eq!(answer.status, status, "{uri}: {answer:?}");
        assert_eq!(answer.headers["x-nerve-proxy"], "denied");
        assert_eq!(h.sink.last().decision, ProxyVerdict::Denied);
    }
    assert!(good.received().is_empty(), "{:?}", good.received());
    h.assert_events_clean();
}

#[tokio::test]
async fn absolute_form_tricks_are_refused_before_anything_is_resolved() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let port = good.port;
    let cases: Vec<(String, u16)> = vec![
        ("http://user@good.test/v1/x".into(), 400),
        ("http://user@evil.test@good.test/v1/x".into(), 400),
        ("http://good.test:22/v1/x".into(), 403),
        (format!("http://127.0.0.1:{port}/v1/x"), 403),
        (format!("http://[::1]:{port}/v1/x"), 403),
        ("http://0x7f.0.0.1/v1/x".into(), 400),
        ("http://127.1/v1/x".into(), 400),
        ("http://g%6fod.test/v1/x".into(), 400),
        ("http://good.test/v1/../admin".into(), 400),
        ("http://good.test/v1/%2e%2e/admin".into(), 400),
        ("http://good.test/v1/..%2fadmin".into(), 400),
        ("http://good.test/v1/x%5c..%5c..%5cadmin".into(), 400),
        ("http://good.test/admin".into(), 403),
        ("http://good.test/v1".into(), 403),
        ("ftp://good.test/v1/x".into(), 400),
    ];
    for (uri, status) in &cases {
        let line = format!("GET {uri} HTTP/1.1\r\nConnection: close\r\n\r\n");
        let answer = h.raw(line.as_bytes()).await;
        assert_eq!(status_of(&answer), *status, "{uri}: {answer}");
    }
    let non_ascii = h
        .raw("GET http://gööd.test/v1/x HTTP/1.1\r\nConnection: close\r\n\r\n".as_bytes())
        .await;
    assert_eq!(status_of(&non_ascii), 400, "{non_ascii}");
    assert!(good.received().is_empty(), "{:?}", good.received());
    assert!(h.asked().is_empty(), "resolved: {:?}", h.asked());
    // Case and a trailing dot are the same host: allowed, and only to it.
    for uri in ["http://GOOD.Test./v1/x", "http://good.test:80/v1/x"] {
        let answer = h.get(uri).await;
        assert_eq!(answer.status, 200, "{uri}");
        assert_eq!(h.sink.last().host, "good.test");
    }
    assert_eq!(good.received().len(), 2);
    h.assert_events_clean();
}

#[tokio::test]
async fn the_host_header_and_the_target_must_agree() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let cases = [
        (
            "GET http://good.test/v1/x HTTP/1.1\r\nHost: evil.test\r\n",
            400,
        ),
        (
            "GET http://evil.test/v1/x HTTP/1.1\r\nHost: good.test\r\n",
            400,
        ),
        (
            "GET http://good.test/v1/x HTTP/1.1\r\nHost: good.test:8080\r\n",
            400,
        ),
        (
            "GET /v1/x HTTP/1.1\r\nHost: good.test\r\nHost: evil.test\r\n",
            400,
        ),
        ("GET /v1/x HTTP/1.1\r\nHost: user@good.test\r\n", 400),
        ("GET /v1/x HTTP/1.1\r\n", 400),
        ("GET /v1/x HTTP/1.1\r\nHost: evil.test\r\n", 403),
    ];
    for (head, status) in cases {
        let answer = h
            .raw(format!("{head}Connection: close\r\n\r\n").as_bytes())
            .await;
        assert_eq!(status_of(&answer), status, "{head}: {answer}");
    }
    assert!(good.received().is_empty());
    // Origin-form with a Host header is how a plain client talks to a gateway.
    let answer = h
        .raw(b"GET /v1/x HTTP/1.1\r\nHost: good.test\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert!(!answer.contains(CANARY));
    assert_eq!(good.received().len(), 1);
}

#[tokio::test]
async fn redirects_are_passed_back_never_followed() {
    let evil = Upstream::echo().await;
    let good = Upstream::start(|seen| {
        let mut reply = Reply::ok(Vec::new());
        reply.status = 302;
        // A hostile upstream even puts the credential it got into the Location.
        let token = seen
            .header("authorization")
            .unwrap_or_default()
            .replace(' ', "%20");
        reply.headers.push((
            "location".to_owned(),
            format!("http://evil.test/steal?t={token}"),
        ));
        reply
    })
    .await;
    let h = Harness::new(
        vec![credentialed("good.test", &good), rule("evil.test", &evil)],
        &["good.test", "evil.test"],
    );
    let answer = h.get("http://good.test/v1/redirect").await;
    assert_eq!(answer.status, 302);
    answer.assert_clean();
    assert_eq!(
        answer.headers["location"],
        "http://evil.test/steal?t=Bearer%20[REDACTED:github]"
    );
    assert_eq!(good.received().len(), 1);
    assert!(evil.received().is_empty(), "the redirect was followed");
    assert_eq!(h.sink.last().status, Some(302));
}

// ---------------------------------------------------------------------------------------
// Framing attacks, sent as raw bytes.

#[tokio::test]
async fn smuggled_headers_and_bodies_are_refused_or_reframed() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    let refused = [
        "POST http://good.test/v1/x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 40\r\nConnection: close\r\n\r\nhello",
        "GET http://good.test/v1/x HTTP/1.1\r\nX-A: a\r\n folded: yes\r\nConnection: close\r\n\r\n",
        "GET http://good.test/v1/x HTTP/1.1\r\nX-A: a\rAuthorization: Bearer evil\r\nConnection: close\r\n\r\n",
        "GET http://good.test/v1/x HTTP/1.1\r\nX-A: a\0b\r\nConnection: close\r\n\r\n",
        "POST http://good.test/v1/x HTTP/1.1\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\n",
        "POST http://good.test/v1/x HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ];
    for raw in refused {
        let answer = h.raw(raw.as_bytes()).await;
        assert_eq!(status_of(&answer), 400, "{raw:?}: {answer}");
    }
    assert!(good.received().is_empty(), "{:?}", good.received());
    // Transfer-Encoding with Content-Length: the chunked body wins, the connection closes
    // after the answer, and what followed is never read as a request. The upstream gets
    // one request, framed by the proxy.
    let smuggle = "POST http://good.test/v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\nGET http://good.test/v1/smuggled HTTP/1.1\r\nHost: good.test\r\n\r\n";
    let answer = h.raw(smuggle.as_bytes()).await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    let received = good.received();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].uri, "/v1/x");
    assert_eq!(received[0].header("transfer-encoding"), None);
    assert_eq!(received[0].header("content-length"), Some("0"));
    // A bare LF ends a header line: the second line is a header of its own, and as a
    // credential header it is replaced like any other.
    let answer = h
        .raw(b"GET http://good.test/v1/x HTTP/1.1\nX-A: a\nAuthorization: Bearer evil\nConnection: close\n\n")
        .await;
    assert_eq!(status_of(&answer), 200, "{answer}");
    assert_eq!(
        good.received()[1].header("authorization"),
        Some(format!("Bearer {CANARY}").as_str())
    );
    assert!(!answer.contains(CANARY));
}

// ---------------------------------------------------------------------------------------
// Resolution and addresses.

#[tokio::test]
async fn a_denied_host_name_is_never_resolved() {
    let good = Upstream::echo().await;
    let h = Harness::new(vec![credentialed("good.test", &good)], &["good.test"]);
    for (method, uri) in [
        ("GET", "http://evil.test/v1/x"),
        ("GET", "http://evil.test./"),
        ("DELETE", "http://good.test/v1/x"),
        ("GET", "http://good.test/admin"),
        ("GET", "http://good.test:8443/v1/x"),
        ("CONNECT", "good.test:443"),
    ] {
        let answer = h.send(method, uri, &[], "").await;
        assert_eq!(answer.status, 403, "{method} {uri}: {answer:?}");
    }
    assert!(h.asked().is_empty(), "resolved: {:?}", h.asked());
    assert_eq!(h.get("http://good.test/v1/x").await.status, 200);
    assert_eq!(h.asked(), ["good.test"]);
}

#[tokio::test]
async fn private_and_metadata_addresses_are_refused_after_resolution() {
    let good = Upstream::echo().await;
    let mut table: HashMap<String, Vec<IpAddr>> = HashMap::new();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    table.insert("internal.test".into(), vec![ip("127.0.0.1")]);
    table.insert("metadata.test".into(), vec![ip("169.254.169.254")]);
    table.insert("mixed.test".into(), vec![ip("8.8.8.8"), ip("10.0.0.1")]);
    table.insert("v6.test".into(), vec![ip("fd00:ec2::254")]);
    table.insert("mapped.test".into(), vec![ip("::ffff:127.0.0.1")]);
    let resolver = Arc::new(FakeResolver {
        table,
        ..FakeResolver::default()
    });
    let strict = |host: &str| ProxyRule {
        allow_private: false,
        ..rule(host, &good)
    };
    let h = Harness::with_resolver(
        vec![
            strict("internal.test"),
            strict("metadata.test"),
            strict("mixed.test"),
            strict("v6.test"),
            strict("mapped.test"),
            strict("169.254.169.254"),
            strict("127.0.0.1"),
        ],
        resolver,
        ProxyLimits::default(),
        false,
    );
    for (uri, reason) in [
        (
            "http://internal.test/",
            "internal.test resolves to a loopback address (127.0.0.1)",
        ),
        (
            "http://metadata.test/",
            "metadata.test resolves to the cloud metadata address (169.254.169.254)",
        ),
        (
            "http://mixed.test/",
            "mixed.test resolves to a private address (10.0.0.1)",
        ),
        (
            "http://v6.test/",
            "v6.test resolves to a unique-local address (fd00:ec2::254)",
        ),
        (
            "http://mapped.test/",
            "mapped.test resolves to a loopback address (::ffff:127.0.0.1)",
        ),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254 resolves to the cloud metadata address (169.254.169.254)",
        ),
        (
            "http://127.0.0.1/",
            "127.0.0.1 resolves to a loopback address (127.0.0.1)",
        ),
    ] {
        let answer = h.get(uri).await;
        assert_eq!(answer.status, 403, "{uri}");
        assert_eq!(
            h.sink.last().reason.as_deref(),
            Some(format!("{reason}; a rule must set allow_private to reach it").as_str())
        );
    }
    assert!(good.received().is_empty());
    // The literals were never looked up.
    assert_eq!(
        h.asked(),
        [
            "internal.test",
            "metadata.test",
            "mixed.test",
            "v6.test",
            "mapped.test"
        ]
    );
}

// ---------------------------------------------------------------------------------------
// Methods, paths, sizes, time.

#[tokio::test]
async fn methods_and_paths_follow_the_rule() {
    let good = Upstream::echo().await;
    let h = Harness::new(
        vec![ProxyRule {
            methods: vec!["GET".into(), "PUT".into()],
            paths: vec!["/repos/acme".into(), "/users/".into()],
            ..rule("good.test", &good)
        }],
        &["good.test"],
    );
    for (method, path, status) in [
        ("GET", "/repos/acme", 200),
        ("GET", "/repos/acme/x?q=..", 200),
        ("PUT", "/users/me", 200),
        ("GET", "/repos/acmeevil", 403),
        ("GET", "/users", 403),
        ("GET", "/", 403),
        ("POST", "/repos/acme", 403),
        ("DELETE", "/users/me", 403),
        ("GET", "/repos/acme/./x", 400),
        ("GET", "/repos/acme/%2E%2E/%2E%2E/admin", 400),
        ("GET", "/repos/acme/..;/admin", 400),
    ] {
        let answer = h
            .send(method, &format!("http://good.test{path}"), &[], "")
            .await;
        assert_eq!(answer.status, status, "{method} {path}");
    }
    let lower = h
        .raw(b"get http://good.test/repos/acme HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await;
    assert_eq!(
        status_of(&lower),
        403,
        "methods are case-sensitive: {lower}"
    );
    assert_eq!(good.received().len(), 3);
}

#[tokio::test]
async fn oversized_bodies_are_refused_or_cut_off() {
    let big = Upstream::start(|seen| {
        let size = if seen.uri.contains("announced") {
            8192
        } else {
            0
        };
        let mut reply = Reply::ok(vec![b'x'; size]);
        if size > 0 {
            reply
                .headers
                .push(("content-length".into(), size.to_string()));
        } else {
            reply.chunks = vec![vec![b'y'; 1024]; 16];
        }
        reply
    })
    .await;
    let limits = ProxyLimits {
        max_request_body_bytes: 1024,
        max_response_body_bytes: 4096,
        ..ProxyLimits::default()
    };
    let h = Harness::with(
        vec![ProxyRule {
            methods: vec!["GET".into(), "POST".into()],
            ..rule("big.test", &big)
        }],
        &["big.test"],
        limits,
        false,
    );
    let announced = h
        .send("POST", "http://big.test/up", &[], &"z".repeat(2048))
        .await;
    assert_eq!(announced.status, 413);
    let chunked = format!(
        "POST http://big.test/up HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n800\r\n{}\r\n0\r\n\r\n",
        "z".repeat(2048)
    );
    assert_eq!(status_of(&h.raw(chunked.as_bytes()).await), 413);
    assert!(big.received().is_empty());
    let response = h.get("http://big.test/announced").await;
    assert_eq!(response.status, 502);
    assert!(response.text().contains("over the limit of 4096 bytes"));
    let streamed = h.get("http://big.test/streamed").await;
    assert_eq!(streamed.status, 200);
    assert!(streamed.body.is_err(), "the body should have been cut off");
}

#[tokio::test]
async fn a_slow_upstream_gets_a_504_and_never_hangs_the_sandbox() {
    let slow = Upstream::start(|seen| {
        let mut reply = Reply::ok(b"late".to_vec());
        if seen.uri.contains("head") {
            reply.delay = Duration::from_secs(3600);
        } else {
            reply.chunks = vec![b"a".to_vec(), b"b".to_vec()];
            reply.chunk_delay = Duration::from_secs(3600);
        }
        reply
    })
    .await;
    // The body's status line must come through before the limit: seconds, not the
    // 300 ms that a loaded machine could miss.
    let limits = ProxyLimits {
        total_timeout: Duration::from_secs(2),
        ..ProxyLimits::default()
    };
    let h = Harness::with(
        vec![rule("slow.test", &slow)],
        &["slow.test"],
        limits,
        false,
    );
    let answer = h.get("http://slow.test/head").await;
    assert_eq!(answer.status, 504, "{answer:?}");
    assert_eq!(answer.headers["x-nerve-proxy"], "error");
    let decision = h.sink.last();
    assert_eq!(decision.decision, ProxyVerdict::Allowed);
    assert!(
        decision
            .reason
            .unwrap()
            .contains("no answer from slow.test")
    );
    let body = h.get("http://slow.test/body").await;
    assert_eq!(body.status, 200);
    assert!(
        body.body.is_err(),
        "a body that never ends is cut off: {body:?}"
    );
}

#[tokio::test]
async fn a_dead_resolver_is_bounded_by_the_connect_timeout() {
    let good = Upstream::echo().await;
    let resolver = Arc::new(FakeResolver {
        hang: true,
        ..FakeResolver::default()
    });
    let limits = ProxyLimits {
        connect_timeout: Duration::from_millis(200),
        ..ProxyLimits::default()
    };
    let h = Harness::with_resolver(vec![rule("good.test", &good)], resolver, limits, false);
    let answer = h.get("http://good.test/").await;
    assert_eq!(answer.status, 504, "{answer:?}");
    assert_eq!(
        h.sink.last().reason.as_deref(),
        Some("resolving good.test timed out")
    );
    assert!(good.received().is_empty());
}

#[tokio::test]
async fn an_https_rule_never_falls_back_to_plain_http() {
    // The upstream speaks plain HTTP; the rule says TLS. The handshake fails (or, on a
    // machine without CA certificates, TLS cannot even be set up): 502, nothing sent.
    let plain = Upstream::echo().await;
    let h = Harness::new(
        vec![ProxyRule {
            upstream_scheme: UpstreamScheme::Https,
            ..credentialed("good.test", &plain)
        }],
        &["good.test"],
    );
    let answer = h.get("http://good.test/v1/x").await;
    assert_eq!(answer.status, 502, "{answer:?}");
    let reason = h.sink.last().reason.unwrap();
    assert!(reason.starts_with("TLS"), "{reason}");
    assert!(plain.received().is_empty(), "{:?}", plain.received());
    h.assert_events_clean();
}

#[tokio::test]
async fn compressed_answers_from_credentialed_hosts_are_refused() {
    let gzip = Upstream::start(|_| {
        let mut reply = Reply::ok(b"\x1f\x8b compressed".to_vec());
        reply
            .headers
            .push(("content-encoding".into(), "gzip".into()));
        reply
    })
    .await;
    let h = Harness::new(vec![credentialed("good.test", &gzip)], &["good.test"]);
    let answer = h.get("http://good.test/v1/x").await;
    assert_eq!(answer.status, 502);
    assert!(
        answer.text().contains("cannot be scrubbed"),
        "{}",
        answer.text()
    );
    assert_eq!(h.sink.last().decision, ProxyVerdict::Injected);
}

#[tokio::test]
async fn nothing_is_answered_unrecorded() {
    let good = Upstream::echo().await;
    let h = Harness::with(
        vec![credentialed("good.test", &good)],
        &["good.test"],
        ProxyLimits::default(),
        true,
    );
    let answer = h.get("http://good.test/v1/x").await;
    assert_eq!(answer.status, 503);
    answer.assert_clean();
    assert_eq!(h.get("http://evil.test/").await.status, 503);
}

// ---------------------------------------------------------------------------------------
// An upstream that reflects the credential wherever HTTP lets it write.

/// An upstream speaking raw HTTP/1.1, so that it can write what a well-behaved server never
/// would: it reads one request head and answers with `answer(authorization)`, where
/// `authorization` is the value of the `Authorization` header it received.
struct RawUpstream {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl RawUpstream {
    async fn start(answer: fn(&str) -> Vec<u8>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read_exact(&mut byte).await.is_err() {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let authorization = head
                        .lines()
                        .find_map(|line| {
                            let (name, value) = line.split_once(':')?;
                            name.eq_ignore_ascii_case("authorization")
                                .then(|| value.trim().to_owned())
                        })
                        .unwrap_or_default();
                    let _ = stream.write_all(&answer(&authorization)).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Self { port, task }
    }

    fn rule(&self, host: &str) -> ProxyRule {
        ProxyRule {
            methods: vec!["GET".into()],
            paths: vec!["/v1/".into()],
            credential: Some(credential()),
            upstream_scheme: UpstreamScheme::Http,
            upstream_port: Some(self.port),
            allow_private: true,
            ..ProxyRule::new(HostPattern::parse(host).unwrap())
        }
    }
}

/// Sends one GET through the proxy as raw bytes and returns the raw answer.
async fn raw_get(h: &Harness, path: &str) -> String {
    h.raw(
        format!("GET http://reflect.test{path} HTTP/1.1\r\nHost: reflect.test\r\nTE: trailers\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
}

#[tokio::test]
async fn the_status_line_carries_the_canonical_reason_never_the_upstreams() {
    for (answer, expected) in [
        (
            (|auth: &str| {
                format!("HTTP/1.1 200 {auth}\r\nContent-Length: 2\r\n\r\nok").into_bytes()
            }) as fn(&str) -> Vec<u8>,
            "HTTP/1.1 200 OK\r\n",
        ),
        (
            |auth: &str| format!("HTTP/1.1 404 {auth}\r\nContent-Length: 0\r\n\r\n").into_bytes(),
            "HTTP/1.1 404 Not Found\r\n",
        ),
        (
            |auth: &str| format!("HTTP/1.1 299 {auth}\r\nContent-Length: 0\r\n\r\n").into_bytes(),
            "HTTP/1.1 299 ",
        ),
    ] {
        let upstream = RawUpstream::start(answer).await;
        let h = Harness::new(vec![upstream.rule("reflect.test")], &["reflect.test"]);
        let raw = raw_get(&h, "/v1/x").await;
        assert!(raw.starts_with(expected), "{raw}");
        assert!(!raw.contains(CANARY), "{raw}");
        h.assert_events_clean();
    }
}

#[tokio::test]
async fn headers_trailers_and_bodies_are_scrubbed_of_every_form() {
    let upstream = RawUpstream::start(|auth| {
        let secret = auth.trim_start_matches("Bearer ");
        // JSON inside JSON (every form is tried in the scrubber's own tests; this token has
        // no character JSON escapes) and percent-encoding with lower-case hex.
        let twice = format!(r#""{{\"v\":\"{secret}\\\/\"}}""#);
        let lower = secret.replace('-', "%2d");
        format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trail\r\n\
             X-{secret}: named\r\nX-Lower: {lower}\r\nX-Plain: {auth}\r\n\r\n\
             {:x}\r\n{twice}\r\n0\r\nX-Trail: {auth}\r\n\r\n",
            twice.len()
        )
        .into_bytes()
    })
    .await;
    let h = Harness::new(vec![upstream.rule("reflect.test")], &["reflect.test"]);
    let raw = raw_get(&h, "/v1/x").await;
    assert!(raw.starts_with("HTTP/1.1 200 OK\r\n"), "{raw}");
    assert!(!raw.contains(CANARY), "{raw}");
    assert!(!raw.contains("canary%2d"), "{raw}");
    assert!(
        !raw.contains("named"),
        "the header named by the secret was kept: {raw}"
    );
    assert!(!raw.contains("X-Trail:"), "a trailer went through: {raw}");
    assert!(raw.contains("x-plain: Bearer [REDACTED:github]"), "{raw}");
    assert!(raw.contains("x-lower: [REDACTED:github]"), "{raw}");
    assert!(raw.contains(r#"{\"v\":\"[REDACTED:github]"#), "{raw}");
    h.assert_events_clean();
}

#[tokio::test]
async fn the_proxys_own_texts_name_upstream_values_and_never_quote_them() {
    let upstream = RawUpstream::start(|auth| {
        format!("HTTP/1.1 200 OK\r\nContent-Encoding: {auth}\r\nContent-Length: 2\r\n\r\nok")
            .into_bytes()
    })
    .await;
    let h = Harness::new(vec![upstream.rule("reflect.test")], &["reflect.test"]);
    let raw = raw_get(&h, "/v1/x").await;
    assert_eq!(status_of(&raw), 502, "{raw}");
    assert!(raw.contains("Content-Encoding is not identity"), "{raw}");
    assert!(!raw.contains(CANARY), "{raw}");
    assert!(!raw.contains("Bearer"), "{raw}");
    let reason = h.sink.last().reason.unwrap();
    assert!(!reason.contains("Bearer"), "{reason}");
    h.assert_events_clean();
}

// ---------------------------------------------------------------------------------------
// Tunnels.

#[tokio::test]
async fn connect_tunnels_only_to_allowlisted_hosts_without_credentials() {
    // A TCP echo server: what goes in comes back.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let echo = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    let good = Upstream::echo().await;
    let tunnel = ProxyRule {
        methods: vec!["CONNECT".into()],
        upstream_port: Some(port),
        allow_private: true,
        upstream_scheme: UpstreamScheme::Https,
        ..ProxyRule::new(HostPattern::parse("tunnel.test").unwrap())
    };
    let h = Harness::new(
        vec![tunnel, credentialed("good.test", &good)],
        &["tunnel.test", "good.test"],
    );
    let open = tokio::time::timeout(LIVENESS, async {
        let mut stream = UnixStream::connect(h.proxy.socket_path()).await.unwrap();
        stream
            .write_all(
                format!("CONNECT tunnel.test:{port} HTTP/1.1\r\nHost: tunnel.test:{port}\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        stream.write_all(b"opaque bytes").await.unwrap();
        let mut back = [0u8; 12];
        stream.read_exact(&mut back).await.unwrap();
        (back, stream)
    })
    .await
    .unwrap();
    let (echoed, mut tunnel) = open;
    assert_eq!(&echoed, b"opaque bytes");
    assert_eq!(h.sink.last().decision, ProxyVerdict::Allowed);
    for (target, status) in [
        (format!("good.test:{}", good.port), 403),
        ("evil.test:443".to_owned(), 403),
        (format!("tunnel.test:{}", port.wrapping_add(1)), 403),
    ] {
        let answer = h
            .raw(
                format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        assert_eq!(status_of(&answer), status, "{target}: {answer}");
    }
    // The refusal's reason is in the status line, which is what a client whose tunnel
    // failed prints (pip: "Tunnel connection failed: 403 denied by nerve: ...").
    let answer = h
        .raw(b"CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\nConnection: close\r\n\r\n")
        .await;
    assert!(
        answer.starts_with("HTTP/1.1 403 denied by nerve: no rule allows the host evil.test\r\n"),
        "{answer}"
    );
    // GET on a CONNECT-only rule is not allowed either.
    assert_eq!(
        h.get(&format!("http://tunnel.test:{port}/")).await.status,
        403
    );
    assert!(good.received().is_empty());
    // Stopping the proxy ends the tunnels it opened.
    drop(h);
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(LIVENESS, tunnel.read_to_end(&mut rest)).await;
    assert!(ended.is_ok(), "the tunnel outlived the proxy");
    echo.abort();
}
