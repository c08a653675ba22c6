//! The settings a command runs with (the runtime's layers: defaults, the user's file, the
//! project's, `--config`, the environment, the flags), and `nerve config`, which prints
//! them with where each value came from.

use std::path::Path;

use nerve_runtime::config::Config;
use nerve_runtime::settings::{Entry, Flags, Layer, Settings, Sources};

use crate::Failure;
use crate::args::ConfigArgs;
use crate::output;

/// The settings for a command on `workspace` (none: no project file counts), with a
/// warning on stderr for what was left out (a project's hooks the user does not trust).
pub(crate) fn load(
    named: Option<&Path>,
    workspace: Option<&Path>,
    flags: Flags,
) -> Result<Config, Failure> {
    let settings = nerve_runtime::settings::load(&Sources::discover(named, workspace, flags))?;
    warn_ignored(&settings);
    Ok(settings.config)
}

/// The settings of a front end that serves many workspaces (`acp`, `serve`): the user's
/// file, `--config` and the environment, no project file; `--sandbox-fallback` given.
pub(crate) fn load_serving(
    named: Option<&Path>,
    sandbox_fallback: Option<nerve_runtime::config::SandboxFallback>,
) -> Result<Config, Failure> {
    let flags = Flags {
        sandbox_fallback,
        ..Flags::default()
    };
    load(named, None, flags)
}

fn warn_ignored(settings: &Settings) {
    let Some((first, reason)) = settings.ignored.first() else {
        return;
    };
    let mut keys: Vec<&str> = settings
        .ignored
        .iter()
        .map(|(e, _)| e.key.as_str())
        .collect();
    keys.dedup();
    output::error_line(&format!(
        "nerve: warning: {} of {} not run: {reason}",
        keys.join(", "),
        first
            .origin
            .detail
            .as_deref()
            .unwrap_or("the project's settings"),
    ));
}

/// `nerve config`.
pub(crate) fn show(args: ConfigArgs, named: Option<&Path>) -> Result<u8, Failure> {
    let here;
    let workspace = match &args.workspace {
        Some(dir) => dir.as_path(),
        None => {
            here = std::env::current_dir()
                .map_err(|e| Failure::usage(format!("cannot read the current directory: {e}")))?;
            here.as_path()
        }
    };
    let flags = Flags {
        provider: args.provider,
        model: args.model,
        approval: args.approval.map(Into::into),
        context_window: args.context_window,
        sandbox_fallback: args.sandbox_fallback.map(Into::into),
    };
    let settings =
        nerve_runtime::settings::load(&Sources::discover(named, Some(workspace), flags))?;
    // Settings hold no secret by design (credentials are named, not written), but a hook's
    // command line might: the well-known token formats are replaced.
    let redactor = nerve_core::Redactor::new();
    if args.json {
        let entry_json = |entry: &Entry| {
            serde_json::json!({
                "key": entry.key,
                "value": entry.value.as_ref().map(|v| serde_json::to_value(v).unwrap_or_default()),
                "from": entry.origin.layer.as_str(),
                "source": entry.origin.detail,
            })
        };
        let value = serde_json::json!({
            "files": settings.files.iter().map(|f| serde_json::json!({
                "layer": f.layer.as_str(),
                "path": f.path.display().to_string(),
                "exists": f.exists,
            })).collect::<Vec<_>>(),
            "settings": settings.entries.iter().map(entry_json).collect::<Vec<_>>(),
            "ignored": settings.ignored.iter().map(|(entry, reason)| {
                let mut value = entry_json(entry);
                value["reason"] = serde_json::Value::String(reason.clone());
                value
            }).collect::<Vec<_>>(),
        });
        let text = redactor.redact(&value.to_string()).into_owned();
        output::line(&text);
        return Ok(0);
    }
    output::line("files (weakest first):");
    for file in &settings.files {
        let state = if file.exists { "" } else { "  (none)" };
        output::line(&format!(
            "  {:<8} {}{state}",
            file.layer.as_str(),
            file.path.display()
        ));
    }
    let rows: Vec<(String, String, String)> = settings
        .entries
        .iter()
        .map(|entry| (entry.key.clone(), value_text(entry), source_text(entry)))
        .collect();
    let key_width = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|(_, v, _)| v.chars().count())
        .max()
        .unwrap_or(0)
        .min(48);
    output::line("settings:");
    for (key, value, source) in rows {
        let line = format!("  {key:<key_width$}  {value:<value_width$}  {source}");
        output::line(redactor.redact(line.trim_end()).as_ref());
    }
    if !settings.ignored.is_empty() {
        output::line("ignored:");
        for (entry, reason) in &settings.ignored {
            let line = format!(
                "  {}  {}  {}: {reason}",
                entry.key,
                value_text(entry),
                source_text(entry)
            );
            output::line(redactor.redact(&line).as_ref());
        }
    }
    Ok(0)
}

fn value_text(entry: &Entry) -> String {
    match (&entry.value, entry.key.as_str()) {
        (Some(value), _) => value.to_string(),
        (None, "model") => "(the provider's default)".to_owned(),
        (None, "context_window") => "(the model table's)".to_owned(),
        (None, _) => "(none)".to_owned(),
    }
}

fn source_text(entry: &Entry) -> String {
    match (&entry.origin.layer, &entry.origin.detail) {
        (Layer::Default, _) | (_, None) => entry.origin.layer.as_str().to_owned(),
        (layer, Some(detail)) => format!("{} {detail}", layer.as_str()),
    }
}
