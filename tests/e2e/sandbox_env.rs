//! The sandbox's environment through the `nerve` binary: the `[sandbox]` limits of the
//! config reach the container and are named when a command runs into one, and the
//! executor dies with its host.
//!
//! Bounds on time are liveness bounds (generous), never timing assertions.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{docker_cli, events_json, last_json, nerve_bin, sandbox_available, stderr};

const LIVENESS: Duration = Duration::from_secs(120);

/// Writes a cassette of `lines` and returns the `--provider` spec for it.
pub(crate) fn cassette(dir: &Path, name: &str, lines: &[Value]) -> String {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    format!("script:{}", path.display())
}

fn nerve_run(dir: &Path, provider: &str, config: Option<&Path>) -> Command {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let mut command = Command::new(nerve_bin());
    command.arg("--db").arg(dir.join("nerve.db"));
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command
        .args(["run", "--workspace"])
        .arg(&workspace)
        .args([
            "--task",
            "use the sandbox",
            "--provider",
            provider,
            "--json",
        ])
        .env_remove("NERVE_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    command
}

#[test]
fn the_configured_memory_limit_holds_and_is_named_when_reached() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[sandbox]\nmemory = \"256MiB\"\npids = 64\n").unwrap();
    let provider = cassette(
        dir.path(),
        "oom.jsonl",
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "dd if=/dev/zero of=/dev/null bs=300M count=1"}}]}),
            json!({"text": "It ran out of memory."}),
        ],
    );
    let run = nerve_run(dir.path(), &provider, Some(&config))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let id = last_json(&run)["execution_id"].as_str().unwrap().to_owned();
    let events = serde_json::to_string(&events_json(&dir.path().join("nerve.db"), &id)).unwrap();
    assert!(
        events.contains("[killed: memory limit (256 MiB) reached]"),
        "{events}"
    );
}

#[test]
fn a_bad_limit_in_the_config_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[sandbox]\nmemory = \"lots\"\n").unwrap();
    let provider = cassette(dir.path(), "never.jsonl", &[json!({"text": "never"})]);
    let run = nerve_run(dir.path(), &provider, Some(&config))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let err = stderr(&run);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("sandbox.memory: `lots` is not a size"),
        "{err}"
    );
    assert!(!dir.path().join("nerve.db").exists(), "the log was written");
}

#[test]
fn the_sandbox_stops_at_once_when_nerve_is_killed_mid_command() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let provider = cassette(
        dir.path(),
        "slow.jsonl",
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 300", "timeout_secs": 600}}]}),
        ],
    );
    let mut child = nerve_run(dir.path(), &provider, None)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    // The container of this process, once `sleep 300` runs in it.
    let container = loop {
        let ours = docker_cli(&[
            "ps",
            "--filter",
            "label=org.nerve.managed=true",
            "--format",
            "{{.ID}} {{.Label \"org.nerve.owner\"}}",
        ]);
        let id = ours
            .lines()
            .filter(|line| line.contains(&format!(":{pid}:")))
            .find_map(|line| line.split_whitespace().next().map(str::to_owned));
        if let Some(id) = id
            && docker_cli(&["top", &id]).contains("sleep 300")
        {
            break id;
        }
        assert!(
            started.elapsed() < LIVENESS && child.try_wait().unwrap().is_none(),
            "nerve run never ran `sleep 300` in a sandbox"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().unwrap(); // SIGKILL: nerve cannot clean up.
    child.wait().unwrap();
    let killed = Instant::now();
    loop {
        // Stopped, or already removed by the reaper of a `nerve` started meanwhile.
        let running = docker_cli(&[
            "ps",
            "-q",
            "--no-trunc",
            "--filter",
            &format!("id={container}"),
            "--filter",
            "status=running",
        ]);
        if running.trim().is_empty() {
            break;
        }
        assert!(
            killed.elapsed() < LIVENESS,
            "the sandbox still runs {:?} after nerve was killed",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "the sandbox stopped {:?} after nerve was killed",
        killed.elapsed()
    );
    // The orphan is the reaper's (at the next start); remove it here.
    let _ = Command::new("docker")
        .args(["rm", "-f", &container])
        .output();
}

#[test]
fn a_missing_user_image_is_one_line_that_says_what_to_do_and_nothing_is_written() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let provider = cassette(dir.path(), "never.jsonl", &[json!({"text": "never"})]);
    let run = nerve_run(dir.path(), &provider, None)
        .args(["--image", "nerve-test-no-such-image:1"])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let err = stderr(&run);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("`nerve-test-no-such-image:1` not found") && err.contains("never pulls"),
        "{err}"
    );
    assert!(!err.contains("xtask"), "{err}");
    assert!(!dir.path().join("nerve.db").exists(), "the log was written");
}
