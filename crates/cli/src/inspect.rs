//! The read-only commands: `replay`, `list`, `show`, `events`, `verify`. A SQLite log is
//! opened read-only, so they never block a run that is writing it; a PostgreSQL log is read
//! through its store (see `log.rs`).

use std::path::Path;

use nerve_core::ExecutionId;
use nerve_runtime::log::StoredEvent;
pub(crate) use nerve_runtime::views::json::event_json;
use nerve_runtime::views::json::{cached_share, replay_json};

use crate::Failure;
use crate::args::StatusArg;
use crate::output;
use nerve_runtime::log::{Reader, reader};

/// How many candidates an ambiguous prefix names.
const CANDIDATES: usize = 5;

/// A whole execution id for `id`, which may be a unique prefix of one (as in git), or `last`
/// (the newest execution). A whole
/// id is taken as it is, without opening the log; a prefix that matches none or several is
/// a usage error naming the candidates.
pub(crate) async fn resolve(db: &Path, id: &str) -> Result<String, Failure> {
    if id.parse::<ExecutionId>().is_ok() {
        return Ok(id.trim().to_owned());
    }
    if id.trim().eq_ignore_ascii_case("last") {
        // The newest execution in the log.
        return Ok(nerve_runtime::resume::latest(db, None).await?.to_string());
    }
    let prefix = id.trim();
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(Failure::usage(
            id.parse::<ExecutionId>()
                .err()
                .map_or_else(String::new, |e| e.to_string()),
        ));
    }
    let found = reader(db)
        .await?
        .executions_with_prefix(prefix, CANDIDATES + 1)
        .await
        .map_err(Failure::usage)?;
    match found.as_slice() {
        [] => Err(Failure::usage(format!(
            "no execution id starts with `{prefix}` (see `nerve list`)"
        ))),
        [one] => Ok(one.to_string()),
        many => {
            let named: Vec<String> = many
                .iter()
                .take(CANDIDATES)
                .map(ToString::to_string)
                .collect();
            let more = if many.len() > CANDIDATES { ", ..." } else { "" };
            Err(Failure::usage(format!(
                "`{prefix}` is ambiguous: {}{more}",
                named.join(", ")
            )))
        }
    }
}

async fn load(db: &Path, id: &str) -> Result<(Reader, ExecutionId, Vec<StoredEvent>), Failure> {
    let execution: ExecutionId = id.parse().map_err(Failure::usage)?;
    let store = reader(db).await?;
    let events = store.events(execution).await.map_err(Failure::usage)?;
    Ok((store, execution, events))
}

pub(crate) async fn replay(db: &Path, id: &str, json: bool) -> Result<u8, Failure> {
    let execution: ExecutionId = id.parse().map_err(Failure::usage)?;
    let store = reader(db).await?;
    let replayed = store.replay(execution).await.map_err(Failure::usage)?;
    // A parent's replay scores its children too (each replayed from its own log).
    let mut children = Vec::new();
    // Ends: one replay per child the parent recorded.
    for child in &replayed.children {
        let Ok(id) = child.execution_id.parse::<ExecutionId>() else {
            continue;
        };
        let scored = store.replay(id).await.map_err(Failure::usage)?;
        children.push((child, scored));
    }
    if json {
        let mut value = replay_json(&replayed);
        if !children.is_empty() {
            value["children"] = children
                .iter()
                .map(|(child, scored)| {
                    serde_json::json!({
                        "execution_id": child.execution_id,
                        "name": child.name,
                        "completeness": scored.completeness(),
                        "complete": scored.complete,
                        "termination_reason": scored.termination_reason,
                        "gaps": scored.gaps,
                    })
                })
                .collect();
        }
        output::json(&value);
    } else {
        output::line(&format!("execution  {}", replayed.execution_id));
        if let Some(started) = &replayed.started {
            output::line(&format!(
                "task       {}",
                started.task.lines().next().unwrap_or_default()
            ));
        }
        output::line(&format!(
            "ended      {}",
            replayed.termination_reason.map_or_else(
                || "never (crashed or still running)".to_owned(),
                |r| r.to_string()
            )
        ));
        output::line(&format!("turns      {}", replayed.total_turns));
        output::line(&format!("messages   {}", replayed.messages.len()));
        output::line(&format!("cost       {}", replayed.cost));
        let usage = &replayed.usage;
        if usage.cache_read_tokens > 0 || usage.cache_write_tokens > 0 {
            output::line(&format!(
                "cache      {:.0}% of input read from the cache ({} of {} tokens; {} written)",
                cached_share(usage) * 100.0,
                usage.cache_read_tokens,
                usage.input_tokens,
                usage.cache_write_tokens
            ));
        }
        output::line(&format!(
            "complete   {:.2}{}",
            replayed.completeness(),
            if replayed.complete {
                ""
            } else {
                " (incomplete)"
            }
        ));
        for gap in &replayed.gaps {
            output::line(&format!("gap        {}", gap.detail));
        }
        for (child, scored) in &children {
            output::line(&format!(
                "child      {} `{}`: complete {:.2}{}",
                child.execution_id,
                child.name,
                scored.completeness(),
                if scored.complete { "" } else { " (incomplete)" }
            ));
        }
    }
    Ok(0)
}

pub(crate) async fn list(db: &Path, json: bool, status: Option<StatusArg>) -> Result<u8, Failure> {
    let store = reader(db).await?;
    if status == Some(StatusArg::Queued) {
        return queued(&store, json).await;
    }
    let mut executions = store.executions().await.map_err(Failure::usage)?;
    if let Some(status) = status {
        executions
            .retain(|e| status.selects(e.termination_reason.as_deref(), e.queue_state.as_deref()));
    }
    if json {
        output::json(&serde_json::json!(executions));
    } else {
        let now = time::OffsetDateTime::now_utc();
        let home = std::env::var("HOME").ok().filter(|h| h.len() > 1);
        // STATUS is what `--status` selects by: how the execution ended (its termination
        // reason), `unfinished` (running, or stopped without a finish), or a submission's
        // queue state.
        output::line(&format!(
            "{:<36}  {:<12}  {:<16}  {:>6}  {:<WORKSPACE_WIDTH$}  TASK",
            "ID", "STARTED", "STATUS", "EVENTS", "WORKSPACE"
        ));
        for (e, child) in with_children_under_parents(executions) {
            let started = time::OffsetDateTime::parse(
                &e.started_at,
                &time::format_description::well_known::Rfc3339,
            )
            .map_or_else(
                |_| e.started_at.clone(),
                |at| ago((now - at).whole_seconds()),
            );
            let marker = match (child, e.parent.as_deref()) {
                (true, _) => "└─ ".to_owned(),
                (false, Some(parent)) => format!("(child of {}) ", short_id(parent)),
                (false, None) => String::new(),
            };
            output::line(&format!(
                "{}  {started:<12}  {:<16}  {:>6}  {:<WORKSPACE_WIDTH$}  {marker}{}",
                e.execution_id,
                e.termination_reason
                    .as_deref()
                    .or(e.queue_state.as_deref())
                    .unwrap_or("unfinished"),
                e.events,
                short_workspace(e.workspace.as_deref().unwrap_or("-"), home.as_deref()),
                e.task
                    .as_deref()
                    .and_then(|t| t.lines().next())
                    .unwrap_or_default()
            ));
        }
    }
    Ok(0)
}

/// `executions` in their order, except that a child execution (a `delegate` call's) comes
/// right after its parent, marked `true`; a child whose parent is not listed stays where
/// it was, unmarked.
fn with_children_under_parents(
    executions: Vec<nerve_runtime::log::ExecutionSummary>,
) -> Vec<(nerve_runtime::log::ExecutionSummary, bool)> {
    let listed: std::collections::HashSet<String> =
        executions.iter().map(|e| e.execution_id.clone()).collect();
    let (children, top): (Vec<_>, Vec<_>) = executions
        .into_iter()
        .partition(|e| e.parent.as_ref().is_some_and(|p| listed.contains(p)));
    let mut by_parent: std::collections::HashMap<
        String,
        Vec<nerve_runtime::log::ExecutionSummary>,
    > = std::collections::HashMap::new();
    for child in children {
        by_parent
            .entry(child.parent.clone().unwrap_or_default())
            .or_default()
            .push(child);
    }
    let mut ordered = Vec::with_capacity(listed.len());
    for e in top {
        let mut under = by_parent.remove(&e.execution_id).unwrap_or_default();
        // Oldest child first: ids are UUID v7, ordered by time.
        under.sort_by(|a, b| a.execution_id.cmp(&b.execution_id));
        ordered.push((e, false));
        ordered.extend(under.into_iter().map(|c| (c, true)));
    }
    ordered
}

/// The first 8 characters of an execution id, as a reader shortens it.
fn short_id(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// `list --status queued`: the task queue's waiting executions (a SQLite log has no queue),
/// oldest first; one that a draining worker gave back has events already.
async fn queued(store: &Reader, json: bool) -> Result<u8, Failure> {
    let entries = store.queue().await.map_err(Failure::usage)?;
    let waiting: Vec<serde_json::Value> = entries
        .into_iter()
        .filter(|e| e.state == "queued")
        .map(|e| {
            serde_json::json!({
                "execution_id": e.execution_id,
                "state": e.state,
                "claims": e.claims,
                "task": e.spec.get("task"),
            })
        })
        .collect();
    if json {
        output::json(&serde_json::Value::Array(waiting));
    } else {
        output::line(&format!(
            "{:<36}  {:<8}  {:>6}  TASK",
            "ID", "STATE", "CLAIMS"
        ));
        for e in &waiting {
            output::line(&format!(
                "{}  {:<8}  {:>6}  {}",
                e["execution_id"].as_str().unwrap_or_default(),
                "queued",
                e["claims"].as_u64().unwrap_or_default(),
                e["task"]
                    .as_str()
                    .and_then(|t| t.lines().next())
                    .unwrap_or_default()
            ));
        }
    }
    Ok(0)
}

/// The widest a workspace is printed in `list`.
const WORKSPACE_WIDTH: usize = 28;

/// `path` for `list`'s WORKSPACE column: the home directory as `~`, and a path longer than
/// the column cut at the front, where the directories that tell workspaces apart are not.
fn short_workspace(path: &str, home: Option<&str>) -> String {
    let path = match home.and_then(|h| path.strip_prefix(h)) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("~{rest}"),
        _ => path.to_owned(),
    };
    let chars = path.chars().count();
    if chars <= WORKSPACE_WIDTH {
        return path;
    }
    let tail: String = path.chars().skip(chars - (WORKSPACE_WIDTH - 1)).collect();
    format!("…{tail}")
}

/// `seconds` in the past, as a person says it: "just now", "3 min ago", "2 days ago".
fn ago(seconds: i64) -> String {
    const MINUTE: i64 = 60;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    match seconds {
        ..10 => "just now".to_owned(),
        10..MINUTE => format!("{seconds} s ago"),
        MINUTE..HOUR => format!("{} min ago", seconds / MINUTE),
        HOUR..DAY => format!("{} h ago", seconds / HOUR),
        _ if seconds / DAY == 1 => "1 day ago".to_owned(),
        _ => format!("{} days ago", seconds / DAY),
    }
}

/// `show --json` is `replay --json`; without it, the transcript for people. `--html`
/// writes the page as well, and says so on stderr (stdout keeps its contract: the
/// transcript, or the JSON object as its last line).
pub(crate) async fn show(
    db: &Path,
    id: &str,
    json: bool,
    html: Option<&Path>,
) -> Result<u8, Failure> {
    if let Some(file) = html {
        let (store, execution, events) = load(db, id).await?;
        let replayed = store.replay(execution).await.map_err(Failure::usage)?;
        let diff = nerve_runtime::snapshots::diff_text(
            db,
            &execution.to_string(),
            nerve_runtime::snapshots::Scope::Execution,
        )
        .await
        .map_err(|e| e.to_string());
        let page = crate::html::page(&events, &replayed, diff);
        std::fs::write(file, &page)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", file.display())))?;
        output::error_line(&format!(
            "wrote the page of execution {execution} to {} ({} bytes)",
            file.display(),
            crate::progress::thousands(u64::try_from(page.len()).unwrap_or(u64::MAX))
        ));
    }
    if json {
        return replay(db, id, json).await;
    }
    let (store, execution, events) = load(db, id).await?;
    let replayed = store.replay(execution).await.map_err(Failure::usage)?;
    for line in nerve_runtime::views::transcript::transcript(&events, &replayed) {
        output::line(&line);
    }
    Ok(0)
}

/// The event timeline; payloads are clipped to a line unless `full`.
pub(crate) async fn events(db: &Path, id: &str, json: bool, full: bool) -> Result<u8, Failure> {
    let (_, _, events) = load(db, id).await?;
    if json {
        let list: Vec<serde_json::Value> = events.iter().map(event_json).collect();
        output::json(&serde_json::Value::Array(list));
    } else {
        for e in &events {
            output::line(&event_line(e, full));
        }
    }
    Ok(0)
}

/// One event as a line of the timeline; its payload clipped unless `full`.
pub(crate) fn event_line(e: &StoredEvent, full: bool) -> String {
    let mut payload = e.payload.clone();
    if !full && payload.len() > 160 {
        let cut = nerve_core::text::clip(&payload, 157).len();
        payload.truncate(cut);
        payload.push_str("...");
    }
    format!("{:>5}  {}  {:<18}  {payload}", e.seq, e.ts, e.kind)
}

pub(crate) async fn verify(db: &Path, id: &str) -> Result<u8, Failure> {
    let (store, execution, _) = load(db, id).await?;
    match store.verify(execution).await.map_err(Failure::usage)? {
        Ok(count) => {
            output::line(&format!("ok: {count} events, hash chain intact"));
            use nerve_runtime::fork::Origin;
            match nerve_runtime::fork::check_origin(db, id).await? {
                Origin::None => Ok(0),
                Origin::ParentAbsent(origin) => {
                    output::line(&format!(
                        "fork of {} at turn {}: the parent is not in this log to compare with",
                        origin.parent, origin.turn
                    ));
                    Ok(0)
                }
                Origin::Matches(origin) => {
                    output::line(&format!(
                        "fork of {} at turn {}: its history is the parent's up to event {}",
                        origin.parent, origin.turn, origin.seq
                    ));
                    Ok(0)
                }
                Origin::Differs(origin, why) => {
                    output::error_line(&format!(
                        "nerve: fork of {} at turn {}: {why}",
                        origin.parent, origin.turn
                    ));
                    Ok(1)
                }
            }
        }
        Err(broken) => {
            output::error_line(&format!("nerve: {broken}"));
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{ago, short_workspace};

    #[test]
    fn a_workspace_fits_its_column_keeping_its_end() {
        for (path, expected) in [
            ("/home/me/src/app", "~/src/app"),
            ("/home/me", "~"),
            ("/home/meadow/app", "/home/meadow/app"),
            ("/w", "/w"),
            (
                "/tmp/.tmpAbCdEf/some/deep/workspace",
                "…pAbCdEf/some/deep/workspace",
            ),
        ] {
            let got = short_workspace(path, Some("/home/me"));
            assert_eq!(got, expected, "{path}");
            assert!(got.chars().count() <= super::WORKSPACE_WIDTH, "{got}");
        }
    }

    #[test]
    fn ages_read_as_a_person_says_them() {
        for (seconds, expected) in [
            (-5, "just now"),
            (0, "just now"),
            (9, "just now"),
            (42, "42 s ago"),
            (60, "1 min ago"),
            (3 * 60 + 59, "3 min ago"),
            (2 * 3600, "2 h ago"),
            (86_400, "1 day ago"),
            (3 * 86_400 + 5, "3 days ago"),
        ] {
            assert_eq!(ago(seconds), expected, "{seconds} s");
        }
    }
}
