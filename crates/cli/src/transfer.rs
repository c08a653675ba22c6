//! `nerve export ID` and `nerve import FILE`: moving an execution between logs (SQLite or
//! PostgreSQL, either way) as JSON Lines. An import is checked whole before anything is
//! written; a damaged or reordered file is refused naming its first bad line (exit 2).

use std::io::BufRead;
use std::path::Path;

use nerve_core::ExecutionId;
use nerve_session::{Store, parse_log, write_log};

use crate::{Failure, output};
use nerve_runtime::log::{self, reader};

pub(crate) async fn export(db: &Path, id: &str) -> Result<u8, Failure> {
    let execution: ExecutionId = id.parse().map_err(Failure::usage)?;
    let exported = reader(db)
        .await?
        .export(execution)
        .await
        .map_err(Failure::usage)?;
    output::write_with(|out| write_log(&exported, out))
        .map_err(|e| Failure::runtime(format!("cannot write the export: {e}")))?;
    Ok(0)
}

pub(crate) async fn import(db: &Path, file: &Path) -> Result<u8, Failure> {
    let shown = file.display();
    let mut input: Box<dyn BufRead> = if file.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        let opened = std::fs::File::open(file)
            .map_err(|e| Failure::usage(format!("cannot open {shown}: {e}")))?;
        Box::new(std::io::BufReader::new(opened))
    };
    let parsed = parse_log(&mut input).map_err(|e| Failure::usage(format!("{shown}: {e}")))?;
    let (id, count) = (parsed.execution_id.clone(), parsed.events.len());
    if log::is_postgres(db) {
        let store = log::writer(db, std::sync::Arc::new(nerve_core::Redactor::new())).await?;
        store.import(parsed).await.map_err(Failure::usage)?;
    } else {
        // A writing connection of its own; no writer thread is needed for one transaction.
        let db = db.to_path_buf();
        tokio::task::spawn_blocking(move || Store::open(&db)?.import(&parsed))
            .await
            .map_err(|e| Failure::runtime(format!("the import stopped: {e}")))?
            .map_err(Failure::usage)?;
    }
    output::line(&format!("imported execution {id}: {count} events"));
    Ok(0)
}
