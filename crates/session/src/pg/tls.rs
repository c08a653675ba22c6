//! TLS to the PostgreSQL log. tokio-postgres knows `sslmode=disable|prefer|require` only,
//! never checks a certificate itself, and refuses libpq's other keys; so Nerve reads
//! libpq's `sslmode` (all of its values) and `sslrootcert` out of the URL here, hands the
//! rest to the driver, and gives it a rustls client (the *ring* provider, as every TLS in
//! Nerve, through `tokio-postgres-rustls`, which also computes SCRAM's channel binding)
//! whose certificate verifier does what the mode says:
//!
//! - `disable`: plain text. `prefer` (and `allow`): TLS when the server offers it, else
//!   plain text; the certificate is not checked (libpq's meaning: it only keeps passive
//!   listeners out). `require`: TLS or nothing, the certificate not checked, unless
//!   `sslrootcert` names a file (then as `verify-ca`, as libpq does).
//! - `verify-ca`: the chain must lead to a CA of `sslrootcert` (or the platform's roots);
//!   `verify-full`: that, and the certificate must name the host of the URL.
//!
//! Without `sslmode`, Nerve asks for `prefer` when every host is this machine (loopback or
//! a Unix socket: nothing crosses a network) and `require` otherwise: libpq's default
//! `prefer` would fall back to plain text wherever the server (or someone in between)
//! does not offer TLS, and the log carries every event and, with password authentication,
//! a password exchange. A URL says `sslmode=disable` (or `prefer`) to talk plain text across a
//! network it trusts.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres::config::Host;

use super::{shown_url, with_causes};
use crate::SessionError;

/// libpq's `sslmode`, weakest first (`allow` is read as `prefer`: either connects in
/// plain text when the server has no TLS; `prefer` encrypts whenever it can).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// The value as a URL spells it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// libpq's spelling of a mode; the error names the value and the ones there are.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(Self::Disable),
            "allow" | "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(format!(
                "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )),
        }
    }
}

/// Where the CAs that vouch for the server come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Roots {
    /// `sslrootcert=PATH`: the PEM certificates in that file, only those.
    File(PathBuf),
    /// No `sslrootcert` (or libpq's `sslrootcert=system`): the platform's trusted roots.
    Platform,
}

/// What the URL asks of the connection, after Nerve's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Security {
    pub(crate) mode: SslMode,
    /// Whether the URL said `sslmode` (else `mode` is Nerve's default for its hosts).
    pub(crate) explicit: bool,
    pub(crate) roots: Roots,
}

/// The driver's configuration of `url` without the keys read here, and what they ask.
/// Errors never hold the URL's password.
pub(crate) fn parse_url(url: &str) -> Result<(tokio_postgres::Config, Security), SessionError> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut mode = None;
    let mut rootcert = None;
    // Ends: one pass over the URL's parameters.
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => mode = Some(decoded(value)),
            "sslrootcert" => rootcert = Some(decoded(value)),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let mut config: tokio_postgres::Config = rest.parse().map_err(|e| SessionError::Database {
        log: "postgres://…".into(),
        message: format!("not a PostgreSQL URL: {}", with_causes(&e)),
    })?;
    let refused = |message: String| SessionError::Database {
        log: shown_url(&config),
        message,
    };
    let asked = mode
        .map(|m| SslMode::parse(&m))
        .transpose()
        .map_err(refused)?;
    let system = rootcert.as_deref() == Some("system");
    let roots = match rootcert {
        Some(path) if !system => Roots::File(PathBuf::from(path)),
        Some(_) | None => Roots::Platform,
    };
    let default = if system {
        SslMode::VerifyFull
    } else if on_this_machine(&config) {
        SslMode::Prefer
    } else {
        SslMode::Require
    };
    let mut chosen = asked.unwrap_or(default);
    if system && chosen < SslMode::VerifyFull {
        return Err(refused(format!(
            "sslrootcert=system needs sslmode=verify-full, not {} (libpq's rule: any CA the platform trusts would do for any name)",
            chosen.name()
        )));
    }
    if chosen == SslMode::Require && matches!(roots, Roots::File(_)) {
        chosen = SslMode::VerifyCa;
    }
    config.ssl_mode(match chosen {
        SslMode::Disable => tokio_postgres::config::SslMode::Disable,
        SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            tokio_postgres::config::SslMode::Require
        }
    });
    Ok((
        config,
        Security {
            mode: chosen,
            explicit: asked.is_some(),
            roots,
        },
    ))
}

/// A URL parameter's value, percent-decoded (as the driver decodes the ones it reads).
fn decoded(value: &str) -> String {
    percent_encoding::percent_decode_str(value)
        .decode_utf8_lossy()
        .into_owned()
}

/// Whether every host of `config` is this machine: a Unix socket, `localhost` or a
/// loopback address (none given: libpq's default, the local socket).
fn on_this_machine(config: &tokio_postgres::Config) -> bool {
    let hosts_local = config.get_hosts().iter().all(|host| match host {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    });
    hosts_local && config.get_hostaddrs().iter().all(IpAddr::is_loopback)
}

/// How the store's connections speak TLS: the driver's connector, which has no `Debug`.
#[derive(Clone)]
pub(crate) struct Connector {
    pub(crate) make: tokio_postgres_rustls::MakeRustlsConnect,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector").finish_non_exhaustive()
    }
}

/// The TLS connector for `security`; an error names the root file and what is wrong.
pub(crate) fn connector(security: &Security) -> Result<Connector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Option<Arc<dyn ServerCertVerifier>> = match (security.mode, &security.roots) {
        (SslMode::Disable | SslMode::Prefer | SslMode::Require, _) => None,
        (SslMode::VerifyCa | SslMode::VerifyFull, Roots::File(path)) => Some(
            WebPkiServerVerifier::builder_with_provider(
                Arc::new(root_store(path)?),
                Arc::clone(&provider),
            )
            .build()
            .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?,
        ),
        (SslMode::VerifyCa | SslMode::VerifyFull, Roots::Platform) => Some(Arc::new(
            rustls_platform_verifier::Verifier::new(Arc::clone(&provider))
                .map_err(|e| format!("the platform's trusted roots cannot be used: {e}"))?,
        )),
    };
    let verifier = ModeVerifier {
        chain,
        name: security.mode == SslMode::VerifyFull,
        provider: Arc::clone(&provider),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(Connector {
        make: tokio_postgres_rustls::MakeRustlsConnect::new(config),
    })
}

/// The CA certificates of the PEM file at `path`.
fn root_store(path: &Path) -> Result<rustls::RootCertStore, String> {
    let named = |why: &dyn std::fmt::Display| format!("sslrootcert={}: {why}", path.display());
    let bytes = std::fs::read(path).map_err(|e| named(&e))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| named(&e))?;
    let mut store = rustls::RootCertStore::empty();
    let (added, _unusable) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(named(&"no PEM CA certificate in it"));
    }
    Ok(store)
}

/// The certificate check of a mode. The handshake's signatures are always checked (the
/// session is with the holder of the certificate's key); the certificate itself:
/// - `chain` `None` (`prefer`, `require` without a root file): not at all, as libpq;
/// - else the whole of webpki's check (issuer, validity, usage), and the host name only
///   when `name` (`verify-full`). webpki checks the chain before the name, so with
///   `verify-ca` a name mismatch is the only error left to forgive.
#[derive(Debug)]
struct ModeVerifier {
    chain: Option<Arc<dyn ServerCertVerifier>>,
    name: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ModeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Why connecting failed, in words to act on, when the cause is TLS or its absence;
/// `None` for any other cause (the driver's own words then).
pub(crate) fn explain(
    error: &(dyn std::error::Error + 'static),
    security: &Security,
    host: &str,
) -> Option<String> {
    let mut cause = Some(error);
    // Ends: an error chain is finite (each `source` is a field of the one before).
    while let Some(error) = cause {
        let tls = error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return Some(handshake(tls, security, host));
        }
        // The driver says this in a bare string (no type to match): the server answered
        // the TLS request with "no" under a mode that needs TLS.
        if error.to_string() == "server does not support TLS" {
            return Some(if security.explicit {
                format!(
                    "the server does not accept TLS connections, and sslmode={} needs TLS",
                    security.mode.name()
                )
            } else {
                "the server does not accept TLS connections, which Nerve asks for when the server is not on this machine: add sslmode=disable to the URL to talk plain text over a network you trust".to_owned()
            });
        }
        if let Some(db) = error.downcast_ref::<tokio_postgres::error::DbError>()
            && security.mode == SslMode::Disable
            && db.message().ends_with("no encryption")
        {
            return Some(format!(
                "the server refuses connections without TLS ({}): ask for TLS with sslmode=verify-full (or require) instead of sslmode=disable",
                db.message()
            ));
        }
        cause = error.source();
    }
    None
}

/// A failed handshake in words: which check the server's certificate failed.
fn handshake(error: &rustls::Error, security: &Security, host: &str) -> String {
    let rustls::Error::InvalidCertificate(certificate) = error else {
        return format!("the TLS handshake failed: {error}");
    };
    let issuer = matches!(
        certificate,
        CertificateError::UnknownIssuer | CertificateError::BadSignature
    );
    let name = matches!(
        certificate,
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
    );
    if issuer {
        match &security.roots {
            Roots::File(path) => format!(
                "the server's certificate is not signed by the CA in sslrootcert={}",
                path.display()
            ),
            Roots::Platform => "the server's certificate is not signed by a CA this machine trusts (name the server's CA with sslrootcert=PATH in the URL)".to_owned(),
        }
    } else if name {
        format!(
            "the server's certificate is not valid for host {host}, which sslmode={} checks ({certificate})",
            security.mode.name()
        )
    } else {
        format!("the server's certificate is refused: {certificate}")
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The mode, whether it was explicit, and the roots `url` asks for, or the error.
    fn check(url: &str, expected: Result<(SslMode, bool, Option<&str>), &str>) {
        let got = parse_url(url).map(|(config, security)| {
            let driver = config.get_ssl_mode();
            let wants_tls = security.mode >= SslMode::Require;
            assert_eq!(
                driver == tokio_postgres::config::SslMode::Require,
                wants_tls,
                "{url}"
            );
            let roots = match &security.roots {
                Roots::File(path) => Some(path.display().to_string()),
                Roots::Platform => None,
            };
            (security.mode, security.explicit, roots)
        });
        match (got, expected) {
            (Ok((mode, explicit, roots)), Ok((want, want_explicit, want_roots))) => {
                assert_eq!(
                    (mode, explicit, roots.as_deref()),
                    (want, want_explicit, want_roots),
                    "{url}"
                );
            }
            (Err(error), Err(want)) => {
                let error = error.to_string();
                assert_eq!(error, want, "{url}");
                assert!(!error.contains("hunter2"), "{error}");
            }
            (got, want) => panic!("{url}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn sslmode_and_sslrootcert_have_libpqs_meanings() {
        use SslMode::{Disable, Prefer, Require, VerifyCa, VerifyFull};
        // Defaults: prefer on this machine, require elsewhere.
        check("postgres://u@127.0.0.1:5432/d", Ok((Prefer, false, None)));
        check("postgres://u@localhost/d", Ok((Prefer, false, None)));
        check("postgres://u@[::1]:5432/d", Ok((Prefer, false, None)));
        check("postgres://u@db.internal/d", Ok((Require, false, None)));
        check("postgres://u@10.0.0.7/d", Ok((Require, false, None)));
        check(
            "postgres://u@127.0.0.1,db.internal/d",
            Ok((Require, false, None)),
        );
        // Every mode by name; allow reads as prefer.
        check(
            "postgres://u@h/d?sslmode=disable",
            Ok((Disable, true, None)),
        );
        check("postgres://u@h/d?sslmode=allow", Ok((Prefer, true, None)));
        check("postgres://u@h/d?sslmode=prefer", Ok((Prefer, true, None)));
        check(
            "postgres://u@h/d?sslmode=require",
            Ok((Require, true, None)),
        );
        check(
            "postgres://u@h/d?sslmode=verify-ca",
            Ok((VerifyCa, true, None)),
        );
        check(
            "postgresql://u@h/d?connect_timeout=3&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
            Ok((VerifyFull, true, Some("/etc/ca.pem"))),
        );
        // A root file makes require verify the chain, as libpq does.
        check(
            "postgres://u@h/d?sslmode=require&sslrootcert=/x/ca.pem",
            Ok((VerifyCa, true, Some("/x/ca.pem"))),
        );
        check(
            "postgres://u@db/d?sslrootcert=/x/ca.pem",
            Ok((VerifyCa, false, Some("/x/ca.pem"))),
        );
        // sslrootcert=system: the platform's roots, and nothing weaker than verify-full.
        check(
            "postgres://u@db/d?sslrootcert=system",
            Ok((VerifyFull, false, None)),
        );
        check(
            "postgres://u:hunter2@db:5433/d?sslrootcert=system&sslmode=require",
            Err(
                "event log postgres://u@db:5433/d: sslrootcert=system needs sslmode=verify-full, not require (libpq's rule: any CA the platform trusts would do for any name)",
            ),
        );
        check(
            "postgres://u:hunter2@db:5433/d?sslmode=verify_full",
            Err(
                "event log postgres://u@db:5433/d: sslmode=verify_full is not one of disable, allow, prefer, require, verify-ca, verify-full",
            ),
        );
        check(
            "postgres://u:hunter2@db/d?sslmode=",
            Err(
                "event log postgres://u@db:5432/d: sslmode= is not one of disable, allow, prefer, require, verify-ca, verify-full",
            ),
        );
        // The driver's own keys pass through; an unknown one is refused by it.
        check(
            "postgres://u:hunter2@db/d?bogus=1",
            Err(
                "event log postgres://…: not a PostgreSQL URL: invalid connection string: unknown option `bogus`",
            ),
        );
    }

    proptest! {
        /// Any value other than libpq's is refused with a line that names it, and the
        /// other parameters, in any order around it, never change the outcome.
        #[test]
        fn any_sslmode_is_understood_or_named(
            mode in "[a-z-]{0,12}",
            timeout_first in any::<bool>(),
        ) {
            let params = if timeout_first {
                format!("connect_timeout=5&sslmode={mode}")
            } else {
                format!("sslmode={mode}&connect_timeout=5")
            };
            let url = format!("postgres://u:hunter2@db.internal/d?{params}");
            match parse_url(&url) {
                Ok((config, security)) => {
                    let known = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];
                    prop_assert!(known.contains(&mode.as_str()));
                    prop_assert!(security.explicit);
                    prop_assert_eq!(config.get_connect_timeout(), Some(&std::time::Duration::from_secs(5)));
                }
                Err(error) => {
                    let error = error.to_string();
                    prop_assert!(error.contains(&format!("sslmode={mode} is not one of")), "{}", error);
                    prop_assert!(!error.contains("hunter2"));
                    prop_assert_eq!(error.lines().count(), 1);
                }
            }
        }
    }

    /// A server that declines TLS (it answers the driver's TLS request with `N`, as
    /// PostgreSQL with `ssl = off` does), under a mode that needs TLS: the URL's, or
    /// Nerve's default for a host off this machine (`db.internal`, reached at the loopback
    /// through `hostaddr`).
    #[tokio::test]
    async fn a_server_without_tls_is_refused_when_the_mode_needs_it() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            // Ends: after the two connections below.
            for _ in 0..2 {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 8];
                socket.read_exact(&mut request).await.unwrap();
                socket.write_all(b"N").await.unwrap();
            }
        });
        let refused = |url: String| async move {
            let redactor = Arc::new(nerve_core::Redactor::new());
            super::super::PgStore::connect(&url, redactor)
                .await
                .unwrap_err()
                .to_string()
        };
        let asked = refused(format!(
            "postgres://u:hunter2@127.0.0.1:{port}/d?sslmode=require"
        ))
        .await;
        assert_eq!(
            asked,
            format!(
                "cannot connect to postgres://u@127.0.0.1:{port}/d: the server does not accept TLS connections, and sslmode=require needs TLS"
            )
        );
        let by_default = refused(format!(
            "postgres://u:hunter2@db.internal:{port}/d?hostaddr=127.0.0.1"
        ))
        .await;
        assert_eq!(
            by_default,
            format!(
                "cannot connect to postgres://u@db.internal:{port}/d: the server does not accept TLS connections, which Nerve asks for when the server is not on this machine: add sslmode=disable to the URL to talk plain text over a network you trust"
            )
        );
        tokio::time::timeout(std::time::Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_root_file_must_hold_a_ca() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.pem");
        let security = |path: &Path| Security {
            mode: SslMode::VerifyFull,
            explicit: true,
            roots: Roots::File(path.to_owned()),
        };
        let error = connector(&security(&missing)).map(|_| ()).unwrap_err();
        assert!(
            error.starts_with(&format!("sslrootcert={}: ", missing.display())),
            "{error}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = connector(&security(&empty)).map(|_| ()).unwrap_err();
        assert_eq!(
            error,
            format!(
                "sslrootcert={}: no PEM CA certificate in it",
                empty.display()
            )
        );
        // Modes that check nothing never read it.
        let unchecked = Security {
            mode: SslMode::Require,
            ..security(&missing)
        };
        assert!(connector(&unchecked).is_ok());
    }
}
