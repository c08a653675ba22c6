//! The runtime's one error type. Every variant carries the whole one-line message a person
//! reads (the front end adds nothing but its own prefix), and a [`kind`](RuntimeError::kind)
//! that a front end maps onto its own vocabulary: the CLI's exit codes, an HTTP status, an
//! editor's error code.

/// Why a runtime call failed. The message is the variant's text, unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// What the front end was asked does not work: a missing or empty task, a workspace
    /// that is not a directory, an id that is not one, an amount that is not a price.
    /// Returned by the settings and launch calls before anything starts. The user's input;
    /// retrying the same request fails the same way.
    #[error("{0}")]
    Usage(String),
    /// The configuration file cannot be read or means nothing valid: an unknown key, a
    /// limit out of range, a policy pattern that is no regex, a proxy rule whose secret is
    /// missing, an MCP server configured twice. Returned by `config::Config::load` and
    /// the settings it yields. The user's input; not retryable until the file changes.
    #[error("{0}")]
    Config(String),
    /// The log, or an execution in it, does not exist: no SQLite file at the path, an id
    /// no execution has. Returned by the log and resume calls. The user's input, as a rule
    /// (a mistyped id or `--db`); not retryable.
    #[error("{0}")]
    NotFound(String),
    /// The execution exists but its state refuses the request: it waits for an approval,
    /// ended in a way that cannot be resumed, is held by a worker, was resumed too often,
    /// or its workspace changed outside it. Returned by the resume, approve, rewind and
    /// queue calls. Not the input's fault as such; retryable once the state changes (an
    /// approval decided, a worker done).
    #[error("{0}")]
    Conflict(String),
    /// The provider cannot be built or reached: an unknown spec, a key that is not set, a
    /// base URL that is no URL, an endpoint that does not answer the pre-flight check.
    /// Returned by `provider::build` before anything is written. The user's settings, except
    /// an unreachable endpoint, which is retryable once the server is up.
    #[error("{0}")]
    Provider(String),
    /// The sandbox cannot start: no Docker engine, an image that cannot be built or
    /// found, no usable executor, a container that cannot be created. Returned by the
    /// launch before the log is written. The machine's state rather than the input;
    /// retryable once the engine is reachable.
    #[error("{0}")]
    Sandbox(String),
    /// The log cannot be opened or read: a locked or damaged SQLite file, an unreachable
    /// PostgreSQL server, a hash chain that does not verify. Returned by the log and resume
    /// calls before anything is appended. Retryable when the server was unreachable, not
    /// when the log is damaged.
    #[error("{0}")]
    Log(String),
    /// The engine refused to start or continue the execution (an invalid task, a state it
    /// cannot take up). Returned by the launch. Not retryable as it is.
    #[error("{0}")]
    Engine(String),
    /// An operation that changes state failed part way, after it began: an append to the
    /// log, a restore of the workspace, a change to the task queue, a container removal.
    /// What was done before stays done; retrying may help (the cause is usually I/O).
    #[error("{0}")]
    Failed(String),
}

/// [`RuntimeError`]'s variants without their messages, for a front end's mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    Usage,
    Config,
    NotFound,
    Conflict,
    Provider,
    Sandbox,
    Log,
    Engine,
    Failed,
}

impl ErrorKind {
    /// Whether the request (a flag, an id, the configuration file) is what must change.
    pub const fn is_user_input(self) -> bool {
        match self {
            Self::Usage | Self::Config | Self::NotFound => true,
            Self::Conflict
            | Self::Provider
            | Self::Sandbox
            | Self::Log
            | Self::Engine
            | Self::Failed => false,
        }
    }

    /// Whether nothing was changed when the error was returned: the request was refused
    /// before anything was written (the CLI's exit 2), as opposed to failing part way
    /// (exit 1).
    pub const fn refused_before_start(self) -> bool {
        match self {
            Self::Usage
            | Self::Config
            | Self::NotFound
            | Self::Conflict
            | Self::Provider
            | Self::Sandbox
            | Self::Log
            | Self::Engine => true,
            Self::Failed => false,
        }
    }
}

impl RuntimeError {
    /// The variant, for a front end's mapping.
    pub const fn kind(&self) -> ErrorKind {
        match self {
            Self::Usage(_) => ErrorKind::Usage,
            Self::Config(_) => ErrorKind::Config,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Conflict(_) => ErrorKind::Conflict,
            Self::Provider(_) => ErrorKind::Provider,
            Self::Sandbox(_) => ErrorKind::Sandbox,
            Self::Log(_) => ErrorKind::Log,
            Self::Engine(_) => ErrorKind::Engine,
            Self::Failed(_) => ErrorKind::Failed,
        }
    }

    /// The one-line message (the same text as `Display`).
    pub fn message(&self) -> &str {
        match self {
            Self::Usage(message)
            | Self::Config(message)
            | Self::NotFound(message)
            | Self::Conflict(message)
            | Self::Provider(message)
            | Self::Sandbox(message)
            | Self::Log(message)
            | Self::Engine(message)
            | Self::Failed(message) => message,
        }
    }

    /// A [`RuntimeError::Usage`] from anything displayable.
    pub fn usage(message: impl std::fmt::Display) -> Self {
        Self::Usage(message.to_string())
    }

    /// A [`RuntimeError::Config`] from anything displayable.
    pub fn config(message: impl std::fmt::Display) -> Self {
        Self::Config(message.to_string())
    }

    /// A [`RuntimeError::Conflict`] from anything displayable.
    pub fn conflict(message: impl std::fmt::Display) -> Self {
        Self::Conflict(message.to_string())
    }

    /// A [`RuntimeError::Provider`] from anything displayable.
    pub fn provider(message: impl std::fmt::Display) -> Self {
        Self::Provider(message.to_string())
    }

    /// A [`RuntimeError::Sandbox`] from anything displayable.
    pub fn sandbox(message: impl std::fmt::Display) -> Self {
        Self::Sandbox(message.to_string())
    }

    /// A [`RuntimeError::Log`] from anything displayable.
    pub fn log(message: impl std::fmt::Display) -> Self {
        Self::Log(message.to_string())
    }

    /// A [`RuntimeError::Failed`] from anything displayable.
    pub fn failed(message: impl std::fmt::Display) -> Self {
        Self::Failed(message.to_string())
    }
}

/// An error of the log, by what it says about the request: an unknown execution is
/// [`RuntimeError::NotFound`], anything else [`RuntimeError::Log`].
impl From<nerve_session::SessionError> for RuntimeError {
    fn from(error: nerve_session::SessionError) -> Self {
        if let nerve_session::SessionError::UnknownExecution(_) = &error {
            Self::NotFound(error.to_string())
        } else {
            Self::Log(error.to_string())
        }
    }
}

/// An I/O error as a few words for a one-line message.
pub fn describe_io(error: &std::io::Error) -> String {
    // An if-chain, not a match: io::ErrorKind is non-exhaustive.
    if error.kind() == std::io::ErrorKind::NotFound {
        "does not exist".to_owned()
    } else if error.kind() == std::io::ErrorKind::PermissionDenied {
        "permission denied".to_owned()
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(error: RuntimeError, kind: ErrorKind, user: bool, refused: bool) {
        assert_eq!(error.kind(), kind, "{error:?}");
        assert_eq!(error.kind().is_user_input(), user, "{error:?}");
        assert_eq!(error.kind().refused_before_start(), refused, "{error:?}");
        // The message is the whole text, unchanged.
        assert_eq!(error.to_string(), error.message());
        assert_eq!(error.message(), "the text");
    }

    #[test]
    fn every_kind_says_whose_it_is_and_whether_anything_changed() {
        check(
            RuntimeError::usage("the text"),
            ErrorKind::Usage,
            true,
            true,
        );
        check(
            RuntimeError::config("the text"),
            ErrorKind::Config,
            true,
            true,
        );
        check(
            RuntimeError::NotFound("the text".into()),
            ErrorKind::NotFound,
            true,
            true,
        );
        check(
            RuntimeError::conflict("the text"),
            ErrorKind::Conflict,
            false,
            true,
        );
        check(
            RuntimeError::provider("the text"),
            ErrorKind::Provider,
            false,
            true,
        );
        check(
            RuntimeError::sandbox("the text"),
            ErrorKind::Sandbox,
            false,
            true,
        );
        check(RuntimeError::log("the text"), ErrorKind::Log, false, true);
        check(
            RuntimeError::Engine("the text".into()),
            ErrorKind::Engine,
            false,
            true,
        );
        check(
            RuntimeError::failed("the text"),
            ErrorKind::Failed,
            false,
            false,
        );
    }

    #[test]
    fn an_unknown_execution_is_not_found_and_other_log_errors_are_the_log() {
        let unknown: RuntimeError =
            nerve_session::SessionError::UnknownExecution("x".into()).into();
        assert_eq!(unknown.kind(), ErrorKind::NotFound);
        let other: RuntimeError = nerve_session::SessionError::Corrupt("bad".into()).into();
        assert_eq!(other.kind(), ErrorKind::Log);
        assert_eq!(other.message(), "event log record is corrupt: bad");
    }
}
