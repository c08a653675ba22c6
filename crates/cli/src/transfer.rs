//! `nerve export ID` and `nerve import FILE`: moving an execution between logs (SQLite or
//! PostgreSQL, either way) as JSON Lines. An import is checked whole before anything is
//! written; a damaged or reordered file is refused naming its first bad line (exit 2).

use std::io::BufRead;
use std::path::Path;

use nerve_runtime::transfer;

use crate::{Failure, output};

pub(crate) async fn export(db: &Path, id: &str) -> Result<u8, Failure> {
    let exported = transfer::export(db, id).await?;
    output::write_with(|out| transfer::write(&exported, out))
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
    let parsed = transfer::read(&mut input, &shown.to_string())?;
    let (id, count) = transfer::import(db, parsed).await?;
    output::line(&format!("imported execution {id}: {count} events"));
    Ok(0)
}
