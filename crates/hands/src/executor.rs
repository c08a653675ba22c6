//! The host side of the persistent executor: `nerve-executor` runs as the container's main
//! process (under the engine's init) and the host attaches to its stdin and stdout, speaking
//! JSON lines, one request at a time. Attaching costs no `docker exec`, which on the engines
//! we run takes a third as long as creating and starting the whole container.
//!
//! Requests carry increasing ids. A call whose future was dropped after its request went out
//! leaves a response behind; the next call skips responses with older ids, so cancellation
//! never shifts answers onto the wrong request. A call dropped in the middle of writing its
//! line leaves the stream unusable, and the connection says so ([`Connection::is_poisoned`]).

use std::pin::Pin;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::AttachContainerOptionsBuilder;
use futures_util::{Stream, StreamExt};
use nerve_executor::{Op, Pong, Request, VERSION, decode_response};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// How long the executor may take to answer its first ping.
const START_LIMIT: Duration = Duration::from_secs(15);
/// How much of the executor's stderr is kept to explain a failure.
const STDERR_KEPT: usize = 2048;

type Output = Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>;
type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// Why a call through the executor did not produce an answer. The connection is unusable
/// after any of these.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    /// The executor's output ended or the attach stream broke: it exited or was killed.
    #[error("the executor stopped ({0})")]
    Gone(String),
    /// No answer within the host-side limit.
    #[error("the executor did not answer within {0:?}")]
    TimedOut(Duration),
    /// The executor wrote something that is not a response to this request.
    #[error("the executor broke the protocol: {0}")]
    Protocol(String),
}

/// One running executor and the attach stream to it.
pub(crate) struct Connection {
    input: Input,
    output: Output,
    /// Bytes of stdout after the last complete line.
    pending: Vec<u8>,
    /// The tail of what the executor wrote to stderr.
    stderr: Vec<u8>,
    next_id: u64,
    /// A request line was only partly written (its call was cancelled).
    poisoned: bool,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("next_id", &self.next_id)
            .field("poisoned", &self.poisoned)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Attaches to the stdin and stdout of `container`'s main process, the executor. Done
    /// before the container starts, so that nothing it writes is missed.
    pub(crate) async fn attach(docker: &Docker, container: &str) -> Result<Self, String> {
        let options = AttachContainerOptionsBuilder::default()
            .stream(true)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .logs(false)
            .build();
        let attached = docker
            .attach_container(container, Some(options))
            .await
            .map_err(|e| format!("cannot attach to the executor: {e}"))?;
        Ok(Self {
            input: attached.input,
            output: attached.output,
            pending: Vec::new(),
            stderr: Vec::new(),
            next_id: 1,
            poisoned: false,
        })
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
        let id = self.next_id;
        self.next_id += 1;
        let mut line = serde_json::to_vec(&Request { id, op })
            .map_err(|e| ConnectionError::Protocol(format!("cannot encode a request: {e}")))?;
        line.push(b'\n');
        match tokio::time::timeout(limit, self.exchange(id, &line)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectionError::TimedOut(limit)),
        }
    }

    async fn exchange<T: DeserializeOwned>(
        &mut self,
        id: u64,
        line: &[u8],
    ) -> Result<Result<T, String>, ConnectionError> {
        self.poisoned = true;
        let written = async {
            self.input.write_all(line).await?;
            self.input.flush().await
        }
        .await;
        if let Err(e) = written {
            return Err(self.gone(&format!("cannot write to it: {e}")));
        }
        self.poisoned = false;
        loop {
            let text = self.read_line().await?;
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

    async fn read_line(&mut self) -> Result<String, ConnectionError> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(end + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                return String::from_utf8(line).map_err(|_| {
                    ConnectionError::Protocol("a response line is not UTF-8".to_owned())
                });
            }
            match self.output.next().await {
                Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                    self.pending.extend_from_slice(&message);
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    tracing::debug!(stderr = %String::from_utf8_lossy(&message).trim_end(), "executor stderr");
                    self.stderr.extend_from_slice(&message);
                    let excess = self.stderr.len().saturating_sub(STDERR_KEPT);
                    self.stderr.drain(..excess);
                }
                Some(Ok(LogOutput::StdIn { .. })) => {}
                Some(Err(e)) => return Err(self.gone(&e.to_string())),
                None => return Err(self.gone("its output ended")),
            }
        }
    }

    fn gone(&self, what: &str) -> ConnectionError {
        let stderr = String::from_utf8_lossy(&self.stderr);
        let stderr = stderr.trim();
        if stderr.is_empty() {
            ConnectionError::Gone(what.to_owned())
        } else {
            ConnectionError::Gone(format!("{what}; it said: {}", excerpt(stderr)))
        }
    }

    /// Closes the executor's stdin; at end of input it kills what it still runs and exits,
    /// and with it the container.
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.input.shutdown()).await;
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
    use super::*;

    #[test]
    fn excerpts_cut_on_char_boundaries() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(150);
        let cut = excerpt(&long);
        assert!(cut.ends_with("..."));
        assert_eq!(cut.len(), 200 + 3);
    }
}
