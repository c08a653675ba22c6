//! `cargo xtask bench e2e`: the durable per-turn cost of a scripted `nerve run` in the real
//! sandbox, against LangGraph with its SQLite checkpointer (`../shared/bench/langgraph_react.py`)
//! in the same run.
//!
//! Both sides do the same work per turn: one model answer asking for one `read_file` of a
//! 200-byte file, the tool's result fed back, everything made durable in SQLite. Nerve runs
//! the release binary with a fresh log and workspace each time, `--max-turns N+1 --json`;
//! its per-turn cost is read from the log's commit timestamps (the span from the task going
//! `in_progress` to the last `turn_completed`, divided by N, as the anchor divides its
//! `invoke` by N), so process and sandbox start-up are not counted. The anchor prints its own
//! figure. Nerve runs are repeated and interleaved with a raw `fsync` probe, because on the
//! shared machines a flush costs 0.05 ms at one moment and 3 ms at the next, and a turn is
//! several durable commits.
//!
//! Besides (issue 30): the whole process per turn (wall time / turns, start-up included) and
//! the marginal cost of a turn between the 100- and the 1,000-turn runs; the same on a
//! 10,000-file workspace whose turns only read, and one whose every turn writes a file (a
//! snapshot of one change per turn), beside `git add -A && git write-tree` and an in-process
//! snapshot after one change on an identical tree; start-up (`nerve --version`, `nerve list`
//! on a 1,000-execution log) and the 1,000-turn run's peak RSS (`/usr/bin/time`), beside
//! Codex CLI's published 57 ms and 44.7 MB.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Tool turns per run.
const SIZES: [usize; 2] = [100, 1_000];
/// Nerve runs per size (`NERVE_BENCH_ROUNDS` overrides); the median is reported.
const ROUNDS: usize = 3;
/// The anchor at 1,000 turns takes minutes; it runs once per size.
const ANCHOR_PACKAGES: [&str; 3] = ["langgraph", "langgraph-checkpoint-sqlite", "langchain-core"];

/// `NERVE_BENCH_BEFORE=OLD-NERVE cargo xtask bench e2e`: a change's cost on the turn path,
/// the release `nerve` of a base (built elsewhere) against this one, 1,000 reading turns,
/// alternating base and head `rounds` times (same executor, same harness); the median per
/// turn of each side (log span) and their ratio. Nothing else runs.
fn before_after(
    before: &Path,
    after: &Path,
    executor: &Path,
    work: &Path,
    rounds: usize,
) -> Result<()> {
    let turns = SIZES[SIZES.len() - 1];
    let (mut base, mut head) = (Vec::new(), Vec::new());
    // Ends: `rounds` iterations of two runs.
    for round in 0..rounds {
        for (side, nerve, runs) in [("base", before, &mut base), ("head", after, &mut head)] {
            let dir = work.join(format!("{side}-{round}"));
            let measured = nerve_run(nerve, executor, &dir, turns, Workload::Read)?;
            eprintln!(
                "{side} {turns} turns, round {}: {:.0} us/turn, {:.2} s wall",
                round + 1,
                measured.per_turn_us,
                measured.wall_s
            );
            runs.push(measured.per_turn_us);
        }
    }
    let median = |runs: &mut Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        runs[runs.len() / 2]
    };
    let (base_us, head_us) = (median(&mut base), median(&mut head));
    println!(
        "{turns} turns, median of {rounds} rounds each: base {base_us:.0} us/turn ({}), head {head_us:.0} us/turn: {:.2}x",
        before.display(),
        head_us / base_us
    );
    Ok(())
}

/// One Nerve run of `turns` tool turns, measured from its log.
#[derive(Debug, Clone)]
pub(crate) struct NerveRun {
    /// The whole durable loop, per tool turn.
    pub(crate) per_turn_us: f64,
    /// Median turn length over the first and the last 100 turns.
    pub(crate) first_100_us: f64,
    pub(crate) last_100_us: f64,
    /// The process, start-up and sandbox included.
    pub(crate) wall_s: f64,
    /// Its peak resident set, when `/usr/bin/time` could measure it.
    pub(crate) max_rss_kb: Option<u64>,
    /// Events in the log, per turn.
    events_per_turn: f64,
    /// Per pair of consecutive event kinds, the median time between their commits (each
    /// event is one durable commit): where a turn's time goes.
    breakdown: Vec<(String, f64)>,
}

pub(crate) fn bench() -> Result<()> {
    let executor = crate::image(false)?;
    crate::run(crate::cargo().args(["build", "--release", "--package", "nerve-cli"]))?;
    let nerve = crate::target_dir().join("release").join("nerve");
    let work = crate::target_dir().join("bench-e2e");
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("cannot clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    let rounds = std::env::var("NERVE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(ROUNDS);
    if let Some(before) = std::env::var_os("NERVE_BENCH_BEFORE") {
        return before_after(Path::new(&before), &nerve, &executor, &work, rounds);
    }
    let load_before = load_average();

    // Nerve, sizes interleaved round by round, each run between two fsync probes.
    let mut runs: Vec<Vec<NerveRun>> = vec![Vec::new(); SIZES.len()];
    let mut flushes = vec![fsync_probe(&work)?];
    for round in 0..rounds {
        for (slot, &turns) in SIZES.iter().enumerate() {
            let dir = work.join(format!("nerve-{turns}-{round}"));
            let measured = nerve_run(&nerve, &executor, &dir, turns, Workload::Read)?;
            eprintln!(
                "nerve {turns} turns, round {}: {:.0} us/turn (first 100: {:.0}, last 100: {:.0}), {:.2} s wall",
                round + 1,
                measured.per_turn_us,
                measured.first_100_us,
                measured.last_100_us,
                measured.wall_s
            );
            runs[slot].push(measured);
            flushes.push(fsync_probe(&work)?);
        }
    }

    // The 10,000-file workspace, read-only turns and writing turns, interleaved.
    let mut trees: Vec<(Workload, usize, Vec<NerveRun>)> = Vec::new();
    for writes in [false, true] {
        for &turns in &SIZES {
            trees.push((Workload::Tree { writes }, turns, Vec::new()));
        }
    }
    let tree_rounds = std::env::var("NERVE_BENCH_TREE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(TREE_ROUNDS);
    for round in 0..tree_rounds {
        for (workload, turns, runs) in &mut trees {
            let dir = work.join(format!(
                "tree-{}-{turns}-{round}",
                if *workload == (Workload::Tree { writes: true }) {
                    "write"
                } else {
                    "read"
                }
            ));
            let measured = nerve_run(&nerve, &executor, &dir, *turns, *workload)?;
            eprintln!(
                "nerve {turns} turns, {}, round {}: {:.0} us/turn, {:.2} s wall",
                workload.label(),
                round + 1,
                measured.per_turn_us,
                measured.wall_s
            );
            runs.push(measured);
        }
    }
    let snapshot_costs = snapshot_costs(&work.join("snapshot-anchor"))?;
    let startup = startup(&nerve, &executor, &work.join("startup"))?;

    // The anchor, in the same run.
    let anchor: Result<Vec<f64>> = anchor_setup().and_then(|python| {
        SIZES
            .iter()
            .map(|&turns| anchor_run(&python, turns))
            .collect()
    });
    let load_after = load_average();

    let mut report = String::new();
    let medians: Vec<NerveRun> = runs.iter().map(|r| median_run(r)).collect();
    let (small, large) = (&medians[0], &medians[SIZES.len() - 1]);
    writeln!(report, "\n## End to end ({rounds} Nerve rounds)\n")?;
    writeln!(
        report,
        "| turns | Nerve per turn (median) | first 100 turns | last 100 turns | events/turn | wall | LangGraph per turn | LangGraph / Nerve |"
    )?;
    writeln!(report, "|---|---|---|---|---|---|---|---|")?;
    for (slot, turns) in SIZES.iter().enumerate() {
        let m = &medians[slot];
        let (lg, ratio) = match &anchor {
            Ok(anchor) => (
                format!("{:.0} us", anchor[slot]),
                format!("{:.1}x", anchor[slot] / m.per_turn_us),
            ),
            Err(_) => ("skipped".to_owned(), "-".to_owned()),
        };
        writeln!(
            report,
            "| {turns} | {:.0} us | {:.0} us | {:.0} us | {:.1} | {:.2} s | {lg} | {ratio} |",
            m.per_turn_us, m.first_100_us, m.last_100_us, m.events_per_turn, m.wall_s
        )?;
    }
    let all: Vec<String> = runs
        .iter()
        .zip(SIZES)
        .map(|(r, turns)| {
            let each: Vec<String> = r.iter().map(|m| format!("{:.0}", m.per_turn_us)).collect();
            format!("{turns}: {}", each.join(", "))
        })
        .collect();
    writeln!(report, "\nEvery Nerve run, us per turn: {}", all.join("; "))?;
    let flush_ms: Vec<String> = flushes.iter().map(|f| format!("{f:.3}")).collect();
    writeln!(
        report,
        "Raw fsync probes between the runs (median of 200, ms): {}",
        flush_ms.join(", ")
    )?;
    let within: Vec<f64> = runs[SIZES.len() - 1]
        .iter()
        .map(|r| r.last_100_us / r.first_100_us)
        .collect();
    writeln!(
        report,
        "Flatness: per turn at 1,000 / at 100 turns (medians) = {:.2}x; last 100 / first 100 turns within a 1,000-turn run = {:.2}x (median of {})",
        large.per_turn_us / small.per_turn_us,
        median(&within),
        within
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    )?;
    let breakdown: Vec<String> = large
        .breakdown
        .iter()
        .map(|(kind, us)| format!("{kind} {us:.0}"))
        .collect();
    writeln!(
        report,
        "Median 1,000-turn run, us between the commits of consecutive events: {}",
        breakdown.join(", ")
    )?;
    match &anchor {
        Ok(anchor) => {
            let fastest = runs[SIZES.len() - 1]
                .iter()
                .map(|r| r.per_turn_us)
                .fold(f64::INFINITY, f64::min);
            let ratio = anchor[SIZES.len() - 1] / large.per_turn_us;
            writeln!(
                report,
                "Target >= 50x at 1,000 turns: {ratio:.1}x with the median round ({}); {:.1}x with the fastest",
                if ratio >= 50.0 { "met" } else { "missed" },
                anchor[SIZES.len() - 1] / fastest
            )?;
        }
        Err(why) => writeln!(report, "Anchor skipped: {why:#}")?,
    }
    // Issue 30's figures: the whole process.
    let whole = |m: &NerveRun, turns: usize| m.wall_s * 1e6 / turns as f64;
    let marginal = (large.wall_s - small.wall_s) * 1e6 / (SIZES[1] - SIZES[0]) as f64;
    writeln!(
        report,
        "Whole process (wall / turns, start-up and sandbox included): {:.0} us a turn at 100 turns, {:.0} us at 1,000 (target <= 700: {}); marginal turn (1,000 - 100) {marginal:.0} us = {:.2}x the per-turn cost at 100 (target <= 1.5x)",
        whole(small, SIZES[0]),
        whole(large, SIZES[1]),
        if whole(large, SIZES[1]) <= 700.0 {
            "met"
        } else {
            "missed"
        },
        marginal / whole(small, SIZES[0]),
    )?;
    if let Ok(anchor) = &anchor {
        writeln!(
            report,
            "LangGraph / Nerve whole process at 1,000 turns: {:.1}x",
            anchor[SIZES.len() - 1] / whole(large, SIZES[1])
        )?;
    }
    let rss: Vec<String> = runs[SIZES.len() - 1]
        .iter()
        .filter_map(|r| r.max_rss_kb)
        .map(|kb| format!("{:.1}", kb as f64 / 1024.0))
        .collect();
    writeln!(
        report,
        "Peak RSS of the 1,000-turn runs (/usr/bin/time): {} MiB (Codex CLI publishes 44.7 MB)",
        if rss.is_empty() {
            "not measured".to_owned()
        } else {
            rss.join(", ")
        }
    )?;
    writeln!(
        report,
        "Start-up: `nerve --version` {:.1} ms, `nerve list` on a 1,000-execution log {:.1} ms (medians of {} and {}; Codex CLI publishes 57 ms)",
        startup.version_ms, startup.list_ms, STARTUP_RUNS, LIST_RUNS
    )?;
    writeln!(
        report,
        "\n### 10,000-file workspace ({tree_rounds} rounds)\n"
    )?;
    writeln!(
        report,
        "| turns | workload | per turn (log span, median) | whole process per turn | wall |"
    )?;
    writeln!(report, "|---|---|---|---|---|")?;
    for (workload, turns, runs) in &trees {
        let m = median_run(runs);
        writeln!(
            report,
            "| {turns} | {} | {:.0} us | {:.0} us | {:.2} s |",
            workload.label(),
            m.per_turn_us,
            whole(&m, *turns),
            m.wall_s
        )?;
    }
    writeln!(
        report,
        "\nOne change in 10,000 files, median of {SNAPSHOT_ROUNDS}: `git add -A && git write-tree` {:.2} ms, Checkpoints::snapshot in this xtask (a debug build: `cargo xtask bench checkpoint` has the release figure; the writing runs above minus the reading ones are the release cost in `nerve`) {:.2} ms ({:.2}x); unchanged: {:.2} ms",
        snapshot_costs.git_ms,
        snapshot_costs.changed_ms,
        snapshot_costs.changed_ms / snapshot_costs.git_ms,
        snapshot_costs.unchanged_ms
    )?;
    writeln!(
        report,
        "Machine: {}; load average {load_before} before, {load_after} after",
        machine_note()
    )?;
    println!("{report}");
    Ok(())
}

/// What the turns of a benchmark run do, on what workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// One `read_file` of a different 200-byte file per turn, in a workspace of `turns`
    /// such files: the workspace never changes.
    Read,
    /// A workspace of [`TREE_FILES`] 200-byte files in 100 directories; each turn reads one
    /// of them, or (`writes`) writes a new version of one: one change per snapshot.
    Tree { writes: bool },
}

/// Files in the [`Workload::Tree`] workspace.
const TREE_FILES: usize = 10_000;

impl Workload {
    fn label(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Tree { writes: false } => "10,000 files, read",
            Self::Tree { writes: true } => "10,000 files, write",
        }
    }
}

/// The relative path of file `i` of the [`Workload::Tree`] workspace.
fn tree_file(i: usize) -> String {
    format!("d{:02}/f{i}.txt", i % 100)
}

/// Makes the [`Workload::Tree`] workspace in `workspace`.
fn make_tree(workspace: &Path) -> Result<()> {
    let content = "x".repeat(200);
    for d in 0..100 {
        std::fs::create_dir_all(workspace.join(format!("d{d:02}")))?;
    }
    for i in 0..TREE_FILES {
        std::fs::write(workspace.join(tree_file(i)), &content)?;
    }
    Ok(())
}

/// A workspace of `turns` 200-byte files, a cassette reading one per turn and then
/// answering, a fresh log: one `nerve run`, measured.
fn nerve_run(
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    turns: usize,
    workload: Workload,
) -> Result<NerveRun> {
    let db = dir.join("nerve.db");
    nerve_run_workload(
        nerve,
        executor,
        dir,
        turns,
        &db.display().to_string(),
        workload,
    )
}

/// [`nerve_run`] on the log `db` (a SQLite path or a PostgreSQL URL).
pub(crate) fn nerve_run_on(
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    turns: usize,
    db: &str,
) -> Result<NerveRun> {
    nerve_run_workload(nerve, executor, dir, turns, db, Workload::Read)
}

fn nerve_run_workload(
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    turns: usize,
    db: &str,
    workload: Workload,
) -> Result<NerveRun> {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let mut cassette = String::new();
    let content = "x".repeat(200);
    if workload != Workload::Read {
        make_tree(&workspace)?;
    }
    for i in 0..turns {
        let (tool, arguments) = match workload {
            Workload::Read => {
                std::fs::write(workspace.join(format!("f{i}.txt")), &content)?;
                (
                    "read_file",
                    serde_json::json!({"path": format!("f{i}.txt")}),
                )
            }
            Workload::Tree { writes: false } => (
                "read_file",
                serde_json::json!({"path": tree_file(i * 7 % TREE_FILES)}),
            ),
            Workload::Tree { writes: true } => (
                "write_file",
                serde_json::json!({"path": tree_file(i * 7 % TREE_FILES), "content": format!("version {i}\n")}),
            ),
        };
        // Usage given, as the anchor's fake model has no token counting either.
        let line = serde_json::json!({
            "text": format!("step {i}"),
            "tool_calls": [{"name": tool, "arguments": arguments}],
            "usage": {"input_tokens": 100, "output_tokens": 10},
        });
        writeln!(cassette, "{line}")?;
    }
    writeln!(
        cassette,
        r#"{{"text": "done", "usage": {{"input_tokens": 100, "output_tokens": 10}}}}"#
    )?;
    let script = dir.join("cassette.jsonl");
    std::fs::write(&script, cassette)?;
    // Peak RSS through GNU time, when the machine has it.
    let time = Path::new("/usr/bin/time");
    let mut command = if time.exists() {
        let mut command = Command::new(time);
        command.args(["-f", "NERVE_BENCH_MAXRSS_KB=%M"]).arg(nerve);
        command
    } else {
        Command::new(nerve)
    };
    let started = Instant::now();
    let output = command
        .env(nerve_hands::EXECUTOR_ENV, executor)
        .arg("--db")
        .arg(db)
        .arg("run")
        .arg("--workspace")
        .arg(&workspace)
        .args(["--task", "Read every file.", "--provider"])
        .arg(format!("script:{}", script.display()))
        .args(["--max-turns", &(turns + 1).to_string(), "--json"])
        .output()
        .context("cannot run nerve")?;
    let wall_s = started.elapsed().as_secs_f64();
    let max_rss_kb = String::from_utf8_lossy(&output.stderr)
        .lines()
        .find_map(|line| line.strip_prefix("NERVE_BENCH_MAXRSS_KB="))
        .and_then(|kb| kb.trim().parse().ok());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .with_context(|| {
            format!(
                "nerve printed no result: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    if result["termination_reason"] != "completed" || result["total_turns"] != turns + 1 {
        bail!("the benchmark run did not complete all its turns: {result}");
    }
    let id = result["execution_id"].as_str().context("no execution id")?;
    let events = Command::new(nerve)
        .arg("--db")
        .arg(db)
        .args(["events", id, "--json"])
        .output()
        .context("cannot run nerve events")?;
    let events: serde_json::Value = serde_json::from_slice(
        String::from_utf8_lossy(&events.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .as_bytes(),
    )
    .context("nerve events printed no JSON")?;
    let events = events.as_array().context("events are not a list")?;
    let at = |event: &serde_json::Value| -> Result<f64> {
        let ts = event["ts"].as_str().context("an event without ts")?;
        let parsed =
            time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339)
                .with_context(|| format!("bad timestamp {ts}"))?;
        Ok(parsed.unix_timestamp_nanos() as f64 / 1e3)
    };
    let start = events
        .iter()
        .find(|e| e["kind"] == "task_transition" && e["payload"]["to"] == "in_progress")
        .context("no in_progress transition")?;
    let mut since_previous: Vec<(String, Vec<f64>)> = Vec::new();
    for pair in events.windows(2) {
        let kind = format!(
            "{}>{}",
            pair[0]["kind"].as_str().unwrap_or("?"),
            pair[1]["kind"].as_str().unwrap_or("?")
        );
        let gap = at(&pair[1])? - at(&pair[0])?;
        match since_previous.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, gaps)) => gaps.push(gap),
            None => since_previous.push((kind, vec![gap])),
        }
    }
    let breakdown = since_previous
        .into_iter()
        // The kinds of every turn, not the few of the start and the end.
        .filter(|(_, gaps)| gaps.len() >= turns)
        .map(|(kind, gaps)| (kind, median(&gaps)))
        .collect();
    let completed: Vec<f64> = events
        .iter()
        .filter(|e| e["kind"] == "turn_completed")
        .map(at)
        .collect::<Result<_>>()?;
    let last = *completed.last().context("no turn completed")?;
    // Turn lengths between consecutive `turn_completed`, the final answer (no tool) left out.
    let lengths: Vec<f64> = completed.windows(2).map(|w| w[1] - w[0]).collect();
    let tool_turns = &lengths[..lengths.len().saturating_sub(1)];
    let window = 100.min(tool_turns.len());
    Ok(NerveRun {
        per_turn_us: (last - at(start)?) / turns as f64,
        first_100_us: median(&tool_turns[..window]),
        last_100_us: median(&tool_turns[tool_turns.len() - window..]),
        wall_s,
        max_rss_kb,
        events_per_turn: events.len() as f64 / (turns + 1) as f64,
        breakdown,
    })
}

/// Rounds of the 10,000-file runs (`NERVE_BENCH_TREE_ROUNDS` overrides; a writing run of
/// 1,000 turns walks the 10,000 files 1,000 times).
const TREE_ROUNDS: usize = 3;
/// Snapshots timed for [`snapshot_costs`].
const SNAPSHOT_ROUNDS: usize = 41;
const STARTUP_RUNS: usize = 31;
const LIST_RUNS: usize = 11;
/// Executions in the log `nerve list` reads.
const LIST_EXECUTIONS: usize = 1_000;

/// What one snapshot of the 10,000-file tree costs, in ms.
struct SnapshotCosts {
    git_ms: f64,
    changed_ms: f64,
    unchanged_ms: f64,
}

/// `git add -A && git write-tree` (through `sh -c`, as a person types it) after one change
/// on the 10,000-file tree, against `Checkpoints::snapshot` after the same change on an
/// identical tree, alternated; and the snapshot of the unchanged tree.
fn snapshot_costs(dir: &Path) -> Result<SnapshotCosts> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let (theirs, ours) = (dir.join("git"), dir.join("ours"));
    make_tree(&theirs)?;
    make_tree(&ours)?;
    crate::run(
        Command::new("git")
            .args(["init", "--quiet"])
            .current_dir(&theirs),
    )?;
    let anchor = || -> Result<f64> {
        let started = Instant::now();
        crate::run(
            Command::new("sh")
                .args(["-c", "git add -A && git write-tree >/dev/null"])
                .current_dir(&theirs),
        )?;
        Ok(started.elapsed().as_secs_f64() * 1e3)
    };
    anchor()?;
    let store = nerve_hands::checkpoint::Checkpoints::open(
        nerve_hands::checkpoint::CheckpointConfig::new(dir.join("store"), &ours),
    )?;
    store.snapshot()?;
    let timed = || -> Result<f64> {
        let started = Instant::now();
        store.snapshot()?;
        Ok(started.elapsed().as_secs_f64() * 1e3)
    };
    let (mut git, mut changed, mut unchanged) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..SNAPSHOT_ROUNDS {
        let file = tree_file(round * 13 % TREE_FILES);
        let content = format!("round {round}\n");
        std::fs::write(theirs.join(&file), &content)?;
        std::fs::write(ours.join(&file), &content)?;
        git.push(anchor()?);
        changed.push(timed()?);
        // The file just written may be racy once: read again, then unchanged.
        store.snapshot()?;
        unchanged.push(timed()?);
    }
    Ok(SnapshotCosts {
        git_ms: median(&git),
        changed_ms: median(&changed),
        unchanged_ms: median(&unchanged),
    })
}

/// Start-up figures, in ms.
struct Startup {
    version_ms: f64,
    list_ms: f64,
}

/// `nerve --version`, and `nerve list` on a log of [`LIST_EXECUTIONS`] copies of a real
/// ten-turn execution: medians of wall times.
fn startup(nerve: &Path, executor: &Path, dir: &Path) -> Result<Startup> {
    let wall = |args: &[&str]| -> Result<f64> {
        let started = Instant::now();
        let output = Command::new(nerve).args(args).output()?;
        let elapsed = started.elapsed().as_secs_f64() * 1e3;
        if !output.status.success() {
            bail!(
                "nerve {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(elapsed)
    };
    let version: Vec<f64> = (0..STARTUP_RUNS)
        .map(|_| wall(&["--version"]))
        .collect::<Result<_>>()?;
    let source = nerve_run(nerve, executor, &dir.join("source"), 10, Workload::Read)?;
    drop(source);
    let db = dir.join("list.db");
    {
        let source_db = dir.join("source").join("nerve.db");
        let store = nerve_session::Store::open(&source_db)?;
        let execution: nerve_core::ExecutionId = store
            .executions()?
            .first()
            .context("the source run left no execution")?
            .execution_id
            .parse()
            .map_err(|e| anyhow::anyhow!("a bad execution id: {e:?}"))?;
        let events: Vec<nerve_core::Event> = store
            .events(&execution)?
            .iter()
            .map(|e| serde_json::from_str(&e.payload))
            .collect::<Result<_, _>>()?;
        let mut list = nerve_session::Store::open(&db)?;
        let redactor = nerve_core::Redactor::new();
        for _ in 0..LIST_EXECUTIONS {
            list.append(&nerve_core::ExecutionId::new(), &events, &redactor)?;
        }
    }
    let db = db.display().to_string();
    let list: Vec<f64> = (0..LIST_RUNS)
        .map(|_| wall(&["--db", &db, "list"]))
        .collect::<Result<_>>()?;
    Ok(Startup {
        version_ms: median(&version),
        list_ms: median(&list),
    })
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The run with the median per-turn cost.
fn median_run(runs: &[NerveRun]) -> NerveRun {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.per_turn_us.total_cmp(&b.per_turn_us));
    sorted[sorted.len() / 2].clone()
}

/// Median of 200 raw `write` + `fsync` of 700 bytes in the bench directory, in ms: what a
/// durable commit costs on this disk at this moment.
fn fsync_probe(dir: &Path) -> Result<f64> {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join("fsync-probe.bin");
    let mut file = std::fs::File::create(&path)?;
    file.write_all(&[0; 64 * 4096])?;
    file.sync_all()?;
    let mut samples = Vec::with_capacity(200);
    for i in 0..200u64 {
        let started = Instant::now();
        file.seek(SeekFrom::Start((i % 64) * 4096))?;
        file.write_all(&[b'x'; 700])?;
        file.sync_all()?;
        samples.push(started.elapsed().as_secs_f64() * 1e3);
    }
    std::fs::remove_file(&path)?;
    Ok(median(&samples))
}

/// A virtualenv with LangGraph in `<target dir>/venv-anchor`, created when missing. Its
/// python, or why the anchor cannot run.
fn anchor_setup() -> Result<PathBuf> {
    // Comparing two builds of Nerve needs no anchor, and it costs minutes a run.
    if std::env::var("NERVE_BENCH_ANCHOR").is_ok_and(|v| v == "0") {
        bail!("NERVE_BENCH_ANCHOR=0");
    }
    let venv = crate::target_dir().join("venv-anchor");
    let python = venv.join("bin").join("python");
    let ready = python.exists()
        && Command::new(&python)
            .args([
                "-c",
                "import langgraph.checkpoint.sqlite, langgraph.prebuilt, langchain_core",
            ])
            .output()
            .is_ok_and(|o| o.status.success());
    if !ready {
        eprintln!("setting up the LangGraph anchor in {}", venv.display());
        crate::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
            .context("python3 -m venv failed")?;
        crate::run(
            Command::new(venv.join("bin").join("pip"))
                .args(["install", "--quiet"])
                .args(ANCHOR_PACKAGES),
        )
        .context("pip could not install LangGraph")?;
    }
    Ok(python)
}

/// The anchor's own `us_per_turn` for `turns` turns.
fn anchor_run(python: &Path, turns: usize) -> Result<f64> {
    let script = std::env::var_os("NERVE_ANCHOR_SCRIPT").map_or_else(
        || crate::project_root().join("../shared/bench/langgraph_react.py"),
        PathBuf::from,
    );
    if !script.exists() {
        bail!("the anchor script {} is missing", script.display());
    }
    eprintln!("langgraph {turns} turns...");
    let output = Command::new(python)
        .arg(&script)
        .arg(turns.to_string())
        .output()
        .with_context(|| format!("cannot run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "the anchor failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    eprint!("{stdout}");
    stdout
        .split_whitespace()
        .find_map(|field| field.strip_prefix("us_per_turn="))
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("the anchor printed no us_per_turn: {stdout}"))
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

pub(crate) fn machine_note() -> String {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_owned())
        .unwrap_or_default();
    let docker = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{cores} cores ({cpu}), Linux {kernel}, Docker {docker}")
}
