//! The command line, as clap parses it. Validation beyond syntax happens in the commands.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::Failure;

#[derive(Debug, Parser)]
#[command(
    name = "nerve",
    version,
    about = "Run an LLM agent in a hardened sandbox, with a log you can replay and resume."
)]
pub(crate) struct Cli {
    /// The SQLite event log (default: $XDG_STATE_HOME/nerve/nerve.db).
    #[arg(long, global = true, env = "NERVE_DB", value_name = "PATH")]
    pub(crate) db: Option<PathBuf>,
    /// A TOML configuration file.
    #[arg(long, global = true, env = "NERVE_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    pub(crate) fn db_path(&self) -> Result<PathBuf, Failure> {
        if let Some(db) = &self.db {
            return Ok(db.clone());
        }
        let state = std::env::var_os("XDG_STATE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| {
                std::env::var_os("HOME").map(|home| Path::new(&home).join(".local").join("state"))
            })
            .ok_or_else(|| {
                Failure::usage("cannot locate a state directory: set --db, NERVE_DB or HOME")
            })?;
        Ok(state.join("nerve").join("nerve.db"))
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a task on a workspace in a fresh sandbox.
    Run(RunArgs),
    /// Reconstruct an execution from the log: completeness and gaps.
    Replay {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Executions, newest first.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One execution: task, status, turns, cost, termination.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// The event timeline of an execution.
    Events {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Check the log's hash chain; exits 1 when it was tampered with.
    Verify { id: String },
    /// Continue a crashed, interrupted or parked execution in a fresh sandbox.
    Resume {
        id: String,
        /// Another provider than the one the execution started with.
        #[arg(long, value_name = "SPEC")]
        provider: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove sandbox containers whose owning `nerve` process is provably dead.
    Reap {
        /// Remove every Nerve container, also those of live runs and of other hosts: for an
        /// operator who knows those runs are gone.
        #[arg(long)]
        all: bool,
        /// Only this execution's containers (its full id).
        id: Option<String>,
    },
    /// Decide the pending approvals of a parked execution.
    Approve {
        id: String,
        /// Refuse instead of approving.
        #[arg(long)]
        deny: bool,
        /// Shown to the model with a denial, recorded in the log.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LoopArg {
    React,
    #[value(name = "plan_execute")]
    PlanExecute,
    Hybrid,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ComplexityArg {
    Simple,
    Medium,
    Complex,
    Epic,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("task_source").required(true).args(["task", "task_file"])))]
pub(crate) struct RunArgs {
    /// The directory the agent works on, mounted at /workspace in the sandbox.
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: PathBuf,
    /// The task, as text.
    #[arg(long, value_name = "TEXT")]
    pub(crate) task: Option<String>,
    /// The task, read from a file.
    #[arg(long, value_name = "FILE")]
    pub(crate) task_file: Option<PathBuf>,
    /// `script:PATH`, `openai` or `anthropic`.
    #[arg(long, value_name = "SPEC", default_value = "openai")]
    pub(crate) provider: String,
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    #[arg(long = "loop", value_enum, default_value = "react")]
    pub(crate) loop_type: LoopArg,
    #[arg(long, value_enum)]
    pub(crate) complexity: Option<ComplexityArg>,
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: u32,
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout: Option<u64>,
    #[arg(long, value_name = "USD")]
    pub(crate) budget_usd: Option<f64>,
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) budget_tokens: Option<u64>,
    /// Override the model's context capacity in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// The sandbox image (default: nerve-sandbox:latest, built locally when missing).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    pub(crate) json: bool,
}
