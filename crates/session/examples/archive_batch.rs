//! What one write per compaction saves: `N` archive blocks (default 1,340, the outputs one
//! mask of the 1M-token conversation of `compaction_speed` archives; about 1 KB each) into a
//! fresh `SqliteSink`, one `archive` call each (as compactions did before
//! `ContextArchive::archive_many`) and then in one `archive_many`, three rounds. Every
//! `archive` is its own durable write (a WAL flush), so the first grows with `N` flushes.
//!
//! `cargo run --release -p nerve-session --example archive_batch [N]`; figures in
//! docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::print_stdout)] // A measurement printing its lines.
use nerve_core::{ArchivedBlock, BlockId, ContextArchive, ExecutionId, Message, Redactor};
use nerve_session::SqliteSink;
use std::sync::Arc;
use std::time::Instant;

/// `n` blocks of about 1 KB, ids in time order.
fn blocks(n: usize) -> Vec<ArchivedBlock> {
    BlockId::batch(n)
        .into_iter()
        .enumerate()
        .map(|(i, id)| ArchivedBlock {
            id,
            messages: vec![Message::user(format!("output {i}: ").repeat(100))],
            note: format!("output of shell masked at turn {i}"),
        })
        .collect()
}

fn main() {
    let n: usize = std::env::args().nth(1).map_or(1340, |a| a.parse().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for round in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let sink = SqliteSink::open(&dir.path().join("a.db"), Arc::new(Redactor::new())).unwrap();
        let id = ExecutionId::new();
        let one = blocks(n);
        let t = Instant::now();
        rt.block_on(async {
            for b in one {
                sink.archive(id, b).await.unwrap();
            }
        });
        let single = t.elapsed();
        let many = blocks(n);
        let t = Instant::now();
        rt.block_on(sink.archive_many(id, many)).unwrap();
        let batch = t.elapsed();
        println!(
            "round {round}: {n} blocks one by one {:.1} ms, archive_many {:.1} ms, ratio {:.1}x",
            single.as_secs_f64() * 1e3,
            batch.as_secs_f64() * 1e3,
            single.as_secs_f64() / batch.as_secs_f64()
        );
    }
}
