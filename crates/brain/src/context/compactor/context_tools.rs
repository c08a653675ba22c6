//! The context tools the execution answers itself: `recall` (a page of an archived block,
//! or a search over the archive) and `compress_context` (the agent asks for a compaction).

use nerve_core::text::clip;
use nerve_core::{
    ArchivedBlock, BlockId, ContextArchive, ExecutionId, Message, MessagePart, ToolCall,
};

use crate::config::EngineConfig;
use crate::context::compaction_plan::{CompactionStrategyRequest, transcript};
use crate::context::window::Window;
use crate::run::builtin_tools::{BuiltinTool, CompressArgs, CompressStrategy, RecallArgs};
use crate::stop::Stop;

/// The context tools offered to the model: `recall` always, `compress_context` when the
/// agent steers compaction.
pub(crate) fn context_tool_definitions(agent_controlled: bool) -> Vec<nerve_core::ToolDefinition> {
    let mut tools = vec![BuiltinTool::Recall.definition()];
    if agent_controlled {
        tools.push(BuiltinTool::CompressContext.definition());
    }
    tools
}

/// The context tool `call` names, when it is one this execution handles itself rather
/// than the sandbox.
pub(crate) fn context_tool(config: &EngineConfig, call: &ToolCall) -> Option<BuiltinTool> {
    if !config.compaction.enabled {
        return None;
    }
    match BuiltinTool::parse(&call.name)? {
        BuiltinTool::Recall => Some(BuiltinTool::Recall),
        BuiltinTool::CompressContext if config.compaction.agent_controlled => {
            Some(BuiltinTool::CompressContext)
        }
        BuiltinTool::CompressContext | BuiltinTool::SubmitPlan => None,
    }
}

/// Runs the context tool `tool` and returns (content, is_error). `compress_context` only
/// asks: the compaction runs at the turn boundary.
pub(crate) async fn run_context_tool(
    tool: BuiltinTool,
    call: &ToolCall,
    config: &EngineConfig,
    window: &mut Window,
    archive: &dyn ContextArchive,
    execution: ExecutionId,
) -> Result<(String, bool), Stop> {
    match tool {
        BuiltinTool::Recall => {
            let args: RecallArgs = match serde_json::from_value(call.arguments.clone()) {
                Ok(args) => args,
                Err(e) => return Ok((format!("invalid arguments for `recall`: {e}"), true)),
            };
            let page_chars = config.compaction.budget(window.capacity()).page_chars;
            recall(args, archive, execution, page_chars).await
        }
        BuiltinTool::CompressContext => {
            let args: CompressArgs = match serde_json::from_value(call.arguments.clone()) {
                Ok(args) => args,
                Err(e) => {
                    return Ok((
                        format!("invalid arguments for `compress_context`: {e}"),
                        true,
                    ));
                }
            };
            window.compaction.requested = Some(CompactionStrategyRequest {
                archive_only: args.strategy == Some(CompressStrategy::Archive),
                reason: args.reason,
                preserve_markers: args.preserve_markers.unwrap_or(true),
            });
            Ok((
                "Compaction scheduled: it runs at the end of this turn.".into(),
                false,
            ))
        }
        BuiltinTool::SubmitPlan => {
            Ok(("submit_plan is only available while planning".into(), true))
        }
    }
}

/// Hits of a `recall` search at most.
const SEARCH_HITS: usize = 8;

/// `recall`: a page of a block (at most `page_chars` characters, what one tool output may
/// take of the window), or the blocks a search finds, each with its line of context.
pub(super) async fn recall(
    args: RecallArgs,
    archive: &dyn ContextArchive,
    execution: ExecutionId,
    page_chars: usize,
) -> Result<(String, bool), Stop> {
    if let Some(id) = args.block_id.as_deref().filter(|s| !s.trim().is_empty()) {
        let Ok(id) = id.trim().parse::<BlockId>() else {
            return Ok((format!("`{id}` is not a block id"), true));
        };
        return Ok(match archive.fetch(execution, id).await? {
            Some(block) => page(
                id,
                &block.note,
                &block_text(&block),
                args.offset.unwrap_or(0),
                page_chars,
            ),
            None => (format!("no archived block {id} in this execution"), true),
        });
    }
    if let Some(query) = args.query.as_deref().filter(|s| !s.trim().is_empty()) {
        let hits = archive.search(execution, query, SEARCH_HITS).await?;
        if hits.is_empty() {
            return Ok((format!("nothing archived matches `{query}`"), false));
        }
        let footer = "Call recall with a block_id (and an offset to page on) to see a block.";
        let mut text = String::new();
        let mut shown = 0;
        for hit in &hits {
            let line = format!("block {} ({}): {}\n", hit.id, hit.note, hit.snippet);
            if shown > 0 && text.len() + line.len() + footer.len() > page_chars {
                break;
            }
            text.push_str(clip(&line, page_chars.saturating_sub(footer.len() + 1)));
            shown += 1;
        }
        if shown < hits.len() {
            text.push_str(&format!(
                "[{} more hits left out; a narrower query finds them]\n",
                hits.len() - shown
            ));
        }
        text.push_str(footer);
        return Ok((text, false));
    }
    Ok(("recall needs a query or a block_id".into(), true))
}

/// What `recall` returns of a block: the output itself when the block is one tool output
/// (so a placeholder's block id gives back exactly what it replaced), else the transcript
/// of its messages.
pub(crate) fn block_text(block: &ArchivedBlock) -> String {
    if let [message] = block.messages.as_slice()
        && let [MessagePart::ToolResult(result)] = message.parts.as_slice()
    {
        return result.content.clone();
    }
    let refs: Vec<&Message> = block.messages.iter().collect();
    transcript(&refs, None)
}

/// The page of `text` (block `id`) that starts `offset` characters in: at most
/// `page_chars` bytes, cut at a character boundary, between a header that says which
/// characters these are and a footer that says how many remain and how to get them.
fn page(id: BlockId, note: &str, text: &str, offset: u64, page_chars: usize) -> (String, bool) {
    let total = text.chars().count();
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    if offset > total || (offset == total && total > 0) {
        return (
            format!("offset {offset} is past the end of block {id} ({total} characters)"),
            true,
        );
    }
    let start = text
        .char_indices()
        .nth(offset)
        .map_or(text.len(), |(i, _)| i);
    // The header and the footer (ids, note, numbers) come out of the page too.
    let frame = 240 + note.len().min(200);
    let body = clip(&text[start..], page_chars.saturating_sub(frame).max(100));
    // A page holds at least one character, even one wider than the page.
    let body = if body.is_empty() {
        text[start..]
            .chars()
            .next()
            .map_or("", |c| &text[start..start + c.len_utf8()])
    } else {
        body
    };
    let end = offset + body.chars().count();
    if offset == 0 && end == total {
        return (
            format!("Block {id} ({note}), all {total} characters:\n{body}\n[end of block]"),
            false,
        );
    }
    let footer = if end < total {
        format!(
            "[{} more characters: call recall with block_id {id} and offset {end}]",
            total - end
        )
    } else {
        "[end of block]".to_owned()
    };
    (
        format!("Block {id} ({note}), characters {offset}..{end} of {total}:\n{body}\n{footer}"),
        false,
    )
}
