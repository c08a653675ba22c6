//! The events an execution emits. They are the log's payloads and a public wire format:
//! each variant serialises as a JSON object tagged with its `kind` (see `docs/events.md`).

use serde::{Deserialize, Serialize};

use crate::execution::{LoopType, TerminationReason};
use crate::id::{BlockId, TaskId, ToolCallId};
use crate::message::{Message, ToolCall, ToolResult};
use crate::task::TaskStatus;
use crate::usage::{MicroUsd, TokenUsage};

/// The payload schema version written beside every event. Every kind is at version 1; when
/// one kind's payload changes incompatibly, [`EventKind::version`] of that kind is raised
/// and readers treat a newer version than they know as malformed instead of misreading it.
pub const EVENT_VERSION: u32 = 1;

/// Which kind of model call a provider request serves; the scripted provider routes on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPurpose {
    /// Loop turns and plan-step turns.
    Agent,
    /// Planning and replanning.
    Plan,
    /// Compaction summaries.
    Summary,
}

/// What went wrong with a model call, by what retrying can change. The log spells each
/// kind in snake_case (`model_called`'s `outcome`, `retry`'s `error`); whether a kind is
/// retried, and how often, is the caller's retry policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelErrorKind {
    /// HTTP 429, or a scripted `rate_limited`. Transient; honours Retry-After.
    RateLimited,
    /// HTTP 503/529, Anthropic's `overloaded_error`. Transient.
    Overloaded,
    /// Any other 5xx, HTTP 409, or an error event in the middle of a stream. Transient.
    ServerError,
    /// A 5xx whose body blames the request (a validation error, a chat template that
    /// failed on it): llama.cpp's Python server answers so, and gateways pass a backend's
    /// 400 on as a 500. Transient, but retried at most once.
    ServerRejected,
    /// No answer in time (connect, request or idle timeout; HTTP 408). Transient.
    Timeout,
    /// The connection could not be made or was reset before an answer. Transient.
    Connection,
    /// A stream that broke off, or ended without its done marker. Transient.
    TruncatedStream,
    /// The prompt does not fit the model's window: compact, then retry.
    ContextOverflow,
    /// HTTP 401/403: a missing, wrong or unauthorised key. Permanent.
    Auth,
    /// Any other 4xx: the request is wrong and will stay wrong. Permanent.
    BadRequest,
    /// HTTP 404 or 501: usually an unknown model or a wrong base URL. Permanent.
    NotFound,
    /// A 429 that says the account has no credit left (`insufficient_quota`). Permanent.
    Quota,
    /// The provider refused to answer (content filter, `refusal`). Permanent.
    ContentFilter,
    /// A 2xx answer that is not the API's format (wrong base URL, a proxy's page). Permanent.
    InvalidResponse,
    /// The streamed answer ran away (the same text over and over) and was stopped. The
    /// call is asked again with a note about it (brain's `Run::call_model`), at most twice,
    /// never the same request again: a model that samples greedily would repeat it.
    Runaway,
    /// The scripted provider has no line left for this kind of call. Permanent.
    ScriptExhausted,
}

impl ModelErrorKind {
    /// The kind as the log spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::RateLimited => "rate_limited",
            Self::Overloaded => "overloaded",
            Self::ServerError => "server_error",
            Self::ServerRejected => "server_rejected",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::TruncatedStream => "truncated_stream",
            Self::ContextOverflow => "context_overflow",
            Self::Auth => "auth",
            Self::BadRequest => "bad_request",
            Self::NotFound => "not_found",
            Self::Quota => "quota",
            Self::ContentFilter => "content_filter",
            Self::InvalidResponse => "invalid_response",
            Self::Runaway => "runaway",
            Self::ScriptExhausted => "script_exhausted",
        }
    }
}

impl std::fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a model call ended, as `model_called` records it: one string on the wire, `ok`,
/// `cancelled` or the error's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallOutcome {
    /// The model answered.
    Ok,
    /// The run was cancelled (or hit its deadline) while the call was in flight.
    Cancelled,
    /// The call failed.
    Failed(ModelErrorKind),
}

impl CallOutcome {
    /// The outcome as the log spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Cancelled => "cancelled",
            Self::Failed(kind) => kind.as_str(),
        }
    }
}

impl std::fmt::Display for CallOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CallOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CallOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        match text.as_ref() {
            "ok" => Ok(Self::Ok),
            "cancelled" => Ok(Self::Cancelled),
            other => {
                use serde::de::IntoDeserializer;
                let kind: Result<ModelErrorKind, serde::de::value::Error> =
                    ModelErrorKind::deserialize(other.into_deserializer());
                kind.map(Self::Failed).map_err(|_| {
                    serde::de::Error::custom(format!("unknown model call outcome `{other}`"))
                })
            }
        }
    }
}

/// The first event of an execution: what was asked and how it will run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub task_id: TaskId,
    pub task: String,
    pub workspace: String,
    pub loop_type: LoopType,
    pub provider: String,
    pub model: String,
    pub max_turns: u32,
    /// The effective settings, for explaining a run later. Never holds secrets.
    #[serde(default)]
    pub config: serde_json::Value,
    /// A child execution's parent (a `delegate` call): the parent's execution id. Absent
    /// for an execution of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// With `parent`: the id of the parent's `delegate` call that started this execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<ToolCallId>,
    /// A fork's origin (`nerve fork`): the execution and turn its history is taken from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<ForkOrigin>,
}

/// Where a fork's history comes from: the parent's chain head at the end of `turn` (its
/// event `seq` and that event's `hash`), so that a fork's copied prefix can be checked
/// against the parent's log for as long as the parent is in it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The parent's execution id.
    pub parent: String,
    /// The last turn taken from the parent.
    pub turn: u32,
    /// The parent's last event taken (its sequence number), and its hash.
    pub seq: u64,
    pub hash: String,
}

/// The conversation was created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextCreated {
    /// The model's context capacity in tokens, when known.
    pub context_window: Option<u64>,
    pub tools: Vec<String>,
}

/// A message joined the conversation, content included, so replay can rebuild it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageAppended {
    /// Position in the conversation, 0-based.
    pub index: u32,
    pub message: Message,
}

/// Written before a tool runs: if no matching finish follows, its side effect is in doubt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallStarted {
    pub turn: u32,
    pub call: ToolCall,
    /// Only on a call written as text that was not valid JSON and that Nerve repaired to
    /// read it: what was changed, in a line (docs/providers.md, "Tools as text"). Absent
    /// on every other call and on older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<String>,
}

/// Written after a tool ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallFinished {
    pub turn: u32,
    pub result: ToolResult,
    pub duration_ms: u64,
    /// The execution was stopped (Ctrl-C, SIGTERM, `nerve cancel`, an editor's cancel)
    /// while the call ran, and the call was interrupted: its result holds what it did until
    /// then. Absent (false) otherwise, and in logs written before it existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub interrupted: bool,
    /// A `delegate` call's child execution and how it ended. Absent for every other call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<ChildEnding>,
}

/// How a child execution (a `delegate` call's) ended, as its parent records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildEnding {
    pub execution_id: String,
    /// Its name (the scripted cassette's `agent`).
    pub name: String,
    pub termination_reason: TerminationReason,
    pub turns: u32,
    /// What it spent, which the parent's totals include.
    pub usage: TokenUsage,
    pub cost: MicroUsd,
}

/// One model call answered (or failed); lets a resumed scripted run continue where it left off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCalled {
    pub turn: u32,
    pub purpose: CallPurpose,
    /// `ok`, `cancelled`, or the error's kind (`rate_limited`, `context_overflow`, ...).
    pub outcome: CallOutcome,
    pub usage: TokenUsage,
    /// Milliseconds from sending the request to the first streamed delta. Only on calls
    /// answered over a live stream (absent on older logs, whole answers and the scripted
    /// provider).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token_ms: Option<u64>,
    /// Output tokens per second from the first delta to the end of the stream, to one
    /// decimal. Only on answered streamed calls whose stream took measurable time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
}

/// A turn ended: one model call and the tool calls it asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCompleted {
    /// 1-based and contiguous.
    pub turn: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub tool_calls: Vec<String>,
    pub finish: crate::usage::FinishReason,
    pub duration_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTransition {
    pub from: TaskStatus,
    pub to: TaskStatus,
}

/// A transient provider failure that will be retried after `delay_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub turn: u32,
    pub attempt: u32,
    pub error: ModelErrorKind,
    pub delay_ms: u64,
}

/// The last event of an execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finish {
    pub termination_reason: TerminationReason,
    pub task_status: TaskStatus,
    pub total_turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    /// Required when `termination_reason` is `error`.
    pub error: Option<String>,
}

/// How a compaction made room in the conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionStrategy {
    /// A large tool output went to the archive at once, leaving a preview and its block id.
    Offload,
    /// Old tool results were replaced by placeholders; the originals stay recallable.
    Mask,
    /// The middle of the conversation was replaced by a structured summary.
    Summarize,
    /// Messages were moved to the archive with a short note (the agent's `compress_context`
    /// with `strategy: archive`).
    Archive,
}

/// What made a compaction happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionTrigger {
    /// One tool output was over the size threshold.
    OutputSize,
    /// Context fill crossed the soft threshold (masking).
    SoftThreshold,
    /// Context fill crossed the hard threshold (summarising).
    HardThreshold,
    /// The agent called `compress_context`.
    Agent,
    /// The provider answered `context_overflow`.
    Overflow,
}

/// The conversation was compacted. This is the only event that removes messages from the
/// rebuilt conversation: replay replaces messages `from_index..to_index` (end exclusive) by
/// `replacement`, and later `message_appended` indices refer to the compacted conversation.
/// The originals stay in earlier `message_appended` events and in the archive blocks listed
/// in `archived`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The turn at whose boundary the compaction ran (0 before the first turn).
    pub turn: u32,
    pub strategy: CompactionStrategy,
    pub trigger: CompactionTrigger,
    /// First replaced message, 0-based.
    pub from_index: u32,
    /// One past the last replaced message.
    pub to_index: u32,
    /// The messages that now stand where the range was (a summary, placeholders, a preview).
    pub replacement: Vec<Message>,
    /// Archive blocks holding the replaced originals, for `recall`.
    pub archived: Vec<BlockId>,
    /// Context fill, in tokens, before and after.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// The summary text, for `summarize` (and any strategy that wrote one).
    #[serde(default)]
    pub summary: Option<String>,
    /// The summary came from the deterministic extractive fallback, not from the model.
    #[serde(default)]
    pub extractive: bool,
}

/// What the loop did about stagnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StagnationAction {
    /// One corrective user message was injected.
    Corrected,
    /// The execution stops with `stagnation`.
    Terminated,
}

/// The stagnation detector found the agent repeating itself. Which signals fired can be
/// read off the fields: the ratio reached its threshold, a cycle was found, or one call
/// kept returning the same result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stagnation {
    pub turn: u32,
    pub action: StagnationAction,
    /// Σ(count−1)/total over the window's call fingerprints, in `0.0..1.0`.
    pub repetition_ratio: f64,
    /// The repeating cycle's length in whole turns, when one was found.
    pub cycle_length: Option<u32>,
    /// Fingerprints (`name:sha256(canonical JSON args)[:16]`) that occurred more than once
    /// in the window, most frequent first.
    pub repeated_calls: Vec<String>,
    /// The fingerprint of a call that kept returning the same result, when that fired.
    #[serde(default)]
    pub no_progress_call: Option<String>,
    /// The plan step the window was scoped to, in plan loops.
    #[serde(default)]
    pub step: Option<u32>,
}

/// A tool call matched an `ask` rule and waits for a human decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequested {
    pub turn: u32,
    pub call: ToolCall,
    /// The policy rule that asked, as written in the configuration.
    pub rule: String,
}

/// The verdict on a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    Approved,
    Denied,
}

/// Who decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    /// An `allow` or `deny` rule, without asking anyone.
    Policy,
    /// A human, interactively or through `nerve approve`.
    User,
}

/// A tool call was approved or denied. Follows `approval_requested` for `ask` rules; stands
/// alone when a `deny` rule refused a call outright.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecided {
    pub turn: u32,
    pub call_id: ToolCallId,
    pub decision: ApprovalDecision,
    pub decided_by: Decider,
    pub rule: String,
    /// The reason given (`nerve approve --reason`), shown to the model on a denial.
    #[serde(default)]
    pub reason: Option<String>,
}

/// What the auth proxy did with one request from the sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProxyVerdict {
    /// Forwarded as is.
    Allowed,
    /// Refused (no rule, method or path not allowed, private address, cross-host redirect).
    Denied,
    /// Forwarded with a credential injected by the proxy.
    Injected,
}

/// One request through the auth proxy. Never holds a secret: `credential` is the name of
/// the injected credential, and `path` excludes the query string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyDecision {
    pub host: String,
    pub method: String,
    pub path: String,
    pub decision: ProxyVerdict,
    /// The upstream's status code; `None` when the request was refused or never answered.
    pub status: Option<u16>,
    /// The name of the injected credential, for `injected`.
    #[serde(default)]
    pub credential: Option<String>,
    /// Why the request was refused, for `denied`.
    #[serde(default)]
    pub reason: Option<String>,
}

/// A snapshot of the agent context was saved. The checkpoint's id is this event's sequence
/// number; the snapshot itself lives beside the log, and its hash here ties it to the chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The last completed turn the snapshot includes.
    pub turn: u32,
    /// Hex SHA-256 of the stored (redacted) snapshot JSON.
    pub snapshot_sha256: String,
    pub snapshot_bytes: u64,
}

/// The execution was resumed after a crash, an interruption or a parked approval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// 1 for the first resume of this execution.
    pub attempt: u32,
    /// The checkpoint the context was restored from; `None` when rebuilt from events alone.
    pub from_checkpoint_seq: Option<u64>,
    /// The last completed turn; the resumed run continues with the next one.
    pub from_turn: u32,
    /// Tool calls started but never finished: told to the model, not re-run.
    pub in_doubt: Vec<ToolCallId>,
}

/// How a path differs between two workspace snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Added => "added",
            Self::Modified => "modified",
            Self::Deleted => "deleted",
        }
    }
}

/// One path (relative to the workspace) that differs between two snapshots.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkspaceChange {
    pub change: ChangeKind,
    pub path: String,
}

/// The workspace was recorded in the execution's snapshot store (docs/checkpoints.md):
/// at the start (turn 0), after each turn that changed it, and when a resume or a person's
/// next message found it changed since the last snapshot. Written after the snapshot is in
/// the store, so every tree the log names exists there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceSnapshot {
    /// The turn whose end the snapshot records (0: the workspace as the run found it).
    pub turn: u32,
    /// The tree's hash in the snapshot store (40 or 64 hex digits).
    pub tree: String,
    /// When not empty, the snapshot was taken at a resume or a follow-up and records
    /// changes made outside the execution's turns: the paths that differ from the previous
    /// snapshot (the model was told).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside: Vec<WorkspaceChange>,
}

/// A person restored the workspace to the snapshot of an earlier turn (`nerve rewind`,
/// chat's `/undo`). From here on the workspace is `tree`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRewound {
    /// The turn whose snapshot was restored.
    pub turn: u32,
    pub tree: String,
    /// Changes made outside the execution were overwritten (`--force`).
    pub forced: bool,
    /// What the restore changed in the workspace, from its state just before.
    #[serde(default)]
    pub changes: Vec<WorkspaceChange>,
}

/// How the model's tool calls travel: through the API's tool calling (`native`), or as text
/// in the answer that Nerve reads (`text`; docs/providers.md, "Tools as text").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolTransport {
    Native,
    Text,
}

impl ToolTransport {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Text => "text",
        }
    }
}

/// A provider set to `tool_protocol = "auto"` switched from the API's tool calling to
/// calls written as text: the model answered with call-shaped text and no native call.
/// From the turn named here on, the tools are described in the system prompt and calls
/// are read from the answers' text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolProtocolSwitched {
    /// The turn whose answer showed it; its calls are the first read from text.
    pub turn: u32,
    pub from: ToolTransport,
    pub to: ToolTransport,
    /// What was seen, in a line (the tools the text named).
    pub reason: String,
}

/// Where a file of project instructions came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstructionsSource {
    /// The user's own file (`$XDG_CONFIG_HOME/nerve/AGENTS.md`), read on the host.
    User,
    /// A file in the workspace (`AGENTS.md`, else `CLAUDE.md`), read through the sandbox.
    Workspace,
}

/// One file of project instructions the model was given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstructionsFile {
    pub source: InstructionsSource,
    /// The file's path: relative to the workspace root for a workspace file, the host path
    /// for the user's.
    pub path: String,
    /// SHA-256 (hex) of the text the model was given (after the size bound).
    pub sha256: String,
    /// Bytes of the text the model was given.
    pub bytes: u64,
    /// The file was longer than the bound and was cut.
    pub truncated: bool,
}

/// Project instructions entered the conversation: at the start (the user's file and the
/// workspace root's, in the system message that follows), or in `turn` when the agent first
/// worked under a directory with a file of its own (appended to that call's result).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstructionsLoaded {
    /// 0 at the start.
    pub turn: u32,
    pub files: Vec<InstructionsFile>,
}

/// The model loaded a skill (the `skill` tool): its instructions, or one file of its
/// folder. The text the model got is in the call's `tool_call_finished`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkillLoaded {
    pub turn: u32,
    pub call_id: ToolCallId,
    /// The skill's name.
    pub name: String,
    /// The user's skill folders or the workspace's.
    pub source: InstructionsSource,
    /// Its `SKILL.md`: relative to the workspace root for a workspace skill, the host path
    /// for the user's.
    pub path: String,
    /// The file of the skill's folder that was read (relative to it); absent when the
    /// instructions were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// SHA-256 (hex) of the text the model was given (after the size bound).
    pub sha256: String,
    /// Bytes of the text the model was given.
    pub bytes: u64,
    /// The text was longer than the bound and was cut.
    pub truncated: bool,
}

/// Where a user's hook runs (`[[hooks.<point>]]` in the settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// A new execution starts (before the first model call).
    SessionStart,
    /// A person's message (the task, a follow-up) is about to reach the model.
    UserPromptSubmit,
    /// A tool call is about to run (after the approval gate).
    PreToolUse,
    /// A tool call returned.
    PostToolUse,
    /// The agent's turn ended (the execution finishes or waits for the next message).
    Stop,
}

impl HookPoint {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::SessionStart => "session_start",
            Self::UserPromptSubmit => "user_prompt_submit",
            Self::PreToolUse => "pre_tool_use",
            Self::PostToolUse => "post_tool_use",
            Self::Stop => "stop",
        }
    }
}

/// What a hook's run decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookVerdict {
    /// Exit 0: go on.
    Allow,
    /// Exit 2 at `pre_tool_use` or `user_prompt_submit`: the call or the message is refused,
    /// the hook's stderr shown to the model.
    Block,
    /// Any other ending (another code, a signal, the timeout, a command that cannot start):
    /// a warning, and the execution goes on.
    Warn,
}

/// One run of a user's hook, on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRan {
    pub point: HookPoint,
    /// The turn it ran in (0 before the first).
    pub turn: u32,
    /// The tool call's id and tool, at the tool points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<ToolCallId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The hook's argv as configured.
    pub command: Vec<String>,
    /// Its exit code; `None` when it was killed (the timeout) or could not start.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub verdict: HookVerdict,
    /// Its stderr, clipped (what the model sees of a block).
    pub stderr: String,
    pub duration_ms: u64,
}

/// Every event an execution can record, tagged by `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Started(Started),
    ContextCreated(ContextCreated),
    MessageAppended(MessageAppended),
    ToolCallStarted(ToolCallStarted),
    ToolCallFinished(ToolCallFinished),
    ModelCalled(ModelCalled),
    TurnCompleted(TurnCompleted),
    TaskTransition(TaskTransition),
    Retry(Retry),
    Finish(Finish),
    Compaction(Compaction),
    Stagnation(Stagnation),
    ApprovalRequested(ApprovalRequested),
    ApprovalDecided(ApprovalDecided),
    ProxyDecision(ProxyDecision),
    Checkpoint(Checkpoint),
    Resumed(Resumed),
    WorkspaceSnapshot(WorkspaceSnapshot),
    WorkspaceRewound(WorkspaceRewound),
    ToolProtocolSwitched(ToolProtocolSwitched),
    InstructionsLoaded(InstructionsLoaded),
    HookRan(HookRan),
    SkillLoaded(SkillLoaded),
}

/// The `kind` tag of an [`Event`], as stored in the log's `kind` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started,
    ContextCreated,
    MessageAppended,
    ToolCallStarted,
    ToolCallFinished,
    ModelCalled,
    TurnCompleted,
    TaskTransition,
    Retry,
    Finish,
    Compaction,
    Stagnation,
    ApprovalRequested,
    ApprovalDecided,
    ProxyDecision,
    Checkpoint,
    Resumed,
    WorkspaceSnapshot,
    WorkspaceRewound,
    ToolProtocolSwitched,
    InstructionsLoaded,
    HookRan,
    SkillLoaded,
}

impl EventKind {
    /// Every kind, in the order `docs/events.md` documents them.
    pub const ALL: [Self; 23] = [
        Self::Started,
        Self::ContextCreated,
        Self::MessageAppended,
        Self::ToolCallStarted,
        Self::ToolCallFinished,
        Self::ModelCalled,
        Self::TurnCompleted,
        Self::TaskTransition,
        Self::Retry,
        Self::Finish,
        Self::Compaction,
        Self::Stagnation,
        Self::ApprovalRequested,
        Self::ApprovalDecided,
        Self::ProxyDecision,
        Self::Checkpoint,
        Self::Resumed,
        Self::WorkspaceSnapshot,
        Self::WorkspaceRewound,
        Self::ToolProtocolSwitched,
        Self::InstructionsLoaded,
        Self::HookRan,
        Self::SkillLoaded,
    ];

    /// The payload version this build writes for this kind.
    pub const fn version(self) -> u32 {
        match self {
            Self::Started
            | Self::ContextCreated
            | Self::MessageAppended
            | Self::ToolCallStarted
            | Self::ToolCallFinished
            | Self::ModelCalled
            | Self::TurnCompleted
            | Self::TaskTransition
            | Self::Retry
            | Self::Finish
            | Self::Compaction
            | Self::Stagnation
            | Self::ApprovalRequested
            | Self::ApprovalDecided
            | Self::ProxyDecision
            | Self::Checkpoint
            | Self::Resumed
            | Self::WorkspaceSnapshot
            | Self::WorkspaceRewound
            | Self::ToolProtocolSwitched
            | Self::InstructionsLoaded
            | Self::HookRan
            | Self::SkillLoaded => EVENT_VERSION,
        }
    }

    /// The kind named by a wire tag, or `None` for a tag this build does not know.
    pub fn from_wire(tag: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == tag)
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::ContextCreated => "context_created",
            Self::MessageAppended => "message_appended",
            Self::ToolCallStarted => "tool_call_started",
            Self::ToolCallFinished => "tool_call_finished",
            Self::ModelCalled => "model_called",
            Self::TurnCompleted => "turn_completed",
            Self::TaskTransition => "task_transition",
            Self::Retry => "retry",
            Self::Finish => "finish",
            Self::Compaction => "compaction",
            Self::Stagnation => "stagnation",
            Self::ApprovalRequested => "approval_requested",
            Self::ApprovalDecided => "approval_decided",
            Self::ProxyDecision => "proxy_decision",
            Self::Checkpoint => "checkpoint",
            Self::Resumed => "resumed",
            Self::WorkspaceSnapshot => "workspace_snapshot",
            Self::WorkspaceRewound => "workspace_rewound",
            Self::ToolProtocolSwitched => "tool_protocol_switched",
            Self::InstructionsLoaded => "instructions_loaded",
            Self::HookRan => "hook_ran",
            Self::SkillLoaded => "skill_loaded",
        }
    }
}

impl Event {
    pub const fn kind(&self) -> EventKind {
        match self {
            Self::Started(_) => EventKind::Started,
            Self::ContextCreated(_) => EventKind::ContextCreated,
            Self::MessageAppended(_) => EventKind::MessageAppended,
            Self::ToolCallStarted(_) => EventKind::ToolCallStarted,
            Self::ToolCallFinished(_) => EventKind::ToolCallFinished,
            Self::ModelCalled(_) => EventKind::ModelCalled,
            Self::TurnCompleted(_) => EventKind::TurnCompleted,
            Self::TaskTransition(_) => EventKind::TaskTransition,
            Self::Retry(_) => EventKind::Retry,
            Self::Finish(_) => EventKind::Finish,
            Self::Compaction(_) => EventKind::Compaction,
            Self::Stagnation(_) => EventKind::Stagnation,
            Self::ApprovalRequested(_) => EventKind::ApprovalRequested,
            Self::ApprovalDecided(_) => EventKind::ApprovalDecided,
            Self::ProxyDecision(_) => EventKind::ProxyDecision,
            Self::Checkpoint(_) => EventKind::Checkpoint,
            Self::Resumed(_) => EventKind::Resumed,
            Self::WorkspaceSnapshot(_) => EventKind::WorkspaceSnapshot,
            Self::WorkspaceRewound(_) => EventKind::WorkspaceRewound,
            Self::ToolProtocolSwitched(_) => EventKind::ToolProtocolSwitched,
            Self::InstructionsLoaded(_) => EventKind::InstructionsLoaded,
            Self::HookRan(_) => EventKind::HookRan,
            Self::SkillLoaded(_) => EventKind::SkillLoaded,
        }
    }
}
