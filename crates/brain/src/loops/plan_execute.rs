//! The plan loops. `plan_execute` plans once through `submit_plan`, runs each step as a
//! ReAct sub-loop and replans when a step fails; `hybrid` also bounds each step's turns and
//! takes a checkpoint summary after every step, which may revise the remaining plan.
//! The protocol a model (or a cassette) follows is documented in `docs/loops.md`.

use nerve_core::event::CallPurpose;
use nerve_core::{
    Message, MessagePart, MessageRole, TerminationReason, ToolCall, ToolCallId, ToolResult,
};

use crate::loops::react::{self, TurnEnd};
use crate::run::builtin_tools::{BuiltinTool, SubmitPlanArgs};
use crate::run::execution::Run;
use crate::run::tool_calls;
use crate::stop::Stop;

/// The prefix of a final step answer that reports failure.
pub(crate) const STEP_FAILED: &str = "STEP FAILED";

/// How a plan loop behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanMode {
    pub(crate) max_steps: usize,
    /// Turns per step; `None` for plan-execute (only `max_turns` bounds a step).
    pub(crate) step_turns: Option<u32>,
    /// A summary call after each step that may revise the remaining plan (hybrid).
    pub(crate) checkpoints: bool,
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StepEnd {
    Done,
    Failed(String),
}

impl StepEnd {
    /// How a step's final answer ends it.
    fn from_answer(text: &str) -> Self {
        match text.trim_start().strip_prefix(STEP_FAILED) {
            Some(reason) => Self::Failed(reason.trim_start_matches([':', ' ']).trim().to_owned()),
            None => Self::Done,
        }
    }
}

/// Which planning call is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planning {
    /// The plan, before the first step.
    First,
    /// The rest of the plan, after a step failed.
    Replan,
    /// A checkpoint summary after a step, which may revise the remaining steps (hybrid).
    Checkpoint,
}

impl Planning {
    /// What the loop answers each `submit_plan` call of this planning call.
    fn accepted(self) -> &'static str {
        match self {
            Self::First | Self::Replan => "Plan accepted",
            Self::Checkpoint => "Remaining plan replaced",
        }
    }
}

/// Where the plan loop is: the next thing it does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum At {
    /// The planning instruction is in the conversation; the planning call is to be made.
    Planning(Planning),
    /// The next step (or the end, when none is left) is to be started.
    StepStart,
    /// Inside the current step, after `turns` of its turns.
    InStep { turns: u32 },
    /// The current step ended after `turns` turns; its outcome is to be acted on.
    Ended { end: StepEnd, turns: u32 },
}

/// What the plan loop knows beyond the conversation: the steps, where it is in them and
/// how many replans it used. The live loop and [`rebuild`] change it through the same
/// methods, so a resumed loop stands exactly where the interrupted one stood.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PlanState {
    steps: Vec<String>,
    /// The current step (0-based).
    index: usize,
    replans: u32,
    /// Steps started so far (1-based once one started), for events scoped to a step.
    step_number: u32,
}

impl PlanState {
    /// The first planning instruction.
    fn first_instruction(mode: PlanMode) -> String {
        format!(
            "{PLAN_FIRST} call submit_plan with 1 to {} concrete steps.",
            mode.max_steps
        )
    }

    /// Takes the answer of a planning call: the plan it submitted, else one written as text
    /// (first plan and replans only), else what the planning call settles for.
    fn apply_plan(
        &mut self,
        planning: Planning,
        text: &str,
        submitted: Option<Vec<String>>,
        mode: PlanMode,
    ) {
        match planning {
            Planning::First | Planning::Replan => {
                // Lenient with models that write the plan as text: numbered or bulleted lines.
                let steps = submitted
                    .or_else(|| steps_from_text(text, mode.max_steps))
                    .unwrap_or_else(|| vec!["Do the task, then verify the result.".to_owned()]);
                self.steps.truncate(self.index);
                self.steps.extend(steps);
            }
            Planning::Checkpoint => {
                if let Some(revised) = submitted {
                    self.steps.truncate(self.index);
                    self.steps.extend(revised);
                }
            }
        }
    }

    /// Starts the next step: its instruction, or `None` when every step is done.
    fn start_step(&mut self) -> Option<String> {
        let step = self.steps.get(self.index)?;
        self.step_number += 1;
        Some(format!(
            "[Nerve] Step {}/{}: {}\nWhen the step is done, reply with a one-line summary and no tool calls. \
             If it cannot be done, reply with \"{STEP_FAILED}: <reason>\".",
            self.index + 1,
            self.steps.len(),
            step
        ))
    }

    /// Acts on a step's end: the planning call that follows it with its instruction, or
    /// `None` to go on to the next step; `Err` when a failed step used up the replans.
    fn end_step(
        &mut self,
        end: &StepEnd,
        mode: PlanMode,
        max_replans: u32,
    ) -> Result<Option<(Planning, String)>, Stop> {
        match end {
            StepEnd::Done => {
                self.index += 1;
                if !mode.checkpoints {
                    return Ok(None);
                }
                let remaining = &self.steps[self.index..];
                let listed = if remaining.is_empty() {
                    "none".to_owned()
                } else {
                    remaining
                        .iter()
                        .enumerate()
                        .map(|(i, s)| format!("{}. {s}", i + 1))
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                Ok(Some((
                    Planning::Checkpoint,
                    format!(
                        "{CHECKPOINT} summarise the progress so far in two or three sentences. Remaining steps:\n{listed}\n\
                         If they should change, call submit_plan with the new remaining steps; otherwise answer with the summary only."
                    ),
                )))
            }
            StepEnd::Failed(reason) => {
                if self.replans >= max_replans {
                    return Err(Stop::new(
                        TerminationReason::Error,
                        format!(
                            "step {} failed after {} replans: {reason}",
                            self.index + 1,
                            self.replans
                        ),
                    ));
                }
                self.replans += 1;
                Ok(Some((
                    Planning::Replan,
                    format!(
                        "[Nerve] Step {} failed: {reason}\nReplan the rest of the task: call submit_plan with the \
                         steps that remain (replan {} of {max_replans}).",
                        self.index + 1,
                        self.replans
                    ),
                )))
            }
        }
    }
}

/// The opening of the first planning instruction: where a plan loop's conversation begins.
const PLAN_FIRST: &str = "[Nerve] Before acting, plan the task:";
/// The opening of a checkpoint instruction.
const CHECKPOINT: &str = "[Nerve] Checkpoint:";

pub(crate) async fn run(run: &mut Run, mode: PlanMode) -> Stop {
    run.push_message(Message::user(PlanState::first_instruction(mode)));
    let at = At::Planning(Planning::First);
    match drive(run, mode, PlanState::default(), at).await {
        Ok(()) => Stop::completed(),
        Err(stop) => stop,
    }
}

/// A plan loop rebuilt from a resumed execution's conversation, ready to continue.
#[derive(Debug)]
pub(crate) struct Resumed {
    state: PlanState,
    at: At,
    /// Where the current step's instruction is in the conversation.
    step_message: Option<usize>,
    /// The `submit_plan` calls of the last planning answer that have no result yet: the
    /// crash came between the answer and the loop's reply to them.
    unanswered: Option<(Planning, Vec<ToolCall>)>,
    /// The loop had not asked for its plan yet: the first instruction is still to be written.
    begin: bool,
}

/// Rebuilds where a plan loop stood from its conversation, by walking it through the
/// transitions the live loop makes and checking that every instruction in it is the one
/// the loop would have written. `None` when the conversation is not a plan loop's as this
/// code writes it (its plan was compacted away, or it was written by another version):
/// the execution then continues as ReAct, with the plan in the conversation.
pub(crate) fn rebuild(messages: &[Message], mode: PlanMode, max_replans: u32) -> Option<Resumed> {
    let Some(first) = messages.iter().position(|m| {
        m.role == MessageRole::User && m.text_content() == PlanState::first_instruction(mode)
    }) else {
        // Stopped before the loop asked for its plan: it begins now.
        let begun = messages
            .iter()
            .any(|m| m.role == MessageRole::Assistant || m.role == MessageRole::Tool);
        return (!begun).then(|| Resumed {
            state: PlanState::default(),
            at: At::Planning(Planning::First),
            step_message: None,
            unanswered: None,
            begin: true,
        });
    };
    let mut state = PlanState::default();
    let mut at = At::Planning(Planning::First);
    let mut step_message = None;
    let mut unanswered = None;
    let mut answered: Vec<&ToolCallId> = Vec::new();
    for (offset, message) in messages[first + 1..].iter().enumerate() {
        let text = message.text_content();
        match message.role {
            MessageRole::System => return None,
            MessageRole::Tool => {
                answered.extend(message.parts.iter().filter_map(|part| match part {
                    MessagePart::ToolResult(result) => Some(&result.call_id),
                    MessagePart::Text { .. }
                    | MessagePart::ToolCall(_)
                    | MessagePart::Thinking { .. }
                    | MessagePart::CompactionSummary { .. } => None,
                }));
            }
            MessageRole::Assistant => match at {
                At::Planning(planning) => {
                    let calls: Vec<ToolCall> = message.tool_calls().cloned().collect();
                    let submitted = calls
                        .iter()
                        .find_map(|call| parse_plan(call, mode.max_steps).ok());
                    state.apply_plan(planning, &text, submitted, mode);
                    unanswered = Some((planning, calls));
                    at = At::StepStart;
                }
                At::InStep { turns } => {
                    at = if message.tool_calls().next().is_some() {
                        At::InStep { turns: turns + 1 }
                    } else {
                        At::Ended {
                            end: StepEnd::from_answer(&text),
                            turns: turns + 1,
                        }
                    };
                }
                // An answer nothing asked for.
                At::StepStart | At::Ended { .. } => return None,
            },
            MessageRole::User => {
                if let At::Ended { end, turns } = &at {
                    let mut next = state.clone();
                    match next.end_step(end, mode, max_replans) {
                        Ok(Some((planning, instruction))) if instruction == text => {
                            state = next;
                            at = At::Planning(planning);
                            continue;
                        }
                        Ok(None) if text.starts_with("[Nerve] Step ") => {
                            state = next;
                            at = At::StepStart;
                        }
                        // A guardrail's re-prompt: the answer did not end the step.
                        Ok(_) | Err(_) => {
                            at = At::InStep { turns: *turns };
                            continue;
                        }
                    }
                }
                match at {
                    At::StepStart => {
                        if state.start_step()? != text {
                            return None;
                        }
                        step_message = Some(first + 1 + offset);
                        at = At::InStep { turns: 0 };
                    }
                    // A guardrail's message within a step (stagnation, output limit).
                    At::InStep { .. } => {}
                    At::Planning(_) | At::Ended { .. } => return None,
                }
            }
        }
    }
    let unanswered = unanswered
        .filter(|_| at == At::StepStart)
        .map(|(planning, calls)| {
            let open: Vec<ToolCall> = calls
                .into_iter()
                .filter(|call| !answered.contains(&&call.id))
                .collect();
            (planning, open)
        })
        .filter(|(_, open)| !open.is_empty());
    Some(Resumed {
        state,
        at,
        step_message,
        unanswered,
        begin: false,
    })
}

impl Resumed {
    /// Replies to the planning calls the crash left unanswered. Before the interrupted
    /// turn is settled: these calls are the loop's own, never a tool's.
    pub(crate) fn answer_pending(&mut self, run: &mut Run, mode: PlanMode) {
        if let Some((planning, calls)) = self.unanswered.take() {
            answer_plan_calls(run, mode, planning.accepted(), &calls);
        }
    }
}

/// Continues a rebuilt plan loop where the interrupted one stood, in the step's scope.
pub(crate) async fn resume(run: &mut Run, mode: PlanMode, resumed: Resumed) -> Stop {
    let Resumed {
        state,
        at,
        step_message,
        begin,
        ..
    } = resumed;
    if begin {
        run.push_message(Message::user(PlanState::first_instruction(mode)));
    }
    if matches!(at, At::InStep { .. } | At::Ended { .. }) {
        run.progress.step = Some(state.step_number);
        run.window.protect_from = step_message;
    }
    match drive(run, mode, state, at).await {
        Ok(()) => Stop::completed(),
        Err(stop) => stop,
    }
}

async fn drive(
    run: &mut Run,
    mode: PlanMode,
    mut state: PlanState,
    mut at: At,
) -> Result<(), Stop> {
    // Ends: every step takes at least one turn (bounded by `max_turns` at each turn
    // boundary), between two steps there is at most one plan call, a failed step replans at
    // most `max_replans` times, and a plan without a next step breaks.
    loop {
        at = match at {
            At::Planning(planning) => {
                let (text, submitted) = plan_call(run, mode, planning.accepted()).await?;
                state.apply_plan(planning, &text, submitted, mode);
                At::StepStart
            }
            At::StepStart => {
                let Some(instruction) = state.start_step() else {
                    break;
                };
                run.progress.step = Some(state.step_number);
                run.stagnation.reset();
                // The active step is the subgoal: its messages are never compacted away.
                run.window.protect_from = Some(run.window.messages().len());
                run.push_message(Message::user(instruction));
                At::InStep { turns: 0 }
            }
            At::InStep { turns } => {
                let (end, turns) = step(run, mode, turns).await?;
                At::Ended { end, turns }
            }
            At::Ended { end, .. } => match state.end_step(&end, mode, run.config.max_replans)? {
                Some((planning, instruction)) => {
                    run.push_message(Message::user(instruction));
                    At::Planning(planning)
                }
                None => At::StepStart,
            },
        };
    }
    run.progress.step = None;
    run.window.protect_from = None;
    Ok(())
}

/// Runs one step as a ReAct sub-loop, `turns` of its turns already taken, until the model
/// answers without tool calls. Returns how it ended and after how many turns.
async fn step(run: &mut Run, mode: PlanMode, mut turns: u32) -> Result<(StepEnd, u32), Stop> {
    // Ends: each pass is one turn: `step_turns` (hybrid) or `max_turns` at the turn
    // boundary.
    loop {
        if mode.step_turns.is_some_and(|limit| turns >= limit) {
            return Ok((
                StepEnd::Failed(format!("the step did not finish within {turns} turns")),
                turns,
            ));
        }
        turns += 1;
        match react::turn(run).await? {
            TurnEnd::Continue => {}
            TurnEnd::Final(text) => return Ok((StepEnd::from_answer(&text), turns)),
        }
    }
}

/// One `plan` call offering only `submit_plan`: answers every call it makes (`accepted` or
/// why not) and returns the answer's text and the first valid plan.
async fn plan_call(
    run: &mut Run,
    mode: PlanMode,
    accepted: &str,
) -> Result<(String, Option<Vec<String>>), Stop> {
    // The step's answer and the instruction came after the last turn's fit.
    let turn = run.progress.turn_count();
    run.compactor().fit_request(turn).await?;
    let response = run
        .call_model(
            run.progress.turn_count(),
            CallPurpose::Plan,
            &[BuiltinTool::SubmitPlan.definition()],
        )
        .await?;
    let text = response.message.text_content();
    let calls: Vec<ToolCall> = response.message.tool_calls().cloned().collect();
    run.push_message(response.message);
    Ok((text, answer_plan_calls(run, mode, accepted, &calls)))
}

/// Replies to each call of a planning answer (`accepted` or why not); returns the first
/// valid plan.
fn answer_plan_calls(
    run: &mut Run,
    mode: PlanMode,
    accepted: &str,
    calls: &[ToolCall],
) -> Option<Vec<String>> {
    let mut plan = None;
    for call in calls {
        let parsed = parse_plan(call, mode.max_steps);
        let content = match &parsed {
            Ok(steps) => format!("{accepted}: {} steps.", steps.len()),
            Err(problem) => format!("Plan rejected: {problem}"),
        };
        let is_error = parsed.is_err();
        let result = ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        };
        let turns = run.progress.turn_count();
        tool_calls::finish_tool(run, turns, result, 0);
        if plan.is_none() {
            plan = parsed.ok();
        }
    }
    plan
}

fn parse_plan(call: &ToolCall, max_steps: usize) -> Result<Vec<String>, String> {
    if BuiltinTool::parse(&call.name) != Some(BuiltinTool::SubmitPlan) {
        return Err(format!(
            "`{}` is not available while planning; call submit_plan",
            call.name
        ));
    }
    let plan: SubmitPlanArgs = serde_json::from_value(call.arguments.clone())
        .map_err(|e| format!("invalid submit_plan arguments: {e}"))?;
    let steps: Vec<String> = plan
        .steps
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if steps.is_empty() {
        return Err("the plan has no steps".into());
    }
    Ok(steps.into_iter().take(max_steps).collect())
}

fn steps_from_text(text: &str, max_steps: usize) -> Option<Vec<String>> {
    let steps: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter_map(|line| {
            let rest = line.trim_start_matches(|c: char| c.is_ascii_digit());
            let marker_len = line.len() - rest.len();
            let rest = if marker_len > 0 {
                rest.strip_prefix('.').or_else(|| rest.strip_prefix(')'))?
            } else {
                rest.strip_prefix("- ")
                    .or_else(|| rest.strip_prefix("* "))?
            };
            let step = rest.trim();
            (!step.is_empty()).then(|| step.to_owned())
        })
        .take(max_steps)
        .collect();
    (!steps.is_empty()).then_some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_from_the_tool_call_or_from_text() {
        let call = |args: serde_json::Value| ToolCall {
            id: "p".into(),
            name: "submit_plan".into(),
            arguments: args,
        };
        assert_eq!(
            parse_plan(&call(serde_json::json!({"steps": ["a", " ", "b"]})), 7).unwrap(),
            ["a", "b"]
        );
        assert_eq!(
            parse_plan(&call(serde_json::json!({"steps": ["1", "2", "3"]})), 2).unwrap(),
            ["1", "2"]
        );
        assert!(
            parse_plan(&call(serde_json::json!({"steps": []})), 7)
                .unwrap_err()
                .contains("no steps")
        );
        assert!(
            parse_plan(&call(serde_json::json!({"stps": []})), 7)
                .unwrap_err()
                .contains("invalid")
        );
        assert_eq!(
            steps_from_text("Plan:\n1. read\n2) fix\n- test\nthanks", 7).unwrap(),
            ["read", "fix", "test"]
        );
        assert_eq!(steps_from_text("no list here", 7), None);
    }
}
