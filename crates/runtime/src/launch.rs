//! Putting an execution together before anything runs: a fresh task, a resume, a person's
//! next message (`run --continue`, `chat ID`) or a new conversation each become a
//! [`Launch`] (the workspace, the provider, the engine's settings, the image, the proxy's
//! rules and the redactor) and, for a run, the [`Start`] the engine takes. Everything here
//! is checked before the sandbox starts or the log is opened: a launch that never started
//! writes nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nerve_brain::{EngineConfig, FollowUp, Provider, ResumeState, Task};
use nerve_core::{Complexity, ExecutionId, LoopType, MicroUsd, Redactor, TaskId, TaskStatus};
use nerve_hands::proxy::ProxyConfig;
use secrecy::SecretString;

use crate::RuntimeError;
use crate::config::Config;
pub use crate::environment::validate_workspace;
pub use crate::error::describe_io;
use crate::resume::Resumable;

/// Environment variables whose values are registered with the redactor when set.
const PROVIDER_KEY_VARS: &[&str] = &["OPENAI_API_KEY", "ANTHROPIC_API_KEY"];

/// The provider a front end gets when it names none.
pub const DEFAULT_PROVIDER: &str = "openai";

/// What a fresh execution is asked to do: `nerve run`'s options, a submission's spec.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    /// The directory the agent works on (checked again here).
    pub workspace: PathBuf,
    /// The task's text.
    pub task: String,
    /// `script:PATH`, `openai` or `anthropic`.
    pub provider: String,
    pub model: Option<String>,
    pub loop_type: LoopType,
    pub complexity: Option<Complexity>,
    pub max_turns: u32,
    pub timeout_secs: Option<u64>,
    pub budget_usd: Option<f64>,
    pub budget_tokens: Option<u64>,
    pub context_window: Option<u64>,
    pub image: Option<String>,
    /// Give the model the project's instructions (`AGENTS.md`) and the user's
    /// (`--no-project-instructions` says no).
    pub project_instructions: bool,
}

/// A person's next message to an execution that ended (`run --continue ID`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContinueRequest {
    pub message: String,
    /// The workspace the front end was given, if any: it must be the execution's own.
    pub workspace: Option<PathBuf>,
    /// The provider spec; the one the execution started with when `None`.
    pub provider: Option<String>,
    pub loop_type: LoopType,
    /// Turns for this message, counted from where the execution stands.
    pub max_turns: u32,
    pub image: Option<String>,
}

/// A conversation's settings (`nerve chat`): a new execution, or a reopened one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRequest {
    /// A new conversation's workspace; a reopened one keeps its own (this may only repeat it).
    pub workspace: Option<PathBuf>,
    pub provider: Option<String>,
    pub model: Option<String>,
    /// Turns per message.
    pub max_turns: u32,
    pub context_window: Option<u64>,
    pub image: Option<String>,
    /// As [`RunRequest::project_instructions`], for a new conversation.
    pub project_instructions: bool,
}

/// An MCP server a front end brings for one execution beside the configured ones (an
/// editor's `mcpServers` in ACP's `session/new`): a stdio server, run in the sandbox like a
/// configured server with the default trust, its environment given by value and passed
/// through the credential filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientMcpServer {
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// What the engine does once the sandbox is up, for a run that is not a conversation.
#[derive(Debug)]
pub enum Start {
    Fresh(Task),
    Resume(Box<ResumeState>),
    FollowUp(Box<ResumeState>, FollowUp),
}

/// Everything needed to run the engine in a sandbox, checked and ready:
/// [`Launch::open`](crate::session) starts the sandbox and opens the log.
pub struct Launch<'a> {
    pub db: &'a Path,
    pub config: &'a Config,
    pub workspace: PathBuf,
    pub provider: Arc<dyn Provider>,
    pub engine_config: EngineConfig,
    pub image: Option<String>,
    pub execution_id: ExecutionId,
    /// A log opened already (a worker shares one among its executions); `db` otherwise.
    pub log: Option<Arc<dyn crate::log::Log>>,
    /// Whether the engine's spans may carry message content (through the redactor).
    pub capture_content: bool,
    /// MCP servers the front end adds to the configured ones for this execution.
    pub client_mcp: Vec<ClientMcpServer>,
    /// The proxy's rules, with their secrets read.
    pub(crate) proxy: ProxyConfig,
    /// The provider keys and the proxy's secrets: the log, the spans and every front end
    /// that shows what the execution does redact with it.
    pub(crate) redactor: Arc<Redactor>,
}

impl std::fmt::Debug for Launch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launch")
            .field("db", &self.db)
            .field("workspace", &self.workspace)
            .field("provider", &self.provider.name())
            .field("model", &self.provider.model())
            .field("image", &self.image)
            .field("execution_id", &self.execution_id)
            .finish_non_exhaustive()
    }
}

impl<'a> Launch<'a> {
    /// A launch of `execution_id`; the proxy's secrets are read here, and registered with
    /// the redactor so that the log scrubs them too.
    pub fn new(
        db: &'a Path,
        config: &'a Config,
        workspace: PathBuf,
        provider: Arc<dyn Provider>,
        engine_config: EngineConfig,
        image: Option<String>,
        execution_id: ExecutionId,
    ) -> Result<Self, RuntimeError> {
        let proxy = config.proxy.build(&|name| std::env::var(name).ok())?;
        let redactor = Arc::new(build_redactor(&proxy.secrets)?);
        Ok(Self {
            db,
            config,
            workspace,
            provider,
            engine_config,
            image,
            execution_id,
            log: None,
            capture_content: false,
            client_mcp: Vec::new(),
            proxy: proxy.config,
            redactor,
        })
    }

    /// The redactor of this execution: what a front end shows goes through it, as what the
    /// log keeps does.
    pub fn redactor(&self) -> &Arc<Redactor> {
        &self.redactor
    }

    /// The model's context window: the one asked for, else the model table's.
    pub fn context_window(&self) -> Result<Option<u64>, RuntimeError> {
        Ok(self.engine_config.context_window.or(self
            .config
            .model_table()?
            .get(self.provider.model())
            .map(|m| m.context_window)))
    }
}

/// A fresh execution of `request` as `execution_id`, checked and ready to launch (`run`,
/// and a worker taking up a submitted execution).
pub async fn fresh<'a>(
    request: &RunRequest,
    db: &'a Path,
    config: &'a Config,
    execution_id: ExecutionId,
) -> Result<(Launch<'a>, Start), RuntimeError> {
    let workspace = validate_workspace(&request.workspace)?;
    let context_window = request.context_window.or(config.context_window);
    let provider = crate::provider::build(
        &request.provider,
        request.model.as_deref(),
        &config.provider_settings(context_window)?,
    )
    .await?;
    let budget_cost = request
        .budget_usd
        .map(|usd| {
            MicroUsd::from_usd(usd).ok_or_else(|| {
                RuntimeError::usage(format!("--budget-usd {usd} is not a dollar amount"))
            })
        })
        .transpose()?;
    let mut engine_config = EngineConfig {
        loop_type: request.loop_type,
        complexity: request.complexity,
        max_turns: request.max_turns,
        timeout: request.timeout_secs.map(Duration::from_secs),
        budget_tokens: request.budget_tokens,
        budget_cost,
        context_window,
        recorded_config: serde_json::json!({
            "max_turns": request.max_turns,
            "timeout_secs": request.timeout_secs,
            "budget_tokens": request.budget_tokens,
            "budget_usd": request.budget_usd,
            "context_window": context_window,
            "complexity": request.complexity,
            "image": request.image,
        }),
        instructions: crate::instructions::config(request.project_instructions)?,
        ..config.engine_config()?
    };
    record_habits(
        &mut engine_config.recorded_config,
        request.project_instructions,
        config,
    );
    let task = Task {
        id: TaskId::new(),
        description: request.task.clone(),
        metadata: serde_json::Value::Null,
        status: TaskStatus::Created,
        workspace: workspace.display().to_string(),
    };
    let launch = Launch::new(
        db,
        config,
        workspace,
        provider,
        engine_config,
        request.image.clone(),
        execution_id,
    )?;
    Ok((launch, Start::Fresh(task)))
}

/// `run --continue ID`: the message is the next of execution `id`, which runs again in a
/// fresh sandbox on its workspace (a headless conversation).
pub async fn continued<'a>(
    request: ContinueRequest,
    db: &'a Path,
    config: &'a Config,
    id: &str,
) -> Result<(Launch<'a>, Start), RuntimeError> {
    let (continuable, replay) = crate::resume::continuable(db, id).await?;
    let workspace = own_workspace(&continuable, request.workspace.as_deref(), "continue")?;
    // The turn limit is per message: counted from where the execution stands.
    let max_turns = continuable.state.turns.saturating_add(request.max_turns);
    let launch = continuing(
        db,
        config,
        &continuable,
        workspace,
        request.provider.as_deref(),
        request.image,
        |engine| engine.max_turns = max_turns,
    )
    .await?;
    let follow = FollowUp {
        message: request.message,
        loop_type: request.loop_type,
        recover: replay.termination_reason.is_none(),
        compact: false,
    };
    Ok((launch, Start::FollowUp(Box::new(continuable.state), follow)))
}

/// A resume of `resumable`, ready to launch: on the workspace its log names, or on
/// `workspace` (a worker's fresh clone of a `--git` workspace).
pub async fn resumed<'a>(
    db: &'a Path,
    config: &'a Config,
    resumable: Resumable,
    provider_spec: Option<&str>,
    workspace: Option<PathBuf>,
) -> Result<(Launch<'a>, Start), RuntimeError> {
    let workspace = validate_workspace(
        workspace
            .as_deref()
            .unwrap_or_else(|| Path::new(&resumable.started.workspace)),
    )?;
    let launch = continuing(
        db,
        config,
        &resumable,
        workspace,
        provider_spec,
        None,
        |_| {},
    )
    .await?;
    Ok((launch, Start::Resume(Box::new(resumable.state))))
}

/// `nerve chat ID`: a conversation on execution `id` again, in a fresh sandbox on its
/// workspace. Returns the execution as its log left it, for the conversation's header.
pub async fn reopened<'a>(
    request: &ChatRequest,
    db: &'a Path,
    config: &'a Config,
    id: &str,
) -> Result<(Launch<'a>, Resumable), RuntimeError> {
    let (resumable, _) = crate::resume::continuable(db, id).await?;
    let workspace = own_workspace(&resumable, request.workspace.as_deref(), "reopen")?;
    let launch = continuing(
        db,
        config,
        &resumable,
        workspace,
        request.provider.as_deref(),
        request.image.clone(),
        |engine| {
            engine.max_turns = request.max_turns;
            if request.context_window.is_some() {
                engine.context_window = request.context_window;
            }
        },
    )
    .await?;
    Ok((launch, resumable))
}

/// The launch that continues `resumable` on `workspace`: with the provider it started
/// with (or `provider_spec`), the engine settings it recorded (`adjust` lays a request's
/// own over them) and the image it recorded (unless `image` names another).
async fn continuing<'a>(
    db: &'a Path,
    config: &'a Config,
    resumable: &Resumable,
    workspace: PathBuf,
    provider_spec: Option<&str>,
    image: Option<String>,
    adjust: impl FnOnce(&mut EngineConfig),
) -> Result<Launch<'a>, RuntimeError> {
    let provider = provider_for(config, resumable, provider_spec).await?;
    let mut engine_config = recorded_engine_config(config, &resumable.started)?;
    adjust(&mut engine_config);
    let image = image.or_else(|| recorded_image(&resumable.started));
    Launch::new(
        db,
        config,
        workspace,
        provider,
        engine_config,
        image,
        resumable.execution,
    )
}

/// `nerve chat`: a new conversation on `workspace` (the front end's current directory when
/// the request names none).
pub async fn conversation<'a>(
    request: &ChatRequest,
    workspace: &Path,
    db: &'a Path,
    config: &'a Config,
) -> Result<Launch<'a>, RuntimeError> {
    let workspace = validate_workspace(workspace)?;
    let context_window = request.context_window.or(config.context_window);
    let provider = crate::provider::build(
        request
            .provider
            .as_deref()
            .or(config.provider.as_deref())
            .unwrap_or(DEFAULT_PROVIDER),
        request.model.as_deref().or(config.model.as_deref()),
        &config.provider_settings(context_window)?,
    )
    .await?;
    let mut engine_config = EngineConfig {
        max_turns: request.max_turns,
        context_window,
        recorded_config: serde_json::json!({
            "max_turns": request.max_turns,
            "context_window": context_window,
            "image": request.image,
            "chat": true,
        }),
        instructions: crate::instructions::config(request.project_instructions)?,
        ..config.engine_config()?
    };
    record_habits(
        &mut engine_config.recorded_config,
        request.project_instructions,
        config,
    );
    Launch::new(
        db,
        config,
        workspace,
        provider,
        engine_config,
        request.image.clone(),
        ExecutionId::new(),
    )
}

/// Records in the start event what differs from the defaults: project instructions turned
/// off (a resume goes on without them), and the approval mode given.
fn record_habits(recorded: &mut serde_json::Value, project_instructions: bool, config: &Config) {
    let Some(map) = recorded.as_object_mut() else {
        return;
    };
    if !project_instructions {
        map.insert("project_instructions".into(), serde_json::json!(false));
    }
    if let Some(mode) = config.approval {
        map.insert("approval".into(), serde_json::json!(mode.as_str()));
    }
}

/// The workspace `resumable` works on, which `given` (when the front end was given one)
/// may only repeat; `verb` says what the person asked (`continue`, `reopen`).
fn own_workspace(
    resumable: &Resumable,
    given: Option<&Path>,
    verb: &str,
) -> Result<PathBuf, RuntimeError> {
    let workspace = validate_workspace(Path::new(&resumable.started.workspace))?;
    if let Some(given) = given
        && validate_workspace(given)? != workspace
    {
        return Err(RuntimeError::usage(format!(
            "execution {} works on {}, not {}: leave --workspace out to {verb} it",
            resumable.execution,
            workspace.display(),
            given.display()
        )));
    }
    Ok(workspace)
}

/// The provider that continues an execution: `spec`, else the one it started with. A
/// `script:` cassette continues after the last answer the log recorded.
pub async fn provider_for(
    config: &Config,
    resumable: &Resumable,
    spec: Option<&str>,
) -> Result<Arc<dyn Provider>, RuntimeError> {
    let started = &resumable.started;
    let spec = spec.unwrap_or(&started.provider);
    let model = (started.model != "scripted").then_some(started.model.as_str());
    if let Some(path) = spec.strip_prefix("script:") {
        return Ok(Arc::new(scripted_for(Path::new(path), resumable)?) as Arc<dyn Provider>);
    }
    let settings = config.provider_settings(
        started
            .config
            .get("context_window")
            .and_then(serde_json::Value::as_u64),
    )?;
    crate::provider::build(spec, model, &settings).await
}

/// The cassette at `path` as `resumable` reads it on: after the lines its log recorded
/// answers of, among its own lines (a child's, a `delegate` call's, are its name's).
pub fn scripted_for(
    path: &Path,
    resumable: &Resumable,
) -> Result<nerve_brain::ScriptedProvider, RuntimeError> {
    let mut scripted =
        nerve_brain::ScriptedProvider::from_file(path).map_err(RuntimeError::provider)?;
    let started = &resumable.started;
    if started.parent.is_some()
        && let Some(agent) = started.config.get("agent").and_then(|a| a.as_str())
    {
        scripted = scripted.agent_view(agent);
    }
    for (purpose, used) in &resumable.model_calls {
        scripted.skip(*purpose, *used);
    }
    Ok(scripted)
}

/// The engine settings an execution recorded at its start.
pub fn recorded_engine_config(
    config: &Config,
    started: &nerve_core::event::Started,
) -> Result<EngineConfig, RuntimeError> {
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
        // A directory's instructions go on being given unless the start said no (the
        // user's file and the root's are in the conversation already).
        instructions: nerve_brain::run::instructions::InstructionsConfig {
            workspace: recorded
                .get("project_instructions")
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true),
            user: None,
        },
        recorded_config: recorded.clone(),
        // A child stays a child: its session narrows its tools to those its start recorded.
        lineage: nerve_brain::config::Lineage {
            parent: started.parent.clone(),
            call_id: started.call_id.clone(),
        },
        // A child may not delegate in turn, resumed or not; its tools are the ones its
        // start recorded.
        delegation: if started.parent.is_some() {
            nerve_brain::run::delegate::DelegationConfig::default()
        } else {
            config.engine_config()?.delegation
        },
        ..config.engine_config()?
    })
}

/// The image an execution recorded at its start (`--image`, when it was given one).
pub fn recorded_image(started: &nerve_core::event::Started) -> Option<String> {
    started
        .config
        .get("image")
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

/// The redactor every execution with `config` uses (a worker opens its shared log with it).
pub fn config_redactor(config: &Config) -> Result<Arc<Redactor>, RuntimeError> {
    let proxy = config.proxy.build(&|name| std::env::var(name).ok())?;
    Ok(Arc::new(build_redactor(&proxy.secrets)?))
}

/// The redactor of an execution: the provider keys found in the environment and the
/// proxy's secrets (labelled with their credential's name).
fn build_redactor(proxy_secrets: &[(String, SecretString)]) -> Result<Redactor, RuntimeError> {
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
        .map_err(RuntimeError::config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_a_directory_that_exists() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            validate_workspace(dir.path()).unwrap(),
            std::fs::canonicalize(dir.path()).unwrap()
        );
        assert_eq!(
            validate_workspace(&file),
            Err(RuntimeError::Usage(format!(
                "workspace {} is not a directory",
                file.display()
            )))
        );
        let missing = dir.path().join("missing");
        assert_eq!(
            validate_workspace(&missing),
            Err(RuntimeError::Usage(format!(
                "workspace {}: does not exist",
                missing.display()
            )))
        );
    }

    fn started(config: serde_json::Value) -> nerve_core::event::Started {
        nerve_core::event::Started {
            task_id: TaskId::new(),
            task: "t".into(),
            workspace: "/w".into(),
            loop_type: LoopType::PlanExecute,
            provider: "openai".into(),
            model: "m".into(),
            max_turns: 7,
            config,
            parent: None,
            call_id: None,
            fork: None,
        }
    }

    #[test]
    fn a_resume_takes_the_settings_the_execution_recorded() {
        let recorded = serde_json::json!({
            "timeout_secs": 60,
            "budget_tokens": 1000,
            "budget_usd": 0.5,
            "context_window": 8192,
            "image": "img:1",
        });
        let engine =
            recorded_engine_config(&Config::default(), &started(recorded.clone())).unwrap();
        assert_eq!(
            (
                engine.loop_type,
                engine.max_turns,
                engine.timeout,
                engine.budget_tokens,
                engine.budget_cost,
                engine.context_window
            ),
            (
                LoopType::PlanExecute,
                7,
                Some(Duration::from_secs(60)),
                Some(1000),
                MicroUsd::from_usd(0.5),
                Some(8192)
            )
        );
        assert_eq!(engine.recorded_config, recorded);
        assert_eq!(recorded_image(&started(recorded)).as_deref(), Some("img:1"));
        assert_eq!(recorded_image(&started(serde_json::Value::Null)), None);
    }
}
