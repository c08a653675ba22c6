//! Carrying out compaction at turn boundaries: archive the originals, replace them in the
//! conversation, keep the token counts in step, update the context indicator and record a
//! `compaction` event. Also the two context tools, `recall` and `compress_context`.

use std::hash::{BuildHasher, Hash, Hasher};

use nerve_core::event::{CallPurpose, Compaction, CompactionStrategy, CompactionTrigger};
use nerve_core::text::clip;
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, Event, ExecutionId, Message, MessagePart, MessageRole,
    TerminationReason, ToolResult,
};
use tracing::Instrument;

use crate::config::EngineConfig;
use crate::context::compaction_plan::{
    self, ARCHIVED, Budget, MASKED, SUMMARY_PROMPT, at_or_above, extractive_summary, head_end,
    is_summary, kept_form, masked, plan_mask, plan_summary, preview, summary_message,
};
use crate::context::relevance;
use crate::context::window::{ContentKey, Window};
use crate::run::builtin_tools::BuiltinTool;
use crate::run::journal::Journal;
use crate::run::model_caller::{CallError, ModelCaller};
use crate::stop::Stop;
use crate::telemetry;

mod context_tools;

pub(crate) use context_tools::{
    block_text, context_tool, context_tool_definitions, run_context_tool,
};

/// The longest extractive summary, in characters.
const SUMMARY_MAX_CHARS: usize = 12_000;
/// The share of the window (percent) an extractive summary may take, at about three
/// characters a token. A fixed size would take half of a small window, so that the next
/// turns cross the hard threshold again at once.
const SUMMARY_WINDOW_PERCENT: u64 = 15;

/// Soft masking runs only when it frees at least this share of the window (percent).
/// Once the fill sits between the soft and the hard threshold, every turn pushes one more
/// tool result out of the recent window; masking each alone would rewrite the prompt, and
/// the indicator at its start, at every turn, so a provider's prompt cache would miss the
/// whole prompt for a few hundred tokens saved. Batched, most turns stay ordinary (the
/// retention benchmark in `docs/benchmarks.md` measures the prompt reuse). After an
/// overflow everything is masked regardless.
const MASK_MIN_PERCENT: u64 = 10;

/// The longest extractive summary for a window of `capacity` tokens.
fn summary_max_chars(capacity: Option<u64>) -> usize {
    capacity.map_or(SUMMARY_MAX_CHARS, |capacity| {
        usize::try_from(capacity.saturating_mul(SUMMARY_WINDOW_PERCENT) / 100 * 3)
            .unwrap_or(usize::MAX)
            .clamp(1_000, SUMMARY_MAX_CHARS)
    })
}

/// Compaction carried out on the window: the parts it touches, borrowed for one operation.
pub(crate) struct Compactor<'a> {
    pub(crate) execution: ExecutionId,
    pub(crate) config: &'a EngineConfig,
    pub(crate) window: &'a mut Window,
    pub(crate) journal: &'a mut Journal,
    /// For the summary call.
    pub(crate) caller: &'a mut ModelCaller,
    pub(crate) archive: &'a dyn ContextArchive,
}

/// What identifies a message's content in the archive: a tool output by its tool and text
/// (the same output of another call is the same content), any other message by everything
/// in it that reaches the prompt.
fn content_key(message: &Message) -> ContentKey {
    if let [MessagePart::ToolResult(result)] = message.parts.as_slice() {
        let mut hasher =
            foldhash::quality::FixedState::with_seed(0x0061_7263_6869_7665).build_hasher();
        result.name.hash(&mut hasher);
        result.content.hash(&mut hasher);
        result.is_error.hash(&mut hasher);
        return (hasher.finish(), result.content.len());
    }
    let len = message
        .parts
        .iter()
        .map(|p| match p {
            MessagePart::Text { text }
            | MessagePart::Thinking { text, .. }
            | MessagePart::CompactionSummary { text, .. } => text.len(),
            MessagePart::ToolCall(call) => call.name.len(),
            MessagePart::ToolResult(result) => result.content.len(),
        })
        .sum();
    (crate::provider::tokens::message_key(message), len)
}

/// The block a placeholder (masked output or offload preview) names.
fn placeholder_block(message: &Message) -> Option<BlockId> {
    message.parts.iter().find_map(|part| match part {
        MessagePart::ToolResult(result)
            if result.content.starts_with(MASKED) || result.content.starts_with(ARCHIVED) =>
        {
            let first = result.content.lines().next()?;
            let (_, rest) = first.split_once("as block ")?;
            let id = rest.split([';', ']', ' ']).next()?;
            id.parse().ok()
        }
        MessagePart::ToolResult(_)
        | MessagePart::Text { .. }
        | MessagePart::ToolCall(_)
        | MessagePart::Thinking { .. }
        | MessagePart::CompactionSummary { .. } => None,
    })
}

/// Whether `message` is the result of a `recall`: what it shows is archived already, so
/// masking it archives nothing.
fn is_recall_result(message: &Message) -> bool {
    message.parts.iter().any(|part| {
        matches!(part, MessagePart::ToolResult(result) if result.name == BuiltinTool::Recall.name())
    })
}

/// The placeholder of a masked `recall` result: its first line (which block, which
/// characters, or the search), and the advice to recall again.
fn recalled(message: &Message, tokens: u64) -> Message {
    compaction_plan::with_results(message, |result| {
        let first = clip(result.content.lines().next().unwrap_or_default(), 200);
        format!(
            "{MASKED}a recall result ({tokens} tokens), archived already: {first}; call recall again to see it]"
        )
    })
}

/// What one archived message is, in a line.
fn message_note(message: &Message, turn: u32, verb: &str) -> String {
    if is_summary(message) {
        return format!("summary, folded into a new one at turn {turn}");
    }
    match message.parts.iter().find_map(|p| match p {
        MessagePart::ToolResult(result) => Some(result.name.as_str()),
        MessagePart::Text { .. }
        | MessagePart::ToolCall(_)
        | MessagePart::Thinking { .. }
        | MessagePart::CompactionSummary { .. } => None,
    }) {
        Some(name) => format!("output of {name} {verb} at turn {turn}"),
        None => format!(
            "{} message {verb} at turn {turn}",
            compaction_plan::role(message.role)
        ),
    }
}

/// A planned placeholder: the index it replaces, itself, its tokens, and the block to
/// archive the original as (none when it is archived already).
type Placeholder = (usize, Message, u64, Option<(ContentKey, BlockId)>);

/// How much a mask must take out.
#[derive(Debug, Clone, Copy)]
enum Need {
    /// All that may be masked, if that frees at least this many tokens.
    AtLeast(u64),
    /// The oldest outputs, until the fill is at most this many tokens (all of them if it
    /// never is).
    FillAtMost(u64),
}

/// How a summarising compaction runs.
#[derive(Debug, Clone)]
struct Summarise {
    trigger: CompactionTrigger,
    /// Archive with this note instead of calling for a summary.
    archive_note: Option<String>,
    preserve_markers: bool,
    /// Asked for, or needed to fit: the recent turns, not a share of the window.
    forced: bool,
    /// Recent turns kept, instead of the configured number.
    recent_turns: Option<usize>,
}

/// The content of every folded result but the first ([`Compactor::fold_last_results`]):
/// a placeholder (never masked again) that points to the first.
const FOLDED_REST: &str = "[masked: folded into the first result above]";

/// Characters of the call names a fold's placeholder lists at most.
const FOLD_NAMES_CHARS: usize = 120;

/// The tools `results` came from, each once with how many times when more than one:
/// `shell ×3, recall`.
fn call_names(results: &[&ToolResult]) -> String {
    let mut names: Vec<(&str, usize)> = Vec::new();
    for result in results {
        // Ends: one pass per result.
        match names.iter_mut().find(|(name, _)| *name == result.name) {
            Some((_, n)) => *n += 1,
            None => names.push((&result.name, 1)),
        }
    }
    names
        .iter()
        .map(|(name, n)| {
            if *n > 1 {
                format!("{name} ×{n}")
            } else {
                (*name).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Messages of this many tokens or fewer are never clipped to make room.
pub(crate) const CLIP_FLOOR_TOKENS: u64 = 48;

/// How many times one message is clipped again, each time shorter, when its first clip
/// still counts over what it may keep (text denser in tokens than its own average).
const CLIP_TRIES: u32 = 4;

impl Compactor<'_> {
    fn budget(&self) -> Budget {
        self.config.compaction.budget(self.window.capacity())
    }

    /// Archives `message` as a block of its own, unless the same content is archived
    /// already: then its block is the answer.
    async fn archive_message(&mut self, message: Message, note: String) -> Result<BlockId, Stop> {
        let key = content_key(&message);
        if let Some(id) = self.window.compaction.archived_content.get(&key) {
            return Ok(*id);
        }
        let id = BlockId::new();
        self.archive
            .archive(
                self.execution,
                ArchivedBlock {
                    id,
                    messages: vec![message],
                    note,
                },
            )
            .await?;
        self.window.compaction.archived_blocks += 1;
        self.window.compaction.archived_content.insert(key, id);
        Ok(id)
    }

    /// Archives `blocks` (each with the key of the content it holds) in one write and
    /// records their content, so that it is never archived again.
    async fn archive_blocks(
        &mut self,
        blocks: Vec<(ContentKey, ArchivedBlock)>,
    ) -> Result<(), Stop> {
        if blocks.is_empty() {
            return Ok(());
        }
        let keys: Vec<(ContentKey, BlockId)> = blocks.iter().map(|(key, b)| (*key, b.id)).collect();
        self.archive
            .archive_many(self.execution, blocks.into_iter().map(|(_, b)| b).collect())
            .await?;
        self.window.compaction.archived_blocks += keys.len();
        self.window.compaction.archived_content.extend(keys);
        Ok(())
    }

    /// Archives an oversized tool output of turn `turn` and returns the preview to keep
    /// instead. Oversized is over [`Budget::output_tokens`], which scales with the window.
    pub(crate) async fn offload(
        &mut self,
        turn: u32,
        result: &ToolResult,
    ) -> Result<Option<(String, BlockId)>, Stop> {
        let budget = self.budget();
        if !self.config.compaction.enabled
            || self.window.counter().count_text(&result.content) <= budget.output_tokens
        {
            return Ok(None);
        }
        let id = self
            .archive_message(
                Message::tool_result(result.clone()),
                format!("output of {} at turn {turn}", result.name),
            )
            .await?;
        Ok(Some((
            preview(
                &result.content,
                budget.preview_chars,
                id,
                budget.digest_chars,
            ),
            id,
        )))
    }

    /// Records the offload of the message just appended at `index`; `turns` is the count
    /// of completed turns.
    pub(crate) fn record_offload(
        &mut self,
        turns: u32,
        index: usize,
        tokens_before: u64,
        block: BlockId,
    ) {
        let replacement = vec![self.window.messages()[index].clone()];
        self.window.compaction.count += 1;
        let compaction = Compaction {
            turn: turns,
            strategy: CompactionStrategy::Offload,
            trigger: CompactionTrigger::OutputSize,
            from_index: to_u32(index),
            to_index: to_u32(index + 1),
            replacement,
            archived: vec![block],
            tokens_before,
            tokens_after: self.window.fill(),
            summary: None,
            extractive: false,
        };
        telemetry::record_compaction(&compaction);
        self.journal.record(Event::Compaction(compaction));
    }

    /// The layers at a turn boundary: a requested compaction, then the hard threshold
    /// (summarise), then the soft one (mask); and whatever they did, the next request is
    /// made to fit the window ([`Self::fit`]). The fill is weighed against the thresholds
    /// and the window as the server counts it ([`Self::scale`]).
    pub(crate) async fn maybe_compact(&mut self, turn: u32) -> Result<(), Stop> {
        let config = self.config.compaction;
        if !config.enabled {
            return Ok(());
        }
        if let Some(request) = self.window.compaction.requested.take() {
            let trigger = CompactionTrigger::Agent;
            let span = telemetry::compaction_span(self.execution, turn, trigger);
            self.summarise(
                turn,
                Summarise {
                    trigger,
                    archive_note: request.archive_only.then_some(request.reason),
                    preserve_markers: request.preserve_markers,
                    forced: true,
                    recent_turns: None,
                },
            )
            .instrument(span)
            .await?;
        } else if let Some(capacity) = self.window.capacity()
            && turn >= self.window.compaction.cooldown_until
        {
            let fill = self.window.fill();
            let counted = scaled(fill, self.scale());
            let used = self.caller.budget_used_percent();
            if at_or_above(counted, capacity, config.hard_threshold(used))
                && self
                    .window
                    .compaction
                    .exhausted_at
                    .is_none_or(|at| fill > at + at / 10)
            {
                let trigger = CompactionTrigger::HardThreshold;
                let span = telemetry::compaction_span(self.execution, turn, trigger);
                self.summarise(
                    turn,
                    Summarise {
                        trigger,
                        archive_note: None,
                        preserve_markers: true,
                        forced: false,
                        recent_turns: None,
                    },
                )
                .instrument(span)
                .await?;
            } else if at_or_above(counted, capacity, config.soft_percent) {
                let trigger = CompactionTrigger::SoftThreshold;
                let span = telemetry::compaction_span(self.execution, turn, trigger);
                let recent = config.recent_turns(used);
                self.mask(
                    turn,
                    trigger,
                    recent,
                    Need::AtLeast(capacity * MASK_MIN_PERCENT / 100),
                )
                .instrument(span)
                .await?;
            }
        }
        self.recall_relevant(turn).await?;
        self.fit_request(turn).await
    }

    /// Makes the next request fit the prompt budget as the server counts it
    /// ([`Self::fit`]): before every agent turn (through [`Self::maybe_compact`]) and every
    /// plan call, which follows a turn's answer and the loop's instruction without a turn
    /// boundary of its own.
    pub(crate) async fn fit_request(&mut self, turn: u32) -> Result<(), Stop> {
        let target = unscaled(self.budget().prompt, self.scale());
        self.fit(turn, target, CompactionTrigger::HardThreshold)
            .await
    }

    /// How the server counts a prompt against this engine's count, in thousandths, by
    /// what it last said ([`crate::Provider::prompt_scale_permille`]).
    fn scale(&self) -> u64 {
        self.caller.provider().prompt_scale_permille().max(1000)
    }

    /// Relevance-driven recall (`relevance.rs`): when what the agent or the user said since
    /// the last turn names something the context no longer shows, the archived lines that
    /// mention it are appended as a note (recorded like every message), within
    /// [`Budget::recall_chars`]; the fit pass after it keeps the request inside the window.
    /// Runs after this boundary's compaction, so that an output masked just now can come
    /// back too; deterministic for a given archive.
    async fn recall_relevant(&mut self, turn: u32) -> Result<(), Stop> {
        let max_chars = self.budget().recall_chars;
        // With nothing archived no search can find a line: the words are not picked, which
        // reads the whole context (a cost that would grow with every turn of a long run
        // that never compacts).
        if max_chars == 0 || self.window.compaction.archive_is_empty() {
            return Ok(());
        }
        let messages = self.window.messages();
        let start = relevance::new_messages(messages);
        if start >= messages.len() {
            return Ok(());
        }
        let (said, rest) = relevance::said(messages, start);
        if said.trim().is_empty() {
            return Ok(());
        }
        let terms = relevance::salient_terms(&said, relevance::context_chunks(rest));
        if terms.is_empty() {
            return Ok(());
        }
        let mut blocks: Vec<relevance::Found> = Vec::new();
        let mut kept: Vec<String> = Vec::new();
        for term in terms {
            let hits = self
                .archive
                .search(self.execution, &term, relevance::MAX_BLOCKS)
                .await?;
            if hits.is_empty() || hits.len() >= relevance::MAX_BLOCKS {
                continue;
            }
            kept.push(term);
            for hit in hits {
                if blocks.iter().any(|b| b.id == hit.id) {
                    continue;
                }
                if let Some(block) = self.archive.fetch(self.execution, hit.id).await? {
                    blocks.push(relevance::Found {
                        id: hit.id,
                        note: block.note.clone(),
                        text: block_text(&block),
                    });
                }
            }
        }
        let context = relevance::context_chunks(self.window.messages());
        let Some(note) = relevance::relevance_note(&kept, &blocks, context, max_chars) else {
            return Ok(());
        };
        tracing::debug!(turn, terms = ?kept, chars = note.len(), "archived lines recalled");
        self.window.push(self.journal, Message::user(note));
        Ok(())
    }

    /// Compacts after a `context_overflow` whatever the thresholds say: the provider
    /// counts more than this engine does, so the context is made to fit three quarters of
    /// the prompt budget, and three quarters of what it held. When the refusal states the
    /// server's count of the prompt (`stated`), the budget is taken by that count: the
    /// target shrinks by how much more the server counted than the estimate did; without
    /// one, by the server's last report. `false` when nothing could be taken out.
    pub(crate) async fn compact_for_overflow(
        &mut self,
        turn: u32,
        stated: Option<u64>,
    ) -> Result<bool, Stop> {
        let before = self.window.fill();
        let trigger = CompactionTrigger::Overflow;
        let recent = self
            .config
            .compaction
            .recent_turns(self.caller.budget_used_percent());
        let span = telemetry::compaction_span(self.execution, turn, trigger);
        self.mask(turn, trigger, recent, Need::AtLeast(0))
            .instrument(span)
            .await?;
        let span = telemetry::compaction_span(self.execution, turn, trigger);
        self.summarise(
            turn,
            Summarise {
                trigger,
                archive_note: None,
                preserve_markers: true,
                forced: true,
                recent_turns: None,
            },
        )
        .instrument(span)
        .await?;
        // Without a count in the refusal, the server's last report is the best guess.
        let stated = stated.or_else(|| Some(scaled(before, self.scale())));
        let target = overflow_target(self.budget().prompt, before, stated);
        self.fit(turn, target, trigger).await?;
        Ok(self.window.fill() < before)
    }

    /// Makes the next request fit: while the fill is over `target` (the prompt budget:
    /// the window less the reply's reserve), the recent turns lose their protection step
    /// by step: their outputs are masked (oldest first, each with its digest and block
    /// id), then everything but the last turn is summarised, then the largest messages
    /// are clipped (their originals archived), and last the last turn's tool results are
    /// folded into one placeholder ([`Self::fold_last_results`]). Should the prompt still
    /// be over the window as the server counts it (the system prompt, the tool
    /// definitions, the task and what is left of the last turn do not fit a small
    /// window), the run ends with an `error` here, before the request is sent
    /// ([`Self::check_fits`]).
    async fn fit(
        &mut self,
        turn: u32,
        target: u64,
        trigger: CompactionTrigger,
    ) -> Result<(), Stop> {
        if !self.config.compaction.enabled
            || self.window.capacity().is_none()
            || self.window.fill() <= target
        {
            return Ok(());
        }
        let span = telemetry::compaction_span(self.execution, turn, trigger);
        async {
            self.mask(turn, trigger, 0, Need::FillAtMost(target))
                .await?;
            if self.window.fill() > target {
                self.summarise(
                    turn,
                    Summarise {
                        trigger,
                        archive_note: None,
                        preserve_markers: false,
                        forced: true,
                        recent_turns: Some(1),
                    },
                )
                .await?;
            }
            if self.window.fill() > target {
                self.clip(turn, target, trigger).await?;
            }
            if self.window.fill() > target {
                self.fold_last_results(turn, trigger).await?;
            }
            Ok::<(), Stop>(())
        }
        .instrument(span)
        .await?;
        self.check_fits()
    }

    /// Ends the run when the next request is over the window as the server counts it,
    /// after every compaction: it would be refused, and nothing is left to take out. (A
    /// request over the prompt budget but inside the window goes out with a smaller output
    /// limit; a server that counts the limit too refuses it, and the overflow path ends
    /// the run when compaction cannot make room.)
    fn check_fits(&self) -> Result<(), Stop> {
        let Some(capacity) = self.window.capacity() else {
            return Ok(());
        };
        let limit = unscaled(capacity, self.scale());
        let fill = self.window.fill();
        if fill <= limit {
            return Ok(());
        }
        Err(Stop::new(
            TerminationReason::Error,
            format!(
                "the context does not fit the window: after every compaction the next request \
                 holds {fill} tokens (the system prompt, {} tokens of tool definitions, the task \
                 and the last turn), over the window of {capacity}{}; use a model with a larger \
                 window or fewer tools",
                self.window.tool_tokens(),
                if limit < capacity {
                    format!(" ({limit} by this engine's count, as the server counts more)")
                } else {
                    String::new()
                }
            ),
        ))
    }

    /// The last resort of [`Self::fit`]: the tool results of the last turn, each at its
    /// floor already (a masked output keeps the line that names its block, about 50
    /// tokens), are folded into one message. Its first result names the calls and the
    /// block that holds the results as they stood (the placeholders among them name the
    /// blocks of their outputs); the other results only point to it, since every call
    /// must keep a result for the APIs to accept the conversation. Nothing happens when
    /// the last assistant message made no calls, or the fold would not be smaller.
    async fn fold_last_results(
        &mut self,
        turn: u32,
        trigger: CompactionTrigger,
    ) -> Result<(), Stop> {
        let messages = self.window.messages();
        let Some(asked) = messages
            .iter()
            .rposition(|m| m.role == MessageRole::Assistant)
            .filter(|&i| messages[i].tool_calls().next().is_some())
        else {
            return Ok(());
        };
        let from = asked + 1;
        let to = from
            + messages[from..]
                .iter()
                .take_while(|m| m.role == MessageRole::Tool)
                .count();
        let results: Vec<&ToolResult> = messages[from..to]
            .iter()
            .flat_map(|m| &m.parts)
            .filter_map(|part| match part {
                MessagePart::ToolResult(result) => Some(result),
                MessagePart::Text { .. }
                | MessagePart::ToolCall(_)
                | MessagePart::Thinking { .. }
                | MessagePart::CompactionSummary { .. } => None,
            })
            .collect();
        if results.is_empty() {
            return Ok(());
        }
        let id = BlockId::new();
        let names = call_names(&results);
        let names = clip(&names, FOLD_NAMES_CHARS);
        let count = results.len();
        let parts = results
            .iter()
            .enumerate()
            .map(|(i, result)| {
                MessagePart::ToolResult(ToolResult {
                    call_id: result.call_id.clone(),
                    name: result.name.clone(),
                    content: if i == 0 {
                        format!(
                            "{MASKED}the outputs of the last {count} calls ({names}) were dropped \
                             for room and archived as block {id}; call recall with this block_id \
                             to see them]"
                        )
                    } else {
                        FOLDED_REST.to_owned()
                    },
                    is_error: result.is_error,
                })
            })
            .collect();
        let folded = Message {
            role: MessageRole::Tool,
            parts,
            pinned: false,
        };
        let tokens = self.window.counter().count_message(&folded);
        if tokens >= self.window.counts()[from..to].iter().sum::<u64>() {
            return Ok(());
        }
        let mut archived = vec![id];
        archived.extend(messages[from..to].iter().filter_map(placeholder_block));
        let before = self.window.fill();
        let originals = self
            .window
            .splice(from..to, vec![folded.clone()], vec![tokens]);
        // Should the archive fail, the run stops; the log has no `compaction` event for
        // the fold and still holds the originals (as for a mask).
        self.archive
            .archive(
                self.execution,
                ArchivedBlock {
                    id,
                    messages: originals,
                    note: format!("the {count} tool results of turn {turn}, folded for room"),
                },
            )
            .await?;
        self.window.compaction.archived_blocks += 1;
        self.finish_compaction(
            turn,
            CompactionStrategy::Mask,
            trigger,
            from,
            to,
            vec![folded],
            archived,
            before,
            None,
            false,
        )
        .await
    }

    /// Masks the tool results before the last `recent` turns (all of them with 0): one
    /// archive block per output, so that a placeholder's block id names exactly what it
    /// replaced; outputs archived before (the same content) keep their block, and a
    /// `recall` result, archived already, is not archived again. The plan step's protected
    /// messages are masked only when the fill must come down to a target.
    async fn mask(
        &mut self,
        turn: u32,
        trigger: CompactionTrigger,
        recent: usize,
        need: Need,
    ) -> Result<(), Stop> {
        let mut indices = plan_mask(self.window.messages(), self.window.counts(), recent);
        if let (Some(protected), Need::AtLeast(_)) = (self.window.protect_from, need) {
            indices.retain(|&i| i < protected);
        }
        let digest_chars = self.budget().digest_chars;
        // (index, placeholder, its tokens, the block to archive the original as).
        let mut placeholders: Vec<Placeholder> = Vec::new();
        let mut pending: std::collections::HashMap<ContentKey, BlockId> =
            std::collections::HashMap::new();
        let mut savings = 0;
        let fill = self.window.fill();
        // Ids for the blocks this mask may make, drawn together (see `BlockId::batch`).
        let mut ids = BlockId::batch(indices.len()).into_iter();
        for i in indices {
            if let Need::FillAtMost(target) = need
                && fill - savings <= target
            {
                break;
            }
            let message = &self.window.messages()[i];
            let tokens = self.window.counts()[i];
            let (placeholder, archive) = if is_recall_result(message) {
                (recalled(message, tokens), None)
            } else if relevance::is_note(message) {
                (relevance::stub(message), None)
            } else {
                let key = content_key(message);
                match self
                    .window
                    .compaction
                    .archived_content
                    .get(&key)
                    .or_else(|| pending.get(&key))
                {
                    Some(id) => (masked(message, tokens, *id, digest_chars), None),
                    None => {
                        let id = ids.next().unwrap_or_default();
                        (masked(message, tokens, id, digest_chars), Some((key, id)))
                    }
                }
            };
            let placeholder_tokens = self.window.counter().count_message(&placeholder);
            // Only where the placeholder is clearly smaller than the output it replaces.
            if tokens <= placeholder_tokens + placeholder_tokens / 2 {
                continue;
            }
            if let Some((key, id)) = archive {
                pending.insert(key, id);
            }
            savings += tokens - placeholder_tokens;
            placeholders.push((i, placeholder, placeholder_tokens, archive));
        }
        if let Need::AtLeast(min) = need
            && savings < min
        {
            return Ok(());
        }
        let (Some(first), Some(last)) = (
            placeholders.first().map(|p| p.0),
            placeholders.last().map(|p| p.0),
        ) else {
            return Ok(());
        };
        let before = self.window.fill();
        let mut archived = Vec::new();
        let mut blocks = Vec::new();
        // Each original is moved out of the window into its block, not copied, and the
        // blocks are archived in one write. Should the archive fail, the run stops and the
        // log, which has no `compaction` event for this mask, still holds the originals: a
        // resume starts from them.
        for (i, placeholder, tokens, archive) in placeholders {
            if let Some((key, id)) = archive {
                let original = self.window.replace(i, placeholder, tokens);
                let note = message_note(&original, turn, "masked");
                blocks.push((
                    key,
                    ArchivedBlock {
                        id,
                        messages: vec![original],
                        note,
                    },
                ));
                archived.push(id);
            } else {
                let named = placeholder_block(&placeholder);
                self.window.replace(i, placeholder, tokens);
                archived.extend(named);
            }
        }
        self.archive_blocks(blocks).await?;
        self.finish_in_place(
            turn,
            CompactionStrategy::Mask,
            trigger,
            first..=last,
            archived,
            before,
        )
        .await
    }

    /// Clips the largest messages (after the leading system prompt; the pinned task last)
    /// until the fill is at most `target`: each keeps its head and the id of the block
    /// that holds it whole.
    async fn clip(
        &mut self,
        turn: u32,
        target: u64,
        trigger: CompactionTrigger,
    ) -> Result<(), Stop> {
        let before = self.window.fill();
        let head = head_end(self.window.messages()).max(1);
        let mut done: Vec<usize> = Vec::new();
        let mut archived = Vec::new();
        // Ends: every pass marks one more message `done` (never picked again) or breaks
        // when none is left: at most one pass per message (each message's clip retries are
        // bounded in `clip_to`).
        while self.window.fill() > target {
            let excess = self.window.fill() - target;
            let candidate = (head..self.window.messages().len())
                .filter(|i| !done.contains(i) && self.window.counts()[*i] > CLIP_FLOOR_TOKENS)
                .max_by_key(|&i| (!self.window.messages()[i].pinned, self.window.counts()[i]));
            let Some(i) = candidate else {
                break;
            };
            done.push(i);
            let message = self.window.messages()[i].clone();
            let tokens = self.window.counts()[i];
            let keep_tokens = tokens.saturating_sub(excess).max(CLIP_FLOOR_TOKENS / 2);
            let keep_chars = usize::try_from(keep_tokens * 2).unwrap_or(usize::MAX);
            let id = match placeholder_block(&message) {
                Some(id) => id,
                None if is_recall_result(&message) => {
                    let placeholder = recalled(&message, tokens);
                    let count = self.window.counter().count_message(&placeholder);
                    if count < tokens {
                        self.window.replace(i, placeholder, count);
                    }
                    continue;
                }
                None => {
                    let note = message_note(&message, turn, "clipped");
                    self.archive_message(message.clone(), note).await?
                }
            };
            archived.push(id);
            let (clipped, count) = self.clip_to(&message, keep_chars, keep_tokens, id);
            if count < tokens {
                self.window.replace(i, clipped, count);
            }
        }
        let (Some(&first), Some(&last)) = (done.iter().min(), done.iter().max()) else {
            return Ok(());
        };
        self.finish_in_place(
            turn,
            CompactionStrategy::Offload,
            trigger,
            first..=last,
            archived,
            before,
        )
        .await
    }

    /// `message` clipped (naming block `id`) to about `keep_chars` characters, and again
    /// shorter while it counts over `keep_tokens`: text denser in tokens than two
    /// characters a token (numbers, ids, short words) needs a shorter clip. Returns the
    /// clip that counts least, with its count.
    fn clip_to(
        &self,
        message: &Message,
        mut keep_chars: usize,
        keep_tokens: u64,
        id: BlockId,
    ) -> (Message, u64) {
        let counter = self.window.counter();
        let mut best = clipped(message, keep_chars, id);
        let mut best_count = counter.count_message(&best);
        // Ends: at most CLIP_TRIES passes, and each keeps fewer characters than the last
        // (or stops).
        for _ in 0..CLIP_TRIES {
            if best_count <= keep_tokens || keep_chars == 0 {
                break;
            }
            let scaled = u128::from(keep_tokens) * keep_chars as u128 / u128::from(best_count);
            keep_chars = usize::try_from(scaled)
                .unwrap_or(usize::MAX)
                .min(keep_chars - 1);
            let again = clipped(message, keep_chars, id);
            let count = counter.count_message(&again);
            if count >= best_count {
                break;
            }
            (best, best_count) = (again, count);
        }
        (best, best_count)
    }

    /// Records a compaction that replaced messages where they stand (`range`, inclusive).
    async fn finish_in_place(
        &mut self,
        turn: u32,
        strategy: CompactionStrategy,
        trigger: CompactionTrigger,
        range: std::ops::RangeInclusive<usize>,
        archived: Vec<BlockId>,
        before: u64,
    ) -> Result<(), Stop> {
        let (first, last) = (*range.start(), *range.end());
        let replacement = self.window.messages()[range].to_vec();
        self.finish_compaction(
            turn,
            strategy,
            trigger,
            first,
            last + 1,
            replacement,
            archived,
            before,
            None,
            false,
        )
        .await
    }

    /// Replaces the middle of the conversation by a summary (or, with `archive_note`, by a
    /// short note without a summary call). Each summarised message is archived as a block
    /// of its own (an output masked before keeps the block it has).
    async fn summarise(&mut self, turn: u32, how: Summarise) -> Result<(), Stop> {
        let config = self.config.compaction;
        let capacity = self.window.capacity().unwrap_or(0).max(1);
        let used = self.caller.budget_used_percent();
        let complexity = if how.preserve_markers {
            self.config.complexity
        } else {
            Some(nerve_core::Complexity::Simple)
        };
        let policy = compaction_plan::SummaryPolicy {
            recent_turns: how
                .recent_turns
                .unwrap_or_else(|| config.recent_turns(used)),
            recent_percent: if self.window.capacity().is_some() && !how.forced {
                config.keep_recent_percent
            } else {
                0
            },
            complexity,
            // Protected only as far as they fit: a summary to fit the window takes them too.
            protect_from: self
                .window
                .protect_from
                .filter(|_| how.recent_turns.is_none()),
            min_messages: config.min_messages,
        };
        let Some(mut plan) = plan_summary(
            self.window.messages(),
            self.window.counts(),
            capacity,
            policy,
        ) else {
            return Ok(());
        };
        if !how.preserve_markers {
            plan.kept.retain(|&i| {
                self.window.messages()[i].pinned
                    || self.window.messages()[i].role == MessageRole::System
            });
            plan.summarised = (plan.from..plan.to)
                .filter(|i| !plan.kept.contains(i))
                .collect();
        }
        let before = self.window.fill();
        let messages = self.window.messages();
        let summarised = || plan.summarised.iter().map(|&i| &messages[i]);
        // Fold an earlier summary into this one rather than nesting it.
        let earlier: Option<String> =
            summarised()
                .flat_map(|m| &m.parts)
                .rev()
                .find_map(|p| match p {
                    MessagePart::CompactionSummary { text, .. } => Some(text.clone()),
                    MessagePart::Text { .. }
                    | MessagePart::ToolCall(_)
                    | MessagePart::ToolResult(_)
                    | MessagePart::Thinking { .. } => None,
                });
        // The block of each summarised message: the one it has (a placeholder's, an earlier
        // summary's, the same content's), or a new one, made once the summary is in so that
        // the original moves from the window into it instead of being copied.
        let mut ids = BlockId::batch(plan.summarised.len()).into_iter();
        let mut pending: std::collections::HashMap<ContentKey, BlockId> =
            std::collections::HashMap::new();
        // (index, content key, block) of each message to archive.
        let mut new_blocks: Vec<(usize, ContentKey, BlockId)> = Vec::new();
        let mut archived: Vec<BlockId> = Vec::new();
        for &i in &plan.summarised {
            let message = &messages[i];
            for part in &message.parts {
                if let MessagePart::CompactionSummary { archived: ids, .. } = part {
                    archived.extend(ids);
                }
            }
            if let Some(id) = placeholder_block(message) {
                archived.push(id);
            } else if !is_recall_result(message) && !relevance::is_note_or_stub(message) {
                let key = content_key(message);
                let known = self.window.compaction.archived_content.get(&key);
                let id = match known.or_else(|| pending.get(&key)) {
                    Some(id) => *id,
                    None => {
                        let id = ids.next().unwrap_or_default();
                        pending.insert(key, id);
                        new_blocks.push((i, key, id));
                        id
                    }
                };
                archived.push(id);
            }
        }
        let mut seen = std::collections::HashSet::new();
        archived.retain(|id| seen.insert(*id));
        let fresh: Vec<usize> = plan
            .summarised
            .iter()
            .copied()
            .filter(|&i| !is_summary(&messages[i]))
            .collect();
        let task = messages
            .iter()
            .find(|m| m.pinned)
            .map(Message::text_content)
            .unwrap_or_default();
        let strategy = if how.archive_note.is_some() {
            CompactionStrategy::Archive
        } else {
            CompactionStrategy::Summarize
        };
        let max_chars = summary_max_chars(self.window.capacity());
        let extractive = |messages: &[Message]| {
            let fresh: Vec<&Message> = fresh.iter().map(|&i| &messages[i]).collect();
            extractive_summary(&task, &fresh, earlier.as_deref(), max_chars)
        };
        let (summary, extractive) = match how.archive_note {
            Some(reason) => (format!("Archived at the agent's request: {reason}"), false),
            // Nothing new since the last summary: no call over zero messages.
            None if fresh.is_empty() => (extractive(messages), true),
            None => {
                let fresh_messages: Vec<&Message> = fresh.iter().map(|&i| &messages[i]).collect();
                let history = compaction_plan::history(&fresh_messages);
                match self.summary_call(turn, earlier.as_deref(), &history).await {
                    Ok(text) => (cut_summary(text, max_chars), false),
                    Err(SummaryFailure::Stop(stop)) => return Err(stop),
                    Err(SummaryFailure::Failed) => (extractive(self.window.messages()), true),
                }
            }
        };
        let messages = self.window.messages();
        let total_blocks = self.window.compaction.archived_blocks + new_blocks.len();
        let mut replacement: Vec<Message> = plan
            .kept
            .iter()
            .filter(|&&i| messages[i].pinned)
            .map(|&i| kept_form(&messages[i]))
            .collect();
        replacement.push(summary_message(
            &summary,
            fresh.len(),
            archived.clone(),
            total_blocks,
        ));
        replacement.extend(
            plan.kept
                .iter()
                .filter(|&&i| !messages[i].pinned)
                .map(|&i| kept_form(&messages[i])),
        );
        let replacement_counts: Vec<u64> = replacement
            .iter()
            .map(|m| self.window.counter().count_message(m))
            .collect();
        let removed: u64 = self.window.counts()[plan.from..plan.to].iter().sum();
        let added: u64 = replacement_counts.iter().sum();
        let block = |key, id, message: Message| {
            let note = message_note(&message, turn, "summarised");
            (
                key,
                ArchivedBlock {
                    id,
                    messages: vec![message],
                    note,
                },
            )
        };
        if added >= removed {
            // Summarising would not shrink the context: never loop on it, never grow. The
            // messages stay; copies of them are archived all the same, as a summary that
            // goes ahead archives them.
            let blocks = new_blocks
                .into_iter()
                .map(|(i, key, id)| block(key, id, messages[i].clone()))
                .collect();
            self.archive_blocks(blocks).await?;
            self.window.compaction.exhausted_at = Some(before);
            self.window.compaction.cooldown_until = turn + self.config.compaction.cooldown_turns;
            return Ok(());
        }
        let mut removed: Vec<Option<Message>> = self
            .window
            .splice(plan.from..plan.to, replacement.clone(), replacement_counts)
            .into_iter()
            .map(Some)
            .collect();
        // Should the archive fail, the run stops; the log has no `compaction` event for
        // this summary and still holds the originals (as for a mask).
        let blocks = new_blocks
            .into_iter()
            .filter_map(|(i, key, id)| {
                let message = removed.get_mut(i - plan.from)?.take()?;
                Some(block(key, id, message))
            })
            .collect();
        drop(removed);
        self.archive_blocks(blocks).await?;
        self.finish_compaction(
            turn,
            strategy,
            how.trigger,
            plan.from,
            plan.to,
            replacement,
            archived,
            before,
            Some(summary),
            extractive,
        )
        .await
    }

    /// The summary call, on a transcript of `earlier` (the last summary) and `history` cut
    /// (oldest history first, then the earlier summary's end) to what the prompt budget
    /// leaves: a summary call never sends an over-window request either.
    async fn summary_call(
        &mut self,
        turn: u32,
        earlier: Option<&str>,
        history: &str,
    ) -> Result<String, SummaryFailure> {
        let system = Message::system(SUMMARY_PROMPT);
        let budget = self.budget().prompt;
        let counter = self.window.counter();
        let room = budget.saturating_sub(counter.count_message(&system) + 64);
        // Two characters a token is about the densest text there is (ids, numbers): below
        // that a transcript fits without being counted.
        let fits = |text: &str| {
            u64::try_from(text.len()).unwrap_or(u64::MAX) / 2 <= room
                || counter.count_text(text) <= room
        };
        let Some(text) = compaction_plan::fitted_transcript(earlier, history, fits) else {
            return Err(SummaryFailure::Failed);
        };
        let request = vec![system, Message::user(text)];
        match self
            .caller
            .call(self.journal, turn, CallPurpose::Summary, &request, &[])
            .await
        {
            Ok(response) => {
                let text = response.message.text_content();
                if text.trim().is_empty() {
                    Err(SummaryFailure::Failed)
                } else {
                    Ok(text)
                }
            }
            // A summary that runs away falls back to the extractive one.
            Err(CallError::Overflow { .. } | CallError::Runaway(_)) => Err(SummaryFailure::Failed),
            Err(CallError::Stop(stop)) => match stop.reason {
                // A failed summary call falls back to the extractive summary; the run's
                // own limits still stop it.
                TerminationReason::Error => Err(SummaryFailure::Failed),
                TerminationReason::Completed
                | TerminationReason::MaxTurns
                | TerminationReason::BudgetExhausted
                | TerminationReason::Shutdown
                | TerminationReason::TimedOut
                | TerminationReason::Stagnation
                | TerminationReason::Parked => Err(SummaryFailure::Stop(stop)),
            },
        }
    }

    #[allow(clippy::too_many_arguments)] // The fields of one event.
    async fn finish_compaction(
        &mut self,
        turn: u32,
        strategy: CompactionStrategy,
        trigger: CompactionTrigger,
        from: usize,
        to: usize,
        replacement: Vec<Message>,
        archived: Vec<BlockId>,
        tokens_before: u64,
        summary: Option<String>,
        extractive: bool,
    ) -> Result<(), Stop> {
        self.window.compaction.count += 1;
        let compaction = Compaction {
            turn,
            strategy,
            trigger,
            from_index: to_u32(from),
            to_index: to_u32(to),
            replacement,
            archived,
            tokens_before,
            tokens_after: self.window.fill(),
            summary,
            extractive,
        };
        telemetry::record_compaction(&compaction);
        self.journal.record(Event::Compaction(compaction));
        self.window.refresh_indicator(self.journal);
        Ok(())
    }
}

/// Whether `message` is a tool result that is a placeholder already.
fn message_is_placeholder(message: &Message) -> bool {
    message.parts.iter().any(|part| {
        matches!(part, MessagePart::ToolResult(result) if result.content.starts_with(MASKED) || result.content.starts_with(ARCHIVED))
    })
}

/// A model's summary cut to `max_chars`, as the extractive one is: a summary is budgeted
/// like any output.
fn cut_summary(mut text: String, max_chars: usize) -> String {
    if text.len() > max_chars {
        let cut = clip(&text, max_chars).len();
        text.truncate(cut);
        text.push_str("\n[... summary cut to fit the window ...]");
    }
    text
}

/// `message` clipped to about `keep_chars` characters in all: texts keep their head,
/// a tool output its placeholder line or its head, large tool-call arguments become a
/// note; every clip names block `id`, which holds the message whole.
/// `tokens` by the engine's count as a server counting `permille` thousandths of it would.
fn scaled(tokens: u64, permille: u64) -> u64 {
    u64::try_from(u128::from(tokens) * u128::from(permille) / 1000).unwrap_or(u64::MAX)
}

/// `tokens` by a server's count (counting `permille` thousandths of the engine's count) as
/// the engine counts them.
fn unscaled(tokens: u64, permille: u64) -> u64 {
    if tokens == u64::MAX {
        return tokens;
    }
    u64::try_from(u128::from(tokens) * 1000 / u128::from(permille.max(1))).unwrap_or(u64::MAX)
}

/// The fill (by the engine's count) an overflow compaction aims at, for a prompt budget
/// of `budget` tokens and a refused prompt that held `before` by the engine's count and
/// `stated` by the server's, when its refusal said. The server's count was over the window
/// where the engine's may still be under it (a tokenizer that splits finer than the
/// estimate assumes): at most three quarters of what the refused prompt held, so that the
/// retry is smaller by any count; and three quarters of the budget, scaled by how much
/// more the server counted, so that the retry fits by the server's count.
fn overflow_target(budget: u64, before: u64, stated: Option<u64>) -> u64 {
    if budget == u64::MAX {
        return before * 3 / 4;
    }
    let budget = budget * 3 / 4;
    let budget = match stated {
        Some(stated) if stated > before => {
            u64::try_from(u128::from(budget) * u128::from(before) / u128::from(stated))
                .unwrap_or(u64::MAX)
        }
        Some(_) | None => budget,
    };
    budget.min(before * 3 / 4)
}

fn clipped(message: &Message, keep_chars: usize, id: BlockId) -> Message {
    let texts = message.parts.len().max(1);
    let each = (keep_chars / texts).max(80);
    let note = format!("[clipped to fit the window: call recall with block_id {id} for all of it]");
    let parts = message
        .parts
        .iter()
        .map(|part| match part {
            MessagePart::Text { text } if text.len() > each => MessagePart::Text {
                text: format!("{}\n{note}", clip(text, each)),
            },
            MessagePart::CompactionSummary { text, archived } if text.len() > each => {
                MessagePart::CompactionSummary {
                    text: format!("{}\n{note}", clip(text, each)),
                    archived: archived.clone(),
                }
            }
            MessagePart::ToolResult(result) if result.content.len() > each => {
                let mut result = result.clone();
                result.content = if message_is_placeholder(message) {
                    clip(
                        result.content.lines().next().unwrap_or_default(),
                        each.max(200),
                    )
                    .to_owned()
                } else {
                    format!("{}\n{note}", clip(&result.content, each))
                };
                MessagePart::ToolResult(result)
            }
            MessagePart::ToolCall(call) if call.arguments.to_string().len() > each => {
                let mut call = call.clone();
                call.arguments = serde_json::json!({ "clipped": note });
                MessagePart::ToolCall(call)
            }
            other @ (MessagePart::Text { .. }
            | MessagePart::CompactionSummary { .. }
            | MessagePart::ToolResult(_)
            | MessagePart::ToolCall(_)
            | MessagePart::Thinking { .. }) => other.clone(),
        })
        .collect();
    Message {
        role: message.role,
        parts,
        pinned: message.pinned,
    }
}

enum SummaryFailure {
    Stop(Stop),
    Failed,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
