//! The auth proxy end to end: a canary secret configured in a rule reaches the upstream it
//! is for, and nothing else: not the container (environment, `/proc/*/environ`, `docker
//! inspect`, the image), not the tool outputs (also when the upstream reflects the request
//! back), not the SQLite log (WAL included), not the requests sent to the model.
//!
//! Upstreams are in-process servers on 127.0.0.1. The only other address ever named is
//! 1.1.1.1, from inside the no-network container, where the connection fails at once.
//! Time bounds are liveness bounds, never timing assertions.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use nerve_core::event::{ProxyDecision, ProxyVerdict};
use nerve_core::testing::MemorySink;
use nerve_core::{Event, EventSink, ExecutionId, ToolCall, ToolCallId, ToolExecutor};
use nerve_hands::proxy::{Credential, HostPattern, ProxyConfig, ProxyRule, UpstreamScheme};
use nerve_hands::{Proxy, Sandbox, SandboxConfig, SandboxTools};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::support::{last_json, nerve_bin, sandbox_available, stderr, stdout};

const CANARY: &str = "canary-e2e-5b1d7c29-never-leak";
const LIVENESS: Duration = Duration::from_secs(300);

/// A plain HTTP/1.1 server on 127.0.0.1 on its own thread. Each request is recorded raw and
/// answered by `answer(head, body)` with `Connection: close`.
pub(crate) struct Server {
    pub(crate) port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(answer: impl Fn(&str, &str) -> (String, String) + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        let answer = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let log = Arc::clone(&log);
                let answer = Arc::clone(&answer);
                std::thread::spawn(move || serve_one(stream, &log, answer.as_ref()));
            }
        });
        Self { port, requests }
    }

    /// Reflects the request head (its headers, the injected credential included) as the
    /// response body: the worst an upstream can do with a secret it was given.
    fn echo() -> Self {
        Self::start(|head, body| ("200 OK".to_owned(), format!("you sent:\n{head}\n\n{body}")))
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

fn serve_one(
    mut stream: TcpStream,
    log: &Mutex<Vec<String>>,
    answer: &(dyn Fn(&str, &str) -> (String, String) + Send + Sync),
) {
    stream.set_read_timeout(Some(LIVENESS)).unwrap();
    let mut raw = Vec::new();
    let mut byte = [0u8; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => raw.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&raw).trim_end().to_owned();
    let length = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    if stream.read_exact(&mut body).is_err() {
        return;
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    log.lock().unwrap().push(format!("{head}\n\n{body}"));
    let (status, content) = answer(&head, &body);
    let kind = if content.starts_with('{') {
        "application/json"
    } else {
        "text/plain"
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{content}",
        content.len()
    );
    let _ = stream.write_all(response.as_bytes());
}

fn canary_rule(echo: &Server) -> ProxyRule {
    ProxyRule {
        upstream_scheme: UpstreamScheme::Http,
        upstream_port: Some(echo.port),
        allow_private: true,
        credential: Some(Credential {
            name: "upstream".to_owned(),
            header: "Authorization".to_owned(),
            template: "Bearer {secret}".to_owned(),
            secret: SecretString::from(CANARY),
        }),
        ..ProxyRule::new(HostPattern::parse("127.0.0.1").unwrap())
    }
}

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(CANARY),
        "the canary leaked into {what}:\n{text}"
    );
}

fn contains_bytes(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn call(tools: &SandboxTools, name: &str, arguments: Value) -> String {
    let call = ToolCall {
        id: ToolCallId("call".to_owned()),
        name: name.to_owned(),
        arguments,
    };
    let output = tokio::time::timeout(LIVENESS, tools.execute(&call))
        .await
        .unwrap_or_else(|_| panic!("{name} hung"))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    output.content
}

#[test]
fn the_canary_stays_on_the_host_and_the_proxy_is_the_only_way_out() {
    if !sandbox_available() {
        return;
    }
    let echo = Server::echo();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let decisions = Arc::new(MemorySink::default());
        let proxy = Proxy::start(
            ProxyConfig::new(vec![canary_rule(&echo)]),
            Arc::clone(&decisions) as Arc<dyn EventSink>,
            ExecutionId::new(),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace).unwrap();
        let docker = nerve_hands::connect_docker().await.unwrap();
        let mut config =
            SandboxConfig::new(nerve_hands::DEFAULT_IMAGE, &workspace, ExecutionId::new());
        config.proxy = Some(proxy.mount());
        config.env = vec![
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
            // Refused by name, whatever its value.
            ("UPSTREAM_TOKEN".to_owned(), "not-the-canary".to_owned()),
        ];
        let sandbox = Arc::new(Sandbox::start(docker, &config).await.unwrap());
        let tools = SandboxTools::with_proxy(Arc::clone(&sandbox), proxy.client());
        let port = echo.port;
        let shell = |command: String| {
            let tools = tools.clone();
            async move { call(&tools, "shell", json!({ "command": command })).await }
        };

        // The environment and every process's, as the sandbox sees them.
        let env = shell("env".to_owned()).await;
        assert_clean("env", &env);
        assert!(env.contains("http_proxy=http://127.0.0.1:3128"), "{env}");
        assert!(env.contains("LANG=C.UTF-8") && !env.contains("UPSTREAM_TOKEN"), "{env}");
        let environ = shell("for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done".to_owned()).await;
        assert_clean("/proc/*/environ", &environ);
        assert!(environ.contains("PATH="), "{environ}");
        let mount = shell("ls -A /run/nerve; touch /run/nerve/x; echo status=$?".to_owned()).await;
        assert!(mount.starts_with("proxy.sock\n"), "{mount}");
        assert!(mount.contains("status=1"), "the proxy directory is read-only: {mount}");

        // Through the relay: the upstream gets the credential and reflects it back; the
        // sandbox sees it scrubbed.
        let wget = shell(format!("wget -q -O - http://127.0.0.1:{port}/reflect")).await;
        assert_clean("wget's output", &wget);
        assert!(wget.contains("Bearer [REDACTED:upstream]"), "{wget}");
        let with_own = shell(format!(
            "wget -q -O - --header 'Authorization: Bearer forged' http://127.0.0.1:{port}/reflect"
        ))
        .await;
        assert_clean("wget's output", &with_own);
        assert!(!with_own.contains("forged"), "the sandbox's header went through: {with_own}");
        let tool = call(
            &tools,
            "http_request",
            json!({"method": "GET", "url": format!("http://127.0.0.1:{port}/reflect")}),
        )
        .await;
        assert_clean("http_request's output", &tool);
        assert!(tool.starts_with("HTTP 200 OK\n") && tool.contains("[REDACTED:upstream]"), "{tool}");
        let denied = shell("wget -q -O - http://elsewhere.test/ 2>&1; echo status=$?".to_owned()).await;
        assert!(denied.contains("403") && denied.contains("status=1"), "{denied}");
        let received = echo.requests();
        assert_eq!(received.len(), 3, "{received:?}");
        for request in &received {
            assert!(request.contains(&format!("Bearer {CANARY}")), "not injected: {request}");
            assert!(!request.contains("forged"), "{request}");
        }

        // Around the proxy: no route out, and the host's loopback is not the sandbox's.
        let bypass = shell(format!(
            "unset http_proxy HTTP_PROXY; wget -q -T 5 -O - http://127.0.0.1:{port}/direct 2>&1; echo status=$?; wget -q -T 5 -O - http://1.1.1.1/ 2>&1; echo status=$?"
        ))
        .await;
        assert_eq!(bypass.matches("status=1").count(), 2, "{bypass}");
        assert_eq!(echo.requests().len(), 3, "a direct connection reached the upstream");

        // What the engine knows of the container, and its image.
        let docker = sandbox.docker();
        let inspect = docker.inspect_container(sandbox.container_id(), None).await.unwrap();
        let inspect = serde_json::to_string(&inspect).unwrap();
        assert_clean("docker inspect", &inspect);
        assert!(inspect.contains(":/run/nerve:ro"), "{inspect}");
        let mut image = Vec::new();
        let mut export = Box::pin(docker.export_image(nerve_hands::DEFAULT_IMAGE));
        while let Some(chunk) = export.next().await {
            image.extend_from_slice(&chunk.unwrap());
        }
        assert!(image.len() > 1024, "the image export is empty");
        assert!(!contains_bytes(&image, CANARY.as_bytes()), "the canary is in the image");
        let mut filesystem = Vec::new();
        let mut export = Box::pin(docker.export_container(sandbox.container_id()));
        while let Some(chunk) = export.next().await {
            filesystem.extend_from_slice(&chunk.unwrap());
        }
        assert!(!contains_bytes(&filesystem, CANARY.as_bytes()), "the canary is in the container's filesystem");

        let decisions: Vec<ProxyDecision> = decisions
            .events()
            .into_iter()
            .filter_map(|event| {
                if let Event::ProxyDecision(decision) = event {
                    Some(decision)
                } else {
                    None
                }
            })
            .collect();
        let json = serde_json::to_string(&decisions).unwrap();
        assert_clean("the proxy's events", &json);
        let injected = decisions
            .iter()
            .filter(|d| d.decision == ProxyVerdict::Injected && d.status == Some(200))
            .count();
        assert_eq!(injected, 3, "{decisions:?}");
        assert!(decisions.iter().any(|d| d.decision == ProxyVerdict::Denied && d.host == "elsewhere.test"));
        sandbox.remove().await.unwrap();
    });
}

/// An OpenAI-compatible model on 127.0.0.1 that answers with `turns` in order and keeps
/// every request it gets.
pub(crate) fn fake_model(turns: Vec<Value>) -> Server {
    let next = Mutex::new(turns.into_iter());
    Server::start(move |_head, _body| {
        let message = next
            .lock()
            .unwrap()
            .next()
            .unwrap_or_else(|| json!({"content": "done"}));
        let finish = if message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        let mut message = message;
        message["role"] = json!("assistant");
        let response = json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "model": "test-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110},
        });
        ("200 OK".to_owned(), response.to_string())
    })
}

pub(crate) fn tool_call(id: &str, name: &str, arguments: Value) -> Value {
    json!({"content": null, "tool_calls": [{
        "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()},
    }]})
}

#[test]
fn a_nerve_run_keeps_the_canary_out_of_the_log_and_the_model() {
    if !sandbox_available() {
        return;
    }
    let echo = Server::echo();
    let url = format!("http://127.0.0.1:{}/reflect", echo.port);
    let model = fake_model(vec![
        tool_call(
            "call_1",
            "http_request",
            json!({"method": "GET", "url": url}),
        ),
        tool_call(
            "call_2",
            "shell",
            json!({"command": format!(
                "wget -q -O - {url}; env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done"
            )}),
        ),
        json!({"content": "done"}),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[[proxy.rules]]
host = "127.0.0.1"
upstream_scheme = "http"
upstream_port = {}
allow_private = true
[proxy.rules.credential]
name = "upstream"
env = "NERVE_E2E_UPSTREAM_CREDENTIAL"
"#,
            echo.port
        ),
    )
    .unwrap();
    let db = dir.path().join("nerve.db");
    let output = Command::new(nerve_bin())
        .arg("--db")
        .arg(&db)
        .arg("--config")
        .arg(&config)
        .args(["run", "--workspace"])
        .arg(&workspace)
        .args([
            "--task",
            "fetch the reflect endpoint",
            "--provider",
            "openai",
            "--model",
            "test-model",
            "--json",
        ])
        .env(
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", model.port),
        )
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("NERVE_CONFIG")
        .env("NERVE_E2E_UPSTREAM_CREDENTIAL", CANARY)
        // A harmless name whose value holds the secret: the value filter keeps it out.
        .env("TZ", CANARY)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "nerve run failed: {}\n{}",
        stdout(&output),
        stderr(&output)
    );
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_clean("nerve's stdout", &stdout(&output));
    assert_clean("nerve's stderr", &stderr(&output));

    // The upstream got the credential, twice (the tool, then wget through the relay).
    let received = echo.requests();
    let prompts = model.requests();
    assert_eq!(
        received.len(),
        2,
        "{received:?}\nthe model's last request: {:?}",
        prompts.last()
    );
    assert!(
        received
            .iter()
            .all(|r| r.contains(&format!("Bearer {CANARY}")))
    );

    // Every request the model got: the tool results are there, scrubbed.
    assert_eq!(prompts.len(), 3, "{prompts:?}");
    for prompt in &prompts {
        assert_clean("a request to the model", prompt);
    }
    let last = &prompts[2];
    assert!(last.contains("[REDACTED:upstream]"), "{last}");
    assert!(
        last.contains("http_proxy=http://127.0.0.1:3128"),
        "the env output is missing: {last}"
    );

    // The log: every byte of the database, its WAL and shared memory.
    let mut scanned = 0;
    for suffix in ["", "-wal", "-shm"] {
        let path = Path::new(&format!("{}{suffix}", db.display())).to_path_buf();
        if let Ok(bytes) = std::fs::read(&path) {
            scanned += bytes.len();
            assert!(
                !contains_bytes(&bytes, CANARY.as_bytes()),
                "the canary is in {}",
                path.display()
            );
        }
    }
    assert!(scanned > 0, "no database file");
    let id = result["execution_id"].as_str().unwrap();
    let events = Command::new(nerve_bin())
        .arg("--db")
        .arg(&db)
        .args(["events", id, "--json"])
        .output()
        .unwrap();
    let events = stdout(&events);
    assert_clean("nerve events", &events);
    assert!(
        events.contains("proxy_decision") && events.contains("injected"),
        "{events}"
    );
}
