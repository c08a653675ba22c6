//! Compaction speed on a conversation of one million tokens, through the engine.
//!
//! The conversation is a generated agent trajectory (`trajectory/mod.rs`: build and test
//! logs, searches, source files, configuration, docs, patches), cut at 1,000,000 tokens by
//! the engine's own count. Each sample resumes it with `AgentEngine::resume` and times the
//! first turn boundary: from the `resumed` event to the moment the agent call reaches the
//! provider. That span is everything the engine does there — the boundary checks and the
//! compaction the window calls for: planning, archiving the originals (in memory), the
//! summary (the extractive fallback, or a model answer that arrives at once), splicing,
//! recounting, the `compaction` event and the indicator refresh. A window without
//! compaction gives the boundary's own cost. Counting the conversation when the run is set
//! up comes before the `resumed` event and is not timed.
//!
//! `cargo xtask bench compaction`, or `cargo bench -p nerve-brain --bench compaction_speed`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)] // A benchmark printing its table.

#[path = "trajectory/mod.rs"]
mod trajectory;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nerve_brain::context::compaction_plan::{
    self, CompactionConfig, SummaryPolicy, extractive_summary, plan_mask, plan_summary,
};
use nerve_brain::provider::tokens::{estimate_message, estimate_text};
use nerve_brain::run::system_prompt::PromptProfile;
use nerve_brain::{
    AgentEngine, EngineConfig, ModelRequest, ModelResponse, Provider, ProviderError, ResumeState,
};
use nerve_core::event::{CallPurpose, CompactionStrategy, ModelErrorKind};
use nerve_core::{
    Event, EventSink, ExecutionId, FinishReason, Message, MessagePart, MessageRole, MicroUsd,
    SinkError, TaskId, TaskStatus, TokenUsage, ToolCall, ToolDefinition, ToolError, ToolExecutor,
    ToolOutput,
};
use tokio_util::sync::CancellationToken;
use trajectory::Shape;

const TARGET_TOKENS: u64 = 1_000_000;
const WARMUP: usize = 2;
const SAMPLES: usize = 15;

/// When things happened in one sample.
#[derive(Debug, Default)]
struct Clock {
    resumed: Option<Instant>,
    compacted: Option<Instant>,
    called: Option<Instant>,
    compactions: Vec<(CompactionStrategy, u64, u64, bool)>,
}

type Shared = Arc<Mutex<Clock>>;

struct ClockSink(Shared);

#[async_trait]
impl EventSink for ClockSink {
    async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let now = Instant::now();
        let mut clock = self.0.lock().unwrap();
        if let Event::Resumed(_) = event {
            clock.resumed = Some(now);
        } else if let Event::Compaction(c) = event {
            clock.compacted = Some(now);
            clock
                .compactions
                .push((c.strategy, c.tokens_before, c.tokens_after, c.extractive));
        }
        Ok(0)
    }
}

/// The model: the agent answers at once and ends the run; a summary call either fails
/// (the extractive fallback runs) or returns `summary` at once.
struct Model {
    clock: Shared,
    summary: Option<String>,
}

#[async_trait]
impl Provider for Model {
    fn name(&self) -> &str {
        "bench"
    }

    fn model(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
        let answer = |text: &str| ModelResponse {
            message: Message::text(MessageRole::Assistant, text),
            usage: TokenUsage::new(10, 10),
            finish: FinishReason::Stop,
        };
        match request.purpose {
            CallPurpose::Agent | CallPurpose::Plan => {
                self.clock
                    .lock()
                    .unwrap()
                    .called
                    .get_or_insert_with(Instant::now);
                Ok(answer("Done."))
            }
            CallPurpose::Summary => match &self.summary {
                Some(summary) => Ok(answer(summary)),
                None => Err(ProviderError::Permanent {
                    kind: ModelErrorKind::ServerError,
                    message: "no summary in this scenario".into(),
                }),
            },
        }
    }
}

struct Tools;

#[async_trait]
impl ToolExecutor for Tools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        ["shell", "read_file", "apply_patch"]
            .iter()
            .map(|name| ToolDefinition {
                name: (*name).into(),
                description: format!("The {name} tool."),
                parameters: serde_json::json!({"type": "object"}),
            })
            .collect()
    }

    async fn execute(&self, _call: &ToolCall) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok(""))
    }
}

/// The conversation: system prompt, task, then whole turns until 1M tokens.
fn conversation() -> (Vec<Message>, u32) {
    let trajectory = trajectory::generate(
        7,
        Shape {
            turns: 1_600,
            ..Shape::default()
        },
    );
    let all = trajectory.messages(PromptProfile::Standard.system_prompt());
    let mut total = 0;
    let mut end = all.len();
    for (i, message) in all.iter().enumerate() {
        total += estimate_message(message);
        if total >= TARGET_TOKENS && message.role == MessageRole::Tool {
            end = i + 1;
            break;
        }
    }
    assert!(
        total >= TARGET_TOKENS,
        "the trajectory is too short: {total} tokens"
    );
    let turns = u32::try_from((end - 2) / 2).unwrap();
    (all[..end].to_vec(), turns)
}

#[derive(Debug, Clone, Copy)]
enum Scenario {
    Baseline,
    Mask,
    Extractive,
    ModelSummary,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Baseline => "no compaction due (the boundary's own cost)",
            Self::Mask => "mask (fill 70%: soft threshold)",
            Self::Extractive => "summarise, extractive fallback (fill 90%)",
            Self::ModelSummary => "summarise, model summary answered at once (fill 90%)",
        }
    }

    /// The window that puts `fill` at this scenario's threshold.
    fn window(self, fill: u64) -> Option<u64> {
        match self {
            Self::Baseline => Some(fill * 4),
            Self::Mask => Some(fill * 100 / 70),
            Self::Extractive | Self::ModelSummary => Some(fill * 100 / 90),
        }
    }
}

struct Sample {
    boundary: Duration,
    compaction: Option<Duration>,
    compactions: Vec<(CompactionStrategy, u64, u64, bool)>,
}

fn sample(
    runtime: &tokio::runtime::Runtime,
    messages: &[Message],
    turns: u32,
    fill: u64,
    scenario: Scenario,
) -> Sample {
    let clock: Shared = Arc::default();
    let summary = match scenario {
        Scenario::ModelSummary => Some(model_summary()),
        Scenario::Baseline | Scenario::Mask | Scenario::Extractive => None,
    };
    let engine = AgentEngine::new(
        Arc::new(Model {
            clock: Arc::clone(&clock),
            summary,
        }),
        Arc::new(Tools),
        Arc::new(ClockSink(Arc::clone(&clock))),
        EngineConfig {
            context_window: scenario.window(fill),
            max_turns: turns + 10,
            compaction: CompactionConfig::default(),
            ..EngineConfig::default()
        },
    );
    let state = ResumeState {
        task_id: TaskId::new(),
        messages: messages.to_vec(),
        turns,
        usage: TokenUsage::default(),
        cost: MicroUsd::ZERO,
        task_status: TaskStatus::InProgress,
        pending_turn_usage: TokenUsage::default(),
        in_doubt: Vec::new(),
        approvals: Vec::new(),
        attempt: 1,
        from_checkpoint_seq: None,
        finished_in_incomplete_turn: Vec::new(),
        workspace_tree: None,
    };
    let result = runtime
        .block_on(engine.resume(ExecutionId::new(), state, CancellationToken::new()))
        .unwrap();
    assert!(result.error.is_none(), "{:?}", result.error);
    let clock = std::mem::take(&mut *clock.lock().unwrap());
    let resumed = clock.resumed.expect("a resumed event");
    Sample {
        boundary: clock.called.expect("an agent call") - resumed,
        compaction: clock.compacted.map(|at| at - resumed),
        compactions: clock.compactions,
    }
}

/// A structured summary of the size a good model writes (about 1,500 tokens).
fn model_summary() -> String {
    let mut summary = String::from("## Goal\n- Fix the failing invoice export.\n## Done\n");
    for i in 0..40 {
        summary.push_str(&format!(
            "- ran `cargo test -p billing invoice_{i}` and read crates/billing/src/invoice_{i}.rs\n"
        ));
    }
    summary.push_str("## Findings\n");
    for i in 0..40 {
        summary.push_str(&format!(
            "- error[E0308] at crates/billing/src/export_{i}.rs:{}: expected `u32`, found `i64`\n",
            100 + i
        ));
    }
    summary.push_str("## Decisions\n- stream rows with `RowStreamer`\n## Open questions\n- none\n## Next steps\n- fix the casts\n");
    summary
}

fn stats(mut times: Vec<Duration>) -> (Duration, Duration, Duration) {
    times.sort();
    (times[times.len() / 2], times[0], times[times.len() - 1])
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1_000.0)
}

/// Times `f` (median of SAMPLES after WARMUP).
fn time<T>(mut f: impl FnMut() -> T) -> (Duration, Duration, Duration) {
    for _ in 0..WARMUP {
        std::hint::black_box(f());
    }
    stats(
        (0..SAMPLES)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(f());
                started.elapsed()
            })
            .collect(),
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (messages, turns) = conversation();
    let counts: Vec<u64> = messages.iter().map(estimate_message).collect();
    let fill: u64 = counts.iter().sum();
    let bytes: usize = trajectory::haystack(&messages).len();
    let in_outputs: u64 = messages
        .iter()
        .zip(&counts)
        .filter(|(m, _)| m.role == MessageRole::Tool)
        .map(|(_, count)| count)
        .sum();
    println!("Compaction speed");
    println!(
        "conversation: {} messages ({turns} turns), {fill} tokens (calibrated estimate; {:.0}% in tool outputs), {:.1} MB of text\n",
        messages.len(),
        100.0 * in_outputs as f64 / fill as f64,
        bytes as f64 / 1e6
    );
    println!(
        "Through the engine: first turn boundary after `AgentEngine::resume`, {SAMPLES} samples after {WARMUP} warm-ups\n"
    );
    println!(
        "| scenario | median | fastest | slowest | until the compaction event (median) | what the compaction did |"
    );
    println!("|---|---|---|---|---|---|");
    for scenario in [
        Scenario::Baseline,
        Scenario::Mask,
        Scenario::Extractive,
        Scenario::ModelSummary,
    ] {
        for _ in 0..WARMUP {
            sample(&runtime, &messages, turns, fill, scenario);
        }
        let samples: Vec<Sample> = (0..SAMPLES)
            .map(|_| sample(&runtime, &messages, turns, fill, scenario))
            .collect();
        let (median, fastest, slowest) = stats(samples.iter().map(|s| s.boundary).collect());
        let compaction = if samples.iter().all(|s| s.compaction.is_some()) {
            ms(stats(samples.iter().filter_map(|s| s.compaction).collect()).0)
        } else {
            "–".to_owned()
        };
        let what = samples[0]
            .compactions
            .iter()
            .map(|(strategy, before, after, extractive)| {
                format!(
                    "{strategy:?}{}: {before} → {after} tokens",
                    if *extractive { " (extractive)" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        println!(
            "| {} | {} | {} | {} | {compaction} | {} |",
            scenario.name(),
            ms(median),
            ms(fastest),
            ms(slowest),
            if what.is_empty() { "nothing" } else { &what }
        );
    }

    // The pure steps alone, on the same conversation, to show where the time goes.
    let window = fill * 100 / 90;
    let policy = SummaryPolicy {
        recent_turns: 3,
        recent_percent: 10,
        complexity: None,
        protect_from: None,
        min_messages: 4,
    };
    let plan = plan_summary(&messages, &counts, window, policy).unwrap();
    let summarised: Vec<&Message> = plan.summarised.iter().map(|&i| &messages[i]).collect();
    println!(
        "\nThe pure steps alone ({} of {} messages summarised):\n",
        summarised.len(),
        messages.len()
    );
    println!("| step | median | fastest | slowest |");
    println!("|---|---|---|---|");
    let transcript = compaction_plan::transcript(&summarised, None);
    let rows: [(&str, (Duration, Duration, Duration)); 6] = [
        (
            "`plan_summary`",
            time(|| plan_summary(&messages, &counts, window, policy)),
        ),
        (
            "`extractive_summary` (12,000 characters at most)",
            time(|| {
                extractive_summary("Fix the failing invoice export.", &summarised, None, 12_000)
            }),
        ),
        (
            "`transcript` (the summary call's input)",
            time(|| compaction_plan::transcript(&summarised, None)),
        ),
        (
            "counting that transcript (the summary call checks it fits)",
            time(|| estimate_text(&transcript)),
        ),
        ("`plan_mask`", time(|| plan_mask(&messages, &counts, 3))),
        (
            "`digest` of every tool output (300 characters each)",
            time(|| {
                messages
                    .iter()
                    .flat_map(|m| &m.parts)
                    .filter_map(|p| {
                        if let MessagePart::ToolResult(r) = p {
                            Some(compaction_plan::digest(&r.content, 300).len())
                        } else {
                            None
                        }
                    })
                    .sum::<usize>()
            }),
        ),
    ];
    for (step, (median, fastest, slowest)) in rows {
        println!(
            "| {step} | {} | {} | {} |",
            ms(median),
            ms(fastest),
            ms(slowest)
        );
    }
}
