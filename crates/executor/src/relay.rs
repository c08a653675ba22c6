//! The relay to the auth proxy: the sandbox has no network, only its own loopback, and the
//! proxy listens on a unix socket mounted read-only into the container. The relay listens
//! on a loopback TCP port (where `HTTP_PROXY` points) and copies each connection, both
//! ways, to a fresh connection to that socket. It knows nothing of HTTP: the proxy judges
//! every request.
//!
//! Plain std threads, like the rest of the executor: one accepting, two per connection.
//! Connections beyond [`RelayConfig::max_connections`] are closed at once, so a command
//! cannot exhaust the container's pids limit through the relay.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where the relay listens by default.
pub const DEFAULT_RELAY_LISTEN: &str = "127.0.0.1:3128";

/// Where the relay listens and where it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The proxy's unix socket.
    pub socket: PathBuf,
    /// The loopback address to listen on.
    pub listen: SocketAddr,
    /// Connections relayed at once; more are closed.
    pub max_connections: usize,
}

impl RelayConfig {
    pub fn new(socket: impl Into<PathBuf>, listen: SocketAddr) -> Self {
        Self {
            socket: socket.into(),
            listen,
            max_connections: 32,
        }
    }
}

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    local: SocketAddr,
    active: Arc<AtomicUsize>,
}

impl Relay {
    /// The address it listens on (the bound port when the config asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Connections being relayed now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }
}

/// Binds the listener (so that a bad address fails here, not later) and relays on a
/// background thread for the rest of the process's life.
pub fn spawn_relay(config: RelayConfig) -> io::Result<Relay> {
    let listener = TcpListener::bind(config.listen)?;
    let local = listener.local_addr()?;
    let active = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&active);
    std::thread::Builder::new()
        .name("proxy-relay".to_owned())
        .spawn(move || accept_loop(&listener, &config, &counter))?;
    Ok(Relay { local, active })
}

fn accept_loop(listener: &TcpListener, config: &RelayConfig, active: &Arc<AtomicUsize>) {
    for client in listener.incoming() {
        let Ok(client) = client else {
            // Out of descriptors or a connection reset before accept: keep serving.
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        };
        if active.fetch_add(1, Ordering::SeqCst) >= config.max_connections {
            active.fetch_sub(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let socket = config.socket.clone();
        let counter = Arc::clone(active);
        let spawned = std::thread::Builder::new()
            .name("proxy-relay-conn".to_owned())
            .spawn(move || {
                relay_connection(client, &socket);
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Copies both ways until both directions are done; a half-close on one side is passed on
/// to the other.
fn relay_connection(client: TcpStream, socket: &std::path::Path) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        // The proxy is gone: closing the connection is the only answer we can give.
        return;
    };
    let _ = client.set_nodelay(true);
    let (Ok(client_read), Ok(upstream_write)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let to_proxy = std::thread::Builder::new()
        .name("proxy-relay-up".to_owned())
        .spawn(move || {
            let (mut from, mut to) = (client_read, upstream_write);
            let _ = copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    let (mut from, mut to) = (upstream, client);
    let _ = copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    match to_proxy {
        Ok(handle) => {
            let _ = handle.join();
        }
        Err(_) => {
            let _ = to.shutdown(Shutdown::Both);
        }
    }
}

/// `io::copy` with a 64 KiB buffer rather than its 8 KiB one: fewer system calls per body.
/// (`cargo xtask bench proxy` measured no difference within its noise.)
fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<u64> {
    let mut buffer = vec![0u8; 64 << 10];
    let mut total = 0;
    // Ends: each pass consumes what it read, until end of input or an error.
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) => return Ok(total),
            Ok(read) => read,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buffer[..read])?;
        total += read as u64;
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;
    use std::time::Duration;

    use super::*;

    /// A unix-socket server that answers each connection with `> ` and what it read, then
    /// closes.
    fn echo_server(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("proxy.sock");
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                std::thread::spawn(move || {
                    let mut input = Vec::new();
                    stream.read_to_end(&mut input).unwrap();
                    stream.write_all(b"> ").unwrap();
                    stream.write_all(&input).unwrap();
                });
            }
        });
        path
    }

    fn relay(socket: PathBuf, max_connections: usize) -> Relay {
        let config = RelayConfig {
            max_connections,
            ..RelayConfig::new(socket, "127.0.0.1:0".parse().unwrap())
        };
        spawn_relay(config).unwrap()
    }

    fn exchange(address: SocketAddr, message: &[u8]) -> Vec<u8> {
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream.write_all(message).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        answer
    }

    #[test]
    fn connections_are_relayed_both_ways_with_half_close() {
        let dir = tempfile::tempdir().unwrap();
        let relay = relay(echo_server(dir.path()), 8);
        let address = relay.local_addr();
        assert_eq!(exchange(address, b"hello"), b"> hello");
        let big = vec![b'x'; 3 << 20];
        let answer = exchange(address, &big);
        assert_eq!(answer.len(), big.len() + 2);
        let threads: Vec<_> = (0..6)
            .map(|i| std::thread::spawn(move || exchange(address, format!("n{i}").as_bytes())))
            .collect();
        for (i, thread) in threads.into_iter().enumerate() {
            assert_eq!(thread.join().unwrap(), format!("> n{i}").into_bytes());
        }
    }

    #[test]
    fn a_missing_proxy_closes_the_connection() {
        let dir = tempfile::tempdir().unwrap();
        let relay = relay(dir.path().join("absent.sock"), 8);
        // Closed without an answer: an end of stream, or a reset since our bytes were
        // never read.
        let mut stream = TcpStream::connect(relay.local_addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let _ = stream.write_all(b"hello");
        let mut answer = Vec::new();
        match stream.read_to_end(&mut answer) {
            Ok(_) => assert_eq!(answer, b""),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
    }

    #[test]
    fn connections_beyond_the_limit_are_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.sock");
        // A proxy that accepts and holds every connection open.
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                held.push(stream.unwrap());
            }
        });
        let relay = relay(path, 2);
        let first = TcpStream::connect(relay.local_addr()).unwrap();
        let second = TcpStream::connect(relay.local_addr()).unwrap();
        while relay.active() < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut third = TcpStream::connect(relay.local_addr()).unwrap();
        third
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut buffer = [0u8; 1];
        match third.read(&mut buffer) {
            Ok(read) => assert_eq!(read, 0, "closed at once"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}"),
        }
        drop((first, second));
    }
}
