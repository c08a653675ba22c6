//! The proxy's policy: which upstream hosts the sandbox may reach, with which methods and
//! paths, over which scheme and port, and which credential the proxy adds. Everything not
//! allowed by a rule is denied.
//!
//! Host names are compared after normalisation (lower case, one trailing dot removed); names
//! that are not plain ASCII DNS names or IP literals are refused outright, never resolved.
//! Paths are compared after percent-decoding, segment by segment, and a path whose decoded
//! form has a dot segment, an encoded slash or a backslash is refused: the upstream could
//! otherwise read `/allowed/../admin` as `/admin`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::HandsError;
use crate::proxy::resolve::{Resolve, SystemResolver};

/// The placeholder in a credential's value template that the secret replaces.
pub const SECRET_PLACEHOLDER: &str = "{secret}";

/// Everything the proxy needs before it serves.
#[derive(Clone)]
pub struct ProxyConfig {
    /// The allowlist. Order does not matter: an exact host beats a wildcard, a longer
    /// wildcard beats a shorter one, and two rules for the same pattern are refused.
    pub rules: Vec<ProxyRule>,
    pub limits: ProxyLimits,
    /// How host names become addresses. Only names that a rule allows are ever resolved.
    pub resolver: Arc<dyn Resolve>,
}

impl fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("rules", &self.rules)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ProxyConfig {
    /// A proxy with these rules, the default limits and the system resolver.
    pub fn new(rules: Vec<ProxyRule>) -> Self {
        Self {
            rules,
            limits: ProxyLimits::default(),
            resolver: Arc::new(SystemResolver),
        }
    }

    /// Checks the rules: unique host patterns, valid methods and paths, credentials whose
    /// header can carry the secret. The error names the rule and the problem.
    pub fn validate(&self) -> Result<(), HandsError> {
        let mut seen: Vec<&HostPattern> = Vec::new();
        for rule in &self.rules {
            let fail = |problem: String| {
                Err(HandsError::ProxyConfig(format!(
                    "rule for `{}`: {problem}",
                    rule.host
                )))
            };
            if seen.contains(&&rule.host) {
                return fail("a second rule for the same host".to_owned());
            }
            seen.push(&rule.host);
            if rule.methods.is_empty() {
                return fail("no method is allowed".to_owned());
            }
            for method in &rule.methods {
                if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                    return fail(format!(
                        "method `{method}` is not an upper-case HTTP method"
                    ));
                }
            }
            if rule.paths.is_empty() {
                return fail("no path is allowed (use \"/\" for every path)".to_owned());
            }
            for path in &rule.paths {
                if let Err(problem) = check_rule_path(path) {
                    return fail(format!("path `{path}`: {problem}"));
                }
            }
            if rule.upstream_port == Some(0) {
                return fail("port 0".to_owned());
            }
            if let Some(credential) = &rule.credential {
                if rule.allows_connect() {
                    return fail(
                        "CONNECT is refused on a rule with a credential: a tunnel is opaque, the credential could not be injected and the sandbox's own headers could not be checked"
                            .to_owned(),
                    );
                }
                if let Err(problem) = credential.check() {
                    return fail(format!("credential `{}`: {problem}", credential.name));
                }
            }
        }
        if self.limits.connect_timeout.is_zero() || self.limits.total_timeout.is_zero() {
            return Err(HandsError::ProxyConfig(
                "timeouts must be positive".to_owned(),
            ));
        }
        Ok(())
    }

    /// The rule that governs `host` (already normalised): exact first, then the longest
    /// matching wildcard.
    pub(crate) fn rule_for(&self, host: &str) -> Option<&ProxyRule> {
        self.rules
            .iter()
            .filter(|rule| rule.host.matches(host))
            .max_by_key(|rule| rule.host.specificity())
    }
}

/// Sizes and times that bound every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyLimits {
    /// Resolution plus TCP connect plus TLS handshake to the upstream; 504 past it.
    pub connect_timeout: Duration,
    /// From the request head to the end of the response body (or of a tunnel); the
    /// request fails with 504 if the response head is not in by then, and a body still
    /// streaming is cut off.
    pub total_timeout: Duration,
    /// The largest request body forwarded; 413 beyond it.
    pub max_request_body_bytes: u64,
    /// The largest response body passed back; 502 when the upstream announces more, and
    /// the body is cut off when it sends more.
    pub max_response_body_bytes: u64,
    /// The largest request head (request line and headers) the proxy reads.
    pub max_header_bytes: usize,
    /// The time the sandbox has to send a request head once it starts one.
    pub header_read_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(120),
            max_request_body_bytes: 8 << 20,
            max_response_body_bytes: 64 << 20,
            max_header_bytes: 64 << 10,
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// How the proxy talks to the upstream, whatever the sandbox said: in gateway mode the
/// sandbox speaks plain HTTP and the proxy adds TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamScheme {
    Http,
    Https,
}

impl UpstreamScheme {
    pub fn default_port(self) -> u16 {
        match self {
            Self::Http => 80,
            Self::Https => 443,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// One allowlisted upstream host (or family of hosts).
#[derive(Debug, Clone)]
pub struct ProxyRule {
    pub host: HostPattern,
    /// Allowed methods, upper case, compared exactly. `CONNECT` here allows tunnels (only
    /// on rules without a credential).
    pub methods: Vec<String>,
    /// Allowed path prefixes. A prefix ending in `/` matches by string prefix; otherwise it
    /// matches the path itself and everything below it (`/repos/a` matches `/repos/a` and
    /// `/repos/a/x`, not `/repos/ab`).
    pub paths: Vec<String>,
    pub upstream_scheme: UpstreamScheme,
    /// The upstream port; the scheme's default when `None`.
    pub upstream_port: Option<u16>,
    /// Allow addresses that are not globally routable (loopback, private ranges, link-local
    /// and cloud metadata). Off by default: such an address is refused after resolution.
    pub allow_private: bool,
    pub credential: Option<Credential>,
}

impl ProxyRule {
    /// A rule for `host` with the defaults: `GET` and `HEAD`, every path, HTTPS upstream on
    /// its default port, public addresses only, no credential.
    pub fn new(host: HostPattern) -> Self {
        Self {
            host,
            methods: vec!["GET".to_owned(), "HEAD".to_owned()],
            paths: vec!["/".to_owned()],
            upstream_scheme: UpstreamScheme::Https,
            upstream_port: None,
            allow_private: false,
            credential: None,
        }
    }

    pub fn port(&self) -> u16 {
        self.upstream_port
            .unwrap_or_else(|| self.upstream_scheme.default_port())
    }

    pub(crate) fn allows_connect(&self) -> bool {
        self.methods.iter().any(|m| m == "CONNECT")
    }

    pub(crate) fn allows_method(&self, method: &str) -> bool {
        method != "CONNECT" && self.methods.iter().any(|m| m == method)
    }

    /// Whether the decoded request path falls under one of the allowed prefixes.
    pub(crate) fn allows_path(&self, decoded: &[u8]) -> bool {
        self.paths.iter().any(|prefix| {
            let prefix = prefix.as_bytes();
            if prefix.ends_with(b"/") {
                decoded.starts_with(prefix)
            } else {
                decoded == prefix
                    || (decoded.starts_with(prefix) && decoded.get(prefix.len()) == Some(&b'/'))
            }
        })
    }
}

/// The credential a rule injects: `header: template` with `{secret}` replaced by the secret.
#[derive(Debug, Clone)]
pub struct Credential {
    /// A label for events and redaction (`[REDACTED:<name>]`); never the secret.
    pub name: String,
    /// The header that carries it, e.g. `Authorization`.
    pub header: String,
    /// The header's value, e.g. `Bearer {secret}`.
    pub template: String,
    pub secret: SecretString,
}

impl Credential {
    fn check(&self) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err("the name must be letters, digits, `_` or `-`".to_owned());
        }
        let header = http::HeaderName::from_bytes(self.header.as_bytes())
            .map_err(|_| format!("`{}` is not a header name", self.header))?;
        if is_hop_by_hop(&header) || header == http::header::HOST {
            return Err(format!("`{}` cannot carry a credential", self.header));
        }
        if !self.template.contains(SECRET_PLACEHOLDER) {
            return Err(format!("the value template has no `{SECRET_PLACEHOLDER}`"));
        }
        if self.secret.expose_secret().chars().count() < nerve_core::redact::MIN_SECRET_LEN {
            return Err(format!(
                "the secret is shorter than {} characters and could not be redacted",
                nerve_core::redact::MIN_SECRET_LEN
            ));
        }
        // Never say why the value is invalid: the reason could quote the secret.
        self.header_value()
            .map(drop)
            .ok_or_else(|| "the secret cannot be sent in a header (a control character, a line break or non-ASCII text)".to_owned())
    }

    /// The header value to inject, marked sensitive.
    pub(crate) fn header_value(&self) -> Option<http::HeaderValue> {
        let value = self
            .template
            .replace(SECRET_PLACEHOLDER, self.secret.expose_secret());
        let mut value = http::HeaderValue::from_str(&value).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// Which hosts a rule covers: one exact name or IP literal, or every subdomain of a domain
/// (`*.example.com` covers `a.example.com` and `a.b.example.com`, not `example.com`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    /// The normalised host, or the domain after `*.`.
    name: String,
    wildcard: bool,
}

impl HostPattern {
    /// Parses `example.com`, `*.example.com`, `127.0.0.1` or `[::1]`, normalised like the
    /// hosts it is compared with.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (wildcard, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let name = normalize_host(rest).map_err(|problem| format!("host `{text}`: {problem}"))?;
        if wildcard && (name.starts_with('[') || name.parse::<Ipv4Addr>().is_ok()) {
            return Err(format!(
                "host `{text}`: a wildcard needs a domain name, not an address"
            ));
        }
        Ok(Self { name, wildcard })
    }

    pub(crate) fn matches(&self, host: &str) -> bool {
        if self.wildcard {
            host.len() > self.name.len()
                && host.ends_with(self.name.as_str())
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }

    /// Exact beats any wildcard; a longer wildcard beats a shorter one.
    fn specificity(&self) -> (bool, usize) {
        (!self.wildcard, self.name.len())
    }

    /// Whether the pattern names exactly one host.
    pub fn is_exact(&self) -> bool {
        !self.wildcard
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            write!(f, "*.{}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// The canonical form of a host: lower case, without one trailing dot; an IPv4 literal in
/// dotted-quad form; an IPv6 literal in brackets, canonical. Refuses what a resolver could
/// read differently from us: non-ASCII names (no IDNA here), percent signs, empty labels,
/// and numeric forms such as `127.1` or `0x7f.1` that `inet_aton` takes for addresses.
pub fn normalize_host(raw: &str) -> Result<String, &'static str> {
    if raw.is_empty() {
        return Err("the host is empty");
    }
    if !raw.is_ascii() {
        return Err("the host is not ASCII (internationalised names are refused)");
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or("an unterminated IPv6 literal")?;
        let address: Ipv6Addr = inner.parse().map_err(|_| "an invalid IPv6 literal")?;
        return Ok(format!("[{address}]"));
    }
    if raw.contains(':') {
        // A bare IPv6 literal, as a rule may write it.
        let address: Ipv6Addr = raw.parse().map_err(|_| "an invalid host")?;
        return Ok(format!("[{address}]"));
    }
    let lower = raw.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    if name.is_empty() || name.len() > 253 {
        return Err("an invalid host length");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    {
        return Err("the host has characters a DNS name cannot have");
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.len() > 63)
    {
        return Err("the host has an empty or overlong label");
    }
    if let Ok(address) = name.parse::<Ipv4Addr>() {
        return Ok(address.to_string());
    }
    let last = name.rsplit('.').next().unwrap_or(name);
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err("an ambiguous numeric host (only dotted-quad IPv4 literals are accepted)");
    }
    Ok(name.to_owned())
}

/// The address a normalised host names, when it is an IP literal.
pub(crate) fn literal_address(host: &str) -> Option<IpAddr> {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    host.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// A rule's path prefix must be a plain absolute path: it is compared with decoded paths.
fn check_rule_path(path: &str) -> Result<(), &'static str> {
    if !path.starts_with('/') {
        return Err("must start with `/`");
    }
    if path.contains('%') || path.contains('?') || path.contains('#') {
        return Err("must be a plain path (no `%`, `?` or `#`)");
    }
    match decode_path(path) {
        Ok(_) => Ok(()),
        Err(problem) => Err(problem),
    }
}

/// Percent-decodes a request path for comparison with the rules, refusing anything an
/// upstream could normalise into another path: `.` and `..` segments (also as `%2e`, and
/// as `..;x` which some servers read as `..`), encoded `/`, backslashes, NUL and other
/// control bytes, and malformed escapes.
pub(crate) fn decode_path(raw: &str) -> Result<Vec<u8>, &'static str> {
    if !raw.starts_with('/') {
        return Err("the path does not start with `/`");
    }
    let bytes = raw.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if byte == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or("a malformed percent escape")?;
            let value = std::str::from_utf8(hex)
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a malformed percent escape")?;
            if value == b'/' {
                return Err("an encoded `/` in the path");
            }
            decoded.push(value);
            i += 3;
        } else {
            decoded.push(byte);
            i += 1;
        }
    }
    if decoded.contains(&b'\\') {
        return Err("a backslash in the path");
    }
    if decoded.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err("a control character in the path");
    }
    for segment in decoded.split(|&b| b == b'/') {
        let bare = segment.split(|&b| b == b';').next().unwrap_or(segment);
        if bare == b"." || bare == b".." {
            return Err("a `.` or `..` segment in the path");
        }
    }
    Ok(decoded)
}

/// Headers that belong to one connection, never forwarded (RFC 9110, section 7.6.1).
pub(crate) fn is_hop_by_hop(name: &http::HeaderName) -> bool {
    [
        http::header::CONNECTION,
        http::header::PROXY_AUTHENTICATE,
        http::header::PROXY_AUTHORIZATION,
        http::header::TE,
        http::header::TRAILER,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::header::CONTENT_LENGTH,
    ]
    .contains(name)
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
}

/// Headers that carry credentials of their own: removed from every request to a host whose
/// rule injects one, so that the sandbox can neither add to nor replace the proxy's.
pub(crate) fn is_credential_header(name: &http::HeaderName) -> bool {
    let name = name.as_str();
    name == "cookie"
        || name == "authorization"
        || nerve_core::is_credential_env_name(name)
        || name.ends_with("-key")
        || name.contains("signature")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_host(raw: &str, expected: Result<&str, &str>) {
        assert_eq!(
            normalize_host(raw).as_deref().map_err(|e| *e),
            expected,
            "{raw}"
        );
    }

    #[test]
    fn hosts_are_normalised_or_refused() {
        check_host("API.Example.COM", Ok("api.example.com"));
        check_host("api.example.com.", Ok("api.example.com"));
        check_host(
            "api.example.com..",
            Err("the host has an empty or overlong label"),
        );
        check_host("127.0.0.1", Ok("127.0.0.1"));
        check_host("[::1]", Ok("[::1]"));
        check_host("[0:0::1]", Ok("[::1]"));
        check_host("::1", Ok("[::1]"));
        check_host("[::1", Err("an unterminated IPv6 literal"));
        check_host(
            "127.1",
            Err("an ambiguous numeric host (only dotted-quad IPv4 literals are accepted)"),
        );
        check_host(
            "2130706433",
            Err("an ambiguous numeric host (only dotted-quad IPv4 literals are accepted)"),
        );
        check_host(
            "0x7f.0.0.1",
            Err("an ambiguous numeric host (only dotted-quad IPv4 literals are accepted)"),
        );
        check_host(
            "bücher.example",
            Err("the host is not ASCII (internationalised names are refused)"),
        );
        check_host(
            "g%6fod.test",
            Err("the host has characters a DNS name cannot have"),
        );
        check_host(
            "evil.com@good",
            Err("the host has characters a DNS name cannot have"),
        );
        check_host("", Err("the host is empty"));
        check_host(".", Err("an invalid host length"));
    }

    #[test]
    fn patterns_match_exact_hosts_and_subdomains() {
        let exact = HostPattern::parse("Good.Test.").unwrap();
        let wild = HostPattern::parse("*.good.test").unwrap();
        for (host, exact_matches, wild_matches) in [
            ("good.test", true, false),
            ("a.good.test", false, true),
            ("a.b.good.test", false, true),
            ("evilgood.test", false, false),
            ("good.test.evil", false, false),
        ] {
            assert_eq!(exact.matches(host), exact_matches, "{host}");
            assert_eq!(wild.matches(host), wild_matches, "{host}");
        }
        assert!(HostPattern::parse("*.127.0.0.1").is_err());
        assert!(HostPattern::parse("*.*.x").is_err());
        assert_eq!(wild.to_string(), "*.good.test");
    }

    #[test]
    fn the_most_specific_rule_wins() {
        let rule = |host: &str, port: u16| ProxyRule {
            upstream_port: Some(port),
            ..ProxyRule::new(HostPattern::parse(host).unwrap())
        };
        let config = ProxyConfig::new(vec![
            rule("*.test", 1),
            rule("*.api.test", 2),
            rule("x.api.test", 3),
        ]);
        let port = |host: &str| config.rule_for(host).map(|r| r.port());
        assert_eq!(port("x.api.test"), Some(3));
        assert_eq!(port("y.api.test"), Some(2));
        assert_eq!(port("api.test"), Some(1));
        assert_eq!(port("test"), None);
    }

    fn check_path(raw: &str, expected: Result<&str, &str>) {
        let got = decode_path(raw).map(|d| String::from_utf8(d).unwrap());
        assert_eq!(got.as_deref().map_err(|e| *e), expected, "{raw}");
    }

    #[test]
    fn paths_are_decoded_and_dot_segments_refused() {
        check_path("/repos/a/b", Ok("/repos/a/b"));
        check_path("/repos/%61", Ok("/repos/a"));
        check_path("/a/../b", Err("a `.` or `..` segment in the path"));
        check_path("/a/%2e%2E/b", Err("a `.` or `..` segment in the path"));
        check_path("/a/.%2e", Err("a `.` or `..` segment in the path"));
        check_path("/a/..;x/b", Err("a `.` or `..` segment in the path"));
        check_path("/a/./b", Err("a `.` or `..` segment in the path"));
        check_path("/a/..b", Ok("/a/..b"));
        check_path("/a%2f..%2fb", Err("an encoded `/` in the path"));
        check_path("/a%5c..", Err("a backslash in the path"));
        check_path("/a%00", Err("a control character in the path"));
        check_path("/a%zz", Err("a malformed percent escape"));
        check_path("/a%2", Err("a malformed percent escape"));
        check_path("a", Err("the path does not start with `/`"));
    }

    #[test]
    fn path_prefixes_respect_segments() {
        let rule = ProxyRule {
            paths: vec!["/repos/acme".to_owned(), "/users/".to_owned()],
            ..ProxyRule::new(HostPattern::parse("x.test").unwrap())
        };
        for (path, allowed) in [
            ("/repos/acme", true),
            ("/repos/acme/x", true),
            ("/repos/acmeevil", false),
            ("/repos", false),
            ("/users/", true),
            ("/users/x", true),
            ("/users", false),
            ("/", false),
        ] {
            assert_eq!(rule.allows_path(path.as_bytes()), allowed, "{path}");
        }
    }

    fn credential(header: &str, template: &str, secret: &str) -> Credential {
        Credential {
            name: "gh".to_owned(),
            header: header.to_owned(),
            template: template.to_owned(),
            secret: SecretString::from(secret),
        }
    }

    #[test]
    fn rules_are_validated() {
        let check = |rule: ProxyRule, expected: Result<(), &str>| {
            let got = ProxyConfig::new(vec![rule])
                .validate()
                .map_err(|e| e.to_string());
            let expected = expected.map_err(|e| format!("invalid proxy rules: {e}"));
            assert_eq!(got, expected);
        };
        let base = || ProxyRule::new(HostPattern::parse("api.test").unwrap());
        check(base(), Ok(()));
        check(
            ProxyRule {
                credential: Some(credential(
                    "Authorization",
                    "Bearer {secret}",
                    "s3cr3t-value",
                )),
                ..base()
            },
            Ok(()),
        );
        check(
            ProxyRule {
                methods: vec!["get".to_owned()],
                ..base()
            },
            Err("rule for `api.test`: method `get` is not an upper-case HTTP method"),
        );
        check(
            ProxyRule {
                paths: vec!["/a/../b".to_owned()],
                ..base()
            },
            Err("rule for `api.test`: path `/a/../b`: a `.` or `..` segment in the path"),
        );
        check(
            ProxyRule {
                credential: Some(credential("Authorization", "Bearer", "s3cr3t-value")),
                ..base()
            },
            Err("rule for `api.test`: credential `gh`: the value template has no `{secret}`"),
        );
        check(
            ProxyRule {
                credential: Some(credential("Authorization", "{secret}", "s3cr3t\nvalue")),
                ..base()
            },
            Err(
                "rule for `api.test`: credential `gh`: the secret cannot be sent in a header (a control character, a line break or non-ASCII text)",
            ),
        );
        check(
            ProxyRule {
                credential: Some(credential("Content-Length", "{secret}", "s3cr3t-value")),
                ..base()
            },
            Err("rule for `api.test`: credential `gh`: `Content-Length` cannot carry a credential"),
        );
        check(
            ProxyRule {
                credential: Some(credential("X-Key", "{secret}", "abc")),
                ..base()
            },
            Err(
                "rule for `api.test`: credential `gh`: the secret is shorter than 6 characters and could not be redacted",
            ),
        );
        let connect = ProxyRule {
            methods: vec!["CONNECT".to_owned()],
            credential: Some(credential("X-Key", "{secret}", "s3cr3t-value")),
            ..base()
        };
        assert!(
            ProxyConfig::new(vec![connect])
                .validate()
                .unwrap_err()
                .to_string()
                .contains("CONNECT is refused on a rule with a credential")
        );
        let twice = ProxyConfig::new(vec![base(), base()]);
        assert!(
            twice
                .validate()
                .unwrap_err()
                .to_string()
                .contains("a second rule")
        );
    }

    #[test]
    fn credential_headers_are_recognised() {
        for (name, credential) in [
            ("authorization", true),
            ("proxy-authorization", true),
            ("cookie", true),
            ("x-api-key", true),
            ("x-auth-token", true),
            ("private-token", true),
            ("x-amz-signature", true),
            ("accept", false),
            ("content-type", false),
            ("user-agent", false),
        ] {
            let header = http::HeaderName::from_static(name);
            assert_eq!(is_credential_header(&header), credential, "{name}");
        }
    }
}
