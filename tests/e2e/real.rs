//! The real `nerve` binary against real model servers that no one on this project wrote:
//! llama.cpp's server (llama-cpp-python) running SmolLM2-135M-Instruct, reached directly
//! with `--provider openai`, and LiteLLM's proxy in front of it, reached with `--provider
//! openai` and with `--provider anthropic` (its Messages endpoint). `cargo xtask
//! test-real` starts the servers and sets `NERVE_REAL_*`;
//! without them these tests skip with a printed reason, unless `NERVE_REQUIRE_REAL=1`.
//!
//! A 135M model is a weak agent: it names tools that do not exist, writes odd arguments,
//! and answers in text where a call was meant. Whatever it does, every request Nerve sends
//! must be accepted, and its mistakes must reach it as error results, never end the run.

use std::path::Path;
use std::process::Output;
use std::sync::Mutex;

use crate::support::{events_json, last_json, nerve_env, sandbox_available, stderr, stdout};

/// The servers `cargo xtask test-real` started.
struct Servers {
    llama: String,
    litellm: String,
    key: String,
    llama_key: String,
    window: String,
}

/// The servers, or `None` (with the reason printed) when this run has none. Panics when
/// they are required (`NERVE_REQUIRE_REAL=1`).
fn servers() -> Option<Servers> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let found = (|| {
        Some(Servers {
            llama: var("NERVE_REAL_LLAMA_URL")?,
            litellm: var("NERVE_REAL_LITELLM_URL")?,
            key: var("NERVE_REAL_LITELLM_KEY")?,
            llama_key: var("NERVE_REAL_LLAMA_KEY")?,
            window: var("NERVE_REAL_CONTEXT_WINDOW")?,
        })
    })();
    if found.is_none() {
        let reason = "no real model servers (NERVE_REAL_* unset): run `cargo xtask test-real`";
        assert!(
            !std::env::var("NERVE_REQUIRE_REAL").is_ok_and(|v| v == "1"),
            "{reason}"
        );
        eprintln!("skipping: {reason}");
        return None;
    }
    if !sandbox_available() {
        return None;
    }
    found
}

/// One llama.cpp server on two cores: one run at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One way to reach the model.
struct Route {
    name: &'static str,
    provider: &'static str,
    env: Vec<(&'static str, String)>,
}

fn routes(servers: &Servers, config: &Path) -> Vec<Route> {
    vec![
        Route {
            name: "llama.cpp direct",
            provider: "openai",
            env: vec![
                ("OPENAI_BASE_URL", servers.llama.clone()),
                ("OPENAI_API_KEY", servers.llama_key.clone()),
            ],
        },
        Route {
            name: "LiteLLM chat completions",
            provider: "openai",
            env: vec![
                ("OPENAI_BASE_URL", format!("{}/v1", servers.litellm)),
                ("OPENAI_API_KEY", servers.key.clone()),
            ],
        },
        Route {
            name: "LiteLLM messages",
            provider: "anthropic",
            env: vec![
                ("ANTHROPIC_BASE_URL", servers.litellm.clone()),
                ("ANTHROPIC_API_KEY", servers.key.clone()),
                // A gateway in front of a model that is not Claude: no cache breakpoints.
                ("NERVE_CONFIG", config.display().to_string()),
            ],
        },
    ]
}

/// `nerve run` through `route` on a fresh workspace, as JSON.
fn run_task(
    dir: &Path,
    db: &Path,
    servers: &Servers,
    route: &Route,
    task: &str,
    max_turns: &str,
) -> Output {
    let workspace = dir.join(format!("workspace-{}", route.name.replace(' ', "-")));
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("notes.txt"), "apples\npears\n").unwrap();
    let env: Vec<(&str, &str)> = route.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    nerve_env(
        db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            task,
            "--provider",
            route.provider,
            "--model",
            "smollm2",
            "--context-window",
            &servers.window,
            "--max-turns",
            max_turns,
            "--timeout",
            "600",
            "--json",
        ],
        &env,
    )
}

/// The `model_called` outcomes of an execution, and how many tool calls finished (with
/// how many of them errors).
struct Trace {
    outcomes: Vec<String>,
    ok_after_first_tool: usize,
    tools_finished: usize,
    tool_errors: usize,
    retries: usize,
}

fn trace(db: &Path, id: &str) -> Trace {
    let events = events_json(db, id);
    let mut trace = Trace {
        outcomes: Vec::new(),
        ok_after_first_tool: 0,
        tools_finished: 0,
        tool_errors: 0,
        retries: 0,
    };
    for event in &events {
        let payload = &event["payload"];
        match event["kind"].as_str().unwrap_or_default() {
            "model_called" => {
                let outcome = payload["outcome"].as_str().unwrap_or_default().to_owned();
                if trace.tools_finished > 0 && outcome == "ok" {
                    trace.ok_after_first_tool += 1;
                }
                trace.outcomes.push(outcome);
            }
            "tool_call_finished" => {
                trace.tools_finished += 1;
                if payload["result"]["is_error"] == true {
                    trace.tool_errors += 1;
                }
            }
            "retry" => trace.retries += 1,
            _ => {}
        }
    }
    trace
}

fn anthropic_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("nerve.toml");
    std::fs::write(&config, "[providers.anthropic]\nprompt_caching = false\n").unwrap();
    config
}

#[test]
fn every_route_runs_tools_and_answers_in_text() {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let config = anthropic_config(dir.path());
    for route in routes(&servers, &config) {
        // A tool call executes, and at least two more requests follow it.
        let output = run_task(
            dir.path(),
            &db,
            &servers,
            &route,
            "Use the shell tool to run `ls`, then use the shell tool to run `cat notes.txt`, then say which fruits are listed.",
            "6",
        );
        let summary = last_json(&output);
        let id = summary["execution_id"].as_str().unwrap();
        let tools = trace(&db, id);
        let shown = format!("{}: {summary} {}", route.name, stderr(&output));
        assert!(tools.tools_finished >= 1, "no tool ran: {shown}");
        assert!(
            tools.ok_after_first_tool >= 2,
            "{} requests accepted after the first tool: {shown}",
            tools.ok_after_first_tool
        );
        // Whatever the model wrote, the server accepted every request.
        assert!(
            tools.outcomes.iter().all(|o| o == "ok"),
            "{:?}: {shown}",
            tools.outcomes
        );
        assert_eq!(tools.retries, 0, "{shown}");
        assert_ne!(summary["termination_reason"], "error", "{shown}");

        // A run that ends with the model's text.
        let output = run_task(
            dir.path(),
            &db,
            &servers,
            &route,
            "Say hello in one short sentence. Do not use any tool.",
            "3",
        );
        let summary = last_json(&output);
        let id = summary["execution_id"].as_str().unwrap();
        let text = trace(&db, id);
        let shown = format!("{}: {summary} {}", route.name, stderr(&output));
        assert!(
            text.outcomes.iter().all(|o| o == "ok"),
            "{:?}: {shown}",
            text.outcomes
        );
        assert_eq!(summary["termination_reason"], "completed", "{shown}");
        let events = events_json(&db, id);
        let last_answer = events
            .iter()
            .rev()
            .find(|e| {
                e["kind"] == "message_appended" && e["payload"]["message"]["role"] == "assistant"
            })
            .map(|e| e["payload"]["message"]["parts"].clone())
            .unwrap_or_default();
        let parts = last_answer.as_array().cloned().unwrap_or_default();
        assert!(
            parts
                .iter()
                .any(|p| p["type"] == "text"
                    && p["text"].as_str().is_some_and(|t| !t.trim().is_empty()))
                && !parts.iter().any(|p| p["type"] == "tool_call"),
            "the run ends with text: {last_answer} {shown}"
        );
    }
    // The keys are nowhere on disk: not in the database, its WAL or its shared memory.
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", db.display());
        if let Ok(bytes) = std::fs::read(&path) {
            for key in [&servers.key, &servers.llama_key] {
                assert!(
                    !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
                    "a key is in {path}"
                );
            }
        }
    }
}

#[test]
fn a_wrong_key_is_one_line_and_no_retries() {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let config = anthropic_config(dir.path());
    // Not `sk-...`: LiteLLM without a database answers a key of that shape with 400 "No
    // connected db." (it would look the key up), and any other key with 401.
    let wrong = "wrong-key-for-nerve-tests";
    for route in routes(&servers, &config) {
        let mut route = route;
        for (name, value) in &mut route.env {
            if name.ends_with("_API_KEY") {
                *value = wrong.to_owned();
            }
        }
        let env: Vec<(&str, &str)> = route.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let workspace = dir.path().join(format!("ws-{}", route.provider));
        std::fs::create_dir_all(&workspace).unwrap();
        let output = nerve_env(
            &db,
            &[
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--task",
                "say hi",
                "--provider",
                route.provider,
                "--model",
                "smollm2",
                "--context-window",
                &servers.window,
            ],
            &env,
        );
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let out = stdout(&output);
        assert_eq!(out.lines().count(), 1, "one line: {out}");
        // llama.cpp's server says 401; LiteLLM without a database says 400 "No connected
        // db." to any key but its master key. Either way: permanent, in its own words.
        let (outcome, expected) = if route.name.starts_with("llama") {
            (
                "auth",
                format!("provider error: auth: HTTP 401 from {}", route.provider),
            )
        } else {
            (
                "bad_request",
                format!(
                    "provider error: bad_request: HTTP 400 from {}: No connected db.",
                    route.provider
                ),
            )
        };
        assert!(out.contains(&expected), "`{expected}` in: {out}");
        let id = out.split(':').next().unwrap();
        let wrong_run = trace(&db, id);
        assert_eq!(wrong_run.outcomes, vec![outcome.to_owned()], "{out}");
        assert_eq!(wrong_run.retries, 0, "{out}");
        let events = serde_json::to_string(&events_json(&db, id)).unwrap();
        assert!(!events.contains(wrong), "the key is in the events");
    }
}
