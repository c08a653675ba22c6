//! Unit tests of carrying out compaction and of the context tools.

use std::sync::Arc;

use nerve_core::event::CompactionTrigger;
use nerve_core::{EventSink, ExecutionId, TaskId, TaskStatus};
use tokio_util::sync::CancellationToken;

use super::context_tools::recall;
use super::*;
use crate::config::EngineConfig;
use crate::engine::{AgentEngine, Task};
use crate::provider::scripted::ScriptedProvider;
use crate::run::builtin_tools::RecallArgs;
use nerve_core::testing::{EchoTools, MemorySink};

/// A compactor over a window of `capacity` tokens holding only the system prompt, whose
/// summary calls `provider` answers, run to its end by `body` on a thread of its own:
/// `None` when `body` has not returned by the deadline (the thread keeps spinning, but
/// the test fails instead of hanging).
fn with_compactor<T: Send + 'static>(
    capacity: u64,
    provider: Arc<dyn crate::Provider>,
    body: impl for<'c> FnOnce(
        &'c mut Compactor<'_>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'c>>
    + Send
    + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let execution = ExecutionId::new();
        let config = EngineConfig {
            context_window: Some(capacity),
            ..EngineConfig::default()
        };
        let counter = crate::provider::tokens::counter_for_model(provider.model());
        let mut window = Window::new(vec![Message::system("system")], counter, 0, Some(capacity));
        let sink: Arc<dyn EventSink> = Arc::new(MemorySink::default());
        let mut journal = Journal::new(execution, sink);
        let mut caller = ModelCaller::new(
            execution,
            provider,
            None,
            &config,
            CancellationToken::new(),
            Default::default(),
            Arc::new(crate::provider::stream::IgnoreDeltas),
        );
        let archive = crate::context::memory_archive::MemoryArchive::default();
        let mut compactor = Compactor {
            execution,
            config: &config,
            window: &mut window,
            journal: &mut journal,
            caller: &mut caller,
            archive: &archive,
        };
        let out = runtime.block_on(body(&mut compactor));
        let _ = tx.send(out);
    });
    // Generous: the call takes milliseconds; only a spinning loop reaches this.
    rx.recv_timeout(std::time::Duration::from_secs(60)).ok()
}

/// An earlier summary larger than the summary call's room: the call returns (its head
/// cut, or a failure the compaction falls back from) instead of cutting the history
/// for ever.
#[test]
fn a_summary_call_whose_earlier_summary_exceeds_the_room_returns() {
    let provider: Arc<dyn crate::Provider> = Arc::new(
        ScriptedProvider::parse("summary", r#"{"call":"summary","text":"GOAL: x"}"#).unwrap(),
    );
    let earlier = "the earlier summary names src/lib.rs:12 and 42 failing tests. ".repeat(200);
    let history = "user: go on\nassistant: reading src/main.rs\n".repeat(50);
    let outcome = with_compactor(1_000, provider, move |compactor| {
        Box::pin(async move {
            compactor
                .summary_call(1, Some(&earlier), &history)
                .await
                .ok()
        })
    });
    let Some(outcome) = outcome else {
        panic!("summary_call did not return within the deadline");
    };
    assert_eq!(outcome.as_deref(), Some("GOAL: x"));
}

#[test]
fn an_overflow_aims_under_the_budget_by_the_servers_count() {
    // No count stated: three quarters of the budget, or of the refused prompt.
    assert_eq!(overflow_target(4_000, 3_000, None), 2_250);
    assert_eq!(overflow_target(4_000, 6_000, None), 3_000);
    // The server counted twice as much: half of three quarters of the budget.
    assert_eq!(overflow_target(4_000, 3_000, Some(6_000)), 1_500);
    // A count under the engine's changes nothing.
    assert_eq!(overflow_target(4_000, 3_000, Some(2_000)), 2_250);
    // No window: three quarters of what was refused.
    assert_eq!(overflow_target(u64::MAX, 3_000, Some(9_000)), 2_250);
}

proptest::proptest! {
    /// Whatever the counts, the retry is smaller than the refused prompt by the engine's
    /// count, and fits three quarters of the budget by the server's when it stated one.
    #[test]
    fn an_overflow_target_shrinks_and_fits_by_the_servers_count(
        budget in 1_u64..2_000_000,
        before in 1_u64..4_000_000,
        stated in proptest::option::of(1_u64..16_000_000),
    ) {
        let target = overflow_target(budget, before, stated);
        proptest::prop_assert!(target < before || before < 2);
        if let Some(stated) = stated.filter(|&s| s > before) {
            let by_server = u128::from(target) * u128::from(stated) / u128::from(before);
            proptest::prop_assert!(by_server <= u128::from(budget) * 3 / 4);
        }
    }
}

/// A block of 100,000 characters comes back whole, page by page, each page saying how
/// much remains and where to go on.
#[tokio::test]
async fn recall_pages_through_a_block_of_100k_characters() {
    let archive = crate::context::memory_archive::MemoryArchive::default();
    let execution = ExecutionId::new();
    let content: String = (0..4_000)
        .map(|i| format!("row {i:05}: état {} ok\n", "x".repeat(i % 40)))
        .collect::<String>()
        .chars()
        .take(100_000)
        .collect();
    assert_eq!(content.chars().count(), 100_000);
    let id = BlockId::new();
    archive
        .archive(
            execution,
            ArchivedBlock {
                id,
                messages: vec![Message::tool_result(ToolResult {
                    call_id: nerve_core::ToolCallId("c1".into()),
                    name: "shell".into(),
                    content: content.clone(),
                    is_error: false,
                })],
                note: "output of shell at turn 1".into(),
            },
        )
        .await
        .unwrap();
    let page_chars = 6_000;
    let mut offset = None;
    let mut whole = String::new();
    let mut pages = 0;
    loop {
        let args = RecallArgs {
            query: None,
            block_id: Some(id.to_string()),
            offset,
        };
        let (text, is_error) = recall(args, &archive, execution, page_chars).await.unwrap();
        assert!(!is_error, "{text}");
        assert!(text.len() <= page_chars, "{}", text.len());
        pages += 1;
        let (header, rest) = text.split_once('\n').unwrap();
        assert!(header.starts_with(&format!("Block {id} (output of shell at turn 1)")));
        let (body, footer) = rest.rsplit_once('\n').unwrap();
        whole.push_str(body);
        if footer == "[end of block]" {
            break;
        }
        let next: u64 = footer
            .rsplit_once("offset ")
            .unwrap()
            .1
            .trim_end_matches(']')
            .parse()
            .unwrap();
        let remaining: usize = footer[1..].split(' ').next().unwrap().parse().unwrap();
        assert_eq!(remaining, 100_000 - usize::try_from(next).unwrap());
        offset = Some(next);
    }
    assert_eq!(whole, content);
    assert!(pages >= 17, "{pages} pages");
    // Past the end: a clear error.
    let args = RecallArgs {
        query: None,
        block_id: Some(id.to_string()),
        offset: Some(100_000),
    };
    let (text, is_error) = recall(args, &archive, execution, page_chars).await.unwrap();
    assert!(is_error && text.contains("past the end"), "{text}");
}

#[test]
fn the_extractive_summary_scales_with_the_window() {
    for (capacity, expected) in [
        (None, 12_000),
        (Some(1_000), 1_000),
        (Some(8_000), 3_600),
        (Some(16_000), 7_200),
        (Some(200_000), 12_000),
    ] {
        assert_eq!(summary_max_chars(capacity), expected, "{capacity:?}");
    }
}

/// Between the soft and the hard threshold, results that leave the recent window are
/// masked in batches that free at least a tenth of the window, not one per turn.
#[tokio::test]
async fn soft_masking_waits_until_it_frees_a_tenth_of_the_window() {
    let window = 20_000;
    // Long notes: once they fill the window's first 60%, masking alone cannot get
    // below the soft threshold, and each turn has one more result to mask.
    let note = "the module compiles, but the integration check still reports a stale cache entry; "
        .repeat(12);
    let cassette: Vec<String> = (0..70)
        .map(|i| {
            serde_json::json!({
                "text": format!("Part {i}: {note}"),
                "tool_calls": [{"name": "shell", "arguments": {"lines": 30, "fact": format!("fact {i}")}}],
                "usage": {"input_tokens": 1, "output_tokens": 1},
            })
            .to_string()
        })
        .chain([r#"{"text":"done"}"#.to_owned()])
        .collect();
    let sink = Arc::new(MemorySink::default());
    let engine = AgentEngine::new(
        Arc::new(ScriptedProvider::parse("mask", &cassette.join("\n")).unwrap()),
        Arc::new(EchoTools::default()),
        Arc::clone(&sink) as Arc<dyn EventSink>,
        EngineConfig {
            context_window: Some(window),
            max_turns: 100,
            ..EngineConfig::default()
        },
    );
    let task = Task {
        id: TaskId::new(),
        description: "read the log".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    let masks: Vec<_> = sink
        .events()
        .into_iter()
        .filter_map(|e| {
            if let Event::Compaction(c) = e
                && c.trigger == CompactionTrigger::SoftThreshold
            {
                Some(c)
            } else {
                None
            }
        })
        .collect();
    assert!(masks.len() >= 2, "{} masks", masks.len());
    for mask in &masks {
        assert!(
            mask.tokens_before - mask.tokens_after >= window / 10,
            "{} -> {}",
            mask.tokens_before,
            mask.tokens_after
        );
    }
}
