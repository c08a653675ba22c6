//! The control socket: the executor's direct line to the host. The engine's attach stream
//! carries every byte through dockerd and containerd-shim, several process hops each way;
//! a unix socket between the two processes carries it through the kernel alone.
//!
//! The host listens, the executor connects. Before the container starts, the host binds the
//! socket in a private directory of its own (mode 0700, handed to the sandbox's user as the
//! proxy's is), which the container gets read-only at [`CONTAINER_CONTROL_DIR`]. It accepts
//! exactly one connection, then closes the listener and removes the socket file, all before
//! its first request. Nothing but the executor can have connected: the container was just
//! started (or restarted from stopped, which killed everything in it), and no command runs
//! before the first request. Afterwards there is nothing left to connect to, and the
//! executor's end of the stream is close-on-exec, so no command inherits it. The peer's uid
//! (`SO_PEERCRED`) must be the sandbox's: a process of another host user cannot take the
//! executor's place even in the moment before it connects.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixStream;

/// Where the control directory is mounted (read-only) inside the container.
pub(crate) const CONTAINER_CONTROL_DIR: &str = "/run/nerve-control";
/// How the host directory's name starts (the reaper removes those of dead processes).
pub(crate) const CONTROL_DIR_PREFIX: &str = "nerve-control-";
/// How long a connection to a spawn socket may take to say its hello line.
const HELLO_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// The socket's name in that directory.
pub(crate) const SOCKET_NAME: &str = "executor.sock";

/// The numeric `uid` and optional `gid` of a `uid:gid` user string; `None` for a user
/// name, which the host cannot map without the image's passwd file.
pub(crate) fn numeric_user(user: &str) -> Option<(u32, Option<u32>)> {
    let mut ids = user.split(':');
    let uid = ids.next()?.parse().ok()?;
    let gid = ids.next().and_then(|gid| gid.parse().ok());
    Some((uid, gid))
}

/// Makes `path` belong to `uid` (and `gid`) unless it already belongs to `uid`. Takes root
/// when `uid` is not ours.
pub(crate) fn hand_over(path: &Path, (uid, gid): (u32, Option<u32>)) -> std::io::Result<()> {
    if std::fs::metadata(path)?.uid() == uid {
        return Ok(());
    }
    std::os::unix::fs::chown(path, Some(uid), gid)
}

/// The host directory of one sandbox's control socket, removed when dropped. It lives as
/// long as the container: every (re)start binds a new socket in it.
#[derive(Debug)]
pub(crate) struct ControlDir {
    dir: tempfile::TempDir,
    owner: (u32, Option<u32>),
}

impl ControlDir {
    /// Creates the directory (mode 0700) for a sandbox whose commands run as `user`. The
    /// error says why the socket cannot be used (a user name, no right to hand the
    /// directory over); the sandbox then talks through the attach stream.
    pub(crate) fn create(user: &str) -> Result<Self, String> {
        let owner = numeric_user(user)
            .ok_or_else(|| format!("the sandbox's user {user:?} is not numeric"))?;
        let dir = tempfile::Builder::new()
            .prefix(CONTROL_DIR_PREFIX)
            .tempdir()
            .map_err(|e| format!("cannot create the control directory: {e}"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .and_then(|()| hand_over(dir.path(), owner))
            .map_err(|e| {
                format!(
                    "cannot give {} to uid {}: {e}",
                    dir.path().display(),
                    owner.0
                )
            })?;
        Ok(Self { dir, owner })
    }

    pub(crate) fn host_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The socket's path inside the container, for the executor's `--control-socket`.
    pub(crate) fn container_socket() -> String {
        format!("{CONTAINER_CONTROL_DIR}/{SOCKET_NAME}")
    }

    /// Binds a fresh socket (mode 0600, the sandbox user's), replacing one a failed start
    /// left behind. Must run on a tokio runtime.
    pub(crate) fn listen(&self) -> Result<ControlListener, String> {
        let path = self.dir.path().join(SOCKET_NAME);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!("cannot remove {}: {e}", path.display()));
            }
            Ok(()) | Err(_) => {}
        }
        let shown = path.display().to_string();
        let fail = |e: std::io::Error| format!("cannot listen on {shown}: {e}");
        let bound = std::os::unix::net::UnixListener::bind(&path).map_err(fail)?;
        // From here on, dropping `listener` removes the file.
        let mut listener = ControlListener {
            path,
            listener: None,
            uid: self.owner.0,
        };
        std::fs::set_permissions(&listener.path, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| hand_over(&listener.path, self.owner))
            .and_then(|()| bound.set_nonblocking(true))
            .and_then(|()| tokio::net::UnixListener::from_std(bound))
            .map(|bound| listener.listener = Some(bound))
            .map_err(fail)?;
        Ok(listener)
    }
}

/// A one-off socket for the stdio of one process the executor spawns (an MCP server):
/// the executor connects twice (stdio, stderr), each connection introduced by a hello line
/// with the nonce the host sent on the control connection. Commands of the sandbox can
/// reach the socket too, which is why the nonce decides, not the order of arrival. Dropping
/// it removes the file.
#[derive(Debug)]
pub(crate) struct SpawnListener {
    path: PathBuf,
    listener: tokio::net::UnixListener,
    uid: u32,
    /// The socket's path inside the container.
    pub(crate) container_path: String,
    pub(crate) nonce: String,
}

/// The two connections of a spawned process.
#[derive(Debug)]
pub(crate) struct SpawnStreams {
    pub(crate) stdio: UnixStream,
    pub(crate) stderr: UnixStream,
}

impl ControlDir {
    /// Binds a fresh one-off socket (mode 0600, the sandbox user's) with a random name and
    /// nonce. Must run on a tokio runtime.
    pub(crate) fn listen_spawn(&self) -> Result<SpawnListener, String> {
        let nonce = random_hex()?;
        let name = format!("spawn-{}.sock", &nonce[..16]);
        let path = self.dir.path().join(&name);
        let shown = path.display().to_string();
        let fail = |e: std::io::Error| format!("cannot listen on {shown}: {e}");
        let bound = std::os::unix::net::UnixListener::bind(&path).map_err(fail)?;
        let cleanup = |e| {
            let _ = std::fs::remove_file(&path);
            fail(e)
        };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| hand_over(&path, self.owner))
            .and_then(|()| bound.set_nonblocking(true))
            .map_err(cleanup)?;
        let listener = tokio::net::UnixListener::from_std(bound).map_err(cleanup)?;
        Ok(SpawnListener {
            path,
            listener,
            uid: self.owner.0,
            container_path: format!("{CONTAINER_CONTROL_DIR}/{name}"),
            nonce,
        })
    }
}

impl SpawnListener {
    /// Accepts connections until both of the executor's have introduced themselves with the
    /// nonce; others (a wrong uid, a wrong or missing hello) are closed. The error says why
    /// the streams did not arrive.
    pub(crate) async fn accept(self, limit: std::time::Duration) -> Result<SpawnStreams, String> {
        use tokio::io::AsyncReadExt;
        let work = async {
            let (mut stdio, mut stderr) = (None, None);
            // Ends: bounded by `limit` (the timeout around `work`); a hello is at most 256
            // bytes.
            while stdio.is_none() || stderr.is_none() {
                let (mut stream, _) = self
                    .listener
                    .accept()
                    .await
                    .map_err(|e| format!("cannot accept the spawned process's stream: {e}"))?;
                let Ok(peer) = stream.peer_cred() else {
                    continue;
                };
                if check_peer(peer.uid(), self.uid, peer.pid()).is_err() {
                    continue;
                }
                // The hello line, read a byte at a time so nothing after it is consumed; a
                // connection that does not say it at once cannot hold up the executor's.
                let mut hello = Vec::new();
                let read_hello = async {
                    let mut byte = [0u8; 1];
                    while hello.len() < 256 {
                        match stream.read(&mut byte).await {
                            Ok(1) if byte[0] == b'\n' => break,
                            Ok(1) => hello.push(byte[0]),
                            _ => break,
                        }
                    }
                };
                if tokio::time::timeout(HELLO_LIMIT, read_hello).await.is_err() {
                    continue;
                }
                let Ok(hello) = serde_json::from_slice::<nerve_executor::StreamHello>(&hello)
                else {
                    continue;
                };
                if hello.nonce != self.nonce {
                    continue;
                }
                match hello.stream.as_str() {
                    "stdio" => stdio = Some(stream),
                    "stderr" => stderr = Some(stream),
                    _ => {}
                }
            }
            match (stdio, stderr) {
                (Some(stdio), Some(stderr)) => Ok(SpawnStreams { stdio, stderr }),
                _ => Err("the spawned process's streams did not arrive".to_owned()),
            }
        };
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| format!("the spawned process's streams did not arrive within {limit:?}"))?
    }
}

impl Drop for SpawnListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// 32 random hex digits from the kernel.
fn random_hex() -> Result<String, String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| random.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A bound control socket waiting for the executor. Dropping it (accepted, timed out,
/// cancelled) closes it and removes its file.
#[derive(Debug)]
pub(crate) struct ControlListener {
    path: PathBuf,
    listener: Option<tokio::net::UnixListener>,
    /// The uid the executor must run as.
    uid: u32,
}

impl ControlListener {
    /// Accepts the one connection the executor makes and closes the socket. The error says
    /// why no executor is on the line.
    pub(crate) async fn accept(self) -> Result<UnixStream, String> {
        let Some(listener) = &self.listener else {
            return Err("the control socket is not listening".to_owned());
        };
        let (stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("cannot accept the executor's connection: {e}"))?;
        let uid = self.uid;
        drop(self);
        let peer = stream
            .peer_cred()
            .map_err(|e| format!("cannot identify the control socket's peer: {e}"))?;
        check_peer(peer.uid(), uid, peer.pid())?;
        Ok(stream)
    }
}

/// The peer must run as the sandbox's user (in the host's terms: with a user namespace
/// remapping uids, the socket could not have been handed over either).
fn check_peer(peer: u32, expected: u32, pid: Option<i32>) -> Result<(), String> {
    if peer == expected {
        return Ok(());
    }
    let pid = pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
    Err(format!(
        "refused a control connection from uid {peer}{pid}: the executor runs as uid {expected}"
    ))
}

impl Drop for ControlListener {
    fn drop(&mut self) {
        self.listener = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_numeric_or_unknown() {
        assert_eq!(numeric_user("1000:100"), Some((1000, Some(100))));
        assert_eq!(numeric_user("0"), Some((0, None)));
        assert_eq!(numeric_user("nobody"), None);
        assert_eq!(numeric_user("1000:staff"), Some((1000, None)));
    }

    #[test]
    fn only_the_sandbox_user_may_be_the_peer() {
        assert_eq!(check_peer(1000, 1000, Some(7)), Ok(()));
        assert_eq!(
            check_peer(0, 1000, Some(7)),
            Err(
                "refused a control connection from uid 0 (pid 7): the executor runs as uid 1000"
                    .to_owned()
            )
        );
    }

    /// The uid of this process, as the owner of a file it creates.
    fn own_user() -> String {
        let file = tempfile::NamedTempFile::new().unwrap();
        let meta = std::fs::metadata(file.path()).unwrap();
        format!("{}:{}", meta.uid(), meta.gid())
    }

    #[tokio::test]
    async fn one_connection_is_accepted_then_the_socket_is_gone() {
        let control = ControlDir::create(&own_user()).unwrap();
        let mode = std::fs::metadata(control.host_dir()).unwrap().mode();
        assert_eq!(mode & 0o777, 0o700);
        let socket = control.host_dir().join(SOCKET_NAME);
        let listener = control.listen().unwrap();
        assert_eq!(std::fs::metadata(&socket).unwrap().mode() & 0o777, 0o600);
        let connecting = UnixStream::connect(&socket);
        let (accepted, client) = tokio::join!(listener.accept(), connecting);
        let (accepted, _client) = (accepted.unwrap(), client.unwrap());
        assert!(accepted.peer_cred().is_ok());
        assert!(!socket.exists(), "the socket file is removed once accepted");
        assert!(UnixStream::connect(&socket).await.is_err());
        // A restart binds a fresh socket in the same directory.
        let again = control.listen().unwrap();
        assert!(socket.exists());
        drop(again);
        assert!(
            !socket.exists(),
            "an unused listener removes its socket too"
        );
        let dir = control.host_dir().to_path_buf();
        drop(control);
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn a_spawn_socket_takes_only_connections_with_the_nonce() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let control = ControlDir::create(&own_user()).unwrap();
        let listener = control.listen_spawn().unwrap();
        let name = listener
            .container_path
            .rsplit('/')
            .next()
            .unwrap()
            .to_owned();
        let socket = control.host_dir().join(&name);
        assert_eq!(std::fs::metadata(&socket).unwrap().mode() & 0o777, 0o600);
        let nonce = listener.nonce.clone();
        assert_eq!(nonce.len(), 32);
        let connect = |hello: String| {
            let socket = socket.clone();
            async move {
                let mut stream = UnixStream::connect(&socket).await.unwrap();
                stream.write_all(hello.as_bytes()).await.unwrap();
                stream
            }
        };
        let intruder = connect(format!(
            "{{\"nonce\":\"{}\",\"stream\":\"stdio\"}}\n",
            "f".repeat(32)
        ))
        .await;
        let garbage = connect("hello\n".to_owned()).await;
        let mut stdio = connect(format!(
            "{{\"nonce\":\"{nonce}\",\"stream\":\"stdio\"}}\nfirst bytes"
        ))
        .await;
        let _stderr = connect(format!("{{\"nonce\":\"{nonce}\",\"stream\":\"stderr\"}}\n")).await;
        let mut streams = listener
            .accept(std::time::Duration::from_secs(60))
            .await
            .unwrap();
        assert!(!socket.exists(), "the one-off socket is removed");
        let mut first = [0u8; 11];
        streams.stdio.read_exact(&mut first).await.unwrap();
        assert_eq!(&first, b"first bytes");
        stdio.write_all(b"!").await.unwrap();
        streams.stdio.read_exact(&mut first[..1]).await.unwrap();
        assert_eq!(first[0], b'!');
        drop((intruder, garbage));
    }

    #[tokio::test]
    async fn a_peer_of_another_uid_is_refused() {
        let control = ControlDir::create(&own_user()).unwrap();
        let mut listener = control.listen().unwrap();
        listener.uid = listener.uid.wrapping_add(1);
        let socket = control.host_dir().join(SOCKET_NAME);
        let (accepted, _client) = tokio::join!(listener.accept(), UnixStream::connect(&socket));
        let refused = accepted.unwrap_err();
        assert!(
            refused.starts_with("refused a control connection from uid"),
            "{refused}"
        );
        assert!(!socket.exists());
    }
}
