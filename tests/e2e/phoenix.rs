//! Arize Phoenix, the trace backend the tracing test exports to: installed from PyPI into a
//! virtual environment cached under `~/.cache/nerve/` (created when missing), started with
//! `phoenix serve` on free loopback ports with its working directory in a temp dir, and
//! read back through its REST API (`GET /v1/projects/{project}/spans`).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Phoenix release the tests run against (`cargo xtask ci` installs the same).
pub(crate) const PHOENIX_VERSION: &str = "20.26.1";

/// How long Phoenix may take to answer after `phoenix serve` (it imports a lot and runs
/// its migrations first: one to two minutes on an idle two-core machine, over five while
/// release builds share it).
const STARTUP: Duration = Duration::from_secs(900);

/// The virtual environment: `$NERVE_PHOENIX_VENV`, else `~/.cache/nerve/phoenix-<version>`.
pub(crate) fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("NERVE_PHOENIX_VENV").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    crate::support::nerve_cache(&format!("phoenix-{PHOENIX_VERSION}"))
}

/// The `phoenix` executable, installing it first when the venv is missing or incomplete.
/// `Err` says why it cannot be had.
fn phoenix_executable() -> Result<PathBuf, String> {
    crate::support::python_venv(
        &venv_dir(),
        &format!("arize-phoenix=={PHOENIX_VERSION}"),
        "phoenix",
    )
}

/// A free loopback port (bound, then released for Phoenix to take).
pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A running `phoenix serve`, killed when dropped.
pub(crate) struct Phoenix {
    child: Child,
    pub(crate) port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Phoenix {
    /// Starts Phoenix and waits until it answers. Panics when it cannot: the caller decides
    /// beforehand whether the test may run at all.
    pub(crate) fn start() -> Self {
        let phoenix = match phoenix_executable() {
            Ok(phoenix) => phoenix,
            Err(reason) => panic!("Arize Phoenix cannot be installed: {reason}"),
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = dir.path().join("phoenix.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(phoenix)
            .arg("serve")
            .current_dir(dir.path())
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            // No usage reports from a test: the machine has no way out anyway.
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env_remove("PHOENIX_SQL_DATABASE_URL")
            .env_remove("PHOENIX_COLLECTOR_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut phoenix = Self {
            child,
            port,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = phoenix.child.try_wait().unwrap() {
                panic!(
                    "phoenix serve exited ({status}) before answering:\n{}",
                    phoenix.log_tail()
                );
            }
            if phoenix
                .get("/healthz")
                .is_ok_and(|(status, _)| status == 200)
            {
                return phoenix;
            }
            assert!(
                Instant::now() < deadline,
                "phoenix serve did not answer within {STARTUP:?}:\n{}",
                phoenix.log_tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The OTLP/HTTP endpoint for `OTEL_EXPORTER_OTLP_ENDPOINT` (Phoenix serves `/v1/traces`).
    pub(crate) fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `GET path` over HTTP/1.0 on the loopback: the status and the body.
    fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAccept: application/json\r\n\r\n",
            self.port
        )?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_owned()))
    }

    /// Every span of `project` Phoenix has stored (an empty list while it has none).
    pub(crate) fn spans(&self, project: &str) -> Vec<serde_json::Value> {
        let mut spans = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/projects/{project}/spans?limit=1000");
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={cursor}"));
            }
            let (status, body) = self.get(&path).unwrap();
            if status == 404 {
                return Vec::new(); // the project appears with its first span
            }
            assert_eq!(status, 200, "GET {path}: {body}");
            let page: serde_json::Value = serde_json::from_str(&body).unwrap();
            spans.extend(page["data"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return spans,
            }
        }
    }

    /// Polls `project` until `done` holds for its spans, within `patience`.
    pub(crate) fn wait_for_spans(
        &self,
        project: &str,
        patience: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + patience;
        loop {
            let spans = self.spans(project);
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "Phoenix did not show the expected spans of {project} within {patience:?}; it has {}:\n{}",
                spans.len(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the tracing test can run: it needs python3 to install Phoenix. Panics when it
/// must run (`NERVE_REQUIRE_DOCKER=1`, as in CI).
pub(crate) fn phoenix_available() -> bool {
    let python = Command::new("python3")
        .args(["-c", "import venv"])
        .output()
        .is_ok_and(|o| o.status.success());
    if python || venv_dir().join(".nerve-complete").exists() {
        return true;
    }
    let reason = "no python3 with venv to install Arize Phoenix";
    assert!(
        !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
        "{reason} (required: NERVE_REQUIRE_DOCKER=1)"
    );
    eprintln!("skipping: {reason}");
    false
}

/// Reads an attribute from a span as Phoenix returns it: flat dotted keys or nested maps.
pub(crate) fn attribute<'a>(
    span: &'a serde_json::Value,
    key: &str,
) -> Option<&'a serde_json::Value> {
    let attributes = &span["attributes"];
    if let Some(value) = attributes.get(key) {
        return Some(value);
    }
    key.split('.')
        .try_fold(attributes, |node, part| node.get(part))
}
