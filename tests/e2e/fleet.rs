//! Fleets on PostgreSQL through the real `nerve` binary: `nerve submit` queues scripted
//! tasks that edit files, `nerve worker` processes claim and run them in real sandboxes,
//! one worker is SIGKILLed mid-run and one SIGTERMed (drained); every task ends
//! `completed` exactly once, every chain verifies, no event is lost or duplicated, every
//! workspace equals an uninterrupted run's, and no container is left. A worker paused past
//! its lease (SIGSTOP) and continued cannot append to the execution another worker took
//! over. The kills land where the log shows the run holding still (a `sleep` tool call),
//! found by polling the log, so the test does not depend on timing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::crash::{assert_same_tree, check_sequence, completed_turns};
use crate::support::{
    Running, containers_of, events_json, last_json, nerve, sandbox_available, spawn_nerve, stderr,
    stdout, tree,
};
use crate::transfer::postgres_url;

/// Turns of the cassette, the final answer included.
const TURNS: u64 = 5;
/// How long the whole fleet may take to finish every task: a watchdog, not a target.
const FLEET_PATIENCE: Duration = Duration::from_secs(600);

/// Writes a file, holds still in `sleep 2` (where the test kills or stops a worker), edits
/// the file, appends to it, answers.
fn cassette(dir: &Path) -> String {
    let lines = [
        json!({"text": "Write.", "tool_calls": [{"name": "write_file", "arguments": {"path": "result.txt", "content": "task\n"}}]}),
        json!({"text": "Wait.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 2"}}]}),
        json!({"text": "Edit.", "tool_calls": [{"name": "edit_file", "arguments": {"path": "result.txt", "old_text": "task", "new_text": "done task"}}]}),
        json!({"text": "Append.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo checked >> result.txt"}}]}),
        json!({"text": "Done."}),
    ];
    let path = dir.join("cassette.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&path, text).unwrap();
    format!("script:{}", path.display())
}

/// A workspace holding its own seed file.
fn workspace(dir: &Path, name: &str) -> PathBuf {
    let workspace = dir.join(name);
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("seed.txt"), format!("{name}\n")).unwrap();
    workspace
}

/// A fresh PostgreSQL database, a temporary directory and the cassette in it; `None` (the
/// test skips, or fails under `NERVE_REQUIRE_DOCKER=1`) without a sandbox or a server.
fn setup() -> Option<(String, tempfile::TempDir, String)> {
    if !sandbox_available() {
        return None;
    }
    let pg = postgres_url()?;
    let dir = tempfile::tempdir().unwrap();
    let provider = cassette(dir.path());
    Some((pg, dir, provider))
}

/// The workspace after an uninterrupted `nerve run` of the cassette, without its seed.
fn uninterrupted(dir: &Path, provider: &str) -> BTreeMap<String, Vec<u8>> {
    let reference = workspace(dir, "reference");
    let db = dir.join("reference.db");
    let run = nerve(
        &db,
        &[
            "run",
            "--workspace",
            reference.to_str().unwrap(),
            "--task",
            "Edit the result.",
            "--provider",
            provider,
            "--json",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(last_json(&run)["termination_reason"], "completed");
    let mut files = tree(&reference);
    files.remove("seed.txt");
    assert_eq!(
        files.get("result.txt").map(Vec::as_slice),
        Some(&b"done task\nchecked\n"[..])
    );
    files
}

fn expected_tree(base: &BTreeMap<String, Vec<u8>>, name: &str) -> BTreeMap<String, Vec<u8>> {
    let mut files = base.clone();
    files.insert("seed.txt".into(), format!("{name}\n").into_bytes());
    files
}

fn submit(pg: &str, workspace: &Path, provider: &str) -> String {
    let output = nerve(
        Path::new(pg),
        &[
            "submit",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Edit the result.",
            "--provider",
            provider,
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let id = stdout(&output).trim().to_owned();
    assert_eq!(id.len(), 36, "submit prints the id: {id:?}");
    id
}

fn worker(pg: &str, concurrency: u32, lease: u32) -> Running {
    spawn_nerve(
        Path::new(pg),
        &[
            "worker",
            "--concurrency",
            &concurrency.to_string(),
            "--lease",
            &lease.to_string(),
        ],
    )
}

/// The executions `worker` claimed and has not reported ended, in claim order.
fn in_flight(worker: &Running) -> Vec<String> {
    let text = worker.stderr_so_far();
    let claimed = text
        .lines()
        .filter_map(|l| l.split_once(": claimed ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned);
    claimed
        .filter(|id| {
            !text.lines().any(|l| {
                l.contains(&format!(": {id} ended")) || l.contains(&format!(": {id} failed"))
            })
        })
        .collect()
}

/// Whether `id`'s log ends inside its `sleep` tool call (started, not finished).
fn in_sleep(pg: &str, id: &str) -> bool {
    let output = nerve(Path::new(pg), &["events", id, "--json"]);
    if !output.status.success() {
        return false;
    }
    let events = last_json(&output);
    let Some(last) = events.as_array().and_then(|e| e.last()) else {
        return false;
    };
    last["kind"] == "tool_call_started"
        && last["payload"]["call"]["name"] == "shell"
        && last["payload"]["call"]["arguments"]["command"] == "sleep 2"
}

/// Waits until one of `worker`'s executions holds still in its `sleep`; returns its id.
fn wait_for_sleep(pg: &str, worker: &mut Running, what: &str) -> String {
    let deadline = Instant::now() + FLEET_PATIENCE;
    loop {
        worker.assert_alive(what);
        if let Some(id) = in_flight(worker).into_iter().find(|id| in_sleep(pg, id)) {
            return id;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn completed(pg: &str) -> Vec<String> {
    let output = nerve(Path::new(pg), &["list", "--status", "completed", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    last_json(&output)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap().to_owned())
        .collect()
}

fn wait_for_completed(pg: &str, count: usize, alive: &mut [&mut Running]) {
    let deadline = Instant::now() + FLEET_PATIENCE;
    while completed(pg).len() < count {
        for worker in alive.iter_mut() {
            worker.assert_alive("every task to complete");
        }
        assert!(
            Instant::now() < deadline,
            "gave up waiting for {count} completed executions"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The checks every execution of a fleet passes: its chain verifies, sequence numbers run
/// 1..n, every turn completed once, every tool call started and finished once, one start,
/// one `completed` finish as the last event. Returns its events.
fn check_execution(pg: &str, id: &str) -> Vec<Value> {
    let verified = nerve(Path::new(pg), &["verify", id]);
    assert!(
        verified.status.success() && stdout(&verified).starts_with("ok: "),
        "{id}: {}",
        stderr(&verified)
    );
    let events = events_json(Path::new(pg), id);
    check_sequence(&events);
    assert_eq!(
        completed_turns(&events),
        (1..=TURNS).collect::<Vec<_>>(),
        "{id}"
    );
    let count = |kind: &str| events.iter().filter(|e| e["kind"] == kind).count();
    assert_eq!(count("started"), 1, "{id}");
    let finishes: Vec<&Value> = events.iter().filter(|e| e["kind"] == "finish").collect();
    let completed: Vec<&&Value> = finishes
        .iter()
        .filter(|e| e["payload"]["termination_reason"] == "completed")
        .collect();
    assert_eq!(completed.len(), 1, "{id}: {finishes:?}");
    assert_eq!(events.last().unwrap()["kind"], "finish", "{id}");
    assert_eq!(
        events.last().unwrap()["payload"]["termination_reason"],
        "completed",
        "{id}"
    );
    let mut calls: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for event in &events {
        if event["kind"] == "tool_call_started" {
            let call = event["payload"]["call"]["id"].as_str().unwrap().to_owned();
            calls.entry(call).or_default().0 += 1;
        } else if event["kind"] == "tool_call_finished" {
            let call = event["payload"]["result"]["call_id"]
                .as_str()
                .unwrap()
                .to_owned();
            calls.entry(call).or_default().1 += 1;
        }
    }
    assert_eq!(calls.len(), 4, "{id}: {calls:?}");
    assert!(
        calls.values().all(|counts| *counts == (1, 1)),
        "{id}: a tool call ran or was recorded twice: {calls:?}"
    );
    events
}

/// What `events --follow --json` printed (one object per line) once it exited by itself.
fn followed(follower: Running) -> Vec<Value> {
    let output = follower.wait();
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn thirty_tasks_on_three_workers_survive_a_kill_and_a_drain() {
    let Some((pg, dir, provider)) = setup() else {
        return;
    };
    let base = uninterrupted(dir.path(), &provider);
    let tasks: Vec<(String, PathBuf)> = (0..30)
        .map(|i| {
            let name = format!("task{i:02}");
            let workspace = workspace(dir.path(), &name);
            (submit(&pg, &workspace, &provider), workspace)
        })
        .collect();
    let queued = nerve(Path::new(&pg), &["list", "--status", "queued", "--json"]);
    assert_eq!(last_json(&queued).as_array().unwrap().len(), 30);

    let mut killed = worker(&pg, 1, 3);
    let mut drained = worker(&pg, 2, 3);
    let mut survivor = worker(&pg, 3, 3);

    // SIGKILL mid-run: its execution holds still in a tool call, which ends in doubt.
    let victim = wait_for_sleep(&pg, &mut killed, "the killed worker's sleep");
    let killed = killed.kill();
    assert_eq!(killed.status.code(), None, "{}", stderr(&killed));
    // SIGTERM mid-run: its execution in `sleep` stops at once (the sleep interrupted) and
    // goes back to the queue; the worker says so.
    let paused = wait_for_sleep(&pg, &mut drained, "the drained worker's sleep");
    drained.signal("TERM");
    let drained = drained.wait();
    let drained_said = stderr(&drained);
    let said = &drained_said;
    assert_eq!(drained.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!(
            "{paused} ended shutdown after 2 turns; released to the queue"
        )),
        "{said}"
    );
    assert!(said.contains("drained; every claim released"), "{said}");
    assert!(
        said.contains(
            "execution(s) stop now: no new tool call starts, a running command is interrupted"
        ),
        "{said}"
    );
    assert!(!said.contains("turn boundary"), "{said}");

    wait_for_completed(&pg, 30, &mut [&mut survivor]);
    survivor.signal("TERM");
    let survivor = survivor.wait();
    assert_eq!(survivor.status.code(), Some(0), "{}", stderr(&survivor));
    let said = stderr(&survivor);
    assert!(
        said.contains(&format!("resuming {paused} after turn 2")),
        "{said}"
    );
    // The victim's lease ran out; whichever worker claimed it first resumed it.
    assert!(
        format!("{drained_said}{said}").contains(&format!("resuming {victim} after turn 1")),
        "{drained_said}{said}"
    );

    let mut ids: Vec<String> = tasks.iter().map(|(id, _)| id.clone()).collect();
    ids.sort();
    let mut done = completed(&pg);
    done.sort();
    assert_eq!(done, ids, "every task completed, each once");
    for (i, (id, workspace)) in tasks.iter().enumerate() {
        let events = check_execution(&pg, id);
        let resumed: Vec<&Value> = events.iter().filter(|e| e["kind"] == "resumed").collect();
        if *id == victim {
            // The call in flight at the kill was told to the model, never run again.
            assert!(!resumed.is_empty());
            assert_eq!(
                resumed[0]["payload"]["in_doubt"].as_array().unwrap().len(),
                1
            );
        } else if *id == paused {
            assert_eq!(resumed.len(), 1, "{resumed:?}");
            assert_eq!(resumed[0]["payload"]["in_doubt"], json!([]));
        }
        assert_same_tree(&expected_tree(&base, &format!("task{i:02}")), workspace);
        let left = containers_of(id);
        assert!(left.is_empty(), "containers of {id} left behind: {left:?}");
    }
    let queued = nerve(Path::new(&pg), &["list", "--status", "queued", "--json"]);
    assert_eq!(last_json(&queued), json!([]));
}

#[test]
fn a_worker_paused_past_its_lease_cannot_append_again() {
    let Some((pg, dir, provider)) = setup() else {
        return;
    };
    let base = uninterrupted(dir.path(), &provider);
    let workspace = workspace(dir.path(), "stale");
    let id = submit(&pg, &workspace, &provider);

    // `events --follow` tails it from before its first event to its finish.
    let follower = spawn_nerve(Path::new(&pg), &["events", &id, "--follow", "--json"]);

    let mut stale = worker(&pg, 1, 2);
    let held = wait_for_sleep(&pg, &mut stale, "the sleep");
    assert_eq!(held, id);
    stale.signal("STOP");
    let mut fresh = worker(&pg, 1, 2);
    wait_for_completed(&pg, 1, &mut [&mut fresh]);
    let before = events_json(Path::new(&pg), &id);
    stale.signal("CONT");
    stale.wait_for_stderr("the stale worker to learn it lost its lease", |text| {
        text.contains(&format!("lost the lease on {id}"))
    });
    for worker in [&stale, &fresh] {
        worker.signal("TERM");
    }
    let (stale, fresh) = (stale.wait(), fresh.wait());
    assert_eq!(stale.status.code(), Some(0), "{}", stderr(&stale));
    assert_eq!(fresh.status.code(), Some(0), "{}", stderr(&fresh));
    let said = stderr(&stale);
    assert!(!said.contains(&format!("{id} ended")), "{said}");

    let after = check_execution(&pg, &id);
    assert_eq!(
        after, before,
        "the stale worker appended after it lost its lease"
    );
    assert_eq!(after.iter().filter(|e| e["kind"] == "resumed").count(), 1);
    assert_same_tree(&expected_tree(&base, "stale"), &workspace);
    let left = containers_of(&id);
    assert!(left.is_empty(), "containers of {id} left behind: {left:?}");

    assert_eq!(
        followed(follower),
        after,
        "--follow printed every event once, in order"
    );
}

#[test]
fn cancel_ends_a_queued_execution_at_once_and_a_running_one_when_its_worker_renews_the_lease() {
    // The queue lives in the PostgreSQL log only: said in one line.
    let sqlite = tempfile::tempdir().unwrap();
    let refused = nerve(
        &sqlite.path().join("nerve.db"),
        &["submit", "--workspace", ".", "--task", "t"],
    );
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert_eq!(stderr(&refused).lines().count(), 1);
    assert!(stderr(&refused).contains("needs a PostgreSQL log"));
    let Some((pg, dir, provider)) = setup() else {
        return;
    };
    let running = submit(&pg, &workspace(dir.path(), "running"), &provider);
    let waiting = submit(&pg, &workspace(dir.path(), "waiting"), &provider);
    let cancel = |id: &str| nerve(Path::new(&pg), &["cancel", id]);
    let cancelled = cancel(&waiting);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    assert!(stdout(&cancelled).contains("it had not started"));
    let again = cancel(&waiting);
    assert_eq!(again.status.code(), Some(2));
    assert!(stderr(&again).contains("neither queued nor running: it is cancelled"));
    let queued = nerve(Path::new(&pg), &["list", "--status", "queued", "--json"]);
    assert_eq!(last_json(&queued)[0]["execution_id"], running.as_str());
    assert_eq!(last_json(&queued).as_array().unwrap().len(), 1);
    // Listed like every execution the log knows, as cancelled (and the other as queued).
    let listed = |args: &[&str]| last_json(&nerve(Path::new(&pg), args));
    let entry = |list: &serde_json::Value, id: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|e| e["execution_id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} is not in {list}"))
    };
    let all = listed(&["list", "--json"]);
    let gone = entry(&all, &waiting);
    assert_eq!(gone["queue_state"], "cancelled", "{gone}");
    assert_eq!(gone["task_status"], "cancelled", "{gone}");
    assert_eq!(gone["termination_reason"], serde_json::Value::Null);
    assert_eq!(gone["task"], "Edit the result.", "{gone}");
    assert_eq!(entry(&all, &running)["queue_state"], "queued");
    let cancelled = listed(&["list", "--status", "cancelled", "--json"]);
    assert_eq!(cancelled.as_array().unwrap().len(), 1, "{cancelled}");
    assert_eq!(cancelled[0]["execution_id"], waiting.as_str());
    let text = stdout(&nerve(Path::new(&pg), &["list"]));
    let line = text.lines().find(|l| l.starts_with(&waiting)).unwrap();
    assert!(line.contains("cancelled"), "{line}");

    let mut worker = worker(&pg, 1, 3);
    wait_for_sleep(&pg, &mut worker, "the sleep");
    let asked = cancel(&running);
    assert!(asked.status.success(), "{}", stderr(&asked));
    // Said as it is: the worker sees the cancel at its next lease renewal, then stops the
    // execution at once (the sleep is interrupted, not waited for).
    let said = stdout(&asked);
    assert!(said.contains("when it next renews its lease"), "{said}");
    assert!(said.contains("a running command is interrupted"), "{said}");
    assert!(!said.contains("boundary"), "{said}");
    worker.wait_for_stderr("the cancelled execution to end", |text| {
        text.contains(&format!("{running} ended shutdown"))
    });
    worker.signal("TERM");
    let worker = worker.wait();
    assert_eq!(worker.status.code(), Some(0), "{}", stderr(&worker));
    assert!(stderr(&worker).contains(&format!("{running} was cancelled")));
    let events = events_json(Path::new(&pg), &running);
    assert_eq!(events.last().unwrap()["kind"], "finish");
    assert_eq!(
        events.last().unwrap()["payload"]["termination_reason"],
        "shutdown"
    );
    // Never started, never claimed again: the waiting one has no log at all.
    let none = nerve(Path::new(&pg), &["events", &waiting]);
    assert_eq!(none.status.code(), Some(2), "{}", stderr(&none));
    let queued = nerve(Path::new(&pg), &["list", "--status", "queued", "--json"]);
    assert_eq!(last_json(&queued), json!([]));
    // Still listed, still cancelled; the other listed from its log now.
    let all = listed(&["list", "--json"]);
    assert_eq!(entry(&all, &waiting)["queue_state"], "cancelled");
    let ended = entry(&all, &running);
    assert_eq!(ended["termination_reason"], "shutdown", "{ended}");
    assert!(ended.get("queue_state").is_none(), "{ended}");
}

#[test]
fn events_follow_tails_a_run_on_a_sqlite_log() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let provider = cassette(dir.path());
    let workspace = workspace(dir.path(), "followed");
    let db = dir.path().join("nerve.db");
    let mut run = spawn_nerve(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Edit the result.",
            "--provider",
            &provider,
        ],
    );
    let log = crate::support::wait_for_event(&db, &mut run, "the execution's start", |e| {
        e.kind == "started"
    });
    let id = log
        .iter()
        .find(|e| e.kind == "started")
        .map(|e| e.execution_id.clone())
        .unwrap();
    let follower = spawn_nerve(&db, &["events", &id, "--follow", "--json"]);
    let ran = run.wait();
    assert!(ran.status.success(), "{}", stderr(&ran));
    assert_eq!(followed(follower), events_json(&db, &id));
}
