//! The scripted provider: replays model responses from a JSON Lines cassette (the format
//! is a public contract, documented in `docs/cassette.md`). A real provider behind the same
//! trait as the HTTP ones, for offline demos, tests and reproducible benchmarks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nerve_core::event::CallPurpose;
use nerve_core::event::ModelErrorKind;
use nerve_core::{Message, MessagePart, MessageRole, TokenUsage, ToolCall, ToolCallId};
use serde::Deserialize;

use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError};
use crate::provider::port::Provider;
use crate::provider::tokens::{CachedCounter, Estimate, TokenCounter};
use nerve_core::FinishReason;

/// A cassette that cannot be used, with the line that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cassette {path}{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct ScriptError {
    pub path: String,
    pub line: Option<usize>,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool_calls: Vec<LineToolCall>,
    #[serde(default)]
    usage: Option<LineUsage>,
    #[serde(default)]
    finish: Option<String>,
    #[serde(default)]
    delay_ms: u64,
    #[serde(default)]
    call: Option<String>,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineToolCall {
    name: String,
    #[serde(default = "empty_object")]
    arguments: serde_json::Value,
    #[serde(default)]
    id: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

/// One validated cassette entry.
#[derive(Debug, Clone)]
enum Entry {
    Respond {
        line: usize,
        text: Option<String>,
        calls: Vec<LineCall>,
        usage: Option<TokenUsage>,
        finish: Option<FinishReason>,
        delay: Duration,
    },
    Fail {
        error: ProviderError,
        delay: Duration,
    },
}

#[derive(Debug, Clone)]
struct LineCall {
    id: Option<String>,
    name: String,
    arguments: serde_json::Value,
}

/// serde's message for a line that is not a cassette line, its position given as a column
/// (the line is the cassette's, named by the error; serde's own "line 1" would be a second,
/// different line number).
fn not_a_line(error: &serde_json::Error) -> String {
    let text = error.to_string();
    let what = text
        .rsplit_once(" at line ")
        .map_or(text.as_str(), |(what, _)| what);
    format!(
        "not a valid cassette line: {what} (column {})",
        error.column()
    )
}

/// Whose lines, of which purpose: the parent's (no `agent`) or a named child's.
type Lane = (Option<String>, CallPurpose);

/// A cassette's lines and how far each lane has read, shared by the parent's provider and
/// its children's views of it.
#[derive(Debug)]
struct Tape {
    entries: HashMap<Lane, Vec<Entry>>,
    cursors: Mutex<HashMap<Lane, usize>>,
}

/// Replays a cassette. Each call takes the next unused line of its purpose, among the
/// lines of its agent: none for an execution of its own, the child's name for a child's
/// view ([`Provider::for_agent`]).
#[derive(Debug)]
pub struct ScriptedProvider {
    name: String,
    agent: Option<String>,
    tape: Arc<Tape>,
    /// Estimates usage a line does not give; cached, so a long run stays cheap per turn.
    counter: CachedCounter<Estimate>,
}

impl ScriptedProvider {
    /// Reads and validates a cassette file; any bad line fails the whole file, naming it.
    pub fn from_file(path: &Path) -> Result<Self, ScriptError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScriptError {
            path: shown.clone(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&shown, &text)
    }

    /// Parses cassette text; `path` only names it in errors and in the provider name.
    pub fn parse(path: &str, text: &str) -> Result<Self, ScriptError> {
        let mut entries: HashMap<Lane, Vec<Entry>> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let number = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let fail = |message: String| ScriptError {
                path: path.to_owned(),
                line: Some(number),
                message,
            };
            let line: Line = serde_json::from_str(trimmed).map_err(|e| fail(not_a_line(&e)))?;
            let purpose = match line.call.as_deref() {
                None | Some("agent") => CallPurpose::Agent,
                Some("plan") => CallPurpose::Plan,
                Some("summary") => CallPurpose::Summary,
                Some(other) => {
                    return Err(fail(format!(
                        "unknown call `{other}` (expected agent, plan or summary)"
                    )));
                }
            };
            let delay = Duration::from_millis(line.delay_ms);
            let entry = match line.error.as_deref() {
                Some(kind) => Entry::Fail {
                    error: scripted_error(kind, line.retry_after_ms).map_err(fail)?,
                    delay,
                },
                None => Entry::Respond {
                    line: number,
                    finish: match line.finish.as_deref() {
                        None => None,
                        Some("stop") => Some(FinishReason::Stop),
                        Some("tool_calls") => Some(FinishReason::ToolCalls),
                        Some("max_tokens") => Some(FinishReason::MaxTokens),
                        Some(other) => {
                            return Err(fail(format!(
                                "unknown finish `{other}` (expected stop, tool_calls or max_tokens)"
                            )));
                        }
                    },
                    text: line.text,
                    calls: line
                        .tool_calls
                        .into_iter()
                        .map(|call| LineCall {
                            id: call.id,
                            name: call.name,
                            arguments: call.arguments,
                        })
                        .collect(),
                    usage: line
                        .usage
                        .map(|u| TokenUsage::new(u.input_tokens, u.output_tokens)),
                    delay,
                },
            };
            entries
                .entry((line.agent, purpose))
                .or_default()
                .push(entry);
        }
        if entries.is_empty() {
            return Err(ScriptError {
                path: path.to_owned(),
                line: None,
                message: "the cassette has no lines (only blank lines and # comments): give at least one answer".to_owned(),
            });
        }
        Ok(Self {
            name: format!("script:{path}"),
            agent: None,
            tape: Arc::new(Tape {
                entries,
                cursors: Mutex::new(HashMap::new()),
            }),
            counter: CachedCounter::new(Estimate),
        })
    }

    /// Marks the first `used` lines of `purpose` as consumed: a resumed execution continues
    /// after the last response its log recorded.
    pub fn skip(&self, purpose: CallPurpose, used: usize) {
        if let Ok(mut cursors) = self.tape.cursors.lock() {
            cursors.insert((self.agent.clone(), purpose), used);
        }
    }

    /// This cassette as a child named `name` reads it: the lines with `"agent": name`, from
    /// the same tape (what [`Provider::for_agent`] gives, as its own type).
    pub fn agent_view(&self, name: &str) -> Self {
        Self {
            name: self.name.clone(),
            agent: Some(name.to_owned()),
            tape: Arc::clone(&self.tape),
            counter: CachedCounter::new(Estimate),
        }
    }

    /// Lines of `purpose` in the cassette (this view's agent's).
    pub fn len(&self, purpose: CallPurpose) -> usize {
        self.tape
            .entries
            .get(&(self.agent.clone(), purpose))
            .map_or(0, Vec::len)
    }

    fn next(&self, purpose: CallPurpose) -> Option<Entry> {
        let lane = (self.agent.clone(), purpose);
        let mut cursors = self.tape.cursors.lock().ok()?;
        let entry = self
            .tape
            .entries
            .get(&lane)?
            .get(*cursors.get(&lane).unwrap_or(&0))?
            .clone();
        *cursors.entry(lane).or_insert(0) += 1;
        Some(entry)
    }
}

fn scripted_error(kind: &str, retry_after_ms: Option<u64>) -> Result<ProviderError, String> {
    let retry_after = retry_after_ms.map(Duration::from_millis);
    let message = "scripted error".to_owned();
    let transient = |kind| ProviderError::Transient {
        kind,
        message: message.clone(),
        retry_after,
    };
    Ok(match kind {
        "rate_limited" => transient(ModelErrorKind::RateLimited),
        "overloaded" => transient(ModelErrorKind::Overloaded),
        "server_error" => transient(ModelErrorKind::ServerError),
        "timeout" => transient(ModelErrorKind::Timeout),
        "context_overflow" => ProviderError::ContextOverflow {
            message,
            stated_tokens: None,
        },
        "auth" => ProviderError::permanent(ModelErrorKind::Auth, message),
        "bad_request" => ProviderError::permanent(ModelErrorKind::BadRequest, message),
        other => {
            return Err(format!(
                "unknown error `{other}` (expected rate_limited, overloaded, server_error, timeout, context_overflow, auth or bad_request)"
            ));
        }
    })
}

#[async_trait]
impl Provider for ScriptedProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn model(&self) -> &str {
        "scripted"
    }

    /// The lines with `"agent": name`, read from the same cassette (children of one name
    /// share them, in the order they ask).
    fn for_agent(&self, name: &str) -> Option<Arc<dyn Provider>> {
        Some(Arc::new(self.agent_view(name)))
    }

    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
        let Some(entry) = self.next(request.purpose) else {
            return Err(ProviderError::Permanent {
                kind: ModelErrorKind::ScriptExhausted,
                message: format!(
                    "script exhausted: the cassette has no {:?} line left",
                    request.purpose
                )
                .to_lowercase(),
            });
        };
        match entry {
            Entry::Fail { error, delay } => {
                sleep_unless_zero(delay).await;
                Err(error)
            }
            Entry::Respond {
                line,
                text,
                calls,
                usage,
                finish,
                delay,
            } => {
                sleep_unless_zero(delay).await;
                let mut parts = Vec::new();
                if let Some(text) = text.filter(|t| !t.is_empty()) {
                    parts.push(MessagePart::Text { text });
                }
                for (i, call) in calls.into_iter().enumerate() {
                    parts.push(MessagePart::ToolCall(ToolCall {
                        id: ToolCallId(call.id.unwrap_or_else(|| format!("call_{line}_{i}"))),
                        name: call.name,
                        arguments: call.arguments,
                    }));
                }
                let message = Message {
                    role: MessageRole::Assistant,
                    parts,
                    pinned: false,
                };
                let has_calls = message.tool_calls().next().is_some();
                let usage = usage.unwrap_or_else(|| {
                    TokenUsage::new(
                        self.counter.count_messages(request.messages)
                            + self.counter.count_tools(request.tools),
                        self.counter.count_message(&message),
                    )
                });
                let finish = finish.unwrap_or(if has_calls {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                });
                Ok(ModelResponse {
                    message,
                    usage,
                    finish,
                })
            }
        }
    }
}

/// A zero delay must not touch the timer: `sleep(0)` still waits for the next timer tick
/// (about a millisecond), which would dominate a scripted turn.
async fn sleep_unless_zero(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_err(text: &str, expected: &str) {
        let err = ScriptedProvider::parse("c.jsonl", text).unwrap_err();
        assert_eq!(err.to_string(), expected);
    }

    #[test]
    fn bad_lines_are_named() {
        check_err(
            "# comment\n\n{\"text\":\"a\"}\nnot json\n",
            "cassette c.jsonl line 4: not a valid cassette line: expected ident (column 2)",
        );
        check_err(
            "{\"finish\":\"done\"}",
            "cassette c.jsonl line 1: unknown finish `done` (expected stop, tool_calls or max_tokens)",
        );
        check_err(
            "{\"call\":\"x\"}",
            "cassette c.jsonl line 1: unknown call `x` (expected agent, plan or summary)",
        );
        check_err(
            "{\"error\":\"nope\"}",
            "cassette c.jsonl line 1: unknown error `nope` (expected rate_limited, overloaded, server_error, timeout, context_overflow, auth or bad_request)",
        );
        check_err(
            "{\"txt\":\"a\"}",
            "cassette c.jsonl line 1: not a valid cassette line: unknown field `txt`, expected one of `text`, `tool_calls`, `usage`, `finish`, `delay_ms`, `call`, `agent`, `error`, `retry_after_ms` (column 6)",
        );
        check_err(
            "# only a comment\n\n",
            "cassette c.jsonl: the cassette has no lines (only blank lines and # comments): give at least one answer",
        );
    }

    #[tokio::test]
    async fn routes_by_purpose_and_exhausts() {
        let provider = ScriptedProvider::parse(
            "c",
            r#"{"text":"plan","call":"plan"}
{"tool_calls":[{"name":"shell","arguments":{"command":"ls"}}],"usage":{"input_tokens":7,"output_tokens":3}}
{"error":"rate_limited","retry_after_ms":20}
{"text":"done"}"#,
        )
        .unwrap();
        let request = |purpose| ModelRequest {
            messages: &[],
            tools: &[],
            purpose,
        };
        let first = provider
            .complete(request(CallPurpose::Agent))
            .await
            .unwrap();
        assert_eq!(first.finish, FinishReason::ToolCalls);
        assert_eq!(first.usage, TokenUsage::new(7, 3));
        assert_eq!(first.message.tool_calls().next().unwrap().id.0, "call_2_0");
        let err = provider
            .complete(request(CallPurpose::Agent))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ProviderError::Transient {
                kind: ModelErrorKind::RateLimited,
                message: "scripted error".into(),
                retry_after: Some(Duration::from_millis(20))
            }
        );
        let done = provider
            .complete(request(CallPurpose::Agent))
            .await
            .unwrap();
        assert_eq!(done.finish, FinishReason::Stop);
        assert_eq!(done.message.text_content(), "done");
        let plan = provider.complete(request(CallPurpose::Plan)).await.unwrap();
        assert_eq!(plan.message.text_content(), "plan");
        let exhausted = provider
            .complete(request(CallPurpose::Agent))
            .await
            .unwrap_err();
        assert_eq!(exhausted.kind(), ModelErrorKind::ScriptExhausted);
        assert!(
            provider
                .complete(request(CallPurpose::Summary))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn a_child_reads_the_lines_of_its_agent_only() {
        let provider = ScriptedProvider::parse(
            "c",
            r#"{"text":"parent one"}
{"text":"a one","agent":"a"}
{"text":"b one","agent":"b"}
{"text":"a two","agent":"a"}
{"text":"parent two"}"#,
        )
        .unwrap();
        let a = provider.for_agent("a").unwrap();
        let b = provider.for_agent("b").unwrap();
        let request = ModelRequest {
            messages: &[],
            tools: &[],
            purpose: CallPurpose::Agent,
        };
        let text = |r: Result<ModelResponse, ProviderError>| r.unwrap().message.text_content();
        assert_eq!(text(b.complete(request).await), "b one");
        assert_eq!(text(a.complete(request).await), "a one");
        assert_eq!(text(provider.complete(request).await), "parent one");
        // A second view of `a` shares its lane.
        let again = provider.for_agent("a").unwrap();
        assert_eq!(text(again.complete(request).await), "a two");
        assert_eq!(text(provider.complete(request).await), "parent two");
        assert_eq!(
            a.complete(request).await.unwrap_err().kind(),
            ModelErrorKind::ScriptExhausted
        );
        assert!(b.complete(request).await.is_err());
        assert!(
            provider
                .for_agent("none")
                .unwrap()
                .complete(request)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn skip_resumes_after_recorded_lines() {
        let provider =
            ScriptedProvider::parse("c", "{\"text\":\"one\"}\n{\"text\":\"two\"}").unwrap();
        provider.skip(CallPurpose::Agent, 1);
        let request = ModelRequest {
            messages: &[],
            tools: &[],
            purpose: CallPurpose::Agent,
        };
        assert_eq!(
            provider
                .complete(request)
                .await
                .unwrap()
                .message
                .text_content(),
            "two"
        );
    }
}
