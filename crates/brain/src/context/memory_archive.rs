//! An in-memory [`ContextArchive`]: the default when no log-backed archive is wired in
//! (tests, embedded use). `nerve` itself archives into the SQLite log.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use aho_corasick::AhoCorasick;
use async_trait::async_trait;
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, ExecutionId, MessagePart, RecallHit, SinkError,
};

use crate::context::compaction_plan::{is_summary, transcript};

#[derive(Debug, Default)]
pub struct MemoryArchive {
    blocks: Mutex<BTreeMap<(ExecutionId, BlockId), Stored>>,
}

/// A block and the text a search reads, made at the first search that reaches it (not when
/// archiving: a mask archives hundreds of outputs at once, and most are never searched).
#[derive(Debug)]
struct Stored {
    block: ArchivedBlock,
    text: OnceLock<String>,
    label: OnceLock<String>,
}

impl Stored {
    fn new(block: ArchivedBlock) -> Self {
        Self {
            block,
            text: OnceLock::new(),
            label: OnceLock::new(),
        }
    }

    fn text(&self) -> &str {
        self.text
            .get_or_init(|| transcript(&self.block.messages.iter().collect::<Vec<_>>(), None))
    }

    /// The pieces a search reads, without making the transcript when the block is one tool
    /// output (most blocks): the transcript's label and the content, which together are
    /// the transcript but for its closing line break; no word (no whitespace) can span the
    /// label's closing `: `.
    fn pieces(&self) -> [&str; 2] {
        if let [message] = self.block.messages.as_slice()
            && let [MessagePart::ToolResult(result)] = message.parts.as_slice()
        {
            let failed = if result.is_error { " (failed)" } else { "" };
            let label = self
                .label
                .get_or_init(|| format!("HISTORY:\ntool result {}{failed}: ", result.name));
            return [label, &result.content];
        }
        [self.text(), ""]
    }
}

#[async_trait]
impl ContextArchive for MemoryArchive {
    async fn archive(&self, execution: ExecutionId, block: ArchivedBlock) -> Result<(), SinkError> {
        let mut blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        blocks.insert((execution, block.id), Stored::new(block));
        Ok(())
    }

    /// All of them under one lock.
    async fn archive_many(
        &self,
        execution: ExecutionId,
        new: Vec<ArchivedBlock>,
    ) -> Result<(), SinkError> {
        let mut blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        blocks.extend(
            new.into_iter()
                .map(|block| ((execution, block.id), Stored::new(block))),
        );
        Ok(())
    }

    async fn fetch(
        &self,
        execution: ExecutionId,
        id: BlockId,
    ) -> Result<Option<ArchivedBlock>, SinkError> {
        let blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        Ok(blocks
            .get(&(execution, id))
            .map(|stored| stored.block.clone()))
    }

    /// Every word of `query` must occur (case-insensitively) in the block. Original
    /// outputs and messages come before summaries (which restate them, shortened), older
    /// blocks first within each; each hit shows the line where the first word occurs. ASCII
    /// words are matched in place (ASCII case ignored), others against a lowercased copy.
    async fn search(
        &self,
        execution: ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<RecallHit>, SinkError> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        if words.is_empty() {
            return Ok(Vec::new());
        }
        // One matcher per word: a block must hold them all.
        let matchers: Option<Vec<AhoCorasick>> = words
            .iter()
            .map(|w| {
                w.is_ascii()
                    .then(|| {
                        AhoCorasick::builder()
                            .ascii_case_insensitive(true)
                            .build([w])
                            .ok()
                    })
                    .flatten()
            })
            .collect();
        // Where the first word occurs, when the block holds every word.
        let position = |stored: &Stored| -> Option<usize> {
            match &matchers {
                Some(matchers) => {
                    let pieces = stored.pieces();
                    if !matchers
                        .iter()
                        .all(|m| pieces.iter().any(|piece| m.is_match(*piece)))
                    {
                        return None;
                    }
                    matchers.first()?.find(stored.text()).map(|m| m.start())
                }
                None => {
                    let lower = stored.text().to_lowercase();
                    if !words.iter().all(|w| lower.contains(w.as_str())) {
                        return None;
                    }
                    Some(lower.find(words[0].as_str()).unwrap_or(0))
                }
            }
        };
        let blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        // (is a summary, hit).
        let mut hits: Vec<(bool, RecallHit)> = Vec::new();
        let mut originals = 0;
        for ((owner, id), stored) in blocks.iter() {
            if *owner != execution {
                continue;
            }
            // Originals come first and in time order: once `limit` of them are found, no
            // later block can be among the first `limit` hits.
            if originals >= limit {
                break;
            }
            let Some(at) = position(stored) else {
                continue;
            };
            let text = stored.text();
            let block = &stored.block;
            let summary = block.messages.iter().any(is_summary);
            originals += usize::from(!summary);
            hits.push((
                summary,
                RecallHit {
                    id: *id,
                    note: block.note.clone(),
                    snippet: line_at(text, at),
                },
            ));
        }
        hits.sort_by_key(|(summary, _)| *summary); // Stable: ids (UUID v7) in time order.
        Ok(hits.into_iter().take(limit).map(|(_, hit)| hit).collect())
    }
}

/// Characters of a hit's line of context at most.
const SNIPPET_CHARS: usize = 200;

/// The line of `text` around byte `at` (lowercasing can move bytes: `at` is clamped), at
/// most [`SNIPPET_CHARS`] characters, centred on `at` when the line is longer.
fn line_at(text: &str, at: usize) -> String {
    let at = nerve_core::text::clip(text, at.min(text.len())).len();
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = text[at..].find('\n').map_or(text.len(), |i| at + i);
    let line = &text[start..end];
    let offset = at - start;
    let from = nerve_core::text::clip(line, offset.saturating_sub(SNIPPET_CHARS / 2)).len();
    line[from..]
        .chars()
        .take(SNIPPET_CHARS)
        .collect::<String>()
        .trim()
        .to_owned()
}
