//! The approval gate: a tool policy of allow / ask / deny rules by tool name and argument
//! pattern. An `ask` with nobody to ask parks the execution until `nerve approve`.

use async_trait::async_trait;
use nerve_core::ToolCall;
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::guards::stagnation::canonical_arguments;

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

/// A rule's pattern is not a valid regex, or its command no command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool policy rule `{rule}`: {message}")]
pub struct PolicyError {
    pub rule: String,
    pub message: String,
}

/// How much the agent may do without a person (`--approval`, `approval = "..."`), from the
/// strictest to the loosest (the order compares them).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalMode {
    /// The agent reads: `read_file`, `list_dir` and `grep` run; `write_file` and `edit_file`
    /// are refused whatever the rules say; anything else is refused unless a rule allows it.
    ReadOnly,
    /// Reading runs; anything else asks a person unless a rule decides.
    Ask,
    /// Everything runs unless a rule asks or refuses (the default).
    #[default]
    Auto,
    /// Nobody is ever asked: what a rule would ask about runs; `deny` rules still refuse.
    Never,
}

impl ApprovalMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::Ask => "ask",
            Self::Auto => "auto",
            Self::Never => "never",
        }
    }
}

/// A `[[rules]]` entry: a decision for a tool's calls, and for `shell` by command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRule {
    /// A tool name, or `*` for every tool.
    pub tool: String,
    /// `shell` only: a command prefix of whole words (`git status`), or a glob over the
    /// command's words (`rm *`) when it holds `*`, `?` or `[`.
    #[serde(default)]
    pub command: Option<String>,
    pub decision: PolicyAction,
}

/// Everything that makes a policy, as the settings give it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySettings {
    /// `[[rules]]`, in order.
    pub rules: Vec<CommandRule>,
    /// `[policy] rules`: regexes over the canonical arguments, after `rules`.
    pub patterns: Vec<PolicyRule>,
    /// `[policy] default`: what no rule decides, when no mode is given.
    pub default: Option<PolicyAction>,
    /// The approval mode, when one is given.
    pub mode: Option<ApprovalMode>,
}

/// How a rule matches a call's arguments.
#[derive(Debug, Clone)]
enum Matcher {
    /// Every call of the tool.
    Any,
    /// `[policy]`: a regex searched in the canonical JSON arguments.
    Pattern(Regex),
    /// A shell command starting with these words.
    Prefix(Vec<String>),
    /// A shell command whose words (joined by one space) match.
    Glob(globset::GlobMatcher),
}

#[derive(Debug, Clone)]
struct Rule {
    tool: String,
    matcher: Matcher,
    action: PolicyAction,
    /// Higher is more specific: a command's words, then a pattern, then a named tool.
    specificity: usize,
    describe: String,
}

/// The tools that only read the workspace.
const READING: [&str; 3] = ["read_file", "list_dir", "grep"];
/// The tools read-only mode refuses whatever a rule says.
const WRITING: [&str; 2] = ["write_file", "edit_file"];

/// The first matching rule decides, unless a stricter rule of the same specificity matches
/// too (deny beats ask beats allow); without a match, the mode (or `[policy] default`) does.
#[derive(Debug, Clone, Default)]
pub struct ToolPolicy {
    rules: Vec<Rule>,
    default: Option<PolicyAction>,
    mode: Option<ApprovalMode>,
    /// Record allowed calls too (a mode or command rules were given).
    record_allows: bool,
}

/// A decision's strictness: deny beats ask beats allow.
const fn strictness(action: PolicyAction) -> u8 {
    match action {
        PolicyAction::Allow => 0,
        PolicyAction::Ask => 1,
        PolicyAction::Deny => 2,
    }
}

const fn action_name(action: PolicyAction) -> &'static str {
    match action {
        PolicyAction::Allow => "allow",
        PolicyAction::Ask => "ask",
        PolicyAction::Deny => "deny",
    }
}

impl ToolPolicy {
    /// `[policy]` alone: regex rules and a default.
    pub fn new(rules: Vec<PolicyRule>, default: PolicyAction) -> Result<Self, PolicyError> {
        Self::build(PolicySettings {
            patterns: rules,
            default: Some(default),
            ..PolicySettings::default()
        })
    }

    pub fn build(settings: PolicySettings) -> Result<Self, PolicyError> {
        let mut rules = Vec::new();
        for (index, rule) in settings.rules.iter().enumerate() {
            rules.push(command_rule(index, rule)?);
        }
        for rule in settings.patterns {
            let regex = rule
                .pattern
                .as_deref()
                .map(Regex::new)
                .transpose()
                .map_err(|e| PolicyError {
                    rule: rule.describe(),
                    message: format!("invalid pattern: {e}"),
                })?;
            rules.push(Rule {
                specificity: usize::from(rule.tool != "*") + 2 * usize::from(regex.is_some()),
                matcher: regex.map_or(Matcher::Any, Matcher::Pattern),
                describe: rule.describe(),
                tool: rule.tool,
                action: rule.action,
            });
        }
        Ok(Self {
            record_allows: settings.mode.is_some() || !settings.rules.is_empty(),
            rules,
            default: settings.default,
            mode: settings.mode,
        })
    }

    /// The mode in force (`auto` when none was given).
    pub fn mode(&self) -> ApprovalMode {
        self.mode.unwrap_or_default()
    }

    /// Whether allowed calls are recorded too (`approval_decided` by the policy): when a
    /// mode or command rules were given, every decision is.
    pub fn records_allows(&self) -> bool {
        self.record_allows
    }

    /// The action for `call` and the rule that chose it (`default allow` when none matched).
    pub fn evaluate(&self, call: &ToolCall) -> (PolicyAction, String) {
        let mode = self.mode();
        if mode == ApprovalMode::ReadOnly && WRITING.contains(&call.name.as_str()) {
            return (
                PolicyAction::Deny,
                format!("read-only mode: {} writes to the workspace", call.name),
            );
        }
        let (action, rule) = self.by_rules(call).unwrap_or_else(|| self.fallback(call));
        if mode == ApprovalMode::Never && action == PolicyAction::Ask {
            return (
                PolicyAction::Allow,
                format!("never mode: nobody is asked ({rule})"),
            );
        }
        (action, rule)
    }

    /// The rules' decision, if any rule matches.
    fn by_rules(&self, call: &ToolCall) -> Option<(PolicyAction, String)> {
        let arguments = std::sync::OnceLock::new();
        let command = std::sync::OnceLock::new();
        let matches = |rule: &Rule| -> bool {
            if rule.tool != "*" && rule.tool != call.name {
                return false;
            }
            match &rule.matcher {
                Matcher::Any => true,
                Matcher::Pattern(regex) => {
                    regex.is_match(arguments.get_or_init(|| canonical_arguments(&call.arguments)))
                }
                Matcher::Prefix(_) | Matcher::Glob(_) => {
                    let Some(parsed) = command.get_or_init(|| shell_command(call)) else {
                        return false;
                    };
                    parsed.matches(&rule.matcher, rule.action)
                }
            }
        };
        let first = self.rules.iter().find(|r| matches(r))?;
        let strictest = self
            .rules
            .iter()
            .filter(|r| {
                r.specificity == first.specificity
                    && strictness(r.action) > strictness(first.action)
                    && matches(r)
            })
            .max_by_key(|r| strictness(r.action))
            .unwrap_or(first);
        Some((strictest.action, strictest.describe.clone()))
    }

    /// What decides a call no rule matched: the mode, else `[policy] default`, else allow.
    fn fallback(&self, call: &ToolCall) -> (PolicyAction, String) {
        let reading = READING.contains(&call.name.as_str());
        match (self.mode, self.default) {
            (None, default) => {
                let action = default.unwrap_or(PolicyAction::Allow);
                (action, format!("{} default *", action_name(action)))
            }
            (Some(ApprovalMode::ReadOnly), _) if reading => {
                (PolicyAction::Allow, "read-only mode: reading".to_owned())
            }
            (Some(ApprovalMode::ReadOnly), _) => (
                PolicyAction::Deny,
                format!("read-only mode: {} is not a reading tool", call.name),
            ),
            (Some(ApprovalMode::Ask), _) if reading => {
                (PolicyAction::Allow, "ask mode: reading".to_owned())
            }
            (Some(ApprovalMode::Ask), _) => (
                PolicyAction::Ask,
                format!("ask mode: {} is not a reading tool", call.name),
            ),
            (Some(mode @ (ApprovalMode::Auto | ApprovalMode::Never)), _) => {
                (PolicyAction::Allow, format!("{} mode", mode.as_str()))
            }
        }
    }
}

/// Rule `index` of `[[rules]]`, checked and compiled.
fn command_rule(index: usize, rule: &CommandRule) -> Result<Rule, PolicyError> {
    let mut describe = format!(
        "rules[{index}]: {} {}",
        action_name(rule.decision),
        rule.tool
    );
    let error = |describe: &str, message: String| PolicyError {
        rule: describe.to_owned(),
        message,
    };
    let Some(command) = &rule.command else {
        return Ok(Rule {
            tool: rule.tool.clone(),
            matcher: Matcher::Any,
            action: rule.decision,
            specificity: usize::from(rule.tool != "*"),
            describe,
        });
    };
    describe.push_str(&format!(" `{command}`"));
    if rule.tool != "shell" {
        return Err(error(
            &describe,
            "`command` applies to the shell tool only".to_owned(),
        ));
    }
    let words = shlex::split(command)
        .filter(|w| !w.is_empty())
        .ok_or_else(|| error(&describe, "the command is empty or unbalanced".to_owned()))?;
    if words.iter().any(|w| w.contains(OPERATORS)) {
        return Err(error(
            &describe,
            "a rule's command cannot hold a shell operator".to_owned(),
        ));
    }
    let glob = command.contains(['*', '?', '[']);
    let matcher = if glob {
        let glob = globset::Glob::new(&words.join(" "))
            .map_err(|e| error(&describe, format!("invalid glob: {e}")))?;
        Matcher::Glob(glob.compile_matcher())
    } else {
        Matcher::Prefix(words.clone())
    };
    // Literal words count: `git push origin` is more specific than `git *`.
    let literal = words
        .iter()
        .filter(|w| !w.contains(['*', '?', '[']))
        .count();
    Ok(Rule {
        tool: rule.tool.clone(),
        matcher,
        action: rule.decision,
        specificity: 4 + literal,
        describe,
    })
}

/// The characters that end a simple command or redirect its input or output; `$(` and
/// backticks start a command of their own.
const OPERATORS: [char; 9] = [';', '&', '|', '<', '>', '(', ')', '`', '\n'];

/// A shell call's command, as sh would split it into simple commands.
#[derive(Debug)]
struct ShellCommand {
    /// Each simple command's words.
    segments: Vec<Vec<String>>,
    /// More than one simple command, a redirection or a substitution: an `allow` rule
    /// never matches it (only the whole command is allowed, never a part).
    compound: bool,
}

/// The `command` argument of a shell call, split into words with a shell-word parser
/// (`shlex`) and into simple commands at every operator character. A quoted operator
/// counts too: splitting too much makes a deny rule match more, and an allow rule never.
/// `None` when the call has no command.
fn shell_command(call: &ToolCall) -> Option<ShellCommand> {
    let raw = call.arguments.get("command")?.as_str()?;
    let mut segments = Vec::new();
    let mut compound = false;
    // A line break ends a command as `;` does (shlex would take it for a space); each
    // line is split on its own.
    let lines: Vec<&str> = raw
        .split(['\n', '\r'])
        .filter(|l| !l.trim().is_empty())
        .collect();
    compound |= lines.len() > 1;
    for line in lines {
        let words = match shlex::split(line) {
            Some(words) => words,
            // Unbalanced quotes: sh would refuse it; match it word by word, never allow it.
            None => {
                compound = true;
                line.split_whitespace().map(str::to_owned).collect()
            }
        };
        segments.push(Vec::new());
        for word in words {
            // Ends: `rest` shrinks by at least one character each time round.
            let mut rest = word.as_str();
            while !rest.is_empty() {
                match rest.find(OPERATORS) {
                    Some(at) => {
                        let piece = rest[..at].trim_end_matches('$');
                        if !piece.is_empty()
                            && let Some(last) = segments.last_mut()
                        {
                            last.push(piece.to_owned());
                        }
                        compound = true;
                        segments.push(Vec::new());
                        let width = rest[at..].chars().next().map_or(1, char::len_utf8);
                        rest = &rest[at + width..];
                    }
                    None => {
                        if let Some(last) = segments.last_mut() {
                            last.push(rest.to_owned());
                        }
                        rest = "";
                    }
                }
            }
        }
    }
    segments.retain(|s| !s.is_empty());
    Some(ShellCommand { segments, compound })
}

impl ShellCommand {
    /// Whether `matcher` matches: the whole command for `allow`, any simple command of it
    /// for `ask` and `deny`.
    fn matches(&self, matcher: &Matcher, action: PolicyAction) -> bool {
        let one = |segment: &Vec<String>| match matcher {
            Matcher::Prefix(words) => segment.starts_with(words),
            Matcher::Glob(glob) => glob.is_match(segment.join(" ")),
            Matcher::Any | Matcher::Pattern(_) => true,
        };
        match action {
            PolicyAction::Allow => {
                !self.compound && self.segments.len() == 1 && one(&self.segments[0])
            }
            PolicyAction::Ask | PolicyAction::Deny => self.segments.iter().any(one),
        }
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

    fn rule(tool: &str, command: Option<&str>, decision: PolicyAction) -> CommandRule {
        CommandRule {
            tool: tool.into(),
            command: command.map(Into::into),
            decision,
        }
    }

    fn decide(policy: &ToolPolicy, name: &str, args: serde_json::Value) -> (PolicyAction, String) {
        policy.evaluate(&ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: args,
        })
    }

    fn shell(policy: &ToolPolicy, command: &str) -> (PolicyAction, String) {
        decide(policy, "shell", json!({"command": command}))
    }

    #[test]
    fn command_rules_match_whole_words_and_never_allow_a_compound_command() {
        use PolicyAction::{Allow, Ask, Deny};
        let policy = ToolPolicy::build(PolicySettings {
            rules: vec![
                rule("shell", Some("git status"), Allow),
                rule("shell", Some("rm *"), Deny),
                rule("shell", Some("git push"), Ask),
            ],
            mode: Some(ApprovalMode::Ask),
            ..PolicySettings::default()
        })
        .unwrap();
        assert!(policy.records_allows());
        let allowed = shell(&policy, "git status --short");
        assert_eq!(
            allowed,
            (Allow, "rules[0]: allow shell `git status`".into())
        );
        assert_eq!(shell(&policy, "git  'status'").0, Allow);
        // Not whole words, and not the whole command: the mode decides, or the deny rule.
        assert_eq!(shell(&policy, "git statusx").0, Ask);
        assert_eq!(shell(&policy, "git status; rm -rf x").0, Deny);
        assert_eq!(shell(&policy, "git status && curl x").0, Ask);
        assert_eq!(shell(&policy, "git status | sh").0, Ask);
        assert_eq!(shell(&policy, "git status > f").0, Ask);
        assert_eq!(shell(&policy, "git status $(rm -rf x)").0, Deny);
        assert_eq!(shell(&policy, "git status `id`").0, Ask);
        assert_eq!(shell(&policy, "git status\nrm -rf x").0, Deny);
        assert_eq!(shell(&policy, "git status 'unbalanced").0, Ask);
        assert_eq!(
            shell(&policy, "rm -rf x"),
            (Deny, "rules[1]: deny shell `rm *`".into())
        );
        assert_eq!(shell(&policy, "echo hi; git push").0, Ask);
        // Reading runs in ask mode; writing asks.
        assert_eq!(decide(&policy, "read_file", json!({"path": "a"})).0, Allow);
        let write = decide(&policy, "write_file", json!({"path": "a", "content": ""}));
        assert_eq!(
            write,
            (Ask, "ask mode: write_file is not a reading tool".into())
        );
    }

    #[test]
    fn deny_beats_allow_at_the_same_specificity_and_first_match_wins_otherwise() {
        use PolicyAction::{Allow, Ask, Deny};
        let policy = ToolPolicy::build(PolicySettings {
            rules: vec![
                rule("shell", Some("make test"), Allow),
                rule("shell", Some("make *"), Allow),
                rule("shell", Some("make deploy"), Deny),
                rule("*", None, Ask),
            ],
            ..PolicySettings::default()
        })
        .unwrap();
        assert_eq!(shell(&policy, "make test").0, Allow);
        assert_eq!(
            shell(&policy, "make deploy").0,
            Allow,
            "the glob came first"
        );
        let tied = ToolPolicy::build(PolicySettings {
            rules: vec![
                rule("shell", Some("make deploy"), Allow),
                rule("shell", Some("make deploy"), Deny),
            ],
            ..PolicySettings::default()
        })
        .unwrap();
        assert_eq!(
            shell(&tied, "make deploy"),
            (Deny, "rules[1]: deny shell `make deploy`".into())
        );
        assert_eq!(decide(&policy, "list_dir", json!({})).0, Ask);
    }

    #[test]
    fn modes_decide_what_no_rule_does() {
        use PolicyAction::{Allow, Ask, Deny};
        let with = |mode, rules| {
            ToolPolicy::build(PolicySettings {
                rules,
                mode: Some(mode),
                ..PolicySettings::default()
            })
            .unwrap()
        };
        let read_only = with(
            ApprovalMode::ReadOnly,
            vec![
                rule("shell", Some("git status"), Allow),
                rule("write_file", None, Allow),
            ],
        );
        assert_eq!(decide(&read_only, "grep", json!({"pattern": "x"})).0, Allow);
        assert_eq!(shell(&read_only, "git status").0, Allow);
        assert_eq!(shell(&read_only, "touch x").0, Deny);
        let write = decide(
            &read_only,
            "write_file",
            json!({"path": "a", "content": ""}),
        );
        assert_eq!(
            write,
            (
                Deny,
                "read-only mode: write_file writes to the workspace".into()
            )
        );
        let never = with(
            ApprovalMode::Never,
            vec![rule("shell", Some("rm *"), Deny), rule("shell", None, Ask)],
        );
        assert_eq!(shell(&never, "ls").0, Allow);
        assert_eq!(shell(&never, "rm x").0, Deny);
        let auto = with(ApprovalMode::Auto, Vec::new());
        assert_eq!(shell(&auto, "anything"), (Allow, "auto mode".into()));
        assert!(ApprovalMode::ReadOnly < ApprovalMode::Ask);
        assert!(ApprovalMode::Auto < ApprovalMode::Never);
        assert!(!ToolPolicy::default().records_allows());
    }

    #[test]
    fn a_bad_command_rule_is_named() {
        for (rule, expected) in [
            (
                rule("read_file", Some("x"), PolicyAction::Deny),
                "`command` applies to the shell tool only",
            ),
            (
                rule("shell", Some("git status; ls"), PolicyAction::Allow),
                "cannot hold a shell operator",
            ),
            (rule("shell", Some("  "), PolicyAction::Allow), "empty"),
        ] {
            let err = ToolPolicy::build(PolicySettings {
                rules: vec![rule],
                ..PolicySettings::default()
            })
            .unwrap_err();
            assert!(err.to_string().contains(expected), "{err}");
        }
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
