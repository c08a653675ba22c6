//! The only place that writes to stdout and stderr. A closed pipe (`nerve list | head`) is
//! not an error.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::ffi::OsStr;
use std::io::{IsTerminal, Write};

/// Writes one line to stdout; a broken pipe is ignored.
pub(crate) fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

/// Writes `text` to stdout as it is (the live transcript: streamed text, the status line's
/// redraws) and flushes; a broken pipe is ignored.
pub(crate) fn raw(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
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

/// Whether stderr may carry colour: only on a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>). Everything else on stderr and
/// stdout is plain text, so nothing sent down a pipe holds an escape sequence.
pub(crate) fn stderr_colour() -> bool {
    colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Whether stdout may carry colour (the live transcript): the same rule as stderr's.
pub(crate) fn stdout_colour() -> bool {
    colour(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn colour(terminal: bool, no_color: Option<&OsStr>) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        for (terminal, no_color, expected) in [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false),
            (false, None, false),
            (false, Some("1"), false),
        ] {
            assert_eq!(
                colour(terminal, no_color.map(OsStr::new)),
                expected,
                "terminal {terminal}, NO_COLOR {no_color:?}"
            );
        }
    }
}
