//! Streamed model answers: deltas as they arrive, then exactly one terminal chunk.
//!
//! [`ModelStream`] owns that guarantee. Whatever happens underneath (the server finishes,
//! sends an error event, closes the connection early, never sends its done marker, or the
//! wire turns into garbage) the consumer sees zero or more [`StreamChunk::Delta`]s, then one
//! [`StreamChunk::End`], then `None` forever.
//!
//! The wire-specific part is a [`StreamDecoder`] (one per API); both decoders build their
//! answer with the same [`Assembler`], which is also what the non-streaming paths use, so a
//! streamed and a whole answer of the same content are the same `ModelResponse`.

use nerve_core::event::ModelErrorKind;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use nerve_core::{Message, MessagePart, MessageRole, ToolCall, ToolCallId};

use crate::provider::model_call::{ModelResponse, ProviderError};
use crate::provider::sse::{SseEvent, SseParser};
use nerve_core::FinishReason;

/// A piece of an answer in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// More answer text.
    Text(String),
    /// More reasoning text.
    Thinking(String),
    /// A tool call begins. `index` counts the tool calls of this answer from 0.
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of the JSON arguments of tool call `index`, as the model writes them.
    ToolCallArguments { index: usize, fragment: String },
}

/// Who watches answers as the model writes them: the terminal transcript, `nerve run
/// --jsonl`, `nerve chat`. Deltas are shown, never recorded: the log keeps whole messages.
/// Called in order, from the task reading the answer (for a live stream, a task of its own
/// on a runtime worker, which the run awaits), so an observer must not block.
pub trait DeltaObserver: Send + Sync {
    /// `delta` of the answer to a call made for `purpose` in `execution_id`.
    fn delta(
        &self,
        execution_id: nerve_core::ExecutionId,
        purpose: nerve_core::event::CallPurpose,
        delta: &Delta,
    );
}

/// The observer of a run nobody watches live.
#[derive(Debug, Default, Clone, Copy)]
pub struct IgnoreDeltas;

impl DeltaObserver for IgnoreDeltas {
    fn delta(&self, _: nerve_core::ExecutionId, _: nerve_core::event::CallPurpose, _: &Delta) {}
}

/// What a stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamChunk {
    Delta(Delta),
    /// The last chunk of every stream: the assembled answer, or why there is none. Deltas
    /// already delivered stay valid either way; a failed stream's answer is discarded.
    End(Result<ModelResponse, ProviderError>),
}

/// Where a live stream's bytes come from: an HTTP body, or chunks in memory.
///
/// Polled rather than `async`: a stream reads one chunk per network frame, and an `async`
/// trait method would allocate a boxed future for every one of them.
pub trait ByteSource: Send {
    /// The next bytes; `Ok(None)` at the end of the body. After `Pending`, `cx`'s waker
    /// is woken when polling again can make progress.
    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ProviderError>>;
}

/// Chunks held in memory, for replaying recorded streams (tests, benchmarks).
#[derive(Debug, Default)]
pub struct MemorySource(pub VecDeque<Bytes>);

impl ByteSource for MemorySource {
    fn poll_chunk(&mut self, _: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ProviderError>> {
        Poll::Ready(Ok(self.0.pop_front()))
    }
}

/// What a decoder wants after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The API's done marker arrived (`[DONE]`, `message_stop`): stop reading.
    Done,
}

/// Turns one API's server-sent events into deltas and, at the end, a response.
pub trait StreamDecoder: Send {
    /// One event. Deltas it produced are appended to `deltas`. An `Err` ends the stream.
    fn event(
        &mut self,
        event: &SseEvent,
        deltas: &mut VecDeque<Delta>,
    ) -> Result<Flow, ProviderError>;
    /// The stream is over: `done` says whether the done marker arrived. Called once.
    fn finish(&mut self, done: bool) -> Result<ModelResponse, ProviderError>;
}

/// A streamed answer. See the module documentation for the guarantee it keeps.
pub struct ModelStream {
    state: State,
}

enum State {
    Replay(VecDeque<StreamChunk>),
    Live(Box<Live>),
    /// A live stream gave nothing; its answer is being asked for whole.
    Whole(WholeFuture),
    Ended,
}

/// The whole answer, on its way.
type WholeFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<ModelResponse, ProviderError>> + Send>,
>;

struct Live {
    source: Box<dyn ByteSource>,
    parser: SseParser,
    decoder: Box<dyn StreamDecoder>,
    deltas: VecDeque<Delta>,
    terminal: Option<Result<ModelResponse, ProviderError>>,
    /// Whether any event has arrived.
    evented: bool,
    /// Whether any delta has been returned.
    delivered: bool,
    /// What asks for the whole answer instead when the stream gave nothing
    /// ([`Live::fallback_for`]).
    fallback: Option<WholeAnswer>,
}

/// Asks for the same answer whole (not streamed): a stream's fallback.
pub type WholeAnswer = Box<dyn FnOnce() -> WholeFuture + Send>;

impl std::fmt::Debug for ModelStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Replay(_) => "replay",
            State::Live(_) => "live",
            State::Whole(_) => "whole",
            State::Ended => "ended",
        };
        f.debug_struct("ModelStream")
            .field("state", &state)
            .finish()
    }
}

impl ModelStream {
    /// Decodes server-sent events from `source` with `decoder`.
    pub fn new(source: impl ByteSource + 'static, decoder: impl StreamDecoder + 'static) -> Self {
        Self {
            state: State::Live(Box::new(Live {
                source: Box::new(source),
                parser: SseParser::new(),
                decoder: Box::new(decoder),
                deltas: VecDeque::new(),
                terminal: None,
                evented: false,
                delivered: false,
                fallback: None,
            })),
        }
    }

    /// When the stream gives nothing (it ends, or is cut, before its first event, or ends
    /// with an empty answer before any delta), `whole` is asked for the answer instead, and
    /// the stream replays it: a server that accepts `stream: true` but cannot stream this
    /// request (llama-cpp-python's tool calls), directly or behind a gateway.
    pub fn or_whole(mut self, whole: WholeAnswer) -> Self {
        if let State::Live(live) = &mut self.state {
            live.fallback = Some(whole);
        }
        self
    }

    /// A stream that replays a finished call: its parts as deltas, then the terminal chunk.
    pub fn from_result(result: Result<ModelResponse, ProviderError>) -> Self {
        let mut chunks = VecDeque::new();
        if let Ok(response) = &result {
            let mut index = 0;
            for part in &response.message.parts {
                match part {
                    MessagePart::Text { text } => {
                        chunks.push_back(StreamChunk::Delta(Delta::Text(text.clone())))
                    }
                    MessagePart::Thinking { text, .. } => {
                        chunks.push_back(StreamChunk::Delta(Delta::Thinking(text.clone())));
                    }
                    MessagePart::ToolCall(call) => {
                        chunks.push_back(StreamChunk::Delta(Delta::ToolCallStart {
                            index,
                            id: call.id.0.clone(),
                            name: call.name.clone(),
                        }));
                        chunks.push_back(StreamChunk::Delta(Delta::ToolCallArguments {
                            index,
                            fragment: arguments_text(&call.arguments),
                        }));
                        index += 1;
                    }
                    MessagePart::ToolResult(_) | MessagePart::CompactionSummary { .. } => {}
                }
            }
        }
        chunks.push_back(StreamChunk::End(result));
        Self {
            state: State::Replay(chunks),
        }
    }

    /// Whether this stream reads a server's events as they arrive, rather than replaying
    /// an answer that was already whole (the scripted provider, a server that ignored
    /// `stream: true`, a call that failed before any event, `stream = false`). Only a
    /// live stream's timing says anything about the model.
    pub fn is_live(&self) -> bool {
        matches!(self.state, State::Live(_))
    }

    /// The next chunk; `None` once the terminal chunk has been returned.
    pub async fn next(&mut self) -> Option<StreamChunk> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`next`](Self::next) as a poll: one state machine for the whole stream instead of a
    /// future per chunk.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<StreamChunk>> {
        // Ends: each pass moves the state machine on by one chunk or returns Pending;
        // `Ended` returns None, and every path reaches it after the one terminal chunk.
        loop {
            match &mut self.state {
                State::Ended => return Poll::Ready(None),
                State::Whole(answer) => {
                    let answer = ready!(answer.as_mut().poll(cx));
                    self.state = Self::from_result(answer).state;
                }
                State::Replay(chunks) => {
                    let chunk = chunks.pop_front();
                    if matches!(chunk, Some(StreamChunk::End(_)) | None) {
                        self.state = State::Ended;
                    }
                    return Poll::Ready(chunk);
                }
                State::Live(live) => {
                    if let Some(delta) = live.deltas.pop_front() {
                        live.delivered = true;
                        return Poll::Ready(Some(StreamChunk::Delta(delta)));
                    }
                    if let Some(terminal) = live.terminal.take() {
                        if let Some(whole) = live.fallback_for(&terminal) {
                            self.state = State::Whole(whole());
                            continue;
                        }
                        // Dropping the source closes the connection.
                        self.state = State::Ended;
                        return Poll::Ready(Some(StreamChunk::End(terminal)));
                    }
                    ready!(live.poll_pull(cx));
                }
            }
        }
    }

    /// Drains the stream and returns its terminal result.
    pub async fn collect(mut self) -> Result<ModelResponse, ProviderError> {
        while let Some(chunk) = self.next().await {
            if let StreamChunk::End(result) = chunk {
                return result;
            }
        }
        Err(ProviderError::transient(
            ModelErrorKind::TruncatedStream,
            "the stream was already consumed",
        ))
    }
}

impl Live {
    /// Reads once from the source; once ready there are deltas, a terminal, or neither
    /// (the read completed no event). Events are decoded as the parser completes them,
    /// straight from its buffers.
    fn poll_pull(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Self {
            source,
            parser,
            decoder,
            deltas,
            terminal,
            evented,
            ..
        } = self;
        match ready!(source.poll_chunk(cx)) {
            Ok(Some(bytes)) => {
                let fed = parser.feed_each(&bytes, |event| {
                    *evented = true;
                    decode(&mut **decoder, event, deltas, terminal);
                });
                if let Err(error) = fed
                    && terminal.is_none()
                {
                    *terminal = Some(Err(ProviderError::permanent(
                        ModelErrorKind::InvalidResponse,
                        error.to_string(),
                    )));
                }
            }
            Ok(None) => {
                parser.finish_each(|event| {
                    *evented = true;
                    decode(&mut **decoder, event, deltas, terminal);
                });
                if terminal.is_none() {
                    *terminal = Some(decoder.finish(false));
                }
            }
            Err(error) => {
                // Whatever the decoder holds is incomplete: the answer is lost, the deltas stay.
                *terminal = Some(Err(error));
            }
        }
        Poll::Ready(())
    }

    /// The fallback, when `terminal` ends a stream that gave nothing: it ended or was cut
    /// before its first event, or it finished with an empty answer before any delta (what
    /// a gateway makes of a server's failed stream: LiteLLM in front of llama-cpp-python).
    fn fallback_for(
        &mut self,
        terminal: &Result<ModelResponse, ProviderError>,
    ) -> Option<WholeAnswer> {
        let gave_nothing = match terminal {
            Err(error) => !self.evented && error.kind() == ModelErrorKind::TruncatedStream,
            Ok(response) => !self.delivered && response.message.parts.is_empty(),
        };
        if gave_nothing {
            self.fallback.take()
        } else {
            None
        }
    }
}

/// One event into the decoder, unless the stream already ended: events after the done
/// marker or an error are ignored.
fn decode(
    decoder: &mut dyn StreamDecoder,
    event: &SseEvent,
    deltas: &mut VecDeque<Delta>,
    terminal: &mut Option<Result<ModelResponse, ProviderError>>,
) {
    if terminal.is_some() {
        return;
    }
    match decoder.event(event, deltas) {
        Ok(Flow::Continue) => {}
        Ok(Flow::Done) => *terminal = Some(decoder.finish(true)),
        Err(error) => *terminal = Some(Err(error)),
    }
}

/// How a tool call's arguments go back on the wire: a string the model produced that was
/// not JSON is sent back exactly as it came; anything else as compact JSON.
pub(crate) fn arguments_text(arguments: &serde_json::Value) -> String {
    arguments
        .as_str()
        .map_or_else(|| arguments.to_string(), str::to_owned)
}

/// Arguments as the model wrote them, made safe for the tool layer.
///
/// Nothing the model sends may crash a run. Empty arguments mean `{}` (local servers send
/// `""` for tools without parameters). Arguments that are not valid JSON are kept as a
/// JSON *string* holding the raw text: the tool layer then fails to read them as its
/// argument object and returns an error result naming the problem and quoting the text,
/// which the model sees and can correct. The raw text is also what goes back to the API
/// in later requests, so the conversation shows the model its own mistake verbatim.
pub fn parse_arguments(tool: &str, raw: &str) -> serde_json::Value {
    if raw.trim().is_empty() {
        return serde_json::Value::Object(serde_json::Map::new());
    }
    match serde_json::from_str(raw) {
        Ok(value) => value,
        Err(error) => {
            tracing::warn!(tool, %error, "tool-call arguments are not valid JSON; passing them on as a string");
            serde_json::Value::String(raw.to_owned())
        }
    }
}

/// Generates an id for a tool call the server sent without one.
pub(crate) fn generated_call_id() -> String {
    format!("call_{:016x}", fastrand::u64(..))
}

#[derive(Debug)]
enum Block {
    Text(String),
    Thinking {
        text: String,
        signature: Option<String>,
    },
    Tool {
        index: usize,
        id: String,
        name: String,
        arguments: String,
    },
}

/// Builds an assistant message from blocks opened and extended in any order, recording
/// the deltas a stream shows. Blocks keep the order in which they were opened.
#[derive(Debug)]
pub(crate) struct Assembler {
    blocks: Vec<Block>,
    tools: usize,
    emit: bool,
}

impl Assembler {
    /// `emit`: whether to produce deltas (streams) or only the final message.
    pub(crate) fn new(emit: bool) -> Self {
        Self {
            blocks: Vec::new(),
            tools: 0,
            emit,
        }
    }

    pub(crate) fn open_text(&mut self) -> usize {
        self.blocks.push(Block::Text(String::new()));
        self.blocks.len() - 1
    }

    pub(crate) fn open_thinking(&mut self) -> usize {
        self.blocks.push(Block::Thinking {
            text: String::new(),
            signature: None,
        });
        self.blocks.len() - 1
    }

    /// A finished thinking block that is never shown as a delta (Anthropic's redacted
    /// thinking: opaque data that must only go back to the API).
    pub(crate) fn open_opaque_thinking(&mut self, text: &str, signature: &str) -> usize {
        self.blocks.push(Block::Thinking {
            text: text.to_owned(),
            signature: Some(signature.to_owned()),
        });
        self.blocks.len() - 1
    }

    /// A tool call; a missing id is generated.
    pub(crate) fn open_tool(
        &mut self,
        id: Option<&str>,
        name: &str,
        deltas: &mut VecDeque<Delta>,
    ) -> usize {
        let id = id
            .filter(|id| !id.is_empty())
            .map_or_else(generated_call_id, str::to_owned);
        let index = self.tools;
        self.tools += 1;
        if self.emit {
            deltas.push_back(Delta::ToolCallStart {
                index,
                id: id.clone(),
                name: name.to_owned(),
            });
        }
        self.blocks.push(Block::Tool {
            index,
            id,
            name: name.to_owned(),
            arguments: String::new(),
        });
        self.blocks.len() - 1
    }

    /// Appends text to a text or thinking block, or argument text to a tool block.
    pub(crate) fn push(&mut self, block: usize, fragment: &str, deltas: &mut VecDeque<Delta>) {
        if fragment.is_empty() {
            return;
        }
        let Some(target) = self.blocks.get_mut(block) else {
            return;
        };
        let delta = match target {
            Block::Text(text) => {
                text.push_str(fragment);
                Delta::Text(fragment.to_owned())
            }
            Block::Thinking { text, .. } => {
                text.push_str(fragment);
                Delta::Thinking(fragment.to_owned())
            }
            Block::Tool {
                index, arguments, ..
            } => {
                arguments.push_str(fragment);
                Delta::ToolCallArguments {
                    index: *index,
                    fragment: fragment.to_owned(),
                }
            }
        };
        if self.emit {
            deltas.push_back(delta);
        }
    }

    /// Adds to a thinking block's signature (Anthropic streams it in pieces).
    pub(crate) fn sign(&mut self, block: usize, fragment: &str) {
        if let Some(Block::Thinking { signature, .. }) = self.blocks.get_mut(block) {
            signature.get_or_insert_with(String::new).push_str(fragment);
        }
    }

    /// A tool name that arrives after the call was opened. Servers that repeat the whole
    /// name in every chunk are told apart from ones that stream it in pieces.
    pub(crate) fn name_tool(&mut self, block: usize, fragment: &str) {
        if let Some(Block::Tool { name, .. }) = self.blocks.get_mut(block) {
            if name.is_empty() {
                fragment.clone_into(name);
            } else if name != fragment {
                name.push_str(fragment);
            }
        }
    }

    pub(crate) fn tool_id(&self, block: usize) -> Option<&str> {
        match self.blocks.get(block) {
            Some(Block::Tool { id, .. }) => Some(id),
            Some(Block::Text(_) | Block::Thinking { .. }) | None => None,
        }
    }

    /// Whether this assembler follows a stream (deltas) rather than a whole message.
    pub(crate) fn emits(&self) -> bool {
        self.emit
    }

    pub(crate) fn has_tool_calls(&self) -> bool {
        self.tools > 0
    }

    /// The assistant message. Empty text and thinking blocks are left out.
    /// Each tool call's id and its arguments as the server wrote them, before
    /// [`Assembler::message`] parses them.
    pub(crate) fn raw_arguments(&self) -> impl Iterator<Item = (&str, &str)> {
        self.blocks.iter().filter_map(|block| match block {
            Block::Tool { id, arguments, .. } => Some((id.as_str(), arguments.as_str())),
            Block::Text(_) | Block::Thinking { .. } => None,
        })
    }

    /// Remembers the raw arguments of every tool call in `memory`, if there is one.
    pub(crate) fn remember_raw(&self, memory: Option<&RawArguments>) {
        if let Some(memory) = memory {
            for (id, raw) in self.raw_arguments() {
                memory.remember(id, raw);
            }
        }
    }

    pub(crate) fn message(&mut self) -> Message {
        let mut parts = Vec::with_capacity(self.blocks.len());
        for block in self.blocks.drain(..) {
            match block {
                Block::Text(text) => {
                    if !text.is_empty() {
                        parts.push(MessagePart::Text { text });
                    }
                }
                Block::Thinking { text, signature } => {
                    if !text.is_empty() || signature.is_some() {
                        parts.push(MessagePart::Thinking { text, signature });
                    }
                }
                Block::Tool {
                    id,
                    name,
                    arguments,
                    ..
                } => {
                    let arguments = parse_arguments(&name, &arguments);
                    parts.push(MessagePart::ToolCall(ToolCall {
                        id: ToolCallId(id),
                        name,
                        arguments,
                    }));
                }
            }
        }
        self.tools = 0;
        Message {
            role: MessageRole::Assistant,
            parts,
            pinned: false,
        }
    }
}

/// The finish reason to report, given what the server said and what the answer holds:
/// local servers often say `stop` for an answer made of tool calls.
pub(crate) fn reconcile_finish(reported: FinishReason, has_tool_calls: bool) -> FinishReason {
    match (reported, has_tool_calls) {
        (FinishReason::Stop | FinishReason::ToolCalls, true) => FinishReason::ToolCalls,
        (FinishReason::ToolCalls, false) => FinishReason::Stop,
        (FinishReason::MaxTokens, _) | (FinishReason::Stop, false) => reported,
    }
}

/// How many calls' raw arguments are kept; older ones fall back to compact JSON.
const RAW_CAPACITY: usize = 1024;

/// Tool-call arguments exactly as the server wrote them, by call id. A call goes back in
/// later requests with these bytes (not re-serialized JSON, which may order keys and
/// space differently), so the conversation a local server re-renders matches what its
/// model wrote and its prompt cache stays valid. In memory only: a resumed run sends
/// compact JSON for calls made before it.
#[derive(Debug, Default)]
pub(crate) struct RawArguments {
    calls: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

impl RawArguments {
    pub(crate) fn remember(&self, id: &str, raw: &str) {
        let Ok(mut guard) = self.calls.lock() else {
            return;
        };
        let (map, order) = &mut *guard;
        if map.insert(id.to_owned(), raw.to_owned()).is_none() {
            order.push_back(id.to_owned());
        }
        // Ends: each pass removes one entry.
        while order.len() > RAW_CAPACITY {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }

    /// The text to send for a call's arguments: the server's own bytes when they still
    /// say what `arguments` says, else compact JSON (or the raw string of arguments that
    /// were not JSON).
    pub(crate) fn text(&self, id: &str, name: &str, arguments: &serde_json::Value) -> String {
        let raw = self
            .calls
            .lock()
            .ok()
            .and_then(|guard| guard.0.get(id).cloned());
        match raw {
            Some(raw) if parse_arguments(name, &raw) == *arguments && !raw.trim().is_empty() => raw,
            Some(_) | None => arguments_text(arguments),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nerve_core::TokenUsage;

    #[test]
    fn raw_arguments_go_back_when_they_still_apply() {
        let raw = RawArguments::default();
        raw.remember("c1", r#"{ "path": "b",  "content": "x" }"#);
        let arguments = serde_json::json!({"content": "x", "path": "b"});
        assert_eq!(
            raw.text("c1", "write_file", &arguments),
            r#"{ "path": "b",  "content": "x" }"#
        );
        // Changed since (an edited log, a compaction): compact JSON of what is held now.
        assert_eq!(
            raw.text("c1", "write_file", &serde_json::json!({"path": "c"})),
            r#"{"path":"c"}"#
        );
        assert_eq!(raw.text("c9", "x", &serde_json::json!({})), "{}");
        for i in 0..RAW_CAPACITY + 10 {
            raw.remember(&format!("id{i}"), "{}");
        }
        assert_eq!(raw.calls.lock().unwrap().0.len(), RAW_CAPACITY);
    }

    /// Emits one text delta per event and ends on `[DONE]` or on `fail`.
    struct Echo {
        text: String,
    }

    impl StreamDecoder for Echo {
        fn event(
            &mut self,
            event: &SseEvent,
            deltas: &mut VecDeque<Delta>,
        ) -> Result<Flow, ProviderError> {
            match event.data.as_str() {
                "[DONE]" => Ok(Flow::Done),
                "fail" => Err(ProviderError::transient(
                    ModelErrorKind::ServerError,
                    "boom",
                )),
                data => {
                    self.text.push_str(data);
                    deltas.push_back(Delta::Text(data.to_owned()));
                    Ok(Flow::Continue)
                }
            }
        }

        fn finish(&mut self, done: bool) -> Result<ModelResponse, ProviderError> {
            if !done {
                return Err(ProviderError::transient(
                    ModelErrorKind::TruncatedStream,
                    "no done marker",
                ));
            }
            Ok(ModelResponse {
                message: Message::text(MessageRole::Assistant, self.text.clone()),
                usage: TokenUsage::default(),
                finish: FinishReason::Stop,
            })
        }
    }

    struct Broken(VecDeque<Bytes>);

    impl ByteSource for Broken {
        fn poll_chunk(
            &mut self,
            _: &mut Context<'_>,
        ) -> Poll<Result<Option<Bytes>, ProviderError>> {
            Poll::Ready(match self.0.pop_front() {
                Some(bytes) => Ok(Some(bytes)),
                None => Err(ProviderError::transient(
                    ModelErrorKind::TruncatedStream,
                    "connection reset",
                )),
            })
        }
    }

    fn chunks(parts: &[&str]) -> VecDeque<Bytes> {
        parts
            .iter()
            .map(|p| Bytes::copy_from_slice(p.as_bytes()))
            .collect()
    }

    async fn run(mut stream: ModelStream) -> (Vec<Delta>, Result<ModelResponse, ProviderError>) {
        let mut deltas = Vec::new();
        let mut terminal = None;
        while let Some(chunk) = stream.next().await {
            match chunk {
                StreamChunk::Delta(delta) => {
                    assert!(terminal.is_none(), "a delta after the terminal chunk");
                    deltas.push(delta);
                }
                StreamChunk::End(result) => {
                    assert!(terminal.is_none(), "two terminal chunks");
                    terminal = Some(result);
                }
            }
        }
        assert!(stream.next().await.is_none());
        (deltas, terminal.expect("exactly one terminal chunk"))
    }

    #[tokio::test]
    async fn exactly_one_terminal_chunk_whatever_happens() {
        let echo = || Echo {
            text: String::new(),
        };
        // A clean end; events after the done marker are ignored.
        let (deltas, end) = run(ModelStream::new(
            MemorySource(chunks(&[
                "data: a\n\nda",
                "ta: b\n\ndata: [DONE]\n\ndata: c\n\n",
            ])),
            echo(),
        ))
        .await;
        assert_eq!(
            deltas,
            vec![Delta::Text("a".into()), Delta::Text("b".into())]
        );
        assert_eq!(end.unwrap().message.text_content(), "ab");
        // An error event in the middle.
        let (deltas, end) = run(ModelStream::new(
            MemorySource(chunks(&["data: a\n\ndata: fail\n\ndata: b\n\n"])),
            echo(),
        ))
        .await;
        assert_eq!(deltas.len(), 1);
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::ServerError);
        // The body ends without the done marker.
        let (_, end) = run(ModelStream::new(
            MemorySource(chunks(&["data: a\n\n"])),
            echo(),
        ))
        .await;
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::TruncatedStream);
        // The connection breaks.
        let (deltas, end) = run(ModelStream::new(
            Broken(chunks(&["data: a\n\ndata: b"])),
            echo(),
        ))
        .await;
        assert_eq!(deltas, vec![Delta::Text("a".into())]);
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::TruncatedStream);
        // Nothing at all.
        let (deltas, end) = run(ModelStream::new(MemorySource::default(), echo())).await;
        assert!(deltas.is_empty());
        assert!(end.is_err());
    }

    #[test]
    fn arguments_that_are_not_json_become_a_string() {
        assert_eq!(parse_arguments("t", ""), serde_json::json!({}));
        assert_eq!(
            parse_arguments("t", " {\"a\": [1]} "),
            serde_json::json!({"a": [1]})
        );
        assert_eq!(
            parse_arguments("t", "{\"a\": "),
            serde_json::json!("{\"a\": ")
        );
        assert_eq!(arguments_text(&serde_json::json!("{\"a\": ")), "{\"a\": ");
        assert_eq!(arguments_text(&serde_json::json!({"a": 1})), "{\"a\":1}");
    }

    #[test]
    fn the_assembler_keeps_block_order_and_drops_empty_blocks() {
        let mut deltas = VecDeque::new();
        let mut asm = Assembler::new(true);
        let thinking = asm.open_thinking();
        let text = asm.open_text();
        let tool = asm.open_tool(None, "shell", &mut deltas);
        let _empty = asm.open_text();
        asm.push(thinking, "why", &mut deltas);
        asm.push(text, "hi", &mut deltas);
        asm.push(tool, "{\"command\":", &mut deltas);
        asm.push(tool, "\"ls\"}", &mut deltas);
        asm.name_tool(tool, "shell");
        asm.sign(thinking, "sig");
        let id = asm.tool_id(tool).unwrap().to_owned();
        assert!(id.starts_with("call_") && id.len() == 21, "{id}");
        let message = asm.message();
        assert_eq!(
            message.parts,
            vec![
                MessagePart::Thinking {
                    text: "why".into(),
                    signature: Some("sig".into())
                },
                MessagePart::Text { text: "hi".into() },
                MessagePart::ToolCall(ToolCall {
                    id: ToolCallId(id),
                    name: "shell".into(),
                    arguments: serde_json::json!({"command": "ls"})
                }),
            ]
        );
        assert_eq!(deltas.len(), 5);
    }

    #[test]
    fn finish_reasons_follow_the_content() {
        assert_eq!(
            reconcile_finish(FinishReason::Stop, true),
            FinishReason::ToolCalls
        );
        assert_eq!(
            reconcile_finish(FinishReason::ToolCalls, false),
            FinishReason::Stop
        );
        assert_eq!(
            reconcile_finish(FinishReason::MaxTokens, true),
            FinishReason::MaxTokens
        );
    }
}
