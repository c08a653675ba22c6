//! `cargo xtask bench fleet`: Nerve on the PostgreSQL log against LangGraph with its
//! PostgreSQL checkpointer (`xtask/anchors/langgraph_postgres.py`) on the same server, in
//! the same run.
//!
//! 1. Durable per-turn cost at 1,000 turns, PostgreSQL against SQLite: the release `nerve
//!    run` of the e2e benchmark (one `read_file` per turn in the real sandbox), measured
//!    from the log's commit times, on a SQLite file and on a fresh PostgreSQL database.
//! 2. A fleet: 64 executions of 25 tool turns submitted, run by 4 `nerve worker
//!    --concurrency 16` processes on this machine: turns per second, from the first
//!    worker's start to the last execution's completion (sandboxes' starts included) and
//!    over the log's busy span.
//! 3. The same concurrency at the store: 4 `PgStore`s (one per worker process) × 16
//!    executions × 25 turns, each turn the engine's two batches as the engine queues them
//!    (the answer and the call's intent, queued behind the previous turn's end and awaited
//!    with it before the tool call; the result and the turn's end, queued without
//!    waiting): turns per second, and p50 and p99 of a turn's durable wait.
//! 4. The same fleet like for like with the anchor (`bench_fleet_engine.rs`): the engine
//!    with the scripted provider and an in-process tool, on the `PgStore` log under the
//!    queue's leases, 64 executions claimed by 4 OS processes: turns per second and p50/p99
//!    of a batch's durable wait.
//! 5. The anchor: one agent of 1,000 turns (per-turn cost), and 64 agents of 25 turns in 4
//!    processes (turns per second, p50/p99 of a checkpoint write). Its virtual environment
//!    is cached under `~/.cache/nerve/langgraph-postgres` and made with pip when missing.
//!
//! `NERVE_BENCH_PROFILE` names the `nerve` measured (`target/<profile>/nerve`; only
//! `release`, the default, is built here), `NERVE_BENCH_ROUNDS` the rounds of part 1,
//! `NERVE_BENCH_FLEET_PART=store` runs part 3 alone (no sandbox image needed),
//! `NERVE_BENCH_FLEET_PART=engine` part 4 and the anchor's fleet alternately, `rounds`
//! times (each first in every other round; no sandbox image needed), and
//! `NERVE_EXECUTOR` an executor already built (not rebuilt). The store part measures
//! the client code as xtask was built: run it as `cargo run --release -p xtask -- bench
//! fleet` for release figures.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench_e2e::{load_average, machine_note, median, nerve_run_on};

/// Turns of the per-turn comparison.
const LONG: usize = 1_000;
/// The fleet: executions, workers, turns per execution.
const EXECUTIONS: usize = 64;
const WORKERS: usize = 4;
const FLEET_TURNS: usize = 25;
const ANCHOR_PACKAGES: [&str; 4] = [
    "langgraph",
    "langgraph-checkpoint-postgres",
    "psycopg[binary,pool]",
    "langchain-core",
];

pub(crate) fn bench() -> Result<()> {
    // NERVE_BENCH_PROFILE=debug measures the debug `nerve` already built (slower than the
    // release one: a conservative figure when a release build does not fit).
    let profile = std::env::var("NERVE_BENCH_PROFILE").unwrap_or_else(|_| "release".into());
    let nerve = crate::target_dir().join(&profile).join("nerve");
    let work = crate::target_dir().join("bench-fleet");
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("cannot clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    // A fresh database per measurement, on NERVE_TEST_PG's server or a throwaway cluster.
    let database = || -> Result<String> {
        runtime
            .block_on(nerve_session::pg_cluster::test_database())
            .map_err(anyhow::Error::from)
    };
    let rounds = std::env::var("NERVE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(2);
    let load_before = load_average();
    // NERVE_BENCH_FLEET_PART=store: only the commit latency at the store (no sandbox).
    if std::env::var("NERVE_BENCH_FLEET_PART").is_ok_and(|p| p == "store") {
        let commits = runtime.block_on(commit_latency(&database()?))?;
        println!(
            "store: {EXECUTIONS} executions on {WORKERS} stores, {FLEET_TURNS} turns each: {:.0} turns/s, commit p50 {:.2} ms, p99 {:.2} ms; load average {load_before} before, {} after",
            commits.turns_per_s,
            commits.p50_ms,
            commits.p99_ms,
            load_average()
        );
        return Ok(());
    }
    // NERVE_BENCH_FLEET_PART=engine: only the like-for-like fleet (the engine with an
    // in-process tool on the log) and the anchor's fleet, alternating, `rounds` times.
    if std::env::var("NERVE_BENCH_FLEET_PART").is_ok_and(|p| p == "engine") {
        let python = anchor_setup()?;
        let mut report = String::new();
        let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            // Who goes first alternates: a fresh cluster's first writes are its slowest.
            let (engine, anchor) = if round % 2 == 1 {
                let engine = engine_fleet(&runtime, &database()?)?;
                (
                    engine,
                    anchor_run(&python, &anchor_fleet_args(&database()?))?,
                )
            } else {
                let anchor = anchor_run(&python, &anchor_fleet_args(&database()?))?;
                (engine_fleet(&runtime, &database()?)?, anchor)
            };
            let lg_tps = field(Some(&anchor), "turns_per_s").context("anchor turns_per_s")?;
            ours.push(engine.turns_per_s);
            theirs.push(lg_tps);
            ratios.push(engine.turns_per_s / lg_tps);
            writeln!(
                report,
                "round {round}: engine {:.0} turns/s, batch p50 {:.2} ms, p99 {:.2} ms ({} batches); anchor {lg_tps:.1} turns/s: {:.1}x; `{anchor}`",
                engine.turns_per_s,
                engine.p50_ms,
                engine.p99_ms,
                engine.batches,
                engine.turns_per_s / lg_tps
            )?;
        }
        writeln!(
            report,
            "median: engine {:.0} turns/s, anchor {:.1} turns/s, ratio {:.1}x",
            median(&ours),
            median(&theirs),
            median(&ratios)
        )?;
        println!(
            "{report}{}; load average {load_before} before, {} after",
            machine_note(),
            load_average()
        );
        return Ok(());
    }
    // NERVE_EXECUTOR names an executor already built (from the same sources): the sandbox
    // image is still made when missing, but the executor is not rebuilt.
    let executor = match std::env::var_os(nerve_hands::EXECUTOR_ENV) {
        Some(given) if !given.is_empty() => crate::image_with(Some(PathBuf::from(given)), false)?,
        _ => crate::image(false)?,
    };
    if profile == "release" {
        crate::run(crate::cargo().args(["build", "--release", "--package", "nerve-cli"]))?;
    }

    // 1. PostgreSQL against SQLite, rounds interleaved.
    let (mut sqlite, mut postgres) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let dir = work.join(format!("sqlite-{round}"));
        let db = dir.join("nerve.db").display().to_string();
        let run = nerve_run_on(&nerve, &executor, &dir, LONG, &db)?;
        eprintln!(
            "sqlite {LONG} turns, round {}: {:.0} us/turn",
            round + 1,
            run.per_turn_us
        );
        sqlite.push(run);
        let dir = work.join(format!("postgres-{round}"));
        let run = nerve_run_on(&nerve, &executor, &dir, LONG, &database()?)?;
        eprintln!(
            "postgres {LONG} turns, round {}: {:.0} us/turn",
            round + 1,
            run.per_turn_us
        );
        postgres.push(run);
    }

    // 2. The fleet through `nerve worker`.
    let fleet = fleet_run(&nerve, &executor, &work.join("fleet"), &database()?)?;
    eprintln!(
        "fleet: {:.1} turns/s wall, {:.1} turns/s over the log's busy span",
        fleet.wall_turns_per_s, fleet.span_turns_per_s
    );

    // 3. Commit latency at the store, the same concurrency.
    let commits = runtime.block_on(commit_latency(&database()?))?;
    eprintln!(
        "store: {:.0} turns/s, commit p50 {:.2} ms, p99 {:.2} ms",
        commits.turns_per_s, commits.p50_ms, commits.p99_ms
    );

    // 4. The same fleet like for like: the engine, an in-process tool, the log.
    let engine = engine_fleet(&runtime, &database()?)?;

    // 5. The anchor on the same server.
    let anchor = anchor_setup().and_then(|python| {
        let single = anchor_run(&python, &[database()?, "single".into(), LONG.to_string()])?;
        let fleet = anchor_run(&python, &anchor_fleet_args(&database()?))?;
        Ok((single, fleet))
    });
    if let Err(error) = &anchor {
        eprintln!("anchor skipped: {error:#}");
    }
    let load_after = load_average();

    let per_turn = |runs: &[crate::bench_e2e::NerveRun]| {
        median(&runs.iter().map(|r| r.per_turn_us).collect::<Vec<_>>())
    };
    let (sq, pg) = (per_turn(&sqlite), per_turn(&postgres));
    let first_last = |runs: &[crate::bench_e2e::NerveRun]| {
        (
            median(&runs.iter().map(|r| r.first_100_us).collect::<Vec<_>>()),
            median(&runs.iter().map(|r| r.last_100_us).collect::<Vec<_>>()),
        )
    };
    let (pg_first, pg_last) = first_last(&postgres);
    let mut report = String::new();
    writeln!(
        report,
        "\n## Fleet ({rounds} rounds of the per-turn runs, {profile} `nerve`)\n"
    )?;
    writeln!(
        report,
        "| measure | Nerve | LangGraph + langgraph-checkpoint-postgres | ratio |"
    )?;
    writeln!(report, "|---|---|---|---|")?;
    let (lg_single, lg_fleet) = match &anchor {
        Ok((single, fleet)) => (Some(single), Some(fleet)),
        Err(_) => (None, None),
    };
    let get = field;
    let lg_turn = get(lg_single, "us_per_turn");
    writeln!(
        report,
        "| per turn at {LONG} turns, PostgreSQL log | {pg:.0} µs (first/last 100: {pg_first:.0}/{pg_last:.0} µs) | {} | {} |",
        lg_turn.map_or("skipped".into(), |v| format!("{v:.0} µs")),
        lg_turn.map_or("-".into(), |v| format!("{:.1}×", v / pg))
    )?;
    writeln!(
        report,
        "| per turn at {LONG} turns, SQLite log | {sq:.0} µs (PostgreSQL / SQLite: {:.2}×) | | |",
        pg / sq
    )?;
    let lg_tps = get(lg_fleet, "turns_per_s");
    writeln!(
        report,
        "| {EXECUTIONS} executions × {FLEET_TURNS} turns, {WORKERS} workers: turns/s | {:.0} wall ({:.0} over the log's busy span) | {} | {} |",
        fleet.wall_turns_per_s,
        fleet.span_turns_per_s,
        lg_tps.map_or("skipped".into(), |v| format!("{v:.0}")),
        lg_tps.map_or("-".into(), |v| format!(
            "{:.1}×",
            fleet.wall_turns_per_s / v
        ))
    )?;
    writeln!(
        report,
        "| the same concurrency at the store (the engine's two batches a turn, no engine, no tool): turns/s | {:.0} | {} | {} |",
        commits.turns_per_s,
        lg_tps.map_or("skipped".into(), |v| format!("{v:.0} (the whole agent)")),
        lg_tps.map_or("-".into(), |v| format!("{:.1}×", commits.turns_per_s / v))
    )?;
    let (lg_p50, lg_p99) = (get(lg_fleet, "p50_ms"), get(lg_fleet, "p99_ms"));
    // A row of durable waits against the anchor's checkpoint writes.
    let wait_row = |what: &str, p50: f64, p99: f64| {
        format!(
            "| {what}, p50 / p99 | {p50:.2} / {p99:.2} ms | {} | {} |",
            lg_p50
                .zip(lg_p99)
                .map_or("skipped".into(), |(a, b)| format!("{a:.2} / {b:.2} ms")),
            lg_p99.map_or("-".into(), |v| format!("{:.1}× (p99)", v / p99))
        )
    };
    writeln!(
        report,
        "{}",
        wait_row(
            "the same concurrency: a turn's durable wait (Nerve, at the store) / a checkpoint write (anchor)",
            commits.p50_ms,
            commits.p99_ms
        )
    )?;
    writeln!(
        report,
        "| the same fleet like for like (the engine, an in-process tool, the log; {WORKERS} processes): turns/s | {:.0} | {} | {} |",
        engine.turns_per_s,
        lg_tps.map_or("skipped".into(), |v| format!("{v:.0}")),
        lg_tps.map_or("-".into(), |v| format!("{:.1}×", engine.turns_per_s / v))
    )?;
    writeln!(
        report,
        "{}",
        wait_row(
            "the same fleet like for like: a batch's durable wait (Nerve) / a checkpoint write (anchor)",
            engine.p50_ms,
            engine.p99_ms
        )
    )?;
    writeln!(report)?;
    writeln!(
        report,
        "Every round, µs per turn: SQLite {}; PostgreSQL {}.",
        list(&sqlite),
        list(&postgres)
    )?;
    if let Ok((single, fleet)) = &anchor {
        writeln!(report, "Anchor output: `{single}`; `{fleet}`.")?;
    } else if let Err(error) = &anchor {
        writeln!(report, "Anchor skipped: {error:#}.")?;
    }
    writeln!(
        report,
        "{}; load average {load_before} before, {load_after} after.",
        machine_note()
    )?;
    println!("{report}");
    Ok(())
}

/// `key=value` of an anchor's output line, as a number.
fn field(line: Option<&String>, key: &str) -> Option<f64> {
    line?
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

fn anchor_fleet_args(db: &str) -> Vec<String> {
    vec![
        db.to_owned(),
        "fleet".into(),
        EXECUTIONS.to_string(),
        FLEET_TURNS.to_string(),
        WORKERS.to_string(),
    ]
}

/// Part 4 (`bench_fleet_engine.rs`), reported as it finishes.
fn engine_fleet(
    runtime: &tokio::runtime::Runtime,
    db: &str,
) -> Result<crate::bench_fleet_engine::EngineFleet> {
    let engine = crate::bench_fleet_engine::run(runtime, db, EXECUTIONS, FLEET_TURNS, WORKERS)?;
    eprintln!(
        "engine fleet: {:.0} turns/s, batch p50 {:.2} ms, p99 {:.2} ms",
        engine.turns_per_s, engine.p50_ms, engine.p99_ms
    );
    Ok(engine)
}

fn list(runs: &[crate::bench_e2e::NerveRun]) -> String {
    runs.iter()
        .map(|r| format!("{:.0}", r.per_turn_us))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Fleet {
    wall_turns_per_s: f64,
    span_turns_per_s: f64,
}

/// Kills the workers when the measurement ends, also on an error.
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        for child in &mut self.0 {
            let _ = child.wait();
        }
    }
}

fn fleet_run(nerve: &Path, executor: &Path, dir: &Path, db: &str) -> Result<Fleet> {
    std::fs::create_dir_all(dir)?;
    let script = dir.join("cassette.jsonl");
    std::fs::write(&script, crate::bench_fleet_engine::cassette(FLEET_TURNS))?;
    let content = "x".repeat(200);
    let mut ids = Vec::new();
    for e in 0..EXECUTIONS {
        let workspace = dir.join(format!("w{e}"));
        std::fs::create_dir_all(&workspace)?;
        for i in 0..FLEET_TURNS {
            std::fs::write(workspace.join(format!("f{i}.txt")), &content)?;
        }
        let output = Command::new(nerve)
            .args(["--db", db, "submit", "--workspace"])
            .arg(&workspace)
            .args(["--task", "Read every file.", "--provider"])
            .arg(format!("script:{}", script.display()))
            .args(["--max-turns", &(FLEET_TURNS + 1).to_string()])
            .output()?;
        if !output.status.success() {
            bail!("submit failed: {}", String::from_utf8_lossy(&output.stderr));
        }
        ids.push(String::from_utf8_lossy(&output.stdout).trim().to_owned());
    }
    let started = Instant::now();
    let concurrency = (EXECUTIONS / WORKERS).to_string();
    let mut workers = Workers(Vec::new());
    for w in 0..WORKERS {
        let log = std::fs::File::create(dir.join(format!("worker{w}.log")))?;
        workers.0.push(
            Command::new(nerve)
                .env(nerve_hands::EXECUTOR_ENV, executor)
                .args(["--db", db, "worker", "--concurrency", &concurrency])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let output = Command::new(nerve)
            .args(["--db", db, "list", "--status", "completed", "--json"])
            .output()?;
        let done: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
        // An execution a worker could not start (it says `failed:`) ends the wait too.
        let failed: usize = (0..WORKERS)
            .map(|w| {
                std::fs::read_to_string(dir.join(format!("worker{w}.log")))
                    .map(|log| log.matches(" failed: ").count())
                    .unwrap_or(0)
            })
            .sum();
        if done.as_array().map_or(0, Vec::len) + failed >= EXECUTIONS {
            if failed > 0 {
                eprintln!("fleet: {failed} execution(s) failed to start (see the worker logs)");
            }
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the fleet did not complete within 30 minutes (see {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let wall = started.elapsed().as_secs_f64();
    drop(workers);
    // The log's busy span: the first task in progress to the last turn completed.
    let (mut first, mut last) = (f64::MAX, f64::MIN);
    let mut completed = 0;
    for id in &ids {
        let output = Command::new(nerve)
            .args(["--db", db, "events", id, "--json"])
            .output()?;
        if !output.status.success() {
            continue; // never started
        }
        completed += 1;
        let events: serde_json::Value =
            serde_json::from_slice(&output.stdout).with_context(|| format!("events of {id}"))?;
        for event in events.as_array().context("events are not a list")? {
            let at = |e: &serde_json::Value| -> Result<f64> {
                let ts = e["ts"].as_str().context("an event without ts")?;
                let parsed = time::OffsetDateTime::parse(
                    ts,
                    &time::format_description::well_known::Rfc3339,
                )?;
                Ok(parsed.unix_timestamp_nanos() as f64 / 1e9)
            };
            if event["kind"] == "task_transition" && event["payload"]["to"] == "in_progress" {
                first = first.min(at(event)?);
            }
            if event["kind"] == "turn_completed" {
                last = last.max(at(event)?);
            }
        }
    }
    let turns = (completed * FLEET_TURNS) as f64;
    Ok(Fleet {
        wall_turns_per_s: turns / wall,
        span_turns_per_s: turns / (last - first),
    })
}

struct Commits {
    turns_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// A batch the store placed in its write queue.
fn placed(enqueued: nerve_core::Enqueued) -> Result<nerve_core::PendingCommit> {
    match enqueued {
        nerve_core::Enqueued::Placed(commit) => Ok(commit),
        nerve_core::Enqueued::Deferred { .. } => bail!("the store deferred a batch"),
    }
}

/// The engine's two batches per turn, from `EXECUTIONS` executions on `WORKERS` stores:
/// turns per second, and the wait of each turn for its log to be durable before its tool
/// call (p50, p99).
async fn commit_latency(url: &str) -> Result<Commits> {
    use nerve_core::event::{CallPurpose, ModelCalled, TurnCompleted};
    use nerve_core::{
        Event, EventSink, ExecutionId, MicroUsd, Redactor, TokenUsage, ToolCall, ToolCallFinished,
        ToolCallStarted, ToolResult,
    };
    let mut stores = Vec::new();
    for _ in 0..WORKERS {
        stores.push(Arc::new(
            nerve_session::PgStore::connect(url, Arc::new(Redactor::new())).await?,
        ));
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for e in 0..EXECUTIONS {
        let store = Arc::clone(&stores[e % WORKERS]);
        tasks.push(tokio::spawn(async move {
            let id = ExecutionId::new();
            let mut latencies = Vec::new();
            let mut previous_end: Option<nerve_core::PendingCommit> = None;
            for turn in 1..=u32::try_from(FLEET_TURNS).unwrap_or(u32::MAX) {
                let call = ToolCall {
                    id: format!("c{turn}").as_str().into(),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("f{turn}.txt")}),
                };
                let first = vec![
                    Event::ModelCalled(ModelCalled {
                        turn,
                        purpose: CallPurpose::Agent,
                        outcome: nerve_core::event::CallOutcome::Ok,
                        usage: TokenUsage::new(100, 10),
                        time_to_first_token_ms: None,
                        tokens_per_second: None,
                    }),
                    Event::ToolCallStarted(ToolCallStarted {
                        turn,
                        call: call.clone(),
                        repaired: None,
                    }),
                ];
                let second = vec![
                    Event::ToolCallFinished(ToolCallFinished {
                        turn,
                        result: ToolResult {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            content: "x".repeat(200),
                            is_error: false,
                        },
                        duration_ms: 1,
                        interrupted: false,
                        child: None,
                    }),
                    Event::TurnCompleted(TurnCompleted {
                        turn,
                        usage: TokenUsage::new(100, 10),
                        cost: MicroUsd(5),
                        tool_calls: vec![call.name.clone()],
                        finish: nerve_core::FinishReason::ToolCalls,
                        duration_ms: 1,
                    }),
                ];
                // As the engine does: the turn's intent is queued behind the previous turn's
                // end (issued, not awaited), and the turn waits for both before its tool
                // call; its own end is then issued without waiting.
                let t0 = Instant::now();
                let intent = placed(store.enqueue(id, first, None))?;
                if let Some(end) = previous_end.take() {
                    end.await?;
                }
                intent.await?;
                latencies.push(t0.elapsed().as_secs_f64() * 1e3);
                previous_end = Some(placed(store.enqueue(id, second, None))?);
            }
            if let Some(end) = previous_end {
                end.await?;
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Ok(Commits {
        turns_per_s: (EXECUTIONS * FLEET_TURNS) as f64 / elapsed,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    })
}

/// The anchor's virtual environment under `~/.cache/nerve/` (made when missing).
fn anchor_setup() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let venv = Path::new(&home).join(".cache/nerve/langgraph-postgres");
    let python = venv.join("bin/python");
    let ready = python.exists()
        && Command::new(&python)
            .args(["-c", "import langgraph.checkpoint.postgres, psycopg_pool"])
            .status()
            .is_ok_and(|s| s.success());
    if !ready {
        crate::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        crate::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet"])
                .args(ANCHOR_PACKAGES),
        )?;
    }
    Ok(python)
}

fn anchor_run<S: AsRef<std::ffi::OsStr>>(python: &Path, args: &[S]) -> Result<String> {
    let script = crate::project_root().join("xtask/anchors/langgraph_postgres.py");
    let output = Command::new(python)
        .arg(&script)
        .args(args)
        .output()
        .context("cannot run the anchor")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("langgraph-postgres"))
        .map(str::to_owned);
    match line {
        Some(line) if output.status.success() => {
            eprintln!("{line}");
            Ok(line)
        }
        _ => bail!(
            "the anchor failed: {}",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or_default()
        ),
    }
}
