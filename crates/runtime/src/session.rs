//! An execution's sandbox, up: [`Launch::open`] reaps orphans, resolves (and builds) the
//! image, binds the auth proxy, starts the sandbox, opens the log and wires the engine to
//! it (pricing, the context window, MCP servers, workspace snapshots, the observer); a
//! [`Session`] then runs the engine once ([`Session::run`]) or once per message of a
//! conversation ([`Session::send`]); [`Session::close`] removes the sandbox.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_brain::{AgentEngine, ExecutionResult, FollowUp, Task};
use nerve_core::{EventSink, ExecutionId, LoopType, Redactor, TaskId, TaskStatus};
use nerve_hands::Proxy;
use nerve_hands::mcp::McpTools;
use nerve_hands::{ProxyListener, Sandbox, SandboxConfig, SandboxTools};
use tokio_util::sync::CancellationToken;

use crate::RuntimeError;
use crate::launch::{Launch, Start};
use crate::observer::{Ears, Notice, ObservedSink, Observer};

/// Host variables passed into the sandbox when set, after the credential filter.
const SANDBOX_ENV_VARS: &[&str] = &["LANG", "LC_ALL", "TZ"];

/// An execution's sandbox with the engine wired to it and to the log. Dropping it without
/// [`Session::close`] leaves the container to the reaper.
pub struct Session {
    engine: AgentEngine,
    execution_id: ExecutionId,
    workspace: PathBuf,
    db: PathBuf,
    context_window: Option<u64>,
    /// Turns per message of a conversation: the launch's turn limit.
    per_message_turns: u32,
    sandbox: Arc<Sandbox>,
    /// Serves the sandbox's requests until the session closes.
    proxy: Proxy,
    mcp: Option<Arc<McpTools>>,
    homes: PathBuf,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("execution_id", &self.execution_id)
            .field("workspace", &self.workspace)
            .field("container", &self.sandbox.container_id())
            .finish_non_exhaustive()
    }
}

impl Launch<'_> {
    /// Opens the session: the sandbox up, the log open, the engine wired; `observer` hears
    /// the image build and, from then on, every event, delta and approval. A failure
    /// removes whatever was started.
    pub async fn open(self, observer: Arc<dyn Observer>) -> Result<Session, RuntimeError> {
        let docker = nerve_hands::connect_docker()
            .await
            .map_err(RuntimeError::sandbox)?;
        if let Err(error) = nerve_hands::reap_orphans(&docker).await {
            tracing::warn!(%error, "could not reap orphaned sandboxes");
        }
        let environment = crate::environment::resolve(
            &docker,
            self.image.as_deref(),
            self.config,
            &self.workspace,
            observer.as_ref(),
        )
        .await?;
        let caches = self.config.sandbox.cache_volumes(&self.workspace)?;

        // The socket exists before the container that mounts it; it serves once the log is
        // open (every decision is an event).
        let proxy = ProxyListener::bind(self.proxy.clone()).map_err(RuntimeError::sandbox)?;
        let mut sandbox_config = SandboxConfig::new(
            environment.image.clone(),
            self.workspace.clone(),
            self.execution_id,
        );
        sandbox_config.proxy = Some(proxy.mount());
        // The devcontainer's `containerEnv` first, the host's variables after: both pass
        // the credential filter (with the run's secrets) before they reach the container.
        let (devcontainer_env, dropped) =
            nerve_core::filter_sandbox_env(environment.env.iter().cloned(), &self.redactor);
        if !dropped.is_empty() {
            tracing::warn!(
                ?dropped,
                "containerEnv variables kept out of the sandbox by the credential filter"
            );
        }
        sandbox_config.env = devcontainer_env
            .into_iter()
            .chain(sandbox_env(&self.redactor))
            .collect();
        sandbox_config.account_name = environment.user_name.clone();
        // Beside the log: a reboot that clears /tmp leaves a resumable execution its home.
        let homes = crate::log::homes_dir(self.db)?;
        sandbox_config.homes = Some(homes.clone());
        sandbox_config.caches = caches;
        self.config.sandbox.apply_limits(&mut sandbox_config)?;
        let sandbox = Arc::new(
            Sandbox::start(docker, &sandbox_config)
                .await
                .map_err(|error| {
                    if let nerve_hands::HandsError::NoExecutor(reason) = &error {
                        RuntimeError::sandbox(format!(
                            "the sandbox executor cannot run ({reason}): rebuild nerve (`cargo build --release -p nerve-cli` embeds one), set NERVE_EXECUTOR to a static nerve-executor (`cargo xtask image` builds one), or pass --sandbox-fallback per-call for slower per-call docker exec"
                        ))
                    } else {
                        RuntimeError::sandbox(error)
                    }
                })?,
        );
        let mut launch = self;
        if let Some(map) = launch.engine_config.recorded_config.as_object_mut() {
            map.insert("sandbox_image".into(), environment.record);
            map.insert(
                "sandbox_executor".into(),
                serde_json::to_value(sandbox.executor_use()).unwrap_or_default(),
            );
        }
        match launch.wire(&sandbox, proxy, homes, observer).await {
            Ok(session) => Ok(session),
            Err(error) => {
                remove(&sandbox).await;
                Err(error)
            }
        }
    }

    /// The log, the engine and its ports, on the started sandbox.
    async fn wire(
        self,
        sandbox: &Arc<Sandbox>,
        proxy: ProxyListener,
        homes: PathBuf,
        observer: Arc<dyn Observer>,
    ) -> Result<Session, RuntimeError> {
        let redactor = Arc::clone(&self.redactor);
        let log = match &self.log {
            Some(log) => Arc::clone(log),
            None => crate::log::writer(self.db, Arc::clone(&redactor)).await?,
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
        let sink: Arc<dyn EventSink> = Arc::new(ObservedSink {
            observer: Arc::clone(&observer),
            inner: Arc::clone(&log) as Arc<dyn EventSink>,
        });
        let proxy = proxy
            .serve(Arc::clone(&sink), self.execution_id)
            .map_err(RuntimeError::sandbox)?;
        let mut engine_config = self.engine_config;
        engine_config.context_window = context_window;
        let skills = crate::skills::discover(&self.workspace);
        for (path, reason) in skills.skipped {
            observer.notice(Notice::SkillSkipped { path, reason });
        }
        engine_config.skills = skills.skills;
        engine_config.delegation.workspace = self.workspace.display().to_string();
        engine_config.pricing = pricing;
        // Spans go through the same redactor as the log.
        engine_config.trace = nerve_brain::TraceConfig {
            capture_content: self.capture_content,
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
        let mut specs = self.config.mcp.specs(&redactor);
        specs.extend(
            self.client_mcp
                .iter()
                .map(|server| client_spec(server, &redactor)),
        );
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
                if let Some(warning) = &report.warning {
                    observer.notice(Notice::McpWarning(warning.clone()));
                }
                if let Some(error) = &report.error {
                    observer.notice(Notice::McpNoTools {
                        server: report.name.clone(),
                        error: error.clone(),
                    });
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
        // A child resumed or continued on its own (not through its parent) keeps the tools
        // its `delegate` call gave it.
        let tools = if engine_config.lineage.parent.is_some() {
            let allowed = engine_config
                .recorded_config
                .get("tools")
                .cloned()
                .and_then(|tools| serde_json::from_value::<Option<Vec<String>>>(tools).ok())
                .flatten();
            nerve_brain::run::delegate::narrowed(tools, allowed)
        } else {
            tools
        };
        let per_message_turns = engine_config.max_turns;
        let mut engine = AgentEngine::new(self.provider, tools, sink, engine_config);
        // A resumed parent resumes the child its `delegate` call had in flight.
        engine.children = Some(Arc::new(crate::children::LogChildren {
            db: self.db.to_path_buf(),
        }));
        // Compaction archives into the log, so `recall` survives a crash and a resume.
        engine.archive = Arc::clone(&log) as Arc<dyn nerve_core::ContextArchive>;
        let ears = Arc::new(Ears(observer));
        engine.deltas = Arc::clone(&ears) as Arc<dyn nerve_brain::DeltaObserver>;
        engine.approver = Arc::clone(&ears) as Arc<dyn nerve_brain::guards::approval::Approver>;
        if !self.config.hooks.is_empty() {
            engine.hooks = Some(Arc::new(crate::hooks::HostHooks {
                hooks: self.config.hooks.clone(),
                execution_id: self.execution_id,
                workspace: self.workspace.clone(),
            }));
        }
        // Snapshots of the workspace at turn boundaries (docs/checkpoints.md); without a
        // store the run goes on, and `nerve diff` has nothing for it.
        match crate::snapshots::snapshots_for(self.db, self.execution_id, &self.workspace).await {
            Ok(port) => engine.workspace = Some(port),
            Err(reason) => ears.0.notice(Notice::NoSnapshots { reason }),
        }
        Ok(Session {
            engine,
            execution_id: self.execution_id,
            workspace: self.workspace,
            db: self.db.to_path_buf(),
            context_window,
            per_message_turns,
            sandbox: Arc::clone(sandbox),
            proxy,
            mcp,
            homes,
        })
    }

    /// Opens the session, runs `start` and closes it: an unattended execution (a worker's).
    pub async fn execute(
        self,
        start: Start,
        observer: Arc<dyn Observer>,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, RuntimeError> {
        let session = self.open(observer).await?;
        let result = session.run(start, cancel).await;
        session.close(result.as_ref().ok()).await;
        result
    }
}

impl Session {
    pub fn execution_id(&self) -> ExecutionId {
        self.execution_id
    }

    /// The workspace, as the sandbox mounts it.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The model's context window, when known.
    pub fn context_window(&self) -> Option<u64> {
        self.context_window
    }

    /// The model the provider asks.
    pub fn model(&self) -> &str {
        self.engine.provider.model()
    }

    /// How the log names the provider (`openai`, `script:FILE`).
    pub fn provider_name(&self) -> &str {
        self.engine.provider.name()
    }

    /// Asks `provider` (another model of the same provider: chat's `/model`) from the next
    /// message on, with its window. For this session only: the log keeps the model the
    /// execution started with, which a later reopen or resume asks unless told otherwise.
    pub fn switch_provider(
        &mut self,
        provider: Arc<dyn nerve_brain::Provider>,
        context_window: Option<u64>,
    ) {
        self.engine.provider = provider;
        self.engine.config.context_window = context_window;
        self.context_window = context_window;
    }

    /// Runs the engine once: a fresh task, a resume or a follow-up.
    pub async fn run(
        &self,
        start: Start,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, RuntimeError> {
        let id = self.execution_id;
        match start {
            Start::Fresh(task) => self.engine.run(id, task, cancel).await,
            Start::Resume(state) => self.engine.resume(id, *state, cancel).await,
            Start::FollowUp(state, follow) => {
                self.engine.follow_up(id, *state, follow, cancel).await
            }
        }
        .map_err(|e| RuntimeError::Engine(e.to_string()))
    }

    /// One message of a conversation, under `loop_type`: the first (`first`) starts the
    /// execution as its task; each later one continues it as the log left it (a crashed
    /// last attempt recovered first), compacted first when `compact`. Each message gets
    /// the launch's turn limit.
    pub async fn send(
        &self,
        message: &str,
        loop_type: LoopType,
        first: bool,
        compact: bool,
        cancel: CancellationToken,
    ) -> Result<ExecutionResult, RuntimeError> {
        let execution_id = self.execution_id;
        if first {
            let mut engine = self.engine.clone();
            engine.config.loop_type = loop_type;
            let task = Task {
                id: TaskId::new(),
                description: message.to_owned(),
                metadata: serde_json::Value::Null,
                status: TaskStatus::Created,
                workspace: self.workspace.display().to_string(),
            };
            return engine
                .run(execution_id, task, cancel)
                .await
                .map_err(|e| RuntimeError::Engine(e.to_string()));
        }
        let (continuable, replay) =
            crate::resume::continuable(&self.db, &execution_id.to_string()).await?;
        let mut engine = self.engine.clone();
        engine.config.max_turns = continuable
            .state
            .turns
            .saturating_add(self.per_message_turns);
        let follow = FollowUp {
            message: message.to_owned(),
            loop_type,
            recover: replay.termination_reason.is_none(),
            compact,
        };
        engine
            .follow_up(execution_id, continuable.state, follow, cancel)
            .await
            .map_err(|e| RuntimeError::Engine(e.to_string()))
    }

    /// Stops the MCP servers and the proxy and removes the sandbox; `ended` is the last
    /// run's result. A completed execution is never resumed: its sandbox home goes with
    /// it. Any other ending keeps the home for a resume.
    pub async fn close(self, ended: Option<&ExecutionResult>) {
        if let Some(mcp) = self.mcp {
            mcp.shutdown().await;
        }
        drop(self.proxy);
        remove(&self.sandbox).await;
        if let Some(result) = ended
            && result.termination_reason == nerve_core::TerminationReason::Completed
            && let Err(error) =
                nerve_hands::discard_sandbox_home(Some(&self.homes), self.execution_id)
        {
            tracing::warn!(%error, "could not remove the sandbox's home directory");
        }
    }
}

async fn remove(sandbox: &Sandbox) {
    if let Err(error) = sandbox.remove().await {
        tracing::warn!(%error, "could not remove the sandbox; the reaper will at the next start");
    }
}

/// A front end's MCP server as the sandbox runs it: in the sandbox, its variables through the
/// credential filter.
fn client_spec(
    server: &crate::launch::ClientMcpServer,
    redactor: &Redactor,
) -> nerve_hands::mcp::McpServerSpec {
    let (kept, dropped) = nerve_core::filter_sandbox_env(server.env.iter().cloned(), redactor);
    if !dropped.is_empty() {
        tracing::warn!(server = %server.name, ?dropped, "variables kept from a client's MCP server by the credential filter");
    }
    nerve_hands::mcp::McpServerSpec {
        config: nerve_hands::mcp::McpServerConfig {
            name: server.name.clone(),
            command: Some(server.command.clone()),
            args: server.args.clone(),
            url: None,
            env: Vec::new(),
            tools: nerve_hands::mcp::ToolFilter::default(),
            timeout_secs: None,
            trust: nerve_hands::mcp::Trust::Sandbox,
        },
        env: kept.into_iter().collect(),
    }
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
