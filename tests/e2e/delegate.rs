//! Delegation end to end, scripted, in the real sandbox: a parent delegates two children in
//! one turn (the cassette's `agent` lines are theirs); each runs tool calls in the shared
//! workspace; the parent goes on with both answers; `show` prints the tree; the parent and
//! both children verify; the parent's tokens and cost are its own plus the children's; and
//! a child that spends past its budget share ends `budget_exhausted`, which the parent
//! sees as the tool result.

use std::path::Path;

use serde_json::{Value, json};

use crate::crash::{replay_json, verify};
use crate::support::{
    events_json, last_json, nerve, sandbox_available, spawn_nerve, stderr, stdout, wait_for_event,
};

const CONFIG: &str = r#"
[delegation]
enabled = true

[[models]]
name = "scripted"
context_window = 32000
input_usd_per_million = 1.0
output_usd_per_million = 10.0
"#;

fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output})
}

/// Writes the cassette and the configuration into `dir` and returns `nerve run`'s
/// arguments on `dir/workspace` (before `extra`).
fn run_args(dir: &Path, lines: &[Value], extra: &[&str]) -> Vec<String> {
    std::fs::create_dir_all(dir.join("workspace")).unwrap();
    let script = dir.join("cassette.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&script, text).unwrap();
    let config = dir.join("nerve.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let mut args: Vec<String> = [
        "--config",
        config.to_str().unwrap(),
        "run",
        "--workspace",
        dir.join("workspace").to_str().unwrap(),
        "--task",
        "Do it through subagents.",
        "--provider",
        &format!("script:{}", script.display()),
        "--json",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

fn run(dir: &Path, db: &Path, lines: &[Value], extra: &[&str]) -> std::process::Output {
    let args = run_args(dir, lines, extra);
    nerve(db, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn children_of(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished" && !e["payload"]["child"].is_null())
        .map(|e| e["payload"]["child"].clone())
        .collect()
}

#[test]
fn two_children_in_one_turn_work_in_the_workspace_and_report_back() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let lines = [
        json!({"text": "Two subagents.", "usage": usage(1000, 100), "tool_calls": [
            {"id": "call_a", "name": "delegate", "arguments": {"task": "Write a.txt.", "name": "writer-a"}},
            {"id": "call_b", "name": "delegate", "arguments": {"task": "Write b.txt.", "name": "writer-b", "tools": ["shell"]}},
        ]}),
        json!({"agent": "writer-a", "usage": usage(300, 30), "tool_calls": [
            {"name": "write_file", "arguments": {"path": "a.txt", "content": "from a\n"}},
        ]}),
        json!({"agent": "writer-b", "usage": usage(200, 20), "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo from b > b.txt"}},
        ]}),
        json!({"agent": "writer-a", "usage": usage(300, 30), "text": "a.txt is written."}),
        json!({"agent": "writer-b", "usage": usage(200, 20), "text": "b.txt is written."}),
        json!({"usage": usage(1000, 100), "text": "Both files are written."}),
    ];
    let output = run(dir.path(), &db, &lines, &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = last_json(&output);
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert_eq!(summary["answer"], "Both files are written.");
    let workspace = dir.path().join("workspace");
    assert_eq!(
        std::fs::read_to_string(workspace.join("a.txt")).unwrap(),
        "from a\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("b.txt")).unwrap(),
        "from b\n"
    );
    let parent = summary["execution_id"].as_str().unwrap().to_owned();

    // The log links parent and children both ways.
    let events = events_json(&db, &parent);
    let children = children_of(&events);
    assert_eq!(children.len(), 2, "{events:?}");
    assert_eq!(children[0]["name"], "writer-a");
    assert_eq!(children[1]["name"], "writer-b");
    for (child, call) in children.iter().zip(["call_a", "call_b"]) {
        assert_eq!(child["termination_reason"], "completed");
        assert_eq!(child["turns"], 2);
        let id = child["execution_id"].as_str().unwrap();
        let started = &events_json(&db, id)[0]["payload"];
        assert_eq!(started["kind"], "started");
        assert_eq!(started["parent"], parent.as_str());
        assert_eq!(started["call_id"], call);
        verify(&db, id);
        assert_eq!(replay_json(&db, id)["complete"], true);
    }
    // The answers came back as the calls' results, in the parent's next request.
    let results: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            e["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(results[0].contains("a.txt is written."), "{results:?}");
    assert!(results[1].contains("b.txt is written."), "{results:?}");
    assert!(results[0].contains(children[0]["execution_id"].as_str().unwrap()));

    // One budget: the parent's totals are its own calls' and its children's.
    assert_eq!(summary["input_tokens"], 2000 + 600 + 400, "{summary}");
    assert_eq!(summary["output_tokens"], 200 + 60 + 40, "{summary}");
    let child_cost: f64 = children
        .iter()
        .map(|c| {
            replay_json(&db, c["execution_id"].as_str().unwrap())["cost_usd"]
                .as_f64()
                .unwrap()
        })
        .sum();
    let own = 2.0 * (1000.0 + 100.0 * 10.0) / 1e6;
    let cost = summary["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - (own + child_cost)).abs() < 1e-9,
        "{cost} vs {own} + {child_cost}"
    );
    let replayed = replay_json(&db, &parent);
    assert_eq!(replayed["complete"], true);
    // The parent's replay scores its children.
    let scored = replayed["children"].as_array().unwrap();
    assert_eq!(scored.len(), 2, "{replayed}");
    for (score, child) in scored.iter().zip(&children) {
        assert_eq!(score["execution_id"], child["execution_id"]);
        assert_eq!(score["complete"], true, "{score}");
        assert_eq!(score["termination_reason"], "completed");
    }
    assert!((replayed["cost_usd"].as_f64().unwrap() - cost).abs() < 1e-9);
    verify(&db, &parent);

    // show prints the tree.
    let shown = stdout(&nerve(&db, &["show", &parent]));
    for child in &children {
        let id = child["execution_id"].as_str().unwrap();
        assert!(
            shown.contains(&format!(
                "└─ child {id} `{}`",
                child["name"].as_str().unwrap()
            )),
            "{shown}"
        );
    }
    // The page pictures the children under the parent's turn.
    let page = dir.path().join("page.html");
    let html = nerve(&db, &["show", &parent, "--html", page.to_str().unwrap()]);
    assert!(html.status.success(), "{}", stderr(&html));
    let page = std::fs::read_to_string(page).unwrap();
    for child in &children {
        let id = child["execution_id"].as_str().unwrap();
        assert!(
            page.contains(&format!("child {id}")),
            "{id} not on the page"
        );
    }
    let id = children[0]["execution_id"].as_str().unwrap();
    let shown = stdout(&nerve(&db, &["show", id]));
    assert!(
        shown.contains(&format!("parent     {parent} (its call call_a)")),
        "{shown}"
    );
}

#[test]
fn a_child_past_its_budget_share_ends_budget_exhausted_and_the_parent_hears_it() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    // Budget 10,000 tokens; the parent's first call spends 1,000, so the child's share is
    // half of the 9,000 left: 4,500. Its calls spend 3,000 each: the third is refused.
    let lines = [
        json!({"usage": usage(900, 100), "tool_calls": [
            {"id": "call_big", "name": "delegate", "arguments": {"task": "Spend.", "name": "spender"}},
        ]}),
        json!({"agent": "spender", "usage": usage(2900, 100), "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo one"}},
        ]}),
        json!({"agent": "spender", "usage": usage(2900, 100), "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo two"}},
        ]}),
        json!({"agent": "spender", "text": "never reached"}),
        json!({"usage": usage(900, 100), "text": "The subagent ran out of budget."}),
    ];
    let output = run(dir.path(), &db, &lines, &["--budget-tokens", "10000"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = last_json(&output);
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    let parent = summary["execution_id"].as_str().unwrap().to_owned();
    let events = events_json(&db, &parent);
    let children = children_of(&events);
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["termination_reason"], "budget_exhausted");
    assert_eq!(children[0]["usage"]["input_tokens"], 5800);
    let result = events
        .iter()
        .find(|e| e["kind"] == "tool_call_finished")
        .unwrap();
    assert_eq!(result["payload"]["result"]["is_error"], true);
    let content = result["payload"]["result"]["content"].as_str().unwrap();
    assert!(content.contains("ended budget_exhausted"), "{content}");
    let child = children[0]["execution_id"].as_str().unwrap();
    let started = &events_json(&db, child)[0]["payload"];
    assert_eq!(started["config"]["budget_tokens"], 4500);
    assert_eq!(summary["input_tokens"], 900 + 5800 + 900, "{summary}");
    verify(&db, child);
    verify(&db, &parent);
}

/// The largest prompt of `id`'s own model calls, in tokens: its peak context fill (the
/// scripted provider counts the request it was sent when a line gives no usage).
fn peak_prompt(db: &Path, id: &str) -> u64 {
    events_json(db, id)
        .iter()
        .filter(|e| e["kind"] == "model_called")
        .map(|e| e["payload"]["usage"]["input_tokens"].as_u64().unwrap())
        .max()
        .unwrap()
}

/// The benchmark bullet of issue 36: eight files of about 2,000 tokens each (under the
/// size at which one output is offloaded at once) overflow a 16k window when one agent
/// reads them all; delegating each read to a child keeps the parent's peak fill under half
/// the window. Both figures are printed (docs/benchmarks.md, "Delegation").
#[test]
fn delegating_reads_keeps_the_parents_context_under_half_a_16k_window() {
    if !sandbox_available() {
        return;
    }
    const WINDOW: u64 = 16_000;
    const FILES: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let write_files = |workspace: &Path| {
        std::fs::create_dir_all(workspace.join("docs")).unwrap();
        for n in 0..FILES {
            let text: String = (0..130)
                .map(|i| {
                    format!(
                        "part {n} line {i}: measure {} of sample {} holds value {}\n",
                        i * 7 + n,
                        i * 13,
                        i * n + 3
                    )
                })
                .collect();
            std::fs::write(workspace.join(format!("docs/part{n}.txt")), text).unwrap();
        }
    };
    let window = WINDOW.to_string();
    let extra = ["--context-window", window.as_str(), "--max-turns", "30"];

    // Alone: the parent reads every file itself.
    let alone_dir = dir.path().join("alone");
    write_files(&alone_dir.join("workspace"));
    let mut lines: Vec<Value> = (0..FILES)
        .map(|n| json!({"tool_calls": [{"name": "read_file", "arguments": {"path": format!("docs/part{n}.txt")}}]}))
        .collect();
    lines.push(json!({"text": "Every part holds eight measures a line."}));
    let db = dir.path().join("alone.db");
    let output = run(&alone_dir, &db, &lines, &extra);
    assert!(output.status.success(), "{}", stderr(&output));
    let alone = last_json(&output);
    let alone_peak = peak_prompt(&db, alone["execution_id"].as_str().unwrap());

    // Delegating: one child per file, each answering in a line.
    let delegated_dir = dir.path().join("delegated");
    write_files(&delegated_dir.join("workspace"));
    let calls: Vec<Value> = (0..FILES)
        .map(|n| json!({"name": "delegate", "arguments": {"task": format!("Read docs/part{n}.txt and say what its lines hold."), "name": format!("reader-{n}")}}))
        .collect();
    let mut lines = vec![json!({"tool_calls": calls})];
    for n in 0..FILES {
        let agent = format!("reader-{n}");
        lines.push(json!({"agent": agent, "tool_calls": [{"name": "read_file", "arguments": {"path": format!("docs/part{n}.txt")}}]}));
        lines.push(json!({"agent": agent, "text": format!("docs/part{n}.txt: 130 lines, each a measure, a sample and a value.")}));
    }
    lines.push(json!({"text": "Every part holds a measure, a sample and a value a line."}));
    let db = dir.path().join("delegated.db");
    let output = run(&delegated_dir, &db, &lines, &extra);
    assert!(output.status.success(), "{}", stderr(&output));
    let delegated = last_json(&output);
    assert_eq!(delegated["termination_reason"], "completed", "{delegated}");
    let parent = delegated["execution_id"].as_str().unwrap().to_owned();
    let delegated_peak = peak_prompt(&db, &parent);
    let children = children_of(&events_json(&db, &parent));
    assert_eq!(children.len(), FILES);
    let child_peak = children
        .iter()
        .map(|c| peak_prompt(&db, c["execution_id"].as_str().unwrap()))
        .max()
        .unwrap();

    eprintln!(
        "peak context fill of a {WINDOW}-token window: alone {alone_peak} ({}%, {} compaction(s)), delegating {delegated_peak} ({}%; children at most {child_peak})",
        alone_peak * 100 / WINDOW,
        alone["compactions"],
        delegated_peak * 100 / WINDOW
    );
    // The transcript would overflow the window: alone, the agent needed compaction.
    assert!(alone["compactions"].as_u64().unwrap() > 0, "{alone}");
    assert!(delegated_peak < WINDOW / 2, "{delegated_peak}");
    assert!(
        delegated_peak < alone_peak,
        "{delegated_peak} vs {alone_peak}"
    );
}

/// SIGKILL while a child's tool call runs, then `resume` of the parent: the child resumes
/// first (its call in flight told to its model as in doubt, never run again), finishes, and
/// its answer is the parent's call's result; the parent completes. Every call that ran ran
/// once.
#[test]
fn a_parent_killed_during_its_childs_call_resumes_the_child_first() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let lines = [
        json!({"tool_calls": [
            {"id": "call_work", "name": "delegate", "arguments": {"task": "Log twice.", "name": "worker"}},
        ]}),
        json!({"agent": "worker", "tool_calls": [
            {"name": "shell", "arguments": {"command": "echo one >> log.txt"}},
        ]}),
        json!({"agent": "worker", "tool_calls": [
            {"name": "shell", "arguments": {"command": "sleep 30; echo two >> log.txt"}},
        ]}),
        json!({"agent": "worker", "text": "The worker is done."}),
        json!({"text": "All done."}),
    ];
    let args = run_args(dir.path(), &lines, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut running = spawn_nerve(&db, &args);
    let log = wait_for_event(&db, &mut running, "the child's sleep", |e| {
        e.kind == "tool_call_started"
            && e.payload["call"]["arguments"]["command"]
                .as_str()
                .is_some_and(|c| c.starts_with("sleep"))
    });
    running.kill();
    let parent = log
        .iter()
        .find(|e| e.kind == "started" && e.payload["parent"].is_null())
        .unwrap()
        .execution_id
        .clone();
    let child = log
        .iter()
        .find(|e| e.kind == "started" && e.payload["parent"] == parent.as_str())
        .unwrap()
        .execution_id
        .clone();

    let config = dir.path().join("nerve.toml");
    let resumed = nerve(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "resume",
            &parent,
            "--json",
        ],
    );
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let summary = last_json(&resumed);
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert_eq!(summary["answer"], "All done.");
    // The first command ran once; the one in flight at the kill never ran again.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("workspace/log.txt")).unwrap(),
        "one\n"
    );
    let child_events = events_json(&db, &child);
    assert!(child_events.iter().any(|e| e["kind"] == "resumed"));
    let notice = child_events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            e["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .find(|c| c.contains("effect is unknown"));
    assert!(notice.is_some(), "{child_events:?}");
    let started: Vec<&Value> = child_events
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .collect();
    assert_eq!(started.len(), 2, "each call started once: {started:?}");
    assert_eq!(replay_json(&db, &child)["termination_reason"], "completed");
    let children = children_of(&events_json(&db, &parent));
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["execution_id"], child.as_str());
    assert_eq!(children[0]["termination_reason"], "completed");
    let result = events_json(&db, &parent)
        .into_iter()
        .find(|e| e["kind"] == "tool_call_finished")
        .unwrap();
    let content = result["payload"]["result"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(content.contains("The worker is done."), "{content}");
    verify(&db, &child);
    verify(&db, &parent);
}

/// A child is a child also when it is resumed on its own: `nerve resume CHILD` keeps the
/// tools its `delegate` call gave it (a call of another is refused as a result, and does
/// nothing), `list` shows it under its parent, and the parent's resume afterwards takes
/// the child's ending from the log instead of running it again.
#[test]
fn a_child_resumed_on_its_own_keeps_its_tools_and_is_listed_under_its_parent() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    child_resumed_on_its_own(dir.path(), &db);
}

/// The same on a PostgreSQL log: the parent's resume finds its child there too.
#[test]
fn on_a_postgresql_log_a_child_is_found_listed_and_resumed_with_its_tools() {
    if !sandbox_available() {
        return;
    }
    let Some(pg) = crate::transfer::postgres_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    child_resumed_on_its_own(dir.path(), Path::new(&pg));
}

/// The parent and child ids once the child's `sleep` has started, read through `nerve`
/// itself (so on either backend).
fn wait_for_childs_sleep(db: &Path, running: &mut crate::support::Running) -> (String, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    // Ends: at the deadline, or when the run dies (both fail the test).
    loop {
        let listed = nerve(db, &["list", "--json"]);
        if let Ok(Value::Array(listed)) = serde_json::from_str::<Value>(&stdout(&listed))
            && let Some(child) = listed.iter().find(|e| e["parent"].is_string())
        {
            let id = child["execution_id"].as_str().unwrap().to_owned();
            let events = nerve(db, &["events", &id, "--json"]);
            let events: Value = serde_json::from_str(&stdout(&events)).unwrap_or(Value::Null);
            let sleeping = events.as_array().is_some_and(|events| {
                events.iter().any(|e| {
                    e["kind"] == "tool_call_started"
                        && e["payload"]["call"]["arguments"]["command"]
                            .as_str()
                            .is_some_and(|c| c.starts_with("sleep"))
                })
            });
            if sleeping {
                return (child["parent"].as_str().unwrap().to_owned(), id);
            }
        }
        running.assert_alive("the child's sleep");
        assert!(
            std::time::Instant::now() < deadline,
            "gave up waiting for the child's sleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn child_resumed_on_its_own(dir: &Path, db: &Path) {
    let lines = [
        json!({"tool_calls": [
            {"id": "call_work", "name": "delegate",
             "arguments": {"task": "Log once.", "name": "worker", "tools": ["shell"]}},
        ]}),
        json!({"agent": "worker", "tool_calls": [
            {"name": "shell", "arguments": {"command": "sleep 30; echo one >> log.txt"}},
        ]}),
        json!({"agent": "worker", "tool_calls": [
            {"name": "write_file", "arguments": {"path": "outside.txt", "content": "x"}},
        ]}),
        json!({"agent": "worker", "text": "The worker is done."}),
        json!({"text": "All done."}),
    ];
    let args = run_args(dir, &lines, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut running = spawn_nerve(db, &args);
    let (parent, child) = wait_for_childs_sleep(db, &mut running);
    running.kill();

    // The index knows the tree: `list --json` names the parent and the call, the table
    // prints the child right under its parent.
    let listed = nerve(db, &["list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listed: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let entry = |id: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["execution_id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(entry(&child)["parent"], parent.as_str());
    assert_eq!(entry(&child)["call_id"], "call_work");
    assert!(entry(&parent).get("parent").is_none(), "{listed}");
    let table = stdout(&nerve(db, &["list"]));
    let rows: Vec<&str> = table.lines().collect();
    let at = |id: &str| rows.iter().position(|r| r.starts_with(id)).unwrap();
    assert_eq!(at(&child), at(&parent) + 1, "{table}");
    assert!(rows[at(&child)].contains("└─ Log once."), "{table}");

    let config = dir.join("nerve.toml");
    let config = config.to_str().unwrap();
    let resumed = nerve(db, &["--config", config, "resume", &child, "--json"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_eq!(last_json(&resumed)["termination_reason"], "completed");
    assert!(
        !dir.join("workspace/outside.txt").exists(),
        "a tool the child was not given ran"
    );
    let refused = events_json(db, &child)
        .into_iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .filter_map(|e| {
            e["payload"]["result"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .find(|c| c.contains("`write_file` is not one of this subagent's tools"));
    assert!(refused.is_some(), "{:?}", events_json(db, &child));
    verify(db, &child);

    let resumed = nerve(db, &["--config", config, "resume", &parent, "--json"]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_eq!(last_json(&resumed)["answer"], "All done.");
    let child_events = events_json(db, &child);
    assert_eq!(
        child_events
            .iter()
            .filter(|e| e["kind"] == "resumed")
            .count(),
        1,
        "the ended child ran again"
    );
    let children = children_of(&events_json(db, &parent));
    assert_eq!(children.len(), 1);
    assert_eq!(children[0]["termination_reason"], "completed");
    verify(db, &parent);
}
