//! Settings in layers, each laid over the one before: the defaults, the user's file
//! (`$XDG_CONFIG_HOME/nerve/config.toml`), the project's (`.nerve/config.toml` in the
//! workspace), the file `--config` names, the environment (`NERVE_PROVIDER`, ...), the
//! flags. What comes out is one [`Config`] and, for `nerve config`, every value with the
//! layer it came from.
//!
//! A workspace is not the user's: whoever wrote its `.nerve/config.toml` may not be the
//! person running Nerve. So the project's file cannot loosen what the user's files forbid
//! (a looser approval, an `allow` rule where the user asks or denies, the sandbox's
//! fallback or larger limits, network rules, MCP servers on the host or given host
//! variables, a host file in the image, a cache other workspaces share) — refused with one
//! line naming both files — and its hooks, which run on the host, are ignored unless the
//! user's file says `trust_project_hooks = true`.

use std::path::{Path, PathBuf};

use nerve_brain::guards::approval::{ApprovalMode, PolicyAction};
use serde::Serialize;

use crate::RuntimeError;
use crate::config::{Config, SandboxFallback};

/// Where a value came from, from the weakest layer to the strongest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Default,
    /// `$XDG_CONFIG_HOME/nerve/config.toml`.
    User,
    /// `.nerve/config.toml` in the workspace.
    Project,
    /// The file `--config` (or `NERVE_CONFIG`) names.
    Config,
    /// `NERVE_PROVIDER`, `NERVE_MODEL`, `NERVE_APPROVAL`, `NERVE_CONTEXT_WINDOW`.
    Env,
    /// The command line's flags.
    Flag,
}

impl Layer {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::User => "user",
            Self::Project => "project",
            Self::Config => "config",
            Self::Env => "env",
            Self::Flag => "flag",
        }
    }
}

/// The environment variables that are settings, and their keys.
pub const ENV_VARS: [(&str, &str); 4] = [
    ("NERVE_PROVIDER", "provider"),
    ("NERVE_MODEL", "model"),
    ("NERVE_APPROVAL", "approval"),
    ("NERVE_CONTEXT_WINDOW", "context_window"),
];

/// The project's settings file inside a workspace.
pub const PROJECT_FILE: &str = ".nerve/config.toml";

/// The flags that are settings (each front end has its own spelling of them).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub provider: Option<String>,
    pub model: Option<String>,
    pub approval: Option<ApprovalMode>,
    pub context_window: Option<u64>,
    pub sandbox_fallback: Option<SandboxFallback>,
}

/// The files and values the settings are made of.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The user's file; read when it exists.
    pub user: Option<PathBuf>,
    /// The project's file; read when it exists.
    pub project: Option<PathBuf>,
    /// The file `--config` names: it must exist.
    pub named: Option<PathBuf>,
    /// The [`ENV_VARS`] that are set: (variable, value).
    pub env: Vec<(String, String)>,
    pub flags: Flags,
}

impl Sources {
    /// The sources of this process: the user's file in its configuration directory, the
    /// project's in `workspace` (none without one), the named file, the environment.
    pub fn discover(named: Option<&Path>, workspace: Option<&Path>, flags: Flags) -> Self {
        Self {
            user: user_file(),
            project: workspace.map(|w| w.join(PROJECT_FILE)),
            named: named.map(Path::to_path_buf),
            env: ENV_VARS
                .iter()
                .filter_map(|(name, _)| {
                    std::env::var(name)
                        .ok()
                        .filter(|v| !v.is_empty())
                        .map(|v| ((*name).to_owned(), v))
                })
                .collect(),
            flags,
        }
    }
}

/// The user's settings file: `config.toml` in Nerve's user configuration directory.
pub fn user_file() -> Option<PathBuf> {
    crate::config::user_config_dir().map(|dir| dir.join("config.toml"))
}

/// Where one value came from: its layer, and the file, variable or flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub layer: Layer,
    /// The file's path, the variable's or the flag's name; none for a default.
    pub detail: Option<String>,
}

impl Origin {
    fn new(layer: Layer, detail: impl Into<String>) -> Self {
        Self {
            layer,
            detail: Some(detail.into()),
        }
    }
}

/// One effective value: a dotted key (`sandbox.memory`), or a list's item (`rules[0]`).
#[derive(Debug, Clone)]
pub struct Entry {
    pub key: String,
    /// `None` for a default that only the provider or the model table knows.
    pub value: Option<toml::Value>,
    pub origin: Origin,
}

/// A settings file that was looked for.
#[derive(Debug, Clone, Serialize)]
pub struct FileUse {
    pub layer: Layer,
    pub path: PathBuf,
    pub exists: bool,
}

/// The settings, and how they were made.
#[derive(Debug)]
pub struct Settings {
    pub config: Config,
    /// Every value set, with where it came from, in the order written.
    pub entries: Vec<Entry>,
    /// Values left out, and why (a project's hooks the user does not trust).
    pub ignored: Vec<(Entry, String)>,
    pub files: Vec<FileUse>,
}

/// A path inside a list (`rules`, `hooks.stop`): the lists whose first match decides put
/// the user's own files first, so that a project's item only decides what they leave open.
const FIRST_MATCH_LISTS: [&str; 2] = ["rules", "policy.rules"];

/// One value of one layer: a dotted key and either a value or a list's item.
#[derive(Debug, Clone)]
struct Item {
    key: String,
    value: toml::Value,
    list: bool,
    origin: Origin,
}

/// Reads every layer of `sources`, checks the project's against the user's, and lays them
/// over each other.
pub fn load(sources: &Sources) -> Result<Settings, RuntimeError> {
    let mut files = Vec::new();
    // The user's and the project's files count when they exist; the named one must.
    let mut layer = |layer: Layer, path: Option<&PathBuf>, required: bool| {
        let Some(path) = path else {
            return Ok(None);
        };
        let exists = path.exists();
        files.push(FileUse {
            layer,
            path: path.clone(),
            exists,
        });
        if !exists && !required {
            return Ok(None);
        }
        let workspace = (layer == Layer::Project)
            .then(|| path.parent().and_then(Path::parent))
            .flatten();
        read(path, workspace).map(Some)
    };
    let user = layer(Layer::User, sources.user.as_ref(), false)?;
    let project = layer(Layer::Project, sources.project.as_ref(), false)?;
    let named = layer(Layer::Config, sources.named.as_ref(), true)?;

    let mut items = Vec::new();
    let mut ignored = Vec::new();
    if let Some((table, _)) = &user {
        flatten(
            table,
            "",
            &origin_of(Layer::User, sources.user.as_deref()),
            &mut items,
        );
    }
    if let Some((table, config)) = &project {
        let path = sources.project.as_deref();
        let trusted = [user.as_ref(), named.as_ref()]
            .into_iter()
            .flatten()
            .any(|(_, c)| c.trust_project_hooks == Some(true));
        check_project(sources, user.as_ref().map(|(t, _)| t), table, config)?;
        let mut own = Vec::new();
        flatten(table, "", &origin_of(Layer::Project, path), &mut own);
        for item in own {
            if item.key.starts_with("hooks.") && !trusted {
                ignored.push((
                    entry(&item),
                    "a project's hooks run only when the user's settings say trust_project_hooks = true".to_owned(),
                ));
            } else {
                items.push(item);
            }
        }
    }
    if let Some((table, _)) = &named {
        flatten(
            table,
            "",
            &origin_of(Layer::Config, sources.named.as_deref()),
            &mut items,
        );
    }
    for (variable, value) in &sources.env {
        let Some((_, key)) = ENV_VARS.iter().find(|(name, _)| *name == variable.as_str()) else {
            continue;
        };
        let value = env_value(key, value)
            .map_err(|problem| RuntimeError::config(format!("{variable}={value:?}: {problem}")))?;
        items.push(Item {
            key: (*key).to_owned(),
            value,
            list: false,
            origin: Origin::new(Layer::Env, variable.clone()),
        });
    }
    let flags = &sources.flags;
    let flag_values = [
        (
            "provider",
            "--provider",
            flags.provider.clone().map(toml::Value::String),
        ),
        (
            "model",
            "--model",
            flags.model.clone().map(toml::Value::String),
        ),
        (
            "approval",
            "--approval",
            flags
                .approval
                .map(|m| toml::Value::String(m.as_str().to_owned())),
        ),
        (
            "context_window",
            "--context-window",
            flags
                .context_window
                .and_then(|n| i64::try_from(n).ok())
                .map(toml::Value::Integer),
        ),
        (
            "sandbox.fallback",
            "--sandbox-fallback",
            flags.sandbox_fallback.map(|f| {
                toml::Value::String(
                    match f {
                        SandboxFallback::Refuse => "refuse",
                        SandboxFallback::PerCall => "per-call",
                    }
                    .to_owned(),
                )
            }),
        ),
    ];
    for (key, flag, value) in flag_values {
        if let Some(value) = value {
            items.push(Item {
                key: key.to_owned(),
                value,
                list: false,
                origin: Origin::new(Layer::Flag, flag),
            });
        }
    }

    let entries = effective(items);
    let table = build(&entries);
    let config: Config = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| {
            RuntimeError::config(format!("invalid settings: {}", e.message()))
        })?;
    let describe = || {
        files
            .iter()
            .filter(|f| f.exists)
            .map(|f| f.path.display().to_string())
            .collect::<Vec<_>>()
            .join(" + ")
    };
    config.validate().map_err(|e| {
        RuntimeError::config(format!(
            "invalid settings ({}): {}",
            describe(),
            e.message()
        ))
    })?;
    let entries = entries.into_iter().map(|(item, _)| entry(&item)).collect();
    Ok(Settings {
        config,
        entries: with_defaults(entries),
        ignored,
        files,
    })
}

fn origin_of(layer: Layer, path: Option<&Path>) -> Origin {
    Origin {
        layer,
        detail: path.map(|p| p.display().to_string()),
    }
}

fn entry(item: &Item) -> Entry {
    Entry {
        key: item.key.clone(),
        value: Some(item.value.clone()),
        origin: item.origin.clone(),
    }
}

/// One file: its table and its [`Config`], checked as [`Config::load`] checks a file (the
/// error names the file and the line). A project's file must lie inside `workspace`
/// (none of its path a link out of it).
fn read(path: &Path, workspace: Option<&Path>) -> Result<(toml::Table, Config), RuntimeError> {
    if let Some(workspace) = workspace {
        let real = std::fs::canonicalize(path);
        let root = std::fs::canonicalize(workspace);
        if let (Ok(real), Ok(root)) = (real, root)
            && !real.starts_with(&root)
        {
            return Err(RuntimeError::config(format!(
                "project settings {}: the file is a link out of the workspace",
                path.display()
            )));
        }
    }
    let config = Config::load(Some(path))?;
    let text = std::fs::read_to_string(path)
        .map_err(|e| RuntimeError::config(format!("cannot read config {}: {e}", path.display())))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        RuntimeError::config(format!(
            "invalid config {}: {}",
            path.display(),
            e.message()
        ))
    })?;
    Ok((table, config))
}

/// An environment variable's value as the TOML value of its key.
fn env_value(key: &str, value: &str) -> Result<toml::Value, String> {
    let parsed = if key == "context_window" {
        toml::Value::Integer(
            value
                .trim()
                .parse::<u64>()
                .ok()
                .and_then(|n| i64::try_from(n).ok())
                .ok_or("not a number of tokens")?,
        )
    } else {
        toml::Value::String(value.to_owned())
    };
    let mut table = toml::Table::new();
    table.insert(key.to_owned(), parsed.clone());
    toml::Value::Table(table)
        .try_into::<Config>()
        .map_err(|e| e.message().to_owned())?;
    Ok(parsed)
}

/// `table`'s values as items: a table is entered (`sandbox.memory`), a list of tables is a
/// list of items (`rules`), anything else is one value.
fn flatten(table: &toml::Table, prefix: &str, origin: &Origin, into: &mut Vec<Item>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => flatten(inner, &path, origin, into),
            toml::Value::Array(values)
                if !values.is_empty() && values.iter().all(toml::Value::is_table) =>
            {
                for value in values {
                    into.push(Item {
                        key: path.clone(),
                        value: value.clone(),
                        list: true,
                        origin: origin.clone(),
                    });
                }
            }
            toml::Value::Array(_)
            | toml::Value::String(_)
            | toml::Value::Integer(_)
            | toml::Value::Float(_)
            | toml::Value::Boolean(_)
            | toml::Value::Datetime(_) => into.push(Item {
                key: path,
                value: value.clone(),
                list: false,
                origin: origin.clone(),
            }),
        }
    }
}

/// The items that count, in order: a value replaces the same key's from a weaker layer; a
/// list's items add up, the first-match lists with the user's own files first (the named
/// file, then the user's, then the project's), the others weakest first (a later model
/// entry overrides an earlier one). Each item with its list's position.
fn effective(items: Vec<Item>) -> Vec<(Item, usize)> {
    let mut values: Vec<Item> = Vec::new();
    let mut lists: Vec<Item> = Vec::new();
    for item in items {
        if item.list {
            lists.push(item);
        } else if let Some(slot) = values.iter_mut().find(|v| v.key == item.key) {
            *slot = item;
        } else {
            values.push(item);
        }
    }
    let rank = |item: &Item| -> u8 {
        if FIRST_MATCH_LISTS.contains(&item.key.as_str()) {
            match item.origin.layer {
                Layer::Config => 0,
                Layer::User => 1,
                Layer::Default | Layer::Project | Layer::Env | Layer::Flag => 2,
            }
        } else {
            item.origin.layer as u8
        }
    };
    // A stable sort keeps each file's own order within its rank.
    lists.sort_by_key(|item| (item.key.clone(), rank(item)));
    let mut out: Vec<(Item, usize)> = values.into_iter().map(|v| (v, 0)).collect();
    let mut index = 0;
    let mut last_key: Option<String> = None;
    for item in lists {
        if last_key.as_deref() != Some(item.key.as_str()) {
            index = 0;
            last_key = Some(item.key.clone());
        }
        out.push((
            Item {
                key: format!("{}[{index}]", item.key),
                ..item.clone()
            },
            index,
        ));
        index += 1;
    }
    out
}

/// The table the effective items make.
fn build(entries: &[(Item, usize)]) -> toml::Table {
    let mut root = toml::Table::new();
    for (item, _) in entries {
        let key = if item.list {
            item.key.split('[').next().unwrap_or_default()
        } else {
            item.key.as_str()
        };
        let parts: Vec<&str> = key.split('.').collect();
        insert(&mut root, &parts, &item.value, item.list);
    }
    root
}

/// Puts `value` at the dotted path `parts` of `table` (tables made on the way); a list's
/// item is pushed onto the list there.
fn insert(table: &mut toml::Table, parts: &[&str], value: &toml::Value, list: bool) {
    match parts {
        [] => {}
        [last] => {
            if list {
                let slot = table
                    .entry((*last).to_owned())
                    .or_insert_with(|| toml::Value::Array(Vec::new()));
                if let toml::Value::Array(items) = slot {
                    items.push(value.clone());
                }
            } else {
                table.insert((*last).to_owned(), value.clone());
            }
        }
        [first, rest @ ..] => {
            let slot = table
                .entry((*first).to_owned())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if !slot.is_table() {
                *slot = toml::Value::Table(toml::Table::new());
            }
            // Recursion as deep as the path, a few parts.
            if let toml::Value::Table(inner) = slot {
                insert(inner, rest, value, list);
            }
        }
    }
}

/// The entries with the keys every execution has first, in a fixed order (with their
/// defaults where no layer set them), then the rest in the order written.
fn with_defaults(mut entries: Vec<Entry>) -> Vec<Entry> {
    let defaults = [
        (
            "provider",
            Some(toml::Value::String(
                crate::launch::DEFAULT_PROVIDER.to_owned(),
            )),
        ),
        ("model", None),
        (
            "approval",
            Some(toml::Value::String(
                ApprovalMode::default().as_str().to_owned(),
            )),
        ),
        ("context_window", None),
    ];
    let mut first = Vec::with_capacity(defaults.len());
    for (key, value) in defaults {
        let entry = match entries.iter().position(|e| e.key == key) {
            Some(at) => entries.remove(at),
            None => Entry {
                key: key.to_owned(),
                value,
                origin: Origin {
                    layer: Layer::Default,
                    detail: None,
                },
            },
        };
        first.push(entry);
    }
    first.extend(entries);
    first
}

/// How strict an approval setting is: the mode, else what `[policy] default` amounts to.
fn strictness(config: &Config) -> ApprovalMode {
    config.approval.unwrap_or(match config.policy.default {
        Some(PolicyAction::Deny) => ApprovalMode::ReadOnly,
        Some(PolicyAction::Ask) => ApprovalMode::Ask,
        Some(PolicyAction::Allow) | None => ApprovalMode::Auto,
    })
}

/// Refuses a project file that loosens what the user's file forbids (see the module's
/// comment). `user` is the user's file's table, when there is one.
fn check_project(
    sources: &Sources,
    user: Option<&toml::Table>,
    project_table: &toml::Table,
    project: &Config,
) -> Result<(), RuntimeError> {
    let user_table = user.cloned().unwrap_or_default();
    let base: Config = toml::Value::Table(user_table.clone())
        .try_into()
        .map_err(|e: toml::de::Error| RuntimeError::config(e.message().to_owned()))?;
    // The user's file with the project's laid over it: what the project would make of it.
    let mut items = Vec::new();
    let user_origin = origin_of(Layer::User, sources.user.as_deref());
    flatten(&user_table, "", &user_origin, &mut items);
    flatten(
        project_table,
        "",
        &origin_of(Layer::Project, sources.project.as_deref()),
        &mut items,
    );
    let combined: Config = toml::Value::Table(build(&effective(items)))
        .try_into()
        .map_err(|e: toml::de::Error| RuntimeError::config(e.message().to_owned()))?;
    let refuse = |what: String, users: String| {
        let project_path = sources
            .project
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let user_path = match &sources.user {
            Some(path) if path.exists() => path.display().to_string(),
            Some(path) => format!("{} (absent: the defaults)", path.display()),
            None => "(no user settings: the defaults)".to_owned(),
        };
        RuntimeError::config(format!(
            "project settings {project_path}: {what} would loosen the user's settings {user_path} ({users}); a project's file cannot loosen them"
        ))
    };
    let (was, now) = (strictness(&base), strictness(&combined));
    if now > was {
        let key = if project.approval.is_some() {
            format!("approval = \"{}\"", now.as_str())
        } else {
            "[policy] default".to_owned()
        };
        return Err(refuse(key, format!("approval \"{}\"", was.as_str())));
    }
    let user_restricts = if was < ApprovalMode::Auto {
        Some(format!("approval \"{}\"", was.as_str()))
    } else if let Some(rule) = base
        .rules
        .iter()
        .find(|r| r.decision != PolicyAction::Allow)
    {
        Some(format!("a rule that says {:?} to {}", rule.decision, rule.tool).to_lowercase())
    } else {
        base.policy
            .rules
            .iter()
            .find(|r| r.action != PolicyAction::Allow)
            .map(|r| {
                format!("a [policy] rule that says {:?} to {}", r.action, r.tool).to_lowercase()
            })
    };
    if let Some(restriction) = user_restricts {
        if let Some(index) = project
            .rules
            .iter()
            .position(|r| r.decision == PolicyAction::Allow)
        {
            return Err(refuse(format!("rules[{index}] (allow)"), restriction));
        }
        if let Some(index) = project
            .policy
            .rules
            .iter()
            .position(|r| r.action == PolicyAction::Allow)
        {
            return Err(refuse(
                format!("[policy] rules[{index}] (allow)"),
                restriction,
            ));
        }
    }
    if project.sandbox.fallback == Some(SandboxFallback::PerCall)
        && base.sandbox.fallback != Some(SandboxFallback::PerCall)
    {
        return Err(refuse(
            "sandbox.fallback = \"per-call\"".to_owned(),
            "the sandbox's executor required".to_owned(),
        ));
    }
    let probe = |config: &Config| {
        let mut sandbox = nerve_hands::SandboxConfig::new("", "", nerve_core::ExecutionId::new());
        config.sandbox.apply_limits(&mut sandbox).map(|()| sandbox)
    };
    let (before, after) = (probe(&base)?, probe(&combined)?);
    let limits = [
        (
            "memory",
            base.sandbox.memory.is_some(),
            after.memory_bytes > before.memory_bytes,
        ),
        (
            "pids",
            base.sandbox.pids.is_some(),
            after.pids_limit > before.pids_limit,
        ),
        (
            "cpus",
            base.sandbox.cpus.is_some(),
            after.nano_cpus > before.nano_cpus,
        ),
        (
            "tmp_size",
            base.sandbox.tmp_size.is_some(),
            after.tmp_bytes > before.tmp_bytes,
        ),
    ];
    if let Some((key, _, _)) = limits.iter().find(|(_, set, larger)| *set && *larger) {
        return Err(refuse(
            format!("a larger sandbox.{key}"),
            format!("sandbox.{key} set"),
        ));
    }
    if project_table.contains_key("proxy") {
        return Err(refuse(
            "[proxy]".to_owned(),
            "network rules and credentials come from the user's files only".to_owned(),
        ));
    }
    if let Some(server) = project.mcp.servers.iter().find(|s| s.runs() == "host") {
        return Err(refuse(
            format!("MCP server `{}` with trust = \"host\"", server.name),
            "nothing of a project's runs on the host unless the user's files say so".to_owned(),
        ));
    }
    if let Some(server) = project.mcp.servers.iter().find(|s| !s.env.is_empty()) {
        return Err(refuse(
            format!("MCP server `{}` with env", server.name),
            "the host's variables reach a sandbox only by the user's files".to_owned(),
        ));
    }
    if project.sandbox.busybox.is_some() {
        return Err(refuse(
            "sandbox.busybox".to_owned(),
            "a host file goes into the sandbox image only by the user's files".to_owned(),
        ));
    }
    let caches = &project.sandbox.caches;
    if [&caches.pip, &caches.npm, &caches.cargo]
        .into_iter()
        .any(|c| matches!(c, Some(crate::config::CacheSetting::Shared(_))))
    {
        return Err(refuse(
            "a shared [sandbox.caches] volume".to_owned(),
            "a cache other workspaces share is named only by the user's files (`true` keeps one for this workspace)".to_owned(),
        ));
    }
    if project.trust_project_hooks.is_some() {
        return Err(refuse(
            "trust_project_hooks".to_owned(),
            "only the user's files can trust a project's hooks".to_owned(),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;
