//! TLS of the server's own (`--tls-cert`, `--tls-key`): rustls on the *ring* provider, as
//! every other TLS in Nerve, over the TCP listener. Handshakes run in tasks of their own,
//! each bounded by [`HANDSHAKE`], so a client that stalls its handshake holds up nobody;
//! finished ones are handed to axum's server, which sees an ordinary listener.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nerve_runtime::RuntimeError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 64;

/// The certificate chain and private key files, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate first, then its intermediates.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The rustls configuration of `files`, or one line saying which file is wrong and how.
pub(crate) fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, RuntimeError> {
    let unusable = |path: &Path, why: &dyn std::fmt::Display| {
        RuntimeError::usage(format!("TLS: {}: {why}", path.display()))
    };
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| unusable(&files.cert, &e))?;
    if certs.is_empty() {
        return Err(unusable(&files.cert, &"no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| unusable(&files.key, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| RuntimeError::usage(format!("TLS: {e}")))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            RuntimeError::usage(format!(
                "TLS: {} and {} do not make a certificate and its key: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
    // The server speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A TCP listener whose connections come out handshaken.
#[derive(Debug)]
pub(crate) struct TlsListener {
    incoming: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener`; the accepting task ends when this is dropped.
    pub(crate) fn new(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, incoming) = mpsc::channel(BACKLOG);
        tokio::spawn(accept(listener, TlsAcceptor::from(config), sender));
        Ok(Self { incoming, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accepting task is gone (it ends only with this listener): nothing
            // will ever come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Accepts TCP connections and handshakes each in a task of its own.
async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    sender: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    // Ends: when the server drops its listener (the receiver), which closes the channel.
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = sender.closed() => return,
        };
        let (tcp, addr) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: axum's own listener waits too,
                // rather than spin on the error.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let sender = sender.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = sender.send((tls, addr)).await;
                }
                Ok(Err(error)) => tracing::debug!(%addr, %error, "a TLS handshake failed"),
                Err(_) => tracing::debug!(%addr, "a TLS handshake timed out"),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(cert: &str, key: &str, expected: &str) {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        let error = server_config(&files).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        assert_eq!(error.lines().count(), 1, "{error}");
    }

    #[test]
    fn unusable_files_are_refused_in_one_line_naming_them() {
        check("", "", "cert.pem: no PEM certificate in it");
        check("not pem", "", "cert.pem: no PEM certificate in it");
        let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        check(cert, "", "key.pem");
    }
}
