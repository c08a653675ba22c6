//! Why a loop stopped: the value every guardrail and every part of a running execution
//! returns as its error, carried up to the engine, which records it as the finish.

use nerve_core::{SinkError, TerminationReason};

/// Why a loop stopped; carried out of the guardrail checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stop {
    pub(crate) reason: TerminationReason,
    pub(crate) error: Option<String>,
}

impl Stop {
    pub(crate) fn new(reason: TerminationReason, error: impl Into<String>) -> Self {
        Self {
            reason,
            error: Some(error.into()),
        }
    }

    pub(crate) fn completed() -> Self {
        Self {
            reason: TerminationReason::Completed,
            error: None,
        }
    }

    pub(crate) fn shutdown() -> Self {
        Self {
            reason: TerminationReason::Shutdown,
            error: None,
        }
    }
}

impl From<SinkError> for Stop {
    fn from(error: SinkError) -> Self {
        Self::new(TerminationReason::Error, error.to_string())
    }
}
