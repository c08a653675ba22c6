//! Carrying out compaction at turn boundaries: archive the originals, replace them in the
//! conversation, keep the token counts in step, update the context indicator and record a
//! `compaction` event. Also the two context tools, `recall` and `compress_context`.

use nerve_core::event::{CallPurpose, Compaction, CompactionStrategy, CompactionTrigger};
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, Event, ExecutionId, Message, MessagePart, MessageRole,
    TerminationReason, ToolCall, ToolResult,
};
use tracing::Instrument;

use crate::builtin::{BuiltinTool, CompressArgs, CompressStrategy, RecallArgs};
use crate::caller::{CallError, ModelCaller};
use crate::compaction::{
    self, CompactionStrategyRequest, SUMMARY_PROMPT, at_or_above, extractive_summary, is_summary,
    kept_form, masked, plan_mask, plan_summary, preview, summary_message, transcript,
};
use crate::config::EngineConfig;
use crate::journal::Journal;
use crate::stop::Stop;
use crate::telemetry;
use crate::window::Window;

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

/// The context tools offered to the model: `recall` always, `compress_context` when the
/// agent steers compaction.
pub(crate) fn context_tool_definitions(agent_controlled: bool) -> Vec<nerve_core::ToolDefinition> {
    let mut tools = vec![BuiltinTool::Recall.definition()];
    if agent_controlled {
        tools.push(BuiltinTool::CompressContext.definition());
    }
    tools
}

/// The context tool `call` names, when it is one this execution handles itself rather
/// than the sandbox.
pub(crate) fn context_tool(config: &EngineConfig, call: &ToolCall) -> Option<BuiltinTool> {
    if !config.compaction.enabled {
        return None;
    }
    match BuiltinTool::parse(&call.name)? {
        BuiltinTool::Recall => Some(BuiltinTool::Recall),
        BuiltinTool::CompressContext if config.compaction.agent_controlled => {
            Some(BuiltinTool::CompressContext)
        }
        BuiltinTool::CompressContext | BuiltinTool::SubmitPlan => None,
    }
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

/// Runs the context tool `tool` and returns (content, is_error). `compress_context` only
/// asks: the compaction runs at the turn boundary.
pub(crate) async fn run_context_tool(
    tool: BuiltinTool,
    call: &ToolCall,
    window: &mut Window,
    archive: &dyn ContextArchive,
    execution: ExecutionId,
) -> Result<(String, bool), Stop> {
    match tool {
        BuiltinTool::Recall => {
            let args: RecallArgs = match serde_json::from_value(call.arguments.clone()) {
                Ok(args) => args,
                Err(e) => return Ok((format!("invalid arguments for `recall`: {e}"), true)),
            };
            recall(args, archive, execution).await
        }
        BuiltinTool::CompressContext => {
            let args: CompressArgs = match serde_json::from_value(call.arguments.clone()) {
                Ok(args) => args,
                Err(e) => {
                    return Ok((
                        format!("invalid arguments for `compress_context`: {e}"),
                        true,
                    ));
                }
            };
            window.compaction.requested = Some(CompactionStrategyRequest {
                archive_only: args.strategy == Some(CompressStrategy::Archive),
                reason: args.reason,
                preserve_markers: args.preserve_markers.unwrap_or(true),
            });
            Ok((
                "Compaction scheduled: it runs at the end of this turn.".into(),
                false,
            ))
        }
        BuiltinTool::SubmitPlan => {
            Ok(("submit_plan is only available while planning".into(), true))
        }
    }
}

async fn recall(
    args: RecallArgs,
    archive: &dyn ContextArchive,
    execution: ExecutionId,
) -> Result<(String, bool), Stop> {
    if let Some(id) = args.block_id.as_deref().filter(|s| !s.trim().is_empty()) {
        let Ok(id) = id.parse::<BlockId>() else {
            return Ok((format!("`{id}` is not a block id"), true));
        };
        return Ok(match archive.fetch(execution, id).await? {
            Some(block) => {
                let refs: Vec<&Message> = block.messages.iter().collect();
                let mut text = format!("Block {id} ({}):\n{}", block.note, transcript(&refs, None));
                cap(&mut text, 24_000);
                (text, false)
            }
            None => (format!("no archived block {id} in this execution"), true),
        });
    }
    if let Some(query) = args.query.as_deref().filter(|s| !s.trim().is_empty()) {
        let hits = archive.search(execution, query, 8).await?;
        if hits.is_empty() {
            return Ok((format!("nothing archived matches `{query}`"), false));
        }
        let mut text = String::new();
        for hit in hits {
            text.push_str(&format!(
                "block {} ({}): {}\n",
                hit.id, hit.note, hit.snippet
            ));
        }
        text.push_str("Call recall with a block_id to see a block in full.");
        return Ok((text, false));
    }
    Ok(("recall needs a query or a block_id".into(), true))
}

impl Compactor<'_> {
    /// Archives an oversized tool output of turn `turn` and returns the preview to keep
    /// instead.
    pub(crate) async fn offload(
        &mut self,
        turn: u32,
        result: &ToolResult,
    ) -> Result<Option<(String, BlockId)>, Stop> {
        let config = self.config.compaction;
        if !config.enabled
            || self.window.counter().count_text(&result.content) <= config.offload_tokens
        {
            return Ok(None);
        }
        let id = BlockId::new();
        let block = ArchivedBlock {
            id,
            messages: vec![Message::tool_result(result.clone())],
            note: format!("output of {} at turn {turn}", result.name),
        };
        self.archive.archive(self.execution, block).await?;
        self.window.compaction.archived_blocks += 1;
        Ok(Some((
            preview(
                &result.content,
                config.preview_chars,
                id,
                config.mask_digest_chars,
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
    /// (summarise), then the soft one (mask).
    pub(crate) async fn maybe_compact(&mut self, turn: u32) -> Result<(), Stop> {
        let config = self.config.compaction;
        if !config.enabled {
            return Ok(());
        }
        if let Some(request) = self.window.compaction.requested.take() {
            let trigger = CompactionTrigger::Agent;
            let note = request.archive_only.then_some(request.reason);
            let span = telemetry::compaction_span(self.execution, turn, trigger);
            self.summarise(turn, trigger, note, request.preserve_markers, true)
                .instrument(span)
                .await?;
            return Ok(());
        }
        let Some(capacity) = self.window.capacity() else {
            return Ok(());
        };
        if turn < self.window.compaction.cooldown_until {
            return Ok(());
        }
        let fill = self.window.fill();
        let used = self.caller.budget_used_percent();
        if at_or_above(fill, capacity, config.hard_threshold(used))
            && self
                .window
                .compaction
                .exhausted_at
                .is_none_or(|at| fill > at + at / 10)
        {
            let trigger = CompactionTrigger::HardThreshold;
            let span = telemetry::compaction_span(self.execution, turn, trigger);
            self.summarise(turn, trigger, None, true, false)
                .instrument(span)
                .await?;
        } else if at_or_above(fill, capacity, config.soft_percent) {
            let span =
                telemetry::compaction_span(self.execution, turn, CompactionTrigger::SoftThreshold);
            self.mask(turn, capacity * MASK_MIN_PERCENT / 100)
                .instrument(span)
                .await?;
        }
        Ok(())
    }

    /// Compacts after a `context_overflow` whatever the thresholds say. `false` when
    /// nothing could be taken out.
    pub(crate) async fn compact_for_overflow(&mut self, turn: u32) -> Result<bool, Stop> {
        let before = self.window.fill();
        let trigger = CompactionTrigger::Overflow;
        let span = telemetry::compaction_span(self.execution, turn, trigger);
        self.mask(turn, 0).instrument(span).await?;
        let span = telemetry::compaction_span(self.execution, turn, trigger);
        self.summarise(turn, trigger, None, true, true)
            .instrument(span)
            .await?;
        Ok(self.window.fill() < before)
    }

    /// Masks the old tool results, if that frees at least `min_savings` tokens.
    async fn mask(&mut self, turn: u32, min_savings: u64) -> Result<(), Stop> {
        let recent = self
            .config
            .compaction
            .recent_turns(self.caller.budget_used_percent());
        let mut indices = plan_mask(self.window.messages(), self.window.counts(), recent);
        if let Some(protected) = self.window.protect_from {
            indices.retain(|&i| i < protected);
        }
        // Mask only where the placeholder is smaller than the output it replaces, and only
        // when the placeholders, counted exactly, free enough to be worth a prompt rewrite.
        let id = BlockId::new();
        let placeholders: Vec<(usize, Message, u64)> = indices
            .iter()
            .map(|&i| {
                let placeholder = masked(
                    &self.window.messages()[i],
                    self.window.counts()[i],
                    id,
                    self.config.compaction.mask_digest_chars,
                );
                let tokens = self.window.counter().count_message(&placeholder);
                (i, placeholder, tokens)
            })
            .filter(|(i, _, tokens)| self.window.counts()[*i] > tokens + tokens / 2)
            .collect();
        let savings: u64 = placeholders
            .iter()
            .map(|(i, _, tokens)| self.window.counts()[*i] - tokens)
            .sum();
        if savings < min_savings {
            return Ok(());
        }
        let (Some(first), Some(last)) = (
            placeholders.first().map(|p| p.0),
            placeholders.last().map(|p| p.0),
        ) else {
            return Ok(());
        };
        let originals: Vec<Message> = placeholders
            .iter()
            .map(|(i, _, _)| self.window.messages()[*i].clone())
            .collect();
        self.archive
            .archive(
                self.execution,
                ArchivedBlock {
                    id,
                    messages: originals,
                    note: format!("{} tool outputs masked at turn {turn}", placeholders.len()),
                },
            )
            .await?;
        self.window.compaction.archived_blocks += 1;
        let before = self.window.fill();
        for (i, placeholder, tokens) in placeholders {
            self.window.replace(i, placeholder, tokens);
        }
        let replacement: Vec<Message> = self.window.messages()[first..=last].to_vec();
        self.finish_compaction(
            turn,
            CompactionStrategy::Mask,
            CompactionTrigger::SoftThreshold,
            first,
            last + 1,
            replacement,
            vec![id],
            before,
            None,
            false,
        )
        .await
    }

    /// Replaces the middle of the conversation by a summary (or, with `archive_note`, by a
    /// short note without a summary call).
    async fn summarise(
        &mut self,
        turn: u32,
        trigger: CompactionTrigger,
        archive_note: Option<String>,
        preserve_markers: bool,
        forced: bool,
    ) -> Result<(), Stop> {
        let config = self.config.compaction;
        let capacity = self.window.capacity().unwrap_or(0).max(1);
        let used = self.caller.budget_used_percent();
        let complexity = if preserve_markers {
            self.config.complexity
        } else {
            Some(nerve_core::Complexity::Simple)
        };
        let policy = compaction::SummaryPolicy {
            recent_turns: config.recent_turns(used),
            // Forced (asked for, or after an overflow): the recent turns, not a share of the window.
            recent_percent: if self.window.capacity().is_some() && !forced {
                config.keep_recent_percent
            } else {
                0
            },
            complexity,
            protect_from: self.window.protect_from,
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
        if !preserve_markers {
            plan.kept.retain(|&i| {
                self.window.messages()[i].pinned
                    || self.window.messages()[i].role == MessageRole::System
            });
            plan.summarised = (plan.from..plan.to)
                .filter(|i| !plan.kept.contains(i))
                .collect();
        }
        let before = self.window.fill();
        let summarised: Vec<Message> = plan
            .summarised
            .iter()
            .map(|&i| self.window.messages()[i].clone())
            .collect();
        // Fold an earlier summary into this one rather than nesting it.
        let earlier: Option<String> =
            summarised
                .iter()
                .flat_map(|m| &m.parts)
                .rev()
                .find_map(|p| match p {
                    MessagePart::CompactionSummary { text, .. } => Some(text.clone()),
                    MessagePart::Text { .. }
                    | MessagePart::ToolCall(_)
                    | MessagePart::ToolResult(_)
                    | MessagePart::Thinking { .. } => None,
                });
        let mut archived: Vec<BlockId> = summarised
            .iter()
            .flat_map(|m| &m.parts)
            .filter_map(|p| match p {
                MessagePart::CompactionSummary { archived, .. } => Some(archived.clone()),
                MessagePart::Text { .. }
                | MessagePart::ToolCall(_)
                | MessagePart::ToolResult(_)
                | MessagePart::Thinking { .. } => None,
            })
            .flatten()
            .collect();
        let id = BlockId::new();
        let note = format!("{} messages compacted at turn {turn}", summarised.len());
        self.archive
            .archive(
                self.execution,
                ArchivedBlock {
                    id,
                    messages: summarised.clone(),
                    note,
                },
            )
            .await?;
        self.window.compaction.archived_blocks += 1;
        archived.push(id);
        let fresh: Vec<&Message> = summarised.iter().filter(|m| !is_summary(m)).collect();
        let task = self
            .window
            .messages()
            .iter()
            .find(|m| m.pinned)
            .map(Message::text_content)
            .unwrap_or_default();
        let strategy = if archive_note.is_some() {
            CompactionStrategy::Archive
        } else {
            CompactionStrategy::Summarize
        };
        let (summary, extractive) = match archive_note {
            Some(reason) => (format!("Archived at the agent's request: {reason}"), false),
            None => match self.summary_call(turn, &fresh, earlier.as_deref()).await {
                Ok(text) => (text, false),
                Err(SummaryFailure::Stop(stop)) => return Err(stop),
                Err(SummaryFailure::Failed) => (
                    extractive_summary(
                        &task,
                        &fresh,
                        earlier.as_deref(),
                        summary_max_chars(self.window.capacity()),
                    ),
                    true,
                ),
            },
        };
        let mut replacement: Vec<Message> = plan
            .kept
            .iter()
            .filter(|&&i| self.window.messages()[i].pinned)
            .map(|&i| kept_form(&self.window.messages()[i]))
            .collect();
        replacement.push(summary_message(&summary, fresh.len(), archived.clone()));
        replacement.extend(
            plan.kept
                .iter()
                .filter(|&&i| !self.window.messages()[i].pinned)
                .map(|&i| kept_form(&self.window.messages()[i])),
        );
        let replacement_counts: Vec<u64> = replacement
            .iter()
            .map(|m| self.window.counter().count_message(m))
            .collect();
        let removed: u64 = self.window.counts()[plan.from..plan.to].iter().sum();
        let added: u64 = replacement_counts.iter().sum();
        if added >= removed {
            // Summarising would not shrink the context: never loop on it, never grow.
            self.window.compaction.exhausted_at = Some(before);
            self.window.compaction.cooldown_until = turn + self.config.compaction.cooldown_turns;
            return Ok(());
        }
        self.window
            .splice(plan.from..plan.to, replacement.clone(), replacement_counts);
        self.finish_compaction(
            turn,
            strategy,
            trigger,
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

    async fn summary_call(
        &mut self,
        turn: u32,
        messages: &[&Message],
        earlier: Option<&str>,
    ) -> Result<String, SummaryFailure> {
        let request = vec![
            Message::system(SUMMARY_PROMPT),
            Message::user(transcript(messages, earlier)),
        ];
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
            Err(CallError::Overflow(_)) => Err(SummaryFailure::Failed),
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

enum SummaryFailure {
    Stop(Stop),
    Failed,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn cap(text: &mut String, max: usize) {
    if text.len() > max {
        let cut = nerve_core::text::clip(text, max).len();
        text.truncate(cut);
        text.push_str("\n[... truncated ...]");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nerve_core::event::CompactionTrigger;
    use nerve_core::{EventSink, ExecutionId, TaskId, TaskStatus};
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::engine::{AgentEngine, EngineConfig, Task};
    use crate::scripted::ScriptedProvider;
    use crate::testing::{EchoTools, MemorySink};

    #[test]
    fn the_extractive_summary_scales_with_the_window() {
        for (capacity, expected) in [
            (None, 12_000),
            (Some(1_000), 1_000),
            (Some(8_000), 3_600),
            (Some(16_000), 7_200),
            (Some(200_000), 12_000),
        ] {
            assert_eq!(summary_max_chars(capacity), expected, "{capacity:?}");
        }
    }

    /// Between the soft and the hard threshold, results that leave the recent window are
    /// masked in batches that free at least a tenth of the window, not one per turn.
    #[tokio::test]
    async fn soft_masking_waits_until_it_frees_a_tenth_of_the_window() {
        let window = 20_000;
        // Long notes: once they fill the window's first 60%, masking alone cannot get
        // below the soft threshold, and each turn has one more result to mask.
        let note =
            "the module compiles, but the integration check still reports a stale cache entry; "
                .repeat(12);
        let cassette: Vec<String> = (0..70)
            .map(|i| {
                serde_json::json!({
                    "text": format!("Part {i}: {note}"),
                    "tool_calls": [{"name": "shell", "arguments": {"lines": 30, "fact": format!("fact {i}")}}],
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                })
                .to_string()
            })
            .chain([r#"{"text":"done"}"#.to_owned()])
            .collect();
        let sink = Arc::new(MemorySink::default());
        let engine = AgentEngine::new(
            Arc::new(ScriptedProvider::parse("mask", &cassette.join("\n")).unwrap()),
            Arc::new(EchoTools::default()),
            Arc::clone(&sink) as Arc<dyn EventSink>,
            EngineConfig {
                context_window: Some(window),
                max_turns: 100,
                ..EngineConfig::default()
            },
        );
        let task = Task {
            id: TaskId::new(),
            description: "read the log".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        };
        engine
            .run(ExecutionId::new(), task, CancellationToken::new())
            .await
            .unwrap();
        let masks: Vec<_> = sink
            .events()
            .into_iter()
            .filter_map(|e| {
                if let Event::Compaction(c) = e
                    && c.trigger == CompactionTrigger::SoftThreshold
                {
                    Some(c)
                } else {
                    None
                }
            })
            .collect();
        assert!(masks.len() >= 2, "{} masks", masks.len());
        for mask in &masks {
            assert!(
                mask.tokens_before - mask.tokens_after >= window / 10,
                "{} -> {}",
                mask.tokens_before,
                mask.tokens_after
            );
        }
    }
}
