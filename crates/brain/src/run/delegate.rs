//! Delegation, as the turn sees it: the `delegate` tool's arguments and definition, the
//! [`Delegator`] port that runs a child execution (the engine implements it in
//! `children.rs`; a part never reaches the engine itself), each child's share of the
//! parent's remaining budget, and the tool result that carries a child's answer back.
//!
//! A child is an execution of its own (its own id, log chain, context window, loop and
//! guards) in the parent's sandbox and workspace; its `started` names the parent and the
//! call, and the parent's `tool_call_finished` names the child and how it ended
//! ([`nerve_core::event::ChildEnding`]). What a child spends is charged to the parent too:
//! one budget.

use std::sync::Arc;

use async_trait::async_trait;
use nerve_core::{
    ExecutionId, Interrupt, MicroUsd, TerminationReason, TokenUsage, ToolCall, ToolCallId,
    ToolDefinition, ToolError, ToolExecutor, ToolOutput,
};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The tool's name.
pub const TOOL: &str = "delegate";

/// The name of a child started without one (the cassette's `agent` for its lines).
pub const DEFAULT_NAME: &str = "subagent";

/// How an execution delegates (`[delegation]` in the settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelegationConfig {
    /// Offer the `delegate` tool. Off by default: it changes every request's tools.
    pub enabled: bool,
    /// Children of one turn that run at once, at most.
    pub max_parallel: usize,
    /// A child's turns when the call names none, and the most it may name.
    pub max_turns: u32,
    /// The share of the parent's remaining token and cost budgets (percent) the children
    /// of one turn get together, split evenly among them.
    pub budget_share_percent: u32,
    /// The longest answer handed back, in bytes (the rest is cut, and the result says so).
    pub answer_bytes: usize,
    /// The workspace as the parent's `started` names it (the children's do too).
    pub workspace: String,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            max_parallel: 4,
            max_turns: 10,
            budget_share_percent: 50,
            answer_bytes: 8 * 1024,
            workspace: String::new(),
        }
    }
}

/// `delegate`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DelegateArgs {
    /// What the subagent is to do, with everything it needs to know: it does not see
    /// this conversation.
    pub(crate) task: String,
    /// A short name for the subagent (letters, digits, - and _).
    #[serde(default)]
    pub(crate) name: Option<String>,
    /// The tools it may use (default: all of yours but delegate).
    #[serde(default)]
    pub(crate) tools: Option<Vec<String>>,
    /// The most turns it may take.
    #[serde(default)]
    pub(crate) max_turns: Option<u32>,
}

/// The tool's definition.
pub(crate) fn definition() -> ToolDefinition {
    ToolDefinition {
        name: TOOL.to_owned(),
        description: "Hand a self-contained piece of work to a subagent with a context of its \
                      own (reading many files, a search, an independent change). It works in \
                      the same workspace with your tools and returns its final answer. Several \
                      delegate calls in one answer run at once."
            .to_owned(),
        parameters: crate::run::builtin_tools::schema::<DelegateArgs>(),
    }
}

/// What a child is asked to do, and with what.
#[derive(Debug, Clone)]
pub struct ChildRequest {
    pub parent: ExecutionId,
    pub call_id: ToolCallId,
    pub task: String,
    pub name: String,
    /// `None`: every tool of the parent's but `delegate`.
    pub tools: Option<Vec<String>>,
    pub max_turns: u32,
    pub budget_tokens: Option<u64>,
    pub budget_cost: Option<MicroUsd>,
    /// The parent's: a cancel of the parent cancels the child.
    pub cancel: CancellationToken,
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildOutcome {
    pub child: ExecutionId,
    /// The child's name (the `delegate` call's, or [`DEFAULT_NAME`]).
    pub name: String,
    pub reason: TerminationReason,
    /// Its last assistant message's text (possibly empty).
    pub answer: String,
    pub error: Option<String>,
    pub turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
}

/// Runs child executions: the engine's, for the turn.
#[async_trait]
pub trait Delegator: Send + Sync {
    /// Runs `request` to its end. `Err` when the child could not start at all (nothing
    /// recorded for it).
    async fn run_child(&self, request: ChildRequest) -> Result<ChildOutcome, String>;

    /// For a resumed parent whose `delegate` call `call_id` was in flight: the child's
    /// outcome, after resuming it when it had not ended. `None` when no child of that call
    /// is known (it never started, or nothing reads the log): the call is then in doubt
    /// like any other.
    async fn resume_child(
        &self,
        parent: ExecutionId,
        call_id: ToolCallId,
        cancel: CancellationToken,
    ) -> Option<Result<ChildOutcome, String>> {
        let _ = (parent, call_id, cancel);
        None
    }
}

/// Shared by the turn and the engine.
pub(crate) type SharedDelegator = Arc<dyn Delegator>;

/// A child's tools: the parent's, narrowed to the names the call gave (all when it gave
/// none). A call of another tool is refused as a result the child's model sees.
pub(crate) struct Subset {
    pub(crate) inner: Arc<dyn ToolExecutor>,
    pub(crate) allowed: Option<Vec<String>>,
}

/// `inner` narrowed to `allowed` (all of it for `None`): a child's tools, also when the
/// child is resumed or continued on its own rather than through its parent.
pub fn narrowed(
    inner: Arc<dyn ToolExecutor>,
    allowed: Option<Vec<String>>,
) -> Arc<dyn ToolExecutor> {
    Arc::new(Subset { inner, allowed })
}

impl Subset {
    fn allows(&self, name: &str) -> bool {
        self.allowed
            .as_ref()
            .is_none_or(|names| names.iter().any(|n| n == name))
    }
}

#[async_trait]
impl ToolExecutor for Subset {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let mut definitions = self.inner.definitions();
        definitions.retain(|d| self.allows(&d.name));
        definitions
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        if !self.allows(&call.name) {
            return Ok(ToolOutput::error(format!(
                "`{}` is not one of this subagent's tools",
                call.name
            )));
        }
        self.inner.execute(call).await
    }

    async fn execute_until(
        &self,
        call: &ToolCall,
        interrupt: Interrupt<'_>,
    ) -> Result<ToolOutput, ToolError> {
        if !self.allows(&call.name) {
            return self.execute(call).await;
        }
        self.inner.execute_until(call, interrupt).await
    }

    fn may_change_workspace(&self, call: &ToolCall) -> bool {
        self.allows(&call.name) && self.inner.may_change_workspace(call)
    }

    async fn read_text(&self, path: &str) -> Option<String> {
        self.inner.read_text(path).await
    }
}

/// A share of what is left of a budget: `percent` of `limit - spent`, split among `children`.
pub(crate) fn share(limit: u64, spent: u64, percent: u32, children: usize) -> u64 {
    let left = limit.saturating_sub(spent);
    let children = u64::try_from(children.max(1)).unwrap_or(u64::MAX);
    let percent = u64::from(percent.min(100));
    (left / 100 * percent + (left % 100) * percent / 100) / children
}

/// The tool result a child's ending becomes: its id and ending, then its answer (cut at
/// `limit` bytes). An error result unless the child completed.
pub(crate) fn result_text(outcome: &ChildOutcome, limit: usize) -> (String, bool) {
    let reason = outcome.reason.as_str();
    let mut text = format!(
        "[Subagent {}: execution {} ended {reason} after {} turn(s)]",
        outcome.name, outcome.child, outcome.turns
    );
    if let Some(error) = &outcome.error
        && outcome.reason != TerminationReason::Completed
    {
        text.push_str(&format!("\n[{error}]"));
    }
    let answer = outcome.answer.trim();
    if !answer.is_empty() {
        let kept = nerve_core::text::clip(answer, limit);
        text.push('\n');
        text.push_str(kept);
        if kept.len() < answer.len() {
            text.push_str("\n[… cut: the answer is longer than the bound]");
        }
    }
    (text, outcome.reason != TerminationReason::Completed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_split_what_is_left() {
        assert_eq!(share(1000, 200, 50, 1), 400);
        assert_eq!(share(1000, 200, 50, 2), 200);
        assert_eq!(share(1000, 1200, 50, 2), 0);
        assert_eq!(share(u64::MAX, 0, 100, 1), u64::MAX / 100 * 100 + 15);
        assert_eq!(share(99, 0, 50, 1), 49);
    }

    #[test]
    fn a_childs_ending_as_the_parent_sees_it() {
        let outcome = ChildOutcome {
            child: ExecutionId::new(),
            name: "reader".into(),
            reason: TerminationReason::Completed,
            answer: "  found it  ".into(),
            error: None,
            turns: 2,
            usage: TokenUsage::default(),
            cost: MicroUsd::ZERO,
        };
        let (text, is_error) = result_text(&outcome, 100);
        assert!(!is_error);
        assert_eq!(
            text,
            format!(
                "[Subagent reader: execution {} ended completed after 2 turn(s)]\nfound it",
                outcome.child
            )
        );
        let spent = ChildOutcome {
            reason: TerminationReason::BudgetExhausted,
            error: Some("token budget exhausted".into()),
            answer: "x".repeat(50),
            ..outcome
        };
        let (text, is_error) = result_text(&spent, 10);
        assert!(is_error);
        assert!(text.contains("ended budget_exhausted"), "{text}");
        assert!(text.contains("[token budget exhausted]"), "{text}");
        assert!(text.ends_with("longer than the bound]"), "{text}");
    }
}
