//! The optional TOML configuration file, and what it gives every front end: the engine's
//! settings, the model table, the proxy's rules and secrets, the sandbox's limits and the
//! MCP servers. Unknown keys are errors, so a typo never silently falls back to a default.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nerve_hands::proxy::{
    Credential, HostPattern, ProxyConfig, ProxyLimits, ProxyRule, UpstreamScheme,
};
use secrecy::SecretString;
use serde::Deserialize;

use crate::RuntimeError;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub sandbox: SandboxSection,
    #[serde(default)]
    pub proxy: ProxySection,
    #[serde(default)]
    pub guardrails: GuardrailsSection,
    #[serde(default)]
    pub policy: PolicySection,
    #[serde(default)]
    pub compaction: Option<nerve_brain::context::compaction_plan::CompactionConfig>,
    /// Extra models, or overrides of the built-in table's windows and prices.
    #[serde(default)]
    pub models: Vec<ModelSection>,
    /// Per-provider settings.
    #[serde(default)]
    pub providers: ProvidersSection,
    /// MCP servers whose tools the model gets (docs/mcp.md).
    #[serde(default)]
    pub mcp: McpSection,
    /// The provider a new execution uses when no `--provider` is given (`openai`,
    /// `anthropic`, `script:FILE`); `openai` when neither says.
    pub provider: Option<String>,
    /// The model a new execution asks when no `--model` is given.
    pub model: Option<String>,
    /// The model's context window in tokens when no `--context-window` is given (else the
    /// model table's).
    pub context_window: Option<u64>,
    /// How much the agent may do without a person: `read-only`, `ask`, `auto`, `never`.
    pub approval: Option<nerve_brain::guards::approval::ApprovalMode>,
    /// `[[rules]]`: allow, ask or deny by tool, and for `shell` by command (first match wins).
    #[serde(default)]
    pub rules: Vec<nerve_brain::guards::approval::CommandRule>,
    /// `[[hooks.<point>]]`: commands run on the host at the execution's fixed points.
    #[serde(default)]
    pub hooks: crate::hooks::HooksSection,
    /// The user's files only: run the hooks of a workspace's `.nerve/config.toml` too
    /// (without it they are ignored; see `settings`).
    pub trust_project_hooks: Option<bool>,
    /// `[delegation]`: the `delegate` tool and its children's limits (docs/cli.md).
    #[serde(default)]
    pub delegation: DelegationSection,
}

/// `[delegation]`: whether the model may hand work to child executions, and their limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DelegationSection {
    /// Offer the `delegate` tool (default false).
    pub enabled: Option<bool>,
    /// Children of one turn that run at once (default 4).
    pub max_parallel: Option<usize>,
    /// A child's turns when the call names none, and the most it may name (default 10).
    pub max_turns: Option<u32>,
    /// The share (percent, 1 to 100) of the parent's remaining budgets the children of one
    /// turn get together (default 50).
    pub budget_share_percent: Option<u32>,
    /// The longest answer a child hands back, in bytes (default 8192).
    pub answer_bytes: Option<usize>,
}

impl DelegationSection {
    fn build(&self) -> Result<nerve_brain::run::delegate::DelegationConfig, RuntimeError> {
        let defaults = nerve_brain::run::delegate::DelegationConfig::default();
        let share = self
            .budget_share_percent
            .unwrap_or(defaults.budget_share_percent);
        if !(1..=100).contains(&share) {
            return Err(RuntimeError::config(format!(
                "[delegation] budget_share_percent = {share}: give 1 to 100"
            )));
        }
        let positive = |value: Option<u64>, key: &str| match value {
            Some(0) => Err(RuntimeError::config(format!(
                "[delegation] {key} = 0: give at least 1"
            ))),
            _ => Ok(()),
        };
        positive(self.max_parallel.map(|n| n as u64), "max_parallel")?;
        positive(self.max_turns.map(u64::from), "max_turns")?;
        positive(self.answer_bytes.map(|n| n as u64), "answer_bytes")?;
        Ok(nerve_brain::run::delegate::DelegationConfig {
            enabled: self.enabled.unwrap_or(defaults.enabled),
            max_parallel: self.max_parallel.unwrap_or(defaults.max_parallel),
            max_turns: self.max_turns.unwrap_or(defaults.max_turns),
            budget_share_percent: share,
            answer_bytes: self.answer_bytes.unwrap_or(defaults.answer_bytes),
            workspace: String::new(),
        })
    }
}

/// `[mcp]`: the `[[mcp.servers]]` list.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSection {
    #[serde(default)]
    pub servers: Vec<nerve_hands::mcp::McpServerConfig>,
}

impl McpSection {
    /// Checks every entry and that names are unique.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let mut seen = std::collections::BTreeSet::new();
        for server in &self.servers {
            server.validate().map_err(RuntimeError::config)?;
            if !seen.insert(server.name.as_str()) {
                return Err(RuntimeError::config(format!(
                    "MCP server `{}` is configured twice",
                    server.name
                )));
            }
        }
        Ok(())
    }

    /// The servers with their environment: each named variable's host value, through the
    /// credential filter (a name or value that looks like a credential stays out).
    pub fn specs(&self, redactor: &nerve_core::Redactor) -> Vec<nerve_hands::mcp::McpServerSpec> {
        self.servers
            .iter()
            .map(|server| {
                let vars = server
                    .env
                    .iter()
                    .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)));
                let (kept, dropped) = nerve_core::filter_sandbox_env(vars, redactor);
                if !dropped.is_empty() {
                    tracing::warn!(server = %server.name, ?dropped, "variables kept from an MCP server by the credential filter");
                }
                nerve_hands::mcp::McpServerSpec {
                    config: server.clone(),
                    env: kept.into_iter().collect(),
                }
            })
            .collect()
    }
}

/// `[providers.NAME]`: settings of one provider's client.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvidersSection {
    #[serde(default)]
    pub openai: OpenAiSection,
    #[serde(default)]
    pub anthropic: AnthropicSection,
}

/// `[providers.openai]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiSection {
    /// Stream answers (default true); `false` asks every call for the whole answer.
    pub stream: Option<bool>,
    /// Which tools the model may or must call ([`ToolChoiceSetting`]).
    pub tool_choice: Option<ToolChoiceSetting>,
    /// How tool calls travel: `"native"`, `"text"` or `"auto"` (the default).
    pub tool_protocol: Option<nerve_brain::ToolProtocol>,
    /// Seconds a whole (non-streamed) answer may take, answer included (default 600).
    pub request_timeout_secs: Option<std::num::NonZeroU64>,
    /// Seconds of silence a stream may keep, headers or body (default 300).
    pub idle_timeout_secs: Option<std::num::NonZeroU64>,
}

/// `tool_choice` of a provider's section: `"auto"` (the default: the model decides),
/// `"required"` (some tool), `"none"` (no tool), or a tool's name (that tool, every turn:
/// for a small local model that will not call tools on its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolChoiceSetting(pub nerve_brain::ToolChoice);

impl<'de> Deserialize<'de> for ToolChoiceSetting {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use nerve_brain::ToolChoice;
        let text = String::deserialize(deserializer)?;
        let choice = match text.as_str() {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            name if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                ToolChoice::Tool(name.to_owned())
            }
            other => {
                return Err(serde::de::Error::custom(format!(
                    "tool_choice `{other}` is not \"auto\", \"required\", \"none\" or a tool's name"
                )));
            }
        };
        Ok(Self(choice))
    }
}

/// `[providers.anthropic]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnthropicSection {
    /// Cache breakpoints in requests; `false` for a gateway in front of a model that is
    /// not Claude.
    pub prompt_caching: Option<bool>,
    /// Stream answers (default true); `false` asks every call for the whole answer.
    pub stream: Option<bool>,
    /// Which tools the model may or must call ([`ToolChoiceSetting`]).
    pub tool_choice: Option<ToolChoiceSetting>,
    /// How tool calls travel: `"native"`, `"text"` or `"auto"` (the default).
    pub tool_protocol: Option<nerve_brain::ToolProtocol>,
    /// Seconds a whole (non-streamed) answer may take, answer included (default 600).
    pub request_timeout_secs: Option<std::num::NonZeroU64>,
    /// Seconds of silence a stream may keep, headers or body (default 300).
    pub idle_timeout_secs: Option<std::num::NonZeroU64>,
}

/// `[guardrails]`: limits and recoveries of every run (command-line flags win).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardrailsSection {
    pub max_tokens_recoveries: Option<u32>,
    pub premature_end_retries: Option<u32>,
    pub max_replans: Option<u32>,
    pub reserve_tokens: Option<u64>,
    pub reserve_cost_percent: Option<u32>,
    pub stagnation: Option<nerve_brain::guards::stagnation::StagnationConfig>,
}

/// `[policy]`: which tool calls run, ask or are refused. `default` is `allow` unless set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySection {
    pub default: Option<nerve_brain::guards::approval::PolicyAction>,
    #[serde(default)]
    pub rules: Vec<nerve_brain::guards::approval::PolicyRule>,
}

/// One `[[models]]` entry: prices in dollars per million tokens.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub name: String,
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    pub input_usd_per_million: Option<f64>,
    pub output_usd_per_million: Option<f64>,
    /// Input tokens read from the provider's prompt cache.
    pub cached_input_usd_per_million: Option<f64>,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write_usd_per_million: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSection {
    /// The image to run tools in.
    pub image: Option<String>,
    /// Host busybox used to build the default image.
    pub busybox: Option<std::path::PathBuf>,
    /// Memory limit of the container (no swap beyond it): bytes or a size (`"2GiB"`).
    pub memory: Option<Size>,
    /// Processes and threads the container may hold at once.
    pub pids: Option<i64>,
    /// CPUs the container may use (`1.5`).
    pub cpus: Option<f64>,
    /// Size of the `/tmp` tmpfs: bytes or a size (`"256MiB"`).
    pub tmp_size: Option<Size>,
    /// A Dockerfile (relative to the workspace) to build the image from, when neither an
    /// image nor a devcontainer.json names one; its directory is the build context.
    pub dockerfile: Option<std::path::PathBuf>,
    /// Caches that last between runs, opt-in per tool.
    #[serde(default)]
    pub caches: CachesSection,
    /// When the sandbox's executor cannot run: `"refuse"` to start (the default) or
    /// `"per-call"` (each call its own `docker exec`; `--sandbox-fallback` on `run`).
    pub fallback: Option<SandboxFallback>,
    /// Seconds an interrupted command (Ctrl-C, SIGTERM, cancel) has between SIGINT and
    /// SIGKILL, to clean up; 2 when absent.
    pub interrupt_grace_secs: Option<u64>,
}

/// What a sandbox does without a usable executor (`[sandbox] fallback`,
/// `run --sandbox-fallback`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxFallback {
    /// Refuse to start, naming the fix.
    Refuse,
    /// Run each call through its own `docker exec`: slower, background jobs not contained,
    /// no MCP server inside the sandbox. Recorded in the `started` event.
    PerCall,
}

/// `[sandbox.caches]`: `pip`, `npm`, `cargo` = `true` (a volume for this workspace) or a
/// name (a volume shared by every workspace configured with that name).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachesSection {
    pub pip: Option<CacheSetting>,
    pub npm: Option<CacheSetting>,
    pub cargo: Option<CacheSetting>,
}

/// One tool's cache setting.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum CacheSetting {
    Enabled(bool),
    Shared(String),
}

/// A size in the config: a number of bytes, or a string with a binary unit (`"512MiB"`,
/// `"512m"`, `"2G"`; `k`, `m`, `g` with an optional `b` or `ib`, any case).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self) -> Result<u64, String> {
        match self {
            Self::Bytes(n) => Ok(*n),
            Self::Text(text) => parse_size(text),
        }
    }
}

/// Parses `"512MiB"` and its spellings (see [`Size`]).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (say e.g. \"512MiB\")"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use KiB, MiB or GiB)"
            ));
        }
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// The longest `[sandbox] interrupt_grace_secs`: a stop that waits longer is no stop.
const MAX_INTERRUPT_GRACE_SECS: u64 = 3600;

impl SandboxSection {
    /// Lays the file's limits over `config`'s defaults; a limit that cannot work is an error
    /// naming the key.
    /// The cache volumes `[sandbox.caches]` asks for, for `workspace`.
    pub fn cache_volumes(
        &self,
        workspace: &std::path::Path,
    ) -> Result<Vec<nerve_hands::caches::CacheVolume>, RuntimeError> {
        use nerve_hands::caches::{CacheTool, CacheVolume};
        let mut volumes = Vec::new();
        for (tool, setting) in [
            (CacheTool::Pip, &self.caches.pip),
            (CacheTool::Npm, &self.caches.npm),
            (CacheTool::Cargo, &self.caches.cargo),
        ] {
            match setting {
                None | Some(CacheSetting::Enabled(false)) => {}
                Some(CacheSetting::Enabled(true)) => {
                    volumes.push(CacheVolume::for_workspace(tool, workspace));
                }
                Some(CacheSetting::Shared(name)) => {
                    volumes.push(CacheVolume::shared(tool, name).ok_or_else(|| {
                        RuntimeError::config(format!(
                            "sandbox.caches.{}: `{name}` is not a cache name (letters, digits, `_`, `.`, `-`; at most 64)",
                            tool.as_str()
                        ))
                    })?);
                }
            }
        }
        Ok(volumes)
    }

    pub fn apply_limits(
        &self,
        config: &mut nerve_hands::SandboxConfig,
    ) -> Result<(), RuntimeError> {
        let size = |key: &str, value: &Size, min: u64| -> Result<u64, RuntimeError> {
            let bytes = value
                .bytes()
                .map_err(|e| RuntimeError::config(format!("sandbox.{key}: {e}")))?;
            if bytes < min || i64::try_from(bytes).is_err() {
                return Err(RuntimeError::config(format!(
                    "sandbox.{key}: {bytes} bytes is out of range (at least {} MiB)",
                    min >> 20
                )));
            }
            Ok(bytes)
        };
        if let Some(memory) = &self.memory {
            config.memory_bytes = i64::try_from(size("memory", memory, 16 << 20)?)
                .map_err(|e| RuntimeError::config(format!("sandbox.memory: {e}")))?;
        }
        if let Some(tmp) = &self.tmp_size {
            config.tmp_bytes = size("tmp_size", tmp, 1 << 20)?;
        }
        if let Some(pids) = self.pids {
            if pids < 8 {
                return Err(RuntimeError::config(format!(
                    "sandbox.pids: {pids} is too few (at least 8: the executor and a shell need some)"
                )));
            }
            config.pids_limit = pids;
        }
        if let Some(cpus) = self.cpus {
            if !(0.01..=1024.0).contains(&cpus) {
                return Err(RuntimeError::config(format!(
                    "sandbox.cpus: {cpus} is not a CPU count (0.01 to 1024)"
                )));
            }
            // In range, so the product fits.
            #[allow(clippy::cast_possible_truncation)]
            let nano = (cpus * 1e9).round() as i64;
            config.nano_cpus = nano;
        }
        config.per_call_fallback = self.fallback == Some(SandboxFallback::PerCall);
        if let Some(secs) = self.interrupt_grace_secs {
            if secs > MAX_INTERRUPT_GRACE_SECS {
                return Err(RuntimeError::config(format!(
                    "sandbox.interrupt_grace_secs: {secs} is too long (at most {MAX_INTERRUPT_GRACE_SECS}: an hour)"
                )));
            }
            config.interrupt_grace = std::time::Duration::from_secs(secs);
        }
        Ok(())
    }
}

impl Config {
    /// The engine settings the file gives; run flags are laid over them.
    pub fn engine_config(&self) -> Result<nerve_brain::EngineConfig, RuntimeError> {
        let defaults = nerve_brain::EngineConfig::default();
        let guards = &self.guardrails;
        let policy = nerve_brain::guards::approval::ToolPolicy::build(
            nerve_brain::guards::approval::PolicySettings {
                rules: self.rules.clone(),
                patterns: self.policy.rules.clone(),
                default: self.policy.default,
                mode: self.approval,
            },
        )
        .map_err(RuntimeError::config)?;
        Ok(nerve_brain::EngineConfig {
            max_tokens_recoveries: guards
                .max_tokens_recoveries
                .unwrap_or(defaults.max_tokens_recoveries),
            premature_end_retries: guards
                .premature_end_retries
                .unwrap_or(defaults.premature_end_retries),
            max_replans: guards.max_replans.unwrap_or(defaults.max_replans),
            reserve_tokens: guards.reserve_tokens.unwrap_or(defaults.reserve_tokens),
            reserve_cost_percent: guards
                .reserve_cost_percent
                .unwrap_or(defaults.reserve_cost_percent),
            stagnation: guards.stagnation.unwrap_or(defaults.stagnation),
            compaction: self.compaction.unwrap_or(defaults.compaction),
            policy,
            delegation: self.delegation.build()?,
            ..defaults
        })
    }

    /// The built-in model table with the file's `[[models]]` laid over it.
    pub fn model_table(&self) -> Result<nerve_brain::ModelTable, RuntimeError> {
        let micros = |usd: Option<f64>, name: &str| -> Result<Option<u64>, RuntimeError> {
            usd.map(|usd| {
                nerve_core::MicroUsd::from_usd(usd)
                    .map(|m| m.0)
                    .ok_or_else(|| {
                        RuntimeError::config(format!("model {name}: {usd} is not a price"))
                    })
            })
            .transpose()
        };
        let mut overrides = Vec::new();
        for model in &self.models {
            overrides.push(nerve_brain::ModelOverride {
                name: model.name.clone(),
                context_window: model.context_window,
                max_output_tokens: model.max_output_tokens,
                input_per_million: micros(model.input_usd_per_million, &model.name)?,
                output_per_million: micros(model.output_usd_per_million, &model.name)?,
                cache_read_per_million: micros(model.cached_input_usd_per_million, &model.name)?,
                cache_write_per_million: micros(model.cache_write_usd_per_million, &model.name)?,
            });
        }
        nerve_brain::ModelTable::builtin()
            .with_overrides(overrides)
            .map_err(RuntimeError::config)
    }

    /// What the provider's client needs from the file: the model table, the window
    /// (`--context-window` as given), the Anthropic cache setting, whether to stream.
    pub fn provider_settings(
        &self,
        context_window: Option<u64>,
    ) -> Result<crate::provider::Settings, RuntimeError> {
        Ok(crate::provider::Settings {
            table: self.model_table()?,
            context_window,
            anthropic_prompt_caching: self.providers.anthropic.prompt_caching,
            openai_stream: self.providers.openai.stream,
            anthropic_stream: self.providers.anthropic.stream,
            openai_tool_choice: self.providers.openai.tool_choice.clone().map(|c| c.0),
            anthropic_tool_choice: self.providers.anthropic.tool_choice.clone().map(|c| c.0),
            openai_tool_protocol: self.providers.openai.tool_protocol,
            anthropic_tool_protocol: self.providers.anthropic.tool_protocol,
            openai_timeouts: crate::provider::Timeouts {
                request_secs: self.providers.openai.request_timeout_secs,
                idle_secs: self.providers.openai.idle_timeout_secs,
            },
            anthropic_timeouts: crate::provider::Timeouts {
                request_secs: self.providers.anthropic.request_timeout_secs,
                idle_secs: self.providers.anthropic.idle_timeout_secs,
            },
        })
    }

    /// Reads `path`, or the defaults when no file was named.
    pub fn load(path: Option<&Path>) -> Result<Self, RuntimeError> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            RuntimeError::config(format!("cannot read config {}: {e}", path.display()))
        })?;
        let config: Self = toml::from_str(&text).map_err(|e| {
            let first = e.to_string().lines().next().unwrap_or_default().to_owned();
            RuntimeError::config(format!(
                "invalid config {}: {first} ({})",
                path.display(),
                e.message()
            ))
        })?;
        // Values that parse but cannot work (a policy pattern that is no regex, a price that
        // is no amount) are refused here too, before any command looks at anything else.
        config.validate().map_err(|e| {
            RuntimeError::config(format!(
                "invalid config {}: {}",
                path.display(),
                e.message()
            ))
        })?;
        Ok(config)
    }

    /// Refuses values that parse but cannot work: a policy pattern that is no regex, a
    /// price that is no amount, an MCP server or hook without a command, a sandbox limit
    /// out of range.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        self.engine_config()?;
        self.model_table()?;
        self.mcp.validate()?;
        self.hooks.validate()?;
        let mut probe = nerve_hands::SandboxConfig::new("", "", nerve_core::ExecutionId::new());
        self.sandbox.apply_limits(&mut probe)
    }
}

/// Nerve's directory in the user's configuration directory: `$XDG_CONFIG_HOME/nerve`, else
/// `~/.config/nerve`; `None` when neither can be named.
pub fn user_config_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .map(|dir| dir.join("nerve"))
}

/// `[proxy]`: the auth proxy's limits and its allowlist, `[[proxy.rules]]`. Without rules
/// every request from the sandbox is denied (and recorded). See docs/proxy.md.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxySection {
    /// Resolution, TCP connect and TLS handshake to an upstream (default 10).
    pub connect_timeout_secs: Option<u64>,
    /// A whole request, from its head to the end of the response (default 120).
    pub timeout_secs: Option<u64>,
    /// The largest request body forwarded (default 8 MiB).
    pub max_request_bytes: Option<u64>,
    /// The largest response body passed back (default 64 MiB).
    pub max_response_bytes: Option<u64>,
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

/// One `[[proxy.rules]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// `api.example.com`, `*.example.com`, or an IP literal.
    pub host: String,
    /// Default `["GET", "HEAD"]`; `CONNECT` allows tunnels (not with a credential).
    pub methods: Option<Vec<String>>,
    /// Allowed path prefixes; default `["/"]`.
    pub paths: Option<Vec<String>>,
    /// `https` (default) or `http`: how the proxy talks to the upstream.
    pub upstream_scheme: Option<SchemeSpec>,
    /// Default: 443 for https, 80 for http.
    pub upstream_port: Option<u16>,
    /// Allow loopback, private, link-local and metadata addresses (default false).
    #[serde(default)]
    pub allow_private: bool,
    pub credential: Option<CredentialSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchemeSpec {
    Http,
    Https,
}

/// `[proxy.rules.credential]`: the header the proxy adds, and where its secret comes from
/// (exactly one of `env` and `file`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialSpec {
    /// Label in events and redactions (`[REDACTED:<name>]`); default: the variable's name
    /// in lower case, else the file's name.
    pub name: Option<String>,
    /// Default `Authorization`.
    pub header: Option<String>,
    /// Default `Bearer {secret}`.
    pub value: Option<String>,
    /// An environment variable of the `nerve` process holding the secret.
    pub env: Option<String>,
    /// A file holding the secret (trailing line breaks are ignored).
    pub file: Option<PathBuf>,
}

/// The proxy's configuration, and its secrets labelled for the redactor.
pub struct ProxySetup {
    pub config: ProxyConfig,
    pub secrets: Vec<(String, SecretString)>,
}

/// The rules' hosts and the secrets' labels, never a secret.
impl std::fmt::Debug for ProxySetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hosts: Vec<String> = self
            .config
            .rules
            .iter()
            .map(|rule| format!("{:?}", rule.host))
            .collect();
        let labels: Vec<&str> = self.secrets.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("ProxySetup")
            .field("rules", &hosts)
            .field("secrets", &labels)
            .finish()
    }
}

impl ProxySection {
    /// Validates the rules and reads their secrets (`env` looks up a variable of this
    /// process). Errors are one line naming the rule, never a secret.
    pub fn build(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<ProxySetup, RuntimeError> {
        let mut rules = Vec::new();
        let mut secrets = Vec::new();
        for spec in &self.rules {
            let fail = |problem: String| {
                RuntimeError::config(format!("[[proxy.rules]] host = {:?}: {problem}", spec.host))
            };
            let host = HostPattern::parse(&spec.host).map_err(fail)?;
            let mut rule = ProxyRule::new(host);
            if let Some(methods) = &spec.methods {
                rule.methods = methods.clone();
            }
            if let Some(paths) = &spec.paths {
                rule.paths = paths.clone();
            }
            rule.upstream_scheme = match spec.upstream_scheme {
                None | Some(SchemeSpec::Https) => UpstreamScheme::Https,
                Some(SchemeSpec::Http) => UpstreamScheme::Http,
            };
            rule.upstream_port = spec.upstream_port;
            rule.allow_private = spec.allow_private;
            if let Some(credential) = &spec.credential {
                let (secret, default_name) = read_secret(credential, env).map_err(fail)?;
                let name = credential.name.clone().unwrap_or(default_name);
                secrets.push((name.clone(), secret.clone()));
                rule.credential = Some(Credential {
                    name,
                    header: credential
                        .header
                        .clone()
                        .unwrap_or_else(|| "Authorization".to_owned()),
                    template: credential
                        .value
                        .clone()
                        .unwrap_or_else(|| "Bearer {secret}".to_owned()),
                    secret,
                });
            }
            rules.push(rule);
        }
        let defaults = ProxyLimits::default();
        let limits = ProxyLimits {
            connect_timeout: self
                .connect_timeout_secs
                .map_or(defaults.connect_timeout, Duration::from_secs),
            total_timeout: self
                .timeout_secs
                .map_or(defaults.total_timeout, Duration::from_secs),
            max_request_body_bytes: self
                .max_request_bytes
                .unwrap_or(defaults.max_request_body_bytes),
            max_response_body_bytes: self
                .max_response_bytes
                .unwrap_or(defaults.max_response_body_bytes),
            ..defaults
        };
        let config = ProxyConfig {
            limits,
            ..ProxyConfig::new(rules)
        };
        config.validate().map_err(RuntimeError::config)?;
        Ok(ProxySetup { config, secrets })
    }
}

/// The secret and the credential's default name.
fn read_secret(
    spec: &CredentialSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(SecretString, String), String> {
    match (&spec.env, &spec.file) {
        (Some(variable), None) => {
            let value = env(variable)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("the credential's variable {variable} is not set"))?;
            Ok((SecretString::from(value), variable.to_ascii_lowercase()))
        }
        (None, Some(file)) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read the credential file {}: {e}", file.display()))?;
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "secret".to_owned());
            let name: String = name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            Ok((
                SecretString::from(text.trim_end_matches(['\n', '\r']).to_owned()),
                name,
            ))
        }
        (Some(_), Some(_)) => Err("a credential takes `env` or `file`, not both".to_owned()),
        (None, None) => Err("a credential needs `env` or `file`".to_owned()),
    }
}

#[cfg(test)]
#[path = "config_fuzz.rs"]
mod fuzz;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use secrecy::ExposeSecret;

    use super::*;

    #[test]
    fn sizes_in_their_spellings() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size(" 2 GB"), Ok(2 << 30));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(
            parse_size("1.5G")
                .unwrap_err()
                .contains("unknown unit `.5g`")
        );
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
        assert!(
            parse_size("99999999999999G")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn limits_reach_the_sandbox_and_bad_ones_name_their_key() {
        let apply = |text: &str| {
            let config: Config = toml::from_str(text).unwrap();
            let mut sandbox =
                nerve_hands::SandboxConfig::new("i", "/w", nerve_core::ExecutionId::new());
            config
                .sandbox
                .apply_limits(&mut sandbox)
                .map(|()| sandbox)
                .map_err(|e| e.to_string())
        };
        let sandbox =
            apply("[sandbox]\nmemory = \"1GiB\"\npids = 100\ncpus = 1.5\ntmp_size = 1048576\n")
                .unwrap();
        assert_eq!(
            (
                sandbox.memory_bytes,
                sandbox.pids_limit,
                sandbox.nano_cpus,
                sandbox.tmp_bytes
            ),
            (1 << 30, 100, 1_500_000_000, 1 << 20)
        );
        assert!(
            apply("[sandbox]\nmemory = \"1m\"")
                .unwrap_err()
                .starts_with("sandbox.memory: ")
        );
        assert!(
            apply("[sandbox]\npids = 2")
                .unwrap_err()
                .starts_with("sandbox.pids: ")
        );
        assert!(
            apply("[sandbox]\ncpus = 0.0")
                .unwrap_err()
                .starts_with("sandbox.cpus: ")
        );
        assert!(
            apply("[sandbox]\ntmp_size = \"x\"")
                .unwrap_err()
                .starts_with("sandbox.tmp_size: ")
        );
        assert_eq!(
            apply("[sandbox]\ninterrupt_grace_secs = 30")
                .unwrap()
                .interrupt_grace,
            std::time::Duration::from_secs(30)
        );
        assert!(
            apply("[sandbox]\ninterrupt_grace_secs = 3601")
                .unwrap_err()
                .starts_with("sandbox.interrupt_grace_secs: ")
        );
    }

    proptest! {
        #[test]
        fn a_size_and_its_units_round_trip(n in 0u64..1 << 30, unit in 0usize..4, spelling in 0usize..3) {
            let (shift, names) = [(0, ["", "b", "B"]), (10, ["k", "KiB", "kb"]), (20, ["m", "MiB", "MB"]), (30, ["g", "GiB", "gb"])][unit];
            let parsed = parse_size(&format!("{n}{}", names[spelling]));
            match n.checked_mul(1 << shift) {
                Some(bytes) => prop_assert_eq!(parsed, Ok(bytes)),
                None => prop_assert!(parsed.is_err()),
            }
        }

        #[test]
        fn parsing_any_text_never_panics(text in ".{0,24}") {
            let _ = parse_size(&text);
        }
    }

    fn build(toml_text: &str, env: &[(&str, &str)]) -> Result<ProxySetup, String> {
        let config: Config = toml::from_str(toml_text).map_err(|e| e.message().to_owned())?;
        let lookup = |name: &str| {
            env.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        config.proxy.build(&lookup).map_err(|e| e.to_string())
    }

    #[test]
    fn rules_are_read_with_their_secrets() {
        let file = std::env::temp_dir().join(format!("nerve-config-test-{}", std::process::id()));
        std::fs::write(&file, "file-secret-123\n").unwrap();
        let text = format!(
            r#"
            [proxy]
            timeout_secs = 30

            [[proxy.rules]]
            host = "api.github.com"
            methods = ["GET", "POST"]
            paths = ["/repos/acme/"]
            [proxy.rules.credential]
            env = "GH_TOKEN"

            [[proxy.rules]]
            host = "*.internal.test"
            upstream_scheme = "http"
            upstream_port = 8080
            allow_private = true
            [proxy.rules.credential]
            name = "internal"
            header = "X-Api-Key"
            value = "{{secret}}"
            file = "{}"

            [[proxy.rules]]
            host = "pypi.org"
            methods = ["CONNECT"]
            "#,
            file.display()
        );
        let setup = build(&text, &[("GH_TOKEN", "gh-secret-456")]);
        std::fs::remove_file(&file).unwrap();
        let setup = setup.unwrap();
        assert_eq!(setup.config.limits.total_timeout, Duration::from_secs(30));
        let rules = &setup.config.rules;
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].methods, ["GET", "POST"]);
        assert_eq!(rules[0].upstream_scheme, UpstreamScheme::Https);
        assert_eq!(rules[0].port(), 443);
        let github = rules[0].credential.as_ref().unwrap();
        assert_eq!(github.name, "gh_token");
        assert_eq!(github.header, "Authorization");
        assert_eq!(github.template, "Bearer {secret}");
        assert_eq!(rules[1].port(), 8080);
        assert!(rules[1].allow_private);
        let internal = rules[1].credential.as_ref().unwrap();
        assert_eq!(internal.secret.expose_secret(), "file-secret-123");
        let labels: Vec<&str> = setup.secrets.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(labels, ["gh_token", "internal"]);
        assert!(rules[2].credential.is_none());
    }

    /// The `[compaction]` section reaches the engine; keys left out keep the defaults.
    #[test]
    fn stream_is_on_unless_a_provider_turns_it_off() {
        let settings = |text: &str| {
            let config: Config = toml::from_str(text).unwrap();
            let settings = config.provider_settings(None).unwrap();
            (settings.openai_stream, settings.anthropic_stream)
        };
        assert_eq!(settings(""), (None, None));
        assert_eq!(
            settings("[providers.openai]\nstream = false\n[providers.anthropic]\nstream = true"),
            (Some(false), Some(true))
        );
        let error = toml::from_str::<Config>("[providers.openai]\nstreaming = false")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `streaming`"), "{error}");
    }

    #[test]
    fn tool_protocol_is_auto_unless_a_provider_says_otherwise() {
        use nerve_brain::ToolProtocol;
        let settings = |text: &str| {
            let config: Config = toml::from_str(text).unwrap();
            let settings = config.provider_settings(None).unwrap();
            (
                settings.openai_tool_protocol,
                settings.anthropic_tool_protocol,
            )
        };
        assert_eq!(settings(""), (None, None));
        assert_eq!(
            settings(
                "[providers.openai]\ntool_protocol = \"text\"\n[providers.anthropic]\ntool_protocol = \"native\""
            ),
            (Some(ToolProtocol::Text), Some(ToolProtocol::Native))
        );
        let error = toml::from_str::<Config>("[providers.openai]\ntool_protocol = \"json\"")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("unknown variant `json`, expected one of `native`, `text`, `auto`"),
            "{error}"
        );
    }

    #[test]
    fn tool_choice_is_auto_unless_a_provider_says_otherwise() {
        use nerve_brain::ToolChoice;
        let settings = |text: &str| {
            let config: Config = toml::from_str(text).unwrap();
            let settings = config.provider_settings(None).unwrap();
            (settings.openai_tool_choice, settings.anthropic_tool_choice)
        };
        assert_eq!(settings(""), (None, None));
        assert_eq!(
            settings(
                "[providers.openai]\ntool_choice = \"shell\"\n[providers.anthropic]\ntool_choice = \"required\""
            ),
            (
                Some(ToolChoice::Tool("shell".into())),
                Some(ToolChoice::Required)
            )
        );
        assert_eq!(
            settings(
                "[providers.openai]\ntool_choice = \"none\"\n[providers.anthropic]\ntool_choice = \"auto\""
            ),
            (Some(ToolChoice::None), Some(ToolChoice::Auto))
        );
        for bad in ["\"\"", "\"two words\"", "true"] {
            let error =
                toml::from_str::<Config>(&format!("[providers.openai]\ntool_choice = {bad}"))
                    .unwrap_err()
                    .to_string();
            assert!(
                error.contains("tool_choice") || error.contains("invalid type"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn provider_timeouts_are_whole_seconds_above_zero() {
        let timeouts = |text: &str| {
            let config: Config = toml::from_str(text).unwrap();
            let settings = config.provider_settings(None).unwrap();
            (settings.openai_timeouts, settings.anthropic_timeouts)
        };
        let unset = crate::provider::Timeouts::default();
        assert_eq!(timeouts(""), (unset, unset));
        let (openai, anthropic) = timeouts(
            "[providers.openai]\nrequest_timeout_secs = 240\n[providers.anthropic]\nidle_timeout_secs = 30",
        );
        assert_eq!(openai.request_secs.map(|s| s.get()), Some(240));
        assert_eq!(openai.idle_secs, None);
        assert_eq!(anthropic.idle_secs.map(|s| s.get()), Some(30));
        for bad in ["0", "-5", "1.5", "\"60\""] {
            let error =
                toml::from_str::<Config>(&format!("[providers.openai]\nidle_timeout_secs = {bad}"))
                    .unwrap_err()
                    .to_string();
            assert!(error.contains("idle_timeout_secs"), "{bad}: {error}");
        }
    }

    #[test]
    fn the_compaction_section_reaches_the_engine() {
        let check = |text: &str, digest_chars: usize, soft: u32| {
            let config: Config = toml::from_str(text).unwrap();
            let compaction = config.engine_config().unwrap().compaction;
            assert_eq!(
                (compaction.mask_digest_chars, compaction.soft_percent),
                (digest_chars, soft),
                "{text}"
            );
        };
        check("", 300, 60);
        check("[compaction]\nmask_digest_chars = 0\n", 0, 60);
        check(
            "[compaction]\nsoft_percent = 50\nmask_digest_chars = 120\n",
            120,
            50,
        );
    }

    #[test]
    fn mistakes_are_one_line_errors() {
        let check = |text: &str, expected: &str| {
            let got = build(text, &[("SHORT", "abc"), ("GH_TOKEN", "gh-secret-456")]);
            assert_eq!(got.err().as_deref(), Some(expected), "{text}");
        };
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\n[proxy.rules.credential]\nenv = \"MISSING\"",
            "[[proxy.rules]] host = \"a.test\": the credential's variable MISSING is not set",
        );
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\n[proxy.rules.credential]\nenv = \"SHORT\"",
            "invalid proxy rules: rule for `a.test`: credential `short`: the secret is shorter than 6 characters and could not be redacted",
        );
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\n[proxy.rules.credential]\nenv = \"GH_TOKEN\"\nfile = \"/x\"",
            "[[proxy.rules]] host = \"a.test\": a credential takes `env` or `file`, not both",
        );
        check(
            "[[proxy.rules]]\nhost = \"bücher.test\"",
            "[[proxy.rules]] host = \"bücher.test\": host `bücher.test`: the host is not ASCII (internationalised names are refused)",
        );
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\nmethods = [\"CONNECT\"]\n[proxy.rules.credential]\nenv = \"GH_TOKEN\"",
            "invalid proxy rules: rule for `a.test`: CONNECT is refused on a rule with a credential: a tunnel is opaque, the credential could not be injected and the sandbox's own headers could not be checked",
        );
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\nupstream_scheme = \"ftp\"",
            "unknown variant `ftp`, expected `http` or `https`",
        );
        check(
            "[[proxy.rules]]\nhost = \"a.test\"\nport = 1",
            "unknown field `port`, expected one of `host`, `methods`, `paths`, `upstream_scheme`, `upstream_port`, `allow_private`, `credential`",
        );
    }
}
