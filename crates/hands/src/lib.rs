//! Nerve's hands: the agent's tools, run inside a hardened, per-execution Docker sandbox
//! managed through bollard. Nothing here knows about the model or the event log; `brain`
//! reaches the tools through [`nerve_core::ToolExecutor`].
//!
//! Architecture: [`Sandbox`] owns one container and the persistent in-container executor
//! (`nerve-executor`, bind-mounted, spoken to in JSON lines over a unix socket it connects
//! to at start, see [`Transport`]); [`SandboxTools`] turns the
//! model's tool calls into executor requests and the answers into model-facing text.
//! [`proxy`] is the credential-injecting auth proxy on the host: the sandbox's only way to
//! the network, through a unix socket mounted into the container.

mod account;
pub mod build;
pub mod caches;
pub mod checkpoint;
mod control;
pub mod debian;
pub mod devcontainer;
mod executor;
mod image;
#[cfg(feature = "kill-points")]
pub mod kill_points;
mod locate;
pub mod mcp;
mod owner;
mod percall;
pub mod proxy;
mod sandbox;
mod tools;

pub use account::{HomeRemoval, HomeSweep, discard as discard_sandbox_home};
pub use debian::{BuildWork, DebianBuild, DebianImage, ensure_debian_image};
pub use executor::Transport;
pub use image::{DEFAULT_IMAGE, ImageSource, build_default_image, image_exists};
pub use locate::{
    CONTAINER_EXECUTOR_PATH, CarriedExecutor, EXECUTOR_ENV, carry_executor, locate_executor,
};
pub use proxy::{Proxy, ProxyClient, ProxyConfig, ProxyListener, ProxyMount, ProxyRule};
pub use sandbox::{
    Backend, ExecutorUse, ReapReport, ReapScope, Sandbox, SandboxConfig, SpawnedProcess,
    connect_docker, reap, reap_orphans, reap_with,
};
pub use tools::{
    EditFileArgs, GrepArgs, HttpRequestArgs, ListDirArgs, ReadFileArgs, SandboxTools, ShellArgs,
    WriteFileArgs,
};

/// The executor protocol types that [`Sandbox`]'s operations take and return.
pub mod protocol {
    pub use nerve_executor::{
        DirEntry, EditFileOutput, EditFileRequest, EntryKind, ExecOutput, ExecRequest, GrepOutput,
        GrepRequest, ListDirOutput, ListDirRequest, ReadFileOutput, ReadFileRequest, VERSION,
        WriteFileOutput, WriteFileRequest,
    };
}

/// Errors of the sandbox layer. None is shown to the model: a model-visible tool failure
/// is a [`nerve_core::ToolOutput::error`], not one of these.
#[derive(Debug, thiserror::Error)]
pub enum HandsError {
    /// No Docker engine answered on the local socket. Returned by [`connect_docker`];
    /// retryable once an engine runs.
    #[error(
        "cannot reach the Docker engine ({0}); is dockerd running and is /var/run/docker.sock accessible?"
    )]
    DockerUnavailable(String),
    /// The sandbox image is missing. Returned by [`Sandbox::start`]; not retryable until
    /// the image is built (`cargo xtask image` for the default one) or loaded.
    #[error("{}", image_missing(.0))]
    ImageMissing(String),
    /// The image has no `/bin/sh`, which the `shell` tool runs commands with. Returned by
    /// [`Sandbox::start`], which leaves no container behind.
    #[error(
        "sandbox image `{0}` has no /bin/sh, so the shell tool cannot run in it; use an image with a POSIX shell at /bin/sh"
    )]
    NoShell(String),
    /// Building the default image failed (no static busybox on the host, a bad tarball).
    /// Returned by [`build_default_image`].
    #[error("cannot build the sandbox image: {0}")]
    ImageBuild(String),
    /// The workspace directory is missing or not a directory. Returned by [`Sandbox::start`].
    #[error("workspace {0}")]
    Workspace(String),
    /// The persistent executor stopped, hung or broke the protocol during a call; the call's
    /// effect is unknown. Returned by [`Sandbox`]'s operations; retryable: the executor is
    /// restarted (or the sandbox falls back to per-call exec) at the next call.
    #[error("sandbox executor: {0}")]
    Executor(String),
    /// The executor stopped too often or cannot be restarted: the sandbox runs nothing any
    /// more. Returned by [`Sandbox`]'s operations; not retryable within the execution.
    #[error("the sandbox is lost: {0}")]
    SandboxLost(String),
    /// The proxy's rules are invalid (a duplicate host, a credential without `{secret}`, a
    /// secret too short to redact). Returned by [`ProxyConfig::validate`] and
    /// [`ProxyListener::bind`]; not retryable until the configuration is fixed.
    #[error("invalid proxy rules: {0}")]
    ProxyConfig(String),
    /// The proxy cannot start (its directory or socket cannot be created). Returned by
    /// [`ProxyListener::bind`] and [`ProxyListener::serve`].
    #[error("auth proxy: {0}")]
    Proxy(String),
    /// The execution's sandbox name is held by another container that cannot be removed
    /// safely: its owner is alive, or cannot be proven dead (another host, boot or PID
    /// namespace, an unreadable owner label), or it is not Nerve's. Returned by
    /// [`Sandbox::start`]; retryable once that run ended or the container was removed
    /// (`nerve reap --all`).
    #[error("{0}")]
    SandboxInUse(String),
    /// The Docker engine refused or failed an operation on the container. Returned by
    /// every container operation; the sandbox should be considered lost.
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    /// The sandbox's executor cannot run (none found, not a static binary, or it failed to
    /// start) and the per-call fallback was not allowed
    /// ([`SandboxConfig::per_call_fallback`]). Returned by [`Sandbox::start`]; not
    /// retryable until an executor is provided.
    #[error(
        "the sandbox executor cannot run ({0}); set {exe} to a static nerve-executor (`cargo xtask image` builds one), or allow the slower per-call docker exec fallback",
        exe = EXECUTOR_ENV
    )]
    NoExecutor(String),
    /// A workspace snapshot, diff or restore failed (a store that cannot be read or
    /// written, a damaged object, a hash that is not one). Returned by [`checkpoint::Checkpoints`];
    /// the workspace is as it was unless the error came from a restore.
    #[error("workspace checkpoint: {0}")]
    Checkpoint(String),
}

/// What to do about a missing image: the default one is built here; any other is the
/// user's to build or load, since Nerve never pulls.
fn image_missing(image: &str) -> String {
    if image == DEFAULT_IMAGE {
        format!(
            "sandbox image `{image}` not found; build it with `cargo xtask image` (or pass --image)"
        )
    } else {
        format!(
            "sandbox image `{image}` not found in the local Docker engine, and Nerve never pulls: build or load it there first (`docker build -t {image} .`, `docker load`), or pass another --image"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_image_says_what_to_do_for_its_kind() {
        let default = HandsError::ImageMissing(DEFAULT_IMAGE.to_owned()).to_string();
        assert!(default.contains("cargo xtask image"), "{default}");
        let user = HandsError::ImageMissing("python:3.12".to_owned()).to_string();
        assert!(!user.contains("xtask"), "{user}");
        assert!(user.contains("never pulls"), "{user}");
        assert!(user.contains("docker build -t python:3.12 ."), "{user}");
    }
}
