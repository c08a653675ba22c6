//! Where the host finds the static `nerve-executor` binary that it bind-mounts into every
//! sandbox, and the checks that it can run there.
//!
//! The executor is not baked into the image: any user image works with it mounted read-only
//! at [`CONTAINER_EXECUTOR_PATH`]. The search order, first existing file wins:
//!
//! 1. `$NERVE_EXECUTOR` ([`EXECUTOR_ENV`]), when set and not empty. An explicit choice is
//!    never second-guessed: if it names a missing file, the sandbox falls back to per-call
//!    exec with a warning rather than silently using another binary.
//! 2. `nerve-executor` next to the running binary (a packaged `nerve`), when static.
//! 3. The executor the running binary carries ([`carry_executor`]: `nerve`'s build script
//!    builds it static and embeds it), written once to
//!    `~/.cache/nerve/executor/<sha256>/nerve-executor` ([`crate::debian::cache_dir`]):
//!    content-addressed, so two versions of `nerve` never share one by mistake, and written
//!    to a temporary file and renamed, so a sandbox never mounts half a binary.
//! 4. `sandbox/nerve-executor` in the running binary's directory or one of its three parents:
//!    this is where `cargo xtask image` puts it (`<target dir>/sandbox/`), found alike from
//!    `target/debug/nerve`, `target/release/nerve`, a test binary in `target/debug/deps/`
//!    and a bench binary, whatever `CARGO_TARGET_DIR` is.
//! 5. In the source tree this crate was built from (a developer's checkout):
//!    `target/sandbox/nerve-executor`, then the executor README's build output
//!    `target/x86_64-unknown-linux-gnu/release/nerve-executor`.
//!
//! Among 2, 4 and 5, a static binary wins over an earlier dynamic one: `cargo build` puts a
//! dynamic `nerve-executor` next to `target/debug/nerve`, which cannot run in the image.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The environment variable naming the executor binary on the host.
pub const EXECUTOR_ENV: &str = "NERVE_EXECUTOR";

/// Where the executor is mounted inside the container (the default image has `/opt/nerve`).
pub const CONTAINER_EXECUTOR_PATH: &str = "/opt/nerve/nerve-executor";

const BINARY_NAME: &str = "nerve-executor";

/// A static executor carried in the running binary.
#[derive(Debug, Clone, Copy)]
pub struct CarriedExecutor {
    pub bytes: &'static [u8],
    /// The SHA-256 of `bytes`, in hex: the name of its directory in the cache.
    pub sha256: &'static str,
}

static CARRIED: OnceLock<CarriedExecutor> = OnceLock::new();

/// Registers the executor the running binary carries (`nerve` calls it first thing); the
/// first registration stays. Costs nothing until a sandbox looks for the executor.
pub fn carry_executor(executor: CarriedExecutor) {
    let _ = CARRIED.set(executor);
}

/// Finds the executor binary on the host (see the module docs for the order), or `None`.
pub fn locate_executor() -> Option<PathBuf> {
    if let Some(explicit) = std::env::var_os(EXECUTOR_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(explicit));
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let sibling = exe_dir
        .as_deref()
        .map(|dir| dir.join(BINARY_NAME))
        .filter(|path| path.is_file());
    if let Some(sibling) = &sibling
        && unusable_reason(sibling).is_none()
    {
        return Some(sibling.clone());
    }
    if let Some(carried) = CARRIED.get() {
        match write_carried(carried, &crate::debian::cache_dir()) {
            Ok(path) => return Some(path),
            Err(error) => {
                tracing::warn!(%error, "cannot write the executor this nerve carries; looking for another");
            }
        }
    }
    let found: Vec<PathBuf> = sibling
        .into_iter()
        .chain(
            candidates(exe_dir.as_deref(), &source_root())
                .into_iter()
                .skip(1),
        )
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

/// The carried executor as a file under `cache`: `executor/<sha256>/nerve-executor`, mode
/// 0755, written when missing or not the same bytes, then checked to be a static ELF.
pub(crate) fn write_carried(carried: &CarriedExecutor, cache: &Path) -> Result<PathBuf, String> {
    let dir = cache.join("executor").join(carried.sha256);
    let path = dir.join(BINARY_NAME);
    let intact = std::fs::read(&path).is_ok_and(|bytes| bytes == carried.bytes)
        && std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    if !intact {
        let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let mut staged = tempfile::Builder::new()
            .prefix(".nerve-executor")
            .tempfile_in(&dir)
            .map_err(fail)?;
        std::io::Write::write_all(&mut staged, carried.bytes).map_err(fail)?;
        std::fs::set_permissions(staged.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(fail)?;
        // A rename: a sandbox that mounts the file now sees the old inode or the new one,
        // each whole.
        staged.persist(&path).map_err(|e| fail(e.error))?;
    }
    match unusable_reason(&path) {
        None => Ok(path),
        Some(reason) => Err(reason),
    }
}

/// The places searched after the environment variable, in order (the carried executor
/// comes after the first).
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

    /// The carried executor is written once, content-addressed and executable; a damaged
    /// copy is replaced; bytes that are no static binary are refused.
    #[test]
    fn the_carried_executor_is_written_once() {
        // An ELF header and one loadable segment, no interpreter: static, as far as the
        // check goes.
        let mut elf = vec![0u8; 64 + 56];
        elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        elf[0x20] = 64;
        elf[0x36] = 56;
        elf[0x38] = 1;
        elf[64] = 1;
        let bytes: &'static [u8] = Box::leak(elf.into_boxed_slice());
        let cache = tempfile::tempdir().unwrap();
        let carried = CarriedExecutor {
            bytes,
            sha256: "abc123",
        };
        let path = write_carried(&carried, cache.path()).unwrap();
        assert_eq!(path, cache.path().join("executor/abc123/nerve-executor"));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        // Written once: the same file the second time.
        write_carried(&carried, cache.path()).unwrap();
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap()),
            inode
        );
        // A damaged copy is replaced by a whole one.
        std::fs::write(&path, b"truncated").unwrap();
        write_carried(&carried, cache.path()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        let script = CarriedExecutor {
            bytes: b"#!/bin/sh\n",
            sha256: "def",
        };
        assert!(
            write_carried(&script, cache.path())
                .unwrap_err()
                .contains("not a static")
        );
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
