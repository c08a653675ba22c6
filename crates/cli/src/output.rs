//! The only place that writes to stdout and stderr. A closed pipe (`nerve list | head`) is
//! not an error.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::Write;

/// Writes one line to stdout; a broken pipe is ignored.
pub(crate) fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// Writes one line to stderr.
pub(crate) fn error_line(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// Writes a JSON value as one line of stdout.
pub(crate) fn json(value: &serde_json::Value) {
    line(&value.to_string());
}
