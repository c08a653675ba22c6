//! `cargo xtask install-check` (by hand: not a step of `cargo xtask ci`, whose time it
//! would nearly double on a fresh machine): a `nerve` installed the way the README says carries its sandbox executor and
//! needs nothing of the checkout it was built from (issue 30).
//!
//! 1. The checkout's files (tracked and untracked, not ignored: what a fresh clone with the
//!    working tree's changes holds) are copied to a temporary directory outside the target
//!    directory.
//! 2. `cargo install --locked --path <copy>/crates/cli --root <root>` (debug by default, to
//!    keep it bounded; `cargo xtask install-check release` for the README's release build),
//!    in a target directory of its own, `<target dir>/install-check` (or
//!    `NERVE_INSTALL_CHECK_TARGET_DIR`), kept between runs so that a second run rebuilds
//!    only what changed.
//! 3. The copy is removed.
//! 4. `<root>/bin/nerve run` on the demo cassette, with no `NERVE_EXECUTOR` and an empty
//!    cache (`XDG_CACHE_HOME` in the temporary directory): it must complete, print no
//!    warning, and its `started` event must record the executor written into that cache
//!    (`config.sandbox_executor`), not the per-call fallback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// Runs the check; `release` installs the release build (what `cargo install` does without
/// `--debug`).
pub(crate) fn install_check(release: bool) -> Result<()> {
    // The default sandbox image the run needs (the executor built here is not passed on).
    crate::image(false)?;
    let scratch = std::env::temp_dir().join(format!("nerve-install-check-{}", std::process::id()));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .with_context(|| format!("cannot clear {}", scratch.display()))?;
    }
    let result = check_in(&scratch, release);
    // Containers are the run's own to remove; the scratch directory is ours.
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn check_in(scratch: &Path, release: bool) -> Result<()> {
    let checkout = scratch.join("checkout");
    let root = scratch.join("root");
    let cache = scratch.join("cache");
    copy_checkout(&checkout)?;
    crate::phase(&format!(
        "cargo install --path crates/cli ({}) from a copy of the checkout",
        if release { "release" } else { "debug" }
    ));
    let started = Instant::now();
    let mut install = crate::cargo();
    install
        .args(["install", "--locked", "--force", "--path"])
        .arg(checkout.join("crates").join("cli"))
        .arg("--root")
        .arg(&root)
        .env("CARGO_TARGET_DIR", build_dir())
        .env_remove("NERVE_EMBED_EXECUTOR");
    if !release {
        install.arg("--debug");
    }
    crate::run(&mut install)?;
    let install_s = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(&checkout)
        .with_context(|| format!("cannot remove {}", checkout.display()))?;
    let nerve = root.join("bin").join("nerve");

    let run_dir = scratch.join("run");
    let workspace = run_dir.join("workspace");
    crate::copy_dir(Path::new("examples/demo/workspace"), &workspace)?;
    let db = run_dir.join("nerve.db");
    let demo = crate::project_root().join("examples").join("demo");
    let started = Instant::now();
    let output = Command::new(&nerve)
        .env_remove(nerve_hands::EXECUTOR_ENV)
        .env("XDG_CACHE_HOME", &cache)
        .arg("--db")
        .arg(&db)
        .args(["run", "--workspace"])
        .arg(&workspace)
        .arg("--task-file")
        .arg(demo.join("task.txt"))
        .arg("--provider")
        .arg(format!("script:{}", demo.join("cassette.jsonl").display()))
        .arg("--json")
        .output()
        .with_context(|| format!("cannot run {}", nerve.display()))?;
    let run_s = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!(
            "the installed nerve's demo run failed ({}): {}",
            output.status,
            stderr.trim()
        );
    }
    if let Some(line) = stderr.lines().find(|l| !l.trim().is_empty()) {
        bail!("the installed nerve's demo run printed on stderr (a fallback warning?): {line}");
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let result: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .with_context(|| format!("the installed nerve printed no result: {stdout}"))?;
    let id = result["execution_id"]
        .as_str()
        .context("the result has no execution_id")?;
    let events = Command::new(&nerve)
        .arg("--db")
        .arg(&db)
        .args(["events", id, "--json"])
        .output()
        .context("cannot run nerve events")?;
    let events: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&events.stdout)
            .lines()
            .last()
            .unwrap_or_default(),
    )
    .context("nerve events --json printed no JSON")?;
    let started_event = &events[0];
    if started_event["kind"] != "started" {
        bail!("the first event is not `started`: {started_event}");
    }
    let recorded = &started_event["payload"]["config"]["sandbox_executor"];
    let path = recorded["path"].as_str().map(PathBuf::from);
    let carried = cache.join("nerve").join("executor");
    match (&recorded["mode"], path) {
        (mode, Some(path)) if mode == "executor" && path.starts_with(&carried) => {}
        _ => bail!(
            "the installed nerve did not use the executor it carries (expected one under {}): started records {recorded}",
            carried.display()
        ),
    }
    let size_mib = std::fs::metadata(&nerve).map_or(0.0, |m| m.len() as f64 / 1048576.0);
    eprintln!(
        "install check: passed (install {install_s:.0} s, {size_mib:.1} MiB binary; the demo run {run_s:.2} s, {} turns, executor {})",
        result["total_turns"], recorded["path"]
    );
    Ok(())
}

/// Where the install builds: `NERVE_INSTALL_CHECK_TARGET_DIR` when set (the project's own
/// target directory makes a release check after `cargo xtask bench e2e` rebuild only the
/// workspace's crates), else `<target dir>/install-check`.
fn build_dir() -> PathBuf {
    std::env::var_os("NERVE_INSTALL_CHECK_TARGET_DIR")
        .filter(|dir| !dir.is_empty())
        .map_or_else(
            || crate::target_dir().join("install-check"),
            |dir| crate::project_root().join(dir),
        )
}

/// Copies what `git ls-files` lists (tracked, and untracked files that are not ignored) into
/// `to`: the checkout as a clone with the working tree's changes would have it.
fn copy_checkout(to: &Path) -> Result<()> {
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(crate::project_root())
        .output()
        .context("cannot run git ls-files")?;
    if !listed.status.success() {
        bail!(
            "git ls-files failed: {}",
            String::from_utf8_lossy(&listed.stderr).trim()
        );
    }
    let root = crate::project_root();
    // Ends: one pass over the finite list git printed.
    for name in listed.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = Path::new(std::str::from_utf8(name).context("a file name is not UTF-8")?);
        let from = root.join(name);
        // A file deleted in the working tree but still in the index.
        if !from.is_file() {
            continue;
        }
        let target = to.join(name);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&from, &target).with_context(|| format!("cannot copy {}", from.display()))?;
    }
    Ok(())
}
