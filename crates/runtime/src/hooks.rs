//! The user's hooks, run on the host: `[[hooks.<point>]]` in the settings, each a command
//! (argv, no shell unless it names one) given the point's JSON on its stdin, in its own
//! process group, killed with the group at its timeout. Exit 0 allows, exit 2 blocks (at
//! `pre_tool_use` and `user_prompt_submit`; its stderr is what the model sees), anything
//! else is a warning and the execution goes on.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nerve_core::event::{HookPoint, HookVerdict};
use nerve_core::{ExecutionId, HookOutcome, Hooks};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::RuntimeError;

/// The most of a hook's stderr kept (and shown to the model on a block).
const STDERR_BYTES: usize = 4096;
/// A hook's timeout when it names none.
const DEFAULT_TIMEOUT_SECS: u64 = 60;

/// One `[[hooks.<point>]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// At the tool points: a tool name, or `*` (the default).
    pub matcher: Option<String>,
    /// The command and its arguments, run on the host in the workspace.
    pub command: Vec<String>,
    /// Seconds before the hook (and all it started) is killed; default 60.
    pub timeout_secs: Option<u64>,
}

/// `[hooks]`: the hooks of each point, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksSection {
    #[serde(default)]
    pub session_start: Vec<HookConfig>,
    #[serde(default)]
    pub user_prompt_submit: Vec<HookConfig>,
    #[serde(default)]
    pub pre_tool_use: Vec<HookConfig>,
    #[serde(default)]
    pub post_tool_use: Vec<HookConfig>,
    #[serde(default)]
    pub stop: Vec<HookConfig>,
}

impl HooksSection {
    fn at(&self, point: HookPoint) -> &[HookConfig] {
        match point {
            HookPoint::SessionStart => &self.session_start,
            HookPoint::UserPromptSubmit => &self.user_prompt_submit,
            HookPoint::PreToolUse => &self.pre_tool_use,
            HookPoint::PostToolUse => &self.post_tool_use,
            HookPoint::Stop => &self.stop,
        }
    }

    /// Every hook names a command; a matcher only where there is a tool.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        for point in POINTS {
            for hook in self.at(point) {
                if hook.command.first().is_none_or(|c| c.trim().is_empty()) {
                    return Err(RuntimeError::config(format!(
                        "hooks.{}: `command` names no program",
                        point.as_str()
                    )));
                }
                let tool_point = matches!(point, HookPoint::PreToolUse | HookPoint::PostToolUse);
                if hook.matcher.is_some() && !tool_point {
                    return Err(RuntimeError::config(format!(
                        "hooks.{}: `matcher` applies to pre_tool_use and post_tool_use only",
                        point.as_str()
                    )));
                }
                if hook.timeout_secs == Some(0) {
                    return Err(RuntimeError::config(format!(
                        "hooks.{}: `timeout_secs` must be at least 1",
                        point.as_str()
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        POINTS.iter().all(|p| self.at(*p).is_empty())
    }
}

const POINTS: [HookPoint; 5] = [
    HookPoint::SessionStart,
    HookPoint::UserPromptSubmit,
    HookPoint::PreToolUse,
    HookPoint::PostToolUse,
    HookPoint::Stop,
];

/// The hooks of one execution, run on the host in its workspace.
#[derive(Debug)]
pub struct HostHooks {
    pub hooks: HooksSection,
    pub execution_id: ExecutionId,
    pub workspace: PathBuf,
}

#[async_trait]
impl Hooks for HostHooks {
    fn any(&self, point: HookPoint) -> bool {
        !self.hooks.at(point).is_empty()
    }

    async fn run(
        &self,
        point: HookPoint,
        tool: Option<&str>,
        input: &serde_json::Value,
    ) -> Vec<HookOutcome> {
        let mut input = input.clone();
        if let Some(map) = input.as_object_mut() {
            map.insert("execution_id".into(), serde_json::json!(self.execution_id));
            map.insert("workspace".into(), serde_json::json!(self.workspace));
        }
        let bytes = input.to_string().into_bytes();
        let mut outcomes = Vec::new();
        for hook in self.hooks.at(point) {
            let applies = match (&hook.matcher, tool) {
                (None, _) => true,
                (Some(m), Some(tool)) => m == "*" || m == tool,
                (Some(m), None) => m == "*",
            };
            if !applies {
                continue;
            }
            let mut outcome = run_one(hook, &self.workspace, &bytes).await;
            let blocking = matches!(point, HookPoint::PreToolUse | HookPoint::UserPromptSubmit);
            if outcome.verdict == HookVerdict::Block && !blocking {
                outcome.verdict = HookVerdict::Warn;
            }
            let blocked = outcome.verdict == HookVerdict::Block;
            if outcome.verdict == HookVerdict::Warn {
                tracing::warn!(point = point.as_str(), command = ?hook.command, code = ?outcome.exit_code, timed_out = outcome.timed_out, "a hook failed");
            }
            outcomes.push(outcome);
            if blocked {
                break;
            }
        }
        outcomes
    }
}

/// Runs one hook to its end or its timeout.
async fn run_one(hook: &HookConfig, workspace: &std::path::Path, input: &[u8]) -> HookOutcome {
    let started = Instant::now();
    let elapsed =
        |started: Instant| u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let timeout = Duration::from_secs(hook.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS));
    let mut command = tokio::process::Command::new(&hook.command[0]);
    command
        .args(&hook.command[1..])
        .current_dir(workspace)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return HookOutcome {
                command: hook.command.clone(),
                exit_code: None,
                timed_out: false,
                verdict: HookVerdict::Warn,
                stderr: format!("cannot start {}: {e}", hook.command[0]),
                duration_ms: elapsed(started),
            };
        }
    };
    let group = child.id();
    let mut stdin = child.stdin.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(stdin) = stdin.as_mut() {
            // A hook that does not read its input is no failure.
            let _ = stdin.write_all(input).await;
        }
        drop(stdin.take());
        let mut kept = Vec::new();
        if let Some(stderr) = stderr.as_mut() {
            let _ = stderr.read_to_end(&mut kept).await;
        }
        (child.wait().await, kept)
    };
    let (status, kept, timed_out) = match tokio::time::timeout(timeout, work).await {
        Ok((status, kept)) => (status.ok(), kept, false),
        Err(_) => (None, Vec::new(), true),
    };
    if timed_out && let Some(pid) = group.and_then(|p| rustix::process::Pid::from_raw(p as i32)) {
        // The whole group: a shell's children too, which hold its stderr open.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let text = String::from_utf8_lossy(&kept);
    let mut stderr_text = nerve_core::text::clip(&text, STDERR_BYTES).to_owned();
    if timed_out {
        stderr_text = format!("killed after {}s", timeout.as_secs());
    }
    let exit_code = status.and_then(|s| s.code());
    let verdict = match exit_code {
        Some(0) => HookVerdict::Allow,
        Some(2) => HookVerdict::Block,
        Some(_) | None => HookVerdict::Warn,
    };
    HookOutcome {
        command: hook.command.clone(),
        exit_code,
        timed_out,
        verdict,
        stderr: stderr_text,
        duration_ms: elapsed(started),
    }
}
