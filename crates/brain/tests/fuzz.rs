//! Fuzz targets (proptest, stable Rust) for what brain reads from outside: the SSE decoder
//! (bytes as a server sends them, split at any byte, invalid UTF-8, CR/LF in every
//! combination, a byte-order mark) and the cassette parser (lines of JSON with unknown
//! fields, wrong types, huge numbers, deep nesting, invalid UTF-8 read lossily), and both
//! stream decoders behind [`ModelStream`] (an answer of text with multi-byte characters and
//! a streamed tool call, cut into reads at any byte and cut off at any byte).
//!
//! `cargo xtask fuzz --minutes N brain` runs these for a given time with fresh seeds;
//! `PROPTEST_CASES` sets the cases of one pass (256 in an ordinary `cargo test`). Failures
//! are kept in `proptest-regressions/` and replayed first by every later run.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use nerve_brain::ScriptedProvider;
use nerve_brain::provider::anthropic::MessagesStreamDecoder;
use nerve_brain::provider::model_call::{ModelResponse, ProviderError};
use nerve_brain::provider::openai::ChatStreamDecoder;
use nerve_brain::provider::sse::{SseEvent, SseParser};
use nerve_brain::provider::stream::{Delta, MemorySource, ModelStream, StreamChunk, StreamDecoder};
use nerve_brain::provider::tokens::{Estimate, UsageEstimate};
use nerve_core::MessagePart;
use nerve_core::event::ModelErrorKind;
use proptest::prelude::*;
use serde_json::json;

/// Bytes that look like an event stream, often enough to reach every branch.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(b"data: ".to_vec()),
        Just(b"data:".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"id: 7".to_vec()),
        Just(b"retry: 99999999999999999999".to_vec()),
        Just(b": keep-alive".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\xEF\xBB\xBF".to_vec()),
        Just("h\u{e9}llo \u{2713}".as_bytes().to_vec()),
        Just(b"{\"choices\":[{\"delta\":{\"content\":\"x\"}}]}".to_vec()),
        Just(b"[DONE]".to_vec()),
        prop::collection::vec(any::<u8>(), 0..16),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

fn parse_in(input: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
    let mut parser = SseParser::new();
    let mut out = Vec::new();
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
    cuts.sort_unstable();
    let mut from = 0;
    for cut in cuts.into_iter().chain([input.len()]) {
        parser.feed(&input[from..cut], &mut out).unwrap();
        from = cut;
    }
    parser.finish(&mut out);
    out
}

/// A cassette line: a valid one with its fields shuffled in, or something near it.
fn cassette_line() -> impl Strategy<Value = String> {
    let number = prop_oneof![
        Just("0".to_owned()),
        Just("18446744073709551615".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-1".to_owned()),
        Just("1e400".to_owned()),
        Just("0.5".to_owned()),
        "[0-9]{1,30}",
    ];
    let value = prop_oneof![
        number.clone(),
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("\"x\"".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        (1usize..2000).prop_map(|depth| format!("{}1{}", "[".repeat(depth), "]".repeat(depth))),
        any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
    ];
    let field = prop_oneof![
        Just("text"),
        Just("tool_calls"),
        Just("usage"),
        Just("finish"),
        Just("delay_ms"),
        Just("call"),
        Just("error"),
        Just("retry_after_ms"),
        Just("bogus"),
    ];
    let good = prop_oneof![
        Just(r#"{"text": "hi"}"#.to_owned()),
        Just(r#"{"tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}], "usage": {"input_tokens": 1, "output_tokens": 2}}"#.to_owned()),
        Just(r#"{"error": "rate_limited", "retry_after_ms": 20}"#.to_owned()),
        Just(r#"{"call": "plan", "finish": "max_tokens"}"#.to_owned()),
        Just("# a comment".to_owned()),
        Just(String::new()),
    ];
    prop_oneof![
        2 => good,
        3 => prop::collection::vec((field, value), 0..6).prop_map(|fields| {
            let body: Vec<String> = fields
                .iter()
                .map(|(name, value)| format!("\"{name}\": {value}"))
                .collect();
            format!("{{{}}}", body.join(", "))
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64)
            .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned()),
    ]
}

/// An answer to stream: text pieces (multi-byte characters, quotes, newlines) and maybe a
/// tool call whose JSON arguments come in pieces.
#[derive(Debug, Clone)]
struct Answer {
    text: Vec<String>,
    tool: Option<Vec<String>>,
}

impl Answer {
    fn text(&self) -> String {
        self.text.concat()
    }

    fn arguments(&self) -> Option<serde_json::Value> {
        self.tool
            .as_ref()
            .map(|pieces| serde_json::from_str(&pieces.concat()).unwrap())
    }

    /// The Chat Completions stream, and where its finishing event starts.
    fn openai(&self) -> (Vec<u8>, usize) {
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            let chunk = json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            format!("data: {chunk}\n\n")
        };
        let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
        for piece in &self.text {
            out.push_str(&chunk(json!({"content": piece}), None));
        }
        if let Some(pieces) = &self.tool {
            out.push_str(&chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "write_file", "arguments": ""}}]}),
                None,
            ));
            for piece in pieces {
                out.push_str(&chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        let finish = out.len();
        let reason = if self.tool.is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        out.push_str(&chunk(json!({}), Some(reason)));
        out.push_str("data: [DONE]\n\n");
        (out.into_bytes(), finish)
    }

    /// The Messages stream, and where its finishing event starts.
    fn anthropic(&self) -> (Vec<u8>, usize) {
        let event = |value: serde_json::Value| {
            format!(
                "event: {}\ndata: {value}\n\n",
                value["type"].as_str().unwrap()
            )
        };
        let mut out = event(
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 1}}}),
        );
        out.push_str(&event(json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})));
        for piece in &self.text {
            out.push_str(&event(json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}})));
        }
        out.push_str(&event(json!({"type": "content_block_stop", "index": 0})));
        if let Some(pieces) = &self.tool {
            out.push_str(&event(json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}})));
            for piece in pieces {
                out.push_str(&event(json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": piece}})));
            }
            out.push_str(&event(json!({"type": "content_block_stop", "index": 1})));
        }
        let finish = out.len();
        let reason = if self.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        };
        out.push_str(&event(json!({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": {"output_tokens": 7}})));
        out.push_str(&event(json!({"type": "message_stop"})));
        (out.into_bytes(), finish)
    }
}

fn answer() -> impl Strategy<Value = Answer> {
    let piece = "[a-z \u{e9}\u{2713}\u{1f600}\"\\\\\n]{0,6}";
    let arguments =
        (piece, prop::collection::vec(any::<usize>(), 0..4)).prop_map(|(content, cuts)| {
            let text = json!({"path": "n.txt", "content": content}).to_string();
            split_chars(&text, &cuts)
        });
    (
        prop::collection::vec(piece, 0..6),
        prop::option::of(arguments),
    )
        .prop_map(|(text, tool)| Answer { text, tool })
}

/// `text` split at the character boundaries nearest to `cuts`.
fn split_chars(text: &str, cuts: &[usize]) -> Vec<String> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|c| {
            let mut i = c % (text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            i
        })
        .collect();
    at.sort_unstable();
    at.dedup();
    let mut pieces = Vec::new();
    let mut from = 0;
    for cut in at.into_iter().chain([text.len()]) {
        pieces.push(text[from..cut].to_owned());
        from = cut;
    }
    pieces
}

/// `bytes` as reads ending at `cuts` (any byte, inside characters too).
fn reads(bytes: &[u8], cuts: &[usize]) -> VecDeque<Bytes> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut out = VecDeque::new();
    let mut from = 0;
    for cut in at.into_iter().chain([bytes.len()]) {
        out.push_back(Bytes::copy_from_slice(&bytes[from..cut]));
        from = cut;
    }
    out
}

/// Drains a stream, checking that exactly one terminal chunk ends it.
fn drain(
    reads: VecDeque<Bytes>,
    decoder: impl StreamDecoder + 'static,
) -> (Vec<Delta>, Result<ModelResponse, ProviderError>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut stream = ModelStream::new(MemorySource(reads), decoder);
        let mut deltas = Vec::new();
        let mut end = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                StreamChunk::Delta(delta) => {
                    assert!(end.is_none(), "a delta after the terminal chunk");
                    deltas.push(delta);
                }
                StreamChunk::End(result) => {
                    assert!(end.is_none(), "two terminal chunks");
                    end = Some(result);
                }
            }
        }
        assert!(
            stream.next().await.is_none(),
            "a finished stream stays finished"
        );
        (deltas, end.expect("exactly one terminal chunk"))
    })
}

fn estimate() -> UsageEstimate {
    UsageEstimate {
        input: 10,
        counter: Arc::new(Estimate),
        calibration: None,
    }
}

fn delta_text(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(text) => Some(text.as_str()),
            Delta::Thinking(_) | Delta::ToolCallStart { .. } | Delta::ToolCallArguments { .. } => {
                None
            }
        })
        .collect()
}

fn delta_arguments(deltas: &[Delta]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            Delta::ToolCallArguments { fragment, .. } => Some(fragment.as_str()),
            Delta::Text(_) | Delta::Thinking(_) | Delta::ToolCallStart { .. } => None,
        })
        .collect()
}

/// A whole stream, read in any pieces, gives the answer and deltas that add up to it.
fn check_whole(answer: &Answer, deltas: &[Delta], end: Result<ModelResponse, ProviderError>) {
    let response = end.unwrap();
    assert_eq!(delta_text(deltas), answer.text());
    assert_eq!(response.message.text_content(), answer.text());
    let calls: Vec<_> = response
        .message
        .parts
        .iter()
        .filter_map(|p| match p {
            MessagePart::ToolCall(call) => Some((call.name.clone(), call.arguments.clone())),
            MessagePart::Text { .. }
            | MessagePart::Thinking { .. }
            | MessagePart::ToolResult(_)
            | MessagePart::CompactionSummary { .. } => None,
        })
        .collect();
    match answer.arguments() {
        Some(arguments) => {
            assert_eq!(calls, [("write_file".to_owned(), arguments)]);
            assert_eq!(
                delta_arguments(deltas),
                answer.tool.as_ref().unwrap().concat()
            );
        }
        None => assert!(calls.is_empty()),
    }
}

/// A stream cut off at `cut`: before its finishing event it is a transient
/// `truncated_stream` error; its deltas are always a prefix of the answer.
fn check_cut(
    answer: &Answer,
    cut: usize,
    finish: usize,
    deltas: &[Delta],
    end: &Result<ModelResponse, ProviderError>,
) {
    assert!(answer.text().starts_with(&delta_text(deltas)), "{deltas:?}");
    if cut <= finish {
        let error = end.as_ref().unwrap_err();
        assert_eq!(error.kind(), ModelErrorKind::TruncatedStream, "{error}");
        assert!(error.is_transient());
    }
}

/// Where proptest keeps failing cases (replayed first by every run): its default looks for
/// a `lib.rs` beside the test and finds none for an integration test.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/fuzz.txt"),
        )),
        ..ProptestConfig::default()
    }
}

/// Found by the fuzz target: an empty read right after a `\r` made the `\n` that followed
/// a blank line of its own, dispatching an empty event.
#[test]
fn an_empty_read_between_cr_and_lf_ends_no_event() {
    let input = b"data:\r\nevent: e\ndata: x\r\n\r\n";
    let whole = parse_in(input, &[]);
    assert_eq!(
        whole,
        [SseEvent {
            event: "e".into(),
            data: "\nx".into()
        }]
    );
    assert_eq!(parse_in(input, &[6, 6]), whole);
}

proptest! {
    #![proptest_config(config())]

    /// However the bytes are cut, the events are the same; nothing panics.
    #[test]
    fn sse_events_do_not_depend_on_where_reads_end(
        input in sse_bytes(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let whole = parse_in(&input, &[]);
        prop_assert_eq!(&parse_in(&input, &cuts), &whole);
        let bytewise: Vec<usize> = (0..input.len()).collect();
        prop_assert_eq!(&parse_in(&input, &bytewise), &whole);
    }

    /// A Chat Completions stream read in any pieces (a character split across reads
    /// included) gives the same answer; cut off anywhere before its finish it is a
    /// transient error; either way exactly one terminal chunk.
    #[test]
    fn the_chat_completions_decoder_takes_any_reads_and_any_cut(
        answer in answer(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
        cut in any::<usize>(),
    ) {
        let (bytes, finish) = answer.openai();
        let (deltas, end) = drain(reads(&bytes, &cuts), ChatStreamDecoder::new(estimate()));
        check_whole(&answer, &deltas, end);
        let cut = cut % (bytes.len() + 1);
        let (deltas, end) = drain(reads(&bytes[..cut], &cuts), ChatStreamDecoder::new(estimate()));
        check_cut(&answer, cut, finish, &deltas, &end);
    }

    /// The same for a Messages stream.
    #[test]
    fn the_messages_decoder_takes_any_reads_and_any_cut(
        answer in answer(),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
        cut in any::<usize>(),
    ) {
        let (bytes, finish) = answer.anthropic();
        let (deltas, end) = drain(reads(&bytes, &cuts), MessagesStreamDecoder::new(estimate()));
        check_whole(&answer, &deltas, end);
        let cut = cut % (bytes.len() + 1);
        let (deltas, end) = drain(reads(&bytes[..cut], &cuts), MessagesStreamDecoder::new(estimate()));
        check_cut(&answer, cut, finish, &deltas, &end);
    }

    /// The cassette parser takes any text: a provider or an error naming a line (or, for a
    /// cassette without a line to answer with, saying so).
    #[test]
    fn the_cassette_parser_takes_any_text(lines in prop::collection::vec(cassette_line(), 0..12)) {
        let text = lines.join("\n");
        match ScriptedProvider::parse("fuzz.jsonl", &text) {
            Ok(_) => {}
            Err(error) => match error.line {
                Some(line) => prop_assert!(line >= 1 && line <= text.lines().count(), "{error}"),
                None => prop_assert!(error.message.starts_with("the cassette has no lines"), "{error}"),
            },
        }
    }
}
