//! `nerve serve` and `nerve token`: the command line turned into the HTTP server's
//! settings (the server itself is `nerve-serve`'s), and the API tokens made, listed and
//! revoked through the runtime. The server's address goes to stderr, so that stdout
//! stays empty for a script; `token create` prints the token alone on stdout.

use std::path::{Path, PathBuf};

use nerve_runtime::launch::DEFAULT_PROVIDER;
use nerve_runtime::tokens::Scope;
use tokio_util::sync::CancellationToken;

use crate::args::{ServeArgs, TokenCommand};
use crate::{Failure, output};

pub(crate) async fn serve(
    args: ServeArgs,
    db: PathBuf,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    let config = crate::settings::load_serving(config_path, args.sandbox_fallback.map(Into::into))?;
    if let Some(usd) = args.budget_usd
        && nerve_core::MicroUsd::from_usd(usd).is_none()
    {
        return Err(Failure::usage(format!(
            "--budget-usd {usd} is not a dollar amount"
        )));
    }
    let settings = nerve_serve::Settings {
        listen: args.listen,
        workspace_roots: args.workspace_roots,
        insecure_http: args.insecure_http,
        tls: args
            .tls_cert
            .zip(args.tls_key)
            .map(|(cert, key)| nerve_serve::TlsFiles { cert, key }),
        body_limit: args.max_body,
        allowed_providers: args.allowed_providers,
        run: nerve_serve::RunDefaults {
            provider: args.provider.unwrap_or_else(|| DEFAULT_PROVIDER.to_owned()),
            model: args.model,
            loop_type: crate::run::loop_type(args.loop_type),
            complexity: args.complexity.map(crate::run::complexity),
            max_turns: args.max_turns,
            timeout_secs: args.timeout,
            budget_usd: args.budget_usd,
            budget_tokens: args.budget_tokens,
            context_window: args.context_window,
            image: args.image,
        },
    };
    let server = nerve_serve::Server::bind(db, config, settings)
        .await
        .map_err(serve_failure)?;
    let addr = server.local_addr();
    output::error_line(&format!(
        "nerve serve: listening on {}://{addr}",
        server.scheme()
    ));
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        // Ctrl-C or SIGTERM: stop accepting, stop the executions at once (as Ctrl-C stops a run).
        wait_for_signal().await;
        stop.cancel();
    });
    server.run(shutdown).await.map_err(serve_failure)?;
    Ok(0)
}

fn serve_failure(error: nerve_serve::ServeError) -> Failure {
    match error {
        nerve_serve::ServeError::Refused(error) => error.into(),
        nerve_serve::ServeError::Io(message) => Failure::usage(message),
    }
}

async fn wait_for_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

pub(crate) async fn token(command: TokenCommand, db: &Path) -> Result<u8, Failure> {
    match command {
        TokenCommand::Create { name, scope } => {
            let scope: Scope = scope.parse()?;
            let token = nerve_runtime::tokens::create(db, &name, scope).await?;
            output::line(&token);
        }
        TokenCommand::List { json } => {
            let tokens = nerve_runtime::tokens::list(db).await?;
            if json {
                output::json(&serde_json::json!(tokens));
            } else {
                output::line(&format!(
                    "{:<24}  {:<8}  {:<27}  {:<27}  REVOKED",
                    "NAME", "SCOPE", "CREATED", "LAST USED"
                ));
                for t in tokens {
                    output::line(&format!(
                        "{:<24}  {:<8}  {:<27}  {:<27}  {}",
                        t.name,
                        t.scope,
                        t.created_at,
                        t.last_used_at.as_deref().unwrap_or("never"),
                        t.revoked_at.as_deref().unwrap_or("-")
                    ));
                }
            }
        }
        TokenCommand::Revoke { name } => {
            nerve_runtime::tokens::revoke(db, &name).await?;
            output::line(&format!("revoked {name}"));
        }
    }
    Ok(0)
}
