//! End-to-end tests of the `nerve-executor` binary: spawned on a temp-dir root and driven over
//! stdin/stdout exactly as the host drives it, one JSON line at a time.
//!
//! Every wait is bounded by a watchdog ([`WATCHDOG`]), so a regression that would hang (a
//! timeout that does not kill, a pipe held by an orphan, a FIFO opened for reading) fails the
//! test instead of stalling the suite.

// Helpers outside `#[test]` functions are not covered by clippy.toml's allow-in-tests; a
// panic is how a test helper fails.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use nerve_executor::{ExecOutput, decode_response};
use serde_json::{Value, json};

/// How long any single response (or the executor's exit) may take before the test fails.
const WATCHDOG: Duration = Duration::from_secs(20);

/// A running executor on a fresh workspace `ws`, next to a directory `outside` that holds
/// `secret.txt`. The workspace has symlinks that leave it in every way a path can.
struct Harness {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: u64,
    tmp: tempfile::TempDir,
}

impl Harness {
    fn start() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let ws = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), "TOPSECRET root\n").unwrap();
        std::os::unix::fs::symlink("/etc", ws.join("etc_link")).unwrap();
        std::os::unix::fs::symlink("../outside", ws.join("out_dir")).unwrap();
        std::os::unix::fs::symlink("../../outside/secret.txt", ws.join("sub/up")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret.txt"), ws.join("abs_file")).unwrap();

        let mut child = Command::new(env!("CARGO_BIN_EXE_nerve-executor"))
            .arg("--root")
            .arg(&ws)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
            next_id: 1,
            tmp,
        }
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("ws")
    }

    fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    /// Sends one raw line and returns the parsed response line.
    fn send_raw(&mut self, line: &str) -> Value {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
        let response = self
            .lines
            .recv_timeout(WATCHDOG)
            .unwrap_or_else(|e| panic!("no response to {line:.200} within {WATCHDOG:?}: {e}"));
        serde_json::from_str(&response).unwrap()
    }

    /// Sends `request` (an object without `id`) with a fresh id and checks the echo.
    fn request(&mut self, mut request: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        request["id"] = json!(id);
        let response = self.send_raw(&request.to_string());
        assert_eq!(response["id"], json!(id), "{response}");
        response
    }

    fn exec(&mut self, command: &str, timeout_ms: u64, max_output_bytes: u64) -> Value {
        self.request(json!({
            "op": "exec",
            "command": command,
            "timeout_ms": timeout_ms,
            "max_output_bytes": max_output_bytes,
        }))
    }

    /// Closes stdin and waits (bounded) for the executor to exit.
    fn finish(&mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                start.elapsed() < WATCHDOG,
                "the executor did not exit after EOF"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether `pid` is a live process: it has a `/proc` entry and is not a zombie.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .next()
        .unwrap();
    !matches!(state, "Z" | "X")
}

fn pids(stdout: &Value) -> Vec<u32> {
    stdout
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn ok(response: &Value) -> &Value {
    assert_eq!(response["ok"], json!(true), "{response}");
    response
}

fn error(response: &Value) -> &str {
    assert_eq!(response["ok"], json!(false), "{response}");
    response["error"].as_str().unwrap()
}

#[test]
fn ping_answers_with_the_version() {
    let mut executor = Harness::start();
    let response = executor.request(json!({"op": "ping"}));
    assert_eq!(ok(&response)["version"], json!(nerve_executor::VERSION));
}

#[test]
fn exec_happy_path_and_non_zero_exit() {
    let mut executor = Harness::start();
    let response = executor.exec("echo hi; echo err >&2; printf '\\377'", 10_000, 1000);
    assert_eq!(ok(&response)["exit_code"], json!(0));
    assert_eq!(response["stdout"], json!("hi\n\u{fffd}"));
    assert_eq!(response["stderr"], json!("err\n"));
    assert_eq!(response["timed_out"], json!(false));

    let line = executor.send_raw(r#"{"id":77,"op":"exec","command":"echo failing; exit 7","timeout_ms":10000,"max_output_bytes":100}"#);
    let decoded = decode_response::<ExecOutput>(&line.to_string()).unwrap();
    assert_eq!(decoded.id, Some(77));
    let output = decoded.result.unwrap();
    assert_eq!(
        (output.exit_code, output.signal, output.stdout.as_str()),
        (Some(7), None, "failing\n")
    );

    std::fs::create_dir_all(executor.root().join("sub/dir")).unwrap();
    let response = executor.request(json!({
        "op": "exec",
        "command": "echo \"$FOO\"; basename \"$(pwd)\"",
        "workdir": "/workspace/sub/dir",
        "env": {"FOO": "bar"},
        "timeout_ms": 10_000,
        "max_output_bytes": 100,
    }));
    assert_eq!(ok(&response)["stdout"], json!("bar\ndir\n"));
}

#[test]
fn timeout_kills_the_whole_group_including_grandchildren() {
    let mut executor = Harness::start();
    // The outer shell starts an inner shell that starts a sleep and then becomes one; both
    // report their pids before the deadline, which leaves them seconds for that on a loaded
    // machine (300 ms did not always).
    let command = "sh -c 'sleep 100 & echo $!; exec sleep 100' & echo $!; wait";
    let response = executor.exec(command, 3_000, 1000);
    assert_eq!(ok(&response)["timed_out"], json!(true), "{response}");
    assert_eq!(response["signal"], json!(9));
    let pids = pids(&response["stdout"]);
    assert_eq!(pids.len(), 2, "{response}");
    for pid in pids {
        assert!(!alive(pid), "pid {pid} survived the timeout");
        // Reaped, not just dead: the executor adopts and waits for its commands' orphans.
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} was left a zombie"
        );
    }
}

#[test]
fn background_jobs_do_not_hang_the_response() {
    let mut executor = Harness::start();
    let response = executor.exec("sleep 1000 & echo $!", 600_000, 1000);
    assert_eq!(ok(&response)["timed_out"], json!(false));
    assert_eq!(response["exit_code"], json!(0));
    for pid in pids(&response["stdout"]) {
        assert!(!alive(pid), "background job {pid} outlived its command");
    }
    // A process that left the group (and so survives the group kill) still holds the pipes,
    // yet the response comes. The command waits until the escape has happened.
    let command = "setsid sh -c 'echo $$ > pid; exec sleep 1000' & \
                   while [ ! -s pid ]; do sleep 0.01; done; cat pid";
    let response = executor.exec(command, 600_000, 1000);
    assert_eq!(ok(&response)["exit_code"], json!(0), "{response}");
    let escaped = pids(&response["stdout"]);
    assert_eq!(escaped.len(), 1);
    assert!(
        alive(escaped[0]),
        "the escaped process should still run until EOF"
    );
    // It is killed when the input ends.
    assert!(executor.finish().success());
    assert!(
        !alive(escaped[0]),
        "escaped process {} outlived the executor",
        escaped[0]
    );
}

#[test]
fn fifty_megabytes_of_output_are_capped_keeping_both_ends() {
    let mut executor = Harness::start();
    let command = "echo START; head -c 50000000 /dev/zero | tr '\\0' x; echo; echo END";
    let response = executor.exec(command, 120_000, 1000);
    let stdout = ok(&response)["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("START\nxxx"), "{stdout:.100}");
    assert!(stdout.ends_with("xxx\nEND\n"), "{stdout:.100}");
    assert!(
        stdout.contains("[... 49999011 bytes omitted ...]"),
        "{stdout}"
    );
    assert_eq!(
        response["stdout_omitted_bytes"],
        json!(6 + 50_000_000 + 1 + 4 - 1000)
    );
    assert_eq!(response["stderr_omitted_bytes"], json!(0));
    // The executor streamed it: its peak memory is nowhere near the output's size.
    let status = std::fs::read_to_string(format!("/proc/{}/status", executor.child.id())).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    assert!(peak_kb < 40 * 1024, "peak RSS {peak_kb} kB");
}

/// Paths that leave the workspace: lexically, absolutely, and through every kind of symlink.
const ESCAPES: &[&str] = &[
    "../outside/secret.txt",
    "/etc/passwd",
    "/workspace/../etc/passwd",
    "etc_link/passwd",
    "out_dir/secret.txt",
    "sub/up",
    "abs_file",
];

/// Directories outside the workspace, reached the same ways.
const DIR_ESCAPES: &[&str] = &["..", "/etc", "etc_link", "out_dir", "sub/../.."];

fn assert_refused(response: &Value, path: &str) {
    let message = error(response);
    let escaped = message == format!("path escapes the workspace: {path}");
    // Without openat2 every symlink is refused as such.
    let symlink = message == format!("cannot follow symlink in path: {path}");
    assert!(escaped || symlink, "{path}: {message}");
}

#[test]
fn confinement_refuses_escapes_for_every_file_op() {
    let mut executor = Harness::start();
    for &path in ESCAPES {
        let read = executor.request(json!({"op": "read_file", "path": path}));
        assert_refused(&read, path);
        let write = executor.request(json!({"op": "write_file", "path": path, "content": "pwned"}));
        assert_refused(&write, path);
        let edit = executor.request(
            json!({"op": "edit_file", "path": path, "old_text": "root", "new_text": "pwned"}),
        );
        assert_refused(&edit, path);
        let grep = executor.request(json!({"op": "grep", "pattern": "root", "path": path}));
        assert_refused(&grep, path);
    }
    for &path in DIR_ESCAPES {
        let list = executor.request(json!({"op": "list_dir", "path": path}));
        assert_refused(&list, path);
        let grep = executor.request(json!({"op": "grep", "pattern": "root", "path": path}));
        assert_refused(&grep, path);
        let write = executor.request(
            json!({"op": "write_file", "path": format!("{path}/new/x.txt"), "content": "x"}),
        );
        assert_refused(&write, &format!("{path}/new/x.txt"));
        let exec = executor.request(json!({
            "op": "exec", "command": "pwd", "workdir": path, "timeout_ms": 10_000, "max_output_bytes": 100,
        }));
        assert_refused(&exec, path);
    }
    // Searching the whole workspace does not follow the symlinks either.
    let grep = executor.request(json!({"op": "grep", "pattern": "TOPSECRET|root:"}));
    assert_eq!(ok(&grep)["matches"], json!([]));
    // Nothing outside was touched.
    assert_eq!(
        std::fs::read_to_string(executor.outside().join("secret.txt")).unwrap(),
        "TOPSECRET root\n"
    );
    assert_eq!(std::fs::read_dir(executor.outside()).unwrap().count(), 1);
    assert!(!Path::new("/etc/new").exists());
    // The symlinks are listed as what they are.
    let list = executor.request(json!({"op": "list_dir"}));
    assert_eq!(
        ok(&list)["entries"],
        json!([
            {"name": "abs_file", "kind": "symlink"},
            {"name": "etc_link", "kind": "symlink"},
            {"name": "out_dir", "kind": "symlink"},
            {"name": "sub", "kind": "dir"},
        ])
    );
}

#[test]
fn a_fifo_is_refused_without_hanging() {
    let mut executor = Harness::start();
    ok(&executor.exec("mkfifo pipe", 10_000, 1000));
    for request in [
        json!({"op": "read_file", "path": "pipe"}),
        json!({"op": "write_file", "path": "pipe", "content": "x"}),
        json!({"op": "edit_file", "path": "pipe", "old_text": "a", "new_text": "b"}),
        json!({"op": "grep", "pattern": "x", "path": "pipe"}),
    ] {
        let response = executor.request(request);
        assert_eq!(error(&response), "not a regular file (fifo): pipe");
    }
    let list = executor.request(json!({"op": "list_dir", "path": "pipe"}));
    assert_eq!(error(&list), "not a directory: pipe");
    let grep = executor.request(json!({"op": "grep", "pattern": "x"}));
    assert_eq!(ok(&grep)["matches"], json!([]));
}

#[test]
fn file_ops_round_trip_and_edit_counts_matches() {
    let mut executor = Harness::start();
    let write = executor.request(
        json!({"op": "write_file", "path": "/workspace/src/f.txt", "content": "a a a\nb\n"}),
    );
    assert_eq!(ok(&write)["created"], json!(true));
    let edit = executor
        .request(json!({"op": "edit_file", "path": "src/f.txt", "old_text": "a", "new_text": "c"}));
    assert_eq!(
        error(&edit),
        "old_text matches 3 times in src/f.txt; pass replace_all or give more context"
    );
    let edit = executor.request(
        json!({"op": "edit_file", "path": "src/f.txt", "old_text": "zzz", "new_text": "c"}),
    );
    assert_eq!(error(&edit), "old_text not found in src/f.txt");
    let edit = executor.request(
        json!({"op": "edit_file", "path": "src/f.txt", "old_text": "b\n", "new_text": "d\n"}),
    );
    assert_eq!(ok(&edit)["replacements"], json!(1));
    let edit = executor.request(
        json!({"op": "edit_file", "path": "src/f.txt", "old_text": "a", "new_text": "c", "replace_all": true}),
    );
    assert_eq!(ok(&edit)["replacements"], json!(3));
    let read = executor.request(json!({"op": "read_file", "path": "src/f.txt"}));
    assert_eq!(ok(&read)["content"], json!("c c c\nd\n"));
    let grep = executor.request(json!({"op": "grep", "pattern": "^d$", "glob": "*.txt"}));
    assert_eq!(ok(&grep)["matches"], json!(["src/f.txt:2:d"]));
    let list = executor.request(json!({"op": "list_dir", "path": "src"}));
    assert_eq!(
        ok(&list)["entries"],
        json!([{"name": "f.txt", "kind": "file", "size": 8}])
    );
}

#[test]
fn malformed_lines_get_errors_and_serving_continues() {
    let mut executor = Harness::start();
    let response = executor.send_raw("this is not json");
    assert_eq!(response["id"], Value::Null);
    assert!(
        error(&response).starts_with("malformed request: "),
        "{response}"
    );
    let response = executor.send_raw(r#"{"id":41,"op":"format_disk"}"#);
    assert_eq!(response["id"], json!(41));
    assert!(
        error(&response).contains("unknown variant `format_disk`"),
        "{response}"
    );
    let response = executor
        .send_raw(r#"{"id":42,"op":"exec","command":"true","timeout_ms":0,"max_output_bytes":1}"#);
    assert_eq!(
        error(&response),
        "invalid request: timeout_ms must be positive"
    );
    ok(&executor.request(json!({"op": "ping"})));
}

#[test]
fn eof_ends_the_executor() {
    let mut executor = Harness::start();
    ok(&executor.request(json!({"op": "ping"})));
    let status = executor.finish();
    assert!(status.success(), "{status}");
}
