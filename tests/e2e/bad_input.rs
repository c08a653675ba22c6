//! Bad input gets one clear line, exit code 2, and nothing written to the log.

use std::path::Path;
use std::process::Output;

use crate::support::{nerve, root, stderr};

fn check(db: &Path, args: &[&str], expected: &str) -> Output {
    let output = nerve(db, args);
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "args {args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line expected, got: {err}");
    assert!(err.contains(expected), "expected `{expected}` in: {err}");
    output
}

#[test]
fn run_refuses_bad_input_before_writing_anything() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let cassette = root().join("examples/demo/cassette.jsonl");
    let script = format!("script:{}", cassette.display());
    let workspace = dir.path().to_str().unwrap();

    check(
        &db,
        &[
            "run",
            "--workspace",
            "/no/such/dir",
            "--task",
            "x",
            "--provider",
            &script,
        ],
        "workspace /no/such/dir: does not exist",
    );
    check(
        &db,
        &[
            "run",
            "--workspace",
            workspace,
            "--task-file",
            "/no/such/task.txt",
            "--provider",
            &script,
        ],
        "task file /no/such/task.txt: does not exist",
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "# a comment\n{\"text\": \"ok\"}\n{\"text\": oops}\n").unwrap();
    check(
        &db,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            &format!("script:{}", bad.display()),
        ],
        "line 3",
    );

    check(
        &db,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            "nonsense",
        ],
        "unknown provider `nonsense`",
    );
    check(
        &db,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "  ",
            "--provider",
            &script,
        ],
        "the task is empty",
    );

    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[sandbox\nimage = 1").unwrap();
    check(
        &db,
        &[
            "--config",
            config.to_str().unwrap(),
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            &script,
        ],
        "invalid config",
    );

    assert!(
        !db.exists(),
        "a run that never started must not create the log"
    );
}

#[test]
fn inspection_commands_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    check(
        &db,
        &["replay", "01a200a4-59d8-741c-abcd-cb6ad7c4295c"],
        "no event log at",
    );
    check(
        &db,
        &["replay", "not-an-id"],
        "`not-an-id` is not a valid execution id",
    );

    // An existing log, but an unknown id.
    rusqlite::Connection::open(&db).unwrap();
    let created = nerve(&db, &["list", "--json"]);
    assert_eq!(
        created.status.code(),
        Some(2),
        "an empty file is no log: {}",
        stderr(&created)
    );
}
