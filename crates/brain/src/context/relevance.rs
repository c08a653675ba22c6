//! Relevance-driven recall: when the agent (or the user) names something at a turn
//! boundary that the context no longer shows, the few archived lines that mention it come
//! back into the context, as a note appended after the turn.
//!
//! A masked or summarised output leaves a digest of what it held, but a digest is chosen
//! before anyone knows what later turns will ask: a version among sixty `pip freeze` lines,
//! one row of a table, a frame of a long trace look like their neighbours. When the agent
//! later writes "Which orjson version is installed here?" or calls `pip show orjson`, the
//! words it uses say what it is after. This module picks those words (the salient ones:
//! not common English, not already in the context), and, once the compactor has searched
//! the archive for each, chooses the lines to bring back: lines that contain the rarest of
//! the words, with a line of context either side, within a budget. Nothing here knows a
//! format; a word that occurs in many archived lines points at none of them and is left out.
//!
//! The pure parts live here (tested directly); `compactor.rs` runs the archive searches
//! and appends the note.

use std::borrow::Cow;
use std::collections::HashSet;

use aho_corasick::AhoCorasick;

use nerve_core::text::clip;
use nerve_core::{BlockId, Message, MessagePart, MessageRole};

/// The prefix of every note Nerve itself adds to the conversation as a user message.
pub(crate) const NERVE_NOTE: &str = "[Nerve] ";
/// The first words of a relevance note: how the next boundary knows it ran already.
const NOTE_HEAD: &str = "[Nerve] Archived lines that mention what was just said";

/// Words searched at one boundary at most: a question names one or two things.
pub(crate) const MAX_TERMS: usize = 8;
/// Hits of one word's search at most; a word with more hits is too common to point at a
/// line.
pub(crate) const MAX_BLOCKS: usize = 8;
/// Archived lines one word may occur in and still point at them.
const MAX_LINES_PER_TERM: usize = 8;
/// Lines brought back for the words themselves, at most (their neighbours come on top).
const MAX_HITS: usize = 4;
/// Characters of one line at most.
const LINE_CHARS: usize = 240;

/// Common English words that never point at anything archived. The rest of the filtering
/// is by the context and the archive themselves (see [`salient_terms`]).
const STOPWORDS: [&str; 97] = [
    "about", "above", "after", "again", "all", "also", "and", "any", "are", "because", "been",
    "before", "being", "below", "between", "both", "but", "can", "cannot", "could", "did", "does",
    "doing", "done", "down", "during", "each", "few", "for", "from", "further", "get", "got",
    "had", "has", "have", "having", "her", "here", "hers", "him", "his", "how", "into", "its",
    "just", "let", "like", "may", "might", "more", "most", "must", "need", "needs", "next", "not",
    "now", "off", "once", "only", "other", "our", "out", "over", "own", "same", "she", "should",
    "some", "such", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "through", "too", "under", "until", "very", "was", "were", "what", "when",
    "where", "which", "while", "who", "why", "will",
];

/// Whether `message` is a relevance note (not yet masked).
pub(crate) fn is_note(message: &Message) -> bool {
    message.role == MessageRole::User
        && matches!(message.parts.as_slice(), [MessagePart::Text { text }] if text.starts_with(NOTE_HEAD))
}

/// Whether `message` is a relevance note or what masking left of one: its lines are in the
/// archive already, so a summary archives nothing for it.
pub(crate) fn is_note_or_stub(message: &Message) -> bool {
    is_note(message)
        || (message.role == MessageRole::User && message.text_content().starts_with(STUB_HEAD))
}

const STUB_HEAD: &str = "[Nerve] (archived lines were shown here";

/// What masking leaves of a relevance note once its turn is no longer recent: the words it
/// answered, and that a search finds the lines again. The lines came from the archive, so
/// nothing is archived.
pub(crate) fn stub(message: &Message) -> Message {
    let text = message.text_content();
    let first = text.lines().next().unwrap_or_default();
    let words = first
        .strip_prefix(NOTE_HEAD)
        .and_then(|rest| rest.strip_prefix(" ("))
        .and_then(|rest| rest.split_once("), ").map(|(words, _)| words))
        .unwrap_or_default();
    Message::user(format!(
        "{STUB_HEAD} for {words}; recall with a query finds them again)"
    ))
}

/// The messages a boundary looks at: from the last assistant message on (its text and
/// tool calls, the results that followed, and user messages after them), or none when
/// the last message is a relevance note already (this boundary ran before a resume).
pub(crate) fn new_messages(messages: &[Message]) -> usize {
    let Some(last) = messages.last() else {
        return messages.len();
    };
    if last.role == MessageRole::User && last.text_content().starts_with(NOTE_HEAD) {
        return messages.len();
    }
    messages
        .iter()
        .rposition(|m| m.role == MessageRole::Assistant)
        .unwrap_or(messages.len())
}

/// What the agent and the user said from `start` on (see [`new_messages`]), and the rest
/// of the context as the model reads it: the assistant's text and tool-call arguments and
/// users' text are what is said; tool outputs are not (an output's words are too many to
/// say what anyone is after) and Nerve's own notes are not. What the turn's outputs show is
/// part of the context, so a word they show is not searched.
pub(crate) fn said(messages: &[Message], start: usize) -> (String, Vec<&Message>) {
    let mut said = String::new();
    let mut rest: Vec<&Message> = Vec::new();
    for (i, message) in messages.iter().enumerate() {
        let speaks = i >= start
            && match message.role {
                MessageRole::Assistant => true,
                MessageRole::User => !message.text_content().starts_with(NERVE_NOTE),
                MessageRole::System | MessageRole::Tool => false,
            };
        if !speaks {
            rest.push(message);
            continue;
        }
        for part in &message.parts {
            match part {
                MessagePart::Text { text } => said.push_str(text),
                MessagePart::ToolCall(call) => said.push_str(&string_values(&call.arguments)),
                MessagePart::ToolResult(_)
                | MessagePart::Thinking { .. }
                | MessagePart::CompactionSummary { .. } => {}
            }
            said.push('\n');
        }
    }
    (said, rest)
}

/// A tool-call argument longer than this is content the agent writes (a file, a patch),
/// not words it looks for.
const MAX_ARGUMENT_CHARS: usize = 200;

/// The short string values of a tool call's arguments, one per line: commands, paths,
/// queries (not the keys, which name the tool's parameters, and not long values such as a
/// file's new content, whose words say what the agent writes, not what it is after).
fn string_values(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) if s.len() <= MAX_ARGUMENT_CHARS => format!("{s}\n"),
        serde_json::Value::String(_) => String::new(),
        serde_json::Value::Array(items) => items.iter().map(string_values).collect(),
        serde_json::Value::Object(map) => map.values().map(string_values).collect(),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {
            String::new()
        }
    }
}

/// Everything of `messages` the model reads, a piece per part: what "already in the
/// context" is checked against, in one pass (see [`found_in`]). Made as the pass reaches
/// each piece (a tool call's arguments are formatted then), newest first, so that a pass
/// that stops early formats nothing it did not read.
pub(crate) fn context_chunks<'a, M>(messages: M) -> impl DoubleEndedIterator<Item = Cow<'a, str>>
where
    M: IntoIterator<Item = &'a Message>,
    M::IntoIter: DoubleEndedIterator,
{
    messages
        .into_iter()
        .flat_map(|message| message.parts.iter().map(chunk))
}

/// What the model reads of one part.
fn chunk(part: &MessagePart) -> Cow<'_, str> {
    match part {
        MessagePart::Text { text }
        | MessagePart::Thinking { text, .. }
        | MessagePart::CompactionSummary { text, .. } => Cow::Borrowed(text.as_str()),
        MessagePart::ToolCall(call) => Cow::Owned(format!("{} {}", call.name, call.arguments)),
        MessagePart::ToolResult(result) => Cow::Borrowed(result.content.as_str()),
    }
}

/// Which of `needles` occur in `chunks` (ASCII case ignored with `ignore_case`): one pass
/// over the context, however many needles, where a search per needle would read a large
/// context once each. The pass reads the chunks last first and stops once every needle is
/// found: what was just said is most often in the latest messages, and a boundary with
/// nothing to compact then reads a few of them, not the whole context.
pub(crate) fn found_in<C, I>(needles: &[&str], chunks: I, ignore_case: bool) -> Vec<bool>
where
    C: AsRef<str>,
    I: IntoIterator<Item = C>,
    I::IntoIter: DoubleEndedIterator,
{
    let mut found = vec![false; needles.len()];
    if needles.is_empty() {
        return found;
    }
    let Ok(matcher) = AhoCorasick::builder()
        .ascii_case_insensitive(ignore_case)
        .build(needles)
    else {
        return found;
    };
    let mut left = needles.len();
    for chunk in chunks.into_iter().rev() {
        for hit in matcher.find_overlapping_iter(chunk.as_ref()) {
            let seen = &mut found[hit.pattern().as_usize()];
            if !*seen {
                *seen = true;
                left -= 1;
                if left == 0 {
                    return found;
                }
            }
        }
    }
    found
}

/// The words of `said` worth a search, lowercased, at most [`MAX_TERMS`]: runs of letters,
/// digits and `_ - . / :` with their outer punctuation trimmed, at least three characters
/// long, not a common English word, and nowhere in the
/// rest of the context (`context`, lowercased): a word the model can see is not what it
/// lost. Marked words (a digit, `_`, `.`, `/`, `-` or `:` inside, or a capital after the
/// first letter: identifiers, paths, versions) come first, then the longer ones.
pub(crate) fn salient_terms<C, I>(said: &str, context: I) -> Vec<String>
where
    C: AsRef<str>,
    I: IntoIterator<Item = C>,
    I::IntoIter: DoubleEndedIterator,
{
    let mut seen: HashSet<String> = HashSet::new();
    let mut terms: Vec<(bool, usize, usize, String)> = Vec::new();
    let is_part = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':');
    for (order, raw) in said.split(|c: char| !is_part(c)).enumerate() {
        let word = raw.trim_matches(|c: char| !c.is_alphanumeric());
        if word.chars().count() < 3 {
            continue;
        }
        let lower = word.to_lowercase();
        if STOPWORDS.binary_search(&lower.as_str()).is_ok() || !seen.insert(lower.clone()) {
            continue;
        }
        let marked = word
            .chars()
            .any(|c| c.is_ascii_digit() || matches!(c, '_' | '-' | '.' | '/' | ':'))
            || word.chars().skip(1).any(char::is_uppercase);
        terms.push((!marked, usize::MAX - word.len(), order, lower));
    }
    let needles: Vec<&str> = terms.iter().map(|t| t.3.as_str()).collect();
    let shown = found_in(&needles, context, true);
    let mut terms: Vec<_> = terms
        .into_iter()
        .zip(shown)
        .filter(|(_, shown)| !shown)
        .map(|(term, _)| term)
        .collect();
    terms.sort();
    terms
        .into_iter()
        .take(MAX_TERMS)
        .map(|(.., term)| term)
        .collect()
}

/// An archived block a search returned, with the text `recall` shows of it.
pub(crate) struct Found {
    pub(crate) id: BlockId,
    pub(crate) note: String,
    pub(crate) text: String,
}

/// The note that brings back the lines of `blocks` that mention `terms` (lowercased) and
/// that `context` (the whole context as the model reads it, see [`context_chunks`]) does
/// not show already, in at most `max_chars` characters; `None` when no line qualifies.
///
/// A word found in more than [`MAX_LINES_PER_TERM`] lines is dropped; each remaining one
/// weighs one over the number of lines it occurs in, a line scores the weights of the
/// words it holds, and the lines scoring at least half the best (at most [`MAX_HITS`])
/// come back, best first, then the line after and the line before each while room is
/// left (where an error's cause or location tends to be), in the output's order per block.
pub(crate) fn relevance_note<C, I>(
    terms: &[String],
    blocks: &[Found],
    context: I,
    max_chars: usize,
) -> Option<String>
where
    C: AsRef<str>,
    I: IntoIterator<Item = C>,
    I::IntoIter: DoubleEndedIterator,
{
    if terms.is_empty() || blocks.is_empty() || max_chars == 0 {
        return None;
    }
    let lines: Vec<Vec<&str>> = blocks.iter().map(|b| b.text.lines().collect()).collect();
    let lowered: Vec<Vec<String>> = lines
        .iter()
        .map(|block| block.iter().map(|l| l.to_lowercase()).collect())
        .collect();
    let occurrences = |term: &str| {
        lowered
            .iter()
            .flatten()
            .filter(|line| line.contains(term))
            .count()
    };
    let weighted: Vec<(&str, f64)> = terms
        .iter()
        .filter_map(|term| {
            let n = occurrences(term);
            (1..=MAX_LINES_PER_TERM)
                .contains(&n)
                .then(|| (term.as_str(), 1.0 / n as f64))
        })
        .collect();
    if weighted.is_empty() {
        return None;
    }
    // (score, block, line).
    let mut scored: Vec<(f64, usize, usize)> = Vec::new();
    for (b, block) in lowered.iter().enumerate() {
        for (l, line) in block.iter().enumerate() {
            let score: f64 = weighted
                .iter()
                .filter(|(term, _)| line.contains(term))
                .map(|(_, weight)| weight)
                .sum();
            if score > 0.0 {
                scored.push((score, b, l));
            }
        }
    }
    // Which of these lines and their neighbours the context shows: one pass over it.
    let mut candidates: Vec<&str> = scored
        .iter()
        .flat_map(|&(_, b, l)| [l.wrapping_sub(1), l, l + 1].map(move |l| (b, l)))
        .filter_map(|(b, l)| lines[b].get(l).map(|line| line.trim()))
        .filter(|line| !line.is_empty())
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    let in_context: HashSet<&str> = candidates
        .iter()
        .zip(found_in(&candidates, context, false))
        .filter_map(|(line, found)| found.then_some(*line))
        .collect();
    let shown = |line: &str| {
        let line = line.trim();
        line.is_empty() || in_context.contains(line)
    };
    scored.retain(|&(_, b, l)| !shown(lines[b][l]));
    let best = scored.iter().map(|s| s.0).fold(0.0, f64::max);
    scored.retain(|s| s.0 * 2.0 >= best);
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
    scored.truncate(MAX_HITS);
    let mut chosen: std::collections::BTreeSet<(usize, usize)> = Default::default();
    let mut used = 0;
    let cost = |line: &str| clip(line.trim_end(), LINE_CHARS).len() + 3;
    for &(_, b, l) in &scored {
        if used + cost(lines[b][l]) <= max_chars {
            used += cost(lines[b][l]);
            chosen.insert((b, l));
        }
    }
    let hits: Vec<(usize, usize)> = chosen.iter().copied().collect();
    for (b, l) in hits {
        for neighbour in [l + 1, l.wrapping_sub(1)] {
            let Some(line) = lines[b].get(neighbour) else {
                continue;
            };
            if !shown(line) && !chosen.contains(&(b, neighbour)) && used + cost(line) <= max_chars {
                used += cost(line);
                chosen.insert((b, neighbour));
            }
        }
    }
    if chosen.is_empty() {
        return None;
    }
    let words: Vec<String> = weighted.iter().map(|(t, _)| format!("`{t}`")).collect();
    let mut out = format!(
        "{NOTE_HEAD} ({}), from outputs that left the context; call recall with a block_id for all of one:",
        words.join(", ")
    );
    let mut last_block = None;
    let mut last_line = 0;
    for (b, l) in chosen {
        if last_block != Some(b) {
            out.push_str(&format!("\nblock {} ({}):", blocks[b].id, blocks[b].note));
        } else if l > last_line + 1 {
            out.push_str("\n  ...");
        }
        out.push_str("\n  ");
        out.push_str(clip(lines[b][l].trim_end(), LINE_CHARS));
        last_block = Some(b);
        last_line = l;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopwords_are_sorted_for_the_binary_search() {
        let mut sorted = STOPWORDS;
        sorted.sort_unstable();
        assert_eq!(sorted, STOPWORDS);
    }

    fn chunks(text: &str) -> Vec<Cow<'_, str>> {
        vec![Cow::Borrowed(text)]
    }

    fn check_terms(said: &str, context: &str, expected: &[&str]) {
        assert_eq!(
            salient_terms(said, &chunks(context)),
            expected,
            "said: {said:?}"
        );
    }

    #[test]
    fn salient_terms_are_the_words_the_context_lost() {
        check_terms(
            "Which orjson version is installed here?",
            "",
            &["installed", "version", "orjson"],
        );
        // A word the context shows is not searched.
        check_terms(
            "Which orjson version is installed here?",
            "\"version\": 3\nsee what is installed",
            &["orjson"],
        );
        // Identifiers, paths and versions first; outer punctuation trimmed.
        check_terms(
            "Where exactly did apply_refund_5 divide by zero? See (app/x.py), v1.2.",
            "",
            &[
                "apply_refund_5",
                "app/x.py",
                "v1.2",
                "exactly",
                "divide",
                "zero",
                "see",
            ],
        );
        check_terms(
            "`LedgerRefund`, on 12 or 2024?",
            "",
            &["ledgerrefund", "2024"],
        );
        check_terms("the the and of", "", &[]);
    }

    fn found(text: &str) -> Found {
        Found {
            id: BlockId::new(),
            note: "output of shell masked at turn 3".into(),
            text: text.into(),
        }
    }

    #[test]
    fn the_note_brings_back_the_rarest_lines_with_their_neighbours() {
        let freeze = (0..50)
            .map(|i| format!("pkg-{i}==1.{i}.0"))
            .chain(["orjson==3.9.101".to_owned()])
            .collect::<Vec<_>>()
            .join("\n");
        let trace = "INFO started\n\tat org.x.Y.invoke(Y.java:1)\n\tat com.acme.LedgerRefund.apply(LedgerRefund.java:77)\nCaused by: java.lang.IllegalStateException: period closed\n\t... 9 more";
        let blocks = [found(&freeze), found(trace)];
        let terms = vec!["orjson".to_owned(), "ledgerrefund".to_owned()];
        let note = relevance_note(&terms, &blocks, &chunks(""), 600).unwrap();
        assert!(note.contains("\n  orjson==3.9.101"), "{note}");
        assert!(note.contains("LedgerRefund.java:77"), "{note}");
        assert!(note.contains("Caused by: java.lang.IllegalStateException: period closed"));
        assert!(!note.contains("pkg-3=="), "{note}");
        assert!(note.len() <= 600 + 400, "{}", note.len());
        // Lines the context shows already do not come back.
        let context = "pinned: orjson==3.9.101\n";
        let note = relevance_note(&terms, &blocks, &chunks(context), 600).unwrap();
        assert!(!note.contains("orjson=="), "{note}");
        assert!(note.contains("Caused by"), "{note}");
        // A word in more lines than it can point at brings back nothing.
        let common = (0..20)
            .map(|i| format!("ledger {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            relevance_note(&["ledger".into()], &[found(&common)], &chunks(""), 600),
            None
        );
        // No room, no note.
        assert_eq!(relevance_note(&terms, &blocks, &chunks(""), 10), None);
    }

    #[test]
    fn found_in_finds_needles_in_any_chunk_and_stops_when_all_are_found() {
        let context = vec![
            Cow::Borrowed("Orjson 3.9 here"),
            Cow::Borrowed("tenant_005 and orjson"),
            Cow::Borrowed("nothing"),
        ];
        let needles = ["orjson", "tenant_005", "ledger", "3.9"];
        assert_eq!(
            found_in(&needles, &context, true),
            [true, true, false, true]
        );
        // Case matters without ignore_case: the capitalised one in the first chunk does not
        // count, the later lowercase one does.
        assert_eq!(
            found_in(&["Orjson", "orjson", "ORJSON"], &context, false),
            [true, true, false]
        );
        assert_eq!(found_in(&[], &context, true), Vec::<bool>::new());
    }

    #[test]
    fn a_masked_note_keeps_its_words() {
        let note = Message::user(format!(
            "{NOTE_HEAD} (`orjson`, `tenant_005`), from outputs that left the context; call recall with a block_id for all of one:\nblock x (output):\n  orjson==1.2.3"
        ));
        assert!(is_note(&note));
        let stub = stub(&note);
        assert_eq!(
            stub.text_content(),
            "[Nerve] (archived lines were shown here for `orjson`, `tenant_005`; recall with a query finds them again)"
        );
        assert!(!is_note(&stub) && is_note_or_stub(&stub));
    }

    #[test]
    fn a_boundary_looks_at_the_last_turn_once() {
        let assistant = Message::text(MessageRole::Assistant, "Which orjson version?");
        let tool = Message::text(MessageRole::Tool, "ok");
        let messages = vec![
            Message::system("sys"),
            Message::user("task"),
            assistant.clone(),
            tool.clone(),
        ];
        assert_eq!(new_messages(&messages), 2);
        let (said, rest) = said(&messages, 2);
        assert_eq!(said, "Which orjson version?\n");
        assert_eq!(
            context_chunks(rest).collect::<Vec<_>>(),
            ["sys", "task", "ok"]
        );
        let mut noted = messages.clone();
        noted.push(Message::user(format!("{NOTE_HEAD} (`orjson`)")));
        assert_eq!(new_messages(&noted), noted.len());
    }
}
