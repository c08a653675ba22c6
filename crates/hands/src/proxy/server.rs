//! The proxy's request path: decide, record, forward, scrub.
//!
//! Every request is judged before anything leaves the host: the target is parsed and
//! normalised, a rule must allow its host, port, method and path, and only then is the host
//! name resolved and every address it resolves to checked. The decision is recorded in the
//! event log before the sandbox sees the answer, so no response reaches the sandbox
//! unrecorded (a failing log turns the request into a 503).
//!
//! Requests are re-framed, never passed through: the body is read whole (up to the cap),
//! hop-by-hop headers are dropped, and the proxy writes its own `Host`, `Content-Length`
//! and `Accept-Encoding: identity` (a compressed body could not be scrubbed). Upstream
//! connections are fresh for each request: nothing of one request can leak into another's.

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use nerve_core::event::{ProxyDecision, ProxyVerdict};
use nerve_core::{Event, EventSink, ExecutionId};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use crate::proxy::resolve::non_global_reason;
use crate::proxy::rules::{
    ProxyConfig, ProxyRule, decode_path, is_credential_header, is_hop_by_hop, literal_address,
};
use crate::proxy::scrub::{Scrubber, StreamScrubber};
use crate::proxy::target::{self, Target, printable};

/// What the proxy answers with.
pub(crate) type ProxyBody = BoxBody<Bytes, io::Error>;

/// The header on every answer the proxy writes itself (refusals and failures), so that a
/// client can tell them from the upstream's.
pub const PROXY_HEADER: &str = "x-nerve-proxy";

/// State shared by every connection of one proxy.
pub(crate) struct Shared {
    pub(crate) config: ProxyConfig,
    pub(crate) scrubber: Scrubber,
    pub(crate) sink: Arc<dyn EventSink>,
    pub(crate) execution: ExecutionId,
    /// Built on the first HTTPS upstream: a machine without CA certificates can still run
    /// a proxy whose rules are all plain HTTP.
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
    /// Set when the proxy stops: tunnels, which outlive their connection's task, end too.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn new(
        config: ProxyConfig,
        sink: Arc<dyn EventSink>,
        execution: ExecutionId,
    ) -> Self {
        let scrubber = Scrubber::new(config.rules.iter().filter_map(|r| r.credential.as_ref()));
        Self {
            config,
            scrubber,
            sink,
            execution,
            tls: OnceLock::new(),
            closing: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Ends every tunnel.
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    fn tls(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls
            .get_or_init(|| {
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let builder = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?;
                let mut config =
                    rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(builder)
                        .map_err(|e| format!("no usable CA certificates: {e}"))?
                        .with_no_client_auth();
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Ok(Arc::new(config))
            })
            .clone()
    }

    async fn record(
        &self,
        what: &Seen,
        decision: ProxyVerdict,
        status: Option<u16>,
        credential: Option<&str>,
        reason: Option<String>,
    ) -> bool {
        let event = Event::ProxyDecision(ProxyDecision {
            host: what.host.clone(),
            method: what.method.clone(),
            path: what.path.clone(),
            decision,
            status,
            credential: credential.map(str::to_owned),
            reason,
        });
        match self.sink.append(self.execution, event).await {
            Ok(_) => true,
            Err(error) => {
                tracing::error!(%error, "cannot record a proxy decision; the request is refused");
                false
            }
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("execution", &self.execution)
            .finish_non_exhaustive()
    }
}

/// Accepts connections until the task is aborted; each connection is served on its own
/// task, aborted with this one.
pub(crate) async fn serve(listener: UnixListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    // Ends: never by itself: the accept loop lives as long as the sandbox and is aborted
    // with its task (each connection has its own time limits).
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                Err(error) => {
                    // Out of descriptors, most likely: back off instead of spinning.
                    tracing::warn!(%error, "the proxy cannot accept a connection");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: UnixStream, shared: Arc<Shared>) {
    let limits = shared.config.limits.clone();
    let service = service_fn(move |request| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, Infallible>(handle(shared, request).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper's floor is 8 KiB.
        .max_buf_size(limits.max_header_bytes.max(8192));
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    if let Err(error) = connection.await {
        tracing::debug!(%error, "a proxy connection ended with an error");
    }
}

/// What the event says about the request.
#[derive(Debug)]
struct Seen {
    host: String,
    method: String,
    path: String,
}

/// Why a request got no upstream answer.
#[derive(Debug)]
struct Failure {
    status: StatusCode,
    reason: String,
    /// `Denied` when the policy refused it; the rule's verdict when the upstream failed.
    verdict: ProxyVerdict,
}

impl Failure {
    fn denied(status: StatusCode, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            verdict: ProxyVerdict::Denied,
        }
    }
}

/// A request the policy allowed, about to be forwarded.
struct Route<'a> {
    rule: &'a ProxyRule,
    target: Target,
    addresses: Vec<IpAddr>,
}

async fn handle(shared: Arc<Shared>, mut request: Request<Incoming>) -> Response<ProxyBody> {
    let deadline = Instant::now() + shared.config.limits.total_timeout;
    let on_upgrade =
        (request.method() == Method::CONNECT).then(|| hyper::upgrade::on(&mut request));
    let (parts, body) = request.into_parts();
    let mut seen = Seen {
        host: printable(
            parts
                .uri
                .host()
                .or_else(|| {
                    parts
                        .headers
                        .get(header::HOST)
                        .and_then(|h| h.to_str().ok())
                })
                .unwrap_or_default(),
        ),
        method: printable(parts.method.as_str()),
        path: printable(parts.uri.path()),
    };
    let route = match route(&shared, &parts, &mut seen).await {
        Ok(route) => route,
        Err(failure) => return fail(&shared, &seen, failure, None).await,
    };
    let credential = route.rule.credential.as_ref().map(|c| c.name.clone());
    let verdict = if credential.is_some() {
        ProxyVerdict::Injected
    } else {
        ProxyVerdict::Allowed
    };
    let result = match on_upgrade {
        Some(on_upgrade) => tunnel(&shared, route, on_upgrade, deadline).await,
        None => forward(&shared, route, parts, body, deadline).await,
    };
    match result {
        Ok(response) => {
            let status = response.status().as_u16();
            if shared
                .record(&seen, verdict, Some(status), credential.as_deref(), None)
                .await
            {
                response
            } else {
                refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the decision could not be recorded",
                )
            }
        }
        Err((status, reason)) => {
            let failure = Failure {
                status,
                reason,
                verdict,
            };
            fail(&shared, &seen, failure, credential.as_deref()).await
        }
    }
}

/// Records a refusal or an upstream failure and answers it.
async fn fail(
    shared: &Shared,
    seen: &Seen,
    failure: Failure,
    credential: Option<&str>,
) -> Response<ProxyBody> {
    // A reason may carry an upstream's words (a TLS error naming what its certificate
    // presents): whatever form of a secret it holds is scrubbed before it is recorded or
    // answered.
    let failure = Failure {
        reason: shared.scrubber.scrub_text(&failure.reason),
        ..failure
    };
    tracing::debug!(host = %seen.host, reason = %failure.reason, "proxy refusal or failure");
    let recorded = shared
        .record(
            seen,
            failure.verdict,
            None,
            credential,
            Some(failure.reason.clone()),
        )
        .await;
    if recorded {
        refusal(failure.status, &failure.reason)
    } else {
        refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the decision could not be recorded",
        )
    }
}

/// Applies the policy. Nothing is resolved before a rule allowed the host, port, method
/// and path.
async fn route<'a>(
    shared: &'a Shared,
    parts: &http::request::Parts,
    seen: &mut Seen,
) -> Result<Route<'a>, Failure> {
    let target =
        target::parse(parts).map_err(|reason| Failure::denied(StatusCode::BAD_REQUEST, reason))?;
    seen.host = target.host.clone();
    seen.path = printable(&target.path);
    let forbidden = |reason: String| Failure::denied(StatusCode::FORBIDDEN, reason);
    let rule = shared
        .config
        .rule_for(&target.host)
        .ok_or_else(|| forbidden(format!("no rule allows the host {}", target.host)))?;
    if parts.method == Method::CONNECT {
        if !rule.allows_connect() {
            return Err(forbidden(format!(
                "CONNECT is not allowed to {}",
                target.host
            )));
        }
        if target.port != Some(rule.port()) {
            return Err(forbidden(format!(
                "port {} is not allowed for {} (the rule allows {})",
                target.port.unwrap_or_default(),
                target.host,
                rule.port()
            )));
        }
    } else {
        if let Some(port) = target.port
            && port != rule.port()
            && port != target.default_port
        {
            return Err(forbidden(format!(
                "port {port} is not allowed for {} (the rule allows {})",
                target.host,
                rule.port()
            )));
        }
        if !rule.allows_method(parts.method.as_str()) {
            return Err(forbidden(format!(
                "the method {} is not allowed for {}",
                printable(parts.method.as_str()),
                target.host
            )));
        }
        let decoded = decode_path(&target.path)
            .map_err(|problem| Failure::denied(StatusCode::BAD_REQUEST, problem))?;
        if !rule.allows_path(&decoded) {
            return Err(forbidden(format!(
                "the path {} is not allowed for {}",
                printable(&target.path),
                target.host
            )));
        }
        if let Some(length) = content_length(&parts.headers)
            && length > shared.config.limits.max_request_body_bytes
        {
            return Err(Failure::denied(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body ({length} bytes) is over the limit of {} bytes",
                    shared.config.limits.max_request_body_bytes
                ),
            ));
        }
    }
    let addresses = resolve(shared, rule, &target.host).await?;
    Ok(Route {
        rule,
        target,
        addresses,
    })
}

/// Resolves an allowed host and checks every address; refuses the whole name when one
/// address is not global and the rule does not allow private addresses.
async fn resolve(shared: &Shared, rule: &ProxyRule, host: &str) -> Result<Vec<IpAddr>, Failure> {
    let addresses = match literal_address(host) {
        Some(address) => vec![address],
        None => {
            let lookup = shared.config.resolver.resolve(host);
            match tokio::time::timeout(shared.config.limits.connect_timeout, lookup).await {
                Ok(Ok(addresses)) if !addresses.is_empty() => addresses,
                Ok(Ok(_)) => {
                    return Err(upstream_failure(
                        StatusCode::BAD_GATEWAY,
                        format!("{host} has no address"),
                    ));
                }
                Ok(Err(error)) => {
                    return Err(upstream_failure(
                        StatusCode::BAD_GATEWAY,
                        format!("cannot resolve {host}: {error}"),
                    ));
                }
                Err(_) => {
                    return Err(upstream_failure(
                        StatusCode::GATEWAY_TIMEOUT,
                        format!("resolving {host} timed out"),
                    ));
                }
            }
        }
    };
    if !rule.allow_private {
        for address in &addresses {
            if let Some(reason) = non_global_reason(*address) {
                return Err(Failure::denied(
                    StatusCode::FORBIDDEN,
                    format!(
                        "{host} resolves to {reason} ({address}); a rule must set allow_private to reach it"
                    ),
                ));
            }
        }
    }
    Ok(addresses)
}

/// A failure after the policy allowed the request; [`handle`] fills in the verdict.
fn upstream_failure(status: StatusCode, reason: String) -> Failure {
    Failure {
        status,
        reason,
        verdict: ProxyVerdict::Allowed,
    }
}

type Upstream = Result<Response<ProxyBody>, (StatusCode, String)>;

/// Any byte stream to an upstream, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

async fn connect(addresses: &[IpAddr], port: u16) -> io::Result<TcpStream> {
    let mut last = None;
    for address in addresses {
        match TcpStream::connect(SocketAddr::new(*address, port)).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no address to connect to")))
}

/// Connects to the upstream (TLS when the rule says so) within the connect timeout.
async fn open(shared: &Shared, route: &Route<'_>) -> Result<Box<dyn Io>, (StatusCode, String)> {
    let host = &route.target.host;
    let port = route.rule.port();
    let opening = async {
        let tcp = connect(&route.addresses, port).await.map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!("cannot connect to {host}:{port}: {e}"),
            )
        })?;
        match route.rule.upstream_scheme {
            crate::proxy::rules::UpstreamScheme::Http => Ok(Box::new(tcp) as Box<dyn Io>),
            crate::proxy::rules::UpstreamScheme::Https => {
                let tls = shared
                    .tls()
                    .map_err(|e| (StatusCode::BAD_GATEWAY, format!("TLS: {e}")))?;
                let name = match literal_address(host) {
                    Some(address) => rustls::pki_types::ServerName::IpAddress(address.into()),
                    None => rustls::pki_types::ServerName::try_from(host.clone())
                        .map_err(|e| (StatusCode::BAD_GATEWAY, format!("TLS name {host}: {e}")))?,
                };
                let stream = tokio_rustls::TlsConnector::from(tls)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| (StatusCode::BAD_GATEWAY, tls_failure(host, &e)))?;
                Ok(Box::new(stream) as Box<dyn Io>)
            }
        }
    };
    match tokio::time::timeout(shared.config.limits.connect_timeout, opening).await {
        Ok(result) => result,
        Err(_) => Err((
            StatusCode::GATEWAY_TIMEOUT,
            format!("connecting to {host}:{port} timed out"),
        )),
    }
}

async fn forward(
    shared: &Shared,
    route: Route<'_>,
    parts: http::request::Parts,
    body: Incoming,
    deadline: Instant,
) -> Upstream {
    let limits = &shared.config.limits;
    let timed_out = || {
        (
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "no answer from {} within {:?}",
                route.target.host, limits.total_timeout
            ),
        )
    };
    let max_body = usize::try_from(limits.max_request_body_bytes).unwrap_or(usize::MAX);
    let body = match tokio::time::timeout_at(deadline, Limited::new(body, max_body).collect()).await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(error)) => {
            return Err(
                if error
                    .downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("the request body is over the limit of {max_body} bytes"),
                    )
                } else {
                    (
                        StatusCode::BAD_REQUEST,
                        format!("cannot read the request body: {error}"),
                    )
                },
            );
        }
        Err(_) => return Err(timed_out()),
    };
    let request = upstream_request(&route, &parts, body)?;
    let io = match tokio::time::timeout_at(deadline, open(shared, &route)).await {
        Ok(io) => io?,
        Err(_) => return Err(timed_out()),
    };
    let exchange = async {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| {
                (
                    StatusCode::BAD_GATEWAY,
                    format!("HTTP with {}: {e}", route.target.host),
                )
            })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "an upstream connection ended with an error");
            }
        });
        sender.send_request(request).await.map_err(|e| {
            (
                StatusCode::BAD_GATEWAY,
                format!("no answer from {}: {e}", route.target.host),
            )
        })
    };
    let response = match tokio::time::timeout_at(deadline, exchange).await {
        Ok(response) => response?,
        Err(_) => return Err(timed_out()),
    };
    respond(shared, &route, &parts.method, response, deadline)
}

/// The request as the upstream gets it: origin-form, the proxy's own framing and `Host`,
/// the sandbox's credential headers replaced by the rule's when it has one.
fn upstream_request(
    route: &Route<'_>,
    parts: &http::request::Parts,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, (StatusCode, String)> {
    let rule = route.rule;
    let credential = rule.credential.as_ref();
    let injected_name = credential.and_then(|c| HeaderName::from_bytes(c.header.as_bytes()).ok());
    let named_by_connection = connection_tokens(&parts.headers);
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        let dropped = is_hop_by_hop(name)
            || named_by_connection.contains(name)
            || *name == header::HOST
            || *name == header::ACCEPT_ENCODING
            || *name == header::EXPECT
            || (credential.is_some()
                && (is_credential_header(name) || Some(name) == injected_name.as_ref()));
        if !dropped {
            headers.append(name.clone(), value.clone());
        }
    }
    let port = rule.port();
    let authority = if port == rule.upstream_scheme.default_port() {
        route.target.host.clone()
    } else {
        format!("{}:{port}", route.target.host)
    };
    let host = HeaderValue::from_str(&authority)
        .map_err(|_| (StatusCode::BAD_REQUEST, "an invalid host".to_owned()))?;
    headers.insert(header::HOST, host);
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    let expects_body = [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method);
    if !body.is_empty() || expects_body {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
    }
    if let (Some(credential), Some(name)) = (credential, injected_name) {
        let value = credential.header_value().ok_or((
            StatusCode::INTERNAL_SERVER_ERROR,
            "the credential cannot be sent".to_owned(),
        ))?;
        headers.insert(name, value);
    }
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(route.target.path_and_query.as_str())
        .body(Full::new(body))
        .map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("cannot forward the request: {e}"),
            )
        })?;
    *request.headers_mut() = headers;
    Ok(request)
}

/// Header names listed in `Connection`: hop-by-hop for this message.
fn connection_tokens(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect()
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The upstream's answer as the sandbox gets it: redirects passed back as they are (never
/// followed), hop-by-hop headers dropped, secrets scrubbed from headers and body, the body
/// capped and cut off at the deadline.
fn respond(
    shared: &Shared,
    route: &Route<'_>,
    method: &Method,
    response: Response<Incoming>,
    deadline: Instant,
) -> Upstream {
    let limits = &shared.config.limits;
    let (mut head, body) = response.into_parts();
    if route.rule.credential.is_some()
        && let Some(encoding) = head.headers.get(header::CONTENT_ENCODING)
        && !encoding.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        // The header's value is the upstream's to choose: named, never quoted.
        return Err((
            StatusCode::BAD_GATEWAY,
            format!(
                "{} answered with a compressed body (its Content-Encoding is not identity), which cannot be scrubbed",
                route.target.host,
            ),
        ));
    }
    if let Some(length) = content_length(&head.headers)
        && length > limits.max_response_body_bytes
    {
        return Err((
            StatusCode::BAD_GATEWAY,
            format!(
                "the response body ({length} bytes) is over the limit of {} bytes",
                limits.max_response_body_bytes
            ),
        ));
    }
    let named_by_connection = connection_tokens(&head.headers);
    let bodiless = *method == Method::HEAD
        || head.status == StatusCode::NO_CONTENT
        || head.status == StatusCode::NOT_MODIFIED
        || head.status.is_informational();
    let mut headers = HeaderMap::new();
    for (name, value) in &head.headers {
        // A header whose name holds a secret is dropped: a name cannot be rewritten into
        // another valid one without changing what it means.
        if (is_hop_by_hop(name) && !(bodiless && *name == header::CONTENT_LENGTH))
            || named_by_connection.contains(name)
            || shared.scrubber.scrub(name.as_str().as_bytes()).is_some()
        {
            continue;
        }
        let value = match shared.scrubber.scrub(value.as_bytes()) {
            Some(scrubbed) => match HeaderValue::from_bytes(&scrubbed) {
                Ok(value) => value,
                Err(_) => continue,
            },
            None => value.clone(),
        };
        headers.append(name.clone(), value);
    }
    // Without secrets to scrub, the length is known and kept.
    if !bodiless
        && !shared.scrubber.is_active()
        && let Some(length) = head.headers.get(header::CONTENT_LENGTH)
    {
        headers.insert(header::CONTENT_LENGTH, length.clone());
    }
    head.headers = headers;
    // The status line's reason phrase is the upstream's text (hyper keeps a non-canonical
    // one in the extensions and writes it back out): dropping the extensions makes the
    // sandbox see the canonical phrase for the code. Nothing else of the upstream's is
    // carried there either.
    head.extensions = http::Extensions::new();
    let body = ScrubbedBody {
        inner: body,
        scrubber: shared.scrubber.stream(),
        seen: 0,
        cap: limits.max_response_body_bytes,
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        done: false,
    };
    Ok(Response::from_parts(head, BoxBody::new(body)))
}

/// Opens a tunnel for CONNECT: the upstream is reached before the sandbox gets its 200, and
/// the tunnel lives until either side closes it or the total timeout passes.
async fn tunnel(
    shared: &Shared,
    route: Route<'_>,
    on_upgrade: hyper::upgrade::OnUpgrade,
    deadline: Instant,
) -> Upstream {
    let host = route.target.host.clone();
    let port = route.rule.port();
    let opening = connect(&route.addresses, port);
    let mut upstream =
        match tokio::time::timeout(shared.config.limits.connect_timeout, opening).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err((
                    StatusCode::BAD_GATEWAY,
                    format!("cannot connect to {host}:{port}: {e}"),
                ));
            }
            Err(_) => {
                return Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("connecting to {host}:{port} timed out"),
                ));
            }
        };
    let mut closing = shared.closing.subscribe();
    tokio::spawn(async move {
        let relay = async {
            let upgraded = on_upgrade.await.map_err(io::Error::other)?;
            let mut upgraded = TokioIo::new(upgraded);
            tokio::io::copy_bidirectional(&mut upgraded, &mut upstream).await
        };
        tokio::select! {
            ended = tokio::time::timeout_at(deadline, relay) => match ended {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => tracing::debug!(%error, %host, "a tunnel ended with an error"),
                Err(_) => tracing::debug!(%host, "a tunnel reached the total timeout"),
            },
            _ = closing.wait_for(|closing| *closing) => {}
        }
    });
    Ok(Response::new(empty()))
}

/// Why a TLS handshake failed, in words of ours: a certificate error's text would quote the
/// names the upstream's certificate presents.
fn tls_failure(host: &str, error: &io::Error) -> String {
    use rustls::CertificateError;
    let rustls = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls {
        Some(rustls::Error::InvalidCertificate(problem)) => {
            // rustls's enum is non-exhaustive and most of its kinds need no words of their own.
            #[allow(clippy::wildcard_enum_match_arm)]
            let why = match problem {
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => "is not valid for that name",
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "has expired"
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "is not valid yet"
                }
                CertificateError::UnknownIssuer => "is issued by an unknown authority",
                CertificateError::Revoked => "is revoked",
                _ => "was rejected",
            };
            format!("TLS with {host}: its certificate {why}")
        }
        Some(other) => format!("TLS with {host}: {other}"),
        None => format!("TLS with {host}: {error}"),
    }
}

fn empty() -> ProxyBody {
    BoxBody::new(Full::new(Bytes::new()).map_err(|never| match never {}))
}

/// The proxy's own answer: `nerve proxy: <reason>` as text.
fn refusal(status: StatusCode, reason: &str) -> Response<ProxyBody> {
    let kind = if status == StatusCode::FORBIDDEN || status.is_client_error() {
        "denied"
    } else {
        "error"
    };
    let text = format!("nerve proxy: {kind}: {reason}\n");
    let mut response = Response::new(BoxBody::new(
        Full::new(Bytes::from(text)).map_err(|never| match never {}),
    ));
    *response.status_mut() = status;
    // The status line carries the reason too (`403 denied by nerve: no rule allows the host
    // pypi.org`): a CONNECT refusal's body is never read by clients, but pip, npm, cargo
    // and curl print the status line of a failed tunnel or request.
    if let Ok(phrase) = hyper::ext::ReasonPhrase::try_from(reason_phrase(kind, reason)) {
        response.extensions_mut().insert(phrase);
    }
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert(PROXY_HEADER, HeaderValue::from_static(kind));
    response
}

/// `denied by nerve: REASON` as an HTTP/1 reason phrase: visible ASCII and spaces only,
/// at most 200 bytes.
fn reason_phrase(kind: &str, reason: &str) -> Vec<u8> {
    let verb = if kind == "denied" { "denied" } else { "failed" };
    let text = format!("{verb} by nerve: {reason}");
    let mut phrase: Vec<u8> = text
        .bytes()
        .map(|b| {
            if b == b' ' || b.is_ascii_graphic() {
                b
            } else {
                b'?'
            }
        })
        .collect();
    phrase.truncate(200);
    phrase
}

/// A response body on its way to the sandbox: scrubbed as it streams, capped, and cut off
/// at the request's deadline.
struct ScrubbedBody {
    inner: Incoming,
    scrubber: StreamScrubber,
    seen: u64,
    cap: u64,
    deadline: Pin<Box<Sleep>>,
    done: bool,
}

impl Body for ScrubbedBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if this.deadline.as_mut().poll(cx).is_ready() {
                this.done = true;
                return Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the response body was cut off at the proxy's total timeout",
                ))));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    let tail = this.scrubber.finish();
                    return Poll::Ready((!tail.is_empty()).then(|| Ok(Frame::data(tail))));
                }
                Poll::Ready(Some(Err(error))) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(io::Error::other(error))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped: they could carry what the body may not.
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    this.seen += data.len() as u64;
                    if this.seen > this.cap {
                        this.done = true;
                        return Poll::Ready(Some(Err(io::Error::other(format!(
                            "the response body is over the limit of {} bytes",
                            this.cap
                        )))));
                    }
                    let out = this.scrubber.push(&data);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_failures_never_quote_the_certificate() {
        let expected = rustls::pki_types::ServerName::try_from("good.test")
            .unwrap()
            .to_owned();
        let error = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected,
                presented: vec!["canary-presented-name".to_owned()],
            }),
        );
        let text = tls_failure("good.test", &error);
        assert_eq!(
            text,
            "TLS with good.test: its certificate is not valid for that name"
        );
        let other = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        assert_eq!(
            tls_failure("good.test", &other),
            "TLS with good.test: reset by peer"
        );
    }
}
