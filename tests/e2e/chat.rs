//! The terminal experience: the live transcript of `nerve run` (plain in a pipe, snapshotted),
//! `--quiet`, `run --continue`, and `nerve chat` in a real terminal (tmux): messages, an
//! inline approval, Ctrl-C mid-turn, slash commands, reopening, all one execution whose log
//! verifies and replays complete.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{
    PATIENCE, copy_example, docker_available, events_json, nerve, nerve_bin, nerve_env, root,
    stderr, stdout,
};

/// A terminal the test types into and reads from: a tmux server of its own (its own
/// socket, so no other tmux on the machine is touched), one window running `command`.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `nerve <args>` with `env` in a 160x50 terminal. When it exits, the pane says
    /// `nerve exited CODE` and stays, so the end can be read.
    pub(crate) fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("nerve-chat-e2e-{}-{n}", std::process::id());
        let mut line =
            String::from("env -u NO_COLOR -u NERVE_CONFIG -u OPENAI_API_KEY -u ANTHROPIC_API_KEY");
        for name in [
            "PATH",
            "HOME",
            "NERVE_EXECUTOR",
            "NERVE_REQUIRE_DOCKER",
            "DOCKER_HOST",
        ] {
            if let Ok(value) = std::env::var(name) {
                line.push_str(&format!(" {name}={}", quote(&value)));
            }
        }
        for (name, value) in env {
            line.push_str(&format!(" {name}={}", quote(value)));
        }
        line.push_str(&format!(" {}", quote(&nerve_bin().display().to_string())));
        for arg in args {
            line.push_str(&format!(" {}", quote(arg)));
        }
        line.push_str("; echo \"nerve exited $?\"; sleep 3600");
        let status = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "160",
                "-y",
                "50",
            ])
            .arg(&line)
            .status()
            .unwrap_or_else(|e| panic!("tmux is needed for the terminal tests: {e}"));
        assert!(status.success(), "tmux new-session failed");
        Self { socket }
    }

    fn tmux(&self, args: &[&str]) -> String {
        let output = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The screen and its scrollback, as text; when tmux cannot read it (its server is
    /// gone), what tmux said instead, so that a failure shows why.
    pub(crate) fn screen(&self) -> String {
        let output = Command::new("tmux")
            .args([
                "-L",
                &self.socket,
                "capture-pane",
                "-p",
                "-J",
                "-S",
                "-1000",
            ])
            .output()
            .unwrap();
        if output.status.success() {
            String::from_utf8_lossy(&output.stdout).into_owned()
        } else {
            format!(
                "[tmux capture-pane failed ({}): {}]",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )
        }
    }

    /// Types `text` and Enter.
    fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-l", text]);
        self.tmux(&["send-keys", "Enter"]);
    }

    fn keys(&self, keys: &str) {
        self.tmux(&["send-keys", keys]);
    }

    /// Waits until the screen shows `text` `times` times; returns the screen.
    fn wait_for_count(&self, text: &str, times: usize) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if screen.matches(text).count() >= times {
                return screen;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the terminal never showed {text:?} ({times}x):\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(crate) fn wait_for(&self, text: &str) -> String {
        self.wait_for_count(text, 1)
    }

    /// The visible screen alone, without the scrollback.
    fn visible(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J"])
    }

    /// Waits until the chat's prompt is the last line: the line editor owns the terminal
    /// (typing earlier could be lost when it switches the terminal to raw mode).
    fn wait_for_prompt(&self) {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            let last = screen.lines().rev().find(|line| !line.trim().is_empty());
            if last.is_some_and(|line| line.trim_end() == "›") {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the terminal never showed the prompt:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the prompt, then types `text` and Enter.
    fn say(&self, text: &str) {
        self.wait_for_prompt();
        self.type_line(text);
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The cassette of the chat: one line per agent call, in the order the messages use them.
const CHAT_CASSETTE: &str = r#"{"text": "Let me look.", "tool_calls": [{"name": "shell", "arguments": {"command": "echo one"}}]}
{"text": "First answer."}
{"text": "Touching.", "tool_calls": [{"name": "shell", "arguments": {"command": "touch approved.txt"}}]}
{"text": "Second answer."}
{"text": "Sleeping.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 20 && echo slept"}}]}
{"text": "Third answer."}
{"text": "Reopened answer."}
"#;

struct Setup {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    db: PathBuf,
    config: PathBuf,
    provider: String,
    state: PathBuf,
}

fn setup(cassette: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[policy]\nrules = [ { tool = \"shell\", pattern = \"touch\", action = \"ask\" } ]\n",
    )
    .unwrap();
    let script = dir.path().join("cassette.jsonl");
    std::fs::write(&script, cassette).unwrap();
    let state = dir.path().join("state");
    Setup {
        provider: format!("script:{}", script.display()),
        _dir: dir,
        workspace,
        db,
        config,
        state,
    }
}

/// `nerve chat <args>` in a terminal, on the setup's log and policy, with its history in
/// the setup's state directory.
fn chat_in_tmux(s: &Setup, args: &[&str]) -> Tmux {
    let state = s.state.display().to_string();
    let mut all = vec![
        "--db",
        s.db.to_str().unwrap(),
        "--config",
        s.config.to_str().unwrap(),
        "chat",
    ];
    all.extend(args);
    Tmux::start(&all, &[("XDG_STATE_HOME", state.as_str())])
}

/// `nerve chat` on the setup's workspace and cassette, once it waits for a message.
fn chat_on_workspace(s: &Setup) -> Tmux {
    let term = chat_in_tmux(
        s,
        &[
            "--workspace",
            s.workspace.to_str().unwrap(),
            "--provider",
            &s.provider,
        ],
    );
    term.wait_for("type a message");
    term
}

/// `nerve run --continue ID --task MESSAGE`, expected to complete; its output and stdout.
fn continue_with(
    db: &Path,
    id: &str,
    message: &str,
    provider: &str,
) -> (std::process::Output, String) {
    let more = nerve_env(
        db,
        &[
            "run",
            "--continue",
            id,
            "--task",
            message,
            "--provider",
            provider,
        ],
        &[],
    );
    assert_eq!(more.status.code(), Some(0), "{}", stderr(&more));
    let text = stdout(&more);
    (more, text)
}

pub(crate) fn the_only_execution(db: &Path) -> String {
    let list = nerve(db, &["list", "--json"]);
    let list: serde_json::Value = serde_json::from_str(stdout(&list).trim()).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "one execution: {list:?}");
    list[0]["execution_id"].as_str().unwrap().to_owned()
}

fn replay_json(db: &Path, id: &str) -> serde_json::Value {
    let replay = nerve(db, &["replay", id, "--json"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    serde_json::from_str(stdout(&replay).trim()).unwrap()
}

#[test]
fn chat_in_a_terminal_is_one_execution_that_replays_complete() {
    if !docker_available() {
        return;
    }
    let s = setup(CHAT_CASSETTE);
    let term = chat_in_tmux(
        &s,
        &[
            "--workspace",
            s.workspace.to_str().unwrap(),
            "--provider",
            &s.provider,
        ],
    );
    term.wait_for("type a message");

    term.say("hello there");
    let screen = term.wait_for("First answer.");
    assert!(screen.contains("→ shell echo one"), "{screen}");

    // An `ask` rule: the question comes inline; yes runs the call.
    term.say("now touch the file");
    term.wait_for("allow shell touch approved.txt? [y]es / [n]o / [a]lways");
    term.type_line("y");
    let screen = term.wait_for("Second answer.");
    assert!(screen.contains("· approved by the user"), "{screen}");
    assert!(s.workspace.join("approved.txt").exists());

    // Ctrl-C while the tool runs: the turn stops at its boundary, back to the prompt. The
    // command runs 20 s so that the key arrives while it runs on a loaded machine too.
    term.say("sleep a while");
    term.wait_for("→ shell sleep 20 && echo slept");
    term.keys("C-c");
    term.wait_for("stopped: the agent's turn was interrupted");

    term.say("third message");
    term.wait_for("Third answer.");
    term.say("/cost");
    term.wait_for("6 turns · ");
    term.say("/context");
    term.wait_for("context: ");
    term.say("/exit");
    let screen = term.wait_for("nerve exited 0");
    assert!(screen.contains("log: execution "), "{screen}");
    for said in [
        "First answer.",
        "Second answer.",
        "Third answer.",
        "Let me look.",
    ] {
        assert_eq!(screen.matches(said).count(), 1, "{said} once:\n{screen}");
    }
    drop(term);

    let id = the_only_execution(&s.db);
    let verify = nerve(&s.db, &["verify", &id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let replayed = replay_json(&s.db, &id);
    assert_eq!(replayed["complete"], true, "{replayed}");
    assert_eq!(replayed["gaps"], serde_json::json!([]), "{replayed}");
    assert_eq!(replayed["termination_reason"], "completed", "{replayed}");
    assert_eq!(replayed["total_turns"], 6, "{replayed}");
    assert_eq!(replayed["task"], "hello there", "{replayed}");
    let events = events_json(&s.db, &id);
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "started").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "finish").count(),
        4,
        "one per message"
    );
    let decided = events
        .iter()
        .find(|e| e["kind"] == "approval_decided")
        .expect("the inline approval is recorded");
    assert_eq!(decided["payload"]["decided_by"], "user", "{decided}");
    assert_eq!(decided["payload"]["decision"], "approved", "{decided}");
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "finish" && e["payload"]["termination_reason"] == "shutdown"),
        "the interrupted message ended with shutdown"
    );
    assert!(
        std::fs::read_to_string(s.state.join("nerve").join("chat_history"))
            .unwrap()
            .contains("third message"),
        "the line editor keeps a history"
    );

    // Reopened by a prefix of its id: the same execution goes on.
    let prefix = &id[..13];
    let term = chat_in_tmux(&s, &[prefix]);
    term.wait_for("reopened after turn 6");
    term.say("once more");
    term.wait_for("Reopened answer.");
    term.wait_for_prompt();
    term.keys("C-d");
    term.wait_for("nerve exited 0");
    drop(term);
    assert_eq!(the_only_execution(&s.db), id);
    let replayed = replay_json(&s.db, &id);
    assert_eq!(replayed["complete"], true, "{replayed}");
    assert_eq!(replayed["gaps"], serde_json::json!([]), "{replayed}");
    assert_eq!(replayed["total_turns"], 7, "{replayed}");
    assert_eq!(replayed["termination_reason"], "completed", "{replayed}");
    let verify = nerve(&s.db, &["verify", &id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
    let show = stdout(&nerve(&s.db, &["show", &id]));
    for said in [
        "First answer.",
        "Second answer.",
        "Third answer.",
        "Reopened answer.",
    ] {
        assert!(show.contains(said), "{said} in {show}");
    }
}

#[test]
fn a_run_on_a_terminal_shows_its_transcript_and_final_answer() {
    if !docker_available() {
        return;
    }
    let s = setup(&std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap());
    let task = root().join("examples/demo/task.txt");
    let term = Tmux::start(
        &[
            "--db",
            s.db.to_str().unwrap(),
            "run",
            "--workspace",
            s.workspace.to_str().unwrap(),
            "--task-file",
            task.to_str().unwrap(),
            "--provider",
            &s.provider,
        ],
        &[],
    );
    let screen = term.wait_for("nerve exited 0");
    let id = the_only_execution(&s.db);
    for shown in [
        "Let me look at the workspace and run the test.".to_owned(),
        "→ shell ls -l && sh test.sh".to_owned(),
        "  exit 1 · 4 lines".to_owned(),
        "→ shell sh test.sh".to_owned(),
        "The test passes: greet.sh now prints \"Hello, Nerve!\".".to_owned(),
        "completed after 5 turns".to_owned(),
        format!("log: execution {id} in {}", s.db.display()),
        format!("chat   {id}   talk to the agent about it"),
    ] {
        assert!(
            screen.contains(&shown),
            "{shown:?} not on the screen:\n{screen}"
        );
    }
    // The answer streamed onto the screen once, and is not printed again at the end.
    assert_eq!(
        screen
            .matches("The test passes: greet.sh now prints")
            .count(),
        1,
        "{screen}"
    );
    // The status line is redrawn in place, never left behind as a line of its own.
    assert!(!screen.contains("\nturn 5 · "), "{screen}");
}

/// Ids, paths and `ls -l` dates differ per run; the rest of the transcript does not.
fn masked(text: &str, id: &str, dir: &Path) -> String {
    text.replace(id, "[ID]")
        .replace(&dir.display().to_string(), "[DIR]")
        .lines()
        .map(|line| match line.strip_prefix("  │ ") {
            Some(rest) if rest.starts_with("-rw") => {
                format!(
                    "  │ [ls -l] {}",
                    rest.split_whitespace().last().unwrap_or("")
                )
            }
            _ => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn run_plain(
    dir: &Path,
    cassette: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> (std::process::Output, PathBuf) {
    let workspace = copy_example("demo", dir);
    let db = dir.join("nerve.db");
    let script = dir.join("cassette.jsonl");
    std::fs::write(&script, cassette).unwrap();
    let provider = format!("script:{}", script.display());
    let mut args = vec![
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task-file",
    ];
    let task = root().join("examples/demo/task.txt");
    args.push(task.to_str().unwrap());
    args.extend(["--provider", &provider]);
    args.extend(extra);
    let mut all_env = vec![("NO_COLOR", "")];
    all_env.extend(env);
    (nerve_env(&db, &args, &all_env), db)
}

/// Runs the demo task on `cassette` in a pipe; expects exit `code` and the plain
/// transcript snapshotted as `name`.
fn check_transcript(name: &str, cassette: &str, code: i32) {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (run, db) = run_plain(dir.path(), cassette, &[], &[]);
    assert_eq!(run.status.code(), Some(code), "{}", stderr(&run));
    assert!(!run.stdout.contains(&0x1b), "no escape sequence in a pipe");
    let id = the_only_execution(&db);
    insta::assert_snapshot!(name, masked(&stdout(&run), &id, dir.path()));
}

#[test]
fn the_demo_reads_as_a_transcript_in_a_pipe() {
    let cassette = std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap();
    check_transcript("demo_transcript", &cassette, 0);
}

#[test]
fn a_failed_run_says_what_ran_and_why_it_failed() {
    let cassette = r#"{"text": "Run the test.", "tool_calls": [{"name": "shell", "arguments": {"command": "sh test.sh"}}]}
{"error": "auth"}
"#;
    check_transcript("failed_transcript", cassette, 1);
}

#[test]
fn quiet_prints_the_answer_and_continue_and_chat_work_headless_in_pipes() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The demo's run, then answers of this test's own (not the demo's answer to a chat).
    let demo = std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap();
    let mut cassette: String = demo
        .lines()
        .filter(|line| !line.contains("knows nothing more"))
        .map(|line| format!("{line}\n"))
        .collect();
    cassette.push_str(
        r#"{"text": "Checking.", "tool_calls": [{"name": "shell", "arguments": {"command": "cat greet.sh"}}]}
{"text": "Still fixed."}
{"text": "Chatted."}
{"call": "summary", "text": "The test in test.sh passes: greet.sh was fixed and checked again."}
{"text": "After compaction."}
{"call": "plan", "tool_calls": [{"name": "submit_plan", "arguments": {"steps": ["Say it is done."]}}]}
{"text": "Step done."}
"#,
    );
    let (run, db) = run_plain(dir.path(), &cassette, &["--quiet"], &[]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    assert_eq!(
        stdout(&run),
        "The test passes: greet.sh now prints \"Hello, Nerve!\".\n",
        "--quiet prints only the final answer"
    );
    let id = the_only_execution(&db);
    let provider = format!("script:{}", dir.path().join("cassette.jsonl").display());

    // The next message, headless: same execution, a recorded follow-up.
    let (more, text) = continue_with(&db, &id[..12], "Check it again.", &provider);
    assert!(
        text.contains(&format!("continuing execution {id} after turn 5")),
        "{text}"
    );
    assert!(text.contains("→ shell cat greet.sh"), "{text}");
    assert!(text.contains("Still fixed."), "{text}");
    assert!(text.contains("completed after 7 turns"), "{text}");

    // A chat with its input from a pipe: plain lines, no escape sequence.
    let chat = crate::support::chat_piped(
        &db,
        &[&id, "--provider", &provider],
        &dir.path().join("state"),
        b"/help\nAnything else?\n/cost\n/compact\nGo on.\n/plan\nPlan this.\n/exit\n",
    );
    assert_eq!(chat.status.code(), Some(0), "{}", stderr(&chat));
    let text = stdout(&chat);
    // /help names the keys too.
    assert!(
        text.contains("keys:\n  Enter      send the message"),
        "/help: {text}"
    );
    assert!(
        text.contains("  Ctrl-C     while the agent works: stop its turn now"),
        "{text}"
    );
    assert!(text.contains("Chatted."), "{text}");
    assert!(text.contains("8 turns · "), "/cost: {text}");
    // /compact: the next message runs on a compacted context; /plan: planned first.
    assert!(text.contains("· context compacted ("), "/compact: {text}");
    assert!(text.contains("After compaction."), "{text}");
    assert!(text.contains("Step done."), "/plan: {text}");
    for (what, bytes) in [
        ("run --quiet", &run.stdout),
        ("run --continue stdout", &more.stdout),
        ("run --continue stderr", &more.stderr),
        ("chat stdout", &chat.stdout),
        ("chat stderr", &chat.stderr),
    ] {
        assert!(
            !bytes.contains(&0x1b),
            "{what} holds an escape sequence: {:?}",
            String::from_utf8_lossy(bytes)
        );
    }
    let replayed = replay_json(&db, &id);
    assert_eq!(replayed["complete"], true, "{replayed}");
    assert_eq!(replayed["gaps"], serde_json::json!([]), "{replayed}");
    assert_eq!(replayed["total_turns"], 10, "{replayed}");
    assert_eq!(the_only_execution(&db), id);
    let events = events_json(&db, &id);
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "model_called" && e["payload"]["purpose"] == "plan"),
        "the /plan message was planned"
    );
    assert!(
        events.iter().any(|e| e["kind"] == "compaction"),
        "/compact compacted"
    );
}

#[test]
fn a_crashed_run_continues_with_a_message_after_its_resume() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cassette = std::fs::read_to_string(root().join("examples/demo/cassette.jsonl")).unwrap();
    // Killed (SIGKILL) once the first tool call's intent is durable: no finish in the log.
    let (crashed, db) = run_plain(
        dir.path(),
        &cassette,
        &[],
        &[("NERVE_KILL_AFTER_EVENT", "9")],
    );
    assert_eq!(crashed.status.code(), None, "killed: {}", stderr(&crashed));
    let id = the_only_execution(&db);
    let provider = format!("script:{}", dir.path().join("cassette.jsonl").display());
    let (_, text) = continue_with(&db, &id, "Finish it.", &provider);
    assert!(
        text.contains("· resumed after turn 0 (attempt 1)"),
        "{text}"
    );
    assert!(text.contains("The test passes"), "{text}");
    let kinds: Vec<String> = events_json(&db, &id)
        .iter()
        .map(|e| {
            let kind = e["kind"].as_str().unwrap().to_owned();
            if kind == "message_appended" && e["payload"]["message"]["role"] == "user" {
                format!("user: {}", e["payload"]["message"])
            } else {
                kind
            }
        })
        .collect();
    let resumed = kinds.iter().position(|k| k == "resumed").expect("a resume");
    let asked = kinds
        .iter()
        .position(|k| k.contains("Finish it."))
        .expect("the message");
    assert!(resumed < asked, "{kinds:?}");
    let replayed = replay_json(&db, &id);
    assert_eq!(replayed["complete"], true, "{replayed}");
    assert_eq!(replayed["gaps"], serde_json::json!([]), "{replayed}");
    assert_eq!(replayed["termination_reason"], "completed", "{replayed}");
}

/// A slow answer that would start a 10 s command, the same command answered at once, and
/// the answer a resumed run gets.
const STOP_CASSETTE: &str = r#"{"text": "Thinking.", "delay_ms": 4000, "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 10 && echo slept > first.txt"}}]}
{"text": "Sleeping.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 10 && echo slept > second.txt"}}]}
{"text": "Resumed answer."}
"#;

/// Stop means stop: Ctrl-C while the model answers starts no tool call afterwards; Ctrl-C
/// while a command runs kills it within 2 s and records the call as interrupted; each
/// message ends `shutdown`, and `resume` completes the execution.
#[test]
fn ctrl_c_in_chat_starts_no_tool_call_and_interrupts_the_running_command() {
    use crate::support::read_log;
    if !docker_available() {
        return;
    }
    let s = setup(STOP_CASSETTE);
    let term = chat_on_workspace(&s);
    let count = |kind: &str| read_log(&s.db).iter().filter(|e| e.kind == kind).count();
    // Ends: PATIENCE bounds every wait.
    let wait_until = |what: &str, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < PATIENCE,
                "gave up waiting for {what}:\n{}",
                term.screen()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };

    // Ctrl-C while the model takes 4 s to answer: the answer is abandoned.
    term.say("think slowly");
    wait_until("the user's message in the log", &|| {
        read_log(&s.db)
            .iter()
            .any(|e| e.kind == "message_appended" && e.payload["message"]["role"] == "user")
    });
    term.keys("C-c");
    term.wait_for("stopped: the agent's turn was interrupted");
    wait_until("the first message's finish", &|| count("finish") >= 1);
    assert_eq!(
        count("tool_call_started"),
        0,
        "no tool call after the Ctrl-C"
    );

    // Ctrl-C while the command runs: it dies at once.
    term.say("now sleep");
    wait_until("the sleep to start", &|| count("tool_call_started") >= 1);
    let sent = Instant::now();
    term.keys("C-c");
    wait_until("the sleep's end", &|| count("tool_call_finished") >= 1);
    let stopped = sent.elapsed();
    assert!(
        stopped < Duration::from_secs(2),
        "the command took {stopped:?} to stop"
    );
    term.wait_for_count("stopped: the agent's turn was interrupted", 2);
    term.say("/exit");
    term.wait_for("nerve exited");
    drop(term);
    assert!(!s.workspace.join("first.txt").exists());
    assert!(!s.workspace.join("second.txt").exists());

    let id = the_only_execution(&s.db);
    let events = events_json(&s.db, &id);
    let finished = events
        .iter()
        .find(|e| e["kind"] == "tool_call_finished")
        .unwrap();
    assert_eq!(finished["payload"]["interrupted"], true, "{finished}");
    let shutdowns = events
        .iter()
        .filter(|e| e["kind"] == "finish" && e["payload"]["termination_reason"] == "shutdown")
        .count();
    assert_eq!(shutdowns, 2, "each stopped message ends shutdown");
    let replayed = replay_json(&s.db, &id);
    assert_eq!(replayed["gaps"], serde_json::json!([]), "{replayed}");

    let resume = nerve(&s.db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result: serde_json::Value =
        serde_json::from_str(stdout(&resume).lines().last().unwrap()).unwrap();
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["answer"], "Resumed answer.", "{result}");
}

/// The cassette of the keys test: the first answer comes after a wait (the spinner and
/// clock show it), then one answer per message; a new conversation starts the cassette over.
const KEYS_CASSETTE: &str = r#"{"text": "Waited.", "delay_ms": 2500}
{"text": "Two lines read."}
{"text": "Backslash read."}
"#;

/// Issue 32, item 10: `/help` lists the keys, `/status` and `/model` say what the chat runs
/// on, Alt-Enter and a trailing `\` break a message over lines, a spinner and a clock show
/// while the model is waited for, and `/new` and `/clear` start a new conversation.
#[test]
fn chat_keys_and_commands_status_model_new_clear_and_a_clock_while_waiting() {
    if !docker_available() {
        return;
    }
    let s = setup(KEYS_CASSETTE);
    let term = chat_on_workspace(&s);

    // While the answer is waited for: a spinner and the seconds since the message.
    term.say("wait for it");
    let screen = term.wait_for("s · turn 0 · 0 in / 0 out tokens in all");
    let status = screen
        .lines()
        .find(|l| l.contains("s · turn 0 · "))
        .unwrap();
    let spinner = status.trim_start().chars().next().unwrap();
    assert!("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏".contains(spinner), "{status}");
    term.wait_for("Waited.");

    term.say("/help");
    let screen = term.wait_for("Alt-Enter");
    for listed in ["/status", "/model", "/new", "/clear", "Ctrl-C", "Ctrl-D"] {
        assert!(screen.contains(listed), "{listed} in /help:\n{screen}");
    }
    term.say("/status");
    let screen = term.wait_for("approval auto");
    assert!(screen.contains("provider script:"), "{screen}");
    assert!(screen.contains("model scripted"), "{screen}");
    term.say("/model");
    term.wait_for("/model NAME asks another");
    term.say("/model gpt-4o");
    term.wait_for("it has no model to choose");

    // Alt-Enter, then a trailing backslash: one message over two lines each.
    term.wait_for_prompt();
    term.tmux(&["send-keys", "-l", "first line"]);
    term.tmux(&["send-keys", "M-Enter"]);
    term.type_line("second line");
    term.wait_for("Two lines read.");
    term.say("third \\");
    term.type_line("fourth");
    term.wait_for("Backslash read.");
    let id = the_only_execution(&s.db);
    let said: Vec<String> = events_json(&s.db, &id)
        .iter()
        .filter(|e| e["kind"] == "message_appended")
        .filter(|e| e["payload"]["message"]["role"] == "user")
        .map(|e| {
            e["payload"]["message"]["parts"][0]["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert!(
        said.iter().any(|t| t == "first line\nsecond line"),
        "{said:?}"
    );
    assert!(said.iter().any(|t| t == "third \nfourth"), "{said:?}");

    // A new conversation on the same workspace: another execution.
    term.say("/new");
    term.wait_for("set aside: a new conversation begins");
    term.wait_for_count("nerve chat · execution", 2);
    term.say("again");
    term.wait_for_count("Waited.", 2);
    // /clear: the screen cleared, and a new conversation again.
    term.say("/clear");
    let start = Instant::now();
    // Ends: PATIENCE bounds the wait.
    loop {
        let visible = term.visible();
        if visible.contains("nerve chat · execution") && !visible.contains("Alt-Enter") {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "the screen was not cleared:\n{visible}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    term.say("/exit");
    term.wait_for("nerve exited 0");
    let list = nerve(&s.db, &["list", "--json"]);
    let list: serde_json::Value = serde_json::from_str(stdout(&list).trim()).unwrap();
    assert!(list.as_array().unwrap().len() >= 2, "{list}");
}

/// `/model NAME` on an HTTP provider: the next message is asked of NAME (an
/// OpenAI-compatible server in the test records each request's `model`), and `/status`
/// says so.
#[test]
fn slash_model_asks_another_model_from_the_next_message_on() {
    if !docker_available() {
        return;
    }
    let s = setup("");
    let model = crate::proxy::fake_model(vec![
        serde_json::json!({"content": "First from the server."}),
        serde_json::json!({"content": "Second from the server."}),
    ]);
    let url = format!("http://127.0.0.1:{}/v1", model.port);
    let state = s.state.display().to_string();
    let term = Tmux::start(
        &[
            "--db",
            s.db.to_str().unwrap(),
            "chat",
            "--workspace",
            s.workspace.to_str().unwrap(),
            "--provider",
            "openai",
            "--model",
            "test-model",
        ],
        &[
            ("XDG_STATE_HOME", state.as_str()),
            ("OPENAI_BASE_URL", url.as_str()),
        ],
    );
    term.wait_for("type a message");
    term.say("one");
    term.wait_for("First from the server.");
    term.say("/model other-model");
    term.wait_for("the next message asks other-model");
    term.say("/status");
    term.wait_for("provider openai · model other-model");
    term.say("two");
    term.wait_for("Second from the server.");
    term.say("/exit");
    term.wait_for("nerve exited 0");
    let asked: Vec<String> = model
        .requests()
        .iter()
        .map(|raw| {
            let (_, body) = raw.split_once("\n\n").unwrap();
            let body: serde_json::Value = serde_json::from_str(body).unwrap();
            body["model"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(asked, ["test-model", "other-model"]);
}
