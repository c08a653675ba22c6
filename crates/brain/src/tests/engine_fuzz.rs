//! The agent as a whole under random runs (a fuzz target): cassettes of random turns (tool
//! calls with outputs from a line to a few hundred kilobytes, answers, answers cut at
//! `max_tokens`, empty answers, transient and permanent errors, `context_overflow`,
//! summaries of any length or failing), windows from 1k to 200k tokens, a server that
//! counts prompts differently from the engine and refuses what is over the window by its
//! count, and every loop type. Each run must end with a termination reason, within a
//! bounded number of model calls and turns, and no request may exceed the window by the
//! engine's count.
//!
//! `cargo test` runs a few fixed-seed cases (`PROPTEST_CASES` sets how many);
//! `cargo xtask fuzz --minutes N engine` explores with fresh seeds.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nerve_core::{ContextArchive, EventSink, ExecutionId, LoopType, TaskId, TaskStatus};
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::Provider as _;
use crate::config::EngineConfig;
use crate::context::memory_archive::MemoryArchive;
use crate::engine::{AgentEngine, Task};
use crate::provider::retry::RetryPolicy;
use crate::provider::scripted::ScriptedProvider;
use crate::provider::tokens::TokenCounter;
use nerve_core::testing::{EchoTools, MemorySink};

/// One line of a random cassette.
#[derive(Debug, Clone)]
enum Line {
    /// Tool calls, each with an output of that many lines (0: a one-line echo), after some
    /// words of text.
    Tools { words: u16, outputs: Vec<u16> },
    /// A final answer.
    Answer { words: u16 },
    /// An answer cut at the output limit.
    Cut { words: u16 },
    /// An empty answer.
    Empty,
    /// A failed call of one error kind.
    Error(&'static str),
    /// A summary of that many characters (for a summary call).
    Summary { chars: u32 },
    /// A failed summary call.
    SummaryError(&'static str),
    /// A plan of that many steps (for a plan call).
    Plan { steps: u8 },
    /// The agent asks to compact.
    Compress,
    /// The agent recalls by words.
    Recall,
}

const ERRORS: [&str; 7] = [
    "context_overflow",
    "rate_limited",
    "overloaded",
    "server_error",
    "timeout",
    "auth",
    "bad_request",
];

fn error() -> impl Strategy<Value = &'static str> {
    proptest::sample::select(&ERRORS[..])
}

fn line() -> impl Strategy<Value = Line> {
    prop_oneof![
        8 => (0_u16..400, proptest::collection::vec(
            prop_oneof![3 => Just(0_u16), 2 => 1_u16..200, 1 => 200_u16..6_000],
            1..4,
        ))
            .prop_map(|(words, outputs)| Line::Tools { words, outputs }),
        1 => (0_u16..300).prop_map(|words| Line::Answer { words }),
        1 => (0_u16..3_000).prop_map(|words| Line::Cut { words }),
        1 => Just(Line::Empty),
        2 => error().prop_map(Line::Error),
        2 => (0_u32..60_000).prop_map(|chars| Line::Summary { chars }),
        1 => error().prop_map(Line::SummaryError),
        1 => (0_u8..9).prop_map(|steps| Line::Plan { steps }),
        1 => Just(Line::Compress),
        1 => Just(Line::Recall),
    ]
}

fn words(n: u16) -> String {
    (0..n)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The cassette line of `line`; the `i`th, so that tool calls differ.
fn cassette_line(i: usize, line: &Line) -> String {
    let usage = serde_json::json!({"input_tokens": 10, "output_tokens": 10});
    let value = match line {
        Line::Tools { words: n, outputs } => {
            let calls: Vec<serde_json::Value> = outputs
                .iter()
                .enumerate()
                .map(|(j, &lines)| {
                    let arguments = if lines == 0 {
                        serde_json::json!({"command": format!("echo {i}.{j}")})
                    } else {
                        serde_json::json!({"lines": lines, "fact": format!("fact {i}.{j}")})
                    };
                    serde_json::json!({"name": "shell", "arguments": arguments})
                })
                .collect();
            serde_json::json!({"text": words(*n), "tool_calls": calls, "usage": usage})
        }
        Line::Answer { words: n } => serde_json::json!({"text": words(*n), "usage": usage}),
        Line::Cut { words: n } => {
            serde_json::json!({"text": words(*n), "finish": "max_tokens", "usage": usage})
        }
        Line::Empty => serde_json::json!({"text": "", "usage": usage}),
        Line::Error(kind) => serde_json::json!({"error": kind, "retry_after_ms": 1}),
        Line::Summary { chars } => serde_json::json!({
            "call": "summary",
            "text": "## Goal\nx\n".to_owned() + &"s".repeat(*chars as usize),
        }),
        Line::SummaryError(kind) => serde_json::json!({"call": "summary", "error": kind}),
        Line::Plan { steps } => serde_json::json!({
            "call": "plan",
            "tool_calls": [{"name": "submit_plan", "arguments": {
                "steps": (0..*steps).map(|s| format!("step {s}")).collect::<Vec<_>>(),
            }}],
        }),
        Line::Compress => serde_json::json!({
            "tool_calls": [{"name": "compress_context", "arguments": {"reason": "fuzz"}}],
        }),
        Line::Recall => serde_json::json!({
            "tool_calls": [{"name": "recall", "arguments": {"query": format!("fact {}", i / 2)}}],
        }),
    };
    value.to_string()
}

/// A server in front of the scripted model: counts each prompt as `scale_permille`
/// thousandths of the engine's count and refuses one over `window` by that count (its
/// refusal stating the count when `states_count`); records the largest prompt by the
/// engine's count, and the calls.
struct Server {
    inner: ScriptedProvider,
    counter: Arc<dyn TokenCounter>,
    window: u64,
    scale_permille: u64,
    states_count: bool,
    largest: AtomicU64,
    calls: AtomicUsize,
    over: Mutex<Option<String>>,
}

#[async_trait::async_trait]
impl crate::Provider for Server {
    fn name(&self) -> &str {
        "fuzz"
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    async fn complete(
        &self,
        request: crate::ModelRequest<'_>,
    ) -> Result<crate::ModelResponse, crate::ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let prompt =
            self.counter.count_messages(request.messages) + self.counter.count_tools(request.tools);
        self.largest.fetch_max(prompt, Ordering::SeqCst);
        if prompt > self.window
            && let Ok(mut over) = self.over.lock()
        {
            over.get_or_insert_with(|| {
                format!(
                    "a {:?} request of {prompt} tokens in a window of {}",
                    request.purpose, self.window
                )
            });
        }
        let counted = prompt * self.scale_permille / 1000;
        if counted > self.window {
            return Err(crate::provider::http::context_overflow(
                if self.states_count {
                    format!(
                        "This model's maximum context length is {} tokens. However, you requested {} tokens ({counted} in the messages, 16 in the completion).",
                        self.window,
                        counted + 16
                    )
                } else {
                    "context_length_exceeded".to_owned()
                },
            ));
        }
        self.inner.complete(request).await
    }
}

/// One random run's settings.
#[derive(Debug, Clone)]
struct Case {
    lines: Vec<Line>,
    window: u64,
    scale_permille: u64,
    states_count: bool,
    max_turns: u32,
    loop_type: LoopType,
    agent_controlled: bool,
}

fn case() -> impl Strategy<Value = Case> {
    case_in(prop_oneof![
        1_000_u64..8_000,
        8_000_u64..64_000,
        64_000_u64..=200_000
    ])
}

/// Cases whose window is drawn from `windows`.
fn case_in(windows: impl Strategy<Value = u64>) -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(line(), 1..60),
        windows,
        prop_oneof![3 => Just(1000_u64), 1 => 500_u64..2_500],
        any::<bool>(),
        1_u32..40,
        proptest::sample::select(
            &[
                LoopType::React,
                LoopType::PlanExecute,
                LoopType::Hybrid,
                LoopType::Auto,
            ][..],
        ),
        proptest::bool::weighted(0.2),
    )
        .prop_map(
            |(lines, window, scale_permille, states_count, max_turns, loop_type, agent)| Case {
                lines,
                window,
                scale_permille,
                states_count,
                max_turns,
                loop_type,
                agent_controlled: agent,
            },
        )
}

/// Model calls a run may make per turn at most: an agent call and its retries, the
/// summaries of the compactions around it (each with retries), overflow compactions, plan
/// calls. Far above what a run makes; a loop that spins passes it.
const CALLS_PER_TURN: usize = 80;

/// What a run left to check: its result, the server that saw its requests, its events.
struct Outcome {
    result: crate::ExecutionResult,
    server: Arc<Server>,
    sink: Arc<MemorySink>,
}

/// Runs `case` to its end.
fn run_case(case: &Case) -> Result<Outcome, TestCaseError> {
    let cassette: Vec<String> = case
        .lines
        .iter()
        .enumerate()
        .map(|(i, line)| cassette_line(i, line))
        .collect();
    let inner = ScriptedProvider::parse("fuzz", &cassette.join("\n"))
        .map_err(|e| TestCaseError::fail(format!("cassette: {e}")))?;
    let counter = crate::provider::tokens::counter_for_model(inner.model());
    let server = Arc::new(Server {
        inner,
        counter,
        window: case.window,
        scale_permille: case.scale_permille,
        states_count: case.states_count,
        largest: AtomicU64::new(0),
        calls: AtomicUsize::new(0),
        over: Mutex::new(None),
    });
    let mut config = EngineConfig {
        context_window: Some(case.window),
        max_turns: case.max_turns,
        loop_type: case.loop_type,
        // Waits of a millisecond: the schedule's shape, not its length, is under test.
        retry: RetryPolicy {
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
            connection_base_delay: Duration::from_millis(1),
            ..RetryPolicy::default()
        },
        ..EngineConfig::default()
    };
    config.compaction.agent_controlled = case.agent_controlled;
    let sink = Arc::new(MemorySink::default());
    let mut engine = AgentEngine::new(
        Arc::clone(&server) as Arc<dyn crate::Provider>,
        Arc::new(EchoTools::default()),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        config,
    );
    engine.archive = Arc::new(MemoryArchive::default()) as Arc<dyn ContextArchive>;
    let task = Task {
        id: TaskId::new(),
        description: "fuzz the engine: keep the build green".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let result = runtime
        .block_on(engine.run(ExecutionId::new(), task, CancellationToken::new()))
        .map_err(|e| TestCaseError::fail(format!("the run did not start: {e}")))?;
    Ok(Outcome {
        result,
        server,
        sink,
    })
}

fn check(case: &Case) -> Result<(), TestCaseError> {
    let Outcome {
        result,
        server,
        sink: _,
    } = run_case(case)?;
    let reason = result.termination_reason;
    prop_assert!(
        reason != nerve_core::TerminationReason::Error || result.error.is_some(),
        "an error ending without its message"
    );
    let turns = result.context.turns.len();
    prop_assert!(
        turns <= case.max_turns as usize,
        "{turns} turns, at most {} allowed ({reason:?})",
        case.max_turns
    );
    let calls = server.calls.load(Ordering::SeqCst);
    let bound = (case.max_turns as usize + 2) * CALLS_PER_TURN;
    prop_assert!(
        calls <= bound,
        "{calls} model calls for {turns} turns ({reason:?})"
    );
    let over = server.over.lock().map(|o| o.clone()).unwrap_or_default();
    prop_assert!(
        over.is_none(),
        "{} (ended {reason:?}, {turns} turns)",
        over.unwrap_or_default()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // A few in `cargo test` (each run is a whole execution); the fuzz passes set more.
        cases: crate::tests::proptest_cases(16),
        ..ProptestConfig::default()
    })]

    /// Every random run ends with a termination reason, within its turns and a bounded
    /// number of model calls, and never sends a request over the window.
    #[test]
    fn every_run_ends_within_bounds_and_the_window(case in case()) {
        check(&case)?;
    }

    /// The same in windows of 300 to 1,000 tokens, where the system prompt and the tool
    /// definitions alone take half or more, and what compaction leaves of each message
    /// (its floor) decides whether a request fits: the last turn's results are folded,
    /// or the run ends before it sends a request over the window.
    #[test]
    fn small_windows_end_within_bounds_and_the_window(case in case_in(300_u64..1_000)) {
        check(&case)?;
    }
}

/// A case of one turn of `calls` tool calls (outputs of 30 lines), then an answer, in a
/// window of `window` tokens.
fn last_turn_of(calls: usize, window: u64) -> Case {
    Case {
        lines: vec![
            Line::Tools {
                words: 0,
                outputs: vec![30; calls],
            },
            Line::Answer { words: 5 },
        ],
        window,
        scale_permille: 1000,
        states_count: true,
        max_turns: 5,
        loop_type: LoopType::React,
        agent_controlled: false,
    }
}

/// A tiny window whose last turn holds eight tool results, each masked to its floor (the
/// line that names its block): before the fold, the second request was sent at about 830
/// tokens into a window of 600 (and of 500). Now the results are folded into one
/// placeholder and the request fits; where even that is too much, the run ends with an
/// error before sending it.
#[test]
fn a_last_turn_of_many_results_is_folded_or_the_run_ends_before_sending() {
    let outcome = run_case(&last_turn_of(8, 600)).unwrap();
    let largest = outcome.server.largest.load(Ordering::SeqCst);
    assert!(largest <= 600, "a request of {largest} tokens");
    assert_eq!(
        outcome.result.termination_reason,
        nerve_core::TerminationReason::Completed,
        "{:?}",
        outcome.result.error
    );
    let folds: Vec<_> = outcome
        .sink
        .events()
        .into_iter()
        .filter_map(|event| {
            if let nerve_core::Event::Compaction(c) = event {
                Some(c)
            } else {
                None
            }
        })
        .filter(|c| format!("{:?}", c.replacement).contains("were dropped for room"))
        .collect();
    assert_eq!(folds.len(), 1, "one fold of the last turn's results");
    let [folded] = folds[0].replacement.as_slice() else {
        panic!("{:?}", folds[0].replacement)
    };
    assert_eq!(folded.parts.len(), 8, "every call keeps a result");

    // A window of 500: the system prompt, the tools, the task, the calls and the fold do
    // not fit. The run ends before its second request, saying why.
    let outcome = run_case(&last_turn_of(8, 500)).unwrap();
    assert_eq!(
        outcome.result.termination_reason,
        nerve_core::TerminationReason::Error
    );
    let error = outcome.result.error.unwrap_or_default();
    assert!(error.contains("does not fit the window"), "{error}");
    assert_eq!(outcome.server.calls.load(Ordering::SeqCst), 1);
    assert!(outcome.server.largest.load(Ordering::SeqCst) <= 500);
}
