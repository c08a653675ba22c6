//! Fuzz targets (proptest, stable Rust) for the event decoder and replay: logs built from
//! every event kind's wire form (core's snapshot of them), then cut, reordered, duplicated
//! and corrupted (truncated payloads, flipped bytes, invalid UTF-8 read lossily, huge
//! numbers, deep nesting, wrong kinds, versions and sequence numbers). Replay is a pure
//! function that must never panic and must keep its score in range.
//!
//! `cargo xtask fuzz --minutes N session` runs these for a given time with fresh seeds;
//! `PROPTEST_CASES` sets the cases of one pass (256 in an ordinary `cargo test`). Failures
//! are kept in `proptest-regressions/` and replayed first by every later run.

// A fuzz target's failure is a panic with its reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use nerve_session::{COMPLETE_AT, StoredEvent, replay};
use proptest::prelude::*;
use serde_json::Value;

/// Every event kind's payload as core's wire snapshot holds it.
fn seeds() -> &'static [Value] {
    static SEEDS: OnceLock<Vec<Value>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../core/src/snapshots/nerve_core__wire_tests__events.snap"
        );
        let text = std::fs::read_to_string(path).unwrap();
        // An insta snapshot: a `---` header, then the JSON.
        let json = text.splitn(3, "---").nth(2).unwrap();
        let Value::Array(events) = serde_json::from_str(json).unwrap() else {
            panic!("the events snapshot is not an array");
        };
        assert!(events.len() >= 17, "every kind has a seed");
        events
    })
}

/// What is done to one event's payload.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    /// Cut the payload text after this many bytes (at any byte: the rest read lossily).
    Truncate(usize),
    /// Replace one byte of the payload (read lossily: invalid UTF-8 becomes U+FFFD).
    Flip(usize, u8),
    /// Replace every number with this one.
    Numbers(String),
    /// Wrap a field's value in this many arrays.
    Nest(usize),
    /// Another kind in the `kind` column than in the payload.
    Kind(String),
    /// Arbitrary text as the payload.
    Junk(String),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => Just(Mutation::None),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Flip(at, byte)),
        1 => prop_oneof![
            Just("18446744073709551616".to_owned()),
            Just("-1".to_owned()),
            Just("1e308".to_owned()),
            Just("4294967296".to_owned()),
            Just("0.5".to_owned()),
            "[0-9]{1,40}",
        ]
        .prop_map(Mutation::Numbers),
        1 => (1usize..3000).prop_map(Mutation::Nest),
        1 => "[a-z_]{0,20}".prop_map(Mutation::Kind),
        1 => any::<String>().prop_map(Mutation::Junk),
    ]
}

fn replace_numbers(value: &mut Value, with: &Value) {
    match value {
        Value::Number(_) => *value = with.clone(),
        Value::Array(items) => items.iter_mut().for_each(|v| replace_numbers(v, with)),
        Value::Object(fields) => fields.values_mut().for_each(|v| replace_numbers(v, with)),
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

/// One stored event from seed `index`, with `mutation` applied.
fn stored(index: usize, seq: u64, version: u32, mutation: &Mutation) -> StoredEvent {
    let seed = &seeds()[index % seeds().len()];
    let mut kind = seed["kind"].as_str().unwrap().to_owned();
    let text = seed.to_string();
    let payload = match mutation {
        Mutation::None => text,
        Mutation::Truncate(at) => {
            let bytes = text.as_bytes();
            String::from_utf8_lossy(&bytes[..at % (bytes.len() + 1)]).into_owned()
        }
        Mutation::Flip(at, byte) => {
            let mut bytes = text.into_bytes();
            let at = at % bytes.len();
            bytes[at] = *byte;
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Mutation::Numbers(number) => {
            let mut value = seed.clone();
            // Not every such text is a JSON number serde_json keeps; then leave the seed.
            if let Ok(number) = serde_json::from_str::<Value>(number) {
                replace_numbers(&mut value, &number);
            }
            value.to_string()
        }
        Mutation::Nest(depth) => {
            let mut value = seed.clone();
            if let Some((_, field)) = value
                .as_object_mut()
                .and_then(|fields| fields.iter_mut().find(|(name, _)| *name != "kind"))
            {
                // As text: serde_json's own recursion limit is part of what is fuzzed.
                let inner = field.to_string();
                *field = Value::Null;
                let text = value.to_string();
                let nested = format!("{}{inner}{}", "[".repeat(*depth), "]".repeat(*depth));
                text.replacen("null", &nested, 1)
            } else {
                value.to_string()
            }
        }
        Mutation::Kind(other) => {
            kind.clone_from(other);
            text
        }
        Mutation::Junk(junk) => junk.clone(),
    };
    StoredEvent {
        execution_id: "01900000-0000-7000-8000-000000000000".into(),
        seq,
        ts: "2026-11-25T12:00:00Z".into(),
        kind,
        version,
        payload,
        prev_hash: "0".repeat(64),
        hash: "f".repeat(64),
    }
}

/// A log: seeds in any order, each with a mutation, sequence numbers mostly in order.
fn log() -> impl Strategy<Value = Vec<StoredEvent>> {
    prop::collection::vec(
        (
            any::<usize>(),
            mutation(),
            prop_oneof![8 => Just(None), 1 => any::<u64>().prop_map(Some)],
            prop_oneof![8 => Just(1u32), 1 => any::<u32>()],
        ),
        0..60,
    )
    .prop_map(|events| {
        events
            .iter()
            .enumerate()
            .map(|(i, (seed, mutation, seq, version))| {
                stored(*seed, seq.unwrap_or(i as u64 + 1), *version, mutation)
            })
            .collect()
    })
}

fn check_replay(events: &[StoredEvent]) {
    let replayed = replay("01900000-0000-7000-8000-000000000000", events);
    assert!(replayed.score <= 100, "score {}", replayed.score);
    assert_eq!(replayed.complete, replayed.score >= COMPLETE_AT);
    assert!(replayed.total_turns as usize <= events.len());
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

proptest! {
    #![proptest_config(config())]

    /// Replay of any corrupted log, and of every prefix of it, never panics.
    #[test]
    fn replay_never_panics(events in log()) {
        for end in 0..=events.len() {
            check_replay(&events[..end]);
        }
    }

    /// The event decoder takes any text: an event or an error, never a panic.
    #[test]
    fn the_event_decoder_takes_any_text(text in any::<String>(), bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = serde_json::from_str::<nerve_core::Event>(&text);
        let _ = serde_json::from_slice::<nerve_core::Event>(&bytes);
    }
}
