//! The agent's methods and the sessions they keep. A session is one execution in one
//! sandbox (the runtime's `Session`, opened as `nerve chat` opens one): `session/new`
//! starts it on the client's `cwd`, `session/load` reopens one from the log and tells its
//! transcript again, each `session/prompt` is the next user message (one at a time),
//! `session/cancel` stops the prompt's turn as Ctrl-C does, `session/set_mode` says who
//! answers the approvals an `ask` rule raises.
//!
//! The dispatch loop is the SDK's and runs one handler at a time: a handler that waits
//! (a sandbox starting, a prompt running) is a tokio task of its own, answering through
//! its responder, so that a `session/cancel` is read while a prompt runs.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate,
    CancelNotification, ContentBlock, CurrentModeUpdate, EmbeddedResourceResource, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, LoadSessionResponse,
    McpCapabilities, McpServer, NewSessionRequest, NewSessionResponse, PermissionOption,
    PermissionOptionKind, PromptCapabilities, PromptRequest, PromptResponse,
    RequestPermissionOutcome, RequestPermissionRequest, SessionId, SessionMode, SessionModeState,
    SessionNotification, SessionUpdate, SetSessionModeRequest, SetSessionModeResponse, StopReason,
    ToolCallUpdate, ToolCallUpdateFields, UnstructuredCommandInput,
};
use agent_client_protocol::{Client, ConnectTo, Error};
use async_trait::async_trait;
use nerve_core::event::CallPurpose;
use nerve_core::{Event, ExecutionId, LoopType, TerminationReason, ToolCall};
use nerve_runtime::RuntimeError;
use nerve_runtime::config::Config;
use nerve_runtime::launch::{ChatRequest, ClientMcpServer, Launch};
use nerve_runtime::observer::{Approval, Delta, Notice, Observer};
use nerve_runtime::session::Session;
use tokio_util::sync::CancellationToken;

use crate::Settings;
use crate::updates::Updates;

/// How long a cancelled prompt waits for its turn to stop before it answers `cancelled`
/// anyway (the turn goes on stopping; the next prompt waits for it).
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// The permission options a client is offered, by id.
const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";

/// The agent: its settings and the sessions it opened.
struct Agent {
    db: &'static Path,
    config: &'static Config,
    settings: Settings,
    /// The client's name and version, from `initialize`, recorded with each execution.
    client: Mutex<Option<Implementation>>,
    sessions: Mutex<HashMap<String, Arc<Conversation>>>,
}

/// One session: an execution with its sandbox up.
struct Conversation {
    session: Session,
    /// Whether the execution has started (its first prompt ran, or it was loaded).
    started: AtomicBool,
    /// The token of the prompt running, for `session/cancel`.
    current: Mutex<Option<CancellationToken>>,
    /// One prompt at a time: the next waits for the last to end.
    turn: Arc<tokio::sync::Mutex<()>>,
    ears: Arc<Ears>,
    /// `/compact` without a message: the next prompt compacts the context first.
    compact_next: AtomicBool,
}

/// Who answers an `ask` rule, by the session's mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The client is asked (`session/request_permission`).
    Ask,
    /// Approved without asking, recorded as the person's approval with the mode as reason.
    Allow,
    /// Refused without asking, recorded likewise.
    Deny,
}

impl Mode {
    const ALL: [Self; 3] = [Self::Ask, Self::Allow, Self::Deny];

    fn id(self) -> &'static str {
        match self {
            Self::Ask => "ask",
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }

    fn describe(self) -> (&'static str, &'static str) {
        match self {
            Self::Ask => (
                "Ask",
                "Tool calls the policy asks about wait for your answer",
            ),
            Self::Allow => (
                "Allow",
                "Tool calls the policy asks about run without asking (its deny rules still hold)",
            ),
            Self::Deny => (
                "Deny",
                "Tool calls the policy asks about are refused without asking",
            ),
        }
    }

    fn state(self) -> SessionModeState {
        SessionModeState::new(
            self.id(),
            Self::ALL
                .iter()
                .map(|mode| {
                    let (name, description) = mode.describe();
                    SessionMode::new(mode.id(), name).description(description.to_owned())
                })
                .collect(),
        )
    }
}

/// The session's ears: the runtime's observer, turning what it hears into session updates
/// and approvals into permission requests.
struct Ears {
    session_id: SessionId,
    client: ConnectionTo<Client>,
    updates: Mutex<Updates>,
    mode: Mutex<Mode>,
    /// Rules the person allowed for the rest of the session ("allow always").
    always: Mutex<HashSet<String>>,
    /// Child executions (`delegate`): not drawn as the session's own turns.
    children: nerve_runtime::observer::Children,
}

impl Ears {
    fn send(&self, updates: Vec<SessionUpdate>) {
        for update in updates {
            let notification = SessionNotification::new(self.session_id.clone(), update);
            if let Err(error) = self.client.send_notification(notification) {
                tracing::debug!(%error, "session update not sent: the client is gone");
            }
        }
    }

    fn with_updates<T>(&self, f: impl FnOnce(&mut Updates) -> T) -> T {
        f(&mut self.updates.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Observer for Ears {
    fn events(&self, execution: ExecutionId, events: &[Event]) {
        if self.children.of_child(execution, events) {
            return;
        }
        let updates = self.with_updates(|updates| {
            events
                .iter()
                .flat_map(|event| updates.event(event))
                .collect::<Vec<_>>()
        });
        self.send(updates);
    }

    fn delta(&self, _execution: ExecutionId, purpose: CallPurpose, delta: &Delta) {
        let updates = self.with_updates(|updates| updates.delta(purpose, delta));
        self.send(updates);
    }

    fn notice(&self, notice: Notice) {
        match notice {
            Notice::BuildingDefaultImage { image } => {
                tracing::info!(%image, "building the sandbox image (once)");
            }
            Notice::BuildingImage { dockerfile } => {
                tracing::info!(dockerfile = %dockerfile.display(), "building the sandbox image");
            }
            Notice::BuildOutput(line) => tracing::debug!(%line, "image build"),
            Notice::McpWarning(warning) => tracing::warn!(%warning, "MCP server"),
            Notice::McpNoTools { server, error } => {
                tracing::warn!(%server, %error, "MCP server offers no tools");
            }
            Notice::NoSnapshots { reason } => {
                tracing::warn!(%reason, "no workspace snapshots for this session");
            }
            Notice::SkillSkipped { path, reason } => {
                tracing::warn!(path = %path.display(), %reason, "skill skipped");
            }
        }
    }

    async fn approve(&self, call: &ToolCall, rule: &str) -> Option<Approval> {
        match self.mode() {
            Mode::Allow => {
                return Some(Approval {
                    approved: true,
                    reason: Some("the session's mode allows it".into()),
                });
            }
            Mode::Deny => {
                return Some(Approval {
                    approved: false,
                    reason: Some("the session's mode refuses it".into()),
                });
            }
            Mode::Ask => {}
        }
        if self
            .always
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(rule)
        {
            return Some(Approval {
                approved: true,
                reason: Some("always for this session".into()),
            });
        }
        let options = vec![
            PermissionOption::new(ALLOW_ONCE, "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new(
                ALLOW_ALWAYS,
                format!("Always allow ({rule})"),
                PermissionOptionKind::AllowAlways,
            ),
            PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        ];
        // The call was announced as pending when its approval was requested; its title and
        // input again, for a client that shows the request on its own.
        let tool_call = ToolCallUpdate::new(
            call.id.to_string(),
            ToolCallUpdateFields::new()
                .title(nerve_runtime::views::transcript::key_argument(call))
                .raw_input(call.arguments.clone()),
        );
        let request = RequestPermissionRequest::new(self.session_id.clone(), tool_call, options);
        let response = match self.client.send_request(request).block_task().await {
            Ok(response) => response,
            Err(error) => {
                // The client went away (or cannot answer): the execution parks, to be
                // decided with `nerve approve` or in a loaded session.
                tracing::warn!(%error, "no answer to the permission request: the execution parks");
                return None;
            }
        };
        Some(match response.outcome {
            RequestPermissionOutcome::Selected(selected) => match &*selected.option_id.0 {
                ALLOW_ONCE => Approval {
                    approved: true,
                    reason: None,
                },
                ALLOW_ALWAYS => {
                    self.always
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(rule.to_owned());
                    Approval {
                        approved: true,
                        reason: Some("always for this session".into()),
                    }
                }
                _ => Approval {
                    approved: false,
                    reason: Some("the person said no".into()),
                },
            },
            RequestPermissionOutcome::Cancelled => Approval {
                approved: false,
                reason: Some("the prompt was cancelled".into()),
            },
            _ => Approval {
                approved: false,
                reason: Some("the client gave no answer this agent knows".into()),
            },
        })
    }
}

/// Serves the protocol over `transport` until it closes; then closes every session.
pub(crate) async fn serve(
    db: &'static Path,
    config: &'static Config,
    settings: Settings,
    transport: impl ConnectTo<agent_client_protocol::Agent> + 'static,
) -> Result<(), RuntimeError> {
    let agent = Arc::new(Agent {
        db,
        config,
        settings,
        client: Mutex::new(None),
        sessions: Mutex::new(HashMap::new()),
    });
    let served = {
        let initialize = Arc::clone(&agent);
        let new = Arc::clone(&agent);
        let load = Arc::clone(&agent);
        let prompt = Arc::clone(&agent);
        let cancel = Arc::clone(&agent);
        let mode = Arc::clone(&agent);
        agent_client_protocol::Agent
            .v1()
            .name("nerve")
            .on_receive_request(
                async move |request: InitializeRequest, responder, _cx| {
                    responder.respond(initialize.initialize(request))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: NewSessionRequest, responder, cx| {
                    let agent = Arc::clone(&new);
                    tokio::spawn(async move {
                        let (answer, opened) = match agent.new_session(request, cx).await {
                            Ok((answer, conversation)) => (Ok(answer), Some(conversation)),
                            Err(error) => (Err(error), None),
                        };
                        if let Err(error) = responder.respond_with_result(answer) {
                            tracing::debug!(%error, "session/new answer not sent");
                        }
                        // After the answer, so that the client knows the session it is for.
                        if let Some(conversation) = opened {
                            conversation.ears.send(vec![commands_update()]);
                        }
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: LoadSessionRequest, responder, cx| {
                    let agent = Arc::clone(&load);
                    tokio::spawn(async move {
                        let (answer, opened) = match agent.load_session(request, cx).await {
                            Ok((answer, conversation)) => (Ok(answer), Some(conversation)),
                            Err(error) => (Err(error), None),
                        };
                        if let Err(error) = responder.respond_with_result(answer) {
                            tracing::debug!(%error, "session/load answer not sent");
                        }
                        // After the answer, so that the client knows the session it is for.
                        if let Some(conversation) = opened {
                            conversation.ears.send(vec![commands_update()]);
                        }
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: PromptRequest, responder, _cx| {
                    let agent = Arc::clone(&prompt);
                    tokio::spawn(async move {
                        let answer = agent.prompt(request).await;
                        if let Err(error) = responder.respond_with_result(answer) {
                            tracing::debug!(%error, "session/prompt answer not sent");
                        }
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: SetSessionModeRequest, responder, _cx| {
                    responder.respond_with_result(mode.set_mode(&request))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_notification(
                async move |notification: CancelNotification, _cx| {
                    cancel.cancel(&notification.session_id);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .connect_to(transport)
            .await
    };
    // The client is gone: every sandbox goes (a conversation's home stays for the next).
    let sessions: Vec<Arc<Conversation>> = agent
        .sessions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain()
        .map(|(_, conversation)| conversation)
        .collect();
    for conversation in sessions {
        if let Some(token) = conversation.current() {
            token.cancel();
        }
        // A prompt still running holds its turn: wait for it to end.
        drop(Arc::clone(&conversation.turn).lock_owned().await);
        close(conversation).await;
    }
    served.map_err(|error| RuntimeError::failed(format!("the ACP connection failed: {error}")))
}

/// Closes a session once nothing else holds it (the prompt task that held its turn lets
/// go of it right after).
async fn close(mut conversation: Arc<Conversation>) {
    // Ends: after a bounded number of tries.
    for _ in 0..200 {
        match Arc::try_unwrap(conversation) {
            Ok(owned) => {
                owned.session.close(None).await;
                return;
            }
            Err(shared) => {
                conversation = shared;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    tracing::warn!("a session is still in use at exit; the reaper removes its sandbox");
}

impl Conversation {
    fn current(&self) -> Option<CancellationToken> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Agent {
    fn initialize(&self, request: InitializeRequest) -> InitializeResponse {
        *self.client.lock().unwrap_or_else(PoisonError::into_inner) = request.client_info;
        // Protocol 1 is the one this agent speaks, whatever a client proposes.
        InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .prompt_capabilities(PromptCapabilities::new().embedded_context(true))
                    .mcp_capabilities(McpCapabilities::new()),
            )
            .agent_info(
                Implementation::new("nerve", env!("CARGO_PKG_VERSION")).title("Nerve".to_owned()),
            )
    }

    fn request(&self, workspace: Option<PathBuf>) -> ChatRequest {
        ChatRequest {
            workspace,
            provider: self.settings.provider.clone(),
            model: self.settings.model.clone(),
            max_turns: self.settings.max_turns,
            context_window: self.settings.context_window,
            image: self.settings.image.clone(),
            project_instructions: self.settings.project_instructions,
        }
    }

    /// `session/new`: a new execution on the client's `cwd`, its sandbox up.
    async fn new_session(
        &self,
        request: NewSessionRequest,
        client: ConnectionTo<Client>,
    ) -> Result<(NewSessionResponse, Arc<Conversation>), Error> {
        let launch = nerve_runtime::launch::conversation(
            &self.request(None),
            &request.cwd,
            self.db,
            self.config,
        )
        .await
        .map_err(refused)?;
        let id = launch.execution_id.to_string();
        let conversation = self
            .open(launch, &request.mcp_servers, client, false)
            .await?;
        Ok((
            NewSessionResponse::new(id).modes(Mode::Ask.state()),
            conversation,
        ))
    }

    /// `session/load`: the execution reopened in a fresh sandbox, its conversation told
    /// again as session updates before the answer.
    async fn load_session(
        &self,
        request: LoadSessionRequest,
        client: ConnectionTo<Client>,
    ) -> Result<(LoadSessionResponse, Arc<Conversation>), Error> {
        let id = request.session_id.0.to_string();
        if self.conversation(&request.session_id).is_ok() {
            return Err(Error::invalid_params()
                .data(format!("session {id} is open already on this connection")));
        }
        let (launch, resumable) = nerve_runtime::launch::reopened(
            &self.request(Some(request.cwd.clone())),
            self.db,
            self.config,
            &id,
        )
        .await
        .map_err(refused)?;
        let conversation = self
            .open(launch, &request.mcp_servers, client, true)
            .await?;
        let replay = conversation
            .ears
            .with_updates(|updates| updates.transcript(&resumable.state.messages));
        conversation.ears.send(replay);
        Ok((
            LoadSessionResponse::new().modes(Mode::Ask.state()),
            conversation,
        ))
    }

    /// Opens `launch`'s sandbox with this session's ears, and keeps the session.
    async fn open(
        &self,
        mut launch: Launch<'static>,
        servers: &[McpServer],
        client: ConnectionTo<Client>,
        started: bool,
    ) -> Result<Arc<Conversation>, Error> {
        launch.capture_content = self.settings.capture_content;
        launch.client_mcp = client_servers(servers)?;
        // The `started` event says which front end and which editor ran the execution.
        let editor = self
            .client
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(recorded) = launch.engine_config.recorded_config.as_object_mut() {
            recorded.insert("front_end".into(), "acp".into());
            if let Some(editor) = editor {
                recorded.insert(
                    "client".into(),
                    serde_json::json!({ "name": editor.name, "version": editor.version }),
                );
            }
        }
        let id = launch.execution_id.to_string();
        let ears = Arc::new(Ears {
            session_id: SessionId::new(id.clone()),
            client,
            updates: Mutex::new(Updates::new(
                launch.workspace.clone(),
                Arc::clone(launch.redactor()),
            )),
            mode: Mutex::new(Mode::Ask),
            always: Mutex::new(HashSet::new()),
            children: nerve_runtime::observer::Children::default(),
        });
        let session = launch
            .open(Arc::clone(&ears) as Arc<dyn Observer>)
            .await
            .map_err(refused)?;
        let conversation = Arc::new(Conversation {
            session,
            started: AtomicBool::new(started),
            current: Mutex::new(None),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            ears,
            compact_next: AtomicBool::new(false),
        });
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&conversation));
        Ok(conversation)
    }

    fn conversation(&self, id: &SessionId) -> Result<Arc<Conversation>, Error> {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&*id.0)
            .cloned()
            .ok_or_else(|| {
                agent_client_protocol::v1::schema::Error::session_not_found(id.clone()).into()
            })
    }

    /// `session/prompt`: the prompt is the execution's next user message; the answer is
    /// how the turn ended.
    async fn prompt(&self, request: PromptRequest) -> Result<PromptResponse, Error> {
        let conversation = self.conversation(&request.session_id)?;
        let text = prompt_text(&request.prompt)?;
        let turn = Arc::clone(&conversation.turn).lock_owned().await;
        let first = !conversation.started.load(Ordering::SeqCst);
        let (text, loop_type, compact) = match command(&text) {
            Some(Command::Plan(rest)) if !rest.is_empty() => {
                (rest.to_owned(), LoopType::PlanExecute, false)
            }
            Some(Command::Plan(_)) => {
                conversation
                    .ears
                    .send(vec![said("/plan needs a message: /plan TEXT")]);
                return Ok(PromptResponse::new(StopReason::EndTurn));
            }
            Some(Command::Compact("")) => {
                conversation.compact_next.store(!first, Ordering::SeqCst);
                conversation.ears.send(vec![said(if first {
                    "nothing to compact yet"
                } else {
                    "the context will be compacted before your next message runs"
                })]);
                return Ok(PromptResponse::new(StopReason::EndTurn));
            }
            Some(Command::Compact(rest)) => (rest.to_owned(), self.settings.loop_type, !first),
            None => (text, self.settings.loop_type, false),
        };
        let compact = compact || conversation.compact_next.swap(false, Ordering::SeqCst);
        let cancel = CancellationToken::new();
        *conversation
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(cancel.clone());
        // The turn runs as a task of its own: a cancelled prompt answers within the
        // grace even when the turn takes longer to stop, and the turn still ends cleanly
        // (the next prompt waits for it through the turn lock it holds).
        let running = {
            let conversation = Arc::clone(&conversation);
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let outcome = conversation
                    .session
                    .send(&text, loop_type, first, compact, cancel)
                    .await;
                if outcome.is_ok() {
                    conversation.started.store(true, Ordering::SeqCst);
                }
                let held = conversation.ears.with_updates(Updates::flush);
                conversation.ears.send(held);
                *conversation
                    .current
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                drop(turn);
                outcome
            })
        };
        let mut running = running;
        // Ends: when the turn ends, or the grace after a cancel runs out.
        let outcome = tokio::select! {
            joined = &mut running => joined,
            () = cancel.cancelled() => {
                match tokio::time::timeout(CANCEL_GRACE, &mut running).await {
                    Ok(joined) => joined,
                    Err(_) => return Ok(PromptResponse::new(StopReason::Cancelled)),
                }
            }
        };
        let result = outcome
            .map_err(|error| Error::internal_error().data(format!("the turn failed: {error}")))?
            .map_err(|error| Error::internal_error().data(error.to_string()))?;
        if cancel.is_cancelled() {
            return Ok(PromptResponse::new(StopReason::Cancelled));
        }
        let stop = match result.termination_reason {
            TerminationReason::Completed => StopReason::EndTurn,
            TerminationReason::MaxTurns => StopReason::MaxTurnRequests,
            TerminationReason::Shutdown => StopReason::Cancelled,
            reason @ (TerminationReason::BudgetExhausted
            | TerminationReason::TimedOut
            | TerminationReason::Stagnation
            | TerminationReason::Error
            | TerminationReason::Parked) => {
                // Said to the person, as the terminal says it; the turn ends.
                let line = match &result.error {
                    Some(error) => format!("\n\n· stopped ({reason}): {error}"),
                    None => format!("\n\n· stopped ({reason})"),
                };
                let redacted = conversation
                    .ears
                    .with_updates(|updates| updates.redact(&line));
                conversation.ears.send(vec![said(&redacted)]);
                StopReason::EndTurn
            }
        };
        Ok(PromptResponse::new(stop))
    }

    /// `session/cancel`: the running prompt stops at once (no new tool call starts, a running
    /// command is interrupted).
    fn cancel(&self, id: &SessionId) {
        match self.conversation(id) {
            Ok(conversation) => {
                if let Some(token) = conversation.current() {
                    token.cancel();
                }
            }
            Err(_) => tracing::debug!(session = %id.0, "cancel for a session not open here"),
        }
    }

    /// `session/set_mode`.
    fn set_mode(&self, request: &SetSessionModeRequest) -> Result<SetSessionModeResponse, Error> {
        let conversation = self.conversation(&request.session_id)?;
        let mode = Mode::ALL
            .into_iter()
            .find(|mode| mode.id() == &*request.mode_id.0)
            .ok_or_else(|| {
                Error::invalid_params().data(format!(
                    "unknown mode `{}`: ask, allow or deny",
                    request.mode_id.0
                ))
            })?;
        *conversation
            .ears
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = mode;
        conversation
            .ears
            .send(vec![SessionUpdate::CurrentModeUpdate(
                CurrentModeUpdate::new(mode.id()),
            )]);
        Ok(SetSessionModeResponse::new())
    }
}

/// The slash commands an editor offers (`available_commands_update`); a prompt that starts
/// with one is that command, anything else (an unknown `/word` too) goes to the model.
#[derive(Debug, PartialEq, Eq)]
enum Command<'a> {
    /// `/plan TEXT`: TEXT planned first (plan-execute), then carried out.
    Plan(&'a str),
    /// `/compact [TEXT]`: the context compacted before TEXT (or the next prompt) runs.
    Compact(&'a str),
}

fn command(text: &str) -> Option<Command<'_>> {
    let rest = text.trim_start().strip_prefix('/')?;
    let (name, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    let rest = rest.trim();
    match name {
        "plan" => Some(Command::Plan(rest)),
        "compact" => Some(Command::Compact(rest)),
        _ => None,
    }
}

/// The `available_commands_update` sent once a session is open.
fn commands_update() -> SessionUpdate {
    let command = |name: &str, description: &str, hint: Option<&str>| {
        let command = AvailableCommand::new(name, description);
        match hint {
            Some(hint) => command.input(AvailableCommandInput::Unstructured(
                UnstructuredCommandInput::new(hint),
            )),
            None => command,
        }
    };
    SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(vec![
        command(
            "plan",
            "plan the message first (plan-execute), then carry it out",
            Some("what to plan and do"),
        ),
        command(
            "compact",
            "compact the context before the next message runs",
            Some("optionally, the next message"),
        ),
    ]))
}

/// A line of the agent's own (not the model's) as a message chunk.
fn said(text: &str) -> SessionUpdate {
    SessionUpdate::AgentMessageChunk(agent_client_protocol::v1::schema::ContentChunk::new(
        ContentBlock::Text(agent_client_protocol::v1::schema::TextContent::new(
            text.to_owned(),
        )),
    ))
}

/// A runtime error as the client sees it: a request it can mend (a bad `cwd`, an unknown
/// session) is invalid params, anything else an internal error; the message is the
/// runtime's whole line either way.
fn refused(error: RuntimeError) -> Error {
    let code = if error.kind().is_user_input() {
        agent_client_protocol::ErrorCode::INVALID_PARAMS
    } else {
        agent_client_protocol::ErrorCode::INTERNAL_ERROR
    };
    Error::new(code, error.to_string())
}

/// The text of a prompt: its text blocks, and the text of the resources it embeds or links
/// (named by their URI). Images and audio are refused (the capabilities say so).
fn prompt_text(blocks: &[ContentBlock]) -> Result<String, Error> {
    let mut parts = Vec::new();
    for block in blocks {
        match block {
            ContentBlock::Text(text) => parts.push(text.text.clone()),
            ContentBlock::ResourceLink(link) => parts.push(format!("@{}", link.uri)),
            ContentBlock::Resource(embedded) => match &embedded.resource {
                EmbeddedResourceResource::TextResourceContents(resource) => {
                    parts.push(format!("@{}:\n```\n{}\n```", resource.uri, resource.text))
                }
                EmbeddedResourceResource::BlobResourceContents(_) | _ => {
                    return Err(Error::invalid_params()
                        .data("binary resources are not accepted: send text"));
                }
            },
            ContentBlock::Image(_) | ContentBlock::Audio(_) | _ => {
                return Err(
                    Error::invalid_params().data("only text and text resources are accepted")
                );
            }
        }
    }
    let text = parts.join("\n");
    if text.trim().is_empty() {
        return Err(Error::invalid_params().data("the prompt is empty"));
    }
    Ok(text)
}

/// The client's MCP servers as the sandbox runs them: stdio servers only (the
/// capabilities offer neither HTTP nor SSE).
fn client_servers(servers: &[McpServer]) -> Result<Vec<ClientMcpServer>, Error> {
    servers
        .iter()
        .map(|server| match server {
            McpServer::Stdio(stdio) => Ok(ClientMcpServer {
                name: stdio.name.clone(),
                command: stdio.command.display().to_string(),
                args: stdio.args.clone(),
                env: stdio
                    .env
                    .iter()
                    .map(|var| (var.name.clone(), var.value.clone()))
                    .collect(),
            }),
            McpServer::Http(_) | McpServer::Sse(_) | _ => Err(Error::invalid_params()
                .data("only stdio MCP servers are accepted (see docs/acp.md)")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{
        EmbeddedResource, EnvVariable, McpServerHttp, McpServerStdio, ResourceLink, TextContent,
        TextResourceContents,
    };

    use super::*;

    #[test]
    fn a_prompt_that_starts_with_a_known_command_is_that_command() {
        assert_eq!(command("/plan fix it"), Some(Command::Plan("fix it")));
        assert_eq!(
            command("  /plan\n fix\nit "),
            Some(Command::Plan("fix\nit"))
        );
        assert_eq!(command("/plan"), Some(Command::Plan("")));
        assert_eq!(command("/compact"), Some(Command::Compact("")));
        assert_eq!(
            command("/compact then go"),
            Some(Command::Compact("then go"))
        );
        // Anything else is for the model.
        assert_eq!(command("/etc/hosts holds what?"), None);
        assert_eq!(command("/planning"), None);
        assert_eq!(command("plan /compact"), None);
        assert_eq!(command(""), None);
    }

    fn check_prompt(blocks: Vec<ContentBlock>, expected: Result<&str, &str>) {
        let got = prompt_text(&blocks).map_err(|error| {
            error
                .data
                .as_ref()
                .and_then(|d| d.as_str())
                .unwrap_or_default()
                .to_owned()
        });
        assert_eq!(
            got.as_deref().map_err(String::as_str),
            expected,
            "{blocks:?}"
        );
    }

    #[test]
    fn a_prompt_is_its_text_and_its_text_resources() {
        check_prompt(
            vec![
                ContentBlock::Text(TextContent::new("fix this")),
                ContentBlock::ResourceLink(ResourceLink::new("a.rs", "file:///w/a.rs")),
                ContentBlock::Resource(EmbeddedResource::new(
                    EmbeddedResourceResource::TextResourceContents(TextResourceContents::new(
                        "fn main() {}",
                        "file:///w/b.rs",
                    )),
                )),
            ],
            Ok("fix this\n@file:///w/a.rs\n@file:///w/b.rs:\n```\nfn main() {}\n```"),
        );
        check_prompt(
            vec![ContentBlock::Text(TextContent::new("  "))],
            Err("the prompt is empty"),
        );
    }

    #[test]
    fn a_client_brings_stdio_mcp_servers_only() {
        let stdio = McpServer::Stdio(
            McpServerStdio::new("time", "/usr/bin/mcp-server-time")
                .args(vec!["--local-timezone".into(), "UTC".into()])
                .env(vec![EnvVariable::new("TZ", "UTC")]),
        );
        assert_eq!(
            client_servers(&[stdio]).unwrap(),
            [ClientMcpServer {
                name: "time".into(),
                command: "/usr/bin/mcp-server-time".into(),
                args: vec!["--local-timezone".into(), "UTC".into()],
                env: vec![("TZ".into(), "UTC".into())],
            }]
        );
        let http = McpServer::Http(McpServerHttp::new("remote", "https://example.com/mcp"));
        assert!(client_servers(&[http]).is_err());
    }
}
