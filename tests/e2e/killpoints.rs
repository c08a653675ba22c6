//! Kill points at every event: `nerve run` of a scripted 10-turn react run and of a
//! plan_execute run (examples/killpoints, real sandbox, real binary) killed with SIGKILL
//! right after each event of the uninterrupted run is durable (`NERVE_KILL_AFTER_EVENT`),
//! and right before and right after each tool call (`NERVE_KILL_BEFORE_TOOL_CALL`,
//! `NERVE_KILL_AFTER_TOOL_CALL`). The switches exist only in a `nerve` built with the
//! `kill-points` features of nerve-session and nerve-hands (nerve-cli's `kill-points`
//! feature), which this package's dev-dependencies turn on in the `cargo test --workspace`
//! build.
//!
//! Each killed run's log verifies and replays with the gaps its events imply; `nerve
//! resume` completes it; the workspace ends byte for byte as after the uninterrupted run,
//! less the effect of a call the crash left in doubt before it ran (told to the model, never
//! re-run); and no call runs twice: each shell call appends its own tag to `calls.log`.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use serde_json::{Value, json};

use crate::crash::{check_sequence, completed_turns, replay_json, verify};
use crate::support::{
    containers_of, copy_example, docker_available, events_json, last_json, nerve, root,
    spawn_nerve_env, stderr, tree,
};

/// A cassette of examples/killpoints and how it is run.
struct Scenario {
    cassette: &'static str,
    loop_type: &'static str,
    /// Turns of the uninterrupted run.
    turns: u64,
}

const REACT: Scenario = Scenario {
    cassette: "react.jsonl",
    loop_type: "react",
    turns: 10,
};

const PLAN_EXECUTE: Scenario = Scenario {
    cassette: "plan_execute.jsonl",
    loop_type: "plan_execute",
    turns: 7,
};

/// Where the run dies.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// Once the event with this sequence number is durable.
    AfterEvent(u64),
    /// Right before the k-th tool call runs: its intent is logged, it never ran.
    BeforeToolCall(u64),
    /// Right after the k-th tool call returned: it ran, its finish is not logged.
    AfterToolCall(u64),
}

impl Kill {
    fn env(self) -> (&'static str, String) {
        match self {
            Self::AfterEvent(k) => ("NERVE_KILL_AFTER_EVENT", k.to_string()),
            Self::BeforeToolCall(k) => ("NERVE_KILL_BEFORE_TOOL_CALL", k.to_string()),
            Self::AfterToolCall(k) => ("NERVE_KILL_AFTER_TOOL_CALL", k.to_string()),
        }
    }

    /// Whether a call left in doubt by this kill had run.
    fn in_doubt_ran(self) -> bool {
        matches!(self, Self::AfterToolCall(_))
    }
}

/// The uninterrupted run of a scenario.
struct Baseline {
    events: Vec<Value>,
    tree: BTreeMap<String, Vec<u8>>,
}

impl Baseline {
    /// The tool calls the sandbox ran, in order.
    fn calls(&self) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["kind"] == "tool_call_started")
            .map(|e| &e["payload"]["call"])
            .collect()
    }
}

fn run_args(scenario: &Scenario, workspace: &Path) -> Vec<String> {
    let example = root().join("examples/killpoints");
    vec![
        "run".into(),
        "--workspace".into(),
        workspace.display().to_string(),
        "--task-file".into(),
        example.join("task.txt").display().to_string(),
        "--provider".into(),
        format!("script:{}", example.join(scenario.cassette).display()),
        "--loop".into(),
        scenario.loop_type.into(),
        "--json".into(),
    ]
}

fn baseline(scenario: &Scenario) -> Baseline {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("killpoints", dir.path());
    let db = dir.path().join("nerve.db");
    let args = run_args(scenario, &workspace);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = nerve(&db, &args);
    assert!(run.status.success(), "{}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], scenario.turns, "{result}");
    let id = result["execution_id"].as_str().unwrap();
    let events = events_json(&db, id);
    let tree = tree(&workspace);
    // Every shell call of the cassette ran once.
    let tags: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .filter_map(|e| shell_tag(&e["payload"]["call"]))
        .collect();
    assert_eq!(log_lines(&tree), tags, "calls.log of the uninterrupted run");
    Baseline { events, tree }
}

fn react_baseline() -> &'static Baseline {
    static BASELINE: OnceLock<Baseline> = OnceLock::new();
    BASELINE.get_or_init(|| baseline(&REACT))
}

fn plan_baseline() -> &'static Baseline {
    static BASELINE: OnceLock<Baseline> = OnceLock::new();
    BASELINE.get_or_init(|| baseline(&PLAN_EXECUTE))
}

/// The tag a shell call of the cassettes appends to calls.log (`echo TAG >> calls.log`).
fn shell_tag(call: &Value) -> Option<String> {
    if call["name"] != "shell" {
        return None;
    }
    let command = call["arguments"]["command"].as_str().unwrap();
    let tag = command
        .strip_prefix("echo ")
        .and_then(|rest| rest.split_once(" >> calls.log"))
        .unwrap_or_else(|| panic!("a shell call of the cassette logs no tag: {command}"))
        .0;
    Some(tag.to_owned())
}

fn log_lines(tree: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    tree.get("calls.log")
        .map(|log| {
            String::from_utf8_lossy(log)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// `tree` without the effect of `call`, by the cassettes' rule: a shell call's tag line in
/// calls.log, a write_file's new file, an edit_file's change to an initial file.
fn without_effect(tree: &mut BTreeMap<String, Vec<u8>>, call: &Value) {
    let path = || call["arguments"]["path"].as_str().unwrap().to_owned();
    match call["name"].as_str().unwrap() {
        "shell" => {
            let tag = shell_tag(call).unwrap();
            let lines: Vec<String> = log_lines(tree).into_iter().filter(|l| *l != tag).collect();
            if lines.is_empty() {
                tree.remove("calls.log");
            } else {
                tree.insert("calls.log".into(), format!("{}\n", lines.join("\n")).into());
            }
        }
        "write_file" => {
            tree.remove(&path());
        }
        "edit_file" => {
            let initial = root().join("examples/killpoints/workspace").join(path());
            tree.insert(path(), std::fs::read(initial).unwrap());
        }
        _ => {}
    }
}

/// A run killed at a kill point, with what it left behind.
struct Killed {
    _dir: tempfile::TempDir,
    db: PathBuf,
    workspace: PathBuf,
    id: String,
}

/// Runs `scenario` with `kill` armed and checks that it died of it.
fn kill_run(scenario: &Scenario, kill: Kill) -> Killed {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("killpoints", dir.path());
    let db = dir.path().join("nerve.db");
    let (name, value) = kill.env();
    let args = run_args(scenario, &workspace);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = spawn_nerve_env(&db, &args, &[(name, &value)]).wait();
    if output.status.success() {
        panic!(
            "nerve ran to the end with {name} set: this binary has no kill points; build it with \
             `cargo test --workspace` or `cargo build -p nerve-cli --features kill-points`"
        );
    }
    assert_eq!(
        output.status.signal(),
        Some(9),
        "{kill:?}: nerve must die of its own SIGKILL: {}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("kill point: SIGKILL"),
        "{kill:?}: {}",
        stderr(&output)
    );
    let log = crate::support::read_log(&db);
    let id = crate::crash::execution_id(&log);
    Killed {
        _dir: dir,
        db,
        workspace,
        id,
    }
}

/// The kinds of gap `replay` must report for a log, worked out from its events.
fn expected_gaps(events: &[Value]) -> Vec<&'static str> {
    let mut gaps = vec!["tool_call_in_doubt"; in_doubt(events).len()];
    let turn = |e: &Value| e["payload"]["turn"].as_u64().unwrap_or(0);
    let begun = events
        .iter()
        .filter(|e| e["kind"] == "model_called" || e["kind"] == "tool_call_started")
        .map(turn)
        .max()
        .unwrap_or(0);
    let completed = completed_turns(events).into_iter().max().unwrap_or(0);
    if begun > completed {
        gaps.push("turn_incomplete");
    }
    if events.last().is_none_or(|e| e["kind"] != "finish") {
        gaps.push("no_finish");
    }
    gaps
}

/// Calls started and never finished.
fn in_doubt(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .filter(|started| {
            !events.iter().any(|e| {
                e["kind"] == "tool_call_finished"
                    && e["payload"]["result"]["call_id"] == started["payload"]["call"]["id"]
            })
        })
        .map(|started| started["payload"]["call"].clone())
        .collect()
}

/// What identifies an event across runs of the same cassette (not its time or hash).
fn shape(event: &Value) -> Value {
    json!([
        event["kind"],
        event["payload"]["turn"],
        event["payload"]["call"]["id"],
        event["payload"]["result"]["call_id"],
    ])
}

/// How a kill point went, for the matrix's tally.
#[derive(Debug, PartialEq, Eq)]
enum Survived {
    /// Killed, checked, resumed to the uninterrupted run's workspace.
    Resumed,
    /// Killed after its finish was durable: complete, nothing to resume.
    Finished,
}

/// Kills `scenario` at `kill`, checks the log it left, resumes it and checks the outcome.
fn check(scenario: &Scenario, baseline: &Baseline, kill: Kill) -> Survived {
    let Killed {
        _dir,
        db,
        workspace,
        id,
    } = kill_run(scenario, kill);

    // The killed run's log: a prefix of the uninterrupted run's, cut where the kill says.
    let before = events_json(&db, &id);
    check_sequence(&before);
    assert!(
        before.len() <= baseline.events.len(),
        "{kill:?}: longer than the whole run"
    );
    assert_eq!(
        before.iter().map(shape).collect::<Vec<_>>(),
        baseline.events[..before.len()]
            .iter()
            .map(shape)
            .collect::<Vec<_>>(),
        "{kill:?}: the killed run's log is not a prefix of the uninterrupted run's"
    );
    let doubtful = in_doubt(&before);
    match kill {
        Kill::AfterEvent(k) => assert!(before.len() as u64 >= k, "{kill:?}: event {k} missing"),
        Kill::BeforeToolCall(k) | Kill::AfterToolCall(k) => {
            let call = baseline.calls()[usize::try_from(k).unwrap() - 1].clone();
            assert_eq!(doubtful, vec![call], "{kill:?}: the call in doubt");
        }
    }
    let replay = replay_json(&db, &id);
    let gaps: Vec<&str> = replay["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gap| gap["kind"].as_str().unwrap())
        .collect();
    assert_eq!(gaps, expected_gaps(&before), "{kill:?}: {replay}");
    assert_eq!(
        replay["total_turns"],
        completed_turns(&before).len(),
        "{kill:?}: {replay}"
    );
    verify(&db, &id);

    let mut expected = baseline.tree.clone();
    if !kill.in_doubt_ran() {
        for call in &doubtful {
            without_effect(&mut expected, call);
        }
    }
    let finished = before.last().is_some_and(|e| e["kind"] == "finish");
    if finished {
        assert_eq!(replay["termination_reason"], "completed", "{kill:?}");
        assert_same_tree(&expected, &workspace, kill);
        return Survived::Finished;
    }
    assert_eq!(replay["termination_reason"], Value::Null, "{kill:?}");

    // Straight after the crash: the killed run's container may still hold its name.
    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(
        resume.status.code(),
        Some(0),
        "{kill:?}: {}",
        stderr(&resume)
    );
    let result = last_json(&resume);
    assert_eq!(
        result["termination_reason"], "completed",
        "{kill:?}: {result}"
    );
    assert_eq!(result["total_turns"], scenario.turns, "{kill:?}: {result}");

    let after = events_json(&db, &id);
    check_sequence(&after);
    assert_eq!(
        after[..before.len()],
        before[..],
        "{kill:?}: events changed"
    );
    let turns = result["total_turns"].as_u64().unwrap();
    assert_eq!(
        completed_turns(&after),
        (1..=turns).collect::<Vec<_>>(),
        "{kill:?}"
    );
    for (kind, count) in [("started", 1), ("resumed", 1), ("finish", 1)] {
        assert_eq!(
            after.iter().filter(|e| e["kind"] == kind).count(),
            count,
            "{kill:?}: {kind} events"
        );
    }
    // No call started twice: neither one whose finish was recorded nor one in doubt.
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for e in after.iter().filter(|e| e["kind"] == "tool_call_started") {
        *starts
            .entry(e["payload"]["call"]["id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        starts.values().all(|n| *n == 1),
        "{kill:?}: calls started twice: {starts:?}"
    );
    for call in &doubtful {
        let told = after
            .iter()
            .find(|e| {
                e["kind"] == "tool_call_finished" && e["payload"]["result"]["call_id"] == call["id"]
            })
            .unwrap();
        assert!(
            told["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .contains("effect is unknown"),
            "{kill:?}: {told}"
        );
    }
    let replay = replay_json(&db, &id);
    assert_eq!(replay["gaps"], json!([]), "{kill:?}: {replay}");
    verify(&db, &id);
    assert_same_tree(&expected, &workspace, kill);
    let left = containers_of(&id);
    assert!(left.is_empty(), "{kill:?}: containers left: {left:?}");
    Survived::Resumed
}

fn assert_same_tree(expected: &BTreeMap<String, Vec<u8>>, workspace: &Path, kill: Kill) {
    let actual = tree(workspace);
    // calls.log first: it says which call ran twice or never.
    assert_eq!(
        log_lines(&actual),
        log_lines(expected),
        "{kill:?}: calls.log"
    );
    assert_eq!(&actual, expected, "{kill:?}: the workspace differs");
}

/// Walks `kills` over `scenario` and reports how many survived.
fn matrix(scenario: &Scenario, baseline: &Baseline, kills: &[Kill]) {
    let started = Instant::now();
    let mut finished = 0;
    for &kill in kills {
        match check(scenario, baseline, kill) {
            Survived::Resumed => {}
            Survived::Finished => finished += 1,
        }
    }
    eprintln!(
        "kill points {} {}: {} tried, {} survived: resumed to the uninterrupted run's \
         workspace, or killed with the finish durable ({} of these), {:.1} s",
        scenario.loop_type,
        kills.first().map_or("", |k| match k {
            Kill::AfterEvent(_) => "after each event",
            Kill::BeforeToolCall(_) | Kill::AfterToolCall(_) => "around each tool call",
        }),
        kills.len(),
        kills.len(),
        finished,
        started.elapsed().as_secs_f64()
    );
}

fn every_event(baseline: &Baseline) -> Vec<Kill> {
    (1..=baseline.events.len() as u64)
        .map(Kill::AfterEvent)
        .collect()
}

fn every_tool_call(baseline: &Baseline) -> Vec<Kill> {
    let calls = baseline.calls().len() as u64;
    (1..=calls)
        .flat_map(|k| [Kill::BeforeToolCall(k), Kill::AfterToolCall(k)])
        .collect()
}

#[test]
fn react_survives_a_kill_after_every_event() {
    if !docker_available() {
        return;
    }
    let baseline = react_baseline();
    matrix(&REACT, baseline, &every_event(baseline));
}

#[test]
fn react_survives_a_kill_around_every_tool_call() {
    if !docker_available() {
        return;
    }
    let baseline = react_baseline();
    matrix(&REACT, baseline, &every_tool_call(baseline));
}

#[test]
fn plan_execute_survives_a_kill_after_every_event() {
    if !docker_available() {
        return;
    }
    let baseline = plan_baseline();
    matrix(&PLAN_EXECUTE, baseline, &every_event(baseline));
}

#[test]
fn plan_execute_survives_a_kill_around_every_tool_call() {
    if !docker_available() {
        return;
    }
    let baseline = plan_baseline();
    matrix(&PLAN_EXECUTE, baseline, &every_tool_call(baseline));
}

/// The sandbox home lives beside the log, not in `$TMPDIR`: a run killed right after a
/// call that wrote a file to `$HOME` leaves that home in `homes/<id>` beside the log;
/// clearing the temporary directory (a reboot) does not touch it; the resumed run's next
/// call reads the file back, the run completes and the home goes with it. Then `nerve reap`
/// removes the home of an ended execution (one left behind, as by a crash between the
/// finish and the removal) and names it, and keeps a home of an execution that may still
/// be resumed.
#[test]
fn a_killed_runs_home_survives_a_cleared_tmp_and_reap_removes_ended_ones() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    let tmp = dir.path().join("tmp");
    let state = dir.path().join("state");
    for made in [&workspace, &tmp, &state] {
        std::fs::create_dir(made).unwrap();
    }
    let cassette = dir.path().join("home.jsonl");
    let shell = |command: &str| json!({"tool_calls": [{"name": "shell", "arguments": {"command": command}}]});
    let lines = [
        shell("echo kept-across-resume > \"$HOME/marker\""),
        shell("cat \"$HOME/marker\""),
        json!({"text": "done"}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&cassette, text).unwrap();
    let provider = format!("script:{}", cassette.display());
    let db = state.join("nerve.db");
    let tmp_env = ("TMPDIR", tmp.to_str().unwrap());
    let args = [
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task",
        "keep a file in the home",
        "--provider",
        &provider,
        "--json",
    ];
    let killed =
        spawn_nerve_env(&db, &args, &[("NERVE_KILL_AFTER_TOOL_CALL", "1"), tmp_env]).wait();
    assert_eq!(killed.status.signal(), Some(9), "{}", stderr(&killed));
    let id = crate::crash::execution_id(&crate::support::read_log(&db));
    let home = state.join("homes").join(&id);
    assert_eq!(
        std::fs::read_to_string(home.join("home/marker")).unwrap(),
        "kept-across-resume\n"
    );
    let in_tmp = || -> Vec<String> {
        std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("nerve-env-"))
            .collect()
    };
    assert_eq!(in_tmp(), Vec::<String>::new(), "no home in $TMPDIR");
    // A reboot clears /tmp.
    std::fs::remove_dir_all(&tmp).unwrap();
    std::fs::create_dir(&tmp).unwrap();
    let resumed = crate::support::nerve_env(&db, &["resume", &id, "--json"], &[tmp_env]);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_eq!(last_json(&resumed)["termination_reason"], "completed");
    let read_back = events_json(&db, &id).into_iter().any(|event| {
        event["kind"] == "tool_call_finished"
            && event["payload"]["result"]["content"]
                .as_str()
                .is_some_and(|content| content.contains("kept-across-resume"))
    });
    assert!(
        read_back,
        "the resumed call read the file the killed run left in $HOME"
    );
    assert!(!home.exists(), "a completed execution's home is removed");
    assert_eq!(in_tmp(), Vec::<String>::new());

    // Left behind by hand: the completed execution's home, and one of an execution that
    // may still be resumed (unknown to this log, recent).
    std::fs::create_dir_all(home.join("home")).unwrap();
    let other = state
        .join("homes")
        .join(nerve_core::ExecutionId::new().to_string());
    std::fs::create_dir_all(other.join("home")).unwrap();
    let reaped = crate::support::nerve_env(&db, &["reap"], &[tmp_env]);
    assert!(reaped.status.success(), "{}", stderr(&reaped));
    let said = crate::support::stdout(&reaped);
    assert!(
        said.contains(&format!(
            "removed the sandbox home of {id} (it ended for good: completed or cancelled)"
        )),
        "{said}"
    );
    assert!(!home.exists());
    assert!(
        other.exists(),
        "a recent home of a resumable execution stays"
    );
}
