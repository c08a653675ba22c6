//! Layered compaction: what to take out of the conversation when it fills the window, and
//! what to leave. The planning here is pure (messages and their token counts in, a plan
//! out) so that its invariants are tested directly; `runner.rs` carries plans out at turn
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

use crate::epistemic::{keep_threshold, matches_groups};

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
                || crate::relevance::is_note(&messages[i])
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

/// Ends the placeholder's line when a digest follows it.
const DIGEST_HEADER: &str = "; its notable lines:";

// What a digest keeps first (lower first), in the order of the output within a rank: error
// lines with their location and values, and the exit status of a failed command; rules that
// name something (a path, a `code` span); then what the output found: a `key = value`
// setting or a path at the start of a line (a search hit, a listing), each key or path
// once, and rules in general words.
const DIGEST_ERROR: u8 = 0;
const DIGEST_RULE: u8 = 1;
const DIGEST_RARE: u8 = 2;
const DIGEST_FOUND: u8 = 3;
/// Characters of one digest line at most.
const DIGEST_LINE_CHARS: usize = 160;

/// The facts of a tool output that later turns are likely to need, in at most `max_chars`
/// characters, one per line, in the order of the output: error lines with their location
/// and values (the lines after `error[E0308]: …`, `thread … panicked at …`), the exit
/// status of a failed command, rules (`never`, `must`, …), `key = value` settings and the
/// paths found. Deterministic, and empty when nothing is notable or `max_chars` is 0. The
/// masked placeholder carries it, so that what an output established stays in context
/// after the output leaves (the reference design's "tool pair summaries"); `recall` returns
/// the rest. Errors and rules come from the pattern the extractive summary runs once over
/// each output; settings and paths are looked for only while room is left.
pub fn digest(content: &str, max_chars: usize) -> String {
    if max_chars == 0 || content.is_empty() {
        return String::new();
    }
    // (rank, order within the rank, position, line).
    let mut candidates: Vec<(u8, u32, usize, &str)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let mut cost = 0;
    for (start, (rank, line)) in notable_lines(content, DIGEST_ERROR, DIGEST_RULE) {
        if line.is_empty() || line.starts_with(ARCHIVED) || !seen.insert(line) {
            continue;
        }
        let rank = if rank == DIGEST_RULE && !names_something(line) {
            DIGEST_FOUND
        } else {
            rank
        };
        cost += digest_cost(line);
        candidates.push((rank, 0, start, line));
    }
    if let Some(status) = failed_status(content)
        && seen.insert(status)
    {
        cost += digest_cost(status);
        candidates.push((DIGEST_ERROR, 0, content.len(), status));
    }
    if cost < max_chars {
        for (start, line, score) in odd_lines(content) {
            if seen.insert(line) {
                cost += digest_cost(line);
                candidates.push((DIGEST_RARE, u32::MAX - score, start, line));
            }
        }
    }
    if cost < max_chars {
        let mut keys: HashSet<&str> = HashSet::new();
        let mut start = 0;
        while start < content.len() && cost < max_chars + DIGEST_LINE_CHARS {
            let end = memchr::memchr(b'\n', &content.as_bytes()[start..])
                .map_or(content.len(), |i| start + i);
            if let Some((key, text)) = found(&content[start..end])
                && keys.insert(key)
                && seen.insert(text)
            {
                cost += digest_cost(text);
                candidates.push((DIGEST_FOUND, 0, start, text));
            }
            start = end + 1;
        }
    }
    candidates.sort_by_key(|&(rank, order, start, _)| (rank, order, start));
    let mut used = 0;
    let mut chosen: Vec<(usize, &str)> = Vec::new();
    for (_, _, start, line) in candidates {
        let line = clip(line, DIGEST_LINE_CHARS);
        if used + line.len() <= max_chars {
            used += line.len() + 1;
            chosen.push((start, line));
        }
    }
    chosen.sort_by_key(|&(start, _)| start);
    chosen
        .into_iter()
        .map(|(_, line)| line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Lines of an output looked at for their shape, at most (the first ones): enough for a
/// listing or a log page, and a bound on the cost over a 1M-token conversation.
const SHAPE_LINES: usize = 400;
/// Rare lines kept at most, so that a listing whose every line is odd does not fill a
/// digest with noise.
const RARE_LINES: usize = 6;

/// The first lines of an output (at most [`SHAPE_LINES`], trimmed, not empty) with their
/// start and shape, and how many lines have each shape: `None` unless one shape makes up
/// at least half of at least eight lines (a log, a listing, a table, `pip freeze`, `env`).
/// Source code and prose have no dominant shape, and the scan stops as soon as none can
/// dominate any more.
struct Template<'a> {
    lines: Vec<(usize, &'a str, u64)>,
    counts: std::collections::HashMap<u64, u32, ShapeHasher>,
}

fn template(content: &str) -> Option<Template<'_>> {
    let bytes = content.as_bytes();
    // Lines the scan may still see, at most: the exit below is exact because each line
    // left can add at most one to a shape's count.
    let raw_lines = memchr::memchr_iter(b'\n', bytes).count() + 1;
    let mut raw_seen = 0;
    // Sized once: growing the table and the list line by line was a third of this scan.
    let capacity = raw_lines.min(SHAPE_LINES);
    let mut lines: Vec<(usize, &str, u64)> = Vec::with_capacity(capacity);
    let mut counts: std::collections::HashMap<u64, u32, ShapeHasher> =
        std::collections::HashMap::with_capacity_and_hasher(capacity, ShapeHasher);
    let mut dominant = 0_usize;
    let mut start = 0;
    while start < content.len() && lines.len() < SHAPE_LINES {
        let end = memchr::memchr(b'\n', &bytes[start..]).map_or(content.len(), |i| start + i);
        raw_seen += 1;
        let line = content[start..end].trim();
        if !line.is_empty() {
            let shape = line_shape(line);
            let count = counts.entry(shape).or_default();
            *count += 1;
            dominant = dominant.max(*count as usize);
            lines.push((start, line, shape));
            let left = (SHAPE_LINES - lines.len()).min(raw_lines - raw_seen);
            // No shape can make up half of the lines any more.
            if 2 * dominant + left < lines.len() {
                return None;
            }
        }
        start = end + 1;
    }
    (lines.len() >= 8 && dominant * 2 >= lines.len()).then_some(Template { lines, counts })
}

/// The first criterion of [`odd_lines`] alone: in an output made of one repeated template
/// (see [`template`]), the lines whose shape occurs once, at most [`RARE_LINES`] of them, in
/// the output's order. A line's shape is its sequence of word runs and punctuation,
/// whatever the words and numbers: `{"level":"info",…,"ms":12}` lines share one, the `warn`
/// line with other keys does not. The tests check [`template`]'s early exit with it.
#[cfg(test)]
fn rare_lines(content: &str) -> Vec<(usize, &str)> {
    let Some(Template { lines, counts }) = template(content) else {
        return Vec::new();
    };
    let rare: Vec<(usize, &str)> = lines
        .into_iter()
        .filter(|(_, _, shape)| counts.get(shape) == Some(&1))
        .map(|(start, line, _)| (start, line))
        .collect();
    if rare.len() > RARE_LINES {
        Vec::new()
    } else {
        rare
    }
}

/// Odd lines kept at most.
const ODD_LINES: usize = 6;

/// The lines that stand out of an output made of one repeated template (see [`template`]),
/// with how much each stands out, most first (then in the output's order), at most
/// [`ODD_LINES`]. A line scores for each way it differs from its neighbours, none of which
/// names a format:
///
/// - its shape occurs once ([`rare_lines`]; 2 points);
/// - among the lines of its shape (at least three), a word in a column that holds few
///   values (at most a quarter as many as lines, or two) occurs in no other line there:
///   the `127.0.0.1` among `0.0.0.0`, the backlog `511` among `128`, a replica count of 73
///   in a column of 1 to 8, the `com.acme` frame among `org.springframework` ones (a point
///   per column);
/// - it holds words (runs of three letters or more, `ledger_budget_ms` being three) found
///   in no other line, where at most one line in eight does: an odd key among keys drawn
///   from a small vocabulary (a point per word).
fn odd_lines(content: &str) -> Vec<(usize, &str, u32)> {
    let Some(Template { lines, counts }) = template(content) else {
        return Vec::new();
    };
    let mut scores = vec![0_u32; lines.len()];
    let rare = lines
        .iter()
        .filter(|(_, _, shape)| counts.get(shape) == Some(&1))
        .count();
    if rare <= RARE_LINES {
        for (score, (_, _, shape)) in scores.iter_mut().zip(&lines) {
            if counts.get(shape) == Some(&1) {
                *score += 2;
            }
        }
    }
    odd_columns(&lines, &counts, &mut scores);
    odd_words(&lines, &mut scores);
    let mut odd: Vec<(usize, &str, u32)> = lines
        .iter()
        .zip(&scores)
        .filter(|(_, score)| **score > 0)
        .map(|(&(start, line, _), &score)| (start, line, score))
        .collect();
    odd.sort_by_key(|&(start, _, score)| (std::cmp::Reverse(score), start));
    odd.truncate(ODD_LINES);
    odd
}

/// The word runs of `line`, as [`line_shape`] sees them.
fn words(line: &str) -> impl Iterator<Item = &[u8]> {
    line.as_bytes()
        .split(|b| !IS_WORD[usize::from(*b)])
        .filter(|word| !word.is_empty())
}

/// A point per column in which a line's word is the odd one out among the lines of its
/// shape (see [`odd_lines`]).
fn odd_columns(
    lines: &[(usize, &str, u64)],
    counts: &std::collections::HashMap<u64, u32, ShapeHasher>,
    scores: &mut [u32],
) {
    // The lines of each shape that has at least three, in one pass.
    let mut groups: std::collections::HashMap<u64, Vec<usize>, ShapeHasher> =
        std::collections::HashMap::with_hasher(ShapeHasher);
    for (i, (_, _, shape)) in lines.iter().enumerate() {
        if counts.get(shape).is_some_and(|&n| n >= 3) {
            groups.entry(*shape).or_default().push(i);
        }
    }
    // Value → lines holding it in the column at hand; reused from column to column.
    let mut values: std::collections::HashMap<u64, u32, ShapeHasher> =
        std::collections::HashMap::with_hasher(ShapeHasher);
    // The words of a group's lines (as hashes), one flat list (a list per line was most of
    // the cost): line `r`'s words start at `starts[r]`.
    let mut flat: Vec<u64> = Vec::new();
    let mut starts: Vec<usize> = Vec::new();
    for members in groups.values() {
        flat.clear();
        starts.clear();
        for &i in members {
            starts.push(flat.len());
            flat.extend(words(lines[i].1).map(word_hash));
        }
        starts.push(flat.len());
        let columns = starts.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(0);
        let few = (members.len() / 4).max(2);
        for column in 0..columns {
            let cell = |r: usize| flat[starts[r] + column];
            values.clear();
            for r in 0..members.len() {
                *values.entry(cell(r)).or_default() += 1;
                if values.len() > few {
                    break;
                }
            }
            if values.len() > few || values.len() < 2 {
                continue;
            }
            for (r, &i) in members.iter().enumerate() {
                if values.get(&cell(r)) == Some(&1) {
                    scores[i] += 1;
                }
            }
        }
    }
}

/// FNV-1a of a word, for the tables of [`odd_columns`].
fn word_hash(word: &[u8]) -> u64 {
    word.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A point per word a line holds that no other line does, where at most one line in
/// eight holds such a word (see [`odd_lines`]). Words here are runs of letters split at
/// digits, `_` and a lower-to-upper case change, compared without case.
fn odd_words(lines: &[(usize, &str, u64)], scores: &mut [u32]) {
    // Word hash → (lines holding it, the last line that did); and each line's words, once.
    let mut seen: std::collections::HashMap<u64, (u32, usize), ShapeHasher> =
        std::collections::HashMap::with_capacity_and_hasher(lines.len() * 2, ShapeHasher);
    let mut each: Vec<(usize, u64)> = Vec::with_capacity(lines.len() * 4);
    for (i, (_, line, _)) in lines.iter().enumerate() {
        letter_words(line, |hash| {
            let entry = seen.entry(hash).or_insert((0, usize::MAX));
            if entry.1 != i {
                entry.0 += 1;
                entry.1 = i;
                each.push((i, hash));
            }
        });
    }
    let mut unique = vec![0_u32; lines.len()];
    for (i, hash) in each {
        if seen.get(&hash).is_some_and(|e| e.0 == 1) {
            unique[i] += 1;
        }
    }
    let odd = unique.iter().filter(|&&n| n > 0).count();
    if odd * 8 > lines.len() {
        return;
    }
    for (score, n) in scores.iter_mut().zip(unique) {
        *score += n;
    }
}

/// Calls `each` with the FNV hash (lowercase) of every run of at least three ASCII letters
/// in `line`, split at anything else and where a lowercase letter meets an uppercase one.
fn letter_words(line: &str, mut each: impl FnMut(u64)) {
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if !bytes[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let start = i;
        let mut hash = 0xcbf2_9ce4_8422_2325_u64;
        while i < bytes.len()
            && bytes[i].is_ascii_alphabetic()
            && !(i > start && bytes[i].is_ascii_uppercase() && bytes[i - 1].is_ascii_lowercase())
        {
            hash = (hash ^ u64::from(bytes[i].to_ascii_lowercase()))
                .wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        if i - start >= 3 {
            each(hash);
        }
    }
}

/// Shapes are FNV hashes already: the table uses them as they are.
#[derive(Clone, Copy, Default)]
struct ShapeHasher;

impl std::hash::BuildHasher for ShapeHasher {
    type Hasher = ShapeHash;

    fn build_hasher(&self) -> ShapeHash {
        ShapeHash(0)
    }
}

struct ShapeHash(u64);

impl std::hash::Hasher for ShapeHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The shape of a line: each run of letters, digits and `_` is one word, whatever it
/// holds; punctuation and spacing runs stay as they are (a run of spaces counts once).
fn line_shape(line: &str) -> u64 {
    // FNV-1a over the classes: a few instructions a byte, where a 1M-token conversation
    // holds 3.7 MB of tool output. A word run is skipped in a tight loop, one table look-up
    // a byte: words are most of an output's bytes.
    const WORD: u8 = b'w';
    let step = |hash: u64, class: u8| (hash ^ u64::from(class)).wrapping_mul(0x0000_0100_0000_01b3);
    let bytes = line.as_bytes();
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    let mut last = 0_u8;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        i += 1;
        if IS_WORD[usize::from(byte)] {
            if last != WORD {
                hash = step(hash, WORD);
                last = WORD;
            }
            while i < bytes.len() && IS_WORD[usize::from(bytes[i])] {
                i += 1;
            }
        } else if !(byte == b' ' && last == b' ') {
            hash = step(hash, byte);
            last = byte;
        }
    }
    hash
}

/// The bytes that belong to a word for [`line_shape`]: ASCII letters and digits, `_`, and
/// every byte of a non-ASCII character.
static IS_WORD: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80;
        b += 1;
    }
    table
};

/// What a line found, as (key, text): a path at its start, with the line number when one
/// follows (`rg -n`, `find`, `ls`), or a `key = value` setting. Only the line's first word is
/// looked at, so that the bulk of an output costs little more than finding its line breaks.
fn found(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    let bytes = line.as_bytes();
    let first = *bytes.first()?;
    if !(first.is_ascii_alphanumeric() || matches!(first, b'_' | b'.')) {
        return None;
    }
    let word_end = bytes
        .iter()
        .position(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/')))
        .unwrap_or(bytes.len());
    let word = &line[..word_end];
    if word.contains('/') {
        let name = word.rsplit('/').next().unwrap_or_default();
        let is_file = name.rsplit_once('.').is_some_and(|(stem, extension)| {
            let extension = extension.as_bytes();
            !stem.is_empty()
                && (1..=6).contains(&extension.len())
                && extension[0].is_ascii_alphabetic()
                && extension.iter().all(u8::is_ascii_alphanumeric)
        });
        if !is_file {
            return None;
        }
        // With the line number: `src/x.rs:41`.
        let digits = bytes[word_end..].strip_prefix(b":").map_or(0, |rest| {
            rest.iter().take_while(|b| b.is_ascii_digit()).count()
        });
        let end = if digits > 0 {
            word_end + 1 + digits
        } else {
            word_end
        };
        return Some((word, &line[..end]));
    }
    // A setting: `key = value`, not `a == b`.
    let value = line[word_end..]
        .trim_start_matches([' ', '\t'])
        .strip_prefix('=')?;
    let is_key = first.is_ascii_alphabetic() || first == b'_';
    (is_key && !value.starts_with('=') && !value.trim().is_empty()).then_some((word, line))
}

fn digest_cost(line: &str) -> usize {
    line.len().min(DIGEST_LINE_CHARS) + 1
}

/// Whether a rule names what it is about: a path or a `code` span, rather than general
/// words such as a doc comment's "errors are never printed".
fn names_something(line: &str) -> bool {
    line.contains('`') || line.contains('/')
}

/// The status line of a command that failed (`[exit code: 2]`, `[killed by signal 9]`),
/// as the sandbox's shell tool ends its output.
fn failed_status(content: &str) -> Option<&str> {
    let last = content.trim_end().rsplit('\n').next()?.trim();
    let failed = last
        .strip_prefix("[exit code: ")
        .is_some_and(|rest| rest != "0]")
        || last.starts_with("[killed by signal ")
        || last == "[exit status unknown]";
    failed.then_some(last)
}

/// The preview left in the conversation for an offloaded tool output: its head and tail
/// and, within `digest_chars`, the [`digest`] of the middle left out, where a long log
/// tends to hold its first error.
pub fn preview(content: &str, chars: usize, block: BlockId, digest_chars: usize) -> String {
    let total = content.chars().count();
    let at = |n: usize| {
        content
            .char_indices()
            .nth(n)
            .map_or(content.len(), |(i, _)| i)
    };
    let head_chars = (chars * 2 / 3).min(total);
    let head_end = at(head_chars);
    let tail_start = at(total.saturating_sub(chars / 3).max(head_chars));
    let (head, middle, tail) = (
        &content[..head_end],
        &content[head_end..tail_start],
        &content[tail_start..],
    );
    // The middle's whole lines: a line cut by the head or the tail shows there, and as a
    // fragment it would stand out of the rest for nothing.
    let whole = middle.find('\n').map_or("", |first| {
        let rest = &middle[first + 1..];
        rest.rfind('\n').map_or("", |last| &rest[..last])
    });
    let kept = digest(whole, digest_chars);
    let gap = if kept.is_empty() {
        "[...]".to_owned()
    } else {
        format!("[... notable lines of the part left out:]\n{kept}\n[...]")
    };
    format!(
        "{ARCHIVED}{total} characters, archived as block {block}; call recall with this block_id for all of it]\n{head}\n{gap}\n{tail}"
    )
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
                MessagePart::Text { text } if text.starts_with(crate::relevance::NERVE_NOTE) => {}
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

#[cfg(test)]
mod tests {
    use nerve_core::{ToolCall, ToolResult};

    use super::*;

    /// The byte-by-byte definition of [`line_shape`], which skips word runs faster: both
    /// give the same hash for every line.
    fn line_shape_by_byte(line: &str) -> u64 {
        let mut hash = 0xcbf2_9ce4_8422_2325_u64;
        let mut last = 0_u8;
        for byte in line.bytes() {
            let class = if byte.is_ascii_alphanumeric() || byte == b'_' || byte >= 0x80 {
                b'w'
            } else {
                byte
            };
            if class == last && (class == b'w' || class == b' ') {
                continue;
            }
            hash = (hash ^ u64::from(class)).wrapping_mul(0x0000_0100_0000_01b3);
            last = class;
        }
        hash
    }

    /// [`rare_lines`] without its early exits: both keep the same lines.
    fn rare_lines_whole_scan(content: &str) -> Vec<(usize, &str)> {
        let mut lines: Vec<(usize, &str, u64)> = Vec::new();
        let mut counts: std::collections::HashMap<u64, u32> = std::collections::HashMap::new();
        let mut start = 0;
        while start < content.len() && lines.len() < SHAPE_LINES {
            let end = content[start..]
                .find('\n')
                .map_or(content.len(), |i| start + i);
            let line = content[start..end].trim();
            if !line.is_empty() {
                let shape = line_shape_by_byte(line);
                *counts.entry(shape).or_default() += 1;
                lines.push((start, line, shape));
            }
            start = end + 1;
        }
        let dominant = counts.values().copied().max().unwrap_or(0) as usize;
        if lines.len() < 8 || dominant * 2 < lines.len() {
            return Vec::new();
        }
        let rare: Vec<(usize, &str)> = lines
            .into_iter()
            .filter(|(_, _, shape)| counts[shape] == 1)
            .map(|(start, line, _)| (start, line))
            .collect();
        if rare.len() > RARE_LINES {
            Vec::new()
        } else {
            rare
        }
    }

    /// Cut to fit by length: each pass counted, the result returned with the count.
    fn fit_by_length(earlier: Option<&str>, history: &str, room: usize) -> (Option<String>, u32) {
        let passes = std::cell::Cell::new(0_u32);
        let fitted = fitted_transcript(earlier, history, |text| {
            passes.set(passes.get() + 1);
            text.len() <= room
        });
        (fitted, passes.get())
    }

    #[test]
    fn a_transcript_that_fits_is_sent_whole() {
        let history = "user: go on\n";
        let (fitted, passes) = fit_by_length(Some("## Goal\nx"), history, 1_000);
        let whole = transcript(&[&Message::user("go on")], Some("## Goal\nx"));
        assert_eq!(fitted.as_deref(), Some(whole.as_str()));
        assert_eq!(passes, 1);
    }

    #[test]
    fn an_earlier_summary_larger_than_the_room_is_cut_too() {
        let earlier = "## Goal\nkeep the build green\n".repeat(400);
        let history = "tool result shell: ok\n".repeat(10);
        let (fitted, _) = fit_by_length(Some(&earlier), &history, 2_000);
        let fitted = fitted.unwrap();
        assert!(fitted.len() <= 2_000, "{}", fitted.len());
        assert!(fitted.starts_with("EARLIER SUMMARY:\n## Goal\nkeep the build green"));
        assert!(
            fitted.contains("characters left out to fit ...]"),
            "{fitted}"
        );
        // The newest history stays.
        assert!(fitted.ends_with("tool result shell: ok\n"), "{fitted}");
        // No room even for the least a transcript keeps: a failure, not a loop.
        assert_eq!(fit_by_length(Some(&earlier), &history, 100).0, None);
    }

    proptest::proptest! {
        /// Whatever the sizes and the room, the cut ends within a pass per halving of the
        /// input, and what it returns fits.
        #[test]
        fn a_transcript_cut_ends_and_fits(
            earlier in proptest::option::of(0_usize..40_000),
            history in 0_usize..40_000,
            room in 0_usize..50_000,
            wide in proptest::bool::ANY,
        ) {
            let unit = if wide { "é" } else { "a" };
            let earlier = earlier.map(|n| unit.repeat(n / unit.len()));
            let history = unit.repeat(history / unit.len());
            let (fitted, passes) = fit_by_length(earlier.as_deref(), &history, room);
            let total = earlier.as_ref().map_or(0, String::len) + history.len();
            let halvings = total.max(1).ilog2() + 2;
            proptest::prop_assert!(passes <= halvings, "{passes} passes for {total} bytes");
            if let Some(fitted) = fitted {
                proptest::prop_assert!(fitted.len() <= room);
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn rare_lines_exit_early_only_when_the_answer_is_known(
            lines in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => proptest::strategy::Just("pkg1==1.2.3".to_owned()),
                    3 => "[a-z]{1,6}==[0-9]\\.[0-9]{1,2}\\.[0-9]",
                    3 => "[a-z =:,.-]{0,12}",
                ],
                0..60,
            )
        ) {
            let content = lines.join("\n");
            proptest::prop_assert_eq!(rare_lines(&content), rare_lines_whole_scan(&content));
        }

        /// Odd lines are lines of the output, at most [`ODD_LINES`], most odd first, and
        /// only in an output with a template: the same one whatever the early exit.
        #[test]
        fn odd_lines_are_few_ranked_lines_of_a_templated_output(
            lines in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => "LISTEN 0 128 0\\.0\\.0\\.0:[0-9]{4} users:\\(\\([a-c]{1,2}\\)\\)",
                    2 => "[a-z]{1,6}==[0-9]\\.[0-9]{1,2}\\.[0-9]",
                    1 => "[a-z =:,.-]{0,12}",
                ],
                0..60,
            )
        ) {
            let content = lines.join("\n");
            let odd = odd_lines(&content);
            proptest::prop_assert!(odd.len() <= ODD_LINES);
            if template(&content).is_none() {
                proptest::prop_assert!(odd.is_empty());
            }
            for pair in odd.windows(2) {
                proptest::prop_assert!((pair[0].2, std::cmp::Reverse(pair[0].0)) >= (pair[1].2, std::cmp::Reverse(pair[1].0)));
            }
            for (start, line, score) in odd {
                proptest::prop_assert!(score > 0);
                proptest::prop_assert_eq!(content[start..].lines().next().map(str::trim), Some(line));
            }
        }

        #[test]
        fn line_shape_is_the_byte_by_byte_definition(line in "[a-zA-Z0-9_ \t:=.,/\\-\"{}()é]{0,80}") {
            proptest::prop_assert_eq!(line_shape(&line), line_shape_by_byte(&line));
        }
    }

    fn check_indicator(fill: u64, capacity: u64, blocks: usize, expected: &str) {
        assert_eq!(indicator(fill, capacity, blocks), expected);
    }

    #[test]
    fn indicator_format() {
        check_indicator(
            12_450,
            16_000,
            0,
            "[Context: 12,450/16,000 tokens (77%) | 0 archived blocks]",
        );
        check_indicator(
            999,
            1_000_000,
            3,
            "[Context: 999/1,000,000 tokens (0%) | 3 archived blocks]",
        );
        let prompt = with_indicator(
            "You are Nerve.",
            "[Context: 1/2 tokens (50%) | 0 archived blocks]",
        );
        let again = with_indicator(&prompt, "[Context: 2/2 tokens (100%) | 1 archived blocks]");
        assert_eq!(
            again,
            "You are Nerve.\n\n[Context: 2/2 tokens (100%) | 1 archived blocks]"
        );
    }

    #[test]
    fn thresholds_table() {
        let config = CompactionConfig::default();
        // Exactly at the threshold compacts; one token below does not.
        assert!(at_or_above(80, 100, 80));
        assert!(!at_or_above(79, 100, 80));
        // Unknown (zero) capacity never compacts.
        assert!(!at_or_above(1_000_000, 0, 80));
        assert_eq!(config.hard_threshold(0), 80);
        assert_eq!(
            config.hard_threshold(85),
            70,
            "tighter under budget pressure"
        );
        let agent = CompactionConfig {
            agent_controlled: true,
            ..config
        };
        assert_eq!(agent.hard_threshold(0), 95);
        assert_eq!(config.recent_turns(0), 3);
        assert_eq!(config.recent_turns(90), 2);
    }

    pub(crate) fn conversation(turns: usize, text: &str) -> Vec<Message> {
        let mut messages = vec![Message::system("sys"), Message::user("the task").pinned()];
        for i in 0..turns {
            let call = ToolCall {
                id: format!("c{i}").as_str().into(),
                name: "shell".into(),
                arguments: serde_json::json!({"command": i}),
            };
            messages.push(Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Text {
                        text: format!("{text} {i}"),
                    },
                    MessagePart::ToolCall(call.clone()),
                ],
                pinned: false,
            });
            messages.push(Message::tool_result(ToolResult {
                call_id: call.id,
                name: "shell".into(),
                content: format!("output {i}"),
                is_error: false,
            }));
        }
        messages
    }

    #[test]
    fn summary_plan_keeps_head_pinned_recent_and_epistemic() {
        let mut messages = conversation(8, "step");
        messages[6] = Message {
            role: MessageRole::Assistant,
            parts: vec![MessagePart::Text {
                text: "Hmm, wait: perhaps I was wrong; let me verify.".into(),
            }],
            pinned: false,
        };
        let counts = [10; 32];
        let counts = &counts[..messages.len()];
        let policy = SummaryPolicy {
            recent_turns: 3,
            recent_percent: 0,
            complexity: Some(Complexity::Simple),
            protect_from: None,
            min_messages: 4,
        };
        let plan = plan_summary(&messages, counts, 10_000, policy).unwrap();
        assert_eq!(plan.from, 1);
        assert_eq!(plan.to, messages.len() - 6, "3 turn pairs kept");
        assert_eq!(
            plan.kept,
            [1, 6],
            "the pinned task and the epistemic message"
        );
        assert!(!plan.summarised.contains(&1));
        // Fewer than the minimum messages never compacts.
        assert_eq!(
            plan_summary(&messages[..3], &counts[..3], 10_000, policy),
            None
        );
        // The active step is protected.
        let protected = plan_summary(
            &messages,
            counts,
            10_000,
            SummaryPolicy {
                recent_turns: 1,
                protect_from: Some(5),
                ..policy
            },
        )
        .unwrap();
        assert_eq!(protected.to, 5);
    }

    #[test]
    fn the_recent_window_never_starts_on_a_tool_result() {
        let messages = conversation(4, "x");
        let counts = [1; 10];
        let start = recent_start(&messages, &counts[..messages.len()], 1, 2);
        assert_ne!(messages[start].role, MessageRole::Tool);
    }

    #[test]
    fn extractive_summary_keeps_paths_errors_and_numbers() {
        let messages = [
            Message::text(
                MessageRole::Assistant,
                "I decided to use sqlite because it is embedded.",
            ),
            Message::tool_result(ToolResult {
                call_id: "c".into(),
                name: "shell".into(),
                content: "src/db/schema.rs:42: error[E0308]: mismatched types".into(),
                is_error: true,
            }),
            Message::text(MessageRole::Assistant, "Which table holds the sessions?"),
        ];
        let refs: Vec<&Message> = messages.iter().collect();
        let summary =
            extractive_summary("fix the build", &refs, Some("## Goal\n- earlier"), 10_000);
        assert!(
            summary.contains("src/db/schema.rs:42: error[E0308]: mismatched types"),
            "{summary}"
        );
        assert!(summary.contains("I decided to use sqlite because it is embedded."));
        assert!(summary.contains("Which table holds the sessions?"));
        assert!(summary.starts_with("## Goal\n- fix the build"));
    }

    /// The extractive summary of `messages` (with `earlier`, within `max_chars`) holds every
    /// line of `present` and none of `absent`.
    fn check_extractive(
        messages: &[Message],
        earlier: Option<&str>,
        max_chars: usize,
        present: &[&str],
        absent: &[&str],
    ) -> String {
        let refs: Vec<&Message> = messages.iter().collect();
        let summary = extractive_summary("fix the build", &refs, earlier, max_chars);
        for line in present {
            assert!(summary.contains(line), "`{line}` missing from:\n{summary}");
        }
        for line in absent {
            assert!(
                !summary.contains(line),
                "`{line}` must not be in:\n{summary}"
            );
        }
        summary
    }

    fn tool(content: &str, is_error: bool) -> Message {
        Message::tool_result(ToolResult {
            call_id: "c".into(),
            name: "shell".into(),
            content: content.into(),
            is_error,
        })
    }

    #[test]
    fn extractive_summary_folds_an_earlier_summary_instead_of_nesting_it() {
        let earlier = "[Nerve: 12 earlier messages, compacted; recall returns the originals (block ids below).]\n\
            ## Goal\n- fix the build\n## Done\n- shell cargo build\n\
            ## Findings (exact paths, errors, numbers)\n- src/db/schema.rs:42: error[E0308]: mismatched types\n\
            ## Decisions\n- Use sqlite because it is embedded.\n## Open questions\n## Next steps\n- read schema.rs\n\
            Archived blocks: 0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f";
        let summary = check_extractive(
            &[Message::text(
                MessageRole::Assistant,
                "The pool size is 48 in config/db.toml. Next I will check the migration.",
            )],
            Some(earlier),
            10_000,
            &[
                "- src/db/schema.rs:42: error[E0308]: mismatched types",
                "- Use sqlite because it is embedded.",
                "- shell cargo build",
                "- The pool size is 48 in config/db.toml.",
            ],
            &[
                "[Nerve: ",
                "Archived blocks",
                "## Earlier",
                "- read schema.rs",
            ],
        );
        assert_eq!(summary.matches("## Goal").count(), 1, "{summary}");
        // Folding a fold changes nothing more: the items are merged, never wrapped again.
        let again = check_extractive(&[], Some(&summary), 10_000, &[], &["## Earlier"]);
        assert_eq!(again.matches("error[E0308]").count(), 1, "{again}");
    }

    #[test]
    fn extractive_summary_keeps_errors_with_their_location_and_skips_placeholders() {
        check_extractive(
            &[
                tool(
                    "   Compiling serde v1.0.1\nerror[E0382]: borrow of moved value: `row`\n  --> src/ledger.rs:88:9\n   |\n    Finished in 3.2s",
                    true,
                ),
                tool(
                    "[masked: the output of shell (900 tokens) was archived as block b; call recall with this block_id to see it]",
                    false,
                ),
                tool(
                    "Money is stored in cents.\nNever edit applied migrations.",
                    false,
                ),
            ],
            None,
            10_000,
            &[
                "- failed: error[E0382]: borrow of moved value: `row`",
                "- --> src/ledger.rs:88:9",
                "- Never edit applied migrations.",
            ],
            &["masked", "Compiling serde", "Money is stored"],
        );
    }

    #[test]
    fn a_tight_extractive_summary_keeps_decisions_and_the_newest_errors() {
        let mut messages = vec![Message::text(
            MessageRole::Assistant,
            "Decision: use RowStreamer instead of a Vec, because exports are large.",
        )];
        for i in 0..200 {
            messages.push(Message {
                role: MessageRole::Assistant,
                parts: vec![MessagePart::ToolCall(ToolCall {
                    id: format!("c{i}").as_str().into(),
                    name: "shell".into(),
                    arguments: serde_json::json!({"command": format!("cargo test part_{i}")}),
                })],
                pinned: false,
            });
            messages.push(tool(
                &format!("test part_{i} ... FAILED at src/part_{i}.rs:{i}"),
                true,
            ));
        }
        let summary = check_extractive(
            &messages,
            None,
            1_500,
            &[
                "use RowStreamer instead of a Vec",
                "src/part_199.rs:199",
                "## Next steps",
                "more lines left out",
            ],
            &["src/part_0.rs:0"],
        );
        assert!(summary.len() <= 1_500, "{} characters", summary.len());
    }

    /// The digest of `content` within `max_chars` is exactly `expected` (its lines).
    fn check_digest(content: &str, max_chars: usize, expected: &[&str]) {
        let got = digest(content, max_chars);
        assert_eq!(got.lines().collect::<Vec<_>>(), expected, "{got}");
        assert!(got.len() <= max_chars, "{} > {max_chars}", got.len());
        assert_eq!(got, digest(content, max_chars), "deterministic");
    }

    #[test]
    fn digest_table() {
        let build = "   Compiling serde v1.0.1\nwarning: unused variable: `row`\n  --> src/ledger.rs:12:5\n   |\n\
            error[E0308]: mismatched types\n  --> src/x.rs:41:9\n   |\n41 |     let n: u32 = row.get(\"n\")?;\n   |\n\
            error: could not compile `billing` (lib) due to 1 previous error\n[exit code: 101]";
        // The error with its location (not the quoted source line), the summary line, the
        // status; not the warning's location.
        check_digest(
            build,
            300,
            &[
                "error[E0308]: mismatched types",
                "--> src/x.rs:41:9",
                "error: could not compile `billing` (lib) due to 1 previous error",
                "[exit code: 101]",
            ],
        );
        // A tight budget keeps the first error and its location.
        check_digest(
            build,
            60,
            &["error[E0308]: mismatched types", "--> src/x.rs:41:9"],
        );
        // Non-ASCII text around (the patterns' word boundaries are ASCII ones) changes
        // nothing.
        check_digest(
            "✓ café loaded → ok\nerror: the café is closed (ünïcode)\n→ done",
            300,
            &["error: the café is closed (ünïcode)"],
        );
        // A Python traceback gives the location before the error; a Java exception names
        // its class before the colon and its cause on a `Caused by:` line.
        check_digest(
            "DEBUG loaded 40 rows\nTraceback (most recent call last):\n  File \"/usr/lib/python3.12/x/y.py\", line 12, in run\n    return fn()\n  File \"app/billing/invoice.py\", line 214, in render_total\n    total = rows[0].amount / count\nZeroDivisionError: division by zero",
            300,
            &[
                "Traceback (most recent call last):",
                "File \"/usr/lib/python3.12/x/y.py\", line 12, in run",
                "File \"app/billing/invoice.py\", line 214, in render_total",
                "total = rows[0].amount / count",
                "ZeroDivisionError: division by zero",
            ],
        );
        check_digest(
            "2026-11-04 10:00:01 INFO  [main] started\njava.lang.RuntimeException: posting failed\n\tat com.acme.ledger.Posting.apply(Posting.java:118)\nCaused by: java.lang.IllegalStateException: period 2024 is closed\n\t... 12 more",
            300,
            &[
                "java.lang.RuntimeException: posting failed",
                "at com.acme.ledger.Posting.apply(Posting.java:118)",
                "Caused by: java.lang.IllegalStateException: period 2024 is closed",
                "... 12 more",
            ],
        );
        // A failing assertion: where it panicked and the values.
        check_digest(
            "running 2 tests\ntest ledger::tests::sums ... ok\ntest ledger::tests::exact ... FAILED\n\n\
             ---- ledger::tests::exact stdout ----\nthread 'ledger::tests::exact' panicked at src/ledger.rs:88:5:\n\
             assertion `left == right` failed\n  left: 1250\n right: 1251\n\n\
             test result: FAILED. 1 passed; 1 failed; 0 ignored",
            300,
            &[
                "test ledger::tests::exact ... FAILED",
                "thread 'ledger::tests::exact' panicked at src/ledger.rs:88:5:",
                "assertion `left == right` failed",
                "left: 1250",
                "right: 1251",
                "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            ],
        );
        // Settings, each key once; a rule that names something before one in general words.
        check_digest(
            "[pool]\nsize = 48\nidle_ms = 30000\n[replica]\nsize = 8\n\
             Secrets are never written to logs.\nNever edit migrations/0036_fx.sql; add a new one.",
            300,
            &[
                "size = 48",
                "idle_ms = 30000",
                "Secrets are never written to logs.",
                "Never edit migrations/0036_fx.sql; add a new one.",
            ],
        );
        check_digest(
            "size = 48\nSecrets are never written to logs.\nNever edit migrations/0036_fx.sql; add a new one.",
            60,
            &["Never edit migrations/0036_fx.sql; add a new one."],
        );
        // Search hits: each file once, with its first line number.
        check_digest(
            "src/a.rs:10:fn apply_fx() {\nsrc/a.rs:42:    apply_fx();\ncrates/b/src/c.rs:7:use a::apply_fx;\nREADME.md",
            300,
            &["src/a.rs:10", "crates/b/src/c.rs:7"],
        );
        // Nothing notable: a source file, a passing test run, a success status.
        for quiet in [
            "pub fn load(&self, id: &Id) -> Result<Row, Error> {\n    let row = self.rows.get(id).ok_or(Error::Missing)?;\n    Ok(row)\n}",
            "running 3 tests\ntest a ... ok\n\ntest result: ok. 3 passed; 0 failed; 0 ignored\n[exit code: 0]",
            "",
        ] {
            check_digest(quiet, 300, &[]);
        }
        // No budget, no digest.
        check_digest(build, 0, &[]);
    }

    /// Each line of `content` that [`notable_lines`] picks, with "error" or "rule".
    fn check_notable(content: &str, expected: &[(&str, &str)]) {
        let got: Vec<(&str, &str)> = notable_lines(content, 0, 1)
            .into_values()
            .map(|(rank, line)| (if rank == 0 { "error" } else { "rule" }, line))
            .collect();
        assert_eq!(got, expected, "{content}");
    }

    /// The odd lines of `content` are exactly `expected`, most odd first.
    fn check_odd(content: &str, expected: &[&str]) {
        let got: Vec<&str> = odd_lines(content).into_iter().map(|(_, l, _)| l).collect();
        assert_eq!(got, expected, "{content}");
    }

    #[test]
    fn odd_lines_table() {
        // The odd value of a column that holds few: a loopback address and a backlog among
        // the same ones (the header's shape is rare too).
        let mut ss = String::from("State Recv-Q Send-Q Local Peer\n");
        for i in 0..30 {
            let _ = writeln!(
                ss,
                "LISTEN 0 128 0.0.0.0:{} 0.0.0.0:* users:((\"w{i}\",pid={}))",
                20_000 + i * 7,
                900 + i
            );
        }
        ss.push_str("LISTEN 0 511 127.0.0.1:6379 0.0.0.0:* users:((\"cache\",pid=77))\n");
        // (The header's shape is rare and its words are its own: it comes first.)
        check_odd(
            &ss,
            &[
                "State Recv-Q Send-Q Local Peer",
                "LISTEN 0 511 127.0.0.1:6379 0.0.0.0:* users:((\"cache\",pid=77))",
            ],
        );
        // A key whose words no other key uses, among keys drawn from a few words.
        let words = ["ledger", "refund", "tenant", "quota", "audit"];
        let mut config = String::new();
        for i in 0..40 {
            let _ = writeln!(
                config,
                "\"{}_{}\": {},",
                words[i % 5],
                words[(i / 5) % 5],
                i * 13
            );
        }
        config.push_str("\"retry_budget_ms\": 2750,\n");
        check_odd(&config, &["\"retry_budget_ms\": 2750,"]);
        // A stack's frames after a log: the application's frame differs from the
        // framework's in several columns.
        let mut log = String::new();
        for i in 0..20 {
            let _ = writeln!(
                log,
                "10:00:{i:02} INFO [main] c.a.Worker - handled in {i} ms"
            );
        }
        log.push_str("java.lang.RuntimeException: posting failed\n");
        for (pkg, class) in [("web", "Filter"), ("tx", "Proxy"), ("aop", "Chain")] {
            let _ = writeln!(
                log,
                "\tat org.springframework.{pkg}.{class}.invoke({class}.java:42)"
            );
        }
        log.push_str("\tat com.acme.ledger.Posting.apply(Posting.java:118)\n");
        log.push_str("Caused by: java.lang.IllegalStateException: period 2031 is closed\n");
        let odd = odd_lines(&log);
        assert_eq!(
            odd.first().map(|(_, l, _)| *l),
            Some("at com.acme.ledger.Posting.apply(Posting.java:118)"),
            "{odd:?}"
        );
        // Source code has no template; a listing whose every line has its own name and
        // nothing else odd has no odd line.
        check_odd(
            "fn main() {\n    let x = 1;\n    println!(\"{x}\");\n}\n",
            &[],
        );
        let freeze: String = (0..50)
            .map(|i| {
                format!(
                    "pkg{}=={}.{}.{}\n",
                    ["alpha", "beta", "gamma", "delta", "omega"][i % 5].repeat(1 + i / 5),
                    i % 7,
                    i,
                    i * 37 % 211
                )
            })
            .collect();
        check_odd(&freeze, &[]);
    }

    #[test]
    fn an_exception_chain_keeps_the_first_frame_the_application_frame_and_the_cause() {
        let mut log = String::new();
        for i in 0..20 {
            let _ = writeln!(
                log,
                "10:00:{i:02} INFO [main] c.a.Worker - handled in {i} ms"
            );
        }
        log.push_str("java.lang.RuntimeException: posting failed\n");
        for (pkg, class) in [
            ("web", "Filter"),
            ("tx", "Proxy"),
            ("aop", "Chain"),
            ("orm", "Session"),
        ] {
            let _ = writeln!(
                log,
                "\tat org.springframework.{pkg}.{class}.invoke({class}.java:42)"
            );
        }
        log.push_str("\tat com.acme.ledger.Posting.apply(Posting.java:118)\n");
        log.push_str(
            "Caused by: java.lang.IllegalStateException: period 2031 is closed\n\t... 12 more\n",
        );
        check_digest(
            &log,
            300,
            &[
                "java.lang.RuntimeException: posting failed",
                "at org.springframework.web.Filter.invoke(Filter.java:42)",
                "at com.acme.ledger.Posting.apply(Posting.java:118)",
                "Caused by: java.lang.IllegalStateException: period 2031 is closed",
                "... 12 more",
            ],
        );
    }

    #[test]
    fn the_summary_puts_repeated_lines_last_and_keeps_few_questions_open() {
        let mut messages = Vec::new();
        for i in 0..30 {
            messages.push(Message::text(
                MessageRole::Assistant,
                format!("Step {i}: Next I look at what the tool shows."),
            ));
        }
        for i in 0..8 {
            messages.push(Message::text(
                MessageRole::Assistant,
                format!("Which port does daemon_{i} use?"),
            ));
        }
        messages.push(tool(
            "[masked: the output of shell (900 tokens) was archived as block b; call recall with this block_id to see it; its notable lines:]\nLISTEN 0 511 127.0.0.1:6379",
            false,
        ));
        messages.push(Message::user("[Nerve] Archived lines that mention what was just said (`x`), from block b:\nsrc/a.rs:1"));
        // The odd line and the five newest questions come first; older questions and the
        // thirty steps alike go when room runs out, and Nerve's note never comes in.
        check_extractive(
            &messages,
            None,
            430,
            &["LISTEN 0 511 127.0.0.1:6379", "daemon_7", "daemon_3"],
            &["daemon_0", "Step ", "[Nerve]", "src/a.rs:1"],
        );
    }

    #[test]
    fn failure_words_count_only_where_tools_print_labels() {
        // Labels as tools print them: at the start of a line, after a timestamp or a
        // program's `name: `, after a diagnostic's `path:line:col:`, in `thread '…'
        // panicked at`, and verdicts in capitals.
        for line in [
            "error[E0308]: mismatched types",
            "  error: could not compile `billing`",
            "src/db/schema.rs:42: error[E0308]: mismatched types",
            "src/x.c:4:2: fatal error: x.h: No such file or directory",
            "thread 'main' panicked at src/main.rs:3:5",
            "test ledger::tests::exact ... FAILED",
            "FAILED tests/test_rows.py::test_load - AssertionError",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "2026-05-01T12:00:00Z ERROR api: request failed",
            "[ERROR] Failed to execute goal",
            "ValueError: bad row",
            "panic: runtime error: index out of range",
            "ls: cannot access 'x': No such file or directory",
            "Traceback (most recent call last):",
        ] {
            check_notable(line, &[("error", line.trim())]);
        }
        // The same words in code, in a file read or in a search hit, and a search hit's
        // rule: nothing (the search hits are paths found, see `found`).
        for line in [
            "        return Err(\"failed to load row\".into());",
            "    panic!(\"corrupt page {id}\");",
            "        failed += 1;",
            "    if self.failed.len() > 3 {",
            "    if level == ERROR {",
            "    except ValueError:",
            "    // failed requests are retried once",
            "src/db/load.rs:41:        return Err(\"failed to load row\".into());",
            "src/db/page.rs:88:    panic!(\"corrupt page\");",
            "crates/api/src/rate.rs:7:    // the rate must never be negative",
            "README.md:3:Builds that failed are never retried.",
            "   |             ^^^^ not found in this scope",
            "test result: ok. 40 passed; 0 failed; 0 ignored",
        ] {
            check_notable(line, &[]);
        }
        // A rule outside a search hit stays one.
        check_notable(
            "Never edit migrations/0036_fx.sql; add a new one.",
            &[("rule", "Never edit migrations/0036_fx.sql; add a new one.")],
        );
    }

    #[test]
    fn error_digests_keep_locations_not_source_snippets() {
        // Two rustc errors: each header with its location; the quoted source lines and
        // their markers are left out, so both fit where one fitted with its snippet.
        let build = "error[E0308]: mismatched types\n  --> src/x.rs:41:9\n   |\n\
            41 |     let n: u32 = row.get(\"n\")?;\n   |                  ^^^^^^^^^^^^ expected `u32`, found `i64`\n\n\
            error[E0425]: cannot find value `rate` in this scope\n  --> src/fx.rs:7:13\n   |\n\
            7  |     let r = rate * 2;\n   |             ^^^^ not found in this scope\n";
        check_digest(
            build,
            300,
            &[
                "error[E0308]: mismatched types",
                "--> src/x.rs:41:9",
                "error[E0425]: cannot find value `rate` in this scope",
                "--> src/fx.rs:7:13",
            ],
        );
        // A failing test: where it panicked, the message after the header's colon, the
        // values.
        check_digest(
            "thread 'fx::tests::rounds' panicked at src/fx.rs:120:9:\ncalled `Option::unwrap()` on a `None` value\n",
            300,
            &[
                "thread 'fx::tests::rounds' panicked at src/fx.rs:120:9:",
                "called `Option::unwrap()` on a `None` value",
            ],
        );
        // Search hits whose source lines hold failure words and rules are the paths found,
        // each file once.
        check_digest(
            "src/db/load.rs:41:        return Err(\"failed to load row\".into());\n\
             src/db/load.rs:88:    panic!(\"corrupt page\");\n\
             crates/api/src/rate.rs:7:    // the rate must never be negative\n\
             tests/load.rs:12:fn load_fails() {",
            300,
            &[
                "src/db/load.rs:41",
                "crates/api/src/rate.rs:7",
                "tests/load.rs:12",
            ],
        );
    }

    #[test]
    fn a_masked_placeholder_keeps_the_block_id_and_never_outgrows_the_output() {
        let block = BlockId::new();
        let result = |content: &str| {
            Message::tool_result(ToolResult {
                call_id: "c".into(),
                name: "shell".into(),
                content: content.into(),
                is_error: true,
            })
        };
        let content = |m: &Message| {
            let MessagePart::ToolResult(r) = &m.parts[0] else {
                panic!("{m:?}")
            };
            r.content.clone()
        };
        let log = format!(
            "{}error[E0308]: mismatched types\n  --> src/x.rs:41:9\n{}",
            "   Compiling serde v1.0.1\n".repeat(40),
            "   Compiling tokio\n".repeat(40)
        );
        let with = content(&masked(&result(&log), 500, block, 300));
        assert!(with.starts_with(MASKED) && with.contains(&block.to_string()));
        assert!(
            with.ends_with("lines:]\nerror[E0308]: mismatched types\n--> src/x.rs:41:9"),
            "{with}"
        );
        let bare = content(&masked(&result(&log), 500, block, 0));
        assert_eq!(
            bare,
            format!(
                "[masked: the output of shell (500 tokens) was archived as block {block}; call recall with this block_id to see it]"
            )
        );
        // A short output gets no more digest than fits in three fifths of it.
        for repeat in [1, 2, 3, 4, 6, 10] {
            let short = "error: x failed at src/a.rs:1\n".repeat(repeat);
            let placeholder = content(&masked(&result(&short), 9, block, 300));
            assert!(
                placeholder.len() <= bare.len().max(short.len() * 3 / 5),
                "{repeat}: {placeholder}"
            );
        }
    }

    #[test]
    fn previews_keep_both_ends() {
        let content = format!("BEGIN{}END", "x".repeat(10_000));
        let block = BlockId::new();
        let text = preview(&content, 300, block, 300);
        assert!(
            text.contains("BEGIN") && text.ends_with("END") && text.contains(&block.to_string())
        );
        assert!(text.len() < 600);
        assert_eq!(text, preview(&content, 300, block, 0), "nothing notable");
        // The middle's error, left out of head and tail, is kept in the digest.
        let log = format!(
            "{}error[E0382]: borrow of moved value: `row`\n  --> src/ledger.rs:88:9\n{}",
            "   Compiling serde\n".repeat(200),
            "   Compiling tokio\n".repeat(200)
        );
        let text = preview(&log, 300, block, 300);
        assert!(
            text.contains("left out:]\nerror[E0382]: borrow of moved value: `row`\n--> src/ledger.rs:88:9\n[...]\n"),
            "{text}"
        );
        assert!(!preview(&log, 300, block, 0).contains("E0382"));
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
