//! Helpers: locate the `nerve` binary, run it (to the end or in the background), check for a
//! Docker engine, read the log while a run writes it.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The `nerve` binary built for this test run (`cargo test --workspace` builds it).
pub(crate) fn nerve_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/nerve
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let bin = profile_dir.join("nerve");
    assert!(
        bin.exists(),
        "{} is missing: build it with `cargo build -p nerve-cli` (cargo xtask ci does)",
        bin.display()
    );
    bin
}

/// The project root, for examples/.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The user's configuration directory every test's `nerve` gets (unless it names its own):
/// none, so that no settings or instructions of the person running the tests count.
pub(crate) const NO_USER_SETTINGS: &str = "/nonexistent/nerve-e2e-config";

/// Runs `nerve --db <db> <args>` with a clean provider environment.
pub(crate) fn nerve(db: &Path, args: &[&str]) -> Output {
    Command::new(nerve_bin())
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .output()
        .unwrap()
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub(crate) fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The JSON object on the last line of stdout.
pub(crate) fn last_json(output: &Output) -> serde_json::Value {
    let text = stdout(output);
    let line = text
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no stdout; stderr: {}", stderr(output)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

/// Whether Docker tests can run. Panics when they must (`NERVE_REQUIRE_DOCKER=1`).
pub(crate) fn docker_available() -> bool {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    let state = AVAILABLE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let docker = nerve_hands::connect_docker()
                .await
                .map_err(|e| e.to_string())?;
            // Build the image once here so that parallel tests do not race to build it.
            if !nerve_hands::image_exists(&docker, nerve_hands::DEFAULT_IMAGE)
                .await
                .map_err(|e| e.to_string())?
            {
                nerve_hands::build_default_image(
                    &docker,
                    &nerve_hands::ImageSource::default(),
                    nerve_hands::DEFAULT_IMAGE,
                )
                .await
                .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    });
    match state {
        Ok(()) => true,
        Err(reason) if std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1") => {
            panic!("Docker is required (NERVE_REQUIRE_DOCKER=1) but unavailable: {reason}")
        }
        Err(reason) => {
            eprintln!("skipping: no usable Docker engine ({reason})");
            false
        }
    }
}

/// A fresh copy of an example workspace in a temp dir.
pub(crate) fn copy_example(name: &str, into: &Path) -> PathBuf {
    let source = root().join("examples").join(name).join("workspace");
    let target = into.join("workspace");
    copy_dir(&source, &target);
    target
}

pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Runs `nerve --db <db> <args>` with extra environment variables (after the clean-up of
/// [`nerve`]'s provider variables, and with proxy variables removed so that no host setting
/// decides where a connection goes).
pub(crate) fn nerve_env(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(nerve_bin());
    command
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    for name in PROXY_VARS {
        command.env_remove(name);
    }
    command.envs(env.iter().copied()).output().unwrap()
}

const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// How long a test waits for a child process or for an event before it gives up: a
/// watchdog against hangs, far above what any step needs.
pub(crate) const PATIENCE: Duration = Duration::from_secs(90);

/// A `nerve` child process whose output is collected as it comes. Dropping it kills the
/// process, so a failing test never leaves one behind.
pub(crate) struct Running {
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Starts `nerve --db <db> <args>` in the background with a clean provider environment.
pub(crate) fn spawn_nerve(db: &Path, args: &[&str]) -> Running {
    let mut child = Command::new(nerve_bin())
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = Arc::new(Mutex::new(Vec::new()));
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let readers = vec![
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout)),
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr)),
    ];
    Running {
        child,
        stdout,
        stderr,
        readers,
    }
}

/// Starts `nerve --db <db> <args>` in the background like [`spawn_nerve`], with extra
/// environment variables.
pub(crate) fn spawn_nerve_env(db: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
    let child = Command::new(nerve_bin())
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Running::collecting(child)
}

impl Running {
    /// Collects the output of `child`, whose stdout and stderr are piped.
    pub(crate) fn collecting(mut child: Child) -> Self {
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            collect(child.stdout.take().unwrap(), Arc::clone(&stdout)),
            collect(child.stderr.take().unwrap(), Arc::clone(&stderr)),
        ];
        Self {
            child,
            stdout,
            stderr,
            readers,
        }
    }
}

fn collect(
    mut from: impl Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buffer = [0; 4096];
        while let Ok(n) = from.read(&mut buffer) {
            if n == 0 {
                break;
            }
            into.lock().unwrap().extend_from_slice(&buffer[..n]);
        }
    })
}

impl Running {
    /// Sends a signal by name (`INT`, `KILL`) to the process.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    /// What the process wrote to stderr so far.
    pub(crate) fn stderr_so_far(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Whether the process is still running.
    #[cfg(feature = "real-servers")]
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Panics (after killing the process) when it already exited: a step it should have
    /// reached alive was not.
    pub(crate) fn assert_alive(&mut self, waiting_for: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let stderr = self.stderr_so_far();
            panic!(
                "nerve exited ({status}) while the test waited for {waiting_for}; stderr: {stderr}"
            );
        }
    }

    /// Waits until `done` holds for the process's stderr, within [`PATIENCE`].
    pub(crate) fn wait_for_stderr(&mut self, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done(&self.stderr_so_far()) {
            self.assert_alive(what);
            assert!(Instant::now() < deadline, "gave up waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until `path` exists (a command in the sandbox made it), within [`PATIENCE`]:
    /// what a test needs to know before it interrupts a command, since a call's
    /// `tool_call_started` is durable before the command starts.
    pub(crate) fn wait_for_file(&mut self, what: &str, path: &Path) {
        let deadline = Instant::now() + PATIENCE;
        while !path.exists() {
            self.assert_alive(what);
            assert!(Instant::now() < deadline, "gave up waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the process to exit, within [`PATIENCE`] (killed after that), and returns
    /// its exit status and output.
    pub(crate) fn wait(mut self) -> Output {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if self.child.try_wait().unwrap().is_some() {
                return self.output();
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let output = self.output();
                panic!(
                    "nerve did not exit within {PATIENCE:?}; stderr: {}",
                    stderr(&output)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL, then the exit status and output.
    pub(crate) fn kill(mut self) -> Output {
        self.child.kill().unwrap();
        self.output()
    }

    fn output(&mut self) -> Output {
        let status = self.child.wait().unwrap();
        for reader in self.readers.drain(..) {
            reader.join().unwrap();
        }
        Output {
            status,
            stdout: std::mem::take(&mut *self.stdout.lock().unwrap()),
            stderr: std::mem::take(&mut *self.stderr.lock().unwrap()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One row of the event log, read directly from SQLite.
#[derive(Debug, Clone)]
pub(crate) struct LogEvent {
    pub(crate) execution_id: String,
    pub(crate) kind: String,
    pub(crate) payload: serde_json::Value,
}

/// Every event of the log in commit order, read-only: empty while the log does not exist
/// yet or is being created, so it can poll a log that a running `nerve` writes.
pub(crate) fn read_log(db: &Path) -> Vec<LogEvent> {
    let read = || -> rusqlite::Result<Vec<LogEvent>> {
        let conn = rusqlite::Connection::open_with_flags(
            db,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let mut statement = conn
            .prepare("SELECT execution_id, kind, payload FROM events ORDER BY execution_id, seq")?;
        let rows = statement.query_map([], |row| {
            Ok(LogEvent {
                execution_id: row.get(0)?,
                kind: row.get(1)?,
                payload: serde_json::from_str(&row.get::<_, String>(2)?)
                    .unwrap_or(serde_json::Value::Null),
            })
        })?;
        rows.collect()
    };
    if !db.exists() {
        return Vec::new();
    }
    read().unwrap_or_default()
}

/// Polls the log until an event matches `wanted`, while `running` is alive, within
/// [`PATIENCE`]. Returns the log as it was then.
pub(crate) fn wait_for_event(
    db: &Path,
    running: &mut Running,
    what: &str,
    wanted: impl Fn(&LogEvent) -> bool,
) -> Vec<LogEvent> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let log = read_log(db);
        if log.iter().any(&wanted) {
            return log;
        }
        running.assert_alive(what);
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `event` is `kind` for turn `turn`.
pub(crate) fn is_turn_event(event: &LogEvent, kind: &str, turn: u64) -> bool {
    event.kind == kind && event.payload["turn"] == turn
}

/// Runs the `docker` CLI with `args` and returns its stdout. Panics when the CLI cannot be
/// run or fails: a test that asks Docker something needs the answer, and an empty one taken
/// for "nothing there" would turn its assertion into a no-op.
pub(crate) fn docker_cli(args: &[&str]) -> String {
    let output = Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `docker {}`: {e}", args.join(" ")));
    assert!(
        output.status.success(),
        "`docker {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The ids of the sandbox containers labelled with `execution_id`, running or not.
pub(crate) fn containers_of(execution_id: &str) -> Vec<String> {
    docker_cli(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=org.nerve.execution={execution_id}"),
    ])
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}

/// Whether a container with this id (or name) exists, running or not.
pub(crate) fn container_exists(id: &str) -> bool {
    docker_cli(&["ps", "-aq", "--no-trunc", "--filter", &format!("id={id}")])
        .split_whitespace()
        .next()
        .is_some()
}

/// Every file under `dir` (relative path → contents), directories included as empty
/// entries ending in `/`: what "the same final workspace" compares.
pub(crate) fn tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if path.is_dir() {
                into.insert(format!("{name}/"), Vec::new());
                walk(root, &path, into);
            } else {
                into.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// `nerve chat <args>` with `input` piped in (its history under `state`), to its end.
pub(crate) fn chat_piped(db: &Path, args: &[&str], state: &Path, input: &[u8]) -> Output {
    let mut chat = Command::new(nerve_bin())
        .arg("--db")
        .arg(db)
        .arg("chat")
        .args(args)
        .env_remove("NERVE_CONFIG")
        .env("XDG_CONFIG_HOME", NO_USER_SETTINGS)
        .env("XDG_STATE_HOME", state)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = chat.stdin.take().unwrap();
        stdin.write_all(input).unwrap();
    }
    chat.wait_with_output().unwrap()
}

/// `nerve events ID --json`, parsed.
pub(crate) fn events_json(db: &Path, id: &str) -> Vec<serde_json::Value> {
    let output = nerve(db, &["events", id, "--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    last_json(&output).as_array().unwrap().clone()
}

/// Whether the sandbox tests can run: an engine, the image and a built executor (the proxy
/// relay is in it). Panics when they must (`NERVE_REQUIRE_DOCKER=1`).
pub(crate) fn sandbox_available() -> bool {
    if !docker_available() {
        return false;
    }
    if nerve_hands::locate_executor().is_some() {
        return true;
    }
    skip_unless_required("no nerve-executor binary: build it with `cargo xtask image`");
    false
}

/// A test that cannot run here for `reason`: a failure under `NERVE_REQUIRE_DOCKER=1`
/// (CI, where everything must run), else said on stderr (the test then returns).
pub(crate) fn skip_unless_required(reason: &str) {
    assert!(
        !std::env::var("NERVE_REQUIRE_DOCKER").is_ok_and(|v| v == "1"),
        "{reason}"
    );
    eprintln!("skipping: {reason}");
}

/// The program `program` of a Python virtual environment at `venv` with `requirement`
/// installed from PyPI, made when missing (one install at a time per test process: tests
/// asking at the same time wait for it). A venv whose install was cut short has no marker
/// and is made anew. `Err` says why there is none.
pub(crate) fn python_venv(
    venv: &Path,
    requirement: &str,
    program: &str,
) -> Result<PathBuf, String> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _one_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let executable = venv.join("bin").join(program);
    let marker = venv.join(".nerve-complete");
    if marker.exists() && executable.exists() {
        return Ok(executable);
    }
    eprintln!("installing {requirement} into {} (once)", venv.display());
    if venv.exists() {
        std::fs::remove_dir_all(venv)
            .map_err(|e| format!("cannot clear {}: {e}", venv.display()))?;
    }
    let run = |command: &mut Command| -> Result<(), String> {
        let output = command
            .output()
            .map_err(|e| format!("cannot run {command:?}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{command:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .last()
                    .unwrap_or_default()
            ))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        requirement,
    ]))?;
    std::fs::write(&marker, requirement).map_err(|e| e.to_string())?;
    Ok(executable)
}

/// `~/.cache/nerve/<name>`: where the tests keep what they install.
pub(crate) fn nerve_cache(name: &str) -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/nerve").join(name)
}
