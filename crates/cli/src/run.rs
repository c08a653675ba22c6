//! `nerve run` and `nerve resume`: the command line turned into the runtime's request,
//! the execution launched (every input checked first: a run that never started writes
//! nothing to the log), its transcript drawn as it runs, and its ending reported.

use std::path::Path;
use std::sync::Arc;

use nerve_brain::ExecutionResult;
use nerve_core::{Complexity, ExecutionId, LoopType};
use nerve_runtime::config::Config;
use nerve_runtime::launch::{ContinueRequest, DEFAULT_PROVIDER, Launch, RunRequest, Start};
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::args::{ComplexityArg, LoopArg, RunArgs};
use crate::output;
use crate::progress::{Display, Line, Mode, Status, Style, thousands};
use crate::screen::Screen;

pub(crate) async fn run(
    args: RunArgs,
    db: &Path,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    // The project's settings are those of the workspace the execution works on: its own
    // when it continues one.
    let workspace = match &args.continue_id {
        Some(id) => nerve_runtime::resume::workspace_of(db, id).await?,
        None => Some(args.workspace.clone().unwrap_or_else(|| ".".into())),
    };
    let config = crate::settings::load(config_path, workspace.as_deref(), flags(&args))?;
    let mode = Mode::detect(args.json || args.jsonl, args.quiet);
    if let Some(id) = &args.continue_id {
        // The task is the next message of execution ID, which runs again in a fresh
        // sandbox on its workspace (headless `nerve chat`).
        let request = ContinueRequest {
            message: read_task(&args)?,
            workspace: args.workspace.clone(),
            provider: args.provider.clone(),
            loop_type: loop_type(args.loop_type),
            max_turns: args.max_turns,
            image: args.image.clone(),
        };
        let (launch, start) = nerve_runtime::launch::continued(request, db, &config, id).await?;
        return go(launch, start, mode, args.jsonl, config_path).await;
    }
    let request = request(&args, &config)?;
    let (launch, start) =
        nerve_runtime::launch::fresh(&request, db, &config, ExecutionId::new()).await?;
    go(launch, start, mode, args.jsonl, config_path).await
}

/// The flags of `args` that are settings.
pub(crate) fn flags(args: &RunArgs) -> nerve_runtime::settings::Flags {
    nerve_runtime::settings::Flags {
        provider: args.provider.clone(),
        model: args.model.clone(),
        approval: args.approval.map(Into::into),
        context_window: args.context_window,
        sandbox_fallback: args.sandbox_fallback.map(Into::into),
    }
}

/// Execution `id` continued with `message` in a fresh sandbox on its workspace, as
/// `run --continue ID` does with the run's defaults (`nerve fork --task`).
pub(crate) async fn continue_with(
    db: &Path,
    config_path: Option<&Path>,
    id: &str,
    message: String,
    provider: Option<String>,
    json: bool,
) -> Result<u8, Failure> {
    let workspace = nerve_runtime::resume::workspace_of(db, id).await?;
    let flags = nerve_runtime::settings::Flags {
        provider: provider.clone(),
        ..nerve_runtime::settings::Flags::default()
    };
    let config = crate::settings::load(config_path, workspace.as_deref(), flags)?;
    let request = ContinueRequest {
        message,
        workspace: None,
        provider,
        loop_type: LoopType::React,
        max_turns: 20,
        image: None,
    };
    let (launch, start) = nerve_runtime::launch::continued(request, db, &config, id).await?;
    go(launch, start, Mode::detect(json, false), false, config_path).await
}

/// The runtime's request for `args`, its workspace and task checked (in that order).
pub(crate) fn request(args: &RunArgs, config: &Config) -> Result<RunRequest, Failure> {
    let workspace = args.workspace.as_deref().unwrap_or_else(|| Path::new("."));
    let workspace = nerve_runtime::launch::validate_workspace(workspace)?;
    Ok(RunRequest {
        workspace,
        task: read_task(args)?,
        provider: args
            .provider
            .clone()
            .or_else(|| config.provider.clone())
            .unwrap_or_else(|| DEFAULT_PROVIDER.to_owned()),
        model: args.model.clone().or_else(|| config.model.clone()),
        loop_type: loop_type(args.loop_type),
        complexity: args.complexity.map(complexity),
        max_turns: args.max_turns,
        timeout_secs: args.timeout,
        budget_usd: args.budget_usd,
        budget_tokens: args.budget_tokens,
        context_window: args.context_window,
        image: args.image.clone(),
        project_instructions: !args.no_project_instructions,
    })
}

pub(crate) fn complexity(arg: ComplexityArg) -> Complexity {
    match arg {
        ComplexityArg::Simple => Complexity::Simple,
        ComplexityArg::Medium => Complexity::Medium,
        ComplexityArg::Complex => Complexity::Complex,
        ComplexityArg::Epic => Complexity::Epic,
    }
}

pub(crate) fn loop_type(arg: LoopArg) -> LoopType {
    match arg {
        LoopArg::React => LoopType::React,
        LoopArg::PlanExecute => LoopType::PlanExecute,
        LoopArg::Hybrid => LoopType::Hybrid,
        LoopArg::Auto => LoopType::Auto,
    }
}

/// `nerve resume ID`: a fresh sandbox on the same workspace, the conversation rebuilt from
/// the log, and the engine continuing from the next turn.
pub(crate) async fn resume(
    db: &Path,
    config_path: Option<&Path>,
    id: &str,
    provider_spec: Option<&str>,
    output: Output,
) -> Result<u8, Failure> {
    let resumable = nerve_runtime::resume::resumable(db, id).await?;
    let config = crate::settings::load(
        config_path,
        Some(Path::new(&resumable.started.workspace)),
        nerve_runtime::settings::Flags::default(),
    )?;
    nerve_runtime::resume::not_in_a_worker(db, resumable.execution).await?;
    let (launch, start) =
        nerve_runtime::launch::resumed(db, &config, resumable, provider_spec, None).await?;
    go(
        launch,
        start,
        Mode::detect(output != Output::Text, false),
        output == Output::Jsonl,
        config_path,
    )
    .await
}

/// What `resume` prints on stdout (`run` says the same with `--quiet` besides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// The transcript.
    Text,
    /// `--json`: one JSON object at the end; no progress.
    Json,
    /// `--jsonl`: JSON lines as things happen (`nerve_runtime::views::jsonl`), the summary last; no progress.
    Jsonl,
}

impl Output {
    pub(crate) fn from_flags(json: bool, jsonl: bool) -> Self {
        match (json, jsonl) {
            (_, true) => Self::Jsonl,
            (true, false) => Self::Json,
            (false, false) => Self::Text,
        }
    }
}

/// Launches, shows the execution as `mode` says (`jsonl`: as JSON lines), reports its
/// ending on stdout and returns the exit code.
/// `config_path` is the `--config` given, repeated in the next steps suggested.
async fn go(
    mut launch: Launch<'_>,
    start: Start,
    mode: Mode,
    jsonl: bool,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    launch.capture_content = crate::telemetry::capture_content()?;
    let db = launch.db;
    let redactor = Arc::clone(launch.redactor());
    let display = Arc::new(Display::new(
        mode,
        launch.context_window()?,
        Arc::clone(&redactor),
    ));
    let screen = Screen {
        display: Arc::clone(&display),
        jsonl: jsonl.then(|| {
            Arc::new(nerve_runtime::views::jsonl::Jsonl::new(Arc::clone(
                &redactor,
            )))
        }),
        approver: None,
        children: nerve_runtime::observer::Children::default(),
    };
    let session = launch.open(Arc::new(screen)).await?;
    let id = session.execution_id();
    if let Start::Resume(state) | Start::FollowUp(state, _) = &start {
        display.seed(Status {
            turn: state.turns,
            usage: state.usage,
            cost: state.cost,
            ..Status::default()
        });
    }
    display.lines(&[(
        Style::Dim,
        match &start {
            Start::Fresh(_) => format!("execution {id} · {}", session.workspace().display()),
            Start::Resume(state) => {
                format!("resuming execution {id} after turn {}", state.turns)
            }
            Start::FollowUp(state, _) => {
                format!("continuing execution {id} after turn {}", state.turns)
            }
        },
    )]);
    let cancel = CancellationToken::new();
    let watcher = tokio::spawn(watch_interrupts(cancel.clone(), Arc::clone(&display)));
    display.start_clock();
    let ticker = crate::progress::ticker(&display);
    let result = session.run(start, cancel).await;
    ticker.abort();
    watcher.abort();
    session.close(result.as_ref().ok()).await;
    let result = result?;
    report(&result, &display, (db, config_path), jsonl, &redactor);
    Ok(
        if result.termination_reason == nerve_core::TerminationReason::Completed {
            0
        } else {
            1
        },
    )
}

/// First Ctrl-C or SIGTERM (what `timeout`, systemd, Docker and Kubernetes send): stop
/// now: no new tool call starts, a running command is interrupted, a model call in flight
/// is abandoned, and the run ends `shutdown` with its summary. A second one aborts at once
/// (exit 130 after SIGINT, 143 after SIGTERM).
async fn watch_interrupts(cancel: CancellationToken, display: Arc<Display>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    // Which signal came: the exit code of an abort says it.
    let mut next = async || {
        tokio::select! {
            _ = int.recv() => 130,
            _ = term.recv() => 143,
        }
    };
    next().await;
    let note = "nerve: stopping: no new tool call starts and a running command is interrupted (Ctrl-C again to abort)";
    if display.mode() == Mode::Live {
        // Above the status line, not through it.
        display.lines(&[(Style::Note, format!("· {note}"))]);
    } else {
        output::error_line(note);
    }
    cancel.cancel();
    let code = next().await;
    output::error_line("nerve: aborted");
    std::process::exit(code);
}

pub(crate) fn read_task(args: &RunArgs) -> Result<String, Failure> {
    let text = match (args.task.as_ref().or(args.prompt.as_ref()), &args.task_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) if file.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| {
                Failure::usage(format!(
                    "task file - (standard input): {}",
                    nerve_runtime::launch::describe_io(&e)
                ))
            })?;
            text
        }
        (None, Some(file)) => std::fs::read_to_string(file).map_err(|e| {
            Failure::usage(format!(
                "task file {}: {}",
                file.display(),
                nerve_runtime::launch::describe_io(&e)
            ))
        })?,
        (None, None) => {
            return Err(Failure::usage(
                "give the task: nerve run \"PROMPT\", --task TEXT or --task-file FILE",
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(Failure::usage("the task is empty"));
    }
    Ok(text)
}

fn report(
    result: &ExecutionResult,
    display: &Display,
    (db, config): (&Path, Option<&Path>),
    jsonl: bool,
    redactor: &nerve_core::Redactor,
) {
    let ctx = &result.context;
    let mode = display.mode();
    if mode == Mode::Silent {
        let summary = serde_json::json!({
            "answer": final_answer(result).map(|answer| redactor.redact(&answer).into_owned()),
            "execution_id": ctx.execution_id.to_string(),
            "termination_reason": result.termination_reason,
            "task_status": ctx.task_status,
            "total_turns": ctx.turn_count(),
            "input_tokens": ctx.usage.input_tokens,
            "output_tokens": ctx.usage.output_tokens,
            "cost_usd": ctx.cost.as_usd(),
            "compactions": ctx.compactions,
            "error": result.error,
        });
        output::json(&if jsonl {
            nerve_runtime::views::jsonl::summary_line(&summary)
        } else {
            summary
        });
        return;
    }
    display.finish();
    if mode == Mode::Answer {
        if let Some(error) = &result.error {
            output::error_line(&format!("nerve: {}: {error}", result.termination_reason));
        }
        return;
    }
    display.lines(&ending(result, db, config));
}

/// The final answer of a completed execution: its last assistant message's text; `None`
/// for any other ending, or an empty answer.
fn final_answer(result: &ExecutionResult) -> Option<String> {
    if result.termination_reason != nerve_core::TerminationReason::Completed {
        return None;
    }
    result
        .context
        .messages
        .iter()
        .rev()
        .find(|message| message.role == nerve_core::MessageRole::Assistant)
        .map(nerve_core::Message::text_content)
        .filter(|text| !text.trim().is_empty())
}

/// The end of the transcript: how the execution ended, its totals, the error of a failed
/// run, where the log is and what to try next.
pub(crate) fn ending(result: &ExecutionResult, db: &Path, config: Option<&Path>) -> Vec<Line> {
    let ctx = &result.context;
    let id = ctx.execution_id;
    let mut lines = vec![(Style::Text, String::new())];
    if let Some(error) = &result.error {
        lines.push((Style::Error, format!("error: {error}")));
    }
    lines.push((
        if result.termination_reason == nerve_core::TerminationReason::Completed {
            Style::Text
        } else {
            Style::Error
        },
        format!(
            "{} after {} turn{} · {} in / {} out tokens · {} · task {}",
            result.termination_reason,
            ctx.turn_count(),
            if ctx.turn_count() == 1 { "" } else { "s" },
            thousands(ctx.usage.input_tokens),
            thousands(ctx.usage.output_tokens),
            ctx.cost,
            ctx.task_status
        ),
    ));
    lines.extend(crate::progress::next_steps(
        id,
        db,
        config,
        Some(result.termination_reason),
    ));
    lines
}
