//! Fuzz target for the auth proxy's request side (`cargo xtask fuzz proxy`): requests from
//! the sandbox, as bytes on the proxy's unix socket, cut into chunks at any place, go
//! through the real proxy (hyper's parsing, the request target, the host normalisation,
//! the percent-decoding of the path and the rule matching) to an upstream on 127.0.0.1
//! that records what reaches it. Requests mix valid ones with the tricks that make a proxy
//! and an upstream disagree: hosts in other spellings (case, trailing dot, numeric forms,
//! userinfo, IPv6, non-ASCII), paths with dot segments in any encoding, encoded slashes,
//! backslashes and control bytes, duplicate `Host` and length headers, huge numbers,
//! invalid UTF-8 and raw junk.
//!
//! Invariants: every exchange ends (an answer or a closed connection, within a liveness
//! bound); an answer's status line has the canonical reason phrase; whatever reaches the
//! upstream is allowed by the rules under an independent reading (its host is a rule's,
//! its method the rule's, its path, percent-decoded here, under an allowed prefix with no
//! dot segment); and the proxy still serves a plain allowed request afterwards. Host
//! patterns on their own: normalisation is idempotent and a wildcard covers exactly the
//! subdomains of its domain.
//!
//! `NERVE_FUZZ_STATS=1` (with `--nocapture`) prints each exchange's outcome: how the cases
//! spread over answers and how many reached the upstream.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stderr)]

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use nerve_core::ExecutionId;
use nerve_core::testing::DiscardSink;
use nerve_hands::proxy::{
    HostPattern, Proxy, ProxyConfig, ProxyRule, Resolve, UpstreamScheme, normalize_host,
};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixStream};

/// An exchange that takes longer than this hangs.
const LIVENESS: Duration = Duration::from_secs(60);

/// Every name is 127.0.0.1: only names a rule allowed are ever asked for.
struct Loopback;

#[async_trait]
impl Resolve for Loopback {
    async fn resolve(&self, _host: &str) -> io::Result<Vec<IpAddr>> {
        Ok(vec![IpAddr::from([127, 0, 0, 1])])
    }
}

/// What reached the upstream: the request line and the `Host` header.
#[derive(Debug, Clone)]
struct Reached {
    method: String,
    target: String,
    host: String,
}

/// A proxy with two rules in front of a recording upstream, on a runtime of its own that
/// lives as long as the test binary.
struct Bench {
    runtime: tokio::runtime::Runtime,
    proxy: Proxy,
    /// The upstream's port, which the rules allow (requests say `:PORT` for it).
    port: u16,
    reached: Arc<Mutex<Vec<Reached>>>,
}

fn bench() -> &'static Bench {
    static BENCH: OnceLock<Bench> = OnceLock::new();
    BENCH.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let reached = Arc::new(Mutex::new(Vec::new()));
        let (port, proxy) = runtime.block_on(async {
            let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = upstream.local_addr().unwrap().port();
            tokio::spawn(serve_upstream(upstream, Arc::clone(&reached)));
            let rule = |host: &str, methods: &[&str], paths: &[&str]| {
                let mut rule = ProxyRule::new(HostPattern::parse(host).unwrap());
                rule.methods = methods.iter().map(|m| (*m).to_owned()).collect();
                rule.paths = paths.iter().map(|p| (*p).to_owned()).collect();
                rule.upstream_scheme = UpstreamScheme::Http;
                rule.upstream_port = Some(port);
                rule.allow_private = true;
                rule
            };
            let mut config = ProxyConfig::new(vec![
                rule("api.fuzz.test", &["GET", "POST"], &["/allowed/", "/exact"]),
                rule("*.wild.test", &["GET"], &["/"]),
            ]);
            config.resolver = Arc::new(Loopback);
            // A request whose body never comes (a `content-length` larger than what was
            // sent) is answered when this runs out: short, so that such cases stay cheap.
            config.limits.total_timeout = Duration::from_secs(2);
            let proxy = Proxy::start(config, Arc::new(DiscardSink), ExecutionId::new()).unwrap();
            (port, proxy)
        });
        Bench {
            runtime,
            proxy,
            port,
            reached,
        }
    })
}

/// Answers every request with 200 and records its line and `Host`.
async fn serve_upstream(listener: TcpListener, reached: Arc<Mutex<Vec<Reached>>>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let reached = Arc::clone(&reached);
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buffer = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let text = String::from_utf8_lossy(&head).into_owned();
            let mut lines = text.split("\r\n");
            let mut line = lines.next().unwrap_or_default().split(' ');
            let method = line.next().unwrap_or_default().to_owned();
            let target = line.next().unwrap_or_default().to_owned();
            let host = lines
                .find_map(|l| {
                    l.split_once(':')
                        .filter(|(name, _)| name.eq_ignore_ascii_case("host"))
                        .map(|(_, value)| value.trim().to_owned())
                })
                .unwrap_or_default();
            reached.lock().unwrap().push(Reached {
                method,
                target,
                host,
            });
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\nupstream",
                )
                .await;
        });
    }
}

/// Percent-decodes a path the plain way; `None` for a malformed escape.
fn decode(path: &str) -> Option<Vec<u8>> {
    let bytes = path.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

/// Whether the rules, read independently of the proxy's code, allow what reached the
/// upstream.
fn allowed(reached: &Reached) -> Result<(), String> {
    let host = reached.host.split(':').next().unwrap_or_default();
    let (methods, prefixes): (&[&str], &[&str]) = if host == "api.fuzz.test" {
        (&["GET", "POST"], &["/allowed/", "/exact"])
    } else if host.ends_with(".wild.test") && host.len() > ".wild.test".len() {
        (&["GET"], &["/"])
    } else {
        return Err(format!("host {host} has no rule"));
    };
    if !methods.contains(&reached.method.as_str()) {
        return Err(format!("method {} is not allowed", reached.method));
    }
    let path = reached.target.split('?').next().unwrap_or_default();
    let encoded_slash = path.to_ascii_lowercase().contains("%2f");
    let decoded = decode(path).ok_or("a malformed escape")?;
    if encoded_slash || decoded.contains(&b'\\') || decoded.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(format!("a path the rules refuse: {path}"));
    }
    for segment in decoded.split(|&b| b == b'/') {
        let bare = segment.split(|&b| b == b';').next().unwrap_or(segment);
        if bare == b"." || bare == b".." {
            return Err(format!("a dot segment in {path}"));
        }
    }
    let under = prefixes.iter().any(|prefix| {
        let prefix = prefix.as_bytes();
        if prefix.ends_with(b"/") {
            decoded.starts_with(prefix)
        } else {
            decoded == prefix
                || (decoded.starts_with(prefix) && decoded.get(prefix.len()) == Some(&b'/'))
        }
    });
    if under {
        Ok(())
    } else {
        Err(format!("{path} is under no allowed prefix"))
    }
}

/// Sends `request` cut at `cuts`, reads what comes back until the connection closes.
/// `half_close`: shut the sending side once the request is sent (hyper then drops the
/// connection, answered or not); a request that says `connection: close` needs none.
async fn exchange(request: &[u8], cuts: &[usize], half_close: bool) -> Vec<u8> {
    let mut stream = UnixStream::connect(bench().proxy.socket_path())
        .await
        .unwrap();
    let mut at = 0;
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (request.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(request.len());
    for cut in cuts {
        if cut > at {
            // The proxy may answer and close before the request is all sent.
            if stream.write_all(&request[at..cut]).await.is_err() {
                break;
            }
            let _ = stream.flush().await;
            tokio::task::yield_now().await;
            at = cut;
        }
    }
    if half_close {
        let _ = stream.shutdown().await;
    }
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    answer
}

/// Runs one exchange and checks the invariants on it; returns the answer and what reached
/// the upstream. Exchanges run one at a time (the test threads share the upstream), so
/// that what reached it during one is that exchange's.
fn check(request: &[u8], cuts: &[usize], half_close: bool) -> (Vec<u8>, Vec<Reached>) {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let bench = bench();
    let request = &with_port(request, bench.port);
    let before = bench.reached.lock().unwrap().len();
    let answer = bench
        .runtime
        .block_on(async {
            tokio::time::timeout(LIVENESS, exchange(request, cuts, half_close)).await
        })
        .unwrap_or_else(|_| panic!("the proxy hung on {:?}", String::from_utf8_lossy(request)));
    if !answer.is_empty() {
        let text = String::from_utf8_lossy(&answer);
        let line = text.split("\r\n").next().unwrap_or_default();
        let mut parts = line.splitn(3, ' ');
        assert!(
            matches!(parts.next(), Some("HTTP/1.1" | "HTTP/1.0")),
            "{line}"
        );
        let code: u16 = parts
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        let reason = parts.next().unwrap_or_default();
        let canonical = http::StatusCode::from_u16(code)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or_default();
        // The proxy's own refusals name their reason in the status line (what pip and curl
        // print); everything else carries the canonical phrase, never an upstream's.
        let head = text.split("\r\n\r\n").next().unwrap_or_default();
        let own = head.lines().skip(1).any(|h| {
            h.split_once(':').is_some_and(|(name, value)| {
                name.eq_ignore_ascii_case("x-nerve-proxy")
                    && matches!(value.trim(), "denied" | "error")
            })
        });
        if own
            && (reason.starts_with("denied by nerve: ") || reason.starts_with("failed by nerve: "))
        {
            assert!(
                reason.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) && reason.len() <= 200,
                "{line}"
            );
        } else {
            assert_eq!(
                reason, canonical,
                "a reason phrase not the canonical one: {line}"
            );
        }
    }
    let reached: Vec<Reached> = bench.reached.lock().unwrap()[before..].to_vec();
    if std::env::var_os("NERVE_FUZZ_STATS").is_some() {
        let head = String::from_utf8_lossy(&answer);
        let body = head.split("\r\n\r\n").nth(1).unwrap_or_default();
        eprintln!(
            "stats: reached {} answer {:?} {body:?} request {:?}",
            reached.len(),
            head.lines().next().unwrap_or_default(),
            String::from_utf8_lossy(request)
                .lines()
                .next()
                .unwrap_or_default()
        );
    }
    for r in &reached {
        if let Err(why) = allowed(r) {
            panic!(
                "{why}: {r:?} reached the upstream from {:?}",
                String::from_utf8_lossy(request)
            );
        }
    }
    (answer, reached)
}

/// `request` with every `:PORT` replaced by `:port`.
fn with_port(request: &[u8], port: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(request.len());
    let mut rest = request;
    while !rest.is_empty() {
        if rest.starts_with(b":PORT") {
            out.extend_from_slice(format!(":{port}").as_bytes());
            rest = &rest[5..];
        } else {
            out.push(rest[0]);
            rest = &rest[1..];
        }
    }
    out
}

/// The proxy still serves a plain allowed request.
fn check_alive() {
    let (answer, reached) = check(
        b"GET http://api.fuzz.test:PORT/allowed/ok HTTP/1.1\r\nhost: api.fuzz.test:PORT\r\nconnection: close\r\n\r\n",
        &[],
        false,
    );
    assert_eq!(
        reached.len(),
        1,
        "a plain allowed request did not reach the upstream: {}",
        String::from_utf8_lossy(&answer)
    );
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        12 => Just("api.fuzz.test".to_owned()),
        6 => Just("a.wild.test".to_owned()),
        1 => Just("api.fuzz.test".to_owned()),
        1 => Just("API.Fuzz.TEST.".to_owned()),
        1 => Just("api.fuzz.test..".to_owned()),
        1 => Just("a.wild.test".to_owned()),
        1 => Just("a.b.WILD.test".to_owned()),
        1 => Just("wild.test".to_owned()),
        1 => Just(".wild.test".to_owned()),
        1 => Just("evilwild.test".to_owned()),
        1 => Just("api.fuzz.test.evil.test".to_owned()),
        1 => Just("evil.test".to_owned()),
        1 => Just("api.fuzz.test%2e".to_owned()),
        1 => Just("api%2efuzz.test".to_owned()),
        1 => Just("user@api.fuzz.test".to_owned()),
        1 => Just("api.fuzz.test@evil.test".to_owned()),
        1 => Just("127.0.0.1".to_owned()),
        1 => Just("127.1".to_owned()),
        1 => Just("0x7f.1".to_owned()),
        1 => Just("2130706433".to_owned()),
        1 => Just("[::1]".to_owned()),
        1 => Just("[::ffff:127.0.0.1]".to_owned()),
        1 => Just("äpi.fuzz.test".to_owned()),
        1 => Just("api.fuzz.test\u{0}".to_owned()),
        1 => "[a-z.]{0,12}(\\.wild\\.test)?",
    ]
}

fn port() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => Just(":PORT".to_owned()),
        1 => Just(String::new()),
        1 => Just(":80".to_owned()),
        1 => Just(":".to_owned()),
        1 => Just(":0".to_owned()),
        1 => Just(":65536".to_owned()),
        1 => Just(":99999999999999999999".to_owned()),
        1 => Just(":-1".to_owned()),
        1 => any::<u16>().prop_map(|p| format!(":{p}")),
    ]
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("allowed".to_owned()),
        Just("exact".to_owned()),
        Just("..".to_owned()),
        Just(".".to_owned()),
        Just("%2e%2e".to_owned()),
        Just("%2E.".to_owned()),
        Just("..;x".to_owned()),
        Just("%2f".to_owned()),
        Just("%2F..".to_owned()),
        Just("%252e%252e".to_owned()),
        Just("%5c".to_owned()),
        Just("\\".to_owned()),
        Just("%00".to_owned()),
        Just("%0a".to_owned()),
        Just("%".to_owned()),
        Just("%g1".to_owned()),
        Just("%e2%82%ac".to_owned()),
        Just("%ff%fe".to_owned()),
        Just("admin".to_owned()),
        Just(String::new()),
        "[a-z0-9%.;~-]{0,8}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just(vec!["allowed".to_owned()]), Just(Vec::new())],
        prop::collection::vec(segment(), 0..6),
        prop_oneof![
            Just(String::new()),
            Just("?q=..%2f".to_owned()),
            Just("#frag".to_owned())
        ],
    )
        .prop_map(|(mut head, segments, tail)| {
            head.extend(segments);
            format!("/{}{tail}", head.join("/"))
        })
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("GET".to_owned()),
        1 => Just("POST".to_owned()),
        1 => Just("HEAD".to_owned()),
        1 => Just("DELETE".to_owned()),
        1 => Just("get".to_owned()),
        1 => Just("CONNECT".to_owned()),
        1 => Just("G\u{0}T".to_owned()),
        1 => "[A-Z]{1,8}",
    ]
}

fn header() -> impl Strategy<Value = String> {
    prop_oneof![
        host().prop_map(|h| format!("host: {h}:PORT\r\n")),
        Just("content-length: 5\r\n".to_owned()),
        Just("content-length: 5\r\ncontent-length: 6\r\n".to_owned()),
        Just("content-length: 18446744073709551616\r\n".to_owned()),
        Just("content-length: -1\r\n".to_owned()),
        Just("transfer-encoding: chunked\r\n".to_owned()),
        Just("transfer-encoding: gzip, chunked\r\n".to_owned()),
        Just("connection: upgrade\r\nupgrade: websocket\r\n".to_owned()),
        Just("authorization: Bearer sandbox\r\n".to_owned()),
        Just("x-folded: a\r\n b\r\n".to_owned()),
        Just("bad header\r\n".to_owned()),
        "[a-z-]{1,10}: [ -~]{0,20}\r\n",
    ]
}

/// A request: mostly well formed, in the three target forms, sometimes junk.
/// The bool: whether the request asks the proxy to close after answering (then the
/// client waits for that); otherwise the client half-closes once it sent the request.
fn request() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let formed = (
        method(),
        0..3usize,
        host(),
        port(),
        path(),
        prop::collection::vec(header(), 0..3),
        prop_oneof![Just(String::new()), Just("hello".to_owned()), Just("5\r\nhello\r\n0\r\n\r\n".to_owned())],
        prop_oneof![6 => Just("HTTP/1.1"), 1 => Just("HTTP/1.0"), 1 => Just("HTTP/2.0"), 1 => Just("HTTP/1.1 x")],
        any::<bool>(),
    )
        .prop_map(|(method, form, host, port, path, headers, body, version, close)| {
            let target = match form {
                0 => format!("http://{host}{port}{path}"),
                1 => path,
                _ => format!("{host}{port}"),
            };
            let mut text = format!("{method} {target} {version}\r\n");
            if form == 1 {
                text.push_str(&format!("host: {host}{port}\r\n"));
            }
            text.push_str(&headers.concat());
            if close {
                text.push_str("connection: close\r\n");
            }
            text.push_str("\r\n");
            text.push_str(&body);
            (text.into_bytes(), close)
        });
    prop_oneof![
        8 => formed,
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(|junk| (junk, false)),
        1 => (prop::collection::vec(any::<u8>(), 0..64)).prop_map(|junk| {
            let mut bytes = b"GET http://api.fuzz.test:PORT/allowed/".to_vec();
            bytes.extend(junk);
            bytes.extend_from_slice(b" HTTP/1.1\r\nhost: api.fuzz.test:PORT\r\nconnection: close\r\n\r\n");
            (bytes, true)
        }),
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(256),
        ..ProptestConfig::default()
    }
}

#[test]
fn a_plain_allowed_request_reaches_the_upstream() {
    check_alive();
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn only_what_the_rules_allow_reaches_the_upstream(
        (request, close) in request(),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
        probe in any::<u8>(),
    ) {
        check(&request, &cuts, !close);
        // Now and then, that the proxy still serves (each probe is a full exchange).
        if probe < 8 {
            check_alive();
        }
    }

    #[test]
    fn host_normalisation_is_idempotent(raw in prop_oneof![host(), any::<String>(), "[a-zA-Z0-9.:\\[\\]_-]{0,30}"]) {
        if let Ok(normal) = normalize_host(&raw) {
            prop_assert_eq!(normalize_host(&normal), Ok(normal.clone()));
            // And a pattern of it names exactly it.
            let pattern = HostPattern::parse(&normal).unwrap();
            prop_assert!(pattern.is_exact());
            prop_assert_eq!(pattern.to_string(), normal);
        }
    }

    #[test]
    fn a_wildcard_rule_covers_its_subdomains_and_nothing_else(label in "[a-z0-9_]([a-z0-9-]{0,6}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}", upper in any::<bool>()) {
        let reaches = |host: &str| {
            let request = format!("GET http://{host}:PORT/x HTTP/1.1\r\nhost: {host}:PORT\r\nconnection: close\r\n\r\n");
            !check(request.as_bytes(), &[], false).1.is_empty()
        };
        let sub = format!("{label}.wild.test");
        let sub = if upper { sub.to_ascii_uppercase() } else { sub };
        prop_assert!(reaches(&sub), "{} is a subdomain of wild.test", sub);
        let glued = format!("{label}wild.test");
        let after = format!("wild.test.{label}");
        prop_assert!(!reaches(&glued), "{}", glued);
        prop_assert!(!reaches(&after), "{}", after);
    }
}
