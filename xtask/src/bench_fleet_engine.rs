//! Part 4 of `cargo xtask bench fleet`: the fleet like for like with the anchor. The
//! runtime's worker (`nerve_runtime::worker::Worker`, as `nerve worker` runs it: claims,
//! leases, releases) running the real engine with the scripted provider and an in-process
//! `read_file` that returns 200 bytes at once (the anchor's Python tool does the same; a
//! bench harness may, a `nerve worker` never does: its tools run in the sandbox), on the
//! real `PgStore` log: 64 executions submitted, claimed by 4 OS processes (this xtask
//! binary again, `bench-fleet-process`) of 16 executions each, one `PgStore` per process
//! as a worker has.
//!
//! What a `nerve worker` does and this does not: start a sandbox per execution (its
//! runner here is in process), send each tool call into it, serve the auth proxy, and
//! renew the leases in time (they are taken long enough here that no renewal comes due).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use async_trait::async_trait;
use nerve_brain::{AgentEngine, EngineConfig, ScriptedProvider, Task};
use nerve_core::testing::CannedTools;
use nerve_core::{
    Enqueued, Event, EventSink, ExecutionId, Redactor, SinkError, Snapshot, TaskId, TaskStatus,
    TerminationReason, ToolDefinition,
};
use nerve_runtime::queue::Claim;
use nerve_runtime::worker::{Handled, Outcome, Quiet, Runner, Worker};
use nerve_session::{EventStore as _, PgStore};
use tokio_util::sync::CancellationToken;

/// Long enough that no lease needs renewing during a measurement.
const LEASE: Duration = Duration::from_secs(600);

pub(crate) struct EngineFleet {
    pub(crate) turns_per_s: f64,
    /// A batch's wait from being handed to the log to durable, p50 and p99.
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) batches: usize,
}

/// Kills the processes when the measurement ends early (an error).
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Submits `executions` to the queue at `url`, starts `processes` processes that claim them
/// and, once every one has claimed its share, runs them all at once.
pub(crate) fn run(
    runtime: &tokio::runtime::Runtime,
    url: &str,
    executions: usize,
    turns: usize,
    processes: usize,
) -> Result<EngineFleet> {
    let store = runtime.block_on(PgStore::connect(url, Arc::new(Redactor::new())))?;
    let ids: Vec<ExecutionId> = (0..executions).map(|_| ExecutionId::new()).collect();
    runtime.block_on(async {
        for id in &ids {
            store
                .submit(*id, &serde_json::json!({"bench": "fleet"}))
                .await?;
        }
        anyhow::Ok(())
    })?;
    let exe = std::env::current_exe().context("cannot locate this xtask binary")?;
    let mut children = Processes(Vec::new());
    let mut pipes: Vec<(ChildStdin, BufReader<ChildStdout>)> = Vec::new();
    for p in 0..processes {
        let share = executions / processes + usize::from(p < executions % processes);
        let mut child = Command::new(&exe)
            .args([
                "bench-fleet-process",
                url,
                &share.to_string(),
                &turns.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start a bench process")?;
        let stdin = child.stdin.take().context("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        children.0.push(child);
        pipes.push((stdin, stdout));
    }
    // Every process connected and claimed its executions before the clock starts.
    for (_, stdout) in &mut pipes {
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        if line.trim() != "ready" {
            bail!("a bench process did not get ready: {line:?}");
        }
    }
    for (stdin, _) in &mut pipes {
        stdin.write_all(b"go\n")?;
        stdin.flush()?;
    }
    let (mut begin, mut end) = (f64::MAX, f64::MIN);
    let mut latencies = Vec::new();
    let mut done = 0;
    for (_, stdout) in &mut pipes {
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let field = |key: &str| -> Result<&str> {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
                .with_context(|| format!("a bench process said {line:?}"))
        };
        begin = begin.min(field("start")?.parse()?);
        end = end.max(field("end")?.parse()?);
        done += field("turns")?.parse::<usize>()?;
        for v in field("latencies_ms")?.split(',').filter(|v| !v.is_empty()) {
            latencies.push(v.parse::<f64>()?);
        }
    }
    // The measured window, for lining a profile up with it (`perf record -k CLOCK_REALTIME`).
    eprintln!("engine fleet window: {begin:.6} to {end:.6} (seconds since the epoch)");
    for child in &mut children.0 {
        let status = child.wait()?;
        if !status.success() {
            bail!("a bench process failed: {status}");
        }
    }
    children.0.clear();
    if done != executions * turns {
        bail!(
            "the engine fleet ran {done} tool turns, not {}",
            executions * turns
        );
    }
    // Every execution's log is whole: its chain verifies and it completed every turn.
    runtime.block_on(async {
        for id in &ids {
            if let Err(error) = store.verify(*id).await? {
                bail!("the log of {id} does not verify: {error}");
            }
            let replay = store.replay(*id).await?;
            if replay.termination_reason != Some(TerminationReason::Completed)
                || replay.total_turns as usize != turns + 1
            {
                bail!(
                    "the log of {id} ended {:?} after {} turns",
                    replay.termination_reason,
                    replay.total_turns
                );
            }
        }
        anyhow::Ok(())
    })?;
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    Ok(EngineFleet {
        turns_per_s: done as f64 / (end - begin),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        batches: latencies.len(),
    })
}

/// One of the processes: `bench-fleet-process URL EXECUTIONS TURNS`. Claims its executions
/// as the runtime's worker, says `ready`, waits for `go` on stdin, has the worker handle them
/// all at once (each under its lease, released at its end), and prints one line with its
/// start and end (seconds since the epoch), the tool turns run and every batch's wait.
pub(crate) fn process(args: &[String]) -> Result<()> {
    let [url, executions, turns] = args else {
        bail!("usage: xtask bench-fleet-process URL EXECUTIONS TURNS");
    };
    let executions: usize = executions.parse()?;
    let turns: usize = turns.parse()?;
    // As `nerve worker`'s runtime: tokio's multi-threaded default.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Arc::new(PgStore::connect(url, Arc::new(Redactor::new())).await?);
        let latencies = Arc::new(Mutex::new(Vec::new()));
        let runner = InProcess {
            script: cassette(turns),
            max_turns: u32::try_from(turns + 1).unwrap_or(u32::MAX),
            latencies: Arc::clone(&latencies),
        };
        let worker = Arc::new(Worker::new(
            format!("bench:{}", std::process::id()),
            store,
            LEASE,
            Arc::new(runner),
            Arc::new(Quiet),
            None,
        ));
        let mut claimed = Vec::new();
        // Ends: after `executions` claims, or when the queue runs out (an error).
        while claimed.len() < executions {
            let claim = worker
                .claim()
                .await?
                .context("the queue ran out of executions")?;
            claimed.push(claim);
        }
        println!("ready");
        let mut go = String::new();
        std::io::stdin().read_line(&mut go)?;
        let start = now();
        let mut runs = tokio::task::JoinSet::new();
        for claim in claimed {
            runs.spawn(Arc::clone(&worker).handle(claim, CancellationToken::new()));
        }
        let mut done = 0;
        // Ends: every handled execution is joined once.
        while let Some(handled) = runs.join_next().await {
            let handled = handled?;
            // Tool turns: every turn but the answering one.
            if let Handled::Released(Outcome::Ended(TerminationReason::Completed, turns)) = handled
            {
                done += turns.saturating_sub(1) as usize;
            } else {
                bail!("an execution was handled as {handled:?}");
            }
        }
        let end = now();
        let latencies = latencies
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .iter()
            .map(|ms| format!("{ms:.3}"))
            .collect::<Vec<_>>()
            .join(",");
        println!(
            "engine-fleet start={start:.6} end={end:.6} turns={done} latencies_ms={latencies}"
        );
        anyhow::Ok(())
    })
}

/// The worker's runner here: the engine in process, with the scripted provider, the
/// in-process `read_file` and the log behind [`TimedSink`].
struct InProcess {
    script: String,
    max_turns: u32,
    latencies: Arc<Mutex<Vec<f64>>>,
}

#[async_trait]
impl Runner for InProcess {
    async fn run(&self, worker: &Worker, claim: &Claim, cancel: CancellationToken) -> Outcome {
        let provider = match ScriptedProvider::parse("bench", &self.script) {
            Ok(provider) => provider,
            Err(error) => return Outcome::Failed(error.to_string()),
        };
        let sink = Arc::new(TimedSink {
            log: Arc::clone(worker.store()),
            latencies: Arc::clone(&self.latencies),
        });
        let config = EngineConfig {
            max_turns: self.max_turns,
            ..EngineConfig::default()
        };
        let engine = AgentEngine::new(Arc::new(provider), Arc::new(read_file()), sink, config);
        let task = Task {
            id: TaskId::new(),
            description: "Read every file.".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/workspace".into(),
        };
        match engine.run(claim.execution_id, task, cancel).await {
            Ok(result) => Outcome::Ended(result.termination_reason, result.context.turn_count()),
            Err(error) => Outcome::Failed(error.to_string()),
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `turns` tool turns, each reading a different file (as the anchor's script), then an
/// answer: the cassette of part 2's `nerve submit` too.
pub(crate) fn cassette(turns: usize) -> String {
    let mut lines: Vec<String> = (0..turns)
        .map(|i| {
            format!(
                r#"{{"text": "step {i}", "tool_calls": [{{"name": "read_file", "arguments": {{"path": "f{i}.txt"}}}}], "usage": {{"input_tokens": 100, "output_tokens": 10}}}}"#
            )
        })
        .collect();
    lines.push(r#"{"text": "done", "usage": {"input_tokens": 100, "output_tokens": 10}}"#.into());
    lines.push(String::new());
    lines.join("\n")
}

/// The anchor's tool: 200 bytes, at once, in process.
fn read_file() -> CannedTools {
    CannedTools {
        definitions: vec![ToolDefinition {
            name: "read_file".into(),
            description: "Read a file.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            }),
        }],
        output: "x".repeat(200),
    }
}

/// The log, timing each batch from being handed over to durable (the anchor times each
/// checkpoint write the same way).
struct TimedSink {
    log: Arc<PgStore>,
    latencies: Arc<Mutex<Vec<f64>>>,
}

fn record(latencies: &Mutex<Vec<f64>>, since: Instant) {
    if let Ok(mut all) = latencies.lock() {
        all.push(since.elapsed().as_secs_f64() * 1e3);
    }
}

#[async_trait]
impl EventSink for TimedSink {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let t0 = Instant::now();
        let seq = self.log.append(execution, event).await;
        record(&self.latencies, t0);
        seq
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        let t0 = Instant::now();
        let seq = self.log.checkpoint(execution, turn, snapshot).await;
        record(&self.latencies, t0);
        seq
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        let t0 = Instant::now();
        let seq = self.log.commit(execution, events, checkpoint).await;
        record(&self.latencies, t0);
        seq
    }

    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        let t0 = Instant::now();
        match self.log.enqueue(execution, events, checkpoint) {
            Enqueued::Placed(pending) => {
                let latencies = Arc::clone(&self.latencies);
                Enqueued::Placed(Box::pin(async move {
                    let seq = pending.await;
                    record(&latencies, t0);
                    seq
                }))
            }
            deferred @ Enqueued::Deferred { .. } => deferred,
        }
    }
}
