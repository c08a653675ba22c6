//! Turns `--provider SPEC` and `--model` into a provider behind the brain's trait.
//!
//! `openai` reads `OPENAI_BASE_URL` (default `https://api.openai.com/v1`) and
//! `OPENAI_API_KEY` (required for OpenAI itself, optional for a local server); `anthropic`
//! reads `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`) and
//! `ANTHROPIC_API_KEY` (required for Anthropic itself). Keys become `SecretString`s at once
//! and are never printed. Against a custom base URL `--model` is required, since only the
//! server knows its model names.

use std::path::Path;
use std::sync::Arc;

use nerve_brain::{
    AnthropicConfig, AnthropicProvider, ModelTable, OpenAiConfig, OpenAiProvider, Provider,
    ScriptedProvider,
};
use secrecy::SecretString;

use crate::Failure;

/// The model used when `--model` is not given, per official endpoint.
const DEFAULT_OPENAI_MODEL: &str = "gpt-4o";
const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";
/// Anthropic requires an output limit; the model's own limit, capped so that a single
/// non-streamed answer stays well inside the request timeout.
const ANTHROPIC_OUTPUT_CAP: u64 = 16_384;

pub(crate) fn build(spec: &str, model: Option<&str>) -> Result<Arc<dyn Provider>, Failure> {
    build_with(spec, model, &|name| std::env::var(name).ok())
}

/// `env` looks up an environment variable; empty values count as unset.
fn build_with(
    spec: &str,
    model: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Arc<dyn Provider>, Failure> {
    let env = |name: &str| {
        env(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(path) = spec.strip_prefix("script:") {
        if path.is_empty() {
            return Err(Failure::usage(
                "--provider script: needs a cassette path, e.g. script:demo.jsonl",
            ));
        }
        return Ok(Arc::new(
            ScriptedProvider::from_file(Path::new(path)).map_err(Failure::usage)?,
        ));
    }
    match spec {
        "openai" => {
            let base_url = env("OPENAI_BASE_URL");
            let api_key = env("OPENAI_API_KEY").map(SecretString::from);
            let model = choose_model(
                model,
                base_url.as_deref(),
                "OPENAI_BASE_URL",
                DEFAULT_OPENAI_MODEL,
            )?;
            if base_url.is_none() && api_key.is_none() {
                return Err(Failure::usage(
                    "OPENAI_API_KEY is not set (it is needed for api.openai.com; for a local server set OPENAI_BASE_URL)",
                ));
            }
            let mut config = OpenAiConfig::new(model);
            if let Some(url) = base_url {
                config.base_url = url;
            }
            config.api_key = api_key;
            let provider = OpenAiProvider::new(config)
                .map_err(|e| Failure::usage(format!("provider openai: {e}")))?;
            Ok(Arc::new(provider))
        }
        "anthropic" => {
            let base_url = env("ANTHROPIC_BASE_URL");
            let api_key = env("ANTHROPIC_API_KEY").map(SecretString::from);
            let model = choose_model(
                model,
                base_url.as_deref(),
                "ANTHROPIC_BASE_URL",
                DEFAULT_ANTHROPIC_MODEL,
            )?;
            if base_url.is_none() && api_key.is_none() {
                return Err(Failure::usage("ANTHROPIC_API_KEY is not set"));
            }
            let mut config = AnthropicConfig::new(model.clone());
            if let Some(url) = base_url {
                config.base_url = url;
            }
            config.api_key = api_key;
            if let Some(info) = ModelTable::builtin().get(&model) {
                config.max_output_tokens = info.max_output_tokens.min(ANTHROPIC_OUTPUT_CAP);
            }
            let provider = AnthropicProvider::new(config)
                .map_err(|e| Failure::usage(format!("provider anthropic: {e}")))?;
            Ok(Arc::new(provider))
        }
        other => Err(Failure::usage(format!(
            "unknown provider `{other}` (expected script:PATH, openai or anthropic)"
        ))),
    }
}

fn choose_model(
    model: Option<&str>,
    base_url: Option<&str>,
    variable: &str,
    default: &str,
) -> Result<String, Failure> {
    match (model.map(str::trim).filter(|m| !m.is_empty()), base_url) {
        (Some(model), _) => Ok(model.to_owned()),
        (None, None) => Ok(default.to_owned()),
        (None, Some(_)) => Err(Failure::usage(format!(
            "--model is required when {variable} is set (the server's model name)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        spec: &str,
        model: Option<&str>,
        vars: &[(&str, &str)],
        expected: Result<(&str, &str), &str>,
    ) {
        let env = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        };
        let outcome = build_with(spec, model, &env)
            .map(|p| (p.name().to_owned(), p.model().to_owned()))
            .map_err(|f| (f.code, f.message));
        match expected {
            Ok((name, model)) => assert_eq!(
                outcome.unwrap(),
                (name.to_owned(), model.to_owned()),
                "{spec} {vars:?}"
            ),
            Err(message) => assert_eq!(
                outcome.unwrap_err(),
                (2, message.to_owned()),
                "{spec} {vars:?}"
            ),
        }
    }

    #[test]
    fn specs_and_environment_choose_the_provider() {
        check(
            "openai",
            None,
            &[("OPENAI_API_KEY", "sk-x")],
            Ok(("openai", "gpt-4o")),
        );
        check(
            "openai",
            Some("gpt-4.1"),
            &[("OPENAI_API_KEY", "sk-x")],
            Ok(("openai", "gpt-4.1")),
        );
        check(
            "openai",
            Some("qwen2.5-coder"),
            &[("OPENAI_BASE_URL", "http://localhost:8000/v1")],
            Ok(("openai", "qwen2.5-coder")),
        );
        check(
            "openai",
            None,
            &[],
            Err(
                "OPENAI_API_KEY is not set (it is needed for api.openai.com; for a local server set OPENAI_BASE_URL)",
            ),
        );
        check(
            "openai",
            None,
            &[("OPENAI_API_KEY", " ")],
            Err(
                "OPENAI_API_KEY is not set (it is needed for api.openai.com; for a local server set OPENAI_BASE_URL)",
            ),
        );
        check(
            "openai",
            None,
            &[("OPENAI_BASE_URL", "http://localhost:11434/v1")],
            Err("--model is required when OPENAI_BASE_URL is set (the server's model name)"),
        );
        check(
            "openai",
            Some("m"),
            &[("OPENAI_BASE_URL", "localhost:8000")],
            Err(
                "provider openai: invalid base URL `localhost:8000`: it must start with http:// or https://",
            ),
        );
        check(
            "anthropic",
            None,
            &[("ANTHROPIC_API_KEY", "sk-ant-x")],
            Ok(("anthropic", "claude-sonnet-4-5")),
        );
        check(
            "anthropic",
            Some("claude-haiku-4-5"),
            &[("ANTHROPIC_API_KEY", "sk-ant-x")],
            Ok(("anthropic", "claude-haiku-4-5")),
        );
        check("anthropic", None, &[], Err("ANTHROPIC_API_KEY is not set"));
        check(
            "script:",
            None,
            &[],
            Err("--provider script: needs a cassette path, e.g. script:demo.jsonl"),
        );
        check(
            "gemini",
            None,
            &[],
            Err("unknown provider `gemini` (expected script:PATH, openai or anthropic)"),
        );
    }
}
