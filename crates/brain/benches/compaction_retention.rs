//! Fact retention under compaction: seeded trajectories with planted facts
//! (`trajectory/mod.rs`) run through the real engine (`AgentEngine::run`) under each
//! strategy and several context windows. Prints, per strategy and window, the token
//! reduction, the largest request against the window, and the shares of needed facts that
//! are in the context (at the end, and when the turn that needs them is sent) or that
//! `recall` gets back from the engine's archive.
//!
//! A second, smaller table runs the same seeds with realistic noise (`Noise::Realistic`:
//! unrelated errors and failing tests in the logs, long configuration files, rules naming
//! paths) at two windows, to show how far the first table, whose noise the digest's rules
//! were chosen against, carries over. The first table's trajectories are unchanged.
//!
//! `cargo xtask bench compaction`, or `cargo bench -p nerve-brain --bench compaction_retention`.
//! Knobs for quicker runs and diagnosis: `NERVE_BENCH_RETENTION=first,second,realistic` (the
//! parts), `NERVE_BENCH_WINDOWS=16000,32000`, `NERVE_BENCH_STRATEGIES=mask,layered,extractive`
//! (the reference runs always run), `NERVE_BENCH_MISSES=1` (for each fact not in context before
//! the turn that asks, which part of each request held it: `output@56 → digest@60 → none@70`)
//! and `NERVE_BENCH_DUMP=1` (the first seed's final context, message by message).
//!
//! Strategies:
//! - `none`: compaction disabled; its final conversation is the uncompacted reference.
//! - `truncate oldest`: not an engine strategy; emulated on the uncompacted conversation by
//!   dropping the oldest messages after the system prompt and the task until it fits the
//!   window (and a tool result whose call went goes too).
//! - `masking only`: the engine with the hard threshold out of reach (`hard_percent: 1000`)
//!   and no digests (`mask_digest_chars: 0`): offload with head-and-tail previews and plain
//!   observation masking, the classic baseline.
//! - `layered, scripted summary`: the full policy, whose masked placeholders (and offload
//!   previews) carry a digest of the output; summary calls are answered by a deterministic
//!   summariser standing in for a good model (see [`good_summary`]).
//! - `layered, extractive fallback`: the full policy; summary calls fail, as with a cassette
//!   that has no summary lines, so the engine writes its extractive summary.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // A benchmark printing its table.

#[path = "trajectory/mod.rs"]
mod trajectory;
#[path = "window_server/mod.rs"]
mod window_server;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use nerve_brain::context::compaction_plan::{CompactionConfig, SUMMARY_PROMPT, transcript};
use nerve_brain::context::memory_archive::MemoryArchive;
use nerve_brain::guards::stagnation::StagnationConfig;
use nerve_brain::provider::tokens::{CachedCounter, Estimate, estimate_messages};
use nerve_brain::{
    AgentEngine, EngineConfig, HttpConfig, ModelRequest, ModelResponse, OpenAiConfig,
    OpenAiProvider, Provider, ProviderError, Task, TokenCounter,
};
use nerve_core::event::{CallPurpose, CompactionStrategy};
use nerve_core::{
    ContextArchive, Event, EventSink, ExecutionId, Message, MessageRole, SinkError, TaskId,
    TaskStatus, ToolCall, ToolDefinition, ToolError, ToolExecutor, ToolOutput,
};
use tokio_util::sync::CancellationToken;
use trajectory::{Fact, Kind, Noise, Shape, Trajectory, haystack};
use window_server::{Answer, WindowServer, completion};

const SEEDS: [u64; 5] = [11, 22, 33, 44, 55];
const WINDOWS: [u64; 4] = [4_096, 8_000, 16_000, 32_000];
/// The second, smaller table: the same seeds with realistic noise (`Noise::Realistic`), to
/// see how far the first one carries over.
const REALISTIC_WINDOWS: [u64; 2] = [8_000, 32_000];
/// The second generator's windows.
const SECOND_WINDOWS: [u64; 3] = [8_000, 16_000, 32_000];
const REALISTIC_STRATEGIES: [Strategy; 4] = [
    Strategy::Truncate,
    Strategy::Mask,
    Strategy::Layered,
    Strategy::Extractive,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Strategy {
    None,
    Truncate,
    Mask,
    Layered,
    Extractive,
}

impl Strategy {
    const ALL: [Self; 5] = [
        Self::None,
        Self::Truncate,
        Self::Mask,
        Self::Layered,
        Self::Extractive,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Truncate => "truncate oldest",
            Self::Mask => "masking only",
            Self::Layered => "layered, scripted summary",
            Self::Extractive => "layered, extractive fallback",
        }
    }
}

/// Answers each call with the output the trajectory generated for its id.
struct GeneratedTools {
    outputs: HashMap<String, (String, bool)>,
}

#[async_trait]
impl ToolExecutor for GeneratedTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let tool = |name: &str, description: &str, parameters: serde_json::Value| ToolDefinition {
            name: name.into(),
            description: description.into(),
            parameters,
        };
        vec![
            tool(
                "shell",
                "Run a shell command in the workspace.",
                serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
            ),
            tool(
                "read_file",
                "Read a file of the workspace.",
                serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            ),
            tool(
                "apply_patch",
                "Apply a unified diff to a file.",
                serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}, "patch": {"type": "string"}}, "required": ["path", "patch"]}),
            ),
        ]
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        Ok(match self.outputs.get(&call.id.0) {
            Some((content, false)) => ToolOutput::ok(content.clone()),
            Some((content, true)) => ToolOutput::error(content.clone()),
            None => ToolOutput::error(format!("no generated output for call {}", call.id)),
        })
    }
}

/// Keeps what the benchmark reports of the events: the compactions.
#[derive(Default)]
struct Sink(Mutex<Vec<(CompactionStrategy, bool)>>);

#[async_trait]
impl EventSink for Sink {
    async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        if let Event::Compaction(compaction) = event {
            self.0
                .lock()
                .unwrap()
                .push((compaction.strategy, compaction.extractive));
        }
        Ok(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Summaries {
    /// Answered by [`good_summary`].
    Good,
    /// Passed to the cassette, which has no summary lines: the call fails.
    Fail,
}

/// What the provider saw of the agent's requests.
#[derive(Debug, Default)]
struct Record {
    calls: usize,
    /// The largest request (messages and tool definitions), in tokens.
    peak: u64,
    /// Messages in each agent request, in order.
    lengths: Vec<usize>,
    /// (fact index, in the request of the turn that needs it): in view when the model
    /// writes the turn that asks for it.
    at_need: Vec<(usize, bool)>,
    /// (fact index, in the request after the turn that asks for it): in view when the
    /// model acts on what it asked.
    after_ask: Vec<(usize, bool)>,
    /// The previous agent request, to see how much of each request repeats it.
    previous: Vec<Message>,
    /// Tokens of all agent requests, and of their leading messages identical to the
    /// previous request's (what a provider's prompt cache can reuse).
    sent_tokens: u64,
    reused_tokens: u64,
    /// Relevance notes (`[Nerve] Archived lines …`) the engine appended, and their characters.
    notes: usize,
    note_chars: usize,
    /// With `NERVE_BENCH_MISSES`: per fact, where each request held it, as (turn, holder)
    /// at every change (see [`holder`]), to tell which step lost a fact.
    trails: HashMap<usize, Vec<(usize, &'static str)>>,
}

/// Which part of a request holds all of `fact`'s needles: the original output, a masked
/// placeholder's digest, an offload preview, a summary, a relevance note, the assistant's
/// text; `none` when no part does (`split` when the request does, but no one part).
fn holder(messages: &[Message], fact: &Fact) -> &'static str {
    for message in messages.iter().rev() {
        for part in &message.parts {
            let (text, label) = match part {
                nerve_core::MessagePart::ToolResult(result) => (
                    result.content.as_str(),
                    if result.content.starts_with("[masked: ") {
                        "digest"
                    } else if result.content.starts_with("[archived output: ") {
                        "preview"
                    } else {
                        "output"
                    },
                ),
                nerve_core::MessagePart::CompactionSummary { text, .. } => {
                    (text.as_str(), "summary")
                }
                nerve_core::MessagePart::Text { text } if text.starts_with("[Nerve] Archived") => {
                    (text.as_str(), "note")
                }
                nerve_core::MessagePart::Text { text } => (
                    text.as_str(),
                    if message.role == MessageRole::Assistant {
                        "assistant"
                    } else {
                        "text"
                    },
                ),
                nerve_core::MessagePart::ToolCall(_) | nerve_core::MessagePart::Thinking { .. } => {
                    continue;
                }
            };
            if fact.is_in(text) {
                return label;
            }
        }
    }
    if fact.is_in(&haystack(messages)) {
        "split"
    } else {
        "none"
    }
}

/// Records every agent request, then sends it (and every summary request) through the
/// OpenAI client to the [`WindowServer`], which refuses what is over the window and
/// answers the rest from the cassette (agent turns) or [`good_summary`] (summaries).
struct BenchProvider {
    client: OpenAiProvider,
    trajectory: Arc<Trajectory>,
    counter: CachedCounter<Estimate>,
    record: Mutex<Record>,
}

#[async_trait]
impl Provider for BenchProvider {
    fn name(&self) -> &str {
        "bench"
    }

    fn model(&self) -> &str {
        // The engine counts with the calibrated estimate, as for the scripted provider.
        "scripted"
    }

    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
        if request.purpose == CallPurpose::Agent {
            let mut record = self.record.lock().unwrap();
            record.calls += 1;
            let turn = record.calls;
            let tokens = self.counter.count_messages(request.messages)
                + self.counter.count_tools(request.tools);
            record.peak = record.peak.max(tokens);
            let common = request
                .messages
                .iter()
                .zip(&record.previous)
                .take_while(|(a, b)| a == b)
                .count();
            record.reused_tokens += self.counter.count_messages(&request.messages[..common]);
            record.sent_tokens += self.counter.count_messages(request.messages);
            record.previous = request.messages.to_vec();
            if let Some(last) = request.messages.last().map(Message::text_content)
                && last.starts_with("[Nerve] Archived lines")
            {
                record.notes += 1;
                record.note_chars += last.len();
            }
            record.lengths.push(request.messages.len());
            if misses_wanted() {
                for (index, fact) in self.trajectory.facts.iter().enumerate() {
                    if fact.planted < turn && turn <= fact.needed {
                        let label = holder(request.messages, fact);
                        let trail = record.trails.entry(index).or_default();
                        if trail.last().is_none_or(|(_, last)| *last != label) {
                            trail.push((turn, label));
                        }
                    }
                }
            }
            let needed: Vec<(usize, &Fact)> = self.trajectory.needed_at(turn).collect();
            let asked: Vec<(usize, &Fact)> = self.trajectory.needed_at(turn - 1).collect();
            if !needed.is_empty() || !asked.is_empty() {
                let text = haystack(request.messages);
                for (index, fact) in needed {
                    record.at_need.push((index, fact.is_in(&text)));
                }
                for (index, fact) in asked {
                    record.after_ask.push((index, fact.is_in(&text)));
                }
            }
        }
        self.client.complete(request).await
    }
}

/// The server's answers: summary requests (known by the summary prompt) get
/// [`good_summary`] or, with [`Summaries::Fail`], a permanent error; agent requests get
/// the cassette's next line.
fn answers(
    trajectory: Arc<Trajectory>,
    cassette: &str,
    summaries: Summaries,
) -> impl Fn(&serde_json::Value) -> Answer + Send + Sync + use<> {
    let lines: Mutex<VecDeque<serde_json::Value>> = Mutex::new(
        cassette
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect(),
    );
    move |request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let system = messages
            .first()
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default();
        if system.starts_with(&SUMMARY_PROMPT[..40]) {
            return match summaries {
                Summaries::Good => {
                    let transcript = messages
                        .iter()
                        .filter(|m| m["role"] == "user")
                        .filter_map(|m| m["content"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n");
                    Ok(completion(&good_summary(&trajectory, &transcript), &[]))
                }
                Summaries::Fail => Err((
                    400,
                    serde_json::json!({"error": {"message": "this run has no summariser", "type": "invalid_request_error"}}),
                )),
            };
        }
        let Some(line) = lines.lock().unwrap().pop_front() else {
            return Err((
                400,
                serde_json::json!({"error": {"message": "script exhausted", "type": "invalid_request_error"}}),
            ));
        };
        let calls: Vec<(String, String, serde_json::Value)> = line["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|call| {
                (
                    call["id"].as_str().unwrap_or_default().to_owned(),
                    call["name"].as_str().unwrap_or_default().to_owned(),
                    call["arguments"].clone(),
                )
            })
            .collect();
        Ok(completion(
            line["text"].as_str().unwrap_or_default(),
            &calls,
        ))
    }
}

/// The summary a good model writes from the transcript it is given: the sections of the
/// summary prompt, the latest steps, and every planted fact the transcript (history and
/// earlier summary) still shows, stated exactly. It cannot know facts the transcript does
/// not hold: of a tool output masked before the summary it sees only the placeholder and
/// the digest the placeholder carries.
fn good_summary(trajectory: &Trajectory, transcript: &str) -> String {
    let (earlier, history) = transcript
        .split_once("HISTORY:\n")
        .unwrap_or(("", transcript));
    let mut total = 0;
    let mut steps: Vec<String> = Vec::new();
    let mut in_done = false;
    for line in earlier.lines() {
        if line.starts_with("## ") {
            in_done = line == "## Done";
            continue;
        }
        if let Some(rest) = line.strip_prefix("- ").filter(|_| in_done) {
            match rest.strip_suffix(" tool calls so far; the latest:") {
                Some(n) => total = n.parse().unwrap_or(0),
                None => steps.push(rest.to_owned()),
            }
        }
    }
    let mut next = String::new();
    for line in history.lines() {
        if let Some(call) = line.strip_prefix("tool call ") {
            let (name, arguments) = call.split_once(": ").unwrap_or((call, "{}"));
            let arguments: serde_json::Value =
                serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null);
            let what = arguments
                .get("command")
                .or_else(|| arguments.get("path"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            steps.push(format!("{name}: {what}"));
            total += 1;
        } else if let Some(text) = line.strip_prefix("assistant: ") {
            next = text.chars().take(300).collect();
        }
    }
    let latest = &steps[steps.len().saturating_sub(8)..];
    let mut out = format!(
        "## Goal\n- {}\n## Done\n- {total} tool calls so far; the latest:\n",
        trajectory.task
    );
    for step in latest {
        out.push_str(&format!("- {step}\n"));
    }
    let section = |out: &mut String, title: &str, kinds: &[Kind]| {
        out.push_str(&format!("## {title}\n"));
        for fact in trajectory
            .facts
            .iter()
            .filter(|f| kinds.contains(&f.kind) && f.is_in(transcript))
        {
            out.push_str(&format!("- {}\n", fact.statement));
        }
    };
    let findings: Vec<Kind> = Kind::ALL
        .iter()
        .chain(&trajectory::second::KINDS)
        .copied()
        .filter(|kind| !matches!(kind, Kind::Decision | Kind::Constraint))
        .collect();
    section(&mut out, "Findings", &findings);
    section(&mut out, "Decisions", &[Kind::Decision, Kind::Constraint]);
    out.push_str("## Open questions\n- none\n## Next steps\n");
    out.push_str(&format!("- {next}\n"));
    out
}

/// One engine run.
struct Run {
    messages: Vec<Message>,
    record: Record,
    archive: Arc<MemoryArchive>,
    execution: ExecutionId,
    compactions: Vec<(CompactionStrategy, bool)>,
    /// Requests the server refused as over the window, of all it received.
    rejected: usize,
    requests: usize,
    /// How the run ended, when not `completed`.
    failure: Option<String>,
}

fn engine_run(
    runtime: &tokio::runtime::Runtime,
    trajectory: &Arc<Trajectory>,
    cassette: &str,
    strategy: Strategy,
    window: Option<u64>,
) -> Run {
    let compaction = match strategy {
        Strategy::None => CompactionConfig {
            enabled: false,
            ..CompactionConfig::default()
        },
        Strategy::Mask => CompactionConfig {
            hard_percent: 1_000,
            pressure_hard_percent: 1_000,
            mask_digest_chars: 0,
            recall_lines_chars: 0,
            ..CompactionConfig::default()
        },
        Strategy::Layered | Strategy::Extractive => CompactionConfig::default(),
        Strategy::Truncate => unreachable!("truncation is emulated, not run"),
    };
    let summaries = if strategy == Strategy::Layered {
        Summaries::Good
    } else {
        Summaries::Fail
    };
    // Without a window (the uncompacted reference) the server enforces none.
    let server = runtime.block_on(WindowServer::start(
        window.unwrap_or(u64::MAX / 4),
        Arc::new(answers(Arc::clone(trajectory), cassette, summaries)),
    ));
    let mut client = OpenAiConfig::new("bench");
    client.base_url = server.base_url.clone();
    client.context_window = window;
    client.http = HttpConfig {
        proxy_from_env: false,
        ..HttpConfig::default()
    };
    let provider = Arc::new(BenchProvider {
        client: OpenAiProvider::new(client).unwrap(),
        trajectory: Arc::clone(trajectory),
        counter: CachedCounter::new(Estimate),
        record: Mutex::new(Record::default()),
    });
    let sink = Arc::new(Sink::default());
    let archive = Arc::new(MemoryArchive::default());
    let config = EngineConfig {
        context_window: window,
        max_turns: u32::try_from(trajectory.turns.len() + 10).unwrap(),
        compaction,
        // Stagnation is not what is measured here.
        stagnation: StagnationConfig {
            enabled: false,
            ..StagnationConfig::default()
        },
        ..EngineConfig::default()
    };
    let mut engine = AgentEngine::new(
        Arc::clone(&provider) as Arc<dyn Provider>,
        Arc::new(GeneratedTools {
            outputs: trajectory.outputs(),
        }),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        config,
    );
    engine.archive = Arc::clone(&archive) as Arc<dyn ContextArchive>;
    let execution = ExecutionId::new();
    let task = Task {
        id: TaskId::new(),
        description: trajectory.task.clone(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/workspace".into(),
    };
    let result = runtime
        .block_on(engine.run(execution, task, CancellationToken::new()))
        .unwrap();
    let failure = (result.termination_reason != nerve_core::TerminationReason::Completed)
        .then(|| format!("{:?}: {:?}", result.termination_reason, result.error));
    let record = std::mem::take(&mut *provider.record.lock().unwrap());
    let compactions = std::mem::take(&mut *sink.0.lock().unwrap());
    let seen = &server.seen;
    Run {
        messages: result.context.messages,
        record,
        archive,
        execution,
        compactions,
        rejected: seen.rejected.load(std::sync::atomic::Ordering::SeqCst),
        requests: seen.requests.load(std::sync::atomic::Ordering::SeqCst),
        failure,
    }
}

/// Whether to print, per run, how each fact missed before the turn that asks was lost
/// (`NERVE_BENCH_MISSES=1`).
fn misses_wanted() -> bool {
    std::env::var_os("NERVE_BENCH_MISSES").is_some()
}

/// The strategies to run (`NERVE_BENCH_STRATEGIES=mask,layered,extractive`, all by
/// default): a quicker run while working on one of them.
fn strategy_wanted(strategy: Strategy) -> bool {
    let key = match strategy {
        Strategy::None | Strategy::Truncate => return true,
        Strategy::Mask => "mask",
        Strategy::Layered => "layered",
        Strategy::Extractive => "extractive",
    };
    std::env::var("NERVE_BENCH_STRATEGIES")
        .ok()
        .is_none_or(|keep| keep.split(',').any(|s| s.trim() == key))
}

/// Whether `recall` gets `fact` back: a search with the words the agent knows returns a
/// block (among the 8 hits the tool shows) whose full text holds the fact.
fn recallable(runtime: &tokio::runtime::Runtime, run: &Run, fact: &Fact) -> bool {
    runtime.block_on(async {
        let hits = run
            .archive
            .search(run.execution, &fact.query, 8)
            .await
            .unwrap();
        for hit in hits {
            if let Some(block) = run.archive.fetch(run.execution, hit.id).await.unwrap() {
                let text = transcript(&block.messages.iter().collect::<Vec<_>>(), None);
                if fact.is_in(&text) {
                    return true;
                }
            }
        }
        false
    })
}

/// Truncation of the conversation `messages` (with per-message token `counts`) to
/// `budget`: the oldest messages after the leading system message and the task are
/// dropped until it fits, and a tool result left without its call goes too. Returns where
/// the kept tail starts.
fn truncation_start(messages: &[Message], counts: &[u64], budget: u64) -> usize {
    let mut total: u64 = counts.iter().sum();
    let mut start = 2.min(messages.len());
    while total > budget && start < messages.len() {
        total -= counts[start];
        start += 1;
    }
    while start < messages.len() && messages[start].role == MessageRole::Tool {
        start += 1;
    }
    start
}

fn truncated(messages: &[Message], start: usize) -> Vec<Message> {
    messages[..2.min(messages.len())]
        .iter()
        .chain(&messages[start..])
        .cloned()
        .collect()
}

/// Totals of one (strategy, window) cell over all seeds.
#[derive(Debug, Default, Clone)]
struct Cell {
    reductions: Vec<f64>,
    peak_share: f64,
    facts: usize,
    in_context: usize,
    at_need: usize,
    after_ask: usize,
    recallable: usize,
    either: usize,
    /// Per kind: facts, in context at the end, in context or recallable, in context before
    /// and after the turn that asks.
    by_kind: BTreeMap<Kind, (usize, usize, usize, usize, usize)>,
    masks: usize,
    summaries: usize,
    offloads: usize,
    sent_tokens: u64,
    reused_tokens: u64,
    /// Requests the server refused as over the window, of all it received.
    rejected: usize,
    requests: usize,
    /// Runs that did not complete, with how they ended.
    failures: Vec<String>,
    /// Relevance notes appended, and their characters, over all runs.
    notes: usize,
    note_chars: usize,
}

impl Cell {
    fn add_fact(
        &mut self,
        kind: Kind,
        in_context: bool,
        (at_need, after_ask): (bool, bool),
        recallable: bool,
    ) {
        self.facts += 1;
        self.in_context += usize::from(in_context);
        self.at_need += usize::from(at_need);
        self.after_ask += usize::from(after_ask);
        self.recallable += usize::from(recallable);
        self.either += usize::from(in_context || recallable);
        let entry = self.by_kind.entry(kind).or_default();
        entry.0 += 1;
        entry.1 += usize::from(in_context);
        entry.2 += usize::from(in_context || recallable);
        entry.3 += usize::from(at_need);
        entry.4 += usize::from(after_ask);
    }
}

fn percent(part: usize, whole: usize) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Every (window, strategy) cell over `seeds`, and per seed (seed, uncompacted tokens,
/// facts, tokens in tool outputs).
struct Measured {
    cells: BTreeMap<(u64, Strategy), Cell>,
    sizes: Vec<(u64, u64, usize, u64)>,
}

fn measure(
    runtime: &tokio::runtime::Runtime,
    generate: &dyn Fn(u64) -> Trajectory,
    windows: &[u64],
) -> Measured {
    let mut cells: BTreeMap<(u64, Strategy), Cell> = BTreeMap::new();
    let mut sizes = Vec::new();
    for seed in SEEDS {
        let trajectory = Arc::new(generate(seed));
        let cassette = trajectory.cassette();
        let reference = engine_run(runtime, &trajectory, &cassette, Strategy::None, None);
        assert_eq!(reference.failure, None, "seed {seed}: the uncompacted run");
        let full_tokens = estimate_messages(&reference.messages);
        let counts: Vec<u64> = reference
            .messages
            .iter()
            .map(nerve_brain::provider::tokens::estimate_message)
            .collect();
        let in_outputs: u64 = reference
            .messages
            .iter()
            .zip(&counts)
            .filter(|(m, _)| m.role == MessageRole::Tool)
            .map(|(_, count)| count)
            .sum();
        sizes.push((seed, full_tokens, trajectory.facts.len(), in_outputs));
        let reference_text = haystack(&reference.messages);
        for (index, fact) in trajectory.facts.iter().enumerate() {
            assert!(
                fact.is_in(&reference_text),
                "seed {seed}: fact {index} missing from the uncompacted run"
            );
        }
        for &window in windows {
            // none: everything stays, nothing is archived.
            let cell = cells.entry((window, Strategy::None)).or_default();
            cell.reductions.push(0.0);
            cell.peak_share = cell
                .peak_share
                .max(reference.record.peak as f64 / window as f64);
            cell.sent_tokens += reference.record.sent_tokens;
            cell.reused_tokens += reference.record.reused_tokens;
            for fact in &trajectory.facts {
                cell.add_fact(fact.kind, true, (true, true), false);
            }
            // truncate oldest: each request of the uncompacted run, truncated; then the end.
            let cell = cells.entry((window, Strategy::Truncate)).or_default();
            let mut previous: Option<(usize, u64)> = None;
            let mut starts = Vec::with_capacity(reference.record.lengths.len());
            for &length in &reference.record.lengths {
                let start =
                    truncation_start(&reference.messages[..length], &counts[..length], window);
                let tokens =
                    counts[..2].iter().sum::<u64>() + counts[start..length].iter().sum::<u64>();
                cell.sent_tokens += tokens;
                // The previous request is reused whole when the cut did not move.
                cell.reused_tokens += match previous {
                    Some((before, before_tokens)) if before == start => before_tokens,
                    Some(_) => counts[..2].iter().sum::<u64>(),
                    None => 0,
                };
                cell.peak_share = cell.peak_share.max(tokens as f64 / window as f64);
                previous = Some((start, tokens));
                starts.push(start);
            }
            let end = truncated(
                &reference.messages,
                truncation_start(&reference.messages, &counts, window),
            );
            let text = haystack(&end);
            cell.reductions
                .push(1.0 - estimate_messages(&end) as f64 / full_tokens as f64);
            let sent_at = |turn: usize| {
                let turn = turn.min(reference.record.lengths.len());
                let length = reference.record.lengths[turn - 1];
                haystack(&truncated(&reference.messages[..length], starts[turn - 1]))
            };
            for fact in &trajectory.facts {
                cell.add_fact(
                    fact.kind,
                    fact.is_in(&text),
                    (
                        fact.is_in(&sent_at(fact.needed)),
                        fact.is_in(&sent_at(fact.needed + 1)),
                    ),
                    false,
                );
            }
            for strategy in [Strategy::Mask, Strategy::Layered, Strategy::Extractive] {
                if !strategy_wanted(strategy) {
                    continue;
                }
                let run = engine_run(runtime, &trajectory, &cassette, strategy, Some(window));
                if std::env::var_os("NERVE_BENCH_DUMP").is_some() && seed == SEEDS[0] {
                    for message in &run.messages {
                        println!(
                            "dump {window} {}: {:?} {}",
                            strategy.name(),
                            message.role,
                            haystack(std::slice::from_ref(message))
                        );
                        for part in &message.parts {
                            if let nerve_core::MessagePart::ToolResult(r) = part {
                                println!(
                                    "dump-result {}",
                                    r.content.chars().take(1500).collect::<String>()
                                );
                            }
                        }
                    }
                }
                if misses_wanted() {
                    for (index, fact) in trajectory.facts.iter().enumerate() {
                        if at_need_missed(&run, index) {
                            let trail =
                                run.record.trails.get(&index).map_or_else(String::new, |t| {
                                    t.iter()
                                        .map(|(turn, label)| format!("{label}@{turn}"))
                                        .collect::<Vec<_>>()
                                        .join(" → ")
                                });
                            println!(
                                "miss {window} {} seed {seed} {} (planted {}, needed {}): {trail}",
                                strategy.name(),
                                fact.kind.name(),
                                fact.planted,
                                fact.needed
                            );
                        }
                    }
                }
                let text = haystack(&run.messages);
                let at_need: HashMap<usize, bool> = run.record.at_need.iter().copied().collect();
                let after_ask: HashMap<usize, bool> =
                    run.record.after_ask.iter().copied().collect();
                let mut cell = cells.remove(&(window, strategy)).unwrap_or_default();
                cell.reductions
                    .push(1.0 - estimate_messages(&run.messages) as f64 / full_tokens as f64);
                cell.peak_share = cell.peak_share.max(run.record.peak as f64 / window as f64);
                cell.sent_tokens += run.record.sent_tokens;
                cell.reused_tokens += run.record.reused_tokens;
                cell.rejected += run.rejected;
                cell.notes += run.record.notes;
                cell.note_chars += run.record.note_chars;
                cell.requests += run.requests;
                if let Some(failure) = &run.failure {
                    cell.failures.push(format!("seed {seed}: {failure}"));
                }
                for (index, fact) in trajectory.facts.iter().enumerate() {
                    cell.add_fact(
                        fact.kind,
                        fact.is_in(&text),
                        (
                            at_need.get(&index).copied().unwrap_or(false),
                            after_ask.get(&index).copied().unwrap_or(false),
                        ),
                        recallable(runtime, &run, fact),
                    );
                }
                for (kind, _) in &run.compactions {
                    match kind {
                        CompactionStrategy::Mask => cell.masks += 1,
                        CompactionStrategy::Summarize | CompactionStrategy::Archive => {
                            cell.summaries += 1;
                        }
                        CompactionStrategy::Offload => cell.offloads += 1,
                    }
                }
                cells.insert((window, strategy), cell);
            }
        }
    }
    Measured { cells, sizes }
}

/// Whether `run` did not have fact `index` in context in the request before the turn that
/// asks for it.
fn at_need_missed(run: &Run, index: usize) -> bool {
    run.record
        .at_need
        .iter()
        .any(|&(i, present)| i == index && !present)
}

/// The main table: one row per window and strategy.
fn print_table(cells: &BTreeMap<(u64, Strategy), Cell>, windows: &[u64], strategies: &[Strategy]) {
    println!(
        "| window | strategy | token reduction | largest request / window | over-window requests | runs ended `error` | facts in context (end) | in context when needed | … after the turn that asks | recallable | in context or recallable | masks / summaries / offloads | prompt reuse |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &window in windows {
        for &strategy in strategies {
            let Some(cell) = cells.get(&(window, strategy)) else {
                continue;
            };
            let reduction =
                100.0 * cell.reductions.iter().sum::<f64>() / cell.reductions.len() as f64;
            let counts = match strategy {
                Strategy::Mask | Strategy::Layered | Strategy::Extractive => format!(
                    "{} / {} / {}",
                    cell.masks / SEEDS.len(),
                    cell.summaries / SEEDS.len(),
                    cell.offloads / SEEDS.len()
                ),
                Strategy::None | Strategy::Truncate => "–".to_owned(),
            };
            let reuse = format!(
                "{:.0}%",
                100.0 * cell.reused_tokens as f64 / cell.sent_tokens.max(1) as f64
            );
            let (rejected, failed) = match strategy {
                Strategy::Mask | Strategy::Layered | Strategy::Extractive => (
                    format!("{} of {}", cell.rejected, cell.requests),
                    format!("{} of {}", cell.failures.len(), SEEDS.len()),
                ),
                Strategy::None | Strategy::Truncate => ("–".to_owned(), "–".to_owned()),
            };
            println!(
                "| {}k | {} | {reduction:.0}% | {:.0}% | {rejected} | {failed} | {:.0}% | {:.0}% | {:.0}% | {:.0}% | {:.0}% | {counts} | {reuse} |",
                window / 1_000,
                strategy.name(),
                100.0 * cell.peak_share,
                percent(cell.in_context, cell.facts),
                percent(cell.at_need, cell.facts),
                percent(cell.after_ask, cell.facts),
                percent(cell.recallable, cell.facts),
                percent(cell.either, cell.facts),
            );
        }
    }
}

/// How the runs that did not complete ended, and how many relevance notes the runs got.
fn print_failures(cells: &BTreeMap<(u64, Strategy), Cell>) {
    for ((window, strategy), cell) in cells {
        if cell.notes > 0 {
            println!(
                "- {}k, {}: {:.1} relevance notes per run, {} characters each on average",
                window / 1_000,
                strategy.name(),
                cell.notes as f64 / SEEDS.len() as f64,
                cell.note_chars / cell.notes
            );
        }
    }
    for ((window, strategy), cell) in cells {
        for failure in &cell.failures {
            println!("- {}k, {}: {failure}", window / 1_000, strategy.name());
        }
    }
}

/// Facts in context at the end, by kind (or, with `when`, in context before and after the
/// turn that asks).
fn print_by_kind(
    cells: &BTreeMap<(u64, Strategy), Cell>,
    windows: &[u64],
    strategies: &[Strategy],
    kinds: &[Kind],
    when: bool,
) {
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    println!("| window | strategy | {} |", names.join(" | "));
    println!("|---|---|{}", "---|".repeat(names.len()));
    for &window in windows {
        for &strategy in strategies {
            let Some(cell) = cells.get(&(window, strategy)) else {
                continue;
            };
            let columns: Vec<String> = kinds
                .iter()
                .map(|kind| {
                    let (n, kept, either, before, after) =
                        cell.by_kind.get(kind).copied().unwrap_or_default();
                    if when {
                        format!("{:.0}% → {:.0}%", percent(before, n), percent(after, n))
                    } else {
                        format!("{:.0}% ({:.0}%)", percent(kept, n), percent(either, n))
                    }
                })
                .collect();
            println!(
                "| {}k | {} | {} |",
                window / 1_000,
                strategy.name(),
                columns.join(" | ")
            );
        }
    }
}

/// The line under a table's title: the trajectories' size.
fn print_sizes(turns: &str, kinds: usize, sizes: &[(u64, u64, usize, u64)]) {
    println!(
        "{} seeded trajectories ({turns} turns each; uncompacted: {} tokens on average, {:.0}% of them in tool outputs; {} needed facts in all, {} per kind)\n",
        SEEDS.len(),
        sizes.iter().map(|s| s.1).sum::<u64>() / sizes.len() as u64,
        100.0 * sizes.iter().map(|s| s.3).sum::<u64>() as f64
            / sizes.iter().map(|s| s.1).sum::<u64>() as f64,
        sizes.iter().map(|s| s.2).sum::<usize>(),
        sizes.iter().map(|s| s.2).sum::<usize>() / kinds,
    );
}

/// The parts to run (`NERVE_BENCH_RETENTION=first,second,realistic`, all by default) and
/// the windows to keep (`NERVE_BENCH_WINDOWS=16000,32000`, each part's own by default):
/// a quicker run while working on one generator.
struct Selection {
    parts: Option<String>,
    windows: Option<Vec<u64>>,
}

impl Selection {
    fn from_env() -> Self {
        Self {
            parts: std::env::var("NERVE_BENCH_RETENTION").ok(),
            windows: std::env::var("NERVE_BENCH_WINDOWS").ok().map(|w| {
                w.split(',')
                    .map(|n| n.trim().parse().expect("NERVE_BENCH_WINDOWS: numbers"))
                    .collect()
            }),
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.parts
            .as_deref()
            .is_none_or(|parts| parts.split(',').any(|p| p.trim() == part))
    }

    fn windows(&self, windows: &[u64]) -> Vec<u64> {
        windows
            .iter()
            .copied()
            .filter(|w| self.windows.as_ref().is_none_or(|keep| keep.contains(w)))
            .collect()
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let selection = Selection::from_env();
    if selection.runs("first") {
        first_generator(&runtime, &selection.windows(&WINDOWS));
    }
    if selection.runs("second") {
        second_generator(&runtime, &selection.windows(&SECOND_WINDOWS));
    }
    if selection.runs("realistic") {
        realistic_noise(&runtime, &selection.windows(&REALISTIC_WINDOWS));
    }
}

fn first_generator(runtime: &tokio::runtime::Runtime, windows: &[u64]) {
    let shape = Shape::default();
    let first = |seed| trajectory::generate(seed, shape);
    let Measured { cells, sizes } = measure(runtime, &first, windows);
    println!("Compaction fact retention");
    print_sizes(&shape.turns.to_string(), Kind::ALL.len(), &sizes);
    print_table(&cells, windows, &Strategy::ALL);
    print_failures(&cells);
    println!("\nFacts in context at the end, by kind (in context or recallable in brackets)\n");
    print_by_kind(&cells, windows, &Strategy::ALL, &Kind::ALL, false);
    println!("\nIn context when needed, by kind: before → after the turn that asks\n");
    print_by_kind(&cells, windows, &REALISTIC_STRATEGIES, &Kind::ALL, true);
}

/// The second generator: ten fact kinds the digests were not written against.
fn second_generator(runtime: &tokio::runtime::Runtime, windows: &[u64]) {
    let second = |seed| trajectory::second::generate(seed);
    let Measured { cells, sizes } = measure(runtime, &second, windows);
    println!("\nCompaction fact retention, second generator (ten other fact kinds)");
    print_sizes("84–129", trajectory::second::KINDS.len(), &sizes);
    print_table(&cells, windows, &Strategy::ALL);
    print_failures(&cells);
    println!(
        "\nSecond generator: facts in context at the end, by kind (in context or recallable in brackets)\n"
    );
    print_by_kind(
        &cells,
        windows,
        &REALISTIC_STRATEGIES,
        &trajectory::second::KINDS,
        false,
    );
    println!(
        "\nSecond generator: in context when needed, by kind: before → after the turn that asks\n"
    );
    print_by_kind(
        &cells,
        windows,
        &REALISTIC_STRATEGIES,
        &trajectory::second::KINDS,
        true,
    );
}

/// The same seeds with noise shaped like real tool output: how far the first table
/// carries over (docs/benchmarks.md, "How far this carries over").
fn realistic_noise(runtime: &tokio::runtime::Runtime, windows: &[u64]) {
    let shape = Shape {
        noise: Noise::Realistic,
        ..Shape::default()
    };
    let realistic = |seed| trajectory::generate(seed, shape);
    let Measured { cells, sizes } = measure(runtime, &realistic, windows);
    println!("\nCompaction fact retention with realistic noise");
    print_sizes(&shape.turns.to_string(), Kind::ALL.len(), &sizes);
    print_table(&cells, windows, &REALISTIC_STRATEGIES);
    print_failures(&cells);
    println!(
        "\nRealistic noise: facts in context at the end, by kind (in context or recallable in brackets)\n"
    );
    print_by_kind(&cells, windows, &REALISTIC_STRATEGIES, &Kind::ALL, false);
}
