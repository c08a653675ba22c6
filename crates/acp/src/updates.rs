//! An execution as ACP session updates: the model's text as `agent_message_chunk`, its
//! reasoning as `agent_thought_chunk`, each tool call as `tool_call` then
//! `tool_call_update`s (status, output, a `diff` for a file edit, the paths it touches as
//! locations), a plan as `plan`; and a loaded execution's transcript replayed as the same
//! updates. Everything shown is redacted with the execution's redactor: streamed text
//! through a [`StreamRedaction`], so a secret split across deltas is redacted whole.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Diff, Plan, PlanEntry, PlanEntryPriority, PlanEntryStatus,
    SessionUpdate, TextContent, ToolCall as AcpToolCall, ToolCallContent, ToolCallLocation,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use nerve_core::event::CallPurpose;
use nerve_core::{
    Event, Message, MessagePart, MessageRole, Redactor, StreamRedaction, ToolCall, ToolResult,
};
use nerve_runtime::observer::Delta;
use nerve_runtime::views::transcript::key_argument;

/// The translation of one execution, with what it must remember between events: the
/// streamed text held back, and the tool calls the client already knows.
#[derive(Debug)]
pub(crate) struct Updates {
    workspace: PathBuf,
    redactor: Arc<Redactor>,
    text: StreamRedaction,
    thinking: StreamRedaction,
    /// Whether the answer being written streamed its text (a provider that does not
    /// stream has it sent whole when its message is recorded).
    streamed: bool,
    /// Calls announced with a `tool_call`: later news about them is a `tool_call_update`.
    announced: HashSet<String>,
    /// The calls in flight, for the diff their result shows.
    calls: HashMap<String, ToolCall>,
}

impl Updates {
    pub(crate) fn new(workspace: PathBuf, redactor: Arc<Redactor>) -> Self {
        Self {
            workspace,
            redactor,
            text: StreamRedaction::default(),
            thinking: StreamRedaction::default(),
            streamed: false,
            announced: HashSet::new(),
            calls: HashMap::new(),
        }
    }

    /// A piece of an answer: the agent's own answers and plans are shown, summaries of a
    /// compaction are not.
    pub(crate) fn delta(&mut self, purpose: CallPurpose, delta: &Delta) -> Vec<SessionUpdate> {
        if purpose == CallPurpose::Summary {
            return Vec::new();
        }
        match delta {
            Delta::Text(piece) => {
                self.streamed = true;
                let shown = self.text.push(&self.redactor, piece);
                chunk(shown, SessionUpdate::AgentMessageChunk)
            }
            Delta::Thinking(piece) => {
                let shown = self.thinking.push(&self.redactor, piece);
                chunk(shown, SessionUpdate::AgentThoughtChunk)
            }
            // Tool calls are announced from their events, once the call is whole.
            Delta::ToolCallStart { .. } | Delta::ToolCallArguments { .. } => Vec::new(),
        }
    }

    /// What is held back of the streamed answer: its end has come.
    pub(crate) fn flush(&mut self) -> Vec<SessionUpdate> {
        let mut updates = chunk(
            self.thinking.finish(&self.redactor),
            SessionUpdate::AgentThoughtChunk,
        );
        updates.extend(chunk(
            self.text.finish(&self.redactor),
            SessionUpdate::AgentMessageChunk,
        ));
        updates
    }

    /// The updates one event makes.
    pub(crate) fn event(&mut self, event: &Event) -> Vec<SessionUpdate> {
        match event {
            Event::MessageAppended(appended) if appended.message.role == MessageRole::Assistant => {
                let mut updates = self.flush();
                if !std::mem::take(&mut self.streamed) {
                    updates.extend(self.whole_answer(&appended.message));
                }
                updates
            }
            Event::ApprovalRequested(requested) => {
                self.announce(&requested.call, ToolCallStatus::Pending)
            }
            Event::ToolCallStarted(started) => {
                let mut updates = self.flush();
                updates.extend(self.started(&started.call));
                updates
            }
            Event::ToolCallFinished(finished) => self.finished(&finished.result),
            Event::Started(_)
            | Event::ContextCreated(_)
            | Event::MessageAppended(_)
            | Event::ModelCalled(_)
            | Event::TurnCompleted(_)
            | Event::TaskTransition(_)
            | Event::Retry(_)
            | Event::Finish(_)
            | Event::Compaction(_)
            | Event::Stagnation(_)
            | Event::ApprovalDecided(_)
            | Event::ProxyDecision(_)
            | Event::Checkpoint(_)
            | Event::Resumed(_)
            | Event::WorkspaceSnapshot(_)
            | Event::WorkspaceRewound(_)
            | Event::ToolProtocolSwitched(_)
            | Event::InstructionsLoaded(_)
            | Event::HookRan(_)
            | Event::SkillLoaded(_) => Vec::new(),
        }
    }

    /// A loaded execution's conversation as the updates that tell it again: the person's
    /// messages as `user_message_chunk`, the agent's as it showed them live.
    pub(crate) fn transcript(&mut self, messages: &[Message]) -> Vec<SessionUpdate> {
        let mut updates = Vec::new();
        for message in messages {
            match message.role {
                MessageRole::System => {}
                MessageRole::User => {
                    for part in &message.parts {
                        if let MessagePart::Text { text } = part {
                            updates
                                .extend(chunk(self.redact(text), SessionUpdate::UserMessageChunk));
                        }
                    }
                }
                MessageRole::Assistant => {
                    updates.extend(self.whole_answer(message));
                    for part in &message.parts {
                        if let MessagePart::ToolCall(call) = part {
                            updates.extend(self.started(call));
                        }
                    }
                }
                MessageRole::Tool => {
                    for part in &message.parts {
                        if let MessagePart::ToolResult(result) = part {
                            updates.extend(self.finished(result));
                        }
                    }
                }
            }
        }
        updates
    }

    /// An answer's reasoning and text, whole.
    fn whole_answer(&self, message: &Message) -> Vec<SessionUpdate> {
        let mut updates = Vec::new();
        for part in &message.parts {
            match part {
                MessagePart::Thinking { text, .. } => {
                    updates.extend(chunk(self.redact(text), SessionUpdate::AgentThoughtChunk));
                }
                MessagePart::Text { text } => {
                    updates.extend(chunk(self.redact(text), SessionUpdate::AgentMessageChunk));
                }
                MessagePart::CompactionSummary { text, .. } => {
                    updates.extend(chunk(
                        format!("(earlier conversation, summarised) {}", self.redact(text)),
                        SessionUpdate::AgentThoughtChunk,
                    ));
                }
                MessagePart::ToolCall(_) | MessagePart::ToolResult(_) => {}
            }
        }
        updates
    }

    /// A call begins: announced now (or moved on from the approval that announced it), and
    /// a planner's plan shown as one.
    fn started(&mut self, call: &ToolCall) -> Vec<SessionUpdate> {
        let mut updates = self.announce(call, ToolCallStatus::InProgress);
        if call.name == "submit_plan"
            && let Some(steps) = call.arguments.get("steps").and_then(|s| s.as_array())
        {
            let entries = steps
                .iter()
                .filter_map(|step| step.as_str())
                .map(|step| {
                    PlanEntry::new(
                        self.redact(step),
                        PlanEntryPriority::Medium,
                        PlanEntryStatus::Pending,
                    )
                })
                .collect();
            updates.push(SessionUpdate::Plan(Plan::new(entries)));
        }
        updates
    }

    /// `call` with `status`: a `tool_call` the first time, an update after.
    fn announce(&mut self, call: &ToolCall, status: ToolCallStatus) -> Vec<SessionUpdate> {
        let id = call.id.to_string();
        self.calls.insert(id.clone(), call.clone());
        if !self.announced.insert(id.clone()) {
            return vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                id,
                ToolCallUpdateFields::new().status(status),
            ))];
        }
        let tool_call = AcpToolCall::new(id, self.redact(&key_argument(call)))
            .kind(kind(&call.name))
            .status(status)
            .locations(self.locations(call))
            .raw_input(self.redacted_json(&call.arguments));
        vec![SessionUpdate::ToolCall(tool_call)]
    }

    /// A call ended: its status and output, and for a file edit the change as a diff.
    fn finished(&mut self, result: &ToolResult) -> Vec<SessionUpdate> {
        let id = result.call_id.to_string();
        let call = self.calls.remove(&id).unwrap_or_else(|| ToolCall {
            id: result.call_id.clone(),
            name: result.name.clone(),
            arguments: serde_json::Value::Null,
        });
        let mut updates = Vec::new();
        if !self.announced.contains(&id) {
            updates.extend(self.announce(&call, ToolCallStatus::InProgress));
            self.calls.remove(&id);
        }
        let output = self.redact(&result.content);
        let mut content = Vec::new();
        if !result.is_error
            && let Some(diff) = self.diff(&call)
        {
            content.push(ToolCallContent::from(diff));
        }
        if !output.is_empty() {
            content.push(ToolCallContent::from(ContentBlock::Text(TextContent::new(
                output.clone(),
            ))));
        }
        let status = if result.is_error {
            ToolCallStatus::Failed
        } else {
            ToolCallStatus::Completed
        };
        updates.push(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            id,
            ToolCallUpdateFields::new()
                .status(status)
                .content(content)
                .raw_output(serde_json::json!({ "output": output, "is_error": result.is_error })),
        )));
        updates
    }

    /// What a file tool changed, as the old and the new text.
    fn diff(&self, call: &ToolCall) -> Option<Diff> {
        let arg = |key: &str| call.arguments.get(key).and_then(|v| v.as_str());
        let path = self.absolute(arg("path")?);
        match call.name.as_str() {
            "edit_file" => Some(
                Diff::new(path, self.redact(arg("new_text")?))
                    .old_text(self.redact(arg("old_text")?)),
            ),
            "write_file" => Some(Diff::new(path, self.redact(arg("content")?))),
            _ => None,
        }
    }

    /// The paths a call names, absolute on the host, so the editor can follow along.
    fn locations(&self, call: &ToolCall) -> Vec<ToolCallLocation> {
        let path = call.arguments.get("path").and_then(|v| v.as_str());
        match (call.name.as_str(), path) {
            ("read_file" | "write_file" | "edit_file" | "list_dir" | "grep", Some(path)) => {
                vec![ToolCallLocation::new(self.absolute(path))]
            }
            _ => Vec::new(),
        }
    }

    /// A workspace path as the host sees it (tools take paths relative to the workspace,
    /// or under `/workspace` as the sandbox mounts it).
    fn absolute(&self, path: &str) -> PathBuf {
        let relative = path
            .strip_prefix("/workspace")
            .unwrap_or(path)
            .trim_start_matches('/');
        self.workspace.join(Path::new(relative))
    }

    pub(crate) fn redact(&self, text: &str) -> String {
        self.redactor.redact(text).into_owned()
    }

    fn redacted_json(&self, value: &serde_json::Value) -> serde_json::Value {
        serde_json::from_str(&self.redact(&value.to_string())).unwrap_or(serde_json::Value::Null)
    }
}

/// `text` as one chunk of `update`'s kind; nothing when there is no text.
fn chunk(text: String, update: fn(ContentChunk) -> SessionUpdate) -> Vec<SessionUpdate> {
    if text.is_empty() {
        return Vec::new();
    }
    vec![update(ContentChunk::new(ContentBlock::Text(
        TextContent::new(text),
    )))]
}

/// The kind of a tool, for the editor's icon.
fn kind(name: &str) -> ToolKind {
    match name {
        "shell" => ToolKind::Execute,
        "read_file" | "list_dir" | "recall" => ToolKind::Read,
        "write_file" | "edit_file" => ToolKind::Edit,
        "grep" => ToolKind::Search,
        "http_request" => ToolKind::Fetch,
        "submit_plan" | "compress_context" => ToolKind::Think,
        _ => ToolKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use nerve_core::event::{MessageAppended, ToolCallFinished, ToolCallStarted};

    use super::*;

    fn updates() -> Updates {
        let secret = secrecy::SecretString::from("sk-secret-value-1234567890");
        let redactor = Redactor::with_secrets([("KEY", &secret)]).unwrap();
        Updates::new(PathBuf::from("/home/me/project"), Arc::new(redactor))
    }

    fn json(updates: &[SessionUpdate]) -> serde_json::Value {
        serde_json::to_value(updates).unwrap()
    }

    fn call(name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn an_edit_is_a_tool_call_then_an_update_with_its_diff() {
        let mut updates = updates();
        let edit = call(
            "edit_file",
            serde_json::json!({"path": "src/a.rs", "old_text": "a", "new_text": "b"}),
        );
        let started = updates.event(&Event::ToolCallStarted(ToolCallStarted {
            turn: 1,
            call: edit.clone(),
            repaired: None,
        }));
        let started = json(&started);
        assert_eq!(started[0]["sessionUpdate"], "tool_call");
        assert_eq!(started[0]["kind"], "edit");
        assert_eq!(started[0]["status"], "in_progress");
        assert_eq!(
            started[0]["locations"][0]["path"],
            "/home/me/project/src/a.rs"
        );
        let finished = updates.event(&Event::ToolCallFinished(ToolCallFinished {
            turn: 1,
            result: ToolResult {
                call_id: edit.id.clone(),
                name: edit.name.clone(),
                content: "edited".into(),
                is_error: false,
            },
            duration_ms: 1,
            interrupted: false,
            child: None,
        }));
        let finished = json(&finished);
        assert_eq!(finished[0]["sessionUpdate"], "tool_call_update");
        assert_eq!(finished[0]["status"], "completed");
        assert_eq!(finished[0]["content"][0]["type"], "diff");
        assert_eq!(finished[0]["content"][0]["oldText"], "a");
        assert_eq!(finished[0]["content"][0]["newText"], "b");
        assert_eq!(finished[0]["content"][1]["content"]["text"], "edited");
    }

    #[test]
    fn reasoning_is_a_thought_and_a_summary_is_not_shown() {
        let mut updates = updates();
        let mut sent = updates.delta(CallPurpose::Agent, &Delta::Thinking("hmm, ".into()));
        sent.extend(updates.delta(CallPurpose::Summary, &Delta::Text("summary".into())));
        sent.extend(updates.flush());
        let sent = json(&sent);
        let kinds: Vec<&str> = sent
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["sessionUpdate"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["agent_thought_chunk"], "{sent}");
        assert_eq!(sent[0]["content"]["text"], "hmm, ");
    }

    #[test]
    fn a_submitted_plan_is_a_plan_update() {
        let mut updates = updates();
        let plan = call(
            "submit_plan",
            serde_json::json!({"steps": ["read the test", "fix the bug"]}),
        );
        let sent = json(&updates.event(&Event::ToolCallStarted(ToolCallStarted {
            turn: 1,
            call: plan,
            repaired: None,
        })));
        assert_eq!(sent[0]["sessionUpdate"], "tool_call");
        assert_eq!(sent[0]["kind"], "think");
        assert_eq!(sent[1]["sessionUpdate"], "plan");
        assert_eq!(sent[1]["entries"][1]["content"], "fix the bug");
        assert_eq!(sent[1]["entries"][1]["status"], "pending");
    }

    #[test]
    fn a_secret_split_across_deltas_is_redacted_whole() {
        let mut updates = updates();
        let mut sent = Vec::new();
        for piece in ["the key is sk-secret-", "value-1234567890 ok"] {
            sent.extend(updates.delta(CallPurpose::Agent, &Delta::Text(piece.into())));
        }
        sent.extend(updates.flush());
        let shown: String = json(&sent)
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["content"]["text"].as_str().unwrap().to_owned())
            .collect();
        assert!(!shown.contains("sk-secret"), "{shown}");
        assert!(shown.starts_with("the key is "), "{shown}");
        assert!(shown.ends_with(" ok"), "{shown}");
    }

    #[test]
    fn an_answer_that_did_not_stream_is_sent_whole() {
        let mut updates = updates();
        let answer = Event::MessageAppended(MessageAppended {
            index: 3,
            message: Message {
                role: MessageRole::Assistant,
                parts: vec![MessagePart::Text {
                    text: "done".into(),
                }],
                pinned: false,
            },
        });
        let sent = json(&updates.event(&answer));
        assert_eq!(sent[0]["sessionUpdate"], "agent_message_chunk");
        assert_eq!(sent[0]["content"]["text"], "done");
        // Streamed, it is not sent twice.
        let mut sent = updates.delta(CallPurpose::Agent, &Delta::Text("done".into()));
        sent.extend(updates.event(&answer));
        let texts: Vec<String> = json(&sent)
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u["content"]["text"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(texts.concat(), "done");
    }
}
