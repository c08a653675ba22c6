//! `cargo xtask bench checkpoint`: the cost of a workspace snapshot per turn, as a ratio
//! against `git add -A && git write-tree` on an identical tree in the same run.
//!
//! Two workspaces of 10,000 small files in 100 directories, one with a plain git
//! repository (the anchor), one snapshotted by [`Checkpoints`] into its shadow store. Each
//! round changes one file in both and times, alternately, the anchor's `git add -A && git
//! write-tree` (through `sh -c`, as a user would type it) and `Checkpoints::snapshot` (in
//! process: a walk with the stat cache, the changed file stored, the trees above it
//! written). Then the same
//! with a 200 MB ignored build directory (200 files of 1 MiB, `build/` in `.gitignore`)
//! beside the 10,000 files: a snapshot must cost what the changed files cost, not what the
//! ignored ones weigh.
//!
//! A custom harness (`harness = false`): the figures are medians and their ratio.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A report for people.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nerve_hands::checkpoint::{CheckpointConfig, Checkpoints};

const FILES: usize = 10_000;
const ROUNDS: usize = 21;

fn populate(root: &Path) {
    for i in 0..FILES {
        let dir = root.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("f{i:05}.txt")),
            format!("file {i}\n").repeat(8),
        )
        .unwrap();
    }
}

fn git(root: &Path, script: &str) {
    let status = Command::new("sh")
        .args(["-c", script])
        .current_dir(root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "{script}");
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Times `ROUNDS` rounds of one changed file: the anchor and the snapshot, alternately.
fn measure(label: &str, anchor: &Path, shadow: &Path, store: &Checkpoints) {
    let (mut plain, mut ours) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let changed = format!("d{:03}/f{:05}.txt", round % 100, round);
        let text = format!("changed in round {round}\n");
        std::fs::write(anchor.join(&changed), &text).unwrap();
        std::fs::write(shadow.join(&changed), &text).unwrap();
        let started = Instant::now();
        git(anchor, "git add -A && git write-tree");
        plain.push(started.elapsed());
        let started = Instant::now();
        store.snapshot().unwrap();
        ours.push(started.elapsed());
    }
    let (plain, ours) = (median(plain), median(ours));
    println!(
        "{label}: git add -A && git write-tree {:.1} ms, Checkpoints::snapshot {:.1} ms, ratio {:.2}x",
        plain.as_secs_f64() * 1e3,
        ours.as_secs_f64() * 1e3,
        ours.as_secs_f64() / plain.as_secs_f64()
    );
}

fn main() {
    let dir = tempfile::Builder::new()
        .prefix("nerve-bench-checkpoint")
        .tempdir()
        .unwrap();
    let anchor = dir.path().join("anchor");
    let shadow = dir.path().join("shadow");
    for root in [&anchor, &shadow] {
        populate(root);
        std::fs::write(root.join(".gitignore"), "build/\n").unwrap();
    }
    git(&anchor, "git init -q . && git add -A && git write-tree");
    let store =
        Checkpoints::open(CheckpointConfig::new(dir.path().join("store.git"), &shadow)).unwrap();
    let started = Instant::now();
    store.snapshot().unwrap();
    println!(
        "first snapshot of {FILES} files: {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    measure(
        &format!("{FILES} files, one changed"),
        &anchor,
        &shadow,
        &store,
    );

    let block = vec![0x5au8; 1 << 20];
    for root in [&anchor, &shadow] {
        std::fs::create_dir_all(root.join("build")).unwrap();
        for i in 0..200 {
            std::fs::write(root.join(format!("build/o{i:03}.bin")), &block).unwrap();
        }
    }
    measure(
        &format!("{FILES} files and a 200 MB ignored build/, one changed"),
        &anchor,
        &shadow,
        &store,
    );
}
