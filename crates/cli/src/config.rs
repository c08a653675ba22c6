//! The optional TOML configuration file. Unknown keys are errors, so a typo never silently
//! falls back to a default.

use std::path::Path;

use serde::Deserialize;

use crate::Failure;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    #[serde(default)]
    pub(crate) sandbox: SandboxSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SandboxSection {
    /// The image to run tools in.
    pub(crate) image: Option<String>,
    /// Host busybox used to build the default image.
    pub(crate) busybox: Option<std::path::PathBuf>,
}

impl Config {
    /// Reads `path`, or the defaults when no file was named.
    pub(crate) fn load(path: Option<&Path>) -> Result<Self, Failure> {
        let Some(path) = path else {
            return Ok(Self::default());
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| Failure::usage(format!("cannot read config {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            let first = e.to_string().lines().next().unwrap_or_default().to_owned();
            Failure::usage(format!(
                "invalid config {}: {first} ({})",
                path.display(),
                e.message()
            ))
        })
    }
}
