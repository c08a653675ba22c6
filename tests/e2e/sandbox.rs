//! The sandbox under abuse: every tool through the real executor in a real container, and
//! every way a command or a path could hurt the host. Each case checks the tool result the
//! model would see and, on the host side, that nothing leaked: no file outside the workspace,
//! the host still answering, the container gone afterwards.
//!
//! Bounds on time are liveness bounds only (a hung call fails the test after minutes, never
//! a timing assertion).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::{ToolCall, ToolCallId, ToolExecutor, ToolOutput};
use nerve_hands::{Backend, Sandbox, SandboxConfig, SandboxTools, Transport};
use serde_json::{Value, json};

use crate::support::{last_json, nerve_bin, sandbox_available, stderr, stdout};

/// A hung call fails the test after this long (a liveness bound, not a timing assertion).
const LIVENESS: Duration = Duration::from_secs(300);

const SECRET: &str = "TOPSECRET-host-only";

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A sandbox on a fresh workspace, next to a host directory `outside` holding a secret and
/// the workspace's symlinks that point out of it in every way a path can.
struct Fixture {
    dir: tempfile::TempDir,
    sandbox: Arc<Sandbox>,
    tools: SandboxTools,
    removed: bool,
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A sandbox whose executor talks over `transport`.
    async fn over(transport: Transport) -> Self {
        let fx = Self::start_with(|c| c.transport = transport).await;
        assert_eq!(fx.sandbox.transport().await, Some(transport));
        fx
    }

    async fn start_with(tweak: impl FnOnce(&mut SandboxConfig)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(workspace.join("sub")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret.txt"), format!("{SECRET}\n")).unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, workspace.join(name)).unwrap();
        };
        link(&outside.join("secret.txt"), "abs_link");
        link(Path::new("../outside/secret.txt"), "rel_link");
        link(Path::new("../../outside/secret.txt"), "sub/up_link");
        link(Path::new("../outside"), "dir_link");
        link(&outside, "abs_dir_link");
        link(Path::new("/etc"), "etc_link");
        let docker = nerve_hands::connect_docker().await.unwrap();
        let mut config = SandboxConfig::new(
            nerve_hands::DEFAULT_IMAGE,
            &workspace,
            nerve_core::ExecutionId::new(),
        );
        tweak(&mut config);
        let sandbox = Arc::new(Sandbox::start(docker, &config).await.unwrap());
        let tools = SandboxTools::new(Arc::clone(&sandbox));
        Self {
            dir,
            sandbox,
            tools,
            removed: false,
        }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("workspace")
    }

    fn outside(&self) -> PathBuf {
        self.dir.path().join("outside")
    }

    async fn call(&self, name: &str, arguments: Value) -> ToolOutput {
        let call = ToolCall {
            id: ToolCallId("call".to_owned()),
            name: name.to_owned(),
            arguments,
        };
        tokio::time::timeout(LIVENESS, self.tools.execute(&call))
            .await
            .unwrap_or_else(|_| panic!("{name} hung"))
            .unwrap_or_else(|e| panic!("{name}: the sandbox failed: {e}"))
    }

    async fn shell(&self, command: &str) -> ToolOutput {
        self.call("shell", json!({ "command": command })).await
    }

    /// Calls a tool and checks that it failed with a message containing `expected`.
    async fn refused(&self, name: &str, arguments: Value, expected: &str) {
        let output = self.call(name, arguments.clone()).await;
        assert!(output.is_error, "{name} {arguments} succeeded: {output:?}");
        assert!(
            output.content.contains(expected),
            "{name} {arguments}: expected `{expected}` in {output:?}"
        );
        assert!(!output.content.contains(SECRET), "{output:?}");
    }

    /// The host's view of the directory next to the workspace: only the secret, unchanged.
    fn assert_outside_untouched(&self) {
        let names: Vec<String> = std::fs::read_dir(self.outside())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["secret.txt"], "something was created outside");
        assert_eq!(
            std::fs::read_to_string(self.outside().join("secret.txt")).unwrap(),
            format!("{SECRET}\n")
        );
    }

    /// What the host's control directory (the source of the container's
    /// `/run/nerve-control`) holds now.
    async fn control_dir_entries(&self) -> Vec<String> {
        let inspected = self
            .sandbox
            .docker()
            .inspect_container(self.sandbox.container_id(), None)
            .await
            .unwrap();
        let mounts = inspected.mounts.unwrap_or_default();
        let source = mounts
            .iter()
            .find(|m| m.destination.as_deref() == Some("/run/nerve-control"))
            .and_then(|m| m.source.clone());
        let Some(source) = source else {
            panic!("the control directory is not mounted: {mounts:?}");
        };
        std::fs::read_dir(source)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    /// Removes the sandbox and checks that the engine no longer knows the container.
    async fn finish(mut self) {
        self.sandbox.remove().await.unwrap();
        self.removed = true;
        let docker = self.sandbox.docker();
        let inspected = docker
            .inspect_container(self.sandbox.container_id(), None)
            .await;
        assert!(inspected.is_err(), "the container outlived remove()");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // A failed test still removes its container.
        if !self.removed {
            let _ = Command::new("docker")
                .args(["rm", "-f", self.sandbox.container_id()])
                .output();
        }
    }
}

/// The host is still itself: it can spawn a process and answer on loopback.
fn assert_host_responsive() {
    let status = Command::new("true").status().unwrap();
    assert!(status.success());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let _client = std::net::TcpStream::connect(address).unwrap();
    listener.accept().unwrap();
}

/// Runs `command` until its output contains `expected`, for a sandbox that may still be
/// recovering (pids being reaped after a fork bomb). A liveness bound, not a timing check.
async fn eventually(fx: &Fixture, command: &str, expected: &str) {
    let started = Instant::now();
    loop {
        let output = fx.shell(command).await;
        if !output.is_error && output.content.contains(expected) {
            return;
        }
        assert!(
            started.elapsed() < LIVENESS,
            "`{command}` never printed {expected}: {output:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs `case` over each transport: the control socket (the default), and the attach stream
/// it falls back to.
fn on_each_transport<F: std::future::Future<Output = ()>>(case: impl Fn(Transport) -> F) {
    if !sandbox_available() {
        return;
    }
    for transport in [Transport::Socket, Transport::Attach] {
        runtime().block_on(case(transport));
    }
}

#[test]
fn every_tool_works_through_the_executor() {
    on_each_transport(every_tool_works);
}

async fn every_tool_works(transport: Transport) {
    let fx = Fixture::over(transport).await;
    assert_eq!(fx.sandbox.backend().await, Backend::Executor);
    assert_eq!(
        fx.sandbox.ping().await.unwrap(),
        nerve_hands::protocol::VERSION
    );

    let written = fx
        .call(
            "write_file",
            json!({"path": "src/lib.rs", "content": "fn a() {}\nfn b() {}\nfn a2() {}\n"}),
        )
        .await;
    assert_eq!(written, ToolOutput::ok("created src/lib.rs (31 bytes)"));
    assert_eq!(
        std::fs::read_to_string(fx.workspace().join("src/lib.rs")).unwrap(),
        "fn a() {}\nfn b() {}\nfn a2() {}\n",
        "written on the host's workspace"
    );
    let read = fx
        .call(
            "read_file",
            json!({"path": "src/lib.rs", "offset": 1, "limit": 1}),
        )
        .await;
    assert_eq!(
        read,
        ToolOutput::ok(
            "fn b() {}\n[lines 2-2 of src/lib.rs shown; more follow: read_file with offset=2]"
        )
    );
    fx.refused(
        "edit_file",
        json!({"path": "src/lib.rs", "old_text": "fn a", "new_text": "fn z"}),
        "matches 2 times",
    )
    .await;
    fx.refused(
        "edit_file",
        json!({"path": "src/lib.rs", "old_text": "fn q", "new_text": "fn z"}),
        "not found",
    )
    .await;
    let edited = fx
            .call(
                "edit_file",
                json!({"path": "src/lib.rs", "old_text": "fn a", "new_text": "fn z", "replace_all": true}),
            )
            .await;
    assert_eq!(edited, ToolOutput::ok("edited src/lib.rs: 2 replacements"));
    let listed = fx.call("list_dir", json!({})).await;
    assert!(!listed.is_error, "{listed:?}");
    for line in ["src/", "sub/", "rel_link@ (symlink)"] {
        assert!(
            listed.content.lines().any(|l| l == line),
            "{line} in {listed:?}"
        );
    }
    let found = fx
        .call("grep", json!({"pattern": r"fn z\d?", "glob": "*.rs"}))
        .await;
    assert_eq!(
        found,
        ToolOutput::ok("src/lib.rs:1:fn z() {}\nsrc/lib.rs:3:fn z2() {}")
    );
    let shell = fx
        .call(
            "shell",
            json!({"command": "pwd; echo oops >&2; exit 3", "workdir": "src"}),
        )
        .await;
    assert_eq!(
        shell,
        ToolOutput::error("/workspace/src\n[stderr]\noops\n[exit code: 3]")
    );

    // Bad calls are results naming the problem, never a crash.
    fx.refused(
        "launch_missiles",
        json!({}),
        "unknown tool `launch_missiles`",
    )
    .await;
    fx.refused("shell", json!({"cmd": "ls"}), "unknown field `cmd`")
        .await;
    fx.refused("read_file", json!({}), "missing field `path`")
        .await;
    fx.refused("grep", json!({"pattern": "("}), "grep:").await;
    fx.refused(
        "shell",
        json!({"command": "ls", "timeout_secs": 0}),
        "at least 1",
    )
    .await;
    fx.refused("read_file", json!({"path": "nope.txt"}), "nope.txt")
        .await;
    fx.finish().await;
}

#[test]
fn a_dead_executor_is_restarted_and_a_missing_one_falls_back() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        // The command's parent is the executor: killing it loses the call, not the sandbox.
        let lost = fx.shell("kill -9 $PPID; sleep 5").await;
        assert!(lost.is_error, "{lost:?}");
        assert!(lost.content.contains("executor stopped"), "{lost:?}");
        assert_eq!(fx.shell("echo back").await.content, "back\n[exit code: 0]");
        assert_eq!(fx.sandbox.backend().await, Backend::Executor);
        assert!(
            matches!(
                fx.sandbox.executor_use(),
                nerve_hands::ExecutorUse::Executor { .. }
            ),
            "{:?}",
            fx.sandbox.executor_use()
        );
        // The restart made a new control socket, and it is gone again.
        assert_eq!(fx.sandbox.transport().await, Some(Transport::Socket));
        assert_eq!(fx.control_dir_entries().await, Vec::<String>::new());
        fx.finish().await;

        // No binary, a missing file, a dynamic binary: refused unless the per-call fallback
        // is allowed, then per-call exec and host-side files, and the sandbox says so.
        for executor in [
            None,
            Some(PathBuf::from("/no/such/executor")),
            Some(PathBuf::from("/bin/ls")),
        ] {
            let workspace = tempfile::tempdir().unwrap();
            let mut config = SandboxConfig::new(
                nerve_hands::DEFAULT_IMAGE,
                workspace.path(),
                nerve_core::ExecutionId::new(),
            );
            config.executor = executor.clone();
            let docker = nerve_hands::connect_docker().await.unwrap();
            let refused = Sandbox::start(docker, &config).await.unwrap_err();
            assert!(
                matches!(refused, nerve_hands::HandsError::NoExecutor(_)),
                "{executor:?}: {refused}"
            );
            let fx = Fixture::start_with(|c| {
                c.executor = executor.clone();
                c.per_call_fallback = true;
            })
            .await;
            assert_eq!(
                fx.sandbox.backend().await,
                Backend::PerCallExec,
                "{executor:?}"
            );
            assert!(
                matches!(
                    fx.sandbox.executor_use(),
                    nerve_hands::ExecutorUse::PerCall { .. }
                ),
                "{:?}",
                fx.sandbox.executor_use()
            );
            let shell = fx.shell("echo hi > made.txt; cat made.txt").await;
            assert_eq!(shell, ToolOutput::ok("hi\n[exit code: 0]"));
            let read = fx.call("read_file", json!({"path": "made.txt"})).await;
            assert_eq!(read, ToolOutput::ok("hi\n"));
            fx.refused("read_file", json!({"path": "rel_link"}), "escapes")
                .await;
            fx.refused(
                "read_file",
                json!({"path": "dir_link/secret.txt"}),
                "escapes",
            )
            .await;
            fx.refused(
                "write_file",
                json!({"path": "abs_dir_link/x", "content": "x"}),
                "escapes",
            )
            .await;
            fx.refused(
                "shell",
                json!({"command": "ls", "workdir": "../outside"}),
                "escapes",
            )
            .await;
            let timed_out = fx
                .call("shell", json!({"command": "sleep 30", "timeout_secs": 1}))
                .await;
            assert!(timed_out.content.contains("timed out"), "{timed_out:?}");
            fx.assert_outside_untouched();
            fx.finish().await;
        }
    });
}

#[test]
fn a_fork_bomb_is_contained() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start_with(|c| c.pids_limit = 128).await;
        let bomb = fx
            .call(
                "shell",
                json!({"command": "bomb() { bomb | bomb & }; bomb; sleep 20", "timeout_secs": 5}),
            )
            .await;
        assert!(bomb.is_error, "{bomb:?}");
        assert_host_responsive();
        eventually(&fx, "echo alive", "alive").await;
        // Nothing of the bomb is left: the executor, its shell and `ps` only.
        let left = fx.shell("ls -d /proc/[0-9]* | wc -l").await;
        let count: usize = left.content.lines().next().unwrap().trim().parse().unwrap();
        assert!(count < 10, "processes left: {left:?}");
        fx.finish().await;
    });
}

#[test]
fn a_memory_hog_is_killed_alone() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start_with(|c| c.memory_bytes = 96 << 20).await;
        let hog = fx
            .shell("dd if=/dev/zero of=/dev/null bs=400M count=1; echo status $?")
            .await;
        // The kernel kills dd (137) inside the container's memory cgroup, or refuses it.
        assert!(
            hog.content.contains("status 137") || hog.content.contains("memory"),
            "{hog:?}"
        );
        assert_host_responsive();
        eventually(&fx, "echo alive", "alive").await;
        fx.finish().await;
    });
}

#[test]
fn filling_tmp_and_the_workspace_stops_at_the_limits() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start_with(|c| {
            c.tmp_bytes = 8 << 20;
            c.max_file_bytes = 16 << 20;
        })
        .await;
        let tmp = fx
            .shell("dd if=/dev/zero of=/tmp/fill bs=1M count=64; echo status $?")
            .await;
        assert!(tmp.content.contains("No space left"), "{tmp:?}");
        assert!(!tmp.content.contains("status 0"), "{tmp:?}");
        let big = fx
            .shell("dd if=/dev/zero of=big.bin bs=1M count=64; echo status $?")
            .await;
        // RLIMIT_FSIZE: dd dies of SIGXFSZ (128 + 25) or reports "File too large".
        assert!(
            big.content.contains("status 153") || big.content.contains("too large"),
            "{big:?}"
        );
        let size = std::fs::metadata(fx.workspace().join("big.bin"))
            .unwrap()
            .len();
        assert!(size <= 16 << 20, "the host file grew to {size} bytes");
        // The file tools have their own cap.
        let huge = "x".repeat(17 << 20);
        fx.refused(
            "write_file",
            json!({"path": "huge.txt", "content": huge}),
            "huge.txt",
        )
        .await;
        assert!(!fx.workspace().join("huge.txt").exists());
        eventually(&fx, "rm big.bin /tmp/fill; echo cleaned", "cleaned").await;
        assert_host_responsive();
        fx.finish().await;
    });
}

#[test]
fn fifty_megabytes_of_output_keep_both_ends() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let output = fx
            .shell("echo BEGIN; head -c 52428800 /dev/zero | tr '\\0' x; echo; echo END")
            .await;
        assert!(
            !output.is_error,
            "{}",
            &output.content[..200.min(output.content.len())]
        );
        assert!(output.content.starts_with("BEGIN\nxxx"), "head kept");
        assert!(
            output.content.ends_with("xxx\nEND\n[exit code: 0]"),
            "tail kept"
        );
        assert!(output.content.contains("bytes omitted ...]"));
        assert!(
            output.content.len() < 100 * 1024,
            "{} bytes",
            output.content.len()
        );
        fx.finish().await;
    });
}

#[test]
fn an_infinite_loop_is_killed_with_its_whole_group() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let looped = fx
            .call(
                "shell",
                json!({
                    "command": "sh -c 'while :; do :; done' & echo $! > /tmp/child.pid; while :; do :; done",
                    "timeout_secs": 2
                }),
            )
            .await;
        assert!(looped.is_error);
        assert!(
            looped
                .content
                .ends_with("[timed out after 2s; the command and everything it started were killed]"),
            "{looped:?}"
        );
        let child = fx
            .shell("kill -0 $(cat /tmp/child.pid) 2>/dev/null && echo alive || echo gone")
            .await;
        assert_eq!(child.content, "gone\n[exit code: 0]");
        // After a tool timeout the container still goes away with the sandbox.
        fx.finish().await;
    });
}

#[test]
fn background_jobs_and_zombies_do_not_outlive_their_command() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        // The call answers at once: it does not wait for the job's inherited pipes.
        let started = fx
            .shell("sleep 1000 & echo $! > /tmp/bg.pid; nohup sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/nohup.pid; echo started")
            .await;
        assert_eq!(started.content, "started\n[exit code: 0]");
        let left = fx
            .shell("for f in /tmp/bg.pid /tmp/nohup.pid; do kill -0 $(cat $f) 2>/dev/null && echo alive || echo gone; done")
            .await;
        assert_eq!(left.content, "gone\ngone\n[exit code: 0]");
        // A job that leaves the group (setsid) is not waited for either; it ends with the
        // executor, at the latest when the container is removed.
        let escaped = fx.shell("setsid sleep 1000 & echo detached").await;
        assert_eq!(escaped.content, "detached\n[exit code: 0]");

        // Zombies: children that exit under a parent that never waits.
        let zombies = "grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l";
        let made = fx
            .shell(&format!(
                // Waits (up to 60 s) for the first zombie rather than a fixed 2 s.
                "for i in $(seq 20); do sh -c 'sleep 0 & exec sleep 30' & done; \
                 n=0; until [ $({zombies}) -gt 0 ] || [ $n -ge 600 ]; do sleep 0.1; n=$((n+1)); done; {zombies}"
            ))
            .await;
        let during: usize = made.content.lines().next().unwrap().trim().parse().unwrap();
        assert!(during > 0, "the command should have made zombies: {made:?}");
        let after = fx.shell(zombies).await;
        // Only the counting command's own pipeline may be transiently exiting.
        let after: usize = after.content.lines().next().unwrap().trim().parse().unwrap();
        assert_eq!(after, 0, "zombies left behind");
        fx.finish().await;
    });
}

#[test]
fn no_path_leaves_the_workspace_through_the_file_tools() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let outside = fx.outside();
        let host_secret = outside.join("secret.txt").display().to_string();
        for path in [
            "../outside/secret.txt",
            "sub/../../outside/secret.txt",
            "/etc/passwd",
            host_secret.as_str(),
            "rel_link",
            "abs_link",
            "sub/up_link",
            "dir_link/secret.txt",
            "abs_dir_link/secret.txt",
            "etc_link/passwd",
        ] {
            fx.refused("read_file", json!({"path": path}), "read_file:")
                .await;
            fx.refused(
                "edit_file",
                json!({"path": path, "old_text": SECRET, "new_text": "pwned"}),
                "edit_file:",
            )
            .await;
        }
        for path in [
            "../outside/new.txt",
            "dir_link/new.txt",
            "abs_dir_link/new.txt",
            "etc_link/new.txt",
            "/tmp/new.txt",
            "rel_link",
            "abs_link",
        ] {
            fx.refused(
                "write_file",
                json!({"path": path, "content": "pwned"}),
                "write_file:",
            )
            .await;
        }
        for path in ["..", "/", "dir_link", "abs_dir_link", "etc_link"] {
            fx.refused("list_dir", json!({"path": path}), "list_dir:")
                .await;
            fx.refused(
                "grep",
                json!({"pattern": "TOPSECRET", "path": path}),
                "grep:",
            )
            .await;
        }
        // grep over the whole workspace does not follow the links.
        let grep = fx.call("grep", json!({"pattern": "TOPSECRET"})).await;
        assert_eq!(grep, ToolOutput::ok("no matches for `TOPSECRET`"));
        fx.refused(
            "shell",
            json!({"command": "pwd", "workdir": "dir_link"}),
            "shell:",
        )
        .await;
        fx.refused(
            "shell",
            json!({"command": "pwd", "workdir": "../outside"}),
            "shell:",
        )
        .await;
        fx.assert_outside_untouched();
        fx.finish().await;
    });
}

#[test]
fn shell_cannot_touch_the_host_through_paths_or_links() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let host_secret = fx.outside().join("secret.txt").display().to_string();
        let executor_before = std::fs::read(nerve_hands::locate_executor().unwrap()).unwrap();
        // Links and `..` resolve inside the container, where the host's paths do not exist.
        for command in [
            "cat ../outside/secret.txt".to_owned(),
            "cat rel_link".to_owned(),
            "cat abs_link".to_owned(),
            "cat sub/up_link".to_owned(),
            "cat dir_link/secret.txt".to_owned(),
            "cat abs_dir_link/secret.txt".to_owned(),
            format!("cat {host_secret}"),
            "cd ../..; cat ./outside/secret.txt".to_owned(),
        ] {
            let output = fx.shell(&command).await;
            assert!(output.is_error, "{command}: {output:?}");
            assert!(!output.content.contains(SECRET), "{command}: {output:?}");
        }
        // Writing anywhere but the workspace and /tmp fails: the root is read-only and the
        // executor is mounted read-only.
        for command in [
            "echo pwned > dir_link/new.txt",
            "echo pwned > abs_dir_link/new.txt",
            "echo pwned > ../outside/new.txt",
            "echo pwned > /etc/passwd",
            "touch /pwned",
            "mkdir /workspace/../pwned",
            "echo pwned > /opt/nerve/nerve-executor",
            "echo pwned > etc_link/new.txt",
        ] {
            let output = fx.shell(command).await;
            assert!(output.is_error, "{command}: {output:?}");
        }
        // A link planted to `/` resolves to the container's root, not the host's.
        let planted = fx.shell("ln -s / rootlink && ls rootlink/").await;
        assert!(planted.content.contains("workspace"), "{planted:?}");
        assert!(!planted.content.lines().any(|l| l == "work"), "{planted:?}");
        fx.refused(
            "read_file",
            json!({"path": "rootlink/etc/passwd"}),
            "escapes",
        )
        .await;
        fx.assert_outside_untouched();
        assert_eq!(
            std::fs::read(nerve_hands::locate_executor().unwrap()).unwrap(),
            executor_before,
            "the host's executor binary changed"
        );
        assert!(!Path::new("/pwned").exists());
        fx.finish().await;
    });
}

#[test]
fn a_fifo_never_hangs_a_tool() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let made = fx.shell("mkfifo pipe && echo made").await;
        assert_eq!(made.content, "made\n[exit code: 0]");
        fx.refused("read_file", json!({"path": "pipe"}), "not a regular file")
            .await;
        fx.refused(
            "write_file",
            json!({"path": "pipe", "content": "x"}),
            "not a regular file",
        )
        .await;
        fx.refused(
            "edit_file",
            json!({"path": "pipe", "old_text": "a", "new_text": "b"}),
            "not a regular file",
        )
        .await;
        let grep = fx.call("grep", json!({"pattern": "x"})).await;
        assert!(!grep.is_error, "{grep:?}");
        let listed = fx.call("list_dir", json!({})).await;
        assert!(listed.content.contains("pipe (special file)"), "{listed:?}");
        // A reader with no writer blocks; the timeout ends it.
        let blocked = fx
            .call("shell", json!({"command": "cat pipe", "timeout_secs": 1}))
            .await;
        assert!(blocked.content.contains("timed out"), "{blocked:?}");
        fx.finish().await;
    });
}

#[test]
fn no_outbound_connection_leaves_the_sandbox() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        // A listener on every host interface: nothing from the sandbox may reach it.
        let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        for command in [
            "wget -q -T 3 -O- http://1.1.1.1/".to_owned(),
            "nc -w 3 1.1.1.1 53 </dev/null".to_owned(),
            format!("wget -q -T 3 -O- http://127.0.0.1:{port}/"),
            format!("nc -w 3 127.0.0.1 {port} </dev/null"),
            format!("wget -q -T 3 -O- http://172.17.0.1:{port}/"),
            "nslookup example.com".to_owned(),
        ] {
            let output = fx
                .call("shell", json!({"command": command, "timeout_secs": 20}))
                .await;
            assert!(output.is_error, "{command}: {output:?}");
        }
        let accepted = listener.accept();
        assert!(
            accepted.is_err(),
            "a connection from the sandbox reached the host: {accepted:?}"
        );
        // Only the loopback interface exists.
        let interfaces = fx.shell("ls /sys/class/net").await;
        assert_eq!(interfaces.content, "lo\n[exit code: 0]");
        fx.finish().await;
    });
}

#[test]
fn no_command_can_reach_or_impersonate_the_executor() {
    on_each_transport(out_of_reach);
}

/// A command (whose parent is the executor, running as the same uid) looks for the
/// executor's line to the host in every place it could be, and finds none.
async fn out_of_reach(transport: Transport) {
    let fx = Fixture::over(transport).await;
    let parent = fx.shell("tr '\\0' ' ' < /proc/$PPID/cmdline").await;
    assert!(
        parent
            .content
            .starts_with("/opt/nerve/nerve-executor --root /workspace"),
        "the command's parent is the executor: {parent:?}"
    );
    if transport == Transport::Socket {
        // The socket was removed before the first request, on the host and so inside.
        assert_eq!(fx.control_dir_entries().await, Vec::<String>::new());
        let listed = fx.shell("ls -A /run/nerve-control").await;
        assert_eq!(listed, ToolOutput::ok("[exit code: 0]"));
        let planted = fx
            .shell("touch /run/nerve-control/executor.sock 2>&1; mkdir /run/nerve-control/d")
            .await;
        assert!(planted.is_error, "the directory is read-only: {planted:?}");
    }
    // No unix socket anywhere in the container's filesystem.
    let sockets = fx
        .shell("find / -path /proc -prune -o -path /sys -prune -o -type s -print")
        .await;
    assert_eq!(sockets.content, "[exit code: 0]", "{sockets:?}");
    // Nothing inherited: the command's descriptors are its pipes and /dev/null.
    let inherited = fx.shell("ls -l /proc/self/fd/ /proc/$$/fd/").await;
    assert!(!inherited.is_error, "{inherited:?}");
    assert!(!inherited.content.contains("socket:"), "{inherited:?}");
    // The executor is not dumpable: its descriptors cannot be resolved, opened or written
    // to through /proc, nor its memory read (ptrace and pidfd_getfd take the same check).
    // Their numbers can be listed by uid 0, the owner of a non-dumpable process's /proc
    // entries: names only.
    for command in [
        "readlink -v /proc/$PPID/fd/1",
        "readlink -v /proc/$PPID/fd/3",
        "cat /proc/$PPID/fd/3 </dev/null",
        "echo '{\"id\":2,\"ok\":true,\"version\":\"forged\"}' > /proc/$PPID/fd/1",
        "echo '{\"id\":2,\"ok\":true,\"version\":\"forged\"}' > /proc/$PPID/fd/3",
        "head -c 1 /proc/$PPID/mem",
        "cat /proc/$PPID/environ",
    ] {
        let output = fx.shell(command).await;
        assert!(output.is_error, "{command}: {output:?}");
        assert!(!output.content.contains("socket:"), "{command}: {output:?}");
    }
    // A forged answer on the command's own stdout is only the command's output, and the
    // executor still answers for itself.
    let forged = fx
        .shell("echo '{\"id\":99,\"ok\":true,\"version\":\"forged\"}'")
        .await;
    assert!(forged.content.contains("forged"), "{forged:?}");
    if transport == Transport::Socket {
        // The container's stdout and stderr are open to any command, through the engine's
        // init (`/proc/1/fd`). Over the socket they carry no protocol: answers forged there,
        // for every id this call could have, change nothing. (Over the attach stream they
        // would be read as the executor's: docs/security.md.)
        let forge = concat!(
            "for i in $(seq 1 100); do ",
            r#"echo "{\"id\":$i,\"ok\":true,\"exit_code\":0,\"timed_out\":false,\"stdout\":\"forged\",\"stderr\":\"\",\"stdout_omitted_bytes\":0,\"stderr_omitted_bytes\":0,\"duration_ms\":0}"; "#,
            "done | tee /proc/1/fd/1 > /proc/1/fd/2; echo real; exit 3",
        );
        let answered = fx.shell(forge).await;
        assert_eq!(answered, ToolOutput::error("real\n[exit code: 3]"));
    }
    assert_eq!(
        fx.sandbox.ping().await.unwrap(),
        nerve_hands::protocol::VERSION
    );
    fx.finish().await;
}

/// The containers Nerve created for the process `pid`, by their owner label.
fn containers_of(pid: u32) -> Vec<String> {
    crate::support::docker_cli(&[
        "ps",
        "-a",
        "--filter",
        "label=org.nerve.managed=true",
        "--format",
        "{{.ID}} {{.Label \"org.nerve.owner\"}}",
    ])
    .lines()
    .filter(|line| line.contains(&format!(":{pid}:")))
    .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
    .collect()
}

fn container_exists(id: &str) -> bool {
    crate::support::container_exists(id)
}

/// Writes a cassette of `lines` and returns the `--provider` spec for it.
fn cassette(dir: &Path, name: &str, lines: &[Value]) -> String {
    let path = dir.join(name);
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(&path, text).unwrap();
    format!("script:{}", path.display())
}

fn nerve_run(dir: &Path, provider: &str) -> Command {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let mut command = Command::new(nerve_bin());
    command
        .arg("--db")
        .arg(dir.join("nerve.db"))
        .args(["run", "--workspace"])
        .arg(&workspace)
        .args([
            "--task",
            "abuse the sandbox",
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
fn no_container_is_left_after_a_run_with_a_tool_timeout() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let provider = cassette(
        dir.path(),
        "timeout.jsonl",
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 60", "timeout_secs": 1}}]}),
            json!({"text": "It timed out, as expected."}),
        ],
    );
    let run = nerve_run(dir.path(), &provider).output().unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "completed");
    let id = result["execution_id"].as_str().unwrap();
    let left = crate::support::containers_of(id);
    assert!(left.is_empty(), "container left behind: {left:?}");
}

#[test]
fn the_container_of_a_killed_run_is_reaped_at_the_next_start() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let slow = cassette(
        dir.path(),
        "slow.jsonl",
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 600", "timeout_secs": 600}}]}),
        ],
    );
    let mut child: Child = nerve_run(dir.path(), &slow)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let started = Instant::now();
    let container = loop {
        if let Some(id) = containers_of(pid).into_iter().next() {
            break id;
        }
        assert!(
            started.elapsed() < LIVENESS && child.try_wait().unwrap().is_none(),
            "nerve run never started a sandbox"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let control = control_dir_of(&container);
    child.kill().unwrap(); // SIGKILL: no chance to clean up.
    child.wait().unwrap();
    // The container may already be going by itself (its executor stops when the host's
    // control connection closes, see `sandbox_env.rs`), or be reaped by another test's
    // `nerve` on this engine; the host's control directory stays until a start removes it.
    assert!(control.is_dir(), "{}", control.display());

    let quick = cassette(dir.path(), "quick.jsonl", &[json!({"text": "done"})]);
    let next = nerve_run(dir.path(), &quick).output().unwrap();
    assert!(next.status.success(), "{}", stderr(&next));
    assert!(
        !container_exists(&container),
        "the next start did not reap the killed run's container"
    );
    assert!(
        !control.exists(),
        "the next start did not remove the killed run's control directory"
    );
}

/// The host directory mounted at `/run/nerve-control` in `container`.
fn control_dir_of(container: &str) -> PathBuf {
    let format =
        r#"{{range .Mounts}}{{if eq .Destination "/run/nerve-control"}}{{.Source}}{{end}}{{end}}"#;
    let source = crate::support::docker_cli(&["inspect", "--format", format, container])
        .trim()
        .to_owned();
    assert!(!source.is_empty(), "{container} has no control directory");
    PathBuf::from(source)
}

/// `nerve run` on the demo cassette with `env`; its output and execution id (if any).
fn demo_run(dir: &Path, db: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let workspace = crate::support::copy_example("demo", &dir.join(db.file_stem().unwrap()));
    let root = crate::support::root();
    let task = root.join("examples/demo/task.txt");
    let script = format!(
        "script:{}",
        root.join("examples/demo/cassette.jsonl").display()
    );
    let mut args = vec![
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task-file",
        task.to_str().unwrap(),
        "--provider",
        &script,
        "--json",
    ];
    args.extend_from_slice(extra);
    crate::support::nerve_env(db, &args, env)
}

/// The `config.sandbox_executor` the `started` event of `db`'s one execution records.
fn recorded_executor(db: &Path, output: &std::process::Output) -> Value {
    let id = last_json(output)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = crate::support::events_json(db, &id);
    assert_eq!(events[0]["kind"], "started");
    events[0]["payload"]["config"]["sandbox_executor"].clone()
}

/// Issue 30: the `nerve` the build made carries its executor. With no `NERVE_EXECUTOR`
/// and an empty cache, a run writes it to the cache (content-addressed, executable) and
/// uses it; the `started` event says which file.
#[test]
fn a_built_nerve_carries_its_executor() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let db = dir.path().join("carried.db");
    let output = demo_run(
        dir.path(),
        &db,
        &[],
        &[
            ("NERVE_EXECUTOR", ""),
            ("XDG_CACHE_HOME", cache.to_str().unwrap()),
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        !stderr(&output).contains("falling back"),
        "{}",
        stderr(&output)
    );
    let executor = recorded_executor(&db, &output);
    assert_eq!(executor["mode"], "executor", "{executor}");
    let path = PathBuf::from(executor["path"].as_str().unwrap());
    assert!(
        path.starts_with(cache.join("nerve/executor")),
        "{}",
        path.display()
    );
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o755
    );
}

/// Without a usable executor `nerve run` refuses in one line naming the fixes and writes
/// nothing; `--sandbox-fallback per-call` (or `[sandbox] fallback = "per-call"`) runs
/// through per-call exec, which the `started` event records and `show` prints.
#[test]
fn without_an_executor_a_run_refuses_unless_the_fallback_is_allowed() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unusable = [("NERVE_EXECUTOR", "/bin/ls")];
    let db = dir.path().join("refused.db");
    let refused = demo_run(dir.path(), &db, &[], &unusable);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let line = stderr(&refused);
    assert_eq!(line.trim().lines().count(), 1, "{line}");
    assert!(
        line.contains("/bin/ls is not a static")
            && line.contains("NERVE_EXECUTOR")
            && line.contains("--sandbox-fallback per-call"),
        "{line}"
    );
    assert!(!db.exists(), "a refused run wrote a log");

    let config = dir.path().join("fallback.toml");
    std::fs::write(&config, "[sandbox]\nfallback = \"per-call\"\n").unwrap();
    let config = config.display().to_string();
    for (name, extra) in [
        ("flag", vec!["--sandbox-fallback", "per-call"]),
        ("config", vec![]),
    ] {
        let db = dir.path().join(format!("{name}.db"));
        let env: Vec<(&str, &str)> = if name == "config" {
            vec![unusable[0], ("NERVE_CONFIG", config.as_str())]
        } else {
            unusable.to_vec()
        };
        let output = demo_run(dir.path(), &db, &extra, &env);
        assert_eq!(output.status.code(), Some(0), "{name}: {}", stderr(&output));
        let executor = recorded_executor(&db, &output);
        assert_eq!(executor["mode"], "per_call", "{name}: {executor}");
        assert!(
            executor["reason"]
                .as_str()
                .unwrap()
                .contains("/bin/ls is not a static"),
            "{executor}"
        );
        let id = last_json(&output)["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let shown = stdout(&crate::support::nerve(&db, &["show", &id]));
        assert!(
            shown.contains("sandbox    per-call docker exec"),
            "{name}: {shown}"
        );
    }
}
