//! Fuzz targets (proptest, stable Rust) for what brain reads from outside: the SSE decoder
//! (bytes as a server sends them, split at any byte, invalid UTF-8, CR/LF in every
//! combination, a byte-order mark) and the cassette parser (lines of JSON with unknown
//! fields, wrong types, huge numbers, deep nesting, invalid UTF-8 read lossily).
//!
//! `cargo xtask fuzz --minutes N brain` runs these for a given time with fresh seeds;
//! `PROPTEST_CASES` sets the cases of one pass (256 in an ordinary `cargo test`). Failures
//! are kept in `proptest-regressions/` and replayed first by every later run.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nerve_brain::ScriptedProvider;
use nerve_brain::sse::{SseEvent, SseParser};
use proptest::prelude::*;

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

    /// The cassette parser takes any text: a provider or an error naming a line.
    #[test]
    fn the_cassette_parser_takes_any_text(lines in prop::collection::vec(cassette_line(), 0..12)) {
        let text = lines.join("\n");
        match ScriptedProvider::parse("fuzz.jsonl", &text) {
            Ok(_) => {}
            Err(error) => {
                let line = error.line.expect("a parse error names its line");
                prop_assert!(line >= 1 && line <= text.lines().count(), "{error}");
            }
        }
    }
}
