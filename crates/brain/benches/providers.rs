//! Provider benchmarks: SSE parsing and stream decoding throughput, and token counting of
//! a growing conversation with the cached counter against tiktoken-rs called directly.
//!
//! `cargo bench -p nerve-brain --bench providers`

#![allow(clippy::unwrap_used, clippy::expect_used)] // Benchmark set-up, not library code.

#[path = "corpus/mod.rs"]
mod corpus;

use std::collections::VecDeque;
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use divan::Bencher;
use divan::counter::BytesCount;
use nerve_brain::TokenCounter;
use nerve_brain::provider::anthropic::MessagesStreamDecoder;
use nerve_brain::provider::openai::ChatStreamDecoder;
use nerve_brain::provider::sse::SseParser;
use nerve_brain::provider::stream::{MemorySource, ModelStream, StreamDecoder};
use nerve_brain::provider::tokens::{CachedCounter, Encoding, Estimate, Tiktoken, UsageEstimate};
use nerve_core::{Message, MessagePart, MessageRole, ToolCall, ToolCallId, ToolResult};

fn main() {
    divan::main();
}

/// A TCP segment's worth: how a real body arrives.
const READ: usize = 1_460;

/// About 1 MiB of Chat Completions stream: text deltas (with multi-byte characters) and
/// tool-call argument deltas, as OpenAI sends them.
static OPENAI_SSE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut out = String::new();
    let mut i = 0;
    while out.len() < 1 << 20 {
        let chunk = if i % 3 == 0 {
            serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": i % 2, "function": {"arguments": "{\"path\": \"src/ma"}}]}, "finish_reason": null}]})
        } else {
            serde_json::json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
                "choices": [{"index": 0, "delta": {"content": " the quick brown fox — naïve café ✓"}, "finish_reason": null}]})
        };
        out.push_str(&format!("data: {chunk}\n\n"));
        i += 1;
    }
    out.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n");
    out.into_bytes()
});

/// About 1 MiB of Messages stream.
static ANTHROPIC_SSE: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut out = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
         event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    while out.len() < 1 << 20 {
        out.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" the quick brown fox — naïve café ✓\"}}\n\n");
    }
    out.push_str(
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":9}}\n\n\
         event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    out.into_bytes()
});

#[divan::bench]
fn sse_parse(bencher: Bencher<'_, '_>) {
    let input = &*OPENAI_SSE;
    bencher.counter(BytesCount::new(input.len())).bench(|| {
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut count = 0;
        for chunk in input.chunks(READ) {
            parser.feed(chunk, &mut events).unwrap();
            count += events.len();
            events.clear();
        }
        parser.finish(&mut events);
        count + events.len()
    });
}

fn decode(input: &[u8], decoder: impl StreamDecoder + 'static) -> usize {
    let chunks: VecDeque<Bytes> = input.chunks(READ).map(Bytes::copy_from_slice).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let response = runtime
        .block_on(ModelStream::new(MemorySource(chunks), decoder).collect())
        .unwrap();
    response.message.parts.len()
}

fn estimate() -> UsageEstimate {
    UsageEstimate {
        input: 0,
        counter: Arc::new(Estimate),
        calibration: None,
    }
}

/// SSE parsing, JSON decoding of every chunk, delta assembly: the whole client side.
#[divan::bench]
fn openai_stream_decode(bencher: Bencher<'_, '_>) {
    let input = &*OPENAI_SSE;
    bencher
        .counter(BytesCount::new(input.len()))
        .bench(|| decode(input, ChatStreamDecoder::new(estimate())));
}

#[divan::bench]
fn anthropic_stream_decode(bencher: Bencher<'_, '_>) {
    let input = &*ANTHROPIC_SSE;
    bencher
        .counter(BytesCount::new(input.len()))
        .bench(|| decode(input, MessagesStreamDecoder::new(estimate())));
}

/// A 60-turn conversation built from the corpus: each turn an assistant message (a little
/// text and a tool call) and a tool result (code, JSON or logs).
static CONVERSATION: LazyLock<Vec<Message>> = LazyLock::new(|| {
    let outputs: Vec<String> = [corpus::code(), corpus::json(), corpus::logs()]
        .into_iter()
        .flat_map(|s| s.into_iter().take(40))
        .collect();
    let prose = corpus::prose();
    let mut messages = vec![
        Message::system(prose[0].clone()),
        Message::user(prose[1].clone()),
    ];
    for turn in 0..60 {
        let id = ToolCallId(format!("call_{turn}"));
        let text: String = prose[(turn + 2) % prose.len()].chars().take(300).collect();
        messages.push(Message {
            role: MessageRole::Assistant,
            parts: vec![
                MessagePart::Text { text },
                MessagePart::ToolCall(ToolCall {
                    id: id.clone(),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("src/module_{turn}.rs"), "limit": 200}),
                }),
            ],
            pinned: false,
        });
        messages.push(Message::tool_result(ToolResult {
            call_id: id,
            name: "read_file".into(),
            content: outputs[(turn * 7) % outputs.len()].clone(),
            is_error: false,
        }));
    }
    messages
});

/// What counting every message of every turn's prompt reads, in bytes.
fn turn_loop_bytes() -> usize {
    let sizes: Vec<usize> = CONVERSATION
        .iter()
        .map(|m| {
            m.parts
                .iter()
                .map(|p| match p {
                    MessagePart::Text { text } => text.len(),
                    MessagePart::ToolResult(r) => r.content.len(),
                    MessagePart::ToolCall(c) => c.arguments.to_string().len(),
                    MessagePart::Thinking { .. } | MessagePart::CompactionSummary { .. } => 0,
                })
                .sum()
        })
        .collect();
    (2..=CONVERSATION.len())
        .step_by(2)
        .map(|end| sizes[..end].iter().sum::<usize>())
        .sum()
}

/// Every turn recounts the whole prompt, as a context budget must: tiktoken-rs directly.
#[divan::bench(sample_count = 20)]
fn turn_loop_tiktoken_direct(bencher: Bencher<'_, '_>) {
    let bpe = Encoding::O200kBase.bpe();
    bencher
        .counter(BytesCount::new(turn_loop_bytes()))
        .bench(|| {
            let mut total = 0;
            for end in (2..=CONVERSATION.len()).step_by(2) {
                for message in &CONVERSATION[..end] {
                    for part in &message.parts {
                        total += match part {
                            MessagePart::Text { text } => bpe.encode_ordinary(text).len(),
                            MessagePart::ToolResult(r) => bpe.encode_ordinary(&r.content).len(),
                            MessagePart::ToolCall(c) => {
                                bpe.encode_ordinary(&c.name).len()
                                    + bpe.encode_ordinary(&c.arguments.to_string()).len()
                            }
                            MessagePart::Thinking { .. }
                            | MessagePart::CompactionSummary { .. } => 0,
                        };
                    }
                }
            }
            total
        });
}

/// The same loop with the cached counter, fresh (cold) for each run as for one execution.
#[divan::bench(sample_count = 20)]
fn turn_loop_cached_counter(bencher: Bencher<'_, '_>) {
    bencher
        .counter(BytesCount::new(turn_loop_bytes()))
        .bench(|| {
            let counter = CachedCounter::new(Tiktoken::new(Encoding::O200kBase));
            (2..=CONVERSATION.len())
                .step_by(2)
                .map(|end| counter.count_messages(&CONVERSATION[..end]))
                .sum::<u64>()
        });
}

/// One turn's recount of the whole conversation when every message is already cached:
/// what the cache costs per turn once a conversation is long.
#[divan::bench]
fn warm_cache_recount(bencher: Bencher<'_, '_>) {
    let counter = CachedCounter::new(Tiktoken::new(Encoding::O200kBase));
    counter.count_messages(&CONVERSATION);
    bencher
        .counter(BytesCount::new(conversation_bytes()))
        .bench(|| counter.count_messages(&CONVERSATION));
}

/// The estimate on the same loop, uncached (it reads each byte once per turn).
#[divan::bench(sample_count = 20)]
fn turn_loop_estimate(bencher: Bencher<'_, '_>) {
    bencher
        .counter(BytesCount::new(turn_loop_bytes()))
        .bench(|| {
            (2..=CONVERSATION.len())
                .step_by(2)
                .map(|end| Estimate.count_messages(&CONVERSATION[..end]))
                .sum::<u64>()
        });
}

fn conversation_bytes() -> usize {
    CONVERSATION
        .iter()
        .map(|m| {
            m.parts
                .iter()
                .map(|p| match p {
                    MessagePart::Text { text } => text.len(),
                    MessagePart::ToolResult(r) => r.content.len(),
                    MessagePart::ToolCall(c) => c.arguments.to_string().len(),
                    MessagePart::Thinking { .. } | MessagePart::CompactionSummary { .. } => 0,
                })
                .sum::<usize>()
        })
        .sum()
}

/// Each message once, no repetition: the cache's bookkeeping is pure overhead here.
#[divan::bench(sample_count = 20)]
fn single_pass_tiktoken_direct(bencher: Bencher<'_, '_>) {
    let bpe = Encoding::O200kBase.bpe();
    bencher
        .counter(BytesCount::new(conversation_bytes()))
        .bench(|| {
            CONVERSATION
                .iter()
                .flat_map(|m| &m.parts)
                .map(|part| match part {
                    MessagePart::Text { text } => bpe.encode_ordinary(text).len(),
                    MessagePart::ToolResult(r) => bpe.encode_ordinary(&r.content).len(),
                    MessagePart::ToolCall(c) => {
                        bpe.encode_ordinary(&c.name).len()
                            + bpe.encode_ordinary(&c.arguments.to_string()).len()
                    }
                    MessagePart::Thinking { .. } | MessagePart::CompactionSummary { .. } => 0,
                })
                .sum::<usize>()
        });
}

#[divan::bench(sample_count = 20)]
fn single_pass_cached_counter(bencher: Bencher<'_, '_>) {
    bencher
        .counter(BytesCount::new(conversation_bytes()))
        .bench(|| {
            CachedCounter::new(Tiktoken::new(Encoding::O200kBase)).count_messages(&CONVERSATION)
        });
}

#[divan::bench(sample_count = 20)]
fn single_pass_estimate(bencher: Bencher<'_, '_>) {
    bencher
        .counter(BytesCount::new(conversation_bytes()))
        .bench(|| Estimate.count_messages(&CONVERSATION));
}
