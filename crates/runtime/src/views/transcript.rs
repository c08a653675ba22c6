//! The transcript view of an execution (`nerve show ID`), as a person reads it: the task, what the agent said and did turn by
//! turn (each tool call one line with its key argument, then its clipped outcome), the final
//! answer whole, the error of a failed run, then the totals. Built from the events, not the
//! replayed conversation, so compactions do not hide what happened before them.

use crate::log::{Replay, StoredEvent};
use nerve_core::event::CallOutcome;
use nerve_core::{Event, MessagePart, MessageRole, ToolCall, ToolResult};

/// The widest a tool call's argument or outcome line grows before it is clipped.
const WIDTH: usize = 100;

/// The transcript of one execution, as lines of plain text.
pub fn transcript(events: &[StoredEvent], replayed: &Replay) -> Vec<String> {
    let mut out = Vec::new();
    out.push(format!("execution  {}", replayed.execution_id));
    if let Some(first) = events.first() {
        out.push(format!("started    {}", first.ts));
    }
    if let Some(started) = &replayed.started {
        out.push(format!(
            "model      {} ({})",
            started.model,
            snake(&started.loop_type)
        ));
        out.push(format!("workspace  {}", started.workspace));
        if let Some(parent) = &started.parent {
            let call = started
                .call_id
                .as_ref()
                .map_or_else(String::new, |id| format!(" (its call {id})"));
            out.push(format!("parent     {parent}{call}"));
        }
        if let Some(fork) = &started.fork {
            out.push(format!(
                "forked     from {} at turn {} (its event {})",
                fork.parent, fork.turn, fork.seq
            ));
        }
        // The degraded sandbox is said, never only logged.
        if let Ok(crate::ExecutorUse::PerCall { reason }) =
            serde_json::from_value(started.config["sandbox_executor"].clone())
        {
            out.push(format!(
                "sandbox    per-call docker exec (the fallback was allowed), no executor: {reason}"
            ));
        }
        out.push(String::new());
        out.push("task".to_owned());
        out.extend(started.task.lines().map(|line| format!("  {line}")));
    }
    // Started and not finished yet, in the order they started.
    let mut pending: Vec<ToolCall> = Vec::new();
    let mut turn = 0;
    // The index of the last message shown: a resume re-appends the system prompt, and a
    // compaction starts the indices over.
    let mut shown: Option<u32> = None;
    let mut answer: Option<String> = None;
    let mut heading: Option<String> = None;
    for stored in events {
        let Ok(event) = serde_json::from_str::<Event>(&stored.payload) else {
            continue;
        };
        let mut lines = Vec::new();
        match event {
            Event::ModelCalled(called) => {
                if called.turn != turn {
                    turn = called.turn;
                    // Shown with the turn's first line, so a turn that only answered
                    // leaves no empty heading.
                    heading = Some(format!("turn {turn}"));
                }
                match called.outcome {
                    CallOutcome::Ok => {}
                    CallOutcome::Cancelled => {
                        lines.push("  (model call abandoned: the execution was stopped)".to_owned())
                    }
                    CallOutcome::Failed(kind) => {
                        lines.push(format!("  (model call failed: {kind})"));
                    }
                }
            }
            Event::MessageAppended(appended) => {
                if shown.is_some_and(|index| appended.index <= index) {
                    continue;
                }
                shown = Some(appended.index);
                let message = appended.message;
                let text = text_of(&message.parts);
                match message.role {
                    MessageRole::Assistant => {
                        let calls = message
                            .parts
                            .iter()
                            .any(|part| matches!(part, MessagePart::ToolCall(_)));
                        if calls {
                            lines.extend(text.lines().map(|line| format!("  {line}")));
                            answer = None;
                        } else {
                            // Shown at the end, whole, unless the agent goes on.
                            answer = Some(text);
                        }
                    }
                    // The task is shown above; later user messages are the engine's notes
                    // or a person's follow-ups (`nerve chat`, `run --continue`).
                    MessageRole::User if appended.index > 1 && !text.is_empty() => {
                        match text.strip_prefix("[Nerve] ") {
                            Some(note) => lines.push(format!("  note: {}", clip_line(note))),
                            None => {
                                // The answer to the previous message, before the next one.
                                if let Some(previous) = answer.take() {
                                    lines.extend(previous.lines().map(|line| format!("  {line}")));
                                }
                                lines.push(String::new());
                                lines.push("you".to_owned());
                                lines.extend(text.lines().map(|line| format!("  {line}")));
                            }
                        }
                    }
                    MessageRole::User | MessageRole::System | MessageRole::Tool => {}
                }
            }
            Event::ToolCallStarted(started) => {
                pending.push(started.call);
            }
            Event::ToolCallFinished(finished) => {
                let call = pending
                    .iter()
                    .position(|call| call.id == finished.result.call_id)
                    .map(|at| pending.remove(at));
                lines.push(call_line(call.as_ref(), &finished.result.name));
                lines.push(outcome_line(&finished.result));
                if let Some(child) = &finished.child {
                    lines.push(child_line(child));
                }
            }
            Event::Compaction(compaction) => {
                shown = None;
                let strategy = snake(&compaction.strategy);
                lines.push(format!(
                    "  (context compacted: {strategy}, messages {}..{}, {} block(s) archived)",
                    compaction.from_index,
                    compaction.to_index,
                    compaction.archived.len()
                ));
            }
            Event::Retry(retry) => lines.push(format!(
                "  (model call retried, attempt {}: {})",
                retry.attempt,
                clip_line(retry.error.as_str())
            )),
            Event::ApprovalRequested(asked) => lines.push(format!(
                "  (approval asked for {} by rule `{}`)",
                key_argument(&asked.call),
                asked.rule
            )),
            Event::ApprovalDecided(decided) => {
                lines.push(format!("  (approval {})", snake(&decided.decision)));
            }
            Event::Resumed(_) => lines.push("  (resumed)".to_owned()),
            Event::WorkspaceSnapshot(snapshot) if !snapshot.outside.is_empty() => {
                lines.push(format!(
                    "  (the workspace changed outside the execution: {} path(s))",
                    snapshot.outside.len()
                ));
            }
            Event::ToolProtocolSwitched(switched) => lines.push(format!(
                "  (tool calls now read from text: {})",
                switched.reason
            )),
            Event::HookRan(ran) => lines.push(format!("  ({})", hook_line(&ran))),
            Event::InstructionsLoaded(loaded) => {
                for file in &loaded.files {
                    lines.push(format!(
                        "  (project instructions: {})",
                        instructions_file(file)
                    ));
                }
            }
            Event::SkillLoaded(loaded) => lines.push(format!("  ({})", skill_line(&loaded))),
            Event::WorkspaceRewound(rewound) => lines.push(format!(
                "  (workspace rewound to turn {}: {} path(s))",
                rewound.turn,
                rewound.changes.len()
            )),
            Event::Started(_)
            | Event::ContextCreated(_)
            | Event::TurnCompleted(_)
            | Event::TaskTransition(_)
            | Event::Finish(_)
            | Event::Stagnation(_)
            | Event::ProxyDecision(_)
            | Event::Checkpoint(_)
            | Event::WorkspaceSnapshot(_) => {}
        }
        if !lines.is_empty() {
            if let Some(heading) = heading.take() {
                out.push(String::new());
                out.push(heading);
            }
            out.append(&mut lines);
        }
    }
    for call in &pending {
        out.push(call_line(Some(call), &call.name));
        out.push("    (never finished: its effect is unknown)".to_owned());
    }
    if let Some(answer) = answer.filter(|a| !a.trim().is_empty()) {
        out.push(String::new());
        out.push("answer".to_owned());
        out.extend(answer.lines().map(|line| format!("  {line}")));
    }
    if let Some(error) = &replayed.error {
        out.push(String::new());
        out.push(format!("error      {error}"));
    }
    out.push(String::new());
    out.push(format!(
        "ended      {}",
        replayed.termination_reason.map_or_else(
            || "never (crashed or still running)".to_owned(),
            |r| r.to_string()
        )
    ));
    if let Some(took) = took(events) {
        out.push(format!("took       {took}"));
    }
    if let Some(status) = replayed.task_status {
        out.push(format!("task       {status}"));
    }
    out.push(format!(
        "totals     {} turns, {} input + {} output tokens, {}, {} compaction(s)",
        replayed.total_turns,
        thousands(replayed.usage.input_tokens),
        thousands(replayed.usage.output_tokens),
        replayed.cost,
        replayed.compactions.len()
    ));
    out
}

/// From the first event to the last, as `4.2 s`, `3 min 05 s` or `2 h 03 min`; `None` when
/// a time cannot be read.
fn took(events: &[StoredEvent]) -> Option<String> {
    let at = |event: &StoredEvent| {
        time::OffsetDateTime::parse(&event.ts, &time::format_description::well_known::Rfc3339).ok()
    };
    let span = at(events.last()?)? - at(events.first()?)?;
    let millis = span.whole_milliseconds().max(0);
    let seconds = millis / 1000;
    Some(if seconds < 60 {
        format!("{}.{} s", seconds, (millis % 1000) / 100)
    } else if seconds < 3600 {
        format!("{} min {:02} s", seconds / 60, seconds % 60)
    } else {
        format!("{} h {:02} min", seconds / 3600, (seconds % 3600) / 60)
    })
}

/// `1234567` as `1,234,567`: every count a person reads.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An enum's snake_case name, as the log and `--json` spell it.
fn snake(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

pub fn text_of(parts: &[MessagePart]) -> String {
    parts
        .iter()
        .filter_map(|part| match part {
            MessagePart::Text { text } => Some(text.as_str()),
            MessagePart::ToolCall(_)
            | MessagePart::ToolResult(_)
            | MessagePart::Thinking { .. }
            | MessagePart::CompactionSummary { .. } => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn call_line(call: Option<&ToolCall>, name: &str) -> String {
    match call {
        Some(call) => format!("  → {}", key_argument(call)),
        None => format!("  → {name}"),
    }
}

/// A child execution in a line, under the `delegate` call that started it (the tree of
/// `show`): its name, id, ending, turns and spend.
pub fn child_line(child: &nerve_core::event::ChildEnding) -> String {
    format!(
        "    └─ child {} `{}`: {} after {} turn(s), {} tokens, ${:.4}",
        child.execution_id,
        child.name,
        child.termination_reason.as_str(),
        child.turns,
        child.usage.total(),
        child.cost.as_usd()
    )
}

/// A skill the model loaded, in a line: its name, where it came from, the file when one
/// was read, and the size and start of the hash of what the model got.
pub fn skill_line(loaded: &nerve_core::event::SkillLoaded) -> String {
    let source = source_name(loaded.source);
    let what = loaded
        .file
        .as_ref()
        .map_or_else(String::new, |file| format!(", file {file}"));
    format!(
        "skill loaded: {} ({source}{what}, {})",
        loaded.name,
        given(loaded.bytes, loaded.truncated, &loaded.sha256)
    )
}

/// What the model was given, in brief: its size, whether it was cut, its hash's start.
fn given(bytes: u64, truncated: bool, sha256: &str) -> String {
    let cut = if truncated { ", cut at the bound" } else { "" };
    format!(
        "{bytes} bytes{cut}, sha256 {}",
        sha256.get(..12).unwrap_or(sha256)
    )
}

fn source_name(source: nerve_core::event::InstructionsSource) -> &'static str {
    match source {
        nerve_core::event::InstructionsSource::User => "user",
        nerve_core::event::InstructionsSource::Workspace => "workspace",
    }
}

/// One file of project instructions in a line: its path, size and the start of its hash
/// (the whole hash is in the log's `instructions_loaded`).
pub fn instructions_file(file: &nerve_core::event::InstructionsFile) -> String {
    let source = source_name(file.source);
    format!(
        "{} ({source}, {})",
        file.path,
        given(file.bytes, file.truncated, &file.sha256)
    )
}

/// A hook's run in a line: where, what, and how it ended.
pub fn hook_line(ran: &nerve_core::event::HookRan) -> String {
    let ending = match (ran.exit_code, ran.timed_out) {
        (_, true) => "killed at its timeout".to_owned(),
        (Some(code), false) => format!("exit {code}"),
        (None, false) => "did not run".to_owned(),
    };
    let verdict = match ran.verdict {
        nerve_core::event::HookVerdict::Allow => "",
        nerve_core::event::HookVerdict::Block => ", blocked",
        nerve_core::event::HookVerdict::Warn => ", warning",
    };
    let stderr = ran.stderr.lines().next().unwrap_or_default();
    let stderr = if stderr.is_empty() {
        String::new()
    } else {
        format!(": {stderr}")
    };
    clip_line(&format!(
        "hook {} {}: {ending}{verdict}{stderr}",
        ran.point.as_str(),
        ran.command.join(" ")
    ))
}

/// A tool call as one line: its name and the argument that says what it does.
pub fn key_argument(call: &ToolCall) -> String {
    let arg = |key: &str| call.arguments.get(key).and_then(|v| v.as_str());
    let key = match call.name.as_str() {
        "shell" => arg("command").map(str::to_owned),
        "read_file" | "write_file" | "edit_file" | "list_dir" => {
            Some(arg("path").unwrap_or(".").to_owned())
        }
        "grep" => arg("pattern").map(|p| match arg("path") {
            Some(path) => format!("{p} in {path}"),
            None => p.to_owned(),
        }),
        "http_request" => arg("url").map(|url| format!("{} {url}", arg("method").unwrap_or("GET"))),
        "recall" => arg("query").or_else(|| arg("block_id")).map(str::to_owned),
        _ => None,
    };
    let key = key.unwrap_or_else(|| call.arguments.to_string());
    clip_line(&format!("{} {key}", call.name))
}

/// A tool's outcome in a line: the exit code or the error, and the line that says most (the
/// first of stderr, or the last of the output, when the call failed; else the first line), with how much more
/// there was.
fn outcome_line(result: &ToolResult) -> String {
    let mut lines: Vec<&str> = result.content.trim().lines().collect();
    let exit = take_exit_code(&mut lines);
    let stderr_at = lines.iter().position(|line| *line == "[stderr]");
    let body: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|line| *line != "[stderr]")
        .collect();
    let headline = match stderr_at {
        Some(at) if result.is_error => lines.get(at + 1).copied(),
        // A failed command without stderr (a test runner) says what went wrong last.
        None if result.is_error => body.last().copied(),
        _ => body.first().copied(),
    }
    .unwrap_or_default();
    let more = match body.len().saturating_sub(1) {
        0 => String::new(),
        n => format!(" (+{n} lines)"),
    };
    let status = match (&exit, result.is_error) {
        (Some(code), _) => format!("exit {code}: "),
        (None, true) => "error: ".to_owned(),
        (None, false) => String::new(),
    };
    if body.is_empty() {
        format!("    {status}(no output)")
    } else {
        format!("    {status}{}{more}", clip_line(headline))
    }
}

/// A tool's outcome in a few lines, for the live transcript: the exit code (or `error`,
/// `ok`) and how many lines there were, then the first `head` and last `tail` of them.
/// A one-line outcome without an exit code stays on one line.
pub fn outcome_lines(result: &ToolResult, head: usize, tail: usize) -> Vec<String> {
    let mut lines: Vec<&str> = result.content.trim_end().lines().collect();
    let exit = take_exit_code(&mut lines);
    let body: Vec<&str> = lines
        .into_iter()
        .filter(|line| *line != "[stderr]")
        .collect();
    let status = match (&exit, result.is_error) {
        (Some(code), _) => format!("exit {code}"),
        (None, true) => "error".to_owned(),
        (None, false) => "ok".to_owned(),
    };
    match body.as_slice() {
        [] => vec![format!("  {status} · no output")],
        [only] if exit.is_none() => vec![format!("  {status}: {}", clip_line(only))],
        _ => {
            let count = body.len();
            let mut out = vec![format!(
                "  {status} · {count} line{}",
                if count == 1 { "" } else { "s" }
            )];
            let shown = |line: &str| format!("  │ {}", clip_line(line));
            if count <= head + tail + 1 {
                out.extend(body.iter().map(|line| shown(line)));
            } else {
                out.extend(body[..head].iter().map(|line| shown(line)));
                out.push(format!("  │ … {} more lines", count - head - tail));
                out.extend(body[count - tail..].iter().map(|line| shown(line)));
            }
            out
        }
    }
}

/// The exit code a tool's output ends with (`[exit code: N]`), taken off its lines.
fn take_exit_code(lines: &mut Vec<&str>) -> Option<String> {
    let exit = lines
        .last()
        .and_then(|line| line.strip_prefix("[exit code: "))
        .and_then(|rest| rest.strip_suffix(']'))
        .map(str::to_owned);
    if exit.is_some() {
        lines.pop();
    }
    exit
}

/// `text`'s first line, cut at [`WIDTH`] bytes (on a character boundary) with `...`.
fn clip_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.len() <= WIDTH {
        return line.to_owned();
    }
    let cut = nerve_core::text::clip(line, WIDTH - 3);
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use nerve_core::ToolResult;

    use super::{outcome_line, outcome_lines};

    fn check(content: &str, is_error: bool, expected: &str) {
        let result = ToolResult {
            call_id: "call_1".into(),
            name: "shell".into(),
            content: content.into(),
            is_error,
        };
        assert_eq!(outcome_line(&result), expected, "{content:?}");
    }

    #[test]
    fn an_outcome_is_the_line_that_says_most() {
        check("hello.txt (6 bytes)", false, "    hello.txt (6 bytes)");
        check("a\nb\nc", false, "    a (+2 lines)");
        check("", false, "    (no output)");
        check("ok\n[exit code: 0]", false, "    exit 0: ok");
        check(
            "total 8\nfile\n[stderr]\nsh: make: not found\n[exit code: 127]",
            true,
            "    exit 127: sh: make: not found (+2 lines)",
        );
        check(
            "running\nFAIL: expected 2\n[exit code: 1]",
            true,
            "    exit 1: FAIL: expected 2 (+1 lines)",
        );
        check(
            "no such file: a.txt",
            true,
            "    error: no such file: a.txt",
        );
        let long = "x".repeat(300);
        check(&long, false, &format!("    {}...", "x".repeat(97)));
    }

    fn check_lines(content: &str, is_error: bool, expected: &[&str]) {
        let result = ToolResult {
            call_id: "call_1".into(),
            name: "shell".into(),
            content: content.into(),
            is_error,
        };
        assert_eq!(outcome_lines(&result, 2, 1), expected, "{content:?}");
    }

    #[test]
    fn a_live_outcome_shows_head_and_tail() {
        check_lines("", false, &["  ok · no output"]);
        check_lines("[exit code: 0]", false, &["  exit 0 · no output"]);
        check_lines(
            "no such file: a.txt",
            true,
            &["  error: no such file: a.txt"],
        );
        check_lines(
            "ok\n[exit code: 0]",
            false,
            &["  exit 0 · 1 line", "  │ ok"],
        );
        check_lines(
            "1\n2\n3\n4\n[stderr]\nboom\n[exit code: 2]",
            true,
            &[
                "  exit 2 · 5 lines",
                "  │ 1",
                "  │ 2",
                "  │ … 2 more lines",
                "  │ boom",
            ],
        );
        check_lines(
            "1\n2\n3\n4",
            false,
            &["  ok · 4 lines", "  │ 1", "  │ 2", "  │ 3", "  │ 4"],
        );
    }
}
