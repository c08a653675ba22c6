//! stdin and stdout as the SDK's JSON-RPC lines. The SDK's own `Stdio` would do, but every
//! line going out passes through the redactor here first: whatever a session update, an
//! error or a permission request carries (a tool's output, a call's arguments, the
//! model's text), a registered secret or a well-known token never reaches the editor.
//! The updates are redacted where they are made too (a secret split across streamed
//! pieces is redacted whole there); this is the last line.

use std::sync::Arc;

use agent_client_protocol::Lines;
use futures_util::{Sink, Stream};
use nerve_core::Redactor;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// The process's stdin and stdout, each line out redacted with `redactor`.
pub(crate) fn stdio(
    redactor: Arc<Redactor>,
) -> Lines<
    impl Sink<String, Error = std::io::Error> + Send + 'static,
    impl Stream<Item = std::io::Result<String>> + Send + 'static,
> {
    let incoming = futures_util::stream::unfold(
        Some(BufReader::new(tokio::io::stdin()).lines()),
        // Ends: at the end of stdin (the client went away), or after a read error.
        async |state| {
            let mut lines = state?;
            match lines.next_line().await {
                Ok(Some(line)) => Some((Ok(line), Some(lines))),
                Ok(None) => None,
                Err(error) => Some((Err(error), None)),
            }
        },
    );
    let outgoing = futures_util::sink::unfold(
        (tokio::io::stdout(), redactor),
        async |(mut stdout, redactor), line: String| {
            let mut text = redactor.redact(&line).into_owned();
            text.push('\n');
            stdout.write_all(text.as_bytes()).await?;
            stdout.flush().await?;
            Ok::<_, std::io::Error>((stdout, redactor))
        },
    );
    Lines::new(Box::pin(outgoing), Box::pin(incoming))
}
