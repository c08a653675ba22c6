//! HTTP plumbing both API clients share: a reqwest client on rustls with the *ring*
//! provider, timeouts, and the mapping of every way a call can fail (status codes,
//! Retry-After, error bodies, broken connections) onto [`ProviderError`].

use nerve_core::event::ModelErrorKind;
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use tokio::time::{Instant, Sleep};

use crate::provider::model_call::ProviderError;
use crate::provider::stream::ByteSource;

/// Timeouts and transport choices of a provider's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Establishing the TCP and TLS connection.
    pub connect_timeout: Duration,
    /// A whole non-streaming call, answer included. Streams are bounded by `idle_timeout`
    /// instead, so a long answer that keeps flowing is never cut.
    pub request_timeout: Duration,
    /// The longest silence while waiting for a stream's bytes (headers or body), and
    /// while reading a whole answer's body once its headers came.
    pub idle_timeout: Duration,
    /// Honour `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` from the environment.
    pub proxy_from_env: bool,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(600),
            // Reasoning models can think for minutes before their first byte.
            idle_timeout: Duration::from_secs(300),
            proxy_from_env: true,
        }
    }
}

/// A provider client that cannot be built. Returned by the constructors; not retryable:
/// the configuration must change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// TLS could not be set up, e.g. no usable root certificates on this machine.
    #[error("cannot set up TLS: {0}")]
    Tls(String),
    /// The HTTP client could not be built (an invalid header value, a bad proxy variable).
    #[error("cannot build the HTTP client: {0}")]
    Http(String),
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("invalid base URL `{url}`: {reason}")]
    BaseUrl { url: String, reason: String },
    /// A setting is out of range (e.g. a thinking budget not below the output limit).
    #[error("invalid provider configuration: {0}")]
    Config(String),
}

/// Error bodies are read up to this size; the rest is not worth holding.
const ERROR_BODY_LIMIT: usize = 64 << 10;
/// A whole (non-streamed) answer larger than this is refused.
pub(crate) const RESPONSE_BODY_LIMIT: usize = 64 << 20;
/// The server's own words in an error are cut to this many characters, on one line.
const MESSAGE_LIMIT: usize = 300;

#[derive(Debug, Clone)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    request_timeout: Duration,
    /// Enforced here rather than by reqwest's `read_timeout`, which resets a timer on
    /// every frame of a body: see [`Idle`].
    idle_timeout: Duration,
    /// How errors name the provider: `HTTP 401 from openai: ...`.
    provider: &'static str,
}

impl HttpClient {
    /// `base_url` is only looked at for its scheme: a plain-`http` endpoint (a local
    /// server) works on a machine without CA certificates, an `https` one does not.
    pub(crate) fn new(
        provider: &'static str,
        config: &HttpConfig,
        base_url: &str,
    ) -> Result<Self, ClientError> {
        let crypto = Arc::new(rustls::crypto::ring::default_provider());
        let builder = || {
            rustls::ClientConfig::builder_with_provider(Arc::clone(&crypto))
                .with_safe_default_protocol_versions()
                .map_err(|e| ClientError::Tls(e.to_string()))
        };
        let tls = match rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(
            builder()?,
        ) {
            Ok(tls) => tls.with_no_client_auth(),
            Err(error) if base_url.starts_with("http://") => {
                tracing::debug!(%error, "no usable CA certificates; fine for a plain-http endpoint");
                builder()?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth()
            }
            Err(error) => return Err(ClientError::Tls(error.to_string())),
        };
        let mut builder = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .user_agent(concat!("nerve/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(config.connect_timeout)
            // Never follow a redirect: it could carry the API key to another host.
            .redirect(reqwest::redirect::Policy::none());
        if !config.proxy_from_env {
            builder = builder.no_proxy();
        }
        let client = builder.build().map_err(|e| ClientError::Http(chain(&e)))?;
        Ok(Self {
            client,
            request_timeout: config.request_timeout,
            idle_timeout: config.idle_timeout,
            provider,
        })
    }

    /// How errors name the provider.
    pub(crate) fn provider(&self) -> &'static str {
        self.provider
    }

    /// `response`'s body, read with this client's idle timeout.
    pub(crate) fn body(&self, response: reqwest::Response) -> ResponseSource {
        ResponseSource::new(response, self.idle_timeout)
    }

    /// POSTs `body`, a JSON document ([`encode`]). Any non-2xx status becomes the matching
    /// [`ProviderError`].
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        streaming: bool,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut request = self
            .client
            .post(url)
            .headers(headers)
            .header(
                reqwest::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )
            .body(body);
        if streaming {
            request = request.header(
                reqwest::header::ACCEPT,
                HeaderValue::from_static("text/event-stream"),
            );
        } else {
            request = request.timeout(self.request_timeout);
        }
        // A stream's headers come at once, so a long wait for them is silence. A whole
        // answer's come only with the answer, after the model wrote all of it: the request
        // timeout above bounds that wait, and the idle limit must not cut it shorter.
        let waited = if streaming {
            tokio::time::timeout(self.idle_timeout, request.send()).await
        } else {
            Ok(request.send().await)
        };
        let response = match waited {
            Ok(sent) => sent.map_err(send_error)?,
            Err(_) => {
                return Err(ProviderError::transient(
                    ModelErrorKind::Timeout,
                    format!(
                        "no response from the server in time: silent for {:?}",
                        self.idle_timeout
                    ),
                ));
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let wait = retry_after(response.headers(), SystemTime::now());
        let body = read_limited(self.body(response), ERROR_BODY_LIMIT)
            .await
            .unwrap_or_default();
        Err(error_from_status(
            self.provider,
            status.as_u16(),
            wait,
            &body,
        ))
    }
}

/// A request body as the JSON bytes to send.
pub(crate) fn encode(body: &impl serde::Serialize) -> Result<Bytes, ProviderError> {
    serde_json::to_vec(body).map(Bytes::from).map_err(|e| {
        ProviderError::permanent(
            ModelErrorKind::BadRequest,
            format!("cannot encode the request: {e}"),
        )
    })
}

/// Whether a response is a whole JSON document: what a server that ignores `stream: true`
/// sends instead of an event stream.
pub(crate) fn is_json(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// Reads a whole body, refusing one over [`RESPONSE_BODY_LIMIT`] bytes.
pub(crate) async fn read_body(mut source: ResponseSource) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = source.chunk().await? {
        if body.len() + chunk.len() > RESPONSE_BODY_LIMIT {
            return Err(ProviderError::permanent(
                ModelErrorKind::InvalidResponse,
                format!("the response is larger than {RESPONSE_BODY_LIMIT} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Reads at most `limit` bytes of a body, for error messages.
async fn read_limited(mut source: ResponseSource, limit: usize) -> Result<Vec<u8>, ProviderError> {
    let mut body = Vec::new();
    while let Some(chunk) = source.chunk().await? {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

/// A response body as a [`ByteSource`], polled frame by frame, that fails once the
/// server has been silent for the idle timeout.
#[derive(Debug)]
pub(crate) struct ResponseSource {
    body: reqwest::Body,
    idle: Idle,
}

impl ResponseSource {
    fn new(response: reqwest::Response, idle_timeout: Duration) -> Self {
        Self {
            body: response.into(),
            idle: Idle::new(idle_timeout),
        }
    }

    /// The next bytes of the body; `Ok(None)` at its end.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, ProviderError> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }
}

impl ByteSource for ResponseSource {
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ProviderError>> {
        // Ends: each pass consumes a frame or returns; a body that sends nothing for the
        // idle limit is a timeout (`poll_silence`).
        loop {
            self.idle.wait();
            match http_body::Body::poll_frame(Pin::new(&mut self.body), cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    self.idle.heard();
                    // Trailers carry no answer: skip them.
                    if let Ok(bytes) = frame.into_data() {
                        return Poll::Ready(Ok(Some(bytes)));
                    }
                }
                Poll::Ready(Some(Err(error))) => return Poll::Ready(Err(body_error(error))),
                Poll::Ready(None) => return Poll::Ready(Ok(None)),
                Poll::Pending => {
                    return match self.idle.poll_silence(cx) {
                        Poll::Ready(()) => Poll::Ready(Err(ProviderError::transient(
                            ModelErrorKind::Timeout,
                            format!(
                                "no data from the server in time: silent for {:?}",
                                self.idle.limit
                            ),
                        ))),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }
}

/// An idle timeout armed once per silence rather than once per frame.
///
/// A wait for a frame only notes when it began (a clock read). The one timer, set for the
/// limit after the start of a wait it knew of, is looked at only while the body has
/// nothing to give; when it fires and a later wait began meanwhile, it is set again for
/// the limit after that one. So a stream that keeps flowing re-arms the timer about once
/// per `limit`, not once per token (reqwest's `read_timeout` resets its timer on every
/// frame), and a silence of `limit` still ends the read, within one timer tick. Time the
/// reader spends away (its consumer busy) is not counted as the server's silence.
#[derive(Debug)]
struct Idle {
    limit: Duration,
    /// When the current (or last) wait for a frame began.
    since: Instant,
    /// Whether a wait is under way.
    waiting: bool,
    timer: Pin<Box<Sleep>>,
}

impl Idle {
    fn new(limit: Duration) -> Self {
        let since = Instant::now();
        Self {
            limit,
            since,
            waiting: false,
            timer: Box::pin(tokio::time::sleep_until(since + limit)),
        }
    }

    /// The reader wants a frame: a wait begins, unless one is under way.
    fn wait(&mut self) {
        if !self.waiting {
            self.since = Instant::now();
            self.waiting = true;
        }
    }

    /// The body produced a frame: the wait is over.
    fn heard(&mut self) {
        self.waiting = false;
    }

    /// `Ready` once the current wait has lasted the limit; otherwise the timer holds
    /// `cx`'s waker.
    fn poll_silence(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.timer.as_mut().poll(cx).is_ready() {
            let deadline = self.since + self.limit;
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(deadline);
        }
        Poll::Pending
    }
}

/// `reqwest::Error` displays only its outermost layer; the cause (reset, refused, timed
/// out) is in the sources.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A request that produced no response.
fn send_error(error: reqwest::Error) -> ProviderError {
    let message = chain(&error);
    if error.is_timeout() {
        ProviderError::transient(ModelErrorKind::Timeout, message)
    } else if error.is_builder() || error.is_redirect() {
        ProviderError::permanent(ModelErrorKind::BadRequest, message)
    } else {
        ProviderError::transient(ModelErrorKind::Connection, message)
    }
}

/// A body that broke off while being read.
fn body_error(error: reqwest::Error) -> ProviderError {
    let message = chain(&error);
    if error.is_timeout() {
        ProviderError::transient(
            ModelErrorKind::Timeout,
            format!("no data from the server in time: {message}"),
        )
    } else {
        ProviderError::transient(
            ModelErrorKind::TruncatedStream,
            format!("the response broke off: {message}"),
        )
    }
}

/// How long the server asked us to wait: `retry-after-ms` (OpenAI), else `retry-after` as
/// seconds or as an HTTP date.
pub(crate) fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && let Ok(wait) = Duration::try_from_secs_f64(ms / 1000.0)
    {
        return Some(wait);
    }
    let value = text("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What an error body says, across the dialects: OpenAI and vLLM
/// (`{"error":{"message","type","code"}}`), Anthropic (`{"type":"error","error":{...}}`),
/// llama.cpp (`{"error":{"code":400,"message","type"}}`), LiteLLM (`code` as a string such
/// as `"400"`), Ollama (`{"error":"..."}`), FastAPI (`{"detail":"..."}` or a list of
/// validation errors), and HTML pages (reduced to their text).
#[derive(Debug, Default)]
pub(crate) struct ErrorDetails {
    /// `type` and `code`, lowercased.
    hints: Vec<String>,
    /// The server's own message on one line, at most [`MESSAGE_LIMIT`] characters.
    pub(crate) message: String,
    /// A `code` that looks like an HTTP status (llama.cpp and LiteLLM put one in errors).
    status: Option<u16>,
}

impl ErrorDetails {
    pub(crate) fn parse(body: &[u8]) -> Self {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(value) if value.is_object() || value.is_string() => Self::from_json(&value),
            Ok(_) | Err(_) => {
                let text = String::from_utf8_lossy(body);
                let text = if looks_like_html(&text) {
                    Cow::Owned(html_text(&text))
                } else {
                    text
                };
                Self {
                    message: one_line(&text),
                    ..Self::default()
                }
            }
        }
    }

    /// From a parsed error body, or the `error` member of a stream event.
    pub(crate) fn from_json(value: &serde_json::Value) -> Self {
        let error = value.get("error").unwrap_or(value);
        let mut details = Self::default();
        if let Some(text) = error.as_str() {
            details.message = one_line(text);
            return details;
        }
        for key in ["type", "code", "status"] {
            match error.get(key) {
                Some(serde_json::Value::String(hint)) => {
                    match hint.parse::<u16>().ok().filter(|n| (400..600).contains(n)) {
                        Some(status) => details.status = Some(status),
                        None => details.hints.push(hint.to_lowercase()),
                    }
                }
                Some(serde_json::Value::Number(number)) => {
                    details.status = number
                        .as_u64()
                        .and_then(|n| u16::try_from(n).ok())
                        .filter(|n| (400..600).contains(n))
                        .or(details.status);
                }
                _ => {}
            }
        }
        let message = error
            .get("message")
            .or_else(|| value.get("message"))
            .and_then(serde_json::Value::as_str)
            .map(Cow::Borrowed)
            .or_else(|| value.get("detail").and_then(fastapi_detail).map(Cow::Owned));
        let mut message = message.unwrap_or_else(|| Cow::Owned(error.to_string()));
        // llama.cpp's server states its count beside a message that may not.
        if let Some(prompt) = error
            .get("n_prompt_tokens")
            .and_then(serde_json::Value::as_u64)
            && stated_prompt_tokens(&message).is_none()
        {
            message = Cow::Owned(format!("({prompt} prompt tokens) {message}"));
        }
        details.message = one_line(&message);
        details
    }

    fn mentions(&self, needles: &[&str]) -> bool {
        let message = self.message.to_lowercase();
        needles
            .iter()
            .any(|needle| message.contains(needle) || self.hints.iter().any(|h| h.contains(needle)))
    }

    fn is_context_overflow(&self) -> bool {
        self.mentions(&[
            "context_length",
            "context length",
            "context window",
            "maximum context",
            "context size",
            "exceed_context",
            "prompt is too long",
            "prompt too long",
            "too many tokens",
            "input is too long",
            "reduce the length",
            "token limit",
        ])
    }

    fn is_content_filter(&self) -> bool {
        self.mentions(&[
            "content_filter",
            "content_policy",
            "content management policy",
        ])
    }

    fn is_quota(&self) -> bool {
        self.mentions(&["insufficient_quota", "billing", "credit balance"])
    }

    /// Whether a 5xx blames the request rather than the server: llama.cpp's Python server
    /// answers a request it cannot validate or render with 500 (a Jinja template missing a
    /// field says "'dict object' has no attribute 'content'"), and gateways pass on the
    /// backend's 400 as their own 500.
    fn blames_the_request(&self) -> bool {
        self.status
            .is_some_and(|status| (400..500).contains(&status))
            || self.mentions(&[
                "validation error",
                "validationerror",
                "invalid_request",
                "invalid request",
                "badrequest",
                "bad request",
                "unprocessable",
                "field required",
                "input should be",
                "template",
                "has no attribute",
            ])
    }
}

/// A refusal of a prompt too large for the window, with the server's count of it when
/// `message` states one.
pub(crate) fn context_overflow(message: String) -> ProviderError {
    ProviderError::ContextOverflow {
        stated_tokens: stated_prompt_tokens(&message),
        message,
    }
}

/// The prompt's size in tokens by the server's own count, where its refusal of a prompt
/// too large for the window states it: OpenAI and vLLM ("(5000 in the messages, …)",
/// "your messages resulted in 9000 tokens", "your request has 9000 input tokens"),
/// Anthropic ("prompt is too long: 208310 tokens > 200000 maximum"), llama.cpp's server
/// ("request (5000 tokens) exceeds the available context size", `n_prompt_tokens`) and
/// its Python server ("Requested tokens (5000) exceed context window"). `None` when the
/// message states no count.
pub(crate) fn stated_prompt_tokens(message: &str) -> Option<u64> {
    static PATTERNS: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        #[allow(clippy::expect_used)] // A constant pattern, compiled by this module's tests.
        regex::Regex::new(
            r"(?ix)
              (\d+) \s+ in \s+ the \s+ messages
            | messages \s+ resulted \s+ in \s+ (\d+) \s+ tokens
            | request \s+ has \s+ (\d+) \s+ input \s+ tokens
            | prompt \s+ is \s+ too \s+ long: \s* (\d+) \s+ tokens
            | (?:request|input) \s+ \( (\d+) \s+ tokens \) \s+ (?:exceeds|is \s+ larger)
            | requested \s+ tokens \s+ \( (\d+) \) \s+ exceed
            | \( (\d+) \s+ prompt \s+ tokens \)",
        )
        .expect("valid overflow patterns")
    });
    let captures = PATTERNS.captures(message)?;
    captures
        .iter()
        .skip(1)
        .flatten()
        .next()
        .and_then(|count| count.as_str().parse().ok())
        .filter(|&count| count > 0)
}

/// FastAPI's `detail`: a string, or a list of validation errors (`{"loc", "msg"}`).
fn fastapi_detail(detail: &serde_json::Value) -> Option<String> {
    if let Some(text) = detail.as_str() {
        return Some(text.to_owned());
    }
    if detail.is_object() {
        return Some(ErrorDetails::from_json(detail).message);
    }
    let items = detail.as_array()?;
    let texts: Vec<String> = items
        .iter()
        .map(|item| {
            let msg = item
                .get("msg")
                .and_then(serde_json::Value::as_str)
                .map_or_else(|| item.to_string(), str::to_owned);
            match item.get("loc").and_then(serde_json::Value::as_array) {
                Some(loc) => {
                    let path: Vec<String> = loc
                        .iter()
                        .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
                        .collect();
                    format!("{}: {msg}", path.join("."))
                }
                None => msg,
            }
        })
        .collect();
    (!texts.is_empty()).then(|| texts.join("; "))
}

fn looks_like_html(text: &str) -> bool {
    let head: String = text.trim_start().chars().take(64).collect();
    let head = head.to_lowercase();
    head.starts_with("<!doctype html")
        || head.starts_with("<html")
        || head.starts_with("<head")
        || head.starts_with("<body")
        || head.starts_with("<h1")
        || head.starts_with("<title")
}

/// The visible text of an HTML page: what is inside `head`, `script` and `style` is
/// dropped, tags become spaces, the common entities are decoded. Good enough for error
/// pages; not an HTML parser.
pub(crate) fn html_text(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let mut out = String::with_capacity(html.len() / 2);
    let mut at = 0;
    while at < html.len() {
        let Some(open) = lower[at..].find('<').map(|i| at + i) else {
            out.push_str(&html[at..]);
            break;
        };
        out.push_str(&html[at..open]);
        let Some(close) = lower[open..].find('>').map(|i| open + i) else {
            break;
        };
        let tag = lower[open + 1..close]
            .split(|c: char| c.is_ascii_whitespace() || c == '/')
            .find(|t| !t.is_empty())
            .unwrap_or_default();
        at = close + 1;
        if matches!(tag, "head" | "script" | "style") && !lower[open + 1..].starts_with('/') {
            let end = format!("</{tag}");
            at = match lower[at..].find(&end) {
                Some(i) => lower[at + i..]
                    .find('>')
                    .map_or(html.len(), |j| at + i + j + 1),
                None => html.len(),
            };
        }
        out.push(' ');
    }
    decode_entities(&out)
}

fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        let entity = rest[1..]
            .find(';')
            .filter(|end| *end <= 8)
            .map(|end| &rest[1..=end]);
        let decoded = entity.and_then(|name| match name {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some(' '),
            _ => {
                let number = name.strip_prefix('#')?;
                let code = match number.strip_prefix(['x', 'X']) {
                    Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                    None => number.parse().ok()?,
                };
                char::from_u32(code)
            }
        });
        match (entity, decoded) {
            (Some(name), Some(c)) => {
                out.push(c);
                rest = &rest[name.len() + 2..];
            }
            _ => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whitespace runs (newlines included) become one space, and the text is cut to
/// [`MESSAGE_LIMIT`] characters, the ellipsis included.
pub(crate) fn one_line(text: &str) -> String {
    let mut out = String::new();
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        // Enough to cut from; the rest of a long body is never looked at.
        if out.len() > 4 * MESSAGE_LIMIT {
            break;
        }
    }
    match out.char_indices().nth(MESSAGE_LIMIT) {
        Some(_) => {
            let mut cut: String = out.chars().take(MESSAGE_LIMIT - 1).collect();
            cut.truncate(cut.trim_end().len());
            cut.push('…');
            cut
        }
        None => out,
    }
}

/// Maps a non-2xx status (and what its body says) onto a [`ProviderError`]: by what
/// retrying can change. 400, 401, 403, 404, 422 and 501 are permanent; 408, 409, 429 and
/// 5xx are transient, except that a 5xx blaming the request is [`ModelErrorKind::ServerRejected`]
/// (retried at most once, see `RetryPolicy::next_delay`).
pub(crate) fn error_from_status(
    provider: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> ProviderError {
    let details = ErrorDetails::parse(body);
    let message = if details.message.is_empty() {
        format!("HTTP {status} from {provider}")
    } else {
        format!("HTTP {status} from {provider}: {}", details.message)
    };
    let transient = |kind| ProviderError::Transient {
        kind,
        message: message.clone(),
        retry_after,
    };
    match status {
        429 if details.is_quota() => ProviderError::permanent(ModelErrorKind::Quota, message),
        429 => transient(ModelErrorKind::RateLimited),
        408 => transient(ModelErrorKind::Timeout),
        409 => transient(ModelErrorKind::ServerError),
        401 | 403 => ProviderError::permanent(ModelErrorKind::Auth, message),
        413 => context_overflow(message),
        400..=599 if details.is_context_overflow() => context_overflow(message),
        400..=499 if details.is_content_filter() => {
            ProviderError::permanent(ModelErrorKind::ContentFilter, message)
        }
        404 | 501 => ProviderError::permanent(ModelErrorKind::NotFound, message),
        503 | 529 => transient(ModelErrorKind::Overloaded),
        500..=599 if details.blames_the_request() => transient(ModelErrorKind::ServerRejected),
        500..=599 => transient(ModelErrorKind::ServerError),
        _ => ProviderError::permanent(ModelErrorKind::BadRequest, message),
    }
}

/// Maps an error the server reported inside a 200 response (a stream's error event, or an
/// `error` member in a body) onto a [`ProviderError`].
pub(crate) fn error_from_event(provider: &str, value: &serde_json::Value) -> ProviderError {
    let details = ErrorDetails::from_json(value);
    if let Some(status) = details.status {
        return error_from_status(provider, status, None, value.to_string().as_bytes());
    }
    let message = if details.message.is_empty() {
        format!("{provider} reported an error")
    } else {
        format!("{provider}: {}", details.message)
    };
    if details.is_context_overflow() {
        context_overflow(message)
    } else if details.mentions(&["rate_limit", "rate limit"]) {
        ProviderError::transient(ModelErrorKind::RateLimited, message)
    } else if details.mentions(&["overloaded"]) {
        ProviderError::transient(ModelErrorKind::Overloaded, message)
    } else if details.mentions(&["authentication", "permission", "invalid_api_key"]) {
        ProviderError::permanent(ModelErrorKind::Auth, message)
    } else if details.is_content_filter() {
        ProviderError::permanent(ModelErrorKind::ContentFilter, message)
    } else if details.mentions(&["invalid_request"]) {
        ProviderError::permanent(ModelErrorKind::BadRequest, message)
    } else {
        ProviderError::transient(ModelErrorKind::ServerError, message)
    }
}

/// Checks a base URL and strips its trailing slashes.
pub(crate) fn base_url(url: &str) -> Result<String, ClientError> {
    let trimmed = url.trim().trim_end_matches('/');
    let fail = |reason: &str| ClientError::BaseUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .ok_or_else(|| fail("it must start with http:// or https://"))?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(fail("it has no host"));
    }
    if trimmed.contains(['?', '#']) {
        return Err(fail("it must not carry a query or a fragment"));
    }
    Ok(trimmed.to_owned())
}

/// A header value holding a secret: marked sensitive so that no layer prints it.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ClientError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        ClientError::Config("the API key contains characters not allowed in an HTTP header".into())
    })?;
    header.set_sensitive(true);
    Ok(header)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_status(status: u16, body: &str, retry: Option<u64>, expected: &str) {
        let error = error_from_status(
            "openai",
            status,
            retry.map(Duration::from_secs),
            body.as_bytes(),
        );
        let retry_text = match &error {
            ProviderError::Transient {
                retry_after: Some(after),
                ..
            } => format!(" after {}s", after.as_secs()),
            ProviderError::Transient { .. }
            | ProviderError::ContextOverflow { .. }
            | ProviderError::Permanent { .. } => String::new(),
        };
        assert_eq!(
            format!("{error}{retry_text}"),
            expected,
            "status {status} body {body}"
        );
    }

    #[test]
    fn statuses_map_to_error_kinds() {
        check_status(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
            Some(2),
            "rate_limited: HTTP 429 from openai: Rate limit reached after 2s",
        );
        check_status(
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}"#,
            None,
            "quota: HTTP 429 from openai: You exceeded your current quota",
        );
        check_status(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            None,
            "overloaded: HTTP 529 from openai: Overloaded",
        );
        check_status(
            503,
            "upstream unavailable",
            Some(1),
            "overloaded: HTTP 503 from openai: upstream unavailable after 1s",
        );
        check_status(500, "", None, "server_error: HTTP 500 from openai");
        check_status(
            502,
            "<html>bad gateway</html>",
            None,
            "server_error: HTTP 502 from openai: bad gateway",
        );
        check_status(408, "", None, "timeout: HTTP 408 from openai");
        check_status(
            401,
            r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#,
            None,
            "auth: HTTP 401 from openai: Incorrect API key provided",
        );
        check_status(
            403,
            r#"{"type":"error","error":{"type":"permission_error","message":"no"}}"#,
            None,
            "auth: HTTP 403 from openai: no",
        );
        check_status(
            400,
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#,
            None,
            "context_overflow: HTTP 400 from openai: This model's maximum context length is 8192 tokens.",
        );
        check_status(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}"#,
            None,
            "context_overflow: HTTP 400 from openai: prompt is too long: 208310 tokens > 200000 maximum",
        );
        check_status(
            400,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
            None,
            "context_overflow: HTTP 400 from openai: the request exceeds the available context size",
        );
        check_status(
            413,
            r#"{"type":"error","error":{"type":"request_too_large","message":"Request exceeds the maximum size"}}"#,
            None,
            "context_overflow: HTTP 413 from openai: Request exceeds the maximum size",
        );
        check_status(
            400,
            r#"{"error":{"message":"flagged","code":"content_filter"}}"#,
            None,
            "content_filter: HTTP 400 from openai: flagged",
        );
        check_status(
            404,
            r#"{"error":"model 'llama9' not found"}"#,
            None,
            "not_found: HTTP 404 from openai: model 'llama9' not found",
        );
        check_status(
            422,
            r#"{"detail":"bad"}"#,
            None,
            "bad_request: HTTP 422 from openai: bad",
        );
        check_status(
            422,
            r#"{"detail":[{"loc":["body","messages",2,"content"],"msg":"Input should be a valid string","type":"string_type"}]}"#,
            None,
            "bad_request: HTTP 422 from openai: body.messages.2.content: Input should be a valid string",
        );
        check_status(
            400,
            r#"{"error":{"message":"unknown field","type":"invalid_request_error"}}"#,
            None,
            "bad_request: HTTP 400 from openai: unknown field",
        );
        check_status(
            409,
            "busy",
            None,
            "server_error: HTTP 409 from openai: busy",
        );
        check_status(
            401,
            r#"{"detail":{"error":{"message":"Invalid API key","type":"auth"}}}"#,
            None,
            "auth: HTTP 401 from openai: Invalid API key",
        );
        // A plain web server that does not take POST: permanent, and its page as one line.
        check_status(
            501,
            "<!DOCTYPE HTML>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Error response</title>\n<style>p { color: red }</style></head>\n<body>\n<h1>Error response</h1>\n<p>Error code: 501</p>\n<p>Message: Unsupported method (&#x27;POST&#x27;).</p>\n</body>\n</html>\n",
            None,
            "not_found: HTTP 501 from openai: Error response Error code: 501 Message: Unsupported method ('POST').",
        );
        // llama.cpp's Python server refusing a message shape with a 500.
        check_status(
            500,
            r#"{"error":{"message":"1 validation error for ChatCompletionRequestAssistantMessage\ncontent\n  Input should be a valid string","type":"internal_server_error","param":null,"code":null}}"#,
            None,
            "server_rejected: HTTP 500 from openai: 1 validation error for ChatCompletionRequestAssistantMessage content Input should be a valid string",
        );
        // LiteLLM passing a backend's 400 on as its own 500, its code a string.
        check_status(
            500,
            r#"{"error":{"message":"litellm.APIError: OpenAIException - Value is not callable","type":null,"param":null,"code":"400"}}"#,
            None,
            "server_rejected: HTTP 500 from openai: litellm.APIError: OpenAIException - Value is not callable",
        );
        // LiteLLM's Messages endpoint in front of llama-cpp-python: the chat template
        // fails on a message LiteLLM made without `content`.
        check_status(
            500,
            r#"{"error":{"message":"litellm.InternalServerError: InternalServerError: OpenAIException - 'dict object' has no attribute 'content'. Received Model Group=smollm2","type":null,"param":null,"code":"500"}}"#,
            None,
            "server_rejected: HTTP 500 from openai: litellm.InternalServerError: InternalServerError: OpenAIException - 'dict object' has no attribute 'content'. Received Model Group=smollm2",
        );
        check_status(302, "", None, "bad_request: HTTP 302 from openai");
    }

    #[test]
    fn errors_inside_a_stream_are_classified() {
        let check = |value: serde_json::Value, expected: &str| {
            assert_eq!(error_from_event("openai", &value).to_string(), expected)
        };
        check(
            serde_json::json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
            "overloaded: openai: Overloaded",
        );
        check(
            serde_json::json!({"error":{"message":"The server had an error","type":"server_error"}}),
            "server_error: openai: The server had an error",
        );
        check(
            serde_json::json!({"error":{"type":"rate_limit_error","message":"slow down"}}),
            "rate_limited: openai: slow down",
        );
        check(
            serde_json::json!({"error":{"code":500,"message":"llama crashed"}}),
            "server_error: HTTP 500 from openai: llama crashed",
        );
        check(
            serde_json::json!({"error":{"type":"invalid_request_error","message":"bad tool"}}),
            "bad_request: openai: bad tool",
        );
        check(
            serde_json::json!({"error":{"type":"invalid_request_error","message":"prompt is too long"}}),
            "context_overflow: openai: prompt is too long",
        );
    }

    #[test]
    fn retry_after_in_all_its_forms() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let check = |pairs: &[(&'static str, &'static str)], expected: Option<Duration>| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            assert_eq!(retry_after(&headers, now), expected, "{pairs:?}");
        };
        check(&[("retry-after", "7")], Some(Duration::from_secs(7)));
        check(&[("retry-after", "1.5")], Some(Duration::from_millis(1500)));
        check(
            &[("retry-after", "Wed, 21 Oct 2015 07:28:30 GMT")],
            Some(Duration::from_secs(30)),
        );
        check(
            &[("retry-after", "Wed, 21 Oct 2015 07:00:00 GMT")],
            Some(Duration::ZERO),
        );
        check(
            &[("retry-after-ms", "250"), ("retry-after", "9")],
            Some(Duration::from_millis(250)),
        );
        check(&[("retry-after", "soon")], None);
        check(&[("retry-after", "-3")], None);
        check(&[], None);
    }

    #[test]
    fn base_urls_are_checked() {
        assert_eq!(
            base_url("https://api.openai.com/v1/").unwrap(),
            "https://api.openai.com/v1"
        );
        assert_eq!(
            base_url("http://127.0.0.1:8080").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert!(base_url("api.openai.com").is_err());
        assert!(base_url("https://").is_err());
        assert!(base_url("https://x/v1?key=1").is_err());
    }

    #[test]
    fn messages_are_one_line_of_at_most_the_limit() {
        let long = "é".repeat(1000);
        let details = ErrorDetails::parse(long.as_bytes());
        assert_eq!(details.message.chars().count(), MESSAGE_LIMIT);
        assert!(details.message.ends_with('…'));
        let words = "word ".repeat(200);
        let message = one_line(&words);
        assert!(message.chars().count() <= MESSAGE_LIMIT, "{message}");
        assert!(message.ends_with("word…"), "{message}");
        assert_eq!(one_line("  a\n\n b\t c  "), "a b c");
        assert_eq!(one_line(""), "");
    }

    #[test]
    fn html_is_reduced_to_its_text() {
        assert_eq!(
            one_line(&html_text(
                "<html><head><title>x</title><script>var a = '<b>';</script></head><body><p>A &amp; B&nbsp;&lt;c&gt; &#65;&bogus; &</p></body></html>"
            )),
            "A & B <c> A&bogus; &"
        );
        assert_eq!(
            one_line(&html_text("<h1>Bad Gateway</h1><hr>nginx")),
            "Bad Gateway nginx"
        );
        assert_eq!(one_line(&html_text("<p unclosed")), "");
    }

    #[test]
    fn an_overflow_message_gives_the_servers_count_of_the_prompt() {
        let check = |message: &str, expected: Option<u64>| {
            assert_eq!(stated_prompt_tokens(message), expected, "{message}");
        };
        check(
            "litellm.ContextWindowExceededError: OpenAIException - This model's maximum context length is 4096 tokens. However, you requested 4539 tokens (4283 in the messages, 256 in the completion).",
            Some(4283),
        );
        check(
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9120 tokens. Please reduce the length of the messages.",
            Some(9120),
        );
        check(
            "This model's maximum context length is 4096 tokens. However, your request has 5012 input tokens.",
            Some(5012),
        );
        check(
            "prompt is too long: 208310 tokens > 200000 maximum",
            Some(208_310),
        );
        check(
            "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
            Some(5000),
        );
        check(
            "input (5001 tokens) is larger than the max context size (4096 tokens). skipping",
            Some(5001),
        );
        check(
            "Requested tokens (4133) exceed context window of 4096",
            Some(4133),
        );
        // The window's size alone, or the prompt and the completion together, are not it.
        check("This model's maximum context length is 8192 tokens.", None);
        check("However, you requested 5453 tokens", None);
        check("the request exceeds the available context size", None);
        check("prompt is too long: 0 tokens", None);
        // llama.cpp's count beside its message.
        let details = ErrorDetails::parse(
            br#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4500,"n_ctx":4096}}"#,
        );
        assert_eq!(
            stated_prompt_tokens(&details.message),
            Some(4500),
            "{}",
            details.message
        );
        let details = ErrorDetails::parse(
            br#"{"error":{"code":400,"message":"request (4600 tokens) exceeds the available context size (4096 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4600,"n_ctx":4096}}"#,
        );
        assert_eq!(
            details.message,
            "request (4600 tokens) exceeds the available context size (4096 tokens), try increasing it"
        );
    }

    proptest::proptest! {
        #[test]
        fn a_stated_count_is_found_in_any_surrounding_text(
            before in "[a-zA-Z ,.:]{0,60}",
            after in "[a-zA-Z ,.:]{0,60}",
            count in 1_u64..10_000_000,
            template in 0_usize..4,
        ) {
            let stated = match template {
                0 => format!("({count} in the messages, 100 in the completion)"),
                1 => format!("prompt is too long: {count} tokens > 100 maximum"),
                2 => format!("request ({count} tokens) exceeds the available context size"),
                _ => format!("your messages resulted in {count} tokens"),
            };
            let message = format!("{before} {stated} {after}");
            proptest::prop_assert_eq!(stated_prompt_tokens(&message), Some(count));
        }

        #[test]
        fn any_text_is_read_without_panicking(text in ".{0,300}") {
            let _ = stated_prompt_tokens(&text);
        }

        #[test]
        fn any_error_body_gives_one_short_line(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2000)) {
            let details = ErrorDetails::parse(&body);
            proptest::prop_assert!(details.message.chars().count() <= MESSAGE_LIMIT);
            proptest::prop_assert!(!details.message.contains('\n'));
        }

        #[test]
        fn any_html_reduces_without_panicking(text in "(<[a-z/ ]{0,8}>|&[a-z#0-9]{0,6};?|[a-zé ]{0,10}){0,40}") {
            let _ = html_text(&text);
        }
    }
}
