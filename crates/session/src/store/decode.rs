//! Decoding the events [`Store::replay`](super::Store::replay) reads: on a second thread
//! fed with batches of payloads (hashing them there too when the chain is checked), or on
//! the reading thread when no thread can be had.

use std::ops::Range;
use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};

use nerve_core::EventKind;

use crate::chain::{Fields, content_matches};
use crate::replay::Replayer;

/// Where [`Store::replay`](super::Store::replay) decodes: on a second thread fed with batches of payloads, or
/// here when no thread can be had.
pub(super) enum Decoder<'scope> {
    Here(Box<Replayer>),
    There {
        batch: DecodeBatch,
        batches: mpsc::SyncSender<DecodeBatch>,
        /// Batches the decoder is done with, to be filled again: allocating on one thread
        /// and freeing on the other costs more than the decoding.
        spent: mpsc::Receiver<DecodeBatch>,
        /// Batches sent so far: the odd ones carry their hashes to check.
        sent: usize,
        thread: ScopedJoinHandle<'scope, (Replayer, Option<u64>)>,
    },
}

/// Where an event's content hash is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hashing {
    /// On the reading thread.
    Here,
    /// On the decoding thread.
    There,
}

/// Payloads copied out of SQLite's buffers, end to end in one string, and in every other
/// batch the other fields of the events whose hashes the decoding thread checks.
#[derive(Default)]
pub(super) struct DecodeBatch {
    text: String,
    rows: Vec<(u64, Option<EventKind>, u32, Range<usize>)>,
    hashed: Vec<HashedRow>,
}

/// An event whose content hash the decoding thread checks: its fields as ranges of the
/// batch's text (the payload's is the row's).
struct HashedRow {
    row: usize,
    execution_id: Range<usize>,
    ts: Range<usize>,
    kind: Range<usize>,
    prev_hash: Range<usize>,
    hash: Range<usize>,
}

impl DecodeBatch {
    fn put(&mut self, text: &str) -> Range<usize> {
        let start = self.text.len();
        self.text.push_str(text);
        start..self.text.len()
    }

    fn str(&self, range: &Range<usize>) -> &str {
        self.text.get(range.clone()).unwrap_or_default()
    }

    /// The first event of this batch, by sequence number, whose content does not match its
    /// hash.
    fn content_break(&self) -> Option<u64> {
        self.hashed.iter().find_map(|hashed| {
            let (seq, _, version, payload) = self.rows.get(hashed.row)?;
            let fields = Fields {
                execution_id: self.str(&hashed.execution_id),
                seq: *seq,
                ts: self.str(&hashed.ts),
                kind: self.str(&hashed.kind),
                version: *version,
                payload: self.str(payload),
                prev_hash: self.str(&hashed.prev_hash),
                hash: self.str(&hashed.hash),
            };
            (!content_matches(&fields)).then_some(*seq)
        })
    }

    fn clear(&mut self) {
        self.text.clear();
        self.rows.clear();
        self.hashed.clear();
    }
}

/// Payloads handed to the decoding thread at a time.
const DECODE_BATCH: usize = 512;

impl<'scope> Decoder<'scope> {
    pub(super) fn start<'env>(scope: &'scope Scope<'scope, 'env>, execution_id: &str) -> Self {
        let (batches, inbox) = mpsc::sync_channel::<DecodeBatch>(4);
        let (recycle, spent) = mpsc::sync_channel::<DecodeBatch>(8);
        let mut replayer = Replayer::new(execution_id);
        let spawned = std::thread::Builder::new()
            .name("nerve-replay-decode".into())
            .spawn_scoped(scope, move || {
                // Batches arrive in order, so the first break found is the earliest.
                let mut content_break = None;
                for mut batch in inbox {
                    if content_break.is_none() {
                        content_break = batch.content_break();
                    }
                    for (seq, kind, version, range) in &batch.rows {
                        replayer.push(*seq, *kind, *version, batch.str(range));
                    }
                    batch.clear();
                    // Full: the reader has enough spare batches; this one is freed here.
                    let _ = recycle.try_send(batch);
                }
                (replayer, content_break)
            });
        match spawned {
            Ok(thread) => Self::There {
                batch: DecodeBatch::default(),
                batches,
                spent,
                sent: 0,
                thread,
            },
            Err(_) => Self::Here(Box::new(Replayer::new(execution_id))),
        }
    }

    /// Hands over `fields` for decoding, and, in a batch whose hashes the decoding thread
    /// checks, for checking when `in_chain`. Says where its hash is to be checked.
    pub(super) fn push(&mut self, fields: &Fields<'_>, in_chain: bool) -> Hashing {
        let kind = EventKind::from_wire(fields.kind);
        match self {
            Self::Here(replayer) => {
                replayer.push(fields.seq, kind, fields.version, fields.payload);
                Hashing::Here
            }
            Self::There {
                batch,
                batches,
                spent,
                sent,
                ..
            } => {
                let payload = batch.put(fields.payload);
                let hashing = if *sent % 2 == 1 {
                    if in_chain {
                        let hashed = HashedRow {
                            row: batch.rows.len(),
                            execution_id: batch.put(fields.execution_id),
                            ts: batch.put(fields.ts),
                            kind: batch.put(fields.kind),
                            prev_hash: batch.put(fields.prev_hash),
                            hash: batch.put(fields.hash),
                        };
                        batch.hashed.push(hashed);
                    }
                    Hashing::There
                } else {
                    Hashing::Here
                };
                batch.rows.push((fields.seq, kind, fields.version, payload));
                if batch.rows.len() == DECODE_BATCH {
                    let next = spent.try_recv().unwrap_or_default();
                    // A send fails only when the decoder panicked; `finish` re-raises that.
                    let _ = batches.send(std::mem::replace(batch, next));
                    *sent += 1;
                }
                hashing
            }
        }
    }

    /// The rebuilt execution, and the first event whose content the decoding thread found
    /// not to match its hash.
    pub(super) fn finish(self) -> (Replayer, Option<u64>) {
        match self {
            Self::Here(replayer) => (*replayer, None),
            Self::There {
                batch,
                batches,
                thread,
                ..
            } => {
                let _ = batches.send(batch);
                drop(batches);
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }
        }
    }
}
