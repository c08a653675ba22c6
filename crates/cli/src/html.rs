//! `nerve show ID --html FILE`: one self-contained page for people who would rather look
//! than read. The events are inlined as JSON; turns with what the agent said, model calls,
//! tool calls (expandable to their whole arguments and results), tokens and cost per turn,
//! the context fill over time with compactions marked, the answer and the diff of what the
//! execution changed in the workspace are rendered here, so the page needs no script, no network
//! and no external asset.

use std::fmt::Write as _;

use nerve_core::{Event, MessagePart, MessageRole, ToolCall, ToolResult};
use nerve_runtime::log::{Replay, StoredEvent};

/// One turn as the page shows it.
#[derive(Default)]
struct Turn {
    number: u32,
    /// What the agent said in the turn (its messages' text).
    said: Vec<String>,
    /// `purpose: outcome (input/output tokens)` per model call.
    model_calls: Vec<String>,
    tools: Vec<(ToolCall, Option<ToolResult>)>,
    /// Compactions, retries, approvals, proxy decisions: one line each.
    notes: Vec<(&'static str, String)>,
    input_tokens: u64,
    output_tokens: u64,
    cost: Option<String>,
}

/// The page for one execution; `diff` is what it changed in the workspace (`nerve diff`),
/// or why that cannot be shown.
pub(crate) fn page(
    events: &[StoredEvent],
    replayed: &Replay,
    diff: Result<String, String>,
) -> String {
    let mut window = None;
    let mut turns: Vec<Turn> = Vec::new();
    /// The section of turn `number`, in turn order: an event may name an earlier turn
    /// than the one in progress (a compaction made before the next request is recorded
    /// with the turn it followed).
    fn current(turns: &mut Vec<Turn>, number: u32) -> &mut Turn {
        let at = match turns.binary_search_by_key(&number, |t| t.number) {
            Ok(at) => at,
            Err(at) => {
                turns.insert(
                    at,
                    Turn {
                        number,
                        ..Turn::default()
                    },
                );
                at
            }
        };
        &mut turns[at]
    }
    let mut last_turn = 0;
    for stored in events {
        let Ok(event) = serde_json::from_str::<Event>(&stored.payload) else {
            continue;
        };
        match event {
            Event::ContextCreated(created) => window = window.or(created.context_window),
            Event::ModelCalled(called) => {
                last_turn = called.turn;
                current(&mut turns, called.turn).model_calls.push(format!(
                    "{}: {} ({} in / {} out)",
                    snake(&called.purpose),
                    called.outcome,
                    called.usage.input_tokens,
                    called.usage.output_tokens
                ));
            }
            Event::ToolCallStarted(started) => {
                last_turn = started.turn;
                current(&mut turns, started.turn)
                    .tools
                    .push((started.call, None));
            }
            Event::ToolCallFinished(finished) => {
                let turn = current(&mut turns, finished.turn);
                // A `delegate` call's child, under the parent's turn (the tree).
                if let Some(child) = &finished.child {
                    turn.notes.push((
                        "child",
                        nerve_runtime::views::transcript::child_line(child)
                            .trim_start()
                            .to_owned(),
                    ));
                }
                if let Some(slot) = turn
                    .tools
                    .iter_mut()
                    .find(|(call, result)| call.id == finished.result.call_id && result.is_none())
                {
                    slot.1 = Some(finished.result);
                }
            }
            Event::TurnCompleted(done) => {
                let turn = current(&mut turns, done.turn);
                turn.input_tokens = done.usage.input_tokens;
                turn.output_tokens = done.usage.output_tokens;
                turn.cost = Some(done.cost.to_string());
            }
            Event::Compaction(compaction) => {
                current(&mut turns, compaction.turn.max(1)).notes.push((
                    "compaction",
                    format!(
                        "context compacted ({}, {}): messages {}..{}, {} block(s) archived",
                        snake(&compaction.strategy),
                        snake(&compaction.trigger),
                        compaction.from_index,
                        compaction.to_index,
                        compaction.archived.len()
                    ),
                ))
            }
            Event::Retry(retry) => current(&mut turns, retry.turn).notes.push((
                "retry",
                format!(
                    "retry {} after {} ms: {}",
                    retry.attempt, retry.delay_ms, retry.error
                ),
            )),
            Event::ApprovalRequested(asked) => current(&mut turns, asked.turn).notes.push((
                "approval",
                format!(
                    "approval asked for {} (rule `{}`)",
                    asked.call.name, asked.rule
                ),
            )),
            Event::ApprovalDecided(decided) => current(&mut turns, decided.turn).notes.push((
                "approval",
                format!(
                    "approval {} by {}",
                    snake(&decided.decision),
                    snake(&decided.decided_by)
                ),
            )),
            Event::ProxyDecision(proxy) => current(&mut turns, last_turn.max(1)).notes.push((
                "proxy",
                format!(
                    "proxy {} {} {}{}",
                    snake(&proxy.decision),
                    proxy.method,
                    proxy.host,
                    proxy.path
                ),
            )),
            Event::MessageAppended(appended) => {
                // The agent's words come with the model call of their turn, which is logged
                // first.
                if appended.message.role == MessageRole::Assistant {
                    let text = nerve_runtime::views::transcript::text_of(&appended.message.parts);
                    if !text.trim().is_empty() {
                        current(&mut turns, last_turn.max(1)).said.push(text);
                    }
                }
            }
            Event::Started(_)
            | Event::TaskTransition(_)
            | Event::Finish(_)
            | Event::Stagnation(_)
            | Event::Checkpoint(_)
            | Event::Resumed(_)
            | Event::WorkspaceSnapshot(_)
            | Event::WorkspaceRewound(_)
            | Event::ToolProtocolSwitched(_)
            | Event::InstructionsLoaded(_)
            | Event::HookRan(_)
            | Event::SkillLoaded(_) => {}
        }
    }

    let mut html = String::new();
    let title = format!("nerve execution {}", replayed.execution_id);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(&title)
    );
    let _ = write!(html, "<h1>{}</h1>", escape(&title));
    if let Some(started) = &replayed.started {
        let _ = write!(
            html,
            "<p class=\"meta\">{} · {} loop</p><pre class=\"task\">{}</pre>",
            escape(&started.model),
            snake(&started.loop_type),
            escape(&started.task)
        );
    }
    let _ = write!(
        html,
        "<p class=\"totals\">ended <b>{}</b> · {} turns · {} in / {} out tokens · {} · {} compaction(s)</p>",
        replayed
            .termination_reason
            .map_or_else(|| "never".to_owned(), |r| r.to_string()),
        replayed.total_turns,
        replayed.usage.input_tokens,
        replayed.usage.output_tokens,
        replayed.cost,
        replayed.compactions.len()
    );
    if let Some(error) = &replayed.error {
        let _ = write!(html, "<p class=\"error\">{}</p>", escape(error));
    }
    html.push_str(&fill_chart(&turns, window));
    html.push_str("<h2>Timeline</h2>");
    for turn in &turns {
        let _ = write!(
            html,
            "<details class=\"turn\" data-turn=\"{n}\" open><summary>Turn {n} <span class=\"cost\">{} in / {} out · {}</span></summary>",
            turn.input_tokens,
            turn.output_tokens,
            turn.cost.as_deref().unwrap_or("not recorded"),
            n = turn.number
        );
        for text in &turn.said {
            let _ = write!(html, "<div class=\"said\">{}</div>", escape(text));
        }
        for call in &turn.model_calls {
            let _ = write!(
                html,
                "<div class=\"model-call\">model {}</div>",
                escape(call)
            );
        }
        for (call, result) in &turn.tools {
            let (class, outcome) = match result {
                Some(r) if r.is_error => ("tool-call failed", "failed"),
                Some(_) => ("tool-call", "ok"),
                None => ("tool-call unknown", "never finished"),
            };
            let _ = write!(
                html,
                "<details class=\"{class}\"><summary><code>{}</code> <span class=\"outcome\">{outcome}</span></summary><h4>arguments</h4><pre>{}</pre><h4>result</h4><pre>{}</pre></details>",
                escape(&nerve_runtime::views::transcript::key_argument(call)),
                escape(&serde_json::to_string_pretty(&call.arguments).unwrap_or_default()),
                escape(
                    result
                        .as_ref()
                        .map_or("(no result recorded)", |r| r.content.as_str())
                )
            );
        }
        for (kind, note) in &turn.notes {
            let _ = write!(html, "<div class=\"note {kind}\">{}</div>", escape(note));
        }
        html.push_str("</details>");
    }
    let answer = replayed.messages.iter().rev().find_map(|message| {
        let calls = message
            .parts
            .iter()
            .any(|part| matches!(part, MessagePart::ToolCall(_)));
        (message.role == MessageRole::Assistant && !calls)
            .then(|| nerve_runtime::views::transcript::text_of(&message.parts))
    });
    if let Some(answer) = answer.filter(|a| !a.trim().is_empty()) {
        let _ = write!(
            html,
            "<h2>Answer</h2><pre class=\"answer\">{}</pre>",
            escape(&answer)
        );
    }
    match diff {
        Ok(diff) => {
            let _ = write!(
                html,
                "<h2>Changes to the workspace</h2><pre class=\"diff\">{}</pre>",
                diff_lines(&diff)
            );
        }
        Err(why) => {
            let _ = write!(
                html,
                "<h2>Changes to the workspace</h2><p class=\"diff-missing\">{}</p>",
                escape(&why)
            );
        }
    }
    // The whole log, for whoever wants more than the page shows.
    let log: Vec<serde_json::Value> = events
        .iter()
        .map(|e| {
            serde_json::json!({
                "seq": e.seq, "ts": e.ts, "kind": e.kind,
                "payload": serde_json::from_str::<serde_json::Value>(&e.payload).unwrap_or(serde_json::Value::Null),
            })
        })
        .collect();
    // `<` as a JSON escape, so no text in the log can end the script element.
    let inlined = serde_json::Value::Array(log)
        .to_string()
        .replace('<', "\\u003c");
    let _ = writeln!(
        html,
        "<script type=\"application/json\" id=\"events\">{inlined}</script></body></html>"
    );
    html
}

/// The context fill per turn (input tokens over the window) as an inline SVG, with the
/// turns that compacted marked.
fn fill_chart(turns: &[Turn], window: Option<u64>) -> String {
    let Some(window) = window.filter(|w| *w > 0) else {
        return "<p class=\"fill\">context window unknown: no fill chart</p>".to_owned();
    };
    let (width, height) = (600.0_f64, 120.0_f64);
    let step = width / (turns.len().max(2) - 1) as f64;
    let mut points = String::new();
    let mut marks = String::new();
    for (i, turn) in turns.iter().enumerate() {
        let fill = (turn.input_tokens as f64 / window as f64).min(1.0);
        let (x, y) = (i as f64 * step, height - fill * height);
        let _ = write!(points, "{x:.1},{y:.1} ");
        if turn.notes.iter().any(|(kind, _)| *kind == "compaction") {
            let _ = write!(
                marks,
                "<line class=\"compaction-mark\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"0\" y2=\"{height}\"><title>compaction in turn {}</title></line>",
                turn.number
            );
        }
    }
    let peak = turns.iter().map(|t| t.input_tokens).max().unwrap_or(0);
    format!(
        "<h2>Context fill</h2><svg class=\"fill\" viewBox=\"-5 -5 {} {}\" width=\"{}\" height=\"{}\" role=\"img\"><title>input tokens per turn over a {window}-token window</title><rect class=\"frame\" x=\"0\" y=\"0\" width=\"{width}\" height=\"{height}\"/>{marks}<polyline points=\"{points}\"/></svg><p class=\"fill\">per turn, input tokens over the {window}-token window (top = full); peak {peak} ({}%); dashed lines: compactions</p>",
        width + 10.0,
        height + 10.0,
        width + 10.0,
        height + 10.0,
        peak * 100 / window
    )
}

fn snake(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// A unified diff, each added and removed line marked for its colour.
fn diff_lines(diff: &str) -> String {
    let mut out = String::with_capacity(diff.len() + diff.len() / 4);
    for line in diff.lines() {
        let class = if line.starts_with("+++") || line.starts_with("---") {
            "file"
        } else if line.starts_with('+') {
            "add"
        } else if line.starts_with('-') {
            "del"
        } else if line.starts_with("@@") {
            "hunk"
        } else {
            ""
        };
        if class.is_empty() {
            out.push_str(&escape(line));
        } else {
            let _ = write!(out, "<span class=\"{class}\">{}</span>", escape(line));
        }
        out.push('\n');
    }
    out
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}\
pre{background:#f6f6f6;padding:.5em;overflow-x:auto;white-space:pre-wrap}\
.turn{border-left:3px solid #48c;margin:.5em 0;padding-left:.7em}\
.turn>summary{font-weight:bold;cursor:pointer}.cost{font-weight:normal;color:#666}\
.model-call{color:#555}.tool-call{margin:.2em 0 .2em 1em}.tool-call summary{cursor:pointer}\
.failed .outcome,.error{color:#b00}.unknown .outcome{color:#b70}\
.note{margin-left:1em;font-style:italic;color:#555}.compaction{color:#729}\
.said{white-space:pre-wrap;margin:.3em 0}.diff .add{color:#070}.diff .del{color:#b00}.diff .hunk{color:#729}.diff .file{font-weight:bold}\
svg.fill .frame{fill:#fafafa;stroke:#ccc}p.fill{color:#666;font-size:12px}svg.fill polyline{fill:none;stroke:#48c;stroke-width:2}.compaction-mark{stroke:#729;stroke-dasharray:4}";
