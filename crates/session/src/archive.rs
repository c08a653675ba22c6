//! The archive of offloaded context: blocks of messages that compaction took out of the
//! conversation, searchable with SQLite FTS5 for the `recall` tool.
//!
//! The query builder is the security boundary here: agent text goes into an FTS5 `MATCH`,
//! whose query language has operators, column filters and syntax errors. Every term is
//! quoted as an FTS5 string, so no input can be anything but a list of phrases.

use nerve_core::{BlockId, Message, MessagePart};
use serde::Serialize;

/// Terms beyond this many are dropped: a recall query is a few keywords, not a document.
const MAX_TERMS: usize = 32;
/// Characters per term beyond this are dropped.
const MAX_TERM_CHARS: usize = 64;

/// A block to archive: the messages compaction took out, under the id the agent will see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewBlock {
    pub block_id: BlockId,
    pub messages: Vec<Message>,
    /// What the block holds, in a line (`3 tool outputs masked at turn 12`); searchable.
    pub note: String,
}

impl From<nerve_core::ArchivedBlock> for NewBlock {
    fn from(block: nerve_core::ArchivedBlock) -> Self {
        Self {
            block_id: block.id,
            messages: block.messages,
            note: block.note,
        }
    }
}

/// [`nerve_core::ContextArchive::archive_many`] for a store: the blocks in one write (one
/// transaction, one flush), none when there are none.
pub(crate) async fn put_archived<S: crate::EventStore + ?Sized>(
    store: &S,
    execution: nerve_core::ExecutionId,
    blocks: Vec<nerve_core::ArchivedBlock>,
) -> Result<(), nerve_core::SinkError> {
    if blocks.is_empty() {
        return Ok(());
    }
    let blocks = blocks.into_iter().map(NewBlock::from).collect();
    store
        .put_blocks(execution, blocks)
        .await
        .map(|_| ())
        .map_err(nerve_core::SinkError::from)
}

/// An archived block as stored (its messages redacted like every payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveBlock {
    pub block_id: BlockId,
    pub execution_id: String,
    /// The sequence number of the event the block was archived with (the compaction), or
    /// the execution's last event when it was archived on its own.
    pub created_seq: u64,
    pub ts: String,
    pub messages: Vec<Message>,
    pub note: String,
}

/// One search result, best first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchiveHit {
    pub block_id: BlockId,
    pub created_seq: u64,
    pub note: String,
    /// A short excerpt around the matching terms.
    pub snippet: String,
}

/// The FTS5 query for free text typed by an agent or a user: each whitespace-separated term
/// becomes a quoted string (inner quotes doubled), and a block must match every term (as
/// the in-memory archive of `nerve-brain` does); results are ranked by bm25. `None` when
/// nothing searchable is left.
pub fn fts_query(text: &str) -> Option<String> {
    let terms: Vec<String> = text
        .split_whitespace()
        .filter(|term| term.chars().any(char::is_alphanumeric))
        .take(MAX_TERMS)
        .map(|term| {
            let mut quoted = String::with_capacity(term.len() + 2);
            quoted.push('"');
            for c in term
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_TERM_CHARS)
            {
                if c == '"' {
                    quoted.push('"');
                }
                quoted.push(c);
            }
            quoted.push('"');
            quoted
        })
        .collect();
    if terms.is_empty() {
        None
    } else {
        Some(terms.join(" AND "))
    }
}

/// The text a block is found by: what the model read and wrote, tool names and arguments
/// included, so `recall shell cargo test` finds the block holding that call.
pub(crate) fn searchable_text(messages: &[Message]) -> String {
    let mut out = String::new();
    let mut push = |text: &str| {
        if !text.is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
    };
    for message in messages {
        for part in &message.parts {
            match part {
                MessagePart::Text { text } | MessagePart::Thinking { text, .. } => push(text),
                MessagePart::ToolCall(call) => {
                    push(&call.name);
                    push(&call.arguments.to_string());
                }
                MessagePart::ToolResult(result) => push(&result.content),
                MessagePart::CompactionSummary { text, .. } => push(text),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<&str>) {
        assert_eq!(fts_query(input).as_deref(), expected, "input: {input:?}");
    }

    #[test]
    fn queries_are_quoted_phrases() {
        check("failing test", Some(r#""failing" AND "test""#));
        check(
            r#"say "hi" NEAR(a b) OR col:x*"#,
            Some(r#""say" AND """hi""" AND "NEAR(a" AND "b)" AND "OR" AND "col:x*""#),
        );
        check("  \t\n", None);
        check("-- ** ()", None);
        check("", None);
    }
}
