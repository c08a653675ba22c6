//! The approval gate: a tool policy of allow / ask / deny rules by tool name and argument
//! pattern. An `ask` with nobody to ask parks the execution until `nerve approve`.

use async_trait::async_trait;
use nerve_core::ToolCall;
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::stagnation::canonical_arguments;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyAction {
    Allow,
    Ask,
    Deny,
}

/// One rule as the configuration writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// A tool name, or `*` for every tool.
    pub tool: String,
    /// A regex searched in the call's canonical JSON arguments (keys sorted); none: any call.
    #[serde(default)]
    pub pattern: Option<String>,
    pub action: PolicyAction,
}

impl PolicyRule {
    fn describe(&self) -> String {
        let action = match self.action {
            PolicyAction::Allow => "allow",
            PolicyAction::Ask => "ask",
            PolicyAction::Deny => "deny",
        };
        match &self.pattern {
            Some(pattern) => format!("{action} {} /{pattern}/", self.tool),
            None => format!("{action} {}", self.tool),
        }
    }
}

/// A rule's pattern is not a valid regex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool policy rule `{rule}`: invalid pattern: {message}")]
pub struct PolicyError {
    pub rule: String,
    pub message: String,
}

/// The first matching rule decides; without a match, `default` does.
#[derive(Debug, Clone)]
pub struct ToolPolicy {
    rules: Vec<(PolicyRule, Option<Regex>)>,
    default: PolicyAction,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            default: PolicyAction::Allow,
        }
    }
}

impl ToolPolicy {
    pub fn new(rules: Vec<PolicyRule>, default: PolicyAction) -> Result<Self, PolicyError> {
        let compiled = rules
            .into_iter()
            .map(|rule| {
                let regex = rule
                    .pattern
                    .as_deref()
                    .map(Regex::new)
                    .transpose()
                    .map_err(|e| PolicyError {
                        rule: rule.describe(),
                        message: e.to_string(),
                    })?;
                Ok((rule, regex))
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Ok(Self {
            rules: compiled,
            default,
        })
    }

    /// The action for `call` and the rule that chose it (`default allow` when none matched).
    pub fn evaluate(&self, call: &ToolCall) -> (PolicyAction, String) {
        let arguments = canonical_arguments(&call.arguments);
        for (rule, regex) in &self.rules {
            let tool_matches = rule.tool == "*" || rule.tool == call.name;
            if tool_matches && regex.as_ref().is_none_or(|r| r.is_match(&arguments)) {
                return (rule.action, rule.describe());
            }
        }
        let action = self.default;
        (
            action,
            PolicyRule {
                tool: "*".into(),
                pattern: None,
                action,
            }
            .describe()
            .replacen(' ', " default ", 1),
        )
    }
}

/// A human decision on an `ask`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    pub approved: bool,
    pub reason: Option<String>,
}

/// Asks a human. `None` means nobody is there to ask: the execution parks.
#[async_trait]
pub trait Approver: Send + Sync {
    async fn decide(&self, call: &ToolCall, rule: &str) -> Option<Approval>;
}

/// Nobody to ask (unattended runs): every `ask` parks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Unattended;

#[async_trait]
impl Approver for Unattended {
    async fn decide(&self, _call: &ToolCall, _rule: &str) -> Option<Approval> {
        None
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn check(policy: &ToolPolicy, name: &str, args: serde_json::Value, expected: PolicyAction) {
        let call = ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: args.clone(),
        };
        assert_eq!(policy.evaluate(&call).0, expected, "{name} {args}");
    }

    #[test]
    fn first_matching_rule_wins() {
        let policy = ToolPolicy::new(
            vec![
                PolicyRule {
                    tool: "shell".into(),
                    pattern: Some(r"rm\s+-rf".into()),
                    action: PolicyAction::Deny,
                },
                PolicyRule {
                    tool: "shell".into(),
                    pattern: Some("git push".into()),
                    action: PolicyAction::Ask,
                },
                PolicyRule {
                    tool: "write_file".into(),
                    pattern: None,
                    action: PolicyAction::Ask,
                },
                PolicyRule {
                    tool: "*".into(),
                    pattern: Some("secrets/".into()),
                    action: PolicyAction::Deny,
                },
            ],
            PolicyAction::Allow,
        )
        .unwrap();
        check(
            &policy,
            "shell",
            json!({"command": "rm   -rf /"}),
            PolicyAction::Deny,
        );
        check(
            &policy,
            "shell",
            json!({"command": "git push origin"}),
            PolicyAction::Ask,
        );
        check(
            &policy,
            "shell",
            json!({"command": "ls"}),
            PolicyAction::Allow,
        );
        check(
            &policy,
            "write_file",
            json!({"path": "a", "content": "b"}),
            PolicyAction::Ask,
        );
        check(
            &policy,
            "read_file",
            json!({"path": "secrets/key"}),
            PolicyAction::Deny,
        );
        let call = ToolCall {
            id: "c".into(),
            name: "list_dir".into(),
            arguments: json!({}),
        };
        assert_eq!(policy.evaluate(&call).1, "allow default *");
    }

    #[test]
    fn a_bad_pattern_is_named() {
        let err = ToolPolicy::new(
            vec![PolicyRule {
                tool: "shell".into(),
                pattern: Some("(".into()),
                action: PolicyAction::Ask,
            }],
            PolicyAction::Allow,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("tool policy rule `ask shell /(/`: invalid pattern"),
            "{err}"
        );
    }
}
