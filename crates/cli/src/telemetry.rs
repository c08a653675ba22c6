//! The tracing subscriber of `nerve`: log lines on stderr (filtered by `NERVE_LOG`) and,
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the
//! engine's spans exported over OTLP/HTTP. Without an endpoint nothing more is installed.
//!
//! Only spans of Nerve's own crates are exported, never events: a span's fields are written
//! by `nerve_brain::telemetry`, which puts free text through the run's redactor, whereas a
//! log event's fields are not. The standard variables are read by the exporter:
//! `OTEL_EXPORTER_OTLP_{,TRACES_}{ENDPOINT,HEADERS,TIMEOUT,PROTOCOL}`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SDK_DISABLED`.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::Failure;

/// Turns message content in spans on (`true`) or off (`false`, the default). The name the
/// OpenTelemetry GenAI instrumentations use for the same opt-in.
pub(crate) const CAPTURE_CONTENT_VAR: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

/// How long an export may take when `OTEL_EXPORTER_OTLP_TIMEOUT` does not say.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The installed exporter, flushed and shut down by [`Telemetry::shutdown`] before exit.
#[derive(Debug)]
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports every span still queued, then stops the exporter. Blocking: call it outside
    /// the async runtime. A backend that cannot be reached costs at most the export timeout
    /// and a warning on stderr, never the run's exit code.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            crate::output::error_line(&format!(
                "nerve: warning: could not export the trace: {error}"
            ));
        }
    }
}

/// Reads a variable the way the OpenTelemetry specification treats them: unset and empty
/// are the same.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether spans may carry message content, from [`CAPTURE_CONTENT_VAR`].
pub(crate) fn capture_content() -> Result<bool, Failure> {
    parse_flag(CAPTURE_CONTENT_VAR, var(CAPTURE_CONTENT_VAR).as_deref())
}

fn parse_flag(name: &str, value: Option<&str>) -> Result<bool, Failure> {
    match value.map(str::trim) {
        None => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(false),
        Some(v) => Err(Failure::usage(format!(
            "{name} must be true or false, not `{v}`"
        ))),
    }
}

/// Installs the subscriber: always the stderr log, plus the OTLP exporter when an endpoint
/// is configured. A bad `OTEL_*` setting is a usage error.
pub(crate) fn init() -> Result<Telemetry, Failure> {
    // Checked here so that a bad value stops `nerve` before anything runs.
    capture_content()?;
    let filter = tracing_subscriber::EnvFilter::try_from_env("NERVE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(crate::output::stderr_colour())
        .with_filter(filter);
    let settings = ExportSettings::from_env(&|name| var(name))?;
    let Some(settings) = settings else {
        let _ = tracing_subscriber::registry().with(log).try_init();
        return Ok(Telemetry { provider: None });
    };
    let provider = build_provider(&settings)?;
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("nerve"))
        // Only the attributes the spans declare: not where in the code, nor busy/idle time.
        .with_threads(false)
        .with_location(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
            metadata.is_span()
                && *metadata.level() <= tracing::Level::INFO
                && metadata.target().starts_with("nerve_")
        }));
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(spans)
        .try_init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// What the environment asks of the exporter, checked before anything starts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ExportSettings {
    /// The endpoint a plain-`http` URL names (a local collector) needs no CA certificates.
    endpoint: String,
    protocol: opentelemetry_otlp::Protocol,
    timeout: Duration,
    /// `None`: `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES` names the service.
    default_service_name: Option<&'static str>,
}

impl ExportSettings {
    /// `None` when no endpoint is set (or `OTEL_SDK_DISABLED=true`): export nothing.
    fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, Failure> {
        if parse_flag("OTEL_SDK_DISABLED", var("OTEL_SDK_DISABLED").as_deref())? {
            return Ok(None);
        }
        let Some(endpoint) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .map(|e| ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", e))
            .or_else(|| {
                var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|e| ("OTEL_EXPORTER_OTLP_ENDPOINT", e))
            })
        else {
            return Ok(None);
        };
        let (name, endpoint) = endpoint;
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Failure::usage(format!(
                "{name} must be an http:// or https:// URL, not `{endpoint}`"
            )));
        }
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .map(|p| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", p))
            .or_else(|| {
                var("OTEL_EXPORTER_OTLP_PROTOCOL").map(|p| ("OTEL_EXPORTER_OTLP_PROTOCOL", p))
            }) {
            None => opentelemetry_otlp::Protocol::HttpBinary,
            Some((_, p)) if p.trim() == "http/protobuf" => opentelemetry_otlp::Protocol::HttpBinary,
            Some((_, p)) if p.trim() == "http/json" => opentelemetry_otlp::Protocol::HttpJson,
            Some((name, p)) => {
                return Err(Failure::usage(format!(
                    "{name}={p} is not supported: nerve exports over http/protobuf (the default) or http/json"
                )));
            }
        };
        let timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .map(|t| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", t))
            .or_else(|| {
                var("OTEL_EXPORTER_OTLP_TIMEOUT").map(|t| ("OTEL_EXPORTER_OTLP_TIMEOUT", t))
            }) {
            None => DEFAULT_TIMEOUT,
            Some((name, t)) => {
                t.trim()
                    .parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| {
                        Failure::usage(format!(
                            "{name} must be a number of milliseconds, not `{t}`"
                        ))
                    })?
            }
        };
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
        Ok(Some(Self {
            endpoint,
            protocol,
            timeout,
            default_service_name: (!named).then_some("nerve"),
        }))
    }
}

fn build_provider(settings: &ExportSettings) -> Result<SdkTracerProvider, Failure> {
    let client = http_client(settings)?;
    // The endpoint is left to the exporter, which reads the same variables and appends
    // `/v1/traces` to the generic one, as the specification says.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(settings.protocol)
        .with_timeout(settings.timeout)
        .build()
        .map_err(|e| Failure::usage(format!("cannot set up the OTLP exporter: {e}")))?;
    let mut resource = Resource::builder().with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    if let Some(name) = settings.default_service_name {
        resource = resource.with_service_name(name);
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// A blocking client (the batch processor exports from its own thread) on rustls with the
/// *ring* provider, like the model clients: the platform's roots for `https`, none needed
/// for a plain-`http` collector on this machine.
fn http_client(settings: &ExportSettings) -> Result<reqwest::blocking::Client, Failure> {
    let crypto = Arc::new(rustls::crypto::ring::default_provider());
    let builder = || {
        rustls::ClientConfig::builder_with_provider(Arc::clone(&crypto))
            .with_safe_default_protocol_versions()
            .map_err(|e| Failure::usage(format!("OTLP exporter TLS: {e}")))
    };
    let tls = match rustls_platform_verifier::BuilderVerifierExt::with_platform_verifier(builder()?)
    {
        Ok(tls) => tls.with_no_client_auth(),
        Err(_) if settings.endpoint.starts_with("http://") => builder()?
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth(),
        Err(error) => {
            return Err(Failure::usage(format!(
                "OTLP exporter TLS: no usable CA certificates: {error}"
            )));
        }
    };
    reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(tls)
        .user_agent(concat!("nerve/", env!("CARGO_PKG_VERSION")))
        .timeout(settings.timeout)
        // The trace goes where it was told to, not wherever a redirect points.
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Failure::usage(format!("cannot set up the OTLP exporter's client: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(vars: &[(&str, &str)]) -> Result<Option<ExportSettings>, String> {
        let lookup = |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
                .filter(|v| !v.is_empty())
        };
        ExportSettings::from_env(&lookup).map_err(|f| {
            assert_eq!(f.code, 2, "a bad setting is a usage error");
            f.message
        })
    }

    #[test]
    fn no_endpoint_installs_nothing() {
        assert_eq!(check(&[]), Ok(None));
        assert_eq!(check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]), Ok(None));
        assert_eq!(
            check(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                ("OTEL_SDK_DISABLED", "true")
            ]),
            Ok(None)
        );
    }

    #[test]
    fn an_endpoint_takes_the_standard_settings() {
        let settings = check(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.protocol, opentelemetry_otlp::Protocol::HttpJson);
        assert_eq!(settings.timeout, Duration::from_millis(2500));
        assert_eq!(settings.default_service_name, Some("nerve"));
        let settings = check(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://otel.example/v1/traces",
            ),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment=ci,service.name=bots",
            ),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(settings.protocol, opentelemetry_otlp::Protocol::HttpBinary);
        assert_eq!(settings.timeout, DEFAULT_TIMEOUT);
        assert_eq!(settings.default_service_name, None);
    }

    #[test]
    fn bad_settings_are_one_line_usage_errors() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4317")],
                "OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https:// URL, not `127.0.0.1:4317`",
            ),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported: nerve exports over http/protobuf (the default) or http/json",
            ),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "10s")],
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT must be a number of milliseconds, not `10s`",
            ),
            (
                &[endpoint, ("OTEL_SDK_DISABLED", "maybe")],
                "OTEL_SDK_DISABLED must be true or false, not `maybe`",
            ),
            (
                &[endpoint, ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/xml")],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/xml is not supported: nerve exports over http/protobuf (the default) or http/json",
            ),
        ];
        for (vars, expected) in cases {
            assert_eq!(check(vars), Err(expected.to_owned()), "{vars:?}");
        }
    }

    #[test]
    fn the_content_opt_in_is_a_boolean() {
        for (value, expected) in [
            (None, Ok(false)),
            (Some("TRUE"), Ok(true)),
            (Some("1"), Ok(true)),
            (Some("false"), Ok(false)),
        ] {
            assert_eq!(
                parse_flag(CAPTURE_CONTENT_VAR, value).map_err(|f| f.message),
                expected
            );
        }
        let error = parse_flag(CAPTURE_CONTENT_VAR, Some("yes")).unwrap_err();
        assert_eq!(
            error.message,
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT must be true or false, not `yes`"
        );
    }
}
