//! The window: the conversation the model sees, the token count of every message, and the
//! compaction state that decides when it is compacted next.
//!
//! Invariants:
//! - `counts[i]` is the token count of `messages[i]`: every change to the conversation goes
//!   through a method here that keeps the two in step, so [`Window::fill`] is a sum, never
//!   a recount.
//! - A message appended is recorded in the journal (`message_appended`) before it is seen;
//!   replacements made by a compaction are recorded by its `compaction` event.
//! - The context indicator in the system prompt changes only at start and after a
//!   compaction ([`Window::refresh_indicator`]), so between ordinary turns the prompt prefix
//!   stays byte-identical (cache friendly).

use std::ops::Range;
use std::sync::Arc;

use nerve_core::event::MessageAppended;
use nerve_core::{Event, Message, MessageRole};

use crate::context::compaction_plan::{CompactionStrategyRequest, indicator, with_indicator};
use crate::provider::tokens::TokenCounter;
use crate::run::journal::Journal;

/// What identifies archived content: a 64-bit hash of it and its length.
pub(crate) type ContentKey = (u64, usize);

/// The guards of compaction, reset on resume.
#[derive(Debug, Clone, Default)]
pub(crate) struct CompactionState {
    /// No automatic compaction before this turn (after a failure).
    pub(crate) cooldown_until: u32,
    /// The fill at which summarising last failed to shrink the context: no new attempt
    /// until the conversation has grown past it.
    pub(crate) exhausted_at: Option<u64>,
    pub(crate) archived_blocks: usize,
    /// The block that holds each content archived by this run, by content hash (see
    /// [`crate::context::compactor`]), so that nothing is archived twice. Not part of a checkpoint:
    /// after a resume, content archived before it may be archived once more.
    pub(crate) archived_content: std::collections::HashMap<ContentKey, nerve_core::BlockId>,
    /// A `compress_context` call waiting for the turn boundary.
    pub(crate) requested: Option<CompactionStrategyRequest>,
    /// Compactions carried out by this run.
    pub(crate) count: u32,
    /// The run began on a conversation an earlier run left (a resume, a follow-up): the
    /// archive may hold blocks of this execution that this run did not write.
    pub(crate) inherited: bool,
}

impl CompactionState {
    /// Whether the archive holds nothing of this execution: a fresh run that has archived
    /// nothing yet (every archive write counts in `archived_blocks`).
    pub(crate) fn archive_is_empty(&self) -> bool {
        !self.inherited && self.archived_blocks == 0
    }
}

pub(crate) struct Window {
    messages: Vec<Message>,
    /// Token count of each message of `messages`, kept in step with it.
    counts: Vec<u64>,
    /// Tokens of the tool definitions offered every turn.
    tool_tokens: u64,
    counter: Arc<dyn TokenCounter>,
    /// The model's window in tokens, when known.
    capacity: Option<u64>,
    pub(crate) compaction: CompactionState,
    /// Messages from this index on belong to the active plan step: never compacted.
    pub(crate) protect_from: Option<usize>,
}

impl Window {
    pub(crate) fn new(
        messages: Vec<Message>,
        counter: Arc<dyn TokenCounter>,
        tool_tokens: u64,
        capacity: Option<u64>,
    ) -> Self {
        let counts = messages.iter().map(|m| counter.count_message(m)).collect();
        let compaction = CompactionState {
            inherited: !messages.is_empty(),
            ..CompactionState::default()
        };
        Self {
            messages,
            counts,
            tool_tokens,
            counter,
            capacity: capacity.filter(|c| *c > 0),
            compaction,
            protect_from: None,
        }
    }

    pub(crate) fn messages(&self) -> &[Message] {
        &self.messages
    }

    pub(crate) fn into_messages(self) -> Vec<Message> {
        self.messages
    }

    pub(crate) fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub(crate) fn counter(&self) -> &dyn TokenCounter {
        &*self.counter
    }

    pub(crate) fn capacity(&self) -> Option<u64> {
        self.capacity
    }

    /// Tokens of the tool definitions offered every turn.
    pub(crate) fn tool_tokens(&self) -> u64 {
        self.tool_tokens
    }

    /// Tokens the next request will carry: every message plus the tool definitions.
    pub(crate) fn fill(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.tool_tokens
    }

    /// Appends `message`, recording it first.
    pub(crate) fn push(&mut self, journal: &mut Journal, message: Message) {
        let index = u32::try_from(self.messages.len()).unwrap_or(u32::MAX);
        journal.record(Event::MessageAppended(MessageAppended {
            index,
            message: message.clone(),
        }));
        self.counts.push(self.counter.count_message(&message));
        self.messages.push(message);
    }

    /// Replaces message `index` (a compaction's placeholder; its event records it) and
    /// returns the message it replaced.
    pub(crate) fn replace(&mut self, index: usize, message: Message, tokens: u64) -> Message {
        self.counts[index] = tokens;
        std::mem::replace(&mut self.messages[index], message)
    }

    /// Replaces `range` by `replacement` (a summary and what it keeps), keeping the plan
    /// step's protected messages where they are, and returns the messages it replaced.
    pub(crate) fn splice(
        &mut self,
        range: Range<usize>,
        replacement: Vec<Message>,
        counts: Vec<u64>,
    ) -> Vec<Message> {
        let (start, removed) = (range.start, range.len());
        let added = replacement.len();
        let replaced = self.messages.splice(range.clone(), replacement).collect();
        self.counts.splice(range, counts);
        // A range at or after the protected messages' start leaves it where it is.
        if let Some(protected) = self.protect_from.as_mut()
            && start < *protected
        {
            *protected = protected.saturating_sub(removed).saturating_add(added);
        }
        replaced
    }

    /// Rewrites the context indicator in the system prompt. Only at start and after a
    /// compaction, so that between ordinary turns the prompt prefix stays byte-identical.
    pub(crate) fn refresh_indicator(&mut self, journal: &mut Journal) {
        let Some(capacity) = self.capacity else {
            return;
        };
        let Some(system) = self
            .messages
            .first()
            .filter(|m| m.role == MessageRole::System)
        else {
            return;
        };
        let text = with_indicator(
            &system.text_content(),
            &indicator(self.fill(), capacity, self.compaction.archived_blocks),
        );
        let message = Message::system(text);
        journal.record(Event::MessageAppended(MessageAppended {
            index: 0,
            message: message.clone(),
        }));
        self.counts[0] = self.counter.count_message(&message);
        self.messages[0] = message;
    }
}
