//! Schema and migrations, versioned with `PRAGMA user_version`. A migration is never edited
//! once released: databases written by it exist. New needs get a new migration.

use rusqlite::Connection;

/// The executions index derived from the events alone. Migration 2 fills the index with it
/// for databases written before the index existed, and a read-only [`crate::Store`] on such
/// a database answers `list` and `show` with it. A macro, so `concat!` can splice it in.
/// Yields the columns of [`execution_columns`], in that order.
macro_rules! derived_executions {
    () => {
        r"
        SELECT h.execution_id AS execution_id, f.ts AS started_at,
            CASE WHEN f.kind = 'started' THEN json_extract(f.payload, '$.task') END AS task,
            CASE WHEN f.kind = 'started' THEN json_extract(f.payload, '$.loop_type') END AS loop_type,
            CASE WHEN f.kind = 'started' THEN json_extract(f.payload, '$.model') END AS model,
            (SELECT CASE s.kind WHEN 'finish' THEN json_extract(s.payload, '$.task_status')
                                ELSE json_extract(s.payload, '$.to') END
               FROM events s WHERE s.execution_id = h.execution_id
                AND s.kind IN ('finish', 'task_transition') ORDER BY s.seq DESC LIMIT 1) AS task_status,
            (SELECT json_extract(d.payload, '$.termination_reason') FROM events d
              WHERE d.execution_id = h.execution_id AND d.kind = 'finish'
                AND NOT EXISTS (SELECT 1 FROM events r WHERE r.execution_id = h.execution_id
                                AND r.kind = 'resumed' AND r.seq > d.seq)
              ORDER BY d.seq DESC LIMIT 1) AS termination_reason,
            (SELECT json_extract(d.payload, '$.error') FROM events d
              WHERE d.execution_id = h.execution_id AND d.kind = 'finish'
                AND NOT EXISTS (SELECT 1 FROM events r WHERE r.execution_id = h.execution_id
                                AND r.kind = 'resumed' AND r.seq > d.seq)
              ORDER BY d.seq DESC LIMIT 1) AS error,
            (SELECT COALESCE(MAX(json_extract(t.payload, '$.turn')), 0) FROM events t
              WHERE t.execution_id = h.execution_id AND t.kind = 'turn_completed') AS total_turns,
            COALESCE(
              (SELECT json_extract(d.payload, '$.usage.input_tokens') FROM events d
                WHERE d.execution_id = h.execution_id AND d.kind = 'finish' ORDER BY d.seq DESC LIMIT 1),
              (SELECT COALESCE(SUM(json_extract(t.payload, '$.usage.input_tokens')), 0) FROM events t
                WHERE t.execution_id = h.execution_id AND t.kind = 'turn_completed')) AS input_tokens,
            COALESCE(
              (SELECT json_extract(d.payload, '$.usage.output_tokens') FROM events d
                WHERE d.execution_id = h.execution_id AND d.kind = 'finish' ORDER BY d.seq DESC LIMIT 1),
              (SELECT COALESCE(SUM(json_extract(t.payload, '$.usage.output_tokens')), 0) FROM events t
                WHERE t.execution_id = h.execution_id AND t.kind = 'turn_completed')) AS output_tokens,
            COALESCE(
              (SELECT json_extract(d.payload, '$.cost') FROM events d
                WHERE d.execution_id = h.execution_id AND d.kind = 'finish' ORDER BY d.seq DESC LIMIT 1),
              (SELECT COALESCE(SUM(json_extract(t.payload, '$.cost')), 0) FROM events t
                WHERE t.execution_id = h.execution_id AND t.kind = 'turn_completed')) AS cost_micro_usd,
            (SELECT COUNT(*) FROM events r WHERE r.execution_id = h.execution_id AND r.kind = 'resumed') AS resumes
        FROM (SELECT DISTINCT execution_id FROM events) h
        JOIN events f ON f.execution_id = h.execution_id AND f.seq = 1
        "
    };
}

/// The columns of the executions table, in declaration order. The last event's time and
/// sequence number are not stored: they change with every event, and reading them from the
/// events' primary key is as cheap as keeping them, without a second write per append.
macro_rules! execution_columns {
    () => {
        "execution_id, started_at, task, loop_type, model, task_status, termination_reason, \
         error, total_turns, input_tokens, output_tokens, cost_micro_usd, resumes"
    };
}

/// Reads index rows (`x`, the table or the derived query) with their last event (`l`).
macro_rules! with_last_event {
    ($source:expr) => {
        concat!(
            "SELECT x.*, l.ts, l.seq,
                (SELECT json_extract(w.payload, '$.workspace') FROM events w
                  WHERE w.execution_id = x.execution_id AND w.seq = 1 AND w.kind = 'started'),
                (SELECT json_extract(w.payload, '$.parent') FROM events w
                  WHERE w.execution_id = x.execution_id AND w.seq = 1 AND w.kind = 'started'),
                (SELECT json_extract(w.payload, '$.call_id') FROM events w
                  WHERE w.execution_id = x.execution_id AND w.seq = 1 AND w.kind = 'started')
             FROM ",
            $source,
            " x JOIN events l ON l.execution_id = x.execution_id
               AND l.seq = (SELECT MAX(m.seq) FROM events m WHERE m.execution_id = x.execution_id)"
        )
    };
}

/// [`with_last_event`] for logs keyed by `execution_keys` (version 4 on), where an index
/// row holds the turns up to its `as_of` and the turns after it are added from the log.
macro_rules! with_last_keyed_event {
    () => {
        concat!(
            "SELECT x.execution_id, x.started_at, x.task, x.loop_type, x.model, x.task_status,
                x.termination_reason, x.error,
                MAX(x.total_turns, COALESCE(",
            $crate::schema::turns_after_row!("MAX(json_extract(t.payload, '$.turn'))"),
            ", 0)),
                x.input_tokens + ",
            $crate::schema::turns_after_row!(
                "COALESCE(SUM(json_extract(t.payload, '$.usage.input_tokens')), 0)"
            ),
            ",
                x.output_tokens + ",
            $crate::schema::turns_after_row!(
                "COALESCE(SUM(json_extract(t.payload, '$.usage.output_tokens')), 0)"
            ),
            ",
                x.cost_micro_usd + ",
            $crate::schema::turns_after_row!("COALESCE(SUM(json_extract(t.payload, '$.cost')), 0)"),
            ",
                x.resumes, l.ts, l.seq,
                (SELECT json_extract(w.payload, '$.workspace') FROM events w
                  WHERE w.execution = k.key AND w.seq = 1 AND w.kind = 'started'),
                (SELECT json_extract(w.payload, '$.parent') FROM events w
                  WHERE w.execution = k.key AND w.seq = 1 AND w.kind = 'started'),
                (SELECT json_extract(w.payload, '$.call_id') FROM events w
                  WHERE w.execution = k.key AND w.seq = 1 AND w.kind = 'started')
             FROM executions x
             JOIN execution_keys k ON k.execution_id = x.execution_id
             JOIN events l ON l.execution = k.key
              AND l.seq = (SELECT MAX(m.seq) FROM events m WHERE m.execution = k.key)"
        )
    };
}

/// `$aggregate` over the `turn_completed` events (`t`) after the index row's `as_of`.
macro_rules! turns_after_row {
    ($aggregate:literal) => {
        concat!(
            "(SELECT ",
            $aggregate,
            " FROM events t WHERE t.execution = k.key AND t.seq > x.as_of
                AND t.kind = 'turn_completed')"
        )
    };
}

pub(crate) use {
    derived_executions, execution_columns, turns_after_row, with_last_event, with_last_keyed_event,
};

/// Each entry migrates from version `index` to `index + 1`.
pub(crate) const MIGRATIONS: &[&str] = &[
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
    // 2: checkpoints, the archive with its full-text index, and the executions index.
    concat!(
        r"
    CREATE TABLE checkpoints (
        execution_id TEXT NOT NULL,
        seq          INTEGER NOT NULL CHECK (seq >= 1),
        turn         INTEGER NOT NULL CHECK (turn >= 0),
        ts           TEXT NOT NULL,
        snapshot     TEXT NOT NULL,
        sha256       TEXT NOT NULL,
        PRIMARY KEY (execution_id, seq)
    ) STRICT;
    CREATE TRIGGER checkpoints_no_update BEFORE UPDATE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only: UPDATE refused'); END;
    CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
    BEGIN SELECT RAISE(ABORT, 'checkpoints are append-only: DELETE refused'); END;

    CREATE TABLE archive_blocks (
        id           INTEGER PRIMARY KEY,
        block_id     TEXT NOT NULL UNIQUE,
        execution_id TEXT NOT NULL,
        created_seq  INTEGER NOT NULL CHECK (created_seq >= 0),
        ts           TEXT NOT NULL,
        messages     TEXT NOT NULL,
        text         TEXT NOT NULL
    ) STRICT;
    CREATE INDEX archive_by_execution ON archive_blocks (execution_id, created_seq);
    CREATE VIRTUAL TABLE archive_fts USING fts5(
        text, content = 'archive_blocks', content_rowid = 'id',
        tokenize = 'porter unicode61 remove_diacritics 2'
    );
    CREATE TRIGGER archive_blocks_fts AFTER INSERT ON archive_blocks
    BEGIN INSERT INTO archive_fts (rowid, text) VALUES (new.id, new.text); END;
    CREATE TRIGGER archive_blocks_no_update BEFORE UPDATE ON archive_blocks
    BEGIN SELECT RAISE(ABORT, 'archive blocks are append-only: UPDATE refused'); END;
    CREATE TRIGGER archive_blocks_no_delete BEFORE DELETE ON archive_blocks
    BEGIN SELECT RAISE(ABORT, 'archive blocks are append-only: DELETE refused'); END;

    CREATE TABLE executions (
        execution_id       TEXT PRIMARY KEY,
        started_at         TEXT NOT NULL,
        task               TEXT,
        loop_type          TEXT,
        model              TEXT,
        task_status        TEXT,
        termination_reason TEXT,
        error              TEXT,
        total_turns        INTEGER NOT NULL,
        input_tokens       INTEGER NOT NULL,
        output_tokens      INTEGER NOT NULL,
        cost_micro_usd     INTEGER NOT NULL,
        resumes            INTEGER NOT NULL
    ) STRICT, WITHOUT ROWID;
    CREATE INDEX executions_newest ON executions (started_at DESC, execution_id DESC);
    INSERT INTO executions (",
        execution_columns!(),
        ")",
        derived_executions!(),
        ";
    -- Nothing reads events by kind any more (the index above replaced those queries), and
    -- every append paid for this index: with many executions appending at once, its pages
    -- were the ones each group commit rewrote.
    DROP INDEX events_by_kind;
    "
    ),
    // 3: a one-line note per archived block (what it holds), shown by `recall`.
    r"
    ALTER TABLE archive_blocks ADD COLUMN note TEXT NOT NULL DEFAULT '';
    ",
    // 4: events keyed by a small integer per execution, and a checkpoint's snapshot in the
    // row of its `checkpoint` event. Both cut what a commit writes. The key (execution id,
    // seq) repeated the 36-character id in every index entry, so few fitted a page: with
    // many executions appending, a commit rewrote a key page per execution, and a lone
    // one split its key page every few appends. The checkpoints table cost every
    // checkpointing commit a row page, a key page and, as both grew, new pages and the
    // database header, for a few hundred bytes. The executions row summarises the events
    // up to `as_of`: a turn's totals are written with a later commit, and readers add the
    // turns after `as_of` from the log. The events are copied with every column's
    // bytes and their order (rowid) unchanged, so the chain verifies as before; the
    // snapshot stays outside it, checked against the SHA-256 its event records.
    r"
    CREATE TABLE execution_keys (
        key          INTEGER PRIMARY KEY,
        execution_id TEXT NOT NULL UNIQUE
    ) STRICT;
    INSERT INTO execution_keys (execution_id)
        SELECT execution_id FROM events GROUP BY execution_id ORDER BY MIN(rowid);
    CREATE TABLE events_keyed (
        execution_id TEXT NOT NULL,
        seq          INTEGER NOT NULL CHECK (seq >= 1),
        ts           TEXT NOT NULL,
        kind         TEXT NOT NULL,
        version      INTEGER NOT NULL,
        payload      TEXT NOT NULL,
        prev_hash    TEXT NOT NULL,
        hash         TEXT NOT NULL,
        execution    INTEGER NOT NULL,
        snapshot     TEXT,
        PRIMARY KEY (execution, seq)
    ) STRICT;
    INSERT INTO events_keyed (rowid, execution_id, seq, ts, kind, version, payload, prev_hash,
                              hash, execution, snapshot)
        SELECT e.rowid, e.execution_id, e.seq, e.ts, e.kind, e.version, e.payload, e.prev_hash,
               e.hash, k.key,
               (SELECT c.snapshot FROM checkpoints c
                 WHERE c.execution_id = e.execution_id AND c.seq = e.seq AND e.kind = 'checkpoint')
          FROM events e JOIN execution_keys k ON k.execution_id = e.execution_id
         ORDER BY e.rowid;
    DROP TABLE events;
    DROP TABLE checkpoints;
    ALTER TABLE events_keyed RENAME TO events;
    CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END;
    CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END;
    ALTER TABLE executions ADD COLUMN as_of INTEGER NOT NULL DEFAULT 0;
    UPDATE executions SET as_of = COALESCE(
        (SELECT MAX(e.seq) FROM execution_keys k JOIN events e ON e.execution = k.key
          WHERE k.execution_id = executions.execution_id), 0);
    ",
    // 5: the API tokens of `nerve serve` (`nerve token create|list|revoke`), stored as the
    // SHA-256 of the token (docs/api.md says why that is enough for a 256-bit random token).
    // A revoked token keeps its row (revoked_at set), so its name is not reused by mistake.
    r"
    CREATE TABLE api_tokens (
        name         TEXT PRIMARY KEY,
        hash         TEXT NOT NULL UNIQUE,
        scope        TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        last_used_at TEXT,
        revoked_at   TEXT
    ) STRICT;
    ",
];

pub(crate) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The first version with checkpoints, the archive and the executions index.
pub(crate) const V2: i64 = 2;
/// The first version with a note per archive block.
pub(crate) const V3: i64 = 3;
/// The first version with events keyed by `execution_keys` and snapshots in their
/// checkpoint events' rows.
pub(crate) const V4: i64 = 4;

/// Brings `conn` to [`SCHEMA_VERSION`]. Returns the version found before migrating, so the
/// caller can refuse a database from the future.
pub(crate) fn migrate(conn: &mut Connection) -> rusqlite::Result<i64> {
    let found = user_version(conn)?;
    if found >= SCHEMA_VERSION {
        return Ok(found);
    }
    // Immediate: two processes opening a fresh database at once must not both migrate.
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let current: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    for (index, sql) in MIGRATIONS
        .iter()
        .enumerate()
        .skip(usize::try_from(current).unwrap_or(0))
    {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", index as i64 + 1)?;
    }
    tx.commit()?;
    Ok(found)
}

pub(crate) fn user_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}
