//! The executor's error type: every variant becomes the one-line `error` of a response.
//!
//! All variants are returned by the request handlers and reach the model through the host;
//! none is fatal to the executor, which keeps serving. "Retryable" below means the same
//! request can succeed later without the model changing it.

use std::io;

/// Why a request failed. `Display` is the message the model sees: the problem, then the path.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request line is not a valid request (bad JSON, unknown op, missing field, too long).
    /// Returned by the server loop. Not retryable.
    #[error("malformed request: {0}")]
    Malformed(String),

    /// A field has a value the executor refuses (e.g. `timeout_ms: 0`). Not retryable.
    #[error("invalid request: {0}")]
    Invalid(String),

    /// The path leaves the workspace lexically (`..`, an absolute path elsewhere) or through a
    /// symlink. Returned by every file op and by `exec`'s `workdir`. Not retryable.
    #[error("path escapes the workspace: {path}")]
    Escapes {
        /// The path as the request gave it.
        path: String,
    },

    /// A symlink could not be followed safely: a loop or a magic link, or any symlink when the
    /// kernel lacks `openat2` and paths are walked one component at a time. Not retryable.
    #[error("cannot follow symlink in path: {path}")]
    Symlink {
        /// The path as the request gave it.
        path: String,
    },

    /// Nothing exists at the path (or at one of its parents). Retryable once it exists.
    #[error("no such file or directory: {path}")]
    NotFound {
        /// The path as the request gave it.
        path: String,
    },

    /// A component that must be a directory is not one. Not retryable.
    #[error("not a directory: {path}")]
    NotADirectory {
        /// The path as the request gave it.
        path: String,
    },

    /// File ops work on regular files only: a directory, FIFO, socket or device is refused
    /// without being opened for I/O. Not retryable.
    #[error("not a regular file ({kind}): {path}")]
    NotRegular {
        /// The path as the request gave it.
        path: String,
        /// `directory`, `fifo`, `socket`, `character device`, `block device`, `symlink`.
        kind: &'static str,
    },

    /// The file or the content to write exceeds the executor's size cap. Not retryable.
    #[error("too large ({size} bytes, the limit is {limit}): {path}")]
    TooLarge {
        /// The path as the request gave it.
        path: String,
        /// The size found or asked for.
        size: u64,
        /// The cap.
        limit: u64,
    },

    /// `read_file` or `edit_file` on a file with NUL bytes in its first 8 KiB. Not retryable.
    #[error("binary file: {path}")]
    Binary {
        /// The path as the request gave it.
        path: String,
    },

    /// `edit_file` on a file that is not UTF-8. Not retryable.
    #[error("not valid UTF-8 text: {path}")]
    NotUtf8 {
        /// The path as the request gave it.
        path: String,
    },

    /// `edit_file`'s `old_text` does not occur (or is empty). The model should re-read the
    /// file, or copy the most similar lines the hint shows.
    #[error("old_text not found in {path}{hint}")]
    NoMatch {
        /// The path as the request gave it.
        path: String,
        /// Empty, or where the most similar text is (`closest::hint`), on the same line.
        hint: String,
    },

    /// `edit_file`'s `old_text` occurs more than once and `replace_all` is false.
    #[error("old_text matches {count} times in {path}; pass replace_all or give more context")]
    AmbiguousMatch {
        /// The path as the request gave it.
        path: String,
        /// How many non-overlapping occurrences there are.
        count: u64,
    },

    /// `grep`'s pattern or glob does not compile. Not retryable.
    #[error("invalid {what}: {message}")]
    Pattern {
        /// `regex` or `glob`.
        what: &'static str,
        /// The compiler's explanation, on one line.
        message: String,
    },

    /// `exec` could not start the shell. Retryable only if the sandbox changes.
    #[error("cannot start {shell}: {source}")]
    Spawn {
        /// The shell's path.
        shell: String,
        /// What `spawn` reported.
        source: io::Error,
    },

    /// Any other I/O failure, e.g. permission denied or a full disk. Sometimes retryable.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. `cannot read`.
        action: &'static str,
        /// The path as the request gave it.
        path: String,
        /// The operating system's error.
        source: io::Error,
    },
}

impl Error {
    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(action: &'static str, path: &str, source: impl Into<io::Error>) -> Self {
        Self::Io {
            action,
            path: path.to_owned(),
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(error: Error, expected: &str) {
        assert_eq!(error.to_string(), expected);
    }

    #[test]
    fn messages_name_the_problem_then_the_path() {
        check(
            Error::Escapes {
                path: "../etc/passwd".into(),
            },
            "path escapes the workspace: ../etc/passwd",
        );
        check(
            Error::NotRegular {
                path: "fifo".into(),
                kind: "fifo",
            },
            "not a regular file (fifo): fifo",
        );
        check(
            Error::AmbiguousMatch {
                path: "a.rs".into(),
                count: 3,
            },
            "old_text matches 3 times in a.rs; pass replace_all or give more context",
        );
        check(
            Error::TooLarge {
                path: "big".into(),
                size: 20,
                limit: 10,
            },
            "too large (20 bytes, the limit is 10): big",
        );
        check(
            Error::io(
                "cannot read",
                "a",
                io::Error::from(io::ErrorKind::PermissionDenied),
            ),
            "cannot read a: permission denied",
        );
    }
}
