//! Schema and migrations, versioned with `PRAGMA user_version`.

use rusqlite::Connection;

/// Each entry migrates from version `index` to `index + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: the event log, append-only by trigger.
    r"
    CREATE TABLE events (
        execution_id TEXT NOT NULL,
        seq          INTEGER NOT NULL CHECK (seq >= 1),
        ts           TEXT NOT NULL,
        kind         TEXT NOT NULL,
        version      INTEGER NOT NULL,
        payload      TEXT NOT NULL,
        prev_hash    TEXT NOT NULL,
        hash         TEXT NOT NULL,
        PRIMARY KEY (execution_id, seq)
    ) STRICT;
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END;
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END;
    CREATE INDEX events_by_kind ON events (kind, execution_id);
    ",
];

pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings `conn` to [`SCHEMA_VERSION`]. Returns the version found before migrating, so the
/// caller can refuse a database from the future.
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<i64> {
    let found: i64 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if found >= SCHEMA_VERSION {
        return Ok(found);
    }
    let tx = conn.transaction()?;
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(usize::try_from(found).unwrap_or(0)) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)?;
    }
    tx.commit()?;
    Ok(found)
}
