//! The prompt prefix stays put between ordinary turns: what agent call N sent is a byte
//! prefix of what call N+1 sends, so a provider's prompt cache keeps hitting; only a
//! compaction rewrites earlier messages, and then the context indicator in the system
//! prompt changes with it. Checked on the messages as Nerve serialises them and on the
//! Chat Completions wire body built from them.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use nerve_core::event::{CallPurpose, CompactionStrategy};
use nerve_core::{
    Event, EventSink, ExecutionId, MessageRole, SinkError, TaskId, TaskStatus, TerminationReason,
};
use tokio_util::sync::CancellationToken;

use crate::config::EngineConfig;
use crate::engine::{AgentEngine, Task};
use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError};
use crate::provider::openai::{OpenAiConfig, OpenAiProvider};
use crate::provider::port::Provider;
use crate::provider::scripted::ScriptedProvider;
use nerve_core::testing::EchoTools;

/// One agent request as it would leave Nerve.
#[derive(Debug, Clone)]
struct Sent {
    /// Each message as Nerve serialises it (JSON), in order.
    messages: Vec<String>,
    /// Each message of the Chat Completions body, in order.
    wire: Vec<String>,
    tools: String,
    system: String,
}

/// Agent requests and compactions, in the order they happened.
#[derive(Debug, Clone)]
enum Entry {
    Call(Sent),
    Compaction(CompactionStrategy),
}

type Timeline = Arc<Mutex<Vec<Entry>>>;

/// Answers from a cassette and records every agent request.
struct Recording {
    inner: ScriptedProvider,
    wire: OpenAiProvider,
    timeline: Timeline,
}

#[async_trait]
impl Provider for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn model(&self) -> &str {
        "scripted"
    }

    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
        if request.purpose == CallPurpose::Agent {
            let body = self.wire.request_body(&request, true);
            let sent = Sent {
                messages: request
                    .messages
                    .iter()
                    .map(|m| serde_json::to_string(m).unwrap())
                    .collect(),
                wire: body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                tools: body["tools"].to_string(),
                system: request.messages[0].text_content(),
            };
            assert_eq!(request.messages[0].role, MessageRole::System);
            self.timeline.lock().unwrap().push(Entry::Call(sent));
        }
        self.inner.complete(request).await
    }
}

struct TimelineSink(Timeline);

#[async_trait]
impl EventSink for TimelineSink {
    async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        if let Event::Compaction(compaction) = event {
            self.0
                .lock()
                .unwrap()
                .push(Entry::Compaction(compaction.strategy));
        }
        Ok(0)
    }

    /// Written at once, in the order the engine places batches: the timeline shows a
    /// compaction before the model call that follows it.
    fn enqueue(
        &self,
        _execution: ExecutionId,
        events: Vec<Event>,
        _checkpoint: Option<nerve_core::Snapshot>,
    ) -> nerve_core::Enqueued {
        for event in events {
            if let Event::Compaction(compaction) = event {
                self.0
                    .lock()
                    .unwrap()
                    .push(Entry::Compaction(compaction.strategy));
            }
        }
        nerve_core::Enqueued::Placed(Box::pin(std::future::ready(Ok(None))))
    }
}

/// A turn whose tool output is `lines` numbered lines (about ten tokens each).
fn turn(i: usize, lines: u64) -> String {
    serde_json::json!({
        "text": format!(
            "Step {i}: the module list compiles, but the integration check still reports a stale cache \
             entry for the billing crate, so I am reading the next part of the build log to find the \
             module that fails; the previous part only had warnings about unused variables."
        ),
        "tool_calls": [{"name": "shell", "arguments": {"lines": lines, "fact": format!("fact {i}: error: check {i} failed at src/m{i}.rs:{i}")}}],
        "usage": {"input_tokens": 10, "output_tokens": 10},
    })
    .to_string()
}

/// 40 turns of mid-sized outputs with one oversized output (offloaded) and a scripted
/// summary for the summary call, in a 6,000-token window: masks and a summary on the way.
/// Each output holds an error line, so that masked placeholders carry digests.
fn cassette() -> String {
    let size = |i: usize| {
        if i == 7 {
            2_000
        } else {
            15 + (i as u64 * 7) % 20
        }
    };
    let mut lines: Vec<String> = (0..40).map(|i| turn(i, size(i))).collect();
    lines.push(
        r###"{"call":"summary","text":"## Goal\n- find the failing module\n## Done\n- read the build log\n## Findings\n- nothing failing yet\n## Decisions\n## Open questions\n## Next steps\n- keep reading"}"###
            .to_owned(),
    );
    lines.push(r#"{"text":"done"}"#.to_owned());
    lines.join("\n")
}

#[tokio::test]
async fn the_prompt_prefix_is_stable_between_compactions() {
    let timeline: Timeline = Arc::default();
    let provider = Recording {
        inner: ScriptedProvider::parse("prefix", &cassette()).unwrap(),
        wire: OpenAiProvider::new(OpenAiConfig::new("gpt-4o")).unwrap(),
        timeline: Arc::clone(&timeline),
    };
    let engine = AgentEngine::new(
        Arc::new(provider),
        Arc::new(EchoTools::default()),
        Arc::new(TimelineSink(Arc::clone(&timeline))),
        EngineConfig {
            context_window: Some(6_000),
            max_turns: 100,
            ..EngineConfig::default()
        },
    );
    let task = Task {
        id: TaskId::new(),
        description: "Find the failing module in the build log.".into(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: "/w".into(),
    };
    let result = engine
        .run(ExecutionId::new(), task, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        result.termination_reason,
        TerminationReason::Completed,
        "{:?}",
        result.error
    );

    let timeline = timeline.lock().unwrap().clone();
    let mut previous: Option<&Sent> = None;
    let mut between: Vec<CompactionStrategy> = Vec::new();
    let (mut stable, mut after_offload, mut after_rewrite) = (0, 0, 0);
    let mut seen = Vec::new();
    for entry in &timeline {
        let sent = match entry {
            Entry::Compaction(strategy) => {
                between.push(*strategy);
                seen.push(*strategy);
                continue;
            }
            Entry::Call(sent) => sent,
        };
        if let Some(before) = previous {
            // An offload only replaces the output just produced, before anyone saw it.
            let rewritten = between.iter().any(|s| *s != CompactionStrategy::Offload);
            if rewritten {
                assert_ne!(
                    before.system, sent.system,
                    "a compaction ({between:?}) must update the context indicator"
                );
                after_rewrite += 1;
            } else {
                assert!(
                    sent.messages.len() > before.messages.len()
                        && sent.messages[..before.messages.len()] == before.messages[..],
                    "call {} rewrote earlier messages without a compaction",
                    stable + after_offload + after_rewrite + 1
                );
                assert!(
                    sent.messages
                        .join("\n")
                        .starts_with(&before.messages.join("\n"))
                );
                assert!(
                    sent.wire.len() > before.wire.len()
                        && sent.wire[..before.wire.len()] == before.wire[..],
                    "the wire body's messages are not a prefix"
                );
                assert!(sent.wire.join(",").starts_with(&before.wire.join(",")));
                assert_eq!(sent.tools, before.tools);
                assert_eq!(
                    sent.system, before.system,
                    "the indicator moved between turns"
                );
                if between.is_empty() {
                    stable += 1;
                } else {
                    after_offload += 1;
                }
            }
        }
        previous = Some(sent);
        between.clear();
    }
    // The run exercised every case.
    for strategy in [
        CompactionStrategy::Offload,
        CompactionStrategy::Mask,
        CompactionStrategy::Summarize,
    ] {
        assert!(seen.contains(&strategy), "no {strategy:?} in {seen:?}");
    }
    assert!(
        stable >= 20 && after_offload >= 1 && after_rewrite >= 2,
        "stable {stable}, after an offload {after_offload}, after a rewrite {after_rewrite}: {seen:?}"
    );
}
