//! What every front end renders of an execution, made once here: the transcript a person
//! reads (`transcript`: lines of plain text from the events, and the key argument and
//! clipped outcome of a tool call that a live display shows too) and the JSON Lines a
//! program reads (`jsonl`). Pure functions of the events; a front end writes them.

pub mod json;
pub mod jsonl;
pub mod transcript;
