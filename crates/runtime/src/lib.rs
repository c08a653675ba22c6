//! Nerve's runtime: the one library every front end (the `nerve` command line, and the
//! editor and HTTP front ends to come) puts an execution together with. It turns the
//! configuration file into the engine's settings, the model table and the proxy's rules
//! (`config`), builds providers from a spec (`provider`), opens the log a front end names
//! (`log`), and rebuilds an execution's state from its log to continue it (`resume`).
//!
//! It never prints, never touches a terminal and knows nothing of clap: what a person sees
//! is the front end's business. Its errors are [`RuntimeError`]s, whose kinds a front end
//! maps onto exit codes or statuses; it logs through `tracing` only.

mod error;

pub mod config;
#[cfg(test)]
mod config_doc_test;
pub mod log;
pub mod provider;
pub mod resume;

pub use error::{ErrorKind, RuntimeError};
