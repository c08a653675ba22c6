//! The host side of the persistent executor: `nerve-executor` runs as the container's main
//! process (under the engine's init), and the host speaks JSON lines with it, one request at
//! a time, over one of two transports ([`Transport`]):
//! - the control socket (`control.rs`): the executor connects to a unix socket the host
//!   listens on, and the lines go straight between the two processes. The executor's stderr
//!   still comes through an attach stream (stderr only), drained in the background into a
//!   tail kept to explain a failure; that stream ending is also how the host learns that
//!   the executor exited before it connected.
//! - the attach stream: the host attaches to the executor's stdin, stdout and stderr
//!   through the engine, which relays every line through dockerd and containerd-shim. The
//!   fallback when the socket cannot be handed to the sandbox's user or reached by it. The
//!   engine's init holds the same stdin and stdout, and any command can reach them through
//!   `/proc/1/fd`: on this transport a command can forge answers (docs/security.md).
//!
//! Either way the executor starts with the container: attaching or connecting costs no
//! `docker exec`, which on the engines we run takes a third as long as creating and
//! starting the whole container.
//!
//! Requests carry increasing ids. A call whose future was dropped after its request went out
//! leaves a response behind; the next call skips responses with older ids, so cancellation
//! never shifts answers onto the wrong request. A call dropped in the middle of writing its
//! line leaves the stream unusable, and the connection says so ([`Connection::is_poisoned`]).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use futures_util::{Stream, StreamExt};
use nerve_core::Interrupt;
use nerve_executor::{Op, Pong, Request, VERSION, decode_response};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::unix::OwnedReadHalf;
use tokio::task::JoinHandle;

use crate::control::ControlListener;

/// How long the executor may take to connect and answer its first ping.
const START_LIMIT: Duration = Duration::from_secs(15);
/// How much of the executor's stderr is kept to explain a failure.
const STDERR_KEPT: usize = 2048;
/// After the control socket ends, how long to wait for the rest of the executor's stderr,
/// which comes the slower way.
const STDERR_SETTLE: Duration = Duration::from_millis(500);

type Attached = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// How the host talks to the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// A unix socket the host listens on and the executor connects to at start: requests
    /// bypass the engine. The default.
    #[default]
    Socket,
    /// The engine's attach stream to the executor's stdin and stdout: the fallback when the
    /// socket cannot be handed to the sandbox's user (a user name, a host process without
    /// root serving another uid) or the executor cannot reach it (a user namespace). Commands
    /// can forge answers on it, through the engine's init, which shares those streams.
    Attach,
}

/// Why a call through the executor did not produce an answer. The connection is unusable
/// after any of these.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    /// The executor's output ended or its stream broke: it exited or was killed.
    #[error("the executor stopped ({0})")]
    Gone(String),
    /// No answer within the host-side limit.
    #[error("the executor did not answer within {0:?}")]
    TimedOut(Duration),
    /// The executor wrote something that is not a response to this request.
    #[error("the executor broke the protocol: {0}")]
    Protocol(String),
}

/// Where the executor's answers come from.
enum Output {
    /// The control socket; stderr comes through the [`StderrDrain`].
    Socket(OwnedReadHalf),
    /// The attach stream, stdout and stderr interleaved.
    Attach(Attached),
}

/// The tail of what the executor wrote to stderr.
#[derive(Debug, Default, Clone)]
struct StderrTail(Arc<Mutex<Vec<u8>>>);

impl StderrTail {
    fn keep(&self, message: &[u8]) {
        tracing::debug!(stderr = %String::from_utf8_lossy(message).trim_end(), "executor stderr");
        let mut tail = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        tail.extend_from_slice(message);
        let excess = tail.len().saturating_sub(STDERR_KEPT);
        tail.drain(..excess);
    }

    fn text(&self) -> String {
        let tail = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&tail).trim().to_owned()
    }
}

/// A background task copying a stderr-only attach stream into the tail. The stream ends
/// when the executor exits; dropping the drain stops it.
#[derive(Debug)]
struct StderrDrain {
    task: JoinHandle<()>,
    ended: bool,
}

impl StderrDrain {
    fn spawn(mut attached: Attached, tail: StderrTail) -> Self {
        let task = tokio::spawn(async move {
            while let Some(Ok(item)) = attached.next().await {
                match item {
                    LogOutput::StdErr { message }
                    | LogOutput::StdOut { message }
                    | LogOutput::Console { message } => tail.keep(&message),
                    LogOutput::StdIn { .. } => {}
                }
            }
        });
        Self { task, ended: false }
    }

    /// Resolves when the executor's stderr has ended: it has exited.
    async fn ended(&mut self) {
        if !self.ended {
            let _ = (&mut self.task).await;
            self.ended = true;
        }
    }
}

impl Drop for StderrDrain {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A transport readied before the container starts, so that nothing the executor writes
/// is missed; [`Pending::connect`] completes it once the container runs.
pub(crate) struct Pending(Prepared);

enum Prepared {
    Attach(Connection),
    Socket {
        listener: ControlListener,
        drain: StderrDrain,
        tail: StderrTail,
    },
}

impl Pending {
    /// Attaches to the executor's streams: all three for the attach transport, stderr
    /// alone beside the control socket's `listener`.
    pub(crate) async fn prepare(
        docker: &Docker,
        container: &str,
        listener: Option<ControlListener>,
    ) -> Result<Self, String> {
        let whole = listener.is_none();
        let options = AttachContainerOptionsBuilder::default()
            .stream(true)
            .stdin(whole)
            .stdout(whole)
            .stderr(true)
            .logs(false)
            .build();
        let attached = docker
            .attach_container(container, Some(options))
            .await
            .map_err(|e| format!("cannot attach to the executor: {e}"))?;
        let tail = StderrTail::default();
        Ok(Self(match listener {
            None => Prepared::Attach(Connection::new(
                attached.input,
                Output::Attach(attached.output),
                tail,
                None,
            )),
            Some(listener) => Prepared::Socket {
                listener,
                drain: StderrDrain::spawn(attached.output, tail.clone()),
                tail,
            },
        }))
    }

    /// Waits (within the start limit) for the executor to connect, once the container
    /// has started. The error is one line saying why no executor is there.
    pub(crate) async fn connect(self) -> Result<Connection, String> {
        let (listener, mut drain, tail) = match self.0 {
            Prepared::Attach(connection) => return Ok(connection),
            Prepared::Socket {
                listener,
                drain,
                tail,
            } => (listener, drain, tail),
        };
        let accepted = tokio::time::timeout(START_LIMIT, async {
            tokio::select! {
                accepted = listener.accept() => accepted,
                () = drain.ended() => Err("the executor exited before connecting".to_owned()),
            }
        })
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the executor did not connect within {START_LIMIT:?}"
            ))
        });
        match accepted {
            Ok(stream) => {
                let (read, write) = stream.into_split();
                Ok(Connection::new(
                    Box::pin(write),
                    Output::Socket(read),
                    tail,
                    Some(drain),
                ))
            }
            Err(reason) => Err(with_stderr(&reason, &tail)),
        }
    }
}

/// One running executor and the stream to it.
pub(crate) struct Connection {
    input: Input,
    output: Output,
    /// Bytes of output after the last complete line.
    pending: Vec<u8>,
    stderr: StderrTail,
    /// With the control socket, what collects the executor's stderr.
    drain: Option<StderrDrain>,
    next_id: u64,
    /// A request line was only partly written (its call was cancelled).
    poisoned: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("transport", &self.transport())
            .field("next_id", &self.next_id)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Connection {
    fn new(input: Input, output: Output, stderr: StderrTail, drain: Option<StderrDrain>) -> Self {
        Self {
            input,
            output,
            pending: Vec::new(),
            stderr,
            drain,
            next_id: 1,
            poisoned: false,
        }
    }

    pub(crate) fn transport(&self) -> Transport {
        match self.output {
            Output::Socket(_) => Transport::Socket,
            Output::Attach(_) => Transport::Attach,
        }
    }

    /// Waits for the first ping and checks the executor's version. The error is one line
    /// explaining why it cannot serve.
    pub(crate) async fn handshake(&mut self) -> Result<(), String> {
        match self.call::<Pong>(Op::Ping, START_LIMIT).await {
            Ok(Ok(pong)) if pong.version == VERSION => Ok(()),
            Ok(Ok(pong)) => Err(format!(
                "the executor is version {}, the host expects {VERSION}; rebuild it with `cargo xtask image`",
                pong.version
            )),
            Ok(Err(refused)) => Err(format!("the executor refused a ping: {refused}")),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Whether a cancelled call left a partial request line on the stream.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Sends `op` and waits at most `limit` for its answer: `Ok(Err(message))` is the
    /// executor refusing the request (a path outside the workspace, a missing file).
    pub(crate) async fn call<T: DeserializeOwned>(
        &mut self,
        op: Op,
        limit: Duration,
    ) -> Result<Result<T, String>, ConnectionError> {
        self.call_until(op, limit, None).await
    }

    /// Like [`Connection::call`]; when `interrupt` resolves before the answer, an `interrupt`
    /// request follows the call's, which stops the command the executor runs (SIGINT, then
    /// SIGKILL after its grace), and the answer, its output so far, is still waited for.
    pub(crate) async fn call_until<T: DeserializeOwned>(
        &mut self,
        op: Op,
        limit: Duration,
        interrupt: Option<Interrupt<'_>>,
    ) -> Result<Result<T, String>, ConnectionError> {
        let id = self.take_id();
        let line = request_line(id, op)?;
        match tokio::time::timeout(limit, self.exchange(id, &line, interrupt)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectionError::TimedOut(limit)),
        }
    }

    fn take_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    async fn exchange<T: DeserializeOwned>(
        &mut self,
        id: u64,
        line: &[u8],
        mut interrupt: Option<Interrupt<'_>>,
    ) -> Result<Result<T, String>, ConnectionError> {
        self.send(line).await?;
        // Ends: each pass reads one line (skipping answers to abandoned requests, whose ids
        // are below `id`) or sends the one interrupt (`interrupt` is None afterwards); the
        // caller's `limit` (tokio::time::timeout in `request`) bounds the wait, and a closed
        // output is an error.
        loop {
            let read = match interrupt.as_mut() {
                // read_line keeps what it read in `pending`, so dropping it loses nothing.
                Some(signal) => tokio::select! {
                    text = self.read_line() => Some(text),
                    () = signal.as_mut() => None,
                },
                None => Some(self.read_line().await),
            };
            let Some(text) = read else {
                interrupt = None;
                self.send_interrupt().await?;
                continue;
            };
            let text = text?;
            let head: Head = serde_json::from_str(&text)
                .map_err(|e| ConnectionError::Protocol(format!("{e} in {}", excerpt(&text))))?;
            match head.id {
                // The answer to a request whose caller went away: skip it.
                Some(seen) if seen < id => continue,
                Some(seen) if seen == id => {}
                Some(_) | None => {
                    return Err(ConnectionError::Protocol(format!(
                        "expected the answer to request {id}, got {}",
                        excerpt(&text)
                    )));
                }
            }
            let decoded = decode_response::<T>(&text)
                .map_err(|e| ConnectionError::Protocol(format!("{e} in {}", excerpt(&text))))?;
            return Ok(decoded.result);
        }
    }

    /// Writes an `interrupt` request; its answer comes after the interrupted call's and is
    /// skipped by the next call, like any answer to an older id.
    async fn send_interrupt(&mut self) -> Result<(), ConnectionError> {
        let id = self.take_id();
        let line = request_line(id, Op::Interrupt)?;
        self.send(&line).await
    }

    /// Writes one request line; the connection is poisoned while the line is half written.
    async fn send(&mut self, line: &[u8]) -> Result<(), ConnectionError> {
        self.poisoned = true;
        let written = async {
            self.input.write_all(line).await?;
            self.input.flush().await
        }
        .await;
        if let Err(e) = written {
            return Err(self.gone(&format!("cannot write to it: {e}")).await);
        }
        self.poisoned = false;
        Ok(())
    }

    async fn read_line(&mut self) -> Result<String, ConnectionError> {
        // Ends: each pass returns a line, or reads more bytes, or ends on a closed stream
        // or an error; the wait is bounded by the request's limit (see `exchange`).
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(end + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                return String::from_utf8(line).map_err(|_| {
                    ConnectionError::Protocol("a response line is not UTF-8".to_owned())
                });
            }
            let broken = match &mut self.output {
                Output::Socket(read) => {
                    self.pending.reserve(64 * 1024);
                    match read.read_buf(&mut self.pending).await {
                        Ok(0) => Some("its output ended".to_owned()),
                        Ok(_) => None,
                        Err(e) => Some(e.to_string()),
                    }
                }
                Output::Attach(attached) => match attached.next().await {
                    Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                        self.pending.extend_from_slice(&message);
                        None
                    }
                    Some(Ok(LogOutput::StdErr { message })) => {
                        self.stderr.keep(&message);
                        None
                    }
                    Some(Ok(LogOutput::StdIn { .. })) => None,
                    Some(Err(e)) => Some(e.to_string()),
                    None => Some("its output ended".to_owned()),
                },
            };
            if let Some(what) = broken {
                return Err(self.gone(&what).await);
            }
        }
    }

    /// The executor went away: say why, with the end of its stderr, which beside the
    /// control socket may still be on its way.
    async fn gone(&mut self, what: &str) -> ConnectionError {
        if let Some(drain) = self.drain.as_mut() {
            let _ = tokio::time::timeout(STDERR_SETTLE, drain.ended()).await;
        }
        ConnectionError::Gone(with_stderr(what, &self.stderr))
    }

    /// Closes the executor's input (the socket's write side or its stdin); at end of input
    /// it kills what it still runs and exits, and with it the container.
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.input.shutdown()).await;
    }
}

/// One request as a line, with its newline.
fn request_line(id: u64, op: Op) -> Result<Vec<u8>, ConnectionError> {
    let mut line = serde_json::to_vec(&Request { id, op })
        .map_err(|e| ConnectionError::Protocol(format!("cannot encode a request: {e}")))?;
    line.push(b'\n');
    Ok(line)
}

/// `what` went wrong, with the executor's last words if it had any.
fn with_stderr(what: &str, stderr: &StderrTail) -> String {
    let stderr = stderr.text();
    if stderr.is_empty() {
        what.to_owned()
    } else {
        format!("{what}; it said: {}", excerpt(&stderr))
    }
}

/// The part of every response line that says which request it answers.
#[derive(serde::Deserialize)]
struct Head {
    id: Option<u64>,
}

fn excerpt(text: &str) -> String {
    const MAX: usize = 200;
    if text.len() <= MAX {
        return text.to_owned();
    }
    format!("{}...", nerve_core::text::clip(text, MAX))
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixStream;

    use super::*;

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(150);
        let cut = excerpt(&long);
        assert!(cut.ends_with("..."));
        assert_eq!(cut.len(), 200 + 3);
    }

    /// A stderr stream that says `words` and ends, as an executor's does when it exits.
    fn last_words(words: &str) -> Attached {
        let message = bytes::Bytes::from(words.to_owned());
        Box::pin(futures_util::stream::iter([Ok(LogOutput::StdErr {
            message,
        })]))
    }

    /// A connection over the control socket to a fake executor (the other end), whose
    /// stderr says `words`.
    fn over_a_socket(words: &str) -> (Connection, tokio::io::BufStream<UnixStream>) {
        let (host, fake) = UnixStream::pair().unwrap();
        let (read, write) = host.into_split();
        let tail = StderrTail::default();
        let drain = StderrDrain::spawn(last_words(words), tail.clone());
        let connection = Connection::new(Box::pin(write), Output::Socket(read), tail, Some(drain));
        (connection, tokio::io::BufStream::new(fake))
    }

    async fn answer(fake: &mut tokio::io::BufStream<UnixStream>, line: &str) {
        use tokio::io::AsyncBufReadExt;
        let mut request = String::new();
        fake.read_line(&mut request).await.unwrap();
        fake.write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        fake.flush().await.unwrap();
    }

    #[tokio::test]
    async fn the_answer_to_a_cancelled_call_is_skipped() {
        let (mut connection, mut fake) = over_a_socket("");
        let limit = Duration::from_millis(50);
        let cancelled = connection.call::<Pong>(Op::Ping, limit).await;
        assert!(matches!(cancelled, Err(ConnectionError::TimedOut(_))));
        assert!(!connection.is_poisoned(), "the request went out whole");
        answer(&mut fake, r#"{"id":1,"ok":true,"version":"late"}"#).await;
        let fake_task = tokio::spawn(async move {
            answer(&mut fake, r#"{"id":2,"ok":true,"version":"current"}"#).await;
            fake
        });
        let pong = connection.call::<Pong>(Op::Ping, START_LIMIT).await;
        assert_eq!(pong.unwrap().unwrap().version, "current");
        drop(fake_task.await.unwrap());
    }

    #[tokio::test]
    async fn an_interrupt_follows_the_call_and_its_answer_is_still_read() {
        use tokio::io::AsyncBufReadExt;
        let (mut connection, mut fake) = over_a_socket("");
        let (interrupt, interrupted) = tokio::sync::oneshot::channel::<()>();
        let fake_task = tokio::spawn(async move {
            let mut call = String::new();
            fake.read_line(&mut call).await.unwrap();
            interrupt.send(()).unwrap();
            let mut stop = String::new();
            fake.read_line(&mut stop).await.unwrap();
            fake.write_all(b"{\"id\":1,\"ok\":true,\"version\":\"stopped\"}\n")
                .await
                .unwrap();
            fake.flush().await.unwrap();
            (call, stop)
        });
        let signal: Interrupt<'_> = Box::pin(async move {
            let _ = interrupted.await;
        });
        let answer = connection
            .call_until::<Pong>(Op::Ping, START_LIMIT, Some(signal))
            .await;
        assert_eq!(answer.unwrap().unwrap().version, "stopped");
        let (call, stop) = fake_task.await.unwrap();
        assert_eq!(call, "{\"id\":1,\"op\":\"ping\"}\n");
        assert_eq!(stop, "{\"id\":2,\"op\":\"interrupt\"}\n");
        assert!(!connection.is_poisoned());
    }

    #[tokio::test]
    async fn a_closed_socket_is_explained_by_the_executors_stderr() {
        let (mut connection, fake) = over_a_socket("nerve-executor: boom\n");
        drop(fake);
        let gone = connection.call::<Pong>(Op::Ping, START_LIMIT).await;
        let Err(ConnectionError::Gone(why)) = gone else {
            panic!("{gone:?}");
        };
        assert!(why.ends_with("; it said: nerve-executor: boom"), "{why}");
    }

    #[tokio::test]
    async fn an_executor_that_exits_before_connecting_is_not_waited_for() {
        let user = {
            let file = tempfile::NamedTempFile::new().unwrap();
            let meta = std::fs::metadata(file.path()).unwrap();
            format!("{}:{}", std::os::unix::fs::MetadataExt::uid(&meta), 0)
        };
        let control = crate::control::ControlDir::create(&user).unwrap();
        let tail = StderrTail::default();
        let pending = Pending(Prepared::Socket {
            listener: control.listen().unwrap(),
            drain: StderrDrain::spawn(last_words("cannot open the workspace root"), tail.clone()),
            tail,
        });
        let refused = tokio::time::timeout(Duration::from_secs(5), pending.connect())
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(
            refused,
            "the executor exited before connecting; it said: cannot open the workspace root"
        );
    }
}
