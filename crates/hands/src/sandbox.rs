//! One hardened container per execution: created from a local image with bollard, the
//! workspace bind-mounted at `/workspace`, no network, no capabilities, a read-only root.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use nerve_core::ExecutionId;

use crate::HandsError;
use crate::image::image_exists;

/// Label on every container Nerve creates; the reaper looks for it.
const LABEL_MANAGED: &str = "org.nerve.managed";
const LABEL_EXECUTION: &str = "org.nerve.execution";
/// `<boot id>:<pid>:<start time>` of the process that owns the container.
const LABEL_OWNER: &str = "org.nerve.owner";

/// How to build a sandbox. Limits default to what a coding agent needs and no more.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: String,
    /// Host directory bind-mounted read-write at `/workspace`.
    pub workspace: PathBuf,
    pub execution_id: ExecutionId,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids_limit: i64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_bytes: u64,
    /// Largest file a command may write (`RLIMIT_FSIZE`).
    pub max_file_bytes: i64,
    /// Environment for commands, already filtered by the credential filter.
    pub env: Vec<(String, String)>,
}

impl SandboxConfig {
    pub fn new(
        image: impl Into<String>,
        workspace: impl Into<PathBuf>,
        execution_id: ExecutionId,
    ) -> Self {
        Self {
            image: image.into(),
            workspace: workspace.into(),
            execution_id,
            memory_bytes: 512 << 20,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            tmp_bytes: 64 << 20,
            max_file_bytes: 256 << 20,
            env: Vec::new(),
        }
    }
}

/// What a command printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// `None` when the command was killed by the timeout.
    pub exit_code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    /// Bytes dropped from the middle of the output by the cap.
    pub omitted_bytes: u64,
}

/// Connects to the local engine and negotiates the API version with it (our machines run
/// engines older than bollard's default API version).
pub async fn connect_docker() -> Result<Docker, HandsError> {
    let docker = Docker::connect_with_local_defaults()
        .map_err(|e| HandsError::DockerUnavailable(e.to_string()))?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| HandsError::DockerUnavailable(e.to_string()))?;
    docker
        .ping()
        .await
        .map_err(|e| HandsError::DockerUnavailable(e.to_string()))?;
    Ok(docker)
}

/// A running sandbox container. Call [`Sandbox::remove`] when done; containers of
/// processes that died without doing so are removed by [`reap_orphans`].
#[derive(Debug)]
pub struct Sandbox {
    docker: Docker,
    id: String,
    user: String,
    env: Vec<String>,
}

impl Sandbox {
    /// Creates and starts the container for one execution.
    pub async fn start(docker: Docker, config: &SandboxConfig) -> Result<Self, HandsError> {
        let workspace = std::fs::canonicalize(&config.workspace)
            .map_err(|e| HandsError::Workspace(format!("{}: {e}", config.workspace.display())))?;
        let meta = std::fs::metadata(&workspace)
            .map_err(|e| HandsError::Workspace(format!("{}: {e}", workspace.display())))?;
        if !meta.is_dir() {
            return Err(HandsError::Workspace(format!(
                "{} is not a directory",
                workspace.display()
            )));
        }
        if !image_exists(&docker, &config.image).await? {
            return Err(HandsError::ImageMissing(config.image.clone()));
        }
        // Commands run as the workspace's owner so that files they create belong to the
        // user. With every capability dropped even uid 0 cannot override permissions,
        // load modules or escape the mount namespace.
        let user = format!("{}:{}", meta.uid(), meta.gid());
        let env: Vec<String> = std::iter::once("PATH=/bin:/usr/bin".to_owned())
            .chain(std::iter::once("HOME=/tmp".to_owned()))
            .chain(config.env.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
        let labels = HashMap::from([
            (LABEL_MANAGED.to_owned(), "true".to_owned()),
            (LABEL_EXECUTION.to_owned(), config.execution_id.to_string()),
            (
                LABEL_OWNER.to_owned(),
                owner_token(std::process::id()).unwrap_or_default(),
            ),
        ]);
        let host_config = HostConfig {
            binds: Some(vec![format!("{}:/workspace:rw", path_str(&workspace)?)]),
            network_mode: Some("none".to_owned()),
            cap_drop: Some(vec!["ALL".to_owned()]),
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            readonly_rootfs: Some(true),
            tmpfs: Some(HashMap::from([(
                "/tmp".to_owned(),
                format!("rw,nosuid,nodev,noexec,size={}", config.tmp_bytes),
            )])),
            pids_limit: Some(config.pids_limit),
            memory: Some(config.memory_bytes),
            memory_swap: Some(config.memory_bytes),
            nano_cpus: Some(config.nano_cpus),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("fsize".to_owned()),
                soft: Some(config.max_file_bytes),
                hard: Some(config.max_file_bytes),
            }]),
            init: Some(true),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(config.image.clone()),
            cmd: Some(vec!["/bin/sleep".to_owned(), "2147483647".to_owned()]),
            user: Some(user.clone()),
            working_dir: Some("/workspace".to_owned()),
            env: Some(env.clone()),
            labels: Some(labels),
            network_disabled: Some(true),
            host_config: Some(host_config),
            ..Default::default()
        };
        let name = format!("nerve-{}", config.execution_id);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        let created = docker.create_container(Some(options), body).await?;
        let sandbox = Self {
            docker,
            id: created.id,
            user,
            env,
        };
        if let Err(error) = sandbox.docker.start_container(&sandbox.id, None).await {
            let _ = sandbox.remove().await;
            return Err(error.into());
        }
        Ok(sandbox)
    }

    pub fn container_id(&self) -> &str {
        &self.id
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Runs `command` with `/bin/sh -c` in a fresh `docker exec`, killed after `timeout`.
    /// Output beyond `max_output` bytes per stream keeps its head and tail.
    pub async fn exec(
        &self,
        command: &str,
        workdir: &str,
        timeout: Duration,
        max_output: usize,
    ) -> Result<ExecOutput, HandsError> {
        let seconds = timeout.as_secs().max(1).to_string();
        let cmd = vec![
            "/bin/timeout",
            "-s",
            "KILL",
            seconds.as_str(),
            "/bin/sh",
            "-c",
            command,
        ];
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(cmd),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    attach_stdin: Some(false),
                    user: Some(self.user.as_str()),
                    working_dir: Some(workdir),
                    env: Some(self.env.iter().map(String::as_str).collect()),
                    ..Default::default()
                },
            )
            .await?;
        let started = self
            .docker
            .start_exec(&exec.id, Some(StartExecOptions::default()))
            .await?;
        let mut stdout = HeadTail::new(max_output);
        let mut stderr = HeadTail::new(max_output);
        let mut hung = false;
        if let StartExecResults::Attached { mut output, .. } = started {
            // The in-container timeout kills the command; this outer bound only guards
            // against output pipes held open by a background job that outlived it.
            let drain = async {
                while let Some(chunk) = output.next().await {
                    match chunk? {
                        bollard::container::LogOutput::StdOut { message }
                        | bollard::container::LogOutput::Console { message } => {
                            stdout.push(&message)
                        }
                        bollard::container::LogOutput::StdErr { message } => stderr.push(&message),
                        bollard::container::LogOutput::StdIn { .. } => {}
                    }
                }
                Ok::<(), bollard::errors::Error>(())
            };
            match tokio::time::timeout(timeout + Duration::from_secs(2), drain).await {
                Ok(result) => result?,
                Err(_) => hung = true,
            }
        }
        let inspected = self.docker.inspect_exec(&exec.id).await?;
        let exit_code = if hung { None } else { inspected.exit_code };
        // busybox timeout -s KILL makes the command die with 128 + 9.
        let timed_out = hung || exit_code == Some(137);
        Ok(ExecOutput {
            exit_code: if timed_out { None } else { exit_code },
            omitted_bytes: stdout.omitted + stderr.omitted,
            stdout: stdout.finish(),
            stderr: stderr.finish(),
            timed_out,
        })
    }

    /// Stops and removes the container. Idempotent.
    pub async fn remove(&self) -> Result<(), HandsError> {
        let options = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker.remove_container(&self.id, Some(options)).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(other) => Err(other.into()),
        }
    }
}

fn path_str(path: &Path) -> Result<&str, HandsError> {
    path.to_str()
        .ok_or_else(|| HandsError::Workspace(format!("{} is not valid UTF-8", path.display())))
}

/// Removes Nerve containers whose owning process is gone (killed, crashed), and returns
/// how many it removed. Containers of live processes are left alone.
pub async fn reap_orphans(docker: &Docker) -> Result<usize, HandsError> {
    let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_MANAGED}=true")])]);
    let options = ListContainersOptionsBuilder::default()
        .all(true)
        .filters(&filters)
        .build();
    let mut removed = 0;
    for container in docker.list_containers(Some(options)).await? {
        let owner = container
            .labels
            .as_ref()
            .and_then(|labels| labels.get(LABEL_OWNER))
            .cloned();
        if owner.as_deref().is_some_and(owner_alive) {
            continue;
        }
        if let Some(id) = container.id {
            let options = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            match docker.remove_container(&id, Some(options)).await {
                Ok(()) => removed += 1,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404 | 409,
                    ..
                }) => {}
                Err(other) => return Err(other.into()),
            }
        }
    }
    Ok(removed)
}

/// Identifies a process across pid reuse: boot id, pid and the process's start time.
fn owner_token(pid: u32) -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(format!("{}:{pid}:{}", boot.trim(), start_time(pid)?))
}

fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; the command name (field 2) may hold spaces, so count after its `)`.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)
        .map(str::to_owned)
}

fn owner_alive(token: &str) -> bool {
    let mut parts = token.split(':');
    let (Some(_boot), Some(pid)) = (parts.next(), parts.next()) else {
        return false;
    };
    pid.parse::<u32>().ok().and_then(owner_token).as_deref() == Some(token)
}

/// Keeps the first and last `cap / 2` bytes of a stream, counting what falls between.
#[derive(Debug)]
struct HeadTail {
    cap: usize,
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    omitted: u64,
}

impl HeadTail {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            omitted: 0,
        }
    }

    fn push(&mut self, mut bytes: &[u8]) {
        let head_cap = self.cap / 2;
        let tail_cap = self.cap - head_cap;
        if self.head.len() < head_cap {
            let take = bytes.len().min(head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        self.tail.extend(bytes);
        while self.tail.len() > tail_cap {
            let excess = self.tail.len() - tail_cap;
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }

    fn finish(self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted > 0 {
            out.push_str(&format!("\n[... {} bytes omitted ...]\n", self.omitted));
        }
        let tail: Vec<u8> = self.tail.into_iter().collect();
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cap: usize, chunks: &[&str], expected: &str) {
        let mut buffer = HeadTail::new(cap);
        for chunk in chunks {
            buffer.push(chunk.as_bytes());
        }
        assert_eq!(buffer.finish(), expected);
    }

    #[test]
    fn head_tail_cap() {
        check(10, &["hello"], "hello");
        check(4, &["abcdefgh"], "ab\n[... 4 bytes omitted ...]\ngh");
        check(
            4,
            &["a", "b", "c", "d", "e", "f"],
            "ab\n[... 2 bytes omitted ...]\nef",
        );
        check(0, &["abc"], "\n[... 3 bytes omitted ...]\n");
    }

    #[test]
    fn this_process_is_alive_and_a_dead_one_is_not() {
        let me = owner_token(std::process::id()).unwrap();
        assert!(owner_alive(&me));
        assert!(!owner_alive("boot:999999999:1"));
        assert!(!owner_alive("garbage"));
    }
}
