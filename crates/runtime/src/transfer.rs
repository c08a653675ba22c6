//! Moving an execution between logs (SQLite or PostgreSQL, either way) as JSON Lines
//! (`nerve export`, `nerve import`). An import is checked whole before anything is written;
//! a damaged or reordered file is refused naming its first bad line.

use std::io::{BufRead, Write};
use std::path::Path;

use nerve_core::ExecutionId;
use nerve_session::{ExecutionLog, Store, parse_log, write_log};

use crate::RuntimeError;
use crate::log;

/// Execution `id` of the log at `db`, whole: events, hashes, snapshots, archive.
pub async fn export(db: &Path, id: &str) -> Result<ExecutionLog, RuntimeError> {
    let execution: ExecutionId = id.parse().map_err(RuntimeError::usage)?;
    Ok(log::reader(db).await?.export(execution).await?)
}

/// Writes an exported execution as JSON Lines.
pub fn write(exported: &ExecutionLog, out: &mut dyn Write) -> std::io::Result<()> {
    write_log(exported, out)
}

/// Reads and checks an exported execution from `input` (named `shown` in errors).
pub fn read(input: &mut dyn BufRead, shown: &str) -> Result<ExecutionLog, RuntimeError> {
    parse_log(input).map_err(|e| RuntimeError::usage(format!("{shown}: {e}")))
}

/// Loads a checked export into the log at `db`; the execution's id and its event count.
pub async fn import(db: &Path, exported: ExecutionLog) -> Result<(String, usize), RuntimeError> {
    let (id, count) = (exported.execution_id.clone(), exported.events.len());
    if log::is_postgres(db) {
        let store = log::writer(db, std::sync::Arc::new(nerve_core::Redactor::new())).await?;
        store.import(exported).await?;
    } else {
        // A writing connection of its own; no writer thread is needed for one transaction.
        let db = db.to_path_buf();
        tokio::task::spawn_blocking(move || Store::open(&db)?.import(&exported))
            .await
            .map_err(|e| RuntimeError::failed(format!("the import stopped: {e}")))??;
    }
    Ok((id, count))
}
