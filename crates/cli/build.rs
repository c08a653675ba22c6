//! Builds the in-sandbox executor static and embeds it in `nerve`, so that a `nerve` built
//! with `cargo build -p nerve-cli` or installed with `cargo install --path crates/cli` carries
//! the executor its sandboxes need (written to the user's cache at the first run:
//! `nerve_hands::carry_executor`).
//!
//! The executor is built by a nested `cargo build --release --package nerve-executor
//! --target x86_64-unknown-linux-gnu` with `+crt-static` (static glibc, no musl target
//! needed), in `<target dir>/executor`: the directory, flags and profile `cargo xtask image`
//! uses, so whichever runs second finds the executor built and costs nothing; and not the
//! outer build's own directory, whose lock the outer cargo holds. Its sources are found
//! beside this crate (`../executor`), so this works from a checkout and from `cargo install
//! --path`; the installed binary needs no checkout afterwards.
//!
//! `NERVE_EMBED_EXECUTOR=PATH` embeds an executor built elsewhere instead, and
//! `NERVE_EMBED_EXECUTOR=0` embeds none; a build that cannot make one (another target, no
//! static glibc) embeds none with a cargo warning, and `nerve run` then refuses to start a
//! sandbox without an executor unless told where one is or that the fallback is allowed.

#![allow(clippy::print_stdout)] // A build script talks to cargo on stdout.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::Digest as _;

/// The only target the sandbox runs (its image is x86_64 Linux).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";
const EMBED_ENV: &str = "NERVE_EMBED_EXECUTOR";

fn main() {
    println!("cargo::rerun-if-env-changed={EMBED_ENV}");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let sources = manifest.join("..").join("executor");
    let workspace = manifest.join("..").join("..");
    for path in [
        sources.join("src"),
        sources.join("Cargo.toml"),
        workspace.join("Cargo.toml"),
        workspace.join("Cargo.lock"),
    ] {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    let built = match std::env::var(EMBED_ENV).ok().filter(|v| !v.is_empty()) {
        Some(off) if off == "0" => Err(format!("{EMBED_ENV}=0")),
        Some(path) => Ok(PathBuf::from(path)),
        None => build(&manifest, &out),
    };
    let embedded = built.and_then(|binary| stage(&binary, &out));
    let mut code = String::from(
        "/// The static in-sandbox executor this `nerve` carries, and its SHA-256 (build.rs).\n",
    );
    match embedded {
        Ok((path, sha256)) => {
            let _ = writeln!(
                code,
                "pub(crate) const CARRIED_EXECUTOR: Option<(&[u8], &str)> = Some((include_bytes!({:?}), {sha256:?}));",
                path.display().to_string()
            );
        }
        Err(why) => {
            println!(
                "cargo::warning=nerve carries no sandbox executor ({why}); `nerve run` will need NERVE_EXECUTOR (`cargo xtask image` builds one)"
            );
            code.push_str("pub(crate) const CARRIED_EXECUTOR: Option<(&[u8], &str)> = None;\n");
        }
    }
    if let Err(e) = std::fs::write(out.join("carried_executor.rs"), code) {
        println!("cargo::error=cannot write {}: {e}", out.display());
    }
}

/// Builds the static executor; the binary's path.
fn build(manifest: &Path, out: &Path) -> Result<PathBuf, String> {
    if std::env::var("TARGET").as_deref() != Ok(TRIPLE) {
        return Err(format!("the sandbox executor is built for {TRIPLE} only"));
    }
    let target_dir = shared_target_dir(out).unwrap_or_else(|| out.join("executor"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // What `cargo xtask image` runs (xtask/src/main.rs, `build_executor`): keep the two in
    // step, or each rebuilds what the other built.
    let output = Command::new(cargo)
        .current_dir(manifest)
        .args([
            "build",
            "--release",
            "--package",
            "nerve-executor",
            "--target",
            TRIPLE,
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        // The outer build's settings are not the executor's: its flags, target and lints
        // (clippy runs build scripts too).
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_PRIMARY_PACKAGE")
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!(
            "its build failed: {}",
            last.unwrap_or("no message")
        ));
    }
    Ok(target_dir
        .join(TRIPLE)
        .join("release")
        .join("nerve-executor"))
}

/// `<target dir>/executor`, found from `OUT_DIR` (`<target dir>/<profile>/build/<pkg>/out`,
/// or with a triple before the profile): the directory holding cargo's `CACHEDIR.TAG`.
fn shared_target_dir(out: &Path) -> Option<PathBuf> {
    out.ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(|dir| dir.join("executor"))
}

/// Copies the binary into `out`, stripped when `strip` is on the PATH, and returns the
/// copy's path and the SHA-256 of its bytes.
fn stage(binary: &Path, out: &Path) -> Result<(PathBuf, String), String> {
    let staged = out.join("nerve-executor");
    std::fs::copy(binary, &staged).map_err(|e| format!("cannot copy {}: {e}", binary.display()))?;
    // Symbols are a third of the binary and no use in a sandbox; without `strip` they stay.
    let _ = Command::new("strip").arg(&staged).status();
    let bytes =
        std::fs::read(&staged).map_err(|e| format!("cannot read {}: {e}", staged.display()))?;
    if !bytes.starts_with(b"\x7fELF") {
        return Err(format!("{} is not an ELF binary", binary.display()));
    }
    let digest = sha2::Sha256::digest(&bytes);
    let sha256: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok((staged, sha256))
}
