//! The execution loops over a run: ReAct (the turn), plan-execute and hybrid (steps over
//! `submit_plan`), and `auto`, which picks one from the task.

pub mod auto;
pub(crate) mod plan_execute;
pub(crate) mod react;
