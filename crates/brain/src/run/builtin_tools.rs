//! The tools brain answers itself instead of the sandbox: `recall` and `compress_context`
//! (the context tools) and `submit_plan` (offered only in planning calls). Their names are
//! matched as [`BuiltinTool`], and their JSON Schemas are generated from the argument types,
//! as hands' tools are.

use nerve_core::ToolDefinition;
use schemars::JsonSchema;
use serde::Deserialize;

/// A tool brain handles itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BuiltinTool {
    Recall,
    CompressContext,
    SubmitPlan,
}

impl BuiltinTool {
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Recall => "recall",
            Self::CompressContext => "compress_context",
            Self::SubmitPlan => "submit_plan",
        }
    }

    /// The built-in tool called `name`, if any.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        [Self::Recall, Self::CompressContext, Self::SubmitPlan]
            .into_iter()
            .find(|tool| tool.name() == name)
    }

    fn description(self) -> &'static str {
        match self {
            Self::Recall => {
                "Get back context that compaction archived: by block_id (shown in previews, placeholders \
                 and summaries; long blocks come a page at a time, continue with offset) or by \
                 searching with query (block ids with a line of context each)."
            }
            Self::CompressContext => {
                "Compact your context at a good moment (a sub-goal done, before a large input). Older \
                 messages are summarised or archived; recall returns them."
            }
            Self::SubmitPlan => "Submit the plan: an ordered list of concrete, verifiable steps.",
        }
    }

    /// The definition the model sees.
    pub(crate) fn definition(self) -> ToolDefinition {
        let parameters = match self {
            Self::Recall => schema::<RecallArgs>(),
            Self::CompressContext => schema::<CompressArgs>(),
            Self::SubmitPlan => schema::<SubmitPlanArgs>(),
        };
        ToolDefinition {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters,
        }
    }
}

/// `recall`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecallArgs {
    /// Words to search for in archived context.
    #[serde(default)]
    pub(crate) query: Option<String>,
    /// The id of an archived block to return (a page at a time when it is long).
    #[serde(default)]
    pub(crate) block_id: Option<String>,
    /// With block_id: the character to start the page at (0 by default; each page gives the next).
    #[serde(default)]
    pub(crate) offset: Option<u64>,
}

/// `compress_context`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompressArgs {
    /// Why now (a sub-goal is done, a large input is next...).
    pub(crate) reason: String,
    /// summarize (default) or archive without a summary.
    #[serde(default)]
    pub(crate) strategy: Option<CompressStrategy>,
    /// Keep messages with hedging or self-correction verbatim (default true).
    #[serde(default)]
    pub(crate) preserve_markers: Option<bool>,
}

/// How `compress_context` compacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CompressStrategy {
    Summarize,
    Archive,
}

/// `submit_plan`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct SubmitPlanArgs {
    /// The steps, in order; each one sentence.
    pub(crate) steps: Vec<String>,
}

/// The schema of `T` as the model sees it, generated as hands generates its tools' (an
/// optional field is not required and also admits `null`), but inline (no `$defs`, which
/// some servers refuse in tool schemas) and without `$schema`, title or type description.
pub(crate) fn schema<T: JsonSchema>() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator();
    let mut schema =
        serde_json::to_value(generator.into_root_schema_for::<T>()).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object.remove("description");
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_is_built_in() {
        for tool in [
            BuiltinTool::Recall,
            BuiltinTool::CompressContext,
            BuiltinTool::SubmitPlan,
        ] {
            assert_eq!(BuiltinTool::parse(tool.name()), Some(tool));
        }
        assert_eq!(BuiltinTool::parse("shell"), None);
        assert_eq!(BuiltinTool::parse("Recall"), None);
    }

    #[test]
    fn the_schemas_the_model_sees() {
        let definitions: Vec<ToolDefinition> = [
            BuiltinTool::Recall,
            BuiltinTool::CompressContext,
            BuiltinTool::SubmitPlan,
        ]
        .into_iter()
        .map(BuiltinTool::definition)
        .collect();
        insta::assert_json_snapshot!(definitions);
    }
}
