//! Bad input gets one clear line, exit code 2, and nothing written to the log.

use std::path::Path;
use std::process::Output;

use crate::support::{nerve, nerve_env, root, stderr};

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

#[test]
fn an_unknown_execution_id_is_named_by_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    // A real, empty log: the id is well formed but not in it.
    nerve_session::Store::open(&db).unwrap();
    let id = "01a200a4-59d8-741c-abcd-cb6ad7c4295c";
    let expected = format!("no execution with id {id}");
    for args in [
        &["replay", id][..],
        &["replay", id, "--json"],
        &["show", id, "--json"],
        &["events", id, "--json"],
        &["verify", id],
        &["resume", id],
        &["resume", id, "--json"],
        &["approve", id],
        &["approve", id, "--deny", "--reason", "no"],
    ] {
        check(&db, args, &expected);
    }
    let events: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM events", [], |row| row.get(0))
        .unwrap();
    assert_eq!(events, 0, "nothing may be written for an unknown execution");
}

#[test]
fn a_corrupt_config_is_refused_by_every_command_that_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let script = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let workspace = dir.path().to_str().unwrap();
    let id = "01a200a4-59d8-741c-abcd-cb6ad7c4295c";
    for (name, text, expected) in [
        ("syntax.toml", "[sandbox\nimage = 1", "invalid config"),
        ("binary.toml", "\u{0}\u{1}garbage", "invalid config"),
        (
            "unknown_key.toml",
            "[sandbox]\nimgae = \"x\"\n",
            "unknown field `imgae`",
        ),
        (
            "wrong_type.toml",
            "[guardrails]\nmax_replans = \"three\"\n",
            "invalid config",
        ),
        (
            "bad_policy.toml",
            "[policy]\nrules = [{ tool = \"shell\", pattern = \"(\", action = \"ask\" }]\n",
            "invalid pattern: regex parse error: ( ^ error: unclosed group",
        ),
    ] {
        let config = dir.path().join(name);
        std::fs::write(&config, text).unwrap();
        let config = config.to_str().unwrap();
        let run = [
            "--config",
            config,
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            &script,
        ];
        check(&db, &run, expected);
        check(&db, &["--config", config, "resume", id], expected);
    }
    check(
        &db,
        &[
            "--config",
            "/no/such/nerve.toml",
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            &script,
        ],
        "cannot read config /no/such/nerve.toml",
    );
    // Every command checks the configuration it is given, also one that does not use it.
    for args in [
        &["--config", "/no/such/nerve.toml", "list"][..],
        &["--config", "/no/such/nerve.toml", "show", id],
        &["--config", "/no/such/nerve.toml", "verify", id],
    ] {
        check(&db, args, "cannot read config /no/such/nerve.toml");
    }
    assert!(!db.exists(), "a refused command must not create the log");
}

/// A cassette with no answer, or a line that is not one, is refused before the run: one
/// line, exit 2, the cassette's line number only.
#[test]
fn a_cassette_without_answers_or_with_a_bad_line_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = dir.path().to_str().unwrap();
    for (text, expected) in [
        ("", "the cassette has no lines"),
        ("# nothing\n\n", "the cassette has no lines"),
        (
            "{\"text\": \"fine\"}\n{\"text\": oops}\n",
            "line 2: not a valid cassette line: expected value (column 10)",
        ),
    ] {
        let cassette = dir.path().join("cassette.jsonl");
        std::fs::write(&cassette, text).unwrap();
        let provider = format!("script:{}", cassette.display());
        let output = check(
            &db,
            &[
                "run",
                "--workspace",
                workspace,
                "--task",
                "x",
                "--provider",
                &provider,
            ],
            expected,
        );
        assert_eq!(
            stderr(&output).matches("line ").count(),
            usize::from(text.contains("oops"))
        );
    }
    assert!(!db.exists(), "a refused command must not create the log");
}

/// The argument parser's refusals are one line and exit 2, like every usage error, and do
/// not claim that an option given through the environment is required.
#[test]
fn usage_errors_from_the_parser_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let output = check(
        &db,
        &["show"],
        "the following required arguments were not provided: <ID> (see `nerve show --help`)",
    );
    assert!(!stderr(&output).contains("--db"), "{}", stderr(&output));
    check(
        &db,
        &["list", "--status", "nope"],
        "invalid value 'nope' for '--status <STATUS>'",
    );
    check(&db, &["frobnicate"], "unrecognized subcommand 'frobnicate'");
    check(
        &db,
        &["replay", "--jsno", "x"],
        "unexpected argument '--jsno'",
    );
    // Help and version are not errors: whole, on stdout, exit 0.
    let help = nerve(&db, &["show", "--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(crate::support::stdout(&help).contains("Usage: nerve show"));
}

#[test]
fn an_unreachable_provider_is_refused_before_the_run_starts() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = dir.path().to_str().unwrap();
    let key = "sk-test-0123456789abcdefghijklmnop";
    // Nothing listens on the discard port of the loopback.
    let output = nerve_env(
        &db,
        &[
            "run",
            "--workspace",
            workspace,
            "--task",
            "x",
            "--provider",
            "openai",
            "--model",
            "gpt-4o",
        ],
        &[
            ("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
            ("OPENAI_API_KEY", key),
        ],
    );
    let err = stderr(&output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        "nerve: provider openai at http://127.0.0.1:9/v1 is unreachable: connection refused"
    );
    assert!(!err.contains(key));
    assert!(
        !db.exists(),
        "a run that never started must not create the log"
    );
}
