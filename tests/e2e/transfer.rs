//! The PostgreSQL log and moving a log between backends, through the real `nerve` binary:
//! a run recorded in SQLite is exported, imported into PostgreSQL (a real server: the one
//! `NERVE_TEST_PG` names, or a throwaway cluster), where `verify`, `replay`, `events` and a
//! second export agree byte for byte, and then back into a fresh SQLite log. A damaged or
//! reordered file is refused at its first bad line with nothing written. A run writes its
//! log to PostgreSQL directly when `--db` is a URL.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{last_json, nerve, sandbox_available, stderr, stdout};

/// A fresh database on a real PostgreSQL server. Panics in CI when there is none.
pub(crate) fn postgres_url() -> Option<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    match runtime.block_on(nerve_session::pg_cluster::test_database()) {
        Ok(url) => Some(url),
        Err(error) => {
            crate::support::skip_unless_required(&error.to_string());
            None
        }
    }
}

fn cassette(dir: &Path) -> String {
    let usage = |input: u64| json!({"input_tokens": input, "output_tokens": 20});
    let lines = [
        json!({"text": "Look.", "tool_calls": [{"name": "list_dir", "arguments": {}}], "usage": usage(900)}),
        json!({"text": "Write.", "tool_calls": [{"name": "write_file", "arguments": {"path": "note.txt", "content": "noted\n"}}], "usage": usage(1000)}),
        json!({"text": "Check.", "tool_calls": [{"name": "shell", "arguments": {"command": "cat note.txt"}}], "usage": usage(1100)}),
        json!({"text": "Wrote note.txt.", "usage": usage(1200)}),
    ];
    let path = dir.join("cassette.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&path, text).unwrap();
    format!("script:{}", path.display())
}

fn run(db: &str, dir: &Path, name: &str) -> String {
    let workspace = dir.join(name);
    std::fs::create_dir(&workspace).unwrap();
    let output = nerve(
        Path::new(db),
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Write a note.",
            "--provider",
            &cassette(dir),
            "--json",
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let summary = last_json(&output);
    assert_eq!(summary["termination_reason"], "completed");
    summary["execution_id"].as_str().unwrap().to_owned()
}

/// `nerve --db DB ARGS`, expected to succeed; its stdout.
fn ok(db: &str, args: &[&str]) -> String {
    let output = nerve(Path::new(db), args);
    assert!(
        output.status.success(),
        "nerve {args:?} on {db}: {}",
        stderr(&output)
    );
    stdout(&output)
}

fn json_out(db: &str, args: &[&str]) -> Value {
    serde_json::from_str(ok(db, args).lines().last().unwrap()).unwrap()
}

/// What must be identical wherever the execution lives.
fn observed(db: &str, id: &str) -> (String, Value, Value, String) {
    (
        ok(db, &["verify", id]),
        json_out(db, &["replay", id, "--json"]),
        json_out(db, &["events", id, "--json"]),
        ok(db, &["export", id]),
    )
}

#[test]
fn a_log_moves_from_sqlite_to_postgres_and_back_unchanged() {
    if !sandbox_available() {
        return;
    }
    let Some(pg) = postgres_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("first.db");
    let sqlite = sqlite.to_str().unwrap();
    let id = run(sqlite, dir.path(), "workspace");
    let original = observed(sqlite, &id);
    assert!(original.0.starts_with("ok: "), "{}", original.0);
    let file = dir.path().join("moved.jsonl");
    std::fs::write(&file, &original.3).unwrap();
    let file = file.to_str().unwrap();

    let imported = ok(&pg, &["import", file]);
    assert!(imported.contains(&id), "{imported}");
    assert_eq!(observed(&pg, &id), original, "on PostgreSQL");
    let listed = json_out(&pg, &["list", "--json"]);
    assert_eq!(listed[0]["execution_id"], id.as_str());
    assert_eq!(listed[0]["termination_reason"], "completed");

    // Back, from PostgreSQL's own export, into a fresh SQLite log.
    let back_file = dir.path().join("back.jsonl");
    std::fs::write(&back_file, ok(&pg, &["export", &id])).unwrap();
    let back = dir.path().join("back.db");
    let back = back.to_str().unwrap();
    ok(back, &["import", back_file.to_str().unwrap()]);
    assert_eq!(observed(back, &id), original, "back on SQLite");

    // Once only: a second import is refused and changes nothing.
    let again = nerve(Path::new(&pg), &["import", file]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(stderr(&again).contains("already in this log"));
}

#[test]
fn a_damaged_or_reordered_file_is_refused_at_its_first_bad_line() {
    if !sandbox_available() {
        return;
    }
    let Some(pg) = postgres_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sqlite = dir.path().join("nerve.db");
    let sqlite = sqlite.to_str().unwrap();
    let id = run(sqlite, dir.path(), "workspace");
    let exported = ok(sqlite, &["export", &id]);
    let lines: Vec<&str> = exported.lines().collect();
    let mut swapped = lines.clone();
    swapped.swap(4, 5);
    let edited: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            if i == 7 {
                line.replacen("\"ts\":\"2", "\"ts\":\"1", 1)
            } else {
                (*line).to_owned()
            }
        })
        .collect();
    for (name, text, line) in [
        ("swapped", swapped.join("\n") + "\n", 5),
        ("edited", edited.join("\n") + "\n", 8),
        ("cut", lines[..6].join("\n") + "\n", 7),
    ] {
        let file = dir.path().join(format!("{name}.jsonl"));
        std::fs::write(&file, text).unwrap();
        for db in [pg.as_str(), dir.path().join("other.db").to_str().unwrap()] {
            let refused = nerve(Path::new(db), &["import", file.to_str().unwrap()]);
            assert_eq!(
                refused.status.code(),
                Some(2),
                "{name}: {}",
                stderr(&refused)
            );
            let message = stderr(&refused);
            assert_eq!(message.lines().count(), 1, "{name}: {message}");
            assert!(
                message.contains(&format!(": line {line}: ")),
                "{name}: {message}"
            );
            // Nothing was written.
            let missing = nerve(Path::new(db), &["verify", &id]);
            assert_eq!(
                missing.status.code(),
                Some(2),
                "{name}: {}",
                stderr(&missing)
            );
        }
    }
}

#[test]
fn a_run_writes_its_log_to_postgres_when_db_is_a_url() {
    if !sandbox_available() {
        return;
    }
    let Some(pg) = postgres_url() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let id = run(&pg, dir.path(), "workspace");
    assert!(ok(&pg, &["verify", &id]).starts_with("ok: "));
    let replay = json_out(&pg, &["replay", &id, "--json"]);
    assert_eq!(replay["complete"], true);
    assert_eq!(replay["total_turns"], 4);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("workspace/note.txt")).unwrap(),
        "noted\n"
    );
    // NERVE_DB selects it as --db does.
    let listed = std::process::Command::new(crate::support::nerve_bin())
        .args(["list", "--json"])
        .env("NERVE_DB", &pg)
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&id));
    let with_status = |status: &str| json_out(&pg, &["list", "--status", status, "--json"]);
    assert_eq!(with_status("completed")[0]["execution_id"], id.as_str());
    for other in ["running", "failed", "queued", "max_turns"] {
        assert_eq!(with_status(other), json!([]), "--status {other}");
    }
    // Resume reads the PostgreSQL log as it reads SQLite: a completed run is refused.
    let refused = nerve(Path::new(&pg), &["resume", &id]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("ended with completed, which cannot be resumed"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn a_bad_or_unreachable_postgres_url_is_one_line_without_the_password() {
    let id = "01936f2e-0000-7000-8000-000000000000";
    for (url, says) in [
        (
            "postgres://alice:hunter2@127.0.0.1:1/nerve",
            "Connection refused",
        ),
        (
            "postgres://alice:hunter2@127.0.0.1:notaport/nerve",
            "not a PostgreSQL URL",
        ),
    ] {
        for args in [&["list"][..], &["export", id], &["verify", id]] {
            let output = nerve(Path::new(url), args);
            assert_eq!(output.status.code(), Some(2), "{args:?}");
            let message = stderr(&output);
            assert_eq!(message.lines().count(), 1, "{message}");
            assert!(message.contains(says), "{message}");
            assert!(!message.contains("hunter2"), "{message}");
        }
    }
}
