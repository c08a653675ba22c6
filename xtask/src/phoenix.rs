//! Arize Phoenix for the tracing end-to-end test: a Python virtual environment with
//! `arize-phoenix` at the version the test names, cached under `~/.cache/nerve/` and made
//! when missing or left half-made by an interrupted install.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run;

/// Keep in step with `PHOENIX_VERSION` in `tests/e2e/phoenix.rs`.
const PHOENIX_VERSION: &str = "20.26.1";

/// Written last: a venv without it is made anew (the test support checks the same file).
const COMPLETE: &str = ".nerve-complete";

/// Where the venv lives; handed to the tests as `NERVE_PHOENIX_VENV`.
pub(crate) fn venv_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/nerve")
        .join(format!("phoenix-{PHOENIX_VERSION}"))
}

/// Makes sure the venv holds Phoenix; installs `python3-venv` from Debian first when
/// Python has no `venv` module and we are root.
pub(crate) fn ensure() -> Result<PathBuf> {
    let venv = venv_dir();
    if venv.join(COMPLETE).exists() && venv.join("bin/phoenix").exists() {
        return Ok(venv);
    }
    let has_venv = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_venv {
        if !crate::is_root() {
            bail!("the tracing test needs python3 with venv: sudo apt-get install python3-venv");
        }
        crate::apt_install(&["python3", "python3-venv", "python3-pip"])?;
    }
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .with_context(|| format!("cannot clear {}", venv.display()))?;
    }
    eprintln!(
        "installing arize-phoenix=={PHOENIX_VERSION} into {}",
        venv.display()
    );
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        &format!("arize-phoenix=={PHOENIX_VERSION}"),
    ]))?;
    std::fs::write(venv.join(COMPLETE), PHOENIX_VERSION)?;
    Ok(venv)
}
