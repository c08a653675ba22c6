//! The host side of the `http_request` tool: one request through the proxy's unix socket,
//! exactly as a command in the sandbox would send it, so the same rules, events and
//! scrubbing apply. The answer is capped for the model.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

/// Limits of the host-side client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientLimits {
    /// The whole exchange, a little more than the proxy's own total timeout.
    pub timeout: Duration,
    /// Body bytes kept for the model; the rest is dropped.
    pub max_body_bytes: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(130),
            max_body_bytes: 64 << 10,
        }
    }
}

/// Sends requests through one proxy.
#[derive(Debug, Clone)]
pub struct ProxyClient {
    socket: PathBuf,
    pub limits: ClientLimits,
}

/// A request as the model describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: String,
    /// Absolute `http://` or `https://` URL. In gateway mode the proxy picks the upstream
    /// scheme from its rule, whatever this says.
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
}

/// The answer, capped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    /// At most [`ClientLimits::max_body_bytes`].
    pub body: Vec<u8>,
    /// More body followed and was dropped.
    pub truncated: bool,
}

/// Request headers the model may not set: the URL and the proxy decide them.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-connection",
    "proxy-authorization",
];

impl ProxyClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            limits: ClientLimits::default(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends one request. The error is one line for the model: a malformed request, or the
    /// proxy unreachable. Refusals by the proxy are responses (403 and the reason).
    pub async fn send(&self, request: HttpRequest) -> Result<HttpResponse, String> {
        let request = build(request)?;
        match tokio::time::timeout(self.limits.timeout, self.exchange(request)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "no answer within {} s",
                self.limits.timeout.as_secs()
            )),
        }
    }

    async fn exchange(&self, request: Request<Full<Bytes>>) -> Result<HttpResponse, String> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| format!("the proxy is not reachable: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("the proxy is not reachable: {e}"))?;
        let connection = tokio::spawn(connection);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("the proxy did not answer: {e}"))?;
        let result = self.read(response).await;
        connection.abort();
        result
    }

    async fn read(&self, response: hyper::Response<Incoming>) -> Result<HttpResponse, String> {
        let (head, mut body) = response.into_parts();
        let mut kept = Vec::new();
        let mut truncated = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("the response body broke off: {e}"))?;
            if let Ok(data) = frame.into_data() {
                let room = self.limits.max_body_bytes.saturating_sub(kept.len());
                if data.len() > room {
                    kept.extend_from_slice(&data[..room]);
                    truncated = true;
                    break;
                }
                kept.extend_from_slice(&data);
            }
        }
        Ok(HttpResponse {
            status: head.status.as_u16(),
            reason: head
                .status
                .canonical_reason()
                .unwrap_or_default()
                .to_owned(),
            headers: head
                .headers
                .iter()
                .map(|(name, value)| {
                    (
                        name.as_str().to_owned(),
                        String::from_utf8_lossy(value.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: kept,
            truncated,
        })
    }
}

/// Validates the model's request and builds it in absolute-form.
fn build(request: HttpRequest) -> Result<Request<Full<Bytes>>, String> {
    let method = request.method.trim();
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "`method` must be an upper-case HTTP method such as GET or POST, not {method:?}"
        ));
    }
    if method == "CONNECT" {
        return Err("`method` CONNECT is not available here".to_owned());
    }
    let method = Method::from_bytes(method.as_bytes()).map_err(|_| "an invalid `method`")?;
    let uri: Uri = request
        .url
        .parse()
        .map_err(|e| format!("`url` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => return Err(format!("`url` must be http or https, not {other}")),
        None => return Err("`url` must be absolute (http://host/path)".to_owned()),
    }
    let authority = uri
        .authority()
        .ok_or("`url` has no host")?
        .as_str()
        .to_owned();
    if authority.contains('@') {
        return Err("`url` must not carry a user name or password".to_owned());
    }
    let mut builder = Request::builder().method(method).uri(uri);
    for (name, value) in &request.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("`{name}` is not a valid header name"))?;
        if RESERVED.contains(&header.as_str()) {
            return Err(format!(
                "the header `{name}` is set by the proxy, not the request"
            ));
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            format!("the value of header `{name}` has a line break or another control character")
        })?;
        builder = builder.header(header, value);
    }
    let host = HeaderValue::from_str(&authority).map_err(|_| "`url` has an invalid host")?;
    builder = builder.header(header::HOST, host);
    let body = Bytes::from(request.body.unwrap_or_default());
    builder
        .body(Full::new(body))
        .map_err(|e| format!("cannot build the request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(request: HttpRequest, expected: Result<&str, &str>) {
        let got = build(request.clone()).map(|r| {
            let mut headers: Vec<String> = r
                .headers()
                .iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect();
            headers.sort();
            format!("{} {} [{}]", r.method(), r.uri(), headers.join(", "))
        });
        assert_eq!(
            got.as_deref().map_err(String::as_str),
            expected,
            "{request:?}"
        );
    }

    fn request(method: &str, url: &str, headers: &[(&str, &str)]) -> HttpRequest {
        HttpRequest {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: None,
        }
    }

    #[test]
    fn requests_are_validated() {
        check(
            request("GET", "http://api.test/x?y=1", &[("Accept", "text/plain")]),
            Ok("GET http://api.test/x?y=1 [accept: text/plain, host: api.test]"),
        );
        check(
            request("get", "http://api.test/", &[]),
            Err("`method` must be an upper-case HTTP method such as GET or POST, not \"get\""),
        );
        check(
            request("GET", "/x", &[]),
            Err("`url` must be absolute (http://host/path)"),
        );
        check(
            request("GET", "ftp://a/x", &[]),
            Err("`url` must be http or https, not ftp"),
        );
        check(
            request("GET", "http://u:p@api.test/", &[]),
            Err("`url` must not carry a user name or password"),
        );
        check(
            request("GET", "http://api.test/", &[("Host", "evil.test")]),
            Err("the header `Host` is set by the proxy, not the request"),
        );
        check(
            request("GET", "http://api.test/", &[("X-A", "a\r\nX-B: b")]),
            Err("the value of header `X-A` has a line break or another control character"),
        );
        check(
            request("GET", "http://api.test/", &[("Bad Name", "x")]),
            Err("`Bad Name` is not a valid header name"),
        );
        check(
            request("CONNECT", "http://api.test/", &[]),
            Err("`method` CONNECT is not available here"),
        );
    }
}
