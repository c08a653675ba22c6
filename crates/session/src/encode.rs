//! Turning typed events, checkpoints and archive blocks into the redacted rows the store
//! writes. This runs on the caller's thread, before a write reaches the single writer, so
//! the writer spends its time on SQLite and hashing only.

use nerve_core::event::Checkpoint;
use nerve_core::{Event, LoopType, Message, MicroUsd, Redactor, TokenUsage};
use ring::digest::{SHA256, digest};

use crate::archive::{NewBlock, searchable_text};

/// An event ready to be appended: serialised and redacted.
#[derive(Debug, Clone)]
pub(crate) struct EncodedEvent {
    pub(crate) kind: &'static str,
    pub(crate) version: u32,
    pub(crate) payload: String,
    /// What this event changes in the executions index.
    pub(crate) index: IndexUpdate,
}

/// An archive block row.
#[derive(Debug, Clone)]
pub(crate) struct EncodedBlock {
    pub(crate) block_id: String,
    pub(crate) messages: String,
    pub(crate) note: String,
    pub(crate) text: String,
}

/// One unit of the writer's work. Everything in it commits together, with everything else
/// in its batch: blocks never exist without the compaction event that archived them.
#[derive(Debug, Clone)]
pub(crate) struct Write {
    pub(crate) execution_id: String,
    pub(crate) events: Vec<EncodedEvent>,
    /// A checkpoint's redacted snapshot, stored in the row of the last event of `events`:
    /// the `checkpoint` event, whose payload records the snapshot's SHA-256.
    pub(crate) snapshot: Option<String>,
    /// Stored with `created_seq` = the execution's head after `events`.
    pub(crate) blocks: Vec<EncodedBlock>,
}

/// What a committed [`Write`] produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    /// The sequence number of each event, in order.
    pub(crate) seqs: Vec<u64>,
    /// The execution's last sequence number once the write committed.
    pub(crate) head: u64,
}

/// The part of an event the executions index keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IndexUpdate {
    Nothing,
    Started {
        task: String,
        loop_type: &'static str,
        model: String,
    },
    Turn {
        turn: u32,
        usage: TokenUsage,
        cost: MicroUsd,
    },
    Status(&'static str),
    Finish {
        reason: &'static str,
        status: &'static str,
        turns: u32,
        usage: TokenUsage,
        cost: MicroUsd,
        error: Option<String>,
    },
    Resumed,
}

/// When an event's change to the executions row must reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowWrite {
    /// It changes nothing there.
    Never,
    /// With a later commit: readers add the turns after the row's `as_of` from the log.
    Soon,
    /// In the event's own commit.
    Now,
}

impl IndexUpdate {
    pub(crate) fn row_write(&self) -> RowWrite {
        match self {
            Self::Nothing => RowWrite::Never,
            Self::Turn { .. } => RowWrite::Soon,
            Self::Started { .. } | Self::Status(_) | Self::Finish { .. } | Self::Resumed => {
                RowWrite::Now
            }
        }
    }
}

impl Write {
    pub(crate) fn events(execution_id: String, events: Vec<EncodedEvent>) -> Self {
        Self {
            execution_id,
            events,
            snapshot: None,
            blocks: Vec::new(),
        }
    }

    /// How many rows this write adds to the log, for batch sizing.
    pub(crate) fn weight(&self) -> usize {
        self.events.len() + self.blocks.len()
    }
}

/// Serialises and redacts `event` the way the log stores it.
pub(crate) fn encode_event(
    event: &Event,
    redactor: &Redactor,
) -> Result<EncodedEvent, serde_json::Error> {
    let kind = event.kind();
    Ok(EncodedEvent {
        kind: kind.as_str(),
        version: kind.version(),
        payload: redacted_json(event, redactor)?,
        index: index_update(event, redactor),
    })
}

/// A checkpoint of `snapshot` after `turn`: the redacted snapshot, and the `checkpoint`
/// event that records its hash in the chain.
pub(crate) fn encode_checkpoint(
    execution_id: String,
    turn: u32,
    snapshot: &serde_json::Value,
    redactor: &Redactor,
) -> Result<Write, serde_json::Error> {
    encode_checkpoint_after(execution_id, Vec::new(), turn, snapshot, redactor)
}

/// Like [`encode_checkpoint`], with `events` (encoded already) recorded before the
/// `checkpoint` event in the same write.
pub(crate) fn encode_checkpoint_after(
    execution_id: String,
    mut events: Vec<EncodedEvent>,
    turn: u32,
    snapshot: &serde_json::Value,
    redactor: &Redactor,
) -> Result<Write, serde_json::Error> {
    let snapshot = redacted_json(snapshot, redactor)?;
    let event = Event::Checkpoint(Checkpoint {
        turn,
        snapshot_sha256: sha256_hex(&snapshot),
        snapshot_bytes: snapshot.len() as u64,
    });
    events.push(encode_event(&event, redactor)?);
    Ok(Write {
        execution_id,
        events,
        snapshot: Some(snapshot),
        blocks: Vec::new(),
    })
}

/// The write of one engine batch (`events`, then `checkpoint`'s event and snapshot when
/// given); `None` when there is nothing to write. Both backends' sinks encode and redact a
/// batch with this on the caller's thread.
pub(crate) fn encode_batch(
    execution_id: String,
    events: &[Event],
    checkpoint: Option<&nerve_core::Snapshot>,
    redactor: &Redactor,
) -> Result<Option<Write>, serde_json::Error> {
    let encoded = events
        .iter()
        .map(|e| encode_event(e, redactor))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(match checkpoint {
        Some(snapshot) => Some(encode_checkpoint_after(
            execution_id,
            encoded,
            snapshot.turn,
            &snapshot.state,
            redactor,
        )?),
        None if encoded.is_empty() => None,
        None => Some(Write::events(execution_id, encoded)),
    })
}

/// Archive blocks, optionally with the event that archived them (a compaction).
pub(crate) fn encode_blocks(
    execution_id: String,
    blocks: &[NewBlock],
    event: Option<&Event>,
    redactor: &Redactor,
) -> Result<Write, serde_json::Error> {
    let blocks = blocks
        .iter()
        .map(|block| {
            let messages = redacted_json(&block.messages, redactor)?;
            // Built from the redacted messages, so the index never holds a secret either.
            let redacted: Vec<Message> = serde_json::from_str(&messages)?;
            let note = redactor.redact(&block.note).into_owned();
            let mut text = note.clone();
            text.push('\n');
            text.push_str(&searchable_text(&redacted));
            Ok(EncodedBlock {
                block_id: block.block_id.to_string(),
                messages,
                note,
                text,
            })
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()?;
    let events = event
        .map(|event| encode_event(event, redactor))
        .transpose()?
        .into_iter()
        .collect();
    Ok(Write {
        execution_id,
        events,
        snapshot: None,
        blocks,
    })
}

pub(crate) fn sha256_hex(text: &str) -> String {
    hex::encode(digest(&SHA256, text.as_bytes()))
}

/// `value` as JSON with every secret replaced, exactly as the log stores it (also what
/// `nerve run --jsonl` prints). Most payloads hold none, so the whole text is
/// scanned once and re-encoded string by string only when something matched: replacing in
/// the JSON text directly could cut through a closing quote (a truncated private key runs
/// to the end of the text) and corrupt the document.
pub fn redacted_json<T: serde::Serialize + ?Sized>(
    value: &T,
    redactor: &Redactor,
) -> Result<String, serde_json::Error> {
    let text = serde_json::to_string(value)?;
    if !redactor.contains_secret(&text) {
        return Ok(text);
    }
    let mut tree = serde_json::to_value(value)?;
    redact_strings(&mut tree, redactor);
    Ok(tree.to_string())
}

/// Replaces secrets in every string of `value` (object keys stay as they are: they are
/// ours, not data).
fn redact_strings(value: &mut serde_json::Value, redactor: &Redactor) {
    match value {
        serde_json::Value::String(text) => {
            if let std::borrow::Cow::Owned(redacted) = redactor.redact(text) {
                *text = redacted;
            }
        }
        serde_json::Value::Array(items) => items
            .iter_mut()
            .for_each(|item| redact_strings(item, redactor)),
        serde_json::Value::Object(map) => map
            .values_mut()
            .for_each(|item| redact_strings(item, redactor)),
        serde_json::Value::Null | serde_json::Value::Bool(_) | serde_json::Value::Number(_) => {}
    }
}

pub(crate) fn index_update(event: &Event, redactor: &Redactor) -> IndexUpdate {
    match event {
        Event::Started(started) => IndexUpdate::Started {
            task: redactor.redact(&started.task).into_owned(),
            loop_type: loop_name(started.loop_type),
            model: redactor.redact(&started.model).into_owned(),
        },
        Event::TurnCompleted(turn) => IndexUpdate::Turn {
            turn: turn.turn,
            usage: turn.usage,
            cost: turn.cost,
        },
        Event::TaskTransition(transition) => IndexUpdate::Status(transition.to.as_str()),
        Event::Finish(finish) => IndexUpdate::Finish {
            reason: finish.termination_reason.as_str(),
            status: finish.task_status.as_str(),
            turns: finish.total_turns,
            usage: finish.usage,
            cost: finish.cost,
            error: finish
                .error
                .as_deref()
                .map(|e| redactor.redact(e).into_owned()),
        },
        Event::Resumed(_) => IndexUpdate::Resumed,
        Event::ContextCreated(_)
        | Event::MessageAppended(_)
        | Event::ToolCallStarted(_)
        | Event::ToolCallFinished(_)
        | Event::ModelCalled(_)
        | Event::Retry(_)
        | Event::Compaction(_)
        | Event::Stagnation(_)
        | Event::ApprovalRequested(_)
        | Event::ApprovalDecided(_)
        | Event::ProxyDecision(_)
        | Event::Checkpoint(_)
        | Event::WorkspaceSnapshot(_)
        | Event::WorkspaceRewound(_)
        | Event::ToolProtocolSwitched(_)
        | Event::InstructionsLoaded(_)
        | Event::HookRan(_)
        | Event::SkillLoaded(_) => IndexUpdate::Nothing,
    }
}

/// The wire name of a loop type (core has no `as_str` for it; the serde names are these).
const fn loop_name(loop_type: LoopType) -> &'static str {
    match loop_type {
        LoopType::React => "react",
        LoopType::PlanExecute => "plan_execute",
        LoopType::Hybrid => "hybrid",
        LoopType::Auto => "auto",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_private_key_is_redacted_without_breaking_the_json() {
        let event = Event::MessageAppended(nerve_core::event::MessageAppended {
            index: 0,
            message: Message::user("key: -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNz"),
        });
        let encoded = encode_event(&event, &Redactor::new()).unwrap();
        let back: Event = serde_json::from_str(&encoded.payload).unwrap();
        let Event::MessageAppended(appended) = back else {
            panic!("{back:?}")
        };
        assert_eq!(
            appended.message.text_content(),
            "key: [REDACTED:private_key]"
        );
    }

    #[test]
    fn clean_payloads_keep_the_kind_tag_first() {
        let event = Event::Retry(nerve_core::event::Retry {
            turn: 1,
            attempt: 1,
            error: nerve_core::event::ModelErrorKind::Timeout,
            delay_ms: 1,
        });
        let encoded = encode_event(&event, &Redactor::new()).unwrap();
        assert!(
            encoded.payload.starts_with(r#"{"kind":"retry","#),
            "{}",
            encoded.payload
        );
        assert_eq!(encoded.version, 1);
    }

    #[test]
    fn loop_names_match_the_wire() {
        for loop_type in [
            LoopType::React,
            LoopType::PlanExecute,
            LoopType::Hybrid,
            LoopType::Auto,
        ] {
            assert_eq!(
                serde_json::json!(loop_type),
                serde_json::json!(loop_name(loop_type))
            );
        }
    }
}
