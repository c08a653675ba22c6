//! The store suite, run unchanged against both backends: the SQLite file on disk and a real
//! PostgreSQL server (the one `NERVE_TEST_PG` names, or a throwaway cluster this test
//! process starts). Each test is written once over [`EventStore`] and [`ContextArchive`];
//! the `both_backends!` macro instantiates it per backend.
//!
//! Without PostgreSQL binaries or a server, the PostgreSQL half prints why and passes,
//! except under `NERVE_REQUIRE_DOCKER=1` (CI), where that is a failure.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use nerve_core::{ArchivedBlock, ContextArchive, Snapshot};

use super::*;

/// What both backends are to the engine and the CLI.
trait Backend: EventStore + ContextArchive + 'static {}
impl<T: EventStore + ContextArchive + 'static> Backend for T {}

/// A SQLite log in a temporary directory (kept alive by the returned guard).
fn sqlite(redactor: Redactor) -> (Option<tempfile::TempDir>, Arc<SqliteSink>) {
    let (dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(redactor)).unwrap();
    (Some(dir), Arc::new(sink))
}

/// A PostgreSQL log in a fresh database; `None` (with the reason printed) when no server
/// can be had outside CI.
async fn postgres(redactor: Redactor) -> Option<Arc<PgStore>> {
    match crate::pg_cluster::test_database().await {
        Ok(url) => Some(Arc::new(
            PgStore::connect(&url, Arc::new(redactor)).await.unwrap(),
        )),
        Err(error) if std::env::var("NERVE_REQUIRE_DOCKER").as_deref() == Ok("1") => {
            panic!("PostgreSQL is required here (NERVE_REQUIRE_DOCKER=1): {error}")
        }
        Err(error) => {
            eprintln!("skipping the PostgreSQL half of this test: {error}");
            None
        }
    }
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let (_dir, store) = super::sqlite(nerve_core::Redactor::new());
                    super::$name(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    if let Some(store) = super::postgres(nerve_core::Redactor::new()).await {
                        super::$name(store).await;
                    }
                }
            )*
        }
    };
}

both_backends!(
    appends_chain_and_replay,
    append_all_is_atomic_and_ordered,
    commits_keep_the_order_of_their_first_poll,
    enqueued_batches_keep_the_order_of_their_enqueue,
    a_commit_stores_its_events_and_then_its_checkpoint,
    checkpoints_latest_wins_and_resume_reads_one_snapshot,
    the_archive_finds_blocks_by_their_words_and_only_for_their_execution,
    the_executions_index_follows_the_log,
    concurrent_writers_stay_gap_free,
    an_export_imports_back_unchanged_and_only_once,
);

async fn appends_chain_and_replay<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    for (i, event) in full_log().into_iter().enumerate() {
        assert_eq!(store.append(id, event).await.unwrap(), i as u64 + 1);
    }
    assert_eq!(store.verify(id).await.unwrap(), Ok(7));
    let events = store.events(id).await.unwrap();
    let replayed = replay(&id.to_string(), &events);
    assert_eq!(replayed.score, 100);
    assert_eq!(store.replay(id).await.unwrap(), replayed);
    assert!(events.windows(2).all(|w| w[0].ts <= w[1].ts));
    let listed = store.executions().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].termination_reason.as_deref(), Some("completed"));
    for unknown in [
        store.events(ExecutionId::new()).await.map(|_| ()),
        store.verify(ExecutionId::new()).await.map(|_| ()),
        store.replay(ExecutionId::new()).await.map(|_| ()),
        store.execution(ExecutionId::new()).await.map(|_| ()),
        store.resume_point(ExecutionId::new()).await.map(|_| ()),
        store.export(ExecutionId::new()).await.map(|_| ()),
    ] {
        assert!(
            matches!(unknown, Err(SessionError::UnknownExecution(_))),
            "{unknown:?}"
        );
    }
}

async fn append_all_is_atomic_and_ordered<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    assert_eq!(
        store
            .append_all(id, vec![started(), context()])
            .await
            .unwrap(),
        [1, 2]
    );
    assert_eq!(
        store.append_all(id, vec![]).await.unwrap(),
        Vec::<u64>::new()
    );
    assert_eq!(store.append(id, turn(1)).await.unwrap(), 3);
    assert_eq!(store.verify(id).await.unwrap(), Ok(3));
    assert_eq!(store.events(id).await.unwrap().len(), 3);
}

/// The port's order contract: a batch takes its place when its commit is first polled.
async fn commits_keep_the_order_of_their_first_poll<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    let mut issued: Vec<nerve_core::PendingCommit> = Vec::new();
    for batch in one_turn() {
        let port = Arc::clone(&store);
        let mut commit: Pin<Box<dyn Future<Output = _> + Send>> =
            Box::pin(async move { port.commit(id, batch, None).await });
        match std::future::poll_fn(|cx| Poll::Ready(commit.as_mut().poll(cx))).await {
            Poll::Pending => issued.push(commit),
            Poll::Ready(done) => issued.push(Box::pin(std::future::ready(done))),
        }
    }
    awaited_last_to_first(&*store, id, issued).await;
}

/// Awaits `issued` (the batches of [`one_turn`]) last to first, then checks the log holds
/// them in the order they were issued.
async fn awaited_last_to_first<S: Backend>(
    store: &S,
    id: ExecutionId,
    mut issued: Vec<nerve_core::PendingCommit>,
) {
    while let Some(commit) = issued.pop() {
        assert_eq!(commit.await.unwrap(), None);
    }
    let kinds: Vec<String> = store
        .events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "started",
            "context_created",
            "model_called",
            "turn_completed"
        ]
    );
    assert_eq!(store.verify(id).await.unwrap(), Ok(4));
}

/// The batches of one turn, as the engine issues them.
fn one_turn() -> [Vec<Event>; 3] {
    [
        vec![started(), context()],
        vec![model_called(1)],
        vec![turn(1)],
    ]
}

/// The port's order contract for a sink with a write queue: a batch takes its place when
/// `enqueue` returns, whenever its commit is awaited (the engine issues a turn's end, then
/// the next intent, and only then awaits the first). Both backends place every batch.
async fn enqueued_batches_keep_the_order_of_their_enqueue<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    let mut issued = Vec::new();
    for batch in one_turn() {
        match store.enqueue(id, batch, None) {
            nerve_core::Enqueued::Placed(commit) => issued.push(commit),
            deferred @ nerve_core::Enqueued::Deferred { .. } => {
                panic!("this sink places every batch, got {deferred:?}")
            }
        }
    }
    awaited_last_to_first(&*store, id, issued).await;
}

async fn a_commit_stores_its_events_and_then_its_checkpoint<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    assert_eq!(store.commit(id, vec![], None).await.unwrap(), None);
    let snapshot = Snapshot {
        turn: 1,
        state: serde_json::json!({"turn": 1, "messages": 3}),
    };
    store
        .commit(id, vec![started(), context()], None)
        .await
        .unwrap();
    let seq = store
        .commit(id, vec![model_called(1), turn(1)], Some(snapshot.clone()))
        .await
        .unwrap();
    assert_eq!(seq, Some(5));
    let checkpoint = store.latest_checkpoint(id).await.unwrap().unwrap();
    assert_eq!((checkpoint.seq, checkpoint.turn), (5, 1));
    assert_eq!(checkpoint.snapshot, snapshot.state);
    assert_eq!(store.verify(id).await.unwrap(), Ok(5));
}

async fn checkpoints_latest_wins_and_resume_reads_one_snapshot<S: Backend>(store: Arc<S>) {
    let id = ExecutionId::new();
    assert_eq!(store.latest_checkpoint(id).await.unwrap(), None);
    store
        .append_all(id, vec![started(), context(), turn(1)])
        .await
        .unwrap();
    assert_eq!(
        store
            .write_checkpoint(id, 1, serde_json::json!({"turns": 1}))
            .await
            .unwrap(),
        4
    );
    store.append(id, turn(2)).await.unwrap();
    assert_eq!(
        store
            .write_checkpoint(id, 2, serde_json::json!({"turns": 2}))
            .await
            .unwrap(),
        6
    );
    store
        .append_all(id, vec![model_called(3), tool_started(3, "a")])
        .await
        .unwrap();
    let latest = store.latest_checkpoint(id).await.unwrap().unwrap();
    assert_eq!((latest.seq, latest.turn), (6, 2));
    let point = store.resume_point(id).await.unwrap();
    assert_eq!(point.checkpoint, Some(latest));
    assert_eq!(
        point.later.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [7, 8]
    );
    assert_eq!(point.replay.in_doubt, [call("a")]);
}

async fn the_archive_finds_blocks_by_their_words_and_only_for_their_execution<S: Backend>(
    store: Arc<S>,
) {
    let (id, other) = (ExecutionId::new(), ExecutionId::new());
    store.append(id, started()).await.unwrap();
    let (config, test, hidden) = (BlockId::new(), BlockId::new(), BlockId::new());
    let tool_call = Message {
        role: nerve_core::MessageRole::Assistant,
        parts: vec![nerve_core::MessagePart::ToolCall(ToolCall {
            id: "c".into(),
            name: "shell".into(),
            arguments: serde_json::json!({"command": "cargo test --package parser"}),
        })],
        pinned: false,
    };
    let seq = store
        .compact(
            id,
            vec![
                NewBlock {
                    block_id: config,
                    messages: vec![Message::user("The config loader reads TOML files.")],
                    note: "1 message summarised at turn 4".into(),
                },
                NewBlock {
                    block_id: test,
                    messages: vec![tool_call, Message::user("3 tests failed in parse_config")],
                    note: "2 tool outputs masked at turn 4".into(),
                },
            ],
            compaction(0, 0, "s", vec![config, test]),
        )
        .await
        .unwrap();
    assert_eq!(seq, 2);
    store
        .put_blocks(
            other,
            vec![NewBlock {
                block_id: hidden,
                messages: vec![Message::user("config of another run")],
                note: String::new(),
            }],
        )
        .await
        .unwrap();
    let found = |query: &'static str| {
        let store = Arc::clone(&store);
        async move {
            store
                .search_archive(id, query.into(), 10)
                .await
                .unwrap()
                .into_iter()
                .map(|hit| hit.block_id)
                .collect::<Vec<BlockId>>()
        }
    };
    assert_eq!(found("toml").await, [config]);
    assert_eq!(found("failing tests").await, [test], "stemmed");
    assert_eq!(found("parse_config").await, [test]);
    assert_eq!(found("cargo package").await, [test], "tool call arguments");
    assert_eq!(found("config tests").await, [test], "every term must match");
    assert_eq!(found("masked").await, [test], "notes are searchable");
    assert_eq!(found("config").await.len(), 2, "not the other execution's");
    assert!(found("\"unbalanced ( quote * NEAR").await.is_empty());
    assert!(found("' OR xq=xq; DROP TABLE events; --").await.is_empty());
    assert!(
        store
            .search_archive(id, "config".into(), 0)
            .await
            .unwrap()
            .is_empty()
    );
    let hit = &store.search_archive(id, "toml".into(), 1).await.unwrap()[0];
    assert_eq!(hit.note, "1 message summarised at turn 4");
    assert!(hit.snippet.contains("TOML"), "{}", hit.snippet);
    let block = store.archive_block(id, test).await.unwrap().unwrap();
    assert_eq!((block.created_seq, block.messages.len()), (2, 2));
    assert_eq!(store.archive_block(id, hidden).await.unwrap(), None);
    // Through the port brain compacts into.
    let archived = ArchivedBlock {
        id: BlockId::new(),
        messages: vec![Message::user("cargo test failed in the tokenizer")],
        note: "masked".into(),
    };
    store.archive(id, archived.clone()).await.unwrap();
    assert_eq!(
        store.fetch(id, archived.id).await.unwrap(),
        Some(archived.clone())
    );
    assert_eq!(store.fetch(other, archived.id).await.unwrap(), None);
    assert_eq!(
        store.search(id, "tokenizer", 5).await.unwrap()[0].id,
        archived.id
    );
    // Block ids are unique: archiving one twice fails and writes nothing.
    assert!(store.archive(id, archived).await.is_err());
    assert_eq!(store.append(id, context()).await.unwrap(), 3);
}

async fn the_executions_index_follows_the_log<S: Backend>(store: Arc<S>) {
    let (first, second) = (ExecutionId::new(), ExecutionId::new());
    store.append_all(first, full_log()).await.unwrap();
    store
        .append_all(second, vec![started(), context(), turn(1)])
        .await
        .unwrap();
    let listed: Vec<(String, Option<String>)> = store
        .executions()
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.execution_id, e.workspace))
        .collect();
    // Each with the workspace its start names (`list`'s WORKSPACE column).
    let workspace = Some("/w".to_owned());
    assert_eq!(
        listed,
        [
            (second.to_string(), workspace.clone()),
            (first.to_string(), workspace.clone())
        ]
    );
    let done = store.execution(first).await.unwrap();
    assert_eq!(done.workspace, workspace);
    assert_eq!(done.task.as_deref(), Some("demo"));
    assert_eq!(done.loop_type.as_deref(), Some("react"));
    assert_eq!(done.model.as_deref(), Some("scripted"));
    assert_eq!(done.termination_reason.as_deref(), Some("completed"));
    assert_eq!(done.task_status.as_deref(), Some("in_review"));
    assert_eq!(
        (
            done.total_turns,
            done.input_tokens,
            done.output_tokens,
            done.cost_micro_usd,
            done.events
        ),
        (2, 200, 20, 10, 7)
    );
    let running = store.execution(second).await.unwrap();
    assert_eq!(
        (
            running.termination_reason.as_deref(),
            running.total_turns,
            running.events
        ),
        (None, 1, 3)
    );
    store.append(first, resumed(1, &[])).await.unwrap();
    let again = store.execution(first).await.unwrap();
    assert_eq!(
        (again.termination_reason, again.resumes, again.events),
        (None, 1, 8)
    );
}

/// Many writers on one execution and on many: every execution's numbers are 1..=n with no
/// gap and no repeat, and every chain verifies.
async fn concurrent_writers_stay_gap_free<S: Backend>(store: Arc<S>) {
    let shared = ExecutionId::new();
    let ids: Vec<ExecutionId> = (0..16).map(|_| ExecutionId::new()).collect();
    let mut tasks = Vec::new();
    for &id in &ids {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut seqs = Vec::new();
            for event in full_log() {
                seqs.push(store.append(id, event).await.unwrap());
                seqs.push(store.append(shared, turn(1)).await.unwrap());
            }
            seqs
        }));
    }
    let mut on_shared: Vec<u64> = Vec::new();
    for task in tasks {
        let seqs = task.await.unwrap();
        let own: Vec<u64> = seqs.iter().step_by(2).copied().collect();
        assert_eq!(own, (1..=7).collect::<Vec<u64>>());
        on_shared.extend(seqs.iter().skip(1).step_by(2));
    }
    on_shared.sort_unstable();
    assert_eq!(on_shared, (1..=16 * 7).collect::<Vec<u64>>());
    assert_eq!(store.verify(shared).await.unwrap(), Ok(16 * 7));
    for id in ids {
        assert_eq!(store.verify(id).await.unwrap(), Ok(7));
    }
    assert_eq!(store.executions().await.unwrap().len(), 17);
}

/// A full execution: events, a checkpoint, archived blocks, a secret that was redacted.
async fn rich_execution<S: Backend + ?Sized>(store: &S) -> ExecutionId {
    let id = ExecutionId::new();
    store
        .append_all(
            id,
            vec![
                started(),
                context(),
                transition(TaskStatus::Assigned, TaskStatus::InProgress),
            ],
        )
        .await
        .unwrap();
    store
        .commit(
            id,
            vec![
                model_called(1),
                tool_started(1, "a"),
                tool_finished(1, "a"),
                turn(1),
            ],
            Some(Snapshot {
                turn: 1,
                state: serde_json::json!({"messages": ["hello", CANARY], "turn": 1}),
            }),
        )
        .await
        .unwrap();
    let block = BlockId::new();
    store
        .compact(
            id,
            vec![NewBlock {
                block_id: block,
                messages: vec![Message::user("the parser rejects trailing commas")],
                note: "1 message summarised at turn 1".into(),
            }],
            compaction(0, 1, "summary", vec![block]),
        )
        .await
        .unwrap();
    store
        .append_all(id, vec![turn(2), finish(TerminationReason::Completed)])
        .await
        .unwrap();
    id
}

async fn an_export_imports_back_unchanged_and_only_once<S: Backend>(store: Arc<S>) {
    let id = rich_execution(&*store).await;
    let log = store.export(id).await.unwrap();
    assert_eq!(log.events.len(), 11);
    assert_eq!(log.blocks.len(), 1);
    let mut file = Vec::new();
    write_log(&log, &mut file).unwrap();
    let parsed = parse_log(&mut file.as_slice()).unwrap();
    assert_eq!(parsed, log);
    let refused = store.import(parsed).await.unwrap_err();
    assert!(
        refused.to_string().contains("already in this log"),
        "{refused}"
    );
    assert_eq!(store.verify(id).await.unwrap(), Ok(11));
}

/// Export from one backend, import into the other, and back: the events are byte for
/// byte the same, the chain verifies, replay, checkpoint, index and archive agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_moves_between_sqlite_and_postgres_and_back() {
    let Some(pg) = postgres(Redactor::new()).await else {
        return;
    };
    let (_dir, lite) = sqlite(Redactor::new());
    let (_dir2, lite_again) = sqlite(Redactor::new());
    let id = rich_execution(&*lite).await;
    let moved = |from: Arc<dyn EventStore>, to: Arc<dyn EventStore>| async move {
        let log = from.export(id).await.unwrap();
        let mut file = Vec::new();
        write_log(&log, &mut file).unwrap();
        let parsed = parse_log(&mut file.as_slice()).unwrap();
        assert_eq!(to.import(parsed).await.unwrap(), 11);
        assert_eq!(to.verify(id).await.unwrap(), Ok(11));
        assert_eq!(to.events(id).await.unwrap(), from.events(id).await.unwrap());
        assert_eq!(to.replay(id).await.unwrap(), from.replay(id).await.unwrap());
        assert_eq!(
            to.latest_checkpoint(id).await.unwrap(),
            from.latest_checkpoint(id).await.unwrap()
        );
        assert_eq!(
            to.resume_point(id).await.unwrap(),
            from.resume_point(id).await.unwrap()
        );
        assert_eq!(
            to.execution(id).await.unwrap(),
            from.execution(id).await.unwrap()
        );
        let hits = to
            .search_archive(id, "trailing commas".into(), 5)
            .await
            .unwrap();
        assert_eq!(hits.len(), 1);
        assert_eq!(to.export(id).await.unwrap(), log);
    };
    moved(lite, pg.clone()).await;
    moved(pg, lite_again).await;
}

/// Secrets are redacted before they reach PostgreSQL, in every column that holds text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_the_postgres_log() {
    let canary = secrecy::SecretString::from(CANARY);
    let redactor = Redactor::with_secrets([("canary", &canary)]).unwrap();
    let Some(store) = postgres(redactor).await else {
        return;
    };
    let id = rich_execution(&*store).await;
    let mut start = started();
    if let Event::Started(s) = &mut start {
        s.task = format!("use {CANARY}");
    }
    let other = ExecutionId::new();
    store.append(other, start).await.unwrap();
    store
        .put_blocks(
            other,
            vec![NewBlock {
                block_id: BlockId::new(),
                messages: vec![Message::user(format!("token {CANARY}"))],
                note: format!("holds {CANARY}"),
            }],
        )
        .await
        .unwrap();
    let checkpoint = store.latest_checkpoint(id).await.unwrap().unwrap();
    assert_eq!(checkpoint.snapshot["messages"][1], "[REDACTED:canary]");
    assert_eq!(
        store.execution(other).await.unwrap().task.as_deref(),
        Some("use [REDACTED:canary]")
    );
    // Every text column of every table, as the server holds it.
    let (client, connection) = tokio_postgres::connect(store.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for table in ["events", "archive_blocks", "executions"] {
        let row = client
            .query_one(
                &format!("SELECT count(*) FROM {table} t WHERE t::text LIKE '%' || $1 || '%'"),
                &[&CANARY],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 0, "{table} holds the secret");
    }
}

/// UPDATE, DELETE and TRUNCATE are refused by triggers; a row changed behind their back
/// (triggers disabled by the table's owner) breaks `verify` at that event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_changes_and_verify_finds_tampering() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let id = rich_execution(&*store).await;
    let (client, connection) = tokio_postgres::connect(store.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    for table in ["events", "archive_blocks"] {
        for statement in [
            format!("UPDATE {table} SET ts = 'x'"),
            format!("DELETE FROM {table}"),
            format!("TRUNCATE {table}"),
        ] {
            let refused = client.batch_execute(&statement).await.unwrap_err();
            let text = format!("{refused:?}");
            assert!(text.contains("append-only"), "{statement}: {text}");
        }
    }
    client
        .batch_execute(
            "ALTER TABLE events DISABLE TRIGGER events_append_only;
             UPDATE events SET payload = replace(payload, 'ok', 'evil') WHERE seq = 6",
        )
        .await
        .unwrap();
    let broken = store.verify(id).await.unwrap().unwrap_err();
    assert_eq!(broken.seq, 6, "{broken}");
    assert!(broken.reason.contains("content"), "{broken}");
    assert_eq!(
        store.replay(id).await.unwrap().gaps[0].kind,
        GapKind::BrokenChain
    );
    client
        .batch_execute("DELETE FROM events WHERE seq = 2")
        .await
        .unwrap();
    assert_eq!(store.verify(id).await.unwrap().unwrap_err().seq, 2);
    client
        .batch_execute("UPDATE events SET snapshot = '{\"turn\":99}' WHERE snapshot IS NOT NULL")
        .await
        .unwrap();
    let corrupt = store.latest_checkpoint(id).await.unwrap_err();
    assert!(
        corrupt.to_string().contains("does not match the hash"),
        "{corrupt}"
    );
}

/// Two stores (two processes' worth of writers) appending to one execution at once: the
/// head row's lock keeps the numbers gap-free and the chain linear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_writers_share_one_execution() {
    let Some(first) = postgres(Redactor::new()).await else {
        return;
    };
    let second = Arc::new(
        PgStore::connect(first.url(), Arc::new(Redactor::new()))
            .await
            .unwrap(),
    );
    let id = ExecutionId::new();
    let mut tasks = Vec::new();
    for store in [Arc::clone(&first), second] {
        for _ in 0..4 {
            let store = Arc::clone(&store);
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for n in 0..25 {
                    seqs.extend(
                        store
                            .append_all(id, vec![turn(n), model_called(n)])
                            .await
                            .unwrap(),
                    );
                }
                seqs
            }));
        }
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (1..=400).collect::<Vec<u64>>());
    assert_eq!(first.verify(id).await.unwrap(), Ok(400));
    assert_eq!(first.execution(id).await.unwrap().events, 400);
}

/// A file that was damaged or reordered is refused at its first bad line.
#[tokio::test]
async fn a_damaged_or_reordered_export_names_its_first_bad_line() {
    let (_dir, store) = sqlite(Redactor::new());
    let id = rich_execution(&*store).await;
    let mut file = Vec::new();
    write_log(&store.export(id).await.unwrap(), &mut file).unwrap();
    let text = String::from_utf8(file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let check = |lines: Vec<String>, line: usize, reason: &str| {
        let joined: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let error = parse_log(&mut joined.as_bytes()).unwrap_err();
        assert_eq!(error.line, line, "{error}");
        assert!(error.reason.contains(reason), "{error}");
    };
    let owned = || lines.iter().map(|l| (*l).to_owned()).collect::<Vec<_>>();
    // Line N + 1 holds event N: edited fields.
    let mut edited = owned();
    edited[4] = edited[4].replacen("model_called", "model_callex", 1);
    check(edited, 5, "content does not match");
    let mut edited = owned();
    edited[6] = edited[6].replacen("\\\"ok\\\"", "\\\"OK\\\"", 1);
    check(edited, 7, "content does not match");
    // Events 3 and 4 swapped.
    let mut swapped = owned();
    swapped.swap(3, 4);
    check(swapped, 4, "sequence 3 is missing");
    // An event left out.
    let mut missing = owned();
    missing.remove(7);
    check(missing, 8, "missing");
    // A snapshot altered.
    let mut snapshot = owned();
    let at = snapshot
        .iter()
        .position(|l| l.contains("\"snapshot\""))
        .unwrap();
    snapshot[at] = snapshot[at].replacen("hello", "HELLO", 1);
    check(snapshot, at + 1, "snapshot");
    // Cut short, and not JSON.
    check(owned()[..10].to_vec(), 11, "header announced");
    let mut garbage = owned();
    garbage[2] = "{not json".into();
    check(garbage, 3, "not a line");
    check(owned()[1..].to_vec(), 1, "header");
    check(Vec::new(), 1, "empty");
}

// ---- the task queue (PostgreSQL) -----------------------------------------------------------

/// Four workers (each its own store, as separate processes would be) claim twenty
/// submitted executions at once: each is claimed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_claim_each_queued_execution_once() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let mut submitted = Vec::new();
    for n in 0..20 {
        let id = ExecutionId::new();
        store
            .submit(id, &serde_json::json!({"task": format!("task {n}")}))
            .await
            .unwrap();
        submitted.push(id);
    }
    assert!(
        store
            .submit(submitted[0], &serde_json::json!({}))
            .await
            .is_err(),
        "submitted once"
    );
    let mut workers = Vec::new();
    for w in 0..4 {
        let worker = PgStore::connect(store.url(), Arc::new(Redactor::new()))
            .await
            .unwrap();
        workers.push(tokio::spawn(async move {
            let name = format!("worker-{w}");
            let mut claimed = Vec::new();
            let lease = std::time::Duration::from_secs(60);
            while let Some(claim) = worker.claim(&name, lease).await.unwrap() {
                assert_eq!(claim.claims, 1);
                assert!(
                    worker
                        .release(claim.execution_id, &name, true)
                        .await
                        .unwrap()
                );
                claimed.push(claim.execution_id);
            }
            claimed
        }));
    }
    let mut claimed = Vec::new();
    for worker in workers {
        claimed.extend(worker.await.unwrap());
    }
    claimed.sort();
    submitted.sort();
    assert_eq!(claimed, submitted);
    let queue = store.queue().await.unwrap();
    assert!(queue.iter().all(|entry| entry.state == "finished"));
}

/// A worker whose lease runs out loses the execution: another claims it, and the stale
/// worker's renew and release fail. A cancelled execution is never claimed; cancelling a
/// claimed one asks its worker (through renew) and ends it `cancelled` at release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_claimed_again_and_the_stale_worker_learns_it() {
    let canary = secrecy::SecretString::from(CANARY);
    let redactor = Redactor::with_secrets([("canary", &canary)]).unwrap();
    let Some(store) = postgres(redactor).await else {
        return;
    };
    let (id, cancelled) = (ExecutionId::new(), ExecutionId::new());
    store
        .submit(id, &serde_json::json!({"task": format!("use {CANARY}")}))
        .await
        .unwrap();
    store
        .submit(cancelled, &serde_json::json!({"task": "never"}))
        .await
        .unwrap();
    assert_eq!(store.cancel(cancelled).await.unwrap(), Cancelled::Queued);
    assert_eq!(
        store.cancel(cancelled).await.unwrap(),
        Cancelled::NotWaiting
    );
    let short = std::time::Duration::from_millis(1);
    let long = std::time::Duration::from_secs(60);
    let first = store.claim("stale", short).await.unwrap().unwrap();
    assert_eq!(first.execution_id, id);
    assert_eq!(first.spec["task"], "use [REDACTED:canary]");
    // Claimable again once the lease has run out (polled, with a generous deadline).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let second = loop {
        if let Some(claim) = store.claim("fresh", long).await.unwrap() {
            break claim;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never claimable again"
        );
        tokio::task::yield_now().await;
    };
    assert_eq!((second.execution_id, second.claims), (id, 2));
    assert_eq!(
        store.renew(id, "stale", long).await.unwrap(),
        LeaseState::Lost
    );
    assert!(!store.release(id, "stale", true).await.unwrap());
    assert_eq!(
        store.renew(id, "fresh", long).await.unwrap(),
        LeaseState::Held
    );
    assert_eq!(store.claim("other", long).await.unwrap(), None);
    // Given back (a draining worker), it is ready again.
    assert!(store.release(id, "fresh", false).await.unwrap());
    let third = store.claim("other", long).await.unwrap().unwrap();
    assert_eq!((third.execution_id, third.claims), (id, 3));
    assert_eq!(store.cancel(id).await.unwrap(), Cancelled::Requested);
    assert_eq!(
        store.renew(id, "other", long).await.unwrap(),
        LeaseState::CancelRequested
    );
    assert!(store.release(id, "other", false).await.unwrap());
    let states: Vec<String> = store
        .queue()
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.state)
        .collect();
    assert_eq!(states, ["cancelled", "cancelled"]);
}

/// The lease check inside the append transaction: once a worker's lease ran out and
/// another worker claimed the execution, every append of the stale worker is refused and
/// nothing of it is written; the new holder appends on the same chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_can_never_append_again() {
    let Some(stale) = postgres(Redactor::new()).await else {
        return;
    };
    let fresh = Arc::new(
        PgStore::connect(stale.url(), Arc::new(Redactor::new()))
            .await
            .unwrap(),
    );
    let id = ExecutionId::new();
    stale.submit(id, &serde_json::json!({})).await.unwrap();
    let short = std::time::Duration::from_millis(300);
    let long = std::time::Duration::from_secs(60);
    stale.claim("stale", short).await.unwrap().unwrap();
    stale.hold_lease(id, "stale");
    stale.append(id, started()).await.unwrap();
    assert!(!stale.lease_lost(id));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if fresh.claim("fresh", long).await.unwrap().is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never claimed again");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    fresh.hold_lease(id, "fresh");
    let refused = stale
        .append(id, finish(TerminationReason::Completed))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("worker stale no longer holds the lease"),
        "{refused}"
    );
    assert!(stale.lease_lost(id));
    // Also inside a batch with another execution's write: only the stale write fails.
    let other = ExecutionId::new();
    let (lost, kept) = tokio::join!(
        stale.append(id, finish(TerminationReason::Completed)),
        stale.append(other, started())
    );
    assert!(lost.is_err());
    assert_eq!(kept.unwrap(), 1);
    assert_eq!(
        fresh
            .append(id, finish(TerminationReason::Completed))
            .await
            .unwrap(),
        2
    );
    let events = fresh.events(id).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(fresh.verify(id).await.unwrap().unwrap(), 2);
}

/// `events --follow` on PostgreSQL: a commit notifies the execution's id on
/// `nerve_events`; a submit notifies `nerve_queue`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_and_submits_notify_listeners() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let mut events = store.listen("nerve_events").await.unwrap();
    let mut queue = store.listen("nerve_queue").await.unwrap();
    let id = ExecutionId::new();
    store.append(id, started()).await.unwrap();
    let patience = std::time::Duration::from_secs(30);
    assert_eq!(events.next(patience).await.unwrap(), Some(id.to_string()));
    store
        .submit(ExecutionId::new(), &serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(queue.next(patience).await.unwrap(), Some(String::new()));
    assert_eq!(
        events
            .next(std::time::Duration::from_millis(50))
            .await
            .unwrap(),
        None
    );
    let after = store.events_after(id, 0).await.unwrap();
    assert_eq!(after.len(), 1);
    assert!(store.events_after(id, 1).await.unwrap().is_empty());
}

/// A commit is two pipelined round trips ending in `COMMIT`: a statement that fails in the
/// second (here a duplicate archive block id) must fail its write alone, leave nothing of
/// it in the log, and leave the connection usable for the next commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_mid_pipeline_leaves_nothing_and_the_next_commits() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let (bad, good) = (ExecutionId::new(), ExecutionId::new());
    store.append(bad, started()).await.unwrap();
    store.append(good, started()).await.unwrap();
    let block = ArchivedBlock {
        id: BlockId::new(),
        messages: vec![Message::user("first")],
        note: "kept".into(),
    };
    store.archive(bad, block.clone()).await.unwrap();
    let before = store.events(bad).await.unwrap().len();
    // Queued together, so usually one batch: the batch fails, then each write alone.
    let (duplicate, other) = tokio::join!(
        store.archive(bad, block.clone()),
        store.append(good, context())
    );
    assert!(duplicate.is_err(), "a duplicate block id was accepted");
    assert_eq!(other.unwrap(), 2);
    assert_eq!(store.events(bad).await.unwrap().len(), before);
    assert_eq!(
        store.append(bad, context()).await.unwrap(),
        (before + 1) as u64
    );
    assert_eq!(store.verify(bad).await.unwrap(), Ok((before + 1) as u64));
    assert_eq!(store.verify(good).await.unwrap(), Ok(2));
    assert_eq!(
        store.fetch(bad, block.id).await.unwrap().map(|b| b.note),
        Some("kept".into())
    );
}

/// A batch queued behind one that fails is not written (the log would have a hole where
/// the failed one was); a write queued once the failure was seen (a resume) is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_dooms_the_batches_queued_behind_it_until_it_is_seen() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let id = ExecutionId::new();
    store.append(id, started()).await.unwrap();
    // A lease nobody holds in the queue: the first batch is refused by the lease check.
    store.hold_lease(id, "nobody");
    let first = store.enqueue(id, vec![model_called(1)], None);
    store.drop_lease(id);
    // Would commit on its own: no lease to check.
    let second = store.enqueue(id, vec![turn(1)], None);
    let (nerve_core::Enqueued::Placed(first), nerve_core::Enqueued::Placed(second)) =
        (first, second)
    else {
        panic!("the PostgreSQL sink places every batch");
    };
    let refused = first.await.unwrap_err().to_string();
    assert!(refused.contains("no longer holds the lease"), "{refused}");
    let doomed = second.await.unwrap_err().to_string();
    assert!(doomed.contains("an earlier write of execution"), "{doomed}");
    assert_eq!(store.events(id).await.unwrap().len(), 1);
    assert_eq!(store.append(id, context()).await.unwrap(), 2);
    assert_eq!(store.verify(id).await.unwrap(), Ok(2));
}

/// `nerve serve`'s tokens on PostgreSQL, as on SQLite (`tokens.rs`): stored as their
/// SHA-256 only, names unique (a revoked one's too), use recorded, revocation at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_api_tokens_hashed_used_and_revocable() {
    let Some(store) = postgres(Redactor::new()).await else {
        return;
    };
    let token = store.create_token("ci", "read").await.unwrap().unwrap();
    assert!(
        token.starts_with(crate::TOKEN_PREFIX) && token.len() == crate::TOKEN_PREFIX.len() + 64
    );
    assert_eq!(store.create_token("ci", "admin").await.unwrap(), None);
    let (client, connection) = tokio_postgres::connect(store.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let stored: String = client
        .query_one("SELECT hash FROM api_tokens", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, crate::tokens::digest(&token));
    assert_ne!(stored, token);
    drop(client);
    let _ = driver.await;

    assert_eq!(store.tokens().await.unwrap()[0].last_used_at, None);
    let used = store.use_token(&token).await.unwrap().unwrap();
    assert_eq!((used.name.as_str(), used.scope.as_str()), ("ci", "read"));
    assert!(used.last_used_at.is_some());
    // Within the minute, a use writes nothing.
    let again = store.use_token(&token).await.unwrap().unwrap();
    assert_eq!(again.last_used_at, used.last_used_at);
    assert_eq!(
        store.tokens().await.unwrap()[0].last_used_at,
        used.last_used_at
    );
    assert_eq!(store.use_token("nerve_00").await.unwrap(), None);

    assert!(store.revoke_token("ci").await.unwrap());
    assert!(!store.revoke_token("ci").await.unwrap());
    assert_eq!(store.use_token(&token).await.unwrap(), None);
    let listed = store.tokens().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].revoked_at.is_some());
}
