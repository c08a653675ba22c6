//! The API tokens of `nerve serve` (`nerve token create|list|revoke`), in the log's
//! database: what a token may do ([`Scope`]), and creating, listing, revoking and
//! checking tokens through the log. Only a SQLite log holds them for now.

use std::path::Path;

use nerve_session::Store;
pub use nerve_session::{TOKEN_PREFIX, TokenRecord};

/// The log's database opened for its tokens ([`open`]).
pub type TokenStore = Store;

use crate::RuntimeError;

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
pub fn open(db: &Path) -> Result<Store, RuntimeError> {
    if crate::log::is_postgres(db) {
        return Err(RuntimeError::usage(
            "API tokens live in a SQLite log for now: run `nerve serve` and `nerve token` with --db on a SQLite file",
        ));
    }
    Store::open(db).map_err(RuntimeError::from)
}

/// A new token named `name` with `scope`: returned once, stored hashed.
pub fn create(db: &Path, name: &str, scope: Scope) -> Result<String, RuntimeError> {
    check_name(name)?;
    open(db)?
        .create_token(name, scope.name())
        .map_err(RuntimeError::from)?
        .ok_or_else(|| {
            RuntimeError::conflict(format!(
                "a token named {name} exists (revoked tokens keep their names): choose another name"
            ))
        })
}

/// Every token, oldest first (never the tokens themselves).
pub fn list(db: &Path) -> Result<Vec<TokenRecord>, RuntimeError> {
    open(db)?.tokens().map_err(RuntimeError::from)
}

/// Revokes the token named `name`; it stops working at once.
pub fn revoke(db: &Path, name: &str) -> Result<(), RuntimeError> {
    if open(db)?.revoke_token(name).map_err(RuntimeError::from)? {
        Ok(())
    } else {
        Err(RuntimeError::NotFound(format!(
            "no live token named {name} (see `nerve token list`)"
        )))
    }
}

/// The scope of the live token `token` in `store`, its use recorded; `None` when it is
/// unknown or revoked (or names a scope this nerve does not know).
pub fn check(store: &Store, token: &str) -> Result<Option<(String, Scope)>, RuntimeError> {
    let Some(record) = store.use_token(token).map_err(RuntimeError::from)? else {
        return Ok(None);
    };
    Ok(record.scope.parse().ok().map(|scope| (record.name, scope)))
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

    #[test]
    fn tokens_are_created_checked_and_revoked_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("nerve.db");
        let token = create(&db, "ci-bot", Scope::Run).unwrap();
        assert!(create(&db, "ci-bot", Scope::Read).is_err());
        assert!(create(&db, "no spaces", Scope::Read).is_err());
        let store = open(&db).unwrap();
        assert_eq!(
            check(&store, &token).unwrap(),
            Some(("ci-bot".to_owned(), Scope::Run))
        );
        revoke(&db, "ci-bot").unwrap();
        assert_eq!(check(&store, &token).unwrap(), None);
        assert!(revoke(&db, "ci-bot").is_err());
        assert_eq!(list(&db).unwrap().len(), 1);
    }
}
