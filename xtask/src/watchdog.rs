//! `cargo test` under a watchdog, for `cargo xtask ci`, `test-sandbox` and `test-real`: a
//! test binary that runs past a generous limit, or one test past its own, is killed (cargo,
//! the test binary and whatever they started, as one process group) and the run fails,
//! naming the binary and the tests still running. Without it a hang is a CI that never
//! ends, and says nothing about where.
//!
//! Why around `cargo test` rather than `cargo nextest`: nextest runs every test in a
//! process of its own, and the end-to-end binary shares fixtures between its tests (the
//! Python image and MCP servers built once in a `OnceLock`, the kill-points baseline, the
//! mutexes that keep the real-server tests and the proxy fuzz target one at a time); under
//! nextest each test would rebuild or race them. Here the binaries run as they always do
//! and the watchdog only reads what libtest prints: cargo's `Running …` / `Doc-tests …`
//! line starts a binary, `test result:` ends it, `test NAME ... ok` ends a test, and
//! libtest's own `test NAME has been running for over 60 seconds` says which tests are
//! slow (single-threaded, libtest prints `test NAME ... ` before the test runs: the open
//! line names it).
//!
//! Limits: `NERVE_TEST_BINARY_LIMIT_SECS` (default 3,000 s, about twice the longest binary,
//! the end-to-end one, on a loaded machine) and `NERVE_TEST_LIMIT_SECS` (default 900 s for
//! one test).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::describe;

/// libtest's own threshold for calling a test slow.
const LIBTEST_WARNS_AFTER: Duration = Duration::from_secs(60);

/// How long the output may still come after the process group was killed or cargo exited
/// (a descendant that left the group may hold the pipes open).
const DRAIN: Duration = Duration::from_secs(10);

/// How long a test binary, and one test, may run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) binary: Duration,
    pub(crate) test: Duration,
}

impl Limits {
    /// The limits the environment sets, else the defaults.
    pub(crate) fn from_env() -> Result<Self> {
        let seconds = |var: &str, default: u64| -> Result<Duration> {
            match std::env::var(var) {
                Ok(value) => value
                    .parse()
                    .ok()
                    .filter(|s: &u64| *s > 0)
                    .map(Duration::from_secs)
                    .with_context(|| format!("{var}={value} is not a positive number of seconds")),
                Err(_) => Ok(Duration::from_secs(default)),
            }
        };
        Ok(Self {
            binary: seconds("NERVE_TEST_BINARY_LIMIT_SECS", 3_000)?,
            test: seconds("NERVE_TEST_LIMIT_SECS", 900)?,
        })
    }
}

/// What the readers pass on.
enum Output {
    /// A whole line of stdout, or of stderr.
    Out(String),
    Err(String),
    /// The line stdout holds so far without its end.
    OpenOut(String),
    /// One stream ended.
    Closed,
}

/// What the watchdog knows of the run.
#[derive(Default)]
struct Progress {
    /// The binary running and when it started.
    binary: Option<(String, Instant)>,
    /// Tests libtest called slow, with when they started at the latest.
    slow: BTreeMap<String, Instant>,
    /// Stdout's line so far (single-threaded libtest: the test running).
    open: String,
}

impl Progress {
    fn line(&mut self, line: &str, from_stderr: bool, now: Instant) {
        let trimmed = line.trim();
        if from_stderr {
            if let Some(binary) = trimmed
                .strip_prefix("Running ")
                .or_else(|| trimmed.strip_prefix("Doc-tests "))
            {
                self.binary = Some((binary.to_owned(), now));
                self.slow.clear();
            }
            return;
        }
        self.open.clear();
        if trimmed.starts_with("test result:") {
            self.binary = None;
            self.slow.clear();
        } else if let Some(rest) = trimmed.strip_prefix("test ") {
            if let Some(name) = rest.strip_suffix(" has been running for over 60 seconds") {
                let started = now.checked_sub(LIBTEST_WARNS_AFTER).unwrap_or(now);
                self.slow.insert(name.to_owned(), started);
            } else if let Some((name, _)) = rest.split_once(" ... ") {
                self.slow.remove(name);
            }
        }
    }

    /// Why the run must stop now, if it must.
    fn overdue(&self, limits: Limits, now: Instant) -> Option<String> {
        let (binary, started) = self.binary.as_ref()?;
        let running = self.running(now);
        let ran = now.duration_since(*started);
        if ran > limits.binary {
            return Some(format!(
                "test binary {binary} ran past its limit of {} s; {running}",
                limits.binary.as_secs()
            ));
        }
        let (name, since) = self.slow.iter().min_by_key(|(_, since)| **since)?;
        (now.duration_since(*since) > limits.test).then(|| {
            format!(
                "test {name} (in {binary}) ran past its limit of {} s; {running}",
                limits.test.as_secs()
            )
        })
    }

    /// The tests still running, as a sentence.
    fn running(&self, now: Instant) -> String {
        let mut names: Vec<String> = self
            .slow
            .iter()
            .map(|(name, since)| {
                format!("{name} (over {} s)", now.duration_since(*since).as_secs())
            })
            .collect();
        if let Some(open) = self
            .open
            .trim()
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ..."))
        {
            names.push(open.to_owned());
        }
        if names.is_empty() {
            "no test was running for over 60 s (the binary's set-up, or tests started in the last minute)".to_owned()
        } else {
            format!("still running: {}", names.join(", "))
        }
    }
}

/// Runs `command` (a `cargo test`) with its output passed through, and fails it when a
/// test binary or a test runs past `limits`.
pub(crate) fn run_tests(command: &mut Command, limits: Limits) -> Result<()> {
    eprintln!(
        "$ {} (limits: {} s a test binary, {} s a test)",
        describe(command),
        limits.binary.as_secs(),
        limits.test.as_secs()
    );
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: killed as one, the test binary and what it started too.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {}", describe(command)))?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().context("no stdout pipe")?;
    let stderr = child.stderr.take().context("no stderr pipe")?;
    let out = tx.clone();
    std::thread::spawn(move || pass_on(stdout, std::io::stdout(), false, &out));
    std::thread::spawn(move || pass_on(stderr, std::io::stderr(), true, &tx));
    let mut progress = Progress::default();
    let mut open_streams = 2;
    let mut verdict = None;
    let mut exited = None;
    let mut last_word = None;
    // Ends: the process group is killed once a limit is past (so the streams close and
    // cargo exits), and after cargo exited or the kill the output is read for at most DRAIN.
    loop {
        let now = Instant::now();
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Output::Out(line)) => progress.line(&line, false, now),
            Ok(Output::Err(line)) => progress.line(&line, true, now),
            Ok(Output::OpenOut(line)) => progress.open = line,
            Ok(Output::Closed) => open_streams -= 1,
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
        if exited.is_none() {
            exited = child.try_wait()?;
            if exited.is_some() {
                last_word = Some(Instant::now() + DRAIN);
            }
        }
        if verdict.is_none()
            && exited.is_none()
            && let Some(why) = progress.overdue(limits, Instant::now())
        {
            kill_group(child.id());
            verdict = Some(why);
            exited = Some(child.wait()?);
            last_word = Some(Instant::now() + DRAIN);
        }
        let drained = open_streams == 0 || last_word.is_some_and(|at| Instant::now() >= at);
        if let (Some(status), true) = (exited, drained) {
            if let Some(why) = verdict {
                bail!("`{}` stopped by the watchdog: {why}", describe(command));
            }
            if !status.success() {
                bail!("`{}` failed ({status})", describe(command));
            }
            return Ok(());
        }
    }
}

/// Copies `from` to `to` as it comes, and tells `tx` the lines (and stdout's open line).
fn pass_on(mut from: impl Read, mut to: impl Write, stderr: bool, tx: &mpsc::Sender<Output>) {
    let mut buffer = [0_u8; 8192];
    let mut line = Vec::new();
    // Ends: each read either ends the stream (0 bytes, an error) or consumes what it read.
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let _ = to.write_all(&buffer[..n]);
        let _ = to.flush();
        for &byte in &buffer[..n] {
            if byte == b'\n' {
                let text = String::from_utf8_lossy(&line).into_owned();
                let _ = tx.send(if stderr {
                    Output::Err(text)
                } else {
                    Output::Out(text)
                });
                line.clear();
            } else {
                line.push(byte);
            }
        }
        if !stderr && !line.is_empty() {
            let _ = tx.send(Output::OpenOut(String::from_utf8_lossy(&line).into_owned()));
        }
    }
    let _ = tx.send(Output::Closed);
}

/// SIGKILL to the process group led by `pid`.
fn kill_group(pid: u32) {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    if let Err(error) = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL) {
        eprintln!("watchdog: cannot kill process group {pid:?}: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(lines: &[(&str, bool)], open: &str, after: Duration, expected: Option<&str>) {
        let start = Instant::now();
        let mut progress = Progress::default();
        for (line, stderr) in lines {
            progress.line(line, *stderr, start);
        }
        progress.open = open.to_owned();
        let limits = Limits {
            binary: Duration::from_secs(600),
            test: Duration::from_secs(300),
        };
        assert_eq!(progress.overdue(limits, start + after).as_deref(), expected);
    }

    #[test]
    fn a_slow_test_past_its_limit_is_named() {
        let lines = [
            (
                "     Running tests/e2e/main.rs (target/debug/deps/e2e-1)",
                true,
            ),
            ("test a ... ok", false),
            ("test hangs has been running for over 60 seconds", false),
            ("test slow has been running for over 60 seconds", false),
            ("test slow ... ok", false),
        ];
        check(&lines, "", Duration::from_secs(200), None);
        check(
            &lines,
            "",
            Duration::from_secs(250),
            Some(
                "test hangs (in tests/e2e/main.rs (target/debug/deps/e2e-1)) ran past its limit of 300 s; still running: hangs (over 310 s)",
            ),
        );
    }

    #[test]
    fn a_binary_past_its_limit_names_the_open_test() {
        let lines = [("   Doc-tests nerve_core", true), ("", false)];
        check(
            &lines,
            "test src/lib.rs - f (line 3) ... ",
            Duration::from_secs(601),
            Some(
                "test binary nerve_core ran past its limit of 600 s; still running: src/lib.rs - f (line 3)",
            ),
        );
        // A finished binary is not watched.
        let done = [
            ("     Running unittests src/lib.rs (x)", true),
            ("test result: ok. 1 passed", false),
        ];
        check(&done, "", Duration::from_secs(10_000), None);
    }
}
