//! Turns `--provider SPEC` and `--model` into a provider behind the brain's trait.

use std::path::Path;
use std::sync::Arc;

use nerve_brain::{Provider, ScriptedProvider};

use crate::Failure;

pub(crate) fn build(spec: &str, model: Option<&str>) -> Result<Arc<dyn Provider>, Failure> {
    if let Some(path) = spec.strip_prefix("script:") {
        if path.is_empty() {
            return Err(Failure::usage(
                "--provider script: needs a cassette path, e.g. script:demo.jsonl",
            ));
        }
        let _ = model;
        return Ok(Arc::new(
            ScriptedProvider::from_file(Path::new(path)).map_err(Failure::usage)?,
        ));
    }
    match spec {
        "openai" | "anthropic" => Err(Failure::usage(format!(
            "provider `{spec}` is not wired into this build yet; use --provider script:FILE"
        ))),
        other => Err(Failure::usage(format!(
            "unknown provider `{other}` (expected script:PATH, openai or anthropic)"
        ))),
    }
}
