//! `nerve acp`: the command line turned into the editor agent's settings; the agent itself
//! (the Agent Client Protocol on stdin/stdout) is `nerve-acp`'s. Nothing here writes to
//! stdout: it carries the protocol.

use std::path::{Path, PathBuf};

use crate::Failure;
use crate::args::AcpArgs;

pub(crate) async fn serve(
    args: AcpArgs,
    db: PathBuf,
    config_path: Option<&Path>,
) -> Result<u8, Failure> {
    let config = crate::settings::load_serving(config_path, args.sandbox_fallback.map(Into::into))?;
    let settings = nerve_acp::Settings {
        provider: args.provider,
        model: args.model,
        max_turns: args.max_turns,
        loop_type: crate::run::loop_type(args.loop_type),
        context_window: args.context_window,
        image: args.image,
        capture_content: crate::telemetry::capture_content()?,
        project_instructions: !args.no_project_instructions,
    };
    nerve_acp::serve(db, config, settings).await?;
    Ok(0)
}
