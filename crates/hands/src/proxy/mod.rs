//! The credential-injecting auth proxy: the only way out of the sandbox, and the only place
//! a secret is used.
//!
//! The proxy runs on the host and listens on a unix socket in a directory of its own, which
//! the sandbox gets read-only at [`CONTAINER_PROXY_DIR`]. The container has no network; the
//! executor relays TCP connections to [`RELAY_LISTEN`] on the container's own loopback to
//! that socket, and commands find it through `HTTP_PROXY`. The `http_request` tool sends
//! its requests to the same socket from the host ([`ProxyClient`]).
//!
//! Gateway mode: the sandbox speaks plain HTTP (`GET http://api.example.com/...`) and the
//! proxy speaks TLS upstream when the rule says so, adding the rule's credential and
//! removing any credential header the sandbox sent. `CONNECT` tunnels are opened only to
//! hosts whose rule lists `CONNECT` and carries no credential. Everything else is denied,
//! and every decision is an event. See `docs/proxy.md`.
//!
//! Architecture: `rules` is the policy (pure), `target` parses where a request goes,
//! `resolve` turns names into addresses and says which are not global, `scrub` removes
//! secrets from answers, `server` is the request path, `client` the tool's side.

mod client;
mod resolve;
mod rules;
mod scrub;
mod server;
mod target;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_core::{EventSink, ExecutionId};

pub use client::{ClientLimits, HttpRequest, HttpResponse, ProxyClient};
pub use resolve::{Resolve, SystemResolver, non_global_reason};
pub use rules::{
    Credential, HostPattern, ProxyConfig, ProxyLimits, ProxyRule, SECRET_PLACEHOLDER,
    UpstreamScheme, normalize_host,
};
pub use server::PROXY_HEADER;

use crate::HandsError;

/// Where the proxy's directory is mounted (read-only) inside the container.
pub const CONTAINER_PROXY_DIR: &str = "/run/nerve";
/// The socket's name in that directory.
pub const PROXY_SOCKET_NAME: &str = "proxy.sock";
/// Where the executor's relay listens inside the container: `HTTP_PROXY` points here.
pub const RELAY_LISTEN: &str = "127.0.0.1:3128";

/// What the sandbox needs to reach a proxy: the host directory to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyMount {
    /// The host directory holding the socket, mounted read-only at [`CONTAINER_PROXY_DIR`].
    pub host_dir: PathBuf,
}

impl ProxyMount {
    pub fn host_socket(&self) -> PathBuf {
        self.host_dir.join(PROXY_SOCKET_NAME)
    }

    /// The socket's path inside the container.
    pub fn container_socket() -> String {
        format!("{CONTAINER_PROXY_DIR}/{PROXY_SOCKET_NAME}")
    }
}

/// A proxy whose socket exists but that does not serve yet: the sandbox can be created
/// with its directory mounted before the event log that the proxy writes to is open.
/// Connections made before [`ProxyListener::serve`] wait in the socket's backlog.
#[derive(Debug)]
pub struct ProxyListener {
    dir: tempfile::TempDir,
    listener: std::os::unix::net::UnixListener,
    config: ProxyConfig,
}

impl ProxyListener {
    /// Validates the rules and creates the socket in a new private directory (mode 0700)
    /// under the system's temporary directory.
    pub fn bind(config: ProxyConfig) -> Result<Self, HandsError> {
        config.validate()?;
        remove_stale_dirs(&std::env::temp_dir());
        let dir = tempfile::Builder::new()
            .prefix("nerve-proxy-")
            .tempdir()
            .map_err(|e| HandsError::Proxy(format!("cannot create the proxy's directory: {e}")))?;
        let socket = dir.path().join(PROXY_SOCKET_NAME);
        let listener = std::os::unix::net::UnixListener::bind(&socket).map_err(|e| {
            HandsError::Proxy(format!("cannot listen on {}: {e}", socket.display()))
        })?;
        let private = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| HandsError::Proxy(format!("{}: {e}", path.display())))
        };
        // Only the sandbox's user (and ours) may connect: any host user who could would
        // get the rules' credentials injected.
        private(dir.path(), 0o700)?;
        private(&socket, 0o600)?;
        listener
            .set_nonblocking(true)
            .map_err(|e| HandsError::Proxy(format!("cannot listen: {e}")))?;
        Ok(Self {
            dir,
            listener,
            config,
        })
    }

    pub fn mount(&self) -> ProxyMount {
        ProxyMount {
            host_dir: self.dir.path().to_path_buf(),
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join(PROXY_SOCKET_NAME)
    }

    /// Starts serving on the current tokio runtime; decisions go to `sink` as events of
    /// `execution`. Must be called inside a runtime.
    pub fn serve(
        self,
        sink: Arc<dyn EventSink>,
        execution: ExecutionId,
    ) -> Result<Proxy, HandsError> {
        let listener = tokio::net::UnixListener::from_std(self.listener)
            .map_err(|e| HandsError::Proxy(format!("cannot listen: {e}")))?;
        let client_timeout = self.config.limits.total_timeout + std::time::Duration::from_secs(10);
        let shared = Arc::new(server::Shared::new(self.config, sink, execution));
        let task = tokio::spawn(server::serve(listener, Arc::clone(&shared)));
        let mut client = ProxyClient::new(self.dir.path().join(PROXY_SOCKET_NAME));
        client.limits.timeout = client_timeout;
        Ok(Proxy {
            dir: self.dir,
            task,
            client,
            shared,
        })
    }
}

/// How old a proxy's directory must be before it may be judged dead: a proxy that has bound
/// its socket but not yet listened on it (or whose process is descheduled in between on a
/// loaded machine) refuses connections too.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

/// Removes the directories of proxies whose process died without cleaning up (a `nerve`
/// killed with SIGKILL): their socket exists but nobody listens on it. A directory whose
/// socket is missing, or that changed within [`STALE_AFTER`], may be one being set up right
/// now, and is left alone.
fn remove_stale_dirs(temp: &Path) {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with("nerve-proxy-")
        {
            continue;
        }
        let recent = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|modified| modified.elapsed().map_or(true, |age| age < STALE_AFTER));
        if recent {
            continue;
        }
        let socket = entry.path().join(PROXY_SOCKET_NAME);
        let refused = std::os::unix::net::UnixStream::connect(&socket)
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::debug!(dir = %entry.path().display(), "removed a dead proxy's directory");
        }
    }
}

/// A serving proxy. Dropping it stops it (open connections and tunnels included) and
/// removes its directory.
#[derive(Debug)]
pub struct Proxy {
    dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
    client: ProxyClient,
    shared: Arc<server::Shared>,
}

impl Proxy {
    /// Binds and serves at once (see [`ProxyListener`] for the two steps).
    pub fn start(
        config: ProxyConfig,
        sink: Arc<dyn EventSink>,
        execution: ExecutionId,
    ) -> Result<Self, HandsError> {
        ProxyListener::bind(config)?.serve(sink, execution)
    }

    pub fn mount(&self) -> ProxyMount {
        ProxyMount {
            host_dir: self.dir.path().to_path_buf(),
        }
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join(PROXY_SOCKET_NAME)
    }

    /// A client for the `http_request` tool.
    pub fn client(&self) -> ProxyClient {
        self.client.clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.close();
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dead_proxies_directories_are_removed() {
        let temp = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let dir = temp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            dir
        };
        let dead = make("nerve-proxy-dead");
        drop(std::os::unix::net::UnixListener::bind(dead.join(PROXY_SOCKET_NAME)).unwrap());
        let live = make("nerve-proxy-live");
        let _listener =
            std::os::unix::net::UnixListener::bind(live.join(PROXY_SOCKET_NAME)).unwrap();
        let starting = make("nerve-proxy-starting");
        let other = make("something-else");
        drop(std::os::unix::net::UnixListener::bind(other.join(PROXY_SOCKET_NAME)).unwrap());
        // A dead proxy's directory made just now: maybe a proxy between bind and listen.
        let young = make("nerve-proxy-young");
        drop(std::os::unix::net::UnixListener::bind(young.join(PROXY_SOCKET_NAME)).unwrap());
        let old = std::time::SystemTime::now() - 2 * STALE_AFTER;
        for dir in [&dead, &live, &starting, &other] {
            std::fs::File::open(dir).unwrap().set_modified(old).unwrap();
        }
        remove_stale_dirs(temp.path());
        assert!(!dead.exists());
        assert!(live.exists() && starting.exists() && other.exists() && young.exists());
    }
}
