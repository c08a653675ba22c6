//! `nerve fork` through the binary, in the real sandbox: after a ten-turn scripted run,
//! `fork --turn 4` gives an execution whose first four turns replay as the parent's, whose
//! workspace (a new directory) is the tree an identical run stopped after turn 4 left, and
//! which verifies on its own and against its parent; `--task` continues the fork (the
//! scripted cassette goes on where its history stopped); `--in-place` rewinds the parent's
//! workspace instead.

use std::path::Path;

use serde_json::{Value, json};

use crate::crash::{replay_json, verify};
use crate::rewind::{covered, run, turns};
use crate::support::{events_json, last_json, nerve, sandbox_available, stderr, stdout};

fn workspace(dir: &Path) -> std::path::PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("keep.txt"), "keep\n").unwrap();
    workspace
}

/// An execution's events as (kind, payload) without its start, finish and checkpoints:
/// what a fork must share with its parent.
fn history(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| !["started", "finish", "checkpoint"].contains(&e["kind"].as_str().unwrap()))
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["payload"].to_string(),
            )
        })
        .collect()
}

#[test]
fn a_fork_at_turn_four_replays_the_parents_turns_on_turn_fours_workspace() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let done = json!({"text": "The workspace is shaped."});
    let mut lines: Vec<Value> = turns().into_iter().map(|(line, _)| line).collect();
    lines.push(done.clone());

    // The reference: an identical run that stops after turn 4.
    let reference_dir = dir.path().join("reference");
    std::fs::create_dir(&reference_dir).unwrap();
    let reference_ws = workspace(&reference_dir);
    let mut four: Vec<Value> = lines[..4].to_vec();
    four.push(done);
    run(
        dir.path(),
        &dir.path().join("reference.db"),
        &reference_ws,
        &four,
    );
    let turn_four = covered(&reference_ws);

    let ws = workspace(dir.path());
    let db = dir.path().join("nerve.db");
    let parent = run(dir.path(), &db, &ws, &lines);
    let parent_final = covered(&ws);
    assert_ne!(parent_final, turn_four);

    let into = dir.path().join("forked");
    let forked = nerve(
        &db,
        &[
            "fork",
            &parent[..8],
            "--turn",
            "4",
            "--into",
            into.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(forked.status.success(), "{}", stderr(&forked));
    let summary = last_json(&forked);
    assert_eq!(summary.as_object().unwrap().len(), 1, "{summary}");
    let fork = summary["execution_id"].as_str().unwrap().to_owned();
    assert_ne!(fork, parent);

    // The workspace is turn 4's; the parent's is untouched.
    assert_eq!(covered(&into), turn_four);
    assert_eq!(covered(&ws), parent_final);

    // The first four turns replay as the parent's: the same events, turn for turn.
    let parent_events = events_json(&db, &parent);
    let fork_events = events_json(&db, &fork);
    let ours = history(&fork_events);
    let theirs = history(&parent_events);
    assert_eq!(ours[..], theirs[..ours.len()]);
    let last_fork_turn = fork_events
        .iter()
        .filter(|e| e["kind"] == "turn_completed")
        .map(|e| e["payload"]["turn"].as_u64().unwrap())
        .max();
    assert_eq!(last_fork_turn, Some(4));
    let started = &fork_events[0]["payload"];
    assert_eq!(started["fork"]["parent"], parent.as_str());
    assert_eq!(started["fork"]["turn"], 4);
    assert_eq!(
        started["workspace"],
        into.canonicalize().unwrap().to_str().unwrap()
    );
    let replay = replay_json(&db, &fork);
    assert_eq!(replay["total_turns"], 4);
    assert_eq!(replay["complete"], true, "{replay}");
    assert_eq!(replay["termination_reason"], "shutdown");
    let parent_replay = replay_json(&db, &parent);
    assert_eq!(parent_replay["total_turns"], 11);

    // Both verify; the fork's history is checked against its parent's.
    verify(&db, &parent);
    let checked = nerve(&db, &["verify", &fork]);
    assert!(checked.status.success(), "{}", stderr(&checked));
    assert!(
        stdout(&checked).contains(&format!(
            "fork of {parent} at turn 4: its history is the parent's"
        )),
        "{}",
        stdout(&checked)
    );
    // Its diff of turn 4 is the parent's.
    let theirs = stdout(&nerve(&db, &["diff", &parent, "--turn", "4"]));
    let ours = stdout(&nerve(&db, &["diff", &fork, "--turn", "4"]));
    assert_eq!(ours, theirs);

    // --task: a second fork goes on from turn 4 with the rest of the cassette, to the
    // parent's end.
    let into = dir.path().join("continued");
    let continued = nerve(
        &db,
        &[
            "fork",
            &parent,
            "--turn",
            "4",
            "--into",
            into.to_str().unwrap(),
            "--task",
            "Go on.",
            "--json",
        ],
    );
    assert!(continued.status.success(), "{}", stderr(&continued));
    let summary = last_json(&continued);
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert_eq!(summary["total_turns"], 11, "{summary}");
    assert_eq!(covered(&into), parent_final);
    verify(&db, summary["execution_id"].as_str().unwrap());

    // --in-place: the parent's own workspace goes back to turn 4.
    let in_place = nerve(&db, &["fork", &parent, "--turn", "4", "--in-place"]);
    assert!(in_place.status.success(), "{}", stderr(&in_place));
    let id = stdout(&in_place).trim().to_owned();
    assert_eq!(covered(&ws), turn_four);
    assert_eq!(
        events_json(&db, &id)[0]["payload"]["workspace"],
        ws.canonicalize().unwrap().to_str().unwrap()
    );
    verify(&db, &id);

    // /fork in chat: the conversation's execution forked, the id said.
    let chat = crate::support::chat_piped(
        &db,
        &[&parent],
        &dir.path().join("state"),
        b"/fork 3\n/exit\n",
    );
    assert_eq!(chat.status.code(), Some(0), "{}", stderr(&chat));
    let text = stdout(&chat);
    let said = text
        .split("forked turn 3 into execution ")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let from_chat = said.split_whitespace().next().unwrap();
    assert_eq!(replay_json(&db, from_chat)["total_turns"], 3);
    verify(&db, from_chat);

    // A turn the parent does not have is refused as a usage error.
    let refused = nerve(&db, &["fork", &parent, "--turn", "12"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}
