//! `cargo xtask`: every piece of project automation, in Rust rather than shell.
//!
//! - `ci`            what `.ci/run` runs: prerequisites, fmt, clippy, the whole test suite
//!   (with a throwaway PostgreSQL cluster unless `NERVE_TEST_PG` names a server)
//! - `test [ARGS]`    `cargo test ARGS` under the watchdog `ci` uses (see `watchdog.rs`)
//! - `test-sandbox`  build the sandbox image and run every Docker-dependent test
//! - `test-real`     the providers against real servers: llama.cpp's and LiteLLM's (see `real.rs`)
//! - `image`         (re)build the default sandbox image `nerve-sandbox:latest` and the static
//!   in-sandbox executor, copied to `<target dir>/sandbox/nerve-executor`
//! - `image python`  make sure of the Debian image with Python (debootstrap, imported; tagged by
//!   a hash of its inputs, cached under `~/.cache/nerve/debian/`) and print its tag
//! - `install-check [release]`  `cargo install --path crates/cli` from a copy of the checkout,
//!   the copy removed, then the installed `nerve` runs the demo with the executor it carries
//!   (see `install_check.rs`; debug unless `release`)
//! - `demo`          the README's first command: a scripted demo task in a real sandbox, then its replay
//! - `phoenix`       make the Python venv with Arize Phoenix (the tracing test's backend) under
//!   `~/.cache/nerve/` when missing, and print where it is
//! - `bench [AREA]`  run the benchmarks (all, or one of: core, session, brain, compaction,
//!   stream, sandbox, proxy, checkpoint, e2e, fleet, mcp, serve)
//! - `fuzz [--minutes N] [TARGET]`  run the proptest fuzz targets for a time (all, or one
//!   of: session, brain, executor, glob, proxy, config, engine, compaction), each pass with a
//!   fresh seed it names

#![allow(clippy::print_stdout, clippy::print_stderr)] // A command-line tool talking to its user.

mod bench_acp;
mod bench_e2e;
mod bench_fleet;
mod bench_fleet_engine;
mod bench_serve;
mod eval;
mod fuzz;
mod install_check;
mod phoenix;
mod qwen;
mod real;
mod watchdog;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const USAGE: &str = "usage: cargo xtask <ci | test [cargo test args] | test-sandbox | test-real [filter] | eval [--tasks GLOB] [--max-turns N] [--no-peer] [--no-nerve] [--check-tasks] | image [python] | install-check [release] | demo | phoenix | bench [core|session|brain|compaction|stream|sandbox|proxy|checkpoint|e2e|fleet|mcp|acp|serve] | fuzz [--minutes N] [session|brain|executor|glob|proxy|config|engine|compaction]>";

/// The target triple the executor is built for: `--target` keeps `+crt-static` away from
/// build scripts and proc macros, which must stay dynamic.
const EXECUTOR_TRIPLE: &str = "x86_64-unknown-linux-gnu";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = project_root();
    std::env::set_current_dir(&root).with_context(|| format!("cannot enter {}", root.display()))?;
    match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("test") => watchdog::run_tests(
            cargo().arg("test").args(&args[1..]),
            watchdog::Limits::from_env()?,
        ),
        Some("test-sandbox") => test_sandbox(),
        Some("test-real") => test_real(args.get(1).map(String::as_str)),
        Some("eval") => eval::eval(&args[1..]),
        Some("image") if args.get(1).map(String::as_str) == Some("python") => {
            python_image().map(|tag| println!("{tag}"))
        }
        Some("image") => image(true).map(drop),
        Some("demo") => demo(),
        Some("install-check") => {
            install_check::install_check(args.get(1).map(String::as_str) == Some("release"))
        }
        Some("bench") => bench(args.get(1).map(String::as_str)),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        // One process of the fleet bench's engine part (started by `bench fleet` itself).
        Some("bench-fleet-process") => bench_fleet_engine::process(&args[1..]),
        Some("phoenix") => phoenix::ensure().map(|venv| println!("{}", venv.display())),
        Some(other) => bail!("unknown task `{other}`\n{USAGE}"),
        None => bail!("{USAGE}"),
    }
}

fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the project root), else `target`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => project_root().join(dir),
        None => project_root().join("target"),
    }
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
}

fn run(command: &mut Command) -> Result<()> {
    eprintln!("$ {}", describe(command));
    let status = command
        .status()
        .with_context(|| format!("cannot run {}", describe(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(command));
    }
    Ok(())
}

fn describe(command: &Command) -> String {
    std::iter::once(command.get_program().to_string_lossy().into_owned())
        .chain(command.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn ci() -> Result<()> {
    ensure_prerequisites()?;
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    // With the real-server tests compiled in, so that they are linted too (the feature
    // only adds that module).
    run(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--features",
        "nerve-tests/real-servers",
        "--",
        "-D",
        "warnings",
    ]))?;
    let executor = image(false)?;
    // The tracing test's trace backend.
    let phoenix = phoenix::ensure()?;
    // The end-to-end tests drive the real binary, with the kill points that
    // tests/e2e/killpoints.rs arms.
    run(cargo().args(["build", "--package", "nerve-cli", "--features", KILL_POINTS]))?;
    let (postgres_url, _cluster) = ensure_postgres()?;
    // Docker (and PostgreSQL) tests must run here: a missing one is a failure, never a skip.
    // Under the watchdog (a hang fails, naming the test), with the proptests' seeds fixed:
    // CI checks the cases every run checks; `cargo xtask fuzz` explores new ones.
    watchdog::run_tests(
        cargo()
            .args(["test", "--workspace"])
            .env("PROPTEST_RNG_SEED", CI_PROPTEST_SEED)
            .env("NERVE_REQUIRE_DOCKER", "1")
            .env(nerve_session::pg_cluster::TEST_SERVER_VAR, postgres_url)
            .env("NERVE_PHOENIX_VENV", &phoenix)
            .env(nerve_hands::EXECUTOR_ENV, &executor),
        watchdog::Limits::from_env()?,
    )?;
    // `cargo xtask install-check` (an installed `nerve` carries its executor) is not run
    // here: its `cargo install` resolves the features of `nerve-cli` alone, so it rebuilds
    // most dependencies, about 30 minutes on a fresh machine; it is run by hand and its
    // figures are in docs/benchmarks.md.
    // The providers against real servers (llama.cpp's two, LiteLLM): their one-time
    // set-up, cached under ~/.cache/nerve, took about 12 minutes from an empty cache on an
    // idle machine; the tests about 8.
    real::test_real(&executor, None)
}

/// `filter` narrows the tests to those whose names contain it (within `real::`).
fn test_real(filter: Option<&str>) -> Result<()> {
    let executor = image(false)?;
    run(cargo().args(["build", "--package", "nerve-cli", "--features", KILL_POINTS]))?;
    real::test_real(&executor, filter)
}

/// The PostgreSQL server the tests use: the one `NERVE_TEST_PG` names, or a throwaway
/// cluster started here (Debian's `postgresql` installed first when missing and we are
/// root), stopped and removed when the returned guard is dropped.
fn ensure_postgres() -> Result<(String, Option<nerve_session::pg_cluster::PgCluster>)> {
    let var = nerve_session::pg_cluster::TEST_SERVER_VAR;
    if let Some(url) = std::env::var(var).ok().filter(|url| !url.is_empty()) {
        return Ok((url, None));
    }
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|major| major.path().join("bin/postgres").exists());
    if !installed {
        let is_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        if !is_root {
            bail!(
                "the PostgreSQL log's tests need a server: sudo apt-get install postgresql, or set {var} to a server's URL"
            );
        }
        apt_install(&["postgresql"])?;
    }
    eprintln!("starting a throwaway PostgreSQL cluster for the tests");
    let cluster = nerve_session::pg_cluster::PgCluster::start()?;
    Ok((cluster.url("postgres"), Some(cluster)))
}

/// The features that compile the crash-injection switches into `nerve` (tests only).
const KILL_POINTS: &str = "kill-points";

fn test_sandbox() -> Result<()> {
    let executor = image(false)?;
    let phoenix = phoenix::ensure()?;
    // The end-to-end tests drive the real `nerve` binary, with the kill points that
    // tests/e2e/killpoints.rs arms.
    run(cargo().args(["build", "--package", "nerve-cli", "--features", KILL_POINTS]))?;
    let (postgres_url, _cluster) = ensure_postgres()?;
    watchdog::run_tests(
        cargo()
            .env(nerve_session::pg_cluster::TEST_SERVER_VAR, postgres_url)
            .args([
                "test",
                "-p",
                "nerve-hands",
                "-p",
                "nerve-executor",
                "-p",
                "nerve-tests",
            ])
            .env("PROPTEST_RNG_SEED", CI_PROPTEST_SEED)
            .env("NERVE_REQUIRE_DOCKER", "1")
            .env("NERVE_PHOENIX_VENV", &phoenix)
            .env(nerve_hands::EXECUTOR_ENV, &executor),
        watchdog::Limits::from_env()?,
    )
}

/// The proptests' seed in `ci` and `test-sandbox`: every run checks the same cases (a
/// failure is the code's, never the draw's); `cargo xtask fuzz` draws new ones.
const CI_PROPTEST_SEED: &str = "29";

/// Builds the static executor and the default sandbox image (the image only when missing,
/// unless `force`). Returns where the executor is.
fn image(force: bool) -> Result<PathBuf> {
    image_with(None, force)
}

/// [`image`], with the executor at `built` when given (not rebuilt).
fn image_with(built: Option<PathBuf>, force: bool) -> Result<PathBuf> {
    ensure_prerequisites()?;
    let executor = match built {
        Some(executor) => executor,
        None => {
            phase(
                "building the in-sandbox executor (static, release: a minute or two the first time)",
            );
            build_executor()?
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let docker = nerve_hands::connect_docker().await?;
        if force || !nerve_hands::image_exists(&docker, nerve_hands::DEFAULT_IMAGE).await? {
            phase(&format!(
                "building the sandbox image {} (busybox and the executor, no registry)",
                nerve_hands::DEFAULT_IMAGE
            ));
            nerve_hands::build_default_image(
                &docker,
                &nerve_hands::ImageSource::default(),
                nerve_hands::DEFAULT_IMAGE,
            )
            .await?;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(executor)
}

/// Makes sure of the Debian image with Python (built with debootstrap when neither the
/// image nor its cached root filesystem exists; installs debootstrap when missing and we
/// are root). Returns its tag.
fn python_image() -> Result<String> {
    ensure_prerequisites()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let docker = nerve_hands::connect_docker().await?;
        let spec = nerve_hands::DebianImage::python();
        eprintln!(
            "making sure of the Debian Python image (debootstrap takes minutes when uncached)"
        );
        let build = nerve_hands::ensure_debian_image(&docker, &spec, None).await?;
        eprintln!(
            "{}: {:?} (rootfs {})",
            build.tag,
            build.work,
            build.rootfs.display()
        );
        Ok(build.tag)
    })
}

/// Builds `nerve-executor` static and stripped, and installs it as
/// `<target dir>/sandbox/nerve-executor`, where `nerve` and the tests look for it. It is
/// built in its own target directory (`<target dir>/executor`) so that its RUSTFLAGS do not
/// invalidate the cache of the normal build.
fn build_executor() -> Result<PathBuf> {
    let target = target_dir();
    let build_dir = target.join("executor");
    run(cargo()
        .args([
            "build",
            "--release",
            "--package",
            "nerve-executor",
            "--target",
            EXECUTOR_TRIPLE,
        ])
        .env("CARGO_TARGET_DIR", &build_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS"))?;
    let built = build_dir
        .join(EXECUTOR_TRIPLE)
        .join("release")
        .join("nerve-executor");
    let sandbox_dir = target.join("sandbox");
    std::fs::create_dir_all(&sandbox_dir)
        .with_context(|| format!("cannot create {}", sandbox_dir.display()))?;
    // Copy, strip, then rename into place: running sandboxes have the old file bind-mounted,
    // and a rename leaves their inode alone where an in-place write would change it.
    let staged = sandbox_dir.join(".nerve-executor.new");
    std::fs::copy(&built, &staged).with_context(|| format!("cannot copy {}", built.display()))?;
    match Command::new("strip").arg(&staged).status() {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("warning: strip failed ({status}); keeping the unstripped executor")
        }
        Err(_) => eprintln!("note: no `strip` on PATH; the executor keeps its symbols"),
    }
    let installed = sandbox_dir.join("nerve-executor");
    std::fs::rename(&staged, &installed)
        .with_context(|| format!("cannot install {}", installed.display()))?;
    eprintln!("executor: {}", installed.display());
    Ok(installed)
}

/// Says on stderr what a slow step is doing, before it starts.
fn phase(what: &str) {
    eprintln!("==> {what}");
}

/// The README's first command: build what the demo needs (each phase announced), then run
/// the scripted demo task in a real sandbox with its transcript on the terminal, which ends
/// with where the log is and three commands to try next.
fn demo() -> Result<()> {
    phase("checking the prerequisites (Debian's busybox-static, a Docker engine)");
    let executor = image(false)?;
    phase("building nerve (debug)");
    run(cargo().args(["build", "--quiet", "--package", "nerve-cli"]))?;
    let demo = Path::new("target").join("demo");
    let workspace = demo.join("workspace");
    if workspace.exists() {
        std::fs::remove_dir_all(&workspace)
            .with_context(|| format!("cannot clear {}", workspace.display()))?;
    }
    copy_dir(Path::new("examples/demo/workspace"), &workspace)?;
    let db = demo.join("nerve.db");
    let nerve = target_dir().join("debug").join("nerve");
    phase(&format!(
        "running the demo: a scripted agent fixes the failing test in {}",
        workspace.display()
    ));
    let status = Command::new(&nerve)
        .env(nerve_hands::EXECUTOR_ENV, &executor)
        .args(["--db"])
        .arg(&db)
        .args(["run", "--workspace"])
        .arg(&workspace)
        .args([
            "--task-file",
            "examples/demo/task.txt",
            "--provider",
            "script:examples/demo/cassette.jsonl",
        ])
        .status()
        .context("cannot run nerve")?;
    if !status.success() {
        bail!("the demo run did not complete ({status})");
    }
    println!(
        "\nnerve is {} (or `cargo run -p nerve-cli --`); the scripted model answers one chat message",
        nerve.display()
    );
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
    {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn bench(area: Option<&str>) -> Result<()> {
    // End to end: the release `nerve` in the real sandbox against LangGraph (bench_e2e.rs).
    if area == Some("e2e") {
        return bench_e2e::bench();
    }
    // The editor's first words: `nerve acp` against `nerve run --jsonl` (bench_acp.rs).
    if area == Some("acp") {
        return bench_acp::bench();
    }
    // Fleets: the PostgreSQL log and `nerve worker` against LangGraph's PostgreSQL
    // checkpointer (bench_fleet.rs).
    if area == Some("fleet") {
        return bench_fleet::bench();
    }
    // `nerve serve` under load: 200 event streams and 1,000 GETs a second (bench_serve.rs).
    if area == Some("serve") {
        return bench_serve::bench();
    }
    // (package, bench target); `None` runs every bench of the package.
    let selected: Vec<(&str, Option<&str>)> = match area {
        None => vec![
            ("nerve-core", None),
            ("nerve-session", None),
            ("nerve-brain", None),
            ("nerve-hands", Some("sandbox")),
            ("nerve-hands", Some("proxy")),
            ("nerve-hands", Some("checkpoint")),
        ],
        Some("core") => vec![("nerve-core", None)],
        Some("session") => vec![("nerve-session", None)],
        Some("brain") => vec![("nerve-brain", None)],
        // Fact retention and speed of compaction (issue 6), also part of `brain`.
        Some("compaction") => vec![
            ("nerve-brain", Some("compaction_retention")),
            ("nerve-brain", Some("compaction_speed")),
        ],
        // The engine's streaming path against a bare reqwest loop (issue 17), also part of
        // `brain`.
        Some("stream") => vec![("nerve-brain", Some("stream"))],
        Some("sandbox") => vec![("nerve-hands", Some("sandbox"))],
        // Needs the image with Python MCP servers that the e2e tests build.
        Some("mcp") => vec![("nerve-hands", Some("mcp"))],
        // The proxy benchmark needs neither Docker nor the image: in-process upstream,
        // proxy and relay on the loopback.
        Some("proxy") => vec![("nerve-hands", Some("proxy"))],
        // Workspace snapshots against `git add -A && git write-tree` (issue 19).
        Some("checkpoint") => vec![("nerve-hands", Some("checkpoint"))],
        Some(other) => bail!("unknown bench area `{other}`\n{USAGE}"),
    };
    for (package, target) in selected {
        let mut command = cargo();
        command.args(["bench", "--package", package]);
        if let Some(target) = target {
            command.args(["--bench", target]);
        }
        if target == Some("sandbox") || target == Some("mcp") {
            // The sandbox benchmark needs the engine, the image and the executor.
            let executor = image(false)?;
            command.env(nerve_hands::EXECUTOR_ENV, &executor);
        }
        run(&mut command)?;
    }
    if area.is_none() {
        bench_e2e::bench()?;
    }
    Ok(())
}

/// Debian's static busybox (for the sandbox image), debootstrap (for the Python image), tmux
/// (for the terminal tests), Debian's chromium and chromium-driver (for the HTML page and the
/// web view's browser tests) and a running Docker
/// engine. Installed
/// or started when missing and we are root; otherwise a clear explanation.
fn ensure_prerequisites() -> Result<()> {
    let is_root = is_root();
    let busybox_ok = Command::new("dpkg")
        .args(["-s", "busybox-static"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !busybox_ok {
        if !is_root {
            bail!(
                "the sandbox image needs Debian's busybox-static: sudo apt-get install busybox-static"
            );
        }
        apt_install(&["busybox-static"])?;
    }
    // The Debian Python image of the sandbox tests and benchmark is made with debootstrap.
    let debootstrap_ok = Command::new("sh")
        .args([
            "-c",
            "command -v debootstrap || test -x /usr/sbin/debootstrap",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !debootstrap_ok {
        if !is_root {
            bail!(
                "the Python sandbox image is made with Debian's debootstrap, as root: sudo apt-get install debootstrap"
            );
        }
        apt_install(&["debootstrap"])?;
    }
    // The terminal tests (the live transcript, `nerve chat`) drive `nerve` in tmux.
    let tmux_ok = Command::new("sh")
        .args(["-c", "command -v tmux"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !tmux_ok {
        if !is_root {
            bail!("the terminal tests need tmux: sudo apt-get install tmux");
        }
        apt_install(&["tmux"])?;
    }
    // The e2e test of `nerve show --html` reads the page's DOM with headless Chromium; the
    // web view's browser test drives it through chromium-driver (WebDriver).
    let chromium_ok = Command::new("sh")
        .args(["-c", "command -v chromium && command -v chromedriver"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !chromium_ok {
        if !is_root {
            bail!(
                "the HTML page and web view tests need Debian's chromium and chromium-driver: sudo apt-get install chromium chromium-driver"
            );
        }
        apt_install(&["chromium", "chromium-driver"])?;
    }
    if docker_answers() {
        return Ok(());
    }
    if !is_root {
        bail!(
            "no Docker engine answers on /var/run/docker.sock: start dockerd (or add yourself to the docker group)"
        );
    }
    if Command::new("sh")
        .args(["-c", "command -v dockerd"])
        .output()
        .is_ok_and(|o| !o.status.success())
    {
        apt_install(&["docker.io"])?;
    }
    start_dockerd()
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"))
}

fn apt_install(packages: &[&str]) -> Result<()> {
    phase(&format!("installing Debian's {}", packages.join(", ")));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn docker_answers() -> bool {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => return false,
    };
    runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), nerve_hands::connect_docker())
            .await
            .is_ok_and(|r| r.is_ok())
    })
}

fn start_dockerd() -> Result<()> {
    eprintln!("starting dockerd (log: target/dockerd.log)");
    std::fs::create_dir_all("target")?;
    let log = std::fs::File::create("target/dockerd.log")?;
    Command::new("dockerd")
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("cannot start dockerd")?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(90) {
        if docker_answers() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    bail!("dockerd did not answer within 90 s; see target/dockerd.log")
}
