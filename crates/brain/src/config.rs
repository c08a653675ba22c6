//! The guardrails and choices of one execution (`EngineConfig`) and the price table it
//! charges by. Below every loop and every part of a running execution, so that they all
//! read it without importing the engine that wires them.

use std::time::Duration;

use nerve_core::{Complexity, LoopType, MicroUsd, TokenUsage};

use crate::approval::ToolPolicy;
use crate::auto::AutoLoopConfig;
use crate::compaction::CompactionConfig;
use crate::prompt::PromptProfile;
use crate::retry::RetryPolicy;
use crate::stagnation::StagnationConfig;
use crate::telemetry::TraceConfig;

/// Prices in micro-dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pricing {
    pub input_per_million: u64,
    pub output_per_million: u64,
    /// Input tokens read from the prompt cache; `None`: the input price.
    pub cache_read_per_million: Option<u64>,
    /// Input tokens written to the prompt cache; `None`: the input price.
    pub cache_write_per_million: Option<u64>,
}

impl Pricing {
    /// The cost of `usage`, cache reads and writes at their own prices. Rounded up per
    /// class, so a budget is never under-charged.
    pub fn cost(&self, usage: TokenUsage) -> MicroUsd {
        let read = usage.cache_read_tokens.min(usage.input_tokens);
        let write = usage.cache_write_tokens.min(usage.input_tokens - read);
        let plain = usage.input_tokens - read - write;
        let price = |p: Option<u64>| p.unwrap_or(self.input_per_million);
        MicroUsd::for_tokens(plain, self.input_per_million)
            + MicroUsd::for_tokens(read, price(self.cache_read_per_million))
            + MicroUsd::for_tokens(write, price(self.cache_write_per_million))
            + MicroUsd::for_tokens(usage.output_tokens, self.output_per_million)
    }
}

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
    pub instructions: crate::instructions::InstructionsConfig,
    /// The skills the model may load (`skill`); their names and descriptions join the
    /// system prompt. None by default: a front end finds them.
    pub skills: Vec<crate::skills::Skill>,
    /// A child execution's parent and the call that started it (recorded in `started`).
    pub lineage: Lineage,
    /// Whether and how the model may hand work to child executions (`delegate`).
    pub delegation: crate::delegate::DelegationConfig,
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
            instructions: crate::instructions::InstructionsConfig::default(),
            skills: Vec::new(),
            lineage: Lineage::default(),
            delegation: crate::delegate::DelegationConfig::default(),
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
