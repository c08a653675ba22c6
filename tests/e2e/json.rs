//! Snapshots of every command's `--json` output: `run` (completed and parked), `replay`,
//! `show`, `list`, `events` and `resume`, on a small deterministic cassette. Ids,
//! timestamps, container ids, durations and paths are redacted, so the snapshots only
//! change when the output does. Refresh with `INSTA_UPDATE=always` (or `cargo insta review`).

use std::path::Path;

use insta::assert_json_snapshot;
use serde_json::{Value, json};

use crate::support::{docker_available, last_json, nerve, stderr};

/// Prices for the scripted model, so that costs are not all zero.
const CONFIG: &str = r#"[[models]]
name = "scripted"
context_window = 200000
input_usd_per_million = 3.0
output_usd_per_million = 15.0

[policy]
rules = [{ tool = "write_file", pattern = "approved\\.txt", action = "ask" }]
"#;

fn usage(input: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": 20})
}

/// A run that completes: look, write, check, answer.
fn completing() -> Vec<Value> {
    vec![
        json!({"text": "Look first.", "tool_calls": [{"name": "list_dir", "arguments": {}}], "usage": usage(900)}),
        json!({"text": "Write the note.", "tool_calls": [{"name": "write_file", "arguments": {"path": "note.txt", "content": "noted\n"}}], "usage": usage(1000)}),
        json!({"text": "Check it.", "tool_calls": [{"name": "shell", "arguments": {"command": "cat note.txt"}}], "usage": usage(1100)}),
        json!({"text": "Wrote note.txt.", "usage": usage(1200)}),
    ]
}

/// A run that parks: its write_file matches the `ask` rule.
fn parking() -> Vec<Value> {
    vec![
        json!({"text": "Needs approval.", "tool_calls": [{"name": "write_file", "arguments": {"path": "approved.txt", "content": "yes\n"}}], "usage": usage(800)}),
        json!({"text": "Wrote approved.txt.", "usage": usage(900)}),
    ]
}

fn cassette(dir: &Path, name: &str, lines: &[Value]) -> String {
    let path = dir.join(name);
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&path, text).unwrap();
    format!("script:{}", path.display())
}

/// Runs `nerve --config <config> <args>`, expecting exit `code`; the last stdout line.
fn json_of(db: &Path, config: &Path, args: &[&str], code: i32) -> Value {
    let mut all = vec!["--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = nerve(db, &all);
    assert_eq!(
        output.status.code(),
        Some(code),
        "{args:?}: {}",
        stderr(&output)
    );
    last_json(&output)
}

/// The system prompt is the brain's to change; these snapshots are about the CLI's output.
fn without_system_prompt(mut events: Value) -> Value {
    for event in events.as_array_mut().unwrap() {
        // `get_mut`, not indexing: indexing a missing key would add it.
        let Some(message) = event.pointer_mut("/payload/message") else {
            continue;
        };
        if message["role"] == "system" {
            for part in message["parts"].as_array_mut().unwrap() {
                part["text"] = json!("[system prompt]");
            }
        }
    }
    events
}

#[test]
fn every_command_prints_stable_json() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("hello.txt"), "hello\n").unwrap();
    let workspace = workspace.to_str().unwrap();

    // A run that completes, and every inspection of it.
    let provider = cassette(dir.path(), "completing.jsonl", &completing());
    let run = json_of(
        &db,
        &config,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "Write a note.",
            "--provider",
            &provider,
            "--json",
        ],
        0,
    );
    assert_json_snapshot!("run_completed", run, {".execution_id" => "[id]"});
    let id = run["execution_id"].as_str().unwrap().to_owned();
    let replay = json_of(&db, &config, &["replay", &id, "--json"], 0);
    assert_json_snapshot!("replay", replay, {".execution_id" => "[id]"});
    let show = json_of(&db, &config, &["show", &id, "--json"], 0);
    assert_json_snapshot!("show", show, {".execution_id" => "[id]"});
    let events = without_system_prompt(json_of(&db, &config, &["events", &id, "--json"], 0));
    assert_json_snapshot!("events", events, {
        "[].ts" => "[ts]",
        "[].payload.task_id" => "[id]",
        "[].payload.workspace" => "[workspace]",
        "[].payload.provider" => "[provider]",
        "[].payload.config.container" => "[container]",
        "[].payload.config.sandbox_executor.path" => "[executor]",
        "[].payload.duration_ms" => "[duration]",
    });

    // A run that parks, is approved and resumed.
    let provider = cassette(dir.path(), "parking.jsonl", &parking());
    let parked = json_of(
        &db,
        &config,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "Write approved.txt.",
            "--provider",
            &provider,
            "--json",
        ],
        1,
    );
    let parked_id = parked["execution_id"].as_str().unwrap().to_owned();
    // The error names the execution to approve: its id, which differs every run.
    let mut shown = parked.clone();
    shown["error"] = json!(
        parked["error"]
            .as_str()
            .unwrap()
            .replace(&parked_id, "[id]")
    );
    assert_json_snapshot!("run_parked", shown, {".execution_id" => "[id]"});
    let approve = nerve(&db, &["approve", &parked_id]);
    assert!(approve.status.success(), "{}", stderr(&approve));
    let resume = json_of(&db, &config, &["resume", &parked_id, "--json"], 0);
    assert_json_snapshot!("resume", resume, {".execution_id" => "[id]"});
    let replay = json_of(&db, &config, &["replay", &parked_id, "--json"], 0);
    assert_json_snapshot!("replay_after_resume", replay, {".execution_id" => "[id]"});

    // Newest first: the resumed run, then the completed one.
    let list = json_of(&db, &config, &["list", "--json"], 0);
    assert_eq!(list[0]["execution_id"], json!(parked_id));
    assert_eq!(list[1]["execution_id"], json!(id));
    assert_json_snapshot!("list", list, {
        "[].execution_id" => "[id]",
        "[].started_at" => "[ts]",
        "[].updated_at" => "[ts]",
        "[].workspace" => "[dir]",
    });
}
