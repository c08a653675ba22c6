//! `nerve run`: validate every input first, then start the sandbox, open the log and run
//! the engine. A run that never started writes nothing to the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nerve_brain::{
    AgentEngine, EngineConfig, ExecutionResult, FollowUp, Provider, ResumeState, Task,
};
use nerve_core::{
    Complexity, EventSink, ExecutionId, LoopType, MicroUsd, Redactor, TaskId, TaskStatus,
};
use nerve_hands::mcp::McpTools;
use nerve_hands::{ProxyListener, Sandbox, SandboxConfig, SandboxTools};
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::args::{ComplexityArg, LoopArg, RunArgs};
use crate::output;
use crate::progress::{Display, Line, Mode, ProgressSink, Style, thousands};
use nerve_runtime::config::Config;

/// Environment variables whose values are registered with the redactor when set.
const PROVIDER_KEY_VARS: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// Host variables passed into the sandbox when set, after the credential filter.
const SANDBOX_ENV_VARS: &[&str] = &["LANG", "LC_ALL", "TZ"];

pub(crate) async fn run(
    args: RunArgs,
    db: &Path,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    if let Some(id) = args.continue_id.clone() {
        return follow_up(args, db, config_path, &id).await;
    }
    let config = Config::load(config_path)?.with_fallback(args.sandbox_fallback.map(Into::into));
    let launch = fresh(&args, db, &config, ExecutionId::new()).await?;
    launch.go().await
}

/// A fresh execution of `args` as `execution_id`, validated and ready to launch (`run`, and
/// a worker taking up a submitted execution).
pub(crate) async fn fresh<'a>(
    args: &RunArgs,
    db: &'a Path,
    config: &'a Config,
    execution_id: ExecutionId,
) -> Result<Launch<'a>, Failure> {
    let Some(workspace) = &args.workspace else {
        return Err(Failure::usage("give the workspace with --workspace DIR"));
    };
    let workspace = validate_workspace(workspace)?;
    let description = read_task(args)?;
    let provider = nerve_runtime::provider::build(
        args.provider.as_deref().unwrap_or("openai"),
        args.model.as_deref(),
        &config.provider_settings(args.context_window)?,
    )
    .await?;
    let budget_cost = args
        .budget_usd
        .map(|usd| {
            MicroUsd::from_usd(usd)
                .ok_or_else(|| Failure::usage(format!("--budget-usd {usd} is not a dollar amount")))
        })
        .transpose()?;
    let loop_type = loop_type(args.loop_type);
    let complexity = args.complexity.map(|c| match c {
        ComplexityArg::Simple => Complexity::Simple,
        ComplexityArg::Medium => Complexity::Medium,
        ComplexityArg::Complex => Complexity::Complex,
        ComplexityArg::Epic => Complexity::Epic,
    });
    let engine_config = EngineConfig {
        loop_type,
        complexity,
        max_turns: args.max_turns,
        timeout: args.timeout.map(Duration::from_secs),
        budget_tokens: args.budget_tokens,
        budget_cost,
        context_window: args.context_window,
        recorded_config: serde_json::json!({
            "max_turns": args.max_turns,
            "timeout_secs": args.timeout,
            "budget_tokens": args.budget_tokens,
            "budget_usd": args.budget_usd,
            "context_window": args.context_window,
            "complexity": complexity,
            "image": args.image,
        }),
        ..config.engine_config()?
    };
    let task = Task {
        id: TaskId::new(),
        description,
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: workspace.display().to_string(),
    };
    Ok(Launch {
        db,
        config,
        workspace,
        provider,
        engine_config,
        image: args.image.clone(),
        mode: Mode::detect(args.json || args.jsonl, args.quiet),
        jsonl: args.jsonl,
        execution_id,
        start: Start::Once(Once::Fresh(task)),
        log: None,
        cancel: None,
    })
}

fn loop_type(arg: LoopArg) -> LoopType {
    match arg {
        LoopArg::React => LoopType::React,
        LoopArg::PlanExecute => LoopType::PlanExecute,
        LoopArg::Hybrid => LoopType::Hybrid,
        LoopArg::Auto => LoopType::Auto,
    }
}

/// `nerve run --continue ID --task TEXT`: the task is the next message of execution ID,
/// which runs again in a fresh sandbox on its workspace (headless `nerve chat`).
async fn follow_up(
    args: RunArgs,
    db: &Path,
    config_path: Option<&Path>,
    id: &str,
) -> Result<u8, Failure> {
    let config = Config::load(config_path)?.with_fallback(args.sandbox_fallback.map(Into::into));
    let message = read_task(&args)?;
    let (continuable, replay) = nerve_runtime::resume::continuable(db, id).await?;
    let workspace = validate_workspace(Path::new(&continuable.started.workspace))?;
    if let Some(given) = &args.workspace
        && validate_workspace(given)? != workspace
    {
        return Err(Failure::usage(format!(
            "execution {} works on {}, not {}: leave --workspace out to continue it",
            continuable.execution,
            workspace.display(),
            given.display()
        )));
    }
    let provider = provider_for(&config, &continuable, args.provider.as_deref()).await?;
    let mut engine_config = recorded_engine_config(&config, &continuable.started)?;
    // The turn limit is per message: counted from where the execution stands.
    engine_config.max_turns = continuable.state.turns.saturating_add(args.max_turns);
    let image = recorded_image(&continuable.started);
    let follow = FollowUp {
        message,
        loop_type: loop_type(args.loop_type),
        recover: replay.termination_reason.is_none(),
        compact: false,
    };
    let launch = Launch {
        db,
        config: &config,
        workspace,
        provider,
        engine_config,
        image: args.image.clone().or(image),
        mode: Mode::detect(args.json || args.jsonl, args.quiet),
        jsonl: args.jsonl,
        execution_id: continuable.execution,
        start: Start::Once(Once::FollowUp(Box::new(continuable.state), follow)),
        log: None,
        cancel: None,
    };
    launch.go().await
}

/// The provider that continues an execution: `spec`, else the one it started with. A
/// `script:` cassette continues after the last answer the log recorded.
pub(crate) async fn provider_for(
    config: &Config,
    resumable: &nerve_runtime::resume::Resumable,
    spec: Option<&str>,
) -> Result<Arc<dyn Provider>, Failure> {
    let started = &resumable.started;
    let spec = spec.unwrap_or(&started.provider);
    let model = (started.model != "scripted").then_some(started.model.as_str());
    if let Some(path) = spec.strip_prefix("script:") {
        let scripted =
            nerve_brain::ScriptedProvider::from_file(Path::new(path)).map_err(Failure::usage)?;
        for (purpose, used) in &resumable.model_calls {
            scripted.skip(*purpose, *used);
        }
        return Ok(Arc::new(scripted) as Arc<dyn Provider>);
    }
    let settings = config.provider_settings(
        started
            .config
            .get("context_window")
            .and_then(serde_json::Value::as_u64),
    )?;
    nerve_runtime::provider::build(spec, model, &settings)
        .await
        .map_err(Failure::from)
}

/// The engine settings an execution recorded at its start.
pub(crate) fn recorded_engine_config(
    config: &Config,
    started: &nerve_core::event::Started,
) -> Result<EngineConfig, Failure> {
    let recorded = &started.config;
    let number = |key: &str| recorded.get(key).and_then(serde_json::Value::as_u64);
    Ok(EngineConfig {
        // The loop the execution ran: a resumed plan loop is rebuilt from the conversation
        // (a follow-up names its own loop).
        loop_type: started.loop_type,
        max_turns: started.max_turns,
        timeout: number("timeout_secs").map(Duration::from_secs),
        budget_tokens: number("budget_tokens"),
        budget_cost: recorded
            .get("budget_usd")
            .and_then(serde_json::Value::as_f64)
            .and_then(MicroUsd::from_usd),
        context_window: number("context_window"),
        recorded_config: recorded.clone(),
        ..config.engine_config()?
    })
}

pub(crate) fn recorded_image(started: &nerve_core::event::Started) -> Option<String> {
    started
        .config
        .get("image")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
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
    let config = Config::load(config_path)?;
    let resumable = nerve_runtime::resume::resumable(db, id).await?;
    nerve_runtime::resume::not_in_a_worker(db, resumable.execution).await?;
    let mut launch = resumed(db, &config, resumable, provider_spec, None).await?;
    launch.mode = Mode::detect(output != Output::Text, false);
    launch.jsonl = output == Output::Jsonl;
    launch.go().await
}

/// A resume of `resumable`, ready to launch: on the workspace its log names, or on
/// `workspace` (a worker's fresh clone of a `--git` workspace).
pub(crate) async fn resumed<'a>(
    db: &'a Path,
    config: &'a Config,
    resumable: nerve_runtime::resume::Resumable,
    provider_spec: Option<&str>,
    workspace: Option<PathBuf>,
) -> Result<Launch<'a>, Failure> {
    let workspace = validate_workspace(
        workspace
            .as_deref()
            .unwrap_or_else(|| Path::new(&resumable.started.workspace)),
    )?;
    let provider = provider_for(config, &resumable, provider_spec).await?;
    let engine_config = recorded_engine_config(config, &resumable.started)?;
    let image = recorded_image(&resumable.started);
    Ok(Launch {
        db,
        config,
        workspace,
        provider,
        engine_config,
        image,
        mode: Mode::detect(false, false),
        jsonl: false,
        execution_id: resumable.execution,
        start: Start::Once(Once::Resume(Box::new(resumable.state))),
        log: None,
        cancel: None,
    })
}

/// What `resume` prints on stdout (`run` says the same with `--quiet` besides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// The transcript.
    Text,
    /// `--json`: one JSON object at the end; no progress.
    Json,
    /// `--jsonl`: JSON lines as things happen (crate::jsonl), the summary last; no progress.
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

/// What a launch does once the sandbox is up: run the engine once, or hold a chat.
pub(crate) enum Start {
    Once(Once),
    /// An interactive session; `Some`: a reopened execution.
    Chat(Option<Box<nerve_runtime::resume::Resumable>>),
}

/// What differs between a fresh run, a resume and a follow-up.
pub(crate) enum Once {
    Fresh(Task),
    Resume(Box<ResumeState>),
    FollowUp(Box<ResumeState>, FollowUp),
}

/// How a launch ended: an execution's result, or a chat's exit code.
enum Ended {
    Result(Box<ExecutionResult>),
    Chat(u8),
}

/// What a chat works with once the sandbox is up: the engine wired to the log, the
/// display, and where the log is.
pub(crate) struct Session<'a> {
    pub(crate) engine: AgentEngine,
    pub(crate) display: Arc<Display>,
    pub(crate) db: &'a Path,
    pub(crate) execution_id: ExecutionId,
    pub(crate) workspace: &'a Path,
    pub(crate) context_window: Option<u64>,
}

/// Everything needed to run the engine in a sandbox, fresh or resumed.
pub(crate) struct Launch<'a> {
    pub(crate) db: &'a Path,
    pub(crate) config: &'a Config,
    pub(crate) workspace: PathBuf,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) engine_config: EngineConfig,
    pub(crate) image: Option<String>,
    pub(crate) mode: Mode,
    /// `--jsonl`: events and deltas as JSON lines (the mode is silent).
    pub(crate) jsonl: bool,
    pub(crate) execution_id: ExecutionId,
    pub(crate) start: Start,
    /// A log opened already (a worker shares one among its executions); `db` otherwise.
    pub(crate) log: Option<Arc<dyn nerve_runtime::log::Log>>,
    /// Cancelled by the caller (a draining worker) instead of by Ctrl-C.
    pub(crate) cancel: Option<CancellationToken>,
}

impl Launch<'_> {
    /// Launches, reports on stdout as the mode says, and returns the exit code.
    pub(crate) async fn go(self) -> Result<u8, Failure> {
        let db = self.db;
        let jsonl = self.jsonl;
        let (result, display) = match self.launch().await? {
            (Ended::Result(result), display) => (result, display),
            (Ended::Chat(code), _) => return Ok(code),
        };
        report(&result, &display, db, jsonl);
        Ok(
            if result.termination_reason == nerve_core::TerminationReason::Completed {
                0
            } else {
                1
            },
        )
    }

    /// Runs the engine once in a fresh sandbox and removes the sandbox afterwards (a
    /// worker: it reports on its own).
    pub(crate) async fn execute(self) -> Result<ExecutionResult, Failure> {
        match self.launch().await? {
            (Ended::Result(result), _) => Ok(*result),
            (Ended::Chat(_), _) => Err(Failure::usage("a chat cannot run unattended")),
        }
    }

    async fn launch(self) -> Result<(Ended, Arc<Display>), Failure> {
        // The proxy's rules and secrets are read before anything starts; its secrets are
        // registered with the redactor, so the log scrubs them too.
        let proxy = self.config.proxy.build(&|name| std::env::var(name).ok())?;
        let redactor = Arc::new(build_redactor(&proxy.secrets)?);

        let docker = nerve_hands::connect_docker()
            .await
            .map_err(Failure::usage)?;
        if let Err(error) = nerve_hands::reap_orphans(&docker).await {
            tracing::warn!(%error, "could not reap orphaned sandboxes");
        }
        let environment = crate::environment::resolve(
            &docker,
            self.image.as_deref(),
            self.config,
            &self.workspace,
            self.mode == Mode::Silent,
        )
        .await?;
        let caches = self.config.sandbox.cache_volumes(&self.workspace)?;

        // The socket exists before the container that mounts it; it serves once the log is
        // open (every decision is an event).
        let proxy = ProxyListener::bind(proxy.config).map_err(Failure::usage)?;
        let mut sandbox_config = SandboxConfig::new(
            environment.image.clone(),
            self.workspace.clone(),
            self.execution_id,
        );
        sandbox_config.proxy = Some(proxy.mount());
        // The devcontainer's `containerEnv` first, the host's variables after: both pass
        // the credential filter (with the run's secrets) before they reach the container.
        let (devcontainer_env, dropped) =
            nerve_core::filter_sandbox_env(environment.env.iter().cloned(), &redactor);
        if !dropped.is_empty() {
            tracing::warn!(
                ?dropped,
                "containerEnv variables kept out of the sandbox by the credential filter"
            );
        }
        sandbox_config.env = devcontainer_env
            .into_iter()
            .chain(sandbox_env(&redactor))
            .collect();
        sandbox_config.account_name = environment.user_name.clone();
        // Beside the log: a reboot that clears /tmp leaves a resumable execution its home.
        let homes = nerve_runtime::log::homes_dir(self.db)?;
        sandbox_config.homes = Some(homes.clone());
        sandbox_config.caches = caches;
        self.config.sandbox.apply_limits(&mut sandbox_config)?;
        let sandbox = Arc::new(
            Sandbox::start(docker, &sandbox_config)
                .await
                .map_err(|error| {
                    if let nerve_hands::HandsError::NoExecutor(reason) = &error {
                        Failure::usage(format!(
                            "the sandbox executor cannot run ({reason}): rebuild nerve (`cargo build --release -p nerve-cli` embeds one), set NERVE_EXECUTOR to a static nerve-executor (`cargo xtask image` builds one), or pass --sandbox-fallback per-call for slower per-call docker exec"
                        ))
                    } else {
                        Failure::usage(error)
                    }
                })?,
        );
        let execution_id = self.execution_id;
        let mut launch = self;
        if let Some(map) = launch.engine_config.recorded_config.as_object_mut() {
            map.insert("sandbox_image".into(), environment.record);
            map.insert(
                "sandbox_executor".into(),
                serde_json::to_value(sandbox.executor_use()).unwrap_or_default(),
            );
        }
        let outcome = launch.in_sandbox(redactor, &sandbox, proxy).await;
        if let Err(error) = sandbox.remove().await {
            tracing::warn!(%error, "could not remove the sandbox; the reaper will at the next start");
        }
        let outcome = outcome?;
        // A completed execution is never resumed: its home goes with it. Any other ending
        // keeps the home for a resume.
        if let (Ended::Result(result), _) = &outcome
            && result.termination_reason == nerve_core::TerminationReason::Completed
            && let Err(error) = nerve_hands::discard_sandbox_home(Some(&homes), execution_id)
        {
            tracing::warn!(%error, "could not remove the sandbox's home directory");
        }
        Ok(outcome)
    }

    async fn in_sandbox(
        self,
        redactor: Arc<Redactor>,
        sandbox: &Arc<Sandbox>,
        proxy: ProxyListener,
    ) -> Result<(Ended, Arc<Display>), Failure> {
        let log = match &self.log {
            Some(log) => Arc::clone(log),
            None => nerve_runtime::log::writer(self.db, Arc::clone(&redactor)).await?,
        };
        // The model table gives prices and the context window; --context-window wins.
        let model = self
            .config
            .model_table()?
            .get(self.provider.model())
            .cloned();
        let context_window = self
            .engine_config
            .context_window
            .or(model.as_ref().map(|m| m.context_window));
        let pricing = model
            .as_ref()
            .map(nerve_brain::ModelInfo::pricing)
            .unwrap_or_default();
        let display = Arc::new(Display::new(
            self.mode,
            context_window,
            Arc::clone(&redactor),
        ));
        let mut sink: Arc<dyn EventSink> =
            Arc::new(ProgressSink::new(Arc::clone(&log), Arc::clone(&display)));
        let jsonl = self
            .jsonl
            .then(|| Arc::new(crate::jsonl::Jsonl::new(Arc::clone(&redactor))));
        if let Some(jsonl) = &jsonl {
            sink = Arc::new(crate::jsonl::JsonlSink::new(Arc::clone(jsonl), sink));
        }
        // Serves until it is dropped at the end of this function, after the engine is done.
        let proxy = proxy
            .serve(Arc::clone(&sink), self.execution_id)
            .map_err(Failure::usage)?;
        let mut engine_config = self.engine_config;
        engine_config.context_window = context_window;
        engine_config.pricing = pricing;
        // Spans go through the same redactor as the log.
        engine_config.trace = nerve_brain::TraceConfig {
            capture_content: crate::telemetry::capture_content()?,
            redactor: Arc::clone(&redactor),
        };
        if let Some(map) = engine_config.recorded_config.as_object_mut() {
            map.insert(
                "container".into(),
                serde_json::json!(sandbox.container_id()),
            );
        }
        let builtin: Arc<dyn nerve_core::ToolExecutor> = Arc::new(SandboxTools::with_proxy(
            Arc::clone(sandbox),
            proxy.client(),
        ));
        // MCP servers start before the engine, so their tools are in the first turn and
        // where each runs is recorded with the run's configuration.
        let specs = self.config.mcp.specs(&redactor);
        let mcp = if specs.is_empty() {
            None
        } else {
            let tools = McpTools::start(
                Arc::clone(&builtin),
                specs,
                Some(Arc::clone(sandbox)),
                Some(self.workspace.clone()),
            )
            .await;
            let reports = tools.reports();
            for report in &reports {
                if self.mode != Mode::Silent {
                    if let Some(warning) = &report.warning {
                        output::error_line(&format!("warning: {warning}"));
                    }
                    if let Some(error) = &report.error {
                        output::error_line(&format!(
                            "warning: MCP server `{}` offers no tools: {error}",
                            report.name
                        ));
                    }
                }
            }
            if let Some(map) = engine_config.recorded_config.as_object_mut() {
                map.insert("mcp".into(), serde_json::json!(reports));
            }
            Some(Arc::new(tools))
        };
        let tools = mcp
            .clone()
            .map_or(builtin, |mcp| mcp as Arc<dyn nerve_core::ToolExecutor>);
        let mut engine = AgentEngine::new(self.provider, tools, sink, engine_config);
        // Compaction archives into the log, so `recall` survives a crash and a resume.
        engine.archive = Arc::clone(&log) as Arc<dyn nerve_core::ContextArchive>;
        engine.deltas = match jsonl {
            Some(jsonl) => jsonl,
            None => Arc::clone(&display) as Arc<dyn nerve_brain::DeltaObserver>,
        };
        let id = self.execution_id;
        // Snapshots of the workspace at turn boundaries (docs/checkpoints.md); without a
        // store the run goes on, and `nerve diff` has nothing for it.
        match crate::rewind::snapshots_for(self.db, id, &self.workspace).await {
            Ok(port) => engine.workspace = Some(port),
            Err(reason) if self.mode == Mode::Silent => {
                tracing::warn!(%reason, "no workspace snapshots for this run");
            }
            Err(reason) => output::error_line(&format!(
                "warning: no workspace snapshots for this run: {reason}"
            )),
        }
        let start = match self.start {
            Start::Chat(reopened) => {
                let session = Session {
                    engine,
                    display: Arc::clone(&display),
                    db: self.db,
                    execution_id: id,
                    workspace: &self.workspace,
                    context_window,
                };
                let code = crate::chat::converse(session, reopened).await?;
                return Ok((Ended::Chat(code), display));
            }
            Start::Once(start) => start,
        };
        if let Once::Resume(state) | Once::FollowUp(state, _) = &start {
            display.seed(crate::progress::Status {
                turn: state.turns,
                usage: state.usage,
                cost: state.cost,
                ..crate::progress::Status::default()
            });
        }
        display.lines(&[(
            Style::Dim,
            match &start {
                Once::Fresh(_) => format!("execution {id} · {}", self.workspace.display()),
                Once::Resume(state) => {
                    format!("resuming execution {id} after turn {}", state.turns)
                }
                Once::FollowUp(state, _) => {
                    format!("continuing execution {id} after turn {}", state.turns)
                }
            },
        )]);
        let (cancel, watcher) = match self.cancel {
            Some(cancel) => (cancel, None),
            None => {
                let cancel = CancellationToken::new();
                let watcher = tokio::spawn(watch_interrupts(cancel.clone(), Arc::clone(&display)));
                (cancel, Some(watcher))
            }
        };
        let result = match start {
            Once::Fresh(task) => engine.run(id, task, cancel).await,
            Once::Resume(state) => engine.resume(id, *state, cancel).await,
            Once::FollowUp(state, follow) => engine.follow_up(id, *state, follow, cancel).await,
        }
        .map_err(Failure::usage);
        if let Some(watcher) = watcher {
            watcher.abort();
        }
        if let Some(mcp) = mcp {
            mcp.shutdown().await;
        }
        Ok((Ended::Result(Box::new(result?)), display))
    }
}

/// First Ctrl-C: stop at the next turn boundary. Second: abort at once.
async fn watch_interrupts(cancel: CancellationToken, display: Arc<Display>) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    let note = "nerve: stopping at the next turn boundary (Ctrl-C again to abort)";
    if display.mode() == Mode::Live {
        // Above the status line, not through it.
        display.lines(&[(Style::Note, format!("· {note}"))]);
    } else {
        output::error_line(note);
    }
    cancel.cancel();
    if tokio::signal::ctrl_c().await.is_ok() {
        output::error_line("nerve: aborted");
        std::process::exit(130);
    }
}

pub(crate) fn validate_workspace(path: &Path) -> Result<PathBuf, Failure> {
    let resolved = std::fs::canonicalize(path).map_err(|e| {
        Failure::usage(format!("workspace {}: {}", path.display(), describe_io(&e)))
    })?;
    if !resolved.is_dir() {
        return Err(Failure::usage(format!(
            "workspace {} is not a directory",
            path.display()
        )));
    }
    Ok(resolved)
}

pub(crate) fn read_task(args: &RunArgs) -> Result<String, Failure> {
    let text = match (&args.task, &args.task_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => std::fs::read_to_string(file).map_err(|e| {
            Failure::usage(format!("task file {}: {}", file.display(), describe_io(&e)))
        })?,
        (None, None) => {
            return Err(Failure::usage(
                "give the task with --task TEXT or --task-file FILE",
            ));
        }
    };
    if text.trim().is_empty() {
        return Err(Failure::usage("the task is empty"));
    }
    Ok(text)
}

/// The redactor every run with `config` uses (a worker opens its shared log with it).
pub(crate) fn config_redactor(config: &Config) -> Result<Arc<Redactor>, Failure> {
    let proxy = config.proxy.build(&|name| std::env::var(name).ok())?;
    Ok(Arc::new(build_redactor(&proxy.secrets)?))
}

/// The redactor of the run: the provider keys found in the environment and the proxy's
/// secrets (labelled with their credential's name).
fn build_redactor(proxy_secrets: &[(String, SecretString)]) -> Result<Redactor, Failure> {
    let mut secrets: Vec<(&str, SecretString)> = PROVIDER_KEY_VARS
        .iter()
        .filter_map(|name| {
            std::env::var(name)
                .ok()
                .filter(|v| v.len() >= nerve_core::redact::MIN_SECRET_LEN)
                .map(|v| (*name, SecretString::from(v)))
        })
        .collect();
    secrets.extend(
        proxy_secrets
            .iter()
            .map(|(name, secret)| (name.as_str(), secret.clone())),
    );
    Redactor::with_secrets(secrets.iter().map(|(name, secret)| (*name, secret)))
        .map_err(Failure::usage)
}

/// The few host variables a sandbox gets, through the credential filter: a name that looks
/// like a credential, or a value holding a registered secret or a token, stays out.
fn sandbox_env(redactor: &Redactor) -> Vec<(String, String)> {
    let vars = SANDBOX_ENV_VARS
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| ((*name).to_owned(), v)));
    let (kept, dropped) = nerve_core::filter_sandbox_env(vars, redactor);
    if !dropped.is_empty() {
        tracing::warn!(
            ?dropped,
            "host variables kept out of the sandbox by the credential filter"
        );
    }
    kept
}

fn describe_io(error: &std::io::Error) -> String {
    // An if-chain, not a match: io::ErrorKind is non-exhaustive.
    if error.kind() == std::io::ErrorKind::NotFound {
        "does not exist".to_owned()
    } else if error.kind() == std::io::ErrorKind::PermissionDenied {
        "permission denied".to_owned()
    } else {
        error.to_string()
    }
}

fn report(result: &ExecutionResult, display: &Display, db: &Path, jsonl: bool) {
    let ctx = &result.context;
    let mode = display.mode();
    if mode == Mode::Silent {
        let summary = serde_json::json!({
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
            crate::jsonl::summary_line(&summary)
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
    display.lines(&ending(result, db));
}

/// The end of the transcript: how the execution ended, its totals, the error of a failed
/// run, where the log is and what to try next.
pub(crate) fn ending(result: &ExecutionResult, db: &Path) -> Vec<Line> {
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
    lines.extend(next_steps(id, db));
    lines
}

/// Where the log is and three commands to try next.
pub(crate) fn next_steps(id: ExecutionId, db: &Path) -> Vec<Line> {
    let db_flag = if nerve_runtime::log::default_db().is_ok_and(|default| default == db) {
        String::new()
    } else {
        format!("--db {} ", db.display())
    };
    let mut lines = vec![
        (
            Style::Dim,
            format!("log: execution {id} in {}", db.display()),
        ),
        (Style::Dim, "next:".to_owned()),
    ];
    for (command, what) in [
        ("show", "the transcript"),
        ("replay", "completeness and gaps"),
        ("chat", "talk to the agent about it"),
    ] {
        lines.push((
            Style::Dim,
            format!("  nerve {db_flag}{command:<6} {id}   {what}"),
        ));
    }
    lines
}
