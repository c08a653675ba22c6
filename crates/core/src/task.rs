//! The task status state machine. Illegal transitions are typed errors, never silent.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    Created,
    Assigned,
    InProgress,
    /// The agent says it is done; a reviewer decides.
    InReview,
    Completed,
    Failed,
    /// Stopped without a checkpoint (shutdown, crash); resumable.
    Interrupted,
    /// Stopped with a checkpoint; resumable from it.
    Suspended,
    Cancelled,
}

/// Resumes of one execution allowed: a run that keeps crashing or failing needs a human,
/// not another attempt. Every way back to work after a stop (`interrupted`, `suspended` or
/// `failed` -> `in_progress`) is one attempt of these.
pub const MAX_RESUMES: u32 = 3;

/// Whether resume number `attempt` (1 for the first) of a task in `status` may take it up
/// again: within [`MAX_RESUMES`], and from a status a stop leaves behind (`interrupted`,
/// `suspended`, `failed`) or a crash does (`assigned`, `in_progress`). A task in review,
/// completed or cancelled is not taken up by a resume.
pub const fn may_resume(status: TaskStatus, attempt: u32) -> bool {
    use TaskStatus::{
        Assigned, Cancelled, Completed, Created, Failed, InProgress, InReview, Interrupted,
        Suspended,
    };
    attempt >= 1
        && attempt <= MAX_RESUMES
        && match status {
            Assigned | InProgress | Interrupted | Suspended | Failed => true,
            Created | InReview | Completed | Cancelled => false,
        }
}

/// Returned by [`TaskStatus::transition`] when the move is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal task transition {from} -> {to}")]
pub struct TransitionError {
    pub from: TaskStatus,
    pub to: TaskStatus,
}

impl TaskStatus {
    pub const ALL: [Self; 9] = [
        Self::Created,
        Self::Assigned,
        Self::InProgress,
        Self::InReview,
        Self::Completed,
        Self::Failed,
        Self::Interrupted,
        Self::Suspended,
        Self::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Assigned => "assigned",
            Self::InProgress => "in_progress",
            Self::InReview => "in_review",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Interrupted => "interrupted",
            Self::Suspended => "suspended",
            Self::Cancelled => "cancelled",
        }
    }

    /// No transition leaves a terminal status.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Cancelled)
    }

    /// Whether `self -> to` is a legal move.
    ///
    /// Interrupted, suspended and failed tasks may go back to work (resume, reassignment);
    /// a review may send a task back to `in_progress` for rework. `failed -> in_progress`
    /// is a resume taking the task up again after an error ending (a provider outage, a
    /// full disk): recorded as a `task_transition` like any other move, and bounded by
    /// [`MAX_RESUMES`], since the resume attempts of an execution are.
    pub const fn can_transition_to(self, to: Self) -> bool {
        use TaskStatus::{
            Assigned, Cancelled, Completed, Created, Failed, InProgress, InReview, Interrupted,
            Suspended,
        };
        match self {
            Created => matches!(to, Assigned | Cancelled),
            Assigned => matches!(to, InProgress | Cancelled | Failed),
            InProgress => matches!(
                to,
                InReview | Completed | Failed | Interrupted | Suspended | Cancelled
            ),
            InReview => matches!(to, Completed | InProgress | Failed | Cancelled),
            Interrupted | Suspended => matches!(to, Assigned | InProgress | Failed | Cancelled),
            Failed => matches!(to, Assigned | InProgress | Cancelled),
            Completed | Cancelled => false,
        }
    }

    /// The status after moving to `to`, or the typed reason it is illegal.
    pub fn transition(self, to: Self) -> Result<Self, TransitionError> {
        if self.can_transition_to(to) {
            Ok(to)
        } else {
            Err(TransitionError { from: self, to })
        }
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(from: TaskStatus, to: TaskStatus, legal: bool) {
        assert_eq!(from.transition(to).is_ok(), legal, "{from} -> {to}");
    }

    #[test]
    fn the_happy_path_is_legal() {
        use TaskStatus::*;
        for (from, to) in [
            (Created, Assigned),
            (Assigned, InProgress),
            (InProgress, InReview),
            (InReview, Completed),
            (InProgress, Interrupted),
            (Interrupted, InProgress),
            (InProgress, Suspended),
            (Suspended, InProgress),
            (InProgress, Failed),
            (Failed, Assigned),
            (Failed, InProgress),
            (InReview, InProgress),
        ] {
            check(from, to, true);
        }
    }

    #[test]
    fn illegal_moves_are_typed_errors() {
        use TaskStatus::*;
        for (from, to) in [
            (Created, InProgress),
            (Created, Completed),
            (Completed, InProgress),
            (Cancelled, Assigned),
            (Assigned, InReview),
            (InProgress, InProgress),
        ] {
            check(from, to, false);
        }
        let err = TaskStatus::Completed
            .transition(TaskStatus::InProgress)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "illegal task transition completed -> in_progress"
        );
    }

    #[test]
    fn a_resume_takes_up_stopped_and_failed_tasks_within_the_bound() {
        use TaskStatus::*;
        for status in [Assigned, InProgress, Interrupted, Suspended, Failed] {
            assert!(
                status == InProgress || status.can_transition_to(InProgress),
                "{status}"
            );
            for attempt in 1..=MAX_RESUMES {
                assert!(may_resume(status, attempt), "{status} attempt {attempt}");
            }
            assert!(!may_resume(status, 0), "{status} attempt 0");
            assert!(
                !may_resume(status, MAX_RESUMES + 1),
                "{status} attempt {}",
                MAX_RESUMES + 1
            );
        }
        for status in [Created, InReview, Completed, Cancelled] {
            assert!(!may_resume(status, 1), "{status}");
        }
    }

    #[test]
    fn terminal_statuses_have_no_way_out() {
        for from in TaskStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in TaskStatus::ALL {
                check(from, to, false);
            }
        }
    }
}
