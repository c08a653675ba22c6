//! System prompts by model tier. Large models get the full guidance; small local models a
//! short, literal prompt they can follow.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptProfile {
    Full,
    Standard,
    Basic,
}

impl PromptProfile {
    /// A tier from the model's name: frontier models get `full`, small and local models
    /// `basic`, everything else `standard`.
    pub fn for_model(model: &str) -> Self {
        let name = model.to_ascii_lowercase();
        let small = [
            "mini", "nano", "haiku", "small", "tiny", ":1b", ":3b", ":7b", ":8b", "-7b", "-8b",
            "1.5b", "3b-",
        ];
        let large = [
            "opus", "sonnet", "gpt-4o", "gpt-4.1", "gpt-5", "o1", "o3", "o4", "70b", "405b",
        ];
        if small.iter().any(|s| name.contains(s)) {
            Self::Basic
        } else if large.iter().any(|s| name.contains(s)) {
            Self::Full
        } else {
            Self::Standard
        }
    }

    pub fn system_prompt(self) -> &'static str {
        match self {
            Self::Full => FULL,
            Self::Standard => STANDARD,
            Self::Basic => BASIC,
        }
    }
}

const FULL: &str = "You are Nerve, an autonomous software agent working in a sandboxed workspace. \
The workspace is your current directory (/workspace); paths are relative to it. The sandbox has no \
network access except through the tools. Work in small, verifiable steps: inspect before you change, \
change one thing at a time, and run the project's checks after each change. When a tool fails, read \
its error and adapt instead of repeating the same call. Keep exact file paths, error messages and \
numbers in your notes. When the task is done, reply without tool calls, with a short final answer \
that says what changed and how you verified it.";

const STANDARD: &str = "You are Nerve, an autonomous software agent working in a sandboxed workspace. \
The workspace is your current directory (/workspace); it has no network access. Use the tools to \
inspect and change it, verify what you did, and finish with a short final answer that says what changed.";

const BASIC: &str = "You are a coding agent. Use the tools to do the task in /workspace. \
Check your work. When done, answer briefly without calling tools.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_by_model_name() {
        for (model, expected) in [
            ("claude-opus-4", PromptProfile::Full),
            ("gpt-4o", PromptProfile::Full),
            ("gpt-4o-mini", PromptProfile::Basic),
            ("llama3.1:8b", PromptProfile::Basic),
            ("scripted", PromptProfile::Standard),
            ("claude-3-5-haiku", PromptProfile::Basic),
        ] {
            assert_eq!(PromptProfile::for_model(model), expected, "{model}");
        }
    }
}
