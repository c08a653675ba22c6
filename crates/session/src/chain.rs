//! The hash chain: each event's hash covers the previous hash and every stored field, so
//! editing, removing or reordering any event breaks verification from that point on.

use ring::digest::{Context, SHA256};

/// The `prev_hash` of an execution's first event.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// A verification failure, naming the first bad sequence number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hash chain broken at sequence {seq}: {reason}")]
pub struct ChainError {
    pub seq: u64,
    pub reason: String,
}

/// The hex SHA-256 of one event, chained to `prev_hash`. Every field is length-prefixed so
/// that no two different events can frame to the same bytes.
pub(crate) fn event_hash(
    prev_hash: &str,
    execution_id: &str,
    seq: u64,
    ts: &str,
    kind: &str,
    version: u32,
    payload: &str,
) -> String {
    let mut ctx = Context::new(&SHA256);
    for field in [prev_hash.as_bytes(), execution_id.as_bytes()] {
        ctx.update(&(field.len() as u64).to_le_bytes());
        ctx.update(field);
    }
    ctx.update(&seq.to_le_bytes());
    for field in [ts.as_bytes(), kind.as_bytes()] {
        ctx.update(&(field.len() as u64).to_le_bytes());
        ctx.update(field);
    }
    ctx.update(&version.to_le_bytes());
    ctx.update(&(payload.len() as u64).to_le_bytes());
    ctx.update(payload.as_bytes());
    hex::encode(ctx.finish().as_ref())
}
