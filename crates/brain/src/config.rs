//! The guardrails and choices of one execution (`EngineConfig`), the price it charges by
//! among them (`Pricing`, which the model table owns). Below every loop and every part of a running execution, so that they all
//! read it without importing the engine that wires them.

use std::time::Duration;

use nerve_core::{Complexity, LoopType, MicroUsd};

use crate::context::compaction_plan::CompactionConfig;
use crate::guards::approval::ToolPolicy;
use crate::guards::stagnation::StagnationConfig;
use crate::loops::auto::AutoLoopConfig;
use crate::provider::model_table::Pricing;
use crate::provider::retry::RetryPolicy;
use crate::run::system_prompt::PromptProfile;
use crate::telemetry::TraceConfig;

/// The guardrails and choices of one execution. Defaults are the design's.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The loop to run; `auto` resolves from `complexity` and the budget.
    pub loop_type: LoopType,
    pub complexity: Option<Complexity>,
    pub auto: AutoLoopConfig,
    pub max_turns: u32,
    pub timeout: Option<Duration>,
    pub budget_tokens: Option<u64>,
    pub budget_cost: Option<MicroUsd>,
    /// Tokens left at which the one-time near-budget warning fires.
    pub reserve_tokens: u64,
    /// Percent of the cost limit left at which the warning fires.
    pub reserve_cost_percent: u32,
    pub pricing: Pricing,
    pub context_window: Option<u64>,
    pub retry: RetryPolicy,
    pub stagnation: StagnationConfig,
    pub compaction: CompactionConfig,
    pub policy: ToolPolicy,
    /// Continuation prompts after `max_tokens` before the answer is taken as final.
    pub max_tokens_recoveries: u32,
    /// Re-prompts of an empty answer right after a failing tool result.
    pub premature_end_retries: u32,
    pub max_replans: u32,
    /// A checkpoint after every this many turns (0: never).
    pub checkpoint_every: u32,
    /// Hybrid: most plan steps, and turns per step.
    pub hybrid_max_steps: usize,
    pub hybrid_step_turns: u32,
    /// Plan-execute: most plan steps.
    pub plan_max_steps: usize,
    /// `None`: chosen from the model's name.
    pub prompt_profile: Option<PromptProfile>,
    /// Settings worth recording in the start event (never secrets).
    pub recorded_config: serde_json::Value,
    /// What the tracing spans carry (content only when opted in, always redacted).
    pub trace: TraceConfig,
    /// Which project instructions (`AGENTS.md`, the user's file) the model is given.
    pub instructions: crate::run::instructions::InstructionsConfig,
    /// The skills the model may load (`skill`); their names and descriptions join the
    /// system prompt. None by default: a front end finds them.
    pub skills: Vec<crate::run::skills::Skill>,
    /// A child execution's parent and the call that started it (recorded in `started`).
    pub lineage: Lineage,
    /// Whether and how the model may hand work to child executions (`delegate`).
    pub delegation: crate::run::delegate::DelegationConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            loop_type: LoopType::React,
            complexity: None,
            auto: AutoLoopConfig::default(),
            max_turns: 20,
            timeout: None,
            budget_tokens: None,
            budget_cost: None,
            reserve_tokens: 512,
            reserve_cost_percent: 10,
            pricing: Pricing::default(),
            context_window: None,
            retry: RetryPolicy::default(),
            stagnation: StagnationConfig::default(),
            compaction: CompactionConfig::default(),
            policy: ToolPolicy::default(),
            max_tokens_recoveries: 2,
            premature_end_retries: 2,
            max_replans: 3,
            checkpoint_every: 1,
            hybrid_max_steps: 7,
            hybrid_step_turns: 5,
            plan_max_steps: 20,
            prompt_profile: None,
            recorded_config: serde_json::Value::Null,
            trace: TraceConfig::default(),
            instructions: crate::run::instructions::InstructionsConfig::default(),
            skills: Vec::new(),
            lineage: Lineage::default(),
            delegation: crate::run::delegate::DelegationConfig::default(),
        }
    }
}

/// Whose child an execution is: the parent's execution id and its `delegate` call's id,
/// both `None` for an execution of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    pub parent: Option<String>,
    pub call_id: Option<nerve_core::ToolCallId>,
}
