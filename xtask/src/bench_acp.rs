//! `cargo xtask bench acp`: how soon an editor sees the agent's first words through
//! `nerve acp`, against `nerve run --jsonl` on the same cassette (issue 34: at most 1.1×).
//!
//! Both sides start the release `nerve` as a process and wait for the first piece of the
//! model's answer: the ACP side is the official Python client (`agent-client-protocol` from
//! PyPI, `tests/acp/client.py`) doing `initialize`, `session/new` and `session/prompt`
//! until the first `agent_message_chunk`; the terminal side reads `run --jsonl`'s stdout
//! until its first `delta` line. Each figure is measured from the process's spawn, so both
//! include start-up, the sandbox's start and the model call; the ACP side also gives the
//! time from `session/prompt` alone (the sandbox is already up then: `session/new` starts
//! it). Runs alternate between the sides; medians are reported.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Runs per side (`NERVE_BENCH_ROUNDS` overrides); the median is reported.
const ROUNDS: usize = 7;
/// The client the e2e tests use, pinned.
const ACP_SDK: &str = "agent-client-protocol==0.12.1";
/// The answer: one text reply, as a chat's first answer would be.
const CASSETTE: &str = r#"{"text": "Hello from the scripted model: the workspace holds one file.", "usage": {"input_tokens": 100, "output_tokens": 12}}"#;

pub(crate) fn bench() -> Result<()> {
    let executor = crate::image(false)?;
    crate::run(crate::cargo().args(["build", "--release", "--package", "nerve-cli"]))?;
    let nerve = crate::target_dir().join("release").join("nerve");
    let cache = crate::real::cache_dir()?;
    // The same venv (and completion marker) as the e2e tests' client.
    let python = crate::real::venv(&cache, "acp-client-0.12.1", &[ACP_SDK], &[], |_| Ok(()))?
        .join("bin/python");
    let client = crate::project_root().join("tests/acp/client.py");
    let work = crate::target_dir().join("bench-acp");
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("cannot clear {}", work.display()))?;
    }
    std::fs::create_dir_all(&work)?;
    let script = work.join("cassette.jsonl");
    std::fs::write(&script, format!("{CASSETTE}\n"))?;
    let provider = format!("script:{}", script.display());
    let rounds = std::env::var("NERVE_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(ROUNDS);

    let (mut acp_spawn, mut acp_prompt, mut run) = (Vec::new(), Vec::new(), Vec::new());
    // Ends: `rounds` iterations.
    for round in 0..rounds {
        let dir = work.join(format!("round-{round}"));
        let workspace = dir.join("workspace");
        std::fs::create_dir_all(&workspace)?;
        std::fs::write(workspace.join("notes.txt"), "one file\n")?;
        let (since_spawn, since_prompt) = acp_first_chunk(
            &python, &client, &nerve, &executor, &dir, &workspace, &provider,
        )?;
        let terminal = run_first_delta(&nerve, &executor, &dir, &workspace, &provider)?;
        eprintln!(
            "round {}: acp {:.1} ms from spawn ({:.1} ms from session/prompt), run {:.1} ms",
            round + 1,
            since_spawn * 1e3,
            since_prompt * 1e3,
            terminal * 1e3
        );
        acp_spawn.push(since_spawn);
        acp_prompt.push(since_prompt);
        run.push(terminal);
    }
    let (acp_spawn, acp_prompt, run) = (median(acp_spawn), median(acp_prompt), median(run));
    println!(
        "first words of the answer, release nerve, scripted provider, real sandbox ({rounds} rounds, medians)"
    );
    println!(
        "  nerve acp (Python ACP client), spawn -> first agent_message_chunk: {:.1} ms",
        acp_spawn * 1e3
    );
    println!(
        "  nerve acp, session/prompt -> first agent_message_chunk:           {:.1} ms",
        acp_prompt * 1e3
    );
    println!(
        "  nerve run --jsonl, spawn -> first delta:                           {:.1} ms",
        run * 1e3
    );
    println!(
        "  ratio acp / run (from spawn): {:.2}x (target <= 1.10x)",
        acp_spawn / run
    );
    Ok(())
}

/// One ACP session: spawn -> first chunk, and session/prompt -> first chunk, in seconds.
fn acp_first_chunk(
    python: &Path,
    client: &Path,
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    workspace: &Path,
    provider: &str,
) -> Result<(f64, f64)> {
    let plan = serde_json::json!({
        "command": [
            nerve.display().to_string(),
            "--db", dir.join("acp.db").display().to_string(),
            "acp", "--provider", provider,
        ],
        "stderr": dir.join("acp.stderr").display().to_string(),
        "steps": [
            {"op": "initialize"},
            {"op": "new_session", "cwd": workspace.display().to_string()},
            {"op": "prompt", "text": "What does the workspace hold?"},
        ],
        "permissions": [],
    });
    let plan_file = dir.join("plan.json");
    std::fs::write(&plan_file, plan.to_string())?;
    let output = Command::new(python)
        .arg(client)
        .arg(&plan_file)
        .env(nerve_hands::EXECUTOR_ENV, executor)
        .output()
        .context("cannot run the Python ACP client")?;
    if !output.status.success() {
        bail!(
            "the ACP client failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let result: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("the ACP client printed no JSON")?;
    let prompt = result["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|step| step["op"] == "prompt"))
        .with_context(|| format!("no prompt step in {result}"))?;
    let seconds = |key: &str| {
        prompt[key]
            .as_f64()
            .with_context(|| format!("no {key} (no agent_message_chunk?) in {prompt}"))
    };
    Ok((
        seconds("first_chunk_since_spawn_secs")?,
        seconds("first_chunk_secs")?,
    ))
}

/// One `nerve run --jsonl`: spawn -> its first `delta` line, in seconds; the run is then
/// left to finish.
fn run_first_delta(
    nerve: &Path,
    executor: &Path,
    dir: &Path,
    workspace: &Path,
    provider: &str,
) -> Result<f64> {
    let started = Instant::now();
    let mut child = Command::new(nerve)
        .env(nerve_hands::EXECUTOR_ENV, executor)
        .arg("--db")
        .arg(dir.join("run.db"))
        .arg("run")
        .arg("--workspace")
        .arg(workspace)
        .args([
            "--task",
            "What does the workspace hold?",
            "--provider",
            provider,
        ])
        .arg("--jsonl")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run nerve")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut first = None;
    // Ends: at the end of stdout (the process exits after its summary line).
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if first.is_none() && line.contains(r#""type":"delta""#) {
            first = Some(started.elapsed().as_secs_f64());
        }
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("nerve run failed ({status})");
    }
    first.context("nerve run --jsonl printed no delta")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
