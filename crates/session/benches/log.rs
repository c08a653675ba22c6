//! Event log benchmarks, each beside the anchor it is judged against, measured in the same
//! run on the same disk (a temporary directory under `$TMPDIR`, default `/tmp`):
//!
//! - `append::durable` (one durable append through `SqliteSink`, after 100 or 100,000
//!   prior events of the same execution) vs `append::fdatasync_overwrite` and
//!   `append::fdatasync_append` (write the same number of bytes to a plain file and
//!   `fdatasync` it, over allocated blocks or growing the file); in the paired report
//!   only, a turn's 4-event `EventSink::commit` vs one `fdatasync`ed write of the same
//!   4 records;
//! - `batch::batched` (one execution appending 10,240 events through the batch API, 1,024
//!   a call), `batch::burst` (10,240 appends from 1,024 executions, all in flight at once)
//!   and `batch::group_commit` (the same from 50 or 1,024 concurrent appenders, each awaiting
//!   its appends) through one sink, vs `batch::one_transaction` (the same rows, in the same
//!   order, inserted in one transaction);
//! - `replay::store_replay` (replay of a 100,000-event execution from the database) vs
//!   `replay::raw_scan` (an ordered `SELECT` of the same rows, every column read).
//!
//! Run with `cargo xtask bench session` (or `cargo bench -p nerve-session`); see
//! docs/benchmarks.md for the figures.
//!
//! The disk and the cores are shared, and their speed drifts over seconds, so medians of
//! benchmarks run one after the other can disagree by 10x. After divan's table, a run
//! without arguments therefore prints a paired report: subject and anchor interleaved round
//! by round, the ratio taken within each round, and the median of those ratios shown.
//! `cargo bench -p nerve-session -- paired [append] [batch] [replay]` prints only that
//! report (or the parts named), without divan's table.

use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use divan::{Bencher, black_box};
use nerve_core::event::{
    CallPurpose, ContextCreated, MessageAppended, ModelCalled, Started, TaskTransition,
    ToolCallFinished, ToolCallStarted, TurnCompleted,
};
use nerve_core::{
    Event, EventSink, ExecutionId, LoopType, Message, MessagePart, MessageRole, MicroUsd, Redactor,
    TaskId, TaskStatus, TokenUsage, ToolCall, ToolResult,
};
use nerve_session::{EventStore as _, SqliteSink, Store, StoredEvent};

fn main() {
    // `cargo bench -p nerve-session -- paired [append|batch|replay]...`: the paired
    // report alone (or some of its parts), without divan's table.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().is_some_and(|arg| arg == "paired") {
        paired::report(&args[1..]);
        return;
    }
    divan::main();
    // Any argument (a filter, an option) asks for something narrower than the full report.
    if args.is_empty() {
        paired::report(&[]);
    }
}

/// Appends per batch benchmark iteration.
const BATCH: usize = 10_240;
/// Events in the replayed execution.
const REPLAYED: usize = 100_000;

fn runtime() -> tokio::runtime::Runtime {
    #[allow(clippy::expect_used)] // A benchmark without a runtime cannot run at all.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn tempdir() -> tempfile::TempDir {
    #[allow(clippy::expect_used)]
    tempfile::tempdir().expect("temporary directory")
}

fn ok<T, E: std::fmt::Debug>(result: Result<T, E>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => panic!("benchmark setup failed: {error:?}"),
    }
}

fn started() -> Event {
    Event::Started(Started {
        task_id: TaskId::new(),
        task: "make the failing test in crates/parser pass".into(),
        workspace: "/home/me/repo".into(),
        loop_type: LoopType::React,
        provider: "script:bench.jsonl".into(),
        model: "scripted".into(),
        max_turns: 100_000,
        config: serde_json::json!({"timeout_secs": null, "context_window": 128_000}),
        parent: None,
        call_id: None,
        fork: None,
    })
}

/// The events of one realistic turn: the model call, the assistant message with a tool
/// call, the call's intent and outcome, the tool result message, the turn record.
fn turn_events(turn: u32, index: u32) -> Vec<Event> {
    let call = ToolCall {
        id: format!("call_{turn}").as_str().into(),
        name: "shell".into(),
        arguments: serde_json::json!({"command": format!("cargo test -p parser -- case_{turn}")}),
    };
    let output = format!(
        "running 1 test\ntest case_{turn} ... FAILED\n{}\n",
        "assertion failed: left == right; ".repeat(8)
    );
    let result = ToolResult {
        call_id: call.id.clone(),
        name: "shell".into(),
        content: output,
        is_error: true,
    };
    vec![
        Event::ModelCalled(ModelCalled {
            turn,
            purpose: CallPurpose::Agent,
            outcome: nerve_core::event::CallOutcome::Ok,
            usage: TokenUsage::new(12_000, 180),
            time_to_first_token_ms: None,
            tokens_per_second: None,
        }),
        Event::MessageAppended(MessageAppended {
            index,
            message: Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Text {
                        text: format!("Turn {turn}: running the failing test again."),
                    },
                    MessagePart::ToolCall(call.clone()),
                ],
                pinned: false,
            },
        }),
        Event::ToolCallStarted(ToolCallStarted {
            turn,
            call,
            repaired: None,
        }),
        Event::ToolCallFinished(ToolCallFinished {
            turn,
            result: result.clone(),
            duration_ms: 840,
            interrupted: false,
            child: None,
        }),
        Event::MessageAppended(MessageAppended {
            index: index + 1,
            message: Message::tool_result(result),
        }),
        Event::TurnCompleted(TurnCompleted {
            turn,
            usage: TokenUsage::new(12_000, 180),
            cost: MicroUsd(38_700),
            tool_calls: vec!["shell".into()],
            finish: nerve_core::FinishReason::ToolCalls,
            duration_ms: 1_900,
        }),
    ]
}

/// The first `count` events of a long run.
fn run_events(count: usize) -> Vec<Event> {
    let mut events = vec![
        started(),
        Event::ContextCreated(ContextCreated {
            context_window: Some(128_000),
            tools: vec!["shell".into()],
        }),
        Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        }),
        Event::MessageAppended(MessageAppended {
            index: 0,
            message: Message::system("You are Nerve."),
        }),
    ];
    let mut turn = 1;
    while events.len() < count {
        events.extend(turn_events(turn, 2 * turn - 1));
        turn += 1;
    }
    events.truncate(count);
    events
}

/// A database holding one execution with `count` events, written in large transactions.
fn populated(dir: &Path, count: usize) -> (PathBuf, ExecutionId) {
    let path = dir.join("log.db");
    let mut store = ok(Store::open(&path));
    let id = ExecutionId::new();
    let redactor = Redactor::new();
    for chunk in run_events(count).chunks(10_000) {
        ok(store.append(&id, chunk, &redactor));
    }
    (path, id)
}

/// The event each durable append writes: a tool outcome, the most common large event.
fn appended_event() -> Event {
    turn_events(7, 13).swap_remove(3)
}

/// A sink appending to an execution that already has `prior` events.
struct AppendFixture {
    _dir: tempfile::TempDir,
    sink: SqliteSink,
    rt: tokio::runtime::Runtime,
    id: ExecutionId,
    event: Event,
}

impl AppendFixture {
    fn new(prior: usize) -> Self {
        let dir = tempdir();
        let (path, id) = populated(dir.path(), prior);
        let sink = ok(SqliteSink::open(&path, Arc::new(Redactor::new())));
        Self {
            _dir: dir,
            sink,
            rt: runtime(),
            id,
            event: appended_event(),
        }
    }

    fn append(&self) -> u64 {
        ok(self
            .rt
            .block_on(self.sink.append(self.id, black_box(self.event.clone()))))
    }

    /// A turn's worth of events committed at once, as the engine does (a few events in one
    /// durable write; here the model call, the assistant message, a tool call's intent and
    /// its outcome).
    fn commit(&self, events: &[Event]) {
        ok(self
            .rt
            .block_on(self.sink.commit(self.id, black_box(events.to_vec()), None)));
    }
}

/// The four events of [`AppendFixture::commit`].
fn committed_events() -> Vec<Event> {
    let mut turn = turn_events(7, 13);
    turn.truncate(4);
    turn
}

/// A plain file written the way the log would be, without SQLite.
struct RawFile {
    _dir: tempfile::TempDir,
    appended: std::fs::File,
    overwritten: std::fs::File,
    record: String,
    offset: u64,
}

/// One stored event as a line of text: the payload, the ids and the two hashes.
fn raw_record(event: &Event) -> String {
    let payload = ok(serde_json::to_string(event));
    format!(
        "{}\t{}\t{payload}\t{}\t{}\n",
        ExecutionId::new(),
        7,
        "0".repeat(64),
        "0".repeat(64)
    )
}

/// The overwritten file's size: written once, then reused round robin.
const SPAN: u64 = 4 << 20;

impl RawFile {
    fn new() -> Self {
        let dir = tempdir();
        let appended = ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("appended.log")));
        let overwritten = ok(std::fs::File::create(dir.path().join("overwritten.log")));
        ok(overwritten.write_all_at(&vec![0u8; SPAN as usize], 0));
        ok(overwritten.sync_all());
        let record = raw_record(&appended_event());
        Self {
            _dir: dir,
            appended,
            overwritten,
            record,
            offset: 0,
        }
    }

    /// Appends the record and makes it durable: the file grows, so `fdatasync` also
    /// commits its new size.
    fn append(&mut self) {
        ok(self.appended.write_all(black_box(self.record.as_bytes())));
        ok(self.appended.sync_data());
    }

    /// Writes the record over allocated blocks and makes it durable: no size to commit, as
    /// SQLite's write-ahead log once it has grown. The cheapest durable write there is.
    fn overwrite(&mut self) {
        ok(self
            .overwritten
            .write_all_at(black_box(self.record.as_bytes()), self.offset));
        ok(self.overwritten.sync_data());
        self.offset = (self.offset + self.record.len() as u64) % (SPAN - self.record.len() as u64);
    }

    /// Writes `records` (one line of text per event) over allocated blocks in one write,
    /// and makes them durable.
    fn overwrite_all(&mut self, records: &str) {
        ok(self
            .overwritten
            .write_all_at(black_box(records.as_bytes()), self.offset));
        ok(self.overwritten.sync_data());
        self.offset = (self.offset + records.len() as u64) % (SPAN - records.len() as u64);
    }
}

/// A fresh, empty log and its sink (the directory goes with it).
fn fresh_sink() -> (Arc<SqliteSink>, tempfile::TempDir) {
    let dir = tempdir();
    let sink = Arc::new(ok(SqliteSink::open(
        &dir.path().join("log.db"),
        Arc::new(Redactor::new()),
    )));
    (sink, dir)
}

/// 10,240 appends from `appenders` concurrent executions, each awaiting its appends in
/// order, through one sink; returns how long they took.
fn group_commit(
    rt: &tokio::runtime::Runtime,
    sink: &Arc<SqliteSink>,
    events: &[Event],
    appenders: usize,
) -> Duration {
    let per = BATCH / appenders;
    let start = Instant::now();
    rt.block_on(async {
        let tasks: Vec<_> = (0..appenders)
            .map(|_| {
                let sink = Arc::clone(sink);
                let events = events[..per].to_vec();
                tokio::spawn(async move {
                    let id = ExecutionId::new();
                    for event in events {
                        ok(sink.append(id, event).await);
                    }
                })
            })
            .collect();
        for task in tasks {
            ok(task.await);
        }
    });
    start.elapsed()
}

/// The same 10,240 appends as `group_commit` with 1,024 appenders, all in flight at once:
/// each append is its own task, nobody waits for one append before making the next. What
/// the writer does when it is never short of work.
fn burst(rt: &tokio::runtime::Runtime, sink: &Arc<SqliteSink>, events: &[Event]) -> Duration {
    let per = BATCH / 1024;
    let start = Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::with_capacity(BATCH);
        for _ in 0..1024 {
            let id = ExecutionId::new();
            for event in &events[..per] {
                let (sink, event) = (Arc::clone(sink), event.clone());
                tasks.push(tokio::spawn(
                    async move { ok(sink.append(id, event).await) },
                ));
            }
        }
        for task in tasks {
            ok(task.await);
        }
    });
    start.elapsed()
}

/// Events per call of [`batched`].
const CHUNK: usize = 1024;

/// One execution appending 10,240 events through the batch API, `CHUNK` events a call,
/// each call awaited (one transaction each); returns how long they took.
fn batched(rt: &tokio::runtime::Runtime, sink: &Arc<SqliteSink>, events: &[Event]) -> Duration {
    let start = Instant::now();
    rt.block_on(async {
        let id = ExecutionId::new();
        for chunk in events.chunks(CHUNK) {
            ok(sink.append_all(id, chunk.to_vec()).await);
        }
    });
    start.elapsed()
}

/// The rows one execution appends in the batch benchmark (`BATCH / appenders` of them),
/// already encoded and hashed.
fn batch_rows(appenders: usize) -> Vec<StoredEvent> {
    let source = tempdir();
    let (path, id) = populated(source.path(), BATCH / appenders);
    ok(ok(Store::open_read_only(&path)).events(&id))
}

/// A fresh database with the store's schema, opened with the writer's settings.
fn fresh_connection() -> (rusqlite::Connection, tempfile::TempDir) {
    let dir = tempdir();
    let path = dir.path().join("log.db");
    drop(ok(Store::open(&path)));
    let conn = ok(rusqlite::Connection::open(&path));
    ok(conn.pragma_update(None, "synchronous", "FULL"));
    ok(conn.pragma_update(None, "cache_size", -16_384));
    (conn, dir)
}

/// The anchor: the same rows as `group_commit` with as many appenders, in the order it
/// appends them (each execution's first event, then each one's second, ...), inserted in
/// one transaction through one prepared statement, after each execution's key; returns
/// how long it took.
fn one_transaction(
    conn: &mut rusqlite::Connection,
    rows: &[StoredEvent],
    appenders: usize,
) -> Duration {
    let ids: Vec<String> = (0..appenders)
        .map(|_| ExecutionId::new().to_string())
        .collect();
    let start = Instant::now();
    let tx = ok(conn.transaction());
    {
        let mut key = ok(tx.prepare("INSERT INTO execution_keys (execution_id) VALUES (?1)"));
        let keys: Vec<i64> = ids
            .iter()
            .map(|id| {
                ok(key.execute([id]));
                tx.last_insert_rowid()
            })
            .collect();
        let mut insert = ok(tx.prepare(
            "INSERT INTO events (execution_id, seq, ts, kind, version, payload, prev_hash, hash,
                                 execution)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        ));
        for row in rows {
            for (id, key) in ids.iter().zip(&keys) {
                ok(insert.execute(rusqlite::params![
                    id,
                    row.seq as i64,
                    row.ts,
                    row.kind,
                    row.version,
                    row.payload,
                    row.prev_hash,
                    row.hash,
                    key
                ]));
            }
        }
    }
    ok(tx.commit());
    start.elapsed()
}

/// The anchor of replay: an ordered `SELECT` of the execution's rows, every column read
/// (text as borrowed, UTF-8 checked strings), nothing decoded.
fn raw_scan(conn: &rusqlite::Connection, id: &str) -> usize {
    let mut stmt = ok(conn.prepare_cached(
        "SELECT e.execution_id, e.seq, e.ts, e.kind, e.version, e.payload, e.prev_hash, e.hash
         FROM execution_keys k JOIN events e ON e.execution = k.key
         WHERE k.execution_id = ?1 AND e.seq > ?2 ORDER BY e.seq",
    ));
    let mut rows = ok(stmt.query(rusqlite::params![id, 0]));
    let (mut count, mut bytes) = (0usize, 0usize);
    while let Some(row) = ok(rows.next()) {
        for column in [0, 2, 3, 5, 6, 7] {
            bytes += ok(ok(row.get_ref(column)).as_str()).len();
        }
        bytes += ok(row.get::<_, i64>(1)) as usize + ok(row.get::<_, i64>(4)) as usize;
        count += 1;
    }
    assert_eq!(count, REPLAYED);
    bytes
}

fn store_replay(store: &Store, id: &ExecutionId) -> u32 {
    let replayed = ok(store.replay(id));
    assert_eq!(replayed.events, REPLAYED as u64);
    replayed.score
}

mod append {
    use super::*;

    #[divan::bench(args = [100, 100_000], sample_count = 300)]
    fn durable(bencher: Bencher, prior: usize) {
        let fixture = AppendFixture::new(prior);
        bencher.bench_local(|| fixture.append());
    }

    #[divan::bench(sample_count = 300)]
    fn fdatasync_append(bencher: Bencher) {
        let mut raw = RawFile::new();
        bencher.bench_local(|| raw.append());
    }

    #[divan::bench(sample_count = 300)]
    fn fdatasync_overwrite(bencher: Bencher) {
        let mut raw = RawFile::new();
        bencher.bench_local(|| raw.overwrite());
    }
}

mod batch {
    use super::*;

    #[divan::bench(args = [50, 1024], sample_count = 10, sample_size = 1)]
    fn group_commit(bencher: Bencher, appenders: usize) {
        let rt = runtime();
        let events = run_events(BATCH / appenders);
        bencher.with_inputs(fresh_sink).bench_local_values(|fresh| {
            (
                super::group_commit(&rt, &fresh.0, &events, appenders),
                fresh,
            )
        });
    }

    #[divan::bench(sample_count = 10, sample_size = 1)]
    fn burst(bencher: Bencher) {
        let rt = runtime();
        let events = run_events(BATCH / 1024);
        bencher
            .with_inputs(fresh_sink)
            .bench_local_values(|fresh| (super::burst(&rt, &fresh.0, &events), fresh));
    }

    #[divan::bench(sample_count = 10, sample_size = 1)]
    fn batched(bencher: Bencher) {
        let rt = runtime();
        let events = run_events(BATCH);
        bencher
            .with_inputs(fresh_sink)
            .bench_local_values(|fresh| (super::batched(&rt, &fresh.0, &events), fresh));
    }

    #[divan::bench(args = [1, 50, 1024], sample_count = 10, sample_size = 1)]
    fn one_transaction(bencher: Bencher, appenders: usize) {
        let rows = batch_rows(appenders);
        bencher
            .with_inputs(fresh_connection)
            .bench_local_values(|mut fresh| {
                (
                    super::one_transaction(&mut fresh.0, &rows, appenders),
                    fresh,
                )
            });
    }
}

mod replay {
    use super::*;

    /// `Store::replay`: rows streamed into replay, chain verified, conversation rebuilt.
    #[divan::bench(sample_count = 10, sample_size = 1)]
    fn store_replay(bencher: Bencher) {
        let dir = tempdir();
        let (path, id) = populated(dir.path(), REPLAYED);
        let store = ok(Store::open_read_only(&path));
        bencher.bench_local(|| super::store_replay(&store, &id));
    }

    /// `Store::events` then `replay`: what a caller holding the rows pays.
    #[divan::bench(sample_count = 10, sample_size = 1)]
    fn events_then_replay(bencher: Bencher) {
        let dir = tempdir();
        let (path, id) = populated(dir.path(), REPLAYED);
        let store = ok(Store::open_read_only(&path));
        bencher.bench_local(|| {
            let events = ok(store.events(&id));
            nerve_session::replay(&id.to_string(), &events).score
        });
    }

    #[divan::bench(sample_count = 10, sample_size = 1)]
    fn raw_scan(bencher: Bencher) {
        let dir = tempdir();
        let (path, id) = populated(dir.path(), REPLAYED);
        let conn = ok(rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        ));
        let id = id.to_string();
        bencher.bench_local(|| super::raw_scan(&conn, &id));
    }
}

/// Subjects and anchors interleaved round by round; the ratio is taken within each round.
mod paired {
    use super::*;

    fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    }

    /// Mean time of `n` calls.
    fn time(n: u32, mut f: impl FnMut()) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            f();
        }
        start.elapsed() / n
    }

    fn line(text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{text}");
    }

    fn ms(d: Duration) -> String {
        format!("{:.3} ms", d.as_secs_f64() * 1e3)
    }

    /// The parts named in `only`, or all of them.
    pub(super) fn report(only: &[String]) {
        let wanted = |part: &str| only.is_empty() || only.iter().any(|o| o == part);
        line("\npaired report (median over rounds of the ratio within each round)");
        if wanted("append") {
            append();
        }
        if wanted("batch") {
            batch();
        }
        if wanted("replay") {
            replay();
        }
    }

    fn append() {
        const ROUNDS: usize = 40;
        const EACH: u32 = 10;
        let (short, long, mut raw) = (
            AppendFixture::new(100),
            AppendFixture::new(100_000),
            RawFile::new(),
        );
        // The store written directly on this thread: what the writer thread's hop costs.
        let direct_dir = tempdir();
        let (direct_path, direct_id) = populated(direct_dir.path(), 100);
        let mut direct = ok(Store::open(&direct_path));
        let (redactor, event) = (Redactor::new(), [appended_event()]);
        let committed = committed_events();
        let records: String = committed.iter().map(raw_record).collect();
        let mut rows: Vec<[Duration; 7]> = Vec::new();
        for round in 0..ROUNDS {
            let mut times = [Duration::ZERO; 7];
            // Rotate the order, so no subject always follows the same one.
            for k in 0..7 {
                let which = (round + k) % 7;
                times[which] = match which {
                    0 => time(EACH, || {
                        short.append();
                    }),
                    1 => time(EACH, || {
                        long.append();
                    }),
                    2 => time(EACH, || raw.overwrite()),
                    3 => time(EACH, || raw.append()),
                    5 => time(EACH, || short.commit(&committed)),
                    6 => time(EACH, || raw.overwrite_all(&records)),
                    _ => time(EACH, || {
                        ok(direct.append(&direct_id, &event, &redactor));
                    }),
                };
            }
            rows.push(times);
        }
        let ratio = |a: usize, b: usize| {
            median(
                rows.iter()
                    .map(|t| t[a].as_secs_f64() / t[b].as_secs_f64())
                    .collect(),
            )
        };
        let med = |a: usize| {
            Duration::from_secs_f64(median(rows.iter().map(|t| t[a].as_secs_f64()).collect()))
        };
        line(&format!(
            "append: durable append {} (100 prior) / {} (100,000 prior); fdatasync overwrite {}, append {}",
            ms(med(0)),
            ms(med(1)),
            ms(med(2)),
            ms(med(3))
        ));
        line(&format!(
            "  durable append / fdatasync overwrite: {:.2}x (target <= 1.5x)",
            ratio(0, 2)
        ));
        line(&format!(
            "  durable append / fdatasync append:    {:.2}x",
            ratio(0, 3)
        ));
        line(&format!(
            "  100,000 prior / 100 prior:             {:.2}x (flat: ~1.0x)",
            ratio(1, 0)
        ));
        line(&format!(
            "  Store::append on the caller's thread / fdatasync overwrite: {:.2}x",
            ratio(4, 2)
        ));
        line(&format!(
            "commit of a turn's 4 events (EventSink::commit) {}; fdatasync overwrite of the same 4 records {}",
            ms(med(5)),
            ms(med(6))
        ));
        line(&format!(
            "  4-event commit / fdatasync overwrite of 4 records: {:.2}x",
            ratio(5, 6)
        ));
    }

    fn batch() {
        const ROUNDS: usize = 7;
        let rt = runtime();
        let events = run_events(BATCH);
        // (label, appenders awaiting their appends, 0 for all appends in flight at once,
        // or 1 for one execution appending through the batch API)
        for (label, appenders) in [
            ("one execution, 1,024 events a call (append_all)", 1),
            ("all 10,240 appends in flight at once", 0),
            ("1,024 executions, each awaiting its appends", 1024),
            ("50 executions, each awaiting its appends", 50),
        ] {
            // The burst appends what 1,024 executions do.
            let executions = if appenders == 0 { 1024 } else { appenders };
            let rows = batch_rows(executions);
            let (mut ratios, mut ours, mut anchors) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let (mut commit, mut anchor) = (Duration::ZERO, Duration::ZERO);
                for k in 0..2 {
                    if (round + k) % 2 == 0 {
                        let sink = fresh_sink();
                        commit = match appenders {
                            0 => burst(&rt, &sink.0, &events),
                            1 => batched(&rt, &sink.0, &events),
                            _ => group_commit(&rt, &sink.0, &events, appenders),
                        };
                    } else {
                        anchor = one_transaction(&mut fresh_connection().0, &rows, executions);
                    }
                }
                ratios.push(anchor.as_secs_f64() / commit.as_secs_f64());
                ours.push(commit.as_secs_f64());
                anchors.push(anchor.as_secs_f64());
            }
            line(&format!(
                "batch of 10,240 appends, {label}: group commit {}; the same rows in one transaction {}",
                ms(Duration::from_secs_f64(median(ours))),
                ms(Duration::from_secs_f64(median(anchors)))
            ));
            line(&format!(
                "  throughput vs one transaction: {:.0}% (target >= 50%)",
                100.0 * median(ratios)
            ));
        }
    }

    fn replay() {
        const ROUNDS: usize = 9;
        let dir = tempdir();
        let (path, id) = populated(dir.path(), REPLAYED);
        let store = ok(Store::open_read_only(&path));
        let conn = ok(rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        ));
        let text_id = id.to_string();
        let (mut ratios, mut ours, mut anchors) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (mut replay, mut scan) = (Duration::ZERO, Duration::ZERO);
            for k in 0..2 {
                if (round + k) % 2 == 0 {
                    replay = time(1, || {
                        black_box(store_replay(&store, &id));
                    });
                } else {
                    scan = time(1, || {
                        black_box(raw_scan(&conn, &text_id));
                    });
                }
            }
            ratios.push(scan.as_secs_f64() / replay.as_secs_f64());
            ours.push(replay.as_secs_f64());
            anchors.push(scan.as_secs_f64());
        }
        line(&format!(
            "replay of 100,000 events: {}; raw ordered scan {}",
            ms(Duration::from_secs_f64(median(ours))),
            ms(Duration::from_secs_f64(median(anchors)))
        ));
        line(&format!(
            "  replay speed vs raw scan: {:.0}% (target >= 50%)",
            100.0 * median(ratios)
        ));
    }
}
