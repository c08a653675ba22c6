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

/// Hands stdout to `write` (a whole export); a broken pipe is not an error.
pub(crate) fn write_with(
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
