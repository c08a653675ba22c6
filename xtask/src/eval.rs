//! `cargo xtask eval [--tasks GLOB] [--provider openai] [--max-turns N] [--no-peer] [--nerve PATH]
//! [--no-nerve] [--check-tasks]`: the task suite of `examples/tasks/` against a served
//! model, Qwen2.5-Coder-1.5B-Instruct behind `llama-server` (greedy sampling, a fixed
//! seed), first with Nerve (its release build, each task in the Debian Python sandbox),
//! then with a peer, mini-swe-agent (pinned, its text-based configuration, its local
//! environment in a throwaway copy), on the same server with the same turn limit. Each run
//! gets a fresh copy of the task's workspace; the task's hidden check runs on the host
//! afterwards. A benchmark, not a gate: see docs/eval.md.
//!
//! Per run: solved, turns, tokens, wall time and its split into the model's time (the
//! server's own timings, read from its log) and, for Nerve, the tools' time (the log's
//! `tool_call_finished` durations) and Nerve's own time (the rest). Rows go to
//! `target/eval/results.jsonl` as they finish (a run cut short keeps what it has), and a
//! Markdown table to `target/eval/report.md`.
//!
//! `--check-tasks` needs no model: every task's check must fail on the workspace as given
//! and pass with the reference fix in `solution/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::real::{self, Server};
use crate::{cargo, qwen, run, target_dir};

/// Pinned: the peer and the host's pytest (the hidden checks).
const MINI_SWE_AGENT: &str = "2.4.6";
const PYTEST: &str = "8.3.5";
/// The server's window; Nerve is told the same.
const EVAL_WINDOW: u32 = 8192;
/// The default turn limit of both agents.
const MAX_TURNS: u32 = 15;
/// Each run's wall-clock limit.
const RUN_TIMEOUT_SECS: u64 = 1500;
/// The key of the eval's llama-server.
const KEY: &str = "sk-nerve-eval";
/// The peer's driver (run in its venv).
const PEER: &str = include_str!("eval_peer.py");

/// What `cargo xtask eval` was asked.
#[derive(Debug)]
struct Options {
    tasks: String,
    provider: String,
    max_turns: u32,
    peer: bool,
    nerve: bool,
    check_tasks: bool,
    /// A `nerve` already built (`--nerve PATH`), instead of building the release one.
    binary: Option<PathBuf>,
}

fn options(args: &[String]) -> Result<Options> {
    let mut options = Options {
        tasks: "*".into(),
        provider: "openai".into(),
        max_turns: MAX_TURNS,
        peer: true,
        nerve: true,
        check_tasks: false,
        binary: None,
    };
    let mut args = args.iter();
    // Bounded by the arguments.
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .with_context(|| format!("{arg} needs a value"))
        };
        match arg.as_str() {
            "--tasks" => options.tasks = value()?,
            "--provider" => options.provider = value()?,
            "--max-turns" => options.max_turns = value()?.parse().context("--max-turns")?,
            "--no-peer" => options.peer = false,
            "--no-nerve" => options.nerve = false,
            "--check-tasks" => options.check_tasks = true,
            "--nerve" => options.binary = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown eval option `{other}` (expected --tasks GLOB, --provider openai, --max-turns N, --no-peer, --no-nerve, --nerve PATH, --check-tasks)"
            ),
        }
    }
    if options.provider != "openai" {
        bail!(
            "--provider {}: the eval serves its model through llama-server's Chat Completions endpoint (`openai`)",
            options.provider
        );
    }
    Ok(options)
}

/// One task of the suite.
struct Task {
    name: String,
    dir: PathBuf,
}

fn tasks(glob: &str) -> Result<Vec<Task>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/tasks");
    let mut found: Vec<Task> = std::fs::read_dir(&root)?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().join("task.md").exists())
        .map(|entry| Task {
            name: entry.file_name().to_string_lossy().into_owned(),
            dir: entry.path(),
        })
        .filter(|task| matches(glob, &task.name))
        .collect();
    found.sort_by(|a, b| a.name.cmp(&b.name));
    if found.is_empty() {
        bail!("no task in {} matches `{glob}`", root.display());
    }
    Ok(found)
}

/// Whether `name` matches `glob`, where `*` stands for any run of characters.
fn matches(glob: &str, name: &str) -> bool {
    match glob.split_once('*') {
        None => glob == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            // Each step shortens `tail` by one character: bounded by its length.
            (0..=tail.len())
                .filter(|&i| tail.is_char_boundary(i))
                .any(|i| matches(rest, &tail[i..]))
        }
    }
}

/// A fresh copy of `task`'s workspace under `runs`, named for `who`.
fn fresh_copy(task: &Task, runs: &Path, who: &str) -> Result<PathBuf> {
    let dir = runs.join(format!("{}-{who}", task.name));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    run(Command::new("cp")
        .arg("-r")
        .arg(task.dir.join("workspace"))
        .arg(&dir))?;
    Ok(dir)
}

/// Runs `task`'s hidden check on `workspace`: whether it passed, and its output's end.
fn check(task: &Task, workspace: &Path, python: &Path) -> Result<(bool, String)> {
    let output = Command::new("sh")
        .arg(task.dir.join("check.sh"))
        .arg(workspace)
        .env("TASK", &task.dir)
        .env("PYTHON", python)
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    Ok((
        output.status.success(),
        tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
    ))
}

/// The `--check-tasks` pass: every check fails as given and passes with the reference fix.
fn check_tasks(tasks: &[Task], python: &Path) -> Result<()> {
    let runs = target_dir().join("eval/check-tasks");
    std::fs::create_dir_all(&runs)?;
    let mut wrong = Vec::new();
    for task in tasks {
        let dir = fresh_copy(task, &runs, "given")?;
        let (before, _) = check(task, &dir, python)?;
        run(Command::new("cp")
            .arg("-r")
            .arg(format!("{}/.", task.dir.join("solution").display()))
            .arg(&dir))?;
        let (after, output) = check(task, &dir, python)?;
        eprintln!(
            "{}: as given {}, fixed {}",
            task.name,
            if before { "PASSES" } else { "fails" },
            if after { "passes" } else { "FAILS" }
        );
        if before || !after {
            wrong.push(format!("{} ({output})", task.name));
        }
    }
    if !wrong.is_empty() {
        bail!("tasks whose check is wrong: {}", wrong.join(", "));
    }
    eprintln!(
        "{} tasks: every check fails as given and passes fixed",
        tasks.len()
    );
    Ok(())
}

pub(crate) fn eval(args: &[String]) -> Result<()> {
    let options = options(args)?;
    let tasks = tasks(&options.tasks)?;
    let cache = real::cache_dir()?;
    let pytest = real::venv(
        &cache,
        &format!("pytest-{PYTEST}"),
        &[&format!("pytest=={PYTEST}")],
        &[],
        |_| Ok(()),
    )?;
    let python = pytest.join("bin/python");
    if options.check_tasks {
        return check_tasks(&tasks, &python);
    }
    let executor = crate::image(false)?;
    let image = crate::python_image()?;
    let nerve = match &options.binary {
        Some(binary) => binary.clone(),
        None => {
            crate::phase("building nerve (release)");
            run(cargo().args(["build", "--release", "--package", "nerve-cli"]))?;
            target_dir().join("release/nerve")
        }
    };
    let peer_venv = if options.peer {
        Some(real::venv(
            &cache,
            &format!("mini-swe-agent-{MINI_SWE_AGENT}"),
            &[&format!("mini-swe-agent=={MINI_SWE_AGENT}")],
            &[],
            |_| Ok(()),
        )?)
    } else {
        None
    };
    let tools = real::tools_venv(&cache)?;
    let llama_cpp = real::llama_cpp(&cache, &tools)?;
    let model = qwen::ensure(&cache, &tools.join("bin/python"))?;

    let out = target_dir().join("eval");
    std::fs::create_dir_all(&out)?;
    let runs = out.join("runs");
    if runs.exists() {
        std::fs::remove_dir_all(&runs)?;
    }
    std::fs::create_dir_all(&runs)?;
    let server_log = out.join("llama-server.log");
    let port = real::free_port()?;
    let _server = Server::start(
        "llama-server (Qwen2.5-Coder-1.5B)",
        Command::new(llama_cpp.join("llama-server"))
            // One thread: with two on a loaded 2-core machine each step waits at a barrier
            // for a descheduled thread (measured at load 12: 2.7 s per generated token
            // with two, 0.43 s with one).
            .args(real::qwen_server_args(&model, EVAL_WINDOW, KEY))
            .args(["--host", "127.0.0.1", "--port", &port.to_string()]),
        &server_log,
        port,
        "/health",
    )?;
    let base = format!("http://127.0.0.1:{port}/v1");
    let db = out.join("nerve.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let config = out.join("nerve.toml");
    std::fs::write(&config, "[providers.openai]\ntool_protocol = \"auto\"\n")?;
    let results = out.join("results.jsonl");
    std::fs::write(&results, "")?;
    let mut rows = Vec::new();
    for task in &tasks {
        if options.nerve {
            let row = nerve_run(
                task,
                &runs,
                &NerveSetup {
                    nerve: &nerve,
                    db: &db,
                    config: &config,
                    executor: &executor,
                    image: &image,
                    base: &base,
                },
                options.max_turns,
                &server_log,
                &python,
            )?;
            append(&results, &row)?;
            rows.push(row);
        }
        if let Some(venv) = &peer_venv {
            let row = peer_run(
                task,
                &runs,
                venv,
                &base,
                options.max_turns,
                &server_log,
                &python,
            )?;
            append(&results, &row)?;
            rows.push(row);
        }
    }
    let report = report(&rows);
    std::fs::write(out.join("report.md"), &report)?;
    println!("{report}");
    Ok(())
}

/// What a Nerve run needs besides the task.
struct NerveSetup<'a> {
    nerve: &'a Path,
    db: &'a Path,
    config: &'a Path,
    executor: &'a Path,
    image: &'a str,
    base: &'a str,
}

/// One run's row.
fn nerve_run(
    task: &Task,
    runs: &Path,
    setup: &NerveSetup<'_>,
    max_turns: u32,
    server_log: &Path,
    python: &Path,
) -> Result<serde_json::Value> {
    let workspace = fresh_copy(task, runs, "nerve")?;
    eprintln!("nerve on {} ...", task.name);
    let log_from = std::fs::metadata(server_log)?.len();
    let started = Instant::now();
    let output = Command::new(setup.nerve)
        .arg("--db")
        .arg(setup.db)
        .args(["run", "--workspace"])
        .arg(&workspace)
        .arg("--task-file")
        .arg(task.dir.join("task.md"))
        .args(["--provider", "openai", "--model", qwen::MODEL_NAME])
        .args(["--context-window", &EVAL_WINDOW.to_string()])
        .args(["--loop", "react", "--max-turns", &max_turns.to_string()])
        .args(["--timeout", &RUN_TIMEOUT_SECS.to_string()])
        .args(["--image", setup.image, "--json"])
        .env("OPENAI_BASE_URL", setup.base)
        .env("OPENAI_API_KEY", KEY)
        .env("NERVE_CONFIG", setup.config)
        .env(nerve_hands::EXECUTOR_ENV, setup.executor)
        .stdin(Stdio::null())
        .output()?;
    let (wall, model_ms, summary) =
        finished(task, runs, "nerve", &output, started, server_log, log_from)?;
    let summary = summary.unwrap_or_else(|| {
        serde_json::json!({"termination_reason": "crash", "error": String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default()})
    });
    let tools_ms = summary["execution_id"]
        .as_str()
        .map(|id| tool_time_ms(setup.nerve, setup.db, id))
        .transpose()?
        .unwrap_or(0);
    let (solved, check_output) = check(task, &workspace, python)?;
    let wall_ms = millis(wall);
    let own_ms = wall_ms.saturating_sub(model_ms + tools_ms);
    Ok(serde_json::json!({
        "agent": "nerve",
        "task": task.name,
        "solved": solved,
        "termination": summary["termination_reason"],
        "turns": summary["total_turns"],
        "input_tokens": summary["input_tokens"],
        "output_tokens": summary["output_tokens"],
        "wall_ms": wall_ms,
        "model_ms": model_ms,
        "tools_ms": tools_ms,
        "own_ms": own_ms,
        "error": summary["error"],
        "check": check_output,
        "execution_id": summary["execution_id"],
    }))
}

/// The peer on `task`: its row.
fn peer_run(
    task: &Task,
    runs: &Path,
    venv: &Path,
    base: &str,
    max_turns: u32,
    server_log: &Path,
    python: &Path,
) -> Result<serde_json::Value> {
    let workspace = fresh_copy(task, runs, "peer")?;
    let driver = runs.join("eval_peer.py");
    std::fs::write(&driver, PEER)?;
    eprintln!("mini-swe-agent on {} ...", task.name);
    // The task's tests need pytest: the Python first on PATH is the one with it, as in
    // Nerve's sandbox.
    let path = std::env::join_paths(
        std::iter::once(python.parent().map(Path::to_path_buf).unwrap_or_default()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ),
    )?;
    let log_from = std::fs::metadata(server_log)?.len();
    let started = Instant::now();
    let output = Command::new(venv.join("bin/python"))
        .arg(&driver)
        .arg(task.dir.join("task.md"))
        .arg(&workspace)
        .arg(base)
        .arg(KEY)
        .arg(qwen::MODEL_NAME)
        .arg(max_turns.to_string())
        .arg(RUN_TIMEOUT_SECS.to_string())
        .arg(runs.join(format!("{}-peer.traj.json", task.name)))
        .env("PATH", path)
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("MSWEA_SILENT_STARTUP", "1")
        .stdin(Stdio::null())
        .output()?;
    let (wall, model_ms, summary) =
        finished(task, runs, "peer", &output, started, server_log, log_from)?;
    let summary = summary.unwrap_or_else(|| serde_json::json!({"exit_status": "crash"}));
    let (solved, check_output) = check(task, &workspace, python)?;
    let wall_ms = millis(wall);
    Ok(serde_json::json!({
        "agent": "mini-swe-agent",
        "task": task.name,
        "solved": solved,
        "termination": summary["exit_status"],
        "turns": summary["model_calls"],
        "input_tokens": summary["input_tokens"],
        "output_tokens": summary["output_tokens"],
        "wall_ms": wall_ms,
        "model_ms": model_ms,
        "tools_ms": null,
        "own_ms": wall_ms.saturating_sub(model_ms),
        "check": check_output,
    }))
}

/// What a finished run of `who` left: its wall time, the model's time in the server's log
/// after byte `log_from`, and the JSON object its stdout ended with. Its stderr is kept
/// beside the workspace.
fn finished(
    task: &Task,
    runs: &Path,
    who: &str,
    output: &std::process::Output,
    started: Instant,
    server_log: &Path,
    log_from: u64,
) -> Result<(Duration, u64, Option<serde_json::Value>)> {
    let wall = started.elapsed();
    let model_ms = model_time_ms(server_log, log_from)?;
    std::fs::write(
        runs.join(format!("{}-{who}.stderr", task.name)),
        &output.stderr,
    )?;
    let summary = String::from_utf8_lossy(&output.stdout)
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok());
    Ok((wall, model_ms, summary))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The model's time in the server's log after byte `from`: the prompt and generation
/// times llama-server prints for every request it finished (`prompt eval time = … ms`,
/// `eval time = … ms`).
fn model_time_ms(log: &Path, from: u64) -> Result<u64> {
    let bytes = std::fs::read(log)?;
    let text = String::from_utf8_lossy(bytes.get(usize::try_from(from)?..).unwrap_or_default());
    Ok(timings_ms(&text))
}

fn timings_ms(text: &str) -> u64 {
    let mut total = 0.0_f64;
    for line in text.lines() {
        let Some((before, after)) = line.split_once(" time =") else {
            continue;
        };
        // After the line's prefix (`… print_timing: id  0 | task 7 |`).
        let what = before.rsplit('|').next().unwrap_or_default().trim();
        if what != "prompt eval" && what != "eval" {
            continue;
        }
        if let Some(ms) = after
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            total += ms;
        }
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // milliseconds
    let total = total.round() as u64;
    total
}

/// The sum of the execution's tool call durations, from `nerve events --json`.
fn tool_time_ms(nerve: &Path, db: &Path, id: &str) -> Result<u64> {
    let output = Command::new(nerve)
        .arg("--db")
        .arg(db)
        .args(["events", id, "--json"])
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let events: Vec<serde_json::Value> = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Array(events)) => events,
        Ok(_) | Err(_) => text
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect(),
    };
    Ok(events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .filter_map(|e| {
            e["payload"]["duration_ms"]
                .as_u64()
                .or(e["duration_ms"].as_u64())
        })
        .sum())
}

fn append(results: &Path, row: &serde_json::Value) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(results)?;
    writeln!(file, "{row}")?;
    eprintln!("{row}");
    Ok(())
}

/// The Markdown tables: per task, then per agent.
fn report(rows: &[serde_json::Value]) -> String {
    let seconds = |v: &serde_json::Value| {
        v.as_u64()
            .map_or_else(|| "–".to_owned(), |ms| format!("{:.0}", ms as f64 / 1000.0))
    };
    let mut text = String::from(
        "| task | agent | solved | termination | turns | tokens in / out | wall s | model s | tools s | own s |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} |\n",
            row["task"].as_str().unwrap_or_default(),
            row["agent"].as_str().unwrap_or_default(),
            if row["solved"] == true { "yes" } else { "no" },
            row["termination"].as_str().unwrap_or("?"),
            row["turns"],
            row["input_tokens"],
            row["output_tokens"],
            seconds(&row["wall_ms"]),
            seconds(&row["model_ms"]),
            seconds(&row["tools_ms"]),
            seconds(&row["own_ms"]),
        ));
    }
    text.push_str("\n| agent | solved | median turns (solved) | median tokens (solved) | wall s | model share | own share |\n|---|---|---|---|---|---|---|\n");
    for agent in ["nerve", "mini-swe-agent"] {
        let mine: Vec<&serde_json::Value> = rows.iter().filter(|r| r["agent"] == agent).collect();
        if mine.is_empty() {
            continue;
        }
        let solved: Vec<&&serde_json::Value> =
            mine.iter().filter(|r| r["solved"] == true).collect();
        let median = |mut values: Vec<u64>| -> String {
            values.sort_unstable();
            values
                .get(values.len() / 2)
                .map_or_else(|| "–".into(), ToString::to_string)
        };
        let turns = median(solved.iter().filter_map(|r| r["turns"].as_u64()).collect());
        let tokens = median(
            solved
                .iter()
                .map(|r| {
                    r["input_tokens"].as_u64().unwrap_or(0)
                        + r["output_tokens"].as_u64().unwrap_or(0)
                })
                .collect(),
        );
        let sum = |key: &str| -> u64 { mine.iter().filter_map(|r| r[key].as_u64()).sum() };
        let wall = sum("wall_ms").max(1);
        text.push_str(&format!(
            "| {agent} | {} of {} | {turns} | {tokens} | {:.0} | {:.1}% | {:.2}% |\n",
            solved.len(),
            mine.len(),
            wall as f64 / 1000.0,
            sum("model_ms") as f64 * 100.0 / wall as f64,
            sum("own_ms") as f64 * 100.0 / wall as f64,
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_task_names() {
        assert!(matches("*", "01-last-items"));
        assert!(matches("0*", "01-last-items"));
        assert!(matches("*shell*", "12-shell-count-lines"));
        assert!(!matches("*shell*", "01-last-items"));
        assert!(matches("01-last-items", "01-last-items"));
        assert!(!matches("01", "01-last-items"));
    }

    #[test]
    fn model_time_is_read_from_the_servers_timings() {
        // As llama-server (0c1e570) logs them.
        let log = "1.33.542.800 I srv  params_from_: Chat format: Hermes 2 Pro\n\
            1.33.542.843 I slot print_timing: id  0 | task 0 | prompt eval time =     812.25 ms /   412 tokens (    1.97 ms per token,   507.24 tokens per second)\n\
            1.33.542.854 I slot print_timing: id  0 | task 0 |        eval time =    2104.50 ms /    38 tokens (   55.38 ms per token,    18.06 tokens per second)\n\
            1.33.542.860 I slot print_timing: id  0 | task 0 |       total time =    2916.75 ms /   450 tokens\n";
        assert_eq!(timings_ms(log), 2917);
        assert_eq!(timings_ms(""), 0);
    }

    #[test]
    fn options_are_checked() {
        let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let parsed = options(&args(&["--tasks", "0*", "--max-turns", "9", "--no-peer"])).unwrap();
        assert_eq!(
            (parsed.tasks.as_str(), parsed.max_turns, parsed.peer),
            ("0*", 9, false)
        );
        assert!(options(&args(&["--provider", "anthropic"])).is_err());
        assert!(options(&args(&["--turns"])).is_err());
        assert!(options(&args(&["--tasks"])).is_err());
    }
}
