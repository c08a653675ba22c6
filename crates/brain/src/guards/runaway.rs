//! A streamed answer that runs away: the same text over and over (a small model looping on
//! a line, or on a call's arguments it never closes). Watched delta by delta while the
//! answer streams, so that such an answer is stopped within a few hundred bytes of
//! repetition instead of filling the output limit at 10-30 s per step.
//!
//! The test: the last [`MIN_RUN`] bytes (or more) of the answer's text, thinking and call
//! arguments are one piece of at most [`MAX_PERIOD`] bytes repeated at least
//! [`MIN_REPEATS`] times, exactly. Ordinary text, code and arguments do not repeat exactly
//! for that long; a file of one repeated line would (a model writing one can ask for it in
//! parts).

use crate::provider::stream::Delta;

/// The shortest repeating tail that counts.
const MIN_RUN: usize = 800;
/// The longest repeated piece looked for.
const MAX_PERIOD: usize = 400;
/// A piece must come at least this many times in a row.
const MIN_REPEATS: usize = 4;
/// How much of the answer's end is kept to look at.
const KEPT: usize = MAX_PERIOD * MIN_REPEATS * 2;
/// The tail is checked after every this many new bytes.
const CHECK_EVERY: usize = 64;

/// Watches one answer's deltas.
#[derive(Debug, Default)]
pub(crate) struct RunawayGuard {
    tail: Vec<u8>,
    unchecked: usize,
}

impl RunawayGuard {
    /// Takes in `delta`; `Some` (what repeats, in a line) once the answer ran away.
    pub(crate) fn observe(&mut self, delta: &Delta) -> Option<String> {
        let text = match delta {
            Delta::Text(text) | Delta::Thinking(text) => text,
            Delta::ToolCallArguments { fragment, .. } => fragment,
            Delta::ToolCallStart { .. } => return None,
        };
        self.tail.extend_from_slice(text.as_bytes());
        self.unchecked += text.len();
        if self.tail.len() > KEPT {
            self.tail.drain(..self.tail.len() - KEPT);
        }
        if self.unchecked < CHECK_EVERY {
            return None;
        }
        self.unchecked = 0;
        let period = repeating_period(&self.tail)?;
        let piece = &self.tail[self.tail.len() - period..];
        let shown: String = String::from_utf8_lossy(piece)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Some(format!(
            "it kept repeating the same {period} characters (`{}`)",
            nerve_core::text::clip(&shown, 80)
        ))
    }
}

/// The shortest period `p` (at most [`MAX_PERIOD`]) such that the end of `tail`, over at
/// least `max(MIN_RUN, MIN_REPEATS * p)` bytes, is one piece of `p` bytes repeated. The
/// loop is bounded by `MAX_PERIOD`.
fn repeating_period(tail: &[u8]) -> Option<usize> {
    (1..=MAX_PERIOD).find(|&period| {
        let run = MIN_RUN.max(MIN_REPEATS * period);
        if tail.len() < run {
            return false;
        }
        let window = &tail[tail.len() - run..];
        window[period..] == window[..run - period]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` bytes; the first verdict.
    fn check(text: &str, step: usize) -> Option<String> {
        let mut guard = RunawayGuard::default();
        let chars: Vec<char> = text.chars().collect();
        chars
            .chunks(step)
            .find_map(|piece| guard.observe(&Delta::Text(piece.iter().collect::<String>())))
    }

    #[test]
    fn a_repeated_line_is_stopped_and_ordinary_text_is_not() {
        let looping = format!(
            "Let me check the file.\n{}",
            "assert add(1, 2) == 3\n".repeat(60)
        );
        let verdict = check(&looping, 7).unwrap();
        assert!(verdict.contains("22 characters"), "{verdict}");
        // The piece as the tail ends, in whatever phase.
        assert!(verdict.contains("add(1, 2) == 3"), "{verdict}");
        // Stopped soon after the repetition passed the minimum run.
        let code: String = (0..200)
            .map(|i| format!("def test_{i}():\n    assert f({i}) == {}\n", i * 2))
            .collect();
        assert_eq!(check(&code, 5), None);
        assert!(check(&"word ".repeat(200), 3).is_some());
        assert_eq!(check("short ", 1), None);
        assert!(check(&"é".repeat(2000), 9).is_some());
    }

    #[test]
    fn arguments_that_never_close_count_too() {
        let mut guard = RunawayGuard::default();
        let mut verdict = None;
        for _ in 0..400 {
            verdict = verdict.or(guard.observe(&Delta::ToolCallArguments {
                index: 0,
                fragment: "\\n\\t".into(),
            }));
        }
        assert!(verdict.is_some());
    }

    proptest::proptest! {
        /// Any piece repeated far past the minimum run is found, whatever its length.
        #[test]
        fn any_repetition_is_found(piece in "[a-z ]{1,300}", step in 1_usize..50) {
            let repeats = (MIN_RUN * 2) / piece.len() + MIN_REPEATS * 2;
            proptest::prop_assert!(check(&piece.repeat(repeats), step).is_some());
        }
    }
}
