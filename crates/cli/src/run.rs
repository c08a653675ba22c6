//! `nerve run`: validate every input first, then start the sandbox, open the log and run
//! the engine. A run that never started writes nothing to the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nerve_brain::{AgentEngine, EngineConfig, ExecutionResult, Provider, ResumeState, Task};
use nerve_core::{
    Complexity, EventSink, ExecutionId, LoopType, MicroUsd, Redactor, TaskId, TaskStatus,
};
use nerve_hands::{
    DEFAULT_IMAGE, ImageSource, ProxyListener, Sandbox, SandboxConfig, SandboxTools,
};
use secrecy::SecretString;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::args::{ComplexityArg, LoopArg, RunArgs};
use crate::config::Config;
use crate::output;
use crate::progress::{Mode, ProgressSink};

/// Environment variables whose values are registered with the redactor when set.
const PROVIDER_KEY_VARS: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// Host variables passed into the sandbox when set, after the credential filter.
const SANDBOX_ENV_VARS: &[&str] = &["LANG", "LC_ALL", "TZ"];

pub(crate) async fn run(
    args: RunArgs,
    db: &Path,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    let config = Config::load(config_path)?;
    let workspace = validate_workspace(&args.workspace)?;
    let description = read_task(&args)?;
    let provider = crate::provider::build(
        &args.provider,
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
    let loop_type = match args.loop_type {
        LoopArg::React => LoopType::React,
        LoopArg::PlanExecute => LoopType::PlanExecute,
        LoopArg::Hybrid => LoopType::Hybrid,
        LoopArg::Auto => LoopType::Auto,
    };
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
    let launch = Launch {
        db,
        config: &config,
        workspace,
        provider,
        engine_config,
        image: args.image.clone(),
        output: Output::from_flags(args.json, args.jsonl),
        execution_id: ExecutionId::new(),
        start: Start::Fresh(task),
    };
    launch.go().await
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
    let resumable = crate::resume::resumable(db, id)?;
    let started = &resumable.started;
    let workspace = validate_workspace(Path::new(&started.workspace))?;
    let spec = provider_spec.unwrap_or(&started.provider);
    let model = (started.model != "scripted").then_some(started.model.as_str());
    let provider = if let Some(path) = spec.strip_prefix("script:") {
        // A resumed scripted run continues after the last response its log recorded.
        let scripted =
            nerve_brain::ScriptedProvider::from_file(Path::new(path)).map_err(Failure::usage)?;
        for (purpose, used) in &resumable.model_calls {
            scripted.skip(*purpose, *used);
        }
        Arc::new(scripted) as Arc<dyn Provider>
    } else {
        let settings = config.provider_settings(
            started
                .config
                .get("context_window")
                .and_then(serde_json::Value::as_u64),
        )?;
        crate::provider::build(spec, model, &settings).await?
    };
    let recorded = &started.config;
    let number = |key: &str| recorded.get(key).and_then(serde_json::Value::as_u64);
    let engine_config = EngineConfig {
        // The loop the execution ran: a plan loop is rebuilt from the conversation.
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
    };
    let image = recorded
        .get("image")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned);
    let launch = Launch {
        db,
        config: &config,
        workspace,
        provider,
        engine_config,
        image,
        output,
        execution_id: resumable.execution,
        start: Start::Resume(Box::new(resumable.state)),
    };
    launch.go().await
}

/// What `run` and `resume` print on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// A line of text at the end; progress on stderr.
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

    /// Whether stdout carries JSON only (no progress, no notes).
    fn is_json(self) -> bool {
        self != Self::Text
    }
}

/// What differs between a fresh run and a resume.
enum Start {
    Fresh(Task),
    Resume(Box<ResumeState>),
}

/// Everything needed to run the engine in a sandbox, fresh or resumed.
struct Launch<'a> {
    db: &'a Path,
    config: &'a Config,
    workspace: PathBuf,
    provider: Arc<dyn Provider>,
    engine_config: EngineConfig,
    image: Option<String>,
    output: Output,
    execution_id: ExecutionId,
    start: Start,
}

impl Launch<'_> {
    async fn go(self) -> Result<u8, Failure> {
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
        let image = self
            .image
            .clone()
            .or(self.config.sandbox.image.clone())
            .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
        if image == DEFAULT_IMAGE
            && !nerve_hands::image_exists(&docker, &image)
                .await
                .map_err(Failure::usage)?
        {
            if !self.output.is_json() {
                output::error_line(&format!("building the sandbox image {image} (once)"));
            }
            let source = self
                .config
                .sandbox
                .busybox
                .clone()
                .map_or_else(ImageSource::default, |busybox| ImageSource { busybox });
            nerve_hands::build_default_image(&docker, &source, &image)
                .await
                .map_err(Failure::usage)?;
        }

        // The socket exists before the container that mounts it; it serves once the log is
        // open (every decision is an event).
        let proxy = ProxyListener::bind(proxy.config).map_err(Failure::usage)?;
        let mut sandbox_config =
            SandboxConfig::new(image, self.workspace.clone(), self.execution_id);
        sandbox_config.proxy = Some(proxy.mount());
        sandbox_config.env = sandbox_env(&redactor);
        self.config.sandbox.apply_limits(&mut sandbox_config)?;
        let sandbox = Arc::new(
            Sandbox::start(docker, &sandbox_config)
                .await
                .map_err(Failure::usage)?,
        );
        let mode = self.output;
        let execution_id = self.execution_id;
        let outcome = self.in_sandbox(redactor, &sandbox, proxy).await;
        if let Err(error) = sandbox.remove().await {
            tracing::warn!(%error, "could not remove the sandbox; the reaper will at the next start");
        }
        let result = outcome?;
        // A completed execution is never resumed: its home goes with it. Any other ending
        // keeps the home for a resume.
        if result.termination_reason == nerve_core::TerminationReason::Completed
            && let Err(error) = nerve_hands::discard_sandbox_home(execution_id)
        {
            tracing::warn!(%error, "could not remove the sandbox's home directory");
        }
        report(&result, mode);
        Ok(
            if result.termination_reason == nerve_core::TerminationReason::Completed {
                0
            } else {
                1
            },
        )
    }

    async fn in_sandbox(
        self,
        redactor: Arc<Redactor>,
        sandbox: &Arc<Sandbox>,
        proxy: ProxyListener,
    ) -> Result<ExecutionResult, Failure> {
        let log = crate::log::writer(self.db, Arc::clone(&redactor)).await?;
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
        let progress = Arc::new(ProgressSink::new(
            Arc::clone(&log),
            Mode::detect(self.output.is_json()),
            context_window,
        ));
        let mut sink: Arc<dyn EventSink> = Arc::clone(&progress) as Arc<dyn EventSink>;
        let jsonl = (self.output == Output::Jsonl)
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
        let mut engine = AgentEngine::new(
            self.provider,
            Arc::new(SandboxTools::with_proxy(
                Arc::clone(sandbox),
                proxy.client(),
            )),
            sink,
            engine_config,
        );
        // Compaction archives into the log, so `recall` survives a crash and a resume.
        engine.archive = Arc::clone(&log) as Arc<dyn nerve_core::ContextArchive>;
        if let Some(jsonl) = jsonl {
            engine.deltas = jsonl;
        }
        if !self.output.is_json() {
            output::error_line(&format!("execution {}", self.execution_id));
        }
        let cancel = CancellationToken::new();
        let watcher = tokio::spawn(watch_interrupts(cancel.clone()));
        let result = match self.start {
            Start::Fresh(task) => engine.run(self.execution_id, task, cancel).await,
            Start::Resume(state) => engine.resume(self.execution_id, *state, cancel).await,
        }
        .map_err(Failure::usage);
        watcher.abort();
        progress.finish();
        result
    }
}

/// First Ctrl-C: stop at the next turn boundary. Second: abort at once.
async fn watch_interrupts(cancel: CancellationToken) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    output::error_line("nerve: stopping at the next turn boundary (Ctrl-C again to abort)");
    cancel.cancel();
    if tokio::signal::ctrl_c().await.is_ok() {
        output::error_line("nerve: aborted");
        std::process::exit(130);
    }
}

fn validate_workspace(path: &Path) -> Result<PathBuf, Failure> {
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

fn read_task(args: &RunArgs) -> Result<String, Failure> {
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

fn report(result: &ExecutionResult, mode: Output) {
    let ctx = &result.context;
    if mode.is_json() {
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
        output::json(&match mode {
            Output::Jsonl => crate::jsonl::summary_line(&summary),
            Output::Json | Output::Text => summary,
        });
    } else {
        output::line(&format!(
            "{}: {} after {} turns ({} in / {} out tokens, {}), task {}{}",
            ctx.execution_id,
            result.termination_reason,
            ctx.turn_count(),
            ctx.usage.input_tokens,
            ctx.usage.output_tokens,
            ctx.cost,
            ctx.task_status,
            result
                .error
                .as_ref()
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        ));
    }
}
