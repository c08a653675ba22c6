//! The hash chain: each event's hash covers the previous hash and every stored field, so
//! editing, removing or reordering any event breaks verification from that point on.

use ring::digest::{Context, SHA256};
use serde::Serialize;

/// The `prev_hash` of an execution's first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A verification failure, naming the first bad sequence number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hash chain broken at sequence {seq}: {reason}")]
pub struct ChainError {
    pub seq: u64,
    pub reason: String,
}

/// Why a chain broke, before it is turned into a message: replay tells a missing sequence
/// number (a [`crate::GapKind::SequenceGap`]) from altered content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Break {
    Missing { found: u64 },
    Link,
    Content,
}

/// One event as stored: the payload is the redacted JSON text that was hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredEvent {
    pub execution_id: String,
    pub seq: u64,
    pub ts: String,
    pub kind: String,
    pub version: u32,
    pub payload: String,
    pub prev_hash: String,
    pub hash: String,
}

impl StoredEvent {
    pub(crate) fn fields(&self) -> Fields<'_> {
        Fields {
            execution_id: &self.execution_id,
            seq: self.seq,
            ts: &self.ts,
            kind: &self.kind,
            version: self.version,
            payload: &self.payload,
            prev_hash: &self.prev_hash,
            hash: &self.hash,
        }
    }
}

/// One stored event's fields, borrowed: what the chain covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub(crate) execution_id: &'a str,
    pub(crate) seq: u64,
    pub(crate) ts: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) version: u32,
    pub(crate) payload: &'a str,
    pub(crate) prev_hash: &'a str,
    pub(crate) hash: &'a str,
}

/// The SHA-256 of one event, chained to `prev_hash`, as 64 ASCII hex digits. Every field
/// is length-prefixed so that no two different events can frame to the same bytes.
fn digest(
    prev_hash: &str,
    execution_id: &str,
    seq: u64,
    ts: &str,
    kind: &str,
    version: u32,
    payload: &str,
) -> [u8; 64] {
    let mut frame = Frame::default();
    for field in [prev_hash.as_bytes(), execution_id.as_bytes()] {
        frame.put(&(field.len() as u64).to_le_bytes());
        frame.put(field);
    }
    frame.put(&seq.to_le_bytes());
    for field in [ts.as_bytes(), kind.as_bytes()] {
        frame.put(&(field.len() as u64).to_le_bytes());
        frame.put(field);
    }
    frame.put(&version.to_le_bytes());
    frame.put(&(payload.len() as u64).to_le_bytes());
    let mut ctx = frame.finish();
    ctx.update(payload.as_bytes());
    let mut hex_hash = [b'0'; 64];
    // 32 bytes always fill exactly 64 hex digits: this cannot fail.
    let _ = hex::encode_to_slice(ctx.finish().as_ref(), &mut hex_hash);
    hex_hash
}

/// The fields before the payload, gathered into one buffer before they are hashed: `ring`
/// copies every update into its block buffer, and ten small updates an event cost a third
/// as much as the hashing itself (the writer and replay hash every event).
struct Frame {
    ctx: Context,
    buf: [u8; 256],
    len: usize,
}

impl Default for Frame {
    fn default() -> Self {
        Self {
            ctx: Context::new(&SHA256),
            buf: [0; 256],
            len: 0,
        }
    }
}

impl Frame {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        if end > self.buf.len() {
            // Longer fields than ours ever are: hashed as they come, in the same order.
            self.flush();
            self.ctx.update(bytes);
            return;
        }
        if let Some(room) = self.buf.get_mut(self.len..end) {
            room.copy_from_slice(bytes);
            self.len = end;
        }
    }

    fn flush(&mut self) {
        self.ctx
            .update(self.buf.get(..self.len).unwrap_or_default());
        self.len = 0;
    }

    fn finish(mut self) -> Context {
        self.flush();
        self.ctx
    }
}

/// The hex SHA-256 of one event, chained to `prev_hash`.
pub(crate) fn event_hash(
    prev_hash: &str,
    execution_id: &str,
    seq: u64,
    ts: &str,
    kind: &str,
    version: u32,
    payload: &str,
) -> String {
    let hex_hash = digest(prev_hash, execution_id, seq, ts, kind, version, payload);
    String::from_utf8_lossy(&hex_hash).into_owned()
}

/// Whether `event`'s stored hash is the SHA-256 of its fields, chained to its stored
/// `prev_hash`: the half of verification that needs no other event.
pub(crate) fn content_matches(event: &Fields<'_>) -> bool {
    let recomputed = digest(
        event.prev_hash,
        event.execution_id,
        event.seq,
        event.ts,
        event.kind,
        event.version,
        event.payload,
    );
    event.hash.as_bytes() == recomputed
}

/// Verifies a chain one event at a time, without keeping the events: the store streams
/// rows through it, replay feeds it slices. Remembers the first break only.
#[derive(Debug, Clone)]
pub(crate) struct ChainCheck {
    /// The hex hash the next event must link to.
    prev: [u8; 64],
    next_seq: u64,
    first_break: Option<(u64, Break)>,
}

impl Default for ChainCheck {
    fn default() -> Self {
        let mut prev = [b'0'; 64];
        prev.copy_from_slice(GENESIS_HASH.as_bytes());
        Self {
            prev,
            next_seq: 1,
            first_break: None,
        }
    }
}

impl ChainCheck {
    pub(crate) fn push(&mut self, event: &Fields<'_>) {
        if self.push_link(event) && !content_matches(event) {
            self.first_break = Some((event.seq, Break::Content));
        }
    }

    /// The sequence and link checks of [`ChainCheck::push`], without recomputing the hash:
    /// another thread may check the content ([`content_matches`]) and report what it found
    /// with [`ChainCheck::content_break`]. True when `event` still belongs to the verified
    /// chain, so that its content must be checked.
    pub(crate) fn push_link(&mut self, event: &Fields<'_>) -> bool {
        if self.first_break.is_some() {
            return false;
        }
        let expected = self.next_seq;
        self.next_seq += 1;
        if event.seq != expected {
            self.first_break = Some((expected, Break::Missing { found: event.seq }));
            return false;
        }
        if event.prev_hash.as_bytes() != self.prev {
            self.first_break = Some((event.seq, Break::Link));
            return false;
        }
        // The next event links to this one's stored hash. When the content does not match
        // it, that break comes first, whoever finds it.
        match <[u8; 64]>::try_from(event.hash.as_bytes()) {
            Ok(hash) => self.prev = hash,
            Err(_) => {
                // Not a hex SHA-256: no content can match it.
                self.first_break = Some((event.seq, Break::Content));
                return false;
            }
        }
        true
    }

    /// Folds in the first event, by sequence number, whose content did not match its hash,
    /// as checked apart from [`ChainCheck::push_link`]. An earlier break, or a missing
    /// event or a broken link at the same number, is the one reported.
    pub(crate) fn content_break(&mut self, seq: u64) {
        if !matches!(self.first_break, Some((at, _)) if at <= seq) {
            self.first_break = Some((seq, Break::Content));
        }
    }

    /// The number of events verified, or the first break.
    pub(crate) fn finish(&self) -> Result<u64, (ChainError, Break)> {
        match self.first_break {
            None => Ok(self.next_seq - 1),
            Some((seq, cause)) => {
                let reason = match cause {
                    Break::Missing { found } => {
                        format!("sequence {seq} is missing (found {found})")
                    }
                    Break::Link => "previous-hash link does not match".to_owned(),
                    Break::Content => "content does not match its hash".to_owned(),
                };
                Err((ChainError { seq, reason }, cause))
            }
        }
    }
}

/// Recomputes the hash chain of one execution's `events` (as [`crate::Store::events`] or
/// any backend returns them, in order): the number of events verified, or the first break.
/// What `resume`, `chat ID` and `run --continue` check before they trust a log, whatever
/// backend it came from.
pub fn verify_events(events: &[StoredEvent]) -> Result<u64, ChainError> {
    let mut check = ChainCheck::default();
    for event in events {
        check.push(&event.fields());
    }
    check.finish().map_err(|(error, _)| error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hashes that logs already hold: the framing of the fields may never change.
    #[test]
    fn the_framing_of_an_event_never_changes() {
        let long = "k".repeat(300);
        for (prev, id, ts, kind, payload, expected) in [
            (
                GENESIS_HASH,
                "01a200a4-59d8-741c-abcd-cb6ad7c4295c",
                "2025-01-31T12:00:00.123456Z",
                "turn_completed",
                r#"{"kind":"turn_completed","turn":1}"#,
                "fd40349ae82f40c8ae2d3957515a7d59b87a17159c54db5179f9f6d87cf31c59",
            ),
            (
                "",
                "",
                "",
                "",
                "",
                "4d371300405e60964929c8ce9245ee227627fbd64a86efb9939f5b28816cf920",
            ),
            (
                GENESIS_HASH,
                &long,
                &long,
                &long,
                &long,
                "c3386798025864252eb8e66b53557028a30c2c98bb8ef4ac2a0527a52af8d31e",
            ),
        ] {
            assert_eq!(
                event_hash(prev, id, 7, ts, kind, 1, payload),
                expected,
                "{kind}"
            );
        }
    }
}
