//! The guardrails a running execution consults: the approval gate (which tool calls may
//! run, which need a person), stagnation (an agent repeating itself), and the runaway
//! stream (a live answer that loops). They see tool calls and deltas, never the run.

pub mod approval;
pub(crate) mod runaway;
pub mod stagnation;
