//! Where a request says it goes: the request target (absolute-form, origin-form with a
//! `Host` header, or authority-form for CONNECT), normalised, and checked for the tricks
//! that make a proxy and an upstream disagree about the host.

use http::request::Parts;
use http::uri::Authority;

use crate::proxy::rules::normalize_host;

/// A request's destination as the proxy understands it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// Normalised host (see [`normalize_host`]).
    pub(crate) host: String,
    /// The port the request names, if it names one.
    pub(crate) port: Option<u16>,
    /// The default port of the scheme the sandbox used: 80 for `http` and origin-form,
    /// 443 for `https`.
    pub(crate) default_port: u16,
    /// Path and query, as received (origin-form); empty for CONNECT.
    pub(crate) path_and_query: String,
    /// The path without the query, as received; empty for CONNECT.
    pub(crate) path: String,
}

/// Parses the target of a request. The error is the reason for a 400.
pub(crate) fn parse(parts: &Parts) -> Result<Target, String> {
    let hosts: Vec<&http::HeaderValue> = parts.headers.get_all(http::header::HOST).iter().collect();
    if hosts.len() > 1 {
        return Err("more than one Host header".to_owned());
    }
    let host_header = match hosts.first() {
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|text| text.parse::<Authority>().ok())
                .ok_or("the Host header is not a host")?,
        ),
        None => None,
    };
    let uri = &parts.uri;
    let (authority, default_port, path_and_query) = if parts.method == http::Method::CONNECT {
        let authority = uri
            .authority()
            .filter(|_| uri.scheme().is_none())
            .ok_or("CONNECT needs a host:port target")?;
        if authority.port_u16().is_none() {
            return Err("CONNECT needs a port".to_owned());
        }
        (authority.clone(), 443, String::new())
    } else if let Some(scheme) = uri.scheme_str() {
        let default_port = match scheme {
            "http" => 80,
            "https" => 443,
            _ => return Err(format!("the scheme `{scheme}` is not proxied")),
        };
        let authority = uri.authority().ok_or("the request target has no host")?;
        let path_and_query = match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") => "/".to_owned(),
            Some(p) => p.to_owned(),
        };
        (authority.clone(), default_port, path_and_query)
    } else {
        let authority = host_header
            .clone()
            .ok_or("an origin-form request without a Host header")?;
        let path_and_query = uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        (authority, 80, path_and_query)
    };
    let target = from_authority(&authority, default_port, path_and_query)?;
    if let Some(header) = host_header {
        let named = from_authority(&header, default_port, String::new())?;
        let effective = |t: &Target| t.port.unwrap_or(t.default_port);
        if named.host != target.host || effective(&named) != effective(&target) {
            return Err(format!(
                "the Host header ({}) and the request target ({}) disagree",
                named.host, target.host
            ));
        }
    }
    Ok(target)
}

fn from_authority(
    authority: &Authority,
    default_port: u16,
    path_and_query: String,
) -> Result<Target, String> {
    let text = authority.as_str();
    if text.contains('@') {
        return Err("userinfo in the request target".to_owned());
    }
    if text.ends_with(':') {
        return Err("an empty port".to_owned());
    }
    let host = normalize_host(authority.host())
        .map_err(|problem| format!("{problem}: {}", printable(authority.host())))?;
    let path = path_and_query
        .split('?')
        .next()
        .unwrap_or_default()
        .to_owned();
    Ok(Target {
        host,
        port: authority.port_u16(),
        default_port,
        path_and_query,
        path,
    })
}

/// A sandbox-chosen string made safe to quote in an event or error: at most 100
/// characters, control characters escaped.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .take(100)
        .flat_map(char::escape_default)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        method: &str,
        uri: &str,
        host: &[&str],
        expected: Result<(&str, Option<u16>, &str), &str>,
    ) {
        let mut builder = http::Request::builder().method(method).uri(uri);
        for value in host {
            builder = builder.header(http::header::HOST, *value);
        }
        let (parts, ()) = builder.body(()).unwrap().into_parts();
        let got = parse(&parts);
        let got = got
            .as_ref()
            .map(|t| (t.host.as_str(), t.port, t.path_and_query.as_str()))
            .map_err(String::as_str);
        assert_eq!(got, expected, "{method} {uri} {host:?}");
    }

    #[test]
    fn targets() {
        check(
            "GET",
            "http://API.Good.Test./x?q=1",
            &[],
            Ok(("api.good.test", None, "/x?q=1")),
        );
        check("GET", "http://good.test", &[], Ok(("good.test", None, "/")));
        check(
            "GET",
            "http://good.test:8080/",
            &["good.test:8080"],
            Ok(("good.test", Some(8080), "/")),
        );
        check(
            "GET",
            "http://good.test/",
            &["GOOD.test:80"],
            Ok(("good.test", None, "/")),
        );
        check(
            "GET",
            "https://good.test/",
            &["good.test:443"],
            Ok(("good.test", None, "/")),
        );
        check("GET", "/a", &["good.test"], Ok(("good.test", None, "/a")));
        check("GET", "http://[::1]:9/", &[], Ok(("[::1]", Some(9), "/")));
        check(
            "CONNECT",
            "good.test:443",
            &[],
            Ok(("good.test", Some(443), "")),
        );
        check(
            "GET",
            "http://good.test/",
            &["evil.test"],
            Err("the Host header (evil.test) and the request target (good.test) disagree"),
        );
        check(
            "GET",
            "http://good.test/",
            &["good.test:81"],
            Err("the Host header (good.test) and the request target (good.test) disagree"),
        );
        check(
            "GET",
            "/a",
            &["good.test", "evil.test"],
            Err("more than one Host header"),
        );
        check(
            "GET",
            "/a",
            &[],
            Err("an origin-form request without a Host header"),
        );
        check(
            "GET",
            "http://user@good.test/",
            &[],
            Err("userinfo in the request target"),
        );
        check(
            "GET",
            "http://user@evil.test@good.test/",
            &[],
            Err("userinfo in the request target"),
        );
        check(
            "GET",
            "/a",
            &["user@good.test"],
            Err("userinfo in the request target"),
        );
        check(
            "GET",
            "ftp://good.test/",
            &[],
            Err("the scheme `ftp` is not proxied"),
        );
        check(
            "GET",
            "http://127.1/",
            &[],
            Err("an ambiguous numeric host (only dotted-quad IPv4 literals are accepted): 127.1"),
        );
        check("CONNECT", "good.test", &[], Err("CONNECT needs a port"));
    }
}
