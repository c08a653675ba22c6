//! Layered compaction: what to take out of the conversation when it fills the window, and
//! what to leave. The planning here is pure (messages and their token counts in, a plan
//! out) so that its invariants are tested directly; `compactor.rs` carries plans out at turn
//! boundaries, archives the originals and records the events.
//!
//! The layers, cheapest first:
//! Sizes scale with the window ([`Budget`]), and before every request the compactor makes
//! the prompt fit the window less the reply's reserve, whatever the thresholds say.
//!
//! 1. **Offload**: a tool output over `offload_tokens` goes to the archive at once; the
//!    conversation keeps a preview (head, tail and a digest of the middle) and the block id.
//! 2. **Mask** (soft threshold, 60%): old tool results, outside the recent turns, are
//!    replaced by a placeholder that names the archived block and carries a short digest of
//!    the output (its error lines with their location, rules, settings, paths found); the
//!    originals stay recallable.
//! 3. **Summarise** (hard threshold, 80%; 95% when the agent steers compaction): the middle
//!    of the conversation becomes one structured summary, keeping the leading system
//!    messages, pinned messages, the recent turns (at least 3 turn pairs or 10% of the
//!    window) and messages rich in epistemic markers.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::LazyLock;

use nerve_core::text::clip;
use nerve_core::{BlockId, Complexity, Message, MessagePart, MessageRole, ToolResult};
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::context::epistemic::{keep_threshold, matches_groups};

mod digest;

use digest::{DIGEST_HEADER, found, line_shape, odd_lines};
pub use digest::{digest, preview};

/// Thresholds and sizes. Percentages are of the context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompactionConfig {
    pub enabled: bool,
    /// A tool output over this many tokens (at most [`OUTPUT_WINDOW_PERCENT`] of the window,
    /// see [`CompactionConfig::budget`]) is archived at once.
    pub offload_tokens: u64,
    /// Characters of an offloaded output kept in the conversation (head and tail; at most
    /// 5% of the window).
    pub preview_chars: usize,
    pub soft_percent: u32,
    pub hard_percent: u32,
    /// The hard threshold when the agent steers compaction with `compress_context`.
    pub agent_hard_percent: u32,
    /// Offer `compress_context` and move the automatic hard threshold to the safety net.
    pub agent_controlled: bool,
    /// Recent turn pairs always kept verbatim...
    pub keep_recent_turns: usize,
    /// ...or the recent messages that make up this share of the window, whichever is more.
    pub keep_recent_percent: u32,
    /// Conversations shorter than this are never compacted.
    pub min_messages: usize,
    /// Turns to wait after a failed compaction.
    pub cooldown_turns: u32,
    /// Budget use (percent) from which thresholds tighten.
    pub pressure_percent: u32,
    /// The hard threshold under budget pressure.
    pub pressure_hard_percent: u32,
    /// Characters of the digest (error lines with their location, rules, settings, paths
    /// found; see [`digest`]) that a masked output's placeholder keeps, and an offloaded
    /// output's preview for the middle it leaves out. 0: bare placeholders, head-and-tail
    /// previews.
    pub mask_digest_chars: usize,
    /// Characters of archived lines brought back at a turn boundary when the agent or the
    /// user names something the context no longer shows (at most 5% of the window; see
    /// `relevance.rs`). 0: never.
    pub recall_lines_chars: usize,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            offload_tokens: 4_000,
            preview_chars: 1_500,
            soft_percent: 60,
            hard_percent: 80,
            agent_hard_percent: 95,
            agent_controlled: false,
            keep_recent_turns: 3,
            keep_recent_percent: 10,
            min_messages: 4,
            cooldown_turns: 2,
            pressure_percent: 80,
            pressure_hard_percent: 70,
            mask_digest_chars: 300,
            recall_lines_chars: 600,
        }
    }
}

impl CompactionConfig {
    /// The hard threshold in force: the safety net in agent-controlled mode, tighter under
    /// budget pressure.
    pub fn hard_threshold(&self, budget_used_percent: u32) -> u32 {
        if self.agent_controlled {
            self.agent_hard_percent
        } else if budget_used_percent >= self.pressure_percent {
            self.pressure_hard_percent.min(self.hard_percent)
        } else {
            self.hard_percent
        }
    }

    /// Recent turns kept verbatim: one fewer under budget pressure, at least one.
    pub fn recent_turns(&self, budget_used_percent: u32) -> usize {
        if budget_used_percent >= self.pressure_percent {
            self.keep_recent_turns.saturating_sub(1).max(1)
        } else {
            self.keep_recent_turns
        }
    }
}

/// Characters per token assumed when a token budget becomes a character budget: fewer than
/// the three to four of prose, so that code and logs (denser in tokens) still fit.
pub const CHARS_PER_TOKEN: u64 = 3;

/// The sizes that scale with the window, so that a 4,096-token window works as well as a
/// 200,000-token one. Without a known window they are the configured ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// The most a request's prompt (messages and tool definitions) may take: the window
    /// less [`reply_reserve`]. `u64::MAX` when the window is unknown.
    pub prompt: u64,
    /// A tool output over this many tokens is offloaded at once (`offload_tokens`, at most
    /// [`OUTPUT_WINDOW_PERCENT`] of the window).
    pub output_tokens: u64,
    /// Characters of an offloaded output kept as its preview (head and tail).
    pub preview_chars: usize,
    /// Characters of the digest a placeholder or a preview carries.
    pub digest_chars: usize,
    /// Characters of one page of `recall`: what one tool output may take.
    pub page_chars: usize,
    /// Characters of archived lines a turn boundary may bring back (`recall_lines_chars`).
    pub recall_chars: usize,
}

/// The share of the window (percent) one tool output (or one page of `recall`) may take.
pub const OUTPUT_WINDOW_PERCENT: u64 = 15;
/// The share of the window (percent) an offloaded output's preview may take.
const PREVIEW_WINDOW_PERCENT: u64 = 5;
/// The share of the window (percent) a digest may take.
const DIGEST_WINDOW_PERCENT: u64 = 3;
/// The share of the window (percent) the archived lines brought back at one boundary may
/// take.
const RECALL_WINDOW_PERCENT: u64 = 5;
/// A page of `recall` never exceeds this many characters, whatever the window.
pub const MAX_PAGE_CHARS: usize = 24_000;

/// Tokens kept free for the reply: an eighth of the window, between 256 and 4,096.
pub fn reply_reserve(capacity: u64) -> u64 {
    (capacity / 8).clamp(256, 4_096).min(capacity / 2)
}

impl CompactionConfig {
    /// The sizes in force for a window of `capacity` tokens.
    pub fn budget(&self, capacity: Option<u64>) -> Budget {
        let Some(capacity) = capacity.filter(|c| *c > 0) else {
            return Budget {
                prompt: u64::MAX,
                output_tokens: self.offload_tokens,
                preview_chars: self.preview_chars,
                digest_chars: self.mask_digest_chars,
                page_chars: MAX_PAGE_CHARS,
                recall_chars: self.recall_lines_chars,
            };
        };
        let share = |percent: u64| {
            usize::try_from(capacity * percent / 100 * CHARS_PER_TOKEN).unwrap_or(usize::MAX)
        };
        let output_tokens = self
            .offload_tokens
            .min(capacity * OUTPUT_WINDOW_PERCENT / 100)
            .max(1);
        Budget {
            prompt: capacity - reply_reserve(capacity),
            output_tokens,
            preview_chars: self.preview_chars.min(share(PREVIEW_WINDOW_PERCENT)),
            digest_chars: self.mask_digest_chars.min(share(DIGEST_WINDOW_PERCENT)),
            page_chars: usize::try_from(output_tokens * CHARS_PER_TOKEN)
                .unwrap_or(usize::MAX)
                .clamp(200, MAX_PAGE_CHARS),
            recall_chars: self.recall_lines_chars.min(share(RECALL_WINDOW_PERCENT)),
        }
    }
}

/// `fill * 100 >= capacity * percent`, in integers.
pub fn at_or_above(fill: u64, capacity: u64, percent: u32) -> bool {
    capacity > 0 && u128::from(fill) * 100 >= u128::from(capacity) * u128::from(percent)
}

/// The context indicator the system prompt carries:
/// `[Context: 12,450/16,000 tokens (78%) | 0 archived blocks]`.
pub fn indicator(fill: u64, capacity: u64, archived_blocks: usize) -> String {
    let percent = if capacity == 0 {
        0
    } else {
        u128::from(fill) * 100 / u128::from(capacity)
    };
    format!(
        "[Context: {}/{} tokens ({percent}%) | {archived_blocks} archived blocks]",
        thousands(fill),
        thousands(capacity)
    )
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Replaces (or appends) the indicator line of a system prompt.
pub fn with_indicator(system: &str, indicator: &str) -> String {
    let base = system
        .rsplit_once("\n\n[Context: ")
        .map_or(system, |(base, _)| base);
    format!("{base}\n\n{indicator}")
}

/// The start of the recent window that is always kept: the last `turns` turns (an assistant
/// message and what followed it), extended backwards until it holds `min_tokens`, and never
/// starting on a tool result (whose call would be cut off).
pub fn recent_start(messages: &[Message], counts: &[u64], turns: usize, min_tokens: u64) -> usize {
    let assistants: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == MessageRole::Assistant)
        .map(|(i, _)| i)
        .collect();
    let mut start = if turns == 0 {
        messages.len()
    } else if assistants.len() >= turns {
        assistants[assistants.len() - turns]
    } else {
        assistants.first().copied().unwrap_or(messages.len())
    };
    let mut kept: u64 = counts[start..].iter().sum();
    // Ends: `start` decreases every pass and stops at 0 (both loops).
    while start > 0 && kept < min_tokens {
        start -= 1;
        kept += counts[start];
    }
    while start > 0 && start < messages.len() && messages[start].role == MessageRole::Tool {
        start -= 1;
    }
    start
}

/// Leading system messages.
pub fn head_end(messages: &[Message]) -> usize {
    messages
        .iter()
        .take_while(|m| m.role == MessageRole::System)
        .count()
}

/// A summarising compaction: `from..to` is replaced by a summary of `summarised` followed
/// by the `kept` messages (pinned, epistemic-rich), in their order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryPlan {
    pub from: usize,
    pub to: usize,
    pub kept: Vec<usize>,
    pub summarised: Vec<usize>,
}

/// What a summarising compaction must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SummaryPolicy {
    pub recent_turns: usize,
    /// Also keep the recent messages that make up this share of the window.
    pub recent_percent: u32,
    /// Decides how many epistemic groups keep a message.
    pub complexity: Option<Complexity>,
    /// Keep everything from this index on (the hybrid loop's active step).
    pub protect_from: Option<usize>,
    pub min_messages: usize,
}

/// Plans a summarising compaction, or `None` when there is nothing worth summarising.
pub fn plan_summary(
    messages: &[Message],
    counts: &[u64],
    capacity: u64,
    policy: SummaryPolicy,
) -> Option<SummaryPlan> {
    if messages.len() < policy.min_messages.max(3) || capacity == 0 {
        return None;
    }
    let min_recent = capacity * u64::from(policy.recent_percent) / 100;
    let from = head_end(messages);
    let mut to = recent_start(messages, counts, policy.recent_turns, min_recent);
    if let Some(protected) = policy.protect_from {
        to = to.min(protected);
    }
    if to <= from + 1 {
        return None;
    }
    let threshold = keep_threshold(policy.complexity);
    let (kept, summarised): (Vec<usize>, Vec<usize>) =
        (from..to).partition(|&i| is_kept(&messages[i], threshold));
    if summarised.is_empty() {
        return None;
    }
    Some(SummaryPlan {
        from,
        to,
        kept,
        summarised,
    })
}

fn is_kept(message: &Message, epistemic_threshold: usize) -> bool {
    if message.pinned || message.role == MessageRole::System {
        return true;
    }
    if is_summary(message) {
        // An earlier summary is folded into the new one, never kept beside it.
        return false;
    }
    matches!(message.role, MessageRole::Assistant | MessageRole::User)
        && matches_groups(&message.text_content(), epistemic_threshold)
}

pub fn is_summary(message: &Message) -> bool {
    message
        .parts
        .iter()
        .any(|p| matches!(p, MessagePart::CompactionSummary { .. }))
}

/// The form in which a kept middle message survives: its text only, since its tool calls'
/// results are summarised away (a call without its result would be refused by providers).
pub fn kept_form(message: &Message) -> Message {
    if message.pinned
        || message.role == MessageRole::System
        || message.tool_calls().next().is_none()
    {
        let parts = message
            .parts
            .iter()
            .filter(|p| !matches!(p, MessagePart::Thinking { .. }))
            .cloned()
            .collect::<Vec<_>>();
        if !parts.is_empty() {
            return Message {
                role: message.role,
                parts,
                pinned: message.pinned,
            };
        }
    }
    Message {
        role: message.role,
        parts: vec![MessagePart::Text {
            text: message.text_content(),
        }],
        pinned: message.pinned,
    }
}

/// Tool results to mask: every unmasked tool result before the recent window, and the
/// relevance notes there (`relevance.rs`: archived lines brought back for a turn that is
/// no longer recent).
pub fn plan_mask(messages: &[Message], counts: &[u64], recent_turns: usize) -> Vec<usize> {
    let start = recent_start(messages, counts, recent_turns, 0);
    (0..start)
        .filter(|&i| {
            (messages[i].role == MessageRole::Tool
                && messages[i].parts.iter().any(
                    |p| matches!(p, MessagePart::ToolResult(r) if !r.content.starts_with(MASKED) && !r.content.starts_with(ARCHIVED)),
                ))
                || crate::context::relevance::is_note(&messages[i])
        })
        .collect()
}

pub(crate) const MASKED: &str = "[masked: ";
pub(crate) const ARCHIVED: &str = "[archived output: ";

/// The placeholder of a masked tool result: where the output went and, within
/// `digest_chars`, its [`digest`]. A digest never makes the placeholder longer than the
/// output: it gets at most what is left of three fifths of the output's length after the
/// placeholder's own line, so that a placeholder with a digest still takes off two fifths
/// of the characters, more than the third (of the tokens) `compactor.rs` asks before it
/// masks. (A bare placeholder can be longer than a tiny output, which is then left alone.)
pub fn masked(message: &Message, tokens: u64, block: BlockId, digest_chars: usize) -> Message {
    with_results(message, |result| {
        let what = format!(
            "{MASKED}the output of {} ({tokens} tokens) was archived as block {block}; call recall with this block_id to see it",
            result.name
        );
        let room =
            (result.content.len() * 3 / 5).saturating_sub(what.len() + DIGEST_HEADER.len() + 2);
        let digest = digest(&result.content, digest_chars.min(room));
        if digest.is_empty() {
            format!("{what}]")
        } else {
            format!("{what}{DIGEST_HEADER}]\n{digest}")
        }
    })
}

/// `message` with the content of each of its tool results replaced by `content` of it.
pub(crate) fn with_results(message: &Message, content: impl Fn(&ToolResult) -> String) -> Message {
    let parts = message
        .parts
        .iter()
        .map(|part| match part {
            // Field by field: `..result.clone()` would copy the whole output only to drop it
            // (a mask of a 1M-token conversation copied 3.7 MB that way).
            MessagePart::ToolResult(result) => MessagePart::ToolResult(ToolResult {
                call_id: result.call_id.clone(),
                name: result.name.clone(),
                content: content(result),
                is_error: result.is_error,
            }),
            other @ (MessagePart::Text { .. }
            | MessagePart::ToolCall(_)
            | MessagePart::Thinking { .. }
            | MessagePart::CompactionSummary { .. }) => other.clone(),
        })
        .collect();
    Message {
        role: message.role,
        parts,
        pinned: message.pinned,
    }
}

/// The instructions of the summary call: a fixed structure, exact facts.
pub const SUMMARY_PROMPT: &str = "You compress an AI agent's working history so it can continue the task with \
less context. Write a summary with exactly these sections, as short bullet lists:\n\
## Goal\n## Done\n## Findings (exact file paths, error messages, numbers, identifiers — copy them verbatim)\n\
## Decisions (and why)\n## Open questions\n## Next steps\n\
Keep every fact later steps may need; drop pleasantries and repetition. If an earlier summary is given, merge \
it in: produce one summary, not a summary of a summary.";

/// The transcript handed to the summary call.
pub fn transcript(messages: &[&Message], earlier: Option<&str>) -> String {
    let history = history(messages);
    cut_transcript(
        earlier,
        earlier.map_or(0, str::len),
        &history,
        history.len(),
    )
}

/// The history part of a transcript: a line per message part.
pub fn history(messages: &[&Message]) -> String {
    let mut out = String::new();
    for message in messages {
        for part in &message.parts {
            let _ = match part {
                MessagePart::Text { text } => writeln!(out, "{}: {text}", role(message.role)),
                MessagePart::ToolCall(call) => {
                    writeln!(out, "tool call {}: {}", call.name, call.arguments)
                }
                MessagePart::ToolResult(result) => writeln!(
                    out,
                    "tool result {}{}: {}",
                    result.name,
                    if result.is_error { " (failed)" } else { "" },
                    result.content
                ),
                MessagePart::Thinking { text, .. } => writeln!(out, "thinking: {text}"),
                MessagePart::CompactionSummary { text, .. } => writeln!(out, "summary: {text}"),
            };
        }
    }
    out
}

/// The least a cut transcript keeps of the earlier summary and the history together
/// (bytes): less would leave a summary nothing to say, and the call fails instead (the
/// compaction then falls back to the extractive summary).
pub const MIN_TRANSCRIPT_CHARS: usize = 200;

/// The summary call's transcript of `earlier` (the last summary) and `history`, cut until
/// `fits` accepts it: the oldest history goes first; the earlier summary's end goes too
/// once the history is down to half of what is kept, so that an earlier summary larger
/// than the room never stalls the cut. `None` when the transcript does not fit even cut to
/// [`MIN_TRANSCRIPT_CHARS`].
pub fn fitted_transcript(
    earlier: Option<&str>,
    history: &str,
    fits: impl Fn(&str) -> bool,
) -> Option<String> {
    let mut keep_earlier = earlier.map_or(0, str::len);
    let mut keep_history = history.len();
    // Ends: each pass that goes on at least halves `keep_earlier + keep_history` (a
    // strictly decreasing measure), and a pass whose half is under MIN_TRANSCRIPT_CHARS
    // returns.
    loop {
        let text = cut_transcript(earlier, keep_earlier, history, keep_history);
        if fits(&text) {
            return Some(text);
        }
        let target = (keep_earlier + keep_history) / 2;
        if target < MIN_TRANSCRIPT_CHARS {
            return None;
        }
        let history_share = keep_history.min(target - target / 2);
        keep_earlier = keep_earlier.min(target - history_share);
        keep_history = keep_history.min(target - keep_earlier);
    }
}

/// The transcript with the first `keep_earlier` bytes of `earlier` and the last
/// `keep_history` bytes of `history` (each at a character boundary), each cut said.
fn cut_transcript(
    earlier: Option<&str>,
    keep_earlier: usize,
    history: &str,
    keep_history: usize,
) -> String {
    let mut out = String::new();
    if let Some(earlier) = earlier {
        let kept = clip(earlier, keep_earlier);
        let _ = if kept.len() < earlier.len() {
            writeln!(
                out,
                "EARLIER SUMMARY:\n{kept}\n[... its last {} characters left out to fit ...]\n",
                earlier.len() - kept.len()
            )
        } else {
            writeln!(out, "EARLIER SUMMARY:\n{earlier}\n")
        };
    }
    out.push_str("HISTORY:\n");
    let cut = history.len().saturating_sub(keep_history);
    let cut = (cut..=history.len())
        .find(|&i| history.is_char_boundary(i))
        .unwrap_or(history.len());
    if cut > 0 {
        let _ = writeln!(
            out,
            "[... {cut} characters of older history left out: they are archived ...]"
        );
    }
    out.push_str(&history[cut..]);
    out
}

pub(crate) fn role(role: MessageRole) -> &'static str {
    match role {
        MessageRole::System => "system",
        MessageRole::User => "user",
        MessageRole::Assistant => "assistant",
        MessageRole::Tool => "tool",
    }
}

static PATH: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(r"(?:[A-Za-z0-9_.~-]+/)+[A-Za-z0-9_.-]+|[A-Za-z0-9_-]+\.[A-Za-z][A-Za-z0-9]{0,5}\b")
        .expect("path pattern")
});
static ERROR: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(r"(?i)\b(error|failed|failure|fail|exception|panic|panicked|traceback|denied|not found|cannot|refused|timed out)\b")
        .expect("error pattern")
});
/// An error in tool output. Narrower than [`ERROR`], which reads the agent's prose: in
/// source code and logs `Error` is mostly a type name (`Result<T, Error>`, `Error::Missing`),
/// so here "error" counts only as a label (`error:`, `error[E0308]:`, `TypeError:`,
/// `ERROR`), beside the words that only failures use.
///
/// Word boundaries are ASCII ones (`(?-u:\b)`): with Unicode ones the regex's fast engine
/// gives up at the first non-ASCII byte (`✓`, `→`, an accented name) and the slow one reads
/// the rest of the output, 10 to 40 times slower; a keyword glued to a non-ASCII letter is
/// all that the ASCII boundary reads differently.
const TOOL_ERROR_PATTERN: &str = r"(?i)(?:error(?:\[[^\]\n]*\])?|exception):(?:[^:]|$)|(?-i:(?-u:\b)ERROR(?-u:\b))|(?-u:\b)(?:failed|failure|fatal|exception|panic|panicked|traceback|denied|not found|cannot|refused|timed out)(?-u:\b)";
const DECISION_PATTERN: &str = r"(?i)(?-u:\b)(?:decided|decide|will use|instead|because|chose|choose|must|must not|never|always|constraint|require[sd]?)(?-u:\b)";
static TOOL_ERROR: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(TOOL_ERROR_PATTERN).expect("tool error pattern")
});
static DECISION: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(DECISION_PATTERN).expect("decision pattern")
});
/// Errors or rules, to find both in one pass over a tool output. In a tool output "do not"
/// is a rule too (`Do not edit: generated file`); in the agent's prose it is not a decision.
static TOOL_LINE: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant patterns.
    Regex::new(&format!(
        r"(?:{TOOL_ERROR_PATTERN})|(?:{DECISION_PATTERN})|(?i:(?-u:\b)(?:do not|don't)(?-u:\b))"
    ))
    .expect("tool line pattern")
});
/// A file and a line: `x.py", line 214`, `Posting.java:118`, `src/x.rs:41:9`.
static LOCATION: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(r#"\w\.[A-Za-z][A-Za-z0-9]{0,5}(?:"?,? line \d+|:\d+)"#).expect("location pattern")
});
static NUMBER: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)] // Constant pattern.
    Regex::new(r"\b\d+(?:[.,:]\d+)*\b").expect("number pattern")
});

/// The sections of the extractive summary that hold items (the goal and the next step are
/// written apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Section {
    Done,
    Findings,
    Decisions,
    Questions,
}

// What the extractive summary keeps first when space is short (lower first), newest before
// oldest within a rank: a decision or a constraint is the costliest to rediscover; the
// latest open questions are few; the agent's notes about errors and the error lines of tool
// outputs (with their locations) come next; then the lines that stood out of a tool output
// (its odd lines, see [`odd_lines`]), the agent's other notes with paths and numbers,
// rules, settings and paths read in tool output, and the steps taken (which recall lists
// anyway). Whatever its rank, a line of a shape repeated more than [`REPEATED_SHAPE`] times
// among the candidates (a listing's paths, a stack's frames, "Step 12: looking at it")
// comes after every other: one of many alike says least.
const RANK_DECISION: u8 = 0;
const RANK_QUESTION: u8 = 1;
const RANK_NOTE_ERROR: u8 = 2;
const RANK_TOOL_ERROR: u8 = 3;
const RANK_ODD: u8 = 4;
const RANK_NOTE: u8 = 5;
const RANK_RULE: u8 = 6;
const RANK_STEP: u8 = 7;
/// Candidates of one shape (see [`line_shape`]) beyond which the shape counts as repeated.
const REPEATED_SHAPE: usize = 8;
/// Questions kept as open at most (the newest): an older question was most likely answered
/// by the turns after it, so it ranks as a note.
const OPEN_QUESTIONS: usize = 5;

/// Steps kept in the summary at most: the newest.
const MAX_STEPS: usize = 20;
/// Characters of one item at most.
const MAX_ITEM_CHARS: usize = 240;

/// One candidate line of the extractive summary; `order` is its place in the history.
#[derive(Debug)]
struct Item {
    section: Section,
    rank: u8,
    /// (the message it comes from, counted from 1; 0 for an earlier summary's items, the
    /// order it was added in).
    order: (usize, usize),
    text: String,
}

#[derive(Debug, Default)]
struct Items(Vec<Item>, usize);

impl Items {
    fn add(&mut self, section: Section, rank: u8, text: &str) {
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let order = (self.1, self.0.len());
        self.0.push(Item {
            section,
            rank,
            order,
            text: text.chars().take(MAX_ITEM_CHARS).collect(),
        });
    }

    /// A line the agent (or the user) wrote, sentence by sentence: one line often holds a
    /// decision and a remark about the next step.
    fn text_line(&mut self, line: &str) {
        for sentence in sentences(line) {
            if sentence.ends_with('?') {
                self.add(Section::Questions, RANK_QUESTION, sentence);
            } else if DECISION.is_match(sentence) {
                self.add(Section::Decisions, RANK_DECISION, sentence);
            } else if ERROR.is_match(sentence) {
                self.add(Section::Findings, RANK_NOTE_ERROR, sentence);
            } else if PATH.is_match(sentence) || NUMBER.is_match(sentence) {
                self.add(Section::Findings, RANK_NOTE, sentence);
            }
        }
    }

    /// The lines of a tool output worth keeping: errors with the few lines after them
    /// (where compilers and test runners put the location and the values), and rules; the
    /// lines that stand out of a repeated template ([`odd_lines`]) are added after, while
    /// they fit (see [`extractive_summary`]). Everything else in an output is bulk that
    /// `recall` returns on demand. A masked placeholder contributes the lines of its
    /// digest, which were picked the same way; an offload preview, the lines its digest
    /// kept of the middle.
    fn tool_output(&mut self, result: &ToolResult) {
        let content = result.content.as_str();
        if content.starts_with(MASKED) {
            // The digest: one kept line per line, after the placeholder's own line.
            let digest = content.split_once('\n').map_or("", |(_, digest)| digest);
            for line in digest.lines().map(str::trim) {
                self.add(Section::Findings, digest_line_rank(line), line);
            }
            return;
        }
        let prefix = if result.is_error { "failed: " } else { "" };
        for (rank, line) in notable_lines(content, RANK_TOOL_ERROR, RANK_RULE).into_values() {
            if line.starts_with(ARCHIVED) || line.starts_with("[...") {
                continue;
            }
            if rank == RANK_TOOL_ERROR && TOOL_ERROR.is_match(line) {
                self.add(Section::Findings, rank, &format!("{prefix}{line}"));
            } else {
                self.add(Section::Findings, rank, line);
            }
        }
    }

    /// The items of an earlier summary (a model's or an extractive one), merged into this
    /// one: folded, not nested.
    fn earlier(&mut self, summary: &str) {
        let mut section = None;
        for line in summary.lines().map(str::trim) {
            if let Some(title) = line.strip_prefix("## ") {
                let title = title.to_ascii_lowercase();
                section = if title.starts_with("goal") || title.starts_with("next") {
                    // The goal is the task's; an old next step is stale.
                    None
                } else if title.starts_with("done") {
                    Some((Section::Done, RANK_STEP))
                } else if title.starts_with("decision") {
                    Some((Section::Decisions, RANK_DECISION))
                } else if title.starts_with("open") || title.starts_with("question") {
                    Some((Section::Questions, RANK_QUESTION))
                } else {
                    Some((Section::Findings, RANK_NOTE))
                };
                continue;
            }
            let Some((section, rank)) = section else {
                continue;
            };
            if line.starts_with("[Nerve: ")
                || line.starts_with("Archived blocks")
                || line.starts_with("[... ")
            {
                continue;
            }
            let text = line
                .strip_prefix("- ")
                .or_else(|| line.strip_prefix("* "))
                .unwrap_or(line);
            let rank = if section == Section::Findings && ERROR.is_match(text) {
                RANK_NOTE_ERROR
            } else {
                rank
            };
            self.add(section, rank, text);
        }
    }
}

/// The rank in the extractive summary of a line of a masked output's digest, which does
/// not say why the digest kept it: an error; a bare path or a setting (what the output
/// found) or a rule; otherwise a line that stood out of the output or an error's location.
fn digest_line_rank(line: &str) -> u8 {
    if TOOL_ERROR.is_match(line) {
        RANK_TOOL_ERROR
    } else if found(line).is_some_and(|(_, text)| text.len() == line.trim().len())
        || TOOL_LINE.is_match(line)
    {
        RANK_RULE
    } else {
        RANK_ODD
    }
}

/// The notable lines of a tool output, by line start, in the order of the output: error
/// lines, each with those of the next three lines that carry a location or a value (ranked
/// `error`), and rules (ranked `rule`). Most lines match nothing, so one pattern runs once
/// over the whole output, where the regex's prefilter skips the bulk, rather than several
/// patterns line by line.
///
/// Failure words count only where tools print them, as a label: at the start of a line
/// (`error[E0308]: …`, `FAILED tests/…`, `panic: …`), after a timestamp or a program's
/// `name: ` prefix (`ls: cannot access …`, `test result: FAILED.`), after the `path:line:`
/// of a compiler diagnostic (`src/x.c:4:2: error: …`), in `thread '…' panicked at`, or as
/// a verdict in capitals standing alone (`test x ... FAILED`, `[ERROR] …`). Inside code
/// (`panic!(…)`, `Err("failed to load row")`), which files read and search results are
/// full of, they are words, not errors. A `path:line:` line that is not a diagnostic is a search hit: it
/// is what the search found (see [`found`]), never an error or a rule, whatever the
/// matched source says. Of the lines after an error, those giving a location or a value
/// are kept, not the source snippet a compiler quotes (`41 |     let n = …`, `|  ^^^`),
/// which costs as much as the error and says less than its location.
fn notable_lines(content: &str, error: u8, rule: u8) -> BTreeMap<usize, (u8, &str)> {
    let mut picked: BTreeMap<usize, (u8, &str)> = BTreeMap::new();
    let mut last_error = None;
    for found in TOOL_LINE.find_iter(content) {
        let (start, end) = line_bounds(content, found.start());
        let hit = search_hit(&content[start..end]);
        if !TOOL_ERROR.is_match(found.as_str()) {
            if hit.is_none() {
                picked
                    .entry(start)
                    .or_insert((rule, content[start..end].trim()));
            }
            continue;
        }
        if last_error == Some(start)
            || counts_none(content, found.start())
            || !is_label(content, start, found.start(), found.end(), hit)
        {
            continue;
        }
        last_error = Some(start);
        let line = content[start..end].trim();
        picked.insert(start, (error, line));

        // A header that ends in `:` (`panicked at src/x.rs:88:5:`) continues on the next
        // line: the message.
        let mut introduces = line.ends_with(':');
        let mut located = false;
        let error_start = start;
        let mut at = end + 1;
        let mut context = 0;
        // Of a run of locations of one shape (a stack's frames), the first: where it was
        // thrown; a frame that stands out is the odd lines' business.
        let mut location_shape = None;
        while context < 3 && at < content.len() {
            let (start, end) = line_bounds(content, at);
            let line = content[start..end].trim();
            if !line.is_empty() {
                context += 1;
                let location = LOCATION.is_match(line);
                let shape = location.then(|| line_shape(line));
                if !line.starts_with(ARCHIVED)
                    && !is_snippet(line)
                    && (shape.is_none() || shape != location_shape)
                    && (introduces || PATH.is_match(line) || NUMBER.is_match(line))
                {
                    located |= location;
                    picked.insert(start, (error, line));
                    location_shape = location_shape.or(shape);
                }
                introduces = false;
            }
            at = end + 1;
        }
        // Some languages give the location before the error (a Python traceback's last
        // `File "…", line N, in f`): when none follows it, the nearest of the three lines
        // before it that gives a file and a line.
        let mut back = if located { 0 } else { error_start };
        for _ in 0..3 {
            if back == 0 {
                break;
            }
            let (before_start, before_end) = line_bounds(content, back - 1);
            let before = content[before_start..before_end].trim();
            if !is_snippet(before)
                && LOCATION.is_match(before)
                && !picked.contains_key(&before_start)
            {
                picked.insert(before_start, (error, before));
                break;
            }
            back = before_start;
        }
    }
    picked
}

/// The length of the `path:line:` (or `path:line:column:`) that starts `line`, as `rg -n`,
/// `grep -n` and compilers print it: a file name (with an extension) or a path, a colon
/// and a line number.
fn search_hit(line: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start().len();
    let bytes = &line.as_bytes()[indent..];
    let word = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/')))
        .unwrap_or(bytes.len());
    let name = &bytes[..word];
    let file_name = name.rsplit(|&b| b == b'/').next().unwrap_or_default();
    let has_extension = file_name
        .iter()
        .rposition(|&b| b == b'.')
        .is_some_and(|dot| dot > 0 && file_name.get(dot + 1).is_some_and(u8::is_ascii_alphabetic));
    if !(has_extension || name.contains(&b'/')) {
        return None;
    }
    let mut at = word;
    // `:line:` and an optional `column:`.
    for required in [true, false] {
        let digits = bytes[at..].strip_prefix(b":").map_or(0, |rest| {
            rest.iter().take_while(|b| b.is_ascii_digit()).count()
        });
        if digits == 0 || bytes.get(at + 1 + digits) != Some(&b':') {
            if required {
                return None;
            }
            break;
        }
        at += 1 + digits;
    }
    Some(indent + at + 1)
}

/// Whether the failure word at `at..end`, on the line starting at `line_start` (a search
/// hit whose `path:line:` is `hit` bytes long, if it is one), stands where tools print their
/// labels (see [`notable_lines`]).
fn is_label(content: &str, line_start: usize, at: usize, end: usize, hit: Option<usize>) -> bool {
    let word = &content[at..end];
    let before = &content[line_start..at];
    if let Some(hit) = hit {
        // Only a compiler's diagnostic: `src/x.c:4:2: error: …`, `… fatal error: …`.
        let Some(label) = before.get(hit..) else {
            return false; // In the path itself.
        };
        let label = label.trim();
        return word.to_ascii_lowercase().starts_with("error") && matches!(label, "" | "fatal");
    }
    // `ValueError:`, `TypeError:`: the label is the whole word.
    // A qualified name is one word too: `java.lang.IllegalStateException:`.
    let head = before
        .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        .trim();
    let uppercase = word.bytes().any(|b| b.is_ascii_uppercase())
        && !word.bytes().any(|b| b.is_ascii_lowercase());
    let rest = &content[end..];
    let line_rest = &rest[..memchr::memchr(b'\n', rest.as_bytes()).unwrap_or(rest.len())];
    // A timestamp (`2026-05-01T12:00:00Z`, `[12:00:01]`), not a comment's `//`.
    let timestamp = head.bytes().any(|b| b.is_ascii_digit())
        && head
            .bytes()
            .all(|b| b.is_ascii_digit() || b" \t-:.,/+TZ[]".contains(&b));
    let label_head = head.is_empty()
        || head == "["
        || timestamp
        || (head.trim_end().ends_with(':')
            && head.starts_with(|c: char| c.is_ascii_alphanumeric())
            && !head.contains(['"', '(', ')', '{', '}', '=', ';', '<', '>', '`']));
    let placed = label_head
        || (head.starts_with("thread '") && word.eq_ignore_ascii_case("panicked"))
        || (uppercase && (before.is_empty() || before.ends_with([' ', '\t', '['])));
    // The `error:` label is matched with its colon; a bare word must end as a word does.
    placed && (word.contains(':') || ends_word(line_rest))
}

/// Whether what follows a failure word leaves it a word of a message (`failed to connect`,
/// `panic: …`, the end of the line) rather than a name in code (`panic!(…)`, `failed += 1`).
fn ends_word(rest: &str) -> bool {
    let rest = rest.trim_end();
    let Some(next) = rest.chars().next() else {
        return true;
    };
    match next {
        ':' | ']' => true,
        '.' => rest[1..].starts_with(char::is_whitespace) || rest.len() == 1,
        ' ' | '\t' => rest.trim_start().starts_with(|c: char| {
            c.is_alphanumeric() || matches!(c, '(' | '\'' | '"' | '`' | '[')
        }),
        _ => false,
    }
}

/// Whether a line is a source snippet quoted under a compiler diagnostic: `41 |     let …`,
/// `   |      ^^^^ expected …`, `   |`.
fn is_snippet(line: &str) -> bool {
    line.trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start()
        .starts_with('|')
}

/// Whether the failure word at `at` is counted zero times (`40 passed; 0 failed`): a
/// report that nothing failed.
fn counts_none(content: &str, at: usize) -> bool {
    let before = &content.as_bytes()[..at];
    before.ends_with(b"0 ")
        && !before[..before.len() - 2]
            .last()
            .is_some_and(u8::is_ascii_digit)
}

/// The bounds of the line of `text` that holds byte `at` (without its line break).
fn line_bounds(text: &str, at: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    let start = memchr::memrchr(b'\n', &bytes[..at]).map_or(0, |i| i + 1);
    let end = memchr::memchr(b'\n', &bytes[at..]).map_or(text.len(), |i| at + i);
    (start, end)
}

/// The sentences of `line`: split after `.`, `?` or `!` followed by a space, so that
/// paths and numbers stay whole.
fn sentences(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = rest
            .char_indices()
            .find(|&(i, c)| {
                matches!(c, '.' | '?' | '!') && rest[i + 1..].starts_with(char::is_whitespace)
            })
            .map_or(rest.len(), |(i, _)| i + 1);
        let sentence = &rest[..end];
        rest = rest[end..].trim_start();
        Some(sentence)
    })
}

/// The step a tool call was, in a few words: its command, path or query when it has one.
fn step(call: &nerve_core::ToolCall) -> String {
    let what = ["command", "path", "query", "pattern", "url"]
        .iter()
        .find_map(|key| call.arguments.get(*key).and_then(serde_json::Value::as_str))
        .map_or_else(|| call.arguments.to_string(), str::to_owned);
    let what: String = what.chars().take(120).collect();
    format!("{} {what}", call.name)
}

/// The deterministic extractive summary used when the summary call fails: the sections of
/// the summary prompt, filled with the decisions, the agent's notes, the error lines of
/// tool outputs (with their locations), rules, open questions and the latest steps. An
/// earlier summary's items are merged in rather than nested. When everything does not fit
/// in `max_chars`, what is costliest to lose is kept (see the ranks above), newest first;
/// each section stays in the order of the history.
pub fn extractive_summary(
    task: &str,
    messages: &[&Message],
    earlier: Option<&str>,
    max_chars: usize,
) -> String {
    let mut items = Items::default();
    if let Some(earlier) = earlier {
        items.earlier(earlier);
    }
    let mut next = None;
    for (i, message) in messages.iter().enumerate() {
        items.1 = i + 1;
        for part in &message.parts {
            match part {
                // Nerve's own notes (archived lines brought back, or their stubs) point at
                // the archive, which keeps the lines.
                MessagePart::Text { text }
                    if text.starts_with(crate::context::relevance::NERVE_NOTE) => {}
                MessagePart::Text { text } => {
                    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                        items.text_line(line);
                    }
                    if message.role == MessageRole::Assistant {
                        next = text
                            .lines()
                            .map(str::trim)
                            .find(|l| !l.is_empty())
                            .map(|l| l.chars().take(MAX_ITEM_CHARS).collect::<String>());
                    }
                }
                MessagePart::ToolCall(call) => items.add(Section::Done, RANK_STEP, &step(call)),
                MessagePart::ToolResult(result) => items.tool_output(result),
                MessagePart::CompactionSummary { text, .. } => items.earlier(text),
                MessagePart::Thinking { .. } => {}
            }
        }
    }
    let goal = format!("## Goal\n- {}\n", task.lines().next().unwrap_or_default());
    let headers = "## Done\n## Findings\n## Decisions\n## Open questions\n## Next steps\n";
    let note_reserve = 80;
    let mut used =
        goal.len() + headers.len() + note_reserve + next.as_ref().map_or(0, |n| n.len() + 3);
    // The odd lines of the outputs not masked yet, newest first, only while they can still
    // fit beside what ranks above them: looking for them in every output of a long history
    // would cost more than the rest of the summary.
    let mut above: HashSet<(Section, &str)> = HashSet::new();
    let mut room = max_chars.saturating_sub(used);
    for item in items.0.iter().filter(|item| item.rank < RANK_ODD) {
        if above.insert((item.section, item.text.as_str())) {
            room = room.saturating_sub(item.text.len() + 3);
        }
    }
    let mut odd: Vec<Item> = Vec::new();
    'outputs: for (i, message) in messages.iter().enumerate().rev() {
        for part in &message.parts {
            let MessagePart::ToolResult(result) = part else {
                continue;
            };
            if result.content.starts_with(MASKED) {
                continue;
            }
            for (_, line, _) in odd_lines(&result.content) {
                if line.starts_with(ARCHIVED) || line.starts_with("[...") {
                    continue;
                }
                if room < line.len().min(MAX_ITEM_CHARS) + 3 {
                    break 'outputs;
                }
                room -= line.len().min(MAX_ITEM_CHARS) + 3;
                odd.push(Item {
                    section: Section::Findings,
                    rank: RANK_ODD,
                    order: (i + 1, usize::MAX - odd.len()),
                    text: line.chars().take(MAX_ITEM_CHARS).collect(),
                });
            }
        }
    }
    drop(above);
    items.0.extend(odd);
    items.0.sort_by_key(|item| item.order);
    // Newest first, each line once per section, at most MAX_STEPS steps.
    let mut seen = HashSet::new();
    let mut steps = 0;
    let candidates: Vec<&Item> = items
        .0
        .iter()
        .rev()
        .filter(|item| seen.insert((item.section, item.text.as_str())))
        .filter(|item| {
            if item.section != Section::Done {
                return true;
            }
            steps += 1;
            steps <= MAX_STEPS
        })
        .collect();
    // How many candidates share each shape, and which questions are the newest.
    let mut shapes: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for item in &candidates {
        *shapes.entry(line_shape(&item.text)).or_default() += 1;
    }
    let mut questions = 0;
    let keys: Vec<(bool, u8)> = candidates
        .iter()
        .map(|item| {
            let repeated =
                shapes.get(&line_shape(&item.text)).copied().unwrap_or(0) > REPEATED_SHAPE;
            let mut rank = item.rank;
            if rank == RANK_QUESTION {
                questions += 1;
                if questions > OPEN_QUESTIONS {
                    rank = RANK_NOTE;
                }
            }
            (repeated, rank)
        })
        .collect();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by_key(|&i| keys[i]); // Stable: newest first within a rank.
    let candidates: Vec<&Item> = order.iter().map(|&i| candidates[i]).collect();
    let mut chosen = Vec::with_capacity(candidates.len());
    let mut left_out = 0;
    for item in candidates {
        let cost = item.text.len() + 3;
        if used + cost <= max_chars {
            used += cost;
            chosen.push(item);
        } else {
            left_out += 1;
        }
    }
    chosen.sort_by_key(|item| item.order);
    let mut out = goal;
    for (section, title) in [
        (Section::Done, "Done"),
        (Section::Findings, "Findings"),
        (Section::Decisions, "Decisions"),
        (Section::Questions, "Open questions"),
    ] {
        let _ = writeln!(out, "## {title}");
        for item in chosen.iter().filter(|item| item.section == section) {
            let _ = writeln!(out, "- {}", item.text);
        }
    }
    out.push_str("## Next steps\n");
    if let Some(next) = next {
        let _ = writeln!(out, "- {next}");
    }
    if left_out > 0 {
        let _ = writeln!(
            out,
            "[... {left_out} more lines left out; recall returns the full history ...]"
        );
    }
    out
}

/// Block ids a summary lists at most: the most recent; the rest stay findable by
/// `recall`'s search, so the list never grows with the run.
pub const LISTED_BLOCKS: usize = 8;

/// The summary message that replaces the middle of the conversation. It lists the most
/// recent of the `archived` blocks (at most [`LISTED_BLOCKS`]) and how many blocks the run
/// archived in all (`total_blocks`).
pub fn summary_message(
    summary: &str,
    summarised: usize,
    archived: Vec<BlockId>,
    total_blocks: usize,
) -> Message {
    let listed = archived[archived.len().saturating_sub(LISTED_BLOCKS)..].to_vec();
    let total_blocks = total_blocks.max(listed.len());
    let ids = listed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let list = if total_blocks > listed.len() {
        format!(
            "Archived blocks (the {} most recent of {total_blocks}; recall with a query finds the others): {ids}",
            listed.len()
        )
    } else {
        format!("Archived blocks: {ids}")
    };
    Message {
        role: MessageRole::User,
        parts: vec![MessagePart::CompactionSummary {
            text: format!(
                "[Nerve: {summarised} earlier messages, compacted; recall returns the originals (block ids below).]\n{summary}\n{list}"
            ),
            archived: listed,
        }],
        pinned: false,
    }
}

/// What `compress_context` asked for, carried out at the next turn boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionStrategyRequest {
    /// Archive without a summary call (a short note stands in for the messages).
    pub archive_only: bool,
    pub reason: String,
    /// Keep epistemic-rich messages verbatim (default).
    pub preserve_markers: bool,
}

#[cfg(test)]
mod tests;
