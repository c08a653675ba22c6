//! Workspace snapshots at turn boundaries (docs/checkpoints.md): the run's side of the
//! [`WorkspaceSnapshots`] port. After the start (turn 0) and after every turn, the
//! workspace is recorded; a `workspace_snapshot` event is written when its tree differs
//! from the last one the log names. At a resume or a person's next message, a workspace
//! that changed since then is recorded as changes made outside the execution, and the
//! model is told which paths differ.
//!
//! The snapshot is taken before its event is recorded, and the event goes through the
//! journal like every other: a crash between the two leaves a tree in the store that no
//! event names (harmless), never an event naming a tree the store lacks.
//!
//! A failing snapshot does not stop the run (it is the workspace's history, not the
//! execution's): it is logged, and the next boundary tries again.
//!
//! A turn whose tool calls all only read ([`nerve_core::ToolExecutor::may_change_workspace`]
//! says no for each, and a turn without calls) takes no snapshot: the agent cannot have
//! changed the workspace, since a command's background jobs die with it (the executor kills
//! its process group). What such a turn could miss (a process that left its group, a person
//! editing on the host) is in the next snapshot, or is told as a change outside the execution
//! at a resume or the next message. So a turn that reads costs nothing here, whatever the
//! workspace's size.

use std::fmt::Write as _;
use std::sync::Arc;

use nerve_core::event::{ChangeKind, WorkspaceChange, WorkspaceSnapshot};
use nerve_core::{Event, WorkspaceSnapshots};

use crate::run::journal::Journal;

/// Paths named to the model when the workspace changed outside the execution; the rest
/// are counted.
const LISTED_PATHS: usize = 20;

/// The snapshot port of a run and the tree the log last named.
pub(crate) struct WorkspaceTracker {
    port: Option<Arc<dyn WorkspaceSnapshots>>,
    tree: Option<String>,
}

impl WorkspaceTracker {
    /// `tree`: the workspace as the log last recorded it (none for a fresh run or a log
    /// written before snapshots).
    pub(crate) fn new(port: Option<Arc<dyn WorkspaceSnapshots>>, tree: Option<String>) -> Self {
        Self { port, tree }
    }

    /// Records the workspace after `turn` (0: as the run found it) when it changed; nothing
    /// to do when the turn could not change it (`may_have_changed` false).
    pub(crate) async fn after_turn(
        &mut self,
        journal: &mut Journal,
        turn: u32,
        may_have_changed: bool,
    ) {
        if !may_have_changed {
            return;
        }
        let Some(tree) = self.take().await else {
            return;
        };
        if self.tree.as_ref() != Some(&tree) {
            journal.record(Event::WorkspaceSnapshot(WorkspaceSnapshot {
                turn,
                tree: tree.clone(),
                outside: Vec::new(),
            }));
            self.tree = Some(tree);
        }
    }

    /// Compares the workspace with the last snapshot before the execution goes on after
    /// `turn`; when it changed, records it (with the changed paths) and returns what to
    /// tell the model. A log without a snapshot gets its first one here, and no message.
    pub(crate) async fn reconcile(&mut self, journal: &mut Journal, turn: u32) -> Option<String> {
        let tree = self.take().await?;
        let Some(last) = self.tree.clone() else {
            self.after_turn(journal, turn, true).await;
            return None;
        };
        if last == tree {
            return None;
        }
        let port = self.port.as_ref()?;
        let changes = match port.changes(&last, &tree).await {
            Ok(changes) => changes,
            Err(error) => {
                tracing::warn!(%error, "cannot compare the workspace with its last snapshot");
                return None;
            }
        };
        let message = (!changes.is_empty()).then(|| changed_outside(turn, &changes));
        journal.record(Event::WorkspaceSnapshot(WorkspaceSnapshot {
            turn,
            tree: tree.clone(),
            outside: changes,
        }));
        self.tree = Some(tree);
        message
    }

    async fn take(&self) -> Option<String> {
        let port = self.port.as_ref()?;
        match port.snapshot().await {
            Ok(tree) => Some(tree),
            Err(error) => {
                tracing::warn!(%error, "workspace snapshot skipped");
                None
            }
        }
    }
}

/// What the model is told when the workspace changed outside its turns.
pub(crate) fn changed_outside(turn: u32, changes: &[WorkspaceChange]) -> String {
    let mut text = format!(
        "[Nerve] The workspace changed since its last snapshot (after turn {turn}), outside your tool calls:"
    );
    for kind in [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted] {
        let paths: Vec<&str> = changes
            .iter()
            .filter(|c| c.change == kind)
            .map(|c| c.path.as_str())
            .collect();
        if paths.is_empty() {
            continue;
        }
        let _ = write!(
            text,
            " {} {}",
            kind.as_str(),
            paths
                .iter()
                .take(LISTED_PATHS)
                .copied()
                .collect::<Vec<_>>()
                .join(", ")
        );
        if paths.len() > LISTED_PATHS {
            let _ = write!(text, " and {} more", paths.len() - LISTED_PATHS);
        }
        text.push(';');
    }
    text.pop();
    text.push_str(". Read what you rely on again before changing it.");
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(change: ChangeKind, path: &str) -> WorkspaceChange {
        WorkspaceChange {
            change,
            path: path.into(),
        }
    }

    #[test]
    fn the_message_names_paths_by_kind_and_counts_the_rest() {
        let mut changes = vec![
            change(ChangeKind::Modified, "src/lib.rs"),
            change(ChangeKind::Deleted, "old.txt"),
            change(ChangeKind::Added, "notes/todo.md"),
        ];
        assert_eq!(
            changed_outside(4, &changes),
            "[Nerve] The workspace changed since its last snapshot (after turn 4), outside your tool calls: \
             added notes/todo.md; modified src/lib.rs; deleted old.txt. Read what you rely on again before changing it."
        );
        changes.retain(|c| c.change == ChangeKind::Added);
        changes.extend((0..25).map(|i| change(ChangeKind::Added, &format!("f{i}"))));
        let text = changed_outside(1, &changes);
        assert!(text.contains("f18 and 6 more."), "{text}");
    }
}
