//! `nerve acp` driven by an ACP client no one on this project wrote: the official Python SDK
//! (`agent-client-protocol` from PyPI, in a venv cached under `~/.cache/nerve/`), through
//! `tests/acp/client.py`. One session edits a file and asks two permissions, a second
//! client process loads it and goes on, a cancel during a long command answers at once, the
//! wire's errors leave the agent serving; each execution verifies and replays complete, and
//! no secret reaches the stream.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::support::{
    docker_available, nerve, nerve_bin, nerve_cache, python_venv, root, stderr, stdout,
};

/// The Python SDK the tests drive `nerve acp` with.
const ACP_SDK: &str = "agent-client-protocol==0.12.1";

/// A secret the provider key carries: registered with the redactor, never on the stream.
const SECRET: &str = "nerve-acp-e2e-secret-0123456789";

struct Setup {
    dir: tempfile::TempDir,
    workspace: PathBuf,
    db: PathBuf,
    config: PathBuf,
    provider: String,
}

fn setup(cassette: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("hello.txt"), "hello world\n").unwrap();
    let db = dir.path().join("nerve.db");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[policy]\nrules = [ { tool = \"shell\", pattern = \"touch\", action = \"ask\" } ]\n",
    )
    .unwrap();
    let script = dir.path().join("cassette.jsonl");
    std::fs::write(&script, cassette).unwrap();
    Setup {
        provider: format!("script:{}", script.display()),
        workspace: std::fs::canonicalize(&workspace).unwrap(),
        db,
        config,
        dir,
    }
}

/// Runs the client on `steps` against `nerve acp` with the setup's log, config and
/// cassette, the client answering permission requests with `permissions` in order; returns
/// what it printed.
fn client(s: &Setup, name: &str, steps: Value, permissions: &[&str]) -> Value {
    let python = python_venv(&nerve_cache("acp-client-0.12.1"), ACP_SDK, "python")
        .unwrap_or_else(|reason| panic!("no Python ACP client: {reason}"));
    let stderr_file = s.dir.path().join(format!("{name}.stderr"));
    let plan = json!({
        "command": [
            nerve_bin().display().to_string(),
            "--db", s.db.display().to_string(),
            "--config", s.config.display().to_string(),
            "acp", "--provider", s.provider,
        ],
        "stderr": stderr_file.display().to_string(),
        "steps": steps,
        "permissions": permissions,
    });
    let plan_file = s.dir.path().join(format!("{name}.json"));
    std::fs::write(&plan_file, plan.to_string()).unwrap();
    let output = Command::new(python)
        .arg(root().join("tests/acp/client.py"))
        .arg(&plan_file)
        .env_remove("NERVE_CONFIG")
        .env_remove("ANTHROPIC_API_KEY")
        .env("OPENAI_API_KEY", SECRET)
        .output()
        .unwrap();
    let agent_log = std::fs::read_to_string(&stderr_file).unwrap_or_default();
    assert!(
        output.status.success(),
        "client failed: {}\nagent stderr:\n{agent_log}",
        stderr(&output)
    );
    let text = stdout(&output);
    let result: Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| {
            panic!("client output is not JSON ({e}): {text}\nagent stderr:\n{agent_log}")
        });
    assert!(
        !text.contains(SECRET) && !agent_log.contains(SECRET),
        "the secret reached the ACP stream or the agent's log"
    );
    result
}

fn step<'a>(result: &'a Value, op: &str) -> &'a Value {
    result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["op"] == op)
        .unwrap_or_else(|| panic!("no {op} step: {result}"))
}

fn steps_of<'a>(result: &'a Value, op: &str) -> Vec<&'a Value> {
    result["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["op"] == op)
        .collect()
}

fn kinds(updates: &Value) -> Vec<String> {
    updates
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["sessionUpdate"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// The text of the updates of `kind`, concatenated.
fn text_of(updates: &Value, kind: &str) -> String {
    updates
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == kind)
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

/// `nerve verify` passes and `nerve replay --json` is complete.
fn verifies_and_replays_complete(db: &Path, id: &str) -> Value {
    let verify = nerve(db, &["verify", id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let replay = nerve(db, &["replay", id, "--json"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    let replay: Value = serde_json::from_str(stdout(&replay).trim()).unwrap();
    assert_eq!(replay["completeness"], 1.0, "{replay}");
    replay
}

fn events(db: &Path, id: &str) -> Vec<Value> {
    crate::support::events_json(db, id)
}

const SESSION_CASSETTE: &str = r#"{"text": "Looking.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo key nerve-acp-e2e-secret-0123456789 here"}}]}
{"text": "Editing.", "tool_calls": [{"name": "edit_file", "arguments": {"path": "hello.txt", "old_text": "world", "new_text": "editor"}}]}
{"text": "Done editing."}
{"text": "Touching.", "tool_calls": [{"name": "shell", "arguments": {"command": "touch allowed.txt"}}]}
{"text": "Touching again.", "tool_calls": [{"name": "shell", "arguments": {"command": "touch refused.txt"}}]}
{"text": "Asked twice."}
{"text": "Loaded answer."}
"#;

#[test]
fn an_editor_session_edits_asks_and_is_loaded_again() {
    if !docker_available() {
        return;
    }
    let s = setup(SESSION_CASSETTE);
    let cwd = s.workspace.display().to_string();
    let first = client(
        &s,
        "first",
        json!([
            {"op": "initialize"},
            {"op": "new_session", "cwd": cwd},
            {"op": "prompt", "text": "edit hello.txt"},
            {"op": "prompt", "text": "now touch two files"},
            {"op": "unknown_method"},
            {"op": "malformed"},
            {"op": "set_mode", "mode": "ask"},
            {"op": "prompt", "text": "/compact"},
        ]),
        &["allow_once", "reject_once"],
    );

    // initialize: protocol 1, loadSession, what prompts may hold.
    let init = &step(&first, "initialize")["response"];
    assert_eq!(init["protocolVersion"], 1, "{init}");
    assert_eq!(init["agentCapabilities"]["loadSession"], true, "{init}");
    assert_eq!(init["agentInfo"]["name"], "nerve", "{init}");
    let id = step(&first, "new_session")["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The first prompt: text chunks, the shell call and the edit with its diff.
    let prompts = steps_of(&first, "prompt");
    assert_eq!(prompts[0]["stop_reason"], "end_turn", "{first}");
    let updates = &prompts[0]["updates"];
    let kinds = kinds(updates);
    assert!(
        kinds.contains(&"agent_message_chunk".to_owned()),
        "{kinds:?}"
    );
    assert!(text_of(updates, "agent_message_chunk").contains("Done editing."));
    let calls: Vec<&Value> = updates
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call")
        .collect();
    assert_eq!(calls.len(), 2, "{updates}");
    assert_eq!(calls[0]["kind"], "execute");
    assert_eq!(calls[1]["kind"], "edit");
    assert_eq!(
        calls[1]["locations"][0]["path"],
        s.workspace.join("hello.txt").display().to_string()
    );
    let diff = updates
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call_update")
        .flat_map(|u| u["content"].as_array().cloned().unwrap_or_default())
        .find(|c| c["type"] == "diff")
        .unwrap_or_else(|| panic!("no diff: {updates}"));
    assert_eq!(diff["oldText"], "world");
    assert_eq!(diff["newText"], "editor");
    assert_eq!(
        std::fs::read_to_string(s.workspace.join("hello.txt")).unwrap(),
        "hello editor\n"
    );
    // The secret in the call and in its output is redacted, not dropped.
    let shell_output = updates
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed")
        .find_map(|u| u["content"][0]["content"]["text"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        shell_output.contains("[REDACTED:OPENAI_API_KEY]"),
        "{shell_output}"
    );

    // The second prompt: two permission requests, allowed once then rejected.
    assert_eq!(prompts[1]["stop_reason"], "end_turn", "{first}");
    let permissions = first["permissions"].as_array().unwrap();
    assert_eq!(permissions.len(), 2, "{permissions:?}");
    let options: Vec<&str> = permissions[0]["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(options, ["allow_once", "allow_always", "reject_once"]);
    assert!(s.workspace.join("allowed.txt").exists());
    assert!(!s.workspace.join("refused.txt").exists());
    let failed = prompts[1]["updates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["status"] == "failed")
        .unwrap_or_else(|| panic!("the refused call did not fail: {}", prompts[1]));
    assert!(
        failed["content"][0]["content"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("denied by the user"),
        "{failed}"
    );

    // The wire's errors: the agent answers them and keeps serving.
    let unknown = &step(&first, "unknown_method")["error"];
    assert_eq!(unknown["code"], -32601, "{unknown}");
    let malformed = &step(&first, "malformed")["error"];
    assert_eq!(malformed["code"], -32700, "{malformed}");
    assert_eq!(step(&first, "set_mode")["ok"], true, "{first}");

    // The slash commands: offered once the session is open, and `/compact` alone is
    // answered by the agent itself (no model call: the cassette has no line for it).
    let offered: Vec<&str> = first["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] == "available_commands_update")
        .flat_map(|u| u["availableCommands"].as_array().unwrap().iter())
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["plan", "compact"], "{first}");
    assert_eq!(prompts[2]["stop_reason"], "end_turn", "{first}");
    assert!(
        text_of(&prompts[2]["updates"], "agent_message_chunk")
            .contains("compacted before your next message"),
        "{first}"
    );

    // Both answers are in the log as a terminal's are; the start names the front end.
    let log = events(&s.db, &id);
    let decided: Vec<(&str, &str)> = log
        .iter()
        .filter(|e| e["kind"] == "approval_decided")
        .map(|e| {
            (
                e["payload"]["decision"].as_str().unwrap(),
                e["payload"]["decided_by"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [("approved", "user"), ("denied", "user")],
        "{log:?}"
    );
    let started = &log[0]["payload"];
    assert_eq!(started["config"]["front_end"], "acp", "{started}");
    assert_eq!(started["config"]["client"]["name"], "acp-e2e", "{started}");
    verifies_and_replays_complete(&s.db, &id);

    // A second client process loads the session: the transcript again, then a prompt.
    let second = client(
        &s,
        "second",
        json!([
            {"op": "initialize"},
            {"op": "load_session", "cwd": cwd, "session_id": id},
            {"op": "prompt", "text": "and now?"},
        ]),
        &[],
    );
    let replayed = &step(&second, "load_session")["replayed"];
    assert!(
        text_of(replayed, "user_message_chunk").contains("edit hello.txt"),
        "{replayed}"
    );
    assert!(
        text_of(replayed, "agent_message_chunk").contains("Done editing."),
        "{replayed}"
    );
    assert!(!replayed.to_string().contains(SECRET));
    let after = step(&second, "prompt");
    assert_eq!(after["stop_reason"], "end_turn", "{second}");
    assert!(text_of(&after["updates"], "agent_message_chunk").contains("Loaded answer."));
    let replay = verifies_and_replays_complete(&s.db, &id);
    assert_eq!(replay["termination_reason"], "completed", "{replay}");
}

#[test]
fn a_cancel_during_a_long_command_answers_cancelled_at_once() {
    if !docker_available() {
        return;
    }
    let s = setup(
        r#"{"text": "Sleeping.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 10"}}]}
{"text": "Never said."}
"#,
    );
    let cwd = s.workspace.display().to_string();
    let result = client(
        &s,
        "cancel",
        json!([
            {"op": "initialize"},
            {"op": "new_session", "cwd": cwd},
            {"op": "prompt_cancel", "text": "sleep", "after": "tool_call"},
        ]),
        &[],
    );
    let cancelled = step(&result, "prompt_cancel");
    assert_eq!(cancelled["stop_reason"], "cancelled", "{result}");
    let secs = cancelled["cancel_secs"].as_f64().unwrap();
    assert!(secs < 2.0, "the cancel took {secs:.2} s");
    assert!(!text_of(&cancelled["updates"], "agent_message_chunk").contains("Never said."));
    let id = step(&result, "new_session")["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let replay = verifies_and_replays_complete(&s.db, &id);
    assert_eq!(replay["termination_reason"], "shutdown", "{replay}");
}

#[test]
fn an_editor_that_goes_away_during_a_permission_parks_the_execution() {
    if !docker_available() {
        return;
    }
    let s = setup(
        r#"{"text": "Touching.", "tool_calls": [{"name": "shell", "arguments": {"command": "touch later.txt"}}]}
{"text": "Touched."}
"#,
    );
    let cwd = s.workspace.display().to_string();
    let result = client(
        &s,
        "abandon",
        json!([
            {"op": "initialize"},
            {"op": "new_session", "cwd": cwd},
            {"op": "prompt_abandon", "text": "touch a file"},
        ]),
        &["never"],
    );
    assert_eq!(step(&result, "prompt_abandon")["asked"], true, "{result}");
    let id = step(&result, "new_session")["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let verify = nerve(&s.db, &["verify", &id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let replay = nerve(&s.db, &["replay", &id, "--json"]);
    let replay: Value = serde_json::from_str(stdout(&replay).trim()).unwrap();
    assert_eq!(replay["termination_reason"], "parked", "{replay}");
    assert!(!s.workspace.join("later.txt").exists());
    // Decided from the terminal, it goes on where it stopped.
    let approve = nerve(&s.db, &["approve", &id]);
    assert!(approve.status.success(), "{}", stderr(&approve));
    let resume = nerve(&s.db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    assert!(s.workspace.join("later.txt").exists());
    verifies_and_replays_complete(&s.db, &id);
}
