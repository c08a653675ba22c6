//! `cargo xtask bench sandbox`: the sandbox's tool round trip and cold start, as ratios
//! against anchors measured in the same run, on the same machine, in the same container.
//!
//! - Round trip of a cheap tool (`shell` running `echo ok`, and `read_file`) through the
//!   persistent executor, over its control socket and over the engine's attach stream (two
//!   sandboxes side by side), against a bare `docker exec -i` pipe to `/bin/sh` in the
//!   first container (one attached exec reading commands from stdin and echoing a marker),
//!   and against per-call `docker exec` (the fallback path). Samples are interleaved so that
//!   noise from the shared machine hits every contender alike.
//! - Cold start: `Sandbox::start` (create, bind the control socket or attach, start, the
//!   executor's first ping), over either transport, against the raw Engine API create + start of the same image with the same host config
//!   (an idle `sleep` as the main process).
//!
//! A custom harness (`harness = false`) rather than divan: the targets are p50 and p99 ratios
//! between contenders sampled alternately, which a per-function harness does not report.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A report for people.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures_util::StreamExt;
use nerve_core::{ExecutionId, ToolCall, ToolCallId, ToolExecutor};
use nerve_hands::protocol::ExecRequest;
use nerve_hands::{
    Backend, CONTAINER_EXECUTOR_PATH, Sandbox, SandboxConfig, SandboxTools, Transport,
};
use tokio::io::AsyncWriteExt;

const ROUND_TRIPS: usize = 400;
const PER_CALL_TRIPS: usize = 100;
const WARMUP: usize = 30;
const COLD_STARTS: usize = 15;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let docker = match nerve_hands::connect_docker().await {
            Ok(docker) => docker,
            Err(e) => return println!("sandbox bench skipped: {e}"),
        };
        if !nerve_hands::image_exists(&docker, nerve_hands::DEFAULT_IMAGE)
            .await
            .unwrap()
        {
            return println!("sandbox bench skipped: no image; run `cargo xtask image`");
        }
        if nerve_hands::locate_executor().is_none() {
            return println!("sandbox bench skipped: no executor; run `cargo xtask image`");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("hello.txt"), "hello\n").unwrap();
        round_trips(&docker, dir.path()).await;
        cold_starts(&docker, dir.path()).await;
        image_cold_starts(&docker, dir.path()).await;
    });
}

/// Cold start of a sandbox in the Debian Python image (made with debootstrap, ~200 MB)
/// against the default busybox image (~2 MB): the same `Sandbox::start`, alternated.
async fn image_cold_starts(docker: &Docker, workspace: &std::path::Path) {
    let python =
        nerve_hands::ensure_debian_image(docker, &nerve_hands::DebianImage::python(), None)
            .await
            .expect("the Debian Python image (debootstrap on first use)")
            .tag;
    let mut default = Vec::new();
    let mut debian = Vec::new();
    for _ in 0..COLD_STARTS + 2 {
        for (image, samples) in [
            (nerve_hands::DEFAULT_IMAGE, &mut default),
            (python.as_str(), &mut debian),
        ] {
            let config = SandboxConfig::new(image, workspace, ExecutionId::new());
            let t = Instant::now();
            let sandbox = Sandbox::start(docker.clone(), &config).await.unwrap();
            samples.push(t.elapsed());
            assert_eq!(sandbox.backend().await, Backend::Executor);
            sandbox.remove().await.unwrap();
            nerve_hands::discard_sandbox_home(None, config.execution_id).unwrap();
        }
    }
    let mut default = default.split_off(2);
    let mut debian = debian.split_off(2);
    let anchor = Stats::of(&mut default);
    println!("\n## cold start by image ({COLD_STARTS} samples each, alternated)\n");
    println!("| contender | p50 | p99 | p50 ratio | p99 ratio |");
    println!("|---|---|---|---|---|");
    anchor.row(
        &format!(
            "`Sandbox::start`, default image `{}` (anchor)",
            nerve_hands::DEFAULT_IMAGE
        ),
        &anchor,
    );
    Stats::of(&mut debian).row(
        &format!("`Sandbox::start`, Debian Python image `{python}`"),
        &anchor,
    );
}

/// A sandbox whose executor talks over `transport`.
async fn start(docker: &Docker, workspace: &std::path::Path, transport: Transport) -> Sandbox {
    let config = SandboxConfig {
        transport,
        ..SandboxConfig::new(nerve_hands::DEFAULT_IMAGE, workspace, ExecutionId::new())
    };
    let sandbox = Sandbox::start(docker.clone(), &config).await.unwrap();
    assert_eq!(sandbox.backend().await, Backend::Executor);
    assert_eq!(sandbox.transport().await, Some(transport));
    sandbox
}

async fn round_trips(docker: &Docker, workspace: &std::path::Path) {
    let sandbox = Arc::new(start(docker, workspace, Transport::Socket).await);
    let tools = SandboxTools::new(Arc::clone(&sandbox));
    let attached = Arc::new(start(docker, workspace, Transport::Attach).await);
    let attached_tools = SandboxTools::new(Arc::clone(&attached));
    let mut pipe = ShellPipe::open(docker, sandbox.container_id()).await;
    let shell_call = ToolCall {
        id: ToolCallId("bench".to_owned()),
        name: "shell".to_owned(),
        arguments: serde_json::json!({"command": "echo ok"}),
    };
    let read_call = ToolCall {
        id: ToolCallId("bench".to_owned()),
        name: "read_file".to_owned(),
        arguments: serde_json::json!({"path": "hello.txt"}),
    };
    let per_call_request = ExecRequest {
        command: "echo ok".to_owned(),
        workdir: None,
        timeout_ms: 60_000,
        max_output_bytes: 32 * 1024,
        env: Default::default(),
        interrupt_grace_ms: None,
    };

    let mut shell = Vec::new();
    let mut read = Vec::new();
    let mut attached_shell = Vec::new();
    let mut attached_read = Vec::new();
    let mut bare = Vec::new();
    let mut bare_child = Vec::new();
    let mut per_call = Vec::new();
    for round in 0..WARMUP + ROUND_TRIPS {
        let keep = round >= WARMUP;
        for (tools, call, expected, samples) in [
            (&tools, &shell_call, "ok\n[exit code: 0]", &mut shell),
            (&tools, &read_call, "hello\n", &mut read),
            (
                &attached_tools,
                &shell_call,
                "ok\n[exit code: 0]",
                &mut attached_shell,
            ),
            (&attached_tools, &read_call, "hello\n", &mut attached_read),
        ] {
            let t = Instant::now();
            let out = tools.execute(call).await.unwrap();
            let elapsed = t.elapsed();
            assert_eq!(out.content, expected);
            if keep {
                samples.push(elapsed);
            }
        }

        let t = Instant::now();
        pipe.run("echo ok").await;
        if keep {
            bare.push(t.elapsed());
        }

        // The same work as the executor's `exec`: a child shell per command.
        let t = Instant::now();
        pipe.run("/bin/sh -c 'echo ok'").await;
        if keep {
            bare_child.push(t.elapsed());
        }

        if keep && round - WARMUP < PER_CALL_TRIPS {
            let t = Instant::now();
            let out = sandbox
                .exec_per_call(&per_call_request)
                .await
                .unwrap()
                .unwrap();
            per_call.push(t.elapsed());
            assert_eq!(out.stdout, "ok\n");
        }
    }
    sandbox.remove().await.unwrap();
    attached.remove().await.unwrap();

    let bare_stats = Stats::of(&mut bare);
    println!(
        "\n## tool round trip ({ROUND_TRIPS} samples each, interleaved; per-call exec {PER_CALL_TRIPS})\n"
    );
    println!("| contender | p50 | p99 | p50 ratio | p99 ratio |");
    println!("|---|---|---|---|---|");
    for (name, samples) in [
        (
            "bare `docker exec -i` pipe to sh, builtin `echo` (anchor)",
            &mut bare,
        ),
        (
            "bare pipe, `sh -c 'echo ok'` child per command",
            &mut bare_child,
        ),
        (
            "executor, control socket: `shell` tool, `echo ok`",
            &mut shell,
        ),
        ("executor, control socket: `read_file` tool", &mut read),
        (
            "executor, attach stream: `shell` tool, `echo ok`",
            &mut attached_shell,
        ),
        (
            "executor, attach stream: `read_file` tool",
            &mut attached_read,
        ),
        ("per-call `docker exec`, `echo ok`", &mut per_call),
    ] {
        Stats::of(samples).row(name, &bare_stats);
    }
}

async fn cold_starts(docker: &Docker, workspace: &std::path::Path) {
    let executor = nerve_hands::locate_executor().unwrap();
    let mut ours = Vec::new();
    let mut attached = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..COLD_STARTS + 2 {
        for (transport, samples) in [
            (Transport::Socket, &mut ours),
            (Transport::Attach, &mut attached),
        ] {
            let t = Instant::now();
            let sandbox = start(docker, workspace, transport).await;
            samples.push(t.elapsed());
            sandbox.remove().await.unwrap();
        }

        let body = raw_body(workspace, &executor);
        let t = Instant::now();
        let created = docker
            .create_container(
                None::<bollard::query_parameters::CreateContainerOptions>,
                body,
            )
            .await
            .unwrap();
        docker.start_container(&created.id, None).await.unwrap();
        raw.push(t.elapsed());
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        docker
            .remove_container(&created.id, Some(options))
            .await
            .unwrap();
    }
    // The first two of each warm the engine's caches.
    let mut ours = ours.split_off(2);
    let mut attached = attached.split_off(2);
    let mut raw = raw.split_off(2);
    let raw_stats = Stats::of(&mut raw);
    println!("\n## cold start ({COLD_STARTS} samples each, alternated)\n");
    println!("| contender | p50 | p99 | p50 ratio | p99 ratio |");
    println!("|---|---|---|---|---|");
    raw_stats.row("raw Engine API create + start (anchor)", &raw_stats);
    Stats::of(&mut ours).row(
        "`Sandbox::start`, control socket: create + bind + attach stderr + start + accept + first ping",
        &raw_stats,
    );
    Stats::of(&mut attached).row(
        "`Sandbox::start`, attach stream: create + attach + start + first ping",
        &raw_stats,
    );
}

/// The same container `Sandbox::start` creates, through the raw API.
fn raw_body(workspace: &std::path::Path, executor: &std::path::Path) -> ContainerCreateBody {
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value),
        hard: Some(value),
    };
    ContainerCreateBody {
        image: Some(nerve_hands::DEFAULT_IMAGE.to_owned()),
        entrypoint: Some(Vec::new()),
        cmd: Some(vec!["/bin/sleep".to_owned(), "2147483647".to_owned()]),
        working_dir: Some("/workspace".to_owned()),
        labels: Some(HashMap::from([(
            "org.nerve.bench".to_owned(),
            "true".to_owned(),
        )])),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            binds: Some(vec![
                format!("{}:/workspace:rw", workspace.display()),
                format!("{}:{CONTAINER_EXECUTOR_PATH}:ro", executor.display()),
            ]),
            network_mode: Some("none".to_owned()),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                "rw,nosuid,nodev,noexec,size=67108864".to_owned(),
            )])),
            pids_limit: Some(256),
            memory: Some(512 << 20),
            memory_swap: Some(512 << 20),
            nano_cpus: Some(1_000_000_000),
            ulimits: Some(vec![ulimit("fsize", 256 << 20), ulimit("nofile", 4096)]),
            init: Some(true),
            ipc_mode: Some("private".to_owned()),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_owned()),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One attached `docker exec -i /bin/sh` reading commands from stdin.
struct ShellPipe {
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    output: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
    >,
    buffer: Vec<u8>,
}

impl ShellPipe {
    async fn open(docker: &Docker, container: &str) -> Self {
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    cmd: Some(vec!["/bin/sh"]),
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    working_dir: Some("/workspace"),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        let StartExecResults::Attached { output, input } =
            docker.start_exec(&exec.id, None).await.unwrap()
        else {
            panic!("detached");
        };
        Self {
            input,
            output,
            buffer: Vec::new(),
        }
    }

    /// Runs `command` and waits for the marker echoed after it.
    async fn run(&mut self, command: &str) {
        const MARKER: &[u8] = b"__nerve_bench_done__\n";
        self.input
            .write_all(format!("{command}; echo __nerve_bench_done__\n").as_bytes())
            .await
            .unwrap();
        self.input.flush().await.unwrap();
        loop {
            if self.buffer.ends_with(MARKER) {
                self.buffer.clear();
                return;
            }
            match self.output.next().await.unwrap().unwrap() {
                LogOutput::StdOut { message } | LogOutput::Console { message } => {
                    self.buffer.extend_from_slice(&message);
                }
                LogOutput::StdErr { message } => panic!("{}", String::from_utf8_lossy(&message)),
                LogOutput::StdIn { .. } => {}
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    p50: Duration,
    p99: Duration,
}

impl Stats {
    fn of(samples: &mut [Duration]) -> Self {
        samples.sort();
        let at = |q: f64| {
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[index]
        };
        Self {
            p50: at(0.50),
            p99: at(0.99),
        }
    }

    fn row(&self, name: &str, anchor: &Stats) {
        println!(
            "| {name} | {:.3} ms | {:.3} ms | {:.2}x | {:.2}x |",
            self.p50.as_secs_f64() * 1e3,
            self.p99.as_secs_f64() * 1e3,
            self.p50.as_secs_f64() / anchor.p50.as_secs_f64(),
            self.p99.as_secs_f64() / anchor.p99.as_secs_f64(),
        );
    }
}
