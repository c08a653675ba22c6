//! The real `nerve` binary against real model servers that no one on this project wrote:
//! llama.cpp's C++ server (`llama-server`) serving Qwen2.5-Coder-1.5B-Instruct with its
//! corrected chat template, reached directly and through LiteLLM's proxy (its Chat
//! Completions endpoint with `--provider openai`, its Messages endpoint with `--provider
//! anthropic`), where the model does real work (reads a file, edits it, runs a command);
//! and llama-cpp-python's server (`chatml-function-calling`: tools, each call answered
//! whole) serving SmolLM2-135M-Instruct, whose odd output the client must survive. Every
//! route streamed and not. `cargo xtask test-real` starts the servers, sets `NERVE_REAL_*`
//! and compiles this module in (the `real-servers` feature of nerve-tests); a test here
//! without them fails.
//!
//! Small models are weak agents: they name tools that do not exist, write odd arguments,
//! write calls as text, and answer in text where a call was meant. Whatever they do, every
//! request Nerve sends must be accepted, and their mistakes must reach them as error
//! results, never end the run.
//!
//! Every run goes through a recording proxy on loopback (plain bytes in, the same bytes
//! out), so the tests see exactly what Nerve sent: the prompt prefix of one request is
//! byte for byte the start of the next, and streaming is on or off as configured.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::value::RawValue;

use crate::chat::Tmux;
use crate::support::{
    Running, events_json, last_json, nerve_env, read_log, sandbox_available, spawn_nerve_env,
    stderr, stdout,
};

/// The servers `cargo xtask test-real` started, and what it takes to start another
/// `llama-server`.
struct Servers {
    /// llama-cpp-python's server (`.../v1`).
    llama_python: String,
    /// llama.cpp's `llama-server` (`.../v1`).
    llama_server: String,
    litellm: String,
    key: String,
    llama_key: String,
    window: String,
    /// The window of the Qwen routes (`llama-server`, and LiteLLM in front of it).
    qwen_window: String,
    /// The Python of llama-cpp-python's virtual environment.
    python: PathBuf,
    /// The SmolLM2 GGUF file.
    model: PathBuf,
}

/// The servers `cargo xtask test-real` started. Panics without them.
fn servers() -> Option<Servers> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let found = (|| {
        Some(Servers {
            llama_python: var("NERVE_REAL_LLAMA_PYTHON_URL")?,
            llama_server: var("NERVE_REAL_LLAMA_SERVER_URL")?,
            litellm: var("NERVE_REAL_LITELLM_URL")?,
            key: var("NERVE_REAL_LITELLM_KEY")?,
            llama_key: var("NERVE_REAL_LLAMA_KEY")?,
            window: var("NERVE_REAL_CONTEXT_WINDOW")?,
            qwen_window: var("NERVE_REAL_QWEN_WINDOW")?,
            python: var("NERVE_REAL_LLAMA_PYTHON")?.into(),
            model: var("NERVE_REAL_MODEL")?.into(),
        })
    })();
    assert!(
        found.is_some(),
        "no real model servers (NERVE_REAL_* unset): run these tests with `cargo xtask test-real`"
    );
    if !sandbox_available() {
        return None;
    }
    found
}

/// The model servers share two cores: one run at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How long one real run may take before the test gives up on it: a watchdog far above
/// what a run of a few turns of a 135M model needs, and above the retries of a refused
/// connection (at most 91 s).
const RUN_PATIENCE: Duration = Duration::from_secs(600);

/// Whether the model is called with streaming on (the default) or off (`stream = false`
/// in the provider's configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Streamed,
    NotStreamed,
    /// Streamed, with the shell tool forced (`tool_choice = "shell"`): llama-cpp-python
    /// streams a call it was told to make (it cannot stream one the model chose).
    Forced,
}

/// Streamed (the default) and not (`stream = false`).
const BOTH: &[Mode] = &[Mode::Streamed, Mode::NotStreamed];

/// The configuration file of a run in `mode`. Behind LiteLLM the Messages endpoint fronts
/// a model that is not Claude: no cache breakpoints.
fn config(dir: &Path, mode: Mode) -> PathBuf {
    config_limited(dir, mode, None)
}

/// [`config`], with whole answers limited to `limit_secs` when given.
fn config_limited(dir: &Path, mode: Mode, limit_secs: Option<u64>) -> PathBuf {
    let path = dir.join(format!("nerve-{mode:?}-{limit_secs:?}.toml"));
    let mut settings = match mode {
        Mode::Streamed => "",
        Mode::NotStreamed => "stream = false\n",
        Mode::Forced => "tool_choice = \"shell\"\n",
    }
    .to_owned();
    if let Some(secs) = limit_secs {
        settings.push_str(&format!("request_timeout_secs = {secs}\n"));
    }
    std::fs::write(
        &path,
        format!(
            "[providers.anthropic]\nprompt_caching = false\n{settings}\n[providers.openai]\n{settings}"
        ),
    )
    .unwrap();
    path
}

/// One way to reach the model.
struct Route {
    name: &'static str,
    provider: &'static str,
    /// The model's name on this route, and the window it is served with.
    model: &'static str,
    window: String,
    /// The base URL as the provider's variable takes it (`.../v1` for OpenAI).
    base: String,
    key: String,
    /// What the model does with tools through this server.
    tools: Tools,
    /// Whether the model, asked for text, answers in text here: not behind llama-cpp-python's
    /// `chatml-function-calling`, where SmolLM2 calls a tool on nearly every turn, whatever
    /// it is asked (seen here: 4 of 4 turns of "reply with the single word hello").
    answers_in_text: bool,
    /// The longest a whole answer may take on this route (`request_timeout_secs`), where
    /// the model can run away: SmolLM2 behind llama-cpp-python can write a tool call's
    /// arguments until the window is full, since the server ignores `max_tokens` there (seen
    /// in CI: one answer still unfinished after 300 s, 17:03:50 to 17:08:51). Such an answer
    /// ends in a `timeout`, is retried, and the run goes on; on this route that is the
    /// model, not a fault of Nerve's requests.
    runaway_limit_secs: Option<u64>,
}

/// What a route does with tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tools {
    /// Qwen2.5-Coder-1.5B through `llama-server` (its corrected template), directly or
    /// behind LiteLLM: the model does real work, reading a file, editing another with what
    /// it read and running a command, whether it writes its calls natively or as text
    /// (`tool_protocol = "auto"`).
    Works,
    /// The model calls them, and the server answers each call whole: llama-cpp-python's
    /// `chatml-function-calling` cannot stream a call (it accepts `stream: true`, sends
    /// keep-alive comments, raises "Automatic streaming tool choice is not supported" and
    /// ends the stream without an event; LiteLLM in front of it makes that an empty
    /// answer). Streamed, Nerve asks for that answer, and every later one, whole.
    Whole,
}

/// The name `llama-server` and LiteLLM give Qwen2.5-Coder-1.5B.
const QWEN: &str = "qwen2.5-coder-1.5b";

/// Every route, streamed and not.
fn routes(servers: &Servers) -> Vec<Route> {
    vec![
        Route {
            name: "llama-server direct",
            provider: "openai",
            model: QWEN,
            window: servers.qwen_window.clone(),
            base: servers.llama_server.clone(),
            key: servers.llama_key.clone(),
            tools: Tools::Works,
            answers_in_text: true,
            runaway_limit_secs: None,
        },
        Route {
            name: "llama-cpp-python direct",
            provider: "openai",
            model: "smollm2",
            window: servers.window.clone(),
            base: servers.llama_python.clone(),
            key: servers.llama_key.clone(),
            tools: Tools::Whole,
            answers_in_text: false,
            runaway_limit_secs: Some(90),
        },
        Route {
            name: "LiteLLM chat completions",
            provider: "openai",
            model: QWEN,
            window: servers.qwen_window.clone(),
            base: format!("{}/v1", servers.litellm),
            key: servers.key.clone(),
            tools: Tools::Works,
            answers_in_text: true,
            runaway_limit_secs: None,
        },
        Route {
            name: "LiteLLM messages",
            provider: "anthropic",
            model: QWEN,
            window: servers.qwen_window.clone(),
            base: servers.litellm.clone(),
            key: servers.key.clone(),
            tools: Tools::Works,
            answers_in_text: true,
            runaway_limit_secs: None,
        },
    ]
}

impl Route {
    /// The provider's variables: base URL `base` (the route's own, or a proxy's in front of
    /// it) and key `key`, with the configuration of `mode`.
    fn env(&self, base: &str, key: &str, config: &Path) -> Vec<(&'static str, String)> {
        let (url, key_var) = match self.provider {
            "openai" => ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
            _ => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
        };
        vec![
            (url, base.to_owned()),
            (key_var, key.to_owned()),
            ("NERVE_CONFIG", config.display().to_string()),
        ]
    }
}

fn as_env<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The arguments of `nerve run` on `workspace` through `route`.
fn run_args<'a>(
    workspace: &'a str,
    route: &'a Route,
    task: &'a str,
    max_turns: &'a str,
) -> Vec<&'a str> {
    vec![
        "run",
        "--workspace",
        workspace,
        "--task",
        task,
        "--provider",
        route.provider,
        "--model",
        route.model,
        "--context-window",
        &route.window,
        "--loop",
        "react",
        "--max-turns",
        max_turns,
        "--timeout",
        "600",
        "--json",
    ]
}

/// A fresh workspace under `dir` with files to read.
fn workspace(dir: &Path, name: &str) -> PathBuf {
    let workspace = dir.join(format!("workspace-{}", name.replace(' ', "-")));
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("notes.txt"), "apples\npears\n").unwrap();
    std::fs::write(workspace.join("hint.txt"), "plums\n").unwrap();
    workspace
}

/// `nerve run` through `route` in `mode` on a fresh workspace, through a recording proxy:
/// the output and every request the server got.
fn run_task(
    dir: &Path,
    db: &Path,
    route: &Route,
    mode: Mode,
    task: &str,
    max_turns: &str,
) -> (Output, Vec<Exchange>) {
    let workspace = workspace(dir, &format!("{}-{mode:?}", route.name));
    let recorder = Recorder::start(&route.base);
    let config = config_limited(dir, mode, route.runaway_limit_secs);
    let env = route.env(&recorder.base, &route.key, &config);
    let args = run_args(workspace.to_str().unwrap(), route, task, max_turns);
    let output = wait_long(spawn_nerve_env(db, &args, &as_env(&env)));
    (output, recorder.settled_exchanges())
}

/// Waits for `running` to exit within [`RUN_PATIENCE`] (a real model is slow).
fn wait_long(mut running: Running) -> Output {
    let deadline = Instant::now() + RUN_PATIENCE;
    while running.is_running() {
        assert!(
            Instant::now() < deadline,
            "nerve did not finish within {RUN_PATIENCE:?}; stderr: {}",
            running.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    running.wait()
}

/// The `model_called` outcomes of an execution, and how many tool calls finished (with
/// how many of them errors).
struct Trace {
    outcomes: Vec<String>,
    purposes: Vec<String>,
    ok_after_first_tool: usize,
    tools_finished: usize,
    tool_errors: usize,
    retries: Vec<String>,
    /// How many model calls came before the first compaction that changed messages
    /// already sent (any but an output's offload, which happens before it is sent), or
    /// before its summary call.
    calls_before_compaction: Option<usize>,
    /// The triggers of the compactions, in order.
    compactions: Vec<String>,
}

fn trace(db: &Path, id: &str) -> Trace {
    trace_of(&events_json(db, id))
}

fn trace_of(events: &[serde_json::Value]) -> Trace {
    let mut trace = Trace {
        outcomes: Vec::new(),
        purposes: Vec::new(),
        ok_after_first_tool: 0,
        tools_finished: 0,
        tool_errors: 0,
        retries: Vec::new(),
        calls_before_compaction: None,
        compactions: Vec::new(),
    };
    for event in events {
        let payload = &event["payload"];
        match event["kind"].as_str().unwrap_or_default() {
            "model_called" => {
                let outcome = payload["outcome"].as_str().unwrap_or_default().to_owned();
                // A compaction's summary call comes before its event.
                if payload["purpose"] == "summary" && trace.calls_before_compaction.is_none() {
                    trace.calls_before_compaction = Some(trace.outcomes.len());
                }
                if trace.tools_finished > 0 && outcome == "ok" {
                    trace.ok_after_first_tool += 1;
                }
                trace.outcomes.push(outcome);
                trace
                    .purposes
                    .push(payload["purpose"].as_str().unwrap_or_default().to_owned());
            }
            "tool_call_finished" => {
                trace.tools_finished += 1;
                if payload["result"]["is_error"] == true {
                    trace.tool_errors += 1;
                }
            }
            "retry" => trace
                .retries
                .push(payload["error"].as_str().unwrap_or_default().to_owned()),
            "compaction" => {
                let trigger = payload["trigger"].as_str().unwrap_or_default().to_owned();
                if trigger != "output_size" && trace.calls_before_compaction.is_none() {
                    trace.calls_before_compaction = Some(trace.outcomes.len());
                }
                trace.compactions.push(trigger);
            }
            _ => {}
        }
    }
    trace
}

/// What the requests of one run show about streaming. Not streamed: no request asks for
/// it and no answer is an event stream. Streamed: every request asks for it and is
/// answered with events, except where the server cannot stream a tool call
/// ([`Tools::Whole`]): there the first stream that gives nothing (no event, or an empty
/// answer) is asked for again whole, the same request but for `stream`, and every request
/// after it asks for whole answers. Returns the exchanges that were model calls (without
/// the streams that gave nothing).
fn check_streaming(
    exchanges: &[Exchange],
    route: &Route,
    mode: Mode,
    shown: &str,
) -> Vec<Exchange> {
    let asks = |e: &Exchange| {
        let body: serde_json::Value = serde_json::from_slice(&e.body).unwrap();
        body["stream"] == true
    };
    if mode == Mode::NotStreamed {
        for exchange in exchanges {
            assert!(
                !asks(exchange),
                "a streamed request with stream = false: {shown}"
            );
            assert!(!exchange.event_stream, "{}: {shown}", exchange.head);
        }
        return exchanges.to_vec();
    }
    let empty = exchanges.iter().position(Exchange::streamed_nothing);
    assert!(
        empty.is_none() || route.tools != Tools::Works,
        "{}: a stream gave nothing: {shown}",
        route.name
    );
    let streamed = empty.unwrap_or(exchanges.len());
    for exchange in &exchanges[..streamed] {
        assert!(asks(exchange), "a request without stream: true: {shown}");
        assert!(exchange.event_stream, "{}: {shown}", exchange.head);
    }
    let Some(empty) = empty else {
        return exchanges.to_vec();
    };
    let rest = &exchanges[empty + 1..];
    assert!(
        !rest.is_empty(),
        "the empty stream was not asked for whole: {shown}"
    );
    assert_eq!(
        rest[0].request_without_stream(),
        exchanges[empty].request_without_stream(),
        "the whole request is not the streamed one: {shown}"
    );
    for exchange in rest {
        assert!(
            !asks(exchange) && !exchange.event_stream,
            "streamed after the fallback: {shown}"
        );
    }
    let mut calls = exchanges.to_vec();
    calls.remove(empty);
    calls
}

/// The prompt prefix stays byte-identical between ordinary turns: each request's tools,
/// system prompt and messages are, byte for byte, the start of the next one's.
fn check_prefix(exchanges: &[Exchange], shown: &str) {
    let bodies: Vec<BTreeMap<&str, &RawValue>> = exchanges
        .iter()
        .map(|e| serde_json::from_slice(&e.body).unwrap())
        .collect();
    for (i, pair) in bodies.windows(2).enumerate() {
        let (before, after) = (&pair[0], &pair[1]);
        for field in ["tools", "system", "tool_choice", "model"] {
            assert_eq!(
                before.get(field).map(|v| v.get()),
                after.get(field).map(|v| v.get()),
                "`{field}` changed between request {i} and {}: {shown}",
                i + 1
            );
        }
        let messages = |body: &BTreeMap<&str, &RawValue>| -> Vec<String> {
            let raw = body
                .get("messages")
                .unwrap_or_else(|| panic!("a request without messages: {shown}"));
            serde_json::from_str::<Vec<&RawValue>>(raw.get())
                .unwrap()
                .iter()
                .map(|m| m.get().to_owned())
                .collect()
        };
        let (before, after) = (messages(before), messages(after));
        assert!(
            before.len() < after.len(),
            "request {} has {} messages, request {i} had {}: {shown}",
            i + 1,
            after.len(),
            before.len()
        );
        for (n, (old, new)) in before.iter().zip(&after).enumerate() {
            assert_eq!(
                old, new,
                "message {n} of request {i} is not sent again byte for byte: {shown}"
            );
        }
    }
}

#[test]
fn llama_server_does_real_work() {
    tools_and_text("llama-server direct");
}

#[test]
fn llama_cpp_python_runs_tools() {
    tools_and_text("llama-cpp-python direct");
}

#[test]
fn litellm_chat_completions_runs_tools() {
    tools_and_text("LiteLLM chat completions");
}

#[test]
fn litellm_messages_runs_tools() {
    tools_and_text("LiteLLM messages");
}

/// On route `name`, in each of its modes: a run whose tool call executes with at least two
/// requests accepted after it, and a run asked to answer in text.
fn tools_and_text(name: &str) {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let route = routes(&servers)
        .into_iter()
        .find(|r| r.name == name)
        .unwrap();
    for &mode in BOTH {
        match route.tools {
            Tools::Works => work_run(dir.path(), &db, &route, mode),
            Tools::Whole => {
                tool_run(dir.path(), &db, &route, mode);
            }
        }
        text_run(dir.path(), &db, &route, mode);
    }
    // The shell forced: every call streams as the model writes it. Not through LiteLLM's
    // Messages endpoint: llama-cpp-python repeats the call's id in every delta, and
    // LiteLLM's Messages adapter opens a new `tool_use` block for each (seen: one call of
    // 24 deltas became 24 calls of a fragment each; Nerve ran them as the model's errors).
    let forced =
        (route.tools == Tools::Whole).then(|| tool_run(dir.path(), &db, &route, Mode::Forced));
    if let Some((calls, shown)) = forced {
        assert!(
            calls
                .iter()
                .all(|e| e.event_stream && !e.streamed_nothing()),
            "a forced call was not streamed: {shown}"
        );
        assert!(calls.iter().any(Exchange::streamed_a_call), "{shown}");
    }
    assert_no_key(&db, &[&servers.key, &servers.llama_key]);
}

/// The run that gave `output`: its summary, id and trace, and what a failure shows;
/// logged in one line.
fn the_run(
    db: &Path,
    route: &Route,
    mode: Mode,
    what: &str,
    output: &Output,
    exchanges: &[Exchange],
) -> (serde_json::Value, String, Trace, String) {
    let summary = last_json(output);
    let id = summary["execution_id"].as_str().unwrap().to_owned();
    let trace = trace(db, &id);
    let shown = format!("{} ({mode:?}): {summary} {}", route.name, stderr(output));
    eprintln!(
        "{} ({mode:?}): {what}: {} requests, {} tool calls ({} errors), {}",
        route.name,
        exchanges.len(),
        trace.tools_finished,
        trace.tool_errors,
        summary["termination_reason"]
    );
    (summary, id, trace, shown)
}

/// A finished run: its summary, its id, what its log shows, and what a failure shows.
struct Finished {
    summary: serde_json::Value,
    id: String,
    trace: Trace,
    shown: String,
    /// The exchanges that were model calls (a stream that ended empty and was asked for
    /// again whole is not one).
    calls: Vec<Exchange>,
}

/// Reads the run that gave `output` and checks what every run must show: every request
/// accepted once, streamed as configured, and no `error` ending.
fn finished(
    db: &Path,
    route: &Route,
    mode: Mode,
    what: &str,
    output: &Output,
    exchanges: &[Exchange],
) -> Finished {
    let (summary, id, trace, shown) = the_run(db, route, mode, what, output, exchanges);
    // Whatever the model wrote, the server accepted every request, each once; except
    // that a conversation can outgrow the window (llama-cpp-python ignores `max_tokens`
    // for a tool call's arguments, and SmolLM2 can write thousands of tokens of them):
    // the server's overflow error, then compaction, then the request again.
    let refused: Vec<String> = exchanges
        .iter()
        .filter(|e| e.status != 200)
        .map(|e| format!("{} {}", e.status, String::from_utf8_lossy(&e.answer)))
        .collect();
    let shown = format!("{shown} refused: {refused:?}");
    let runaway = |o: &String| route.runaway_limit_secs.is_some() && o.starts_with("timeout");
    assert!(
        trace
            .outcomes
            .iter()
            .all(|o| o == "ok" || o == "context_overflow" || runaway(o)),
        "{:?}: {shown}",
        trace.outcomes
    );
    assert!(
        trace.retries.iter().all(runaway),
        "{:?}: {shown}",
        trace.retries
    );
    assert_ne!(summary["termination_reason"], "error", "{shown}");
    assert!(
        exchanges
            .iter()
            .all(|e| e.status == 200 || (e.status == 400 && contains(&e.answer, b"context"))),
        "{shown}"
    );
    let calls = check_streaming(exchanges, route, mode, &shown);
    // A request Nerve gave up on has its answer recorded only if the server finished it
    // before the recorder settled (llama-cpp-python goes on writing for a client that left).
    let abandoned = trace.outcomes.iter().filter(|o| runaway(o)).count();
    assert!(
        (trace.outcomes.len() - abandoned..=trace.outcomes.len()).contains(&calls.len()),
        "{} calls recorded, {} model calls of which {abandoned} timed out: {shown}",
        calls.len(),
        trace.outcomes.len()
    );
    Finished {
        summary,
        id,
        trace,
        shown,
        calls,
    }
}

/// A tool call executes, and at least two more requests follow it, every one accepted.
/// Returns the accepted exchanges that were model calls, and what a failure shows.
fn tool_run(dir: &Path, db: &Path, route: &Route, mode: Mode) -> (Vec<Exchange>, String) {
    let (output, exchanges) = run_task(dir, db, route, mode, TOOL_TASK, "6");
    let run = finished(db, route, mode, "tool run", &output, &exchanges);
    let shown = &run.shown;
    assert!(run.trace.tools_finished >= 1, "no tool ran: {shown}");
    assert!(
        run.trace.ok_after_first_tool >= 2,
        "{} requests accepted after the first tool: {shown}",
        run.trace.ok_after_first_tool
    );
    // Ordinary turns (no planning; a summary only after an overflow or at a threshold,
    // which the server's count of a 4k window reaches within a few runaway calls): each
    // request extends the one before it.
    let summarised = run
        .trace
        .compactions
        .iter()
        .any(|t| t == "overflow" || t == "hard_threshold");
    assert!(
        run.trace
            .purposes
            .iter()
            .all(|p| p == "agent" || (p == "summary" && summarised)),
        "{:?} {:?}: {shown}",
        run.trace.purposes,
        run.trace.compactions
    );
    // Ordinary turns only: the prefix is checked up to the first compaction (or refusal).
    let ordinary: Vec<Exchange> = run
        .calls
        .iter()
        .take(run.trace.calls_before_compaction.unwrap_or(usize::MAX))
        .take_while(|e| e.status == 200)
        .cloned()
        .collect();
    check_prefix(&ordinary, shown);
    (run.calls, run.shown)
}

/// What the work runs ask: read a file, edit another with what it says, run a command. The
/// edit needs what the read returns, so the run takes at least two requests after its
/// first tool call (asked to edit a file it is told the contents of, Qwen wrote the read,
/// the edit and the command as one block of three calls, then answered: one request).
const WORK_TASK: &str = "The file hint.txt names a fruit. Read it with the read_file tool. Then, in notes.txt, change `pears` to that fruit with the edit_file tool, run `cat notes.txt` with the shell tool, and say what it printed.";

/// [`Tools::Works`]: the model reads `hint.txt`, edits `notes.txt` with what it read and
/// runs a command, each tool call succeeding at least once; every request is accepted once, at least two after the
/// first tool ran; the file holds the edit; the log verifies. The prompt prefix stays put
/// between ordinary turns, on each side of a switch to tools as text (which changes the
/// system prompt and the tools once).
fn work_run(dir: &Path, db: &Path, route: &Route, mode: Mode) {
    let (output, exchanges) = run_task(dir, db, route, mode, WORK_TASK, "8");
    let run = finished(db, route, mode, "work run", &output, &exchanges);
    let shown = &run.shown;
    let events = events_json(db, &run.id);
    let succeeded: Vec<&str> = events
        .iter()
        .filter(|e| {
            e["kind"] == "tool_call_finished" && e["payload"]["result"]["is_error"] == false
        })
        .filter_map(|e| e["payload"]["result"]["name"].as_str())
        .collect();
    let switched = events.iter().any(|e| e["kind"] == "tool_protocol_switched");
    eprintln!(
        "{} ({mode:?}): tools that succeeded: {succeeded:?}; calls as text: {switched}",
        route.name
    );
    for tool in ["read_file", "shell"] {
        assert!(succeeded.contains(&tool), "no {tool} succeeded: {shown}");
    }
    assert!(
        succeeded.contains(&"edit_file") || succeeded.contains(&"write_file"),
        "no edit succeeded: {shown}"
    );
    assert!(
        run.trace.ok_after_first_tool >= 2,
        "{} requests accepted after the first tool: {shown}",
        run.trace.ok_after_first_tool
    );
    let notes = dir
        .join(format!(
            "workspace-{}-{mode:?}",
            route.name.replace(' ', "-")
        ))
        .join("notes.txt");
    let notes = std::fs::read_to_string(&notes).unwrap();
    assert!(
        notes.contains("plums") && !notes.contains("pears"),
        "notes.txt: {notes:?}: {shown}"
    );
    let verify = crate::support::nerve(db, &["verify", &run.id]);
    assert!(verify.status.success(), "{}: {shown}", stderr(&verify));
    let ordinary: Vec<Exchange> = run
        .calls
        .iter()
        .take(run.trace.calls_before_compaction.unwrap_or(usize::MAX))
        .cloned()
        .collect();
    let has_tools = |e: &Exchange| contains(&e.body, b"\"tools\":");
    let (native, text): (Vec<Exchange>, Vec<Exchange>) =
        ordinary.into_iter().partition(|e| has_tools(e));
    check_prefix(&native, shown);
    check_prefix(&text, shown);
}

/// A run asked to answer in text: every request accepted, no error, and (where the model
/// can) the run completes with the model's text.
fn text_run(dir: &Path, db: &Path, route: &Route, mode: Mode) {
    let (output, exchanges) = run_task(dir, db, route, mode, TEXT_TASK, "3");
    let run = finished(db, route, mode, "text run", &output, &exchanges);
    let (summary, shown) = (&run.summary, &run.shown);
    if !route.answers_in_text && summary["termination_reason"] != "completed" {
        eprintln!(
            "{}: the model never answered in text: {summary}",
            route.name
        );
        return;
    }
    assert_eq!(summary["termination_reason"], "completed", "{shown}");
    let events = events_json(db, &run.id);
    let last_answer = events
        .iter()
        .rev()
        .find(|e| e["kind"] == "message_appended" && e["payload"]["message"]["role"] == "assistant")
        .map(|e| e["payload"]["message"]["parts"].clone())
        .unwrap_or_default();
    let parts = last_answer.as_array().cloned().unwrap_or_default();
    assert!(
        parts.iter().any(
            |p| p["type"] == "text" && p["text"].as_str().is_some_and(|t| !t.trim().is_empty())
        ) && !parts.iter().any(|p| p["type"] == "tool_call"),
        "the run ends with text: {last_answer} {shown}"
    );
}

/// What the tool runs ask.
const TOOL_TASK: &str = "Use the shell tool to run `ls`, then use the shell tool to run `cat notes.txt`, then say which fruits are listed.";

/// What the text runs ask.
const TEXT_TASK: &str = "Say hello in one short sentence. Do not use any tool.";

/// The keys are nowhere on disk: not in the database, its WAL or its shared memory.
fn assert_no_key(db: &Path, keys: &[&str]) {
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", db.display());
        if let Ok(bytes) = std::fs::read(&path) {
            for key in keys {
                assert!(
                    !bytes.windows(key.len()).any(|w| w == key.as_bytes()),
                    "a key is in {path}"
                );
            }
        }
    }
}

#[test]
fn a_wrong_key_is_one_line_and_no_retries() {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    // Streamed, as by default: the refusal comes before any stream.
    let config = config(dir.path(), Mode::Streamed);
    // Not `sk-...`: LiteLLM without a database answers a key of that shape with 400 "No
    // connected db." (it would look the key up), and any other key with 401.
    let wrong = "wrong-key-for-nerve-tests";
    for route in routes(&servers) {
        let env = route.env(&route.base, wrong, &config);
        let workspace = workspace(dir.path(), route.name);
        let output = nerve_env(
            &db,
            &[
                "run",
                "--workspace",
                workspace.to_str().unwrap(),
                "--task",
                "say hi",
                "--provider",
                route.provider,
                "--model",
                route.model,
                "--context-window",
                &route.window,
            ],
            &as_env(&env),
        );
        assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
        let out = stdout(&output);
        // The transcript of a run that failed at once; its error is one line.
        let errors: Vec<&str> = out.lines().filter(|l| l.starts_with("error: ")).collect();
        assert_eq!(errors.len(), 1, "one error line: {out}");
        // llama.cpp's server says 401; LiteLLM without a database says 400 "No connected
        // db." to any key but its master key. Either way: permanent, in its own words.
        let (outcome, expected) = if route.name.starts_with("llama") {
            (
                "auth",
                format!("provider error: auth: HTTP 401 from {}", route.provider),
            )
        } else {
            (
                "bad_request",
                format!(
                    "provider error: bad_request: HTTP 400 from {}: No connected db.",
                    route.provider
                ),
            )
        };
        assert!(errors[0].contains(&expected), "`{expected}` in: {out}");
        let id = out
            .lines()
            .find_map(|l| l.strip_prefix("log: execution "))
            .and_then(|l| l.split(' ').next())
            .unwrap_or_else(|| panic!("no execution id in: {out}"));
        let wrong_run = trace(&db, id);
        assert_eq!(wrong_run.outcomes, vec![outcome.to_owned()], "{out}");
        assert!(wrong_run.retries.is_empty(), "{out}");
        let events = serde_json::to_string(&events_json(&db, id)).unwrap();
        assert!(!events.contains(wrong), "the key is in the events");
    }
    assert_no_key(&db, &[wrong]);
}

#[test]
fn a_killed_server_is_retried_then_the_run_resumes() {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    // A server of its own, so that killing it stops no other test's.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.path().join("llama.log");
    let mut server = LlamaServer::start(&servers, port, &log);
    let config = config(dir.path(), Mode::NotStreamed);
    let base = format!("http://127.0.0.1:{port}/v1");
    let route = &routes(&servers)[1];
    let env = route.env(&base, &servers.llama_key, &config);
    let workspace = workspace(dir.path(), "killed");
    let task = "Use the shell tool to run `ls`, then say in one sentence which files there are.";
    let args = run_args(workspace.to_str().unwrap(), route, task, "4");
    let mut running = spawn_nerve_env(&db, &args, &as_env(&env));

    // Mid-run: the model has answered once and its tool ran; the server dies before the
    // next answer.
    let deadline = Instant::now() + RUN_PATIENCE;
    loop {
        let log = read_log(&db);
        if log.iter().any(|e| e.kind == "tool_call_finished") {
            break;
        }
        assert!(
            running.is_running(),
            "the run ended before its first tool call finished: {}",
            running.stderr_so_far()
        );
        assert!(
            Instant::now() < deadline,
            "no tool call within {RUN_PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    server.kill();
    let output = wait_long(running);
    let summary = last_json(&output);
    let shown = format!("{summary} {}", stderr(&output));
    assert_eq!(summary["termination_reason"], "error", "{shown}");
    assert_ne!(output.status.code(), Some(0), "{shown}");
    let id = summary["execution_id"].as_str().unwrap().to_owned();
    let killed = trace(&db, &id);
    // Refused connections are transient: retried (with a backoff meant to outlast a
    // restart) before the run gives up.
    assert!(killed.retries.len() >= 2, "{:?}: {shown}", killed.retries);
    assert_eq!(
        killed.outcomes.first().map(String::as_str),
        Some("ok"),
        "{shown}"
    );
    assert_ne!(
        killed.outcomes.last().map(String::as_str),
        Some("ok"),
        "{shown}"
    );

    // Back on the same port: the run resumes where it stopped and completes.
    let _server = LlamaServer::start(&servers, port, &log);
    let resume_args = ["resume", id.as_str(), "--json"];
    let output = wait_long(spawn_nerve_env(&db, &resume_args, &as_env(&env)));
    let summary = last_json(&output);
    let shown = format!("{summary} {}", stderr(&output));
    let resumed = trace(&db, &id);
    eprintln!(
        "killed run: {} retries ({:?}); resumed: {} model calls, {}",
        killed.retries.len(),
        killed.retries.first(),
        resumed.outcomes.len() - killed.outcomes.len(),
        summary["termination_reason"]
    );
    assert!(
        resumed.outcomes[killed.outcomes.len()..]
            .iter()
            .all(|o| o == "ok"),
        "{:?}: {shown}",
        resumed.outcomes
    );
    // The run goes on to its end: the model's own (it rarely stops calling tools, see
    // above), or the turn limit; never the error it stopped with.
    assert!(
        ["completed", "max_turns"].contains(&summary["termination_reason"].as_str().unwrap_or("")),
        "{shown}"
    );
    assert!(
        resumed.outcomes.len() > killed.outcomes.len(),
        "no model call after the resume: {shown}"
    );
    assert_no_key(&db, &[&servers.llama_key]);
}

/// How much streamed text the proxy lets through before it holds the answer in the
/// terminal test: past the text the display keeps back while it could still become a
/// secret (up to the longest registered secret, here the 19-byte key).
const HOLD_AFTER: usize = 64;

#[test]
fn a_terminal_shows_the_text_before_the_model_call_ends() {
    let Some(servers) = servers() else { return };
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let route = &routes(&servers)[0];
    let recorder = Recorder::start(&route.base);
    recorder.hold_after(HOLD_AFTER);
    let config = config(dir.path(), Mode::Streamed);
    let env = route.env(&recorder.base, &route.key, &config);
    let workspace = workspace(dir.path(), "terminal");
    let task = "Write a paragraph of four sentences about apples. Do not use any tool.";
    let db_arg = db.display().to_string();
    let mut args = vec!["--db", db_arg.as_str()];
    args.extend(run_args(workspace.to_str().unwrap(), route, task, "3"));
    // On a terminal: the live transcript, not the JSON summary.
    assert_eq!(args.pop(), Some("--json"));
    let term = Tmux::start(&args, &as_env(&env));
    // The server has sent HOLD_AFTER bytes of text, and the proxy holds the rest of the
    // answer back: the model call has not ended.
    let deadline = Instant::now() + RUN_PATIENCE;
    let held = loop {
        if let Some(held) = recorder.held(Duration::from_millis(200)) {
            break held;
        }
        let screen = term.screen();
        assert!(
            !screen.contains("nerve exited"),
            "the run ended without {HOLD_AFTER} bytes of streamed text:\n{screen}"
        );
        assert!(
            Instant::now() < deadline,
            "no streamed text within {RUN_PATIENCE:?}:\n{screen}"
        );
    };
    // A word of it well before its end (the display keeps back only what could still
    // become a secret), and not one of the task's.
    let cut = (0..=held.len() - HOLD_AFTER / 2)
        .rev()
        .find(|&i| held.is_char_boundary(i))
        .unwrap_or(0);
    let early = &held[..cut];
    let word = early
        .split_whitespace()
        .rev()
        .skip(1)
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .find(|w| w.len() >= 4 && !task.to_lowercase().contains(&w.to_lowercase()))
        .unwrap_or_else(|| panic!("no word to look for in {held:?}"))
        .to_owned();
    let screen = term.wait_for(&word);
    let calls = read_log(&db)
        .iter()
        .filter(|e| e.kind == "model_called")
        .count();
    let finished = recorder.exchanges().len();
    eprintln!(
        "the terminal shows {word:?} of {held:?} with the call open ({finished} finished before it)"
    );
    assert_eq!(
        calls, finished,
        "a model call ended while its answer was held:\n{screen}"
    );
    recorder.release();
    let screen = term.wait_for("nerve exited");
    assert!(screen.contains("nerve exited 0"), "{screen}");
    assert_no_key(&db, &[&servers.llama_key]);
}

/// A llama.cpp server of a test's own, started like the one `cargo xtask test-real`
/// starts; killed when dropped.
struct LlamaServer {
    child: Option<Child>,
}

impl LlamaServer {
    /// Starts the server on `port` (output appended to `log`) and waits until it answers.
    fn start(servers: &Servers, port: u16, log: &Path) -> Self {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(&servers.python)
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&servers.model)
            .args(["--chat_format", "chatml-function-calling"])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--n_ctx",
                &servers.window,
                "--n_threads",
                "1",
                "--n_threads_batch",
                "1",
            ])
            .args(["--model_alias", "smollm2", "--seed", "7"])
            .args(["--api_key", &servers.llama_key])
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut server = Self { child: Some(child) };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + RUN_PATIENCE;
        while !models_answer(address, &servers.llama_key) {
            if let Some(child) = server.child.as_mut() {
                let exited = child.try_wait().unwrap();
                assert!(
                    exited.is_none(),
                    "llama.cpp's server exited ({exited:?}); see {}",
                    log.display()
                );
            }
            assert!(
                Instant::now() < deadline,
                "llama.cpp's server did not answer within {RUN_PATIENCE:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// SIGKILL: the server dies at once, as in a crash.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether `GET /v1/models` answers 200.
fn models_answer(address: SocketAddr, key: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(1)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!(
        "GET /v1/models HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).is_ok() && &head[9..12] == b"200"
}

/// One request that went through a [`Recorder`], and the head of its answer.
#[derive(Debug, Clone)]
struct Exchange {
    body: Vec<u8>,
    status: u16,
    head: String,
    /// The answer was `text/event-stream`.
    event_stream: bool,
    /// The answer's body as it came (chunked framing included).
    answer: Vec<u8>,
}

impl Exchange {
    /// A streamed answer that carried a tool call as the model wrote it (Chat Completions
    /// `tool_calls` deltas, a Messages `tool_use` block).
    fn streamed_a_call(&self) -> bool {
        self.event_stream
            && (contains(&self.answer, b"tool_calls") || contains(&self.answer, b"tool_use"))
    }

    /// A streamed answer that gave nothing: it ended without an event (keep-alive comments
    /// at most), or with an empty answer (no text, no tool call).
    fn streamed_nothing(&self) -> bool {
        self.event_stream
            && !contains(&self.answer, b"tool_calls")
            && !contains(&self.answer, b"tool_use")
            && !contains(&self.answer, b"text_delta")
            && streamed_text(&self.answer).is_empty()
    }

    /// The request's body without `stream` and `stream_options`.
    fn request_without_stream(&self) -> serde_json::Value {
        let mut body: serde_json::Value = serde_json::from_slice(&self.body).unwrap();
        if let Some(body) = body.as_object_mut() {
            body.remove("stream");
            body.remove("stream_options");
        }
        body
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A recording proxy on a loopback port: each HTTP/1.1 request is passed on to the
/// upstream byte for byte (one request per connection: it asks both sides to close), and
/// the request body and the answer's status are kept.
struct Recorder {
    /// The upstream base URL with this proxy's address in place of the upstream's.
    base: String,
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    /// Connections accepted and not yet recorded: an exchange is recorded once its
    /// upstream side closed, which may come after the client already went on (or exited).
    in_flight: Arc<AtomicUsize>,
    hold: Arc<Hold>,
}

/// A streamed answer stopped part-way: once the text a stream carried reaches `after`
/// bytes, the proxy passes nothing more on until [`Recorder::release`] (once per
/// recorder). Off unless armed.
#[derive(Default)]
struct Hold {
    state: Mutex<HoldState>,
    changed: Condvar,
}

#[derive(Default)]
struct HoldState {
    after: Option<usize>,
    /// The text passed on when the stream was stopped.
    held: Option<String>,
    released: bool,
}

impl Hold {
    /// Called with the bytes an answer sent so far; blocks while the answer is held.
    fn check(&self, answer: &[u8]) {
        let mut state = self.state.lock().unwrap();
        let Some(after) = state.after else { return };
        if state.held.is_some() {
            return;
        }
        let text = streamed_text(answer);
        if text.len() < after {
            return;
        }
        state.held = Some(text);
        self.changed.notify_all();
        while !state.released {
            state = self.changed.wait(state).unwrap();
        }
    }
}

impl Recorder {
    fn start(upstream_base: &str) -> Self {
        let rest = upstream_base
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("not a loopback http:// base URL: {upstream_base}"));
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let upstream: SocketAddr = authority.parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}{path}", listener.local_addr().unwrap());
        let exchanges = Arc::new(Mutex::new(Vec::new()));
        let recorded = Arc::clone(&exchanges);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let counting = Arc::clone(&in_flight);
        let hold = Arc::new(Hold::default());
        let holding = Arc::clone(&hold);
        // The thread ends with the test process; it holds nothing but the listener.
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let recorded = Arc::clone(&recorded);
                let holding = Arc::clone(&holding);
                let counting = Arc::clone(&counting);
                counting.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    if let Some(exchange) = forward(client, upstream, &holding) {
                        recorded.lock().unwrap().push(exchange);
                    }
                    counting.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            base,
            exchanges,
            in_flight,
            hold,
        }
    }

    /// Every exchange, once no connection is still being passed on (within a minute):
    /// for a run that has ended, whose last answers may still be closing upstream.
    fn settled_exchanges(&self) -> Vec<Exchange> {
        let deadline = Instant::now() + Duration::from_secs(60);
        // Ends: when nothing is in flight, or at the deadline.
        while self.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.exchanges()
    }

    /// The exchanges so far, in the order they finished.
    fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().unwrap().clone()
    }

    /// Stops the first stream whose text reaches `after` bytes, there.
    fn hold_after(&self, after: usize) {
        self.hold.state.lock().unwrap().after = Some(after);
    }

    /// The text of the held stream, once a stream is held; `None` while none is yet.
    fn held(&self, wait: Duration) -> Option<String> {
        let state = self.hold.state.lock().unwrap();
        let (state, _) = self
            .hold
            .changed
            .wait_timeout_while(state, wait, |s| s.held.is_none())
            .unwrap();
        state.held.clone()
    }

    /// Lets the held stream go on.
    fn release(&self) {
        self.hold.state.lock().unwrap().released = true;
        self.hold.changed.notify_all();
    }
}

/// The text in the Chat Completions stream `answer` (the `content` of its deltas), up to
/// the last whole piece.
fn streamed_text(answer: &[u8]) -> String {
    const NEEDLE: &[u8] = b"\"content\":\"";
    let mut text = String::new();
    let mut from = 0;
    while let Some(at) = answer[from..]
        .windows(NEEDLE.len())
        .position(|w| w == NEEDLE)
    {
        let start = from + at + NEEDLE.len() - 1;
        let mut strings =
            serde_json::Deserializer::from_slice(&answer[start..]).into_iter::<String>();
        let Some(Ok(piece)) = strings.next() else {
            break;
        };
        text.push_str(&piece);
        from = start + strings.byte_offset();
    }
    text
}

/// Passes one request from `client` to `upstream` and its answer back.
fn forward(client: TcpStream, upstream: SocketAddr, hold: &Hold) -> Option<Exchange> {
    let mut from_client = BufReader::new(client.try_clone().ok()?);
    let head = read_head(&mut from_client)?;
    let length = header(&head, "content-length").map_or(0, |v| v.parse().unwrap_or(0));
    let mut body = vec![0; length];
    from_client.read_exact(&mut body).ok()?;
    let mut server = TcpStream::connect(upstream).ok()?;
    server.write_all(close_connection(&head).as_bytes()).ok()?;
    server.write_all(&body).ok()?;
    let mut from_server = BufReader::new(server);
    let answer = read_head(&mut from_server)?;
    let mut to_client = client;
    to_client
        .write_all(close_connection(&answer).as_bytes())
        .ok()?;
    // The rest as it comes: a streamed answer passes chunk by chunk.
    let mut buffer = [0_u8; 4096];
    let mut sent = Vec::new();
    loop {
        // A server that breaks the connection off has ended its answer too.
        let n = from_server.read(&mut buffer).unwrap_or(0);
        if n == 0 {
            break;
        }
        to_client.write_all(&buffer[..n]).ok()?;
        to_client.flush().ok()?;
        sent.extend_from_slice(&buffer[..n]);
        hold.check(&sent);
    }
    let _ = to_client.shutdown(Shutdown::Both);
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    let event_stream =
        header(&answer, "content-type").is_some_and(|v| v.starts_with("text/event-stream"));
    Some(Exchange {
        body,
        status,
        head: answer,
        event_stream,
        answer: sent,
    })
}

/// An HTTP head, up to and including the empty line.
fn read_head(reader: &mut impl BufRead) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" {
            return Some(head);
        }
    }
}

/// The value of header `name` in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case(name)
            .then_some(value.trim())
    })
}

/// `head` with `Connection: close` in place of any `Connection` header.
fn close_connection(head: &str) -> String {
    let mut lines: Vec<&str> = head
        .split("\r\n")
        .filter(|line| {
            !line
                .split_once(':')
                .is_some_and(|(key, _)| key.trim().eq_ignore_ascii_case("connection"))
        })
        .collect();
    // The head ends with "\r\n\r\n": the last two pieces are empty.
    lines.truncate(lines.len().saturating_sub(2));
    format!("{}\r\nConnection: close\r\n\r\n", lines.join("\r\n"))
}
