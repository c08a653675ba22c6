//! `nerve fork ID --turn N`: a new execution whose history is ID's first N turns, on a
//! workspace restored from turn N's snapshot (a new directory, or ID's own rewound in
//! place as `rewind` does).
//!
//! The fork's log holds the parent's events up to the end of turn N (their payloads as the
//! parent recorded them, minus checkpoints, which the fork's resume does not need) in a
//! chain of its own, so that it verifies, replays and resumes without the parent; its
//! `started` names where they came from (`fork`: the parent, the turn, and the parent's
//! chain head there, its sequence number and hash), so that [`check_origin`] can tell, for
//! as long as the parent is in the log, that the copy is the parent's prefix and not one
//! that drifted. It ends with a `finish` of reason `shutdown` (stopped at a turn boundary):
//! `run --continue`, `chat` or `fork --task` take it up from there.

use std::path::{Path, PathBuf};

use nerve_core::event::{Finish, ForkOrigin};
use nerve_core::{Event, ExecutionId, TerminationReason};
use nerve_hands::checkpoint::{CheckpointConfig, Checkpoints};
use nerve_session::StoredEvent;

use crate::RuntimeError;

/// What to fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// The parent's id (or a unique prefix resolved by the front end).
    pub id: String,
    /// The last turn taken from the parent (at least 1).
    pub turn: u32,
    /// Rewind the parent's workspace to turn N and fork on it, instead of a new directory.
    pub in_place: bool,
    /// The new directory (must not exist, or be empty); by default the parent's
    /// workspace's path with `-fork-<first 8 characters of the new id>` appended.
    pub into: Option<PathBuf>,
}

/// The fork made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    pub execution_id: ExecutionId,
    pub parent: ExecutionId,
    pub turn: u32,
    pub workspace: PathBuf,
}

/// Makes the fork `request` asks for.
pub async fn fork(db: &Path, request: &ForkRequest) -> Result<Forked, RuntimeError> {
    let (parent, events, replay) = crate::resume::load(db, &request.id).await?;
    let Some(started) = replay.started.clone() else {
        return Err(RuntimeError::conflict(format!(
            "execution {parent} has no start event; nothing to fork"
        )));
    };
    let turn = request.turn;
    if turn == 0 || turn > replay.total_turns {
        return Err(RuntimeError::usage(format!(
            "execution {parent} has turns 1 to {}; --turn {turn} is not one of them",
            replay.total_turns
        )));
    }
    let end = prefix_end(&events, turn).ok_or_else(|| {
        RuntimeError::conflict(format!("execution {parent} recorded no end of turn {turn}"))
    })?;
    let head = &events[end];
    let tree = replay.workspace.after.get(&turn).cloned().ok_or_else(|| {
        RuntimeError::NotFound(format!(
            "execution {parent} has no workspace snapshot at turn {turn}: its workspace cannot be restored"
        ))
    })?;
    let tree = nerve_hands::checkpoint::TreeHash::parse(&tree)
        .map_err(|e| RuntimeError::log(format!("the log names a bad tree: {e}")))?;
    let execution = ExecutionId::new();

    // The workspace first: a fork whose log exists names a workspace that does too.
    let parent_store = std::path::absolute(crate::snapshots::store_dir(db, parent)?)
        .map_err(|e| RuntimeError::usage(format!("cannot resolve the snapshot store: {e}")))?;
    if !parent_store.join("HEAD").is_file() {
        return Err(RuntimeError::NotFound(format!(
            "the snapshot store of execution {parent} is missing ({})",
            parent_store.display()
        )));
    }
    let store = std::path::absolute(crate::snapshots::store_dir(db, execution)?)
        .map_err(|e| RuntimeError::usage(format!("cannot resolve the snapshot store: {e}")))?;
    let workspace = if request.in_place {
        crate::snapshots::rewind_to(
            db,
            &parent.to_string(),
            crate::snapshots::Target::Turn(turn),
            false,
        )
        .await?;
        PathBuf::from(&started.workspace)
    } else {
        let into = request.into.clone().unwrap_or_else(|| {
            let short: String = execution.to_string().chars().take(8).collect();
            PathBuf::from(format!("{}-fork-{short}", started.workspace))
        });
        empty_dir(&into)?;
        std::fs::canonicalize(&into)
            .map_err(|e| RuntimeError::usage(format!("{}: {e}", into.display())))?
    };
    {
        let (from, to, workspace) = (parent_store, store.clone(), workspace.clone());
        let restore = !request.in_place;
        tokio::task::spawn_blocking(move || -> Result<(), RuntimeError> {
            copy_dir(&from, &to).map_err(|e| {
                RuntimeError::failed(format!(
                    "copying the snapshot store to {}: {e}",
                    to.display()
                ))
            })?;
            if restore {
                let checkpoints = Checkpoints::open(CheckpointConfig::new(to, workspace))
                    .map_err(RuntimeError::failed)?;
                checkpoints.restore(&tree).map_err(RuntimeError::failed)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| RuntimeError::failed(format!("restoring the workspace: {e}")))??;
    }

    let origin = ForkOrigin {
        parent: parent.to_string(),
        turn,
        seq: head.seq,
        hash: head.hash.clone(),
    };
    let mut copied = Vec::with_capacity(end + 2);
    // Ends: one pass over the prefix.
    for stored in &events[..=end] {
        if stored.kind == "checkpoint" {
            continue;
        }
        let event: Event = serde_json::from_str(&stored.payload).map_err(|e| {
            RuntimeError::log(format!(
                "event {} of execution {parent} does not decode: {e}",
                stored.seq
            ))
        })?;
        let mut event = event;
        if let Event::Started(first) = &mut event {
            first.workspace = workspace.display().to_string();
            first.fork = Some(origin.clone());
        }
        copied.push(event);
    }
    let prefix = nerve_session::replay(&parent.to_string(), &events[..=end]);
    copied.push(Event::Finish(Finish {
        termination_reason: TerminationReason::Shutdown,
        task_status: prefix
            .task_status
            .unwrap_or(nerve_core::TaskStatus::InProgress),
        total_turns: turn,
        usage: prefix.usage,
        cost: prefix.cost,
        error: None,
    }));
    let (sink, _) = crate::resume::person_sink(db).await?;
    sink.commit(execution, copied, None)
        .await
        .map_err(RuntimeError::failed)?;
    Ok(Forked {
        execution_id: execution,
        parent,
        turn,
        workspace,
    })
}

/// The index of the parent's last event of turn `turn`: its `turn_completed`, and the
/// workspace snapshot of that turn when one follows it.
fn prefix_end(events: &[StoredEvent], turn: u32) -> Option<usize> {
    let turn_of = |event: &StoredEvent| {
        serde_json::from_str::<serde_json::Value>(&event.payload)
            .ok()
            .and_then(|v| v.get("turn").and_then(serde_json::Value::as_u64))
    };
    let completed = events
        .iter()
        .position(|e| e.kind == "turn_completed" && turn_of(e) == Some(u64::from(turn)))?;
    let mut end = completed;
    // Ends: at most the rest of the log; stops at the first event of anything else.
    for (at, event) in events.iter().enumerate().skip(completed + 1) {
        match event.kind.as_str() {
            "workspace_snapshot" if turn_of(event) == Some(u64::from(turn)) => end = at,
            "checkpoint" => {}
            _ => break,
        }
    }
    Some(end)
}

/// What [`check_origin`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The execution is no fork.
    None,
    /// A fork whose parent is not in this log (or does not verify): nothing to compare.
    ParentAbsent(ForkOrigin),
    /// A fork whose history is its parent's prefix.
    Matches(ForkOrigin),
    /// A fork whose history is not its parent's prefix, and why.
    Differs(ForkOrigin, String),
}

/// Whether `fork`'s copied history is still its parent's prefix: the parent's event at
/// the recorded sequence number has the recorded hash, and every copied payload equals
/// the parent's.
pub async fn check_origin(db: &Path, fork: &str) -> Result<Origin, RuntimeError> {
    let (execution, events, replay) = crate::resume::load(db, fork).await?;
    let Some(origin) = replay.started.as_ref().and_then(|s| s.fork.clone()) else {
        return Ok(Origin::None);
    };
    let Ok((_, parent_events, _)) = crate::resume::load(db, &origin.parent).await else {
        return Ok(Origin::ParentAbsent(origin));
    };
    let Some(head) = parent_events.iter().find(|e| e.seq == origin.seq) else {
        let why = format!("its parent has no event {}", origin.seq);
        return Ok(Origin::Differs(origin, why));
    };
    if head.hash != origin.hash {
        let why = format!(
            "its parent's event {} is not the one it was forked from",
            origin.seq
        );
        return Ok(Origin::Differs(origin, why));
    }
    let theirs = parent_events
        .iter()
        .filter(|e| e.seq <= origin.seq && e.kind != "checkpoint" && e.kind != "started");
    let ours = events.iter().filter(|e| e.kind != "started");
    // Ends: the shorter of two finite lists.
    for (a, b) in theirs.zip(ours) {
        if a.payload != b.payload {
            let why = format!(
                "event {} of {execution} differs from its parent's event {}",
                b.seq, a.seq
            );
            return Ok(Origin::Differs(origin, why));
        }
    }
    Ok(Origin::Matches(origin))
}

/// Makes `dir` an empty directory, refusing one that holds anything.
fn empty_dir(dir: &Path) -> Result<(), RuntimeError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RuntimeError::usage(format!(
                    "{} is not empty: name a new directory for the fork",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| {
                RuntimeError::usage(format!(
                    "cannot create {}: {}",
                    dir.display(),
                    crate::error::describe_io(&e)
                ))
            })
        }
        Err(e) => Err(RuntimeError::usage(format!(
            "{}: {}",
            dir.display(),
            crate::error::describe_io(&e)
        ))),
    }
}

/// Copies the directory tree `from` to `to` (created), regular files and directories only.
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    // Ends: a finite listing; the recursion by the store's depth.
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
