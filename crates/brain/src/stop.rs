//! Why a loop stopped: the value every guardrail and every part of a running execution
//! returns as its error, carried up to the engine, which records it as the finish.

use nerve_core::{SinkError, TerminationReason};

/// Why a loop stopped; carried out of the guardrail checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stop {
    pub(crate) reason: TerminationReason,
    pub(crate) error: Option<String>,
    /// The event log refused a write: the engine records nothing more (no transition, no
    /// finish), so the log stays the committed prefix of a crashed run, which `resume`
    /// continues; a finish squeezed in after a lost batch would leave a hole before it.
    pub(crate) log_failed: bool,
}

impl Stop {
    pub(crate) fn new(reason: TerminationReason, error: impl Into<String>) -> Self {
        Self {
            reason,
            error: Some(error.into()),
            log_failed: false,
        }
    }

    pub(crate) fn completed() -> Self {
        Self {
            reason: TerminationReason::Completed,
            error: None,
            log_failed: false,
        }
    }

    pub(crate) fn shutdown() -> Self {
        Self {
            reason: TerminationReason::Shutdown,
            error: None,
            log_failed: false,
        }
    }
}

impl From<SinkError> for Stop {
    fn from(error: SinkError) -> Self {
        Self {
            log_failed: true,
            ..Self::new(TerminationReason::Error, error.to_string())
        }
    }
}
