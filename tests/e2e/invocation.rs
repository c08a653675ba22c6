//! How people start Nerve, as Codex and Claude Code taught them: `nerve` alone opens a chat
//! in the current directory, `nerve run "PROMPT"` runs on the current directory,
//! `--task-file -` reads standard input, `-c`/`--continue` (and `--resume`) without an id
//! continue the workspace's latest execution, and `last` stands for the newest execution
//! wherever an id is taken.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

use crate::support::{docker_available, events_json, last_json, nerve, nerve_bin, stderr, stdout};

/// `nerve --db DB ARGS` run in `cwd` with `stdin` piped in.
fn nerve_in(cwd: &Path, db: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(nerve_bin())
        .current_dir(cwd)
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1")
        .env("XDG_STATE_HOME", db.parent().unwrap().join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// A cassette answering every call with `answer` (enough lines for a few runs).
fn cassette(dir: &Path, answer: &str) -> String {
    let line = json!({"text": answer}).to_string();
    let path = dir.join(format!("{answer}.jsonl"));
    std::fs::write(&path, [line.as_str(); 4].join("\n")).unwrap();
    format!("script:{}", path.display())
}

fn started(db: &Path, id: &str) -> Value {
    events_json(db, id)
        .into_iter()
        .find(|e| e["kind"] == "started")
        .unwrap()["payload"]
        .clone()
}

fn workspace(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).unwrap();
    std::fs::canonicalize(path).unwrap()
}

#[test]
fn run_takes_a_positional_prompt_on_the_current_directory_and_a_task_on_stdin() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let here = workspace(dir.path(), "here");
    let db = dir.path().join("nerve.db");
    let provider = cassette(dir.path(), "Done.");
    let run = nerve_in(
        &here,
        &db,
        &["run", "fix the test", "--provider", &provider, "--json"],
        b"",
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let id = last_json(&run)["execution_id"].as_str().unwrap().to_owned();
    let start = started(&db, &id);
    assert_eq!(start["task"], "fix the test");
    assert_eq!(start["workspace"], here.to_str().unwrap());

    let piped = nerve_in(
        &here,
        &db,
        &["run", "--task-file", "-", "--provider", &provider, "--json"],
        b"the task from a pipe\n",
    );
    assert!(piped.status.success(), "{}", stderr(&piped));
    let id = last_json(&piped)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(started(&db, &id)["task"], "the task from a pipe\n");

    let none = nerve_in(&here, &db, &["run", "--provider", &provider], b"");
    assert_eq!(none.status.code(), Some(2), "{}", stderr(&none));
    assert!(stderr(&none).contains("give the task"), "{}", stderr(&none));
}

#[test]
fn continue_without_an_id_picks_the_latest_execution_of_the_workspace_and_last_the_newest() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first = workspace(dir.path(), "first");
    let second = workspace(dir.path(), "second");
    let db = dir.path().join("nerve.db");
    let provider = cassette(dir.path(), "Answered.");
    let mut ids = Vec::new();
    for ws in [&first, &second] {
        let run = nerve_in(
            ws,
            &db,
            &["run", "a task", "--provider", &provider, "--json"],
            b"",
        );
        assert!(run.status.success(), "{}", stderr(&run));
        ids.push(last_json(&run)["execution_id"].as_str().unwrap().to_owned());
    }
    // In `first`, -c continues first's execution (not the newer one on `second`), with the
    // value after -c taken as the prompt since it cannot be an id.
    let more = nerve_in(
        &first,
        &db,
        &[
            "run",
            "-c",
            "and one more thing",
            "--provider",
            &provider,
            "--json",
        ],
        b"",
    );
    assert!(more.status.success(), "{}", stderr(&more));
    assert_eq!(last_json(&more)["execution_id"], ids[0].as_str());
    let events = events_json(&db, &ids[0]);
    assert!(
        events.iter().any(|e| e["kind"] == "message_appended"
            && e["payload"].to_string().contains("and one more thing")),
        "{events:?}"
    );
    // --resume without an id, from --workspace: the same choice.
    let again = nerve_in(
        dir.path(),
        &db,
        &[
            "run",
            "--resume",
            "--workspace",
            second.to_str().unwrap(),
            "--task",
            "again",
            "--provider",
            &provider,
            "--json",
        ],
        b"",
    );
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(last_json(&again)["execution_id"], ids[1].as_str());

    // chat -c in `first` reopens first's execution: no new execution.
    let chat = nerve_in(
        &first,
        &db,
        &["chat", "-c", "--provider", &provider],
        b"more please\n/exit\n",
    );
    assert_eq!(chat.status.code(), Some(0), "{}", stderr(&chat));
    let listed = last_json(&nerve(&db, &["list", "--json"]));
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    assert!(
        events_json(&db, &ids[0])
            .iter()
            .any(|e| e["payload"].to_string().contains("more please")),
        "chat -c did not reopen the workspace's execution"
    );

    // `last` is the newest execution, wherever an id is taken.
    let show = nerve(&db, &["show", "last", "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert_eq!(last_json(&show)["execution_id"], ids[1].as_str());
    for command in [["verify", "last"], ["replay", "last"], ["events", "last"]] {
        let output = nerve(&db, &command);
        assert!(output.status.success(), "{command:?}: {}", stderr(&output));
    }
    // A directory no execution worked on says so in one line.
    let elsewhere = workspace(dir.path(), "elsewhere");
    let nothing = nerve_in(
        &elsewhere,
        &db,
        &["run", "-c", "x y", "--provider", &provider],
        b"",
    );
    assert_eq!(nothing.status.code(), Some(2), "{}", stderr(&nothing));
    assert!(
        stderr(&nothing).contains("no execution works on"),
        "{}",
        stderr(&nothing)
    );
}

#[test]
fn nerve_alone_opens_a_chat_in_the_current_directory() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let here = workspace(dir.path(), "project");
    let db = dir.path().join("nerve.db");
    let provider = cassette(dir.path(), "Bonjour.");
    // The provider comes from the settings, as a user's would.
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, format!("provider = {:?}\n", provider)).unwrap();
    let chat = nerve_in(
        &here,
        &db,
        &["--config", config.to_str().unwrap()],
        b"hello\n/exit\n",
    );
    assert_eq!(
        chat.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&chat),
        stderr(&chat)
    );
    assert!(stdout(&chat).contains("Bonjour."), "{}", stdout(&chat));
    let list = nerve(&db, &["list", "--json"]);
    let listed = last_json(&list);
    let id = listed[0]["execution_id"].as_str().unwrap();
    let start = started(&db, id);
    assert_eq!(start["workspace"], here.to_str().unwrap());
    assert_eq!(start["config"]["chat"], true);
}
