//! Skills end to end: a skill from the user's folder (`$XDG_CONFIG_HOME/nerve/skills/`) and
//! one from the project's (`.nerve/skills/`) are listed in the system prompt by name and
//! description only (an OpenAI-compatible server in the test records every request); the
//! model's `skill` calls return the body, and a file of the folder; each load is a
//! `skill_loaded` event that `show` names; a malformed `SKILL.md` is skipped with one
//! warning naming the file.

use std::path::Path;

use serde_json::{Value, json};

use crate::proxy::{fake_model, tool_call};
use crate::support::{events_json, last_json, nerve, nerve_env, sandbox_available, stderr, stdout};

const DEPLOY_BODY: &str = "Run the deploy checklist before anything else.";
const PDF_BODY: &str = "Use pdftotext -layout to read PDFs.";

fn setup(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let workspace = dir.join("workspace");
    let deploy = workspace.join(".nerve/skills/deploy");
    std::fs::create_dir_all(&deploy).unwrap();
    std::fs::write(
        deploy.join("SKILL.md"),
        format!("---\nname: deploy\ndescription: Deploying the service.\n---\n{DEPLOY_BODY}\n"),
    )
    .unwrap();
    std::fs::write(deploy.join("checklist.md"), "1. tests pass\n").unwrap();
    let broken = workspace.join(".claude/skills/broken");
    std::fs::create_dir_all(&broken).unwrap();
    std::fs::write(broken.join("SKILL.md"), "---\nname: broken\n").unwrap();
    let config_home = dir.join("config");
    let pdf = config_home.join("nerve/skills/pdf");
    std::fs::create_dir_all(&pdf).unwrap();
    std::fs::write(
        pdf.join("SKILL.md"),
        format!("---\nname: pdf\ndescription: \"Reading PDF files.\"\n---\n{PDF_BODY}\n"),
    )
    .unwrap();
    (workspace, config_home)
}

#[test]
fn skills_are_listed_loaded_on_request_and_recorded() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, config_home) = setup(dir.path());
    let db = dir.path().join("nerve.db");
    let model = fake_model(vec![
        tool_call("call_1", "skill", json!({"name": "deploy"})),
        tool_call(
            "call_2",
            "skill",
            json!({"name": "deploy", "file": "checklist.md"}),
        ),
        tool_call("call_3", "skill", json!({"name": "pdf"})),
        json!({"content": "done"}),
    ]);
    let url = format!("http://127.0.0.1:{}/v1", model.port);
    let output = nerve_env(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "deploy it",
            "--provider",
            "openai",
            "--model",
            "test-model",
            "--json",
        ],
        &[
            ("OPENAI_BASE_URL", url.as_str()),
            ("XDG_CONFIG_HOME", config_home.to_str().unwrap()),
        ],
    );
    assert!(
        output.status.success(),
        "{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    let id = last_json(&output)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // One warning, naming the malformed file.
    let err = stderr(&output);
    let broken = workspace.join(".claude/skills/broken/SKILL.md");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("skill")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(warnings[0].contains(&broken.display().to_string()), "{err}");
    assert!(warnings[0].contains("no closing line"), "{err}");

    let requests: Vec<Value> = model
        .requests()
        .iter()
        .map(|raw| {
            let (_, body) = raw.split_once("\n\n").unwrap();
            serde_json::from_str::<Value>(body).unwrap()
        })
        .collect();
    assert_eq!(requests.len(), 4);
    // The system prompt: names and descriptions, no bodies.
    let system = requests[0]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("- deploy: Deploying the service."),
        "{system}"
    );
    assert!(system.contains("- pdf: Reading PDF files."), "{system}");
    assert!(!system.contains(DEPLOY_BODY), "{system}");
    assert!(!system.contains(PDF_BODY), "{system}");
    assert!(!system.contains("broken"), "{system}");
    let tools: Vec<&str> = requests[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(tools.contains(&"skill"), "{tools:?}");
    // Each call's result is what it asked for.
    let result = |request: &Value| {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|m| m["role"] == "tool")
            .unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let deploy = result(&requests[1]);
    assert!(deploy.contains(DEPLOY_BODY), "{deploy}");
    assert!(deploy.contains("- checklist.md"), "{deploy}");
    assert_eq!(result(&requests[2]), "1. tests pass\n");
    assert!(result(&requests[3]).contains(PDF_BODY));
    // The system prompt stays as it was.
    assert_eq!(requests[3]["messages"][0], requests[0]["messages"][0]);

    let loaded: Vec<Value> = events_json(&db, &id)
        .into_iter()
        .filter(|e| e["kind"] == "skill_loaded")
        .map(|e| e["payload"].clone())
        .collect();
    assert_eq!(loaded.len(), 3, "{loaded:?}");
    assert_eq!(loaded[0]["name"], "deploy");
    assert_eq!(loaded[0]["source"], "workspace");
    assert_eq!(loaded[0]["path"], ".nerve/skills/deploy/SKILL.md");
    assert_eq!(loaded[0]["call_id"], "call_1");
    assert_eq!(loaded[1]["file"], "checklist.md");
    assert_eq!(loaded[2]["name"], "pdf");
    assert_eq!(loaded[2]["source"], "user");
    let replay = nerve(&db, &["replay", &id, "--json"]);
    assert_eq!(last_json(&replay)["complete"], true);
    let shown = stdout(&nerve(&db, &["show", &id]));
    assert!(shown.contains("skill loaded: deploy (workspace"), "{shown}");
    assert!(shown.contains("skill loaded: pdf (user"), "{shown}");
    let verify = nerve(&db, &["verify", &id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
}
