//! The live transcript of `run`, `resume` and `chat`, drawn from the events on their way to
//! the log (so it can never disagree with what was recorded) and from the answer's deltas
//! as the model writes them: the assistant's words, each tool call as one line with its key
//! argument and then its outcome, short notes for compactions, retries, approvals and proxy
//! denials, and a status line (turn, tokens, cost, context fill, the tool in flight). The
//! final answer is printed whole at the end ([`Display::finish`]).
//!
//! On a terminal the status line stays at the bottom and text streams in; elsewhere the
//! same content comes as plain lines (whole messages, a status line per turn), never with
//! an escape sequence. `--quiet` prints only the final answer, `--json` nothing.

use std::sync::Mutex;

use nerve_brain::Delta;
use nerve_core::event::{
    ApprovalDecision, CallOutcome, CallPurpose, ProxyVerdict, StagnationAction,
};
use nerve_core::{Event, ExecutionId, MessageRole, MicroUsd, TerminationReason, TokenUsage};

use crate::output;
pub(crate) use nerve_runtime::views::transcript::thousands;
use nerve_runtime::views::transcript::{key_argument, outcome_lines, text_of};

/// How the transcript is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `--json`: nothing but the JSON object.
    Silent,
    /// `--quiet`: only the final answer.
    Answer,
    /// Not a terminal: plain lines.
    Plain,
    /// A terminal: streaming text and a status line at the bottom.
    Live,
}

impl Mode {
    /// Live on a terminal, plain lines otherwise; `--json` and `--quiet` win.
    pub(crate) fn detect(json: bool, quiet: bool) -> Self {
        use std::io::IsTerminal;
        if json {
            Self::Silent
        } else if quiet {
            Self::Answer
        } else if std::io::stdout().is_terminal() {
            Self::Live
        } else {
            Self::Plain
        }
    }
}

/// How a line looks on a colour terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// The assistant's words and the answer.
    Text,
    /// A tool call.
    Call,
    /// A tool's outcome, the status line per turn.
    Dim,
    /// Compactions, retries, approvals.
    Note,
    /// A failure.
    Error,
}

impl Style {
    fn colour(self) -> Option<&'static str> {
        match self {
            Self::Text => None,
            Self::Call => Some("\x1b[1m"),
            Self::Dim => Some("\x1b[2m"),
            Self::Note => Some("\x1b[33m"),
            Self::Error => Some("\x1b[31m"),
        }
    }
}

/// One line of the transcript.
pub(crate) type Line = (Style, String);

/// Where an execution stands, as the status line shows it.
#[derive(Debug, Default, Clone)]
pub(crate) struct Status {
    pub(crate) turn: u32,
    pub(crate) usage: TokenUsage,
    pub(crate) cost: MicroUsd,
    /// Input tokens of the last model call: how full the context was.
    pub(crate) last_input: u64,
    pub(crate) compactions: u32,
    pub(crate) archived_blocks: usize,
    pub(crate) tool: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    status: Status,
    /// The last answer without tool calls; `None` once the agent goes on.
    answer: Option<String>,
    /// Whether that answer was streamed to the screen already.
    answer_streamed: bool,
    /// Text of the current agent call shown as it streamed.
    streamed: String,
    /// Streamed text held back because the next delta could make it part of a secret.
    held: nerve_core::StreamRedaction,
    /// The cursor is in the middle of a streamed line (live).
    mid_line: bool,
    /// The status line is on the screen (live).
    status_shown: bool,
    /// Someone else has the terminal (the chat prompt, an approval question).
    paused: bool,
    /// When the run (or the chat's message) began: the status line shows a spinner and the
    /// time since, so that a long wait for the model is seen to be one.
    since: Option<std::time::Instant>,
}

/// The transcript on the screen. Thread-safe: events arrive from the engine's task,
/// deltas from the provider's.
#[derive(Debug)]
pub(crate) struct Display {
    mode: Mode,
    colour: bool,
    /// The model's window in tokens, 0 when unknown (chat's `/model` changes it).
    context_window: std::sync::atomic::AtomicU64,
    /// The log's redactor: nothing reaches the screen that the log would not keep.
    redactor: std::sync::Arc<nerve_core::Redactor>,
    state: Mutex<State>,
}

impl Display {
    pub(crate) fn new(
        mode: Mode,
        context_window: Option<u64>,
        redactor: std::sync::Arc<nerve_core::Redactor>,
    ) -> Self {
        Self {
            mode,
            colour: mode == Mode::Live && output::stdout_colour(),
            context_window: std::sync::atomic::AtomicU64::new(context_window.unwrap_or(0)),
            redactor,
            state: Mutex::new(State::default()),
        }
    }

    /// The model's window, when known.
    pub(crate) fn context_window(&self) -> Option<u64> {
        Some(
            self.context_window
                .load(std::sync::atomic::Ordering::Relaxed),
        )
        .filter(|w| *w > 0)
    }

    /// Another model's window (chat's `/model`).
    pub(crate) fn set_context_window(&self, window: Option<u64>) {
        self.context_window
            .store(window.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// Starts the clock the status line shows (a run, or a chat's message, begins).
    pub(crate) fn start_clock(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.since = Some(std::time::Instant::now());
        }
    }

    /// Redraws the status line (its spinner and clock move) when it is on the screen's
    /// last line: called a few times a second while the agent works.
    pub(crate) fn tick(&self) {
        if let Ok(mut state) = self.state.lock() {
            self.draw_status(&mut state);
        }
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Starts the counters where an execution already stands (a reopened chat).
    pub(crate) fn seed(&self, status: Status) {
        if let Ok(mut state) = self.state.lock() {
            state.status = status;
        }
    }

    /// The counters now.
    pub(crate) fn status(&self) -> Status {
        self.state
            .lock()
            .map(|state| state.status.clone())
            .unwrap_or_default()
    }

    /// The status line's text: the execution's totals so far (the transcript's turn lines
    /// give each turn's own, as the HTML page does).
    pub(crate) fn status_text(&self, status: &Status) -> String {
        let head = figures(status.turn, &status.usage, status.cost, " in all");
        self.status_tail(head, status)
    }

    /// A plain transcript's line for turn `turn`: its own tokens and cost (as the HTML
    /// page's timeline), then how full the context was at its model call.
    fn turn_text(&self, turn: &nerve_core::event::TurnCompleted, status: &Status) -> String {
        let head = figures(turn.turn, &turn.usage, turn.cost, "");
        self.status_tail(head, status)
    }

    /// The context fill, compactions and the tool in flight after `head`.
    fn status_tail(&self, mut text: String, status: &Status) -> String {
        if let Some(window) = self.context_window() {
            text.push_str(&format!(
                " · context {}%",
                status.last_input.saturating_mul(100) / window
            ));
        }
        if status.compactions > 0 {
            text.push_str(&format!(" · {} compaction(s)", status.compactions));
        }
        if let Some(tool) = &status.tool {
            text.push_str(&format!(" · running {tool}"));
        }
        text
    }

    /// Prints lines of the CLI's own (headers, notes) in the transcript's style.
    pub(crate) fn lines(&self, lines: &[Line]) {
        if matches!(self.mode, Mode::Silent | Mode::Answer) {
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            self.print(&mut state, lines);
        }
    }

    /// Hands the terminal to a prompt: the status line goes away until [`Display::resume`].
    pub(crate) fn pause(&self) {
        if let Ok(mut state) = self.state.lock() {
            self.clear_status(&mut state);
            if state.mid_line {
                self.write("\n");
                state.mid_line = false;
            }
            state.paused = true;
        }
    }

    pub(crate) fn resume(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.paused = false;
            self.draw_status(&mut state);
        }
    }

    /// Forgets the answer of the previous message (a chat's next message begins).
    pub(crate) fn next_message(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.answer = None;
            state.answer_streamed = false;
        }
    }

    /// The end of an execution (or of a chat message): the status line cleared and the
    /// final answer printed whole (unless it streamed onto this screen already).
    /// Returns the answer.
    pub(crate) fn finish(&self) -> Option<String> {
        let Ok(mut state) = self.state.lock() else {
            return None;
        };
        self.clear_status(&mut state);
        if state.mid_line {
            self.write("\n");
            state.mid_line = false;
        }
        // The run is over: what follows (its ending, a chat's prompt) has no status line.
        state.paused = true;
        state.since = None;
        state.status.tool = None;
        let answer = state
            .answer
            .as_deref()
            .map(|a| self.redactor.redact(a).into_owned())
            .filter(|a| !a.trim().is_empty());
        match (self.mode, &answer) {
            (Mode::Answer, Some(answer)) => output::line(answer.trim_end()),
            (Mode::Plain | Mode::Live, Some(answer)) if !state.answer_streamed => {
                let mut lines = vec![(Style::Text, String::new())];
                lines.extend(
                    answer
                        .trim_end()
                        .lines()
                        .map(|line| (Style::Text, line.to_owned())),
                );
                self.print_lines(&lines);
            }
            (Mode::Silent | Mode::Answer | Mode::Plain | Mode::Live, _) => {}
        }
        answer
    }

    pub(crate) fn observe(&self, event: &Event) {
        if self.mode == Mode::Silent {
            return;
        }
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        // Whatever streamed text was held back is complete now.
        let rest = state.held.finish(&self.redactor);
        if !rest.is_empty() && self.mode == Mode::Live {
            self.write(&rest);
            state.mid_line = !rest.ends_with('\n');
        }
        let lines = self.describe(&mut state, event);
        if self.mode == Mode::Answer {
            return;
        }
        let message_ended =
            matches!(event, Event::MessageAppended(m) if m.message.role == MessageRole::Assistant);
        if state.mid_line && (message_ended || !lines.is_empty()) {
            // A streamed message ends before what follows it.
            self.write("\n");
            state.mid_line = false;
        }
        self.print(&mut state, &lines);
    }

    /// What `event` changes in the counters, and the lines it prints.
    fn describe(&self, state: &mut State, event: &Event) -> Vec<Line> {
        let status = &mut state.status;
        let mut lines = Vec::new();
        match event {
            Event::MessageAppended(appended) => {
                let message = &appended.message;
                match message.role {
                    MessageRole::Assistant => {
                        let text = text_of(&message.parts);
                        let streamed = !std::mem::take(&mut state.streamed).is_empty();
                        if message.tool_calls().next().is_some() {
                            state.answer = None;
                            if !streamed {
                                lines.extend(
                                    text.trim_end()
                                        .lines()
                                        .filter(|l| !l.trim().is_empty())
                                        .map(|l| (Style::Text, l.to_owned())),
                                );
                            }
                        } else {
                            state.answer = Some(text);
                            state.answer_streamed = streamed;
                        }
                    }
                    MessageRole::User => {
                        let text = text_of(&message.parts);
                        if let Some(note) = text.strip_prefix("[Nerve] ") {
                            lines.push((Style::Note, format!("· nerve: {}", first_line(note))));
                        }
                    }
                    MessageRole::System | MessageRole::Tool => {}
                }
            }
            // Abandoned by a stop: no turn happened, and the stop was said already.
            Event::ModelCalled(called) if called.outcome == CallOutcome::Cancelled => {}
            Event::ModelCalled(called) => {
                if called.purpose == CallPurpose::Agent {
                    status.turn = status.turn.max(called.turn);
                }
                if called.usage.input_tokens > 0 {
                    status.last_input = called.usage.input_tokens;
                }
                if let CallOutcome::Failed(kind) = called.outcome {
                    lines.push((Style::Error, format!("· model call failed: {kind}")));
                }
            }
            Event::ToolCallStarted(started) => {
                let key = key_argument(&started.call);
                status.tool = Some(key.clone());
                lines.push((Style::Call, format!("→ {key}")));
            }
            Event::ToolCallFinished(finished) => {
                status.tool = None;
                let style = if finished.result.is_error {
                    Style::Error
                } else {
                    Style::Dim
                };
                lines.extend(
                    outcome_lines(&finished.result, 3, 2)
                        .into_iter()
                        .enumerate()
                        .map(|(i, l)| (if i == 0 { style } else { Style::Dim }, l)),
                );
                if let Some(child) = &finished.child {
                    lines.push((
                        Style::Note,
                        nerve_runtime::views::transcript::child_line(child),
                    ));
                }
            }
            Event::TurnCompleted(turn) => {
                status.turn = turn.turn;
                status.usage += turn.usage;
                status.cost += turn.cost;
                if self.mode == Mode::Plain {
                    let text = self.turn_text(turn, status);
                    lines.push((Style::Dim, format!("· {text}")));
                }
            }
            Event::Retry(retry) => lines.push((
                Style::Note,
                format!(
                    "· retry {} after {}: waiting {} ms",
                    retry.attempt,
                    retry.error.as_str(),
                    retry.delay_ms
                ),
            )),
            Event::Compaction(compaction) => {
                status.compactions += 1;
                status.archived_blocks += compaction.archived.len();
                status.last_input = status.last_input.min(compaction.tokens_after);
                lines.push((
                    Style::Note,
                    format!(
                        "· context compacted ({}): {} → {} tokens, {} block(s) archived",
                        snake(&compaction.strategy),
                        thousands(compaction.tokens_before),
                        thousands(compaction.tokens_after),
                        compaction.archived.len()
                    ),
                ));
            }
            Event::Stagnation(stagnation) => lines.push((
                Style::Note,
                match stagnation.action {
                    StagnationAction::Corrected => "· the agent is repeating itself: corrected",
                    StagnationAction::Terminated => {
                        "· the agent is still repeating itself: stopping"
                    }
                }
                .to_owned(),
            )),
            Event::ApprovalRequested(request) => lines.push((
                Style::Note,
                format!(
                    "· approval needed: {} (rule `{}`)",
                    key_argument(&request.call),
                    request.rule
                ),
            )),
            Event::ApprovalDecided(decided) => lines.push((
                Style::Note,
                format!(
                    "· {} by the {}{}",
                    match decided.decision {
                        ApprovalDecision::Approved => "approved",
                        ApprovalDecision::Denied => "denied",
                    },
                    snake(&decided.decided_by),
                    decided
                        .reason
                        .as_deref()
                        .map(|r| format!(": {}", first_line(r)))
                        .unwrap_or_default()
                ),
            )),
            Event::ProxyDecision(decision) if decision.decision == ProxyVerdict::Denied => {
                lines.push((
                    Style::Note,
                    format!(
                        "· proxy denied {} {}{}",
                        decision.method,
                        decision.host,
                        decision
                            .reason
                            .as_deref()
                            .map(|r| format!(": {}", first_line(r)))
                            .unwrap_or_default()
                    ),
                ));
            }
            Event::Resumed(resumed) => lines.push((
                Style::Note,
                format!(
                    "· resumed after turn {} (attempt {})",
                    resumed.from_turn, resumed.attempt
                ),
            )),
            Event::WorkspaceSnapshot(snapshot) if !snapshot.outside.is_empty() => lines.push((
                Style::Note,
                format!(
                    "· the workspace changed outside the execution: {} path(s), told to the model",
                    snapshot.outside.len()
                ),
            )),
            Event::ToolProtocolSwitched(switched) => lines.push((
                Style::Note,
                format!("· tool calls now read from text ({})", switched.reason),
            )),
            Event::HookRan(ran) if ran.verdict != nerve_core::event::HookVerdict::Allow => lines
                .push((
                    Style::Note,
                    format!("· {}", nerve_runtime::views::transcript::hook_line(ran)),
                )),
            Event::HookRan(_) => {}
            Event::InstructionsLoaded(loaded) => {
                for file in &loaded.files {
                    lines.push((
                        Style::Note,
                        format!(
                            "· project instructions: {}",
                            nerve_runtime::views::transcript::instructions_file(file)
                        ),
                    ));
                }
            }
            Event::SkillLoaded(loaded) => lines.push((
                Style::Note,
                format!("· {}", nerve_runtime::views::transcript::skill_line(loaded)),
            )),
            Event::WorkspaceRewound(rewound) => lines.push((
                Style::Note,
                format!(
                    "· workspace rewound to turn {} ({} path(s))",
                    rewound.turn,
                    rewound.changes.len()
                ),
            )),
            Event::Started(_)
            | Event::ContextCreated(_)
            | Event::TaskTransition(_)
            | Event::Finish(_)
            | Event::ProxyDecision(_)
            | Event::Checkpoint(_)
            | Event::WorkspaceSnapshot(_) => {}
        }
        lines
    }

    pub(crate) fn delta(&self, purpose: CallPurpose, delta: &Delta) {
        // Plain lines come whole from the events; only a terminal shows text as it streams.
        if self.mode != Mode::Live || purpose != CallPurpose::Agent {
            return;
        }
        let Delta::Text(text) = delta else {
            return;
        };
        let Ok(mut state) = self.state.lock() else {
            return;
        };
        if text.is_empty() {
            return;
        }
        state.streamed.push_str(text);
        let shown = state.held.push(&self.redactor, text);
        if shown.is_empty() {
            return;
        }
        self.clear_status(&mut state);
        self.write(&shown);
        state.mid_line = !shown.ends_with('\n');
        if !state.mid_line {
            self.draw_status(&mut state);
        }
    }

    fn print(&self, state: &mut State, lines: &[Line]) {
        if lines.is_empty() {
            self.draw_status(state);
            return;
        }
        self.clear_status(state);
        self.print_lines(lines);
        self.draw_status(state);
    }

    fn print_lines(&self, lines: &[Line]) {
        let mut out = String::new();
        for (style, text) in lines {
            let text = self.redactor.redact(text);
            match style.colour().filter(|_| self.colour) {
                Some(code) => out.push_str(&format!("{code}{text}\x1b[0m\n")),
                None => {
                    out.push_str(&text);
                    out.push('\n');
                }
            }
        }
        self.write(&out);
    }

    fn clear_status(&self, state: &mut State) {
        if state.status_shown {
            self.write("\r\x1b[2K");
            state.status_shown = false;
        }
    }

    fn draw_status(&self, state: &mut State) {
        if self.mode != Mode::Live || state.paused || state.mid_line {
            return;
        }
        let mut text = self.status_text(&state.status);
        if let Some(since) = state.since {
            text = format!("{} · {text}", clock(since.elapsed()));
        }
        let width = terminal_width().saturating_sub(1).max(20);
        let text = nerve_core::text::clip(&text, width);
        let shown = if self.colour {
            format!("\r\x1b[2K\x1b[36m{text}\x1b[0m")
        } else {
            format!("\r\x1b[2K{text}")
        };
        self.write(&shown);
        state.status_shown = true;
    }

    fn write(&self, text: &str) {
        output::raw(text);
    }
}

/// `turn 3 · 1,200 in / 40 out tokens{which} · $0.0015`.
fn figures(turn: u32, usage: &TokenUsage, cost: MicroUsd, which: &str) -> String {
    format!(
        "turn {turn} · {} in / {} out tokens{which} · {cost}",
        thousands(usage.input_tokens),
        thousands(usage.output_tokens),
    )
}

/// Moves the live status line's spinner and clock five times a second until aborted (the
/// caller aborts it when the work ends); off a terminal it does nothing.
pub(crate) fn ticker(display: &std::sync::Arc<Display>) -> tokio::task::JoinHandle<()> {
    let display = std::sync::Arc::clone(display);
    tokio::spawn(async move {
        if display.mode() != Mode::Live {
            return;
        }
        let mut every = tokio::time::interval(std::time::Duration::from_millis(200));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // Ends: aborted by the caller when the run or the message is over.
        loop {
            every.tick().await;
            display.tick();
        }
    })
}

/// A spinner frame and the time since the work began, as the status line starts:
/// `⠹ 12s`, `⠼ 2m05s`. The frame moves every tenth of a second.
pub(crate) fn clock(elapsed: std::time::Duration) -> String {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let tenths = elapsed.as_millis() / 100;
    let frame = FRAMES[usize::try_from(tenths % 10).unwrap_or(0)];
    let seconds = elapsed.as_secs();
    if seconds < 60 {
        format!("{frame} {seconds}s")
    } else {
        format!("{frame} {}m{:02}s", seconds / 60, seconds % 60)
    }
}

/// The terminal's width in columns: `COLUMNS`, else 80.
fn terminal_width() -> usize {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|c| *c > 0)
        .unwrap_or(80)
}

/// Where the log is and three commands to try next (the end of `run` and of `chat`).
pub(crate) fn next_steps(
    id: ExecutionId,
    db: &std::path::Path,
    config: Option<&std::path::Path>,
    ended: Option<TerminationReason>,
) -> Vec<Line> {
    let mut flags = if nerve_runtime::log::default_db().is_ok_and(|default| default == db) {
        String::new()
    } else {
        format!("--db {} ", db.display())
    };
    // The settings the execution ran with: resume and approve need them again.
    if let Some(config) = config {
        flags.push_str(&format!("--config {} ", config.display()));
    }
    let mut lines = vec![
        (
            Style::Dim,
            format!("log: execution {id} in {}", db.display()),
        ),
        (Style::Dim, "next:".to_owned()),
    ];
    let mut steps = vec![
        ("show", "the transcript"),
        ("replay", "completeness and gaps"),
    ];
    match ended {
        Some(TerminationReason::Parked) => {
            steps.push(("approve", "decide the call that waits (--deny to refuse)"));
            steps.push(("resume", "then continue it"));
        }
        Some(
            TerminationReason::Shutdown | TerminationReason::TimedOut | TerminationReason::Error,
        ) => {
            steps.push(("resume", "continue it where it stopped"));
        }
        Some(
            TerminationReason::Completed
            | TerminationReason::MaxTurns
            | TerminationReason::BudgetExhausted
            | TerminationReason::Stagnation,
        )
        | None => steps.push(("chat", "talk to the agent about it")),
    }
    let width = steps
        .iter()
        .map(|(command, _)| command.len())
        .max()
        .unwrap_or(0);
    for (command, what) in steps {
        lines.push((
            Style::Dim,
            format!("  nerve {flags}{command:<width$} {id}   {what}"),
        ));
    }
    lines
}

pub(crate) fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.len() <= 120 {
        line.to_owned()
    } else {
        format!("{}...", nerve_core::text::clip(line, 117))
    }
}

/// An enum's snake_case name, as the log spells it.
fn snake(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use nerve_core::event::{MessageAppended, ToolCallFinished, ToolCallStarted, TurnCompleted};
    use nerve_core::{Message, MessagePart, ToolCall, ToolResult};

    use super::*;

    /// The plain lines `events` print, then the answer `finish` returns.
    fn check(events: &[Event], expected: &[&str], answer: Option<&str>) {
        let display = Display::new(Mode::Plain, Some(10_000), Default::default());
        let mut state = State::default();
        let lines: Vec<String> = events
            .iter()
            .flat_map(|e| display.describe(&mut state, e))
            .map(|(_, text)| text)
            .collect();
        assert_eq!(lines, expected);
        assert_eq!(
            state.answer.as_deref().filter(|a| !a.is_empty()),
            answer,
            "the answer"
        );
    }

    fn call() -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: "shell".into(),
            arguments: serde_json::json!({"command": "sh test.sh"}),
        }
    }

    #[test]
    fn a_turn_reads_as_words_call_outcome_and_status() {
        let mut assistant = Message::text(MessageRole::Assistant, "Let me run the test.");
        assistant.parts.push(MessagePart::ToolCall(call()));
        check(
            &[
                Event::MessageAppended(MessageAppended {
                    index: 2,
                    message: assistant,
                }),
                Event::ToolCallStarted(ToolCallStarted {
                    turn: 1,
                    call: call(),
                    repaired: None,
                }),
                Event::ToolCallFinished(ToolCallFinished {
                    turn: 1,
                    result: ToolResult {
                        call_id: "c1".into(),
                        name: "shell".into(),
                        content: "a\nb\nc\nd\ne\nf\nFAIL: expected 2\n[exit code: 1]".into(),
                        is_error: true,
                    },
                    duration_ms: 3,
                    interrupted: false,
                    child: None,
                }),
                Event::TurnCompleted(TurnCompleted {
                    turn: 1,
                    usage: TokenUsage::new(1200, 40),
                    cost: MicroUsd(1500),
                    tool_calls: vec!["shell".into()],
                    finish: nerve_core::FinishReason::ToolCalls,
                    duration_ms: 5,
                }),
                Event::MessageAppended(MessageAppended {
                    index: 4,
                    message: Message::text(MessageRole::Assistant, "All done."),
                }),
            ],
            &[
                "Let me run the test.",
                "→ shell sh test.sh",
                "  exit 1 · 7 lines",
                "  │ a",
                "  │ b",
                "  │ c",
                "  │ … 2 more lines",
                "  │ f",
                "  │ FAIL: expected 2",
                "· turn 1 · 1,200 in / 40 out tokens · $0.001500 · context 0%",
            ],
            Some("All done."),
        );
    }

    /// Each turn's line gives that turn's tokens and cost, as the HTML page's timeline does;
    /// the status line says its figures are the totals.
    #[test]
    fn a_turns_line_gives_its_own_tokens_and_the_status_line_the_totals() {
        let turn = |n: u32, input: u64, cost: u64| {
            Event::TurnCompleted(TurnCompleted {
                turn: n,
                usage: TokenUsage::new(input, 10),
                cost: MicroUsd(cost),
                tool_calls: vec![],
                finish: nerve_core::FinishReason::Stop,
                duration_ms: 1,
            })
        };
        check(
            &[turn(1, 1000, 100), turn(2, 1500, 200)],
            &[
                "· turn 1 · 1,000 in / 10 out tokens · $0.000100 · context 0%",
                "· turn 2 · 1,500 in / 10 out tokens · $0.000200 · context 0%",
            ],
            None,
        );
        let display = Display::new(Mode::Plain, None, Default::default());
        let mut state = State::default();
        for event in [turn(1, 1000, 100), turn(2, 1500, 200)] {
            display.describe(&mut state, &event);
        }
        assert_eq!(
            display.status_text(&state.status),
            "turn 2 · 2,500 in / 20 out tokens in all · $0.000300"
        );
    }

    #[test]
    fn the_clock_spins_and_counts() {
        use std::time::Duration;
        assert_eq!(clock(Duration::ZERO), "⠋ 0s");
        assert_eq!(clock(Duration::from_millis(1250)), "⠹ 1s");
        assert_eq!(clock(Duration::from_millis(12_900)), "⠏ 12s");
        assert_eq!(clock(Duration::from_secs(125)), "⠋ 2m05s");
    }

    #[test]
    fn numbers_read_with_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
