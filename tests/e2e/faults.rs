//! Faults under a run: the log's filesystem fills up. The log lives on a small tmpfs this
//! test mounts (as root; unmounted however the test ends) with most of it taken by a
//! filler file; the crash cassette's 30 turns need more than what is left. The run stops
//! with a clear error, the log verifies and replays as a crashed run, and once the filler
//! is deleted `nerve resume` completes the run to the workspace an uninterrupted run leaves.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;

use crate::crash::{check_sequence, completed_turns, execution_id, replay_json, verify};
use crate::support::{
    copy_example, docker_available, last_json, nerve, read_log, root, stderr, tree,
};

/// A tmpfs mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::create_dir(&path).unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            mounted.status.success(),
            "mount tmpfs: {}",
            stderr(&mounted)
        );
        Self { _dir: dir, path }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily if busy: a `nerve` of a failed test may still hold the log open.
        let unmounted = Command::new("umount").arg(&self.path).status();
        if !unmounted.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Whether this test can mount a filesystem; panics when it must run
/// (`NERVE_REQUIRE_DOCKER=1`, as in CI, where the tests run as root).
fn can_mount() -> bool {
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        return true;
    }
    let reason = "mounting a tmpfs for the log needs root";
    assert!(
        !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
        "{reason}"
    );
    eprintln!("skipping: {reason}");
    false
}

/// Fills `dir` but for about `keep` bytes.
fn fill(dir: &Path, keep: u64) -> PathBuf {
    let stat = Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&stat.stdout);
    let mut numbers = text.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    let (free, block) = (numbers.next().unwrap(), numbers.next().unwrap());
    let filler = dir.join("filler");
    let size = (free * block).saturating_sub(keep);
    std::fs::write(&filler, vec![0xa5; usize::try_from(size).unwrap()]).unwrap();
    filler
}

#[test]
fn a_full_log_filesystem_stops_the_run_and_a_resume_finishes_it_once_freed() {
    if !docker_available() || !can_mount() {
        return;
    }
    let tmpfs = Tmpfs::mount("2m");
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("crash", dir.path());
    let db = tmpfs.path.join("nerve.db");
    // The database, its shared memory and the first turns fit; the 30 turns (about 1 MiB
    // of log) do not.
    let filler = fill(&tmpfs.path, 400 * 1024);
    let task = root().join("examples/crash/task.txt");
    let provider = format!(
        "script:{}",
        root().join("examples/crash/cassette.jsonl").display()
    );
    let args = [
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task-file",
        task.to_str().unwrap(),
        "--provider",
        &provider,
        "--max-turns",
        "40",
        "--json",
    ];
    let run = nerve(&db, &args);
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "error", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(
        error.contains("event log") && error.contains("disk is full"),
        "{error}"
    );
    let turns_done = result["total_turns"].as_u64().unwrap();
    assert!(
        (1..30).contains(&turns_done),
        "the disk filled mid-run: {result}"
    );

    // The log holds a committed prefix: it verifies and replays as a run that crashed.
    let id = execution_id(&read_log(&db));
    let before = crate::support::events_json(&db, &id);
    check_sequence(&before);
    verify(&db, &id);
    let replay = replay_json(&db, &id);
    assert_eq!(
        replay["gaps"].as_array().unwrap().last().unwrap()["kind"],
        "no_finish",
        "{replay}"
    );

    // Space freed: the resume completes the run.
    std::fs::remove_file(filler).unwrap();
    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], 30, "{result}");
    let after = crate::support::events_json(&db, &id);
    check_sequence(&after);
    assert_eq!(
        after[..before.len()],
        before[..],
        "the stopped run's events changed"
    );
    assert_eq!(completed_turns(&after), (1..=30).collect::<Vec<_>>());
    verify(&db, &id);
    assert_eq!(replay_json(&db, &id)["gaps"], json!([]));
    let files = tree(&workspace);
    assert_eq!(
        files.get("config.ini").map(Vec::as_slice),
        Some(&b"name=counter\nversion=3\n"[..]),
        "the cassette's last edits landed"
    );
}
