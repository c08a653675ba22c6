//! The project instructions an execution starts with, as the engine takes them: whether the
//! workspace's `AGENTS.md` files are read (through the sandbox, by the engine), and the
//! user's own file, read here on the host (`$XDG_CONFIG_HOME/nerve/AGENTS.md`).

use std::io::Read;
use std::path::PathBuf;

use nerve_brain::run::instructions::{InstructionsConfig, MAX_BYTES, UserInstructions};

use crate::RuntimeError;

/// The engine's instructions settings: none at all when `enabled` is false
/// (`--no-project-instructions`).
pub fn config(enabled: bool) -> Result<InstructionsConfig, RuntimeError> {
    if !enabled {
        return Ok(InstructionsConfig::default());
    }
    Ok(InstructionsConfig {
        workspace: true,
        user: user_file()?,
    })
}

/// The user's file of instructions, when there is one: `AGENTS.md` in Nerve's user
/// configuration directory. Read up to a little past the bound (the engine cuts it there
/// and records that it did).
pub fn user_file() -> Result<Option<UserInstructions>, RuntimeError> {
    let Some(dir) = crate::config::user_config_dir() else {
        return Ok(None);
    };
    let path = dir.join("AGENTS.md");
    read_bounded(path)
}

fn read_bounded(path: PathBuf) -> Result<Option<UserInstructions>, RuntimeError> {
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(RuntimeError::config(format!(
                "the user's instructions {}: {}",
                path.display(),
                crate::error::describe_io(&e)
            )));
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_BYTES as u64 + 4)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            RuntimeError::config(format!(
                "the user's instructions {}: {}",
                path.display(),
                crate::error::describe_io(&e)
            ))
        })?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    if text.trim().is_empty() {
        return Ok(None);
    }
    Ok(Some(UserInstructions {
        path: path.display().to_string(),
        text,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_none_and_a_long_one_is_read_past_the_bound_only() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_bounded(dir.path().join("AGENTS.md")).unwrap(), None);
        let path = dir.path().join("long.md");
        std::fs::write(&path, "x".repeat(MAX_BYTES * 2)).unwrap();
        let read = read_bounded(path).unwrap().unwrap();
        assert_eq!(read.text.len(), MAX_BYTES + 4);
        let blank = dir.path().join("blank.md");
        std::fs::write(&blank, "\n  \n").unwrap();
        assert_eq!(read_bounded(blank).unwrap(), None);
        let err = read_bounded(dir.path().to_path_buf()).unwrap_err();
        assert!(err.message().contains("the user's instructions"), "{err}");
    }
}
