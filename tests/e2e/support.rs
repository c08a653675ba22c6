//! Helpers: locate the `nerve` binary, run it, check for a Docker engine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

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

/// Runs `nerve --db <db> <args>` with a clean provider environment.
pub(crate) fn nerve(db: &Path, args: &[&str]) -> Output {
    Command::new(nerve_bin())
        .arg("--db")
        .arg(db)
        .args(args)
        .env_remove("NERVE_CONFIG")
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

fn copy_dir(from: &Path, to: &Path) {
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
