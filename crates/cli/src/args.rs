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
    /// The event log: a SQLite file (default: $XDG_STATE_HOME/nerve/nerve.db), or a
    /// PostgreSQL server as postgres://user@host:port/dbname[?sslmode=…]. Env: NERVE_DB.
    // Not clap's `env`: the command line must beat both variables (see `db_path`), and
    // clap would print a URL's password in `--help`.
    #[arg(long, global = true, value_name = "PATH|URL")]
    pub(crate) db: Option<PathBuf>,
    /// A file whose first line is the log's path or URL: a password kept off the command
    /// line and out of the environment. Env: NERVE_DB_FILE.
    #[arg(long, global = true, value_name = "FILE", conflicts_with = "db")]
    pub(crate) db_file: Option<PathBuf>,
    /// A TOML configuration file.
    #[arg(long, global = true, env = "NERVE_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
    /// Without a command: `nerve chat` in the current directory.
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

impl Cli {
    /// The log: `--db`, else `--db-file`'s, else `NERVE_DB`, else `NERVE_DB_FILE`'s, else
    /// the default (an empty variable counts as unset).
    pub(crate) fn db_path(&self) -> Result<PathBuf, Failure> {
        let var = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
        if let Some(db) = &self.db {
            Ok(db.clone())
        } else if let Some(file) = &self.db_file {
            db_from_file("--db-file", file)
        } else if let Some(db) = var("NERVE_DB") {
            Ok(PathBuf::from(db))
        } else if let Some(file) = var("NERVE_DB_FILE") {
            db_from_file("NERVE_DB_FILE", Path::new(&file))
        } else {
            Ok(nerve_runtime::log::default_db()?)
        }
    }
}

/// The log named by the first line of `file` (what `from`, the flag or variable, names).
/// The line is never shown: it may hold a password.
fn db_from_file(from: &str, file: &Path) -> Result<PathBuf, Failure> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        Failure::usage(format!(
            "{from} {}: {}",
            file.display(),
            nerve_runtime::launch::describe_io(&e)
        ))
    })?;
    let line = text.lines().next().map(str::trim).unwrap_or_default();
    if line.is_empty() {
        return Err(Failure::usage(format!(
            "{from} {}: its first line is empty: it should be the log's path or postgres:// URL",
            file.display()
        )));
    }
    Ok(PathBuf::from(line))
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a task on a workspace in a fresh sandbox.
    #[command(
        override_usage = "nerve run [OPTIONS] [--workspace <DIR>] <PROMPT|--task <TEXT>|--task-file <FILE>>\n       nerve run [OPTIONS] (-c|--continue [ID]|--resume [ID]) <PROMPT|--task <TEXT>|--task-file <FILE>>"
    )]
    Run(RunArgs),
    /// Reconstruct an execution from the log: completeness and gaps.
    Replay {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Print one JSON object (see docs/cli.md) instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Executions, newest first.
    List {
        /// Print one JSON list instead of a table.
        #[arg(long)]
        json: bool,
        /// Only executions in this state.
        #[arg(long, value_enum)]
        status: Option<StatusArg>,
    },
    /// One execution as a transcript: task, messages, tool calls, the answer, totals.
    Show {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Print the replay as one JSON object (as `replay --json`) instead.
        #[arg(long)]
        json: bool,
        /// Also write one self-contained HTML page of the run to FILE.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// The event timeline of an execution.
    Events {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Print one JSON list of `{seq, ts, kind, payload}` instead of lines.
        #[arg(long)]
        json: bool,
        /// Print every payload whole instead of clipped to a line.
        #[arg(long)]
        full: bool,
        /// Keep printing events as they are appended until the execution finishes (with
        /// `--json`: one object per line).
        #[arg(long)]
        follow: bool,
    },
    /// Check the log's hash chain; exits 1 when it was tampered with.
    Verify {
        /// The execution id, or a unique prefix of it.
        id: String,
    },
    /// Continue a crashed, interrupted or parked execution in a fresh sandbox.
    Resume {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Another provider than the one the execution started with.
        #[arg(long, value_name = "SPEC")]
        provider: Option<String>,
        /// Print one JSON object as the last line of stdout; no progress.
        #[arg(long, conflicts_with = "jsonl")]
        json: bool,
        /// Print one JSON object per line as things happen (events, answer deltas), the
        /// summary last; no progress (see docs/cli.md).
        #[arg(long)]
        jsonl: bool,
    },
    /// Talk to the agent: each message continues the same execution (one log, one sandbox,
    /// one context). Ctrl-C stops the agent's turn, Ctrl-D or /exit ends; /help for more.
    Chat(ChatArgs),
    /// Serve the Agent Client Protocol (v1) on stdin/stdout for an editor (Zed, JetBrains,
    /// Neovim): each editor session is one execution (see docs/acp.md). Logs go to stderr.
    Acp(AcpArgs),
    /// Serve the HTTP API (`/api/v1`: executions, messages, approvals, live event streams)
    /// to holders of a token from `nerve token create` (see docs/api.md).
    Serve(ServeArgs),
    /// API tokens for `nerve serve`: shown once at creation, stored hashed in the log.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Remove sandbox containers whose owning `nerve` process is provably dead, and the
    /// sandbox homes of executions that ended for good (completed, cancelled) or went
    /// unused for a week.
    Reap {
        /// Remove every Nerve container, also those of live runs and of other hosts: for an
        /// operator who knows those runs are gone.
        #[arg(long)]
        all: bool,
        /// Only this execution's containers (its full id).
        id: Option<String>,
    },
    /// Write an execution's log (events, hashes, snapshots, archive) as JSON Lines to stdout.
    Export {
        /// The execution (its id, or a unique prefix of it).
        id: String,
    },
    /// Load an exported execution into this log; it verifies as it did where it came from.
    Import {
        /// A file written by `nerve export` (`-` for stdin).
        file: PathBuf,
    },
    /// Queue an execution for `nerve worker` (PostgreSQL log); prints its id.
    // The run options are `run`'s; `--workspace` is optional here because `--git` may name
    // the workspace instead (clap keeps a default out of its conflict checks).
    #[command(mut_arg("workspace", |arg| arg
        .required(false)
        .default_value("")
        .hide_default_value(true)
        .help("The directory the agent works on: a path every worker reaches (a shared filesystem)")))]
    Submit(SubmitArgs),
    /// Claim queued executions and run them in sandboxes on this machine's Docker, until
    /// SIGTERM (or Ctrl-C) drains it.
    Worker {
        /// How many executions this worker runs at once.
        #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
        concurrency: u32,
        /// How long a claim holds without being renewed (renewed every third of it). A
        /// worker that dies is replaced this long after its last renewal.
        #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        lease: u64,
        /// Where `--git` workspaces are cloned (default: $XDG_STATE_HOME/nerve/workspaces).
        #[arg(long, value_name = "DIR")]
        workspaces: Option<PathBuf>,
    },
    /// Stop a queued execution, or ask the worker running one to stop it at its next turn
    /// boundary.
    Cancel {
        /// The execution id, or a unique prefix of it.
        id: String,
    },
    /// MCP servers: `nerve mcp list` shows each configured server, where it runs and its
    /// tools, starting them in a throwaway sandbox.
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// What the agent changed in the workspace: over the whole execution, or in one turn
    /// (a unified diff; binary files named).
    Diff {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Only what this turn changed.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        turn: Option<u32>,
    },
    /// Restore the workspace to its state after a turn (0: as the run found it); refused
    /// when the workspace changed outside the execution since its last snapshot.
    Rewind {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// The turn whose end state to restore.
        #[arg(long, value_name = "N")]
        turn: u32,
        /// Overwrite changes made outside the execution since its last snapshot.
        #[arg(long)]
        force: bool,
    },
    /// The effective settings and where each value came from: the defaults, the user's
    /// file ($XDG_CONFIG_HOME/nerve/config.toml), the project's (.nerve/config.toml in the
    /// workspace), --config, the environment (NERVE_PROVIDER, NERVE_MODEL, NERVE_APPROVAL,
    /// NERVE_CONTEXT_WINDOW) and the flags given here.
    Config(ConfigArgs),
    /// A new execution whose history is another's first N turns, on a workspace restored
    /// from turn N's snapshot (a new directory, or the parent's rewound with --in-place).
    Fork {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// The last turn taken from the parent.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        turn: u32,
        /// Rewind the parent's workspace to turn N (as `rewind` does) and fork on it.
        #[arg(long, conflicts_with = "into")]
        in_place: bool,
        /// The fork's workspace: a new or empty directory (default: the parent's path
        /// with `-fork-<id>` appended).
        #[arg(long, value_name = "DIR")]
        into: Option<PathBuf>,
        /// Continue the fork at once with this message (as `run --continue` does).
        #[arg(long, value_name = "TEXT")]
        task: Option<String>,
        /// The provider that continues it with --task (default: the parent's).
        #[arg(long, value_name = "SPEC", requires = "task")]
        provider: Option<String>,
        /// Print one JSON object (`{"execution_id"}`; with --task, the run's summary).
        #[arg(long)]
        json: bool,
    },
    /// Decide the pending approvals of a parked execution.
    Approve {
        /// The execution id, or a unique prefix of it.
        id: String,
        /// Refuse instead of approving.
        #[arg(long)]
        deny: bool,
        /// Shown to the model with a denial, recorded in the log.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
}

/// `nerve config`: the settings a `run` with these flags would have.
#[derive(Debug, Args)]
pub(crate) struct ConfigArgs {
    /// The workspace whose `.nerve/config.toml` counts (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// As `run --provider`.
    #[arg(long, value_name = "SPEC")]
    pub(crate) provider: Option<String>,
    /// As `run --model`.
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// As `run --approval`.
    #[arg(long, value_name = "MODE", value_enum)]
    pub(crate) approval: Option<ApprovalArg>,
    /// As `run --context-window`.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// As `run --sandbox-fallback`.
    #[arg(long, value_name = "MODE")]
    pub(crate) sandbox_fallback: Option<SandboxFallbackArg>,
    /// Print one JSON object: `files`, `settings` (each `{key, value, from, source}`) and
    /// `ignored` (the same, with `reason`).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SubmitArgs {
    /// A git repository each worker clones into a fresh directory (instead of --workspace).
    #[arg(long, value_name = "URL", conflicts_with = "workspace")]
    pub(crate) git: Option<String>,
    /// The branch, tag or commit of --git to check out (default: the remote's HEAD).
    #[arg(long = "ref", value_name = "REF", requires = "git")]
    pub(crate) git_ref: Option<String>,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// `nerve mcp ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum McpCommand {
    /// Each configured server, where it runs (sandbox or host) and the tools it offers.
    List {
        /// The workspace mounted in the throwaway sandbox (default: an empty directory).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// The sandbox image (default: the config's, else the built-in one).
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// Print one JSON array of servers.
        #[arg(long)]
        json: bool,
    },
}

/// What `list --status` selects: a state, or one termination reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StatusArg {
    /// Submitted and waiting for a worker (the task queue of a PostgreSQL log).
    Queued,
    /// Not finished: running now, or stopped without a finish event (crashed).
    Running,
    Completed,
    /// Waiting for an approval (`nerve approve`).
    Parked,
    /// Finished without completing: any termination other than completed and parked.
    Failed,
    #[value(name = "max_turns")]
    MaxTurns,
    #[value(name = "budget_exhausted")]
    BudgetExhausted,
    Shutdown,
    #[value(name = "timed_out")]
    TimedOut,
    Stagnation,
    Error,
    /// Cancelled in the task queue before a worker started it.
    Cancelled,
}

impl StatusArg {
    /// Whether an execution that ended with `termination_reason` (`None`: not finished) is
    /// in this state; `queue_state` is the queue's state of a submitted execution that has
    /// no events (never started).
    pub(crate) fn selects(
        self,
        termination_reason: Option<&str>,
        queue_state: Option<&str>,
    ) -> bool {
        if let Some(state) = queue_state {
            return match self {
                Self::Running => state == "claimed",
                Self::Failed => state == "failed",
                Self::Cancelled => state == "cancelled",
                Self::Queued
                | Self::Completed
                | Self::Parked
                | Self::MaxTurns
                | Self::BudgetExhausted
                | Self::Shutdown
                | Self::TimedOut
                | Self::Stagnation
                | Self::Error => false,
            };
        }
        let wanted = match self {
            Self::Cancelled => return false,
            Self::Queued => return false,
            Self::Running => return termination_reason.is_none(),
            Self::Failed => {
                return termination_reason.is_some_and(|r| r != "completed" && r != "parked");
            }
            Self::Completed => "completed",
            Self::Parked => "parked",
            Self::MaxTurns => "max_turns",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Shutdown => "shutdown",
            Self::TimedOut => "timed_out",
            Self::Stagnation => "stagnation",
            Self::Error => "error",
        };
        termination_reason == Some(wanted)
    }
}

/// `run --sandbox-fallback`: the configuration's `[sandbox] fallback`, from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SandboxFallbackArg {
    /// Refuse to start, naming the fix.
    Refuse,
    /// Run each call through its own `docker exec`: slower, background jobs not contained,
    /// no MCP server inside the sandbox. Recorded in the `started` event.
    PerCall,
}

impl From<SandboxFallbackArg> for nerve_runtime::config::SandboxFallback {
    fn from(arg: SandboxFallbackArg) -> Self {
        match arg {
            SandboxFallbackArg::Refuse => Self::Refuse,
            SandboxFallbackArg::PerCall => Self::PerCall,
        }
    }
}

/// `--approval`: the settings' `approval` from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ApprovalArg {
    ReadOnly,
    Ask,
    Auto,
    Never,
}

impl From<ApprovalArg> for nerve_brain::guards::approval::ApprovalMode {
    fn from(arg: ApprovalArg) -> Self {
        match arg {
            ApprovalArg::ReadOnly => Self::ReadOnly,
            ApprovalArg::Ask => Self::Ask,
            ApprovalArg::Auto => Self::Auto,
            ApprovalArg::Never => Self::Never,
        }
    }
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
#[command(group(clap::ArgGroup::new("task_source").args(["prompt", "task", "task_file"])))]
pub(crate) struct RunArgs {
    /// The task (with --continue: the next message); as --task.
    #[arg(value_name = "PROMPT")]
    pub(crate) prompt: Option<String>,
    /// The directory the agent works on, mounted at /workspace in the sandbox (default: the
    /// current directory; with --continue: the execution's own, which this may only repeat).
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// The task, as text (with --continue: the next message).
    #[arg(long, value_name = "TEXT")]
    pub(crate) task: Option<String>,
    /// The task, read from a file (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub(crate) task_file: Option<PathBuf>,
    /// `script:PATH`, `openai` or `anthropic` (default: `openai`; continuing an execution,
    /// the provider it started with).
    #[arg(long, value_name = "SPEC")]
    pub(crate) provider: Option<String>,
    /// Continue execution ID (a unique prefix, or `last`) with the task as the next
    /// message: the same log, conversation and spend, in a fresh sandbox on its workspace.
    /// Without an ID: the most recent execution on the workspace (--workspace, else the
    /// current directory).
    #[arg(
        long = "continue",
        short = 'c',
        value_name = "ID",
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub(crate) continue_id: Option<String>,
    /// As --continue (Claude Code's name).
    #[arg(
        long = "resume",
        value_name = "ID",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with = "continue_id"
    )]
    pub(crate) resume_id: Option<String>,
    /// The model to ask (default: the provider's; required with a custom base URL; a
    /// `script:` provider ignores it).
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// How the agent works: act and observe, plan then execute, or both (see docs/loops.md).
    #[arg(
        long = "loop",
        value_name = "LOOP",
        value_enum,
        default_value = "react"
    )]
    pub(crate) loop_type: LoopArg,
    /// How hard the task is, which `--loop auto` uses to choose a loop.
    #[arg(long, value_name = "LEVEL", value_enum)]
    pub(crate) complexity: Option<ComplexityArg>,
    /// The most turns (model calls) before the run stops with `max_turns`.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: u32,
    /// Wall-clock limit in seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout: Option<u64>,
    /// Stop with `budget_exhausted` once the run has cost this many dollars.
    #[arg(long, value_name = "USD")]
    pub(crate) budget_usd: Option<f64>,
    /// Stop with `budget_exhausted` once the run has used this many tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) budget_tokens: Option<u64>,
    /// Override the model's context capacity in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// The sandbox image (default: nerve-sandbox:latest, built locally when missing).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// Without a usable sandbox executor: refuse to start (the default), or run each tool
    /// call through its own `docker exec` (slower; recorded in the log).
    #[arg(long, value_name = "MODE")]
    pub(crate) sandbox_fallback: Option<SandboxFallbackArg>,
    /// Print one JSON object as the last line of stdout; no progress.
    #[arg(long, conflicts_with_all = ["jsonl", "quiet"])]
    pub(crate) json: bool,
    /// Print one JSON object per line as things happen (events, answer deltas), the
    /// summary last; no progress (see docs/cli.md).
    #[arg(long, conflicts_with = "quiet")]
    pub(crate) jsonl: bool,
    /// Print only the final answer.
    #[arg(long, short = 'q')]
    pub(crate) quiet: bool,
    /// Give the model no project instructions: neither the workspace's `AGENTS.md` (or
    /// `CLAUDE.md`) files nor the user's `$XDG_CONFIG_HOME/nerve/AGENTS.md`.
    #[arg(long)]
    pub(crate) no_project_instructions: bool,
    /// How much the agent may do without asking: read-only (reading only), ask (anything
    /// else asks; an unattended run parks), auto (everything unless a rule says otherwise,
    /// the default), never (nobody is asked). Overrides the settings' `approval`.
    #[arg(long, value_name = "MODE", value_enum)]
    pub(crate) approval: Option<ApprovalArg>,
}

impl RunArgs {
    /// `--resume` is `--continue`; and a value after either that cannot be an id (not
    /// `last`, not hex digits and dashes) is the prompt, when no other task was given:
    /// `nerve run -c "fix the test"` continues the workspace's latest execution with it.
    pub(crate) fn settle_continue(&mut self) {
        if self.continue_id.is_none() {
            self.continue_id = self.resume_id.take();
        }
        let no_task = self.prompt.is_none() && self.task.is_none() && self.task_file.is_none();
        if let Some(value) = &self.continue_id
            && no_task
            && !value.is_empty()
            && !value.eq_ignore_ascii_case("last")
            && !value.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        {
            self.prompt = self.continue_id.replace(String::new());
        }
    }
}

/// `nerve acp`: the settings of every session the editor opens.
#[derive(Debug, Args)]
pub(crate) struct AcpArgs {
    /// `script:PATH`, `openai` or `anthropic` (default: `openai`; a loaded session: the
    /// provider it started with).
    #[arg(long, value_name = "SPEC")]
    pub(crate) provider: Option<String>,
    /// The model to ask (default: the provider's).
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// How the agent works on each prompt: act and observe, plan then execute, or both
    /// (see docs/loops.md).
    #[arg(
        long = "loop",
        value_name = "LOOP",
        value_enum,
        default_value = "react"
    )]
    pub(crate) loop_type: LoopArg,
    /// The most turns (model calls) the agent takes for one prompt.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: u32,
    /// Override the model's context capacity in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// The sandbox image (default: nerve-sandbox:latest, built locally when missing).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// Without a usable sandbox executor: refuse to start (the default), or run each tool
    /// call through its own `docker exec`.
    #[arg(long, value_name = "MODE")]
    pub(crate) sandbox_fallback: Option<SandboxFallbackArg>,
    /// Give the model no project instructions: neither the workspace's `AGENTS.md` (or
    /// `CLAUDE.md`) files nor the user's `$XDG_CONFIG_HOME/nerve/AGENTS.md`.
    #[arg(long)]
    pub(crate) no_project_instructions: bool,
}

/// `nerve token ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum TokenCommand {
    /// Make a token and print it alone on stdout (the only time it is shown).
    Create {
        /// The token's name (letters, digits, '-', '_', '.'), for `list` and `revoke`.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// What it may do: read < run < approve < admin, each including the ones before.
        #[arg(long, value_name = "SCOPE", value_parser = ["read", "run", "approve", "admin"])]
        scope: String,
    },
    /// The tokens: name, scope, when created, last used and revoked (never the token).
    List {
        /// Print one JSON list instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token by name: it stops working at once.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// `nerve serve`: where it listens, where executions may be created, and the run options
/// of the executions it creates.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on (port 0: any free port; the address is printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8420")]
    pub(crate) listen: std::net::SocketAddr,
    /// Executions may be created only in workspaces under this directory (repeatable).
    #[arg(long = "workspace-root", value_name = "DIR")]
    pub(crate) workspace_roots: Vec<PathBuf>,
    /// Listen on a non-loopback address without TLS (behind a TLS-terminating proxy).
    #[arg(long)]
    pub(crate) insecure_http: bool,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The largest request body, in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = nerve_serve::DEFAULT_BODY_LIMIT)]
    pub(crate) max_body: usize,
    /// A provider a request may name besides --provider (repeatable).
    #[arg(long = "allow-provider", value_name = "SPEC")]
    pub(crate) allowed_providers: Vec<String>,
    /// `script:PATH`, `openai` or `anthropic` (default: `openai`): the executions' provider.
    #[arg(long, value_name = "SPEC")]
    pub(crate) provider: Option<String>,
    /// The model to ask (default: the provider's).
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// How the agent works (see docs/loops.md).
    #[arg(
        long = "loop",
        value_name = "LOOP",
        value_enum,
        default_value = "react"
    )]
    pub(crate) loop_type: LoopArg,
    /// How hard the tasks are, which `--loop auto` uses to choose a loop.
    #[arg(long, value_name = "LEVEL", value_enum)]
    pub(crate) complexity: Option<ComplexityArg>,
    /// The most turns (model calls) of an execution, or of one message.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: u32,
    /// Wall-clock limit of an execution in seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) timeout: Option<u64>,
    /// Stop an execution with `budget_exhausted` once it has cost this many dollars.
    #[arg(long, value_name = "USD")]
    pub(crate) budget_usd: Option<f64>,
    /// Stop an execution with `budget_exhausted` once it has used this many tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) budget_tokens: Option<u64>,
    /// Override the model's context capacity in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// The sandbox image (default: nerve-sandbox:latest, built locally when missing).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// Without a usable sandbox executor: refuse to start (the default), or run each tool
    /// call through its own `docker exec`.
    #[arg(long, value_name = "MODE")]
    pub(crate) sandbox_fallback: Option<SandboxFallbackArg>,
}

/// `nerve chat`: what the session starts with.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    /// Reopen this execution (a unique prefix, or `last`) instead of starting a new one.
    pub(crate) id: Option<String>,
    /// Reopen the most recent execution on the workspace (--workspace, else the current
    /// directory).
    #[arg(long = "continue", short = 'c', conflicts_with = "id")]
    pub(crate) continue_last: bool,
    /// Reopen this execution; without an ID, the workspace's latest one.
    #[arg(
        long = "resume",
        value_name = "ID",
        num_args = 0..=1,
        default_missing_value = "",
        conflicts_with_all = ["id", "continue_last"]
    )]
    pub(crate) resume_id: Option<String>,
    /// The directory the agent works on (default: the current directory; a reopened
    /// execution keeps its own).
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// `script:PATH`, `openai` or `anthropic` (default: `openai`, or the provider the
    /// reopened execution started with).
    #[arg(long, value_name = "SPEC")]
    pub(crate) provider: Option<String>,
    /// The model to ask (default: the provider's).
    #[arg(long, value_name = "NAME")]
    pub(crate) model: Option<String>,
    /// The most turns (model calls) the agent takes for one message.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_turns: u32,
    /// Override the model's context capacity in tokens.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) context_window: Option<u64>,
    /// The sandbox image (default: nerve-sandbox:latest, built locally when missing).
    #[arg(long, value_name = "IMAGE")]
    pub(crate) image: Option<String>,
    /// Give the model no project instructions: neither the workspace's `AGENTS.md` (or
    /// `CLAUDE.md`) files nor the user's `$XDG_CONFIG_HOME/nerve/AGENTS.md`.
    #[arg(long)]
    pub(crate) no_project_instructions: bool,
    /// How much the agent may do without asking: read-only (reading only), ask (anything
    /// else asks; an unattended run parks), auto (everything unless a rule says otherwise,
    /// the default), never (nobody is asked). Overrides the settings' `approval`.
    #[arg(long, value_name = "MODE", value_enum)]
    pub(crate) approval: Option<ApprovalArg>,
}

#[cfg(test)]
mod tests {
    use super::StatusArg;

    fn check(status: StatusArg, selected: &[Option<&str>]) {
        let all = [
            None,
            Some("completed"),
            Some("parked"),
            Some("max_turns"),
            Some("error"),
            Some("shutdown"),
        ];
        let got: Vec<Option<&str>> = all
            .into_iter()
            .filter(|r| status.selects(*r, None))
            .collect();
        assert_eq!(got, selected, "{status:?}");
    }

    /// A submission never started is selected by its queue state alone.
    #[test]
    fn list_status_selects_a_submission_by_its_queue_state() {
        let states = ["queued", "claimed", "cancelled", "failed"];
        let selected = |status: StatusArg| -> Vec<&str> {
            states
                .into_iter()
                .filter(|s| status.selects(None, Some(s)))
                .collect()
        };
        assert_eq!(selected(StatusArg::Cancelled), ["cancelled"]);
        assert_eq!(selected(StatusArg::Failed), ["failed"]);
        assert_eq!(selected(StatusArg::Running), ["claimed"]);
        assert!(selected(StatusArg::Completed).is_empty());
        check(StatusArg::Cancelled, &[]);
    }

    #[test]
    fn list_status_selects_by_state_or_reason() {
        check(StatusArg::Queued, &[]);
        check(StatusArg::Running, &[None]);
        check(StatusArg::Completed, &[Some("completed")]);
        check(StatusArg::Parked, &[Some("parked")]);
        check(
            StatusArg::Failed,
            &[Some("max_turns"), Some("error"), Some("shutdown")],
        );
        check(StatusArg::MaxTurns, &[Some("max_turns")]);
        check(StatusArg::Shutdown, &[Some("shutdown")]);
    }
}
