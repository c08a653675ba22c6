//! `cargo xtask fuzz [--minutes N] [TARGET]`: runs the proptest fuzz targets with fresh
//! random seeds, pass after pass, until the time is up (split evenly between the targets),
//! and fails on the first failure or hang. Each target's test binary is built once, then
//! run directly from a copy (not through cargo, so that passes never wait on the build
//! lock, and a build beside them does not change what they run), in its package's
//! directory as `cargo test` would. At the end of each target a line gives its
//! passes, the cases run, the wall time and the CPU time its passes got (on a loaded
//! machine the CPU share is what says how much fuzzing was done). The pass running when the
//! time is up is stopped and its cases are not counted; a hang is judged by CPU time (a
//! pass that computes for half an hour), not by wall time, which a niced pass on a loaded
//! machine spends mostly waiting.
//!
//! Each pass draws a random `PROPTEST_RNG_SEED` (proptest's own default would be random
//! too, but unnamed): a failing or hung pass names its seed and the command that replays
//! it. Cases run under proptest's `timeout` (a child process per property, a case over
//! [`CASE_TIMEOUT_MS`] fails), so a hang is a failing case with a seed, not a stuck pass.
//!
//! Proptest keeps every failing case in the package's `proptest-regressions/` (or next to
//! an integration test), where every later run (and `cargo test`) replays it first: commit
//! those files as regression tests. An ordinary `cargo test --workspace` (so CI) runs each
//! target once, 256 cases.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, describe};

/// A fuzz target: its short name, package, the cargo arguments that select its test
/// binary, the test name filter inside it, and how many properties it holds.
struct Target {
    short: &'static str,
    package: &'static str,
    binary: &'static [&'static str],
    filter: &'static str,
    properties: u32,
    /// Cases per property and pass.
    cases: u32,
}

const TARGETS: &[Target] = &[
    Target {
        short: "session",
        package: "nerve-session",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
        cases: CASES_PER_PASS,
    },
    Target {
        short: "brain",
        package: "nerve-brain",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
        cases: CASES_PER_PASS,
    },
    Target {
        short: "executor",
        package: "nerve-executor",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
        cases: CASES_PER_PASS,
    },
    Target {
        short: "glob",
        package: "nerve-executor",
        binary: &["--lib"],
        filter: "glob::fuzz::",
        properties: 4,
        cases: CASES_PER_PASS,
    },
    Target {
        short: "proxy",
        package: "nerve-hands",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 3,
        cases: CASES_PER_PASS,
    },
    Target {
        short: "config",
        package: "nerve-runtime",
        binary: &["--lib"],
        filter: "config::fuzz::",
        properties: 3,
        cases: CASES_PER_PASS,
    },
    // The agent as a whole (brain's tests/engine_fuzz.rs): a case is a whole execution.
    Target {
        short: "engine",
        package: "nerve-brain",
        binary: &["--lib"],
        filter: "engine_fuzz::",
        properties: 1,
        cases: 200,
    },
    // The compaction invariants over random runs (whose hang CI once passed by luck).
    Target {
        short: "compaction",
        package: "nerve-brain",
        binary: &["--lib"],
        filter: "compaction_invariants",
        properties: 1,
        cases: 200,
    },
];

/// A case that runs longer than this (milliseconds) fails, as in `cargo test` (see
/// `.cargo/config.toml`, which a binary run directly does not read).
const CASE_TIMEOUT_MS: &str = "60000";

/// Cases per property and pass of the quick targets: long enough that starting the test binary is noise, short
/// enough that the time budget is kept within a pass.
const CASES_PER_PASS: u32 = 2000;

/// A pass that used more CPU time than this is a hang (a pass takes seconds to a few
/// minutes of CPU). CPU time, not wall time: on a loaded machine a niced pass may wait for
/// the CPU far longer than it computes.
const HANG_CPU: Duration = Duration::from_secs(1800);

/// A pass that ran this long without its CPU time growing is stuck (a deadlock).
const STUCK: Duration = Duration::from_secs(3600);

pub(crate) fn fuzz(args: &[String]) -> Result<()> {
    let mut minutes = 1.0_f64;
    let mut only = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--minutes" => {
                let value = rest.next().context("--minutes needs a number")?;
                minutes = value
                    .parse()
                    .ok()
                    .filter(|m: &f64| m.is_finite() && *m > 0.0)
                    .with_context(|| format!("--minutes {value} is not a positive number"))?;
            }
            name => match TARGETS.iter().find(|t| t.short == name) {
                Some(target) => only = Some(target),
                None => bail!(
                    "unknown fuzz target `{name}` (targets: {})",
                    TARGETS
                        .iter()
                        .map(|t| t.short)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        }
    }
    let targets: Vec<&Target> = only.map_or_else(|| TARGETS.iter().collect(), |t| vec![t]);
    let budget = Duration::from_secs_f64(minutes * 60.0 / targets.len() as f64);
    for target in targets {
        // Built once, outside the time budget.
        let (binary, dir) = build(target)?;
        let started = Instant::now();
        let deadline = started + budget;
        let mut passes = 0u32;
        let mut cpu = Duration::ZERO;
        let mut cut = None;
        while Instant::now() < deadline {
            match pass(target, &binary, &dir, deadline)? {
                Pass::Done(used) => {
                    cpu += used;
                    passes += 1;
                }
                Pass::Cut(used) => {
                    cpu += used;
                    cut = Some(used);
                }
            }
        }
        let wall = started.elapsed();
        let unfinished = cut.map_or_else(String::new, |used| {
            format!(
                " (a pass cut off by the time limit after {:.0} s of CPU, its cases not counted)",
                used.as_secs_f64()
            )
        });
        eprintln!(
            "fuzz {}: {passes} passes, {} cases ({} properties x {} per pass), no failure{unfinished}; \
             {:.1} min wall, {:.1} min CPU ({:.1}% of one core)",
            target.short,
            u64::from(passes) * u64::from(target.properties) * u64::from(target.cases),
            target.properties,
            target.cases,
            wall.as_secs_f64() / 60.0,
            cpu.as_secs_f64() / 60.0,
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64().max(f64::EPSILON)
        );
    }
    Ok(())
}

/// How a pass ended.
enum Pass {
    /// Every case ran, none failed; the CPU time it used.
    Done(Duration),
    /// The time was up first: stopped, its CPU time so far.
    Cut(Duration),
}

/// Builds a target's test binary; returns it and its package's directory.
fn build(target: &Target) -> Result<(PathBuf, PathBuf)> {
    let mut command = cargo();
    command
        .args(["test", "--package", target.package, "--no-run"])
        .args(target.binary)
        .args(["--message-format", "json"])
        .stdout(Stdio::piped());
    eprintln!("$ {}", describe(&command));
    let output = command
        .output()
        .with_context(|| format!("cannot run {}", describe(&command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({})", describe(&command), output.status);
    }
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let executable = message["executable"].as_str();
        let manifest = message["manifest_path"].as_str();
        let name = message["target"]["name"].as_str();
        let wanted = match target.binary {
            ["--test", name] | ["--bin", name] => Some(*name),
            _ => None,
        };
        let lib = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "lib"));
        let matches = match wanted {
            Some(wanted) => name == Some(wanted),
            None => lib,
        };
        if let (Some(executable), Some(manifest), true) = (executable, manifest, matches)
            && message["profile"]["test"] == true
        {
            let dir = PathBuf::from(manifest)
                .parent()
                .context("a manifest path without a directory")?
                .to_path_buf();
            // A copy of its own: a build beside the run (same path, new sources) must not
            // change the binary between passes.
            let executable = PathBuf::from(executable);
            let copy = executable
                .parent()
                .context("an executable path without a directory")?
                .join(format!("fuzz-{}", target.short));
            std::fs::copy(&executable, &copy)
                .with_context(|| format!("cannot copy {}", executable.display()))?;
            return Ok((copy, dir));
        }
    }
    bail!("`{}` named no test binary", describe(&command))
}

/// One pass of a target with a fresh seed, stopped at `deadline`.
fn pass(target: &Target, binary: &PathBuf, dir: &PathBuf, deadline: Instant) -> Result<Pass> {
    let seed = random_seed();
    let replay = format!(
        "PROPTEST_RNG_SEED={seed} PROPTEST_CASES={} cargo test --package {} {} -- {}",
        target.cases,
        target.package,
        target.binary.join(" "),
        target.filter
    );
    let output = binary.with_extension("out");
    let mut command = Command::new(binary);
    command
        .current_dir(dir)
        .args(["--quiet", "--test-threads", "1"])
        .env("PROPTEST_CASES", target.cases.to_string())
        .env("PROPTEST_RNG_SEED", seed.to_string())
        .env("PROPTEST_TIMEOUT", CASE_TIMEOUT_MS)
        .env("PROPTEST_MAX_SHRINK_TIME", CASE_TIMEOUT_MS)
        // The test harness's output, shown when the pass failed (a pass's dots say nothing).
        .stdout(Stdio::from(std::fs::File::create(&output).with_context(
            || format!("cannot create {}", output.display()),
        )?));
    if !target.filter.is_empty() {
        command.arg(target.filter);
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", describe(&command)))?;
    let mut used = Duration::ZERO;
    let mut progressed = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                eprint!("{}", std::fs::read_to_string(&output).unwrap_or_default());
                bail!(
                    "`{}` failed ({status}); the failing case is kept in the package's proptest-regressions; the pass again: {replay}",
                    describe(&command)
                );
            }
            return Ok(Pass::Done(used));
        }
        // The running pass's CPU time, its threads and its processes included: under
        // proptest's timeout each property runs in a child process of the pass.
        if let Ok(now) = tree_cpu(child.id()) {
            if now > used {
                progressed = Instant::now();
            }
            used = used.max(now);
        }
        let stop = |child: &mut std::process::Child| {
            let _ = child.kill();
            let _ = child.wait();
        };
        if used > HANG_CPU {
            stop(&mut child);
            bail!(
                "`{}` hung: {} s of CPU without a result; the pass again: {replay}",
                describe(&command),
                used.as_secs()
            );
        }
        if progressed.elapsed() > STUCK {
            stop(&mut child);
            bail!(
                "`{}` is stuck: no CPU used for {} s; the pass again: {replay}",
                describe(&command),
                STUCK.as_secs()
            );
        }
        if Instant::now() >= deadline {
            stop(&mut child);
            return Ok(Pass::Cut(used));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A fresh seed for a pass: the standard library's per-process random hash keys, mixed
/// with the clock (no RNG crate for one number).
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

/// The CPU time of process `pid` and its descendants: its own, its reaped children's
/// (`cutime`, `cstime`), and each live child's, recursively.
fn tree_cpu(pid: u32) -> Result<Duration> {
    let own = process_cpu(&format!("/proc/{pid}/stat"), 11)?
        + process_cpu(&format!("/proc/{pid}/stat"), 13)?;
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    // Ends: the process tree is finite (a child that exits meanwhile is skipped).
    Ok(children
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .filter_map(|child| tree_cpu(child).ok())
        .fold(own, |sum, cpu| sum + cpu))
}

/// User and system CPU time from a `/proc/PID/stat` file: the fields at `index` and
/// `index + 1`, counting from the one after the command name (`state` is 0: `utime` and
/// `stime` are 11 and 12), in the kernel's USER_HZ, 100 on Linux.
fn process_cpu(path: &str, index: usize) -> Result<Duration> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    // The command name is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("an unexpected {path}"))
    };
    Ok(Duration::from_millis(
        (ticks(index)? + ticks(index + 1)?) * 10,
    ))
}
