//! Project instructions end to end: the user's `AGENTS.md`, the workspace root's and a
//! subdirectory's reach the model's requests (an OpenAI-compatible server in the test that
//! records every request) and the log (`instructions_loaded`, with each text's SHA-256), and
//! `show` names them; `--no-project-instructions` gives the model none of them.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::proxy::{Server, fake_model, tool_call};
use crate::support::{events_json, last_json, nerve, nerve_env, sandbox_available, stderr, stdout};

const ROOT: &str = "Always answer in French.\n";
const NESTED: &str = "In web/, indent with tabs.\n";
const USER: &str = "The user prefers short answers.\n";

/// A workspace with instructions at its root (`AGENTS.md`) and in `web/` (`CLAUDE.md`, the
/// fallback name), and a user configuration directory with the user's own file.
fn setup(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(workspace.join("web/src")).unwrap();
    std::fs::write(workspace.join("AGENTS.md"), ROOT).unwrap();
    std::fs::write(workspace.join("web/CLAUDE.md"), NESTED).unwrap();
    std::fs::write(workspace.join("web/src/app.js"), "let x = 1;\n").unwrap();
    let config_home = dir.join("config");
    std::fs::create_dir_all(config_home.join("nerve")).unwrap();
    std::fs::write(config_home.join("nerve/AGENTS.md"), USER).unwrap();
    (workspace, config_home)
}

fn run(db: &Path, workspace: &Path, config_home: &Path, model: &Server, extra: &[&str]) -> Output {
    let url = format!("http://127.0.0.1:{}/v1", model.port);
    let mut args = vec![
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task",
        "look at the app",
        "--provider",
        "openai",
        "--model",
        "test-model",
        "--json",
    ];
    args.extend_from_slice(extra);
    let output = nerve_env(
        db,
        &args,
        &[
            ("OPENAI_BASE_URL", url.as_str()),
            ("XDG_CONFIG_HOME", config_home.to_str().unwrap()),
        ],
    );
    assert!(
        output.status.success(),
        "nerve run failed: {}\n{}",
        stdout(&output),
        stderr(&output)
    );
    output
}

fn sha256(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn model() -> Server {
    fake_model(vec![
        tool_call("call_1", "read_file", json!({"path": "web/src/app.js"})),
        json!({"content": "fini"}),
    ])
}

/// The `messages` of each request the model got.
fn requests(model: &Server) -> Vec<Value> {
    model
        .requests()
        .iter()
        .map(|raw| {
            let (_, body) = raw.split_once("\n\n").unwrap();
            serde_json::from_str::<Value>(body).unwrap()["messages"].clone()
        })
        .collect()
}

#[test]
fn root_nested_and_user_instructions_reach_the_model_and_the_log() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, config_home) = setup(dir.path());
    let db = dir.path().join("nerve.db");
    let model = model();
    let output = run(&db, &workspace, &config_home, &model, &[]);
    let id = last_json(&output)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let requests = requests(&model);
    assert_eq!(requests.len(), 2, "{requests:?}");
    // The first request: the system message holds the user's file and the root's, not
    // web/'s (the agent has not worked there yet).
    let system = requests[0][0]["content"].as_str().unwrap();
    assert_eq!(requests[0][0]["role"], "system");
    assert!(system.contains(ROOT.trim()), "{system}");
    assert!(system.contains(USER.trim()), "{system}");
    assert!(!system.contains(NESTED.trim()), "{system}");
    // The second: reading web/src/app.js brought web/CLAUDE.md in, with the call's result.
    let tool = requests[1]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    let result = tool["content"].as_str().unwrap();
    assert!(result.contains("let x = 1;"), "{result}");
    assert!(result.contains(NESTED.trim()), "{result}");
    assert!(result.contains("web/CLAUDE.md"), "{result}");
    // The system prompt stays as it was (the prefix the server may cache).
    assert_eq!(requests[1][0], requests[0][0]);

    // The log: what was given, where from, and its hash.
    let loaded: Vec<Value> = events_json(&db, &id)
        .into_iter()
        .filter(|e| e["kind"] == "instructions_loaded")
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(loaded.len(), 2, "{loaded:?}");
    assert_eq!(loaded[0]["turn"], 0);
    let files = loaded[0]["files"].as_array().unwrap();
    assert_eq!(files[0]["source"], "user");
    assert_eq!(files[0]["sha256"], sha256(USER));
    assert_eq!(files[1]["source"], "workspace");
    assert_eq!(files[1]["path"], "AGENTS.md");
    assert_eq!(files[1]["sha256"], sha256(ROOT));
    assert_eq!(files[1]["bytes"], ROOT.len());
    assert_eq!(files[1]["truncated"], false);
    assert_eq!(loaded[1]["turn"], 1);
    assert_eq!(loaded[1]["files"][0]["path"], "web/CLAUDE.md");
    assert_eq!(loaded[1]["files"][0]["sha256"], sha256(NESTED));

    // The log holds the texts as the model got them: the system message, and the tool
    // result the nested file came with.
    let replay = nerve(&db, &["replay", &id, "--json"]);
    assert_eq!(last_json(&replay)["complete"], true);
    let appended: Vec<String> = events_json(&db, &id)
        .into_iter()
        .filter(|e| e["kind"] == "message_appended")
        .map(|e| e["payload"].to_string())
        .collect();
    assert!(
        appended[0].contains("Always answer in French."),
        "{appended:?}"
    );
    assert!(appended[0].contains("short answers"), "{appended:?}");
    assert!(
        appended.iter().any(|m| m.contains("indent with tabs")),
        "{appended:?}"
    );

    // show names the files.
    let show = nerve(&db, &["show", &id]);
    let shown = stdout(&show);
    assert!(
        shown.contains("project instructions: AGENTS.md (workspace"),
        "{shown}"
    );
    assert!(
        shown.contains("project instructions: web/CLAUDE.md (workspace"),
        "{shown}"
    );
}

#[test]
fn no_project_instructions_gives_the_model_none() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, config_home) = setup(dir.path());
    let db = dir.path().join("nerve.db");
    let model = model();
    let output = run(
        &db,
        &workspace,
        &config_home,
        &model,
        &["--no-project-instructions"],
    );
    let id = last_json(&output)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let requests = requests(&model);
    assert_eq!(requests.len(), 2, "{requests:?}");
    for request in &requests {
        let text = request.to_string();
        assert!(!text.contains("French"), "{text}");
        assert!(!text.contains("tabs"), "{text}");
        assert!(!text.contains("short answers"), "{text}");
    }
    let events = events_json(&db, &id);
    assert!(
        events.iter().all(|e| e["kind"] != "instructions_loaded"),
        "{events:?}"
    );
}
