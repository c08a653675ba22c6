//! Turns `--provider SPEC` and `--model` into a provider behind the brain's trait.
//!
//! `openai` reads `OPENAI_BASE_URL` (default `https://api.openai.com/v1`) and
//! `OPENAI_API_KEY` (required for OpenAI itself, optional for a local server); `anthropic`
//! reads `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`) and
//! `ANTHROPIC_API_KEY` (required for Anthropic itself). Keys become `SecretString`s at once
//! and are never printed. Against a custom base URL `--model` is required, since only the
//! server knows its model names.
//!
//! The model table and `--context-window` give the client the model's output limit and
//! window, so that the output limit it asks for always fits; `[providers.anthropic]
//! prompt_caching = false` in the configuration turns cache breakpoints off (for a gateway
//! in front of a model that is not Claude); `stream = false` under `[providers.openai]` or
//! `[providers.anthropic]` makes that client ask for whole answers instead of streams.
//!
//! Before anything runs, an HTTP provider's endpoint is checked: its host must resolve and
//! accept a TCP connection within a few seconds. Otherwise the run would start, record its
//! events and fail at the first model call after every retry; an unreachable endpoint is a
//! configuration error (exit 2, nothing written). When a proxy variable applies to the
//! endpoint's scheme the check is skipped, since the proxy, not us, connects.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nerve_brain::{
    AnthropicConfig, AnthropicProvider, HttpConfig, ModelTable, OpenAiConfig, OpenAiProvider,
    Provider, ScriptedProvider, ToolChoice, ToolProtocol,
};
use secrecy::SecretString;

use crate::RuntimeError;

/// The model used when `--model` is not given, per official endpoint.
const DEFAULT_OPENAI_MODEL: &str = "gpt-4o";
const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-4-5";
/// Anthropic requires an output limit; the model's own limit, capped so that a single
/// non-streamed answer stays well inside the request timeout.
const ANTHROPIC_OUTPUT_CAP: u64 = 16_384;

/// The output limit of a model the table does not know: enough for a long file edit, and
/// a bound on a small model that never stops (the window alone would let it write for
/// many minutes). `[[models]]` in the configuration gives a model its own.
const UNKNOWN_MODEL_OUTPUT_TOKENS: u64 = 4_096;

/// How long the pre-flight check may take: resolving the endpoint's host and connecting.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the configuration file and the run's flags say about the provider.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The built-in model table with the file's `[[models]]`.
    pub table: ModelTable,
    /// `--context-window`; else the table's window for the model.
    pub context_window: Option<u64>,
    /// `[providers.anthropic] prompt_caching`; on unless set to false.
    pub anthropic_prompt_caching: Option<bool>,
    /// `[providers.openai] stream`; on unless set to false.
    pub openai_stream: Option<bool>,
    /// `[providers.anthropic] stream`; on unless set to false.
    pub anthropic_stream: Option<bool>,
    /// `[providers.openai] tool_choice`; `auto` unless set.
    pub openai_tool_choice: Option<ToolChoice>,
    /// `[providers.anthropic] tool_choice`; `auto` unless set.
    pub anthropic_tool_choice: Option<ToolChoice>,
    /// `[providers.openai] tool_protocol`; `auto` unless set.
    pub openai_tool_protocol: Option<ToolProtocol>,
    /// `[providers.anthropic] tool_protocol`; `auto` unless set.
    pub anthropic_tool_protocol: Option<ToolProtocol>,
    /// `[providers.openai] request_timeout_secs` and `idle_timeout_secs`.
    pub openai_timeouts: Timeouts,
    /// `[providers.anthropic] request_timeout_secs` and `idle_timeout_secs`.
    pub anthropic_timeouts: Timeouts,
}

/// A provider section's timeouts; the client's defaults where unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// A whole (non-streamed) answer, answer included.
    pub request_secs: Option<NonZeroU64>,
    /// The longest silence of a stream.
    pub idle_secs: Option<NonZeroU64>,
}

impl Timeouts {
    /// `http` with these timeouts where they are set.
    fn applied(self, mut http: HttpConfig) -> HttpConfig {
        if let Some(secs) = self.request_secs {
            http.request_timeout = Duration::from_secs(secs.get());
        }
        if let Some(secs) = self.idle_secs {
            http.idle_timeout = Duration::from_secs(secs.get());
        }
        http
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            table: ModelTable::builtin(),
            context_window: None,
            anthropic_prompt_caching: None,
            openai_stream: None,
            anthropic_stream: None,
            openai_tool_choice: None,
            anthropic_tool_choice: None,
            openai_tool_protocol: None,
            anthropic_tool_protocol: None,
            openai_timeouts: Timeouts::default(),
            anthropic_timeouts: Timeouts::default(),
        }
    }
}

/// The provider `spec` names, checked to be reachable when it speaks HTTP.
pub async fn build(
    spec: &str,
    model: Option<&str>,
    settings: &Settings,
) -> Result<Arc<dyn Provider>, RuntimeError> {
    let env = |name: &str| std::env::var(name).ok();
    let (provider, endpoint) = build_with(spec, model, settings, &env)?;
    if let Some(url) = endpoint
        && !proxied(&url, &env)
    {
        preflight(provider.name(), &url, PREFLIGHT_TIMEOUT).await?;
    }
    Ok(provider)
}

/// The provider, and the base URL it will call when it speaks HTTP. `env` looks up an
/// environment variable; empty values count as unset.
fn build_with(
    spec: &str,
    model: Option<&str>,
    settings: &Settings,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Arc<dyn Provider>, Option<String>), RuntimeError> {
    let env = |name: &str| {
        env(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(path) = spec.strip_prefix("script:") {
        if path.is_empty() {
            return Err(RuntimeError::usage(
                "--provider script: needs a cassette path, e.g. script:demo.jsonl",
            ));
        }
        return Ok((
            Arc::new(ScriptedProvider::from_file(Path::new(path)).map_err(RuntimeError::provider)?),
            None,
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
                return Err(RuntimeError::provider(
                    "OPENAI_API_KEY is not set (it is needed for api.openai.com; for a local server set OPENAI_BASE_URL)",
                ));
            }
            let info = settings.table.get(&model).cloned();
            let mut config = OpenAiConfig::new(model);
            if let Some(url) = base_url {
                config.base_url = url;
            }
            config.api_key = api_key;
            config.max_output_tokens = Some(
                info.as_ref()
                    .map_or(UNKNOWN_MODEL_OUTPUT_TOKENS, |m| m.max_output_tokens),
            );
            config.context_window = settings
                .context_window
                .or(info.as_ref().map(|m| m.context_window));
            config.stream = settings.openai_stream.unwrap_or(true);
            config.tool_choice = settings.openai_tool_choice.clone().unwrap_or_default();
            config.tool_protocol = settings.openai_tool_protocol.unwrap_or_default();
            config.http = settings.openai_timeouts.applied(config.http);
            let url = config.base_url.clone();
            let provider = OpenAiProvider::new(config)
                .map_err(|e| RuntimeError::provider(format!("provider openai: {e}")))?;
            Ok((Arc::new(provider), Some(url)))
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
                return Err(RuntimeError::provider("ANTHROPIC_API_KEY is not set"));
            }
            let mut config = AnthropicConfig::new(model.clone());
            if let Some(url) = base_url {
                config.base_url = url;
            }
            config.api_key = api_key;
            let info = settings.table.get(&model);
            config.max_output_tokens = info.map_or(UNKNOWN_MODEL_OUTPUT_TOKENS, |info| {
                info.max_output_tokens.min(ANTHROPIC_OUTPUT_CAP)
            });
            config.context_window = settings.context_window.or(info.map(|m| m.context_window));
            config.prompt_caching = settings.anthropic_prompt_caching.unwrap_or(true);
            config.stream = settings.anthropic_stream.unwrap_or(true);
            config.tool_choice = settings.anthropic_tool_choice.clone().unwrap_or_default();
            config.tool_protocol = settings.anthropic_tool_protocol.unwrap_or_default();
            config.http = settings.anthropic_timeouts.applied(config.http);
            let url = config.base_url.clone();
            let provider = AnthropicProvider::new(config)
                .map_err(|e| RuntimeError::provider(format!("provider anthropic: {e}")))?;
            Ok((Arc::new(provider), Some(url)))
        }
        other => Err(RuntimeError::usage(format!(
            "unknown provider `{other}` (expected script:PATH, openai or anthropic)"
        ))),
    }
}

fn choose_model(
    model: Option<&str>,
    base_url: Option<&str>,
    variable: &str,
    default: &str,
) -> Result<String, RuntimeError> {
    match (model.map(str::trim).filter(|m| !m.is_empty()), base_url) {
        (Some(model), _) => Ok(model.to_owned()),
        (None, None) => Ok(default.to_owned()),
        (None, Some(_)) => Err(RuntimeError::usage(format!(
            "--model is required when {variable} is set (the server's model name)"
        ))),
    }
}

/// Where a base URL connects to, and how to show it (without any user info).
#[derive(Debug, PartialEq, Eq)]
struct Endpoint {
    host: String,
    port: u16,
    shown: String,
}

/// Splits `http[s]://[user@]host[:port][/path]`; `None` for anything else (the provider
/// already refused such a URL).
fn endpoint(url: &str) -> Option<Endpoint> {
    let (scheme, rest, default_port) = if let Some(rest) = url.strip_prefix("https://") {
        ("https", rest, 443)
    } else if let Some(rest) = url.strip_prefix("http://") {
        ("http", rest, 80)
    } else {
        return None;
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        // An IPv6 literal: `[::1]` or `[::1]:8080`.
        let (host, after) = bracketed.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        (host, port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, port.parse().ok()?),
            None => (authority, default_port),
        }
    };
    if host.is_empty() {
        return None;
    }
    Some(Endpoint {
        host: host.to_owned(),
        port,
        shown: format!("{scheme}://{authority}{path}"),
    })
}

/// Whether requests to `url` go through a proxy from the environment (as the HTTP client
/// does by default), so that a direct connection says nothing.
fn proxied(url: &str, env: &dyn Fn(&str) -> Option<String>) -> bool {
    let scheme_vars: &[&str] = if url.starts_with("https://") {
        &["HTTPS_PROXY", "https_proxy"]
    } else {
        &["HTTP_PROXY", "http_proxy"]
    };
    scheme_vars
        .iter()
        .chain(&["ALL_PROXY", "all_proxy"])
        .any(|name| env(name).is_some_and(|v| !v.trim().is_empty()))
}

/// Resolves the endpoint's host and opens (and drops) a TCP connection to it, all within
/// `timeout`.
async fn preflight(provider: &str, url: &str, timeout: Duration) -> Result<(), RuntimeError> {
    let Some(endpoint) = endpoint(url) else {
        return Ok(());
    };
    let unreachable = |why: String| {
        RuntimeError::provider(format!(
            "provider {provider} at {} is unreachable: {why}",
            endpoint.shown
        ))
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let too_slow = || format!("no answer within {} s", timeout.as_secs());
    let addresses = tokio::time::timeout_at(
        deadline,
        tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port)),
    )
    .await
    .map_err(|_| unreachable(too_slow()))?
    .map_err(|e| unreachable(format!("cannot resolve {}: {e}", endpoint.host)))?;
    let mut last = format!("{} has no address", endpoint.host);
    for address in addresses {
        match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(address)).await {
            Ok(Ok(_connection)) => return Ok(()),
            Ok(Err(error)) => last = describe_connect(&error),
            Err(_) => return Err(unreachable(too_slow())),
        }
    }
    Err(unreachable(last))
}

fn describe_connect(error: &std::io::Error) -> String {
    // An if-chain, not a match: io::ErrorKind is non-exhaustive.
    let kind = error.kind();
    if kind == std::io::ErrorKind::ConnectionRefused {
        "connection refused".to_owned()
    } else if kind == std::io::ErrorKind::HostUnreachable {
        "host unreachable".to_owned()
    } else if kind == std::io::ErrorKind::NetworkUnreachable {
        "network unreachable".to_owned()
    } else if kind == std::io::ErrorKind::TimedOut {
        "connection timed out".to_owned()
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_set_replaces_only_its_own_default() {
        let defaults = HttpConfig::default();
        let request = Timeouts {
            request_secs: NonZeroU64::new(240),
            idle_secs: None,
        }
        .applied(defaults.clone());
        assert_eq!(request.request_timeout, Duration::from_secs(240));
        assert_eq!(request.idle_timeout, defaults.idle_timeout);
        let idle = Timeouts {
            request_secs: None,
            idle_secs: NonZeroU64::new(30),
        }
        .applied(defaults.clone());
        assert_eq!(idle.idle_timeout, Duration::from_secs(30));
        assert_eq!(idle.request_timeout, defaults.request_timeout);
    }

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
        let outcome = build_with(spec, model, &Settings::default(), &env)
            .map(|(p, _)| (p.name().to_owned(), p.model().to_owned()))
            // Every mistake refuses the run before anything starts (the CLI's exit 2).
            .map_err(|e| (e.kind().refused_before_start(), e.to_string()));
        match expected {
            Ok((name, model)) => assert_eq!(
                outcome.unwrap(),
                (name.to_owned(), model.to_owned()),
                "{spec} {vars:?}"
            ),
            Err(message) => assert_eq!(
                outcome.unwrap_err(),
                (true, message.to_owned()),
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

    #[test]
    fn http_providers_name_the_endpoint_they_call() {
        let url = |spec: &str, vars: &[(&str, &str)]| {
            let env = |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            };
            build_with(spec, Some("m"), &Settings::default(), &env)
                .unwrap()
                .1
        };
        assert_eq!(
            url("openai", &[("OPENAI_API_KEY", "sk-x")]).as_deref(),
            Some("https://api.openai.com/v1")
        );
        assert_eq!(
            url("openai", &[("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")]).as_deref(),
            Some("http://127.0.0.1:9/v1")
        );
        assert_eq!(
            url("anthropic", &[("ANTHROPIC_API_KEY", "sk-ant-x")]).as_deref(),
            Some("https://api.anthropic.com")
        );
    }

    fn check_endpoint(url: &str, expected: Option<(&str, u16, &str)>) {
        assert_eq!(
            endpoint(url),
            expected.map(|(host, port, shown)| Endpoint {
                host: host.to_owned(),
                port,
                shown: shown.to_owned(),
            }),
            "{url}"
        );
    }

    #[test]
    fn endpoints_are_split_into_host_and_port() {
        check_endpoint(
            "https://api.openai.com/v1",
            Some(("api.openai.com", 443, "https://api.openai.com/v1")),
        );
        check_endpoint(
            "http://127.0.0.1:9/v1",
            Some(("127.0.0.1", 9, "http://127.0.0.1:9/v1")),
        );
        check_endpoint(
            "http://localhost",
            Some(("localhost", 80, "http://localhost")),
        );
        check_endpoint(
            "http://[::1]:8000/v1",
            Some(("::1", 8000, "http://[::1]:8000/v1")),
        );
        check_endpoint("https://[::1]", Some(("::1", 443, "https://[::1]")));
        // User info is never shown.
        check_endpoint(
            "https://user:pw@llm.internal:8443/v1",
            Some(("llm.internal", 8443, "https://llm.internal:8443/v1")),
        );
        check_endpoint("https://host:port/v1", None);
        check_endpoint("https:///v1", None);
        check_endpoint("ftp://host", None);
    }

    #[test]
    fn a_proxy_variable_for_the_scheme_skips_the_check() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(proxied(
            "https://a",
            &env(&[("HTTPS_PROXY", "http://p:3128")])
        ));
        assert!(proxied("http://a", &env(&[("all_proxy", "socks5://p")])));
        assert!(!proxied(
            "http://a",
            &env(&[("HTTPS_PROXY", "http://p:3128")])
        ));
        assert!(!proxied("https://a", &env(&[("HTTPS_PROXY", " ")])));
    }

    #[tokio::test]
    async fn the_preflight_connects_or_says_why_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = format!("http://{}/v1", listener.local_addr().unwrap());
        assert!(
            preflight("openai", &open, Duration::from_secs(5))
                .await
                .is_ok()
        );
        drop(listener);
        let failure = preflight("openai", &open, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            failure,
            RuntimeError::Provider(format!(
                "provider openai at {open} is unreachable: connection refused"
            ))
        );
        let failure = preflight(
            "anthropic",
            "https://no-such-host.invalid",
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        let message = failure.message();
        assert!(
            message.starts_with(
                "provider anthropic at https://no-such-host.invalid is unreachable: cannot resolve no-such-host.invalid"
            ) || message.ends_with("no answer within 5 s"),
            "{message}"
        );
    }
}
