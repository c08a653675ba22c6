//! The log's own order across executions: every event has a [`LogPosition`], and the events
//! after a position are read in that order, so a reader that follows the whole log (the
//! log-wide event stream of `nerve serve`) and resumes after the last position it saw gets
//! every event exactly once.
//!
//! - **SQLite**: the events table's rowid. SQLite runs one write transaction at a time and
//!   gives a new row the largest rowid plus one, and rows are never deleted (a trigger
//!   refuses it), so rowids grow in commit order: a reader that saw rowid N has seen every
//!   committed row at or below N, and everything committed later lies above it.
//! - **PostgreSQL**: many processes commit at once, and no counter handed out inside their
//!   transactions grows in commit order (a transaction that took 7 may commit after one
//!   that took 8). Each event row records the id of the transaction that wrote it (`tx`,
//!   a 64-bit `xid8`) and a row number (`log_id`); the order is `(tx, log_id)`, and a read
//!   returns only rows whose transaction is below its snapshot's `xmin`: every transaction
//!   there has ended, and every transaction that has not ended yet, or starts later, has
//!   an id at or above that `xmin`. So a reader never skips a row that commits later, at
//!   the price of waiting for the oldest writing transaction in flight (an append is short).

use crate::SessionError;
use crate::chain::StoredEvent;
use crate::pg::PgStore;
use crate::store::{Store, stored_event, to_i64, to_u64};

/// Where an event lies in its log's order. Its text form ([`std::fmt::Display`],
/// [`std::str::FromStr`]) is what a client keeps and sends back: `N` on a SQLite log (the
/// row's id), `T.N` on a PostgreSQL log (the writing transaction's id, the row's number).
/// `0` is the start of either log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogPosition {
    /// A SQLite log's rowid (0: before the first event).
    Row(u64),
    /// A PostgreSQL log's writing transaction and row number.
    Tx { tx: u64, row: u64 },
}

impl LogPosition {
    /// Before every event of any log.
    pub const START: Self = Self::Row(0);
}

impl std::fmt::Display for LogPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Row(row) => write!(f, "{row}"),
            Self::Tx { tx, row } => write!(f, "{tx}.{row}"),
        }
    }
}

/// Why a text is not a [`LogPosition`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a position in the log (N on a SQLite log, T.N on a PostgreSQL log)")]
pub struct BadPosition(pub String);

impl std::str::FromStr for LogPosition {
    type Err = BadPosition;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadPosition(text.to_owned());
        let number = |digits: &str| {
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            digits.parse::<u64>().map_err(|_| bad())
        };
        let text = text.trim();
        match text.split_once('.') {
            None => Ok(Self::Row(number(text)?)),
            Some((tx, row)) => Ok(Self::Tx {
                tx: number(tx)?,
                row: number(row)?,
            }),
        }
    }
}

/// One event with its place in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    pub position: LogPosition,
    pub event: StoredEvent,
}

/// The events after `after` in the log's order, at most `limit`.
const SQLITE_AFTER: &str =
    "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash, rowid
     FROM events WHERE rowid > ?1 ORDER BY rowid LIMIT ?2";

impl Store {
    /// The position of the last event committed (`0` for an empty log): following the log
    /// from here gets the events appended from now on.
    pub fn log_end(&self) -> Result<LogPosition, SessionError> {
        let row: i64 = self
            .conn
            .query_row("SELECT COALESCE(MAX(rowid), 0) FROM events", [], |row| {
                row.get(0)
            })
            .map_err(|e| self.sql_err(e))?;
        Ok(LogPosition::Row(to_u64(row)))
    }

    /// The events committed after `after`, in the log's order, at most `limit`.
    pub fn log_events_after(
        &self,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEvent>, SessionError> {
        let LogPosition::Row(after) = after else {
            return Err(SessionError::Corrupt(format!(
                "position {after} belongs to a PostgreSQL log, not to the SQLite log {}",
                self.path()
            )));
        };
        let mut stmt = self
            .conn
            .prepare_cached(SQLITE_AFTER)
            .map_err(|e| self.sql_err(e))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt
            .query_map(rusqlite::params![to_i64(after), limit], |row| {
                Ok(LogEvent {
                    position: LogPosition::Row(to_u64(row.get(8)?)),
                    event: stored_event(row)?,
                })
            })
            .map_err(|e| self.sql_err(e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(|e| self.sql_err(e))
    }
}

/// The events after `($1, $2)` in the log's order whose transactions have all ended, at
/// most `$3`.
const PG_AFTER: &str = "SELECT execution_id, seq, ts, kind, version, payload, prev_hash, hash,
            tx::text::int8, log_id
     FROM events
     WHERE (tx, log_id) > ($1::int8::text::xid8, $2)
       AND tx < pg_snapshot_xmin(pg_current_snapshot())
     ORDER BY tx, log_id LIMIT $3";

impl PgStore {
    /// A position before every event not yet committed and after every event a reader can
    /// see complete now: following the log from here gets the events committed from now
    /// on (and perhaps a few committed a moment ago).
    pub async fn log_end(&self) -> Result<LogPosition, SessionError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::int8",
                &[],
            )
            .await
            .map_err(|e| self.db_err(&e))?;
        let xmin: i64 = row.try_get(0).map_err(|e| self.db_err(&e))?;
        Ok(LogPosition::Tx {
            tx: to_u64(xmin),
            row: 0,
        })
    }

    /// The events after `after` in the log's order, at most `limit`: only those whose
    /// writing transactions have all ended, so none can appear before them later.
    pub async fn log_events_after(
        &self,
        after: LogPosition,
        limit: usize,
    ) -> Result<Vec<LogEvent>, SessionError> {
        let (tx, row) = match after {
            LogPosition::Tx { tx, row } => (tx, row),
            LogPosition::Row(0) => (0, 0),
            LogPosition::Row(_) => {
                return Err(SessionError::Corrupt(format!(
                    "position {after} belongs to a SQLite log, not to the PostgreSQL log {}",
                    self.url()
                )));
            }
        };
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(PG_AFTER, &[&to_i64(tx), &to_i64(row), &limit])
            .await
            .map_err(|e| self.db_err(&e))?;
        rows.iter()
            .map(|row| {
                Ok(LogEvent {
                    position: LogPosition::Tx {
                        tx: to_u64(row.try_get(8)?),
                        row: to_u64(row.try_get(9)?),
                    },
                    event: crate::pg::stored_event(row)?,
                })
            })
            .collect::<Result<Vec<_>, tokio_postgres::Error>>()
            .map_err(|e| self.db_err(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<LogPosition, ()>) {
        let parsed = text.parse::<LogPosition>().map_err(|_| ());
        assert_eq!(parsed, expected, "{text:?}");
        if let Ok(position) = parsed {
            assert_eq!(position.to_string(), text.trim(), "round trip");
        }
    }

    #[test]
    fn a_position_is_a_row_or_a_transaction_and_row() {
        check("0", Ok(LogPosition::START));
        check("42", Ok(LogPosition::Row(42)));
        check(" 42 ", Ok(LogPosition::Row(42)));
        check("755.12", Ok(LogPosition::Tx { tx: 755, row: 12 }));
        check("", Err(()));
        check("-1", Err(()));
        check("+1", Err(()));
        check("1.", Err(()));
        check(".1", Err(()));
        check("1.2.3", Err(()));
        check("seven", Err(()));
        check("99999999999999999999", Err(()));
    }

    #[test]
    fn positions_of_one_log_are_ordered_like_its_events() {
        assert!(LogPosition::Row(2) > LogPosition::Row(1));
        let at = |tx, row| LogPosition::Tx { tx, row };
        assert!(at(8, 1) > at(7, 100));
        assert!(at(7, 2) > at(7, 1));
    }
}
