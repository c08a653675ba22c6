//! The `nerve` binary: parses the command line into a validated configuration, wires the
//! concrete parts (SQLite log, Docker sandbox, provider) and reports the outcome.
//!
//! Exit codes: 0 when the execution completed (or an inspection succeeded), 1 for any
//! other termination or a failed `verify`, 2 for usage and configuration errors (one line
//! on stderr, nothing written to the log), 130 when aborted by a second Ctrl-C.

mod acp;
mod approve;
mod args;
mod chat;
mod follow;
mod html;
mod inspect;
mod mcp;
mod output;
mod progress;
mod queue;
mod reap;
mod rewind;
mod run;
mod screen;
mod serve;
mod settings;
mod telemetry;
mod transfer;
mod worker;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

/// An error that ends the process with a given exit code and one line on stderr.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    /// A usage or configuration error: exit 2.
    pub(crate) fn usage(message: impl std::fmt::Display) -> Self {
        Self {
            code: 2,
            message: message.to_string(),
        }
    }

    /// A runtime failure after the execution started: exit 1.
    pub(crate) fn runtime(message: impl std::fmt::Display) -> Self {
        Self {
            code: 1,
            message: message.to_string(),
        }
    }
}

/// The runtime's errors as exit codes: 2 when the request was refused before anything was
/// changed (usage, configuration, an execution's state, the provider, the sandbox, the
/// log), 1 when an operation failed part way. The message is the runtime's, unchanged.
impl From<nerve_runtime::RuntimeError> for Failure {
    fn from(error: nerve_runtime::RuntimeError) -> Self {
        if error.kind().refused_before_start() {
            Self::usage(error)
        } else {
            Self::runtime(error)
        }
    }
}

// The executor this binary carries (build.rs): `CARRIED_EXECUTOR`.
include!(concat!(env!("OUT_DIR"), "/carried_executor.rs"));

fn main() -> ExitCode {
    if let Some((bytes, sha256)) = CARRIED_EXECUTOR {
        nerve_runtime::carry_executor(nerve_runtime::CarriedExecutor { bytes, sha256 });
    }
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error),
    };
    if cli.command.is_none() {
        // `nerve` alone (global options allowed) is `nerve chat` in the current directory.
        cli = match Cli::try_parse_from(
            std::env::args_os().chain([std::ffi::OsString::from("chat")]),
        ) {
            Ok(cli) => cli,
            Err(error) => return usage_error(&error),
        };
    }
    let telemetry = match telemetry::init() {
        Ok(telemetry) => telemetry,
        Err(failure) => return report(&failure),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return report(&Failure::runtime(format!(
                "cannot start the async runtime: {error}"
            )));
        }
    };
    let outcome = runtime.block_on(dispatch(cli));
    // Do not wait for stray blocking tasks (a hung Docker call) at exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    // Outside the runtime: the exporter's flush blocks.
    telemetry.shutdown();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => report(&failure),
    }
}

/// The most recent execution on `workspace` (the current directory when `None`).
async fn latest_on(
    db: &std::path::Path,
    workspace: Option<&std::path::Path>,
) -> Result<String, Failure> {
    let here;
    let workspace = match workspace {
        Some(dir) => dir,
        None => {
            here = std::env::current_dir()
                .map_err(|e| Failure::usage(format!("cannot read the current directory: {e}")))?;
            here.as_path()
        }
    };
    Ok(nerve_runtime::resume::latest(db, Some(workspace))
        .await?
        .to_string())
}

async fn dispatch(cli: Cli) -> Result<u8, Failure> {
    // The user's settings file and the one named are checked by every command, not only
    // those that use them: a script that gives a wrong path learns it from the exit code (2)
    // at once. (The project's file is checked by the commands that work on a workspace.)
    nerve_runtime::settings::load(&nerve_runtime::settings::Sources::discover(
        cli.config.as_deref(),
        None,
        nerve_runtime::settings::Flags::default(),
    ))?;
    let db = cli.db_path()?;
    let Some(mut command) = cli.command else {
        return Err(Failure::usage("no command given: see `nerve --help`"));
    };
    let continues = match &command {
        Command::Chat(_) | Command::Acp(_) => true,
        Command::Run(args) => args.continue_id.is_some() || args.resume_id.is_some(),
        Command::Replay { .. }
        | Command::List { .. }
        | Command::Show { .. }
        | Command::Events { .. }
        | Command::Verify { .. }
        | Command::Resume { .. }
        | Command::Reap { .. }
        | Command::Export { .. }
        | Command::Import { .. }
        | Command::Submit(_)
        | Command::Worker { .. }
        | Command::Cancel { .. }
        | Command::Approve { .. }
        | Command::Diff { .. }
        | Command::Rewind { .. }
        | Command::Fork { .. }
        | Command::Mcp { .. }
        | Command::Config(_)
        | Command::Token { .. } => false,
        // Its messages route refuses a PostgreSQL log itself; everything else it does works there.
        Command::Serve(_) => false,
    };
    if nerve_runtime::log::is_postgres(&db) && continues {
        return Err(Failure::usage(
            "chat, acp and --continue do not read a PostgreSQL log yet: `nerve export` the execution and `nerve import` it into a SQLite log to continue it there",
        ));
    }
    // Every id a person types may be a unique prefix, or `last`.
    match &mut command {
        Command::Replay { id, .. }
        | Command::Show { id, .. }
        | Command::Events { id, .. }
        | Command::Verify { id }
        | Command::Resume { id, .. }
        | Command::Approve { id, .. }
        | Command::Cancel { id }
        | Command::Diff { id, .. }
        | Command::Rewind { id, .. }
        | Command::Fork { id, .. }
        | Command::Export { id } => *id = inspect::resolve(&db, id).await?,
        Command::Run(args) => {
            args.settle_continue();
            if let Some(id) = &mut args.continue_id {
                *id = if id.is_empty() {
                    latest_on(&db, args.workspace.as_deref()).await?
                } else {
                    inspect::resolve(&db, id).await?
                };
            }
        }
        Command::Chat(args) => {
            let resume = args.resume_id.take();
            if args.continue_last || resume.as_deref() == Some("") {
                args.id = Some(latest_on(&db, args.workspace.as_deref()).await?);
            } else if resume.is_some() {
                args.id = resume;
            }
            if let Some(id) = &mut args.id {
                *id = inspect::resolve(&db, id).await?;
            }
        }
        Command::List { .. }
        | Command::Acp(_)
        | Command::Reap { .. }
        | Command::Import { .. }
        | Command::Submit(_)
        | Command::Worker { .. }
        | Command::Mcp { .. }
        | Command::Serve(_)
        | Command::Config(_)
        | Command::Token { .. } => {}
    }
    match command {
        Command::Run(args) => run::run(args, &db, cli.config.as_deref()).await,
        Command::Chat(args) => chat::chat(args, &db, cli.config.as_deref()).await,
        Command::Acp(args) => acp::serve(args, db, cli.config.as_deref()).await,
        Command::Replay { id, json } => inspect::replay(&db, &id, json).await,
        Command::List { json, status } => inspect::list(&db, json, status).await,
        Command::Show { id, json, html } => inspect::show(&db, &id, json, html.as_deref()).await,
        Command::Events {
            id,
            json,
            full,
            follow: true,
        } => follow::follow(&db, &id, json, full).await,
        Command::Events {
            id,
            json,
            full,
            follow: false,
        } => inspect::events(&db, &id, json, full).await,
        Command::Submit(args) => queue::submit(args, &db).await,
        Command::Cancel { id } => queue::cancel(&db, &id).await,
        Command::Worker {
            concurrency,
            lease,
            workspaces,
        } => {
            let settings = nerve_runtime::worker::WorkerSettings {
                concurrency: concurrency as usize,
                lease: std::time::Duration::from_secs(lease),
                workspaces,
            };
            worker::work(&db, cli.config.as_deref(), settings).await
        }
        Command::Verify { id } => inspect::verify(&db, &id).await,
        Command::Export { id } => transfer::export(&db, &id).await,
        Command::Import { file } => transfer::import(&db, &file).await,
        Command::Resume {
            id,
            provider,
            json,
            jsonl,
        } => {
            let output = run::Output::from_flags(json, jsonl);
            run::resume(&db, cli.config.as_deref(), &id, provider.as_deref(), output).await
        }
        Command::Approve { id, deny, reason } => {
            approve::approve(&db, cli.config.as_deref(), &id, deny, reason).await
        }
        Command::Diff { id, turn } => rewind::diff(&db, &id, turn).await,
        Command::Rewind { id, turn, force } => rewind::rewind(&db, &id, turn, force).await,
        Command::Fork {
            id,
            turn,
            in_place,
            into,
            task,
            provider,
            json,
        } => {
            let request = nerve_runtime::fork::ForkRequest {
                id,
                turn,
                in_place,
                into,
            };
            let then = task.map(|task| (task, provider));
            rewind::fork(&db, cli.config.as_deref(), &request, then, json).await
        }
        Command::Reap { all, id } => reap::reap(&db, all, id.as_deref()).await,
        Command::Mcp { command } => mcp::command(command, cli.config.as_deref()).await,
        Command::Serve(args) => serve::serve(args, db, cli.config.as_deref()).await,
        Command::Token { command } => serve::token(command, &db).await,
        Command::Config(args) => settings::show(args, cli.config.as_deref()),
    }
}

/// Clap's refusals as one line on stderr and exit 2 (help and version are printed whole,
/// on stdout, exit 0). Clap's usage line is left out: it names options given through the
/// environment as if they were required (`--db` when NERVE_DB is set).
fn usage_error(error: &clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    // (clap's ErrorKind is non-exhaustive: the kinds printed whole are named, the rest are
    // refusals.)
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = error.print();
        return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
    }
    let text = error.render().to_string();
    let what = text
        .lines()
        .take_while(|line| !line.starts_with("Usage:") && !line.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join("\n");
    let what = what.trim().trim_start_matches("error:").trim();
    // The command path from clap's usage ("Usage: nerve show [OPTIONS] <ID>").
    let command = match error.get(ContextKind::Usage) {
        Some(ContextValue::StyledStr(usage)) => usage
            .to_string()
            .trim_start_matches("Usage:")
            .split_whitespace()
            .take_while(|word| !word.starts_with(['[', '<', '-']))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    let command = if command.is_empty() {
        "nerve".to_owned()
    } else {
        command
    };
    report(&Failure::usage(format!("{what} (see `{command} --help`)")))
}

fn report(failure: &Failure) -> ExitCode {
    output::error_line(&format!("nerve: {}", one_line(&failure.message)));
    ExitCode::from(failure.code)
}

/// The contract is one line on stderr; some causes (a regex parse error) span several.
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use nerve_runtime::RuntimeError;

    use super::Failure;

    #[test]
    fn runtime_errors_keep_their_message_and_exit_2_unless_they_failed_part_way() {
        let check = |error: RuntimeError, code: u8| {
            let message = error.to_string();
            let failure = Failure::from(error);
            assert_eq!((failure.code, failure.message), (code, message));
        };
        check(RuntimeError::usage("give the task"), 2);
        check(RuntimeError::config("invalid config c.toml: x"), 2);
        check(RuntimeError::NotFound("no event log at x".into()), 2);
        check(RuntimeError::conflict("execution e waits for approval"), 2);
        check(RuntimeError::provider("ANTHROPIC_API_KEY is not set"), 2);
        check(RuntimeError::sandbox("cannot connect to Docker"), 2);
        check(RuntimeError::log("event log x: locked"), 2);
        check(RuntimeError::Engine("invalid task".into()), 2);
        check(RuntimeError::failed("event log write failed: disk full"), 1);
    }
}
