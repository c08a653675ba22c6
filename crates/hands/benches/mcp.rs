//! `cargo xtask bench mcp`: an MCP tool call's round trip to a server inside the sandbox
//! (the executor's `spawn`, stdio on a one-off unix socket) against the same server driven
//! directly over a host pipe (the same client, `trust = "host"`), and a server's start cost
//! (spawn, Python start-up, handshake, `tools/list`) both ways. Samples are interleaved so
//! that noise from the shared machine hits both alike.
//!
//! Needs the engine, the executor and the image `nerve-mcp-python:latest` with
//! `mcp-server-time` (built by the e2e tests, `tests/e2e/mcp.rs`), and a host virtualenv with
//! the same server at `~/.cache/nerve/mcp-host-venv` (made by the same tests).

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)] // A report for people.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nerve_core::{ExecutionId, ToolCall, ToolCallId, ToolExecutor};
use nerve_hands::mcp::{McpServerConfig, McpServerSpec, McpTools, ToolFilter, Trust};
use nerve_hands::{Sandbox, SandboxConfig, SandboxTools};

const IMAGE: &str = "nerve-mcp-python:latest";
const ROUND_TRIPS: usize = 300;
const WARMUP: usize = 20;
const STARTS: usize = 5;

fn spec(name: &str, command: String, trust: Trust) -> McpServerSpec {
    McpServerSpec {
        config: McpServerConfig {
            name: name.to_owned(),
            command: Some(command),
            args: vec!["--local-timezone".to_owned(), "UTC".to_owned()],
            url: None,
            env: Vec::new(),
            tools: ToolFilter::default(),
            timeout_secs: None,
            trust,
        },
        env: BTreeMap::new(),
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn start(
    inner: &Arc<SandboxTools>,
    sandbox: &Arc<Sandbox>,
    server: McpServerSpec,
) -> (McpTools, Duration) {
    let began = Instant::now();
    let tools = McpTools::start(
        Arc::clone(inner) as Arc<dyn ToolExecutor>,
        vec![server],
        Some(Arc::clone(sandbox)),
        None,
    )
    .await;
    let took = began.elapsed();
    let report = &tools.reports()[0];
    assert_eq!(report.error, None, "{report:?}");
    (tools, took)
}

async fn call(tools: &McpTools, name: &str) -> Duration {
    let call = ToolCall {
        id: ToolCallId("bench".to_owned()),
        name: name.to_owned(),
        arguments: serde_json::json!({"timezone": "UTC"}),
    };
    let began = Instant::now();
    let output = tools.execute(&call).await.unwrap();
    let took = began.elapsed();
    assert!(!output.is_error, "{output:?}");
    took
}

fn main() {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap();
    let host_server = home.join(".cache/nerve/mcp-host-venv/bin/mcp-server-time");
    assert!(
        host_server.exists(),
        "{} is missing: run `cargo test -p nerve-tests --test e2e mcp::` first",
        host_server.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let workspace = tempfile::Builder::new().prefix("mcp-bench-").tempdir().unwrap();
        let docker = nerve_hands::connect_docker().await.unwrap();
        let config = SandboxConfig::new(IMAGE, workspace.path(), ExecutionId::new());
        let sandbox = Arc::new(Sandbox::start(docker, &config).await.unwrap());
        let inner = Arc::new(SandboxTools::new(Arc::clone(&sandbox)));
        let inside = || spec("inside", "mcp-server-time".to_owned(), Trust::Sandbox);
        let host = || spec("host", host_server.display().to_string(), Trust::Host);

        let (mut start_inside, mut start_host) = (Vec::new(), Vec::new());
        for _ in 0..STARTS {
            let (tools, took) = start(&inner, &sandbox, inside()).await;
            start_inside.push(took);
            tools.shutdown().await;
            let (tools, took) = start(&inner, &sandbox, host()).await;
            start_host.push(took);
            tools.shutdown().await;
        }

        let (a, _) = start(&inner, &sandbox, inside()).await;
        let (b, _) = start(&inner, &sandbox, host()).await;
        for _ in 0..WARMUP {
            call(&a, "inside__get_current_time").await;
            call(&b, "host__get_current_time").await;
        }
        let (mut trip_inside, mut trip_host) = (Vec::new(), Vec::new());
        for _ in 0..ROUND_TRIPS {
            trip_inside.push(call(&a, "inside__get_current_time").await);
            trip_host.push(call(&b, "host__get_current_time").await);
        }
        a.shutdown().await;
        b.shutdown().await;
        sandbox.remove().await.unwrap();

        let row = |what: &str, inside: &mut Vec<Duration>, host: &mut Vec<Duration>| {
            let (i50, h50) = (percentile(inside, 0.5), percentile(host, 0.5));
            let (i99, h99) = (percentile(inside, 0.99), percentile(host, 0.99));
            println!(
                "{what:<28} sandbox p50 {:>8.3} ms p99 {:>8.3} ms | host pipe p50 {:>8.3} ms p99 {:>8.3} ms | ratio p50 {:.2}x p99 {:.2}x",
                ms(i50),
                ms(i99),
                ms(h50),
                ms(h99),
                ms(i50) / ms(h50),
                ms(i99) / ms(h99)
            );
        };
        println!("MCP (mcp-server-time get_current_time), {ROUND_TRIPS} round trips, {STARTS} starts, interleaved");
        row("round trip", &mut trip_inside, &mut trip_host);
        row("start (spawn..tools/list)", &mut start_inside, &mut start_host);
    });
}
