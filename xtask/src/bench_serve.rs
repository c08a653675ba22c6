//! `cargo xtask bench serve`: the release `nerve serve` under load on the loopback, bounded in
//! count and time. One scripted execution runs in the real sandbox (a tool call every
//! [`ANSWER_DELAY_MS`]); [`SSE_CLIENTS`] clients follow its event stream from the start while
//! `GET /api/v1/executions` and `GET /api/v1/executions/{id}` are sent, alternately, at
//! [`RATE`] requests a second for [`LOAD`] (open loop: each request leaves at its scheduled
//! time and its latency counts from then, so a slow server cannot hide its queue). Reported:
//! the GETs' p50/p99/max latency, the rate achieved and the failures; the server's CPU over
//! the load window (its utime + stime from `/proc`); and whether every stream client got
//! every event of the log exactly once, in order, up to the finish event. The load generator
//! shares the machine's cores with the server and the sandbox, so the figures are a floor of
//! what the server does alone.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// Clients following the execution's event stream at once.
const SSE_CLIENTS: usize = 200;
/// GET requests a second, list and show alternately.
const RATE: u64 = 1_000;
/// How long the GETs are sent.
const LOAD: Duration = Duration::from_secs(10);
/// The scripted model's answers (a tool call each, the last one the final answer) and the
/// delay before each: the execution runs longer than the load.
const ANSWERS: usize = 60;
const ANSWER_DELAY_MS: u64 = 250;
/// How long any one request or stream may take before it counts as failed.
const PATIENCE: Duration = Duration::from_secs(120);

pub(crate) fn bench() -> Result<()> {
    let executor = crate::image(false)?;
    crate::run(crate::cargo().args(["build", "--release", "--package", "nerve-cli"]))?;
    let nerve = crate::target_dir().join("release").join("nerve");
    let work = crate::target_dir().join("bench-serve");
    if work.exists() {
        std::fs::remove_dir_all(&work)
            .with_context(|| format!("cannot clear {}", work.display()))?;
    }
    let workspace = work.join("workspace");
    std::fs::create_dir_all(&workspace)?;
    std::fs::write(
        workspace.join("README"),
        "a workspace for the serve benchmark\n",
    )?;
    let db = work.join("nerve.db");
    let cassette = work.join("cassette.jsonl");
    std::fs::write(&cassette, cassette_text())?;

    let created = Command::new(&nerve)
        .arg("--db")
        .arg(&db)
        .args(["token", "create", "--name", "bench", "--scope", "admin"])
        .output()
        .context("cannot run nerve token create")?;
    if !created.status.success() {
        bail!(
            "nerve token create failed: {}",
            String::from_utf8_lossy(&created.stderr)
        );
    }
    let token = String::from_utf8(created.stdout)?.trim().to_owned();

    let mut server = Server::start(&nerve, &executor, &db, &work, &cassette)?;
    let addr = server.addr.clone();
    let load_before = crate::bench_e2e::load_average();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(drive(&addr, &token, &workspace, server.child.id()));
    server.stop();
    let outcome = outcome?;
    let events = Command::new(&nerve)
        .arg("--db")
        .arg(&db)
        .args(["events", &outcome.execution, "--json"])
        .output()
        .context("cannot run nerve events")?;
    let logged = serde_json::from_slice::<serde_json::Value>(&events.stdout)?
        .as_array()
        .map_or(0, Vec::len);
    report(&outcome, logged, &load_before);
    if outcome.streams_complete != SSE_CLIENTS || outcome.stream_events != logged {
        bail!(
            "{} of {SSE_CLIENTS} streams got every event exactly once (the log has {logged}, a stream {})",
            outcome.streams_complete,
            outcome.stream_events
        );
    }
    Ok(())
}

/// Tool calls that echo their number, then the final answer.
fn cassette_text() -> String {
    let mut lines = Vec::new();
    for n in 1..ANSWERS {
        lines.push(
            serde_json::json!({
                "text": format!("step {n}"),
                "tool_calls": [{"name": "shell", "arguments": {"command": format!("echo step {n}")}}],
                "delay_ms": ANSWER_DELAY_MS,
            })
            .to_string(),
        );
    }
    lines.push(serde_json::json!({ "text": "done", "delay_ms": ANSWER_DELAY_MS }).to_string());
    lines.join("\n")
}

/// The running `nerve serve`, stopped (SIGTERM, then killed) when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(
        nerve: &Path,
        executor: &Path,
        db: &Path,
        root: &Path,
        cassette: &Path,
    ) -> Result<Self> {
        let mut child = Command::new(nerve)
            .env(nerve_hands::EXECUTOR_ENV, executor)
            .env("NERVE_LOG", "warn")
            .arg("--db")
            .arg(db)
            .args(["serve", "--listen", "127.0.0.1:0", "--max-turns", "100"])
            .arg("--workspace-root")
            .arg(root)
            .arg("--provider")
            .arg(format!("script:{}", cassette.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start nerve serve")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        // Ends: at the line with the address, or when the server's stderr ends (it exited).
        let addr = loop {
            let Some(line) = lines.next() else {
                bail!("nerve serve exited before it listened");
            };
            if let Some(addr) = line?.split("listening on http://").nth(1) {
                break addr.trim().to_owned();
            }
        };
        // Its later lines go nowhere, but must be read for it never to block on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self { child, addr })
    }

    fn stop(&mut self) {
        // SIGTERM: it stops accepting and stops its executions at their next boundary.
        if let Some(pid) = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        // Ends: when the server has exited, or at the deadline (then it is killed).
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
    }
}

/// What the load saw.
#[derive(Debug)]
struct Outcome {
    execution: String,
    /// Each GET's latency (ms) from its scheduled start, successful ones.
    latencies_ms: Vec<f64>,
    failures: usize,
    sent: usize,
    load_s: f64,
    /// The server's CPU seconds over the load window.
    cpu_s: f64,
    /// Streams that got events 1..=N in order, ending with the finish event.
    streams_complete: usize,
    /// Events per complete stream (the same for all, or the first one's).
    stream_events: usize,
    /// Connected streams, when the load started.
    streams_open: usize,
}

async fn drive(addr: &str, token: &str, workspace: &Path, server_pid: u32) -> Result<Outcome> {
    let body = serde_json::json!({ "workspace": workspace, "task": "echo the steps" }).to_string();
    let (status, answer) = request(addr, "POST", "/api/v1/executions", token, Some(&body)).await?;
    if status != 201 {
        bail!("creating the execution: {status} {answer}");
    }
    let execution = serde_json::from_str::<serde_json::Value>(&answer)?["execution_id"]
        .as_str()
        .context("no execution_id")?
        .to_owned();

    let connected = Arc::new(tokio::sync::Semaphore::new(0));
    let mut streams = tokio::task::JoinSet::new();
    for _ in 0..SSE_CLIENTS {
        let (addr, token, execution) = (addr.to_owned(), token.to_owned(), execution.clone());
        let connected = Arc::clone(&connected);
        streams.spawn(async move {
            tokio::time::timeout(PATIENCE, follow(&addr, &token, &execution, &connected))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a stream took over {PATIENCE:?}")))
        });
    }
    // Every client connected (its response head read) before the load starts.
    let open = tokio::time::timeout(
        Duration::from_secs(30),
        connected.acquire_many(u32::try_from(SSE_CLIENTS)?),
    )
    .await
    .map(|permits| permits.map(|p| p.num_permits()).unwrap_or(0))
    .unwrap_or_else(|_| connected.available_permits());

    let cpu_before = cpu_seconds(server_pid)?;
    let started = tokio::time::Instant::now();
    let total = usize::try_from(RATE * LOAD.as_secs())?;
    let mut gets = tokio::task::JoinSet::new();
    let show = format!("/api/v1/executions/{execution}");
    // Ends: after `total` requests, one every 1/RATE s.
    for n in 0..total {
        let due = started + Duration::from_micros(1_000_000 / RATE * n as u64);
        tokio::time::sleep_until(due).await;
        let path = if n % 2 == 0 {
            "/api/v1/executions".to_owned()
        } else {
            show.clone()
        };
        let (addr, token) = (addr.to_owned(), token.to_owned());
        gets.spawn(async move {
            let answered =
                tokio::time::timeout(PATIENCE, request(&addr, "GET", &path, &token, None)).await;
            match answered {
                Ok(Ok((200, _))) => Some(due.elapsed().as_secs_f64() * 1000.0),
                Ok(Ok(_) | Err(_)) | Err(_) => None,
            }
        });
    }
    let mut latencies_ms = Vec::with_capacity(total);
    let mut failures = 0;
    // Ends: the set only shrinks, and each request has its time limit.
    while let Some(done) = gets.join_next().await {
        match done.ok().flatten() {
            Some(ms) => latencies_ms.push(ms),
            None => failures += 1,
        }
    }
    let load_s = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds(server_pid)? - cpu_before;

    let mut streams_complete = 0;
    let mut stream_events = 0;
    // Ends: the set only shrinks, and each stream has its time limit.
    while let Some(done) = streams.join_next().await {
        if let Ok(Ok(seen)) = done {
            streams_complete += 1;
            if stream_events == 0 {
                stream_events = seen;
            } else if seen != stream_events {
                bail!("streams got different event counts: {seen} and {stream_events}");
            }
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Outcome {
        execution,
        latencies_ms,
        failures,
        sent: total,
        load_s,
        cpu_s,
        streams_complete,
        stream_events,
        streams_open: open,
    })
}

/// One request with `Connection: close`: its status and body.
async fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&str>,
) -> Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status line")?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}

/// Follows the execution's stream from the start to its finish event; the number of
/// events, when they were 1..=N in order (an error otherwise).
async fn follow(
    addr: &str,
    token: &str,
    execution: &str,
    connected: &tokio::sync::Semaphore,
) -> Result<usize> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "GET /api/v1/executions/{execution}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await?;
    let mut lines = tokio::io::BufReader::new(stream).lines();
    let status = lines.next_line().await?.unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("the stream answered {status}");
    }
    connected.add_permits(1);
    let mut expected = 1u64;
    // Ends: at the finish event or the end of the stream (the caller's time limit bounds it).
    while let Some(line) = lines.next_line().await? {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let event: serde_json::Value = serde_json::from_str(data)?;
        if event["seq"].as_u64() != Some(expected) {
            bail!("event {} where {expected} was due", event["seq"]);
        }
        if event["kind"] == "finish" {
            return Ok(usize::try_from(expected)?);
        }
        expected += 1;
    }
    bail!(
        "the stream ended before the finish event (after {})",
        expected - 1
    )
}

/// The CPU time (user + system) process `pid` has used, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let mut stat = String::new();
    std::fs::File::open(format!("/proc/{pid}/stat"))?.read_to_string(&mut stat)?;
    // The fields after the command's closing parenthesis; utime and stime are the 12th and
    // 13th of them (14th and 15th of the line).
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields
        .get(11..13)
        .context("a short /proc stat line")?
        .iter()
        .map(|f| f.parse::<f64>().unwrap_or(0.0))
        .sum();
    let per_second = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0);
    Ok(ticks / per_second)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest rank.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn report(outcome: &Outcome, logged: usize, load_before: &str) {
    let ok = outcome.latencies_ms.len();
    #[allow(clippy::cast_precision_loss)]
    let rate = ok as f64 / outcome.load_s;
    let lines = [
        format!(
            "nerve serve, loopback: {SSE_CLIENTS} SSE clients on one running execution ({} connected before the load), GET list/show at {RATE}/s for {} s",
            outcome.streams_open,
            LOAD.as_secs()
        ),
        format!(
            "GETs: {ok} of {} answered 200 ({} failed), {rate:.0}/s achieved; latency from the scheduled start p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            outcome.sent,
            outcome.failures,
            percentile(&outcome.latencies_ms, 50.0),
            percentile(&outcome.latencies_ms, 99.0),
            outcome.latencies_ms.last().copied().unwrap_or(f64::NAN)
        ),
        format!(
            "server CPU over the load: {:.2} s in {:.2} s ({:.0}% of one core)",
            outcome.cpu_s,
            outcome.load_s,
            outcome.cpu_s / outcome.load_s * 100.0
        ),
        format!(
            "streams: {} of {SSE_CLIENTS} got all {} events exactly once, in order, to the finish (the log has {logged})",
            outcome.streams_complete, outcome.stream_events
        ),
        format!(
            "load average before: {load_before}; {}",
            crate::bench_e2e::machine_note()
        ),
    ];
    for line in lines {
        println!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&sorted, 50.0), 50.0);
        assert_eq!(percentile(&sorted, 99.0), 99.0);
        assert_eq!(percentile(&sorted, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
    }
}
