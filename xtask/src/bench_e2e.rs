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
    let load_before = load_average();

    // Nerve, sizes interleaved round by round, each run between two fsync probes.
    let mut runs: Vec<Vec<NerveRun>> = vec![Vec::new(); SIZES.len()];
    let mut flushes = vec![fsync_probe(&work)?];
    for round in 0..rounds {
        for (slot, &turns) in SIZES.iter().enumerate() {
            let dir = work.join(format!("nerve-{turns}-{round}"));
            let measured = nerve_run(&nerve, &executor, &dir, turns)?;
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
    writeln!(
        report,
        "Machine: {}; load average {load_before} before, {load_after} after",
        machine_note()
    )?;
    println!("{report}");
    Ok(())
}

/// A workspace of `turns` 200-byte files, a cassette reading one per turn and then
/// answering, a fresh log: one `nerve run`, measured.
fn nerve_run(nerve: &Path, executor: &Path, dir: &Path, turns: usize) -> Result<NerveRun> {
    let db = dir.join("nerve.db");
    nerve_run_on(nerve, executor, dir, turns, &db.display().to_string())
}

/// [`nerve_run`] on the log `db` (a SQLite path or a PostgreSQL URL).
pub(crate) fn nerve_run_on(
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    turns: usize,
    db: &str,
) -> Result<NerveRun> {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let mut cassette = String::new();
    let content = "x".repeat(200);
    for i in 0..turns {
        std::fs::write(workspace.join(format!("f{i}.txt")), &content)?;
        // Usage given, as the anchor's fake model has no token counting either.
        writeln!(
            cassette,
            r#"{{"text": "step {i}", "tool_calls": [{{"name": "read_file", "arguments": {{"path": "f{i}.txt"}}}}], "usage": {{"input_tokens": 100, "output_tokens": 10}}}}"#
        )?;
    }
    writeln!(
        cassette,
        r#"{{"text": "done", "usage": {{"input_tokens": 100, "output_tokens": 10}}}}"#
    )?;
    let script = dir.join("cassette.jsonl");
    std::fs::write(&script, cassette)?;
    let started = Instant::now();
    let output = Command::new(nerve)
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
        events_per_turn: events.len() as f64 / (turns + 1) as f64,
        breakdown,
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
