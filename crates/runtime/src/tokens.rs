//! The API tokens of `nerve serve` (`nerve token create|list|revoke`), in the log's
//! database, SQLite or PostgreSQL alike: what a token may do ([`Scope`]), and creating,
//! listing, revoking and checking tokens through the log.

use std::path::Path;
use std::sync::{Arc, Mutex};

use nerve_core::Redactor;
use nerve_session::{PgStore, Store};
pub use nerve_session::{TOKEN_PREFIX, TokenRecord};

use crate::RuntimeError;

/// The log's database opened for its tokens ([`open`]).
#[derive(Debug)]
pub enum TokenStore {
    /// A SQLite connection of its own: each use is one short statement.
    Sqlite(Box<Mutex<Store>>),
    /// The PostgreSQL log, through its pool (which a server's reads share: [`Self::reader`]).
    Postgres(Arc<PgStore>),
}

/// What a token may do; each scope includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// List and show executions, stream their events.
    Read,
    /// And create executions, send them messages, cancel them.
    Run,
    /// And decide their pending approvals.
    Approve,
    /// Everything.
    Admin,
}

impl Scope {
    pub const ALL: [Self; 4] = [Self::Read, Self::Run, Self::Approve, Self::Admin];

    pub const fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Run => "run",
            Self::Approve => "approve",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Scope {
    type Err = RuntimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.name() == s)
            .ok_or_else(|| {
                RuntimeError::usage(format!("unknown scope {s:?}: read, run, approve or admin"))
            })
    }
}

/// A token's name: what `list` shows and `revoke` takes.
fn check_name(name: &str) -> Result<(), RuntimeError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(RuntimeError::usage(format!(
            "token name {name:?}: use 1 to 64 letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

/// The log's database, opened (and migrated) for its tokens.
pub async fn open(db: &Path) -> Result<TokenStore, RuntimeError> {
    if let Some(url) = db.to_str().filter(|_| crate::log::is_postgres(db)) {
        let store = PgStore::connect(url, Arc::new(Redactor::new())).await?;
        return Ok(TokenStore::Postgres(Arc::new(store)));
    }
    Ok(TokenStore::Sqlite(Box::new(Mutex::new(Store::open(db)?))))
}

/// A new token named `name` with `scope`: returned once, stored hashed.
pub async fn create(db: &Path, name: &str, scope: Scope) -> Result<String, RuntimeError> {
    check_name(name)?;
    open(db).await?.create(name, scope).await
}

/// Every token, oldest first (never the tokens themselves).
pub async fn list(db: &Path) -> Result<Vec<TokenRecord>, RuntimeError> {
    open(db).await?.list().await
}

/// Revokes the token named `name`; it stops working at once.
pub async fn revoke(db: &Path, name: &str) -> Result<(), RuntimeError> {
    open(db).await?.revoke(name).await
}

/// Runs a short SQLite statement: off the async workers where the runtime has others
/// (`block_in_place` needs a multi-threaded runtime), else in place.
fn blocking<T>(store: &Mutex<Store>, work: impl FnOnce(&Store) -> T) -> T {
    let run = || {
        work(
            &store
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    };
    match tokio::runtime::Handle::try_current().map(|handle| handle.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(run),
        _ => run(),
    }
}

impl TokenStore {
    /// A reader of the same PostgreSQL log, on the same pool: a server that holds this store
    /// reads through it instead of connecting (and checking the schema) for every request.
    /// `None` for a SQLite log, whose connection is not shared (open a reader of its own).
    pub fn reader(&self) -> Option<crate::log::Reader> {
        match self {
            Self::Postgres(store) => Some(crate::log::Reader::Postgres(Arc::clone(store))),
            Self::Sqlite(_) => None,
        }
    }

    /// A new token named `name` with `scope`: returned once, stored hashed.
    pub async fn create(&self, name: &str, scope: Scope) -> Result<String, RuntimeError> {
        check_name(name)?;
        let made = match self {
            Self::Sqlite(store) => blocking(store, |s| s.create_token(name, scope.name()))?,
            Self::Postgres(store) => store.create_token(name, scope.name()).await?,
        };
        made.ok_or_else(|| {
            RuntimeError::conflict(format!(
                "a token named {name} exists (revoked tokens keep their names): choose another name"
            ))
        })
    }

    /// Every token, oldest first (never the tokens themselves).
    pub async fn list(&self) -> Result<Vec<TokenRecord>, RuntimeError> {
        Ok(match self {
            Self::Sqlite(store) => blocking(store, Store::tokens)?,
            Self::Postgres(store) => store.tokens().await?,
        })
    }

    /// Revokes the token named `name`; it stops working at once.
    pub async fn revoke(&self, name: &str) -> Result<(), RuntimeError> {
        let revoked = match self {
            Self::Sqlite(store) => blocking(store, |s| s.revoke_token(name))?,
            Self::Postgres(store) => store.revoke_token(name).await?,
        };
        if revoked {
            Ok(())
        } else {
            Err(RuntimeError::NotFound(format!(
                "no live token named {name} (see `nerve token list`)"
            )))
        }
    }

    /// The name and scope of the live token `token`, its use recorded; `None` when it is
    /// unknown or revoked (or names a scope this nerve does not know).
    pub async fn check(&self, token: &str) -> Result<Option<(String, Scope)>, RuntimeError> {
        let found = match self {
            Self::Sqlite(store) => blocking(store, |s| s.use_token(token))?,
            Self::Postgres(store) => store.use_token(token).await?,
        };
        Ok(found.and_then(|record| record.scope.parse().ok().map(|scope| (record.name, scope))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_include_the_ones_before_them_and_parse_by_name() {
        assert!(Scope::Read < Scope::Run && Scope::Run < Scope::Approve);
        assert!(Scope::Approve < Scope::Admin);
        for scope in Scope::ALL {
            assert_eq!(scope.name().parse::<Scope>().unwrap(), scope);
        }
        assert_eq!(
            "root".parse::<Scope>().unwrap_err().to_string(),
            "unknown scope \"root\": read, run, approve or admin"
        );
    }

    #[tokio::test]
    async fn tokens_are_created_checked_and_revoked_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("nerve.db");
        let token = create(&db, "ci-bot", Scope::Run).await.unwrap();
        assert!(create(&db, "ci-bot", Scope::Read).await.is_err());
        assert!(create(&db, "no spaces", Scope::Read).await.is_err());
        let store = open(&db).await.unwrap();
        assert_eq!(
            store.check(&token).await.unwrap(),
            Some(("ci-bot".to_owned(), Scope::Run))
        );
        revoke(&db, "ci-bot").await.unwrap();
        assert_eq!(store.check(&token).await.unwrap(), None);
        assert!(revoke(&db, "ci-bot").await.is_err());
        assert_eq!(list(&db).await.unwrap().len(), 1);
    }
}
