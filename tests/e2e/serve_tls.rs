//! `nerve serve --tls-cert --tls-key`: HTTPS with a certificate the test makes (a CA of its
//! own and a leaf for `localhost`, by rcgen), spoken to by a rustls client that trusts only
//! that CA. The session cookie is `Secure` under TLS; a client trusting another CA, and a
//! plain-HTTP client, get nothing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use rcgen::{CertificateParams, KeyPair};
use rustls::pki_types::ServerName;

use crate::serve::{exchange, json_of, serve, set_cookie, token};
use crate::support::{PATIENCE, nerve, stderr};

/// A CA named `ca` and a server certificate for `localhost` signed by it, as PEM files in
/// `dir`; the CA's certificate (DER) to trust.
fn certificates(dir: &Path, ca: &str) -> rustls::pki_types::CertificateDer<'static> {
    let (ca, issuer) = crate::pg_tls::ca(ca);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), leaf_key.serialize_pem()).unwrap();
    ca.der().clone()
}

/// A rustls client that trusts `ca` alone.
fn client(ca: rustls::pki_types::CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS connection to `port` on the loopback, for the name `localhost`.
fn connect(
    config: &Arc<rustls::ClientConfig>,
    port: u16,
) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(PATIENCE)).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let connection = rustls::ClientConnection::new(Arc::clone(config), name).unwrap();
    rustls::StreamOwned::new(connection, tcp)
}

#[test]
fn serve_speaks_https_with_its_own_certificate_and_a_secure_cookie() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let ca = certificates(dir.path(), "nerve e2e CA");
    let read = token(&db, "viewer", "read");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    // With TLS, a non-loopback address is allowed (the test only ever connects to the
    // loopback).
    let served = serve(
        &db,
        &[
            "--listen",
            "0.0.0.0:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        served
            .process
            .stderr_so_far()
            .contains("listening on https://0.0.0.0:"),
        "{}",
        served.process.stderr_so_far()
    );
    let port: u16 = served.addr.rsplit(':').next().unwrap().parse().unwrap();
    let host = format!("localhost:{port}");
    let trusting = client(ca);

    let list = || {
        exchange(
            connect(&trusting, port),
            &host,
            "GET",
            "/api/v1/executions",
            &[("Authorization", format!("Bearer {read}").as_str())],
            None,
        )
    };
    let (status, _, body) = list();
    assert_eq!(status, 200, "{body}");
    assert_eq!(json_of(&body), serde_json::json!({ "executions": [] }));

    // The web view's cookie is Secure under TLS.
    let origin = format!("https://{host}");
    let (status, head, _) = exchange(
        connect(&trusting, port),
        &host,
        "POST",
        "/login",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Origin", origin.as_str()),
        ],
        Some(&format!("token={read}")),
    );
    assert_eq!(status, 303, "{head}");
    let cookie = set_cookie(&head);
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_owned();
    let (status, _, page) = exchange(
        connect(&trusting, port),
        &host,
        "GET",
        "/",
        &[("Cookie", session.as_str())],
        None,
    );
    assert_eq!(status, 200);
    assert!(page.contains("<h1>Executions</h1>"), "{page}");

    // A client that trusts another CA refuses the server's certificate.
    let other = tempfile::tempdir().unwrap();
    let stranger = client(certificates(other.path(), "another CA"));
    let mut refused = connect(&stranger, port);
    let failed = refused
        .write_all(b"GET / HTTP/1.1\r\n\r\n")
        .and_then(|()| refused.read(&mut [0; 64]));
    let error = failed.unwrap_err().to_string();
    assert!(error.contains("UnknownIssuer"), "{error}");

    // Plain HTTP on the TLS port gets no HTTP answer.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    plain.set_read_timeout(Some(PATIENCE)).unwrap();
    plain
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "plain HTTP was answered: {}",
        String::from_utf8_lossy(&answer)
    );

    // The server still serves after the failed handshakes.
    assert_eq!(list().0, 200);
}

#[test]
fn unusable_tls_files_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nerve.db");
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, "not a certificate").unwrap();
    std::fs::write(&key, "").unwrap();
    let refused = nerve(
        &db,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("cert.pem"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(stderr(&refused).lines().count(), 1, "{}", stderr(&refused));
    // --tls-cert without --tls-key is a usage error.
    let half = nerve(&db, &["serve", "--tls-cert", cert.to_str().unwrap()]);
    assert_eq!(half.status.code(), Some(2), "{}", stderr(&half));
}
