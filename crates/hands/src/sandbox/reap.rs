//! Reaping: removing the containers (and their control directories and homes) that Nerve
//! left behind, those of dead owners or, on an operator's request, all of them.

use std::collections::HashMap;
use std::path::Path;

use bollard::Docker;
use bollard::query_parameters::ListContainersOptionsBuilder;

use super::{LABEL_EXECUTION, LABEL_MANAGED, LABEL_OWNER, LABEL_OWNER_HOST, remove_container};
use crate::HandsError;
use crate::account::HomeSweep;
use crate::control::{CONTAINER_CONTROL_DIR, CONTROL_DIR_PREFIX};
use crate::owner::{Liveness, label_liveness};

/// Which containers [`reap`] removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReapScope {
    /// Only those whose owner is provably dead (see `owner.rs`).
    Orphans,
    /// Every Nerve container, live runs' included: an operator's override (`nerve reap
    /// --all`) for sandboxes of other hosts or namespaces that the operator knows are dead.
    All,
}

/// What [`reap`] did: the containers it removed, and those it left with the reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReapReport {
    /// Names (or ids) of the containers removed.
    pub removed: Vec<String>,
    /// Names (or ids) of the containers left alone, and why.
    pub kept: Vec<(String, String)>,
    /// Executions whose sandbox home was removed, and why: no container of theirs is left,
    /// and the execution ended for good or none started for the retention (a week by
    /// default; a resume after that starts with an empty home).
    pub homes_removed: Vec<(String, crate::account::HomeRemoval)>,
}

/// Removes Nerve containers whose owning process is gone (killed, crashed), and returns how
/// many it removed. See [`reap`].
pub async fn reap_orphans(docker: &Docker) -> Result<usize, HandsError> {
    Ok(reap(docker, ReapScope::Orphans, None).await?.removed.len())
}

/// Removes Nerve containers (those labelled `org.nerve.managed=true`), with the control
/// directories they leave on the host. With [`ReapScope::Orphans`] a container goes only
/// when its owner label proves its owner dead: same host, boot and PID namespace as this
/// process, and the process gone. Containers of live processes are left alone, stopped ones
/// included (a sandbox's container stops whenever its executor dies, until the next call
/// restarts it), and so are those of other hosts, boots or namespaces and those whose label
/// is missing, empty or unreadable: their owner may well be alive where we cannot look.
/// With `execution`, only that execution's containers are considered.
pub async fn reap(
    docker: &Docker,
    scope: ReapScope,
    execution: Option<&str>,
) -> Result<ReapReport, HandsError> {
    reap_with(docker, scope, execution, &HomeSweep::default()).await
}

/// [`reap`], removing the sandbox homes `homes` selects (in its directory and `$TMPDIR`)
/// of executions without a container left, when no single `execution` is named.
pub async fn reap_with(
    docker: &Docker,
    scope: ReapScope,
    execution: Option<&str>,
    homes: &HomeSweep,
) -> Result<ReapReport, HandsError> {
    let mut labels = vec![format!("{LABEL_MANAGED}=true")];
    if let Some(execution) = execution {
        labels.push(format!("{LABEL_EXECUTION}={execution}"));
    }
    let filters = HashMap::from([("label".to_owned(), labels)]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let mut report = ReapReport::default();
    let containers = docker.list_containers(Some(options)).await?;
    // Executions that still have a container (until it is removed below) keep their home.
    let mut in_use: std::collections::HashSet<String> = containers
        .iter()
        .filter_map(|c| c.labels.as_ref()?.get(LABEL_EXECUTION).cloned())
        .collect();
    for container in containers {
        let Some(id) = container.id.clone() else {
            continue;
        };
        let shown = container
            .names
            .as_ref()
            .and_then(|names| names.first())
            .map_or_else(
                || id.clone(),
                |name| name.trim_start_matches('/').to_owned(),
            );
        let label = |name: &str| {
            container
                .labels
                .as_ref()
                .and_then(|labels| labels.get(name))
                .map(String::as_str)
        };
        if scope == ReapScope::Orphans {
            match label_liveness(label(LABEL_OWNER), label(LABEL_OWNER_HOST)) {
                Liveness::Dead => {}
                Liveness::Alive => {
                    report.kept.push((shown, "its owner is running".to_owned()));
                    continue;
                }
                Liveness::Unknown(reason) => {
                    report.kept.push((shown, reason));
                    continue;
                }
            }
        }
        remove_container(docker, &id).await?;
        report.removed.push(shown);
        in_use.remove(label(LABEL_EXECUTION).unwrap_or_default());
        let mounts = container.mounts.iter().flatten();
        if let Some(dir) = mounts
            .filter(|m| m.destination.as_deref() == Some(CONTAINER_CONTROL_DIR))
            .find_map(|m| m.source.as_deref())
        {
            remove_control_dir(Path::new(dir));
        }
    }
    // Only a sweep over every execution knows which still have containers.
    if execution.is_none() {
        report.homes_removed = homes.run(&in_use);
    }
    Ok(report)
}

/// Removes the control directory of a dead process's sandbox: only a directory that is one
/// of ours, holding nothing or the socket a killed host bound before its executor connected
/// (once the executor connects the host removes it).
pub(super) fn remove_control_dir(dir: &Path) {
    let ours = dir
        .file_name()
        .is_some_and(|name| name.to_string_lossy().starts_with(CONTROL_DIR_PREFIX));
    if !ours {
        return;
    }
    let _ = std::fs::remove_file(dir.join(crate::control::SOCKET_NAME));
    if std::fs::remove_dir(dir).is_ok() {
        tracing::debug!(dir = %dir.display(), "removed a dead sandbox's control directory");
    }
}
