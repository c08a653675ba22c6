//! `nerve serve`: an HTTP API over the runtime, the front end a team's tools (and, later,
//! a web page) use to watch and steer executions. It only translates: executions are
//! assembled and run by `nerve-runtime` as `nerve run` and a worker do, the log is read
//! through the runtime's reader, and every answer goes out through the configuration's
//! redactor. Routing, extraction, body limits and Server-Sent Events are axum's.
//!
//! - `actions`: what the API and the web view both do (start, refuse while running, decide).
//! - `api`: the routes of `/api/v1`, and the router of every route.
//! - `app`: what the routes share: the state, errors as JSON, the redacted answers.
//! - `auth`: `Authorization: Bearer` tokens checked against the log's `api_tokens`.
//! - `runs`: the executions this server runs, by id, for `cancel` and for a stream to wait
//!   on an execution that has not written its first event yet.
//! - `events`: an execution's events as a resumable `text/event-stream`.
//! - `log_stream`: every execution's events, in the log's order, as one resumable stream.
//! - `openapi`: the OpenAPI description, generated from the handlers and the answers' types.
//! - `sessions`: the web view's logins (a random id in the cookie stands for the token).
//! - `tls`: HTTPS with the server's own certificate (rustls).
//! - `web`: the web view: a token login, the executions and a form that starts one, an
//!   execution's page (transcript, live events, approvals, totals, the diff per turn), and
//!   the fleet's queue and workers.
//!
//! The security model is in docs/api.md: no route without a token, scopes that include
//! one another, no CORS, bounded bodies, loopback unless TLS or `--insecure-http`.

mod actions;
mod api;
mod app;
mod auth;
mod events;
mod log_stream;
mod openapi;
mod runs;
mod sessions;
mod tls;
mod web;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_core::{Complexity, LoopType};
use nerve_runtime::RuntimeError;
use nerve_runtime::config::Config;
use tokio_util::sync::CancellationToken;

pub use crate::tls::TlsFiles;

/// The largest request body a route reads; larger ones get 413.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// What the server runs with (`nerve serve`'s options).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub listen: SocketAddr,
    /// Executions are created only in workspaces under one of these (made absolute).
    pub workspace_roots: Vec<PathBuf>,
    /// Listening on a non-loopback address without TLS was asked for explicitly.
    pub insecure_http: bool,
    /// Serve HTTPS with this certificate and key (`--tls-cert`, `--tls-key`).
    pub tls: Option<TlsFiles>,
    pub body_limit: usize,
    /// The run options of the executions the server creates.
    pub run: RunDefaults,
    /// Providers a request may name besides `run.provider`.
    pub allowed_providers: Vec<String>,
}

/// The run options of `nerve run` that the server gives every execution it creates.
#[derive(Debug, Clone, PartialEq)]
pub struct RunDefaults {
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
}

/// Why the server did not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The settings refuse to serve (a non-loopback address without TLS, no workspace
    /// root that exists), or the log or configuration cannot be used. Returned by
    /// [`Server::bind`] before anything listens; not retryable as it is.
    #[error("{0}")]
    Refused(#[from] RuntimeError),
    /// The address cannot be bound or the listener failed. Returned by [`Server::bind`]
    /// and [`Server::run`]; retryable once the address is free.
    #[error("{0}")]
    Io(String),
}

/// A bound server, not yet serving.
#[derive(Debug)]
pub struct Server {
    listener: Listener,
    local: SocketAddr,
    app: Arc<app::App>,
}

/// Plain HTTP, or HTTPS with the server's own certificate.
#[derive(Debug)]
enum Listener {
    Plain(tokio::net::TcpListener),
    Tls(tls::TlsListener),
}

impl Server {
    /// Checks the settings, opens the log (creating and migrating it, for its tokens) and
    /// binds the address.
    pub async fn bind(db: PathBuf, config: Config, settings: Settings) -> Result<Self, ServeError> {
        if !settings.listen.ip().is_loopback() && settings.tls.is_none() && !settings.insecure_http
        {
            return Err(RuntimeError::usage(format!(
                "refusing to listen on {} without TLS: tokens would cross the network in clear text; give --tls-cert and --tls-key, listen on 127.0.0.1, or pass --insecure-http behind a TLS-terminating proxy",
                settings.listen
            ))
            .into());
        }
        let tls = settings.tls.as_ref().map(tls::server_config).transpose()?;
        if settings.workspace_roots.is_empty() {
            tracing::warn!("no --workspace-root: executions cannot be created, only read");
        }
        let roots = settings
            .workspace_roots
            .iter()
            .map(|root| nerve_runtime::launch::validate_workspace(root))
            .collect::<Result<Vec<_>, _>>()?;
        let tokens = nerve_runtime::tokens::open(&db).await?;
        let redactor = nerve_runtime::launch::config_redactor(&config)?;
        let tcp = tokio::net::TcpListener::bind(settings.listen)
            .await
            .map_err(|e| ServeError::Io(format!("cannot listen on {}: {e}", settings.listen)))?;
        let local = tcp
            .local_addr()
            .map_err(|e| ServeError::Io(e.to_string()))?;
        let listener = match tls {
            Some(config) => Listener::Tls(
                tls::TlsListener::new(tcp, config).map_err(|e| ServeError::Io(e.to_string()))?,
            ),
            None => Listener::Plain(tcp),
        };
        // One server per process, alive until it exits: the executions it launches borrow
        // the log's path and the configuration for as long as they run.
        let db: &'static Path = Box::leak(db.into_boxed_path());
        let config: &'static Config = Box::leak(Box::new(config));
        let app = Arc::new(app::App {
            db,
            config,
            settings: Settings {
                workspace_roots: roots,
                ..settings
            },
            tokens,
            redactor,
            runs: runs::Runs::default(),
            sessions: sessions::Sessions::default(),
            stopping: CancellationToken::new(),
        });
        Ok(Self {
            listener,
            local,
            app,
        })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// `https` with a certificate of its own, else `http`.
    pub fn scheme(&self) -> &'static str {
        match self.listener {
            Listener::Plain(_) => "http",
            Listener::Tls(_) => "https",
        }
    }

    /// Serves until `shutdown` is cancelled; then stops the executions it runs (at once, as
    /// Ctrl-C does) and waits for them to stop.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), ServeError> {
        let router = api::router(Arc::clone(&self.app));
        let stop = shutdown.clone();
        let stopping = self.app.stopping.clone();
        let stopped = async move {
            stop.cancelled().await;
            stopping.cancel();
        };
        match self.listener {
            Listener::Plain(listener) => {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            }
            Listener::Tls(listener) => {
                axum::serve(listener, router)
                    .with_graceful_shutdown(stopped)
                    .await
            }
        }
        .map_err(|e| ServeError::Io(format!("the listener failed: {e}")))?;
        self.app.runs.stop_all().await;
        Ok(())
    }
}

/// The settings of a server in a unit test: loopback, no workspace root, a provider that
/// is never called.
#[cfg(test)]
pub(crate) fn test_settings() -> Settings {
    Settings {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        workspace_roots: Vec::new(),
        insecure_http: false,
        tls: None,
        body_limit: DEFAULT_BODY_LIMIT,
        run: RunDefaults {
            provider: "script:/nonexistent".to_owned(),
            model: None,
            loop_type: LoopType::React,
            complexity: None,
            max_turns: 3,
            timeout_secs: None,
            budget_usd: None,
            budget_tokens: None,
            context_window: None,
            image: None,
        },
        allowed_providers: Vec::new(),
    }
}
