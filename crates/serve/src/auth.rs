//! Who may call a route: the `Authorization: Bearer TOKEN` header, looked up (hashed) in
//! the log's `api_tokens` on every request, so that a revoked token stops at once; its
//! use is recorded. No token, an unknown or a revoked one: 401. A scope below the
//! route's: 403.

use axum::http::{HeaderMap, StatusCode, header};
use nerve_runtime::tokens::Scope;

use crate::app::{ApiError, App};

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
