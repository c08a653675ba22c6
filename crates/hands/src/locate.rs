//! Where the host finds the static `nerve-executor` binary that it bind-mounts into every
//! sandbox, and the checks that it can run there.
//!
//! The executor is not baked into the image: any user image works with it mounted read-only
//! at [`CONTAINER_EXECUTOR_PATH`]. The search order, first existing file wins:
//!
//! 1. `$NERVE_EXECUTOR` ([`EXECUTOR_ENV`]), when set and not empty. An explicit choice is
//!    never second-guessed: if it names a missing file, the sandbox falls back to per-call
//!    exec with a warning rather than silently using another binary.
//! 2. `nerve-executor` next to the running binary (an installed `nerve`).
//! 3. `sandbox/nerve-executor` in the running binary's directory or one of its three parents:
//!    this is where `cargo xtask image` puts it (`<target dir>/sandbox/`), found alike from
//!    `target/debug/nerve`, `target/release/nerve`, a test binary in `target/debug/deps/`
//!    and a bench binary, whatever `CARGO_TARGET_DIR` is.
//! 4. In the source tree this crate was built from (a developer's checkout):
//!    `target/sandbox/nerve-executor`, then the executor README's build output
//!    `target/x86_64-unknown-linux-gnu/release/nerve-executor`.
//!
//! Among 2 to 4, a static binary wins over an earlier dynamic one: `cargo build` puts a
//! dynamic `nerve-executor` next to `target/debug/nerve`, which cannot run in the image.

use std::io::Read;
use std::path::{Path, PathBuf};

/// The environment variable naming the executor binary on the host.
pub const EXECUTOR_ENV: &str = "NERVE_EXECUTOR";

/// Where the executor is mounted inside the container (the default image has `/opt/nerve`).
pub const CONTAINER_EXECUTOR_PATH: &str = "/opt/nerve/nerve-executor";

const BINARY_NAME: &str = "nerve-executor";

/// Finds the executor binary on the host (see the module docs for the order), or `None`.
pub fn locate_executor() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os(EXECUTOR_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(explicit));
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let found: Vec<PathBuf> = candidates(exe_dir.as_deref(), &source_root())
        .into_iter()
        .filter(|path| path.is_file())
        .collect();
    // `cargo build` leaves a dynamic `nerve-executor` next to `nerve`; a static one further
    // down the list is the one that can run. With none usable, the first found is returned
    // so that the sandbox's warning says what is wrong with it.
    found
        .iter()
        .find(|path| unusable_reason(path).is_none())
        .or(found.first())
        .cloned()
}

/// The places searched after the environment variable, in order.
fn candidates(exe_dir: Option<&Path>, source_root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Some(dir) = exe_dir {
        found.push(dir.join(BINARY_NAME));
        found.extend(
            dir.ancestors()
                .take(4)
                .map(|ancestor| ancestor.join("sandbox").join(BINARY_NAME)),
        );
    }
    let target = source_root.join("target");
    found.push(target.join("sandbox").join(BINARY_NAME));
    found.push(
        target
            .join("x86_64-unknown-linux-gnu")
            .join("release")
            .join(BINARY_NAME),
    );
    found
}

/// The workspace root this crate was compiled in (`crates/hands/../..`).
fn source_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .and_then(Path::parent)
        .map_or_else(|| manifest.to_path_buf(), Path::to_path_buf)
}

/// Why `path` cannot serve as the in-container executor, if it cannot: it must be a regular
/// file and a static ELF, since the default image has no dynamic loader or libc.
pub(crate) fn unusable_reason(path: &Path) -> Option<String> {
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) => return Some(format!("cannot open {}: {e}", path.display())),
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => {}
        Ok(_) => return Some(format!("{} is not a regular file", path.display())),
        Err(e) => return Some(format!("cannot stat {}: {e}", path.display())),
    }
    // Program headers sit right after the ELF header; 64 KiB covers them in any real binary.
    let mut prefix = Vec::with_capacity(64 * 1024);
    if let Err(e) = file.by_ref().take(64 * 1024).read_to_end(&mut prefix) {
        return Some(format!("cannot read {}: {e}", path.display()));
    }
    if crate::image::is_static_elf(&prefix) {
        None
    } else {
        Some(format!(
            "{} is not a static x86-64 ELF (build it with `cargo xtask image`)",
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order() {
        let found = candidates(
            Some(Path::new("/p/target/debug/deps")),
            Path::new("/src/nerve"),
        );
        let expected: Vec<PathBuf> = [
            "/p/target/debug/deps/nerve-executor",
            "/p/target/debug/deps/sandbox/nerve-executor",
            "/p/target/debug/sandbox/nerve-executor",
            "/p/target/sandbox/nerve-executor",
            "/p/sandbox/nerve-executor",
            "/src/nerve/target/sandbox/nerve-executor",
            "/src/nerve/target/x86_64-unknown-linux-gnu/release/nerve-executor",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn only_static_binaries_are_usable() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        assert!(unusable_reason(&script).unwrap().contains("not a static"));
        assert!(
            unusable_reason(&dir.path().join("missing"))
                .unwrap()
                .contains("cannot open")
        );
        assert!(
            unusable_reason(dir.path())
                .unwrap()
                .contains("not a regular file")
        );
        assert!(unusable_reason(Path::new("/bin/ls")).is_some(), "dynamic");
        if Path::new("/bin/busybox").exists() {
            assert_eq!(unusable_reason(Path::new("/bin/busybox")), None);
        }
    }
}
