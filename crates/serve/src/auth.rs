//! Who may call a route: the `Authorization: Bearer TOKEN` header, looked up (hashed) in
//! the log's `api_tokens` (SQLite or PostgreSQL) on every request, so that a revoked token stops at once; its
//! use is recorded. No token, an unknown or a revoked one: 401. A scope below the
//! route's: 403. The web view's session cookie stands for the header on reading routes,
//! and on the web view's own forms when they come from its own page ([`same_origin`]).

use axum::http::{HeaderMap, StatusCode, header};
use nerve_runtime::tokens::Scope;
use secrecy::ExposeSecret;

use crate::app::{ApiError, App};

/// The cookie the web view keeps its session in (HttpOnly, SameSite=Strict, Secure under
/// TLS). Its value is a session id, never the token (see `sessions.rs`).
pub(crate) const COOKIE: &str = "nerve_session";

/// The session id of the web view's cookie, if the request carries one.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|id| !id.is_empty())
}

/// The token and scope of the request's web session, at least `needed`: 401 without a
/// session (or an ended one, or a revoked token), 403 for a weaker scope.
pub(crate) async fn session(
    app: &App,
    headers: &HeaderMap,
    needed: Scope,
) -> Result<(String, Scope), ApiError> {
    let token = session_cookie(headers)
        .and_then(|id| app.sessions.token(id))
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "no web session (or it ended): log in again",
            )
        })?;
    check_scope(app, token.expose_secret(), needed).await
}

/// [`authorize`] for the routes that only read (`GET`): the web view's session cookie will
/// do instead of the header.
pub(crate) async fn authorize_read(app: &App, headers: &HeaderMap) -> Result<String, ApiError> {
    if session_cookie(headers).is_some() && !headers.contains_key(header::AUTHORIZATION) {
        return session(app, headers, Scope::Read)
            .await
            .map(|(name, _)| name);
    }
    authorize(app, headers, Scope::Read).await
}

/// What authorized a reading request, kept by a long answer (an event stream) to check
/// again as it goes: a revoked token, or a session that logged out, stops it.
#[derive(Debug)]
pub(crate) enum Credential {
    Bearer(secrecy::SecretString),
    Session(String),
}

impl Credential {
    /// The credential [`authorize_read`] accepted for these headers.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Self> {
        if !headers.contains_key(header::AUTHORIZATION) {
            return session_cookie(headers).map(|id| Self::Session(id.to_owned()));
        }
        headers
            .get(header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")
            .map(|token| Self::Bearer(token.trim().to_owned().into()))
    }

    /// [`Credential::of`], or 401 when the headers hold none.
    pub(crate) fn required(headers: &HeaderMap) -> Result<Self, ApiError> {
        Self::of(headers).ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "no credential to follow the stream with",
            )
        })
    }

    /// Whether it still authorizes reading.
    pub(crate) async fn still_valid(&self, app: &App) -> bool {
        let token = match self {
            Self::Bearer(token) => Some(token.clone()),
            Self::Session(id) => app.sessions.token(id),
        };
        match token {
            Some(token) => check(app, token.expose_secret(), Scope::Read).await.is_ok(),
            None => false,
        }
    }
}

/// A state-changing form of the web view must come from a page of this server: its
/// `Origin` names the host the request was sent to (a browser always sends `Origin` with a
/// form's POST, and a page elsewhere cannot forge it), and `Sec-Fetch-Site`, when sent,
/// says `same-origin`. With the SameSite=Strict cookie this makes the forms CSRF-safe.
pub(crate) fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let refused = |why: String| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!("{why}: a form must be sent from this server's own page"),
        )
    };
    let text = |name: header::HeaderName| {
        headers
            .get(&name)
            .map(|value| value.to_str().unwrap_or_default().to_owned())
    };
    if let Some(site) = text(header::HeaderName::from_static("sec-fetch-site"))
        && site != "same-origin"
    {
        return Err(refused(format!("Sec-Fetch-Site is {site:?}")));
    }
    let origin = text(header::ORIGIN).ok_or_else(|| refused("no Origin header".to_owned()))?;
    let host = text(header::HOST).unwrap_or_default();
    let authority = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"));
    if authority.is_none_or(|authority| !authority.eq_ignore_ascii_case(&host)) {
        return Err(refused(format!(
            "Origin {origin:?} is not this server ({host})"
        )));
    }
    Ok(())
}

/// The token's name when the request's token is live and its scope at least `needed`.
pub(crate) async fn authorize(
    app: &App,
    headers: &HeaderMap,
    needed: Scope,
) -> Result<String, ApiError> {
    let unauthorized = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why);
    let token = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| {
            unauthorized("this route needs an Authorization: Bearer token (`nerve token create`)")
        })?
        .to_str()
        .ok()
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| unauthorized("the Authorization header is not `Bearer TOKEN`"))?;
    check(app, token, needed).await
}

/// The name of `token` when it is live and its scope at least `needed`.
pub(crate) async fn check(app: &App, token: &str, needed: Scope) -> Result<String, ApiError> {
    check_scope(app, token, needed).await.map(|(name, _)| name)
}

/// The name and scope of `token` when it is live and its scope at least `needed`.
pub(crate) async fn check_scope(
    app: &App,
    token: &str,
    needed: Scope,
) -> Result<(String, Scope), ApiError> {
    let unauthorized = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why);
    // A read of the log's token table (and, once a minute, an update of the token's last
    // use): SQLite on a connection of its own off the async workers, or PostgreSQL's pool.
    let found = app
        .tokens
        .check(token)
        .await
        .map_err(|error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, error))?;
    let Some((name, scope)) = found else {
        return Err(unauthorized("the token is unknown or revoked"));
    };
    if scope < needed {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("token {name} has scope {scope}; this route needs {needed}"),
        ));
    }
    Ok((name, scope))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn check(headers: &[(&'static str, &'static str)], expected: Result<(), &str>) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(*name, HeaderValue::from_static(value));
        }
        let answer = same_origin(&map).map_err(|e| format!("{e:?}"));
        match expected {
            Ok(()) => assert!(answer.is_ok(), "{headers:?}: {answer:?}"),
            Err(why) => {
                let error = answer.unwrap_err();
                assert!(error.contains(why), "{headers:?}: {error}");
                assert!(error.contains("403"), "{error}");
            }
        }
    }

    #[test]
    fn a_form_must_come_from_a_page_of_this_server() {
        let host = ("host", "127.0.0.1:8420");
        check(&[host, ("origin", "http://127.0.0.1:8420")], Ok(()));
        check(&[host, ("origin", "https://127.0.0.1:8420")], Ok(()));
        check(
            &[
                host,
                ("origin", "http://127.0.0.1:8420"),
                ("sec-fetch-site", "same-origin"),
            ],
            Ok(()),
        );
        check(&[host], Err("no Origin header"));
        check(
            &[host, ("origin", "http://evil.example")],
            Err("is not this server"),
        );
        check(
            &[host, ("origin", "http://127.0.0.1:8421")],
            Err("is not this server"),
        );
        check(&[host, ("origin", "null")], Err("is not this server"));
        check(
            &[
                host,
                ("origin", "http://127.0.0.1:8420"),
                ("sec-fetch-site", "cross-site"),
            ],
            Err("Sec-Fetch-Site"),
        );
        check(
            &[("origin", "http://127.0.0.1:8420")],
            Err("is not this server"),
        );
    }
}
