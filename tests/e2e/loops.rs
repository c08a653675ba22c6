//! Every loop driven end to end by a cassette through `nerve run`, in the real sandbox.

use crate::support::{copy_example, docker_available, last_json, nerve, root, stderr};

/// Runs the demo task with `cassette` and extra flags; returns the run's JSON and the
/// greeting left in the workspace.
fn run_demo(cassette: &str, flags: &[&str]) -> (serde_json::Value, serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let script = format!(
        "script:{}",
        root().join("examples/demo").join(cassette).display()
    );
    let mut args = vec![
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task",
        "Make test.sh pass.",
        "--provider",
        &script,
        "--json",
    ];
    args.extend_from_slice(flags);
    let run = nerve(&db, &args);
    let result = last_json(&run);
    let id = result["execution_id"].as_str().unwrap().to_owned();
    let replay = last_json(&nerve(&db, &["replay", &id, "--json"]));
    assert!(nerve(&db, &["verify", &id]).status.success());
    let events = last_json(&nerve(&db, &["events", &id, "--json"]));
    let started = events[0]["payload"].clone();
    assert_eq!(replay["complete"], true, "{replay}");
    assert!(run.status.success(), "{}: {}", result, stderr(&run));
    let greeting = std::fs::read_to_string(workspace.join("greet.sh")).unwrap();
    (result, started, greeting)
}

#[test]
fn plan_execute_replans_a_failed_step_and_completes() {
    if !docker_available() {
        return;
    }
    let (result, started, greeting) = run_demo("plan_execute.jsonl", &["--loop", "plan_execute"]);
    assert_eq!(result["termination_reason"], "completed");
    assert_eq!(result["total_turns"], 8, "{result}");
    assert_eq!(started["loop_type"], "plan_execute");
    assert!(greeting.contains("Hello, Nerve!"));
}

#[test]
fn hybrid_runs_steps_with_checkpoints() {
    if !docker_available() {
        return;
    }
    let (result, started, greeting) = run_demo("hybrid.jsonl", &["--loop", "hybrid"]);
    assert_eq!(result["termination_reason"], "completed");
    assert_eq!(result["total_turns"], 6, "{result}");
    assert_eq!(started["loop_type"], "hybrid");
    assert!(greeting.contains("Hello, Nerve!"));
}

#[test]
fn react_and_auto_resolve_and_complete() {
    if !docker_available() {
        return;
    }
    let (result, started, _) = run_demo("cassette.jsonl", &["--loop", "react"]);
    assert_eq!(result["termination_reason"], "completed");
    assert_eq!(started["loop_type"], "react");
    // auto with a medium task resolves to plan_execute, recorded in the start event.
    let (result, started, greeting) = run_demo(
        "plan_execute.jsonl",
        &["--loop", "auto", "--complexity", "medium"],
    );
    assert_eq!(result["termination_reason"], "completed");
    assert_eq!(started["loop_type"], "plan_execute");
    assert_eq!(started["config"]["requested_loop"], "auto");
    assert!(greeting.contains("Hello, Nerve!"));
}
