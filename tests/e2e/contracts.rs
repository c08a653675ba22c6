//! The public contracts of design.md, each through the real binary: the run flags
//! (`--timeout`, `--budget-usd`, `--budget-tokens`, `--image`, `--complexity`), every
//! termination reason's exit code, the cassette's `call` routing and error kinds, an
//! exhausted cassette, `compress_context`, `approve --deny`, and where the log and the
//! configuration are found (`NERVE_DB`, `NERVE_CONFIG`, the XDG default).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};

use crate::crash::verify;
use crate::support::{
    docker_available, docker_cli, events_json, last_json, nerve, nerve_bin, stderr,
};

/// Prices for the scripted model, so that a dollar budget can run out.
const PRICED: &str = r#"[[models]]
name = "scripted"
context_window = 200000
input_usd_per_million = 3.0
output_usd_per_million = 15.0
"#;

/// One execution's setting: a workspace, a log, a cassette and a config file in a temp dir.
struct Case {
    dir: tempfile::TempDir,
    workspace: PathBuf,
    db: PathBuf,
    provider: String,
    config: PathBuf,
}

impl Case {
    fn new(lines: &[Value]) -> Self {
        Self::with_config(lines, PRICED)
    }

    fn with_config(lines: &[Value], config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        let script = dir.path().join("cassette.jsonl");
        let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
        std::fs::write(&script, text).unwrap();
        let config_path = dir.path().join("nerve.toml");
        std::fs::write(&config_path, config).unwrap();
        Self {
            db: dir.path().join("nerve.db"),
            provider: format!("script:{}", script.display()),
            config: config_path,
            workspace,
            dir,
        }
    }

    /// `nerve --config C run --workspace W --task T --provider P --json <extra>`.
    fn run(&self, extra: &[&str]) -> Output {
        let mut args = vec![
            "--config",
            self.config.to_str().unwrap(),
            "run",
            "--workspace",
            self.workspace.to_str().unwrap(),
            "--task",
            "Write the notes.",
            "--provider",
            &self.provider,
            "--json",
        ];
        args.extend_from_slice(extra);
        nerve(&self.db, &args)
    }

    /// [`Case::run`], expecting `code` and `reason`; the JSON summary.
    fn run_expecting(&self, extra: &[&str], code: i32, reason: &str) -> Value {
        let output = self.run(extra);
        let result = last_json(&output);
        assert_eq!(
            result["termination_reason"],
            reason,
            "{result}: {}",
            stderr(&output)
        );
        assert_eq!(
            output.status.code(),
            Some(code),
            "{result}: {}",
            stderr(&output)
        );
        verify(&self.db, result["execution_id"].as_str().unwrap());
        result
    }

    fn events(&self, result: &Value) -> Vec<Value> {
        events_json(&self.db, result["execution_id"].as_str().unwrap())
    }
}

fn write(path: &str, content: &str) -> Value {
    json!({"text": format!("Write {path}."), "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]})
}

fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output})
}

/// The events of `kind`.
fn of_kind<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["kind"] == kind).collect()
}

#[test]
fn every_termination_reason_has_its_exit_code() {
    if !docker_available() {
        return;
    }
    // completed: exit 0.
    let case = Case::new(&[write("a.txt", "a\n"), json!({"text": "Done."})]);
    let done = case.run_expecting(&[], 0, "completed");
    assert_eq!(done["error"], Value::Null);

    // max_turns: the third turn never starts.
    let case = Case::new(&[
        write("a.txt", "a\n"),
        write("b.txt", "b\n"),
        write("c.txt", "c\n"),
    ]);
    let result = case.run_expecting(&["--max-turns", "2"], 1, "max_turns");
    assert_eq!(result["total_turns"], 2, "{result}");
    assert!(!case.workspace.join("c.txt").exists());

    // budget_exhausted by tokens: checked before every model call.
    let mut first = write("a.txt", "a\n");
    first["usage"] = usage(1500, 20);
    let case = Case::new(&[first.clone(), write("b.txt", "b\n")]);
    let result = case.run_expecting(&["--budget-tokens", "1000"], 1, "budget_exhausted");
    assert_eq!(result["total_turns"], 1, "{result}");
    assert_eq!(result["input_tokens"], 1500, "{result}");
    assert!(!case.workspace.join("b.txt").exists());

    // budget_exhausted by dollars: 1500 input tokens at $3/M are $0.0045.
    let case = Case::new(&[first, write("b.txt", "b\n")]);
    let result = case.run_expecting(&["--budget-usd", "0.004"], 1, "budget_exhausted");
    assert_eq!(result["total_turns"], 1, "{result}");
    assert!(result["cost_usd"].as_f64().unwrap() >= 0.004, "{result}");
    assert!(!case.workspace.join("b.txt").exists());
    // A budget the run stays under does not stop it.
    let mut cheap = write("a.txt", "a\n");
    cheap["usage"] = usage(100, 10);
    let case = Case::new(&[cheap, json!({"text": "Done.", "usage": usage(100, 10)})]);
    case.run_expecting(
        &["--budget-usd", "0.004", "--budget-tokens", "1000"],
        0,
        "completed",
    );

    // timed_out: the model never answers within --timeout.
    let case = Case::new(&[json!({"text": "late", "delay_ms": 600_000})]);
    let started = std::time::Instant::now();
    let result = case.run_expecting(&["--timeout", "1"], 1, "timed_out");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "the run outlived its timeout by far: {result}"
    );
    assert_eq!(result["total_turns"], 0, "{result}");

    // stagnation: the same call over and over; one correction, then the stop.
    let same = json!({"text": "Again.", "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}]});
    let case = Case::new(&vec![same; 12]);
    let result = case.run_expecting(&[], 1, "stagnation");
    assert!(result["total_turns"].as_u64().unwrap() < 12, "{result}");

    // error: a permanent provider error.
    let case = Case::new(&[json!({"error": "bad_request"})]);
    let result = case.run_expecting(&[], 1, "error");
    assert!(
        result["error"].as_str().unwrap().contains("bad_request"),
        "{result}"
    );

    // parked: an `ask` rule with nobody to ask.
    let case = Case::with_config(
        &[write("a.txt", "a\n"), json!({"text": "Done."})],
        &format!("{PRICED}\n[policy]\ndefault = \"ask\"\n"),
    );
    case.run_expecting(&[], 1, "parked");
    assert!(!case.workspace.join("a.txt").exists());
    // shutdown (exit 1) and an abort (exit 130) are in interrupt.rs.
}

#[test]
fn permanent_errors_fail_at_once_and_context_overflow_compacts_and_retries() {
    if !docker_available() {
        return;
    }
    for kind in ["auth", "bad_request"] {
        let case = Case::new(&[json!({"error": kind}), json!({"text": "never used"})]);
        let result = case.run_expecting(&[], 1, "error");
        assert!(result["error"].as_str().unwrap().contains(kind), "{result}");
        assert_eq!(result["task_status"], "failed", "{result}");
        let events = case.events(&result);
        assert!(of_kind(&events, "retry").is_empty(), "{kind} was retried");
        let called = of_kind(&events, "model_called");
        assert_eq!(called.len(), 1, "{kind}: {called:?}");
        assert_eq!(called[0]["payload"]["outcome"], kind);
    }

    // context_overflow: the conversation (old enough to have something to take out) is
    // compacted and the call tried once more.
    let mut lines: Vec<Value> = (0..6).map(|i| large_output(40 + i)).collect();
    lines.push(json!({"error": "context_overflow"}));
    lines.push(json!({"text": "Done after the compaction."}));
    let case = Case::new(&lines);
    let result = case.run_expecting(&[], 0, "completed");
    assert!(result["compactions"].as_u64().unwrap() >= 1, "{result}");
    let events = case.events(&result);
    let outcomes: Vec<&Value> = of_kind(&events, "model_called")
        .iter()
        .filter(|e| e["payload"]["purpose"] == "agent")
        .map(|e| &e["payload"]["outcome"])
        .collect();
    assert_eq!(outcomes.len(), 8, "{outcomes:?}");
    assert_eq!(outcomes[6..], [&json!("context_overflow"), &json!("ok")]);
    assert!(
        of_kind(&events, "compaction")
            .iter()
            .any(|e| e["payload"]["trigger"] == "overflow"),
        "{:?}",
        of_kind(&events, "compaction")
    );

    // Two overflows in a row: one retry only, then the run fails.
    let mut lines: Vec<Value> = (0..6).map(|i| large_output(40 + i)).collect();
    lines.push(json!({"error": "context_overflow"}));
    lines.push(json!({"error": "context_overflow"}));
    lines.push(json!({"text": "never used"}));
    let case = Case::new(&lines);
    let result = case.run_expecting(&[], 1, "error");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("context_overflow"),
        "{result}"
    );
}

#[test]
fn an_exhausted_cassette_ends_the_run_with_a_clear_error() {
    if !docker_available() {
        return;
    }
    let case = Case::new(&[write("a.txt", "a\n")]);
    let result = case.run_expecting(&[], 1, "error");
    let error = result["error"].as_str().unwrap();
    assert!(error.contains("exhausted"), "{result}");
    assert_eq!(result["total_turns"], 1, "{result}");
    assert_eq!(
        std::fs::read_to_string(case.workspace.join("a.txt")).unwrap(),
        "a\n"
    );
}

/// A window small enough that a few large outputs pass the hard threshold.
const SMALL_WINDOW: &str = "3000";

/// A shell call printing `lines` numbered lines of filler: a large tool output.
fn large_output(lines: u32) -> Value {
    json!({"text": "Look at the log.", "tool_calls": [{"name": "shell", "arguments": {"command": format!("i=0; while [ $i -lt {lines} ]; do echo \"line $i of the build log, nothing of note here\"; i=$((i+1)); done")}}]})
}

#[test]
fn summary_lines_of_the_cassette_answer_the_compaction_calls() {
    if !docker_available() {
        return;
    }
    let summary = "GOAL: write the notes. DONE: read the build log. FINDINGS: nothing of note (cassette summary).";
    let mut lines: Vec<Value> = (0..6).map(|i| large_output(40 + i)).collect();
    lines.push(json!({"text": "Done."}));
    // Summary lines are routed to summary calls whatever their place in the file.
    lines.insert(1, json!({"call": "summary", "text": summary}));
    lines.insert(4, json!({"call": "summary", "text": summary}));
    let case = Case::new(&lines);
    let result = case.run_expecting(&["--context-window", SMALL_WINDOW], 0, "completed");
    let events = case.events(&result);
    let purposes: Vec<&Value> = of_kind(&events, "model_called")
        .iter()
        .map(|e| &e["payload"]["purpose"])
        .collect();
    assert!(purposes.contains(&&json!("summary")), "{purposes:?}");
    assert_eq!(
        purposes.iter().filter(|p| **p == "agent").count(),
        7,
        "every agent line answered an agent call: {purposes:?}"
    );
    let summarised = of_kind(&events, "compaction")
        .into_iter()
        .filter(|e| e["payload"]["strategy"] == "summarize")
        .collect::<Vec<_>>();
    assert!(!summarised.is_empty(), "{events:?}");
    assert!(
        summarised
            .iter()
            .any(|e| e["payload"].to_string().contains("cassette summary")),
        "{summarised:?}"
    );
}

#[test]
fn the_agent_compresses_its_context_with_the_tool() {
    if !docker_available() {
        return;
    }
    let config = format!("{PRICED}\n[compaction]\nagent_controlled = true\n");
    let case = Case::with_config(
        &[
            large_output(30),
            large_output(31),
            large_output(32),
            large_output(33),
            large_output(34),
            large_output(35),
            json!({"text": "The logs are read; compress them.", "tool_calls": [{"name": "compress_context", "arguments": {"reason": "the build logs are read", "strategy": "archive"}}]}),
            json!({"text": "Done."}),
        ],
        &config,
    );
    let result = case.run_expecting(&["--context-window", "20000"], 0, "completed");
    let events = case.events(&result);
    let answered = events
        .iter()
        .find(|e| {
            e["kind"] == "tool_call_finished"
                && e["payload"]["result"]["name"] == "compress_context"
        })
        .unwrap_or_else(|| panic!("no compress_context result: {events:?}"));
    assert_eq!(
        answered["payload"]["result"]["is_error"], false,
        "{answered}"
    );
    assert!(
        !of_kind(&events, "compaction").is_empty(),
        "the tool compacted nothing: {events:?}"
    );
    assert!(result["compactions"].as_u64().unwrap() >= 1, "{result}");
}

#[test]
fn complexity_picks_the_loop_of_auto() {
    if !docker_available() {
        return;
    }
    let case = Case::new(&[json!({"text": "Done."})]);
    let result = case.run_expecting(
        &["--loop", "auto", "--complexity", "simple"],
        0,
        "completed",
    );
    let started = &case.events(&result)[0]["payload"];
    assert_eq!(started["loop_type"], "react", "{started}");
    assert_eq!(started["config"]["complexity"], "simple", "{started}");
    assert_eq!(started["config"]["requested_loop"], "auto", "{started}");
    let bad = case.run(&["--complexity", "huge"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

#[test]
fn the_image_flag_names_the_sandbox_image() {
    if !docker_available() {
        return;
    }
    // A tag of our own on the default image, removed at the end (only the tag).
    let tag = format!("nerve-e2e-image:{}", std::process::id());
    docker_cli(&["tag", nerve_hands::DEFAULT_IMAGE, &tag]);
    struct Untag(String);
    impl Drop for Untag {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rmi", &self.0]).output();
        }
    }
    let _untag = Untag(tag.clone());
    let case = Case::new(&[
        json!({"text": "Where am I?", "tool_calls": [{"name": "shell", "arguments": {"command": "echo inside > where.txt"}}]}),
        json!({"text": "Done."}),
    ]);
    let result = case.run_expecting(&["--image", &tag], 0, "completed");
    let started = &case.events(&result)[0]["payload"];
    assert_eq!(started["config"]["image"], json!(tag), "{started}");
    assert_eq!(
        std::fs::read_to_string(case.workspace.join("where.txt")).unwrap(),
        "inside\n"
    );

    // An image that is not there is never pulled: one line, exit 2, nothing written.
    let missing = Case::new(&[json!({"text": "never"})]);
    let output = missing.run(&["--image", "nerve-e2e-missing:none"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(
        stderr(&output).contains("nerve-e2e-missing:none"),
        "{}",
        stderr(&output)
    );
    assert!(crate::support::read_log(&missing.db).is_empty());
}

#[test]
fn approve_deny_tells_the_model_and_the_call_never_runs() {
    if !docker_available() {
        return;
    }
    let config = format!(
        "{PRICED}\n[policy]\nrules = [{{ tool = \"write_file\", pattern = \"secret\\\\.txt\", action = \"ask\" }}]\n"
    );
    let case = Case::with_config(
        &[
            write("secret.txt", "leak\n"),
            json!({"text": "Understood, I will not write it."}),
        ],
        &config,
    );
    let parked = case.run_expecting(&[], 1, "parked");
    let id = parked["execution_id"].as_str().unwrap();
    let denied = nerve(
        &case.db,
        &["approve", id, "--deny", "--reason", "no secrets here"],
    );
    assert!(denied.status.success(), "{}", stderr(&denied));
    assert!(
        String::from_utf8_lossy(&denied.stdout).contains("denied write_file call"),
        "{}",
        String::from_utf8_lossy(&denied.stdout)
    );
    let resumed = nerve(
        &case.db,
        &[
            "--config",
            case.config.to_str().unwrap(),
            "resume",
            id,
            "--json",
        ],
    );
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(last_json(&resumed)["termination_reason"], "completed");
    assert!(
        !case.workspace.join("secret.txt").exists(),
        "a denied call ran"
    );
    let events = case.events(&parked);
    let decided = of_kind(&events, "approval_decided");
    let by_user: Vec<_> = decided
        .iter()
        .filter(|e| e["payload"]["decided_by"] == "user")
        .collect();
    assert_eq!(by_user.len(), 1, "{decided:?}");
    assert_eq!(by_user[0]["payload"]["decision"], "denied");
    let result = events
        .iter()
        .find(|e| {
            e["kind"] == "tool_call_finished" && e["payload"]["result"]["name"] == "write_file"
        })
        .unwrap_or_else(|| panic!("the model was not told: {events:?}"));
    assert_eq!(result["payload"]["result"]["is_error"], true, "{result}");
    assert!(
        result["payload"]["result"]["content"]
            .as_str()
            .unwrap()
            .contains("no secrets here"),
        "{result}"
    );
    verify(&case.db, id);
}

/// Runs `nerve <args>` with only `env` deciding where the log and the config are (no --db,
/// no --config, no inherited NERVE_*, XDG_STATE_HOME or HOME).
fn nerve_located(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(nerve_bin());
    command
        .args(args)
        .env_remove("NERVE_DB")
        .env_remove("NERVE_CONFIG")
        .env_remove("XDG_STATE_HOME")
        .env_remove("HOME")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

#[test]
fn the_log_and_the_config_are_found_by_environment_and_xdg_default() {
    if !docker_available() {
        return;
    }
    let case = Case::new(&[json!({"text": "Done."})]);
    let run = |env: &[(&str, &Path)]| {
        let output = nerve_located(
            &[
                "run",
                "--workspace",
                case.workspace.to_str().unwrap(),
                "--task",
                "Write the notes.",
                "--provider",
                &case.provider,
                "--json",
            ],
            env,
        );
        assert!(output.status.success(), "{}", stderr(&output));
        last_json(&output)["execution_id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let listed = |env: &[(&str, &Path)]| -> Vec<String> {
        let output = nerve_located(&["list", "--json"], env);
        assert!(output.status.success(), "{}", stderr(&output));
        last_json(&output)
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["execution_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let home = case.dir.path().join("home");
    let state = case.dir.path().join("state");
    std::fs::create_dir_all(&home).unwrap();

    // NERVE_DB names the file.
    let named = case.dir.path().join("named.db");
    let id = run(&[("NERVE_DB", &named), ("HOME", &home)]);
    assert!(named.is_file());
    assert_eq!(listed(&[("NERVE_DB", &named), ("HOME", &home)]), [id]);

    // XDG_STATE_HOME: $XDG_STATE_HOME/nerve/nerve.db, its directory created.
    let id = run(&[("XDG_STATE_HOME", &state), ("HOME", &home)]);
    assert!(state.join("nerve/nerve.db").is_file());
    assert_eq!(listed(&[("XDG_STATE_HOME", &state), ("HOME", &home)]), [id]);

    // Without it: ~/.local/state/nerve/nerve.db.
    let id = run(&[("HOME", &home)]);
    assert!(home.join(".local/state/nerve/nerve.db").is_file());
    assert_eq!(listed(&[("HOME", &home)]), [id]);

    // --db wins over NERVE_DB.
    let output = nerve_located(
        &["--db", named.to_str().unwrap(), "list", "--json"],
        &[
            ("NERVE_DB", &case.dir.path().join("absent.db")),
            ("HOME", &home),
        ],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(last_json(&output).as_array().unwrap().len(), 1);

    // NERVE_CONFIG is read: a key it does not know is named, exit 2, nothing written.
    let bad = case.dir.path().join("bad.toml");
    std::fs::write(&bad, "[sandbox]\nimagee = \"x\"\n").unwrap();
    let fresh = case.dir.path().join("fresh.db");
    let output = nerve_located(
        &[
            "run",
            "--workspace",
            case.workspace.to_str().unwrap(),
            "--task",
            "x",
            "--provider",
            &case.provider,
        ],
        &[
            ("NERVE_CONFIG", &bad),
            ("NERVE_DB", &fresh),
            ("HOME", &home),
        ],
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("imagee"), "{}", stderr(&output));
    assert!(!fresh.exists());
    // ... and a good one is applied: its policy parks the run.
    let parking = case.dir.path().join("parking.toml");
    std::fs::write(&parking, "[policy]\ndefault = \"ask\"\n").unwrap();
    let writes = Case::new(&[write("a.txt", "a\n")]);
    let output = nerve_located(
        &[
            "run",
            "--workspace",
            writes.workspace.to_str().unwrap(),
            "--task",
            "x",
            "--provider",
            &writes.provider,
            "--json",
        ],
        &[
            ("NERVE_CONFIG", &parking),
            ("NERVE_DB", &fresh),
            ("HOME", &home),
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert_eq!(last_json(&output)["termination_reason"], "parked");
}
