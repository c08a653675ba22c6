//! Sandbox containers that outlive their `nerve`: the reaper removes only those whose owner
//! it can prove dead, `nerve reap --all` removes the rest on an operator's word, and a
//! resume right after a crash takes over the killed run's container name instead of
//! failing with the engine's `409 Conflict`.
//!
//! The engine is shared with whatever else runs on the machine, so these tests only ever
//! remove containers of their own executions (by label), and the reaper they call acts on
//! provable orphans only. Waits are for conditions, with generous deadlines.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListContainersOptionsBuilder};
use nerve_core::ExecutionId;

use crate::support::{docker_available, last_json, nerve, nerve_bin, read_log, stderr};

const PATIENCE: Duration = Duration::from_secs(120);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// This host's identity as the owner label spells it (docs/security.md).
struct Here {
    machine: String,
    boot: String,
    pid_ns: String,
}

fn here() -> Here {
    let machine = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map_or_else(|| "unknown".to_owned(), |id| id.trim().to_owned());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .to_owned();
    let link = std::fs::read_link("/proc/self/ns/pid").unwrap();
    let pid_ns = link
        .to_str()
        .unwrap()
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_owned();
    Here {
        machine,
        boot,
        pid_ns,
    }
}

/// Field 3 (state) and 22 (start time) of `/proc/<pid>/stat`.
fn stat(pid: u32) -> (String, String) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    (rest[0].to_owned(), rest[19].to_owned())
}

/// The two owner labels, `org.nerve.owner` and `org.nerve.owner.host`.
fn label(machine: &str, boot: &str, pid_ns: &str, pid: u32, start: &str) -> Owner {
    (
        Some(format!("{boot}:{pid}:{start}")),
        Some(format!("machine={machine};pidns={pid_ns}")),
    )
}

type Owner = (Option<String>, Option<String>);

/// Waits until `pid` (a child killed or exited, not yet waited for) is a zombie.
fn wait_for_zombie(pid: u32) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (state, start) = stat(pid);
        if state == "Z" {
            return start;
        }
        assert!(Instant::now() < deadline, "{pid} never became a zombie");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Names of the containers labelled with `execution`, running or not.
async fn names_of(docker: &bollard::Docker, execution: &str) -> BTreeSet<String> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("org.nerve.execution={execution}")],
    )]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    docker
        .list_containers(Some(options))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| {
            c.names?
                .first()
                .map(|n| n.trim_start_matches('/').to_owned())
        })
        .collect()
}

/// Creates (without starting) a Nerve-labelled container of `execution` named `name`,
/// owned as `owner` says (`None`: no such label).
async fn fake_sandbox(docker: &bollard::Docker, execution: &str, name: &str, owner: &Owner) {
    let mut labels = HashMap::from([
        ("org.nerve.managed".to_owned(), "true".to_owned()),
        ("org.nerve.execution".to_owned(), execution.to_owned()),
    ]);
    if let Some(process) = &owner.0 {
        labels.insert("org.nerve.owner".to_owned(), process.clone());
    }
    if let Some(host) = &owner.1 {
        labels.insert("org.nerve.owner.host".to_owned(), host.clone());
    }
    let body = ContainerCreateBody {
        image: Some(nerve_hands::DEFAULT_IMAGE.to_owned()),
        cmd: Some(vec!["/bin/sleep".to_owned(), "1".to_owned()]),
        labels: Some(labels),
        network_disabled: Some(true),
        ..Default::default()
    };
    let options = CreateContainerOptionsBuilder::default().name(name).build();
    docker.create_container(Some(options), body).await.unwrap();
}

#[test]
fn the_reaper_removes_only_containers_whose_owner_is_provably_dead() {
    if !docker_available() {
        return;
    }
    let here = here();
    let execution = ExecutionId::new().to_string();
    let short = &execution[execution.len() - 12..];
    // A process that ended, and one killed but not waited for (a zombie, as a `nerve`
    // killed a moment ago whose parent has not looked yet).
    let mut ended = Command::new("true").spawn().unwrap();
    let ended_pid = ended.id();
    ended.wait().unwrap();
    let mut zombie = Command::new("sleep").arg("600").spawn().unwrap();
    let (_, zombie_start) = stat(zombie.id());
    zombie.kill().unwrap();
    wait_for_zombie(zombie.id());
    let (_, my_start) = stat(std::process::id());
    let me = std::process::id();
    let Here {
        machine,
        boot,
        pid_ns,
    } = &here;
    let cases: Vec<(&str, Owner, bool)> = vec![
        ("dead", label(machine, boot, pid_ns, ended_pid, "1"), true),
        (
            "zombie",
            label(machine, boot, pid_ns, zombie.id(), &zombie_start),
            true,
        ),
        ("live", label(machine, boot, pid_ns, me, &my_start), false),
        (
            "other-host",
            label("0ther", boot, pid_ns, ended_pid, "1"),
            false,
        ),
        (
            "other-boot",
            label(machine, "another-boot", pid_ns, ended_pid, "1"),
            false,
        ),
        (
            "other-pidns",
            label(machine, boot, "1", ended_pid, "1"),
            false,
        ),
        ("empty", (Some(String::new()), Some(String::new())), false),
        ("unlabelled", (None, None), false),
        // What older versions wrote: no host label, so no proof.
        (
            "legacy",
            (Some(format!("{boot}:{ended_pid}:1")), None),
            false,
        ),
        (
            "unreadable",
            (
                Some(format!("{boot}:{ended_pid}")),
                label(machine, boot, pid_ns, ended_pid, "1").1,
            ),
            false,
        ),
    ];
    let name = |case: &str| format!("nerve-test-reap-{short}-{case}");
    runtime().block_on(async {
        let docker = nerve_hands::connect_docker().await.unwrap();
        for (case, owner, _) in &cases {
            fake_sandbox(&docker, &execution, &name(case), owner).await;
        }
        // What every `nerve run` does at start, over the whole engine.
        nerve_hands::reap_orphans(&docker).await.unwrap();
        let left = names_of(&docker, &execution).await;
        let expected: BTreeSet<String> = cases
            .iter()
            .filter(|(_, _, removed)| !removed)
            .map(|(case, _, _)| name(case))
            .collect();
        assert_eq!(left, expected);
    });
    zombie.wait().unwrap();

    // `nerve reap` says why each is kept; `--all` removes them on the operator's word.
    let db = tempfile::tempdir().unwrap();
    let db = db.path().join("nerve.db");
    let reap = nerve(&db, &["reap", &execution]);
    assert_eq!(reap.status.code(), Some(0), "{}", stderr(&reap));
    let text = String::from_utf8_lossy(&reap.stdout).into_owned();
    for (case, reason) in [
        ("live", "its owner is running"),
        ("other-host", "its owner runs on host 0ther"),
        ("other-boot", "another boot"),
        ("other-pidns", "another PID namespace"),
        ("empty", "no owner label"),
        ("unlabelled", "no owner label"),
        ("legacy", "no owner host label"),
        ("unreadable", "cannot be read"),
    ] {
        let line = text
            .lines()
            .find(|line| line.starts_with(&format!("kept {}:", name(case))))
            .unwrap_or_else(|| panic!("no line for {case}: {text}"));
        assert!(line.contains(reason), "{line}");
    }
    assert!(
        text.ends_with("0 removed, 8 kept (`nerve reap --all` removes those too)\n"),
        "{text}"
    );
    let all = nerve(&db, &["reap", "--all", &execution]);
    assert_eq!(all.status.code(), Some(0), "{}", stderr(&all));
    assert!(
        String::from_utf8_lossy(&all.stdout).ends_with("8 removed, 0 kept\n"),
        "{}",
        String::from_utf8_lossy(&all.stdout)
    );
    runtime().block_on(async {
        let docker = nerve_hands::connect_docker().await.unwrap();
        assert_eq!(names_of(&docker, &execution).await, BTreeSet::new());
    });
    let bad = nerve(&db, &["reap", "not-an-id"]);
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert_eq!(stderr(&bad).lines().count(), 1, "{}", stderr(&bad));
}

/// A cassette whose first turn runs a long command, then answers.
fn write_cassette(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("cassette.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 600"}}]}"#,
            "\n",
            r#"{"text": "done"}"#,
            "\n"
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_resume_right_after_a_crash_takes_over_the_killed_runs_container() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let db = dir.path().join("nerve.db");
    let provider = format!("script:{}", write_cassette(dir.path()).display());
    let mut run = Command::new(nerve_bin())
        .arg("--db")
        .arg(&db)
        .args(["run", "--workspace"])
        .arg(&workspace)
        .args(["--task", "wait", "--provider", &provider, "--json"])
        .env_remove("NERVE_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let execution = loop {
        let log = read_log(&db);
        if let Some(started) = log.iter().find(|e| e.kind == "tool_call_started") {
            break started.execution_id.clone();
        }
        assert!(
            run.try_wait().unwrap().is_none(),
            "nerve run exited before its tool call"
        );
        assert!(Instant::now() < deadline, "no tool call started");
        std::thread::sleep(Duration::from_millis(5));
    };
    // Killed, and not yet waited for: its pid still answers, as a zombie.
    run.kill().unwrap();
    wait_for_zombie(run.id());
    let resume = nerve(&db, &["resume", &execution, "--json"]);
    let summary = last_json(&resume);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    assert_eq!(summary["termination_reason"], "completed", "{summary}");
    assert!(!stderr(&resume).contains("409"), "{}", stderr(&resume));
    run.wait().unwrap();
    runtime().block_on(async {
        let docker = nerve_hands::connect_docker().await.unwrap();
        assert_eq!(names_of(&docker, &execution).await, BTreeSet::new());
    });
}

/// `Sandbox::start` on a name held by an earlier attempt: taken over when that attempt's
/// owner is provably dead, refused in one line saying why when it is not.
#[test]
fn a_start_finding_its_name_held_takes_it_over_only_from_a_dead_owner() {
    if !docker_available() {
        return;
    }
    let here = here();
    let Here {
        machine,
        boot,
        pid_ns,
    } = &here;
    let mut ended = Command::new("true").spawn().unwrap();
    let ended_pid = ended.id();
    ended.wait().unwrap();
    let (_, my_start) = stat(std::process::id());
    let workspace = tempfile::tempdir().unwrap();
    let cases = [
        (label(machine, boot, pid_ns, ended_pid, "1"), None),
        (
            label(machine, boot, pid_ns, std::process::id(), &my_start),
            Some("is still running; stop that run first"),
        ),
        (
            label("0ther", boot, pid_ns, ended_pid, "1"),
            Some(
                "whose owner cannot be proven dead (its owner runs on host 0ther); if no run of it is alive, remove it with `nerve reap --all ",
            ),
        ),
    ];
    runtime().block_on(async {
        let docker = nerve_hands::connect_docker().await.unwrap();
        for (owner, refusal) in cases {
            let execution = ExecutionId::new();
            let name = format!("nerve-{execution}");
            fake_sandbox(&docker, &execution.to_string(), &name, &owner).await;
            let config = nerve_hands::SandboxConfig::new(
                nerve_hands::DEFAULT_IMAGE,
                workspace.path(),
                execution,
            );
            let started = nerve_hands::Sandbox::start(docker.clone(), &config).await;
            match (started, refusal) {
                (Ok(sandbox), None) => {
                    sandbox.remove().await.unwrap();
                }
                (Err(error @ nerve_hands::HandsError::SandboxInUse(_)), Some(refusal)) => {
                    let text = error.to_string();
                    assert!(text.contains(refusal), "{text}");
                    assert!(text.contains(&name), "{text}");
                    assert!(!text.contains("409"), "{text}");
                }
                (Ok(_), Some(refusal)) => panic!("started over a container that {refusal}"),
                (Err(error), _) => panic!("{owner:?}: {error}"),
            }
            let left = names_of(&docker, &execution.to_string()).await;
            let expected: BTreeSet<String> = refusal.map(|_| name.clone()).into_iter().collect();
            assert_eq!(left, expected, "{owner:?}");
            // Clean up our own fake.
            nerve_hands::reap(
                &docker,
                nerve_hands::ReapScope::All,
                Some(&execution.to_string()),
            )
            .await
            .unwrap();
        }
    });
}
