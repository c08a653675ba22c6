//! An in-memory [`ContextArchive`]: the default when no log-backed archive is wired in
//! (tests, embedded use). `nerve` itself archives into the SQLite log.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use nerve_core::{ArchivedBlock, BlockId, ContextArchive, ExecutionId, RecallHit, SinkError};

use crate::compaction::transcript;

#[derive(Debug, Default)]
pub struct MemoryArchive {
    blocks: Mutex<BTreeMap<(ExecutionId, BlockId), ArchivedBlock>>,
}

#[async_trait]
impl ContextArchive for MemoryArchive {
    async fn archive(&self, execution: ExecutionId, block: ArchivedBlock) -> Result<(), SinkError> {
        let mut blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        blocks.insert((execution, block.id), block);
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
        Ok(blocks.get(&(execution, id)).cloned())
    }

    /// Every word of `query` must occur (case-insensitively) in the block.
    async fn search(
        &self,
        execution: ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<RecallHit>, SinkError> {
        let words: Vec<String> = query.split_whitespace().map(str::to_lowercase).collect();
        let blocks = self
            .blocks
            .lock()
            .map_err(|_| SinkError::Unavailable("archive lock poisoned".into()))?;
        let mut hits = Vec::new();
        for ((owner, id), block) in blocks.iter() {
            if *owner != execution {
                continue;
            }
            let text = transcript(&block.messages.iter().collect::<Vec<_>>(), None);
            let lower = text.to_lowercase();
            if !words.is_empty() && words.iter().all(|w| lower.contains(w.as_str())) {
                let at = lower.find(words[0].as_str()).unwrap_or(0);
                let start = nerve_core::text::clip(&text, at.saturating_sub(80)).len();
                let snippet: String = text[start..].chars().take(200).collect();
                hits.push(RecallHit {
                    id: *id,
                    note: block.note.clone(),
                    snippet: snippet.replace('\n', " "),
                });
            }
            if hits.len() >= limit {
                break;
            }
        }
        Ok(hits)
    }
}
