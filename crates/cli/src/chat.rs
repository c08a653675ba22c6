//! `nerve chat`: a person and the agent take turns on one execution. The first message is
//! the task; every later one continues the same execution (the runtime's `Session::send`):
//! one log, one sandbox, one context, the loop run once per message. `ask` approvals are
//! asked inline; Ctrl-C stops the agent's turn and returns to the prompt; Ctrl-D or `/exit`
//! ends the session.
//!
//! The line editor (rustyline) lives on a thread of its own, because it blocks; the async
//! side asks it for a line and awaits the answer. Only one question is ever open: the
//! prompt, or an approval asked while the agent's turn waits.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use nerve_brain::ExecutionResult;
use nerve_brain::guards::approval::{Approval, Approver};
use nerve_core::{ExecutionId, LoopType, TerminationReason, ToolCall};
use nerve_runtime::RuntimeError;
use nerve_runtime::launch::ChatRequest;
use nerve_runtime::resume::Resumable;
use nerve_runtime::session::Session;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::args::ChatArgs;
use crate::output;
use crate::progress::{Display, Line, Mode, Status, Style, thousands};
use crate::screen::Screen;
use nerve_runtime::views::transcript::key_argument;

const HELP: &[&str] = &[
    "commands:",
    "  /help      this list",
    "  /status    the execution, workspace, provider, model, approval mode, tokens and cost",
    "  /model     the model asked (/model NAME: ask NAME from the next message on)",
    "  /new       start a new conversation (a new execution) on the same workspace",
    "  /clear     clear the screen and start a new conversation",
    "  /cost      tokens and cost of the execution so far",
    "  /context   how full the context is, compactions and archived blocks",
    "  /compact   compact the context before the next message runs",
    "  /plan      plan the next message first (plan-execute), then carry it out",
    "  /diff      what the agent changed in the workspace (/diff last: the last turn that changed it; /diff N: turn N)",
    "  /undo      put the workspace back as it was before the last change (/undo force: over your own edits too)",
    "  /fork N    a new execution from this one's first N turns, on a copy of the workspace as it was then",
    "  /exit      end the session (or Ctrl-D)",
    "keys:",
    "  Enter      send the message",
    "  Alt-Enter  a new line in the message (or end the line with \\ and press Enter)",
    "  Up, Down   earlier messages (kept between sessions); Ctrl-R searches them",
    "  Ctrl-A, Ctrl-E   start, end of the line; Ctrl-W deletes a word; Ctrl-L clears the screen",
    "  Ctrl-C     while the agent works: stop its turn now (twice: abort); at the prompt: clear the line",
    "  Ctrl-D     end the session",
];

/// `nerve chat [--workspace DIR] [ID]`.
pub(crate) async fn chat(
    args: ChatArgs,
    db: &Path,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    let workspace = match &args.id {
        Some(id) => nerve_runtime::resume::workspace_of(db, id).await?,
        None => Some(args.workspace.clone().unwrap_or_else(|| ".".into())),
    };
    let flags = nerve_runtime::settings::Flags {
        provider: args.provider.clone(),
        model: args.model.clone(),
        approval: args.approval.map(Into::into),
        context_window: args.context_window,
        sandbox_fallback: None,
    };
    let config = crate::settings::load(config_path, workspace.as_deref(), flags)?;
    let request = ChatRequest {
        workspace: args.workspace.clone(),
        provider: args.provider.clone(),
        model: args.model.clone(),
        max_turns: args.max_turns,
        context_window: args.context_window,
        image: args.image.clone(),
        project_instructions: !args.no_project_instructions,
    };
    let terminal = Arc::new(Terminal::start(history_file())?);
    let mut reopen = args.id.clone();
    let mut workspace = match &args.workspace {
        Some(dir) => dir.clone(),
        None => std::env::current_dir()
            .map_err(|e| Failure::usage(format!("cannot read the current directory: {e}")))?,
    };
    // Ends: each round is one conversation, and a new one starts only when the person asks
    // for it (`/new`, `/clear`); `/exit`, Ctrl-D or the end of input end them all.
    loop {
        let (launch, reopened) = match reopen.take() {
            Some(id) => {
                let (launch, resumable) =
                    nerve_runtime::launch::reopened(&request, db, &config, &id).await?;
                (launch, Some(resumable))
            }
            None => {
                let launch =
                    nerve_runtime::launch::conversation(&request, &workspace, db, &config).await?;
                (launch, None)
            }
        };
        workspace.clone_from(&launch.workspace);
        let ending = converse(launch, reopened, &terminal, &config, config_path).await?;
        match ending {
            Ending::Exit => return Ok(0),
            Ending::New { clear } => {
                if clear {
                    // Clear the screen and the scrollback, cursor home.
                    output::raw("\x1b[H\x1b[2J\x1b[3J");
                }
            }
        }
    }
}

/// How a conversation ended.
enum Ending {
    /// The person ended the session.
    Exit,
    /// `/new` (or `/clear`: the screen cleared first): another conversation on the same
    /// workspace.
    New { clear: bool },
}

/// One conversation: its sandbox opened, the person and the agent taking turns, the
/// sandbox closed.
async fn converse(
    mut launch: nerve_runtime::launch::Launch<'_>,
    reopened: Option<Resumable>,
    terminal: &Arc<Terminal>,
    settings: &nerve_runtime::config::Config,
    config_path: Option<&Path>,
) -> Result<Ending, Failure> {
    let db = launch.db;
    let mode = Mode::detect(false, false);
    launch.capture_content = crate::telemetry::capture_content()?;
    let display = Arc::new(Display::new(
        mode,
        launch.context_window()?,
        Arc::clone(launch.redactor()),
    ));
    let current: Arc<Mutex<Option<CancellationToken>>> = Arc::new(Mutex::new(None));
    let approver = ChatApprover {
        terminal: Arc::clone(terminal),
        display: Arc::clone(&display),
        current: Arc::clone(&current),
        always: Mutex::new(HashSet::new()),
    };
    let screen = Screen {
        display: Arc::clone(&display),
        jsonl: None,
        approver: Some(Arc::new(approver)),
        children: nerve_runtime::observer::Children::default(),
    };
    let mut session = launch.open(Arc::new(screen)).await?;
    let mut chat = Chat {
        session: &mut session,
        display,
        terminal: Arc::clone(terminal),
        current,
        db,
        settings,
        config: config_path,
    };
    let ending = chat.converse(reopened).await;
    // A conversation never ends for good: the sandbox home stays for the next one.
    session.close(None).await;
    ending
}

/// A conversation, once the sandbox is up.
struct Chat<'a> {
    session: &'a mut Session,
    display: Arc<Display>,
    terminal: Arc<Terminal>,
    /// The token of the agent's turn in progress, for Ctrl-C and the approval question.
    current: Arc<Mutex<Option<CancellationToken>>>,
    db: &'a Path,
    /// The settings it runs with (`/status`, `/model`).
    settings: &'a nerve_runtime::config::Config,
    /// The `--config` it runs with, for the next steps it suggests.
    config: Option<&'a Path>,
}

impl Chat<'_> {
    /// Prompt, run, repeat, until the person ends the session or asks for a new one.
    async fn converse(&mut self, reopened: Option<Resumable>) -> Result<Ending, Failure> {
        let Self {
            session,
            display,
            terminal,
            current,
            db,
            settings,
            config,
        } = self;
        let execution_id = session.execution_id();
        // The handler is installed here, before the first prompt, not when the task first
        // runs: the line editor saves the SIGINT disposition it finds when a prompt opens and
        // puts it back when the prompt closes, so a handler installed while the first prompt
        // is open (the task scheduled late on a busy machine) was undone by it, and the next
        // Ctrl-C killed nerve (seen in CI under load: the chat's terminal vanished).
        let sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| Failure::runtime(format!("cannot catch Ctrl-C: {e}")))?;
        let interrupts = tokio::spawn(stop_turns(sigint, Arc::clone(current), Arc::clone(display)));

        let mut started = reopened.is_some();
        let mut header: Vec<Line> = vec![(
            Style::Dim,
            format!(
                "nerve chat · execution {execution_id} · {} · {}",
                session.workspace().display(),
                session.model()
            ),
        )];
        if let Some(reopened) = &reopened {
            let state = &reopened.state;
            header.push((
                Style::Dim,
                format!(
                    "reopened after turn {} · {} in / {} out tokens · {} · task: {}",
                    state.turns,
                    thousands(state.usage.input_tokens),
                    thousands(state.usage.output_tokens),
                    state.cost,
                    crate::progress::first_line(&reopened.started.task)
                ),
            ));
            display.seed(Status {
                turn: state.turns,
                usage: state.usage,
                cost: state.cost,
                ..Status::default()
            });
        }
        header.push((
        Style::Dim,
        "type a message · /help for commands · Ctrl-C stops the agent's turn · Ctrl-D or /exit ends"
            .to_owned(),
    ));
        display.lines(&header);

        let mut plan_next = false;
        let mut compact_next = false;
        let mut ending = Ending::Exit;
        // Ends: when the person says so (`/exit`, Ctrl-D, `/new`, `/clear`) or the input
        // ends.
        loop {
            display.pause();
            let line = match terminal.read("› ", true).await {
                Input::Line(line) => line,
                Input::Interrupted => continue,
                Input::Eof => break,
            };
            // A line ending in `\` went on on the next one: the backslash was only the way
            // to type the line break.
            let joined = line.replace("\\\n", "\n");
            let text = joined.trim();
            if text.is_empty() {
                continue;
            }
            if display.mode() == Mode::Plain {
                // Nobody sees the typing off a terminal: the transcript shows the message.
                display.lines(&[(Style::Text, format!("› {text}"))]);
            }
            if let Some(command) = text.strip_prefix('/') {
                match command.split_whitespace().next().unwrap_or_default() {
                    "exit" | "quit" => break,
                    name @ ("new" | "clear") => {
                        ending = Ending::New {
                            clear: name == "clear",
                        };
                        break;
                    }
                    "status" => {
                        let lines = status_lines(session, display, settings);
                        display.lines(&lines);
                    }
                    "model" => {
                        let lines = model_command(session, display, settings, command).await;
                        display.lines(&lines);
                    }
                    "help" => {
                        display.lines(&styled(Style::Dim, HELP.iter().map(|l| (*l).to_owned())))
                    }
                    "cost" => {
                        let status = display.status();
                        display.lines(&[(
                            Style::Dim,
                            format!(
                                "{} turn{} · {} in / {} out tokens · {}",
                                status.turn,
                                if status.turn == 1 { "" } else { "s" },
                                thousands(status.usage.input_tokens),
                                thousands(status.usage.output_tokens),
                                status.cost
                            ),
                        )]);
                    }
                    "context" => {
                        let status = display.status();
                        let fill = match session.context_window().filter(|w| *w > 0) {
                            Some(window) => format!(
                                "{} of {} tokens ({}%)",
                                thousands(status.last_input),
                                thousands(window),
                                status.last_input.saturating_mul(100) / window
                            ),
                            None => {
                                format!("{} tokens (window unknown)", thousands(status.last_input))
                            }
                        };
                        display.lines(&[(
                            Style::Dim,
                            format!(
                                "context: {fill} · {} compaction(s) · {} archived block(s)",
                                status.compactions, status.archived_blocks
                            ),
                        )]);
                    }
                    "compact" => {
                        compact_next = started;
                        display.lines(&[(
                            Style::Dim,
                            if started {
                                "the context will be compacted before your next message runs"
                            } else {
                                "nothing to compact yet"
                            }
                            .to_owned(),
                        )]);
                    }
                    "plan" => {
                        plan_next = true;
                        display.lines(&[(
                            Style::Dim,
                            "the next message is planned first (plan-execute)".to_owned(),
                        )]);
                    }
                    "diff" => {
                        let lines = workspace_command(db, execution_id, started, command).await;
                        display.lines(&lines);
                    }
                    "undo" | "fork" => {
                        let lines = workspace_command(db, execution_id, started, command).await;
                        display.lines(&lines);
                    }
                    other => display.lines(&[(
                        Style::Error,
                        format!("unknown command /{other}: /help lists them"),
                    )]),
                }
                continue;
            }

            display.next_message();
            display.start_clock();
            display.resume();
            let ticker = crate::progress::ticker(display);
            let cancel = CancellationToken::new();
            if let Ok(mut slot) = current.lock() {
                *slot = Some(cancel.clone());
            }
            let loop_type = if std::mem::take(&mut plan_next) {
                LoopType::PlanExecute
            } else {
                LoopType::React
            };
            let outcome = session
                .send(
                    text,
                    loop_type,
                    !started,
                    std::mem::take(&mut compact_next),
                    cancel,
                )
                .await;
            ticker.abort();
            if let Ok(mut slot) = current.lock() {
                *slot = None;
            }
            display.finish();
            match outcome {
                Ok(result) => {
                    started = true;
                    let mut lines = message_ending(&result);
                    if display.mode() == Mode::Live {
                        // Off a terminal the last turn's line said as much already.
                        lines.push((Style::Dim, display.status_text(&display.status())));
                    }
                    display.lines(&lines);
                }
                Err(error) => display.lines(&[(Style::Error, format!("error: {error}"))]),
            }
        }
        interrupts.abort();
        display.pause();
        if started {
            let mut lines = vec![(Style::Text, String::new())];
            if matches!(ending, Ending::New { .. }) {
                lines.push((
                    Style::Dim,
                    format!("execution {execution_id} set aside: a new conversation begins"),
                ));
            }
            lines.extend(crate::progress::next_steps(execution_id, db, *config, None));
            display.lines(&lines);
        }
        Ok(ending)
    }
}

/// `/status`: what the conversation runs on, and where it stands.
fn status_lines(
    session: &Session,
    display: &Display,
    settings: &nerve_runtime::config::Config,
) -> Vec<Line> {
    let approval = settings.approval.unwrap_or_default();
    let rules = settings.rules.len() + settings.policy.rules.len();
    vec![
        (
            Style::Dim,
            format!(
                "execution {} · {}",
                session.execution_id(),
                session.workspace().display()
            ),
        ),
        (
            Style::Dim,
            format!(
                "provider {} · model {} · approval {}{}",
                session.provider_name(),
                session.model(),
                approval.as_str(),
                match rules {
                    0 => String::new(),
                    1 => " · 1 rule".to_owned(),
                    n => format!(" · {n} rules"),
                }
            ),
        ),
        (Style::Dim, display.status_text(&display.status())),
    ]
}

/// `/model` (the model asked) and `/model NAME` (ask NAME from the next message on: a new
/// client of the same provider, the window from the settings or the model table).
async fn model_command(
    session: &mut Session,
    display: &Display,
    settings: &nerve_runtime::config::Config,
    command: &str,
) -> Vec<Line> {
    let mut words = command.split_whitespace().skip(1);
    let (Some(name), None) = (words.next(), words.next()) else {
        return vec![(
            Style::Dim,
            format!(
                "model {} (provider {}) · /model NAME asks another",
                session.model(),
                session.provider_name()
            ),
        )];
    };
    let provider = session.provider_name().to_owned();
    if provider.starts_with("script:") {
        return vec![(
            Style::Error,
            "a script: provider answers from its cassette: it has no model to choose".to_owned(),
        )];
    }
    let built = async {
        let provider_settings = settings.provider_settings(settings.context_window)?;
        let client =
            nerve_runtime::provider::build(&provider, Some(name), &provider_settings).await?;
        let window = settings
            .context_window
            .or(settings.model_table()?.get(name).map(|m| m.context_window));
        Ok::<_, RuntimeError>((client, window))
    }
    .await;
    match built {
        Ok((client, window)) => {
            session.switch_provider(client, window);
            display.set_context_window(window);
            vec![(
                Style::Dim,
                format!(
                    "the next message asks {name}{}",
                    window.map_or_else(String::new, |w| format!(
                        " (a {}-token window)",
                        thousands(w)
                    ))
                ),
            )]
        }
        Err(error) => vec![(Style::Error, format!("/model {name}: {}", error.message()))],
    }
}

/// `/diff [last|N]` and `/undo [force]` on the execution's workspace (docs/checkpoints.md).
async fn workspace_command(
    db: &Path,
    execution_id: ExecutionId,
    started: bool,
    command: &str,
) -> Vec<Line> {
    if !started {
        return vec![(Style::Dim, "nothing yet: the agent has not run".to_owned())];
    }
    let mut words = command.split_whitespace();
    let id = execution_id.to_string();
    let outcome = match (words.next(), words.next(), words.next()) {
        (Some("diff"), None, None) => {
            nerve_runtime::snapshots::diff_text(db, &id, nerve_runtime::snapshots::Scope::Execution)
                .await
                .map(|text| vec![text])
        }
        (Some("diff"), Some("last"), None) => nerve_runtime::snapshots::diff_text(
            db,
            &id,
            nerve_runtime::snapshots::Scope::LastChange,
        )
        .await
        .map(|text| vec![text]),
        (Some("diff"), Some(turn), None) if turn.parse::<u32>().is_ok_and(|t| t > 0) => {
            let turn = turn.parse::<u32>().unwrap_or(1);
            nerve_runtime::snapshots::diff_text(
                db,
                &id,
                nerve_runtime::snapshots::Scope::Turn(turn),
            )
            .await
            .map(|text| vec![text])
        }
        (Some("undo"), force @ (None | Some("force")), None) => {
            nerve_runtime::snapshots::rewind_to(
                db,
                &id,
                nerve_runtime::snapshots::Target::Undo,
                force.is_some(),
            )
            .await
        }
        (Some("fork"), Some(turn), None) if turn.parse::<u32>().is_ok_and(|t| t > 0) => {
            let request = nerve_runtime::fork::ForkRequest {
                id: id.clone(),
                turn: turn.parse::<u32>().unwrap_or(1),
                in_place: false,
                into: None,
            };
            nerve_runtime::fork::fork(db, &request).await.map(|forked| {
                vec![format!(
                    "forked turn {} into execution {} on {}: `nerve chat {}` takes it up",
                    forked.turn,
                    forked.execution_id,
                    forked.workspace.display(),
                    forked.execution_id
                )]
            })
        }
        _ => Err(RuntimeError::usage(
            "usage: /diff, /diff last, /diff N, /undo, /undo force or /fork N",
        )),
    };
    match outcome {
        Ok(lines) => lines
            .iter()
            .flat_map(|text| text.lines())
            .map(|line| (Style::Text, line.to_owned()))
            .collect(),
        Err(failure) => vec![(
            Style::Error,
            failure.message().replace("pass --force", "use /undo force"),
        )],
    }
}

/// One line after the agent's answer: nothing when it simply answered, else how the turn
/// ended and why.
fn message_ending(result: &ExecutionResult) -> Vec<Line> {
    let mut lines = Vec::new();
    match result.termination_reason {
        TerminationReason::Completed => {}
        TerminationReason::Shutdown => {
            lines.push((
                Style::Note,
                "· stopped: the agent's turn was interrupted".to_owned(),
            ));
        }
        reason @ (TerminationReason::MaxTurns
        | TerminationReason::BudgetExhausted
        | TerminationReason::TimedOut
        | TerminationReason::Stagnation
        | TerminationReason::Error
        | TerminationReason::Parked) => {
            lines.push((
                Style::Error,
                format!(
                    "· {reason}{}",
                    result
                        .error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    lines
}

fn styled(style: Style, lines: impl Iterator<Item = String>) -> Vec<Line> {
    lines.map(|line| (style, line)).collect()
}

/// Ctrl-C while the agent works stops its turn now (a model call in flight is abandoned,
/// no tool call starts, a running command is interrupted: docs/cli.md, "Stopping"); a
/// second one while it stops aborts, as in `run`. At the prompt
/// the line editor owns the terminal and Ctrl-C only clears the line.
async fn stop_turns(
    mut sigint: tokio::signal::unix::Signal,
    current: Arc<Mutex<Option<CancellationToken>>>,
    display: Arc<Display>,
) {
    // Ends: when the task is aborted (the conversation is over), or the second Ctrl-C exits.
    while sigint.recv().await.is_some() {
        let token = current.lock().ok().and_then(|slot| slot.clone());
        let Some(token) = token else {
            continue;
        };
        if token.is_cancelled() {
            output::error_line("nerve: aborted");
            std::process::exit(130);
        }
        display.lines(&[(
            Style::Note,
            "· stopping the agent's turn (Ctrl-C again to abort)".to_owned(),
        )]);
        token.cancel();
    }
}

/// Asks the person about `ask` rules, inline: yes, no, or always (for this session, this
/// rule). Every answer is recorded by the engine as a person's decision.
struct ChatApprover {
    terminal: Arc<Terminal>,
    display: Arc<Display>,
    current: Arc<Mutex<Option<CancellationToken>>>,
    /// Rules the person approved for the rest of the session.
    always: Mutex<HashSet<String>>,
}

#[async_trait]
impl Approver for ChatApprover {
    async fn decide(&self, call: &ToolCall, rule: &str) -> Option<Approval> {
        if self.always.lock().is_ok_and(|always| always.contains(rule)) {
            return Some(Approval {
                approved: true,
                reason: Some("always for this session".into()),
            });
        }
        self.display.pause();
        let question = format!(
            "allow {}? [y]es / [n]o / [a]lways for this session › ",
            key_argument(call)
        );
        let approval = loop {
            match self.terminal.read(&question, false).await {
                Input::Line(answer) => match answer.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => {
                        break Approval {
                            approved: true,
                            reason: None,
                        };
                    }
                    "n" | "no" => {
                        break Approval {
                            approved: false,
                            reason: Some("the person said no".into()),
                        };
                    }
                    "a" | "always" => {
                        if let Ok(mut always) = self.always.lock() {
                            always.insert(rule.to_owned());
                        }
                        break Approval {
                            approved: true,
                            reason: Some("always for this session".into()),
                        };
                    }
                    _ => {}
                },
                Input::Interrupted | Input::Eof => {
                    // Ctrl-C at the question refuses the call and stops the turn.
                    if let Some(token) = self.current.lock().ok().and_then(|slot| slot.clone()) {
                        token.cancel();
                    }
                    break Approval {
                        approved: false,
                        reason: Some("the person stopped the turn".into()),
                    };
                }
            }
        };
        self.display.resume();
        Some(approval)
    }
}

/// What the person typed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Input {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D, or the end of input.
    Eof,
}

struct Request {
    prompt: String,
    history: bool,
    reply: tokio::sync::oneshot::Sender<Input>,
}

/// The line editor, on its own thread.
struct Terminal {
    requests: std::sync::mpsc::Sender<Request>,
}

impl Terminal {
    fn start(history: Option<PathBuf>) -> Result<Self, Failure> {
        let config = rustyline::Config::builder()
            .auto_add_history(false)
            .max_history_size(1000)
            .map_err(|e| Failure::usage(format!("line editor: {e}")))?
            .build();
        let mut editor: rustyline::Editor<LineBreaks, rustyline::history::FileHistory> =
            rustyline::Editor::with_config(config)
                .map_err(|e| Failure::usage(format!("cannot open the terminal: {e}")))?;
        editor.set_helper(Some(LineBreaks));
        // Alt-Enter (Esc then Enter, as terminals send it) breaks the line; Enter sends.
        editor.bind_sequence(
            rustyline::KeyEvent(rustyline::KeyCode::Enter, rustyline::Modifiers::ALT),
            rustyline::EventHandler::Simple(rustyline::Cmd::Newline),
        );
        if let Some(path) = &history
            && path.exists()
        {
            // A history that cannot be read is no reason to refuse a session.
            let _ = editor.load_history(path);
        }
        let (requests, inbox) = std::sync::mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("nerve-chat-terminal".into())
            .spawn(move || {
                // Ends: when the conversation drops its side of the channel.
                while let Ok(request) = inbox.recv() {
                    let input = match editor.readline(&request.prompt) {
                        Ok(line) => {
                            if request.history && !line.trim().is_empty() {
                                let _ = editor.add_history_entry(line.as_str());
                                if let Some(path) = &history {
                                    let _ = editor.save_history(path);
                                }
                            }
                            Input::Line(line)
                        }
                        Err(rustyline::error::ReadlineError::Interrupted) => Input::Interrupted,
                        Err(_) => Input::Eof,
                    };
                    let _ = request.reply.send(input);
                }
            })
            .map_err(|e| Failure::runtime(format!("cannot start the line editor: {e}")))?;
        Ok(Self { requests })
    }

    async fn read(&self, prompt: &str, history: bool) -> Input {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let request = Request {
            prompt: prompt.to_owned(),
            history,
            reply,
        };
        if self.requests.send(request).is_err() {
            return Input::Eof;
        }
        answer.await.unwrap_or(Input::Eof)
    }
}

/// The line editor's helper: a line ending in `\` is not sent yet; Enter breaks it there
/// and the message goes on (the backslash is dropped when it is sent).
struct LineBreaks;

impl rustyline::validate::Validator for LineBreaks {
    fn validate(
        &self,
        ctx: &mut rustyline::validate::ValidationContext<'_>,
    ) -> rustyline::Result<rustyline::validate::ValidationResult> {
        Ok(if continues(ctx.input()) {
            rustyline::validate::ValidationResult::Incomplete
        } else {
            rustyline::validate::ValidationResult::Valid(None)
        })
    }
}

/// Whether `input` ends in a backslash that asks for another line (`\\` is a backslash
/// typed for itself).
fn continues(input: &str) -> bool {
    let trailing = input.chars().rev().take_while(|c| *c == '\\').count();
    trailing % 2 == 1
}

impl rustyline::completion::Completer for LineBreaks {
    type Candidate = String;
}

impl rustyline::hint::Hinter for LineBreaks {
    type Hint = String;
}

impl rustyline::highlight::Highlighter for LineBreaks {}

impl rustyline::Helper for LineBreaks {}

/// Where the chat history is kept: beside the default log, under the XDG state directory.
fn history_file() -> Option<PathBuf> {
    let db = nerve_runtime::log::default_db().ok()?;
    let dir = db.parent()?;
    std::fs::create_dir_all(dir).ok()?;
    Some(dir.join("chat_history"))
}

#[cfg(test)]
mod tests {
    use super::continues;

    #[test]
    fn a_trailing_backslash_asks_for_another_line() {
        for (input, expected) in [
            ("fix it", false),
            ("fix it \\", true),
            ("first\\\nsecond \\", true),
            ("a path C:\\\\", false),
            ("", false),
        ] {
            assert_eq!(continues(input), expected, "{input:?}");
        }
    }
}
