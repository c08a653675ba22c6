//! `cargo xtask fuzz [--minutes N] [TARGET]`: runs the proptest fuzz targets with fresh
//! random seeds, pass after pass, until the time is up (split evenly between the targets),
//! and fails on the first failure or hang. Each target's test binary is built once, then
//! run directly from a copy (not through cargo, so that passes never wait on the build
//! lock, and a build beside them does not change what they run), in its package's
//! directory as `cargo test` would. At the end of each target a line gives its
//! passes, the cases run, the wall time and the CPU time its passes got (on a loaded
//! machine the CPU share is what says how much fuzzing was done).
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
}

const TARGETS: &[Target] = &[
    Target {
        short: "session",
        package: "nerve-session",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
    },
    Target {
        short: "brain",
        package: "nerve-brain",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
    },
    Target {
        short: "executor",
        package: "nerve-executor",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 2,
    },
    Target {
        short: "glob",
        package: "nerve-executor",
        binary: &["--lib"],
        filter: "glob::fuzz::",
        properties: 4,
    },
    Target {
        short: "proxy",
        package: "nerve-hands",
        binary: &["--test", "fuzz"],
        filter: "",
        properties: 3,
    },
    Target {
        short: "config",
        package: "nerve-cli",
        binary: &["--bin", "nerve"],
        filter: "config::fuzz::",
        properties: 3,
    },
];

/// Cases per property and pass: long enough that starting the test binary is noise, short
/// enough that the time budget is kept within a pass.
const CASES_PER_PASS: u32 = 2000;

/// A pass that takes longer than this is a hang (a pass takes seconds to a few minutes on
/// a loaded machine).
const HANG: Duration = Duration::from_secs(1800);

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
        let mut passes = 0u32;
        let mut cpu = Duration::ZERO;
        while started.elapsed() < budget {
            cpu += pass(target, &binary, &dir)?;
            passes += 1;
        }
        let wall = started.elapsed();
        eprintln!(
            "fuzz {}: {passes} passes, {} cases ({} properties x {CASES_PER_PASS} per pass), no failure; \
             {:.1} min wall, {:.1} min CPU ({:.0}% of one core)",
            target.short,
            u64::from(passes) * u64::from(target.properties) * u64::from(CASES_PER_PASS),
            target.properties,
            wall.as_secs_f64() / 60.0,
            cpu.as_secs_f64() / 60.0,
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64().max(f64::EPSILON)
        );
    }
    Ok(())
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

/// One pass of a target with a fresh seed; returns the CPU time it used.
fn pass(target: &Target, binary: &PathBuf, dir: &PathBuf) -> Result<Duration> {
    let mut command = Command::new(binary);
    command
        .current_dir(dir)
        .args(["--quiet", "--test-threads", "1"])
        .env("PROPTEST_CASES", CASES_PER_PASS.to_string())
        .stdout(Stdio::null());
    if !target.filter.is_empty() {
        command.arg(target.filter);
    }
    let before = children_cpu()?;
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot run {}", describe(&command)))?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!(
                    "`{}` failed ({status}); the failing case is kept in the package's proptest-regressions",
                    describe(&command)
                );
            }
            return Ok(children_cpu()?.saturating_sub(before));
        }
        if started.elapsed() > HANG {
            let _ = child.kill();
            bail!(
                "`{}` hung: no result after {} s",
                describe(&command),
                HANG.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// User and system CPU time of the children this process waited for (`cutime` and
/// `cstime` of /proc/self/stat, in the kernel's USER_HZ, 100 on Linux).
fn children_cpu() -> Result<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("cannot read /proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // cutime and cstime are fields 16 and 17 of the line: 13 and 14 counting from `state`.
    let ticks = |index: usize| -> Result<u64> {
        fields
            .get(index)
            .and_then(|f| f.parse().ok())
            .context("an unexpected /proc/self/stat")
    };
    Ok(Duration::from_millis((ticks(13)? + ticks(14)?) * 10))
}
