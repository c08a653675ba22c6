//! The parked flow: a policy that asks before `sed -i` parks the demo run, `nerve approve`
//! decides, and `nerve resume` with the same config runs the approved call and completes.

use serde_json::json;

use crate::support::{copy_example, docker_available, last_json, nerve, root, stderr, stdout};

/// The policy of this flow, as a user would write it.
pub(crate) const ASK_BEFORE_SED: &str = r#"[policy]
rules = [{ tool = "shell", pattern = "sed -i", action = "ask" }]
"#;

#[test]
fn an_ask_rule_parks_the_run_and_approve_then_resume_completes_it() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, ASK_BEFORE_SED).unwrap();
    let config = config.to_str().unwrap();
    let provider = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let task = root().join("examples/demo/task.txt");

    let run = nerve(
        &db,
        &[
            "--config",
            config,
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task-file",
            task.to_str().unwrap(),
            "--provider",
            &provider,
            "--json",
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let parked = last_json(&run);
    assert_eq!(parked["termination_reason"], "parked", "{parked}");
    let id = parked["execution_id"].as_str().unwrap().to_owned();
    let error = parked["error"].as_str().unwrap();
    assert!(
        error.ends_with(&format!("waits for approval: nerve approve {id}")),
        "{error}"
    );
    let greeting = std::fs::read_to_string(workspace.join("greet.sh")).unwrap();
    assert!(
        greeting.contains("Hello, World!"),
        "the sed ran before approval"
    );

    // Resuming before a decision is refused, naming what waits.
    let early = nerve(&db, &["--config", config, "resume", &id]);
    assert_eq!(early.status.code(), Some(2), "{}", stderr(&early));
    assert!(
        stderr(&early).contains("waits for approval of shell"),
        "{}",
        stderr(&early)
    );

    let approve = nerve(
        &db,
        &[
            "--config",
            config,
            "approve",
            &id,
            "--reason",
            "the fix is right",
        ],
    );
    assert!(approve.status.success(), "{}", stderr(&approve));
    assert!(
        stdout(&approve).contains("approved shell call"),
        "{}",
        stdout(&approve)
    );
    // What to do next, with the settings resume needs.
    let next = format!(
        "continue it with: nerve --db {} --config {config} resume {id}",
        db.display()
    );
    assert!(stdout(&approve).contains(&next), "{}", stdout(&approve));
    // Decided once: a second approve finds nothing pending.
    let again = nerve(&db, &["approve", &id]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));

    let resume = nerve(&db, &["--config", config, "resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], 5, "{result}");
    let greeting = std::fs::read_to_string(workspace.join("greet.sh")).unwrap();
    assert!(greeting.contains("Hello, Nerve!"), "{greeting}");

    let replay = last_json(&nerve(&db, &["replay", &id, "--json"]));
    assert_eq!(replay["termination_reason"], "completed", "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");
    let events = crate::support::events_json(&db, &id);
    let decided: Vec<_> = events
        .iter()
        .filter(|e| e["kind"] == "approval_decided")
        .map(|e| {
            (
                e["payload"]["decision"].clone(),
                e["payload"]["decided_by"].clone(),
            )
        })
        .collect();
    assert_eq!(decided, [(json!("approved"), json!("user"))], "{events:?}");
    assert!(nerve(&db, &["verify", &id]).status.success());
}

/// A parked run's transcript ends with the steps that apply: approve, then resume, with the
/// log and the settings it ran with; not chat, which refuses a parked execution.
#[test]
fn a_parked_run_suggests_approve_and_resume_with_its_settings() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, ASK_BEFORE_SED).unwrap();
    let config = config.to_str().unwrap();
    let provider = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let task = root().join("examples/demo/task.txt");
    let run = nerve(
        &db,
        &[
            "--config",
            config,
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task-file",
            task.to_str().unwrap(),
            "--provider",
            &provider,
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let id = crate::chat::the_only_execution(&db);
    let text = format!("{}{}", stdout(&run), stderr(&run));
    let flags = format!("nerve --db {} --config {config} ", db.display());
    assert!(text.contains(&format!("{flags}approve {id}")), "{text}");
    assert!(text.contains(&format!("{flags}resume  {id}")), "{text}");
    assert!(!text.contains("<id>"), "{text}");
    assert!(!text.contains(" chat "), "{text}");
}
