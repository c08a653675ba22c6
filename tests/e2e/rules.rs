//! Approval modes and command rules end to end: `[[rules]]` decide shell calls by their
//! words (`git status` runs, `rm -rf x` is refused naming the rule, `git status; touch y` is
//! not the `git status` rule's to allow), `--approval read-only` refuses writes, and every
//! decision is an `approval_decided` event naming the rule that made it.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{docker_available, events_json, last_json, nerve, stderr};

const RULES: &str = r#"approval = "ask"

[[rules]]
tool = "shell"
command = "git status"
decision = "allow"

[[rules]]
tool = "shell"
command = "rm *"
decision = "deny"
"#;

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

fn shell(command: &str) -> Value {
    json!({"name": "shell", "arguments": {"command": command}})
}

/// The policy's decisions, in order: `(decision, rule)`.
fn decisions(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["kind"] == "approval_decided")
        .map(|e| {
            (
                e["payload"]["decision"].as_str().unwrap().to_owned(),
                e["payload"]["rule"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The results the model saw, in order.
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
fn command_rules_allow_deny_and_never_allow_a_compound_command() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("x"), "keep me").unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, RULES).unwrap();
    let provider = cassette(
        dir.path(),
        &[
            shell("git status"),
            shell("rm -rf x"),
            shell("git status; touch y"),
        ],
    );
    let db = dir.path().join("nerve.db");
    let run = nerve(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "tidy up",
            "--provider",
            &provider,
            "--json",
        ],
    );
    let summary = last_json(&run);
    // The compound command asks (ask mode), and an unattended run parks on it.
    assert_eq!(
        summary["termination_reason"],
        "parked",
        "{summary}\n{}",
        stderr(&run)
    );
    let id = summary["execution_id"].as_str().unwrap();
    let events = events_json(&db, id);
    assert_eq!(
        decisions(&events),
        [
            (
                "approved".to_owned(),
                "rules[0]: allow shell `git status`".to_owned()
            ),
            (
                "denied".to_owned(),
                "rules[1]: deny shell `rm *`".to_owned()
            ),
        ]
    );
    let results = results(&events);
    assert_eq!(results.len(), 2, "{results:?}");
    // git status ran (busybox has no git: the shell says so), rm was refused by name.
    assert!(results[0].contains("git"), "{results:?}");
    assert!(
        results[1].contains("denied by the tool policy (rules[1]: deny shell `rm *`)"),
        "{results:?}"
    );
    let asked: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "approval_requested")
        .collect();
    assert_eq!(asked.len(), 1, "{events:?}");
    assert_eq!(
        asked[0]["payload"]["call"]["arguments"]["command"],
        "git status; touch y"
    );
    assert_eq!(
        asked[0]["payload"]["rule"],
        "ask mode: shell is not a reading tool"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("x")).unwrap(),
        "keep me"
    );
    assert!(!workspace.join("y").exists());
}

#[test]
fn read_only_refuses_writes_and_records_every_decision() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("notes.txt"), "hello\n").unwrap();
    let provider = cassette(
        dir.path(),
        &[
            json!({"name": "read_file", "arguments": {"path": "notes.txt"}}),
            json!({"name": "write_file", "arguments": {"path": "new.txt", "content": "x"}}),
            json!({"name": "edit_file", "arguments": {"path": "notes.txt", "old_text": "hello", "new_text": "bye"}}),
            shell("touch made-by-shell"),
        ],
    );
    let db = dir.path().join("nerve.db");
    let run = nerve(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "look, do not touch",
            "--provider",
            &provider,
            "--approval",
            "read-only",
            "--json",
        ],
    );
    let summary = last_json(&run);
    assert_eq!(
        summary["termination_reason"],
        "completed",
        "{summary}\n{}",
        stderr(&run)
    );
    let id = summary["execution_id"].as_str().unwrap();
    let events = events_json(&db, id);
    assert_eq!(
        decisions(&events),
        [
            ("approved".to_owned(), "read-only mode: reading".to_owned()),
            (
                "denied".to_owned(),
                "read-only mode: write_file writes to the workspace".to_owned()
            ),
            (
                "denied".to_owned(),
                "read-only mode: edit_file writes to the workspace".to_owned()
            ),
            (
                "denied".to_owned(),
                "read-only mode: shell is not a reading tool".to_owned()
            ),
        ]
    );
    let results = results(&events);
    assert!(results[0].contains("hello"), "{results:?}");
    assert!(results[1].contains("read-only mode"), "{results:?}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.txt")).unwrap(),
        "hello\n"
    );
    assert!(!workspace.join("new.txt").exists());
    assert!(!workspace.join("made-by-shell").exists());
    // The mode is recorded with the start.
    let started = events.iter().find(|e| e["kind"] == "started").unwrap();
    assert_eq!(started["payload"]["config"]["approval"], "read-only");
}

#[test]
fn a_bad_rule_is_a_one_line_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(
        &config,
        "[[rules]]\ntool = \"shell\"\ncommand = \"git status; ls\"\ndecision = \"allow\"\n",
    )
    .unwrap();
    let db = dir.path().join("nerve.db");
    let run = nerve(
        &db,
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
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let err = stderr(&run);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("rules[0]: allow shell `git status; ls`")
            && err.contains("cannot hold a shell operator"),
        "{err}"
    );
}
