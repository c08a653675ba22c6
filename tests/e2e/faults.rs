//! Faults under a run, both with the crash cassette (examples/crash, 30 turns):
//!
//! - The log's filesystem fills up. The log lives on a small tmpfs this test mounts (as
//!   root; unmounted however the test ends) with most of it taken by a filler file. The
//!   run stops with a clear error, the log verifies and replays as a crashed run, and once
//!   the filler is deleted `nerve resume` completes the run.
//! - The Docker daemon restarts mid-run. Never the shared one: the test starts a private
//!   `dockerd` (its own socket, data root, exec root and pid file in a temp dir, the image
//!   loaded into it with `docker save | docker --host ... load`) and points `nerve` at it
//!   with `DOCKER_HOST`. The run ends `error` with a line naming the lost sandbox, the log
//!   verifies, and `nerve resume` completes it once the daemon is back.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::crash::{check_sequence, completed_turns, execution_id, replay_json, verify};
use crate::support::{
    PATIENCE, copy_example, docker_available, is_turn_event, last_json, nerve_env, read_log, root,
    spawn_nerve_env, stderr, tree, wait_for_event,
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
    // The workspace's snapshots go to another disk: this is about the log filling (git's
    // temporary files on the log's disk would take and give back room under it).
    let checkpoints = dir.path().join("checkpoints");
    let checkpoints = [("NERVE_CHECKPOINTS", checkpoints.to_str().unwrap())];
    let run = nerve_env(&db, &args, &checkpoints);
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
    // Where the disk filled decides which other gaps show (a turn begun, a call in doubt);
    // a crashed run always lacks its finish.
    assert!(
        replay["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|gap| gap["kind"] == "no_finish"),
        "{replay}"
    );

    // Space freed: the resume completes the run.
    std::fs::remove_file(filler).unwrap();
    let resume = nerve_env(&db, &["resume", &id, "--json"], &checkpoints);
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

/// A private Docker daemon in a temp dir, stopped when dropped.
struct PrivateDocker {
    dir: tempfile::TempDir,
    /// The running `dockerd`, ours to wait for.
    daemon: Option<std::process::Child>,
}

impl PrivateDocker {
    fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    /// Starts a daemon with nothing shared with the host's: its own socket, data and exec
    /// roots and pid file, a bridge of its own and no iptables rules, and an empty
    /// configuration file (the host's /etc/docker/daemon.json names the shared data root).
    /// Not `--bridge=none`: a daemon started so deletes the host's `docker0`, and the host
    /// daemon's image builds (which use the default bridge) fail from then on.
    fn start() -> Self {
        // Short: the socket's path must fit in a sockaddr_un.
        let dir = tempfile::Builder::new()
            .prefix("nd")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::write(dir.path().join("daemon.json"), "{}").unwrap();
        let bridge = Self::bridge_name();
        let ip = |args: &[&str]| {
            let status = Command::new("ip").args(args).status();
            assert!(status.is_ok_and(|s| s.success()), "ip {args:?} failed");
        };
        // A leftover of an earlier process with the same id goes first.
        let _ = Command::new("ip")
            .args(["link", "delete", &bridge])
            .status();
        ip(&["link", "add", &bridge, "type", "bridge"]);
        // A private subnet the host daemon's pools do not hand out.
        ip(&["addr", "add", "10.213.77.1/24", "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        let mut docker = Self { dir, daemon: None };
        docker.launch();
        docker
    }

    fn launch(&mut self) {
        let dir = self.dir.path();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.join("dockerd.log"))
            .unwrap();
        let daemon = Command::new("dockerd")
            .arg("--config-file")
            .arg(dir.join("daemon.json"))
            .arg("--host")
            .arg(self.host())
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .arg(format!("--bridge={}", Self::bridge_name()))
            .args(["--iptables=false", "--ip-masq=false"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dockerd: {e}"));
        self.daemon = Some(daemon);
        let deadline = Instant::now() + PATIENCE;
        while !self.docker(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "the private dockerd did not come up: {}",
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM (it stops its containers and its containerd), and waits until it is gone;
    /// false when it did not go within [`PATIENCE`] (then it is SIGKILLed).
    fn stop(&mut self) -> bool {
        let Some(mut daemon) = self.daemon.take() else {
            return true;
        };
        let _ = Command::new("kill").arg(daemon.id().to_string()).status();
        let deadline = Instant::now() + PATIENCE;
        while daemon.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = daemon.kill();
                let _ = daemon.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    }

    fn docker(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker")
            .arg("--host")
            .arg(self.host())
            .args(args)
            .output()
            .unwrap()
    }

    /// Copies the sandbox image from the shared daemon (read only there).
    fn load_image(&self) {
        let mut save = Command::new("docker")
            .args(["save", nerve_hands::DEFAULT_IMAGE])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let load = Command::new("docker")
            .arg("--host")
            .arg(self.host())
            .arg("load")
            .stdin(save.stdout.take().unwrap())
            .output()
            .unwrap();
        assert!(save.wait().unwrap().success(), "docker save failed");
        assert!(load.status.success(), "docker load: {}", stderr(&load));
    }
}

impl PrivateDocker {
    /// The private daemon's bridge: one per test process (the test runs once in it).
    fn bridge_name() -> String {
        format!("nerveflt{}", std::process::id() % 100_000)
    }
}

impl Drop for PrivateDocker {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new("ip")
            .args(["link", "delete", &Self::bridge_name()])
            .status();
    }
}

/// Whether a private dockerd can be started here; panics when the test must run.
fn can_run_dockerd() -> bool {
    if !can_mount() {
        return false;
    }
    let found = Command::new("dockerd").arg("--version").output();
    if found.is_ok_and(|o| o.status.success()) {
        return true;
    }
    let reason = "no dockerd to start a private daemon with";
    assert!(
        !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
        "{reason}"
    );
    eprintln!("skipping: {reason}");
    false
}

/// The resume takes up an execution that ended `error` (issue 16: the failed task goes
/// back to `in_progress`).
#[test]
fn a_docker_daemon_restart_mid_run_ends_in_error_and_the_run_resumes() {
    if !docker_available() || !can_run_dockerd() {
        return;
    }
    let mut docker = PrivateDocker::start();
    docker.load_image();
    let host = docker.host();
    let env = [("DOCKER_HOST", host.as_str())];
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("crash", dir.path());
    let db = dir.path().join("nerve.db");
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
    let mut running = spawn_nerve_env(&db, &args, &env);
    // Turn 17 runs `sleep 5`: the daemon goes down under it and comes back.
    wait_for_event(&db, &mut running, "turn 17's tool call", |e| {
        is_turn_event(e, "tool_call_started", 17)
    });
    assert!(docker.stop(), "the private dockerd did not stop");
    docker.launch();
    let run = running.wait();
    assert_eq!(run.status.code(), Some(1), "{}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "error", "{result}");
    let error = result["error"].as_str().unwrap();
    assert!(error.starts_with("sandbox unavailable"), "{error}");
    assert!(!error.contains('\n'), "one line: {error}");

    let id = execution_id(&read_log(&db));
    verify(&db, &id);
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], "error", "{replay}");
    // Turn 17's call dies with the daemon, or finishes as an error just before it goes.
    assert!(
        (16..30).contains(&replay["total_turns"].as_u64().unwrap()),
        "{replay}"
    );

    let resume = nerve_env(&db, &["resume", &id, "--json"], &env);
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    assert_eq!(result["total_turns"], 30, "{result}");
    verify(&db, &id);
    assert_eq!(
        tree(&workspace).get("config.ini").map(Vec::as_slice),
        Some(&b"name=counter\nversion=3\n"[..]),
        "the cassette's last edits landed"
    );
}
