//! The PostgreSQL log over TLS through the real binary. The test makes a CA and a server
//! certificate for 127.0.0.1 (rcgen) and starts a throwaway cluster of its own that
//! serves that certificate, refuses TCP connections without TLS (`hostnossl … reject`)
//! and asks for a password (SCRAM). The URL, password included, only ever travels in a
//! file (`--db-file`, `NERVE_DB_FILE`). A worker connects with `sslmode=verify-full` and
//! runs a submitted task to completion; a wrong CA, a host name the certificate does not
//! name, plain text, and an unknown `sslmode` are each refused with one line, exit 2,
//! nothing written, and the password in no output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use nerve_session::pg_cluster::{ClusterConfig, PgCluster, ServerTls};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::json;

use crate::support::{
    NO_USER_SETTINGS, Running, nerve_bin, sandbox_available, skip_unless_required, stderr, stdout,
};

/// The superuser's password: it must appear in no output.
const PASSWORD: &str = "pg-tls-e2e-Secret-42";

/// The cluster and the directory of its certificates, started once for this module.
struct TlsServer {
    cluster: PgCluster,
    pki: tempfile::TempDir,
}

impl TlsServer {
    /// The CA that signed the server's certificate.
    fn ca(&self) -> PathBuf {
        self.pki.path().join("ca.pem")
    }

    /// A CA that did not.
    fn other_ca(&self) -> PathBuf {
        self.pki.path().join("other-ca.pem")
    }

    /// The log's URL on `host` with the password and `params`.
    fn url(&self, host: &str, params: &str) -> String {
        let url = self
            .cluster
            .url("postgres")
            .replace("@127.0.0.1:", &format!("@{host}:"));
        assert!(url.contains(PASSWORD));
        if params.is_empty() {
            url
        } else {
            format!("{url}?{params}")
        }
    }

    /// How the log is named in messages: no password.
    fn shown(&self, host: &str) -> String {
        format!("postgres://nerve@{host}:{}/postgres", self.cluster.port())
    }
}

/// A self-signed CA named `name`: its certificate and the issuer that signs with it.
pub(crate) fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// The TLS-only cluster, or `None` (the test skips, or fails under
/// `NERVE_REQUIRE_DOCKER=1`) without PostgreSQL's server binaries.
fn server() -> Option<&'static TlsServer> {
    static SERVER: OnceLock<Result<TlsServer, String>> = OnceLock::new();
    let started = SERVER.get_or_init(|| {
        let pki = tempfile::tempdir().unwrap();
        let (ca_pem, issuer) = ca("nerve e2e postgres CA");
        let (other_pem, _) = ca("nerve e2e other CA");
        std::fs::write(pki.path().join("ca.pem"), ca_pem.pem()).unwrap();
        std::fs::write(pki.path().join("other-ca.pem"), other_pem.pem()).unwrap();
        // Only the address: `localhost` is a name the certificate does not hold.
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        let tls = ServerTls {
            cert: pki.path().join("server.crt"),
            key: pki.path().join("server.key"),
        };
        std::fs::write(&tls.cert, cert.pem()).unwrap();
        std::fs::write(&tls.key, key.serialize_pem()).unwrap();
        let cluster = PgCluster::start_with(&ClusterConfig {
            tls: Some(tls),
            tls_only: true,
            password: Some(PASSWORD.to_owned()),
        })
        .map_err(|e| e.to_string())?;
        Ok(TlsServer { cluster, pki })
    });
    match started {
        Ok(server) => Some(server),
        Err(error) => {
            skip_unless_required(error);
            None
        }
    }
}

/// A private file in `dir` holding `url` (what `--db-file` and `NERVE_DB_FILE` read).
fn url_file(dir: &Path, name: &str, url: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("{url}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

/// `nerve` with a clean environment and neither `--db` nor `NERVE_DB`.
fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(nerve_bin());
    command
        .args(args)
        .env_remove("NERVE_DB")
        .env_remove("NERVE_DB_FILE")
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .envs(env.iter().copied());
    command
}

/// `nerve --db-file FILE ARGS`.
fn with_file(file: &Path, args: &[&str]) -> Output {
    let mut all = vec!["--db-file", file.to_str().unwrap()];
    all.extend_from_slice(args);
    command(&all, &[]).output().unwrap()
}

/// Asserts `output` is a refusal: exit 2, exactly `line` on stderr, nothing on stdout,
/// and the password nowhere.
fn assert_refused(output: &Output, line: &str) {
    let err = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert_eq!(err, format!("{line}\n"));
    assert_eq!(stdout(output), "");
    assert!(!err.contains(PASSWORD));
}

/// The executions the log lists (through the right CA).
fn listed(good: &Path) -> Vec<serde_json::Value> {
    let output = with_file(good, &["list", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stdout(&output).contains(PASSWORD));
    serde_json::from_str::<serde_json::Value>(&stdout(&output))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_wrong_ca_a_wrong_name_plain_text_and_a_bad_sslmode_are_refused_in_one_line() {
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = server.ca();
    let other = server.other_ca();
    let verified = |host: &str, mode: &str, root: &Path| {
        server.url(
            host,
            &format!("sslmode={mode}&sslrootcert={}", root.display()),
        )
    };
    let good = url_file(
        dir.path(),
        "good.url",
        &verified("127.0.0.1", "verify-full", &ca),
    );
    // What the refused submission would have queued (the other test shares the server).
    let task = "refused: never queued";

    // Another CA: the submission, and a worker, are refused before anything is written.
    let wrong = url_file(
        dir.path(),
        "wrong-ca.url",
        &verified("127.0.0.1", "verify-full", &other),
    );
    let refusal = format!(
        "nerve: cannot connect to {}: the server's certificate is not signed by the CA in sslrootcert={}",
        server.shown("127.0.0.1"),
        other.display()
    );
    let submitted = with_file(
        &wrong,
        &[
            "submit",
            "--workspace",
            dir.path().to_str().unwrap(),
            "--task",
            task,
        ],
    );
    assert_refused(&submitted, &refusal);
    let worker = with_file(&wrong, &["worker"]);
    assert_refused(&worker, &refusal);
    // A root file makes `require` check the chain too (libpq's meaning).
    let required = url_file(
        dir.path(),
        "require.url",
        &verified("127.0.0.1", "require", &other),
    );
    assert_refused(&with_file(&required, &["list"]), &refusal);
    assert!(
        !listed(&good).iter().any(|e| e["task"] == task),
        "nothing was written"
    );

    // `localhost` is not a name the certificate holds: verify-full refuses, verify-ca
    // (the chain only) accepts.
    let by_name = url_file(
        dir.path(),
        "name.url",
        &verified("localhost", "verify-full", &ca),
    );
    let output = with_file(&by_name, &["list"]);
    let err = stderr(&output);
    let prefix = format!(
        "nerve: cannot connect to {}: the server's certificate is not valid for host localhost, which sslmode=verify-full checks (",
        server.shown("localhost")
    );
    assert!(err.starts_with(&prefix), "{err}");
    assert_eq!(
        (err.lines().count(), output.status.code()),
        (1, Some(2)),
        "{err}"
    );
    let chain_only = url_file(
        dir.path(),
        "ca.url",
        &verified("localhost", "verify-ca", &ca),
    );
    let output = with_file(&chain_only, &["list", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));

    // Plain text, on a server that takes TLS only.
    let plain = url_file(
        dir.path(),
        "plain.url",
        &server.url("127.0.0.1", "sslmode=disable"),
    );
    let output = with_file(&plain, &["list"]);
    let err = stderr(&output);
    assert!(
        err.starts_with(&format!(
            "nerve: cannot connect to {}: the server refuses connections without TLS (",
            server.shown("127.0.0.1")
        )),
        "{err}"
    );
    assert!(err.ends_with("instead of sslmode=disable\n"), "{err}");
    assert_eq!(
        (err.lines().count(), output.status.code()),
        (1, Some(2)),
        "{err}"
    );
    assert!(!err.contains(PASSWORD));

    // No sslmode on the loopback: `prefer`, so TLS here (the server refuses plain text).
    let default = url_file(dir.path(), "default.url", &server.url("127.0.0.1", ""));
    let output = with_file(&default, &["list", "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));

    // An unknown mode, named.
    let bad = url_file(
        dir.path(),
        "bad.url",
        &server.url("127.0.0.1", "sslmode=verify_full"),
    );
    assert_refused(
        &with_file(&bad, &["list"]),
        &format!(
            "nerve: event log {}: sslmode=verify_full is not one of disable, allow, prefer, require, verify-ca, verify-full",
            server.shown("127.0.0.1")
        ),
    );

    // A file that is not there, and both flags at once.
    let missing = dir.path().join("missing.url");
    assert_refused(
        &with_file(&missing, &["list"]),
        &format!("nerve: --db-file {}: does not exist", missing.display()),
    );
    let both = command(
        &["--db", "x.db", "--db-file", good.to_str().unwrap(), "list"],
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    assert_eq!(stderr(&both).lines().count(), 1, "{}", stderr(&both));
}

#[test]
fn a_worker_connects_with_verify_full_and_runs_a_submitted_task() {
    if !sandbox_available() {
        return;
    }
    let Some(server) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let good = url_file(
        dir.path(),
        "db.url",
        &server.url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={}", server.ca().display()),
        ),
    );
    let workspace = dir.path().join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let cassette = dir.path().join("cassette.jsonl");
    let lines = [
        json!({"text": "Write.", "tool_calls": [{"name": "write_file", "arguments": {"path": "over-tls.txt", "content": "encrypted\n"}}]}),
        json!({"text": "Check.", "tool_calls": [{"name": "shell", "arguments": {"command": "cat over-tls.txt"}}]}),
        json!({"text": "Wrote it."}),
    ];
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&cassette, text).unwrap();
    let provider = format!("script:{}", cassette.display());

    let submitted = with_file(
        &good,
        &[
            "submit",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Write over-tls.txt.",
            "--provider",
            &provider,
        ],
    );
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let id = stdout(&submitted).trim().to_owned();
    assert_eq!(id.len(), 36, "{id:?}");

    // The worker finds its log through the environment: no URL on its command line.
    let child = command(
        &["worker", "--concurrency", "1"],
        &[("NERVE_DB_FILE", good.to_str().unwrap())],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut worker = Running::collecting(child);
    worker.wait_for_stderr("the worker to end the execution", |text| {
        text.contains(&format!(": {id} ended"))
    });
    worker.signal("TERM");
    let output = worker.wait();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!stderr(&output).contains(PASSWORD));
    assert_eq!(
        std::fs::read_to_string(workspace.join("over-tls.txt")).unwrap(),
        "encrypted\n"
    );

    let executions = listed(&good);
    let ran = executions
        .iter()
        .find(|e| e["execution_id"] == id.as_str())
        .unwrap_or_else(|| panic!("{id} not listed: {executions:?}"));
    assert_eq!(ran["termination_reason"], "completed", "{ran}");
    let verified = with_file(&good, &["verify", &id]);
    assert!(verified.status.success(), "{}", stderr(&verified));
}
