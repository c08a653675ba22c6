//! The workspace's history (docs/checkpoints.md): the snapshot store of each execution,
//! wired into the engine as its [`WorkspaceSnapshots`] port; and the diff and rewind of
//! `nerve diff`, `nerve rewind` and chat's `/diff` and `/undo`.
//!
//! The store of an execution is `checkpoints/<execution id>` beside the SQLite log (for a
//! PostgreSQL log, under the state directory where the default log lives; `$NERVE_CHECKPOINTS`
//! names another directory for them): outside the
//! workspace, and found again from the log's location and the execution's id alone. Which
//! tree was the workspace after which turn is read from the log's `workspace_snapshot` and
//! `workspace_rewound` events ([`nerve_session::WorkspaceHistory`]); the store only holds
//! the trees. Every git call blocks, so each runs on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use nerve_core::event::{ChangeKind, WorkspaceChange, WorkspaceRewound};
use nerve_core::{Event, ExecutionId, WorkspaceError, WorkspaceSnapshots};
use nerve_hands::checkpoint::{self, CheckpointConfig, Checkpoints, TreeHash};
use nerve_session::{Replay, WorkspaceHistory};

use crate::RuntimeError;

/// Names the directory that holds the executions' snapshot stores instead of
/// `checkpoints/` beside the log (another disk than the log's, say).
pub const CHECKPOINTS_ENV: &str = "NERVE_CHECKPOINTS";

/// Where `execution`'s snapshot store lives for the log at `db`.
pub fn store_dir(db: &Path, execution: ExecutionId) -> Result<PathBuf, RuntimeError> {
    if let Some(dir) = std::env::var_os(CHECKPOINTS_ENV).filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join(execution.to_string()));
    }
    Ok(crate::log::state_dir(db)?
        .join("checkpoints")
        .join(execution.to_string()))
}

/// The engine's snapshot port for `execution` on `workspace`, its store opened (created on
/// the first run). `None`, with the reason, when it cannot be: the run goes on without
/// snapshots.
pub async fn snapshots_for(
    db: &Path,
    execution: ExecutionId,
    workspace: &Path,
) -> Result<Arc<dyn WorkspaceSnapshots>, String> {
    let store = store_dir(db, execution).map_err(|e| e.to_string())?;
    // An absolute store: git runs with the workspace as its current directory.
    let store = std::path::absolute(&store).map_err(|e| e.to_string())?;
    let config = CheckpointConfig::new(store, workspace);
    let checkpoints = blocking(move || Checkpoints::open(config))
        .await
        .map_err(|e| e.to_string())?;
    Ok(Arc::new(ShadowWorkspace { checkpoints }))
}

/// The snapshot port on a shadow store.
struct ShadowWorkspace {
    checkpoints: Checkpoints,
}

#[async_trait]
impl WorkspaceSnapshots for ShadowWorkspace {
    async fn snapshot(&self) -> Result<String, WorkspaceError> {
        let checkpoints = self.checkpoints.clone();
        blocking(move || checkpoints.snapshot())
            .await
            .map(|tree| tree.to_string())
            .map_err(|f| WorkspaceError(f.to_string()))
    }

    async fn changes(&self, from: &str, to: &str) -> Result<Vec<WorkspaceChange>, WorkspaceError> {
        let checkpoints = self.checkpoints.clone();
        let (from, to) = (tree(from), tree(to));
        blocking(move || checkpoints.changes(&from?, &to?))
            .await
            .map(|changes| wire_changes(&changes))
            .map_err(|f| WorkspaceError(f.to_string()))
    }
}

/// A tree hash the log names.
fn tree(text: &str) -> Result<TreeHash, nerve_hands::HandsError> {
    TreeHash::parse(text)
}

/// Runs a blocking git operation off the async runtime; its error as a runtime failure.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, nerve_hands::HandsError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RuntimeError::failed(format!("workspace checkpoint: {e}")))?
        .map_err(RuntimeError::failed)
}

fn wire_changes(changes: &[checkpoint::Change]) -> Vec<WorkspaceChange> {
    let mut wire: Vec<WorkspaceChange> = changes
        .iter()
        .map(|c| WorkspaceChange {
            change: match c.kind {
                checkpoint::ChangeKind::Added => ChangeKind::Added,
                checkpoint::ChangeKind::Modified => ChangeKind::Modified,
                checkpoint::ChangeKind::Deleted => ChangeKind::Deleted,
            },
            path: c.path.clone(),
        })
        .collect();
    wire.sort_by(|a, b| a.path.cmp(&b.path));
    wire
}

/// An execution's snapshots: its history from the log and its store.
struct Opened {
    execution: ExecutionId,
    replay: Replay,
    checkpoints: Checkpoints,
}

impl Opened {
    fn history(&self) -> &WorkspaceHistory {
        &self.replay.workspace
    }

    /// The tree the workspace was after `turn`, or why there is none.
    fn after(&self, turn: u32) -> Result<TreeHash, RuntimeError> {
        let execution = self.execution;
        let total = self.replay.total_turns;
        if turn > total {
            return Err(RuntimeError::usage(format!(
                "execution {execution} has no turn {turn} (it has {total})"
            )));
        }
        match self.history().after.get(&turn) {
            Some(tree) => parse_logged(tree),
            None => Err(RuntimeError::NotFound(format!(
                "execution {execution} has no workspace snapshot at turn {turn} (its first is at turn {})",
                self.history().first.as_ref().map_or(0, |(t, _)| *t)
            ))),
        }
    }

    async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Checkpoints) -> Result<T, nerve_hands::HandsError> + Send + 'static,
    ) -> Result<T, RuntimeError> {
        let checkpoints = self.checkpoints.clone();
        blocking(move || work(&checkpoints)).await
    }
}

fn parse_logged(tree: &str) -> Result<TreeHash, RuntimeError> {
    TreeHash::parse(tree).map_err(|e| RuntimeError::log(format!("the log names a bad tree: {e}")))
}

/// Reads `id`'s verified log and opens its snapshot store, or says in one line why not.
/// A rewind needs the workspace (`writes`); a diff reads the store alone, so it works on
/// an execution whose workspace is gone.
async fn open(db: &Path, id: &str, writes: bool) -> Result<Opened, RuntimeError> {
    let (execution, _, replay) = crate::resume::load(db, id).await?;
    let Some(started) = &replay.started else {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} has no start event"
        )));
    };
    if replay.workspace.first.is_none() {
        return Err(RuntimeError::NotFound(format!(
            "execution {execution} has no workspace snapshots (its log predates them, or git was unavailable when it ran)"
        )));
    }
    let store = std::path::absolute(store_dir(db, execution)?)
        .map_err(|e| RuntimeError::usage(format!("cannot resolve the snapshot store: {e}")))?;
    if !store.join("HEAD").is_file() {
        return Err(RuntimeError::NotFound(format!(
            "the snapshot store of execution {execution} is missing ({}): its snapshots are gone",
            store.display()
        )));
    }
    let workspace = PathBuf::from(&started.workspace);
    if writes && !workspace.is_dir() {
        return Err(RuntimeError::conflict(format!(
            "the workspace of execution {execution} ({}) is not a directory any more",
            workspace.display()
        )));
    }
    let config = CheckpointConfig::new(store, workspace);
    let checkpoints = blocking(move || {
        if writes {
            Checkpoints::open(config)
        } else {
            Checkpoints::open_existing(config)
        }
    })
    .await
    .map_err(|e| RuntimeError::log(e.message()))?;
    Ok(Opened {
        execution,
        replay,
        checkpoints,
    })
}

/// What `diff` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// From the first snapshot to the workspace as the log last recorded it.
    Execution,
    /// What one turn changed.
    Turn(u32),
    /// What the last turn that changed the workspace changed.
    LastChange,
}

/// The diff `scope` names, or a line saying there is none.
pub async fn diff_text(db: &Path, id: &str, scope: Scope) -> Result<String, RuntimeError> {
    let opened = open(db, id, false).await?;
    let execution = opened.execution;
    let history = opened.history();
    // A rewind since the execution's last snapshot: the diff is what the execution did,
    // and a line says where the rewind left the workspace.
    let mut rewound = None;
    let (from, to, what) = match scope {
        Scope::Execution => {
            let (_, first) = history.first.clone().unwrap_or_default();
            let last = history
                .last_snapshot
                .clone()
                .or_else(|| history.current.clone())
                .unwrap_or_else(|| first.clone());
            if history.rewinds > 0 && history.current.as_ref() != Some(&last) {
                rewound = Some(history.position);
            }
            (first, last, format!("execution {execution}"))
        }
        Scope::Turn(turn) => {
            opened.after(turn)?;
            match history.changed.get(&turn) {
                Some((before, after)) => (before.clone(), after.clone(), format!("turn {turn}")),
                None => return Ok(format!("turn {turn} did not change the workspace")),
            }
        }
        Scope::LastChange => match history.changed.iter().next_back() {
            Some((turn, (before, after))) => {
                (before.clone(), after.clone(), format!("turn {turn}"))
            }
            None => return Ok("no turn changed the workspace".to_owned()),
        },
    };
    let (from, to) = (parse_logged(&from)?, parse_logged(&to)?);
    let text = opened.run(move |c| c.diff(&from, &to)).await?;
    let mut text = if text.is_empty() {
        format!("{what} left the workspace as it found it")
    } else {
        text.trim_end().to_owned()
    };
    if let Some(turn) = rewound {
        let state = if turn == 0 {
            "as the run found it".to_owned()
        } else {
            format!("as it was after turn {turn}")
        };
        text.push_str(&format!(
            "\n(since then the workspace was rewound to turn {turn}: it is {state})"
        ));
    }
    Ok(text)
}

/// Which snapshot a rewind restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Turn(u32),
    /// Chat's `/undo`: the last turn before the workspace's position whose state differs
    /// from the workspace as the log last recorded it.
    Undo,
}

/// Restores the workspace of `id` to `target`, records the rewind, and returns what to
/// print. Refused (usage error) when the workspace changed outside the execution since
/// the log last recorded it, unless `force`.
pub async fn rewind_to(
    db: &Path,
    id: &str,
    target: Target,
    force: bool,
) -> Result<Vec<String>, RuntimeError> {
    let opened = open(db, id, true).await?;
    let execution = opened.execution;
    if opened.replay.termination_reason.is_none() {
        return Err(RuntimeError::conflict(format!(
            "execution {execution} has not finished (it is running, or crashed): rewind it once it has ended, or resume it first"
        )));
    }
    let history = opened.history().clone();
    let Some(current) = history.current.as_deref().map(parse_logged).transpose()? else {
        return Err(RuntimeError::NotFound(format!(
            "execution {execution} has no workspace snapshots"
        )));
    };
    let turn = match target {
        Target::Turn(turn) => turn,
        Target::Undo => history
            .after
            .range(..history.position)
            .rev()
            .find(|(_, tree)| Some(tree.as_str()) != history.current.as_deref())
            .map(|(turn, _)| *turn)
            .ok_or_else(|| {
                RuntimeError::conflict(
                    "nothing to undo: no earlier turn left the workspace different",
                )
            })?,
    };
    let tree = opened.after(turn)?;
    let (now, outside) = {
        let current = current.clone();
        opened
            .run(move |c| {
                let now = c.snapshot()?;
                let outside = c.changes(&current, &now)?;
                Ok((now, outside))
            })
            .await?
    };
    let outside = wire_changes(&outside);
    if !outside.is_empty() && !force {
        return Err(RuntimeError::conflict(format!(
            "the workspace changed outside execution {execution} since its last snapshot ({}): pass --force to rewind over it",
            summary(&outside)
        )));
    }
    let changes = {
        let (now, tree) = (now.clone(), tree.clone());
        wire_changes(&opened.run(move |c| c.changes(&now, &tree)).await?)
    };
    if changes.is_empty() {
        return Ok(vec![format!(
            "the workspace of execution {execution} is already as it was after turn {turn}"
        )]);
    }
    {
        let tree = tree.clone();
        opened.run(move |c| c.restore(&tree)).await?;
    }
    // After the restore: the log never says the workspace is a tree it is not. A crash
    // in between leaves a workspace that differs from the log's last record, which the
    // next rewind or resume sees as a change outside the execution.
    let (sink, _) = crate::resume::person_sink(db).await?;
    sink.append(
        execution,
        Event::WorkspaceRewound(WorkspaceRewound {
            turn,
            tree: tree.to_string(),
            forced: !outside.is_empty(),
            changes: changes.clone(),
        }),
    )
    .await
    .map_err(RuntimeError::failed)?;
    // The counts above, each path once below.
    let mut lines = vec![format!(
        "rewound the workspace of execution {execution} to turn {turn}: {}",
        counts(&changes)
    )];
    lines.extend(
        changes
            .iter()
            .map(|c| format!("  {:<8} {}", c.change.as_str(), c.path)),
    );
    Ok(lines)
}

/// `2 added, 1 modified`: counts per kind.
fn counts(changes: &[WorkspaceChange]) -> String {
    let counts: Vec<String> = [ChangeKind::Added, ChangeKind::Modified, ChangeKind::Deleted]
        .into_iter()
        .filter_map(|kind| {
            let n = changes.iter().filter(|c| c.change == kind).count();
            (n > 0).then(|| format!("{n} {}", kind.as_str()))
        })
        .collect();
    counts.join(", ")
}

/// `2 added, 1 modified: a, b, c`: counts per kind and the first paths.
fn summary(changes: &[WorkspaceChange]) -> String {
    let counts = counts(changes);
    let mut paths: Vec<&str> = changes.iter().take(5).map(|c| c.path.as_str()).collect();
    if changes.len() > 5 {
        paths.push("...");
    }
    format!("{counts}: {}", paths.join(", "))
}
