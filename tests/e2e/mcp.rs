//! MCP tools against real servers from the Python package index (`mcp-server-time`,
//! `mcp-server-git`, `mcp-server-fetch`), run inside a real sandbox whose image has Python
//! (built here from Debian packages and wheels, no registry), and one on the host with
//! `trust = "host"`; `mcp-server-fetch` reaches a site on the host's loopback only through a
//! proxy rule. Faults use a small server on the official Python SDK that crashes, hangs or
//! writes garbage when asked; a streamable-HTTP server on the same SDK is reached as a
//! `url` server through the proxy, with the rule's credential.
//!
//! Bounds on time are liveness bounds only.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nerve_core::{ToolCall, ToolCallId, ToolExecutor, ToolOutput};
use nerve_hands::mcp::{McpServerConfig, McpServerSpec, McpTools, ToolFilter, Trust};
use nerve_hands::{Sandbox, SandboxConfig, SandboxTools};
use serde_json::{Value, json};

use crate::sandbox::runtime;
use crate::support::sandbox_available;

/// A hung call fails the test after this long (a liveness bound, not a timing assertion).
const LIVENESS: Duration = Duration::from_secs(600);
/// The sandbox image with Python and the three servers.
pub(crate) const PYTHON_IMAGE: &str = "nerve-mcp-python:latest";
const PACKAGES: [&str; 3] = ["mcp-server-time", "mcp-server-git", "mcp-server-fetch"];
/// The image's label naming the [`PACKAGES`] it was built with.
const PACKAGES_LABEL: &str = "org.nerve.test.mcp-packages";

fn cache() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/nerve")
}

fn run(command: &mut Command) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What a cache made for [`PACKAGES`] says it holds: the wheel directory's `.complete` and
/// the image's [`PACKAGES_LABEL`]. A cache made for fewer servers says less, and is extended
/// (the wheels) or rebuilt (the image).
fn packages_key() -> String {
    PACKAGES.join(" ")
}

/// The servers' wheels for Debian bookworm's Python (3.11.2), downloaded once for each set
/// of [`PACKAGES`] (`pip download` into the same directory adds only what is missing), and
/// once per test process: the image and the host venv ask for them at the same time.
fn wheels() -> PathBuf {
    static DOWNLOADED: OnceLock<PathBuf> = OnceLock::new();
    DOWNLOADED.get_or_init(download_wheels).clone()
}

fn download_wheels() -> PathBuf {
    let dir = cache().join("mcp-wheels-py3.11.2");
    let complete = dir.join(".complete");
    if std::fs::read_to_string(&complete).ok() != Some(packages_key()) {
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "-q",
                "--only-binary=:all:",
                "--python-version",
                "3.11.2",
                "--dest",
            ])
            .arg(&dir)
            .args(PACKAGES));
        std::fs::write(&complete, packages_key()).unwrap();
    }
    dir
}

/// Builds [`PYTHON_IMAGE`] when missing or made for other [`PACKAGES`]: Debian bookworm with
/// Python and git by debootstrap, imported (no registry), then the servers installed from the
/// wheels offline.
pub(crate) fn python_image() -> &'static str {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let format = format!("{{{{index .Config.Labels \"{PACKAGES_LABEL}\"}}}}");
        let current = Command::new("docker")
            .args(["image", "inspect", "--format", &format, PYTHON_IMAGE])
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == packages_key()
            });
        if current {
            return;
        }
        let wheels = wheels();
        let work = tempfile::Builder::new().prefix("nerve-mcp-image-").tempdir().unwrap();
        let base_tar = cache().join("mcp-python-rootfs.tar");
        if !base_tar.exists() {
            let rootfs = work.path().join("rootfs");
            run(Command::new("debootstrap")
                .args([
                    "--variant=minbase",
                    "--include=python3,python3-pip,git,ca-certificates",
                    "bookworm",
                ])
                .arg(&rootfs)
                .arg("http://deb.debian.org/debian"));
            let _ = std::fs::remove_dir_all(rootfs.join("var/cache/apt/archives"));
            let partial = base_tar.with_extension("partial");
            run(Command::new("tar").arg("-C").arg(&rootfs).arg("-cf").arg(&partial).arg("."));
            std::fs::rename(&partial, &base_tar).unwrap();
        }
        run(Command::new("docker")
            .args(["import", "--change", "ENV PATH=/usr/local/bin:/usr/bin:/bin"])
            .arg(&base_tar)
            .arg("nerve-mcp-python-base:latest"));
        let context = work.path().join("context");
        std::fs::create_dir_all(&context).unwrap();
        run(Command::new("cp").arg("-r").arg(&wheels).arg(context.join("wheels")));
        std::fs::write(
            context.join("Dockerfile"),
            format!(
                "FROM nerve-mcp-python-base:latest\nLABEL {PACKAGES_LABEL}=\"{key}\"\nCOPY wheels /tmp/wheels\nRUN pip install --no-index --find-links /tmp/wheels --break-system-packages {key} && rm -rf /tmp/wheels\n",
                key = packages_key()
            ),
        )
        .unwrap();
        run(Command::new("docker").args(["build", "-q", "-t", PYTHON_IMAGE]).arg(&context));
    });
    PYTHON_IMAGE
}

/// A host virtualenv with `mcp-server-time`, for the `trust = "host"` case. Made once per
/// test process (tests asking at the same time wait for it: two `venv`s made at once in
/// one directory left one test without its `pip`), and only trusted once its marker says
/// the install finished (a run cut mid-install leaves no half-made venv behind for good).
fn host_time_server() -> PathBuf {
    static MADE: OnceLock<PathBuf> = OnceLock::new();
    MADE.get_or_init(|| {
        let venv = cache().join("mcp-host-venv");
        let program = venv.join("bin/mcp-server-time");
        let marker = venv.join(".nerve-complete");
        if !(marker.exists() && program.exists()) {
            let _ = std::fs::remove_dir_all(&venv);
            run(Command::new("python3").arg("-m").arg("venv").arg(&venv));
            run(Command::new(venv.join("bin/pip"))
                .args(["install", "-q", "--no-index", "--find-links"])
                .arg(wheels())
                .arg("mcp-server-time"));
            std::fs::write(&marker, b"").unwrap();
        }
        program
    })
    .clone()
}

/// A fault-injecting server on the official Python SDK: `crash` exits mid-call,
/// `sleep` hangs, `garbage` answers with a line that is not JSON-RPC.
const FAULT_SERVER: &str = r#"
import os, sys, time
from mcp.server.mcpserver import MCPServer
server = MCPServer("faults")

@server.tool()
def echo(text: str) -> str:
    "Echo the text."
    return text

@server.tool()
def crash() -> str:
    "Exit in the middle of the call."
    sys.stderr.write("about to crash\n"); sys.stderr.flush()
    os._exit(3)

@server.tool()
def sleep(seconds: float) -> str:
    "Sleep."
    time.sleep(seconds)
    return "slept"

@server.tool()
def garbage() -> str:
    "Write garbage on stdout."
    sys.stdout.write("this is not JSON-RPC\n"); sys.stdout.flush()
    time.sleep(600)
    return "unreachable"

server.run()
"#;

fn server(name: &str, command: &str, args: &[&str]) -> McpServerSpec {
    McpServerSpec {
        config: McpServerConfig {
            name: name.to_owned(),
            command: Some(command.to_owned()),
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            url: None,
            env: Vec::new(),
            tools: ToolFilter::default(),
            timeout_secs: None,
            trust: Trust::Sandbox,
        },
        env: BTreeMap::new(),
    }
}

/// `dir/workspace`, a git repository whose one commit ("first commit") adds a README with
/// `readme`, open to the sandbox's user.
fn git_workspace(dir: &std::path::Path, readme: &str) -> PathBuf {
    let workspace = dir.join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("README.md"), readme).unwrap();
    let git = |args: &[&str]| {
        run(Command::new("git")
            .arg("-C")
            .arg(&workspace)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.org"])
            .args(args))
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "README.md"]);
    git(&["commit", "-q", "-m", "first commit"]);
    // The sandbox's user must be able to read the repository and write its index.
    run(Command::new("chmod").arg("-R").arg("a+rwX").arg(&workspace));
    workspace
}

/// The fault server with a 5 s call timeout.
fn faults_server() -> McpServerSpec {
    let mut faults = server("faults", "python3", &["/workspace/faults.py"]);
    faults.config.timeout_secs = Some(5);
    faults
}

struct Fixture {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    sandbox: Arc<Sandbox>,
}

impl Fixture {
    async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("mcp-e2e-")
            .tempdir()
            .unwrap();
        let workspace = git_workspace(dir.path(), "hello\n");
        std::fs::write(workspace.join("faults.py"), FAULT_SERVER).unwrap();
        let docker = nerve_hands::connect_docker().await.unwrap();
        let config = SandboxConfig::new(python_image(), &workspace, nerve_core::ExecutionId::new());
        let sandbox = Arc::new(Sandbox::start(docker, &config).await.unwrap());
        Self {
            _dir: dir,
            workspace,
            sandbox,
        }
    }

    async fn finish(self, tools: McpTools) {
        tools.shutdown().await;
        self.sandbox.remove().await.unwrap();
    }

    async fn tools(&self, specs: Vec<McpServerSpec>) -> McpTools {
        let inner = Arc::new(SandboxTools::new(Arc::clone(&self.sandbox)));
        tokio::time::timeout(
            LIVENESS,
            McpTools::start(
                inner,
                specs,
                Some(Arc::clone(&self.sandbox)),
                Some(self.workspace.clone()),
            ),
        )
        .await
        .unwrap_or_else(|_| panic!("starting the MCP servers hung"))
    }
}

async fn call(tools: &McpTools, name: &str, arguments: Value) -> ToolOutput {
    let call = ToolCall {
        id: ToolCallId("call".to_owned()),
        name: name.to_owned(),
        arguments,
    };
    tokio::time::timeout(LIVENESS, tools.execute(&call))
        .await
        .unwrap_or_else(|_| panic!("{name} hung"))
        .unwrap_or_else(|e| panic!("{name}: the sandbox failed: {e}"))
}

#[test]
fn real_servers_in_the_sandbox_and_on_the_host() {
    if !sandbox_available() {
        return;
    }
    let host_time = host_time_server();
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let mut host = server(
            "hosttime",
            host_time.to_str().unwrap(),
            &["--local-timezone", "UTC"],
        );
        host.config.trust = Trust::Host;
        let mut git = server("git", "mcp-server-git", &["--repository", "/workspace"]);
        git.config.tools.deny = vec!["git_commit".to_owned(), "git_reset".to_owned()];
        let tools = fx
            .tools(vec![
                server("time", "mcp-server-time", &["--local-timezone", "UTC"]),
                git,
                host,
            ])
            .await;
        let reports = tools.reports();
        for report in &reports {
            assert_eq!(report.error, None, "{report:?}");
        }
        assert_eq!(
            reports
                .iter()
                .map(|r| (r.name.as_str(), r.runs))
                .collect::<Vec<_>>(),
            [
                ("time", "sandbox"),
                ("git", "sandbox"),
                ("hosttime", "host")
            ]
        );
        assert!(
            reports[2]
                .warning
                .as_deref()
                .unwrap()
                .contains("on the host")
        );
        let names: Vec<String> = tools.definitions().into_iter().map(|d| d.name).collect();
        for expected in [
            "shell",
            "time__get_current_time",
            "time__convert_time",
            "git__git_status",
            "git__git_log",
            "hosttime__get_current_time",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} missing from {names:?}"
            );
        }
        assert!(
            !names.iter().any(|n| n == "git__git_commit"),
            "denied tool offered: {names:?}"
        );

        let now = call(&tools, "time__get_current_time", json!({"timezone": "UTC"})).await;
        assert!(!now.is_error, "{now:?}");
        let parsed: Value = serde_json::from_str(&now.content).unwrap();
        assert_eq!(parsed["timezone"], "UTC", "{now:?}");
        let converted = call(
            &tools,
            "time__convert_time",
            json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        )
        .await;
        assert!(converted.content.contains("Asia/Tokyo"), "{converted:?}");

        let log = call(&tools, "git__git_log", json!({"repo_path": "/workspace"})).await;
        assert!(!log.is_error, "{log:?}");
        assert!(log.content.contains("first commit"), "{log:?}");
        // The server runs in the sandbox: a path of the host is not there.
        let outside = call(
            &tools,
            "git__git_status",
            json!({"repo_path": fx.workspace.to_str().unwrap()}),
        )
        .await;
        assert!(outside.is_error, "{outside:?}");

        let host_now = call(
            &tools,
            "hosttime__get_current_time",
            json!({"timezone": "Europe/Paris"}),
        )
        .await;
        assert!(host_now.content.contains("Europe/Paris"), "{host_now:?}");

        // A bad argument is the server's refusal, not a fault: the server stays.
        let refused = call(
            &tools,
            "time__get_current_time",
            json!({"timezone": "Not/AZone"}),
        )
        .await;
        assert!(refused.is_error, "{refused:?}");
        let again = call(&tools, "time__get_current_time", json!({"timezone": "UTC"})).await;
        assert!(!again.is_error, "{again:?}");

        fx.finish(tools).await;
    });
}

#[test]
fn a_crash_restarts_once_then_the_tools_are_withdrawn() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let faults = faults_server();
        let tools = fx.tools(vec![faults]).await;
        assert_eq!(tools.reports()[0].error, None, "{:?}", tools.reports());
        let echo = call(&tools, "faults__echo", json!({"text": "hi"})).await;
        assert_eq!(echo, ToolOutput::ok("hi"));

        // Killed mid-call: an error result naming the fault and the stderr; restarted.
        let crash = call(&tools, "faults__crash", json!({})).await;
        assert!(crash.is_error, "{crash:?}");
        assert!(
            crash.content.contains("failed during the call"),
            "{crash:?}"
        );
        assert!(crash.content.contains("restarted"), "{crash:?}");
        assert!(crash.content.contains("about to crash"), "{crash:?}");
        let echo = call(&tools, "faults__echo", json!({"text": "back"})).await;
        assert_eq!(echo, ToolOutput::ok("back"));

        // Hangs past its timeout: the second fault withdraws the tools.
        let hang = call(&tools, "faults__sleep", json!({"seconds": 600})).await;
        assert!(hang.is_error, "{hang:?}");
        assert!(
            hang.content.contains("did not answer within 5s"),
            "{hang:?}"
        );
        assert!(hang.content.contains("withdrawn"), "{hang:?}");
        assert!(
            !tools
                .definitions()
                .iter()
                .any(|d| d.name.starts_with("faults__"))
        );
        let after = call(&tools, "faults__echo", json!({"text": "x"})).await;
        assert!(
            after.is_error && after.content.contains("was withdrawn"),
            "{after:?}"
        );
        // The built-in tools are untouched.
        let shell = call(&tools, "shell", json!({"command": "echo fine"})).await;
        assert!(shell.content.starts_with("fine\n"), "{shell:?}");

        fx.finish(tools).await;
    });
}

#[test]
fn garbage_on_stdout_is_a_fault_and_a_server_that_never_speaks_is_withdrawn() {
    if !sandbox_available() {
        return;
    }
    runtime().block_on(async {
        let fx = Fixture::start().await;
        let faults = faults_server();
        let mut liar = server(
            "liar",
            "sh",
            &["-c", "while read line; do echo 'not json'; done"],
        );
        liar.config.timeout_secs = Some(5);
        let missing = server("missing", "no-such-server", &[]);
        let tools = fx.tools(vec![faults, liar, missing]).await;
        let reports = tools.reports();
        assert_eq!(reports[0].error, None, "{reports:?}");
        let liar = reports[1].error.as_deref().unwrap();
        assert!(liar.contains("could not start"), "{liar}");
        let missing = reports[2].error.as_deref().unwrap();
        assert!(missing.contains("no-such-server"), "{missing}");
        assert!(reports[1].tools.is_empty() && reports[2].tools.is_empty());

        let garbage = call(&tools, "faults__garbage", json!({})).await;
        assert!(garbage.is_error, "{garbage:?}");
        let echo = call(&tools, "faults__echo", json!({"text": "still here"})).await;
        assert_eq!(echo, ToolOutput::ok("still here"));
        fx.finish(tools).await;
    });
}

/// A value registered as a secret (through a proxy credential) that a workspace file holds.
const MCP_SECRET: &str = "mcp-e2e-Secret-4f9a2c77d1";

#[test]
fn a_scripted_run_calls_each_server_parks_on_ask_resumes_and_redacts() {
    if !sandbox_available() {
        return;
    }
    let image = python_image();
    let host_time = host_time_server();
    let dir = tempfile::Builder::new()
        .prefix("mcp-cli-")
        .tempdir()
        .unwrap();
    let workspace = git_workspace(dir.path(), &format!("token {MCP_SECRET}\n"));
    let config = dir.path().join("nerve.toml");
    std::fs::write(
        &config,
        format!(
            r#"[policy]
rules = [{{ tool = "git__git_log", action = "ask" }}]

[[proxy.rules]]
host = "api.example.org"
[proxy.rules.credential]
env = "MCP_E2E_TOKEN"

[[mcp.servers]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]

[[mcp.servers]]
name = "git"
command = "mcp-server-git"
args = ["--repository", "/workspace"]
tools = {{ deny = ["git_commit", "git_reset", "git_add"] }}

[[mcp.servers]]
name = "hosttime"
command = "{}"
args = ["--local-timezone", "UTC"]
trust = "host"
timeout_secs = 30
"#,
            host_time.display()
        ),
    )
    .unwrap();
    let cassette = dir.path().join("cassette.jsonl");
    let lines = [
        json!({"tool_calls": [{"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}]}),
        json!({"tool_calls": [{"name": "hosttime__get_current_time", "arguments": {"timezone": "Europe/Paris"}}]}),
        json!({"tool_calls": [{"name": "git__git_show", "arguments": {"repo_path": "/workspace", "revision": "HEAD"}}]}),
        json!({"tool_calls": [{"name": "git__git_log", "arguments": {"repo_path": "/workspace"}}]}),
        json!({"text": "done"}),
    ];
    std::fs::write(
        &cassette,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
    )
    .unwrap();
    let db = dir.path().join("nerve.db");
    let provider = format!("script:{}", cassette.display());
    let config = config.to_str().unwrap();
    let env = [("MCP_E2E_TOKEN", MCP_SECRET)];

    let listed = crate::support::nerve_env(
        &db,
        &[
            "--config",
            config,
            "mcp",
            "list",
            "--workspace",
            workspace.to_str().unwrap(),
            "--image",
            image,
            "--json",
        ],
        &env,
    );
    assert!(
        listed.status.success(),
        "{}",
        crate::support::stderr(&listed)
    );
    let servers = crate::support::last_json(&listed);
    let runs: Vec<_> = servers
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["runs"].as_str().unwrap()))
        .collect();
    assert_eq!(
        runs,
        [
            ("time", "sandbox"),
            ("git", "sandbox"),
            ("hosttime", "host")
        ]
    );
    assert!(
        servers[1]["tools"]
            .as_array()
            .unwrap()
            .contains(&json!("git__git_show")),
        "{servers}"
    );

    let started = crate::support::nerve_env(
        &db,
        &[
            "--config",
            config,
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "look at the repository",
            "--provider",
            &provider,
            "--image",
            image,
            "--json",
        ],
        &env,
    );
    let parked = crate::support::last_json(&started);
    assert_eq!(
        parked["termination_reason"],
        "parked",
        "{parked} {}",
        crate::support::stderr(&started)
    );
    let id = parked["execution_id"].as_str().unwrap().to_owned();
    let approve = crate::support::nerve(&db, &["approve", &id]);
    assert!(
        approve.status.success(),
        "{}",
        crate::support::stderr(&approve)
    );
    let resumed =
        crate::support::nerve_env(&db, &["--config", config, "resume", &id, "--json"], &env);
    let done = crate::support::last_json(&resumed);
    assert_eq!(
        done["termination_reason"],
        "completed",
        "{done} {}",
        crate::support::stderr(&resumed)
    );

    let replay = crate::support::last_json(&crate::support::nerve(&db, &["replay", &id, "--json"]));
    assert_eq!(replay["complete"], true, "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");
    let events = crate::support::events_json(&db, &id);
    let results: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| (e["payload"].to_string(), String::new()))
        .collect();
    let all = results
        .iter()
        .map(|r| r.0.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(results.len(), 4, "{all}");
    assert!(
        all.contains("\\\"timezone\\\": \\\"UTC\\\"") || all.contains("UTC"),
        "{all}"
    );
    assert!(all.contains("Europe/Paris"), "{all}");
    assert!(all.contains("first commit"), "{all}");
    let everything = serde_json::to_string(&events).unwrap();
    assert!(
        !everything.contains(MCP_SECRET),
        "the secret reached the log"
    );
    assert!(all.contains("[REDACTED"), "{all}");
    let started_event = events.iter().find(|e| e["kind"] == "started").unwrap();
    assert!(
        started_event.to_string().contains("trust = \\\"host\\\""),
        "{started_event}"
    );
    assert!(
        crate::support::nerve(&db, &["verify", &id])
            .status
            .success()
    );
}

/// Text only the test page holds: finding it in a tool result means the page was fetched.
const PAGE_MARKER: &str = "nerve-fetch-marker-7c1e93";

/// One request a [`Site`] received: its request line and its headers, names lower-cased.
#[derive(Debug, Clone)]
struct Seen {
    line: String,
    headers: BTreeMap<String, String>,
}

/// A web site on the host's loopback (`127.0.0.1`, a free port): `/page` is an HTML page with
/// [`PAGE_MARKER`], `/robots.txt` allows every agent, anything else is 404. It records every
/// request, one per connection, until the test process ends.
struct Site {
    port: u16,
    seen: Arc<std::sync::Mutex<Vec<Seen>>>,
}

impl Site {
    fn start() -> Self {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                // A liveness bound: a client that stalls cannot hold the site forever.
                let _ = stream.set_read_timeout(Some(LIVENESS));
                let Ok(reader) = stream.try_clone() else {
                    continue;
                };
                let mut lines = BufReader::new(reader).lines();
                let Some(Ok(line)) = lines.next() else {
                    continue;
                };
                let mut headers = BTreeMap::new();
                for header in lines.by_ref() {
                    let Ok(header) = header else { break };
                    if header.is_empty() {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':') {
                        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
                    }
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                record
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(Seen { line, headers });
                let (status, kind, body) = match path.as_str() {
                    "/page" => (
                        "200 OK",
                        "text/html; charset=utf-8",
                        format!(
                            "<!DOCTYPE html><html><head><title>Loopback page</title></head><body><article><h1>Loopback page</h1><p>The fetch server read this page through the proxy: {PAGE_MARKER}.</p></article></body></html>"
                        ),
                    ),
                    "/robots.txt" => (
                        "200 OK",
                        "text/plain",
                        "User-agent: *\nAllow: /\n".to_owned(),
                    ),
                    _ => ("404 Not Found", "text/plain", "not here\n".to_owned()),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// The two `mcp-server-fetch` servers of the fetch runs. `fetch` passes
/// `--allow-private-ips`: inside the sandbox, `127.0.0.1` is the container's own loopback and
/// every request goes to the auth proxy, which applies the same address check with the rules
/// deciding the exceptions, so the server's own check only hides the proxy's rules.
/// `guarded` keeps the server's check, which refuses a loopback URL before any request.
const FETCH_SERVERS: &str = r#"
[[mcp.servers]]
name = "fetch"
command = "mcp-server-fetch"
args = ["--allow-private-ips"]

[[mcp.servers]]
name = "guarded"
command = "mcp-server-fetch"
"#;

/// A scripted `nerve run` that completed, and its log.
struct FetchRun {
    _dir: tempfile::TempDir,
    config: PathBuf,
    db: PathBuf,
    id: String,
    events: Vec<Value>,
}

impl FetchRun {
    /// Runs `nerve` with `config` in a fresh workspace, its model calling each tool of
    /// `calls` (name, URL) in turn and then stopping; the run must complete.
    fn complete(config: &str, calls: &[(&str, String)]) -> Self {
        let calls: Vec<(&str, Value)> = calls
            .iter()
            .map(|(tool, url)| (*tool, json!({ "url": url })))
            .collect();
        Self::complete_with(config, &calls, &[])
    }

    /// [`FetchRun::complete`] with any arguments, and `env` for `nerve`.
    fn complete_with(config: &str, calls: &[(&str, Value)], env: &[(&str, &str)]) -> Self {
        let image = python_image();
        let dir = tempfile::Builder::new()
            .prefix("mcp-fetch-")
            .tempdir()
            .unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        let config_path = dir.path().join("nerve.toml");
        std::fs::write(&config_path, config).unwrap();
        let cassette = dir.path().join("cassette.jsonl");
        let mut lines: Vec<Value> = calls
            .iter()
            .map(
                |(tool, arguments)| json!({"tool_calls": [{"name": tool, "arguments": arguments}]}),
            )
            .collect();
        lines.push(json!({"text": "done"}));
        std::fs::write(
            &cassette,
            lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
        )
        .unwrap();
        let db = dir.path().join("nerve.db");
        let output = crate::support::nerve_env(
            &db,
            &[
                "--config",
                config_path.to_str().unwrap(),
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--task",
                "read the page",
                "--provider",
                &format!("script:{}", cassette.display()),
                "--image",
                image,
                "--json",
            ],
            env,
        );
        let summary = crate::support::last_json(&output);
        assert_eq!(
            summary["termination_reason"],
            "completed",
            "{summary} {}",
            crate::support::stderr(&output)
        );
        let id = summary["execution_id"].as_str().unwrap().to_owned();
        let events = crate::support::events_json(&db, &id);
        Self {
            _dir: dir,
            config: config_path,
            db,
            id,
            events,
        }
    }

    /// `replay` finds the run complete, without gaps, and its chain verifies.
    fn assert_replay_complete(&self) {
        let replay = crate::support::last_json(&crate::support::nerve(
            &self.db,
            &["replay", &self.id, "--json"],
        ));
        assert_eq!(replay["complete"], true, "{replay}");
        assert_eq!(replay["gaps"], json!([]), "{replay}");
        assert!(
            crate::support::nerve(&self.db, &["verify", &self.id])
                .status
                .success()
        );
    }
}

/// The `result` of every `tool_call_finished`, in order.
fn tool_results(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "tool_call_finished")
        .map(|e| e["payload"]["result"].clone())
        .collect()
}

/// Every `proxy_decision` for `127.0.0.1`: its decision, method, path, status and reason.
fn loopback_decisions(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["kind"] == "proxy_decision" && e["payload"]["host"] == "127.0.0.1")
        .map(|e| {
            let p = &e["payload"];
            json!({
                "decision": p["decision"],
                "method": p["method"],
                "path": p["path"],
                "status": p["status"],
                "reason": p["reason"],
            })
        })
        .collect()
}

#[test]
fn mcp_server_fetch_reaches_a_loopback_site_only_through_a_proxy_rule() {
    if !sandbox_available() {
        return;
    }
    let site = Site::start();
    let config = format!(
        "[[proxy.rules]]\nhost = \"127.0.0.1\"\nupstream_scheme = \"http\"\nupstream_port = {}\nallow_private = true\n{FETCH_SERVERS}",
        site.port
    );
    let page = site.url("/page");
    let run = FetchRun::complete(
        &config,
        &[
            ("guarded__fetch", page.clone()),
            ("fetch__fetch", page.clone()),
        ],
    );
    let results = tool_results(&run.events);
    assert_eq!(results.len(), 2, "{results:?}");

    // The server's own check refuses the loopback URL before anything leaves it.
    assert_eq!(results[0]["is_error"], true, "{}", results[0]);
    let guarded = results[0]["content"].as_str().unwrap();
    assert!(guarded.contains("not a public address"), "{guarded}");

    // Through the rule: the page, converted to Markdown, is the tool result in the log.
    assert_eq!(results[1]["is_error"], false, "{}", results[1]);
    let fetched = results[1]["content"].as_str().unwrap();
    assert!(fetched.contains(PAGE_MARKER), "{fetched}");
    assert!(
        fetched.contains(&format!("Contents of {page}")),
        "{fetched}"
    );

    // The site saw robots.txt, then the page, both re-framed by the proxy: origin-form, and
    // the proxy's `Accept-Encoding: identity` in place of the client's own.
    let seen = site.seen();
    let lines: Vec<&str> = seen.iter().map(|s| s.line.as_str()).collect();
    assert_eq!(
        lines,
        ["GET /robots.txt HTTP/1.1", "GET /page HTTP/1.1"],
        "{seen:?}"
    );
    for request in &seen {
        assert_eq!(
            request.headers.get("accept-encoding").map(String::as_str),
            Some("identity"),
            "{request:?}"
        );
        assert!(
            request
                .headers
                .get("user-agent")
                .is_some_and(|ua| ua.starts_with("ModelContextProtocol/")),
            "{request:?}"
        );
    }
    // And the proxy recorded each of them as allowed, with the site's answer.
    assert_eq!(
        loopback_decisions(&run.events),
        [
            json!({"decision": "allowed", "method": "GET", "path": "/robots.txt", "status": 200, "reason": null}),
            json!({"decision": "allowed", "method": "GET", "path": "/page", "status": 200, "reason": null}),
        ]
    );
    run.assert_replay_complete();
}

#[test]
fn without_a_rule_mcp_server_fetch_gets_the_proxys_refusal_and_the_site_sees_nothing() {
    if !sandbox_available() {
        return;
    }
    let site = Site::start();
    let run = FetchRun::complete(FETCH_SERVERS, &[("fetch__fetch", site.url("/page"))]);
    let results = tool_results(&run.events);
    assert_eq!(results.len(), 1, "{results:?}");
    // mcp-server-fetch asks for robots.txt first and reports the proxy's 403 in its words.
    assert_eq!(results[0]["is_error"], true, "{}", results[0]);
    let refused = results[0]["content"].as_str().unwrap();
    assert!(refused.contains("received status 403"), "{refused}");
    assert!(refused.contains(&site.url("/robots.txt")), "{refused}");
    // The proxy's reason is in the log; nothing reached the site.
    assert_eq!(
        loopback_decisions(&run.events),
        [json!({
            "decision": "denied",
            "method": "GET",
            "path": "/robots.txt",
            "status": null,
            "reason": "no rule allows the host 127.0.0.1",
        })]
    );
    assert!(site.seen().is_empty(), "{:?}", site.seen());
    run.assert_replay_complete();
}

/// A streamable-HTTP MCP server on the official Python SDK, on the host's loopback: it
/// prints its port, answers only requests bearing `Authorization: Bearer <argv[1]>` (401
/// otherwise; any request when `argv[1]` is empty), and logs each request's method, path
/// and whether it bore the token on stderr. `argv[2]` is `stateless`
/// or `stateful` (sessions, with the `Mcp-Session-Id` header).
const HTTP_SERVER: &str = r#"
import asyncio, socket, sys
import uvicorn
from mcp.server.mcpserver import MCPServer

token, mode = sys.argv[1], sys.argv[2]
server = MCPServer("remote")

@server.tool()
def echo(text: str) -> str:
    "Echo the text."
    return "remote says: " + text

app = server.streamable_http_app(stateless_http=(mode == "stateless"), json_response=(mode == "stateless"))

async def guarded(scope, receive, send):
    if scope["type"] == "http":
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        ok = auth == "Bearer " + token
        sys.stderr.write(f"{scope['method']} {scope['path']} {'authorized' if ok else 'unauthorized'}\n")
        sys.stderr.flush()
        if token and not ok:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"no token\n"})
            return
    await app(scope, receive, send)

sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
print(sock.getsockname()[1], flush=True)
config = uvicorn.Config(guarded, log_level="warning")
asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))
"#;

/// The token the HTTP server wants, given to `nerve` as a proxy credential.
const HTTP_TOKEN: &str = "mcp-http-Token-5b8e1d09c3";

/// [`HTTP_SERVER`] running on the host (the host venv's Python), killed on drop.
struct HttpServer {
    child: std::process::Child,
    port: u16,
    stderr: Arc<std::sync::Mutex<String>>,
}

impl HttpServer {
    fn start(mode: &str, token: &str) -> Self {
        use std::io::{BufRead, BufReader, Read};
        let python = host_time_server().with_file_name("python3");
        let mut child = Command::new(python)
            .args(["-c", HTTP_SERVER, token, mode])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(std::sync::Mutex::new(String::new()));
        let collect = Arc::clone(&stderr);
        let mut pipe = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                collect
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let Ok(port) = line.trim().parse() else {
            // It ended without a port: what it said on stderr is complete once it exited.
            let _ = child.kill();
            let _ = child.wait();
            let _ = reader.join();
            panic!(
                "the HTTP MCP server did not start: {line:?} {}",
                stderr
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
            );
        };
        Self {
            child,
            port,
            stderr,
        }
    }

    fn log(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `nerve run` with the [`HTTP_SERVER`] as `remote`, behind a proxy rule for its port (with
/// the token as its credential when `credential`), and `more` config, calling
/// `remote__echo` once.
fn remote_run(server: &HttpServer, credential: bool, more: &str) -> FetchRun {
    let credential = if credential {
        "[proxy.rules.credential]\nenv = \"MCP_HTTP_TOKEN\"\n"
    } else {
        ""
    };
    let config = format!(
        "[[proxy.rules]]\nhost = \"127.0.0.1\"\nupstream_scheme = \"http\"\nupstream_port = {port}\nallow_private = true\nmethods = [\"GET\", \"POST\", \"DELETE\"]\npaths = [\"/mcp\"]\n{credential}\n[[mcp.servers]]\nname = \"remote\"\nurl = \"http://127.0.0.1:{port}/mcp\"\ntimeout_secs = 10\n{more}",
        port = server.port
    );
    FetchRun::complete_with(
        &config,
        &[("remote__echo", json!({"text": "hello"}))],
        &[("MCP_HTTP_TOKEN", HTTP_TOKEN)],
    )
}

/// The `started` event's report of the `remote` server.
fn remote_report(run: &FetchRun) -> Value {
    let started = run.events.iter().find(|e| e["kind"] == "started").unwrap();
    started["payload"]["config"]["mcp"][0].clone()
}

#[test]
fn a_url_server_is_reached_through_the_proxy_with_its_credential() {
    if !sandbox_available() {
        return;
    }
    // Stateless behind a credential, and with sessions behind a rule without one.
    for (mode, credential, decision) in [
        ("stateless", true, "injected"),
        ("stateful", false, "allowed"),
    ] {
        let server = HttpServer::start(mode, if credential { HTTP_TOKEN } else { "" });
        let run = remote_run(&server, credential, "");
        let results = tool_results(&run.events);
        assert_eq!(results.len(), 1, "{mode}: {results:?}");
        assert_eq!(
            results[0]["content"],
            "remote says: hello",
            "{mode}: {} {}\n{}",
            results[0],
            remote_report(&run),
            server.log()
        );
        assert_eq!(remote_report(&run)["runs"], "remote");
        let log = server.log();
        let authorized = if credential {
            "POST /mcp authorized"
        } else {
            "POST /mcp unauthorized"
        };
        assert!(log.contains(authorized), "{mode}: {log}");
        // Every request went through the proxy, judged and recorded.
        let decisions = loopback_decisions(&run.events);
        assert!(
            decisions.len() >= 3
                && decisions
                    .iter()
                    .all(|d| d["decision"] == decision && d["path"] == "/mcp"),
            "{mode}: {decisions:?}"
        );
        let everything = serde_json::to_string(&run.events).unwrap();
        assert!(
            !everything.contains(HTTP_TOKEN),
            "the token reached the log"
        );
        run.assert_replay_complete();

        // `nerve mcp list` reaches it the same way.
        let listed = crate::support::nerve_env(
            &run.db,
            &[
                "--config",
                run.config.to_str().unwrap(),
                "mcp",
                "list",
                "--image",
                python_image(),
                "--json",
            ],
            &[("MCP_HTTP_TOKEN", HTTP_TOKEN)],
        );
        assert!(
            listed.status.success(),
            "{}",
            crate::support::stderr(&listed)
        );
        let listed = crate::support::last_json(&listed);
        assert_eq!(listed[0]["runs"], "remote", "{listed}");
        assert_eq!(listed[0]["tools"], json!(["remote__echo"]), "{listed}");
    }
}

#[test]
fn a_url_server_with_sessions_behind_a_credential_is_withdrawn_with_the_reason() {
    if !sandbox_available() {
        return;
    }
    let server = HttpServer::start("stateful", HTTP_TOKEN);
    let run = remote_run(
        &server,
        true,
        "[[mcp.servers]]\nname = \"norule\"\nurl = \"http://mcp.example.org/mcp\"\n",
    );
    // A host no rule allows: the proxy's refusal is the reason.
    let started = run.events.iter().find(|e| e["kind"] == "started").unwrap();
    let norule = &started["payload"]["config"]["mcp"][1];
    assert!(
        norule["error"]
            .as_str()
            .is_some_and(|e| e.contains("no rule allows the host mcp.example.org")),
        "{norule}"
    );
    let report = remote_report(&run);
    let error = report["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("drops the Mcp-Session-Id header"),
        "{report}"
    );
    assert_eq!(report["tools"], json!([]), "{report}");
    let results = tool_results(&run.events);
    assert_eq!(results[0]["is_error"], true, "{results:?}");
    run.assert_replay_complete();
}
