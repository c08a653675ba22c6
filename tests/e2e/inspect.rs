//! The inspection commands as a person uses them: abbreviated ids, the transcript of
//! `show`, `events --full`, `list`'s header, help text, and no escape codes in pipes.

use std::path::Path;

use nerve_core::event::Started;
use nerve_core::{Event, ExecutionId, LoopType, Redactor, TaskId};
use nerve_session::Store;

use crate::support::{
    copy_example, docker_available, last_json, nerve, nerve_bin, nerve_env, root, stderr, stdout,
};

/// A log holding one `started` event for each of `ids`.
fn log_with(db: &Path, ids: &[&str]) {
    let mut store = Store::open(db).unwrap();
    for id in ids {
        let id: ExecutionId = id.parse().unwrap();
        let started = Event::Started(Started {
            task_id: TaskId::new(),
            task: format!("task of {id}"),
            workspace: "/w".into(),
            loop_type: LoopType::React,
            provider: "script:x".into(),
            model: "scripted".into(),
            max_turns: 20,
            config: serde_json::Value::Null,
            parent: None,
            call_id: None,
            fork: None,
        });
        store.append(&id, &[started], &Redactor::new()).unwrap();
    }
}

const A: &str = "0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f";
const B: &str = "0192f0c4-7b1e-7c3a-9f00-000000000001";
const C: &str = "0192f0c5-0000-7000-8000-000000000000";

#[test]
fn a_unique_id_prefix_works_wherever_an_id_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    log_with(&db, &[A, B, C]);

    // A unique prefix, in any case, reaches the execution in every command that takes one.
    for args in [
        vec!["show", "0192f0c5", "--json"],
        vec!["replay", "0192F0C5", "--json"],
        vec!["events", "0192f0c5-0", "--json"],
    ] {
        let output = nerve(&db, &args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stdout(&output).contains(C), "{args:?}: {}", stdout(&output));
    }
    let verify = nerve(&db, &["verify", "0192f0c4-7b1e-7c3a-9f00-4"]);
    assert_eq!(verify.status.code(), Some(0), "{}", stderr(&verify));
    assert!(stdout(&verify).contains("1 events"), "{}", stdout(&verify));

    // Ambiguous: one line naming the candidates, exit 2, for every id-taking command.
    for command in ["show", "replay", "events", "verify", "resume", "approve"] {
        let output = nerve(&db, &[command, "0192f0c"]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{command}: {}",
            stderr(&output)
        );
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{command}: {err}");
        assert!(err.contains("ambiguous"), "{command}: {err}");
        for id in [A, B, C] {
            assert!(err.contains(id), "{command}: {err}");
        }
    }

    // No match: one line, exit 2.
    for prefix in ["0193", "ffff-"] {
        let output = nerve(&db, &["show", prefix]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        let err = stderr(&output);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("no execution id starts with `{prefix}`")),
            "{err}"
        );
    }

    // Not an id at all: the parse error, one line, exit 2.
    let output = nerve(&db, &["show", "not-an-id"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("is not a valid execution id"),
        "{}",
        stderr(&output)
    );
    assert_eq!(stderr(&output).lines().count(), 1);
}

/// Runs the README demo through the binary; its execution id.
fn demo_run(dir: &Path, db: &Path) -> String {
    let workspace = copy_example("demo", dir);
    let cassette = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let task_file = root().join("examples/demo/task.txt");
    let run = nerve(
        db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task-file",
            task_file.to_str().unwrap(),
            "--provider",
            &cassette,
            "--json",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    last_json(&run)["execution_id"].as_str().unwrap().to_owned()
}

/// A run that fails: a command that fails, then the cassette runs out.
fn failed_run(dir: &Path, db: &Path) -> String {
    let workspace = dir.join("failing");
    std::fs::create_dir(&workspace).unwrap();
    let cassette = dir.join("failing.jsonl");
    std::fs::write(
        &cassette,
        concat!(
            r#"{"text": "Build it.", "tool_calls": [{"name": "shell", "arguments": {"command": "make all"}}], "usage": {"input_tokens": 700, "output_tokens": 15}}"#,
            "\n",
            r#"{"text": "Read the makefile.", "tool_calls": [{"name": "read_file", "arguments": {"path": "Makefile"}}], "usage": {"input_tokens": 800, "output_tokens": 15}}"#,
            "\n",
        ),
    )
    .unwrap();
    let provider = format!("script:{}", cassette.display());
    let run = nerve(
        db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Build the project.",
            "--provider",
            &provider,
            "--json",
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    last_json(&run)["execution_id"].as_str().unwrap().to_owned()
}

/// `show`'s transcript with the id, the start time, the workspace and the duration
/// redacted.
fn transcript(db: &Path, id: &str) -> String {
    let show = nerve(db, &["show", &id[..13]]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    stdout(&show)
        .lines()
        .map(|line| {
            let line = line.replace(id, "[id]");
            if line.starts_with("started ") {
                "started    [ts]".to_owned()
            } else if line.starts_with("workspace ") {
                "workspace  [dir]".to_owned()
            } else if line.starts_with("took ") {
                "took       [duration]".to_owned()
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn show_tells_the_story_of_a_run_and_events_full_hides_nothing() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");

    let demo = demo_run(dir.path(), &db);
    let story = transcript(&db, &demo);
    assert!(story.contains("→ shell sh test.sh"), "{story}");
    assert!(story.contains("\ntook       [duration]\n"), "{story}");
    assert!(story.contains("totals     5 turns, 7,015 input"), "{story}");
    assert!(
        story.contains("answer\n  The test passes: greet.sh now prints \"Hello, Nerve!\"."),
        "{story}"
    );
    insta::assert_snapshot!("show_demo", story);

    let failed = failed_run(dir.path(), &db);
    let story = transcript(&db, &failed);
    assert!(story.contains("error      "), "{story}");
    assert!(story.contains("ended      error"), "{story}");
    insta::assert_snapshot!("show_failed", story);

    // `show --json` is still `replay --json`; `replay` still diagnoses.
    let json = nerve(&db, &["show", &demo, "--json"]);
    assert_eq!(last_json(&json)["completeness"], 1.0);
    let replay = stdout(&nerve(&db, &["replay", &demo]));
    assert!(replay.contains("complete   1.00"), "{replay}");

    // `events` clips payloads to a line; `--full` prints every one whole, as `--json` has it.
    let full = stdout(&nerve(&db, &["events", &demo, "--full"]));
    let clipped = stdout(&nerve(&db, &["events", &demo]));
    let payloads = last_json(&nerve(&db, &["events", &demo, "--json"]));
    let longest = payloads
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["payload"].to_string())
        .max_by_key(String::len)
        .unwrap();
    assert!(longest.len() > 200, "{longest}");
    let longest: serde_json::Value = serde_json::from_str(&longest).unwrap();
    let found = full
        .lines()
        .filter_map(|line| line.find('{').map(|at| &line[at..]))
        .filter_map(|payload| serde_json::from_str::<serde_json::Value>(payload).ok())
        .any(|payload| payload == longest);
    assert!(found, "the longest payload is not whole in:\n{full}");
    assert!(clipped.lines().all(|line| line.len() < 260), "{clipped}");
    assert_eq!(full.lines().count(), clipped.lines().count());

    // `list`: a header, then newest first with relative times.
    let list = stdout(&nerve(&db, &["list"]));
    let lines: Vec<&str> = list.lines().collect();
    assert!(
        lines[0].starts_with("ID ") && lines[0].contains("STARTED"),
        "{list}"
    );
    assert!(
        lines[1].starts_with(&failed) && lines[2].starts_with(&demo),
        "{list}"
    );
    for line in &lines[1..] {
        assert!(line.contains(" ago") || line.contains("just now"), "{list}");
    }
    // Each execution's workspace, in a column of its own, and how it ended under STATUS.
    assert!(
        lines[0].contains(" STATUS ") && lines[0].contains(" WORKSPACE "),
        "{list}"
    );
    assert!(lines[1].contains("/failing "), "{list}");
    assert!(lines[2].contains("/workspace "), "{list}");
    assert!(
        lines[1].contains(" error ") && lines[2].contains(" completed "),
        "{list}"
    );
}

/// The help text of `args` (`nerve <args> --help`).
fn help(args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.push("--help");
    let output = nerve(Path::new("/nonexistent/nerve.db"), &all);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{all:?}: {}",
        stderr(&output)
    );
    stdout(&output)
}

#[test]
fn every_flag_and_argument_of_every_command_has_help_text() {
    let top = help(&[]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        // A command's name is indented by two; a wrapped description by more.
        .filter(|line| !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect();
    assert!(commands.len() >= 8, "{top}");
    for command in &commands {
        let text = help(&[command]);
        let mut entries = 0;
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            // An option or argument line: its name, then (after two spaces) what it is for,
            // or (clap's layout when some help is long) what it is for on the next line,
            // indented further.
            if !(trimmed.starts_with('-') || trimmed.starts_with('<'))
                || !line.starts_with("  ")
                // A possible value of the option above (`- queued: ...`), not an option.
                || trimmed.starts_with("- ")
            {
                continue;
            }
            entries += 1;
            let says = |text: &str| {
                text.trim()
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '`')
            };
            let indent = line.len() - trimmed.len();
            let described = match trimmed.split_once("  ") {
                Some((_, rest)) => says(rest),
                None => lines.get(at + 1).is_some_and(|next| {
                    next.len() - next.trim_start().len() > indent && says(next)
                }),
            };
            assert!(
                described,
                "`nerve {command}`: no help for {trimmed:?}\n{text}"
            );
        }
        assert!(entries >= 2, "{command}: {text}");
    }

    // The usage line shows what is required.
    let run = help(&["run"]);
    assert!(
        run.contains(
            "Usage: nerve run [OPTIONS] [--workspace <DIR>] <PROMPT|--task <TEXT>|--task-file <FILE>>\n       nerve run [OPTIONS] (-c|--continue [ID]|--resume [ID]) <PROMPT|--task <TEXT>|--task-file <FILE>>"
        ),
        "{run}"
    );
    for command in ["show", "replay", "events", "verify", "resume", "approve"] {
        let text = help(&[command]);
        assert!(
            text.contains(&format!("Usage: nerve {command} [OPTIONS] <ID>")),
            "{text}"
        );
    }
}

/// A value the credential filter keeps out of the sandbox, so that `run` logs a warning.
const TOKEN_TZ: (&str, &str) = ("TZ", "ghp_abcdefghijklmnopqrstuvwxyz0123456789");

fn assert_plain(what: &str, bytes: &[u8]) {
    assert!(
        !bytes.contains(&0x1b),
        "{what} holds an escape sequence: {:?}",
        String::from_utf8_lossy(bytes)
    );
}

/// Whether `bytes` hold a colour (SGR) sequence: ESC `[` digits and `;` then `m`.
fn coloured(bytes: &[u8]) -> bool {
    bytes.windows(2).enumerate().any(|(at, pair)| {
        pair == b"\x1b["
            && bytes[at + 2..]
                .iter()
                .find(|b| !(b.is_ascii_digit() || **b == b';'))
                .is_some_and(|b| *b == b'm')
    })
}

#[test]
fn nothing_printed_to_a_pipe_holds_an_escape_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    log_with(&db, &[A, B]);
    // Every inspection, its errors and its help, with all tracing on: stdout and stderr
    // are pipes here.
    let commands: Vec<Vec<&str>> = vec![
        vec!["list"],
        vec!["show", A],
        vec!["replay", A],
        vec!["events", A, "--full"],
        vec!["verify", A],
        vec!["show", "0192"],
        vec!["show", "nope"],
        vec!["run", "--help"],
        vec!["run"],
        vec!["frobnicate"],
    ];
    for args in &commands {
        let output = nerve_env(&db, args, &[("NERVE_LOG", "trace")]);
        assert_plain(&format!("{args:?} stdout"), &output.stdout);
        assert_plain(&format!("{args:?} stderr"), &output.stderr);
    }

    // A run that warns, with and without NO_COLOR.
    if !docker_available() {
        return;
    }
    for no_color in [None, Some("1")] {
        let workspace = copy_example(
            "demo",
            &dir.path()
                .join(format!("no-color-{}", no_color.unwrap_or("unset"))),
        );
        let cassette = format!(
            "script:{}",
            root().join("examples/demo/cassette.jsonl").display()
        );
        let mut env = vec![TOKEN_TZ];
        if let Some(value) = no_color {
            env.push(("NO_COLOR", value));
        }
        let run = nerve_env(
            &db,
            &[
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--task",
                "Fix the test.",
                "--provider",
                &cassette,
            ],
            &env,
        );
        assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
        let err = stderr(&run);
        assert!(
            err.contains("WARN") && err.contains("kept out of the sandbox"),
            "{err}"
        );
        assert_plain("run stdout", &run.stdout);
        assert_plain("run stderr", &run.stderr);
    }
}

/// Runs `nerve <args>` on a pseudo-terminal (util-linux `script`); what the terminal showed.
fn on_a_terminal(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<u8> {
    let mut command_line = format!("'{}' --db '{}'", nerve_bin().display(), db.display());
    for arg in args {
        command_line.push_str(&format!(" '{arg}'"));
    }
    let output = std::process::Command::new("script")
        .args(["-qefc", &command_line, "/dev/null"])
        .env_remove("NO_COLOR")
        .env_remove("NERVE_CONFIG")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("util-linux `script` (a pseudo-terminal) is needed: {e}"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout
}

#[test]
fn warnings_are_coloured_on_a_terminal_unless_no_color() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let cassette = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    for (no_color, expect_colour) in [(None, true), (Some("1"), false)] {
        let workspace = copy_example(
            "demo",
            &dir.path()
                .join(format!("no-color-{}", no_color.unwrap_or("unset"))),
        );
        let mut env = vec![TOKEN_TZ];
        if let Some(value) = no_color {
            env.push(("NO_COLOR", value));
        }
        let shown = on_a_terminal(
            &db,
            &[
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--task",
                "Fix the test.",
                "--provider",
                &cassette,
            ],
            &env,
        );
        let text = String::from_utf8_lossy(&shown);
        assert!(text.contains("kept out of the sandbox"), "{text}");
        assert_eq!(
            coloured(&shown),
            expect_colour,
            "NO_COLOR {no_color:?}: {text:?}"
        );
    }
}

/// The DOM of `page` once headless Chromium (Debian's `chromium`) has loaded it offline.
fn dom_of(page: &Path, profile: &Path) -> String {
    let output = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            // Offline: any request for something outside the page would fail.
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap_or_else(|e| {
            panic!("headless Chromium is needed (`cargo xtask ci` installs Debian's chromium): {e}")
        });
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_html_page_is_self_contained_and_counts_what_the_log_holds() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let workspace = copy_example("demo", dir.path());
    let script = format!(
        "script:{}",
        root().join("examples/compaction/cassette.jsonl").display()
    );
    let run = nerve(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Find out why the build fails.",
            "--provider",
            &script,
            "--context-window",
            "4000",
            "--json",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let id = last_json(&run)["execution_id"].as_str().unwrap().to_owned();
    let page = dir.path().join("run.html");
    let show = nerve(&db, &["show", &id[..8], "--html", page.to_str().unwrap()]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    assert!(
        stdout(&show).contains("answer"),
        "the transcript is still printed"
    );
    let said = format!("wrote the page of execution {id} to {}", page.display());
    assert!(stderr(&show).contains(&said), "{}", stderr(&show));

    // What the log holds.
    let events = last_json(&nerve(&db, &["events", &id, "--json"]));
    let count = |kind: &str| {
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == kind)
            .count()
    };
    let turns = last_json(&nerve(&db, &["replay", &id, "--json"]))["total_turns"]
        .as_u64()
        .unwrap() as usize;
    let (tool_calls, compactions) = (count("tool_call_started"), count("compaction"));
    assert!(
        compactions >= 2 && tool_calls >= 4,
        "{compactions} {tool_calls}"
    );

    // Self-contained: nothing to fetch.
    let html = std::fs::read_to_string(&page).unwrap();
    for outside in ["src=", "href=", "<link", "@import", "url("] {
        assert!(
            !html.contains(outside),
            "the page refers outside itself: {outside}"
        );
    }

    // What the browser shows.
    let dom = dom_of(&page, &dir.path().join("chromium-profile"));
    let in_dom = |needle: &str| dom.matches(needle).count();
    assert_eq!(in_dom("<details class=\"turn\""), turns, "turns");
    assert_eq!(
        in_dom("<details class=\"tool-call"),
        tool_calls,
        "tool calls"
    );
    assert_eq!(
        in_dom("class=\"note compaction\""),
        compactions,
        "compactions"
    );
    assert!(
        in_dom("class=\"compaction-mark\"") >= 1,
        "the fill chart marks compactions"
    );
    assert!(dom.contains("<polyline points="), "the fill chart");
    // What the agent said, in its turns; the diff of what the execution changed.
    let said = messages_said(&events);
    assert!(!said.is_empty());
    assert_eq!(
        in_dom("<div class=\"said\">"),
        said.len(),
        "what the agent said"
    );
    let first = said[0].lines().next().unwrap();
    assert!(dom.contains(first), "{first}");
    assert!(
        dom.contains("<h2>Changes to the workspace</h2><pre class=\"diff\">"),
        "the diff"
    );
    let diff = stdout(&nerve(&db, &["diff", &id]));
    let shown = diff
        .lines()
        .next()
        .unwrap()
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(dom.contains(&shown), "{shown}");
    // The events are inlined whole and parse back to the log.
    let start = dom.find("id=\"events\">").unwrap() + "id=\"events\">".len();
    let end = start + dom[start..].find("</script>").unwrap();
    let inlined: serde_json::Value = serde_json::from_str(&dom[start..end]).unwrap();
    assert_eq!(
        inlined.as_array().unwrap().len(),
        events.as_array().unwrap().len()
    );
}

/// The text of each assistant message the log holds that says something.
fn messages_said(events: &serde_json::Value) -> Vec<String> {
    events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "message_appended")
        .filter(|e| e["payload"]["message"]["role"] == "assistant")
        .filter_map(|e| {
            let text: String = e["payload"]["message"]["parts"]
                .as_array()?
                .iter()
                .filter(|p| p["type"] == "text")
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n");
            (!text.trim().is_empty()).then_some(text)
        })
        .collect()
}

/// Nothing reaches the screen that the log would redact: a token a command prints and the
/// model repeats in its answer, in a pipe and on a terminal (where the answer streams).
#[test]
fn the_transcript_shows_no_secret_the_log_redacts() {
    if !docker_available() {
        return;
    }
    const TOKEN: &str = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789";
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    std::fs::write(workspace.join("notes.txt"), format!("token={TOKEN}\n")).unwrap();
    let cassette = dir.path().join("leaky.jsonl");
    std::fs::write(
        &cassette,
        format!(
            "{}\n{}\n",
            r#"{"text": "Reading the notes.", "tool_calls": [{"name": "shell", "arguments": {"command": "cat notes.txt"}}], "usage": {"input_tokens": 700, "output_tokens": 15}}"#,
            serde_json::json!({
                "text": format!("The token is {TOKEN}, keep it safe."),
                "usage": {"input_tokens": 800, "output_tokens": 15},
            }),
        ),
    )
    .unwrap();
    let provider = format!("script:{}", cassette.display());
    let args = [
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task",
        "What is in the notes?",
        "--provider",
        &provider,
    ];
    let db = dir.path().join("nerve.db");
    let piped = nerve(&db, &args);
    assert!(piped.status.success(), "{}", stderr(&piped));
    let shown = stdout(&piped);
    assert!(
        shown.contains("The token is [REDACTED:github_token], keep it safe."),
        "{shown}"
    );
    let terminal = String::from_utf8_lossy(&on_a_terminal(&db, &args, &[])).into_owned();
    assert!(terminal.contains("[REDACTED:github_token]"), "{terminal}");
    for (what, text) in [
        ("pipe", &shown),
        ("stderr", &stderr(&piped)),
        ("terminal", &terminal),
    ] {
        assert!(!text.contains(&TOKEN[..12]), "{what}: {text}");
    }
}

/// An audit log must be verifiable read-only: `list`, `show`, `events`, `replay` and
/// `verify` read a log its reader cannot write, in a directory where it cannot create the
/// WAL's files either (as uid 4242 when the test runs as root, who could write anyway).
#[test]
fn a_log_nobody_may_write_is_inspected_and_verified() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let db = logs.join("nerve.db");
    log_with(&db, &[A]);
    // Closed cleanly, as an archived log is: no WAL files beside it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    assert!(!logs.join("nerve.db-wal").exists());
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    };
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["show", A],
        &["events", A, "--json"],
        &["replay", A, "--json"],
        &["verify", A],
    ] {
        let mut command = if root {
            let mut command = std::process::Command::new("setpriv");
            command.args(["--reuid", "4242", "--regid", "4242", "--clear-groups"]);
            command.arg(nerve_bin());
            command
        } else {
            std::process::Command::new(nerve_bin())
        };
        let output = command
            .arg("--db")
            .arg(&db)
            .args(args)
            .env("HOME", dir.path())
            .env_remove("NERVE_CONFIG")
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let out = stdout(&output);
        assert!(
            out.contains(&A[..8]) || out.contains("hash chain intact"),
            "{args:?}: {out}"
        );
        if args == ["list"] {
            // The column holds how it ended (or its queue state), not a time.
            assert!(out.lines().next().unwrap().contains("  STATUS  "), "{out}");
        }
    }
    assert!(
        !logs.join("nerve.db-wal").exists(),
        "nothing was written beside it"
    );
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o755)).unwrap();
}
