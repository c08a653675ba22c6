//! Compaction through the engine: offload, masking, summarising (scripted summary and the
//! extractive fallback), agent control, overflow recovery, folding, and the invariants as
//! properties over random runs.

use std::sync::Arc;

use nerve_core::event::{
    CallOutcome, CallPurpose, CompactionStrategy, CompactionTrigger, ModelErrorKind,
};
use nerve_core::{
    BlockId, ContextArchive, Event, EventSink, ExecutionId, Message, MessagePart, MessageRole,
    TaskId, TaskStatus, TerminationReason, ToolResult,
};
use proptest::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::ExecutionResult;
use crate::config::EngineConfig;
use crate::context::compaction_plan::{CompactionConfig, digest, masked};
use crate::context::memory_archive::MemoryArchive;
use crate::engine::{AgentEngine, Task};
use crate::provider::scripted::ScriptedProvider;
use nerve_core::testing::{EchoTools, MemorySink};

struct Outcome {
    result: ExecutionResult,
    sink: Arc<MemorySink>,
    archive: Arc<MemoryArchive>,
    execution: ExecutionId,
}

impl Outcome {
    fn compactions(&self) -> Vec<nerve_core::event::Compaction> {
        self.sink
            .events()
            .into_iter()
            .filter_map(|e| {
                if let Event::Compaction(c) = e {
                    Some(c)
                } else {
                    None
                }
            })
            .collect()
    }
}

async fn run(cassette: &str, config: EngineConfig) -> Outcome {
    run_in(
        cassette,
        config,
        Arc::new(MemoryArchive::default()),
        ExecutionId::new(),
    )
    .await
}

/// A run of `execution` with `archive`, which may hold blocks already.
async fn run_in(
    cassette: &str,
    config: EngineConfig,
    archive: Arc<MemoryArchive>,
    execution: ExecutionId,
) -> Outcome {
    let provider = Arc::new(ScriptedProvider::parse("test", cassette).unwrap());
    run_with(provider, config, archive, execution).await
}

/// A run of `execution` against `provider`, with `archive`.
async fn run_with(
    provider: Arc<dyn crate::Provider>,
    config: EngineConfig,
    archive: Arc<MemoryArchive>,
    execution: ExecutionId,
) -> Outcome {
    let sink = Arc::new(MemorySink::default());
    let mut engine = AgentEngine::new(
        provider,
        Arc::new(EchoTools::default()),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        config,
    );
    engine.archive = Arc::clone(&archive) as Arc<dyn ContextArchive>;
    let task = Task {
        id: TaskId::new(),
        description: "the task: keep the build green".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    let result = engine
        .run(execution, task, CancellationToken::new())
        .await
        .unwrap();
    Outcome {
        result,
        sink,
        archive,
        execution,
    }
}

fn big(lines: u64, fact: &str) -> String {
    format!(
        r#"{{"tool_calls":[{{"name":"shell","arguments":{{"lines":{lines},"fact":"{fact}"}}}}],"usage":{{"input_tokens":10,"output_tokens":10}}}}"#
    )
}

fn small(n: u32) -> String {
    let filler =
        "the module compiles but the integration check still reports a stale cache entry; "
            .repeat(3);
    format!(
        r#"{{"text":"looking at part {n}: {filler}","tool_calls":[{{"name":"shell","arguments":{{"command":"step {n}"}}}}],"usage":{{"input_tokens":10,"output_tokens":10}}}}"#
    )
}

fn recall(block: &str) -> String {
    format!(r#"{{"tool_calls":[{{"name":"recall","arguments":{{"block_id":"{block}"}}}}]}}"#)
}

fn config(window: u64) -> EngineConfig {
    EngineConfig {
        context_window: Some(window),
        max_turns: 100,
        ..EngineConfig::default()
    }
}

#[tokio::test]
async fn a_large_output_is_offloaded_and_recall_returns_it() {
    let first = run(
        &[
            big(3_000, "the port is 8443, carry on"),
            r#"{"text":"done"}"#.to_owned(),
        ]
        .join("\n"),
        config(1_000_000),
    )
    .await;
    let offloads = first.compactions();
    assert_eq!(offloads.len(), 1);
    assert_eq!(offloads[0].strategy, CompactionStrategy::Offload);
    assert_eq!(offloads[0].trigger, CompactionTrigger::OutputSize);
    let block = offloads[0].archived[0];
    let tool_message = first
        .result
        .context
        .messages
        .iter()
        .find(|m| m.role == MessageRole::Tool)
        .unwrap();
    let kept = format!("{tool_message:?}");
    assert!(
        kept.contains(&block.to_string()) && !kept.contains("the port is 8443"),
        "a preview stays"
    );
    let archived = first
        .archive
        .fetch(first.execution, block)
        .await
        .unwrap()
        .unwrap();
    assert!(format!("{archived:?}").contains("the port is 8443"));

    // The agent gets it back with recall.
    let second = run(
        &[
            big(3_000, "the port is 8443, carry on"),
            recall(&block.to_string()),
            r#"{"text":"done"}"#.to_owned(),
        ]
        .join("\n"),
        config(1_000_000),
    )
    .await;
    // A fresh run makes a fresh block id: recall of the first run's block fails cleanly...
    let results: Vec<String> = second
        .result
        .context
        .messages
        .iter()
        .filter(|m| m.role == MessageRole::Tool)
        .map(|m| format!("{m:?}"))
        .collect();
    assert!(results[1].contains("no archived block"), "{}", results[1]);
    // ...and recall of its own block returns the output.
    let own = second.compactions()[0].archived[0];
    let third_cassette = [
        big(3_000, "the port is 8443, carry on"),
        r#"{"tool_calls":[{"name":"recall","arguments":{"query":"port 8443"}}]}"#.to_owned(),
        r#"{"text":"done"}"#.to_owned(),
    ]
    .join("\n");
    let third = run(&third_cassette, config(1_000_000)).await;
    let hits = format!(
        "{:?}",
        third
            .result
            .context
            .messages
            .iter()
            .filter(|m| m.role == MessageRole::Tool)
            .nth(1)
            .unwrap()
    );
    assert!(hits.contains("port is 8443"), "{hits}");
    assert_ne!(own, block);
}

/// Soft masking with digests: a masked output's error line stays in context, in the
/// placeholder that names the block holding the whole output; with `mask_digest_chars: 0`
/// the placeholder is bare.
#[tokio::test]
async fn masked_outputs_keep_their_error_lines_in_a_digest() {
    let script: Vec<String> = (0..30)
        .map(|i| {
            big(
                60,
                &format!("error[E0308]: mismatched types at src/f{i}.rs:{i}"),
            )
        })
        .chain([r#"{"text":"done"}"#.to_owned()])
        .collect();
    let error = "error[E0308]: mismatched types at src/f0.rs:0";
    for (digest_chars, kept) in [(300, true), (0, false)] {
        let mut config = config(12_000);
        config.compaction.mask_digest_chars = digest_chars;
        let outcome = run(&script.join("\n"), config).await;
        let masks: Vec<_> = outcome
            .compactions()
            .into_iter()
            .filter(|c| c.strategy == CompactionStrategy::Mask)
            .collect();
        assert!(!masks.is_empty(), "{:?}", outcome.compactions());
        assert!(masks.iter().all(|c| c.tokens_after < c.tokens_before));
        let first = outcome
            .result
            .context
            .messages
            .iter()
            .find_map(|m| match &m.parts[..] {
                [MessagePart::ToolResult(r)] => Some(r.content.clone()),
                _ => None,
            })
            .unwrap();
        assert!(first.starts_with("[masked: "), "{first}");
        assert!(first.contains(&masks[0].archived[0].to_string()), "{first}");
        assert_eq!(first.contains(error), kept, "{first}");
        let archived = outcome
            .archive
            .fetch(outcome.execution, masks[0].archived[0])
            .await
            .unwrap()
            .unwrap();
        assert!(format!("{archived:?}").contains(error));
    }
}

#[tokio::test]
async fn the_hard_threshold_summarises_with_the_scripted_summary() {
    let mut script: Vec<String> = (0..12).map(small).collect();
    script.push(r###"{"call":"summary","text":"## Goal\n- keep the build green\n## Findings\n- part 3 matters"}"###.to_owned());
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(&script.join("\n"), config(1_000)).await;
    assert_eq!(
        outcome.result.termination_reason,
        TerminationReason::Completed
    );
    let summaries: Vec<_> = outcome
        .compactions()
        .into_iter()
        .filter(|c| c.strategy == CompactionStrategy::Summarize)
        .collect();
    assert!(!summaries.is_empty(), "{:?}", outcome.compactions());
    assert!(!summaries[0].extractive);
    assert!(summaries[0].tokens_after < summaries[0].tokens_before);
    let messages = &outcome.result.context.messages;
    assert!(
        messages[0].text_content().contains("[Context: "),
        "the indicator is in the system prompt"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.pinned && m.text_content().contains("keep the build green"))
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| crate::context::compaction_plan::is_summary(m))
            .count(),
        1
    );
}

#[tokio::test]
async fn without_a_summary_line_the_extractive_fallback_is_used_and_a_second_compaction_folds() {
    let mut script: Vec<String> = (0..30).map(small).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(&script.join("\n"), config(1_200)).await;
    assert_completed(&outcome);
    let summaries: Vec<_> = outcome
        .compactions()
        .into_iter()
        .filter(|c| c.strategy == CompactionStrategy::Summarize)
        .collect();
    assert!(summaries.len() >= 2, "{}", summaries.len());
    assert!(summaries.iter().all(|c| c.extractive));
    // Folded, not nested: still exactly one summary in context, carrying every block.
    let messages = &outcome.result.context.messages;
    let in_context: Vec<_> = messages
        .iter()
        .filter(|m| crate::context::compaction_plan::is_summary(m))
        .collect();
    assert_eq!(in_context.len(), 1);
    let MessagePart::CompactionSummary { archived, .. } = &in_context[0].parts[0] else {
        panic!()
    };
    assert!(
        archived.len() >= 2,
        "the folded summary names every archived block"
    );
}

#[tokio::test]
async fn agent_controlled_mode_compacts_only_when_asked_below_the_safety_net() {
    let agent = |script: &[String]| {
        let mut config = config(1_200);
        config.compaction = CompactionConfig {
            agent_controlled: true,
            ..CompactionConfig::default()
        };
        (script.join("\n"), config)
    };
    // Well over 80% but under 95%: nothing happens on its own.
    let quiet: Vec<String> = (0..4)
        .map(small)
        .chain([r#"{"text":"done"}"#.to_owned()])
        .collect();
    let (cassette, cfg) = agent(&quiet);
    let outcome = run(&cassette, cfg).await;
    assert!(
        outcome
            .compactions()
            .iter()
            .all(|c| c.strategy != CompactionStrategy::Summarize)
    );
    // Asked: compacts at the next boundary. Outputs large enough that the archive note
    // (which lists block ids, random and so of varying token counts) always shrinks the
    // context, in a window that no threshold reaches.
    let mut asked: Vec<String> = (0..4).map(|i| big(40, &format!("fact {i}"))).collect();
    asked.push(r#"{"tool_calls":[{"name":"compress_context","arguments":{"reason":"sub-goal done","strategy":"archive"}}]}"#.to_owned());
    asked.push(r#"{"text":"done"}"#.to_owned());
    let (cassette, mut cfg) = agent(&asked);
    cfg.context_window = Some(100_000);
    let outcome = run(&cassette, cfg).await;
    let archived: Vec<_> = outcome
        .compactions()
        .into_iter()
        .filter(|c| c.trigger == CompactionTrigger::Agent)
        .collect();
    assert_eq!(
        archived.len(),
        1,
        "{:?} {:?}",
        outcome.compactions(),
        outcome.sink.events()
    );
    assert_eq!(archived[0].strategy, CompactionStrategy::Archive);
}

#[tokio::test]
async fn a_context_overflow_forces_compaction_and_one_retry() {
    let mut script: Vec<String> = (0..6).map(|i| big(100, &format!("fact {i}"))).collect();
    script.push(r#"{"error":"context_overflow"}"#.to_owned());
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(&script.join("\n"), config(100_000)).await;
    assert_completed(&outcome);
    assert!(
        outcome
            .compactions()
            .iter()
            .any(|c| c.trigger == CompactionTrigger::Overflow)
    );
    // Twice in a row, with no count stated, is an error, not a loop.
    let mut script: Vec<String> = (0..6).map(|i| big(100, &format!("fact {i}"))).collect();
    script.push(r#"{"error":"context_overflow"}"#.to_owned());
    script.push(r#"{"error":"context_overflow"}"#.to_owned());
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(&script.join("\n"), config(100_000)).await;
    assert_eq!(outcome.result.termination_reason, TerminationReason::Error);
    let error = outcome.result.error.unwrap();
    assert!(
        error.contains("still too large after compaction"),
        "{error}"
    );
}

#[tokio::test]
async fn unknown_capacity_never_compacts_by_threshold() {
    let mut script: Vec<String> = (0..20).map(small).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(
        &script.join("\n"),
        EngineConfig {
            max_turns: 100,
            ..EngineConfig::default()
        },
    )
    .await;
    assert!(outcome.compactions().is_empty());
}

fn random_script(turns: &[(u8, bool)]) -> String {
    let mut lines: Vec<String> = turns
        .iter()
        .enumerate()
        .map(|(i, (size, large))| {
            if *large {
                // An error line in the middle of the output: masking keeps it in a digest.
                big(
                    u64::from(*size) * 40,
                    &format!("fact {i}: error[E0308]: mismatched types at src/f{i}.rs:{i}"),
                )
            } else {
                format!(
                    r#"{{"text":"{} wait, let me verify {i}","tool_calls":[{{"name":"shell","arguments":{{"command":"echo {i}"}}}}],"usage":{{"input_tokens":1,"output_tokens":1}}}}"#,
                    "word ".repeat(usize::from(*size))
                )
            }
        })
        .collect();
    lines.push(r#"{"text":"done"}"#.to_owned());
    lines.join("\n")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: crate::tests::proptest_cases(24), ..ProptestConfig::default() })]

    /// Over random runs: no compaction grows the context; the task and the last turns
    /// survive every sequence of compactions; every archived block is retrievable.
    #[test]
    fn compaction_invariants(turns in prop::collection::vec((1u8..120, prop::bool::weighted(0.2)), 3..30), window in 600u64..4_000) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome = runtime.block_on(run(&random_script(&turns), config(window)));
        for compaction in outcome.compactions() {
            prop_assert!(compaction.tokens_after <= compaction.tokens_before, "{compaction:?}");
            for block in &compaction.archived {
                let fetched = runtime.block_on(outcome.archive.fetch(outcome.execution, *block)).unwrap();
                prop_assert!(fetched.is_some(), "block {block} is not retrievable");
            }
        }
        let messages = &outcome.result.context.messages;
        prop_assert!(messages.iter().any(|m| m.pinned && m.text_content().contains("keep the build green")));
        // At the smallest windows what compaction leaves (the system prompt, the tools, each
        // message's floor) can be over the window: the run then ends before sending it.
        let error = outcome.result.error.as_deref().unwrap_or_default();
        if error.contains("does not fit the window") {
            prop_assert!(window < 1_500, "{error}");
            return Ok(());
        }
        // The last assistant message and its predecessors of the recent window are intact.
        let last = messages.iter().rev().find(|m| m.role == MessageRole::Assistant).unwrap();
        prop_assert_eq!(last.text_content(), "done");
        let assistants: Vec<_> = messages.iter().filter(|m| m.role == MessageRole::Assistant && m.tool_calls().next().is_some()).collect();
        if let Some(previous) = assistants.last() {
            let expected = format!("echo {}", turns.len() - 1);
            let is_large = turns.last().is_some_and(|(_, large)| *large);
            prop_assert!(is_large || format!("{previous:?}").contains(&expected), "the last tool turn survives: {previous:?}");
        }
    }
}

/// Lines a tool output is made of: bulk, errors with locations, rules, settings, paths,
/// statuses, and lines longer than a digest line.
const OUTPUT_LINES: [&str; 14] = [
    "   Compiling serde v1.0.1",
    "error[E0308]: mismatched types",
    "  --> src/ledger.rs:41:9",
    "thread 'tests::exact' panicked at src/ledger.rs:88:5:",
    "  left: 1250",
    "Never edit migrations/0036_fx.sql; add a new one.",
    "Secrets are never written to logs.",
    "pool_size = 48",
    "crates/db/src/pool.rs:12:pub fn open() {}",
    "test result: ok. 3 passed; 0 failed",
    "[exit code: 2]",
    "",
    "    let row = self.rows.get(id).ok_or(Error::Missing)?;",
    "error: a very long line that goes on and on and on and on and on and on and on and on and on and on and on and on and on and on and on and on and on and on",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The digest of any output fits its budget, is made of (the starts of) the output's own
    /// lines, and is the same every time; the placeholder that carries it keeps the block id
    /// and is never longer than the output, unless the output is shorter than a bare
    /// placeholder (which masking then leaves alone).
    #[test]
    fn digests_fit_and_never_grow_the_output(
        picks in prop::collection::vec(0..OUTPUT_LINES.len(), 0..80),
        max_chars in 0usize..600,
    ) {
        let content = picks.iter().map(|&i| OUTPUT_LINES[i]).collect::<Vec<_>>().join("\n");
        let kept = digest(&content, max_chars);
        prop_assert!(kept.len() <= max_chars, "{} > {max_chars}", kept.len());
        prop_assert_eq!(&kept, &digest(&content, max_chars));
        for line in kept.lines() {
            prop_assert!(content.lines().any(|l| l.trim().starts_with(line)), "`{line}` is not from the output");
        }
        let block = BlockId::new();
        let message = Message::tool_result(ToolResult {
            call_id: "c".into(),
            name: "shell".into(),
            content: content.clone(),
            is_error: false,
        });
        let placeholder = |chars| {
            let masked = masked(&message, 100, block, chars);
            let MessagePart::ToolResult(r) = &masked.parts[0] else {
                panic!("{masked:?}")
            };
            r.content.clone()
        };
        let (bare, with) = (placeholder(0), placeholder(max_chars));
        prop_assert!(with.contains(&block.to_string()));
        prop_assert!(with.len() <= bare.len().max(content.len() * 3 / 5), "{} characters for {}", with.len(), content.len());
    }
}

/// In an output made of one repeated line shape, the line that differs is what a preview's
/// digest keeps of the middle it leaves out, whatever its format.
#[tokio::test]
async fn an_odd_line_among_repeated_ones_stays_in_the_preview() {
    let outcome = run(
        &[
            big(350, "the port is 8443 (owner: dana)"),
            r#"{"text":"done"}"#.to_owned(),
        ]
        .join("\n"),
        // An output budget of 2,400 tokens: the 350 lines are offloaded, and the odd line
        // is within the first 400 lines of the middle the preview leaves out.
        config(16_000),
    )
    .await;
    let tool_message = outcome
        .result
        .context
        .messages
        .iter()
        .find(|m| m.role == MessageRole::Tool)
        .unwrap();
    let kept = format!("{tool_message:?}");
    assert!(kept.contains("[archived output: "), "offloaded");
    assert!(kept.contains("the port is 8443 (owner: dana)"), "{kept}");
}

/// A provider that enforces the window as vLLM and OpenAI do: a request whose prompt
/// (messages and tool definitions, counted as the engine counts them) is over the window
/// fails with `context_overflow`. It records the largest prompt it was sent.
struct Windowed {
    inner: ScriptedProvider,
    window: u64,
    counter: crate::provider::tokens::CachedCounter<crate::provider::tokens::Estimate>,
    largest: std::sync::Mutex<u64>,
    rejected: std::sync::atomic::AtomicUsize,
    /// How the server's count compares with the engine's, in thousandths (1000: the same).
    scale_permille: u64,
    /// Whether a refusal states the server's count, as OpenAI's and llama.cpp's do.
    states_count: bool,
    /// Whether the provider passes on what the server's usage reports said about its
    /// count ([`crate::Provider::prompt_scale_permille`]), once it has answered once.
    reports_scale: bool,
    answered: std::sync::atomic::AtomicBool,
    /// How many more requests are refused after the first refusal, whatever their size
    /// (a server whose count of some content is far above any ratio).
    refuse_again: std::sync::atomic::AtomicUsize,
}

impl Windowed {
    fn new(script: &str, window: u64, scale_permille: u64, states_count: bool) -> Self {
        Self {
            inner: ScriptedProvider::parse("windowed", script).unwrap(),
            window,
            counter: crate::provider::tokens::CachedCounter::new(crate::provider::tokens::Estimate),
            largest: std::sync::Mutex::new(0),
            rejected: std::sync::atomic::AtomicUsize::new(0),
            scale_permille,
            states_count,
            reports_scale: false,
            answered: std::sync::atomic::AtomicBool::new(false),
            refuse_again: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Refusing `n` more requests after the first refusal.
    fn refusing_again(self, n: usize) -> Self {
        self.refuse_again
            .store(n, std::sync::atomic::Ordering::SeqCst);
        self
    }

    /// Passing on the server's scale once it has answered, as the HTTP providers do.
    fn reporting(self) -> Self {
        Self {
            reports_scale: true,
            ..self
        }
    }

    fn rejected(&self) -> usize {
        self.rejected.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A run of the task against this server, in a window of `window` tokens.
    async fn run(self: &Arc<Self>, window: u64) -> Outcome {
        run_with(
            Arc::clone(self) as Arc<dyn crate::Provider>,
            config(window),
            Arc::new(MemoryArchive::default()),
            ExecutionId::new(),
        )
        .await
    }
}

#[async_trait::async_trait]
impl crate::Provider for Windowed {
    fn name(&self) -> &str {
        "windowed"
    }

    fn model(&self) -> &str {
        self.inner.model()
    }

    fn prompt_scale_permille(&self) -> u64 {
        if self.reports_scale && self.answered.load(std::sync::atomic::Ordering::SeqCst) {
            self.scale_permille
        } else {
            1000
        }
    }

    async fn complete(
        &self,
        request: crate::ModelRequest<'_>,
    ) -> Result<crate::ModelResponse, crate::ProviderError> {
        use crate::provider::tokens::TokenCounter as _;
        let prompt = (self.counter.count_messages(request.messages)
            + self.counter.count_tools(request.tools))
            * self.scale_permille
            / 1000;
        {
            let mut largest = self.largest.lock().unwrap();
            *largest = (*largest).max(prompt);
        }
        let again = self.rejected() > 0
            && self
                .refuse_again
                .fetch_update(
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                    |n| n.checked_sub(1),
                )
                .is_ok();
        if prompt > self.window || again {
            self.rejected
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(crate::provider::http::context_overflow(
                if self.states_count {
                    format!(
                        "This model's maximum context length is {} tokens. However, you requested {} tokens ({prompt} in the messages, 256 in the completion).",
                        self.window,
                        prompt + 256
                    )
                } else {
                    format!(
                        "context_length_exceeded: the prompt is over the window of {}",
                        self.window
                    )
                },
            ));
        }
        self.answered
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.inner.complete(request).await
    }
}

struct WindowedOutcome {
    outcome: Outcome,
    largest: u64,
    rejected: usize,
}

async fn run_windowed(cassette: &str, window: u64) -> WindowedOutcome {
    run_windowed_in(
        cassette,
        window,
        Arc::new(MemoryArchive::default()),
        ExecutionId::new(),
    )
    .await
}

async fn run_windowed_in(
    cassette: &str,
    window: u64,
    archive: Arc<MemoryArchive>,
    execution: ExecutionId,
) -> WindowedOutcome {
    let provider = Arc::new(Windowed::new(cassette, window, 1000, false));
    let outcome = run_with(
        Arc::clone(&provider) as Arc<dyn crate::Provider>,
        config(window),
        archive,
        execution,
    )
    .await;
    let largest = *provider.largest.lock().unwrap();
    WindowedOutcome {
        outcome,
        largest,
        rejected: provider.rejected(),
    }
}

fn assert_completed(outcome: &Outcome) {
    assert_eq!(
        outcome.result.termination_reason,
        TerminationReason::Completed,
        "{:?}",
        outcome.result.error
    );
}

fn assert_fits(run: &WindowedOutcome, window: u64) {
    assert_completed(&run.outcome);
    assert_eq!(run.rejected, 0, "over-window requests");
    assert!(
        run.largest <= window,
        "largest request {} > {window}",
        run.largest
    );
}

/// The results of the tool calls, in order, as the events recorded them (the originals,
/// before any offload).
fn outputs(outcome: &Outcome) -> Vec<ToolResult> {
    outcome.sink.tool_results()
}

/// A server that counts twice what the engine counts (a tokenizer that splits text finer
/// than the estimate assumes): its overflow comes while the engine's own count is well
/// under the budget, and the compaction after it still makes the retry fit by the
/// server's count, every time, to the run's end.
#[tokio::test]
async fn an_overflow_the_engine_did_not_foresee_still_compacts_enough() {
    let window = 8_000;
    let mut script: Vec<String> = (0..3).map(|i| big(100, &format!("fact {i}"))).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let provider = Arc::new(Windowed::new(&script.join("\n"), window, 3_000, false));
    let outcome = provider.run(window).await;
    assert_completed(&outcome);
    assert!(
        provider.rejected() >= 1,
        "the server never refused: the test shows nothing"
    );
    assert!(
        outcome
            .compactions()
            .iter()
            .any(|c| c.trigger == CompactionTrigger::Overflow)
    );
}

/// A server that counts three times what the engine counts, and whose usage reports say
/// so: the thresholds weigh the fill as the server counts it, so the context is compacted
/// before the server would refuse it, and no request is ever refused.
#[tokio::test]
async fn a_server_that_reports_counting_more_is_compacted_for_before_it_refuses() {
    let window = 8_000;
    let mut script: Vec<String> = (0..3).map(|i| big(100, &format!("fact {i}"))).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let provider = Arc::new(Windowed::new(&script.join("\n"), window, 3_000, false).reporting());
    let outcome = provider.run(window).await;
    assert_completed(&outcome);
    assert_eq!(provider.rejected(), 0, "a request was refused");
    assert!(
        *provider.largest.lock().unwrap() <= window,
        "largest request {} > {window}",
        provider.largest.lock().unwrap()
    );
    assert!(
        !outcome.compactions().is_empty(),
        "nothing was compacted: the test shows nothing"
    );
}

/// A server that counts six times what the engine counts, and says how much it counted
/// when it refuses: the model's long answer takes the prompt far over the window by that
/// count; the compaction after the refusal aims at the budget by the server's count, so
/// the retry is never refused again, to the run's end.
#[tokio::test]
async fn an_overflow_that_states_the_servers_count_is_compacted_to_fit_that_count() {
    let window = 8_000;
    // The model's own long answer: no output to mask, so only a summary or a clip of that
    // answer can make room.
    let long = "the module compiles but the integration check still reports a stale cache entry; "
        .repeat(100);
    let script = [
        small(1),
        format!(
            r#"{{"text":"{long}","tool_calls":[{{"name":"shell","arguments":{{"command":"step 2"}}}}],"usage":{{"input_tokens":10,"output_tokens":10}}}}"#
        ),
        r#"{"text":"done"}"#.to_owned(),
    ];
    let provider = Arc::new(Windowed::new(&script.join("\n"), window, 6_000, true));
    let outcome = provider.run(window).await;
    assert_completed(&outcome);
    assert!(
        provider.rejected() >= 1,
        "the server never refused: the test shows nothing"
    );
    const OVERFLOW: CallOutcome = CallOutcome::Failed(ModelErrorKind::ContextOverflow);
    let calls: Vec<CallOutcome> = outcome
        .sink
        .events()
        .into_iter()
        .filter_map(|e| {
            if let Event::ModelCalled(c) = e
                && c.purpose == CallPurpose::Agent
            {
                Some(c.outcome)
            } else {
                None
            }
        })
        .collect();
    assert!(
        calls
            .windows(2)
            .all(|pair| !(pair[0] == OVERFLOW && pair[1] == OVERFLOW)),
        "a retry after the compaction was refused again: {calls:?}"
    );
}

/// A server that refuses the retry after a compaction too, stating its count: the call
/// compacts again (the count is new information) and the run goes on.
#[tokio::test]
async fn a_refusal_that_states_a_count_after_a_compaction_compacts_again() {
    let window = 8_000;
    let mut script: Vec<String> = (0..3).map(|i| big(100, &format!("fact {i}"))).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let provider =
        Arc::new(Windowed::new(&script.join("\n"), window, 3_000, true).refusing_again(1));
    let outcome = provider.run(window).await;
    assert_completed(&outcome);
    assert!(provider.rejected() >= 2, "{} refusals", provider.rejected());
    let overflows = outcome
        .compactions()
        .iter()
        .filter(|c| c.trigger == CompactionTrigger::Overflow)
        .map(|c| c.turn)
        .collect::<Vec<_>>();
    assert!(
        overflows.windows(2).any(|pair| pair[0] == pair[1]),
        "no call compacted twice: {overflows:?}"
    );
}

/// A server that refuses every prompt whatever its size, stating its count each time: the
/// call compacts a bounded number of times (each refusal is new information), and the run
/// ends `error` in one line naming the overflow.
#[tokio::test]
async fn a_server_that_refuses_every_prompt_ends_the_run_after_a_few_compactions() {
    let window = 8_000;
    let mut script: Vec<String> = (0..3).map(|i| big(60, &format!("fact {i}"))).collect();
    script.push(r#"{"text":"done"}"#.to_owned());
    let provider = Arc::new(Windowed::new(&script.join("\n"), 1, 1000, true));
    let outcome = provider.run(window).await;
    assert_eq!(outcome.result.termination_reason, TerminationReason::Error);
    let error = outcome.result.error.unwrap_or_default();
    assert!(
        error.starts_with("provider error: context_overflow: "),
        "{error}"
    );
    assert!(!error.contains('\n'), "{error}");
    let rejected = provider.rejected();
    assert!((1..=4).contains(&rejected), "{rejected} refusals");
}

/// A recent output of twice the window (4,096 tokens): offloaded at once with a preview
/// and its block id, and every request still fits.
#[tokio::test]
async fn a_recent_output_of_twice_the_window_is_offloaded_and_every_request_fits() {
    let window = 4_096;
    let script = [
        small(1),
        big(1_100, "the port is 8443"),
        big(1_100, "the owner is dana"),
        small(2),
        r#"{"text":"done"}"#.to_owned(),
    ]
    .join("\n");
    let run = run_windowed(&script, window).await;
    assert_fits(&run, window);
    let tool_outputs = outputs(&run.outcome);
    let big_output = &tool_outputs[1].content;
    let counter = crate::provider::tokens::Estimate;
    assert!(
        crate::provider::tokens::TokenCounter::count_text(&counter, big_output) >= 2 * window,
        "the output is twice the window"
    );
    let offload = run
        .outcome
        .compactions()
        .into_iter()
        .find(|c| c.strategy == CompactionStrategy::Offload)
        .expect("an offload");
    let block = offload.archived[0];
    let fetched = run
        .outcome
        .archive
        .fetch(run.outcome.execution, block)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(crate::context::compactor::block_text(&fetched), *big_output);
}

/// Many mid-sized outputs, three of them larger than the window, at windows down to
/// 4,096 tokens: no request is ever over the window and the run completes.
#[tokio::test]
async fn every_request_fits_at_small_windows() {
    for window in [4_096, 6_000, 8_000] {
        let mut script = Vec::new();
        for i in 0..30 {
            script.push(small(i));
            script.push(big(40 + u64::from(i % 7) * 30, &format!("fact {i}")));
            if i % 10 == 9 {
                script.push(big(2_000, &format!("huge {i}")));
            }
        }
        script.push(r#"{"text":"done"}"#.to_owned());
        let run = run_windowed(&script.join("\n"), window).await;
        assert_fits(&run, window);
    }
}

/// An answer cut at the output limit that is larger than the window and denser than two
/// characters a token (short numbered words): clipped once to its share it still counted
/// over the window (the engine fuzz found it), so it is clipped again, shorter, and the
/// continuation's request fits.
#[tokio::test]
async fn a_dense_answer_over_the_window_is_clipped_until_the_request_fits() {
    let words: Vec<String> = (0..1_988).map(|i| format!("w{i}")).collect();
    let cut = serde_json::json!({"text": words.join(" "), "finish": "max_tokens"});
    let script = format!("{cut}\n{{\"text\":\"done\"}}");
    for window in [6_383, 6_400] {
        let run = run_windowed(&script, window).await;
        assert_fits(&run, window);
    }
}

/// Recall results larger than the window, three in a row: each is one page within the
/// window's budget, saying how much remains, and every request fits.
#[tokio::test]
async fn recall_results_larger_than_the_window_come_in_pages_that_fit() {
    let window = 4_096;
    let first = run_windowed(
        &[
            big(3_000, "the port is 8443"),
            r#"{"text":"done"}"#.to_owned(),
        ]
        .join("\n"),
        window,
    )
    .await;
    let block = first.outcome.compactions()[0].archived[0].to_string();
    // The same block, archived in a second run's archive too: recall it there.
    let archived = first
        .outcome
        .archive
        .fetch(first.outcome.execution, block.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    let archive = Arc::new(MemoryArchive::default());
    let execution = ExecutionId::new();
    archive.archive(execution, archived.clone()).await.unwrap();
    let script = [
        recall(&block),
        recall(&block),
        format!(
            r#"{{"tool_calls":[{{"name":"recall","arguments":{{"block_id":"{block}","offset":1000}}}}]}}"#
        ),
        r#"{"text":"done"}"#.to_owned(),
    ]
    .join("\n");
    let second = run_windowed_in(&script, window, archive, execution).await;
    assert_fits(&second, window);
    let recalls = outputs(&second.outcome);
    assert_eq!(recalls.len(), 3);
    let total = crate::context::compactor::block_text(&archived)
        .chars()
        .count();
    assert!(
        total > 20_000,
        "the block is larger than the window: {total}"
    );
    for recalled in &recalls {
        assert!(!recalled.is_error, "{}", recalled.content);
        assert!(
            recalled.content.len() < 2_500,
            "a page within the window's budget: {}",
            recalled.content.len()
        );
        assert!(
            recalled
                .content
                .contains("more characters: call recall with block_id")
        );
    }
    assert!(recalls[2].content.contains("characters 1000.."));
}

/// Masking archives one block per output: the block a placeholder names holds exactly the
/// output it replaced, and `recall` by that id returns it.
#[tokio::test]
async fn a_masked_placeholders_block_holds_exactly_the_output_it_replaced() {
    let mut script = Vec::new();
    for i in 0..40 {
        script.push(small(i));
        script.push(big(60 + u64::from(i % 5) * 20, &format!("fact {i}")));
    }
    script.push(r#"{"text":"done"}"#.to_owned());
    let outcome = run(&script.join("\n"), config(20_000)).await;
    assert_eq!(
        outcome.result.termination_reason,
        TerminationReason::Completed
    );
    let originals: std::collections::HashMap<String, String> = outputs(&outcome)
        .into_iter()
        .map(|r| (r.call_id.0, r.content))
        .collect();
    let mut checked = 0;
    for compaction in outcome
        .compactions()
        .into_iter()
        .filter(|c| c.strategy == CompactionStrategy::Mask)
    {
        for message in &compaction.replacement {
            for part in &message.parts {
                let MessagePart::ToolResult(result) = part else {
                    continue;
                };
                let Some(rest) = result.content.strip_prefix("[masked: ") else {
                    continue;
                };
                let id: BlockId = rest
                    .split_once("as block ")
                    .unwrap()
                    .1
                    .split(';')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                let block = outcome
                    .archive
                    .fetch(outcome.execution, id)
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(block.messages.len(), 1, "one output per block");
                assert_eq!(
                    crate::context::compactor::block_text(&block),
                    originals[&result.call_id.0]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 10, "{checked} placeholders checked");
}

/// An output recalled twice, whose recall results are then masked and summarised, is
/// still archived once; so is an output produced twice.
#[tokio::test]
async fn an_output_recalled_twice_is_archived_once() {
    let first = run(
        &[
            big(1_200, "the port is 8443"),
            r#"{"text":"done"}"#.to_owned(),
        ]
        .join("\n"),
        config(1_000_000),
    )
    .await;
    let block = first.compactions()[0].archived[0];
    let archived = first
        .archive
        .fetch(first.execution, block)
        .await
        .unwrap()
        .unwrap();
    assert!(crate::context::compactor::block_text(&archived).contains("the port is 8443"));

    // A later run of the same execution (its archive holds the block) recalls it twice,
    // and produces one output twice.
    let archive = Arc::new(MemoryArchive::default());
    let execution = ExecutionId::new();
    archive.archive(execution, archived).await.unwrap();
    let mut script = vec![
        recall(&block.to_string()),
        recall(&block.to_string()),
        big(1_200, "the owner is dana"),
        big(1_200, "the owner is dana"),
    ];
    for i in 0..40 {
        script.push(small(i));
        script.push(big(120, &format!("fact {i}")));
    }
    script.push(r#"{"text":"done"}"#.to_owned());
    let second = run_in(&script.join("\n"), config(30_000), archive, execution).await;
    assert_eq!(
        second.result.termination_reason,
        TerminationReason::Completed,
        "{:?}",
        second.result.error
    );
    let offloads: Vec<BlockId> = second
        .compactions()
        .iter()
        .filter(|c| c.strategy == CompactionStrategy::Offload)
        .flat_map(|c| c.archived.clone())
        .collect();
    assert_eq!(offloads.len(), 2, "both outputs offloaded");
    assert_eq!(offloads[0], offloads[1], "the same output, the same block");
    let recalled_masked = second.compactions().iter().any(|c| {
        c.replacement.iter().any(|m| {
            m.parts.iter().any(|p| {
                matches!(p, MessagePart::ToolResult(r) if r.name == "recall" && r.content.starts_with("[masked: a recall result"))
            })
        })
    });
    assert!(recalled_masked, "the recall results were masked");
    let holding: Vec<_> = second
        .archive
        .search(second.execution, "8443", 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|hit| !hit.note.starts_with("summary"))
        .collect();
    assert_eq!(holding.len(), 1, "{holding:?}");
}

/// Relevance-driven recall: an output offloaded long ago holds a line like all its others
/// (its preview shows the head and the tail, and no digest keeps the line); when the agent later asks about what the line names, in its own words,
/// the line comes back after that turn, once, recorded as a message, within its budget. A
/// question about something the archive does not hold brings nothing.
#[tokio::test]
async fn a_line_the_agent_asks_about_comes_back_from_the_archive() {
    let fact = "orjson==3.9.104";
    let mut cassette = vec![
        r#"{"tool_calls":[{"name":"shell","arguments":{"freeze":400}}],"usage":{"input_tokens":10,"output_tokens":10}}"#.to_owned(),
    ];
    cassette.extend((0..30).map(small));
    cassette.push(
        r#"{"text":"Which pydantic release is this? Which orjson version is installed here?","tool_calls":[{"name":"shell","arguments":{"command":"step asked"}}]}"#.to_owned(),
    );
    cassette.push(r#"{"text":"done"}"#.to_owned());
    let window = 8_000;
    let outcome = run(&cassette.join("\n"), config(window)).await;
    assert_eq!(
        outcome.result.termination_reason,
        TerminationReason::Completed
    );
    // (index, message) of every message appended.
    let appended: Vec<(u32, Message)> = outcome
        .sink
        .events()
        .into_iter()
        .filter_map(|e| {
            if let Event::MessageAppended(m) = e {
                Some((m.index, m.message))
            } else {
                None
            }
        })
        .collect();
    let notes: Vec<&(u32, Message)> = appended
        .iter()
        .filter(|(_, m)| {
            m.role == MessageRole::User && m.text_content().starts_with("[Nerve] Archived lines")
        })
        .collect();
    assert_eq!(notes.len(), 1, "{notes:#?}");
    let (_, note) = notes[0];
    let text = note.text_content();
    assert!(text.contains(fact), "{text}");
    assert!(text.contains("`orjson`"), "{text}");
    assert!(!text.contains("pydantic"), "{text}");
    // It names the block that holds the whole output.
    let archived: Vec<BlockId> = outcome
        .compactions()
        .iter()
        .flat_map(|c| c.archived.clone())
        .collect();
    assert!(
        archived.iter().any(|id| text.contains(&id.to_string())),
        "{text}"
    );
    // Right after the question's turn: the last assistant message before it asks.
    let position = appended.iter().position(|(_, m)| m == note).unwrap();
    let asked = appended[..position]
        .iter()
        .rev()
        .find(|(_, m)| m.role == MessageRole::Assistant)
        .unwrap();
    assert!(
        asked.1.text_content().contains("Which orjson version"),
        "{asked:#?}"
    );
    // Bounded by the budget.
    let budget = CompactionConfig::default()
        .budget(Some(window))
        .recall_chars;
    assert!(text.len() <= budget + 400, "{} > {budget}", text.len());
}

/// The archive, counting its searches.
#[derive(Default)]
struct CountingArchive {
    inner: MemoryArchive,
    searches: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl ContextArchive for CountingArchive {
    async fn archive(
        &self,
        execution: ExecutionId,
        block: nerve_core::ArchivedBlock,
    ) -> Result<(), nerve_core::SinkError> {
        self.inner.archive(execution, block).await
    }

    async fn fetch(
        &self,
        execution: ExecutionId,
        id: BlockId,
    ) -> Result<Option<nerve_core::ArchivedBlock>, nerve_core::SinkError> {
        self.inner.fetch(execution, id).await
    }

    async fn search(
        &self,
        execution: ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<nerve_core::RecallHit>, nerve_core::SinkError> {
        self.searches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.search(execution, query, limit).await
    }
}

/// Archive searches made by a run of `cassette` at an 8,000-token window.
async fn recall_searches(cassette: &[String]) -> usize {
    let archive = Arc::new(CountingArchive::default());
    let mut engine = AgentEngine::new(
        Arc::new(ScriptedProvider::parse("test", &cassette.join("\n")).unwrap()),
        Arc::new(EchoTools::default()),
        Arc::new(MemorySink::default()),
        config(8_000),
    );
    engine.archive = Arc::clone(&archive) as Arc<dyn ContextArchive>;
    let task = Task {
        id: TaskId::new(),
        description: "the task: keep the build green".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(result.termination_reason, TerminationReason::Completed);
    archive.searches.load(std::sync::atomic::Ordering::Relaxed)
}

/// Relevance recall looks for the words just said only when the archive may hold them: a
/// fresh run that archived nothing searches nothing (picking the words reads the whole
/// context, which would cost more at every turn of a long run), and once an output is
/// archived, every boundary after it that says a new word searches.
#[tokio::test]
async fn recall_searches_only_once_something_is_archived() {
    // Each turn says a word the context does not show (and calls something new: no
    // stagnation).
    let turn = |n: u32| {
        format!(
            r#"{{"text":"looking for widget{n}q","tool_calls":[{{"name":"shell","arguments":{{"command":"ls part{n}"}}}}]}}"#
        )
    };
    let done = r#"{"text":"done"}"#.to_owned();
    let nothing_archived: Vec<String> = (0..10).map(turn).chain([done.clone()]).collect();
    assert_eq!(recall_searches(&nothing_archived).await, 0);
    let offloaded: Vec<String> = std::iter::once(big(400, "the port is 8443"))
        .chain((0..10).map(turn))
        .chain([done])
        .collect();
    let searches = recall_searches(&offloaded).await;
    assert!(searches >= 10, "{searches} searches");
}
