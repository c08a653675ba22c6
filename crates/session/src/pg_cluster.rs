//! A throwaway PostgreSQL cluster for tests and `cargo xtask ci`: Debian's server binaries,
//! `initdb` in a fresh temporary directory, the postmaster on a free loopback port, run as
//! an unprivileged user (PostgreSQL refuses to run as root). Never a mock.
//!
//! The postmaster runs under a small `sh` watchdog whose standard input is a pipe from this
//! process: when the [`PgCluster`] is dropped, or this process ends in any way (a static
//! cluster is never dropped), the pipe closes, and the watchdog stops the server with a
//! fast shutdown and removes the directory.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// The superuser `initdb` creates; it connects without a password over loopback (`trust`).
const SUPERUSER: &str = "nerve";
/// The account the server runs as when this process is root and there is no `postgres` user.
const FALLBACK_USER: &str = "nerve-pg";
/// How long the server may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(90);

/// Why a cluster could not be started. The message says what to install or look at.
#[derive(Debug, thiserror::Error)]
#[error("PostgreSQL for tests: {0}")]
pub struct ClusterError(String);

/// The variable naming a server for tests (`postgres://user@host:port/db`; the user may
/// create databases). Without it, tests start a throwaway cluster of their own.
pub const TEST_SERVER_VAR: &str = "NERVE_TEST_PG";

/// A fresh, empty database for one test, and its URL: on the server [`TEST_SERVER_VAR`]
/// names, or on a throwaway cluster this process starts once (and that ends with it).
pub async fn test_database() -> Result<String, ClusterError> {
    static CLUSTER: std::sync::OnceLock<Result<PgCluster, String>> = std::sync::OnceLock::new();
    let admin = match std::env::var(TEST_SERVER_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => {
            let cluster = tokio::task::spawn_blocking(|| {
                CLUSTER
                    .get_or_init(|| PgCluster::start().map_err(|e| e.0))
                    .as_ref()
                    .map(|cluster| cluster.url("postgres"))
                    .map_err(Clone::clone)
            })
            .await
            .map_err(|e| ClusterError(e.to_string()))?;
            cluster.map_err(ClusterError)?
        }
    };
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "nerve_test_{}_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() % 1_000_000_000)
            .unwrap_or_default(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    // The store's own reading of the URL: a server named with `sslmode=verify-full` is
    // reached as the store will reach it.
    let (config, security) =
        crate::pg::tls::parse_url(&admin).map_err(|e| ClusterError(e.to_string()))?;
    let tls = crate::pg::tls::connector(&security).map_err(ClusterError)?;
    let (client, connection) = config
        .connect(tls.make)
        .await
        .map_err(|e| ClusterError(format!("cannot connect to the test server: {e}")))?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(|e| ClusterError(format!("cannot create database {name}: {e}")))?;
    drop(client);
    let _ = driver.await;
    Ok(with_database(&admin, &name))
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    if query.is_empty() {
        format!("{base}/{name}")
    } else {
        format!("{base}/{name}?{query}")
    }
}

/// How a throwaway cluster is set up beyond the defaults (no TLS, no password, `trust`).
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    /// Serve TLS with this certificate chain and key (PEM files, copied into the cluster's
    /// data directory, where the server's account owns them and the key is private).
    pub tls: Option<ServerTls>,
    /// Refuse TCP connections without TLS (`pg_hba.conf`: `hostssl`, and `hostnossl …
    /// reject`). Needs `tls`.
    pub tls_only: bool,
    /// The superuser's password: TCP connections must give it (SCRAM-SHA-256, with
    /// channel binding over TLS); without it, they are trusted.
    pub password: Option<String>,
}

/// The server's certificate chain and its private key, PEM files.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running throwaway cluster. Dropping it stops the server and removes its files.
#[derive(Debug)]
pub struct PgCluster {
    port: u16,
    password: Option<String>,
    /// Closing it (drop) tells the watchdog to stop the server.
    watchdog_stdin: Option<ChildStdin>,
    watchdog: Child,
}

impl PgCluster {
    /// Initialises and starts a cluster; returns once it accepts connections.
    pub fn start() -> Result<Self, ClusterError> {
        Self::start_with(&ClusterConfig::default())
    }

    /// [`PgCluster::start`] as `setup` says: TLS, TLS only, a password.
    pub fn start_with(setup: &ClusterConfig) -> Result<Self, ClusterError> {
        if setup.tls_only && setup.tls.is_none() {
            return Err(ClusterError("tls_only needs a certificate (tls)".into()));
        }
        let bin = server_bindir()?;
        let owner = account()?;
        let dir = fresh_dir()?;
        let data = dir.join("data");
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| ClusterError(format!("cannot chown {}: {e}", dir.display())))?;
        }
        let run = |program: &Path| {
            let mut command = Command::new(program);
            if let Some((uid, gid)) = owner {
                std::os::unix::process::CommandExt::uid(&mut command, uid);
                std::os::unix::process::CommandExt::gid(&mut command, gid);
            }
            command.current_dir(&dir);
            command
        };
        let mut initdb = run(&bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale=C.UTF-8", "--no-instructions"]);
        if let Some(password) = &setup.password {
            let file = dir.join("pwfile");
            std::fs::write(&file, format!("{password}\n"))
                .map_err(|e| ClusterError(format!("cannot write {}: {e}", file.display())))?;
            initdb.arg(format!("--pwfile={}", file.display()));
        }
        let initdb = initdb
            .output()
            .map_err(|e| ClusterError(format!("cannot run initdb: {e}")))?;
        let _ = std::fs::remove_file(dir.join("pwfile"));
        if !initdb.status.success() {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(ClusterError(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr).trim()
            )));
        }
        if let Err(error) = configure(&data, setup, owner) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(error);
        }
        let port = free_port()?;
        let log = dir.join("server.log");
        // `exec`-free on purpose: the shell stays to stop the server when its stdin closes.
        let script = r#"
            "$1/postgres" -D "$2" -p "$3" -k "$4" -c listen_addresses=127.0.0.1 \
                -c max_connections=200 >"$4/server.log" 2>&1 &
            pid=$!
            read -r _ignored
            kill -INT "$pid" 2>/dev/null
            wait "$pid"
            rm -rf "$4"
        "#;
        let mut watchdog = run(Path::new("/bin/sh"))
            .arg("-c")
            .arg(script)
            .arg("nerve-pg-watchdog")
            .arg(&bin)
            .arg(&data)
            .arg(port.to_string())
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| ClusterError(format!("cannot start postgres: {e}")))?;
        let watchdog_stdin = watchdog.stdin.take();
        let cluster = Self {
            port,
            password: setup.password.clone(),
            watchdog_stdin,
            watchdog,
        };
        cluster.wait_ready(&bin, &log)?;
        Ok(cluster)
    }

    /// The URL of database `name` on this cluster, as the superuser (with its password,
    /// when it has one).
    pub fn url(&self, name: &str) -> String {
        let password = self
            .password
            .as_ref()
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        format!(
            "postgres://{SUPERUSER}{password}@127.0.0.1:{}/{name}",
            self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn wait_ready(&self, bin: &Path, log: &Path) -> Result<(), ClusterError> {
        let deadline = Instant::now() + READY_WITHIN;
        // Ends: by READY_WITHIN (deadline), or at the first fatal line in the server's log.
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &self.port.to_string()])
                .args(["-U", SUPERUSER, "-d", "postgres"])
                .status()
                .map_err(|e| ClusterError(format!("cannot run pg_isready: {e}")))?;
            if ready.success() {
                return Ok(());
            }
            let server_log = || std::fs::read_to_string(log).unwrap_or_default();
            if Instant::now() > deadline {
                return Err(ClusterError(format!(
                    "postgres did not accept connections within {READY_WITHIN:?}: {}",
                    server_log().trim()
                )));
            }
            // The probes themselves log "FATAL: the database system is starting up".
            let logged = server_log();
            if logged
                .lines()
                .any(|line| line.contains("FATAL") && !line.contains("starting up"))
            {
                return Err(ClusterError(format!("postgres failed: {}", logged.trim())));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if let Some(mut stdin) = self.watchdog_stdin.take() {
            let _ = stdin.write_all(b"stop\n");
        }
        let _ = self.watchdog.wait();
    }
}

/// The server's TLS files and its `pg_hba.conf`, as `setup` asks, in the data directory
/// `initdb` made.
fn configure(
    data: &Path,
    setup: &ClusterConfig,
    owner: Option<(u32, u32)>,
) -> Result<(), ClusterError> {
    let failed = |what: &Path, e: std::io::Error| {
        ClusterError(format!("cannot set up {}: {e}", what.display()))
    };
    let mut settings = String::new();
    if let Some(tls) = &setup.tls {
        for (from, name, mode) in [
            (&tls.cert, "server.crt", 0o644),
            (&tls.key, "server.key", 0o600),
        ] {
            let to = data.join(name);
            std::fs::copy(from, &to).map_err(|e| failed(from, e))?;
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .map_err(|e| failed(&to, e))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid)).map_err(|e| failed(&to, e))?;
            }
        }
        settings.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
    }
    if setup.tls.is_some() || setup.password.is_some() {
        let method = if setup.password.is_some() {
            "scram-sha-256"
        } else {
            "trust"
        };
        let tcp = if setup.tls_only {
            format!(
                "hostssl all all 127.0.0.1/32 {method}\nhostnossl all all 127.0.0.1/32 reject\n"
            )
        } else {
            format!("host all all 127.0.0.1/32 {method}\n")
        };
        let hba = data.join("pg_hba.conf");
        std::fs::write(&hba, format!("local all all trust\n{tcp}")).map_err(|e| failed(&hba, e))?;
    }
    if !settings.is_empty() {
        let conf = data.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .map_err(|e| failed(&conf, e))?;
        file.write_all(settings.as_bytes())
            .map_err(|e| failed(&conf, e))?;
    }
    Ok(())
}

/// The directory of Debian's server binaries (`/usr/lib/postgresql/<major>/bin`), newest
/// major first, or wherever `initdb` is on the `PATH`.
fn server_bindir() -> Result<PathBuf, ClusterError> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .collect();
    majors.sort();
    if let Some((_, bin)) = majors.pop() {
        return Ok(bin);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists())
        .ok_or_else(|| {
            ClusterError(
                "no PostgreSQL server binaries (install Debian's `postgresql` package, or set NERVE_TEST_PG to a server's URL)"
                    .into(),
            )
        })
}

/// The uid and gid to run the server as: `None` when this process is not root (it runs as
/// itself); otherwise the `postgres` account, or a system account made for the purpose.
fn account() -> Result<Option<(u32, u32)>, ClusterError> {
    let me = id(&["-u"])?;
    if me != Some(0) {
        return Ok(None);
    }
    for user in ["postgres", FALLBACK_USER] {
        if let (Some(uid), Some(gid)) = (id(&["-u", user])?, id(&["-g", user])?) {
            return Ok(Some((uid, gid)));
        }
    }
    let made = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
        ])
        .arg(FALLBACK_USER)
        .output()
        .map_err(|e| ClusterError(format!("cannot run useradd: {e}")))?;
    match (id(&["-u", FALLBACK_USER])?, id(&["-g", FALLBACK_USER])?) {
        (Some(uid), Some(gid)) => Ok(Some((uid, gid))),
        _ => Err(ClusterError(format!(
            "running as root and cannot create the unprivileged user {FALLBACK_USER}: {}",
            String::from_utf8_lossy(&made.stderr).trim()
        ))),
    }
}

/// `id ARGS`, as a number; `None` when the user does not exist.
fn id(args: &[&str]) -> Result<Option<u32>, ClusterError> {
    let out = Command::new("id")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map_err(|e| ClusterError(format!("cannot run id: {e}")))?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .flatten())
}

fn fresh_dir() -> Result<PathBuf, ClusterError> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir = base.join(format!(
            "nerve-pg-{}-{nanos:x}-{attempt}",
            std::process::id()
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(ClusterError(format!(
                    "cannot create {}: {e}",
                    dir.display()
                )));
            }
        }
    }
    Err(ClusterError("cannot create a temporary directory".into()))
}

fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| ClusterError(format!("no free loopback port: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_urls_get_their_own_database() {
        for (url, expected) in [
            ("postgres://u@h:1/postgres", "postgres://u@h:1/t"),
            (
                "postgres://u:p@h/db?sslmode=disable",
                "postgres://u:p@h/t?sslmode=disable",
            ),
            ("postgresql://u@h:5", "postgresql://u@h:5/t"),
        ] {
            assert_eq!(with_database(url, "t"), expected);
        }
    }
}
