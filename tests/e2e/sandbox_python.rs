//! A real project in the repository's own environment, through the `nerve` binary: a
//! Python project whose `.devcontainer/devcontainer.json` builds a Dockerfile `FROM` the
//! Debian image made here with debootstrap. The image is built once and reused; pytest
//! runs, the bug is fixed, files keep their owner; `pip install` reaches a loopback package
//! index through a proxy rule, and a host without a rule is refused with the proxy's
//! reason in pip's own error; a 700 MiB allocation is named as the memory limit; a tool in
//! `/usr/local/bin` is found. And every bad definition is one line, exit 2, nothing written.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::sandbox_env::cassette;
use crate::support::{docker_cli, events_json, last_json, nerve_bin, sandbox_available, stderr};

/// The uid:gid the workspace is handed to when the tests run as root, so that "files keep
/// their owner" means something.
const OWNER: u32 = 4321;

/// The Debian Python image (debootstrapped on first use, then cached), or `None` when the
/// sandbox tests cannot run here.
pub(crate) fn python_image() -> Option<String> {
    static TAG: OnceLock<Result<String, String>> = OnceLock::new();
    if !sandbox_available() {
        return None;
    }
    let tag = TAG.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let docker = nerve_hands::connect_docker()
                .await
                .map_err(|e| e.to_string())?;
            nerve_hands::ensure_debian_image(&docker, &nerve_hands::DebianImage::python(), None)
                .await
                .map(|build| build.tag)
                .map_err(|e| e.to_string())
        })
    });
    match tag {
        Ok(tag) => Some(tag.clone()),
        Err(reason) => panic!("cannot make the Debian Python image: {reason}"),
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn shell(command: &str) -> Value {
    json!({"tool_calls": [{"name": "shell", "arguments": {"command": command, "timeout_secs": 300}}]})
}

fn nerve_run(dir: &Path, workspace: &Path, provider: &str, config: Option<&Path>) -> Command {
    let mut command = Command::new(nerve_bin());
    command.arg("--db").arg(dir.join("nerve.db"));
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    command
        .args(["run", "--workspace"])
        .arg(workspace)
        .args([
            "--task",
            "make the tests pass",
            "--provider",
            provider,
            "--json",
        ])
        .env_remove("NERVE_CONFIG")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    command
}

/// A static simple-index (PEP 503) directory served over HTTP on the loopback, one
/// request per connection, until the process ends.
fn serve_index(root: PathBuf) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let path = path.split('?').next().unwrap_or("/").to_owned();
            let mut file = root.join(path.trim_start_matches('/'));
            if file.is_dir() {
                file = file.join("index.html");
            }
            let response = match (path.contains(".."), std::fs::read(&file)) {
                (false, Ok(body)) => {
                    let kind = if file.extension().is_some_and(|e| e == "html") {
                        "text/html"
                    } else {
                        "application/octet-stream"
                    };
                    let mut r = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    r.extend(body);
                    r
                }
                _ => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_vec(),
            };
            let _ = stream.write_all(&response);
        }
    });
    port
}

/// A one-module wheel (`nervedemo`, `VALUE = 42`) in a simple index under `root`, written
/// with the host's Python `zipfile`.
fn make_index(root: &Path) {
    let packages = root.join("packages");
    std::fs::create_dir_all(&packages).unwrap();
    std::fs::create_dir_all(root.join("simple/nervedemo")).unwrap();
    let wheel = packages.join("nervedemo-1.0-py3-none-any.whl");
    let script = r#"
import sys, zipfile
files = {
    "nervedemo/__init__.py": "VALUE = 42\n",
    "nervedemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: nervedemo\nVersion: 1.0\n",
    "nervedemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: nerve-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = "".join(f"{name},,\n" for name in files) + "nervedemo-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, text in files.items():
        z.writestr(name, text)
    z.writestr("nervedemo-1.0.dist-info/RECORD", record)
"#;
    let made = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .output()
        .unwrap_or_else(|e| panic!("the host's python3 writes the test wheel: {e}"));
    assert!(made.status.success(), "{}", stderr(&made));
    std::fs::write(
        root.join("simple/nervedemo/index.html"),
        "<html><body><a href=\"/packages/nervedemo-1.0-py3-none-any.whl\">nervedemo-1.0-py3-none-any.whl</a></body></html>\n",
    )
    .unwrap();
}

/// The Python project: a bug in `calc.py`, a test that finds it, and a devcontainer whose
/// Dockerfile builds on `base` and installs a tool in /usr/local/bin.
fn python_project(workspace: &Path, base: &str, marker: &str) {
    std::fs::create_dir_all(workspace.join(".devcontainer")).unwrap();
    std::fs::write(
        workspace.join("calc.py"),
        "def add(a, b):\n    return a - b\n",
    )
    .unwrap();
    std::fs::write(
        workspace.join("test_calc.py"),
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    )
    .unwrap();
    std::fs::write(
        workspace.join(".devcontainer/devcontainer.json"),
        format!(
            r#"// The project's environment, as an editor would use it.
{{
  "name": "calc",
  "build": {{
    "dockerfile": "Dockerfile",
    "context": ".",
    "args": {{ "BASE": "{base}" }}, /* the image made with debootstrap */
  }},
  "containerEnv": {{ "APP_MODE": "sandbox-test" }},
  "remoteUser": "dev",
  "postCreateCommand": "pip install -e .",
}}
"#
        ),
    )
    .unwrap();
    std::fs::write(
        workspace.join(".devcontainer/Dockerfile"),
        format!(
            "ARG BASE\nFROM ${{BASE}}\nLABEL org.nerve.test.run=\"{marker}\"\nRUN printf '#!/bin/sh\\necho local-tool-ok\\n' > /usr/local/bin/nerve-local-tool && chmod 755 /usr/local/bin/nerve-local-tool\n"
        ),
    )
    .unwrap();
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", &format!("{OWNER}:{OWNER}")])
            .arg(workspace)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

fn started_config(events: &[Value]) -> Value {
    events
        .iter()
        .find(|e| e["kind"] == "started")
        .map(|e| e["payload"]["config"].clone())
        .unwrap_or_else(|| panic!("no started event: {events:?}"))
}

#[test]
fn a_python_project_builds_its_devcontainer_once_fixes_its_bug_and_installs_through_the_proxy() {
    let Some(base) = python_image() else { return };
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("calc");
    let marker = format!("{}-{}", std::process::id(), dir.path().display());
    python_project(&workspace, &base, &marker);
    let index = dir.path().join("index");
    make_index(&index);
    let port = serve_index(index);
    let config = dir.path().join("nerve.toml");
    std::fs::write(
        &config,
        format!(
            "[[proxy.rules]]\nhost = \"127.0.0.1\"\nupstream_scheme = \"http\"\nupstream_port = {port}\nallow_private = true\n"
        ),
    )
    .unwrap();
    let pip = |target: &str, index: &str, package: &str| {
        format!(
            "pip install --retries 0 --timeout 30 --disable-pip-version-check --index-url {index} --target /workspace/{target} {package}"
        )
    };
    let provider = cassette(
        dir.path(),
        "fix.jsonl",
        &[
            shell("python3 -m pytest -q"),
            json!({"tool_calls": [{"name": "edit_file", "arguments": {"path": "calc.py", "old_text": "a - b", "new_text": "a + b"}}]}),
            shell(
                "python3 -m pytest -q -p no:cacheprovider && whoami && echo mode=$APP_MODE && nerve-local-tool",
            ),
            shell(&format!(
                "{} && PYTHONPATH=/workspace/deps python3 -c 'import nervedemo; print(\"nervedemo\", nervedemo.VALUE)'",
                pip(
                    "deps",
                    &format!("http://127.0.0.1:{port}/simple/"),
                    "nervedemo"
                )
            )),
            // pip prints why a connection failed only when it retries.
            shell(
                &pip("denied", "https://pypi.org/simple/", "requests")
                    .replace("--retries 0", "--retries 1"),
            ),
            shell("python3 -c 'b = b\"x\" * (700 * 1024 * 1024); print(len(b))'"),
            json!({"text": "Fixed: add() adds."}),
        ],
    );
    let run = nerve_run(dir.path(), &workspace, &provider, Some(&config))
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", stderr(&run));
    let id = last_json(&run)["execution_id"].as_str().unwrap().to_owned();
    let events = events_json(&dir.path().join("nerve.db"), &id);
    let text = serde_json::to_string(&events).unwrap();
    let owner_name = if is_root() { "dev" } else { "" };
    for expected in [
        "1 failed",
        "1 passed",
        owner_name,
        "mode=sandbox-test",
        "local-tool-ok",
        "nervedemo 42",
        "403 denied by nerve: no rule allows the host pypi.org",
        "[killed: memory limit (512 MiB) reached]",
    ] {
        assert!(text.contains(expected), "`{expected}` missing from {text}");
    }
    assert_eq!(
        std::fs::read_to_string(workspace.join("calc.py")).unwrap(),
        "def add(a, b):\n    return a + b\n"
    );
    let owner = std::fs::metadata(&workspace).unwrap().uid();
    for path in ["calc.py", "deps", "deps/nervedemo/__init__.py"] {
        let meta = std::fs::metadata(workspace.join(path)).unwrap();
        assert_eq!(meta.uid(), owner, "{path} changed owner");
    }
    let first = started_config(&events)["sandbox_image"].clone();
    assert_eq!(first["built"], true, "{first}");
    let tag = first["image"].as_str().unwrap().to_owned();
    insta::assert_json_snapshot!("python_devcontainer_sandbox_image", first, {
        ".image" => "[tag]",
        ".build_ms" => "[ms]",
        ".output" => "[build output]",
    });

    // The same definition again: the image is reused, not rebuilt.
    let provider = cassette(
        dir.path(),
        "again.jsonl",
        &[shell("nerve-local-tool"), json!({"text": "done"})],
    );
    let again = nerve_run(dir.path(), &workspace, &provider, Some(&config))
        .output()
        .unwrap();
    assert!(again.status.success(), "{}", stderr(&again));
    let id = last_json(&again)["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = events_json(&dir.path().join("nerve.db"), &id);
    let second = started_config(&events)["sandbox_image"].clone();
    assert_eq!(second["built"], false, "{second}");
    assert_eq!(second["image"], tag.as_str());
    assert!(
        serde_json::to_string(&events)
            .unwrap()
            .contains("local-tool-ok")
    );
    docker_cli(&["rmi", &tag]);
}

/// Runs `nerve run` on `workspace` expecting a one-line refusal that contains `expected`,
/// exit 2, and no log.
fn refused(dir: &Path, workspace: &Path, config: Option<&Path>, expected: &str) {
    let provider = cassette(dir, "never.jsonl", &[json!({"text": "never"})]);
    let run = nerve_run(dir, workspace, &provider, config)
        .output()
        .unwrap();
    let err = stderr(&run);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(expected), "`{expected}` not in: {err}");
    assert!(!dir.join("nerve.db").exists(), "the log was written");
}

#[test]
fn bad_environments_are_one_line_exit_2_and_nothing_written() {
    let Some(base) = python_image() else { return };
    // A devcontainer.json with a syntax error (a missing comma), at its line and column.
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(workspace.join(".devcontainer")).unwrap();
    std::fs::write(
        workspace.join(".devcontainer/devcontainer.json"),
        "{\n  // comment\n  \"image\": \"x\"\n  \"remoteUser\": \"dev\"\n}\n",
    )
    .unwrap();
    refused(
        dir.path(),
        &workspace,
        None,
        "devcontainer.json: syntax error: expected `,` or `}` at line 4 column 3",
    );

    // A Dockerfile that fails to build.
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(workspace.join(".devcontainer")).unwrap();
    std::fs::write(
        workspace.join(".devcontainer/devcontainer.json"),
        r#"{"build": {"dockerfile": "Dockerfile"}}"#,
    )
    .unwrap();
    std::fs::write(
        workspace.join(".devcontainer/Dockerfile"),
        format!("FROM {base}\nRUN echo about to fail && exit 3\n"),
    )
    .unwrap();
    refused(dir.path(), &workspace, None, "returned a non-zero code: 3");

    // A base image that is not local: said before anything is sent to the engine.
    std::fs::write(
        workspace.join(".devcontainer/Dockerfile"),
        "FROM nerve-test-no-such-base:1\n",
    )
    .unwrap();
    refused(
        dir.path(),
        &workspace,
        None,
        "base image `nerve-test-no-such-base:1` (FROM in",
    );

    // An image without /bin/sh, built from the `[sandbox] dockerfile`.
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("ws");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("marker"), "x\n").unwrap();
    std::fs::write(
        workspace.join("Dockerfile"),
        "FROM scratch\nCOPY marker /marker\n",
    )
    .unwrap();
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[sandbox]\ndockerfile = \"Dockerfile\"\n").unwrap();
    refused(
        dir.path(),
        &workspace,
        Some(&config),
        "has no /bin/sh, so the shell tool cannot run in it",
    );
}

#[test]
fn package_caches_last_between_runs_and_are_shared_only_by_name() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shared = format!("nerve-test-{}", std::process::id());
    let config = dir.path().join("nerve.toml");
    std::fs::write(
        &config,
        format!("[sandbox.caches]\npip = true\nnpm = \"{shared}\"\n"),
    )
    .unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for workspace in [&a, &b] {
        std::fs::create_dir_all(workspace).unwrap();
        if is_root() {
            let status = Command::new("chown")
                .arg(format!("{OWNER}:{OWNER}"))
                .arg(workspace)
                .status()
                .unwrap();
            assert!(status.success());
        }
    }
    let run = |workspace: &Path, name: &str, command: &str| -> String {
        let provider = cassette(dir.path(), name, &[shell(command), json!({"text": "done"})]);
        let run = nerve_run(dir.path(), workspace, &provider, Some(&config))
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", stderr(&run));
        let id = last_json(&run)["execution_id"].as_str().unwrap().to_owned();
        let events = events_json(&dir.path().join("nerve.db"), &id);
        events
            .iter()
            .find(|e| e["kind"] == "tool_call_finished")
            .map(|e| {
                e["payload"]["result"]["content"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .unwrap()
    };
    let wrote = run(
        &a,
        "write.jsonl",
        "echo pip-a > ~/.cache/pip/marker && echo npm-a > ~/.npm/marker && echo written",
    );
    assert!(wrote.contains("written"), "{wrote}");
    let read = "cat ~/.cache/pip/marker 2>/dev/null || echo no-pip; cat ~/.npm/marker 2>/dev/null || echo no-npm";
    // The same workspace, a new execution (a new home): both caches are still there.
    let again = run(&a, "again.jsonl", read);
    assert!(
        again.contains("pip-a") && again.contains("npm-a"),
        "{again}"
    );
    // Another workspace: its own pip cache, the npm cache shared by name.
    let other = run(&b, "other.jsonl", read);
    assert!(
        other.contains("no-pip") && other.contains("npm-a"),
        "{other}"
    );

    use nerve_hands::caches::{CacheTool, CacheVolume};
    let volumes = [
        CacheVolume::for_workspace(CacheTool::Pip, &a),
        CacheVolume::for_workspace(CacheTool::Pip, &b),
        CacheVolume::shared(CacheTool::Npm, &shared).unwrap(),
    ];
    for volume in volumes {
        let name = volume.volume_name();
        assert!(docker_cli(&["volume", "inspect", &name]).contains(&name));
        docker_cli(&["volume", "rm", &name]);
        let _ =
            std::fs::remove_dir_all(nerve_hands::debian::cache_dir().join("volumes").join(&name));
    }
}
