//! Moving an execution between logs: `nerve export` writes it as JSON Lines, `nerve import`
//! reads that back into either backend, where it verifies unchanged.
//!
//! The file is a header line, then every event in sequence order (its stored fields, the
//! payload as the exact text that was hashed, and a checkpoint's snapshot as the exact text
//! its event's SHA-256 covers), then the archive blocks. [`parse_log`] checks all of it
//! before anything is written: the chain, the snapshots, one execution id, the counts the
//! header announced; the first bad line is named.

use std::io::{BufRead, Write};

use nerve_core::{BlockId, Message};
use serde::{Deserialize, Serialize};

use crate::archive::ArchiveBlock;
use crate::chain::ChainCheck;
use crate::chain::StoredEvent;
use crate::encode::sha256_hex;

/// The `format` of the header line.
pub const EXPORT_FORMAT: &str = "nerve-log";
/// The version of the file layout this Nerve writes and reads.
pub const EXPORT_VERSION: u32 = 1;

/// One execution's whole log, as moved between backends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionLog {
    pub execution_id: String,
    pub events: Vec<LoggedEvent>,
    pub blocks: Vec<ArchiveBlock>,
}

/// An event with the snapshot stored beside it (checkpoint events only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    pub event: StoredEvent,
    pub snapshot: Option<String>,
}

/// Why a file cannot be imported: the first bad line (1-based) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ImportError {
    pub line: usize,
    pub reason: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Header {
        format: String,
        version: u32,
        execution_id: String,
        events: u64,
        blocks: u64,
    },
    Event {
        execution_id: String,
        seq: u64,
        ts: String,
        kind: String,
        version: u32,
        /// The stored payload: JSON text, kept as a string so its bytes survive the move.
        payload: String,
        prev_hash: String,
        hash: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        snapshot: Option<String>,
    },
    Block {
        block_id: BlockId,
        created_seq: u64,
        ts: String,
        messages: Vec<Message>,
        note: String,
    },
}

/// Writes `log` as JSON Lines.
pub fn write_log(log: &ExecutionLog, out: &mut dyn Write) -> std::io::Result<()> {
    let mut line = |value: &Line| -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, value)?;
        out.write_all(b"\n")
    };
    line(&Line::Header {
        format: EXPORT_FORMAT.to_owned(),
        version: EXPORT_VERSION,
        execution_id: log.execution_id.clone(),
        events: log.events.len() as u64,
        blocks: log.blocks.len() as u64,
    })?;
    for logged in &log.events {
        let e = &logged.event;
        line(&Line::Event {
            execution_id: e.execution_id.clone(),
            seq: e.seq,
            ts: e.ts.clone(),
            kind: e.kind.clone(),
            version: e.version,
            payload: e.payload.clone(),
            prev_hash: e.prev_hash.clone(),
            hash: e.hash.clone(),
            snapshot: logged.snapshot.clone(),
        })?;
    }
    for block in &log.blocks {
        line(&Line::Block {
            block_id: block.block_id,
            created_seq: block.created_seq,
            ts: block.ts.clone(),
            messages: block.messages.clone(),
            note: block.note.clone(),
        })?;
    }
    out.flush()
}

/// Reads and checks a file written by [`write_log`]. Nothing is trusted: the hash chain is
/// recomputed, each snapshot is checked against its checkpoint event, every line must name
/// the header's execution, blocks must belong to an event that exists, and the counts must
/// match the header. The error names the first line that fails.
pub fn parse_log(input: &mut dyn BufRead) -> Result<ExecutionLog, ImportError> {
    let mut header: Option<(String, u64, u64)> = None;
    let mut events: Vec<LoggedEvent> = Vec::new();
    let mut blocks: Vec<ArchiveBlock> = Vec::new();
    let mut chain = ChainCheck::default();
    let mut number = 0usize;
    let mut text = String::new();
    loop {
        text.clear();
        let read = input.read_line(&mut text).map_err(|e| ImportError {
            line: number + 1,
            reason: format!("cannot read: {e}"),
        })?;
        if read == 0 {
            break;
        }
        number += 1;
        let bad = |reason: String| ImportError {
            line: number,
            reason,
        };
        if text.trim().is_empty() {
            return Err(bad("blank line".into()));
        }
        let line: Line = serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a line of an exported log: {e}")))?;
        match (line, &header) {
            (
                Line::Header {
                    format,
                    version,
                    execution_id,
                    events,
                    blocks,
                },
                None,
            ) => {
                if number != 1 {
                    return Err(bad("the header must be the first line".into()));
                }
                if format != EXPORT_FORMAT || version != EXPORT_VERSION {
                    return Err(bad(format!(
                        "format {format:?} version {version} is not {EXPORT_FORMAT:?} version {EXPORT_VERSION}"
                    )));
                }
                execution_id
                    .parse::<nerve_core::ExecutionId>()
                    .map_err(|e| bad(format!("execution id {execution_id:?}: {e}")))?;
                header = Some((execution_id, events, blocks));
            }
            (Line::Header { .. }, Some(_)) => return Err(bad("a second header".into())),
            (_, None) => return Err(bad("the first line must be the header".into())),
            (
                Line::Event {
                    execution_id,
                    seq,
                    ts,
                    kind,
                    version,
                    payload,
                    prev_hash,
                    hash,
                    snapshot,
                },
                Some((id, _, _)),
            ) => {
                if !blocks.is_empty() {
                    return Err(bad("an event after the archive blocks".into()));
                }
                if &execution_id != id {
                    return Err(bad(format!(
                        "event of execution {execution_id}, not {id} as the header says"
                    )));
                }
                let event = StoredEvent {
                    execution_id,
                    seq,
                    ts,
                    kind,
                    version,
                    payload,
                    prev_hash,
                    hash,
                };
                chain.push(&event.fields());
                if let Err((error, _)) = chain.finish() {
                    return Err(bad(error.to_string()));
                }
                check_snapshot(&event, snapshot.as_deref()).map_err(bad)?;
                events.push(LoggedEvent { event, snapshot });
            }
            (
                Line::Block {
                    block_id,
                    created_seq,
                    ts,
                    messages,
                    note,
                },
                Some((id, _, _)),
            ) => {
                if created_seq > events.len() as u64 {
                    return Err(bad(format!(
                        "block {block_id} was archived at sequence {created_seq}, after the last event"
                    )));
                }
                if blocks.iter().any(|b| b.block_id == block_id) {
                    return Err(bad(format!("block {block_id} appears twice")));
                }
                blocks.push(ArchiveBlock {
                    block_id,
                    execution_id: id.clone(),
                    created_seq,
                    ts,
                    messages,
                    note,
                });
            }
        }
    }
    let Some((execution_id, want_events, want_blocks)) = header else {
        return Err(ImportError {
            line: 1,
            reason: "the file is empty".into(),
        });
    };
    if events.is_empty() || want_events != events.len() as u64 || want_blocks != blocks.len() as u64
    {
        return Err(ImportError {
            line: number + 1,
            reason: format!(
                "the file ends after {} events and {} blocks; its header announced {want_events} and {want_blocks}",
                events.len(),
                blocks.len()
            ),
        });
    }
    Ok(ExecutionLog {
        execution_id,
        events,
        blocks,
    })
}

/// A checkpoint event must come with the snapshot whose SHA-256 it records; no other event
/// may carry one.
fn check_snapshot(event: &StoredEvent, snapshot: Option<&str>) -> Result<(), String> {
    match (event.kind == "checkpoint", snapshot) {
        (true, Some(snapshot)) => {
            let Ok(nerve_core::Event::Checkpoint(checkpoint)) =
                serde_json::from_str(&event.payload)
            else {
                return Err(format!("checkpoint {} does not decode", event.seq));
            };
            if sha256_hex(snapshot) == checkpoint.snapshot_sha256 {
                Ok(())
            } else {
                Err(format!(
                    "the snapshot of checkpoint {} does not match the hash its event records",
                    event.seq
                ))
            }
        }
        (true, None) => Err(format!("checkpoint {} has no snapshot", event.seq)),
        (false, Some(_)) => Err(format!(
            "event {} ({}) carries a snapshot but is not a checkpoint",
            event.seq, event.kind
        )),
        (false, None) => Ok(()),
    }
}
