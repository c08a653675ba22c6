//! Hooks end to end: a `pre_tool_use` hook that exits 2 blocks the call and the model sees
//! its stderr; a `post_tool_use` hook receives the call and its result as JSON on stdin; a
//! hook that hangs is killed at its timeout and the run goes on; every run is a `hook_ran`
//! event.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{docker_available, events_json, last_json, nerve, stderr};

fn cassette(dir: &Path, calls: &[Value]) -> String {
    let mut lines: Vec<String> = calls
        .iter()
        .map(|call| json!({"tool_calls": [call]}).to_string())
        .collect();
    lines.push(json!({"text": "done"}).to_string());
    let path = dir.join("cassette.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    format!("script:{}", path.display())
}

fn run(dir: &Path, config: &str, calls: &[Value]) -> (std::path::PathBuf, String, Vec<Value>) {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let config_path = dir.join("nerve.toml");
    std::fs::write(&config_path, config).unwrap();
    let provider = cassette(dir, calls);
    let db = dir.join("nerve.db");
    let output = nerve(
        &db,
        &[
            "--config",
            config_path.to_str().unwrap(),
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "work",
            "--provider",
            &provider,
            "--json",
        ],
    );
    let summary = last_json(&output);
    assert_eq!(
        summary["termination_reason"],
        "completed",
        "{summary}\n{}",
        stderr(&output)
    );
    let id = summary["execution_id"].as_str().unwrap().to_owned();
    let events = events_json(&db, &id);
    (workspace, id, events)
}

fn hook_runs(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "hook_ran")
        .map(|e| e["payload"].clone())
        .collect()
}

fn results(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            e["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[test]
fn a_pre_tool_use_hook_that_exits_2_blocks_the_call_and_the_model_sees_why() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = r#"
[[hooks.pre_tool_use]]
matcher = "shell"
command = ["sh", "-c", "grep -q 'rm ' && { echo 'no rm in this project' >&2; exit 2; }; exit 0"]
timeout_secs = 10
"#;
    let (workspace, _, events) = run(
        dir.path(),
        config,
        &[
            json!({"name": "shell", "arguments": {"command": "rm -f keep"}}),
            json!({"name": "shell", "arguments": {"command": "echo ran > ok"}}),
            json!({"name": "list_dir", "arguments": {}}),
        ],
    );
    let runs = hook_runs(&events);
    // Two shell calls, one hook run each; list_dir is not matched.
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["point"], "pre_tool_use");
    assert_eq!(runs[0]["verdict"], "block");
    assert_eq!(runs[0]["exit_code"], 2);
    assert_eq!(runs[0]["tool"], "shell");
    assert_eq!(runs[1]["verdict"], "allow");
    let results = results(&events);
    assert!(
        results[0].contains("blocked by a pre_tool_use hook: no rm in this project"),
        "{results:?}"
    );
    // The blocked call never started; the allowed one ran.
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .collect();
    assert_eq!(started.len(), 2, "{started:?}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("ok")).unwrap(),
        "ran\n"
    );
}

#[test]
fn a_post_tool_use_hook_reads_the_result_and_a_hanging_hook_is_killed_at_its_timeout() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.jsonl");
    let config = format!(
        r#"
[[hooks.post_tool_use]]
command = ["sh", "-c", "cat >> {seen}; echo >> {seen}"]

[[hooks.session_start]]
command = ["sh", "-c", "sleep 60"]
timeout_secs = 1

[[hooks.stop]]
command = ["sh", "-c", "echo odd >&2; exit 3"]
"#,
        seen = seen.display()
    );
    let (workspace, id, events) = run(
        dir.path(),
        &config,
        &[json!({"name": "shell", "arguments": {"command": "echo hello-from-the-tool"}})],
    );
    let runs = hook_runs(&events);
    let points: Vec<&str> = runs.iter().map(|r| r["point"].as_str().unwrap()).collect();
    assert_eq!(
        points,
        ["session_start", "post_tool_use", "stop"],
        "{runs:?}"
    );
    // The hanging hook: killed at 1 s, a warning, and the run went on.
    assert_eq!(runs[0]["timed_out"], true);
    assert_eq!(runs[0]["verdict"], "warn");
    assert!(
        runs[0]["duration_ms"].as_u64().unwrap() < 30_000,
        "{runs:?}"
    );
    // Another exit code: a warning with its stderr.
    assert_eq!(runs[2]["exit_code"], 3);
    assert_eq!(runs[2]["verdict"], "warn");
    assert_eq!(runs[2]["stderr"], "odd\n");
    // What the post_tool_use hook read on its stdin.
    let text = std::fs::read_to_string(&seen).unwrap();
    let input: Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(input["event"], "post_tool_use");
    assert_eq!(input["execution_id"], id.as_str());
    assert_eq!(
        input["workspace"],
        std::fs::canonicalize(&workspace).unwrap().to_str().unwrap()
    );
    assert_eq!(input["tool"], "shell");
    assert_eq!(input["arguments"]["command"], "echo hello-from-the-tool");
    assert!(
        input["result"]["content"]
            .as_str()
            .unwrap()
            .contains("hello-from-the-tool"),
        "{input}"
    );
    assert_eq!(input["result"]["is_error"], false);
}

#[test]
fn a_hook_without_a_command_is_a_one_line_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[[hooks.stop]]\ncommand = []\n").unwrap();
    let output = nerve(
        &dir.path().join("nerve.db"),
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "--workspace",
            dir.path().to_str().unwrap(),
            "--task",
            "x",
            "--provider",
            "script:/nonexistent",
        ],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("hooks.stop: `command` names no program"),
        "{err}"
    );
}
