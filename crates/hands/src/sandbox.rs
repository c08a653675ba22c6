//! One hardened container per execution: created from a local image with bollard, the
//! workspace bind-mounted at `/workspace`, no network, no capabilities, a read-only root.
//!
//! Tool calls go through the persistent executor (`executor.rs`): the static
//! `nerve-executor`, bind-mounted read-only at `/opt/nerve/nerve-executor`, runs as the
//! container's main process under the engine's init, connected to the host for the
//! container's life through the control socket (`control.rs`, a private host directory
//! mounted read-only at `/run/nerve-control`), or, when that socket cannot be used, through
//! the engine's attach stream to its stdin and stdout. When the executor exits (killed by a
//! command, by the OOM killer), the container stops with it and the next call starts it
//! again, with a new socket, a few times at most. When it cannot run at all (no binary on the host, a dynamic build, an image it
//! cannot run in), the sandbox says so in a warning and falls back for good to an idle
//! container: commands through per-call `docker exec` (`percall.rs`), file operations on the
//! host through the executor library's own confinement (`openat2` with `RESOLVE_BENEATH`),
//! which never runs a command on the host.
//!
//! With a proxy ([`SandboxConfig::proxy`]), its host directory is mounted read-only at
//! `/run/nerve`, the executor relays `127.0.0.1:3128` inside the container to the socket
//! there, and commands get `HTTP_PROXY` and friends pointing at it.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use nerve_core::ExecutionId;
use nerve_executor::{
    EditFileOutput, EditFileRequest, ExecOutput, ExecRequest, GrepOutput, GrepRequest,
    ListDirOutput, ListDirRequest, Op, Pong, ReadFileOutput, ReadFileRequest, Request,
    SignalOutput, SignalRequest, SpawnOutput, SpawnRequest, WriteFileOutput, WriteFileRequest,
};
use serde::de::DeserializeOwned;
use tokio::sync::Mutex;

use crate::HandsError;
use crate::account::{Account, CONTAINER_HOME, CONTAINER_TMPDIR};
use crate::control::{CONTAINER_CONTROL_DIR, ControlDir, hand_over, numeric_user};
use crate::executor::{Connection, Pending, Transport};
use crate::locate::{CONTAINER_EXECUTOR_PATH, unusable_reason};
use crate::owner::{Liveness, Owner, label_liveness};
use crate::percall;
use crate::proxy::{CONTAINER_PROXY_DIR, ProxyMount, RELAY_LISTEN};
use nerve_core::Interrupt;

mod reap;

use reap::remove_control_dir;
pub use reap::{ReapReport, ReapScope, reap, reap_orphans, reap_with};

/// Label on every container Nerve creates; the reaper looks for it.
pub(crate) const LABEL_MANAGED: &str = "org.nerve.managed";
const LABEL_EXECUTION: &str = "org.nerve.execution";
/// `<boot id>:<pid>:<start time>` of the process that owns the container.
const LABEL_OWNER: &str = "org.nerve.owner";
/// `machine=<id>;pidns=<inode>`: where that process runs. With [`LABEL_OWNER`] it lets the
/// reaper prove the owner dead (see `owner.rs`).
const LABEL_OWNER_HOST: &str = "org.nerve.owner.host";

/// Beyond a command's own timeout, how long the host waits for the executor's answer: the
/// executor may take up to 7 s after the deadline (5 s for a killed shell to exit, 2 s to
/// drain its pipes), and the engine adds its own latency.
const EXEC_GRACE: Duration = Duration::from_secs(15);
/// How long a file operation (a `grep` over a large tree) may take before the host gives up
/// on the executor.
const FILE_OP_LIMIT: Duration = Duration::from_secs(120);
/// Executor starts per sandbox (the first and the restarts after it died) before the
/// sandbox is given up as lost.
const MAX_EXECUTOR_STARTS: u32 = 5;
/// How long a spawned process's streams may take to reach the host.
const SPAWN_STREAMS_LIMIT: Duration = Duration::from_secs(15);

/// A process running inside the sandbox with its stdio on the host
/// ([`Sandbox::spawn_process`]). Dropping the streams closes its stdin and stdout.
#[derive(Debug)]
pub struct SpawnedProcess {
    /// Its pid inside the container (and its process group's id).
    pub pid: u32,
    /// Its stdin (write) and stdout (read).
    pub stdio: tokio::net::UnixStream,
    /// Its stderr.
    pub stderr: tokio::net::UnixStream,
}

/// What the container runs as its main process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MainProcess {
    /// The executor, talking to the host over this transport.
    Executor(Transport),
    /// Nothing (`sleep`): the per-call fallback runs each command in its own exec.
    Idle,
}

/// How to build a sandbox. Limits default to what a coding agent needs and no more.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    pub image: String,
    /// Host directory bind-mounted read-write at `/workspace`.
    pub workspace: PathBuf,
    pub execution_id: ExecutionId,
    /// The static executor binary on the host, bind-mounted read-only into the container;
    /// `None` runs every call through the per-call fallback. [`SandboxConfig::new`] fills it
    /// with [`crate::locate_executor`].
    pub executor: Option<PathBuf>,
    /// `uid:gid` that commands run as; `None` means the owner of the workspace directory,
    /// so that files the agent creates belong to the user.
    pub user: Option<String>,
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids_limit: i64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_bytes: u64,
    /// Largest file a command may write (`RLIMIT_FSIZE`).
    pub max_file_bytes: i64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub max_open_files: i64,
    /// Environment for commands. Filtered again at start with
    /// [`nerve_core::filter_sandbox_env`] (credential-like names, well-known token formats);
    /// the caller filters it first with the run's redactor, which knows the secrets.
    pub env: Vec<(String, String)>,
    /// The auth proxy to reach from inside, if any; without one the sandbox has no network
    /// at all.
    pub proxy: Option<ProxyMount>,
    /// The account name of the command uid in the generated passwd (a devcontainer's
    /// `remoteUser`); `None` is `nerve`. The uid itself never changes with it.
    pub account_name: Option<String>,
    /// Package caches to mount in the home (`[sandbox.caches]`); only with a numeric
    /// command uid, which owns them.
    pub caches: Vec<crate::caches::CacheVolume>,
    /// Where the execution's home (with its passwd and group) lives on the host:
    /// `<homes>/<execution id>`, kept across resumes and removed by
    /// [`crate::discard_sandbox_home`] or `reap`; `None` is `$TMPDIR/nerve-env-<execution
    /// id>`, which a reboot may clear under a resumable execution.
    pub homes: Option<PathBuf>,
    /// How the host talks to the executor. With [`Transport::Socket`] (the default) a start
    /// whose socket cannot be used falls back to [`Transport::Attach`], with a warning;
    /// benchmarks and tests ask for the attach stream directly.
    pub transport: Transport,
    /// Whether a sandbox whose executor cannot run (none found, not a static binary, or
    /// failing to start) runs every call through per-call `docker exec` instead: slower,
    /// background jobs not contained, no process inside the sandbox for MCP servers. Off by
    /// default: without the executor, [`Sandbox::start`] refuses with
    /// [`HandsError::NoExecutor`]; a user opts in, and the choice is recorded
    /// ([`Sandbox::executor_use`]).
    pub per_call_fallback: bool,
    /// How long an interrupted command has between SIGINT and SIGKILL (`[sandbox]
    /// interrupt_grace_secs`); the executor's default, 2 s, unless set.
    pub interrupt_grace: Duration,
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
            executor: crate::locate::locate_executor(),
            user: None,
            memory_bytes: 512 << 20,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            tmp_bytes: 64 << 20,
            max_file_bytes: 256 << 20,
            max_open_files: 4096,
            env: Vec::new(),
            proxy: None,
            account_name: None,
            caches: Vec::new(),
            homes: None,
            transport: Transport::Socket,
            per_call_fallback: false,
            interrupt_grace: nerve_executor::INTERRUPT_GRACE,
        }
    }
}

/// How a sandbox's tool calls reach the container, decided at its start (what the
/// `started` event records).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum ExecutorUse {
    /// The persistent executor, bind-mounted from this host file.
    Executor { path: String },
    /// Per-call `docker exec`, as the configuration allowed; why the executor could not run.
    PerCall { reason: String },
}

/// The path tool calls take into the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The persistent in-container executor (the normal case).
    Executor,
    /// Per-call `docker exec` for commands and host-side confined file operations.
    PerCallExec,
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
    /// The workspace on the host, for the host-side file fallback.
    workspace: PathBuf,
    /// The auth proxy's socket on the host, when the sandbox reaches one.
    proxy_socket: Option<PathBuf>,
    /// The control socket's directory, mounted into the container, when the executor talks
    /// through it; `None` for the attach stream and the per-call fallback.
    control: Option<ControlDir>,
    channel: Mutex<Channel>,
    /// The limits, to name the one a command ran into.
    limits: Limits,
    /// The cgroup's OOM-kill and pids-limit counters as last read.
    counters: std::sync::Mutex<Counters>,
    /// The executor or the fallback, as started.
    executor_use: ExecutorUse,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    memory_bytes: i64,
    pids: i64,
    max_file_bytes: i64,
    /// Sent with each command: SIGINT to SIGKILL when it is interrupted.
    interrupt_grace: Duration,
}

/// What the container's cgroup counted: OOM kills and forks refused by the pids limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    oom_kills: u64,
    pids_refused: u64,
}

/// The executor connection and what became of it.
#[derive(Debug, Default)]
struct Channel {
    connection: Option<Connection>,
    /// Set once the sandbox has fallen back to per-call exec for good, with the reason.
    fallback: Option<String>,
    /// Set when the executor can no longer be restarted, with the reason.
    lost: Option<String>,
    starts: u32,
    /// The host-side file handler of the fallback, opened on first use.
    host_files: Option<Arc<nerve_executor::Executor>>,
}

impl Sandbox {
    /// Creates and starts the container for one execution, with its executor.
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
        // By default commands run as the workspace's owner so that files they create belong
        // to the user. With every capability dropped and no-new-privileges, even uid 0
        // cannot override permissions, load modules or escape the mount namespace.
        let user = config
            .user
            .clone()
            .unwrap_or_else(|| format!("{}:{}", meta.uid(), meta.gid()));
        let (passed, dropped) = nerve_core::filter_sandbox_env(
            config.env.iter().cloned(),
            &nerve_core::Redactor::new(),
        );
        if !dropped.is_empty() {
            tracing::debug!(?dropped, "environment variables kept out of the sandbox");
        }
        let proxy_env = config
            .proxy
            .as_ref()
            .map(|_| proxy_env())
            .unwrap_or_default();
        let image_env = image_env(&docker, &config.image).await?;
        // With a numeric uid, the account and home made on the host; with a user name,
        // the image's own account and `HOME=/tmp`.
        let account = match numeric_user(&user) {
            Some((uid, gid)) => Some(Account::prepare(
                config.homes.as_deref(),
                config.execution_id,
                (uid, gid.unwrap_or(uid)),
                config.account_name.as_deref(),
            )?),
            None => None,
        };
        let home = match account {
            Some(_) => vec![
                format!("HOME={CONTAINER_HOME}"),
                format!("TMPDIR={CONTAINER_TMPDIR}"),
            ],
            None => vec!["HOME=/tmp".to_owned()],
        };
        let env: Vec<String> = base_env(&image_env)
            .into_iter()
            .chain(home)
            .chain(passed.iter().map(|(k, v)| format!("{k}={v}")))
            .chain(proxy_env)
            .collect();
        if let Some(proxy) = &config.proxy {
            share_proxy_dir(proxy, &user);
        }
        let executor = match &config.executor {
            None => Err(format!(
                "no executor binary found (set {} or build it with `cargo xtask image`)",
                crate::locate::EXECUTOR_ENV
            )),
            Some(path) => match unusable_reason(path) {
                Some(reason) => Err(reason),
                None => std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display())),
            },
        };
        let mut workspace_binds = vec![format!("{}:/workspace:rw", path_str(&workspace)?)];
        if let Some(account) = &account {
            workspace_binds.extend(account.binds()?);
            if let Some((uid, gid)) = numeric_user(&user) {
                workspace_binds.extend(
                    crate::caches::prepare(&docker, &config.caches, (uid, gid.unwrap_or(uid)))
                        .await?,
                );
            }
        }
        if let Some(proxy) = &config.proxy {
            workspace_binds.push(format!(
                "{}:{CONTAINER_PROXY_DIR}:ro",
                path_str(&proxy.host_dir)?
            ));
        }
        let mut sandbox = Self {
            docker,
            id: String::new(),
            user,
            env,
            workspace,
            proxy_socket: config.proxy.as_ref().map(ProxyMount::host_socket),
            control: None,
            channel: Mutex::new(Channel::default()),
            limits: Limits {
                memory_bytes: config.memory_bytes,
                pids: config.pids_limit,
                max_file_bytes: config.max_file_bytes,
                interrupt_grace: config.interrupt_grace,
            },
            counters: std::sync::Mutex::new(Counters::default()),
            executor_use: ExecutorUse::PerCall {
                reason: String::new(),
            },
        };
        let mut channel = Channel::default();
        let reason = match &executor {
            Ok(binary) => {
                let mut binds = workspace_binds.clone();
                binds.push(format!(
                    "{}:{CONTAINER_EXECUTOR_PATH}:ro",
                    path_str(binary)?
                ));
                sandbox
                    .start_executor(config, binds, &mut channel)
                    .await?
                    .err()
            }
            Err(reason) => Some(reason.clone()),
        };
        sandbox.executor_use = match (&reason, executor) {
            (None, Ok(binary)) => ExecutorUse::Executor {
                path: binary.display().to_string(),
            },
            (Some(reason), _) if config.per_call_fallback => ExecutorUse::PerCall {
                reason: reason.clone(),
            },
            // No container is left: `start_executor` removes the ones it made.
            (Some(reason), _) => return Err(HandsError::NoExecutor(reason.clone())),
            (None, Err(reason)) => return Err(HandsError::NoExecutor(reason)),
        };
        if let Some(reason) = reason {
            let body = container_body(
                config,
                workspace_binds,
                &sandbox.user,
                &sandbox.env,
                MainProcess::Idle,
            );
            sandbox.id = create(&sandbox.docker, config, body).await?;
            if let Err(error) = sandbox.docker.start_container(&sandbox.id, None).await {
                let _ = sandbox.remove().await;
                return Err(error.into());
            }
            fall_back(&mut channel, reason);
        }
        sandbox.channel = Mutex::new(channel);
        if let Err(error) = sandbox.check_shell(&config.image).await {
            let _ = sandbox.remove().await;
            return Err(error);
        }
        Ok(sandbox)
    }

    /// Creates the container with the executor as its main process and boots it, over the
    /// control socket first unless the config asks for the attach stream. `Ok(Err(reason))`:
    /// the executor cannot serve over either, and no container is left.
    async fn start_executor(
        &mut self,
        config: &SandboxConfig,
        binds: Vec<String>,
        channel: &mut Channel,
    ) -> Result<Result<(), String>, HandsError> {
        let transports: &[Transport] = match config.transport {
            Transport::Socket => &[Transport::Socket, Transport::Attach],
            Transport::Attach => &[Transport::Attach],
        };
        let mut failure = String::new();
        for &transport in transports {
            let mut binds = binds.clone();
            self.control = None;
            match transport {
                Transport::Socket => match ControlDir::create(&self.user) {
                    Ok(control) => {
                        binds.push(format!(
                            "{}:{CONTAINER_CONTROL_DIR}:ro",
                            path_str(control.host_dir())?
                        ));
                        self.control = Some(control);
                    }
                    Err(reason) => {
                        warn_attach(&reason);
                        continue;
                    }
                },
                Transport::Attach => {}
            }
            let main = MainProcess::Executor(transport);
            let body = container_body(config, binds, &self.user, &self.env, main);
            self.id = create(&self.docker, config, body).await?;
            match self.boot(channel).await {
                Ok(()) => return Ok(Ok(())),
                Err(reason) => {
                    // Replace the container: with one talking through the attach stream, or
                    // with an idle one for the per-call fallback.
                    self.remove().await?;
                    channel.starts = 0;
                    if transport == Transport::Socket {
                        warn_attach(&reason);
                    }
                    failure = reason;
                }
            }
        }
        self.control = None;
        Ok(Err(failure))
    }

    /// Refuses an image without `/bin/sh` (a stat through the engine, on the running
    /// container). A stat that fails for another reason is only a warning: the `shell` tool
    /// says what went wrong at its first call.
    async fn check_shell(&self, image: &str) -> Result<(), HandsError> {
        let options = bollard::query_parameters::ContainerArchiveInfoOptionsBuilder::default()
            .path("/bin/sh")
            .build();
        match self
            .docker
            .get_container_archive_info(&self.id, Some(options))
            .await
        {
            Ok(_) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Err(HandsError::NoShell(image.to_owned())),
            Err(error) => {
                tracing::warn!(%error, "cannot check the sandbox image for /bin/sh");
                Ok(())
            }
        }
    }

    pub fn container_id(&self) -> &str {
        &self.id
    }

    /// The executor this sandbox runs, or the per-call fallback and why.
    pub fn executor_use(&self) -> &ExecutorUse {
        &self.executor_use
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// The path the next tool call takes.
    pub async fn backend(&self) -> Backend {
        if self.channel.lock().await.fallback.is_some() {
            Backend::PerCallExec
        } else {
            Backend::Executor
        }
    }

    /// How tool calls reach the executor; `None` on the per-call fallback.
    pub async fn transport(&self) -> Option<Transport> {
        if self.channel.lock().await.fallback.is_some() {
            None
        } else if self.control.is_some() {
            Some(Transport::Socket)
        } else {
            Some(Transport::Attach)
        }
    }

    /// Runs a command (`/bin/sh -c`) in its own process group, killed with everything it
    /// started when `timeout_ms` passes. `Ok(Err(message))` is a refusal for the model (a
    /// working directory outside the workspace, a shell that cannot be spawned).
    pub async fn exec(
        &self,
        request: ExecRequest,
    ) -> Result<Result<ExecOutput, String>, HandsError> {
        self.exec_until(request, None).await
    }

    /// Runs a command like [`Sandbox::exec`]; when `interrupt` resolves first, the command
    /// is interrupted (SIGINT to its group, SIGKILL after the executor's grace) and its
    /// answer says `interrupted`, with what it printed until then. Without the persistent
    /// executor (the per-call fallback) the command is not interrupted.
    pub async fn exec_until(
        &self,
        mut request: ExecRequest,
        interrupt: Option<Interrupt<'_>>,
    ) -> Result<Result<ExecOutput, String>, HandsError> {
        if request.interrupt_grace_ms.is_none() {
            request.interrupt_grace_ms =
                Some(u64::try_from(self.limits.interrupt_grace.as_millis()).unwrap_or(u64::MAX));
        }
        let limit = Duration::from_millis(request.timeout_ms).saturating_add(EXEC_GRACE);
        self.call_until(Op::Exec(request), limit, interrupt).await
    }

    /// The limit a finished command ran into, as one line for the tool result: the file
    /// size limit from the signal (`SIGXFSZ`), the memory and pids limits from the
    /// container's cgroup counters (OOM kills, forks refused), read through one more command
    /// after any command that failed. `None` when no limit explains the failure (or the
    /// counters cannot be read).
    pub async fn limit_reached(&self, output: &ExecOutput) -> Option<String> {
        const SIGXFSZ: i32 = 25;
        if output.timed_out || output.exit_code == Some(0) {
            return None;
        }
        if output.signal == Some(SIGXFSZ) || output.exit_code == Some(128 + SIGXFSZ) {
            return Some(format!(
                "[killed: file size limit ({}) reached]",
                human_bytes(self.limits.max_file_bytes)
            ));
        }
        let request = ExecRequest {
            command: COUNTERS_SCRIPT.to_owned(),
            workdir: None,
            timeout_ms: 10_000,
            max_output_bytes: 4096,
            env: Default::default(),
            interrupt_grace_ms: None,
        };
        let now = match self.exec(request).await {
            Ok(Ok(read)) => parse_counters(&read.stdout)?,
            _ => return None,
        };
        let before = {
            let mut seen = self.counters.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *seen, now)
        };
        // A restarted container starts its counters from zero again.
        let grew = |now: u64, before: u64| now > before || (now > 0 && now < before);
        if grew(now.oom_kills, before.oom_kills) {
            Some(format!(
                "[killed: memory limit ({}) reached]",
                human_bytes(self.limits.memory_bytes)
            ))
        } else if grew(now.pids_refused, before.pids_refused) {
            Some(format!(
                "[pids limit ({}) reached: a process could not be started]",
                self.limits.pids
            ))
        } else {
            None
        }
    }

    /// Runs a command through a fresh `docker exec`, bypassing the executor: the fallback
    /// path, public so that benchmarks can compare the two.
    pub async fn exec_per_call(
        &self,
        request: &ExecRequest,
    ) -> Result<Result<ExecOutput, String>, HandsError> {
        percall::exec(self.target(), request).await
    }

    /// Reads lines of a regular file inside the workspace.
    pub async fn read_file(
        &self,
        request: ReadFileRequest,
    ) -> Result<Result<ReadFileOutput, String>, HandsError> {
        self.call(Op::ReadFile(request), FILE_OP_LIMIT).await
    }

    /// Creates or replaces a regular file inside the workspace.
    pub async fn write_file(
        &self,
        request: WriteFileRequest,
    ) -> Result<Result<WriteFileOutput, String>, HandsError> {
        self.call(Op::WriteFile(request), FILE_OP_LIMIT).await
    }

    /// Replaces text in a file inside the workspace.
    pub async fn edit_file(
        &self,
        request: EditFileRequest,
    ) -> Result<Result<EditFileOutput, String>, HandsError> {
        self.call(Op::EditFile(request), FILE_OP_LIMIT).await
    }

    /// Lists a directory inside the workspace.
    pub async fn list_dir(
        &self,
        request: ListDirRequest,
    ) -> Result<Result<ListDirOutput, String>, HandsError> {
        self.call(Op::ListDir(request), FILE_OP_LIMIT).await
    }

    /// Searches the regular files beneath a workspace path with a regex.
    pub async fn grep(
        &self,
        request: GrepRequest,
    ) -> Result<Result<GrepOutput, String>, HandsError> {
        self.call(Op::Grep(request), FILE_OP_LIMIT).await
    }

    /// One round trip to the executor (nothing on the fallback path). Returns its version.
    pub async fn ping(&self) -> Result<String, HandsError> {
        match self.call::<Pong>(Op::Ping, FILE_OP_LIMIT).await? {
            Ok(pong) => Ok(pong.version),
            Err(refused) => Err(HandsError::Executor(refused)),
        }
    }

    /// The host path of the auth proxy's socket this sandbox reaches, if it has one: the
    /// execution's way out, which the host uses too for what must pass the same rules.
    pub fn proxy_socket(&self) -> Option<&Path> {
        self.proxy_socket.as_deref()
    }

    /// Starts a long-lived process (an MCP server) inside the sandbox, in the workspace,
    /// with its stdin and stdout on one unix stream and its stderr on another, both going
    /// straight from the process to the host (see the executor's `spawn`). It runs as the
    /// sandbox's user, confined like any command, until its stdin closes, it exits, or
    /// [`Sandbox::signal_process`] ends it. `Ok(Err(reason))`: it could not be started (a
    /// missing program, no control socket).
    pub async fn spawn_process(
        &self,
        argv: Vec<String>,
        env: std::collections::BTreeMap<String, String>,
    ) -> Result<Result<SpawnedProcess, String>, HandsError> {
        let Some(control) = &self.control else {
            return Ok(Err(
                "a process inside the sandbox needs the executor's control socket, which this sandbox does not use".to_owned(),
            ));
        };
        let listener = match control.listen_spawn() {
            Ok(listener) => listener,
            Err(reason) => return Ok(Err(reason)),
        };
        let request = SpawnRequest {
            argv,
            env,
            workdir: None,
            socket: listener.container_path.clone(),
            nonce: listener.nonce.clone(),
        };
        let spawned: SpawnOutput = match self.call(Op::Spawn(request), FILE_OP_LIMIT).await? {
            Ok(spawned) => spawned,
            Err(refused) => return Ok(Err(refused)),
        };
        Ok(match listener.accept(SPAWN_STREAMS_LIMIT).await {
            Ok(streams) => Ok(SpawnedProcess {
                pid: spawned.pid,
                stdio: streams.stdio,
                stderr: streams.stderr,
            }),
            Err(reason) => {
                let _ = self.signal_process(spawned.pid, true).await;
                Err(reason)
            }
        })
    }

    /// Ends a process [`Sandbox::spawn_process`] started, with its whole process group:
    /// `SIGKILL` when `kill`, else `SIGTERM`. Returns whether anything was left to signal.
    pub async fn signal_process(&self, pid: u32, kill: bool) -> Result<bool, HandsError> {
        let signal = if kill { "kill" } else { "term" }.to_owned();
        match self
            .call::<SignalOutput>(Op::Signal(SignalRequest { pid, signal }), FILE_OP_LIMIT)
            .await?
        {
            Ok(output) => Ok(output.delivered),
            Err(refused) => Err(HandsError::Executor(refused)),
        }
    }

    /// Stops and removes the container, with everything running in it. Idempotent.
    pub async fn remove(&self) -> Result<(), HandsError> {
        // A call still in flight holds the channel; the removal below ends it anyway.
        if let Ok(mut channel) = self.channel.try_lock() {
            channel.connection = None;
        }
        // 404: already gone; 409: a removal (the reaper's) is already in progress, waited for.
        remove_container(&self.docker, &self.id).await
    }

    fn target(&self) -> percall::Target<'_> {
        percall::Target {
            docker: &self.docker,
            container: &self.id,
            user: &self.user,
            env: &self.env,
        }
    }

    /// Starts (or restarts) the container with its executor, connected, and waits for its
    /// first answer. The error says why it cannot serve.
    async fn boot(&self, channel: &mut Channel) -> Result<(), String> {
        channel.starts += 1;
        if channel.starts > 1 {
            // A hung executor still runs: stop the container (and everything in it) first.
            let options = StopContainerOptionsBuilder::default().t(0).build();
            match self.docker.stop_container(&self.id, Some(options)).await {
                Ok(())
                | Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 304, ..
                }) => {}
                Err(e) => return Err(format!("cannot stop the container: {e}")),
            }
        }
        // A fresh socket per start, bound while nothing runs in the container.
        let listener = match &self.control {
            Some(control) => Some(control.listen()?),
            None => None,
        };
        let pending = Pending::prepare(&self.docker, &self.id, listener).await?;
        self.docker
            .start_container(&self.id, None)
            .await
            .map_err(|e| format!("cannot start the container: {e}"))?;
        let mut connection = pending.connect().await?;
        connection.handshake().await?;
        channel.connection = Some(connection);
        Ok(())
    }

    /// Sends one request through the executor, or the fallback. One at a time: the channel
    /// lock is held for the whole call.
    async fn call<T: DeserializeOwned>(
        &self,
        op: Op,
        limit: Duration,
    ) -> Result<Result<T, String>, HandsError> {
        self.call_until(op, limit, None).await
    }

    /// [`Sandbox::call`], with the interrupt of [`Connection::call_until`].
    async fn call_until<T: DeserializeOwned>(
        &self,
        op: Op,
        limit: Duration,
        interrupt: Option<Interrupt<'_>>,
    ) -> Result<Result<T, String>, HandsError> {
        let mut channel = self.channel.lock().await;
        // A cancelled call left half a request on the stream: start over.
        if let Some(connection) = channel
            .connection
            .take_if(|connection| connection.is_poisoned())
        {
            connection.close().await;
        }
        if let Some(reason) = &channel.lost {
            return Err(HandsError::SandboxLost(reason.clone()));
        }
        if channel.connection.is_none() && channel.fallback.is_none() {
            let restarted = if channel.starts >= MAX_EXECUTOR_STARTS {
                Err(format!("the executor stopped {} times", channel.starts))
            } else {
                self.boot(&mut channel).await
            };
            if let Err(reason) = restarted {
                tracing::warn!(container = %self.id, %reason, "the sandbox executor cannot be restarted; the sandbox is lost");
                channel.lost = Some(reason.clone());
                return Err(HandsError::SandboxLost(reason));
            }
        }
        if let Some(connection) = channel.connection.as_mut() {
            return match connection.call_until::<T>(op, limit, interrupt).await {
                Ok(result) => Ok(result),
                Err(error) => {
                    // Dropping the connection closes the executor's input: once it is done
                    // with what it was doing, it kills what it still runs and exits.
                    // The next call restarts the container, stopping it first if need be.
                    channel.connection = None;
                    tracing::warn!(container = %self.id, %error, "lost the sandbox executor; it restarts at the next call");
                    Err(HandsError::Executor(error.to_string()))
                }
            };
        }
        let answer = match op {
            Op::Exec(request) => percall::exec(self.target(), &request)
                .await?
                .map(|output| serde_json::to_value(output).unwrap_or_default()),
            Op::Ping => Ok(serde_json::json!({ "version": nerve_executor::VERSION })),
            Op::Interrupt => Ok(serde_json::json!({})),
            Op::Spawn(_) | Op::Signal(_) => Err(
                "long-lived processes need the persistent executor, which this sandbox lost"
                    .to_owned(),
            ),
            file_op @ (Op::ReadFile(_)
            | Op::WriteFile(_)
            | Op::EditFile(_)
            | Op::ListDir(_)
            | Op::Grep(_)) => {
                let files = match &channel.host_files {
                    Some(files) => Arc::clone(files),
                    None => {
                        let files = Arc::new(host_file_handler(&self.workspace)?);
                        channel.host_files = Some(Arc::clone(&files));
                        files
                    }
                };
                host_file_op(files, file_op).await?
            }
        };
        Ok(answer.and_then(|value| {
            T::deserialize(value).map_err(|e| format!("unexpected answer from the fallback: {e}"))
        }))
    }
}

fn warn_attach(reason: &str) {
    tracing::warn!(
        %reason,
        "the sandbox executor cannot use its control socket; talking to it through the engine's attach stream (slower, and commands can forge its answers)"
    );
}

fn fall_back(channel: &mut Channel, reason: String) {
    tracing::warn!(
        %reason,
        "the sandbox executor cannot run; falling back to per-call docker exec (slower; background jobs are not contained)"
    );
    channel.connection = None;
    channel.fallback = Some(reason);
}

/// The container's name: one per execution, so that two live runs of one execution cannot
/// both have a sandbox.
fn container_name(execution: ExecutionId) -> String {
    format!("nerve-{execution}")
}

/// Creates the container named after the execution and returns its id. A container of an
/// earlier attempt still holding the name (a run killed before it could remove it, a
/// resume right after a crash) is removed first when its owner is provably dead; one whose
/// owner is alive or beyond proof is a [`HandsError::SandboxInUse`], never the engine's
/// bare 409.
async fn create(
    docker: &Docker,
    config: &SandboxConfig,
    body: ContainerCreateBody,
) -> Result<String, HandsError> {
    let name = container_name(config.execution_id);
    let options = CreateContainerOptionsBuilder::default().name(&name).build();
    let mut cleared = false;
    // Ends: at most two passes: a name conflict clears the earlier container once
    // (`cleared`), every other outcome returns.
    loop {
        match docker
            .create_container(Some(options.clone()), body.clone())
            .await
        {
            Ok(created) => return Ok(created.id),
            // The image check is folded into the create call: one round trip fewer per start.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Err(HandsError::ImageMissing(config.image.clone())),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) if !cleared => {
                clear_name(docker, config.execution_id, &name).await?;
                cleared = true;
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            }) => {
                return Err(HandsError::SandboxInUse(format!(
                    "the container {name} of execution {} was created again by someone else while this process removed the previous one",
                    config.execution_id
                )));
            }
            Err(other) => return Err(other.into()),
        }
    }
}

/// Removes the container holding `name` if it is an earlier attempt's of the same
/// execution whose owner is provably dead; otherwise says why it stays.
async fn clear_name(docker: &Docker, execution: ExecutionId, name: &str) -> Result<(), HandsError> {
    let existing = match docker
        .inspect_container(name, None::<InspectContainerOptions>)
        .await
    {
        Ok(existing) => existing,
        // Gone in the meantime (its owner's own removal): the name is free.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => return Ok(()),
        Err(other) => return Err(other.into()),
    };
    let control_dir = existing
        .mounts
        .iter()
        .flatten()
        .filter(|m| m.destination.as_deref() == Some(CONTAINER_CONTROL_DIR))
        .find_map(|m| m.source.clone());
    let labels = existing
        .config
        .and_then(|config| config.labels)
        .unwrap_or_default();
    let ours = labels.get(LABEL_MANAGED).map(String::as_str) == Some("true")
        && labels.get(LABEL_EXECUTION).map(String::as_str) == Some(&execution.to_string());
    if !ours {
        return Err(HandsError::SandboxInUse(format!(
            "a container named {name} exists and is not a Nerve sandbox of execution {execution}; remove or rename it"
        )));
    }
    let owner = labels.get(LABEL_OWNER).map(String::as_str);
    let host = labels.get(LABEL_OWNER_HOST).map(String::as_str);
    match label_liveness(owner, host) {
        Liveness::Dead => {
            tracing::info!(
                container = name,
                "removing the sandbox of a dead earlier attempt of this execution"
            );
            remove_container(docker, name).await?;
            // Another reaper may be removing it at the same time (our removal then answers
            // 409 at once): the name is free only once the container is gone.
            wait_gone(docker, name).await?;
            if let Some(dir) = control_dir {
                remove_control_dir(Path::new(&dir));
            }
            Ok(())
        }
        Liveness::Alive => Err(HandsError::SandboxInUse(format!(
            "execution {execution} already has a sandbox ({name}) whose owner, process {}, is still running; stop that run first",
            owner
                .zip(host)
                .and_then(|(o, h)| Owner::parse(o, h).ok())
                .map_or(0, |o| o.pid)
        ))),
        Liveness::Unknown(reason) => Err(HandsError::SandboxInUse(format!(
            "execution {execution} already has a sandbox ({name}) whose owner cannot be proven dead ({reason}); if no run of it is alive, remove it with `nerve reap --all {execution}`"
        ))),
    }
}

/// How long a removal of a dead attempt's container may take before the start gives up.
const REMOVAL_LIMIT: Duration = Duration::from_secs(60);

/// Waits until the engine no longer knows the container `name`.
async fn wait_gone(docker: &Docker, name: &str) -> Result<(), HandsError> {
    let deadline = tokio::time::Instant::now() + REMOVAL_LIMIT;
    // Ends: by REMOVAL_LIMIT (deadline), polling every 20 ms.
    loop {
        match docker
            .inspect_container(name, None::<InspectContainerOptions>)
            .await
        {
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Ok(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(_) => {
                return Err(HandsError::SandboxInUse(format!(
                    "the container {name} was still there {}s after its removal",
                    REMOVAL_LIMIT.as_secs()
                )));
            }
            Err(other) => return Err(other.into()),
        }
    }
}

/// Force-removes a container with its anonymous volumes; one already gone counts as
/// removed, and one already being removed (by the reaper, say) is waited for until it is
/// gone, so that no caller sees it still there after this returned.
async fn remove_container(docker: &Docker, id: &str) -> Result<(), HandsError> {
    let options = RemoveContainerOptionsBuilder::default()
        .force(true)
        .v(true)
        .build();
    match docker.remove_container(id, Some(options)).await {
        Ok(())
        | Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => wait_gone(docker, id).await,
        Err(other) => Err(other.into()),
    }
}

/// The container: hardened as docs/security.md lists, its main process under the engine's
/// init (which reaps whatever is re-parented to it).
fn container_body(
    config: &SandboxConfig,
    binds: Vec<String>,
    user: &str,
    env: &[String],
    main: MainProcess,
) -> ContainerCreateBody {
    let owner = Owner::current();
    let labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_EXECUTION.to_owned(), config.execution_id.to_string()),
        (
            LABEL_OWNER.to_owned(),
            owner.as_ref().map(Owner::process_label).unwrap_or_default(),
        ),
        (
            LABEL_OWNER_HOST.to_owned(),
            owner.as_ref().map(Owner::host_label).unwrap_or_default(),
        ),
    ]);
    let ulimit = |name: &str, value: i64| ResourcesUlimits {
        name: Some(name.to_owned()),
        soft: Some(value),
        hard: Some(value),
    };
    let host_config = HostConfig {
        binds: Some(binds),
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
        ulimits: Some(vec![
            ulimit("fsize", config.max_file_bytes),
            ulimit("nofile", config.max_open_files),
        ]),
        init: Some(true),
        ipc_mode: Some("private".to_owned()),
        privileged: Some(false),
        // The executor's stdout is the protocol: never copy it into the engine's logs.
        log_config: Some(HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        ..Default::default()
    };
    // The host attaches to the executor's stderr either way, to its stdin and stdout only
    // without the control socket.
    let (cmd, stdin, stderr) = match main {
        MainProcess::Executor(transport) => {
            let mut cmd = vec![
                CONTAINER_EXECUTOR_PATH.to_owned(),
                "--root".to_owned(),
                "/workspace".to_owned(),
            ];
            let stdin = match transport {
                Transport::Socket => {
                    cmd.extend([
                        "--control-socket".to_owned(),
                        ControlDir::container_socket(),
                    ]);
                    false
                }
                Transport::Attach => true,
            };
            if config.proxy.is_some() {
                cmd.extend([
                    "--proxy-socket".to_owned(),
                    ProxyMount::container_socket(),
                    "--proxy-listen".to_owned(),
                    RELAY_LISTEN.to_owned(),
                ]);
            }
            (cmd, stdin, true)
        }
        MainProcess::Idle => (
            vec!["/bin/sleep".to_owned(), "2147483647".to_owned()],
            false,
            false,
        ),
    };
    ContainerCreateBody {
        image: Some(config.image.clone()),
        // Whatever entrypoint a user image has, the main process is ours.
        entrypoint: Some(Vec::new()),
        cmd: Some(cmd),
        open_stdin: Some(stdin),
        stdin_once: Some(stdin),
        attach_stdin: Some(stdin),
        attach_stdout: Some(stdin),
        attach_stderr: Some(stderr),
        user: Some(user.to_owned()),
        working_dir: Some("/workspace".to_owned()),
        env: Some(env.to_vec()),
        labels: Some(labels),
        network_disabled: Some(true),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// Prints the cgroup counters, v2 and v1 alike, with nothing but shell built-ins (an image
/// may have no `cat`): `<file> <key> <value>` lines.
const COUNTERS_SCRIPT: &str = "for f in /sys/fs/cgroup/memory.events \
/sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/pids.events \
/sys/fs/cgroup/pids/pids.events; do [ -r \"$f\" ] && while read -r k v; \
do echo \"$f $k $v\"; done < \"$f\"; done; true";

/// Reads [`COUNTERS_SCRIPT`]'s output; `None` when it found no counter at all.
fn parse_counters(out: &str) -> Option<Counters> {
    let mut counters = Counters::default();
    let mut found = false;
    for line in out.lines() {
        let mut fields = line.split_whitespace();
        let (Some(file), Some(key), Some(value)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "oom_kill" if file.contains("memory") => counters.oom_kills = value,
            "max" if file.contains("pids") => counters.pids_refused = value,
            _ => continue,
        }
        found = true;
    }
    found.then_some(counters)
}

/// `512 MiB`, `1 GiB`, `1536 KiB`, or bytes: the largest binary unit that divides `n`.
pub(crate) fn human_bytes(n: i64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n > 0 && n % (1 << shift) == 0 {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

/// `PATH` when the image sets none: Docker's default for Linux containers.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The image's own environment (`ENV` lines, `PATH` among them), or
/// [`HandsError::ImageMissing`] when the engine has no such image.
async fn image_env(docker: &Docker, image: &str) -> Result<Vec<String>, HandsError> {
    match docker.inspect_image(image).await {
        Ok(inspect) => Ok(inspect.config.and_then(|c| c.env).unwrap_or_default()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Err(HandsError::ImageMissing(image.to_owned())),
        Err(other) => Err(other.into()),
    }
}

/// The environment commands start from: the image's, filtered by the credential patterns
/// like the host's. The engine merges the image's variables into the container's, so a
/// dropped one is overridden with an empty value (its value never reaches a command).
/// `PATH` falls back to [`DEFAULT_PATH`] when the image sets none.
fn base_env(image_env: &[String]) -> Vec<String> {
    let pairs = image_env.iter().filter_map(|entry| {
        entry
            .split_once('=')
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
    });
    let (kept, dropped) = nerve_core::filter_sandbox_env(pairs, &nerve_core::Redactor::new());
    if !dropped.is_empty() {
        tracing::debug!(
            ?dropped,
            "image environment variables kept out of the sandbox"
        );
    }
    let mut env: Vec<String> = Vec::with_capacity(kept.len() + dropped.len() + 1);
    if !kept.iter().any(|(k, _)| k == "PATH") {
        env.push(format!("PATH={DEFAULT_PATH}"));
    }
    env.extend(kept.iter().map(|(k, v)| format!("{k}={v}")));
    env.extend(dropped.iter().map(|k| format!("{k}=")));
    env
}

/// The variables that send commands' HTTP through the relay: both spellings, since tools
/// disagree (busybox `wget` reads only the lower-case ones). No `NO_PROXY`: everything,
/// loopback URLs included, goes through the proxy, which judges where it goes.
fn proxy_env() -> Vec<String> {
    let url = format!("http://{RELAY_LISTEN}");
    ["http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"]
        .iter()
        .map(|name| format!("{name}={url}"))
        .collect()
}

/// The proxy's directory and socket are private to the `nerve` user (any host user who
/// can connect gets credentials injected). When commands run as another uid, hand both to
/// that uid; this takes root, and without it the sandbox cannot reach the proxy (said in a
/// warning).
fn share_proxy_dir(proxy: &ProxyMount, user: &str) {
    let Some(owner) = numeric_user(user) else {
        return;
    };
    for path in [proxy.host_dir.clone(), proxy.host_socket()] {
        if let Err(error) = hand_over(&path, owner) {
            tracing::warn!(%error, path = %path.display(), uid = owner.0, "cannot give the proxy socket to the sandbox's user; the sandbox cannot reach the proxy");
        }
    }
}

/// The executor library opened on the host workspace, for file operations only.
fn host_file_handler(workspace: &Path) -> Result<nerve_executor::Executor, HandsError> {
    let config = nerve_executor::Config {
        // Never reap children: this runs inside the `nerve` process.
        reap_orphans: false,
        ..nerve_executor::Config::new(workspace)
    };
    nerve_executor::Executor::new(config)
        .map_err(|e| HandsError::Workspace(format!("{}: {e}", workspace.display())))
}

async fn host_file_op(
    files: Arc<nerve_executor::Executor>,
    op: Op,
) -> Result<Result<serde_json::Value, String>, HandsError> {
    let line = tokio::task::spawn_blocking(move || files.handle(&Request { id: 0, op }).to_line())
        .await
        .map_err(|e| HandsError::Executor(format!("the host-side file handler failed: {e}")))?;
    nerve_executor::decode_response::<serde_json::Value>(&line)
        .map(|decoded| decoded.result)
        .map_err(|e| HandsError::Executor(format!("the host-side file handler: {e}")))
}

fn path_str(path: &Path) -> Result<&str, HandsError> {
    path.to_str()
        .ok_or_else(|| HandsError::Workspace(format!("{} is not valid UTF-8", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_container_is_hardened() {
        let config = SandboxConfig::new("img", "/w", ExecutionId::new());
        let body = container_body(
            &config,
            vec!["/w:/workspace:rw".to_owned()],
            "1:1",
            &[],
            MainProcess::Executor(Transport::Socket),
        );
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(
            host.security_opt,
            Some(vec!["no-new-privileges".to_owned()])
        );
        assert_eq!(host.readonly_rootfs, Some(true));
        assert_eq!(host.init, Some(true));
        assert_eq!(host.pids_limit, Some(256));
        assert_eq!(
            host.memory, host.memory_swap,
            "no swap beyond the memory limit"
        );
        assert!(host.tmpfs.unwrap()["/tmp"].contains("noexec"));
        assert_eq!(host.binds, Some(vec!["/w:/workspace:rw".to_owned()]));
        assert_eq!(body.network_disabled, Some(true));
        assert_eq!(body.labels.unwrap()[LABEL_MANAGED], "true");
        assert_eq!(
            body.cmd.unwrap(),
            [
                CONTAINER_EXECUTOR_PATH,
                "--root",
                "/workspace",
                "--control-socket",
                "/run/nerve-control/executor.sock"
            ]
        );
        assert_eq!(body.open_stdin, Some(false), "nothing is written to stdin");
        assert_eq!(body.attach_stderr, Some(true), "stderr explains failures");
        assert_eq!(host.log_config.unwrap().typ.as_deref(), Some("none"));
    }

    #[test]
    fn the_image_environment_is_kept_but_for_credentials() {
        let image = [
            "PATH=/opt/tool/bin:/usr/bin".to_owned(),
            "LANG=C.UTF-8".to_owned(),
            "API_TOKEN=sekrit".to_owned(),
        ];
        assert_eq!(
            base_env(&image),
            ["PATH=/opt/tool/bin:/usr/bin", "LANG=C.UTF-8", "API_TOKEN="]
        );
        assert_eq!(base_env(&[]), [format!("PATH={DEFAULT_PATH}")]);
    }

    #[test]
    fn cgroup_counters_v1_and_v2() {
        let v1 = "/sys/fs/cgroup/memory/memory.oom_control oom_kill_disable 0\n\
                  /sys/fs/cgroup/memory/memory.oom_control oom_kill 2\n\
                  /sys/fs/cgroup/pids/pids.events max 3\n";
        assert_eq!(
            parse_counters(v1),
            Some(Counters {
                oom_kills: 2,
                pids_refused: 3
            })
        );
        let v2 = "/sys/fs/cgroup/memory.events low 0\n/sys/fs/cgroup/memory.events oom 4\n\
                  /sys/fs/cgroup/memory.events oom_kill 1\n";
        assert_eq!(
            parse_counters(v2),
            Some(Counters {
                oom_kills: 1,
                pids_refused: 0
            })
        );
        assert_eq!(parse_counters(""), None);
        assert_eq!(human_bytes(512 << 20), "512 MiB");
        assert_eq!(human_bytes(2 << 30), "2 GiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
    }

    #[test]
    fn through_the_attach_stream_the_executor_reads_stdin() {
        let config = SandboxConfig::new("img", "/w", ExecutionId::new());
        let main = MainProcess::Executor(Transport::Attach);
        let body = container_body(&config, Vec::new(), "1:1", &[], main);
        assert_eq!(
            body.cmd.unwrap(),
            [CONTAINER_EXECUTOR_PATH, "--root", "/workspace"]
        );
        assert_eq!(
            (body.open_stdin, body.attach_stdout, body.attach_stderr),
            (Some(true), Some(true), Some(true))
        );
    }

    #[test]
    fn with_a_proxy_the_executor_relays_to_its_socket() {
        let config = SandboxConfig {
            proxy: Some(ProxyMount {
                host_dir: "/tmp/nerve-proxy-x".into(),
            }),
            ..SandboxConfig::new("img", "/w", ExecutionId::new())
        };
        let main = MainProcess::Executor(Transport::Attach);
        let body = container_body(&config, Vec::new(), "1:1", &[], main);
        assert_eq!(
            body.cmd.unwrap()[3..],
            [
                "--proxy-socket",
                "/run/nerve/proxy.sock",
                "--proxy-listen",
                "127.0.0.1:3128"
            ]
        );
        assert!(proxy_env().contains(&"http_proxy=http://127.0.0.1:3128".to_owned()));
        assert_eq!(
            body.host_config.unwrap().network_mode.as_deref(),
            Some("none")
        );
    }
}
