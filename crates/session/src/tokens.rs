//! The API tokens of `nerve serve`, kept in the log's `api_tokens` table (the SQLite log's
//! here, the PostgreSQL log's in `pg/tokens.rs`, alike in every respect): made here
//! from 32 bytes of the operating system's randomness, shown once to whoever created them,
//! and stored only as their SHA-256. A request's token is hashed and looked up; a revoked
//! token keeps its row (so its name stays taken) and stops matching at once, since every
//! lookup reads the table.

use ring::rand::SecureRandom;
use rusqlite::OptionalExtension;

use crate::SessionError;
use crate::store::{Store, now_rfc3339, rfc3339};

/// How stale a token's recorded last use may get: a busy client's requests write it once
/// a minute, not each time (every write is a durable commit on the log's database, which
/// the executions' writer shares).
const USE_RECORDED_EVERY: time::Duration = time::Duration::minutes(1);

/// How every token begins: a reader of a leaked string (or a secret scanner) knows what it is.
pub const TOKEN_PREFIX: &str = "nerve_";

/// A token as `nerve token list` shows it: never the token itself, which is not stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TokenRecord {
    pub name: String,
    pub scope: String,
    pub created_at: String,
    /// When a request last presented it; `None`: never used.
    pub last_used_at: Option<String>,
    /// When it was revoked; `None`: it is live.
    pub revoked_at: Option<String>,
}

/// The stored form of `token`: its SHA-256, in hex.
pub(crate) fn digest(token: &str) -> String {
    hex::encode(ring::digest::digest(
        &ring::digest::SHA256,
        token.as_bytes(),
    ))
}

/// A new token: the prefix and 32 bytes of the operating system's randomness, in hex.
pub(crate) fn new_token() -> Result<String, SessionError> {
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| {
            SessionError::Corrupt("the operating system gave no randomness for a token".into())
        })?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// Whether a token last used at `last_used` (`None`: never) should have this use
/// recorded at `now`, and the time to record.
pub(crate) fn use_to_record(last_used: Option<&str>) -> Option<String> {
    let now = time::OffsetDateTime::now_utc();
    let stale = rfc3339(now - USE_RECORDED_EVERY);
    last_used
        .is_none_or(|used| *used < *stale)
        .then(|| rfc3339(now))
}

impl Store {
    fn token_error(&self, source: rusqlite::Error) -> SessionError {
        SessionError::Sqlite {
            path: self.path().to_owned(),
            source,
        }
    }

    /// Makes a token named `name` with `scope` and returns it (the only time it exists
    /// outside the caller); `None` when a token (live or revoked) has that name.
    pub fn create_token(&self, name: &str, scope: &str) -> Result<Option<String>, SessionError> {
        let token = new_token()?;
        let inserted = self
            .conn
            .execute(
                "INSERT INTO api_tokens (name, hash, scope, created_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (name) DO NOTHING",
                rusqlite::params![name, digest(&token), scope, now_rfc3339()],
            )
            .map_err(|e| self.token_error(e))?;
        Ok((inserted == 1).then_some(token))
    }

    /// Every token, oldest first.
    pub fn tokens(&self) -> Result<Vec<TokenRecord>, SessionError> {
        let mut statement = self
            .conn
            .prepare(
                "SELECT name, scope, created_at, last_used_at, revoked_at FROM api_tokens
                 ORDER BY created_at, name",
            )
            .map_err(|e| self.token_error(e))?;
        let rows = statement
            .query_map([], |row| {
                Ok(TokenRecord {
                    name: row.get(0)?,
                    scope: row.get(1)?,
                    created_at: row.get(2)?,
                    last_used_at: row.get(3)?,
                    revoked_at: row.get(4)?,
                })
            })
            .map_err(|e| self.token_error(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.token_error(e))
    }

    /// Revokes the token named `name`; `false` when no live token has that name.
    pub fn revoke_token(&self, name: &str) -> Result<bool, SessionError> {
        let changed = self
            .conn
            .execute(
                "UPDATE api_tokens SET revoked_at = ?2 WHERE name = ?1 AND revoked_at IS NULL",
                rusqlite::params![name, now_rfc3339()],
            )
            .map_err(|e| self.token_error(e))?;
        Ok(changed == 1)
    }

    /// The live token that `token` is, with its use recorded (to the minute); `None` for
    /// an unknown or revoked one.
    pub fn use_token(&self, token: &str) -> Result<Option<TokenRecord>, SessionError> {
        let hash = digest(token);
        let found = self
            .conn
            .query_row(
                "SELECT name, scope, created_at, last_used_at, revoked_at FROM api_tokens
                 WHERE hash = ?1 AND revoked_at IS NULL",
                rusqlite::params![hash],
                |row| {
                    Ok(TokenRecord {
                        name: row.get(0)?,
                        scope: row.get(1)?,
                        created_at: row.get(2)?,
                        last_used_at: row.get(3)?,
                        revoked_at: row.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(|e| self.token_error(e))?;
        let Some(mut record) = found else {
            return Ok(None);
        };
        if let Some(used) = use_to_record(record.last_used_at.as_deref()) {
            self.conn
                .execute(
                    "UPDATE api_tokens SET last_used_at = ?2 WHERE hash = ?1",
                    rusqlite::params![hash, used],
                )
                .map_err(|e| self.token_error(e))?;
            record.last_used_at = Some(used);
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_stored_hashed_used_and_revoked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nerve.db");
        let store = Store::open(&path).unwrap();
        let token = store.create_token("ci", "read").unwrap().unwrap();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 64);
        assert_eq!(store.create_token("ci", "admin").unwrap(), None);
        // Only the digest is on disk.
        let stored: String = store
            .conn
            .query_row("SELECT hash FROM api_tokens", [], |row| row.get(0))
            .unwrap();
        assert_eq!(stored, digest(&token));
        assert_ne!(stored, token);

        assert_eq!(store.tokens().unwrap()[0].last_used_at, None);
        let used = store.use_token(&token).unwrap().unwrap();
        assert_eq!((used.name.as_str(), used.scope.as_str()), ("ci", "read"));
        assert!(used.last_used_at.is_some());
        // Within the minute, a use writes nothing.
        let again = store.use_token(&token).unwrap().unwrap();
        assert_eq!(again.last_used_at, used.last_used_at);
        assert_eq!(store.tokens().unwrap()[0].last_used_at, used.last_used_at);
        assert_eq!(store.use_token("nerve_00").unwrap(), None);

        assert!(store.revoke_token("ci").unwrap());
        assert!(!store.revoke_token("ci").unwrap());
        assert_eq!(store.use_token(&token).unwrap(), None);
        assert!(store.tokens().unwrap()[0].revoked_at.is_some());
    }
}
