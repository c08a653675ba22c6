//! Who may call a route: the `Authorization: Bearer TOKEN` header, looked up (hashed) in
//! the log's `api_tokens` on every request, so that a revoked token stops at once; its
//! use is recorded. No token, an unknown or a revoked one: 401. A scope below the
//! route's: 403. The web view's cookie stands for the header on reading routes only.

use axum::http::{HeaderMap, StatusCode, header};
use nerve_runtime::tokens::Scope;

use crate::app::{ApiError, App};

/// The cookie the web view keeps its token in (HttpOnly, SameSite=Strict).
pub(crate) const COOKIE: &str = "nerve_token";

/// The token of the web view's cookie, if the request carries one.
pub(crate) fn cookie_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(COOKIE)?.strip_prefix('='))
        .filter(|token| !token.is_empty())
}

/// [`authorize`] for the routes that only read (`GET`): the web view's cookie will do
/// instead of the header. A cookie never authorizes a route that changes anything, so a
/// page on another site cannot make a logged-in browser act (no CSRF).
pub(crate) fn authorize_read(app: &App, headers: &HeaderMap) -> Result<String, ApiError> {
    match cookie_token(headers) {
        Some(token) if !headers.contains_key(header::AUTHORIZATION) => {
            check(app, token, Scope::Read)
        }
        Some(_) | None => authorize(app, headers, Scope::Read),
    }
}

/// The token's name when the request's token is live and its scope at least `needed`.
pub(crate) fn authorize(app: &App, headers: &HeaderMap, needed: Scope) -> Result<String, ApiError> {
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
    check(app, token, needed)
}

/// The name of `token` when it is live and its scope at least `needed`.
pub(crate) fn check(app: &App, token: &str, needed: Scope) -> Result<String, ApiError> {
    let unauthorized = |why: &str| ApiError::new(StatusCode::UNAUTHORIZED, why);
    // A short SQLite statement (an update of the token's last use) on a connection of
    // its own, off the async workers.
    let found = tokio::task::block_in_place(|| {
        let store = app
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nerve_runtime::tokens::check(&store, token)
    })
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
    Ok(name)
}
