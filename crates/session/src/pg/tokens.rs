//! The API tokens of `nerve serve` on the PostgreSQL log: the same table, hashing, scopes,
//! use records and revocation as the SQLite log's (`tokens.rs`), so a token made with
//! `nerve --db postgres://… token create` is checked by any `nerve serve` on that log, and
//! a revocation stops it at once on every one of them (each check reads the table).

use super::PgStore;
use crate::SessionError;
use crate::store::now_rfc3339;
use crate::tokens::{TokenRecord, digest, new_token, use_to_record};

const COLUMNS: &str = "name, scope, created_at, last_used_at, revoked_at";

fn record(row: &tokio_postgres::Row) -> Result<TokenRecord, tokio_postgres::Error> {
    Ok(TokenRecord {
        name: row.try_get(0)?,
        scope: row.try_get(1)?,
        created_at: row.try_get(2)?,
        last_used_at: row.try_get(3)?,
        revoked_at: row.try_get(4)?,
    })
}

impl PgStore {
    /// Makes a token named `name` with `scope` and returns it (the only time it exists
    /// outside the caller); `None` when a token (live or revoked) has that name.
    pub async fn create_token(
        &self,
        name: &str,
        scope: &str,
    ) -> Result<Option<String>, SessionError> {
        let token = new_token()?;
        let inserted = self
            .client()
            .await?
            .execute(
                "INSERT INTO api_tokens (name, hash, scope, created_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (name) DO NOTHING",
                &[&name, &digest(&token), &scope, &now_rfc3339()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok((inserted == 1).then_some(token))
    }

    /// Every token, oldest first.
    pub async fn tokens(&self) -> Result<Vec<TokenRecord>, SessionError> {
        let rows = self
            .client()
            .await?
            .query(
                &format!("SELECT {COLUMNS} FROM api_tokens ORDER BY created_at, name"),
                &[],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| record(row).map_err(|e| self.db_err(&e)))
            .collect()
    }

    /// Revokes the token named `name`; `false` when no live token has that name.
    pub async fn revoke_token(&self, name: &str) -> Result<bool, SessionError> {
        let changed = self
            .client()
            .await?
            .execute(
                "UPDATE api_tokens SET revoked_at = $2 WHERE name = $1 AND revoked_at IS NULL",
                &[&name, &now_rfc3339()],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        Ok(changed == 1)
    }

    /// The live token that `token` is, with its use recorded (to the minute); `None` for
    /// an unknown or revoked one.
    pub async fn use_token(&self, token: &str) -> Result<Option<TokenRecord>, SessionError> {
        let hash = digest(token);
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {COLUMNS} FROM api_tokens WHERE hash = $1 AND revoked_at IS NULL"),
                &[&hash],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let mut found = record(&row).map_err(|e| self.db_err(&e))?;
        if let Some(used) = use_to_record(found.last_used_at.as_deref()) {
            client
                .execute(
                    "UPDATE api_tokens SET last_used_at = $2 WHERE hash = $1",
                    &[&hash, &used],
                )
                .await
                .map_err(|e| self.db_err(&e))?;
            found.last_used_at = Some(used);
        }
        Ok(Some(found))
    }
}
