//! Nerve's runtime: the one library every front end (the `nerve` command line, and the
//! editor and HTTP front ends to come) puts an execution together with. It turns the
//! configuration file into the engine's settings, the model table and the proxy's rules
//! (`config`), builds providers from a spec (`provider`), opens the log a front end names
//! (`log`), rebuilds an execution's state from its log to continue it (`resume`), puts an
//! execution together (`launch`: a fresh task, a resume, a person's next message, a
//! conversation), starts its sandbox and runs the engine in it (`session`), telling the
//! front end's [`Observer`](observer::Observer) what happens, and keeps the workspace's
//! history (`snapshots`). On a PostgreSQL log it queues executions (`queue`) and runs
//! them as a worker under the queue's leases (`worker`). It reads the log for a front end
//! to show (`log`'s `Reader`, whose types it re-exports) and moves executions between logs
//! (`transfer`), and renders an execution as a transcript or as JSON lines (`views`).
//!
//! It never prints, never touches a terminal and knows nothing of clap: what a person sees
//! is the front end's business. Its errors are [`RuntimeError`]s, whose kinds a front end
//! maps onto exit codes or statuses; it logs through `tracing` only.

mod children;
mod error;

pub mod config;
#[cfg(test)]
mod config_doc_test;
mod environment;
pub mod fork;
pub mod hooks;
pub mod instructions;
pub mod launch;
pub mod log;
pub mod mcp;
pub mod observer;
pub mod provider;
pub mod queue;
pub mod reap;
pub mod resume;
pub mod session;
pub mod settings;
pub mod skills;
pub mod snapshots;
pub mod tokens;
pub mod transfer;
pub mod views;
pub mod worker;

pub use error::{ErrorKind, RuntimeError};
/// The executor a `nerve` binary carries, handed to the sandboxes that need one; and how
/// an execution's sandbox ran its tool calls (recorded in the `started` event, shown by
/// `show`). Re-exported on purpose: a front end never wires the sandbox itself.
pub use nerve_hands::{CarriedExecutor, ExecutorUse, carry_executor};
