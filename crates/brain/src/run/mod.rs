//! A running execution and its tool calls: the execution's state, the parts a run owns
//! (journal, model caller, workspace tracker), the turn's tool side through the approval
//! gate, and what a turn offers or consults (built-in tools, delegation, hooks, project
//! instructions, skills, the system prompt).

pub(crate) mod builtin_tools;
pub mod delegate;
pub(crate) mod execution;
pub(crate) mod hooks;
pub mod instructions;
pub(crate) mod journal;
pub(crate) mod model_caller;
pub mod skills;
pub mod state;
pub mod system_prompt;
pub(crate) mod tool_calls;
pub(crate) mod workspace_tracker;
